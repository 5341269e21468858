"""Two devices: memory of device 1 freed on a thread where device 0's primary context
is current is freed in device 1's context, and device 0's stays current. Pool buffers (a stream
of device 1, or the legacy stream while device 1 is current), dropped and closed; cuMemAlloc and
pinned memory (the deferred free of docs/decisions.md D9); a Python memory resource's
deallocate; one pool per device; another device's deallocation stream refused; copies between
devices; a device pool's peer_accessible_by.

Observable everywhere: the context current afterwards (read from the driver), pool used memory,
bytes read back, what a Python resource's deallocate saw, warnings. On the emulator also the
context current during each free (call log). With one device every test skips with
"needs a second device (the driver sees N)".
"""

import ctypes
import gc

import pytest

import custody
from conftest import (
    RecordingResource,
    clear_current,
    cuda_warnings,
    current_context,
    run_in_thread,
)

pytestmark = pytest.mark.skipif(
    custody.system.num_devices < 2,
    reason=f"needs a second device (the driver sees {custody.system.num_devices})",
)

SIZE = 4096


def pattern(seed: int) -> bytes:
    return bytes(((i * 29) & 0xFF) ^ seed for i in range(SIZE))


def host_bytes(buf, stream):
    """The buffer's bytes, copied to pinned host memory and read there."""
    staging = custody.LegacyPinnedMemoryResource().allocate(buf.size, stream=stream)
    staging.copy_from(buf, stream=stream)
    stream.sync()
    data = ctypes.string_at(staging.handle, buf.size)
    staging.close()
    return data


def write(buf, data: bytes, stream):
    """Writes data into buf through pinned host memory, ordered on stream."""
    staging = custody.LegacyPinnedMemoryResource().allocate(len(data), stream=stream)
    ctypes.memmove(staging.handle, data, len(data))
    buf.copy_from(staging, stream=stream)
    stream.sync()
    staging.close()


def under_device_0(fn):
    """Runs fn on a fresh thread with device 0's primary context current; returns fn's result
    and the context current on that thread afterwards."""

    def body():
        custody.Device(0).set_current()
        result = fn()
        after = current_context()
        clear_current()
        return result, after

    return run_in_thread(body)


def own_pool(device_id: int):
    return custody.DeviceMemoryResource(device_id, custody.DeviceMemoryResourceOptions())


def used(mr, device_id: int) -> int:
    """The pool's used memory once device device_id's work is done."""
    custody.Device(device_id).sync()
    return mr.attributes.used_mem_current


def the_free(emu, function: str, alloc: int):
    """The one successful ``function`` call that freed allocation ``alloc`` (its identity)."""
    (call,) = emu.calls_to(function, alloc=alloc)
    assert call["result"] == 0, call
    return call


@pytest.fixture
def ctx():
    """The two primary contexts' raw handles; the calling thread is left with no context."""
    yield custody.Device(0).context.handle, custody.Device(1).context.handle
    custody.drain_deferred_cleanup()
    gc.collect()
    clear_current()


@pytest.mark.parametrize("how", ["stream", "legacy"])
@pytest.mark.parametrize("end", ["drop", "close"])
def test_device_1_pool_buffer_freed_under_device_0(ctx, emu, recorded_warnings, how, end):
    ctx0, ctx1 = ctx
    mr = own_pool(1)
    if how == "stream":
        s1 = custody.Device(1).create_stream()
        buf = mr.allocate(SIZE, stream=s1)
    else:
        custody.Device(1).set_current()
        buf = mr.allocate(SIZE, stream=custody.LEGACY_DEFAULT_STREAM)
        s1 = custody.Device(1).create_stream()
        custody.Device(1).sync()
        clear_current()
    assert buf.device_id == 1
    write(buf, pattern(3), s1)
    assert host_bytes(buf, s1) == pattern(3)
    assert used(mr, 1) >= SIZE
    ptr = buf.handle
    alloc = emu.alloc_id(ptr) if emu else None
    holder = [buf]
    del buf
    if emu:
        emu.clear_calls()

    def finish():
        if end == "close":
            holder[0].close()
        holder.clear()
        gc.collect()

    _, after = under_device_0(finish)
    assert after == ctx0, "device 0's context current again"
    assert used(mr, 1) == 0, "freed into device 1's pool"
    assert cuda_warnings(recorded_warnings) == []
    if emu:
        free = the_free(emu, "cuMemFreeAsync", alloc)
        if how == "stream":
            # D2: a created stream's free switches nothing: device 0's context stays current.
            assert free["context"] == ctx0, "freed without a context switch"
        else:
            assert free["context"] == ctx1, "freed with device 1's context current"
        assert not emu.is_live(alloc)


