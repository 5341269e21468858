//! DLPack both ways: tensors custody exports in a `PyCapsule` (a buffer's memory as a 1-D
//! `uint8` tensor, a `StridedMemoryView` with its shape, strides and dtype), each kept alive by
//! what the capsule holds until the consumer calls the deleter; and tensors a producer exports
//! that custody reads ([`ForeignTensor`], for `custody.utils.StridedMemoryView`), whose deleter
//! custody calls when the last view goes. The C structures are DLPack's (`dlpack.h`, 1.x): the
//! unversioned `DLManagedTensor` (capsule `"dltensor"`) and DLPack 1.0's
//! `DLManagedTensorVersioned` (capsule `"dltensor_versioned"`).

use std::ffi::{c_void, CStr};
use std::ptr::NonNull;

use handles::DevicePtrHandle;
use pyo3::exceptions::{PyBufferError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyCapsule;

use crate::report::{release, with_python};

/// `DLDevice`.
#[repr(C)]
struct DlDevice {
    device_type: i32,
    device_id: i32,
}

/// `DLDataType`.
#[repr(C)]
struct DlDataType {
    code: u8,
    bits: u8,
    lanes: u16,
}

/// `DLTensor`.
#[repr(C)]
struct DlTensor {
    data: *mut c_void,
    device: DlDevice,
    ndim: i32,
    dtype: DlDataType,
    shape: *mut i64,
    strides: *mut i64,
    byte_offset: u64,
}

/// `DLManagedTensor` (DLPack's unversioned ABI, capsule name `"dltensor"`).
#[repr(C)]
struct DlManagedTensor {
    dl_tensor: DlTensor,
    manager_ctx: *mut c_void,
    deleter: Option<unsafe extern "C" fn(*mut DlManagedTensor)>,
}

/// `DLPackVersion`.
#[repr(C)]
struct DlPackVersion {
    major: u32,
    minor: u32,
}

/// `DLManagedTensorVersioned` (DLPack 1.0's ABI, capsule name `"dltensor_versioned"`).
#[repr(C)]
struct DlManagedTensorVersioned {
    version: DlPackVersion,
    manager_ctx: *mut c_void,
    deleter: Option<unsafe extern "C" fn(*mut DlManagedTensorVersioned)>,
    /// `DLPACK_FLAG_BITMASK_*`.
    flags: u64,
    dl_tensor: DlTensor,
}

/// The DLPack version of the versioned capsules custody makes (what it implements of the
/// standard: the 1.x layout, the read-only flag).
pub(crate) const DLPACK_VERSION: (u32, u32) = (1, 0);

/// `DLPACK_FLAG_BITMASK_READ_ONLY`.
const READ_ONLY: u64 = 1;

/// `kDLUInt`.
const DL_UINT: u8 = 1;

/// The two managed-tensor ABIs, as far as making and deleting one differs.
trait Managed: Sized {
    const NAME: &'static CStr;
    const USED: &'static CStr;
    fn new(dl_tensor: DlTensor, readonly: bool) -> Self;
    /// The tensor's `dl_tensor` and `manager_ctx`, to point them at the manager's storage.
    fn parts(&mut self) -> (&mut DlTensor, &mut *mut c_void);
    fn deleter(&self) -> Option<unsafe extern "C" fn(*mut Self)>;

    /// Calls the producer's deleter.
    ///
    /// # Safety
    /// `tensor` is a live tensor of this ABI whose deleter has not run. (DLPack keeps the fields
    /// up to `deleter` at their place in every major version, so a versioned tensor of another
    /// major version may be deleted too.)
    unsafe fn delete(tensor: *mut Self) {
        // SAFETY: the caller's contract: a live tensor whose deleter has not run.
        unsafe {
            if let Some(deleter) = (*tensor).deleter() {
                deleter(tensor);
            }
        }
    }
}

impl Managed for DlManagedTensor {
    const NAME: &'static CStr = c"dltensor";
    const USED: &'static CStr = c"used_dltensor";
    fn new(dl_tensor: DlTensor, _readonly: bool) -> Self {
        DlManagedTensor {
            dl_tensor,
            manager_ctx: std::ptr::null_mut(),
            deleter: Some(deleter::<DlManagedTensor>),
        }
    }
    fn parts(&mut self) -> (&mut DlTensor, &mut *mut c_void) {
        (&mut self.dl_tensor, &mut self.manager_ctx)
    }
    fn deleter(&self) -> Option<unsafe extern "C" fn(*mut Self)> {
        self.deleter
    }
}

impl Managed for DlManagedTensorVersioned {
    const NAME: &'static CStr = c"dltensor_versioned";
    const USED: &'static CStr = c"used_dltensor_versioned";
    fn new(dl_tensor: DlTensor, readonly: bool) -> Self {
        DlManagedTensorVersioned {
            version: DlPackVersion {
                major: DLPACK_VERSION.0,
                minor: DLPACK_VERSION.1,
            },
            manager_ctx: std::ptr::null_mut(),
            deleter: Some(deleter::<DlManagedTensorVersioned>),
            flags: if readonly { READ_ONLY } else { 0 },
            dl_tensor,
        }
    }
    fn parts(&mut self) -> (&mut DlTensor, &mut *mut c_void) {
        (&mut self.dl_tensor, &mut self.manager_ctx)
    }
    fn deleter(&self) -> Option<unsafe extern "C" fn(*mut Self)> {
        self.deleter
    }
}

// --- Exports ---

/// A tensor as DLPack describes it, both ways (one custody exports, one a producer's capsule
/// holds): where its first element is (for a producer's, its `data` plus `byte_offset`), its
/// device, shape and strides (in elements; `None`: C-contiguous), its element type (DLPack's
/// `(code, bits, lanes)`) and whether the consumer may write it.
pub(crate) struct TensorSpec {
    pub(crate) data: u64,
    pub(crate) device: (i32, i32),
    pub(crate) shape: Vec<i64>,
    pub(crate) strides: Option<Vec<i64>>,
    pub(crate) dtype: (u8, u8, u16),
    pub(crate) readonly: bool,
}

impl TensorSpec {
    /// `handle`'s memory as a 1-D `uint8` tensor of `handle.size()` elements, writable.
    ///
    /// # Errors
    /// `ValueError` for a size that does not fit DLPack's `int64` shape.
    pub(crate) fn bytes_of(handle: &DevicePtrHandle, device: (i32, i32)) -> PyResult<TensorSpec> {
        let size = i64::try_from(handle.size())
            .map_err(|_| PyValueError::new_err("the buffer is too large for a DLPack shape"))?;
        Ok(TensorSpec {
            data: handle.ptr(),
            device,
            shape: vec![size],
            strides: None,
            dtype: (DL_UINT, 8, 1),
            readonly: false,
        })
    }
}

/// What keeps an exported tensor's memory alive until its deleter runs: a reference to the
/// memory (a buffer's export) or to a Python object (a view's export, which holds its producer).
pub(crate) enum Keep {
    Memory(DevicePtrHandle),
    Object(Py<PyAny>),
}

impl Keep {
    /// Lets go, with the GIL released when the calling thread holds it (releasing the memory may
    /// free it: a driver call) and attached for a Python object. During interpreter shutdown,
    /// when no thread may attach, a Python object is leaked and memory released as it is.
    fn release(self) {
        let mut slot = Some(self);
        let released = with_python(|py| match slot.take() {
            Some(Keep::Memory(handle)) => release(py, move || drop(handle)),
            Some(Keep::Object(object)) => drop(object),
            None => {}
        });
        if released.is_none() {
            match slot {
                Some(Keep::Memory(handle)) => drop(handle),
                Some(Keep::Object(object)) => std::mem::forget(object),
                None => {}
            }
        }
    }
}

/// What a capsule of ours owns: the tensor (first, so a pointer to it is a pointer to the
/// whole), its shape and strides, and what keeps the memory alive.
#[repr(C)]
struct Manager<T> {
    tensor: T,
    dims: Vec<i64>,
    keep: Option<Keep>,
}

/// A `PyCapsule` holding a DLPack tensor described by `spec`, versioned (`"dltensor_versioned"`,
/// DLPack [`DLPACK_VERSION`], with the read-only flag) or not (`"dltensor"`), that holds `keep`
/// until its deleter runs: called by the consumer that renamed the capsule `"used_..."`, or by
/// the capsule's destructor when nobody consumed it.
///
/// # Errors
/// `ValueError` for strides of another length than the shape; what `PyCapsule_New` raises.
pub(crate) fn export<'py>(
    py: Python<'py>,
    spec: TensorSpec,
    keep: Keep,
    versioned: bool,
) -> PyResult<Bound<'py, PyCapsule>> {
    if versioned {
        export_as::<DlManagedTensorVersioned>(py, spec, keep)
    } else {
        export_as::<DlManagedTensor>(py, spec, keep)
    }
}

