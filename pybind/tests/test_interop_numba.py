"""custody and Numba on a GPU: a Numba kernel reads custody memory through the CUDA Array
Interface; custody as Numba's memory manager (``NUMBA_CUDA_MEMORY_MANAGER=custody.interop``, in a
fresh interpreter: Numba reads it once) under a small workload (allocate, a kernel, a free on
another thread), with the device pool's used memory back to its baseline. Skipped, with the
reason, without Numba or a GPU (the emulated driver runs no kernels), or where Numba cannot run
a kernel without custody either."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

import custody
from conftest import EMU

numba_cuda = pytest.importorskip("numba.cuda", reason="Numba is not installed")
pytestmark = pytest.mark.skipif(
    EMU is not None, reason="Numba launches kernels, which the emulated driver does not run"
)
N = 1 << 16

# Numba compiling and launching one kernel with its own memory manager, in a fresh interpreter:
# where this fails, the host's Numba cannot run any kernel (on the H200 of 2026-12-02 its
# compiler called numpy.row_stack, which the installed NumPy no longer has), which is no
# finding about custody.
NUMBA_ALONE = textwrap.dedent(
    """
    import numpy as np
    from numba import cuda

    @cuda.jit
    def one(a):
        a[0] = 1

    d = cuda.to_device(np.zeros(1))
    one[1, 1](d)
    assert d.copy_to_host()[0] == 1
    """
)


@pytest.fixture(scope="module", autouse=True)
def numba_runs_a_kernel_without_custody():
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_CUDA_MEMORY_MANAGER"}
    ran = subprocess.run([sys.executable, "-c", NUMBA_ALONE], capture_output=True, text=True,
                         timeout=300, env=env)
    if ran.returncode != 0:
        last = (ran.stderr.strip().splitlines() or ["no output"])[-1]
        pytest.skip("this Numba cannot run a kernel even without custody, so these tests "
                    f"would test the host's Numba: {last}")

WORKLOAD = textwrap.dedent(
    """
    import gc, json, threading
    import numpy as np
    import custody
    from numba import cuda

    @cuda.jit
    def double(a):
        i = cuda.grid(1)
        if i < a.size:
            a[i] *= 2

    def used():
        cuda.synchronize()
        custody.drain_deferred_cleanup()
        return custody.DeviceMemoryResource(0).attributes.used_mem_current

    out = {"manager": type(cuda.current_context().memory_manager).__name__, "base": used()}
    a = cuda.to_device(np.arange(__N__, dtype=np.float64))
    out["with_a"] = used()
    double[(__N__ + 255) // 256, 256](a)
    out["sum"] = float(a.copy_to_host().sum())
    box = [cuda.device_array(__N__, dtype=np.float64)]
    worker = threading.Thread(target=box.clear)
    worker.start(); worker.join()
    del a
    gc.collect()
    out["end"] = used()
    print(json.dumps(out))
    """
).replace("__N__", str(N))


def test_custody_as_numbas_memory_manager():
    env = dict(os.environ, NUMBA_CUDA_MEMORY_MANAGER="custody.interop")
    ran = subprocess.run([sys.executable, "-c", WORKLOAD], capture_output=True, text=True,
                         timeout=300, env=env)
    assert ran.returncode == 0, ran.stderr
    out = json.loads(ran.stdout.strip().splitlines()[-1])
    assert out["manager"] == "CustodyNumbaMemoryManager"
    assert out["with_a"] >= out["base"] + N * 8, "the array's memory is custody's"
    assert out["sum"] == N * (N - 1)
    assert out["end"] == out["base"], "every block came back to the pool"


def test_a_numba_kernel_reads_custody_memory(device, stream):
    import numpy as np

    @numba_cuda.jit
    def total(a, out):
        i = numba_cuda.grid(1)
        if i < a.size:
            numba_cuda.atomic.add(out, 0, a[i])

    buf = custody.DeviceMemoryResource(0).allocate(N, stream=stream)
    buf.fill(3, stream=stream)
    stream.sync()
    array = numba_cuda.as_cuda_array(buf)  # the CUDA Array Interface: uint8
    out = numba_cuda.to_device(np.zeros(1, dtype=np.uint64))
    total[(N + 255) // 256, 256](array, out)
    assert int(out.copy_to_host()[0]) == 3 * N
    del array
    numba_cuda.synchronize()
    buf.close()
