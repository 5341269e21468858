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

/// The environment variable that makes a run of an F24 held case the child that does the
/// driver calls ([`exiting_threads_held_work_then_legacy_free`]).
const F24_CHILD: &str = "CUSTODY_CONFORMANCE_F24_CHILD";

/// Set by the GPU runner in every program it runs under compute-sanitizer (`run.py
/// --sanitizer`): the sanitizer stands between the case and the driver.
const UNDER_SANITIZER: &str = "CUSTODY_UNDER_COMPUTE_SANITIZER";

/// How long [`basic_ctx_synchronize_waits_for_a_destroyed_streams_work`] lets `cuStreamDestroy`
/// take before it releases the destroyed stream's hold anyway (a destroy that waited for the
/// held work would otherwise wait for the flag's watchdog): a liveness bound, not a timing
/// expectation.
const DESTROY_BOUND: Duration = Duration::from_secs(5);

/// How long the child looks, once it has released the hold, for the exit to finish and for each
/// synchronisation after it to return: what it sees within it is reported, not asserted (not a
/// timing expectation; it keeps the case well inside the runner's per-test limit).
const AFTER_RELEASE_WINDOW: Duration = Duration::from_secs(20);

/// How long the parent waits for the child's last report, and then for the child to end by
/// itself before it kills it: a process whose thread is stuck in the driver's thread exit may
/// never end by itself, and the kill ends it whatever the driver does.
const CHILD_BOUND: Duration = Duration::from_secs(90);
const CHILD_EXIT_GRACE: Duration = Duration::from_secs(10);

/// One observation of the child, a line `f24: KEY=VALUE` on its standard output.
fn report(key: &str, value: impl std::fmt::Display) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "f24: {key}={value}");
    let _ = out.flush();
}

/// Whether `f` returns on a thread of its own within `bound` ("returned", or "not returned
/// within ..."; the thread is then left behind).
fn returns_within(name: &str, bound: Duration, f: impl FnOnce() + Send + 'static) -> String {
    let (tx, rx) = mpsc::channel();
    std::thread::Builder::new()
        .name(name.to_owned())
        .spawn(move || {
            f();
            let _ = tx.send(());
        })
        .expect("spawning a bounded thread");
    match rx.recv_timeout(bound) {
        Ok(()) => "returned".to_owned(),
        Err(mpsc::RecvTimeoutError::Timeout) => format!("not returned within {bound:?}"),
        Err(mpsc::RecvTimeoutError::Disconnected) => "panicked".to_owned(),
    }
}

