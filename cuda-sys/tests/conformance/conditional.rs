//! Conditional graph nodes, as NVIDIA's cuda.core builds them in its graph definitions:
//! `cuGraphConditionalHandleCreate`, then `cuGraphAddNode` with `CU_GRAPH_NODE_TYPE_CONDITIONAL`
//! parameters (IF with one or two bodies, WHILE, SWITCH with N), for which the driver makes the
//! body graphs and hands them back through `phGraph_out`.
//!
//! Neither entry point is in custody's loader list: the cases resolve them by their base name
//! with `cuGetProcAddress_v2` for CUDA 13.0, as cuda.core does (`cuGraphAddNode` gives the
//! `_v2` form, with edge data). *Measured* marks what NVIDIA's cuda.core 1.2 test suite on an
//! H200 (driver 580.159.04, CUDA 13.0) passed a test for; the other cases assert what the CUDA
//! driver API reference states, and passed on the H200 on 2026-12-01.
//! No case launches a WHILE node with a non-zero condition: with no kernel to clear it, a GPU
//! would loop for ever (the emulator refuses that launch with `CUDA_ERROR_NOT_SUPPORTED`).

use std::ffi::{c_int, c_uint, c_void, CStr};
use std::ptr;

use cuda_sys::types::{
    CUcontext, CUgraph, CUgraphNode, CUstream, CUstreamCaptureMode, CUDA_MEMSET_NODE_PARAMS,
};
use cuda_sys::{CUresult, CudaErrorCode};

use crate::driver::{
    get_proc_address, graph_add_memset_node, graph_create, graph_destroy, graph_exec_destroy,
    graph_instantiate, graph_launch, init, mem_alloc, mem_free, memcpy_dtoh, memset_d8,
    memset_d8_async, stream_create, stream_destroy, stream_end_capture, stream_synchronize, Ret,
};
use crate::support::{on_fresh_thread, primary_current};

/// `CU_GRAPH_COND_ASSIGN_DEFAULT`.
const ASSIGN_DEFAULT: c_uint = 1;
/// `CUgraphConditionalNodeType`: IF, WHILE, SWITCH.
const IF: u32 = 0;
const WHILE: u32 = 1;
const SWITCH: u32 = 2;
/// `CU_GRAPH_NODE_TYPE_CONDITIONAL`.
const NODE_TYPE_CONDITIONAL: u32 = 13;
const GLOBAL: CUstreamCaptureMode = CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_GLOBAL;

type HandleCreate = unsafe extern "C" fn(*mut u64, CUgraph, CUcontext, c_uint, c_uint) -> CUresult;
type AddNode = unsafe extern "C" fn(
    *mut CUgraphNode,
    CUgraph,
    *const CUgraphNode,
    *const c_void,
    usize,
    *mut NodeParams,
) -> CUresult;
type NodeGetType = unsafe extern "C" fn(CUgraphNode, *mut c_uint) -> CUresult;
type GraphGetNodes = unsafe extern "C" fn(CUgraph, *mut CUgraphNode, *mut usize) -> CUresult;

/// `CUgraphNodeParams` with its union read as `CUDA_CONDITIONAL_NODE_PARAMS` (handle, type,
/// size, `phGraph_out`, context) followed by the rest of the union and the reserved tail.
#[repr(C)]
struct NodeParams {
    node_type: u32,
    reserved0: [c_int; 3],
    handle: u64,
    cond_type: u32,
    size: u32,
    graphs_out: *mut CUgraph,
    ctx: CUcontext,
    rest: [i64; 25],
    reserved2: i64,
}

const _: () = assert!(std::mem::size_of::<NodeParams>() == 256);

/// The entry point `cuGetProcAddress_v2` gives for base name `name` and CUDA 13.0.
#[track_caller]
fn entry_point(name: &CStr) -> *mut c_void {
    let (pfn, status) = get_proc_address(name, 13000).check();
    assert!(
        !pfn.is_null() && status == 0,
        "cuGetProcAddress_v2({name:?}, 13000) gave {pfn:?}, symbol status {status}"
    );
    pfn
}

