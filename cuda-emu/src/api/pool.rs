//! Memory pools: default and created pools, attributes, access, and pool IPC.

use std::ffi::c_int;

use cuda_sys::types::MemPoolAttribute as A;
use cuda_sys::types::*;
use cuda_sys::CUresult;

use super::{answer, get, get_slice, need, put, with_state, Out};
use crate::codes::{self, Res};
use crate::ipc::{self, Arena};
use crate::log::entry;
use crate::memory::{pool_limit, Alloc, AllocKind, Backing, Pool, PoolStats};
use crate::state::{initialized, Device};
use crate::thread::lock;

/// `CUmemPoolProps` read field by field, so that any enumerator value (even one this build's
/// types do not know, like `CU_MEM_LOCATION_TYPE_HOST`) is read safely. `maxSize` and `usage`
/// sit at the start of what CUDA 12.0 headers call `reserved`.
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct RawPoolProps {
    pub(crate) alloc_type: u32,
    pub(crate) handle_types: u32,
    pub(crate) location: RawLocation,
    win32: *mut c_void,
    pub(crate) max_size: usize,
    usage: u16,
    reserved: [u8; 54],
}

/// `CUmemLocation`.
#[repr(C)]
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) struct RawLocation {
    pub(crate) kind: u32,
    pub(crate) id: i32,
}

/// `CUmemAccessDesc`.
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct RawAccessDesc {
    location: RawLocation,
    flags: u32,
}

const _: () = assert!(std::mem::size_of::<RawPoolProps>() == std::mem::size_of::<CUmemPoolProps>());
const _: () =
    assert!(std::mem::size_of::<RawAccessDesc>() == std::mem::size_of::<CUmemAccessDesc>());

/// `CU_MEM_LOCATION_TYPE_NONE` (CUDA 13; `_INVALID` before).
pub(crate) const LOCATION_NONE: u32 = 0;
pub(crate) const LOCATION_DEVICE: u32 = 1;
pub(crate) const LOCATION_HOST: u32 = 2;
pub(crate) const LOCATION_HOST_NUMA: u32 = 3;
const HANDLE_POSIX_FD: u32 = 1;
const ACCESS_READWRITE: u32 = 3;

