//! Minimal graph ownership: [`GraphHandle`], [`GraphExecHandle`] and [`UserObjectOwnership`],
//! the primitive that lets a graph keep Rust values (buffers) alive and hand them to the
//! deferred-cleanup queue when the driver lets go (docs/decisions.md D7).

use std::any::Any;
use std::fmt;
use std::sync::Arc;

use cuda_sys::types::{CUgraph, CUgraphExec, CUuserObject};

use crate::context::ContextHandle;
use crate::deferred::{ensure_worker, user_object_destructor};
use crate::report::Subject;
use crate::scope::{in_context, release_in};
use crate::stream::StreamHandle;
use crate::sys::check;
use crate::HandleError;

// Graph nodes and their attachments live in their own file, as a child module so
// they reach the graph box.
#[path = "graph_nodes.rs"]
mod nodes;
use nodes::ExecAttachments;
pub use nodes::{retain_in_capture, GraphNode};

/// `CU_USER_OBJECT_NO_DESTRUCTOR_SYNC`.
const USER_OBJECT_NO_DESTRUCTOR_SYNC: u32 = 1;
/// `CU_GRAPH_USER_OBJECT_MOVE`.
const GRAPH_USER_OBJECT_MOVE: u32 = 1;

/// Releases a graph object with `destroy` (returning its status for `operation`) in
/// `context`, reporting a failure (drop paths).
fn destroy_in_context(
    resource: &'static str,
    operation: &'static str,
    raw: usize,
    context: &ContextHandle,
    destroy: impl FnOnce(&'static cuda_sys::Driver) -> u32,
) {
    let context = context.raw_usize();
    release_in(
        context,
        || Subject::new(resource, operation, raw as u64, 0, context as u64),
        |d| check(operation, destroy(d)),
    );
}

struct GraphBox {
    raw: usize,
    context: ContextHandle,
}

/// A graph definition, owned; destroyed in its context when the last clone drops.
#[derive(Clone)]
pub struct GraphHandle(Arc<GraphBox>);

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
        destroy_in_context("graph", "cuGraphDestroy", raw, &self.context, |d| {
            // SAFETY: this box created the graph and is its last owner.
            unsafe { (d.cuGraphDestroy)(raw as CUgraph) }
        });
    }
}

impl fmt::Debug for GraphHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "GraphHandle(0x{:x})", self.0.raw)
    }
}

struct GraphExecBox {
    raw: usize,
    context: ContextHandle,
    /// What [`GraphExecHandle::retain`] attached: the payload of a user object that only this
    /// executable references. This box's reference is given up before the executable is
    /// destroyed, so the payload's own is the last and the memory is freed by deferred cleanup.
    kept: Option<Arc<ExecAttachments>>,
}

