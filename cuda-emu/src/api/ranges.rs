//! Pointer attributes in bulk (`cuPointerGetAttributes`), address ranges, the CUDA 13 memory-pool
//! lookups by location (`cuMemGetMemPool` and friends), and managed memory advice, prefetch and
//! range attributes as bookkeeping: all memory is one host memory, so advice and prefetch change
//! nothing but what the range attributes report.

use std::collections::HashMap;
use std::ffi::{c_uint, c_ulonglong, c_void};
use std::sync::{LazyLock, Mutex};

use cuda_sys::types::*;
use cuda_sys::CUresult;

use super::memory::pointer_attribute;
use super::pool::{RawLocation, LOCATION_DEVICE, LOCATION_HOST, LOCATION_HOST_NUMA, LOCATION_NONE};
use super::{answer, get, get_slice, need, put, Out};
use crate::codes::{self, Res};
use crate::log::entry;
use crate::memory::AllocKind;
use crate::state::{initialized, State};
use crate::thread::lock;

#[no_mangle]
pub unsafe extern "C" fn cuPointerGetAttributes(
    count: c_uint,
    attributes: *mut CUpointer_attribute,
    data: *mut *mut c_void,
    ptr: CUdeviceptr,
) -> CUresult {
    entry("cuPointerGetAttributes", None, Some(ptr), |info| {
        // SAFETY: `count` attributes and as many data pointers (driver contract).
        let attrs: Vec<u32> =
            unsafe { get_slice(attributes.cast_const().cast::<u32>(), count as usize)? };
        // SAFETY: as above.
        let slots: Vec<*mut c_void> = unsafe { get_slice(data.cast_const(), count as usize)? };
        let st = initialized()?;
        let start = st.find_live(ptr);
        info.alloc = start.and_then(|start| st.alloc_id(start));
        let known = start.is_some();
        for (&attr, &slot) in attrs.iter().zip(&slots) {
            if slot.is_null() {
                return Err(codes::INVALID_VALUE);
            }
            if known {
                // SAFETY: the caller's storage for this attribute (driver contract).
                match unsafe { pointer_attribute(&st, attr, ptr, slot) } {
                    Ok(()) => {}
                    // The host pointer of device memory reads as NULL here (documented: this
                    // call assigns NULL values rather than failing).
                    Err(e) if e == codes::INVALID_VALUE => {
                        // SAFETY: as above; the host pointer is a pointer-sized value.
                        unsafe { put(slot.cast::<u64>(), 0)? }
                    }
                    Err(e) => return Err(e),
                }
            } else {
                // Not CUDA memory: no error, and what a real driver writes (F19).
                // SAFETY: as above; every attribute's type is at least 4 bytes, pointer-sized
                // ones get all 8 written.
                unsafe { default_attribute(attr, ptr, slot)? };
            }
        }
        Ok(())
    })
}

/// What `cuPointerGetAttributes` writes for an attribute of a pointer the driver does not know
/// (measured on an H200, driver 580.159.04, for freed device memory, pageable host memory and a
/// small integer: `docs/driver-facts.md` F19): NULL values (a context, device pointer, buffer ID
/// or pool of 0; a memory type, managed, mapped or IPC-capable flag of 0), the device ordinal
/// -2, the host pointer the address asked about, and nothing at all for the range's start and
/// size (the caller's storage keeps what it held).
///
/// # Safety
/// `slot` is valid for a write of the attribute's type.
unsafe fn default_attribute(attr: u32, ptr: CUdeviceptr, slot: *mut c_void) -> Res {
    use cuda_sys::types::CUpointer_attribute as P;
    let unwritten = [
        P::CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,
        P::CU_POINTER_ATTRIBUTE_RANGE_SIZE,
    ];
    let wide = [
        P::CU_POINTER_ATTRIBUTE_CONTEXT,
        P::CU_POINTER_ATTRIBUTE_DEVICE_POINTER,
        P::CU_POINTER_ATTRIBUTE_BUFFER_ID,
        P::CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES,
        P::CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE,
    ];
    // SAFETY: per this function's contract.
    unsafe {
        if unwritten.iter().any(|&u| u as u32 == attr) {
            Ok(())
        } else if attr == P::CU_POINTER_ATTRIBUTE_HOST_POINTER as u32 {
            put(slot.cast::<u64>(), ptr)
        } else if wide.iter().any(|&w| w as u32 == attr) {
            put(slot.cast::<u64>(), 0)
        } else if attr == P::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL as u32 {
            put(slot.cast::<i32>(), -2)
        } else {
            put(slot.cast::<u32>(), 0)
        }
    }
}

