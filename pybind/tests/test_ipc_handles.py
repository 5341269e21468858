"""Sharing pools and events with other processes as cuda.core 1.2 does: a pool resource's
``allocation_handle`` (an ``IPCAllocationHandle`` that owns its descriptor and pickles through
``multiprocessing``), the UUID naming a pool across processes, ``from_allocation_handle`` giving
back a pool the process has, and IPC events (``Event.ipc_descriptor`` and
``Event.from_ipc_descriptor``) opened in a spawned child, and a received buffer passed on to a
third process."""

import ctypes
import multiprocessing
import os
import pickle

import pytest

import custody

SIZE = 256


def test_allocation_handles(device, stream):
    mr = custody.DeviceMemoryResource(0, {"ipc_enabled": True, "max_size": 2**21})
    handle = mr.allocation_handle
    assert isinstance(handle, custody.IPCAllocationHandle)
    assert mr.allocation_handle is handle, "exported once and kept"
    assert handle.uuid == mr.uuid and mr.uuid is not None
    assert int(handle) == handle.handle >= 0
    fresh = mr.get_allocation_handle()
    assert fresh is not handle and fresh.handle != handle.handle and fresh.uuid == mr.uuid
    fd = fresh.handle
    os.fstat(fd)
    fresh.close()
    fresh.close()
    assert fresh.is_closed
    with pytest.raises(OSError):
        os.fstat(fd)
    with pytest.raises(RuntimeError, match="IPCAllocationHandle has been closed"):
        fresh.handle
    assert mr.is_handle_owned and not custody.DeviceMemoryResource(0).is_handle_owned
    plain = custody.DeviceMemoryResource(0)
    assert plain.uuid is None
    with pytest.raises(RuntimeError, match="^Memory resource is not IPC-enabled"):
        plain.allocation_handle
    buf = plain.allocate(64, stream=stream)
    with pytest.raises(RuntimeError, match="^Memory resource is not IPC-enabled"):
        buf.ipc_descriptor
    with pytest.raises(RuntimeError, match="^Memory resource is not IPC-enabled"):
        custody.Buffer.from_ipc_descriptor(plain, custody.IPCBufferDescriptor._init(b"", 0), stream=stream)
    buf.close()
    with pytest.raises(ValueError, match=r"Invalid allocation handle \(fd\) -1: must be non-negative"):
        custody.IPCAllocationHandle._init(-1, None)
    with pytest.raises(RuntimeError, match="cannot be instantiated directly"):
        custody.IPCAllocationHandle()


def test_descriptors_pickle_as_payload_and_size(device, stream):
    mr = custody.PinnedMemoryResource({"ipc_enabled": True, "max_size": 2**21})
    buf = mr.allocate(SIZE, stream=stream)
    descriptor = buf.ipc_descriptor
    payload, size = descriptor.__reduce__()[1]
    assert size == SIZE and len(payload) >= 64
    assert custody.IPCBufferDescriptor._init(payload, size) == descriptor
    assert pickle.loads(pickle.dumps(descriptor)) == descriptor
    assert custody.IPCBufferDescriptor.from_bytes(bytes(descriptor)) == descriptor
    with pytest.raises(RuntimeError, match="cannot be instantiated directly"):
        custody.IPCBufferDescriptor()
    with pytest.raises(TypeError, match="^Argument 'ipc_descriptor' has incorrect type"):
        custody.Buffer.from_ipc_descriptor(mr, buf, stream=stream)
    buf.close()


def _pool_child(handle, kind, descriptor, uuid_text, results):
    """Spawned: opens the pool from its handle, imports the buffer, writes it, reports."""
    try:
        device = custody.Device(0)
        device.set_current()
        stream = device.create_stream()
        def open_as(cls):
            if cls is custody.DeviceMemoryResource:
                return cls.from_allocation_handle(0, handle)
            return cls.from_allocation_handle(handle)

        mine = getattr(custody, kind)
        other = custody.PinnedMemoryResource if mine is custody.DeviceMemoryResource else custody.DeviceMemoryResource
        mr = open_as(mine)
        again = open_as(mine)
        try:
            open_as(other)
        except TypeError as error:
            wrong_kind = str(error)
        else:
            wrong_kind = None
        buf = custody.Buffer.from_ipc_descriptor(mr, descriptor, stream=stream)
        buf.fill(0x5C, stream=stream)
        stream.sync()
        try:
            mr.allocate(64, stream=stream)
        except TypeError as error:
            allocate_error = str(error)
        else:
            allocate_error = None
        buf.close()
        results.put(("ok", type(mr).__name__, str(mr.uuid), mr.is_mapped, again is mr, wrong_kind, allocate_error))
    except BaseException as error:  # noqa: BLE001 - sent back to the test
        results.put(("error", repr(error)))


