//! docs/driver-facts.md F14, F15 and F24: what work of thread B waits for work pending on thread A's
//! per-thread default stream, observed as the facts were measured, with stream memory
//! operations: A's per-thread stream is held by `cuStreamWaitValue32` on a flag in pinned,
//! device-mapped host memory; B issues `cuStreamWriteValue32` of a marker on the stream under
//! test; the host looks at the marker before it releases the flag.
//!
//! - F14 (`f14_*`): on `CU_STREAM_LEGACY` or the NULL stream, B's write waits: `cuStreamQuery`
//!   says `CUDA_ERROR_NOT_READY` and the marker is unwritten while A is held; once the flag is
//!   released, `cuStreamSynchronize` returns and the marker is there.
//! - F15 (`f15_*`): on B's own `CU_STREAM_PER_THREAD`, a created blocking stream or a created
//!   non-blocking stream, B's write does not wait: `cuStreamSynchronize` of that stream returns
//!   and the marker is written while A is still held.
//! - F24 (`f24_*`): a thread that ends with work pending on its per-thread stream does not
//!   finish exiting until that work has run: with the work held, the join that watches the
//!   exit has not returned, and a legacy free from another thread waits too; once the case
//!   releases the hold, the work runs and the exit finishes. A thread that synchronised its
//!   per-thread stream first exits at once, and a legacy free after it completes.
//!
//! Nothing here depends on timing: each observation is made while the flag is provably unset
//! (only the case sets it), and the flag is released at the end whatever happens (the `Flag`'s
//! drop, and a watchdog that fails the case instead of letting a wrong driver hang it). The F24
//! cases look for the exit to finish while it is held for `EXIT_WINDOW`, which only gives a
//! driver that does not hold it a chance to show it.
//!
//! Also here (`basic_stream_*_value*`): the stream memory operations themselves, as documented:
//! a wait holds its stream's later work until the memory satisfies it; a write stores its value
//! when its stream reaches it.

use std::sync::{mpsc, Arc};
use std::time::Duration;

use cuda_sys::types::{
    CUcontext, CUstream, CU_STREAM_LEGACY, CU_STREAM_NULL, CU_STREAM_PER_THREAD,
};
use cuda_sys::CudaErrorCode;

use crate::driver::{
    ctx_set_current, ctx_synchronize, device_get_default_mem_pool, event_create, event_destroy,
    event_query, event_record, init, mem_alloc_from_pool_async, mem_free_async, mem_pool_destroy,
    memset_d8_async, stream_create, stream_destroy, stream_query, stream_synchronize,
    stream_wait_event, stream_wait_value32, stream_wait_value64, stream_write_value32,
    stream_write_value64, EVENT_DISABLE_TIMING, STREAM_NON_BLOCKING, STREAM_WAIT_VALUE_EQ,
    STREAM_WAIT_VALUE_GEQ,
};
use crate::support::{
    device0, new_pool, on_fresh_thread, primary_current, Flag, HostWord, Shared, LIVENESS_BOUND, N,
};

/// What B writes.
const MARKER: u32 = 0xC0FF_EE01;

