//! Queries and small controls of devices, contexts, streams and events that NVIDIA's cuda.core
//! (and most other clients) ask for beyond custody's own needs: UUIDs, total memory, stream
//! priority ranges, stream and context ids, the CUDA 13 `_v2` forms of `cuCtxSynchronize`,
//! `cuCtxGetDevice` and `cuStreamGetCtx`, the third form of `cuStreamGetCaptureInfo`, event
//! records with flags and event timing.

use std::ffi::{c_int, c_uint, c_ulonglong, c_void};

use cuda_sys::types::*;
use cuda_sys::CUresult;

use super::{answer, context_arg, need, put, put_opt, stream_property, synchronize_context, Out};
use crate::codes;
use crate::log::entry;
use crate::memory::DEVICE_MEMORY;
use crate::state::{initialized, GREATEST_PRIORITY, LEAST_PRIORITY};

/// The 16 bytes of a device's UUID: fixed per ordinal (`cuda-emu` and the ordinal), so that two
/// processes see the same UUID for the same device, as they do on a real machine.
fn uuid(dev: CUdevice) -> [u8; 16] {
    let mut bytes = *b"custody-emu-dev\0";
    bytes[12..16].copy_from_slice(&(dev as u32).to_be_bytes());
    bytes
}

/// The body of `cuDeviceGetUuid` and its `_v2` form (`function`).
///
/// # Safety
/// `out` is null or the caller's 16-byte `CUuuid` (driver contract).
unsafe fn device_uuid(function: &'static str, out: *mut c_void, dev: CUdevice) -> CUresult {
    // SAFETY: valid per this function's contract.
    let out = unsafe { Out::new(out.cast::<[u8; 16]>()) };
    answer(function, out, |_| {
        initialized()?.device(dev)?;
        Ok(uuid(dev))
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetUuid(out: *mut c_void, dev: CUdevice) -> CUresult {
    // SAFETY: the caller's out-pointer (driver contract).
    unsafe { device_uuid("cuDeviceGetUuid", out, dev) }
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetUuid_v2(out: *mut c_void, dev: CUdevice) -> CUresult {
    // SAFETY: the caller's out-pointer (driver contract).
    unsafe { device_uuid("cuDeviceGetUuid_v2", out, dev) }
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceTotalMem_v2(bytes: *mut usize, dev: CUdevice) -> CUresult {
    // SAFETY: the caller's out-pointer (driver contract).
    answer("cuDeviceTotalMem_v2", unsafe { Out::new(bytes) }, |_| {
        initialized()?.device(dev)?;
        Ok(DEVICE_MEMORY as usize)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxGetStreamPriorityRange(
    least: *mut c_int,
    greatest: *mut c_int,
) -> CUresult {
    entry("cuCtxGetStreamPriorityRange", None, None, |_| {
        initialized()?.current_ctx()?;
        // SAFETY: optional out-pointers (driver contract: either may be NULL).
        unsafe {
            put_opt(least, LEAST_PRIORITY);
            put_opt(greatest, GREATEST_PRIORITY);
        }
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxGetDevice_v2(device: *mut CUdevice, ctx: CUcontext) -> CUresult {
    // SAFETY: the caller's out-pointer (driver contract).
    unsafe { super::context_device("cuCtxGetDevice_v2", device, ctx) }
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxSynchronize_v2(ctx: CUcontext) -> CUresult {
    entry("cuCtxSynchronize_v2", None, None, |_| {
        synchronize_context(|st| context_arg(st, ctx))
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxGetFlags(flags: *mut c_uint) -> CUresult {
    // SAFETY: the caller's out-pointer (driver contract).
    answer("cuCtxGetFlags", unsafe { Out::new(flags) }, |_| {
        let st = initialized()?;
        let c = st.current_ctx()?;
        let ctx = &st.contexts[&c];
        let value = if ctx.primary {
            st.device(ctx.device)?.primary_flags
        } else {
            0
        };
        Ok(value)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxGetId(ctx: CUcontext, id: *mut c_ulonglong) -> CUresult {
    // SAFETY: the caller's out-pointer (driver contract).
    answer("cuCtxGetId", unsafe { Out::new(id) }, |_| {
        let st = initialized()?;
        let c = context_arg(&st, ctx)?;
        // Context handles are never reused, so the handle is a unique id.
        Ok(c)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamGetId(s: CUstream, id: *mut c_ulonglong) -> CUresult {
    // Unique for the life of the process, as the driver documents: a stream given a destroyed
    // stream's handle (custodyEmuReuseStreamHandle) has another identity.
    // SAFETY: the caller's out-pointer (driver contract).
    unsafe { stream_property("cuStreamGetId", s, id, |_, stream| stream.id) }
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamGetDevice(s: CUstream, device: *mut CUdevice) -> CUresult {
    // SAFETY: the caller's out-pointer (driver contract).
    unsafe { stream_property("cuStreamGetDevice", s, device, |_, stream| stream.device) }
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamGetCtx_v2(
    s: CUstream,
    pctx: *mut CUcontext,
    green: *mut *mut c_void,
) -> CUresult {
    let s = s as u64;
    entry("cuStreamGetCtx_v2", Some(s), None, |info| {
        need(pctx)?;
        let (st, r) = info.lock_stream(s)?;
        // No green contexts: the green context is NULL (documented for a stream of a context).
        // SAFETY: checked non-null; the green context out-pointer is optional (driver contract).
        unsafe {
            put_opt(green, std::ptr::null_mut());
            put(pctx, st.streams[&r].ctx as CUcontext)
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamGetCaptureInfo_v3(
    s: CUstream,
    status: *mut CUstreamCaptureStatus,
    id_out: *mut cuuint64_t,
    graph_out: *mut CUgraph,
    deps_out: *mut *const CUgraphNode,
    edges_out: *mut *const c_void,
    n_out: *mut usize,
) -> CUresult {
    // SAFETY: the caller's out-pointers (driver contract); the v2 form writes the same ones.
    let result =
        unsafe { super::cuStreamGetCaptureInfo_v2(s, status, id_out, graph_out, deps_out, n_out) };
    if result == codes::SUCCESS {
        // Every captured edge is a plain one: NULL edge data means exactly that (documented).
        // SAFETY: optional out-pointer (driver contract).
        unsafe { put_opt(edges_out, std::ptr::null()) };
    }
    result
}

#[no_mangle]
pub unsafe extern "C" fn cuEventRecordWithFlags(
    e: CUevent,
    s: CUstream,
    flags: c_uint,
) -> CUresult {
    if flags & !1 != 0 {
        // Only CU_EVENT_RECORD_EXTERNAL (1) exists.
        return entry("cuEventRecordWithFlags", Some(s as u64), None, |_| {
            Err(codes::INVALID_VALUE)
        });
    }
    // SAFETY: plain handles (driver contract).
    unsafe { super::cuEventRecord(e, s) }
}

/// `CU_EVENT_DISABLE_TIMING`.
const EVENT_DISABLE_TIMING: u32 = 0x2;

/// The time between two recorded events in milliseconds, the body of `cuEventElapsedTime` and
/// its `_v2` form (`function`).
///
/// # Safety
/// `ms` is null or valid for a write (the driver API's contract for out-pointers).
unsafe fn elapsed(function: &'static str, ms: *mut f32, start: CUevent, end: CUevent) -> CUresult {
    let (start, end) = (start as u64, end as u64);
    // SAFETY: the caller's out-pointer (driver contract).
    answer(function, unsafe { Out::new(ms) }, |_| {
        let (a, b) = {
            let st = initialized()?;
            let a = st.events.get(&start).ok_or(codes::BAD_HANDLE)?;
            let b = st.events.get(&end).ok_or(codes::BAD_HANDLE)?;
            if a.flags & EVENT_DISABLE_TIMING != 0 || b.flags & EVENT_DISABLE_TIMING != 0 {
                return Err(codes::EVENT_NO_TIMING);
            }
            if a.captured.is_some() || b.captured.is_some() {
                return Err(codes::CAPTURED_EVENT_SYNCHRONIZE);
            }
            let (Some((da, _)), Some((db, _))) = (&a.record, &b.record) else {
                return Err(codes::EVENT_NOT_RECORDED);
            };
            if !da.done() || !db.done() {
                return Err(codes::NOT_READY);
            }
            (a.recorded_at.clone(), b.recorded_at.clone())
        };
        let (Some(a), Some(b)) = (*crate::thread::lock(&a), *crate::thread::lock(&b)) else {
            return Err(codes::NOT_READY);
        };
        let millis = if b >= a {
            (b - a).as_secs_f64() * 1e3
        } else {
            -((a - b).as_secs_f64() * 1e3)
        };
        Ok(millis as f32)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuEventElapsedTime(
    ms: *mut f32,
    start: CUevent,
    end: CUevent,
) -> CUresult {
    // SAFETY: the caller's out-pointer (driver contract).
    unsafe { elapsed("cuEventElapsedTime", ms, start, end) }
}

#[no_mangle]
pub unsafe extern "C" fn cuEventElapsedTime_v2(
    ms: *mut f32,
    start: CUevent,
    end: CUevent,
) -> CUresult {
    // SAFETY: the caller's out-pointer (driver contract).
    unsafe { elapsed("cuEventElapsedTime_v2", ms, start, end) }
}

/// The driver's private export tables (what the CUDA runtime, `cudart`, initialises through):
/// not emulated, as they are undocumented. Answers `CUDA_ERROR_NOT_SUPPORTED` and writes nothing;
/// the table id asked for (16 bytes, printed as hex) goes with the unsupported-call report
/// (`CUSTODY_EMU_WARN_UNSUPPORTED`, `CUSTODY_EMU_UNSUPPORTED_LOG`), so that a program's need of
/// the runtime can be told apart from its other unsupported calls.
#[no_mangle]
pub unsafe extern "C" fn cuGetExportTable(
    _table: *mut *const c_void,
    id: *const [u8; 16],
) -> CUresult {
    let detail = if id.is_null() {
        String::from(" id=null")
    } else {
        // SAFETY: the caller's 16-byte CUuuid (driver contract for a non-null id).
        let bytes = unsafe { id.read_unaligned() };
        let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
        format!(" id={hex}")
    };
    crate::log::note_unsupported("cuGetExportTable", &detail);
    entry("cuGetExportTable", None, None, |_| {
        Err(codes::NOT_SUPPORTED)
    })
}
