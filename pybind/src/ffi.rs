//! The one module of the bindings with `unsafe` code: DLPack capsules (a `DLManagedTensor`
//! handed to a consumer through a `PyCapsule` named `"dltensor"`, or DLPack 1.0's
//! `DLManagedTensorVersioned` through one named `"dltensor_versioned"`), borrowing a file
//! descriptor given as a Python `int` (pool IPC), and wrapping a stream handle given as a Python
//! `int` (`Stream.from_handle`), and registering the `Py_AtExit` callback that names the frees
//! through Python still owed once the interpreter has finished shutting down, and the calls into
//! Python code below custody's frames ([`getattr`], [`call`]) that park a thread CPython stops at
//! exit instead of letting its unwind abort the process. Every `unsafe` block names its
//! invariant.
#![allow(unsafe_code)]

use std::ffi::c_void;
use std::os::fd::BorrowedFd;
use std::ptr::NonNull;

use handles::{DevicePtrHandle, HandleError, StreamHandle};
use pyo3::exceptions::PyValueError;
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

/// What a capsule owns: the tensor (first, so a pointer to it is a pointer to the whole), its
/// shape, and a strong reference to the memory, released by the deleter.
#[repr(C)]
struct Manager {
    tensor: DlManagedTensor,
    shape: [i64; 1],
    handle: Option<DevicePtrHandle>,
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
    /// `DLPACK_FLAG_BITMASK_*`: 0, since custody's memory is writable and never a copy.
    flags: u64,
    dl_tensor: DlTensor,
}

/// What a versioned capsule owns, laid out as [`Manager`] is.
#[repr(C)]
struct VersionedManager {
    tensor: DlManagedTensorVersioned,
    shape: [i64; 1],
    handle: Option<DevicePtrHandle>,
}

const DLTENSOR_VERSIONED: &std::ffi::CStr = c"dltensor_versioned";

/// The DLPack version of the versioned capsules (what custody implements of the standard).
pub(crate) const DLPACK_VERSION: (u32, u32) = (1, 0);

/// `kDLUInt`.
const DL_UINT: u8 = 1;

const DLTENSOR: &std::ffi::CStr = c"dltensor";

/// A `PyCapsule` named `"dltensor"` holding a `DLManagedTensor` that describes `handle`'s memory
/// as a 1-D `uint8` tensor of `handle.size()` elements on `(device_type, device_id)`. The
/// tensor holds a clone of `handle` (keeping the memory alive after the buffer is closed) until
/// its deleter runs: called by the consumer that renamed the capsule `"used_dltensor"`, or by the
/// capsule's destructor when nobody consumed it.
///
/// # Errors
/// `ValueError` for a size that does not fit DLPack's `int64` shape; what `PyCapsule_New`
/// raises.
pub(crate) fn dlpack_capsule<'py>(
    py: Python<'py>,
    handle: DevicePtrHandle,
    device_type: i32,
    device_id: i32,
) -> PyResult<Bound<'py, PyCapsule>> {
    let size = i64::try_from(handle.size())
        .map_err(|_| PyValueError::new_err("the buffer is too large for a DLPack shape"))?;
    let data = handle.ptr() as usize as *mut c_void;
    let manager = Box::into_raw(Box::new(Manager {
        tensor: DlManagedTensor {
            dl_tensor: DlTensor {
                data,
                device: DlDevice {
                    device_type,
                    device_id,
                },
                ndim: 1,
                dtype: DlDataType {
                    code: DL_UINT,
                    bits: 8,
                    lanes: 1,
                },
                shape: std::ptr::null_mut(),
                strides: std::ptr::null_mut(),
                byte_offset: 0,
            },
            manager_ctx: std::ptr::null_mut(),
            deleter: Some(dlpack_deleter),
        },
        shape: [size],
        handle: Some(handle),
    }));
    // SAFETY: `manager` was just leaked from a Box and is exclusively ours until handed over;
    // the shape lives inside the same allocation, which does not move until the deleter frees
    // it.
    unsafe {
        (*manager).tensor.dl_tensor.shape = (*manager).shape.as_mut_ptr();
        (*manager).tensor.manager_ctx = manager.cast();
    }
    let pointer = NonNull::new(manager.cast::<c_void>()).expect("Box::into_raw is never null");
    // SAFETY: `pointer` is a live `Manager` whose first field is the `DLManagedTensor` a
    // consumer reads; `capsule_destructor` frees it exactly once unless a consumer took it over
    // (renamed the capsule), and is safe to call on any thread.
    let capsule = unsafe {
        PyCapsule::new_with_pointer_and_destructor(py, pointer, DLTENSOR, Some(capsule_destructor))
    };
    if capsule.is_err() {
        // SAFETY: the capsule was not made, so nobody else holds the manager.
        unsafe { dlpack_deleter(manager.cast()) };
    }
    capsule
}

