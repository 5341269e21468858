//! Deallocation recipes through the `Buffer` API: `set_deallocation_stream` and `close_on`
//! (docs/reference-notes.md section 5, "set_deallocation_stream / close(stream) equivalence";
//! docs/decisions.md D4), the stream hand-off checked by the hazard checker, and adoption with
//! `from_handle` (section 5, "from_handle ownership modes and MR errors during destruction";
//! docs/decisions.md D5). Runs on the emulator and on a real driver: everywhere the recipe is read
//! back through the API and a free is seen as the device pool's used memory returning to where it
//! was; the stream each free ran on, and the hazard checker, only on the emulator.

mod adopt;
mod common;

use std::sync::Arc;

use adopt::Ownership;
use common::*;
use handles::{EventFlags, EventHandle, HandleError, StreamHandle};
use memory::{Buffer, DeviceMemoryResource, MemoryError, MemoryResource};

fn device_mr() -> Arc<DeviceMemoryResource> {
    DeviceMemoryResource::new(0).expect("device 0's pool")
}

/// A 256-byte buffer allocated on `stream`, whose allocation `stream` has finished, so that a
/// free on any other stream of the context is ordered after it.
fn buffer_on(stream: &StreamHandle) -> Buffer {
    let buffer = device_mr().allocate(256, stream).expect("allocate");
    stream.synchronize().unwrap();
    buffer
}

/// On the emulator, asserts that allocation `alloc`'s one free since `from` ran on `stream`.
fn assert_freed_on(alloc: AllocationId, from: u64, stream: &StreamHandle) {
    with_emulator(|emu| {
        let free = emu.only_call("cuMemFreeAsync", alloc, from);
        assert_eq!(free.stream, Some(stream.raw() as u64));
    });
}

/// Asserts that allocation `alloc` has not been freed since `from`: on any driver the device
/// pool's used memory is still above `base` by `size`; on the emulator, no free and a live
/// allocation.
fn assert_not_freed(alloc: AllocationId, from: u64, base: u64, size: u64) {
    assert!(device_used() >= base + size, "still allocated");
    with_emulator(|emu| {
        assert_eq!(emu.count_calls("cuMemFreeAsync", alloc, from), 0);
        assert!(emu.is_live(alloc));
    });
}

#[test]
fn set_then_drop_frees_on_the_new_stream() {
    let _serial = start();
    let (s1, s2) = (stream_on(0), stream_on(0));
    let base = device_used();
    let buffer = buffer_on(&s1);
    let ptr = buffer.ptr();
    let alloc = alloc_of(ptr);
    buffer.set_deallocation_stream(&s2).unwrap();
    assert!(buffer.deallocation_stream().unwrap().ptr_eq(&s2));
    let from = mark();
    drop(buffer);
    assert_eq!(device_used(), base, "freed");
    assert_freed_on(alloc, from, &s2);
    with_emulator(|emu| assert!(!emu.is_live(alloc)));
    assert_no_hazards();
}

#[test]
fn set_then_close_frees_on_the_new_stream() {
    let _serial = start();
    let (s1, s2) = (stream_on(0), stream_on(0));
    let base = device_used();
    let buffer = buffer_on(&s1);
    let ptr = buffer.ptr();
    let alloc = alloc_of(ptr);
    buffer.set_deallocation_stream(&s2).unwrap();
    assert!(buffer.deallocation_stream().unwrap().ptr_eq(&s2));
    let from = mark();
    buffer.close().unwrap();
    assert_eq!(device_used(), base, "freed");
    assert_freed_on(alloc, from, &s2);
    assert_no_hazards();
}

#[test]
fn close_on_is_set_then_close() {
    let _serial = start();
    let (s1, s2) = (stream_on(0), stream_on(0));
    let base = device_used();
    let buffer = buffer_on(&s1);
    let ptr = buffer.ptr();
    let alloc = alloc_of(ptr);
    let from = mark();
    close_on(buffer, &s2).unwrap();
    assert_eq!(device_used(), base, "freed");
    assert_freed_on(alloc, from, &s2);
    assert_no_hazards();
}

#[test]
fn close_keeps_the_recorded_recipe() {
    let _serial = start();
    let s1 = stream_on(0);
    let base = device_used();
    let buffer = buffer_on(&s1);
    let ptr = buffer.ptr();
    let alloc = alloc_of(ptr);
    assert!(buffer.deallocation_stream().unwrap().ptr_eq(&s1));
    let from = mark();
    buffer.close().unwrap();
    assert_eq!(device_used(), base, "freed");
    assert_freed_on(alloc, from, &s1);
}

