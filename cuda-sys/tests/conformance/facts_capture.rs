//! docs/driver-facts.md F16 and F17: frees and events inside a stream capture.
//!
//! - F16 (`f16_*`): `cuMemFreeAsync(p, s)` while `s` is being captured, where `p` is ordinary
//!   pool memory allocated before the capture, is refused with `CUDA_ERROR_INVALID_VALUE` in all
//!   three capture modes; nothing is captured, the capture stays valid, the memory stays
//!   allocated, and a later free outside the capture succeeds. A graph allocation
//!   (`cuMemAllocAsync` inside the capture) freed inside it is a free node.
//! - F17 (`f17_*`): an event recorded on a capturing stream (thread-local capture), waited on or
//!   queried from the capturing thread or another: the first call fails with
//!   `CUDA_ERROR_CAPTURED_EVENT` and invalidates the capture (`cuStreamEndCapture` returns
//!   `CUDA_ERROR_STREAM_CAPTURE_INVALIDATED`); a query of it after that is
//!   `CUDA_ERROR_INVALID_VALUE`. `cuStreamWaitEvent` of it from another stream joins that stream
//!   to the capture. Every case here passed on the H200 on 2026-12-01, except the two query
//!   cases, which had read the documentation wrongly and were corrected after that run.
//! - F26 (`f26_*`): `cuMemPoolGetAttribute` on the thread of a thread-local capture that F17's
//!   query invalidated, before the capture ended, is `CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED`
//!   (measured on the H200 in the GPU run of 2026-12-01 of bundle `7670e5d`; only that
//!   situation).
//! - F27 (`f27_*`, measured on the H200 with the raw-driver probe
//!   docs/driver-probe/free_beside_capture.py): `cuMemFreeAsync` and `cuMemAllocAsync`
//!   on a stream not being captured, beside a capture that forbids the calling thread
//!   "potentially unsafe" calls (a global one on any thread, a thread-local one on its own), are
//!   refused with `CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED`, do nothing, and invalidate the
//!   capture; in relaxed interaction mode the caller is refused nothing.
//! - A capture that ends without a graph (invalidated, or a forked stream left unjoined)
//!   discards the graph it recorded into, and the user objects that graph held are destroyed
//!   (`basic_an_*_capture_releases_the_user_objects_its_graph_held`: read from the
//!   documentation; both passed on the H200 in the GPU runs of 2026-12-02).

use cuda_sys::types::{CUevent, CUmemPool_attribute, CUstream, CUstreamCaptureMode};
use cuda_sys::CudaErrorCode;

use crate::driver::{
    event_create, event_destroy, event_query, event_record, event_synchronize, graph_destroy,
    graph_exec_destroy, graph_instantiate, graph_launch, graph_retain_user_object, init, mem_alloc,
    mem_alloc_async, mem_alloc_from_pool_async, mem_free, mem_free_async, mem_pool_destroy,
    mem_pool_get_attribute, memcpy_dtoh, memset_d8_async, stream_begin_capture, stream_create,
    stream_destroy, stream_end_capture, stream_get_capture_info, stream_is_capturing,
    stream_synchronize, stream_wait_event, thread_exchange_capture_mode, user_object_create,
    user_object_release, CAPTURE_STATUS_ACTIVE, CAPTURE_STATUS_INVALIDATED, CAPTURE_STATUS_NONE,
    STREAM_NON_BLOCKING,
};
use crate::support::{new_pool, on_fresh_thread, primary_current, used, Primary, Shared, N};

const GLOBAL: CUstreamCaptureMode = CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_GLOBAL;
const THREAD_LOCAL: CUstreamCaptureMode = CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL;
const RELAXED: CUstreamCaptureMode = CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED;

