//! `GraphBuilder`'s methods (its struct is in `class`) and `Graph`, the executable form, with
//! `retain(buffer)` on both; a graph builder made on a new stream (`Device.create_graph_builder`)
//! and a graph allocation's buffer (`GraphMemoryResource.allocate` on a builder).

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use memory::{CaptureMode, GraphExec};
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::pyclass::{PyTraverseError, PyVisit};
use pyo3::types::PyTuple;

use super::class::{builder_on, PyGraphBuilder};
use crate::buffer::class::{Kept, PyBuffer};
use crate::errors::{closed, expected, Error};
use crate::options::{check_options, option};
use crate::stream::accept::accept_stream;
use crate::stream::class::PyStream;
use crate::stream::context::PyContext;
use crate::sync::Locked;

fn mode_of(mode: &str) -> PyResult<CaptureMode> {
    match mode {
        "global" => Ok(CaptureMode::Global),
        "thread_local" => Ok(CaptureMode::ThreadLocal),
        "relaxed" => Ok(CaptureMode::Relaxed),
        other => Err(PyValueError::new_err(format!(
            "capture mode must be \"global\", \"thread_local\" or \"relaxed\", got {other:?}"
        ))),
    }
}

#[pymethods]
impl PyGraphBuilder {
    #[new]
    #[pyo3(signature = (*_args, **_kwargs), text_signature = None)]
    fn py_new(_args: &Bound<'_, PyTuple>, _kwargs: Option<&Bound<'_, PyAny>>) -> PyResult<Self> {
        Err(PyRuntimeError::new_err(
            "GraphBuilder objects cannot be instantiated directly: use \
             Device.create_graph_builder()",
        ))
    }

