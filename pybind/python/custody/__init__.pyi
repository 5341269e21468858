"""custody: CUDA memory whose lifetime is owned correctly, with NVIDIA cuda.core 1.2's names.

Every buffer records, when it is made, the stream and the context its free needs (its
deallocation recipe), so it is freed correctly wherever its last reference goes: on another
thread, in the cyclic garbage collector, or in deferred cleanup. Driver failures raise
:class:`CUDAError`; a free that fails where nobody can receive the error is reported as a
:class:`CUDAWarning`.
"""

from typing import Any, Optional, Protocol, Tuple, Union

__version__: str

class _CudaStreamLike(Protocol):
    def __cuda_stream__(self) -> Tuple[int, int]: ...

StreamLike = Union["Stream", "GraphBuilder", _CudaStreamLike]

class CUDAError(RuntimeError):
    """A CUDA driver call failed.

    The message names the driver function and the driver's error name (``CUDA_ERROR_...``).
    """

    name: str
    """The driver's error name, e.g. ``"CUDA_ERROR_INVALID_VALUE"``."""
    code: int
    """The driver's error number."""

class CUDAWarning(RuntimeWarning):
    """A cleanup that no caller could receive failed or lost a guarantee.

    Emitted for a free that failed during a drop, garbage collection, on another thread or in
    deferred cleanup, naming the operation, pointer, stream and context; and for a
    per-thread-default-stream free that ran on another thread. If the warning is escalated to
    an error it goes to ``sys.unraisablehook``; during interpreter shutdown, to stderr.
    """

class Context:
    """A CUDA context (a device's primary context, retained while this object lives)."""

    @property
    def handle(self) -> int:
        """The raw ``CUcontext`` as an int."""
    @property
    def device_id(self) -> int:
        """The device ordinal the context belongs to."""

class Event:
    """A CUDA event, made by :meth:`Stream.record`."""

    def sync(self) -> None:
        """Blocks until the recorded work has finished.

        Raises ``RuntimeError`` if the event was closed; :class:`CUDAError` on a driver failure.
        """
    @property
    def is_done(self) -> bool:
        """Whether the recorded work has finished (does not block)."""
    @property
    def handle(self) -> int:
        """The raw ``CUevent`` as an int."""
    @property
    def context(self) -> Context:
        """The event's context."""
    def close(self) -> None:
        """Releases the event. Idempotent."""

class Stream:
    """A CUDA stream: created (``Device.create_stream()``), wrapped from another library
    (``Stream.from_handle``), or a default-stream singleton.

    A created stream lives at least as long as any pending free recorded on it, even after
    ``close()``. Cannot be instantiated directly (``RuntimeError``).
    """

    @staticmethod
    def from_handle(handle: Union[int, _CudaStreamLike]) -> "Stream":
        """Wraps a stream made elsewhere: an int handle, or an object with ``__cuda_stream__``.

        The token values 0, 0x1, 0x2 give the default-stream tokens; a stream custody created
        gives that stream back. ``TypeError`` for None or a non-int; ``OverflowError`` for a
        negative int; :class:`CUDAError` when the driver rejects the handle.
        """
    def __cuda_stream__(self) -> Tuple[int, int]:
        """``(0, handle)``: the CUDA stream protocol."""
    @property
    def handle(self) -> int:
        """The raw ``CUstream`` as an int (0x1 / 0x2 for the default-stream tokens)."""
    @property
    def is_closed(self) -> bool:
        """Whether ``close()`` was called."""
    def record(self, event: Optional[Event] = None, options: Any = None) -> Event:
        """Records ``event`` (a new one if omitted) on the stream and returns it."""
    def wait(self, event_or_stream: Union[Event, StreamLike]) -> None:
        """Makes future work on this stream wait for an event, or for the work queued so far on
        another stream. Does not block the host. ``TypeError`` for None or anything else."""
    def sync(self) -> None:
        """Blocks until all work queued on the stream has finished."""
    def close(self) -> None:
        """Releases this object's reference to the stream. A no-op for the default-stream
        singletons and for a closed stream."""
    @property
    def context(self) -> Context:
        """The stream's context; for a default-stream token, the context current now
        (``RuntimeError`` when none is)."""
    @property
    def device(self) -> "Device":
        """The device of the stream's context."""

