"""cuda.core 1.2's surface, as custody provides it (docs/reference-notes.md; pybind/DESIGN.md,
"cuda.core compatibility"): pointer-likes in from_handle, Device's properties and identity,
events with cuda.core's options and timing, the object protocols (weak references, equality and
hashing by handle, subclassing Stream), resources' zero-size allocations, optional streams and
attributes, managed pools and managed-memory placement (Host, advice, prefetch, discard and their
batches), stream priorities and graphs, and messages that name the class called. Each test
asserts what any driver shows; they run on the emulator and on a GPU."""

import ctypes
import gc
import pickle
import re
import uuid
import weakref

import pytest

import custody


# --- 1. from_handle takes pointer-likes -------------------------------------------------------


class IndexPointer:
    def __init__(self, value):
        self.value = value

    def __index__(self):
        return self.value


class IntPointer:
    """Like cuda.bindings' CUdeviceptr: an object with __int__ only."""

    def __init__(self, value):
        self.value = value

    def __int__(self):
        return self.value


def test_from_handle_takes_pointer_likes(device, stream):
    backing = custody.DeviceMemoryResource(0).allocate(64, stream=stream)
    for ptr in (backing.handle, IndexPointer(backing.handle), IntPointer(backing.handle)):
        view = custody.Buffer.from_handle(ptr, 64)
        assert view.handle == backing.handle and view.size == 64
        view.close()
    managed = custody.ManagedMemoryResource().allocate(64, stream=stream)
    view = custody.ManagedBuffer.from_handle(IntPointer(managed.handle), 64, owner=managed)
    assert isinstance(view, custody.ManagedBuffer) and view.handle == managed.handle
    view.close()
    with pytest.raises(TypeError, match="pointer"):
        custody.Buffer.from_handle(float(backing.handle), 64)
    with pytest.raises(TypeError, match="pointer"):
        custody.Buffer.from_handle("0x1000", 64)
    with pytest.raises(OverflowError, match="unsigned 64-bit"):
        custody.Buffer.from_handle(IntPointer(-1), 64)
    managed.close()
    backing.close()


# --- 2. Device -----------------------------------------------------------------------------


def test_device_pci_bus_id_names_the_device_attributes(device):
    """domain:bus:device.function in hexadecimal, the device's PCI attributes (cuDeviceGetPCIBusId)."""
    domain, bus, rest = device.pci_bus_id.split(":")
    dev, function = rest.split(".")
    props = device.properties
    assert len(domain) == 4
    assert (int(domain, 16), int(bus, 16), int(dev, 16)) == (
        props.pci_domain_id, props.pci_bus_id, props.pci_device_id)
    int(function, 16)


def test_device_identity_and_properties(device):
    assert isinstance(device.name, str) and device.name
    assert re.fullmatch(r"<Device 0 \(.+\)>", repr(device))
    assert str(uuid.UUID(device.uuid)) == device.uuid
    cc = device.compute_capability
    assert isinstance(cc, custody.ComputeCapability) and cc == (cc.major, cc.minor)
    assert device.arch == f"{cc.major}{cc.minor}"
    props = device.properties
    assert props is device.properties, "read once per device"
    assert isinstance(props, custody.DeviceProperties)
    assert props.compute_capability_major == cc.major
    assert isinstance(props.memory_pools_supported, bool)
    assert isinstance(props.multiprocessor_count, int) and props.multiprocessor_count > 0
    assert isinstance(props.warp_size, int) and props.warp_size > 0
    public = {name for name in dir(props) if not name.startswith("_")}
    assert public == {name for name, _, _ in custody._properties.ATTRIBUTES}
    with pytest.raises(RuntimeError, match=r"^DeviceProperties cannot be instantiated directly\."):
        custody.DeviceProperties()
    assert weakref.ref(props)() is props


def test_all_devices_and_the_device_count(device):
    devices = custody.Device.get_all_devices()
    assert devices == tuple(custody.Device(i) for i in range(custody.system.num_devices))
    assert custody.system.get_num_devices() == custody.system.num_devices == len(devices)
    assert device.can_access_peer(device) is True


def test_create_event_takes_options(device):
    plain = device.create_event()
    assert not plain.is_timing_enabled and not plain.is_blocking_sync and not plain.is_ipc_enabled
    timed = device.create_event({"timing_enabled": True, "blocking_sync": True})
    assert timed.is_timing_enabled and timed.is_blocking_sync
    assert timed.device is device and timed.context == device.context
    with pytest.raises(TypeError, match="IPC-enabled events cannot use timing"):
        device.create_event(custody.EventOptions(timing_enabled=True, ipc_enabled=True))


