//! Device queries, which the Python bindings' `Device` needs: [`device_count`],
//! [`device_attribute`], [`device_name`], [`device_uuid`], [`device_pci_bus_id`],
//! [`device_can_access_peer`], [`stream_priority_range`] and the graph memory attributes
//! ([`graph_mem_attribute`], [`set_graph_mem_attribute`], [`graph_mem_trim`]).

use std::ffi::{c_char, c_int};

use cuda_sys::types::CUdevice;

use crate::context::{in_context, ContextHandle};
use crate::error::HandleError;
use crate::sys::{check, init};

/// How many devices the driver sees (initialising it on first use).
///
/// # Errors
/// [`HandleError::Load`] when no driver loads; [`HandleError::Driver`] when `cuInit` or the
/// count fails.
///
/// Driver calls: `cuInit` (once), `cuDeviceGetCount`.
pub fn device_count() -> Result<i32, HandleError> {
    let d = init()?;
    let mut count: c_int = 0;
    // SAFETY: `count` is a valid out-pointer; read only after success.
    let status = unsafe { (d.cuDeviceGetCount)(&mut count) };
    check("cuDeviceGetCount", status)?;
    Ok(count)
}

/// Checks that device `ordinal` exists, initialising the driver on first use: for what names a
/// device without using it yet (a graph memory resource), so that a bad ordinal is refused when
/// it is given, as a device's pool resource refuses it.
///
/// # Errors
/// [`HandleError::Driver`] with `CUDA_ERROR_INVALID_DEVICE` for an ordinal out of range;
/// [`HandleError::Load`] when no driver loads.
///
/// Driver calls: `cuInit` (once), `cuDeviceGet`.
pub fn check_device(ordinal: i32) -> Result<(), HandleError> {
    device_of(ordinal).map(|_| ())
}

/// The driver's `CUdevice` for `ordinal`, initialising the driver on first use.
///
/// Driver calls: `cuInit` (once), `cuDeviceGet`.
fn device_of(ordinal: i32) -> Result<(&'static cuda_sys::Driver, CUdevice), HandleError> {
    let d = init()?;
    let mut device: CUdevice = 0;
    // SAFETY: `device` is a valid out-pointer; read only after success.
    let status = unsafe { (d.cuDeviceGet)(&mut device, ordinal) };
    check("cuDeviceGet", status)?;
    Ok((d, device))
}

/// The value of attribute number `attribute` of device `ordinal`: a `CUdevice_attribute`
/// given by its number in the CUDA headers, so that attributes newer than the types custody was
/// built with can be read too. No context need be current.
///
/// # Errors
/// [`HandleError::Driver`]: `CUDA_ERROR_INVALID_DEVICE` for a bad ordinal,
/// `CUDA_ERROR_INVALID_VALUE` for an attribute the loaded driver does not know;
/// [`HandleError::Load`] when the driver lacks `cuDeviceGetAttribute`.
///
/// Driver calls: `cuInit` (once), `cuDeviceGet`, `cuDeviceGetAttribute`.
pub fn device_attribute(ordinal: i32, attribute: u32) -> Result<i32, HandleError> {
    let (d, device) = device_of(ordinal)?;
    let get = d.cuDeviceGetAttribute().map_err(HandleError::Load)?;
    // SAFETY: `CUdevice_attribute` is a `#[repr(u32)]` enum standing for the C enum the driver
    // takes (an `int`-sized value passed in a register), so a pointer to the same function typed
    // with `u32` in its place is called with exactly the bits the C caller would pass. No Rust
    // value of the enum type is made from a number it may not list.
    let get: unsafe extern "C" fn(*mut c_int, u32, CUdevice) -> u32 =
        unsafe { std::mem::transmute(get) };
    let mut value: c_int = 0;
    // SAFETY: `value` is a valid out-pointer; `device` came from `cuDeviceGet`.
    let status = unsafe { get(&mut value, attribute, device) };
    check("cuDeviceGetAttribute", status)?;
    Ok(value)
}