#[no_mangle]
pub unsafe extern "C" fn cuMemGetAddressRange_v2(
    base: *mut CUdeviceptr,
    size: *mut usize,
    ptr: CUdeviceptr,
) -> CUresult {
    entry("cuMemGetAddressRange_v2", None, Some(ptr), |_| {
        let st = initialized()?;
        let start = st.find_live(ptr).ok_or(codes::BAD_POINTER)?;
        let len = st.allocs[&start].size as usize;
        // SAFETY: optional out-pointers (driver contract: either may be NULL).
        unsafe {
            super::put_opt(base, start);
            super::put_opt(size, len);
        }
        Ok(())
    })
}

// ---------------------------------------------------------------------------------------------
// Pools by location (CUDA 13). Locations and allocation types are taken as plain integers
// (`RawMemLocation`, `c_uint`): the CUDA 12.0 enums lack the host, host-NUMA, "none" and managed
// values these calls are asked with.

/// `CU_MEM_ALLOCATION_TYPE_PINNED`, `CU_MEM_ALLOCATION_TYPE_MANAGED`.
const ALLOCATION_PINNED: u32 = 1;
const ALLOCATION_MANAGED: u32 = 2;

/// The pool `cuMemGetMemPool`/`cuMemGetDefaultMemPool` name for a location: a device's current
/// or default pool, or the host's default pool (created on first use, like the driver's). For
/// managed memory the location may also be `CU_MEM_LOCATION_TYPE_NONE` (documented: the managed
/// pool of no preferred location; its id is ignored), which cuda.core's `ManagedMemoryResource()`
/// asks for.
fn pool_for(st: &mut State, loc: RawLocation, kind: u32, current: bool) -> Res<u64> {
    if kind != ALLOCATION_PINNED && kind != ALLOCATION_MANAGED {
        return Err(codes::INVALID_VALUE);
    }
    match loc.kind {
        LOCATION_DEVICE if kind == ALLOCATION_PINNED => {
            let d = st.device(loc.id).map_err(|_| codes::INVALID_VALUE)?;
            Ok(if current {
                d.current_pool
            } else {
                d.default_pool
            })
        }
        LOCATION_NONE if kind != ALLOCATION_MANAGED => Err(codes::INVALID_VALUE),
        LOCATION_DEVICE | LOCATION_HOST | LOCATION_HOST_NUMA | LOCATION_NONE => {
            let key = (loc.kind, location_key_id(loc), kind);
            if loc.kind == LOCATION_DEVICE {
                st.device(loc.id).map_err(|_| codes::INVALID_VALUE)?;
            }
            let mut defaults = lock(&LOCATION_POOLS);
            if let Some(&(default, chosen)) = defaults.get(&key) {
                if st.pools.contains_key(&chosen) && current {
                    return Ok(chosen);
                }
                if st.pools.contains_key(&default) {
                    return Ok(default);
                }
            }
            let pool = st.create_location_pool(loc.kind, loc.id, kind == ALLOCATION_MANAGED);
            defaults.insert(key, (pool, pool));
            Ok(pool)
        }
        _ => Err(codes::INVALID_VALUE),
    }
}

/// The id part of a location's key: the host and "no location" have one pool each, whatever
/// id the caller passed.
fn location_key_id(loc: RawLocation) -> i32 {
    if loc.kind == LOCATION_HOST || loc.kind == LOCATION_NONE {
        0
    } else {
        loc.id
    }
}

/// (location type, id, allocation type) -> (default pool, current pool) for the locations that
/// have no device entry: host pools and managed pools.
static LOCATION_POOLS: LazyLock<Mutex<HashMap<(u32, i32, u32), (u64, u64)>>> =
    LazyLock::new(|| Mutex::new(HashMap::new()));

