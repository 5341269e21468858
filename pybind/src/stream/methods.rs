//! `Stream`'s methods (its struct, which the other families name, is in `class`): made,
//! wrapped from another library, or one of the default-stream singletons; recording and
//! waiting for events; the graph builder that captures it. Also the streams `Device` creates.

use std::sync::{Mutex, OnceLock, Weak};

use handles::{ContextHandle, DefaultStream, EventFlags, EventHandle, StreamFlags, StreamHandle};
use pyo3::exceptions::{PyRuntimeError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::pyclass::{CompareOp, PyTraverseError, PyVisit};
use pyo3::types::{PyDict, PyTuple, PyType};

use super::accept::{accept_stream, per_thread_selected, stream_from_handle, wrap_protocol};
use super::class::PyStream;
use super::context::PyContext;
use super::device::device_object;
use super::event::{event_flags, PyEvent};
use crate::errors::{expected, Error, NO_CONTEXT};
use crate::graph::class::{builder_on, PyGraphBuilder};
use crate::identity::{compare_handles, hash_of};
use crate::options::{check_options, option};
use crate::report::{release, PyObjRef};
use crate::sync::Locked;

/// What a `Stream` (or a Python subclass of it) is made from: the only argument its constructor
/// accepts. Made by custody only (`Stream._init`, `_legacy_default`, `_per_thread_default`).
#[pyclass(frozen, name = "_StreamInit", module = "custody._custody")]
pub struct PyStreamInit {
    handle: Mutex<Option<StreamHandle>>,
    protocol: Option<Weak<PyObjRef>>,
}

impl PyStream {
    /// A stream object for `handle`, which keeps the `__cuda_stream__` object `protocol` sees.
    fn with_protocol(handle: StreamHandle, protocol: Option<Weak<PyObjRef>>) -> PyStream {
        PyStream {
            protocol,
            ..PyStream::new(handle)
        }
    }

    /// The stream's context: its own, or for an unbound token the one current now.
    fn context_handle(py: Python<'_>, stream: &StreamHandle) -> PyResult<ContextHandle> {
        match stream.context() {
            Some(context) => Ok(context.clone()),
            None => py
                .detach(ContextHandle::current)
                .map_err(Error::from)?
                .ok_or_else(|| PyRuntimeError::new_err(NO_CONTEXT)),
        }
    }

    fn is_open(&self) -> bool {
        self.handle.locked().is_some()
    }
}

/// A `Stream` object of class `cls` (the `Stream` class itself when `None`) for `handle`
/// (which keeps the `__cuda_stream__` object `protocol` sees, if any).
fn stream_of_class<'py>(
    py: Python<'py>,
    cls: Option<&Bound<'py, PyType>>,
    handle: StreamHandle,
    protocol: Option<Weak<PyObjRef>>,
) -> PyResult<Bound<'py, PyAny>> {
    match cls {
        Some(cls) if !cls.is(py.get_type::<PyStream>()) => {
            let init = Bound::new(
                py,
                PyStreamInit {
                    handle: Mutex::new(Some(handle)),
                    protocol,
                },
            )?;
            crate::ffi::call(cls.as_any(), (init,), None)
        }
        _ => Ok(Bound::new(py, PyStream::with_protocol(handle, protocol))?.into_any()),
    }
}

#[pymethods]
impl PyStream {
    #[new]
    #[pyo3(signature = (*args, **_kwargs), text_signature = None)]
    fn py_new(args: &Bound<'_, PyTuple>, _kwargs: Option<&Bound<'_, PyDict>>) -> PyResult<Self> {
        if args.len() == 1 {
            if let Ok(init) = args.get_item(0)?.cast::<PyStreamInit>() {
                let handle = init.get().handle.locked().take();
                if let Some(handle) = handle {
                    return Ok(PyStream::with_protocol(handle, init.get().protocol.clone()));
                }
            }
        }
        Err(PyRuntimeError::new_err(
            "Stream objects cannot be instantiated directly. Use Device.create_stream(), \
             Stream.from_handle() or custody.default_stream().",
        ))
    }

