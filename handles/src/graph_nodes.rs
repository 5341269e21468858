//! Graph nodes that keep what they touch alive: [`GraphNode`], the memset, memcpy,
//! host-function and empty nodes of a [`GraphHandle`], [`GraphHandle::clone_graph`], and the
//! explicit keep-alives for work custody does not see (a kernel another library captured or
//! added): [`retain_in_capture`], [`GraphHandle::retain`], [`GraphExecHandle::retain`].
//!
//! Every node that touches memory, and every host-function node, owns one CUDA user object
//! whose payload holds what the node needs: clones of the [`DevicePtrHandle`]s it reads or
//! writes, or the host function's closure. The user object is moved into the graph *before*
//! the node is added, so no node ever exists without its retention; the driver copies the
//! reference into clones, executables and in-flight launches (docs/driver-facts.md G1-G3), and when
//! the last one goes its destructor only queues the payload for the cleanup worker
//! (`deferred.rs`), which drops the handles: each frees with its recipe as it is *then*
//! (docs/decisions.md D4, D7). See `handles/DESIGN.md`, "Graph attachments".

use std::any::Any;
use std::ffi::c_void;
use std::fmt;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, PoisonError, Weak};

use cuda_sys::types::{
    CUcontext, CUgraph, CUgraphNode, CUmemorytype, CUuserObject, CUDA_HOST_NODE_PARAMS,
    CUDA_MEMCPY3D, CUDA_MEMSET_NODE_PARAMS,
};

use crate::context::in_context;
use crate::context::ContextHandle;
use crate::deviceptr::DevicePtrHandle;
use crate::error::HandleError;
use crate::graph::{GraphBox, GraphExecHandle, GraphHandle};
use crate::report::{report, CleanupStep, Consequence, Subject};
use crate::stream::{capture_state, CaptureState, StreamHandle};
use crate::sys::{check, check_token};
use crate::user_object::UserObjectOwnership;

/// A node of one graph, as returned by the `add_*_node` functions of [`GraphHandle`]; pass it
/// as a dependency of later nodes of the same graph.
///
/// A node is not an owned resource: it lives as long as its graph. It remembers its graph
/// weakly, so using it with another graph (a clone included) is refused before any driver call,
/// and it never keeps a graph alive.
#[derive(Clone)]
pub struct GraphNode {
    raw: usize,
    graph: Weak<GraphBox>,
}

impl GraphNode {
    /// The raw `CUgraphNode`, valid while its graph lives.
    pub fn raw(&self) -> CUgraphNode {
        self.raw as CUgraphNode
    }

    /// Whether this node belongs to `graph`.
    pub fn belongs_to(&self, graph: &GraphHandle) -> bool {
        std::ptr::eq(self.graph.as_ptr(), Arc::as_ptr(&graph.0))
    }
}

impl PartialEq for GraphNode {
    fn eq(&self, other: &GraphNode) -> bool {
        self.raw == other.raw && Weak::ptr_eq(&self.graph, &other.graph)
    }
}

impl Eq for GraphNode {}

impl fmt::Debug for GraphNode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "GraphNode(0x{:x})", self.raw)
    }
}

/// What a node's user object keeps alive: the memory it touches, or a host function. Never
/// read: it is held for its drop, which the cleanup worker runs.
#[allow(dead_code)]
enum Attachment {
    Memory(Vec<DevicePtrHandle>),
    HostFunction(Box<HostFunction>),
}

/// A host function as a graph node runs it: behind one more box, so that the node's user data
/// is a thin pointer whose target never moves while the attachment lives.
type HostFunction = Box<dyn Fn() + Send + Sync>;

/// The `CUhostFn` of every host-function node: runs the closure, catching a panic (it must not
/// unwind into the driver). Runs on a driver thread, where no CUDA call may be made (G4).
extern "C" fn run_host_function(data: *mut c_void) {
    // SAFETY: `data` points at the `HostFunction` boxed in this node's attachment, which the
    // node's user object owns. The graph, its clones, its executables and every in-flight
    // launch hold a reference to that user object, so the attachment (and the closure) is
    // dropped only after the last launch that can run this node has finished.
    let function = unsafe { &*data.cast::<HostFunction>() };
    if catch_unwind(AssertUnwindSafe(function)).is_err() {
        crate::report::stderr_line(format_args!(
            "custody: a graph host function panicked; the panic was caught"
        ));
    }
}

