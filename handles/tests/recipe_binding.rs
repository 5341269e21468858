//! Recipe capture and binding (docs/reference-notes.md section 5, "Recipe capture and binding",
//! as decided by docs/decisions.md D1 and D5), plus bad-input cases.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use common::*;
use handles::{
    ContextHandle, ContextKind, DeallocationRecipe, Deallocator, DefaultStream, DevicePtrHandle,
    HandleError, MemAttachFlags, OwnedAllocation, ReleaseKind, StreamFlags, StreamHandle,
    ThreadToken,
};

/// Records every `deallocate` call: (ptr, size, stream, context current during the call).
#[derive(Default)]
struct RecordingDeallocator {
    calls: Mutex<Vec<(u64, usize, u64, u64)>>,
}

impl Deallocator for RecordingDeallocator {
    fn deallocate(
        &self,
        allocation: OwnedAllocation,
        stream: &StreamHandle,
    ) -> Result<(), HandleError> {
        let (ptr, size) = allocation.into_raw();
        let current = ContextHandle::current()?.map_or(0, |c| c.raw() as u64);
        self.calls
            .lock()
            .unwrap()
            .push((ptr, size, stream.raw() as u64, current));
        Ok(())
    }
}

#[test]
fn legacy_token_binds_the_current_context_and_no_thread() {
    let _serial = start();
    let a = primary(0);
    let base = default_used(&a);
    a.make_current().unwrap();
    let buffer = pool_buffer(&StreamHandle::legacy()).unwrap();
    let recipe = buffer.recipe().unwrap();
    assert_eq!(recipe.stream().default_kind(), Some(DefaultStream::Legacy));
    assert_eq!(recipe.stream().raw() as usize, 0x1);
    assert_eq!(recipe.context(), &a);
    assert_eq!(
        recipe.context().kind(),
        ContextKind::Primary,
        "bound primary context is retained"
    );
    assert_eq!(recipe.ptds_thread(), None);
    let ptr = buffer.ptr();
    let alloc = alloc_of(ptr);
    let from = mark();
    buffer.release().unwrap();
    assert_eq!(current_raw(), a.raw() as u64);
    assert_eq!(default_used(&a), base, "freed");
    with_emulator(|emu| {
        let free = emu.only_call("cuMemFreeAsync", alloc, from);
        assert_eq!(
            (free.context, free.stream, free.result),
            (a.raw() as u64, Some(1), 0)
        );
    });
    assert_no_hazards();
    ContextHandle::clear_current().unwrap();
}

#[test]
fn per_thread_token_binds_the_context_and_the_recording_thread() {
    let _serial = start();
    let a = primary(0);
    let (recipe, recorder) = on_fresh_thread(move || {
        a.make_current().unwrap();
        let recipe = DeallocationRecipe::record(&StreamHandle::per_thread()).unwrap();
        ContextHandle::clear_current().unwrap();
        (recipe, ThreadToken::current())
    });
    assert_eq!(
        recipe.stream().default_kind(),
        Some(DefaultStream::PerThread)
    );
    assert_eq!(recipe.context(), &primary(0));
    assert_eq!(recipe.ptds_thread(), Some(recorder));
    assert_ne!(recipe.ptds_thread(), Some(ThreadToken::current()));
}

#[test]
fn created_stream_brings_its_context_without_a_lookup() {
    let _serial = start();
    let a = primary(0);
    let stream = StreamHandle::create(&a, StreamFlags::DEFAULT, 0).unwrap();
    let me = tid();
    let from = mark();
    let recipe = DeallocationRecipe::record(&stream).unwrap();
    with_emulator(|emu| {
        assert!(
            emu.names_on(me, from).is_empty(),
            "recording a created stream calls nothing"
        );
    });
    assert!(recipe.stream().ptr_eq(&stream));
    assert_eq!(recipe.context(), &a);
    assert_eq!(recipe.ptds_thread(), None);

    // A whole allocation then costs the allocation alone: a stream-ordered allocation on a
    // created stream needs no context (docs/decisions.md D2; the allocation probe in
    // docs/driver-probe/), though this thread has none.
    let pool = default_pool();
    let base = default_used(&a);
    let from = mark();
    let buffer = DevicePtrHandle::alloc_from_pool(256, &pool, &stream).unwrap();
    with_emulator(|emu| {
        assert_eq!(emu.names_on(me, from), ["cuMemAllocFromPoolAsync"]);
    });
    assert_eq!(current_raw(), 0, "the allocation restored no context");
    assert!(buffer.recipe().unwrap().stream().ptr_eq(&stream));
    drop(buffer);
    assert_eq!(current_raw(), 0);
    assert_eq!(default_used(&a), base, "freed");
    assert_no_hazards();
}

