//! Driver operations beyond allocating and releasing memory, for the `memory` crate: pointer
//! attributes, pools made with explicit properties, pool IPC and stream capture.
//!
//! Every function that takes a stream runs its driver call with the stream's context current
//! (see [`crate::ContextScope`]) and restores the caller's binding; an unbound default-stream token
//! resolves against the caller's current context, and "no context" is
//! [`HandleError::NoCurrentContext`] there, as everywhere in this crate. Sizes are in bytes
//! unless a parameter says elements.

use std::ffi::c_int;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

use cuda_sys::types::{
    c_void, CUdeviceptr, CUgraph, CUmemAccessDesc, CUmemAccess_flags, CUmemAllocationHandleType,
    CUmemLocation, CUmemLocationType, CUmemPoolProps, CUmemPoolPtrExportData, CUmemoryPool,
    CUpointer_attribute, CUstreamCaptureMode, CUstreamCaptureStatus,
};
use cuda_sys::{CudaErrorCode, Driver};

use crate::context::ContextHandle;
use crate::deviceptr::DevicePtrHandle;
use crate::graph::GraphHandle;
use crate::pool::MemoryPoolHandle;
use crate::stream::StreamHandle;
use crate::sys::{check, driver, init};
use crate::HandleError;

/// `CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR`.
const HANDLE_TYPE_POSIX_FD: u32 = 1;
/// `CU_MEM_ALLOCATION_TYPE_PINNED`.
const ALLOCATION_TYPE_PINNED: u32 = 1;
/// `CU_MEM_LOCATION_TYPE_DEVICE`.
const LOCATION_DEVICE: u32 = 1;
/// `CU_MEM_LOCATION_TYPE_HOST_NUMA` (CUDA 12.2 and later; not in the 12.0 types).
const LOCATION_HOST_NUMA: u32 = 3;
/// `CUDA_ERROR_STREAM_CAPTURE_INVALIDATED`.
const CAPTURE_INVALIDATED: u32 = 901;

/// Where the driver says an address points (`CU_POINTER_ATTRIBUTE_MEMORY_TYPE`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum MemoryType {
    /// Host memory known to the driver (pinned or registered).
    Host,
    /// Device memory (managed memory reports this too; see [`PointerAttributes::is_managed`]).
    Device,
    /// A CUDA array.
    Array,
    /// Unified memory.
    Unified,
    /// A value this build does not know.
    Other(u32),
}

/// What the driver knows about an address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PointerAttributes {
    /// Where the memory is.
    pub memory_type: MemoryType,
    /// Whether it is managed (`cuMemAllocManaged`) memory.
    pub is_managed: bool,
    /// The device the memory belongs to (for pinned host memory, the device of the context it
    /// was allocated in), -1 when none.
    pub device_ordinal: i32,
    /// The size in bytes of the whole allocation the address lies in.
    pub range_size: usize,
}

/// Queries the driver about `ptr`; `None` when the driver does not know the address (pageable
/// host memory, or nothing at all).
///
/// # Errors
/// [`HandleError::Driver`] for a failure other than "unknown address"
/// (`CUDA_ERROR_INVALID_VALUE`).
///
/// Driver calls: `cuPointerGetAttribute` (four times).
pub fn pointer_attributes(ptr: CUdeviceptr) -> Result<Option<PointerAttributes>, HandleError> {
    use CUpointer_attribute as A;
    let d = init()?;
    let mut memory_type: u32 = 0;
    // SAFETY: `memory_type` is 4 bytes of storage for the attribute's `unsigned int`; read as
    // an integer, so an unknown enumerator is harmless.
    let status = unsafe {
        (d.cuPointerGetAttribute)(
            (&mut memory_type as *mut u32).cast(),
            A::CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
            ptr,
        )
    };
    if status == CudaErrorCode::INVALID_VALUE.0 {
        return Ok(None);
    }
    check("cuPointerGetAttribute", status)?;
    let mut is_managed: u32 = 0;
    // SAFETY: 4 bytes of storage for the attribute's boolean `unsigned int`.
    let status = unsafe {
        (d.cuPointerGetAttribute)(
            (&mut is_managed as *mut u32).cast(),
            A::CU_POINTER_ATTRIBUTE_IS_MANAGED,
            ptr,
        )
    };
    check("cuPointerGetAttribute", status)?;
    let mut device_ordinal: c_int = -1;
    // SAFETY: storage for the attribute's `int`.
    let status = unsafe {
        (d.cuPointerGetAttribute)(
            (&mut device_ordinal as *mut c_int).cast(),
            A::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
            ptr,
        )
    };
    check("cuPointerGetAttribute", status)?;
    let mut range_size: usize = 0;
    // SAFETY: storage for the attribute's `size_t`.
    let status = unsafe {
        (d.cuPointerGetAttribute)(
            (&mut range_size as *mut usize).cast(),
            A::CU_POINTER_ATTRIBUTE_RANGE_SIZE,
            ptr,
        )
    };
    check("cuPointerGetAttribute", status)?;
    let memory_type = match memory_type {
        1 => MemoryType::Host,
        2 => MemoryType::Device,
        3 => MemoryType::Array,
        4 => MemoryType::Unified,
        other => MemoryType::Other(other),
    };
    Ok(Some(PointerAttributes {
        memory_type,
        is_managed: is_managed != 0,
        device_ordinal,
        range_size,
    }))
}