/// A `PyCapsule` named `"dltensor_versioned"` holding a `DLManagedTensorVersioned` (DLPack
/// 1.0) over `handle`'s memory, as [`dlpack_capsule`] describes it, with no flags set: the
/// memory is writable and not a copy.
///
/// # Errors
/// As [`dlpack_capsule`].
pub(crate) fn dlpack_capsule_versioned<'py>(
    py: Python<'py>,
    handle: DevicePtrHandle,
    device_type: i32,
    device_id: i32,
) -> PyResult<Bound<'py, PyCapsule>> {
    let size = i64::try_from(handle.size())
        .map_err(|_| PyValueError::new_err("the buffer is too large for a DLPack shape"))?;
    let data = handle.ptr() as usize as *mut c_void;
    let manager = Box::into_raw(Box::new(VersionedManager {
        tensor: DlManagedTensorVersioned {
            version: DlPackVersion {
                major: DLPACK_VERSION.0,
                minor: DLPACK_VERSION.1,
            },
            manager_ctx: std::ptr::null_mut(),
            deleter: Some(dlpack_deleter_versioned),
            flags: 0,
            dl_tensor: DlTensor {
                data,
                device: DlDevice {
                    device_type,
                    device_id,
                },
                ndim: 1,
                dtype: DlDataType {
                    code: DL_UINT,
                    bits: 8,
                    lanes: 1,
                },
                shape: std::ptr::null_mut(),
                strides: std::ptr::null_mut(),
                byte_offset: 0,
            },
        },
        shape: [size],
        handle: Some(handle),
    }));
    // SAFETY: as in `dlpack_capsule`: exclusively ours, and the shape lives in the same box.
    unsafe {
        (*manager).tensor.dl_tensor.shape = (*manager).shape.as_mut_ptr();
        (*manager).tensor.manager_ctx = manager.cast();
    }
    let pointer = NonNull::new(manager.cast::<c_void>()).expect("Box::into_raw is never null");
    // SAFETY: `pointer` is a live `VersionedManager` whose first field is the
    // `DLManagedTensorVersioned` a consumer reads; `capsule_destructor_versioned` frees it
    // exactly once unless a consumer took it over (renamed the capsule).
    let capsule = unsafe {
        PyCapsule::new_with_pointer_and_destructor(
            py,
            pointer,
            DLTENSOR_VERSIONED,
            Some(capsule_destructor_versioned),
        )
    };
    if capsule.is_err() {
        // SAFETY: the capsule was not made, so nobody else holds the manager.
        unsafe { dlpack_deleter_versioned(manager.cast()) };
    }
    capsule
}

/// Releases a memory reference a capsule held, with the GIL released when the calling thread
/// holds it (the release may free the memory: a driver call).
fn release_from_capsule(handle: Option<DevicePtrHandle>) {
    let Some(handle) = handle else { return };
    let mut slot = Some(handle);
    let released = with_python(|py| {
        let handle = slot.take();
        release(py, move || drop(handle));
    });
    if released.is_none() {
        // Interpreter shutting down: release on this thread as it is.
        drop(slot);
    }
}

