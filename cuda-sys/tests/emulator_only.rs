//! Tests only the emulated driver can pass: the hazard checker, fault injection, the call log,
//! bad input that a real driver may crash on, the live-allocation query, graphs and user
//! objects in detail, and a two-process pool IPC round trip. Fact IDs (F1, F13, G1-G3) are
//! those of `docs/driver-facts.md`.
//!
//! Run with `cargo build -p cuda-custody-emu && CUSTODY_CUDA_DRIVER=$PWD/target/debug/libcuda_emu.so
//! cargo nextest run -p cuda-custody-sys --test emulator_only`. Every test is correct both in its own
//! process (nextest) and with the others in one process (`cargo test -- --test-threads=1`): it
//! clears hazards and the call log first and only looks at its own pointers and handles.

use std::ffi::{c_int, c_uint, c_void};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use cuda_sys::types::*;
use cuda_sys::{CUresult, CudaErrorCode, Driver};
use test_support::emu::{Allocation, AllocationId, Emulator, Hazard};

/// Calls a driver entry point.
macro_rules! cu {
    ($d:expr, $f:ident($($a:expr),* $(,)?)) => {{
        // SAFETY: every pointer argument points to live storage of the type the driver API
        // documents for it; handles are plain values the emulator validates.
        unsafe { ($d.$f().unwrap_or_else(|e| panic!("{e}")))($($a),*) }
    }};
}

/// Calls a driver entry point that must succeed.
macro_rules! ok {
    ($d:expr, $f:ident($($a:expr),* $(,)?)) => {{
        let status: CUresult = cu!($d, $f($($a),*));
        assert_eq!(CudaErrorCode(status), CudaErrorCode::SUCCESS, "{}", stringify!($f));
    }};
}

fn code(status: CUresult) -> CudaErrorCode {
    CudaErrorCode(status)
}

/// The driver and the emulator's interface, initialised, with hazards and calls cleared and the
/// primary context of device 0 current on the calling thread. Returns that context.
fn setup() -> (&'static Driver, Emulator, CUcontext) {
    let d = cuda_sys::driver().expect("the driver loads");
    let emu = Emulator::get().expect("needs the emulated driver");
    emu.clear_faults();
    emu.clear_hazards();
    emu.clear_calls();
    ok!(d, cuInit(0));
    let mut ctx: CUcontext = std::ptr::null_mut();
    ok!(d, cuDevicePrimaryCtxRetain(&mut ctx, 0));
    ok!(d, cuCtxSetCurrent(ctx));
    (d, emu, ctx)
}

fn stream(d: &Driver) -> CUstream {
    let mut s: CUstream = std::ptr::null_mut();
    ok!(d, cuStreamCreate(&mut s, 0));
    s
}

fn event(d: &Driver) -> CUevent {
    let mut e: CUevent = std::ptr::null_mut();
    ok!(d, cuEventCreate(&mut e, 0));
    e
}

fn alloc_async(d: &Driver, size: usize, s: CUstream) -> CUdeviceptr {
    let mut p: CUdeviceptr = 0;
    ok!(d, cuMemAllocAsync(&mut p, size, s));
    p
}

/// The hazards of one allocation, by identity: its address may belong to another allocation
/// by the time the hazard is looked at (a pool hands freed addresses out again,
/// docs/driver-facts.md F18).
fn hazards_for(emu: &Emulator, alloc: AllocationId) -> Vec<Hazard> {
    emu.hazards()
        .into_iter()
        .filter(|h| h.alloc == Some(alloc))
        .collect()
}

/// The live allocation at `p`.
fn live_at(emu: &Emulator, p: CUdeviceptr) -> Allocation {
    emu.allocation_at(p)
        .unwrap_or_else(|| panic!("no live allocation at {p:#x}"))
}

/// The identity of the live allocation at `p`.
fn id_at(emu: &Emulator, p: CUdeviceptr) -> AllocationId {
    live_at(emu, p).id
}

fn kinds(hazards: &[Hazard]) -> Vec<&str> {
    hazards.iter().map(|h| h.kind.as_str()).collect()
}

#[test]
fn unordered_free_is_reported() {
    let (d, emu, _) = setup();
    let (a, b) = (stream(d), stream(d));
    let p = alloc_async(d, 256, a);
    let id = id_at(&emu, p);
    ok!(d, cuMemsetD8Async(p, 7, 256, a));
    ok!(d, cuMemFreeAsync(p, b));
    let hazards = hazards_for(&emu, id);
    assert_eq!(kinds(&hazards), ["unordered_free"], "{hazards:?}");
    assert_eq!(hazards[0].function, "cuMemFreeAsync");
    assert_eq!(hazards[0].stream, b as u64);
}

/// A stream-ordered allocation used on another stream that nothing orders after the allocation
/// is `use_before_alloc` (compute-sanitizer's stream-ordered race check reports the same as
/// use-before-alloc: in the GPU run of 2026-12-01 it found a memory test doing it, which the
/// emulator had passed); an event wait, or a host synchronisation of the allocating stream,
/// orders the use.
#[test]
fn a_use_on_another_stream_not_ordered_after_the_allocation_is_reported() {
    let (d, emu, _) = setup();
    let (a, b) = (stream(d), stream(d));
    let p = alloc_async(d, 256, a);
    let id = id_at(&emu, p);
    ok!(d, cuMemsetD8Async(p, 7, 256, b));
    let hazards = hazards_for(&emu, id);
    assert_eq!(kinds(&hazards), ["use_before_alloc"], "{hazards:?}");
    assert_eq!(hazards[0].function, "cuMemsetD8Async");
    assert_eq!(hazards[0].stream, b as u64);

    emu.clear_hazards();
    let e = event(d);
    let q = alloc_async(d, 256, a);
    ok!(d, cuEventRecord(e, a));
    ok!(d, cuStreamWaitEvent(b, e, 0));
    ok!(d, cuMemsetD8Async(q, 7, 256, b));
    let r = alloc_async(d, 256, a);
    ok!(d, cuStreamSynchronize(a));
    ok!(d, cuMemsetD8Async(r, 7, 256, b));
    ok!(d, cuStreamSynchronize(b));
    for x in [p, q, r] {
        ok!(d, cuMemFreeAsync(x, b));
    }
    ok!(d, cuStreamSynchronize(b));
    assert!(emu.hazards().is_empty(), "{:?}", emu.hazards());
}

#[test]
fn correctly_ordered_two_stream_program_reports_no_hazard() {
    let (d, emu, _) = setup();
    let (a, b) = (stream(d), stream(d));
    let e = event(d);
    let p = alloc_async(d, 256, a);
    let id = id_at(&emu, p);
    ok!(d, cuMemsetD8Async(p, 7, 256, a));
    ok!(d, cuEventRecord(e, a));
    ok!(d, cuStreamWaitEvent(b, e, 0));
    ok!(d, cuMemFreeAsync(p, b));
    ok!(d, cuStreamSynchronize(b));
    assert!(hazards_for(&emu, id).is_empty(), "{:?}", emu.hazards());
}

/// A context synchronisation observes the work of a stream destroyed before it (the
/// conformance case `basic_ctx_synchronize_waits_for_a_destroyed_streams_work`
/// checks that it waits for it): a free ordered after it is not `unordered_free`. The pattern of
/// cuda.core's send-buffers IPC test (a buffer filled on a stream of a helper object that goes
/// before `Device.sync()`), where the emulator used to report one.
#[test]
fn context_synchronisation_orders_the_work_of_a_destroyed_stream() {
    let (d, emu, _) = setup();
    let (a, b) = (stream(d), stream(d));
    let p = alloc_async(d, 64, a);
    ok!(d, cuStreamSynchronize(a));
    let id = id_at(&emu, p);
    let c = stream(d);
    ok!(d, cuMemsetD8Async(p, 1, 64, c));
    ok!(d, cuStreamDestroy_v2(c));
    ok!(d, cuCtxSynchronize());
    ok!(d, cuMemFreeAsync(p, b));
    ok!(d, cuStreamSynchronize(b));
    assert!(hazards_for(&emu, id).is_empty(), "{:?}", emu.hazards());
}

#[test]
fn host_synchronisation_orders_a_free_on_another_thread() {
    let (d, emu, ctx) = setup();
    let a = stream(d);
    let p = alloc_async(d, 64, a);
    let id = id_at(&emu, p);
    ok!(d, cuMemsetD8Async(p, 1, 64, a));
    ok!(d, cuStreamSynchronize(a));
    let ctx = ctx as u64;
    std::thread::spawn(move || {
        let d = cuda_sys::driver().unwrap();
        ok!(d, cuCtxSetCurrent(ctx as CUcontext));
        let b = stream(d);
        ok!(d, cuMemFreeAsync(p, b));
    })
    .join()
    .unwrap();
    assert!(hazards_for(&emu, id).is_empty(), "{:?}", emu.hazards());
}

