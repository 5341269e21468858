//! `Event` (made by `Stream.record` or `Device.create_event`: its flags from `EventOptions`,
//! elapsed time, IPC), and `IPCEventDescriptor`, what another process needs to open an
//! IPC-enabled event.

use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::sync::Mutex;

use handles::{ContextHandle, EventFlags, EventHandle};
use pyo3::exceptions::{PyRuntimeError, PyTypeError};
use pyo3::prelude::*;
use pyo3::pyclass::CompareOp;
use pyo3::types::{PyTuple, PyType};

use super::context::PyContext;
use super::device::device_object;
use crate::errors::{closed, expected, ipc_data, Error, NO_CONTEXT};
use crate::identity::{compare, compare_handles, hash_of};
use crate::options::{check_options, option};
use crate::sync::Locked;

// The `CU_EVENT_*` bits as the plain word a `PyEvent` keeps (and `EventOptions` builds).
/// `CU_EVENT_BLOCKING_SYNC`.
pub(crate) const EVENT_BLOCKING_SYNC: u32 = EventFlags::BLOCKING_SYNC.bits();

/// `CU_EVENT_DISABLE_TIMING`.
pub(crate) const EVENT_DISABLE_TIMING: u32 = EventFlags::DISABLE_TIMING.bits();

/// `CU_EVENT_INTERPROCESS`.
pub(crate) const EVENT_INTERPROCESS: u32 = EventFlags::INTERPROCESS.bits();

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
        self.handle.locked().clone().ok_or_else(|| closed("Event"))
    }

    fn is_open(&self) -> bool {
        self.handle.locked().is_some()
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
    pub(super) fn is_ipc_enabled(&self) -> bool {
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
        let taken = self.handle.locked().take();
        py.detach(move || drop(taken));
    }

    fn __richcmp__(&self, other: &Bound<'_, PyAny>, op: CompareOp) -> PyResult<Py<PyAny>> {
        compare_handles(self, other, op, |this| this.is_open().then_some(this.raw))
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
        let reserved = ipc_data(
            &descriptor.reserved,
            "IPC event descriptor: its reserved field",
        )?;
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
        match self.handle.locked().as_ref() {
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
        compare(other, op, |other: &PyIpcEventDescriptor| {
            self.reserved == other.reserved
        })
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
