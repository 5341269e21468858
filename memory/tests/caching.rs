//! The opt-in caching resource (`CachingMemoryResource`): a same-stream reuse makes no driver
//! call and hands the same block out again; another stream never gets it; a
//! `set_deallocation_stream` moves the block to the new stream's bin; declared uses
//! (docs/decisions.md D12) are ordered before the block is binned; trims, closes and an
//! out-of-memory retry free what is cached through the upstream resource's own frees; default-
//! stream tokens and captures pass through. Runs on the emulator and on a real driver: the
//! addresses handed out, the statistics, a pool's used memory and the bytes read back are
//! asserted everywhere; the call log, live allocations, hazards and fault injection on the
//! emulator (a test that needs fault injection says so and returns on a real driver).

mod common;

use std::sync::Arc;

use common::*;
use handles::{
    begin_capture, end_capture, ContextHandle, CudaErrorCode, EventFlags, EventHandle, HandleError,
    StreamHandle,
};
use memory::{
    Buffer, CachingMemoryResource, CachingStats, DeviceMemoryResource, DeviceMemoryResourceOptions,
    MemoryError, MemoryResource, SynchronousMemoryResource,
};

fn cache_over_device_pool() -> Arc<CachingMemoryResource> {
    CachingMemoryResource::new(DeviceMemoryResource::new(0).expect("device 0's pool"))
}

fn allocate(mr: &Arc<CachingMemoryResource>, size: usize, stream: &StreamHandle) -> Buffer {
    Arc::clone(mr).allocate(size, stream).expect("allocate")
}

/// Whether this process's caches cache: every test here is about what a cache keeps, and with
/// `CUSTODY_CACHING_PASS_THROUGH` set (the GPU runner's compute-sanitizer mode sets it) a cache
/// keeps nothing, so each test says it skips then (`caching_pass_through.rs` tests that mode).
fn caches_or_skip() -> bool {
    if CachingMemoryResource::passes_through() {
        eprintln!(
            "skipped: {} is set, so caches pass everything through",
            CachingMemoryResource::PASS_THROUGH_ENV
        );
        return false;
    }
    true
}

/// The live emulator allocations among `ids`.
fn live(ids: &[AllocationId]) -> Option<usize> {
    with_emulator(|emu| ids.iter().filter(|id| emu.is_live(**id)).count())
}

#[test]
fn a_same_stream_reuse_makes_no_driver_call_and_reports_the_requested_size() {
    let _serial = start();
    if !caches_or_skip() {
        return;
    }
    let base = device_used();
    let s = stream_on(0);
    let mr = cache_over_device_pool();
    let first = allocate(&mr, 1000, &s);
    assert_eq!(first.size(), 1000, "the size asked for");
    let ptr = first.ptr();
    let alloc = alloc_of(ptr);
    with_emulator(|emu| {
        let block = emu.allocation_at(ptr).expect("live");
        assert_eq!(block.size, 1024, "the block is the size class");
    });
    first.close().unwrap();
    assert_eq!(live(&[alloc]).unwrap_or(1), 1, "cached, not freed");

    let from = mark();
    let again = allocate(&mr, 900, &s);
    let closed_again = {
        assert_eq!(again.ptr(), ptr, "the same block, same stream");
        assert_eq!(again.size(), 900);
        again.close()
    };
    closed_again.unwrap();
    let dropped = allocate(&mr, 1024, &s);
    assert_eq!(dropped.ptr(), ptr);
    drop(dropped);
    with_emulator(|emu| {
        let calls = emu.names_on(tid(), from);
        assert!(
            calls.is_empty(),
            "reuse and give-back call nothing: {calls:?}"
        );
    });
    assert_eq!(
        mr.stats(),
        CachingStats {
            in_use_blocks: 0,
            in_use_bytes: 0,
            cached_blocks: 1,
            cached_bytes: 1024,
            hits: 2,
            cross_stream_hits: 0,
            misses: 1,
            events_recorded: 0,
            freed_blocks: 0,
            out_of_memory_retries: 0,
        }
    );

    let from = mark();
    mr.trim().unwrap();
    with_emulator(|emu| {
        let free = emu.only_call("cuMemFreeAsync", alloc, from);
        assert_eq!(free.stream, Some(s.raw() as u64), "freed on its stream");
        assert!(!emu.is_live(alloc));
    });
    let stats = mr.stats();
    assert_eq!((stats.cached_blocks, stats.cached_bytes), (0, 0));
    assert_eq!(stats.freed_blocks, 1);
    assert_eq!(device_used(), base, "trim gave everything back to the pool");
    assert_no_hazards();
}

#[test]
fn another_stream_or_another_size_class_takes_a_new_block() {
    let _serial = start();
    if !caches_or_skip() {
        return;
    }
    let base = device_used();
    let (a, b) = (stream_on(0), stream_on(0));
    let mr = cache_over_device_pool();
    let on_a = allocate(&mr, 4096, &a);
    let ptr = on_a.ptr();
    on_a.close().unwrap();
    let on_b = allocate(&mr, 4096, &b);
    assert_ne!(on_b.ptr(), ptr, "a block freed on a is not handed out on b");
    let bigger = allocate(&mr, 8192, &a);
    assert_ne!(bigger.ptr(), ptr, "another size class");
    let stats = mr.stats();
    assert_eq!((stats.hits, stats.misses), (0, 3));
    assert_eq!((stats.in_use_blocks, stats.cached_blocks), (2, 1));
    let (ids, ptrs) = (
        [alloc_of(ptr), alloc_of(on_b.ptr()), alloc_of(bigger.ptr())],
        [on_b.ptr(), bigger.ptr()],
    );
    on_b.close().unwrap();
    bigger.close().unwrap();
    assert_eq!(mr.stats().cached_blocks, 3);
    let again = allocate(&mr, 4000, &b);
    assert_eq!(again.ptr(), ptrs[0], "b's own block");
    mr.trim().unwrap();
    assert_eq!(live(&ids).unwrap_or(1), 1, "the one lent out stays");
    drop(again);
    assert_eq!(mr.stats().in_use_blocks, 0, "the dropped one came back");
    assert_eq!(mr.stats().cached_blocks, 1);
    mr.trim().unwrap();
    assert_eq!(live(&ids).unwrap_or(0), 0);
    assert_eq!(device_used(), base);
    assert_no_hazards();
}