/// The memory of `ptrs` without repeats (a copy within one allocation retains it once).
fn distinct(ptrs: &[&DevicePtrHandle]) -> Vec<DevicePtrHandle> {
    let mut out: Vec<DevicePtrHandle> = Vec::with_capacity(ptrs.len());
    for ptr in ptrs {
        if !out.iter().any(|seen| seen.ptr_eq(ptr)) {
            out.push((*ptr).clone());
        }
    }
    out
}

/// The driver's signature shared by `cuGraphAddMemsetNode` and `cuGraphAddMemcpyNode`, whose
/// parameters are `P`.
type MemoryNodeCall<P> = unsafe extern "C" fn(
    *mut CUgraphNode,
    CUgraph,
    *const CUgraphNode,
    usize,
    *const P,
    CUcontext,
) -> cuda_sys::CUresult;

fn range_error(what: &'static str, needed: usize, have: usize) -> HandleError {
    HandleError::invalid(
        what,
        format!("the node covers {needed} bytes and the allocation holds {have}"),
    )
}

impl GraphHandle {
    /// The raw dependency list for a node of this graph.
    fn dependencies(&self, deps: &[GraphNode]) -> Result<Vec<CUgraphNode>, HandleError> {
        deps.iter()
            .map(|node| {
                if node.belongs_to(self) {
                    Ok(node.raw())
                } else {
                    Err(HandleError::invalid(
                        "dependencies",
                        "a dependency is a node of another graph",
                    ))
                }
            })
            .collect()
    }