#[test]
fn legacy_stream_implicit_synchronisation_orders_frees() {
    let (d, emu, _) = setup();
    let a = stream(d);
    let p = alloc_async(d, 64, a);
    let id = id_at(&emu, p);
    ok!(d, cuMemsetD8Async(p, 1, 64, a));
    // The legacy stream waits for prior work on every blocking stream of its context.
    ok!(d, cuMemFreeAsync(p, CU_STREAM_LEGACY));
    assert!(hazards_for(&emu, id).is_empty(), "{:?}", emu.hazards());

    // A non-blocking stream is exempt.
    let mut nb: CUstream = std::ptr::null_mut();
    ok!(d, cuStreamCreate(&mut nb, 1));
    let q = alloc_async(d, 64, nb);
    let id = id_at(&emu, q);
    ok!(d, cuMemFreeAsync(q, CU_STREAM_LEGACY));
    assert_eq!(kinds(&hazards_for(&emu, id)), ["unordered_free"]);
}

/// A thread that used its per-thread default stream and stays alive, parked, until
/// [`ParkedThread::finish`], which lets it synchronise that stream and end: a thread must not end
/// with per-thread work pending (docs/driver-facts.md F24), and its exit would let the host see
/// that work complete, which is not what the tests below are about.
struct ParkedThread {
    finish: std::sync::mpsc::Sender<()>,
    thread: std::thread::JoinHandle<()>,
}

impl ParkedThread {
    fn finish(self) {
        let _ = self.finish.send(());
        self.thread.join().expect("the parked thread");
    }
}

/// On a new thread with `ctx` current: `n` allocations of 64 bytes on that thread's per-thread
/// default stream, each filled there; nothing synchronised while the thread stays parked.
fn used_on_another_threads_per_thread_stream(
    ctx: CUcontext,
    n: usize,
) -> (Vec<CUdeviceptr>, ParkedThread) {
    let ctx = ctx as u64;
    let (ptrs_tx, ptrs_rx) = std::sync::mpsc::channel();
    let (finish, finish_rx) = std::sync::mpsc::channel::<()>();
    let thread = std::thread::spawn(move || {
        let d = cuda_sys::driver().unwrap();
        ok!(d, cuCtxSetCurrent(ctx as CUcontext));
        let ptrs: Vec<_> = (0..n)
            .map(|_| {
                let p = alloc_async(d, 64, CU_STREAM_PER_THREAD);
                ok!(d, cuMemsetD8Async(p, 1, 64, CU_STREAM_PER_THREAD));
                p
            })
            .collect();
        ptrs_tx.send(ptrs).unwrap();
        let _ = finish_rx.recv();
        ok!(d, cuStreamSynchronize(CU_STREAM_PER_THREAD));
    });
    let ptrs = ptrs_rx.recv().expect("the thread's allocations");
    (ptrs, ParkedThread { finish, thread })
}

#[test]
fn legacy_free_is_ordered_after_another_threads_per_thread_stream() {
    // docs/driver-facts.md F14: the legacy stream waits for every blocking stream of its
    // context, other threads' per-thread streams included; the checker's clocks agree.
    let (d, emu, ctx) = setup();
    for token in [CU_STREAM_LEGACY, CU_STREAM_NULL] {
        let (ptrs, user) = used_on_another_threads_per_thread_stream(ctx, 1);
        let id = id_at(&emu, ptrs[0]);
        ok!(d, cuMemFreeAsync(ptrs[0], token));
        assert!(hazards_for(&emu, id).is_empty(), "{:?}", emu.hazards());
        user.finish();
    }
    ok!(d, cuCtxSynchronize());
    assert!(emu.hazards().is_empty(), "{:?}", emu.hazards());
}

#[test]
fn other_streams_free_unordered_after_another_threads_per_thread_stream() {
    // docs/driver-facts.md F15: the freeing thread's own per-thread stream, a created blocking
    // stream and a non-blocking one do not wait for another thread's per-thread stream, so a
    // free there is not ordered after its work.
    let (d, emu, ctx) = setup();
    let mut nb: CUstream = std::ptr::null_mut();
    ok!(d, cuStreamCreate(&mut nb, 1));
    let frees = [CU_STREAM_PER_THREAD, stream(d), nb];
    let (ptrs, user) = used_on_another_threads_per_thread_stream(ctx, frees.len());
    for (&p, &s) in ptrs.iter().zip(&frees) {
        let id = id_at(&emu, p);
        ok!(d, cuMemFreeAsync(p, s));
        let hazards = hazards_for(&emu, id);
        assert_eq!(kinds(&hazards), ["unordered_free"], "{s:?}: {hazards:?}");
    }
    user.finish();
    ok!(d, cuCtxSynchronize());
    emu.clear_hazards();
}

/// docs/driver-facts.md F24 in the emulator: a thread that ends with operations on its
/// per-thread stream that no synchronisation has seen complete is reported
/// (`thread_exit_with_pending_per_thread_work`, naming the stream), and its exit lets the host
/// see them complete (a free on another stream after the join is ordered); a thread that
/// synchronised its per-thread stream first is not reported. (That the exit waits for held work
/// is the conformance case `facts_ordering::f24_a_threads_exit_waits_for_its_held_per_thread_work_which_orders_a_legacy_free`.)
#[test]
fn a_thread_that_ends_with_unsynchronised_per_thread_work_is_reported() {
    let (d, emu, ctx) = setup();
    let ctx = ctx as u64;
    let (p, per_thread) = std::thread::spawn(move || {
        let d = cuda_sys::driver().unwrap();
        ok!(d, cuCtxSetCurrent(ctx as CUcontext));
        let p = alloc_async(d, 64, CU_STREAM_PER_THREAD);
        ok!(d, cuMemsetD8Async(p, 1, 64, CU_STREAM_PER_THREAD));
        let emu = Emulator::get().unwrap();
        let fill = emu
            .calls()
            .into_iter()
            .rfind(|c| c.function == "cuMemsetD8Async" && c.ptr == Some(p))
            .expect("the fill's call");
        (p, fill.resolved_stream.expect("resolved"))
    })
    .join()
    .unwrap();
    let hazards = emu.hazards();
    assert_eq!(
        kinds(&hazards),
        ["thread_exit_with_pending_per_thread_work"]
    );
    assert_eq!((hazards[0].ptr, hazards[0].stream), (0, per_thread));
    assert_eq!(hazards[0].function, "thread exit");
    emu.clear_hazards();
    let id = id_at(&emu, p);
    let s = stream(d);
    ok!(d, cuMemFreeAsync(p, s));
    assert!(
        hazards_for(&emu, id).is_empty(),
        "the exit let the host see the fill complete: {:?}",
        emu.hazards()
    );
    ok!(d, cuStreamSynchronize(s));

    std::thread::spawn(move || {
        let d = cuda_sys::driver().unwrap();
        ok!(d, cuCtxSetCurrent(ctx as CUcontext));
        let p = alloc_async(d, 64, CU_STREAM_PER_THREAD);
        ok!(d, cuMemsetD8Async(p, 1, 64, CU_STREAM_PER_THREAD));
        ok!(d, cuMemFreeAsync(p, CU_STREAM_PER_THREAD));
        ok!(d, cuStreamSynchronize(CU_STREAM_PER_THREAD));
    })
    .join()
    .unwrap();
    assert!(emu.hazards().is_empty(), "{:?}", emu.hazards());
}

#[test]
fn stream_memory_operations_refuse_what_they_cannot_do() {
    let (d, emu, _) = setup();
    let s = stream(d);
    let mut host: *mut c_void = std::ptr::null_mut();
    ok!(d, cuMemHostAlloc(&mut host, 64, 2));
    let mut dev: CUdeviceptr = 0;
    ok!(d, cuMemHostGetDevicePointer_v2(&mut dev, host, 0));
    assert_eq!(dev, host as u64, "unified addressing");
    let wait32 = |s: CUstream, p: CUdeviceptr, flags: c_uint| {
        code(cu!(d, cuStreamWaitValue32_v2(s, p, 0, flags)))
    };
    // Unknown flags, an unaligned address, managed memory, memory the driver does not know.
    assert_eq!(wait32(s, dev, 4), CudaErrorCode::INVALID_VALUE);
    assert_eq!(
        code(cu!(d, cuStreamWriteValue32_v2(s, dev, 0, 2))),
        CudaErrorCode::INVALID_VALUE
    );
    assert_eq!(wait32(s, dev + 2, 0), CudaErrorCode::INVALID_VALUE);
    assert_eq!(
        code(cu!(d, cuStreamWaitValue64_v2(s, dev + 4, 0, 0))),
        CudaErrorCode::INVALID_VALUE
    );
    let mut managed: CUdeviceptr = 0;
    ok!(d, cuMemAllocManaged(&mut managed, 64, 1));
    assert_eq!(wait32(s, managed, 0), CudaErrorCode::INVALID_VALUE);
    let pageable = Box::new(0u64);
    assert_eq!(
        wait32(s, &*pageable as *const u64 as u64, 0),
        CudaErrorCode::INVALID_VALUE
    );
    assert_eq!(
        code(cu!(
            d,
            cuMemHostGetDevicePointer_v2(&mut dev, managed as *mut c_void, 0)
        )),
        CudaErrorCode::INVALID_VALUE
    );
    // Capturing them is not emulated: refused, and the capture is invalidated.
    ok!(
        d,
        cuStreamBeginCapture_v2(s, CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED)
    );
    assert_eq!(
        code(cu!(d, cuStreamWriteValue32_v2(s, host as u64, 1, 0))),
        CudaErrorCode::STREAM_CAPTURE_UNSUPPORTED
    );
    let mut g: CUgraph = std::ptr::null_mut();
    assert_eq!(
        code(cu!(d, cuStreamEndCapture(s, &mut g))),
        CudaErrorCode::STREAM_CAPTURE_INVALIDATED
    );
    // A write is a use of its memory: after the free it is a use after free.
    let p = alloc_async(d, 64, s);
    let id = id_at(&emu, p);
    ok!(d, cuStreamWriteValue32_v2(s, p, 9, 0));
    ok!(d, cuMemFreeAsync(p, s));
    assert!(hazards_for(&emu, id).is_empty(), "{:?}", emu.hazards());
    assert_eq!(
        code(cu!(d, cuStreamWriteValue32_v2(s, p, 9, 0))),
        CudaErrorCode::INVALID_VALUE
    );
    assert_eq!(kinds(&hazards_for(&emu, id)), ["use_after_free"]);
    ok!(d, cuStreamSynchronize(s));
    ok!(d, cuMemFree_v2(managed));
    ok!(d, cuMemFreeHost(host));
    emu.clear_hazards();
}