#[test]
fn set_deallocation_stream_moves_the_block_to_the_new_streams_bin() {
    let _serial = start();
    if !caches_or_skip() {
        return;
    }
    let base = device_used();
    let (a, b) = (stream_on(0), stream_on(0));
    let mr = cache_over_device_pool();
    let buffer = allocate(&mr, 4096, &a);
    let ptr = buffer.ptr();
    let alloc = alloc_of(ptr);
    buffer.fill(7u8, &a).unwrap();
    // The caller orders a's work before b's, as set_deallocation_stream asks (D4).
    let filled = EventHandle::create(&a.context().unwrap(), EventFlags::DISABLE_TIMING).unwrap();
    filled.record(&a).unwrap();
    b.wait_event(&filled).unwrap();
    buffer.set_deallocation_stream(&b).unwrap();
    drop(buffer);
    let on_a = allocate(&mr, 4096, &a);
    assert_ne!(on_a.ptr(), ptr, "no longer a's");
    let on_b = allocate(&mr, 4096, &b);
    assert_eq!(on_b.ptr(), ptr, "b's now");
    assert_eq!(read(&on_b, &b), vec![7u8; 4096], "the same memory");
    on_a.close().unwrap();
    on_b.close().unwrap();
    let from = mark();
    mr.trim().unwrap();
    with_emulator(|emu| {
        let free = emu.only_call("cuMemFreeAsync", alloc, from);
        assert_eq!(
            free.stream,
            Some(b.raw() as u64),
            "the block's recipe followed the buffer's"
        );
    });
    assert_eq!(device_used(), base);
    assert_no_hazards();
}

/// A use declared on b is ordered before the block re-enters a's bin: a waits for b at the
/// give-back, so a's next allocation (and the block's eventual free) follow b's read.
#[test]
fn a_declared_use_is_ordered_before_the_block_is_reused() {
    let _serial = start();
    if !caches_or_skip() {
        return;
    }
    let base = device_used();
    let (a, b) = (stream_on(0), stream_on(0));
    let mr = cache_over_device_pool();
    let out = DeviceMemoryResource::new(0)
        .unwrap()
        .allocate(4096, &b)
        .unwrap();
    let buffer = allocate(&mr, 4096, &a);
    let (ptr, alloc) = (buffer.ptr(), alloc_of(buffer.ptr()));
    buffer.fill(0x5au8, &a).unwrap();
    let filled = EventHandle::create(&a.context().unwrap(), EventFlags::DISABLE_TIMING).unwrap();
    filled.record(&a).unwrap();
    b.wait_event(&filled).unwrap();
    buffer.copy_to(&out, &b).unwrap();
    buffer.record_use(&b).unwrap();
    let from = mark();
    drop(buffer);
    with_emulator(|emu| {
        let waits: Vec<_> = emu
            .calls_named("cuStreamWaitEvent", from)
            .into_iter()
            .filter(|c| c.result == 0)
            .collect();
        assert_eq!(waits.len(), 1, "{waits:?}");
        assert_eq!(waits[0].stream, Some(a.raw() as u64), "a waits for b");
        assert!(emu.calls_named("cuMemFreeAsync", from).is_empty(), "cached");
    });
    let reused = allocate(&mr, 4096, &a);
    assert_eq!(reused.ptr(), ptr);
    reused.fill(0u8, &a).unwrap(); // after b's read, by stream order
    assert_eq!(
        read(&out, &b),
        vec![0x5a; 4096],
        "b read what a wrote first"
    );
    reused.close().unwrap();
    out.close().unwrap();
    mr.close().unwrap();
    with_emulator(|emu| {
        assert!(!emu.is_live(alloc));
        assert_eq!(emu.hazards_for(alloc), vec![]);
    });
    assert_eq!(device_used(), base);
    assert_no_hazards();
}

#[test]
fn close_frees_the_cache_and_buffers_still_out_free_when_they_go() {
    let _serial = start();
    if !caches_or_skip() {
        return;
    }
    let base = device_used();
    let s = stream_on(0);
    let mr = cache_over_device_pool();
    let (kept, out) = (allocate(&mr, 4096, &s), allocate(&mr, 4096, &s));
    let ids = [alloc_of(kept.ptr()), alloc_of(out.ptr())];
    kept.close().unwrap();
    mr.close().unwrap();
    assert!(mr.is_closed());
    assert_eq!(
        live(&ids).unwrap_or(1),
        1,
        "the cached one is freed, the one out is not"
    );
    let refused = mr.allocate(4096, &s).unwrap_err();
    assert!(
        matches!(
            refused,
            MemoryError::ResourceClosed {
                resource: "CachingMemoryResource"
            }
        ),
        "{refused}"
    );
    out.fill(1u8, &s).unwrap();
    let from = mark();
    out.close().unwrap();
    with_emulator(|emu| {
        let free = emu.only_call("cuMemFreeAsync", ids[1], from);
        assert_eq!(free.stream, Some(s.raw() as u64));
    });
    let stats = mr.stats();
    assert_eq!(
        (stats.in_use_blocks, stats.cached_blocks, stats.freed_blocks),
        (0, 0, 2)
    );
    mr.close().unwrap(); // idempotent
    assert_eq!(device_used(), base);
    assert_no_hazards();
}

/// The pool's limit refuses a new block (`CUDA_ERROR_OUT_OF_MEMORY`) while a block of another
/// class sits in the cache: the cache is flushed and the allocation retried once.
#[test]
fn out_of_memory_flushes_the_cache_and_retries_once() {
    let _serial = start();
    if !caches_or_skip() {
        return;
    }
    let s = stream_on(0);
    let pool = DeviceMemoryResource::with_options(
        0,
        DeviceMemoryResourceOptions {
            // Whole granules everywhere known (resources.rs says why).
            max_size: 32 << 20,
            ipc_enabled: false,
        },
    )
    .unwrap();
    let mr = CachingMemoryResource::new(pool.clone());
    let big = allocate(&mr, 24 << 20, &s);
    let big_alloc = alloc_of(big.ptr());
    big.close().unwrap();
    assert_eq!(mr.stats().cached_bytes, 24 << 20);
    let other = allocate(&mr, 16 << 20, &s);
    let stats = mr.stats();
    assert_eq!(stats.out_of_memory_retries, 1);
    assert_eq!(stats.cached_bytes, 0, "flushed");
    assert_eq!(stats.in_use_bytes, 16 << 20);
    assert_eq!(live(&[big_alloc]).unwrap_or(0), 0);
    // Nothing cached to flush: the pool's refusal comes back.
    let refused = mr.allocate(24 << 20, &s).unwrap_err();
    assert!(
        matches!(&refused, MemoryError::Handle(e) if e.code() == Some(CudaErrorCode::OUT_OF_MEMORY)),
        "{refused}"
    );
    assert_eq!(mr.stats().out_of_memory_retries, 1, "not retried");
    other.close().unwrap();
    mr.close().unwrap();
    use memory::PoolMemoryResource;
    assert_eq!(pool_used(pool.pool()), 0);
    assert_no_hazards();
}

