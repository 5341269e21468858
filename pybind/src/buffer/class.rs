//! The structs of `Buffer` and `ManagedBuffer`, which graphs and resources name (they make
//! buffers), as plain Rust structs: their fields, `Buffer`'s `Drop`, and the constructors and
//! accessors the other modules call. Their `#[pymethods]` blocks are in `methods` and
//! `managed`, with their private helpers.

use std::sync::Arc;

use memory::Buffer;
use pyo3::prelude::*;

use super::shared::SharedBuffer;
use crate::errors::{closed, Error};
use crate::ffi::{unowned_handle, HeldObject};
use crate::report::{release, OwedMark};

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
// any other memory is freed by `__clear__` (with its recipe and its resource); the memory
// resource object goes with the buffer object. `__traverse__` takes no lock: what it reads is
// here as it was made, or read without the lock (`SharedBuffer::held_alone`, `HeldObject`).
#[pyclass(frozen, subclass, weakref, name = "Buffer", module = "custody")]
pub struct PyBuffer {
    /// Always `Some` until the object is deallocated (then taken, to drop it with the GIL
    /// released).
    pub(crate) inner: Option<SharedBuffer>,
    /// The memory resource object, held (and reported to the collector) as long as this object
    /// lives.
    pub(crate) mr: Option<Py<PyAny>>,
    /// The Python objects the memory's handle holds strongly.
    pub(crate) kept: Kept,
    /// `(address, size)` when made: what equality and the hash compare (kept after `close()`,
    /// so that the hash never changes).
    pub(crate) identity: (u64, usize),
}

/// The Python objects a buffer's memory handle holds, as the buffer sees them: for the `owner`
/// property and for the collector.
#[derive(Default)]
pub(crate) struct Kept {
    /// The owner given to `from_handle(owner=...)`.
    pub(crate) owner: Option<HeldObject>,
    /// The Python memory resource whose `deallocate` frees the memory.
    pub(crate) resource: Option<HeldObject>,
    /// For memory freed through a Python `deallocate`: set when this object lets go of the
    /// memory (closed, or the object freed), for the report of frees still owed at exit.
    pub(crate) owed: Option<OwedMark>,
}

impl Kept {
    /// The buffer's Python object let go of the memory (a close, a collection).
    pub(crate) fn let_go(&self) {
        if let Some(owed) = &self.owed {
            owed.let_go();
        }
    }
}

impl Drop for Kept {
    fn drop(&mut self) {
        self.let_go();
    }
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
            mr,
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
