//! Conditional graph nodes: `cuGraphConditionalHandleCreate`, and `cuGraphAddNode` /
//! `cuGraphAddNode_v2` for `CU_GRAPH_NODE_TYPE_CONDITIONAL` (IF, WHILE, SWITCH), whose body
//! graphs the driver makes and hands back through `phGraph_out`. Every launch sees a
//! condition's default launch value: kernels, which alone set a condition, are not emulated.

use std::ffi::{c_uint, c_void};

use cuda_sys::types::*;
use cuda_sys::CUresult;

use super::stream::{node_handles, plain_edge_data};
use super::{answer, context_arg, known_flags, need, put, Out};
use crate::codes::{self, Res};
use crate::graph::Condition;
use crate::log::entry;
use crate::state::initialized;

/// `CU_GRAPH_COND_ASSIGN_DEFAULT`: the default value is assigned at every launch.
const COND_ASSIGN_DEFAULT: c_uint = 1;

/// `CU_GRAPH_NODE_TYPE_CONDITIONAL`.
const NODE_TYPE_CONDITIONAL: u32 = 13;

/// `CUDA_CONDITIONAL_NODE_PARAMS`.
#[repr(C)]
struct RawConditionalParams {
    handle: u64,
    ctype: u32,
    size: u32,
    graphs_out: *mut u64,
    ctx: CUcontext,
}

/// `CUgraphNodeParams`: the node type, 12 reserved bytes, a 232-byte union of the per-type
/// parameters (here only the conditional ones are read) and 8 reserved bytes.
#[repr(C)]
struct RawNodeParams {
    node_type: u32,
    reserved0: [i32; 3],
    conditional: RawConditionalParams,
    rest: [i64; 29 - 4],
    reserved2: i64,
}

const _: () = assert!(std::mem::size_of::<RawNodeParams>() == 256);

/// Creates a conditional handle for graph `g`. Documented: flags are 0 or
/// `CU_GRAPH_COND_ASSIGN_DEFAULT` (anything else `CUDA_ERROR_INVALID_VALUE`). The handle lives
/// until its graph is destroyed; the emulator has no kernels that set it, so every launch sees
/// `default_value`, with or without the flag.
#[no_mangle]
pub unsafe extern "C" fn cuGraphConditionalHandleCreate(
    out: *mut u64,
    g: CUgraph,
    ctx: CUcontext,
    default_value: c_uint,
    flags: c_uint,
) -> CUresult {
    // SAFETY: the caller's out-pointer (driver contract).
    let out = unsafe { Out::new(out) };
    answer("cuGraphConditionalHandleCreate", out, |_| {
        known_flags(flags, COND_ASSIGN_DEFAULT)?;
        let mut st = initialized()?;
        let g = g as u64;
        st.graphs.get(&g).ok_or(codes::BAD_HANDLE)?;
        context_arg(&st, ctx)?;
        let handle = st.new_handle();
        st.conditions.insert(
            handle,
            Condition {
                graph: g,
                default: default_value,
            },
        );
        Ok(handle)
    })
}

/// Common part of `cuGraphAddNode` and its `_v2` form (whose edge data must be NULL or plain:
/// the only edges emulated). Only conditional nodes are served; other node types have entry
/// points of their own here and are `CUDA_ERROR_NOT_SUPPORTED` through this one.
///
/// # Safety
/// `deps` holds `n` handles and `edges` is NULL or holds `n` 8-byte items (when `n > 0`);
/// `params` is NULL or a `CUgraphNodeParams`.
unsafe fn add_node(
    function: &'static str,
    ph: *mut CUgraphNode,
    g: CUgraph,
    deps: *const CUgraphNode,
    edges: *const c_void,
    n: usize,
    params: *mut c_void,
) -> Res {
    need(ph)?;
    need(params)?;
    let raw = params.cast::<RawNodeParams>();
    // SAFETY: non-null; the caller's params (driver contract), read field by field.
    let node_type = unsafe { (*raw).node_type };
    if node_type != NODE_TYPE_CONDITIONAL {
        crate::log::note_unsupported(function, &format!("type={node_type}"));
        return Err(codes::NOT_SUPPORTED);
    }
    // SAFETY: per this function's contract.
    let deps = unsafe { node_handles(deps, n)? };
    // SAFETY: per this function's contract.
    unsafe { plain_edge_data(edges, n)? };
    // SAFETY: as above.
    let (cond, ctype, size, ctx) = unsafe {
        let c = &(*raw).conditional;
        (c.handle, c.ctype, c.size, c.ctx)
    };
    let mut st = initialized()?;
    let g = g as u64;
    st.graphs.get(&g).ok_or(codes::BAD_HANDLE)?;
    context_arg(&st, ctx)?;
    let deps = st.node_indices(g, &deps)?;
    let (handle, bodies) = st.add_conditional(g, deps, cond, ctype, size)?;
    // SAFETY: the caller's params and out-pointer (driver contract); `bodies` is the node's
    // array, which the driver owns and keeps as long as the node.
    unsafe {
        (*raw).conditional.graphs_out = bodies.cast_mut();
        put(ph, handle as CUgraphNode)
    }
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphAddNode(
    ph: *mut CUgraphNode,
    g: CUgraph,
    deps: *const CUgraphNode,
    n: usize,
    params: *mut c_void,
) -> CUresult {
    // SAFETY: the caller's arrays and params (driver contract).
    entry("cuGraphAddNode", None, None, |_| unsafe {
        add_node("cuGraphAddNode", ph, g, deps, std::ptr::null(), n, params)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphAddNode_v2(
    ph: *mut CUgraphNode,
    g: CUgraph,
    deps: *const CUgraphNode,
    edges: *const c_void,
    n: usize,
    params: *mut c_void,
) -> CUresult {
    // SAFETY: the caller's arrays and params (driver contract).
    entry("cuGraphAddNode_v2", None, None, |_| unsafe {
        add_node("cuGraphAddNode_v2", ph, g, deps, edges, n, params)
    })
}
