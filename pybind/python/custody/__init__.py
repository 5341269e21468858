"""custody: CUDA memory whose lifetime is owned correctly, with NVIDIA cuda.core 1.2's names.

Code written for ``cuda.core``'s buffers, streams and memory resources runs by changing the
import. Every buffer records, when it is made, the stream and the context its free needs (its
*deallocation recipe*), so it is freed correctly wherever its last reference goes: on another
thread, in the cyclic garbage collector, or in deferred cleanup after a CUDA graph let go of it.

Driver failures raise :class:`CUDAError` (a ``RuntimeError``); a free that fails where nobody
can receive the error (a drop, the garbage collector, another thread) is reported as a
:class:`CUDAWarning` (a ``RuntimeWarning``).

The driver is ``libcuda.so.1``, or the library named by the environment variable
``CUSTODY_CUDA_DRIVER``: custody's emulated driver, ``libcuda_emu.so``, runs programs without a
GPU (``cargo build -p cuda-custody-emu`` in custody's source repository builds it). When no
driver loads, the first CUDA call raises a :class:`CUDAError` that says what was tried.
"""

from __future__ import annotations

import functools as _functools
import threading
import uuid as _uuid
from collections.abc import MutableSet as _MutableSet
from dataclasses import dataclass
from enum import IntEnum, StrEnum
from typing import TYPE_CHECKING, Any, Callable, NamedTuple, Optional, TypeVar, cast

from custody._custody import GraphMemoryResource as _GraphMemoryResource
from custody._custody import (
    LEGACY_DEFAULT_STREAM,
    PER_THREAD_DEFAULT_STREAM,
    Buffer,
    CachingMemoryResource,
    Context,
    CUDAError,
    CUDAWarning,
    DeviceMemoryResource,
    Event,
    Graph,
    GraphBuilder,
    GraphMemoryResourceAttributes,
    IPCBufferDescriptor,
    IPCEventDescriptor,
    LegacyManagedMemoryResource,
    LegacyPinnedMemoryResource,
    ManagedBuffer,
    ManagedMemoryResource,
    MemoryPoolAttributes,
    MemoryResource,
    PinnedMemoryResource,
    Stream,
    SynchronousMemoryResource,
    default_stream,
    discard_batch,
    discard_prefetch_batch,
    drain_deferred_cleanup,
    prefetch_batch,
)
from custody import _custody
from custody._properties import DeviceProperties

if TYPE_CHECKING:
    from custody._custody import StreamLike, _CudaStreamLike

__all__ = [
    "LEGACY_DEFAULT_STREAM",
    "PER_THREAD_DEFAULT_STREAM",
    "Buffer",
    "CachingMemoryResource",
    "CUDAError",
    "CUDAWarning",
    "Context",
    "ComputeCapability",
    "DLDeviceType",
    "Device",
    "DeviceMemoryResource",
    "DeviceMemoryResourceOptions",
    "DeviceProperties",
    "Event",
    "EventOptions",
    "Graph",
    "GraphBuilder",
    "GraphCompleteOptions",
    "GraphMemoryResource",
    "GraphMemoryResourceAttributes",
    "Host",
    "IPCAllocationHandle",
    "IPCBufferDescriptor",
    "IPCEventDescriptor",
    "LegacyManagedMemoryResource",
    "LegacyPinnedMemoryResource",
    "ManagedBuffer",
    "ManagedMemoryResource",
    "ManagedMemoryLocationType",
    "ManagedMemoryResourceOptions",
    "MemoryPoolAttributes",
    "MemoryResource",
    "PinnedMemoryResource",
    "PinnedMemoryResourceOptions",
    "Stream",
    "StreamOptions",
    "SynchronousMemoryResource",
    "default_stream",
    "discard_batch",
    "discard_prefetch_batch",
    "drain_deferred_cleanup",
    "prefetch_batch",
    "system",
]

__version__ = "0.1.0"


@dataclass
class DeviceMemoryResourceOptions:
    """Options for a :class:`DeviceMemoryResource` with a pool of its own. ``ipc_enabled``: other
    processes can open the pool (through a POSIX file descriptor); ``max_size``: the pool's
    largest size in bytes, 0 for no limit.
    A dict of these fields works in its place; an unknown key, or any other type, is a
    ``TypeError`` (as cuda.core 1.2 builds the dataclass).
    """

    ipc_enabled: bool = False
    max_size: int = 0