/// Thread A: its per-thread default stream, in context `ctx`, held by a wait on a [`Flag`] this
/// value owns. Started by [`HeldPerThreadStream::start`], which returns once the wait is issued
/// and A has seen its stream pending; [`HeldPerThreadStream::finish`] (or a drop, when a case
/// fails) releases the flag, lets A synchronise its stream and joins it.
struct HeldPerThreadStream {
    flag: Option<Flag>,
    done: Option<mpsc::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl HeldPerThreadStream {
    #[track_caller]
    fn start(ctx: CUcontext) -> HeldPerThreadStream {
        let flag = Flag::new();
        let (ctx, dev) = (Shared(ctx), Shared(flag.dev()));
        let (held_tx, held_rx) = mpsc::channel();
        let (done_tx, done_rx) = mpsc::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("A".to_owned())
            .spawn(move || {
                init();
                ctx_set_current(ctx.get()).check();
                let issued =
                    stream_wait_value32(CU_STREAM_PER_THREAD, dev.get(), 1, STREAM_WAIT_VALUE_GEQ);
                let pending = stream_query(CU_STREAM_PER_THREAD).code;
                let _ = held_tx.send((issued.code, pending));
                // Until the case is done (or gone: a failed case drops the sender).
                let _ = done_rx.recv();
                stream_synchronize(CU_STREAM_PER_THREAD).check();
            })
            .expect("spawning thread A");
        let held = HeldPerThreadStream {
            flag: Some(flag),
            done: Some(done_tx),
            thread: Some(thread),
        };
        let (issued, pending) = held_rx.recv().expect("thread A reports its wait");
        assert_eq!(issued, CudaErrorCode::SUCCESS, "A's cuStreamWaitValue32_v2");
        assert_eq!(
            pending,
            CudaErrorCode::NOT_READY,
            "A's per-thread stream is held by its wait while the flag is unset"
        );
        held
    }

    /// Releases A's stream: the host writes the flag.
    fn release(&self) {
        if let Some(flag) = &self.flag {
            flag.release();
        }
    }

    /// Whether the flag's watchdog had to release A (see [`Flag`]).
    fn watchdog_fired(&self) -> bool {
        self.flag.as_ref().is_some_and(Flag::watchdog_fired)
    }

    /// Releases the flag, lets A synchronise its per-thread stream, joins it and frees the flag.
    #[track_caller]
    fn finish(mut self) {
        self.join();
        if let Some(flag) = self.flag.take() {
            flag.free();
        }
    }

    fn join(&mut self) {
        self.release();
        self.done.take();
        if let Some(thread) = self.thread.take() {
            if let Err(panic) = thread.join() {
                if !std::thread::panicking() {
                    std::panic::resume_unwind(panic);
                }
            }
        }
    }
}

impl Drop for HeldPerThreadStream {
    fn drop(&mut self) {
        self.join();
    }
}

/// F14 with B's write on `x` (the legacy stream, by token `CU_STREAM_LEGACY` or NULL).
fn legacy_waits_for_another_threads_per_thread_stream(x: CUstream) {
    let x = Shared(x);
    on_fresh_thread("f14", move || {
        init();
        let primary = primary_current();
        let marker = HostWord::new();
        let held = HeldPerThreadStream::start(primary.ctx());

        let (ctx, m) = (Shared(primary.ctx()), Shared(marker.dev()));
        on_fresh_thread("B", move || {
            init();
            ctx_set_current(ctx.get()).check();
            stream_write_value32(x.get(), m.get(), MARKER).check();
            stream_query(x.get()).fails_with(CudaErrorCode::NOT_READY);
        });
        assert_eq!(
            marker.read(),
            0,
            "B's write on the legacy stream waited for A's per-thread stream"
        );
        assert!(!held.watchdog_fired());

        held.release();
        stream_synchronize(x.get()).check(); // the context's legacy stream, B's write included
        assert_eq!(marker.read(), MARKER, "written once A's stream went on");
        held.finish();
        marker.free();
    });
}

#[test]
fn f14_legacy_token_waits_for_another_threads_per_thread_stream() {
    legacy_waits_for_another_threads_per_thread_stream(CU_STREAM_LEGACY);
}

#[test]
fn f14_null_stream_waits_for_another_threads_per_thread_stream() {
    legacy_waits_for_another_threads_per_thread_stream(CU_STREAM_NULL);
}

/// F14 for an event, which custody relies on (docs/decisions.md D6 and D12: a synchronous free's
/// ordering event, and a declared use's event, recorded on the legacy stream away from the
/// recording thread): B records an event on `CU_STREAM_LEGACY` while A's per-thread stream is
/// held; a created non-blocking stream X waits for the event and writes a marker. While A is
/// held the event is not complete (`cuEventQuery`: `CUDA_ERROR_NOT_READY`) and the marker is
/// unwritten; once A goes on, X's write lands. F14 was first observed with a stream write on the
/// legacy stream; this case, with an event recorded there, passed on the H200 on 2026-12-01.
#[test]
fn f14_event_recorded_on_the_legacy_stream_waits_for_another_threads_per_thread_stream() {
    on_fresh_thread("f14-event", || {
        init();
        let primary = primary_current();
        let marker = HostWord::new();
        let held = HeldPerThreadStream::start(primary.ctx());

        let (ctx, m) = (Shared(primary.ctx()), Shared(marker.dev()));
        let (event, x) = on_fresh_thread("B", move || {
            init();
            ctx_set_current(ctx.get()).check();
            let event = event_create(EVENT_DISABLE_TIMING).check();
            event_record(event, CU_STREAM_LEGACY).check();
            let x = stream_create(STREAM_NON_BLOCKING).check();
            stream_wait_event(x, event).check();
            stream_write_value32(x, m.get(), MARKER).check();
            event_query(event).fails_with(CudaErrorCode::NOT_READY);
            (Shared(event), Shared(x))
        });
        assert_eq!(
            marker.read(),
            0,
            "the event on the legacy stream waited for A's per-thread stream, and X for the event"
        );
        assert!(!held.watchdog_fired());

        held.release();
        stream_synchronize(x.get()).check();
        assert_eq!(marker.read(), MARKER, "written once A's stream went on");
        event_query(event.get()).check();
        event_destroy(event.get()).check();
        stream_destroy(x.get()).check();
        held.finish();
        marker.free();
    });
}

/// Runs `f` on a fresh thread named `name` and returns its result, failing the case if it has not
/// returned within [`LIVENESS_BOUND`] (the thread is then left behind, stuck in the driver, and the
/// GPU runner's hang diagnostics show where). Not a timing expectation: every call made this way
/// waits only for work that the case has already let run.
#[track_caller]
fn returns_within_the_liveness_bound<R: Send + 'static>(
    name: &str,
    f: impl FnOnce() -> R + Send + 'static,
) -> R {
    let (tx, rx) = mpsc::channel();
    std::thread::Builder::new()
        .name(name.to_owned())
        .spawn(move || {
            let _ = tx.send(f());
        })
        .expect("spawning a bounded thread");
    match rx.recv_timeout(LIVENESS_BOUND) {
        Ok(value) => value,
        Err(mpsc::RecvTimeoutError::Timeout) => panic!(
            "{name} did not return within {LIVENESS_BOUND:?}: the driver call it makes is stuck"
        ),
        Err(mpsc::RecvTimeoutError::Disconnected) => panic!("{name} panicked"),
    }
}

