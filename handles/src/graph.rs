//! [`GraphHandle`] and [`GraphExecHandle`]: graphs and executables, owned and destroyed in their
//! context (the nodes that keep memory alive are in `graph_nodes.rs`, user objects in
//! `user_object.rs`).

use std::any::Any;
use std::fmt;
use std::sync::{Arc, Mutex};

use cuda_sys::types::{CUgraph, CUgraphExec};

use crate::context::{in_context, ContextHandle};
use crate::deviceptr::DevicePtrHandle;
use crate::error::HandleError;
use crate::flags::GraphInstantiateFlags;
use crate::release::{LaunchSide, WaitingFrees};
use crate::scope::destroy_in_context;
use crate::stream::StreamHandle;
use crate::sys::check;
use crate::user_object::UserObjectOwnership;

/// What [`GraphExecHandle::retain`] attached to one executable: the one payload that grows after
/// it was made, because a driver attaches user objects to graph definitions only (the
/// executable's user object is made at instantiation). Each allocation once. A leaf lock: held
/// to push a clone, never across a driver call.
pub(crate) type ExecAttachments = Mutex<Vec<DevicePtrHandle>>;

pub(crate) struct GraphBox {
    pub(crate) raw: usize,
    pub(crate) context: ContextHandle,
    /// For a graph a capture produced, the capture's graph allocations, shared with the
    /// graph's clones and executables: their frees wait for the first launch, and a graph that
    /// does not free them is launched once (`release/graph.rs`, docs/decisions.md D11).
    pub(crate) allocations: Option<Arc<LaunchSide>>,
}

/// A graph definition, owned; destroyed in its context when the last clone drops.
#[derive(Clone)]
pub struct GraphHandle(pub(crate) Arc<GraphBox>);

impl GraphHandle {
    /// Creates an empty graph, with `context` current.
    ///
    /// # Errors
    /// [`HandleError::Driver`] when the context switch or the creation fails.
    ///
    /// Driver calls: `cuCtxGetCurrent`, `cuCtxSetCurrent` (if needed), `cuGraphCreate`;
    /// `cuGraphDestroy` when the last clone drops.
    pub fn create(context: &ContextHandle) -> Result<GraphHandle, HandleError> {
        let raw = in_context(context, "cuGraphCreate", |d| {
            let mut raw: CUgraph = std::ptr::null_mut();
            // SAFETY: `raw` is a valid out-pointer; flags must be 0.
            let status = unsafe { (d.cuGraphCreate)(&mut raw, 0) };
            check("cuGraphCreate", status).map(|()| raw as usize)
        })?;
        Ok(GraphHandle(Arc::new(GraphBox {
            raw,
            context: context.clone(),
            allocations: None,
        })))
    }

    /// The raw `CUgraph`, valid while this handle lives.
    pub fn raw(&self) -> CUgraph {
        self.0.raw as CUgraph
    }

    /// The context the graph was created in.
    pub fn context(&self) -> &ContextHandle {
        &self.0.context
    }
}

impl Drop for GraphBox {
    fn drop(&mut self) {
        let raw = self.raw;
        destroy_in_context(
            "graph",
            "cuGraphDestroy",
            raw,
            self.context.raw_usize(),
            |d| {
                // SAFETY: this box created the graph and is its last owner.
                unsafe { (d.cuGraphDestroy)(raw as CUgraph) }
            },
        );
    }
}

impl fmt::Debug for GraphHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "GraphHandle(0x{:x})", self.0.raw)
    }
}

pub(crate) struct GraphExecBox {
    pub(crate) raw: usize,
    pub(crate) context: ContextHandle,
    /// What [`GraphExecHandle::retain`] attached: the payload of a user object that only this
    /// executable references. This box's reference is given up before the executable is
    /// destroyed, so the payload's own is the last and the memory is freed by deferred cleanup.
    pub(crate) kept: Option<Arc<ExecAttachments>>,
    /// The graph allocations of the capture the graph came from, as [`GraphBox`]'s.
    pub(crate) allocations: Option<Arc<LaunchSide>>,
}

