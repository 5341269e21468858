//! The one module of the bindings with `unsafe` code: DLPack both ways (`dlpack`: tensors
//! exported in a `PyCapsule` and producers' tensors read), borrowing a file
//! descriptor given as a Python `int` (pool IPC), and wrapping a stream handle given as a Python
//! `int` (`Stream.from_handle`), and registering the `Py_AtExit` callback that names the frees
//! through Python still owed once the interpreter has finished shutting down, and the calls into
//! Python code below custody's frames ([`getattr`], [`call`]) that park a thread CPython stops at
//! exit instead of letting its unwind abort the process, and [`HeldObject`], the pointer through
//! which a buffer shows the collector what its memory's handle holds. Every `unsafe` block names
//! its invariant.
#![allow(unsafe_code)]

pub(crate) mod dlpack;

use std::mem::ManuallyDrop;
use std::os::fd::BorrowedFd;
use std::sync::{Arc, Weak};

use handles::{HandleError, StreamHandle};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::pyclass::{PyTraverseError, PyVisit};

use crate::report::PyObjRef;

/// A Python object that a memory handle holds (through a [`PyObjRef`]: a buffer's `owner`, or the
/// Python resource whose `deallocate` frees it), as the buffer object sees it: a `Weak` of the
/// holder, for the `owner` property, and a copy of the object's pointer, which this value never
/// releases, for the collector's traversal, which may neither take a lock nor take or drop a
/// reference (so it cannot upgrade the `Weak`: its drop could release the object).
pub(crate) struct HeldObject {
    holder: Weak<PyObjRef>,
    /// The holder's object, not owned: never dropped.
    object: ManuallyDrop<Py<PyAny>>,
}

impl HeldObject {
    pub(crate) fn new(holder: &Arc<PyObjRef>) -> HeldObject {
        HeldObject {
            holder: Arc::downgrade(holder),
            // SAFETY: a bitwise copy of the holder's `Py` (a pointer to the object). Inside
            // `ManuallyDrop` it never releases the reference, which stays the holder's, and it is
            // lent out only while the holder still holds its own (`visit`).
            object: ManuallyDrop::new(unsafe { std::ptr::read(holder.get()) }),
        }
    }

    /// The object, while its holder holds it (a new reference).
    pub(crate) fn get(&self, py: Python<'_>) -> Option<Py<PyAny>> {
        Some(self.holder.upgrade()?.get().clone_ref(py))
    }

    /// Shows the object to the collector while its holder holds it, reading the holder's count
    /// only (no lock, no reference taken or dropped).
    ///
    /// # Errors
    /// What the collector's visit returns.
    pub(crate) fn visit(&self, visit: &PyVisit<'_>) -> Result<(), PyTraverseError> {
        if self.holder.strong_count() == 0 {
            return Ok(());
        }
        // The holder held its reference just now, and a `PyObjRef` releases it only attached to
        // the interpreter (its drop), which no other thread is while the collector traverses
        // (it holds the GIL, or has stopped the world): the object lives until the visit ends.
        visit.call(&*self.object)
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