@dataclass
class PinnedMemoryResourceOptions:
    """Options for a :class:`PinnedMemoryResource`. ``ipc_enabled``: other processes can open the
    pool; ``max_size``: the pool's largest size in bytes, 0 for no limit; ``numa_id``: the host
    NUMA node of the memory (``ValueError`` if negative); ``None`` lets the operating system place
    it, or with ``ipc_enabled`` (a shared pool names its node) takes the current device's
    ``host_numa_id`` (``RuntimeError`` when the driver reports none).
    A dict of these fields works in its place; an unknown key, or any other type, is a
    ``TypeError`` (as cuda.core 1.2 builds the dataclass).
    """

    ipc_enabled: bool = False
    max_size: int = 0
    numa_id: Optional[int] = None


class ManagedMemoryLocationType(StrEnum):
    """Where managed memory prefers to live (a ``str``): ``DEVICE`` (``"device"``) a GPU,
    ``HOST`` (``"host"``) the host, placed by the operating system, ``HOST_NUMA``
    (``"host_numa"``) a given host NUMA node.
    """

    DEVICE = "device"
    HOST = "host"
    HOST_NUMA = "host_numa"


@dataclass
class ManagedMemoryResourceOptions:
    """Options for a :class:`ManagedMemoryResource`'s own pool: its preferred location.
    ``preferred_location_type`` ``None``: ``preferred_location`` is a device ordinal, -1 for the
    host, or ``None`` for no preference. ``"device"``: ``preferred_location`` a device ordinal
    (>= 0); ``"host"``: ``preferred_location`` must be ``None``; ``"host_numa"``: a NUMA node
    (>= 0), or ``None`` for the current device's ``host_numa_id``. A
    :class:`ManagedMemoryLocationType` or its string.
    A dict of these fields works in its place; an unknown key, or any other type, is a
    ``TypeError`` (as cuda.core 1.2 builds the dataclass).
    """

    preferred_location: Optional[int] = None
    preferred_location_type: "Optional[ManagedMemoryLocationType | str]" = None


@dataclass
class StreamOptions:
    """Options for :meth:`Device.create_stream`. ``nonblocking`` (default True): the stream does
    not synchronise with the legacy default stream; ``priority``: lower numbers run first,
    ``None`` is 0, ``ValueError`` outside the device's range.
    A dict of these fields works in its place; an unknown key, or any other type, is a
    ``TypeError`` (as cuda.core 1.2 builds the dataclass).
    """

    nonblocking: bool = True
    priority: Optional[int] = None


@dataclass
class EventOptions:
    """Options for :meth:`Stream.record` and :meth:`Device.create_event` (cuda.core 1.2's names).
    ``timing_enabled``: the event records a timestamp (for ``end - start``); ``blocking_sync``:
    ``sync()`` yields the CPU instead of spinning; ``ipc_enabled``: shareable with other
    processes (``TypeError`` together with ``timing_enabled``).
    A dict of these fields works in its place; an unknown key, or any other type, is a
    ``TypeError`` (as cuda.core 1.2 builds the dataclass).
    """

    timing_enabled: Optional[bool] = False
    blocking_sync: Optional[bool] = False
    ipc_enabled: Optional[bool] = False


@dataclass
class GraphCompleteOptions:
    """Options for :meth:`GraphBuilder.complete`, with cuda.core's names. ``upload_stream``: upload
    the graph there at once. ``auto_free_on_launch``, ``device_launch`` and
    ``use_node_priority`` exist for cuda.core's interface and are not supported
    (``NotImplementedError`` when set).
    A dict of these fields works in its place; an unknown key, or any other type, is a
    ``TypeError`` (as cuda.core 1.2 builds the dataclass).
    """

    auto_free_on_launch: bool = False
    upload_stream: Optional[Stream] = None
    device_launch: bool = False
    use_node_priority: bool = False