/// The two entry points every case uses.
struct Conditional {
    create: HandleCreate,
    add: AddNode,
}

impl Conditional {
    fn resolve() -> Conditional {
        let (create, add) = (
            entry_point(c"cuGraphConditionalHandleCreate"),
            entry_point(c"cuGraphAddNode"),
        );
        // SAFETY: the driver hands these out under the signatures of the CUDA 13.0 headers,
        // which `HandleCreate` and `AddNode` restate.
        unsafe {
            Conditional {
                create: std::mem::transmute::<*mut c_void, HandleCreate>(create),
                add: std::mem::transmute::<*mut c_void, AddNode>(add),
            }
        }
    }

    /// `cuGraphConditionalHandleCreate(graph, ctx, default, flags)`.
    fn handle(&self, graph: CUgraph, ctx: CUcontext, default: c_uint, flags: c_uint) -> Ret<u64> {
        let mut handle = 0u64;
        // SAFETY: a valid out-pointer and the case's live graph and context.
        let status = unsafe { (self.create)(&mut handle, graph, ctx, default, flags) };
        Ret::with_value("cuGraphConditionalHandleCreate", status, handle)
    }

    /// `cuGraphAddNode_v2` of a conditional node with no dependencies: the node and its body
    /// graphs (read from `phGraph_out`; empty when the call failed).
    fn add(
        &self,
        graph: CUgraph,
        ctx: CUcontext,
        handle: u64,
        cond_type: u32,
        size: u32,
    ) -> Ret<(CUgraphNode, Vec<CUgraph>)> {
        let mut params = NodeParams {
            node_type: NODE_TYPE_CONDITIONAL,
            reserved0: [0; 3],
            handle,
            cond_type,
            size,
            graphs_out: ptr::null_mut(),
            ctx,
            rest: [0; 25],
            reserved2: 0,
        };
        let mut node = ptr::null_mut();
        // SAFETY: valid locals; no dependencies (so no edge data).
        let status =
            unsafe { (self.add)(&mut node, graph, ptr::null(), ptr::null(), 0, &mut params) };
        let bodies = if status == 0 && !params.graphs_out.is_null() {
            // SAFETY: on success the driver's array holds `size` graphs (documented).
            unsafe { std::slice::from_raw_parts(params.graphs_out, size as usize).to_vec() }
        } else {
            Vec::new()
        };
        Ret::with_value("cuGraphAddNode_v2", status, (node, bodies))
    }
}

/// Measured (`test_object_protocols.py`'s `sample_condition`, `sample_if_node`,
/// `sample_if_else_node`, `sample_while_node` and `sample_switch_node` fixtures, which passed
/// on the H200): a conditional handle of default value 1 is made for a graph, and conditional
/// nodes IF with one and with two bodies, WHILE and SWITCH with three are added to it, each with
/// as many body graphs as asked for, handed back through `phGraph_out`. That the body graphs
/// are all different is what cuda.core's distinct `GraphDefinition`s of the branches imply.
#[test]
fn conditional_nodes_come_with_their_body_graphs() {
    on_fresh_thread("conditional-nodes", || {
        init();
        let primary = primary_current();
        let cond = Conditional::resolve();
        let graph = graph_create().check();
        let mut seen = Vec::new();
        for (cond_type, size) in [(IF, 1), (IF, 2), (WHILE, 1), (SWITCH, 3)] {
            let handle = cond.handle(graph, primary.ctx(), 1, ASSIGN_DEFAULT).check();
            assert_ne!(handle, 0, "a conditional handle");
            let (node, bodies) = cond
                .add(graph, primary.ctx(), handle, cond_type, size)
                .check();
            assert!(!node.is_null());
            assert_eq!(
                bodies.len(),
                size as usize,
                "phGraph_out of type {cond_type}"
            );
            for body in bodies {
                assert!(!body.is_null() && body != graph && !seen.contains(&body));
                seen.push(body);
            }
        }
        graph_destroy(graph).check();
    });
}