/// The name of device `ordinal` (for example "NVIDIA H200"). No context need be current.
///
/// # Errors
/// [`HandleError::Driver`] for a bad ordinal; [`HandleError::Load`] when the driver lacks
/// `cuDeviceGetName`.
///
/// Driver calls: `cuInit` (once), `cuDeviceGet`, `cuDeviceGetName`.
pub fn device_name(ordinal: i32) -> Result<String, HandleError> {
    device_text::<256>(
        ordinal,
        "cuDeviceGetName",
        cuda_sys::Driver::cuDeviceGetName,
    )
}

/// The PCI address of device `ordinal` as the driver writes it: `domain:bus:device.function`
/// in hexadecimal (13 bytes with the NUL, the documented size). No context need be current.
///
/// # Errors
/// [`HandleError::Driver`] for a bad ordinal; [`HandleError::Load`] when the driver lacks
/// `cuDeviceGetPCIBusId`.
///
/// Driver calls: `cuInit` (once), `cuDeviceGet`, `cuDeviceGetPCIBusId`.
pub fn device_pci_bus_id(ordinal: i32) -> Result<String, HandleError> {
    device_text::<13>(
        ordinal,
        "cuDeviceGetPCIBusId",
        cuda_sys::Driver::cuDeviceGetPCIBusId,
    )
}

/// A text of device `ordinal` that the driver writes into `N` bytes, NUL included, with the
/// call `get` loads (`call`: `cuDeviceGetName` or `cuDeviceGetPCIBusId`, which share a
/// signature); the bytes up to the NUL, as UTF-8 (lossily).
fn device_text<const N: usize>(
    ordinal: i32,
    call: &'static str,
    get: fn(&cuda_sys::Driver) -> Result<cuda_sys::fn_types::cuDeviceGetName, cuda_sys::LoadError>,
) -> Result<String, HandleError> {
    let (d, device) = device_of(ordinal)?;
    let get = get(d).map_err(HandleError::Load)?;
    let mut text = [0 as c_char; N];
    // SAFETY: `text` holds `N` bytes and the driver writes at most `len` of them, NUL included.
    let status = unsafe { get(text.as_mut_ptr(), N as c_int, device) };
    check(call, status)?;
    let bytes: Vec<u8> = text
        .iter()
        .take_while(|&&c| c != 0)
        .map(|&c| c as u8)
        .collect();
    Ok(String::from_utf8_lossy(&bytes).into_owned())
}

/// Whether device `ordinal` can access the memory of device `peer` (peer access may then be
/// enabled). No context need be current.
///
/// # Errors
/// [`HandleError::Driver`] for a bad ordinal; [`HandleError::Load`] when the driver lacks
/// `cuDeviceCanAccessPeer`.
///
/// Driver calls: `cuInit` (once), `cuDeviceGet` (twice), `cuDeviceCanAccessPeer`.
pub fn device_can_access_peer(ordinal: i32, peer: i32) -> Result<bool, HandleError> {
    let (d, device) = device_of(ordinal)?;
    let (_, peer) = device_of(peer)?;
    let query = d.cuDeviceCanAccessPeer().map_err(HandleError::Load)?;
    let mut can: c_int = 0;
    // SAFETY: `can` is a valid out-pointer; both devices came from `cuDeviceGet`.
    let status = unsafe { query(&mut can, device, peer) };
    check("cuDeviceCanAccessPeer", status)?;
    Ok(can != 0)
}

/// The UUID of device `ordinal`, 16 bytes. No context need be current.
///
/// # Errors
/// [`HandleError::Driver`] for a bad ordinal; [`HandleError::Load`] when the driver lacks the
/// entry point.
///
/// Driver calls: `cuInit` (once), `cuDeviceGet`, `cuDeviceGetUuid` (CUDA 13 drivers) or
/// `cuDeviceGetUuid_v2` (CUDA 12, where the unversioned call reports the GPU's UUID for a MIG
/// instance).
pub fn device_uuid(ordinal: i32) -> Result<[u8; 16], HandleError> {
    let (d, device) = device_of(ordinal)?;
    let (get, name) = if d.version() >= 13000 {
        (
            d.cuDeviceGetUuid().map_err(HandleError::Load)?,
            "cuDeviceGetUuid",
        )
    } else {
        (
            d.cuDeviceGetUuid_v2().map_err(HandleError::Load)?,
            "cuDeviceGetUuid_v2",
        )
    };
    let mut uuid = [0u8; 16];
    // SAFETY: `uuid` is the 16-byte `CUuuid` the driver writes.
    let status = unsafe { get(uuid.as_mut_ptr().cast(), device) };
    check(name, status)?;
    Ok(uuid)
}

