//! Where cleanup failures go in Python (docs/decisions.md D3), and how code that runs on any thread
//! (a drop, the cleanup worker, a DLPack deleter) reaches the interpreter safely:
//!
//! - [`install_hooks`]: the handles crate's cleanup-error and cleanup-warning hooks, which emit
//!   `custody.CUDAWarning` (attaching to the interpreter only for that); if the warning is
//!   escalated to an exception, it goes to `sys.unraisablehook`; once the interpreter is
//!   shutting down, one line on stderr. A hook never raises and never panics.
//! - [`with_python`]: attach to the interpreter for one short call, unless it is shutting down.
//! - [`PyObjRef`]: a strong reference to a Python object that any thread may drop.
//! - [`OwedFree`]: a free through a Python `deallocate` that is still owed; what is still owed
//!   when the interpreter has finished shutting down is named on stderr
//!   ([`report_owed_at_finalization`], called by the `Py_AtExit` callback in `ffi`).
//!
//! Shutdown: an `atexit` callback registered at import ([`at_python_exit`]) marks the start of
//! the interpreter's exit. `atexit` runs callbacks last-registered first, so handlers registered
//! before `import custody` run after it, with the interpreter still fully alive; what they free
//! through a Python memory resource must still be freed. After the callback:
//!
//! - the thread that ran it (the interpreter's exit thread, which runs every `atexit` handler
//!   and then the finalization) still runs Python through custody, until `sys.is_finalizing()`
//!   says the interpreter is finalizing;
//! - no other thread does: a thread running Python code with custody's frames below it can be
//!   stopped by CPython once finalization begins (it is made to exit when it next takes the
//!   GIL, which Python code gives up at any switch interval), and that unwinding through Rust
//!   frames aborts the process. What such a thread would free through Python is skipped and
//!   reported on stderr; what it would report goes to stderr; its native frees run without
//!   releasing the GIL ([`release`]).
//!
//! The callback waits, with the GIL released, for threads inside [`with_python`] to leave, so
//! that none is running Python through custody when finalization starts.
//!
//! A buffer of a Python memory resource that the finalization frees has its skipped free
//! reported by that free. One it never frees (a daemon thread's frame holds the module's
//! globals, which the interpreter then never clears; an object it never collects) would go
//! unreported: such frees stay in the [`OwedFree`] registry, and the `Py_AtExit` callback, which
//! CPython runs at the very end of `Py_FinalizeEx`, names each on stderr.

use std::cell::Cell;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, TryLockError};
use std::time::{Duration, Instant};

use pyo3::marker::Ungil;
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::errors::CUDAWarning;
use crate::sync::Locked;

/// Set by the `atexit` callback: the interpreter has begun to exit.
static EXIT_STARTED: AtomicBool = AtomicBool::new(false);
/// Threads inside [`with_python`] (attached or about to attach).
static IN_PYTHON: AtomicUsize = AtomicUsize::new(0);
/// `sys.is_finalizing`, looked up at import (no import machinery is needed to call it late).
static IS_FINALIZING: OnceLock<Py<PyAny>> = OnceLock::new();

thread_local! {
    /// Whether this thread ran the `atexit` callback (the interpreter's exit thread).
    static EXIT_THREAD: Cell<bool> = const { Cell::new(false) };
}

fn on_exit_thread() -> bool {
    EXIT_THREAD.try_with(Cell::get).unwrap_or(false)
}

/// Remembers `sys.is_finalizing` (called once, at import).
pub(crate) fn init(py: Python<'_>) -> PyResult<()> {
    let is_finalizing = py.import("sys")?.getattr("is_finalizing")?.unbind();
    let _ = IS_FINALIZING.set(is_finalizing);
    Ok(())
}

/// Whether the interpreter is finalizing (past every `atexit` handler); an error reads as yes.
fn interpreter_finalizing(py: Python<'_>) -> bool {
    match IS_FINALIZING.get() {
        Some(is_finalizing) => is_finalizing
            .bind(py)
            .call0()
            .and_then(|answer| answer.is_truthy())
            .unwrap_or(true),
        None => false,
    }
}