fn export_as<'py, T: Managed>(
    py: Python<'py>,
    spec: TensorSpec,
    keep: Keep,
) -> PyResult<Bound<'py, PyCapsule>> {
    let ndim = spec.shape.len();
    if spec.strides.as_ref().is_some_and(|s| s.len() != ndim) {
        return Err(PyValueError::new_err(
            "DLPack strides must have one entry per dimension",
        ));
    }
    let ndim_c = i32::try_from(ndim)
        .map_err(|_| PyValueError::new_err("too many dimensions for a DLPack tensor"))?;
    let has_strides = spec.strides.is_some();
    let mut dims = spec.shape;
    dims.extend(spec.strides.unwrap_or_default());
    let (code, bits, lanes) = spec.dtype;
    let dl_tensor = DlTensor {
        data: spec.data as usize as *mut c_void,
        device: DlDevice {
            device_type: spec.device.0,
            device_id: spec.device.1,
        },
        ndim: ndim_c,
        dtype: DlDataType { code, bits, lanes },
        shape: std::ptr::null_mut(),
        strides: std::ptr::null_mut(),
        byte_offset: 0,
    };
    let manager = Box::into_raw(Box::new(Manager {
        tensor: T::new(dl_tensor, spec.readonly),
        dims,
        keep: Some(keep),
    }));
    // SAFETY: `manager` was just leaked from a Box and is exclusively ours until handed over;
    // the dimensions live in a Vec the manager owns, whose buffer does not move until the
    // deleter frees the manager.
    unsafe {
        let dims = (*manager).dims.as_mut_ptr();
        let (tensor, context) = (*manager).tensor.parts();
        if ndim > 0 {
            tensor.shape = dims;
            if has_strides {
                tensor.strides = dims.add(ndim);
            }
        }
        *context = manager.cast();
    }
    let pointer = NonNull::new(manager.cast::<c_void>()).expect("Box::into_raw is never null");
    // SAFETY: `pointer` is a live `Manager<T>` whose first field is the tensor a consumer reads;
    // `destructor::<T>` frees it exactly once unless a consumer took it over (renamed the
    // capsule), and is safe to call on any thread.
    let capsule = unsafe {
        PyCapsule::new_with_pointer_and_destructor(py, pointer, T::NAME, Some(destructor::<T>))
    };
    if capsule.is_err() {
        // SAFETY: the capsule was not made, so nobody else holds the manager.
        unsafe { deleter::<T>(manager.cast()) };
    }
    capsule
}

