//! `MemoryResource`'s methods (its struct is in `class`): `allocate` (a built-in's, or the
//! `TypeError` of a subclass that does not define it; a `GraphBuilder` stream for graph
//! memory), `deallocate`, and what its memory is; `allocate`'s argument rules and errors, which
//! name the class called.

use std::sync::Arc;

use handles::sys_types::CUdeviceptr;
use memory::{MemoryError, MemoryResource};
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::PyTuple;

use super::class::{not_implemented, PyMemoryResource};
use super::graph::PyGraphMemoryResource;
use super::pools::pool_of;
use crate::buffer::class::{Kept, PyBuffer};
use crate::errors::{class_name, refuse_positional_stream, size_argument, Error};
use crate::ffi::owned_allocation;
use crate::graph::class::PyGraphBuilder;
use crate::graph::methods::allocate_in;
use crate::report::refuse_allocation_at_exit;
use crate::stream::accept::{accept_stream, default_stream_handle, required_stream};

/// The Rust resource of a built-in `mr`; for a Python subclass, [`not_implemented`] naming its
/// class.
fn native_of<'a>(
    mr: &'a Bound<'_, PyMemoryResource>,
    what: &str,
) -> PyResult<&'a Arc<dyn MemoryResource>> {
    mr.get()
        .native
        .as_ref()
        .ok_or_else(|| not_implemented(&class_name(mr.as_any()), what))
}

#[pymethods]
impl PyMemoryResource {
    #[new]
    #[pyo3(signature = (*_args, **_kwargs), text_signature = "(*args, **kwargs)")]
    fn py_new(_args: &Bound<'_, PyTuple>, _kwargs: Option<&Bound<'_, PyAny>>) -> Self {
        PyMemoryResource {
            native: None,
            managed: false,
            stream_optional: false,
        }
    }

    /// Allocates ``size`` bytes ordered on ``stream`` (keyword-only), which also orders the
    /// eventual free.
    ///
    /// Zero bytes give an empty buffer of this resource (address 0, no driver call).
    /// ``LegacyPinnedMemoryResource`` and ``SynchronousMemoryResource`` need no ``stream`` (the
    /// free is then ordered on the default stream). ``OverflowError`` for negative sizes or more
    /// than ``isize::MAX``; ``TypeError`` for a missing, None or non-stream ``stream``, or one
    /// passed by position, the message naming the class called; ``RuntimeError`` for a closed
    /// stream or a default stream with no current context; :class:`CUDAError` for the driver's
    /// failure (among them ``CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED`` for a stream-ordered
    /// allocation on a stream not being captured, beside a global capture on any thread or a
    /// thread-local capture of this thread: the driver then invalidates that capture; custody
    /// relaxes its frees beside a capture, not allocations); ``RuntimeError`` (``the interpreter
    /// is shutting down: ...``) on a thread other than the interpreter's exit thread once
    /// custody's ``atexit`` callback has run. The base class raises ``TypeError``, and so does a
    /// subclass that does not define it.
    // pyo3 parses the arguments: under the 3.11 stable ABI the method is called with
    // `METH_FASTCALL | METH_KEYWORDS` and keyword names are compared in place, so the usual
    // call `allocate(n, stream=s)` builds no argument tuple and no keyword dict (a hand parser
    // over `*args, **kwargs` made pyo3 build both, -871 instructions per allocate+close;
    // pybind/DESIGN.md, "Hot path"). `stream` defaults to `None` and `*extra` (the shared
    // empty tuple for such a call) catches a stream passed by position, so that those errors
    // still name the class called (`allocate_arguments`). No `**kwargs`: with one pyo3 falls
    // back to `METH_VARARGS | METH_KEYWORDS` (a tuple and a dict per call, +990 instructions
    // per allocate+close), so an unknown keyword gets pyo3's message, which names the base
    // class `MemoryResource`.
    #[pyo3(
        signature = (size, *extra, stream = None),
        text_signature = "($self, size, *, stream)"
    )]
    fn allocate(
        slf: &Bound<'_, Self>,
        size: &Bound<'_, PyAny>,
        extra: &Bound<'_, PyTuple>,
        stream: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Py<PyAny>> {
        let (size, stream) = allocate_arguments(slf, size, extra, stream)?;
        let this = slf.get();
        let native = Arc::clone(native_of(slf, "allocate")?);
        let py = slf.py();
        let mr = || Some(slf.clone().into_any().unbind());
        let stream = match stream {
            Some(stream) => {
                if let Ok(builder) = stream.cast::<PyGraphBuilder>() {
                    if slf.is_instance_of::<PyGraphMemoryResource>() {
                        if size == 0 {
                            builder.get().builder()?;
                            return PyBuffer::empty(py, mr(), this.managed);
                        }
                        return allocate_in(
                            py,
                            builder.get(),
                            size,
                            slf.clone().into_any().unbind(),
                        );
                    }
                }
                accept_stream(&stream)?
            }
            // Resources whose memory is allocated synchronously: the free is ordered on the
            // default stream, bound to the current context.
            None => default_stream_handle(),
        };
        if size == 0 {
            return PyBuffer::empty(py, mr(), this.managed);
        }
        let buffer = py
            .detach(move || native.allocate_owned(size, &stream))
            .map_err(|e| allocation_error(slf, e))?;
        PyBuffer::wrap(py, buffer, mr(), this.managed, Kept::default())
    }

    /// Frees ``size`` bytes at ``ptr``, which this resource allocated, ordered on ``stream``
    /// (keyword-only), as the resource's own buffers are freed; raises on failure
    /// (:class:`CUDAError`). The pointer is taken on the caller's word, as in cuda.core: it must
    /// be memory no live :class:`Buffer` owns (what ``Buffer.from_handle(..., mr=...)`` hands
    /// back at teardown, say). A buffer's own memory is freed by its ``close()`` or drop, and a
    /// ``deallocate`` of it as well is a double free (for a :class:`CachingMemoryResource`, a
    /// block it then lends out again while freed). ``TypeError`` for a missing, ``None`` or non-stream ``stream`` or one
    /// passed by position (it is keyword-only); ``RuntimeError`` for a closed stream. The base
    /// class raises ``TypeError``.
    #[pyo3(
        signature = (ptr, size, *extra, stream = None),
        text_signature = "($self, ptr, size, *, stream)"
    )]
    fn deallocate(
        slf: &Bound<'_, Self>,
        py: Python<'_>,
        ptr: CUdeviceptr,
        size: &Bound<'_, PyAny>,
        extra: &Bound<'_, PyTuple>,
        stream: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let size = size_argument("size", size)?;
        refuse_positional_stream(slf.as_any(), "deallocate", &["ptr", "size"], extra)?;
        let native = Arc::clone(native_of(slf, "deallocate")?);
        let stream = accept_stream(&required_stream(stream)?)?;
        py.detach(move || native.deallocate(owned_allocation(ptr, size), &stream))
            .map_err(Error::from)?;
        Ok(())
    }

    /// Whether a device can access the memory. The base class raises ``TypeError``.
    #[getter]
    fn is_device_accessible(slf: &Bound<'_, Self>) -> PyResult<bool> {
        Ok(native_of(slf, "is_device_accessible")?.is_device_accessible())
    }

    /// Whether the host can access the memory. The base class raises ``TypeError``.
    #[getter]
    fn is_host_accessible(slf: &Bound<'_, Self>) -> PyResult<bool> {
        Ok(native_of(slf, "is_host_accessible")?.is_host_accessible())
    }

    /// The device the memory belongs to; -1 for memory bound to no device. The base class raises
    /// ``TypeError``.
    #[getter]
    fn device_id(slf: &Bound<'_, Self>) -> PyResult<i32> {
        Ok(native_of(slf, "device_id")?.device_id().unwrap_or(-1))
    }

    /// Whether the memory is managed (False for the base class).
    #[getter]
    fn is_managed(&self) -> bool {
        self.native.as_ref().is_some_and(|mr| mr.is_managed())
    }
}

