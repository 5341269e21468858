//! Graph memory and stream capture (docs/reference-notes.md section 5, "Graph memory resource
//! and capture", Rust side): a graph allocation needs a capturing stream, its recipe is the
//! capturing stream, closing it during the capture adds a free to the graph and after the
//! capture issues an ordinary `cuMemFreeAsync`; a pool resource refuses a capturing stream.
//! Runs on the emulator and on a real driver; which stream a free ran on, and that a refusal
//! allocated nothing, are read from the emulator's call log only.

mod common;

use common::*;
use handles::sys_types::CUstreamCaptureMode;
use handles::GraphExecHandle;
use handles::{CaptureStatus, GraphInstantiateFlags};
use memory::{
    CaptureMode, DeviceMemoryResource, GraphBuilder, GraphMemoryResource, MemoryError,
    MemoryResource, PoolMemoryResource,
};

const RELAXED: CUstreamCaptureMode = CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED;

/// On the emulator, asserts no allocation was attempted since `from`.
fn assert_no_alloc_calls(from: u64) {
    with_emulator(|emu| {
        let allocs: Vec<String> = emu
            .calls_since(from)
            .into_iter()
            .filter(|c| c.function.starts_with("cuMemAlloc"))
            .map(|c| c.function)
            .collect();
        assert!(allocs.is_empty(), "{allocs:?}");
    });
}

/// On the emulator, asserts allocation `alloc`'s one free since `from` ran on `stream` and
/// succeeded.
fn assert_freed_on(alloc: AllocationId, from: u64, stream: &handles::StreamHandle) {
    with_emulator(|emu| {
        let free = emu.only_call("cuMemFreeAsync", alloc, from);
        assert_eq!((free.stream, free.result), (Some(stream.raw() as u64), 0));
    });
}

/// On the emulator, asserts that the one `cuMemFreeAsync` of address `ptr` since `from` ran on
/// `stream` and succeeded: for a graph allocation freed inside its capture, which is no live
/// allocation yet (it has no identity until the graph runs), so only its address names it.
fn assert_capture_freed_on(ptr: u64, from: u64, stream: &handles::StreamHandle) {
    with_emulator(|emu| {
        let frees: Vec<_> = emu
            .calls_at(ptr, from)
            .into_iter()
            .filter(|c| c.function == "cuMemFreeAsync")
            .map(|c| (c.stream, c.result))
            .collect();
        assert_eq!(frees, [(Some(stream.raw() as u64), 0)]);
    });
}

#[test]
fn graph_allocation_needs_a_capturing_stream() {
    let _serial = start();
    let s = stream_on(0);
    let gmr = GraphMemoryResource::new(0).unwrap();
    let from = mark();
    assert_eq!(
        gmr.allocate(256, &s).unwrap_err(),
        MemoryError::NotCapturing
    );
    if second_device_or_skip_part("a stream of another device") {
        assert_eq!(
            gmr.allocate(256, &stream_on(1)).unwrap_err(),
            MemoryError::Handle(handles::HandleError::WrongDevice {
                expected: 0,
                found: 1
            })
        );
    }
    assert_no_alloc_calls(from);
}

/// A graph memory resource for a device that does not exist is refused when
/// made (it was accepted, to fail only at an allocation), as a device's pool resource is.
#[test]
fn graph_memory_resource_refuses_a_device_that_does_not_exist() {
    let _serial = start();
    let count = handles::device_count().unwrap();
    for missing in [count, 99] {
        let refused = GraphMemoryResource::new(missing).unwrap_err();
        assert_eq!(
            refused.code(),
            Some(handles::CudaErrorCode::INVALID_DEVICE),
            "{refused}"
        );
    }
    assert_eq!(GraphMemoryResource::new(0).unwrap().device_id(), Some(0));
}

