//! The one place where Rust errors become Python exceptions: [`Error`] (a `MemoryError` or
//! `HandleError` on its way out, or a closed Python buffer) and `From<Error> for PyErr`, plus `custody.CUDAError` and
//! `custody.CUDAWarning`, and [`Failure`], a Python `deallocate`'s failure as it travels through
//! the handles crate as a deallocator error's source (made by `nested`, re-raised here).
//!
//! | Rust error | Python exception |
//! |---|---|
//! | `HandleError::Driver` (a driver call failed) | `CUDAError` (a `RuntimeError`), message naming the call and the driver's error name; `.name` and `.code` attributes |
//! | `HandleError::Load` (no driver loaded) | `CUDAError` with the loader's text (what was tried; `CUSTODY_CUDA_DRIVER` and how to build the emulated driver) |
//! | `HandleError::NoCurrentContext` | `RuntimeError("no CUDA context is current ...")` |
//! | `HandleError::ContextNotActivated`, `HandleError::ContextNotRestored` | `CUDAError` whose text says what happened (did not run; or succeeded, the caller's context not restored, which is current), `.name`/`.code` the context call's |
//! | `Error::Closed` (a Python buffer's shared state, closed: `buffer/shared.rs`) | `RuntimeError("Buffer has been closed")` |
//! | `MemoryError::ResourceClosed` | `RuntimeError("DeviceMemoryResource has been closed")`: a closed pool resource object (`resource/closable.rs`) or caching resource, by its class's name |
//! | `HandleError::Deallocator` | the exception the Python memory resource's `deallocate` raised (it travels as the error's source); else `RuntimeError` |
//! | `MemoryError::InvalidSize` | `ValueError` (zero bytes) or `OverflowError` (more than `isize::MAX`) |
//! | `SizeMismatch`, `InvalidFill`, `OwnershipConflict`, `NoMemoryResource`, `NotManaged`, `HandleError::InvalidArgument`, `HandleError::WrongDevice` | `ValueError` |
//! | `NotCapturing`, `StreamCapturing`, `Ipc` (an `IpcError`), `Graph` (a `GraphError`) | `RuntimeError` (where a method says otherwise, `buffer/methods.rs` and `buffer/ipc.rs`: a descriptor that does not parse or fit the pool is a `ValueError`) |

use handles::HandleError;
use memory::MemoryError;
use pyo3::exceptions::{
    PyOverflowError, PyRuntimeError, PyRuntimeWarning, PyTypeError, PyValueError,
};
use pyo3::prelude::*;
use pyo3::types::{PyTuple, PyType};

pyo3::create_exception!(
    custody,
    CUDAError,
    PyRuntimeError,
    concat!(
        "A CUDA driver call failed (a ``RuntimeError``).\n",
        "\n",
        "The message names the driver function and the driver's error name (``CUDA_ERROR_...``);\n",
        "``name`` holds that name and ``code`` its number. When no driver library loads, the error is\n",
        "``CUDA_ERROR_NOT_FOUND`` and the message says what was tried, that the environment variable\n",
        "``CUSTODY_CUDA_DRIVER`` names a driver library, and how to build the emulated driver.",
    )
);

pyo3::create_exception!(
    custody,
    CUDAWarning,
    PyRuntimeWarning,
    concat!(
        "A cleanup that no caller could receive failed or lost a guarantee (a ``RuntimeWarning``,\n",
        "shown by default).\n",
        "\n",
        "Emitted for a free that failed during a drop, garbage collection, on another thread or in\n",
        "deferred cleanup, naming the operation, pointer, stream and context; and for a\n",
        "per-thread-default-stream free on another thread that waits for a capture to end. If the\n",
        "warning is escalated to an error it goes to ``sys.unraisablehook``; during interpreter\n",
        "shutdown, to stderr.",
    )
);

/// The text of the one "no context" error.
pub(crate) const NO_CONTEXT: &str = "no CUDA context is current: make one current with \
     Device(n).set_current(), or pass a created stream (Device.create_stream())";

/// A Rust error on its way to Python.
#[derive(Debug)]
pub(crate) enum Error {
    /// The memory crate's (or, inside it, the handles crate's).
    Memory(MemoryError),
    /// The Python buffer was closed: its shared state (`buffer/shared.rs`) holds no Rust buffer
    /// any more. Only the bindings have this state: a Rust `Buffer` is consumed by its close.
    Closed,
}

