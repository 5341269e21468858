//! Stream-ordered pool resources: [`DeviceMemoryResource`] (device memory),
//! [`PinnedMemoryResource`] (pinned host memory) and [`ManagedPoolMemoryResource`] (managed
//! memory, CUDA 13 drivers), and [`PoolMemoryResource`], what they offer for IPC.

use std::os::fd::{BorrowedFd, OwnedFd};
use std::sync::Arc;

use handles::{CaptureStatus, ManagedPoolLocation, PoolLocation, PoolSpec};

use handles::{DevicePtrHandle, MemoryPoolHandle, StreamHandle};

use crate::buffer::{Accessibility, IpcRole};
use crate::checks::check_bound_stream_device;
use crate::{IpcError, MemoryError, MemoryResource};

/// What the three pool resources share: the pool, where its memory can be used, and how it
/// takes part in IPC. Each resource is a `core` and what only it has (a managed pool's
/// preferred location); [`pool_resource!`] writes their trait impls from the core.
#[derive(Debug)]
struct PoolCore {
    pool: MemoryPoolHandle,
    access: Accessibility,
    /// How the pool takes part in IPC: not at all, shareable ([`IpcRole::Exportable`]), or
    /// imported from another process ([`IpcRole::Imported`]: pointers come in by IPC, nothing is
    /// allocated here).
    ipc: IpcRole,
}

impl PoolCore {
    fn new(pool: MemoryPoolHandle, access: Accessibility, ipc: IpcRole) -> PoolCore {
        PoolCore { pool, access, ipc }
    }

    /// The allocation hot path, after `Buffer::allocated`'s size checks: checks that cost no
    /// driver call, then [`DevicePtrHandle::alloc_from_pool`] (`cuCtxGetCurrent` +
    /// `cuMemAllocFromPoolAsync`).
    #[inline]
    fn allocate(
        &self,
        size: usize,
        stream: &StreamHandle,
    ) -> Result<(DevicePtrHandle, IpcRole), MemoryError> {
        if self.ipc == IpcRole::Imported {
            return Err(IpcError::ImportedPoolAllocates.into());
        }
        let device = self.pool.device();
        if let Some(device) = device {
            check_bound_stream_device(stream, device)?;
        }
        // One relaxed load unless a capture begun through custody is running.
        if handles::capture_may_be_active()
            && handles::capture_status(stream)? != CaptureStatus::None
        {
            return Err(MemoryError::StreamCapturing);
        }
        let handle = DevicePtrHandle::alloc_from_pool(size, &self.pool, stream)?;
        Ok((handle, self.ipc))
    }
}

/// The [`MemoryResource`] and [`PoolMemoryResource`] impls of a pool resource (a struct whose
/// `core` is its [`PoolCore`]), written once: the three differ only in their core.
macro_rules! pool_resource {
    ($ty:ty) => {
        builtin_resource! {
            $ty,
            /// Allocates `size` bytes from the pool, ordered on `stream` (of the pool's device
            /// for a device pool, of any device otherwise).
            ///
            /// # Errors
            /// [`MemoryError::InvalidSize`]; [`MemoryError::Ipc`] for an imported pool;
            /// [`HandleError::WrongDevice`](handles::HandleError::WrongDevice) for a
            /// stream of another device than a device pool's; [`MemoryError::StreamCapturing`];
            /// [`MemoryError::Handle`]: no current context for a default-stream token, the
            /// driver's failure (out of memory, past `max_size`).
            ///
            /// Driver calls: `cuCtxGetCurrent`, `cuCtxSetCurrent` (only if the stream's context
            /// is not current), `cuMemAllocFromPoolAsync`; `cuStreamIsCapturing` only while a
            /// custody capture runs.
            allocate(mr, size, stream) {
                mr.core.allocate(size, stream)
            }
            /// `cuMemFreeAsync(ptr, stream)`. Does not block.
            ///
            /// # Errors
            /// [`MemoryError::Handle`] for the driver's failure (never treated as success, even
            /// `CUDA_ERROR_INVALID_CONTEXT`).
            deallocate: free_async,
            accessibility(self) {
                self.core.access
            }
        }

        impl PoolMemoryResource for $ty {
            fn pool(&self) -> &MemoryPoolHandle {
                &self.core.pool
            }

            fn is_ipc_enabled(&self) -> bool {
                self.core.ipc != IpcRole::None
            }

            fn is_mapped(&self) -> bool {
                self.core.ipc == IpcRole::Imported
            }
        }
    };
}

