//! The `custody._custody` extension module: the Rust half of the Python package `custody`
//! (cuda.core 1.2's names for buffers, streams and memory resources, on custody's handles).
//!
//! The modules, lowest first; each imports only modules before it (pybind/DESIGN.md, "Module
//! order"):
//!
//! - `errors`: the one mapping from Rust errors to Python exceptions; `CUDAError`, `CUDAWarning`;
//!   `Failure`, a Python `deallocate`'s failure carried through the handles crate.
//! - `report`: cleanup reports as `CUDAWarning`s, attaching to the interpreter safely from any
//!   thread, interpreter shutdown.
//! - `ffi`: the only module with `unsafe` code (DLPack capsules, borrowing a file descriptor,
//!   the `Py_AtExit` callback, the `handles::raw` doors for pointers and streams given as
//!   integers, calls into Python that park a thread CPython stops at exit);
//!   `shared`: the closable, shared state of a Python `Buffer` over the Rust buffer it holds.
//! - `location`: managed-memory locations (`Device`, `Host`) as the handles crate's; `options`:
//!   cuda.core's options dataclasses (or dicts of their fields), checked and read.
//! - `classes`: the structs of the classes that several families name (`Stream`,
//!   `GraphBuilder`, `Buffer`, `ManagedBuffer`), with their constructors and accessors.
//! - `stream`: `Stream`, `Event`, `Context`, stream arguments, default streams, device-level
//!   functions.
//! - `graph`: `GraphBuilder` (stream capture that retains buffers) and `Graph`.
//! - `nested`: one Python `deallocate` at a time per thread (a release inside one is queued).
//! - `resource`: `MemoryResource` (subclassable in Python) and the built-in resources.
//! - `buffer`: `Buffer`, `ManagedBuffer` (with managed-memory placement and its batch
//!   functions), DLPack, IPC descriptors.
//!
//! Every class is `frozen` and `Send + Sync`; every driver call that can block runs with the
//! GIL released (`Python::detach`; the stream-ordered free of `Buffer.close()` keeps it,
//! pybind/DESIGN.md "Hot path"), and nothing relies on the GIL for thread safety
//! (docs/decisions.md D10).

#![deny(unsafe_code)]

mod buffer;
mod classes;
mod errors;
mod ffi;
mod graph;
mod location;
mod nested;
mod options;
mod report;
mod resource;
mod shared;
mod stream;

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

#[pymodule(gil_used = false)]
fn _custody(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("CUDAError", py.get_type::<errors::CUDAError>())?;
    m.add("CUDAWarning", py.get_type::<errors::CUDAWarning>())?;
    stream::register(m)?;
    resource::register(m)?;
    buffer::register(m)?;
    graph::register(m)?;
    m.add_function(wrap_pyfunction!(drain_deferred_cleanup, m)?)?;
    m.add_function(wrap_pyfunction!(_cleanup_report_counts, m)?)?;
    m.add_function(wrap_pyfunction!(report::at_python_exit, m)?)?;
    report::init(py)?;
    report::install_hooks();
    ffi::register_at_finalization();
    let at_exit = m.getattr("at_python_exit")?;
    py.import("atexit")?.call_method1("register", (at_exit,))?;
    Ok(())
}