/// Documented: a conditional node's type is `CU_GRAPH_NODE_TYPE_CONDITIONAL` and its body
/// graphs start empty; a body count other than 1 for WHILE, 1 or 2 for IF, or at least 1 for
/// SWITCH, and handle flags other than 0 or `CU_GRAPH_COND_ASSIGN_DEFAULT`, are
/// `CUDA_ERROR_INVALID_VALUE`.
#[test]
fn conditional_node_type_bodies_and_limits() {
    on_fresh_thread("conditional-limits", || {
        init();
        let primary = primary_current();
        let ctx = primary.ctx();
        let cond = Conditional::resolve();
        let get_type = entry_point(c"cuGraphNodeGetType");
        let get_nodes = entry_point(c"cuGraphGetNodes");
        // SAFETY: the CUDA 13.0 signatures, restated by the types.
        let (get_type, get_nodes) = unsafe {
            (
                std::mem::transmute::<*mut c_void, NodeGetType>(get_type),
                std::mem::transmute::<*mut c_void, GraphGetNodes>(get_nodes),
            )
        };
        let graph = graph_create().check();
        cond.handle(graph, ctx, 0, 2)
            .fails_with(CudaErrorCode::INVALID_VALUE);
        let handle = cond.handle(graph, ctx, 0, 0).check();
        for (cond_type, size) in [(IF, 0), (IF, 3), (WHILE, 2), (SWITCH, 0)] {
            cond.add(graph, ctx, handle, cond_type, size)
                .fails_with(CudaErrorCode::INVALID_VALUE);
        }
        let (node, bodies) = cond.add(graph, ctx, handle, IF, 2).check();
        let mut kind = u32::MAX;
        // SAFETY: a live node and a valid out-pointer.
        let status = unsafe { get_type(node, &mut kind) };
        Ret::from_status("cuGraphNodeGetType", status).check();
        assert_eq!(kind, NODE_TYPE_CONDITIONAL);
        for body in bodies {
            let mut count = usize::MAX;
            // SAFETY: a live graph; NULL asks for the count only.
            let status = unsafe { get_nodes(body, ptr::null_mut(), &mut count) };
            Ret::from_status("cuGraphGetNodes", status).check();
            assert_eq!(count, 0, "a new body graph is empty");
        }
        graph_destroy(graph).check();
    });
}

/// One byte-wide memset of `value` over 16 bytes at `dst`.
fn fill16(dst: u64, value: u8) -> CUDA_MEMSET_NODE_PARAMS {
    CUDA_MEMSET_NODE_PARAMS {
        dst,
        pitch: 0,
        value: u32::from(value),
        elementSize: 1,
        width: 16,
        height: 1,
    }
}

/// Documented: with `CU_GRAPH_COND_ASSIGN_DEFAULT` the default value is the condition's value
/// at the start of every launch; IF runs its first body when the value is non-zero and its
/// second when it is zero; SWITCH runs body `value` and none when the value is out of range.
/// Each body here holds one memset node (allowed in a body) that marks the buffer.
#[test]
fn conditional_default_value_chooses_the_body() {
    on_fresh_thread("conditional-launch", || {
        init();
        let primary = primary_current();
        let ctx = primary.ctx();
        let cond = Conditional::resolve();
        let stream = stream_create(0).check();
        let buffer = mem_alloc(16).check();
        // (type, bodies, default value, the mark expected afterwards: 0 = none ran)
        let cases: [(u32, u32, c_uint, u8); 5] = [
            (IF, 2, 1, 1),
            (IF, 2, 0, 2),
            (IF, 1, 0, 0),
            (SWITCH, 3, 2, 3),
            (SWITCH, 3, 7, 0),
        ];
        for (cond_type, size, default, expected) in cases {
            memset_d8(buffer, 0, 16).check();
            let graph = graph_create().check();
            let handle = cond.handle(graph, ctx, default, ASSIGN_DEFAULT).check();
            let (_, bodies) = cond.add(graph, ctx, handle, cond_type, size).check();
            for (k, &body) in bodies.iter().enumerate() {
                graph_add_memset_node(body, &fill16(buffer, k as u8 + 1), ctx).check();
            }
            let exec = graph_instantiate(graph).check();
            graph_launch(exec, stream).check();
            stream_synchronize(stream).check();
            let bytes = memcpy_dtoh(buffer, 16).check();
            assert_eq!(
                bytes,
                vec![expected; 16],
                "type {cond_type} with {size} bodies and default {default}"
            );
            graph_exec_destroy(exec).check();
            graph_destroy(graph).check();
        }
        mem_free(buffer).check();
        stream_destroy(stream).check();
    });
}

