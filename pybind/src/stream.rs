//! `Stream`, `Event` and `Context`, the default-stream singletons, how a stream argument is
//! accepted (a `Stream`, or any object with `__cuda_stream__`), and the device-level functions
//! the Python `Device` class is built on.

use std::sync::{Arc, Mutex, OnceLock, PoisonError, Weak};

use handles::{ContextHandle, DefaultStream, EventHandle, StreamHandle, EVENT_DISABLE_TIMING};
use pyo3::exceptions::{PyRuntimeError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::pyclass::{PyTraverseError, PyVisit};
use pyo3::types::PyTuple;

use crate::errors::{closed, expected, Error, NO_CONTEXT};
use crate::report::{release, PyObjRef};

/// `CU_STREAM_NON_BLOCKING`.
const STREAM_NON_BLOCKING: u32 = 0x1;

/// A CUDA stream: created (owned, destroyed once closed and no longer used by any pending free),
/// wrapped from another library, or a default-stream token.
///
/// A stream wrapped from an object with `__cuda_stream__` keeps that object (in its handle):
/// while this is the handle's only holder, the collector sees that reference, so an object
/// that keeps the `Stream` wrapping it is collected (docs/decisions.md D10).
#[pyclass(frozen, name = "Stream", module = "custody")]
pub struct PyStream {
    /// Cloned out (attached, briefly) by every use, so its count is stable while a collection
    /// runs. No Python object is made or dropped while the lock is held.
    handle: Mutex<Option<StreamHandle>>,
    /// The `__cuda_stream__` object the handle keeps, if any.
    protocol: Option<Weak<PyObjRef>>,
    /// The process-wide default-stream singletons cannot be closed.
    singleton: bool,
}

impl PyStream {
    pub(crate) fn new(handle: StreamHandle) -> PyStream {
        PyStream {
            handle: Mutex::new(Some(handle)),
            protocol: None,
            singleton: false,
        }
    }

    /// The stream handle; `RuntimeError` once closed.
    #[inline]
    pub(crate) fn handle(&self) -> PyResult<StreamHandle> {
        self.handle
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
            .ok_or_else(|| closed("Stream"))
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
}

/// Accepts a stream argument: a `Stream`, a `GraphBuilder` (its captured stream), or an object
/// with `__cuda_stream__` (wrapped, kept alive while the wrapper lives).
///
/// # Errors
/// `TypeError` for `None` or anything else; `RuntimeError` for a closed stream; what the
/// protocol object or the driver raises.
pub(crate) fn accept_stream(object: &Bound<'_, PyAny>) -> PyResult<StreamHandle> {
    if let Ok(stream) = object.cast::<PyStream>() {
        return stream.get().handle();
    }
    if let Ok(builder) = object.cast::<crate::graph::PyGraphBuilder>() {
        return builder.get().stream_handle();
    }
    if object.is_none() {
        return Err(PyTypeError::new_err(
            "a Stream is required, got None (pass a Stream explicitly, e.g. \
             Device().create_stream() or custody.default_stream())",
        ));
    }
    if object.hasattr("__cuda_stream__")? {
        return Ok(wrap_protocol(object)?.0);
    }
    Err(expected(
        "Stream (or an object with __cuda_stream__)",
        object,
    ))
}

/// Wraps an object implementing the `__cuda_stream__` protocol (`(version, handle)`); the
/// handle keeps the object, seen through the returned `Weak`.
fn wrap_protocol(object: &Bound<'_, PyAny>) -> PyResult<(StreamHandle, Weak<PyObjRef>)> {
    let info = object.call_method0("__cuda_stream__")?;
    let tuple = info.cast::<PyTuple>().map_err(|_| {
        PyTypeError::new_err("__cuda_stream__ must return a (version, handle) tuple")
    })?;
    if tuple.len() != 2 {
        return Err(PyTypeError::new_err(
            "__cuda_stream__ must return a (version, handle) tuple",
        ));
    }
    let version: i64 = tuple.get_item(0)?.extract()?;
    if version != 0 {
        return Err(PyValueError::new_err(format!(
            "__cuda_stream__ protocol version {version} is not supported (0 is)"
        )));
    }
    let raw: usize = tuple.get_item(1)?.extract()?;
    let owner = Arc::new(PyObjRef::new(object.clone().unbind()));
    let weak = Arc::downgrade(&owner);
    let stream = object
        .py()
        .detach(|| crate::ffi::wrap_foreign_stream(raw, Some(Box::new(owner))))
        .map_err(Error::from)?;
    // A stream custody made comes back as its own handle, and the owner is dropped: the weak
    // reference is dead then.
    Ok((stream, weak))
}

#[pymethods]
impl PyStream {
    #[new]
    #[pyo3(signature = (*_args, **_kwargs))]
    fn py_new(_args: &Bound<'_, PyTuple>, _kwargs: Option<&Bound<'_, PyAny>>) -> PyResult<Self> {
        Err(PyRuntimeError::new_err(
            "Stream objects cannot be instantiated directly: use Device.create_stream(), \
             Stream.from_handle() or custody.default_stream()",
        ))
    }

    /// Wraps a stream made elsewhere: an `int` handle, or an object with `__cuda_stream__`.
    #[staticmethod]
    fn from_handle(py: Python<'_>, handle: &Bound<'_, PyAny>) -> PyResult<Py<PyStream>> {
        if handle.is_none() {
            return Err(PyTypeError::new_err(
                "a stream handle (int) is required, got None",
            ));
        }
        let (stream, protocol) = if handle.hasattr("__cuda_stream__")? {
            let (stream, protocol) = wrap_protocol(handle)?;
            (stream, Some(protocol))
        } else {
            let raw: usize = handle.extract().map_err(|e: PyErr| {
                if e.is_instance_of::<pyo3::exceptions::PyOverflowError>(py) {
                    e
                } else {
                    expected("int stream handle", handle)
                }
            })?;
            let stream = py
                .detach(|| crate::ffi::wrap_foreign_stream(raw, None))
                .map_err(Error::from)?;
            (stream, None)
        };
        let stream = PyStream {
            protocol,
            ..PyStream::new(stream)
        };
        Py::new(py, stream)
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
        let taken = self
            .handle
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(stream) = taken {
            release(py, move || drop(stream));
        }
    }

    /// `(0, handle)`: the `__cuda_stream__` protocol.
    fn __cuda_stream__(&self) -> PyResult<(i32, usize)> {
        Ok((0, self.handle()?.raw() as usize))
    }

    /// The raw `CUstream` as an int (0x1 / 0x2 for the default-stream tokens).
    #[getter(handle)]
    fn handle_(&self) -> PyResult<usize> {
        Ok(self.handle()?.raw() as usize)
    }

    /// Whether `close()` was called.
    #[getter]
    fn is_closed(&self) -> bool {
        self.handle
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .is_none()
    }

    /// Records an event on the stream (a new one unless `event` is given) and returns it.
    #[pyo3(signature = (event = None, options = None))]
    fn record(
        &self,
        py: Python<'_>,
        event: Option<&Bound<'_, PyEvent>>,
        options: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Py<PyEvent>> {
        let _ = options;
        let stream = self.handle()?;
        let event = match event {
            Some(event) => event.clone().unbind(),
            None => {
                let context = PyStream::context_handle(py, &stream)?;
                let handle = py
                    .detach(|| EventHandle::create(&context, EVENT_DISABLE_TIMING))
                    .map_err(Error::from)?;
                Py::new(py, PyEvent::new(handle))?
            }
        };
        let handle = event.get().handle()?;
        py.detach(|| handle.record(&stream)).map_err(Error::from)?;
        Ok(event)
    }

    /// Makes future work on this stream wait for an event, or for the work queued so far on
    /// another stream. Does not block the host.
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
                    expected("Event or Stream", event_or_stream)
                } else {
                    error
                }
            })?;
            let context = PyStream::context_handle(py, &other)?;
            py.detach(|| {
                let event = EventHandle::create(&context, EVENT_DISABLE_TIMING)?;
                event.record(&other)?;
                Ok::<_, handles::HandleError>(event)
            })
            .map_err(Error::from)?
        };
        py.detach(|| stream.wait_event(&event))
            .map_err(Error::from)?;
        Ok(())
    }

    /// Blocks until all work queued on the stream has finished.
    fn sync(&self, py: Python<'_>) -> PyResult<()> {
        let stream = self.handle()?;
        py.detach(|| stream.synchronize()).map_err(Error::from)?;
        Ok(())
    }

    /// Releases this object's reference to the stream. A created stream is destroyed once no
    /// pending free is recorded on it any more. A no-op for the default-stream singletons and
    /// for a closed stream.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        if self.singleton {
            return Ok(());
        }
        let taken = self
            .handle
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(stream) = taken {
            py.detach(|| stream.close()).map_err(Error::from)?;
        }
        Ok(())
    }

    /// The stream's context (for a default-stream token, the context current now).
    #[getter]
    fn context(&self, py: Python<'_>) -> PyResult<PyContext> {
        let stream = self.handle()?;
        Ok(PyContext {
            handle: PyStream::context_handle(py, &stream)?,
        })
    }

    /// The `Device` the stream's context belongs to.
    #[getter]
    fn device<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let device = self.context(py)?.handle.device();
        py.import("custody")?.getattr("Device")?.call1((device,))
    }

    fn __repr__(&self) -> String {
        match self
            .handle
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .as_ref()
        {
            Some(stream) => format!("<Stream handle=0x{:x}>", stream.raw() as usize),
            None => "<Stream closed>".to_owned(),
        }
    }
}