impl From<MemoryError> for Error {
    fn from(error: MemoryError) -> Error {
        Error::Memory(error)
    }
}

impl From<HandleError> for Error {
    fn from(error: HandleError) -> Error {
        Error::Memory(MemoryError::Handle(error))
    }
}

/// Why a call did not free: the error a Python memory resource's deallocation carries through
/// the handles crate (`HandleError::Deallocator`'s source).
#[derive(Debug)]
pub(crate) enum Failure {
    /// The Python call raised: the text names the resource, the pointer and the exception, and
    /// the exception itself travels along, for an explicit close to re-raise.
    Raised { text: String, exception: PyErr },
    /// Python could not be reached (the interpreter is shutting down): not called, leaked.
    Skipped { text: String },
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failure::Raised { text, .. } | Failure::Skipped { text } => f.write_str(text),
        }
    }
}

impl std::error::Error for Failure {}

impl Failure {
    /// The exception the Python `deallocate` raised, if it ran and raised.
    pub(crate) fn exception(&self) -> Option<&PyErr> {
        match self {
            Failure::Raised { exception, .. } => Some(exception),
            Failure::Skipped { .. } => None,
        }
    }
}

fn cuda_error(name: &'static str, code: u32, message: String) -> PyErr {
    Python::attach(|py| {
        let error = CUDAError::new_err(message);
        let value = error.value(py);
        // Attributes on a fresh exception instance cannot fail short of memory exhaustion; the
        // message carries the same facts either way.
        let _ = value.setattr("name", name);
        let _ = value.setattr("code", code);
        error
    })
}

impl From<Error> for PyErr {
    fn from(error: Error) -> PyErr {
        let error = match error {
            Error::Memory(error) => error,
            Error::Closed => return closed("Buffer"),
        };
        match error {
            MemoryError::Handle(handle) => handle_error(handle),
            MemoryError::InvalidSize { size, .. } if size > isize::MAX as usize => {
                PyOverflowError::new_err(error.to_string())
            }
            MemoryError::ResourceClosed { resource } => closed(resource),
            MemoryError::NotCapturing
            | MemoryError::StreamCapturing
            | MemoryError::Ipc(_)
            | MemoryError::Graph(_) => PyRuntimeError::new_err(error.to_string()),
            // InvalidSize (zero), SizeMismatch, InvalidFill, OwnershipConflict,
            // NoMemoryResource, NotManaged, and anything added later.
            other => PyValueError::new_err(other.to_string()),
        }
    }
}

fn handle_error(error: HandleError) -> PyErr {
    match error {
        HandleError::Driver(driver) => {
            let message = driver.to_string();
            cuda_error(driver.code.name(), driver.code.0, message)
        }
        // The loader's text says what was tried and, when nothing loaded, how to name a driver
        // (`CUSTODY_CUDA_DRIVER`) and where the emulated one comes from.
        HandleError::Load(load) => cuda_error("CUDA_ERROR_NOT_FOUND", 500, load.to_string()),
        HandleError::NoCurrentContext => PyRuntimeError::new_err(NO_CONTEXT),
        // The text says what happened (did not run and leaked / succeeded but the context was
        // not restored); `.name` and `.code` are the context call's.
        HandleError::ContextNotActivated {
            error: ref driver, ..
        }
        | HandleError::ContextNotRestored {
            error: ref driver, ..
        } => {
            let (name, code) = (driver.code.name(), driver.code.0);
            cuda_error(name, code, error.to_string())
        }
        HandleError::InvalidArgument { .. } | HandleError::WrongDevice { .. } => {
            PyValueError::new_err(error.to_string())
        }
        HandleError::Deallocator { source } => {
            // A Python deallocate's own exception travels in the error: re-raised as it was.
            let raised = source
                .downcast_ref::<Failure>()
                .and_then(Failure::exception)
                .map(|exception| Python::attach(|py| exception.clone_ref(py)));
            raised
                .unwrap_or_else(|| PyRuntimeError::new_err(format!("deallocate failed: {source}")))
        }
        other => PyRuntimeError::new_err(other.to_string()),
    }
}

/// `RuntimeError("<what> has been closed")`.
pub(crate) fn closed(what: &str) -> PyErr {
    PyRuntimeError::new_err(format!("{what} has been closed"))
}