#[test]
fn failed_hand_over_before_close_leaves_the_buffer_open_with_its_old_recipe() {
    let _serial = start();
    if !second_device_or_skip("a stream of another device") {
        return;
    }
    let s1 = stream_on(0);
    let other_device = stream_on(1);
    let base = device_used();
    let buffer = buffer_on(&s1);
    let ptr = buffer.ptr();
    let alloc = alloc_of(ptr);
    let from = mark();
    // close(stream) is set_deallocation_stream(stream) then close(): the first step fails.
    assert_eq!(
        buffer.set_deallocation_stream(&other_device),
        Err(MemoryError::Handle(handles::HandleError::WrongDevice {
            expected: 0,
            found: 1
        }))
    );
    assert_eq!(buffer.ptr(), ptr);
    assert!(buffer.deallocation_stream().unwrap().ptr_eq(&s1));
    assert_not_freed(alloc, from, base, 256);
    buffer.close().unwrap();
    assert_eq!(device_used(), base, "freed");
    assert_freed_on(alloc, from, &s1);
}

#[test]
fn a_closed_buffer_is_gone_and_nothing_touches_its_memory_again() {
    // Closing twice, handing a closed buffer over or reading its address does not compile in
    // Rust (`close` consumes the buffer: the compile_fail example on `memory::Buffer`); the
    // Python layer keeps cuda.core's closed state, tested by pybind's tests. What remains to
    // check at run time: the one close freed, and nothing touches the memory afterwards.
    let _serial = start();
    let s1 = stream_on(0);
    let base = device_used();
    let buffer = buffer_on(&s1);
    let ptr = buffer.ptr();
    let alloc = alloc_of(ptr);
    buffer.close().unwrap();
    assert_eq!(device_used(), base, "freed");
    let from = mark();
    s1.synchronize().unwrap();
    assert_eq!(device_used(), base, "nothing was freed twice or allocated");
    with_emulator(|emu| {
        assert!(
            emu.calls_for(alloc, from).is_empty(),
            "nothing touched the freed memory"
        );
    });
}

#[test]
fn token_with_no_current_context_is_rejected_and_a_created_stream_needs_none() {
    let _serial = start();
    let (s1, s2) = (stream_on(0), stream_on(0));
    let base = device_used();
    let buffer = Arc::new(buffer_on(&s1));
    let ptr = buffer.ptr();
    let alloc = alloc_of(ptr);
    let on_thread = Arc::clone(&buffer);
    let s2_on_thread = s2.clone();
    let (token, created) = on_fresh_thread(move || {
        let token = on_thread.set_deallocation_stream(&StreamHandle::legacy());
        let kept = on_thread.deallocation_stream().unwrap().ptr_eq(&s1);
        let created = on_thread.set_deallocation_stream(&s2_on_thread);
        (token.map(|()| kept), created)
    });
    assert_eq!(
        token,
        Err(MemoryError::Handle(HandleError::NoCurrentContext))
    );
    assert_eq!(created, Ok(()));
    assert!(buffer.deallocation_stream().unwrap().ptr_eq(&s2));
    let from = mark();
    let buffer = Arc::into_inner(buffer).expect("the thread's reference is gone");
    buffer.close().unwrap();
    assert_eq!(device_used(), base, "freed");
    with_emulator(|emu| {
        let free = emu.only_call("cuMemFreeAsync", alloc, from);
        assert_ne!(
            free.stream,
            Some(1),
            "the failed token recipe was never installed"
        );
    });
    assert_freed_on(alloc, from, &s2);
}

#[test]
fn every_holder_of_the_memory_sees_the_new_recipe() {
    let _serial = start();
    let (s1, s2) = (stream_on(0), stream_on(0));
    let base = device_used();
    let buffer = buffer_on(&s1);
    let ptr = buffer.ptr();
    let alloc = alloc_of(ptr);
    let attachment = buffer.handle().clone(); // as a graph node would hold it
    buffer.set_deallocation_stream(&s2).unwrap();
    assert!(attachment.deallocation_stream().unwrap().ptr_eq(&s2));
    let from = mark();
    buffer.close().unwrap();
    assert_not_freed(alloc, from, base, 256); // still held
    drop(attachment);
    assert_eq!(device_used(), base, "freed by the last holder");
    assert_freed_on(alloc, from, &s2);
}