/// F16 in capture mode `mode`: pool memory allocated before the capture of a new non-blocking
/// stream `s`, freed on `s` during it.
fn captured_free_of_pool_memory_is_refused(mode: CUstreamCaptureMode) {
    let _primary = primary_current();
    let pool = new_pool();
    let s = stream_create(STREAM_NON_BLOCKING).check();
    let p = mem_alloc_from_pool_async(N, pool, s).check();
    stream_synchronize(s).check();
    let used_before = used(pool);
    assert!(used_before >= N as u64);

    stream_begin_capture(s, mode).check();
    mem_free_async(p, s).fails_with(CudaErrorCode::INVALID_VALUE);
    assert_eq!(
        stream_is_capturing(s).check(),
        CAPTURE_STATUS_ACTIVE,
        "the refused free left the capture valid"
    );
    // Not measured, but what a valid capture means: later work on the stream is still captured.
    memset_d8_async(p, 0x5a, N, s).check();
    let graph = stream_end_capture(s).check();
    assert!(!graph.is_null());
    assert_eq!(used(pool), used_before, "nothing was freed at capture");

    let exec = graph_instantiate(graph).check();
    graph_launch(exec, s).check();
    stream_synchronize(s).check();
    assert_eq!(used(pool), used_before, "launching the graph freed nothing");
    assert_eq!(
        memcpy_dtoh(p + (N as u64) - 16, 16).check(),
        [0x5a; 16],
        "the graph ran the captured fill on the still-allocated memory"
    );
    graph_exec_destroy(exec).check();
    graph_destroy(graph).check();
    stream_synchronize(s).check();
    assert_eq!(
        used(pool),
        used_before,
        "destroying the graph freed nothing"
    );

    mem_free_async(p, s).check(); // outside the capture: an ordinary free
    stream_synchronize(s).check();
    assert_eq!(used(pool), 0, "the free outside the capture happened");
    stream_destroy(s).check();
    mem_pool_destroy(pool).check();
}

#[test]
fn f16_free_async_of_pool_memory_in_global_capture_is_invalid_value() {
    on_fresh_thread("f16-global", || {
        init();
        captured_free_of_pool_memory_is_refused(GLOBAL);
    });
}

#[test]
fn f16_free_async_of_pool_memory_in_thread_local_capture_is_invalid_value() {
    on_fresh_thread("f16-thread-local", || {
        init();
        captured_free_of_pool_memory_is_refused(THREAD_LOCAL);
    });
}

#[test]
fn f16_free_async_of_pool_memory_in_relaxed_capture_is_invalid_value() {
    on_fresh_thread("f16-relaxed", || {
        init();
        captured_free_of_pool_memory_is_refused(RELAXED);
    });
}

/// A graph allocation freed inside its own capture is captured as a free node, in each mode:
/// the capture ends, and the graph launches twice (a graph whose allocation is never freed
/// cannot be relaunched while the allocation lives, documented; here both launches succeed
/// because the free node frees it every time). The global case is also
/// `measured::measured_clean_capture_of_alloc_and_free_ends_successfully`.
#[test]
fn f16_graph_allocation_freed_in_its_capture_is_a_free_node() {
    on_fresh_thread("f16-graph-allocation", || {
        init();
        let _primary = primary_current();
        for mode in [GLOBAL, THREAD_LOCAL, RELAXED] {
            let s = stream_create(STREAM_NON_BLOCKING).check();
            stream_begin_capture(s, mode).check();
            let q = mem_alloc_async(64, s).check();
            memset_d8_async(q, 0x11, 64, s).check();
            mem_free_async(q, s).check();
            assert_eq!(stream_is_capturing(s).check(), CAPTURE_STATUS_ACTIVE);
            let graph = stream_end_capture(s).check();
            assert!(!graph.is_null(), "{mode:?}");
            let exec = graph_instantiate(graph).check();
            graph_launch(exec, s).check();
            graph_launch(exec, s).check();
            stream_synchronize(s).check();
            graph_exec_destroy(exec).check();
            graph_destroy(graph).check();
            stream_destroy(s).check();
        }
    });
}

