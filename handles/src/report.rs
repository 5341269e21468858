//! The cleanup-error reporter (docs/decisions.md D3) and the cleanup-warning channel (D6): one
//! report path, [`report`], for every failure no caller can receive.
//!
//! A failure on a path that cannot return it (a `Drop`, the deferred-cleanup worker) is handed
//! to a replaceable process-wide hook and counted. The default hook writes one line on stderr.
//! Hooks are called on whatever thread the cleanup ran on, never while this crate holds a lock
//! of its own, and only after the caller's context binding has been restored, so a hook may call
//! back into custody (or, in the Python layer, emit a warning) freely.

use std::borrow::Cow;
use std::cell::RefCell;
use std::fmt;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use cuda_sys::CudaErrorCode;

use crate::error::HandleError;

/// Which step of a cleanup failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum CleanupStep {
    /// Making the context the operation needs current (`cuCtxGetCurrent`, `cuCtxSetCurrent`):
    /// the operation did not run.
    ActivateContext,
    /// The operation itself (the free, the destroy, a deallocator, or a wait it needs first).
    Operation,
    /// Putting the thread's previous context back afterwards (`cuCtxSetCurrent`).
    RestoreContext,
    /// Recording the event that orders a deferred synchronous free (docs/decisions.md D9).
    Ordering,
}

/// What a failed cleanup means for its resource.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Consequence {
    /// Nothing was released: the resource has leaked (it stays until the process exits).
    Leaked,
    /// The resource was released (freed, destroyed); only a later step failed (with
    /// [`CleanupStep::RestoreContext`]: the thread was left with the cleanup's context current).
    Released,
    /// No resource was involved, and the thread was left with the cleanup's context current
    /// (a [`crate::ContextScope`] dropped, or an explicit operation that already returned its
    /// own error).
    ContextNotRestored,
    /// The free could not be ordered by an event: it will wait for all work of its context
    /// (`cuCtxSynchronize`) instead, on the cleanup worker.
    OrderedByContextSynchronize,
    /// The resource could not be handed back by a graph: the graph keeps it until the graph is
    /// destroyed, and it is released then.
    KeptByGraph,
    /// The free could not be handed to the graph being captured on its stream: it waits until
    /// the capture is over and is retried then (docs/decisions.md D11).
    Deferred,
    /// Ending a stream capture nobody will end (a graph builder dropped while building) failed,
    /// and the stream is still being captured: work issued on it is recorded, not run, and what
    /// the capture recorded and retained stays until the capture is ended.
    StillCapturing,
    /// Whether the resource was released cannot be known: a [`Deallocator`](crate::Deallocator)
    /// panicked after taking its allocation out of custody's sight
    /// ([`OwnedAllocation::into_raw`](crate::OwnedAllocation::into_raw), or passing it on), so
    /// it may have freed the memory by its own means before panicking, or not.
    Unknown,
}

/// A cleanup that failed where no caller could receive the error: what it was about (the
/// resource as its user knows it, the operation), which step failed, and what that means
/// (released, leaked, context not restored).
///
/// Made by drops of the last handle, by the deferred-cleanup worker and by context restores
/// that failed. `CUDA_ERROR_DEINITIALIZED` (the driver shutting down at exit) is never
/// reported.
#[derive(Debug, Clone)]
pub struct CleanupError {
    /// The resource: a [`Deallocator`](crate::Deallocator)'s
    /// [`name`](crate::Deallocator::name) (a memory resource's class), or what custody made
    /// (`pool allocation`, `pinned host allocation`, `stream`, `event`, `graph`, ...).
    pub resource: Cow<'static, str>,
    /// The operation: the driver function (`cuMemFreeAsync`, `cuStreamDestroy_v2`) or
    /// `deallocate`.
    pub operation: &'static str,
    /// Which step failed; [`CleanupError::error`] names the driver call.
    pub step: CleanupStep,
    /// What the failure means for the resource.
    pub consequence: Consequence,
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
    /// `subject`'s failure at `step`, with its `consequence`.
    pub(crate) fn of(
        subject: Subject,
        step: CleanupStep,
        consequence: Consequence,
        error: HandleError,
    ) -> CleanupError {
        let Subject {
            resource,
            operation,
            ptr,
            stream,
            context,
        } = subject;
        CleanupError {
            resource,
            operation,
            step,
            consequence,
            ptr,
            stream,
            context,
            error,
        }
    }