/// An executable graph, owned; destroyed in its context when the last clone drops.
///
/// The executable holds its own references to the user objects of the graph it was
/// instantiated from, so payloads outlive the graph definition (docs/driver-facts.md G1); a payload
/// whose last reference goes inside `cuGraphExecDestroy` is queued there and then (G2).
#[derive(Clone)]
pub struct GraphExecHandle(pub(crate) Arc<GraphExecBox>);

impl GraphExecHandle {
    /// Instantiates `graph` with `flags` (`CUDA_GRAPH_INSTANTIATE_FLAG_*`).
    ///
    /// The executable also gets a user object of its own, for what [`GraphExecHandle::retain`]
    /// attaches later: a driver attaches user objects to graph definitions only, and an
    /// executable takes its references when it is instantiated, so the object is moved into
    /// `graph` for the instantiation and the graph's reference is given back right after. A
    /// copy or executable made from `graph` by another thread meanwhile would hold it too
    /// (keeping this executable's attachments longer, never shorter); the memory crate's
    /// `Graph` serialises these calls.
    ///
    /// # Errors
    /// [`HandleError::GraphLaunchedOnce`] before any driver call, for a graph that ran once and
    /// allocates memory it does not free (an executable of it could never be launched);
    /// [`HandleError::Driver`] when the user object cannot be made or attached, or the
    /// instantiation fails (nothing is left attached to `graph` then; a graph holding memory
    /// nodes has one executable at a time, docs/driver-facts.md G5). If the graph's reference
    /// cannot be given back, that is reported (`Consequence::KeptByGraph`: `graph` keeps an
    /// empty attachment until it goes), not returned.
    ///
    /// Driver calls: `cuCtxGetCurrent`, `cuCtxSetCurrent` (if needed), `cuUserObjectCreate`,
    /// `cuGraphRetainUserObject`, `cuGraphInstantiateWithFlags`, `cuGraphReleaseUserObject`;
    /// `cuGraphExecDestroy` when the last clone drops.
    pub fn instantiate(
        graph: &GraphHandle,
        flags: GraphInstantiateFlags,
    ) -> Result<GraphExecHandle, HandleError> {
        if let Some(allocations) = &graph.0.allocations {
            allocations.allocations().may_launch()?;
        }
        let context = graph.context();
        let kept = Arc::new(ExecAttachments::default());
        let payload: Box<dyn Any + Send> = Box::new(Arc::clone(&kept));
        let object = UserObjectOwnership::new(context, payload)?;
        let object_raw = object.raw();
        object.move_into_graph(graph)?;
        let made = in_context(context, "cuGraphInstantiateWithFlags", |d| {
            let mut raw: CUgraphExec = std::ptr::null_mut();
            // SAFETY: `raw` is a valid out-pointer; the graph handle is alive.
            let status =
                unsafe { (d.cuGraphInstantiateWithFlags)(&mut raw, graph.raw(), flags.bits()) };
            check("cuGraphInstantiateWithFlags", status).map(|()| raw as usize)
        });
        // The executable (if made) holds its own reference now; the graph gives its back.
        graph.give_back(object_raw);
        Ok(GraphExecHandle(Arc::new(GraphExecBox {
            raw: made?,
            context: context.clone(),
            kept: Some(kept),
            allocations: graph.0.allocations.clone(),
        })))
    }

    /// Launches the executable on `stream`. Does not block. For a graph a capture produced,
    /// with graph allocations (docs/decisions.md D11): the first launch (of the graph, a clone
    /// or any of their executables) then issues the frees of allocations closed before it,
    /// each ordered after this launch; a graph that does not free its allocations itself is
    /// launched once.
    ///
    /// # Errors
    /// [`HandleError::GraphLaunchedOnce`] before any driver call, for a graph that ran once
    /// and allocates memory it does not free; [`HandleError::Driver`] when the launch fails
    /// (nothing waiting is issued then).
    ///
    /// Driver calls: `cuCtxGetCurrent`, `cuCtxSetCurrent` (if needed), `cuGraphLaunch`; after
    /// the first launch, per waiting free those of its release (`cuEventCreate`,
    /// `cuEventRecord`, `cuStreamWaitEvent`, `cuEventDestroy_v2`, `cuMemFreeAsync`).
    pub fn launch(&self, stream: &StreamHandle) -> Result<(), HandleError> {
        drop(self.launch_then_free(stream)?);
        Ok(())
    }

