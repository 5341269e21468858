//! [`Buffer`] (memory with its deallocation recipe, an owned value closed by consuming it) and
//! [`ManagedBuffer`]; adoption of memory allocated elsewhere ([`Buffer::adopt`], taking an
//! `OwnedAllocation`) and buffers over handles ([`Buffer::from_parts`]: views, owner-kept
//! memory, a resource's own handles); and the [`MemoryResource`] trait, which makes buffers
//! and which a buffer keeps (the two name each other, so they live together). Copies and fills
//! are in `copy.rs`, the typed views in `slice.rs`.

use std::fmt;
use std::sync::{Arc, OnceLock};

use handles::sys_types::CUdeviceptr;
use handles::MemoryType;
use handles::{
    Deallocator, DevicePtrHandle, HandleError, OwnedAllocation, ReleaseKind, StreamHandle,
};

use crate::checks::{check_size, check_stream_device};
use crate::MemoryError;

/// Where memory can be used: what a [`MemoryResource`] says of the memory it allocates
/// ([`MemoryResource::accessibility`]), and what a [`Buffer`] reports, fixed when it is made
/// (from its memory resource) or read once from the driver's pointer attributes (adopted
/// views).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Accessibility {
    /// Whether a device can read and write the memory.
    pub device: bool,
    /// Whether the host can read and write the memory.
    pub host: bool,
    /// The device the memory lives on or belongs to; `None` for memory bound to no device
    /// (pinned host memory).
    pub device_id: Option<i32>,
    /// Whether the memory is managed (`cuMemAllocManaged`, a managed pool).
    pub managed: bool,
}

impl Accessibility {
    /// Device memory of device `ordinal`: only the device reaches it.
    pub const fn device(ordinal: i32) -> Accessibility {
        Accessibility {
            device: true,
            host: false,
            device_id: Some(ordinal),
            managed: false,
        }
    }

    /// Pinned host memory: the host and every device reach it; it belongs to no device.
    pub const PINNED: Accessibility = Accessibility {
        device: true,
        host: true,
        device_id: None,
        managed: false,
    };

    /// Managed memory, belonging to `device` (a preferred location) or to none.
    pub const fn managed(device: Option<i32>) -> Accessibility {
        Accessibility {
            device: true,
            host: true,
            device_id: device,
            managed: true,
        }
    }

    /// The device whose streams must order work on this memory: device-only memory's device;
    /// `None` for memory any device's stream may touch (host, pinned, managed).
    fn bound_device(self) -> Option<i32> {
        (self.device && !self.host && !self.managed)
            .then_some(self.device_id)
            .flatten()
    }
}

/// Where a buffer's memory can be used: known when the buffer is made from a memory resource
/// (the allocation hot path, which then sets no `OnceLock`: an atomic `Once` per buffer), or
/// read from the driver once, when first asked (views over memory of unknown origin).
enum AccessCell {
    Known(Accessibility),
    Lazy(OnceLock<Accessibility>),
}

impl AccessCell {
    #[inline]
    fn get(&self) -> Option<&Accessibility> {
        match self {
            AccessCell::Known(access) => Some(access),
            AccessCell::Lazy(cell) => cell.get(),
        }
    }
}

/// How a buffer takes part in IPC.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum IpcRole {
    None,
    /// Allocated from an IPC-enabled pool: [`Buffer::ipc_descriptor`] works.
    Exportable,
    /// Imported from another process ([`Buffer::from_ipc_descriptor`]).
    Imported,
}

impl IpcRole {
    /// The role of memory from a pool made with or without `ipc_enabled`.
    pub(crate) fn exportable_if(ipc_enabled: bool) -> IpcRole {
        if ipc_enabled {
            IpcRole::Exportable
        } else {
            IpcRole::None
        }
    }
}

