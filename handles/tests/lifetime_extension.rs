//! Lifetime extension (docs/reference-notes.md section 5, "Lifetime extension", and
//! docs/decisions.md D8): a recipe keeps its stream and context alive, an allocation keeps its pool
//! alive, so nothing a pending free needs can be released first (docs/driver-facts.md F11 cannot
//! happen).
//!
//! On a real driver what is kept alive is seen by using it (the recipe's stream synchronises,
//! the pool answers a query, the free reports no error) and the frees by the pool's used memory;
//! the order of destroys and frees is asserted from the emulator's call log.

mod common;

use common::*;
use handles::{
    ContextFlags, ContextHandle, DevicePtrHandle, MemoryPoolHandle, StreamFlags, StreamHandle,
};
use test_support::emu::Emulator;

/// The `cuStreamDestroy_v2` calls for `stream` since `from`.
fn stream_destroys(emu: &Emulator, stream: u64, from: u64) -> Vec<u64> {
    emu.calls()
        .into_iter()
        .filter(|c| c.seq >= from && c.function == "cuStreamDestroy_v2" && c.stream == Some(stream))
        .map(|c| c.seq)
        .collect()
}

#[test]
fn stream_whose_last_user_handle_dropped_still_orders_the_pending_free() {
    let _serial = start();
    let a = primary(0);
    let base = default_used(&a);
    let stream = StreamHandle::create(&a, StreamFlags::DEFAULT, 0).unwrap();
    let raw = stream.raw() as u64;
    let buffer = pool_buffer(&stream).unwrap();
    let ptr = buffer.ptr();
    let alloc = alloc_of(ptr);
    let from = mark();
    drop(stream);
    with_emulator(|emu| {
        assert!(
            stream_destroys(emu, raw, from).is_empty(),
            "the recipe keeps the stream alive"
        );
    });
    let kept = buffer.deallocation_stream().unwrap();
    assert_eq!(kept.raw() as u64, raw, "the recipe still holds the stream");
    kept.synchronize().unwrap();
    drop(kept);
    // On a real driver a free on a destroyed stream kills the process (F11): getting past
    // this drop is part of the assertion.
    on_fresh_thread(move || drop(buffer));
    assert!(errors_for(ptr).is_empty(), "{:?}", errors_for(ptr));
    assert_eq!(default_used(&a), base, "freed");
    with_emulator(|emu| {
        let free = emu.only_call("cuMemFreeAsync", alloc, from);
        assert_eq!((free.stream, free.result), (Some(raw), 0));
        let destroys = stream_destroys(emu, raw, from);
        assert_eq!(destroys.len(), 1);
        assert!(
            destroys[0] > free.seq,
            "destroyed after the free was issued"
        );
        assert!(
            emu.hazards()
                .iter()
                .all(|h| h.kind != "free_on_destroyed_stream"),
            "{:?}",
            emu.hazards()
        );
    });
    assert_no_hazards();
}

#[test]
fn explicit_stream_close_defers_to_the_recipe() {
    let _serial = start();
    let a = primary(0);
    let base = default_used(&a);
    let stream = StreamHandle::create(&a, StreamFlags::DEFAULT, 0).unwrap();
    let buffer = pool_buffer(&stream).unwrap();
    let raw = stream.raw() as u64;
    let from = mark();
    stream.close().unwrap();
    with_emulator(|emu| assert!(stream_destroys(emu, raw, from).is_empty()));
    buffer
        .deallocation_stream()
        .unwrap()
        .synchronize()
        .expect("the closed stream still lives in the recipe");
    buffer.release().unwrap();
    assert_eq!(default_used(&a), base, "freed");
    with_emulator(|emu| assert_eq!(stream_destroys(emu, raw, from).len(), 1));
    assert_no_hazards();
}

#[test]
fn replaced_recipe_releases_the_old_stream() {
    let _serial = start();
    let a = primary(0);
    let base = default_used(&a);
    let s1 = StreamHandle::create(&a, StreamFlags::DEFAULT, 0).unwrap();
    let s2 = StreamHandle::create(&a, StreamFlags::DEFAULT, 0).unwrap();
    let buffer = pool_buffer(&s1).unwrap();
    s1.synchronize().unwrap();
    let raw = s1.raw() as u64;
    let from = mark();
    drop(s1);
    buffer.set_deallocation_stream(&s2).unwrap();
    assert!(buffer.deallocation_stream().unwrap().ptr_eq(&s2));
    with_emulator(|emu| {
        assert_eq!(
            stream_destroys(emu, raw, from).len(),
            1,
            "s1 went with the old recipe"
        );
    });
    buffer.release().unwrap();
    assert_eq!(default_used(&a), base, "freed");
    assert_no_hazards();
}