/// Whether this thread may release the GIL and attach again later: always until the interpreter
/// begins to exit, then only on its exit thread.
#[inline]
pub(crate) fn may_detach() -> bool {
    !EXIT_STARTED.load(Ordering::SeqCst) || on_exit_thread()
}

/// Runs a release (a free that may call the driver or a Python memory resource) with the GIL
/// released, or, on a thread that may not attach again ([`may_detach`]), without releasing it.
pub(crate) fn release<R: Ungil>(py: Python<'_>, f: impl Ungil + FnOnce() -> R) -> R {
    if may_detach() {
        py.detach(f)
    } else {
        f()
    }
}

/// Refuses an allocation through `resource` (a custody memory resource) on a thread other than
/// the interpreter's exit thread once the exit has begun (custody's `atexit` callback ran):
/// such a thread may no longer free through a Python `deallocate` (its frees are skipped and
/// leaked) and CPython stops it when finalization starts, so memory made there could never be
/// freed; daemon threads that kept allocating made garbage faster than the exit thread could
/// free it, and the exit stalled. `RuntimeError`, naming the class and the reason.
pub(crate) fn refuse_allocation_at_exit(resource: &Bound<'_, PyAny>) -> PyResult<()> {
    if may_detach() {
        return Ok(());
    }
    Err(pyo3::exceptions::PyRuntimeError::new_err(format!(
        "{}.allocate: the interpreter is shutting down: custody allocates no memory on a \
         thread other than the interpreter's exit thread once custody's atexit callback has \
         run (memory made there could not be freed through Python and the thread is stopped \
         at finalization)",
        crate::errors::class_name(resource)
    )))
}

/// Runs `f` attached to the interpreter (attaching for the call if this thread is not), unless
/// the interpreter is exiting and this thread may not run Python any more (see the module
/// documentation): then `None`, and `f` does not run; what `f` would release is leaked, what it
/// would report goes to stderr.
pub(crate) fn with_python<R>(f: impl for<'py> FnOnce(Python<'py>) -> R) -> Option<R> {
    IN_PYTHON.fetch_add(1, Ordering::SeqCst);
    let result = if !EXIT_STARTED.load(Ordering::SeqCst) {
        Python::try_attach(f)
    } else if on_exit_thread() {
        Python::try_attach(|py| (!interpreter_finalizing(py)).then(|| f(py))).flatten()
    } else {
        None
    };
    IN_PYTHON.fetch_sub(1, Ordering::SeqCst);
    result
}

/// The `atexit` callback (registered by the module at import): marks the start of the
/// interpreter's exit and its exit thread, then waits (GIL released, at most 5 seconds) for
/// threads inside [`with_python`] to leave, so that no other thread is attached, or about to
/// attach, through custody when finalization starts.
#[pyfunction]
pub(crate) fn at_python_exit(py: Python<'_>) {
    EXIT_THREAD.with(|flag| flag.set(true));
    EXIT_STARTED.store(true, Ordering::SeqCst);
    py.detach(|| {
        let deadline = Instant::now() + Duration::from_secs(5);
        while IN_PYTHON.load(Ordering::SeqCst) != 0 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
    });
}

/// A strong reference to a Python object that any thread may drop: the reference is released
/// attached to the interpreter right away (so `sys.getrefcount` sees it go when the buffer is
/// closed), and leaked where [`with_python`] refuses (the interpreter shutting down). Never
/// released detached: `ffi::HeldObject` relies on it.
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

/// A free through a Python `deallocate` still owed: who frees (the class's name), what, and
/// whether the Python `Buffer` object let go of the memory (closed or freed) while the free
/// stayed owed ([`OwedMark`]).
struct Owed {
    type_name: Arc<str>,
    ptr: u64,
    size: usize,
    let_go: Arc<AtomicBool>,
}

/// Set when the Python `Buffer` object of a free still owed lets go of the memory (its
/// `close()`, or the object freed): if the free is still owed at the end of the interpreter's
/// shutdown, something in custody holds the memory (a CUDA graph, executable or capture never
/// destroyed, or another holder of the same memory), not an object the interpreter never freed.
#[derive(Clone)]
pub(crate) struct OwedMark(Arc<AtomicBool>);