/// The hand-off: a producer fills, records an event; a consumer waits on it and copies the
/// buffer out; `fill` and `copy` are on different streams.
fn hand_off(set_consumer_as_deallocation_stream: bool) -> (AllocationId, Vec<u8>) {
    let a = primary(0);
    let (producer, consumer) = (stream_on(0), stream_on(0));
    let mr = device_mr();
    let buffer = mr.allocate(4096, &producer).unwrap();
    let out = mr.allocate(4096, &consumer).unwrap();
    let alloc = alloc_of(buffer.ptr());
    buffer.fill(0x5au8, &producer).unwrap();
    let filled = EventHandle::create(&a, EventFlags::DISABLE_TIMING).unwrap();
    filled.record(&producer).unwrap();
    consumer.wait_event(&filled).unwrap();
    if set_consumer_as_deallocation_stream {
        buffer.set_deallocation_stream(&consumer).unwrap();
    }
    buffer.copy_to(&out, &consumer).unwrap();
    buffer.close().unwrap();
    let bytes = read(&out, &consumer);
    out.close().unwrap();
    (alloc, bytes)
}

#[test]
fn handing_the_free_to_the_consumer_orders_it_after_the_consumer_copy() {
    let _serial = start();
    let (alloc, bytes) = hand_off(true);
    assert_eq!(
        bytes,
        vec![0x5a; 4096],
        "the consumer read what the producer wrote"
    );
    with_emulator(|emu| assert_eq!(emu.hazards_for(alloc), vec![]));
    assert_no_hazards();
}

#[test]
fn without_the_hand_off_the_checker_reports_the_unordered_free() {
    let _serial = start();
    // On a GPU the unordered free is a real race with the consumer's copy, and nothing but
    // the checker would see it.
    let Some(emu) = emulator_or_skip("hazard checker to see the unordered free") else {
        return;
    };
    let (alloc, _) = hand_off(false);
    let hazards = emu.hazards_for(alloc);
    assert!(
        hazards.iter().any(|h| h.kind == "unordered_free"),
        "{hazards:#?}"
    );
    emu.clear_hazards();
}

#[test]
fn view_frees_nothing_and_its_recipe_is_inert() {
    let _serial = start();
    let s = stream_on(0);
    let base = device_used();
    let ptr = foreign_allocation(0, 512, &s);
    let alloc = alloc_of(ptr);
    let view = adopt::from_handle(ptr, 512, Ownership::Borrowed, None).unwrap();
    assert!(view.memory_resource().is_none());
    view.set_deallocation_stream(&s).unwrap();
    assert!(
        view.deallocation_stream().is_none(),
        "nothing to free, nothing recorded"
    );
    let from = mark();
    view.close().unwrap();
    assert_not_freed(alloc, from, base, 512);
    unowned(ptr, 0).free_async(&s).unwrap(); // the caller's memory, the caller's free
    assert_eq!(device_used(), base, "freed by the caller");
    with_emulator(|emu| assert!(!emu.is_live(alloc)));
}

#[test]
fn owner_is_kept_alive_until_close_and_nothing_is_freed() {
    let _serial = start();
    let s = stream_on(0);
    let base = device_used();
    let ptr = foreign_allocation(0, 512, &s);
    let alloc = alloc_of(ptr);
    let owner = Arc::new(());
    let buffer = adopt::from_handle(
        ptr,
        512,
        Ownership::Owner(Box::new(Arc::clone(&owner))),
        None,
    )
    .unwrap();
    assert_eq!(Arc::strong_count(&owner), 2);
    let from = mark();
    buffer.close().unwrap();
    assert_eq!(Arc::strong_count(&owner), 1, "released at close");
    assert_not_freed(alloc, from, base, 512);
    unowned(ptr, 0).free_async(&s).unwrap();
    assert_eq!(device_used(), base, "freed by the caller");
}

#[test]
fn adopted_memory_is_deallocated_by_its_resource_with_the_recorded_stream_in_its_context() {
    let _serial = start();
    let a = primary(0);
    let s = stream_on(0);
    let mr = RecordingResource::new(0);
    let base = device_used();
    let ptr = foreign_allocation(0, 1024, &s);
    let alloc = alloc_of(ptr);
    let dyn_mr: Arc<dyn MemoryResource> = mr.clone();
    let buffer =
        adopt::from_handle(ptr, 1024, Ownership::MemoryResource(dyn_mr), Some(&s)).unwrap();
    assert!(buffer.memory_resource().is_some());
    assert!(mr.deallocations().is_empty());
    on_fresh_thread(move || drop(buffer)); // a thread that never had a context
    assert_eq!(
        mr.deallocations(),
        vec![Deallocation {
            ptr,
            size: 1024,
            stream: s.raw() as usize,
            // docs/decisions.md D2: the recipe's context is current even for a created stream.
            current_context: a.raw() as u64,
        }]
    );
    assert_eq!(device_used(), base, "freed by the resource");
    with_emulator(|emu| assert!(!emu.is_live(alloc)));
}