class GraphMemoryResource(_GraphMemoryResource):
    """Graph memory of one device: ``allocate`` works only on a stream that is being captured
    (``RuntimeError`` otherwise), and the allocation becomes part of the graph; zero bytes give
    an empty buffer. ``GraphMemoryResource(n)`` is the same object every time for a given device
    (``ValueError`` for an ordinal out of range). A buffer allocated with ``stream=builder`` and
    closed while building is a free node of the graph (after its ``record_use`` streams of the
    same capture); closed while its stream is captured into another graph, that graph keeps it
    (freed once that graph is gone). Closed (or collected) after ``end_building()`` but before
    the graph's first launch, when its memory does not exist yet, it closes without error: its
    ``cuMemFreeAsync`` is issued by that first launch (``Graph.launch``), on the builder's
    stream, ordered after the launch. A graph that does not free an allocation itself is
    launched once (``RuntimeError`` after). An allocation of a capture that recorded no graph
    (the builder closed while building, an invalidated capture) frees nothing when closed.
    """

    _instances: "dict[int, GraphMemoryResource]" = {}

    def __new__(cls, device_id: int | Device) -> GraphMemoryResource:
        ordinal = Device(device_id).device_id
        with Device._lock:
            mr = cls._instances.get(ordinal)
            if mr is None:
                mr = super().__new__(cls, ordinal)
                cls._instances[ordinal] = mr
            return mr


class ComputeCapability(NamedTuple):
    """A device's compute capability, ``(major, minor)`` (a named tuple;
    ``Device.compute_capability``).
    """

    major: int
    minor: int


class DLDeviceType(IntEnum):
    """DLPack's device types, as ``__dlpack_device__()[0]`` reports them (an ``IntEnum``)."""

    kDLCPU = 1
    kDLCUDA = 2
    kDLCUDAHost = 3
    kDLCUDAManaged = 13


_Method = TypeVar("_Method", bound=Callable[..., Any])


def _stream_is_keyword_only(method: _Method) -> _Method:
    """Wraps ``method`` (whose ``stream`` is keyword-only) so that a ``stream`` passed by position
    gets a ``TypeError`` saying so, as the extension's methods do; ``inspect.signature`` (and a
    type checker) still shows ``method``'s own."""
    takes = method.__code__.co_argcount - 1  # not counting self
    names = method.__code__.co_varnames[1 : takes + 1]
    call = f"{method.__name__}({', '.join(names)}, stream=s)"
    plural = "" if takes == 1 else "s"

    @_functools.wraps(method)
    def checked(self, *args, **kwargs):
        if len(args) > takes:
            were = "was" if len(args) == 1 else "were"
            raise TypeError(
                f"{type(self).__name__}.{method.__name__}() takes {takes} positional "
                f"argument{plural} but {len(args)} {were} given: stream is keyword-only ({call})"
            )
        return method(self, *args, **kwargs)

    return cast(_Method, checked)


class _System:
    """Process-wide facts, from the CUDA driver (not NVML)."""

    @property
    def num_devices(self) -> int:
        """How many devices the driver sees (``cuDeviceGetCount``)."""
        return _custody._device_count()

    def get_num_devices(self) -> int:
        """How many devices the driver sees (``cuDeviceGetCount``)."""
        return _custody._device_count()


system = _System()