    /// [`GraphExecHandle::launch`], handing back the frees that waited for this first launch
    /// instead of issuing them: they are issued when the returned value drops, so that a
    /// caller that serialises launches under a lock issues them (and their reports) after it
    /// lets the lock go. `None` when nothing waited.
    ///
    /// # Errors
    /// As [`GraphExecHandle::launch`].
    ///
    /// Driver calls: `cuCtxGetCurrent`, `cuCtxSetCurrent` (if needed), `cuGraphLaunch`; the
    /// frees' when the value drops.
    pub fn launch_then_free(
        &self,
        stream: &StreamHandle,
    ) -> Result<Option<WaitingFrees>, HandleError> {
        if let Some(allocations) = &self.0.allocations {
            allocations.allocations().may_launch()?;
        }
        in_context(&self.0.context, "cuGraphLaunch", |d| {
            // SAFETY: both handles keep their resources alive.
            let status = unsafe { (d.cuGraphLaunch)(self.raw(), stream.raw()) };
            check("cuGraphLaunch", status)
        })?;
        Ok(self
            .0
            .allocations
            .as_ref()
            .map(|allocations| allocations.allocations().launched(stream, &self.0.context)))
    }

    /// Uploads the executable to the device on `stream`, so that a later launch need not (the
    /// Python bindings' `Graph.upload`). Does not block.
    ///
    /// # Errors
    /// [`HandleError::Driver`] when the upload fails; [`HandleError::Load`] when the driver lacks
    /// `cuGraphUpload`.
    ///
    /// Driver calls: `cuCtxGetCurrent`, `cuCtxSetCurrent` (if needed), `cuGraphUpload`.
    pub fn upload(&self, stream: &StreamHandle) -> Result<(), HandleError> {
        in_context(&self.0.context, "cuGraphUpload", |d| {
            let upload = d.cuGraphUpload().map_err(HandleError::Load)?;
            // SAFETY: both handles keep their resources alive.
            let status = unsafe { upload(self.raw(), stream.raw()) };
            check("cuGraphUpload", status)
        })
    }

    /// The context the executable runs in (its graph's).
    pub fn context(&self) -> &ContextHandle {
        &self.0.context
    }

    /// The raw `CUgraphExec`, valid while this handle lives.
    pub fn raw(&self) -> CUgraphExec {
        self.0.raw as CUgraphExec
    }
}

impl Drop for GraphExecBox {
    fn drop(&mut self) {
        // First, so that the user object's payload holds the last reference to what `retain`
        // attached: it is freed by deferred cleanup after the launches in flight (G2, G3).
        drop(self.kept.take());
        let raw = self.raw;
        destroy_in_context(
            "graph exec",
            "cuGraphExecDestroy",
            raw,
            self.context.raw_usize(),
            |d| {
                // SAFETY: this box instantiated the executable and is its last owner.
                unsafe { (d.cuGraphExecDestroy)(raw as CUgraphExec) }
            },
        );
    }
}

impl fmt::Debug for GraphExecHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "GraphExecHandle(0x{:x})", self.0.raw)
    }
}

// The graph a stream capture produced (`handles::end_capture`), which the memory crate's builder
// wraps.
impl GraphHandle {
    /// Takes ownership of a graph made by `cuStreamEndCapture` in `context`.
    pub(crate) fn from_captured(
        raw: CUgraph,
        context: &ContextHandle,
        allocations: Option<Arc<LaunchSide>>,
    ) -> GraphHandle {
        GraphHandle(Arc::new(GraphBox {
            raw: raw as usize,
            context: context.clone(),
            allocations,
        }))
    }
}

impl UserObjectOwnership {
    /// Moves this reference into `graph` (`CU_GRAPH_USER_OBJECT_MOVE`): the graph, its clones
    /// and executables now keep the payload alive.
    ///
    /// # Errors
    /// [`HandleError::Driver`] when the driver refuses; the reference is then released, which
    /// queues the payload for deferred cleanup.
    ///
    /// Driver calls: `cuCtxGetCurrent`, `cuCtxSetCurrent` (if needed), `cuGraphRetainUserObject`.
    pub fn move_into_graph(self, graph: &GraphHandle) -> Result<(), HandleError> {
        self.move_into_raw_graph(graph.raw())
    }
}
