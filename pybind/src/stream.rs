//! `Stream`, `Event` and `Context`, the default-stream singletons, how a stream argument is
//! accepted (a `Stream`, or any object with `__cuda_stream__`), and the device-level functions
//! the Python `Device` class is built on.
//!
//! The object protocols follow cuda.core 1.2: streams, events and contexts are weak-referenceable,
//! compare equal when they wrap the same driver handle and hash by it; `Stream` can be
//! subclassed in Python (`MyStream._init(...)`, `MyStream._legacy_default()`).
//!
//! `Stream`'s struct, which the other families name, is in `classes`; its methods are here.

use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::sync::{Arc, Mutex, OnceLock, PoisonError, Weak};

use handles::{ContextHandle, DefaultStream, EventFlags, EventHandle, StreamFlags, StreamHandle};
use pyo3::exceptions::{PyRuntimeError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::pyclass::{CompareOp, PyTraverseError, PyVisit};
use pyo3::types::{PyDict, PyTuple, PyType};

use crate::classes::{builder_on, PyGraphBuilder, PyStream};
use crate::errors::{closed, expected, Error, NO_CONTEXT};
use crate::options::{check_options, option};
use crate::report::{release, PyObjRef};

// The `CU_EVENT_*` bits as the plain word a `PyEvent` keeps (and `EventOptions` builds).
/// `CU_EVENT_BLOCKING_SYNC`.
pub(crate) const EVENT_BLOCKING_SYNC: u32 = EventFlags::BLOCKING_SYNC.bits();
/// `CU_EVENT_DISABLE_TIMING`.
pub(crate) const EVENT_DISABLE_TIMING: u32 = EventFlags::DISABLE_TIMING.bits();
/// `CU_EVENT_INTERPROCESS`.
pub(crate) const EVENT_INTERPROCESS: u32 = EventFlags::INTERPROCESS.bits();

/// A hash of `(kind, raw)`: objects of different kinds that wrap equal raw values hash apart.
pub(crate) fn hash_of(kind: &str, raw: u64) -> u64 {
    let mut hasher = DefaultHasher::new();
    kind.hash(&mut hasher);
    raw.hash(&mut hasher);
    hasher.finish()
}

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
        self.handle
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .is_some()
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
    if let Ok(builder) = object.cast::<PyGraphBuilder>() {
        return builder.get().stream_handle();
    }
    if object.is_none() {
        return Err(stream_required());
    }
    if crate::ffi::hasattr(object, "__cuda_stream__")? {
        return Ok(wrap_protocol(object)?.0);
    }
    Err(expected(
        "Stream (or an object with __cuda_stream__)",
        object,
    ))
}

/// The `TypeError` for a missing or `None` stream where one is required.
pub(crate) fn stream_required() -> PyErr {
    PyTypeError::new_err(
        "stream is required and must not be None: pass a Stream explicitly, e.g. \
         Device().create_stream() or custody.default_stream()",
    )
}

/// A keyword-only `stream` that a method's signature lets default to `None`, so that one passed
/// by position reaches the method (and gets [`stream_is_keyword_only`]'s message, after
/// `extra` collected it) instead of pyo3's: `None` here, given or missing, is refused as
/// [`accept_stream`] refuses it.
///
/// [`stream_is_keyword_only`]: crate::errors::stream_is_keyword_only
pub(crate) fn required_stream<'py>(
    stream: Option<&Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyAny>> {
    match stream {
        Some(stream) if !stream.is_none() => Ok(stream.clone()),
        _ => Err(stream_required()),
    }
}

/// Runs `f` with a stream argument's handle borrowed, for an operation that makes no driver
/// call and runs no Python code: a `Stream`'s handle under its lock, neither cloned nor
/// released (two atomic operations fewer than [`accept_stream`]); anything else accepted as
/// [`accept_stream`] does. `f` must not release the GIL: a `close()` of the stream on another
/// thread waits for the lock while attached.
///
/// # Errors
/// As [`accept_stream`].
pub(crate) fn with_stream<R>(
    object: &Bound<'_, PyAny>,
    f: impl FnOnce(&StreamHandle) -> R,
) -> PyResult<R> {
    if let Ok(stream) = object.cast::<PyStream>() {
        let guard = stream
            .get()
            .handle
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        return match guard.as_ref() {
            Some(handle) => Ok(f(handle)),
            None => {
                drop(guard);
                Err(closed("Stream"))
            }
        };
    }
    let handle = accept_stream(object)?;
    Ok(f(&handle))
}

