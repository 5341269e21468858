"""Declared use streams, ``Buffer.record_use(stream)`` (docs/decisions.md D12): a buffer read on
a stream other than its deallocation stream, with the use recorded, is freed after the read
(the hazard checker sees nothing); without the record the checker reports the unordered free.
Bad input raises and records nothing. Runs on the emulator and on a GPU (the bytes read back
everywhere; the hazard checker and the call log on the emulator)."""

import ctypes
import gc

import pytest

import custody
from conftest import RecordingResource, drain_until, run_in_thread

SIZE = 4096


def scene(device, mr):
    """``buf`` (its free on ``a``) filled on ``a``; ``b`` waits for the fill. Returns the
    streams, the buffer and ``out`` (pinned host memory ``b`` copies into)."""
    a, b = device.create_stream(), device.create_stream()
    buf = mr.allocate(SIZE, stream=a)
    buf.fill(0x5A, stream=a)
    b.wait(a)
    out = custody.LegacyPinnedMemoryResource().allocate(SIZE, stream=b)
    return a, b, buf, out


def read_back(out, b):
    b.sync()
    data = ctypes.string_at(out.handle, SIZE)
    out.close()
    return data


def waits_on(emu, stream):
    return [c for c in emu.calls_to("cuStreamWaitEvent") if c["stream"] == stream.handle]


def test_a_recorded_use_orders_the_free_after_the_read(device, emu, no_hazards):
    mr = custody.DeviceMemoryResource(0)
    a, b, buf, out = scene(device, mr)
    alloc = emu.alloc_id(buf.handle) if emu else None
    out.copy_from(buf, stream=b)
    assert buf.record_use(b) is None
    if emu:
        emu.clear_calls()
    del buf
    gc.collect()
    if emu:
        (free,) = emu.calls_to("cuMemFreeAsync", alloc=alloc)
        assert free["stream"] == a.handle and free["result"] == 0
        assert len(waits_on(emu, a)) == 1, "a waited for b once"
    assert read_back(out, b) == b"\x5a" * SIZE
    a.sync()


@pytest.mark.expect_hazards("unordered_free")
def test_without_record_use_the_checker_reports_the_unordered_free(device, emu):
    if emu is None:
        pytest.skip("needs the emulated driver's hazard checker (on a GPU the free races the read)")
    a, b, buf, out = scene(device, custody.DeviceMemoryResource(0))
    out.copy_from(buf, stream=b)
    buf.close()  # on a: not ordered after b's copy
    read_back(out, b)


def test_a_use_enqueued_after_the_record_is_covered(device, emu, no_hazards):
    """The event is recorded at the free, not at record_use: a later read on the same stream is
    ordered too."""
    a, b, buf, out = scene(device, custody.DeviceMemoryResource(0))
    buf.record_use(b)
    out.copy_from(buf, stream=b)
    buf.close()
    assert read_back(out, b) == b"\x5a" * SIZE


@pytest.mark.parametrize(
    "make",
    [
        lambda: custody.DeviceMemoryResource(0),
        lambda: custody.LegacyPinnedMemoryResource(),
        lambda: custody.ManagedMemoryResource(),
        lambda: custody.SynchronousMemoryResource(0),
        lambda: RecordingResource(0),
    ],
    ids=["pool", "pinned", "managed", "synchronous", "python-mr"],
)
def test_every_memory_kind_is_freed_after_a_recorded_use(device, emu, no_hazards, make):
    mr = make()
    a, b, buf, out = scene(device, mr)
    out.copy_from(buf, stream=b)
    buf.record_use(b)
    del buf
    gc.collect()
    custody.drain_deferred_cleanup()
    assert read_back(out, b) == b"\x5a" * SIZE
    a.sync()
    if isinstance(mr, RecordingResource):
        assert len(mr.calls) == 1 and mr.calls[0]["stream"] == a.handle


def test_uses_carry_over_set_deallocation_stream(device, emu, no_hazards):
    a, b, buf, out = scene(device, custody.DeviceMemoryResource(0))
    alloc = emu.alloc_id(buf.handle) if emu else None
    buf.record_use(b)
    c = device.create_stream()
    c.wait(a)
    buf.set_deallocation_stream(c)
    out.copy_from(buf, stream=b)
    if emu:
        emu.clear_calls()
    buf.close()
    if emu:
        (free,) = emu.calls_to("cuMemFreeAsync", alloc=alloc)
        assert free["stream"] == c.handle
        assert len(waits_on(emu, c)) == 1, "c waited for b"
    assert read_back(out, b) == b"\x5a" * SIZE
    c.sync()


