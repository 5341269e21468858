//! CUDA graphs that keep the buffers they use alive: [`Graph`] (a graph definition
//! with explicit memset, memcpy, host-function and empty nodes), [`GraphExec`] (its executable
//! form) and [`GraphBuilder`] (a graph recorded by stream capture).
//!
//! Every node that touches a buffer, and every buffer a builder's fill or copy touches, is
//! retained by the graph through a CUDA user object that owns a clone of the buffer's
//! [`DevicePtrHandle`](handles::DevicePtrHandle). The driver copies that reference into clones,
//! executables and launches in flight, so the memory stays allocated while any of them may
//! still use it, even after its [`Buffer`] was closed. When the last reference goes the
//! user object's destructor only queues the handle (it may run on a driver thread, or inside
//! our own `cuGraphExecDestroy`: docs/driver-facts.md G2, G3), and the cleanup worker (or
//! [`handles::drain_deferred_cleanup`]) frees it with its recipe as it is then, in the recipe's
//! context (docs/decisions.md D7): [`Buffer::set_deallocation_stream`] before [`Buffer::close`]
//! moves that free to another stream. A buffer whose recipe is on the per-thread default stream
//! reports one warning when a graph retains it (D6).
//!
//! Work custody does not see (a kernel that another library, such as CuPy, PyTorch, Numba or
//! cudarc, captured on the builder's stream or added to the graph) retains nothing by itself:
//! [`GraphBuilder::retain`], [`Graph::retain`] and [`GraphExec::retain`] attach a buffer the
//! same way, through a user object, so that closing it before the graph is gone frees nothing.

mod builder;

use std::fmt;
use std::sync::{Mutex, MutexGuard, PoisonError};

use handles::{ContextHandle, GraphExecHandle, GraphHandle, GraphInstantiateFlags, StreamHandle};

use crate::checks::check_bound_stream_device;
use crate::{Buffer, FillValue, GraphError, MemoryError};

pub use builder::{CaptureMode, GraphBuilder};
pub use handles::GraphNode;

/// The device a buffer's memory is bound to for device work: device-only memory's device;
/// `None` for memory any device may touch (pinned host, managed, host).
///
/// Driver calls: `cuPointerGetAttributes`, once per adopted view.
fn bound_device(buffer: &Buffer) -> Result<Option<i32>, MemoryError> {
    if buffer.is_host_accessible()? || buffer.is_managed()? {
        return Ok(None);
    }
    buffer.device_id()
}

/// Refuses an explicit memset or memcpy node of zero bytes, before any driver call: the driver
/// builds none (`cuGraphAddMemsetNode` needs at least one element), and an empty node is not
/// a node of that kind. Stream work of zero bytes (and so a capture of it) is a no-op instead.
fn check_node_size(size: usize) -> Result<(), MemoryError> {
    if size == 0 {
        return Err(MemoryError::InvalidSize {
            size,
            reason: "a graph's memset or memcpy node needs at least one byte",
        });
    }
    Ok(())
}

/// The pattern as the driver's memset takes it: the value in the low bits and the width.
fn memset_value(value: FillValue) -> (u32, u32) {
    match value {
        FillValue::U8(v) => (u32::from(v), 1),
        FillValue::U16(v) => (u32::from(v), 2),
        FillValue::U32(v) => (v, 4),
    }
}

/// A graph's or an executable's handle until its close: the state [`Graph`] and [`GraphExec`]
/// share. Every use runs under the lock, so that a close waits for it; `closed` is what
/// [`MemoryError::Graph`] says once the handle is gone.
struct Open<H> {
    state: Mutex<Option<H>>,
    closed: GraphError,
}

impl<H: Clone + fmt::Debug> Open<H> {
    fn new(handle: H, closed: GraphError) -> Open<H> {
        Open {
            state: Mutex::new(Some(handle)),
            closed,
        }
    }