# --- 3. Events -----------------------------------------------------------------------------


def test_event_options_use_cuda_core_names():
    options = custody.EventOptions(timing_enabled=True, blocking_sync=True, ipc_enabled=False)
    assert (options.timing_enabled, options.blocking_sync, options.ipc_enabled) == (True, True, False)
    with pytest.raises(TypeError):
        custody.EventOptions(enable_timing=True)


def test_event_timing(device, stream):
    timed = custody.EventOptions(timing_enabled=True)
    start = stream.record(options=timed)
    stream.sync()
    end = stream.record(options=timed)
    end.sync()
    assert start.is_done and end.is_done
    elapsed = end - start
    assert isinstance(elapsed, float) and elapsed >= 0.0
    untimed = stream.record()
    stream.sync()
    with pytest.raises(RuntimeError, match="^Both Events must be created with timing enabled"):
        untimed - start
    never_recorded = device.create_event(timed)
    with pytest.raises(RuntimeError, match="^Both Events must be recorded"):
        never_recorded - start
    assert start.__isub__(42) is NotImplemented
    assert start.__rsub__(42) is NotImplemented
    with pytest.raises(TypeError):
        start - 1


def test_event_ipc_descriptor_needs_an_ipc_event(device, stream):
    event = stream.record()
    with pytest.raises(RuntimeError, match="not IPC-enabled"):
        event.ipc_descriptor
    with pytest.raises(RuntimeError, match="cannot be instantiated directly"):
        custody.IPCEventDescriptor()
    a = custody.IPCEventDescriptor._init(b"\x01" * 64, True)
    b = custody.IPCEventDescriptor._init(b"\x01" * 64, False)
    assert a == b and hash(a) == hash(b), "compared by the handle bytes"
    assert a != custody.IPCEventDescriptor._init(b"\x02" * 64, True)
    assert a.__eq__(42) is NotImplemented and a != 42
    short = custody.IPCEventDescriptor._init(b"\x00" * 8, True)
    with pytest.raises(ValueError, match="reserved field is 8 bytes; expected at least 64"):
        custody.Event.from_ipc_descriptor(short)
    import pickle

    back = pickle.loads(pickle.dumps(a))
    assert back == a and back.is_blocking_sync


def test_event_protocols(device, stream):
    e1, e2 = stream.record(), stream.record()
    assert e1 == e1 and e1 != e2 and hash(e1) != hash(e2)
    assert e1 != e1.handle and (e1 == "x") is False
    assert len({e1: 1, e2: 2}) == 2
    assert weakref.ref(e1)() is e1
    assert re.fullmatch(r"<Event handle=0x[0-9a-f]+>", repr(e1))
    assert not e1.is_closed
    e1.close()
    assert e1.is_closed
    with pytest.raises(RuntimeError, match=r"^Event objects cannot be instantiated directly\."):
        custody.Event()


# --- 5. Object protocols -------------------------------------------------------------------


def test_streams_compare_and_hash_by_handle(device):
    s1 = device.create_stream()
    s2 = custody.Stream.from_handle(int(s1.handle))
    s3 = device.create_stream()
    assert s1 == s2 and s2 == s1 and hash(s1) == hash(s2)
    assert s1 != s3 and (s1 == "x") is False and s1 != s1.handle
    assert {s1: "v"}[s2] == "v"
    assert len({s1, s2, s3}) == 2
    assert hash(custody.LEGACY_DEFAULT_STREAM) != hash(custody.PER_THREAD_DEFAULT_STREAM)
    assert isinstance(s1.handle, int)
    assert weakref.ref(s1)() is s1
    assert re.fullmatch(r"<Stream handle=0x[0-9a-f]+ context=0x[0-9a-f]+>", repr(s1))
    s3.close()
    assert s3 != custody.Stream.from_handle(int(s1.handle))
    s2.close()
    s1.close()


def test_stream_subclasses(device):
    class MyStream(custody.Stream):
        pass

    made = MyStream._init(options=custody.StreamOptions(), device_id=0)
    assert type(made) is MyStream and made.context == device.context
    assert type(MyStream._legacy_default()) is MyStream
    assert type(MyStream._per_thread_default()) is MyStream
    assert custody.Stream._legacy_default() is custody.LEGACY_DEFAULT_STREAM
    assert custody.Stream._per_thread_default() is custody.PER_THREAD_DEFAULT_STREAM
    made.close()
    with pytest.raises(RuntimeError, match=r"^Stream objects cannot be instantiated directly\."):
        custody.Stream()
    with pytest.raises(RuntimeError, match="cannot be instantiated directly"):
        MyStream()


