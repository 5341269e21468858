//! The built-ins whose allocation is synchronous: `LegacyPinnedMemoryResource`
//! (`cuMemAllocHost`), `LegacyManagedMemoryResource` (`cuMemAllocManaged`) and
//! `SynchronousMemoryResource` (`cuMemAlloc`).

use memory::{LegacyPinnedMemoryResource, ManagedMemoryResource, SynchronousMemoryResource};
use pyo3::prelude::*;

use super::class::{device_ordinal, PyMemoryResource};
use crate::errors::Error;

/// Pinned host memory from ``cuMemAllocHost``; ``LegacyPinnedMemoryResource()`` makes no driver
/// call. ``allocate``'s ``stream`` may be omitted (the free is then ordered on the default
/// stream). A drop never waits: the free runs on the cleanup worker after the recorded stream's
/// work.
#[pyclass(frozen, extends = PyMemoryResource, subclass, name = "LegacyPinnedMemoryResource", module = "custody")]
pub struct PyLegacyPinnedMemoryResource;

#[pymethods]
impl PyLegacyPinnedMemoryResource {
    #[new]
    fn py_new() -> PyClassInitializer<Self> {
        PyMemoryResource::synchronous(LegacyPinnedMemoryResource::new()).add_subclass(Self)
    }
}

/// Managed memory from ``cuMemAllocManaged`` (attached globally; any CUDA 12 driver), in the
/// context of ``allocate``'s stream; ``allocate`` returns :class:`ManagedBuffer`. The pointers
/// carry ``CU_POINTER_ATTRIBUTE_IS_MANAGED``. Dropping a buffer never waits: the free
/// (``cuMemFree``) runs on the cleanup worker after the recorded stream's work; an explicit
/// ``close`` or ``deallocate`` waits for the stream first. ``LegacyManagedMemoryResource()``
/// makes no driver call. Not in cuda.core, whose managed resource is
/// :class:`ManagedMemoryResource` (a managed pool, CUDA 13).
#[pyclass(frozen, extends = PyMemoryResource, subclass, name = "LegacyManagedMemoryResource", module = "custody")]
pub struct PyLegacyManagedMemoryResource;

#[pymethods]
impl PyLegacyManagedMemoryResource {
    #[new]
    fn py_new() -> PyClassInitializer<Self> {
        PyMemoryResource::builtin(ManagedMemoryResource::new(), true).add_subclass(Self)
    }
}

/// Device memory from ``cuMemAlloc`` in the device's primary context: no context need be
/// current; a default stream is replaced by the legacy stream bound to that context, and
/// ``allocate``'s ``stream`` may be omitted. ``SynchronousMemoryResource(device_id)`` retains
/// the device's primary context: ``TypeError`` or ``ValueError`` for a bad ordinal,
/// :class:`CUDAError` for a device the driver does not have.
#[pyclass(frozen, extends = PyMemoryResource, subclass, name = "SynchronousMemoryResource", module = "custody")]
pub struct PySynchronousMemoryResource;

#[pymethods]
impl PySynchronousMemoryResource {
    #[new]
    fn py_new(py: Python<'_>, device_id: &Bound<'_, PyAny>) -> PyResult<PyClassInitializer<Self>> {
        let ordinal = device_ordinal(device_id)?;
        let inner = py
            .detach(|| SynchronousMemoryResource::new(ordinal))
            .map_err(Error::from)?;
        Ok(PyMemoryResource::synchronous(inner).add_subclass(Self))
    }
}