/// The versioned tensor's deleter (as [`dlpack_deleter`]).
unsafe extern "C" fn dlpack_deleter_versioned(tensor: *mut DlManagedTensorVersioned) {
    if tensor.is_null() {
        return;
    }
    // SAFETY: every versioned tensor this module hands out is the first field of a boxed
    // `VersionedManager`, and DLPack calls the deleter exactly once.
    let mut manager = unsafe { Box::from_raw(tensor.cast::<VersionedManager>()) };
    let handle = manager.handle.take();
    drop(manager);
    release_from_capsule(handle);
}

/// The versioned capsule's destructor: runs the deleter if no consumer took the tensor over
/// (a consumer renames the capsule `"used_dltensor_versioned"` and calls the deleter itself).
unsafe extern "C" fn capsule_destructor_versioned(capsule: *mut pyo3::ffi::PyObject) {
    // SAFETY: CPython calls a capsule's destructor with the capsule, attached; both calls only
    // read the capsule and set no exception for a matching name.
    let tensor = unsafe {
        if pyo3::ffi::PyCapsule_IsValid(capsule, DLTENSOR_VERSIONED.as_ptr()) != 1 {
            return;
        }
        pyo3::ffi::PyCapsule_GetPointer(capsule, DLTENSOR_VERSIONED.as_ptr())
    };
    if !tensor.is_null() {
        // SAFETY: an unconsumed "dltensor_versioned" capsule of ours holds a live tensor whose
        // deleter has not run.
        unsafe { dlpack_deleter_versioned(tensor.cast()) };
    }
}

/// The tensor's deleter: frees the manager and releases the memory reference, with the GIL
/// released when the calling thread holds it (the release may free the memory: a driver call).
unsafe extern "C" fn dlpack_deleter(tensor: *mut DlManagedTensor) {
    if tensor.is_null() {
        return;
    }
    // SAFETY: every tensor this module hands out is the first field of a boxed `Manager`, and
    // DLPack calls the deleter exactly once.
    let mut manager = unsafe { Box::from_raw(tensor.cast::<Manager>()) };
    let handle = manager.handle.take();
    drop(manager);
    release_from_capsule(handle);
}

/// The capsule's destructor: runs the tensor's deleter if no consumer took the tensor over
/// (a consumer renames the capsule `"used_dltensor"` and calls the deleter itself).
unsafe extern "C" fn capsule_destructor(capsule: *mut pyo3::ffi::PyObject) {
    // SAFETY: CPython calls a capsule's destructor with the capsule, attached; both calls only
    // read the capsule and set no exception for a matching name.
    let tensor = unsafe {
        if pyo3::ffi::PyCapsule_IsValid(capsule, DLTENSOR.as_ptr()) != 1 {
            return;
        }
        pyo3::ffi::PyCapsule_GetPointer(capsule, DLTENSOR.as_ptr())
    };
    if !tensor.is_null() {
        // SAFETY: an unconsumed "dltensor" capsule of ours holds a live tensor whose deleter
        // has not run.
        unsafe { dlpack_deleter(tensor.cast()) };
    }
}