/// How long a case looks for a thread's exit to finish while that exit has to wait: a driver
/// that holds the exit passes whatever this is; it only gives one that does not a chance to
/// show it (not a timing expectation).
const EXIT_WINDOW: Duration = Duration::from_secs(1);

/// Runs `f` on a new thread named `name` and returns what it returned, sent just before its
/// thread function ends, with a receiver on which a watcher thread that joins it says when the
/// thread's exit has finished (`true`; `false` if `f` panicked). The thread's exit is what
/// docs/driver-facts.md F24 is about: the join returns only once the driver's thread-exit work
/// is done.
#[track_caller]
fn on_watched_thread<R: Send + 'static>(
    name: &str,
    f: impl FnOnce() -> R + Send + 'static,
) -> (R, mpsc::Receiver<bool>) {
    let (value_tx, value_rx) = mpsc::channel();
    let thread = std::thread::Builder::new()
        .name(name.to_owned())
        .spawn(move || {
            let _ = value_tx.send(f());
        })
        .expect("spawning a watched thread");
    let (exited_tx, exited_rx) = mpsc::channel();
    std::thread::Builder::new()
        .name(format!("{name}-join"))
        .spawn(move || {
            let _ = exited_tx.send(thread.join().is_ok());
        })
        .expect("spawning a joining thread");
    match value_rx.recv_timeout(LIVENESS_BOUND) {
        Ok(value) => (value, exited_rx),
        Err(mpsc::RecvTimeoutError::Timeout) => {
            panic!("{name} did not get through its work within {LIVENESS_BOUND:?}")
        }
        Err(mpsc::RecvTimeoutError::Disconnected) => panic!("{name} panicked"),
    }
}

