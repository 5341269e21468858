//! Graph entry points beyond building and launching: event record and wait nodes, node and
//! graph queries (type, nodes, dependencies, edges), node removal, instantiation with
//! parameters, upload, and the device's graph memory attributes.

use std::ffi::{c_uint, c_void};

use cuda_sys::types::*;
use cuda_sys::CUresult;

use super::stream::{node_handles, plain_edge_data};
use super::{answer, get_slice, need, put, with_state, Out};
use crate::codes::{self, Res};
use crate::graph::NodeKind;
use crate::log::entry;
use crate::state::{initialized, State};

unsafe fn add_event_node(
    function: &'static str,
    ph: *mut CUgraphNode,
    g: CUgraph,
    deps: *const CUgraphNode,
    n: usize,
    event: CUevent,
    record: bool,
) -> CUresult {
    // SAFETY: the caller's out-pointer (driver contract).
    answer(function, unsafe { Out::new(ph) }, |_| {
        let g = g as u64;
        let event = event as u64;
        // SAFETY: the caller's dependency array (driver contract).
        let deps = unsafe { node_handles(deps, n)? };
        let mut st = initialized()?;
        st.graphs.get(&g).ok_or(codes::BAD_HANDLE)?;
        st.events.get(&event).ok_or(codes::BAD_HANDLE)?;
        let deps = st.node_indices(g, &deps)?;
        let kind = if record {
            NodeKind::EventRecord { event }
        } else {
            NodeKind::EventWait { event }
        };
        let (handle, _) = st.add_node(g, kind, deps)?;
        Ok(handle as CUgraphNode)
    })
}

fn node(st: &State, h: CUgraphNode) -> Res<(u64, usize)> {
    st.nodes.get(&(h as u64)).copied().ok_or(codes::BAD_HANDLE)
}

unsafe fn event_of_node(h: CUgraphNode, out: *mut CUevent, record: bool) -> Res {
    need(out)?;
    let st = initialized()?;
    let (g, i) = node(&st, h)?;
    let kind = st.graphs.get(&g).ok_or(codes::BAD_HANDLE)?.nodes[i].kind;
    let event = match (kind, record) {
        (NodeKind::EventRecord { event }, true) | (NodeKind::EventWait { event }, false) => event,
        _ => return Err(codes::INVALID_VALUE),
    };
    // SAFETY: checked non-null (driver contract).
    unsafe { put(out, event as CUevent) }
}

/// The event node exports, a pair per kind (`record`: record nodes, else wait nodes): the add
/// ([`add_event_node`]) and the query of the node's event ([`event_of_node`]).
macro_rules! event_node_exports {
    ($($add:ident, $event_of:ident => $record:literal;)*) => {$(
        #[no_mangle]
        pub unsafe extern "C" fn $add(
            ph: *mut CUgraphNode,
            g: CUgraph,
            deps: *const CUgraphNode,
            n: usize,
            event: CUevent,
        ) -> CUresult {
            // SAFETY: the caller's pointers (driver contract).
            unsafe { add_event_node(stringify!($add), ph, g, deps, n, event, $record) }
        }

        #[no_mangle]
        pub unsafe extern "C" fn $event_of(h: CUgraphNode, out: *mut CUevent) -> CUresult {
            // SAFETY: the caller's out-pointer (driver contract).
            entry(stringify!($event_of), None, None, |_| unsafe {
                event_of_node(h, out, $record)
            })
        }
    )*};
}

