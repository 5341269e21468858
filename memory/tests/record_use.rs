//! Declared use streams (`Buffer::record_use`, docs/decisions.md D12): a buffer read on a stream
//! other than its deallocation stream, with that use recorded, is freed after the read on every
//! memory kind, through deferred cleanup and after `set_deallocation_stream`; without the record
//! the hazard checker reports the unordered free. Runs on the emulator and on a real driver: the
//! bytes read back and the memory freed everywhere, the hazard checker and the call log (which
//! stream waited, which freed) on the emulator. The real-driver witness of the order itself is
//! `handles/tests/record_use.rs`, with stream memory operations.

mod common;

use std::sync::Arc;

use common::*;
use handles::{ContextHandle, CudaErrorCode, EventFlags, EventHandle, HandleError, StreamHandle};
use memory::{
    Buffer, CaptureMode, DeviceMemoryResource, Graph, GraphBuilder, LegacyPinnedMemoryResource,
    ManagedMemoryResource, MemoryError, MemoryResource, PinnedMemoryResource,
    PinnedMemoryResourceOptions, SynchronousMemoryResource,
};

const SIZE: usize = 4096;

fn device_mr() -> Arc<DeviceMemoryResource> {
    DeviceMemoryResource::new(0).expect("device 0's pool")
}

/// The streams of every test here: `a` orders the buffer's free (its recipe), `b` reads it.
/// [`Scene::new`] fills the buffer on `a` and makes `b` wait for the fill; [`Scene::read_on_b`]
/// copies it into `out` (device memory freed on `b`): the use the free on `a` must follow.
struct Scene {
    a: StreamHandle,
    b: StreamHandle,
    out: Buffer,
}

impl Scene {
    fn new(mr: Arc<dyn MemoryResource>) -> (Scene, Buffer) {
        let (a, b) = (stream_on(0), stream_on(0));
        let buffer = mr.allocate_owned(SIZE, &a).expect("allocate");
        let out = device_mr().allocate(SIZE, &b).expect("allocate out");
        buffer.fill(0x5au8, &a).unwrap();
        let filled =
            EventHandle::create(&a.context().unwrap(), EventFlags::DISABLE_TIMING).unwrap();
        filled.record(&a).unwrap();
        b.wait_event(&filled).unwrap();
        (Scene { a, b, out }, buffer)
    }

    fn read_on_b(&self, buffer: &Buffer) {
        buffer.copy_to(&self.out, &self.b).unwrap();
    }

    /// What `out` holds once `b` is done (`a` is synchronised too); frees `out`.
    fn finish(self) -> Vec<u8> {
        let bytes = read(&self.out, &self.b);
        self.a.synchronize().unwrap();
        self.out.close().unwrap();
        bytes
    }
}

/// The successful `cuStreamWaitEvent` calls on `stream` since `from`; `None` without the
/// emulator.
fn waits_on(stream: &StreamHandle, from: u64) -> Option<usize> {
    with_emulator(|emu| {
        emu.calls()
            .into_iter()
            .filter(|c| {
                c.seq >= from
                    && c.function == "cuStreamWaitEvent"
                    && c.stream == Some(stream.raw() as u64)
                    && c.result == 0
            })
            .count()
    })
}

#[test]
fn a_recorded_use_orders_the_free_after_the_read() {
    let _serial = start();
    let base = device_used();
    let (scene, buffer) = Scene::new(device_mr());
    let alloc = alloc_of(buffer.ptr());
    scene.read_on_b(&buffer);
    buffer.record_use(&scene.b).unwrap();
    assert_eq!(buffer.use_streams().len(), 1);
    assert!(buffer.use_streams()[0].ptr_eq(&scene.b));
    let from = mark();
    drop(buffer);
    assert_eq!(
        waits_on(&scene.a, from).unwrap_or(1),
        1,
        "a waited for b, once"
    );
    with_emulator(|emu| {
        let free = emu.only_call("cuMemFreeAsync", alloc, from);
        assert_eq!(
            free.stream,
            Some(scene.a.raw() as u64),
            "freed on a, its recipe"
        );
        assert_eq!(
            emu.hazards_for(alloc),
            vec![],
            "ordered after the read on b"
        );
    });
    assert_eq!(scene.finish(), vec![0x5a; SIZE], "b read what a wrote");
    assert_eq!(device_used(), base, "freed");
    assert_no_hazards();
}

#[test]
fn without_record_use_the_checker_reports_the_unordered_free() {
    let _serial = start();
    // On a GPU the unordered free races with b's copy, and nothing but the checker sees it.
    let Some(emu) = emulator_or_skip("hazard checker to see the unordered free") else {
        return;
    };
    let (scene, buffer) = Scene::new(device_mr());
    let alloc = alloc_of(buffer.ptr());
    scene.read_on_b(&buffer);
    drop(buffer);
    let _ = scene.finish();
    let hazards = emu.hazards_for(alloc);
    assert!(
        hazards.iter().any(|h| h.kind == "unordered_free"),
        "{hazards:#?}"
    );
    emu.clear_hazards();
}