/// Wraps an object implementing the `__cuda_stream__` protocol (`(version, handle)`); the
/// handle keeps the object, seen through the returned `Weak`.
fn wrap_protocol(object: &Bound<'_, PyAny>) -> PyResult<(StreamHandle, Weak<PyObjRef>)> {
    let info = crate::ffi::call_method(object, "__cuda_stream__", (), None)?;
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

/// Wraps a stream given as an `int` handle or an object with `__cuda_stream__` (then also the
/// `Weak` through which the handle's reference to it is seen).
fn stream_from_handle(
    py: Python<'_>,
    handle: &Bound<'_, PyAny>,
) -> PyResult<(StreamHandle, Option<Weak<PyObjRef>>)> {
    if handle.is_none() {
        return Err(PyTypeError::new_err(
            "a stream handle (int) is required, got None",
        ));
    }
    if crate::ffi::hasattr(handle, "__cuda_stream__")? {
        let (stream, protocol) = wrap_protocol(handle)?;
        return Ok((stream, Some(protocol)));
    }
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
    Ok((stream, None))
}

/// Reads option `name` (a bool) from an options dataclass or a dict; `None` reads as `false`.
fn bool_option(options: Option<&Bound<'_, PyAny>>, name: &str) -> PyResult<bool> {
    option(options, name, false)
}

/// The `CU_EVENT_*` flags for `EventOptions` (`timing_enabled`, `blocking_sync`,
/// `ipc_enabled`; a dataclass or a dict; `None` for the defaults).
///
/// # Errors
/// `TypeError` when `ipc_enabled` and `timing_enabled` are both set (the driver does not time
/// interprocess events) or an option has the wrong type.
pub(crate) fn event_flags(options: Option<&Bound<'_, PyAny>>) -> PyResult<u32> {
    let options = check_options(
        options,
        "EventOptions",
        &["timing_enabled", "blocking_sync", "ipc_enabled"],
    )?;
    let timing = bool_option(options, "timing_enabled")?;
    let blocking = bool_option(options, "blocking_sync")?;
    let ipc = bool_option(options, "ipc_enabled")?;
    if ipc && timing {
        return Err(PyTypeError::new_err(
            "IPC-enabled events cannot use timing.",
        ));
    }
    let mut flags = 0;
    if !timing {
        flags |= EVENT_DISABLE_TIMING;
    }
    if blocking {
        flags |= EVENT_BLOCKING_SYNC;
    }
    if ipc {
        flags |= EVENT_INTERPROCESS;
    }
    Ok(flags)
}

#[pymethods]
impl PyStream {
    #[new]
    #[pyo3(signature = (*args, **_kwargs), text_signature = None)]
    fn py_new(args: &Bound<'_, PyTuple>, _kwargs: Option<&Bound<'_, PyDict>>) -> PyResult<Self> {
        if args.len() == 1 {
            if let Ok(init) = args.get_item(0)?.cast::<PyStreamInit>() {
                let handle = init
                    .get()
                    .handle
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .take();
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
        let py = cls.py();
        if cls.is(py.get_type::<PyStream>()) {
            return Ok(singleton(py, DefaultStream::Legacy)?
                .bind(py)
                .clone()
                .into_any());
        }
        stream_of_class(py, Some(cls), StreamHandle::legacy(), None)
    }

    /// The per-thread default stream as an object of this class
    /// (``PER_THREAD_DEFAULT_STREAM`` itself for ``Stream``).
    #[classmethod]
    fn _per_thread_default<'py>(cls: &Bound<'py, PyType>) -> PyResult<Bound<'py, PyAny>> {
        let py = cls.py();
        if cls.is(py.get_type::<PyStream>()) {
            return Ok(singleton(py, DefaultStream::PerThread)?
                .bind(py)
                .clone()
                .into_any());
        }
        stream_of_class(py, Some(cls), StreamHandle::per_thread(), None)
    }

    /// Wraps a stream made elsewhere: an int handle, or an object with ``__cuda_stream__``.
    ///
    /// The token values 0, 0x1, 0x2 give the default-stream tokens; a stream custody created
    /// gives that stream back. ``TypeError`` for None or a non-int; ``OverflowError`` for a
    /// negative int; :class:`CUDAError` when the driver rejects the handle.
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
        let taken = self
            .handle
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
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
        let py = other.py();
        let Ok(other) = other.cast::<PyStream>() else {
            return Ok(py.NotImplemented());
        };
        let other = other.get();
        let equal = std::ptr::eq(self, other)
            || (self.raw == other.raw && self.is_open() && other.is_open());
        match op {
            CompareOp::Eq => Ok(equal.into_pyobject(py)?.to_owned().into_any().unbind()),
            CompareOp::Ne => Ok((!equal).into_pyobject(py)?.to_owned().into_any().unbind()),
            _ => Ok(py.NotImplemented()),
        }
    }

    fn __hash__(&self) -> u64 {
        hash_of("Stream", self.raw as u64)
    }

    fn __repr__(&self, py: Python<'_>) -> String {
        let stream = self
            .handle
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
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

/// `custody.Device(ordinal)`.
pub(crate) fn device_object(py: Python<'_>, ordinal: i32) -> PyResult<Bound<'_, PyAny>> {
    py.import("custody")?.getattr("Device")?.call1((ordinal,))
}

/// A CUDA event, made by :meth:`Stream.record` or :meth:`Device.create_event`.
///
/// Equal to another ``Event`` object for the same driver event while both are open, hashable
/// by the driver handle, weak-referenceable. ``end - start`` is the time between two recorded,
/// completed events made with ``timing_enabled=True``, in milliseconds (a ``float``, from
/// ``cuEventElapsedTime``); ``RuntimeError`` when either lacks timing ("Both Events must be
/// created with timing enabled"), was never recorded ("Both Events must be recorded") or has
/// not completed ("One or both events have not completed"). Cannot be instantiated directly.
#[pyclass(frozen, weakref, name = "Event", module = "custody")]
pub struct PyEvent {
    handle: Mutex<Option<EventHandle>>,
    /// The raw `CUevent`, kept after `close()` so that the hash never changes.
    raw: usize,
    /// The `CU_EVENT_*` flags it was created with.
    flags: u32,
    /// For an event opened from another process: the descriptor it was opened from.
    imported: Option<Vec<u8>>,
}

impl PyEvent {
    /// A new event in `context` with `flags` (`CU_EVENT_*`).
    pub(crate) fn create(py: Python<'_>, context: &ContextHandle, flags: u32) -> PyResult<PyEvent> {
        let handle = py
            .detach(|| EventHandle::create(context, EventFlags::from_bits_retain(flags)))
            .map_err(Error::from)?;
        Ok(PyEvent::wrap(handle, flags))
    }

    pub(crate) fn wrap(handle: EventHandle, flags: u32) -> PyEvent {
        PyEvent {
            raw: handle.raw() as usize,
            handle: Mutex::new(Some(handle)),
            flags,
            imported: None,
        }
    }

    pub(crate) fn handle(&self) -> PyResult<EventHandle> {
        self.handle
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
            .ok_or_else(|| closed("Event"))
    }

    fn is_open(&self) -> bool {
        self.handle
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .is_some()
    }
}

#[pymethods]
impl PyEvent {
    #[new]
    #[pyo3(signature = (*_args, **_kwargs), text_signature = None)]
    fn py_new(_args: &Bound<'_, PyTuple>, _kwargs: Option<&Bound<'_, PyAny>>) -> PyResult<Self> {
        Err(PyRuntimeError::new_err(
            "Event objects cannot be instantiated directly. Use Stream.record() or \
             Device.create_event().",
        ))
    }

    /// Blocks until the recorded work has finished (yielding the CPU for an event made with
    /// ``blocking_sync=True``).
    ///
    /// Raises ``RuntimeError`` if the event was closed; :class:`CUDAError` on a driver failure.
    fn sync(&self, py: Python<'_>) -> PyResult<()> {
        let event = self.handle()?;
        py.detach(|| event.synchronize()).map_err(Error::from)?;
        Ok(())
    }

    /// Whether the recorded work has finished; does not block. ``RuntimeError`` if the event was
    /// closed; :class:`CUDAError` on a driver failure.
    #[getter]
    fn is_done(&self, py: Python<'_>) -> PyResult<bool> {
        let event = self.handle()?;
        Ok(py.detach(|| event.query()).map_err(Error::from)?)
    }

    /// The raw ``CUevent`` as an int (``RuntimeError`` once closed).
    #[getter(handle)]
    fn handle_(&self) -> PyResult<usize> {
        Ok(self.handle()?.raw() as usize)
    }

    /// The event's context; ``None`` for an event opened from another process
    /// (``RuntimeError`` once closed).
    #[getter]
    fn context(&self) -> PyResult<Option<PyContext>> {
        let handle = self.handle()?;
        if self.imported.is_some() {
            return Ok(None);
        }
        Ok(Some(PyContext {
            handle: handle.context().clone(),
        }))
    }

    /// The device of the event's context; ``None`` for an event opened from another process
    /// (``RuntimeError`` once closed).
    #[getter]
    fn device<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyAny>>> {
        let handle = self.handle()?;
        if self.imported.is_some() {
            return Ok(None);
        }
        Ok(Some(device_object(py, handle.context().device())?))
    }

    /// Whether the event records timing data (``EventOptions.timing_enabled``).
    #[getter]
    fn is_timing_enabled(&self) -> bool {
        self.flags & EVENT_DISABLE_TIMING == 0
    }

    /// Whether :meth:`sync` yields the CPU (``EventOptions.blocking_sync``).
    #[getter]
    fn is_blocking_sync(&self) -> bool {
        self.flags & EVENT_BLOCKING_SYNC != 0
    }

    /// Whether the event can be shared with other processes (``EventOptions.ipc_enabled``).
    #[getter]
    fn is_ipc_enabled(&self) -> bool {
        self.flags & EVENT_INTERPROCESS != 0
    }

    /// Whether ``close()`` was called.
    #[getter]
    fn is_closed(&self) -> bool {
        !self.is_open()
    }

    /// Releases this object's reference to the event (the driver's event is destroyed when no other
    /// reference holds it). Idempotent; never raises.
    fn close(&self, py: Python<'_>) {
        let taken = self
            .handle
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        py.detach(move || drop(taken));
    }

    fn __richcmp__(&self, other: &Bound<'_, PyAny>, op: CompareOp) -> PyResult<Py<PyAny>> {
        let py = other.py();
        let Ok(other) = other.cast::<PyEvent>() else {
            return Ok(py.NotImplemented());
        };
        let other = other.get();
        let equal = std::ptr::eq(self, other)
            || (self.raw == other.raw && self.is_open() && other.is_open());
        match op {
            CompareOp::Eq => Ok(equal.into_pyobject(py)?.to_owned().into_any().unbind()),
            CompareOp::Ne => Ok((!equal).into_pyobject(py)?.to_owned().into_any().unbind()),
            _ => Ok(py.NotImplemented()),
        }
    }

    fn __hash__(&self) -> u64 {
        hash_of("Event", self.raw as u64)
    }

    /// `end - start`: the milliseconds between the two events' completions (both created with
    /// `timing_enabled=True`, recorded and completed), from `cuEventElapsedTime`.
    fn __sub__(&self, other: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
        let py = other.py();
        let Ok(start) = other.cast::<PyEvent>() else {
            return Ok(py.NotImplemented());
        };
        let start = start.get();
        if !self.is_timing_enabled() || !start.is_timing_enabled() {
            return Err(PyRuntimeError::new_err(
                "Both Events must be created with timing enabled to be subtracted: create them \
                 with EventOptions(timing_enabled=True)",
            ));
        }
        let (end, begin) = (self.handle()?, start.handle()?);
        match py.detach(|| end.elapsed_since(&begin)) {
            Ok(ms) => Ok(f64::from(ms).into_pyobject(py)?.into_any().unbind()),
            Err(handles::HandleError::Driver(error))
                if error.code == handles::CudaErrorCode::INVALID_HANDLE =>
            {
                Err(PyRuntimeError::new_err(
                    "Both Events must be recorded before they can be subtracted: record each \
                     on a stream with Stream.record()",
                ))
            }
            Err(handles::HandleError::Driver(error))
                if error.code == handles::CudaErrorCode::NOT_READY =>
            {
                Err(PyRuntimeError::new_err(
                    "One or both events have not completed. Wait for them (Event.sync(), \
                     Stream.sync() or Device.sync()) before subtracting them.",
                ))
            }
            Err(error) => Err(Error::from(error).into()),
        }
    }

    /// In-place subtraction is not defined for events: `NotImplemented` for every operand
    /// (pyo3 answers so when the operand is not a [`NoOperand`], which none is), so that
    /// `a -= b` falls back to `a - b`.
    fn __isub__(&self, _other: PyRef<'_, NoOperand>) {}

    /// Subtracting an event from something else is not defined.
    fn __rsub__(&self, other: &Bound<'_, PyAny>) -> Py<PyAny> {
        other.py().NotImplemented()
    }

    /// The descriptor another process needs to open this event (``Event.from_ipc_descriptor``;
    /// the driver's ``cuIpcGetEventHandle``). ``RuntimeError`` for a closed event or one made
    /// without ``ipc_enabled=True``; :class:`CUDAError` on a driver failure.
    #[getter]
    fn ipc_descriptor(&self, py: Python<'_>) -> PyResult<PyIpcEventDescriptor> {
        let event = self.handle()?;
        if self.flags & EVENT_INTERPROCESS == 0 {
            return Err(PyRuntimeError::new_err(
                "Event is not IPC-enabled: create it with EventOptions(ipc_enabled=True)",
            ));
        }
        let reserved = match &self.imported {
            Some(reserved) => reserved.clone(),
            None => py
                .detach(|| event.ipc_handle())
                .map_err(Error::from)?
                .to_vec(),
        };
        Ok(PyIpcEventDescriptor {
            reserved,
            blocking_sync: self.flags & EVENT_BLOCKING_SYNC != 0,
        })
    }

    /// Opens an event another process shared (its ``ipc_descriptor``), in the current context;
    /// the event opened has no ``device`` or ``context`` here, and its ``ipc_descriptor`` is the
    /// one it was opened from. ``TypeError`` for anything but an :class:`IPCEventDescriptor`,
    /// ``ValueError`` for one whose handle bytes are shorter than 64; ``RuntimeError`` when no
    /// context is current; :class:`CUDAError` when the driver refuses the handle.
    #[classmethod]
    fn from_ipc_descriptor(
        _cls: &Bound<'_, PyType>,
        py: Python<'_>,
        ipc_descriptor: &Bound<'_, PyAny>,
    ) -> PyResult<PyEvent> {
        let descriptor = ipc_descriptor
            .cast::<PyIpcEventDescriptor>()
            .map_err(|_| expected("IPCEventDescriptor", ipc_descriptor))?;
        let descriptor = descriptor.get();
        let reserved: [u8; 64] = descriptor
            .reserved
            .get(..64)
            .and_then(|bytes| bytes.try_into().ok())
            .ok_or_else(|| {
                PyValueError::new_err(format!(
                    "invalid IPC event descriptor: its reserved field is {} bytes; expected at \
                     least 64",
                    descriptor.reserved.len()
                ))
            })?;
        let context = py
            .detach(ContextHandle::current)
            .map_err(Error::from)?
            .ok_or_else(|| PyRuntimeError::new_err(NO_CONTEXT))?;
        let handle = py
            .detach(|| EventHandle::open_ipc(&context, &reserved))
            .map_err(Error::from)?;
        let mut flags = EVENT_INTERPROCESS | EVENT_DISABLE_TIMING;
        if descriptor.blocking_sync {
            flags |= EVENT_BLOCKING_SYNC;
        }
        Ok(PyEvent {
            imported: Some(reserved.to_vec()),
            ..PyEvent::wrap(handle, flags)
        })
    }

    /// Pickles an IPC-enabled event as its descriptor and its device (for `multiprocessing`):
    /// unpickling (`custody._rebuild_event`) opens it in the current context, first making that
    /// device's primary context current when none is.
    fn __reduce__<'py>(
        slf: &Bound<'py, Self>,
    ) -> PyResult<(Bound<'py, PyAny>, (PyIpcEventDescriptor, i32))> {
        let py = slf.py();
        let this = slf.get();
        let descriptor = this.ipc_descriptor(py)?;
        let device = this.handle()?.context().device();
        let rebuild = py.import("custody")?.getattr("_rebuild_event")?;
        Ok((rebuild, (descriptor, device)))
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

/// A type no Python value has (it cannot be made from Python): the operand type of
/// `Event.__isub__`, so that pyo3 answers `NotImplemented` for any operand.
#[pyclass(frozen, name = "_NoOperand", module = "custody._custody")]
pub struct NoOperand;

/// What another process needs to open an IPC-enabled event: the driver's 64-byte
/// ``CUipcEventHandle`` and whether the event blocks on ``sync()``. Compared by the handle
/// bytes; picklable. Cannot be instantiated directly (``RuntimeError``).
#[pyclass(frozen, name = "IPCEventDescriptor", module = "custody")]
pub struct PyIpcEventDescriptor {
    reserved: Vec<u8>,
    blocking_sync: bool,
}

#[pymethods]
impl PyIpcEventDescriptor {
    #[new]
    #[pyo3(signature = (*_args, **_kwargs), text_signature = None)]
    fn py_new(_args: &Bound<'_, PyTuple>, _kwargs: Option<&Bound<'_, PyAny>>) -> PyResult<Self> {
        Err(PyRuntimeError::new_err(
            "IPCEventDescriptor objects cannot be instantiated directly. Use \
             Event.ipc_descriptor.",
        ))
    }

    /// A descriptor from its parts, as unpickling makes it.
    #[staticmethod]
    fn _init(reserved: Vec<u8>, is_blocking_sync: bool) -> PyIpcEventDescriptor {
        PyIpcEventDescriptor {
            reserved,
            blocking_sync: is_blocking_sync,
        }
    }

    /// Whether the event blocks (yields) on ``sync()``.
    #[getter]
    fn is_blocking_sync(&self) -> bool {
        self.blocking_sync
    }

    fn __richcmp__(&self, other: &Bound<'_, PyAny>, op: CompareOp) -> PyResult<Py<PyAny>> {
        let py = other.py();
        let Ok(other) = other.cast::<PyIpcEventDescriptor>() else {
            return Ok(py.NotImplemented());
        };
        let equal = self.reserved == other.get().reserved;
        match op {
            CompareOp::Eq => Ok(equal.into_pyobject(py)?.to_owned().into_any().unbind()),
            CompareOp::Ne => Ok((!equal).into_pyobject(py)?.to_owned().into_any().unbind()),
            _ => Ok(py.NotImplemented()),
        }
    }

    fn __hash__(&self) -> u64 {
        let mut hasher = DefaultHasher::new();
        self.reserved.hash(&mut hasher);
        hasher.finish()
    }

    fn __reduce__<'py>(
        slf: &Bound<'py, Self>,
    ) -> PyResult<(Bound<'py, PyAny>, (Bound<'py, pyo3::types::PyBytes>, bool))> {
        let py = slf.py();
        let init = slf.get_type().getattr("_init")?;
        let this = slf.get();
        Ok((
            init,
            (
                pyo3::types::PyBytes::new(py, &this.reserved),
                this.blocking_sync,
            ),
        ))
    }

    fn __repr__(&self) -> String {
        format!("<IPCEventDescriptor blocking_sync={}>", self.blocking_sync)
    }
}

/// A CUDA context: a device's primary context (retained while this object lives), or one made
/// elsewhere (a wrapped stream's).
///
/// Equal to another ``Context`` for the same driver context, hashable, weak-referenceable.
/// Cannot be instantiated directly (``RuntimeError``): use ``Device.context`` or
/// ``Stream.context``.
#[pyclass(frozen, weakref, name = "Context", module = "custody")]
pub struct PyContext {
    pub(crate) handle: ContextHandle,
}

#[pymethods]
impl PyContext {
    #[new]
    #[pyo3(signature = (*_args, **_kwargs), text_signature = None)]
    fn py_new(_args: &Bound<'_, PyTuple>, _kwargs: Option<&Bound<'_, PyAny>>) -> PyResult<Self> {
        Err(PyRuntimeError::new_err(
            "Context objects cannot be instantiated directly. Use Device.context or \
             Stream.context.",
        ))
    }

    /// The raw ``CUcontext`` as an int.
    #[getter]
    fn handle(&self) -> usize {
        self.handle.raw() as usize
    }

    /// The device ordinal the context belongs to.
    #[getter]
    fn device_id(&self) -> i32 {
        self.handle.device()
    }

    /// Always False: the object keeps its context for as long as it lives.
    #[getter]
    fn is_closed(&self) -> bool {
        false
    }

    fn __richcmp__(&self, other: &Bound<'_, PyAny>, op: CompareOp) -> PyResult<Py<PyAny>> {
        let py = other.py();
        let Ok(other) = other.cast::<PyContext>() else {
            return Ok(py.NotImplemented());
        };
        let equal = self.handle == other.get().handle;
        match op {
            CompareOp::Eq => Ok(equal.into_pyobject(py)?.to_owned().into_any().unbind()),
            CompareOp::Ne => Ok((!equal).into_pyobject(py)?.to_owned().into_any().unbind()),
            _ => Ok(py.NotImplemented()),
        }
    }

    fn __hash__(&self) -> u64 {
        hash_of("Context", self.handle.raw() as u64)
    }

    fn __repr__(&self) -> String {
        format!(
            "<Context handle=0x{:x} device={}>",
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
            raw: handle.raw() as usize,
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

/// How many devices the driver sees.
#[pyfunction]
pub(crate) fn _device_count(py: Python<'_>) -> PyResult<i32> {
    Ok(py.detach(handles::device_count).map_err(Error::from)?)
}

/// Device `device_id`'s attribute number `attribute` (`cuDeviceGetAttribute`).
#[pyfunction]
pub(crate) fn _device_attribute(py: Python<'_>, device_id: i32, attribute: u32) -> PyResult<i32> {
    Ok(py
        .detach(|| handles::device_attribute(device_id, attribute))
        .map_err(Error::from)?)
}

/// Device `device_id`'s UUID, 16 bytes (`cuDeviceGetUuid`).
#[pyfunction]
pub(crate) fn _device_uuid(py: Python<'_>, device_id: i32) -> PyResult<Vec<u8>> {
    Ok(py
        .detach(|| handles::device_uuid(device_id))
        .map_err(Error::from)?
        .to_vec())
}

/// Device `device_id`'s name (`cuDeviceGetName`).
#[pyfunction]
pub(crate) fn _device_name(py: Python<'_>, device_id: i32) -> PyResult<String> {
    Ok(py
        .detach(|| handles::device_name(device_id))
        .map_err(Error::from)?)
}

/// Device `device_id`'s PCI address, `domain:bus:device.function` (`cuDeviceGetPCIBusId`).
#[pyfunction]
pub(crate) fn _device_pci_bus_id(py: Python<'_>, device_id: i32) -> PyResult<String> {
    Ok(py
        .detach(|| handles::device_pci_bus_id(device_id))
        .map_err(Error::from)?)
}

/// Whether device `device_id` can access device `peer`'s memory (`cuDeviceCanAccessPeer`).
#[pyfunction]
pub(crate) fn _can_access_peer(py: Python<'_>, device_id: i32, peer: i32) -> PyResult<bool> {
    Ok(py
        .detach(|| handles::device_can_access_peer(device_id, peer))
        .map_err(Error::from)?)
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

/// A new event in `context`, not recorded, made with `options` (`EventOptions` or a dict).
#[pyfunction]
#[pyo3(signature = (context, options = None))]
pub(crate) fn _create_event(
    py: Python<'_>,
    context: &Bound<'_, PyContext>,
    options: Option<&Bound<'_, PyAny>>,
) -> PyResult<PyEvent> {
    let flags = event_flags(options)?;
    if flags & EVENT_INTERPROCESS != 0 {
        // An interprocess event is shared once recorded: it is made by recording it.
        return Err(PyTypeError::new_err(
            "IPC-enabled events must be bound; use Stream.record for creation.",
        ));
    }
    PyEvent::create(py, &context.get().handle, flags)
}

/// Registers the stream classes and functions on the module.
pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add_class::<PyStream>()?;
    m.add_class::<PyStreamInit>()?;
    m.add_class::<PyEvent>()?;
    m.add_class::<PyIpcEventDescriptor>()?;
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
    m.add_function(wrap_pyfunction!(_stream_accept, m)?)?;
    m.add_function(wrap_pyfunction!(_device_count, m)?)?;
    m.add_function(wrap_pyfunction!(_device_attribute, m)?)?;
    m.add_function(wrap_pyfunction!(_device_name, m)?)?;
    m.add_function(wrap_pyfunction!(_device_pci_bus_id, m)?)?;
    m.add_function(wrap_pyfunction!(_device_uuid, m)?)?;
    m.add_function(wrap_pyfunction!(_can_access_peer, m)?)?;
    m.add_function(wrap_pyfunction!(_primary_context, m)?)?;
    m.add_function(wrap_pyfunction!(_set_current, m)?)?;
    m.add_function(wrap_pyfunction!(_current_context, m)?)?;
    m.add_function(wrap_pyfunction!(_synchronize_context, m)?)?;
    m.add_function(wrap_pyfunction!(_create_stream, m)?)?;
    m.add_function(wrap_pyfunction!(_create_event, m)?)?;
    Ok(())
}
