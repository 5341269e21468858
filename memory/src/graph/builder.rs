//! [`GraphBuilder`]: a graph recorded by stream capture, with graph allocations
//! ([`GraphMemoryResource`]) and fills and copies on buffers that the graph retains.

use std::collections::HashSet;
use std::fmt;
use std::sync::{Mutex, MutexGuard, PoisonError};

use handles::sys_types::{CUdeviceptr, CUstreamCaptureMode};
use handles::CaptureStatus;
use handles::{DevicePtrHandle, StreamHandle};

use super::{bound_device, Graph};
use crate::{Buffer, FillValue, GraphError, GraphMemoryResource, MemoryError, MemoryResource};

/// Which other threads' work a capture refuses while it runs (`CU_STREAM_CAPTURE_MODE_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CaptureMode {
    /// Unsafe calls (synchronous allocation, synchronisation, ...) are refused on every thread
    /// while the capture runs.
    Global,
    /// Unsafe calls are refused on the capturing thread only.
    #[default]
    ThreadLocal,
    /// Nothing is refused; the capture may end on another thread.
    Relaxed,
}

impl CaptureMode {
    fn raw(self) -> CUstreamCaptureMode {
        match self {
            CaptureMode::Global => CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_GLOBAL,
            CaptureMode::ThreadLocal => CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
            CaptureMode::Relaxed => CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED,
        }
    }
}

#[derive(Default)]
struct Building {
    active: bool,
    /// Graph allocations made through this builder during the capture: the graph's own memory,
    /// freed by the graph or on the capture stream, never retained.
    graph_allocations: HashSet<CUdeviceptr>,
}

/// Records a graph by capturing a stream: between [`GraphBuilder::begin_building`] and
/// [`GraphBuilder::end_building`], work issued on [`GraphBuilder::stream`] becomes nodes of the
/// graph instead of running.
///
/// Unlike cuda.core (which retains nothing during capture, docs/reference-notes.md section 5,
/// item 56), the builder's [`GraphBuilder::fill`] and [`GraphBuilder::copy`] make the graph
/// retain the buffers they touch, as explicit nodes do ([`Graph::add_memset`]): the buffers
/// stay allocated until the graph, its clones, executables and launches are gone. Work issued
/// on the stream directly (`Buffer::fill(value, builder.stream())`, or a kernel another library
/// launches there) is captured but retains nothing: [`GraphBuilder::retain`] keeps the buffers it
/// uses alive. Graph allocations ([`GraphBuilder::allocate`]) belong to the graph and are not
/// retained: closing one during the capture adds its free to the graph.
///
/// `Send + Sync`; operations are serialised under the builder's lock (so the attach-time
/// warning hook, docs/decisions.md D6, runs with it held and must not use the same builder). A
/// builder dropped while building ends its capture and discards the graph, and reports a
/// failure to end it through the cleanup-error hook; [`GraphBuilder::abandon_building`] does
/// the same and returns the error.
pub struct GraphBuilder {
    stream: StreamHandle,
    device: i32,
    state: Mutex<Building>,
}

impl GraphBuilder {
    /// A builder that captures `stream` (not yet building). No driver call.
    ///
    /// # Errors
    /// [`MemoryError::Graph`] for a stream that does not carry its context (an unbound
    /// default-stream token; the legacy stream cannot be captured at all).
    pub fn new(stream: &StreamHandle) -> Result<GraphBuilder, MemoryError> {
        let context = stream
            .context()
            .ok_or(MemoryError::Graph(GraphError::StreamWithoutContext))?;
        Ok(GraphBuilder {
            device: context.device(),
            stream: stream.clone(),
            state: Mutex::new(Building::default()),
        })
    }

    fn lock(&self) -> MutexGuard<'_, Building> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// After the driver refused to end the capture: the builder is still building if the
    /// capture still runs (or was invalidated and must still be ended), else it forgets the
    /// capture's allocations. Returns `error`, converted.
    ///
    /// Driver calls: `cuStreamIsCapturing`.
    fn failed_to_end(&self, state: &mut Building, error: handles::HandleError) -> MemoryError {
        let still = matches!(
            handles::capture_status(&self.stream),
            Ok(CaptureStatus::Active | CaptureStatus::Invalidated)
        );
        state.active = still;
        if !still {
            state.graph_allocations.clear();
        }
        error.into()
    }