#[test]
fn token_with_no_current_context_fails_with_one_error_and_allocates_nothing() {
    let _serial = start();
    let a = primary(0);
    let pool = default_pool();
    let base = default_used(&a);
    on_fresh_thread(move || {
        let me = tid();
        let from = mark();
        for stream in [
            StreamHandle::legacy(),
            StreamHandle::per_thread(),
            StreamHandle::default_stream(DefaultStream::Null),
        ] {
            let error = DevicePtrHandle::alloc_from_pool(64, &pool, &stream).unwrap_err();
            assert_eq!(error, HandleError::NoCurrentContext);
            assert_eq!(error.to_string(), "no CUDA context is current");
            assert_eq!(
                DeallocationRecipe::record(&stream).unwrap_err(),
                HandleError::NoCurrentContext
            );
        }
        with_emulator(|emu| {
            let names = emu.names_on(me, from);
            assert!(
                names.iter().all(|n| n == "cuCtxGetCurrent"),
                "only context queries, no allocation: {names:?}"
            );
        });
        assert_eq!(current_raw(), 0);
        // A driver-side "no context" on an unbound token reads the same.
        assert_eq!(
            StreamHandle::legacy().synchronize().unwrap_err(),
            HandleError::NoCurrentContext
        );
    });
    assert_eq!(default_used(&a), base, "nothing allocated");
}

#[test]
fn adopt_binds_first_and_leaves_the_pointer_with_the_caller_on_failure() {
    let _serial = start();
    let _a = primary(0);
    let deallocator = Arc::new(RecordingDeallocator::default());
    let dyn_deallocator: Arc<dyn Deallocator> = deallocator.clone();
    let refused = on_fresh_thread(move || {
        let allocation = test_allocation(0x5000, 64);
        let refused = DevicePtrHandle::adopt(allocation, &StreamHandle::legacy(), dyn_deallocator)
            .unwrap_err();
        (refused.error, refused.allocation.into_raw())
    });
    assert_eq!(refused.0, HandleError::NoCurrentContext);
    assert_eq!(refused.1, (0x5000, 64), "the allocation is given back");
    assert!(
        deallocator.calls.lock().unwrap().is_empty(),
        "deallocate must not run"
    );
}

#[test]
fn adopt_with_a_stream_deallocates_with_that_stream_in_its_context() {
    let _serial = start();
    let a = primary(0);
    let stream = StreamHandle::create(&a, StreamFlags::DEFAULT, 0).unwrap();
    let deallocator = Arc::new(RecordingDeallocator::default());
    let buffer =
        DevicePtrHandle::adopt(test_allocation(0x7000, 96), &stream, deallocator.clone()).unwrap();
    assert_eq!(buffer.kind(), ReleaseKind::Deallocator);
    on_fresh_thread(move || {
        drop(buffer);
        assert_eq!(
            current_raw(),
            0,
            "the dropping thread is left with no context"
        );
    });
    let calls = deallocator.calls.lock().unwrap().clone();
    assert_eq!(calls, [(0x7000, 96, stream.raw() as u64, a.raw() as u64)]);
}

#[test]
fn default_token_recipe_runs_the_deallocator_in_the_bound_context() {
    let _serial = start();
    let a = primary(0);
    a.make_current().unwrap();
    let deallocator = Arc::new(RecordingDeallocator::default());
    let buffer = DevicePtrHandle::adopt(
        test_allocation(0x9000, 8),
        &StreamHandle::legacy(),
        deallocator.clone(),
    )
    .unwrap();
    ContextHandle::clear_current().unwrap();
    on_fresh_thread(move || drop(buffer));
    assert_eq!(
        deallocator.calls.lock().unwrap().clone(),
        [(0x9000, 8, 0x1, a.raw() as u64)]
    );
}

