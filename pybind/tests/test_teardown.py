"""Teardown: which context and stream a free runs in, whichever thread (or the cyclic GC, or the
cleanup worker) drops the last reference (docs/reference-notes.md section 5, scenarios 23-26, 35,
36, 40, 50, 51, 67; docs/decisions.md D2, D6, D9)."""

import ctypes
import gc
import threading

import pytest

import custody
from conftest import (
    DRIVER,
    RecordingResource,
    cuda_warnings,
    current_context,
    needs_two_devices,
    run_in_thread,
)


def drop_on_thread(holder: list):
    """Empties holder (the last references) on a fresh thread with no context; returns the
    context current on that thread afterwards."""

    def drop():
        holder.clear()
        gc.collect()
        return current_context()

    return run_in_thread(drop)


def test_cross_thread_drop_without_context(device, emu, no_hazards, recorded_warnings):
    """23: dropped on a thread that never set a context: set A, free, set NULL; no warning."""
    mr = custody.DeviceMemoryResource(0)
    buf = mr.allocate(512, stream=custody.LEGACY_DEFAULT_STREAM)
    ptr = buf.handle
    alloc = emu.alloc_id(ptr) if emu else None
    a = device.context.handle
    holder = [buf]
    del buf
    if emu:
        emu.clear_calls()
    assert drop_on_thread(holder) == 0
    assert cuda_warnings(recorded_warnings) == []
    if emu:
        calls = [c for c in emu.calls() if c["function"] in ("cuCtxSetCurrent", "cuMemFreeAsync")]
        assert [c["function"] for c in calls] == ["cuCtxSetCurrent", "cuMemFreeAsync", "cuCtxSetCurrent"]
        assert calls[1]["context"] == a and calls[1]["alloc"] == alloc and calls[1]["result"] == 0
        assert calls[2]["context"] == a  # restoring NULL happens while A is current
        assert not emu.is_live(alloc)


@needs_two_devices
def test_drop_under_another_context_restores_it(device, emu, no_hazards):
    """24: dropped on a thread whose current context is B (with a deeper stack): freed in A,
    B current again afterwards, the stack below untouched."""
    mr = custody.DeviceMemoryResource(0)
    buf = mr.allocate(64, stream=custody.LEGACY_DEFAULT_STREAM)
    ptr = buf.handle
    alloc = emu.alloc_id(ptr) if emu else None
    a = device.context.handle
    b = custody.Device(1).context.handle
    holder = [buf]
    del buf
    DRIVER.cuCtxPushCurrent_v2.argtypes = [ctypes.c_void_p]
    DRIVER.cuCtxPopCurrent_v2.argtypes = [ctypes.POINTER(ctypes.c_void_p)]

    def on_thread():
        assert DRIVER.cuCtxPushCurrent_v2(ctypes.c_void_p(a)) == 0
        assert DRIVER.cuCtxPushCurrent_v2(ctypes.c_void_p(b)) == 0
        holder.clear()
        after = current_context()
        popped = ctypes.c_void_p()
        assert DRIVER.cuCtxPopCurrent_v2(ctypes.byref(popped)) == 0
        below = current_context()
        assert DRIVER.cuCtxPopCurrent_v2(ctypes.byref(popped)) == 0
        return after, below

    after, below = run_in_thread(on_thread)
    assert (after, below) == (b, a)
    if emu:
        (free,) = emu.calls_to("cuMemFreeAsync", alloc=alloc)
        assert free["context"] == a


def test_same_context_needs_no_switch(device, emu, no_hazards):
    """25: with the recipe's context current at teardown, no cuCtxSetCurrent at all."""
    mr = custody.DeviceMemoryResource(0)
    buf = mr.allocate(64, stream=custody.LEGACY_DEFAULT_STREAM)
    if emu:
        emu.clear_calls()
    del buf
    gc.collect()
    assert current_context() == device.context.handle
    if emu:
        assert emu.calls_to("cuCtxSetCurrent") == []
        assert len(emu.calls_to("cuMemFreeAsync")) == 1