#[test]
fn default_token_binds_the_context_current_at_adoption_and_deallocate_runs_in_it() {
    let _serial = start();
    let a = primary(0);
    let s = stream_on(0);
    let mr = RecordingResource::new(0);
    let base = device_used();
    let ptr = foreign_allocation(0, 1024, &s);
    let alloc = alloc_of(ptr);
    s.synchronize().unwrap();
    a.make_current().unwrap();
    let buffer =
        adopt::from_handle(ptr, 1024, Ownership::MemoryResource(mr.clone()), None).unwrap();
    handles::ContextHandle::clear_current().unwrap();
    on_fresh_thread(move || drop(buffer));
    let seen = mr.deallocations();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].stream, 0x1, "the legacy default stream");
    assert_eq!(seen[0].current_context, a.raw() as u64);
    assert_eq!(device_used(), base, "freed by the resource");
    with_emulator(|emu| assert!(!emu.is_live(alloc)));
}

#[test]
fn adoption_failure_leaves_the_pointer_with_the_caller() {
    let _serial = start();
    let s = stream_on(0);
    let mr = RecordingResource::new(0);
    let base = device_used();
    let ptr = foreign_allocation(0, 1024, &s);
    let alloc = alloc_of(ptr);
    s.synchronize().unwrap();
    let from = mark();
    // No context on a fresh thread: the default token cannot be bound (docs/decisions.md D5).
    let on_thread = mr.clone();
    let error = on_fresh_thread(move || {
        adopt::from_handle(ptr, 1024, Ownership::MemoryResource(on_thread), None).unwrap_err()
    });
    assert_eq!(error, MemoryError::Handle(HandleError::NoCurrentContext));
    // A stream of another device: rejected the same way.
    if second_device_or_skip_part("adoption with a stream of another device") {
        let error = adopt::from_handle(
            ptr,
            1024,
            Ownership::MemoryResource(mr.clone()),
            Some(&stream_on(1)),
        )
        .unwrap_err();
        assert_eq!(
            error,
            MemoryError::Handle(handles::HandleError::WrongDevice {
                expected: 0,
                found: 1
            })
        );
    }
    // Bad sizes and a null pointer: rejected before anything is taken.
    for (p, n) in [(ptr, 0), (0, 1024)] {
        assert!(adopt::from_handle(p, n, Ownership::MemoryResource(mr.clone()), Some(&s)).is_err());
    }
    assert!(mr.deallocations().is_empty(), "deallocate was never called");
    assert_not_freed(alloc, from, base, 1024); // the pointer is still the caller's
    unowned(ptr, 0).free_async(&s).unwrap();
    assert_eq!(device_used(), base, "freed by the caller");
    with_emulator(|emu| assert!(!emu.is_live(alloc)));
}

#[test]
fn failing_deallocate_is_returned_by_close_and_reported_by_a_drop() {
    let _serial = start();
    let s = stream_on(0);
    let mr = RecordingResource::new(0);
    let base = device_used();
    *mr.fail_with.lock().unwrap() = Some("out of luck".into());
    let closed = mr.allocate(256, &s).unwrap();
    let dropped = mr.allocate(256, &s).unwrap();
    let (p1, p2) = (closed.ptr(), dropped.ptr());
    let (a1, a2) = (alloc_of(p1), alloc_of(p2));
    let expected = MemoryError::Handle(HandleError::deallocator("out of luck"));
    assert_eq!(closed.close(), Err(expected));
    assert!(errors_for(p1).is_empty(), "returned, not reported");
    drop(dropped);
    let reports = errors_for(p2);
    assert_eq!(reports.len(), 1, "{reports:?}");
    assert_eq!(reports[0].operation, "deallocate");
    assert_eq!(reports[0].stream, s.raw() as u64);
    assert_eq!(mr.deallocations().len(), 2);
    // The failing resource freed nothing: give the memory back.
    assert!(device_used() >= base + 512, "nothing was freed");
    for (ptr, alloc) in [(p1, a1), (p2, a2)] {
        with_emulator(|emu| assert!(emu.is_live(alloc)));
        unowned(ptr, 0).free_async(&s).unwrap();
    }
    assert_eq!(device_used(), base, "freed by the caller");
}