#[test]
fn raw_token_value_wraps_as_the_token() {
    let _serial = start();
    let a = primary(0);
    a.make_current().unwrap();
    // SAFETY: a token value: custody never hands it to the driver as a stream of its own.
    let wrapped = unsafe { handles::raw::wrap_stream(0x2, None) }.unwrap();
    assert_eq!(wrapped.default_kind(), Some(DefaultStream::PerThread));
    assert!(
        wrapped.context().is_none(),
        "the value decides: an unbound token"
    );
    let recipe = DeallocationRecipe::record(&wrapped).unwrap();
    assert_eq!(recipe.context(), &a);
    assert_eq!(recipe.ptds_thread(), Some(ThreadToken::current()));
    ContextHandle::clear_current().unwrap();
}

#[test]
fn wrapping_an_owned_stream_returns_the_owning_handle() {
    let _serial = start();
    let a = primary(0);
    let stream = StreamHandle::create(&a, StreamFlags::DEFAULT, 0).unwrap();
    // SAFETY: `stream` is a live stream this crate owns (and returns as the owning handle).
    let wrapped = unsafe { handles::raw::wrap_stream(stream.raw() as usize, None) }.unwrap();
    assert!(wrapped.ptr_eq(&stream));
    assert!(wrapped.is_owned());
}

#[test]
fn foreign_stream_gets_its_context_from_the_driver_when_wrapped() {
    let _serial = start();
    let a = primary(0);
    let d = cuda_sys::driver().unwrap();
    a.make_current().unwrap();
    let mut raw: cuda_sys::types::CUstream = std::ptr::null_mut();
    // SAFETY: `raw` is a valid out-pointer; a context is current.
    let status = unsafe { (d.cuStreamCreate().expect("cuStreamCreate"))(&mut raw, 0) };
    assert_eq!(status, 0);
    ContextHandle::clear_current().unwrap();

    let me = tid();
    let from = mark();
    // SAFETY: `raw` was created above and is destroyed only after the wrapper is gone.
    let wrapped = unsafe { handles::raw::wrap_stream(raw as usize, None) }.unwrap();
    with_emulator(|emu| {
        assert!(emu
            .names_on(me, from)
            .contains(&"cuStreamGetCtx".to_string()));
    });
    assert_eq!(wrapped.context(), Some(&a));
    assert!(!wrapped.is_owned());
    assert_eq!(current_raw(), 0);
    let base = default_used(&a);
    let buffer = pool_buffer(&wrapped).unwrap();
    assert_eq!(buffer.recipe().unwrap().context(), &a);
    let ptr = buffer.ptr();
    let alloc = alloc_of(ptr);
    let from = mark();
    drop(buffer);
    assert_eq!(current_raw(), 0);
    assert!(errors_for(ptr).is_empty(), "{:?}", errors_for(ptr));
    wrapped.synchronize().unwrap();
    assert_eq!(default_used(&a), base, "freed");
    with_emulator(|emu| {
        let free = emu.only_call("cuMemFreeAsync", alloc, from);
        // D2: a wrapped stream identifies its context (F4): no context is made current.
        assert_eq!((free.context, free.stream), (0, Some(raw as u64)));
    });
    drop(wrapped);
    a.make_current().unwrap();
    // SAFETY: the stream was created above and nothing uses it any more.
    assert_eq!(unsafe { (d.cuStreamDestroy_v2)(raw) }, 0);
    ContextHandle::clear_current().unwrap();
    assert_no_hazards();
}

