"""Pickling buffers of IPC-enabled pools to a spawned process (docs/reference-notes.md section 5,
scenario 64), closing pool resources (section 3.4) and the resource checks of
``from_ipc_descriptor`` (scenario 65)."""

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
        descriptor = queue.get(timeout=60)
        # 65: a closed (mapped) resource refuses imports.
        mr = buf.memory_resource
        mr.close()
        try:
            custody.Buffer.from_ipc_descriptor(mr, descriptor, stream=stream)
        except RuntimeError as error:
            closed_error = str(error)
        else:
            closed_error = None
        mapped, mr_mapped = buf.is_mapped, buf.memory_resource.is_mapped
        # The imported allocation's identity (a pool hands freed addresses out again).
        alloc = EMU.alloc_id(buf.handle) if EMU is not None else None
        buf.close()
        second.close()
        staging.close()
        free = None
        hazards = []
        if EMU is not None:
            (free,) = EMU.calls_to("cuMemFreeAsync", alloc=alloc)
            hazards = EMU.hazards()
        results.put(
            ("ok", before, ctx, data, same_mr, mapped, mr_mapped, free, hazards, closed_error)
        )
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
        queue.put(bytes(other.ipc_descriptor))
        outcome = results.get(timeout=120)
    finally:
        child.join(timeout=120)
    assert outcome[0] == "ok", outcome[1]
    _, before, child_ctx, data, same_mr, mapped, mr_mapped, free, hazards, closed_error = outcome
    assert closed_error == f"{type(mr).__name__} has been closed"
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
        # Freeing what it allocated still works: the closed state is this object's, the Rust
        # resource behind it has none.
        buf.close()
        stream.sync()
        assert mr.attributes.used_mem_current == 0
    # The default pool of a device closes as well (this object only).
    default = custody.DeviceMemoryResource(0)
    default.close()
    assert default.is_closed and not custody.DeviceMemoryResource(0).is_closed


def test_from_ipc_descriptor_checks_its_resource(device, stream):
    """65: a non-IPC pool resource / a closed one / a resource that is no pool: RuntimeError /
    RuntimeError / TypeError (the closed *imported* resource is in the spawned child above)."""
    mr = custody.DeviceMemoryResource(0, custody.DeviceMemoryResourceOptions(ipc_enabled=True))
    buf = mr.allocate(64, stream=stream)
    descriptor = buf.ipc_descriptor
    plain = custody.DeviceMemoryResource(0, custody.DeviceMemoryResourceOptions())
    with pytest.raises(RuntimeError):
        custody.Buffer.from_ipc_descriptor(plain, descriptor, stream=stream)
    closed = custody.DeviceMemoryResource(0, custody.DeviceMemoryResourceOptions(ipc_enabled=True))
    closed.close()
    with pytest.raises(RuntimeError):
        custody.Buffer.from_ipc_descriptor(closed, descriptor, stream=stream)
    for other in (custody.SynchronousMemoryResource(0), custody.LegacyPinnedMemoryResource(), None):
        with pytest.raises(TypeError):
            custody.Buffer.from_ipc_descriptor(other, descriptor, stream=stream)
    buf.close()