/// What a pool resource offers for IPC ([`crate::Buffer::ipc_descriptor`],
/// [`crate::Buffer::from_ipc_descriptor`]).
pub trait PoolMemoryResource: MemoryResource {
    /// The memory pool.
    fn pool(&self) -> &MemoryPoolHandle;

    /// Whether the pool was made shareable with other processes.
    fn is_ipc_enabled(&self) -> bool;

    /// Whether the pool was imported from another process (then it only imports pointers).
    fn is_mapped(&self) -> bool;

    /// Exports the pool as a new POSIX file descriptor, owned by the caller, for another
    /// process to open with the resource's `import_pool`. Pass it over a unix socket with
    /// `SCM_RIGHTS` (the `sendfd` or `nix` crates, Python's `socket.send_fds`), or to a child
    /// process that inherits it.
    ///
    /// # Errors
    /// [`MemoryError::Ipc`] when the pool was not made with `ipc_enabled`, or was itself
    /// imported; [`MemoryError::Handle`] for the driver's failure.
    ///
    /// Driver calls: `cuMemPoolExportToShareableHandle`.
    fn export_pool(&self) -> Result<OwnedFd, MemoryError> {
        if !self.is_ipc_enabled() {
            return Err(IpcError::PoolNotIpcEnabled.into());
        }
        if self.is_mapped() {
            return Err(IpcError::PoolImported.into());
        }
        Ok(handles::export_pool(self.pool())?)
    }
}

/// Options for [`DeviceMemoryResource::with_options`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DeviceMemoryResourceOptions {
    /// The most the pool may hold, in bytes; 0 for no limit.
    pub max_size: usize,
    /// Whether the pool can be shared with other processes (POSIX file descriptor).
    pub ipc_enabled: bool,
}

/// Device memory from a stream-ordered memory pool: the device's current pool
/// ([`DeviceMemoryResource::new`]) or a pool of its own ([`DeviceMemoryResource::with_options`]).
///
/// Allocation is `cuMemAllocFromPoolAsync` on the given stream, in the stream's context; the
/// free is `cuMemFreeAsync` on the deallocation stream. An owned pool is destroyed once the
/// resource and every buffer from it are gone. Allocating on a stream that is capturing is
/// refused ([`MemoryError::StreamCapturing`]; use a [`crate::GraphMemoryResource`]) when the
/// capture was begun through custody (`handles::begin_capture`); a capture begun by other
/// code is not detected and the allocation becomes a graph allocation.
#[derive(Debug)]
pub struct DeviceMemoryResource {
    core: PoolCore,
}

pool_resource!(DeviceMemoryResource);

impl DeviceMemoryResource {
    /// A resource for device `device_id`'s current memory pool (borrowed, never destroyed).
    ///
    /// # Errors
    /// [`MemoryError::Handle`]: an invalid device, a driver that does not load.
    ///
    /// Driver calls: `cuInit` (once), `cuDeviceGet`, `cuDeviceGetMemPool`.
    pub fn new(device_id: i32) -> Result<Arc<DeviceMemoryResource>, MemoryError> {
        let pool = MemoryPoolHandle::device_current(device_id)?;
        Ok(DeviceMemoryResource::with_pool(
            device_id,
            pool,
            IpcRole::None,
        ))
    }