#[test]
fn set_deallocation_stream_moves_the_free_and_every_clone_sees_it() {
    let _serial = start();
    let a = primary(0);
    let base = default_used(&a);
    let s1 = StreamHandle::create(&a, StreamFlags::DEFAULT, 0).unwrap();
    let s2 = StreamHandle::create(&a, StreamFlags::DEFAULT, 0).unwrap();
    let buffer = pool_buffer(&s1).unwrap();
    let attachment = buffer.clone();
    buffer.set_deallocation_stream(&s2).unwrap();
    assert!(attachment.deallocation_stream().unwrap().ptr_eq(&s2));
    // Work on s1 must be ordered before the free on s2: the caller's job (D4).
    let event = handles::EventHandle::create(&a, handles::EventFlags::DISABLE_TIMING).unwrap();
    event.record(&s1).unwrap();
    s2.wait_event(&event).unwrap();
    let ptr = buffer.ptr();
    let alloc = alloc_of(ptr);
    drop(buffer);
    let from = mark();
    drop(attachment);
    assert!(errors_for(ptr).is_empty(), "{:?}", errors_for(ptr));
    s2.synchronize().unwrap();
    assert_eq!(default_used(&a), base, "freed");
    with_emulator(|emu| {
        let free = emu.only_call("cuMemFreeAsync", alloc, from);
        assert_eq!(free.stream, Some(s2.raw() as u64));
    });
    assert_no_hazards();
}

#[test]
fn failed_set_deallocation_stream_keeps_the_old_recipe() {
    let _serial = start();
    let a = primary(0);
    let base = default_used(&a);
    let s1 = StreamHandle::create(&a, StreamFlags::DEFAULT, 0).unwrap();
    let buffer = pool_buffer(&s1).unwrap();
    let buffer2 = buffer.clone();
    let error = on_fresh_thread(move || {
        buffer2
            .set_deallocation_stream(&StreamHandle::legacy())
            .unwrap_err()
    });
    assert_eq!(error, HandleError::NoCurrentContext);
    assert!(buffer.deallocation_stream().unwrap().ptr_eq(&s1));
    let ptr = buffer.ptr();
    let alloc = alloc_of(ptr);
    let from = mark();
    buffer.release().unwrap();
    assert_eq!(default_used(&a), base, "freed");
    with_emulator(|emu| {
        assert_eq!(
            emu.only_call("cuMemFreeAsync", alloc, from).stream,
            Some(s1.raw() as u64)
        );
    });
}

#[test]
fn release_on_is_set_then_release() {
    let _serial = start();
    let a = primary(0);
    let base = default_used(&a);
    let s1 = StreamHandle::create(&a, StreamFlags::DEFAULT, 0).unwrap();
    let s2 = StreamHandle::create(&a, StreamFlags::DEFAULT, 0).unwrap();
    let buffer = pool_buffer(&s1).unwrap();
    s1.synchronize().unwrap();
    let ptr = buffer.ptr();
    let alloc = alloc_of(ptr);
    let from = mark();
    buffer.release_on(&s2).unwrap();
    assert_eq!(current_raw(), 0);
    s2.synchronize().unwrap();
    assert_eq!(default_used(&a), base, "freed");
    with_emulator(|emu| {
        assert_eq!(
            emu.only_call("cuMemFreeAsync", alloc, from).stream,
            Some(s2.raw() as u64)
        );
    });
    assert_no_hazards();
}

#[test]
fn bad_input_null_pointer_with_an_owning_rule() {
    let _serial = start();
    let a = primary(0);
    let stream = StreamHandle::create(&a, StreamFlags::DEFAULT, 0).unwrap();
    let deallocator = Arc::new(RecordingDeallocator::default());
    let refused =
        DevicePtrHandle::adopt(test_allocation(0, 64), &stream, deallocator.clone()).unwrap_err();
    let error = refused.error;
    assert!(
        matches!(error, HandleError::InvalidArgument { what: "ptr", .. }),
        "{error:?}"
    );
    assert_eq!(refused.allocation.into_raw(), (0, 64), "given back");
    assert!(deallocator.calls.lock().unwrap().is_empty());
    let owner = Arc::new(());
    // SAFETY: the address is null and rejected before anything could use it.
    let error = unsafe { handles::raw::with_owner(0, 64, Box::new(owner.clone())) }.unwrap_err();
    assert!(matches!(
        error,
        HandleError::InvalidArgument { what: "ptr", .. }
    ));
    assert_eq!(
        Arc::strong_count(&owner),
        1,
        "the owner was dropped, not leaked"
    );
    // A borrowed null pointer owns nothing and is allowed.
    // SAFETY: zero bytes: no copy or fill can reach memory through it.
    let borrowed = unsafe { handles::raw::borrowed(0, 0) };
    assert_eq!(borrowed.kind(), ReleaseKind::NonOwning);
}

