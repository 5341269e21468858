//! Declared use streams at the handles level (`DevicePtrHandle::record_use`, docs/decisions.md
//! D12), observed on any driver with stream memory operations, as docs/driver-facts.md F14 was
//! measured: the use stream `b` is held by `cuStreamWaitValue32` on a flag in host-mapped memory
//! (only the test releases it), the memory is freed on its deallocation stream `a`, and what `a`
//! does is looked at while `b` is provably still held. With the use recorded, `a` waits for `b`
//! (`cuStreamQuery(a)` is not ready; a deallocator's marker on `a` stays unwritten); without it,
//! `a` runs at once. No timing is asserted; a failing test releases the flag as it unwinds.

mod common;

use std::sync::Arc;

use common::*;
use cuda_sys::CudaErrorCode;
use handles::PoolAttribute;
use handles::{
    ContextHandle, Deallocator, DevicePtrHandle, HandleError, OwnedAllocation, StreamFlags,
    StreamHandle,
};

/// `b` held by a wait on a flag: `b`'s later work waits until [`Held::release`] (or the drop).
struct Held {
    flag: Option<stream_ops::HostFlag>,
}

impl Held {
    /// Holds `b` (its context current on the calling thread).
    fn hold(b: &StreamHandle) -> Held {
        let flag = stream_ops::HostFlag::new();
        stream_ops::hold(b.raw(), &flag);
        assert_eq!(
            stream_ops::query(b.raw()),
            CudaErrorCode::NOT_READY,
            "b is held"
        );
        Held { flag: Some(flag) }
    }

    /// Releases `b`, waits for it and frees the flag.
    fn release(mut self, b: &StreamHandle) {
        let flag = self.flag.take().expect("held");
        flag.release();
        b.synchronize().unwrap();
        flag.free();
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        if let Some(flag) = &self.flag {
            flag.release(); // never leave a stream held (the flag itself is then leaked)
        }
    }
}

