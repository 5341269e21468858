"""Pickling buffers of IPC-enabled pools to a spawned process (section 5, scenario 64), closing
pool resources (section 3.4) and the resource checks of ``from_ipc_descriptor`` (scenario 65)."""

import ctypes
import multiprocessing
import pickle

import pytest

import custody
from conftest import EMU, current_context


def _child(queue, results):
    """Runs in a spawned process: no context is current until the unpickle makes one."""
    try:
        before = current_context()
        buf = queue.get(timeout=60)  # unpickled here: the pool, then the import
        ctx = current_context()
        stream = custody.default_stream()
        staging = custody.LegacyPinnedMemoryResource().allocate(buf.size, stream=stream)
        staging.copy_from(buf, stream=stream)
        stream.sync()
        data = ctypes.string_at(staging.handle, buf.size)
        second = queue.get(timeout=60)  # a second buffer of the same pool: opened once
        same_mr = second.memory_resource is buf.memory_resource
        ptr, mapped, mr_mapped = buf.handle, buf.is_mapped, buf.memory_resource.is_mapped
        buf.close()
        second.close()
        staging.close()
        free = None
        hazards = []
        if EMU is not None:
            (free,) = EMU.calls_to("cuMemFreeAsync", ptr)
            hazards = EMU.hazards()
        results.put(("ok", before, ctx, data, same_mr, mapped, mr_mapped, free, hazards))
    except BaseException as error:  # noqa: BLE001 - sent back to the test
        results.put(("error", repr(error)))


@pytest.mark.parametrize("kind", ["device", "pinned"])
def test_a_pickled_buffer_is_imported_in_a_spawned_child(device, stream, kind):
    """64: the child has no context; unpickling makes the MR's device (device 0 for a pinned
    pool) current and imports on default_stream() bound to it; the child reads the parent's
    bytes and frees its import; the parent then closes its own buffer."""
    if kind == "device":
        mr = custody.DeviceMemoryResource(0, custody.DeviceMemoryResourceOptions(ipc_enabled=True))
    else:
        mr = custody.PinnedMemoryResource(custody.PinnedMemoryResourceOptions(ipc_enabled=True))
    buf = mr.allocate(4096, stream=stream)
    other = mr.allocate(64, stream=stream)
    buf.fill(0x5C, stream=stream)
    stream.sync()
    ctx = multiprocessing.get_context("spawn")
    queue, results = ctx.Queue(), ctx.Queue()
    child = ctx.Process(target=_child, args=(queue, results))
    child.start()
    try:
        queue.put(buf)
        queue.put(other)
        outcome = results.get(timeout=120)
    finally:
        child.join(timeout=120)
    assert outcome[0] == "ok", outcome[1]
    _, before, child_ctx, data, same_mr, mapped, mr_mapped, free, hazards = outcome
    assert before == 0 and child_ctx != 0
    assert data == b"\x5c" * 4096
    assert same_mr and mapped and mr_mapped
    if EMU is not None:
        # Freed in the child's context on its default stream, with nothing unordered.
        assert free["result"] == 0 and free["context"] == child_ctx, free
        assert hazards == [], hazards
    assert child.exitcode == 0
    # Round trip in this process: the same resource object comes back.
    assert pickle.loads(pickle.dumps(mr)) is mr
    buf.close()
    other.close()


def test_pickling_refuses_closed_and_non_ipc_buffers(device, stream):
    mr = custody.DeviceMemoryResource(0, custody.DeviceMemoryResourceOptions(ipc_enabled=True))
    buf = mr.allocate(64, stream=stream)
    buf.close()
    with pytest.raises(RuntimeError, match="has been closed"):
        pickle.dumps(buf)
    plain = custody.DeviceMemoryResource(0, custody.DeviceMemoryResourceOptions())
    buf = plain.allocate(64, stream=stream)
    with pytest.raises(RuntimeError, match="ipc"):
        pickle.dumps(buf)
    with pytest.raises(RuntimeError, match="ipc_enabled"):
        pickle.dumps(plain)
    buf.close()
    sync_buf = custody.SynchronousMemoryResource(0).allocate(64, stream=stream)
    with pytest.raises(TypeError):
        pickle.dumps(sync_buf)
    sync_buf.close()
    view = custody.Buffer.from_handle(0x1000, 64)
    with pytest.raises(TypeError):
        pickle.dumps(view)
    mr.close()
    with pytest.raises(RuntimeError, match="DeviceMemoryResource has been closed"):
        pickle.dumps(mr)


def test_a_closed_pool_resource(device, stream):
    """3.4: close() stops allocate (RuntimeError "... has been closed") and exports; deallocate
    and the buffers already made keep working; close is idempotent."""
    for mr in (
        custody.DeviceMemoryResource(0, custody.DeviceMemoryResourceOptions(ipc_enabled=True)),
        custody.PinnedMemoryResource(custody.PinnedMemoryResourceOptions(ipc_enabled=True)),
    ):
        name = type(mr).__name__
        assert not mr.is_closed
        buf = mr.allocate(256, stream=stream)
        mr.close()
        mr.close()
        assert mr.is_closed
        with pytest.raises(RuntimeError, match=f"^{name} has been closed$"):
            mr.allocate(64, stream=stream)
        with pytest.raises(RuntimeError, match="has been closed"):
            mr.get_allocation_handle()
        buf.fill(7, stream=stream)
        staging = custody.LegacyPinnedMemoryResource().allocate(256, stream=stream)
        staging.copy_from(buf, stream=stream)
        stream.sync()
        assert ctypes.string_at(staging.handle, 256) == b"\x07" * 256
        staging.close()
        # Freeing what it allocated still works (memory/tests/resources.rs frees a pointer
        # with a closed resource's deallocate).
        buf.close()
        stream.sync()
        assert mr.attributes.used_mem_current == 0
    # The default pool of a device closes as well (this object only).
    default = custody.DeviceMemoryResource(0)
    default.close()
    assert default.is_closed and not custody.DeviceMemoryResource(0).is_closed