/// The deleter of the tensors custody exports: frees the manager and lets go of what it kept.
unsafe extern "C" fn deleter<T: Managed>(tensor: *mut T) {
    if tensor.is_null() {
        return;
    }
    // SAFETY: every tensor this module hands out is the first field of a boxed `Manager<T>`,
    // and DLPack calls the deleter exactly once.
    let mut manager = unsafe { Box::from_raw(tensor.cast::<Manager<T>>()) };
    let keep = manager.keep.take();
    drop(manager);
    if let Some(keep) = keep {
        keep.release();
    }
}

/// A capsule's destructor: runs the tensor's deleter if no consumer took the tensor over (a
/// consumer renames the capsule `"used_..."` and calls the deleter itself).
unsafe extern "C" fn destructor<T: Managed>(capsule: *mut pyo3::ffi::PyObject) {
    // SAFETY: CPython calls a capsule's destructor with the capsule, attached; both calls only
    // read the capsule and set no exception for a matching name.
    let tensor = unsafe {
        if pyo3::ffi::PyCapsule_IsValid(capsule, T::NAME.as_ptr()) != 1 {
            return;
        }
        pyo3::ffi::PyCapsule_GetPointer(capsule, T::NAME.as_ptr())
    };
    if !tensor.is_null() {
        // SAFETY: an unconsumed capsule of ours holds a live tensor whose deleter has not run.
        unsafe { deleter::<T>(tensor.cast()) };
    }
}

