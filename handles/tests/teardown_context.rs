//! Teardown context handling (docs/reference-notes.md section 5, "Teardown context handling", as
//! decided by docs/decisions.md D2, D3 and D9): frees run in the recipe's context, the caller's
//! binding is restored, failures are reported on drops and returned by explicit releases.

mod common;

use std::sync::Arc;

use common::*;
use cuda_sys::CudaErrorCode;
use handles::MemoryType;
use handles::{
    cleanup_error_count, drain_deferred_cleanup, CleanupStep, Consequence, ContextFlags,
    ContextHandle, ContextScope, Deallocator, DevicePtrHandle, HandleError, MemAttachFlags,
    OwnedAllocation, ReleaseKind, StreamFlags, StreamHandle,
};

#[test]
fn legacy_buffer_dropped_on_a_thread_with_no_context() {
    let _serial = start();
    let a = primary(0);
    let base = default_used(&a);
    a.make_current().unwrap();
    let me = tid();
    let from = mark();
    let buffer = pool_buffer(&StreamHandle::legacy()).unwrap();
    let legacy_of_a = with_emulator(|emu| {
        emu.one_call_on(me, "cuMemAllocFromPoolAsync", from)
            .resolved_stream
            .expect("resolved stream logged")
    });
    ContextHandle::clear_current().unwrap();
    let ptr = buffer.ptr();
    let alloc = alloc_of(ptr);

    let (worker, calls, after) = on_fresh_thread(move || {
        let me = tid();
        let from = mark();
        drop(buffer);
        let after = current_raw();
        (me, with_emulator(|emu| emu.calls_on(me, from)), after)
    });
    assert_eq!(after, 0, "thread {worker} has no context afterwards");
    assert!(errors_for(ptr).is_empty(), "{:?}", errors_for(ptr));
    assert_eq!(default_used(&a), base, "freed");
    if let Some(calls) = calls {
        let names: Vec<&str> = calls.iter().map(|c| c.function.as_str()).collect();
        assert_eq!(
            names[..4],
            [
                "cuCtxGetCurrent",
                "cuCtxSetCurrent",
                "cuMemFreeAsync",
                "cuCtxSetCurrent"
            ],
            "switch in, free, switch back: {calls:?}"
        );
        let free = &calls[2];
        assert_eq!(free.ptr, Some(ptr));
        assert_eq!(
            free.context,
            a.raw() as u64,
            "freed in the recorded context"
        );
        assert_eq!(free.stream, Some(0x1), "on the recorded token");
        assert_eq!(
            free.resolved_stream, legacy_of_a,
            "which is A's legacy stream"
        );
        assert_eq!(free.result, 0);
        assert_eq!(calls[3].context, a.raw() as u64, "the restore ran from A");
    }
    with_emulator(|emu| assert!(!emu.is_live(alloc)));
    assert_no_hazards();
}

#[test]
fn drop_with_another_context_current_frees_in_the_recorded_one_and_restores() {
    let _serial = start();
    let a = primary(0);
    let x = other_context();
    let b = ContextHandle::create(x.device(), ContextFlags::SCHED_AUTO).unwrap();
    let base = default_used(&a);
    a.make_current().unwrap();
    let buffer = pool_buffer(&StreamHandle::legacy()).unwrap();
    let ptr = buffer.ptr();
    let alloc = alloc_of(ptr);
    let d = cuda_sys::driver().unwrap();

    // This thread's stack: [X, B], B current.
    x.make_current().unwrap();
    let push = d.cuCtxPushCurrent_v2().expect("cuCtxPushCurrent");
    // SAFETY: `b` is alive for the whole test.
    assert_eq!(unsafe { push(b.raw()) }, 0);
    let me = tid();
    let from = mark();
    drop(buffer);
    with_emulator(|emu| {
        let free = emu.only_call("cuMemFreeAsync", alloc, from);
        assert_eq!(
            (free.thread, free.context, free.result),
            (me, a.raw() as u64, 0)
        );
    });
    assert_eq!(current_raw(), b.raw() as u64, "B is current again");
    assert!(errors_for(ptr).is_empty(), "{:?}", errors_for(ptr));
    let mut popped = std::ptr::null_mut();
    // SAFETY: `popped` is a valid out-pointer.
    assert_eq!(unsafe { (d.cuCtxPopCurrent_v2)(&mut popped) }, 0);
    assert_eq!(popped, b.raw());
    assert_eq!(
        current_raw(),
        x.raw() as u64,
        "the stack below the top is untouched"
    );
    ContextHandle::clear_current().unwrap();
    assert_eq!(default_used(&a), base, "freed (on A's legacy stream)");
    assert_no_hazards();
}