/// The event is recorded at the free, not at `record_use`: a use enqueued after the record is
/// covered too (docs/decisions.md D12 says why this is the right time).
#[test]
fn a_use_enqueued_after_the_record_is_ordered_too() {
    let _serial = start();
    let (scene, buffer) = Scene::new(device_mr());
    let alloc = alloc_of(buffer.ptr());
    buffer.record_use(&scene.b).unwrap();
    scene.read_on_b(&buffer); // after the record
    buffer.close().unwrap();
    with_emulator(|emu| assert_eq!(emu.hazards_for(alloc), vec![]));
    assert_eq!(scene.finish(), vec![0x5a; SIZE]);
    assert_no_hazards();
}

#[test]
fn recording_a_stream_twice_or_the_deallocation_stream_orders_nothing_more() {
    let _serial = start();
    let (scene, buffer) = Scene::new(device_mr());
    scene.read_on_b(&buffer);
    buffer.record_use(&scene.b).unwrap();
    buffer.record_use(&scene.b).unwrap();
    buffer.record_use(&scene.a).unwrap();
    assert_eq!(buffer.use_streams().len(), 2, "b once, and a");
    let from = mark();
    drop(buffer);
    assert_eq!(waits_on(&scene.a, from).unwrap_or(1), 1, "one wait, for b");
    assert_eq!(scene.finish(), vec![0x5a; SIZE]);
    assert_no_hazards();
}

/// Every memory kind: pool, `cuMemAlloc`, pinned (`cuMemAllocHost` and a host pool), managed,
/// and adopted memory freed by a resource's `deallocate`; dropped (the synchronous kinds then
/// free on the cleanup worker, after an event on `a`, which waits for `b`) and closed.
#[test]
fn every_memory_kind_is_freed_after_a_recorded_use() {
    let _serial = start();
    let mut kinds: Vec<(&str, Arc<dyn MemoryResource>)> = vec![
        ("pool", device_mr()),
        ("cuMemAlloc", SynchronousMemoryResource::new(0).unwrap()),
        ("cuMemAllocHost", LegacyPinnedMemoryResource::new()),
        ("cuMemAllocManaged", ManagedMemoryResource::new()),
        ("adopted", RecordingResource::new(0)),
    ];
    match PinnedMemoryResource::new(PinnedMemoryResourceOptions::default()) {
        Ok(mr) => kinds.push(("host pool", mr)),
        Err(error) => eprintln!("no host pool on this driver ({error}): not covered here"),
    }
    for (kind, mr) in kinds {
        for close in [false, true] {
            let (scene, buffer) = Scene::new(Arc::clone(&mr));
            let ptr = buffer.ptr();
            let alloc = alloc_of(ptr);
            scene.read_on_b(&buffer);
            buffer.record_use(&scene.b).unwrap();
            if close {
                buffer.close().unwrap();
            } else {
                drop(buffer);
                handles::drain_deferred_cleanup();
            }
            with_emulator(|emu| {
                assert_eq!(emu.hazards_for(alloc), vec![], "{kind}, close: {close}");
                assert!(!emu.is_live(alloc), "{kind}, close: {close}: freed");
            });
            assert_eq!(scene.finish(), vec![0x5a; SIZE], "{kind}, close: {close}");
        }
    }
    assert_no_hazards();
}

/// `set_deallocation_stream` replaces the recipe, not the uses: the free on the new stream
/// still waits for `b`.
#[test]
fn uses_carry_over_set_deallocation_stream() {
    let _serial = start();
    let (scene, buffer) = Scene::new(device_mr());
    let alloc = alloc_of(buffer.ptr());
    buffer.record_use(&scene.b).unwrap();
    let c = stream_on(0);
    // c is ordered after a's fill; b's read is what only the recorded use orders.
    let filled =
        EventHandle::create(&scene.a.context().unwrap(), EventFlags::DISABLE_TIMING).unwrap();
    filled.record(&scene.a).unwrap();
    c.wait_event(&filled).unwrap();
    buffer.set_deallocation_stream(&c).unwrap();
    assert_eq!(buffer.use_streams().len(), 1, "the use stays");
    scene.read_on_b(&buffer);
    let from = mark();
    drop(buffer);
    assert_eq!(waits_on(&c, from).unwrap_or(1), 1, "c waited for b");
    with_emulator(|emu| {
        let free = emu.only_call("cuMemFreeAsync", alloc, from);
        assert_eq!(free.stream, Some(c.raw() as u64));
        assert_eq!(emu.hazards_for(alloc), vec![]);
    });
    assert_eq!(scene.finish(), vec![0x5a; SIZE]);
    c.synchronize().unwrap();
    assert_no_hazards();
}