#[test]
fn an_injected_out_of_memory_is_retried_after_the_flush() {
    let _serial = start();
    if !caches_or_skip() {
        return;
    }
    let Some(emu) = emulator_or_skip("fault injection") else {
        return;
    };
    let base = device_used();
    let s = stream_on(0);
    let mr = cache_over_device_pool();
    let cached = allocate(&mr, 4096, &s);
    let cached_alloc = alloc_of(cached.ptr());
    drop(cached);
    assert!(emu.inject_fault("cuMemAllocFromPoolAsync", 1, CudaErrorCode::OUT_OF_MEMORY));
    let from = mark();
    let fresh = allocate(&mr, 100_000, &s);
    let names: Vec<String> = emu
        .names_on(tid(), from)
        .into_iter()
        .filter(|n| n.starts_with("cuMem"))
        .collect();
    assert_eq!(
        names,
        [
            "cuMemAllocFromPoolAsync",
            "cuMemFreeAsync",
            "cuMemAllocFromPoolAsync"
        ],
        "refused, flushed, retried"
    );
    assert!(!emu.is_live(cached_alloc));
    assert_eq!(mr.stats().out_of_memory_retries, 1);
    fresh.close().unwrap();
    mr.trim().unwrap();
    assert_eq!(device_used(), base);
    assert_no_hazards();
}

/// A free the driver refuses, through the cache's flush: returned by an explicit trim and
/// close, reported through the cleanup-error hook for a buffer dropped after the close.
#[test]
fn a_failed_free_of_a_block_is_returned_or_reported() {
    let _serial = start();
    if !caches_or_skip() {
        return;
    }
    let Some(emu) = emulator_or_skip("fault injection") else {
        return;
    };
    let s = stream_on(0);
    let mr = cache_over_device_pool();
    let cached = allocate(&mr, 4096, &s);
    let cached_ptr = cached.ptr();
    drop(cached);
    assert!(emu.inject_fault("cuMemFreeAsync", 1, CudaErrorCode::INVALID_VALUE));
    let error = mr.trim().unwrap_err();
    assert!(
        matches!(&error, MemoryError::Handle(HandleError::Driver(e)) if e.call == "cuMemFreeAsync"),
        "{error}"
    );
    assert_eq!(
        mr.stats().cached_blocks,
        0,
        "taken out of the bins either way"
    );
    // The refused free left the block allocated with nobody: the test frees it.
    unowned(cached_ptr, 4096).free_async(&s).unwrap();

    let dropped = allocate(&mr, 4096, &s);
    let dropped_ptr = dropped.ptr();
    mr.close().unwrap();
    assert!(emu.inject_fault("cuMemFreeAsync", 1, CudaErrorCode::INVALID_VALUE));
    drop(dropped);
    let errors = errors_for(dropped_ptr);
    assert_eq!(errors.len(), 1, "{errors:?}");
    unowned(dropped_ptr, 4096).free_async(&s).unwrap();

    let closed = CachingMemoryResource::new(DeviceMemoryResource::new(0).unwrap());
    let buffer = allocate(&closed, 4096, &s);
    let ptr = buffer.ptr();
    closed.close().unwrap();
    assert!(emu.inject_fault("cuMemFreeAsync", 1, CudaErrorCode::INVALID_VALUE));
    let error = buffer.close().unwrap_err();
    assert!(
        matches!(&error, MemoryError::Handle(HandleError::Driver(e)) if e.call == "cuMemFreeAsync"),
        "an explicit close returns it: {error}"
    );
    unowned(ptr, 4096).free_async(&s).unwrap();
    s.synchronize().unwrap();
    emu.clear_hazards();
}

#[test]
fn a_buffer_dropped_on_another_thread_goes_back_to_its_streams_bin() {
    let _serial = start();
    if !caches_or_skip() {
        return;
    }
    let base = device_used();
    let s = stream_on(0);
    let mr = cache_over_device_pool();
    let buffer = allocate(&mr, 4096, &s);
    let ptr = buffer.ptr();
    on_fresh_thread(move || drop(buffer));
    assert_eq!(mr.stats().cached_blocks, 1);
    let again = allocate(&mr, 4096, &s);
    assert_eq!(again.ptr(), ptr);
    again.close().unwrap();
    mr.trim().unwrap();
    assert_eq!(device_used(), base);
    assert_no_hazards();
}

/// The default streams are cached on, keyed by their context (and thread, for the per-thread
/// stream): a buffer closed on the legacy stream comes back on it with no allocation or free; a
/// buffer whose free moved to the legacy stream goes to its bin; a per-thread-stream buffer
/// dropped on another thread is freed, and so binned, on the legacy stream (D6), which waits for
/// the recording thread's per-thread work (docs/driver-facts.md F14).
#[test]
fn default_streams_are_cached_on() {
    let _serial = start();
    if !caches_or_skip() {
        return;
    }
    let base = device_used();
    let context = primary(0);
    context.make_current().unwrap();
    let mr = cache_over_device_pool();
    let legacy = StreamHandle::legacy();
    let buffer = allocate(&mr, 4096, &legacy);
    assert_eq!(
        buffer.memory_resource().unwrap().name(),
        "CachingMemoryResource"
    );
    let ptr = buffer.ptr();
    buffer.fill(1u8, &legacy).unwrap();
    buffer.close().unwrap();
    let from = mark();
    let again = allocate(&mr, 4096, &legacy);
    assert_eq!(again.ptr(), ptr, "the legacy stream's block");
    with_emulator(|emu| {
        let names: Vec<String> = emu
            .names_on(tid(), from)
            .into_iter()
            .filter(|n| {
                n.starts_with("cuMem") || n.starts_with("cuEvent") || n.starts_with("cuStream")
            })
            .collect();
        assert!(names.is_empty(), "{names:?}");
    });
    again.close().unwrap();

    // A lent buffer whose free is handed to the legacy stream goes to the legacy stream's bin.
    let s = stream_on(0);
    let lent = allocate(&mr, 8192, &s);
    let moved = lent.ptr();
    lent.fill(3u8, &s).unwrap();
    s.synchronize().unwrap();
    lent.set_deallocation_stream(&legacy).unwrap();
    lent.close().unwrap();
    let on_legacy = allocate(&mr, 8192, &legacy);
    assert_eq!(on_legacy.ptr(), moved);
    on_legacy.close().unwrap();

    // Recorded on this thread's per-thread stream, dropped on another thread: binned as the
    // legacy stream's.
    let per_thread = StreamHandle::per_thread();
    let ptds = allocate(&mr, 16384, &per_thread);
    let ptds_ptr = ptds.ptr();
    ptds.fill(5u8, &per_thread).unwrap();
    on_fresh_thread(move || drop(ptds));
    let after = allocate(&mr, 16384, &legacy);
    assert_eq!(after.ptr(), ptds_ptr, "binned under the legacy stream");
    after.close().unwrap();
    let stats = mr.stats();
    assert_eq!(
        (stats.hits, stats.misses, stats.cross_stream_hits),
        (3, 3, 0),
        "{stats:?}"
    );
    per_thread.synchronize().unwrap();
    mr.close().unwrap();
    ContextHandle::clear_current().unwrap();
    assert_eq!(device_used(), base);
    assert_no_hazards();
}