    /// The stream being captured: work issued on it while building is recorded, not run.
    pub fn stream(&self) -> &StreamHandle {
        &self.stream
    }

    /// The device the graph will run on.
    pub fn device_id(&self) -> i32 {
        self.device
    }

    /// Whether a capture begun by [`GraphBuilder::begin_building`] is running.
    pub fn is_building(&self) -> bool {
        self.lock().active
    }

    /// Begins capturing the stream in `mode`.
    ///
    /// # Errors
    /// [`MemoryError::Graph`] when already building; [`MemoryError::Handle`] when the driver
    /// refuses (the stream is already being captured by other code, say).
    ///
    /// Driver calls: `cuCtxGetCurrent`, `cuCtxSetCurrent` (if needed),
    /// `cuStreamBeginCapture_v2`.
    pub fn begin_building(&self, mode: CaptureMode) -> Result<(), MemoryError> {
        let mut state = self.lock();
        if state.active {
            return Err(MemoryError::Graph(GraphError::AlreadyBuilding));
        }
        handles::begin_capture(&self.stream, mode.raw())?;
        state.active = true;
        state.graph_allocations.clear();
        Ok(())
    }

    /// Allocates `size` bytes of graph memory (an allocation node of the graph being built);
    /// the buffer's deallocation stream is the capture stream. Closing it while building adds
    /// a free node (ordered after its declared uses on streams of this capture); closing it
    /// after the graph has run frees it on the stream. Closing (or dropping) it after
    /// [`GraphBuilder::end_building`] but before the graph's first launch, when the memory does
    /// not exist yet, succeeds and defers the free: the first
    /// [`GraphExec::launch`](crate::GraphExec::launch) (or [`Graph::launch`]) of the graph, a
    /// clone or an executable issues it on the capture stream, ordered after that launch
    /// (docs/decisions.md D11). A graph that does not free an allocation itself is launched once
    /// (a later launch would allocate it again with nothing to free it:
    /// `handles::HandleError::GraphLaunchedOnce`). A graph never launched through custody, and a
    /// capture abandoned or invalidated, free nothing (there is nothing to free); a graph
    /// launched only through its raw `CUgraphExec` leaves that memory allocated.
    ///
    /// # Errors
    /// [`MemoryError::NotCapturing`] when not building; as
    /// [`GraphMemoryResource`]'s `allocate` otherwise.
    ///
    /// Driver calls: those of [`GraphMemoryResource`]'s `allocate`.
    pub fn allocate(&self, size: usize) -> Result<Buffer, MemoryError> {
        let mut state = self.lock();
        if !state.active {
            return Err(MemoryError::NotCapturing);
        }
        let buffer = GraphMemoryResource::new(self.device)?.allocate(size, &self.stream)?;
        state.graph_allocations.insert(buffer.ptr());
        Ok(buffer)
    }

    /// Whether the graph being built must retain `handle` (not one of its own allocations).
    fn must_retain(state: &Building, handle: &DevicePtrHandle) -> bool {
        !state.graph_allocations.contains(&handle.ptr())
    }

    /// Records a fill of `buffer` with `value` (an 8-, 16- or 32-bit pattern) and makes the
    /// graph retain the buffer (unless it is a graph allocation of this capture). One warning
    /// is reported when its recipe is on the per-thread default stream (docs/decisions.md D6).
    ///
    /// # Errors
    /// Found before any driver call: [`MemoryError::Graph`] when not building,
    /// [`MemoryError::InvalidFill`], [`HandleError::WrongDevice`](handles::HandleError::WrongDevice)
    /// (device memory of another device than the stream's). Then [`MemoryError::Handle`] for
    /// the driver's failure; if the retention succeeded and the fill failed, the buffer stays
    /// retained until the graph goes.
    ///
    /// An empty buffer: `Ok` after these checks, with nothing captured, nothing retained and no
    /// driver call (as [`Buffer::fill`] of zero bytes queues nothing).
    ///
    /// Driver calls: `cuCtxGetCurrent`, `cuCtxSetCurrent` (if needed),
    /// `cuStreamGetCaptureInfo_v2`, `cuUserObjectCreate`, `cuGraphRetainUserObject`,
    /// `cuUserObjectRelease`, then as [`Buffer::fill`].
    pub fn fill(&self, buffer: &Buffer, value: impl Into<FillValue>) -> Result<(), MemoryError> {
        let value = value.into();
        let handle = buffer.handle().clone();
        value.check_fits(handle.size(), handle.ptr())?;
        if handle.size() == 0 {
            return self.building().map(|_| ());
        }
        if let Some(device) = bound_device(buffer)? {
            if device != self.device {
                return Err(MemoryError::wrong_device(device, self.device));
            }
        }
        let state = self.building()?;
        if Self::must_retain(&state, &handle) {
            handles::retain_in_capture(&self.stream, &[&handle])?;
        }
        buffer.fill(value, &self.stream)
    }