/// A range of device, pinned host or managed memory, with the deallocation recipe that will
/// order and legalise its free (docs/decisions.md D1).
///
/// A buffer is an owned value, `Send + Sync`:
///
/// - [`Buffer::close`] consumes it and frees now (when it holds the last reference to the
///   memory), returning the free's error; the buffer is gone either way.
/// - Dropping it frees the same way but never waits on the GPU (docs/decisions.md D9) and
///   reports a failure through the cleanup-error hook (`handles::set_cleanup_error_hook`).
/// - [`Buffer::set_deallocation_stream`] hands the free over to another stream: the recipe is
///   replaced atomically, seen by every other holder of the memory (a graph, a clone of the
///   [`DevicePtrHandle`]), and nothing is freed or synchronised.
/// - [`Buffer::as_slice`] and [`Buffer::as_slice_mut`] borrow it as typed views over
///   element ranges ([`DeviceSlice`](crate::DeviceSlice),
///   [`DeviceSliceMut`](crate::DeviceSliceMut)).
///
/// Copies and fills on the buffer itself take `&self`, as a queue writes to a shared GPU
/// buffer in wgpu: the work runs on the GPU in stream order, not through Rust references, and
/// the memory may be shared with graphs that write it when they run. The typed views add the
/// borrow checker's exclusivity for Rust code that wants it, among the views of this one
/// buffer value (not of the memory: see [`DeviceSliceMut`](crate::DeviceSliceMut)). Work on
/// other streams than the
/// deallocation stream is ordered before the free once declared with [`Buffer::record_use`]
/// (or the caller hands the free over to the stream that used the memory last).
///
/// Closing twice, or using a closed buffer, does not compile:
///
/// ```compile_fail
/// # fn demo(buffer: memory::Buffer) -> Result<(), memory::MemoryError> {
/// buffer.close()?;
/// let _ = buffer.size(); // error[E0382]: borrow of moved value: `buffer`
/// # Ok(())
/// # }
/// ```
pub struct Buffer {
    handle: DevicePtrHandle,
    mr: Option<Arc<dyn MemoryResource>>,
    access: AccessCell,
    ipc: IpcRole,
}

impl Buffer {
    /// A buffer for memory a resource just allocated (or imported).
    #[inline]
    pub(crate) fn new(
        handle: DevicePtrHandle,
        mr: Option<Arc<dyn MemoryResource>>,
        access: Option<Accessibility>,
        ipc: IpcRole,
    ) -> Buffer {
        let access = match access {
            Some(access) => AccessCell::Known(access),
            None => AccessCell::Lazy(OnceLock::new()),
        };
        Buffer {
            handle,
            mr,
            access,
            ipc,
        }
    }

    /// What every built-in resource's `allocate_owned` does around its own allocation: zero
    /// bytes give an empty buffer of `mr` (no driver call), other sizes are checked first
    /// ([`MemoryError::InvalidSize`]), then `alloc` makes the handle (and says how the memory
    /// takes part in IPC) and the buffer keeps `mr` and reports its accessibility.
    #[inline]
    pub(crate) fn allocated<R: MemoryResource>(
        mr: Arc<R>,
        size: usize,
        alloc: impl FnOnce(&R) -> Result<(DevicePtrHandle, IpcRole), MemoryError>,
    ) -> Result<Buffer, MemoryError> {
        if size == 0 {
            return Ok(Buffer::empty(mr));
        }
        check_size(size)?;
        let (handle, ipc) = alloc(&mr)?;
        let access = mr.accessibility();
        Ok(Buffer::new(handle, Some(mr), Some(access), ipc))
    }

    /// The memory's handle, for a caching resource to keep as a block
    /// (`resources/caching.rs`); the buffer back when its memory cannot be cached: a graph
    /// allocation (its free follows its graph) or an IPC import.
    pub(crate) fn into_block(self) -> Result<DevicePtrHandle, Buffer> {
        if self.handle.kind() == ReleaseKind::Graph || self.ipc == IpcRole::Imported {
            return Err(self);
        }
        let Buffer { handle, mr, .. } = self;
        // The resource's last reference may go here: its memory is kept alive by the handle
        // (an owned pool is embedded in it, a deallocator holds its resource).
        drop(mr);
        Ok(handle)
    }