def test_buffers_compare_by_address_and_size(device, stream):
    pool = custody.DeviceMemoryResource(0)
    a = pool.allocate(64, stream=stream)
    b = pool.allocate(64, stream=stream)
    view = custody.Buffer.from_handle(a.handle, a.size)
    assert a == view and hash(a) == hash(view)
    assert a != custody.Buffer.from_handle(a.handle, 32)
    assert a != b and (a == "x") is False and a != a.handle
    assert weakref.ref(a)() is a
    h = hash(a)
    a.close()
    assert hash(a) == h, "the hash does not change on close"
    assert a != view and a == a, "a closed buffer equals only itself"
    b.close()


def test_contexts_and_resources_are_weak_referenceable(device, stream):
    ctx = stream.context
    assert ctx == device.context and hash(ctx) == hash(device.context)
    assert re.fullmatch(r"<Context handle=0x[0-9a-f]+ device=0>", repr(ctx))
    assert (ctx == "x") is False and not ctx.is_closed
    with pytest.raises(RuntimeError, match=r"^Context objects cannot be instantiated directly\."):
        custody.Context()
    for obj in (
        ctx,
        custody.DeviceMemoryResource(0),
        custody.PinnedMemoryResource(),
        custody.LegacyPinnedMemoryResource(),
        custody.ManagedMemoryResource(),
        custody.SynchronousMemoryResource(0),
        custody.GraphMemoryResource(0),
        device.create_graph_builder(),
    ):
        assert weakref.ref(obj)() is obj


# --- 6. Memory resources -------------------------------------------------------------------


@pytest.mark.parametrize(
    "make",
    [
        lambda: custody.DeviceMemoryResource(0),
        lambda: custody.PinnedMemoryResource(),
        lambda: custody.LegacyPinnedMemoryResource(),
        lambda: custody.ManagedMemoryResource(),
        lambda: custody.SynchronousMemoryResource(0),
    ],
    ids=["device", "pinned", "legacy-pinned", "managed", "synchronous"],
)
def test_allocate_zero_gives_an_empty_buffer_of_the_resource(device, stream, emu, make):
    mr = make()
    if emu is not None:
        emu.clear_calls()
    buf = mr.allocate(0, stream=stream)
    if emu is not None:
        assert [c for c in emu.calls() if c["function"].startswith("cuMem")] == [], "no driver call"
    assert buf.size == 0 and buf.handle == 0
    assert buf.device_id == mr.device_id and buf.memory_resource is mr
    assert buf.is_device_accessible == mr.is_device_accessible
    assert buf.is_host_accessible == mr.is_host_accessible
    buf.close()
    assert buf.is_closed


def test_synchronous_resources_take_no_stream(device):
    for mr in (custody.LegacyPinnedMemoryResource(), custody.SynchronousMemoryResource(0)):
        buf = mr.allocate(64)
        assert buf.size == 64 and buf.handle != 0
        buf.close()
        assert mr.allocate(0).size == 0
        buf = mr.allocate(32, stream=None)
        buf.close()
    with pytest.raises(TypeError, match=r"DeviceMemoryResource\.allocate\(\) missing 1 required keyword argument: 'stream'"):
        custody.DeviceMemoryResource(0).allocate(64)


def test_pool_attributes_include_reuse_flags(device, stream):
    mr = custody.DeviceMemoryResource(0, {"max_size": 2**21})
    attrs = mr.attributes
    for name in (
        "reuse_follow_event_dependencies",
        "reuse_allow_opportunistic",
        "reuse_allow_internal_dependencies",
    ):
        assert isinstance(getattr(attrs, name), bool)
    buf = mr.allocate(64, stream=stream)
    assert re.fullmatch(
        r"MemoryPoolAttributes\(release_threshold=\d+, reserved_mem_current=\d+, "
        r"reserved_mem_high=\d+, reuse_allow_internal_dependencies=(True|False), "
        r"reuse_allow_opportunistic=(True|False), reuse_follow_event_dependencies=(True|False), "
        r"used_mem_current=\d+, used_mem_high=\d+\)",
        repr(attrs),
    )
    buf.close()