LEGACY_DEFAULT_STREAM: Stream
"""The legacy default stream (``CU_STREAM_LEGACY``); resolved against the current context."""
PER_THREAD_DEFAULT_STREAM: Stream
"""The per-thread default stream (``CU_STREAM_PER_THREAD``); resolved against the current
context and thread."""

def default_stream() -> Stream:
    """``PER_THREAD_DEFAULT_STREAM`` when ``CUDA_PYTHON_CUDA_PER_THREAD_DEFAULT_STREAM`` is a
    non-zero integer, else ``LEGACY_DEFAULT_STREAM``; the variable is read on every call."""

def drain_deferred_cleanup() -> int:
    """Runs every queued deferred cleanup on the calling thread (GIL released) and returns how
    many ran: frees that CUDA graphs let go of, and synchronous frees waiting for their
    stream."""

class Buffer:
    """Memory with the deallocation recipe (stream and context) that will order and legalise
    its free.

    Made by ``MemoryResource.allocate`` or ``Buffer.from_handle``; cannot be instantiated
    directly (``RuntimeError``). Any thread may use, close or drop it. Closed objects raise
    ``RuntimeError("Buffer has been closed")`` except for ``close()``, ``handle``, ``size``,
    ``is_closed``, ``memory_resource``, ``owner``, ``is_mapped`` and ``repr``.

    A reference cycle through a buffer (an ``owner=`` or a memory resource that holds the
    buffer) is collected by ``gc.collect()``; a free through a Python ``deallocate`` then runs
    before any object of the cycle is cleared, with the recorded stream and the recipe's
    context.
    """

    @staticmethod
    def from_handle(
        ptr: int,
        size: int,
        mr: Optional["MemoryResource"] = None,
        owner: Optional[object] = None,
        *,
        stream: Optional[StreamLike] = None,
    ) -> "Buffer":
        """Wraps ``size`` bytes at ``ptr``, allocated elsewhere.

        - No ``mr``/``owner``: a view; nothing is freed.
        - ``owner``: kept alive until the memory's last reference goes; nothing is freed.
        - ``mr``: the buffer owns the memory; at teardown ``mr.deallocate(ptr, size,
          stream=...)`` runs with the recorded stream (``stream``, else ``default_stream()``
          bound to the current context), in that recipe's context, on whatever thread drops it.
          Prefer a created stream if the buffer may be freed on another thread.

        The recipe is recorded before ownership is taken: on any error the pointer is still
        the caller's and ``deallocate`` is not called. ``ValueError``: ``stream`` without
        ``mr``, ``mr`` with ``owner``, zero size, a null owned pointer; ``TypeError``: a bad
        ``mr`` or stream; ``OverflowError``: negative or too large numbers; ``RuntimeError``: no
        CUDA context is current for a default stream, or a closed stream.
        """
    @classmethod
    def from_ipc_descriptor(
        cls, mr: "MemoryResource", ipc_descriptor: Union["IPCBufferDescriptor", bytes], *, stream: StreamLike
    ) -> "Buffer":
        """Imports a buffer another process shared, from ``mr`` (a pool opened with
        ``from_allocation_handle``); ``stream`` (required) orders its eventual free.

        ``TypeError``: ``mr`` is not a pool resource, a missing or bad ``stream`` or descriptor;
        ``RuntimeError``: ``mr`` is not an imported pool; ``ValueError``: a malformed
        descriptor; :class:`CUDAError`: the driver refused the import.
        """
    def close(self, stream: Optional[StreamLike] = None) -> None:
        """Closes the buffer; when it holds the last reference to the memory, frees it now.

        ``close()`` on a closed buffer is a no-op. ``close(stream=s)`` is exactly
        ``set_deallocation_stream(s)`` then ``close()`` (so it raises on a closed buffer, and on
        a bad stream leaves the buffer open with its old recipe). A failing free raises
        (:class:`CUDAError`, or what a Python ``deallocate`` raised); the buffer is closed either
        way. May block for memory whose free is synchronous in the driver (pinned, managed,
        ``cuMemAlloc``); stream-ordered frees do not wait, except an imported buffer's
        (``is_mapped``): its close waits for its deallocation stream, so the unmap has run when
        it returns (the driver requires an importing process's free to have completed before the
        exporting process frees the allocation: close imports, then tell the exporter).
        """
    def set_deallocation_stream(self, stream: StreamLike) -> None:
        """Records the free on ``stream`` from now on: the whole recipe is replaced atomically,
        seen by every holder of the memory. Nothing is freed or synchronised: order the work on
        the old stream before the new one yourself.

        ``TypeError`` for None or a non-stream; ``RuntimeError`` for a closed buffer or stream,
        or a default stream with no current context; ``ValueError`` for a stream of another
        device. On error the old recipe stays.
        """
    def copy_to(self, dst: Optional["Buffer"] = None, *, stream: StreamLike) -> "Buffer":
        """Copies this buffer into ``dst`` (allocated from ``memory_resource`` with ``stream``
        if omitted), ordered on ``stream``, and returns ``dst``. ``ValueError`` for a size
        mismatch or no memory resource to allocate from."""
    def copy_from(self, src: "Buffer", *, stream: StreamLike) -> None:
        """Copies ``src`` into this buffer, ordered on ``stream``."""
    def fill(self, value: Union[int, bytes, Any], *, stream: StreamLike) -> None:
        """Fills the buffer with ``value`` repeated: an int in [0, 256) (8 bits) or an object of
        1, 2 or 4 bytes through the buffer protocol (8, 16 or 32 bits), ordered on ``stream``.
        ``OverflowError`` for an int out of range; ``ValueError`` for another width or a size
        that is not a multiple of it."""
    @property
    def handle(self) -> int:
        """The address as an int (a host address for pinned memory); 0 once closed."""
    @property
    def size(self) -> int:
        """The size in bytes; 0 once closed."""
    @property
    def is_closed(self) -> bool:
        """Whether the buffer was closed."""
    @property
    def memory_resource(self) -> Optional["MemoryResource"]:
        """The resource the memory came from (or that frees it); None for views and once
        closed."""
    @property
    def owner(self) -> Optional[object]:
        """The ``owner`` given to ``from_handle``; None otherwise and once closed."""
    @property
    def is_device_accessible(self) -> bool:
        """Whether a device can access the memory."""
    @property
    def is_host_accessible(self) -> bool:
        """Whether the host can access the memory."""
    @property
    def is_managed(self) -> bool:
        """Whether the memory is managed."""
    @property
    def device_id(self) -> int:
        """The device the memory belongs to; -1 for memory bound to no device. For memory a
        Python resource frees, that resource's ``device_id``, read now (it may raise)."""
    @property
    def is_mapped(self) -> bool:
        """Whether the buffer was imported from another process."""
    def __reduce__(self) -> Any:
        """``pickle`` (and ``multiprocessing``) reduce a buffer of an IPC-enabled pool resource
        to ``(mr, ipc_descriptor)`` (a ``copyreg`` reducer for ``Buffer``);
        unpickling (``custody._reduce_helper``) makes ``Device(mr.device_id)`` (device 0 for a
        pinned pool) current when no context is, and imports with
        ``stream=default_stream()``. ``RuntimeError`` for a closed buffer or a pool without
        IPC; ``TypeError`` for a buffer of any other resource (or none)."""
    @property
    def ipc_descriptor(self) -> "IPCBufferDescriptor":
        """The descriptor another process needs to import this buffer (``RuntimeError`` unless
        it comes from an IPC-enabled pool)."""
    def __dlpack__(
        self,
        *,
        stream: Optional[Any] = None,
        max_version: Optional[Tuple[int, int]] = None,
        dl_device: Optional[Tuple[int, int]] = None,
        copy: Optional[bool] = None,
    ) -> Any:
        """A ``"dltensor"`` capsule of a 1-D uint8 tensor of ``size`` elements over this memory;
        the tensor keeps the memory alive until its deleter runs. ``BufferError`` for
        ``copy=True`` or another ``dl_device``."""
    def __dlpack_device__(self) -> Tuple[int, int]:
        """``(device_type, device_id)``: kDLCUDA (2), kDLCUDAHost (3) or kDLCUDAManaged (13)."""
    def __enter__(self) -> "Buffer":
        """Returns the buffer."""
    def __exit__(self, *exc: Any) -> bool:
        """Closes the buffer; never suppresses an exception."""