// --- Imports ---

/// A producer's tensor that custody consumed (its capsule renamed `"used_..."`): dropping it
/// calls the producer's deleter, once.
pub(crate) struct ForeignTensor {
    tensor: NonNull<c_void>,
    delete: unsafe fn(NonNull<c_void>),
}

// SAFETY: the tensor is only touched by `Drop`, which calls the producer's deleter once; DLPack
// puts no thread on the deleter, and producers that need the GIL take it themselves (NumPy's,
// CuPy's), which a drop attached to the interpreter (every Python object's) makes cheap.
unsafe impl Send for ForeignTensor {}
// SAFETY: as `Send`: shared references give no access to the tensor.
unsafe impl Sync for ForeignTensor {}

impl Drop for ForeignTensor {
    fn drop(&mut self) {
        // SAFETY: `tensor` was consumed from its capsule and its deleter has not run.
        unsafe { (self.delete)(self.tensor) };
    }
}

/// # Safety
/// `tensor` is a live tensor of ABI `T` whose deleter has not run.
unsafe fn delete_as<T: Managed>(tensor: NonNull<c_void>) {
    // SAFETY: the caller's contract.
    unsafe { T::delete(tensor.as_ptr().cast()) }
}

/// Consumes the tensor in `capsule` (DLPack 1.x versioned, or unversioned): renames the capsule
/// `"used_..."` (so its destructor leaves the tensor alone), reads the tensor's description and
/// returns it with the tensor, whose deleter runs when the [`ForeignTensor`] is dropped.
///
/// # Errors
/// `BufferError` for an object that is not a DLPack capsule, a capsule already consumed, a
/// versioned tensor of another major version than 1 (released at once: the deleter runs, as
/// DLPack asks), or a malformed tensor (a negative dimension count, no shape for a tensor with
/// dimensions), which is released too.
pub(crate) fn consume(capsule: &Bound<'_, PyAny>) -> PyResult<(ForeignTensor, TensorSpec)> {
    let Ok(capsule) = capsule.cast::<PyCapsule>() else {
        return Err(PyBufferError::new_err(format!(
            "__dlpack__ returned {}, not a DLPack capsule",
            capsule.get_type().name()?
        )));
    };
    let py = capsule.py();
    let raw = capsule.as_ptr();
    // SAFETY: `raw` is a live capsule (held by `capsule`), and we are attached; `IsValid` sets no
    // exception.
    if unsafe { pyo3::ffi::PyCapsule_IsValid(raw, DlManagedTensorVersioned::NAME.as_ptr()) } == 1 {
        // SAFETY: a valid `"dltensor_versioned"` capsule points to a `DLManagedTensorVersioned`.
        let tensor = unsafe { take::<DlManagedTensorVersioned>(py, raw) }?;
        // SAFETY: the tensor is live; the version is the one field every major version keeps
        // at its place, with the deleter.
        let major = unsafe {
            (*tensor.as_ptr().cast::<DlManagedTensorVersioned>())
                .version
                .major
        };
        let owned = ForeignTensor {
            tensor,
            delete: delete_as::<DlManagedTensorVersioned>,
        };
        if major != 1 {
            drop(owned);
            return Err(PyBufferError::new_err(format!(
                "the producer's DLPack tensor has major version {major}; custody reads version 1"
            )));
        }
        // SAFETY: a live version-1 tensor, kept by `owned` while it is read.
        let managed = unsafe { &*tensor.as_ptr().cast::<DlManagedTensorVersioned>() };
        let info = describe(&managed.dl_tensor, managed.flags & READ_ONLY != 0)?;
        return Ok((owned, info));
    }
    // SAFETY: as above.
    if unsafe { pyo3::ffi::PyCapsule_IsValid(raw, DlManagedTensor::NAME.as_ptr()) } == 1 {
        // SAFETY: a valid `"dltensor"` capsule points to a `DLManagedTensor`.
        let tensor = unsafe { take::<DlManagedTensor>(py, raw) }?;
        let owned = ForeignTensor {
            tensor,
            delete: delete_as::<DlManagedTensor>,
        };
        // SAFETY: a live tensor, kept by `owned` while it is read.
        let managed = unsafe { &*tensor.as_ptr().cast::<DlManagedTensor>() };
        let info = describe(&managed.dl_tensor, false)?;
        return Ok((owned, info));
    }
    Err(PyBufferError::new_err(
        "Invalid DLPack capsule: it is neither an unused \"dltensor_versioned\" nor \"dltensor\" one",
    ))
}