/// A thread-local capture of a new non-blocking stream with an event recorded in it; `f` runs
/// with the primary context current, the stream and the event, then the capture is ended
/// (whatever `f` did) and its result returned. The stream and the event are destroyed after.
fn with_captured_event(f: impl FnOnce(&Primary, CUstream, CUevent)) -> Result<(), CudaErrorCode> {
    let primary = primary_current();
    let s = stream_create(STREAM_NON_BLOCKING).check();
    let e = event_create(0).check();
    stream_begin_capture(s, THREAD_LOCAL).check();
    event_record(e, s).check();
    f(&primary, s, e);
    let (code, graph) = stream_end_capture(s).into_parts();
    let result = if code.is_success() {
        assert!(!graph.is_null());
        graph_destroy(graph).check();
        Ok(())
    } else {
        Err(code)
    };
    assert_eq!(
        stream_is_capturing(s).check(),
        CAPTURE_STATUS_NONE,
        "the stream left the capture"
    );
    event_destroy(e).check();
    stream_destroy(s).check();
    result
}

/// Runs `f` on another thread with `primary`'s context current.
fn on_other_thread(primary: &Primary, f: impl FnOnce() + Send + 'static) {
    let ctx = Shared(primary.ctx());
    on_fresh_thread("other", move || {
        init();
        crate::driver::ctx_set_current(ctx.get()).check();
        f();
    });
}

#[test]
fn f17_event_synchronize_and_query_from_another_thread_fail_and_invalidate_the_capture() {
    on_fresh_thread("f17", || {
        init();
        let ended = with_captured_event(|primary, _, e| {
            let event = Shared(e);
            on_other_thread(primary, move || {
                event_synchronize(event.get()).fails_with(CudaErrorCode::CAPTURED_EVENT);
                // The capture is invalidated by now: a query is INVALID_VALUE.
                event_query(event.get()).fails_with(CudaErrorCode::INVALID_VALUE);
            });
        });
        assert_eq!(ended, Err(CudaErrorCode::STREAM_CAPTURE_INVALIDATED));
    });
}

#[test]
fn f17_event_synchronize_alone_from_another_thread_invalidates_the_capture() {
    on_fresh_thread("f17-sync-alone", || {
        init();
        let ended = with_captured_event(|primary, _, e| {
            let event = Shared(e);
            on_other_thread(primary, move || {
                event_synchronize(event.get()).fails_with(CudaErrorCode::CAPTURED_EVENT);
            });
        });
        assert_eq!(ended, Err(CudaErrorCode::STREAM_CAPTURE_INVALIDATED));
    });
}

#[test]
fn f17_event_query_alone_from_another_thread_invalidates_the_capture() {
    on_fresh_thread("f17-query-alone", || {
        init();
        let ended = with_captured_event(|primary, s, e| {
            let event = Shared(e);
            on_other_thread(primary, move || {
                event_query(event.get()).fails_with(CudaErrorCode::CAPTURED_EVENT);
                event_query(event.get()).fails_with(CudaErrorCode::INVALID_VALUE);
            });
            assert_eq!(stream_is_capturing(s).check(), CAPTURE_STATUS_INVALIDATED);
        });
        assert_eq!(ended, Err(CudaErrorCode::STREAM_CAPTURE_INVALIDATED));
    });
}

/// The documentation's `CUDA_ERROR_CAPTURED_EVENT` ("not permitted on an event last recorded in
/// a capturing stream") does not depend on the calling thread: read as the other thread's
/// result, invalidation included.
#[test]
fn f17_event_synchronize_on_the_capturing_thread_invalidates_the_capture() {
    on_fresh_thread("f17-sync-same-thread", || {
        init();
        let ended = with_captured_event(|_, _, e| {
            event_synchronize(e).fails_with(CudaErrorCode::CAPTURED_EVENT);
        });
        assert_eq!(ended, Err(CudaErrorCode::STREAM_CAPTURE_INVALIDATED));
    });
}

/// Measured as from another thread: the first query is CUDA_ERROR_CAPTURED_EVENT and breaks the
/// capture; later ones find it broken (CUDA_ERROR_INVALID_VALUE).
#[test]
fn f17_event_query_on_the_capturing_thread_invalidates_the_capture() {
    on_fresh_thread("f17-query-same-thread", || {
        init();
        let ended = with_captured_event(|_, s, e| {
            event_query(e).fails_with(CudaErrorCode::CAPTURED_EVENT);
            event_query(e).fails_with(CudaErrorCode::INVALID_VALUE);
            assert_eq!(stream_is_capturing(s).check(), CAPTURE_STATUS_INVALIDATED);
        });
        assert_eq!(ended, Err(CudaErrorCode::STREAM_CAPTURE_INVALIDATED));
    });
}