class Device:
    """A CUDA device; ``Device(n)`` is the same object every time (so equality and hashing are
    by identity). ``Device()`` is the device of the current context, or device 0. ``TypeError``
    for a non-int, ``ValueError`` for an ordinal out of range.
    """

    _instances: "dict[int, Device]" = {}
    _lock = threading.Lock()

    def __new__(cls, device_id: "Optional[int]" = None) -> "Device":
        if device_id is None:
            current = _custody._current_context()
            device_id = current.device_id if current is not None else 0
        elif isinstance(device_id, Device):
            return device_id
        if isinstance(device_id, bool) or not isinstance(device_id, int):
            try:
                device_id = device_id.__index__()
            except AttributeError:
                raise TypeError(
                    f"device_id must be an int, got {type(device_id).__name__}"
                ) from None
        count = _custody._device_count()
        if not 0 <= device_id < count:
            raise ValueError(f"device_id must be within [0, {count}), got {device_id}")
        with cls._lock:
            device = cls._instances.get(device_id)
            if device is None:
                device = super().__new__(cls)
                device._id = device_id
                device._context = None
                device._mr = None
                device._properties = None
                cls._instances[device_id] = device
            return device

    @classmethod
    def get_all_devices(cls) -> "tuple[Device, ...]":
        """Every device the driver sees, in ordinal order."""
        return tuple(cls(i) for i in range(_custody._device_count()))

    @property
    def device_id(self) -> int:
        """The device ordinal."""
        return self._id

    @property
    def properties(self) -> "DeviceProperties":
        """The device's attributes (``cuDeviceGetAttribute``), each read on first use."""
        if self._properties is None:
            self._properties = DeviceProperties._init(self._id)
        return self._properties

    @property
    def name(self) -> str:
        """The device's name (``cuDeviceGetName``)."""
        return _custody._device_name(self._id)

    @property
    def uuid(self) -> str:
        """The device's UUID as ``"xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx"`` (``cuDeviceGetUuid``)."""
        return str(_uuid.UUID(bytes=bytes(_custody._device_uuid(self._id))))

    @property
    def pci_bus_id(self) -> str:
        """The device's PCI address, ``"domain:bus:device.function"`` in hexadecimal (as
        ``cuDeviceGetPCIBusId`` writes it; :class:`CUDAError` on a driver failure)."""
        return _custody._device_pci_bus_id(self._id)

    @property
    def compute_capability(self) -> ComputeCapability:
        """``(major, minor)``, e.g. ``ComputeCapability(major=9, minor=0)`` for an H200."""
        props = self.properties
        return ComputeCapability(props.compute_capability_major, props.compute_capability_minor)

    @property
    def arch(self) -> str:
        """The compute capability as the digits of an ``sm_`` name: ``"90"`` for 9.0."""
        major, minor = self.compute_capability
        return f"{major}{minor}"

    def can_access_peer(self, peer: "Device | int") -> bool:
        """Whether this device can access ``peer``'s memory (``cuDeviceCanAccessPeer``); a device can
        always access its own.
        """
        peer = Device(peer)
        if peer is self:
            return True
        return _custody._can_access_peer(self._id, peer._id)

    @property
    def context(self) -> Context:
        """The device's primary context (retained while this object lives)."""
        if self._context is None:
            with Device._lock:
                if self._context is None:
                    self._context = _custody._primary_context(self._id)
        return self._context

    def set_current(self, ctx: "Optional[Context]" = None) -> None:
        """Makes the device's primary context (or ``ctx``) current on the calling thread, replacing the
        top of its context stack (``cuCtxSetCurrent``). ``TypeError`` for a ``ctx`` that is not a
        :class:`Context`; :class:`CUDAError` on a driver failure.
        """
        if ctx is not None:
            if not isinstance(ctx, Context):
                raise TypeError(f"Context expected, got {type(ctx).__name__}")
            _custody._set_current(ctx)
            return
        _custody._set_current(self.context)

    @property
    def memory_resource(self) -> MemoryResource:
        """The resource :meth:`allocate` uses (default: a :class:`DeviceMemoryResource` over the
        device's current pool); settable to any :class:`MemoryResource` (``TypeError`` otherwise).
        """
        if self._mr is None:
            with Device._lock:
                if self._mr is None:
                    self._mr = DeviceMemoryResource(self._id)
        return self._mr

    @memory_resource.setter
    def memory_resource(self, mr: MemoryResource) -> None:
        if not isinstance(mr, MemoryResource):
            raise TypeError(f"MemoryResource expected, got {type(mr).__name__}")
        self._mr = mr

    @property
    def default_stream(self) -> Stream:
        """:func:`default_stream`."""
        return default_stream()

    def create_stream(
        self, obj: Optional[_CudaStreamLike] = None, options: "Optional[StreamOptions]" = None
    ) -> Stream:
        """A new stream in the primary context made with ``options`` (a :class:`StreamOptions` or a
        dict; non-blocking, priority 0 by default), or a wrapper of ``obj`` (an object with
        ``__cuda_stream__``; ``TypeError`` otherwise). ``ValueError`` for a priority outside the
        device's range; :class:`CUDAError` on a driver failure.
        """
        if obj is not None:
            if not hasattr(obj, "__cuda_stream__"):
                raise TypeError(
                    f"an object with __cuda_stream__ expected, got {type(obj).__name__}"
                )
            return Stream._init(obj=obj)
        return Stream._init(options=options, ctx=self.context)

    def create_event(self, options: "Optional[EventOptions]" = None) -> Event:
        """A new event in the primary context, not recorded, made with ``options`` (an
        :class:`EventOptions` or a dict). ``TypeError`` for ``ipc_enabled``: an IPC event is made
        by recording it (:meth:`Stream.record`).
        """
        return _custody._create_event(self.context, options)

    def create_graph_builder(self) -> GraphBuilder:
        """A :class:`GraphBuilder` capturing a new stream in the device's primary context."""
        return _custody._create_graph_builder(self.context)

    @_stream_is_keyword_only
    def allocate(self, size: int, *, stream: StreamLike) -> Buffer:
        """``self.memory_resource.allocate(size, stream=stream)``: ``size`` bytes, ordered on
        ``stream`` (keyword-only), raising what that resource's ``allocate`` raises.
        """
        return self.memory_resource.allocate(size, stream=stream)

    def sync(self) -> None:
        """Blocks the calling thread (the GIL released) until all work in the device's primary context
        has finished (``cuCtxSynchronize``).
        """
        _custody._synchronize_context(self.context)

    def __int__(self) -> int:
        """The device ordinal."""
        return self._id

    def __index__(self) -> int:
        """The device ordinal."""
        return self._id

    def __repr__(self) -> str:
        try:
            name = self.name
        except Exception:  # noqa: BLE001 - a repr never raises
            name = "?"
        return f"<Device {self._id} ({name})>"

    def __reduce__(self):
        return (Device, (self._id,))