def test_managed_memory_resource_is_a_managed_pool(device, stream, emu):
    """cuda.core 1.2's ManagedMemoryResource: with no options the driver's current managed pool
    (borrowed), with options a pool of its own; pool attributes, no IPC, managed buffers."""
    current = custody.ManagedMemoryResource()
    assert not current.is_handle_owned and current.preferred_location is None
    assert current.device_id == -1 and current.is_managed and not current.is_ipc_enabled
    assert current.is_device_accessible and current.is_host_accessible
    own = custody.ManagedMemoryResource(custody.ManagedMemoryResourceOptions())
    assert own.is_handle_owned and own.handle != current.handle
    if emu is not None:
        emu.clear_calls()
    buf = own.allocate(4096, stream=stream)
    if emu is not None:
        assert "cuMemAllocFromPoolAsync" in [c["function"] for c in emu.calls()]
    assert isinstance(buf, custody.ManagedBuffer) and buf.is_managed
    assert buf.memory_resource is own and buf.__dlpack_device__() == (13, 0)
    buf.fill(7, stream=stream)
    stream.sync()
    assert own.attributes.used_mem_current >= 4096
    assert isinstance(own.attributes.reuse_allow_opportunistic, bool)
    with pytest.raises(RuntimeError, match="Memory resource is not IPC-enabled"):
        own.allocation_handle
    assert own.uuid is None
    buf.close(stream)
    own.close()
    with pytest.raises(RuntimeError, match="ManagedMemoryResource has been closed"):
        own.allocate(64, stream=stream)


def test_managed_memory_resource_preferred_locations(device, stream):
    def preferred(**options):
        mr = custody.ManagedMemoryResource(custody.ManagedMemoryResourceOptions(**options))
        mr.allocate(64, stream=stream).close(stream)
        return mr.preferred_location, mr.device_id

    assert preferred(preferred_location=0) == (("device", 0), 0)
    kind = preferred(preferred_location=0, preferred_location_type="device")[0][0]
    assert kind is custody.ManagedMemoryLocationType.DEVICE
    assert preferred(preferred_location=-1) == (("host", None), -1)
    assert preferred(preferred_location_type=custody.ManagedMemoryLocationType.HOST) == (("host", None), -1)
    node = device.properties.host_numa_id
    if node >= 0:
        assert preferred(preferred_location_type="host_numa") == (("host_numa", node), -1)
        assert preferred(preferred_location=node, preferred_location_type="host_numa")[0] == ("host_numa", node)
    assert custody.ManagedMemoryResource({"preferred_location": 0}).preferred_location == ("device", 0)


@pytest.mark.parametrize(
    "options,message",
    [
        ({"preferred_location_type": "invalid"},
         "'invalid' is not a valid ManagedMemoryLocationType. Must be None, 'device', 'host' or 'host_numa'"),
        ({"preferred_location_type": "device"},
         "preferred_location must be a device ordinal (>= 0) when preferred_location_type is 'device', got None"),
        ({"preferred_location": -1, "preferred_location_type": "device"}, "must be a device ordinal"),
        ({"preferred_location": 0, "preferred_location_type": "host"},
         "preferred_location must be None when preferred_location_type is 'host', got 0"),
        ({"preferred_location": -1, "preferred_location_type": "host_numa"}, "must be a NUMA node ID"),
        ({"preferred_location": -2},
         "preferred_location must be a device ordinal (>= 0), -1 for host, or None for no preference, got -2"),
    ],
)
def test_managed_memory_resource_rejects_bad_locations(device, options, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        custody.ManagedMemoryResource(custody.ManagedMemoryResourceOptions(**options))


def test_legacy_managed_memory_resource_is_cu_mem_alloc_managed(device, stream, emu):
    mr = custody.LegacyManagedMemoryResource()
    if emu is not None:
        emu.clear_calls()
    buf = mr.allocate(256, stream=stream)
    if emu is not None:
        assert "cuMemAllocManaged" in [c["function"] for c in emu.calls()]
    assert isinstance(buf, custody.ManagedBuffer) and buf.is_managed and mr.is_managed
    assert buf.__dlpack_device__() == (13, 0)
    # The driver, not the resource, classifies adopted memory: this pointer is managed.
    view = custody.Buffer.from_handle(buf.handle, 256, owner=buf)
    assert view.is_managed
    view.close()
    buf.close()


def test_pinned_numa_id_as_cuda_core(device, stream):
    """numa_id None: the operating system places a non-IPC pool (numa_id -1); an IPC pool takes
    the current device's host NUMA node; a negative numa_id is a ValueError."""
    assert custody.PinnedMemoryResource().numa_id == -1
    mr = custody.PinnedMemoryResource(custody.PinnedMemoryResourceOptions())
    assert mr.numa_id == -1
    mr.allocate(64, stream=stream).close(stream)
    node = device.properties.host_numa_id
    if node >= 0:
        assert custody.PinnedMemoryResource({"numa_id": node}).numa_id == node
        shared = custody.PinnedMemoryResource({"ipc_enabled": True, "max_size": 2**21})
        assert shared.numa_id == node
        shared.close()
    for bad in (-1, -42):
        with pytest.raises(ValueError, match=rf"^numa_id must be >= 0, got {bad}$"):
            custody.PinnedMemoryResource(custody.PinnedMemoryResourceOptions(numa_id=bad))


def test_adopted_pinned_memory_names_the_device_that_made_it(device, stream):
    """from_handle of pinned memory with no resource: device_id is the driver's
    CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL (cuda.core's answer), pageable memory has none."""
    pinned = custody.LegacyPinnedMemoryResource().allocate(64)
    view = custody.Buffer.from_handle(pinned.handle, 64)
    assert view.device_id == device.device_id
    assert view.is_device_accessible and view.is_host_accessible
    assert view.__dlpack_device__() == (3, 0)
    view.close()
    pinned.close()
    pageable = (ctypes.c_byte * 16)()
    assert custody.Buffer.from_handle(ctypes.addressof(pageable), 16, owner=pageable).device_id == -1


def test_adopted_registered_memory_names_the_device_that_registered_it(device):
    """Host memory page-locked with cuMemHostRegister (through the driver custody loaded) and
    adopted with from_handle: device- and host-accessible, on the registering context's device;
    after cuMemHostUnregister the same bytes are pageable again (device_id -1)."""
    from conftest import DRIVER

    page = (ctypes.c_byte * 4096)()
    ptr = ctypes.addressof(page)
    register = DRIVER.cuMemHostRegister_v2
    register.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint]
    assert register(ptr, 4096, 0) == 0
    try:
        view = custody.Buffer.from_handle(ptr, 4096, owner=page)
        assert view.is_device_accessible and view.is_host_accessible
        assert view.device_id == device.device_id
        view.close()
    finally:
        unregister = DRIVER.cuMemHostUnregister
        unregister.argtypes = [ctypes.c_void_p]
        assert unregister(ptr) == 0
    pageable = custody.Buffer.from_handle(ptr, 4096, owner=page)
    assert pageable.device_id == -1 and not pageable.is_device_accessible
    pageable.close()