    /// A buffer over memory `handle` already owns (or borrows), for a memory resource of the
    /// caller's: its `allocate` makes the handle (any release rule) and returns
    /// `Buffer::from_parts(handle, Some(self))`. Where the memory can be used comes from `mr`
    /// when given, else from the driver's pointer attributes, read once when first asked.
    ///
    /// Two buffers made from clones of one handle are two owners of the same memory: each lends
    /// its own [`DeviceSliceMut`](crate::DeviceSliceMut)s, so both can write the same bytes (the
    /// exclusivity of the typed views is per buffer value; see there).
    ///
    /// Driver calls: none.
    pub fn from_parts(handle: DevicePtrHandle, mr: Option<Arc<dyn MemoryResource>>) -> Buffer {
        let access = mr.as_deref().map(MemoryResource::accessibility);
        Buffer::new(handle, mr, access, IpcRole::None)
    }

    /// The empty buffer an allocation of zero bytes gives (docs/decisions.md D13): address 0,
    /// size 0, no memory behind it, `mr` its resource (whose accessibility it reports); closing
    /// it frees nothing. No driver call.
    pub fn empty(mr: Arc<dyn MemoryResource>) -> Buffer {
        Buffer::from_parts(DevicePtrHandle::empty(), Some(mr))
    }

    /// Takes `allocation`, memory allocated elsewhere, into a buffer that owns it: `mr` frees
    /// it at teardown (its `deallocate` with the recorded stream, or the resource's own release
    /// rule; see [`MemoryResource::adopt`]) (docs/decisions.md D5). `stream` orders the free
    /// (`None`: the legacy default stream, bound to the context current now; prefer a created
    /// stream if the buffer may be freed on another thread).
    ///
    /// The [`OwnedAllocation`] is the right to free the memory: safe code cannot make one for
    /// an address it does not own (`handles::raw::owned_allocation` is `unsafe`). Memory the
    /// buffer is not to free (a view, or memory an owner object keeps alive) is a handle from
    /// `handles::raw::borrowed` / `handles::raw::with_owner`, given to [`Buffer::from_parts`].
    ///
    /// The recipe is recorded and checked *before* ownership is taken, so on any error the
    /// allocation comes back in the [`AdoptError`] and `deallocate` has not been called.
    ///
    /// # Errors
    /// - [`MemoryError::InvalidSize`]: zero bytes or more than `isize::MAX`.
    /// - [`HandleError::WrongDevice`](handles::HandleError::WrongDevice): a stream of another device than the resource's.
    /// - [`MemoryError::Handle`]: a null address ([`handles::HandleError::InvalidArgument`]);
    ///   [`handles::HandleError::NoCurrentContext`] for a default-stream token (or `None`) on a
    ///   thread with no current context.
    ///
    /// Driver calls: `cuCtxGetCurrent` for a default-stream token.
    pub fn adopt(
        allocation: OwnedAllocation,
        mr: Arc<dyn MemoryResource>,
        stream: Option<&StreamHandle>,
    ) -> Result<Buffer, AdoptError> {
        let access = mr.accessibility();
        Buffer::adopt_as(allocation, mr, stream, access)
    }

    fn adopt_as(
        allocation: OwnedAllocation,
        mr: Arc<dyn MemoryResource>,
        stream: Option<&StreamHandle>,
        access: Accessibility,
    ) -> Result<Buffer, AdoptError> {
        if let Err(error) = check_size(allocation.size()) {
            return Err(AdoptError { error, allocation });
        }
        let legacy;
        let stream = match stream {
            Some(stream) => stream,
            None => {
                legacy = StreamHandle::legacy();
                &legacy
            }
        };
        let handle = Arc::clone(&mr).adopt(allocation, stream)?;
        Ok(Buffer::new(handle, Some(mr), Some(access), IpcRole::None))
    }

    /// The address (a host address for pinned host memory).
    #[inline]
    pub fn ptr(&self) -> CUdeviceptr {
        self.handle.ptr()
    }

    /// The size in bytes.
    #[inline]
    pub fn size(&self) -> usize {
        self.handle.size()
    }