    /// A stream of this class: a wrapper of ``obj`` (an object with ``__cuda_stream__``;
    /// ``TypeError`` otherwise) if given, else a new stream made with ``options`` in ``ctx``, in
    /// device ``device_id``'s primary context, or in the current context (``RuntimeError`` when
    /// none is). :class:`CUDAError` when the driver refuses.
    #[classmethod]
    #[pyo3(signature = (obj = None, options = None, device_id = None, ctx = None))]
    fn _init<'py>(
        cls: &Bound<'py, PyType>,
        obj: Option<&Bound<'py, PyAny>>,
        options: Option<&Bound<'py, PyAny>>,
        device_id: Option<i32>,
        ctx: Option<&Bound<'py, PyContext>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let py = cls.py();
        let (handle, protocol) = match obj.filter(|o| !o.is_none()) {
            Some(obj) => {
                if !crate::ffi::hasattr(obj, "__cuda_stream__")? {
                    return Err(expected("an object with __cuda_stream__", obj));
                }
                let (handle, protocol) = wrap_protocol(obj)?;
                (handle, Some(protocol))
            }
            None => {
                let context = match (ctx, device_id) {
                    (Some(ctx), _) => ctx.get().handle.clone(),
                    (None, Some(id)) => py
                        .detach(|| ContextHandle::primary(id))
                        .map_err(Error::from)?,
                    (None, None) => py
                        .detach(ContextHandle::current)
                        .map_err(Error::from)?
                        .ok_or_else(|| PyRuntimeError::new_err(NO_CONTEXT))?,
                };
                (create_stream_handle(py, &context, options)?, None)
            }
        };
        stream_of_class(py, Some(cls), handle, protocol)
    }

    /// The legacy default stream as an object of this class (``LEGACY_DEFAULT_STREAM``
    /// itself for ``Stream``).
    #[classmethod]
    fn _legacy_default<'py>(cls: &Bound<'py, PyType>) -> PyResult<Bound<'py, PyAny>> {
        default_of_class(cls, DefaultStream::Legacy)
    }

    /// The per-thread default stream as an object of this class
    /// (``PER_THREAD_DEFAULT_STREAM`` itself for ``Stream``).
    #[classmethod]
    fn _per_thread_default<'py>(cls: &Bound<'py, PyType>) -> PyResult<Bound<'py, PyAny>> {
        default_of_class(cls, DefaultStream::PerThread)
    }

    /// Wraps a stream made elsewhere: an int handle, or an object with ``__cuda_stream__``.
    ///
    /// The token values 0, 0x1, 0x2 give the default-stream tokens; a stream custody created
    /// gives that stream back. ``TypeError`` for None or a non-int; ``OverflowError`` for a
    /// negative int; :class:`CUDAError` when the driver rejects the handle.
    ///
    /// custody cannot keep a stream wrapped from an ``int`` alive: while a buffer's free is
    /// recorded on it (``allocate``, ``set_deallocation_stream``) or a use declared
    /// (``record_use``), its owner must not destroy it (a destroyed stream is undefined in the
    /// driver; a free on one ends the process on a GPU). An object with ``__cuda_stream__`` is
    /// kept alive.
    #[staticmethod]
    fn from_handle(py: Python<'_>, handle: &Bound<'_, PyAny>) -> PyResult<Py<PyStream>> {
        let (stream, protocol) = stream_from_handle(py, handle)?;
        Py::new(py, PyStream::with_protocol(stream, protocol))
    }

    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        let Some(protocol) = &self.protocol else {
            return Ok(());
        };
        let Ok(handle) = self.handle.try_lock() else {
            return Ok(());
        };
        // Only while this object holds the handle alone is its reference this object's.
        if handle.as_ref().is_some_and(|h| h.handle_count() == 1) {
            if let Some(object) = protocol.upgrade() {
                visit.call(object.get())?;
            }
        }
        Ok(())
    }

    /// Breaks a garbage cycle: releases the handle (and with it the object it keeps).
    fn __clear__(&self, py: Python<'_>) {
        let taken = self.handle.locked().take();
        if let Some(stream) = taken {
            release(py, move || drop(stream));
        }
    }

    /// ``(0, handle)``: the CUDA stream protocol (``RuntimeError`` once closed).
    fn __cuda_stream__(&self) -> PyResult<(i32, usize)> {
        Ok((0, self.handle()?.raw() as usize))
    }

    /// The raw ``CUstream`` as an int (0x1 / 0x2 for the default-stream tokens); ``RuntimeError``
    /// once closed. cuda.core returns a ``cuda.bindings`` ``CUstream`` here; an int works wherever
    /// that does through ``int(stream.handle)``, and cuda.bindings' functions take it as it is.
    #[getter(handle)]
    fn handle_(&self) -> PyResult<usize> {
        Ok(self.handle()?.raw() as usize)
    }

    /// Whether ``close()`` was called.
    #[getter]
    fn is_closed(&self) -> bool {
        !self.is_open()
    }

    /// Whether the stream does not synchronise with the legacy default stream
    /// (``cuStreamGetFlags``); ``RuntimeError`` once closed.
    #[getter]
    fn is_nonblocking(&self, py: Python<'_>) -> PyResult<bool> {
        let stream = self.handle()?;
        let flags = py.detach(|| stream.flags()).map_err(Error::from)?;
        Ok(flags.contains(StreamFlags::NON_BLOCKING))
    }

    /// The stream's priority, lower numbers first (``cuStreamGetPriority``); ``RuntimeError`` once
    /// closed.
    #[getter]
    fn priority(&self, py: Python<'_>) -> PyResult<i32> {
        let stream = self.handle()?;
        Ok(py.detach(|| stream.priority()).map_err(Error::from)?)
    }

    /// Records ``event`` (a new one made with ``options``, an :class:`EventOptions` or a dict, in
    /// the stream's context if omitted) on the stream and returns it: the event completes when the
    /// work queued on the stream so far has. Does not block. An IPC-enabled event is recorded
    /// once, when made. ``TypeError`` for an ``event`` that is not an :class:`Event`, an
    /// IPC-enabled one, or bad options; ``RuntimeError`` for a closed stream or event, or a
    /// default stream with no current context; :class:`CUDAError` on a driver failure.
    #[pyo3(signature = (event = None, options = None))]
    fn record(
        &self,
        py: Python<'_>,
        event: Option<&Bound<'_, PyAny>>,
        options: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Py<PyEvent>> {
        let stream = self.handle()?;
        let event = match event.filter(|e| !e.is_none()) {
            Some(event) => {
                let event = event
                    .cast::<PyEvent>()
                    .map_err(|_| expected("Event", event))?;
                if event.get().is_ipc_enabled() {
                    // Another process may be waiting on it: its records belong to it.
                    return Err(PyTypeError::new_err(
                        "IPC-enabled events should not be re-recorded, instead create a new \
                         event by supplying options.",
                    ));
                }
                event.clone().unbind()
            }
            None => {
                let flags = event_flags(options)?;
                let context = PyStream::context_handle(py, &stream)?;
                Py::new(py, PyEvent::create(py, &context, flags)?)?
            }
        };
        let handle = event.get().handle()?;
        py.detach(|| handle.record(&stream)).map_err(Error::from)?;
        Ok(event)
    }

    /// Makes future work on this stream wait for an event, or for the work queued so far on another
    /// stream (through an event recorded there now). Does not block the host. ``TypeError`` for
    /// None, ``ValueError`` for anything else that is not an event or a stream; ``RuntimeError``
    /// for a closed stream or event, or a default stream with no current context;
    /// :class:`CUDAError` on a driver failure.
    fn wait(&self, py: Python<'_>, event_or_stream: &Bound<'_, PyAny>) -> PyResult<()> {
        let stream = self.handle()?;
        let event = if let Ok(event) = event_or_stream.cast::<PyEvent>() {
            event.get().handle()?
        } else if event_or_stream.is_none() {
            return Err(PyTypeError::new_err(
                "an Event or a Stream is required, got None",
            ));
        } else {
            let other = accept_stream(event_or_stream).map_err(|error| {
                if error.is_instance_of::<PyTypeError>(py) {
                    let name = event_or_stream
                        .get_type()
                        .name()
                        .map(|n| n.to_string())
                        .unwrap_or_default();
                    PyValueError::new_err(format!(
                        "only an Event, a Stream or an object with __cuda_stream__ can be \
                         waited on, got {name}"
                    ))
                } else {
                    error
                }
            })?;
            let context = PyStream::context_handle(py, &other)?;
            py.detach(|| {
                let event = EventHandle::create(&context, EventFlags::DISABLE_TIMING)?;
                event.record(&other)?;
                Ok::<_, handles::HandleError>(event)
            })
            .map_err(Error::from)?
        };
        py.detach(|| stream.wait_event(&event))
            .map_err(Error::from)?;
        Ok(())
    }

    /// Blocks the calling thread (the GIL released) until all work queued on the stream has
    /// finished. ``RuntimeError`` once closed; :class:`CUDAError` on a driver failure.
    fn sync(&self, py: Python<'_>) -> PyResult<()> {
        let stream = self.handle()?;
        py.detach(|| stream.synchronize()).map_err(Error::from)?;
        Ok(())
    }

    /// Releases this object's reference to the stream; a created stream is destroyed once no
    /// pending free recorded on it needs it. A no-op for the default-stream singletons and for a
    /// closed stream. :class:`CUDAError` when destroying the stream fails (it is closed either
    /// way).
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        if self.singleton {
            return Ok(());
        }
        let taken = self.handle.locked().take();
        if let Some(stream) = taken {
            py.detach(|| stream.close()).map_err(Error::from)?;
        }
        Ok(())
    }

    /// The stream's context; for a default-stream token, the context current now. ``RuntimeError``
    /// once closed, or for a token when no context is current.
    #[getter]
    fn context(&self, py: Python<'_>) -> PyResult<PyContext> {
        let stream = self.handle()?;
        Ok(PyContext {
            handle: PyStream::context_handle(py, &stream)?,
        })
    }

    /// The device of the stream's context (``RuntimeError`` as for :attr:`context`).
    #[getter]
    fn device<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let device = self.context(py)?.handle.device();
        device_object(py, device)
    }

    /// A :class:`GraphBuilder` that captures this stream (``RuntimeError`` once closed).
    fn create_graph_builder(slf: &Bound<'_, Self>, py: Python<'_>) -> PyResult<PyGraphBuilder> {
        let stream = slf.get().handle()?;
        builder_on(py, stream, slf.clone().unbind())
    }

    fn __richcmp__(&self, other: &Bound<'_, PyAny>, op: CompareOp) -> PyResult<Py<PyAny>> {
        compare_handles(self, other, op, |this| this.is_open().then_some(this.raw))
    }

    fn __hash__(&self) -> u64 {
        hash_of("Stream", self.raw as u64)
    }

    fn __repr__(&self, py: Python<'_>) -> String {
        let stream = self.handle.locked().clone();
        match stream {
            Some(stream) => {
                let context = match stream.context() {
                    Some(context) => Some(context.raw() as usize),
                    None => py
                        .detach(ContextHandle::current)
                        .ok()
                        .flatten()
                        .map(|c| c.raw() as usize),
                };
                match context {
                    Some(context) => format!(
                        "<Stream handle=0x{:x} context=0x{context:x}>",
                        stream.raw() as usize
                    ),
                    None => format!("<Stream handle=0x{:x} context=None>", stream.raw() as usize),
                }
            }
            None => "<Stream closed>".to_owned(),
        }
    }
}