/// A CUDA event.
#[pyclass(frozen, name = "Event", module = "custody")]
pub struct PyEvent {
    handle: Mutex<Option<EventHandle>>,
}

impl PyEvent {
    fn new(handle: EventHandle) -> PyEvent {
        PyEvent {
            handle: Mutex::new(Some(handle)),
        }
    }

    fn handle(&self) -> PyResult<EventHandle> {
        self.handle
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
            .ok_or_else(|| closed("Event"))
    }
}

#[pymethods]
impl PyEvent {
    #[new]
    #[pyo3(signature = (*_args, **_kwargs))]
    fn py_new(_args: &Bound<'_, PyTuple>, _kwargs: Option<&Bound<'_, PyAny>>) -> PyResult<Self> {
        Err(PyRuntimeError::new_err(
            "Event objects cannot be instantiated directly: use Stream.record()",
        ))
    }

    /// Blocks until the recorded work has finished.
    fn sync(&self, py: Python<'_>) -> PyResult<()> {
        let event = self.handle()?;
        py.detach(|| event.synchronize()).map_err(Error::from)?;
        Ok(())
    }

    /// Whether the recorded work has finished (does not block).
    #[getter]
    fn is_done(&self, py: Python<'_>) -> PyResult<bool> {
        let event = self.handle()?;
        Ok(py.detach(|| event.query()).map_err(Error::from)?)
    }

