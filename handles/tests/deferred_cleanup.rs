//! Deferred cleanup through CUDA user objects (docs/decisions.md D7; docs/driver-facts.md G1, G2):
//! the destructor only queues, the worker or a drain frees with the recipe, and a destructor that
//! runs synchronously inside a drain does not deadlock.

mod common;

use std::sync::Arc;

use common::*;
use handles::{
    drain_deferred_cleanup, ContextHandle, GraphExecHandle, GraphHandle, GraphInstantiateFlags,
    StreamFlags, StreamHandle, UserObjectOwnership,
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
    let exec = GraphExecHandle::instantiate(&graph, GraphInstantiateFlags::empty()).unwrap();
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
    let stream = StreamHandle::create(&a, StreamFlags::DEFAULT, 0).unwrap();
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
    // The recording thread stays alive, parked, until its work and the free are done: it must
    // not end with per-thread work pending (docs/driver-facts.md F24).
    let ((graph, exec, ptr, alloc), recorder) = on_parked_thread(&a, move || {
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
    recorder.finish(); // its stream has drained (default_used synchronised the context)
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

/// The cleanup worker's work per item, for pool memory freed on a created stream once a graph
/// lets go of it: one `cuMemFreeAsync` each, and no context call at all (docs/decisions.md D2:
/// the stream names its context), in the order the items were queued.
#[test]
fn the_worker_frees_a_graphs_created_stream_buffers_with_one_call_each_in_queue_order() {
    const COUNT: usize = 40; // more than one batch of the old queue's blocks (31 items)
    let _serial = start();
    let a = primary(0);
    let s = StreamHandle::create(&a, StreamFlags::DEFAULT, 0).unwrap();
    let base = default_used(&a);
    let graph = GraphHandle::create(&a).unwrap();
    let mut ptrs = Vec::new();
    for _ in 0..COUNT {
        let buffer = pool_buffer(&s).unwrap();
        ptrs.push(buffer.ptr());
        UserObjectOwnership::new(&a, Box::new(buffer))
            .unwrap()
            .move_into_graph(&graph)
            .unwrap();
    }
    let allocs: Vec<_> = ptrs.iter().map(|&p| alloc_of(p)).collect();
    let here = tid();
    let from = mark();
    drop(graph); // the destructors queue the payloads; no drain: the worker frees them
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while default_used(&a) != base {
        assert!(
            std::time::Instant::now() < deadline,
            "the worker did not free the graph's buffers"
        );
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    assert_eq!(handles::deferred_cleanup_pending(), 0);
    for ptr in &ptrs {
        assert!(errors_for(*ptr).is_empty(), "{:?}", errors_for(*ptr));
    }
    with_emulator(|emu| {
        let calls = emu.calls();
        // The helper thread that reads the pool's usage makes calls too: only the threads
        // that freed something count.
        let freeing: std::collections::BTreeSet<u64> = calls
            .iter()
            .filter(|c| c.seq >= from && c.function == "cuMemFreeAsync")
            .map(|c| c.thread)
            .collect();
        assert!(!freeing.contains(&here), "the test thread freed nothing");
        let worker: Vec<&Call> = calls
            .iter()
            .filter(|c| c.seq >= from && freeing.contains(&c.thread))
            .collect();
        let functions: Vec<&str> = worker.iter().map(|c| c.function.as_str()).collect();
        assert_eq!(functions, vec!["cuMemFreeAsync"; COUNT], "{worker:#?}");
        let freed: Vec<_> = worker.iter().map(|c| c.alloc.unwrap()).collect();
        assert_eq!(
            freed, allocs,
            "freed in the order the user objects were added"
        );
        assert!(worker
            .iter()
            .all(|c| c.stream == Some(s.raw() as u64) && c.result == 0));
    });
    assert_no_hazards();
}

/// A drain inside a payload's drop runs what was queued with that payload too (the consumer
/// takes the queue in batches; the nested drain continues the batch), so it still returns only
/// when everything queued before it has run.
#[test]
fn a_drain_nested_in_a_payloads_drop_runs_the_rest_of_its_batch() {
    struct DrainsOnDrop {
        later: std::sync::Weak<()>,
        saw_later_dropped: Arc<std::sync::Mutex<Option<bool>>>,
    }
    impl Drop for DrainsOnDrop {
        fn drop(&mut self) {
            drain_deferred_cleanup();
            *self.saw_later_dropped.lock().unwrap() = Some(self.later.upgrade().is_none());
        }
    }
    /// Holds the consumer that runs its drop until the test lets it go, so that what is
    /// queued meanwhile is taken as one batch.
    struct Gate {
        entered: std::sync::mpsc::Sender<()>,
        leave: std::sync::mpsc::Receiver<()>,
    }
    impl Drop for Gate {
        fn drop(&mut self) {
            let _ = self.entered.send(());
            let _ = self.leave.recv();
        }
    }
    let _serial = start();
    let a = primary(0);
    let (entered_tx, entered) = std::sync::mpsc::channel();
    let (leave, leave_rx) = std::sync::mpsc::channel();
    let gate = GraphHandle::create(&a).unwrap();
    UserObjectOwnership::new(
        &a,
        Box::new(Gate {
            entered: entered_tx,
            leave: leave_rx,
        }),
    )
    .unwrap()
    .move_into_graph(&gate)
    .unwrap();
    drop(gate);
    // The worker (nobody else consumes now) is inside the gate's drop: both payloads below are
    // queued before any consumer looks at the queue again.
    entered
        .recv_timeout(std::time::Duration::from_secs(30))
        .expect("the cleanup worker ran the gate's drop");
    let later = Arc::new(());
    let saw = Arc::new(std::sync::Mutex::new(None));
    let graph = GraphHandle::create(&a).unwrap();
    let first = DrainsOnDrop {
        later: Arc::downgrade(&later),
        saw_later_dropped: Arc::clone(&saw),
    };
    for payload in [
        Box::new(first) as Box<dyn std::any::Any + Send>,
        Box::new(later),
    ] {
        UserObjectOwnership::new(&a, payload)
            .unwrap()
            .move_into_graph(&graph)
            .unwrap();
    }
    drop(graph);
    // The emulator ran both destructors inside cuGraphDestroy; a driver runs them on its own
    // thread, later: give it time before letting the worker go.
    if with_emulator(|_| ()).is_none() {
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    leave.send(()).unwrap();
    drain_deferred_cleanup();
    let saw = *saw.lock().unwrap();
    // Without the emulator the driver may run the two destructors in either order, or the
    // second after the nested drain: then there is nothing to assert.
    if with_emulator(|_| ()).is_some() {
        assert_eq!(
            saw,
            Some(true),
            "the nested drain ran the payload queued after the one being dropped"
        );
    } else {
        assert!(saw.is_some());
    }
}