/// A stream being captured (a capture begun through custody) is not served from the bins: the
/// upstream pool decides, and refuses it (`MemoryError::StreamCapturing`).
#[test]
fn a_capturing_stream_is_not_served_from_the_bins() {
    let _serial = start();
    if !caches_or_skip() {
        return;
    }
    let s = stream_on(0);
    let mr = cache_over_device_pool();
    drop(allocate(&mr, 4096, &s));
    begin_capture(
        &s,
        handles::sys_types::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
    )
    .unwrap();
    let refused = mr.allocate(4096, &s);
    let graph = end_capture(&s).unwrap();
    assert!(
        matches!(refused, Err(MemoryError::StreamCapturing)),
        "{:?}",
        refused.map(|b| b.ptr())
    );
    drop(graph);
    assert_eq!(mr.stats().cached_blocks, 1, "still cached");
    mr.close().unwrap();
    assert_no_hazards();
}

/// Over a synchronous resource (`cuMemAlloc`): the same reuse, and the trim's free is the
/// resource's own (`cuStreamSynchronize`, `cuMemFree_v2`).
#[test]
fn a_cache_over_cumemalloc_reuses_and_frees_with_cumemfree() {
    let _serial = start();
    if !caches_or_skip() {
        return;
    }
    let s = stream_on(0);
    let mr = CachingMemoryResource::new(SynchronousMemoryResource::new(0).unwrap());
    let buffer = allocate(&mr, 3000, &s);
    let (ptr, alloc) = (buffer.ptr(), alloc_of(buffer.ptr()));
    buffer.fill(1u8, &s).unwrap();
    drop(buffer);
    let from = mark();
    let again = allocate(&mr, 3000, &s);
    assert_eq!(again.ptr(), ptr);
    drop(again);
    with_emulator(|emu| assert!(emu.names_on(tid(), from).is_empty()));
    let from = mark();
    mr.trim().unwrap();
    with_emulator(|emu| {
        assert_eq!(
            emu.names_on(tid(), from)
                .into_iter()
                .filter(|n| n != "cuCtxGetCurrent" && n != "cuCtxSetCurrent")
                .collect::<Vec<_>>(),
            ["cuStreamSynchronize", "cuMemFree_v2"]
        );
        assert!(!emu.is_live(alloc));
    });
    assert_no_hazards();
}

/// Over a resource of the caller's (adopted memory freed by its `deallocate`): the flush goes
/// through that `deallocate`, with the block's last stream.
#[test]
fn a_cache_over_a_callers_resource_frees_through_its_deallocate() {
    let _serial = start();
    if !caches_or_skip() {
        return;
    }
    let base = device_used();
    let (a, b) = (stream_on(0), stream_on(0));
    let upstream = RecordingResource::new(0);
    let mr = CachingMemoryResource::new(upstream.clone());
    let buffer = allocate(&mr, 512, &a);
    let ptr = buffer.ptr();
    a.synchronize().unwrap();
    buffer.set_deallocation_stream(&b).unwrap();
    drop(buffer);
    assert!(upstream.deallocations().is_empty(), "cached");
    mr.trim().unwrap();
    let freed = upstream.deallocations();
    assert_eq!(freed.len(), 1);
    assert_eq!((freed[0].ptr, freed[0].size), (ptr, 512));
    assert_eq!(
        freed[0].stream,
        b.raw() as usize,
        "the buffer's last stream"
    );
    assert_eq!(device_used(), base);
    assert_no_hazards();
}

/// `allocate_cached`, the path that never calls the driver: a hit as `allocate` gives it,
/// `None` (nothing done) for a miss, a token or a closed resource.
#[test]
fn allocate_cached_serves_hits_only() {
    let _serial = start();
    if !caches_or_skip() {
        return;
    }
    let base = device_used();
    let s = stream_on(0);
    let mr = cache_over_device_pool();
    assert!(
        memory::binding::allocate_cached(&mr, 4096, &s).is_none(),
        "nothing cached yet"
    );
    assert_eq!(
        mr.stats(),
        CachingStats::default(),
        "a miss that does nothing"
    );
    let first = allocate(&mr, 4096, &s);
    let ptr = first.ptr();
    drop(first);
    let from = mark();
    let hit = memory::binding::allocate_cached(&mr, 4000, &s).expect("a hit");
    assert_eq!((hit.ptr(), hit.size()), (ptr, 4000));
    assert!(std::ptr::eq(
        Arc::as_ptr(hit.memory_resource().unwrap()) as *const u8,
        Arc::as_ptr(&mr) as *const u8
    ));
    drop(hit);
    with_emulator(|emu| assert!(emu.names_on(tid(), from).is_empty()));
    assert!(memory::binding::allocate_cached(&mr, 4096, &StreamHandle::legacy()).is_none());
    assert!(memory::binding::allocate_cached(&mr, 0, &s).is_none());
    assert_eq!(mr.stats().hits, 1);
    mr.close().unwrap();
    assert!(
        memory::binding::allocate_cached(&mr, 4096, &s).is_none(),
        "closed"
    );
    assert_eq!(device_used(), base);
    assert_no_hazards();
}

/// A lent buffer freed while its stream is captured (a capture begun through custody) is handed
/// to the capture's graph (D11): its block comes back to the bin only once the graph is gone.
#[test]
fn a_buffer_freed_during_a_capture_comes_back_when_the_graph_goes() {
    let _serial = start();
    if !caches_or_skip() {
        return;
    }
    let base = device_used();
    let s = stream_on(0);
    let mr = cache_over_device_pool();
    let buffer = allocate(&mr, 4096, &s);
    let ptr = buffer.ptr();
    begin_capture(
        &s,
        handles::sys_types::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
    )
    .unwrap();
    buffer.fill(1u8, &s).unwrap();
    drop(buffer);
    let graph = end_capture(&s).unwrap();
    assert_eq!(mr.stats().cached_blocks, 0, "the graph holds it");
    assert_eq!(mr.stats().in_use_blocks, 1);
    drop(graph);
    handles::drain_deferred_cleanup();
    assert_eq!(mr.stats().cached_blocks, 1, "back once the graph is gone");
    let again = allocate(&mr, 4096, &s);
    assert_eq!(again.ptr(), ptr);
    again.close().unwrap();
    mr.close().unwrap();
    assert_eq!(device_used(), base);
    assert_no_hazards();
}