#[test]
fn use_after_free_is_reported() {
    let (d, emu, _) = setup();
    let a = stream(d);
    let p = alloc_async(d, 128, a);
    let id = id_at(&emu, p);
    ok!(d, cuMemFreeAsync(p, a));
    assert_eq!(
        code(cu!(d, cuMemsetD8Async(p, 0, 128, a))),
        CudaErrorCode::INVALID_VALUE
    );
    let hazards = hazards_for(&emu, id);
    assert_eq!(kinds(&hazards), ["use_after_free"], "{hazards:?}");
    assert_eq!(hazards[0].function, "cuMemsetD8Async");
}

#[test]
fn double_free_is_reported() {
    let (d, emu, _) = setup();
    let a = stream(d);
    let p = alloc_async(d, 128, a);
    let id = id_at(&emu, p);
    ok!(d, cuMemFreeAsync(p, a));
    assert_eq!(
        code(cu!(d, cuMemFreeAsync(p, a))),
        CudaErrorCode::INVALID_VALUE
    );
    assert_eq!(kinds(&hazards_for(&emu, id)), ["double_free"]);

    let mut q: CUdeviceptr = 0;
    ok!(d, cuMemAlloc_v2(&mut q, 64));
    let id = id_at(&emu, q);
    ok!(d, cuMemFree_v2(q));
    assert_eq!(code(cu!(d, cuMemFree_v2(q))), CudaErrorCode::INVALID_VALUE);
    assert_eq!(kinds(&hazards_for(&emu, id)), ["double_free"]);
}

#[test]
fn free_on_destroyed_stream_is_reported_not_a_crash() {
    let (d, emu, _) = setup();
    let a = stream(d);
    let p = alloc_async(d, 128, a);
    let id = id_at(&emu, p);
    ok!(d, cuStreamSynchronize(a));
    ok!(d, cuStreamDestroy_v2(a));
    assert_eq!(
        code(cu!(d, cuMemFreeAsync(p, a))),
        CudaErrorCode::INVALID_HANDLE
    );
    let hazards = hazards_for(&emu, id);
    assert_eq!(kinds(&hazards), ["free_on_destroyed_stream"], "{hazards:?}");
    // Nothing was freed: the allocation is still live and frees properly (F13).
    assert!(emu.allocation_is_live(id));
    ok!(d, cuMemFreeAsync(p, CU_STREAM_LEGACY));
    assert!(!emu.allocation_is_live(id));
}

/// A destroyed stream's handle given to a new stream (`custodyEmuReuseStreamHandle`, as a real
/// driver may hand a freed handle out again): the new stream has another `cuStreamGetId` and its
/// own place in the hazard checker's order, so work on it is not taken to follow the old
/// stream's (a free of memory the old stream used is `unordered_free`) unless something orders
/// it; a handle that is not a destroyed stream's is refused.
#[test]
fn a_destroyed_streams_handle_given_to_a_new_stream_names_another_stream() {
    let (d, emu, _) = setup();
    let old = stream(d);
    let mut old_id = 0u64;
    ok!(d, cuStreamGetId(old, &mut old_id));
    let p = alloc_async(d, 256, old);
    let id = id_at(&emu, p);
    ok!(d, cuMemsetD8Async(p, 7, 256, old));
    assert!(
        !emu.reuse_stream_handle(old as u64),
        "a live stream's handle"
    );
    ok!(d, cuStreamDestroy_v2(old));
    assert!(emu.reuse_stream_handle(old as u64));
    let new = stream(d);
    assert_eq!(new, old, "the destroyed stream's handle came back");
    let mut new_id = 0u64;
    ok!(d, cuStreamGetId(new, &mut new_id));
    assert_ne!(new_id, old_id, "another stream");
    // More work on the new stream than the old one ever had: a clock that took the handle for
    // the stream would now place the free after the old stream's fill.
    let q = alloc_async(d, 256, new);
    for _ in 0..4 {
        ok!(d, cuMemsetD8Async(q, 1, 256, new));
    }
    ok!(d, cuMemFreeAsync(q, new));
    ok!(d, cuMemFreeAsync(p, new));
    let hazards = hazards_for(&emu, id);
    assert_eq!(kinds(&hazards), ["unordered_free"], "{hazards:?}");
    // No free-on-destroyed-stream: the handle names a live stream again.
    assert!(!emu.reuse_stream_handle(new as u64), "live again");
    let next = stream(d);
    assert_ne!(next, new, "one reuse per request");
    ok!(d, cuStreamSynchronize(new));
    for s in [new, next] {
        ok!(d, cuStreamDestroy_v2(s));
    }
    emu.clear_hazards();
}

#[test]
fn pools_hand_a_freed_address_out_again_in_stream_order() {
    let (d, emu, _) = setup();
    let (a, b) = (stream(d), stream(d));
    // Same stream: the next allocation of the same size comes after the free and gets its
    // address, as a new allocation (docs/driver-facts.md F18).
    let p = alloc_async(d, 64, a);
    let first = id_at(&emu, p);
    ok!(d, cuMemFreeAsync(p, a));
    let q = alloc_async(d, 64, a);
    assert_eq!(q, p, "the freed address came back on the same stream");
    let second = id_at(&emu, q);
    assert_ne!(second, first, "a new allocation at the old address");
    assert!(!emu.allocation_is_live(first));
    let buffer_id = |ptr| {
        let mut id: u64 = 0;
        ok!(
            d,
            cuPointerGetAttribute(
                (&mut id as *mut u64).cast(),
                CUpointer_attribute::CU_POINTER_ATTRIBUTE_BUFFER_ID,
                ptr
            )
        );
        id
    };
    assert_eq!(buffer_id(q), second.0);

    // Another stream, not ordered after the free: a fresh address.
    ok!(d, cuMemFreeAsync(q, a));
    let r = alloc_async(d, 64, b);
    assert_ne!(r, q, "stream b is not ordered after the free on a");
    // Once the host has waited for stream a, every stream is ordered after its free.
    ok!(d, cuStreamSynchronize(a));
    let t = alloc_async(d, 64, b);
    assert_eq!(t, q, "ordered after the free by host synchronisation");
    // An event orders a stream after a free on another.
    ok!(d, cuMemFreeAsync(t, b));
    let e = event(d);
    ok!(d, cuEventRecord(e, b));
    ok!(d, cuStreamWaitEvent(a, e, 0));
    let u = alloc_async(d, 64, a);
    assert_eq!(u, t, "ordered after the free on b by the event");
    // A different size does not take the block.
    ok!(d, cuMemFreeAsync(u, a));
    let big = alloc_async(d, 4096, a);
    assert_ne!(big, u);
    for x in [r, big] {
        ok!(d, cuMemFreeAsync(x, a));
    }
    ok!(d, cuStreamSynchronize(a));
    ok!(d, cuStreamSynchronize(b));
    assert!(emu.hazards().is_empty(), "{:?}", emu.hazards());
}

