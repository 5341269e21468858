//! The integration tests' shared helpers: the emulator when it is the loaded driver, skip
//! helpers, call-log filters, contexts and threads, serialisation of a process's tests, and a
//! record of every cleanup report.
//!
//! A test that needs the emulator or a second device to run at all says so on stderr and
//! returns ("skipped ...": [`emulator_or_skip`], [`second_device_or_skip`]); one that needs
//! them for a part only runs the rest and says "partly skipped ..." ([`emulator_or_skip_rest`],
//! [`second_device_or_skip_part`]), which the GPU runner counts as a pass, not a skip. Tests
//! serialise through [`start`] and filter the process-wide logs by their own pointers and
//! threads, so they pass one per process (nextest, the GPU runner) and all in one process
//! (`--test-threads=1`).
//!
//! `CUSTODY_TEST_PRETEND_REAL_DRIVER=1` makes [`emulator`] answer `None` while the emulator is
//! loaded, so the real-driver branches run (and are checked) on a machine without a GPU; with
//! `CUSTODY_EMU_DEVICE_COUNT=1` as well, the one-device branches run too (docs/testing.md).

use std::sync::{Mutex, MutexGuard, OnceLock};

use handles::PointerAttributes;
use handles::{CleanupError, CleanupWarning, ContextHandle};

use crate::emu::{AllocationId, Call, Emulator, Hazard};

/// Set (to anything but `0`) to make the tests treat the emulator as a real driver.
pub const PRETEND_REAL_DRIVER: &str = "CUSTODY_TEST_PRETEND_REAL_DRIVER";

/// The emulator's test interface when the loaded driver is the emulator (and
/// [`PRETEND_REAL_DRIVER`] is not set); `None` for a real driver.
///
/// # Panics
/// When no driver loads at all: the tests fail with the loader's reason rather than pass
/// vacuously.
pub fn emulator() -> Option<Emulator> {
    if let Err(error) = cuda_sys::driver() {
        panic!(
            "the integration tests need a CUDA driver: {error} (for the emulator, run \
             `cargo build -p cuda-custody-emu` and set \
             CUSTODY_CUDA_DRIVER=$PWD/target/debug/libcuda_emu.so)"
        );
    }
    if std::env::var_os(PRETEND_REAL_DRIVER).is_some_and(|v| v != "0") {
        return None;
    }
    Emulator::get()
}

/// Runs the emulator-only assertions in `f` when the emulator is the loaded driver.
pub fn with_emulator<R>(f: impl FnOnce(&Emulator) -> R) -> Option<R> {
    emulator().map(|emu| f(&emu))
}

/// The emulator, or `None` after printing why the calling test skips on a real driver.
/// `needs` completes "needs the emulator's ...".
pub fn emulator_or_skip(needs: &str) -> Option<Emulator> {
    let emu = emulator();
    if emu.is_none() {
        eprintln!("skipped on a real driver: needs the emulator's {needs}");
    }
    emu
}

/// [`emulator_or_skip`] for the rest of a test whose first part ran on any driver: prints
/// "partly skipped ...", which the GPU runner does not count as a skip (the test passed what it
/// could check).
pub fn emulator_or_skip_rest(needs: &str) -> Option<Emulator> {
    let emu = emulator();
    if emu.is_none() {
        eprintln!("partly skipped on a real driver: the rest needs the emulator's {needs}");
    }
    emu
}

/// Whether the driver sees at least two devices; when not, prints why the calling test skips.
pub fn second_device_or_skip(needs: &str) -> bool {
    let count = handles::device_count().expect("cuDeviceGetCount");
    if count < 2 {
        eprintln!("skipped: needs a second device for {needs}; the driver sees {count}");
    }
    count >= 2
}

/// [`second_device_or_skip`] for a part of a test (the rest runs with one device): when there
/// is no second device, prints "partly skipped ...", which the GPU runner does not count as a
/// skip.
pub fn second_device_or_skip_part(part: &str) -> bool {
    let count = handles::device_count().expect("cuDeviceGetCount");
    if count < 2 {
        eprintln!("partly skipped: needs a second device for {part}; the driver sees {count}");
    }
    count >= 2
}

/// The calling thread's id in the call log; 0 without the emulator (then nothing reads it).
pub fn tid() -> u64 {
    with_emulator(|emu| emu.thread_id()).unwrap_or(0)
}

/// The sequence number of the next call: calls with `seq >= mark()` come later. 0 without the
/// emulator (then nothing reads it).
pub fn mark() -> u64 {
    with_emulator(|emu| emu.calls().last().map_or(0, |c| c.seq + 1)).unwrap_or(0)
}

