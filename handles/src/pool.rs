//! [`MemoryPoolHandle`]: a device's current or default memory pool (borrowed, never destroyed)
//! or a pool this crate created (destroyed after its last handle, allocations included, drops);
//! pools made with explicit properties ([`create_pool`]) and pool IPC ([`export_pool`],
//! [`import_pool`]), and which devices may use a pool's memory ([`MemAccess`]).

use std::ffi::c_int;
use std::fmt;
use std::marker::PhantomData;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::sync::Arc;

use cuda_sys::types::{
    c_void, CUmemAccessDesc, CUmemAccess_flags, CUmemAllocationHandleType, CUmemLocation,
    CUmemLocationType, CUmemPoolProps, CUmemPool_attribute, CUmemoryPool,
};
use cuda_sys::Driver;

use crate::error::HandleError;
use crate::report::{report_leak, Subject};
use crate::sys::{check, driver, init};

/// Aligned to 128 bytes, so that a box has its cache lines to itself (Intel's adjacent-line
/// prefetcher pairs 64-byte lines): it is read by every allocation from the pool, and its
/// reference count is written by every allocation from an owned pool; a neighbour's writes on the
/// same line would slow those down (handles/DESIGN.md, "Layout").
#[repr(align(128))]
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

/// A memory pool attribute (`CU_MEMPOOL_ATTR_*`) whose value is a `T`: `u64` for the byte
/// counts and the release threshold (`cuuint64_t` in the driver), `bool` for the reuse flags
/// (`int`). Read with [`MemoryPoolHandle::attribute`]; the type fixes the size of the buffer the
/// driver writes, so no attribute can be read into a smaller one.
pub struct PoolAttribute<T> {
    raw: CUmemPool_attribute,
    value: PhantomData<fn() -> T>,
}

impl<T> Clone for PoolAttribute<T> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<T> Copy for PoolAttribute<T> {}

impl<T> fmt::Debug for PoolAttribute<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PoolAttribute({:?})", self.raw)
    }
}

impl<T> PoolAttribute<T> {
    const fn new(raw: CUmemPool_attribute) -> Self {
        PoolAttribute {
            raw,
            value: PhantomData,
        }
    }

    /// The driver's attribute.
    pub fn raw(self) -> CUmemPool_attribute {
        self.raw
    }
}

