//! The one context primitive: [`run_in`] runs driver work with a context current and puts the
//! calling thread's binding back (docs/decisions.md D2), through the only two functions that
//! switch and restore ([`activate`], [`restore`]; the public `ContextScope` in `context.rs` is
//! built on them). Every driver call of this crate that needs a particular context goes through
//! here; the error paths are cold.

use std::cell::Cell;

use cuda_sys::{CudaError, CudaErrorCode, Driver};

use crate::error::HandleError;
use crate::report::{report, CleanupStep, Consequence, Subject};
use crate::sys::{current_context_raw, driver, set_current_raw};

thread_local! {
    /// Whether restoring a binding failed on this thread since the cleanup worker last looked,
    /// leaving some context current (set on any thread, read only by the worker).
    static RESTORE_FAILED: Cell<bool> = const { Cell::new(false) };
}

/// Takes (and clears) this thread's "a restore failed" mark: the cleanup worker then unbinds
/// whatever the failed restore left current, so that it never carries a context into its next
/// item.
pub(crate) fn take_restore_failed() -> bool {
    RESTORE_FAILED.with(|flag| flag.replace(false))
}

/// Marks this thread's restore as failed again (the worker's unbind failed too).
pub(crate) fn note_restore_failed() {
    RESTORE_FAILED.with(|flag| flag.set(true));
}

/// A step of a context switch that failed, as the raw status of the call that failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SwitchFailure {
    /// `cuCtxGetCurrent` or `cuCtxSetCurrent`.
    pub(crate) call: &'static str,
    pub(crate) status: u32,
}

impl SwitchFailure {
    #[cold]
    #[inline(never)]
    pub(crate) fn error(self) -> CudaError {
        CudaError::new(self.call, CudaErrorCode(self.status))
    }
}

/// The binding to put back: the context current before, and whether it was replaced.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Switch {
    pub(crate) previous: usize,
    pub(crate) switched: bool,
}

/// Makes `target` current unless it already is. The only place that does.
#[inline]
pub(crate) fn activate(d: &Driver, target: usize) -> Result<Switch, SwitchFailure> {
    let previous = current_context_raw(d).map_err(|status| SwitchFailure {
        call: "cuCtxGetCurrent",
        status,
    })?;
    activate_from(d, previous, target)
}

/// [`activate`] when the caller has just read the current context (`previous`).
#[inline]
fn activate_from(d: &Driver, previous: usize, target: usize) -> Result<Switch, SwitchFailure> {
    if previous == target {
        return Ok(Switch {
            previous,
            switched: false,
        });
    }
    let status = set_current_raw(d, target);
    if status != 0 {
        return Err(SwitchFailure {
            call: "cuCtxSetCurrent",
            status,
        });
    }
    Ok(Switch {
        previous,
        switched: true,
    })
}

/// Puts the binding `switch` replaced back (`cuCtxSetCurrent(previous)`, NULL meaning none);
/// the status, 0 when nothing needed restoring. The only place that restores.
#[inline]
pub(crate) fn restore(d: &Driver, switch: Switch) -> u32 {
    if !switch.switched {
        return 0;
    }
    let status = set_current_raw(d, switch.previous);
    if status != 0 {
        note_restore_failed();
    }
    status
}

/// [`run_in`] when the caller has just read the current context (`previous`, 0 for none), as an
/// allocation does to bind its recipe: the read is not repeated.
///
/// Driver calls: `cuCtxSetCurrent` twice when `target` is not `previous`.
#[inline]
pub(crate) fn run_in_from<R>(
    d: &'static Driver,
    previous: usize,
    target: usize,
    f: impl FnOnce() -> R,
) -> Ran<R> {
    run_switched(d, activate_from(d, previous, target), f)
}

/// Runs `f` between a switch (unless it failed) and its restore.
#[inline]
fn run_switched<R>(
    d: &'static Driver,
    switch: Result<Switch, SwitchFailure>,
    f: impl FnOnce() -> R,
) -> Ran<R> {
    match switch {
        Err(failure) => Ran::NotActivated(failure),
        Ok(switch) => {
            let value = f();
            let restore = restore(d, switch);
            Ran::Done {
                value,
                restore,
                previous: switch.previous,
            }
        }
    }
}

/// What [`run_in`] came to, in raw statuses: nothing is built unless something failed.
#[must_use]
pub(crate) enum Ran<R> {
    /// The context could not be made current: the work did not run.
    NotActivated(SwitchFailure),
    /// The work ran and gave `value`; `restore` is the status of putting the previous binding
    /// (`previous`) back, 0 when that worked or was not needed.
    Done {
        value: R,
        restore: u32,
        previous: usize,
    },
}

/// Runs `f` with the context whose raw value is `target` current on the calling thread: reads
/// the current context, makes `target` current only if it differs, runs `f`, restores the
/// previous binding (docs/decisions.md D2). The switch is skipped entirely when `target` is
/// current already. Reports nothing: the caller decides (see [`Ran`]'s methods).
///
/// Driver calls: `cuCtxGetCurrent`; `cuCtxSetCurrent` twice when `target` was not current.
#[inline]
pub(crate) fn run_in<R>(d: &'static Driver, target: usize, f: impl FnOnce() -> R) -> Ran<R> {
    run_switched(d, activate(d, target), f)
}

impl<R> Ran<R> {
    /// The outcome of work that needed no context switch: done, nothing to restore.
    #[inline]
    pub(crate) fn unswitched(value: R) -> Ran<R> {
        Ran::Done {
            value,
            restore: 0,
            previous: 0,
        }
    }