    /// Records a copy of all of `src` into `dst` and makes the graph retain both (except graph
    /// allocations of this capture), as [`GraphBuilder::fill`] does.
    ///
    /// # Errors
    /// Found before any driver call: [`MemoryError::Graph`] when not building,
    /// [`MemoryError::SizeMismatch`],
    /// [`HandleError::WrongDevice`](handles::HandleError::WrongDevice) (both device memory and the stream on neither's device).
    /// Then as [`GraphBuilder::fill`]. Two empty buffers: `Ok` after the size and building
    /// checks, with nothing captured, nothing retained and no driver call.
    ///
    /// Driver calls: as [`GraphBuilder::fill`], then as [`Buffer::copy_to`]; none for zero
    /// bytes.
    pub fn copy(&self, dst: &Buffer, src: &Buffer) -> Result<(), MemoryError> {
        let (dst_handle, src_handle) = (dst.handle().clone(), src.handle().clone());
        if dst_handle.size() != src_handle.size() {
            return Err(MemoryError::SizeMismatch {
                src: src_handle.size(),
                dst: dst_handle.size(),
            });
        }
        if src_handle.size() == 0 {
            return self.building().map(|_| ());
        }
        let devices = [bound_device(src)?, bound_device(dst)?];
        if let [Some(first), second] | [second, Some(first)] = devices {
            if first != self.device && second != Some(self.device) {
                return Err(MemoryError::wrong_device(first, self.device));
            }
        }
        let state = self.building()?;
        let retained: Vec<&DevicePtrHandle> = [&dst_handle, &src_handle]
            .into_iter()
            .filter(|handle| Self::must_retain(&state, handle))
            .collect();
        if !retained.is_empty() {
            handles::retain_in_capture(&self.stream, &retained)?;
        }
        src.copy_to(dst, &self.stream)
    }

    /// Makes the graph being built retain `buffer`'s memory: for captured work that custody
    /// does not see, such as a kernel another library (CuPy, PyTorch, Numba, cudarc) launched
    /// on [`GraphBuilder::stream`] that reads or writes the buffer, or anything issued on the
    /// stream directly (`Buffer::fill(value, builder.stream())`), which retains nothing. The
    /// capture graph takes the retention, and the graph [`GraphBuilder::end_building`] returns
    /// inherits it, as it inherits [`GraphBuilder::fill`]'s: the memory stays allocated,
    /// whatever happens to `buffer` ([`Buffer::close`] frees nothing), until that graph, its
    /// clones, executables and launches are gone, and is then freed once by the cleanup worker
    /// (or [`handles::drain_deferred_cleanup`]) with its recipe as it is then
    /// ([`Buffer::set_deallocation_stream`] before the close still moves the free). Retain
    /// before or after the foreign launch, any time before the capture ends; retaining the
    /// same buffer again is harmless (one more reference, still one free). A graph allocation
    /// of this capture ([`GraphBuilder::allocate`]) is the graph's own memory and is not
    /// retained (`Ok`, nothing attached). Memory of any device (and host memory) may be
    /// retained: a kernel may read a peer's memory, and the free runs in the buffer's own
    /// context. One warning is reported when its recipe is on the per-thread default stream
    /// (docs/decisions.md D6). A retention orders nothing.
    ///
    /// # Errors
    /// [`MemoryError::Graph`] when not building (no driver call); [`MemoryError::Handle`]
    /// for the driver's failure (`InvalidArgument` when the capture was invalidated, by the
    /// foreign code, say). Nothing is retained on an error.
    ///
    /// Driver calls: `cuCtxGetCurrent`, `cuCtxSetCurrent` (if needed),
    /// `cuStreamGetCaptureInfo_v2`, `cuUserObjectCreate`, `cuGraphRetainUserObject`,
    /// `cuUserObjectRelease`.
    pub fn retain(&self, buffer: &Buffer) -> Result<(), MemoryError> {
        let handle = buffer.handle().clone();
        let state = self.building()?;
        if Self::must_retain(&state, &handle) {
            handles::retain_in_capture(&self.stream, &[&handle])?;
        }
        Ok(())
    }