    /// Adds one node with `add`, after moving a user object that owns `attachment` into the
    /// graph; if the node cannot be added, the graph's reference is released again (the
    /// attachment then goes to the cleanup worker).
    fn add_attached(
        &self,
        attachment: Attachment,
        call: &'static str,
        add: impl FnOnce(&'static cuda_sys::Driver, &mut CUgraphNode) -> u32,
    ) -> Result<GraphNode, HandleError> {
        let object = UserObjectOwnership::new(self.context(), Box::new(attachment))?;
        let object_raw = object.raw();
        object.move_into_graph(self)?;
        let added = self.add_plain(call, add);
        if added.is_err() {
            self.give_back(object_raw);
        }
        added
    }

    /// Adds a memset or copy node with `add` (the driver's `call`: `cuGraphAddMemsetNode` or
    /// `cuGraphAddMemcpyNode`) from `params`, after `deps` (raw nodes of this graph); the node
    /// retains `memory`, in which every range of `params` lies (see [`GraphHandle::add_attached`]).
    fn add_memory_node<P>(
        &self,
        memory: &[&DevicePtrHandle],
        call: &'static str,
        add: fn(&cuda_sys::Driver) -> MemoryNodeCall<P>,
        deps: &[CUgraphNode],
        params: &P,
    ) -> Result<GraphNode, HandleError> {
        let (graph, context) = (self.raw(), self.context().raw());
        self.add_attached(Attachment::Memory(distinct(memory)), call, |d, node| {
            // SAFETY: `node` is a valid out-pointer, `deps` holds nodes of this live graph,
            // `params` is read during the call only, the ranges it names lie in `memory`, which
            // the attachment keeps alive, and the graph's context is alive and current.
            unsafe { add(d)(node, graph, deps.as_ptr(), deps.len(), params, context) }
        })
    }

    /// Gives back the one reference to user object `object` that was moved into this graph
    /// (`cuGraphReleaseUserObject`); a failure is reported: the graph then keeps the
    /// attachment until it goes (kept, not lost).
    pub(super) fn give_back(&self, object: CUuserObject) {
        let graph = self.raw();
        let undone = in_context(self.context(), "cuGraphReleaseUserObject", |d| {
            // SAFETY: the graph is alive and holds the one reference moved into it by the
            // caller, which gives up that reference here.
            let status = unsafe { (d.cuGraphReleaseUserObject)(graph, object, 1) };
            check("cuGraphReleaseUserObject", status)
        });
        if let Err(error) = undone {
            report(
                Subject::new(
                    "graph attachment",
                    "cuGraphReleaseUserObject",
                    object as u64,
                    0,
                    self.context().raw_usize() as u64,
                ),
                CleanupStep::Operation,
                Consequence::KeptByGraph,
                error,
            );
        }
    }

    /// Makes this graph retain `ptrs` without adding a node: for work on that memory that
    /// custody does not see, such as a kernel another library added to the graph or captured
    /// into it. One user object owning clones of the handles is moved into the graph, as a
    /// node's is; its clones, the executables instantiated from it afterwards and their
    /// launches hold it too (executables made before do not: use [`GraphExecHandle::retain`]).
    /// The memory is freed with its recipe as it is when the last of them goes, by deferred
    /// cleanup. Retaining the same memory again adds one more reference, no second free. A
    /// per-thread-default-stream recipe needs nothing more: the free, on whichever thread,
    /// is ordered after the recording thread's work (docs/decisions.md D6). An empty `ptrs`
    /// does nothing (no driver call).
    ///
    /// Memory allocated by a graph (a graph allocation) must not be retained: its free belongs
    /// to the graph or to its stream.
    ///
    /// # Errors
    /// [`HandleError::Driver`] when the user object cannot be made or moved into the graph;
    /// nothing is retained then.
    ///
    /// Driver calls: `cuCtxGetCurrent`, `cuCtxSetCurrent` (if needed), `cuUserObjectCreate`,
    /// `cuGraphRetainUserObject`.
    pub fn retain(&self, ptrs: &[&DevicePtrHandle]) -> Result<(), HandleError> {
        let retained = distinct(ptrs);
        if retained.is_empty() {
            return Ok(());
        }
        let attachment: Box<dyn Any + Send> = Box::new(Attachment::Memory(retained.clone()));
        let object = UserObjectOwnership::new(self.context(), attachment)?;
        object.move_into_graph(self)?;
        Ok(())
    }

    /// Adds one node that retains nothing.
    fn add_plain(
        &self,
        call: &'static str,
        add: impl FnOnce(&'static cuda_sys::Driver, &mut CUgraphNode) -> u32,
    ) -> Result<GraphNode, HandleError> {
        let raw = in_context(self.context(), call, |d| {
            let mut node: CUgraphNode = std::ptr::null_mut();
            let status = add(d, &mut node);
            check(call, status).map(|()| node as usize)
        })?;
        Ok(GraphNode {
            raw,
            graph: Arc::downgrade(&self.0),
        })
    }

    /// Adds a node that does nothing, after `deps`: a join point.
    ///
    /// # Errors
    /// [`HandleError::InvalidArgument`] for a dependency of another graph (no driver call);
    /// [`HandleError::Driver`] when the driver refuses.
    ///
    /// Driver calls: `cuCtxGetCurrent`, `cuCtxSetCurrent` (if needed), `cuGraphAddEmptyNode`.
    pub fn add_empty_node(&self, deps: &[GraphNode]) -> Result<GraphNode, HandleError> {
        let deps = self.dependencies(deps)?;
        let graph = self.raw();
        self.add_plain("cuGraphAddEmptyNode", |d, node| {
            // SAFETY: `node` is a valid out-pointer, `deps` holds nodes of this live graph.
            unsafe { (d.cuGraphAddEmptyNode)(node, graph, deps.as_ptr(), deps.len()) }
        })
    }

    /// Adds a node that sets `count` elements of `element_size` bytes (1, 2 or 4) at the start
    /// of `dst` to `value` (its low `8 * element_size` bits), after `deps`. The node retains
    /// `dst`: the memory stays allocated while this graph, a clone, an executable or a launch
    /// may still write it, and is then freed with its recipe by the cleanup worker.
    ///
    /// # Errors
    /// [`HandleError::InvalidArgument`] (no driver call) for a dependency of another graph, an
    /// element size other than 1, 2 or 4, zero elements, a range past the end of `dst`, or a
    /// `dst` not aligned to `element_size`; [`HandleError::Driver`] when the driver refuses
    /// (the retention is then undone).
    ///
    /// Driver calls: `cuCtxGetCurrent`, `cuCtxSetCurrent` (if needed), `cuUserObjectCreate`,
    /// `cuGraphRetainUserObject`, `cuGraphAddMemsetNode` (and `cuGraphReleaseUserObject` if
    /// that fails).
    pub fn add_memset_node(
        &self,
        deps: &[GraphNode],
        dst: &DevicePtrHandle,
        value: u32,
        element_size: u32,
        count: usize,
    ) -> Result<GraphNode, HandleError> {
        let raw_deps = self.dependencies(deps)?;
        if !matches!(element_size, 1 | 2 | 4) {
            return Err(HandleError::invalid(
                "element_size",
                format!("{element_size} bytes; an element is 1, 2 or 4 bytes"),
            ));
        }
        if count == 0 {
            return Err(HandleError::invalid(
                "count",
                "a memset node sets at least one element",
            ));
        }
        let bytes = count
            .checked_mul(element_size as usize)
            .ok_or_else(|| HandleError::invalid("count", "the range overflows"))?;
        if bytes > dst.size() {
            return Err(range_error("dst", bytes, dst.size()));
        }
        if !dst.ptr().is_multiple_of(u64::from(element_size)) {
            return Err(HandleError::invalid(
                "dst",
                format!("the address is not aligned to {element_size} bytes"),
            ));
        }
        let params = CUDA_MEMSET_NODE_PARAMS {
            dst: dst.ptr(),
            pitch: 0,
            value,
            elementSize: element_size,
            width: count,
            height: 1,
        };
        self.add_memory_node(
            &[dst],
            "cuGraphAddMemsetNode",
            |d| d.cuGraphAddMemsetNode,
            &raw_deps,
            &params,
        )
    }

    /// Adds a node that copies `size` bytes from the start of `src` to the start of `dst`,
    /// after `deps`. Either may be device, pinned host or managed memory (unified addressing
    /// tells the driver which). The node retains both, as [`GraphHandle::add_memset_node`]
    /// does.
    ///
    /// # Errors
    /// [`HandleError::InvalidArgument`] (no driver call) for a dependency of another graph,
    /// zero bytes, or a range past the end of either; [`HandleError::Driver`] when the driver
    /// refuses (the retention is then undone).
    ///
    /// Driver calls: `cuCtxGetCurrent`, `cuCtxSetCurrent` (if needed), `cuUserObjectCreate`,
    /// `cuGraphRetainUserObject`, `cuGraphAddMemcpyNode` (and `cuGraphReleaseUserObject` if
    /// that fails).
    pub fn add_memcpy_node(
        &self,
        deps: &[GraphNode],
        dst: &DevicePtrHandle,
        src: &DevicePtrHandle,
        size: usize,
    ) -> Result<GraphNode, HandleError> {
        let raw_deps = self.dependencies(deps)?;
        if size == 0 {
            return Err(HandleError::invalid(
                "size",
                "a memcpy node copies at least one byte",
            ));
        }
        if size > dst.size() {
            return Err(range_error("dst", size, dst.size()));
        }
        if size > src.size() {
            return Err(range_error("src", size, src.size()));
        }
        let params = CUDA_MEMCPY3D {
            srcXInBytes: 0,
            srcY: 0,
            srcZ: 0,
            srcLOD: 0,
            srcMemoryType: CUmemorytype::CU_MEMORYTYPE_UNIFIED,
            srcHost: std::ptr::null(),
            srcDevice: src.ptr(),
            srcArray: std::ptr::null_mut(),
            reserved0: std::ptr::null_mut(),
            srcPitch: 0,
            srcHeight: 0,
            dstXInBytes: 0,
            dstY: 0,
            dstZ: 0,
            dstLOD: 0,
            dstMemoryType: CUmemorytype::CU_MEMORYTYPE_UNIFIED,
            dstHost: std::ptr::null_mut(),
            dstDevice: dst.ptr(),
            dstArray: std::ptr::null_mut(),
            reserved1: std::ptr::null_mut(),
            dstPitch: 0,
            dstHeight: 0,
            WidthInBytes: size,
            Height: 1,
            Depth: 1,
        };
        self.add_memory_node(
            &[dst, src],
            "cuGraphAddMemcpyNode",
            |d| d.cuGraphAddMemcpyNode,
            &raw_deps,
            &params,
        )
    }

    /// Adds a node that calls `function` on a driver thread when a launch reaches it, after
    /// `deps`. The closure is kept alive like retained memory: it is dropped by the cleanup
    /// worker after the graph, its clones, executables and launches are gone, so whatever it
    /// owns (a buffer, say) is released there.
    ///
    /// `function` must make no CUDA call, directly or through custody (docs/driver-facts.md G4: the
    /// driver may fail or deadlock), and should return promptly: the stream waits for it. It
    /// may run on several launches at once. A panic is caught and written to stderr.
    ///
    /// # Errors
    /// [`HandleError::InvalidArgument`] for a dependency of another graph (no driver call);
    /// [`HandleError::Driver`] when the driver refuses (the closure then goes to the cleanup
    /// worker).
    ///
    /// Driver calls: `cuCtxGetCurrent`, `cuCtxSetCurrent` (if needed), `cuUserObjectCreate`,
    /// `cuGraphRetainUserObject`, `cuGraphAddHostNode` (and `cuGraphReleaseUserObject` if that
    /// fails).
    pub fn add_host_node(
        &self,
        deps: &[GraphNode],
        function: Box<dyn Fn() + Send + Sync>,
    ) -> Result<GraphNode, HandleError> {
        let raw_deps = self.dependencies(deps)?;
        let function: Box<HostFunction> = Box::new(function);
        // The target of this pointer is the inner box's heap slot, which moving the outer box
        // into the attachment does not move.
        let data = (&*function as *const HostFunction)
            .cast_mut()
            .cast::<c_void>();
        let params = CUDA_HOST_NODE_PARAMS {
            fn_: Some(run_host_function),
            userData: data,
        };
        let graph = self.raw();
        self.add_attached(
            Attachment::HostFunction(function),
            "cuGraphAddHostNode",
            |d, node| {
                // SAFETY: `node` is a valid out-pointer, `raw_deps` holds nodes of this live
                // graph; `params.userData` stays valid for as long as the node can run (see
                // `run_host_function`), because its user object was moved into the graph first.
                unsafe {
                    (d.cuGraphAddHostNode)(node, graph, raw_deps.as_ptr(), raw_deps.len(), &params)
                }
            },
        )
    }

    /// A copy of this graph (`cuGraphClone`), owned, in the same context. The copy holds its
    /// own references to every attachment, so the original may go first. Nodes of this graph
    /// are not nodes of the copy.
    ///
    /// # Errors
    /// [`HandleError::Driver`] when the driver refuses.
    ///
    /// Driver calls: `cuCtxGetCurrent`, `cuCtxSetCurrent` (if needed), `cuGraphClone`;
    /// `cuGraphDestroy` when the copy's last handle drops.
    pub fn clone_graph(&self) -> Result<GraphHandle, HandleError> {
        let original = self.raw();
        let raw = in_context(self.context(), "cuGraphClone", |d| {
            let mut raw: CUgraph = std::ptr::null_mut();
            // SAFETY: `raw` is a valid out-pointer read after success; the graph is alive.
            let status = unsafe { (d.cuGraphClone)(&mut raw, original) };
            check("cuGraphClone", status).map(|()| raw as usize)
        })?;
        Ok(GraphHandle(Arc::new(GraphBox {
            raw,
            context: self.context().clone(),
            allocations: self.0.allocations.clone(),
        })))
    }
}

impl GraphExecHandle {
    /// Makes this executable retain `ptrs`: for work on that memory that custody does not see
    /// (a kernel another library put into the graph). Clones of the handles join the
    /// executable's own attachment (made by [`GraphExecHandle::instantiate`]), which this
    /// executable and its launches in flight hold, and no graph definition, copy or other
    /// executable does: the memory is freed with its recipe as it is when the executable is
    /// destroyed and its last launch has finished (docs/driver-facts.md G2, G3), by deferred
    /// cleanup. Each allocation is held once, however often it is retained.
    ///
    /// Launches queued before the call are covered too: they hold the same attachment. A
    /// retention orders nothing; it only keeps the memory allocated.
    ///
    /// Cannot fail. Driver calls: none.
    pub fn retain(&self, ptrs: &[&DevicePtrHandle]) {
        let retained = distinct(ptrs);
        if let Some(kept) = &self.0.kept {
            let mut kept = kept.lock().unwrap_or_else(PoisonError::into_inner);
            for ptr in &retained {
                if !kept.iter().any(|seen| seen.ptr_eq(ptr)) {
                    kept.push(ptr.clone());
                }
            }
        }
    }
}

/// Makes the graph that `stream` is capturing into retain `ptrs` (a user object owning clones
/// of the handles, referenced by the capture graph and so by the graph the capture produces,
/// its clones, executables and launches), for work on that memory recorded by the capture.
///
/// The capture must not end on another thread during the call. Memory allocated by the graph
/// itself (a graph allocation made during this capture) must not be retained: its free belongs
/// to the graph or to its stream.
///
/// # Errors
/// [`HandleError::InvalidArgument`] when `stream` is not capturing (or its capture was
/// invalidated); [`HandleError::NoCurrentContext`] for an unbound token with no context;
/// [`HandleError::Driver`] when the driver refuses.
///
/// Driver calls: `cuCtxGetCurrent`, `cuCtxSetCurrent` (if needed),
/// `cuStreamGetCaptureInfo_v2`, `cuUserObjectCreate`, `cuGraphRetainUserObject`,
/// `cuUserObjectRelease`.
pub fn retain_in_capture(
    stream: &StreamHandle,
    ptrs: &[&DevicePtrHandle],
) -> Result<(), HandleError> {
    let context = match stream.context() {
        Some(context) => context.clone(),
        None => ContextHandle::current()?.ok_or(HandleError::NoCurrentContext)?,
    };
    let token = stream.is_unbound_token();
    let raw_stream = stream.raw();
    let graph = in_context(&context, "cuStreamGetCaptureInfo_v2", |d| {
        match capture_state(d, raw_stream) {
            CaptureState::Capturing { graph, .. } => Ok(graph),
            CaptureState::Unknown(status) => {
                check_token("cuStreamGetCaptureInfo_v2", status, token).map(|()| 0)
            }
            // The legacy stream while a blocking stream captures.
            CaptureState::Blocked => Err(crate::sys::error("cuStreamGetCaptureInfo_v2", 906)),
            CaptureState::Free | CaptureState::Invalidated { .. } => Err(HandleError::invalid(
                "stream",
                "the stream is not capturing (or its capture was invalidated)",
            )),
        }
    })?;
    let retained = distinct(ptrs);
    let attachment: Box<dyn Any + Send> = Box::new(Attachment::Memory(retained.clone()));
    let object = UserObjectOwnership::new(&context, attachment)?;
    // The capture graph is alive while the capture runs (the caller does not end it meanwhile).
    object.retain_in_raw_graph(graph as CUgraph)?;
    // Our reference goes; the capture graph's remains.
    drop(object);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn graph_node_debug_prints_the_raw_value_in_hex() {
        let node = GraphNode {
            raw: 0x10,
            graph: Weak::new(),
        };
        assert_eq!(node.clone(), node);
        assert_eq!(format!("{node:?}"), "GraphNode(0x10)");
    }

    #[test]
    fn distinct_keeps_one_handle_per_allocation() {
        let a = DevicePtrHandle::borrowed(0x1000, 64);
        let b = DevicePtrHandle::borrowed(0x2000, 64);
        assert_eq!(distinct(&[&a, &a]).len(), 1);
        assert_eq!(distinct(&[&a, &b]).len(), 2);
    }
}