def test_pinned_memory_of_a_resource_bound_to_no_gpu_is_cuda_host(device, stream):
    """__dlpack_device__ of device- and host-accessible memory that is not managed is
    (kDLCUDAHost, 0) without asking the resource's device_id (which may raise)."""
    pinned = custody.LegacyPinnedMemoryResource()

    class NoGpu(custody.MemoryResource):
        kept = {}

        def allocate(self, size, *, stream=None):
            real = pinned.allocate(size)
            self.kept[real.handle] = real
            return custody.Buffer.from_handle(real.handle, size, mr=self)

        def deallocate(self, ptr, size, *, stream=None):
            self.kept.pop(ptr).close()

        is_device_accessible = True
        is_host_accessible = True

        @property
        def device_id(self):
            raise RuntimeError("the pinned memory resource is not bound to any GPU")

    buf = NoGpu().allocate(64)
    assert buf.__dlpack_device__() == (3, 0)
    buf.close()


def test_host_locations_are_singletons_that_pickle():
    assert custody.Host() is custody.Host() and custody.Host(numa_id=1) is custody.Host(1)
    assert custody.Host.numa_current() is custody.Host(is_numa_current=True)
    assert custody.Host() != custody.Host.numa_current() != custody.Host(numa_id=0)
    assert (custody.Host().numa_id, custody.Host(3).numa_id) == (None, 3)
    assert custody.Host.numa_current().is_numa_current and not custody.Host().is_numa_current
    assert [repr(h) for h in (custody.Host(), custody.Host(2), custody.Host.numa_current())] == [
        "Host()", "Host(numa_id=2)", "Host.numa_current()"]
    for host in (custody.Host(), custody.Host(2), custody.Host.numa_current()):
        assert pickle.loads(pickle.dumps(host)) is host
    for bad in (-1, True, "0", 1.0):
        with pytest.raises(ValueError, match="numa_id must be a non-negative int"):
            custody.Host(numa_id=bad)
    with pytest.raises(ValueError, match="not both"):
        custody.Host(0, is_numa_current=True)


def test_location_coercion(device):
    assert custody._coerce_location(device) == ("device", 0)
    assert custody._coerce_location(custody.Host()).kind == "host"
    assert custody._coerce_location(custody.Host(3)) == ("host_numa", 3)
    assert custody._coerce_location(custody.Host.numa_current()).kind == "host_numa_current"
    assert custody._coerce_location(None, allow_none=True) is None
    with pytest.raises(ValueError, match="location is required"):
        custody._coerce_location(None)
    for bad in (0, "device"):
        with pytest.raises(TypeError, match="Device, Host, or None"):
            custody._coerce_location(bad)


