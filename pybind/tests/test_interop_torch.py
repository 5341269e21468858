"""custody and PyTorch on a GPU: a PyTorch op reads custody memory through DLPack and a
``StridedMemoryView``; custody as PyTorch's allocator (``custody.interop.use_custody_in_torch``,
the C library ``libcustody_torch.so`` the GPU bundle carries) under a small workload in a fresh
interpreter (PyTorch takes an allocator only before its first CUDA allocation): allocate,
compute, a tensor used on a side stream declared with ``torch_record_stream``, a free on another
thread, a graph capture, and the blocks and the device pool's used memory back to their baseline.
Skipped, with the reason, without PyTorch, a GPU or the library (``CUSTODY_TORCH_ALLOCATOR``);
the library's logic runs everywhere in ``torch-allocator/tests`` and ``test_interop.py``."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

import custody
from conftest import EMU
from custody import interop

torch = pytest.importorskip("torch", reason="PyTorch is not installed")
pytestmark = pytest.mark.skipif(
    EMU is not None or not torch.cuda.is_available(),
    reason="PyTorch needs a GPU (the emulated driver runs no kernels or CUDA runtime)",
)
N = 1 << 16


def test_a_torch_op_reads_custody_memory(device, stream):
    from custody.utils import StridedMemoryView

    buf = custody.DeviceMemoryResource(0).allocate(N * 4, stream=stream)
    buf.fill(b"\x00\x00\x80\x3f", stream=stream)  # 1.0f
    stream.sync()
    via_dlpack = torch.from_dlpack(buf).view(torch.float32)
    assert via_dlpack.sum().item() == N
    view = StridedMemoryView.from_dlpack(buf, stream_ptr=torch.cuda.current_stream().cuda_stream or 1)
    via_view = torch.from_dlpack(view).view(torch.float32)
    assert (via_view * 2).sum().item() == 2 * N
    del via_dlpack, via_view, view
    torch.cuda.synchronize()
    buf.close()


WORKLOAD = textwrap.dedent(
    """
    import gc, json, sys, threading
    import torch
    import custody
    from custody import interop

    def used():
        torch.cuda.synchronize()
        custody.drain_deferred_cleanup()
        return custody.DeviceMemoryResource(0).attributes.used_mem_current

    interop.use_custody_in_torch(sys.argv[1])
    out = {"base_used": used(), "base_live": interop.torch_live_bytes()}
    x = torch.arange(__N__, device="cuda", dtype=torch.float64)
    out["live_with_x"] = interop.torch_live_bytes()
    out["sum"] = (x * 2).sum().item()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        y = x * 3
    torch.cuda.current_stream().wait_stream(side)   # y was made on side: read it after
    out["sum_side"] = y.sum().item()
    interop.torch_record_stream(x, side)   # x was read on side: its free waits for side
    del x
    box = [torch.ones(__N__, device="cuda")]
    worker = threading.Thread(target=box.clear)
    worker.start(); worker.join()
    try:
        g = torch.cuda.CUDAGraph()
        a = torch.ones(__N__, device="cuda")
        b = torch.empty_like(a)
        with torch.cuda.graph(g):
            torch.mul(a, 5, out=b)
        g.replay(); torch.cuda.synchronize()
        out["graph_sum"] = b.sum().item()
        del g, a, b
    except RuntimeError as error:
        out["graph_refused"] = str(error)
    del y, side
    gc.collect()
    out["end_used"] = used()
    out["end_live"] = interop.torch_live_bytes()
    print(json.dumps(out))
    """
).replace("__N__", str(N))


def test_custody_as_torchs_allocator_under_a_small_workload():
    library = os.environ.get(interop.TORCH_LIBRARY_ENV)
    if not library:
        pytest.skip(f"{interop.TORCH_LIBRARY_ENV} names no libcustody_torch.so")
    ran = subprocess.run(
        [sys.executable, "-c", WORKLOAD, library], capture_output=True, text=True, timeout=300
    )
    assert ran.returncode == 0, ran.stderr
    out = json.loads(ran.stdout.strip().splitlines()[-1])
    assert out["live_with_x"] >= out["base_live"] + N * 8, "x's memory is custody's"
    assert out["sum"] == N * (N - 1)
    assert out["sum_side"] == 3 * N * (N - 1) / 2
    assert out["end_live"] == out["base_live"], "every block was freed"
    assert out["end_used"] == out["base_used"], "and came back to the pool"
    if "graph_refused" in out:
        pytest.skip(f"PyTorch refused graph capture under the pluggable allocator: {out['graph_refused']}")
    assert out["graph_sum"] == 5 * N
