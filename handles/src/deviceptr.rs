//! [`DevicePtrHandle`]: an allocation (or an adopted or borrowed pointer) with its
//! [`DeallocationRecipe`] and a release family fixed at creation, and its constructors
//! (docs/decisions.md D1, D2, D3, D9); the one that lends a lender's block is `lender.rs`'s. The teardown that runs the recipe is `release/` (handles/DESIGN.md, "Release
//! families").

use std::any::Any;
use std::fmt;
use std::sync::Arc;

use cuda_sys::types::{c_void, CUdeviceptr, CUmemPoolPtrExportData, CUstream};
use cuda_sys::Driver;

use crate::allocation::{AdoptError, Deallocator, OwnedAllocation};
use crate::error::HandleError;
use crate::flags::MemAttachFlags;
use crate::pool::MemoryPoolHandle;
use crate::recipe::DeallocationRecipe;
use crate::release::{
    allocations_of_capture, checked, Family, GraphAllocation, Ipc, Kept, PoolRef, PtrBox, Release,
    ReleaseKind, StreamOrdered, Synchronous, UserDeallocator,
};
use crate::scope::run_in_from;
use crate::stream::StreamHandle;
use crate::sys::{check, current_context_raw, driver, error};

/// A device (or pinned host) pointer with its deallocation recipe and release family.
///
/// Cloning is one atomic increment and every clone shares the recipe: a
/// [`DevicePtrHandle::set_deallocation_stream`] on one is seen by all (a graph attachment
/// included). The last clone to go frees the memory with the recipe current at that moment, as
/// its family ([`ReleaseKind`] says what each does, and in which context: only where the driver
/// needs one, docs/decisions.md D2). A drop never blocks on the GPU (D9: a synchronous free goes
/// to the cleanup worker after an event) and reports a failed free through the cleanup-error
/// hook; an explicit [`DevicePtrHandle::release`] may block and returns the error.
#[derive(Clone)]
pub struct DevicePtrHandle(pub(crate) Arc<PtrBox>);

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

