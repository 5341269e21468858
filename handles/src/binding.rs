//! What only a binding needs: a layer that holds custody's objects on behalf of another runtime
//! (the Python bindings) and must choose where a stream's or a context's last reference is
//! dropped (with its interpreter lock released: their drop calls the driver), or must know how
//! lent memory is freed to choose whether to release its lock around the free, or must count a
//! handle's holders without holding it (a garbage collector's traversal). Rust code has
//! [`DevicePtrHandle::release`] and [`DevicePtrHandle::set_deallocation_stream`], which drop
//! what they replace; these do the same step and hand it back instead (the module's name says
//! who they are for, as rustls' `danger` module does).

use std::sync::{Arc, Weak};

use crate::deviceptr::DevicePtrHandle;
use crate::error::HandleError;
use crate::recipe::{DeallocationRecipe, RecipeRemains};
use crate::release::{PtrBox, ReleaseKind};
use crate::stream::StreamHandle;

/// [`DevicePtrHandle::release`], handing back what the recipe held last instead of dropping it:
/// when this recipe's stream or context had no other holder, their remains, whose drop makes a
/// driver call (`cuStreamDestroy`, a context release). Unlike taking a
/// [`recipe`](DevicePtrHandle::recipe) copy first, this costs no lock and no reference-count
/// increment. `None` when other clones remain (nothing freed), when the memory has no recipe,
/// or when the free was deferred (then the deferred work holds the recipe).
///
/// # Errors
/// As [`DevicePtrHandle::release`]; the remains come back either way.
///
/// Driver calls: as [`DevicePtrHandle::release`], without the recipe's own last release.
pub fn release_with_remains(
    handle: DevicePtrHandle,
) -> (Result<(), HandleError>, Option<RecipeRemains>) {
    let (result, recipe) = PtrBox::release_last(handle.0);
    (
        result,
        recipe.and_then(DeallocationRecipe::into_last_references),
    )
}

/// [`DevicePtrHandle::set_deallocation_stream`], returning the replaced recipe instead of
/// dropping it (`None` when the memory has no recipe), so that the caller decides where its
/// last references to a stream or context are dropped
/// ([`DeallocationRecipe::into_last_references`]).
///
/// # Errors
/// As [`DevicePtrHandle::set_deallocation_stream`].
///
/// Driver calls: `cuCtxGetCurrent` (unbound tokens only).
pub fn replace_deallocation_stream(
    handle: &DevicePtrHandle,
    stream: &StreamHandle,
) -> Result<Option<DeallocationRecipe>, HandleError> {
    handle.0.replace_recipe(stream)
}

/// For lent memory ([`ReleaseKind::Lent`]), the release family of the lender's block behind it
/// (which frees the memory when the lender does); `None` for every other family.
pub fn lent_block_kind(handle: &DevicePtrHandle) -> Option<ReleaseKind> {
    handle.0.release.lent_block_kind()
}

/// How many [`DevicePtrHandle`]s share one allocation, read without being one of them (a weak
/// reference to their shared box): it never keeps the memory allocated, and reading it takes no
/// lock and changes no count, as a binding's garbage-collector traversal requires. 0 once the
/// last handle is gone.
#[derive(Clone, Debug)]
pub struct HandleCount(Weak<PtrBox>);

impl HandleCount {
    /// The reader of `handle`'s count ([`DevicePtrHandle::handle_count`]).
    pub fn of(handle: &DevicePtrHandle) -> HandleCount {
        HandleCount(Arc::downgrade(&handle.0))
    }

    /// The number of handles now.
    pub fn get(&self) -> usize {
        self.0.strong_count()
    }
}
