//! Shared helpers for the handles integration tests: the emulator, contexts, call-log filters
//! and a capturing cleanup hook. Every test runs against the emulated driver
//! (`CUSTODY_CUDA_DRIVER=.../libcuda_emu.so`) and filters the process-wide logs by its own
//! threads and pointers, so tests pass one per process (nextest) and all in one process.

#![allow(dead_code)]

use std::sync::{Mutex, OnceLock};

use cuda_sys::emu::{Call, Emulator};
use handles::{
    CleanupError, CleanupWarning, ContextHandle, DevicePtrHandle, HandleError, MemoryPoolHandle,
};

/// The emulator's test interface. These tests observe the driver through its call log and
/// hazard checker, which only the emulator has: without it they fail with this message rather
/// than pass silently.
pub fn emu() -> Emulator {
    Emulator::get().expect(
        "the handles integration tests need the emulated driver: build it with \
         `cargo build -p cuda-emu` and set CUSTODY_CUDA_DRIVER=$PWD/target/debug/libcuda_emu.so",
    )
}

/// The calling thread's id in the call log.
pub fn tid() -> u64 {
    emu().thread_id()
}

/// The first call's sequence number from now on: calls with `seq >= mark()` came later.
pub fn mark() -> u64 {
    emu().calls().last().map_or(0, |c| c.seq + 1)
}

/// Calls made since `from` on thread `thread`, in order.
pub fn calls_on(thread: u64, from: u64) -> Vec<Call> {
    emu()
        .calls()
        .into_iter()
        .filter(|c| c.thread == thread && c.seq >= from)
        .collect()
}

/// Calls made since `from` (any thread) whose pointer argument is `ptr`.
pub fn calls_for(ptr: u64, from: u64) -> Vec<Call> {
    emu()
        .calls()
        .into_iter()
        .filter(|c| c.ptr == Some(ptr) && c.seq >= from)
        .collect()
}

/// The calls since `from` on `thread`, as function names.
pub fn names_on(thread: u64, from: u64) -> Vec<String> {
    calls_on(thread, from)
        .into_iter()
        .map(|c| c.function)
        .collect()
}

/// The one call of `function` with pointer `ptr` since `from`.
pub fn only_call(function: &str, ptr: u64, from: u64) -> Call {
    let calls: Vec<Call> = calls_for(ptr, from)
        .into_iter()
        .filter(|c| c.function == function)
        .collect();
    assert_eq!(
        calls.len(),
        1,
        "expected one {function}(0x{ptr:x}), got {calls:?}"
    );
    calls.into_iter().next().unwrap()
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
pub fn on_fresh_thread<R: Send + 'static>(f: impl FnOnce() -> R + Send + 'static) -> R {
    std::thread::spawn(f).join().expect("test thread panicked")
}

/// A thread-safe record of every cleanup error and warning reported in this process.
pub struct Captured {
    pub errors: Mutex<Vec<CleanupError>>,
    pub warnings: Mutex<Vec<CleanupWarning>>,
}

/// Installs (once per process) hooks that record every report; tests filter by pointer.
pub fn captured() -> &'static Captured {
    static CAPTURED: OnceLock<Captured> = OnceLock::new();
    static INSTALLED: OnceLock<()> = OnceLock::new();
    let captured = CAPTURED.get_or_init(|| Captured {
        errors: Mutex::new(Vec::new()),
        warnings: Mutex::new(Vec::new()),
    });
    INSTALLED.get_or_init(|| {
        handles::set_cleanup_error_hook(Box::new(|e| {
            captured_errors_push(e.clone());
        }));
        handles::set_cleanup_warning_hook(Box::new(|w| {
            captured_warnings_push(w.clone());
        }));
    });
    captured
}

fn captured_errors_push(e: CleanupError) {
    captured().errors.lock().unwrap().push(e);
}

fn captured_warnings_push(w: CleanupWarning) {
    captured().warnings.lock().unwrap().push(w);
}

/// The cleanup errors reported for `ptr`.
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

/// The cleanup warnings reported for `ptr`.
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

/// Serialises the tests of one process: fault injection, the hazard list and the deferred
/// queue are process-wide, so a test holds this guard from [`start`] to its end.
static SERIAL: Mutex<()> = Mutex::new(());

/// Starts a test: the returned guard serialises it with the other tests of this process; no
/// context current on the calling thread, hooks installed, earlier deferred work finished, hazards and faults cleared.
#[must_use = "hold the guard for the whole test"]
pub fn start() -> std::sync::MutexGuard<'static, ()> {
    let guard = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let _ = captured();
    // With one test thread, tests share the main thread: start each with no context.
    while current_raw() != 0 {
        ContextHandle::clear_current().expect("cuCtxSetCurrent(NULL)");
    }
    handles::drain_deferred_cleanup();
    emu().clear_faults();
    emu().clear_hazards();
    guard
}

/// Asserts the hazard checker saw nothing involving `ptrs` (and, in practice, nothing at all
/// since [`start`]).
pub fn assert_no_hazards() {
    let hazards = emu().hazards();
    assert!(hazards.is_empty(), "hazards: {hazards:#?}");
}

/// Whether the emulator still holds an allocation at `ptr`.
pub fn is_live(ptr: u64) -> bool {
    emu().live_allocations().iter().any(|a| a.ptr == ptr)
}

/// Device 0's default pool.
pub fn default_pool() -> MemoryPoolHandle {
    MemoryPoolHandle::device_default(0).expect("default pool")
}

/// Allocates 256 bytes from device 0's default pool on `stream`.
pub fn pool_buffer(stream: &handles::StreamHandle) -> Result<DevicePtrHandle, HandleError> {
    DevicePtrHandle::alloc_from_pool(256, &default_pool(), stream)
}

/// The one successful call of `function` on `thread` since `from`.
pub fn one_call_on(thread: u64, function: &str, from: u64) -> Call {
    let calls: Vec<Call> = calls_on(thread, from)
        .into_iter()
        .filter(|c| c.function == function)
        .collect();
    assert_eq!(
        calls.len(),
        1,
        "expected one {function} on thread {thread}, got {calls:?}"
    );
    calls.into_iter().next().unwrap()
}