    fn lock(&self) -> MutexGuard<'_, Option<H>> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Runs `f` on the open handle, under the lock.
    ///
    /// # Errors
    /// [`MemoryError::Graph`] once closed; `f`'s.
    fn with<R>(&self, f: impl FnOnce(&H) -> Result<R, MemoryError>) -> Result<R, MemoryError> {
        let guard = self.lock();
        let handle = guard.as_ref().ok_or(MemoryError::Graph(self.closed))?;
        f(handle)
    }

    /// A new reference to the handle.
    ///
    /// # Errors
    /// [`MemoryError::Graph`] once closed.
    fn handle(&self) -> Result<H, MemoryError> {
        self.with(|handle| Ok(handle.clone()))
    }

    fn is_closed(&self) -> bool {
        self.lock().is_none()
    }

    /// Takes the handle out; it is dropped (destroyed) outside the lock.
    fn close(&self) {
        let handle = self.lock().take();
        drop(handle);
    }

    /// `name(handle)`, or `name(closed)`.
    fn fmt(&self, name: &str, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.lock().as_ref() {
            Some(handle) => write!(f, "{name}({handle:?})"),
            None => write!(f, "{name}(closed)"),
        }
    }
}

/// A graph definition: nodes added explicitly (or recorded by a [`GraphBuilder`]), which keep
/// the buffers and host functions they use alive, instantiated into a [`GraphExec`] to run.
///
/// `Send + Sync`; every method takes `&self`. Changes are serialised (the driver requires it):
/// a node is added, the graph cloned or instantiated under the graph's lock, so the attach-time
/// warning hook (docs/decisions.md D6) runs with it held and must not change the same graph.
///
/// [`Graph::close`] destroys the definition now; buffers it retains stay allocated while a
/// clone, an executable or a launch still uses them, and are freed afterwards by the cleanup
/// worker.
pub struct Graph {
    state: Open<GraphHandle>,
    context: ContextHandle,
}

impl Graph {
    /// An empty graph in device `device_id`'s primary context.
    ///
    /// # Errors
    /// [`MemoryError::Handle`] for an invalid device or the driver's failure.
    ///
    /// Driver calls: `cuInit` (once), `cuDevicePrimaryCtxRetain`, `cuCtxGetCurrent`,
    /// `cuCtxSetCurrent` (if needed), `cuGraphCreate`; `cuGraphDestroy` when closed or dropped.
    pub fn new(device_id: i32) -> Result<Graph, MemoryError> {
        Graph::in_context(&ContextHandle::primary(device_id)?)
    }

    /// An empty graph in `context`.
    ///
    /// # Errors
    /// [`MemoryError::Handle`] for the driver's failure.
    ///
    /// Driver calls: `cuCtxGetCurrent`, `cuCtxSetCurrent` (if needed), `cuGraphCreate`;
    /// `cuGraphDestroy` when closed or dropped.
    pub fn in_context(context: &ContextHandle) -> Result<Graph, MemoryError> {
        Ok(Graph::from_handle(GraphHandle::create(context)?))
    }

    pub(crate) fn from_handle(handle: GraphHandle) -> Graph {
        let context = handle.context().clone();
        Graph {
            state: Open::new(handle, GraphError::GraphClosed),
            context,
        }
    }

    /// Runs `f` on the open graph, under the lock.
    fn with_open<R>(
        &self,
        f: impl FnOnce(&GraphHandle) -> Result<R, MemoryError>,
    ) -> Result<R, MemoryError> {
        self.state.with(f)
    }

    /// The context the graph runs in.
    pub fn context(&self) -> &ContextHandle {
        &self.context
    }

    /// The device the graph runs on.
    pub fn device_id(&self) -> i32 {
        self.context.device()
    }

    /// A new reference to the graph definition (for its raw `CUgraph`).
    ///
    /// # Errors
    /// [`MemoryError::Graph`] when the graph is closed.
    pub fn handle(&self) -> Result<GraphHandle, MemoryError> {
        self.state.handle()
    }

    /// Whether [`Graph::close`] was called.
    pub fn is_closed(&self) -> bool {
        self.state.is_closed()
    }