/// Where a pool created by [`create_pool`] places its memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PoolLocation {
    /// On device `ordinal`.
    Device(i32),
    /// Pinned host memory on NUMA node `node` (`CU_MEM_LOCATION_TYPE_HOST_NUMA`, a CUDA 12.2
    /// driver or later); every device is granted read-write access.
    HostNuma(i32),
}

/// The properties of a pool made by [`create_pool`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolSpec {
    /// Where the memory lives.
    pub location: PoolLocation,
    /// The most the pool may hold, in bytes; 0 for the driver's default (no limit). A driver
    /// older than 12.2 ignores it or rejects a non-zero value.
    pub max_size: usize,
    /// Whether the pool can be shared with other processes as a POSIX file descriptor
    /// ([`export_pool`], [`import_pool`]).
    pub ipc: bool,
}

/// `CUmemPoolProps` as the driver reads it, with every enumerator a plain integer, so that a
/// value the CUDA 12.0 types do not know (`CU_MEM_LOCATION_TYPE_HOST_NUMA`) is never held in a
/// Rust enum. `max_size` is the field CUDA 12.2 put at the start of `reserved`.
#[repr(C)]
struct RawPoolProps {
    alloc_type: u32,
    handle_types: u32,
    location_type: u32,
    location_id: c_int,
    win32_security_attributes: *mut c_void,
    max_size: usize,
    reserved: [u8; 56],
}

const _: () = assert!(std::mem::size_of::<RawPoolProps>() == std::mem::size_of::<CUmemPoolProps>());

/// Creates a pool with `spec`, owned by the returned handle (destroyed after its last handle
/// and last allocation go). A host pool is made accessible to every device. An IPC pool is
/// exported once (the descriptor closed at once), because the driver exports no pointer of a
/// pool that was never exported.
///
/// # Errors
/// [`HandleError::Driver`] when the driver rejects the properties (an invalid device, a host
/// pool on a driver older than 12.2, IPC where the platform has none), the access grant or the
/// first export; the pool is then destroyed before returning.
///
/// Driver calls: `cuInit` (once), `cuMemPoolCreate`; for host pools `cuDeviceGetCount` and
/// `cuMemPoolSetAccess`; for IPC pools `cuMemPoolExportToShareableHandle`; `cuMemPoolDestroy`
/// after the last handle drops.
pub fn create_pool(spec: &PoolSpec) -> Result<MemoryPoolHandle, HandleError> {
    let d = init()?;
    let (location_type, location_id, device) = match spec.location {
        PoolLocation::Device(ordinal) => (LOCATION_DEVICE, ordinal, Some(ordinal)),
        PoolLocation::HostNuma(node) => (LOCATION_HOST_NUMA, node, None),
    };
    let props = RawPoolProps {
        alloc_type: ALLOCATION_TYPE_PINNED,
        handle_types: if spec.ipc { HANDLE_TYPE_POSIX_FD } else { 0 },
        location_type,
        location_id,
        win32_security_attributes: std::ptr::null_mut(),
        max_size: spec.max_size,
        reserved: [0; 56],
    };
    let mut raw: CUmemoryPool = std::ptr::null_mut();
    // SAFETY: `props` has the layout of `CUmemPoolProps` (checked above) and the driver only
    // reads it; `raw` is a valid out-pointer read after success.
    let status = unsafe {
        (d.cuMemPoolCreate)(
            &mut raw,
            (&props as *const RawPoolProps).cast::<CUmemPoolProps>(),
        )
    };
    check("cuMemPoolCreate", status)?;
    let pool = MemoryPoolHandle::from_raw_owned(raw, device);
    if device.is_none() {
        grant_all_devices(d, raw)?; // on error `pool` drops and destroys the pool
    }
    if spec.ipc {
        // A real driver refuses `cuMemPoolExportPointer` (CUDA_ERROR_INVALID_VALUE) on a pool
        // that was never exported; one export, whose descriptor is closed at once, is enough
        // (measured on an H200, driver 580.159.04).
        drop(export_pool(&pool)?);
    }
    Ok(pool)
}

