"""The compiled part of :mod:`custody`: its streams, events and contexts, buffers, memory
resources and graphs, written in Rust. Import them from ``custody``, which re-exports them."""

import uuid
from collections.abc import Iterable, MutableSet, Sequence
from typing import Any, Dict, Optional, Protocol, SupportsIndex, Tuple, Union

from custody import (
    Device,
    DeviceMemoryResourceOptions,
    EventOptions,
    StreamOptions,
    GraphCompleteOptions,
    Host,
    IPCAllocationHandle,
    ManagedMemoryLocationType,
    ManagedMemoryResourceOptions,
    PinnedMemoryResourceOptions,
)

class _CudaStreamLike(Protocol):
    def __cuda_stream__(self) -> Tuple[int, int]: ...

StreamLike = Union["Stream", "GraphBuilder", _CudaStreamLike]

class _IntLike(Protocol):
    """An object with ``__int__`` (a typing device)."""

    def __int__(self) -> int:
        """The address."""

PointerLike = Union[int, SupportsIndex, _IntLike]
"""A pointer as ``from_handle`` takes it: an int, or an object with ``__index__`` or ``__int__``
(``cuda.bindings.driver.CUdeviceptr``); not a float."""

class CUDAError(RuntimeError):
    """A CUDA driver call failed (a ``RuntimeError``).

    The message names the driver function and the driver's error name (``CUDA_ERROR_...``);
    ``name`` holds that name and ``code`` its number. When no driver library loads, the error is
    ``CUDA_ERROR_NOT_FOUND`` and the message says what was tried, that the environment variable
    ``CUSTODY_CUDA_DRIVER`` names a driver library, and how to build the emulated driver.
    """

    name: str
    """The driver's error name, e.g. ``"CUDA_ERROR_INVALID_VALUE"``."""
    code: int
    """The driver's error number."""

class CUDAWarning(RuntimeWarning):
    """A cleanup that no caller could receive failed or lost a guarantee (a ``RuntimeWarning``,
    shown by default).

    Emitted for a free that failed during a drop, garbage collection, on another thread or in
    deferred cleanup, naming the operation, pointer, stream and context; and for a
    per-thread-default-stream free on another thread that waits for a capture to end. If the
    warning is escalated to an error it goes to ``sys.unraisablehook``; during interpreter
    shutdown, to stderr.
    """

class Context:
    """A CUDA context: a device's primary context (retained while this object lives), or one made
    elsewhere (a wrapped stream's).

    Equal to another ``Context`` for the same driver context, hashable, weak-referenceable.
    Cannot be instantiated directly (``RuntimeError``): use ``Device.context`` or
    ``Stream.context``.
    """

    @property
    def handle(self) -> int:
        """The raw ``CUcontext`` as an int."""
    @property
    def device_id(self) -> int:
        """The device ordinal the context belongs to."""
    @property
    def is_closed(self) -> bool:
        """Always False: the object keeps its context for as long as it lives."""

class Event:
    """A CUDA event, made by :meth:`Stream.record` or :meth:`Device.create_event`.

    Equal to another ``Event`` object for the same driver event while both are open, hashable
    by the driver handle, weak-referenceable. ``end - start`` is the time between two recorded,
    completed events made with ``timing_enabled=True``, in milliseconds (a ``float``, from
    ``cuEventElapsedTime``); ``RuntimeError`` when either lacks timing ("Both Events must be
    created with timing enabled"), was never recorded ("Both Events must be recorded") or has
    not completed ("One or both events have not completed"). Cannot be instantiated directly.
    """

    def sync(self) -> None:
        """Blocks until the recorded work has finished (yielding the CPU for an event made with
        ``blocking_sync=True``).

        Raises ``RuntimeError`` if the event was closed; :class:`CUDAError` on a driver failure.
        """
    @property
    def is_done(self) -> bool:
        """Whether the recorded work has finished; does not block. ``RuntimeError`` if the event was
        closed; :class:`CUDAError` on a driver failure.
        """
    @property
    def handle(self) -> int:
        """The raw ``CUevent`` as an int (``RuntimeError`` once closed)."""
    @property
    def context(self) -> Optional[Context]:
        """The event's context; ``None`` for an event opened from another process
        (``RuntimeError`` once closed).
        """
    @property
    def device(self) -> Optional["Device"]:
        """The device of the event's context; ``None`` for an event opened from another process
        (``RuntimeError`` once closed).
        """
    @property
    def is_timing_enabled(self) -> bool:
        """Whether the event records timing data (``EventOptions.timing_enabled``)."""
    @property
    def is_blocking_sync(self) -> bool:
        """Whether :meth:`sync` yields the CPU (``EventOptions.blocking_sync``)."""
    @property
    def is_ipc_enabled(self) -> bool:
        """Whether the event can be shared with other processes (``EventOptions.ipc_enabled``)."""
    @property
    def is_closed(self) -> bool:
        """Whether ``close()`` was called."""
    @property
    def ipc_descriptor(self) -> "IPCEventDescriptor":
        """The descriptor another process needs to open this event (``Event.from_ipc_descriptor``;
        the driver's ``cuIpcGetEventHandle``). ``RuntimeError`` for a closed event or one made
        without ``ipc_enabled=True``; :class:`CUDAError` on a driver failure.
        """
    @classmethod
    def from_ipc_descriptor(cls, ipc_descriptor: "IPCEventDescriptor") -> "Event":
        """Opens an event another process shared (its ``ipc_descriptor``), in the current context;
        the event opened has no ``device`` or ``context`` here, and its ``ipc_descriptor`` is the
        one it was opened from. ``TypeError`` for anything but an :class:`IPCEventDescriptor`,
        ``ValueError`` for one whose handle bytes are shorter than 64; ``RuntimeError`` when no
        context is current; :class:`CUDAError` when the driver refuses the handle.
        """
    def close(self) -> None:
        """Releases this object's reference to the event (the driver's event is destroyed when no other
        reference holds it). Idempotent; never raises.
        """
    def __sub__(self, value: "Event") -> float:
        """The milliseconds from ``value``'s completion to this event's."""
    def __rsub__(self, value: object) -> Any:
        """``NotImplemented``: only events subtract."""
    def __isub__(self, value: object) -> Any:
        """``NotImplemented`` for every operand, so that ``a -= b`` falls back to ``a - b``."""

