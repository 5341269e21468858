"""An imported buffer used on a stream its free is not ordered after, then closed at once: the
pattern of cuda.core 1.2's own worker-pool and send-buffers IPC tests (a spawned process
unpickles a buffer, so imports it with ``stream=default_stream()``, fills it on a new
non-blocking stream and closes it without a synchronisation). ``close()`` of an import waits for
every stream of the recipe's context before the unmap, so the fill has run by then; on an H200
that fill ran after the unmap and the process lost its context (``CUDA_ERROR_ILLEGAL_ADDRESS``;
docs/cuda-core-compat.md, "The H200-only failures"). The emulator's hazard checker reports such
a free as ``unordered_free``."""

import ctypes
import multiprocessing

import pytest

import custody
from conftest import EMU

NBUFFERS = 4
NBYTES = 64


def _child(queue, results):
    """Spawned: for each buffer, a fresh stream and a fresh source, the fill, the close."""
    try:
        filled = 0
        for seed in range(NBUFFERS):
            buf = queue.get(timeout=60)  # imported on default_stream(), bound to device 0
            device = custody.Device(0)
            device.set_current()
            stream = device.create_stream()  # non-blocking: no order with the legacy stream
            source = custody.LegacyPinnedMemoryResource().allocate(NBYTES, stream=stream)
            source.fill(0x40 + seed, stream=stream)
            buf.copy_from(source, stream=stream)
            buf.close()  # no synchronisation before it, as in cuda.core's tests
            stream.sync()
            source.close()
            stream.close()
            filled += 1
        device.sync()
        hazards = EMU.hazards() if EMU is not None else []
        results.put(("ok", filled, hazards))
    except BaseException as error:  # noqa: BLE001 - sent back to the test
        results.put(("error", repr(error)))


def test_an_import_used_on_another_stream_and_closed_at_once(device, stream):
    mr = custody.DeviceMemoryResource(
        0, custody.DeviceMemoryResourceOptions(ipc_enabled=True, max_size=2**21)
    )
    buffers = [mr.allocate(NBYTES, stream=stream) for _ in range(NBUFFERS)]
    for buf in buffers:
        buf.fill(0, stream=stream)
    stream.sync()
    ctx = multiprocessing.get_context("spawn")
    queue, results = ctx.Queue(), ctx.Queue()
    child = ctx.Process(target=_child, args=(queue, results))
    child.start()
    try:
        for buf in buffers:
            queue.put(buf)
        outcome = results.get(timeout=120)
    finally:
        child.join(timeout=120)
        if child.is_alive():
            child.kill()
    assert outcome[0] == "ok", outcome[1]
    _, filled, hazards = outcome
    assert filled == NBUFFERS
    assert hazards == [], hazards
    assert child.exitcode == 0
    staging = custody.LegacyPinnedMemoryResource().allocate(NBYTES, stream=stream)
    for seed, buf in enumerate(buffers):
        staging.copy_from(buf, stream=stream)
        stream.sync()
        assert _bytes(staging) == bytes([0x40 + seed]) * NBYTES, seed
        buf.close()
    staging.close()
    mr.close()


def _bytes(buf):
    return ctypes.string_at(buf.handle, buf.size)


def _import_in_this_process(device, stream):
    """A 4096-byte buffer of an IPC pool and an import of it in this process (the pool opened
    again from its bare file descriptor, which names no pool this process knows): the emulator
    allows a process to import what it exported; a real driver was not asked."""
    mr = custody.DeviceMemoryResource(
        0, custody.DeviceMemoryResourceOptions(ipc_enabled=True, max_size=2**21)
    )
    exported = mr.allocate(4096, stream=stream)
    exported.fill(0, stream=stream)
    stream.sync()
    handle = mr.get_allocation_handle()
    mapped = custody.DeviceMemoryResource.from_allocation_handle(0, handle.handle)
    assert mapped.is_mapped
    imported = custody.Buffer.from_ipc_descriptor(mapped, exported.ipc_descriptor, stream=stream)
    return mr, exported, handle, mapped, imported


@pytest.mark.skipif(EMU is None, reason="one-process IPC (the emulator's) and its hazard checker")
@pytest.mark.parametrize("how", ["close()", "close(stream=)"])
def test_closing_an_import_through_python_waits_for_a_fill_pending_on_another_stream(
    device, stream, how
):
    """The Python close of an import takes the one close path the Rust close takes, with its
    wait for the recipe's context before the unmap: a fill still pending on another stream (not
    declared with ``record_use``) has run before the mapping goes, and the hazard checker
    (the ``no_hazards`` fixture) sees no unordered free."""
    mr, exported, handle, mapped, imported = _import_in_this_process(device, stream)
    other = device.create_stream()  # non-blocking: nothing orders it with `stream`
    alloc = EMU.alloc_id(imported.handle)
    imported.fill(0x5A, stream=other)
    start = len(EMU.calls())
    if how == "close()":
        imported.close()
    else:
        imported.close(stream=stream)
    calls = EMU.calls()[start:]
    (free,) = [c for c in calls if c["function"] == "cuMemFreeAsync" and c.get("alloc") == alloc]
    assert free["result"] == 0, free
    at = calls.index(free)
    assert any(c["function"] == "cuCtxSynchronize" for c in calls[:at]), (
        "the close did not wait for the context before the unmap"
    )
    assert EMU.hazards() == [], EMU.hazards()
    staging = custody.LegacyPinnedMemoryResource().allocate(4096, stream=stream)
    staging.copy_from(exported, stream=stream)
    stream.sync()
    assert _bytes(staging) == bytes([0x5A]) * 4096
    staging.close()
    other.close()
    exported.close()
    handle.close()
    mapped.close()
    mr.close()