    /// The driver's name for the failure (`CUDA_ERROR_INVALID_VALUE`).
    pub fn error_name(&self) -> &'static str {
        self.error.name()
    }

    /// Whether the resource was released despite the failure.
    pub fn released(&self) -> bool {
        self.consequence == Consequence::Released
    }

    /// Whether the thread's context binding is as it was before the cleanup.
    pub fn context_restored(&self) -> bool {
        self.step != CleanupStep::RestoreContext
    }
}

impl fmt::Display for CleanupError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}(0x{:x}) [{}] on stream 0x{:x} in context 0x{:x}",
            self.operation, self.ptr, self.resource, self.stream, self.context
        )?;
        f.write_str(match self.step {
            CleanupStep::ActivateContext => ": making its context current failed",
            CleanupStep::Operation => " failed",
            CleanupStep::RestoreContext => ": restoring the thread's previous context failed",
            CleanupStep::Ordering => ": recording the event that orders the free failed",
        })?;
        write!(f, ": {}; ", self.error)?;
        match self.consequence {
            Consequence::Leaked => f.write_str("nothing was released: it has leaked"),
            Consequence::Released if self.step == CleanupStep::RestoreContext => write!(
                f,
                "it was released, but the thread was left with context 0x{:x} current",
                self.context
            ),
            Consequence::Released => f.write_str("it was released"),
            Consequence::ContextNotRestored => write!(
                f,
                "the thread was left with context 0x{:x} current",
                self.context
            ),
            Consequence::OrderedByContextSynchronize => f.write_str(
                "the free will wait for all work of the context instead, on the cleanup worker",
            ),
            Consequence::KeptByGraph => f.write_str(
                "the graph keeps it until the graph is destroyed, and it is released then",
            ),
            Consequence::Deferred => f.write_str(
                "the free waits until the stream's capture is over, and is retried then",
            ),
            Consequence::StillCapturing => f.write_str(
                "the stream is still being captured: its work is recorded, not run, and what \
                 the capture recorded and retained is kept until the capture ends",
            ),
            Consequence::Unknown => f.write_str("whether it was released cannot be known"),
        }
    }
}

/// What a cleanup was about, for reporting it: built only on the error paths.
#[derive(Debug, Clone)]
pub(crate) struct Subject {
    pub(crate) resource: Cow<'static, str>,
    pub(crate) operation: &'static str,
    pub(crate) ptr: u64,
    pub(crate) stream: u64,
    pub(crate) context: u64,
}

impl Subject {
    #[cold]
    pub(crate) fn new(
        resource: impl Into<Cow<'static, str>>,
        operation: &'static str,
        ptr: u64,
        stream: u64,
        context: u64,
    ) -> Subject {
        Subject {
            resource: resource.into(),
            operation,
            ptr,
            stream,
            context,
        }
    }

    /// A context binding left behind by `operation` in `context`.
    #[cold]
    pub(crate) fn context(operation: &'static str, context: usize) -> Subject {
        Subject::new("context binding", operation, 0, 0, context as u64)
    }
}