    /// The resource the memory came from (or that frees it); `None` for views.
    pub fn memory_resource(&self) -> Option<&Arc<dyn MemoryResource>> {
        self.mr.as_ref()
    }

    /// The memory's handle. A clone is a new reference (for a graph attachment, say): it keeps
    /// the memory alive after the buffer is closed and sees every change of recipe; a buffer
    /// made from it ([`Buffer::from_parts`]) can write the memory while this buffer lends a
    /// [`DeviceSliceMut`](crate::DeviceSliceMut).
    pub fn handle(&self) -> &DevicePtrHandle {
        &self.handle
    }

    /// The stream the free is recorded on now; `None` for views, which free nothing.
    pub fn deallocation_stream(&self) -> Option<StreamHandle> {
        self.handle.deallocation_stream()
    }

    /// Whether the memory was imported from another process.
    pub fn is_mapped(&self) -> bool {
        self.ipc == IpcRole::Imported
    }

    pub(crate) fn ipc_role(&self) -> IpcRole {
        self.ipc
    }

    /// Records the free on `stream` from now on (docs/decisions.md D4): the whole recipe
    /// (stream, context, per-thread-default-stream thread) is replaced in one atomic step that
    /// every holder of the memory sees. Nothing is freed or synchronised: work queued on the old
    /// stream must be ordered before the new one by the caller. On error the old recipe
    /// stays. For views, which free nothing, nothing is recorded.
    ///
    /// `&self`, not `&mut self`: the recipe is shared by every holder of the memory (a graph's
    /// retention, a clone of the handle), and each sees the new one.
    ///
    /// # Errors
    /// - [`HandleError::WrongDevice`](handles::HandleError::WrongDevice): a stream of another device than the memory's.
    /// - [`MemoryError::Handle`] with [`handles::HandleError::NoCurrentContext`]: a
    ///   default-stream token on a thread with no current context.
    /// - [`MemoryError::Handle`] with [`handles::HandleError::ContextDestroyed`]: a stream whose
    ///   context, one custody does not hold (made by other code), was destroyed by its owner.
    ///
    /// Driver calls: `cuCtxGetCurrent` (default-stream tokens only); `cuCtxGetId` (a stream in a
    /// context custody does not hold).
    pub fn set_deallocation_stream(&self, stream: &StreamHandle) -> Result<(), MemoryError> {
        // The old recipe may hold the last handle of a stream: released after the swap.
        drop(self.replace_recipe(stream)?);
        Ok(())
    }

    /// The recipe swap of [`set_deallocation_stream`](Self::set_deallocation_stream), handing
    /// back the replaced recipe (for `memory::binding::replace_deallocation_stream` too).
    pub(crate) fn replace_recipe(
        &self,
        stream: &StreamHandle,
    ) -> Result<Option<handles::DeallocationRecipe>, MemoryError> {
        let handle_device = self.handle.device();
        if handle_device.is_none() {
            // Adopted memory: the handle does not know its device, the resource does.
            if let Some(device) = self.access.get().and_then(|a| a.bound_device()) {
                check_stream_device(stream, device)?;
            }
        }
        handles::binding::replace_deallocation_stream(&self.handle, stream)
            .map_err(MemoryError::Handle)
    }