event_node_exports! {
    cuGraphAddEventRecordNode, cuGraphEventRecordNodeGetEvent => true;
    cuGraphAddEventWaitNode, cuGraphEventWaitNodeGetEvent => false;
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphNodeGetType(h: CUgraphNode, out: *mut c_uint) -> CUresult {
    // SAFETY: the caller's out-pointer (driver contract).
    answer("cuGraphNodeGetType", unsafe { Out::new(out) }, |_| {
        let st = initialized()?;
        let (g, i) = node(&st, h)?;
        let code = st.graphs.get(&g).ok_or(codes::BAD_HANDLE)?.nodes[i]
            .kind
            .type_code();
        Ok(code)
    })
}

/// Writes up to `*count` handles to `out` (NULL: only the count) and the full count back.
///
/// # Safety
/// `count` is valid for a read and a write; `out` is NULL or holds `*count` handles.
unsafe fn list(handles: &[u64], out: *mut CUgraphNode, count: *mut usize) -> Res {
    need(count)?;
    if !out.is_null() {
        // SAFETY: per this function's contract.
        let room = unsafe { count.read_unaligned() };
        for (k, &h) in handles.iter().take(room).enumerate() {
            // SAFETY: k < room, per this function's contract.
            unsafe { out.add(k).write_unaligned(h as CUgraphNode) };
        }
        for k in handles.len()..room {
            // SAFETY: as above; the rest reads as NULL (documented).
            unsafe { out.add(k).write_unaligned(std::ptr::null_mut()) };
        }
    }
    // SAFETY: per this function's contract.
    unsafe { put(count, handles.len()) }
}

/// The body of `cuGraphGetNodes` and `cuGraphGetRootNodes` (`function`): [`list`]s the live
/// nodes of graph `g` that `keep` accepts.
///
/// # Safety
/// As [`list`].
unsafe fn list_graph_nodes(
    function: &'static str,
    g: CUgraph,
    out: *mut CUgraphNode,
    count: *mut usize,
    keep: impl Fn(&crate::graph::Node) -> bool,
) -> CUresult {
    with_state(function, |st| {
        let graph = st.graphs.get(&(g as u64)).ok_or(codes::BAD_HANDLE)?;
        let handles: Vec<u64> = graph
            .nodes
            .iter()
            .filter(|n| keep(n) && st.nodes.contains_key(&n.handle))
            .map(|n| n.handle)
            .collect();
        // SAFETY: per this function's contract.
        unsafe { list(&handles, out, count) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphGetNodes(
    g: CUgraph,
    out: *mut CUgraphNode,
    count: *mut usize,
) -> CUresult {
    // SAFETY: the caller's arrays (driver contract).
    unsafe { list_graph_nodes("cuGraphGetNodes", g, out, count, |_| true) }
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphGetRootNodes(
    g: CUgraph,
    out: *mut CUgraphNode,
    count: *mut usize,
) -> CUresult {
    // SAFETY: the caller's arrays (driver contract).
    unsafe { list_graph_nodes("cuGraphGetRootNodes", g, out, count, |n| n.deps.is_empty()) }
}

/// The handles of the nodes `h` depends on (`upstream`) or that depend on it.
fn neighbours(st: &State, h: CUgraphNode, upstream: bool) -> Res<Vec<u64>> {
    let (g, i) = node(st, h)?;
    let graph = st.graphs.get(&g).ok_or(codes::BAD_HANDLE)?;
    Ok(if upstream {
        graph.nodes[i]
            .deps
            .iter()
            .map(|&d| graph.nodes[d].handle)
            .collect()
    } else {
        graph
            .nodes
            .iter()
            .filter(|n| n.deps.contains(&i) && st.nodes.contains_key(&n.handle))
            .map(|n| n.handle)
            .collect()
    })
}

/// Adds (`add`) or removes the edges `from[k] -> to[k]` of graph `g`, all or none. Documented:
/// every node belongs to `g`; adding an edge that exists, or removing one that does not, is an
/// error (`CUDA_ERROR_INVALID_VALUE` here; the code is not measured). Edge data (the `_v2`
/// forms) must be NULL or plain (all zeros), the only edges emulated.
///
/// # Safety
/// `from` and `to` hold `n` node handles and `edges` is NULL or holds `n` 8-byte items, when
/// `n > 0`.
unsafe fn change_edges(
    g: CUgraph,
    from: *const CUgraphNode,
    to: *const CUgraphNode,
    edges: *const c_void,
    n: usize,
    add: bool,
) -> Res {
    // SAFETY: per this function's contract.
    let (from, to) = unsafe { (get_slice(from, n)?, get_slice(to, n)?) };
    // SAFETY: per this function's contract.
    unsafe { plain_edge_data(edges, n)? };
    let mut st = initialized()?;
    let g = g as u64;
    let mut pairs = Vec::with_capacity(n);
    for (&a, &b) in from.iter().zip(&to) {
        let (ga, ia) = node(&st, a)?;
        let (gb, ib) = node(&st, b)?;
        if ga != g || gb != g || ia == ib {
            return Err(codes::INVALID_VALUE);
        }
        pairs.push((ia, ib));
    }
    let graph = st.graphs.get_mut(&g).ok_or(codes::BAD_HANDLE)?;
    let mut deps: Vec<Vec<usize>> = graph.nodes.iter().map(|n| n.deps.clone()).collect();
    for (a, b) in pairs {
        let present = deps[b].iter().position(|&d| d == a);
        match (add, present) {
            (true, None) => deps[b].push(a),
            (false, Some(at)) => {
                deps[b].remove(at);
            }
            _ => return Err(codes::INVALID_VALUE),
        }
    }
    for (node, d) in graph.nodes.iter_mut().zip(deps) {
        node.deps = d;
    }
    Ok(())
}

/// The exports of [`change_edges`]: `cuGraphAddDependencies` and `cuGraphRemoveDependencies`
/// (`add`), each in its first form and in the `_v2` form with edge data.
macro_rules! edge_exports {
    ($($name:ident, $name_v2:ident => $add:literal;)*) => {$(
        #[no_mangle]
        pub unsafe extern "C" fn $name(
            g: CUgraph,
            from: *const CUgraphNode,
            to: *const CUgraphNode,
            n: usize,
        ) -> CUresult {
            // SAFETY: the caller's arrays (driver contract).
            entry(stringify!($name), None, None, |_| unsafe {
                change_edges(g, from, to, std::ptr::null(), n, $add)
            })
        }

        #[no_mangle]
        pub unsafe extern "C" fn $name_v2(
            g: CUgraph,
            from: *const CUgraphNode,
            to: *const CUgraphNode,
            edges: *const c_void,
            n: usize,
        ) -> CUresult {
            // SAFETY: the caller's arrays (driver contract).
            entry(stringify!($name_v2), None, None, |_| unsafe {
                change_edges(g, from, to, edges, n, $add)
            })
        }
    )*};
}

edge_exports! {
    cuGraphAddDependencies, cuGraphAddDependencies_v2 => true;
    cuGraphRemoveDependencies, cuGraphRemoveDependencies_v2 => false;
}

/// Zeroed edge data for `n` edges where the caller asked for it (every emulated edge is plain).
///
/// # Safety
/// `edges` is NULL or holds `n` 8-byte `CUgraphEdgeData` items.
unsafe fn plain_edges(edges: *mut c_void, n: usize) {
    if !edges.is_null() {
        // SAFETY: per this function's contract.
        unsafe { std::ptr::write_bytes(edges.cast::<u8>(), 0, n * 8) };
    }
}

unsafe fn node_links(
    function: &'static str,
    h: CUgraphNode,
    out: *mut CUgraphNode,
    edges: *mut c_void,
    count: *mut usize,
    upstream: bool,
) -> CUresult {
    with_state(function, |st| {
        let handles = neighbours(&st, h, upstream)?;
        // SAFETY: the caller's arrays (driver contract).
        unsafe {
            let room = if out.is_null() {
                0
            } else {
                count.read_unaligned().min(handles.len())
            };
            list(&handles, out, count)?;
            plain_edges(edges, room);
        }
        Ok(())
    })
}

/// The exports of [`node_links`]: `cuGraphNodeGetDependencies` and
/// `cuGraphNodeGetDependentNodes` (`upstream`), each in its first form and in the `_v2` form
/// with edge data.
macro_rules! node_link_exports {
    ($($name:ident, $name_v2:ident => $upstream:literal;)*) => {$(
        #[no_mangle]
        pub unsafe extern "C" fn $name(
            h: CUgraphNode,
            out: *mut CUgraphNode,
            count: *mut usize,
        ) -> CUresult {
            // SAFETY: the caller's arrays (driver contract).
            unsafe {
                node_links(stringify!($name), h, out, std::ptr::null_mut(), count, $upstream)
            }
        }

        #[no_mangle]
        pub unsafe extern "C" fn $name_v2(
            h: CUgraphNode,
            out: *mut CUgraphNode,
            edges: *mut c_void,
            count: *mut usize,
        ) -> CUresult {
            // SAFETY: the caller's arrays (driver contract).
            unsafe { node_links(stringify!($name_v2), h, out, edges, count, $upstream) }
        }
    )*};
}

node_link_exports! {
    cuGraphNodeGetDependencies, cuGraphNodeGetDependencies_v2 => true;
    cuGraphNodeGetDependentNodes, cuGraphNodeGetDependentNodes_v2 => false;
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphGetEdges_v2(
    g: CUgraph,
    from: *mut CUgraphNode,
    to: *mut CUgraphNode,
    edges: *mut c_void,
    count: *mut usize,
) -> CUresult {
    entry("cuGraphGetEdges_v2", None, None, |_| {
        need(count)?;
        let st = initialized()?;
        let graph = st.graphs.get(&(g as u64)).ok_or(codes::BAD_HANDLE)?;
        let mut pairs = Vec::new();
        for n in graph
            .nodes
            .iter()
            .filter(|n| st.nodes.contains_key(&n.handle))
        {
            for &d in &n.deps {
                pairs.push((graph.nodes[d].handle, n.handle));
            }
        }
        // SAFETY: the caller's arrays of `*count` items (driver contract).
        unsafe {
            if !from.is_null() && !to.is_null() {
                let room = count.read_unaligned();
                for (k, &(a, b)) in pairs.iter().take(room).enumerate() {
                    from.add(k).write_unaligned(a as CUgraphNode);
                    to.add(k).write_unaligned(b as CUgraphNode);
                }
                plain_edges(edges, room.min(pairs.len()));
            }
            put(count, pairs.len())
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphGetEdges(
    g: CUgraph,
    from: *mut CUgraphNode,
    to: *mut CUgraphNode,
    count: *mut usize,
) -> CUresult {
    // SAFETY: the caller's arrays (driver contract).
    unsafe { cuGraphGetEdges_v2(g, from, to, std::ptr::null_mut(), count) }
}

/// `CUDA_GRAPH_INSTANTIATE_PARAMS`.
#[repr(C)]
struct RawInstantiateParams {
    flags: u64,
    upload_stream: CUstream,
    err_node_out: CUgraphNode,
    result_out: u32,
}

/// `CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH | _UPLOAD | _USE_NODE_PRIORITY`; device
/// launch (4) is not emulated.
const INSTANTIATE_FLAGS: u64 = 1 | 2 | 8;

#[no_mangle]
pub unsafe extern "C" fn cuGraphInstantiateWithParams(
    ph: *mut CUgraphExec,
    g: CUgraph,
    params: *mut c_void,
) -> CUresult {
    let g = g as u64;
    entry("cuGraphInstantiateWithParams", None, None, |_| {
        need(ph)?;
        need(params)?;
        let raw = params.cast::<RawInstantiateParams>();
        // SAFETY: non-null; the caller's params (driver contract), read field by field.
        let flags = unsafe { (*raw).flags };
        if flags & !INSTANTIATE_FLAGS != 0 {
            return Err(if flags & 4 != 0 {
                codes::NOT_SUPPORTED
            } else {
                codes::INVALID_VALUE
            });
        }
        let exec = initialized()?.instantiate(g, flags)?;
        // SAFETY: non-null; the output fields of the caller's params and the exec out-pointer
        // (driver contract). CUDA_GRAPH_INSTANTIATE_SUCCESS is 0.
        unsafe {
            (*raw).err_node_out = std::ptr::null_mut();
            (*raw).result_out = 0;
            put(ph, exec as CUgraphExec)
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphUpload(exec: CUgraphExec, s: CUstream) -> CUresult {
    let (exec, s) = (exec as u64, s as u64);
    entry("cuGraphUpload", Some(s), None, |info| {
        // Nothing to upload: the launch reads the graph where it is.
        super::exec_on_stream(info, exec, s).map(|_| ())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphExecGetFlags(exec: CUgraphExec, flags: *mut u64) -> CUresult {
    // SAFETY: the caller's out-pointer (driver contract).
    answer("cuGraphExecGetFlags", unsafe { Out::new(flags) }, |_| {
        let st = initialized()?;
        let e = st.execs.get(&(exec as u64)).ok_or(codes::BAD_HANDLE)?;
        Ok(u64::from(e.auto_free))
    })
}

/// `CUgraphMem_attribute`: used and reserved memory, current and high watermark.
const GRAPH_MEM_ATTRS: u32 = 4;

/// The device's graph memory, as `cuDeviceGetGraphMemAttribute` reports it. Graph allocations
/// are made when their graph runs and freed by a free node, `cuMemFreeAsync` or `cuMemFree`;
/// freed, their memory stays the graphs' until `cuDeviceGraphMemTrim`: measured through
/// cuda.core's tests on an H200 (after a graph allocation was freed and its stream synchronised,
/// `USED_MEM_CURRENT` and `RESERVED_MEM_CURRENT` were still above 0, and the high watermarks
/// stayed above 0 after a trim). What a trim leaves of the current values is not measured: here
/// it returns all the freed memory. Used and reserved are equal (nothing is reserved beyond
/// what was handed out).
#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetGraphMemAttribute(
    dev: CUdevice,
    attr: c_uint,
    value: *mut c_void,
) -> CUresult {
    graph_mem_attribute(
        "cuDeviceGetGraphMemAttribute",
        dev,
        value,
        |used, reserved| {
            if attr >= GRAPH_MEM_ATTRS {
                return Err(codes::INVALID_VALUE);
            }
            let (used_high, reserved_high) = note_graph_high(dev, used, reserved);
            let v = match attr {
                0 => used,
                1 => used_high,
                2 => reserved,
                _ => reserved_high,
            };
            // SAFETY: checked non-null; the attributes are cuuint64_t (driver contract).
            unsafe { put(value.cast::<u64>(), v) }
        },
    )
}

/// The body of `cuDeviceGetGraphMemAttribute` and `cuDeviceSetGraphMemAttribute`
/// (`function`): refuses a null `value` and an unknown device, then runs `body` with the
/// device's graph memory (used, reserved), the state locked.
fn graph_mem_attribute(
    function: &'static str,
    dev: CUdevice,
    value: *mut c_void,
    body: impl FnOnce(u64, u64) -> Res,
) -> CUresult {
    entry(function, None, None, |_| {
        need(value)?;
        let st = initialized()?;
        st.device(dev)?;
        let (used, reserved) = st.graph_memory(dev);
        body(used, reserved)
    })
}

/// Per device: the high watermarks of graph memory (used, reserved) since the last reset.
static GRAPH_MEM_HIGH: std::sync::Mutex<std::collections::BTreeMap<i32, (u64, u64)>> =
    std::sync::Mutex::new(std::collections::BTreeMap::new());

/// Raises `dev`'s high watermarks to the current values and returns them. The current values
/// only go down in a trim, which calls this first, so a watermark read at any time is the
/// highest value since the last reset.
fn note_graph_high(dev: CUdevice, used: u64, reserved: u64) -> (u64, u64) {
    let mut marks = crate::thread::lock(&GRAPH_MEM_HIGH);
    let entry = marks.entry(dev).or_insert((0, 0));
    entry.0 = entry.0.max(used);
    entry.1 = entry.1.max(reserved);
    *entry
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceSetGraphMemAttribute(
    dev: CUdevice,
    attr: c_uint,
    value: *mut c_void,
) -> CUresult {
    graph_mem_attribute(
        "cuDeviceSetGraphMemAttribute",
        dev,
        value,
        |used, reserved| {
            // Only the high watermarks can be set, and only to 0 (a reset to the current value).
            if attr != 1 && attr != 3 {
                return Err(codes::INVALID_VALUE);
            }
            // SAFETY: checked non-null; cuuint64_t (driver contract).
            if unsafe { (value.cast::<u64>()).read_unaligned() } != 0 {
                return Err(codes::INVALID_VALUE);
            }
            let mut marks = crate::thread::lock(&GRAPH_MEM_HIGH);
            let entry = marks.entry(dev).or_insert((0, 0));
            if attr == 1 {
                entry.0 = used;
            } else {
                entry.1 = reserved;
            }
            Ok(())
        },
    )
}

/// Returns the memory of `dev`'s freed graph allocations (documented: blocks not in use by a
/// graph that is running or scheduled to run go back to the OS).
#[no_mangle]
pub unsafe extern "C" fn cuDeviceGraphMemTrim(dev: CUdevice) -> CUresult {
    with_state("cuDeviceGraphMemTrim", |st| {
        st.device(dev)?;
        let (used, reserved) = st.graph_memory(dev);
        note_graph_high(dev, used, reserved);
        st.graph_cached.retain(|_, (device, _)| *device != dev);
        Ok(())
    })
}

impl State {
    /// Whether `a` is a graph allocation (made by a graph's allocation node).
    pub(crate) fn is_graph_allocation(&self, a: &crate::memory::Alloc) -> bool {
        a.pool.is_none() && self.graph_reserved.contains_key(&a.addr)
    }

    /// Bytes of graph memory of `dev` in use, and reserved: live graph allocations and freed
    /// ones not yet trimmed (the same: nothing is reserved beyond that).
    pub(crate) fn graph_memory(&self, dev: CUdevice) -> (u64, u64) {
        let live: u64 = self
            .allocs
            .values()
            .filter(|a| a.device == dev && self.is_graph_allocation(a))
            .map(|a| a.size)
            .sum();
        let cached: u64 = self
            .graph_cached
            .values()
            .filter(|(device, _)| *device == dev)
            .map(|(_, size)| size)
            .sum();
        (live + cached, live + cached)
    }
}
