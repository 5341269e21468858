//! Resources whose free is synchronous in the driver: [`LegacyPinnedMemoryResource`]
//! (`cuMemAllocHost`), [`ManagedMemoryResource`] (`cuMemAllocManaged`) and
//! [`SynchronousMemoryResource`] (`cuMemAlloc`).
//!
//! A drop of their buffers records an event on the deallocation stream and frees on the
//! cleanup worker once it has fired (never blocking the dropping thread, docs/decisions.md D9); an
//! explicit [`crate::Buffer::close`] and `deallocate` synchronise the stream and free before
//! returning. Memory adopted with one of them as owner gets the same rule
//! ([`crate::MemoryResource::adopt`]).

use std::sync::Arc;

use handles::{
    ContextHandle, DefaultStream, DevicePtrHandle, MemAttachFlags, ReleaseKind, StreamHandle,
};

use crate::buffer::{adopt_synchronous, Accessibility, IpcRole};
use crate::checks::check_bound_stream_device;
use crate::{AdoptError, MemoryError};

/// Pinned host memory from `cuMemAllocHost`, allocated in the stream's context; accessible
/// from the host and every device, bound to no device.
#[derive(Debug, Default)]
pub struct LegacyPinnedMemoryResource;

impl LegacyPinnedMemoryResource {
    /// The resource (no driver call).
    pub fn new() -> Arc<LegacyPinnedMemoryResource> {
        Arc::new(LegacyPinnedMemoryResource)
    }
}

builtin_resource! {
    LegacyPinnedMemoryResource,
    /// Allocates `size` bytes of pinned host memory in the context of `stream`, which orders
    /// the eventual free.
    ///
    /// # Errors
    /// [`MemoryError::InvalidSize`]; [`MemoryError::Handle`]: no current context for a
    /// default-stream token, the driver's failure.
    ///
    /// Driver calls: `cuCtxGetCurrent`, `cuCtxSetCurrent` (if needed), `cuMemAllocHost_v2`.
    allocate(_mr, size, stream) {
        Ok((DevicePtrHandle::alloc_host(size, stream)?, IpcRole::None))
    }
    /// **Blocks** until `stream` has drained, then `cuMemFreeHost(ptr)`.
    ///
    /// # Errors
    /// [`MemoryError::Handle`] for the driver's failure (nothing is freed if the wait fails).
    deallocate: free_host_sync,
    accessibility(self) {
        Accessibility::PINNED
    }
    /// Adopts with the pinned-host release rule (no blocking in a drop).
    adopt(_mr, allocation, stream) {
        adopt_synchronous(allocation, ReleaseKind::PinnedHost, None, stream)
    }
}

/// Managed memory from `cuMemAllocManaged` (attached globally), allocated in the stream's
/// context; accessible from the host and every device.
///
/// Unlike cuda.core's pool-based managed resource, this uses `cuMemAllocManaged`, which every
/// CUDA 12 driver has (managed memory pools need CUDA 13).
#[derive(Debug, Default)]
pub struct ManagedMemoryResource;

allocate_managed!(ManagedMemoryResource);

impl ManagedMemoryResource {
    /// The resource (no driver call).
    pub fn new() -> Arc<ManagedMemoryResource> {
        Arc::new(ManagedMemoryResource)
    }
}

builtin_resource! {
    ManagedMemoryResource,
    /// Allocates `size` bytes of managed memory in the context of `stream`, which orders the
    /// eventual free.
    ///
    /// # Errors
    /// [`MemoryError::InvalidSize`]; [`MemoryError::Handle`]: no current context for a
    /// default-stream token, the driver's failure.
    ///
    /// Driver calls: `cuCtxGetCurrent`, `cuCtxSetCurrent` (if needed), `cuMemAllocManaged`.
    allocate(_mr, size, stream) {
        let handle = DevicePtrHandle::alloc_managed(size, MemAttachFlags::GLOBAL, stream)?;
        Ok((handle, IpcRole::None))
    }
    /// **Blocks** until `stream` has drained, then `cuMemFree(ptr)`.
    ///
    /// # Errors
    /// [`MemoryError::Handle`] for the driver's failure (nothing is freed if the wait fails).
    deallocate: free_device_sync,
    accessibility(self) {
        Accessibility::managed(None)
    }
    /// Adopts with the managed release rule (no blocking in a drop).
    adopt(_mr, allocation, stream) {
        adopt_synchronous(allocation, ReleaseKind::Managed, None, stream)
    }
}