#[test]
fn bad_input_zero_bytes_where_the_driver_rejects_them() {
    let _serial = start();
    let a = primary(0);
    let stream = StreamHandle::create(&a, StreamFlags::DEFAULT, 0).unwrap();
    let me = tid();
    let from = mark();
    let error = DevicePtrHandle::alloc(0, &stream).unwrap_err();
    assert!(
        matches!(error, HandleError::InvalidArgument { what: "size", .. }),
        "{error:?}"
    );
    assert!(error.to_string().starts_with("invalid size: "));
    let error = DevicePtrHandle::alloc_managed(0, MemAttachFlags::GLOBAL, &stream).unwrap_err();
    assert!(matches!(
        error,
        HandleError::InvalidArgument { what: "size", .. }
    ));
    with_emulator(|emu| {
        assert!(
            emu.names_on(me, from).is_empty(),
            "rejected before any driver call"
        );
    });
}

#[test]
fn bad_input_stream_of_another_device() {
    let _serial = start();
    if !second_device_or_skip("a stream of another device") {
        return;
    }
    let a = primary(0);
    let b = primary(1);
    let other_device_stream = StreamHandle::create(&b, StreamFlags::DEFAULT, 0).unwrap();
    let base = default_used(&a);
    let live_before = with_emulator(|emu| emu.live_allocations().len());
    let error = pool_buffer(&other_device_stream).unwrap_err();
    assert_eq!(
        error,
        HandleError::WrongDevice {
            expected: 0,
            found: 1
        },
        "{error:?}"
    );
    assert!(error.to_string().contains("device 1"), "{error}");
    assert_eq!(default_used(&a), base, "nothing allocated");
    with_emulator(|emu| {
        assert_eq!(
            Some(emu.live_allocations().len()),
            live_before,
            "nothing allocated"
        );
    });

    let stream = StreamHandle::create(&a, StreamFlags::DEFAULT, 0).unwrap();
    let buffer = pool_buffer(&stream).unwrap();
    let error = buffer
        .set_deallocation_stream(&other_device_stream)
        .unwrap_err();
    assert_eq!(
        error,
        HandleError::WrongDevice {
            expected: 0,
            found: 1
        }
    );
    assert!(
        buffer.deallocation_stream().unwrap().ptr_eq(&stream),
        "old recipe kept"
    );
    buffer.release().unwrap();
    assert_eq!(default_used(&a), base, "freed");
    assert_no_hazards();
}

#[test]
fn owner_and_borrowed_pointers_free_nothing() {
    let _serial = start();
    let owner = Arc::new(AtomicUsize::new(0));
    // SAFETY: nothing reads or writes through the handle: the test only drops it.
    let buffer = unsafe { handles::raw::with_owner(0xdead0, 16, Box::new(owner.clone())) }.unwrap();
    assert_eq!(buffer.kind(), ReleaseKind::Owner);
    assert!(buffer.recipe().is_none());
    // Inert: it frees nothing, so it needs no context and records nothing.
    on_fresh_thread({
        let buffer = buffer.clone();
        move || {
            buffer
                .set_deallocation_stream(&StreamHandle::legacy())
                .unwrap()
        }
    });
    assert_eq!(Arc::strong_count(&owner), 2);
    let from = mark();
    buffer.release().unwrap();
    assert_eq!(
        Arc::strong_count(&owner),
        1,
        "the owner is dropped with the last handle"
    );
    // A free of these made-up addresses would fail and be reported.
    assert!(errors_for(0xdead0).is_empty());
    with_emulator(|emu| assert!(emu.calls_at(0xdead0, from).is_empty()));
    owner.fetch_add(1, Ordering::Relaxed);

    let from = mark();
    // SAFETY: nothing reads or writes through the handle: the test only drops it.
    drop(unsafe { handles::raw::borrowed(0xbeef0, 16) });
    assert!(errors_for(0xbeef0).is_empty());
    with_emulator(|emu| assert!(emu.calls_at(0xbeef0, from).is_empty()));
}

