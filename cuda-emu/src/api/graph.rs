//! Graphs, graph nodes, graph execs and user objects.

use std::sync::MutexGuard;

use cuda_sys::types::*;
use cuda_sys::CUresult;

use super::pool::{RawAccessDesc, RawPoolProps, LOCATION_DEVICE};
use super::stream::node_handles;
use super::{get, need, put};
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
    entry("cuGraphCreate", None, None, |_| {
        need(ph)?;
        if flags != 0 {
            return Err(codes::INVALID_VALUE);
        }
        let mut st = initialized()?;
        let g = st.new_handle();
        st.graphs.insert(g, Graph::default());
        // SAFETY: checked non-null (driver contract).
        unsafe { put(ph, g as CUgraph) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphDestroy(g: CUgraph) -> CUresult {
    let g = g as u64;
    entry("cuGraphDestroy", None, None, |_| {
        let due = initialized()?.destroy_graph(g)?;
        run_destructors(due);
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphClone(ph: *mut CUgraph, g: CUgraph) -> CUresult {
    let g = g as u64;
    entry("cuGraphClone", None, None, |_| {
        need(ph)?;
        let clone = initialized()?.clone_graph(g)?;
        // SAFETY: checked non-null (driver contract).
        unsafe { put(ph, clone as CUgraph) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphInstantiateWithFlags(
    ph: *mut CUgraphExec,
    g: CUgraph,
    flags: c_ulonglong,
) -> CUresult {
    let g = g as u64;
    entry("cuGraphInstantiateWithFlags", None, None, |_| {
        need(ph)?;
        let exec = initialized()?.instantiate(g, flags)?;
        // SAFETY: checked non-null (driver contract).
        unsafe { put(ph, exec as CUgraphExec) }
    })
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
    let exec = exec as u64;
    entry("cuGraphExecDestroy", None, None, |_| {
        let due = initialized()?.destroy_exec(exec)?;
        // With no launch pending, destructors run here, on the calling thread (G2).
        run_destructors(due);
        Ok(())
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
    entry("cuUserObjectCreate", None, None, |_| {
        need(out)?;
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
        // SAFETY: checked non-null (driver contract).
        unsafe { put(out, h as CUuserObject) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuUserObjectRetain(object: CUuserObject, count: c_uint) -> CUresult {
    let object = object as u64;
    entry("cuUserObjectRetain", None, None, |_| {
        if count == 0 {
            return Err(codes::INVALID_VALUE);
        }
        initialized()?.retain_user_object(object, u64::from(count))
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuUserObjectRelease(object: CUuserObject, count: c_uint) -> CUresult {
    let object = object as u64;
    entry("cuUserObjectRelease", None, None, |_| {
        if count == 0 {
            return Err(codes::INVALID_VALUE);
        }
        let due = initialized()?.release_user_object(object, u64::from(count))?;
        run_destructors(due.into_iter().collect());
        Ok(())
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
        if count == 0 || (flags != 0 && !moving) {
            return Err(codes::INVALID_VALUE);
        }
        let mut st = initialized()?;
        st.graphs.get(&g).ok_or(codes::BAD_HANDLE)?;
        let refs = st.user_objects.get(&object).ok_or(codes::BAD_HANDLE)?.refs;
        if moving && refs < u64::from(count) {
            return Err(codes::OVER_RELEASE);
        }
        if !moving {
            st.retain_user_object(object, u64::from(count))?;
        }
        *st.graph(g)?.user_objects.entry(object).or_insert(0) += u64::from(count);
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
        if count == 0 {
            return Err(codes::INVALID_VALUE);
        }
        let due = {
            let mut st = initialized()?;
            let held = st.graph(g)?.user_objects.get(&object).copied().unwrap_or(0);
            if held < u64::from(count) {
                return Err(codes::OVER_RELEASE);
            }
            let graph = st.graph(g)?;
            if held == u64::from(count) {
                graph.user_objects.remove(&object);
            } else {
                graph.user_objects.insert(object, held - u64::from(count));
            }
            st.release_user_object(object, u64::from(count))?
        };
        run_destructors(due.into_iter().collect());
        Ok(())
    })
}
