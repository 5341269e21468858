//! Where cleanup failures go in Python (docs/decisions.md D3), and how code that runs on any thread
//! (a drop, the cleanup worker, a DLPack deleter) reaches the interpreter safely:
//!
//! - [`install_hooks`]: the handles crate's cleanup-error and cleanup-warning hooks, which emit
//!   `custody.CUDAWarning` (attaching to the interpreter only for that); if the warning is
//!   escalated to an exception, it goes to `sys.unraisablehook`; once the interpreter is
//!   shutting down, one line on stderr. A hook never raises and never panics.
//! - [`with_python`]: attach to the interpreter for one short call, unless it is shutting down.
//! - [`PyObjRef`]: a strong reference to a Python object that any thread may drop.
//!
//! Shutdown is detected by an `atexit` callback registered at import ([`at_python_exit`]): it
//! runs before the interpreter starts finalizing, after non-daemon threads were joined. From then
//! on no thread that is not already attached attaches again (a thread that attaches during
//! finalization may be stopped by CPython, in the middle of our code); the callback then waits,
//! with the GIL released, for threads inside [`with_python`] to leave.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::errors::{take_deallocate_error, CUDAWarning};

/// Set by the `atexit` callback: the interpreter is about to finalize.
static FINALIZING: AtomicBool = AtomicBool::new(false);
/// Threads inside [`with_python`] (attached or about to attach).
static IN_PYTHON: AtomicUsize = AtomicUsize::new(0);

/// Whether the interpreter is shutting down (the `atexit` callback has run).
#[inline]
pub(crate) fn finalizing() -> bool {
    FINALIZING.load(Ordering::SeqCst)
}

/// Runs `f` attached to the interpreter (attaching for the call if this thread is not), unless
/// the interpreter is shutting down: then `None`, and `f` does not run. (The limited API cannot
/// tell whether this thread is attached, so during shutdown even an attached thread skips:
/// what `f` would release is leaked, what it would report goes to stderr.)
pub(crate) fn with_python<R>(f: impl for<'py> FnOnce(Python<'py>) -> R) -> Option<R> {
    IN_PYTHON.fetch_add(1, Ordering::SeqCst);
    let result = if finalizing() {
        None
    } else {
        Python::try_attach(f)
    };
    IN_PYTHON.fetch_sub(1, Ordering::SeqCst);
    result
}

/// The `atexit` callback (registered by the module at import): marks the interpreter as shutting
/// down, then waits (GIL released, at most 5 seconds) for threads inside [`with_python`] to
/// leave, so that none of them is attached when finalization starts.
#[pyfunction]
pub(crate) fn at_python_exit(py: Python<'_>) {
    FINALIZING.store(true, Ordering::SeqCst);
    py.detach(|| {
        let deadline = Instant::now() + Duration::from_secs(5);
        while IN_PYTHON.load(Ordering::SeqCst) != 0 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
    });
}

/// A strong reference to a Python object that any thread may drop: the reference is released
/// attached to the interpreter right away (so `sys.getrefcount` sees it go when the buffer is
/// closed), and leaked once the interpreter is shutting down.
pub(crate) struct PyObjRef(Option<Py<PyAny>>);

impl PyObjRef {
    pub(crate) fn new(object: Py<PyAny>) -> PyObjRef {
        PyObjRef(Some(object))
    }

    pub(crate) fn get(&self) -> &Py<PyAny> {
        match &self.0 {
            Some(object) => object,
            // Only `Drop` empties the slot.
            None => unreachable!("a PyObjRef is emptied only when dropped"),
        }
    }
}

impl Drop for PyObjRef {
    fn drop(&mut self) {
        let Some(object) = self.0.take() else { return };
        let mut slot = Some(object);
        if with_python(|_py| drop(slot.take())).is_none() {
            // The interpreter is shutting down: releasing the reference could run arbitrary
            // Python code on a thread that may not attach. Leaked on purpose.
            std::mem::forget(slot);
        }
    }
}

/// Emits `message` as a `custody.CUDAWarning`; never raises.
///
/// An exception in flight on this thread is kept and restored around the warning. If the
/// warning machinery raises (the filter is `"error"`), the exception goes to
/// `sys.unraisablehook`. When the interpreter cannot be reached (shutting down), one line goes to
/// stderr.
pub(crate) fn report(message: &str) {
    let delivered = with_python(|py| {
        // The exception a Python `deallocate` raised is in the message already.
        drop(take_deallocate_error());
        let pending = PyErr::take(py);
        if let Err(error) = warn(py, message) {
            error.write_unraisable(py, None);
        }
        if let Some(pending) = pending {
            pending.restore(py);
        }
    });
    if delivered.is_none() {
        eprintln!("custody: CUDAWarning: {message}");
    }
}

/// `warnings.warn_explicit(message, CUDAWarning, "<custody cleanup>", 0, module="custody",
/// registry=None)`: a fresh registry per report, so that two failures with the same text (a
/// pointer value reused) are both shown under the default filter.
fn warn(py: Python<'_>, message: &str) -> PyResult<()> {
    let warnings = py.import("warnings")?;
    let kwargs = PyDict::new(py);
    kwargs.set_item("module", "custody")?;
    kwargs.set_item("registry", py.None())?;
    warnings.call_method(
        "warn_explicit",
        (
            message,
            py.get_type::<CUDAWarning>(),
            "<custody cleanup>",
            0,
        ),
        Some(&kwargs),
    )?;
    Ok(())
}

/// Installs the cleanup-error and cleanup-warning hooks (docs/decisions.md D3, D6). Called once, at
/// import.
pub(crate) fn install_hooks() {
    handles::set_cleanup_error_hook(Box::new(|error: &handles::CleanupError| {
        report(&error.to_string());
    }));
    handles::set_cleanup_warning_hook(Box::new(|warning: &handles::CleanupWarning| {
        report(&warning.to_string());
    }));
}