class Stream:
    """A CUDA stream: created (``Device.create_stream()``), wrapped from another library
    (``Stream.from_handle``), or a default-stream singleton.

    A created stream lives at least as long as any pending free recorded on it, even after
    ``close()``. Two ``Stream`` objects for one driver stream are equal and hash alike while
    open; streams are weak-referenceable and can be subclassed in Python (made with the
    class methods ``_init``, ``_legacy_default``, ``_per_thread_default``). Cannot be
    instantiated directly (``RuntimeError``).
    """

    @classmethod
    def _init(
        cls,
        obj: Optional[_CudaStreamLike] = None,
        options: Optional["StreamOptions"] = None,
        device_id: Optional[int] = None,
        ctx: Optional[Context] = None,
    ) -> "Stream":
        """A stream of this class: a wrapper of ``obj`` (an object with ``__cuda_stream__``;
        ``TypeError`` otherwise) if given, else a new stream made with ``options`` in ``ctx``, in
        device ``device_id``'s primary context, or in the current context (``RuntimeError`` when
        none is). :class:`CUDAError` when the driver refuses.
        """
    @classmethod
    def _legacy_default(cls) -> "Stream":
        """The legacy default stream as an object of this class (``LEGACY_DEFAULT_STREAM``
        itself for ``Stream``)."""
    @classmethod
    def _per_thread_default(cls) -> "Stream":
        """The per-thread default stream as an object of this class
        (``PER_THREAD_DEFAULT_STREAM`` itself for ``Stream``)."""
    @staticmethod
    def from_handle(handle: Union[int, _CudaStreamLike]) -> "Stream":
        """Wraps a stream made elsewhere: an int handle, or an object with ``__cuda_stream__``.

        The token values 0, 0x1, 0x2 give the default-stream tokens; a stream custody created
        gives that stream back. ``TypeError`` for None or a non-int; ``OverflowError`` for a
        negative int; :class:`CUDAError` when the driver rejects the handle.

        custody cannot keep a stream wrapped from an ``int`` alive: while a buffer's free is
        recorded on it (``allocate``, ``set_deallocation_stream``) or a use declared
        (``record_use``), its owner must not destroy it (a destroyed stream is undefined in the
        driver; a free on one ends the process on a GPU). An object with ``__cuda_stream__`` is
        kept alive.
        """
    def __cuda_stream__(self) -> Tuple[int, int]:
        """``(0, handle)``: the CUDA stream protocol (``RuntimeError`` once closed)."""
    @property
    def handle(self) -> int:
        """The raw ``CUstream`` as an int (0x1 / 0x2 for the default-stream tokens); ``RuntimeError``
        once closed. cuda.core returns a ``cuda.bindings`` ``CUstream`` here; an int works wherever
        that does through ``int(stream.handle)``, and cuda.bindings' functions take it as it is.
        """
    @property
    def is_closed(self) -> bool:
        """Whether ``close()`` was called."""
    @property
    def is_nonblocking(self) -> bool:
        """Whether the stream does not synchronise with the legacy default stream
        (``cuStreamGetFlags``); ``RuntimeError`` once closed.
        """
    @property
    def priority(self) -> int:
        """The stream's priority, lower numbers first (``cuStreamGetPriority``); ``RuntimeError`` once
        closed.
        """
    def record(self, event: Optional[Event] = None, options: Optional["EventOptions"] = None) -> Event:
        """Records ``event`` (a new one made with ``options``, an :class:`EventOptions` or a dict, in
        the stream's context if omitted) on the stream and returns it: the event completes when the
        work queued on the stream so far has. Does not block. An IPC-enabled event is recorded
        once, when made. ``TypeError`` for an ``event`` that is not an :class:`Event`, an
        IPC-enabled one, or bad options; ``RuntimeError`` for a closed stream or event, or a
        default stream with no current context; :class:`CUDAError` on a driver failure.
        """
    def wait(self, event_or_stream: Union[Event, StreamLike]) -> None:
        """Makes future work on this stream wait for an event, or for the work queued so far on another
        stream (through an event recorded there now). Does not block the host. ``TypeError`` for
        None, ``ValueError`` for anything else that is not an event or a stream; ``RuntimeError``
        for a closed stream or event, or a default stream with no current context;
        :class:`CUDAError` on a driver failure.
        """
    def sync(self) -> None:
        """Blocks the calling thread (the GIL released) until all work queued on the stream has
        finished. ``RuntimeError`` once closed; :class:`CUDAError` on a driver failure.
        """
    def close(self) -> None:
        """Releases this object's reference to the stream; a created stream is destroyed once no
        pending free recorded on it needs it. A no-op for the default-stream singletons and for a
        closed stream. :class:`CUDAError` when destroying the stream fails (it is closed either
        way).
        """
    @property
    def context(self) -> Context:
        """The stream's context; for a default-stream token, the context current now. ``RuntimeError``
        once closed, or for a token when no context is current.
        """
    @property
    def device(self) -> "Device":
        """The device of the stream's context (``RuntimeError`` as for :attr:`context`)."""
    def create_graph_builder(self) -> "GraphBuilder":
        """A :class:`GraphBuilder` that captures this stream (``RuntimeError`` once closed)."""

LEGACY_DEFAULT_STREAM: Stream
"""The legacy default stream (``CU_STREAM_LEGACY``); resolved against the current context."""
PER_THREAD_DEFAULT_STREAM: Stream
"""The per-thread default stream (``CU_STREAM_PER_THREAD``); resolved against the current
context and thread."""

def default_stream() -> Stream:
    """``PER_THREAD_DEFAULT_STREAM`` when ``CUDA_PYTHON_CUDA_PER_THREAD_DEFAULT_STREAM`` is a
    non-zero integer, else ``LEGACY_DEFAULT_STREAM``; the variable is read on every call."""

def at_python_exit() -> None:
    """The `atexit` callback (registered by the module at import): marks the start of the
    interpreter's exit and its exit thread, then waits (GIL released, at most 5 seconds) for
    threads inside [`with_python`] to leave, so that no other thread is attached, or about to
    attach, through custody when finalization starts.
    """

def drain_deferred_cleanup() -> int:
    """Runs every queued deferred cleanup on the calling thread (GIL released) and returns how
    many ran: frees that CUDA graphs let go of, and synchronous frees waiting for their
    stream."""