/// Grants every device read-write access to a (host) pool.
fn grant_all_devices(d: &'static Driver, pool: CUmemoryPool) -> Result<(), HandleError> {
    let mut count: c_int = 0;
    // SAFETY: `count` is a valid out-pointer read after success.
    let status = unsafe { (d.cuDeviceGetCount)(&mut count) };
    check("cuDeviceGetCount", status)?;
    let descs: Vec<CUmemAccessDesc> = (0..count)
        .map(|id| CUmemAccessDesc {
            location: CUmemLocation {
                type_: CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
                id,
            },
            flags: CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
        })
        .collect();
    if descs.is_empty() {
        return Ok(());
    }
    // SAFETY: `descs` holds `descs.len()` valid descriptors; the pool was just created.
    let status = unsafe { (d.cuMemPoolSetAccess)(pool, descs.as_ptr(), descs.len()) };
    check("cuMemPoolSetAccess", status)
}

/// Exports an IPC-capable pool (made with [`PoolSpec::ipc`]) as a new POSIX file descriptor,
/// owned by the caller, to be passed to another process (over a unix socket with
/// `SCM_RIGHTS`, for example) and opened there with [`import_pool`].
///
/// # Errors
/// [`HandleError::Driver`] (`CUDA_ERROR_INVALID_VALUE` for a pool made without IPC).
///
/// Driver calls: `cuMemPoolExportToShareableHandle`.
pub fn export_pool(pool: &MemoryPoolHandle) -> Result<OwnedFd, HandleError> {
    let d = driver()?;
    let mut fd: c_int = -1;
    // SAFETY: for a POSIX file descriptor the out-parameter is an `int`; the handle keeps the
    // pool alive.
    let status = unsafe {
        (d.cuMemPoolExportToShareableHandle)(
            (&mut fd as *mut c_int).cast(),
            pool.raw(),
            CUmemAllocationHandleType(HANDLE_TYPE_POSIX_FD),
            0,
        )
    };
    check("cuMemPoolExportToShareableHandle", status)?;
    if fd < 0 {
        return Err(HandleError::invalid(
            "pool",
            "the driver exported no file descriptor",
        ));
    }
    // SAFETY: on success the driver returns a new descriptor that nobody else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Opens a pool another process exported with [`export_pool`]; the descriptor stays the
/// caller's. The returned handle owns the imported pool (`cuMemPoolDestroy` after its last
/// handle and last imported pointer go). `device` is the pool's device as the exporter said,
/// `None` for a host pool. Allocate nothing from it: pointers come in through
/// [`DevicePtrHandle::import_from_pool`].
///
/// # Errors
/// [`HandleError::Driver`] when the driver rejects the descriptor.
///
/// Driver calls: `cuInit` (once), `cuMemPoolImportFromShareableHandle`.
pub fn import_pool(
    fd: BorrowedFd<'_>,
    device: Option<i32>,
) -> Result<MemoryPoolHandle, HandleError> {
    let d = init()?;
    let mut raw: CUmemoryPool = std::ptr::null_mut();
    // SAFETY: for a POSIX file descriptor the handle argument is the descriptor itself, cast to
    // a pointer; it is open for the duration of the call; `raw` is a valid out-pointer.
    let status = unsafe {
        (d.cuMemPoolImportFromShareableHandle)(
            &mut raw,
            fd.as_raw_fd() as usize as *mut c_void,
            CUmemAllocationHandleType(HANDLE_TYPE_POSIX_FD),
            0,
        )
    };
    check("cuMemPoolImportFromShareableHandle", status)?;
    Ok(MemoryPoolHandle::from_raw_owned(raw, device))
}

/// The 64 bytes (`CUmemPoolPtrExportData`) another process needs to import `ptr`, an allocation
/// from an IPC-capable pool, with [`DevicePtrHandle::import_from_pool`].
///
/// # Errors
/// [`HandleError::Driver`] (`CUDA_ERROR_INVALID_VALUE` when the pool is not IPC-capable).
///
/// Driver calls: `cuMemPoolExportPointer`.
pub fn export_pointer(ptr: &DevicePtrHandle) -> Result<[u8; 64], HandleError> {
    let d = driver()?;
    let mut data = CUmemPoolPtrExportData { reserved: [0; 64] };
    // SAFETY: `data` is a valid out-buffer; the handle keeps the allocation alive.
    let status = unsafe { (d.cuMemPoolExportPointer)(&mut data, ptr.ptr()) };
    check("cuMemPoolExportPointer", status)?;
    Ok(data.reserved)
}

/// Whether a stream is being captured into a graph.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CaptureStatus {
    /// Not capturing: work runs.
    None,
    /// Capturing: work is recorded into a graph.
    Active,
    /// Capturing, but the capture failed and must be ended.
    Invalidated,
}

