//! The lent family: memory a lender (a caching memory resource) lends out of one of its blocks
//! ([`DevicePtrHandle::lend`](crate::DevicePtrHandle::lend)). At the last release the block
//! takes the lent handle's last recipe and goes back to the lender, after the declared uses were
//! ordered before it (D12); no driver call of its own. The lender plugs in through
//! [`Lender`](crate::Lender), which the handle's module turns into [`GiveBack`], the form this
//! family calls (it works on the block's box and never names the handle).

use std::borrow::Cow;
use std::sync::Arc;

use super::{Family, Free, Issued, Outcome, PtrBox, ReleaseKind};
use crate::error::HandleError;
use crate::recipe::DeallocationRecipe;
use crate::report::Consequence;
use crate::scope::Ran;
use crate::stream::StreamHandle;

/// What a lender learns with a block given back ([`Lender::give_back`](crate::Lender::give_back)).
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct Returned<'a> {
    /// The stream the free is ordered on: the lent handle's last recipe's
    /// ([`DeallocationRecipe::free_stream`] on the releasing thread), which the block's recipe
    /// now names. Work enqueued on it after `give_back` is ordered after every use of the
    /// memory.
    pub stream: &'a StreamHandle,
    /// The raw value of `stream` when the block's recipe keeps that stream alive
    /// ([`StreamHandle::pins_its_stream`]: a created stream, or a wrapped one with an owner), so
    /// that the value names that stream while the block sits in a bin; `None` otherwise (a
    /// stream wrapped without an owner, which its maker may destroy and whose value a new
    /// stream may get, or a default-stream token bound to a context or a thread).
    pub bin: Option<usize>,
    /// A close or release that returns its error (and may block), rather than a drop, which
    /// must not block on the GPU (docs/decisions.md D9).
    pub explicit: bool,
}

/// A lender as this family calls it: the block's box comes back (see `lender.rs`, where
/// every [`Lender`](crate::Lender) is one).
pub(crate) trait GiveBack: Send + Sync {
    fn give_back_box(&self, block: Arc<PtrBox>, returned: &Returned<'_>) -> Outcome;

    fn lender_name(&self) -> &str;
}

/// A lender's block, lent out; `block` is `None` once given back (or leaked).
pub(crate) struct Lent {
    block: Option<Arc<PtrBox>>,
    lender: Arc<dyn GiveBack>,
}

impl Lent {
    /// `block`, lent out through `lender`.
    pub(crate) fn new(block: Arc<PtrBox>, lender: Arc<dyn GiveBack>) -> Lent {
        Lent {
            block: Some(block),
            lender,
        }
    }

    /// Why `block` cannot lend `size` bytes, if it cannot: a size of zero or beyond the block,
    /// a block without a recipe (which could not carry the lent handle's), or one with other
    /// holders (a block is lent by its one holder).
    pub(crate) fn refusal(block: &Arc<PtrBox>, size: usize) -> Option<&'static str> {
        if size == 0 || size > block.size {
            Some("the size must be between 1 and the block's size")
        } else if !block.release.needs_recipe() {
            Some("a block without a deallocation recipe cannot be lent")
        } else if Arc::strong_count(block) != 1 {
            Some("a block is lent by its one holder: it has other clones")
        } else {
            None
        }
    }

    /// The kind of the block behind the lent memory.
    pub(crate) fn block_kind(&self) -> Option<ReleaseKind> {
        self.block.as_ref().map(|block| block.release.kind())
    }
}

impl Family for Lent {
    fn kind(&self) -> ReleaseKind {
        ReleaseKind::Lent
    }

    fn resource(&self) -> Cow<'static, str> {
        Cow::Owned(self.lender.lender_name().to_owned())
    }

    fn operation(&self) -> &'static str {
        "give_back"
    }

    /// As a deallocator: the lender is code of another crate, and a block given back while its
    /// stream is captured would be reused unordered.
    fn looks_first(&self, _stream: &StreamHandle, _explicit: bool) -> bool {
        true
    }

    /// The block takes this recipe (unless it holds one for the same stream, context and thread
    /// already, kept as it is) and goes back to its lender, which bins it under the free's
    /// stream or frees it. No driver call here; the lender's own free of the block makes the
    /// block's.
    fn issue(&mut self, free: &Free<'_>) -> Issued {
        let Some(mut block) = self.block.take() else {
            return Issued::Done(Ok(()));
        };
        let (recipe, stream, other_thread) = (free.recipe, free.stream, free.other_thread);
        let returned = Returned {
            stream,
            bin: (stream.pins_its_stream() && !other_thread).then(|| stream.raw_usize()),
            explicit: free.explicit,
        };
        let take_this = |own: &mut Option<DeallocationRecipe>| {
            if own.as_ref().is_some_and(|r| r.same_target(recipe)) {
                None
            } else {
                own.replace(recipe.clone())
            }
        };
        // The block has no other holder (`lend` checked, and it was never handed out): its
        // recipe is reached without the lock.
        let replaced = match Arc::get_mut(&mut block) {
            Some(own) => take_this(own.recipe.get_mut().unwrap_or_else(|e| e.into_inner())),
            None => take_this(&mut block.recipe.lock().unwrap_or_else(|e| e.into_inner())),
        };
        drop(replaced); // outside the lock: it may hold a stream's last reference
                        // A lender that panics took the block: whether it freed or kept it cannot be known.
        let lender = &self.lender;
        let (result, failed) = match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            lender.give_back_box(block, &returned)
        })) {
            Ok(result) => (result, Consequence::Leaked),
            Err(_) => (
                Err(HandleError::deallocator("the lender panicked")),
                Consequence::Unknown,
            ),
        };
        let Err(error) = result else {
            return Issued::Done(Ok(()));
        };
        let ran = Ran::unswitched(Err(error));
        let subject = || super::subject(self, "give_back", free.ptr, recipe);
        Issued::Done(if free.explicit {
            ran.into_result_for("give_back", recipe.context_raw(), subject, drop)
        } else {
            ran.report_as(subject, failed);
            Ok(())
        })
    }

    /// A lent block whose free could not be ordered after its uses (D12) is leaked with the
    /// memory: neither reused nor freed unordered.
    fn unordered(&mut self) {
        if let Some(block) = self.block.take() {
            std::mem::forget(block);
        }
    }
}