/// F24 with the pending work made certain: thread A allocates from `pool` (device 0's default
/// pool, or one that keeps its memory) on its per-thread stream, holds that stream with
/// `cuStreamWaitValue32_v2` on a flag, queues a memset of the allocation and a marker behind
/// the wait, leaves its context (`cuCtxSetCurrent(NULL)`) and returns from its thread
/// function. While the flag is unset:
/// - A's exit does not finish (the join that watches it has not returned within
///   [`EXIT_WINDOW`]);
/// - thread B's `cuMemFreeAsync` of the allocation on `CU_STREAM_LEGACY`, and a marker behind
///   it, wait for the exiting A's per-thread work (F14: the legacy stream is not ready, both
///   markers unwritten).
///
/// Then the case, on its own thread, releases the flag: A's work runs (its marker is written),
/// B's after it, and A's exit finishes; `cuStreamSynchronize(CU_STREAM_LEGACY)` and
/// `cuCtxSynchronize` return, each on a fresh thread bounded by [`LIVENESS_BOUND`]. Measured on
/// the H200 (2026-12-01): the exit did not finish while held (alone for 40 s). That it finishes
/// once the work has run is what the emulator models; on that day, beside seven other processes,
/// exits that began with work pending had not finished a minute after the work could run
/// (docs/driver-facts.md F24 says what a failure of the last steps here would mean).
fn exiting_threads_held_work_then_legacy_free(own_pool: bool) {
    on_fresh_thread("f24-held", move || {
        init();
        let primary = primary_current();
        let flag = Flag::new();
        let (marker_a, marker_b) = (HostWord::new(), HostWord::new());
        let pool = Shared(if own_pool {
            new_pool() // release threshold u64::MAX: a synchronisation releases nothing
        } else {
            device_get_default_mem_pool(device0()).check()
        });
        let (ctx, f, ma) = (
            Shared(primary.ctx()),
            Shared(flag.dev()),
            Shared(marker_a.dev()),
        );
        let (ptr, exited) = on_watched_thread("A", move || {
            init();
            ctx_set_current(ctx.get()).check();
            let ptr = mem_alloc_from_pool_async(N, pool.get(), CU_STREAM_PER_THREAD).check();
            stream_wait_value32(CU_STREAM_PER_THREAD, f.get(), 1, STREAM_WAIT_VALUE_GEQ).check();
            memset_d8_async(ptr, 0x5a, N, CU_STREAM_PER_THREAD).check();
            stream_write_value32(CU_STREAM_PER_THREAD, ma.get(), MARKER).check();
            stream_query(CU_STREAM_PER_THREAD).fails_with(CudaErrorCode::NOT_READY);
            ctx_set_current(std::ptr::null_mut()).check();
            ptr
        }); // A's thread function has returned; its exit has to wait for the held work

        let mb = Shared(marker_b.dev());
        on_fresh_thread("B", move || {
            init();
            ctx_set_current(ctx.get()).check();
            mem_free_async(ptr, CU_STREAM_LEGACY).check();
            stream_write_value32(CU_STREAM_LEGACY, mb.get(), MARKER).check();
            stream_query(CU_STREAM_LEGACY).fails_with(CudaErrorCode::NOT_READY);
            ctx_set_current(std::ptr::null_mut()).check();
        });
        assert_eq!(marker_a.read(), 0, "A's marker waits behind A's held wait");
        assert_eq!(
            marker_b.read(),
            0,
            "B's write on the legacy stream waits for the exiting A's per-thread work"
        );
        assert!(
            matches!(
                exited.recv_timeout(EXIT_WINDOW),
                Err(mpsc::RecvTimeoutError::Timeout)
            ),
            "A's exit finished while its per-thread work was held"
        );
        assert!(!flag.watchdog_fired());

        flag.release(); // by this thread: A is inside its exit
        assert!(marker_a.comes_to(MARKER), "A's held work ran once released");
        assert!(marker_b.comes_to(MARKER), "B's legacy work ran after it");
        match exited.recv_timeout(LIVENESS_BOUND) {
            Ok(true) => {}
            Ok(false) => panic!("A panicked"),
            Err(_) => panic!(
                "A's per-thread work has run, but A's exit had not finished {LIVENESS_BOUND:?} \
                 later: this driver does not finish an exit that began with per-thread work \
                 pending even once that work is done"
            ),
        }
        returns_within_the_liveness_bound("legacy-synchronize", move || {
            init();
            ctx_set_current(ctx.get()).check();
            stream_synchronize(CU_STREAM_LEGACY).check();
            ctx_set_current(std::ptr::null_mut()).check();
        });
        returns_within_the_liveness_bound("ctx-synchronize", move || {
            init();
            ctx_set_current(ctx.get()).check();
            ctx_synchronize().check();
            ctx_set_current(std::ptr::null_mut()).check();
        });
        assert!(
            !flag.watchdog_fired(),
            "released by the case, not the watchdog"
        );
        flag.free();
        marker_a.free();
        marker_b.free();
        if own_pool {
            mem_pool_destroy(pool.get()).check();
        }
    });
}

