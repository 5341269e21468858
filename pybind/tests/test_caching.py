"""The opt-in caching resource, ``custody.CachingMemoryResource(upstream)``: a buffer closed or
dropped goes back to a bin of its deallocation stream, and the next allocation of its size class
on that stream gets the same memory with no driver call; another stream does not;
``set_deallocation_stream`` moves the block to the new stream's bin; a declared use is waited
for before the reuse; ``trim()`` and ``close()`` free everything through the upstream resource.
Runs on the emulator and on a GPU (addresses, sizes, statistics, a pool's used memory
everywhere; the call log and live allocations on the emulator)."""

import ctypes
import gc
import os

import pytest

import custody
from conftest import DRIVER, cuda_warnings, run_in_thread

# Every test here is about what a cache keeps; with CUSTODY_CACHING_PASS_THROUGH set (the GPU
# runner's compute-sanitizer mode sets it) a cache keeps nothing: test_caching_pass_through.py.
pytestmark = pytest.mark.skipif(
    os.environ.get("CUSTODY_CACHING_PASS_THROUGH", "") not in ("", "0"),
    reason="CUSTODY_CACHING_PASS_THROUGH is set, so caches pass everything through",
)


def used(mr):
    """The device pool's used memory once device 0's work is done."""
    custody.Device(0).sync()
    return mr.attributes.used_mem_current


@pytest.fixture
def pool(device):
    return custody.DeviceMemoryResource(0)


def test_a_same_stream_reuse_makes_no_driver_call(device, stream, pool, emu):
    base = used(pool)
    mr = custody.CachingMemoryResource(pool)
    assert mr.upstream is pool
    buf = mr.allocate(1000, stream=stream)
    assert buf.size == 1000, "the size asked for"
    assert buf.memory_resource is mr
    ptr = buf.handle
    if emu:
        block = [a for a in emu.allocations() if a["ptr"] == ptr]
        assert block and block[0]["size"] == 1024, "the block is the size class"
    buf.close()
    if emu:
        emu.clear_calls()
    again = mr.allocate(900, stream=stream)
    assert (again.handle, again.size) == (ptr, 900)
    again.close()
    dropped = mr.allocate(1024, stream=stream)
    assert dropped.handle == ptr
    del dropped
    gc.collect()
    if emu:
        mine = [c["function"] for c in emu.calls() if c["thread"] == emu.thread_id()]
        assert mine == [], mine
    stats = mr.stats
    assert stats == {
        "in_use_blocks": 0,
        "in_use_bytes": 0,
        "cached_blocks": 1,
        "cached_bytes": 1024,
        "hits": 2,
        "cross_stream_hits": 0,
        "misses": 1,
        "events_recorded": 0,
        "freed_blocks": 0,
        "out_of_memory_retries": 0,
    }
    if emu:
        emu.clear_calls()
    assert mr.trim() == {
        "freed_blocks": 1,
        "freed_bytes": 1024,
        "kept_blocks": 0,
        "kept_bytes": 0,
        "in_use_blocks": 0,
        "in_use_bytes": 0,
    }
    if emu:
        (free,) = emu.calls_to("cuMemFreeAsync")
        assert free["stream"] == stream.handle and free["result"] == 0
    assert mr.stats["cached_bytes"] == 0
    assert used(pool) == base, "trim gave everything back"


def test_another_stream_gets_a_new_block_and_set_deallocation_stream_moves_it(device, pool):
    base = used(pool)
    a, b = device.create_stream(), device.create_stream()
    mr = custody.CachingMemoryResource(pool)
    buf = mr.allocate(4096, stream=a)
    ptr = buf.handle
    buf.close()
    on_b = mr.allocate(4096, stream=b)
    assert on_b.handle != ptr, "a's only block stays a's"
    on_b.close()
    moved = mr.allocate(4096, stream=a)
    assert moved.handle == ptr
    b.wait(a)
    moved.set_deallocation_stream(b)
    moved.close()
    from_b = [mr.allocate(4096, stream=b) for _ in range(2)]
    assert ptr in [x.handle for x in from_b], "b's now"
    fresh = mr.allocate(4096, stream=a)
    assert fresh.handle != ptr, "no longer a's"
    assert mr.stats["cross_stream_hits"] == 0
    for x in from_b + [fresh]:
        x.close()
    mr.close()
    assert mr.is_closed
    assert used(pool) == base