    /// A resource with a new pool of its own on device `device_id`.
    ///
    /// # Errors
    /// [`MemoryError::Handle`]: the driver rejects the properties (an invalid device, IPC where
    /// the platform has none).
    ///
    /// Driver calls: `cuInit` (once), `cuMemPoolCreate`; `cuMemPoolDestroy` when the resource
    /// and its last buffer are gone.
    pub fn with_options(
        device_id: i32,
        options: DeviceMemoryResourceOptions,
    ) -> Result<Arc<DeviceMemoryResource>, MemoryError> {
        let pool = handles::create_pool(&PoolSpec {
            location: PoolLocation::Device(device_id),
            max_size: options.max_size,
            ipc: options.ipc_enabled,
        })?;
        let ipc = IpcRole::exportable_if(options.ipc_enabled);
        Ok(DeviceMemoryResource::with_pool(device_id, pool, ipc))
    }

    /// Opens a device pool another process exported with [`PoolMemoryResource::export_pool`]
    /// (the descriptor stays the caller's). The resource only imports pointers
    /// ([`crate::Buffer::from_ipc_descriptor`]); it cannot allocate.
    ///
    /// # Errors
    /// [`MemoryError::Handle`] when the driver rejects the descriptor.
    ///
    /// Driver calls: `cuInit` (once), `cuMemPoolImportFromShareableHandle`.
    pub fn import_pool(
        device_id: i32,
        fd: BorrowedFd<'_>,
    ) -> Result<Arc<DeviceMemoryResource>, MemoryError> {
        let pool = handles::import_pool(fd, Some(device_id))?;
        Ok(DeviceMemoryResource::with_pool(
            device_id,
            pool,
            IpcRole::Imported,
        ))
    }

    fn with_pool(
        device_id: i32,
        pool: MemoryPoolHandle,
        ipc: IpcRole,
    ) -> Arc<DeviceMemoryResource> {
        let access = Accessibility::device(device_id);
        Arc::new(DeviceMemoryResource {
            core: PoolCore::new(pool, access, ipc),
        })
    }
}

/// Options for [`PinnedMemoryResource::new`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PinnedMemoryResourceOptions {
    /// The most the pool may hold, in bytes; 0 for no limit.
    pub max_size: usize,
    /// Whether the pool can be shared with other processes (POSIX file descriptor).
    pub ipc_enabled: bool,
    /// The host NUMA node the memory lives on (`CU_MEM_LOCATION_TYPE_HOST_NUMA`); `None` lets
    /// the operating system place it (`CU_MEM_LOCATION_TYPE_HOST`), which a real driver shares
    /// with no other process: an IPC pool names its node.
    pub numa_id: Option<i32>,
}

/// Pinned host memory from a stream-ordered pool of its own (a host-located pool, CUDA 12.2
/// drivers and later), accessible from the host and every device.
///
/// Allocation and free are stream-ordered, as for [`DeviceMemoryResource`]; the stream may be
/// on any device.
#[derive(Debug)]
pub struct PinnedMemoryResource {
    core: PoolCore,
}

pool_resource!(PinnedMemoryResource);

impl PinnedMemoryResource {
    /// A resource with a new host-located pool.
    ///
    /// # Errors
    /// [`MemoryError::Handle`]: the driver rejects the properties (a driver older than 12.2).
    ///
    /// Driver calls: `cuInit` (once), `cuMemPoolCreate`, `cuDeviceGetCount`,
    /// `cuMemPoolSetAccess`; `cuMemPoolDestroy` when the resource and its last buffer are gone.
    pub fn new(
        options: PinnedMemoryResourceOptions,
    ) -> Result<Arc<PinnedMemoryResource>, MemoryError> {
        let pool = handles::create_pool(&PoolSpec {
            location: match options.numa_id {
                Some(node) => PoolLocation::HostNuma(node),
                None => PoolLocation::Host,
            },
            max_size: options.max_size,
            ipc: options.ipc_enabled,
        })?;
        Ok(Arc::new(PinnedMemoryResource {
            core: PoolCore::new(
                pool,
                Accessibility::PINNED,
                IpcRole::exportable_if(options.ipc_enabled),
            ),
        }))
    }

