"""custody under other frameworks' allocators: CuPy (:class:`CupyAllocator`, for
``cupy.cuda.set_allocator``), PyTorch (:func:`use_custody_in_torch`, a
``torch.cuda.memory.CUDAPluggableAllocator`` over custody's C library ``libcustody_torch.so``)
and Numba (:func:`numba_memory_manager`, an External Memory Management plugin), so that their
memory gets custody's deallocation recipes: each block is freed on the stream it was allocated
on, in that stream's context, from whichever thread lets it go, after the streams declared as its
uses.

Each framework's own pool is bypassed: every block comes from a custody memory resource (by
default the device's current memory pool, which keeps freed memory for reuse). The frameworks
are imported only when used; none is a dependency.
"""

from __future__ import annotations

import ctypes
import os
import threading
import weakref

from typing import Any, Callable, Optional, Union

from custody import Buffer, Device, MemoryResource, Stream

__all__ = [
    "CupyAllocator",
    "TORCH_LIBRARY_ENV",
    "numba_memory_manager",
    "stream_of",
    "torch_allocator",
    "torch_live_bytes",
    "torch_record_stream",
    "use_custody_in_torch",
]

#: The environment variable naming ``libcustody_torch.so`` when no path is given.
TORCH_LIBRARY_ENV: str = "CUSTODY_TORCH_ALLOCATOR"


class _KeptStream:
    """A foreign stream's handle with the object that owns it: custody's stream wrapping this
    keeps the object, and with it the stream, alive while any recipe or use recorded with it
    lives."""

    __slots__ = ("owner", "handle")

    def __init__(self, owner, handle):
        self.owner = owner
        self.handle = handle

    def __cuda_stream__(self):
        return (0, self.handle)


# Foreign streams wrapped for their owners, by handle: an entry lives while its custody stream
# does, and that stream keeps the owner (so the handle names the same stream until it goes).
_wrapped = weakref.WeakValueDictionary()
_wrapped_lock = threading.Lock()


def stream_of(stream: Any) -> Stream:
    """A custody :class:`~custody.Stream` for ``stream``, kept alive as long as custody needs it:
    a custody ``Stream`` as it is; an int handle through ``Stream.from_handle`` (0, 1 and 2 are
    the default-stream tokens, a stream custody created gives that stream, and any other int is
    taken on the caller's word to outlive what is recorded with it); an object with
    ``__cuda_stream__`` wrapped with the object kept; a CuPy stream (``.ptr``) or a PyTorch
    stream (``.cuda_stream``) wrapped with the stream object kept, so that a recipe or use
    recorded with it keeps the framework's stream from being destroyed under it. ``TypeError``
    for anything else."""
    if isinstance(stream, Stream):
        return stream
    if isinstance(stream, int):
        return Stream.from_handle(stream)
    if hasattr(stream, "__cuda_stream__"):
        return Stream.from_handle(stream)
    for attribute in ("ptr", "cuda_stream"):
        handle = getattr(stream, attribute, None)
        if isinstance(handle, int):
            break
    else:
        raise TypeError(
            "a stream is a custody Stream, an int handle, an object with __cuda_stream__, a CuPy "
            f"stream or a PyTorch stream; got {type(stream).__name__}"
        )
    if handle in (0, 1, 2):
        return Stream.from_handle(handle)
    with _wrapped_lock:
        found = _wrapped.get(handle)
        if found is None or found.is_closed:
            found = Stream.from_handle(_KeptStream(stream, handle))
            _wrapped[handle] = found
    return found


