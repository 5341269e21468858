//! Allocation, freeing, copies, fills and pointer attributes.

use cuda_sys::types::*;
use cuda_sys::CUresult;

use super::{answer, known_flags, need, put, Out};
use crate::clock::VectorClock;
use crate::codes::{self, Res};
use crate::exec::{wait_all, Dep};
use crate::graph::{Copy3D, Memset, NodeKind, Operand, MEMTYPE_UNIFIED};
use crate::log::{self, entry, CallInfo, Hazard};
use crate::memory::{copy_bytes, fill, Alloc, AllocKind, Backing, Mem, DEVICE_MEMORY};
use crate::state::{initialized, state, State};
use std::sync::MutexGuard;

/// A synchronous allocation in the current context.
fn alloc_sync(kind: AllocKind, size: usize, info: &mut CallInfo) -> Res<u64> {
    let mut st = initialized()?;
    let ctx = st.current_ctx()?;
    st.check_unsafe_call()?;
    if size == 0 {
        // cuMemAllocHost(0) succeeds (measured on an H200); it hands out NULL (guess), which
        // cuMemFreeHost accepts (measured).
        return if kind == AllocKind::Host {
            Ok(0)
        } else {
            Err(codes::ZERO_SIZE)
        };
    }
    let size = size as u64;
    let device = st.contexts[&ctx].device;
    let host = kind != AllocKind::Device;
    if kind == AllocKind::Device && st.device_used(device) + size > DEVICE_MEMORY {
        return Err(codes::OUT_OF_MEMORY);
    }
    let backing =
        Backing::heap(size as usize, if host { 4096 } else { 256 }).ok_or(codes::OUT_OF_MEMORY)?;
    let addr = if host {
        backing.ptr() as u64
    } else {
        st.device_va(size)?
    };
    let device = if kind == AllocKind::Host { -1 } else { device };
    let id = st.insert_alloc(Alloc {
        ctx,
        ..Alloc::new(addr, size, kind, device, host, backing)
    });
    info.alloc = Some(id);
    Ok(addr)
}

#[no_mangle]
pub unsafe extern "C" fn cuMemAlloc_v2(dptr: *mut CUdeviceptr, size: usize) -> CUresult {
    // SAFETY: the caller's out-pointer (driver contract).
    answer("cuMemAlloc_v2", unsafe { Out::new(dptr) }, |info| {
        let p = alloc_sync(AllocKind::Device, size, info)?;
        Ok(p)
    })
}

/// `CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_WRITECOMBINED`.
const HOST_ALLOC_FLAGS: c_uint = 0x7;

/// Pinned host memory, mapped and portable whatever the flags (unified addressing: its device
/// pointer is its host address), freed with `cuMemFreeHost`: the body of `cuMemAllocHost_v2`
/// (no flags) and `cuMemHostAlloc`.
///
/// # Safety
/// `pp` is null or valid for a write (driver contract).
unsafe fn alloc_host(pp: *mut *mut c_void, size: usize, flags: c_uint, info: &mut CallInfo) -> Res {
    need(pp)?;
    known_flags(flags, HOST_ALLOC_FLAGS)?;
    let p = alloc_sync(AllocKind::Host, size, info)?;
    // SAFETY: checked non-null, valid per this function's contract.
    unsafe { put(pp, p as *mut c_void) }
}