#[test]
fn hazards_name_the_allocation_not_just_the_address() {
    let (d, emu, _) = setup();
    let (a, b) = (stream(d), stream(d));
    let p = alloc_async(d, 64, a);
    let first = id_at(&emu, p);
    ok!(d, cuMemFreeAsync(p, a));
    let q = alloc_async(d, 64, a);
    assert_eq!(q, p);
    let second = id_at(&emu, q);
    // A use on b (after the allocation: a synchronised), then a free on a that is not ordered
    // after it: the hazard is the second allocation's, although the first had the same address.
    ok!(d, cuStreamSynchronize(a));
    ok!(d, cuMemsetD8Async(q, 1, 64, b));
    ok!(d, cuMemFreeAsync(q, a));
    assert_eq!(
        code(cu!(d, cuMemFreeAsync(q, a))),
        CudaErrorCode::INVALID_VALUE
    );
    let at_the_address: Vec<Hazard> = emu.hazards().into_iter().filter(|h| h.ptr == q).collect();
    assert_eq!(
        kinds(&at_the_address),
        ["unordered_free", "double_free"],
        "{at_the_address:?}"
    );
    assert_eq!(at_the_address, hazards_for(&emu, second));
    assert!(hazards_for(&emu, first).is_empty());
    // The call log says which allocation each call made or freed.
    let calls = emu.calls();
    let made: Vec<_> = calls
        .iter()
        .filter(|c| c.function == "cuMemAllocAsync" && c.thread == emu.thread_id())
        .filter_map(|c| c.alloc)
        .collect();
    assert!(made.ends_with(&[first, second]), "{made:?}");
    let frees: Vec<_> = calls
        .iter()
        .filter(|c| c.function == "cuMemFreeAsync" && c.ptr == Some(p))
        .map(|c| (c.alloc, c.result))
        .collect();
    assert_eq!(
        frees,
        [(Some(first), 0), (Some(second), 0), (None, 1)],
        "the third free found no live allocation"
    );
    ok!(d, cuStreamSynchronize(a));
    ok!(d, cuStreamSynchronize(b));
}

#[test]
fn a_graph_node_of_a_freed_allocation_is_a_use_after_free_even_at_a_reused_address() {
    let (d, emu, _) = setup();
    let a = stream(d);
    let p = alloc_async(d, 64, a);
    let first = id_at(&emu, p);
    let mut g: CUgraph = std::ptr::null_mut();
    ok!(d, cuGraphCreate(&mut g, 0));
    let set = CUDA_MEMSET_NODE_PARAMS {
        dst: p,
        pitch: 0,
        value: 0x77,
        elementSize: 1,
        width: 64,
        height: 1,
    };
    let mut node: CUgraphNode = std::ptr::null_mut();
    ok!(
        d,
        cuGraphAddMemsetNode(
            &mut node,
            g,
            std::ptr::null(),
            0,
            &set,
            std::ptr::null_mut()
        )
    );
    let mut exec: CUgraphExec = std::ptr::null_mut();
    ok!(d, cuGraphInstantiateWithFlags(&mut exec, g, 0));
    ok!(d, cuMemFreeAsync(p, a));
    let q = alloc_async(d, 64, a);
    assert_eq!(q, p, "the pool handed the address out again");
    ok!(d, cuMemsetD8Async(q, 0x11, 64, a));
    // The node was made for the first allocation: touching the second is a use after free.
    ok!(d, cuGraphLaunch(exec, a));
    ok!(d, cuStreamSynchronize(a));
    let hazards = hazards_for(&emu, first);
    assert_eq!(kinds(&hazards), ["use_after_free"], "{hazards:?}");
    assert_eq!(
        (hazards[0].ptr, hazards[0].function.as_str()),
        (p, "cuGraphLaunch")
    );
    assert!(hazards_for(&emu, id_at(&emu, q)).is_empty());
    let mut out = [0u8; 64];
    ok!(d, cuMemcpyDtoH_v2(out.as_mut_ptr().cast(), q, 64));
    assert_eq!(out, [0x11; 64], "the emulator skipped the stale node");
    ok!(d, cuGraphExecDestroy(exec));
    ok!(d, cuGraphDestroy(g));
    ok!(d, cuMemFreeAsync(q, a));
    ok!(d, cuStreamSynchronize(a));
}

#[test]
fn fault_injection_fails_the_chosen_call_once() {
    let (d, emu, _) = setup();
    assert!(emu.inject_fault("cuMemAlloc_v2", 2, CudaErrorCode::OUT_OF_MEMORY));
    assert!(!emu.inject_fault("cuNoSuchFunction", 1, CudaErrorCode::UNKNOWN));
    let mut p: CUdeviceptr = 0;
    ok!(d, cuMemAlloc_v2(&mut p, 64));
    let mut q: CUdeviceptr = 0xdead;
    assert_eq!(
        code(cu!(d, cuMemAlloc_v2(&mut q, 64))),
        CudaErrorCode::OUT_OF_MEMORY
    );
    assert_eq!(q, 0xdead, "a failed call has no effect");
    ok!(d, cuMemAlloc_v2(&mut q, 64));
    assert_ne!(q, p);
    ok!(d, cuMemFree_v2(p));
    ok!(d, cuMemFree_v2(q));
    let failed: Vec<_> = emu
        .calls()
        .into_iter()
        .filter(|c| c.function == "cuMemAlloc_v2" && c.thread == emu.thread_id())
        .map(|c| c.result)
        .collect();
    assert_eq!(failed, [0, 2, 0]);
}

#[test]
fn call_log_records_thread_context_and_stream() {
    let (d, emu, ctx) = setup();
    let p = alloc_async(d, 64, CU_STREAM_LEGACY);
    ok!(d, cuMemFreeAsync(p, CU_STREAM_LEGACY));
    let me = emu.thread_id();
    let other = std::thread::spawn(move || {
        let d = cuda_sys::driver().unwrap();
        let emu = Emulator::get().unwrap();
        // F1: no context current on this thread.
        assert_eq!(
            code(cu!(d, cuMemFreeAsync(p, CU_STREAM_PER_THREAD))),
            CudaErrorCode::INVALID_CONTEXT
        );
        emu.thread_id()
    })
    .join()
    .unwrap();
    assert_ne!(me, other);
    let frees: Vec<_> = emu
        .calls()
        .into_iter()
        .filter(|c| c.function == "cuMemFreeAsync" && c.ptr == Some(p))
        .collect();
    assert_eq!(frees.len(), 2, "{frees:?}");
    assert_eq!(frees[0].thread, me);
    assert_eq!(frees[0].context, ctx as u64);
    assert_eq!(frees[0].stream, Some(1));
    let legacy = frees[0].resolved_stream.expect("resolved");
    assert!(
        legacy > 2,
        "the token resolves to the context's legacy stream"
    );
    assert_eq!(frees[0].result, 0);
    assert_eq!(frees[1].thread, other);
    assert_eq!(frees[1].context, 0);
    assert_eq!(frees[1].stream, Some(2));
    assert_eq!(frees[1].resolved_stream, None);
    assert_eq!(frees[1].result, 201);
    assert!(frees[0].seq < frees[1].seq);
}

#[test]
fn bad_input_returns_codes_and_does_not_crash() {
    let (d, emu, _) = setup();
    // Null out-pointers.
    assert_eq!(
        code(cu!(d, cuStreamCreate(std::ptr::null_mut(), 0))),
        CudaErrorCode::INVALID_VALUE
    );
    assert_eq!(
        code(cu!(d, cuEventCreate(std::ptr::null_mut(), 0))),
        CudaErrorCode::INVALID_VALUE
    );
    assert_eq!(
        code(cu!(d, cuCtxGetCurrent(std::ptr::null_mut()))),
        CudaErrorCode::INVALID_VALUE
    );
    assert_eq!(
        code(cu!(d, cuMemAlloc_v2(std::ptr::null_mut(), 16))),
        CudaErrorCode::INVALID_VALUE
    );
    assert_eq!(
        code(cu!(d, cuDeviceGetCount(std::ptr::null_mut()))),
        CudaErrorCode::INVALID_VALUE
    );
    assert_eq!(
        code(cu!(d, cuGraphCreate(std::ptr::null_mut(), 0))),
        CudaErrorCode::INVALID_VALUE
    );
    assert_eq!(
        code(cu!(
            d,
            cuStreamGetCtx(CU_STREAM_LEGACY, std::ptr::null_mut())
        )),
        CudaErrorCode::INVALID_VALUE
    );
    // Unknown handles.
    let bogus = 0x1234_5678_9a00usize;
    assert_eq!(
        code(cu!(d, cuStreamSynchronize(bogus as CUstream))),
        CudaErrorCode::INVALID_HANDLE
    );
    assert_eq!(
        code(cu!(d, cuEventQuery(bogus as CUevent))),
        CudaErrorCode::INVALID_HANDLE
    );
    assert_eq!(
        code(cu!(d, cuGraphDestroy(bogus as CUgraph))),
        CudaErrorCode::INVALID_HANDLE
    );
    assert_eq!(
        code(cu!(d, cuGraphExecDestroy(bogus as CUgraphExec))),
        CudaErrorCode::INVALID_HANDLE
    );
    assert_eq!(
        code(cu!(d, cuMemPoolTrimTo(bogus as CUmemoryPool, 0))),
        CudaErrorCode::INVALID_HANDLE
    );
    assert_eq!(
        code(cu!(d, cuUserObjectRelease(bogus as CUuserObject, 1))),
        CudaErrorCode::INVALID_HANDLE
    );
    assert_eq!(
        code(cu!(d, cuCtxPushCurrent_v2(bogus as CUcontext))),
        CudaErrorCode::INVALID_CONTEXT
    );
    assert_eq!(
        code(cu!(d, cuCtxDestroy_v2(bogus as CUcontext))),
        CudaErrorCode::INVALID_CONTEXT
    );
    assert_eq!(
        code(cu!(d, cuDeviceGet(null_dev(), 99))),
        CudaErrorCode::INVALID_VALUE
    );
    let mut dev: CUdevice = 0;
    assert_eq!(
        code(cu!(d, cuDeviceGet(&mut dev, 99))),
        CudaErrorCode::INVALID_DEVICE
    );
    // Destroyed handles.
    let s = stream(d);
    ok!(d, cuStreamDestroy_v2(s));
    assert_eq!(
        code(cu!(d, cuStreamSynchronize(s))),
        CudaErrorCode::INVALID_HANDLE
    );
    assert_eq!(
        code(cu!(d, cuStreamDestroy_v2(s))),
        CudaErrorCode::INVALID_HANDLE
    );
    let e = event(d);
    ok!(d, cuEventDestroy_v2(e));
    assert_eq!(
        code(cu!(d, cuEventRecord(e, CU_STREAM_LEGACY))),
        CudaErrorCode::INVALID_HANDLE
    );
    let mut g: CUgraph = std::ptr::null_mut();
    ok!(d, cuGraphCreate(&mut g, 0));
    ok!(d, cuGraphDestroy(g));
    assert_eq!(
        code(cu!(d, cuGraphDestroy(g))),
        CudaErrorCode::INVALID_HANDLE
    );
    let mut ctx: CUcontext = std::ptr::null_mut();
    ok!(d, cuCtxCreate_v2(&mut ctx, 0, 0));
    ok!(d, cuCtxDestroy_v2(ctx));
    assert_eq!(
        code(cu!(d, cuCtxSetCurrent(ctx))),
        CudaErrorCode::INVALID_CONTEXT
    );
    // Pointers.
    assert_eq!(
        code(cu!(d, cuMemFree_v2(0x42))),
        CudaErrorCode::INVALID_VALUE
    );
    let mut p: CUdeviceptr = 0;
    assert_eq!(
        code(cu!(d, cuMemAlloc_v2(&mut p, 0))),
        CudaErrorCode::INVALID_VALUE
    );
    ok!(d, cuMemAlloc_v2(&mut p, 16));
    assert_eq!(
        code(cu!(d, cuMemsetD32_v2(p, 0, 5))),
        CudaErrorCode::INVALID_VALUE,
        "5 elements of 4 bytes overrun 16 bytes"
    );
    ok!(d, cuMemsetD32_v2(p, 0, 4));
    ok!(d, cuMemFree_v2(p));
    // Nothing above was a hazard except the frees of unknown pointers.
    assert!(
        emu.hazards().iter().all(|h| h.kind == "double_free"),
        "{:?}",
        emu.hazards()
    );
}