/// A cached block keeps its stream alive: the caller's last handle to the stream goes, the
/// stream is not destroyed while its block waits in the bin, and the trim's free on it is
/// followed by its `cuStreamDestroy`.
#[test]
fn a_cached_block_keeps_its_stream_alive_until_the_trim() {
    let _serial = start();
    if !caches_or_skip() {
        return;
    }
    let base = device_used();
    let mr = cache_over_device_pool();
    let s = stream_on(0);
    let raw = s.raw() as u64;
    drop(allocate(&mr, 4096, &s));
    let from = mark();
    drop(s);
    let destroyed = |from| {
        with_emulator(|emu| {
            emu.calls_named("cuStreamDestroy_v2", from)
                .into_iter()
                .filter(|c| c.stream == Some(raw))
                .count()
        })
    };
    assert_eq!(
        destroyed(from).unwrap_or(0),
        0,
        "the cached block holds the stream"
    );
    mr.trim().unwrap();
    with_emulator(|emu| {
        let names: Vec<String> = emu
            .calls_since(from)
            .into_iter()
            .filter(|c| c.stream == Some(raw))
            .map(|c| c.function)
            .collect();
        assert_eq!(names, ["cuMemFreeAsync", "cuStreamDestroy_v2"]);
    });
    assert_eq!(device_used(), base);
    assert_no_hazards();
}

/// Four threads allocate from one cache on streams of their own and hand half their buffers to
/// the next thread to drop: every block comes back to its stream's bin, the counters add up,
/// and the trim frees everything.
#[test]
fn threads_sharing_one_cache_keep_the_counters_exact() {
    let _serial = start();
    if !caches_or_skip() {
        return;
    }
    let base = device_used();
    let mr = cache_over_device_pool();
    const THREADS: usize = 4;
    const ROUNDS: usize = 200;
    let (senders, receivers): (Vec<_>, Vec<_>) = (0..THREADS)
        .map(|_| std::sync::mpsc::channel::<Buffer>())
        .unzip();
    let workers: Vec<_> = receivers
        .into_iter()
        .enumerate()
        .map(|(i, inbox)| {
            let mr = Arc::clone(&mr);
            let next = senders[(i + 1) % THREADS].clone();
            std::thread::spawn(move || {
                let s = stream_on(0);
                for round in 0..ROUNDS {
                    let size = 256 << (round % 4);
                    let buffer = mr.allocate(size, &s).expect("allocate");
                    assert_eq!(buffer.size(), size);
                    if round % 2 == 0 {
                        buffer.close().expect("close");
                    } else {
                        next.send(buffer).expect("the next thread");
                    }
                    while let Ok(theirs) = inbox.try_recv() {
                        drop(theirs);
                    }
                }
                drop(next);
                (inbox, s)
            })
        })
        .collect();
    drop(senders);
    let leftovers: Vec<_> = workers.into_iter().map(|w| w.join().unwrap()).collect();
    for (inbox, _) in &leftovers {
        while let Ok(theirs) = inbox.try_recv() {
            drop(theirs);
        }
    }
    let stats = mr.stats();
    assert_eq!(
        (stats.in_use_blocks, stats.in_use_bytes),
        (0, 0),
        "{stats:?}"
    );
    assert_eq!(stats.hits + stats.misses, (THREADS * ROUNDS) as u64);
    assert!(stats.hits > 0, "{stats:?}");
    assert_eq!(
        stats.cached_blocks as u64, stats.misses,
        "every block back in a bin"
    );
    mr.trim().unwrap();
    drop(leftovers);
    assert_eq!(mr.stats().cached_bytes, 0);
    assert_eq!(device_used(), base);
    assert_no_hazards();
}

/// Over an IPC-enabled pool, a lent buffer is not exportable: another process could not follow
/// its block's reuse.
#[test]
fn a_lent_buffer_is_not_exportable_even_from_an_ipc_pool() {
    let _serial = start();
    if !caches_or_skip() {
        return;
    }
    let s = stream_on(0);
    let pool = DeviceMemoryResource::with_options(
        0,
        DeviceMemoryResourceOptions {
            max_size: 0,
            ipc_enabled: true,
        },
    )
    .unwrap();
    let mr = CachingMemoryResource::new(pool);
    let buffer = allocate(&mr, 4096, &s);
    let refused = buffer.ipc_descriptor().unwrap_err();
    assert!(matches!(refused, MemoryError::Ipc(_)), "{refused}");
    buffer.close().unwrap();
    mr.close().unwrap();
    assert_no_hazards();
}

/// A raw stream made outside custody in the current context: what Python's
/// `Stream.from_handle(int)` wraps.
fn raw_stream() -> usize {
    let d = cuda_sys::driver().expect("driver");
    let mut raw: cuda_sys::types::CUstream = std::ptr::null_mut();
    // SAFETY: `raw` is a valid out-pointer; the context is current.
    let status = unsafe { (d.cuStreamCreate().expect("cuStreamCreate"))(&mut raw, 0) };
    assert_eq!(status, 0, "cuStreamCreate");
    raw as usize
}

/// Destroys a stream [`raw_stream`] made (its context current).
fn destroy_raw_stream(raw: usize) {
    let d = cuda_sys::driver().expect("driver");
    // SAFETY: the stream was made by `raw_stream` and is destroyed once.
    assert_eq!(
        unsafe { (d.cuStreamDestroy_v2)(raw as cuda_sys::types::CUstream) },
        0
    );
}

/// `raw` wrapped without an owner (`raw::wrap_stream(raw, None)`, Python's
/// `Stream.from_handle(int)`): a handle that does not keep the stream alive.
fn unpinned(raw: usize) -> StreamHandle {
    // SAFETY: every caller keeps the stream alive while this wrapper and every buffer whose free
    // is ordered on it are used (the caching resource's own references to it excepted: not
    // keeping it alive is what the tests show it copes with).
    let stream = unsafe { handles::raw::wrap_stream(raw, None) }.expect("wrap_stream");
    assert!(!stream.pins_its_stream());
    stream
}