class ManagedBuffer(Buffer):
    """A :class:`Buffer` of managed memory (``ManagedMemoryResource.allocate``)."""

    @classmethod
    def from_handle(  # type: ignore[override]
        cls,
        ptr: int,
        size: int,
        mr: Optional["MemoryResource"] = None,
        owner: Optional[object] = None,
        *,
        stream: Optional[StreamLike] = None,
    ) -> "ManagedBuffer":
        """As :meth:`Buffer.from_handle`, for managed memory (reported host- and
        device-accessible and managed without asking the driver)."""

class IPCBufferDescriptor:
    """What another process needs to import one buffer; ``bytes(descriptor)`` is 96 bytes.
    Picklable."""

    @staticmethod
    def from_bytes(data: bytes) -> "IPCBufferDescriptor":
        """Parses the serialised form (``ValueError`` when malformed)."""
    def __bytes__(self) -> bytes:
        """The serialised form."""
    @property
    def size(self) -> int:
        """The buffer's size in bytes."""
    @property
    def device_id(self) -> int:
        """The pool's device; -1 for a pinned host pool."""

class MemoryPoolAttributes:
    """A memory pool's attributes, in bytes, read from the driver on each access."""

    @property
    def used_mem_current(self) -> int:
        """Bytes allocated from the pool and not freed."""
    @property
    def used_mem_high(self) -> int:
        """The high-water mark of ``used_mem_current``."""
    @property
    def reserved_mem_current(self) -> int:
        """Bytes the pool holds from the driver."""
    @property
    def reserved_mem_high(self) -> int:
        """The high-water mark of ``reserved_mem_current``."""
    @property
    def release_threshold(self) -> int:
        """Bytes kept after a synchronisation before memory goes back to the OS."""