# --- Names of cuda.core 1.2 that custody does not provide ---

_NOT_PROVIDED = {
    **dict.fromkeys(
        ("Program", "ProgramOptions", "Linker", "LinkerOptions", "ObjectCode", "Kernel",
         "LaunchConfig", "launch"),
        "kernels (Program, Linker, launch) are outside custody's scope; use cuda.core for them",
    ),
    **dict.fromkeys(
        ("VirtualMemoryResource", "VirtualMemoryResourceOptions"),
        "virtual memory management is outside custody's scope",
    ),
    **dict.fromkeys(
        ("ContextOptions", "DeviceResources", "SMResource", "SMResourceOptions",
         "WorkqueueResource", "WorkqueueResourceOptions"),
        "green contexts and device resources are outside custody's scope",
    ),
    **dict.fromkeys(
        ("GraphicsResource", "TensorMapDescriptor", "TensorMapDescriptorOptions"),
        "graphics interop and tensor maps are outside custody's scope",
    ),
}


# --- Managed-memory locations ---
#
# ``ManagedBuffer``'s placement methods and the batch functions take a ``Device`` or a ``Host``;
# the extension asks ``_coerce_location`` for the ``(kind, id)`` pair the driver's location is
# made of, and ``_location_object`` for the object a location read back from the driver names.


class Host:
    """The host as a managed-memory location, beside :class:`Device` (for
    ``ManagedBuffer.prefetch``, ``discard_prefetch``, ``preferred_location``, ``accessed_by`` and
    the batch functions). ``Host()``: any NUMA node; ``Host(numa_id=n)``: NUMA node ``n``
    (``ValueError`` unless a non-negative int); ``Host.numa_current()`` (or
    ``Host(is_numa_current=True)``): the NUMA node of the calling thread (``ValueError`` with
    ``numa_id``). The same arguments give the same object, so equality and hashing are by
    identity; a ``Host`` pickles to the same object.
    """

    __slots__ = ("_numa_id", "_numa_current", "__weakref__")
    _instances: "dict[tuple, Host]" = {}
    _lock = threading.Lock()

    def __new__(cls, numa_id: "Optional[int]" = None, *, is_numa_current: bool = False) -> "Host":
        if numa_id is not None:
            if is_numa_current:
                raise ValueError("Host takes numa_id or is_numa_current=True, not both")
            if isinstance(numa_id, bool) or not isinstance(numa_id, int) or numa_id < 0:
                raise ValueError(f"numa_id must be a non-negative int, got {numa_id!r}")
        key = (numa_id, bool(is_numa_current))
        with cls._lock:
            host = cls._instances.get(key)
            if host is None:
                host = super().__new__(cls)
                host._numa_id, host._numa_current = key
                cls._instances[key] = host
        return host

    @classmethod
    def numa_current(cls) -> "Host":
        """The NUMA node of the calling thread (``CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT``)."""
        return cls(is_numa_current=True)

    @property
    def numa_id(self) -> "Optional[int]":
        """The NUMA node, or ``None`` for any node (and for :meth:`numa_current`)."""
        return self._numa_id

    @property
    def is_numa_current(self) -> bool:
        """Whether this is the calling thread's NUMA node (:meth:`numa_current`)."""
        return self._numa_current

    def __reduce__(self):
        return (_host_of, (self._numa_id, self._numa_current))

    def __repr__(self) -> str:
        if self._numa_current:
            return "Host.numa_current()"
        return "Host()" if self._numa_id is None else f"Host(numa_id={self._numa_id})"


def _host_of(numa_id, is_numa_current):
    return Host(numa_id, is_numa_current=is_numa_current)


