//! The classes that more than one family of the extension names, as plain Rust structs: their
//! fields, their `Drop`, and the constructors and accessors the other modules call. Each
//! class's `#[pymethods]` block (its Python methods, one block per class) and its private
//! helpers stay with its family: `Stream` in `stream`, `GraphBuilder` in `graph`, `Buffer` and
//! `ManagedBuffer` in `buffer`. Living here, below every family, they let the families import
//! one another one way (pybind/DESIGN.md, "Module order").

use std::sync::{Arc, Mutex, PoisonError, Weak};

use handles::StreamHandle;
use memory::{Buffer, Graph, GraphBuilder};
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;

use crate::errors::{closed, Error};
use crate::ffi::unowned_handle;
use crate::report::{release, PyObjRef};
use crate::shared::SharedBuffer;

/// A CUDA stream: created (``Device.create_stream()``), wrapped from another library
/// (``Stream.from_handle``), or a default-stream singleton.
///
/// A created stream lives at least as long as any pending free recorded on it, even after
/// ``close()``. Two ``Stream`` objects for one driver stream are equal and hash alike while
/// open; streams are weak-referenceable and can be subclassed in Python (made with the
/// class methods ``_init``, ``_legacy_default``, ``_per_thread_default``). Cannot be
/// instantiated directly (``RuntimeError``).
//
// A stream wrapped from an object with `__cuda_stream__` keeps that object (in its handle):
// while this is the handle's only holder, the collector sees that reference, so an object that
// keeps the `Stream` wrapping it is collected (docs/decisions.md D10).
#[pyclass(frozen, subclass, weakref, name = "Stream", module = "custody")]
pub struct PyStream {
    /// Cloned out (attached, briefly) by every use, so its count is stable while a collection
    /// runs. No Python object is made or dropped while the lock is held.
    pub(crate) handle: Mutex<Option<StreamHandle>>,
    /// The `__cuda_stream__` object the handle keeps, if any.
    pub(crate) protocol: Option<Weak<PyObjRef>>,
    /// The raw `CUstream`, kept after `close()` so that the hash never changes.
    pub(crate) raw: usize,
    /// The process-wide default-stream singletons cannot be closed.
    pub(crate) singleton: bool,
}

impl PyStream {
    pub(crate) fn new(handle: StreamHandle) -> PyStream {
        PyStream {
            raw: handle.raw() as usize,
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
}

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
}

impl PyGraphBuilder {
    /// The builder; `RuntimeError("Graph builder has been closed.")` once closed.
    pub(crate) fn builder(&self) -> PyResult<Arc<GraphBuilder>> {
        self.builder
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
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
    })
}

/// Memory with the deallocation recipe (stream and context) that will order and legalise its
/// free.
///
/// Made by ``MemoryResource.allocate`` or ``Buffer.from_handle``; cannot be instantiated
/// directly (``RuntimeError``). Any thread may use, close or drop it. Closed objects raise
/// ``RuntimeError("Buffer has been closed")`` except for ``close()``, ``handle``, ``size``,
/// ``is_closed``, ``memory_resource``, ``owner``, ``is_mapped`` and ``repr``. Sizes are in
/// bytes.
///
/// A reference cycle through a buffer (an ``owner=`` or a memory resource that holds the
/// buffer) is collected by ``gc.collect()``; a free through a Python ``deallocate`` then runs
/// before any object of the cycle is cleared, with the recorded stream and the recipe's
/// context.
///
/// ``pickle`` (and ``multiprocessing``) send a buffer of an IPC-enabled
/// ``DeviceMemoryResource`` or ``PinnedMemoryResource`` as ``(mr, ipc_descriptor)``; unpickling
/// imports it with ``stream=default_stream()``, first making ``Device(mr.device_id)`` (device 0
/// for a pinned pool) current when no context is. ``RuntimeError`` for a closed buffer or a
/// pool without IPC; ``TypeError`` for a buffer of any other resource (or none).
//
// The recipe is docs/decisions.md D1. Cyclic garbage collection (D10): the object reports the
// Python objects it holds to the collector (its memory resource object, and, while it alone
// holds the memory, the owner or the Python resource that the memory's handle keeps); memory
// whose free calls a Python `deallocate` is freed by `__del__`, which CPython runs on every
// object of a garbage cycle before it clears any, so `deallocate` finds its resource intact;
// any other memory is freed by `__clear__` (the free first, with its recipe and its resource,
// then the memory resource object is let go).
#[pyclass(frozen, subclass, weakref, name = "Buffer", module = "custody")]
pub struct PyBuffer {
    /// Always `Some` until the object is deallocated (then taken, to drop it with the GIL
    /// released).
    pub(crate) inner: Option<SharedBuffer>,
    /// The memory resource object, reported while the buffer is open; let go by `__clear__`
    /// after the free. Never made or dropped under the lock.
    pub(crate) mr: Mutex<Option<Py<PyAny>>>,
    /// The Python objects the memory's handle holds strongly.
    pub(crate) kept: Kept,
    /// `(address, size)` when made: what equality and the hash compare (kept after `close()`,
    /// so that the hash never changes).
    pub(crate) identity: (u64, usize),
}