#[test]
fn pool_resource_refuses_a_capturing_stream() {
    let _serial = start();
    let s = stream_on(0);
    let mr = DeviceMemoryResource::new(0).unwrap();
    let base = pool_used(mr.pool());
    handles::begin_capture(&s, RELAXED).unwrap();
    assert!(handles::capture_may_be_active());
    let from = mark();
    let refused = mr.allocate(256, &s).unwrap_err();
    let graph = handles::end_capture(&s).unwrap();
    assert_eq!(refused, MemoryError::StreamCapturing);
    assert_no_alloc_calls(from);
    drop(graph);
    assert_eq!(pool_used(mr.pool()), base, "nothing was allocated");
    // Capture over: allocation works again.
    let buffer = mr.allocate(256, &s).unwrap();
    assert!(pool_used(mr.pool()) >= base + 256);
    buffer.close().unwrap();
    assert_eq!(pool_used(mr.pool()), base, "freed");
}

#[test]
fn closing_during_capture_adds_the_free_to_the_graph() {
    let _serial = start();
    let s = stream_on(0);
    let gmr = GraphMemoryResource::new(0).unwrap();
    handles::begin_capture(&s, RELAXED).unwrap();
    let buffer = gmr.allocate(1024, &s).unwrap();
    let ptr = buffer.ptr();
    assert!(buffer.deallocation_stream().unwrap().ptr_eq(&s));
    buffer.fill(0x11u8, &s).unwrap();
    let from = mark();
    buffer.close().unwrap();
    assert_capture_freed_on(ptr, from, &s);
    assert_eq!(handles::capture_status(&s).unwrap(), CaptureStatus::Active);
    let graph = handles::end_capture(&s).unwrap();
    let exec = GraphExecHandle::instantiate(&graph, GraphInstantiateFlags::empty()).unwrap();
    exec.launch(&s).unwrap();
    s.synchronize().unwrap();
    drop(exec);
    drop(graph);
    assert_no_hazards();
}

#[test]
fn closing_after_capture_is_an_ordinary_free_on_the_capture_stream() {
    let _serial = start();
    let s = stream_on(0);
    let gmr = GraphMemoryResource::new(0).unwrap();
    handles::begin_capture(&s, RELAXED).unwrap();
    let buffer = gmr.allocate(1024, &s).unwrap();
    buffer.fill(0x22u8, &s).unwrap();
    let graph = handles::end_capture(&s).unwrap();
    assert_eq!(handles::capture_status(&s).unwrap(), CaptureStatus::None);
    let exec = GraphExecHandle::instantiate(&graph, GraphInstantiateFlags::empty()).unwrap();
    exec.launch(&s).unwrap();
    // The graph's allocation is live (an allocation with an identity) once the graph ran.
    let alloc = alloc_of(buffer.ptr());
    assert_eq!(
        read(&buffer, &s),
        vec![0x22; 1024],
        "the graph wrote the memory"
    );
    assert!(buffer.deallocation_stream().unwrap().ptr_eq(&s));
    let from = mark();
    buffer.close().unwrap();
    assert_freed_on(alloc, from, &s);
    s.synchronize().unwrap();
    drop(exec);
    drop(graph);
    assert_no_hazards();
}

#[test]
fn a_capture_stream_can_become_the_deallocation_stream() {
    let _serial = start();
    let (s, capturing) = (stream_on(0), stream_on(0));
    let mr = DeviceMemoryResource::new(0).unwrap();
    let base = pool_used(mr.pool());
    let buffer = mr.allocate(256, &s).unwrap();
    s.synchronize().unwrap();
    let alloc = alloc_of(buffer.ptr());
    handles::begin_capture(&capturing, RELAXED).unwrap();
    buffer.set_deallocation_stream(&capturing).unwrap();
    assert!(buffer.deallocation_stream().unwrap().ptr_eq(&capturing));
    let graph = handles::end_capture(&capturing).unwrap();
    drop(graph);
    assert!(pool_used(mr.pool()) >= base + 256);
    let from = mark();
    buffer.close().unwrap();
    assert_eq!(pool_used(mr.pool()), base, "freed after the capture ended");
    assert_freed_on(alloc, from, &capturing);
    assert_no_hazards();
}

// ---------------------------------------------------------------------------------------------
// Graph allocations across captures and launches (docs/decisions.md D11): only an allocation
// made by a capture becomes that capture's free node; a graph launches as often as it frees its
// allocations itself; an allocation of a graph that never came to be owns no memory.

