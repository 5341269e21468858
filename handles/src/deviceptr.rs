//! [`DevicePtrHandle`]: an allocation (or an adopted or borrowed pointer) with its
//! [`DeallocationRecipe`] and a release rule fixed at creation, and the teardown that runs the
//! recipe (docs/decisions.md D1, D2, D3, D9).

use std::any::Any;
use std::borrow::Cow;
use std::fmt;
use std::sync::{Arc, Mutex};

use cuda_sys::types::{c_void, CUdeviceptr, CUgraph, CUmemPoolPtrExportData, CUstream};
use cuda_sys::Driver;

use crate::allocation::{call_deallocator, AdoptError, Deallocator, Freed, OwnedAllocation};
use crate::context::ContextHandle;
use crate::deferred::{self, Deferred};
use crate::event::{create_raw, destroy_raw};
use crate::flags::{EventFlags, MemAttachFlags};
use crate::pool::MemoryPoolHandle;
use crate::recipe::{DeallocationRecipe, RecipeRemains};
use crate::report::{
    report, warn, CleanupStep, CleanupWarning, CleanupWarningKind, Consequence, Subject,
};
use crate::scope::{report_restore, run_in, run_in_from, Ran};
use crate::stream::{capture_may_be_active, capture_state, CaptureState, StreamHandle};
use crate::sync_free::{SyncFree, SyncKind};
use crate::sys::{check, current_context_raw, driver, error};
use crate::user_object::UserObjectOwnership;
use crate::HandleError;

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
    /// Host memory adopted with a [`Deallocator`] (a host-only resource's): no device work can
    /// touch it, so no recipe orders or legalises its free. The deallocator receives the
    /// legacy default-stream token, unbound, and no context is made current.
    HostDeallocator,
    /// Memory lent out of a cache ([`DevicePtrHandle::lend`]): at the last drop the cache's
    /// block goes back to its [`BlockCache`] with this handle's last recipe, after the declared
    /// uses are ordered before it; no driver call of its own.
    Lent,
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
    /// The process's one mapping of an imported pointer (held by the IPC registry).
    IpcImport(PoolRef),
    /// One import's reference to that mapping, given back by the registry's deallocator.
    IpcShare(PoolRef, Arc<dyn Deallocator>),
    Deallocator(Arc<dyn Deallocator>),
    HostDeallocator(Arc<dyn Deallocator>),
    /// A cache's block lent out; `None` once given back (or leaked).
    Lent {
        block: Option<DevicePtrHandle>,
        cache: Arc<dyn BlockCache>,
    },
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
            Release::IpcImport(_) | Release::IpcShare(..) => ReleaseKind::IpcImport,
            Release::Deallocator(_) => ReleaseKind::Deallocator,
            Release::HostDeallocator(_) => ReleaseKind::HostDeallocator,
            Release::Lent { .. } => ReleaseKind::Lent,
            Release::Owner(_) => ReleaseKind::Owner,
            Release::NonOwning => ReleaseKind::NonOwning,
        }
    }
}

struct PtrBox {
    ptr: u64,
    size: usize,
    /// The device the memory lives on when known; recipes must be in a context of it.
    device: Option<i32>,
    /// The only mutable field: replaced wholesale, read once at teardown. `None` for the rules
    /// that free nothing, and after release.
    recipe: Mutex<Option<DeallocationRecipe>>,
    release: Release,
    /// Streams other than the deallocation stream that use the memory
    /// ([`DevicePtrHandle::record_use`]), bound like recipes; at the free, the free's stream
    /// waits for the work enqueued on each so far. Apart from the recipe, so that replacing the
    /// recipe (docs/decisions.md D4) carries them over. Empty (no allocation) for most memory.
    uses: Mutex<Vec<DeallocationRecipe>>,
    released: bool,
    /// A free being retried after it waited for a capture (the handle a deferred free gave its
    /// release rule to): its one-time warnings were reported already.
    retried: bool,
}

/// Where memory lent out of a cache goes back when its last handle goes
/// ([`DevicePtrHandle::lend`], [`ReleaseKind::Lent`]): a caching memory resource's bins.
///
/// Called once per lent handle, by whoever drops (or releases) the last clone, on that thread
/// (a user thread, the cleanup worker, a drain), never with a lock of this crate held. By then
/// the block carries the lent handle's last recipe (its stream is the one the free is ordered
/// on, [`DeallocationRecipe::free_stream`]) and the free's stream has been made to wait for the
/// declared use streams (docs/decisions.md D12), so work enqueued on that stream after this
/// call is ordered after every use of the memory.
pub trait BlockCache: Send + Sync {
    /// Takes `block` back. `bin` is the raw value of the stream the free is ordered on when the
    /// block's recipe keeps that stream alive ([`StreamHandle::pins_its_stream`]: a created
    /// stream, or a wrapped one with an owner), so that the value names that stream while the
    /// block sits in a bin; `None` otherwise (a stream wrapped without an owner, which its maker
    /// may destroy and whose value a new stream may get, or a default-stream token bound to a
    /// context or a thread), whose block should be freed.
    /// `explicit`: a close or release that returns its error (and may block), rather than a
    /// drop, which must not block on the GPU (docs/decisions.md D9). To free the block, release
    /// it (explicit) or drop it.
    ///
    /// # Errors
    /// The block's own free failing (an explicit release); returned by the lent handle's
    /// explicit release, reported through the cleanup-error hook on a drop.
    fn give_back(
        &self,
        block: DevicePtrHandle,
        bin: Option<usize>,
        explicit: bool,
    ) -> Result<(), HandleError>;

    /// The cache as its user knows it, for cleanup reports. Default: the Rust type's name.
    fn name(&self) -> &str {
        std::any::type_name::<Self>()
    }
}

/// A device (or pinned host) pointer with its deallocation recipe and release rule.
///
/// Cloning is one atomic increment and every clone shares the recipe: a
/// [`DevicePtrHandle::set_deallocation_stream`] on one is seen by all (a graph attachment
/// included). The last clone to go frees the memory with the recipe current at that moment:
///
/// - stream-ordered families (pool, async, IPC import): `cuMemFreeAsync` on the recipe stream;
///   on a created or wrapped stream with no context call at all (it identifies its context,
///   docs/driver-facts.md F4, F8), on a default-stream token (and for IPC imports) in the
///   recipe's context, made current only if it is not (docs/decisions.md D2);
/// - synchronous families (`cuMemAlloc`, pinned host, managed): a drop records an event on the
///   recipe stream (in the recipe's context, which events need) and hands (event, pointer,
///   recipe) to the cleanup worker, which waits for the event and frees in the recipe's context;
///   it never blocks the dropping thread (docs/decisions.md D9). An explicit
///   [`DevicePtrHandle::release`] synchronises the recipe stream and frees before returning,
///   with no context call on a created or wrapped stream (F5, F6);
/// - adopted pointers: the [`Deallocator`], always in the recipe context;
/// - lent memory ([`DevicePtrHandle::lend`]): its block goes back to the [`BlockCache`] with the
///   recipe, no driver call (the declared uses are ordered first);
/// - owner-kept and borrowed pointers: nothing is freed.
///
/// A drop whose free fails reports through the cleanup-error hook; an explicit release returns
/// the error.
#[derive(Clone)]
pub struct DevicePtrHandle(Arc<PtrBox>);