    /// Checks that device memory is on the graph's device.
    fn check_device(&self, buffer: &Buffer) -> Result<(), MemoryError> {
        match bound_device(buffer)? {
            Some(device) if device != self.device_id() => {
                Err(MemoryError::wrong_device(device, self.device_id()))
            }
            _ => Ok(()),
        }
    }

    /// Makes the graph retain `buffer`'s memory without adding a node: for nodes custody does
    /// not see that use it (a kernel another library added to this graph, or captured into it
    /// before [`GraphBuilder::end_building`] returned it). The memory stays allocated, whatever
    /// happens to `buffer` (a [`Buffer::close`] frees nothing), until this graph, its clones,
    /// the executables instantiated from it *afterwards* and their launches are gone; then the
    /// cleanup worker (or [`handles::drain_deferred_cleanup`]) frees it once, with its recipe
    /// as it is then: [`Buffer::set_deallocation_stream`] before the close still moves the
    /// free. An executable instantiated earlier does not hold it: use [`GraphExec::retain`].
    /// Retaining the same buffer again is harmless (one more reference, still one free). Memory
    /// of any device (and host memory) may be retained: a kernel may read a peer's memory,
    /// and the free runs in the buffer's own context. One warning is reported when its recipe
    /// is on the per-thread default stream (docs/decisions.md D6). A graph allocation must not
    /// be retained (its free belongs to its graph or its stream).
    ///
    /// A retention orders nothing: the foreign work must be ordered with custody's by its
    /// place in the graph, as usual.
    ///
    /// # Errors
    /// [`MemoryError::Graph`] when the graph is closed (no driver call);
    /// [`MemoryError::Handle`] for the driver's failure. Nothing is retained on an error.
    ///
    /// Driver calls: `cuCtxGetCurrent`, `cuCtxSetCurrent` (if needed), `cuUserObjectCreate`,
    /// `cuGraphRetainUserObject`.
    pub fn retain(&self, buffer: &Buffer) -> Result<(), MemoryError> {
        let handle = buffer.handle().clone();
        self.with_open(|graph| Ok(graph.retain(&[&handle])?))
    }

    /// Adds a node that does nothing, after `deps` (a join point).
    ///
    /// # Errors
    /// [`MemoryError::Graph`] when the graph is closed; [`MemoryError::Handle`] for a
    /// dependency of another graph (`InvalidArgument`, no driver call) or the driver's failure.
    ///
    /// Driver calls: `cuCtxGetCurrent`, `cuCtxSetCurrent` (if needed), `cuGraphAddEmptyNode`.
    pub fn add_empty(&self, deps: &[GraphNode]) -> Result<GraphNode, MemoryError> {
        self.with_open(|graph| Ok(graph.add_empty_node(deps)?))
    }

    /// Adds a node that fills `buffer` with `value` (an 8-, 16- or 32-bit pattern, repeated
    /// over all its bytes) when the graph runs, after `deps`. The graph retains the buffer's
    /// memory until the graph, its clones, executables and launches are gone; closing the
    /// buffer meanwhile frees nothing. One warning is reported when its recipe is on the
    /// per-thread default stream (docs/decisions.md D6).
    ///
    /// # Errors
    /// Found before any driver call: [`MemoryError::InvalidSize`] for an empty buffer (the
    /// driver builds no memset node of zero bytes; nothing is added), [`MemoryError::Graph`]
    /// (graph closed), [`MemoryError::InvalidFill`] (size or address
    /// not a multiple of the pattern's width), [`HandleError::WrongDevice`](handles::HandleError::WrongDevice) (device memory of
    /// another device than the graph's), [`MemoryError::Handle`] for a dependency of another
    /// graph. Then [`MemoryError::Handle`] for the driver's failure (nothing is retained then).
    ///
    /// Driver calls: `cuCtxGetCurrent`, `cuCtxSetCurrent` (if needed), `cuUserObjectCreate`,
    /// `cuGraphRetainUserObject`, `cuGraphAddMemsetNode`; `cuPointerGetAttributes` once for an
    /// adopted view.
    pub fn add_memset(
        &self,
        deps: &[GraphNode],
        buffer: &Buffer,
        value: impl Into<FillValue>,
    ) -> Result<GraphNode, MemoryError> {
        let value = value.into();
        let handle = buffer.handle().clone();
        check_node_size(handle.size())?;
        value.check_fits(handle.size(), handle.ptr())?;
        self.check_device(buffer)?;
        let (pattern, width) = memset_value(value);
        let count = handle.size() / width as usize;
        self.with_open(|graph| Ok(graph.add_memset_node(deps, &handle, pattern, width, count)?))
    }