/// The class name the user called a method on (`DeviceMemoryResource`, a Python subclass).
fn type_name(object: &Bound<'_, PyAny>) -> String {
    class_name(object)
}

/// An allocation's error, with the capture-state errors in cuda.core's words, naming the class
/// called.
pub(super) fn allocation_error(mr: &Bound<'_, PyMemoryResource>, error: MemoryError) -> PyErr {
    if pool_of(mr.as_any()).is_some_and(|pool| pool.is_mapped()) {
        return PyTypeError::new_err("Cannot allocate from a mapped IPC-enabled memory resource");
    }
    match error {
        MemoryError::StreamCapturing => pyo3::exceptions::PyRuntimeError::new_err(format!(
            "{} cannot perform memory operations on a capturing stream (consider using \
             GraphMemoryResource).",
            type_name(mr.as_any())
        )),
        MemoryError::NotCapturing => pyo3::exceptions::PyRuntimeError::new_err(format!(
            "{} cannot perform memory operations on a non-capturing stream. Allocate from a \
             graph memory resource only while a stream is being captured.",
            type_name(mr.as_any())
        )),
        other => Error::from(other).into(),
    }
}

/// `MemoryResource.allocate`'s arguments `(size, *, stream)` as pyo3 collected them, with
/// CPython's messages naming the class called, after the refusal at exit
/// ([`refuse_allocation_at_exit`]). A missing or `None` stream is `None` when `mr` allocates
/// synchronously (`stream_optional`), and refused otherwise.
pub(super) fn allocate_arguments<'py>(
    mr: &Bound<'py, PyMemoryResource>,
    size: &Bound<'py, PyAny>,
    extra: &Bound<'py, PyTuple>,
    stream: Option<&Bound<'py, PyAny>>,
) -> PyResult<(usize, Option<Bound<'py, PyAny>>)> {
    refuse_allocation_at_exit(mr.as_any())?;
    let name = || format!("{}.allocate()", type_name(mr.as_any()));
    refuse_positional_stream(mr.as_any(), "allocate", &["size"], extra)?;
    let stream = stream.filter(|s| !s.is_none()).cloned();
    if stream.is_none() && !mr.get().stream_optional {
        return Err(PyTypeError::new_err(format!(
            "{} missing 1 required keyword argument: 'stream' (stream is required and must \
             not be None: pass a Stream explicitly, e.g. Device().create_stream() or \
             custody.default_stream())",
            name()
        )));
    }
    let size = size_argument("size", size)?;
    Ok((size, stream))
}