pub use crate::stream::capture_may_be_active;

/// Whether `stream` is capturing.
///
/// # Errors
/// [`HandleError::NoCurrentContext`] for an unbound token with no context;
/// [`HandleError::Driver`] otherwise (the legacy stream while another stream of its context
/// captures: `CUDA_ERROR_STREAM_CAPTURE_IMPLICIT`).
///
/// Driver calls: `cuCtxGetCurrent`, `cuCtxSetCurrent` (if needed), `cuStreamIsCapturing`.
pub fn capture_status(stream: &StreamHandle) -> Result<CaptureStatus, HandleError> {
    let mut status: u32 = 0;
    stream.run("cuStreamIsCapturing", |d, s| {
        // SAFETY: `status` is 4 bytes of storage for the enum, read as an integer; the stream
        // is alive.
        unsafe {
            (d.cuStreamIsCapturing)(s, (&mut status as *mut u32).cast::<CUstreamCaptureStatus>())
        }
    })?;
    Ok(match status {
        0 => CaptureStatus::None,
        1 => CaptureStatus::Active,
        _ => CaptureStatus::Invalidated,
    })
}

/// Begins capturing `stream` into a graph (`mode`: `CU_STREAM_CAPTURE_MODE_*`); end it with
/// [`end_capture`].
///
/// # Errors
/// As [`capture_status`]; the driver refuses the legacy stream and a stream already capturing.
///
/// Driver calls: `cuCtxGetCurrent`, `cuCtxSetCurrent` (if needed), `cuStreamBeginCapture_v2`.
pub fn begin_capture(stream: &StreamHandle, mode: CUstreamCaptureMode) -> Result<(), HandleError> {
    stream.run("cuStreamBeginCapture_v2", |d, s| {
        // SAFETY: the stream is alive and its context current.
        unsafe { (d.cuStreamBeginCapture_v2)(s, mode) }
    })?;
    crate::stream::note_capture_begun();
    Ok(())
}

/// Ends the capture of `stream` and returns the captured graph, owned (destroyed in the
/// stream's context after its last handle goes).
///
/// # Errors
/// As [`capture_status`]; `CUDA_ERROR_STREAM_CAPTURE_INVALIDATED` when the capture failed (it
/// has ended all the same).
///
/// Driver calls: `cuCtxGetCurrent` (twice for an unbound token), `cuCtxSetCurrent` (if needed),
/// `cuStreamEndCapture`; `cuGraphDestroy` when the last graph handle drops.
pub fn end_capture(stream: &StreamHandle) -> Result<GraphHandle, HandleError> {
    let context = match stream.context() {
        Some(context) => context.clone(),
        None => ContextHandle::current()?.ok_or(HandleError::NoCurrentContext)?,
    };
    let mut graph: CUgraph = std::ptr::null_mut();
    let result = stream.run("cuStreamEndCapture", |d, s| {
        // SAFETY: `graph` is a valid out-pointer read after success; the stream is alive.
        let status = unsafe { (d.cuStreamEndCapture)(s, &mut graph) };
        if status == 0 || status == CAPTURE_INVALIDATED {
            // The capture is over either way.
            crate::stream::note_capture_ended();
        }
        status
    });
    result?;
    Ok(GraphHandle::from_captured(graph, &context))
}