def test_a_declared_use_is_waited_for_before_the_reuse(device, pool, emu):
    a, b = device.create_stream(), device.create_stream()
    mr = custody.CachingMemoryResource(pool)
    buf = mr.allocate(4096, stream=a)
    ptr = buf.handle
    buf.fill(0x5A, stream=a)
    b.wait(a)
    out = custody.LegacyPinnedMemoryResource().allocate(4096, stream=b)
    out.copy_from(buf, stream=b)
    buf.record_use(b)
    if emu:
        emu.clear_calls()
    buf.close()
    if emu:
        waits = [c for c in emu.calls_to("cuStreamWaitEvent") if c["result"] == 0]
        assert [w["stream"] for w in waits] == [a.handle], "a waits for b"
        assert emu.calls_to("cuMemFreeAsync") == [], "cached, not freed"
    again = mr.allocate(4096, stream=a)
    assert again.handle == ptr
    again.fill(0, stream=a)  # after b's copy, by stream order
    b.sync()
    import ctypes

    assert ctypes.string_at(out.handle, 4096) == b"\x5a" * 4096
    out.close()
    again.close()
    mr.close()


def test_close_frees_the_cache_and_buffers_still_out_free_later(device, stream, pool, emu):
    base = used(pool)
    mr = custody.CachingMemoryResource(pool)
    kept, out = mr.allocate(4096, stream=stream), mr.allocate(4096, stream=stream)
    ids = [emu.alloc_id(kept.handle), emu.alloc_id(out.handle)] if emu else []
    kept.close()
    mr.close()
    if emu:
        assert [emu.is_live(i) for i in ids] == [False, True]
    with pytest.raises(RuntimeError, match="closed"):
        mr.allocate(4096, stream=stream)
    out.close()
    if emu:
        assert not emu.is_live(ids[1])
    assert mr.stats["freed_blocks"] == 2
    mr.close()  # idempotent
    assert used(pool) == base


def test_a_buffer_dropped_on_another_thread_comes_back(device, stream, pool):
    mr = custody.CachingMemoryResource(pool)
    buf = mr.allocate(4096, stream=stream)
    ptr = buf.handle
    holder = [buf]
    del buf
    run_in_thread(holder.clear)
    gc.collect()
    assert mr.stats["cached_blocks"] == 1
    again = mr.allocate(4096, stream=stream)
    assert again.handle == ptr
    again.close()
    mr.trim()


def test_bad_input(device, stream, pool):
    with pytest.raises(TypeError):
        custody.CachingMemoryResource(None)
    with pytest.raises(TypeError):
        custody.CachingMemoryResource(object())

    class Mine(custody.MemoryResource):
        pass

    with pytest.raises(TypeError, match="built-in"):
        custody.CachingMemoryResource(Mine())
    mr = custody.CachingMemoryResource(pool)
    with pytest.raises(TypeError):
        mr.allocate(64)  # stream is required
    with pytest.raises(OverflowError):
        mr.allocate(-1, stream=stream)
    empty = mr.allocate(0, stream=stream)
    assert (empty.handle, empty.size) == (0, 0)
    assert mr.stats["misses"] == 0
    mr.close()


def test_a_lent_buffer_is_not_exportable_even_from_an_ipc_pool(device, stream):
    pool = custody.DeviceMemoryResource(0, custody.DeviceMemoryResourceOptions(ipc_enabled=True))
    mr = custody.CachingMemoryResource(pool)
    buf = mr.allocate(4096, stream=stream)
    with pytest.raises(RuntimeError):
        buf.ipc_descriptor
    buf.close()
    mr.close()


def raw_stream():
    """A stream made outside custody (as PyTorch, CuPy or JAX make theirs), in the current
    context: its handle as an int."""
    DRIVER.cuStreamCreate.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_uint]
    raw = ctypes.c_void_p()
    assert DRIVER.cuStreamCreate(ctypes.byref(raw), 1) == 0  # CU_STREAM_NON_BLOCKING
    return raw.value