    /// The raw `CUevent` as an int.
    #[getter(handle)]
    fn handle_(&self) -> PyResult<usize> {
        Ok(self.handle()?.raw() as usize)
    }

    /// The event's context.
    #[getter]
    fn context(&self) -> PyResult<PyContext> {
        Ok(PyContext {
            handle: self.handle()?.context().clone(),
        })
    }

    /// Releases the event (destroyed when no other reference holds it). Idempotent.
    fn close(&self, py: Python<'_>) {
        let taken = self
            .handle
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        py.detach(move || drop(taken));
    }

    fn __repr__(&self) -> String {
        match self
            .handle
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .as_ref()
        {
            Some(event) => format!("<Event handle=0x{:x}>", event.raw() as usize),
            None => "<Event closed>".to_owned(),
        }
    }
}

/// A CUDA context (a device's primary context, retained while this object lives, or a context
/// made elsewhere).
#[pyclass(frozen, name = "Context", module = "custody", eq, hash)]
pub struct PyContext {
    pub(crate) handle: ContextHandle,
}

impl PartialEq for PyContext {
    fn eq(&self, other: &Self) -> bool {
        self.handle == other.handle
    }
}

impl std::hash::Hash for PyContext {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        (self.handle.raw() as usize).hash(state);
    }
}

#[pymethods]
impl PyContext {
    /// The raw `CUcontext` as an int.
    #[getter]
    fn handle(&self) -> usize {
        self.handle.raw() as usize
    }

    /// The device ordinal the context belongs to.
    #[getter]
    fn device_id(&self) -> i32 {
        self.handle.device()
    }

    fn __repr__(&self) -> String {
        format!(
            "<Context handle=0x{:x} device_id={}>",
            self.handle.raw() as usize,
            self.handle.device()
        )
    }
}

static LEGACY: OnceLock<Py<PyStream>> = OnceLock::new();
static PER_THREAD: OnceLock<Py<PyStream>> = OnceLock::new();

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
            handle: Mutex::new(Some(handle)),
            protocol: None,
            singleton: true,
        },
    )?;
    Ok(cell.get_or_init(|| stream))
}

