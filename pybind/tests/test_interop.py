"""``custody.interop``'s own logic, with stand-ins for the frameworks (their real tests, which
need a GPU and CuPy, PyTorch or Numba, are ``test_interop_cupy.py``, ``test_interop_torch.py`` and
``test_interop_numba.py``): a framework's stream wrapped with the object that owns it, so that a
buffer's recipe keeps the stream alive after the framework let it go (without the keep the free
lands on a destroyed stream); CuPy's allocation core (a buffer on the framework's current stream,
freed there, after declared uses); the PyTorch allocator's library loaded from Python, a tensor's
use declared through it, its live bytes back to zero. Runs on the emulator and on a GPU."""

import ctypes
import gc
import os
import subprocess
import sys
import textwrap
import weakref

import pytest

import custody
from conftest import DRIVER
from custody import interop

SIZE = 4096

DRIVER.cuStreamCreate.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_uint]
DRIVER.cuStreamDestroy_v2.argtypes = [ctypes.c_void_p]


class FrameworkStream:
    """A stand-in for a CuPy stream: it owns a stream custody did not create (``ptr``) and
    destroys it when it is collected, as ``cupy.cuda.Stream`` does."""

    def __init__(self):
        raw = ctypes.c_void_p()
        assert DRIVER.cuStreamCreate(ctypes.byref(raw), 1) == 0  # CU_STREAM_NON_BLOCKING
        self.ptr = raw.value

    def __del__(self):
        DRIVER.cuStreamDestroy_v2(ctypes.c_void_p(self.ptr))


def test_stream_of_takes_each_kind_of_stream(device, stream):
    assert interop.stream_of(stream) is stream
    assert interop.stream_of(1).handle == custody.LEGACY_DEFAULT_STREAM.handle
    assert interop.stream_of(stream.handle) == stream, "a stream custody made gives itself"
    framework = FrameworkStream()
    wrapped = interop.stream_of(framework)
    assert wrapped.handle == framework.ptr
    assert interop.stream_of(framework) is wrapped, "one wrapper per live framework stream"

    class TorchLike:
        cuda_stream = framework.ptr

    assert interop.stream_of(TorchLike()).handle == framework.ptr
    with pytest.raises(TypeError, match="a stream is"):
        interop.stream_of("stream")
    with pytest.raises(TypeError, match="a stream is"):
        interop.stream_of(None)
    del wrapped
    gc.collect()


def test_a_buffer_keeps_the_framework_stream_it_was_allocated_on(device, emu):
    """The recipe holds the framework's stream object: the framework letting go of it does not
    destroy the stream under the buffer, and the free is ordered on it."""
    framework = FrameworkStream()
    alive = weakref.ref(framework)
    allocator = interop.CupyAllocator()
    buf = allocator.allocate(SIZE, framework, device.device_id)
    wrapped = interop.stream_of(framework)
    buf.fill(1, stream=wrapped)
    alloc = emu.alloc_id(buf.handle) if emu else None
    del framework, wrapped
    gc.collect()
    assert alive() is not None, "the buffer's recipe keeps the framework's stream"
    if emu:
        emu.clear_calls()
    buf.close()
    if emu:
        (free,) = emu.calls_to("cuMemFreeAsync", alloc=alloc)
        assert free["result"] == 0
    gc.collect()
    custody.drain_deferred_cleanup()
    assert alive() is None, "released once nothing needs it"


@pytest.mark.expect_hazards("free_on_destroyed_stream")
def test_without_the_keep_the_free_lands_on_a_destroyed_stream(device, emu):
    """The negative control: the bare handle (``Stream.from_handle(int)``, on the caller's word)
    does not keep the framework's stream, which the framework then destroys; the emulator reports
    the free on the destroyed stream (a real driver kills the process)."""
    if emu is None:
        pytest.skip("a free on a destroyed stream kills the process on a real driver")
    framework = FrameworkStream()
    buf = custody.DeviceMemoryResource(0).allocate(
        SIZE, stream=custody.Stream.from_handle(framework.ptr)
    )
    del framework
    gc.collect()
    with pytest.raises(custody.CUDAError):
        buf.close()