/// What a [`CleanupWarning`] is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum CleanupWarningKind {
    /// A free recorded on the per-thread default stream, running on another host thread than
    /// the recording one, found its context's legacy stream blocked by a capture of a blocking
    /// stream of that context (`CUDA_ERROR_STREAM_CAPTURE_IMPLICIT`), so it waits for the capture
    /// to end and then runs on the legacy stream, ordered after the recording thread's work
    /// (docs/decisions.md D6). What it cannot do from this thread: tell whether the capture is on
    /// the recording thread's per-thread stream, so it cannot hand the memory to that capture's
    /// graph as a free on the recording thread would (D11). If the graph being captured uses the
    /// memory through work custody does not see, retain the memory in the graph. Reported once
    /// per free, when it first waits.
    PerThreadStreamFreeWaitsForCapture {
        /// The thread that recorded the recipe ([`crate::ThreadToken`] value).
        recorded_thread: u64,
        /// The thread the free ran on.
        freeing_thread: u64,
    },
    /// A caching memory resource (`operation` names it) could not cache what its user asked
    /// for and let its upstream resource allocate and free instead, as it would alone: `why`
    /// says what and why. Reported once per resource and cause, the first time, so that a cache
    /// is never off without its user being told; what was not cached works as without the cache.
    NotCached {
        /// What was not cached, and why (a sentence fragment).
        why: &'static str,
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
            CleanupWarningKind::PerThreadStreamFreeWaitsForCapture {
                recorded_thread,
                freeing_thread,
            } => write!(
                f,
                "{}(0x{:x}) recorded on the per-thread default stream by thread {} and freed on \
                 thread {}: the legacy stream of context 0x{:x} is blocked by a capture, so the \
                 free waits until the capture ends and then runs on the legacy stream, ordered \
                 after the recording thread's work; if that capture records work on this memory \
                 that custody does not see, retain the memory in the graph",
                self.operation, self.ptr, recorded_thread, freeing_thread, self.context
            ),
            CleanupWarningKind::NotCached { why } => write!(
                f,
                "{} does not cache {why} (stream 0x{:x}, context 0x{:x}): its upstream resource \
                 allocates and frees those as it would alone (said once)",
                self.operation, self.stream, self.context
            ),
        }
    }
}

/// Where reports of one kind go: a process-wide hook (none: one line on stderr) and a count.
struct Channel<T: 'static> {
    hook: RwLock<Option<Arc<dyn Fn(&T) + Send + Sync>>>,
    count: AtomicU64,
    /// The stderr line's prefix when no hook is set (`custody: cleanup error`).
    line: &'static str,
    /// The hook, as a line on stderr names it when it panics (`cleanup-error`).
    name: &'static str,
}

impl<T: fmt::Display> Channel<T> {
    const fn new(line: &'static str, name: &'static str) -> Channel<T> {
        Channel {
            hook: RwLock::new(None),
            count: AtomicU64::new(0),
            line,
            name,
        }
    }

    /// Replaces the hook (`None`: the default); the old one is dropped after the lock.
    fn set(&self, hook: Option<Arc<dyn Fn(&T) + Send + Sync>>) {
        let old = std::mem::replace(
            &mut *self.hook.write().unwrap_or_else(|e| e.into_inner()),
            hook,
        );
        drop(old);
    }

    fn count(&self) -> u64 {
        self.count.load(Ordering::Relaxed)
    }

    /// Counts `report` and hands it to the hook (a clone of it, called with no lock held), or
    /// writes it to stderr; a panicking hook is caught and said so on stderr.
    fn deliver(&self, report: T) {
        self.count.fetch_add(1, Ordering::Relaxed);
        let hook = self.hook.read().unwrap_or_else(|e| e.into_inner()).clone();
        let outcome = catch_unwind(AssertUnwindSafe(|| match hook {
            Some(hook) => hook(&report),
            None => stderr_line(format_args!("{}: {report}", self.line)),
        }));
        if outcome.is_err() {
            stderr_line(format_args!(
                "custody: the {} hook panicked while reporting: {report}",
                self.name
            ));
        }
    }
}

static ERRORS: Channel<CleanupError> = Channel::new("custody: cleanup error", "cleanup-error");
static WARNINGS: Channel<CleanupWarning> = Channel::new("custody: warning", "cleanup-warning");

/// Replaces the process-wide cleanup-error hook.
///
/// The hook runs on the thread where the cleanup failed (any user thread, the cleanup worker),
/// after the caller's context was restored and with no lock of this crate held; it may call
/// back into custody. A panic inside the hook is caught and written to stderr.
pub fn set_cleanup_error_hook(hook: Box<dyn Fn(&CleanupError) + Send + Sync>) {
    ERRORS.set(Some(Arc::from(hook)));
}

/// Restores the default cleanup-error hook (one line on stderr).
pub fn reset_cleanup_error_hook() {
    ERRORS.set(None);
}

/// How many cleanup errors this process has reported (`CUDA_ERROR_DEINITIALIZED` excluded).
pub fn cleanup_error_count() -> u64 {
    ERRORS.count()
}