/// Takes the tensor out of a capsule of ABI `T`: its pointer, and the capsule renamed used.
///
/// # Safety
/// `capsule` is a live, valid capsule named `T::NAME`.
unsafe fn take<T: Managed>(
    py: Python<'_>,
    capsule: *mut pyo3::ffi::PyObject,
) -> PyResult<NonNull<c_void>> {
    // SAFETY: the caller's contract; a valid capsule's pointer is not NULL.
    let pointer = unsafe { pyo3::ffi::PyCapsule_GetPointer(capsule, T::NAME.as_ptr()) };
    let Some(tensor) = NonNull::new(pointer) else {
        return Err(PyBufferError::new_err("the DLPack capsule holds no tensor"));
    };
    // SAFETY: as above; the name is a static string, as `PyCapsule_SetName` requires.
    if unsafe { pyo3::ffi::PyCapsule_SetName(capsule, T::USED.as_ptr()) } != 0 {
        // `SetName` failed with an exception set, which becomes the error.
        return Err(PyErr::fetch(py));
    }
    Ok(tensor)
}

/// Reads a live tensor's description.
///
/// # Errors
/// `BufferError` for a negative dimension count or a tensor with dimensions and no shape.
fn describe(tensor: &DlTensor, readonly: bool) -> PyResult<TensorSpec> {
    let ndim = usize::try_from(tensor.ndim).map_err(|_| {
        PyBufferError::new_err(format!("a DLPack tensor of {} dimensions", tensor.ndim))
    })?;
    if ndim > 0 && tensor.shape.is_null() {
        return Err(PyBufferError::new_err(
            "a DLPack tensor with dimensions and no shape",
        ));
    }
    let read = |p: *mut i64| -> Vec<i64> {
        if ndim == 0 {
            return Vec::new();
        }
        // SAFETY: DLPack's contract for a live tensor: `shape` (checked non-null above) and a
        // non-null `strides` point to `ndim` int64 values that live as long as the tensor.
        unsafe { std::slice::from_raw_parts(p, ndim) }.to_vec()
    };
    Ok(TensorSpec {
        data: (tensor.data as usize as u64).wrapping_add(tensor.byte_offset),
        device: (tensor.device.device_type, tensor.device.device_id),
        shape: read(tensor.shape),
        strides: (!tensor.strides.is_null()).then(|| read(tensor.strides)),
        dtype: (tensor.dtype.code, tensor.dtype.bits, tensor.dtype.lanes),
        readonly,
    })
}

// --- DLPack's C exchange table (`__dlpack_c_exchange_api__`) ---

/// `DLPackExchangeAPIHeader`.
#[repr(C)]
struct ExchangeHeader {
    version: DlPackVersion,
    prev_api: *mut ExchangeHeader,
}

/// `DLPackExchangeAPI` (DLPack 1.3's `dlpack.h`): what a C consumer calls instead of
/// `__dlpack__`, found as a capsule named `"dlpack_exchange_api"` on the type.
#[repr(C)]
struct ExchangeApi {
    header: ExchangeHeader,
    managed_tensor_allocator: unsafe extern "C" fn(
        *mut DlTensor,
        *mut *mut DlManagedTensorVersioned,
        *mut c_void,
        Option<unsafe extern "C" fn(*mut c_void, *const std::ffi::c_char, *const std::ffi::c_char)>,
    ) -> i32,
    managed_tensor_from_py_object_no_sync:
        unsafe extern "C" fn(*mut c_void, *mut *mut DlManagedTensorVersioned) -> i32,
    managed_tensor_to_py_object_no_sync:
        unsafe extern "C" fn(*mut DlManagedTensorVersioned, *mut *mut c_void) -> i32,
    dltensor_from_py_object_no_sync:
        Option<unsafe extern "C" fn(*mut c_void, *mut DlTensor) -> i32>,
    current_work_stream: unsafe extern "C" fn(i32, i32, *mut *mut c_void) -> i32,
}