/// The stream priorities `context` supports, `(least, greatest)`: a stream's priority lies in
/// `greatest..=least` (greatest is the numerically lowest).
///
/// # Errors
/// [`HandleError::Driver`] when the context switch or the query fails; [`HandleError::Load`]
/// when the driver lacks `cuCtxGetStreamPriorityRange`.
///
/// Driver calls: `cuCtxGetCurrent`, `cuCtxSetCurrent` (if needed), `cuCtxGetStreamPriorityRange`.
pub fn stream_priority_range(context: &ContextHandle) -> Result<(i32, i32), HandleError> {
    in_context(context, "cuCtxGetStreamPriorityRange", |d| {
        let range = d.cuCtxGetStreamPriorityRange().map_err(HandleError::Load)?;
        let (mut least, mut greatest): (c_int, c_int) = (0, 0);
        // SAFETY: both are valid out-pointers; `context` is current.
        let status = unsafe { range(&mut least, &mut greatest) };
        check("cuCtxGetStreamPriorityRange", status)?;
        Ok((least, greatest))
    })
}

/// Graph memory attribute number `attribute` (a `CUgraphMem_attribute`: 0 used, 1 used high
/// water mark, 2 reserved, 3 reserved high water mark) of device `ordinal`, in bytes.
///
/// # Errors
/// [`HandleError::Driver`] for a bad ordinal or attribute; [`HandleError::Load`] when the driver
/// lacks `cuDeviceGetGraphMemAttribute`.
///
/// Driver calls: `cuInit` (once), `cuDeviceGet`, `cuDeviceGetGraphMemAttribute`.
pub fn graph_mem_attribute(ordinal: i32, attribute: u32) -> Result<u64, HandleError> {
    let (d, device) = device_of(ordinal)?;
    let get = d
        .cuDeviceGetGraphMemAttribute()
        .map_err(HandleError::Load)?;
    let mut value: u64 = 0;
    // SAFETY: every graph memory attribute is a `cuuint64_t` the driver writes to `value`.
    let status = unsafe { get(device, attribute, (&mut value as *mut u64).cast()) };
    check("cuDeviceGetGraphMemAttribute", status)?;
    Ok(value)
}

/// Resets a high water mark among device `ordinal`'s graph memory attributes (the driver allows
/// setting those two, to 0 only).
///
/// # Errors
/// [`HandleError::Driver`] for a bad ordinal, attribute or value; [`HandleError::Load`] when the
/// driver lacks `cuDeviceSetGraphMemAttribute`.
///
/// Driver calls: `cuInit` (once), `cuDeviceGet`, `cuDeviceSetGraphMemAttribute`.
pub fn set_graph_mem_attribute(
    ordinal: i32,
    attribute: u32,
    value: u64,
) -> Result<(), HandleError> {
    let (d, device) = device_of(ordinal)?;
    let set = d
        .cuDeviceSetGraphMemAttribute()
        .map_err(HandleError::Load)?;
    let mut value = value;
    // SAFETY: the high water marks are `cuuint64_t`s read from `value`.
    let status = unsafe { set(device, attribute, (&mut value as *mut u64).cast()) };
    check("cuDeviceSetGraphMemAttribute", status)
}

/// Returns to the OS the graph memory device `ordinal` keeps cached and no graph uses.
///
/// # Errors
/// [`HandleError::Driver`] for a bad ordinal; [`HandleError::Load`] when the driver lacks
/// `cuDeviceGraphMemTrim`.
///
/// Driver calls: `cuInit` (once), `cuDeviceGet`, `cuDeviceGraphMemTrim`.
pub fn graph_mem_trim(ordinal: i32) -> Result<(), HandleError> {
    let (d, device) = device_of(ordinal)?;
    let trim = d.cuDeviceGraphMemTrim().map_err(HandleError::Load)?;
    // SAFETY: takes only the device.
    let status = unsafe { trim(device) };
    check("cuDeviceGraphMemTrim", status)
}