/// The body of `cuDeviceGetDefaultMemPool` and `cuDeviceGetMemPool`: writes the pool of device
/// `dev` that `which` picks through `pool_out`.
///
/// # Safety
/// `pool_out` is null or valid for a write (the driver API's contract for out-pointers).
unsafe fn device_pool(
    function: &'static str,
    pool_out: *mut CUmemoryPool,
    dev: CUdevice,
    which: impl FnOnce(&Device) -> u64,
) -> CUresult {
    // SAFETY: valid per this function's contract.
    answer(function, unsafe { Out::new(pool_out) }, |_| {
        let st = initialized()?;
        Ok(which(st.device(dev)?) as CUmemoryPool)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetDefaultMemPool(
    pool_out: *mut CUmemoryPool,
    dev: CUdevice,
) -> CUresult {
    // SAFETY: the caller's out-pointer (driver contract).
    unsafe {
        device_pool("cuDeviceGetDefaultMemPool", pool_out, dev, |d| {
            d.default_pool
        })
    }
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetMemPool(
    pool_out: *mut CUmemoryPool,
    dev: CUdevice,
) -> CUresult {
    // SAFETY: the caller's out-pointer (driver contract).
    unsafe { device_pool("cuDeviceGetMemPool", pool_out, dev, |d| d.current_pool) }
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceSetMemPool(dev: CUdevice, pool: CUmemoryPool) -> CUresult {
    let pool = pool as u64;
    with_state("cuDeviceSetMemPool", |st| {
        st.device(dev)?;
        let p = st.pools.get(&pool).ok_or(codes::BAD_HANDLE)?;
        if p.device != dev || p.host || p.imported.is_some() {
            return Err(codes::POOL_DEVICE_MISMATCH);
        }
        st.device_mut(dev)?.current_pool = pool;
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemPoolCreate(
    pool_out: *mut CUmemoryPool,
    props: *const CUmemPoolProps,
) -> CUresult {
    // SAFETY: the caller's out-pointer (driver contract).
    answer("cuMemPoolCreate", unsafe { Out::new(pool_out) }, |_| {
        // SAFETY: the caller's props (driver contract); read as plain integers.
        let p: RawPoolProps = unsafe { get(props.cast::<RawPoolProps>())? };
        let mut st = initialized()?;
        // CU_MEM_ALLOCATION_TYPE_PINNED (1) or _MANAGED (2, CUDA 13: host-accessible memory
        // at its own address, a device's, a host's or of no preferred location).
        let managed = match p.alloc_type {
            1 => false,
            2 => true,
            _ => return Err(codes::INVALID_VALUE),
        };
        let (device, host) = match p.location.kind {
            LOCATION_DEVICE => {
                st.device(p.location.id).map_err(|_| codes::INVALID_VALUE)?;
                (p.location.id, managed)
            }
            LOCATION_HOST | LOCATION_HOST_NUMA => (-1, true),
            LOCATION_NONE if managed => (-1, true),
            _ => return Err(codes::INVALID_VALUE),
        };
        if managed && p.handle_types != 0 {
            return Err(codes::INVALID_VALUE);
        }
        if p.handle_types & !HANDLE_POSIX_FD != 0 {
            return Err(codes::INVALID_VALUE);
        }
        let max_size = p.max_size as u64;
        let arena = if p.handle_types & HANDLE_POSIX_FD != 0 {
            // The arena holds what the pool may: `maxSize` rounded up to whole chunks.
            let capacity = if max_size == 0 {
                0
            } else {
                pool_limit(max_size)
            };
            Some(Arena::create(device, host, capacity).map_err(|_| codes::OUT_OF_MEMORY)?)
        } else {
            None
        };
        let handle = st.new_handle();
        st.pools.insert(
            handle,
            Pool {
                handle_types: p.handle_types,
                arena,
                managed,
                ..Pool::new(device, host, max_size)
            },
        );
        Ok(handle as CUmemoryPool)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemPoolDestroy(pool: CUmemoryPool) -> CUresult {
    let pool = pool as u64;
    with_state("cuMemPoolDestroy", |st| {
        let p = st.pools.get(&pool).ok_or(codes::BAD_HANDLE)?;
        if p.default {
            return Err(codes::DESTROY_DEFAULT_POOL);
        }
        // Outstanding allocations stay valid; the pool's memory goes when they are freed.
        st.pools.remove(&pool);
        for d in &mut st.devices {
            if d.current_pool == pool {
                d.current_pool = d.default_pool;
            }
        }
        Ok(())
    })
}

/// The body of `cuMemPoolGetAttribute` and `cuMemPoolSetAttribute`: refuses a null `value`
/// and, for the query, a call that a capture forbids (docs/driver-facts.md F26), finds `pool`,
/// and runs `body` on its statistics and settings, locked, and the attribute.
fn pool_attribute(
    function: &'static str,
    pool: CUmemoryPool,
    attr: CUmemPool_attribute,
    value: *mut c_void,
    body: impl FnOnce(&mut PoolStats, u32) -> Res,
) -> CUresult {
    let (pool, attr) = (pool as u64, attr as u32);
    entry(function, None, None, |_| {
        need(value)?;
        let st = initialized()?;
        if function == "cuMemPoolGetAttribute" {
            st.check_pool_query_in_capture()?;
        }
        let p = st.pools.get(&pool).ok_or(codes::BAD_HANDLE)?;
        let mut stats = lock(&p.core.stats);
        body(&mut stats, attr)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemPoolGetAttribute(
    pool: CUmemoryPool,
    attr: CUmemPool_attribute,
    value: *mut c_void,
) -> CUresult {
    pool_attribute("cuMemPoolGetAttribute", pool, attr, value, |s, attr| {
        let flag = |b: bool| c_int::from(b);
        // SAFETY: (all arms) `value` is non-null and points to the attribute's documented type:
        // int for the reuse flags, cuuint64_t for the others (driver contract).
        unsafe {
            match attr {
                a if a == A::CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES as u32 => {
                    put(value.cast(), flag(s.reuse_follow_event_dependencies))
                }
                a if a == A::CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC as u32 => {
                    put(value.cast(), flag(s.reuse_allow_opportunistic))
                }
                a if a == A::CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES as u32 => {
                    put(value.cast(), flag(s.reuse_allow_internal_dependencies))
                }
                a if a == A::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD as u32 => {
                    put(value.cast::<u64>(), s.release_threshold)
                }
                a if a == A::CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT as u32 => {
                    put(value.cast::<u64>(), s.reserved)
                }
                a if a == A::CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH as u32 => {
                    put(value.cast::<u64>(), s.reserved_high)
                }
                a if a == A::CU_MEMPOOL_ATTR_USED_MEM_CURRENT as u32 => {
                    put(value.cast::<u64>(), s.used)
                }
                a if a == A::CU_MEMPOOL_ATTR_USED_MEM_HIGH as u32 => {
                    put(value.cast::<u64>(), s.used_high)
                }
                _ => Err(codes::BAD_ATTRIBUTE),
            }
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemPoolSetAttribute(
    pool: CUmemoryPool,
    attr: CUmemPool_attribute,
    value: *mut c_void,
) -> CUresult {
    pool_attribute("cuMemPoolSetAttribute", pool, attr, value, |s, attr| {
        // SAFETY: (all reads) `value` is non-null and points to the attribute's documented
        // type (driver contract).
        let int = || unsafe { get(value.cast::<c_int>()) };
        // SAFETY: as above.
        let u64v = || unsafe { get(value.cast::<u64>()) };
        match attr {
            a if a == A::CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES as u32 => {
                s.reuse_follow_event_dependencies = int()? != 0
            }
            a if a == A::CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC as u32 => {
                s.reuse_allow_opportunistic = int()? != 0
            }
            a if a == A::CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES as u32 => {
                s.reuse_allow_internal_dependencies = int()? != 0
            }
            a if a == A::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD as u32 => s.release_threshold = u64v()?,
            // High watermarks can only be reset (to the current value).
            a if a == A::CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH as u32 => {
                if u64v()? != 0 {
                    return Err(codes::INVALID_VALUE);
                }
                s.reserved_high = s.reserved;
            }
            a if a == A::CU_MEMPOOL_ATTR_USED_MEM_HIGH as u32 => {
                if u64v()? != 0 {
                    return Err(codes::INVALID_VALUE);
                }
                s.used_high = s.used;
            }
            _ => return Err(codes::BAD_ATTRIBUTE),
        }
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemPoolTrimTo(pool: CUmemoryPool, min_keep: usize) -> CUresult {
    let pool = pool as u64;
    with_state("cuMemPoolTrimTo", |st| {
        st.pools
            .get(&pool)
            .ok_or(codes::BAD_HANDLE)?
            .core
            .trim_to(min_keep as u64);
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemPoolSetAccess(
    pool: CUmemoryPool,
    map: *const CUmemAccessDesc,
    count: usize,
) -> CUresult {
    let pool = pool as u64;
    entry("cuMemPoolSetAccess", None, None, |_| {
        // SAFETY: `map` holds `count` descriptors (driver contract); read as integers.
        let descs: Vec<RawAccessDesc> = unsafe { get_slice(map.cast::<RawAccessDesc>(), count)? };
        let mut st = initialized()?;
        let ndev = st.devices.len() as i32;
        let p = st.pools.get_mut(&pool).ok_or(codes::BAD_HANDLE)?;
        for d in &descs {
            let valid_loc =
                d.location.kind == LOCATION_DEVICE && (0..ndev).contains(&d.location.id);
            if !valid_loc || !matches!(d.flags, 0 | 1 | 3) {
                return Err(codes::INVALID_VALUE);
            }
            if d.location.id == p.device && !p.host && d.flags != ACCESS_READWRITE {
                // The owning device's access cannot be revoked (guess).
                return Err(codes::INVALID_VALUE);
            }
        }
        for d in descs {
            let key = (d.location.kind, d.location.id);
            p.access.retain(|(k, _)| *k != key);
            p.access.push((key, d.flags));
        }
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemPoolGetAccess(
    flags: *mut CUmemAccess_flags,
    pool: CUmemoryPool,
    location: *mut CUmemLocation,
) -> CUresult {
    let pool = pool as u64;
    // SAFETY: the caller's out-pointer, written as the integer of a valid enumerator (driver
    // contract).
    let out = unsafe { Out::new(flags.cast::<u32>()) };
    answer("cuMemPoolGetAccess", out, |_| {
        // SAFETY: the caller's location (driver contract); read as integers.
        let loc: RawLocation = unsafe { get(location.cast_const().cast::<RawLocation>())? };
        let st = initialized()?;
        let p = st.pools.get(&pool).ok_or(codes::BAD_HANDLE)?;
        let value = if loc.kind == LOCATION_DEVICE && loc.id == p.device && !p.host {
            ACCESS_READWRITE
        } else {
            p.access
                .iter()
                .find(|(k, _)| *k == (loc.kind, loc.id))
                .map_or(0, |&(_, f)| f)
        };
        Ok(value)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemPoolExportToShareableHandle(
    handle_out: *mut c_void,
    pool: CUmemoryPool,
    handle_type: CUmemAllocationHandleType,
    _flags: c_ulonglong,
) -> CUresult {
    let pool = pool as u64;
    entry("cuMemPoolExportToShareableHandle", None, None, |_| {
        need(handle_out)?;
        let mut st = initialized()?;
        let p = st.pools.get_mut(&pool).ok_or(codes::BAD_HANDLE)?;
        if handle_type.0 != HANDLE_POSIX_FD || p.handle_types & HANDLE_POSIX_FD == 0 {
            return Err(codes::INVALID_VALUE);
        }
        let arena = p.arena.as_ref().ok_or(codes::INVALID_VALUE)?;
        let fd = arena.export_fd().map_err(|_| codes::OUT_OF_MEMORY)?;
        // SAFETY: checked non-null; for a POSIX fd the handle is an int (driver contract).
        unsafe { put(handle_out.cast::<c_int>(), fd)? };
        p.exported = true;
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemPoolImportFromShareableHandle(
    pool_out: *mut CUmemoryPool,
    handle: *mut c_void,
    handle_type: CUmemAllocationHandleType,
    _flags: c_ulonglong,
) -> CUresult {
    // SAFETY: the caller's out-pointer (driver contract).
    let out = unsafe { Out::new(pool_out) };
    answer("cuMemPoolImportFromShareableHandle", out, |_| {
        if handle_type.0 != HANDLE_POSIX_FD {
            return Err(codes::INVALID_VALUE);
        }
        let mut st = initialized()?;
        // For a POSIX fd the handle is the descriptor itself, cast to a pointer.
        let fd = handle as usize as c_int;
        let (map, header) = ipc::import(fd).ok_or(codes::INVALID_VALUE)?;
        let handle = st.new_handle();
        st.pools.insert(
            handle,
            Pool {
                handle_types: HANDLE_POSIX_FD,
                imported: Some(map),
                imported_id: header.id,
                ..Pool::new(header.device, header.host, 0)
            },
        );
        Ok(handle as CUmemoryPool)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemPoolExportPointer(
    share_out: *mut CUmemPoolPtrExportData,
    ptr: CUdeviceptr,
) -> CUresult {
    entry("cuMemPoolExportPointer", None, Some(ptr), |info| {
        need(share_out)?;
        let st = initialized()?;
        let a = st.allocs.get(&ptr).ok_or(codes::BAD_POINTER)?;
        info.alloc = Some(a.id);
        let offset = a.ipc_offset.ok_or(codes::INVALID_VALUE)?;
        let pool = a
            .pool
            .and_then(|p| st.pools.get(&p))
            .ok_or(codes::INVALID_VALUE)?;
        let arena_id = pool
            .arena
            .as_ref()
            .map(|a| a.id)
            .ok_or(codes::INVALID_VALUE)?;
        if !pool.exported {
            return Err(codes::POOL_NOT_EXPORTED);
        }
        let data = ipc::encode_export(arena_id, offset, a.size);
        // SAFETY: checked non-null; CUmemPoolPtrExportData is 64 plain bytes (driver contract).
        unsafe { put(share_out.cast::<[u8; 64]>(), data) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemPoolImportPointer(
    ptr_out: *mut CUdeviceptr,
    pool: CUmemoryPool,
    share: *mut CUmemPoolPtrExportData,
) -> CUresult {
    let pool = pool as u64;
    // SAFETY: the caller's out-pointer (driver contract).
    let out = unsafe { Out::new(ptr_out) };
    answer("cuMemPoolImportPointer", out, |info| {
        // SAFETY: the caller's 64 bytes of export data (driver contract).
        let data: [u8; 64] = unsafe { get(share.cast_const().cast::<[u8; 64]>())? };
        let (id, offset, size) = ipc::decode_export(&data).ok_or(codes::INVALID_VALUE)?;
        let mut st = initialized()?;
        let p = st.pools.get(&pool).ok_or(codes::BAD_HANDLE)?;
        let map = p.imported.clone().ok_or(codes::INVALID_VALUE)?;
        if p.imported_id != id {
            return Err(codes::INVALID_VALUE);
        }
        let (host, device) = (p.host, p.device);
        // A second import of a pointer this pool has mapped and not freed is the same mapping
        // (measured): no new address, no reference count; the first free unmaps it for both.
        let live = st.allocs.values().find(|a| {
            a.kind == AllocKind::Ipc
                && a.pool == Some(pool)
                && a.ipc_offset == Some(offset)
                && a.size == size
        });
        if let Some(a) = live {
            let addr = a.addr;
            info.alloc = Some(a.id);
            return Ok(addr);
        }
        let backing = Backing::mapped(map, offset, size as usize).ok_or(codes::INVALID_VALUE)?;
        let addr = if host {
            backing.ptr() as u64
        } else {
            st.device_va(size)?
        };
        info.alloc = Some(st.insert_alloc(Alloc {
            pool: Some(pool),
            ipc_offset: Some(offset),
            ..Alloc::new(addr, size, AllocKind::Ipc, device, host, backing)
        }));
        Ok(addr)
    })
}
