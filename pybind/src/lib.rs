//! The `custody._custody` extension module: the Rust half of the Python package `custody`
//! (cuda.core 1.2's names for buffers, streams and memory resources, on custody's handles).
//!
//! The modules import one another one way (pybind/DESIGN.md, "Module order"). Below every family,
//! lowest first:
//!
//! - `errors`: the one mapping from Rust errors to Python exceptions; `CUDAError`, `CUDAWarning`;
//!   `Failure`, a Python `deallocate`'s failure carried through the handles crate.
//! - `sync`: `Mutex::lock` as every module takes it.
//! - `identity`: how the objects compare and hash (by the driver handle they wrap).
//! - `report`: cleanup reports as `CUDAWarning`s, attaching to the interpreter safely from any
//!   thread, interpreter shutdown.
//! - `ffi`: the only module with `unsafe` code (DLPack capsules, borrowing a file descriptor,
//!   the `Py_AtExit` callback, the `handles::raw` doors for pointers and streams given as
//!   integers, calls into Python that park a thread CPython stops at exit).
//! - `location`: managed-memory locations (`Device`, `Host`) as the handles crate's; `options`:
//!   cuda.core's options dataclasses (or dicts of their fields), checked and read.
//!
//! - `interop`: what `custody.utils.StridedMemoryView` reads and makes in C (a producer's DLPack
//!   tensor, a view's export, where an address lives) and a buffer's export rule (a named
//!   consumer stream waits and is declared a use).
//!
//! One folder per family of classes, each class's struct beside its methods:
//!
//! - `stream`: `Stream`, `Event`, `Context`, stream arguments, default streams, device-level
//!   functions.
//! - `graph`: `GraphBuilder` (stream capture that retains buffers) and `Graph`.
//! - `buffer`: `Buffer`, `ManagedBuffer` (with managed-memory placement and its batch
//!   functions), DLPack, IPC descriptors.
//! - `resource`: `MemoryResource` (subclassable in Python), the built-in resources, pool IPC and
//!   attributes, the caching resource.
//!
//! A family's struct that other families name (a stream argument, a buffer a resource makes)
//! is in its folder's `class` module, which imports none of them; its `#[pymethods]` are in
//! the same folder, in a module above theirs. `nested` (one Python `deallocate` at a time per
//! thread: a release inside one is queued) sits between the stream family, whose objects it
//! hands to `deallocate`, and the resource family, whose adapter calls it.
//!
//! Every class is `frozen` and `Send + Sync`; every driver call that can block runs with the
//! GIL released (`Python::detach`; the stream-ordered free of `Buffer.close()` keeps it,
//! pybind/DESIGN.md "Hot path"), and nothing relies on the GIL for thread safety
//! (docs/decisions.md D10).

#![deny(unsafe_code)]

/// Adds the `#[pyclass]` types `$class` to the module `$m`, in the order given, returning from
/// the enclosing function at the first error (`m.add_class::<T>()?` each): what a family's
/// `register` does with its classes.
macro_rules! add_classes {
    ($m:expr, [$($class:ty),+ $(,)?]) => {
        $($m.add_class::<$class>()?;)+
    };
}

/// Adds the `#[pyfunction]`s `$function` to the module `$m`, as `add_classes` adds classes
/// (`m.add_function(wrap_pyfunction!(f, m)?)?` each).
macro_rules! add_functions {
    ($m:expr, [$($function:path),+ $(,)?]) => {
        $($m.add_function(wrap_pyfunction!($function, $m)?)?;)+
    };
}

mod buffer;
mod errors;
mod ffi;
mod graph;
mod identity;
mod interop;
mod location;
mod nested;
mod options;
mod report;
mod resource;
mod stream;
mod sync;

use pyo3::prelude::*;

/// Runs every queued deferred cleanup on the calling thread (GIL released) and returns how
/// many ran: frees that CUDA graphs let go of, and synchronous frees waiting for their
/// stream.
#[pyfunction]
fn drain_deferred_cleanup(py: Python<'_>) -> usize {
    py.detach(handles::drain_deferred_cleanup)
}

/// How many cleanup errors and warnings this process has reported (for tests).
#[pyfunction]
fn _cleanup_report_counts() -> (u64, u64) {
    (
        handles::cleanup_error_count(),
        handles::cleanup_warning_count(),
    )
}

/// The compiled part of :mod:`custody`: its streams, events and contexts, buffers, memory
/// resources and graphs, written in Rust. Import them from ``custody``, which re-exports them.
#[pymodule(gil_used = false)]
fn _custody(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("CUDAError", py.get_type::<errors::CUDAError>())?;
    m.add("CUDAWarning", py.get_type::<errors::CUDAWarning>())?;
    stream::register(m)?;
    resource::register(m)?;
    buffer::register(m)?;
    graph::register(m)?;
    interop::register(m)?;
    add_functions!(
        m,
        [
            drain_deferred_cleanup,
            _cleanup_report_counts,
            report::at_python_exit
        ]
    );
    report::init(py)?;
    report::install_hooks();
    ffi::register_at_finalization();
    let at_exit = m.getattr("at_python_exit")?;
    py.import("atexit")?.call_method1("register", (at_exit,))?;
    Ok(())
}
