//! The emulator's extra C symbols, the interface `test_support::emu` documents: fault injection
//! and JSON queries for live allocations, hazards and the call log.

use std::ffi::{c_char, c_int, c_uint, CStr};

use cuda_sys::CUresult;
use serde::Serialize;

use crate::codes;
use crate::log;
use crate::state::state;
use crate::thread::thread_id;

/// The interface version (`test_support::emu::INTERFACE_VERSION`).
pub const INTERFACE_VERSION: c_int = 1;

#[derive(Serialize)]
struct AllocationJson {
    id: u64,
    ptr: u64,
    size: u64,
    kind: &'static str,
    device: i32,
    pool: Option<u64>,
}

/// Returns [`INTERFACE_VERSION`].
#[no_mangle]
pub extern "C" fn custodyEmuVersion() -> c_int {
    INTERFACE_VERSION
}

fn c_str<'a>(p: *const c_char) -> Option<&'a str> {
    if p.is_null() {
        return None;
    }
    // SAFETY: non-null and NUL-terminated per the interface's contract.
    unsafe { CStr::from_ptr(p) }.to_str().ok()
}

/// Makes the `nth` next call of `function` return `error` without effect, once.
///
/// # Safety
/// `function` is null or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn custodyEmuInjectFault(
    function: *const c_char,
    nth: c_uint,
    error: CUresult,
) -> CUresult {
    let Some(name) = c_str(function) else {
        return codes::INVALID_VALUE;
    };
    if nth == 0 || crate::api::export_named(name).is_none() {
        return codes::INVALID_VALUE;
    }
    log::inject_fault(name, nth, error);
    codes::SUCCESS
}

/// Removes every pending injected fault.
#[no_mangle]
pub extern "C" fn custodyEmuClearFaults() {
    log::clear_faults();
}

fn query_json(what: &str) -> Option<String> {
    match what {
        "allocations" => {
            let st = state();
            let list: Vec<AllocationJson> = st
                .allocs
                .values()
                .map(|a| AllocationJson {
                    id: a.id,
                    ptr: a.addr,
                    size: a.size,
                    kind: a.kind.name(),
                    device: a.device,
                    pool: a.pool,
                })
                .collect();
            serde_json::to_string(&list).ok()
        }
        "hazards" => serde_json::to_string(&log::hazards_snapshot()).ok(),
        "calls" => serde_json::to_string(&log::calls_snapshot()).ok(),
        _ => None,
    }
}

/// Writes the JSON for `what` into `buf` (NUL-terminated) when it fits and returns its length
/// without the NUL; 0 for an unknown `what`.
///
/// # Safety
/// `what` is null or NUL-terminated; `buf` is null or writable for `len` bytes.
#[no_mangle]
pub unsafe extern "C" fn custodyEmuQuery(
    what: *const c_char,
    buf: *mut c_char,
    len: usize,
) -> usize {
    let Some(json) = c_str(what).and_then(query_json) else {
        return 0;
    };
    let n = json.len();
    if !buf.is_null() && n < len {
        // SAFETY: `buf` is writable for `len > n` bytes per the contract.
        unsafe {
            std::ptr::copy_nonoverlapping(json.as_ptr(), buf.cast::<u8>(), n);
            buf.add(n).write(0);
        }
    }
    n
}

/// Forgets the recorded `hazards` or `calls` (or pending `faults`).
///
/// # Safety
/// `what` is null or NUL-terminated.
#[no_mangle]
pub unsafe extern "C" fn custodyEmuClear(what: *const c_char) {
    match c_str(what) {
        Some("hazards") => log::clear_hazards(),
        Some("calls") => log::clear_calls(),
        Some("faults") => log::clear_faults(),
        _ => {}
    }
}

/// Makes the next stream created (`cuStreamCreate`, `cuStreamCreateWithPriority`) take
/// `handle`, the handle of a stream destroyed before, as a real driver may hand a freed
/// stream's handle out again (the hazard a cache keyed on stream handles must survive). The new
/// stream is another stream: its work is ordered after the old one's only as any two streams'
/// are, and `cuStreamGetId` gives it another id. Returns `CUDA_SUCCESS`, or
/// `CUDA_ERROR_INVALID_VALUE` (and nothing changes) when `handle` is not a destroyed stream's.
#[no_mangle]
pub extern "C" fn custodyEmuReuseStreamHandle(handle: u64) -> CUresult {
    if state().reuse_stream_handle(handle) {
        codes::SUCCESS
    } else {
        codes::INVALID_VALUE
    }
}

/// The calling thread's id in the call log.
#[no_mangle]
pub extern "C" fn custodyEmuThreadId() -> u64 {
    thread_id()
}