    /// Adds a node that copies all of `src` into `dst` when the graph runs, after `deps`. The
    /// graph retains both, as [`Graph::add_memset`] does.
    ///
    /// # Errors
    /// Found before any driver call: [`MemoryError::SizeMismatch`],
    /// [`MemoryError::InvalidSize`] for two empty buffers (no memcpy node of zero bytes; nothing
    /// is added), [`MemoryError::Graph`] (graph closed), [`HandleError::WrongDevice`](handles::HandleError::WrongDevice) (device
    /// memory of
    /// another device than the graph's), [`MemoryError::Handle`] for a dependency of another
    /// graph. Then [`MemoryError::Handle`] for the driver's failure.
    ///
    /// Driver calls: as [`Graph::add_memset`], with `cuGraphAddMemcpyNode`.
    pub fn add_memcpy(
        &self,
        deps: &[GraphNode],
        dst: &Buffer,
        src: &Buffer,
    ) -> Result<GraphNode, MemoryError> {
        let (dst_handle, src_handle) = (dst.handle().clone(), src.handle().clone());
        if dst_handle.size() != src_handle.size() {
            return Err(MemoryError::SizeMismatch {
                src: src_handle.size(),
                dst: dst_handle.size(),
            });
        }
        check_node_size(src_handle.size())?;
        self.check_device(dst)?;
        self.check_device(src)?;
        self.with_open(|graph| {
            Ok(graph.add_memcpy_node(deps, &dst_handle, &src_handle, src_handle.size())?)
        })
    }

    /// Adds a node that calls `function` when the graph runs, after `deps`. The closure (and
    /// whatever it owns: moving a [`Buffer`] into it keeps that buffer alive) is dropped by the
    /// cleanup worker once the graph, its clones, executables and launches are gone.
    ///
    /// `function` runs on a driver thread and must make no CUDA call, through custody or
    /// otherwise (docs/driver-facts.md G4): the driver may fail or deadlock. It may run for several
    /// launches at once. A panic is caught and written to stderr.
    ///
    /// # Errors
    /// [`MemoryError::Graph`] when the graph is closed; [`MemoryError::Handle`] for a
    /// dependency of another graph or the driver's failure (the closure is then dropped by the
    /// cleanup worker).
    ///
    /// Driver calls: `cuCtxGetCurrent`, `cuCtxSetCurrent` (if needed), `cuUserObjectCreate`,
    /// `cuGraphRetainUserObject`, `cuGraphAddHostNode`.
    pub fn add_host_function(
        &self,
        deps: &[GraphNode],
        function: impl Fn() + Send + Sync + 'static,
    ) -> Result<GraphNode, MemoryError> {
        let function: Box<dyn Fn() + Send + Sync> = Box::new(function);
        self.with_open(|graph| Ok(graph.add_host_node(deps, function)?))
    }

    /// A copy of this graph with its own references to every retained buffer and host
    /// function, so either may be closed first. Nodes of this graph are not nodes of the copy.
    ///
    /// # Errors
    /// [`MemoryError::Graph`] when the graph is closed; [`MemoryError::Handle`] for the
    /// driver's failure.
    ///
    /// Driver calls: `cuCtxGetCurrent`, `cuCtxSetCurrent` (if needed), `cuGraphClone`.
    pub fn try_clone(&self) -> Result<Graph, MemoryError> {
        self.with_open(|graph| Ok(Graph::from_handle(graph.clone_graph()?)))
    }