/// A stream wrapped without an owner (Python's `Stream.from_handle(int)`, how a PyTorch, CuPy
/// or JAX stream reaches custody) is cached on: a buffer closed on it goes back to its bin and
/// the next allocation on it gets the same block with no driver call, the bytes the same memory.
/// The cache cannot keep the stream alive, so the free records an event on it (the last moment
/// the stream is known to live), and nothing the cache does later names the stream: the trim
/// frees the block after that event on a stream of the cache's own, and the wrapped stream can be
/// destroyed while the block waits.
#[test]
fn a_wrapped_streams_blocks_are_cached_and_reused() {
    let _serial = start();
    if !caches_or_skip() {
        return;
    }
    let base = device_used();
    let context = primary(0);
    context.make_current().unwrap();
    let raw = raw_stream();
    let mr = cache_over_device_pool();
    let foreign = unpinned(raw);
    let first = allocate(&mr, 4096, &foreign);
    let ptr = first.ptr();
    let alloc = alloc_of(ptr);
    assert!(
        std::ptr::eq(
            Arc::as_ptr(first.memory_resource().unwrap()) as *const u8,
            Arc::as_ptr(&mr) as *const u8
        ),
        "lent by the cache, not the upstream's own buffer"
    );
    first.fill(0x2au8, &foreign).unwrap();
    let from = mark();
    first.close().unwrap();
    with_emulator(|emu| {
        assert!(emu.is_live(alloc), "cached, not freed");
        let names = emu.names_on(tid(), from);
        assert!(
            names.iter().all(|n| !n.starts_with("cuMemFree")),
            "{names:?}"
        );
    });
    assert_eq!(mr.stats().cached_blocks, 1);

    let from = mark();
    let again = allocate(&mr, 4000, &foreign);
    assert_eq!((again.ptr(), again.size()), (ptr, 4000), "the same block");
    with_emulator(|emu| {
        let names = emu.names_on(tid(), from);
        assert!(
            names.is_empty(),
            "a same-stream reuse calls nothing: {names:?}"
        );
    });
    assert_eq!(read(&again, &foreign), vec![0x2a; 4000], "the same memory");
    again.close().unwrap();
    let stats = mr.stats();
    assert_eq!((stats.hits, stats.misses), (1, 1), "{stats:?}");

    // The stream goes while its block is cached: nothing may name it afterwards.
    foreign.synchronize().unwrap();
    drop(foreign);
    destroy_raw_stream(raw);
    let from = mark();
    mr.trim().unwrap();
    with_emulator(|emu| {
        let named: Vec<_> = emu
            .calls_since(from)
            .into_iter()
            .filter(|c| c.stream == Some(raw as u64))
            .collect();
        assert!(
            named.is_empty(),
            "the destroyed stream was named: {named:?}"
        );
        assert!(!emu.is_live(alloc), "freed by the trim");
    });
    assert_eq!(mr.stats().cached_blocks, 0);
    mr.close().unwrap();
    assert_eq!(device_used(), base, "everything freed");
    assert_no_hazards();
}

/// The hazard RAPIDS rmm reported as rmm#649: a block waits in the bin of a wrapped stream, the
/// stream is destroyed, and a new stream gets the old handle value. The new stream is another stream (the
/// emulator hands it the value on request, `custodyEmuReuseStreamHandle`; a real driver is
/// given a few tries to do so, and the test goes on with whatever value it gets), so a block it
/// takes must be ordered after the old stream's work by the event recorded at the free, never by
/// the handle value: the hazard checker sees the block's last free (after the new stream's use)
/// ordered after the old stream's fill. Two blocks wait in the old bin, so that the new stream
/// may take one (a stream's last cached block of a size is kept for it).
#[test]
fn a_reuse_after_a_wrapped_stream_is_destroyed_and_its_handle_reused_is_ordered() {
    let _serial = start();
    if !caches_or_skip() {
        return;
    }
    let base = device_used();
    let context = primary(0);
    context.make_current().unwrap();
    let mr = cache_over_device_pool();
    let old_raw = raw_stream();
    let old = unpinned(old_raw);
    let (one, two) = (allocate(&mr, 4096, &old), allocate(&mr, 4096, &old));
    let ptrs = [one.ptr(), two.ptr()];
    let ids = [alloc_of(ptrs[0]), alloc_of(ptrs[1])];
    // The old stream's last work on both blocks is held back until the end (on any driver), so
    // that a new stream ordered by the handle value alone would run before it.
    let flag = stream_ops::HostFlag::new();
    stream_ops::hold(old_raw as cuda_sys::types::CUstream, &flag);
    one.fill(0x11u8, &old).unwrap();
    two.fill(0x22u8, &old).unwrap();
    one.close().unwrap();
    two.close().unwrap();
    assert_eq!(mr.stats().cached_blocks, 2);
    drop(old);
    destroy_raw_stream(old_raw);

    // A new stream under the old handle value, if the driver gives it.
    let new_raw = match emulator() {
        Some(emu) => {
            assert!(emu.reuse_stream_handle(old_raw as u64));
            raw_stream()
        }
        None => {
            let mut tries = Vec::new();
            let got = loop {
                let s = raw_stream();
                if s == old_raw || tries.len() == 16 {
                    break s;
                }
                tries.push(s);
            };
            for s in tries {
                destroy_raw_stream(s);
            }
            if got != old_raw {
                println!("the driver gave no new stream the destroyed stream's handle in 16 tries");
            }
            got
        }
    };
    let new = unpinned(new_raw);
    let marker = stream_ops::HostFlag::new();
    let taken = allocate(&mr, 4096, &new);
    assert!(
        ptrs.contains(&taken.ptr()),
        "one of the old stream's blocks"
    );
    taken.fill(0x33u8, &new).unwrap();
    stream_ops::write(new_raw as cuda_sys::types::CUstream, &marker, 1);
    std::thread::sleep(std::time::Duration::from_millis(20));
    assert_eq!(
        marker.read(),
        0,
        "the new stream's use waits for the old stream's work (an event wait)"
    );
    let stats = mr.stats();
    assert_eq!((stats.hits, stats.misses), (1, 2), "{stats:?}");
    flag.release();
    taken.close().unwrap();
    new.synchronize().unwrap();
    assert_eq!(marker.read(), 1);
    drop(new);
    mr.trim().unwrap();
    with_emulator(|emu| {
        for id in ids {
            assert!(!emu.is_live(id));
            assert_eq!(
                emu.hazards_for(id),
                vec![],
                "ordered after the old stream's fill"
            );
        }
    });
    destroy_raw_stream(new_raw);
    marker.free();
    flag.free();
    mr.close().unwrap();
    assert_eq!(device_used(), base);
    assert_no_hazards();
}