/// Replaces the process-wide cleanup-warning hook; same rules as [`set_cleanup_error_hook`].
pub fn set_cleanup_warning_hook(hook: Box<dyn Fn(&CleanupWarning) + Send + Sync>) {
    WARNINGS.set(Some(Arc::from(hook)));
}

/// Restores the default cleanup-warning hook (one line on stderr).
pub fn reset_cleanup_warning_hook() {
    WARNINGS.set(None);
}

/// How many cleanup warnings this process has reported.
pub fn cleanup_warning_count() -> u64 {
    WARNINGS.count()
}

/// Reports a cleanup failure of `subject` at `step`, with its `consequence`: counts it and calls
/// the hook, unless the driver is shutting down (`CUDA_ERROR_DEINITIALIZED`). The one report
/// path of this crate. Must not be called while holding any lock of this crate, unless a
/// [`HoldReports`] taken before the lock keeps the report until after it.
#[cold]
#[inline(never)]
pub(crate) fn report(
    subject: Subject,
    step: CleanupStep,
    consequence: Consequence,
    error: HandleError,
) {
    if error.code() == Some(CudaErrorCode::DEINITIALIZED) {
        return;
    }
    let error = CleanupError::of(subject, step, consequence, error);
    if let Some(error) = hold(Held::Error(error)) {
        deliver(error);
    }
}

/// A report made while [`HoldReports`] is alive on its thread: made when it goes.
enum Held {
    Error(CleanupError),
    Warning(CleanupWarning),
}

thread_local! {
    /// The reports made on this thread while a [`HoldReports`] lives (`None` when none does).
    static HELD: RefCell<Option<Vec<Held>>> = const { RefCell::new(None) };
}

/// Keeps `report` for the [`HoldReports`] alive on this thread; gives it back when there is
/// none (or the thread's locals are being torn down).
fn hold(report: Held) -> Option<Held> {
    let mut report = Some(report);
    let _ = HELD.try_with(|held| {
        if let Some(held) = held.borrow_mut().as_mut() {
            held.extend(report.take());
        }
    });
    report
}

/// While alive, the reports made on its thread ([`report`], [`warn`]) are kept, and made when it
/// goes: the way to keep the rule that no report is made while a lock of this crate is held, for
/// code that may release resources (whose failures report) under a lock. Take it before the
/// lock, so that it goes after the lock's guard (locals drop in reverse order). Nested guards
/// make the reports when the outermost goes. No cost unless something is reported.
#[must_use = "reports are kept only while the guard lives"]
pub(crate) struct HoldReports {
    outermost: bool,
}

impl HoldReports {
    pub(crate) fn new() -> HoldReports {
        let outermost = HELD
            .try_with(|held| {
                let mut held = held.borrow_mut();
                let outermost = held.is_none();
                if outermost {
                    *held = Some(Vec::new());
                }
                outermost
            })
            .unwrap_or(false);
        HoldReports { outermost }
    }
}

impl Drop for HoldReports {
    fn drop(&mut self) {
        if !self.outermost {
            return;
        }
        let held = HELD
            .try_with(|held| held.borrow_mut().take())
            .ok()
            .flatten();
        for report in held.into_iter().flatten() {
            deliver(report);
        }
    }
}

/// Counts `report` and hands it to its hook.
#[cold]
#[inline(never)]
fn deliver(report: Held) {
    match report {
        Held::Error(error) => ERRORS.deliver(error),
        Held::Warning(warning) => WARNINGS.deliver(warning),
    }
}

/// Reports `error` through the cleanup-error hook (or stderr), as this crate's own cleanups do
/// (`CUDA_ERROR_DEINITIALIZED` excepted, as there): for code of other crates that frees on a
/// path no caller can receive an error from (a caching memory resource's drop). Must not be
/// called while holding a lock a hook might take.
pub fn report_error(error: CleanupError) {
    if error.error.code() == Some(CudaErrorCode::DEINITIALIZED) {
        return;
    }
    if let Some(error) = hold(Held::Error(error)) {
        deliver(error);
    }
}