    /// Starts capturing (``"global"``, ``"thread_local"`` or ``"relaxed"``); returns self.
    /// ``ValueError`` for another mode; ``RuntimeError`` when already building ("Graph builder
    /// is already building"). A builder may capture again after ``end_building()`` (cuda.core
    /// refuses); the next ``end_building()`` replaces the recorded graph.
    #[pyo3(signature = (mode = "relaxed"))]
    fn begin_building<'py>(slf: &Bound<'py, Self>, mode: &str) -> PyResult<Bound<'py, Self>> {
        let mode = mode_of(mode)?;
        let py = slf.py();
        let this = slf.get();
        let builder = this.builder()?;
        if builder.is_building() {
            return Err(PyRuntimeError::new_err(
                "Graph builder is already building. Call end_building() before beginning again.",
            ));
        }
        py.detach(|| builder.begin_building(mode))
            .map_err(Error::from)?;
        this.invalidated.store(false, Ordering::Relaxed);
        Ok(slf.clone())
    }

    /// Ends capturing and keeps the recorded graph; returns self. ``RuntimeError`` for a closed
    /// builder or one that is not building; :class:`CUDAError` when the driver ends the capture
    /// with an error (an invalidated capture: it recorded no graph, and ``complete()`` then
    /// says so until ``begin_building()`` starts again).
    fn end_building<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, Self>> {
        let py = slf.py();
        let this = slf.get();
        let builder = this.builder()?;
        // A builder that is not building refuses without a change: the graph it recorded last
        // still completes.
        let was_building = builder.is_building();
        let ended = py.detach(|| builder.end_building());
        let graph = match ended {
            Ok(graph) => graph,
            Err(error) => {
                if was_building && !builder.is_building() {
                    // The capture is over and recorded nothing.
                    this.invalidated.store(true, Ordering::Relaxed);
                }
                return Err(Error::from(error).into());
            }
        };
        this.invalidated.store(false, Ordering::Relaxed);
        let old = this.graph.locked().replace(Arc::new(graph));
        py.detach(move || drop(old));
        Ok(slf.clone())
    }

    /// Instantiates the recorded graph (``RuntimeError("Graph has not finished building.")``
    /// before ``end_building()``; ``RuntimeError`` saying the capture was invalidated after an
    /// ``end_building()`` that found it so); ``options`` as :class:`GraphCompleteOptions` says.
    #[pyo3(signature = (options = None))]
    fn complete(&self, py: Python<'_>, options: Option<&Bound<'_, PyAny>>) -> PyResult<PyGraph> {
        self.builder()?;
        if self.invalidated.load(Ordering::Relaxed) {
            return Err(PyRuntimeError::new_err(
                "The capture was invalidated, so end_building() recorded no graph. Call \
                 begin_building() and capture the work again before complete().",
            ));
        }
        let options = check_options(
            options,
            "GraphCompleteOptions",
            &[
                "auto_free_on_launch",
                "upload_stream",
                "device_launch",
                "use_node_priority",
            ],
        )?;
        for name in ["auto_free_on_launch", "device_launch", "use_node_priority"] {
            if option(options, name, false)? {
                return Err(pyo3::exceptions::PyNotImplementedError::new_err(format!(
                    "GraphCompleteOptions.{name} is not supported by custody"
                )));
            }
        }
        let upload = match options {
            Some(options) => {
                let stream = if let Ok(dict) = options.cast::<pyo3::types::PyDict>() {
                    dict.get_item("upload_stream")?
                } else {
                    options.getattr("upload_stream").ok()
                };
                match stream.filter(|s| !s.is_none()) {
                    Some(stream) => Some(accept_stream(&stream)?),
                    None => None,
                }
            }
            None => None,
        };
        let graph = self.graph.locked().clone().ok_or_else(|| {
            PyRuntimeError::new_err(
                "Graph has not finished building. Call end_building() before complete().",
            )
        })?;
        let exec = py.detach(|| graph.instantiate()).map_err(Error::from)?;
        if let Some(stream) = upload {
            py.detach(|| exec.upload(&stream)).map_err(Error::from)?;
        }
        Ok(PyGraph {
            exec: Mutex::new(Some(Arc::new(exec))),
        })
    }

    /// Whether ``close()`` was called (then every method raises ``RuntimeError("Graph
    /// builder has been closed.")``).
    #[getter]
    fn is_closed(&self) -> bool {
        self.builder.locked().is_none()
    }

    /// The collector sees the captured stream's object (it holds no Python object, so it closes
    /// no cycle and nothing needs clearing). What the builder retains is Rust-held and shared
    /// with the buffers it retained, so it is not reported.
    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        visit.call(&self.stream)
    }

    /// Makes the graph being captured keep ``buffer``'s memory allocated, for captured work
    /// custody does not see (a kernel another library launched on :attr:`stream` that reads or
    /// writes it). Call it any time between ``begin_building()`` and ``end_building()``. The
    /// graph ``end_building()`` records inherits the retention: after ``buffer.close()`` the
    /// memory stays allocated until that graph and every executable and launch made from it
    /// are gone (``close()`` of this builder and of each :class:`Graph`), and is then freed
    /// once, by the cleanup worker or in ``drain_deferred_cleanup()``, with the buffer's
    /// recipe as it is then (``set_deallocation_stream`` before ``close`` still moves the
    /// free). Retaining a buffer twice is harmless; a ``GraphMemoryResource`` buffer of this
    /// capture is the graph's own and is not retained; any device's memory may be retained.
    /// It orders nothing. Errors, all before any driver call and changing nothing:
    /// ``TypeError`` for anything but a ``Buffer`` (``None`` included); ``RuntimeError`` for a
    /// closed buffer, a closed builder, or a builder that is not building. Driver calls:
    /// ``cuStreamGetCaptureInfo_v2``, ``cuUserObjectCreate``, ``cuGraphRetainUserObject``,
    /// ``cuUserObjectRelease``.
    // Over `memory::GraphBuilder::retain`.
    fn retain(&self, py: Python<'_>, buffer: &Bound<'_, PyAny>) -> PyResult<()> {
        let buffer = retained_buffer(buffer)?;
        let builder = self.builder()?;
        let buffer = buffer.get().open(py)?;
        py.detach(|| builder.retain(&buffer)).map_err(Error::from)?;
        Ok(())
    }

    /// Whether the builder is capturing.
    #[getter]
    fn is_building(&self) -> PyResult<bool> {
        Ok(self.builder()?.is_building())
    }

    /// The stream being captured.
    #[getter]
    fn stream(&self, py: Python<'_>) -> Py<PyStream> {
        self.stream.clone_ref(py)
    }

    /// ``(0, handle)`` of the captured stream (``RuntimeError`` once closed).
    fn __cuda_stream__(&self) -> PyResult<(i32, usize)> {
        Ok((0, self.stream_handle()?.raw() as usize))
    }

    /// Ends a capture still running, discarding what it recorded, and releases the builder and
    /// its recorded graph (the graph's memory is released once every executable made from it is
    /// gone). Idempotent. A capture that was invalidated has ended all the same: not an error
    /// here. :class:`CUDAError` when the driver refuses to end the capture (ending a
    /// ``"thread_local"`` or ``"global"`` capture on another thread, say): the builder then
    /// stays open and building, so that ``close()`` can be called again, from the thread that
    /// may end it. A builder dropped while building ends its capture the same way and reports
    /// such a failure as a :class:`CUDAWarning`, as other objects' drops do. Driver calls:
    /// ``cuStreamEndCapture`` (and ``cuStreamIsCapturing`` after a failure), ``cuGraphDestroy``.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        let building = self.builder.locked().clone();
        if let Some(builder) = building {
            py.detach(|| builder.abandon_building())
                .map_err(Error::from)?;
        }
        let builder = self.builder.locked().take();
        let graph = self.graph.locked().take();
        py.detach(move || {
            drop(builder);
            drop(graph);
        });
        Ok(())
    }
}