def destroy_raw_stream(raw):
    DRIVER.cuStreamDestroy_v2.argtypes = [ctypes.c_void_p]
    assert DRIVER.cuStreamDestroy_v2(ctypes.c_void_p(raw)) == 0


def test_a_wrapped_streams_blocks_are_cached_and_reused(device, pool, emu):
    """``Stream.from_handle(int)`` (how a PyTorch, CuPy or JAX stream reaches custody) is cached
    on: the next allocation on it gets the closed buffer's block with no driver call. custody
    cannot keep such a stream alive, so the close records an event on it and nothing the cache
    does later names it: the stream can be destroyed while its block is cached, and the trim
    frees the block after that event on a stream of the cache's own."""
    raw = raw_stream()
    base = used(pool)
    mr = custody.CachingMemoryResource(pool)
    foreign = custody.Stream.from_handle(raw)
    buf = mr.allocate(4096, stream=foreign)
    ptr = buf.handle
    assert buf.memory_resource is mr
    buf.close()
    assert mr.stats["cached_blocks"] == 1
    if emu:
        emu.clear_calls()
    again = mr.allocate(4000, stream=foreign)
    assert (again.handle, again.size) == (ptr, 4000)
    if emu:
        mine = [c["function"] for c in emu.calls() if c["thread"] == emu.thread_id()]
        assert mine == [], mine
    again.close()
    stats = mr.stats
    assert (stats["hits"], stats["misses"]) == (1, 1), stats
    foreign.sync()
    del foreign, buf, again
    gc.collect()
    destroy_raw_stream(raw)
    if emu:
        emu.clear_calls()
    mr.trim()
    if emu:
        named = [c for c in emu.calls() if c["stream"] == raw]
        assert named == [], "the destroyed stream was named: %r" % named
    assert mr.stats["cached_blocks"] == 0
    assert used(pool) == base
    mr.close()


def test_a_reuse_after_a_wrapped_stream_is_destroyed_and_its_handle_reused_is_ordered(device, pool, emu):
    """The hazard RAPIDS rmm reported as rmm#649: blocks wait in a wrapped stream's bin, the
    stream is destroyed and a new stream gets its handle value (on the emulator by request; a
    real driver is given a few tries). The new stream is another stream: a block it takes is ordered after the old stream's
    work by the event recorded at the close (``cuStreamWaitEvent``), never by the value; the
    hazard checker sees the block's last free ordered after the old stream's fill."""
    base = used(pool)
    mr = custody.CachingMemoryResource(pool)
    old_raw = raw_stream()
    old = custody.Stream.from_handle(old_raw)
    bufs = [mr.allocate(4096, stream=old) for _ in range(2)]
    ptrs = [b.handle for b in bufs]
    for value, b in zip((0x11, 0x22), bufs):
        b.fill(value, stream=old)
        b.close()
    assert mr.stats["cached_blocks"] == 2
    del old, bufs, b
    gc.collect()
    destroy_raw_stream(old_raw)
    if emu:
        assert emu.reuse_stream_handle(old_raw)
        new_raw = raw_stream()
        assert new_raw == old_raw
    else:
        tries = []
        new_raw = raw_stream()
        while new_raw != old_raw and len(tries) < 16:
            tries.append(new_raw)
            new_raw = raw_stream()
        for other in tries:
            destroy_raw_stream(other)
    new = custody.Stream.from_handle(new_raw)
    if emu:
        emu.clear_calls()
    taken = mr.allocate(4096, stream=new)
    assert taken.handle in ptrs, "one of the old stream's blocks"
    if emu:
        waits = [c for c in emu.calls_to("cuStreamWaitEvent") if c["result"] == 0]
        assert [w["stream"] for w in waits] == [new_raw], waits
        assert emu.calls_to("cuStreamSynchronize") == [], "no host wait"
    taken.fill(0x33, stream=new)
    stats = mr.stats
    assert (stats["hits"], stats["misses"]) == (1, 2), stats
    taken.close()
    new.sync()
    del new, taken
    gc.collect()
    mr.trim()
    destroy_raw_stream(new_raw)
    assert used(pool) == base
    mr.close()