/// The identity of the live allocation at `ptr` (`AllocationId(0)` without the emulator: then
/// nothing reads it). Take it while the allocation is live and follow the allocation by it from
/// then on: a pool hands a freed address out again (docs/driver-facts.md F18), so the address
/// alone does not say which allocation a call, a hazard or a live entry belongs to.
///
/// # Panics
/// On the emulator, when no live allocation starts at `ptr`.
pub fn alloc_of(ptr: u64) -> AllocationId {
    with_emulator(|emu| emu.alloc_id(ptr)).unwrap_or(AllocationId(0))
}

/// Queries of the emulator's call log, hazards and allocations, for use inside
/// [`with_emulator`]. Allocations are named by identity ([`alloc_of`]), never by address.
pub trait EmuLog {
    /// Calls since `from` (any thread).
    fn calls_since(&self, from: u64) -> Vec<Call>;
    /// Calls made since `from` on thread `thread`, in order.
    fn calls_on(&self, thread: u64, from: u64) -> Vec<Call>;
    /// The identity of the live allocation at `ptr`.
    fn alloc_id(&self, ptr: u64) -> AllocationId;
    /// Calls since `from` (any thread) that made allocation `alloc` or whose pointer argument
    /// was in it.
    fn calls_for(&self, alloc: AllocationId, from: u64) -> Vec<Call>;
    /// Calls since `from` (any thread) whose pointer argument was `ptr`: a question about an
    /// address (one that was never allocated, say), not about an allocation.
    fn calls_at(&self, ptr: u64, from: u64) -> Vec<Call>;
    /// Calls of `function` since `from` on `thread`.
    fn calls_named_on(&self, function: &str, thread: u64, from: u64) -> Vec<Call>;
    /// Calls of `function` since `from` (any thread).
    fn calls_named(&self, function: &str, from: u64) -> Vec<Call>;
    /// The calls since `from` on `thread`, as function names.
    fn names_on(&self, thread: u64, from: u64) -> Vec<String>;
    /// The one call of `function` for allocation `alloc` since `from`.
    fn only_call(&self, function: &str, alloc: AllocationId, from: u64) -> Call;
    /// The one call of `function` on `thread` since `from`.
    fn one_call_on(&self, thread: u64, function: &str, from: u64) -> Call;
    /// How many calls of `function` for allocation `alloc` since `from`.
    fn count_calls(&self, function: &str, alloc: AllocationId, from: u64) -> usize;
    /// The sequence numbers of the calls of `function` since `from` (any thread).
    fn seq_of(&self, function: &str, from: u64) -> Vec<u64>;
    /// The hazards the checker saw for allocation `alloc` since [`start`].
    fn hazards_for(&self, alloc: AllocationId) -> Vec<Hazard>;
    /// Whether allocation `alloc` is still live.
    fn is_live(&self, alloc: AllocationId) -> bool;
}

/// The one call of `function` in `calls`; panics, saying whose calls they were (`whose`), when
/// there is not exactly one.
fn the_one(mut calls: Vec<Call>, function: &str, whose: &str) -> Call {
    assert_eq!(
        calls.len(),
        1,
        "expected one {function} {whose}, got {calls:#?}"
    );
    calls.pop().unwrap()
}

impl EmuLog for Emulator {
    fn calls_since(&self, from: u64) -> Vec<Call> {
        self.calls().into_iter().filter(|c| c.seq >= from).collect()
    }

    fn calls_on(&self, thread: u64, from: u64) -> Vec<Call> {
        self.calls()
            .into_iter()
            .filter(|c| c.thread == thread && c.seq >= from)
            .collect()
    }

    fn alloc_id(&self, ptr: u64) -> AllocationId {
        self.allocation_at(ptr)
            .unwrap_or_else(|| panic!("no live allocation at {ptr:#x}"))
            .id
    }

    fn calls_for(&self, alloc: AllocationId, from: u64) -> Vec<Call> {
        self.calls()
            .into_iter()
            .filter(|c| c.alloc == Some(alloc) && c.seq >= from)
            .collect()
    }

    fn calls_named_on(&self, function: &str, thread: u64, from: u64) -> Vec<Call> {
        self.calls()
            .into_iter()
            .filter(|c| c.function == function && c.thread == thread && c.seq >= from)
            .collect()
    }

    fn calls_named(&self, function: &str, from: u64) -> Vec<Call> {
        self.calls()
            .into_iter()
            .filter(|c| c.function == function && c.seq >= from)
            .collect()
    }