/// Runs `f` with `fd` borrowed as a [`BorrowedFd`].
///
/// # Errors
/// `ValueError` for a negative descriptor.
pub(crate) fn with_borrowed_fd<R>(fd: i32, f: impl FnOnce(BorrowedFd<'_>) -> R) -> PyResult<R> {
    if fd < 0 {
        return Err(PyValueError::new_err(format!(
            "a file descriptor is a non-negative int, got {fd}"
        )));
    }
    // SAFETY: `fd` is not -1; the caller (Python code) keeps the descriptor open for this
    // synchronous call, and the borrow does not outlive it. A descriptor that is not open makes
    // the driver return an error, nothing worse: nothing here closes or reads it.
    let borrowed = unsafe { BorrowedFd::borrow_raw(fd) };
    Ok(f(borrowed))
}

/// Wraps a stream handle a Python caller gave as an `int` (`Stream.from_handle`, the
/// `__cuda_stream__` protocol); `owner` (the protocol object) is kept while the handle lives.
///
/// # Errors
/// What `cuStreamGetCtx` says about `raw`.
pub(crate) fn wrap_foreign_stream(
    raw: usize,
    owner: Option<Box<dyn std::any::Any + Send + Sync>>,
) -> Result<StreamHandle, HandleError> {
    // SAFETY: the Python caller's word that `raw` is a live stream that outlives the wrapper (the
    // contract of cuda.core's `Stream.from_handle`, which this mirrors); Python code is outside
    // Rust's guarantees, and a bad handle fails there as it does with cuda.core.
    unsafe { handles::raw::wrap_stream(raw, owner) }
}

/// The right to free `size` bytes at `ptr`, as a Python caller hands it over: to
/// `Buffer.from_handle(ptr, size, mr=...)` (the buffer then owns the memory) or to a built-in
/// resource's `deallocate(ptr, size, stream=...)`.
pub(crate) fn owned_allocation(ptr: u64, size: usize) -> handles::OwnedAllocation {
    // SAFETY: the Python caller's word that `ptr` is an allocation of `size` bytes it gives up
    // (the contract of cuda.core's `Buffer.from_handle` and `MemoryResource.deallocate`, which
    // these mirror); Python code is outside Rust's guarantees.
    unsafe { handles::raw::owned_allocation(ptr, size) }
}

/// A handle over `size` bytes at `ptr` that the buffer does not free (`Buffer.from_handle`
/// without `mr`): nobody's (`owner` `None`), or kept alive by `owner` (the Python object).
///
/// # Errors
/// [`HandleError::InvalidArgument`] for a null `ptr` with an owner.
pub(crate) fn unowned_handle(
    ptr: u64,
    size: usize,
    owner: Option<Box<dyn std::any::Any + Send + Sync>>,
) -> Result<handles::DevicePtrHandle, HandleError> {
    match owner {
        // SAFETY: the Python caller's word that the memory stays valid while `owner` lives (as
        // cuda.core's `Buffer.from_handle(owner=...)`).
        Some(owner) => unsafe { handles::raw::with_owner(ptr, size, owner) },
        // SAFETY: the Python caller's word that the memory stays valid while the buffer is used
        // (as cuda.core's `Buffer.from_handle(ptr, size)`).
        None => Ok(unsafe { handles::raw::borrowed(ptr, size) }),
    }
}

/// CPython's `Py_AtExit` callback: runs at the very end of `Py_FinalizeEx`, once the interpreter
/// has finished shutting down, and names on stderr the frees through a Python `deallocate` still
/// owed (buffers the finalization never freed). Calls no Python, as `Py_AtExit` requires; never
/// unwinds into CPython.
extern "C" fn at_finalization() {
    let _ = std::panic::catch_unwind(crate::report::report_owed_at_finalization);
}

/// Registers [`at_finalization`] with `Py_AtExit`, once per process (at import). `false` when
/// CPython refused (it keeps at most 32 such callbacks): the owed frees are then not named.
pub(crate) fn register_at_finalization() -> bool {
    static REGISTERED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *REGISTERED.get_or_init(|| {
        // SAFETY: `at_finalization` is a plain `extern "C"` function with no arguments that
        // calls no Python API and catches every panic; registering it has no other effect.
        unsafe { pyo3::ffi::Py_AtExit(Some(at_finalization)) == 0 }
    })
}

/// The two C-API calls through which custody runs Python code below its own frames, declared
/// `"C-unwind"`: pyo3 declares them `"C"`, which tells the compiler they never unwind, and an
/// optimized build then leaves their call sites out of the frame's unwind table, so a forced
/// unwind out of them is refused there (glibc aborts). Both are in the stable ABI.
mod unwinding {
    use pyo3::ffi::PyObject;

    extern "C-unwind" {
        pub fn PyObject_GetAttr(object: *mut PyObject, name: *mut PyObject) -> *mut PyObject;
        pub fn PyObject_Call(
            callable: *mut PyObject,
            args: *mut PyObject,
            kwargs: *mut PyObject,
        ) -> *mut PyObject;
    }
}

/// Dropped only by an unwind out of a call into Python ([`getattr`], [`call`]): a Rust panic
/// goes on unwinding; any other unwind parks the thread forever (see [`getattr`]).
struct ParkOnForcedUnwind;

impl Drop for ParkOnForcedUnwind {
    fn drop(&mut self) {
        if std::thread::panicking() {
            return;
        }
        loop {
            std::thread::park();
        }
    }
}

/// `getattr(object, name)` (`PyObject_GetAttr`), for Python code that custody runs below its own
/// frames: a Python memory resource's properties, `__cuda_stream__`, custody's Python helpers.
///
/// CPython before 3.14 stops a thread (a daemon thread, or one Python did not start) that takes
/// the GIL once the interpreter is finalizing: `pthread_exit`, whose forced unwind runs up the
/// stack. Reaching a Rust `catch_unwind` (pyo3's around every method), or a Rust frame whose
/// unwind table leaves the call out, it aborts the process. Here it meets
/// [`ParkOnForcedUnwind`] first, which parks the thread for the rest of the process's life, as
/// pyo3 does when the same happens while it takes the GIL back after `Python::detach`, and as
/// CPython 3.14 does itself: the thread's frames and what they hold stay as they are (leaked),
/// and the process exits normally (pybind/DESIGN.md, "Shutdown").
///
/// # Errors
/// What the lookup raises.
pub(crate) fn getattr<'py>(object: &Bound<'py, PyAny>, name: &str) -> PyResult<Bound<'py, PyAny>> {
    let py = object.py();
    let name = pyo3::types::PyString::new(py, name);
    let stop = ParkOnForcedUnwind;
    // SAFETY: attached (`py`); both pointers are live objects the caller and `name` hold for the
    // call.
    let raw = unsafe { unwinding::PyObject_GetAttr(object.as_ptr(), name.as_ptr()) };
    std::mem::forget(stop);
    // SAFETY: `PyObject_GetAttr` returns a new reference, or NULL with an exception set.
    unsafe { Bound::from_owned_ptr_or_err(py, raw) }
}

