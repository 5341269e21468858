//! [`DevicePtrHandle`]: an allocation (or an adopted or borrowed pointer) with its
//! [`DeallocationRecipe`] and a release rule fixed at creation, and the teardown that runs the
//! recipe (docs/decisions.md D1, D2, D3, D9).

use std::any::Any;
use std::fmt;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Mutex};

use cuda_sys::types::{c_void, CUdeviceptr, CUmemPoolPtrExportData, CUstream};
use cuda_sys::Driver;

use crate::context::ContextScope;
use crate::deferred::{self, Deferred};
use crate::event::{create_raw, destroy_raw, EVENT_DISABLE_TIMING};
use crate::pool::MemoryPoolHandle;
use crate::recipe::DeallocationRecipe;
use crate::report::{report, warn, CleanupError, CleanupWarning, CleanupWarningKind};
use crate::stream::StreamHandle;
use crate::sys::{check, current_context_raw, driver, error, set_current_raw};
use crate::HandleError;

/// Frees memory that custody adopted from elsewhere (a user's memory resource).
///
/// Called once, by whoever drops the last handle, with the recipe's context current (see
/// [`ContextScope`]) and the recipe's stream; on a thread chosen by the drop, which may be the
/// cleanup worker. It must not block on a lock that the dropping thread may hold.
pub trait Deallocator: Send + Sync {
    /// Frees `allocation` (its [`OwnedAllocation::size`] bytes at [`OwnedAllocation::ptr`]),
    /// ordered on `stream`. The deallocator now owns the allocation: it frees it (with one of
    /// [`OwnedAllocation`]'s frees, or by its own means), and dropping it unfreed leaks it.
    ///
    /// # Errors
    /// Whatever the deallocator reports (as [`HandleError::deallocator`]): returned by an
    /// explicit [`DevicePtrHandle::release`], reported through the cleanup-error hook on a drop.
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
/// when the last handle to memory it owns goes, and what [`DevicePtrHandle::adopt`] and
/// [`DevicePtrHandle::adopt_synchronous`] take into custody.
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
    /// as stream-ordered memory); the memory is then still allocated, and the token gone.
    ///
    /// Driver calls: `cuCtxGetCurrent`, `cuCtxSetCurrent` (if needed), `cuMemFreeAsync`.
    pub fn free_async(self, stream: &StreamHandle) -> Result<(), HandleError> {
        let ptr = self.ptr;
        crate::ops::on_stream(stream, "cuMemFreeAsync", |d, s| {
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
    /// Driver calls: `cuCtxGetCurrent`, `cuCtxSetCurrent` (if needed), `cuStreamSynchronize`,
    /// `cuMemFree_v2`.
    pub fn free_device_sync(self, stream: &StreamHandle) -> Result<(), HandleError> {
        let ptr = self.ptr;
        crate::ops::sync_then(stream, "cuMemFree_v2", |d| {
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
    /// Driver calls: `cuCtxGetCurrent`, `cuCtxSetCurrent` (if needed), `cuStreamSynchronize`,
    /// `cuMemFreeHost`.
    pub fn free_host_sync(self, stream: &StreamHandle) -> Result<(), HandleError> {
        let ptr = self.ptr;
        crate::ops::sync_then(stream, "cuMemFreeHost", |d| {
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

/// Which family a pointer belongs to, fixing how it is released.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ReleaseKind {
    /// `cuMemAllocFromPoolAsync`; freed with `cuMemFreeAsync` on the recipe stream; holds its
    /// pool.
    Pool,
    /// `cuMemAllocAsync` (the device's current pool, or a graph allocation under capture);
    /// freed with `cuMemFreeAsync`.
    Async,
    /// `cuMemAlloc`; freed with `cuMemFree` after the recipe stream's work (never blocking a
    /// drop: see [`DevicePtrHandle`]).
    Synchronous,
    /// `cuMemAllocHost` (pinned host memory); freed with `cuMemFreeHost`, like
    /// [`ReleaseKind::Synchronous`].
    PinnedHost,
    /// `cuMemAllocManaged`; freed with `cuMemFree`, like [`ReleaseKind::Synchronous`].
    Managed,
    /// `cuMemPoolImportPointer` (IPC import); freed with `cuMemFreeAsync`; holds its pool.
    IpcImport,
    /// Adopted with a [`Deallocator`], which frees it.
    Deallocator,
    /// Kept alive by an owner object, dropped with the last handle; nothing is freed.
    Owner,
    /// Not owned: nothing happens at release.
    NonOwning,
}

/// The pool an allocation came from. An owned pool is embedded (it must outlive the
/// allocation); a borrowed pool (a device's default or current pool) is kept as its raw value,
/// since a handle to it would keep nothing alive and would cost an atomic increment and
/// decrement per allocation on the hot path.
enum PoolRef {
    Owned(MemoryPoolHandle),
    Borrowed { raw: usize, device: Option<i32> },
}

impl PoolRef {
    #[inline]
    fn of(pool: &MemoryPoolHandle) -> PoolRef {
        if pool.is_owned() {
            PoolRef::Owned(pool.clone())
        } else {
            PoolRef::Borrowed {
                raw: pool.raw() as usize,
                device: pool.device(),
            }
        }
    }

    fn handle(&self) -> MemoryPoolHandle {
        match self {
            PoolRef::Owned(pool) => pool.clone(),
            PoolRef::Borrowed { raw, device } => {
                MemoryPoolHandle::borrowed_unchecked(*raw, *device)
            }
        }
    }
}

enum Release {
    Pool(PoolRef),
    Async,
    Synchronous,
    PinnedHost,
    Managed,
    IpcImport(PoolRef),
    Deallocator(Arc<dyn Deallocator>),
    Owner(#[allow(dead_code)] Box<dyn Any + Send + Sync>),
    NonOwning,
}

impl Release {
    fn kind(&self) -> ReleaseKind {
        match self {
            Release::Pool(_) => ReleaseKind::Pool,
            Release::Async => ReleaseKind::Async,
            Release::Synchronous => ReleaseKind::Synchronous,
            Release::PinnedHost => ReleaseKind::PinnedHost,
            Release::Managed => ReleaseKind::Managed,
            Release::IpcImport(_) => ReleaseKind::IpcImport,
            Release::Deallocator(_) => ReleaseKind::Deallocator,
            Release::Owner(_) => ReleaseKind::Owner,
            Release::NonOwning => ReleaseKind::NonOwning,
        }
    }
}

/// The synchronous frees that go through the cleanup worker (docs/decisions.md D9).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SyncKind {
    Device,
    Host,
}

impl SyncKind {
    fn operation(self) -> &'static str {
        match self {
            SyncKind::Device => "cuMemFree_v2",
            SyncKind::Host => "cuMemFreeHost",
        }
    }

    fn free(self, d: &Driver, ptr: u64) -> Result<(), HandleError> {
        match self {
            SyncKind::Device => {
                // SAFETY: the allocation is owned by the caller's released box and is freed
                // once; the recipe's context is current.
                let status = unsafe { (d.cuMemFree_v2)(ptr) };
                check("cuMemFree_v2", status)
            }
            SyncKind::Host => {
                // SAFETY: as above, for a `cuMemAllocHost` allocation.
                let status = unsafe { (d.cuMemFreeHost)(ptr as *mut c_void) };
                check("cuMemFreeHost", status)
            }
        }
    }
}

/// A synchronous free waiting for its event on the cleanup worker.
pub(crate) struct SyncFree {
    ptr: u64,
    kind: SyncKind,
    recipe: DeallocationRecipe,
    /// The event recorded on the recipe stream at drop time; 0 when recording failed, in which
    /// case the worker synchronises the whole context instead.
    event: usize,
}

/// Serialises IPC imports with the frees of imported pointers, so that a concurrent import
/// cannot re-import a mapping that a pending free is about to unmap. A leaf lock: nothing else
/// is taken, and nothing is reported, while it is held.
static IPC_LOCK: Mutex<()> = Mutex::new(());

struct PtrBox {
    ptr: u64,
    size: usize,
    /// The device the memory lives on when known; recipes must be in a context of it.
    device: Option<i32>,
    /// The only mutable field: replaced wholesale, read once at teardown. `None` for the rules
    /// that free nothing, and after release.
    recipe: Mutex<Option<DeallocationRecipe>>,
    release: Release,
    released: bool,
}

/// A device (or pinned host) pointer with its deallocation recipe and release rule.
///
/// Cloning is one atomic increment and every clone shares the recipe: a
/// [`DevicePtrHandle::set_deallocation_stream`] on one is seen by all (a graph attachment
/// included). The last clone to go frees the memory with the recipe current at that moment:
///
/// - stream-ordered families (pool, async, IPC import): `cuMemFreeAsync` on the recipe stream,
///   in the recipe context (see [`ContextScope`]);
/// - synchronous families (`cuMemAlloc`, pinned host, managed): a drop records an event on the
///   recipe stream and hands (event, pointer, recipe) to the cleanup worker, which waits for
///   the event and frees; it never blocks the dropping thread (docs/decisions.md D9). An explicit
///   [`DevicePtrHandle::release`] synchronises the recipe stream and frees before returning;
/// - adopted pointers: the [`Deallocator`], in the recipe context;
/// - owner-kept and borrowed pointers: nothing is freed.
///
/// A drop whose free fails reports through the cleanup-error hook; an explicit release returns
/// the error.
#[derive(Clone)]
pub struct DevicePtrHandle(Arc<PtrBox>);

/// What an operation run in a recipe's context came to.
struct Outcome {
    op: Result<(), HandleError>,
    restore: Result<(), HandleError>,
    warning: Option<CleanupWarning>,
}

impl Outcome {
    /// Reports everything (drop paths). Call after the context was restored, holding no lock.
    fn report(self, operation: &'static str, ptr: u64, recipe: &DeallocationRecipe) {
        if let Some(warning) = self.warning {
            warn(warning);
        }
        for error in [self.op.err(), self.restore.err()].into_iter().flatten() {
            report(attribute(operation, ptr, recipe, error));
        }
    }

    /// Returns the operation's error, or else the restore's (explicit paths); a restore error
    /// that cannot be returned alongside an operation error is reported.
    fn into_result(
        self,
        operation: &'static str,
        ptr: u64,
        recipe: &DeallocationRecipe,
    ) -> Result<(), HandleError> {
        if let Some(warning) = self.warning {
            warn(warning);
        }
        match (self.op, self.restore) {
            (Err(op), Err(restore)) => {
                report(attribute(operation, ptr, recipe, restore));
                Err(op)
            }
            (Err(error), Ok(())) | (Ok(()), Err(error)) => Err(error),
            (Ok(()), Ok(())) => Ok(()),
        }
    }
}

fn attribute(
    operation: &'static str,
    ptr: u64,
    recipe: &DeallocationRecipe,
    error: HandleError,
) -> CleanupError {
    CleanupError {
        operation,
        ptr,
        stream: recipe.stream().raw_usize() as u64,
        context: recipe.context().raw_usize() as u64,
        error,
    }
}

#[cold]
fn report_restore_failure(
    operation: &'static str,
    ptr: u64,
    recipe: &DeallocationRecipe,
    status: u32,
) {
    report(attribute(
        operation,
        ptr,
        recipe,
        error("cuCtxSetCurrent", status),
    ));
}

/// Runs `op` with the recipe's context current and restores the caller's binding (D2). The
/// per-thread-default-stream warning, if owed, is returned for emission after the restore.
#[inline]
fn run_in_recipe(
    recipe: &DeallocationRecipe,
    operation: &'static str,
    ptr: u64,
    check_thread: bool,
    op: impl FnOnce(&'static Driver) -> Result<(), HandleError>,
) -> Outcome {
    let warning = if check_thread {
        recipe.cross_thread_warning(operation, ptr)
    } else {
        None
    };
    let d = match driver() {
        Ok(d) => d,
        Err(error) => {
            return Outcome {
                op: Err(error),
                restore: Ok(()),
                warning,
            }
        }
    };
    let scope = match ContextScope::enter(recipe.context()) {
        Ok(scope) => scope,
        Err(error) => {
            // Activation failed: the operation is skipped and the resource leaked (reported).
            return Outcome {
                op: Err(error),
                restore: Ok(()),
                warning,
            };
        }
    };
    let op = op(d);
    let restore = scope.exit();
    Outcome {
        op,
        restore,
        warning,
    }
}

/// Raw statuses of an operation run in a recipe's context: which call failed first (the
/// operation is skipped when activation failed) and the restore's status.
struct RawOutcome {
    /// `cuCtxGetCurrent` or `cuCtxSetCurrent` when activation failed, else `None`.
    activation_call: Option<&'static str>,
    /// The activation's or the operation's status.
    status: u32,
    /// The restore's status (0 when no restore was needed).
    restore: u32,
    /// The driver could not be loaded (never after a handle exists, kept for completeness).
    load: Option<HandleError>,
}

impl RawOutcome {
    #[inline]
    fn is_clean(&self) -> bool {
        self.status == 0 && self.restore == 0 && self.load.is_none()
    }

    /// The structured outcome, with the per-thread-stream warning if one is owed (D6).
    #[cold]
    fn into_outcome(self, recipe: &DeallocationRecipe, ptr: u64) -> Outcome {
        let warning = recipe.cross_thread_warning("cuMemFreeAsync", ptr);
        let op = if let Some(error) = self.load {
            Err(error)
        } else if self.status != 0 {
            Err(error(
                self.activation_call.unwrap_or("cuMemFreeAsync"),
                self.status,
            ))
        } else {
            Ok(())
        };
        let restore = if self.restore != 0 {
            Err(error("cuCtxSetCurrent", self.restore))
        } else {
            Ok(())
        };
        Outcome {
            op,
            restore,
            warning,
        }
    }
}

/// [`run_in_recipe`] for the stream-ordered frees, with raw statuses: the drop of a pool
/// allocation makes exactly `cuCtxGetCurrent` and the free when its context is current.
#[inline]
fn run_in_recipe_raw(
    recipe: &DeallocationRecipe,
    op: impl FnOnce(&'static Driver) -> u32,
) -> RawOutcome {
    let mut outcome = RawOutcome {
        activation_call: None,
        status: 0,
        restore: 0,
        load: None,
    };
    let d = match driver() {
        Ok(d) => d,
        Err(error) => {
            outcome.load = Some(error);
            return outcome;
        }
    };
    let previous = match current_context_raw(d) {
        Ok(previous) => previous,
        Err(status) => {
            outcome.activation_call = Some("cuCtxGetCurrent");
            outcome.status = status;
            return outcome;
        }
    };
    let target = recipe.context_raw();
    let switched = previous != target;
    if switched {
        let status = set_current_raw(d, target);
        if status != 0 {
            // Activation failed: the operation is skipped and the resource leaked (reported).
            outcome.activation_call = Some("cuCtxSetCurrent");
            outcome.status = status;
            return outcome;
        }
    }
    outcome.status = op(d);
    if switched {
        outcome.restore = set_current_raw(d, previous);
        if outcome.restore != 0 {
            deferred::note_restore_failed();
        }
    }
    outcome
}

fn free_async(d: &Driver, ptr: u64, stream: CUstream) -> Result<(), HandleError> {
    // SAFETY: the pointer is owned by the box being released and freed once; the recipe keeps
    // `stream` alive and its context is current.
    let status = unsafe { (d.cuMemFreeAsync)(ptr, stream) };
    check("cuMemFreeAsync", status)
}

/// Where an allocation lives, which decides the device its recipes must be on.
#[derive(Clone, Copy)]
enum Placement {
    /// On the pool's device (`None`: a host pool, any device's context will do).
    Pool(Option<i32>),
    /// On the device of the recipe's context.
    Context,
    /// Host memory, usable from any device's context.
    Host,
}

/// `cuMemAlloc` and `cuMemAllocManaged` reject zero bytes (`CUDA_ERROR_INVALID_VALUE`);
/// the stream-ordered and pinned-host allocators accept them (docs/driver-probe).
fn reject_zero(size: usize) -> Result<(), HandleError> {
    if size == 0 {
        return Err(HandleError::invalid(
            "size",
            "a zero-byte allocation is rejected by the driver",
        ));
    }
    Ok(())
}

fn check_device(device: Option<i32>, recipe: &DeallocationRecipe) -> Result<(), HandleError> {
    match device {
        Some(expected) if recipe.context().device() != expected => Err(HandleError::WrongDevice {
            expected,
            found: recipe.context().device(),
        }),
        _ => Ok(()),
    }
}

impl DevicePtrHandle {
    /// Allocates `size` bytes from `pool`, ordered on `stream`, which also becomes the recipe.
    ///
    /// The allocation runs in the recipe's context (made current only if it is not), and the
    /// caller's binding is restored. The handle holds `pool`, so an owned pool outlives it.
    ///
    /// # Errors
    /// [`HandleError::InvalidArgument`] for a stream whose context is on another device than
    /// the pool; [`HandleError::NoCurrentContext`] for an unbound token on a thread
    /// with no context; [`HandleError::Driver`] when the allocation fails. Nothing is allocated
    /// or leaked on error.
    ///
    /// Driver calls: `cuCtxGetCurrent`, `cuCtxSetCurrent` (only when the recipe's context is
    /// not current), `cuMemAllocFromPoolAsync`; `cuMemFreeAsync` at release.
    pub fn alloc_from_pool(
        size: usize,
        pool: &MemoryPoolHandle,
        stream: &StreamHandle,
    ) -> Result<DevicePtrHandle, HandleError> {
        let pool_raw = pool.raw();
        Self::allocate(
            size,
            stream,
            Placement::Pool(pool.device()),
            Release::Pool(PoolRef::of(pool)),
            "cuMemAllocFromPoolAsync",
            |d, stream, ptr| {
                // SAFETY: `ptr` is a valid out-pointer; the pool and stream handles are alive and
                // the recipe's context is current.
                unsafe { (d.cuMemAllocFromPoolAsync)(ptr, size, pool_raw, stream) }
            },
            |d, ptr, stream| {
                let _ = free_async(d, ptr, stream);
            },
        )
    }

    /// Allocates `size` bytes from the current pool of the recipe context's device (or, while
    /// `stream` is capturing, as a graph allocation), ordered on `stream`.
    ///
    /// # Errors
    /// As [`DevicePtrHandle::alloc_from_pool`].
    ///
    /// Driver calls: `cuCtxGetCurrent`, `cuCtxSetCurrent` (if needed), `cuMemAllocAsync`;
    /// `cuMemFreeAsync` at release.
    pub fn alloc_async(size: usize, stream: &StreamHandle) -> Result<DevicePtrHandle, HandleError> {
        Self::allocate(
            size,
            stream,
            Placement::Context,
            Release::Async,
            "cuMemAllocAsync",
            |d, stream, ptr| {
                // SAFETY: `ptr` is a valid out-pointer; the stream is alive; context current.
                unsafe { (d.cuMemAllocAsync)(ptr, size, stream) }
            },
            |d, ptr, stream| {
                let _ = free_async(d, ptr, stream);
            },
        )
    }

    /// Allocates `size` bytes with the synchronous `cuMemAlloc` in the recipe's context;
    /// `stream` orders the eventual free. See [`DevicePtrHandle`] for how the free avoids
    /// blocking a drop.
    ///
    /// # Errors
    /// As [`DevicePtrHandle::alloc_from_pool`], and [`HandleError::InvalidArgument`] for
    /// `size == 0`, which the driver rejects.
    ///
    /// Driver calls: `cuCtxGetCurrent`, `cuCtxSetCurrent` (if needed), `cuMemAlloc_v2`; at
    /// release `cuEventCreate`, `cuEventRecord`, then on the cleanup worker
    /// `cuEventSynchronize`, `cuMemFree_v2`, `cuEventDestroy_v2`.
    pub fn alloc(size: usize, stream: &StreamHandle) -> Result<DevicePtrHandle, HandleError> {
        reject_zero(size)?;
        Self::allocate(
            size,
            stream,
            Placement::Context,
            Release::Synchronous,
            "cuMemAlloc_v2",
            |d, _, ptr| {
                // SAFETY: `ptr` is a valid out-pointer; the recipe's context is current.
                unsafe { (d.cuMemAlloc_v2)(ptr, size) }
            },
            |d, ptr, _| {
                let _ = SyncKind::Device.free(d, ptr);
            },
        )
    }

    /// Allocates `size` bytes of pinned host memory (`cuMemAllocHost`) in the recipe's
    /// context; the pointer is the host address. Released like [`DevicePtrHandle::alloc`].
    ///
    /// # Errors
    /// As [`DevicePtrHandle::alloc_from_pool`].
    ///
    /// Driver calls: `cuCtxGetCurrent`, `cuCtxSetCurrent` (if needed), `cuMemAllocHost_v2`; at
    /// release as [`DevicePtrHandle::alloc`] with `cuMemFreeHost`.
    pub fn alloc_host(size: usize, stream: &StreamHandle) -> Result<DevicePtrHandle, HandleError> {
        Self::allocate(
            size,
            stream,
            Placement::Host,
            Release::PinnedHost,
            "cuMemAllocHost_v2",
            |d, _, ptr| {
                let mut host: *mut c_void = std::ptr::null_mut();
                // SAFETY: `host` is a valid out-pointer; the recipe's context is current.
                let status = unsafe { (d.cuMemAllocHost_v2)(&mut host, size) };
                *ptr = host as u64;
                status
            },
            |d, ptr, _| {
                let _ = SyncKind::Host.free(d, ptr);
            },
        )
    }

    /// Allocates `size` bytes of managed memory (`cuMemAllocManaged` with `flags`,
    /// `CU_MEM_ATTACH_*`) in the recipe's context. Released like [`DevicePtrHandle::alloc`].
    ///
    /// # Errors
    /// As [`DevicePtrHandle::alloc`].
    ///
    /// Driver calls: `cuCtxGetCurrent`, `cuCtxSetCurrent` (if needed), `cuMemAllocManaged`; at
    /// release as [`DevicePtrHandle::alloc`].
    pub fn alloc_managed(
        size: usize,
        flags: u32,
        stream: &StreamHandle,
    ) -> Result<DevicePtrHandle, HandleError> {
        reject_zero(size)?;
        Self::allocate(
            size,
            stream,
            Placement::Context,
            Release::Managed,
            "cuMemAllocManaged",
            |d, _, ptr| {
                // SAFETY: `ptr` is a valid out-pointer; the recipe's context is current.
                unsafe { (d.cuMemAllocManaged)(ptr, size, flags) }
            },
            |d, ptr, _| {
                let _ = SyncKind::Device.free(d, ptr);
            },
        )
    }

    /// Imports a pointer another process exported from an IPC-shared pool that this process
    /// imported as `pool`; `size` is the exported allocation's size in bytes and `stream`
    /// orders the eventual free.
    ///
    /// Imports and the frees of imported pointers are serialised process-wide. `size` is
    /// checked against the size of the allocation the driver mapped, since every range of the
    /// handle relies on it.
    ///
    /// # Errors
    /// As [`DevicePtrHandle::alloc_from_pool`], with the import's driver error;
    /// [`HandleError::InvalidArgument`] when the mapped allocation is smaller than `size` (the
    /// mapping is freed again on `stream`).
    ///
    /// Driver calls: `cuCtxGetCurrent`, `cuCtxSetCurrent` (if needed),
    /// `cuMemPoolImportPointer`, `cuPointerGetAttribute`; `cuMemFreeAsync` at release.
    pub fn import_from_pool(
        pool: &MemoryPoolHandle,
        export_data: &CUmemPoolPtrExportData,
        size: usize,
        stream: &StreamHandle,
    ) -> Result<DevicePtrHandle, HandleError> {
        let pool_raw = pool.raw();
        let mut data = *export_data;
        let handle = Self::allocate(
            size,
            stream,
            Placement::Pool(pool.device()),
            Release::IpcImport(PoolRef::of(pool)),
            "cuMemPoolImportPointer",
            |d, _, ptr| {
                let _guard = IPC_LOCK.lock().unwrap_or_else(|e| e.into_inner());
                // SAFETY: `ptr` is a valid out-pointer; `data` is a copy the driver may read;
                // the pool handle is alive and the recipe's context is current.
                unsafe { (d.cuMemPoolImportPointer)(ptr, pool_raw, &mut data) }
            },
            |d, ptr, stream| {
                let _guard = IPC_LOCK.lock().unwrap_or_else(|e| e.into_inner());
                let _ = free_async(d, ptr, stream);
            },
        )?;
        // `size` is the exporter's claim; every range of the handle trusts it, so it is checked
        // against what the driver mapped. A short mapping is freed again (on `stream`) by the
        // drop.
        let extent = crate::ops::pointer_attributes(handle.ptr())?.map_or(0, |a| a.range_size);
        if extent < size {
            return Err(HandleError::invalid(
                "size",
                format!(
                    "the import claims {size} bytes but the imported allocation holds {extent}"
                ),
            ));
        }
        Ok(handle)
    }

    /// Takes `allocation` into custody, to be freed by `deallocator` with the recipe recorded
    /// now for `stream` (docs/decisions.md D5).
    ///
    /// The recipe is recorded and validated before ownership is taken: on error the allocation
    /// is given back in the [`AdoptError`] and `deallocator` is not called.
    ///
    /// # Errors
    /// [`HandleError::InvalidArgument`] for a null address; [`HandleError::NoCurrentContext`]
    /// for an unbound token on a thread with no context.
    ///
    /// Driver calls: `cuCtxGetCurrent` (unbound tokens only); at release `cuCtxGetCurrent`,
    /// `cuCtxSetCurrent` (if needed) around `deallocator`.
    pub fn adopt(
        allocation: OwnedAllocation,
        stream: &StreamHandle,
        deallocator: Arc<dyn Deallocator>,
    ) -> Result<DevicePtrHandle, AdoptError> {
        if allocation.ptr == 0 {
            return Err(AdoptError {
                error: HandleError::invalid(
                    "ptr",
                    "a null pointer cannot be owned by a deallocator",
                ),
                allocation,
            });
        }
        let recipe = match DeallocationRecipe::record(stream) {
            Ok(recipe) => recipe,
            Err(error) => return Err(AdoptError { error, allocation }),
        };
        let (ptr, size) = allocation.into_raw();
        Ok(Self::from_parts(
            ptr,
            size,
            None,
            Some(recipe),
            Release::Deallocator(deallocator),
        ))
    }

    /// Wraps `size` bytes at `ptr` that `owner` keeps alive: the owner is dropped with the last
    /// handle and nothing is freed. No driver call. For [`crate::raw::with_owner`].
    ///
    /// # Errors
    /// [`HandleError::InvalidArgument`] for a null `ptr`.
    pub(crate) fn with_owner(
        ptr: CUdeviceptr,
        size: usize,
        owner: Box<dyn Any + Send + Sync>,
    ) -> Result<DevicePtrHandle, HandleError> {
        if ptr == 0 {
            return Err(HandleError::invalid(
                "ptr",
                "a null pointer cannot be kept alive by an owner",
            ));
        }
        Ok(Self::from_parts(
            ptr,
            size,
            None,
            None,
            Release::Owner(owner),
        ))
    }

    /// Wraps `size` bytes at `ptr` without owning them: nothing happens at release. No driver
    /// call. For [`crate::raw::borrowed`].
    pub(crate) fn borrowed(ptr: CUdeviceptr, size: usize) -> DevicePtrHandle {
        Self::from_parts(ptr, size, None, None, Release::NonOwning)
    }

    fn from_parts(
        ptr: u64,
        size: usize,
        device: Option<i32>,
        recipe: Option<DeallocationRecipe>,
        release: Release,
    ) -> DevicePtrHandle {
        DevicePtrHandle(Arc::new(PtrBox {
            ptr,
            size,
            device,
            recipe: Mutex::new(recipe),
            release,
            released: false,
        }))
    }

    /// The allocation protocol shared by every allocating family: read the current context
    /// once, bind the recipe, validate, allocate in the recipe context, restore; undo (still in
    /// the context) if the restore fails. Hot path: raw statuses, errors built off the path.
    #[inline]
    #[allow(clippy::too_many_arguments)]
    fn allocate(
        size: usize,
        stream: &StreamHandle,
        placement: Placement,
        release: Release,
        alloc_call: &'static str,
        alloc: impl FnOnce(&'static Driver, CUstream, &mut u64) -> u32,
        undo: impl FnOnce(&'static Driver, u64, CUstream),
    ) -> Result<DevicePtrHandle, HandleError> {
        let d = driver()?;
        let current = current_context_raw(d).map_err(|s| error("cuCtxGetCurrent", s))?;
        let recipe = DeallocationRecipe::bind_with_current(stream, current)?;
        let device = match placement {
            Placement::Pool(device) => device,
            Placement::Context => Some(recipe.context().device()),
            Placement::Host => None,
        };
        check_device(device, &recipe)?;
        let target = recipe.context().raw_usize();
        let switched = current != target;
        if switched {
            let status = set_current_raw(d, target);
            if status != 0 {
                return Err(error("cuCtxSetCurrent", status));
            }
        }
        let raw_stream = stream.raw();
        let mut ptr = 0u64;
        let status = alloc(d, raw_stream, &mut ptr);
        let restored = if switched {
            set_current_raw(d, current)
        } else {
            0
        };
        if status != 0 {
            if restored != 0 {
                report_restore_failure(alloc_call, 0, &recipe, restored);
            }
            return Err(error(alloc_call, status));
        }
        if restored != 0 {
            // The recipe's context is still current: give the memory back before failing.
            undo(d, ptr, raw_stream);
            return Err(error("cuCtxSetCurrent", restored));
        }
        Ok(Self::from_parts(ptr, size, device, Some(recipe), release))
    }

    /// The address (device pointer, or host address for pinned host memory).
    #[inline]
    pub fn ptr(&self) -> CUdeviceptr {
        self.0.ptr
    }

    /// The size in bytes, as allocated or adopted.
    #[inline]
    pub fn size(&self) -> usize {
        self.0.size
    }

    /// The release family, fixed at creation.
    pub fn kind(&self) -> ReleaseKind {
        self.0.release.kind()
    }

    /// The device the memory lives on, when known (`None` for pinned host memory and adopted
    /// or borrowed pointers).
    pub fn device(&self) -> Option<i32> {
        self.0.device
    }

    /// The pool the memory came from (pool allocations and IPC imports). An owned pool comes
    /// back as the handle the allocation holds; a borrowed pool as a new borrowed handle.
    pub fn pool(&self) -> Option<MemoryPoolHandle> {
        match &self.0.release {
            Release::Pool(pool) | Release::IpcImport(pool) => Some(pool.handle()),
            _ => None,
        }
    }

    /// A copy of the current recipe (two atomic increments); `None` for owner-kept and
    /// borrowed pointers, which free nothing.
    pub fn recipe(&self) -> Option<DeallocationRecipe> {
        self.0
            .recipe
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// The stream the free is currently recorded on.
    pub fn deallocation_stream(&self) -> Option<StreamHandle> {
        self.recipe().map(|recipe| recipe.stream().clone())
    }

    /// How many handles share this allocation.
    pub fn handle_count(&self) -> usize {
        Arc::strong_count(&self.0)
    }

    /// Whether both handles share one box.
    pub fn ptr_eq(&self, other: &DevicePtrHandle) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }

    /// Replaces the recipe with one recorded now for `stream` (docs/decisions.md D4), as one atomic
    /// swap seen by every clone. Nothing is freed or synchronised: work already queued on the
    /// old stream must be ordered before the new one by the caller. On error the old recipe
    /// stays. For owner-kept and borrowed pointers, which free nothing, this does nothing.
    ///
    /// # Errors
    /// [`HandleError::NoCurrentContext`] for an unbound token on a thread with no context;
    /// [`HandleError::InvalidArgument`] for a stream whose context is on another device than
    /// the memory.
    ///
    /// Driver calls: `cuCtxGetCurrent` (unbound tokens only).
    pub fn set_deallocation_stream(&self, stream: &StreamHandle) -> Result<(), HandleError> {
        // The old recipe may hold the last handle of a stream: released outside the lock.
        drop(self.replace_deallocation_stream(stream)?);
        Ok(())
    }

    /// [`set_deallocation_stream`](Self::set_deallocation_stream), returning the replaced
    /// recipe instead of dropping it (`None` when the memory has no recipe: adopted with an
    /// owner, or not owned), so that the caller decides where its last references to a stream
    /// or context are dropped ([`DeallocationRecipe::into_last_references`]).
    ///
    /// # Errors
    /// As [`set_deallocation_stream`](Self::set_deallocation_stream).
    ///
    /// Driver calls: `cuCtxGetCurrent` (unbound tokens only).
    pub fn replace_deallocation_stream(
        &self,
        stream: &StreamHandle,
    ) -> Result<Option<DeallocationRecipe>, HandleError> {
        if matches!(self.0.release, Release::Owner(_) | Release::NonOwning) {
            return Ok(None);
        }
        let recipe = DeallocationRecipe::record(stream)?;
        check_device(self.0.device, &recipe)?;
        Ok(self
            .0
            .recipe
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .replace(recipe))
    }

    /// Releases this handle now. When it is the last one, frees the memory as its rule says
    /// and returns the outcome instead of reporting it; the handle is gone either way. When
    /// other clones remain, nothing is freed and `Ok(())` is returned.
    ///
    /// Unlike a drop, this may block: a synchronous family waits for the recipe stream and
    /// frees before returning.
    ///
    /// # Errors
    /// The free's error ([`HandleError::Driver`], or the [`Deallocator`]'s); a failure to
    /// activate or restore the context ([`HandleError::Driver`] naming `cuCtxSetCurrent`).
    ///
    /// Driver calls: those of the rule (see [`ReleaseKind`]) inside the recipe's context; for
    /// the synchronous families `cuStreamSynchronize` first.
    pub fn release(self) -> Result<(), HandleError> {
        match Arc::try_unwrap(self.0) {
            Ok(mut inner) => inner.release_now(true),
            Err(_) => Ok(()),
        }
    }

    /// `set_deallocation_stream(stream)` then `release()` (docs/decisions.md D4). When recording
    /// the new recipe fails, the handle is returned unchanged with the error.
    ///
    /// # Errors
    /// As [`DevicePtrHandle::set_deallocation_stream`] (with the handle given back) and
    /// [`DevicePtrHandle::release`].
    pub fn release_on(
        self,
        stream: &StreamHandle,
    ) -> Result<(), (HandleError, Option<DevicePtrHandle>)> {
        if let Err(error) = self.set_deallocation_stream(stream) {
            return Err((error, Some(self)));
        }
        self.release().map_err(|error| (error, None))
    }

    /// Emits the graph-attach warning when this pointer's free is recorded on the per-thread
    /// default stream (docs/decisions.md D6); for the graph layer, when it retains the pointer.
    pub fn warn_if_per_thread_stream(&self, operation: &'static str) {
        let Some(recipe) = self.recipe() else { return };
        if let Some(thread) = recipe.ptds_thread() {
            warn(CleanupWarning {
                operation,
                ptr: self.0.ptr,
                stream: recipe.stream().raw_usize() as u64,
                context: recipe.context().raw_usize() as u64,
                kind: CleanupWarningKind::PerThreadStreamRetainedByGraph {
                    recorded_thread: thread.value(),
                },
            });
        }
    }
}

impl PtrBox {
    /// Frees per the release rule. `explicit`: return errors (and block for synchronous
    /// families); otherwise report them and never block.
    fn release_now(&mut self, explicit: bool) -> Result<(), HandleError> {
        self.released = true;
        let ptr = self.ptr;
        let recipe = self
            .recipe
            .get_mut()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        let Some(recipe) = recipe else {
            return Ok(()); // owner-kept or borrowed: the owner drops with the box
        };
        let (operation, outcome) = match &self.release {
            Release::Pool(_) | Release::Async => {
                // The hot path: raw statuses, nothing built unless something went wrong.
                let stream = recipe.stream().raw();
                let raw = run_in_recipe_raw(&recipe, |d| {
                    // SAFETY: the pointer is owned by the box being released and freed once;
                    // the recipe keeps `stream` alive and its context is current.
                    unsafe { (d.cuMemFreeAsync)(ptr, stream) }
                });
                if raw.is_clean() && recipe.ptds_thread().is_none() {
                    return Ok(());
                }
                ("cuMemFreeAsync", raw.into_outcome(&recipe, ptr))
            }
            Release::IpcImport(_) => {
                let stream = recipe.stream().raw();
                let raw = run_in_recipe_raw(&recipe, |d| {
                    let _guard = IPC_LOCK.lock().unwrap_or_else(|e| e.into_inner());
                    // SAFETY: as above; imports and their frees are serialised by the lock.
                    unsafe { (d.cuMemFreeAsync)(ptr, stream) }
                });
                ("cuMemFreeAsync", raw.into_outcome(&recipe, ptr))
            }
            Release::Synchronous | Release::Managed => {
                return self.release_sync(SyncKind::Device, recipe, explicit);
            }
            Release::PinnedHost => return self.release_sync(SyncKind::Host, recipe, explicit),
            Release::Deallocator(deallocator) => {
                let size = self.size;
                let operation = "Deallocator::deallocate";
                let outcome = run_in_recipe(&recipe, operation, ptr, true, |_| {
                    let allocation = OwnedAllocation::new(ptr, size);
                    catch_unwind(AssertUnwindSafe(|| {
                        deallocator.deallocate(allocation, recipe.stream())
                    }))
                    .unwrap_or_else(|_| Err(HandleError::deallocator("the deallocator panicked")))
                });
                (operation, outcome)
            }
            Release::Owner(_) | Release::NonOwning => return Ok(()),
        };
        if explicit {
            outcome.into_result(operation, ptr, &recipe)
        } else {
            outcome.report(operation, ptr, &recipe);
            Ok(())
        }
    }

    fn release_sync(
        &mut self,
        kind: SyncKind,
        recipe: DeallocationRecipe,
        explicit: bool,
    ) -> Result<(), HandleError> {
        let ptr = self.ptr;
        let operation = kind.operation();
        let stream = recipe.stream().raw();
        if explicit {
            let outcome = run_in_recipe(&recipe, operation, ptr, true, |d| {
                // SAFETY: the recipe keeps the stream alive and its context is current.
                let status = unsafe { (d.cuStreamSynchronize)(stream) };
                check("cuStreamSynchronize", status)?;
                kind.free(d, ptr)
            });
            return outcome.into_result(operation, ptr, &recipe);
        }
        if deferred::exiting() {
            return Ok(()); // at exit: leaked, never freed unsafely
        }
        // D9: order with an event on the caller, free on the cleanup worker.
        let mut event = 0usize;
        let outcome = run_in_recipe(&recipe, "cuEventRecord", ptr, true, |d| {
            let raw = create_raw(EVENT_DISABLE_TIMING)?;
            // SAFETY: the event was just created in the current (recipe) context; the recipe
            // keeps the stream alive.
            let status = unsafe { (d.cuEventRecord)(raw as cuda_sys::types::CUevent, stream) };
            if let Err(error) = check("cuEventRecord", status) {
                destroy_raw(raw);
                return Err(error);
            }
            event = raw;
            Ok(())
        });
        let report_recipe = recipe.clone();
        deferred::push(Deferred::SyncFree(SyncFree {
            ptr,
            kind,
            recipe,
            event,
        }));
        // Reported after the push: an event failure only means the worker synchronises the
        // whole context instead, but no driver error is treated as success (D3).
        outcome.report("cuEventRecord", ptr, &report_recipe);
        Ok(())
    }
}

/// Runs a deferred synchronous free on the cleanup worker (or a draining thread): wait for the
/// event (or, without one, the whole context), free, destroy the event; report failures.
pub(crate) fn run_sync_free(job: SyncFree) {
    let SyncFree {
        ptr,
        kind,
        recipe,
        event,
    } = job;
    let operation = kind.operation();
    let mut destroyed = Ok(());
    let outcome = run_in_recipe(&recipe, operation, ptr, false, |d| {
        let waited = if event != 0 {
            // SAFETY: the event was created and recorded at drop time and is owned by this job.
            let status = unsafe { (d.cuEventSynchronize)(event as cuda_sys::types::CUevent) };
            let waited = check("cuEventSynchronize", status);
            // The event is this job's own: its destruction failing leaks it, which is
            // reported below, after the restore, like the free's own failure (D3).
            destroyed = check("cuEventDestroy_v2", destroy_raw(event));
            waited
        } else {
            // SAFETY: no arguments; the recipe's context is current.
            let status = unsafe { (d.cuCtxSynchronize)() };
            check("cuCtxSynchronize", status)
        };
        // A failed wait means the free cannot be proven ordered: leak rather than free early.
        waited?;
        kind.free(d, ptr)
    });
    outcome.report(operation, ptr, &recipe);
    if let Err(error) = destroyed {
        // Attributed to the pointer whose free the event ordered (the event is internal).
        report(attribute("cuEventDestroy_v2", ptr, &recipe, error));
    }
}

impl Drop for PtrBox {
    fn drop(&mut self) {
        if self.released || deferred::exiting() {
            return;
        }
        let _ = self.release_now(false);
    }
}

impl fmt::Debug for DevicePtrHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "DevicePtrHandle(0x{:x}, {} bytes, {:?}",
            self.0.ptr,
            self.0.size,
            self.0.release.kind()
        )?;
        if let Some(recipe) = self.recipe() {
            write!(f, ", {recipe:?}")?;
        }
        f.write_str(")")
    }
}

// Adoption with a built-in synchronous release rule, so that memory a synchronous memory
// resource hands to `Buffer::from_handle` is released like memory it allocated, never blocking a
// drop (docs/decisions.md D5, D9).
impl DevicePtrHandle {
    /// Takes `allocation`, made with `cuMemAlloc` ([`ReleaseKind::Synchronous`]),
    /// `cuMemAllocHost` ([`ReleaseKind::PinnedHost`]) or `cuMemAllocManaged`
    /// ([`ReleaseKind::Managed`]), into custody, to be released by that rule with the recipe
    /// recorded now for `stream`: a drop records an event and frees on the cleanup worker, an
    /// explicit [`DevicePtrHandle::release`] synchronises and frees. `device` is the device the
    /// memory lives on, if known; recipes are then checked against it.
    ///
    /// The recipe is recorded and validated before ownership is taken: on error the allocation
    /// is given back in the [`AdoptError`].
    ///
    /// # Errors
    /// [`HandleError::InvalidArgument`] for a null address or another `kind`;
    /// [`HandleError::WrongDevice`] for a stream whose context is on another device than
    /// `device`; [`HandleError::NoCurrentContext`] for an unbound token on a thread with no
    /// context.
    ///
    /// Driver calls: `cuCtxGetCurrent` (unbound tokens only); at release as
    /// [`DevicePtrHandle::alloc`].
    pub fn adopt_synchronous(
        allocation: OwnedAllocation,
        kind: ReleaseKind,
        device: Option<i32>,
        stream: &StreamHandle,
    ) -> Result<DevicePtrHandle, AdoptError> {
        let refuse = |error, allocation| Err(AdoptError { error, allocation });
        if allocation.ptr == 0 {
            return refuse(
                HandleError::invalid("ptr", "a null pointer cannot be adopted"),
                allocation,
            );
        }
        let release = match kind {
            ReleaseKind::Synchronous => Release::Synchronous,
            ReleaseKind::PinnedHost => Release::PinnedHost,
            ReleaseKind::Managed => Release::Managed,
            other => {
                return refuse(
                    HandleError::invalid(
                        "kind",
                        format!("{other:?} is not a synchronous release rule"),
                    ),
                    allocation,
                )
            }
        };
        let recipe = match DeallocationRecipe::record(stream)
            .and_then(|recipe| check_device(device, &recipe).map(|()| recipe))
        {
            Ok(recipe) => recipe,
            Err(error) => return refuse(error, allocation),
        };
        let (ptr, size) = allocation.into_raw();
        Ok(Self::from_parts(ptr, size, device, Some(recipe), release))
    }
}
