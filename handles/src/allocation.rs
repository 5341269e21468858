//! Memory outside custody and who frees it: [`OwnedAllocation`] (the right to free an
//! allocation), [`AdoptError`] (an adoption refused, the allocation given back) and the
//! [`Deallocator`] trait (frees adopted memory at teardown).

use std::fmt;

use cuda_sys::types::{c_void, CUdeviceptr};

use crate::stream::StreamHandle;
use crate::HandleError;

/// Frees memory that custody adopted from elsewhere (a user's memory resource).
///
/// Called once, by whoever drops the last handle, with the recipe's context current (see
/// [`crate::ContextScope`]) and the recipe's stream; on a thread chosen by the drop, which may be the
/// cleanup worker. It must not block on a lock that the dropping thread may hold.
pub trait Deallocator: Send + Sync {
    /// Frees `allocation` (its [`OwnedAllocation::size`] bytes at [`OwnedAllocation::ptr`]),
    /// ordered on `stream`. The deallocator now owns the allocation: it frees it (with one of
    /// [`OwnedAllocation`]'s frees, or by its own means), and dropping it unfreed leaks it.
    ///
    /// # Errors
    /// Whatever the deallocator reports (as [`HandleError::deallocator`]): returned by an
    /// explicit [`DevicePtrHandle::release`](crate::DevicePtrHandle::release), reported through the cleanup-error hook on a drop.
    fn deallocate(
        &self,
        allocation: OwnedAllocation,
        stream: &StreamHandle,
    ) -> Result<(), HandleError>;

    /// The deallocator as its user knows it (a memory resource's class name, say), for
    /// cleanup reports. Default: the Rust type's name.
    fn name(&self) -> &str {
        std::any::type_name::<Self>()
    }
}

/// An allocation outside custody, with the right to free it: what a [`Deallocator`] is handed
/// when the last handle to memory it owns goes, and what [`DevicePtrHandle::adopt`](crate::DevicePtrHandle::adopt) and
/// [`DevicePtrHandle::adopt_synchronous`](crate::DevicePtrHandle::adopt_synchronous) take into
/// custody.
///
/// Made by this crate (handing memory it owned to a deallocator) or by the caller of
/// [`crate::raw::owned_allocation`], who vouches for it. Consuming it is safe: one of the frees
/// below, or adoption. Dropping it frees nothing (the memory leaks); [`OwnedAllocation::into_raw`]
/// gives the responsibility back as a raw address. Not `Clone`: the right to free exists once.
#[must_use = "dropping an OwnedAllocation leaks its memory"]
pub struct OwnedAllocation {
    ptr: CUdeviceptr,
    size: usize,
}

impl OwnedAllocation {
    /// Made only here and by [`crate::raw::owned_allocation`].
    #[inline]
    pub(crate) fn new(ptr: CUdeviceptr, size: usize) -> OwnedAllocation {
        OwnedAllocation { ptr, size }
    }

    /// The address (a host address for pinned host memory).
    #[inline]
    pub fn ptr(&self) -> CUdeviceptr {
        self.ptr
    }

    /// The size in bytes.
    #[inline]
    pub fn size(&self) -> usize {
        self.size
    }

    /// Gives up the token without freeing: the caller is responsible for the memory again.
    pub fn into_raw(self) -> (CUdeviceptr, usize) {
        (self.ptr, self.size)
    }

    /// Frees a stream-ordered allocation (`cuMemAllocAsync`, `cuMemAllocFromPoolAsync`, an IPC
    /// import) ordered on `stream`. Does not block.
    ///
    /// # Errors
    /// [`HandleError::NoCurrentContext`] for an unbound default-stream token on a thread with
    /// no context; [`HandleError::Driver`] for the driver's failure (a pointer it does not know
    /// as stream-ordered memory); the memory is then still allocated, and the token gone;
    /// [`HandleError::ContextNotActivated`] / [`HandleError::ContextNotRestored`] for a bound
    /// token's context switch.
    ///
    /// Driver calls: `cuMemFreeAsync`; on a created or wrapped stream nothing else (F4, F8), on a
    /// bound token `cuCtxGetCurrent` and `cuCtxSetCurrent` (if needed) around it.
    pub fn free_async(self, stream: &StreamHandle) -> Result<(), HandleError> {
        let ptr = self.ptr;
        stream.run_free("cuMemFreeAsync", |d, s| {
            // SAFETY: the token is the right to free this allocation, used once (consumed); the
            // stream handle is alive.
            unsafe { (d.cuMemFreeAsync)(ptr, s) }
        })
    }

    /// Frees a `cuMemAlloc` or `cuMemAllocManaged` allocation after the work queued on
    /// `stream`: **blocks** until the stream has drained, then frees. For an explicit free only:
    /// a drop must never come here (docs/decisions.md D9).
    ///
    /// # Errors
    /// As [`OwnedAllocation::free_async`], and the stream's failure, in which case nothing is
    /// freed.
    ///
    /// Driver calls: `cuStreamSynchronize`, `cuMemFree_v2`; on a bound token in its context
    /// (`cuCtxGetCurrent`, `cuCtxSetCurrent` if needed), on a created or wrapped stream with no
    /// context call (F5, F6).
    pub fn free_device_sync(self, stream: &StreamHandle) -> Result<(), HandleError> {
        let ptr = self.ptr;
        stream.synchronize_then_free("cuMemFree_v2", |d| {
            // SAFETY: the token is the right to free this allocation, used once; the stream has
            // drained.
            unsafe { (d.cuMemFree_v2)(ptr) }
        })
    }

    /// Frees pinned host memory (`cuMemAllocHost`) after the work queued on `stream`:
    /// **blocks** until the stream has drained, then frees. Explicit frees only (D9).
    ///
    /// # Errors
    /// As [`OwnedAllocation::free_device_sync`].
    ///
    /// Driver calls: `cuStreamSynchronize`, `cuMemFreeHost`, with the context rule of
    /// [`OwnedAllocation::free_device_sync`].
    pub fn free_host_sync(self, stream: &StreamHandle) -> Result<(), HandleError> {
        let ptr = self.ptr;
        stream.synchronize_then_free("cuMemFreeHost", |d| {
            // SAFETY: the token is the right to free this allocation, used once; the stream has
            // drained.
            unsafe { (d.cuMemFreeHost)(ptr as *mut c_void) }
        })
    }
}

impl fmt::Debug for OwnedAllocation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "OwnedAllocation(0x{:x}, {} bytes)", self.ptr, self.size)
    }
}

/// An adoption that was refused, with the allocation given back: nothing was taken or freed.
#[derive(Debug, thiserror::Error)]
#[error("{error}")]
pub struct AdoptError {
    /// Why the adoption was refused.
    pub error: HandleError,
    /// The allocation, still the caller's.
    pub allocation: OwnedAllocation,
}

/// For `?` in functions returning [`HandleError`]: the allocation is given up unfreed (leaked),
/// never freed.
impl From<AdoptError> for HandleError {
    fn from(error: AdoptError) -> HandleError {
        let AdoptError { error, allocation } = error;
        let _ = allocation.into_raw();
        error
    }
}