/// [`exiting_threads_held_work_then_legacy_free`] with device 0's default pool (release
/// threshold 0, so a synchronisation may give its freed memory back), as custody's tests
/// allocate.
#[test]
fn f24_a_threads_exit_waits_for_its_held_per_thread_work_which_orders_a_legacy_free() {
    exiting_threads_held_work_then_legacy_free(false);
}

/// [`exiting_threads_held_work_then_legacy_free`] with a pool that keeps its memory across
/// synchronisations (the pool's release at synchronisation is not involved in F24: on the H200
/// both shapes held the exit alike).
#[test]
fn f24_a_threads_exit_waits_for_its_held_per_thread_work_which_orders_a_legacy_free_from_a_keeping_pool(
) {
    exiting_threads_held_work_then_legacy_free(true);
}

/// What F24 asks of a thread that used its per-thread stream, and what custody's tests do:
/// thread A allocates from device 0's default pool on its per-thread stream, fills the
/// allocation and writes a marker there, then **synchronises its per-thread stream**, leaves its
/// context and ends. Its exit finishes (the join returns, bounded by [`LIVENESS_BOUND`]) with
/// the work done; thread B frees the allocation on `CU_STREAM_LEGACY`; `cuCtxSynchronize` and
/// `cuStreamSynchronize(CU_STREAM_LEGACY)` return, each on a fresh bounded thread. The same
/// sequence without the synchronisation (this case before 2026-12-01) finished alone on the
/// H200 and did not finish within 120 s beside seven other processes: the exit waited.
#[test]
fn f24_a_thread_that_synchronized_its_per_thread_stream_exits_and_a_legacy_free_after_it_completes()
{
    on_fresh_thread("f24-drained", || {
        init();
        let primary = primary_current();
        let marker = HostWord::new();
        let pool = Shared(device_get_default_mem_pool(device0()).check());
        let (ctx, m) = (Shared(primary.ctx()), Shared(marker.dev()));
        let (ptr, exited) = on_watched_thread("A", move || {
            init();
            ctx_set_current(ctx.get()).check();
            let ptr = mem_alloc_from_pool_async(N, pool.get(), CU_STREAM_PER_THREAD).check();
            memset_d8_async(ptr, 0x5a, N, CU_STREAM_PER_THREAD).check();
            stream_write_value32(CU_STREAM_PER_THREAD, m.get(), MARKER).check();
            stream_synchronize(CU_STREAM_PER_THREAD).check();
            ctx_set_current(std::ptr::null_mut()).check();
            ptr
        });
        match exited.recv_timeout(LIVENESS_BOUND) {
            Ok(true) => {}
            Ok(false) => panic!("A panicked"),
            Err(_) => panic!("A's exit had not finished within {LIVENESS_BOUND:?}"),
        }
        assert_eq!(marker.read(), MARKER, "A's work ran before A synchronised");
        on_fresh_thread("B", move || {
            init();
            ctx_set_current(ctx.get()).check();
            mem_free_async(ptr, CU_STREAM_LEGACY).check();
            ctx_set_current(std::ptr::null_mut()).check();
        });
        returns_within_the_liveness_bound("ctx-synchronize", move || {
            init();
            ctx_set_current(ctx.get()).check();
            ctx_synchronize().check();
            ctx_set_current(std::ptr::null_mut()).check();
        });
        returns_within_the_liveness_bound("legacy-synchronize", move || {
            init();
            ctx_set_current(ctx.get()).check();
            stream_synchronize(CU_STREAM_LEGACY).check();
            ctx_set_current(std::ptr::null_mut()).check();
        });
        marker.free();
    });
}