    /// Declares that work on `stream` uses this buffer (PyTorch's `record_stream` is the
    /// analogue): when the memory is freed, on whichever thread and by whichever holder, the
    /// free's stream first waits for an event recorded on `stream` at that moment
    /// (`cuStreamWaitEvent`), so the free is ordered after everything enqueued on `stream`
    /// before it, uses made after this call included (docs/decisions.md D12). Nothing is
    /// recorded, synchronised or polled now or later; a drop stays non-blocking. Every memory
    /// kind, deferred cleanup (a graph's release) and [`Buffer::set_deallocation_stream`] (the
    /// uses carry over) take part; recording a stream twice, or the deallocation stream itself,
    /// orders nothing more. The buffer keeps `stream` alive until the free. A default-stream
    /// token is bound to the current context (the per-thread default stream also to the calling
    /// thread, docs/decisions.md D6). For views and owner-kept memory, which free nothing,
    /// nothing is recorded.
    ///
    /// # Errors
    /// On error nothing is recorded:
    /// - [`HandleError::WrongDevice`](handles::HandleError::WrongDevice): a stream of another device than the memory's (for memory
    ///   of one device; pinned and managed memory accept any device's stream).
    /// - [`MemoryError::Handle`] with [`handles::HandleError::NoCurrentContext`]: a
    ///   default-stream token on a thread with no current context.
    ///
    /// Driver calls: `cuCtxGetCurrent` (default-stream tokens only); at the free, per recorded
    /// stream, `cuStreamGetCaptureInfo_v2`, `cuEventCreate`, `cuEventRecord`,
    /// `cuStreamWaitEvent`, `cuEventDestroy_v2` (`handles::DevicePtrHandle::record_use`).
    pub fn record_use(&self, stream: &StreamHandle) -> Result<(), MemoryError> {
        if self.handle.device().is_none() {
            // Adopted memory: the handle does not know its device, the resource does.
            if let Some(device) = self.access.get().and_then(|a| a.bound_device()) {
                check_stream_device(stream, device)?;
            }
        }
        self.handle.record_use(stream).map_err(MemoryError::Handle)
    }

    /// The streams recorded with [`Buffer::record_use`], first recorded first.
    pub fn use_streams(&self) -> Vec<StreamHandle> {
        self.handle.use_streams()
    }

    /// Closes the buffer: when it holds the last reference to the memory, frees it now with
    /// the recorded recipe and returns the outcome; when others hold it (a graph, a clone of
    /// the handle), the last of them frees it. The buffer is consumed either way.
    ///
    /// `close(stream)` of cuda.core is [`set_deallocation_stream`](Self::set_deallocation_stream)
    /// then `close()` (docs/decisions.md D4); in Rust the two calls say it, and a failed
    /// hand-over leaves the buffer open with its old recipe.
    ///
    /// May block: memory whose free is synchronous in the driver (`cuMemAlloc`, pinned host,
    /// managed) waits for the deallocation stream before the free. Stream-ordered frees do not
    /// block, except an imported buffer's ([`Buffer::is_mapped`]) when this close is the last
    /// release of its memory (the handle decides, in the same step as the release): it first
    /// waits for all work queued in the recipe's context (every stream of it), so that work a
    /// caller queued on another stream than the deallocation stream, and did not declare
    /// ([`Buffer::record_use`]), has run before the mapping can go, and after the unmap waits
    /// for the deallocation stream, so that when `close` returns the unmap has run (the
    /// exporting process may free then). An unordered use of an imported mapping after its
    /// unmap is a device fault that ends the context (`CUDA_ERROR_ILLEGAL_ADDRESS`;
    /// `docs/cuda-core-compat.md`, "The H200-only failures"), where a pool free only hands the
    /// bytes back. While a capture begun through custody may be running, the first wait is left
    /// out (docs/decisions.md D11 says why that is enough).
    ///
    /// # Errors
    /// The free's failure ([`MemoryError::Handle`]): a driver error, or the memory resource's
    /// `deallocate` error for adopted memory; for an import, a wait's failure when the free
    /// succeeded. The buffer is closed either way.
    ///
    /// Driver calls: as the memory's release rule (`cuMemFreeAsync`; `cuStreamSynchronize` and
    /// `cuMemFree` / `cuMemFreeHost`; a resource's `deallocate`), in the recipe's context
    /// (`cuCtxGetCurrent`, `cuCtxSetCurrent` if needed); for an import released last also
    /// `cuThreadExchangeStreamCaptureMode` and `cuCtxSynchronize` before, `cuStreamSynchronize`
    /// after.
    pub fn close(self) -> Result<(), MemoryError> {
        self.close_keeping(false).0
    }