#[test]
fn drop_with_the_recorded_context_current_switches_nothing() {
    let _serial = start();
    let a = primary(0);
    let base = default_used(&a);
    a.make_current().unwrap();
    let buffer = pool_buffer(&StreamHandle::legacy()).unwrap();
    let ptr = buffer.ptr();
    let me = tid();
    // On the emulator, a restore fault armed now must not fire: no restore happens.
    with_emulator(|emu| emu.inject_fault("cuCtxSetCurrent", 1, CudaErrorCode::INVALID_VALUE));
    let from = mark();
    drop(buffer);
    with_emulator(|emu| {
        assert_eq!(
            emu.names_on(me, from),
            ["cuCtxGetCurrent", "cuMemFreeAsync"]
        );
        emu.clear_faults();
    });
    assert_eq!(current_raw(), a.raw() as u64);
    assert!(errors_for(ptr).is_empty(), "{:?}", errors_for(ptr));
    ContextHandle::clear_current().unwrap();
    assert_eq!(default_used(&a), base, "freed");
    assert_no_hazards();
}

/// docs/decisions.md D2: a created stream identifies its context (docs/driver-facts.md F4),
/// so its free makes no context call at all: exactly one driver call, with no context current.
#[test]
fn created_stream_buffer_dropped_with_no_context_frees_without_context_calls() {
    let _serial = start();
    let a = primary(0);
    let base = default_used(&a);
    let stream = StreamHandle::create(&a, StreamFlags::DEFAULT, 0).unwrap();
    let buffer = pool_buffer(&stream).unwrap();
    let ptr = buffer.ptr();
    let alloc = alloc_of(ptr);
    let raw_stream = stream.raw() as u64;
    drop(stream);
    let after = on_fresh_thread(move || {
        let me = tid();
        let from = mark();
        drop(buffer);
        with_emulator(|emu| {
            // The free comes first, with no context call before it; the recipe held the
            // stream's last reference, so its destruction follows (in the stream's context).
            let names = emu.names_on(me, from);
            assert_eq!(names[0], "cuMemFreeAsync", "no context call: {names:?}");
            assert!(
                names.contains(&"cuStreamDestroy_v2".to_string()),
                "{names:?}"
            );
            let free = emu.only_call("cuMemFreeAsync", alloc, from);
            assert_eq!(
                (free.context, free.stream, free.result),
                (0, Some(raw_stream), 0)
            );
        });
        current_raw()
    });
    assert_eq!(after, 0);
    assert!(errors_for(ptr).is_empty(), "{:?}", errors_for(ptr));
    assert_eq!(default_used(&a), base, "freed");
    assert_no_hazards();
}

#[test]
fn created_context_recipe_is_kept_alive_and_used() {
    let _serial = start();
    let a = primary(0);
    let base = default_used(&a);
    let c = ContextHandle::create(0, ContextFlags::SCHED_AUTO).unwrap();
    assert_eq!(
        current_raw(),
        0,
        "creating a context leaves the caller's binding alone"
    );
    let stream = StreamHandle::create(&c, StreamFlags::DEFAULT, 0).unwrap();
    let buffer = DevicePtrHandle::alloc_async(128, &stream).unwrap();
    assert_eq!(buffer.recipe().unwrap().context(), &c);
    let ptr = buffer.ptr();
    let alloc = alloc_of(ptr);
    drop((c, stream));
    let from = mark();
    // Activating a destroyed context fails: the free would be skipped and reported.
    let after = on_fresh_thread(move || {
        drop(buffer);
        current_raw()
    });
    assert_eq!(after, 0);
    assert!(errors_for(ptr).is_empty(), "{:?}", errors_for(ptr));
    // `cuMemAllocAsync` takes from the device's current pool: device 0's default here.
    assert_eq!(default_used(&a), base, "freed");
    with_emulator(|emu| {
        let free = emu.only_call("cuMemFreeAsync", alloc, from);
        // Freed on the created context's stream with no context current (D2, F4): the stream,
        // and through it the context, was still alive.
        assert_eq!((free.context, free.result), (0, 0));
        assert_eq!(free.resolved_stream.map(|_| ()), Some(()));
        let later: Vec<String> = emu
            .calls()
            .into_iter()
            .filter(|call| call.seq > free.seq)
            .map(|call| call.function)
            .collect();
        assert!(
            later.contains(&"cuStreamDestroy_v2".to_string()),
            "{later:?}"
        );
        assert!(later.contains(&"cuCtxDestroy_v2".to_string()), "{later:?}");
    });
    assert_no_hazards();
}

#[test]
fn injected_free_failure_on_drop_reaches_the_hook_once_with_attribution() {
    let _serial = start();
    let Some(emu) = emulator_or_skip("fault injection to make a free fail") else {
        return;
    };
    let a = primary(0);
    let stream = StreamHandle::create(&a, StreamFlags::DEFAULT, 0).unwrap();
    let buffer = pool_buffer(&stream).unwrap();
    let ptr = buffer.ptr();
    let before = cleanup_error_count();
    let (seen_context, count_after) = on_fresh_thread(move || {
        emu.inject_fault("cuMemFreeAsync", 1, CudaErrorCode::INVALID_VALUE);
        drop(buffer);
        (current_raw(), cleanup_error_count())
    });
    assert_eq!(seen_context, 0);
    assert_eq!(count_after - before, 1);
    let errors = errors_for(ptr);
    assert_eq!(errors.len(), 1, "{errors:?}");
    let error = &errors[0];
    assert_eq!(error.operation, "cuMemFreeAsync");
    assert_eq!(error.stream, stream.raw() as u64);
    assert_eq!(error.context, a.raw() as u64);
    assert_eq!(error.error_name(), "CUDA_ERROR_INVALID_VALUE");
    let text = error.to_string();
    assert!(
        text.contains(&format!("cuMemFreeAsync(0x{ptr:x})")),
        "{text}"
    );
    assert!(text.contains("CUDA_ERROR_INVALID_VALUE"), "{text}");
}

