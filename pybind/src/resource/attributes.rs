//! A pool's attributes (`MemoryPoolAttributes`) and a device's graph memory use
//! (`GraphMemoryResourceAttributes`), read from the driver when asked.

use handles::{MemoryPoolHandle, PoolAttribute, PoolAttributeValue};
use pyo3::prelude::*;
use pyo3::types::PyTuple;

use crate::errors::Error;

/// A memory pool's attributes, read from the driver (``cuMemPoolGetAttribute``, the GIL
/// released) on each access; sizes in bytes. Reading one raises :class:`CUDAError` on a driver
/// failure. The repr lists every attribute with its value. Cannot be instantiated directly:
/// ``DeviceMemoryResource.attributes``, ``PinnedMemoryResource.attributes``.
#[pyclass(frozen, weakref, name = "MemoryPoolAttributes", module = "custody")]
pub struct PyPoolAttributes {
    pub(super) pool: MemoryPoolHandle,
}

impl PyPoolAttributes {
    /// One attribute, typed by its value's width (so a flag is never read into 8 bytes'
    /// worth of buffer, nor a counter into 4).
    fn read<T: PoolAttributeValue + Send>(
        &self,
        py: Python<'_>,
        attribute: PoolAttribute<T>,
    ) -> PyResult<T> {
        let pool = self.pool.clone();
        Ok(py
            .detach(move || pool.attribute(attribute))
            .map_err(Error::from)?)
    }
}

#[pymethods]
impl PyPoolAttributes {
    /// Bytes allocated from the pool and not freed (``CU_MEMPOOL_ATTR_USED_MEM_CURRENT``).
    #[getter]
    fn used_mem_current(&self, py: Python<'_>) -> PyResult<u64> {
        self.read(py, PoolAttribute::USED_MEM_CURRENT)
    }

    /// The high-water mark of ``used_mem_current``, in bytes (``CU_MEMPOOL_ATTR_USED_MEM_HIGH``).
    #[getter]
    fn used_mem_high(&self, py: Python<'_>) -> PyResult<u64> {
        self.read(py, PoolAttribute::USED_MEM_HIGH)
    }

    /// Bytes the pool holds from the driver (``CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT``).
    #[getter]
    fn reserved_mem_current(&self, py: Python<'_>) -> PyResult<u64> {
        self.read(py, PoolAttribute::RESERVED_MEM_CURRENT)
    }

    /// The high-water mark of ``reserved_mem_current``, in bytes
    /// (``CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH``).
    #[getter]
    fn reserved_mem_high(&self, py: Python<'_>) -> PyResult<u64> {
        self.read(py, PoolAttribute::RESERVED_MEM_HIGH)
    }

    /// Bytes the pool keeps after a synchronisation before memory goes back to the OS
    /// (``CU_MEMPOOL_ATTR_RELEASE_THRESHOLD``).
    #[getter]
    fn release_threshold(&self, py: Python<'_>) -> PyResult<u64> {
        self.read(py, PoolAttribute::RELEASE_THRESHOLD)
    }

    /// Whether memory freed on one stream may be reused on a stream that waits on an event recorded
    /// after the free (``CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES``).
    #[getter]
    fn reuse_follow_event_dependencies(&self, py: Python<'_>) -> PyResult<bool> {
        self.read(py, PoolAttribute::REUSE_FOLLOW_EVENT_DEPENDENCIES)
    }

    /// Whether memory whose free has completed may be reused without a dependency
    /// (``CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC``).
    #[getter]
    fn reuse_allow_opportunistic(&self, py: Python<'_>) -> PyResult<bool> {
        self.read(py, PoolAttribute::REUSE_ALLOW_OPPORTUNISTIC)
    }

    /// Whether the driver may insert dependencies between streams to reuse memory
    /// (``CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES``).
    #[getter]
    fn reuse_allow_internal_dependencies(&self, py: Python<'_>) -> PyResult<bool> {
        self.read(py, PoolAttribute::REUSE_ALLOW_INTERNAL_DEPENDENCIES)
    }

    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        Ok(format!(
            "MemoryPoolAttributes(release_threshold={}, reserved_mem_current={}, \
             reserved_mem_high={}, reuse_allow_internal_dependencies={}, \
             reuse_allow_opportunistic={}, reuse_follow_event_dependencies={}, \
             used_mem_current={}, used_mem_high={})",
            self.release_threshold(py)?,
            self.reserved_mem_current(py)?,
            self.reserved_mem_high(py)?,
            py_bool(self.reuse_allow_internal_dependencies(py)?),
            py_bool(self.reuse_allow_opportunistic(py)?),
            py_bool(self.reuse_follow_event_dependencies(py)?),
            self.used_mem_current(py)?,
            self.used_mem_high(py)?,
        ))
    }
}