/// The child's side of an F24 held case: the driver calls, each observation reported
/// ([`report`]) and none asserted, so that the parent sees everything, whatever this driver
/// (or a sanitizer in front of it) does. Thread A allocates from `pool` on its per-thread
/// stream, holds that stream with `cuStreamWaitValue32_v2` on a flag, queues a memset of the
/// allocation and a marker behind the wait, leaves its context and returns from its thread
/// function; thread B frees the allocation on `CU_STREAM_LEGACY` and writes a marker there.
/// While the flag is unset: A's stream, the legacy stream, both markers and A's exit (looked at
/// for [`EXIT_WINDOW`]). Then this thread releases the flag and reports the markers, the exit
/// (looked at for [`AFTER_RELEASE_WINDOW`]) and two synchronisations, each on a bounded thread.
/// With the exit finished it frees what it made; without, it leaves it (a stream may still poll
/// the flag) and the parent ends the process.
fn exiting_threads_held_work_child(own_pool: bool) {
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
        let ((ptr, pending), exited) = on_watched_thread("A", move || {
            init();
            ctx_set_current(ctx.get()).check();
            let ptr = mem_alloc_from_pool_async(N, pool.get(), CU_STREAM_PER_THREAD).check();
            stream_wait_value32(CU_STREAM_PER_THREAD, f.get(), 1, STREAM_WAIT_VALUE_GEQ).check();
            memset_d8_async(ptr, 0x5a, N, CU_STREAM_PER_THREAD).check();
            stream_write_value32(CU_STREAM_PER_THREAD, ma.get(), MARKER).check();
            let pending = stream_query(CU_STREAM_PER_THREAD).code;
            ctx_set_current(std::ptr::null_mut()).check();
            (ptr, pending)
        }); // A's thread function has returned; its exit may have to wait for the held work
        report("a_stream_before_its_exit", pending.name());

        // B runs on a thread of its own, looked at for EXIT_WINDOW: on the H200 (bundle
        // 431b19c) B's driver calls did not return while A's exit waited, so B reports each step
        // as it begins it, and the case goes on to the release whatever B does.
        let mb = Shared(marker_b.dev());
        let (b_tx, b_rx) = mpsc::channel();
        std::thread::Builder::new()
            .name("B".to_owned())
            .spawn(move || {
                report("b_step", "cuInit, cuCtxSetCurrent");
                init();
                ctx_set_current(ctx.get()).check();
                report("b_step", "cuMemFreeAsync(CU_STREAM_LEGACY)");
                mem_free_async(ptr, CU_STREAM_LEGACY).check();
                report("b_step", "cuStreamWriteValue32(CU_STREAM_LEGACY)");
                stream_write_value32(CU_STREAM_LEGACY, mb.get(), MARKER).check();
                report("b_step", "cuStreamQuery(CU_STREAM_LEGACY)");
                let legacy = stream_query(CU_STREAM_LEGACY).code;
                ctx_set_current(std::ptr::null_mut()).check();
                report("b_step", "done");
                let _ = b_tx.send(legacy);
            })
            .expect("spawning B");
        let b_while_held = b_rx.recv_timeout(EXIT_WINDOW);
        let legacy = match &b_while_held {
            Ok(code) => code.name().to_owned(),
            Err(_) => format!("B's calls not returned within {EXIT_WINDOW:?}"),
        };
        let written = |word: &HostWord| {
            if word.read() == MARKER {
                "written"
            } else {
                "unwritten"
            }
        };
        report("legacy_stream_while_held", &legacy);
        report("marker_a_while_held", written(&marker_a));
        report("marker_b_while_held", written(&marker_b));
        let exit_while_held = match exited.recv_timeout(EXIT_WINDOW) {
            Ok(true) => "finished",
            Ok(false) => "panicked",
            Err(_) => "not finished",
        };
        report("exit_while_held", exit_while_held);
        report("watchdog_before_release", flag.watchdog_fired());

        flag.release(); // by this thread: A is inside its exit, or has left it
        report("released", "by the case");
        let comes = |word: &HostWord| {
            if word.comes_to(MARKER) {
                "written"
            } else {
                "unwritten"
            }
        };
        report("marker_a_after_release", comes(&marker_a));
        if b_while_held.is_err() {
            report(
                "b_after_release",
                match b_rx.recv_timeout(AFTER_RELEASE_WINDOW) {
                    Ok(_) => "returned".to_owned(),
                    Err(_) => format!("not returned within {AFTER_RELEASE_WINDOW:?}"),
                },
            );
        }
        report("marker_b_after_release", comes(&marker_b));
        let finished = exit_while_held == "finished"
            || matches!(exited.recv_timeout(AFTER_RELEASE_WINDOW), Ok(true));
        report(
            "exit_after_release",
            if finished {
                "finished".to_owned()
            } else {
                format!("not finished within {AFTER_RELEASE_WINDOW:?}")
            },
        );
        report(
            "legacy_synchronize",
            returns_within("legacy-synchronize", AFTER_RELEASE_WINDOW, move || {
                init();
                ctx_set_current(ctx.get()).check();
                stream_synchronize(CU_STREAM_LEGACY).check();
                ctx_set_current(std::ptr::null_mut()).check();
            }),
        );
        report(
            "ctx_synchronize",
            returns_within("ctx-synchronize", AFTER_RELEASE_WINDOW, move || {
                init();
                ctx_set_current(ctx.get()).check();
                ctx_synchronize().check();
                ctx_set_current(std::ptr::null_mut()).check();
            }),
        );
        report("watchdog_at_the_end", flag.watchdog_fired());
        if finished {
            flag.free();
            marker_a.free();
            marker_b.free();
            if own_pool {
                mem_pool_destroy(pool.get()).check();
            }
        }
        report(
            "done",
            if finished {
                "freed"
            } else {
                "left to the process's end"
            },
        );
    });
}

