//! The [`MemoryResource`] trait, the adapter that lets a memory resource free adopted memory at
//! teardown, and the checks every resource shares (sizes, devices).

use std::sync::Arc;

use handles::{
    ContextHandle, Deallocator, DevicePtrHandle, HandleError, OwnedAllocation, StreamHandle,
};

use crate::{Buffer, MemoryError};

/// Something that hands out memory and takes it back: a device or pinned pool, pinned host
/// memory, managed memory, `cuMemAlloc`, graph memory, or an implementation of the caller's
/// (a Python subclass, through the bindings).
///
/// The trait is object-safe; buffers hold their resource as `Arc<dyn MemoryResource>`.
/// Implementations must be `Send + Sync`: [`MemoryResource::deallocate`] of adopted memory runs
/// wherever the buffer's last reference goes (any user thread, the cleanup worker), with the
/// deallocation recipe's context current (docs/decisions.md D2).
///
/// Allocating takes the resource by `Arc` because the buffer keeps it: call it as
/// `Arc::clone(&mr).allocate(size, &stream)` (one atomic increment, the reference the buffer
/// holds).
pub trait MemoryResource: Send + Sync + 'static {
    /// Allocates `size` bytes ordered on `stream`, which also becomes the buffer's
    /// deallocation stream (the free will be ordered on it, in its context, unless
    /// [`Buffer::set_deallocation_stream`] replaces it).
    ///
    /// # Errors
    /// [`MemoryError::InvalidSize`] for zero bytes or more than `isize::MAX`;
    /// [`MemoryError::WrongDevice`] for a stream of another device; others as each resource
    /// documents. Nothing is allocated on error.
    fn allocate(self: Arc<Self>, size: usize, stream: &StreamHandle)
        -> Result<Buffer, MemoryError>;

    /// Frees `allocation`, which this resource allocated, ordered on `stream`.
    ///
    /// Called explicitly, or at teardown for memory adopted with [`Buffer::adopt`] (unless the
    /// resource's [`MemoryResource::adopt`] chose a built-in release rule). Buffers that a
    /// resource allocated itself are freed by their handle's rule, not through this method.
    /// The [`OwnedAllocation`] is the right to free: safe code cannot make one for an address
    /// it does not own (`handles::raw::owned_allocation` is `unsafe`), so no safe call frees
    /// arbitrary memory.
    ///
    /// # Errors
    /// The driver's (or the implementation's) failure: returned by an explicit call or
    /// [`Buffer::close`], reported through the cleanup-error hook on a drop.
    fn deallocate(
        &self,
        allocation: OwnedAllocation,
        stream: &StreamHandle,
    ) -> Result<(), MemoryError>;

    /// Whether a device can read and write the memory.
    fn is_device_accessible(&self) -> bool;

    /// Whether the host can read and write the memory.
    fn is_host_accessible(&self) -> bool;

    /// The device the memory lives on or belongs to; `None` for memory bound to no device
    /// (pinned host memory).
    fn device_id(&self) -> Option<i32>;

    /// Whether the memory is managed (`cuMemAllocManaged`). Default: `false`.
    fn is_managed(&self) -> bool {
        false
    }

    /// The resource as its user knows it, for cleanup reports about memory it frees (a binding's
    /// resource: its class's name). Default: the Rust type's name without its module path.
    fn name(&self) -> &str {
        let full = std::any::type_name::<Self>();
        full.rsplit("::").next().unwrap_or(full)
    }

    /// Takes `allocation` into custody for [`Buffer::adopt`], to be freed with the recipe
    /// recorded now for `stream`.
    ///
    /// The default frees through [`MemoryResource::deallocate`] at teardown. A host-only
    /// resource (`is_device_accessible()` false) records no recipe: its memory is host memory
    /// no device work touches, so `stream` is not recorded, no context is needed, and
    /// `deallocate` receives the legacy default-stream token (unbound). The built-in
    /// synchronous resources (legacy pinned, managed, synchronous) override it to use the
    /// matching built-in release rule instead, whose drop never blocks on the GPU
    /// (docs/decisions.md D9), where their `deallocate` must synchronise.
    ///
    /// # Errors
    /// [`MemoryError::WrongDevice`] for a stream of another device than the resource's
    /// (device-only memory); [`MemoryError::Handle`] when the recipe cannot be recorded
    /// ([`HandleError::NoCurrentContext`] for an unbound token on a thread with no context) or
    /// the address is null. The recipe is recorded before ownership is taken: on error the
    /// allocation comes back in the [`AdoptError`] and `deallocate` has not been called
    /// (docs/decisions.md D5).
    fn adopt(
        self: Arc<Self>,
        allocation: OwnedAllocation,
        stream: &StreamHandle,
    ) -> Result<DevicePtrHandle, AdoptError> {
        if !self.is_device_accessible() {
            // Host-only memory: no device work can touch it, so nothing orders or legalises
            // its free; `stream` is not recorded and `deallocate` gets the legacy default
            // stream, with no context needed (docs/decisions.md D5).
            let deallocator: Arc<dyn Deallocator> = Arc::new(MemoryResourceDeallocator(self));
            return DevicePtrHandle::adopt_host(allocation, deallocator).map_err(AdoptError::from);
        }
        if self.is_device_accessible() && !self.is_host_accessible() && !self.is_managed() {
            if let Some(device) = self.device_id() {
                if let Err(error) = check_stream_device(stream, device) {
                    return Err(AdoptError { error, allocation });
                }
            }
        }
        let deallocator: Arc<dyn Deallocator> = Arc::new(MemoryResourceDeallocator(self));
        DevicePtrHandle::adopt(allocation, stream, deallocator).map_err(AdoptError::from)
    }
}