fn null_dev() -> *mut CUdevice {
    std::ptr::null_mut()
}

#[test]
fn no_context_tokens_fail_and_created_streams_work() {
    let (d, _, ctx) = setup();
    let s = stream(d);
    let p = alloc_async(d, 64, s);
    ok!(d, cuStreamSynchronize(s));
    let (s_raw, ctx_raw) = (s as u64, ctx as u64);
    std::thread::spawn(move || {
        let d = cuda_sys::driver().unwrap();
        for token in [CU_STREAM_NULL, CU_STREAM_LEGACY, CU_STREAM_PER_THREAD] {
            assert_eq!(
                code(cu!(d, cuMemFreeAsync(p, token))),
                CudaErrorCode::INVALID_CONTEXT
            );
        }
        let mut got: CUcontext = std::ptr::null_mut();
        ok!(d, cuStreamGetCtx(s_raw as CUstream, &mut got));
        assert_eq!(got as u64, ctx_raw);
        ok!(d, cuMemFreeAsync(p, s_raw as CUstream));
        ok!(d, cuStreamSynchronize(s_raw as CUstream));
    })
    .join()
    .unwrap();
}

#[test]
fn live_allocation_query_lists_each_kind() {
    let (d, emu, _) = setup();
    let mut dev: CUdeviceptr = 0;
    ok!(d, cuMemAlloc_v2(&mut dev, 100));
    let mut host: *mut c_void = std::ptr::null_mut();
    ok!(d, cuMemAllocHost_v2(&mut host, 200));
    let mut managed: CUdeviceptr = 0;
    ok!(d, cuMemAllocManaged(&mut managed, 300, 1));
    let pooled = alloc_async(d, 400, CU_STREAM_LEGACY);
    let mut pool: CUmemoryPool = std::ptr::null_mut();
    ok!(d, cuDeviceGetMemPool(&mut pool, 0));

    let live = emu.live_allocations();
    let find = |p: u64| live.iter().find(|a| a.ptr == p).cloned().expect("listed");
    let a = find(dev);
    assert_eq!(
        (a.size, a.kind.as_str(), a.device, a.pool),
        (100, "device", 0, None)
    );
    let a = find(host as u64);
    assert_eq!((a.size, a.kind.as_str(), a.device), (200, "host", -1));
    let a = find(managed);
    assert_eq!((a.size, a.kind.as_str(), a.device), (300, "managed", 0));
    let a = find(pooled);
    assert_eq!(
        (a.size, a.kind.as_str(), a.device, a.pool),
        (400, "pool", 0, Some(pool as u64))
    );

    // Host and managed memory are host-accessible bytes.
    // SAFETY: both are live allocations of at least 200 bytes.
    unsafe {
        std::ptr::write_bytes(host.cast::<u8>(), 9, 200);
        std::ptr::write_bytes(managed as *mut u8, 3, 300);
    }
    ok!(d, cuMemcpy(dev, host as u64, 100));
    let mut back = [0u8; 100];
    ok!(d, cuMemcpyDtoH_v2(back.as_mut_ptr().cast(), dev, 100));
    assert_eq!(back, [9u8; 100]);

    ok!(d, cuMemFree_v2(dev));
    ok!(d, cuMemFreeHost(host));
    ok!(d, cuMemFree_v2(managed));
    ok!(d, cuMemFreeAsync(pooled, CU_STREAM_LEGACY));
    let live = emu.live_allocations();
    for p in [dev, host as u64, managed, pooled] {
        assert!(!live.iter().any(|a| a.ptr == p), "{p:#x} still listed");
    }
}

#[test]
fn memory_bytes_round_trip_through_fills_and_copies() {
    let (d, _, _) = setup();
    let s = stream(d);
    let p = alloc_async(d, 64, s);
    let q = alloc_async(d, 64, s);
    ok!(d, cuMemsetD16Async(p, 0xabcd, 32, s));
    ok!(d, cuMemcpyAsync(q, p, 64, s));
    ok!(d, cuMemsetD32Async(q, 0x0102_0304, 2, s));
    let mut out = [0u16; 32];
    ok!(d, cuStreamSynchronize(s));
    ok!(d, cuMemcpyDtoH_v2(out.as_mut_ptr().cast(), q, 64));
    assert_eq!(out[..4], [0x0304, 0x0102, 0x0304, 0x0102]);
    assert!(out[4..].iter().all(|&x| x == 0xabcd));
    let input: Vec<u8> = (0..64).collect();
    ok!(d, cuMemcpyHtoD_v2(p, input.as_ptr().cast(), 64));
    let mut back = vec![0u8; 64];
    ok!(d, cuMemcpyDtoH_v2(back.as_mut_ptr().cast(), p, 64));
    assert_eq!(back, input);
    ok!(d, cuMemFreeAsync(p, s));
    ok!(d, cuMemFreeAsync(q, s));
    ok!(d, cuStreamSynchronize(s));
}

struct Gate {
    open: AtomicBool,
    status_inside: AtomicU64,
}

static GATE: Gate = Gate {
    open: AtomicBool::new(false),
    status_inside: AtomicU64::new(u64::MAX),
};

/// A host function that blocks until the gate opens and tries a driver call.
unsafe extern "C" fn wait_for_gate(_: *mut c_void) {
    while !GATE.open.load(Ordering::SeqCst) {
        std::thread::yield_now();
    }
    let d = cuda_sys::driver().unwrap();
    let mut n: c_int = 0;
    let status = cu!(d, cuDeviceGetCount(&mut n));
    GATE.status_inside
        .store(u64::from(status), Ordering::SeqCst);
}

static DESTROYED: AtomicU64 = AtomicU64::new(0);
static DESTROYED_ON: std::sync::Mutex<Option<std::thread::ThreadId>> = std::sync::Mutex::new(None);

unsafe extern "C" fn destructor(_: *mut c_void) {
    *DESTROYED_ON.lock().unwrap() = Some(std::thread::current().id());
    DESTROYED.fetch_add(1, Ordering::SeqCst);
}

unsafe extern "C" fn count_host_node(data: *mut c_void) {
    // SAFETY: the test passes a pointer to a live AtomicU64.
    unsafe { &*data.cast::<AtomicU64>() }.fetch_add(1, Ordering::SeqCst);
}