class Buffer:
    """Memory with the deallocation recipe (stream and context) that will order and legalise its
    free.

    Made by ``MemoryResource.allocate`` or ``Buffer.from_handle``; cannot be instantiated
    directly (``RuntimeError``). Any thread may use, close or drop it. Closed objects raise
    ``RuntimeError("Buffer has been closed")`` except for ``close()``, ``handle``, ``size``,
    ``is_closed``, ``memory_resource``, ``owner``, ``is_mapped`` and ``repr``. Sizes are in
    bytes.

    A reference cycle through a buffer (an ``owner=`` or a memory resource that holds the
    buffer) is collected by ``gc.collect()``; a free through a Python ``deallocate`` then runs
    before any object of the cycle is cleared, with the recorded stream and the recipe's
    context.

    ``pickle`` (and ``multiprocessing``) send a buffer of an IPC-enabled
    ``DeviceMemoryResource`` or ``PinnedMemoryResource`` as ``(mr, ipc_descriptor)``; unpickling
    imports it with ``stream=default_stream()``, first making ``Device(mr.device_id)`` (device 0
    for a pinned pool) current when no context is. ``RuntimeError`` for a closed buffer or a
    pool without IPC; ``TypeError`` for a buffer of any other resource (or none).
    """

    @staticmethod
    def from_handle(
        ptr: "PointerLike",
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

        The pointer is taken on the caller's word: custody does not check that it is device or
        host memory of this process, and one that is not (or a ``size`` larger than the
        allocation) can crash the process when a copy or fill uses it, as in cuda.core.

        ``size`` 0: without ``mr`` (a view, or kept alive by ``owner``) a zero-size buffer is
        returned (``size`` 0, ``handle`` the given ``ptr``, which may be 0 for a view), and
        closing it frees nothing; with ``mr``, ``ValueError`` ("invalid size of 0 bytes"): a
        buffer that owns its memory needs at least one byte, and ``deallocate`` is not called.

        The recipe is recorded before ownership is taken: on any error the pointer is still
        the caller's and ``deallocate`` is not called. ``ValueError``: ``stream`` without
        ``mr``, ``mr`` with ``owner``, zero size with ``mr``, a null pointer with ``mr`` or
        ``owner``, a range that wraps past the end of the address space (``ptr + size`` not
        below ``2**64``, with or without ``mr``); ``TypeError``: a bad ``mr`` or stream, or a
        ``stream`` passed by position (it is keyword-only);
        ``OverflowError``: negative or too large numbers, and a ``size`` over ``isize::MAX``
        (as ``allocate``; checked first); ``RuntimeError``: no CUDA context is current for a
        default stream, or a closed stream.
        """
    @classmethod
    def from_ipc_descriptor(
        cls, mr: "MemoryResource", ipc_descriptor: Union["IPCBufferDescriptor", bytes], *, stream: StreamLike
    ) -> "Buffer":
        """Imports a buffer another process shared, from ``mr`` (a pool opened with
        ``from_allocation_handle``); ``stream`` (required, keyword-only) orders its eventual free.
        Does not block.

        ``TypeError``: ``mr`` is not a pool resource, a missing or bad ``stream`` or descriptor;
        ``RuntimeError``: ``mr`` is not an imported pool, or a closed stream; ``ValueError``: a
        malformed descriptor, or one the pool cannot hold; :class:`CUDAError`: the driver refused
        the import.
        """
    def close(self, stream: Optional[StreamLike] = None) -> None:
        """Closes the buffer; when it holds the last reference to the memory, frees it now.

        ``close()`` on a closed buffer is a no-op. ``close(stream=s)`` is exactly
        ``set_deallocation_stream(s)`` then ``close()`` (so it raises on a closed buffer, and on a
        bad stream, ``TypeError`` or ``RuntimeError`` as there, leaves the buffer open with its old
        recipe). A failing free raises (:class:`CUDAError`, or what a Python ``deallocate`` raised);
        the buffer is closed either way. The free is ordered on the recorded deallocation stream.
        May block for memory whose free is synchronous in the driver (pinned, managed,
        ``cuMemAlloc``); stream-ordered frees do not wait, except an imported buffer's
        (``is_mapped``): its close first waits for every stream of the buffer's context, so that
        work queued on another stream than the deallocation stream (and not declared with
        :meth:`record_use`) has run before the unmap (a use of an unmapped import is a device
        fault that ends the context), then frees, then waits for its deallocation stream, so the
        unmap has run when it returns (the driver requires an importing process's free to have
        completed before the exporting process frees the allocation: close imports, then tell
        the exporter). The first wait is left out while a capture begun through custody may run.
        """
    def record_use(self, stream: StreamLike) -> None:
        """Declares that work on ``stream`` uses this buffer (PyTorch's ``record_stream`` is the
        analogue): when the memory is freed, by ``close()``, a drop, the garbage collector or a
        graph's deferred cleanup, on any thread, the deallocation stream first waits
        (``cuStreamWaitEvent``) for an event recorded on ``stream`` at that moment, so the free is
        ordered after all work enqueued on ``stream`` before it, including work enqueued after
        this call. Nothing is synchronised or polled, now or at the free; a drop does not block.
        Works with every memory kind; ``set_deallocation_stream`` keeps the recorded uses;
        recording a stream twice, or the deallocation stream, adds nothing. The buffer keeps
        ``stream`` alive until the free, except a stream wrapped from a bare ``int``
        (``Stream.from_handle(int)``), which its owner must keep until then: a destroyed stream
        is undefined in the driver. A default stream is bound to the current context (the
        per-thread default stream also to the calling thread; freed on another thread, the event
        is recorded on that context's legacy default stream, which waits for it). While
        ``stream`` is being captured into a graph at the free, the free waits until the capture
        ends. A buffer that frees nothing (``from_handle`` without ``mr``) records nothing.

        ``TypeError`` for None or a non-stream; ``RuntimeError`` for a closed buffer or stream, a
        default stream with no current context, or a stream whose context (one made by other
        code) has been destroyed; ``ValueError`` for a stream of another device (for device
        memory; pinned and managed memory accept any device's stream). On error nothing is
        recorded.
        """
    def set_deallocation_stream(self, stream: StreamLike) -> None:
        """Records the free on ``stream`` from now on: the whole recipe is replaced atomically,
        seen by every holder of the memory. Nothing is freed or synchronised: order the work on
        the old stream before the new one yourself.

        ``TypeError`` for None or a non-stream; ``RuntimeError`` for a closed buffer or stream, a
        default stream with no current context, or a stream whose context (one made by other
        code) has been destroyed; ``ValueError`` for a stream of another device. On error the
        old recipe stays.
        """
    def copy_to(self, dst: Optional["Buffer"] = None, *, stream: StreamLike) -> "Buffer":
        """Copies this buffer into ``dst`` (allocated from ``memory_resource`` with ``stream`` if
        omitted), ordered on ``stream``, and returns ``dst``. Does not block; a
        :class:`GraphBuilder` as ``stream`` records the copy into its graph, which then keeps both
        buffers' memory alive. ``TypeError`` for a ``dst`` that is not a :class:`Buffer`;
        ``TypeError`` for a missing, ``None`` or non-stream ``stream`` or one passed by position (it
        is keyword-only); ``RuntimeError`` for a closed stream or buffer; ``ValueError`` for a size
        mismatch or no memory resource to allocate from; :class:`CUDAError` on a driver failure.
        Zero bytes: after these checks nothing is done and no driver call is made.
        """
    def copy_from(self, src: "Buffer", *, stream: StreamLike) -> None:
        """Copies ``src`` into this buffer, ordered on ``stream``. Does not block; a
        :class:`GraphBuilder` as ``stream`` records the copy into its graph, which then keeps both
        buffers' memory alive. ``TypeError`` for a ``src`` that is not a :class:`Buffer`;
        ``TypeError`` for a missing, ``None`` or non-stream ``stream`` or one passed by position (it
        is keyword-only); ``RuntimeError`` for a closed stream or buffer; ``ValueError`` for a size
        mismatch; :class:`CUDAError` on a driver failure.
        Zero bytes: after these checks nothing is done and no driver call is made.
        """
    def fill(self, value: Union[int, bytes, Any], *, stream: StreamLike) -> None:
        """Fills the buffer with ``value`` repeated: an int in [0, 256) (8 bits) or an object of 1, 2
        or 4 bytes through the buffer protocol (8, 16 or 32 bits), ordered on ``stream``. Does not
        block; a :class:`GraphBuilder` as ``stream`` records the fill into its graph, which then
        keeps the buffer's memory alive. ``TypeError`` for ``None`` or another kind of ``value``;
        ``OverflowError`` for an int out of range; ``ValueError`` for another width or a size that
        is not a multiple of it; ``TypeError`` for a missing, ``None`` or non-stream ``stream`` or
        one passed by position (it is keyword-only); ``RuntimeError`` for a closed stream or buffer;
        :class:`CUDAError` on a driver failure.
        An empty buffer: after these checks nothing is done and no driver call is made.
        """
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
        """Whether a device can access the memory (``RuntimeError`` once closed)."""
    @property
    def is_host_accessible(self) -> bool:
        """Whether the host can access the memory (``RuntimeError`` once closed)."""
    @property
    def is_managed(self) -> bool:
        """Whether the memory is managed (``RuntimeError`` once closed)."""
    @property
    def device_id(self) -> int:
        """The device the memory belongs to; -1 for memory bound to no device. For memory a Python
        resource frees, that resource's ``device_id``, read now (it may raise); for pinned or
        registered host memory adopted with no resource, the device the driver names
        (``CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL``: the one whose context made or registered it).
        ``RuntimeError`` once closed.
        """
    @property
    def is_mapped(self) -> bool:
        """Whether the buffer was imported from another process."""
    @property
    def ipc_descriptor(self) -> "IPCBufferDescriptor":
        """The descriptor another process needs to import this buffer with
        ``Buffer.from_ipc_descriptor`` (``cuMemPoolExportPointer``). ``RuntimeError`` for a closed
        buffer, or one that does not come from an IPC-enabled pool or was itself imported.
        """
    def __dlpack__(
        self,
        *,
        stream: Optional[Any] = None,
        max_version: Optional[Tuple[int, int]] = None,
        dl_device: Optional[Tuple[int, int]] = None,
        copy: Optional[bool] = None,
    ) -> Any:
        """A DLPack capsule of a 1-D uint8 tensor of ``size`` elements over this memory; the tensor
        keeps the memory alive until its deleter runs. With ``max_version`` at least ``(1, 0)`` a
        ``"dltensor_versioned"`` capsule (DLPack 1.0, writable, not a copy), else a ``"dltensor"``
        one.

        ``stream`` is the consumer's stream: 1 (legacy default), 2 (per-thread default), a
        stream's handle, or (custody's addition) a :class:`Stream` or an object with
        ``__cuda_stream__``. That stream first waits for the work queued on the buffer's deallocation
        stream (an event, no host wait), and it is declared a use of the memory, as
        :meth:`record_use` declares one, so the buffer's free, wherever it happens, waits for the
        consumer's work. The declaration needs a stream custody can keep alive until the free: a
        default stream, one custody created, or one wrapped with its owner
        (``Stream.from_handle(obj)`` of an object with ``__cuda_stream__``); the bare handle of
        another library's stream only waits (declare its use yourself with :meth:`record_use` of
        such a wrapper). ``None`` (DLPack's default) and -1 order nothing.

        ``BufferError`` for ``copy=True``, a ``dl_device`` other than the buffer's own, a
        ``max_version`` that is not two ints, memory neither a device nor the host can access, a
        ``stream`` of 0 or another negative value, or a deallocation stream being captured;
        ``TypeError`` for a ``stream`` that is no stream; ``ValueError`` for another device's stream (device
        memory); ``RuntimeError`` once closed. Nothing is exported, waited for or declared on
        error.
        """
    @property
    def __cuda_array_interface__(self) -> Dict[str, Any]:
        """The CUDA Array Interface (version 3): the memory as a 1-D ``uint8`` array of ``size``
        elements, writable, with ``stream`` the deallocation stream (1 for the legacy default
        stream, 2 for the per-thread one, else the stream's handle; None for memory with no
        recipe), on which a consumer must order its use. The interface names no consumer stream,
        so nothing is declared: a consumer reading on another stream declares it with
        :meth:`record_use`, or views the buffer with ``StridedMemoryView`` and a consumer stream.
        ``RuntimeError`` once closed; ``AttributeError`` for memory no device can access.
        """
    def __dlpack_device__(self) -> Tuple[int, int]:
        """``(device_type, device_id)``: kDLCPU (1), kDLCUDA (2), kDLCUDAHost (3) or kDLCUDAManaged
        (13); memory adopted from elsewhere is asked of the driver (managed or not).
        ``RuntimeError`` once closed.
        """
    def __enter__(self) -> "Buffer":
        """Returns the buffer."""
    def __exit__(self, *exc: Any) -> bool:
        """Closes the buffer as ``close()`` does (raising what it raises); never suppresses an
        exception.
        """

class ManagedBuffer(Buffer):
    """A :class:`Buffer` of managed memory (``ManagedMemoryResource.allocate``)."""

    @classmethod
    def from_handle(  # type: ignore[override]
        cls,
        ptr: "PointerLike",
        size: int,
        mr: Optional["MemoryResource"] = None,
        owner: Optional[object] = None,
        *,
        stream: Optional[StreamLike] = None,
    ) -> "ManagedBuffer":
        """As :meth:`Buffer.from_handle`, for managed memory (reported host- and
        device-accessible and managed without asking the driver). ``size`` 0 as there: a
        zero-size ``ManagedBuffer`` without ``mr``, ``ValueError`` with ``mr``.
        """
    @property
    def read_mostly(self) -> bool:
        """Whether read-mostly advice is set (``CU_MEM_ADVISE_SET_READ_MOSTLY``: reads may be
        served from read-only copies on every processor that reads); assigning gives or takes
        back that advice. ``ValueError`` for memory that is not managed; ``RuntimeError`` once
        closed; :class:`CUDAError` when the driver refuses.
        """
    @read_mostly.setter
    def read_mostly(self, value: bool) -> None: ...
    @property
    def preferred_location(self) -> Union["Device", "Host", None]:
        """Where the memory is advised to live: a :class:`Device`, a :class:`Host`, or ``None``
        for no preference; assigning one gives that advice, ``None`` takes it back. Errors as
        :attr:`read_mostly`; ``TypeError`` for a value that is no location.
        """
    @preferred_location.setter
    def preferred_location(self, value: Union["Device", "Host", None]) -> None: ...
    @property
    def accessed_by(self) -> "MutableSet[Union[Device, Host]]":
        """The devices (and ``Host()``) the memory is advised to stay mapped for
        (``CU_MEM_ADVISE_SET_ACCESSED_BY``): a live set, read from the driver on each use, whose
        ``add`` and ``discard`` give and take back the advice; assigning a set of locations
        makes the advice that set (all are checked before any changes). Only a :class:`Device` or
        ``Host()`` qualifies (``ValueError`` for a NUMA node); errors otherwise as
        :attr:`read_mostly`.
        """
    @accessed_by.setter
    def accessed_by(self, value: "Iterable[Union[Device, Host]]") -> None: ...
    @property
    def last_prefetch_location(self) -> Union["Device", "Host", None]:
        """Where the memory was last prefetched to (:meth:`prefetch`, the batch functions): a
        :class:`Device`, a :class:`Host`, or ``None`` when it never was (read from the driver's
        ``CU_MEM_RANGE_ATTRIBUTE_LAST_PREFETCH_LOCATION``; not in cuda.core 1.2). Errors as
        :attr:`read_mostly`.
        """
    def prefetch(self, location: Union["Device", "Host"], *, stream: StreamLike) -> None:
        """Migrates the memory to ``location`` (a :class:`Device` or :class:`Host`), ordered on
        ``stream`` (keyword-only: a :class:`Stream`, a :class:`GraphBuilder`, or an object with
        ``__cuda_stream__``); does not block. ``ValueError`` for memory that is not managed or
        for ``location=None``, ``TypeError`` for a value that is no location or a missing
        stream; ``RuntimeError`` once closed; :class:`CUDAError` when the driver refuses.
        """
    def discard(self, *, stream: StreamLike) -> None:
        """Discards the memory's contents (they read as undefined until written; no pages are
        migrated back), ordered on ``stream`` (keyword-only, as :meth:`prefetch`); does not
        block. Errors as :meth:`prefetch`; :class:`CUDAError` from a driver before CUDA 12.8.
        """
    def discard_prefetch(self, location: Union["Device", "Host"], *, stream: StreamLike) -> None:
        """Discards the memory's contents and migrates it to ``location``, ordered on ``stream``
        (keyword-only, as :meth:`prefetch`); does not block. Errors as :meth:`discard`.
        """

LocationLike = Union["Device", "Host"]

def prefetch_batch(
    stream: StreamLike,
    buffers: Sequence[Buffer],
    locations: Union[LocationLike, Sequence[LocationLike]],
) -> None:
    """Migrates each of ``buffers`` (a sequence of managed :class:`Buffer` objects) to its
    location, ordered on ``stream``, in one driver call (``cuMemPrefetchBatchAsync``); does not
    block. ``locations``: one :class:`Device` or :class:`Host` for all, or a list or tuple of one
    per buffer (``ValueError`` when the lengths differ). ``TypeError`` for a single buffer or
    anything but a sequence of buffers, or a missing stream; ``ValueError`` for an empty sequence
    or memory that is not managed; ``RuntimeError`` for a closed buffer; :class:`CUDAError` when
    the driver refuses (or predates CUDA 12.8).
    """

def discard_batch(stream: StreamLike, buffers: Sequence[Buffer]) -> None:
    """Discards the contents of ``buffers`` (a sequence of managed :class:`Buffer` objects),
    ordered on ``stream``, in one driver call (``cuMemDiscardBatchAsync``); does not block.
    Errors as :func:`prefetch_batch`.
    """

def discard_prefetch_batch(
    stream: StreamLike,
    buffers: Sequence[Buffer],
    locations: Union[LocationLike, Sequence[LocationLike]],
) -> None:
    """Discards the contents of ``buffers`` and migrates each to its location, ordered on
    ``stream``, in one driver call (``cuMemDiscardAndPrefetchBatchAsync``); does not block.
    ``locations`` and errors as :func:`prefetch_batch`.
    """

class IPCBufferDescriptor:
    """What another process needs to import one buffer: the pool's export data for it (the payload:
    the driver's 64-byte ``CUmemPoolPtrExportData``, then the pool's device as 4 bytes,
    little-endian, -1 for a pinned host pool) and its size in bytes. ``bytes(descriptor)`` is 96
    bytes; picklable (as ``_init(payload, size)``, cuda.core's form, where a 64-byte payload names
    no device). Compared by value. Cannot be instantiated directly (``RuntimeError``).
    """

    @staticmethod
    def _init(reserved: bytes, size: int) -> "IPCBufferDescriptor":
        """A descriptor from its payload and size, as unpickling makes it; checked when
        imported (``ValueError`` for a payload shorter than 64 bytes). A 64-byte payload names
        no device: the importing pool's is taken."""
    @staticmethod
    def from_bytes(data: bytes) -> "IPCBufferDescriptor":
        """Parses the serialised form (``ValueError`` when malformed)."""
    def __bytes__(self) -> bytes:
        """The serialised form, 96 bytes."""
    @property
    def size(self) -> int:
        """The buffer's size in bytes."""
    @property
    def device_id(self) -> int:
        """The pool's device; -1 for a pinned host pool or a payload that names none."""