/// An executable graph (``GraphBuilder.complete()``).
#[pyclass(frozen, weakref, name = "Graph", module = "custody")]
pub struct PyGraph {
    exec: Mutex<Option<Arc<GraphExec>>>,
}

impl PyGraph {
    fn exec(&self) -> PyResult<Arc<GraphExec>> {
        self.exec.locked().clone().ok_or_else(|| closed("Graph"))
    }
}

#[pymethods]
impl PyGraph {
    #[new]
    #[pyo3(signature = (*_args, **_kwargs), text_signature = None)]
    fn py_new(_args: &Bound<'_, PyTuple>, _kwargs: Option<&Bound<'_, PyAny>>) -> PyResult<Self> {
        Err(PyRuntimeError::new_err(
            "Graph objects cannot be instantiated directly: use GraphBuilder.complete()",
        ))
    }

    /// Launches the graph on ``stream``. Does not block. ``RuntimeError`` for a closed graph or
    /// stream, or a graph that ran once and allocates memory it does not free itself (its
    /// graph allocations not closed while building: another launch would allocate them again
    /// with nothing to free them); ``TypeError`` for a missing, ``None`` or non-stream
    /// ``stream``; ``ValueError`` for a stream of another device than the graph's (before any
    /// driver call); :class:`CUDAError` on a driver failure.
    fn launch(&self, py: Python<'_>, stream: &Bound<'_, PyAny>) -> PyResult<()> {
        let stream = accept_stream(stream)?;
        let exec = self.exec()?;
        py.detach(|| exec.launch(&stream)).map_err(Error::from)?;
        Ok(())
    }

    /// Uploads the graph to the device on ``stream`` so that the next launch need not
    /// (``cuGraphUpload``). Does not block. ``RuntimeError`` for a closed graph or stream;
    /// ``TypeError`` for a missing, ``None`` or non-stream ``stream``; ``ValueError`` for a
    /// stream of another device than the graph's; :class:`CUDAError` on a driver failure.
    fn upload(&self, py: Python<'_>, stream: &Bound<'_, PyAny>) -> PyResult<()> {
        let stream = accept_stream(stream)?;
        let exec = self.exec()?;
        py.detach(|| exec.upload(&stream)).map_err(Error::from)?;
        Ok(())
    }

