//! The driver's types and constants, re-exported from cudarc's bindgen-generated `sys` module.
//!
//! Only types are re-exported: cudarc's own function wrappers load the library on first use and
//! panic when a symbol is missing, so custody calls the driver through [`crate::Driver`] instead.

pub use std::ffi::{c_char, c_int, c_uchar, c_uint, c_ulonglong, c_ushort, c_void};

pub use cudarc::driver::sys::{
    cuuint64_t, CUcontext, CUctx_flags, CUdevice, CUdevice_attribute, CUdeviceptr,
    CUdriverProcAddressQueryResult, CUevent, CUevent_flags, CUgraph, CUgraphExec, CUgraphNode,
    CUhostFn, CUipcEventHandle, CUmemAccessDesc, CUmemAccess_flags, CUmemAllocationHandleType,
    CUmemAllocationType, CUmemAttach_flags, CUmemLocation, CUmemLocationType, CUmemPoolProps,
    CUmemPoolPtrExportData, CUmemPool_attribute, CUmemoryPool, CUmemorytype, CUpointer_attribute,
    CUstream, CUstreamCaptureMode, CUstreamCaptureStatus, CUstream_flags, CUuserObject,
    CUuserObjectRetain_flags, CUuserObject_flags, CUDA_HOST_NODE_PARAMS, CUDA_MEMCPY3D,
    CUDA_MEMSET_NODE_PARAMS, CUDA_MEM_ALLOC_NODE_PARAMS,
};

/// The legacy default stream token (`CU_STREAM_LEGACY`, 0x1).
pub const CU_STREAM_LEGACY: CUstream = 0x1 as CUstream;
/// The per-thread default stream token (`CU_STREAM_PER_THREAD`, 0x2).
pub const CU_STREAM_PER_THREAD: CUstream = 0x2 as CUstream;
/// The NULL stream token, which means the legacy default stream unless a program was built
/// for per-thread default streams.
pub const CU_STREAM_NULL: CUstream = std::ptr::null_mut();

/// `CUmemLocation` with its type a plain integer, for the location types the CUDA 12.0 types
/// lack (`CU_MEM_LOCATION_TYPE_NONE` 0, `_HOST` 2, `_HOST_NUMA` 3, `_HOST_NUMA_CURRENT` 4): the
/// same layout, so that such a value is never held in a Rust enum.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RawMemLocation {
    /// A `CUmemLocationType` value.
    pub type_: c_uint,
    /// The device ordinal or NUMA node; not read for the types that name neither.
    pub id: c_int,
}

const _: () =
    assert!(std::mem::size_of::<RawMemLocation>() == std::mem::size_of::<CUmemLocation>());

/// `CU_MEM_POOL_ATTR_*` values as plain integers, for callers that build attributes by value.
pub use cudarc::driver::sys::CUmemPool_attribute_enum as MemPoolAttribute;