/// A block freed on stream a serves an allocation on stream b once b is ordered after an event
/// recorded on a (`cuEventRecord`, `cuStreamWaitEvent`): no host wait, no polling. Shown on any
/// driver with a's work held back: b's next work does not run before it. A stream keeps its last
/// cached block of a size for itself, so a holds two here.
#[test]
fn a_block_freed_on_one_stream_serves_another_after_an_event_wait() {
    let _serial = start();
    if !caches_or_skip() {
        return;
    }
    let base = device_used();
    let context = primary(0);
    context.make_current().unwrap();
    let (a, b) = (stream_on(0), stream_on(0));
    let mr = cache_over_device_pool();
    let (one, two) = (allocate(&mr, 4096, &a), allocate(&mr, 4096, &a));
    let ptrs = [one.ptr(), two.ptr()];
    let ids = [alloc_of(ptrs[0]), alloc_of(ptrs[1])];
    let flag = stream_ops::HostFlag::new();
    stream_ops::hold(a.raw(), &flag);
    one.fill(0x5au8, &a).unwrap();
    two.fill(0x5bu8, &a).unwrap();
    one.close().unwrap();
    two.close().unwrap();

    let from = mark();
    let on_b = allocate(&mr, 4096, &b);
    assert!(ptrs.contains(&on_b.ptr()), "one of a's blocks");
    with_emulator(|emu| {
        let names = emu.names_on(tid(), from);
        for host_wait in [
            "cuStreamSynchronize",
            "cuEventSynchronize",
            "cuCtxSynchronize",
            "cuEventQuery",
            "cuStreamQuery",
        ] {
            assert!(!names.iter().any(|n| n == host_wait), "{names:?}");
        }
        let waits = emu.calls_named("cuStreamWaitEvent", from);
        assert_eq!(waits.len(), 1, "{waits:?}");
        assert_eq!(waits[0].stream, Some(b.raw() as u64), "b waits");
        let records = emu.calls_named("cuEventRecord", from);
        assert_eq!(records.len(), 1, "{records:?}");
        assert_eq!(records[0].stream, Some(a.raw() as u64), "for a's work");
    });
    let marker = stream_ops::HostFlag::new();
    stream_ops::write(b.raw(), &marker, 1);
    std::thread::sleep(std::time::Duration::from_millis(20));
    assert_eq!(marker.read(), 0, "b's work waits for a's");
    let kept = allocate(&mr, 4096, &a);
    assert!(
        ptrs.contains(&kept.ptr()) && kept.ptr() != on_b.ptr(),
        "a keeps its last"
    );
    flag.release();
    b.synchronize().unwrap();
    assert_eq!(marker.read(), 1);
    let stats = mr.stats();
    assert_eq!((stats.hits, stats.misses), (2, 2), "{stats:?}");
    on_b.close().unwrap();
    kept.close().unwrap();
    mr.trim().unwrap();
    with_emulator(|emu| {
        for id in ids {
            assert!(!emu.is_live(id));
            assert_eq!(emu.hazards_for(id), vec![], "b's free follows a's fill");
        }
    });
    marker.free();
    flag.free();
    assert_eq!(device_used(), base);
    assert_no_hazards();
}

/// With one cached block of a size, another stream does not take it (it allocates anew): two
/// streams taking turns with one block would each wait for the other's work.
#[test]
fn a_streams_last_cached_block_of_a_size_stays_for_it() {
    let _serial = start();
    if !caches_or_skip() {
        return;
    }
    let base = device_used();
    let (a, b) = (stream_on(0), stream_on(0));
    let mr = cache_over_device_pool();
    let mut blocks = std::collections::HashSet::new();
    for _ in 0..3 {
        // Each time b allocates, a's one block waits in a's bin and b's own is empty (the first
        // time) or its own.
        let on_a = allocate(&mr, 4096, &a);
        blocks.insert(on_a.ptr());
        on_a.close().unwrap();
        let on_b = allocate(&mr, 4096, &b);
        blocks.insert(on_b.ptr());
        on_b.close().unwrap();
    }
    let stats = mr.stats();
    assert_eq!(
        (stats.hits, stats.misses),
        (4, 2),
        "one block each: {stats:?}"
    );
    assert_eq!(blocks.len(), 2);
    mr.close().unwrap();
    assert_eq!(device_used(), base);
    assert_no_hazards();
}

/// An allocation the upstream refuses is no miss, and with nothing cached there is no retry to
/// count (a new user's trial saw `misses: 1, out_of_memory_retries: 1` on a fresh cache after a
/// refused huge request).
#[test]
fn a_refused_allocation_with_nothing_cached_counts_no_miss_and_no_retry() {
    let _serial = start();
    if !caches_or_skip() {
        return;
    }
    let s = stream_on(0);
    let mr = cache_over_device_pool();
    // 1 PiB: refused by the pool (the emulator says CUDA_ERROR_OUT_OF_MEMORY; which error a
    // real driver gives does not matter here).
    let error = mr.allocate(1 << 50, &s).unwrap_err();
    assert!(matches!(&error, MemoryError::Handle(_)), "{error}");
    assert_eq!(mr.stats(), CachingStats::default());
    assert_no_hazards();
}

/// The `NotCached` warnings reported since [`start`] (a cache's warnings carry no pointer).
fn not_cached() -> Vec<handles::CleanupWarning> {
    warnings_for(0)
        .into_iter()
        .filter(|w| matches!(w.kind, handles::CleanupWarningKind::NotCached { .. }))
        .collect()
}

/// A trim on the thread of a running thread-local capture frees nothing: any free it made (here
/// `cuMemFreeAsync` of another stream's block) would invalidate that capture (driver-facts F27);
/// buffers lent out are counted, not touched; a trim after the capture frees the rest.
#[test]
fn trim_says_what_it_freed_and_what_it_could_not() {
    let _serial = start();
    if !caches_or_skip() {
        return;
    }
    let base = device_used();
    let (a, b) = (stream_on(0), stream_on(0));
    let mr = cache_over_device_pool();
    drop(allocate(&mr, 4096, &a));
    drop(allocate(&mr, 1000, &b));
    let out = allocate(&mr, 4096, &b);
    begin_capture(
        &a,
        handles::sys_types::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
    )
    .unwrap();
    let trimmed = mr.trim();
    let graph = end_capture(&a).unwrap();
    assert_eq!(
        trimmed.unwrap(),
        memory::Trimmed {
            freed_blocks: 0,
            freed_bytes: 0,
            kept_blocks: 2,
            kept_bytes: 5120,
            in_use_blocks: 1,
            in_use_bytes: 4096,
        }
    );
    drop(graph);
    assert_eq!(mr.stats().cached_blocks, 2, "both blocks still cached");
    out.close().unwrap();
    let trimmed = mr.trim().unwrap();
    assert_eq!(
        (
            trimmed.freed_blocks,
            trimmed.kept_blocks,
            trimmed.in_use_blocks
        ),
        (3, 0, 0)
    );
    assert_eq!(device_used(), base);
    assert_no_hazards();
}

/// What the cache cannot cache it says, once per cache: allocations on a stream being captured
/// go to the upstream resource (which refuses them, a pool's rule) with one warning however many.
#[test]
fn an_allocation_on_a_capturing_stream_is_said_once_and_goes_to_the_upstream() {
    let _serial = start();
    if !caches_or_skip() {
        return;
    }
    let s = stream_on(0);
    let mr = cache_over_device_pool();
    begin_capture(
        &s,
        handles::sys_types::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
    )
    .unwrap();
    let first = mr.allocate(4096, &s);
    let second = mr.allocate(4096, &s);
    let graph = end_capture(&s).unwrap();
    assert!(matches!(first, Err(MemoryError::StreamCapturing)));
    assert!(matches!(second, Err(MemoryError::StreamCapturing)));
    drop(graph);
    let warnings = not_cached();
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert_eq!(warnings[0].stream, s.raw() as u64);
    assert!(
        warnings[0].to_string().contains("captured"),
        "{}",
        warnings[0]
    );
    let other = cache_over_device_pool();
    begin_capture(
        &s,
        handles::sys_types::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
    )
    .unwrap();
    let third = other.allocate(4096, &s);
    drop(end_capture(&s).unwrap());
    assert!(third.is_err());
    assert_eq!(not_cached().len(), 2, "once per cache");
    assert_no_hazards();
}

