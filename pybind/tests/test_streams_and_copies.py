"""Device, Stream, Event, the __cuda_stream__ protocol (accepted and provided), copies and fills,
the built-in resources' surface."""

import ctypes
import gc

import pytest

import custody
from conftest import current_context, run_in_thread


class ForeignStream:
    """A stream owned by "another library", exposing only __cuda_stream__."""

    def __init__(self, stream):
        self._stream = stream

    def __cuda_stream__(self):
        return (0, int(self._stream.handle))


def host_bytes(buf, stream):
    """The buffer's bytes, copied to pinned host memory and read there."""
    staging = custody.LegacyPinnedMemoryResource().allocate(buf.size, stream=stream)
    staging.copy_from(buf, stream=stream)
    stream.sync()
    data = ctypes.string_at(staging.handle, buf.size)
    staging.close()
    return data


def test_device_basics(device):
    assert custody.Device(0) is device
    assert custody.Device() is device  # the current context's device
    assert device.device_id == 0 and int(device) == 0
    assert isinstance(device.context, custody.Context)
    assert device.context.device_id == 0
    assert device.default_stream is custody.default_stream()
    assert isinstance(device.memory_resource, custody.DeviceMemoryResource)
    device.sync()
    assert custody.system.num_devices >= 1


def test_device_set_current_on_a_thread():
    def on_thread():
        assert current_context() == 0
        custody.Device(0).set_current()
        return current_context()

    assert run_in_thread(on_thread) == custody.Device(0).context.handle


def test_stream_record_wait_sync(device, stream):
    event = stream.record()
    assert isinstance(event, custody.Event)
    event.sync()
    assert event.is_done
    other = device.create_stream(options=custody.StreamOptions(nonblocking=False, priority=0))
    other.wait(event)
    other.wait(stream)
    other.sync()
    again = stream.record(event)
    assert again is event
    assert stream.context == device.context
    assert stream.device is device
    other.close()
    other.close()
    assert other.is_closed
    event.close()
    with pytest.raises(RuntimeError, match="Event has been closed"):
        event.sync()


def test_cuda_stream_protocol_provided_and_accepted(device, stream, emu):
    """__cuda_stream__ is provided by Stream and accepted wherever a stream is."""
    assert stream.__cuda_stream__() == (0, stream.handle)
    foreign = ForeignStream(stream)
    mr = custody.DeviceMemoryResource(0)
    buf = mr.allocate(64, stream=foreign)
    ptr = buf.handle
    alloc = emu.alloc_id(ptr) if emu else None
    buf.fill(7, stream=foreign)
    wrapped = custody.Stream.from_handle(foreign)
    assert wrapped.handle == stream.handle
    wrapped2 = device.create_stream(foreign)
    assert wrapped2.handle == stream.handle
    buf.close(stream=foreign)
    if emu:
        (free,) = emu.calls_to("cuMemFreeAsync", alloc=alloc)
        assert free["stream"] == stream.handle


def test_default_stream_singletons(device):
    assert custody.LEGACY_DEFAULT_STREAM.handle == 1
    assert custody.PER_THREAD_DEFAULT_STREAM.handle == 2
    custody.LEGACY_DEFAULT_STREAM.close()  # a no-op: the singletons cannot be closed
    assert not custody.LEGACY_DEFAULT_STREAM.is_closed
    custody.LEGACY_DEFAULT_STREAM.sync()
    with pytest.raises(RuntimeError, match="cannot be instantiated"):
        custody.Stream()


@pytest.mark.parametrize(
    "make",
    [
        lambda: custody.DeviceMemoryResource(0),
        lambda: custody.DeviceMemoryResource(custody.Device(0), custody.DeviceMemoryResourceOptions(max_size=1 << 26)),
        lambda: custody.PinnedMemoryResource(),
        lambda: custody.LegacyPinnedMemoryResource(),
        lambda: custody.ManagedMemoryResource(),
        lambda: custody.SynchronousMemoryResource(0),
    ],
    ids=["device", "device-own-pool", "pinned", "legacy-pinned", "managed", "synchronous"],
)
def test_fill_and_copy_round_trip(device, stream, make, no_hazards):
    mr = make()
    a = mr.allocate(4096, stream=stream)
    assert a.memory_resource is mr
    assert a.is_device_accessible == mr.is_device_accessible
    assert a.is_host_accessible == mr.is_host_accessible
    a.fill(0x5A, stream=stream)
    b = a.copy_to(stream=stream)
    assert b.size == 4096 and b.memory_resource is mr
    assert host_bytes(b, stream) == b"\x5a" * 4096
    c = custody.DeviceMemoryResource(0).allocate(4096, stream=stream)
    c.fill(b"\x01\x02", stream=stream)
    a.copy_from(c, stream=stream)
    assert host_bytes(a, stream) == b"\x01\x02" * 2048
    c.fill(b"\x01\x02\x03\x04", stream=stream)
    c.copy_to(b, stream=stream)
    assert host_bytes(b, stream) == b"\x01\x02\x03\x04" * 1024
    if isinstance(mr, custody.ManagedMemoryResource):
        assert isinstance(a, custody.ManagedBuffer) and a.is_managed
        assert a.__dlpack_device__()[0] == 13
    for buf in (a, b, c):
        buf.close()


def test_pool_attributes_track_usage(device, stream):
    mr = custody.DeviceMemoryResource(0, custody.DeviceMemoryResourceOptions())
    assert mr.attributes.used_mem_current == 0
    buf = mr.allocate(1 << 20, stream=stream)
    assert mr.attributes.used_mem_current >= 1 << 20
    assert mr.attributes.reserved_mem_current >= mr.attributes.used_mem_current
    buf.close()
    stream.sync()
    assert mr.attributes.used_mem_current == 0
    assert mr.attributes.used_mem_high >= 1 << 20