/// On the emulator, asserts that no `cuMemFreeAsync` of address `ptr` was issued since `from`.
fn assert_no_free_at(ptr: u64, from: u64) {
    with_emulator(|emu| {
        let frees: Vec<Call> = emu
            .calls_at(ptr, from)
            .into_iter()
            .filter(|c| c.function == "cuMemFreeAsync")
            .collect();
        assert!(frees.is_empty(), "{frees:#?}");
    });
}

/// Drains deferred cleanup until `done()` holds (on a GPU a graph's destructor may come later,
/// from a driver thread, docs/driver-facts.md G3), for at most a minute.
fn drain_until(mut done: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        handles::drain_deferred_cleanup();
        if done() {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "deferred cleanup did not finish"
        );
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
}

/// Memory another graph allocated is, for a capture, like any other memory. A graph
/// allocation of a first capture, launched (so the memory exists), is closed while its stream
/// is being captured into a second graph: it must not become the second graph's free node (a
/// second graph never launched would lose the free; one launched twice would free it twice).
/// The second graph keeps it, and deferred cleanup frees it once after that graph and its
/// executable are gone.
#[test]
fn another_graphs_allocation_closed_during_a_capture_is_kept_by_the_captured_graph_and_freed_once()
{
    let _serial = start();
    let s = stream_on(0);
    let first = GraphBuilder::new(&s).unwrap();
    first.begin_building(CaptureMode::ThreadLocal).unwrap();
    let g = first.allocate(1024).unwrap();
    let ptr = g.ptr();
    first.fill(&g, 0x11u8).unwrap();
    let graph1 = first.end_building().unwrap();
    let exec1 = graph1.instantiate().unwrap();
    exec1.launch(&s).unwrap();
    assert_eq!(
        read(&g, &s),
        vec![0x11; 1024],
        "the first graph made the memory"
    );
    let alloc = alloc_of(ptr);

    let mr = DeviceMemoryResource::new(0).unwrap();
    let other = mr.allocate(256, &s).unwrap();
    s.synchronize().unwrap();
    let second = GraphBuilder::new(&s).unwrap();
    second.begin_building(CaptureMode::ThreadLocal).unwrap();
    second.fill(&other, 0x22u8).unwrap();
    let from = mark();
    g.close().expect("the close succeeds");
    assert_no_free_at(ptr, from);
    let graph2 = second.end_building().expect("the capture stayed valid");
    let exec2 = graph2.instantiate().unwrap();
    for _ in 0..2 {
        exec2
            .launch(&s)
            .expect("the second graph frees nothing of the first's");
    }
    s.synchronize().unwrap();
    with_emulator(|emu| assert!(emu.is_live(alloc), "kept by the second graph"));
    assert_no_hazards();
    exec2.close();
    graph2.close();
    drain_until(|| Emulator::get().is_none_or(|emu| !emu.is_live(alloc)));
    s.synchronize().unwrap();
    with_emulator(|emu| {
        let free = emu.only_call("cuMemFreeAsync", alloc, from);
        assert_eq!((free.stream, free.result), (Some(s.raw() as u64), 0));
    });
    assert!(errors_for(ptr).is_empty(), "{:?}", errors_for(ptr));
    assert_no_hazards();
    exec1.close();
    graph1.close();
    other.close().unwrap();
}

/// A graph allocation used on a stream forked into the same capture (the use
/// declared), the fork joined, then closed inside the capture: the free is a free node of the
/// graph, ordered after the use, and the graph launches as often as the user likes. Also with
/// the close before the join: the free node is then ordered after the use by custody (an event
/// recorded on the forked stream, waited for by the capture stream, both inside the capture).
#[test]
fn a_graph_allocation_used_on_a_forked_stream_is_freed_in_the_graph_after_the_use() {
    for close_before_join in [false, true] {
        let _serial = start();
        let (s, b) = (stream_on(0), stream_on(0));
        let out = DeviceMemoryResource::new(0)
            .unwrap()
            .allocate(1024, &s)
            .unwrap();
        s.synchronize().unwrap();
        let builder = GraphBuilder::new(&s).unwrap();
        builder.begin_building(CaptureMode::ThreadLocal).unwrap();
        let g = builder.allocate(1024).unwrap();
        builder.fill(&g, 0x33u8).unwrap();
        let fork =
            handles::EventHandle::create(&primary(0), handles::EventFlags::DISABLE_TIMING).unwrap();
        fork.record(&s).unwrap();
        b.wait_event(&fork).unwrap(); // b joins the capture
        builder.retain(&out).unwrap();
        g.copy_to(&out, &b).unwrap(); // the use on the forked stream
        g.record_use(&b).unwrap();
        let join =
            handles::EventHandle::create(&primary(0), handles::EventFlags::DISABLE_TIMING).unwrap();
        let mut g = Some(g);
        if close_before_join {
            g.take().unwrap().close().unwrap();
        }
        join.record(&b).unwrap();
        s.wait_event(&join).unwrap();
        if let Some(g) = g {
            g.close().unwrap();
        }
        let graph = builder.end_building().expect("the capture ends");
        let exec = graph.instantiate().unwrap();
        for launch in 0..3 {
            exec.launch(&s).unwrap_or_else(|e| {
                panic!("launch {launch} (close before join: {close_before_join}): {e}")
            });
            s.synchronize().unwrap();
        }
        assert_eq!(read(&out, &s), vec![0x33; 1024]);
        assert_no_hazards();
        exec.close();
        graph.close();
        handles::drain_deferred_cleanup();
        out.close().unwrap();
    }
}