impl Release {
    /// The driver function (or `deallocate`) that frees memory of this rule, for reports.
    fn free_operation(&self) -> &'static str {
        match self {
            Release::Pool(_) | Release::Async | Release::IpcImport(_) => "cuMemFreeAsync",
            Release::Synchronous | Release::Managed => "cuMemFree_v2",
            Release::PinnedHost => "cuMemFreeHost",
            Release::IpcShare(..) | Release::Deallocator(_) | Release::HostDeallocator(_) => {
                "deallocate"
            }
            Release::Lent { .. } => "give_back",
            Release::Owner(_) | Release::NonOwning => "none",
        }
    }

    /// The name of a built-in release rule's resource (the synchronous families' for the worker).
    fn resource_name(&self) -> &'static str {
        match self.resource() {
            Cow::Borrowed(name) => name,
            Cow::Owned(_) => "adopted memory",
        }
    }

    /// The resource as its user knows it, for reports (built on error paths only).
    #[cold]
    fn resource(&self) -> Cow<'static, str> {
        Cow::Borrowed(match self {
            Release::Pool(_) => "pool allocation",
            Release::Async => "stream-ordered allocation",
            Release::Synchronous => "cuMemAlloc allocation",
            Release::PinnedHost => "pinned host allocation",
            Release::Managed => "managed allocation",
            Release::IpcImport(_) | Release::IpcShare(..) => "IPC-imported allocation",
            Release::Deallocator(deallocator) | Release::HostDeallocator(deallocator) => {
                return Cow::Owned(deallocator.name().to_owned())
            }
            Release::Lent { cache, .. } => return Cow::Owned(cache.name().to_owned()),
            Release::Owner(_) => "owner-kept memory",
            Release::NonOwning => "borrowed memory",
        })
    }
}

/// `operation` on `ptr` with `recipe`, for reports.
#[cold]
fn subject(
    release: &Release,
    operation: &'static str,
    ptr: u64,
    recipe: &DeallocationRecipe,
) -> Subject {
    Subject::new(
        release.resource(),
        operation,
        ptr,
        recipe.free_stream().raw_usize() as u64,
        recipe.context_raw() as u64,
    )
}

/// Hands a release's outcome to its caller: an explicit release returns it (a restore failure
/// after a failed free is reported, since one error is returned), a drop reports everything.
#[cold]
#[inline(never)]
fn finish(
    ran: Ran<Result<(), HandleError>>,
    release: &Release,
    operation: &'static str,
    ptr: u64,
    recipe: &DeallocationRecipe,
    explicit: bool,
) -> Result<(), HandleError> {
    let subject = || subject(release, operation, ptr, recipe);
    if explicit {
        ran.into_result_for(operation, recipe.context_raw(), subject, drop)
    } else {
        ran.report(subject);
        Ok(())
    }
}

/// A driver status as a result for `call`, for the outcome of work run in a context.
#[inline]
fn checked(call: &'static str) -> impl FnOnce(u32) -> Result<(), HandleError> {
    move |status| check(call, status)
}

