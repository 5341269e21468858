//! [`MemoryPoolHandle`]: a device's current or default memory pool (borrowed, never destroyed)
//! or a pool this crate created (destroyed after its last handle, allocations included, drops).

use std::fmt;
use std::sync::Arc;

use cuda_sys::types::{CUmemLocationType, CUmemPoolProps, CUmemPool_attribute, CUmemoryPool};

use crate::report::{report_leak, Subject};
use crate::sys::{check, driver, init};
use crate::HandleError;

struct PoolBox {
    raw: usize,
    device: Option<i32>,
    owned: bool,
}

/// A stream-ordered memory pool.
///
/// Cloning is one atomic increment. Every pool allocation holds a clone, so an owned pool is
/// destroyed (`cuMemPoolDestroy`) only after its last allocation has been freed and its last
/// user handle dropped. A device's current or default pool is borrowed: never destroyed.
#[derive(Clone)]
pub struct MemoryPoolHandle(Arc<PoolBox>);

impl MemoryPoolHandle {
    /// Device `ordinal`'s current pool (the one `cuMemAllocAsync` uses), borrowed.
    ///
    /// # Errors
    /// [`HandleError::Driver`] for an invalid device or a failed query.
    ///
    /// Driver calls: `cuInit` (once), `cuDeviceGet`, `cuDeviceGetMemPool`.
    pub fn device_current(ordinal: i32) -> Result<MemoryPoolHandle, HandleError> {
        let d = init()?;
        let device = device(d, ordinal)?;
        let mut raw: CUmemoryPool = std::ptr::null_mut();
        // SAFETY: `raw` is a valid out-pointer; read only after success.
        let status = unsafe { (d.cuDeviceGetMemPool)(&mut raw, device) };
        check("cuDeviceGetMemPool", status)?;
        Ok(Self::wrap(raw, Some(ordinal), false))
    }

    /// Device `ordinal`'s default pool, borrowed.
    ///
    /// # Errors
    /// [`HandleError::Driver`] for an invalid device or a failed query.
    ///
    /// Driver calls: `cuInit` (once), `cuDeviceGet`, `cuDeviceGetDefaultMemPool`.
    pub fn device_default(ordinal: i32) -> Result<MemoryPoolHandle, HandleError> {
        let d = init()?;
        let device = device(d, ordinal)?;
        let mut raw: CUmemoryPool = std::ptr::null_mut();
        // SAFETY: `raw` is a valid out-pointer; read only after success.
        let status = unsafe { (d.cuDeviceGetDefaultMemPool)(&mut raw, device) };
        check("cuDeviceGetDefaultMemPool", status)?;
        Ok(Self::wrap(raw, Some(ordinal), false))
    }

    /// Creates a pool with `props`, owned by the handle. The pool's device is the location's id
    /// when the location is a device, `None` otherwise (host pools).
    ///
    /// # Errors
    /// [`HandleError::Driver`] when the driver rejects the properties.
    ///
    /// Driver calls: `cuInit` (once), `cuMemPoolCreate`; `cuMemPoolDestroy` after the last
    /// handle drops.
    pub fn create(props: &CUmemPoolProps) -> Result<MemoryPoolHandle, HandleError> {
        let d = init()?;
        let mut raw: CUmemoryPool = std::ptr::null_mut();
        // SAFETY: `props` is a valid properties struct; `raw` is a valid out-pointer.
        let status = unsafe { (d.cuMemPoolCreate)(&mut raw, props) };
        check("cuMemPoolCreate", status)?;
        let device = (props.location.type_ == CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE)
            .then_some(props.location.id);
        Ok(Self::wrap(raw, device, true))
    }

    /// Wraps a pool made by other code, without destroying it later; see
    /// [`crate::raw::wrap_pool`], whose caller vouches for `raw`.
    ///
    /// # Errors
    /// [`HandleError::InvalidArgument`] for a null pool.
    pub(crate) fn from_raw_borrowed(
        raw: CUmemoryPool,
        device: Option<i32>,
    ) -> Result<MemoryPoolHandle, HandleError> {
        if raw.is_null() {
            return Err(HandleError::invalid(
                "pool",
                "a null memory pool cannot be wrapped",
            ));
        }
        Ok(Self::wrap(raw, device, false))
    }

    /// A borrowed handle for a raw pool known to be non-null (from an existing handle).
    pub(crate) fn borrowed_unchecked(raw: usize, device: Option<i32>) -> MemoryPoolHandle {
        Self::wrap(raw as CUmemoryPool, device, false)
    }

    fn wrap(raw: CUmemoryPool, device: Option<i32>, owned: bool) -> MemoryPoolHandle {
        MemoryPoolHandle(Arc::new(PoolBox {
            raw: raw as usize,
            device,
            owned,
        }))
    }

