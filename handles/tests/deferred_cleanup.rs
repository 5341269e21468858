//! Deferred cleanup through CUDA user objects (docs/decisions.md D7; docs/driver-facts.md G1, G2):
//! the destructor only queues, the worker or a drain frees with the recipe, and a destructor that
//! runs synchronously inside a drain does not deadlock.

mod common;

use std::sync::Arc;

use common::*;
use handles::{
    drain_deferred_cleanup, ContextHandle, GraphExecHandle, GraphHandle, StreamHandle,
    UserObjectOwnership,
};

/// A graph whose user object owns `payload`, and its executable.
fn graph_owning(
    context: &ContextHandle,
    payload: Box<dyn std::any::Any + Send>,
) -> (GraphHandle, GraphExecHandle) {
    let graph = GraphHandle::create(context).unwrap();
    UserObjectOwnership::new(context, payload)
        .unwrap()
        .move_into_graph(&graph)
        .unwrap();
    let exec = GraphExecHandle::instantiate(&graph, 0).unwrap();
    (graph, exec)
}

#[test]
fn graph_retained_buffer_is_freed_with_its_recipe_after_the_executable_goes() {
    let _serial = start();
    let a = primary(0);
    let b = other_context();
    let base = default_used(&a);
    a.make_current().unwrap();
    let buffer = pool_buffer(&StreamHandle::legacy()).unwrap();
    ContextHandle::clear_current().unwrap();
    let ptr = buffer.ptr();
    let alloc = alloc_of(ptr);
    let marker = Arc::new(());
    let (graph, exec) = graph_owning(&a, Box::new((buffer, marker.clone())));
    let from = mark();
    drop(graph);
    drain_deferred_cleanup();
    assert_eq!(
        Arc::strong_count(&marker),
        2,
        "G1: the executable still holds the payload"
    );
    assert!(
        default_used(&a) >= base + POOL_BUFFER,
        "nothing freed while the executable lives"
    );
    with_emulator(|emu| assert!(emu.calls_for(alloc, from).is_empty()));

    b.make_current().unwrap();
    drop(exec);
    drain_deferred_cleanup();
    assert_eq!(Arc::strong_count(&marker), 1, "payload dropped");
    assert_eq!(
        current_raw(),
        b.raw() as u64,
        "the caller's context is restored"
    );
    assert!(errors_for(ptr).is_empty(), "{:?}", errors_for(ptr));
    assert_eq!(default_used(&a), base, "the buffer went back to the pool");
    with_emulator(|emu| {
        let free = emu.only_call("cuMemFreeAsync", alloc, from);
        assert_eq!(
            (free.context, free.stream, free.result),
            (a.raw() as u64, Some(0x1), 0)
        );
    });
    ContextHandle::clear_current().unwrap();
    assert_no_hazards();
}

#[test]
fn destructor_inside_exec_destroy_while_draining_does_not_deadlock() {
    let _serial = start();
    let a = primary(0);
    let base = default_used(&a);
    let stream = StreamHandle::create(&a, 0, 0).unwrap();
    let buffer = pool_buffer(&stream).unwrap();
    let ptr = buffer.ptr();
    let alloc = alloc_of(ptr);
    // Inner: a graph executable whose user object owns the buffer.
    let (inner_graph, inner_exec) = graph_owning(&a, Box::new(buffer));
    drop(inner_graph);
    // Outer: a user object whose payload is the inner executable. Releasing it queues the
    // inner executable; dropping that inside the drain runs cuGraphExecDestroy, whose
    // destructor runs synchronously (G2) on the draining thread while it holds the consumer
    // side of the queue.
    let outer = UserObjectOwnership::new(&a, Box::new(inner_exec)).unwrap();
    let from = mark();
    drop(outer);
    drain_deferred_cleanup();
    assert_eq!(current_raw(), 0);
    assert!(errors_for(ptr).is_empty(), "{:?}", errors_for(ptr));
    assert_eq!(default_used(&a), base, "the buffer was freed by the drain");
    with_emulator(|emu| {
        let free = emu.only_call("cuMemFreeAsync", alloc, from);
        // docs/decisions.md D2: a created stream identifies its context (F4), so the free runs
        // with no context current on the draining thread.
        assert_eq!(
            (free.context, free.stream, free.result),
            (0, Some(stream.raw() as u64), 0)
        );
        let exec_destroys: Vec<_> = emu
            .calls()
            .into_iter()
            .filter(|c| c.seq >= from && c.function == "cuGraphExecDestroy")
            .collect();
        assert!(
            exec_destroys
                .iter()
                .any(|c| c.seq < free.seq && c.result == 0),
            "the free followed the executable's destruction: {exec_destroys:?}"
        );
    });
    assert_no_hazards();
}

/// A per-thread-default-stream buffer retained by a graph and freed by a drain on another
/// thread: the free runs on the legacy stream of its context, ordered after the recording
/// thread's per-thread work (docs/decisions.md D6), with no warning, at attach time or at the free.
#[test]
fn per_thread_buffer_retained_by_a_graph_is_freed_by_the_drain_on_the_legacy_stream() {
    let _serial = start();
    let a = primary(0);
    let base = default_used(&a);
    let a2 = a.clone();
    let (graph, exec, ptr, alloc) = on_fresh_thread(move || {
        a2.make_current().unwrap();
        let buffer = pool_buffer(&StreamHandle::per_thread()).unwrap();
        // A use on the recording thread's per-thread stream, not synchronised.
        buffer
            .as_range()
            .fill_u8(1, &StreamHandle::per_thread())
            .unwrap();
        let (ptr, alloc) = (buffer.ptr(), alloc_of(buffer.ptr()));
        let (graph, exec) = graph_owning(&a2, Box::new(buffer));
        ContextHandle::clear_current().unwrap();
        (graph, exec, ptr, alloc)
    });
    assert!(warnings_for(ptr).is_empty(), "no warning when retained");
    let from = mark();
    drop((graph, exec));
    drain_deferred_cleanup();
    assert!(warnings_for(ptr).is_empty(), "no warning when freed");
    assert!(errors_for(ptr).is_empty(), "{:?}", errors_for(ptr));
    assert_eq!(current_raw(), 0);
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
fn unmoved_user_object_releases_its_payload_through_the_queue() {
    let _serial = start();
    let a = primary(0);
    let marker = Arc::new(());
    let owned = UserObjectOwnership::new(&a, Box::new(marker.clone())).unwrap();
    drop(owned);
    drain_deferred_cleanup();
    assert_eq!(Arc::strong_count(&marker), 1);
    assert_eq!(current_raw(), 0);
}