    fn names_on(&self, thread: u64, from: u64) -> Vec<String> {
        self.calls_on(thread, from)
            .into_iter()
            .map(|c| c.function)
            .collect()
    }

    fn calls_at(&self, ptr: u64, from: u64) -> Vec<Call> {
        self.calls()
            .into_iter()
            .filter(|c| c.ptr == Some(ptr) && c.seq >= from)
            .collect()
    }

    fn only_call(&self, function: &str, alloc: AllocationId, from: u64) -> Call {
        let calls = self
            .calls_for(alloc, from)
            .into_iter()
            .filter(|c| c.function == function)
            .collect();
        the_one(calls, function, &format!("of {alloc}"))
    }

    fn one_call_on(&self, thread: u64, function: &str, from: u64) -> Call {
        let calls = self.calls_named_on(function, thread, from);
        the_one(calls, function, &format!("on thread {thread}"))
    }

    fn count_calls(&self, function: &str, alloc: AllocationId, from: u64) -> usize {
        self.calls_for(alloc, from)
            .iter()
            .filter(|c| c.function == function)
            .count()
    }

    fn seq_of(&self, function: &str, from: u64) -> Vec<u64> {
        self.calls()
            .into_iter()
            .filter(|c| c.seq >= from && c.function == function)
            .map(|c| c.seq)
            .collect()
    }

    fn hazards_for(&self, alloc: AllocationId) -> Vec<Hazard> {
        self.hazards()
            .into_iter()
            .filter(|h| h.alloc == Some(alloc))
            .collect()
    }

    fn is_live(&self, alloc: AllocationId) -> bool {
        self.allocation_is_live(alloc)
    }
}

/// Device `n`'s primary context (retained).
pub fn primary(n: i32) -> ContextHandle {
    ContextHandle::primary(n).expect("primary context")
}

/// The raw context current on the calling thread as the driver reports it (0 for none).
pub fn current_raw() -> u64 {
    ContextHandle::current()
        .expect("cuCtxGetCurrent")
        .map_or(0, |c| c.raw() as u64)
}

/// Runs `f` on a new thread that has never had a context, and returns its result.
///
/// The thread ends when `f` returns: `f` must leave nothing pending on its per-thread default
/// stream (a real driver holds the thread's exit until that work has run, for minutes beside
/// other processes: docs/driver-facts.md F24). A thread whose per-thread work must stay pending
/// while the test goes on is [`on_parked_thread`]'s.
pub fn on_fresh_thread<R: Send + 'static>(f: impl FnOnce() -> R + Send + 'static) -> R {
    std::thread::spawn(f).join().expect("test thread panicked")
}

/// Runs `f` on a new thread that has never had a context and returns its result, while the
/// thread stays alive, parked, until [`ParkedThread::finish`] (or the value's drop): then it makes
/// `context` current, synchronises its per-thread default stream, clears its context and ends.
/// For a test whose recording thread leaves work pending on its per-thread stream while another
/// thread frees: the thread must not end with that work pending (docs/driver-facts.md F24).
pub fn on_parked_thread<R: Send + 'static>(
    context: &ContextHandle,
    f: impl FnOnce() -> R + Send + 'static,
) -> (R, ParkedThread) {
    let context = context.clone();
    let (value_tx, value_rx) = std::sync::mpsc::channel();
    let (finish, finish_rx) = std::sync::mpsc::channel::<()>();
    let thread = std::thread::spawn(move || {
        let _ = value_tx.send(f());
        let _ = finish_rx.recv();
        context.make_current().expect("cuCtxSetCurrent");
        handles::StreamHandle::per_thread()
            .synchronize()
            .expect("cuStreamSynchronize(CU_STREAM_PER_THREAD)");
        ContextHandle::clear_current().expect("cuCtxSetCurrent(NULL)");
    });
    match value_rx.recv() {
        Ok(value) => (
            value,
            ParkedThread {
                finish: Some(finish),
                thread: Some(thread),
            },
        ),
        Err(_) => {
            let panic = thread.join().expect_err("the thread ended without a value");
            std::panic::resume_unwind(panic)
        }
    }
}