/// `callable(*args, **kwargs)` (`PyObject_Call`), parked as [`getattr`] is when CPython stops
/// the thread inside.
///
/// # Errors
/// What the call raises; a conversion of `args` that fails.
pub(crate) fn call<'py>(
    callable: &Bound<'py, PyAny>,
    args: impl IntoPyObject<'py, Target = pyo3::types::PyTuple>,
    kwargs: Option<&Bound<'py, pyo3::types::PyDict>>,
) -> PyResult<Bound<'py, PyAny>> {
    let py = callable.py();
    let args = pyo3::BoundObject::into_bound(args.into_pyobject(py).map_err(Into::into)?);
    let kwargs = kwargs.map_or(std::ptr::null_mut(), |kwargs| kwargs.as_ptr());
    let stop = ParkOnForcedUnwind;
    // SAFETY: attached (`py`); `callable`, `args` (a tuple) and `kwargs` (a dict, or NULL) are
    // live objects held for the call.
    let raw = unsafe { unwinding::PyObject_Call(callable.as_ptr(), args.as_ptr(), kwargs) };
    std::mem::forget(stop);
    // SAFETY: `PyObject_Call` returns a new reference, or NULL with an exception set.
    unsafe { Bound::from_owned_ptr_or_err(py, raw) }
}

/// `object.name(*args, **kwargs)`, parked as [`getattr`] is.
///
/// # Errors
/// What the lookup or the call raises.
pub(crate) fn call_method<'py>(
    object: &Bound<'py, PyAny>,
    name: &str,
    args: impl IntoPyObject<'py, Target = pyo3::types::PyTuple>,
    kwargs: Option<&Bound<'py, pyo3::types::PyDict>>,
) -> PyResult<Bound<'py, PyAny>> {
    call(&getattr(object, name)?, args, kwargs)
}

/// `hasattr(object, name)`, parked as [`getattr`] is: an `AttributeError` is `false`, any other
/// exception is returned.
///
/// # Errors
/// What the lookup raises other than `AttributeError`.
pub(crate) fn hasattr(object: &Bound<'_, PyAny>, name: &str) -> PyResult<bool> {
    match getattr(object, name) {
        Ok(_) => Ok(true),
        Err(error) if error.is_instance_of::<pyo3::exceptions::PyAttributeError>(object.py()) => {
            Ok(false)
        }
        Err(error) => Err(error),
    }
}