/// A graph retains the buffer; its deferred release (the cleanup worker or a drain) frees it
/// after the recorded use.
#[test]
fn a_graph_retained_buffer_is_freed_after_a_recorded_use_by_deferred_cleanup() {
    let _serial = start();
    let (scene, buffer) = Scene::new(device_mr());
    let alloc = alloc_of(buffer.ptr());
    let graph = Graph::new(0).unwrap();
    graph.retain(&buffer).unwrap();
    scene.read_on_b(&buffer);
    buffer.record_use(&scene.b).unwrap();
    buffer.close().unwrap(); // the graph holds it
    with_emulator(|emu| assert!(emu.is_live(alloc), "kept by the graph"));
    graph.close();
    handles::drain_deferred_cleanup();
    with_emulator(|emu| {
        assert!(!emu.is_live(alloc), "freed by deferred cleanup");
        assert_eq!(emu.hazards_for(alloc), vec![], "after the read on b");
    });
    assert_eq!(scene.finish(), vec![0x5a; SIZE]);
    assert_no_hazards();
}

#[test]
fn a_stream_of_another_device_is_refused_and_nothing_is_recorded() {
    let _serial = start();
    if handles::device_count().unwrap_or(1) < 2 {
        eprintln!("skipped: needs two devices");
        return;
    }
    let buffer = device_mr().allocate(SIZE, &stream_on(0)).unwrap();
    let other = stream_on(1);
    match buffer.record_use(&other) {
        Err(MemoryError::Handle(handles::HandleError::WrongDevice { expected, found })) => {
            assert_eq!((expected, found), (0, 1))
        }
        other => panic!("expected WrongDevice, got {other:?}"),
    }
    assert!(buffer.use_streams().is_empty(), "nothing recorded");
    buffer.close().unwrap();
    assert_no_hazards();
}

#[test]
fn a_token_with_no_current_context_is_refused_and_nothing_is_recorded() {
    let _serial = start();
    let buffer = device_mr().allocate(SIZE, &stream_on(0)).unwrap();
    assert!(ContextHandle::current().unwrap().is_none());
    match buffer.record_use(&StreamHandle::per_thread()) {
        Err(MemoryError::Handle(HandleError::NoCurrentContext)) => {}
        other => panic!("expected NoCurrentContext, got {other:?}"),
    }
    assert!(buffer.use_streams().is_empty(), "nothing recorded");
    buffer.close().unwrap();
    assert_no_hazards();
}

/// A use stream being captured when the free runs: an event recorded there would be a capture
/// node (and waiting on it would pull the free into the capture), so the free waits for the
/// capture to end, leaves the capture valid, and then runs ordered after the use stream.
#[test]
fn a_free_whose_use_stream_is_being_captured_waits_for_the_capture() {
    let _serial = start();
    let (scene, buffer) = Scene::new(device_mr());
    let alloc = alloc_of(buffer.ptr());
    scene.read_on_b(&buffer);
    buffer.record_use(&scene.b).unwrap();
    let builder = GraphBuilder::new(&scene.b).unwrap();
    builder.begin_building(CaptureMode::ThreadLocal).unwrap();
    drop(buffer);
    with_emulator(|emu| assert!(emu.is_live(alloc), "waits for the capture"));
    assert_eq!(handles::deferred_frees_waiting_for_a_capture(), 1);
    let graph = builder.end_building().expect("the capture stayed valid");
    handles::drain_deferred_cleanup();
    assert_eq!(handles::deferred_frees_waiting_for_a_capture(), 0);
    with_emulator(|emu| {
        assert!(!emu.is_live(alloc), "freed after the capture");
        assert_eq!(emu.hazards_for(alloc), vec![]);
    });
    graph.close();
    assert_eq!(scene.finish(), vec![0x5a; SIZE]);
    assert_no_hazards();
}