    /// Instantiates the graph. The executable holds its own references to what the graph
    /// retains (docs/driver-facts.md G1), so this graph may be closed while it lives, and has
    /// an attachment of its own for [`GraphExec::retain`].
    ///
    /// # Errors
    /// [`MemoryError::Graph`] when the graph is closed; [`MemoryError::Handle`] for the
    /// driver's failure.
    ///
    /// Driver calls: `cuCtxGetCurrent`, `cuCtxSetCurrent` (if needed), `cuUserObjectCreate`,
    /// `cuGraphRetainUserObject`, `cuGraphInstantiateWithFlags`, `cuGraphReleaseUserObject`
    /// (the executable's own attachment: [`handles::GraphExecHandle::instantiate`]).
    pub fn instantiate(&self) -> Result<GraphExec, MemoryError> {
        self.with_open(|graph| {
            Ok(GraphExec::from_handle(GraphExecHandle::instantiate(
                graph,
                GraphInstantiateFlags::empty(),
            )?))
        })
    }

    /// Instantiates the graph, launches it on `stream` and destroys the executable at once:
    /// the launch in flight keeps what it uses (docs/driver-facts.md G3). Does not block.
    ///
    /// # Errors
    /// As [`Graph::instantiate`] and [`GraphExec::launch`].
    ///
    /// Driver calls: those of both, then `cuGraphExecDestroy`.
    pub fn launch(&self, stream: &StreamHandle) -> Result<(), MemoryError> {
        self.instantiate()?.launch(stream)
    }

    /// Destroys the graph definition now (a no-op when closed). What it retains is released
    /// as soon as no clone, executable or launch uses it any more: the buffers are then freed
    /// by the cleanup worker with their recipes. A failure to destroy is reported through the
    /// cleanup-error hook, like a drop: the frees it leads to are deferred anyway, so no
    /// caller could receive theirs.
    ///
    /// Driver calls: `cuCtxGetCurrent`, `cuCtxSetCurrent` (if needed), `cuGraphDestroy`.
    pub fn close(&self) {
        self.state.close();
    }
}

impl fmt::Debug for Graph {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.state.fmt("Graph", f)
    }
}

/// An executable graph: launch it on streams; it keeps what its graph retained, and each launch
/// in flight keeps it too, after the executable is closed (docs/driver-facts.md G1, G3).
///
/// `Send + Sync`; launches are serialised (the driver requires it).
pub struct GraphExec {
    state: Open<GraphExecHandle>,
}

impl GraphExec {
    pub(crate) fn from_handle(handle: GraphExecHandle) -> GraphExec {
        GraphExec {
            state: Open::new(handle, GraphError::ExecClosed),
        }
    }

    /// Launches the graph on `stream`, ordered after the work queued there. Does not block.
    /// The first successful launch of a captured graph (its clones and executables included)
    /// then issues the frees of its graph allocations that were closed before any launch
    /// ([`GraphBuilder::allocate`]), on their streams, ordered after this launch. A
    /// default-stream token means the graph's own context's stream (the launch runs in that
    /// context).
    ///
    /// # Errors
    /// Before any driver call: [`MemoryError::Graph`] when the executable is closed;
    /// [`HandleError::WrongDevice`](handles::HandleError::WrongDevice) for a stream of another device than the graph's (as copies
    /// and [`Buffer::record_use`] refuse one; the driver's own answer to such a launch is not
    /// relied on); [`MemoryError::Handle`] with `handles::HandleError::GraphLaunchedOnce` for a
    /// captured graph that ran once and does not free its graph allocations itself (another
    /// launch would allocate them again, with nothing to free them: docs/decisions.md D11).
    /// Then [`MemoryError::Handle`] for the driver's failure (nothing deferred is issued then).
    ///
    /// Driver calls: `cuCtxGetCurrent`, `cuCtxSetCurrent` (if needed), `cuGraphLaunch`; after
    /// the first launch, per deferred free `cuEventCreate`, `cuEventRecord`, `cuStreamWaitEvent`,
    /// `cuEventDestroy_v2`, `cuMemFreeAsync`.
    pub fn launch(&self, stream: &StreamHandle) -> Result<(), MemoryError> {
        let waiting = self.state.with(|handle| {
            check_bound_stream_device(stream, handle.context().device())?;
            Ok(handle.launch_then_free(stream)?)
        })?;
        // The frees that waited for this first launch, issued (and reported) with no lock held.
        drop(waiting);
        Ok(())
    }

