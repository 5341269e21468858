//! The cleanup-error reporter (docs/decisions.md D3) and the cleanup-warning channel (D6).
//!
//! A failure on a path that cannot return it (a `Drop`, the deferred-cleanup worker) is handed
//! to a replaceable process-wide hook and counted. The default hook writes one line on stderr.
//! Hooks are called on whatever thread the cleanup ran on, never while this crate holds a lock
//! of its own, and only after the caller's context binding has been restored, so a hook may call
//! back into custody (or, in the Python layer, emit a warning) freely.

use std::fmt;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use cuda_sys::CudaErrorCode;

use crate::HandleError;

/// A cleanup that failed where no caller could receive the error, attributed to its resource.
///
/// Made by drops of the last handle, by the deferred-cleanup worker and by context restores
/// that failed. `CUDA_ERROR_DEINITIALIZED` (the driver shutting down at exit) is never
/// reported.
#[derive(Debug, Clone)]
pub struct CleanupError {
    /// What was being done: the driver function (`cuMemFreeAsync`, `cuStreamDestroy`) or
    /// `Deallocator::deallocate`. When the failure came from activating or restoring the
    /// context around it, [`HandleError::Driver`] names `cuCtxSetCurrent` as the call.
    pub operation: &'static str,
    /// The address being freed, or the raw handle being released (a stream, event, pool,
    /// graph or user object), as an integer.
    pub ptr: u64,
    /// The stream the operation ran on (a raw handle or a default-stream token), 0 for none.
    pub stream: u64,
    /// The context the operation ran in, 0 for none.
    pub context: u64,
    /// The failure.
    pub error: HandleError,
}

impl CleanupError {
    /// The driver's name for the failure (`CUDA_ERROR_INVALID_VALUE`).
    pub fn error_name(&self) -> &'static str {
        self.error.name()
    }
}

impl fmt::Display for CleanupError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}(0x{:x}) failed during cleanup (stream 0x{:x}, context 0x{:x}); the resource may have leaked: {}",
            self.operation, self.ptr, self.stream, self.context, self.error
        )
    }
}

/// What a [`CleanupWarning`] is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum CleanupWarningKind {
    /// A free recorded on the per-thread default stream ran on another host thread: it was
    /// issued on that thread's per-thread stream, so ordering it after the recording thread's
    /// work is the application's job (docs/decisions.md D6).
    PerThreadStreamOtherThread {
        /// The thread that recorded the recipe ([`crate::ThreadToken`] value).
        recorded_thread: u64,
        /// The thread the free ran on.
        freeing_thread: u64,
    },
    /// A buffer with a per-thread-default-stream recipe was retained by a graph: its free will
    /// run wherever the graph's cleanup runs, most likely on another thread (docs/decisions.md D6).
    PerThreadStreamRetainedByGraph {
        /// The thread that recorded the recipe.
        recorded_thread: u64,
    },
}

/// A cleanup that succeeded but could not keep a guarantee, attributed like [`CleanupError`].
#[derive(Debug, Clone)]
pub struct CleanupWarning {
    /// The operation that ran (`cuMemFreeAsync`).
    pub operation: &'static str,
    /// The address freed.
    pub ptr: u64,
    /// The stream token the operation ran on.
    pub stream: u64,
    /// The context it ran in.
    pub context: u64,
    /// What went wrong.
    pub kind: CleanupWarningKind,
}

impl fmt::Display for CleanupWarning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.kind {
            CleanupWarningKind::PerThreadStreamOtherThread {
                recorded_thread,
                freeing_thread,
            } => write!(
                f,
                "{}(0x{:x}) recorded on the per-thread default stream by thread {} ran on thread {} \
                 (context 0x{:x}): it is ordered on that thread's per-thread stream, not the recording \
                 thread's; ordering it after prior work is the application's job",
                self.operation, self.ptr, recorded_thread, freeing_thread, self.context
            ),
            CleanupWarningKind::PerThreadStreamRetainedByGraph { recorded_thread } => write!(
                f,
                "{}(0x{:x}): a buffer whose free is recorded on the per-thread default stream of \
                 thread {} is retained by a graph; its free will run on whichever thread releases \
                 the graph, on that thread's per-thread stream; ordering it is the application's job",
                self.operation, self.ptr, recorded_thread
            ),
        }
    }
}

type ErrorHook = Arc<dyn Fn(&CleanupError) + Send + Sync>;
type WarningHook = Arc<dyn Fn(&CleanupWarning) + Send + Sync>;

static ERROR_HOOK: RwLock<Option<ErrorHook>> = RwLock::new(None);
static WARNING_HOOK: RwLock<Option<WarningHook>> = RwLock::new(None);
static ERROR_COUNT: AtomicU64 = AtomicU64::new(0);
static WARNING_COUNT: AtomicU64 = AtomicU64::new(0);