def test_created_stream_free_runs_without_a_context(device, stream, emu, no_hazards):
    """26, decided by D2 (changed): a created stream identifies its context, so its free on a
    thread with no context makes no context current (docs/driver-facts.md F4)."""
    mr = custody.DeviceMemoryResource(0)
    buf = mr.allocate(64, stream=stream)
    ptr = buf.handle
    alloc = emu.alloc_id(ptr) if emu else None
    holder = [buf]
    del buf
    assert drop_on_thread(holder) == 0
    if emu:
        (free,) = emu.calls_to("cuMemFreeAsync", alloc=alloc)
        assert free["context"] == 0
        assert free["stream"] == stream.handle and free["result"] == 0


def test_ptds_freed_on_another_thread_is_ordered_on_the_legacy_stream(
    device, emu, no_hazards, recorded_warnings
):
    """36, decided by D6: PTDS recorded and used (not synchronised) on T1, dropped on T2 (no
    context): the free runs in A on the legacy stream (0x1), which waits for T1's per-thread
    stream (docs/driver-facts.md F14); no warning, no unordered free."""
    mr = custody.DeviceMemoryResource(0)
    buf = mr.allocate(64, stream=custody.PER_THREAD_DEFAULT_STREAM)
    buf.fill(7, stream=custody.PER_THREAD_DEFAULT_STREAM)
    ptr = buf.handle
    alloc = emu.alloc_id(ptr) if emu else None
    holder = [buf]
    del buf
    assert drop_on_thread(holder) == 0
    assert cuda_warnings(recorded_warnings) == []
    if emu:
        (free,) = emu.calls_to("cuMemFreeAsync", alloc=alloc)
        assert free["stream"] == 0x1 and free["context"] == device.context.handle
        assert free["result"] == 0


def test_synchronous_resource_needs_no_context(device, emu, recorded_warnings):
    """40: SynchronousMemoryResource allocates with no current context (even on PTDS), records
    the legacy stream bound to the primary context, and a free on another thread warns nothing.
    D9: the drop does not block; the free runs on the cleanup worker (or a drain)."""
    mr = custody.SynchronousMemoryResource(0)

    def allocate():
        assert current_context() == 0
        return mr.allocate(256, stream=custody.PER_THREAD_DEFAULT_STREAM)

    buf = run_in_thread(allocate)
    ptr = buf.handle
    alloc = emu.alloc_id(ptr) if emu else None
    assert buf.is_device_accessible and buf.device_id == 0
    holder = [buf]
    del buf
    if emu:
        emu.clear_calls()
    assert drop_on_thread(holder) == 0
    custody.drain_deferred_cleanup()
    assert cuda_warnings(recorded_warnings) == []
    if emu:
        (free,) = emu.calls_to("cuMemFree_v2", alloc=alloc)
        assert free["context"] == device.context.handle and free["result"] == 0
        assert emu.calls_to("cuStreamSynchronize") == [], "a drop never waits on the GPU"
        assert not emu.is_live(alloc)


@pytest.mark.parametrize("recorded", ["token", "created"])
def test_python_deallocate_runs_in_the_recipe_context(device, recorded):
    """50, decided by D2: a Python MR's deallocate, run on a thread with no context, sees the
    recipe's context current (for a default token and for a created stream alike), runs on the
    dropping thread, and the thread has no context afterwards."""
    rec = RecordingResource()
    s = device.create_stream() if recorded == "created" else custody.LEGACY_DEFAULT_STREAM
    buf = rec.allocate(64, stream=s)
    holder = [buf]
    del buf
    seen = {}

    def drop():
        seen["thread"] = threading.get_ident()
        holder.clear()
        return current_context()

    assert run_in_thread(drop) == 0
    (call,) = rec.calls
    assert call["context"] == device.context.handle
    assert call["thread"] == seen["thread"]
    assert rec.live == {}
    if recorded == "created":
        s.close()