class MemoryPoolAttributes:
    """A memory pool's attributes, read from the driver (``cuMemPoolGetAttribute``, the GIL
    released) on each access; sizes in bytes. Reading one raises :class:`CUDAError` on a driver
    failure. The repr lists every attribute with its value. Cannot be instantiated directly:
    ``DeviceMemoryResource.attributes``, ``PinnedMemoryResource.attributes``.
    """

    @property
    def used_mem_current(self) -> int:
        """Bytes allocated from the pool and not freed (``CU_MEMPOOL_ATTR_USED_MEM_CURRENT``)."""
    @property
    def used_mem_high(self) -> int:
        """The high-water mark of ``used_mem_current``, in bytes (``CU_MEMPOOL_ATTR_USED_MEM_HIGH``)."""
    @property
    def reserved_mem_current(self) -> int:
        """Bytes the pool holds from the driver (``CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT``)."""
    @property
    def reserved_mem_high(self) -> int:
        """The high-water mark of ``reserved_mem_current``, in bytes
        (``CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH``).
        """
    @property
    def release_threshold(self) -> int:
        """Bytes the pool keeps after a synchronisation before memory goes back to the OS
        (``CU_MEMPOOL_ATTR_RELEASE_THRESHOLD``).
        """
    @property
    def reuse_follow_event_dependencies(self) -> bool:
        """Whether memory freed on one stream may be reused on a stream that waits on an event recorded
        after the free (``CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES``).
        """
    @property
    def reuse_allow_opportunistic(self) -> bool:
        """Whether memory whose free has completed may be reused without a dependency
        (``CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC``).
        """
    @property
    def reuse_allow_internal_dependencies(self) -> bool:
        """Whether the driver may insert dependencies between streams to reuse memory
        (``CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES``).
        """

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

    ``MemoryResource(*args, **kwargs)`` accepts and ignores any arguments (for subclasses).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        ...
    def allocate(self, size: int, *, stream: StreamLike) -> Buffer:
        """Allocates ``size`` bytes ordered on ``stream`` (keyword-only), which also orders the
        eventual free.

        Zero bytes give an empty buffer of this resource (address 0, no driver call).
        ``LegacyPinnedMemoryResource`` and ``SynchronousMemoryResource`` need no ``stream`` (the
        free is then ordered on the default stream). ``OverflowError`` for negative sizes or more
        than ``isize::MAX``; ``TypeError`` for a missing, None or non-stream ``stream``, or one
        passed by position, the message naming the class called; ``RuntimeError`` for a closed
        stream or a default stream with no current context; :class:`CUDAError` for the driver's
        failure (among them ``CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED`` for a stream-ordered
        allocation on a stream not being captured, beside a global capture on any thread or a
        thread-local capture of this thread: the driver then invalidates that capture; custody
        relaxes its frees beside a capture, not allocations); ``RuntimeError`` (``the interpreter
        is shutting down: ...``) on a thread other than the interpreter's exit thread once
        custody's ``atexit`` callback has run. The base class raises ``TypeError``, and so does a
        subclass that does not define it.
        """
    def deallocate(self, ptr: int, size: int, *, stream: StreamLike) -> None:
        """Frees ``size`` bytes at ``ptr``, which this resource allocated, ordered on ``stream``
        (keyword-only), as the resource's own buffers are freed; raises on failure
        (:class:`CUDAError`). The pointer is taken on the caller's word, as in cuda.core: it must
        be memory no live :class:`Buffer` owns (what ``Buffer.from_handle(..., mr=...)`` hands
        back at teardown, say). A buffer's own memory is freed by its ``close()`` or drop, and a
        ``deallocate`` of it as well is a double free (for a :class:`CachingMemoryResource`, a
        block it then lends out again while freed). ``TypeError`` for a missing, ``None`` or non-stream ``stream`` or one
        passed by position (it is keyword-only); ``RuntimeError`` for a closed stream. The base
        class raises ``TypeError``.
        """
    @property
    def is_device_accessible(self) -> bool:
        """Whether a device can access the memory. The base class raises ``TypeError``."""
    @property
    def is_host_accessible(self) -> bool:
        """Whether the host can access the memory. The base class raises ``TypeError``."""
    @property
    def device_id(self) -> int:
        """The device the memory belongs to; -1 for memory bound to no device. The base class raises
        ``TypeError``.
        """
    @property
    def is_managed(self) -> bool:
        """Whether the memory is managed (False for the base class)."""

