//! Declared use streams at the free (docs/decisions.md D12): the free's stream waits for an
//! event recorded on each use stream at that moment ([`PtrBox::order_after_uses`]); a free whose
//! uses cannot be ordered is not issued ([`PtrBox::unordered_use`]).

use cuda_sys::types::CUevent;
use cuda_sys::Driver;

use super::{subject, Family, Outcome, PtrBox};
use crate::error::HandleError;
use crate::event::{create_raw, destroy_raw};
use crate::flags::EventFlags;
use crate::recipe::DeallocationRecipe;
use crate::report::{report, CleanupStep, Consequence, Subject};
use crate::scope::{report_restore, run_in, Ran};
use crate::stream::{capture_state, CaptureState, StreamHandle};
use crate::sys::{check, error};

/// What [`PtrBox::order_after_uses`] found.
pub(super) enum UsesOrdered {
    /// The free's stream waits for every use stream.
    Yes,
    /// A use stream is being captured: the free must wait for the capture to end.
    WaitForCapture,
    /// The free is inside a capture (a graph allocation's own) and a use stream is not part
    /// of that capture: its work cannot be ordered before a node of the graph.
    OutsideTheCapture,
}

impl PtrBox {
    /// Makes `free` (the stream this free is issued on, resolved in `recipe`'s context) wait
    /// for the work enqueued so far on every declared use stream: an event recorded on the use
    /// stream now (in the use's context; on the legacy stream of that context for a
    /// per-thread-default-stream use away from its recording thread, D6), waited for by `free`
    /// (`cuStreamWaitEvent`, in the recipe's context), then destroyed (the driver keeps a
    /// waited-for event until the wait is done). A use on `free` itself is skipped. Takes the
    /// uses; when a use stream is being captured, puts them back and says the free must wait
    /// for the capture to end (an event recorded there would be a capture node, and waiting on
    /// it would pull the free into the capture).
    ///
    /// `inside`: the capture the free is issued in (a graph allocation's free node). A use on a
    /// stream of that same capture is ordered inside it (the event and the wait are captured:
    /// an edge of the graph); a use on a stream outside it cannot be (waiting in a capture for an
    /// event recorded outside it is refused), so the uses are put back and
    /// [`UsesOrdered::OutsideTheCapture`] says so.
    ///
    /// # Errors
    /// The first failing driver call, a use stream's capture query included; the free must then
    /// not run (it would be unordered).
    ///
    /// Driver calls: per use, `cuStreamGetCaptureInfo_v2`, `cuEventCreate`, `cuEventRecord`,
    /// `cuStreamWaitEvent`, `cuEventDestroy_v2`, with `cuCtxGetCurrent` and `cuCtxSetCurrent`
    /// where the context differs.
    #[cold]
    #[inline(never)]
    pub(super) fn order_after_uses(
        &mut self,
        d: &'static Driver,
        recipe: &DeallocationRecipe,
        free: &StreamHandle,
        inside: Option<u64>,
    ) -> Result<UsesOrdered, HandleError> {
        let uses = std::mem::take(self.uses.get_mut().unwrap_or_else(|e| e.into_inner()));
        let free_raw = free.raw();
        for use_recipe in &uses {
            let on = use_recipe.free_stream();
            let use_raw = on.raw();
            if use_raw == free_raw && use_recipe.context_raw() == recipe.context_raw() {
                continue; // the free's own stream: ordered already
            }
            let recorded = run_in(d, use_recipe.context_raw(), || {
                match (capture_state(d, use_raw), inside) {
                    (CaptureState::Free, None) => {}
                    (CaptureState::Capturing { id, .. }, Some(capture)) if id == capture => {}
                    (CaptureState::Free, Some(_)) => {
                        return Ok(Err(UsesOrdered::OutsideTheCapture))
                    }
                    // The driver did not say (a stream its owner destroyed, say): the use
                    // cannot be ordered, which is the free's error, not a capture to wait for.
                    (CaptureState::Unknown(status), _) => {
                        return Err(error("cuStreamGetCaptureInfo_v2", status))
                    }
                    _ => return Ok(Err(UsesOrdered::WaitForCapture)),
                }
                let raw = create_raw(EventFlags::DISABLE_TIMING)?;
                // SAFETY: the event was just created in the current (the use's) context; the
                // use recipe keeps its stream alive.
                let status = unsafe { (d.cuEventRecord)(raw as CUevent, use_raw) };
                if let Err(error) = check("cuEventRecord", status) {
                    destroy_raw(raw);
                    return Err(error);
                }
                Ok(Ok(raw))
            });
            let about = || subject(&self.release, "cuEventRecord", self.ptr, recipe);
            let recorded = ran_value(recorded, "cuEventRecord", use_recipe.context_raw(), about);
            let event = match recorded? {
                Ok(event) => event,
                Err(not_now) => {
                    // Every use goes back (those ordered already cost one more event later).
                    *self.uses.get_mut().unwrap_or_else(|e| e.into_inner()) = uses;
                    return Ok(not_now);
                }
            };
            let waited = run_in(d, recipe.context_raw(), || {
                // SAFETY: the event is ours and recorded; the recipe keeps the free's stream
                // alive, and for a token its context is current.
                let status = unsafe { (d.cuStreamWaitEvent)(free_raw, event as CUevent, 0) };
                check("cuStreamWaitEvent", status)
            });
            // In the event's own context.
            let destroyed = run_in(d, use_recipe.context_raw(), || {
                check("cuEventDestroy_v2", destroy_raw(event))
            });
            let about = || subject(&self.release, "cuStreamWaitEvent", self.ptr, recipe);
            ran_value(waited, "cuStreamWaitEvent", recipe.context_raw(), about)?;
            let about = || subject(&self.release, "cuEventDestroy_v2", self.ptr, recipe);
            let destroyed = ran_value(
                destroyed,
                "cuEventDestroy_v2",
                use_recipe.context_raw(),
                about,
            );
            if let Err(error) = destroyed {
                // The wait is in place: the event's leak does not unorder the free (reported).
                report(about(), CleanupStep::Ordering, Consequence::Leaked, error);
            }
        }
        Ok(UsesOrdered::Yes)
    }

    /// A free whose declared uses could not be ordered is not issued (it would be unordered):
    /// the memory is leaked, and the error returned (`explicit`) or reported.
    #[cold]
    #[inline(never)]
    pub(super) fn unordered_use(
        &self,
        error: HandleError,
        recipe: &DeallocationRecipe,
        stream: &StreamHandle,
        explicit: bool,
    ) -> Outcome {
        if explicit {
            return Err(error);
        }
        report(
            Subject::new(
                self.release.resource(),
                "cuStreamWaitEvent",
                self.ptr,
                stream.raw_usize() as u64,
                recipe.context_raw() as u64,
            ),
            CleanupStep::Ordering,
            Consequence::Leaked,
            error,
        );
        Ok(())
    }
}

/// The outcome of `operation` run in `context`: [`HandleError::ContextNotActivated`] when it
/// did not run; otherwise its own, a failure to put the caller's context back being reported as
/// `subject`'s (the step itself is done either way).
fn ran_value<T>(
    ran: Ran<Result<T, HandleError>>,
    operation: &'static str,
    context: usize,
    subject: impl FnOnce() -> Subject,
) -> Result<T, HandleError> {
    match ran {
        Ran::NotActivated(failure) => Err(HandleError::ContextNotActivated {
            operation,
            context: context as u64,
            error: failure.error(),
        }),
        Ran::Done { value, restore, .. } => {
            if restore != 0 {
                report_restore(subject(), Consequence::ContextNotRestored, restore);
            }
            value
        }
    }
}
