//! PTDS and legacy default streams (docs/reference-notes.md section 5, "PTDS and legacy default
//! streams", as decided by docs/decisions.md D6): per-thread-default-stream frees on the recording
//! thread are plain; on another thread they run there, in the bound context, with one warning.

mod common;

use common::*;
use handles::{
    cleanup_warning_count, CleanupWarningKind, ContextHandle, DefaultStream, DevicePtrHandle,
    MemoryPoolHandle, StreamHandle, ThreadToken,
};

#[test]
fn per_thread_buffer_dropped_on_its_recording_thread_warns_nothing() {
    let _serial = start();
    let a = primary(0);
    let base = default_used(&a);
    a.make_current().unwrap();
    let me = tid();
    let from = mark();
    let buffer = pool_buffer(&StreamHandle::per_thread()).unwrap();
    let ptds_of_me = with_emulator(|emu| {
        emu.one_call_on(me, "cuMemAllocFromPoolAsync", from)
            .resolved_stream
            .unwrap()
    });
    let ptr = buffer.ptr();
    let alloc = alloc_of(ptr);
    let from = mark();
    ContextHandle::clear_current().unwrap();
    drop(buffer);
    assert_eq!(current_raw(), 0, "the thread is left with no context");
    assert!(warnings_for(ptr).is_empty());
    assert!(errors_for(ptr).is_empty(), "{:?}", errors_for(ptr));
    assert_eq!(default_used(&a), base, "freed");
    with_emulator(|emu| {
        let free = emu.only_call("cuMemFreeAsync", alloc, from);
        assert_eq!(
            (
                free.thread,
                free.context,
                free.stream,
                free.resolved_stream,
                free.result
            ),
            (me, a.raw() as u64, Some(0x2), ptds_of_me, 0)
        );
    });
    assert_no_hazards();
}

#[test]
fn per_thread_buffer_dropped_on_another_thread_warns_once_and_frees_there() {
    let _serial = start();
    let a = primary(0);
    let base = default_used(&a);
    let a2 = a.clone();
    let (buffer, recorder) = on_fresh_thread(move || {
        a2.make_current().unwrap();
        let buffer = pool_buffer(&StreamHandle::per_thread()).unwrap();
        // Order the allocation before anything else: the cross-thread free below is the
        // application's to order (D6), and this test orders it.
        StreamHandle::per_thread().synchronize().unwrap();
        ContextHandle::clear_current().unwrap();
        (buffer, ThreadToken::current())
    });
    let ptr = buffer.ptr();
    let alloc = alloc_of(ptr);
    let before = cleanup_warning_count();
    let from = mark();
    let (dropper, after) = on_fresh_thread(move || {
        drop(buffer);
        (ThreadToken::current(), current_raw())
    });
    assert_eq!(after, 0);
    assert_eq!(cleanup_warning_count() - before, 1);
    let warnings = warnings_for(ptr);
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert_eq!(
        warnings[0].kind,
        CleanupWarningKind::PerThreadStreamOtherThread {
            recorded_thread: recorder.value(),
            freeing_thread: dropper.value(),
        }
    );
    assert!(
        warnings[0].to_string().contains("application"),
        "{}",
        warnings[0]
    );
    assert!(errors_for(ptr).is_empty(), "{:?}", errors_for(ptr));
    assert_eq!(default_used(&a), base, "freed, on the dropping thread");
    with_emulator(|emu| {
        let free = emu.only_call("cuMemFreeAsync", alloc, from);
        assert_eq!(
            (free.context, free.stream, free.result),
            (a.raw() as u64, Some(0x2), 0)
        );
    });
    assert_no_hazards();
}

