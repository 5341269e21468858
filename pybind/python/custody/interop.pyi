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

from typing import Any, Callable, Optional, Union

from custody import Buffer, MemoryResource, Stream

TORCH_LIBRARY_ENV: str

def stream_of(stream: Any) -> Stream:
    """A custody :class:`~custody.Stream` for ``stream``, kept alive as long as custody needs it:
    a custody ``Stream`` as it is; an int handle through ``Stream.from_handle`` (0, 1 and 2 are
    the default-stream tokens, a stream custody created gives that stream, and any other int is
    taken on the caller's word to outlive what is recorded with it); an object with
    ``__cuda_stream__`` wrapped with the object kept; a CuPy stream (``.ptr``) or a PyTorch
    stream (``.cuda_stream``) wrapped with the stream object kept, so that a recipe or use
    recorded with it keeps the framework's stream from being destroyed under it. ``TypeError``
    for anything else.
    """

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
    def __init__(self, memory_resource: Union[MemoryResource, Callable[[int], MemoryResource], None] = None) -> None:
        ...
    def memory_resource(self, device_id: int) -> MemoryResource:
        """The resource that allocates on device ``device_id``."""
    def allocate(self, size: int, stream: Any, device_id: int = 0) -> Buffer:
        """A custody buffer of ``size`` bytes from the resource of device ``device_id``, allocated
        on ``stream`` (anything :func:`stream_of` takes), which becomes its deallocation recipe:
        what ``__call__`` does for CuPy, without CuPy. Errors as the resource's ``allocate``.
        """
    def __call__(self, size: int) -> Any:
        """What CuPy calls: a ``cupy.cuda.MemoryPointer`` to ``size`` bytes allocated on CuPy's
        current device and stream (:meth:`allocate`), whose ``UnownedMemory`` keeps the buffer
        until CuPy lets the memory go. Imports ``cupy``.
        """

def torch_allocator(library: Optional[str] = None) -> Any:
    """A ``torch.cuda.memory.CUDAPluggableAllocator`` over custody's C library (``library``, or
    the file ``CUSTODY_TORCH_ALLOCATOR`` names): each block is a custody buffer of the device's
    current memory pool, allocated on the stream PyTorch passes and freed with that recipe.
    ``RuntimeError`` when no library is named or the file does not exist.
    """
def use_custody_in_torch(library: Optional[str] = None) -> Any:
    """Makes custody PyTorch's CUDA allocator (``torch.cuda.memory.change_current_allocator`` of
    :func:`torch_allocator`) and returns the allocator. PyTorch accepts this only before its
    first CUDA allocation in the process. Then: every tensor's memory has a custody recipe (its
    allocation stream); ``Tensor.record_stream`` does nothing under a pluggable allocator, so
    declare a tensor's use on another stream with :func:`torch_record_stream`; PyTorch's
    caching allocator, its memory statistics and ``torch.cuda.graph``'s private pools are not
    used (PyTorch refuses a graph capture that would need them).
    """
def torch_record_stream(tensor: Any, stream: Any) -> None:
    """Declares that work on ``stream`` (a ``torch.cuda.Stream``, a custody ``Stream``, an
    object with ``__cuda_stream__`` or an int handle) uses ``tensor``'s memory, what ``Tensor.record_stream``
    does under PyTorch's own allocator: the block's free, whenever it comes, waits for the work
    enqueued on ``stream`` before it (an event, no host wait). The stream must outlive the
    block (PyTorch's pool streams always do). ``ValueError`` for a tensor whose storage custody
    did not allocate (or a view not at its storage's start: its storage is what is declared);
    ``RuntimeError`` for a refused stream (another device's); ``TypeError`` for a non-stream;
    ``RuntimeError`` before :func:`torch_allocator` loaded the library.
    """
def torch_live_bytes() -> int:
    """The bytes of the blocks custody's PyTorch allocator has handed out and PyTorch has not
    freed yet (PyTorch's own ``torch.cuda.memory_allocated`` does not count them). 0 before the
    library is loaded.
    """
def numba_memory_manager() -> type:
    """Numba's External Memory Management plugin class over custody
    (``numba.cuda.set_memory_manager(numba_memory_manager())``, or the environment variable
    ``NUMBA_CUDA_MEMORY_MANAGER=custody.interop`` before Numba starts): each device array is a
    custody buffer from ``Device(n).memory_resource`` allocated on the legacy default stream
    (Numba's allocation has no stream), freed when Numba finalizes its memory pointer. Numba
    keeps managing host memory; IPC handles and memory information are not provided
    (``NotImplementedError``). Imports ``numba.cuda``.
    """