    /// The one close (of [`close`](Self::close) and `memory::binding::close_with_remains`): the
    /// handle's release, the recipe's remains dropped here unless `keep_remains`, then the
    /// resource (a pool outlives its allocations).
    pub(crate) fn close_keeping(
        self,
        keep_remains: bool,
    ) -> (Result<(), MemoryError>, Option<handles::RecipeRemains>) {
        let Buffer { handle, mr, .. } = self;
        let (result, remains) = handles::binding::release_with_remains(handle);
        let remains = if keep_remains {
            remains
        } else {
            drop(remains);
            None
        };
        drop(mr);
        (result.map_err(MemoryError::from), remains)
    }

    /// How the memory can be used: from the memory resource, else (once) from the driver.
    fn access(&self, ptr: CUdeviceptr) -> Result<Accessibility, MemoryError> {
        if let Some(access) = self.access.get() {
            return Ok(*access);
        }
        let access = match handles::pointer_attributes(ptr)? {
            // Unknown to the driver: ordinary (pageable) host memory.
            None => Accessibility {
                device: false,
                host: true,
                device_id: None,
                managed: false,
            },
            Some(attributes) if attributes.is_managed => Accessibility::managed(
                (attributes.device_ordinal >= 0).then_some(attributes.device_ordinal),
            ),
            Some(attributes) if attributes.memory_type == MemoryType::Host => Accessibility::PINNED,
            Some(attributes) => Accessibility {
                device: true,
                host: false,
                device_id: (attributes.device_ordinal >= 0).then_some(attributes.device_ordinal),
                managed: false,
            },
        };
        match &self.access {
            AccessCell::Known(known) => Ok(*known),
            AccessCell::Lazy(cell) => Ok(*cell.get_or_init(|| access)),
        }
    }

    /// Whether a device can access the memory.
    ///
    /// # Errors
    /// [`MemoryError::Handle`] when the pointer-attribute query of a view fails.
    ///
    /// Driver calls: `cuPointerGetAttributes`, for views, once.
    pub fn is_device_accessible(&self) -> Result<bool, MemoryError> {
        Ok(self.access(self.ptr())?.device)
    }

    /// Whether the host can access the memory.
    ///
    /// # Errors
    /// As [`Buffer::is_device_accessible`].
    ///
    /// Driver calls: as [`Buffer::is_device_accessible`].
    pub fn is_host_accessible(&self) -> Result<bool, MemoryError> {
        Ok(self.access(self.ptr())?.host)
    }

    /// Whether the memory is managed.
    ///
    /// # Errors
    /// As [`Buffer::is_device_accessible`].
    ///
    /// Driver calls: as [`Buffer::is_device_accessible`].
    pub fn is_managed(&self) -> Result<bool, MemoryError> {
        Ok(self.access(self.ptr())?.managed)
    }

    /// The device the memory lives on or belongs to; `None` for memory bound to no device
    /// (pinned or pageable host memory).
    ///
    /// # Errors
    /// As [`Buffer::is_device_accessible`].
    ///
    /// Driver calls: as [`Buffer::is_device_accessible`].
    pub fn device_id(&self) -> Result<Option<i32>, MemoryError> {
        Ok(self.access(self.ptr())?.device_id)
    }

    /// The device whose streams may order work on this memory (`None`: any).
    pub(crate) fn ops_device(&self) -> Result<Option<i32>, MemoryError> {
        let access = self.access(self.ptr())?;
        if access.host || access.managed {
            return Ok(None);
        }
        Ok(self.handle.device().or(access.device_id))
    }
}

impl fmt::Debug for Buffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Buffer(0x{:x}, {} bytes", self.ptr(), self.size())?;
        if self.ipc == IpcRole::Imported {
            f.write_str(", mapped")?;
        }
        f.write_str(")")
    }
}

/// A [`Buffer`] of managed memory (`cuMemAllocManaged`): accessible from the host and every
/// device. [`ManagedBuffer::as_buffer`] (or `AsRef`) lends the buffer, [`ManagedBuffer::into_buffer`]
/// (or `From`) gives it up.
pub struct ManagedBuffer(Buffer);

impl ManagedBuffer {
    pub(crate) fn new(buffer: Buffer) -> ManagedBuffer {
        ManagedBuffer(buffer)
    }