/// The legacy stream's documented rule in its second direction (CUDA driver API, "Stream
/// synchronization behavior": an action on the legacy stream first waits for every blocking
/// stream, and then every blocking stream waits for it), which makes work on the legacy stream a
/// barrier for the blocking streams of its context: a created blocking stream X is held by a wait
/// on a flag; a marker written on `CU_STREAM_LEGACY` waits for X, and a marker written *after it*
/// on another created blocking stream Y waits for the legacy stream, so for X too; a created
/// non-blocking stream Z is not held back. Once the flag is released everything is written. What
/// a free custody issues on the legacy stream (docs/decisions.md D6) does to the context's
/// blocking streams. Read from the documentation; passed on the H200 on 2026-12-01 (bundle
/// `d7f8154`, beside seven other processes and alone).
#[test]
fn basic_legacy_work_is_a_barrier_for_later_work_on_blocking_streams() {
    on_fresh_thread("legacy-barrier", || {
        init();
        let _primary = primary_current();
        let flag = Flag::new();
        let (legacy_marker, y_marker, z_marker) =
            (HostWord::new(), HostWord::new(), HostWord::new());
        let x = stream_create(0).check();
        let y = stream_create(0).check();
        let z = stream_create(STREAM_NON_BLOCKING).check();
        stream_wait_value32(x, flag.dev(), 1, STREAM_WAIT_VALUE_GEQ).check();
        stream_write_value32(CU_STREAM_LEGACY, legacy_marker.dev(), MARKER).check();
        stream_write_value32(y, y_marker.dev(), MARKER).check();
        stream_write_value32(z, z_marker.dev(), MARKER).check();
        stream_synchronize(z).check(); // Z does not wait for the legacy stream
        assert_eq!(
            z_marker.read(),
            MARKER,
            "the non-blocking stream's write ran"
        );
        stream_query(CU_STREAM_LEGACY).fails_with(CudaErrorCode::NOT_READY);
        stream_query(y).fails_with(CudaErrorCode::NOT_READY);
        assert_eq!(
            legacy_marker.read(),
            0,
            "the legacy write waits for the held X"
        );
        assert_eq!(
            y_marker.read(),
            0,
            "Y's later write waits for the legacy stream, so for X"
        );
        assert!(!flag.watchdog_fired());

        flag.release();
        stream_synchronize(y).check();
        assert_eq!(legacy_marker.read(), MARKER);
        assert_eq!(y_marker.read(), MARKER);
        assert!(
            !flag.watchdog_fired(),
            "released by the case, not the watchdog"
        );
        for s in [x, y, z] {
            stream_synchronize(s).check();
            stream_destroy(s).check();
        }
        flag.free();
        legacy_marker.free();
        y_marker.free();
        z_marker.free();
    });
}

/// The stream B writes on in an F15 case.
#[derive(Clone, Copy, Debug)]
enum Other {
    /// B's own `CU_STREAM_PER_THREAD`.
    OwnPerThread,
    /// A stream B creates with `flags`.
    Created(u32),
}

/// F15 with B's write on `other`.
fn does_not_wait_for_another_threads_per_thread_stream(other: Other) {
    on_fresh_thread("f15", move || {
        init();
        let primary = primary_current();
        let marker = HostWord::new();
        let held = HeldPerThreadStream::start(primary.ctx());

        let (ctx, m) = (Shared(primary.ctx()), Shared(marker.dev()));
        on_fresh_thread("B", move || {
            init();
            ctx_set_current(ctx.get()).check();
            let x = match other {
                Other::OwnPerThread => CU_STREAM_PER_THREAD,
                Other::Created(flags) => stream_create(flags).check(),
            };
            stream_write_value32(x, m.get(), MARKER).check();
            // Returns at once under F15; a driver that orders it after A's stream returns only
            // when the watchdog releases A, and the case fails below.
            stream_synchronize(x).check();
            if let Other::Created(_) = other {
                stream_destroy(x).check();
            }
        });
        assert!(
            !held.watchdog_fired(),
            "{other:?}: B's stream waited for A's per-thread stream (the watchdog released it)"
        );
        assert_eq!(
            marker.read(),
            MARKER,
            "{other:?}: B's write ran while A's per-thread stream was held"
        );

        held.finish();
        marker.free();
    });
}

#[test]
fn f15_own_per_thread_stream_does_not_wait_for_another_threads_per_thread_stream() {
    does_not_wait_for_another_threads_per_thread_stream(Other::OwnPerThread);
}

#[test]
fn f15_created_blocking_stream_does_not_wait_for_another_threads_per_thread_stream() {
    does_not_wait_for_another_threads_per_thread_stream(Other::Created(0));
}