class _Location(NamedTuple):
    """A location as the driver takes it: ``kind`` ``"device"``, ``"host"``, ``"host_numa"`` or
    ``"host_numa_current"``, and ``id`` (the device ordinal or NUMA node; 0 where none)."""

    kind: str
    id: int = 0


def _coerce_location(value, *, allow_none: bool = False) -> "Optional[_Location]":
    """The :class:`_Location` of a :class:`Device` or :class:`Host`; ``None`` for ``None`` when
    ``allow_none``, else ``ValueError``; ``TypeError`` for anything else (an int included: say
    ``Device(n)`` or ``Host()``)."""
    if isinstance(value, Device):
        return _Location("device", value.device_id)
    if isinstance(value, Host):
        if value.is_numa_current:
            return _Location("host_numa_current")
        if value.numa_id is not None:
            return _Location("host_numa", value.numa_id)
        return _Location("host")
    if value is None:
        if allow_none:
            return None
        raise ValueError("a location is required: pass a Device or a Host")
    raise TypeError(f"a location must be a Device, Host, or None; got {type(value).__name__}")


def _location_object(kind: str, id: int):
    """The :class:`Device` or :class:`Host` a location read from the driver names."""
    if kind == "device":
        return Device(id)
    if kind == "host_numa":
        return Host(id)
    if kind == "host_numa_current":
        return Host.numa_current()
    return Host()


class _LiveSet(_MutableSet):
    """A live set the driver holds, read each time: a subclass says how to list its members
    (``_members``) and to give advice for one (``_advise``). Operators give plain sets."""

    __slots__ = ("_owner",)

    def __init__(self, owner):
        self._owner = owner

    @classmethod
    def _from_iterable(cls, iterable):
        return set(iterable)

    def _members(self) -> list:
        """The members, read from the driver."""
        raise NotImplementedError

    def _advise(self, item, on: bool) -> None:
        """Gives (``on``) or takes back the advice for ``item``."""
        raise NotImplementedError

    def __contains__(self, item) -> bool:
        return item in self._members()

    def __iter__(self):
        return iter(self._members())

    def __len__(self) -> int:
        return len(self._members())

    def add(self, item) -> None:
        self._advise(item, True)

    def discard(self, item) -> None:
        if item in self:
            self._advise(item, False)

    def __repr__(self) -> str:
        return f"{type(self).__name__[1:]}({set(self)!r})"


class _AccessedBy(_LiveSet):
    """``ManagedBuffer.accessed_by``: a live set of the locations (:class:`Device`,
    ``Host()``) the buffer's accessed-by advice is set for, read from the driver each time;
    ``add`` and ``discard`` give the driver advice. Operators give plain sets."""

    __slots__ = ()

    def _members(self):
        return self._owner._accessed_by_list()

    def _advise(self, location, on: bool) -> None:
        self._owner._advise_accessed_by(location, on)


class _PeerAccessibleBy(_LiveSet):
    """``DeviceMemoryResource.peer_accessible_by``: a live set of the :class:`Device` objects,
    other than the pool's own, that may use the pool's memory, read from the driver each time;
    ``in``, ``add`` and ``discard`` take a ``Device`` or an ordinal. Operators give plain sets."""

    __slots__ = ()

    def _members(self):
        return [Device(ordinal) for ordinal in self._owner._peer_ids()]

    def __contains__(self, device) -> bool:
        ordinal = device.device_id if isinstance(device, Device) else device
        return ordinal in self._owner._peer_ids()

    def _advise(self, device, on: bool) -> None:
        self._owner._set_peer_access(device, on)


def __getattr__(name: str):
    why = _NOT_PROVIDED.get(name)
    if why is not None:
        raise AttributeError(f"custody does not provide {name}: {why}")
    raise AttributeError(f"module 'custody' has no attribute {name!r}")