def test_a_graph_retained_buffer_is_freed_after_a_recorded_use(device, emu, no_hazards):
    """Deferred cleanup: the graph's release frees on the cleanup worker, after b's read."""
    mr = custody.DeviceMemoryResource(0)
    a, b, buf, out = scene(device, mr)
    alloc = emu.alloc_id(buf.handle) if emu else None
    gb = device.create_graph_builder()
    gb.begin_building()
    gb.retain(buf)
    gb.end_building()
    graph = gb.complete()
    out.copy_from(buf, stream=b)
    buf.record_use(b)
    buf.close()
    if emu:
        assert emu.is_live(alloc), "kept by the graph"
    graph.close()
    gb.close()
    if emu:
        assert drain_until(lambda: not emu.is_live(alloc))
    assert read_back(out, b) == b"\x5a" * SIZE


def test_a_per_thread_use_freed_on_another_thread(device, emu, no_hazards):
    """A use on the per-thread default stream recorded here, the buffer dropped on another
    thread: the event is recorded on the legacy stream of the context, which waits for this
    thread's per-thread stream."""
    mr = custody.DeviceMemoryResource(0)
    a = device.create_stream()
    ptds = custody.PER_THREAD_DEFAULT_STREAM
    buf = mr.allocate(SIZE, stream=a)
    a.sync()
    out = custody.LegacyPinnedMemoryResource().allocate(SIZE, stream=ptds)
    buf.fill(0x21, stream=ptds)
    out.copy_from(buf, stream=ptds)
    buf.record_use(ptds)
    holder = [buf]
    del buf

    def drop():
        holder.clear()
        gc.collect()

    run_in_thread(drop)
    if emu:
        records = [c for c in emu.calls_to("cuEventRecord") if c["stream"] == 0x1]
        assert records, "the use's event is on the legacy stream"
    ptds.sync()
    assert ctypes.string_at(out.handle, SIZE) == b"\x21" * SIZE
    out.close()
    a.sync()


def test_bad_input_raises_and_records_nothing(device, emu, no_hazards):
    a, b = device.create_stream(), device.create_stream()
    buf = custody.DeviceMemoryResource(0).allocate(SIZE, stream=a)
    with pytest.raises(TypeError, match="requires a Stream, got None"):
        buf.record_use(None)
    with pytest.raises(TypeError):
        buf.record_use(5)
    with pytest.raises(TypeError):
        buf.record_use(object())
    b.close()
    with pytest.raises(RuntimeError):
        buf.record_use(b)
    if emu:
        emu.clear_calls()
    buf.close()
    if emu:
        assert waits_on(emu, a) == [], "nothing was recorded"
    with pytest.raises(RuntimeError, match="Buffer has been closed"):
        buf.record_use(a)


def test_a_default_stream_with_no_current_context_raises(device, emu, no_hazards):
    buf = custody.DeviceMemoryResource(0).allocate(SIZE, stream=device.create_stream())

    def record():
        with pytest.raises(RuntimeError):
            buf.record_use(custody.LEGACY_DEFAULT_STREAM)

    run_in_thread(record)
    buf.close()


@pytest.mark.skipif(custody.system.num_devices < 2, reason="needs two CUDA devices")
def test_a_stream_of_another_device_raises_value_error(device, emu, no_hazards):
    buf = custody.DeviceMemoryResource(0).allocate(SIZE, stream=device.create_stream())
    other = custody.Device(1)
    other.set_current()
    s1 = other.create_stream()
    device.set_current()
    with pytest.raises(ValueError):
        buf.record_use(s1)
    if emu:
        emu.clear_calls()
    buf.close()
    if emu:
        assert emu.calls_to("cuStreamWaitEvent") == [], "nothing was recorded"
    s1.close()


@pytest.mark.skipif(custody.system.num_devices < 2, reason="needs two CUDA devices")
def test_managed_memory_accepts_another_devices_stream(device, emu, no_hazards):
    """``cuMemAllocManaged`` memory is not bound to the device whose context made it: another
    device's stream is accepted as a use and as its deallocation stream (D12), as the managed
    pool's buffers are."""
    m = custody.LegacyManagedMemoryResource().allocate(SIZE, stream=device.create_stream())
    s1 = custody.Device(1).create_stream()
    device.set_current()
    assert m.record_use(s1) is None
    m.set_deallocation_stream(s1)
    if emu:
        alloc = emu.alloc_id(m.handle)
    m.close()
    custody.drain_deferred_cleanup()
    s1.sync()
    if emu:
        assert not emu.is_live(alloc)
    s1.close()


def test_a_buffer_that_frees_nothing_records_nothing(device, emu, no_hazards):
    a, b = device.create_stream(), device.create_stream()
    backing = custody.DeviceMemoryResource(0).allocate(SIZE, stream=a)
    view = custody.Buffer.from_handle(backing.handle, SIZE)
    view.record_use(b)
    if emu:
        emu.clear_calls()
    view.close()
    if emu:
        assert emu.calls_to("cuStreamWaitEvent") == [] and emu.calls_to("cuEventRecord") == []
    backing.close()