/// docs/decisions.md D11, "Relaunching": a graph whose capture allocated memory it
/// does not free itself allocates that memory again at every launch, and nothing would own it.
/// So once its first launch through custody ran, a later launch is refused before any driver
/// call, naming the allocation, whether its buffer was closed (freed outside the graph) or not;
/// nothing is allocated or leaked.
#[test]
fn a_graph_that_does_not_free_its_allocation_is_not_launched_again() {
    let _serial = start();
    let s = stream_on(0);
    let builder = GraphBuilder::new(&s).unwrap();
    builder.begin_building(CaptureMode::ThreadLocal).unwrap();
    let g = builder.allocate(1024).unwrap();
    let ptr = g.ptr();
    builder.fill(&g, 0x44u8).unwrap();
    let graph = builder.end_building().unwrap();
    let exec = graph.instantiate().unwrap();
    exec.launch(&s).unwrap();
    assert_eq!(read(&g, &s), vec![0x44; 1024]);
    let refused = exec.launch(&s).unwrap_err();
    assert!(
        matches!(
            refused,
            MemoryError::Handle(handles::HandleError::GraphLaunchedOnce { allocations: 1 })
        ),
        "the buffer is still open: {refused:?}"
    );
    g.close().unwrap();
    s.synchronize().unwrap();
    let from = mark();
    let refused = exec.launch(&s).unwrap_err();
    let message = refused.to_string();
    assert!(
        matches!(
            refused,
            MemoryError::Handle(handles::HandleError::GraphLaunchedOnce { .. })
        ),
        "{refused:?}"
    );
    assert!(
        message.contains("does not free") && message.contains("launched once"),
        "{message}"
    );
    let again = graph.launch(&s).unwrap_err();
    assert!(
        matches!(
            again,
            MemoryError::Handle(handles::HandleError::GraphLaunchedOnce { .. })
        ),
        "{again:?}"
    );
    with_emulator(|emu| {
        let launches: Vec<Call> = emu
            .calls_since(from)
            .into_iter()
            .filter(|c| c.function == "cuGraphLaunch")
            .collect();
        assert!(
            launches.is_empty(),
            "refused before any driver call: {launches:#?}"
        );
        assert!(
            emu.allocation_at(ptr).is_none(),
            "nothing was allocated again"
        );
    });
    assert_no_hazards();
    exec.close();
    graph.close();
}

/// The other side: a graph that frees its allocation inside the capture launches as
/// often as the user likes.
#[test]
fn a_graph_that_frees_its_allocation_launches_again_and_again() {
    let _serial = start();
    let s = stream_on(0);
    let builder = GraphBuilder::new(&s).unwrap();
    builder.begin_building(CaptureMode::ThreadLocal).unwrap();
    let g = builder.allocate(1024).unwrap();
    builder.fill(&g, 0x55u8).unwrap();
    g.close().unwrap();
    let graph = builder.end_building().unwrap();
    let exec = graph.instantiate().unwrap();
    for _ in 0..3 {
        exec.launch(&s).unwrap();
    }
    s.synchronize().unwrap();
    assert_no_hazards();
    exec.close();
    graph.close();
}