/// A free on a wrapped stream where no event can be recorded (the driver refuses
/// `cuEventRecord`): the block is freed on that stream, which is alive at the free, not cached,
/// and the cache says so once.
#[test]
fn a_wrapped_stream_that_cannot_be_fenced_gets_its_blocks_freed_and_a_warning() {
    let _serial = start();
    if !caches_or_skip() {
        return;
    }
    let Some(emu) = emulator_or_skip("fault injection") else {
        return;
    };
    let base = device_used();
    let context = primary(0);
    context.make_current().unwrap();
    let raw = raw_stream();
    let foreign = unpinned(raw);
    let mr = cache_over_device_pool();
    let buffer = allocate(&mr, 4096, &foreign);
    let alloc = alloc_of(buffer.ptr());
    assert!(emu.inject_fault("cuEventRecord", 1, CudaErrorCode::INVALID_VALUE));
    let from = mark();
    buffer.close().unwrap();
    let free = emu.only_call("cuMemFreeAsync", alloc, from);
    assert_eq!(
        free.stream,
        Some(raw as u64),
        "freed on its stream, alive now"
    );
    let stats = mr.stats();
    assert_eq!(
        (stats.cached_blocks, stats.freed_blocks),
        (0, 1),
        "{stats:?}"
    );
    assert_eq!(not_cached().len(), 1);
    foreign.synchronize().unwrap();
    drop(foreign);
    destroy_raw_stream(raw);
    mr.close().unwrap();
    assert_eq!(device_used(), base);
    assert_no_hazards();
}

/// Out of memory, an allocation on one stream takes another stream's cached block of its class
/// (after an event wait) before anything is flushed, even that stream's last one.
#[test]
fn out_of_memory_takes_another_streams_block_before_flushing() {
    let _serial = start();
    if !caches_or_skip() {
        return;
    }
    let (a, b) = (stream_on(0), stream_on(0));
    let pool = DeviceMemoryResource::with_options(
        0,
        DeviceMemoryResourceOptions {
            max_size: 32 << 20,
            ipc_enabled: false,
        },
    )
    .unwrap();
    let mr = CachingMemoryResource::new(pool.clone());
    let on_a = allocate(&mr, 24 << 20, &a);
    let ptr = on_a.ptr();
    on_a.fill(9u8, &a).unwrap();
    on_a.close().unwrap();
    let on_b = allocate(&mr, 24 << 20, &b);
    assert_eq!(on_b.ptr(), ptr, "a's block");
    let stats = mr.stats();
    assert_eq!(
        (
            stats.cross_stream_hits,
            stats.out_of_memory_retries,
            stats.misses
        ),
        (1, 0, 1),
        "{stats:?}"
    );
    on_b.close().unwrap();
    mr.close().unwrap();
    use memory::PoolMemoryResource;
    assert_eq!(pool_used(pool.pool()), 0);
    assert_no_hazards();
}

/// Several blocks of a wrapped stream, cached, trimmed after the stream is gone: each is freed
/// on the cache's own stream after a wait for the event its free recorded; the hazard checker
/// sees every free ordered after the wrapped stream's fills.
#[test]
fn a_trim_frees_a_gone_wrapped_streams_blocks_after_their_events() {
    let _serial = start();
    if !caches_or_skip() {
        return;
    }
    let base = device_used();
    let context = primary(0);
    context.make_current().unwrap();
    let raw = raw_stream();
    let foreign = unpinned(raw);
    let mr = cache_over_device_pool();
    let buffers: Vec<Buffer> = (0..3).map(|_| allocate(&mr, 4096, &foreign)).collect();
    let ids: Vec<AllocationId> = buffers.iter().map(|b| alloc_of(b.ptr())).collect();
    for b in &buffers {
        b.fill(0x7fu8, &foreign).unwrap();
    }
    drop(buffers);
    assert_eq!(mr.stats().events_recorded, 3);
    drop(foreign);
    destroy_raw_stream(raw);
    let from = mark();
    let trimmed = mr.trim().unwrap();
    assert_eq!(trimmed.freed_blocks, 3);
    with_emulator(|emu| {
        let waits = emu.calls_named("cuStreamWaitEvent", from);
        assert_eq!(waits.len(), 3, "{waits:?}");
        for id in &ids {
            let free = emu.only_call("cuMemFreeAsync", *id, from);
            assert_eq!(free.stream, waits[0].stream, "on the cache's own stream");
            assert_ne!(free.stream, Some(raw as u64));
            assert_eq!(emu.hazards_for(*id), vec![]);
        }
    });
    mr.close().unwrap();
    assert_eq!(device_used(), base);
    assert_no_hazards();
}

/// Every test of this file checks what a cache keeps, so each one skips when caches pass
/// everything through (the GPU runner's compute-sanitizer mode): a test added without the skip
/// fails there, under the sanitizer, with nothing to do with what it tests.
#[test]
fn every_test_here_skips_when_caches_pass_through() {
    let source = include_str!("caching.rs");
    let mut missing = Vec::new();
    for test in source.split("#[test]\nfn ").skip(1) {
        let name = test.split('(').next().unwrap_or_default();
        let head: String = test.lines().take(8).collect::<Vec<_>>().join("\n");
        if name != "every_test_here_skips_when_caches_pass_through"
            && !head.contains("caches_or_skip()")
        {
            missing.push(name.to_owned());
        }
    }
    assert!(
        missing.is_empty(),
        "tests without caches_or_skip(): {missing:?}"
    );
}

/// A trim on another thread than the capture's frees what it can: a block whose stream is being
/// captured (a capture begun through custody) stays in its bin (a free there would join the
/// capture), another stream's block is freed, and the capture stays valid.
#[test]
fn a_trim_beside_another_threads_capture_keeps_only_the_capturing_streams_block() {
    let _serial = start();
    if !caches_or_skip() {
        return;
    }
    let base = device_used();
    let (a, b) = (stream_on(0), stream_on(0));
    let mr = cache_over_device_pool();
    drop(allocate(&mr, 4096, &a));
    drop(allocate(&mr, 1000, &b));
    begin_capture(
        &a,
        handles::sys_types::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
    )
    .unwrap();
    let trimmed = std::thread::scope(|t| t.spawn(|| mr.trim()).join().unwrap());
    let graph = end_capture(&a).unwrap();
    let trimmed = trimmed.unwrap();
    assert_eq!(
        (
            trimmed.freed_blocks,
            trimmed.freed_bytes,
            trimmed.kept_blocks,
            trimmed.kept_bytes
        ),
        (1, 1024, 1, 4096)
    );
    drop(graph);
    assert_eq!(mr.stats().cached_blocks, 1, "a's block still cached");
    assert_eq!(mr.trim().unwrap().freed_blocks, 1);
    assert_eq!(device_used(), base);
    assert_no_hazards();
}