/// One test for everything that uses the gate and the destructor counter, so that tests
/// sharing a process never share them.
#[test]
fn host_functions_graphs_and_user_object_destructor_timing() {
    let (d, _, _) = setup();
    let s = stream(d);

    // A blocked host function keeps the stream pending; driver calls inside it are refused.
    GATE.open.store(false, Ordering::SeqCst);
    ok!(
        d,
        cuLaunchHostFunc(s, Some(wait_for_gate), std::ptr::null_mut())
    );
    assert_eq!(code(cu!(d, cuStreamQuery(s))), CudaErrorCode::NOT_READY);

    // G3: a graph holding a user object, launched behind the blocked host function, its exec
    // destroyed at once: the destructor waits for the launch.
    let mut g: CUgraph = std::ptr::null_mut();
    ok!(d, cuGraphCreate(&mut g, 0));
    let mut uo: CUuserObject = std::ptr::null_mut();
    DESTROYED.store(0, Ordering::SeqCst);
    ok!(
        d,
        cuUserObjectCreate(&mut uo, std::ptr::null_mut(), Some(destructor), 1, 1)
    );
    ok!(d, cuGraphRetainUserObject(g, uo, 1, 1));
    let counter = AtomicU64::new(0);
    let params = CUDA_HOST_NODE_PARAMS {
        fn_: Some(count_host_node),
        userData: (&counter as *const AtomicU64).cast_mut().cast(),
    };
    let mut node: CUgraphNode = std::ptr::null_mut();
    ok!(
        d,
        cuGraphAddHostNode(&mut node, g, std::ptr::null(), 0, &params)
    );
    let mut exec: CUgraphExec = std::ptr::null_mut();
    ok!(d, cuGraphInstantiateWithFlags(&mut exec, g, 0));
    ok!(d, cuGraphDestroy(g));
    assert_eq!(
        DESTROYED.load(Ordering::SeqCst),
        0,
        "G1: the exec holds a reference"
    );
    ok!(d, cuGraphLaunch(exec, s));
    ok!(d, cuGraphExecDestroy(exec));
    assert_eq!(
        DESTROYED.load(Ordering::SeqCst),
        0,
        "G3: a launch is pending"
    );
    GATE.open.store(true, Ordering::SeqCst);
    ok!(d, cuStreamSynchronize(s));
    assert_eq!(counter.load(Ordering::SeqCst), 1);
    assert_eq!(DESTROYED.load(Ordering::SeqCst), 1);
    assert_ne!(
        *DESTROYED_ON.lock().unwrap(),
        Some(std::thread::current().id()),
        "ran on a driver thread"
    );
    assert_eq!(
        GATE.status_inside.load(Ordering::SeqCst),
        u64::from(CudaErrorCode::NOT_PERMITTED.0)
    );

    // G2: no launch pending: the destructor runs inside cuGraphExecDestroy, on this thread.
    ok!(d, cuGraphCreate(&mut g, 0));
    ok!(
        d,
        cuUserObjectCreate(&mut uo, std::ptr::null_mut(), Some(destructor), 1, 1)
    );
    ok!(d, cuGraphRetainUserObject(g, uo, 1, 1));
    ok!(d, cuGraphInstantiateWithFlags(&mut exec, g, 0));
    ok!(d, cuGraphDestroy(g));
    ok!(d, cuGraphLaunch(exec, s));
    ok!(d, cuStreamSynchronize(s));
    assert_eq!(DESTROYED.load(Ordering::SeqCst), 1);
    ok!(d, cuGraphExecDestroy(exec));
    assert_eq!(DESTROYED.load(Ordering::SeqCst), 2);
    assert_eq!(
        *DESTROYED_ON.lock().unwrap(),
        Some(std::thread::current().id())
    );
    assert_eq!(
        code(cu!(d, cuUserObjectRelease(uo, 1))),
        CudaErrorCode::INVALID_HANDLE
    );
}

#[test]
fn graph_nodes_and_stream_capture_run_real_bytes() {
    let (d, emu, _) = setup();
    let s = stream(d);
    let mut src: CUdeviceptr = 0;
    let mut dst: CUdeviceptr = 0;
    ok!(d, cuMemAlloc_v2(&mut src, 32));
    ok!(d, cuMemAlloc_v2(&mut dst, 32));

    // A built graph: memset then a 1-D copy.
    let mut g: CUgraph = std::ptr::null_mut();
    ok!(d, cuGraphCreate(&mut g, 0));
    let set = CUDA_MEMSET_NODE_PARAMS {
        dst: src,
        pitch: 0,
        value: 0x5a,
        elementSize: 1,
        width: 32,
        height: 1,
    };
    let mut n1: CUgraphNode = std::ptr::null_mut();
    ok!(
        d,
        cuGraphAddMemsetNode(&mut n1, g, std::ptr::null(), 0, &set, std::ptr::null_mut())
    );
    let null: *mut c_void = std::ptr::null_mut();
    let copy = CUDA_MEMCPY3D {
        srcXInBytes: 0,
        srcY: 0,
        srcZ: 0,
        srcLOD: 0,
        srcMemoryType: CUmemorytype::CU_MEMORYTYPE_DEVICE,
        srcHost: std::ptr::null(),
        srcDevice: src,
        srcArray: null.cast(),
        reserved0: null,
        srcPitch: 0,
        srcHeight: 0,
        dstXInBytes: 0,
        dstY: 0,
        dstZ: 0,
        dstLOD: 0,
        dstMemoryType: CUmemorytype::CU_MEMORYTYPE_DEVICE,
        dstHost: null,
        dstDevice: dst,
        dstArray: null.cast(),
        reserved1: null,
        dstPitch: 0,
        dstHeight: 0,
        WidthInBytes: 32,
        Height: 1,
        Depth: 1,
    };
    let mut n2: CUgraphNode = std::ptr::null_mut();
    ok!(
        d,
        cuGraphAddMemcpyNode(&mut n2, g, &n1, 1, &copy, std::ptr::null_mut())
    );
    let mut clone: CUgraph = std::ptr::null_mut();
    ok!(d, cuGraphClone(&mut clone, g));
    let mut exec: CUgraphExec = std::ptr::null_mut();
    ok!(d, cuGraphInstantiateWithFlags(&mut exec, clone, 0));
    ok!(d, cuGraphLaunch(exec, s));
    ok!(d, cuStreamSynchronize(s));
    let mut out = [0u8; 32];
    ok!(d, cuMemcpyDtoH_v2(out.as_mut_ptr().cast(), dst, 32));
    assert_eq!(out, [0x5a; 32]);
    ok!(d, cuGraphExecDestroy(exec));
    ok!(d, cuGraphDestroy(clone));
    ok!(d, cuGraphDestroy(g));

    // A captured graph: a stream-ordered allocation, a fill, a copy out, a free.
    ok!(
        d,
        cuStreamBeginCapture_v2(s, CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_GLOBAL)
    );
    let mut status = CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
    ok!(d, cuStreamIsCapturing(s, &mut status));
    assert_eq!(
        status,
        CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_ACTIVE
    );
    let p = alloc_async(d, 32, s);
    ok!(d, cuMemsetD8Async(p, 0x33, 32, s));
    ok!(d, cuMemcpyAsync(dst, p, 32, s));
    ok!(d, cuMemFreeAsync(p, s));
    // A synchronous allocation is not allowed during a global capture, and invalidates it.
    let mut bad: CUdeviceptr = 0;
    ok!(d, cuStreamEndCapture(s, &mut g));
    assert!(!g.is_null());
    assert!(
        !emu.live_allocations().iter().any(|a| a.ptr == p),
        "captured work did not run"
    );
    ok!(d, cuGraphInstantiateWithFlags(&mut exec, g, 0));
    ok!(d, cuGraphLaunch(exec, s));
    ok!(d, cuStreamSynchronize(s));
    ok!(d, cuMemcpyDtoH_v2(out.as_mut_ptr().cast(), dst, 32));
    assert_eq!(out, [0x33; 32]);
    assert!(
        !emu.live_allocations().iter().any(|a| a.ptr == p),
        "the graph freed its allocation"
    );
    ok!(d, cuGraphLaunch(exec, s)); // relaunch: same address, allocated and freed again
    ok!(d, cuStreamSynchronize(s));
    ok!(d, cuGraphExecDestroy(exec));
    ok!(d, cuGraphDestroy(g));

    ok!(
        d,
        cuStreamBeginCapture_v2(s, CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_GLOBAL)
    );
    assert_eq!(
        code(cu!(d, cuMemAlloc_v2(&mut bad, 16))),
        CudaErrorCode::STREAM_CAPTURE_UNSUPPORTED
    );
    assert_eq!(
        code(cu!(d, cuMemsetD8Async(dst, 0, 32, s))),
        CudaErrorCode::STREAM_CAPTURE_INVALIDATED
    );
    assert_eq!(
        code(cu!(d, cuStreamEndCapture(s, &mut g))),
        CudaErrorCode::STREAM_CAPTURE_INVALIDATED
    );
    assert!(g.is_null());
    ok!(d, cuMemFree_v2(src));
    ok!(d, cuMemFree_v2(dst));
    assert!(emu.hazards().is_empty(), "{:?}", emu.hazards());
}

