//! What only a binding needs (`memory::binding`, beside `handles::binding`): a layer that holds
//! custody's buffers on behalf of another runtime (the Python bindings) and must choose where a
//! stream's or a context's last reference is dropped (with its interpreter lock released: their
//! drop calls the driver), or must know, before it gives up that lock, whether an allocation
//! needs the driver at all. Rust code has [`Buffer::close`], [`Buffer::set_deallocation_stream`]
//! and [`MemoryResource::allocate`](crate::MemoryResource::allocate); these do the same step and
//! hand back what those drop, or answer only when no driver call is needed (the module's name
//! says who they are for, as rustls' `danger` module does).

use std::sync::Arc;

use handles::{DeallocationRecipe, RecipeRemains, StreamHandle};

use crate::{Buffer, CachingMemoryResource, MemoryError};

/// [`Buffer::set_deallocation_stream`], returning the replaced recipe instead of dropping it
/// (`None` for memory without a recipe), so that the caller chooses where a last reference to
/// the old stream or context is dropped ([`DeallocationRecipe::into_last_references`]).
///
/// # Errors
/// As [`Buffer::set_deallocation_stream`].
///
/// Driver calls: `cuCtxGetCurrent` (default-stream tokens only); none for a stream that carries
/// a context custody holds (created, or foreign in a primary context), also on the error paths;
/// `cuCtxGetId` for a stream in a context custody does not hold.
pub fn replace_deallocation_stream(
    buffer: &Buffer,
    stream: &StreamHandle,
) -> Result<Option<DeallocationRecipe>, MemoryError> {
    buffer.replace_recipe(stream)
}

/// [`Buffer::close`], handing back the remains of the recipe's stream or context when the recipe
/// held their last reference (their drop calls `cuStreamDestroy` or releases a context), so that
/// the caller chooses where that happens: a binding drops them with the interpreter lock
/// released. Cheaper than taking a copy of the recipe before the close (no lock, no
/// reference-count increment). [`handles::binding::release_with_remains`] says when there are
/// none.
///
/// # Errors
/// As [`Buffer::close`]; the remains come back either way.
///
/// Driver calls: as [`Buffer::close`], without the recipe's own last release.
pub fn close_with_remains(buffer: Buffer) -> (Result<(), MemoryError>, Option<RecipeRemains>) {
    buffer.close_keeping(true)
}

/// [`MemoryResource::allocate`](crate::MemoryResource::allocate) of `mr` when a block cached for
/// `stream` itself serves it, `None` otherwise (nothing done: a miss, a request no bin serves, a
/// default stream, a closed resource, a capture begun through custody running anywhere): the
/// allocation path that never calls the driver and never blocks beyond the bins' lock, for a
/// caller that would otherwise give up a lock of its own around the call (the Python
/// interpreter lock) and can then call `allocate`.
///
/// Driver calls: none.
pub fn allocate_cached(
    mr: &Arc<CachingMemoryResource>,
    size: usize,
    stream: &StreamHandle,
) -> Option<Buffer> {
    mr.allocate_cached(size, stream)
}