/// docs/driver-facts.md F26, measured in the GPU run of bundle `7670e5d` (H200, 2026-12-01),
/// through memory's `graphs::what_an_invalidated_capture_retained_or_was_handed_is_freed_when_the_capture_ends`:
/// on the thread that began a thread-local capture which F17's event query has invalidated (the
/// capture not ended yet, the thread's interaction mode the default, global),
/// `cuMemPoolGetAttribute(CU_MEMPOOL_ATTR_USED_MEM_CURRENT)` of a created pool fails with
/// `CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED`; once the capture has ended the same query succeeds.
/// Only this situation was measured: a valid capture, the global and relaxed capture modes and
/// a query from another thread were not.
#[test]
fn f26_pool_attribute_query_in_an_invalidated_thread_local_capture_is_capture_unsupported() {
    on_fresh_thread("f26", || {
        init();
        let pool = new_pool();
        let pool_shared = Shared(pool);
        let ended = with_captured_event(|_, s, e| {
            let pool = pool_shared.get();
            event_query(e).fails_with(CudaErrorCode::CAPTURED_EVENT);
            assert_eq!(stream_is_capturing(s).check(), CAPTURE_STATUS_INVALIDATED);
            mem_pool_get_attribute(pool, CUmemPool_attribute::CU_MEMPOOL_ATTR_USED_MEM_CURRENT)
                .fails_with(CudaErrorCode::STREAM_CAPTURE_UNSUPPORTED);
            assert_eq!(
                stream_is_capturing(s).check(),
                CAPTURE_STATUS_INVALIDATED,
                "still the invalidated capture"
            );
        });
        assert_eq!(ended, Err(CudaErrorCode::STREAM_CAPTURE_INVALIDATED));
        assert_eq!(used(pool), 0, "the query after the capture ended");
        mem_pool_destroy(pool).check();
    });
}

/// Documented (the cross-stream capture pattern): a stream that waits on an event recorded in
/// a capture joins that capture; having done nothing else it needs no join back, the capture
/// ends successfully and the stream leaves it.
#[test]
fn f17_stream_wait_event_from_another_stream_joins_the_capture() {
    on_fresh_thread("f17-wait-same-thread", || {
        init();
        let _primary = primary_current(); // keeps the other stream's context alive
        let mut other = None;
        let ended = with_captured_event(|_, _, e| {
            let t = stream_create(STREAM_NON_BLOCKING).check();
            stream_wait_event(t, e).check();
            assert_eq!(stream_is_capturing(t).check(), CAPTURE_STATUS_ACTIVE);
            other = Some(t);
        });
        assert_eq!(ended, Ok(()));
        let t = other.expect("the stream was created");
        assert_eq!(stream_is_capturing(t).check(), CAPTURE_STATUS_NONE);
        stream_destroy(t).check();
    });
}

/// As the case above, with the waiting stream created and the wait issued on another thread
/// than the one that began the (thread-local) capture.
#[test]
fn f17_stream_wait_event_from_another_thread_joins_the_capture() {
    on_fresh_thread("f17-wait-other-thread", || {
        init();
        let _primary = primary_current(); // keeps the other stream's context alive
        let mut other = None;
        let ended = with_captured_event(|primary, _, e| {
            let (event, slot) = (Shared(e), std::sync::Arc::new(std::sync::Mutex::new(None)));
            let inner = std::sync::Arc::clone(&slot);
            on_other_thread(primary, move || {
                let t = stream_create(STREAM_NON_BLOCKING).check();
                *inner.lock().unwrap() = Some(Shared(t));
                stream_wait_event(t, event.get()).check();
                assert_eq!(stream_is_capturing(t).check(), CAPTURE_STATUS_ACTIVE);
            });
            other = slot.lock().unwrap().take();
        });
        assert_eq!(ended, Ok(()));
        let t = other.expect("the stream was created").get();
        assert_eq!(stream_is_capturing(t).check(), CAPTURE_STATUS_NONE);
        stream_destroy(t).check();
    });
}

