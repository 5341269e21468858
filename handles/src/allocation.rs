//! Memory outside custody and who frees it: [`OwnedAllocation`] (the right to free an
//! allocation), [`AdoptError`] (an adoption refused, the allocation given back), the
//! [`Deallocator`] trait (frees adopted memory at teardown) and [`call_deallocator`], which calls
//! one and tells what became of the allocation when it fails or panics.

use std::cell::Cell;
use std::fmt;
use std::panic::{catch_unwind, AssertUnwindSafe};

use cuda_sys::types::{c_void, CUdeviceptr};

use crate::error::HandleError;
use crate::report::Consequence;
use crate::stream::StreamHandle;

/// Frees memory that custody adopted from elsewhere (a user's memory resource).
///
/// Called once, by whoever drops the last handle, with the recipe's context current (see
/// [`crate::ContextScope`]) and the recipe's stream; on a thread chosen by the drop, which may be the
/// cleanup worker. It must not block on a lock that the dropping thread may hold.
///
/// What custody knows of the free when the call fails: it sees the [`OwnedAllocation`] it hands
/// over freed by one of its frees, dropped unfreed, or given up with
/// [`OwnedAllocation::into_raw`], on the calling thread during the call. An error return means
/// "not freed" (reported as leaked) unless custody saw the allocation freed by one of its frees.
/// A panic is caught and reported with what custody saw: freed (one of the token's frees
/// succeeded), leaked (the token was dropped unfreed, or its free failed), or, when the token
/// was given up with `into_raw` or passed out of sight, that whether the memory was freed cannot
/// be known ([`crate::Consequence::Unknown`]); see [`DeallocatorPanic`].
pub trait Deallocator: Send + Sync {
    /// Frees `allocation` (its [`OwnedAllocation::size`] bytes at [`OwnedAllocation::ptr`]),
    /// ordered on `stream`. The deallocator now owns the allocation: it frees it (with one of
    /// [`OwnedAllocation`]'s frees, or by its own means), and dropping it unfreed leaks it.
    ///
    /// # Errors
    /// Whatever the deallocator reports (as [`HandleError::deallocator`]), which should mean
    /// that the memory was not freed: returned by an explicit
    /// [`DevicePtrHandle::release`](crate::DevicePtrHandle::release), reported through the
    /// cleanup-error hook on a drop (as leaked, unless one of the token's frees freed it).
    ///
    /// # Panics
    /// A panic does not cross custody: it is caught and becomes a [`HandleError::Deallocator`]
    /// whose source is a [`DeallocatorPanic`], saying whether the memory was freed.
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
        let taken = self.take();
        witness(taken.0, Fate::GivenUp);
        taken
    }

    /// The address and size, without the drop's note that the token went unfreed.
    #[inline]
    fn take(self) -> (CUdeviceptr, usize) {
        let taken = (self.ptr, self.size);
        std::mem::forget(self);
        taken
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
        let (ptr, _) = self.take();
        let result = stream.run_free("cuMemFreeAsync", |d, s| {
            // SAFETY: the token is the right to free this allocation, used once (consumed); the
            // stream handle is alive.
            unsafe { (d.cuMemFreeAsync)(ptr, s) }
        });
        witness_free(ptr, &result);
        result
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
        let (ptr, _) = self.take();
        let result = stream.synchronize_then_free("cuMemFree_v2", |d| {
            // SAFETY: the token is the right to free this allocation, used once; the stream has
            // drained.
            unsafe { (d.cuMemFree_v2)(ptr) }
        });
        witness_free(ptr, &result);
        result
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
        let (ptr, _) = self.take();
        let result = stream.synchronize_then_free("cuMemFreeHost", |d| {
            // SAFETY: the token is the right to free this allocation, used once; the stream has
            // drained.
            unsafe { (d.cuMemFreeHost)(ptr as *mut c_void) }
        });
        witness_free(ptr, &result);
        result
    }
}