unsafe fn pool_lookup(
    function: &'static str,
    out: *mut CUmemoryPool,
    location: *mut RawMemLocation,
    kind: c_uint,
    current: bool,
) -> CUresult {
    // SAFETY: the caller's out-pointer (driver contract).
    answer(function, unsafe { Out::new(out) }, |_| {
        // SAFETY: the caller's location (driver contract).
        let loc: RawLocation = unsafe { get(location.cast_const().cast::<RawLocation>())? };
        let mut st = initialized()?;
        let pool = pool_for(&mut st, loc, kind, current)?;
        Ok(pool as CUmemoryPool)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemGetMemPool(
    out: *mut CUmemoryPool,
    location: *mut RawMemLocation,
    kind: c_uint,
) -> CUresult {
    // SAFETY: the caller's pointers (driver contract).
    unsafe { pool_lookup("cuMemGetMemPool", out, location, kind, true) }
}

#[no_mangle]
pub unsafe extern "C" fn cuMemGetDefaultMemPool(
    out: *mut CUmemoryPool,
    location: *mut RawMemLocation,
    kind: c_uint,
) -> CUresult {
    // SAFETY: the caller's pointers (driver contract).
    unsafe { pool_lookup("cuMemGetDefaultMemPool", out, location, kind, false) }
}

#[no_mangle]
pub unsafe extern "C" fn cuMemSetMemPool(
    location: *mut RawMemLocation,
    kind: c_uint,
    pool: CUmemoryPool,
) -> CUresult {
    let pool = pool as u64;
    entry("cuMemSetMemPool", None, None, |_| {
        // SAFETY: the caller's location (driver contract).
        let loc: RawLocation = unsafe { get(location.cast_const().cast::<RawLocation>())? };
        let mut st = initialized()?;
        st.pools.get(&pool).ok_or(codes::BAD_HANDLE)?;
        if loc.kind == LOCATION_DEVICE && kind == ALLOCATION_PINNED {
            drop(st);
            // SAFETY: plain values (driver contract).
            let r = unsafe { super::cuDeviceSetMemPool(loc.id, pool as CUmemoryPool) };
            return if r == codes::SUCCESS { Ok(()) } else { Err(r) };
        }
        pool_for(&mut st, loc, kind, false)?;
        let key = (loc.kind, location_key_id(loc), kind);
        if let Some(entry) = lock(&LOCATION_POOLS).get_mut(&key) {
            entry.1 = pool;
        }
        Ok(())
    })
}

// ---------------------------------------------------------------------------------------------
// Managed memory: advice, prefetch, range attributes

/// What advice and prefetch recorded for one managed allocation.
#[derive(Clone, Default)]
struct Advice {
    /// The allocation's identity ([`Alloc::id`](crate::memory::Alloc)), to tell a later
    /// allocation at the same address apart: the address of its backing is not enough, the heap
    /// hands a freed backing's address to the next one.
    alloc_id: u64,
    read_mostly: bool,
    preferred: Option<RawLocation>,
    accessed_by: Vec<RawLocation>,
    last_prefetch: Option<RawLocation>,
}

static ADVICE: LazyLock<Mutex<HashMap<u64, Advice>>> = LazyLock::new(|| Mutex::new(HashMap::new()));

/// `CU_DEVICE_CPU`: the host, where a CUDA 8 advice call names a device.
const DEVICE_CPU: i32 = -1;
/// The "no location" of the range attributes (documented `CU_DEVICE_INVALID`).
const DEVICE_INVALID: i32 = -2;

/// The managed allocation containing `[ptr, ptr + count)`: its start (the advice entry's key)
/// and its identity.
fn managed_range(st: &State, ptr: u64, count: usize) -> Res<(u64, u64)> {
    let start = st.find_live(ptr).ok_or(codes::BAD_POINTER)?;
    let a = &st.allocs[&start];
    if count == 0 || ptr + count as u64 > start + a.size {
        return Err(codes::INVALID_VALUE);
    }
    let managed = a.kind == AllocKind::Managed
        || a.pool
            .and_then(|p| st.pools.get(&p))
            .is_some_and(|p| p.managed);
    if !managed {
        return Err(codes::INVALID_VALUE);
    }
    Ok((start, a.id))
}

fn with_advice<R>(start: u64, alloc_id: u64, f: impl FnOnce(&mut Advice) -> R) -> R {
    let mut table = lock(&ADVICE);
    let entry = table.entry(start).or_default();
    if entry.alloc_id != alloc_id {
        *entry = Advice {
            alloc_id,
            ..Advice::default()
        };
    }
    f(entry)
}

fn check_location(st: &State, loc: RawLocation) -> Res {
    match loc.kind {
        LOCATION_DEVICE => st.device(loc.id).map(|_| ()).map_err(|_| codes::BAD_DEVICE),
        LOCATION_HOST | LOCATION_HOST_NUMA | 4 => Ok(()),
        _ => Err(codes::INVALID_VALUE),
    }
}

/// A memory advice for `count` bytes at `ptr`, the body of `cuMemAdvise` and `cuMemAdvise_v2`
/// (`function`).
fn advise(
    function: &'static str,
    ptr: u64,
    count: usize,
    advice: u32,
    loc: RawLocation,
) -> CUresult {
    entry(function, None, Some(ptr), |_| {
        let st = initialized()?;
        let (start, alloc_id) = managed_range(&st, ptr, count)?;
        if matches!(advice, 3 | 5 | 6) {
            check_location(&st, loc)?;
        }
        with_advice(start, alloc_id, |a| match advice {
            1 => a.read_mostly = true,
            2 => a.read_mostly = false,
            // Measured on the H200 (one NUMA node; the GPU's own NUMA id -1), driver facts F22:
            // the host reads back with location id -1, and a preferred location on host NUMA node 0
            // is accepted but not kept (reads back as none).
            3 => {
                a.preferred = match loc.kind {
                    LOCATION_HOST => Some(RawLocation {
                        id: DEVICE_CPU,
                        ..loc
                    }),
                    LOCATION_HOST_NUMA => None,
                    _ => Some(loc),
                }
            }
            4 => a.preferred = None,
            5 => {
                if !a.accessed_by.contains(&loc) {
                    a.accessed_by.push(loc);
                }
            }
            6 => a.accessed_by.retain(|l| *l != loc),
            _ => {}
        });
        if advice == 0 || advice > 6 {
            return Err(codes::INVALID_VALUE);
        }
        Ok(())
    })
}

/// The loader's `CUmemLocation` (the same layout) as the emulator's.
fn raw_location(location: RawMemLocation) -> RawLocation {
    RawLocation {
        kind: location.type_,
        id: location.id,
    }
}

fn location_of_device(device: CUdevice) -> RawLocation {
    if device == DEVICE_CPU {
        RawLocation {
            kind: LOCATION_HOST,
            id: 0,
        }
    } else {
        RawLocation {
            kind: LOCATION_DEVICE,
            id: device,
        }
    }
}

#[no_mangle]
pub unsafe extern "C" fn cuMemAdvise(
    ptr: CUdeviceptr,
    count: usize,
    advice: c_uint,
    device: CUdevice,
) -> CUresult {
    advise(
        "cuMemAdvise",
        ptr,
        count,
        advice,
        location_of_device(device),
    )
}

#[no_mangle]
pub unsafe extern "C" fn cuMemAdvise_v2(
    ptr: CUdeviceptr,
    count: usize,
    advice: c_uint,
    location: RawMemLocation,
) -> CUresult {
    advise("cuMemAdvise_v2", ptr, count, advice, raw_location(location))
}

/// A prefetch: a stream operation that does nothing but order, and the recorded location.
fn prefetch(
    ptr: u64,
    count: usize,
    loc: RawLocation,
    s: u64,
    info: &mut crate::log::CallInfo,
) -> Res {
    let (mut st, r) = info.lock_stream(s)?;
    let (start, alloc_id) = managed_range(&st, ptr, count)?;
    check_location(&st, loc)?;
    if st.enqueue_check(r)? {
        // Captured prefetches are not emulated (no graph node kind for them).
        return Err(codes::NOT_SUPPORTED);
    }
    let (deps, time) = st.prepare(r);
    st.record_use(Some(start), r, time);
    st.submit(r, deps, None, false);
    with_advice(start, alloc_id, |a| a.last_prefetch = Some(loc));
    Ok(())
}

/// One prefetch, the body of `cuMemPrefetchAsync` and `cuMemPrefetchAsync_v2` (`function`; the
/// first form has no flags, and passes 0).
fn prefetch_range(
    function: &'static str,
    ptr: u64,
    count: usize,
    loc: RawLocation,
    flags: c_uint,
    s: CUstream,
) -> CUresult {
    let s = s as u64;
    entry(function, Some(s), Some(ptr), |info| {
        if flags != 0 {
            return Err(codes::INVALID_VALUE);
        }
        prefetch(ptr, count, loc, s, info)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemPrefetchAsync(
    ptr: CUdeviceptr,
    count: usize,
    device: CUdevice,
    s: CUstream,
) -> CUresult {
    prefetch_range(
        "cuMemPrefetchAsync",
        ptr,
        count,
        location_of_device(device),
        0,
        s,
    )
}

#[no_mangle]
pub unsafe extern "C" fn cuMemPrefetchAsync_v2(
    ptr: CUdeviceptr,
    count: usize,
    location: RawMemLocation,
    flags: c_uint,
    s: CUstream,
) -> CUresult {
    prefetch_range(
        "cuMemPrefetchAsync_v2",
        ptr,
        count,
        raw_location(location),
        flags,
        s,
    )
}

/// The batch forms (`function`): `count` ranges, prefetch location `i` applying from range
/// `loc_indices[i]` on.
///
/// # Safety
/// The arrays hold the documented number of items.
#[allow(clippy::too_many_arguments)]
unsafe fn batch(
    function: &'static str,
    ptrs: *const CUdeviceptr,
    sizes: *const usize,
    count: usize,
    locs: *const RawLocation,
    loc_indices: *const usize,
    num_locs: usize,
    flags: c_ulonglong,
    s: CUstream,
    discard: bool,
) -> CUresult {
    let s = s as u64;
    entry(function, Some(s), None, |info| {
        if count == 0 || flags != 0 {
            return Err(codes::INVALID_VALUE);
        }
        // SAFETY: per this function's contract.
        let (ptrs, sizes) = unsafe { (get_slice(ptrs, count)?, get_slice(sizes, count)?) };
        // SAFETY: as above.
        let (locs, indices) = unsafe {
            (
                get_slice(locs, num_locs)?,
                get_slice(loc_indices, num_locs)?,
            )
        };
        if !discard || num_locs > 0 {
            if num_locs == 0
                || indices.first() != Some(&0)
                || indices.windows(2).any(|w| w[0] >= w[1])
            {
                return Err(codes::INVALID_VALUE);
            }
        }
        {
            let st = initialized()?;
            for (&p, &n) in ptrs.iter().zip(&sizes) {
                managed_range(&st, p, n)?;
            }
            for &l in &locs {
                check_location(&st, l)?;
            }
        }
        for (i, (&p, &n)) in ptrs.iter().zip(&sizes).enumerate() {
            let which = indices.iter().rposition(|&from| from <= i);
            match which {
                Some(k) => prefetch(p, n, locs[k], s, info)?,
                None => {
                    let st = initialized()?;
                    let (start, alloc_id) = managed_range(&st, p, n)?;
                    with_advice(start, alloc_id, |a| a.last_prefetch = None);
                }
            }
        }
        Ok(())
    })
}

/// `cuMemPrefetchBatchAsync` and `cuMemDiscardAndPrefetchBatchAsync`: one signature and, here,
/// one behaviour (discarding leaves the bytes undefined; keeping them is one of the allowed
/// outcomes), each export logged under its own name.
macro_rules! prefetch_batch_exports {
    ($($name:ident)*) => {$(
        #[no_mangle]
        pub unsafe extern "C" fn $name(
            ptrs: *const CUdeviceptr,
            sizes: *const usize,
            count: usize,
            locs: *const RawMemLocation,
            loc_indices: *const usize,
            num_locs: usize,
            flags: c_ulonglong,
            s: CUstream,
        ) -> CUresult {
            // SAFETY: the caller's arrays (driver contract).
            unsafe {
                batch(
                    stringify!($name),
                    ptrs,
                    sizes,
                    count,
                    locs.cast::<RawLocation>(),
                    loc_indices,
                    num_locs,
                    flags,
                    s,
                    false,
                )
            }
        }
    )*};
}

prefetch_batch_exports!(cuMemPrefetchBatchAsync cuMemDiscardAndPrefetchBatchAsync);

#[no_mangle]
pub unsafe extern "C" fn cuMemDiscardBatchAsync(
    ptrs: *const CUdeviceptr,
    sizes: *const usize,
    count: usize,
    flags: c_ulonglong,
    s: CUstream,
) -> CUresult {
    // Discarding leaves the bytes undefined; keeping them is one of the allowed outcomes.
    // SAFETY: the caller's arrays (driver contract).
    unsafe {
        batch(
            "cuMemDiscardBatchAsync",
            ptrs,
            sizes,
            count,
            std::ptr::null(),
            std::ptr::null(),
            0,
            flags,
            s,
            true,
        )
    }
}

/// One range attribute into `data` (`size` bytes).
///
/// # Safety
/// `data` is valid for `size` bytes of writes.
unsafe fn range_attribute(
    st: &State,
    data: *mut c_void,
    size: usize,
    attr: u32,
    ptr: u64,
    count: usize,
) -> Res {
    need(data)?;
    let (start, alloc_id) = managed_range(st, ptr, count)?;
    let a = with_advice(start, alloc_id, |a| a.clone());
    let id_of = |l: Option<RawLocation>| match l {
        Some(l) if l.kind == LOCATION_DEVICE => l.id,
        Some(_) => DEVICE_CPU,
        None => DEVICE_INVALID,
    };
    let int = |v: i32| -> Res {
        if size < 4 {
            return Err(codes::INVALID_VALUE);
        }
        // SAFETY: per this function's contract, at least 4 bytes.
        unsafe { put(data.cast::<i32>(), v) }
    };
    match attr {
        1 => int(i32::from(a.read_mostly)),
        2 => int(id_of(a.preferred)),
        3 => {
            if size % 4 != 0 || size == 0 {
                return Err(codes::INVALID_VALUE);
            }
            let n = size / 4;
            for i in 0..n {
                let v = a
                    .accessed_by
                    .get(i)
                    .map_or(DEVICE_INVALID, |&l| id_of(Some(l)));
                // SAFETY: i < size / 4, per this function's contract.
                unsafe { data.cast::<i32>().add(i).write_unaligned(v) };
            }
            Ok(())
        }
        4 => int(id_of(a.last_prefetch)),
        5 => int(a.preferred.map_or(0, |l| l.kind as i32)),
        6 => int(a.preferred.map_or(DEVICE_INVALID, |l| l.id)),
        7 => int(a.last_prefetch.map_or(0, |l| l.kind as i32)),
        8 => int(a.last_prefetch.map_or(DEVICE_INVALID, |l| l.id)),
        _ => Err(codes::INVALID_VALUE),
    }
}

#[no_mangle]
pub unsafe extern "C" fn cuMemRangeGetAttribute(
    data: *mut c_void,
    size: usize,
    attr: c_uint,
    ptr: CUdeviceptr,
    count: usize,
) -> CUresult {
    entry("cuMemRangeGetAttribute", None, Some(ptr), |_| {
        let st = initialized()?;
        // Measured on the H200: with no context current, CUDA_ERROR_INVALID_CONTEXT (F23).
        st.current_ctx()?;
        // SAFETY: the caller's storage of `size` bytes (driver contract).
        unsafe { range_attribute(&st, data, size, attr, ptr, count) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemRangeGetAttributes(
    data: *mut *mut c_void,
    sizes: *const usize,
    attrs: *const c_uint,
    n: usize,
    ptr: CUdeviceptr,
    count: usize,
) -> CUresult {
    entry("cuMemRangeGetAttributes", None, Some(ptr), |_| {
        if n == 0 {
            return Err(codes::INVALID_VALUE);
        }
        // SAFETY: `n` items each (driver contract).
        let (slots, sizes, attrs) = unsafe {
            (
                get_slice(data.cast_const(), n)?,
                get_slice(sizes, n)?,
                get_slice(attrs, n)?,
            )
        };
        let st = initialized()?;
        for i in 0..n {
            // SAFETY: slot i holds sizes[i] bytes (driver contract).
            unsafe { range_attribute(&st, slots[i], sizes[i], attrs[i], ptr, count)? };
        }
        Ok(())
    })
}