/// The attributes, each with the type of its value: one `impl PoolAttribute<T>` block per entry.
macro_rules! pool_attributes {
    ($($(#[$doc:meta])* $name:ident: $value:ty = $raw:ident;)*) => {$(
        impl PoolAttribute<$value> {
            $(#[$doc])*
            pub const $name: Self = Self::new(CUmemPool_attribute::$raw);
        }
    )*};
}

pool_attributes! {
    /// `CU_MEMPOOL_ATTR_RELEASE_THRESHOLD`: bytes the pool keeps reserved when synchronised.
    RELEASE_THRESHOLD: u64 = CU_MEMPOOL_ATTR_RELEASE_THRESHOLD;
    /// `CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT`: bytes the pool has reserved from the device.
    RESERVED_MEM_CURRENT: u64 = CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT;
    /// `CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH`: the high-water mark of the reserved bytes.
    RESERVED_MEM_HIGH: u64 = CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH;
    /// `CU_MEMPOOL_ATTR_USED_MEM_CURRENT`: bytes allocated from the pool and not freed.
    USED_MEM_CURRENT: u64 = CU_MEMPOOL_ATTR_USED_MEM_CURRENT;
    /// `CU_MEMPOOL_ATTR_USED_MEM_HIGH`: the high-water mark of the used bytes.
    USED_MEM_HIGH: u64 = CU_MEMPOOL_ATTR_USED_MEM_HIGH;
    /// `CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES`.
    REUSE_FOLLOW_EVENT_DEPENDENCIES: bool = CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES;
    /// `CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC`.
    REUSE_ALLOW_OPPORTUNISTIC: bool = CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC;
    /// `CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES`.
    REUSE_ALLOW_INTERNAL_DEPENDENCIES: bool = CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES;
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for u64 {}
    impl Sealed for bool {}
}

/// The value type of a [`PoolAttribute`]: `u64` (the driver's `cuuint64_t`) or `bool` (its
/// `int` flags). Sealed: the driver's attributes have exactly these widths.
pub trait PoolAttributeValue: sealed::Sealed + Sized {
    /// What the driver writes.
    #[doc(hidden)]
    type Raw: Default + Copy;
    #[doc(hidden)]
    fn from_raw(raw: Self::Raw) -> Self;
}

impl PoolAttributeValue for u64 {
    type Raw = u64;
    fn from_raw(raw: u64) -> u64 {
        raw
    }
}

impl PoolAttributeValue for bool {
    type Raw = c_int;
    fn from_raw(raw: c_int) -> bool {
        raw != 0
    }
}

impl MemoryPoolHandle {
    /// Device `ordinal`'s current pool (the one `cuMemAllocAsync` uses), borrowed.
    ///
    /// # Errors
    /// [`HandleError::Driver`] for an invalid device or a failed query.
    ///
    /// Driver calls: `cuInit` (once), `cuDeviceGet`, `cuDeviceGetMemPool`.
    pub fn device_current(ordinal: i32) -> Result<MemoryPoolHandle, HandleError> {
        Self::device_pool(ordinal, "cuDeviceGetMemPool", |d| d.cuDeviceGetMemPool)
    }

    /// Device `ordinal`'s default pool, borrowed.
    ///
    /// # Errors
    /// [`HandleError::Driver`] for an invalid device or a failed query.
    ///
    /// Driver calls: `cuInit` (once), `cuDeviceGet`, `cuDeviceGetDefaultMemPool`.
    pub fn device_default(ordinal: i32) -> Result<MemoryPoolHandle, HandleError> {
        Self::device_pool(ordinal, "cuDeviceGetDefaultMemPool", |d| {
            d.cuDeviceGetDefaultMemPool
        })
    }

    /// Device `ordinal`'s pool as the driver's `query` (`call`) names it, borrowed.
    fn device_pool(
        ordinal: i32,
        call: &'static str,
        query: impl FnOnce(&'static Driver) -> cuda_sys::fn_types::cuDeviceGetMemPool,
    ) -> Result<MemoryPoolHandle, HandleError> {
        let d = init()?;
        let device = device(d, ordinal)?;
        let mut raw: CUmemoryPool = std::ptr::null_mut();
        // SAFETY: `raw` is a valid out-pointer; read only after success.
        let status = unsafe { query(d)(&mut raw, device) };
        check(call, status)?;
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

    /// Reads a pool attribute, typed by the width of its value: a byte count
    /// ([`PoolAttribute::USED_MEM_CURRENT`] and the other counters, `cuuint64_t` in the driver)
    /// or a reuse flag ([`PoolAttribute::REUSE_ALLOW_OPPORTUNISTIC`] and the others, `int`). The
    /// out-buffer is the attribute's own width, so an attribute cannot be read into a buffer
    /// too small for what the driver writes: the pairing is checked by the compiler.
    ///
    /// ```
    /// # use handles::{MemoryPoolHandle, PoolAttribute};
    /// let pool = MemoryPoolHandle::device_current(0)?;
    /// let used: u64 = pool.attribute(PoolAttribute::USED_MEM_CURRENT)?;
    /// let opportunistic: bool = pool.attribute(PoolAttribute::REUSE_ALLOW_OPPORTUNISTIC)?;
    /// # let _ = (used, opportunistic);
    /// # Ok::<(), handles::HandleError>(())
    /// ```
    ///
    /// A 64-bit attribute read as a flag does not compile (the driver would write 8 bytes into
    /// an `int`):
    ///
    /// ```compile_fail
    /// # use handles::{MemoryPoolHandle, PoolAttribute};
    /// let pool = MemoryPoolHandle::device_current(0)?;
    /// let used: bool = pool.attribute(PoolAttribute::<bool>::USED_MEM_CURRENT)?;
    /// # Ok::<(), handles::HandleError>(())
    /// ```
    ///
    /// # Errors
    /// [`HandleError::Driver`] when the driver rejects the attribute.
    ///
    /// Driver calls: `cuMemPoolGetAttribute`.
    pub fn attribute<T: PoolAttributeValue>(
        &self,
        attribute: PoolAttribute<T>,
    ) -> Result<T, HandleError> {
        let d = driver()?;
        let mut value = T::Raw::default();
        // SAFETY: the handle keeps the pool alive; `value` is the attribute's own type (its
        // `PoolAttribute<T>` says which: `cuuint64_t` or `int`), the out-buffer the driver
        // writes for it.
        let status = unsafe {
            (d.cuMemPoolGetAttribute)(
                self.raw(),
                attribute.raw,
                (&mut value as *mut T::Raw).cast(),
            )
        };
        check("cuMemPoolGetAttribute", status)?;
        Ok(T::from_raw(value))
    }

    /// Releases this handle now; when it is the last one of an owned pool, destroys the pool
    /// and returns the outcome instead of reporting it.
    ///
    /// # Errors
    /// [`HandleError::Driver`] when `cuMemPoolDestroy` fails.
    ///
    /// Driver calls: `cuMemPoolDestroy`.
    pub fn close(self) -> Result<(), HandleError> {
        // `into_inner`: exactly one of two releases at the same moment is the last (a failed
        // `try_unwrap` would drop a reference that may be the last by then, as a drop).
        match Arc::into_inner(self.0) {
            Some(mut pool) => {
                let result = pool.destroy();
                pool.owned = false;
                result
            }
            None => Ok(()),
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
        if !self.owned || crate::lifecycle::exiting() {
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

/// `CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR`.
pub(crate) const HANDLE_TYPE_POSIX_FD: u32 = 1;
/// `CU_MEM_ALLOCATION_TYPE_PINNED`.
const ALLOCATION_TYPE_PINNED: u32 = 1;
/// `CU_MEM_LOCATION_TYPE_DEVICE`.
const LOCATION_DEVICE: u32 = 1;
/// `CU_MEM_LOCATION_TYPE_HOST` (not in the 12.0 types).
const LOCATION_HOST: u32 = 2;
/// `CU_MEM_LOCATION_TYPE_HOST_NUMA` (CUDA 12.2 and later; not in the 12.0 types).
const LOCATION_HOST_NUMA: u32 = 3;

/// Where a pool created by [`create_pool`] places its memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PoolLocation {
    /// On device `ordinal`.
    Device(i32),
    /// Pinned host memory on NUMA node `node` (`CU_MEM_LOCATION_TYPE_HOST_NUMA`, a CUDA 12.2
    /// driver or later); every device is granted read-write access.
    HostNuma(i32),
    /// Pinned host memory placed by the operating system (`CU_MEM_LOCATION_TYPE_HOST`, no NUMA
    /// node named); every device is granted read-write access. A real driver shares such a
    /// pool with no other process: an IPC pool names its node ([`PoolLocation::HostNuma`]).
    Host,
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
        // The id is not read for this type; -1 is what cuda.core passes (measured to work).
        PoolLocation::Host => (LOCATION_HOST, -1, None),
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
    let pool = pool_create(d, &props, device)?;
    let raw = pool.raw();
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
/// [`crate::import_pointer`].
///
/// An imported host pool starts with no device access in the importing process
/// (`docs/driver-facts.md` F21), as a created one does in its own: every device is granted
/// read-write access, as [`create_pool`] does.
///
/// # Errors
/// [`HandleError::Driver`] when the driver rejects the descriptor, or the access grant of a host
/// pool (the imported pool is then released).
///
/// Driver calls: `cuInit` (once), `cuMemPoolImportFromShareableHandle`; for a host pool
/// `cuDeviceGetCount` and `cuMemPoolSetAccess`.
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
    let pool = MemoryPoolHandle::from_raw_owned(raw, device);
    if device.is_none() {
        grant_all_devices(d, raw)?; // on error `pool` drops and releases the imported pool
    }
    Ok(pool)
}

// Managed memory pools (`CU_MEM_ALLOCATION_TYPE_MANAGED`, CUDA 13 drivers): what a managed
// memory resource of a CUDA 13 driver allocates from.

/// `CU_MEM_ALLOCATION_TYPE_MANAGED` (CUDA 13; not in the 12.0 types).
const ALLOCATION_TYPE_MANAGED: u32 = 2;
/// `CU_MEM_LOCATION_TYPE_NONE` (not in the 12.0 types): no preferred location.
const LOCATION_NONE: u32 = 0;

/// The preferred location of a managed memory pool: where the driver places its pages first.
/// Every device and the host can access the memory wherever it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ManagedPoolLocation {
    /// No preference (`CU_MEM_LOCATION_TYPE_NONE`): the driver decides.
    None,
    /// Device `ordinal`.
    Device(i32),
    /// Host memory placed by the operating system (`CU_MEM_LOCATION_TYPE_HOST`).
    Host,
    /// Host NUMA node `node` (`CU_MEM_LOCATION_TYPE_HOST_NUMA`).
    HostNuma(i32),
}

impl ManagedPoolLocation {
    fn raw(self) -> cuda_sys::types::RawMemLocation {
        let (type_, id) = match self {
            ManagedPoolLocation::None => (LOCATION_NONE, -1),
            ManagedPoolLocation::Device(ordinal) => (LOCATION_DEVICE, ordinal),
            ManagedPoolLocation::Host => (LOCATION_HOST, -1),
            ManagedPoolLocation::HostNuma(node) => (LOCATION_HOST_NUMA, node),
        };
        cuda_sys::types::RawMemLocation { type_, id }
    }
}

/// Whether the loaded driver has managed memory pools: a CUDA 13 driver (version 13000 or
/// later) that exports `cuMemGetMemPool`. No driver call beyond loading it.
///
/// # Errors
/// [`HandleError::Load`] when no driver loads.
pub fn managed_pools_supported() -> Result<bool, HandleError> {
    let d = driver()?;
    Ok(d.version() >= 13000 && d.cuMemGetMemPool().is_ok())
}

/// Creates a managed memory pool preferring `preferred`, owned by the returned handle
/// (destroyed after its last handle and last allocation go). The pool has no device
/// ([`MemoryPoolHandle::device`] is `None`): a stream of any device may allocate from it. It
/// cannot be shared with other processes (the driver refuses IPC for managed pools), and no
/// access is granted: managed memory is accessible everywhere.
///
/// # Errors
/// [`HandleError::Driver`] when the driver rejects the properties (an invalid device or node,
/// `CUDA_ERROR_INVALID_VALUE` from a driver older than CUDA 13, which has no managed pools:
/// ask [`managed_pools_supported`] first).
///
/// Driver calls: `cuInit` (once), `cuMemPoolCreate`; `cuMemPoolDestroy` after the last handle
/// drops.
pub fn create_managed_pool(
    preferred: ManagedPoolLocation,
) -> Result<MemoryPoolHandle, HandleError> {
    let d = init()?;
    let location = preferred.raw();
    let props = RawPoolProps {
        alloc_type: ALLOCATION_TYPE_MANAGED,
        handle_types: 0,
        location_type: location.type_,
        location_id: location.id,
        win32_security_attributes: std::ptr::null_mut(),
        max_size: 0,
        reserved: [0; 56],
    };
    pool_create(d, &props, None)
}

/// `cuMemPoolCreate` with `props`, the pool owned by the new handle (destroyed with its last
/// clone) and placed on `device` (`None`: pinned host or managed memory).
fn pool_create(
    d: &'static Driver,
    props: &RawPoolProps,
    device: Option<i32>,
) -> Result<MemoryPoolHandle, HandleError> {
    let mut raw: CUmemoryPool = std::ptr::null_mut();
    // SAFETY: `props` has the layout of `CUmemPoolProps` (checked where it is declared) and the
    // driver only reads it; `raw` is a valid out-pointer read after success.
    let status = unsafe {
        (d.cuMemPoolCreate)(
            &mut raw,
            (props as *const RawPoolProps).cast::<CUmemPoolProps>(),
        )
    };
    check("cuMemPoolCreate", status)?;
    Ok(MemoryPoolHandle::from_raw_owned(raw, device))
}

impl MemoryPoolHandle {
    /// The current managed memory pool for `preferred` (`cuMemGetMemPool` with
    /// `CU_MEM_ALLOCATION_TYPE_MANAGED`; the default managed pool of that location until
    /// `cuMemSetMemPool` changes it), borrowed: never destroyed. Its device is `None`, as for
    /// [`create_managed_pool`].
    ///
    /// # Errors
    /// [`HandleError::Load`] when the driver lacks `cuMemGetMemPool` (before CUDA 13);
    /// [`HandleError::Driver`] when it rejects the location.
    ///
    /// Driver calls: `cuInit` (once), `cuMemGetMemPool`.
    pub fn managed_current(
        preferred: ManagedPoolLocation,
    ) -> Result<MemoryPoolHandle, HandleError> {
        let d = init()?;
        let get = d.cuMemGetMemPool().map_err(HandleError::Load)?;
        let mut location = preferred.raw();
        let mut raw: CUmemoryPool = std::ptr::null_mut();
        // SAFETY: `raw` and `location` are valid pointers (the driver reads the location, of
        // `CUmemLocation`'s layout); `raw` is read only after success.
        let status = unsafe { get(&mut raw, &mut location, ALLOCATION_TYPE_MANAGED) };
        check("cuMemGetMemPool", status)?;
        if raw.is_null() {
            return Err(HandleError::invalid(
                "pool",
                "the driver returned no managed memory pool",
            ));
        }
        Ok(Self::wrap(raw, None, false))
    }
}

// Which devices may use a pool's memory (`cuMemPoolGetAccess`, `cuMemPoolSetAccess`).

/// A device's access to a pool's memory (`CUmemAccess_flags`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemAccess {
    /// `CU_MEM_ACCESS_FLAGS_PROT_NONE`: none.
    None,
    /// `CU_MEM_ACCESS_FLAGS_PROT_READ`: read-only.
    Read,
    /// `CU_MEM_ACCESS_FLAGS_PROT_READWRITE`: read and write.
    ReadWrite,
}

impl MemAccess {
    fn flags(self) -> CUmemAccess_flags {
        match self {
            MemAccess::None => CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_NONE,
            MemAccess::Read => CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READ,
            MemAccess::ReadWrite => CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
        }
    }
}

fn device_location(ordinal: i32) -> CUmemLocation {
    CUmemLocation {
        type_: CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
        id: ordinal,
    }
}

impl MemoryPoolHandle {
    /// Device `ordinal`'s access to this pool's memory (a pool's own device always has
    /// read-write access).
    ///
    /// # Errors
    /// [`HandleError::Load`] when the driver lacks `cuMemPoolGetAccess`;
    /// [`HandleError::Driver`] when it refuses (an invalid device).
    ///
    /// Driver calls: `cuMemPoolGetAccess`.
    pub fn access(&self, ordinal: i32) -> Result<MemAccess, HandleError> {
        let get = driver()?.cuMemPoolGetAccess().map_err(HandleError::Load)?;
        let mut location = device_location(ordinal);
        let mut flags: u32 = 0;
        // SAFETY: `flags` is 4 writable bytes, read as a plain integer (the driver's answer is
        // never held in the Rust enum); `location` is a valid location; the handle keeps the
        // pool alive.
        let status = unsafe {
            get(
                (&mut flags as *mut u32).cast::<CUmemAccess_flags>(),
                self.raw(),
                &mut location,
            )
        };
        check("cuMemPoolGetAccess", status)?;
        Ok(match flags {
            0 => MemAccess::None,
            1 => MemAccess::Read,
            _ => MemAccess::ReadWrite,
        })
    }

    /// Sets the access of each `(device ordinal, access)` to this pool's memory, in one driver
    /// call; every allocation of the pool, present and future, is affected. Nothing for an
    /// empty list.
    ///
    /// # Errors
    /// [`HandleError::Driver`] when the driver refuses (an invalid device, a device that cannot
    /// access the pool's, the pool's own device's access revoked); nothing changed then.
    ///
    /// Driver calls: `cuMemPoolSetAccess` (none for an empty list).
    pub fn set_access(&self, access: &[(i32, MemAccess)]) -> Result<(), HandleError> {
        if access.is_empty() {
            return Ok(());
        }
        let d = driver()?;
        let descs: Vec<CUmemAccessDesc> = access
            .iter()
            .map(|&(ordinal, access)| CUmemAccessDesc {
                location: device_location(ordinal),
                flags: access.flags(),
            })
            .collect();
        // SAFETY: `descs` holds `descs.len()` valid descriptors; the handle keeps the pool
        // alive.
        let status = unsafe { (d.cuMemPoolSetAccess)(self.raw(), descs.as_ptr(), descs.len()) };
        check("cuMemPoolSetAccess", status)
    }
}