static LEGACY: OnceLock<Py<PyStream>> = OnceLock::new();

static PER_THREAD: OnceLock<Py<PyStream>> = OnceLock::new();

/// The default stream `kind` as an object of class `cls`: the singleton itself for `Stream`.
fn default_of_class<'py>(
    cls: &Bound<'py, PyType>,
    kind: DefaultStream,
) -> PyResult<Bound<'py, PyAny>> {
    let py = cls.py();
    if cls.is(py.get_type::<PyStream>()) {
        return Ok(singleton(py, kind)?.bind(py).clone().into_any());
    }
    stream_of_class(py, Some(cls), default_handle(kind), None)
}

/// A new handle of the default-stream token `kind`.
fn default_handle(kind: DefaultStream) -> StreamHandle {
    match kind {
        DefaultStream::PerThread => StreamHandle::per_thread(),
        _ => StreamHandle::legacy(),
    }
}

/// The default-stream singletons (`LEGACY_DEFAULT_STREAM`, `PER_THREAD_DEFAULT_STREAM`).
pub(crate) fn singleton(py: Python<'_>, kind: DefaultStream) -> PyResult<&'static Py<PyStream>> {
    let (cell, handle) = match kind {
        DefaultStream::PerThread => (&PER_THREAD, StreamHandle::per_thread()),
        _ => (&LEGACY, StreamHandle::legacy()),
    };
    if let Some(stream) = cell.get() {
        return Ok(stream);
    }
    let stream = Py::new(
        py,
        PyStream {
            raw: handle.raw() as usize,
            handle: Mutex::new(Some(handle)),
            protocol: None,
            singleton: true,
        },
    )?;
    Ok(cell.get_or_init(|| stream))
}

/// ``PER_THREAD_DEFAULT_STREAM`` when ``CUDA_PYTHON_CUDA_PER_THREAD_DEFAULT_STREAM`` is a
/// non-zero integer, else ``LEGACY_DEFAULT_STREAM``; the variable is read on every call.
#[pyfunction]
pub(crate) fn default_stream(py: Python<'_>) -> PyResult<Py<PyStream>> {
    let kind = if per_thread_selected() {
        DefaultStream::PerThread
    } else {
        DefaultStream::Legacy
    };
    Ok(singleton(py, kind)?.clone_ref(py))
}

/// A stream argument as a `Stream` object: a `Stream` as it is, anything else accepted as a
/// stream (a `GraphBuilder`, an object with `__cuda_stream__`) wrapped in a new one.
///
/// # Errors
/// As for any stream argument: `TypeError` for `None` ("stream is required and must not be
/// None") or a non-stream.
#[pyfunction]
#[pyo3(signature = (arg, allow_stream_protocol = false))]
pub(crate) fn _stream_accept<'py>(
    arg: &Bound<'py, PyAny>,
    allow_stream_protocol: bool,
) -> PyResult<Bound<'py, PyAny>> {
    let _ = allow_stream_protocol;
    if arg.cast::<PyStream>().is_ok() {
        return Ok(arg.clone());
    }
    let handle = accept_stream(arg)?;
    Ok(Bound::new(arg.py(), PyStream::new(handle))?.into_any())
}