    /// The raw `CUmemoryPool`, valid while this handle lives.
    #[inline]
    pub fn raw(&self) -> CUmemoryPool {
        self.0.raw as CUmemoryPool
    }

    /// The device the pool allocates on, `None` for a host pool.
    #[inline]
    pub fn device(&self) -> Option<i32> {
        self.0.device
    }

    /// Whether this crate created the pool and will destroy it.
    pub fn is_owned(&self) -> bool {
        self.0.owned
    }

    /// Reads a 64-bit pool attribute (`CU_MEMPOOL_ATTR_USED_MEM_CURRENT`, in bytes, and the
    /// other memory counters).
    ///
    /// # Errors
    /// [`HandleError::Driver`] when the driver rejects the attribute.
    ///
    /// Driver calls: `cuMemPoolGetAttribute`.
    pub fn attribute_u64(&self, attribute: CUmemPool_attribute) -> Result<u64, HandleError> {
        let d = driver()?;
        let mut value: u64 = 0;
        // SAFETY: the handle keeps the pool alive; `value` is an 8-byte out-buffer, the size
        // of every 64-bit pool attribute.
        let status = unsafe {
            (d.cuMemPoolGetAttribute)(self.raw(), attribute, (&mut value as *mut u64).cast())
        };
        check("cuMemPoolGetAttribute", status)?;
        Ok(value)
    }

    /// Reads an `int` pool attribute (the `CU_MEMPOOL_ATTR_REUSE_*` flags), for the Python
    /// bindings' `MemoryPoolAttributes`.
    ///
    /// # Errors
    /// [`HandleError::Driver`] when the driver rejects the attribute.
    ///
    /// Driver calls: `cuMemPoolGetAttribute`.
    pub fn attribute_i32(&self, attribute: CUmemPool_attribute) -> Result<i32, HandleError> {
        let d = driver()?;
        let mut value: std::ffi::c_int = 0;
        // SAFETY: the handle keeps the pool alive; `value` is the `int` out-buffer the
        // driver writes for these attributes.
        let status = unsafe {
            (d.cuMemPoolGetAttribute)(
                self.raw(),
                attribute,
                (&mut value as *mut std::ffi::c_int).cast(),
            )
        };
        check("cuMemPoolGetAttribute", status)?;
        Ok(value)
    }

    /// Releases this handle now; when it is the last one of an owned pool, destroys the pool
    /// and returns the outcome instead of reporting it.
    ///
    /// # Errors
    /// [`HandleError::Driver`] when `cuMemPoolDestroy` fails.
    ///
    /// Driver calls: `cuMemPoolDestroy`.
    pub fn close(self) -> Result<(), HandleError> {
        match Arc::try_unwrap(self.0) {
            Ok(mut pool) => {
                let result = pool.destroy();
                pool.owned = false;
                result
            }
            Err(_) => Ok(()),
        }
    }
}

fn device(d: &cuda_sys::Driver, ordinal: i32) -> Result<i32, HandleError> {
    let mut device = 0;
    // SAFETY: `device` is a valid out-pointer; read only after success.
    let status = unsafe { (d.cuDeviceGet)(&mut device, ordinal) };
    check("cuDeviceGet", status)?;
    Ok(device)
}

impl PoolBox {
    fn destroy(&mut self) -> Result<(), HandleError> {
        if !self.owned {
            return Ok(());
        }
        let d = driver()?;
        // SAFETY: this box created the pool and is its last owner; every allocation from it
        // held a clone, so all have been freed.
        let status = unsafe { (d.cuMemPoolDestroy)(self.raw as CUmemoryPool) };
        check("cuMemPoolDestroy", status)
    }
}

impl Drop for PoolBox {
    fn drop(&mut self) {
        if !self.owned || crate::deferred::exiting() {
            return;
        }
        if let Err(error) = self.destroy() {
            let raw = self.raw as u64;
            report_leak(
                Subject::new("memory pool", "cuMemPoolDestroy", raw, 0, 0),
                error,
            );
        }
    }
}

impl PartialEq for MemoryPoolHandle {
    fn eq(&self, other: &Self) -> bool {
        self.0.raw == other.0.raw
    }
}

impl Eq for MemoryPoolHandle {}

impl fmt::Debug for MemoryPoolHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "MemoryPoolHandle(0x{:x}, device {:?}, {})",
            self.0.raw,
            self.0.device,
            if self.0.owned { "owned" } else { "borrowed" }
        )
    }
}

// Ownership of a pool that `ops` created or imported (the memory crate's pools with properties
// and IPC imports).
impl MemoryPoolHandle {
    /// Takes ownership of a pool created (or imported) by `ops`: destroyed after the last handle
    /// and the last allocation from it go.
    pub(crate) fn from_raw_owned(raw: CUmemoryPool, device: Option<i32>) -> MemoryPoolHandle {
        Self::wrap(raw, device, true)
    }
}