/// Replaces the process-wide cleanup-error hook.
///
/// The hook runs on the thread where the cleanup failed (any user thread, the cleanup worker),
/// after the caller's context was restored and with no lock of this crate held; it may call
/// back into custody. A panic inside the hook is caught and written to stderr.
pub fn set_cleanup_error_hook(hook: Box<dyn Fn(&CleanupError) + Send + Sync>) {
    let hook: ErrorHook = Arc::from(hook);
    let old = ERROR_HOOK
        .write()
        .unwrap_or_else(|e| e.into_inner())
        .replace(hook);
    drop(old);
}

/// Restores the default cleanup-error hook (one line on stderr).
pub fn reset_cleanup_error_hook() {
    let old = ERROR_HOOK.write().unwrap_or_else(|e| e.into_inner()).take();
    drop(old);
}

/// How many cleanup errors this process has reported (`CUDA_ERROR_DEINITIALIZED` excluded).
pub fn cleanup_error_count() -> u64 {
    ERROR_COUNT.load(Ordering::Relaxed)
}

/// Replaces the process-wide cleanup-warning hook; same rules as [`set_cleanup_error_hook`].
pub fn set_cleanup_warning_hook(hook: Box<dyn Fn(&CleanupWarning) + Send + Sync>) {
    let hook: WarningHook = Arc::from(hook);
    let old = WARNING_HOOK
        .write()
        .unwrap_or_else(|e| e.into_inner())
        .replace(hook);
    drop(old);
}

/// Restores the default cleanup-warning hook (one line on stderr).
pub fn reset_cleanup_warning_hook() {
    let old = WARNING_HOOK
        .write()
        .unwrap_or_else(|e| e.into_inner())
        .take();
    drop(old);
}

/// How many cleanup warnings this process has reported.
pub fn cleanup_warning_count() -> u64 {
    WARNING_COUNT.load(Ordering::Relaxed)
}

/// Reports a cleanup failure: counts it and calls the hook, unless the driver is shutting down
/// (`CUDA_ERROR_DEINITIALIZED`). Must not be called while holding any lock of this crate.
pub(crate) fn report(error: CleanupError) {
    if error.error.code() == Some(CudaErrorCode::DEINITIALIZED) {
        return;
    }
    ERROR_COUNT.fetch_add(1, Ordering::Relaxed);
    let hook = ERROR_HOOK.read().unwrap_or_else(|e| e.into_inner()).clone();
    let outcome = catch_unwind(AssertUnwindSafe(|| match hook {
        Some(hook) => hook(&error),
        None => eprintln!("custody: cleanup error: {error}"),
    }));
    if outcome.is_err() {
        eprintln!("custody: the cleanup-error hook panicked while reporting: {error}");
    }
}

/// Reports a cleanup warning. Must not be called while holding any lock of this crate.
pub(crate) fn warn(warning: CleanupWarning) {
    WARNING_COUNT.fetch_add(1, Ordering::Relaxed);
    let hook = WARNING_HOOK
        .read()
        .unwrap_or_else(|e| e.into_inner())
        .clone();
    let outcome = catch_unwind(AssertUnwindSafe(|| match hook {
        Some(hook) => hook(&warning),
        None => eprintln!("custody: warning: {warning}"),
    }));
    if outcome.is_err() {
        eprintln!("custody: the cleanup-warning hook panicked while reporting: {warning}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cuda_sys::CudaError;

    fn sample(code: CudaErrorCode) -> CleanupError {
        CleanupError {
            operation: "cuMemFreeAsync",
            ptr: 0x1000,
            stream: 0x1,
            context: 0xabc,
            error: HandleError::Driver(CudaError {
                call: "cuMemFreeAsync",
                code,
                description: "test".into(),
            }),
        }
    }

    #[test]
    fn display_names_operation_pointer_stream_context_and_error() {
        let text = sample(CudaErrorCode::INVALID_VALUE).to_string();
        assert!(text.starts_with("cuMemFreeAsync(0x1000) failed"), "{text}");
        assert!(text.contains("stream 0x1"), "{text}");
        assert!(text.contains("context 0xabc"), "{text}");
        assert!(text.contains("CUDA_ERROR_INVALID_VALUE"), "{text}");
    }

    #[test]
    fn deinitialized_is_neither_counted_nor_reported() {
        // Only this test touches the counter inside the unit-test binary's reporter checks, and
        // DEINITIALIZED must leave it untouched whatever else runs.
        let before = cleanup_error_count();
        report(sample(CudaErrorCode::DEINITIALIZED));
        assert_eq!(cleanup_error_count(), before);
    }
}