#[test]
fn unbound_legacy_token_caches_no_context_but_a_recipe_keeps_its_own() {
    let _serial = start();
    let a = primary(0);
    let b = other_context();
    let base = default_used(&a);
    a.make_current().unwrap();
    let buffer = pool_buffer(&StreamHandle::legacy()).unwrap();
    b.make_current().unwrap();
    assert!(
        StreamHandle::legacy().context().is_none(),
        "the token itself binds nothing"
    );
    let b_buffer = buffer_in_current_context(&b);
    assert_eq!(b_buffer.recipe().unwrap().context(), &b);
    assert_eq!(buffer.recipe().unwrap().context(), &a);
    let ptr = buffer.ptr();
    let alloc = alloc_of(ptr);
    let from = mark();
    drop(buffer);
    assert_eq!(current_raw(), b.raw() as u64);
    assert!(errors_for(ptr).is_empty(), "{:?}", errors_for(ptr));
    with_emulator(|emu| {
        assert_eq!(
            emu.only_call("cuMemFreeAsync", alloc, from).context,
            a.raw() as u64
        );
    });
    drop(b_buffer);
    ContextHandle::clear_current().unwrap();
    b.synchronize().unwrap();
    assert_eq!(default_used(&a), base, "both freed");
    assert_no_hazards();
}

/// 64 bytes from the default pool of `context`'s device on the legacy token, recorded in the
/// context current now.
fn buffer_in_current_context(context: &ContextHandle) -> DevicePtrHandle {
    let pool = MemoryPoolHandle::device_default(context.device()).unwrap();
    DevicePtrHandle::alloc_from_pool(64, &pool, &StreamHandle::legacy()).unwrap()
}

#[test]
fn legacy_buffer_freed_on_its_token_in_the_recorded_context_from_a_bare_thread() {
    let _serial = start();
    let a = primary(0);
    let base = default_used(&a);
    a.make_current().unwrap();
    let buffer = pool_buffer(&StreamHandle::default_stream(DefaultStream::Legacy)).unwrap();
    ContextHandle::clear_current().unwrap();
    let ptr = buffer.ptr();
    let alloc = alloc_of(ptr);
    let from = mark();
    let after = on_fresh_thread(move || {
        drop(buffer);
        current_raw()
    });
    assert_eq!(after, 0);
    assert!(warnings_for(ptr).is_empty(), "legacy frees never warn");
    assert!(errors_for(ptr).is_empty(), "{:?}", errors_for(ptr));
    assert_eq!(default_used(&a), base, "freed");
    with_emulator(|emu| {
        let free = emu.only_call("cuMemFreeAsync", alloc, from);
        assert_eq!(
            (free.context, free.stream, free.result),
            (a.raw() as u64, Some(0x1), 0)
        );
    });
    assert_no_hazards();
}

#[test]
fn null_token_is_legacy_style_and_records_no_thread() {
    let _serial = start();
    let a = primary(0);
    let base = default_used(&a);
    a.make_current().unwrap();
    let buffer = pool_buffer(&StreamHandle::default_stream(DefaultStream::Null)).unwrap();
    let recipe = buffer.recipe().unwrap();
    assert_eq!(recipe.ptds_thread(), None);
    assert_eq!(recipe.context(), &a);
    assert_eq!(recipe.stream().default_kind(), Some(DefaultStream::Null));
    drop(recipe);
    ContextHandle::clear_current().unwrap();
    let ptr = buffer.ptr();
    let alloc = alloc_of(ptr);
    let from = mark();
    on_fresh_thread(move || drop(buffer));
    assert!(warnings_for(ptr).is_empty());
    assert!(errors_for(ptr).is_empty(), "{:?}", errors_for(ptr));
    assert_eq!(default_used(&a), base, "freed");
    with_emulator(|emu| {
        let free = emu.only_call("cuMemFreeAsync", alloc, from);
        assert_eq!(
            (free.context, free.stream, free.result),
            (a.raw() as u64, Some(0), 0)
        );
    });
    assert_no_hazards();
}

#[test]
fn bound_token_needs_no_current_context() {
    let _serial = start();
    let a = primary(0);
    let base = default_used(&a);
    let bound = StreamHandle::bound_default_stream(DefaultStream::Legacy, &a);
    let (alloc, used_while_held) = on_fresh_thread(move || {
        let buffer = pool_buffer(&bound).unwrap();
        assert_eq!(current_raw(), 0);
        assert_eq!(buffer.recipe().unwrap().context(), &a);
        let used = default_used(&a);
        let alloc = alloc_of(buffer.ptr());
        buffer.release().unwrap();
        assert_eq!(current_raw(), 0);
        (alloc, used)
    });
    assert!(used_while_held >= base + POOL_BUFFER);
    assert_eq!(default_used(&primary(0)), base, "released");
    with_emulator(|emu| assert!(!emu.is_live(alloc)));
    assert_no_hazards();
}