impl OwedMark {
    /// The `Buffer` object let go of the memory.
    pub(crate) fn let_go(&self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// The frees still owed, by registration order (an id, since an address may be adopted again).
static OWED: Mutex<BTreeMap<u64, Owed>> = Mutex::new(BTreeMap::new());
static NEXT_OWED: AtomicU64 = AtomicU64::new(0);

/// A free through a Python `deallocate` still owed: registered when a buffer of a Python memory
/// resource is adopted, removed when dropped, which happens when the `deallocate` is called or
/// its call is skipped (and reported), or when the adoption was refused. Never held while
/// calling Python, so the registry's lock is only ever held for a map operation.
pub(crate) struct OwedFree(u64, OwedMark);

impl OwedFree {
    pub(crate) fn new(type_name: Arc<str>, ptr: u64, size: usize) -> OwedFree {
        let id = NEXT_OWED.fetch_add(1, Ordering::Relaxed);
        let let_go = Arc::new(AtomicBool::new(false));
        let owed = Owed {
            type_name,
            ptr,
            size,
            let_go: Arc::clone(&let_go),
        };
        OWED.locked().insert(id, owed);
        OwedFree(id, OwedMark(let_go))
    }

    /// The mark the buffer's Python object sets when it lets go of the memory.
    pub(crate) fn mark(&self) -> OwedMark {
        self.1.clone()
    }
}

impl Drop for OwedFree {
    fn drop(&mut self) {
        OWED.locked().remove(&self.0);
    }
}

/// Names on stderr, one line each, the frees through a Python `deallocate` still owed: called
/// once the interpreter has finished shutting down (the `Py_AtExit` callback), when they never
/// will be made. Calls no Python. Waits at most a second for the registry's lock (held only for
/// a map operation, by a thread that may be stopped at exit); past that, one line says so.
pub(crate) fn report_owed_at_finalization() {
    use std::io::Write;
    let deadline = Instant::now() + Duration::from_secs(1);
    let owed = loop {
        match OWED.try_lock() {
            Ok(owed) => break Some(owed),
            Err(TryLockError::Poisoned(poisoned)) => break Some(poisoned.into_inner()),
            Err(TryLockError::WouldBlock) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(1));
            }
            Err(TryLockError::WouldBlock) => break None,
        }
    };
    // `writeln!`, not `eprintln!`: a failed write to stderr is ignored, never a panic.
    let mut stderr = std::io::stderr().lock();
    let Some(owed) = owed else {
        let _ = writeln!(
            stderr,
            "custody: CUDAWarning: buffers of Python memory resources may have been alive when \
             the interpreter finished shutting down (their list could not be read); their \
             memory is leaked"
        );
        return;
    };
    for owed in owed.values() {
        let held = if owed.let_go.load(Ordering::Relaxed) {
            "its Buffer was closed or freed, but the memory was still held when the interpreter \
             finished shutting down: by a CUDA graph, executable or stream capture never \
             destroyed or ended (a buffer closed while its stream was being captured, or one a \
             graph retained), or by another Buffer object for the same memory"
        } else {
            "the buffer was still alive when the interpreter finished shutting down (held by \
             something the interpreter never freed, such as a daemon thread's frame)"
        };
        let _ = writeln!(
            stderr,
            "custody: CUDAWarning: {}.deallocate(0x{:x}, {}) was not called: {held}, so the \
             memory is leaked",
            owed.type_name, owed.ptr, owed.size
        );
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
        let pending = PyErr::take(py);
        if let Err(error) = warn(py, message) {
            error.write_unraisable(py, None);
        }
        if let Some(pending) = pending {
            pending.restore(py);
        }
    });
    if delivered.is_none() {
        // `writeln!`, not `eprintln!`: a failed write to stderr (closed, or a pipe nobody
        // reads) is ignored, never a panic in a hook documented never to panic.
        use std::io::Write;
        let _ = writeln!(std::io::stderr().lock(), "custody: CUDAWarning: {message}");
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
