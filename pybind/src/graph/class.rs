//! `GraphBuilder`'s struct, which streams, buffers and resources name (a stream argument may be a
//! builder: its captured stream), with its constructor and accessors; its methods are in
//! `methods`.

use std::sync::{Arc, Mutex};

use memory::{Graph, GraphBuilder};
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;

use crate::errors::Error;
use crate::stream::class::PyStream;
use crate::sync::Locked;

/// Records work into a CUDA graph by capturing a stream (``Device.create_graph_builder()``,
/// ``Stream.create_graph_builder()``).
///
/// Pass it as the ``stream`` of ``Buffer.fill``, ``Buffer.copy_to`` / ``copy_from`` (the graph
/// then keeps those buffers' memory alive, even after they are closed, until the graph and
/// every executable made from it are gone; the free then runs with the buffer's recipe, on the
/// cleanup worker or in ``drain_deferred_cleanup()``), of ``GraphMemoryResource.allocate``, and
/// of ``Buffer.set_deallocation_stream`` (the captured stream). Work issued on ``stream``
/// directly, such as a kernel that CuPy, PyTorch or Numba launches there, is captured but keeps
/// nothing alive: :meth:`retain` the buffers it uses. Cannot be instantiated directly.
#[pyclass(frozen, weakref, name = "GraphBuilder", module = "custody")]
pub struct PyGraphBuilder {
    /// Cloned out before any driver call: no lock of ours is held while the GIL is released
    /// (a thread re-attaching while holding it could deadlock with one waiting on it).
    pub(crate) builder: Mutex<Option<Arc<GraphBuilder>>>,
    /// The captured stream, as a Python object (`stream` property).
    pub(crate) stream: Py<PyStream>,
    /// The graph recorded by the last `end_building()`.
    pub(crate) graph: Mutex<Option<Arc<Graph>>>,
    /// Set when the last `end_building()` found the capture invalidated (it recorded no
    /// graph), for `complete()`'s message; cleared by the next `begin_building()`.
    pub(crate) invalidated: std::sync::atomic::AtomicBool,
}

impl PyGraphBuilder {
    /// The builder; `RuntimeError("Graph builder has been closed.")` once closed.
    pub(crate) fn builder(&self) -> PyResult<Arc<GraphBuilder>> {
        self.builder
            .locked()
            .clone()
            .ok_or_else(|| PyRuntimeError::new_err("Graph builder has been closed."))
    }

    /// The captured stream's handle.
    pub(crate) fn stream_handle(&self) -> PyResult<handles::StreamHandle> {
        Ok(self.builder()?.stream().clone())
    }
}

/// A graph builder capturing `stream`, whose Python object is `object` (`Stream.create_graph_builder`).
pub(crate) fn builder_on(
    py: Python<'_>,
    stream: handles::StreamHandle,
    object: Py<PyStream>,
) -> PyResult<PyGraphBuilder> {
    let _ = py;
    let builder = GraphBuilder::new(&stream).map_err(Error::from)?;
    Ok(PyGraphBuilder {
        builder: Mutex::new(Some(Arc::new(builder))),
        stream: object,
        graph: Mutex::new(None),
        invalidated: std::sync::atomic::AtomicBool::new(false),
    })
}