/// A thread's capture interaction mode against another thread's global capture: `mem_free`
/// (a "potentially unsafe" call) on another thread while `s` is captured in global mode, with
/// that thread's mode set to `mode` (`CU_STREAM_CAPTURE_MODE_*`); returns the free's code and
/// how the capture ended. The driver API documents that relaxed mode forbids nothing and that
/// global mode (the default) forbids unsafe calls during another thread's global capture.
fn free_during_a_global_capture_elsewhere(mode: u32) -> (CudaErrorCode, Result<(), CudaErrorCode>) {
    let primary = primary_current();
    let s = stream_create(STREAM_NON_BLOCKING).check();
    let p = Shared(mem_alloc(N).check());
    stream_begin_capture(s, GLOBAL).check();
    let ctx = Shared(primary.ctx());
    let freed = on_fresh_thread("freeing", move || {
        init();
        crate::driver::ctx_set_current(ctx.get()).check();
        let previous = thread_exchange_capture_mode(mode).check();
        assert_eq!(previous, 0, "a thread starts in global mode");
        let (code, ()) = mem_free(p.get()).into_parts();
        assert_eq!(thread_exchange_capture_mode(previous).check(), mode);
        code
    });
    let (code, graph) = stream_end_capture(s).into_parts();
    let ended = if code.is_success() {
        graph_destroy(graph).check();
        Ok(())
    } else {
        Err(code)
    };
    if !freed.is_success() {
        mem_free(p.get()).check();
    }
    stream_destroy(s).check();
    (freed, ended)
}

#[test]
fn basic_a_relaxed_thread_frees_during_another_threads_global_capture() {
    on_fresh_thread("relaxed", || {
        init();
        let (freed, ended) = free_during_a_global_capture_elsewhere(2);
        assert_eq!(
            freed,
            CudaErrorCode::SUCCESS,
            "relaxed mode forbids nothing"
        );
        assert_eq!(ended, Ok(()), "the capture stays valid");
    });
}

#[test]
fn basic_a_global_thread_may_not_free_during_another_threads_global_capture() {
    on_fresh_thread("global", || {
        init();
        let (freed, ended) = free_during_a_global_capture_elsewhere(0);
        assert_eq!(freed, CudaErrorCode::STREAM_CAPTURE_UNSUPPORTED);
        assert_eq!(ended, Err(CudaErrorCode::STREAM_CAPTURE_INVALIDATED));
    });
}

/// A capture that ends without a graph discards the graph it recorded into: a user object that
/// graph held (retained with `cuGraphRetainUserObject`, the caller's reference released, as
/// custody's `retain_in_capture` and its hand-over of a captured free do) must then be
/// destroyed, or what it owns leaks. Captures a thread-local capture of a new non-blocking
/// stream, attaches such a user object to the capture graph (`cuStreamGetCaptureInfo_v2`),
/// lets `spoil` break the capture, ends it with `expected` and returns the probe, whose
/// `destructor` mark says whether the destructor ran (a real driver may run it on its own
/// thread, later: the caller waits for it).
fn user_object_of_a_failed_capture(
    expected: CudaErrorCode,
    spoil: impl FnOnce(CUstream, CUevent),
) -> std::sync::Arc<crate::support::Probe> {
    let _primary = primary_current();
    let probe = crate::support::Probe::new();
    let s = stream_create(STREAM_NON_BLOCKING).check();
    let e = event_create(0).check();
    stream_begin_capture(s, THREAD_LOCAL).check();
    event_record(e, s).check();
    let (status, _, graph) = stream_get_capture_info(s).check();
    assert_eq!((status, graph.is_null()), (CAPTURE_STATUS_ACTIVE, false));
    let marked = std::sync::Arc::clone(&probe);
    let object = user_object_create(move || marked.mark("destructor")).check();
    graph_retain_user_object(graph, object).check();
    user_object_release(object, 1).check();
    assert!(
        probe.find("destructor").is_none(),
        "the capture graph holds the object"
    );
    spoil(s, e);
    let (code, graph) = stream_end_capture(s).into_parts();
    assert_eq!(code, expected);
    assert!(graph.is_null(), "no graph comes out of a failed capture");
    assert_eq!(stream_is_capturing(s).check(), CAPTURE_STATUS_NONE);
    event_destroy(e).check();
    stream_destroy(s).check();
    probe
}