class _MemPool(MemoryResource):
    """The base of the stream-ordered pool resources (cuda.core's ``_MemPool``): what a pool shares
    with other processes, its attributes, and closing it. Not instantiated directly: a
    :class:`DeviceMemoryResource`, :class:`PinnedMemoryResource` or :class:`ManagedMemoryResource`
    is one.
    """

    @property
    def is_ipc_enabled(self) -> bool:
        """Whether the pool can be shared with other processes."""
    @property
    def is_mapped(self) -> bool:
        """Whether the pool was imported from another process (it then only imports buffers, with
        ``Buffer.from_ipc_descriptor``).
        """
    @property
    def handle(self) -> int:
        """The raw ``CUmemoryPool`` as an int."""
    @property
    def attributes(self) -> MemoryPoolAttributes:
        """The pool's attributes (:class:`MemoryPoolAttributes`), read from the driver when accessed."""
    @property
    def allocation_handle(self) -> "IPCAllocationHandle":
        """The pool's shareable handle, an :class:`IPCAllocationHandle` exported once and
        kept by this resource, for another process's ``from_allocation_handle`` (it
        pickles for ``multiprocessing``). ``RuntimeError("Memory resource is not
        IPC-enabled")`` for a pool made without ``ipc_enabled``, ``RuntimeError`` for a
        closed resource; :class:`CUDAError` on a driver failure.
        """
    def get_allocation_handle(self) -> "IPCAllocationHandle":
        """A new shareable handle the caller owns: an :class:`IPCAllocationHandle` of a
        fresh export of the pool, its file descriptor closed with the handle. Errors as
        :attr:`allocation_handle`.
        """
    @property
    def uuid(self) -> Optional["uuid.UUID"]:
        """The UUID naming the pool across processes (the same in the process that made
        it and in every process that opened it); ``None`` unless the pool can be
        shared.
        """
    @property
    def is_handle_owned(self) -> bool:
        """Whether this resource made its pool (and it goes with the last of the resource
        and its buffers); ``False`` for a device's current pool.
        """
    def close(self) -> None:
        """Closes this resource: ``allocate`` (of one byte or more: zero bytes still give an empty
        buffer, which holds no memory), ``get_allocation_handle``, pickling and
        ``Buffer.from_ipc_descriptor`` then raise a ``RuntimeError`` naming the class
        (``"DeviceMemoryResource has been closed"``); ``deallocate`` and the buffers already made
        keep working. The pool goes with the last of this object and its buffers
        (an owned pool outlives its allocations). Idempotent.
        """
    @property
    def is_closed(self) -> bool:
        """Whether :meth:`close` was called."""