/// Dropping the token frees nothing (the memory leaks); inside a deallocator's call the drop is
/// noted, so that a deallocator that panics holding it is reported as having leaked it.
impl Drop for OwnedAllocation {
    fn drop(&mut self) {
        witness(self.ptr, Fate::Dropped);
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

/// What became of the token handed to a deallocator, as seen on the calling thread during the
/// call (the last thing done with it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fate {
    /// Nothing seen: the token is still held, or was passed on (another thread, a global).
    Unseen,
    /// One of the token's frees succeeded.
    Freed,
    /// One of the token's frees failed: nothing was freed.
    FreeFailed,
    /// Dropped unfreed (by the deallocator, or while its panic unwound).
    Dropped,
    /// Given up with [`OwnedAllocation::into_raw`]: freed or not by the deallocator's own means.
    GivenUp,
}

thread_local! {
    /// The address of the allocation the innermost [`call_deallocator`] on this thread handed
    /// over, and its fate so far.
    static WATCHED: Cell<Option<(CUdeviceptr, Fate)>> = const { Cell::new(None) };
}

/// Notes `fate` for `ptr` when it is the allocation a deallocator on this thread was handed.
#[inline]
fn witness(ptr: CUdeviceptr, fate: Fate) {
    // `try_with`: a token dropped while this thread's locals are torn down notes nothing.
    let _ = WATCHED.try_with(|watched| {
        if let Some((watched_ptr, _)) = watched.get() {
            if watched_ptr == ptr {
                watched.set(Some((ptr, fate)));
            }
        }
    });
}

#[inline]
fn witness_free(ptr: CUdeviceptr, result: &Result<(), HandleError>) {
    witness(
        ptr,
        if result.is_ok() {
            Fate::Freed
        } else {
            Fate::FreeFailed
        },
    );
}

/// A [`Deallocator`] that panicked, as the source of the [`HandleError::Deallocator`] its call
/// became: its panic message and what custody saw of the free (see [`Deallocator`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeallocatorPanic {
    /// `Some(true)`: one of the token's frees freed the memory before the panic;
    /// `Some(false)`: the memory was not freed (the token was dropped unfreed, or its free
    /// failed), it has leaked; `None`: the token was given up with
    /// [`OwnedAllocation::into_raw`] or passed out of sight, so whether the memory was freed
    /// cannot be known.
    pub freed: Option<bool>,
    /// The panic's message, when it was a string.
    pub message: Option<String>,
}

impl fmt::Display for DeallocatorPanic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self.freed {
            Some(true) => "the deallocator panicked after freeing the memory",
            Some(false) => "the deallocator panicked without freeing the memory",
            None => {
                "the deallocator panicked after taking the allocation out of custody's sight \
                 (into_raw, or passed on): whether it freed the memory cannot be known"
            }
        })?;
        if let Some(message) = &self.message {
            write!(f, ": {message}")?;
        }
        Ok(())
    }
}

impl std::error::Error for DeallocatorPanic {}

/// What a deallocator's failed call means for its memory (for the report of a drop).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Freed {
    Yes,
    No,
    Unknown,
}

impl Freed {
    /// The consequence a report of the failed call gives.
    pub(crate) fn consequence(self) -> Consequence {
        match self {
            Freed::Yes => Consequence::Released,
            Freed::No => Consequence::Leaked,
            Freed::Unknown => Consequence::Unknown,
        }
    }
}

/// Calls `deallocator` with the right to free `size` bytes at `ptr`, catching a panic, and tells
/// what became of the memory when the call failed: an error return means not freed unless the
/// token was seen freed; a panic becomes a [`DeallocatorPanic`] error saying what was seen.
pub(crate) fn call_deallocator(
    deallocator: &dyn Deallocator,
    ptr: CUdeviceptr,
    size: usize,
    stream: &StreamHandle,
) -> (Result<(), HandleError>, Freed) {
    let outer = WATCHED.with(|watched| watched.replace(Some((ptr, Fate::Unseen))));
    let allocation = OwnedAllocation::new(ptr, size);
    let outcome = catch_unwind(AssertUnwindSafe(|| {
        deallocator.deallocate(allocation, stream)
    }));
    let fate = WATCHED
        .with(|watched| watched.replace(outer))
        .map_or(Fate::Unseen, |(_, fate)| fate);
    match outcome {
        Ok(Ok(())) => (Ok(()), Freed::Yes),
        Ok(Err(error)) => {
            let freed = if fate == Fate::Freed {
                Freed::Yes
            } else {
                Freed::No
            };
            (Err(error), freed)
        }
        Err(payload) => {
            let message = payload
                .downcast_ref::<&str>()
                .map(|m| (*m).to_owned())
                .or_else(|| payload.downcast_ref::<String>().cloned());
            let (freed, known) = match fate {
                Fate::Freed => (Freed::Yes, Some(true)),
                Fate::Dropped | Fate::FreeFailed => (Freed::No, Some(false)),
                Fate::Unseen | Fate::GivenUp => (Freed::Unknown, None),
            };
            let panic = DeallocatorPanic {
                freed: known,
                message,
            };
            (Err(HandleError::deallocator(panic)), freed)
        }
    }
}
