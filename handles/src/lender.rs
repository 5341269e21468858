//! [`Lender`]: how a lender outside this crate (a caching memory resource in `memory`) plugs
//! into the lent family, and [`DevicePtrHandle::lend`], the one constructor that takes one. This
//! crate names no lender type: the lent family (`release/lent.rs`) calls every lender through
//! its crate-private `GiveBack` form, which this module gives each [`Lender`]
//! (handles/DESIGN.md, "Release families").

use std::sync::Arc;

use crate::deviceptr::DevicePtrHandle;
use crate::error::HandleError;
use crate::recipe::DeallocationRecipe;
use crate::release::{GiveBack, Lent, PtrBox, Release, Returned};
use crate::stream::StreamHandle;

/// Where memory lent out of one of a lender's blocks goes back when its last handle goes
/// ([`DevicePtrHandle::lend`], [`ReleaseKind::Lent`](crate::ReleaseKind::Lent)): a caching
/// memory resource's bins, say.
///
/// Called once per lent handle, by whoever drops (or releases) the last clone, on that thread
/// (a user thread, the cleanup worker, a drain), never with a lock of this crate held. By then
/// the block carries the lent handle's last recipe (its stream is [`Returned::stream`]) and the
/// free's stream has been made to wait for the declared use streams (docs/decisions.md D12), so
/// work enqueued on that stream after this call is ordered after every use of the memory.
pub trait Lender: Send + Sync {
    /// Takes `block` back; `returned` says on which stream its free is ordered, whether that
    /// stream's raw value can key a bin, and whether the release is explicit. To free the
    /// block, release it (explicit) or drop it.
    ///
    /// # Errors
    /// The block's own free failing (an explicit release); returned by the lent handle's
    /// explicit release, reported through the cleanup-error hook on a drop.
    fn give_back(&self, block: DevicePtrHandle, returned: &Returned<'_>)
        -> Result<(), HandleError>;

    /// The lender as its user knows it, for cleanup reports. Default: the Rust type's name.
    fn name(&self) -> &str {
        std::any::type_name::<Self>()
    }
}

/// Every lender is what the lent family calls (which works on the block's box).
impl<L: Lender> GiveBack for L {
    fn give_back_box(
        &self,
        block: Arc<PtrBox>,
        returned: &Returned<'_>,
    ) -> Result<(), HandleError> {
        self.give_back(DevicePtrHandle(block), returned)
    }

    fn lender_name(&self) -> &str {
        self.name()
    }
}

impl DevicePtrHandle {
    /// Lends the first `size` bytes of `block`, one of `lender`'s allocations, as memory ordered
    /// on `stream` ([`ReleaseKind::Lent`](crate::ReleaseKind::Lent)): the new handle has its
    /// own recipe (recorded now for `stream`) and its own declared uses, and when its last
    /// clone goes, `block` goes back to `lender` ([`Lender::give_back`]) carrying that handle's
    /// last recipe, after the free's stream was made to wait for the declared uses
    /// (docs/decisions.md D12). A free on a capturing stream hands the lent handle to the
    /// capture's graph first, as for a deallocator (D11); a free whose uses cannot be ordered
    /// leaks the block rather than let it be reused or freed unordered. The block's own family
    /// frees it when the lender releases or drops it.
    ///
    /// # Errors
    /// With `block` given back: [`HandleError::InvalidArgument`] for a zero `size`, one larger
    /// than the block, a block with no recipe (owner-kept, borrowed or host-only memory) or one
    /// with other clones (a block is lent by its one holder); [`HandleError::NoCurrentContext`]
    /// for an unbound token on a thread with no context; [`HandleError::WrongDevice`] for a
    /// stream of another device than the block's memory.
    ///
    /// Driver calls: `cuCtxGetCurrent` (unbound tokens only); none at release (the block's own
    /// family makes the driver calls when the lender frees it; declared uses as
    /// [`DevicePtrHandle::record_use`] says).
    pub fn lend<L: Lender + 'static>(
        block: DevicePtrHandle,
        size: usize,
        stream: &StreamHandle,
        lender: Arc<L>,
    ) -> Result<DevicePtrHandle, (HandleError, DevicePtrHandle)> {
        if let Some(reason) = Lent::refusal(&block.0, size) {
            return Err((HandleError::invalid("block", reason), block));
        }
        let recipe = match DeallocationRecipe::record_for(stream, block.0.device) {
            Ok(recipe) => recipe,
            Err(error) => return Err((error, block)),
        };
        let (ptr, device) = (block.ptr(), block.0.device);
        let lender: Arc<dyn GiveBack> = lender;
        let release = Release::Lent(Lent::new(block.0, lender));
        Ok(Self::from_parts(ptr, size, device, Some(recipe), release))
    }
}