#[test]
fn owned_pool_lives_until_its_last_allocation_is_freed() {
    let _serial = start();
    let a = primary(0);
    let stream = StreamHandle::create(&a, StreamFlags::DEFAULT, 0).unwrap();
    // SAFETY-free construction of the properties: a device-0 pinned pool.
    let mut props: cuda_sys::types::CUmemPoolProps = unsafe_zeroed_props();
    props.allocType = cuda_sys::types::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
    props.location.type_ = cuda_sys::types::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
    props.location.id = 0;
    let pool = MemoryPoolHandle::create(&props).unwrap();
    assert!(pool.is_owned());
    let first = DevicePtrHandle::alloc_from_pool(1000, &pool, &stream).unwrap();
    let second = first.clone();
    assert_eq!(first.pool().as_ref(), Some(&pool));
    let from = mark();
    pool.close().unwrap();
    drop(first);
    with_emulator(|emu| {
        assert!(
            emu.seq_of("cuMemPoolDestroy", from).is_empty(),
            "an allocation holds the pool"
        );
    });
    let held = second.pool().expect("the allocation holds its pool");
    assert!(held.is_owned());
    assert_eq!(
        pool_used(&held, &a),
        1000,
        "the pool is alive and still lends the allocation"
    );
    drop(held);
    let ptr = second.ptr();
    let alloc = alloc_of(ptr);
    second.release().unwrap();
    with_emulator(|emu| {
        let free = emu.only_call("cuMemFreeAsync", alloc, from);
        let destroys = emu.seq_of("cuMemPoolDestroy", from);
        assert_eq!(destroys.len(), 1);
        assert!(destroys[0] > free.seq);
    });
    assert_no_hazards();
}

fn unsafe_zeroed_props() -> cuda_sys::types::CUmemPoolProps {
    // SAFETY: CUmemPoolProps is a plain C struct of integers, enums whose zero value is valid
    // (`*_INVALID` / `*_NONE`), a pointer and reserved bytes: all-zero is a valid value.
    unsafe { std::mem::zeroed() }
}

#[test]
fn device_pool_is_borrowed_and_never_destroyed() {
    let _serial = start();
    let a = primary(0);
    let pool = MemoryPoolHandle::device_current(0).unwrap();
    assert!(!pool.is_owned());
    let raw_pool = pool.raw();
    let base = pool_used(&pool, &a);
    let stream = StreamHandle::create(&a, StreamFlags::DEFAULT, 0).unwrap();
    let buffer = DevicePtrHandle::alloc_from_pool(64, &pool, &stream).unwrap();
    let seen = buffer.pool().expect("a pool allocation names its pool");
    assert!(
        !seen.is_owned() && seen.raw() == raw_pool,
        "borrowed, not owned"
    );
    drop(seen);
    let from = mark();
    drop(pool);
    buffer.release().unwrap();
    let again = MemoryPoolHandle::device_current(0).unwrap();
    assert_eq!(again.raw(), raw_pool, "the device's pool is still the same");
    assert_eq!(
        pool_used(&again, &a),
        base,
        "it answers queries and took the allocation back"
    );
    with_emulator(|emu| assert!(emu.seq_of("cuMemPoolDestroy", from).is_empty()));
}

#[test]
fn created_context_outlives_its_handles_while_a_recipe_needs_it() {
    let _serial = start();
    let a = primary(0);
    let base = default_used(&a);
    let c = ContextHandle::create(0, ContextFlags::SCHED_AUTO).unwrap();
    c.make_current().unwrap();
    let buffer = pool_buffer(&StreamHandle::legacy()).unwrap();
    ContextHandle::clear_current().unwrap();
    assert_eq!(buffer.recipe().unwrap().context(), &c);
    let from = mark();
    drop(c);
    with_emulator(|emu| assert!(emu.seq_of("cuCtxDestroy_v2", from).is_empty()));
    let recipe_context = buffer.recipe().unwrap().context().clone();
    recipe_context
        .synchronize()
        .expect("the recipe's context is still alive");
    drop(recipe_context);
    let ptr = buffer.ptr();
    let alloc = alloc_of(ptr);
    // Activating a destroyed context fails: the free would be skipped and reported.
    let after = on_fresh_thread(move || {
        drop(buffer);
        current_raw()
    });
    assert_eq!(after, 0);
    assert!(errors_for(ptr).is_empty(), "{:?}", errors_for(ptr));
    assert_eq!(default_used(&a), base, "freed");
    with_emulator(|emu| {
        let free = emu.only_call("cuMemFreeAsync", alloc, from);
        let destroys = emu.seq_of("cuCtxDestroy_v2", from);
        assert_eq!(destroys.len(), 1);
        assert!(destroys[0] > free.seq);
    });
    assert_no_hazards();
}

#[test]
fn clones_share_one_box_and_the_last_one_frees() {
    let _serial = start();
    let a = primary(0);
    let base = default_used(&a);
    let stream = StreamHandle::create(&a, StreamFlags::DEFAULT, 0).unwrap();
    let buffer = pool_buffer(&stream).unwrap();
    let clone = buffer.clone();
    assert!(clone.ptr_eq(&buffer));
    assert_eq!(buffer.handle_count(), 2);
    // A count reader follows the handles without being one: it keeps nothing allocated.
    let count = handles::binding::HandleCount::of(&buffer);
    assert_eq!(count.get(), 2);
    let ptr = buffer.ptr();
    let alloc = alloc_of(ptr);
    let from = mark();
    buffer.release().unwrap();
    assert_eq!(clone.handle_count(), 1);
    assert_eq!(count.get(), 1);
    assert!(
        default_used(&a) >= base + POOL_BUFFER,
        "not the last handle: nothing freed"
    );
    with_emulator(|emu| assert!(emu.calls_for(alloc, from).is_empty()));
    drop(clone);
    assert_eq!(count.get(), 0);
    assert!(errors_for(ptr).is_empty(), "{:?}", errors_for(ptr));
    assert_eq!(
        default_used(&a),
        base,
        "the last handle freed, the reader alive"
    );
    with_emulator(|emu| assert_eq!(emu.only_call("cuMemFreeAsync", alloc, from).result, 0));
    assert_no_hazards();
}