# --- Sharing pools and buffers with other processes (docs/reference-notes.md section 5,
# scenario 64) ---
#
# A pool resource's ``allocation_handle`` is an ``IPCAllocationHandle``: a file descriptor of
# the exported pool, owned by the handle, and the UUID naming the pool across processes. It
# pickles the way ``multiprocessing`` sends descriptors (``multiprocessing.reduction.DupFd``):
# to a process being spawned, the descriptor is passed at spawn (the resource keeps its handle,
# so it stays open until then); otherwise through ``multiprocessing``'s resource sharer, from
# which the receiving process fetches a duplicate over a unix socket (so the sender must be
# alive, and a pickle is read at most once: an unread one leaves the sender's duplicate with
# the sharer).
#
# ``pickle.dumps(buffer)`` of a buffer from an IPC-enabled pool gives ``(mr, descriptor)``; the
# resource pickles as ``(kind, uuid, device_id, allocation_handle)``; an imported resource with
# the handle it was unpickled from (so a buffer passes on to a third process), else by its UUID
# alone. Every pool resource that was pickled, unpickled or opened with
# ``from_allocation_handle`` is kept, weakly, under its pool's UUID, so that a process opens a
# given pool once, however many buffers of it arrive, and gets the original object back when
# one of its own pools returns. Reducers are registered with ``copyreg`` for the exact types
# (``Buffer``, ``ManagedBuffer``, ``DeviceMemoryResource``, ``PinnedMemoryResource``).

import copyreg as _copyreg
import os as _os
import weakref as _weakref


class IPCAllocationHandle:
    """A memory pool's shareable handle (``mr.allocation_handle``): a POSIX file descriptor of
    the exported pool, which this object owns and closes (``close()``, or when it is collected),
    and the UUID naming the pool across processes. Pickles for ``multiprocessing`` (the
    descriptor is duplicated for the receiving process). Cannot be instantiated directly
    (``RuntimeError``)."""

    __slots__ = ("_fd", "_uuid", "_kind", "_device_id", "__weakref__")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise RuntimeError(
            "IPCAllocationHandle objects cannot be instantiated directly. Use "
            "mr.allocation_handle."
        )

    @classmethod
    def _init(
        cls, handle: int, uuid=None, kind: "Optional[str]" = None, device_id: int = -1
    ) -> "IPCAllocationHandle":
        """A handle owning the file descriptor ``handle`` (``ValueError`` when negative), of the
        pool ``uuid`` that a ``kind`` resource (of device ``device_id``) exported."""
        if isinstance(handle, bool) or not isinstance(handle, int):
            raise TypeError(
                f"an allocation handle is a file descriptor (int), got {type(handle).__name__}"
            )
        if handle < 0:
            raise ValueError(f"Invalid allocation handle (fd) {handle}: must be non-negative")
        self = object.__new__(cls)
        self._fd = handle
        self._uuid = uuid
        self._kind = kind
        self._device_id = device_id
        return self

    @property
    def handle(self) -> int:
        """The file descriptor (``RuntimeError`` once closed)."""
        if self._fd < 0:
            raise RuntimeError("IPCAllocationHandle has been closed")
        return self._fd

    def __int__(self) -> int:
        """The file descriptor."""
        return self.handle

    @property
    def uuid(self) -> "Optional[_uuid.UUID]":
        """The UUID naming the pool across processes."""
        return self._uuid

    @property
    def is_closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._fd < 0

    def close(self) -> None:
        """Closes the file descriptor. Idempotent."""
        fd, self._fd = self._fd, -1
        if fd >= 0:
            _os.close(fd)

    def __del__(self):
        if getattr(self, "_fd", -1) >= 0:
            try:
                self.close()
            except OSError:
                pass

    def __reduce__(self):
        from multiprocessing.reduction import DupFd

        return (
            _rebuild_allocation_handle,
            (DupFd(self.handle), self._uuid, self._kind, self._device_id),
        )

    def __repr__(self) -> str:
        state = "closed" if self._fd < 0 else f"fd={self._fd}"
        return f"<IPCAllocationHandle {state} uuid={self._uuid}>"


def _rebuild_allocation_handle(shared, uuid, kind, device_id):
    """Unpickles an allocation handle: the descriptor ``multiprocessing`` hands over."""
    return IPCAllocationHandle._init(shared.detach(), uuid, kind, device_id)


_pools: "_weakref.WeakValueDictionary" = _weakref.WeakValueDictionary()
_pools_lock = threading.Lock()


def _register_pool(mr) -> None:
    """Keeps ``mr`` (weakly) under its pool's UUID, unless one is kept already."""
    uuid = mr.uuid
    if uuid is None:
        return
    with _pools_lock:
        known = _pools.get(uuid)
        if known is None or known.is_closed:
            _pools[uuid] = mr