/// The Python objects a buffer's memory handle holds, seen through `Weak`s: for the `owner`
/// property and for the collector.
#[derive(Default)]
pub(crate) struct Kept {
    /// The owner given to `from_handle(owner=...)`.
    pub(crate) owner: Option<Weak<PyObjRef>>,
    /// The Python memory resource whose `deallocate` frees the memory.
    pub(crate) resource: Option<Weak<PyObjRef>>,
}

/// A :class:`Buffer` of managed memory (``ManagedMemoryResource.allocate``).
#[pyclass(frozen, extends = PyBuffer, name = "ManagedBuffer", module = "custody")]
pub struct PyManagedBuffer;

impl PyBuffer {
    /// The Python object for `buffer` (a `ManagedBuffer` when `managed`).
    pub(crate) fn wrap(
        py: Python<'_>,
        buffer: Buffer,
        mr: Option<Py<PyAny>>,
        managed: bool,
        kept: Kept,
    ) -> PyResult<Py<PyAny>> {
        let base = PyBuffer {
            identity: (buffer.ptr(), buffer.size()),
            inner: Some(SharedBuffer::new(buffer)),
            mr: Mutex::new(mr),
            kept,
        };
        if managed {
            let init = PyClassInitializer::from(base).add_subclass(PyManagedBuffer);
            Ok(Py::new(py, init)?.into_any())
        } else {
            Ok(Py::new(py, base)?.into_any())
        }
    }

    /// A buffer of zero bytes from `mr` (address 0; no driver call, nothing to free), as
    /// `allocate(0)` returns. Where its memory could be used is `mr`'s.
    pub(crate) fn empty(
        py: Python<'_>,
        mr: Option<Py<PyAny>>,
        managed: bool,
    ) -> PyResult<Py<PyAny>> {
        let handle = unowned_handle(0, 0, None).map_err(Error::from)?;
        PyBuffer::wrap(
            py,
            Buffer::from_parts(handle, None),
            mr,
            managed,
            Kept::default(),
        )
    }

    #[inline]
    pub(crate) fn buffer(&self) -> &SharedBuffer {
        match &self.inner {
            Some(buffer) => buffer,
            None => unreachable!("the buffer is taken only when the object is deallocated"),
        }
    }

    /// The open Rust buffer, for an operation that may release the GIL.
    ///
    /// # Errors
    /// `RuntimeError("Buffer has been closed")`.
    #[inline]
    pub(crate) fn open(&self, py: Python<'_>) -> PyResult<Arc<Buffer>> {
        self.buffer().get(py).map_err(|_| closed("Buffer"))
    }
}

impl Drop for PyBuffer {
    fn drop(&mut self) {
        // Nothing else can reach the state any more: read without its lock.
        let Some(buffer) = self.inner.take().and_then(SharedBuffer::into_open) else {
            return;
        };
        // Deallocation always runs attached; the free itself runs with the GIL released
        // (except on a thread that may not attach again once the interpreter is exiting).
        Python::attach(|py| release(py, move || drop(buffer)));
    }
}