/// A new stream in `context` made with `options` (`StreamOptions` or a dict: `nonblocking`,
/// default true; `priority`, default 0, `ValueError` outside the context's range).
fn create_stream_handle(
    py: Python<'_>,
    context: &ContextHandle,
    options: Option<&Bound<'_, PyAny>>,
) -> PyResult<StreamHandle> {
    let options = check_options(options, "StreamOptions", &["nonblocking", "priority"])?;
    let nonblocking: bool = option(options, "nonblocking", true)?;
    let priority: Option<i32> = option(options, "priority", None)?;
    let priority = match priority {
        None => 0,
        Some(priority) => {
            // The driver clamps a priority out of range; cuda.core refuses it.
            let (least, greatest) = py
                .detach(|| handles::stream_priority_range(context))
                .map_err(Error::from)?;
            if !(greatest..=least).contains(&priority) {
                return Err(PyValueError::new_err(format!(
                    "stream priority must be in [{greatest}, {least}] (lower runs first), got \
                     {priority}"
                )));
            }
            priority
        }
    };
    let flags = if nonblocking {
        StreamFlags::NON_BLOCKING
    } else {
        StreamFlags::DEFAULT
    };
    Ok(py
        .detach(|| StreamHandle::create(context, flags, priority))
        .map_err(Error::from)?)
}

/// A new stream in `context` (non-blocking unless `nonblocking` is false).
#[pyfunction]
#[pyo3(signature = (context, nonblocking = true, priority = 0))]
pub(crate) fn _create_stream(
    py: Python<'_>,
    context: &Bound<'_, PyContext>,
    nonblocking: bool,
    priority: i32,
) -> PyResult<PyStream> {
    let handle = context.get().handle.clone();
    let flags = if nonblocking {
        StreamFlags::NON_BLOCKING
    } else {
        StreamFlags::DEFAULT
    };
    let stream = py
        .detach(|| StreamHandle::create(&handle, flags, priority))
        .map_err(Error::from)?;
    Ok(PyStream::new(stream))
}