def test_the_cupy_core_allocates_on_the_stream_and_frees_after_declared_uses(device, emu):
    a, b = device.create_stream(), device.create_stream()
    resource = custody.DeviceMemoryResource(0)
    allocator = interop.CupyAllocator(resource)
    assert allocator.memory_resource(0) is resource
    assert interop.CupyAllocator(lambda n: resource).memory_resource(0) is resource
    assert interop.CupyAllocator().memory_resource(0) is custody.Device(0).memory_resource
    buf = allocator.allocate(SIZE, a)
    assert buf.size == SIZE and buf.memory_resource is resource
    buf.fill(0x11, stream=a)
    b.wait(a)
    out = custody.LegacyPinnedMemoryResource().allocate(SIZE, stream=b)
    out.copy_from(buf, stream=b)
    buf.record_use(b)
    alloc = emu.alloc_id(buf.handle) if emu else None
    if emu:
        emu.clear_calls()
    del buf
    gc.collect()
    if emu:
        (free,) = emu.calls_to("cuMemFreeAsync", alloc=alloc)
        assert free["stream"] == a.handle, "freed on the stream it was allocated on"
    b.sync()
    assert ctypes.string_at(out.handle, SIZE) == b"\x11" * SIZE
    out.close()
    with pytest.raises(TypeError, match="memory_resource"):
        interop.CupyAllocator(5)


# --- PyTorch's allocator library, driven from Python by a stand-in for PyTorch ---

LIBRARY = os.environ.get(interop.TORCH_LIBRARY_ENV)
needs_library = pytest.mark.skipif(
    not LIBRARY, reason=f"{interop.TORCH_LIBRARY_ENV} names no libcustody_torch.so"
)


class Storage:
    def __init__(self, ptr):
        self.ptr = ptr

    def data_ptr(self):
        return self.ptr


class Tensor:
    """The part of a ``torch.Tensor`` ``torch_record_stream`` reads."""

    def __init__(self, ptr):
        self._storage = Storage(ptr)

    def untyped_storage(self):
        return self._storage


@needs_library
def test_a_tensors_use_declared_from_python_orders_its_free(device, emu):
    lib = interop._load(LIBRARY)
    lib.custody_torch_malloc.argtypes = [ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
    lib.custody_torch_malloc.restype = ctypes.c_void_p
    lib.custody_torch_free.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
    lib.custody_torch_free.restype = None
    a, b = device.create_stream(), device.create_stream()
    before = interop.torch_live_bytes()
    ptr = lib.custody_torch_malloc(SIZE, 0, a.handle)
    assert ptr, interop._last_error(lib)
    assert interop.torch_live_bytes() == before + SIZE
    block = custody.Buffer.from_handle(ptr, SIZE)  # the stand-in's own view of the block
    block.fill(0x22, stream=a)
    b.wait(a)
    out = custody.LegacyPinnedMemoryResource().allocate(SIZE, stream=b)
    out.copy_from(block, stream=b)
    block.close()
    interop.torch_record_stream(Tensor(ptr), b)
    with pytest.raises(ValueError, match="not allocated by custody"):
        interop.torch_record_stream(Tensor(ptr + 1), b)
    lib.custody_torch_free(ptr, SIZE, 0, a.handle)  # on a, after b's copy: no hazard
    assert interop.torch_live_bytes() == before
    b.sync()
    assert ctypes.string_at(out.handle, SIZE) == b"\x22" * SIZE
    out.close()
    a.sync()


def test_the_torch_library_must_be_named(monkeypatch):
    monkeypatch.delenv(interop.TORCH_LIBRARY_ENV, raising=False)
    with pytest.raises(RuntimeError, match="cargo build --release -p cuda-custody-torch"):
        interop._torch_library_path(None)
    with pytest.raises(RuntimeError, match="does not exist"):
        interop._torch_library_path("/nonexistent/libcustody_torch.so")


@needs_library
def test_a_free_the_library_reports_to_a_broken_stderr_does_not_abort():
    """``custody_torch_free`` of an address it never allocated says so on stderr; when stderr is
    a pipe nobody reads, the failed write is dropped. ``eprintln!`` panicked there, and a panic
    out of the C function aborted the process (PyTorch's, in real use). No driver call."""
    script = textwrap.dedent(
        f"""
        import ctypes, os
        lib = ctypes.CDLL({LIBRARY!r})
        lib.custody_torch_free.argtypes = [
            ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
        lib.custody_torch_free.restype = None
        r, w = os.pipe()
        os.close(r)
        os.dup2(w, 2)  # stderr: a pipe nobody reads (writes fail with EPIPE)
        lib.custody_torch_free(0x1000, 64, 0, None)
        print("ok", flush=True)
        """
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert (out.returncode, out.stdout.strip()) == (0, "ok"), (out.returncode, out.stderr)
