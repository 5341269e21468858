//! `GraphMemoryResource`: allocations on a stream that is being captured (its
//! `allocate` on a `GraphBuilder` is in `methods`).

use memory::GraphMemoryResource;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};

use super::attributes::PyGraphMemoryAttributes;
use super::class::{device_ordinal, PyMemoryResource};
use crate::errors::Error;

/// Graph memory: allocations on a stream that is being captured.
#[pyclass(frozen, extends = PyMemoryResource, subclass, name = "GraphMemoryResource", module = "custody")]
pub struct PyGraphMemoryResource;

#[pymethods]
impl PyGraphMemoryResource {
    #[new]
    #[pyo3(signature = (device_id, *_args, **_kwargs))]
    fn py_new(
        device_id: &Bound<'_, PyAny>,
        _args: &Bound<'_, PyTuple>,
        _kwargs: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<PyClassInitializer<Self>> {
        let ordinal = device_ordinal(device_id)?;
        let native = GraphMemoryResource::new(ordinal).map_err(Error::from)?;
        Ok(PyMemoryResource::builtin(native, false).add_subclass(Self))
    }

    /// The device's graph memory use (:class:`GraphMemoryResourceAttributes`,
    /// ``cuDeviceGetGraphMemAttribute``).
    #[getter]
    fn attributes(slf: &Bound<'_, Self>) -> PyResult<PyGraphMemoryAttributes> {
        let base = slf.as_super().get();
        let device = base.native("attributes")?.device_id().unwrap_or(0);
        Ok(PyGraphMemoryAttributes { device })
    }

    /// Returns the graph memory the device keeps cached, and no graph uses, to the OS
    /// (``cuDeviceGraphMemTrim``). :class:`CUDAError` on a driver failure.
    fn trim(slf: &Bound<'_, Self>, py: Python<'_>) -> PyResult<()> {
        let device = slf
            .as_super()
            .get()
            .native("trim")?
            .device_id()
            .unwrap_or(0);
        py.detach(|| handles::graph_mem_trim(device))
            .map_err(Error::from)?;
        Ok(())
    }

    /// Does nothing: graph memory belongs to the graphs.
    fn close(&self) {}
}
