//! `Context`: a device's primary context or one made elsewhere, and the context functions the
//! Python `Device` class is built on (its primary context, making it current, the current
//! context, synchronising).

use handles::ContextHandle;
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use pyo3::pyclass::CompareOp;
use pyo3::types::PyTuple;

use crate::errors::Error;
use crate::identity::{compare, hash_of};

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
        compare(other, op, |other: &PyContext| self.handle == other.handle)
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