class MemoryResource:
    """The base class of memory resources; subclass it in Python.

    A subclass implements ``allocate`` (usually returning ``Buffer.from_handle(ptr, size,
    mr=self, stream=stream)``), ``deallocate``, ``is_device_accessible``,
    ``is_host_accessible`` and ``device_id`` (read only when asked, never at adoption). Its
    ``deallocate`` runs at teardown from whatever thread drops the buffer, with the recipe's
    context current and the GIL held only for that call; a host-only resource
    (``is_device_accessible`` False) has no recipe: adoption needs no context, any ``stream``
    given has nothing to order, and ``deallocate`` receives ``default_stream()`` with no
    context made current; an exception from it is reported as a :class:`CUDAWarning` (re-raised by an explicit
    ``close()``). It is never entered on a thread where a ``deallocate`` call is already
    running: a buffer released inside one (its last reference dropped, a garbage collection, a
    ``close()``) is freed right after that call returns, on the same thread, in its own recipe's
    context (a failure then is a :class:`CUDAWarning`). Once the interpreter is finalizing it is
    not called: the memory is leaked and that is reported on stderr (``atexit`` handlers still
    free through it).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        """Accepts and ignores any arguments (for subclasses)."""
    def allocate(self, size: int, *, stream: StreamLike) -> Buffer:
        """Allocates ``size`` bytes ordered on ``stream``, which also orders the eventual free.

        ``ValueError`` for 0 bytes; ``OverflowError`` for negative sizes or more than
        ``isize::MAX``; ``TypeError`` for a missing, None or non-stream ``stream``;
        ``RuntimeError`` for a closed stream or a default stream with no current context;
        :class:`CUDAError` for the driver's failure. The base class raises ``TypeError``.
        """
    def deallocate(self, ptr: int, size: int, *, stream: StreamLike) -> None:
        """Frees ``size`` bytes at ``ptr``, which this resource allocated, ordered on
        ``stream``; raises on failure. The base class raises ``TypeError``."""
    @property
    def is_device_accessible(self) -> bool:
        """Whether a device can access the memory."""
    @property
    def is_host_accessible(self) -> bool:
        """Whether the host can access the memory."""
    @property
    def device_id(self) -> int:
        """The device the memory belongs to; -1 for memory bound to no device."""
    @property
    def is_managed(self) -> bool:
        """Whether the memory is managed."""

class DeviceMemoryResource(MemoryResource):
    """Device memory from a stream-ordered pool: the device's current pool, or with options a
    pool of its own. Buffers it allocates are freed with ``cuMemFreeAsync`` on their recipe,
    without Python."""

    def __init__(self, device_id: Union[int, "Device"], options: Optional["DeviceMemoryResourceOptions"] = None) -> None:
        """``ValueError`` for a negative ordinal; :class:`CUDAError` for a device the driver
        does not have."""
    @classmethod
    def from_allocation_handle(cls, device_id: Union[int, "Device"], allocation_handle: int) -> "DeviceMemoryResource":
        """Opens a device pool another process exported (a file descriptor, kept by the
        caller); the resource only imports buffers."""
    @property
    def is_ipc_enabled(self) -> bool:
        """Whether the pool can be shared with other processes."""
    @property
    def is_mapped(self) -> bool:
        """Whether the pool was imported from another process."""
    @property
    def handle(self) -> int:
        """The raw ``CUmemoryPool`` as an int."""
    @property
    def attributes(self) -> MemoryPoolAttributes:
        """The pool's attributes."""
    def get_allocation_handle(self) -> int:
        """Exports the pool as a new POSIX file descriptor that the caller owns and closes
        (``RuntimeError`` unless the pool was made with ``ipc_enabled``)."""
    def close(self) -> None:
        """Closes this resource: ``allocate``, ``get_allocation_handle``, pickling and
        ``Buffer.from_ipc_descriptor`` then raise ``RuntimeError("DeviceMemoryResource has been closed")``;
        ``deallocate`` and the buffers already made keep working. The pool goes with the last
        of this object and its buffers (an owned pool outlives its allocations). Idempotent."""
    @property
    def is_closed(self) -> bool:
        """Whether :meth:`close` was called."""
    def __reduce__(self) -> Any:
        """``pickle`` (a ``copyreg`` reducer for the exact type) sends the pool of an IPC-enabled
        resource: exported as a file descriptor and handed
        to the receiving process by ``multiprocessing``'s resource sharer (the sending process
        must be alive; each pickle is read at most once). A process opens a given pool once and
        gets its own object back. ``RuntimeError`` for a closed or non-IPC resource."""