def test_a_block_freed_on_one_stream_serves_another_after_an_event_wait(device, pool, emu):
    """A block freed on stream ``a`` serves ``b`` once ``b`` waits for an event recorded on
    ``a`` (no host wait, no polling); ``a`` keeps its last cached block of the size."""
    a, b = device.create_stream(), device.create_stream()
    base = used(pool)
    mr = custody.CachingMemoryResource(pool)
    bufs = [mr.allocate(4096, stream=a) for _ in range(2)]
    ptrs = [x.handle for x in bufs]
    for x in bufs:
        x.fill(0x5A, stream=a)
        x.close()
    if emu:
        emu.clear_calls()
    on_b = mr.allocate(4096, stream=b)
    assert on_b.handle in ptrs
    if emu:
        records = [c["stream"] for c in emu.calls_to("cuEventRecord") if c["result"] == 0]
        waits = [c["stream"] for c in emu.calls_to("cuStreamWaitEvent") if c["result"] == 0]
        assert (records, waits) == ([a.handle], [b.handle])
        for host_wait in ("cuStreamSynchronize", "cuEventSynchronize", "cuCtxSynchronize",
                          "cuEventQuery", "cuStreamQuery"):
            assert emu.calls_to(host_wait) == [], host_wait
    kept = mr.allocate(4096, stream=a)
    assert kept.handle in ptrs and kept.handle != on_b.handle, "a keeps its last"
    on_b.fill(0, stream=b)
    on_b.close()
    kept.close()
    stats = mr.stats
    assert (stats["hits"], stats["misses"]) == (2, 2), stats
    mr.trim()
    assert used(pool) == base
    mr.close()


def test_a_closed_cache_refuses_allocations_of_one_byte_or_more(device, stream, pool):
    """After ``close()``: ``RuntimeError`` for one byte or more; zero bytes still give an empty
    buffer, which holds no memory (as every resource's ``allocate`` documents)."""
    mr = custody.CachingMemoryResource(pool)
    mr.close()
    with pytest.raises(RuntimeError, match="has been closed"):
        mr.allocate(1, stream=stream)
    empty = mr.allocate(0, stream=stream)
    assert (empty.handle, empty.size) == (0, 0)
    empty.close()


def test_a_cache_over_a_closed_pool_lends_what_it_holds_and_takes_no_new_block(device, stream):
    """A pool resource's ``close()`` is its object's: a cache over it still lends the blocks it
    holds, and a new block from the closed pool is refused in the pool's words."""
    pool = custody.DeviceMemoryResource(0, custody.DeviceMemoryResourceOptions())
    mr = custody.CachingMemoryResource(pool)
    mr.allocate(4096, stream=stream).close()
    pool.close()
    again = mr.allocate(4096, stream=stream)
    assert mr.stats["hits"] == 1
    with pytest.raises(RuntimeError, match="^DeviceMemoryResource has been closed$"):
        mr.allocate(1 << 20, stream=stream)
    again.close()
    mr.close()


def test_trim_says_what_it_kept_and_a_capturing_stream_is_said_once(device, pool, recorded_warnings):
    """A trim while a stream is being captured keeps that stream's blocks (a free there would
    join the capture) and says so, counts the buffers lent out, and frees the rest; an
    allocation on the capturing stream goes to the upstream (a pool refuses it) and the cache
    says once, as a CUDAWarning, that it does not cache such allocations."""
    a = device.create_stream()
    mr = custody.CachingMemoryResource(pool)
    gb = device.create_graph_builder()
    mr.allocate(4096, stream=gb.stream).close()
    mr.allocate(1000, stream=a).close()
    out = mr.allocate(4096, stream=a)
    gb.begin_building()
    trimmed = mr.trim()
    for _ in range(2):
        with pytest.raises(Exception):
            mr.allocate(4096, stream=gb.stream)
    gb.end_building()
    assert trimmed == {
        "freed_blocks": 1,
        "freed_bytes": 1024,
        "kept_blocks": 1,
        "kept_bytes": 4096,
        "in_use_blocks": 1,
        "in_use_bytes": 4096,
    }
    said = [str(w.message) for w in cuda_warnings(recorded_warnings)]
    assert len(said) == 1 and "captured" in said[0], said
    out.close()
    assert mr.trim()["freed_blocks"] == 2
    mr.close()