class DeviceMemoryResource(_MemPool):
    """Device memory from a stream-ordered pool: the device's current pool, or with options a pool
    of its own. Buffers it allocates are freed with ``cuMemFreeAsync`` on their recipe, without
    Python.

    ``DeviceMemoryResource(device_id, options=None)``: ``device_id`` an int or a
    :class:`Device`; ``options`` a :class:`DeviceMemoryResourceOptions` (or a dict of its
    fields) for a pool of its own. ``TypeError`` for ``None`` or a non-int device,
    ``ValueError`` for a negative ordinal, :class:`CUDAError` for a device the driver does not
    have or a pool it refuses.

    ``pickle`` (a ``copyreg`` reducer for the exact type) sends the pool of an IPC-enabled
    resource: exported as a file descriptor and handed to the receiving process by
    ``multiprocessing``'s resource sharer (the sending process must be alive; each pickle is
    read at most once). A process opens a given pool once and gets its own object back.
    ``RuntimeError`` for a closed or non-IPC resource.
    """

    def __init__(self, device_id: Union[int, "Device"], options: Optional["DeviceMemoryResourceOptions"] = None) -> None:
        ...
    @classmethod
    def from_allocation_handle(cls, device_id: Union[int, "Device"], allocation_handle: Union[int, "IPCAllocationHandle"]) -> "DeviceMemoryResource":
        """Opens a device pool another process exported (``allocation_handle``: its
        :class:`IPCAllocationHandle`, or a file descriptor as an int or an object with
        ``fileno()`` or ``handle``; it stays the caller's to close); the resource only imports
        buffers (``Buffer.from_ipc_descriptor``). A pool this process has already opened (or
        made) gives that resource back (``TypeError`` when it is a ``PinnedMemoryResource``'s);
        a pinned pool's handle opens a ``PinnedMemoryResource``. ``TypeError`` for anything else;
        :class:`CUDAError` when the driver refuses the descriptor.
        """
    @property
    def peer_accessible_by(self) -> "MutableSet[Device]":
        """The devices other than the pool's own whose kernels and copies may use its memory: a
        live set of :class:`Device` objects, read from the driver on each use
        (``cuMemPoolGetAccess``); ``in``, ``add`` and ``discard`` take a :class:`Device` or an
        ordinal (the pool's own device is ignored). Assigning an iterable of them grants
        read-write access to those and revokes it from the rest, in one ``cuMemPoolSetAccess``
        call that affects every allocation of the pool. ``ValueError`` for an ordinal out of
        range, ``TypeError`` for anything else (before any change); :class:`CUDAError` when the
        driver refuses (a device that cannot reach this one's memory).
        """
    @peer_accessible_by.setter
    def peer_accessible_by(self, devices: "Iterable[Union[Device, int]]") -> None: ...

class PinnedMemoryResource(_MemPool):
    """Pinned host memory from a stream-ordered, host-located pool of its own. Buffers it allocates
    are freed with ``cuMemFreeAsync`` on their recipe, without Python.

    ``PinnedMemoryResource(options=None)``: ``options`` a :class:`PinnedMemoryResourceOptions`
    (or a dict of its fields). :class:`CUDAError` when the driver refuses the pool.

    ``pickle`` (a ``copyreg`` reducer for the exact type) sends the pool of an IPC-enabled
    resource: exported as a file descriptor and handed to the receiving process by
    ``multiprocessing``'s resource sharer (the sending process must be alive; each pickle is
    read at most once). A process opens a given pool once and gets its own object back.
    ``RuntimeError`` for a closed or non-IPC resource.
    """

    def __init__(self, options: Optional["PinnedMemoryResourceOptions"] = None) -> None:
        ...
    @classmethod
    def from_allocation_handle(cls, allocation_handle: Union[int, "IPCAllocationHandle"]) -> "PinnedMemoryResource":
        """Opens a pinned pool another process exported (``allocation_handle``: its
        :class:`IPCAllocationHandle`, or a file descriptor as an int or an object with
        ``fileno()`` or ``handle``; it stays the caller's to close); the resource only imports
        buffers (``Buffer.from_ipc_descriptor``). A pool this process has already opened (or
        made) gives that resource back (``TypeError`` when it is a ``DeviceMemoryResource``'s);
        a device pool's handle opens a ``DeviceMemoryResource`` of its device. ``TypeError`` for
        anything else; :class:`CUDAError` when the driver refuses the descriptor.
        """
    @property
    def numa_id(self) -> int:
        """The host NUMA node the pool's memory lives on, or -1 when the operating system places
        it (no ``numa_id`` given and IPC disabled).
        """

class LegacyPinnedMemoryResource(MemoryResource):
    """Pinned host memory from ``cuMemAllocHost``; ``LegacyPinnedMemoryResource()`` makes no driver
    call. ``allocate``'s ``stream`` may be omitted (the free is then ordered on the default
    stream). A drop never waits: the free runs on the cleanup worker after the recorded stream's
    work.
    """

    def __init__(self) -> None:
        ...