class CupyAllocator:
    """CuPy's allocator (``cupy.cuda.set_allocator(CupyAllocator())``) backed by a custody memory
    resource: each allocation is a custody :class:`~custody.Buffer` allocated on CuPy's current
    stream, which becomes its deallocation recipe, held by the ``cupy.cuda.UnownedMemory`` CuPy
    keeps, so that the free (when CuPy's last reference to the memory goes, on any thread) is
    ordered on that stream in its context, after the streams declared with
    ``Buffer.record_use``. The CuPy stream is kept alive while the buffer needs it.

    ``memory_resource``: a custody :class:`~custody.MemoryResource` for every device, a callable
    from a device ordinal to one, or None for each device's ``Device(n).memory_resource`` (its
    current memory pool). CuPy's memory pool is bypassed (its statistics stay at zero); the
    resource's pool keeps freed memory for reuse. Pinned memory (``cupy.cuda.set_pinned_memory_
    allocator``) is not covered. ``TypeError`` for a ``memory_resource`` that is neither.
    """

    def __init__(
        self, memory_resource: Union[MemoryResource, Callable[[int], MemoryResource], None] = None
    ) -> None:
        if not (memory_resource is None or isinstance(memory_resource, MemoryResource)
                or callable(memory_resource)):
            raise TypeError(
                "memory_resource is a MemoryResource, a callable from a device ordinal to one, or "
                f"None; got {type(memory_resource).__name__}"
            )
        self._memory_resource = memory_resource

    def memory_resource(self, device_id: int) -> MemoryResource:
        """The resource that allocates on device ``device_id``."""
        if self._memory_resource is None:
            return Device(device_id).memory_resource
        if isinstance(self._memory_resource, MemoryResource):
            return self._memory_resource
        return self._memory_resource(device_id)

    def allocate(self, size: int, stream: Any, device_id: int = 0) -> Buffer:
        """A custody buffer of ``size`` bytes from the resource of device ``device_id``, allocated
        on ``stream`` (anything :func:`stream_of` takes), which becomes its deallocation recipe:
        what ``__call__`` does for CuPy, without CuPy. Errors as the resource's ``allocate``."""
        return self.memory_resource(device_id).allocate(size, stream=stream_of(stream))

    def __call__(self, size: int) -> Any:
        """What CuPy calls: a ``cupy.cuda.MemoryPointer`` to ``size`` bytes allocated on CuPy's
        current device and stream (:meth:`allocate`), whose ``UnownedMemory`` keeps the buffer
        until CuPy lets the memory go. Imports ``cupy``."""
        import cupy

        device_id = cupy.cuda.runtime.getDevice()
        buffer = self.allocate(size, cupy.cuda.get_current_stream(), device_id)
        memory = cupy.cuda.UnownedMemory(int(buffer.handle), size, buffer, device_id)
        return cupy.cuda.MemoryPointer(memory, 0)


# --- PyTorch ---

_torch_library = None
_torch_library_lock = threading.Lock()


def _torch_library_path(library):
    path = library or os.environ.get(TORCH_LIBRARY_ENV)
    if not path:
        raise RuntimeError(
            "custody's PyTorch allocator is the C library libcustody_torch.so: build it with "
            "`cargo build --release -p cuda-custody-torch` in custody's source tree "
            "(target/release/libcustody_torch.so) and pass its path, or set "
            f"{TORCH_LIBRARY_ENV} to it"
        )
    if not os.path.isfile(path):
        raise RuntimeError(f"{path} does not exist (custody's PyTorch allocator library)")
    return os.path.abspath(path)


def _load(library=None):
    global _torch_library
    with _torch_library_lock:
        if _torch_library is None:
            lib = ctypes.CDLL(_torch_library_path(library))
            lib.custody_torch_record_use.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
            lib.custody_torch_record_use.restype = ctypes.c_int
            lib.custody_torch_live_bytes.argtypes = []
            lib.custody_torch_live_bytes.restype = ctypes.c_size_t
            lib.custody_torch_live_allocations.argtypes = []
            lib.custody_torch_live_allocations.restype = ctypes.c_size_t
            lib.custody_torch_last_error.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
            lib.custody_torch_last_error.restype = ctypes.c_size_t
            _torch_library = lib
        return _torch_library


def torch_allocator(library: Optional[str] = None) -> Any:
    """A ``torch.cuda.memory.CUDAPluggableAllocator`` over custody's C library (``library``, or
    the file ``CUSTODY_TORCH_ALLOCATOR`` names): each block is a custody buffer of the device's
    current memory pool, allocated on the stream PyTorch passes and freed with that recipe.
    ``RuntimeError`` when no library is named or the file does not exist."""
    import torch

    path = _torch_library_path(library)
    _load(path)
    return torch.cuda.memory.CUDAPluggableAllocator(
        path, "custody_torch_malloc", "custody_torch_free"
    )


def use_custody_in_torch(library: Optional[str] = None) -> Any:
    """Makes custody PyTorch's CUDA allocator (``torch.cuda.memory.change_current_allocator`` of
    :func:`torch_allocator`) and returns the allocator. PyTorch accepts this only before its
    first CUDA allocation in the process. Then: every tensor's memory has a custody recipe (its
    allocation stream); ``Tensor.record_stream`` does nothing under a pluggable allocator, so
    declare a tensor's use on another stream with :func:`torch_record_stream`; PyTorch's
    caching allocator, its memory statistics and ``torch.cuda.graph``'s private pools are not
    used (PyTorch refuses a graph capture that would need them)."""
    import torch

    allocator = torch_allocator(library)
    torch.cuda.memory.change_current_allocator(allocator)
    return allocator


def _last_error(lib):
    text = ctypes.create_string_buffer(1024)
    n = lib.custody_torch_last_error(text, len(text))
    return text.value.decode(errors="replace") if n else ""


