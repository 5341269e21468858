//! PTDS and legacy default streams (docs/reference-notes.md section 5, "PTDS and legacy default
//! streams", as decided by docs/decisions.md D6): per-thread-default-stream frees on the recording
//! thread run on its per-thread stream; on another thread they run on the legacy stream of the
//! bound context, which waits for the recording thread's per-thread stream
//! (docs/driver-facts.md F14), with no warning; only while a capture blocks that legacy stream
//! does the free wait, with one warning.

mod common;

use std::sync::{Arc, Mutex};

use common::*;
use cuda_sys::CudaErrorCode;
use handles::PoolAttribute;
use handles::{
    cleanup_warning_count, drain_deferred_cleanup, CleanupWarningKind, ContextHandle, Deallocator,
    DefaultStream, DevicePtrHandle, HandleError, MemoryPoolHandle, OwnedAllocation, StreamFlags,
    StreamHandle, ThreadToken,
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

/// The legacy stream of context `a` as the emulator names it (what a call on `CU_STREAM_LEGACY`
/// resolves to, asked on a helper thread); `None` without the emulator.
fn legacy_of(a: &ContextHandle) -> Option<u64> {
    let a = a.clone();
    on_fresh_thread(move || {
        a.make_current().unwrap();
        let me = tid();
        let from = mark();
        let _ = stream_ops::query(LEGACY);
        let legacy = with_emulator(|emu| {
            emu.one_call_on(me, "cuStreamQuery", from)
                .resolved_stream
                .expect("resolved stream logged")
        });
        ContextHandle::clear_current().unwrap();
        legacy
    })
}

/// `CU_STREAM_LEGACY`.
const LEGACY: handles::sys_types::CUstream = 0x1 as handles::sys_types::CUstream;

#[test]
fn per_thread_buffer_dropped_on_another_thread_is_freed_on_the_legacy_stream_without_a_warning() {
    let _serial = start();
    let a = primary(0);
    let base = default_used(&a);
    let a2 = a.clone();
    // The recording thread stays alive, parked, until its work and the free are done: it must
    // not end with per-thread work pending (docs/driver-facts.md F24).
    let (buffer, recorder) = on_parked_thread(&a, move || {
        a2.make_current().unwrap();
        let buffer = pool_buffer(&StreamHandle::per_thread()).unwrap();
        // A use on the recording thread's per-thread stream, not synchronised: the free on
        // another thread must still come after it (D6).
        buffer
            .as_range()
            .fill_u8(0x5a, &StreamHandle::per_thread())
            .unwrap();
        ContextHandle::clear_current().unwrap();
        buffer
    });
    let ptr = buffer.ptr();
    let alloc = alloc_of(ptr);
    let before = cleanup_warning_count();
    let from = mark();
    let after = on_fresh_thread(move || {
        drop(buffer);
        current_raw()
    });
    assert_eq!(after, 0, "the dropping thread is left with no context");
    assert_eq!(cleanup_warning_count() - before, 0, "nothing to warn about");
    assert!(warnings_for(ptr).is_empty());
    assert!(errors_for(ptr).is_empty(), "{:?}", errors_for(ptr));
    assert_eq!(default_used(&a), base, "freed");
    recorder.finish(); // its stream has drained (default_used synchronised the context)
    let legacy = legacy_of(&a);
    with_emulator(|emu| {
        let free = emu.only_call("cuMemFreeAsync", alloc, from);
        assert_eq!(
            (free.context, free.stream, free.resolved_stream, free.result),
            (a.raw() as u64, Some(0x1), legacy, 0),
            "on the legacy stream of the recorded context"
        );
    });
    // The fill on the recording thread's per-thread stream, still pending as far as any
    // synchronisation had seen, is ordered before the free (F14).
    assert_no_hazards();
}

/// D6 on any driver, with stream memory operations (as docs/driver-facts.md F14 was measured):
/// thread A's per-thread stream is held by `cuStreamWaitValue32` on a flag in host-mapped
/// memory, with a fill of the buffer queued behind it; another thread drops the buffer. While
/// the flag is unset, the free waits on the legacy stream (`cuStreamQuery` of it: not ready,
/// where it was ready before the drop) and, on the emulator, the pool's used memory has not gone
/// down; once A's stream goes on, the memory is freed.
#[test]
fn per_thread_free_on_another_thread_waits_for_the_recording_threads_pending_work() {
    let _serial = start();
    let a = primary(0);
    let pool = default_pool();
    let base = default_used(&a);
    let (sent, received) = std::sync::mpsc::channel();
    let (finish, finished) = std::sync::mpsc::channel::<()>();
    let a2 = a.clone();
    let thread_a = std::thread::spawn(move || {
        a2.make_current().unwrap();
        let ptds = StreamHandle::per_thread();
        let buffer = pool_buffer(&ptds).unwrap();
        let flag = stream_ops::HostFlag::new();
        stream_ops::hold(ptds.raw(), &flag);
        buffer.as_range().fill_u8(0x5a, &ptds).unwrap(); // queued behind the wait
        let held = stream_ops::query(ptds.raw());
        let alloc = alloc_of(buffer.ptr());
        sent.send((buffer, flag, held, alloc)).unwrap();
        let _ = finished.recv(); // until the observations are made (or the test failed)
        ptds.synchronize().unwrap();
        ContextHandle::clear_current().unwrap();
    });
    let (buffer, flag, held, alloc) = received.recv().unwrap();
    assert_eq!(
        held,
        CudaErrorCode::NOT_READY,
        "A's per-thread stream is held"
    );
    let ptr = buffer.ptr();
    let legacy = legacy_of(&a);

    // This thread has no context; it drops the last handle.
    a.make_current().unwrap();
    let before = stream_ops::query(LEGACY);
    ContextHandle::clear_current().unwrap();
    // Whether querying the legacy stream looks at other threads' per-thread streams is not
    // measured (F14 is about work enqueued there): the emulator says no; on a real driver that
    // says yes, the query after the drop proves nothing, and the marker written by a deallocator
    // (`per_thread_deallocator_on_another_thread_gets_a_stream_that_waits_for_the_recorder`)
    // is the witness.
    let control = before == CudaErrorCode::SUCCESS;
    match emulator() {
        Some(_) => assert!(
            control,
            "before the drop the legacy stream has no work: {before:?}"
        ),
        None if !control => eprintln!(
            "observed on this driver: cuStreamQuery(CU_STREAM_LEGACY) is {before:?} while only \
             another thread's per-thread stream is held; the legacy stream's state after the \
             drop is not asserted"
        ),
        None => {}
    }
    let from = mark();
    drop(buffer);
    assert_eq!(
        current_raw(),
        0,
        "the dropping thread is left with no context"
    );

    a.make_current().unwrap();
    let waiting = stream_ops::query(LEGACY);
    let used_while_held = pool.attribute(PoolAttribute::USED_MEM_CURRENT).unwrap();
    ContextHandle::clear_current().unwrap();
    if control {
        assert_eq!(
            waiting,
            CudaErrorCode::NOT_READY,
            "the free waits on the legacy stream behind A's per-thread stream"
        );
    }
    match emulator() {
        Some(_) => assert_eq!(
            used_while_held,
            base + POOL_BUFFER,
            "not freed while A's stream is held: the pool still counts it"
        ),
        None => eprintln!(
            "observed on this driver: the pool's used memory while the free waits is {used_while_held} \
             bytes ({base} before the allocation, {POOL_BUFFER} allocated)"
        ),
    }
    assert!(
        !thread_a.is_finished(),
        "A still holds its per-thread stream"
    );

    flag.release();
    drop(finish);
    thread_a.join().expect("thread A");
    a.make_current().unwrap();
    StreamHandle::legacy().synchronize().unwrap();
    ContextHandle::clear_current().unwrap();
    assert_eq!(default_used(&a), base, "freed once A's work was done");
    assert!(warnings_for(ptr).is_empty(), "{:?}", warnings_for(ptr));
    assert!(errors_for(ptr).is_empty(), "{:?}", errors_for(ptr));
    with_emulator(|emu| {
        assert!(!emu.is_live(alloc));
        let free = emu.only_call("cuMemFreeAsync", alloc, from);
        assert_eq!(
            (free.context, free.stream, free.resolved_stream, free.result),
            (a.raw() as u64, Some(0x1), legacy, 0)
        );
    });
    assert_no_hazards();
    flag.free();
}

/// D6 on any driver, observed where it is decided: a deallocator's free away from the recording
/// thread writes a marker (`cuStreamWriteValue32`) on the stream custody hands it, while thread
/// A's per-thread stream is held by `cuStreamWaitValue32` on a flag in host-mapped memory. The
/// marker stays unwritten while the flag is unset (the stream waits for A's pending work: F14)
/// and is written once A goes on. Had custody handed over the dropping thread's own per-thread
/// stream (the first version of D6), the marker would be written at once (F15).
#[test]
fn per_thread_deallocator_on_another_thread_gets_a_stream_that_waits_for_the_recorder() {
    let _serial = start();
    let a = primary(0);
    let marker = {
        a.make_current().unwrap();
        let marker = Arc::new(stream_ops::HostFlag::new());
        ContextHandle::clear_current().unwrap();
        marker
    };
    let deallocator: Arc<dyn Deallocator> = Arc::new(MarkerWriter(marker.clone()));
    let (sent, received) = std::sync::mpsc::channel();
    let (finish, finished) = std::sync::mpsc::channel::<()>();
    let a2 = a.clone();
    let thread_a = std::thread::spawn(move || {
        a2.make_current().unwrap();
        let ptds = StreamHandle::per_thread();
        let buffer =
            DevicePtrHandle::adopt(test_allocation(0x5000, 64), &ptds, deallocator).unwrap();
        let flag = stream_ops::HostFlag::new();
        stream_ops::hold(ptds.raw(), &flag);
        let held = stream_ops::query(ptds.raw());
        sent.send((buffer, flag, held)).unwrap();
        let _ = finished.recv(); // until the observations are made (or the test failed)
        ptds.synchronize().unwrap();
        ContextHandle::clear_current().unwrap();
    });
    let (buffer, flag, held) = received.recv().unwrap();
    assert_eq!(
        held,
        CudaErrorCode::NOT_READY,
        "A's per-thread stream is held"
    );

    drop(buffer); // on this thread, which has no context
    assert_eq!(
        current_raw(),
        0,
        "the dropping thread is left with no context"
    );
    assert_eq!(
        marker.read(),
        0,
        "the marker on the deallocator's stream waits for A's per-thread stream"
    );
    assert!(
        !thread_a.is_finished(),
        "A still holds its per-thread stream"
    );

    flag.release();
    drop(finish);
    thread_a.join().expect("thread A");
    a.make_current().unwrap();
    StreamHandle::legacy().synchronize().unwrap();
    ContextHandle::clear_current().unwrap();
    assert_eq!(marker.read(), MARKER, "written once A's work was done");
    assert!(
        warnings_for(0x5000).is_empty(),
        "{:?}",
        warnings_for(0x5000)
    );
    assert!(errors_for(0x5000).is_empty(), "{:?}", errors_for(0x5000));
    assert_no_hazards();
    flag.free();
    a.make_current().unwrap();
    Arc::try_unwrap(marker)
        .ok()
        .expect("the deallocator is gone")
        .free();
    ContextHandle::clear_current().unwrap();
}

/// What [`MarkerWriter`] writes.
const MARKER: u32 = 0xD6D6_0001;

/// A deallocator that frees nothing and writes [`MARKER`] into its word on the stream it is
/// handed (with the recipe's context current, as custody promises a deallocator).
struct MarkerWriter(Arc<stream_ops::HostFlag>);

impl Deallocator for MarkerWriter {
    fn deallocate(
        &self,
        allocation: OwnedAllocation,
        stream: &StreamHandle,
    ) -> Result<(), HandleError> {
        let _ = allocation.into_raw();
        stream_ops::write(stream.raw(), &self.0, MARKER);
        Ok(())
    }
}

/// Synchronous memory dropped away from its recording thread: the ordering event is recorded on
/// the legacy stream of the recorded context (D6, D9) and the worker frees after it.
#[test]
fn per_thread_synchronous_buffer_dropped_on_another_thread_is_ordered_on_the_legacy_stream() {
    let _serial = start();
    let a = primary(0);
    let a2 = a.clone();
    // Parked until the free is done: it must not end with its fill pending (F24).
    let (buffer, recorder) = on_parked_thread(&a, move || {
        a2.make_current().unwrap();
        let buffer = DevicePtrHandle::alloc(256, &StreamHandle::per_thread()).unwrap();
        buffer
            .as_range()
            .fill_u8(7, &StreamHandle::per_thread())
            .unwrap();
        ContextHandle::clear_current().unwrap();
        buffer
    });
    let ptr = buffer.ptr();
    let alloc = alloc_of(ptr);
    let (dropper, from) = on_fresh_thread(move || {
        let (me, from) = (tid(), mark());
        drop(buffer);
        (me, from)
    });
    drain_deferred_cleanup();
    assert_eq!(attributes(ptr), None, "freed by the worker or the drain");
    recorder.finish();
    assert!(warnings_for(ptr).is_empty(), "{:?}", warnings_for(ptr));
    assert!(errors_for(ptr).is_empty(), "{:?}", errors_for(ptr));
    let legacy = legacy_of(&a);
    with_emulator(|emu| {
        let record = emu.one_call_on(dropper, "cuEventRecord", from);
        assert_eq!(
            (record.stream, record.resolved_stream, record.result),
            (Some(0x1), legacy, 0),
            "the ordering event is on the legacy stream"
        );
        assert_eq!(emu.only_call("cuMemFree_v2", alloc, from).result, 0);
    });
    assert_no_hazards();
}

/// An explicit release away from the recording thread waits for the legacy stream (an event
/// recorded there), then frees: `cuMemFree` after A's fill.
#[test]
fn per_thread_synchronous_buffer_released_on_another_thread_waits_on_the_legacy_stream() {
    let _serial = start();
    let a = primary(0);
    let a2 = a.clone();
    // Parked until the free is done: it must not end with its fill pending (F24).
    let (buffer, recorder) = on_parked_thread(&a, move || {
        a2.make_current().unwrap();
        let buffer = DevicePtrHandle::alloc(256, &StreamHandle::per_thread()).unwrap();
        buffer
            .as_range()
            .fill_u8(7, &StreamHandle::per_thread())
            .unwrap();
        ContextHandle::clear_current().unwrap();
        buffer
    });
    let ptr = buffer.ptr();
    let (names, after) = on_fresh_thread(move || {
        let (me, from) = (tid(), mark());
        buffer.release().unwrap();
        (with_emulator(|emu| emu.names_on(me, from)), current_raw())
    });
    assert_eq!(after, 0);
    assert_eq!(attributes(ptr), None, "freed by the time release returned");
    recorder.finish();
    if let Some(names) = names {
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        let at = names
            .iter()
            .position(|n| *n == "cuEventRecord")
            .expect("cuEventRecord");
        assert_eq!(
            names[at..at + 4],
            [
                "cuEventRecord",
                "cuEventSynchronize",
                "cuEventDestroy_v2",
                "cuMemFree_v2"
            ],
            "{names:?}"
        );
    }
    assert_no_hazards();
}

/// A deallocator's free away from the recording thread is handed the legacy token, with the
/// recorded context current.
#[test]
fn per_thread_adopted_memory_freed_on_another_thread_gets_the_legacy_token() {
    let _serial = start();
    let a = primary(0);
    let seen = Arc::new(Mutex::new(Vec::new()));
    let deallocator: Arc<dyn Deallocator> = Arc::new(Recording(seen.clone()));
    let a2 = a.clone();
    let buffer = on_fresh_thread(move || {
        a2.make_current().unwrap();
        let buffer = DevicePtrHandle::adopt(
            test_allocation(0x3000, 64),
            &StreamHandle::per_thread(),
            deallocator,
        )
        .unwrap();
        ContextHandle::clear_current().unwrap();
        buffer
    });
    on_fresh_thread(move || drop(buffer));
    assert_eq!(
        *seen.lock().unwrap(),
        [(0x3000, 0x1, a.raw() as u64)],
        "(pointer, stream, current context) seen by the deallocator"
    );
    assert!(warnings_for(0x3000).is_empty());
}

/// A deallocator that records (pointer, stream, current context) and frees nothing.
struct Recording(Arc<Mutex<Vec<(u64, usize, u64)>>>);

impl Deallocator for Recording {
    fn deallocate(
        &self,
        allocation: OwnedAllocation,
        stream: &StreamHandle,
    ) -> Result<(), HandleError> {
        let (ptr, _) = allocation.into_raw();
        self.0
            .lock()
            .unwrap()
            .push((ptr, stream.raw() as usize, current_raw()));
        Ok(())
    }
}

/// A free away from the recording thread while a blocking stream of the context is captured:
/// the legacy stream is blocked, so the free waits for the capture (issuing it would break the
/// capture), with one warning that it could not be handed to that capture's graph; the capture
/// stays valid, and the memory is freed on the legacy stream after it.
#[test]
fn per_thread_free_on_another_thread_during_a_capture_waits_for_it_with_one_warning() {
    let _serial = start();
    let a = primary(0);
    let base = default_used(&a);
    let a2 = a.clone();
    // Parked until the free is done: it must not end with its allocation unsynchronised (F24).
    let ((buffer, recorder), recording_thread) = on_parked_thread(&a, move || {
        a2.make_current().unwrap();
        let buffer = pool_buffer(&StreamHandle::per_thread()).unwrap();
        ContextHandle::clear_current().unwrap();
        (buffer, ThreadToken::current())
    });
    let ptr = buffer.ptr();
    let alloc = alloc_of(ptr);
    a.make_current().unwrap();
    let blocking = StreamHandle::create(&a, StreamFlags::DEFAULT, 0).unwrap();
    handles::begin_capture(
        &blocking,
        handles::sys_types::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_GLOBAL,
    )
    .unwrap();
    let dropper = on_fresh_thread(move || {
        drop(buffer);
        ThreadToken::current()
    });
    assert_eq!(
        handles::capture_status(&blocking).unwrap(),
        handles::CaptureStatus::Active,
        "the capture is still valid"
    );
    assert_eq!(handles::deferred_frees_waiting_for_a_capture(), 1);
    let graph = handles::end_capture(&blocking).unwrap();
    ContextHandle::clear_current().unwrap();
    let from = mark();
    drain_deferred_cleanup();
    assert_eq!(handles::deferred_frees_waiting_for_a_capture(), 0);
    assert_eq!(default_used(&a), base, "freed after the capture");
    recording_thread.finish();
    let warnings = warnings_for(ptr);
    assert_eq!(
        warnings.len(),
        1,
        "one warning, not one per retry: {warnings:?}"
    );
    assert_eq!(
        warnings[0].kind,
        CleanupWarningKind::PerThreadStreamFreeWaitsForCapture {
            recorded_thread: recorder.value(),
            freeing_thread: dropper.value(),
        }
    );
    assert_eq!(warnings[0].stream, 0x1);
    assert!(errors_for(ptr).is_empty(), "{:?}", errors_for(ptr));
    with_emulator(|emu| {
        let free = emu.only_call("cuMemFreeAsync", alloc, from);
        assert_eq!((free.stream, free.result), (Some(0x1), 0));
    });
    drop(graph);
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