/// The thread of [`on_parked_thread`], parked until [`ParkedThread::finish`].
pub struct ParkedThread {
    finish: Option<std::sync::mpsc::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl ParkedThread {
    /// Lets the thread synchronise its per-thread default stream and end, and joins it.
    ///
    /// # Panics
    /// If the thread panicked (its synchronisation failed).
    pub fn finish(mut self) {
        self.end();
    }

    fn end(&mut self) {
        self.finish.take();
        if let Some(thread) = self.thread.take() {
            if let Err(panic) = thread.join() {
                if !std::thread::panicking() {
                    std::panic::resume_unwind(panic);
                }
            }
        }
    }
}

impl Drop for ParkedThread {
    fn drop(&mut self) {
        self.end();
    }
}

/// What the driver knows about `ptr` (`None`: an address it does not know, such as memory
/// freed with `cuMemFree` or `cuMemFreeHost`).
pub fn attributes(ptr: u64) -> Option<PointerAttributes> {
    handles::pointer_attributes(ptr).expect("cuPointerGetAttributes")
}

/// A thread-safe record of every cleanup error and warning reported in this process.
pub struct Captured {
    /// Every cleanup error, in report order.
    pub errors: Mutex<Vec<CleanupError>>,
    /// Every cleanup warning, in report order.
    pub warnings: Mutex<Vec<CleanupWarning>>,
}

/// Installs (once per process) hooks that record every report; tests filter by pointer.
pub fn captured() -> &'static Captured {
    static CAPTURED: OnceLock<Captured> = OnceLock::new();
    static INSTALLED: OnceLock<()> = OnceLock::new();
    let all = CAPTURED.get_or_init(|| Captured {
        errors: Mutex::new(Vec::new()),
        warnings: Mutex::new(Vec::new()),
    });
    INSTALLED.get_or_init(|| {
        handles::set_cleanup_error_hook(Box::new(|e| {
            captured().errors.lock().unwrap().push(e.clone());
        }));
        handles::set_cleanup_warning_hook(Box::new(|w| {
            captured().warnings.lock().unwrap().push(w.clone());
        }));
    });
    all
}

/// The cleanup errors reported for `ptr` since [`start`].
pub fn errors_for(ptr: u64) -> Vec<CleanupError> {
    captured()
        .errors
        .lock()
        .unwrap()
        .iter()
        .filter(|e| e.ptr == ptr)
        .cloned()
        .collect()
}

/// The cleanup warnings reported for `ptr` since [`start`].
pub fn warnings_for(ptr: u64) -> Vec<CleanupWarning> {
    captured()
        .warnings
        .lock()
        .unwrap()
        .iter()
        .filter(|w| w.ptr == ptr)
        .cloned()
        .collect()
}

/// Serialises the tests of one process: fault injection, the hazard list, the deferred queue
/// and a device pool's used memory are process-wide, so a test holds this guard from [`start`]
/// to its end.
static SERIAL: Mutex<()> = Mutex::new(());

/// A running test, from [`start`]: serialises it with the other tests of this process, and at
/// its end (unless the test is panicking) finishes the deferred work it left, so that nothing it
/// freed is still queued when the process exits (a leak check under compute-sanitizer then sees
/// only what the test really left allocated: docs/testing.md).
#[must_use = "hold the guard for the whole test"]
pub struct TestGuard {
    _serial: MutexGuard<'static, ()>,
}

impl Drop for TestGuard {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            handles::drain_deferred_cleanup();
        }
    }
}

/// Starts a test: the returned guard serialises it with the other tests of this process (and
/// drains deferred cleanup at its end, [`TestGuard`]); no context current on the calling thread,
/// the stack-dump handler installed ([`crate::stacks::dump_stacks_on_signal`]), the report hooks
/// installed, earlier deferred work finished and, on the emulator, hazards and faults cleared.
pub fn start() -> TestGuard {
    // Before anything that could hang: the GPU runner asks a hung test for its stacks.
    crate::stacks::dump_stacks_on_signal();
    let guard = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    // First, so that a missing driver fails with the loader's reason.
    let emu = emulator();
    let _ = captured();
    // With one test thread, tests share the main thread: start each with no context.
    while current_raw() != 0 {
        ContextHandle::clear_current().expect("cuCtxSetCurrent(NULL)");
    }
    handles::drain_deferred_cleanup();
    // Reports are found by pointer, and a pool hands an address out again
    // (docs/driver-facts.md F18): only this test's reports may match its pointers.
    captured().errors.lock().unwrap().clear();
    captured().warnings.lock().unwrap().clear();
    if let Some(emu) = emu {
        emu.clear_faults();
        emu.clear_hazards();
    }
    TestGuard { _serial: guard }
}

/// On the emulator, asserts the hazard checker saw nothing since [`start`]; a real driver has
/// no hazard checker.
pub fn assert_no_hazards() {
    with_emulator(|emu| {
        let hazards = emu.hazards();
        assert!(hazards.is_empty(), "hazards: {hazards:#?}");
    });
}