/// An adoption that was refused ([`Buffer::adopt`], [`MemoryResource::adopt`]), with the
/// allocation given back: nothing was taken, nothing freed, and the memory is still the
/// caller's to free or to adopt again.
#[derive(Debug, thiserror::Error)]
#[error("{error}")]
pub struct AdoptError {
    /// Why the adoption was refused.
    #[source]
    pub error: MemoryError,
    /// The allocation, still the caller's.
    pub allocation: OwnedAllocation,
}

impl From<handles::AdoptError> for AdoptError {
    fn from(refused: handles::AdoptError) -> AdoptError {
        let handles::AdoptError { error, allocation } = refused;
        AdoptError {
            error: device_error(error),
            allocation,
        }
    }
}

/// Frees adopted memory through its memory resource's `deallocate` (the handles crate's
/// [`Deallocator`] for a [`MemoryResource`]).
struct MemoryResourceDeallocator<R: ?Sized>(Arc<R>);

impl<R: MemoryResource + ?Sized> Deallocator for MemoryResourceDeallocator<R> {
    fn deallocate(
        &self,
        allocation: OwnedAllocation,
        stream: &StreamHandle,
    ) -> Result<(), HandleError> {
        self.0
            .deallocate(allocation, stream)
            .map_err(HandleError::from)
    }

    fn name(&self) -> &str {
        self.0.name()
    }
}

/// Rejects sizes no allocation can have.
#[inline]
pub(crate) fn check_size(size: usize) -> Result<(), MemoryError> {
    if size == 0 {
        return Err(MemoryError::InvalidSize {
            size,
            reason: "an allocation needs at least one byte",
        });
    }
    if size > isize::MAX as usize {
        return Err(MemoryError::InvalidSize {
            size,
            reason: "no allocation can exceed isize::MAX bytes",
        });
    }
    Ok(())
}

/// The device `stream` runs on: its context's, or for an unbound default-stream token the
/// device of the context current on the calling thread.
///
/// Driver calls: `cuCtxGetCurrent` (unbound tokens only).
pub(crate) fn stream_device(stream: &StreamHandle) -> Result<i32, MemoryError> {
    match stream.context() {
        Some(context) => Ok(context.device()),
        None => Ok(ContextHandle::current()?
            .ok_or(HandleError::NoCurrentContext)?
            .device()),
    }
}

/// Checks that `stream` runs on `device` when that needs no driver call (a stream that
/// carries its context); an unbound token is left to the handles crate, whose error
/// [`device_error`] turns into [`MemoryError::WrongDevice`].
#[inline]
pub(crate) fn check_bound_stream_device(
    stream: &StreamHandle,
    device: i32,
) -> Result<(), MemoryError> {
    match stream.context() {
        Some(context) if context.device() != device => Err(MemoryError::WrongDevice {
            expected: device,
            found: context.device(),
        }),
        _ => Ok(()),
    }
}

/// Checks that `stream` runs on `device`, resolving an unbound token against the current
/// context.
///
/// Driver calls: `cuCtxGetCurrent` (unbound tokens only).
pub(crate) fn check_stream_device(stream: &StreamHandle, device: i32) -> Result<(), MemoryError> {
    let found = stream_device(stream)?;
    if found != device {
        return Err(MemoryError::WrongDevice {
            expected: device,
            found,
        });
    }
    Ok(())
}

/// Maps the handles crate's "stream of another device" rejection (found while recording a
/// recipe) to [`MemoryError::WrongDevice`]; any other error passes through.
#[cold]
pub(crate) fn device_error(error: HandleError) -> MemoryError {
    match error {
        HandleError::WrongDevice { expected, found } => {
            MemoryError::WrongDevice { expected, found }
        }
        error => MemoryError::Handle(error),
    }
}
