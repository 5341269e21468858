//! What the driver knows about an address: [`pointer_attributes`] (memory type, whether it is
//! managed, its device and the size of the allocation it lies in).

use std::ffi::c_int;

use cuda_sys::types::{CUdeviceptr, CUpointer_attribute};
use cuda_sys::CudaErrorCode;

use crate::sys::{check, init};
use crate::HandleError;

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
