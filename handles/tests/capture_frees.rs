//! Frees whose stream is being captured (docs/decisions.md D11): memory the capture did not
//! allocate is handed to the graph being captured and freed after the graph and its executables
//! are gone; a graph allocation is freed inside the capture; a free on the legacy stream while a
//! blocking stream of its context captures waits for that capture; the cleanup worker's
//! synchronous frees never break another thread's global capture. Nothing leaks, nothing is freed
//! twice, and the user's capture stays valid (it ends with a graph).

mod common;

use std::time::{Duration, Instant};

use common::*;
use handles::sys_types::CUstreamCaptureMode;
use handles::CaptureStatus;
use handles::{
    deferred_frees_waiting_for_a_capture, drain_deferred_cleanup, ContextHandle, DevicePtrHandle,
    GraphExecHandle, GraphInstantiateFlags, MemAttachFlags, StreamFlags, StreamHandle,
};

const GLOBAL: CUstreamCaptureMode = CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_GLOBAL;
const RELAXED: CUstreamCaptureMode = CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED;

/// How long a test waits for the cleanup worker before failing instead of hanging; not a timing
/// expectation (each wait is for work already made inevitable).
const LIVENESS_BOUND: Duration = Duration::from_secs(30);

/// Drains until `done`, bounded by [`LIVENESS_BOUND`]; whether it got there.
fn drain_until(mut done: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    while start.elapsed() < LIVENESS_BOUND {
        drain_deferred_cleanup();
        if done() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    false
}

/// Which allocator a case uses.
#[derive(Clone, Copy, Debug)]
enum Kind {
    Pool,
    Device,
    PinnedHost,
    Managed,
}

impl Kind {
    fn alloc(self, stream: &StreamHandle) -> DevicePtrHandle {
        match self {
            Kind::Pool => pool_buffer(stream),
            Kind::Device => DevicePtrHandle::alloc(256, stream),
            Kind::PinnedHost => DevicePtrHandle::alloc_host(256, stream),
            Kind::Managed => DevicePtrHandle::alloc_managed(256, MemAttachFlags::GLOBAL, stream),
        }
        .expect("allocation")
    }

    /// Whether the driver still holds the allocation at `ptr` (pool memory: by the pool's used
    /// bytes against `base`; the others: the driver still knows the address).
    fn allocated(self, ptr: u64, a: &ContextHandle, base: u64) -> bool {
        match self {
            Kind::Pool => default_used(a) > base,
            _ => attributes(ptr).is_some(),
        }
    }
}

/// D11 for `kind`: its free is recorded on stream `s`, which is then captured (global mode); the
/// buffer is dropped (or, with `close`, released) during the capture. Nothing is reported, the
/// capture ends with a graph, the memory stays allocated while the graph or an executable of it
/// lives, and is freed (once) after both are gone.
fn freed_after_the_capture_graph_goes(kind: Kind, close: bool) {
    let _serial = start();
    let a = primary(0);
    let base = default_used(&a);
    let s = StreamHandle::create(&a, StreamFlags::DEFAULT, 0).unwrap();
    let buffer = kind.alloc(&s);
    let ptr = buffer.ptr();
    let alloc = alloc_of(ptr);
    let from = mark();
    handles::begin_capture(&s, GLOBAL).unwrap();
    if close {
        buffer
            .release()
            .unwrap_or_else(|e| panic!("{kind:?}: close during a capture: {e}"));
    } else {
        drop(buffer);
    }
    drain_deferred_cleanup();
    assert!(
        errors_for(ptr).is_empty(),
        "{kind:?}: {:?}",
        errors_for(ptr)
    );
    assert_eq!(
        handles::capture_status(&s).unwrap(),
        CaptureStatus::Active,
        "{kind:?}: the capture is still valid"
    );
    let graph = handles::end_capture(&s).unwrap_or_else(|e| panic!("{kind:?}: {e}"));
    assert!(
        kind.allocated(ptr, &a, base),
        "{kind:?}: the graph keeps the memory"
    );
    let exec = GraphExecHandle::instantiate(&graph, GraphInstantiateFlags::empty()).unwrap();
    drop(graph);
    exec.launch(&s).unwrap();
    s.synchronize().unwrap();
    drain_deferred_cleanup();
    assert!(
        kind.allocated(ptr, &a, base),
        "{kind:?}: the executable keeps the memory"
    );
    drop(exec);
    assert!(
        drain_until(|| !kind.allocated(ptr, &a, base)),
        "{kind:?}: freed once the graph and its executable are gone"
    );
    assert!(
        errors_for(ptr).is_empty(),
        "{kind:?}: {:?}",
        errors_for(ptr)
    );
    assert_eq!(current_raw(), 0);
    with_emulator(|emu| {
        let frees: Vec<_> = emu
            .calls_since(from)
            .into_iter()
            .filter(|c| {
                c.alloc == Some(alloc)
                    && matches!(
                        c.function.as_str(),
                        "cuMemFreeAsync" | "cuMemFree_v2" | "cuMemFreeHost"
                    )
                    && c.result == 0
            })
            .collect();
        assert_eq!(frees.len(), 1, "{kind:?}: freed exactly once: {frees:#?}");
    });
    assert_no_hazards();
}

#[test]
fn a_pool_buffer_dropped_during_a_capture_of_its_stream_goes_with_the_graph() {
    freed_after_the_capture_graph_goes(Kind::Pool, false);
}

#[test]
fn a_pool_buffer_closed_during_a_capture_of_its_stream_goes_with_the_graph() {
    freed_after_the_capture_graph_goes(Kind::Pool, true);
}

#[test]
fn synchronous_memory_dropped_during_a_capture_of_its_stream_goes_with_the_graph() {
    for kind in [Kind::Device, Kind::PinnedHost, Kind::Managed] {
        freed_after_the_capture_graph_goes(kind, false);
    }
}

#[test]
fn synchronous_memory_closed_during_a_capture_of_its_stream_goes_with_the_graph() {
    for kind in [Kind::Device, Kind::PinnedHost, Kind::Managed] {
        freed_after_the_capture_graph_goes(kind, true);
    }
}

/// A graph allocation (made on the stream during its capture) dropped during the capture is
/// freed inside it, as a free node: the graph launches twice and the memory is not left over.
#[test]
fn a_graph_allocation_dropped_during_its_capture_is_freed_inside_it() {
    let _serial = start();
    let a = primary(0);
    let s = StreamHandle::create(&a, StreamFlags::DEFAULT, 0).unwrap();
    handles::begin_capture(&s, RELAXED).unwrap();
    let buffer = DevicePtrHandle::alloc_async(4096, &s).unwrap();
    let ptr = buffer.ptr();
    buffer.as_range().fill_u8(7, &s).unwrap();
    drop(buffer);
    assert!(errors_for(ptr).is_empty(), "{:?}", errors_for(ptr));
    let graph = handles::end_capture(&s).unwrap();
    let exec = GraphExecHandle::instantiate(&graph, GraphInstantiateFlags::empty()).unwrap();
    exec.launch(&s).unwrap();
    exec.launch(&s).unwrap();
    s.synchronize().unwrap();
    assert_eq!(
        deferred_frees_waiting_for_a_capture(),
        0,
        "nothing was handed over"
    );
    drop((exec, graph));
    drain_deferred_cleanup();
    assert!(errors_for(ptr).is_empty(), "{:?}", errors_for(ptr));
    assert_no_hazards();
}

/// A free on the legacy stream while a blocking stream of its context is captured (global mode)
/// waits for that capture: issuing it would join the capture and break it
/// (`CUDA_ERROR_STREAM_CAPTURE_IMPLICIT`). The capture ends with a graph; the memory is freed
/// after the capture, nothing is reported.
#[test]
fn a_legacy_stream_free_waits_for_a_capture_of_a_blocking_stream() {
    let _serial = start();
    let a = primary(0);
    let base = default_used(&a);
    a.make_current().unwrap();
    let legacy_buffer = pool_buffer(&StreamHandle::legacy()).unwrap();
    let ptr = legacy_buffer.ptr();
    let blocking = StreamHandle::create(&a, StreamFlags::DEFAULT, 0).unwrap(); // flags 0: a blocking stream
    handles::begin_capture(&blocking, GLOBAL).unwrap();
    drop(legacy_buffer);
    assert!(errors_for(ptr).is_empty(), "{:?}", errors_for(ptr));
    assert_eq!(
        handles::capture_status(&blocking).unwrap(),
        CaptureStatus::Active,
        "the capture is still valid"
    );
    let graph = handles::end_capture(&blocking).unwrap();
    ContextHandle::clear_current().unwrap();
    assert!(
        drain_until(|| default_used(&a) == base),
        "freed after the capture ended"
    );
    assert_eq!(deferred_frees_waiting_for_a_capture(), 0);
    assert!(errors_for(ptr).is_empty(), "{:?}", errors_for(ptr));
    drop(graph);
    assert_no_hazards();
}

/// The cleanup worker's synchronous free (`cuMemFree`, a "potentially unsafe" call) runs while
/// another thread holds a global capture, and that capture stays valid: the worker captures
/// nothing, so it relaxes its own capture interaction mode.
#[test]
fn the_cleanup_worker_frees_during_another_threads_global_capture_without_breaking_it() {
    let _serial = start();
    let a = primary(0);
    let s1 = StreamHandle::create(&a, StreamFlags::DEFAULT, 0).unwrap();
    let buffer = DevicePtrHandle::alloc(256, &s1).unwrap();
    let ptr = buffer.ptr();
    let (ready_tx, ready_rx) = std::sync::mpsc::channel::<()>();
    let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
    let a2 = a.clone();
    let capturer = std::thread::spawn(move || {
        let s2 = StreamHandle::create(&a2, StreamFlags::NON_BLOCKING, 0).unwrap(); // non-blocking
        handles::begin_capture(&s2, GLOBAL).unwrap();
        ready_tx.send(()).unwrap();
        done_rx.recv().unwrap();
        let status = handles::capture_status(&s2).unwrap();
        let ended = handles::end_capture(&s2).map(drop);
        (status, ended)
    });
    ready_rx.recv().unwrap();
    drop(buffer); // records the event here; the worker waits for it and frees
    let start = Instant::now();
    while attributes(ptr).is_some() && start.elapsed() < LIVENESS_BOUND {
        std::thread::sleep(Duration::from_millis(2));
    }
    let freed = attributes(ptr).is_none();
    done_tx.send(()).unwrap();
    let (status, ended) = capturer.join().unwrap();
    assert!(freed, "the worker freed the memory during the capture");
    assert_eq!(status, CaptureStatus::Active, "the capture stayed valid");
    assert_eq!(ended, Ok(()), "and ended with a graph");
    assert!(errors_for(ptr).is_empty(), "{:?}", errors_for(ptr));
    assert_no_hazards();
}