@pytest.fixture(params=["pool", "cuMemAllocManaged"])
def managed(request, device, stream):
    """A page of managed memory from a managed pool, or from cuMemAllocManaged adopted with
    ManagedBuffer.from_handle (owner=)."""
    if request.param == "pool":
        buf = custody.ManagedMemoryResource().allocate(4096, stream=stream)
        yield buf
        buf.close(stream)
    else:
        plain = custody.LegacyManagedMemoryResource().allocate(4096, stream=stream)
        yield custody.ManagedBuffer.from_handle(plain.handle, plain.size, owner=plain)
        plain.close()


@pytest.fixture
def managed_external(device, stream):
    """A page from cuMemAllocManaged adopted with ManagedBuffer.from_handle (owner=): cuda.core's
    advice tests use such memory, since pool-allocated managed memory declines some advice on
    some drivers."""
    plain = custody.LegacyManagedMemoryResource().allocate(4096, stream=stream)
    yield custody.ManagedBuffer.from_handle(plain.handle, plain.size, owner=plain)
    plain.close()


def test_managed_buffer_advice_round_trips(device, managed_external, emu):
    """read_mostly, preferred_location and accessed_by give the driver advice (cuMemAdvise_v2)
    and read it back from the range attributes."""
    managed = managed_external
    if emu is not None:
        emu.clear_calls()
    assert managed.read_mostly is False
    managed.read_mostly = True
    assert managed.read_mostly is True
    managed.read_mostly = False
    assert managed.read_mostly is False
    if emu is not None:
        assert [c["function"] for c in emu.calls()].count("cuMemAdvise_v2") == 2
    assert managed.preferred_location is None
    managed.preferred_location = device
    assert managed.preferred_location is device
    managed.preferred_location = custody.Host()
    assert managed.preferred_location is custody.Host()
    managed.preferred_location = None
    assert managed.preferred_location is None
    with pytest.raises(TypeError, match="Device, Host, or None"):
        managed.preferred_location = 0

    accessed = managed.accessed_by
    assert len(accessed) == 0 and device not in accessed and accessed == set()
    accessed.add(device)
    assert device in managed.accessed_by and set(managed.accessed_by) == {device}
    accessed.discard(custody.Host(numa_id=0))  # never a member: a no-op
    accessed.discard(device)
    assert device not in accessed
    with pytest.raises(KeyError):
        accessed.remove(device)
    managed.accessed_by = {device, custody.Host()}
    assert set(managed.accessed_by) == {device, custody.Host()}
    assert accessed | {custody.Host(1)} == {device, custody.Host(), custody.Host(1)}
    # Checked before anything changes: the advice stays as it was.
    with pytest.raises(ValueError, match="does not support location_type='host_numa'"):
        managed.accessed_by = {device, custody.Host(numa_id=0)}
    with pytest.raises(ValueError, match="does not support location_type='host_numa_current'"):
        managed.accessed_by.add(custody.Host.numa_current())
    assert set(managed.accessed_by) == {device, custody.Host()}
    managed.accessed_by = set()
    assert len(managed.accessed_by) == 0


def test_managed_buffer_prefetch_and_discard(device, stream, managed, emu):
    if emu is not None:
        emu.clear_calls()
    assert managed.last_prefetch_location is None
    managed.prefetch(device, stream=stream)
    stream.sync()
    assert managed.last_prefetch_location is device
    managed.prefetch(custody.Host(), stream=stream)
    stream.sync()
    # The host as the driver names it after a prefetch there: with or without its NUMA node.
    assert isinstance(managed.last_prefetch_location, custody.Host)
    managed.discard(stream=stream)
    managed.discard_prefetch(device, stream=stream)
    stream.sync()
    assert managed.last_prefetch_location is device
    if emu is not None:
        calls = [c["function"] for c in emu.calls()]
        assert calls.count("cuMemPrefetchAsync_v2") == 2
        assert "cuMemDiscardBatchAsync" in calls and "cuMemDiscardAndPrefetchBatchAsync" in calls
    with pytest.raises(ValueError, match="location is required"):
        managed.prefetch(None, stream=stream)
    with pytest.raises(TypeError, match="stream is keyword-only"):
        managed.prefetch(device, stream)
    with pytest.raises(TypeError, match="stream is required"):
        managed.discard()