    /// The lock, when building.
    fn building(&self) -> Result<MutexGuard<'_, Building>, MemoryError> {
        let state = self.lock();
        if !state.active {
            return Err(MemoryError::Graph(GraphError::NotBuilding));
        }
        Ok(state)
    }

    /// Ends the capture and returns the recorded graph, which owns the nodes and the
    /// retentions recorded since [`GraphBuilder::begin_building`]. The builder can begin again.
    ///
    /// # Errors
    /// [`MemoryError::Graph`] when not building; [`MemoryError::Handle`] for the driver's
    /// failure: `CUDA_ERROR_STREAM_CAPTURE_INVALIDATED` when the capture failed (it has ended,
    /// and what it retained is released), or a refusal that leaves the capture running
    /// (ending a thread-local or global capture on another thread).
    ///
    /// Driver calls: `cuCtxGetCurrent`, `cuCtxSetCurrent` (if needed), `cuStreamEndCapture`
    /// (and `cuStreamIsCapturing` after a failure).
    pub fn end_building(&self) -> Result<Graph, MemoryError> {
        let mut state = self.building()?;
        match handles::end_capture(&self.stream) {
            Ok(graph) => {
                state.active = false;
                state.graph_allocations.clear();
                Ok(Graph::from_handle(graph))
            }
            Err(error) => Err(self.failed_to_end(&mut state, error)),
        }
    }
}

impl GraphBuilder {
    /// Ends a capture still running and discards what it recorded (what it retained goes to the
    /// cleanup worker once the discarded graph is destroyed), so that the stream runs work
    /// again: what dropping the builder does, with the error returned. A capture that was
    /// invalidated has ended all the same and is not an error here. Nothing to do (`Ok`) when
    /// not building. The builder can begin again.
    ///
    /// # Errors
    /// [`MemoryError::Handle`] for the driver's refusal to end the capture (ending a
    /// thread-local or global capture on another thread, say); the builder is then still
    /// building if the capture still runs ([`GraphBuilder::is_building`]), so that the call can
    /// be made again from the thread that may end it.
    ///
    /// Driver calls: `cuCtxGetCurrent`, `cuCtxSetCurrent` (if needed), `cuStreamEndCapture`
    /// (and `cuStreamIsCapturing` after a failure); `cuGraphDestroy` for the discarded graph.
    pub fn abandon_building(&self) -> Result<(), MemoryError> {
        let mut state = self.lock();
        if !state.active {
            return Ok(());
        }
        match handles::discard_capture(&self.stream) {
            Ok(()) => {
                state.active = false;
                state.graph_allocations.clear();
                Ok(())
            }
            Err(error) => Err(self.failed_to_end(&mut state, error)),
        }
    }
}

impl Drop for GraphBuilder {
    fn drop(&mut self) {
        let state = self.state.get_mut().unwrap_or_else(PoisonError::into_inner);
        if !state.active || handles::exiting() {
            return;
        }
        // An abandoned capture: end it so the stream runs work again, and discard the graph
        // (what it retained goes to the cleanup worker); a failure goes to the cleanup-error
        // hook (docs/decisions.md D3), as [`GraphBuilder::abandon_building`] would return it.
        handles::abandon_capture(&self.stream);
    }
}

impl fmt::Debug for GraphBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "GraphBuilder(stream 0x{:x}, building {})",
            self.stream.raw() as usize,
            self.is_building()
        )
    }
}