/// `True` / `False`, as Python writes a bool.
fn py_bool(value: bool) -> &'static str {
    if value {
        "True"
    } else {
        "False"
    }
}

/// `CUgraphMem_attribute` numbers.
const GRAPH_MEM_USED: u32 = 0;

const GRAPH_MEM_USED_HIGH: u32 = 1;

const GRAPH_MEM_RESERVED: u32 = 2;

const GRAPH_MEM_RESERVED_HIGH: u32 = 3;

/// A device's graph memory use in bytes, read when asked; the high water marks can be reset
/// to 0 (``AttributeError`` for another value, or for setting the current values). Cannot be
/// instantiated directly (``RuntimeError``).
#[pyclass(frozen, name = "GraphMemoryResourceAttributes", module = "custody")]
pub struct PyGraphMemoryAttributes {
    pub(super) device: i32,
}

impl PyGraphMemoryAttributes {
    fn read(&self, py: Python<'_>, attribute: u32) -> PyResult<u64> {
        let device = self.device;
        Ok(py
            .detach(|| handles::graph_mem_attribute(device, attribute))
            .map_err(Error::from)?)
    }

    fn reset(&self, py: Python<'_>, name: &str, attribute: u32, value: u64) -> PyResult<()> {
        if value != 0 {
            return Err(pyo3::exceptions::PyAttributeError::new_err(format!(
                "Attribute '{name}' may only be set to zero (got {value})."
            )));
        }
        let device = self.device;
        py.detach(|| handles::set_graph_mem_attribute(device, attribute, 0))
            .map_err(Error::from)?;
        Ok(())
    }
}

#[pymethods]
impl PyGraphMemoryAttributes {
    #[new]
    #[pyo3(signature = (*_args, **_kwargs), text_signature = None)]
    fn py_new(_args: &Bound<'_, PyTuple>, _kwargs: Option<&Bound<'_, PyAny>>) -> PyResult<Self> {
        Err(pyo3::exceptions::PyRuntimeError::new_err(
            "GraphMemoryResourceAttributes cannot be instantiated directly. Use \
             GraphMemoryResource(device).attributes.",
        ))
    }

    /// Bytes of graph memory the device holds from the driver.
    #[getter]
    fn reserved_mem_current(&self, py: Python<'_>) -> PyResult<u64> {
        self.read(py, GRAPH_MEM_RESERVED)
    }

    /// The high water mark of ``reserved_mem_current``; settable to 0.
    #[getter]
    fn reserved_mem_high(&self, py: Python<'_>) -> PyResult<u64> {
        self.read(py, GRAPH_MEM_RESERVED_HIGH)
    }

    #[setter]
    fn set_reserved_mem_high(&self, py: Python<'_>, value: u64) -> PyResult<()> {
        self.reset(py, "reserved_mem_high", GRAPH_MEM_RESERVED_HIGH, value)
    }

    /// Bytes of graph memory in use by graphs.
    #[getter]
    fn used_mem_current(&self, py: Python<'_>) -> PyResult<u64> {
        self.read(py, GRAPH_MEM_USED)
    }

    /// The high water mark of ``used_mem_current``; settable to 0.
    #[getter]
    fn used_mem_high(&self, py: Python<'_>) -> PyResult<u64> {
        self.read(py, GRAPH_MEM_USED_HIGH)
    }

    #[setter]
    fn set_used_mem_high(&self, py: Python<'_>, value: u64) -> PyResult<()> {
        self.reset(py, "used_mem_high", GRAPH_MEM_USED_HIGH, value)
    }

    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        Ok(format!(
            "GraphMemoryResourceAttributes(reserved_mem_current={}, reserved_mem_high={}, \
             used_mem_current={}, used_mem_high={})",
            self.reserved_mem_current(py)?,
            self.reserved_mem_high(py)?,
            self.used_mem_current(py)?,
            self.used_mem_high(py)?,
        ))
    }
}