/// The table, alive for the whole process as DLPack requires.
struct Table(ExchangeApi);

// SAFETY: the table is immutable after initialisation; its one pointer field (`prev_api`) is
// null, and the function pointers are plain functions safe to call from any thread.
unsafe impl Sync for Table {}

static EXCHANGE_API: Table = Table(ExchangeApi {
    header: ExchangeHeader {
        version: DlPackVersion { major: 1, minor: 3 },
        prev_api: std::ptr::null_mut(),
    },
    managed_tensor_allocator: exchange_allocate,
    managed_tensor_from_py_object_no_sync: exchange_from_object,
    managed_tensor_to_py_object_no_sync: exchange_to_object,
    // Optional in DLPack (a borrowed DLTensor): not provided.
    dltensor_from_py_object_no_sync: None,
    current_work_stream: exchange_current_stream,
});

/// The capsule `"dlpack_exchange_api"` of custody's exchange table (for the type
/// `custody.utils.StridedMemoryView`). Its functions: `managed_tensor_from_py_object_no_sync`
/// exports a view as `__dlpack__(max_version=(1, 0))` does; `managed_tensor_to_py_object_no_sync`
/// makes a view of a tensor (`custody.utils._view_of_exchanged`); the allocator is refused
/// (`NotImplementedError`); the current work stream is NULL (custody has no current stream); the
/// borrowed-`DLTensor` function is absent (NULL, which DLPack allows).
///
/// # Errors
/// What `PyCapsule_New` raises.
pub(crate) fn exchange_api(py: Python<'_>) -> PyResult<Bound<'_, PyCapsule>> {
    let pointer = NonNull::from(&EXCHANGE_API.0).cast::<c_void>();
    // SAFETY: the table is a static that lives for the whole process and is never written; the
    // capsule has no destructor, so nothing frees it.
    unsafe { PyCapsule::new_with_pointer_and_destructor(py, pointer, c"dlpack_exchange_api", None) }
}

/// Runs `f` attached, turning an error into a raised Python exception and -1, a panic into a
/// `RuntimeError` and -1: what every exchange function returns.
fn exchanged(f: impl FnOnce(Python<'_>) -> PyResult<()>) -> i32 {
    Python::attach(|py| {
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(py)))
            .unwrap_or_else(|_| {
                Err(pyo3::exceptions::PyRuntimeError::new_err(
                    "custody's DLPack exchange function panicked",
                ))
            });
        match outcome {
            Ok(()) => 0,
            Err(error) => {
                error.restore(py);
                -1
            }
        }
    })
}

/// `managed_tensor_allocator`: custody allocates through its memory resources, not for a C
/// consumer: refused through `set_error`, as DLPack asks.
unsafe extern "C" fn exchange_allocate(
    _prototype: *mut DlTensor,
    out: *mut *mut DlManagedTensorVersioned,
    error_ctx: *mut c_void,
    set_error: Option<
        unsafe extern "C" fn(*mut c_void, *const std::ffi::c_char, *const std::ffi::c_char),
    >,
) -> i32 {
    if !out.is_null() {
        // SAFETY: the consumer's out-pointer, writable per DLPack's contract.
        unsafe { *out = std::ptr::null_mut() };
    }
    if let Some(set_error) = set_error {
        // SAFETY: the consumer's callback with its own context, called once as DLPack says;
        // both strings are static and NUL-terminated.
        unsafe {
            set_error(
                error_ctx,
                c"NotImplementedError".as_ptr(),
                c"custody's StridedMemoryView does not allocate tensors".as_ptr(),
            );
        }
    }
    -1
}