/// Whether `CUDA_PYTHON_CUDA_PER_THREAD_DEFAULT_STREAM` selects the per-thread default stream:
/// its value read as C's `strtol` would (leading blanks, a sign, digits; "123foo" is 123) is not
/// zero. Read on every call.
pub(crate) fn per_thread_selected() -> bool {
    let Ok(value) = std::env::var("CUDA_PYTHON_CUDA_PER_THREAD_DEFAULT_STREAM") else {
        return false;
    };
    let text = value.trim_start();
    let digits = text.strip_prefix(['+', '-']).unwrap_or(text);
    digits
        .chars()
        .take_while(char::is_ascii_digit)
        .any(|c| c != '0')
}

/// The default stream as a handle (for `Buffer.from_handle` without `stream`).
pub(crate) fn default_stream_handle() -> StreamHandle {
    if per_thread_selected() {
        StreamHandle::per_thread()
    } else {
        StreamHandle::legacy()
    }
}

/// `PER_THREAD_DEFAULT_STREAM` if the environment variable
/// `CUDA_PYTHON_CUDA_PER_THREAD_DEFAULT_STREAM` is set to a non-zero integer, else
/// `LEGACY_DEFAULT_STREAM`. Read on every call.
#[pyfunction]
pub(crate) fn default_stream(py: Python<'_>) -> PyResult<Py<PyStream>> {
    let kind = if per_thread_selected() {
        DefaultStream::PerThread
    } else {
        DefaultStream::Legacy
    };
    Ok(singleton(py, kind)?.clone_ref(py))
}

/// How many devices the driver sees.
#[pyfunction]
pub(crate) fn _device_count(py: Python<'_>) -> PyResult<i32> {
    Ok(py.detach(handles::device_count).map_err(Error::from)?)
}

/// Device `device_id`'s primary context, retained while the returned object lives.
#[pyfunction]
pub(crate) fn _primary_context(py: Python<'_>, device_id: i32) -> PyResult<PyContext> {
    let handle = py
        .detach(|| ContextHandle::primary(device_id))
        .map_err(Error::from)?;
    Ok(PyContext { handle })
}

/// Binds `context` to the calling thread (replacing the top of its context stack).
#[pyfunction]
pub(crate) fn _set_current(py: Python<'_>, context: &Bound<'_, PyContext>) -> PyResult<()> {
    let handle = context.get().handle.clone();
    py.detach(|| handle.make_current()).map_err(Error::from)?;
    Ok(())
}

/// The context current on the calling thread, or `None`.
#[pyfunction]
pub(crate) fn _current_context(py: Python<'_>) -> PyResult<Option<PyContext>> {
    let current = py.detach(ContextHandle::current).map_err(Error::from)?;
    Ok(current.map(|handle| PyContext { handle }))
}

/// Blocks until all work in `context` has finished.
#[pyfunction]
pub(crate) fn _synchronize_context(py: Python<'_>, context: &Bound<'_, PyContext>) -> PyResult<()> {
    let handle = context.get().handle.clone();
    py.detach(|| handle.synchronize()).map_err(Error::from)?;
    Ok(())
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
    let flags = if nonblocking { STREAM_NON_BLOCKING } else { 0 };
    let stream = py
        .detach(|| StreamHandle::create(&handle, flags, priority))
        .map_err(Error::from)?;
    Ok(PyStream::new(stream))
}

/// Registers the stream classes and functions on the module.
pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add_class::<PyStream>()?;
    m.add_class::<PyEvent>()?;
    m.add_class::<PyContext>()?;
    m.add(
        "LEGACY_DEFAULT_STREAM",
        singleton(py, DefaultStream::Legacy)?.clone_ref(py),
    )?;
    m.add(
        "PER_THREAD_DEFAULT_STREAM",
        singleton(py, DefaultStream::PerThread)?.clone_ref(py),
    )?;
    m.add_function(wrap_pyfunction!(default_stream, m)?)?;
    m.add_function(wrap_pyfunction!(_device_count, m)?)?;
    m.add_function(wrap_pyfunction!(_primary_context, m)?)?;
    m.add_function(wrap_pyfunction!(_set_current, m)?)?;
    m.add_function(wrap_pyfunction!(_current_context, m)?)?;
    m.add_function(wrap_pyfunction!(_synchronize_context, m)?)?;
    m.add_function(wrap_pyfunction!(_create_stream, m)?)?;
    Ok(())
}