class LegacyManagedMemoryResource(MemoryResource):
    """Managed memory from ``cuMemAllocManaged`` (attached globally; any CUDA 12 driver), in the
    context of ``allocate``'s stream; ``allocate`` returns :class:`ManagedBuffer`. The pointers
    carry ``CU_POINTER_ATTRIBUTE_IS_MANAGED``. Dropping a buffer never waits: the free
    (``cuMemFree``) runs on the cleanup worker after the recorded stream's work; an explicit
    ``close`` or ``deallocate`` waits for the stream first. ``LegacyManagedMemoryResource()``
    makes no driver call. Not in cuda.core, whose managed resource is
    :class:`ManagedMemoryResource` (a managed pool, CUDA 13).
    """

    def __init__(self) -> None:
        ...

class ManagedMemoryResource(_MemPool):
    """Managed memory from a stream-ordered managed memory pool (``CU_MEM_ALLOCATION_TYPE_MANAGED``,
    a CUDA 13 driver): accessible from the host and every device, migrated by the driver;
    ``allocate`` returns :class:`ManagedBuffer`, freed with ``cuMemFreeAsync`` on its recipe.

    ``ManagedMemoryResource(options=None)``: with no options, the driver's current managed pool
    of no preferred location (borrowed: ``is_handle_owned`` is False); with
    :class:`ManagedMemoryResourceOptions` (or a dict of its fields), a pool of its own preferring
    their location. ``ValueError`` for an invalid location, ``RuntimeError`` when ``host_numa``
    must be derived and the current device reports no host NUMA node, ``RuntimeError("...
    requires CUDA 13.0 or later")`` on an older driver, :class:`CUDAError` when the driver
    refuses the pool. The pool cannot be shared with other processes (``is_ipc_enabled`` is
    False).
    """

    def __init__(self, options: Union["ManagedMemoryResourceOptions", dict, None] = None) -> None:
        ...
    @property
    def preferred_location(self) -> Optional[Tuple["ManagedMemoryLocationType", Optional[int]]]:
        """The preferred location: ``None`` when the driver decides, else ``(type, id)`` with
        ``type`` a :class:`ManagedMemoryLocationType`: ``("device", ordinal)``,
        ``("host", None)`` or ``("host_numa", node)``.
        """

class SynchronousMemoryResource(MemoryResource):
    """Device memory from ``cuMemAlloc`` in the device's primary context: no context need be
    current; a default stream is replaced by the legacy stream bound to that context, and
    ``allocate``'s ``stream`` may be omitted. ``SynchronousMemoryResource(device_id)`` retains
    the device's primary context: ``TypeError`` or ``ValueError`` for a bad ordinal,
    :class:`CUDAError` for a device the driver does not have.
    """

    def __init__(self, device_id: Union[int, "Device"]) -> None:
        ...

class GraphMemoryResource(MemoryResource):
    """Graph memory: allocations on a stream that is being captured."""

    def __new__(cls, device_id: Union[int, "Device"]) -> "GraphMemoryResource":
        ...
    @property
    def attributes(self) -> "GraphMemoryResourceAttributes":
        """The device's graph memory use (:class:`GraphMemoryResourceAttributes`,
        ``cuDeviceGetGraphMemAttribute``).
        """
    def trim(self) -> None:
        """Returns the graph memory the device keeps cached, and no graph uses, to the OS
        (``cuDeviceGraphMemTrim``). :class:`CUDAError` on a driver failure.
        """
    def close(self) -> None:
        """Does nothing: graph memory belongs to the graphs."""

class CachingMemoryResource(MemoryResource):
    """An opt-in cache over a built-in memory resource (``upstream``: a
    :class:`DeviceMemoryResource`, :class:`PinnedMemoryResource`,
    :class:`SynchronousMemoryResource`, ... or a Python subclass of one, whose built-in
    allocation it uses), as PyTorch's and CuPy's caching allocators keep memory, on every stream
    it is given. A buffer closed or dropped goes back to a bin of the stream its free is ordered
    on (its deallocation stream: the allocation's, or the one ``set_deallocation_stream`` named
    last), and the next ``allocate`` of its size class on that same stream gets the memory again
    without a driver call; work enqueued there after the free is ordered after every earlier use
    by stream order. That holds for a stream custody created, a default stream, and a stream
    wrapped from another library (``Stream.from_handle(int)``, a ``__cuda_stream__`` object):
    custody cannot keep a stream wrapped from a bare ``int`` alive, so the close records an event
    on it (``cuEventRecord``, its one driver call) and the cache never names that stream again,
    which may then be destroyed and its handle given to a new stream safely. A stream with no
    block of the size cached takes one freed on another stream after waiting for an event
    recorded there (``cuStreamWaitEvent``: no host wait), when that stream keeps another one of
    the size, or from any stream when the upstream is out of memory (before the cache is
    flushed). Streams declared with ``Buffer.record_use`` are waited for before the memory goes
    back to a bin. Sizes are rounded up to 512 bytes, then to one of four classes per doubling
    (at most 25% more); ``Buffer.size`` is the size asked for. What the cache cannot cache it says
    once, as a :class:`CUDAWarning`, and leaves to the upstream resource: allocations on a stream
    being captured (the upstream allocates, and a pool refuses), blocks freed on a wrapped stream
    where no event could be recorded (freed at once), and upstream buffers that cannot be lent. A
    cached block keeps a created stream (or a ``__cuda_stream__`` object) alive until
    :meth:`trim` or :meth:`close` frees it. Its buffers cannot be exported to another process
    (``ipc_descriptor`` raises ``RuntimeError``), even over an IPC-enabled pool.

    ``CachingMemoryResource(upstream)``. ``TypeError`` for anything but a built-in memory
    resource (a ``MemoryResource`` subclass that allocates in Python, or a
    :class:`GraphMemoryResource`, whose memory belongs to its graph). The upstream resource's
    own statistics count cached memory as allocated, which it is; :attr:`stats` tells cached
    from lent out.

    With the environment variable ``CUSTODY_CACHING_PASS_THROUGH`` set (to anything but empty or
    ``0``) when the process first allocates through a cache, every cache of the process passes
    each allocation and each free through to its upstream resource and caches nothing, as if it
    were not there: for tools that follow the driver's allocations, such as compute-sanitizer's
    leak and stream-ordered race checks, which cannot see memory kept in a bin.
    """

    def __init__(self, upstream: MemoryResource) -> None:
        ...
    def allocate(self, size: int, *, stream: StreamLike) -> Buffer:
        """Allocates ``size`` bytes ordered on ``stream`` (keyword-only), which also orders the
        eventual free: a cached block of its size class last freed on ``stream`` when there is
        one (no driver call, the GIL kept), else another stream's after ``stream`` waited for its
        event, else a new block from the upstream resource (the GIL released for both). Zero bytes
        give an empty buffer (address 0, no driver call). ``RuntimeError`` for one byte or more once
        :meth:`close` was called; otherwise as ``MemoryResource.allocate`` (``OverflowError``,
        ``TypeError``, :class:`CUDAError` for the upstream's failure, after one retry with the cache
        flushed when it was out of memory, and ``RuntimeError`` at exit).
        """
    @property
    def upstream(self) -> MemoryResource:
        """The resource the cache allocates from and frees through."""
    @property
    def stats(self) -> "dict[str, int]":
        """The cache's counters, as a new ``dict`` of ints: ``in_use_blocks`` and ``in_use_bytes``
        (blocks lent out, by block size: the requests rounded up to their class),
        ``cached_blocks`` and ``cached_bytes`` (blocks waiting in a bin), ``hits`` (allocations
        served from a bin), of which ``cross_stream_hits`` were on another stream than the block's
        last free (each after an event wait), ``misses`` (allocations that took a new block from the
        upstream), ``events_recorded`` (one per free on a stream wrapped from a bare ``int``, and per
        cross-stream hit of a block that had none), ``freed_blocks`` (blocks freed through the
        upstream: trims, closes, blocks given back after the close) and ``out_of_memory_retries``.
        ``in_use_bytes + cached_bytes`` is what the upstream holds for the cache.
        """
    def trim(self) -> "dict[str, int]":
        """Frees the cached blocks now through the upstream resource (for a pool
        ``cuMemFreeAsync``, which does not block; for the synchronous resources after the block's
        stream has drained), the GIL released, and returns what it did, a ``dict`` of ints:
        ``freed_blocks`` and ``freed_bytes``; ``kept_blocks`` and ``kept_bytes``, blocks left in their
        bins because their stream is being captured (a free there would join the capture; a later
        trim frees them); ``in_use_blocks`` and ``in_use_bytes``, buffers lent out, which it does not
        touch. A block last freed on a stream wrapped from a bare ``int`` is freed on a stream of the
        cache's own after that free's event (the wrapped stream may be gone). :class:`CUDAError` for
        the first free that fails (the others are still freed, their failures reported as
        :class:`CUDAWarning`); only blocks on capturing streams stay in the bins either way.
        """
    def close(self) -> None:
        """Closes the resource: it allocates nothing more (``RuntimeError``), its cached blocks are
        freed as :meth:`trim` frees them, and every buffer still out frees its memory through the
        upstream when it is closed or dropped. Idempotent. :class:`CUDAError` as :meth:`trim`.
        """
    @property
    def is_closed(self) -> bool:
        """Whether :meth:`close` was called."""