/// An executable graph, owned; destroyed in its context when the last clone drops.
///
/// The executable holds its own references to the user objects of the graph it was
/// instantiated from, so payloads outlive the graph definition (docs/driver-facts.md G1); a payload
/// whose last reference goes inside `cuGraphExecDestroy` is queued there and then (G2).
#[derive(Clone)]
pub struct GraphExecHandle(Arc<GraphExecBox>);

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
    /// [`HandleError::Driver`] when the user object cannot be made or attached, or the
    /// instantiation fails (nothing is left attached to `graph` then). If the graph's reference
    /// cannot be given back, that is reported (`Consequence::KeptByGraph`: `graph` keeps an
    /// empty attachment until it goes), not returned.
    ///
    /// Driver calls: `cuCtxGetCurrent`, `cuCtxSetCurrent` (if needed), `cuUserObjectCreate`,
    /// `cuGraphRetainUserObject`, `cuGraphInstantiateWithFlags`, `cuGraphReleaseUserObject`;
    /// `cuGraphExecDestroy` when the last clone drops.
    pub fn instantiate(graph: &GraphHandle, flags: u64) -> Result<GraphExecHandle, HandleError> {
        let context = graph.context();
        let kept = Arc::new(ExecAttachments::default());
        let payload: Box<dyn Any + Send> = Box::new(Arc::clone(&kept));
        let object = UserObjectOwnership::new(context, payload)?;
        let object_raw = object.raw();
        object.move_into_graph(graph)?;
        let made = in_context(context, "cuGraphInstantiateWithFlags", |d| {
            let mut raw: CUgraphExec = std::ptr::null_mut();
            // SAFETY: `raw` is a valid out-pointer; the graph handle is alive.
            let status = unsafe { (d.cuGraphInstantiateWithFlags)(&mut raw, graph.raw(), flags) };
            check("cuGraphInstantiateWithFlags", status).map(|()| raw as usize)
        });
        // The executable (if made) holds its own reference now; the graph gives its back.
        graph.give_back(object_raw);
        Ok(GraphExecHandle(Arc::new(GraphExecBox {
            raw: made?,
            context: context.clone(),
            kept: Some(kept),
        })))
    }

    /// Launches the executable on `stream`. Does not block.
    ///
    /// # Errors
    /// [`HandleError::Driver`] when the launch fails.
    ///
    /// Driver calls: `cuCtxGetCurrent`, `cuCtxSetCurrent` (if needed), `cuGraphLaunch`.
    pub fn launch(&self, stream: &StreamHandle) -> Result<(), HandleError> {
        in_context(&self.0.context, "cuGraphLaunch", |d| {
            // SAFETY: both handles keep their resources alive.
            let status = unsafe { (d.cuGraphLaunch)(self.raw(), stream.raw()) };
            check("cuGraphLaunch", status)
        })
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
            &self.context,
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

/// One reference to a CUDA user object whose payload is a Rust value.
///
/// Made with `CU_USER_OBJECT_NO_DESTRUCTOR_SYNC`; its destructor only queues the payload for
/// the cleanup worker (no lock, no driver call), so the payload (a buffer, a stream, anything
/// `Send`) is dropped on the worker or in [`crate::drain_deferred_cleanup`], where its frees
/// run with their recipes. Move the reference into a graph with
/// [`UserObjectOwnership::move_into_graph`]; dropping it instead releases it.
pub struct UserObjectOwnership {
    raw: usize,
    context: ContextHandle,
    held: bool,
}

impl UserObjectOwnership {
    /// Wraps `payload` in a new user object (one reference, held by the returned value), with
    /// `context` current. Starts the cleanup worker if it is not running.
    ///
    /// # Errors
    /// [`HandleError::Driver`] when the creation fails; the payload is then dropped on the
    /// calling thread.
    ///
    /// Driver calls: `cuCtxGetCurrent`, `cuCtxSetCurrent` (if needed), `cuUserObjectCreate`;
    /// `cuUserObjectRelease` when dropped unmoved.
    pub fn new(
        context: &ContextHandle,
        payload: Box<dyn Any + Send>,
    ) -> Result<UserObjectOwnership, HandleError> {
        ensure_worker();
        let data = Box::into_raw(Box::new(payload));
        let created = in_context(context, "cuUserObjectCreate", |d| {
            let mut raw: CUuserObject = std::ptr::null_mut();
            // SAFETY: `raw` is a valid out-pointer; `data` stays valid until the destructor
            // takes it back, exactly once.
            let status = unsafe {
                (d.cuUserObjectCreate)(
                    &mut raw,
                    data.cast(),
                    Some(user_object_destructor),
                    1,
                    USER_OBJECT_NO_DESTRUCTOR_SYNC,
                )
            };
            check("cuUserObjectCreate", status).map(|()| raw as usize)
        });
        match created {
            Ok(raw) => Ok(UserObjectOwnership {
                raw,
                context: context.clone(),
                held: true,
            }),
            Err(error) => {
                // SAFETY: the driver did not take `data` (creation failed): it is still ours.
                drop(unsafe { Box::from_raw(data) });
                Err(error)
            }
        }
    }

    /// The raw `CUuserObject`.
    pub fn raw(&self) -> CUuserObject {
        self.raw as CUuserObject
    }

    /// Moves this reference into `graph` (`CU_GRAPH_USER_OBJECT_MOVE`): the graph, its clones
    /// and executables now keep the payload alive.
    ///
    /// # Errors
    /// [`HandleError::Driver`] when the driver refuses; the reference is then released, which
    /// queues the payload for deferred cleanup.
    ///
    /// Driver calls: `cuCtxGetCurrent`, `cuCtxSetCurrent` (if needed), `cuGraphRetainUserObject`.
    pub fn move_into_graph(mut self, graph: &GraphHandle) -> Result<(), HandleError> {
        let raw = self.raw;
        in_context(&self.context, "cuGraphRetainUserObject", |d| {
            // SAFETY: we hold one reference to the user object and the graph is alive.
            let status = unsafe {
                (d.cuGraphRetainUserObject)(
                    graph.raw(),
                    raw as CUuserObject,
                    1,
                    GRAPH_USER_OBJECT_MOVE,
                )
            };
            check("cuGraphRetainUserObject", status)
        })?;
        self.held = false;
        Ok(())
    }
}

impl Drop for UserObjectOwnership {
    fn drop(&mut self) {
        if !self.held {
            return;
        }
        let raw = self.raw;
        destroy_in_context(
            "user object",
            "cuUserObjectRelease",
            raw,
            &self.context,
            |d| {
                // SAFETY: we hold exactly one reference and give it up.
                unsafe { (d.cuUserObjectRelease)(raw as CUuserObject, 1) }
            },
        );
    }
}

impl fmt::Debug for UserObjectOwnership {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "UserObjectOwnership(0x{:x}, held {})",
            self.raw, self.held
        )
    }
}

// The graph a stream capture produced (`ops::end_capture`), which the memory crate's builder
// wraps.
impl GraphHandle {
    /// Takes ownership of a graph made by `cuStreamEndCapture` in `context`.
    pub(crate) fn from_captured(raw: CUgraph, context: &ContextHandle) -> GraphHandle {
        GraphHandle(Arc::new(GraphBox {
            raw: raw as usize,
            context: context.clone(),
        }))
    }
}
