//! Graphs, graph nodes, graph execs and user objects.

use std::sync::MutexGuard;

use cuda_sys::types::*;
use cuda_sys::CUresult;

use super::pool::{RawAccessDesc, RawPoolProps, LOCATION_DEVICE};
use super::stream::node_handles;
use super::{answer, get, need, put, Out};
use crate::codes::{self, Res};
use crate::graph::{
    run_destructors, Callback, Copy3D, Graph, Memset, NodeKind, Operand, UserObject,
};
use crate::graph::{MEMTYPE_DEVICE, MEMTYPE_HOST, MEMTYPE_UNIFIED};
use crate::log::{entry, CallInfo};
use crate::state::{initialized, State};

/// `CUDA_MEMCPY3D`, with the memory types read as plain integers.
#[repr(C)]
#[derive(Clone, Copy)]
struct RawMemcpy3D {
    src_x: usize,
    src_y: usize,
    src_z: usize,
    src_lod: usize,
    src_type: u32,
    src_host: *const c_void,
    src_device: u64,
    src_array: *mut c_void,
    reserved0: *mut c_void,
    src_pitch: usize,
    src_height: usize,
    dst_x: usize,
    dst_y: usize,
    dst_z: usize,
    dst_lod: usize,
    dst_type: u32,
    dst_host: *mut c_void,
    dst_device: u64,
    dst_array: *mut c_void,
    reserved1: *mut c_void,
    dst_pitch: usize,
    dst_height: usize,
    width: usize,
    height: usize,
    depth: usize,
}

/// `CUDA_MEM_ALLOC_NODE_PARAMS`, with the pool properties read as plain integers.
#[repr(C)]
struct RawMemAllocParams {
    pool_props: RawPoolProps,
    access_descs: *const RawAccessDesc,
    access_count: usize,
    bytesize: usize,
    dptr: u64,
}

const _: () = assert!(std::mem::size_of::<RawMemcpy3D>() == std::mem::size_of::<CUDA_MEMCPY3D>());
const _: () = assert!(
    std::mem::size_of::<RawMemAllocParams>() == std::mem::size_of::<CUDA_MEM_ALLOC_NODE_PARAMS>()
);

#[no_mangle]
pub unsafe extern "C" fn cuGraphCreate(ph: *mut CUgraph, flags: c_uint) -> CUresult {
    // SAFETY: the caller's out-pointer (driver contract).
    answer("cuGraphCreate", unsafe { Out::new(ph) }, |_| {
        if flags != 0 {
            return Err(codes::INVALID_VALUE);
        }
        let mut st = initialized()?;
        let g = st.new_handle();
        st.graphs.insert(g, Graph::default());
        Ok(g as CUgraph)
    })
}