type BeginCaptureToGraph = unsafe extern "C" fn(
    CUstream,
    CUgraph,
    *const CUgraphNode,
    *const c_void,
    usize,
    CUstreamCaptureMode,
) -> CUresult;
type UpdateCaptureDependencies =
    unsafe extern "C" fn(CUstream, *mut CUgraphNode, *const c_void, usize, c_uint) -> CUresult;

/// Documented (and what cuda.core's `GraphBuilder.if_then` does, which
/// `graph/test_graph_builder.py::test_graph_definition_conditional_body_during_capture_raises`
/// passed on the H200 with, though through a capture that made its own graph): a capture into
/// an existing graph (`cuStreamBeginCaptureToGraph`) ends with that graph; a conditional node
/// added to it by hand becomes what the stream's next work depends on after
/// `cuStreamUpdateCaptureDependencies` with `CU_STREAM_SET_CAPTURE_DEPENDENCIES` (1); a second
/// stream captures into the node's body graph and ends with it.
#[test]
fn conditional_node_built_in_a_capture() {
    on_fresh_thread("conditional-capture", || {
        init();
        let primary = primary_current();
        let ctx = primary.ctx();
        let cond = Conditional::resolve();
        let begin_to_graph = entry_point(c"cuStreamBeginCaptureToGraph");
        let update_deps = entry_point(c"cuStreamUpdateCaptureDependencies");
        let get_nodes = entry_point(c"cuGraphGetNodes");
        // SAFETY: the CUDA 13.0 signatures, restated by the types.
        let (begin_to_graph, update_deps, get_nodes) = unsafe {
            (
                std::mem::transmute::<*mut c_void, BeginCaptureToGraph>(begin_to_graph),
                std::mem::transmute::<*mut c_void, UpdateCaptureDependencies>(update_deps),
                std::mem::transmute::<*mut c_void, GraphGetNodes>(get_nodes),
            )
        };
        let (outer, inner) = (stream_create(0).check(), stream_create(0).check());
        let buffer = mem_alloc(16).check();
        let graph = graph_create().check();
        // SAFETY: live stream and graph; no dependencies.
        let status = unsafe { begin_to_graph(outer, graph, ptr::null(), ptr::null(), 0, GLOBAL) };
        Ret::from_status("cuStreamBeginCaptureToGraph", status).check();
        let handle = cond.handle(graph, ctx, 1, ASSIGN_DEFAULT).check();
        let (mut node, bodies) = cond.add(graph, ctx, handle, IF, 1).check();
        // SAFETY: a capturing stream and a node of its capture's graph.
        let status = unsafe { update_deps(outer, &mut node, ptr::null(), 1, 1) };
        Ret::from_status("cuStreamUpdateCaptureDependencies_v2", status).check();
        // SAFETY: as above, into the body graph.
        let status =
            unsafe { begin_to_graph(inner, bodies[0], ptr::null(), ptr::null(), 0, GLOBAL) };
        Ret::from_status("cuStreamBeginCaptureToGraph", status).check();
        memset_d8_async(buffer, 7, 16, inner).check();
        assert_eq!(stream_end_capture(inner).check(), bodies[0]);
        memset_d8_async(buffer, 9, 16, outer).check();
        assert_eq!(stream_end_capture(outer).check(), graph);
        for (g, expected) in [(graph, 2), (bodies[0], 1)] {
            let mut count = usize::MAX;
            // SAFETY: a live graph; NULL asks for the count only.
            let status = unsafe { get_nodes(g, ptr::null_mut(), &mut count) };
            Ret::from_status("cuGraphGetNodes", status).check();
            assert_eq!(count, expected, "nodes captured into {g:?}");
        }
        graph_destroy(graph).check();
        mem_free(buffer).check();
        stream_destroy(inner).check();
        stream_destroy(outer).check();
    });
}