/// `allocation`, unless its address is null (then refused with `reason`, given back).
fn non_null(allocation: OwnedAllocation, reason: &str) -> Result<OwnedAllocation, AdoptError> {
    if allocation.ptr() == 0 {
        return Err(AdoptError {
            error: HandleError::invalid("ptr", reason),
            allocation,
        });
    }
    Ok(allocation)
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
        let release = Release::StreamOrdered(StreamOrdered {
            pool: Some(PoolRef::of(pool)),
        });
        let alloc = |d: &Driver, stream, ptr: &mut u64| {
            // SAFETY: `ptr` is a valid out-pointer; the pool and stream handles are alive and
            // the recipe's context is current.
            unsafe { (d.cuMemAllocFromPoolAsync)(ptr, size, pool_raw, stream) }
        };
        let placement = Placement::Pool(pool.device());
        let call = "cuMemAllocFromPoolAsync";
        Self::allocate(size, stream, placement, release, call, alloc)
    }

    /// Allocates `size` bytes from the current pool of the recipe context's device, ordered on
    /// `stream`.
    ///
    /// # Errors
    /// As [`DevicePtrHandle::alloc_from_pool`].
    ///
    /// Driver calls: `cuMemAllocAsync`; for a token also `cuCtxGetCurrent` and `cuCtxSetCurrent`
    /// (if needed); `cuMemFreeAsync` at release.
    pub fn alloc_async(size: usize, stream: &StreamHandle) -> Result<DevicePtrHandle, HandleError> {
        let release = Release::StreamOrdered(StreamOrdered { pool: None });
        Self::alloc_async_as(size, stream, release)
    }

    /// Allocates `size` bytes as a graph allocation ([`ReleaseKind::Graph`]): `cuMemAllocAsync`
    /// on `stream`, which is being captured by a capture begun through custody
    /// ([`crate::begin_capture`]). Its free follows the capture: a free node inside it, a free
    /// after the graph's first launch before that launch, an ordinary free after it, nothing for
    /// a capture that produced no graph (docs/decisions.md D11; handles/DESIGN.md, "Graph
    /// allocations"). On a stream that is not so captured (not at all, or by a capture begun
    /// by other code, whose end custody does not see) this is an ordinary allocation of the
    /// device's current pool ([`ReleaseKind::Async`]).
    ///
    /// # Errors
    /// As [`DevicePtrHandle::alloc_from_pool`].
    ///
    /// Driver calls: `cuStreamGetCaptureInfo_v2` (while a capture begun through custody runs),
    /// then as [`DevicePtrHandle::alloc_async`].
    pub fn alloc_graph(size: usize, stream: &StreamHandle) -> Result<DevicePtrHandle, HandleError> {
        let Some(allocations) = allocations_of_capture(stream)? else {
            // Not in a capture custody began: its end is not seen, and the memory is ordinary
            // stream-ordered memory as far as custody can tell.
            let release = Release::StreamOrdered(StreamOrdered { pool: None });
            return Self::alloc_async_as(size, stream, release);
        };
        let family = GraphAllocation::new(Arc::clone(&allocations));
        let handle = Self::alloc_async_as(size, stream, Release::Graph(family))?;
        allocations.allocated();
        Ok(handle)
    }

    fn alloc_async_as(
        size: usize,
        stream: &StreamHandle,
        release: Release,
    ) -> Result<DevicePtrHandle, HandleError> {
        let alloc = |d: &Driver, stream, ptr: &mut u64| {
            // SAFETY: `ptr` is a valid out-pointer; the stream is alive; context current.
            unsafe { (d.cuMemAllocAsync)(ptr, size, stream) }
        };
        let call = "cuMemAllocAsync";
        Self::allocate(size, stream, Placement::Context, release, call, alloc)
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
        let alloc = |d: &Driver, _, ptr: &mut u64| {
            // SAFETY: `ptr` is a valid out-pointer; the recipe's context is current.
            unsafe { (d.cuMemAlloc_v2)(ptr, size) }
        };
        let release = Release::Synchronous(Synchronous::DEVICE);
        let call = "cuMemAlloc_v2";
        Self::allocate(size, stream, Placement::Context, release, call, alloc)
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
        let alloc = |d: &Driver, _, ptr: &mut u64| {
            let mut host: *mut c_void = std::ptr::null_mut();
            // SAFETY: `host` is a valid out-pointer; the recipe's context is current.
            let status = unsafe { (d.cuMemAllocHost_v2)(&mut host, size) };
            *ptr = host as u64;
            status
        };
        let release = Release::Synchronous(Synchronous::PINNED_HOST);
        let call = "cuMemAllocHost_v2";
        Self::allocate(size, stream, Placement::Host, release, call, alloc)
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
        let alloc = |d: &Driver, _, ptr: &mut u64| {
            // SAFETY: `ptr` is a valid out-pointer; the recipe's context is current.
            unsafe { (d.cuMemAllocManaged)(ptr, size, flags.bits()) }
        };
        let release = Release::Synchronous(Synchronous::MANAGED);
        // Managed memory is not bound to the allocating context's device.
        let call = "cuMemAllocManaged";
        Self::allocate(size, stream, Placement::Host, release, call, alloc)
    }

    /// Imports a pointer another process exported from an IPC-shared pool that this process
    /// imported as `pool`: the IPC registry's mapping (`ipc.rs`, which checks `size`, the
    /// exporter's claim in bytes, against the mapping's extent); `stream` orders its free.
    ///
    /// # Errors
    /// As [`DevicePtrHandle::alloc_from_pool`], with the import's driver error.
    ///
    /// Driver calls: `cuCtxGetCurrent`, `cuCtxSetCurrent` (if needed),
    /// `cuMemPoolImportPointer`; `cuMemFreeAsync` at release.
    pub(crate) fn import_from_pool(
        pool: &MemoryPoolHandle,
        export_data: &CUmemPoolPtrExportData,
        size: usize,
        stream: &StreamHandle,
    ) -> Result<DevicePtrHandle, HandleError> {
        let pool_raw = pool.raw();
        let mut data = *export_data;
        let alloc = |d: &Driver, _, ptr: &mut u64| {
            // SAFETY: `ptr` is a valid out-pointer; `data` is a copy the driver may read;
            // the pool handle is alive and the recipe's context is current.
            unsafe { (d.cuMemPoolImportPointer)(ptr, pool_raw, &mut data) }
        };
        let release = Release::Ipc(Ipc::new(pool, None));
        let placement = Placement::Pool(pool.device());
        let call = "cuMemPoolImportPointer";
        Self::allocate(size, stream, placement, release, call, alloc)
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
        let release = Release::Deallocator(UserDeallocator::with_recipe(deallocator));
        Self::adopt_as(
            allocation,
            "a null pointer cannot be owned by a deallocator",
            release,
            None,
            stream,
        )
    }

    /// Takes `allocation`, made with `cuMemAlloc` ([`ReleaseKind::Synchronous`]),
    /// `cuMemAllocHost` ([`ReleaseKind::PinnedHost`]) or `cuMemAllocManaged`
    /// ([`ReleaseKind::Managed`]), into custody, to be released by that family with the recipe
    /// recorded now for `stream`: a drop records an event and frees on the cleanup worker, an
    /// explicit [`DevicePtrHandle::release`] synchronises and frees (docs/decisions.md D5, D9).
    /// `device` is the device the memory lives on, if known; recipes are then checked against
    /// it. The recipe is recorded and validated before ownership is taken.
    ///
    /// # Errors
    /// With the allocation given back in the [`AdoptError`]: [`HandleError::InvalidArgument`]
    /// for a null address or another `kind`; [`HandleError::WrongDevice`] for a stream whose
    /// context is on another device than `device`; [`HandleError::NoCurrentContext`] for an
    /// unbound token on a thread with no context.
    ///
    /// Driver calls: `cuCtxGetCurrent` (unbound tokens only); at release as
    /// [`DevicePtrHandle::alloc`].
    pub fn adopt_synchronous(
        allocation: OwnedAllocation,
        kind: ReleaseKind,
        device: Option<i32>,
        stream: &StreamHandle,
    ) -> Result<DevicePtrHandle, AdoptError> {
        let allocation = non_null(allocation, "a null pointer cannot be adopted")?;
        let Some(family) = Synchronous::of(kind) else {
            let error = HandleError::invalid(
                "kind",
                format!("{kind:?} is not a synchronous release rule"),
            );
            return Err(AdoptError { error, allocation });
        };
        let release = Release::Synchronous(family);
        Self::adopt_as(
            allocation,
            "a null pointer cannot be adopted",
            release,
            device,
            stream,
        )
    }

    /// Adoption with `release` and the recipe recorded now for `stream` (checked against
    /// `device`), the allocation given back on error.
    fn adopt_as(
        allocation: OwnedAllocation,
        null: &str,
        release: Release,
        device: Option<i32>,
        stream: &StreamHandle,
    ) -> Result<DevicePtrHandle, AdoptError> {
        let allocation = non_null(allocation, null)?;
        let recipe = match DeallocationRecipe::record_for(stream, device) {
            Ok(recipe) => recipe,
            Err(error) => return Err(AdoptError { error, allocation }),
        };
        let (ptr, size) = allocation.into_raw();
        Ok(Self::from_parts(ptr, size, device, Some(recipe), release))
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
        let allocation = non_null(
            allocation,
            "a null pointer cannot be owned by a deallocator",
        )?;
        let (ptr, size) = allocation.into_raw();
        let release = Release::Deallocator(UserDeallocator::host_only(deallocator));
        Ok(Self::from_parts(ptr, size, None, None, release))
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
        let release = Release::Ipc(Ipc::new(pool, Some(share)));
        Self::from_parts(ptr, size, pool.device(), Some(recipe), release)
    }

    /// Wraps `size` bytes at `ptr` that `owner` keeps alive: the owner is dropped with the last
    /// handle ([`ReleaseKind::Owner`]). No driver call. For [`crate::raw::with_owner`].
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
        let release = Release::Kept(Kept { owner: Some(owner) });
        Ok(Self::from_parts(ptr, size, None, None, release))
    }

    /// Zero bytes at address 0, owned by nobody ([`ReleaseKind::NonOwning`]): what an allocation
    /// of zero bytes gives. No byte can be reached through it (every range of it is empty) and
    /// nothing is freed. No driver call.
    pub fn empty() -> DevicePtrHandle {
        Self::borrowed(0, 0)
    }

    /// Wraps `size` bytes at `ptr` without owning them ([`ReleaseKind::NonOwning`]). No driver
    /// call. For [`crate::raw::borrowed`].
    pub(crate) fn borrowed(ptr: CUdeviceptr, size: usize) -> DevicePtrHandle {
        Self::from_parts(ptr, size, None, None, Release::Kept(Kept { owner: None }))
    }

    #[inline]
    pub(crate) fn from_parts(
        ptr: u64,
        size: usize,
        device: Option<i32>,
        recipe: Option<DeallocationRecipe>,
        release: Release,
    ) -> DevicePtrHandle {
        DevicePtrHandle(Arc::new(PtrBox::new(ptr, size, device, recipe, release)))
    }

    /// The allocation protocol shared by every allocating family: read the current context
    /// once, bind the recipe, validate, allocate in the recipe context, restore; undo (still in
    /// the context, the family's own free) if the restore fails. Hot path: raw statuses, errors
    /// built off the path.
    #[inline]
    fn allocate(
        size: usize,
        stream: &StreamHandle,
        placement: Placement,
        release: Release,
        alloc_call: &'static str,
        alloc: impl FnOnce(&'static Driver, CUstream, &mut u64) -> u32,
    ) -> Result<DevicePtrHandle, HandleError> {
        let d = driver()?;
        let stream_ordered = matches!(release, Release::StreamOrdered(_) | Release::Graph(_));
        // D2: a stream-ordered allocation on a created or wrapped stream needs no context
        // (docs/driver-probe/h200-580.159.04-alloc-context.txt), and such a stream brings its
        // recipe's context: no context call at all.
        let no_context = stream_ordered && stream.identifies_its_context();
        let current = if no_context {
            0
        } else {
            current_context_raw(d).map_err(|s| error("cuCtxGetCurrent", s))?
        };
        let recipe = DeallocationRecipe::bind_with_current(stream, current)?;
        let device = match placement {
            Placement::Pool(device) => device,
            Placement::Context => Some(recipe.context().device()),
            Placement::Host => None,
        };
        recipe.check_device(device)?;
        let mut ptr = 0u64;
        if no_context {
            check(alloc_call, alloc(d, stream.raw(), &mut ptr))?;
            return Ok(Self::from_parts(ptr, size, device, Some(recipe), release));
        }
        let (target, raw_stream) = (recipe.context_raw(), stream.raw());
        // The current context was just read (for the recipe): the switch reuses it.
        run_in_from(d, current, target, || alloc(d, raw_stream, &mut ptr))
            .map(checked(alloc_call))
            .into_result(alloc_call, target, |()| {
                // The recipe's context is still current (the restore failed): give the memory
                // back before failing.
                release.undo(d, ptr, raw_stream)
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

    /// The device the memory lives on, when known (`None` for pinned host and managed memory,
    /// which any device's streams may use, and for adopted or borrowed pointers).
    pub fn device(&self) -> Option<i32> {
        self.0.device
    }

    /// The pool the memory came from (pool allocations and IPC imports). An owned pool comes
    /// back as the handle the allocation holds; a borrowed pool as a new borrowed handle.
    pub fn pool(&self) -> Option<MemoryPoolHandle> {
        self.0.release.pool_handle()
    }

    /// A copy of the current recipe (two atomic increments); `None` for memory without one
    /// (owner-kept, borrowed, host-only).
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

    /// Replaces the recipe with one recorded now for `stream` (docs/decisions.md D4), as one
    /// atomic swap seen by every clone. Nothing is freed or synchronised: work already queued on
    /// the old stream must be ordered before the new one by the caller. On error the old recipe
    /// stays. For memory without a recipe this records nothing.
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
        drop(self.0.replace_recipe(stream)?);
        Ok(())
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
    /// for the recording thread's per-thread stream, docs/decisions.md D6). For memory without a
    /// recipe nothing is recorded.
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
        self.0.record_use(stream)
    }

    /// The streams recorded by [`DevicePtrHandle::record_use`], in the order they were first
    /// recorded (one clone each).
    pub fn use_streams(&self) -> Vec<StreamHandle> {
        let uses = self.0.uses.lock().unwrap_or_else(|e| e.into_inner());
        uses.iter().map(|u| u.stream().clone()).collect()
    }

    /// Releases this handle now. When it is the last one, frees the memory as its family says
    /// and returns the outcome instead of reporting it; the handle is gone either way. When
    /// other clones remain, nothing is freed and `Ok(())` is returned.
    ///
    /// Unlike a drop, this may block: a synchronous family waits for the recipe stream and
    /// frees before returning; an IPC import's waits for its recipe's context before the unmap
    /// and for the free's stream after it.
    ///
    /// # Errors
    /// The free's error ([`HandleError::Driver`], or the [`Deallocator`]'s): nothing was freed
    /// (for a deallocator that panicked, its [`DeallocatorPanic`](crate::DeallocatorPanic)
    /// source says whether it freed the memory first, or that this cannot be known);
    /// [`HandleError::ContextNotActivated`]: the recipe's context could not be made current, so
    /// the free did not run (the memory has leaked); [`HandleError::ContextNotRestored`]: the
    /// memory *was* freed, but the caller's context could not be put back.
    ///
    /// Driver calls: those of the family (see [`ReleaseKind`]), in the recipe's context where
    /// the family needs one (see [`DevicePtrHandle`]); for the synchronous families
    /// `cuStreamSynchronize` first; for an IPC import `cuCtxSynchronize` first (unless a capture
    /// begun through custody may run) and `cuStreamSynchronize` after.
    pub fn release(self) -> Result<(), HandleError> {
        PtrBox::release_last(self.0).0
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
