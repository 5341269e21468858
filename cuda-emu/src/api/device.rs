//! Initialisation, versions, error strings, `cuGetProcAddress` and devices.

use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::sync::LazyLock;

use cuda_sys::types::*;
use cuda_sys::{CUresult, CudaErrorCode};

use super::{answer, need, put, put_opt, Out};
use crate::codes::{self, Res};
use crate::log::entry;
use crate::state::{initialized, state};

/// The version `cuDriverGetVersion` reports (CUDA 13.0).
pub(crate) const DRIVER_VERSION: c_int = 13000;

#[no_mangle]
pub unsafe extern "C" fn cuInit(flags: c_uint) -> CUresult {
    entry("cuInit", None, None, |_| {
        if flags != 0 {
            return Err(codes::INVALID_VALUE);
        }
        state().init();
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuDriverGetVersion(version: *mut c_int) -> CUresult {
    // SAFETY: the caller's out-pointer (driver contract).
    entry("cuDriverGetVersion", None, None, |_| unsafe {
        put(version, DRIVER_VERSION)
    })
}

struct ErrorText {
    code: CUresult,
    name: CString,
    text: CString,
}

fn describe(code: CudaErrorCode) -> String {
    let known = match code.0 {
        0 => "no error",
        1 => "invalid argument",
        2 => "out of memory",
        3 => "initialization error",
        4 => "driver shutting down",
        100 => "no CUDA-capable device is detected",
        101 => "invalid device ordinal",
        201 => "invalid device context",
        400 => "invalid resource handle",
        401 => "the operation cannot be performed in the present state",
        500 => "named symbol not found",
        600 => "device not ready",
        700 => "an illegal memory access was encountered",
        709 => "context is destroyed",
        800 => "operation not permitted",
        801 => "operation not supported",
        900 => "operation not permitted when stream is capturing",
        901 => "operation failed due to a previous error during capture",
        904 => "capture was not joined",
        906 => "operation would make the legacy stream depend on a capturing blocking stream",
        907 => "operation not permitted on an event last recorded in a capturing stream",
        908 => "attempt to terminate a thread-local capture sequence from another thread",
        999 => "unknown error",
        _ => "",
    };
    if known.is_empty() {
        code.name()
            .trim_start_matches("CUDA_ERROR_")
            .replace('_', " ")
            .to_lowercase()
    } else {
        known.to_owned()
    }
}

static ERROR_TEXTS: LazyLock<Vec<ErrorText>> = LazyLock::new(|| {
    CudaErrorCode::all()
        .map(|(code, name)| ErrorText {
            code: code.0,
            name: CString::new(name).unwrap_or_default(),
            text: CString::new(describe(code)).unwrap_or_default(),
        })
        .collect()
});

fn error_text(error: CUresult, name: bool, out: *mut *const c_char) -> Res {
    need(out)?;
    let found = ERROR_TEXTS.iter().find(|t| t.code == error);
    let p = found.map_or(std::ptr::null(), |t| {
        if name {
            t.name.as_ptr()
        } else {
            t.text.as_ptr()
        }
    });
    // SAFETY: checked non-null; the caller's out-pointer (driver contract).
    unsafe { put(out, p)? };
    found.map(|_| ()).ok_or(codes::INVALID_VALUE)
}

#[no_mangle]
pub unsafe extern "C" fn cuGetErrorName(error: CUresult, p_str: *mut *const c_char) -> CUresult {
    entry("cuGetErrorName", None, None, |_| {
        error_text(error, true, p_str)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuGetErrorString(error: CUresult, p_str: *mut *const c_char) -> CUresult {
    entry("cuGetErrorString", None, None, |_| {
        error_text(error, false, p_str)
    })
}

macro_rules! export_lookup {
    ($($name:ident($($arg:ident: $ty:ty),* $(,)?);)*) => {
        /// Our export named exactly `name`, as an untyped pointer.
        pub(crate) fn export_named(name: &str) -> Option<*mut c_void> {
            match name {
                $(stringify!($name) => Some(super::$name as cuda_sys::fn_types::$name as *mut c_void),)*
                "cuGetProcAddress" => Some(cuGetProcAddress as GetProcAddressV1 as *mut c_void),
                _ => super::extra_named(name),
            }
        }
    };
}

type GetProcAddressV1 =
    unsafe extern "C" fn(*const c_char, *mut *mut c_void, c_int, cuuint64_t) -> CUresult;

cuda_sys::with_driver_functions!(export_lookup);

/// The symbol a driver of [`DRIVER_VERSION`] hands out for `name` asked for at `version`: the
/// newest variant of `name` that `version` knows (`names::VARIANTS`); `Err(true)` when `name` is
/// older than every variant (the version is too old), `Err(false)` when the driver API has no
/// such name.
pub(crate) fn variant_for(name: &str, version: c_int) -> Result<&'static str, bool> {
    let variants = super::names::VARIANTS;
    let first = variants.partition_point(|(n, _, _)| *n < name);
    let mut chosen = None;
    for &(n, since, symbol) in &variants[first..] {
        if n != name {
            break;
        }
        if since > version {
            return chosen.ok_or(true);
        }
        chosen = Some(symbol);
    }
    chosen.ok_or(first < variants.len() && variants[first].0 == name)
}

/// `cuGetProcAddress` resolution: (pointer, status). A name of the driver API resolves to the
/// variant its version asks for: our implementation when there is one, else the variant's
/// `CUDA_ERROR_NOT_SUPPORTED` export (`api::unsupported`), so that a client sees a driver error
/// rather than a missing function. Any other name is not found.
fn proc_address(symbol: *const c_char, version: c_int) -> Res<(*mut c_void, u32)> {
    const FOUND: u32 = CUdriverProcAddressQueryResult::CU_GET_PROC_ADDRESS_SUCCESS as u32;
    const MISSING: u32 =
        CUdriverProcAddressQueryResult::CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND as u32;
    const TOO_OLD: u32 =
        CUdriverProcAddressQueryResult::CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT as u32;
    need(symbol)?;
    // SAFETY: non-null, NUL-terminated per the driver contract.
    let name = unsafe { CStr::from_ptr(symbol) }.to_str().unwrap_or("");
    // This driver is CUDA 13.0: what appeared later does not exist here, whatever the caller's
    // headers know.
    let symbol = match variant_for(name, version.min(DRIVER_VERSION)) {
        Ok(symbol) => symbol,
        Err(true) if version > DRIVER_VERSION => return Ok((std::ptr::null_mut(), MISSING)),
        Err(true) => return Ok((std::ptr::null_mut(), TOO_OLD)),
        Err(false) => return Ok((std::ptr::null_mut(), MISSING)),
    };
    let p = export_named(symbol).or_else(|| super::unsupported::unsupported_named(symbol));
    Ok(p.map_or((std::ptr::null_mut(), MISSING), |p| (p, FOUND)))
}

/// The common part of `cuGetProcAddress` and its `_v2` form: `pfn` checked non-null, then the
/// address `symbol` resolves to at `version` (see [`proc_address`]) written through it; returns
/// it with its symbol status.
///
/// # Safety
/// `symbol` is null or NUL-terminated and `pfn` null or valid for a write (driver contract).
unsafe fn resolve_proc_address(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: c_int,
) -> Res<(*mut c_void, u32)> {
    need(pfn)?;
    let (p, status) = proc_address(symbol, version)?;
    // SAFETY: checked non-null, valid per this function's contract.
    unsafe { put(pfn, p)? };
    Ok((p, status))
}

#[no_mangle]
pub unsafe extern "C" fn cuGetProcAddress_v2(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    cuda_version: c_int,
    _flags: cuuint64_t,
    symbol_status: *mut CUdriverProcAddressQueryResult,
) -> CUresult {
    entry("cuGetProcAddress_v2", None, None, |_| {
        // SAFETY: the caller's pointers (driver contract).
        let (_, status) = unsafe { resolve_proc_address(symbol, pfn, cuda_version)? };
        // SAFETY: optional out-pointer; the value is a valid enumerator.
        unsafe { put_opt(symbol_status.cast::<u32>(), status) };
        // A symbol that is not found is not an error: the status says so (measured on an H200
        // for an unknown name; the same is assumed for a version that is too old).
        Ok(())
    })
}

/// `cuGetProcAddress` with the CUDA 11.3 signature (no symbol status).
#[no_mangle]
pub unsafe extern "C" fn cuGetProcAddress(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    cuda_version: c_int,
    _flags: cuuint64_t,
) -> CUresult {
    entry("cuGetProcAddress", None, None, |_| {
        // SAFETY: the caller's pointers (driver contract).
        let (p, _) = unsafe { resolve_proc_address(symbol, pfn, cuda_version)? };
        if p.is_null() {
            Err(codes::NOT_FOUND)
        } else {
            Ok(())
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceGet(device: *mut CUdevice, ordinal: c_int) -> CUresult {
    // SAFETY: the caller's out-pointer (driver contract).
    answer("cuDeviceGet", unsafe { Out::new(device) }, |_| {
        let st = initialized()?;
        st.device(ordinal)?;
        Ok(ordinal)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetCount(count: *mut c_int) -> CUresult {
    // SAFETY: the caller's out-pointer (driver contract).
    answer("cuDeviceGetCount", unsafe { Out::new(count) }, |_| {
        let st = initialized()?;
        Ok(st.devices.len() as c_int)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetName(name: *mut c_char, len: c_int, dev: CUdevice) -> CUresult {
    entry("cuDeviceGetName", None, None, |_| {
        need(name)?;
        if len <= 0 {
            return Err(codes::INVALID_VALUE);
        }
        initialized()?.device(dev)?;
        let text = format!("custody emulated device {dev}");
        let n = text.len().min(len as usize - 1);
        // SAFETY: `name` is writable for `len` bytes (driver contract); we write n + 1 <= len.
        unsafe {
            std::ptr::copy_nonoverlapping(text.as_ptr(), name.cast::<u8>(), n);
            name.add(n).write(0);
        }
        Ok(())
    })
}

/// `domain:bus:device.function` in hexadecimal, the documented format (13 bytes with the NUL):
/// the emulated device's PCI domain, bus and device attributes, function 0. Truncated to `len`
/// bytes, NUL included, as `cuDeviceGetName` truncates.
#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetPCIBusId(
    bus_id: *mut c_char,
    len: c_int,
    dev: CUdevice,
) -> CUresult {
    use cuda_sys::types::CUdevice_attribute as A;
    entry("cuDeviceGetPCIBusId", None, None, |_| {
        need(bus_id)?;
        if len <= 0 {
            return Err(codes::INVALID_VALUE);
        }
        initialized()?.device(dev)?;
        let of = |a: A| attribute(a as u32, dev).unwrap_or(0);
        let text = format!(
            "{:04x}:{:02x}:{:02x}.0",
            of(A::CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID),
            of(A::CU_DEVICE_ATTRIBUTE_PCI_BUS_ID),
            of(A::CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID)
        );
        let n = text.len().min(len as usize - 1);
        // SAFETY: `bus_id` is writable for `len` bytes (driver contract); we write n + 1 <= len.
        unsafe {
            std::ptr::copy_nonoverlapping(text.as_ptr(), bus_id.cast::<u8>(), n);
            bus_id.add(n).write(0);
        }
        Ok(())
    })
}

fn attribute(attr: u32, dev: CUdevice) -> Option<c_int> {
    use cuda_sys::types::CUdevice_attribute as A;
    let table: &[(A, c_int)] = &[
        (A::CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK, 1024),
        (A::CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X, 1024),
        (A::CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y, 1024),
        (A::CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z, 64),
        (A::CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X, 2_147_483_647),
        (A::CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y, 65535),
        (A::CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z, 65535),
        (A::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK, 49152),
        (A::CU_DEVICE_ATTRIBUTE_TOTAL_CONSTANT_MEMORY, 65536),
        (A::CU_DEVICE_ATTRIBUTE_WARP_SIZE, 32),
        (A::CU_DEVICE_ATTRIBUTE_MAX_PITCH, 2_147_483_647),
        (A::CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK, 65536),
        (A::CU_DEVICE_ATTRIBUTE_CLOCK_RATE, 1_980_000),
        (A::CU_DEVICE_ATTRIBUTE_TEXTURE_ALIGNMENT, 512),
        (A::CU_DEVICE_ATTRIBUTE_GPU_OVERLAP, 1),
        (A::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, 132),
        (A::CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY, 1),
        (A::CU_DEVICE_ATTRIBUTE_CONCURRENT_KERNELS, 1),
        (A::CU_DEVICE_ATTRIBUTE_ECC_ENABLED, 1),
        (A::CU_DEVICE_ATTRIBUTE_PCI_BUS_ID, 0x18 + dev),
        (A::CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID, 0),
        (A::CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID, 0),
        (A::CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE, 2_619_000),
        (A::CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH, 6144),
        (A::CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE, 62_914_560),
        (A::CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR, 2048),
        (A::CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT, 3),
        (A::CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING, 1),
        (A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, 9),
        (A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, 0),
        (A::CU_DEVICE_ATTRIBUTE_STREAM_PRIORITIES_SUPPORTED, 1),
        (A::CU_DEVICE_ATTRIBUTE_GLOBAL_L1_CACHE_SUPPORTED, 1),
        (A::CU_DEVICE_ATTRIBUTE_LOCAL_L1_CACHE_SUPPORTED, 1),
        (
            A::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR,
            233_472,
        ),
        (
            A::CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR,
            65536,
        ),
        (A::CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY, 1),
        (A::CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS, 1),
        (A::CU_DEVICE_ATTRIBUTE_COMPUTE_PREEMPTION_SUPPORTED, 1),
        (
            A::CU_DEVICE_ATTRIBUTE_CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM,
            1,
        ),
        (A::CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH, 1),
        (
            A::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
            232_448,
        ),
        (A::CU_DEVICE_ATTRIBUTE_HOST_REGISTER_SUPPORTED, 1),
        (
            A::CU_DEVICE_ATTRIBUTE_VIRTUAL_ADDRESS_MANAGEMENT_SUPPORTED,
            1,
        ),
        (
            A::CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED,
            1,
        ),
        (A::CU_DEVICE_ATTRIBUTE_MAX_BLOCKS_PER_MULTIPROCESSOR, 32),
        (A::CU_DEVICE_ATTRIBUTE_READ_ONLY_HOST_REGISTER_SUPPORTED, 1),
        (A::CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED, 1),
        (A::CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED, 1),
        (A::CU_DEVICE_ATTRIBUTE_MEMPOOL_SUPPORTED_HANDLE_TYPES, 1),
    ];
    if attr == 0 || attr > 200 {
        return None;
    }
    // Attributes newer than this build's CUDA 12.0 types, by number (CUDA 13 headers).
    match attr {
        // CU_DEVICE_ATTRIBUTE_NUMA_ID: the device is not a NUMA node.
        131 => return Some(-1),
        // HOST_NUMA_MEMORY_POOLS_SUPPORTED, HOST_MEMORY_POOLS_SUPPORTED: host pools exist here.
        142 | 144 => return Some(1),
        _ => {}
    }
    Some(
        table
            .iter()
            .find(|(a, _)| *a as u32 == attr)
            .map_or(0, |&(_, v)| v),
    )
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetAttribute(
    pi: *mut c_int,
    attrib: CUdevice_attribute,
    dev: CUdevice,
) -> CUresult {
    // SAFETY: the caller's out-pointer (driver contract).
    answer("cuDeviceGetAttribute", unsafe { Out::new(pi) }, |_| {
        initialized()?.device(dev)?;
        let v = attribute(attrib as u32, dev).ok_or(codes::BAD_ATTRIBUTE)?;
        Ok(v)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceCanAccessPeer(
    can: *mut c_int,
    dev: CUdevice,
    peer: CUdevice,
) -> CUresult {
    // SAFETY: the caller's out-pointer (driver contract).
    answer("cuDeviceCanAccessPeer", unsafe { Out::new(can) }, |_| {
        let st = initialized()?;
        st.device(dev)?;
        st.device(peer)?;
        Ok(c_int::from(dev != peer))
    })
}