/// A use stream whose capture state the driver does not tell (`cuStreamGetCaptureInfo_v2`
/// fails, as it does for a stream its owner destroyed): the free could not be ordered after the
/// use, so it is not issued and `close` returns the query's error, as for any use it cannot
/// order. It is not parked as if the stream were being captured, where it would wait for a
/// capture end that never comes while `close` said it succeeded.
#[test]
fn a_failed_capture_query_of_a_use_stream_is_the_closes_error() {
    let _serial = start();
    let Some(emu) = emulator_or_skip("fault injection to make a capture query fail") else {
        return;
    };
    let (scene, buffer) = Scene::new(device_mr());
    let ptr = buffer.ptr();
    let alloc = alloc_of(ptr);
    scene.read_on_b(&buffer);
    buffer.record_use(&scene.b).unwrap();
    let from = mark();
    // The first query is the free's own stream's (`a`), the second the use stream's (`b`).
    assert!(emu.inject_fault(
        "cuStreamGetCaptureInfo_v2",
        2,
        CudaErrorCode::INVALID_HANDLE
    ));
    let error = buffer.close().unwrap_err();
    assert!(
        matches!(error, MemoryError::Handle(HandleError::Driver(ref e))
            if e.call == "cuStreamGetCaptureInfo_v2"),
        "{error:?}"
    );
    assert_eq!(error.code(), Some(CudaErrorCode::INVALID_HANDLE));
    let failed: Vec<_> = emu
        .calls()
        .into_iter()
        .filter(|c| c.seq >= from && c.function == "cuStreamGetCaptureInfo_v2" && c.result != 0)
        .collect();
    assert_eq!(failed.len(), 1, "{failed:?}");
    assert_eq!(
        failed[0].stream,
        Some(scene.b.raw() as u64),
        "the use stream's query"
    );
    assert_eq!(
        handles::deferred_frees_waiting_for_a_capture(),
        0,
        "not parked as if captured"
    );
    assert!(
        emu.is_live(alloc),
        "not freed: the free would have been unordered"
    );
    scene.b.synchronize().unwrap();
    unowned(ptr, 0).free_async(&scene.a).unwrap();
    assert_eq!(scene.finish(), vec![0x5a; SIZE]);
    assert_no_hazards();
}

/// Pinned memory accepts a use stream of another device: the event is recorded in that
/// stream's context (device 1's) and the free's stream (device 0's) waits for it.
#[test]
fn pinned_memory_freed_after_a_use_on_another_devices_stream() {
    let _serial = start();
    if handles::device_count().unwrap_or(1) < 2 {
        eprintln!("skipped: needs two devices");
        return;
    }
    let (a, b) = (stream_on(0), stream_on(1));
    let buffer = LegacyPinnedMemoryResource::new()
        .allocate(SIZE, &a)
        .unwrap();
    let alloc = alloc_of(buffer.ptr());
    buffer.fill(0x5au8, &a).unwrap();
    a.synchronize().unwrap();
    let out = DeviceMemoryResource::new(1)
        .unwrap()
        .allocate(SIZE, &b)
        .unwrap();
    buffer.copy_to(&out, &b).unwrap(); // the use on device 1
    buffer.record_use(&b).unwrap();
    let from = mark();
    drop(buffer);
    handles::drain_deferred_cleanup();
    assert_eq!(
        waits_on(&a, from).unwrap_or(1),
        1,
        "a (device 0) waited for b (device 1)"
    );
    with_emulator(|emu| {
        assert!(!emu.is_live(alloc), "freed");
        assert_eq!(emu.hazards_for(alloc), vec![], "after the read on device 1");
    });
    assert_eq!(read(&out, &b), vec![0x5a; SIZE]);
    out.close().unwrap();
    assert_no_hazards();
}

/// Managed memory (`cuMemAllocManaged`, made in device 0's context) accepts another device's
/// stream as a use and as its deallocation stream, as pinned memory does and as the managed
/// pool's buffers do (docs/decisions.md D12): it is not bound to the device of the context it
/// was allocated in. The free is then ordered on device 1's stream.
#[test]
fn managed_memory_accepts_another_devices_stream_as_a_use_and_for_its_free() {
    let _serial = start();
    if handles::device_count().unwrap_or(1) < 2 {
        eprintln!("skipped: needs two devices");
        return;
    }
    let (a, b) = (stream_on(0), stream_on(1));
    let buffer = ManagedMemoryResource::new().allocate(SIZE, &a).unwrap();
    let alloc = alloc_of(buffer.ptr());
    buffer.fill(0x5au8, &a).unwrap();
    a.synchronize().unwrap();
    let out = DeviceMemoryResource::new(1)
        .unwrap()
        .allocate(SIZE, &b)
        .unwrap();
    buffer.copy_to(&out, &b).unwrap(); // the use on device 1
    buffer
        .record_use(&b)
        .expect("managed memory accepts a use on any device's stream");
    assert_eq!(buffer.use_streams().len(), 1);
    let c = stream_on(1);
    buffer
        .set_deallocation_stream(&c)
        .expect("managed memory accepts any device's deallocation stream");
    assert!(buffer.deallocation_stream().unwrap().ptr_eq(&c));
    let from = mark();
    drop(buffer);
    handles::drain_deferred_cleanup();
    assert_eq!(
        waits_on(&c, from).unwrap_or(1),
        1,
        "c (device 1) waited for b (device 1)"
    );
    with_emulator(|emu| {
        assert!(!emu.is_live(alloc), "freed");
        assert_eq!(emu.hazards_for(alloc), vec![], "after the read on device 1");
    });
    assert_eq!(read(&out, &b), vec![0x5a; SIZE]);
    out.close().unwrap();
    assert_no_hazards();
}