def _handle_of(stream):
    if isinstance(stream, Stream):
        return stream.handle
    if hasattr(stream, "__cuda_stream__"):
        return stream.__cuda_stream__()[1]
    handle = getattr(stream, "cuda_stream", stream)
    if not isinstance(handle, int):
        raise TypeError(
            "a stream is a torch.cuda.Stream, a custody Stream, an object with __cuda_stream__ "
            f"or an int handle; got {type(stream).__name__}"
        )
    return handle


def torch_record_stream(tensor: Any, stream: Any) -> None:
    """Declares that work on ``stream`` (a ``torch.cuda.Stream``, a custody ``Stream``, an
    object with ``__cuda_stream__`` or an int handle) uses ``tensor``'s memory, what ``Tensor.record_stream``
    does under PyTorch's own allocator: the block's free, whenever it comes, waits for the work
    enqueued on ``stream`` before it (an event, no host wait). The stream must outlive the
    block (PyTorch's pool streams always do). ``ValueError`` for a tensor whose storage custody
    did not allocate (or a view not at its storage's start: its storage is what is declared);
    ``RuntimeError`` for a refused stream (another device's); ``TypeError`` for a non-stream;
    ``RuntimeError`` before :func:`torch_allocator` loaded the library."""
    if _torch_library is None:
        raise RuntimeError("custody's PyTorch allocator is not loaded: call use_custody_in_torch()")
    handle = _handle_of(stream)
    ptr = tensor.untyped_storage().data_ptr()
    status = _torch_library.custody_torch_record_use(ctypes.c_void_p(ptr), ctypes.c_void_p(handle))
    if status == 1:
        raise ValueError(f"the tensor's storage at {ptr:#x} was not allocated by custody")
    if status != 0:
        raise RuntimeError(_last_error(_torch_library))


def torch_live_bytes() -> int:
    """The bytes of the blocks custody's PyTorch allocator has handed out and PyTorch has not
    freed yet (PyTorch's own ``torch.cuda.memory_allocated`` does not count them). 0 before the
    library is loaded."""
    return 0 if _torch_library is None else int(_torch_library.custody_torch_live_bytes())


# --- Numba ---

_numba_class = None


def numba_memory_manager() -> type:
    """Numba's External Memory Management plugin class over custody
    (``numba.cuda.set_memory_manager(numba_memory_manager())``, or the environment variable
    ``NUMBA_CUDA_MEMORY_MANAGER=custody.interop`` before Numba starts): each device array is a
    custody buffer from ``Device(n).memory_resource`` allocated on the legacy default stream
    (Numba's allocation has no stream), freed when Numba finalizes its memory pointer. Numba
    keeps managing host memory; IPC handles and memory information are not provided
    (``NotImplementedError``). Imports ``numba.cuda``."""
    global _numba_class
    if _numba_class is None:
        _numba_class = _make_numba_class()
    return _numba_class


def _make_numba_class():
    from numba.cuda import HostOnlyCUDAMemoryManager, MemoryPointer

    try:
        from cuda.bindings.driver import CUdeviceptr as pointer_of
    except ImportError:  # numba's ctypes binding
        pointer_of = ctypes.c_void_p

    class CustodyNumbaMemoryManager(HostOnlyCUDAMemoryManager):
        """Numba's device memory from custody (see ``custody.interop.numba_memory_manager``)."""

        def initialize(self):
            """Nothing to set up: custody makes its resources on first use."""

        def memalloc(self, size):
            """A custody buffer of ``size`` bytes on the current device, freed when Numba
            finalizes the returned pointer."""
            resource = Device(self.context.device.id).memory_resource
            buffer = resource.allocate(size, stream=Stream.from_handle(1))
            address = int(buffer.handle)
            allocations = self.allocations
            allocations[address] = buffer

            def finalizer():
                # Numba's context reset may have emptied the table already (at exit).
                allocations.pop(address, None)

            return MemoryPointer(self.context, pointer_of(address), size, finalizer=finalizer)

        def get_ipc_handle(self, memory):
            """Not provided: custody's pool memory has no legacy IPC handle."""
            raise NotImplementedError(
                "custody's memory is exported with Buffer.ipc_descriptor, not legacy IPC handles"
            )

        def get_memory_info(self):
            """Not provided (the pool's use is not the device's)."""
            raise NotImplementedError("custody's Numba plugin does not report memory information")

        @property
        def interface_version(self):
            """The EMM plugin interface version (1)."""
            return 1

    return CustodyNumbaMemoryManager


def __getattr__(name):
    # `NUMBA_CUDA_MEMORY_MANAGER=custody.interop`: Numba reads `_numba_memory_manager` here,
    # and only then is Numba imported.
    if name == "_numba_memory_manager":
        return numba_memory_manager()
    raise AttributeError(f"module 'custody.interop' has no attribute {name!r}")