/// Hands `handle` (memory whose free was refused, or must not be issued, because its stream is
/// being captured into `graph`) to that graph: a user object the capture graph retains owns it,
/// so the graph the capture produces, its clones and executables keep the memory allocated, and
/// deferred cleanup frees it when the last of them goes (docs/decisions.md D11). If the graph
/// cannot take it, the free waits for the capture to end instead (parked; reported).
///
/// Driver calls: `cuCtxGetCurrent`, `cuCtxSetCurrent` (if needed), `cuUserObjectCreate`,
/// `cuGraphRetainUserObject`, `cuUserObjectRelease`.
#[cold]
#[inline(never)]
fn hand_over(context: &ContextHandle, graph: usize, handle: DevicePtrHandle) {
    let (ptr, stream) = (handle.ptr(), handle.deallocation_stream());
    // The handle sits in a cell the user object's payload shares, so that it can be taken back
    // when the graph refuses the user object (its destructor then finds the cell empty).
    let cell = Arc::new(Mutex::new(Some(handle)));
    let payload: Box<dyn Any + Send> = Box::new(Arc::clone(&cell));
    let refused = match UserObjectOwnership::try_new(context, payload) {
        Err((error, payload)) => {
            drop(payload); // the cell's second reference; the handle stays in the cell
            Some(("cuUserObjectCreate", error))
        }
        Ok(object) => match object.retain_in_raw_graph(graph as CUgraph) {
            Ok(()) => None, // our reference goes with `object`; the graph's stays
            Err(error) => Some(("cuGraphRetainUserObject", error)),
        },
    };
    let Some((operation, error)) = refused else {
        return;
    };
    let taken = cell.lock().unwrap_or_else(|e| e.into_inner()).take();
    if let Some(handle) = taken {
        deferred::park(Box::new(handle));
    }
    report(
        Subject::new(
            "memory handed to a capture",
            operation,
            ptr,
            stream.map_or(0, |s| s.raw_usize() as u64),
            context.raw_usize() as u64,
        ),
        CleanupStep::Operation,
        Consequence::Deferred,
        error,
    );
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
    /// Host (pinned) or managed memory, usable from any device's context: its recipes and
    /// declared uses may be on any device's stream.
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

pub(crate) fn check_device(
    device: Option<i32>,
    recipe: &DeallocationRecipe,
) -> Result<(), HandleError> {
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
    /// On a created or wrapped stream the allocation makes no context call (the stream
    /// identifies its context, docs/decisions.md D2); on a default-stream token it runs in the
    /// recipe's context (made current only if it is not), and the caller's binding is restored.
    /// The handle holds `pool`, so an owned pool outlives it.
    ///
    /// # Errors
    /// [`HandleError::WrongDevice`] for a stream whose context is on another device than the
    /// pool; [`HandleError::NoCurrentContext`] for an unbound token on a thread with no context;
    /// [`HandleError::Driver`] when the allocation fails; [`HandleError::ContextNotActivated`]
    /// when the recipe's context cannot be made current; [`HandleError::ContextNotRestored`]
    /// when the caller's cannot be put back (the allocation is freed again first). Nothing is
    /// allocated or leaked on error.
    ///
    /// Driver calls: `cuMemAllocFromPoolAsync`; for a token also `cuCtxGetCurrent` and
    /// `cuCtxSetCurrent` (only when the recipe's context is not current); `cuMemFreeAsync` at
    /// release.
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
    /// Driver calls: `cuMemAllocAsync`; for a token also `cuCtxGetCurrent` and `cuCtxSetCurrent`
    /// (if needed); `cuMemFreeAsync` at release.
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
    /// `CU_MEM_ATTACH_*`: [`MemAttachFlags::GLOBAL`] or [`MemAttachFlags::HOST`]) in the
    /// recipe's context. Released like [`DevicePtrHandle::alloc`]. The memory is not bound to
    /// that context's device: any device's stream may become its deallocation stream or a
    /// declared use (docs/decisions.md D12), as for pinned host memory.
    ///
    /// # Errors
    /// As [`DevicePtrHandle::alloc`].
    ///
    /// Driver calls: `cuCtxGetCurrent`, `cuCtxSetCurrent` (if needed), `cuMemAllocManaged`; at
    /// release as [`DevicePtrHandle::alloc`].
    pub fn alloc_managed(
        size: usize,
        flags: MemAttachFlags,
        stream: &StreamHandle,
    ) -> Result<DevicePtrHandle, HandleError> {
        reject_zero(size)?;
        Self::allocate(
            size,
            stream,
            Placement::Host, // managed memory is not bound to the allocating context's device
            Release::Managed,
            "cuMemAllocManaged",
            |d, _, ptr| {
                // SAFETY: `ptr` is a valid out-pointer; the recipe's context is current.
                unsafe { (d.cuMemAllocManaged)(ptr, size, flags.bits()) }
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
    /// `cuMemPoolImportPointer`, `cuPointerGetAttributes`; `cuMemFreeAsync` at release.
    pub(crate) fn import_from_pool(
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
                // SAFETY: `ptr` is a valid out-pointer; `data` is a copy the driver may read;
                // the pool handle is alive and the recipe's context is current.
                unsafe { (d.cuMemPoolImportPointer)(ptr, pool_raw, &mut data) }
            },
            |d, ptr, stream| {
                let _ = free_async(d, ptr, stream);
            },
        )?;
        // `size` is the exporter's claim; every range of the handle trusts it, so it is checked
        // against what the driver mapped. A short mapping is freed again (on `stream`) by the
        // drop.
        let extent = crate::pointer::pointer_attributes(handle.ptr())?.map_or(0, |a| a.range_size);
        if extent < size {
            return Err(HandleError::invalid(
                "size",
                format!(
                    "the import's size ({size} bytes) exceeds the mapped allocation extent \
                     ({extent} bytes)"
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
        if allocation.ptr() == 0 {
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

    /// One import's handle to the process's mapping of an imported pointer (`ptr`, `size`
    /// bytes of `pool`), released by `share` with `recipe`: for the IPC registry.
    pub(crate) fn share_of_import(
        ptr: CUdeviceptr,
        size: usize,
        pool: &MemoryPoolHandle,
        recipe: DeallocationRecipe,
        share: Arc<dyn Deallocator>,
    ) -> DevicePtrHandle {
        Self::from_parts(
            ptr,
            size,
            pool.device(),
            Some(recipe),
            Release::IpcShare(PoolRef::of(pool), share),
        )
    }

    /// Takes host memory (`allocation`) into custody, to be freed by `deallocator` with no
    /// recipe ([`ReleaseKind::HostDeallocator`]): for a host-only resource, whose memory no
    /// device work can touch. No driver call, now or at release: the deallocator receives the
    /// legacy default-stream token, unbound, with whatever context the releasing thread has;
    /// [`DevicePtrHandle::set_deallocation_stream`] records nothing for it.
    ///
    /// # Errors
    /// [`HandleError::InvalidArgument`] for a null address; the allocation is given back.
    pub fn adopt_host(
        allocation: OwnedAllocation,
        deallocator: Arc<dyn Deallocator>,
    ) -> Result<DevicePtrHandle, AdoptError> {
        if allocation.ptr() == 0 {
            return Err(AdoptError {
                error: HandleError::invalid(
                    "ptr",
                    "a null pointer cannot be owned by a deallocator",
                ),
                allocation,
            });
        }
        let (ptr, size) = allocation.into_raw();
        Ok(Self::from_parts(
            ptr,
            size,
            None,
            None,
            Release::HostDeallocator(deallocator),
        ))
    }

    /// Lends the first `size` bytes of `block`, a cache's allocation, as memory ordered on
    /// `stream` ([`ReleaseKind::Lent`]): the new handle has its own recipe (recorded now for
    /// `stream`) and its own declared uses, and when its last clone goes, `block` goes back to
    /// `cache` ([`BlockCache::give_back`]) carrying that handle's last recipe, after the free's
    /// stream was made to wait for the declared uses (docs/decisions.md D12). A free on a
    /// capturing stream hands the lent handle to the capture's graph first, as for a
    /// deallocator (D11); a free whose uses cannot be ordered leaks the block rather than let
    /// it be reused or freed unordered. The block's own release rule frees it when the cache
    /// releases or drops it.
    ///
    /// # Errors
    /// With `block` given back: [`HandleError::InvalidArgument`] for a zero `size`, one larger
    /// than the block, a block with no recipe (owner-kept, borrowed or host-only memory) or one
    /// with other clones (a block is lent by its one holder); [`HandleError::NoCurrentContext`]
    /// for an unbound token on a thread with no context; [`HandleError::WrongDevice`] for a
    /// stream of another device than the block's memory.
    ///
    /// Driver calls: `cuCtxGetCurrent` (unbound tokens only); none at release (the block's own
    /// rule makes the driver calls when the cache frees it; declared uses as
    /// [`DevicePtrHandle::record_use`] says).
    pub fn lend(
        block: DevicePtrHandle,
        size: usize,
        stream: &StreamHandle,
        cache: Arc<dyn BlockCache>,
    ) -> Result<DevicePtrHandle, (HandleError, DevicePtrHandle)> {
        let refused = if size == 0 || size > block.size() {
            Some("the size must be between 1 and the block's size")
        } else if matches!(
            block.0.release,
            Release::Owner(_) | Release::NonOwning | Release::HostDeallocator(_)
        ) {
            Some("a block without a deallocation recipe cannot be lent")
        } else if Arc::strong_count(&block.0) != 1 {
            Some("a block is lent by its one holder: it has other clones")
        } else {
            None
        };
        if let Some(reason) = refused {
            return Err((HandleError::invalid("block", reason), block));
        }
        let recipe = match DeallocationRecipe::record(stream) {
            Ok(recipe) => recipe,
            Err(error) => return Err((error, block)),
        };
        if let Err(error) = check_device(block.0.device, &recipe) {
            return Err((error, block));
        }
        let (ptr, device) = (block.ptr(), block.0.device);
        Ok(Self::from_parts(
            ptr,
            size,
            device,
            Some(recipe),
            Release::Lent {
                block: Some(block),
                cache,
            },
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
            uses: Mutex::new(Vec::new()),
            released: false,
            retried: false,
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
        if matches!(release, Release::Pool(_) | Release::Async) && stream.identifies_its_context() {
            // D2: a stream-ordered allocation on a created or wrapped stream needs no context
            // (docs/driver-probe/h200-580.159.04-alloc-context.txt), and such a stream brings its
            // recipe's context: no context call at all.
            let recipe = DeallocationRecipe::bind_with_current(stream, 0)?;
            let device = match placement {
                Placement::Pool(device) => device,
                _ => Some(recipe.context().device()),
            };
            check_device(device, &recipe)?;
            let mut ptr = 0u64;
            check(alloc_call, alloc(d, stream.raw(), &mut ptr))?;
            return Ok(Self::from_parts(ptr, size, device, Some(recipe), release));
        }
        let current = current_context_raw(d).map_err(|s| error("cuCtxGetCurrent", s))?;
        let recipe = DeallocationRecipe::bind_with_current(stream, current)?;
        let device = match placement {
            Placement::Pool(device) => device,
            Placement::Context => Some(recipe.context().device()),
            Placement::Host => None,
        };
        check_device(device, &recipe)?;
        let target = recipe.context_raw();
        let raw_stream = stream.raw();
        let mut ptr = 0u64;
        // The current context was just read (for the recipe): the switch reuses it.
        run_in_from(d, current, target, || alloc(d, raw_stream, &mut ptr))
            .map(checked(alloc_call))
            .into_result(alloc_call, target, |()| {
                // The recipe's context is still current (the restore failed): give the memory
                // back before failing.
                undo(d, ptr, raw_stream)
            })?;
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

    /// For lent memory ([`ReleaseKind::Lent`]), the release family of the cache's block behind
    /// it (which frees the memory when the cache does); `None` for every other rule.
    pub fn lent_block_kind(&self) -> Option<ReleaseKind> {
        match &self.0.release {
            Release::Lent { block, .. } => block.as_ref().map(DevicePtrHandle::kind),
            _ => None,
        }
    }

    /// The device the memory lives on, when known (`None` for pinned host and managed memory,
    /// which any device's streams may use, and for adopted or borrowed pointers).
    pub fn device(&self) -> Option<i32> {
        self.0.device
    }

    /// The pool the memory came from (pool allocations and IPC imports). An owned pool comes
    /// back as the handle the allocation holds; a borrowed pool as a new borrowed handle.
    pub fn pool(&self) -> Option<MemoryPoolHandle> {
        match &self.0.release {
            Release::Pool(pool) | Release::IpcImport(pool) | Release::IpcShare(pool, _) => {
                Some(pool.handle())
            }
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
    /// [`HandleError::WrongDevice`] for a stream whose context is on another device than
    /// the memory; [`HandleError::ContextDestroyed`] for a stream whose context, one custody
    /// does not hold, was destroyed by its owner.
    ///
    /// Driver calls: `cuCtxGetCurrent` (unbound tokens only); `cuCtxGetId` (a stream in a
    /// context custody does not hold).
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
        if matches!(
            self.0.release,
            Release::Owner(_) | Release::NonOwning | Release::HostDeallocator(_)
        ) {
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

    /// Declares that work on `stream` uses this memory: when the memory is freed, the free's
    /// stream first waits (`cuStreamWaitEvent`) for an event recorded on `stream` at that moment,
    /// so the free is ordered after everything enqueued on `stream` until the free, not only
    /// until this call (docs/decisions.md D12). Nothing is recorded or synchronised now, and the
    /// host never blocks for it later (a drop stays non-blocking, docs/decisions.md D9). The use
    /// is kept apart from the recipe: [`DevicePtrHandle::set_deallocation_stream`] keeps it, and
    /// every clone shares it. Recording the same stream again does nothing; a use on the
    /// deallocation stream itself costs nothing at the free. The stream is kept alive until the
    /// free. A default-stream token is bound as a recipe binds it (docs/decisions.md D1): to the
    /// current context, and the per-thread default stream also to the calling thread (freed on
    /// another thread, the event is recorded on the bound context's legacy stream, which waits
    /// for the recording thread's per-thread stream, docs/decisions.md D6). For memory that
    /// frees nothing (owner-kept, borrowed) or host memory adopted with a host-only
    /// deallocator, nothing is recorded.
    ///
    /// # Errors
    /// [`HandleError::NoCurrentContext`] for an unbound token on a thread with no context;
    /// [`HandleError::WrongDevice`] for a stream whose context is on another device than the
    /// memory (as a deallocation stream would be refused). On error nothing is recorded.
    ///
    /// Driver calls: `cuCtxGetCurrent` (unbound tokens only); at the free, per use stream
    /// (cold path: none when no use is recorded), `cuStreamGetCaptureInfo_v2`, `cuEventCreate`,
    /// `cuEventRecord`, `cuStreamWaitEvent`, `cuEventDestroy_v2`, each in the context it needs
    /// (`cuCtxGetCurrent`, `cuCtxSetCurrent` if needed).
    pub fn record_use(&self, stream: &StreamHandle) -> Result<(), HandleError> {
        if matches!(
            self.0.release,
            Release::Owner(_) | Release::NonOwning | Release::HostDeallocator(_)
        ) {
            return Ok(());
        }
        let recorded = DeallocationRecipe::record(stream)?;
        check_device(self.0.device, &recorded)?;
        let mut uses = self.0.uses.lock().unwrap_or_else(|e| e.into_inner());
        if !uses.iter().any(|u| u.same_target(&recorded)) {
            uses.push(recorded);
        }
        Ok(())
    }

    /// The streams recorded by [`DevicePtrHandle::record_use`], in the order they were first
    /// recorded (one clone each).
    pub fn use_streams(&self) -> Vec<StreamHandle> {
        let uses = self.0.uses.lock().unwrap_or_else(|e| e.into_inner());
        uses.iter().map(|u| u.stream().clone()).collect()
    }

    /// Releases this handle now. When it is the last one, frees the memory as its rule says
    /// and returns the outcome instead of reporting it; the handle is gone either way. When
    /// other clones remain, nothing is freed and `Ok(())` is returned.
    ///
    /// Unlike a drop, this may block: a synchronous family waits for the recipe stream and
    /// frees before returning.
    ///
    /// # Errors
    /// The free's error ([`HandleError::Driver`], or the [`Deallocator`]'s): nothing was freed
    /// (for a deallocator that panicked, its [`DeallocatorPanic`](crate::DeallocatorPanic)
    /// source says whether it freed the memory first, or that this cannot be known);
    /// [`HandleError::ContextNotActivated`]: the recipe's context could not be made current, so
    /// the free did not run (the memory has leaked); [`HandleError::ContextNotRestored`]: the
    /// memory *was* freed, but the caller's context could not be put back.
    ///
    /// Driver calls: those of the rule (see [`ReleaseKind`]), in the recipe's context where
    /// the rule needs one (see [`DevicePtrHandle`]); for the synchronous families
    /// `cuStreamSynchronize` first.
    pub fn release(self) -> Result<(), HandleError> {
        match Arc::try_unwrap(self.0) {
            Ok(mut inner) => inner.release_now(true),
            Err(_) => Ok(()),
        }
    }

    /// [`release`](Self::release), handing back what the recipe held last instead of dropping
    /// it: when this recipe's stream or context had no other holder, their remains, whose drop
    /// makes a driver call (`cuStreamDestroy`, a context release), so that the caller chooses
    /// where that happens (a binding: with the interpreter lock released). Unlike taking a
    /// [`recipe`](Self::recipe) copy first, this costs no lock and no reference-count increment.
    /// `None` when other clones remain (nothing freed), when the rule frees nothing, or when the
    /// free was deferred (then the deferred work holds the recipe).
    ///
    /// # Errors
    /// As [`release`](Self::release); the remains come back either way.
    ///
    /// Driver calls: as [`release`](Self::release), without the recipe's own last release.
    pub fn release_with_remains(self) -> (Result<(), HandleError>, Option<RecipeRemains>) {
        match Arc::try_unwrap(self.0) {
            Ok(mut inner) => {
                let result = inner.release_now(true);
                let remains = inner
                    .recipe
                    .get_mut()
                    .unwrap_or_else(|e| e.into_inner())
                    .take()
                    .and_then(DeallocationRecipe::into_last_references);
                (result, remains)
            }
            Err(_) => (Ok(()), None),
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
}

impl PtrBox {
    /// Puts a used recipe back into the box (no atomic operation: the box is ours alone), so
    /// that it goes with the box, or to [`DevicePtrHandle::release_with_remains`]'s caller.
    #[inline]
    fn keep_recipe(&mut self, recipe: DeallocationRecipe) {
        *self.recipe.get_mut().unwrap_or_else(|e| e.into_inner()) = Some(recipe);
    }

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
            if let Release::HostDeallocator(deallocator) = &self.release {
                return release_host(deallocator.as_ref(), ptr, self.size, explicit);
            }
            return Ok(()); // owner-kept or borrowed: the owner drops with the box
        };
        let d = driver()?;
        // D6: a per-thread-default-stream free away from its recording thread is issued on the
        // legacy stream of the recipe's context (F14); every other free on the recorded stream.
        let (stream, other_thread) = recipe.free_target();
        // D11: while a capture custody began runs, a free on a token (which may be the legacy
        // stream, blocked by that capture), an IPC import's and a deallocator's look first; the
        // others find out from their own failure (F16) or ask where an event would be recorded.
        // A free away from the recording thread always looks first: issuing work on the legacy
        // stream while a blocking stream of its context is captured would break that capture.
        // Declared uses (D12) look first too: the free's stream must not be captured when it
        // waits for them.
        let has_uses = !self
            .uses
            .get_mut()
            .unwrap_or_else(|e| e.into_inner())
            .is_empty();
        let looks_first = has_uses
            || match &self.release {
                Release::Pool(_) | Release::Async => !stream.identifies_its_context(),
                Release::IpcImport(_)
                | Release::IpcShare(..)
                | Release::Deallocator(_)
                | Release::Lent { .. } => true,
                Release::Synchronous | Release::Managed | Release::PinnedHost => explicit,
                Release::Owner(_) | Release::NonOwning | Release::HostDeallocator(_) => false,
            };
        if looks_first
            && (other_thread || has_uses || capture_may_be_active())
            && self.defer_if_captured(d, &recipe)
        {
            self.keep_recipe(recipe);
            return Ok(());
        }
        if has_uses {
            match self.order_after_uses(d, &recipe, stream) {
                Ok(UsesOrdered::Yes) => {}
                Ok(UsesOrdered::WaitForCapture) => {
                    self.defer_captured(CaptureState::Blocked, recipe);
                    return Ok(());
                }
                Err(error) => {
                    self.leak_lent_block();
                    return self.unordered_use(error, &recipe, stream, explicit);
                }
            }
        }
        if matches!(self.release, Release::Lent { .. }) {
            return self.give_back(recipe, explicit);
        }
        match &self.release {
            Release::Pool(_) | Release::Async => {
                // The hot path: raw statuses, nothing built unless something went wrong.
                let raw_stream = stream.raw();
                let free = || {
                    // SAFETY: the pointer is owned by the box being released and freed once; the
                    // recipe keeps the stream alive; a created or wrapped stream needs no context
                    // (F4, F8), for a token the recipe's context is current.
                    unsafe { (d.cuMemFreeAsync)(ptr, raw_stream) }
                };
                let ran = if stream.identifies_its_context() {
                    // D2: no context calls at all.
                    Ran::Done {
                        value: free(),
                        restore: 0,
                        previous: 0,
                    }
                } else {
                    run_in(d, recipe.context_raw(), free)
                };
                match ran {
                    Ran::Done {
                        value: 0,
                        restore: 0,
                        ..
                    } => {
                        self.keep_recipe(recipe);
                        return Ok(());
                    }
                    // F16: the driver refuses a captured free of memory the capture did not
                    // allocate; if that is why, the graph being captured takes the memory.
                    Ran::Done { value, .. } if value != 0 && self.defer_if_captured(d, &recipe) => {
                        self.keep_recipe(recipe);
                        return Ok(());
                    }
                    _ => {}
                }
                let ran = ran.map(checked("cuMemFreeAsync"));
                let result = finish(ran, &self.release, "cuMemFreeAsync", ptr, &recipe, explicit);
                self.keep_recipe(recipe);
                result
            }
            Release::IpcImport(_) => {
                // Kept in the recipe's context: no measurement shows an imported pointer's free
                // succeeding without one.
                let raw_stream = stream.raw();
                let ran = run_in(d, recipe.context_raw(), || {
                    // SAFETY: as above; the IPC registry serialises imports and this free (it
                    // releases the mapping holding its lock).
                    unsafe { (d.cuMemFreeAsync)(ptr, raw_stream) }
                });
                let ran = ran.map(checked("cuMemFreeAsync"));
                finish(ran, &self.release, "cuMemFreeAsync", ptr, &recipe, explicit)
            }
            Release::Synchronous | Release::Managed => {
                self.release_sync(d, SyncKind::Device, recipe, explicit)
            }
            Release::PinnedHost => self.release_sync(d, SyncKind::Host, recipe, explicit),
            Release::Deallocator(deallocator) | Release::IpcShare(_, deallocator) => {
                // Always in the recipe's context: a deallocator is promised it (D2). It frees on
                // the stream it is given: away from the recording thread of a per-thread-default-
                // stream recipe, the legacy token (D6).
                let size = self.size;
                let ran = run_in(d, recipe.context_raw(), || {
                    call_deallocator(deallocator.as_ref(), ptr, size, stream)
                });
                let freed = match &ran {
                    Ran::Done {
                        value: (_, freed), ..
                    } => *freed,
                    Ran::NotActivated(_) => Freed::No,
                };
                let ran = ran.map(|(result, _)| result);
                let subject = || subject(&self.release, "deallocate", ptr, &recipe);
                if explicit {
                    ran.into_result_for("deallocate", recipe.context_raw(), subject, drop)
                } else {
                    ran.report_as(subject, freed.consequence());
                    Ok(())
                }
            }
            Release::HostDeallocator(_)
            | Release::Lent { .. }
            | Release::Owner(_)
            | Release::NonOwning => Ok(()),
        }
    }

    /// Lent memory ([`DevicePtrHandle::lend`]), its uses ordered: the block takes this recipe
    /// (unless it holds one for the same stream, context and thread already, kept as it is) and
    /// goes back to its cache, which bins it under the free's stream or frees it. No driver
    /// call here; the cache's own free of the block makes the block's.
    #[inline]
    fn give_back(&mut self, recipe: DeallocationRecipe, explicit: bool) -> Result<(), HandleError> {
        let ptr = self.ptr;
        let Release::Lent { block, .. } = &mut self.release else {
            return Ok(());
        };
        let Some(mut block) = block.take() else {
            self.keep_recipe(recipe);
            return Ok(());
        };
        let Release::Lent { cache, .. } = &self.release else {
            return Ok(());
        };
        let (stream, other_thread) = recipe.free_target();
        let bin = (stream.pins_its_stream() && !other_thread).then(|| stream.raw_usize());
        let take_this = |own: &mut Option<DeallocationRecipe>| {
            if own.as_ref().is_some_and(|r| r.same_target(&recipe)) {
                None
            } else {
                own.replace(recipe.clone())
            }
        };
        // The block has no other holder (`lend` checked, and it was never handed out): its
        // recipe is reached without the lock.
        let replaced = match Arc::get_mut(&mut block.0) {
            Some(own) => take_this(own.recipe.get_mut().unwrap_or_else(|e| e.into_inner())),
            None => take_this(&mut block.0.recipe.lock().unwrap_or_else(|e| e.into_inner())),
        };
        drop(replaced); // outside the lock: it may hold a stream's last reference
                        // A cache that panics took the block: whether it freed or kept it cannot be known.
        let (result, failed) = match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            cache.give_back(block, bin, explicit)
        })) {
            Ok(result) => (result, Consequence::Leaked),
            Err(_) => (
                Err(HandleError::deallocator("the block cache panicked")),
                Consequence::Unknown,
            ),
        };
        let result = match result {
            Ok(()) => Ok(()),
            Err(error) => {
                let ran = Ran::Done {
                    value: Err(error),
                    restore: 0,
                    previous: 0,
                };
                let subject = || subject(&self.release, "give_back", ptr, &recipe);
                if explicit {
                    ran.into_result_for("give_back", recipe.context_raw(), subject, drop)
                } else {
                    ran.report_as(subject, failed);
                    Ok(())
                }
            }
        };
        self.keep_recipe(recipe);
        result
    }

    /// A lent block whose free could not be ordered after its uses (D12) is leaked with the
    /// memory: neither reused nor freed unordered.
    #[cold]
    fn leak_lent_block(&mut self) {
        if let Release::Lent { block, .. } = &mut self.release {
            if let Some(block) = block.take() {
                std::mem::forget(block);
            }
        }
    }

    /// D12: makes `free` (the stream this free is issued on, resolved in `recipe`'s context)
    /// wait for the work enqueued so far on every declared use stream: an event recorded on the
    /// use stream now (in the use's context; on the legacy stream of that context for a
    /// per-thread-default-stream use away from its recording thread, D6), waited for by `free`
    /// (`cuStreamWaitEvent`, in the recipe's context), then destroyed (the driver keeps a
    /// waited-for event until the wait is done). A use on `free` itself is skipped. Takes the
    /// uses; when a use stream is being captured, puts them back and says the free must wait
    /// for the capture to end (an event recorded there would be a capture node, and waiting on
    /// it would pull the free into the capture).
    ///
    /// # Errors
    /// The first failing driver call; the free must then not run (it would be unordered).
    ///
    /// Driver calls: per use, `cuStreamGetCaptureInfo_v2`, `cuEventCreate`, `cuEventRecord`,
    /// `cuStreamWaitEvent`, `cuEventDestroy_v2`, with `cuCtxGetCurrent` and `cuCtxSetCurrent`
    /// where the context differs.
    #[cold]
    #[inline(never)]
    fn order_after_uses(
        &mut self,
        d: &'static Driver,
        recipe: &DeallocationRecipe,
        free: &StreamHandle,
    ) -> Result<UsesOrdered, HandleError> {
        let uses = std::mem::take(self.uses.get_mut().unwrap_or_else(|e| e.into_inner()));
        let free_raw = free.raw();
        for use_recipe in &uses {
            let on = use_recipe.free_stream();
            let use_raw = on.raw();
            if use_raw == free_raw && use_recipe.context_raw() == recipe.context_raw() {
                continue; // the free's own stream: ordered already
            }
            let recorded = run_in(d, use_recipe.context_raw(), || {
                if capture_state(d, use_raw) != CaptureState::Free {
                    return Ok(None);
                }
                let raw = create_raw(EventFlags::DISABLE_TIMING)?;
                // SAFETY: the event was just created in the current (the use's) context; the
                // use recipe keeps its stream alive.
                let status = unsafe { (d.cuEventRecord)(raw as cuda_sys::types::CUevent, use_raw) };
                if let Err(error) = check("cuEventRecord", status) {
                    destroy_raw(raw);
                    return Err(error);
                }
                Ok(Some(raw))
            });
            let about = || subject(&self.release, "cuEventRecord", self.ptr, recipe);
            let recorded = ran_value(recorded, "cuEventRecord", use_recipe.context_raw(), about);
            let Some(event) = recorded? else {
                // Every use goes back (those ordered already cost one more event later).
                *self.uses.get_mut().unwrap_or_else(|e| e.into_inner()) = uses;
                return Ok(UsesOrdered::WaitForCapture);
            };
            let waited = run_in(d, recipe.context_raw(), || {
                // SAFETY: the event is ours and recorded; the recipe keeps the free's stream
                // alive, and for a token its context is current.
                let status = unsafe {
                    (d.cuStreamWaitEvent)(free_raw, event as cuda_sys::types::CUevent, 0)
                };
                check("cuStreamWaitEvent", status)
            });
            // In the event's own context.
            let destroyed = run_in(d, use_recipe.context_raw(), || {
                check("cuEventDestroy_v2", destroy_raw(event))
            });
            let about = || subject(&self.release, "cuStreamWaitEvent", self.ptr, recipe);
            ran_value(waited, "cuStreamWaitEvent", recipe.context_raw(), about)?;
            let about = || subject(&self.release, "cuEventDestroy_v2", self.ptr, recipe);
            let destroyed = ran_value(
                destroyed,
                "cuEventDestroy_v2",
                use_recipe.context_raw(),
                about,
            );
            if let Err(error) = destroyed {
                // The wait is in place: the event's leak does not unorder the free (reported).
                report(about(), CleanupStep::Ordering, Consequence::Leaked, error);
            }
        }
        Ok(UsesOrdered::Yes)
    }

    /// A free whose declared uses could not be ordered (D12) is not issued (it would be
    /// unordered): the memory is leaked, and the error returned (`explicit`) or reported.
    #[cold]
    #[inline(never)]
    fn unordered_use(
        &self,
        error: HandleError,
        recipe: &DeallocationRecipe,
        stream: &StreamHandle,
        explicit: bool,
    ) -> Result<(), HandleError> {
        if explicit {
            return Err(error);
        }
        report(
            Subject::new(
                self.release.resource(),
                "cuStreamWaitEvent",
                self.ptr,
                stream.raw_usize() as u64,
                recipe.context_raw() as u64,
            ),
            CleanupStep::Ordering,
            Consequence::Leaked,
            error,
        );
        Ok(())
    }

    /// D11: when the stream the free is issued on ([`DeallocationRecipe::free_stream`]) is
    /// being captured (or, for the legacy stream, blocked by a capture), defers the free instead
    /// of issuing it, and says so; `false` (and nothing done) when the stream is free to use.
    /// Asks the driver in the recipe's context. A free away from the recording thread of a
    /// per-thread-default-stream recipe that waits for a capture is reported once
    /// ([`CleanupWarningKind::PerThreadStreamFreeWaitsForCapture`]).
    ///
    /// Driver calls: `cuCtxGetCurrent`, `cuCtxSetCurrent` (if needed),
    /// `cuStreamGetCaptureInfo_v2`; to hand over, those of [`hand_over`].
    #[cold]
    #[inline(never)]
    fn defer_if_captured(&mut self, d: &'static Driver, recipe: &DeallocationRecipe) -> bool {
        let raw_stream = recipe.free_stream().raw();
        let state = match run_in(d, recipe.context_raw(), || capture_state(d, raw_stream)) {
            Ran::NotActivated(_) => return false, // the free's own path reports this
            Ran::Done { value, restore, .. } => {
                if restore != 0 {
                    report_restore(
                        subject(&self.release, "cuStreamGetCaptureInfo_v2", self.ptr, recipe),
                        Consequence::ContextNotRestored,
                        restore,
                    );
                }
                value
            }
        };
        if matches!(state, CaptureState::Free | CaptureState::Unknown(_)) {
            return false;
        }
        self.warn_waits_for_capture(recipe, state);
        self.defer_captured(state, recipe.clone());
        true
    }

    /// D6: a free away from the recording thread of a per-thread-default-stream recipe, about to
    /// wait because its context's legacy stream is blocked by a capture (`state`), is reported
    /// once (not again when it is retried).
    #[cold]
    fn warn_waits_for_capture(&self, recipe: &DeallocationRecipe, state: CaptureState) {
        if state != CaptureState::Blocked || self.retried || !recipe.is_other_thread() {
            return;
        }
        if let Some(recorded) = recipe.ptds_thread() {
            warn(CleanupWarning {
                operation: self.release.free_operation(),
                ptr: self.ptr,
                stream: recipe.free_stream().raw_usize() as u64,
                context: recipe.context_raw() as u64,
                kind: CleanupWarningKind::PerThreadStreamFreeWaitsForCapture {
                    recorded_thread: recorded.value(),
                    freeing_thread: crate::recipe::ThreadToken::current().value(),
                },
            });
        }
    }

    /// Defers this free, whose stream is in `state` (not free): a capturing stream's graph takes
    /// the memory (it is freed after the graph and its executables are gone); otherwise it waits
    /// for the capture to end (parked). The box gives up its release rule to a new handle, which
    /// frees with the same recipe when it is dropped later.
    fn defer_captured(&mut self, state: CaptureState, recipe: DeallocationRecipe) {
        let release = std::mem::replace(&mut self.release, Release::NonOwning);
        let uses = std::mem::take(self.uses.get_mut().unwrap_or_else(|e| e.into_inner()));
        let context = recipe.context().clone();
        let handle = DevicePtrHandle(Arc::new(PtrBox {
            ptr: self.ptr,
            size: self.size,
            device: self.device,
            recipe: Mutex::new(Some(recipe)),
            release,
            uses: Mutex::new(uses),
            released: false,
            retried: true,
        }));
        match state {
            CaptureState::Capturing { graph } => hand_over(&context, graph, handle),
            _ => deferred::park(Box::new(handle)),
        }
    }

    fn release_sync(
        &mut self,
        d: &'static Driver,
        kind: SyncKind,
        recipe: DeallocationRecipe,
        explicit: bool,
    ) -> Result<(), HandleError> {
        let ptr = self.ptr;
        let operation = kind.operation();
        let (stream, other_thread) = recipe.free_target();
        let raw_stream = stream.raw();
        if explicit {
            let free = || {
                if other_thread {
                    // D6: work enqueued on the legacy stream waits for the recording thread's
                    // per-thread stream (F14); synchronising the legacy stream alone is not
                    // measured to, so an event recorded there is waited for.
                    wait_for_new_event(d, raw_stream)?;
                } else {
                    // SAFETY: the recipe keeps the stream alive; a created or wrapped stream
                    // needs no context (F6), for a token the recipe's context is current.
                    let status = unsafe { (d.cuStreamSynchronize)(raw_stream) };
                    check("cuStreamSynchronize", status)?;
                }
                kind.free(d, ptr)
            };
            let ran = if stream.identifies_its_context() {
                // D2: `cuStreamSynchronize` of a created stream and the synchronous frees need
                // no context (F5, F6).
                Ran::Done {
                    value: free(),
                    restore: 0,
                    previous: 0,
                }
            } else {
                run_in(d, recipe.context_raw(), free)
            };
            return finish(ran, &self.release, operation, ptr, &recipe, true);
        }
        if crate::lifecycle::exiting() {
            return Ok(()); // at exit: leaked, never freed unsafely
        }
        // D9: order with an event on the caller, free on the cleanup worker. The event is made
        // in the recipe's context (events belong to one). D11: an event recorded in a capture
        // could never be waited for (F17): ask first, where the event would be recorded.
        let mut event = 0usize;
        let mut captured = CaptureState::Free;
        let ran = run_in(d, recipe.context_raw(), || {
            captured = capture_state(d, raw_stream);
            match captured {
                CaptureState::Free => {}
                // Not knowing, no event is recorded (it might be captured): the worker waits for
                // the whole context instead, and the failure is reported (D3).
                CaptureState::Unknown(status) => {
                    captured = CaptureState::Free;
                    return Err(error("cuStreamGetCaptureInfo_v2", status));
                }
                _ => return Ok(()),
            }
            let raw = create_raw(EventFlags::DISABLE_TIMING)?;
            // SAFETY: the event was just created in the current (recipe) context; the recipe
            // keeps the stream alive.
            let status = unsafe { (d.cuEventRecord)(raw as cuda_sys::types::CUevent, raw_stream) };
            if let Err(error) = check("cuEventRecord", status) {
                destroy_raw(raw);
                return Err(error);
            }
            event = raw;
            Ok(())
        });
        if captured != CaptureState::Free {
            self.warn_waits_for_capture(&recipe, captured);
            if let Ran::Done { restore, .. } = ran {
                if restore != 0 {
                    report_restore(
                        subject(&self.release, "cuStreamGetCaptureInfo_v2", ptr, &recipe),
                        Consequence::ContextNotRestored,
                        restore,
                    );
                }
            }
            self.defer_captured(captured, recipe);
            return Ok(());
        }
        let clean = matches!(
            ran,
            Ran::Done {
                value: Ok(()),
                restore: 0,
                ..
            }
        );
        let report_recipe = (!clean || recipe.ptds_thread().is_some()).then(|| recipe.clone());
        deferred::push(Deferred::SyncFree(SyncFree {
            ptr,
            kind,
            resource: self.release.resource_name(),
            stream: raw_stream as u64,
            recipe,
            event,
        }));
        // Reported after the push: an event failure only means the worker synchronises the
        // whole context instead, but no driver error is treated as success (D3).
        if let Some(recipe) = report_recipe {
            report_ordering(ran, &self.release, ptr, &recipe);
        }
        Ok(())
    }
}

/// What [`PtrBox::order_after_uses`] found.
enum UsesOrdered {
    /// The free's stream waits for every use stream.
    Yes,
    /// A use stream is being captured: the free must wait for the capture to end.
    WaitForCapture,
}

/// The outcome of `operation` run in `context`: [`HandleError::ContextNotActivated`] when it
/// did not run; otherwise its own, a failure to put the caller's context back being reported as
/// `subject`'s (the step itself is done either way).
fn ran_value<T>(
    ran: Ran<Result<T, HandleError>>,
    operation: &'static str,
    context: usize,
    subject: impl FnOnce() -> Subject,
) -> Result<T, HandleError> {
    match ran {
        Ran::NotActivated(failure) => Err(HandleError::ContextNotActivated {
            operation,
            context: context as u64,
            error: failure.error(),
        }),
        Ran::Done { value, restore, .. } => {
            if restore != 0 {
                report_restore(subject(), Consequence::ContextNotRestored, restore);
            }
            value
        }
    }
}

/// Records a new event on `raw_stream` (a token resolved in the current context, or a stream) and
/// waits for it on the calling thread, then destroys it.
///
/// Driver calls: `cuEventCreate`, `cuEventRecord`, `cuEventSynchronize`, `cuEventDestroy_v2`.
fn wait_for_new_event(d: &Driver, raw_stream: CUstream) -> Result<(), HandleError> {
    let raw = create_raw(EventFlags::DISABLE_TIMING)?;
    let event = raw as cuda_sys::types::CUevent;
    // SAFETY: the event was just created in the current context; the caller keeps the stream
    // alive.
    let status = unsafe { (d.cuEventRecord)(event, raw_stream) };
    let waited = check("cuEventRecord", status).and_then(|()| {
        // SAFETY: the event is ours and was recorded.
        let status = unsafe { (d.cuEventSynchronize)(event) };
        check("cuEventSynchronize", status)
    });
    if let Err(error) = check("cuEventDestroy_v2", destroy_raw(raw)) {
        // The event is internal; its leak does not change the free's outcome (D3: reported).
        report(
            Subject::new(
                "ordering event",
                "cuEventDestroy_v2",
                raw as u64,
                raw_stream as u64,
                0,
            ),
            CleanupStep::Operation,
            Consequence::Leaked,
            error,
        );
    }
    waited
}

/// Frees host memory through its deallocator, with no recipe: the legacy default-stream token,
/// no context change. `explicit`: return the error; otherwise report it (leaked).
fn release_host(
    deallocator: &dyn Deallocator,
    ptr: u64,
    size: usize,
    explicit: bool,
) -> Result<(), HandleError> {
    let stream = StreamHandle::legacy();
    let (result, freed) = call_deallocator(deallocator, ptr, size, &stream);
    match result {
        Err(error) if !explicit => {
            let subject = Subject::new(
                deallocator.name().to_owned(),
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

/// Reports what went wrong ordering a deferred synchronous free: the worker will synchronise
/// the whole context instead of waiting for an event.
#[cold]
#[inline(never)]
fn report_ordering(
    ran: Ran<Result<(), HandleError>>,
    release: &Release,
    ptr: u64,
    recipe: &DeallocationRecipe,
) {
    let subject = || subject(release, "cuEventRecord", ptr, recipe);
    match ran {
        Ran::NotActivated(failure) => report(
            subject(),
            CleanupStep::ActivateContext,
            Consequence::OrderedByContextSynchronize,
            HandleError::Driver(failure.error()),
        ),
        Ran::Done { value, restore, .. } => {
            if let Err(error) = value {
                report(
                    subject(),
                    CleanupStep::Ordering,
                    Consequence::OrderedByContextSynchronize,
                    error,
                );
            }
            if restore != 0 {
                report_restore(subject(), Consequence::ContextNotRestored, restore);
            }
        }
    }
}

impl Drop for PtrBox {
    fn drop(&mut self) {
        if self.released || crate::lifecycle::exiting() {
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
        if allocation.ptr() == 0 {
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