class PinnedMemoryResource(MemoryResource):
    """Pinned host memory from a stream-ordered host-located pool of its own."""

    def __init__(self, options: Optional["PinnedMemoryResourceOptions"] = None) -> None:
        """Creates the pool."""
    @classmethod
    def from_allocation_handle(cls, allocation_handle: int) -> "PinnedMemoryResource":
        """Opens a pinned pool another process exported."""
    @property
    def is_ipc_enabled(self) -> bool:
        """Whether the pool can be shared with other processes."""
    @property
    def is_mapped(self) -> bool:
        """Whether the pool was imported from another process."""
    @property
    def handle(self) -> int:
        """The raw ``CUmemoryPool`` as an int."""
    @property
    def attributes(self) -> MemoryPoolAttributes:
        """The pool's attributes."""
    def get_allocation_handle(self) -> int:
        """Exports the pool as a new POSIX file descriptor the caller owns."""
    def close(self) -> None:
        """Closes this resource: ``allocate``, ``get_allocation_handle``, pickling and
        ``Buffer.from_ipc_descriptor`` then raise ``RuntimeError("PinnedMemoryResource has been closed")``;
        ``deallocate`` and the buffers already made keep working. The pool goes with the last
        of this object and its buffers (an owned pool outlives its allocations). Idempotent."""
    @property
    def is_closed(self) -> bool:
        """Whether :meth:`close` was called."""
    def __reduce__(self) -> Any:
        """``pickle`` (a ``copyreg`` reducer for the exact type) sends the pool of an IPC-enabled
        resource: exported as a file descriptor and handed
        to the receiving process by ``multiprocessing``'s resource sharer (the sending process
        must be alive; each pickle is read at most once). A process opens a given pool once and
        gets its own object back. ``RuntimeError`` for a closed or non-IPC resource."""

class LegacyPinnedMemoryResource(MemoryResource):
    """Pinned host memory from ``cuMemAllocHost``. A drop never waits: the free runs on the
    cleanup worker after the recorded stream's work."""

    def __init__(self) -> None:
        """No driver call."""