/// Runs `release` on the initialized driver state, then, with the state unlocked, the
/// destructors of the user objects whose last reference it dropped: here, on the calling thread
/// (G2). The body of the destroy and release calls of graphs, execs and user objects.
pub(crate) fn release_then_run_destructors(
    release: impl FnOnce(&mut State) -> Res<Vec<Callback>>,
) -> Res {
    let due = release(&mut *initialized()?)?;
    run_destructors(due);
    Ok(())
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphDestroy(g: CUgraph) -> CUresult {
    entry("cuGraphDestroy", None, None, |_| {
        release_then_run_destructors(|st| st.destroy_graph(g as u64))
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphClone(ph: *mut CUgraph, g: CUgraph) -> CUresult {
    // SAFETY: the caller's out-pointer (driver contract).
    answer("cuGraphClone", unsafe { Out::new(ph) }, |_| {
        Ok(initialized()?.clone_graph(g as u64)? as CUgraph)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphInstantiateWithFlags(
    ph: *mut CUgraphExec,
    g: CUgraph,
    flags: c_ulonglong,
) -> CUresult {
    // SAFETY: the caller's out-pointer (driver contract).
    answer(
        "cuGraphInstantiateWithFlags",
        unsafe { Out::new(ph) },
        |_| Ok(initialized()?.instantiate(g as u64, flags)? as CUgraphExec),
    )
}

/// Locks the state, checks that `exec` is a live graph exec and resolves the call's stream `s`
/// (`cuGraphLaunch`, `cuGraphUpload`). Returns the locked state and the resolved stream.
pub(crate) fn exec_on_stream(
    info: &mut CallInfo,
    exec: u64,
    s: u64,
) -> Res<(MutexGuard<'static, State>, u64)> {
    let mut st = initialized()?;
    st.execs.get(&exec).ok_or(codes::BAD_HANDLE)?;
    let r = info.resolve_stream(&mut st, s)?;
    Ok((st, r))
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphLaunch(exec: CUgraphExec, s: CUstream) -> CUresult {
    let (exec, s) = (exec as u64, s as u64);
    entry("cuGraphLaunch", Some(s), None, |info| {
        let (mut st, r) = exec_on_stream(info, exec, s)?;
        st.launch(exec, r)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphExecDestroy(exec: CUgraphExec) -> CUresult {
    entry("cuGraphExecDestroy", None, None, |_| {
        // With no launch pending, destructors run here, on the calling thread (G2).
        release_then_run_destructors(|st| st.destroy_exec(exec as u64))
    })
}

/// Common part of the add-node calls.
///
/// # Safety
/// `deps` is valid for `n` reads when `n > 0`.
unsafe fn add(
    ph: *mut CUgraphNode,
    g: CUgraph,
    deps: *const CUgraphNode,
    n: usize,
    make: impl FnOnce(&mut State) -> Res<NodeKind>,
) -> Res {
    need(ph)?;
    let g = g as u64;
    // SAFETY: per this function's contract.
    let deps = unsafe { node_handles(deps, n)? };
    let mut st = initialized()?;
    st.graphs.get(&g).ok_or(codes::BAD_HANDLE)?;
    let deps = st.node_indices(g, &deps)?;
    let kind = make(&mut st)?;
    let (handle, _) = st.add_node(g, kind, deps)?;
    // SAFETY: checked non-null (driver contract).
    unsafe { put(ph, handle as CUgraphNode) }
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphAddEmptyNode(
    ph: *mut CUgraphNode,
    g: CUgraph,
    deps: *const CUgraphNode,
    n: usize,
) -> CUresult {
    // SAFETY: the caller's dependency array (driver contract).
    entry("cuGraphAddEmptyNode", None, None, |_| unsafe {
        add(ph, g, deps, n, |_| Ok(NodeKind::Empty))
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphAddHostNode(
    ph: *mut CUgraphNode,
    g: CUgraph,
    deps: *const CUgraphNode,
    n: usize,
    params: *const CUDA_HOST_NODE_PARAMS,
) -> CUresult {
    entry("cuGraphAddHostNode", None, None, |_| {
        // SAFETY: the caller's params (driver contract).
        let p = unsafe { get(params)? };
        let func = p.fn_.ok_or(codes::INVALID_VALUE)?;
        let cb = Callback {
            func,
            data: p.userData as usize,
        };
        // SAFETY: the caller's dependency array (driver contract).
        unsafe { add(ph, g, deps, n, |_| Ok(NodeKind::Host(cb))) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphAddMemsetNode(
    ph: *mut CUgraphNode,
    g: CUgraph,
    deps: *const CUgraphNode,
    n: usize,
    params: *const CUDA_MEMSET_NODE_PARAMS,
    _ctx: CUcontext,
) -> CUresult {
    entry("cuGraphAddMemsetNode", None, None, |_| {
        // SAFETY: the caller's params (driver contract); all fields are integers.
        let p = unsafe { get(params)? };
        let mut m = Memset {
            alloc: None,
            dst: p.dst,
            value: p.value,
            elem: p.elementSize,
            width: p.width as u64,
            height: p.height as u64,
            pitch: p.pitch as u64,
        };
        // SAFETY: the caller's dependency array (driver contract).
        unsafe {
            add(ph, g, deps, n, |st| {
                let len = m.extent()?;
                m.alloc = st.check_node_memory(m.dst, len, false, "cuGraphAddMemsetNode")?;
                Ok(NodeKind::Memset(m))
            })
        }
    })
}

#[allow(clippy::too_many_arguments)]
fn operand(
    memtype: u32,
    host: u64,
    device: u64,
    x: usize,
    y: usize,
    z: usize,
    pitch: usize,
    height: usize,
) -> Res<Operand> {
    let ptr = match memtype {
        MEMTYPE_HOST => host,
        MEMTYPE_DEVICE | MEMTYPE_UNIFIED => device,
        _ => return Err(codes::INVALID_VALUE), // arrays are not emulated
    };
    Ok(Operand {
        memtype,
        ptr,
        x: x as u64,
        y: y as u64,
        z: z as u64,
        pitch: pitch as u64,
        height: height as u64,
        alloc: None,
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphAddMemcpyNode(
    ph: *mut CUgraphNode,
    g: CUgraph,
    deps: *const CUgraphNode,
    n: usize,
    params: *const CUDA_MEMCPY3D,
    _ctx: CUcontext,
) -> CUresult {
    entry("cuGraphAddMemcpyNode", None, None, |_| {
        // SAFETY: the caller's params (driver contract); read with integer memory types.
        let p: RawMemcpy3D = unsafe { get(params.cast::<RawMemcpy3D>())? };
        let src = operand(
            p.src_type,
            p.src_host as u64,
            p.src_device,
            p.src_x,
            p.src_y,
            p.src_z,
            p.src_pitch,
            p.src_height,
        )?;
        let dst = operand(
            p.dst_type,
            p.dst_host as u64,
            p.dst_device,
            p.dst_x,
            p.dst_y,
            p.dst_z,
            p.dst_pitch,
            p.dst_height,
        )?;
        let mut c = Copy3D {
            src,
            dst,
            width: p.width as u64,
            height: p.height.max(1) as u64,
            depth: p.depth.max(1) as u64,
        };
        // SAFETY: the caller's dependency array (driver contract).
        unsafe {
            add(ph, g, deps, n, |st| {
                for src in [true, false] {
                    let o = if src { &c.src } else { &c.dst };
                    let (first, len) = c.extent(o)?;
                    let host_ok = o.memtype != MEMTYPE_DEVICE;
                    let alloc = st.check_node_memory(
                        o.ptr + first,
                        len.max(1),
                        host_ok,
                        "cuGraphAddMemcpyNode",
                    )?;
                    if src {
                        c.src.alloc = alloc;
                    } else {
                        c.dst.alloc = alloc;
                    }
                }
                Ok(NodeKind::Memcpy(c))
            })
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphAddMemAllocNode(
    ph: *mut CUgraphNode,
    g: CUgraph,
    deps: *const CUgraphNode,
    n: usize,
    params: *mut CUDA_MEM_ALLOC_NODE_PARAMS,
) -> CUresult {
    entry("cuGraphAddMemAllocNode", None, None, |_| {
        need(params)?;
        let raw = params.cast::<RawMemAllocParams>();
        // SAFETY: non-null; the caller's params (driver contract), read field by field.
        let (props, size) = unsafe { ((*raw).pool_props, (*raw).bytesize as u64) };
        if size == 0 || props.location.kind != LOCATION_DEVICE {
            return Err(codes::INVALID_VALUE);
        }
        let device = props.location.id;
        let mut addr = 0;
        // SAFETY: the caller's dependency array (driver contract).
        unsafe {
            add(ph, g, deps, n, |st| {
                st.device(device).map_err(|_| codes::INVALID_VALUE)?;
                addr = st.device_va(size)?;
                st.graph_reserved.insert(addr, size);
                Ok(NodeKind::MemAlloc { addr, size, device })
            })?;
        }
        // SAFETY: non-null; `dptr` is the params' output field (driver contract).
        unsafe { (*raw).dptr = addr };
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphAddMemFreeNode(
    ph: *mut CUgraphNode,
    g: CUgraph,
    deps: *const CUgraphNode,
    n: usize,
    dptr: CUdeviceptr,
) -> CUresult {
    entry("cuGraphAddMemFreeNode", None, Some(dptr), |_| {
        // SAFETY: the caller's dependency array (driver contract).
        unsafe {
            add(ph, g, deps, n, |st| {
                // Only a graph allocation may be freed by a free node (documented; a captured
                // free of other memory is refused too, measured: docs/driver-facts.md F16).
                if st.graph_reserved.contains_key(&dptr) {
                    Ok(NodeKind::MemFree { addr: dptr })
                } else {
                    Err(codes::INVALID_VALUE)
                }
            })
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuUserObjectCreate(
    out: *mut CUuserObject,
    ptr: *mut c_void,
    destroy: CUhostFn,
    initial: c_uint,
    flags: c_uint,
) -> CUresult {
    // SAFETY: the caller's out-pointer (driver contract).
    answer("cuUserObjectCreate", unsafe { Out::new(out) }, |_| {
        let func = destroy.ok_or(codes::INVALID_VALUE)?;
        if initial == 0 || flags != CUuserObject_flags::CU_USER_OBJECT_NO_DESTRUCTOR_SYNC as u32 {
            return Err(codes::INVALID_VALUE);
        }
        let mut st = initialized()?;
        let h = st.new_handle();
        st.user_objects.insert(
            h,
            UserObject {
                destructor: Callback {
                    func,
                    data: ptr as usize,
                },
                refs: u64::from(initial),
            },
        );
        Ok(h as CUuserObject)
    })
}

/// A count of user-object references as the calls that retain and release them take it: zero
/// is refused with `CUDA_ERROR_INVALID_VALUE`.
fn reference_count(count: c_uint) -> Res<u64> {
    if count == 0 {
        Err(codes::INVALID_VALUE)
    } else {
        Ok(u64::from(count))
    }
}

#[no_mangle]
pub unsafe extern "C" fn cuUserObjectRetain(object: CUuserObject, count: c_uint) -> CUresult {
    let object = object as u64;
    entry("cuUserObjectRetain", None, None, |_| {
        let count = reference_count(count)?;
        initialized()?.retain_user_object(object, count)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuUserObjectRelease(object: CUuserObject, count: c_uint) -> CUresult {
    let object = object as u64;
    entry("cuUserObjectRelease", None, None, |_| {
        let count = reference_count(count)?;
        release_then_run_destructors(|st| {
            Ok(st.release_user_object(object, count)?.into_iter().collect())
        })
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphRetainUserObject(
    g: CUgraph,
    object: CUuserObject,
    count: c_uint,
    flags: c_uint,
) -> CUresult {
    let (g, object) = (g as u64, object as u64);
    entry("cuGraphRetainUserObject", None, None, |_| {
        let moving = flags == CUuserObjectRetain_flags::CU_GRAPH_USER_OBJECT_MOVE as u32;
        let count = reference_count(count)?;
        if flags != 0 && !moving {
            return Err(codes::INVALID_VALUE);
        }
        let mut st = initialized()?;
        st.graphs.get(&g).ok_or(codes::BAD_HANDLE)?;
        let refs = st.user_objects.get(&object).ok_or(codes::BAD_HANDLE)?.refs;
        if moving && refs < count {
            return Err(codes::OVER_RELEASE);
        }
        if !moving {
            st.retain_user_object(object, count)?;
        }
        *st.graph(g)?.user_objects.entry(object).or_insert(0) += count;
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphReleaseUserObject(
    g: CUgraph,
    object: CUuserObject,
    count: c_uint,
) -> CUresult {
    let (g, object) = (g as u64, object as u64);
    entry("cuGraphReleaseUserObject", None, None, |_| {
        let count = reference_count(count)?;
        release_then_run_destructors(|st| {
            let held = st.graph(g)?.user_objects.get(&object).copied().unwrap_or(0);
            if held < count {
                return Err(codes::OVER_RELEASE);
            }
            let graph = st.graph(g)?;
            if held == count {
                graph.user_objects.remove(&object);
            } else {
                graph.user_objects.insert(object, held - count);
            }
            Ok(st.release_user_object(object, count)?.into_iter().collect())
        })
    })
}