    /// Uploads the executable to the device on `stream`, so that the next launch need not.
    /// Does not block.
    ///
    /// # Errors
    /// [`MemoryError::Graph`] when the executable is closed; [`HandleError::WrongDevice`](handles::HandleError::WrongDevice) for a
    /// stream of another device than the graph's (no driver call); [`MemoryError::Handle`] for
    /// the driver's failure.
    ///
    /// Driver calls: `cuCtxGetCurrent`, `cuCtxSetCurrent` (if needed), `cuGraphUpload`.
    pub fn upload(&self, stream: &StreamHandle) -> Result<(), MemoryError> {
        self.state.with(|handle| {
            check_bound_stream_device(stream, handle.context().device())?;
            Ok(handle.upload(stream)?)
        })
    }

    /// Makes this executable retain `buffer`'s memory: for work in the graph that custody does
    /// not see (a kernel another library captured or added) when the buffer may be closed
    /// while the executable lives. The memory stays allocated, whatever happens to `buffer`,
    /// until this executable is closed (or dropped) and its last launch has finished, launches
    /// queued before this call included; then the cleanup worker (or
    /// [`handles::drain_deferred_cleanup`]) frees it once, with its recipe as it is then. The
    /// graph it was instantiated from, its clones and other executables do not hold it (use
    /// [`Graph::retain`] before instantiating for those). Retaining the same buffer again is
    /// harmless (it is held once). Any device's memory may be retained, as
    /// [`Graph::retain`] explains. One warning is reported when its recipe is on the
    /// per-thread default stream (docs/decisions.md D6). A retention orders nothing.
    ///
    /// # Errors
    /// [`MemoryError::Graph`] when the executable is closed; nothing is retained then.
    ///
    /// Driver calls: none.
    pub fn retain(&self, buffer: &Buffer) -> Result<(), MemoryError> {
        self.state.with(|handle| {
            handle.retain(&[buffer.handle()]);
            Ok(())
        })
    }

    /// A new reference to the executable (for its raw `CUgraphExec`).
    ///
    /// # Errors
    /// [`MemoryError::Graph`] when the executable is closed.
    pub fn handle(&self) -> Result<GraphExecHandle, MemoryError> {
        self.state.handle()
    }

    /// Whether [`GraphExec::close`] was called.
    pub fn is_closed(&self) -> bool {
        self.state.is_closed()
    }

    /// Destroys the executable now (a no-op when closed). With no launch pending, what only it
    /// retained is queued for the cleanup worker inside this call (docs/driver-facts.md G2); with a
    /// launch pending, when the last launch finishes (G3). Never blocks on the GPU; a failure
    /// is reported through the cleanup-error hook, as [`Graph::close`] explains.
    ///
    /// Driver calls: `cuCtxGetCurrent`, `cuCtxSetCurrent` (if needed), `cuGraphExecDestroy`.
    pub fn close(&self) {
        self.state.close();
    }
}

impl fmt::Debug for GraphExec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.state.fmt("GraphExec", f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memset_values_keep_the_pattern_in_the_low_bits() {
        assert_eq!(memset_value(FillValue::U8(0xab)), (0xab, 1));
        assert_eq!(memset_value(FillValue::U16(0xabcd)), (0xabcd, 2));
        assert_eq!(memset_value(FillValue::U32(0xdead_beef)), (0xdead_beef, 4));
    }
}