/// What the child of an F24 held case reported, its output, and whether it ended by itself.
struct ChildRun {
    seen: std::collections::HashMap<String, String>,
    output: String,
    ended_by_itself: bool,
}

impl ChildRun {
    fn get(&self, key: &str) -> &str {
        self.seen.get(key).map_or("(not reported)", String::as_str)
    }
}

/// Runs `case` (its libtest name) as a child process with [`F24_CHILD`] set, collecting its
/// reports until `done` or [`CHILD_BOUND`], then waits [`CHILD_EXIT_GRACE`] for it to end by
/// itself and kills it if it has not. The parent makes no driver call.
fn run_child_case(case: &str) -> ChildRun {
    use std::io::{BufRead, Read};
    let mut child = std::process::Command::new(std::env::current_exe().expect("the test binary"))
        .args([case, "--exact", "--nocapture", "--test-threads=1"])
        .env(F24_CHILD, "1")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawning the child process");
    let (lines_tx, lines_rx) = mpsc::channel::<String>();
    let stdout = child.stdout.take().expect("the child's stdout");
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if lines_tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut stderr = child.stderr.take().expect("the child's stderr");
    let (err_tx, err_rx) = mpsc::channel::<String>();
    std::thread::spawn(move || {
        let mut text = String::new();
        let _ = stderr.read_to_string(&mut text);
        let _ = err_tx.send(text);
    });
    let deadline = std::time::Instant::now() + CHILD_BOUND;
    let (mut seen, mut output) = (std::collections::HashMap::new(), String::new());
    while let Some(left) = deadline.checked_duration_since(std::time::Instant::now()) {
        let Ok(line) = lines_rx.recv_timeout(left) else {
            break;
        };
        output.push_str(&line);
        output.push('\n');
        if let Some((key, value)) = line
            .find("f24: ") // libtest's "test NAME ... " may precede it on the first line
            .and_then(|at| line[at + "f24: ".len()..].split_once('='))
        {
            seen.insert(key.to_owned(), value.to_owned());
            if key == "done" {
                break;
            }
        }
    }
    let grace = std::time::Instant::now() + CHILD_EXIT_GRACE;
    let mut ended_by_itself = false;
    while std::time::Instant::now() < grace {
        if let Ok(Some(_)) = child.try_wait() {
            ended_by_itself = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    if !ended_by_itself {
        let _ = child.kill();
    }
    let status = child.wait().expect("waiting for the child");
    while let Ok(line) = lines_rx.recv_timeout(Duration::from_millis(100)) {
        output.push_str(&line);
        output.push('\n');
    }
    output.push_str(&err_rx.recv_timeout(CHILD_EXIT_GRACE).unwrap_or_default());
    output.push_str(&format!("[child: {status}]\n"));
    ChildRun {
        seen,
        output,
        ended_by_itself,
    }
}

/// F24 with the pending work made certain, in a child process so that a driver that never
/// finishes the exit cannot hang the case, nor its process's own exit (the GPU run of bundle
/// `7670e5d` on 2026-12-01: both held cases ran past the runner's 120 s in the former shape, in
/// which the case waited a minute for each step after the release and then ended its process
/// with the exiting thread still inside the driver). The child
/// ([`exiting_threads_held_work_child`]) reports; the assertions here are on order:
/// - while the flag is unset (only the child sets it, after these observations): A's stream is
///   not ready, A's marker is unwritten, B's legacy work waits for the exiting A's per-thread
///   work (F14: the legacy stream not ready, B's marker unwritten), and A's exit has not
///   finished (within [`EXIT_WINDOW`]); so if the exit finishes, it finishes after the release;
/// - after the release, A's work runs, then B's (both markers come).
///
/// On the H200 (2026-12-02, bundles `431b19c` and `4d31682`) B's first calls (`cuInit`,
/// `cuCtxSetCurrent`) did not return while A's exit waited, nor 20 s after A's held work had
/// run; then the child gets no further and the case accepts that it reported nothing more.
///
/// Whether the exit then finishes (within [`AFTER_RELEASE_WINDOW`]) and whether the legacy and
/// context synchronisations return is reported as an `observed:` line either way (the emulator
/// finishes it; on the H200 it had not finished a minute after the work could run, beside seven
/// other processes, which F24 records as not seen to finish), and the child is killed if it
/// does not end by itself.
///
/// Under compute-sanitizer ([`UNDER_SANITIZER`]) the driver's behaviour changes: in the same
/// run both cases failed because B's legacy stream was already complete while A's work was
/// held. There the ordering is not asserted, only that the child got through its steps and that
/// A's held work ran once released; what the sanitizer let be seen is reported.
fn exiting_threads_held_work_then_legacy_free(own_pool: bool, case: &str) {
    if std::env::var_os(F24_CHILD).is_some() {
        return exiting_threads_held_work_child(own_pool);
    }
    let under_sanitizer = std::env::var_os(UNDER_SANITIZER).is_some();
    let run = run_child_case(&case_name(case));
    let context = || format!("the child's output:\n{}", run.output);
    // B's calls still not returned after the release (the H200, twice on 2026-12-02): the child
    // cannot go on, reports nothing more and is killed.
    let b_stuck = run.get("b_after_release").starts_with("not returned");
    assert_eq!(
        run.get("done"),
        if b_stuck {
            "(not reported)"
        } else if run.get("exit_after_release") == "finished" {
            "freed"
        } else {
            "left to the process's end"
        },
        "the child did not get through its steps; {}",
        context()
    );
    assert_eq!(
        run.get("marker_a_after_release"),
        "written",
        "A's held work ran once released; {}",
        context()
    );
    assert_eq!(run.get("watchdog_before_release"), "false", "{}", context());
    // B's legacy work is not done while A's is held: its query says NOT_READY (the emulator,
    // and F24's first measurement), or B's calls themselves do not return while A's exit
    // waits (the H200 of 2026-12-02; which call, the `b_step` lines say).
    let b_blocked = run
        .get("legacy_stream_while_held")
        .starts_with("B's calls not returned");
    println!(
        "observed: while A's exit waited, B's driver calls {}",
        if b_blocked {
            format!("did not return (last step begun: {})", run.get("b_step"))
        } else {
            "returned".to_owned()
        }
    );
    let legacy_while_held = if b_blocked {
        run.get("legacy_stream_while_held")
    } else {
        "CUDA_ERROR_NOT_READY"
    };
    let ordering = [
        ("a_stream_before_its_exit", "CUDA_ERROR_NOT_READY"),
        ("marker_a_while_held", "unwritten"),
        ("legacy_stream_while_held", legacy_while_held),
        ("marker_b_while_held", "unwritten"),
        ("exit_while_held", "not finished"),
        (
            "marker_b_after_release",
            // B's marker comes after the release, unless B's calls still had not returned
            // (then B never queued it: reported, and the child is killed).
            if run.get("b_after_release").starts_with("not returned") {
                "unwritten"
            } else {
                "written"
            },
        ),
    ];
    if under_sanitizer {
        let differs: Vec<String> = ordering
            .iter()
            .filter(|(key, expected)| run.get(key) != *expected)
            .map(|(key, expected)| format!("{key}={} (without it: {expected})", run.get(key)))
            .collect();
        println!(
            "observed: under compute-sanitizer, F24's order {}",
            if differs.is_empty() {
                "held as without it".to_owned()
            } else {
                format!("could not be observed: {}", differs.join(", "))
            }
        );
    } else {
        for (key, expected) in ordering {
            assert_eq!(run.get(key), expected, "{key}; {}", context());
        }
    }
    println!(
        "observed: A's exit after the release: {}; cuStreamSynchronize(CU_STREAM_LEGACY): {}; \
         cuCtxSynchronize: {}; the child process {}",
        run.get("exit_after_release"),
        run.get("legacy_synchronize"),
        run.get("ctx_synchronize"),
        if run.ended_by_itself {
            "ended by itself"
        } else {
            "was killed"
        }
    );
}

/// [`exiting_threads_held_work_then_legacy_free`] with device 0's default pool (release
/// threshold 0, so a synchronisation may give its freed memory back), as custody's tests
/// allocate.
#[test]
fn f24_a_threads_exit_waits_for_its_held_per_thread_work_which_orders_a_legacy_free() {
    exiting_threads_held_work_then_legacy_free(
        false,
        "f24_a_threads_exit_waits_for_its_held_per_thread_work_which_orders_a_legacy_free",
    );
}

/// [`exiting_threads_held_work_then_legacy_free`] with a pool that keeps its memory across
/// synchronisations (the pool's release at synchronisation is not involved in F24: on the H200
/// both shapes held the exit alike).
#[test]
fn f24_a_threads_exit_waits_for_its_held_per_thread_work_which_orders_a_legacy_free_from_a_keeping_pool(
) {
    exiting_threads_held_work_then_legacy_free(
        true,
        "f24_a_threads_exit_waits_for_its_held_per_thread_work_which_orders_a_legacy_free_from_a_keeping_pool",
    );
}

/// The libtest name of a case of this module (`facts_ordering::<function>`), for `--exact`.
fn case_name(function: &str) -> String {
    let module = module_path!()
        .split_once("::")
        .map_or("", |(_, module)| module);
    format!("{module}::{function}")
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

/// Documented, and passed on the H200 on 2026-12-01 (bundle `d7f8154`): `cuCtxSynchronize`
/// blocks until the context has completed all preceding requested tasks, and `cuStreamDestroy`
/// of a stream with queued work returns at once while that work still runs; so a context
/// synchronisation waits for the work of a stream destroyed before it. The stream is held by a
/// wait on a flag that another thread releases (a moment after the destroy returned, so that a
/// synchronisation that does not wait returns first and the case sees it; or, should the
/// destroy itself wait for the work, after [`DESTROY_BOUND`]; the assertions are on order only:
/// the destroy returned before the write ran, and once the synchronisation has returned the
/// destroyed stream's write is there). The emulator used to leave destroyed streams out of
/// context and device synchronisations: cuda.core's send-buffers IPC test then showed a false
/// `unordered_free` (a buffer filled on a stream destroyed before `Device.sync()`).
///
/// Under compute-sanitizer ([`UNDER_SANITIZER`]) this case failed in the GPU run of bundle
/// `7670e5d` (2026-12-01; which step was not kept). There a step that does not go as above is
/// reported as an `observed:` line instead of failing the case, and the case then waits for
/// the write before it frees the flag and the marker.
#[test]
fn basic_ctx_synchronize_waits_for_a_destroyed_streams_work() {
    on_fresh_thread("ctx-sync-destroyed", || {
        init();
        let _primary = primary_current();
        let under_sanitizer = std::env::var_os(UNDER_SANITIZER).is_some();
        let (flag, marker) = (Arc::new(Flag::new()), HostWord::new());
        let s = stream_create(STREAM_NON_BLOCKING).check();
        stream_wait_value32(s, flag.dev(), 1, STREAM_WAIT_VALUE_GEQ).check();
        stream_write_value32(s, marker.dev(), MARKER).check();
        let (destroyed_tx, destroyed_rx) = mpsc::channel::<()>();
        let releaser = {
            let flag = Arc::clone(&flag);
            std::thread::spawn(move || {
                // Released after the destroy returned (and a moment, for a synchronisation
                // that does not wait to return first), or by the bound if it does not return.
                let returned = destroyed_rx.recv_timeout(DESTROY_BOUND).is_ok();
                if returned {
                    std::thread::sleep(Duration::from_millis(200));
                }
                flag.release();
                returned
            })
        };
        stream_destroy(s).check();
        let destroy_returned_first = marker.read() == 0; // read before the releaser may go on
        let _ = destroyed_tx.send(());
        ctx_synchronize().check();
        let written = marker.read();
        let released_after_the_destroy = releaser.join().expect("the releasing thread");
        assert!(!flag.watchdog_fired());
        let steps = [
            (
                destroy_returned_first && released_after_the_destroy,
                "cuStreamDestroy returned before its stream's held work ran",
            ),
            (
                written == MARKER,
                "cuCtxSynchronize returned after the destroyed stream's work ran",
            ),
        ];
        for (held, step) in steps {
            if under_sanitizer && !held {
                println!("observed: under compute-sanitizer, not so: {step}");
            } else {
                assert!(held, "not so: {step}");
            }
        }
        assert!(marker.comes_to(MARKER), "the destroyed stream's work ran");
        Arc::try_unwrap(flag)
            .unwrap_or_else(|_| panic!("the flag is still shared"))
            .free();
        marker.free();
    });
}