def test_managed_operations_refuse_memory_that_is_not_managed(device, stream, emu):
    plain = custody.DeviceMemoryResource(0).allocate(4096, stream=stream)
    wrapped = custody.ManagedBuffer.from_handle(plain.handle, plain.size, owner=plain)
    if emu is not None:
        emu.clear_calls()
    with pytest.raises(ValueError, match="managed-memory allocation"):
        wrapped.read_mostly = True
    with pytest.raises(ValueError, match="managed-memory allocation"):
        wrapped.prefetch(device, stream=stream)
    with pytest.raises(ValueError, match="managed-memory allocation"):
        wrapped.discard_prefetch(device, stream=stream)
    with pytest.raises(ValueError, match="managed-memory allocation"):
        custody.prefetch_batch(stream, [wrapped], device)
    if emu is not None:
        names = [c["function"] for c in emu.calls()]
        assert not [n for n in names if n.startswith(("cuMemAdvise", "cuMemPrefetch", "cuMemDiscard"))]
    wrapped.close()
    plain.close(stream)


def test_managed_batches(device, stream, emu):
    mr = custody.LegacyManagedMemoryResource()
    bufs = [mr.allocate(4096, stream=stream) for _ in range(3)]
    if emu is not None:
        emu.clear_calls()
    custody.prefetch_batch(stream, bufs, device)
    stream.sync()
    assert [b.last_prefetch_location for b in bufs] == [device] * 3
    custody.prefetch_batch(stream, bufs, [custody.Host(), device, custody.Host()])
    stream.sync()
    assert [isinstance(b.last_prefetch_location, custody.Host) for b in bufs] == [True, False, True]
    custody.discard_batch(stream, bufs)
    custody.discard_prefetch_batch(stream, tuple(bufs), device)
    stream.sync()
    assert [b.last_prefetch_location for b in bufs] == [device] * 3
    if emu is not None:
        calls = [c["function"] for c in emu.calls()]
        assert calls.count("cuMemPrefetchBatchAsync") == 2
        assert calls.count("cuMemDiscardBatchAsync") == 1
        assert calls.count("cuMemDiscardAndPrefetchBatchAsync") == 1
        emu.clear_calls()
    for fn, args in ((custody.prefetch_batch, (custody.Host(),)), (custody.discard_batch, ()),
                     (custody.discard_prefetch_batch, (device,))):
        with pytest.raises(TypeError, match="sequence of Buffers"):
            fn(stream, bufs[0], *args)
        with pytest.raises(TypeError, match="sequence of Buffers"):
            fn(stream, [bufs[0], 7], *args)
        with pytest.raises(ValueError, match="at least one buffer"):
            fn(stream, [], *args)
    for fn in (custody.prefetch_batch, custody.discard_prefetch_batch):
        with pytest.raises(ValueError, match="length"):
            fn(stream, bufs, [custody.Host()])
        with pytest.raises(TypeError, match="Device, Host, or None"):
            fn(stream, bufs, 0)
    with pytest.raises(TypeError, match="stream is required"):
        custody.discard_batch(None, bufs)
    if emu is not None:
        assert not [c for c in emu.calls() if c["function"].startswith(("cuMemPrefetch", "cuMemDiscard"))]
    for b in bufs:
        b.close()


def test_peer_accessible_by_is_a_live_set_without_the_own_device(device, emu):
    mr = custody.DeviceMemoryResource(0, custody.DeviceMemoryResourceOptions(max_size=2**21))
    peers = mr.peer_accessible_by
    assert peers == set() and len(peers) == 0 and 0 not in peers and device not in peers
    if emu is not None:
        emu.clear_calls()
    mr.peer_accessible_by = []
    mr.peer_accessible_by = [device, 0]  # the pool's own device is ignored
    peers.add(device)
    peers.discard(0)
    assert set(mr.peer_accessible_by) == set()
    if emu is not None:
        assert "cuMemPoolSetAccess" not in [c["function"] for c in emu.calls()]
    count = custody.system.get_num_devices()
    with pytest.raises(ValueError, match="out of range"):
        mr.peer_accessible_by = [count]
    with pytest.raises(ValueError, match="out of range"):
        peers.add(count + 3)
    with pytest.raises(TypeError):
        mr.peer_accessible_by = ["1"]
    with pytest.raises(TypeError):
        mr.peer_accessible_by = 1
    assert set(mr.peer_accessible_by) == set()
    mr.close()


def test_graph_memory_resource_is_one_object_per_device_with_attributes(device, stream):
    gmr = custody.GraphMemoryResource(0)
    assert gmr is custody.GraphMemoryResource(device)
    attrs = gmr.attributes
    assert isinstance(attrs, custody.GraphMemoryResourceAttributes)
    for name in ("reserved_mem_current", "reserved_mem_high", "used_mem_current", "used_mem_high"):
        assert isinstance(getattr(attrs, name), int) and getattr(attrs, name) >= 0
    assert repr(attrs).startswith("GraphMemoryResourceAttributes(reserved_mem_current=")
    with pytest.raises(AttributeError, match="not writable"):
        attrs.used_mem_current = 0
    with pytest.raises(AttributeError, match=r"may only be set to zero \(got 1\)"):
        attrs.used_mem_high = 1
    attrs.used_mem_high = 0
    attrs.reserved_mem_high = 0
    gmr.trim()
    gmr.close()
    with pytest.raises(RuntimeError, match="cannot be instantiated directly"):
        custody.GraphMemoryResourceAttributes()
    builder = device.create_graph_builder().begin_building()
    empty = gmr.allocate(0, stream=builder)
    assert empty.size == 0 and empty.device_id == 0
    builder.end_building()
    builder.close()


