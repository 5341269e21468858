//! `Stream`'s struct, which every family names (a stream argument, a graph builder's captured
//! stream, the stream a Python `deallocate` gets), with its constructor and its handle
//! accessor; its methods are in `methods`.

use std::sync::{Mutex, Weak};

use handles::StreamHandle;
use pyo3::prelude::*;

use crate::errors::closed;
use crate::report::PyObjRef;
use crate::sync::Locked;

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
        self.handle.locked().clone().ok_or_else(|| closed("Stream"))
    }
}
