//! The doors through which a raw address or a raw driver handle enters custody. Every function
//! here is `unsafe`: the caller vouches for what the value names, because custody cannot check
//! it and everything safe built on the resulting handle trusts it.
//!
//! Past these doors nothing safe takes a raw address: memory is read and written through a
//! [`DeviceRange`](crate::DeviceRange) of a [`DevicePtrHandle`], whose bounds are checked
//! against the size vouched for here (or reported by the driver, for memory custody allocated);
//! memory is freed by the handle's release rule or by consuming an [`OwnedAllocation`].
//!
//! So a program that points custody at memory it does not own says `unsafe`, or does not
//! compile:
//!
//! ```compile_fail
//! let words = vec![0u8; 16]; // immutable
//! // error[E0133]: call to unsafe function is unsafe and requires an unsafe block
//! let view = handles::raw::borrowed(words.as_ptr() as u64, words.len());
//! ```
//!
//! ```compile_fail
//! let words = vec![0u8; 16];
//! // error[E0624]: the constructors behind `raw` are private
//! let view = handles::DevicePtrHandle::borrowed(words.as_ptr() as u64, words.len());
//! ```
//!
//! ```compile_fail
//! // error[E0425]: there is no copy, fill or free that takes a raw address
//! handles::copy_async(0x1000, 0x2000, 16, &handles::StreamHandle::legacy());
//! ```
//!
//! With the `unsafe` block, and its promise kept, the same view is usable through ranges:
//!
//! ```no_run
//! # fn main() -> Result<(), handles::HandleError> {
//! let mut bytes = vec![0u8; 16];
//! // SAFETY: `bytes` outlives `view`, and no Rust reference to it is used while the copy runs.
//! let view = unsafe { handles::raw::borrowed(bytes.as_mut_ptr() as u64, bytes.len()) };
//! let context = handles::ContextHandle::primary(0)?;
//! let stream = handles::StreamHandle::create(&context, handles::StreamFlags::DEFAULT, 0)?;
//! view.as_range().copy_from_host(&[7; 16], &stream)?;
//! drop(view);
//! assert_eq!(bytes, [7; 16]);
//! # Ok(())
//! # }
//! ```

use std::any::Any;

use cuda_sys::types::{CUcontext, CUdeviceptr, CUmemoryPool};

use crate::allocation::OwnedAllocation;
use crate::context::ContextHandle;
use crate::deviceptr::DevicePtrHandle;
use crate::error::HandleError;
use crate::pool::MemoryPoolHandle;
use crate::stream::StreamHandle;

/// The right to free `size` bytes at `ptr`, as a token that adoption
/// ([`DevicePtrHandle::adopt`], [`DevicePtrHandle::adopt_synchronous`]) takes into custody and
/// that [`OwnedAllocation`]'s frees consume. No driver call.
///
/// # Safety
/// - `ptr` is the start of an allocation the driver made (device, pinned host, managed or
///   stream-ordered memory), or of one a memory resource made that the token's consumer frees
///   by that resource's own means, and the allocation holds at least `size` bytes;
/// - the caller owns it and gives the right to free it to the token: nothing else frees it,
///   and nothing uses it after the token's consumer has freed it;
/// - while custody may read or write it (through ranges of a handle made from the token), no
///   Rust reference to its bytes exists that those reads and writes would violate.
pub unsafe fn owned_allocation(ptr: CUdeviceptr, size: usize) -> OwnedAllocation {
    OwnedAllocation::new(ptr, size)
}

/// A handle naming `size` bytes at `ptr` that nobody owns as far as custody knows: nothing is
/// freed at release. No driver call.
///
/// # Safety
/// For as long as the handle or any clone of it lives (a graph node keeps clones until the
/// graph and its executables are gone): the `size` bytes at `ptr` stay allocated and usable by
/// the driver's copies and fills (device, pinned host or managed memory, or host memory the
/// driver can reach), and no Rust reference to them exists that a copy or fill through the
/// handle would violate. So `size` is at most `isize::MAX`: no allocation is larger (the
/// crates above refuse more at allocation and adoption, before they reach this door).
pub unsafe fn borrowed(ptr: CUdeviceptr, size: usize) -> DevicePtrHandle {
    DevicePtrHandle::borrowed(ptr, size)
}