    /// A managed buffer over memory `handle` names, as [`Buffer::from_parts`]; the buffer
    /// reports itself managed, host- and device-accessible without asking the driver (the
    /// handle's maker vouched that the memory is managed). As there, another buffer over a clone
    /// of the handle lends mutable views of the same memory.
    ///
    /// Driver calls: none.
    pub fn from_parts(
        handle: DevicePtrHandle,
        mr: Option<Arc<dyn MemoryResource>>,
    ) -> ManagedBuffer {
        let access = Accessibility::managed(mr.as_deref().and_then(|mr| mr.device_id()));
        ManagedBuffer(Buffer::new(handle, mr, Some(access), IpcRole::None))
    }

    /// Takes managed memory allocated elsewhere into a buffer that owns it, as
    /// [`Buffer::adopt`]; the buffer reports itself managed without asking the driver. A
    /// [`crate::ManagedMemoryResource`] as `mr` releases it like memory it allocated (without
    /// blocking a drop).
    ///
    /// # Errors
    /// As [`Buffer::adopt`].
    ///
    /// Driver calls: as [`Buffer::adopt`].
    pub fn adopt(
        allocation: OwnedAllocation,
        mr: Arc<dyn MemoryResource>,
        stream: Option<&StreamHandle>,
    ) -> Result<ManagedBuffer, AdoptError> {
        let access = Accessibility::managed(mr.device_id());
        Buffer::adopt_as(allocation, mr, stream, access).map(ManagedBuffer)
    }

    /// The buffer.
    pub fn as_buffer(&self) -> &Buffer {
        &self.0
    }

    /// The buffer, borrowed exclusively (for its typed mutable views).
    pub fn as_buffer_mut(&mut self) -> &mut Buffer {
        &mut self.0
    }

    /// The plain buffer.
    pub fn into_buffer(self) -> Buffer {
        self.0
    }

    /// Closes the buffer ([`Buffer::close`]).
    ///
    /// # Errors
    /// As [`Buffer::close`].
    ///
    /// Driver calls: as [`Buffer::close`].
    pub fn close(self) -> Result<(), MemoryError> {
        self.0.close()
    }
}

impl AsRef<Buffer> for ManagedBuffer {
    fn as_ref(&self) -> &Buffer {
        &self.0
    }
}

impl From<ManagedBuffer> for Buffer {
    fn from(managed: ManagedBuffer) -> Buffer {
        managed.0
    }
}

impl fmt::Debug for ManagedBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Managed{:?}", self.0)
    }
}

/// The release rule matching a synchronous resource's memory, for [`MemoryResource::adopt`].
pub(crate) fn adopt_synchronous(
    allocation: OwnedAllocation,
    kind: ReleaseKind,
    device: Option<i32>,
    stream: &StreamHandle,
) -> Result<DevicePtrHandle, AdoptError> {
    DevicePtrHandle::adopt_synchronous(allocation, kind, device, stream).map_err(AdoptError::from)
}