def _registered_pool(uuid, kind: str):
    """The open resource of ``kind`` this process has for the pool ``uuid``, or None
    (``TypeError`` when that pool belongs to the other kind of resource)."""
    with _pools_lock:
        mr = _pools.get(uuid)
    if mr is None or mr.is_closed:
        return None
    if type(mr).__name__ != kind:
        raise TypeError(
            f"the pool {uuid} is a {type(mr).__name__}'s; open it with "
            f"{type(mr).__name__}.from_allocation_handle, not {kind}.from_allocation_handle"
        )
    return mr


def _reduce_pool_resource(mr):
    if mr.is_closed:
        raise RuntimeError(f"{type(mr).__name__} has been closed")
    kind = type(mr).__name__
    if mr.is_mapped:
        # Imported here: it travels with the allocation handle it was opened from when this
        # process unpickled it (so a buffer can be passed on to a third process), else by UUID,
        # to a process that knows the pool already.
        return (_rebuild_pool_resource, (kind, mr.uuid, mr.device_id, _import_handles.get(mr)))
    if not mr.is_ipc_enabled:
        raise RuntimeError(
            f"a {kind} pickles only when its pool was made with ipc_enabled=True"
        )
    _register_pool(mr)
    return (_rebuild_pool_resource, (kind, mr.uuid, mr.device_id, mr.allocation_handle))


def _rebuild_pool_resource(kind, uuid, device_id, handle):
    """Unpickles a pool resource: the known object for ``uuid``, or the pool opened from the
    allocation handle that came with it."""
    # The handle closes its descriptor when it is collected; it is not closed here, since the
    # same pickle may hold it for the caller too (pickle shares one object between references).
    mr = _registered_pool(uuid, kind)
    if mr is not None:
        return mr
    if handle is None:
        raise RuntimeError(
            f"the pool of this {kind} is not known in this process "
            "(send its resource from the process that made it)"
        )
    if kind == "DeviceMemoryResource":
        mr = DeviceMemoryResource.from_allocation_handle(device_id, handle)
    else:
        mr = PinnedMemoryResource.from_allocation_handle(handle)
    # Kept while the resource lives, for pickling it on (`_reduce_pool_resource`).
    _import_handles[mr] = handle
    return mr


# The allocation handle each unpickled (imported) pool resource was opened from.
_import_handles: "_weakref.WeakKeyDictionary" = _weakref.WeakKeyDictionary()


def _rebuild_event(ipc_descriptor, device_id):
    """Unpickles an IPC-enabled event: opens it in the current context, first making
    ``Device(device_id)`` current when no context is (as a pickled buffer does)."""
    if _custody._current_context() is None:
        Device(device_id).set_current()
    return Event.from_ipc_descriptor(ipc_descriptor)


def _reduce_buffer(buffer):
    if buffer.is_closed:
        # A buffer this process imported by unpickling still names the exporter's memory after
        # its own close: it pickles as it arrived (a process that passes a buffer on may close
        # it before multiprocessing's feeder thread pickles it). Any other closed buffer's
        # memory may be gone.
        arrived = _imported_buffers.get(buffer)
        if arrived is None:
            raise RuntimeError("Buffer has been closed")
        return (_reduce_helper, arrived)
    mr = buffer.memory_resource
    if not isinstance(mr, (DeviceMemoryResource, PinnedMemoryResource)):
        raise TypeError(
            "only buffers of a DeviceMemoryResource or PinnedMemoryResource pickle, got "
            f"{type(mr).__name__}"
        )
    return (_reduce_helper, (mr, buffer.ipc_descriptor))


def _reduce_helper(mr, ipc_descriptor):
    """Unpickles a buffer: imports it into ``mr`` with ``stream=default_stream()``, first
    making ``Device(mr.device_id)`` (device 0 for a pinned pool) current when no context is."""
    if _custody._current_context() is None:
        device_id = mr.device_id
        Device(device_id if device_id >= 0 else None).set_current()
    buffer = Buffer.from_ipc_descriptor(mr, ipc_descriptor, stream=default_stream())
    _imported_buffers[buffer] = (mr, ipc_descriptor)
    return buffer


# The resource and descriptor each buffer unpickled here arrived with (`_reduce_buffer`).
_imported_buffers: "_weakref.WeakKeyDictionary" = _weakref.WeakKeyDictionary()


for _type in (Buffer, ManagedBuffer):
    _copyreg.pickle(_type, _reduce_buffer)
for _type in (DeviceMemoryResource, PinnedMemoryResource):
    _copyreg.pickle(_type, _reduce_pool_resource)
del _type