#[test]
fn f15_created_non_blocking_stream_does_not_wait_for_another_threads_per_thread_stream() {
    does_not_wait_for_another_threads_per_thread_stream(Other::Created(STREAM_NON_BLOCKING));
}

/// Documented: a wait holds the stream's later work until the host writes the memory; a write
/// on the same stream after it then stores its value.
#[test]
fn basic_stream_wait_value32_holds_later_work_until_the_host_writes() {
    on_fresh_thread("wait-value32", || {
        init();
        let _primary = primary_current();
        let (flag, marker) = (Flag::new(), HostWord::new());
        let s = stream_create(STREAM_NON_BLOCKING).check();
        stream_wait_value32(s, flag.dev(), 1, STREAM_WAIT_VALUE_GEQ).check();
        stream_write_value32(s, marker.dev(), MARKER).check();
        stream_query(s).fails_with(CudaErrorCode::NOT_READY);
        assert_eq!(marker.read(), 0, "the write waits behind the wait");
        flag.release();
        stream_synchronize(s).check();
        assert!(!flag.watchdog_fired());
        assert_eq!(marker.read(), MARKER);
        stream_query(s).check();
        stream_destroy(s).check();
        flag.free();
        marker.free();
    });
}

/// Documented: the 64-bit operations, an equality wait satisfied by a value the host writes in
/// two steps (the first does not satisfy it).
#[test]
fn basic_stream_wait_value64_eq_waits_for_the_exact_value() {
    on_fresh_thread("wait-value64", || {
        init();
        let _primary = primary_current();
        let want: u64 = 0x1234_5678_9abc_def0;
        let (flag, marker) = (Flag::releasing_to(want), HostWord::new());
        let s = stream_create(STREAM_NON_BLOCKING).check();
        stream_wait_value64(s, flag.dev(), want, STREAM_WAIT_VALUE_EQ).check();
        stream_write_value64(s, marker.dev(), u64::MAX - 1).check();
        flag.write64(want - 1);
        stream_query(s).fails_with(CudaErrorCode::NOT_READY);
        assert_eq!(marker.read64(), 0, "not equal yet: still waiting");
        flag.release();
        stream_synchronize(s).check();
        assert!(!flag.watchdog_fired());
        assert_eq!(marker.read64(), u64::MAX - 1);
        stream_destroy(s).check();
        flag.free();
        marker.free();
    });
}

/// Documented, and passed on the H200 on 2026-12-01 (bundle `d7f8154`): `cuCtxSynchronize` blocks until the context has completed all
/// preceding requested tasks, and `cuStreamDestroy` of a stream with queued work returns at once
/// while that work still runs; so a context synchronisation waits for the work of a stream
/// destroyed before it. The stream is held by a wait on a flag that another thread releases
/// (after a pause, so that a synchronisation that does not wait returns first and the case sees
/// it; the assertion is on order only: once the synchronisation has returned, the destroyed
/// stream's write is there). The emulator used to leave destroyed streams out of context and
/// device synchronisations: cuda.core's send-buffers IPC test then showed a false
/// `unordered_free` (a buffer filled on a stream destroyed before `Device.sync()`).
#[test]
fn basic_ctx_synchronize_waits_for_a_destroyed_streams_work() {
    on_fresh_thread("ctx-sync-destroyed", || {
        init();
        let _primary = primary_current();
        let (flag, marker) = (Arc::new(Flag::new()), HostWord::new());
        let s = stream_create(STREAM_NON_BLOCKING).check();
        stream_wait_value32(s, flag.dev(), 1, STREAM_WAIT_VALUE_GEQ).check();
        stream_write_value32(s, marker.dev(), MARKER).check();
        stream_destroy(s).check();
        assert_eq!(marker.read(), 0, "the write waits behind the wait");
        let releaser = {
            let flag = Arc::clone(&flag);
            std::thread::spawn(move || {
                std::thread::sleep(std::time::Duration::from_millis(200));
                flag.release();
            })
        };
        ctx_synchronize().check();
        let written = marker.read();
        releaser.join().expect("the releasing thread");
        assert!(!flag.watchdog_fired());
        assert_eq!(
            written, MARKER,
            "cuCtxSynchronize returned before the destroyed stream's work ran"
        );
        Arc::try_unwrap(flag)
            .unwrap_or_else(|_| panic!("the flag is still shared"))
            .free();
        marker.free();
    });
}
