//! [`GraphMemoryResource`]: memory allocated during stream capture, which becomes part of the
//! captured graph.

use std::sync::Arc;

use handles::CaptureStatus;

use handles::DevicePtrHandle;

use crate::buffer::{Accessibility, IpcRole};
use crate::checks::check_bound_stream_device;
use crate::MemoryError;

/// Graph memory of device `device_id`: `cuMemAllocAsync` on a stream that is being captured,
/// recorded as an allocation node of the graph.
///
/// The capturing stream is the buffer's deallocation stream. In a capture begun through custody
/// (a [`crate::GraphBuilder`], or `handles::begin_capture`) the free follows the capture
/// (docs/decisions.md D11): closing the buffer inside that capture adds a free node to the graph
/// (ordered after declared uses on streams of the same capture); closing it while its stream is
/// captured by another capture hands it to that graph, like any other memory; closing it after
/// the capture ended and before the graph's first launch defers the free until that launch;
/// after a launch it is an ordinary `cuMemFreeAsync` on that stream; an allocation of a capture
/// that produced no graph (abandoned, invalidated) frees nothing. A graph that does not free its
/// allocations itself is launched once.
#[derive(Debug)]
pub struct GraphMemoryResource {
    device: i32,
}

impl GraphMemoryResource {
    /// The resource for device `device_id`, which must exist (each allocation's stream is then
    /// checked against it).
    ///
    /// # Errors
    /// [`MemoryError::Handle`]: a device that does not exist (`CUDA_ERROR_INVALID_DEVICE`), a
    /// driver that does not load.
    ///
    /// Driver calls: `cuInit` (once), `cuDeviceGet`.
    pub fn new(device_id: i32) -> Result<Arc<GraphMemoryResource>, MemoryError> {
        handles::check_device(device_id)?;
        Ok(Arc::new(GraphMemoryResource { device: device_id }))
    }
}

builtin_resource! {
    GraphMemoryResource,
    /// Allocates `size` bytes as a graph allocation on `stream`, which must be capturing.
    ///
    /// # Errors
    /// [`MemoryError::InvalidSize`]; [`HandleError::WrongDevice`](handles::HandleError::WrongDevice) for a stream of another
    /// device; [`MemoryError::NotCapturing`] when `stream` is not capturing (or its capture was
    /// invalidated); [`MemoryError::Handle`] for the driver's failure.
    ///
    /// Driver calls: `cuCtxGetCurrent`, `cuCtxSetCurrent` (if needed), `cuStreamIsCapturing`,
    /// `cuMemAllocAsync`.
    allocate(mr, size, stream) {
        check_bound_stream_device(stream, mr.device)?;
        if handles::capture_status(stream)? != CaptureStatus::Active {
            return Err(MemoryError::NotCapturing);
        }
        let handle = DevicePtrHandle::alloc_graph(size, stream)?;
        Ok((handle, IpcRole::None))
    }
    /// `cuMemFreeAsync(ptr, stream)` (a free node when `stream` is capturing). Does not block.
    ///
    /// # Errors
    /// [`MemoryError::Handle`] for the driver's failure.
    deallocate: free_async,
    accessibility(self) {
        Accessibility::device(self.device)
    }
}