/// The first 64 bytes of `bytes`, the driver's opaque IPC data that `what` (``"IPC event
/// descriptor: its reserved field"``) carries: `ValueError("invalid <what> is N bytes; expected
/// at least 64")` when it has fewer.
pub(crate) fn ipc_data(bytes: &[u8], what: &str) -> PyResult<[u8; 64]> {
    bytes
        .get(..64)
        .and_then(|data| data.try_into().ok())
        .ok_or_else(|| {
            pyo3::exceptions::PyValueError::new_err(format!(
                "invalid {what} is {} bytes; expected at least 64",
                bytes.len()
            ))
        })
}

/// `TypeError("<expected> expected, got <type name>")`.
pub(crate) fn expected(expected: &str, got: &Bound<'_, PyAny>) -> PyErr {
    PyTypeError::new_err(format!("{expected} expected, got {}", class_name(got)))
}

/// A size in bytes given as argument `name`: an `int` from 0 to 2**64 - 1. Refused with the
/// argument named (pyo3's own conversion says only "can't convert negative int to unsigned"):
/// `OverflowError` for a negative or too large value, `TypeError` (with pyo3's text, which
/// names the type given) for anything but an `int`. An object with `__index__` is named by the
/// value it gave.
pub(crate) fn size_argument(name: &str, object: &Bound<'_, PyAny>) -> PyResult<usize> {
    object.extract::<usize>().map_err(|error| {
        let py = object.py();
        if error.is_instance_of::<pyo3::exceptions::PyOverflowError>(py) {
            pyo3::exceptions::PyOverflowError::new_err(format!(
                "{name} must be a number of bytes from 0 to 2**64 - 1, got {}",
                index_value(object)
            ))
        } else if error.is_instance_of::<PyTypeError>(py) {
            PyTypeError::new_err(format!("{name}: {}", error.value(py)))
        } else {
            error
        }
    })
}

/// What an int-like `object` stands for, for a message: an `int`'s own digits, another object's
/// `operator.index` value (the conversion that was refused called it already), else its repr.
fn index_value(object: &Bound<'_, PyAny>) -> String {
    let value = if object.is_instance_of::<pyo3::types::PyInt>() {
        Ok(object.clone())
    } else {
        object
            .py()
            .import("operator")
            .and_then(|operator| operator.call_method1("index", (object,)))
    };
    value
        .and_then(|value| value.repr())
        .or_else(|_| object.repr())
        .map(|r| r.to_string())
        .unwrap_or_default()
}

/// The name of `object`'s class, as the user called it (a subclass's own name).
pub(crate) fn class_name(object: &Bound<'_, PyAny>) -> String {
    object
        .get_type()
        .name()
        .map(|n| n.to_string())
        .unwrap_or_else(|_| "an unknown type".to_owned())
}

/// Refuses a `stream` passed by position to `method`, whose keyword-only `stream` defaults to
/// `None` in its signature so that `*extra` collects what comes after its `positional`
/// parameters (an optional one written with its default, `"dst=None"`): `Ok` when `extra` is
/// empty, else a `TypeError` in CPython's words for too many positional arguments, naming the
/// class the user called (`on`'s, or `on` itself for a class or static method), then which
/// argument is keyword-only and how the call is written.
#[inline]
pub(crate) fn refuse_positional_stream(
    on: &Bound<'_, PyAny>,
    method: &str,
    positional: &[&str],
    extra: &Bound<'_, PyTuple>,
) -> PyResult<()> {
    if extra.is_empty() {
        return Ok(());
    }
    let class = match on.cast::<PyType>() {
        Ok(class) => class.name()?.to_string(),
        Err(_) => class_name(on),
    };
    let required = positional.iter().filter(|p| !p.contains('=')).count();
    let takes = match (required, positional.len()) {
        (_, 0) => "no positional arguments".to_owned(),
        (1, 1) => "1 positional argument".to_owned(),
        (least, most) if least == most => format!("{most} positional arguments"),
        (least, most) => format!("from {least} to {most} positional arguments"),
    };
    let given = positional.len() + extra.len();
    let were = if given == 1 { "was" } else { "were" };
    let call: Vec<&str> = positional
        .iter()
        .map(|p| p.split('=').next().unwrap_or(p))
        .chain(["stream=s"])
        .collect();
    Err(PyTypeError::new_err(format!(
        "{class}.{method}() takes {takes} but {given} {were} given: stream is keyword-only \
         ({method}({}))",
        call.join(", ")
    )))
}