    /// The raw ``CUgraphExec`` as an int; 0 once closed.
    #[getter]
    fn handle(&self) -> usize {
        self.exec
            .locked()
            .as_ref()
            .and_then(|exec| exec.handle().ok())
            .map_or(0, |handle| handle.raw() as usize)
    }

    /// Makes this executable keep ``buffer``'s memory allocated, for work in the graph that
    /// custody does not see (a kernel another library captured into it). After
    /// ``buffer.close()`` the memory stays allocated until this graph is closed and its
    /// launches, including those queued before this call, have finished; it is then freed
    /// once, by the cleanup worker or in ``drain_deferred_cleanup()``, with the buffer's
    /// recipe as it is then. Only this executable holds it (not the builder's recorded graph
    /// or other executables). Retaining a buffer twice is harmless; any device's memory may
    /// be retained; it orders nothing. Errors, changing nothing: ``TypeError`` for anything
    /// but a ``Buffer`` (``None`` included); ``RuntimeError`` for a closed buffer or a closed
    /// graph. No driver call.
    // Over `memory::GraphExec::retain`.
    fn retain(&self, py: Python<'_>, buffer: &Bound<'_, PyAny>) -> PyResult<()> {
        let buffer = retained_buffer(buffer)?;
        let exec = self.exec.locked().clone().ok_or_else(|| closed("Graph"))?;
        let buffer = buffer.get().open(py)?;
        py.detach(|| exec.retain(&buffer)).map_err(Error::from)?;
        Ok(())
    }

    /// Releases the executable; what it retains is freed once the launches in flight are done, by
    /// the cleanup worker or in ``drain_deferred_cleanup()``. Idempotent.
    fn close(&self, py: Python<'_>) {
        let exec = self.exec.locked().take();
        py.detach(move || drop(exec));
    }

    /// Whether ``close()`` was called.
    #[getter]
    fn is_closed(&self) -> bool {
        self.exec.locked().is_none()
    }
}

/// The argument of `retain`: a `Buffer` (or `ManagedBuffer`); `TypeError` otherwise, `None`
/// included.
fn retained_buffer<'a, 'py>(buffer: &'a Bound<'py, PyAny>) -> PyResult<&'a Bound<'py, PyBuffer>> {
    buffer
        .cast::<PyBuffer>()
        .map_err(|_| expected("Buffer", buffer))
}

/// A graph builder capturing a new stream in `context`.
#[pyfunction]
pub(crate) fn _create_graph_builder(
    py: Python<'_>,
    context: &Bound<'_, PyContext>,
) -> PyResult<PyGraphBuilder> {
    let handle = context.get().handle.clone();
    // CU_STREAM_NON_BLOCKING: capture a stream that does not synchronise with the legacy stream.
    let stream = py
        .detach(|| handles::StreamHandle::create(&handle, handles::StreamFlags::NON_BLOCKING, 0))
        .map_err(Error::from)?;
    let object = Py::new(py, PyStream::new(stream.clone()))?;
    builder_on(py, stream, object)
}

/// `GraphMemoryResource.allocate(size, stream=builder)`: a graph allocation the builder knows
/// (so its own fills and copies of it are not retained twice).
pub(crate) fn allocate_in(
    py: Python<'_>,
    builder: &PyGraphBuilder,
    size: usize,
    mr: Py<PyAny>,
) -> PyResult<Py<PyAny>> {
    let inner = builder.builder()?;
    let buffer = py.detach(|| inner.allocate(size)).map_err(Error::from)?;
    PyBuffer::wrap(py, buffer, Some(mr), false, Kept::default())
}
