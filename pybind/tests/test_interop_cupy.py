"""custody and CuPy on a GPU: a CuPy kernel reads custody memory through DLPack, the CUDA Array
Interface and a ``StridedMemoryView``; custody as CuPy's allocator (``custody.interop.
CupyAllocator``) under a small workload (allocate, compute, free on another thread, capture and
launch a graph), with the device pool's used memory back to its baseline after. Skipped, with
the reason, without CuPy or a GPU (the emulated driver runs no kernels); the allocator's own logic
runs everywhere in ``test_interop.py``."""

import gc
import threading

import pytest

import custody
from conftest import EMU, drain_until
from custody import interop

cupy = pytest.importorskip("cupy", reason="CuPy is not installed")
pytestmark = pytest.mark.skipif(
    EMU is not None, reason="CuPy launches kernels, which the emulated driver does not run"
)

N = 1 << 16


def pool_used():
    """The device pool's used bytes once the device is idle (after deferred cleanup, whose
    frees are stream-ordered: the device is synchronised after it, not before)."""
    custody.drain_deferred_cleanup()
    cupy.cuda.runtime.deviceSynchronize()
    return custody.DeviceMemoryResource(0).attributes.used_mem_current


@pytest.fixture
def filled(device, stream):
    """A custody device buffer of N float64 values 0, 1, 2, ... (sums of them are exact)."""
    host = custody.LegacyPinnedMemoryResource().allocate(N * 8, stream=stream)
    import numpy

    numpy.from_dlpack(host).view(numpy.float64)[:] = numpy.arange(N, dtype=numpy.float64)
    buf = custody.DeviceMemoryResource(0).allocate(N * 8, stream=stream)
    buf.copy_from(host, stream=stream)
    stream.sync()
    host.close()
    yield buf
    buf.close()


def expected_sum(scale):
    return scale * N * (N - 1) / 2


@pytest.mark.parametrize("path", ["dlpack", "cai", "strided_memory_view"])
def test_a_cupy_kernel_reads_custody_memory(filled, stream, path):
    from custody.utils import StridedMemoryView

    if path == "dlpack":
        array = cupy.from_dlpack(filled)
    elif path == "cai":
        array = cupy.asarray(filled)
    else:
        view = StridedMemoryView.from_dlpack(filled, stream_ptr=cupy.cuda.get_current_stream().ptr or 1)
        array = cupy.from_dlpack(view)
    values = array.view(cupy.float64)
    assert float((values * 2).sum()) == expected_sum(2)
    del array, values
    cupy.cuda.get_current_stream().synchronize()


def test_custody_as_cupys_allocator_under_a_small_workload(device):
    previous = cupy.cuda.get_allocator()
    base = pool_used()
    cupy.cuda.set_allocator(interop.CupyAllocator())
    try:
        x = cupy.arange(N, dtype=cupy.float64)
        assert pool_used() >= base + N * 8, "the array's memory is custody's"
        y = x * 2
        assert float(y.sum()) == expected_sum(2)
        # Freed on another thread: the last reference goes there, the free keeps its recipe.
        box = [cupy.ones(N, dtype=cupy.float64)]
        worker = threading.Thread(target=box.clear)
        worker.start()
        worker.join()
        # A graph captured on a non-blocking stream over memory allocated before the capture.
        s = cupy.cuda.Stream(non_blocking=True)
        with s:
            a = cupy.arange(N, dtype=cupy.float64)
            b = cupy.empty_like(a)
            s.begin_capture()
            cupy.multiply(a, 3, out=b)
            graph = s.end_capture()
            graph.launch(s)
            s.synchronize()
        assert float(b.sum()) == expected_sum(3)
        del x, y, a, b, graph, s, box
        gc.collect()
    finally:
        cupy.cuda.set_allocator(previous)
    # A free the cleanup worker or a driver thread issues may come later (under
    # compute-sanitizer it did): polled, then asserted.
    drain_until(lambda: pool_used() == base)
    assert pool_used() == base, "every block came back to the pool"