#[test]
fn pools_account_used_and_reserved_memory() {
    let (d, _, _) = setup();
    let mut pool: CUmemoryPool = std::ptr::null_mut();
    // SAFETY: CUmemPoolProps is plain data; all-zero is a valid starting point.
    let mut props: CUmemPoolProps = unsafe { std::mem::zeroed() };
    props.allocType = CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
    props.location.type_ = CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
    props.location.id = 1;
    ok!(d, cuMemPoolCreate(&mut pool, &props));
    let attr = |a: MemPoolAttribute| {
        let mut v: u64 = 0;
        ok!(
            d,
            cuMemPoolGetAttribute(pool, a, (&mut v as *mut u64).cast())
        );
        v
    };
    let s = stream(d);
    let mut p: CUdeviceptr = 0;
    ok!(d, cuMemAllocFromPoolAsync(&mut p, 1000, pool, s));
    assert_eq!(
        attr(MemPoolAttribute::CU_MEMPOOL_ATTR_USED_MEM_CURRENT),
        1000
    );
    assert!(attr(MemPoolAttribute::CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT) >= 1000);
    let mut v: CUmemoryPool = std::ptr::null_mut();
    ok!(
        d,
        cuPointerGetAttribute(
            (&mut v as *mut CUmemoryPool).cast(),
            CUpointer_attribute::CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE,
            p
        )
    );
    assert_eq!(v, pool);
    let mut ordinal: c_int = -7;
    ok!(
        d,
        cuPointerGetAttribute(
            (&mut ordinal as *mut c_int).cast(),
            CUpointer_attribute::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
            p
        )
    );
    assert_eq!(ordinal, 1);
    ok!(d, cuMemFreeAsync(p, s));
    ok!(d, cuStreamSynchronize(s));
    assert_eq!(attr(MemPoolAttribute::CU_MEMPOOL_ATTR_USED_MEM_CURRENT), 0);
    assert_eq!(attr(MemPoolAttribute::CU_MEMPOOL_ATTR_USED_MEM_HIGH), 1000);
    ok!(d, cuMemPoolTrimTo(pool, 0));
    assert_eq!(
        attr(MemPoolAttribute::CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT),
        0
    );
    ok!(d, cuMemPoolDestroy(pool));
    assert_eq!(
        code(cu!(d, cuMemAllocFromPoolAsync(&mut p, 8, pool, s))),
        CudaErrorCode::INVALID_HANDLE
    );
}

const IPC_CHILD: &str = "CUSTODY_EMU_TEST_IPC_CHILD";

#[test]
fn pool_ipc_round_trip_between_two_processes() {
    if let Ok(spec) = std::env::var(IPC_CHILD) {
        return ipc_child(&spec);
    }
    let (d, _, _) = setup();
    let mut pool: CUmemoryPool = std::ptr::null_mut();
    // SAFETY: CUmemPoolProps is plain data; all-zero is a valid starting point.
    let mut props: CUmemPoolProps = unsafe { std::mem::zeroed() };
    props.allocType = CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
    props.handleTypes = CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    props.location.type_ = CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
    props.location.id = 0;
    ok!(d, cuMemPoolCreate(&mut pool, &props));
    let mut fd: c_int = -1;
    ok!(
        d,
        cuMemPoolExportToShareableHandle(
            (&mut fd as *mut c_int).cast(),
            pool,
            CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
            0
        )
    );
    assert!(fd >= 0);
    let mut p: CUdeviceptr = 0;
    ok!(
        d,
        cuMemAllocFromPoolAsync(&mut p, 4096, pool, CU_STREAM_LEGACY)
    );
    let bytes: Vec<u8> = (0..4096u32).map(|i| (i * 7 % 251) as u8).collect();
    ok!(d, cuMemcpyHtoD_v2(p, bytes.as_ptr().cast(), bytes.len()));
    // SAFETY: CUmemPoolPtrExportData is 64 plain bytes.
    let mut share: CUmemPoolPtrExportData = unsafe { std::mem::zeroed() };
    ok!(d, cuMemPoolExportPointer(&mut share, p));
    let share_hex: String = share.reserved.iter().map(|b| format!("{b:02x}")).collect();
    let spec = format!("/proc/{}/fd/{fd} {share_hex}", std::process::id());
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "pool_ipc_round_trip_between_two_processes",
            "--exact",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(IPC_CHILD, spec)
        .output()
        .expect("the test binary runs as a child");
    assert!(
        out.status.success(),
        "child failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("child read 4096 bytes"));
    // The child wrote its answer into the shared allocation.
    let mut first = [0u8; 4];
    ok!(d, cuMemcpyDtoH_v2(first.as_mut_ptr().cast(), p, 4));
    assert_eq!(first, *b"kid!");
    ok!(d, cuMemFreeAsync(p, CU_STREAM_LEGACY));
    ok!(d, cuStreamSynchronize(CU_STREAM_LEGACY));
    ok!(d, cuMemPoolDestroy(pool));
}

fn ipc_child(spec: &str) {
    use std::os::fd::AsRawFd;
    let (d, emu, _) = setup();
    let (path, hex) = spec.split_once(' ').expect("spec");
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .expect("the parent's pool fd");
    let mut pool: CUmemoryPool = std::ptr::null_mut();
    ok!(
        d,
        cuMemPoolImportFromShareableHandle(
            &mut pool,
            file.as_raw_fd() as usize as *mut c_void,
            CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
            0
        )
    );
    // SAFETY: CUmemPoolPtrExportData is 64 plain bytes.
    let mut share: CUmemPoolPtrExportData = unsafe { std::mem::zeroed() };
    for (i, b) in share.reserved.iter_mut().enumerate() {
        *b = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).unwrap();
    }
    let mut p: CUdeviceptr = 0;
    ok!(d, cuMemPoolImportPointer(&mut p, pool, &mut share));
    assert!(emu
        .live_allocations()
        .iter()
        .any(|a| a.ptr == p && a.kind == "ipc"));
    let mut got = vec![0u8; 4096];
    ok!(d, cuMemcpyDtoH_v2(got.as_mut_ptr().cast(), p, 4096));
    let want: Vec<u8> = (0..4096u32).map(|i| (i * 7 % 251) as u8).collect();
    assert_eq!(got, want);
    ok!(d, cuMemcpyHtoD_v2(p, b"kid!".as_ptr().cast(), 4));
    // A second import of the same pointer is the same mapping, not counted: the first free
    // unmaps it, and freeing it again is a double free (conformance module `ipc`).
    let mut again: CUdeviceptr = 0;
    ok!(d, cuMemPoolImportPointer(&mut again, pool, &mut share));
    assert_eq!(again, p);
    assert_eq!(
        emu.live_allocations().iter().filter(|a| a.ptr == p).count(),
        1
    );
    ok!(d, cuMemFreeAsync(p, CU_STREAM_LEGACY));
    ok!(d, cuStreamSynchronize(CU_STREAM_LEGACY));
    assert!(emu.hazards().is_empty(), "{:?}", emu.hazards());
    assert_eq!(
        code(cu!(d, cuMemFreeAsync(again, CU_STREAM_LEGACY))),
        CudaErrorCode::INVALID_VALUE
    );
    let hazards = emu.hazards();
    assert!(
        hazards
            .iter()
            .any(|h| h.kind == "double_free" && h.ptr == again && h.function == "cuMemFreeAsync"),
        "{hazards:?}"
    );
    emu.clear_hazards();
    println!("child read {} bytes", got.len());
}

#[test]
fn proc_address_returns_our_exports() {
    let (d, _, _) = setup();
    let mut f: *mut c_void = std::ptr::null_mut();
    let mut status = CUdriverProcAddressQueryResult::CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    ok!(
        d,
        cuGetProcAddress_v2(c"cuMemFree".as_ptr(), &mut f, 12000, 0, &mut status)
    );
    assert_eq!(
        status,
        CUdriverProcAddressQueryResult::CU_GET_PROC_ADDRESS_SUCCESS
    );
    assert_eq!(f, d.cuMemFree_v2 as *mut c_void);
    // An unknown name is not an error for cuGetProcAddress_v2: the status says so (measured on
    // an H200; conformance measured_get_proc_address_of_unknown_symbol_*).
    ok!(
        d,
        cuGetProcAddress_v2(c"cuNoSuchThing".as_ptr(), &mut f, 12000, 0, &mut status)
    );
    assert!(f.is_null());
    assert_eq!(
        status,
        CUdriverProcAddressQueryResult::CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND
    );
    let _: c_uint = 0;
}