def test_capture_errors_name_the_resource(device, stream):
    with pytest.raises(RuntimeError, match=r"^GraphMemoryResource cannot perform memory operations on a non-capturing stream\."):
        custody.GraphMemoryResource(0).allocate(8, stream=stream)
    builder = stream.create_graph_builder().begin_building()
    with pytest.raises(
        RuntimeError,
        match=r"^DeviceMemoryResource cannot perform memory operations on a capturing stream "
        r"\(consider using GraphMemoryResource\)\.",
    ):
        custody.DeviceMemoryResource(0).allocate(8, stream=builder)
    builder.end_building()
    builder.close()


# --- 7. Streams and graphs -----------------------------------------------------------------


def test_stream_priority_and_flags(device):
    default = device.create_stream()
    assert default.priority == 0 and default.is_nonblocking is True
    blocking = device.create_stream(options={"nonblocking": False})
    assert blocking.is_nonblocking is False
    with pytest.raises(ValueError, match="stream priority must be in"):
        device.create_stream(options=custody.StreamOptions(priority=1))
    for s in (default, blocking):
        s.close()


def test_graph_builder_on_a_stream_upload_and_messages(device, stream):
    pool = custody.DeviceMemoryResource(0)
    buf = pool.allocate(64, stream=stream)
    builder = stream.create_graph_builder()
    assert builder.stream is stream
    with pytest.raises(RuntimeError, match=r"^Graph has not finished building\."):
        builder.complete()
    builder.begin_building()
    with pytest.raises(RuntimeError, match=r"^Graph builder is already building\."):
        builder.begin_building()
    with pytest.raises(RuntimeError, match=r"^Graph has not finished building\."):
        builder.complete()
    buf.fill(7, stream=builder)
    graph = builder.end_building().complete(custody.GraphCompleteOptions(upload_stream=stream))
    with pytest.raises(NotImplementedError, match="auto_free_on_launch"):
        builder.complete(custody.GraphCompleteOptions(auto_free_on_launch=True))
    assert graph.handle != 0
    graph.upload(stream)
    graph.launch(stream)
    stream.sync()
    pinned = custody.LegacyPinnedMemoryResource().allocate(64)
    pinned.copy_from(buf, stream=stream)
    stream.sync()
    assert ctypes.string_at(pinned.handle, 64) == b"\x07" * 64, "the uploaded graph ran"
    graph.close()
    graph.close()
    assert graph.handle == 0 and graph.is_closed
    builder.close()
    assert builder.is_closed
    with pytest.raises(RuntimeError, match=r"^Graph builder has been closed\."):
        builder.complete()
    pinned.close()
    buf.close()
    gc.collect()


# --- 9. Messages name the class called; names custody does not provide --------------------


def test_messages_name_the_class_called(device, stream):
    class MyPool(custody.DeviceMemoryResource):
        pass

    with pytest.raises(TypeError, match=r"^MyPool\.allocate\(\) missing 1 required keyword argument: 'stream'"):
        MyPool(0).allocate(8)
    # pyo3's own message (it names the base class): a `**kwargs` to catch unknown keywords
    # would cost allocate its fast calling convention (pybind/DESIGN.md, "Hot path").
    with pytest.raises(TypeError, match=r"^MemoryResource\.allocate\(\) got an unexpected keyword argument 'nope'"):
        MyPool(0).allocate(8, stream=stream, nope=1)
    owner = (ctypes.c_byte * 16)()
    with pytest.raises(ValueError, match=r"^owner and memory resource cannot be both specified together"):
        custody.Buffer.from_handle(ctypes.addressof(owner), 16, mr=MyPool(0), owner=owner)


@pytest.mark.parametrize("name", ["Program", "Linker", "launch", "LaunchConfig", "VirtualMemoryResource"])
def test_out_of_scope_names_say_custody_does_not_provide_them(name):
    with pytest.raises(AttributeError, match=f"custody does not provide {name}"):
        getattr(custody, name)
    with pytest.raises(ImportError):
        exec(f"from custody import {name}", {})
    assert not hasattr(custody, name)