/// An allocation of a capture that was discarded (the builder abandoned, dropped, or
/// the capture invalidated by the driver, F17) never had memory: closing or dropping its
/// buffer frees nothing, makes no driver call that fails, and reports nothing (it was
/// `CUDA_ERROR_INVALID_VALUE` from `close()`, a double free to the hazard checker, and "has
/// leaked" from a drop).
#[test]
fn an_allocation_of_a_discarded_or_invalidated_capture_frees_nothing_and_says_nothing_false() {
    #[derive(Debug, Clone, Copy)]
    enum End {
        Abandon,
        DropBuilder,
        Invalidate,
    }
    for end in [End::Abandon, End::DropBuilder, End::Invalidate] {
        for close in [true, false] {
            let _serial = start();
            let s = stream_on(0);
            let builder = GraphBuilder::new(&s).unwrap();
            builder.begin_building(CaptureMode::ThreadLocal).unwrap();
            let t = builder.allocate(1024).unwrap();
            let ptr = t.ptr();
            match end {
                End::Abandon => builder.abandon_building().unwrap(),
                End::DropBuilder => drop(builder),
                End::Invalidate => {
                    let event = handles::EventHandle::create(
                        &primary(0),
                        handles::EventFlags::DISABLE_TIMING,
                    )
                    .unwrap();
                    event.record(&s).unwrap();
                    let _ = event.query().unwrap_err(); // CUDA_ERROR_CAPTURED_EVENT
                    let ended = builder.end_building().unwrap_err();
                    assert_eq!(
                        ended.code(),
                        Some(handles::CudaErrorCode::STREAM_CAPTURE_INVALIDATED),
                        "{ended}"
                    );
                }
            }
            assert_eq!(handles::capture_status(&s).unwrap(), CaptureStatus::None);
            let from = mark();
            if close {
                t.close()
                    .unwrap_or_else(|e| panic!("{end:?}: closing frees nothing: {e}"));
            } else {
                drop(t);
            }
            handles::drain_deferred_cleanup();
            s.synchronize().unwrap();
            assert_no_free_at(ptr, from);
            assert!(
                errors_for(ptr).is_empty(),
                "{end:?}, close {close}: {:?}",
                errors_for(ptr)
            );
            assert_no_hazards();
        }
    }
}

/// The frees that waited for the first launch are ordered after it on any launch stream: a
/// launch on the legacy default stream from a thread with no current context (the launch runs in
/// the graph's context, where the token resolves) declares that stream bound to the graph's
/// context, so the ordering cannot fail for want of a current context (it could, and the launch
/// stream's synchronisation then failed too, and the free was issued unordered).
#[test]
fn a_free_waiting_for_a_launch_on_the_legacy_stream_from_a_thread_without_a_context_is_ordered_after_it(
) {
    let _serial = start();
    let s =
        handles::StreamHandle::create(&primary(0), handles::StreamFlags::NON_BLOCKING, 0).unwrap();
    let builder = GraphBuilder::new(&s).unwrap();
    builder.begin_building(CaptureMode::ThreadLocal).unwrap();
    let g = builder.allocate(1024).unwrap();
    let ptr = g.ptr();
    builder.fill(&g, 0x66u8).unwrap();
    let graph = builder.end_building().unwrap();
    let exec = graph.instantiate().unwrap();
    g.close().expect("waits for the first launch");
    assert!(handles::ContextHandle::current().unwrap().is_none());
    let from = mark();
    exec.launch(&handles::StreamHandle::legacy())
        .expect("the legacy stream of the graph's context");
    primary(0).synchronize().unwrap();
    with_emulator(|emu| {
        let frees: Vec<Call> = emu
            .calls_at(ptr, from)
            .into_iter()
            .filter(|c| c.function == "cuMemFreeAsync")
            .collect();
        assert_eq!(frees.len(), 1, "{frees:#?}");
        assert_eq!(
            (frees[0].stream, frees[0].result),
            (Some(s.raw() as u64), 0)
        );
        assert!(emu.allocation_at(ptr).is_none(), "freed");
    });
    assert!(errors_for(ptr).is_empty(), "{:?}", errors_for(ptr));
    assert_no_hazards();
    exec.close();
    graph.close();
}
