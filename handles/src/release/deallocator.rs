//! The deallocator family ([`UserDeallocator`]): memory adopted with a user [`Deallocator`],
//! called in the recipe's context on the stream the free is issued on, or host memory adopted
//! with one by a host-only resource (no recipe, no context, the legacy token unbound).
//! docs/decisions.md D2, D5.

use std::borrow::Cow;
use std::sync::Arc;

use super::{subject, Family, Free, Issued, Outcome, ReleaseKind};
use crate::allocation::{call_deallocator, Deallocator, Freed};
use crate::report::{report, CleanupStep, Subject};
use crate::scope::{run_in, Ran};
use crate::stream::StreamHandle;

/// Memory adopted with a deallocator: with a recipe ([`ReleaseKind::Deallocator`]), or host
/// memory of a host-only resource without one ([`ReleaseKind::HostDeallocator`]).
pub(crate) struct UserDeallocator {
    deallocator: Arc<dyn Deallocator>,
    host_only: bool,
}

impl UserDeallocator {
    /// Memory freed by `deallocator` with its recipe.
    pub(crate) fn with_recipe(deallocator: Arc<dyn Deallocator>) -> UserDeallocator {
        UserDeallocator {
            deallocator,
            host_only: false,
        }
    }

    /// Host memory freed by `deallocator` without a recipe.
    pub(crate) fn host_only(deallocator: Arc<dyn Deallocator>) -> UserDeallocator {
        UserDeallocator {
            deallocator,
            host_only: true,
        }
    }
}

impl Family for UserDeallocator {
    fn kind(&self) -> ReleaseKind {
        match self.host_only {
            false => ReleaseKind::Deallocator,
            true => ReleaseKind::HostDeallocator,
        }
    }

    fn needs_recipe(&self) -> bool {
        !self.host_only
    }

    fn resource(&self) -> Cow<'static, str> {
        Cow::Owned(self.deallocator.name().to_owned())
    }

    fn operation(&self) -> &'static str {
        "deallocate"
    }

    /// A deallocator is user code that may enqueue anything on the stream it is given (host
    /// memory without a recipe has no stream to look at).
    fn looks_first(&self, _stream: &StreamHandle, _explicit: bool) -> bool {
        !self.host_only
    }

    fn issue(&mut self, free: &Free<'_>) -> Issued {
        Issued::Done(deallocate(self, self.deallocator.as_ref(), free, |call| {
            call()
        }))
    }

    /// Frees host memory through its deallocator, with no recipe: the legacy default-stream
    /// token, no context change. `explicit`: return the error; otherwise report it. (Memory
    /// with a recipe is freed by [`Family::issue`] only.)
    fn free_unrecorded(&mut self, ptr: u64, size: usize, explicit: bool) -> Outcome {
        if !self.host_only {
            return Ok(());
        }
        let stream = StreamHandle::legacy();
        let (result, freed) = call_deallocator(self.deallocator.as_ref(), ptr, size, &stream);
        match result {
            Err(error) if !explicit => {
                let subject = Subject::new(
                    self.resource(),
                    "deallocate",
                    ptr,
                    stream.raw_usize() as u64,
                    0,
                );
                report(subject, CleanupStep::Operation, freed.consequence(), error);
                Ok(())
            }
            result => result,
        }
    }
}

/// Calls `deallocator` for `free`'s memory, always in the recipe's context (a deallocator is
/// promised it, D2), on the stream the free is issued on (away from the recording thread of a
/// per-thread-default-stream recipe, the legacy token, D6); `around` runs the call (and may add
/// steps before and after it, in that context). An explicit release returns the outcome, a drop
/// reports it with what became of the memory.
pub(crate) fn deallocate(
    family: &impl Family,
    deallocator: &dyn Deallocator,
    free: &Free<'_>,
    around: impl FnOnce(&dyn Fn() -> (Outcome, Freed)) -> (Outcome, Freed),
) -> Outcome {
    let (ptr, size, stream) = (free.ptr, free.size, free.stream);
    let ran = run_in(free.d, free.recipe.context_raw(), || {
        around(&|| call_deallocator(deallocator, ptr, size, stream))
    });
    let freed = match &ran {
        Ran::Done {
            value: (_, freed), ..
        } => *freed,
        Ran::NotActivated(_) => Freed::No,
    };
    let ran = ran.map(|(result, _)| result);
    let subject = || subject(family, "deallocate", ptr, free.recipe);
    if free.explicit {
        ran.into_result_for("deallocate", free.recipe.context_raw(), subject, drop)
    } else {
        ran.report_as(subject, freed.consequence());
        Ok(())
    }
}