    /// The same outcome with the work's value mapped.
    #[inline]
    pub(crate) fn map<T>(self, f: impl FnOnce(R) -> T) -> Ran<T> {
        match self {
            Ran::NotActivated(failure) => Ran::NotActivated(failure),
            Ran::Done {
                value,
                restore,
                previous,
            } => Ran::Done {
                value: f(value),
                restore,
                previous,
            },
        }
    }
}

impl<R> Ran<Result<R, HandleError>> {
    /// For explicit operations, which return what happened: activation failing is
    /// [`HandleError::ContextNotActivated`]; the operation's own error comes next (a restore
    /// failing after it is reported, since only one error can be returned); a restore failing
    /// after success is [`HandleError::ContextNotRestored`], and `undo` (if given) runs first,
    /// still in the target context, to give back what the operation made.
    #[inline]
    pub(crate) fn into_result(
        self,
        operation: &'static str,
        target: usize,
        undo: impl FnOnce(R),
    ) -> Result<R, HandleError> {
        self.into_result_for(
            operation,
            target,
            || Subject::context(operation, target),
            undo,
        )
    }

    /// [`Ran::into_result`], with a restore failure after a failed operation reported as
    /// `subject`'s.
    #[inline]
    pub(crate) fn into_result_for(
        self,
        operation: &'static str,
        target: usize,
        subject: impl FnOnce() -> Subject,
        undo: impl FnOnce(R),
    ) -> Result<R, HandleError> {
        match self {
            Ran::Done {
                value: Ok(value),
                restore: 0,
                ..
            } => Ok(value),
            other => other.failed(operation, target, subject, undo),
        }
    }

    #[cold]
    #[inline(never)]
    fn failed(
        self,
        operation: &'static str,
        target: usize,
        subject: impl FnOnce() -> Subject,
        undo: impl FnOnce(R),
    ) -> Result<R, HandleError> {
        match self {
            Ran::NotActivated(failure) => Err(HandleError::ContextNotActivated {
                operation,
                context: target as u64,
                error: failure.error(),
            }),
            Ran::Done {
                value: Err(error),
                restore,
                ..
            } => {
                if restore != 0 {
                    report_restore(subject(), Consequence::ContextNotRestored, restore);
                }
                Err(error)
            }
            Ran::Done {
                value: Ok(value),
                restore,
                previous,
            } => {
                undo(value);
                Err(HandleError::ContextNotRestored {
                    operation,
                    previous: previous as u64,
                    context: target as u64,
                    error: CudaError::new("cuCtxSetCurrent", CudaErrorCode(restore)),
                })
            }
        }
    }
}

impl Ran<Result<(), HandleError>> {
    /// For drops, which cannot return: reports what failed, attributed to `subject`, through
    /// the one report path; a restore failure is reported after the operation's own.
    #[inline]
    pub(crate) fn report(self, subject: impl FnOnce() -> Subject) {
        self.report_as(subject, Consequence::Leaked);
    }

    /// [`Ran::report`], with `failed` as the consequence of the operation's own failure (a
    /// deallocator's failure may come after it freed the memory, or leave that unknown).
    #[inline]
    pub(crate) fn report_as(self, subject: impl FnOnce() -> Subject, failed: Consequence) {
        if !matches!(
            self,
            Ran::Done {
                value: Ok(()),
                restore: 0,
                ..
            }
        ) {
            self.report_failed(subject(), failed);
        }
    }

    #[cold]
    #[inline(never)]
    fn report_failed(self, subject: Subject, failed: Consequence) {
        match self {
            Ran::NotActivated(failure) => report(
                subject,
                CleanupStep::ActivateContext,
                Consequence::Leaked,
                HandleError::Driver(failure.error()),
            ),
            Ran::Done { value, restore, .. } => {
                let released = value.is_ok();
                if let Err(error) = value {
                    report(subject.clone(), CleanupStep::Operation, failed, error);
                }
                if restore != 0 {
                    let consequence = if released {
                        Consequence::Released
                    } else {
                        failed
                    };
                    report_restore(subject, consequence, restore);
                }
            }
        }
    }
}

/// Reports that putting the previous binding back failed after work on `subject` (whose outcome
/// is `consequence`): the thread keeps the target context current.
#[cold]
#[inline(never)]
pub(crate) fn report_restore(subject: Subject, consequence: Consequence, status: u32) {
    report(
        subject,
        CleanupStep::RestoreContext,
        consequence,
        HandleError::Driver(CudaError::new("cuCtxSetCurrent", CudaErrorCode(status))),
    );
}

/// Runs a release `f` in the context whose raw value is `context`, reporting any failure,
/// attributed to `subject` (drop paths). Nothing runs once the process is exiting.
pub(crate) fn release_in(
    context: usize,
    subject: impl FnOnce() -> Subject,
    f: impl FnOnce(&'static Driver) -> Result<(), HandleError>,
) {
    if crate::lifecycle::exiting() {
        return;
    }
    let Ok(d) = driver() else { return };
    run_in(d, context, || f(d)).report(subject);
}

/// Releases a driver object (`resource`, raw value `raw`) with `destroy`, which returns the
/// status of `operation`, in the context whose raw value is `context`, reporting a failure (drop
/// paths).
pub(crate) fn destroy_in_context(
    resource: &'static str,
    operation: &'static str,
    raw: usize,
    context: usize,
    destroy: impl FnOnce(&'static Driver) -> u32,
) {
    release_in(
        context,
        || Subject::new(resource, operation, raw as u64, 0, context as u64),
        |d| crate::sys::check(operation, destroy(d)),
    );
}