/// Device memory from the synchronous `cuMemAlloc`, allocated in the device's primary context
/// (retained by the resource), so no context need be current.
///
/// A created stream given to `allocate` becomes the deallocation stream; a default-stream
/// token (any of the three) is replaced by the legacy stream *bound to the resource's
/// context*: the allocation is synchronous anyway, and the free then needs no current context
/// and raises no per-thread-stream warning on another thread.
#[derive(Debug)]
pub struct SynchronousMemoryResource {
    device: i32,
    legacy: StreamHandle,
}

impl SynchronousMemoryResource {
    /// A resource for device `device_id`; retains its primary context.
    ///
    /// # Errors
    /// [`MemoryError::Handle`]: an invalid device, a driver that does not load.
    ///
    /// Driver calls: `cuInit` (once), `cuDeviceGet`, `cuDevicePrimaryCtxRetain`;
    /// `cuDevicePrimaryCtxRelease` when the resource and its buffers are gone.
    pub fn new(device_id: i32) -> Result<Arc<SynchronousMemoryResource>, MemoryError> {
        let context = ContextHandle::primary(device_id)?;
        Ok(Arc::new(SynchronousMemoryResource {
            device: device_id,
            legacy: StreamHandle::bound_default_stream(DefaultStream::Legacy, &context),
        }))
    }

    /// The stream to record: `stream` if it is a real stream (of this device), else the
    /// legacy stream bound to the resource's context.
    fn recipe_stream<'a>(
        &'a self,
        stream: &'a StreamHandle,
    ) -> Result<&'a StreamHandle, MemoryError> {
        if stream.default_kind().is_some() {
            return Ok(&self.legacy);
        }
        check_bound_stream_device(stream, self.device)?;
        Ok(stream)
    }
}

builtin_resource! {
    SynchronousMemoryResource,
    /// Allocates `size` bytes with `cuMemAlloc` in the resource's context.
    ///
    /// # Errors
    /// [`MemoryError::InvalidSize`]; [`HandleError::WrongDevice`](handles::HandleError::WrongDevice) for a created stream of
    /// another device; [`MemoryError::Handle`] for the driver's failure.
    ///
    /// Driver calls: `cuCtxGetCurrent`, `cuCtxSetCurrent` (if needed), `cuMemAlloc_v2`.
    allocate(mr, size, stream) {
        let recorded = mr.recipe_stream(stream)?;
        let handle = DevicePtrHandle::alloc(size, recorded)?;
        Ok((handle, IpcRole::None))
    }
    /// **Blocks** until `stream` has drained, then `cuMemFree(ptr)`.
    ///
    /// # Errors
    /// [`MemoryError::Handle`] for the driver's failure (nothing is freed if the wait fails).
    deallocate: free_device_sync,
    accessibility(self) {
        Accessibility::device(self.device)
    }
    /// Adopts with the `cuMemAlloc` release rule (no blocking in a drop); a default-stream
    /// token is replaced by the resource's bound legacy stream, as in `allocate`.
    adopt(mr, allocation, stream) {
        let recorded = match mr.recipe_stream(stream) {
            Ok(recorded) => recorded,
            Err(error) => return Err(AdoptError { error, allocation }),
        };
        adopt_synchronous(allocation, ReleaseKind::Synchronous, Some(mr.device), recorded)
    }
}