/// Read from the documentation (a failed capture's graph is discarded) and the emulator's model,
/// passed on the H200 (GPU runs of 2026-12-02): an invalidated capture (F17's invalidation: a query of an event recorded in
/// it) destroys the user objects its graph held, so their destructors run.
#[test]
fn basic_an_invalidated_capture_releases_the_user_objects_its_graph_held() {
    on_fresh_thread("invalidated-user-object", || {
        init();
        let probe =
            user_object_of_a_failed_capture(CudaErrorCode::STREAM_CAPTURE_INVALIDATED, |s, e| {
                event_query(e).fails_with(CudaErrorCode::CAPTURED_EVENT);
                assert_eq!(stream_is_capturing(s).check(), CAPTURE_STATUS_INVALIDATED);
            });
        assert!(
            probe.wait_for("destructor").is_some(),
            "the destructor of a user object held by an invalidated capture never ran"
        );
    });
}

/// As above for a capture that ends with a forked stream not joined back
/// (`CUDA_ERROR_STREAM_CAPTURE_UNJOINED`): its graph is discarded too.
#[test]
fn basic_an_unjoined_capture_releases_the_user_objects_its_graph_held() {
    on_fresh_thread("unjoined-user-object", || {
        init();
        let _primary = primary_current(); // the memory's context, kept for the whole case
        let memory = mem_alloc(N).check();
        let forked = std::cell::Cell::new(None);
        let probe =
            user_object_of_a_failed_capture(CudaErrorCode::STREAM_CAPTURE_UNJOINED, |_, e| {
                let t = stream_create(STREAM_NON_BLOCKING).check();
                stream_wait_event(t, e).check();
                memset_d8_async(memory, 1, N, t).check();
                forked.set(Some(t));
            });
        assert!(
            probe.wait_for("destructor").is_some(),
            "the destructor of a user object held by an unjoined capture never ran"
        );
        let t = forked.take().expect("the forked stream was created");
        assert_eq!(stream_is_capturing(t).check(), CAPTURE_STATUS_NONE);
        stream_destroy(t).check();
        mem_free(memory).check();
    });
}

/// A stream-ordered call of docs/driver-facts.md F27.
#[derive(Clone, Copy, Debug)]
enum Beside {
    /// `cuMemFreeAsync` of pool memory allocated (and synchronised) before the capture.
    Free,
    /// `cuMemAllocAsync` of `N` bytes (the device's current pool), as the probe measured it.
    Alloc,
}

/// What `call` on a created stream `t` that is not being captured did while a created stream
/// `s` was being captured in `mode`, begun on this thread: made on this thread or
/// (`other_thread`) on a fresh one with the same context current, in the calling thread's
/// default interaction mode or (`relaxed`) with it relaxed around the call. Returns the call's
/// code, the capture's status right after it, and whether the call took effect (the memory
/// freed, or allocated), read once the capture ended. Leaves nothing behind: what the call did
/// not free is freed afterwards (which must succeed), what it allocated is freed.
fn call_beside_a_capture(
    mode: CUstreamCaptureMode,
    call: Beside,
    other_thread: bool,
    relaxed: bool,
) -> (CudaErrorCode, u32, bool) {
    let primary = primary_current();
    let pool = Shared(new_pool());
    let s = stream_create(STREAM_NON_BLOCKING).check();
    let t = Shared(stream_create(STREAM_NON_BLOCKING).check());
    let p = mem_alloc_from_pool_async(N, pool.get(), t.get()).check();
    stream_synchronize(t.get()).check();
    stream_begin_capture(s, mode).check();
    let make = move || {
        let previous = relaxed.then(|| thread_exchange_capture_mode(2).check());
        let (code, made) = match call {
            Beside::Free => (mem_free_async(p, t.get()).into_parts().0, 0),
            Beside::Alloc => mem_alloc_async(N, t.get()).into_parts(),
        };
        if let Some(previous) = previous {
            assert_eq!(thread_exchange_capture_mode(previous).check(), 2);
        }
        (code, made)
    };
    let (code, made) = if other_thread {
        let ctx = Shared(primary.ctx());
        on_fresh_thread("beside-a-capture", move || {
            init();
            crate::driver::ctx_set_current(ctx.get()).check();
            make()
        })
    } else {
        make()
    };
    let after = stream_is_capturing(s).check();
    let (ended, graph) = stream_end_capture(s).into_parts();
    if ended.is_success() {
        graph_destroy(graph).check();
    }
    stream_synchronize(t.get()).check();
    let took_effect = match call {
        Beside::Free => used(pool.get()) == 0,
        Beside::Alloc => code.is_success() && made != 0,
    };
    if matches!(call, Beside::Alloc) || !took_effect {
        mem_free_async(p, t.get()).check();
    }
    if made != 0 {
        mem_free_async(made, t.get()).check();
    }
    stream_synchronize(t.get()).check();
    assert_eq!(used(pool.get()), 0, "everything freed");
    stream_destroy(t.get()).check();
    stream_destroy(s).check();
    mem_pool_destroy(pool.get()).check();
    (code, after, took_effect)
}