#[test]
fn explicit_release_returns_the_free_failure() {
    let _serial = start();
    let Some(emu) = emulator_or_skip("fault injection to make a free fail") else {
        return;
    };
    let a = primary(0);
    let stream = StreamHandle::create(&a, StreamFlags::DEFAULT, 0).unwrap();
    let buffer = pool_buffer(&stream).unwrap();
    let ptr = buffer.ptr();
    let before = cleanup_error_count();
    emu.inject_fault("cuMemFreeAsync", 1, CudaErrorCode::INVALID_VALUE);
    let error = buffer.release().unwrap_err();
    assert_eq!(error.code(), Some(CudaErrorCode::INVALID_VALUE));
    assert!(
        error.to_string().starts_with("cuMemFreeAsync failed"),
        "{error}"
    );
    assert_eq!(cleanup_error_count(), before, "returned, not reported");
    assert!(errors_for(ptr).is_empty());
    assert_eq!(current_raw(), 0);
}

#[test]
fn deinitialized_is_not_reported() {
    let _serial = start();
    let Some(emu) = emulator_or_skip("fault injection to make a free fail") else {
        return;
    };
    let a = primary(0);
    let stream = StreamHandle::create(&a, StreamFlags::DEFAULT, 0).unwrap();
    let buffer = pool_buffer(&stream).unwrap();
    let ptr = buffer.ptr();
    let before = cleanup_error_count();
    emu.inject_fault("cuMemFreeAsync", 1, CudaErrorCode::DEINITIALIZED);
    drop(buffer);
    assert_eq!(cleanup_error_count(), before);
    assert!(errors_for(ptr).is_empty());
}

#[test]
fn restore_failure_is_reported_after_a_successful_free() {
    let _serial = start();
    let Some(emu) = emulator_or_skip("fault injection to make a context restore fail") else {
        return;
    };
    let a = primary(0);
    // A token recipe: its free needs the context switch (a created stream's would make none).
    let buffer = legacy_buffer_of(&a);
    let ptr = buffer.ptr();
    let alloc = alloc_of(ptr);
    let left = on_fresh_thread(move || {
        // 1st cuCtxSetCurrent activates A, the 2nd (the restore) fails.
        emu.inject_fault("cuCtxSetCurrent", 2, CudaErrorCode::INVALID_VALUE);
        let from = mark();
        drop(buffer);
        assert_eq!(emu.only_call("cuMemFreeAsync", alloc, from).result, 0);
        let left = current_raw();
        ContextHandle::clear_current().unwrap();
        left
    });
    assert_eq!(left, a.raw() as u64, "the failed restore left A current");
    let errors = errors_for(ptr);
    assert_eq!(errors.len(), 1, "{errors:?}");
    let report = &errors[0];
    assert_eq!(
        (report.resource.as_ref(), report.operation),
        ("pool allocation", "cuMemFreeAsync")
    );
    assert_eq!(
        (report.step, report.consequence),
        (CleanupStep::RestoreContext, Consequence::Released),
        "the free succeeded; only the restore failed"
    );
    assert!(report.released() && !report.context_restored());
    assert!(
        matches!(&report.error, HandleError::Driver(e) if e.call == "cuCtxSetCurrent"),
        "{report:?}"
    );
    let text = report.to_string();
    assert!(
        text.contains("restoring the thread's previous context failed"),
        "{text}"
    );
    assert!(text.contains("it was released"), "{text}");
}

/// A pool buffer of A's on the legacy token (bound to A), allocated with A current; the calling
/// thread is left with no context.
fn legacy_buffer_of(a: &ContextHandle) -> DevicePtrHandle {
    a.make_current().unwrap();
    let buffer = pool_buffer(&StreamHandle::legacy()).unwrap();
    ContextHandle::clear_current().unwrap();
    buffer
}