/// Something that hands out memory and takes it back: a device or pinned pool, pinned host
/// memory, managed memory, `cuMemAlloc`, graph memory, or an implementation of the caller's
/// (a Python subclass, through the bindings).
///
/// The trait is object-safe; buffers hold their resource as `Arc<dyn MemoryResource>`.
/// Implementations must be `Send + Sync`: [`MemoryResource::deallocate`] of adopted memory runs
/// wherever the buffer's last reference goes (any user thread, the cleanup worker), with the
/// deallocation recipe's context current (docs/decisions.md D2).
///
/// Allocating keeps the resource in the buffer, so a resource is held by `Arc` (every built-in
/// resource's constructor returns one): call `mr.allocate(size, &stream)` on the `Arc` (one
/// atomic increment, the reference the buffer holds). An implementation writes
/// [`MemoryResource::allocate_owned`], which takes that reference; through an
/// `Arc<dyn MemoryResource>` (where `allocate`, bound to sized resources, is not callable) call
/// `Arc::clone(&mr).allocate_owned(size, &stream)`.
pub trait MemoryResource: Send + Sync + 'static {
    /// Allocates `size` bytes ordered on `stream`, which also becomes the buffer's
    /// deallocation stream (the free will be ordered on it, in its context, unless
    /// [`Buffer::set_deallocation_stream`] replaces it), keeping the resource (`self`, the
    /// buffer's reference to it). What an implementation writes; callers holding the `Arc` use
    /// [`MemoryResource::allocate`]. Zero bytes give an empty buffer ([`Buffer::empty`]: address
    /// 0, no memory, no driver call), as in Python (docs/decisions.md D13).
    ///
    /// # Errors
    /// [`MemoryError::InvalidSize`] for more than `isize::MAX` bytes;
    /// [`HandleError::WrongDevice`](handles::HandleError::WrongDevice) for a stream of another device; others as each resource
    /// documents. Nothing is allocated on error. A stream-ordered allocation on a stream that is
    /// not being captured, made beside a global capture (any thread) or a thread-local capture
    /// of the calling thread, in the thread's default interaction mode, fails with the driver's
    /// `CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED` and invalidates that capture
    /// (docs/driver-facts.md F27): custody relaxes its frees, not its allocations.
    fn allocate_owned(
        self: Arc<Self>,
        size: usize,
        stream: &StreamHandle,
    ) -> Result<Buffer, MemoryError>;

    /// [`MemoryResource::allocate_owned`] without giving up the caller's `Arc`:
    /// `mr.allocate(size, &stream)`. Zero bytes give an empty buffer of this resource, whatever
    /// the implementation does with them (no driver call).
    ///
    /// # Errors
    /// As [`MemoryResource::allocate_owned`].
    ///
    /// Driver calls: the resource's (none for zero bytes).
    fn allocate(self: &Arc<Self>, size: usize, stream: &StreamHandle) -> Result<Buffer, MemoryError>
    where
        Self: Sized,
    {
        if size == 0 {
            return Ok(Buffer::empty(Arc::clone(self) as Arc<dyn MemoryResource>));
        }
        Arc::clone(self).allocate_owned(size, stream)
    }

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
    ///
    /// # Panics
    /// At teardown a panic is caught, as a [`Deallocator`]'s is: the report (or
    /// [`Buffer::close`]'s error, whose source is a `handles::DeallocatorPanic`) says whether
    /// the memory was freed first (one of the [`OwnedAllocation`]'s frees succeeded), not freed,
    /// or that this cannot be known (the address was taken with [`OwnedAllocation::into_raw`]).
    fn deallocate(
        &self,
        allocation: OwnedAllocation,
        stream: &StreamHandle,
    ) -> Result<(), MemoryError>;

    /// Where the memory this resource allocates (or adopts) can be used. The four questions
    /// below answer from it; an implementation states it here, once.
    fn accessibility(&self) -> Accessibility;

    /// Whether a device can read and write the memory (from [`MemoryResource::accessibility`]).
    fn is_device_accessible(&self) -> bool {
        self.accessibility().device
    }

    /// Whether the host can read and write the memory (from [`MemoryResource::accessibility`]).
    fn is_host_accessible(&self) -> bool {
        self.accessibility().host
    }

    /// The device the memory lives on or belongs to; `None` for memory bound to no device
    /// (pinned host memory). From [`MemoryResource::accessibility`].
    fn device_id(&self) -> Option<i32> {
        self.accessibility().device_id
    }

    /// Whether the memory is managed (from [`MemoryResource::accessibility`]).
    fn is_managed(&self) -> bool {
        self.accessibility().managed
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
    /// [`HandleError::WrongDevice`](handles::HandleError::WrongDevice) for a stream of another device than the resource's
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

/// Any resource behind `dyn`: its name, its device and where its memory can be used, so that
/// a struct holding an `Arc<dyn MemoryResource>` can derive `Debug`. No driver call.
impl fmt::Debug for dyn MemoryResource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct(self.name())
            .field("device_id", &self.device_id())
            .field("device_accessible", &self.is_device_accessible())
            .field("host_accessible", &self.is_host_accessible())
            .field("managed", &self.is_managed())
            .finish()
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
            error: MemoryError::Handle(error),
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