#[test]
fn replace_deallocation_stream_hands_back_the_old_recipe_and_its_last_references() {
    let _serial = start();
    let a = primary(0);
    let s1 = StreamHandle::create(&a, StreamFlags::DEFAULT, 0).unwrap();
    let s2 = StreamHandle::create(&a, StreamFlags::DEFAULT, 0).unwrap();
    let raw1 = s1.raw() as u64;
    let buffer = pool_buffer(&s1).unwrap();
    // The allocation on s1 ordered before the free on s2 (the caller's job, D4).
    let event = handles::EventHandle::create(&a, handles::EventFlags::DISABLE_TIMING).unwrap();
    event.record(&s1).unwrap();
    s2.wait_event(&event).unwrap();
    // s1 still has a user handle: giving up the old recipe destroys nothing.
    let old = handles::binding::replace_deallocation_stream(&buffer, &s2)
        .unwrap()
        .unwrap();
    assert!(buffer.deallocation_stream().unwrap().ptr_eq(&s2));
    let from = mark();
    assert!(old.into_last_references().is_none());
    // Now the recipe holds s1's last handle: it is handed back, and destroyed only when dropped.
    let _s2_recipe = handles::binding::replace_deallocation_stream(&buffer, &s1)
        .unwrap()
        .unwrap();
    drop(s1);
    let old = handles::binding::replace_deallocation_stream(&buffer, &s2)
        .unwrap()
        .unwrap();
    let remains = old
        .into_last_references()
        .expect("the last reference to s1");
    let destroys = |from| {
        with_emulator(|emu: &test_support::emu::Emulator| {
            emu.calls()
                .into_iter()
                .filter(|c| c.seq >= from && c.function == "cuStreamDestroy_v2")
                .filter(|c| c.stream == Some(raw1))
                .count()
        })
    };
    // On a real driver (no call log) the destroy is not observable here.
    assert_ne!(
        destroys(from),
        Some(1),
        "not destroyed before the remains are dropped"
    );
    drop(remains);
    assert_ne!(destroys(from), Some(0), "destroyed with the remains");
    buffer.release().unwrap();
    s2.synchronize().unwrap();
    assert_no_hazards();
}

#[test]
fn release_with_remains_frees_and_hands_back_the_recipes_last_stream_reference() {
    let _serial = start();
    let a = primary(0);
    let destroys = |raw: u64, from| {
        with_emulator(|emu: &test_support::emu::Emulator| {
            emu.calls()
                .into_iter()
                .filter(|c| c.seq >= from && c.function == "cuStreamDestroy_v2")
                .filter(|c| c.stream == Some(raw))
                .count()
        })
    };
    // The user keeps the stream: the free runs, nothing is last.
    let kept = StreamHandle::create(&a, StreamFlags::DEFAULT, 0).unwrap();
    let buffer = pool_buffer(&kept).unwrap();
    let id = with_emulator(|_| alloc_of(buffer.ptr()));
    let from = mark();
    let (result, remains) = handles::binding::release_with_remains(buffer);
    result.unwrap();
    assert!(
        remains.is_none(),
        "the user's handle still holds the stream"
    );
    with_emulator(|emu| assert_eq!(emu.count_calls("cuMemFreeAsync", id.unwrap(), from), 1));
    // Another clone of the handle: nothing is freed, nothing comes back.
    let buffer = pool_buffer(&kept).unwrap();
    let clone = buffer.clone();
    let id = with_emulator(|_| alloc_of(clone.ptr()));
    let from = mark();
    let (result, remains) = handles::binding::release_with_remains(buffer);
    result.unwrap();
    assert!(remains.is_none());
    with_emulator(|emu| assert_eq!(emu.count_calls("cuMemFreeAsync", id.unwrap(), from), 0));
    drop(clone);
    // The recipe holds the stream's last handle: the memory is freed, the stream is destroyed
    // only when the remains are dropped.
    let last = StreamHandle::create(&a, StreamFlags::DEFAULT, 0).unwrap();
    let raw = last.raw() as u64;
    let buffer = pool_buffer(&last).unwrap();
    let id = with_emulator(|_| alloc_of(buffer.ptr()));
    drop(last);
    let from = mark();
    let (result, remains) = handles::binding::release_with_remains(buffer);
    result.unwrap();
    let remains = remains.expect("the recipe held the stream's last handle");
    with_emulator(|emu| assert_eq!(emu.count_calls("cuMemFreeAsync", id.unwrap(), from), 1));
    // On a real driver (no call log) the destroy is not observable here.
    assert_ne!(
        destroys(raw, from),
        Some(1),
        "not destroyed before the remains go"
    );
    drop(remains);
    assert_ne!(destroys(raw, from), Some(0), "destroyed with the remains");
    kept.synchronize().unwrap();
    assert_no_hazards();
}