#[no_mangle]
pub unsafe extern "C" fn cuMemAllocHost_v2(pp: *mut *mut c_void, size: usize) -> CUresult {
    // SAFETY: the caller's out-pointer (driver contract).
    entry("cuMemAllocHost_v2", None, None, |info| unsafe {
        alloc_host(pp, size, 0, info)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemHostAlloc(
    pp: *mut *mut c_void,
    size: usize,
    flags: c_uint,
) -> CUresult {
    // SAFETY: the caller's out-pointer (driver contract).
    entry("cuMemHostAlloc", None, None, |info| unsafe {
        alloc_host(pp, size, flags, info)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemHostGetDevicePointer_v2(
    pdptr: *mut CUdeviceptr,
    p: *mut c_void,
    flags: c_uint,
) -> CUresult {
    entry(
        "cuMemHostGetDevicePointer_v2",
        None,
        Some(p as u64),
        |info| {
            need(pdptr)?;
            if flags != 0 {
                return Err(codes::INVALID_VALUE); // documented: flags must be 0
            }
            let st = initialized()?;
            st.current_ctx()?;
            let start = st.find_live(p as u64).ok_or(codes::NOT_HOST_MAPPED)?;
            let a = &st.allocs[&start];
            if !matches!(a.kind, AllocKind::Host | AllocKind::Registered) {
                return Err(codes::NOT_HOST_MAPPED);
            }
            info.alloc = Some(a.id);
            // Unified addressing: the device pointer of pinned host memory is its host address.
            // SAFETY: checked non-null (driver contract).
            unsafe { put(pdptr, p as u64) }
        },
    )
}

/// `CU_MEMHOSTREGISTER_PORTABLE | _DEVICEMAP | _IOMEMORY | _READ_ONLY`.
const HOST_REGISTER_FLAGS: c_uint = 0xf;

/// Page-locks the program's `size` bytes at `p` in the current context (documented): the range
/// becomes host memory the driver knows, its device pointer its own address (unified
/// addressing), until `cuMemHostUnregister`. A range that overlaps known memory is refused
/// with `CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED` (documented).
fn host_register(p: *mut c_void, size: usize, flags: c_uint, info: &mut CallInfo) -> Res {
    if p.is_null() || size == 0 || flags & !HOST_REGISTER_FLAGS != 0 {
        return Err(codes::INVALID_VALUE);
    }
    let mut st = initialized()?;
    let ctx = st.current_ctx()?;
    let (addr, end) = (p as u64, p as u64 + size as u64);
    let overlaps = st.find_live(addr).is_some() || st.allocs.range(addr..end).next().is_some();
    if overlaps {
        return Err(codes::ALREADY_REGISTERED);
    }
    let backing = Backing::program(p.cast::<u8>(), size);
    let id = st.insert_alloc(Alloc {
        ctx,
        ..Alloc::new(addr, size as u64, AllocKind::Registered, -1, true, backing)
    });
    info.alloc = Some(id);
    Ok(())
}

#[no_mangle]
pub unsafe extern "C" fn cuMemHostRegister_v2(
    p: *mut c_void,
    size: usize,
    flags: c_uint,
) -> CUresult {
    entry("cuMemHostRegister_v2", None, Some(p as u64), |info| {
        host_register(p, size, flags, info)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemHostRegister(p: *mut c_void, size: usize, flags: c_uint) -> CUresult {
    entry("cuMemHostRegister", None, Some(p as u64), |info| {
        host_register(p, size, flags, info)
    })
}

/// Ends the registration that starts at `p`; the bytes stay the program's
/// (`CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED` for an address no registration starts at:
/// documented).
#[no_mangle]
pub unsafe extern "C" fn cuMemHostUnregister(p: *mut c_void) -> CUresult {
    entry("cuMemHostUnregister", None, Some(p as u64), |info| {
        let mut st = initialized()?;
        let addr = p as u64;
        match st.allocs.get(&addr) {
            Some(a) if a.kind == AllocKind::Registered => info.alloc = Some(a.id),
            _ => return Err(codes::NOT_REGISTERED),
        }
        st.remove_alloc(addr);
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemAllocManaged(
    dptr: *mut CUdeviceptr,
    size: usize,
    flags: c_uint,
) -> CUresult {
    // SAFETY: the caller's out-pointer (driver contract).
    answer("cuMemAllocManaged", unsafe { Out::new(dptr) }, |info| {
        if flags != 1 && flags != 2 {
            return Err(codes::INVALID_VALUE);
        }
        let p = alloc_sync(AllocKind::Managed, size, info)?;
        Ok(p)
    })
}

/// A synchronous free: the driver synchronises the device first, so the free is ordered after
/// every use.
fn free_sync(addr: u64, function: &'static str, host: bool, info: &mut CallInfo) -> Res {
    let targets = {
        let mut st = initialized()?;
        if addr == 0 {
            // cuMemFree(0) and cuMemFreeHost(NULL) do nothing and succeed (measured on an H200).
            return Ok(());
        }
        st.check_unsafe_call()?;
        info.alloc = st.find_live(addr).and_then(|start| st.alloc_id(start));
        let Some(a) = st.allocs.get(&addr) else {
            if st.find_live(addr).is_none() {
                st.report_bad_free(addr, function, 0);
            }
            return Err(codes::BAD_POINTER);
        };
        // Registered memory is the program's: only cuMemHostUnregister lets it go.
        let ok = if host {
            a.kind == AllocKind::Host
        } else {
            !matches!(a.kind, AllocKind::Host | AllocKind::Registered)
        };
        if !ok {
            return Err(codes::BAD_POINTER);
        }
        let device = (!host).then_some(a.device);
        st.device_targets(device)
    };
    wait_all(&targets.0);
    let mut st = state();
    st.host_observed(&targets.1);
    let Some(a) = st.take_alloc(addr, function, "synchronous free") else {
        st.report_bad_free(addr, function, 0);
        return Err(codes::BAD_POINTER);
    };
    drop(st);
    if let Some(core) = &a.pool_core {
        core.give_back(a.size);
    }
    Ok(())
}

#[no_mangle]
pub unsafe extern "C" fn cuMemFree_v2(dptr: CUdeviceptr) -> CUresult {
    entry("cuMemFree_v2", None, Some(dptr), |info| {
        free_sync(dptr, "cuMemFree_v2", false, info)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemFreeHost(p: *mut c_void) -> CUresult {
    entry("cuMemFreeHost", None, Some(p as u64), |info| {
        free_sync(p as u64, "cuMemFreeHost", true, info)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemGetInfo_v2(free: *mut usize, total: *mut usize) -> CUresult {
    entry("cuMemGetInfo_v2", None, None, |_| {
        need(free)?;
        need(total)?;
        let st = initialized()?;
        let ctx = st.current_ctx()?;
        let used = st.device_used(st.contexts[&ctx].device);
        // SAFETY: both checked non-null (driver contract).
        unsafe {
            put(free, DEVICE_MEMORY.saturating_sub(used) as usize)?;
            put(total, DEVICE_MEMORY as usize)
        }
    })
}

/// A stream-ordered allocation from `pool` (None: the stream's device's current pool), the body
/// of `cuMemAllocAsync` and `cuMemAllocFromPoolAsync` (`function`).
fn alloc_async(
    function: &'static str,
    dptr: *mut CUdeviceptr,
    size: usize,
    pool: Option<CUmemoryPool>,
    s: CUstream,
) -> CUresult {
    let s = s as u64;
    entry(function, Some(s), None, |info| {
        need(dptr)?;
        let (mut st, r) = info.lock_stream(s)?;
        let pool = match pool {
            Some(p) => p as u64,
            None => st.device(st.streams[&r].device)?.current_pool,
        };
        if !st.pools.contains_key(&pool) {
            return Err(codes::BAD_HANDLE);
        }
        if size == 0 {
            // Zero bytes succeed (measured on an H200, from the current pool and from a created
            // one); what the driver hands out is a guess: NULL, which cuMemFreeAsync accepts.
            // SAFETY: checked non-null (driver contract).
            return unsafe { put(dptr, 0) };
        }
        let size = size as u64;
        let addr = if st.enqueue_check(r)? {
            // Captured: a graph allocation node whose address is fixed now.
            let device = st.pools[&pool].device;
            let addr = st.device_va(size)?;
            st.graph_reserved.insert(addr, size);
            st.capture_node(r, NodeKind::MemAlloc { addr, size, device })?;
            addr
        } else {
            // Beside a capture that forbids this thread "potentially unsafe" calls: refused,
            // nothing allocated, that capture invalidated (measured: F27).
            st.check_unsafe_call()?;
            // Ordered first, so that the pool sees which frees the allocation comes after.
            let (deps, time) = st.prepare(r);
            let addr = st.pool_alloc(pool, size, r)?;
            info.alloc = st.alloc_id(addr);
            st.record_stream_ordered_allocation(addr, r, time);
            st.record_use(Some(addr), r, time);
            st.submit(r, deps, None, false);
            addr
        };
        // SAFETY: checked non-null (driver contract).
        unsafe { put(dptr, addr) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemAllocAsync(
    dptr: *mut CUdeviceptr,
    size: usize,
    s: CUstream,
) -> CUresult {
    alloc_async("cuMemAllocAsync", dptr, size, None, s)
}

#[no_mangle]
pub unsafe extern "C" fn cuMemAllocFromPoolAsync(
    dptr: *mut CUdeviceptr,
    size: usize,
    pool: CUmemoryPool,
    s: CUstream,
) -> CUresult {
    alloc_async("cuMemAllocFromPoolAsync", dptr, size, Some(pool), s)
}

/// A stream-ordered free.
fn free_async(addr: u64, s: u64, info: &mut CallInfo) -> Res {
    const F: &str = "cuMemFreeAsync";
    let mut st = initialized()?;
    info.alloc = st.find_live(addr).and_then(|start| st.alloc_id(start));
    if st.destroyed_streams.contains(&s) {
        // The real driver crashes here (F11).
        log::hazard(Hazard {
            kind: "free_on_destroyed_stream",
            ptr: addr,
            alloc: info.alloc,
            function: F,
            stream: s,
            detail: format!("{F} of {addr:#x} on stream {s:#x}, which was destroyed"),
        });
        return Err(codes::BAD_HANDLE);
    }
    let r = info.resolve_stream(&mut st, s)?;
    if addr == 0 {
        // Freeing NULL does nothing and succeeds (measured on an H200).
        return Ok(());
    }
    let capturing = st.enqueue_check(r)?;
    if capturing && st.graph_reserved.contains_key(&addr) {
        // A graph allocation (made by this capture or by another graph) freed inside a
        // capture: a free node.
        st.capture_node(r, NodeKind::MemFree { addr })?;
        return Ok(());
    }
    let Some(kind) = st.allocs.get(&addr).map(|a| a.kind) else {
        if st.find_live(addr).is_none() {
            st.report_bad_free(addr, F, r);
            return Err(codes::FREED_POINTER);
        }
        return Err(codes::BAD_POINTER);
    };
    if matches!(
        kind,
        AllocKind::Host | AllocKind::Managed | AllocKind::Registered
    ) {
        return Err(codes::NOT_STREAM_ORDERED);
    }
    if capturing {
        // Memory that is not a graph allocation cannot be freed inside a capture: refused,
        // nothing captured, the capture stays valid, the memory stays allocated (measured: F16).
        return Err(codes::CAPTURED_FREE);
    }
    // Beside a capture that forbids this thread "potentially unsafe" calls: refused, nothing
    // freed, that capture invalidated (measured: F27).
    st.check_unsafe_call()?;
    let (deps, time) = st.prepare(r);
    st.check_free_order(addr, r, F);
    let a = st
        .take_alloc(addr, F, "stream-ordered free")
        .expect("checked live");
    let id = st.streams[&r].id;
    if kind == AllocKind::Pool {
        if let Some(pool) = a.pool.and_then(|p| st.pools.get_mut(&p)) {
            pool.remember_free_block(addr, a.size, id, time);
        }
    }
    let (backing, core, size) = (a.backing, a.pool_core, a.size);
    let run = move || {
        drop(backing);
        if let Some(core) = core {
            core.give_back(size);
        }
    };
    st.submit(r, deps, Some(Box::new(run)), false);
    Ok(())
}

#[no_mangle]
pub unsafe extern "C" fn cuMemFreeAsync(dptr: CUdeviceptr, s: CUstream) -> CUresult {
    let s = s as u64;
    entry("cuMemFreeAsync", Some(s), Some(dptr), |info| {
        free_async(dptr, s, info)
    })
}

/// What the caller must wait for after releasing the lock: the operation, and the clock to
/// observe when the host learns of its completion.
type Pending = Option<(Dep, Option<VectorClock>)>;

fn finish(pending: Pending) {
    if let Some((dep, clock)) = pending {
        wait_all(std::slice::from_ref(&dep));
        if let Some(clock) = clock {
            state().host_observed(&clock);
        }
    }
}

/// Locks the state and resolves the stream of a copy or fill: the legacy stream of the current
/// context for synchronous calls (which must also pass the capture rules), the argument
/// otherwise.
fn op_stream(s: Option<u64>, info: &mut CallInfo) -> Res<(MutexGuard<'static, State>, u64)> {
    let mut st = initialized()?;
    let r = match s {
        Some(s) => st.resolve_stream(s)?,
        None => {
            st.current_ctx()?;
            st.check_unsafe_call()?;
            st.resolve_stream(0)?
        }
    };
    info.resolved(&st, r);
    Ok((st, r))
}

/// A copy of `n` bytes, the body of `cuMemcpy` and its kin (`function`); `s` is None for a
/// synchronous copy. `dst_host` and `src_host` say which side may be host memory; an explicitly
/// host side (the other is device memory) must not be NULL.
fn copy(
    function: &'static str,
    dst: u64,
    src: u64,
    n: usize,
    s: Option<CUstream>,
    dst_host: bool,
    src_host: bool,
) -> CUresult {
    let s = s.map(|s| s as u64);
    // The call log's pointer is the device side: the source of a device-to-host copy.
    let (device_side, host_side) = if dst_host && !src_host {
        (src, dst)
    } else {
        (dst, src)
    };
    entry(function, s, Some(device_side), |info| {
        if dst_host != src_host {
            need(host_side as *const c_void)?;
        }
        let pending = {
            let (mut st, r) = op_stream(s, info)?;
            let n64 = n as u64;
            if st.enqueue_check(r)? {
                let mut ids = [None, None];
                for (i, (ptr, host)) in [(dst, dst_host), (src, src_host)].into_iter().enumerate() {
                    match st.check_node_memory(ptr, n64.max(1), false, function) {
                        Ok(id) => ids[i] = id,
                        Err(e) if host && e == codes::BAD_POINTER && !st.is_device_va(ptr) => {
                            // Pageable host memory cannot be captured (guess: UNSUPPORTED, and
                            // the capture is invalidated).
                            let id = st.streams[&r].capture.expect("capturing");
                            st.invalidate_capture(id);
                            return Err(codes::CAPTURE_UNSUPPORTED);
                        }
                        Err(e) => return Err(e),
                    }
                }
                if n == 0 {
                    return Ok(());
                }
                let op = |ptr, alloc| Operand {
                    memtype: MEMTYPE_UNIFIED,
                    ptr,
                    x: 0,
                    y: 0,
                    z: 0,
                    pitch: 0,
                    height: 0,
                    alloc,
                };
                let c = Copy3D {
                    src: op(src, ids[1]),
                    dst: op(dst, ids[0]),
                    width: n64,
                    height: 1,
                    depth: 1,
                };
                st.capture_node(r, NodeKind::Memcpy(c))?;
                return Ok(());
            }
            let d = st.resolve(dst, n64.max(1), dst_host, function, r)?;
            let sr = st.resolve(src, n64.max(1), src_host, function, r)?;
            // The device side's allocation, as for the call log's pointer.
            info.alloc = if dst_host && !src_host { sr.id } else { d.id };
            if n == 0 {
                return Ok(());
            }
            let pageable = d.mem.is_pageable() || sr.mem.is_pageable();
            let (deps, time) = st.prepare(r);
            st.record_use(d.alloc, r, time);
            st.record_use(sr.alloc, r, time);
            let (dm, sm) = (d.mem.clone(), sr.mem.clone());
            let seq = st.submit(
                r,
                deps,
                Some(Box::new(move || copy_bytes(&dm, &sm, n))),
                false,
            );
            let core = st.streams[&r].core.clone();
            let observe =
                (s.is_none() || d.mem.is_pageable()).then(|| st.streams[&r].clock.clone());
            // Pageable memory: the call returns once the bytes have been read or written.
            (s.is_none() || pageable).then_some((Dep { core, seq }, observe))
        };
        finish(pending);
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemcpy(dst: CUdeviceptr, src: CUdeviceptr, n: usize) -> CUresult {
    copy("cuMemcpy", dst, src, n, None, true, true)
}

#[no_mangle]
pub unsafe extern "C" fn cuMemcpyAsync(
    dst: CUdeviceptr,
    src: CUdeviceptr,
    n: usize,
    s: CUstream,
) -> CUresult {
    copy("cuMemcpyAsync", dst, src, n, Some(s), true, true)
}

#[no_mangle]
pub unsafe extern "C" fn cuMemcpyHtoD_v2(
    dst: CUdeviceptr,
    src: *const c_void,
    n: usize,
) -> CUresult {
    copy("cuMemcpyHtoD_v2", dst, src as u64, n, None, false, true)
}

#[no_mangle]
pub unsafe extern "C" fn cuMemcpyDtoH_v2(dst: *mut c_void, src: CUdeviceptr, n: usize) -> CUresult {
    copy("cuMemcpyDtoH_v2", dst as u64, src, n, None, true, false)
}

/// A fill of `n` elements of `elem` bytes, the body of `cuMemsetD8_v2` and its kin
/// (`function`); `s` is None for a synchronous fill.
fn memset(
    function: &'static str,
    dst: u64,
    value: impl Into<u32>,
    elem: u32,
    n: usize,
    s: Option<CUstream>,
) -> CUresult {
    let (s, value) = (s.map(|s| s as u64), value.into());
    entry(function, s, Some(dst), |info| {
        let pending = {
            let (mut st, r) = op_stream(s, info)?;
            let len = (n as u64)
                .checked_mul(u64::from(elem))
                .ok_or(codes::OUT_OF_RANGE)?;
            if !dst.is_multiple_of(u64::from(elem)) {
                return Err(codes::INVALID_VALUE);
            }
            if st.enqueue_check(r)? {
                let alloc = st.check_node_memory(dst, len.max(1), false, function)?;
                if n == 0 {
                    return Ok(());
                }
                let m = Memset {
                    alloc,
                    dst,
                    value,
                    elem,
                    width: n as u64,
                    height: 1,
                    pitch: 0,
                };
                st.capture_node(r, NodeKind::Memset(m))?;
                return Ok(());
            }
            let d = st.resolve(dst, len.max(1), false, function, r)?;
            info.alloc = d.id;
            st.check_device_access(d.alloc, r)?;
            if n == 0 {
                return Ok(());
            }
            let (deps, time) = st.prepare(r);
            st.record_use(d.alloc, r, time);
            let mem: Mem = d.mem;
            let seq = st.submit(
                r,
                deps,
                Some(Box::new(move || fill(&mem, value, elem as usize, n, 1, 0))),
                false,
            );
            let core = st.streams[&r].core.clone();
            let clock = st.streams[&r].clock.clone();
            s.is_none().then_some((Dep { core, seq }, Some(clock)))
        };
        finish(pending);
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemsetD8_v2(dst: CUdeviceptr, v: c_uchar, n: usize) -> CUresult {
    memset("cuMemsetD8_v2", dst, v, 1, n, None)
}

#[no_mangle]
pub unsafe extern "C" fn cuMemsetD16_v2(dst: CUdeviceptr, v: c_ushort, n: usize) -> CUresult {
    memset("cuMemsetD16_v2", dst, v, 2, n, None)
}

#[no_mangle]
pub unsafe extern "C" fn cuMemsetD32_v2(dst: CUdeviceptr, v: c_uint, n: usize) -> CUresult {
    memset("cuMemsetD32_v2", dst, v, 4, n, None)
}

#[no_mangle]
pub unsafe extern "C" fn cuMemsetD8Async(
    dst: CUdeviceptr,
    v: c_uchar,
    n: usize,
    s: CUstream,
) -> CUresult {
    memset("cuMemsetD8Async", dst, v, 1, n, Some(s))
}

#[no_mangle]
pub unsafe extern "C" fn cuMemsetD16Async(
    dst: CUdeviceptr,
    v: c_ushort,
    n: usize,
    s: CUstream,
) -> CUresult {
    memset("cuMemsetD16Async", dst, v, 2, n, Some(s))
}

#[no_mangle]
pub unsafe extern "C" fn cuMemsetD32Async(
    dst: CUdeviceptr,
    v: c_uint,
    n: usize,
    s: CUstream,
) -> CUresult {
    memset("cuMemsetD32Async", dst, v, 4, n, Some(s))
}

#[no_mangle]
pub unsafe extern "C" fn cuPointerGetAttribute(
    data: *mut c_void,
    attribute: CUpointer_attribute,
    ptr: CUdeviceptr,
) -> CUresult {
    let attr = attribute as u32;
    entry("cuPointerGetAttribute", None, Some(ptr), |info| {
        need(data)?;
        let st = initialized()?;
        info.alloc = st.find_live(ptr).and_then(|start| st.alloc_id(start));
        // SAFETY: the caller's storage for the attribute (driver contract).
        unsafe { pointer_attribute(&st, attr, ptr, data) }
    })
}

/// Writes pointer attribute `attr` of `ptr` to `data`.
///
/// # Errors
/// `BAD_POINTER` for a pointer the driver does not know, `BAD_ATTRIBUTE` for an attribute it
/// does not answer, `INVALID_VALUE` for the host pointer of device memory.
///
/// # Safety
/// `data` is non-null and valid for a write of the attribute's documented type.
pub(crate) unsafe fn pointer_attribute(st: &State, attr: u32, ptr: u64, data: *mut c_void) -> Res {
    use cuda_sys::types::CUpointer_attribute as P;
    {
        let start = st.find_live(ptr).ok_or(codes::BAD_POINTER)?;
        let a = &st.allocs[&start];
        let host_accessible = a.kind.host_accessible(a.host);
        let pool_managed = a
            .pool
            .and_then(|p| st.pools.get(&p))
            .is_some_and(|p| p.managed);
        let memtype = if a.host && a.kind != AllocKind::Managed && !pool_managed {
            CUmemorytype::CU_MEMORYTYPE_HOST as u32
        } else {
            CUmemorytype::CU_MEMORYTYPE_DEVICE as u32
        };
        let ordinal = match a.kind {
            AllocKind::Host | AllocKind::Registered => {
                st.contexts.get(&a.ctx).map_or(-1, |c| c.device)
            }
            _ => a.device,
        };
        // SAFETY: (all arms) `data` is non-null and points to storage of the attribute's
        // documented type (driver contract).
        unsafe {
            match attr {
                a_ if a_ == P::CU_POINTER_ATTRIBUTE_CONTEXT as u32 => {
                    put(data.cast::<u64>(), a.ctx)
                }
                a_ if a_ == P::CU_POINTER_ATTRIBUTE_MEMORY_TYPE as u32 => {
                    put(data.cast::<u32>(), memtype)
                }
                a_ if a_ == P::CU_POINTER_ATTRIBUTE_DEVICE_POINTER as u32 => {
                    put(data.cast::<u64>(), ptr)
                }
                a_ if a_ == P::CU_POINTER_ATTRIBUTE_HOST_POINTER as u32 => {
                    if host_accessible {
                        put(data.cast::<u64>(), ptr)
                    } else {
                        Err(codes::INVALID_VALUE)
                    }
                }
                a_ if a_ == P::CU_POINTER_ATTRIBUTE_SYNC_MEMOPS as u32 => {
                    put(data.cast::<u32>(), 1)
                }
                a_ if a_ == P::CU_POINTER_ATTRIBUTE_BUFFER_ID as u32 => {
                    // Unique in the process and never reused (documented), unlike the address.
                    put(data.cast::<u64>(), a.id)
                }
                a_ if a_ == P::CU_POINTER_ATTRIBUTE_IS_MANAGED as u32 => {
                    put(data.cast::<u32>(), u32::from(a.kind == AllocKind::Managed))
                }
                a_ if a_ == P::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL as u32 => {
                    put(data.cast::<i32>(), ordinal)
                }
                a_ if a_ == P::CU_POINTER_ATTRIBUTE_RANGE_START_ADDR as u32 => {
                    put(data.cast::<u64>(), start)
                }
                a_ if a_ == P::CU_POINTER_ATTRIBUTE_RANGE_SIZE as u32 => {
                    put(data.cast::<usize>(), a.size as usize)
                }
                a_ if a_ == P::CU_POINTER_ATTRIBUTE_MAPPED as u32 => put(data.cast::<u32>(), 1),
                a_ if a_ == P::CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE as u32 => {
                    put(data.cast::<u64>(), a.pool.unwrap_or(0))
                }
                // Not capable of legacy (cuIpcGetMemHandle) IPC, nor of GPUDirect RDMA.
                a_ if a_ == P::CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE as u32
                    || a_ == P::CU_POINTER_ATTRIBUTE_IS_GPU_DIRECT_RDMA_CAPABLE as u32 =>
                {
                    put(data.cast::<u32>(), 0)
                }
                a_ if a_ == P::CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES as u32 => {
                    let types = a
                        .pool
                        .and_then(|p| st.pools.get(&p))
                        .map_or(0, |p| p.handle_types);
                    put(data.cast::<u64>(), u64::from(types))
                }
                // CU_POINTER_ATTRIBUTE_ACCESS_FLAGS: read and write.
                a_ if a_ == P::CU_POINTER_ATTRIBUTE_ACCESS_FLAGS as u32 => {
                    put(data.cast::<u32>(), 3)
                }
                _ => Err(codes::BAD_ATTRIBUTE),
            }
        }
    }
}