/// The answer F27 measured for a refused call: "potentially unsafe" here, nothing done, the
/// capture invalidated.
const REFUSED: (CudaErrorCode, u32, bool) = (
    CudaErrorCode::STREAM_CAPTURE_UNSUPPORTED,
    CAPTURE_STATUS_INVALIDATED,
    false,
);

/// The answer F27 measured for an allowed call: done, the capture still active.
const ALLOWED: (CudaErrorCode, u32, bool) = (CudaErrorCode::SUCCESS, CAPTURE_STATUS_ACTIVE, true);

/// F27 (measured on an H200 with the raw-driver probe docs/driver-probe/free_beside_capture.py,
/// driver 580.159.04): beside a global capture, a stream-ordered free or allocation on a stream
/// not being captured is refused on the capturing thread and on any other thread in the default
/// interaction mode, and the capture is invalidated.
#[test]
fn f27_beside_a_global_capture_a_stream_ordered_call_is_refused_and_invalidates_it() {
    on_fresh_thread("f27-global", || {
        init();
        for call in [Beside::Free, Beside::Alloc] {
            for other_thread in [false, true] {
                assert_eq!(
                    call_beside_a_capture(GLOBAL, call, other_thread, false),
                    REFUSED,
                    "{call:?}, on another thread: {other_thread}"
                );
            }
        }
    });
}

/// F27, as above: beside a thread-local capture only the capturing thread is refused (and the
/// capture invalidated); another thread's call is done and the capture stays active.
#[test]
fn f27_beside_a_thread_local_capture_only_the_capturing_thread_is_refused() {
    on_fresh_thread("f27-thread-local", || {
        init();
        for call in [Beside::Free, Beside::Alloc] {
            for (other_thread, expected) in [(false, REFUSED), (true, ALLOWED)] {
                assert_eq!(
                    call_beside_a_capture(THREAD_LOCAL, call, other_thread, false),
                    expected,
                    "{call:?}, on another thread: {other_thread}"
                );
            }
        }
    });
}

/// F27, as above: a relaxed capture refuses no thread's stream-ordered call on another stream;
/// and a thread whose interaction mode is relaxed around the call is refused by no capture, the
/// capturing thread included (the capture stays active).
#[test]
fn f27_a_relaxed_capture_or_a_relaxed_caller_refuses_nothing() {
    on_fresh_thread("f27-relaxed", || {
        init();
        for call in [Beside::Free, Beside::Alloc] {
            for other_thread in [false, true] {
                assert_eq!(
                    call_beside_a_capture(RELAXED, call, other_thread, false),
                    ALLOWED,
                    "{call:?} beside a relaxed capture, on another thread: {other_thread}"
                );
                for mode in [GLOBAL, THREAD_LOCAL, RELAXED] {
                    assert_eq!(
                        call_beside_a_capture(mode, call, other_thread, true),
                        ALLOWED,
                        "{call:?} relaxed beside {mode:?}, on another thread: {other_thread}"
                    );
                }
            }
        }
    });
}