@pytest.mark.parametrize("kind", ["synchronous", "legacy_pinned"])
def test_device_1_synchronous_memory_dropped_under_device_0(ctx, emu, recorded_warnings, kind):
    ctx0, ctx1 = ctx
    s1 = custody.Device(1).create_stream()
    if kind == "synchronous":
        mr, free_call = custody.SynchronousMemoryResource(1), "cuMemFree_v2"
    else:
        mr, free_call = custody.LegacyPinnedMemoryResource(), "cuMemFreeHost"
    buf = mr.allocate(SIZE, stream=s1)
    write(buf, pattern(5), s1)
    assert host_bytes(buf, s1) == pattern(5)
    ptr = buf.handle
    alloc = emu.alloc_id(ptr) if emu else None
    holder = [buf]
    del buf
    if emu:
        emu.clear_calls()

    def drop():
        holder.clear()
        gc.collect()

    _, after = under_device_0(drop)
    assert after == ctx0
    custody.Device(0).set_current()
    custody.drain_deferred_cleanup()
    assert current_context() == ctx0, "the drain left device 0 current"
    assert cuda_warnings(recorded_warnings) == []
    if emu:
        (record,) = [c for c in emu.calls_to("cuEventRecord") if c["stream"] == s1.handle]
        assert record["context"] == ctx1, "the drop's event is device 1's"
        free = the_free(emu, free_call, alloc)
        assert free["context"] == ctx1, "freed with device 1's context current"
        assert not emu.is_live(alloc)


def test_python_resource_deallocates_in_device_1s_context(ctx, emu, recorded_warnings):
    ctx0, ctx1 = ctx
    s1 = custody.Device(1).create_stream()
    rec = RecordingResource(1)
    buf = rec.allocate(SIZE, stream=s1)
    ptr = buf.handle
    holder = [buf]
    del buf

    def drop():
        holder.clear()
        gc.collect()

    _, after = under_device_0(drop)
    assert after == ctx0
    assert [(c["ptr"], c["stream"], c["context"]) for c in rec.calls] == [(ptr, s1.handle, ctx1)]
    assert rec.live == {}
    assert cuda_warnings(recorded_warnings) == []