def test_legacy_pinned_dropped_without_context(device, emu, no_hazards):
    """51, with D9: a LegacyPinned buffer allocated with A current and dropped on a context-less
    thread is freed (cuMemFreeHost) in A after the stream's work, without blocking the drop."""
    mr = custody.LegacyPinnedMemoryResource()
    buf = mr.allocate(4096, stream=custody.LEGACY_DEFAULT_STREAM)
    ptr = buf.handle
    alloc = emu.alloc_id(ptr) if emu else None
    assert buf.is_host_accessible and buf.is_device_accessible
    assert buf.__dlpack_device__() == (3, 0)
    holder = [buf]
    del buf
    assert drop_on_thread(holder) == 0
    custody.drain_deferred_cleanup()
    if emu:
        (free,) = emu.calls_to("cuMemFreeHost", alloc=alloc)
        assert free["context"] == device.context.handle and free["result"] == 0


def test_cyclic_gc_on_a_thread_without_context(device, emu, no_hazards, recorded_warnings):
    """67: a GC collection on a context-less thread that collects cycles holding buffers frees
    them like case 23."""
    mr = custody.DeviceMemoryResource(0)
    allocs = []

    class Node:
        pass

    for _ in range(8):
        a, b = Node(), Node()
        a.other, b.other = b, a
        a.buf = mr.allocate(128, stream=custody.LEGACY_DEFAULT_STREAM)
        allocs.append(emu.alloc_id(a.buf.handle) if emu else None)
        del a, b

    def collect():
        gc.collect()
        return current_context()

    assert run_in_thread(collect) == 0
    assert cuda_warnings(recorded_warnings) == []
    if emu:
        assert not any(emu.is_live(alloc) for alloc in allocs)
        for alloc in allocs:
            (free,) = emu.calls_to("cuMemFreeAsync", alloc=alloc)
            assert free["context"] == device.context.handle


def test_many_threads_drop_concurrently(device, emu, no_hazards, recorded_warnings):
    """Drops from many threads at once: every buffer freed once, the pool back to empty."""
    mr = custody.DeviceMemoryResource(0, custody.DeviceMemoryResourceOptions())
    buffers = [mr.allocate(1024, stream=custody.LEGACY_DEFAULT_STREAM) for _ in range(64)]
    assert mr.attributes.used_mem_current >= 64 * 1024
    barrier = threading.Barrier(8)
    chunks = [buffers[i::8] for i in range(8)]
    del buffers

    def worker(chunk):
        barrier.wait()
        while chunk:
            chunk.pop()
        return current_context()

    threads = [threading.Thread(target=worker, args=(c,)) for c in chunks]
    del chunks
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    custody.LEGACY_DEFAULT_STREAM.sync()
    assert mr.attributes.used_mem_current == 0
    assert cuda_warnings(recorded_warnings) == []


def test_concurrent_close_frees_once(device, emu, no_hazards):
    """Close is atomic: of many threads closing one buffer, exactly one frees."""
    mr = custody.DeviceMemoryResource(0)
    for _ in range(10):
        buf = mr.allocate(64, stream=custody.LEGACY_DEFAULT_STREAM)
        # The pool hands the address out again each round (docs/driver-facts.md F18): follow
        # the allocation by its identity.
        alloc = emu.alloc_id(buf.handle) if emu else None
        barrier = threading.Barrier(4)

        def close():
            barrier.wait()
            buf.close()

        threads = [threading.Thread(target=close) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert buf.is_closed
        if emu:
            assert len(emu.calls_to("cuMemFreeAsync", alloc=alloc)) == 1


def test_python_resource_buffer_freed_by_many_threads(device, recorded_warnings):
    """A Python MR's deallocate called from many threads at once (GIL held only for each call)."""
    rec = RecordingResource()
    buffers = [rec.allocate(64, stream=custody.LEGACY_DEFAULT_STREAM) for _ in range(32)]
    chunks = [buffers[i::4] for i in range(4)]
    del buffers
    threads = [threading.Thread(target=lambda c=c: c.clear()) for c in chunks]
    del chunks
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(rec.calls) == 32
    assert {c["context"] for c in rec.calls} == {device.context.handle}
    assert rec.live == {}
    assert cuda_warnings(recorded_warnings) == []