#[test]
fn capture_forks_and_joins_through_events() {
    let (d, emu, _) = setup();
    let (s, t) = (stream(d), stream(d));
    let (fork, join) = (event(d), event(d));
    let mut p: CUdeviceptr = 0;
    ok!(d, cuMemAlloc_v2(&mut p, 64));
    let p_id = id_at(&emu, p);
    let mode = CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED;

    // Forked work that never joins back: the capture cannot end.
    ok!(d, cuStreamBeginCapture_v2(s, mode));
    ok!(d, cuEventRecord(fork, s));
    ok!(d, cuStreamWaitEvent(t, fork, 0));
    ok!(d, cuMemsetD8Async(p, 1, 64, t));
    // The legacy stream may not be used while a blocking stream of its context captures.
    assert_eq!(
        code(cu!(d, cuMemsetD8Async(p, 2, 64, CU_STREAM_LEGACY))),
        CudaErrorCode::STREAM_CAPTURE_IMPLICIT
    );
    let mut g: CUgraph = std::ptr::null_mut();
    assert_ne!(
        code(cu!(d, cuStreamEndCapture(s, &mut g))),
        CudaErrorCode::SUCCESS
    );
    let mut status = CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_ACTIVE;
    ok!(d, cuStreamIsCapturing(t, &mut status));
    assert_eq!(status, CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE);

    // Fork, work on both streams, join: one graph with both fills, in order.
    ok!(d, cuStreamBeginCapture_v2(s, mode));
    ok!(d, cuEventRecord(fork, s));
    ok!(d, cuStreamWaitEvent(t, fork, 0));
    ok!(d, cuMemsetD8Async(p, 3, 32, t));
    ok!(d, cuMemsetD8Async(p + 32, 4, 32, s));
    ok!(d, cuEventRecord(join, t));
    ok!(d, cuStreamWaitEvent(s, join, 0));
    let mut id: cuuint64_t = 0;
    let mut deps: *const CUgraphNode = std::ptr::null();
    let mut n: usize = 0;
    ok!(
        d,
        cuStreamGetCaptureInfo_v2(s, &mut status, &mut id, &mut g, &mut deps, &mut n)
    );
    assert_eq!(
        status,
        CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_ACTIVE
    );
    assert_eq!(n, 2, "the origin stream now depends on both fills");
    ok!(d, cuStreamEndCapture(s, &mut g));
    let mut exec: CUgraphExec = std::ptr::null_mut();
    ok!(d, cuGraphInstantiateWithFlags(&mut exec, g, 0));
    ok!(d, cuGraphLaunch(exec, s));
    let mut out = [0u8; 64];
    ok!(d, cuStreamSynchronize(s));
    ok!(d, cuMemcpyDtoH_v2(out.as_mut_ptr().cast(), p, 64));
    assert_eq!(out[..32], [3u8; 32]);
    assert_eq!(out[32..], [4u8; 32]);
    ok!(d, cuGraphExecDestroy(exec));
    ok!(d, cuGraphDestroy(g));
    ok!(d, cuMemFree_v2(p));
    assert!(hazards_for(&emu, p_id).is_empty(), "{:?}", emu.hazards());
}

#[test]
fn thread_local_capture_only_restricts_its_own_thread() {
    let (d, _, ctx) = setup();
    let s = stream(d);
    ok!(
        d,
        cuStreamBeginCapture_v2(s, CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
    );
    let ctx = ctx as u64;
    std::thread::spawn(move || {
        let d = cuda_sys::driver().unwrap();
        ok!(d, cuCtxSetCurrent(ctx as CUcontext));
        let mut p: CUdeviceptr = 0;
        ok!(d, cuMemAlloc_v2(&mut p, 16));
        ok!(d, cuMemFree_v2(p));
    })
    .join()
    .unwrap();
    let mut p: CUdeviceptr = 0;
    assert_eq!(
        code(cu!(d, cuMemAlloc_v2(&mut p, 16))),
        CudaErrorCode::STREAM_CAPTURE_UNSUPPORTED
    );
    let mut g: CUgraph = std::ptr::null_mut();
    assert_eq!(
        code(cu!(d, cuStreamEndCapture(s, &mut g))),
        CudaErrorCode::STREAM_CAPTURE_INVALIDATED
    );
}

/// `CUgraphNodeParams` holding `CUDA_CONDITIONAL_NODE_PARAMS` (handle, type, size,
/// `phGraph_out`, context) and zeros for the rest.
#[repr(C)]
struct ConditionalNodeParams {
    node_type: u32,
    reserved0: [c_int; 3],
    handle: u64,
    cond_type: u32,
    size: u32,
    graphs_out: *mut CUgraph,
    ctx: CUcontext,
    rest: [i64; 26],
}

/// `cuGraphConditionalHandleCreate` and `cuGraphAddNode_v2`, resolved through the driver.
fn conditional_entry_points(
    d: &Driver,
) -> (
    unsafe extern "C" fn(*mut u64, CUgraph, CUcontext, c_uint, c_uint) -> CUresult,
    unsafe extern "C" fn(
        *mut CUgraphNode,
        CUgraph,
        *const CUgraphNode,
        *const c_void,
        usize,
        *mut ConditionalNodeParams,
    ) -> CUresult,
) {
    let mut pfns = [std::ptr::null_mut(); 2];
    for (name, pfn) in [c"cuGraphConditionalHandleCreate", c"cuGraphAddNode"]
        .into_iter()
        .zip(&mut pfns)
    {
        let mut status = CUdriverProcAddressQueryResult::CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
        ok!(
            d,
            cuGetProcAddress_v2(name.as_ptr(), pfn, 13000, 0, &mut status)
        );
        assert!(!pfn.is_null(), "{name:?}");
    }
    // SAFETY: the CUDA 13.0 signatures of the two entry points, restated.
    unsafe { (std::mem::transmute(pfns[0]), std::mem::transmute(pfns[1])) }
}

/// Conditional nodes in the emulator (crate docs of `cuda-emu`): every launch sees the
/// condition's default value, so a WHILE node whose default is non-zero would loop for ever on
/// a GPU (no kernel clears it here): it instantiates, and its launch is refused with
/// `CUDA_ERROR_NOT_SUPPORTED`; with default 0 it runs no body. A clone of a graph copies its
/// conditional nodes' bodies (the clone's IF runs its own copy of the body's memset node), and
/// destroying the graphs destroys the bodies with them.
#[test]
fn conditional_while_refused_and_clones_copy_bodies() {
    let (d, _, ctx) = setup();
    let (create, add) = conditional_entry_points(d);
    let s = stream(d);
    let mut p: CUdeviceptr = 0;
    ok!(d, cuMemAlloc_v2(&mut p, 16));
    ok!(d, cuMemsetD8_v2(p, 0, 16));
    let add_conditional = |g: CUgraph, cond_type: u32, default: c_uint| -> Vec<CUgraph> {
        let mut handle = 0u64;
        // SAFETY: a live graph and context, valid out-pointers.
        let status = unsafe { create(&mut handle, g, ctx, default, 1) };
        assert_eq!(code(status), CudaErrorCode::SUCCESS);
        let mut params = ConditionalNodeParams {
            node_type: 13,
            reserved0: [0; 3],
            handle,
            cond_type,
            size: 1,
            graphs_out: std::ptr::null_mut(),
            ctx,
            rest: [0; 26],
        };
        let mut node: CUgraphNode = std::ptr::null_mut();
        // SAFETY: as above; no dependencies.
        let status = unsafe {
            add(
                &mut node,
                g,
                std::ptr::null(),
                std::ptr::null(),
                0,
                &mut params,
            )
        };
        assert_eq!(code(status), CudaErrorCode::SUCCESS);
        // SAFETY: the driver's array of `size` (1) body graphs.
        vec![unsafe { *params.graphs_out }]
    };
    for (default, launch) in [
        (1, CudaErrorCode::NOT_SUPPORTED),
        (0, CudaErrorCode::SUCCESS),
    ] {
        let mut g: CUgraph = std::ptr::null_mut();
        ok!(d, cuGraphCreate(&mut g, 0));
        add_conditional(g, 1, default);
        let mut exec: CUgraphExec = std::ptr::null_mut();
        ok!(d, cuGraphInstantiateWithFlags(&mut exec, g, 0));
        assert_eq!(
            code(cu!(d, cuGraphLaunch(exec, s))),
            launch,
            "WHILE, default {default}"
        );
        ok!(d, cuGraphExecDestroy(exec));
        ok!(d, cuGraphDestroy(g));
    }
    let mut g: CUgraph = std::ptr::null_mut();
    ok!(d, cuGraphCreate(&mut g, 0));
    let body = add_conditional(g, 0, 1)[0];
    let set = CUDA_MEMSET_NODE_PARAMS {
        dst: p,
        pitch: 0,
        value: 0x5a,
        elementSize: 1,
        width: 16,
        height: 1,
    };
    let mut node: CUgraphNode = std::ptr::null_mut();
    ok!(
        d,
        cuGraphAddMemsetNode(&mut node, body, std::ptr::null(), 0, &set, ctx)
    );
    let mut clone: CUgraph = std::ptr::null_mut();
    ok!(d, cuGraphClone(&mut clone, g));
    ok!(d, cuGraphDestroy(g));
    let mut empty: CUgraphNode = std::ptr::null_mut();
    assert_eq!(
        code(cu!(
            d,
            cuGraphAddEmptyNode(&mut empty, body, std::ptr::null(), 0)
        )),
        CudaErrorCode::INVALID_HANDLE,
        "the body went with its graph"
    );
    let mut exec: CUgraphExec = std::ptr::null_mut();
    ok!(d, cuGraphInstantiateWithFlags(&mut exec, clone, 0));
    ok!(d, cuGraphLaunch(exec, s));
    ok!(d, cuStreamSynchronize(s));
    let mut out = [0u8; 16];
    ok!(d, cuMemcpyDtoH_v2(out.as_mut_ptr().cast(), p, 16));
    assert_eq!(out, [0x5a; 16], "the clone's IF ran its copy of the body");
    ok!(d, cuGraphExecDestroy(exec));
    ok!(d, cuGraphDestroy(clone));
    ok!(d, cuMemFree_v2(p));
    ok!(d, cuStreamDestroy_v2(s));
}