class ManagedMemoryResource(MemoryResource):
    """Managed memory from ``cuMemAllocManaged``; ``allocate`` returns :class:`ManagedBuffer`."""

    def __init__(self, options: Optional["ManagedMemoryResourceOptions"] = None) -> None:
        """Placement options are accepted and unused."""

class SynchronousMemoryResource(MemoryResource):
    """Device memory from ``cuMemAlloc`` in the device's primary context: no context need be
    current; a default stream is replaced by the legacy stream bound to that context."""

    def __init__(self, device_id: Union[int, "Device"]) -> None:
        """Retains the device's primary context."""

class GraphMemoryResource(MemoryResource):
    """Graph memory: ``allocate`` works only on a stream that is being captured
    (``RuntimeError`` otherwise)."""

    def __init__(self, device_id: Union[int, "Device"]) -> None:
        """No driver call."""

class DeviceMemoryResourceOptions:
    """Options for a :class:`DeviceMemoryResource` with a pool of its own."""

    ipc_enabled: bool
    max_size: int
    def __init__(self, ipc_enabled: bool = False, max_size: int = 0) -> None:
        """``max_size`` in bytes, 0 for no limit."""

class PinnedMemoryResourceOptions:
    """Options for a :class:`PinnedMemoryResource`."""

    ipc_enabled: bool
    max_size: int
    numa_id: Optional[int]
    def __init__(self, ipc_enabled: bool = False, max_size: int = 0, numa_id: Optional[int] = None) -> None:
        """``numa_id`` None means node 0."""

class ManagedMemoryResourceOptions:
    """Options for a :class:`ManagedMemoryResource` (accepted, unused)."""

    preferred_location: Optional[int]
    preferred_location_type: Optional[str]
    def __init__(self, preferred_location: Optional[int] = None, preferred_location_type: Optional[str] = None) -> None:
        """Placement preferences."""

class StreamOptions:
    """Options for :meth:`Device.create_stream`."""

    nonblocking: bool
    priority: Optional[int]
    def __init__(self, nonblocking: bool = True, priority: Optional[int] = None) -> None:
        """``nonblocking``: the stream does not synchronise with the legacy default stream."""

class EventOptions:
    """Options for :meth:`Stream.record` (accepted; events are created without timing)."""

    enable_timing: bool
    busy_waited_sync: bool
    def __init__(self, enable_timing: bool = False, busy_waited_sync: bool = False) -> None:
        """Accepted for compatibility."""

class GraphBuilder:
    """Records work into a CUDA graph by capturing a stream (``Device.create_graph_builder()``).

    Pass it as the ``stream`` of ``Buffer.fill``, ``Buffer.copy_to`` / ``copy_from`` (the graph
    then keeps those buffers' memory alive, even after they are closed, until the graph and
    every executable made from it are gone; the free then runs with the buffer's recipe, on the
    cleanup worker or in ``drain_deferred_cleanup()``), of ``GraphMemoryResource.allocate``, and
    of ``Buffer.set_deallocation_stream`` (the captured stream). Work issued on ``stream``
    directly, such as a kernel that CuPy, PyTorch or Numba launches there, is captured but keeps
    nothing alive: :meth:`retain` the buffers it uses. A buffer whose free is recorded on the
    per-thread default stream warns when a graph retains it. Cannot be instantiated directly.
    """

    def begin_building(self, mode: str = "thread_local") -> "GraphBuilder":
        """Starts capturing (``"global"``, ``"thread_local"`` or ``"relaxed"``); returns self.
        ``ValueError`` for another mode; ``RuntimeError`` when already building."""
    def end_building(self) -> "GraphBuilder":
        """Ends capturing and keeps the recorded graph; returns self."""
    def complete(self) -> "Graph":
        """Instantiates the recorded graph (``RuntimeError`` before ``end_building()``)."""
    def retain(self, buffer: Buffer) -> None:
        """Makes the graph being captured keep ``buffer``'s memory allocated, for captured work
        custody does not see (a kernel another library launched on :attr:`stream` that reads or
        writes it). Call it any time between ``begin_building()`` and ``end_building()``. The
        graph ``end_building()`` records inherits the retention: after ``buffer.close()`` the
        memory stays allocated until that graph and every executable and launch made from it
        are gone (``close()`` of this builder and of each :class:`Graph`), and is then freed
        once, by the cleanup worker or in ``drain_deferred_cleanup()``, with the buffer's
        recipe as it is then (``set_deallocation_stream`` before ``close`` still moves the
        free). Retaining a buffer twice is harmless; a ``GraphMemoryResource`` buffer of this
        capture is the graph's own and is not retained; any device's memory may be retained.
        It orders nothing. Errors, all before any driver call and changing nothing:
        ``TypeError`` for anything but a ``Buffer`` (``None`` included); ``RuntimeError`` for a
        closed buffer, a closed builder, or a builder that is not building. Driver calls:
        ``cuStreamGetCaptureInfo_v2``, ``cuUserObjectCreate``, ``cuGraphRetainUserObject``,
        ``cuUserObjectRelease``."""
    @property
    def is_building(self) -> bool:
        """Whether the builder is capturing."""
    @property
    def stream(self) -> Stream:
        """The stream being captured."""
    def __cuda_stream__(self) -> Tuple[int, int]:
        """``(0, handle)`` of the captured stream."""
    def close(self) -> None:
        """Ends a capture still running and releases the builder and its recorded graph.
        Idempotent."""

