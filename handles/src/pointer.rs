//! What the driver knows about an address: [`pointer_attributes`] (memory type, whether it is
//! managed, its device and the size of the allocation it lies in).

use std::ffi::{c_int, c_void};

use cuda_sys::types::{CUdeviceptr, CUpointer_attribute};
use cuda_sys::CudaErrorCode;

use crate::error::HandleError;
use crate::sys::{check, init};

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
/// host memory, memory already freed, or nothing at all).
///
/// The four attributes are read in one driver call, so the answer describes one moment: memory
/// freed by another thread (the cleanup worker, say) while the query runs reads as unknown, never
/// as a half-answered query. `cuPointerGetAttributes`, unlike `cuPointerGetAttribute`, answers an
/// unknown address with success and NULL values (documented; conformance
/// `basics_memory::basic_pointer_get_attributes_reads_an_unknown_address_as_null_values`): a
/// memory type of 0 means unknown here. Should a driver refuse the bulk query instead, the
/// singular `cuPointerGetAttribute` of the memory type decides: `CUDA_ERROR_INVALID_VALUE` there
/// means unknown.
///
/// # Errors
/// [`HandleError::Driver`] for any other failure (the bulk query's error).
///
/// Driver calls: `cuPointerGetAttributes`; only when it fails, `cuPointerGetAttribute` once.
pub fn pointer_attributes(ptr: CUdeviceptr) -> Result<Option<PointerAttributes>, HandleError> {
    use CUpointer_attribute as A;
    let d = init()?;
    let mut memory_type: u32 = 0;
    let mut is_managed: u32 = 0;
    let mut device_ordinal: c_int = -1;
    let mut range_size: usize = 0;
    let mut attributes = [
        A::CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
        A::CU_POINTER_ATTRIBUTE_IS_MANAGED,
        A::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
        A::CU_POINTER_ATTRIBUTE_RANGE_SIZE,
    ];
    let mut data: [*mut c_void; 4] = [
        (&mut memory_type as *mut u32).cast(),
        (&mut is_managed as *mut u32).cast(),
        (&mut device_ordinal as *mut c_int).cast(),
        (&mut range_size as *mut usize).cast(),
    ];
    // SAFETY: four attributes and four slots, each storage of the attribute's type (`unsigned
    // int` for the memory type, read as an integer so that an unknown enumerator is harmless;
    // a boolean `unsigned int`; an `int`; a `size_t`), alive for the call.
    let status = unsafe {
        (d.cuPointerGetAttributes)(
            attributes.len() as std::ffi::c_uint,
            attributes.as_mut_ptr(),
            data.as_mut_ptr(),
            ptr,
        )
    };
    if status != 0 {
        return unknown_or(d, ptr, status);
    }
    let memory_type = match memory_type {
        0 => return Ok(None),
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

/// The bulk query failed with `status`: `None` when the singular query says the driver does not
/// know `ptr` (`CUDA_ERROR_INVALID_VALUE`), the bulk query's error otherwise.
///
/// Driver calls: `cuPointerGetAttribute`.
#[cold]
fn unknown_or(
    d: &cuda_sys::Driver,
    ptr: CUdeviceptr,
    status: u32,
) -> Result<Option<PointerAttributes>, HandleError> {
    let mut memory_type: u32 = 0;
    // SAFETY: 4 bytes of storage for the attribute's `unsigned int`, read as an integer.
    let single = unsafe {
        (d.cuPointerGetAttribute)(
            (&mut memory_type as *mut u32).cast(),
            CUpointer_attribute::CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
            ptr,
        )
    };
    if single == CudaErrorCode::INVALID_VALUE.0 {
        return Ok(None);
    }
    check("cuPointerGetAttributes", status).map(|()| None)
}