def test_graph_memory_resource_needs_capture(device, stream):
    """69: GraphMemoryResource.allocate on a stream that is not capturing -> RuntimeError."""
    gmr = custody.GraphMemoryResource(0)
    assert gmr.device_id == 0 and gmr.is_device_accessible
    with pytest.raises(RuntimeError, match="non-capturing stream"):
        gmr.allocate(64, stream=stream)


def test_managed_buffer_from_handle(device, stream, emu):
    mr = custody.ManagedMemoryResource()
    backing = mr.allocate(256, stream=stream)
    alloc = emu.alloc_id(backing.handle) if emu else None
    view = custody.ManagedBuffer.from_handle(backing.handle, 256)
    assert isinstance(view, custody.ManagedBuffer) and view.is_managed
    assert view.is_host_accessible and view.is_device_accessible
    view.close()
    if emu:
        assert emu.is_live(alloc)
    backing.close()


def test_repr_and_buffer_constructor(device, stream):
    mr = custody.DeviceMemoryResource(0)
    buf = mr.allocate(64, stream=stream)
    assert repr(buf) == f"<Buffer ptr=0x{buf.handle:x} size=64>"
    buf.close()
    assert repr(buf) == "<Buffer closed>"
    with pytest.raises(RuntimeError, match="cannot be instantiated"):
        custody.Buffer()
    with pytest.raises(RuntimeError, match="cannot be instantiated"):
        custody.ManagedBuffer()


def test_base_memory_resource_methods_need_a_subclass():
    class Incomplete(custody.MemoryResource):
        pass

    # The messages name the class the user called.
    mr = Incomplete()
    missing = "Incomplete subclasses MemoryResource without defining it"
    with pytest.raises(TypeError, match=rf"^Incomplete\.allocate must be implemented: {missing}$"):
        mr.allocate(1, stream=custody.LEGACY_DEFAULT_STREAM)
    with pytest.raises(TypeError, match=rf"^Incomplete\.deallocate must be implemented: {missing}"):
        mr.deallocate(1, 1, stream=custody.LEGACY_DEFAULT_STREAM)
    for name in ("is_device_accessible", "is_host_accessible", "device_id"):
        with pytest.raises(TypeError, match=rf"^Incomplete\.{name} must be implemented: {missing}"):
            getattr(mr, name)
    with pytest.raises(TypeError, match="^Incomplete.is_device_accessible must be implemented"):
        custody.Buffer.from_handle(0x1000, 8, mr=mr)
    base = custody.MemoryResource()
    with pytest.raises(TypeError, match=r"^MemoryResource\.allocate must be implemented by subclasses$"):
        base.allocate(1, stream=custody.LEGACY_DEFAULT_STREAM)


def test_subclass_of_builtin_overriding_deallocate_is_called(device, stream):
    """A Python subclass of a built-in that overrides deallocate gets it called for adopted
    memory (a built-in's own allocate frees with the built-in rule)."""

    class Counting(custody.DeviceMemoryResource):
        def __init__(self, *args):
            self.freed = []
            self.backing = {}

        def deallocate(self, ptr, size, *, stream):
            self.freed.append(ptr)
            self.backing.pop(ptr).close(stream=stream)

    mr = Counting(0)
    own = mr.allocate(64, stream=stream)
    own.close()
    assert mr.freed == []
    backing = custody.DeviceMemoryResource(0).allocate(64, stream=stream)
    ptr = backing.handle
    mr.backing[ptr] = backing
    del backing
    adopted = custody.Buffer.from_handle(ptr, 64, mr=mr, stream=stream)
    del adopted
    gc.collect()
    assert mr.freed == [ptr] and mr.backing == {}


def test_zero_byte_fills_and_copies_succeed_without_a_driver_call(device, stream, emu):
    """A fill or copy of zero bytes is a no-op, as in NumPy and CuPy: it succeeds and reaches
    no driver call (the call log, on the emulator), whatever the driver would say of a
    zero-length ``cuMemsetD8Async`` or ``cuMemcpyAsync``."""
    mr = custody.DeviceMemoryResource(0)
    empties = [mr.allocate(0, stream=stream), custody.Buffer.from_handle(0, 0),
               custody.ManagedBuffer.from_handle(0, 0)]
    real = mr.allocate(64, stream=stream)
    if emu is not None:
        emu.clear_calls()
        me = emu.thread_id()
    for z in empties:
        assert z.size == 0
        z.fill(1, stream=stream)
        z.fill(b"\x01\x02", stream=stream)
        z.fill(b"\x01\x02\x03\x04", stream=stream)
        for other in empties:
            z.copy_from(other, stream=stream)
            assert z.copy_to(other, stream=stream) is other
    if emu is not None:
        made = [c["function"] for c in emu.calls() if c.get("thread") == me]
        assert made == [], made
    else:
        print("call-log part skipped on a real driver: needs the emulator's call log")
    copied = empties[0].copy_to(stream=stream)
    assert copied.size == 0
    # The size checks still apply to zero bytes.
    with pytest.raises(ValueError, match="size mismatch"):
        empties[0].copy_to(real, stream=stream)
    with pytest.raises(ValueError, match="size mismatch"):
        real.copy_from(empties[1], stream=stream)
    for b in empties + [copied, real]:
        b.close()
