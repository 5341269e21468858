//! Frees whose stream is being captured (docs/decisions.md D11): the spine's capture check
//! ([`PtrBox::defer_if_captured`]) and the deferral it leads to ([`PtrBox::defer_captured`]): a
//! capturing stream's graph takes the memory ([`hand_over`]), any other capture state parks the
//! free until the capture is over. The deferred free is a new box with the same recipe and
//! family, freed when the graph (or the retry) drops it.

use std::any::Any;
use std::sync::{Arc, Mutex};

use cuda_sys::types::CUgraph;
use cuda_sys::Driver;

use super::{subject, Family, Kept, PtrBox, Release};
use crate::context::ContextHandle;
use crate::deferred;
use crate::recipe::{DeallocationRecipe, ThreadToken};
use crate::report::{
    report, warn, CleanupStep, CleanupWarning, CleanupWarningKind, Consequence, Subject,
};
use crate::scope::{report_restore, run_in, Ran};
use crate::stream::{capture_state, CaptureState};
use crate::user_object::UserObjectOwnership;

/// What [`PtrBox::defer_if_captured`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Checked {
    /// The stream is free to use (or nothing is known): the free goes on.
    Free,
    /// The stream is captured or blocked by a capture: the free was deferred.
    Deferred,
    /// The stream is being captured by capture `0`, in which the family frees
    /// ([`Family::frees_inside`]): the free goes on, inside the capture.
    Inside(u64),
}

impl PtrBox {
    /// When the stream the free is issued on ([`DeallocationRecipe::free_stream`]) is being
    /// captured (or, for the legacy stream, blocked by a capture), defers the free instead of
    /// issuing it, and says so; [`Checked::Free`] (and nothing done) when the stream is free to
    /// use, [`Checked::Inside`] when it is captured by the capture the family frees inside (a
    /// graph allocation's own). Asks the driver in the recipe's context. A free away from the
    /// recording thread of a per-thread-default-stream recipe that waits for a capture is
    /// reported once ([`CleanupWarningKind::PerThreadStreamFreeWaitsForCapture`]).
    ///
    /// Driver calls: `cuCtxGetCurrent`, `cuCtxSetCurrent` (if needed),
    /// `cuStreamGetCaptureInfo_v2`; to hand over, those of [`hand_over`].
    #[cold]
    #[inline(never)]
    pub(super) fn defer_if_captured(
        &mut self,
        d: &'static Driver,
        recipe: &DeallocationRecipe,
    ) -> Checked {
        let raw_stream = recipe.free_stream().raw();
        let state = match run_in(d, recipe.context_raw(), || capture_state(d, raw_stream)) {
            Ran::NotActivated(_) => return Checked::Free, // the free's own path reports this
            Ran::Done { value, restore, .. } => {
                if restore != 0 {
                    report_restore(
                        subject(&self.release, "cuStreamGetCaptureInfo_v2", self.ptr, recipe),
                        Consequence::ContextNotRestored,
                        restore,
                    );
                }
                value
            }
        };
        match state {
            CaptureState::Free | CaptureState::Unknown(_) => return Checked::Free,
            CaptureState::Capturing { id, .. } if self.release.frees_inside(id) => {
                return Checked::Inside(id)
            }
            _ => {}
        }
        self.warn_waits_for_capture(recipe, state);
        self.defer_captured(state, recipe.clone());
        Checked::Deferred
    }

    /// D6: a free away from the recording thread of a per-thread-default-stream recipe, about
    /// to wait because its context's legacy stream is blocked by a capture (`state`), is
    /// reported once (not again when it is retried).
    #[cold]
    pub(super) fn warn_waits_for_capture(&self, recipe: &DeallocationRecipe, state: CaptureState) {
        if state != CaptureState::Blocked || self.retried || !recipe.is_other_thread() {
            return;
        }
        if let Some(recorded) = recipe.ptds_thread() {
            warn(CleanupWarning {
                operation: self.release.operation(),
                ptr: self.ptr,
                stream: recipe.free_stream().raw_usize() as u64,
                context: recipe.context_raw() as u64,
                kind: CleanupWarningKind::PerThreadStreamFreeWaitsForCapture {
                    recorded_thread: recorded.value(),
                    freeing_thread: ThreadToken::current().value(),
                },
            });
        }
    }

    /// Defers this free, whose stream is in `state` (not free): a capturing stream's graph
    /// takes the memory (it is freed after the graph and its executables are gone); otherwise
    /// it waits for the capture to end (parked). The box gives up its family to a new box,
    /// which frees with the same recipe when it is dropped later.
    pub(super) fn defer_captured(&mut self, state: CaptureState, recipe: DeallocationRecipe) {
        let release = std::mem::replace(&mut self.release, Release::Kept(Kept { owner: None }));
        let uses = std::mem::take(self.uses.get_mut().unwrap_or_else(|e| e.into_inner()));
        let context = recipe.context().clone();
        let mut deferred = PtrBox::new(self.ptr, self.size, self.device, Some(recipe), release);
        *deferred.uses.get_mut().unwrap_or_else(|e| e.into_inner()) = uses;
        deferred.retried = true;
        let deferred = Arc::new(deferred);
        match state {
            CaptureState::Capturing { graph, .. } => hand_over(&context, graph, deferred),
            _ => deferred::park(Box::new(deferred)),
        }
    }
}

/// Hands `deferred` (memory whose free was refused, or must not be issued, because its stream
/// is being captured into `graph`) to that graph: a user object the capture graph retains owns
/// it, so the graph the capture produces, its clones and executables keep the memory
/// allocated, and deferred cleanup frees it when the last of them goes (D11). If the graph
/// cannot take it, the free waits for the capture to end instead (parked; reported).
///
/// Driver calls: `cuCtxGetCurrent`, `cuCtxSetCurrent` (if needed), `cuUserObjectCreate`,
/// `cuGraphRetainUserObject`, `cuUserObjectRelease`.
#[cold]
#[inline(never)]
fn hand_over(context: &ContextHandle, graph: usize, deferred: Arc<PtrBox>) {
    let ptr = deferred.ptr;
    let stream = deferred
        .recipe
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .as_ref()
        .map_or(0, |recipe| recipe.stream().raw_usize() as u64);
    // The box sits in a cell the user object's payload shares, so that it can be taken back
    // when the graph refuses the user object (its destructor then finds the cell empty).
    let cell = Arc::new(Mutex::new(Some(deferred)));
    let payload: Box<dyn Any + Send> = Box::new(Arc::clone(&cell));
    let refused = match UserObjectOwnership::try_new(context, payload) {
        Err((error, payload)) => {
            drop(payload); // the cell's second reference; the box stays in the cell
            Some(("cuUserObjectCreate", error))
        }
        Ok(object) => match object.retain_in_raw_graph(graph as CUgraph) {
            Ok(()) => None, // our reference goes with `object`; the graph's stays
            Err(error) => Some(("cuGraphRetainUserObject", error)),
        },
    };
    let Some((operation, error)) = refused else {
        return;
    };
    let taken = cell.lock().unwrap_or_else(|e| e.into_inner()).take();
    if let Some(deferred) = taken {
        deferred::park(Box::new(deferred));
    }
    report(
        Subject::new(
            "memory handed to a capture",
            operation,
            ptr,
            stream,
            context.raw_usize() as u64,
        ),
        CleanupStep::Operation,
        Consequence::Deferred,
        error,
    );
}