/// Reports that releasing `subject` failed and it leaked: the drop paths of resources released
/// without a context switch (contexts, pools).
#[cold]
pub(crate) fn report_leak(subject: Subject, error: HandleError) {
    report(subject, CleanupStep::Operation, Consequence::Leaked, error);
}

/// Reports a cleanup warning. Must not be called while holding any lock of this crate (unless a
/// [`HoldReports`] taken before it keeps the warning until after the lock).
pub(crate) fn warn(warning: CleanupWarning) {
    if let Some(warning) = hold(Held::Warning(warning)) {
        deliver(warning);
    }
}

/// Reports `warning` through the cleanup-warning hook (or stderr), as this crate's own
/// warnings are: for code of other crates that keeps one of custody's guarantees in the same
/// way (a caching memory resource saying it could not cache, [`CleanupWarningKind::NotCached`]).
/// Must not be called while holding a lock a hook might take.
pub fn report_warning(warning: CleanupWarning) {
    warn(warning);
}

/// Writes one line to stderr, ignoring a failed write (stderr closed, a pipe nobody reads):
/// `eprintln!` panics on a failed write, and the paths that fall back to stderr (a report with
/// no hook, a panicking hook, the cleanup worker, a host-function trampoline, which must not
/// unwind into the driver) must never panic.
pub(crate) fn stderr_line(line: fmt::Arguments<'_>) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr().lock(), "{line}");
}

#[cfg(test)]
mod tests {
    use super::*;
    use cuda_sys::CudaError;

    fn sample(code: CudaErrorCode) -> Subject {
        let _ = code;
        Subject::new("pool allocation", "cuMemFreeAsync", 0x1000, 0x1, 0xabc)
    }

    fn error(code: CudaErrorCode) -> HandleError {
        HandleError::Driver(CudaError {
            call: "cuMemFreeAsync",
            code,
            description: "test".into(),
        })
    }

    fn made(step: CleanupStep, consequence: Consequence, call: &'static str) -> CleanupError {
        let error = HandleError::Driver(CudaError {
            call,
            code: CudaErrorCode::INVALID_CONTEXT,
            description: "invalid device context".into(),
        });
        CleanupError::of(
            sample(CudaErrorCode::INVALID_VALUE),
            step,
            consequence,
            error,
        )
    }

    #[test]
    fn display_names_resource_operation_step_error_and_consequence() {
        let text = made(
            CleanupStep::Operation,
            Consequence::Leaked,
            "cuMemFreeAsync",
        )
        .to_string();
        assert!(
            text.starts_with(
                "cuMemFreeAsync(0x1000) [pool allocation] on stream 0x1 in context 0xabc failed: "
            ),
            "{text}"
        );
        assert!(text.contains("CUDA_ERROR_INVALID_CONTEXT"), "{text}");
        assert!(
            text.ends_with("nothing was released: it has leaked"),
            "{text}"
        );

        // A context step's failure: what the text says, how it ends, released, restored.
        let context_steps = [
            (
                CleanupStep::ActivateContext,
                Consequence::Leaked,
                "making its context current failed: cuCtxSetCurrent",
                "it has leaked",
                (false, true),
            ),
            (
                CleanupStep::RestoreContext,
                Consequence::Released,
                "restoring the thread's previous context failed",
                "it was released, but the thread was left with context 0xabc current",
                (true, false),
            ),
        ];
        for (step, consequence, says, ends, (released, restored)) in context_steps {
            let report = made(step, consequence, "cuCtxSetCurrent");
            let text = report.to_string();
            assert!(text.contains(says), "{text}");
            assert!(text.ends_with(ends), "{text}");
            assert_eq!(
                (report.released(), report.context_restored()),
                (released, restored)
            );
        }
    }

    #[test]
    fn deinitialized_is_neither_counted_nor_reported() {
        // Only this test touches the counter inside the unit-test binary's reporter checks, and
        // DEINITIALIZED must leave it untouched whatever else runs.
        let before = cleanup_error_count();
        report(
            sample(CudaErrorCode::DEINITIALIZED),
            CleanupStep::Operation,
            Consequence::Leaked,
            error(CudaErrorCode::DEINITIALIZED),
        );
        assert_eq!(cleanup_error_count(), before);
    }
}