/// docs/decisions.md D3: an explicit release whose free succeeded but
/// whose restore failed returns an error saying exactly that.
#[test]
fn explicit_release_whose_restore_fails_says_the_free_succeeded() {
    let _serial = start();
    let Some(emu) = emulator_or_skip("fault injection to make a context restore fail") else {
        return;
    };
    let a = primary(0);
    let base = default_used(&a);
    let buffer = legacy_buffer_of(&a);
    let ptr = buffer.ptr();
    let error = on_fresh_thread(move || {
        emu.inject_fault("cuCtxSetCurrent", 2, CudaErrorCode::INVALID_VALUE);
        let error = buffer.release().unwrap_err();
        ContextHandle::clear_current().unwrap();
        error
    });
    match &error {
        HandleError::ContextNotRestored {
            operation,
            previous,
            context,
            error: cause,
        } => {
            assert_eq!(*operation, "cuMemFreeAsync");
            assert_eq!((*previous, *context), (0, a.raw() as u64));
            assert_eq!(cause.call, "cuCtxSetCurrent");
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(error.code(), Some(CudaErrorCode::INVALID_VALUE));
    let text = error.to_string();
    assert!(text.starts_with("cuMemFreeAsync succeeded"), "{text}");
    assert!(text.contains("was not restored"), "{text}");
    assert!(errors_for(ptr).is_empty(), "returned, not reported");
    assert_eq!(default_used(&a), base, "freed");
}

#[test]
fn activation_failure_skips_the_free_and_reports() {
    let _serial = start();
    let Some(emu) = emulator_or_skip("fault injection to make a context activation fail") else {
        return;
    };
    let a = primary(0);
    let base = default_used(&a);
    let buffer = legacy_buffer_of(&a);
    let ptr = buffer.ptr();
    let alloc = alloc_of(ptr);
    let from = mark();
    on_fresh_thread(move || {
        emu.inject_fault("cuCtxSetCurrent", 1, CudaErrorCode::INVALID_VALUE);
        drop(buffer);
        assert_eq!(current_raw(), 0);
    });
    assert!(
        emu.calls_for(alloc, from)
            .iter()
            .all(|c| c.function != "cuMemFreeAsync"),
        "never freed in the wrong context"
    );
    let errors = errors_for(ptr);
    assert_eq!(errors.len(), 1, "{errors:?}");
    let report = &errors[0];
    assert_eq!(
        (report.step, report.consequence),
        (CleanupStep::ActivateContext, Consequence::Leaked)
    );
    assert_eq!(report.resource, "pool allocation");
    let text = report.to_string();
    assert!(text.contains("making its context current failed"), "{text}");
    assert!(text.contains("leaked"), "{text}");
    // The leaked memory is the test's now: give it back.
    give_back(ptr, &a);
    assert_eq!(default_used(&a), base);
}

/// An explicit release whose context cannot be made current says the free did not run.
#[test]
fn explicit_release_whose_activation_fails_says_nothing_ran() {
    let _serial = start();
    let Some(emu) = emulator_or_skip("fault injection to make a context activation fail") else {
        return;
    };
    let a = primary(0);
    let base = default_used(&a);
    let buffer = legacy_buffer_of(&a);
    let ptr = buffer.ptr();
    let error = on_fresh_thread(move || {
        emu.inject_fault("cuCtxSetCurrent", 1, CudaErrorCode::INVALID_VALUE);
        buffer.release().unwrap_err()
    });
    assert!(
        matches!(&error, HandleError::ContextNotActivated { operation: "cuMemFreeAsync", context, .. }
            if *context == a.raw() as u64),
        "{error:?}"
    );
    assert!(
        error.to_string().starts_with("cuMemFreeAsync did not run"),
        "{error}"
    );
    assert!(errors_for(ptr).is_empty(), "returned, not reported");
    give_back(ptr, &a);
    assert_eq!(default_used(&a), base);
}

/// Frees pool memory at `ptr` that custody leaked (a test made it leak), on a created stream of
/// `a`.
fn give_back(ptr: u64, a: &ContextHandle) {
    let stream = StreamHandle::create(a, StreamFlags::DEFAULT, 0).unwrap();
    // SAFETY: the handle that owned `ptr` is gone without freeing it (the test made the free
    // fail before it ran); nothing else frees or uses it.
    let leaked = unsafe { handles::raw::owned_allocation(ptr, POOL_BUFFER as usize) };
    leaked.free_async(&stream).unwrap();
    stream.synchronize().unwrap();
}

/// Records every `deallocate` call's current context, then fails it.
struct ContextRecordingFailingDeallocator(std::sync::Mutex<Vec<u64>>);

impl Deallocator for ContextRecordingFailingDeallocator {
    fn deallocate(&self, allocation: OwnedAllocation, _: &StreamHandle) -> Result<(), HandleError> {
        let _ = allocation.into_raw();
        self.0.lock().unwrap().push(current_raw());
        Err(HandleError::deallocator("refused"))
    }
}

#[test]
fn hook_runs_after_the_context_was_restored() {
    let _serial = start();
    let a = primary(0);
    let b = other_context();
    let stream = StreamHandle::create(&a, StreamFlags::DEFAULT, 0).unwrap();
    // A failing deallocator (any driver), and on the emulator a failing cuMemFreeAsync.
    let deallocator = Arc::new(ContextRecordingFailingDeallocator(Default::default()));
    let adopted =
        DevicePtrHandle::adopt(test_allocation(0x4000, 8), &stream, deallocator.clone()).unwrap();
    let buffer = pool_buffer(&stream).unwrap();
    let ptr = buffer.ptr();
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let seen2 = seen.clone();
    // A local hook for this test only; the shared capture hook is put back afterwards.
    handles::set_cleanup_error_hook(Box::new(move |e| {
        if e.ptr == ptr || e.ptr == 0x4000 {
            seen2.lock().unwrap().push((e.ptr, current_raw()));
        }
    }));
    b.make_current().unwrap();
    drop(adopted);
    let injected =
        with_emulator(|emu| emu.inject_fault("cuMemFreeAsync", 1, CudaErrorCode::INVALID_VALUE))
            .is_some();
    drop(buffer);
    handles::reset_cleanup_error_hook();
    reinstall_capture_hook();
    assert_eq!(
        deallocator.0.lock().unwrap().clone(),
        [a.raw() as u64],
        "the deallocator ran in the recipe's context"
    );
    let mut expected = vec![(0x4000, b.raw() as u64)];
    if injected {
        expected.push((ptr, b.raw() as u64));
    }
    assert_eq!(seen.lock().unwrap().clone(), expected);
    ContextHandle::clear_current().unwrap();
}

fn reinstall_capture_hook() {
    handles::set_cleanup_error_hook(Box::new(|e| {
        captured().errors.lock().unwrap().push(e.clone());
    }));
}

#[test]
fn context_scope_switches_only_when_needed_and_restores_none() {
    let _serial = start();
    let a = primary(0);
    let me = tid();
    let from = mark();
    {
        let scope = ContextScope::enter(&a).unwrap();
        assert!(scope.switched());
        assert!(scope.previous().is_null());
        assert_eq!(current_raw(), a.raw() as u64);
        let inner = ContextScope::enter(&a).unwrap();
        assert!(!inner.switched());
        inner.exit().unwrap();
        assert_eq!(current_raw(), a.raw() as u64);
    }
    assert_eq!(current_raw(), 0);
    with_emulator(|emu| {
        assert_eq!(
            emu.names_on(me, from)
                .iter()
                .filter(|n| *n == "cuCtxSetCurrent")
                .count(),
            2
        );
    });
}

#[test]
fn synchronous_free_on_drop_never_blocks_and_is_ordered_by_an_event() {
    let _serial = start();
    let a = primary(0);
    let stream = StreamHandle::create(&a, StreamFlags::DEFAULT, 0).unwrap();
    let buffer = DevicePtrHandle::alloc(512, &stream).unwrap();
    assert_eq!(buffer.kind(), ReleaseKind::Synchronous);
    let ptr = buffer.ptr();
    let alloc = alloc_of(ptr);
    assert_eq!(
        attributes(ptr).map(|at| (at.device_ordinal, at.is_managed)),
        Some((0, false)),
        "device memory the driver knows"
    );
    let me = tid();
    let from = mark();
    drop(buffer);
    assert_eq!(current_raw(), 0, "the drop restored this thread's binding");
    with_emulator(|emu| {
        let names = emu.names_on(me, from);
        assert!(names.contains(&"cuEventRecord".to_string()), "{names:?}");
        for blocking in ["cuMemFree_v2", "cuEventSynchronize", "cuStreamSynchronize"] {
            assert!(
                !names.iter().any(|n| n == blocking),
                "drop called {blocking}: {names:?}"
            );
        }
    });
    drain_deferred_cleanup();
    assert_eq!(
        attributes(ptr),
        None,
        "freed: the driver no longer knows it"
    );
    assert!(errors_for(ptr).is_empty(), "{:?}", errors_for(ptr));
    with_emulator(|emu| {
        let free = emu.only_call("cuMemFree_v2", alloc, from);
        assert_eq!((free.context, free.result), (a.raw() as u64, 0));
        assert!(!emu.is_live(alloc));
    });
    assert_eq!(current_raw(), 0, "the drain restored this thread's binding");
    assert_no_hazards();
}

#[test]
fn synchronous_free_is_done_by_the_worker_without_a_drain() {
    let _serial = start();
    let a = primary(0);
    let stream = StreamHandle::create(&a, StreamFlags::DEFAULT, 0).unwrap();
    let buffer = DevicePtrHandle::alloc(64, &stream).unwrap();
    let ptr = buffer.ptr();
    let alloc = alloc_of(ptr);
    assert!(attributes(ptr).is_some());
    let from = mark();
    drop(buffer);
    // Wait (bounded, not timed) for the worker: it frees in A on its own thread, and then the
    // driver no longer knows the address.
    let mut freed = false;
    for _ in 0..10_000 {
        if attributes(ptr).is_none() {
            freed = true;
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
    assert!(freed, "the worker freed the buffer");
    assert!(errors_for(ptr).is_empty(), "{:?}", errors_for(ptr));
    assert_eq!(current_raw(), 0);
    with_emulator(|emu| {
        let free = emu.only_call("cuMemFree_v2", alloc, from);
        assert_ne!(free.thread, emu.thread_id(), "freed on the cleanup worker");
        assert_eq!((free.context, free.result), (a.raw() as u64, 0));
    });
    assert_no_hazards();
}

#[test]
fn synchronous_explicit_release_blocks_and_returns() {
    let _serial = start();
    let a = primary(0);
    let stream = StreamHandle::create(&a, StreamFlags::DEFAULT, 0).unwrap();
    let buffer = DevicePtrHandle::alloc(64, &stream).unwrap();
    let ptr = buffer.ptr();
    let alloc = alloc_of(ptr);
    assert!(attributes(ptr).is_some());
    let me = tid();
    let from = mark();
    buffer.release().unwrap();
    // No drain: the release itself freed, on this thread.
    assert_eq!(attributes(ptr), None, "freed by the time release returned");
    assert_eq!(current_raw(), 0);
    with_emulator(|emu| {
        let free = emu.only_call("cuMemFree_v2", alloc, from);
        // D2: on a created stream, `cuStreamSynchronize` and `cuMemFree` need no context (F5,
        // F6): none is made current.
        assert_eq!((free.thread, free.context, free.result), (me, 0, 0));
        assert_eq!(
            emu.names_on(me, from)[..2],
            ["cuStreamSynchronize", "cuMemFree_v2"],
            "no context call before the free"
        );

        // A failing free is returned.
        let buffer = DevicePtrHandle::alloc(64, &stream).unwrap();
        emu.inject_fault("cuMemFree_v2", 1, CudaErrorCode::INVALID_VALUE);
        let error = buffer.release().unwrap_err();
        assert_eq!(error.code(), Some(CudaErrorCode::INVALID_VALUE));
        assert_eq!(current_raw(), 0);
    });
    assert_no_hazards();
}

#[test]
fn pinned_host_and_managed_frees_go_through_the_worker() {
    let _serial = start();
    let a = primary(0);
    let stream = StreamHandle::create(&a, StreamFlags::DEFAULT, 0).unwrap();
    let host = DevicePtrHandle::alloc_host(256, &stream).unwrap();
    assert_eq!(
        (host.kind(), host.device()),
        (ReleaseKind::PinnedHost, None)
    );
    let managed = DevicePtrHandle::alloc_managed(256, MemAttachFlags::GLOBAL, &stream).unwrap();
    assert_eq!(managed.kind(), ReleaseKind::Managed);
    let (host_ptr, managed_ptr) = (host.ptr(), managed.ptr());
    let (host_alloc, managed_alloc) = (alloc_of(host_ptr), alloc_of(managed_ptr));
    assert!(attributes(host_ptr).is_some_and(|at| at.memory_type == MemoryType::Host));
    assert!(attributes(managed_ptr).is_some_and(|at| at.is_managed));
    let from = mark();
    on_fresh_thread(move || {
        drop((host, managed));
        assert_eq!(current_raw(), 0);
    });
    drain_deferred_cleanup();
    assert_eq!(attributes(host_ptr), None, "pinned host memory freed");
    assert_eq!(attributes(managed_ptr), None, "managed memory freed");
    assert!(errors_for(host_ptr).is_empty() && errors_for(managed_ptr).is_empty());
    with_emulator(|emu| {
        assert_eq!(emu.only_call("cuMemFreeHost", host_alloc, from).result, 0);
        let managed_free = emu.only_call("cuMemFree_v2", managed_alloc, from);
        assert_eq!(
            (managed_free.context, managed_free.result),
            (a.raw() as u64, 0)
        );
    });
    assert_no_hazards();
}

struct FailingDeallocator;

impl Deallocator for FailingDeallocator {
    fn deallocate(&self, allocation: OwnedAllocation, _: &StreamHandle) -> Result<(), HandleError> {
        let _ = allocation.into_raw();
        Err(HandleError::deallocator("pool exhausted"))
    }

    fn name(&self) -> &str {
        "FailingResource"
    }
}

#[test]
fn deallocator_failure_is_reported_on_drop_and_returned_on_release() {
    let _serial = start();
    let a = primary(0);
    let stream = StreamHandle::create(&a, StreamFlags::DEFAULT, 0).unwrap();
    let dropped = DevicePtrHandle::adopt(
        test_allocation(0x3000, 8),
        &stream,
        Arc::new(FailingDeallocator),
    )
    .unwrap();
    drop(dropped);
    let errors = errors_for(0x3000);
    assert_eq!(errors.len(), 1);
    assert_eq!(
        (errors[0].resource.as_ref(), errors[0].operation),
        ("FailingResource", "deallocate"),
        "named as its user knows it"
    );
    assert_eq!(
        (errors[0].step, errors[0].consequence),
        (CleanupStep::Operation, Consequence::Leaked)
    );
    assert_eq!(errors[0].context, a.raw() as u64);
    assert!(
        errors[0]
            .to_string()
            .starts_with("deallocate(0x3000) [FailingResource]"),
        "{}",
        errors[0]
    );

    let released = DevicePtrHandle::adopt(
        test_allocation(0x3100, 8),
        &stream,
        Arc::new(FailingDeallocator),
    )
    .unwrap();
    let error = released.release().unwrap_err();
    assert_eq!(error.to_string(), "deallocator failed: pool exhausted");
    assert!(errors_for(0x3100).is_empty());
}

/// What a [`PanickingDeallocator`] does with its token before it panics (or, for
/// `FreeThenFail`, returns an error).
#[derive(Clone, Copy)]
enum BeforePanic {
    /// Frees it with `OwnedAllocation::free_async`.
    Free,
    /// Drops it unfreed.
    Drop,
    /// Takes the address with `into_raw` (and frees nothing).
    IntoRaw,
    /// Frees it with `free_async`, then returns an error instead of panicking.
    FreeThenFail,
}

struct PanickingDeallocator(BeforePanic);

impl Deallocator for PanickingDeallocator {
    fn deallocate(
        &self,
        allocation: OwnedAllocation,
        stream: &StreamHandle,
    ) -> Result<(), HandleError> {
        match self.0 {
            BeforePanic::Free => allocation.free_async(stream)?,
            BeforePanic::Drop => drop(allocation),
            BeforePanic::IntoRaw => {
                let _ = allocation.into_raw();
            }
            BeforePanic::FreeThenFail => {
                allocation.free_async(stream)?;
                return Err(HandleError::deallocator(
                    "bookkeeping failed after the free",
                ));
            }
        }
        panic!("deallocator bug")
    }

    fn name(&self) -> &str {
        "PanickingResource"
    }
}

/// A real pool allocation of [`POOL_BUFFER`] bytes on `stream`, adopted with `deallocator`.
fn adopted_pool_memory(
    stream: &StreamHandle,
    deallocator: PanickingDeallocator,
) -> DevicePtrHandle {
    let elsewhere = pool_buffer(stream).unwrap();
    let (ptr, size) = (elsewhere.ptr(), elsewhere.size());
    std::mem::forget(elsewhere);
    // SAFETY: a pool allocation whose handle was forgotten: nothing else frees it.
    let allocation = unsafe { handles::raw::owned_allocation(ptr, size) };
    DevicePtrHandle::adopt(allocation, stream, Arc::new(deallocator)).unwrap()
}

fn panic_of(error: &HandleError) -> handles::DeallocatorPanic {
    let HandleError::Deallocator { source } = error else {
        panic!("{error:?}")
    };
    source
        .downcast_ref::<handles::DeallocatorPanic>()
        .unwrap_or_else(|| panic!("not a panic: {source}"))
        .clone()
}

#[test]
fn a_deallocator_that_frees_then_panics_is_reported_as_released() {
    let _serial = start();
    let a = primary(0);
    let stream = StreamHandle::create(&a, StreamFlags::DEFAULT, 0).unwrap();
    let base = default_used(&a);

    let dropped = adopted_pool_memory(&stream, PanickingDeallocator(BeforePanic::Free));
    let ptr = dropped.ptr();
    drop(dropped);
    assert_eq!(default_used(&a), base, "the deallocator freed it");
    let errors = errors_for(ptr);
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert_eq!(
        (errors[0].step, errors[0].consequence),
        (CleanupStep::Operation, Consequence::Released),
        "{}",
        errors[0]
    );
    assert!(errors[0].released());
    let text = errors[0].to_string();
    assert!(
        text.starts_with("deallocate(0x") && text.contains("[PanickingResource]"),
        "{text}"
    );
    assert!(
        text.ends_with(
            "failed: deallocator failed: the deallocator panicked after freeing the memory: \
             deallocator bug; it was released"
        ),
        "{text}"
    );
    assert!(!text.contains("leaked"), "{text}");
    assert_eq!(
        panic_of(&errors[0].error),
        handles::DeallocatorPanic {
            freed: Some(true),
            message: Some("deallocator bug".into())
        }
    );

    // The pool hands the address out again (docs/driver-facts.md F18): only new reports count.
    captured().errors.lock().unwrap().clear();
    let released = adopted_pool_memory(&stream, PanickingDeallocator(BeforePanic::Free));
    let ptr = released.ptr();
    let error = released.release().unwrap_err();
    assert_eq!(panic_of(&error).freed, Some(true), "{error}");
    assert_eq!(default_used(&a), base, "freed");
    assert!(errors_for(ptr).is_empty(), "returned, not reported");

    // An error returned after one of the token's frees succeeded: released, not leaked.
    let failed = adopted_pool_memory(&stream, PanickingDeallocator(BeforePanic::FreeThenFail));
    let ptr = failed.ptr();
    drop(failed);
    assert_eq!(default_used(&a), base, "freed");
    let errors = errors_for(ptr);
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert_eq!(
        errors[0].consequence,
        Consequence::Released,
        "{}",
        errors[0]
    );
    assert_no_hazards();
}

#[test]
fn a_deallocator_that_panics_unfreed_or_out_of_sight_says_leaked_or_unknown() {
    let _serial = start();
    let a = primary(0);
    let stream = StreamHandle::create(&a, StreamFlags::DEFAULT, 0).unwrap();

    let dropped = DevicePtrHandle::adopt(
        test_allocation(0x3200, 8),
        &stream,
        Arc::new(PanickingDeallocator(BeforePanic::Drop)),
    )
    .unwrap();
    drop(dropped);
    let errors = errors_for(0x3200);
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert_eq!(errors[0].consequence, Consequence::Leaked);
    assert_eq!(panic_of(&errors[0].error).freed, Some(false));
    let text = errors[0].to_string();
    assert!(
        text.contains("the deallocator panicked without freeing the memory: deallocator bug")
            && text.ends_with("nothing was released: it has leaked"),
        "{text}"
    );

    let raw = DevicePtrHandle::adopt(
        test_allocation(0x3300, 8),
        &stream,
        Arc::new(PanickingDeallocator(BeforePanic::IntoRaw)),
    )
    .unwrap();
    drop(raw);
    let errors = errors_for(0x3300);
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert_eq!(errors[0].consequence, Consequence::Unknown);
    assert!(!errors[0].released());
    assert_eq!(panic_of(&errors[0].error).freed, None);
    let text = errors[0].to_string();
    assert!(
        text.contains("whether it freed the memory cannot be known")
            && text.ends_with("whether it was released cannot be known"),
        "{text}"
    );
    assert!(!text.contains("leaked"), "{text}");

    // The host-only path (no recipe) tells the same.
    let host = DevicePtrHandle::adopt_host(
        test_allocation(0x3400, 8),
        Arc::new(PanickingDeallocator(BeforePanic::IntoRaw)),
    )
    .unwrap();
    drop(host);
    let errors = errors_for(0x3400);
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert_eq!(errors[0].consequence, Consequence::Unknown);
}

/// Records each call's stream (raw) and the context current during it; fails when told to.
struct HostRecordingDeallocator {
    seen: std::sync::Mutex<Vec<(usize, u64)>>,
    fail: bool,
}

impl Deallocator for HostRecordingDeallocator {
    fn deallocate(
        &self,
        allocation: OwnedAllocation,
        stream: &StreamHandle,
    ) -> Result<(), HandleError> {
        let _ = allocation.into_raw();
        let current = ContextHandle::current()
            .ok()
            .flatten()
            .map_or(0, |c| c.raw() as u64);
        self.seen
            .lock()
            .unwrap()
            .push((stream.raw() as usize, current));
        if self.fail {
            return Err(HandleError::deallocator("host free refused"));
        }
        Ok(())
    }
}

#[test]
fn host_deallocator_has_no_recipe_and_needs_no_context() {
    let _serial = start();
    let a = primary(0);
    let created = StreamHandle::create(&a, StreamFlags::DEFAULT, 0).unwrap();
    let deallocator = Arc::new(HostRecordingDeallocator {
        seen: Default::default(),
        fail: false,
    });
    let seen = on_fresh_thread({
        let deallocator = deallocator.clone();
        move || {
            let handle =
                DevicePtrHandle::adopt_host(test_allocation(0x5000, 16), deallocator.clone())
                    .unwrap();
            assert_eq!(handle.kind(), ReleaseKind::HostDeallocator);
            assert!(handle.recipe().is_none());
            // Nothing to order for host-only memory: recorded nowhere, no "no context" error.
            handle
                .set_deallocation_stream(&StreamHandle::legacy())
                .unwrap();
            handle.set_deallocation_stream(&created).unwrap();
            assert!(handle.recipe().is_none());
            handle.release().unwrap();
            let dropped =
                DevicePtrHandle::adopt_host(test_allocation(0x5100, 8), deallocator.clone())
                    .unwrap();
            drop(dropped);
            current_raw()
        }
    });
    assert_eq!(seen, 0);
    // The legacy token, with no context current (the thread never had one).
    assert_eq!(*deallocator.seen.lock().unwrap(), vec![(1, 0), (1, 0)]);
    let refused = DevicePtrHandle::adopt_host(test_allocation(0, 8), deallocator.clone());
    assert!(matches!(
        refused,
        Err(handles::AdoptError {
            error: HandleError::InvalidArgument { what: "ptr", .. },
            ..
        })
    ));
}

#[test]
fn host_deallocator_failure_is_reported_on_drop_and_returned_on_release() {
    let _serial = start();
    let failing = Arc::new(HostRecordingDeallocator {
        seen: Default::default(),
        fail: true,
    });
    drop(DevicePtrHandle::adopt_host(test_allocation(0x5200, 8), failing.clone()).unwrap());
    let errors = errors_for(0x5200);
    assert_eq!(errors.len(), 1);
    assert_eq!(errors[0].operation, "deallocate");
    assert!(errors[0].resource.contains("HostRecordingDeallocator"));
    assert_eq!(errors[0].consequence, handles::Consequence::Leaked);
    assert_eq!((errors[0].stream, errors[0].context), (1, 0));
    let released = DevicePtrHandle::adopt_host(test_allocation(0x5300, 8), failing).unwrap();
    let error = released.release().unwrap_err();
    assert_eq!(error.to_string(), "deallocator failed: host free refused");
    assert!(errors_for(0x5300).is_empty());
}