@pytest.mark.parametrize("kind", ["DeviceMemoryResource", "PinnedMemoryResource"])
def test_an_allocation_handle_opens_the_pool_in_a_spawned_child(device, stream, kind):
    options = {"ipc_enabled": True, "max_size": 2**21}
    mr = custody.DeviceMemoryResource(0, options) if kind == "DeviceMemoryResource" else custody.PinnedMemoryResource(options)
    buf = mr.allocate(SIZE, stream=stream)
    buf.fill(0, stream=stream)
    stream.sync()
    ctx = multiprocessing.get_context("spawn")
    results = ctx.Queue()
    child = ctx.Process(
        target=_pool_child, args=(mr.allocation_handle, kind, buf.ipc_descriptor, str(mr.uuid), results)
    )
    child.start()
    outcome = results.get(timeout=120)
    child.join(timeout=120)
    assert outcome[0] == "ok", outcome
    _, opened, uuid_text, mapped, same, wrong_kind, allocate_error = outcome
    assert opened == kind and uuid_text == str(mr.uuid) and mapped
    assert same, "a pool the process has opened comes back"
    assert wrong_kind is not None and "from_allocation_handle" in wrong_kind
    assert allocate_error == "Cannot allocate from a mapped IPC-enabled memory resource"
    assert child.exitcode == 0
    staging = custody.LegacyPinnedMemoryResource().allocate(SIZE)
    staging.copy_from(buf, stream=stream)
    stream.sync()
    assert ctypes.string_at(staging.handle, SIZE) == b"\x5c" * SIZE, "the child wrote the buffer"
    staging.close()
    buf.close()


def _event_child(event, results):
    """Spawned: the event arrives pickled (opened from its descriptor); wait for it."""
    try:
        custody.Device(0).set_current()
        got = event  # unpickled as the process started
        got.sync()
        results.put(("ok", got.is_ipc_enabled, got.is_timing_enabled, got.is_blocking_sync,
                     got.device, got.context, got.is_done, bytes(got.ipc_descriptor.__reduce__()[1][0])))
    except BaseException as error:  # noqa: BLE001 - sent back to the test
        results.put(("error", repr(error)))


def test_ipc_events_open_in_a_spawned_child(device, stream):
    with pytest.raises(TypeError, match=r"^IPC-enabled events must be bound; use Stream.record for creation\.$"):
        device.create_event({"ipc_enabled": True})
    with pytest.raises(TypeError, match=r"^IPC-enabled events cannot use timing\.$"):
        stream.record(options={"ipc_enabled": True, "timing_enabled": True})
    event = stream.record(options=custody.EventOptions(ipc_enabled=True, blocking_sync=True))
    assert event.is_ipc_enabled and not event.is_timing_enabled and event.is_blocking_sync
    with pytest.raises(TypeError, match=r"^IPC-enabled events should not be re-recorded"):
        stream.record(event)
    descriptor = event.ipc_descriptor
    assert descriptor == event.ipc_descriptor and descriptor.is_blocking_sync
    ctx = multiprocessing.get_context("spawn")
    results = ctx.Queue()
    child = ctx.Process(target=_event_child, args=(event, results))
    child.start()
    outcome = results.get(timeout=120)
    child.join(timeout=120)
    assert outcome[0] == "ok", outcome
    _, ipc, timing, blocking, dev, context, done, reserved = outcome
    assert (ipc, timing, blocking) == (True, False, True)
    assert dev is None and context is None, "an opened event has no device or context here"
    assert done
    assert reserved == bytes(descriptor.__reduce__()[1][0]), "the descriptor it was opened from"
    assert child.exitcode == 0


def _forwarding_child(buffer, onward, done):
    """Spawned (B): the buffer arrives pickled with its pool; B passes it on to C and closes its
    own import at once (before the queue's feeder thread pickles it), then waits for C."""
    custody.Device(0).set_current()
    onward.put(buffer)
    buffer.close()
    done.wait(timeout=120)


def _receiving_child(onward, results, done):
    """Spawned (C): receives the buffer B forwarded, writes it, reports."""
    try:
        device = custody.Device(0)
        device.set_current()
        buffer = onward.get(timeout=120)
        stream = device.create_stream()
        buffer.fill(0x3A, stream=stream)
        stream.sync()
        results.put(("ok", type(buffer.memory_resource).__name__, buffer.memory_resource.is_mapped))
        buffer.close()
    except BaseException as error:  # noqa: BLE001 - sent back to the test
        results.put(("error", repr(error)))
    finally:
        done.set()


@pytest.mark.parametrize("kind", ["DeviceMemoryResource", "PinnedMemoryResource"])
def test_a_received_buffer_is_passed_on_to_a_third_process(device, stream, kind):
    """cuda.core's re-export: A's buffer goes to B, which forwards it to C and closes its own
    import; C writes it and A reads the bytes. A buffer closed without having been received
    still refuses to pickle."""
    options = {"ipc_enabled": True, "max_size": 2**21}
    mr = custody.DeviceMemoryResource(0, options) if kind == "DeviceMemoryResource" else custody.PinnedMemoryResource(options)
    buf = mr.allocate(SIZE, stream=stream)
    buf.fill(0, stream=stream)
    stream.sync()
    ctx = multiprocessing.get_context("spawn")
    onward, results, done = ctx.Queue(), ctx.Queue(), ctx.Event()
    b = ctx.Process(target=_forwarding_child, args=(buf, onward, done))
    c = ctx.Process(target=_receiving_child, args=(onward, results, done))
    b.start()
    c.start()
    outcome = results.get(timeout=120)
    b.join(timeout=120)
    c.join(timeout=120)
    assert outcome == ("ok", kind, True), outcome
    assert (b.exitcode, c.exitcode) == (0, 0)
    staging = custody.LegacyPinnedMemoryResource().allocate(SIZE)
    staging.copy_from(buf, stream=stream)
    stream.sync()
    assert ctypes.string_at(staging.handle, SIZE) == b"\x3a" * SIZE, "C wrote A's buffer"
    staging.close()
    buf.close()
    with pytest.raises(RuntimeError, match="^Buffer has been closed$"):
        pickle.dumps(buf)