/// A handle naming `size` bytes at `ptr` that `owner` keeps alive: the owner is dropped with
/// the last handle and nothing is freed. No driver call.
///
/// # Errors
/// [`HandleError::InvalidArgument`] for a null `ptr` (`owner` is dropped).
///
/// # Safety
/// As [`borrowed`], for as long as `owner` lives: the bytes stay valid until `owner` is
/// dropped, which happens after the last handle is gone.
pub unsafe fn with_owner(
    ptr: CUdeviceptr,
    size: usize,
    owner: Box<dyn Any + Send + Sync>,
) -> Result<DevicePtrHandle, HandleError> {
    DevicePtrHandle::with_owner(ptr, size, owner)
}

/// Wraps a stream made by other code (the integer value of its `CUstream`), without destroying
/// it later.
///
/// A token value (0, 0x1, 0x2) gives the unbound token: the value decides, not the caller's
/// intent. A stream this crate created and still owns gives that owned handle back, so a recipe
/// recorded through the wrapper keeps the stream alive. Any other stream gets its context from
/// `cuStreamGetCtx` now, and `owner` (if any) is kept until the last clone drops.
///
/// # Errors
/// [`HandleError::Driver`] when `cuStreamGetCtx` rejects the stream.
///
/// # Safety
/// Unless `raw` is a token or a stream this crate owns: `raw` is a live stream, and it stays
/// alive (not destroyed) while the handle, any clone, or any deallocation recipe recorded with
/// it lives (`owner` may be what keeps it alive). A free issued on a destroyed stream kills the
/// process on a real driver (docs/driver-facts.md F11).
///
/// Driver calls: `cuStreamGetCtx` and those of [`wrap_context`], and `cuStreamGetId` without an
/// owner ([`StreamHandle::unpinned_id`]) (none for tokens or streams this crate owns).
pub unsafe fn wrap_stream(
    raw: usize,
    owner: Option<Box<dyn Any + Send + Sync>>,
) -> Result<StreamHandle, HandleError> {
    StreamHandle::from_raw(raw, owner)
}

/// Wraps a context made by other code, without taking ownership.
///
/// If `raw` is a context this crate created and still owns, or a device's primary context, the
/// returned handle keeps it alive (created: shares ownership; primary: retains it). The device
/// is read by making `raw` current briefly (restored after).
///
/// # Errors
/// [`HandleError::InvalidArgument`] for a null context; [`HandleError::Driver`] when the
/// driver rejects `raw`.
///
/// # Safety
/// `raw` is a live context, and (unless it is a primary context or one this crate created) it
/// stays alive while the handle, any clone, and any recipe or stream holding it lives.
///
/// Driver calls: `cuCtxGetCurrent`, `cuCtxSetCurrent` (twice, when `raw` is not already
/// current), `cuCtxGetDevice`, `cuDevicePrimaryCtxGetState`, `cuDevicePrimaryCtxRetain`;
/// `cuCtxGetId` for a context that is neither primary nor one this crate created.
pub unsafe fn wrap_context(raw: CUcontext) -> Result<ContextHandle, HandleError> {
    ContextHandle::from_raw_borrowed(raw)
}

/// Wraps a memory pool made by other code, without destroying it later. `device` is the pool's
/// device, `None` for a host pool. No driver call.
///
/// # Errors
/// [`HandleError::InvalidArgument`] for a null pool.
///
/// # Safety
/// `raw` is a live pool on `device` (or a host pool, for `None`), and it stays alive while the
/// handle, any clone, and any allocation made from it lives.
pub unsafe fn wrap_pool(
    raw: CUmemoryPool,
    device: Option<i32>,
) -> Result<MemoryPoolHandle, HandleError> {
    MemoryPoolHandle::from_raw_borrowed(raw, device)
}