def test_each_device_has_its_own_pool(ctx, emu):
    mr0, mr1 = custody.DeviceMemoryResource(0), custody.DeviceMemoryResource(1)
    assert mr0.handle != mr1.handle
    s0, s1 = custody.Device(0).create_stream(), custody.Device(1).create_stream()
    base0, base1 = used(mr0, 0), used(mr1, 1)
    big = 1 << 20
    on1 = mr1.allocate(big, stream=s1)
    assert on1.device_id == 1
    assert used(mr1, 1) >= base1 + big
    assert used(mr0, 0) == base0
    on0 = mr0.allocate(big // 2, stream=s0)
    assert used(mr0, 0) >= base0 + big // 2
    on0.close()
    on1.close()
    assert (used(mr0, 0), used(mr1, 1)) == (base0, base1)
    with pytest.raises(ValueError, match="wrong device"):
        own_pool(1).allocate(SIZE, stream=s0)


def test_another_devices_stream_is_refused_as_deallocation_stream(ctx, emu):
    ctx0, ctx1 = ctx
    s0, s1 = custody.Device(0).create_stream(), custody.Device(1).create_stream()
    mr = own_pool(1)
    buf = mr.allocate(SIZE, stream=s1)
    write(buf, pattern(9), s1)
    ptr = buf.handle
    alloc = emu.alloc_id(ptr) if emu else None
    if emu:
        emu.clear_calls()
    with pytest.raises(ValueError, match="wrong device"):
        buf.set_deallocation_stream(s0)
    with pytest.raises(ValueError, match="wrong device"):
        buf.close(stream=s0)
    custody.Device(0).set_current()
    with pytest.raises(ValueError, match="wrong device"):
        buf.set_deallocation_stream(custody.LEGACY_DEFAULT_STREAM)
    assert current_context() == ctx0
    clear_current()
    assert not buf.is_closed and buf.handle == ptr
    assert host_bytes(buf, s1) == pattern(9)
    assert used(mr, 1) >= SIZE
    if emu:
        assert emu.calls_to("cuMemFreeAsync", alloc=alloc) == []
    # The old recipe is still in force: closed under device 0, freed on s1 in device 1.
    under_device_0(buf.close)
    assert used(mr, 1) == 0
    if emu:
        free = the_free(emu, "cuMemFreeAsync", alloc)
        # D2: on a created stream, no switch: device 0's context stays current for the free.
        assert (free["context"], free["stream"]) == (ctx0, s1.handle)


def test_copies_between_devices(ctx, emu):
    s0, s1 = custody.Device(0).create_stream(), custody.Device(1).create_stream()
    mr0, mr1 = own_pool(0), own_pool(1)
    on0 = mr0.allocate(SIZE, stream=s0)
    on1 = mr1.allocate(SIZE, stream=s1)
    write(on0, pattern(11), s0)
    on0.copy_to(on1, stream=s1)
    assert host_bytes(on1, s1) == pattern(11)
    write(on1, pattern(12), s1)
    on0.copy_from(on1, stream=s0)
    assert host_bytes(on0, s0) == pattern(12)
    copy = on1.copy_to(stream=s1)
    assert copy.device_id == 1
    assert host_bytes(copy, s1) == pattern(12)
    on1.fill(0xA5, stream=s1)
    s1.sync()
    on1.copy_to(on0, stream=s0)
    assert host_bytes(on0, s0) == bytes([0xA5]) * SIZE
    for b in (on0, on1, copy):
        b.close()
    assert (used(mr0, 0), used(mr1, 1)) == (0, 0)


def test_peer_accessible_by_grants_and_revokes_in_one_call(emu):
    """DeviceMemoryResource.peer_accessible_by (cuda.core 1.2): device 1 given read-write access
    to device 0's pool, seen by cuMemPoolGetAccess, and revoked."""
    custody.Device(0).set_current()
    mr = custody.DeviceMemoryResource(0, custody.DeviceMemoryResourceOptions(max_size=2**21))
    peer = custody.Device(1)
    assert peer not in mr.peer_accessible_by
    if emu is not None:
        emu.clear_calls()
    mr.peer_accessible_by = {peer, 0}
    if emu is not None:
        assert [c["function"] for c in emu.calls()].count("cuMemPoolSetAccess") == 1
    assert peer in mr.peer_accessible_by and 1 in mr.peer_accessible_by
    assert list(mr.peer_accessible_by) == [peer]
    mr.peer_accessible_by.discard(1)
    assert set(mr.peer_accessible_by) == set()
    mr.peer_accessible_by.add(peer)
    assert set(mr.peer_accessible_by) == {peer}
    mr.peer_accessible_by = []
    assert len(mr.peer_accessible_by) == 0
    mr.close()


def test_a_graph_is_not_launched_on_another_devices_stream(ctx, emu):
    """A device-0 graph launched or uploaded on a device-1 stream raises
    ValueError before any driver call (it was accepted without a word)."""
    s0, s1 = custody.Device(0).create_stream(), custody.Device(1).create_stream()
    buf = custody.DeviceMemoryResource(0).allocate(SIZE, stream=s0)
    s0.sync()
    gb = s0.create_graph_builder().begin_building()
    buf.fill(7, stream=gb)
    gb.end_building()
    graph = gb.complete()
    if emu:
        emu.clear_calls()
    with pytest.raises(ValueError, match="wrong device"):
        graph.launch(s1)
    with pytest.raises(ValueError, match="wrong device"):
        graph.upload(s1)
    if emu:
        assert emu.calls_to("cuGraphLaunch") == [] and emu.calls_to("cuGraphUpload") == []
    graph.launch(s0)
    assert host_bytes(buf, s0) == bytes([7]) * SIZE
    graph.close()
    gb.close()
    buf.close()