    /// Opens a pinned pool another process exported (the descriptor stays the caller's); the
    /// resource only imports pointers.
    ///
    /// # Errors
    /// [`MemoryError::Handle`] when the driver rejects the descriptor.
    ///
    /// Driver calls: `cuInit` (once), `cuMemPoolImportFromShareableHandle`.
    pub fn import_pool(fd: BorrowedFd<'_>) -> Result<Arc<PinnedMemoryResource>, MemoryError> {
        let pool = handles::import_pool(fd, None)?;
        Ok(Arc::new(PinnedMemoryResource {
            core: PoolCore::new(pool, Accessibility::PINNED, IpcRole::Imported),
        }))
    }
}

/// Managed memory from a stream-ordered managed memory pool (`CU_MEM_ALLOCATION_TYPE_MANAGED`,
/// CUDA 13 drivers): accessible from the host and every device, migrated by the driver, with a
/// preferred location ([`ManagedPoolLocation`]). The pool is the current managed pool of that
/// location ([`ManagedPoolMemoryResource::current`], borrowed) or one of its own
/// ([`ManagedPoolMemoryResource::new`]).
///
/// Allocation and free are stream-ordered, as for [`PinnedMemoryResource`] (a stream of any
/// device). The pool cannot be shared with other processes. The pointers carry no
/// `CU_POINTER_ATTRIBUTE_IS_MANAGED`: buffers know they are managed from the resource.
/// [`crate::ManagedMemoryResource`] (`cuMemAllocManaged`) serves drivers before CUDA 13.
#[derive(Debug)]
pub struct ManagedPoolMemoryResource {
    preferred: ManagedPoolLocation,
    core: PoolCore,
}

allocate_managed!(ManagedPoolMemoryResource);

pool_resource!(ManagedPoolMemoryResource);

impl ManagedPoolMemoryResource {
    /// A resource for the current managed pool of `preferred` (borrowed, never destroyed).
    ///
    /// # Errors
    /// [`MemoryError::Handle`]: a driver before CUDA 13 (no `cuMemGetMemPool`), a location
    /// the driver rejects.
    ///
    /// Driver calls: `cuInit` (once), `cuMemGetMemPool`.
    pub fn current(
        preferred: ManagedPoolLocation,
    ) -> Result<Arc<ManagedPoolMemoryResource>, MemoryError> {
        let pool = MemoryPoolHandle::managed_current(preferred)?;
        Ok(Self::with_pool(preferred, pool))
    }

    /// A resource with a new managed pool of its own preferring `preferred`.
    ///
    /// # Errors
    /// [`MemoryError::Handle`]: the driver rejects the properties (a driver before CUDA 13,
    /// an invalid device or node).
    ///
    /// Driver calls: `cuInit` (once), `cuMemPoolCreate`; `cuMemPoolDestroy` when the resource
    /// and its last buffer are gone.
    pub fn new(
        preferred: ManagedPoolLocation,
    ) -> Result<Arc<ManagedPoolMemoryResource>, MemoryError> {
        let pool = handles::create_managed_pool(preferred)?;
        Ok(Self::with_pool(preferred, pool))
    }

    fn with_pool(
        preferred: ManagedPoolLocation,
        pool: MemoryPoolHandle,
    ) -> Arc<ManagedPoolMemoryResource> {
        // Managed memory of the preferred device, or of none unless the preferred location is
        // a device.
        let access = Accessibility::managed(match preferred {
            ManagedPoolLocation::Device(ordinal) => Some(ordinal),
            _ => None,
        });
        Arc::new(ManagedPoolMemoryResource {
            preferred,
            core: PoolCore::new(pool, access, IpcRole::None),
        })
    }

    /// The preferred location the pool was made or looked up with.
    pub fn preferred_location(&self) -> ManagedPoolLocation {
        self.preferred
    }
}