class Graph:
    """An executable graph (``GraphBuilder.complete()``)."""

    def launch(self, stream: StreamLike) -> None:
        """Launches the graph on ``stream``. Does not block."""
    def retain(self, buffer: Buffer) -> None:
        """Makes this executable keep ``buffer``'s memory allocated, for work in the graph that
        custody does not see (a kernel another library captured into it). After
        ``buffer.close()`` the memory stays allocated until this graph is closed and its
        launches, including those queued before this call, have finished; it is then freed
        once, by the cleanup worker or in ``drain_deferred_cleanup()``, with the buffer's
        recipe as it is then. Only this executable holds it (not the builder's recorded graph
        or other executables). Retaining a buffer twice is harmless; any device's memory may
        be retained; it orders nothing. Errors, changing nothing: ``TypeError`` for anything
        but a ``Buffer`` (``None`` included); ``RuntimeError`` for a closed buffer or a closed
        graph. No driver call."""
    def close(self) -> None:
        """Releases the executable; what it retains is freed by the cleanup worker once it is
        gone. Idempotent."""
    @property
    def is_closed(self) -> bool:
        """Whether ``close()`` was called."""

class _System:
    """Process-wide facts."""

    @property
    def num_devices(self) -> int:
        """How many devices the driver sees."""

system: _System
"""Process-wide facts (``system.num_devices``)."""

class Device:
    """A CUDA device; ``Device(n)`` is the same object every time. ``Device()`` is the device
    of the current context, or device 0. ``TypeError`` for a non-int, ``ValueError`` for an
    ordinal out of range."""

    def __new__(cls, device_id: Optional[int] = None) -> "Device":
        """The device object for ``device_id``."""
    @property
    def device_id(self) -> int:
        """The device ordinal."""
    @property
    def context(self) -> Context:
        """The device's primary context."""
    def set_current(self, ctx: Optional[Context] = None) -> None:
        """Makes the primary context (or ``ctx``) current on the calling thread."""
    @property
    def memory_resource(self) -> MemoryResource:
        """The resource :meth:`allocate` uses (default: the device's current pool); settable."""
    @memory_resource.setter
    def memory_resource(self, mr: MemoryResource) -> None: ...
    @property
    def default_stream(self) -> Stream:
        """:func:`default_stream`."""
    def create_stream(self, obj: Optional[_CudaStreamLike] = None, options: Optional[StreamOptions] = None) -> Stream:
        """A new stream in the primary context (non-blocking by default), or a wrapper of
        ``obj``."""
    def create_graph_builder(self) -> "GraphBuilder":
        """A :class:`GraphBuilder` capturing a new stream in the device's primary context."""
    def allocate(self, size: int, *, stream: StreamLike) -> Buffer:
        """``self.memory_resource.allocate(size, stream=stream)``."""
    def sync(self) -> None:
        """Blocks until all work in the primary context has finished."""
    def __int__(self) -> int:
        """The device ordinal."""
    def __index__(self) -> int:
        """The device ordinal."""