/// docs/decisions.md D4: a stream whose context was destroyed by the code that made it (a
/// context custody does not hold) cannot order a free: binding it is refused
/// ([`HandleError::ContextDestroyed`], found with `cuCtxGetId`), the old recipe stays, no use is
/// recorded, and the memory is freed by the old recipe (it was accepted, and `close()` then
/// failed and leaked the memory).
#[test]
fn a_stream_whose_context_was_destroyed_is_refused_and_the_old_recipe_stays() {
    let _serial = start();
    let Some(emu) = emulator_or_skip(
        "a destroyed context and its stream handed to the driver (undefined behaviour on a real \
         driver, the CUDA documentation of cuCtxDestroy says)",
    ) else {
        return;
    };
    let d = cuda_sys::driver().unwrap();
    // Other code's context (not current afterwards) and a stream in it, which custody wraps.
    let mut ctx: cuda_sys::types::CUcontext = std::ptr::null_mut();
    // SAFETY: `ctx` is a valid out-pointer; device 0 exists.
    assert_eq!(unsafe { (d.cuCtxCreate_v2)(&mut ctx, 0, 0) }, 0);
    let mut raw: cuda_sys::types::CUstream = std::ptr::null_mut();
    // SAFETY: `raw` is a valid out-pointer; `ctx` is current.
    let status = unsafe { (d.cuStreamCreate().expect("cuStreamCreate"))(&mut raw, 0) };
    assert_eq!(status, 0);
    // SAFETY: the context created above is current; popping it leaves none.
    assert_eq!(unsafe { (d.cuCtxPopCurrent_v2)(std::ptr::null_mut()) }, 0);
    // SAFETY: the stream lives until the context is destroyed below; the test then shows that
    // custody refuses it rather than trusting it.
    let foreign = unsafe { handles::raw::wrap_stream(raw as usize, None) }.unwrap();
    assert_eq!(foreign.context().unwrap().kind(), ContextKind::Borrowed);
    let s = StreamHandle::create(&primary(0), StreamFlags::DEFAULT, 0).unwrap();
    let buffer = pool_buffer(&s).unwrap();
    // While its context lives, the wrapped stream binds.
    buffer.set_deallocation_stream(&foreign).unwrap();
    buffer.set_deallocation_stream(&s).unwrap();
    // SAFETY: the context was created above; custody holds it only borrowed.
    assert_eq!(unsafe { (d.cuCtxDestroy_v2)(ctx) }, 0);

    let from = mark();
    let refused = buffer.set_deallocation_stream(&foreign).unwrap_err();
    assert!(
        matches!(refused, HandleError::ContextDestroyed { context, .. } if context == ctx as u64),
        "{refused:?}"
    );
    assert!(
        refused.to_string().contains("has been destroyed"),
        "{refused}"
    );
    assert!(
        buffer.deallocation_stream().unwrap().ptr_eq(&s),
        "the old recipe stays"
    );
    let refused = buffer.record_use(&foreign).unwrap_err();
    assert!(
        matches!(refused, HandleError::ContextDestroyed { .. }),
        "{refused:?}"
    );
    assert!(buffer.use_streams().is_empty(), "no use was recorded");
    assert!(
        emu.calls_since(from)
            .iter()
            .any(|c| c.function == "cuCtxGetId"),
        "cuCtxGetId checks the context"
    );
    let alloc = alloc_of(buffer.ptr());
    let from = mark();
    buffer.release().expect("freed by the old recipe");
    let free = emu.only_call("cuMemFreeAsync", alloc, from);
    assert_eq!((free.stream, free.result), (Some(s.raw() as u64), 0));
    drop(foreign);
    s.synchronize().unwrap();
    assert_no_hazards();
}