/// A pool allocation freed on `a` (a created stream) while `b` is held: with `b` recorded as a
/// use, `a` is not ready until `b` goes on, and on the emulator the pool still counts the memory;
/// without, `a` is done at once.
fn pool_free_while_b_is_held(record: bool) {
    let _serial = start();
    let ctx = primary(0);
    ctx.make_current().unwrap();
    let (a, b) = (
        StreamHandle::create(&ctx, StreamFlags::DEFAULT, 0).unwrap(),
        StreamHandle::create(&ctx, StreamFlags::DEFAULT, 0).unwrap(),
    );
    let base = default_used(&ctx);
    let buffer = pool_buffer(&a).unwrap();
    a.synchronize().unwrap();
    let alloc = alloc_of(buffer.ptr());
    let held = Held::hold(&b);
    if record {
        buffer.record_use(&b).unwrap();
    }
    assert_eq!(
        stream_ops::query(a.raw()),
        CudaErrorCode::SUCCESS,
        "a has no work"
    );
    let from = mark();
    drop(buffer);
    let a_now = stream_ops::query(a.raw());
    // Not `default_used`, which synchronises the context (and so would wait for b).
    let used_while_held = default_pool()
        .attribute(PoolAttribute::USED_MEM_CURRENT)
        .unwrap();
    if record {
        assert_eq!(a_now, CudaErrorCode::NOT_READY, "the free on a waits for b");
        match emulator() {
            Some(_) => assert_eq!(used_while_held, base + POOL_BUFFER, "not freed yet"),
            None => eprintln!(
                "observed on this driver: the pool's used memory while the free waits is \
                 {used_while_held} bytes ({base} before the allocation, {POOL_BUFFER} allocated)"
            ),
        }
    } else {
        // A bounded poll on an outcome (a driver that disagreed must not hang the run): a
        // finishes its free while b is still held.
        let limit = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while stream_ops::query(a.raw()) == CudaErrorCode::NOT_READY {
            assert!(
                std::time::Instant::now() < limit,
                "a waited for b with no use recorded"
            );
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        assert_eq!(
            stream_ops::query(b.raw()),
            CudaErrorCode::NOT_READY,
            "b still held"
        );
    }
    held.release(&b);
    a.synchronize().unwrap();
    assert_eq!(default_used(&ctx), base, "freed");
    with_emulator(|emu| {
        let free = emu.only_call("cuMemFreeAsync", alloc, from);
        assert_eq!((free.stream, free.result), (Some(a.raw() as u64), 0));
    });
    ContextHandle::clear_current().unwrap();
    assert_no_hazards();
}

#[test]
fn a_free_with_a_recorded_use_waits_for_the_use_streams_pending_work() {
    pool_free_while_b_is_held(true);
}

#[test]
fn a_free_without_a_recorded_use_does_not_wait_for_other_streams() {
    pool_free_while_b_is_held(false);
}

/// What [`MarkerWriter`] writes.
const MARKER: u32 = 0xD12D_0001;

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

/// The order where it is decided, on any driver: a deallocator's free on `a` writes a marker on
/// the stream it is handed; with `b` (held) recorded as a use, the marker stays unwritten until
/// `b` goes on.
#[test]
fn a_deallocators_stream_waits_for_a_recorded_use_stream() {
    let _serial = start();
    let ctx = primary(0);
    ctx.make_current().unwrap();
    let (a, b) = (
        StreamHandle::create(&ctx, StreamFlags::DEFAULT, 0).unwrap(),
        StreamHandle::create(&ctx, StreamFlags::DEFAULT, 0).unwrap(),
    );
    let marker = Arc::new(stream_ops::HostFlag::new());
    let deallocator: Arc<dyn Deallocator> = Arc::new(MarkerWriter(marker.clone()));
    let buffer = DevicePtrHandle::adopt(test_allocation(0x7000, 64), &a, deallocator).unwrap();
    let held = Held::hold(&b);
    buffer.record_use(&b).unwrap();
    buffer.release().unwrap();
    assert_eq!(marker.read(), 0, "the marker on a waits for b");
    assert_eq!(stream_ops::query(a.raw()), CudaErrorCode::NOT_READY);
    held.release(&b);
    a.synchronize().unwrap();
    assert_eq!(marker.read(), MARKER, "written once b went on");
    Arc::try_unwrap(marker)
        .ok()
        .expect("the deallocator is gone")
        .free();
    ContextHandle::clear_current().unwrap();
    assert_no_hazards();
}

/// A per-thread-default-stream use recorded on thread T, freed on another thread: the event is
/// recorded on the bound context's legacy stream (docs/decisions.md D6), which waits for T's
/// per-thread stream (F14); here T's per-thread stream is held, and the free on `a` waits.
#[test]
fn a_per_thread_use_freed_on_another_thread_waits_for_the_recording_thread() {
    let _serial = start();
    let ctx = primary(0);
    ctx.make_current().unwrap();
    let a = StreamHandle::create(&ctx, StreamFlags::DEFAULT, 0).unwrap();
    let marker = Arc::new(stream_ops::HostFlag::new());
    ContextHandle::clear_current().unwrap();
    let deallocator: Arc<dyn Deallocator> = Arc::new(MarkerWriter(marker.clone()));
    let buffer = DevicePtrHandle::adopt(test_allocation(0x8000, 64), &a, deallocator).unwrap();
    let (sent, received) = std::sync::mpsc::channel();
    let (finish, finished) = std::sync::mpsc::channel::<()>();
    let ctx2 = ctx.clone();
    let t = std::thread::spawn(move || {
        ctx2.make_current().unwrap();
        let ptds = StreamHandle::per_thread();
        let flag = stream_ops::HostFlag::new();
        stream_ops::hold(ptds.raw(), &flag);
        buffer.record_use(&ptds).unwrap();
        sent.send((buffer, flag)).unwrap();
        let _ = finished.recv();
        ptds.synchronize().unwrap();
        ContextHandle::clear_current().unwrap();
    });
    let (buffer, flag) = received.recv().unwrap();
    drop(buffer); // on this thread, with no context
    assert_eq!(current_raw(), 0);
    assert_eq!(
        marker.read(),
        0,
        "the marker on a waits for T's per-thread stream"
    );
    flag.release();
    drop(finish);
    t.join().expect("thread T");
    ctx.make_current().unwrap();
    a.synchronize().unwrap();
    assert_eq!(marker.read(), MARKER);
    flag.free();
    Arc::try_unwrap(marker)
        .ok()
        .expect("the deallocator is gone")
        .free();
    ContextHandle::clear_current().unwrap();
    assert_no_hazards();
}