/// `managed_tensor_from_py_object_no_sync`: the view's own versioned export, taken out of its
/// capsule (renamed used, so the capsule leaves the tensor to the consumer).
unsafe extern "C" fn exchange_from_object(
    py_object: *mut c_void,
    out: *mut *mut DlManagedTensorVersioned,
) -> i32 {
    exchanged(|py| {
        if py_object.is_null() || out.is_null() {
            return Err(pyo3::exceptions::PyRuntimeError::new_err(
                "the DLPack exchange was given a NULL object or out-pointer",
            ));
        }
        // SAFETY: DLPack's contract: `py_object` is a live Python object (of the type the table
        // was found on), borrowed for the call.
        let object = unsafe { Bound::from_borrowed_ptr(py, py_object.cast()) };
        let kwargs = pyo3::types::PyDict::new(py);
        kwargs.set_item("max_version", DLPACK_VERSION)?;
        let capsule = crate::ffi::call_method(&object, "__dlpack__", (), Some(&kwargs))?;
        let capsule = capsule.cast::<PyCapsule>().map_err(PyErr::from)?;
        // SAFETY: our own export, a valid unused "dltensor_versioned" capsule.
        let tensor = unsafe { take::<DlManagedTensorVersioned>(py, capsule.as_ptr()) }?;
        // SAFETY: the consumer's out-pointer, writable per DLPack's contract.
        unsafe { *out = tensor.as_ptr().cast() };
        Ok(())
    })
}

/// The destructor of a capsule holding a consumer's tensor handed to
/// `managed_tensor_to_py_object_no_sync`: calls the tensor's deleter unless a view took it over
/// (renamed the capsule).
unsafe extern "C" fn handed_over_destructor(capsule: *mut pyo3::ffi::PyObject) {
    // SAFETY: CPython calls a capsule's destructor with the capsule, attached; both calls only
    // read the capsule and set no exception for a matching name.
    let tensor = unsafe {
        if pyo3::ffi::PyCapsule_IsValid(capsule, DlManagedTensorVersioned::NAME.as_ptr()) != 1 {
            return;
        }
        pyo3::ffi::PyCapsule_GetPointer(capsule, DlManagedTensorVersioned::NAME.as_ptr())
    };
    if !tensor.is_null() {
        // SAFETY: an unconsumed capsule holds a live tensor whose deleter has not run.
        unsafe { DlManagedTensorVersioned::delete(tensor.cast()) };
    }
}

/// `managed_tensor_to_py_object_no_sync`: a `StridedMemoryView` of the tensor, whose ownership
/// it takes (the view calls the deleter when it goes; on failure the tensor is deleted at once).
unsafe extern "C" fn exchange_to_object(
    tensor: *mut DlManagedTensorVersioned,
    out: *mut *mut c_void,
) -> i32 {
    exchanged(|py| {
        let (Some(tensor), false) = (NonNull::new(tensor), out.is_null()) else {
            return Err(pyo3::exceptions::PyRuntimeError::new_err(
                "the DLPack exchange was given a NULL tensor or out-pointer",
            ));
        };
        // SAFETY: DLPack's contract: a live tensor whose ownership passes to us; the capsule's
        // destructor deletes it unless the view takes it over.
        let capsule = unsafe {
            PyCapsule::new_with_pointer_and_destructor(
                py,
                tensor.cast(),
                DlManagedTensorVersioned::NAME,
                Some(handed_over_destructor),
            )
        };
        let capsule = match capsule {
            Ok(capsule) => capsule,
            Err(error) => {
                // SAFETY: ours now, and no capsule holds it: deleted once, here.
                unsafe { DlManagedTensorVersioned::delete(tensor.as_ptr().cast()) };
                return Err(error);
            }
        };
        let view = py
            .import("custody.utils")?
            .getattr("_view_of_exchanged")?
            .call1((capsule,))?;
        // SAFETY: the consumer's out-pointer, writable per DLPack's contract; it receives the
        // new reference.
        unsafe { *out = view.into_ptr().cast() };
        Ok(())
    })
}

/// `current_work_stream`: NULL (custody has no current stream; the consumer orders its work).
unsafe extern "C" fn exchange_current_stream(
    _device_type: i32,
    _device_id: i32,
    out: *mut *mut c_void,
) -> i32 {
    if out.is_null() {
        return exchanged(|_| {
            Err(pyo3::exceptions::PyRuntimeError::new_err(
                "the DLPack exchange was given a NULL out-pointer",
            ))
        });
    }
    // SAFETY: the consumer's out-pointer, writable per DLPack's contract.
    unsafe { *out = std::ptr::null_mut() };
    0
}