class GraphBuilder:
    """Records work into a CUDA graph by capturing a stream (``Device.create_graph_builder()``,
    ``Stream.create_graph_builder()``).

    Pass it as the ``stream`` of ``Buffer.fill``, ``Buffer.copy_to`` / ``copy_from`` (the graph
    then keeps those buffers' memory alive, even after they are closed, until the graph and
    every executable made from it are gone; the free then runs with the buffer's recipe, on the
    cleanup worker or in ``drain_deferred_cleanup()``), of ``GraphMemoryResource.allocate``, and
    of ``Buffer.set_deallocation_stream`` (the captured stream). Work issued on ``stream``
    directly, such as a kernel that CuPy, PyTorch or Numba launches there, is captured but keeps
    nothing alive: :meth:`retain` the buffers it uses. Cannot be instantiated directly.
    """

    def begin_building(self, mode: str = "relaxed") -> "GraphBuilder":
        """Starts capturing (``"global"``, ``"thread_local"`` or ``"relaxed"``); returns self.
        ``ValueError`` for another mode; ``RuntimeError`` when already building ("Graph builder
        is already building"). A builder may capture again after ``end_building()`` (cuda.core
        refuses); the next ``end_building()`` replaces the recorded graph."""
    def end_building(self) -> "GraphBuilder":
        """Ends capturing and keeps the recorded graph; returns self. ``RuntimeError`` for a closed
        builder or one that is not building; :class:`CUDAError` when the driver ends the capture
        with an error (an invalidated capture: it recorded no graph, and ``complete()`` then
        says so until ``begin_building()`` starts again).
        """
    def complete(self, options: Optional[GraphCompleteOptions] = None) -> "Graph":
        """Instantiates the recorded graph (``RuntimeError("Graph has not finished building.")``
        before ``end_building()``; ``RuntimeError`` saying the capture was invalidated after an
        ``end_building()`` that found it so); ``options`` as :class:`GraphCompleteOptions` says.
        """
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
    def is_closed(self) -> bool:
        """Whether ``close()`` was called (then every method raises ``RuntimeError("Graph
        builder has been closed.")``)."""
    @property
    def stream(self) -> Stream:
        """The stream being captured."""
    def __cuda_stream__(self) -> Tuple[int, int]:
        """``(0, handle)`` of the captured stream (``RuntimeError`` once closed)."""
    def close(self) -> None:
        """Ends a capture still running, discarding what it recorded, and releases the builder and
        its recorded graph (the graph's memory is released once every executable made from it is
        gone). Idempotent. A capture that was invalidated has ended all the same: not an error
        here. :class:`CUDAError` when the driver refuses to end the capture (ending a
        ``"thread_local"`` or ``"global"`` capture on another thread, say): the builder then
        stays open and building, so that ``close()`` can be called again, from the thread that
        may end it. A builder dropped while building ends its capture the same way and reports
        such a failure as a :class:`CUDAWarning`, as other objects' drops do. Driver calls:
        ``cuStreamEndCapture`` (and ``cuStreamIsCapturing`` after a failure), ``cuGraphDestroy``.
        """

class Graph:
    """An executable graph (``GraphBuilder.complete()``)."""

    def upload(self, stream: StreamLike) -> None:
        """Uploads the graph to the device on ``stream`` so that the next launch need not
        (``cuGraphUpload``). Does not block. ``RuntimeError`` for a closed graph or stream;
        ``TypeError`` for a missing, ``None`` or non-stream ``stream``; ``ValueError`` for a
        stream of another device than the graph's; :class:`CUDAError` on a driver failure.
        """
    def launch(self, stream: StreamLike) -> None:
        """Launches the graph on ``stream``. Does not block. ``RuntimeError`` for a closed graph or
        stream, or a graph that ran once and allocates memory it does not free itself (its
        graph allocations not closed while building: another launch would allocate them again
        with nothing to free them); ``TypeError`` for a missing, ``None`` or non-stream
        ``stream``; ``ValueError`` for a stream of another device than the graph's (before any
        driver call); :class:`CUDAError` on a driver failure.
        """
    @property
    def handle(self) -> int:
        """The raw ``CUgraphExec`` as an int; 0 once closed."""
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
        """Releases the executable; what it retains is freed once the launches in flight are done, by
        the cleanup worker or in ``drain_deferred_cleanup()``. Idempotent.
        """
    @property
    def is_closed(self) -> bool:
        """Whether ``close()`` was called."""

class IPCEventDescriptor:
    """What another process needs to open an IPC-enabled event: the driver's 64-byte
    ``CUipcEventHandle`` and whether the event blocks on ``sync()``. Compared by the handle
    bytes; picklable. Cannot be instantiated directly (``RuntimeError``)."""

    @staticmethod
    def _init(reserved: bytes, is_blocking_sync: bool) -> "IPCEventDescriptor":
        """A descriptor from its parts, as unpickling makes it."""
    @property
    def is_blocking_sync(self) -> bool:
        """Whether the event blocks (yields) on ``sync()``."""

class GraphMemoryResourceAttributes:
    """A device's graph memory use in bytes, read when asked; the high water marks can be reset
    to 0 (``AttributeError`` for another value, or for setting the current values). Cannot be
    instantiated directly (``RuntimeError``)."""

    @property
    def reserved_mem_current(self) -> int:
        """Bytes of graph memory the device holds from the driver."""
    @property
    def reserved_mem_high(self) -> int:
        """The high water mark of ``reserved_mem_current``; settable to 0."""
    @reserved_mem_high.setter
    def reserved_mem_high(self, value: int) -> None: ...
    @property
    def used_mem_current(self) -> int:
        """Bytes of graph memory in use by graphs."""
    @property
    def used_mem_high(self) -> int:
        """The high water mark of ``used_mem_current``; settable to 0."""
    @used_mem_high.setter
    def used_mem_high(self, value: int) -> None: ...

