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

/// The `#[pymethods]` of an attribute class (`$class`, named `$name` in Python, with a `read`
/// that takes `py` and an attribute): a getter for each attribute listed, its doc comment the
/// property's docstring, reading the attribute with `read` (the GIL released there); the
/// methods `$methods` as written; and a `__repr__` that lists every attribute with its value as
/// Python writes it, `Name(a=1, b=True)`, in the order listed (alphabetical), raising the first
/// read's error.
macro_rules! attribute_class {
    (
        $class:ident, $name:literal,
        [$($(#[doc = $doc:literal])* $attribute:ident: $type:ty = $which:expr;)+]
        $($methods:tt)*
    ) => {
        #[pymethods]
        impl $class {
            $(
                $(#[doc = $doc])*
                #[getter]
                fn $attribute(&self, py: Python<'_>) -> PyResult<$type> {
                    self.read(py, $which)
                }
            )+

            $($methods)*

            fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
                let values = [$(format!(
                    "{}={}",
                    stringify!($attribute),
                    PyRepr::py_repr(&self.$attribute(py)?)
                )),+];
                Ok(format!("{}({})", $name, values.join(", ")))
            }
        }
    };
}

/// An attribute's value as Python's `repr` writes it.
trait PyRepr {
    fn py_repr(&self) -> String;
}

impl PyRepr for u64 {
    fn py_repr(&self) -> String {
        self.to_string()
    }
}

impl PyRepr for bool {
    /// `True` / `False`.
    fn py_repr(&self) -> String {
        String::from(if *self { "True" } else { "False" })
    }
}

attribute_class!(
    PyPoolAttributes,
    "MemoryPoolAttributes",
    [
        /// Bytes the pool keeps after a synchronisation before memory goes back to the OS
        /// (``CU_MEMPOOL_ATTR_RELEASE_THRESHOLD``).
        release_threshold: u64 = PoolAttribute::RELEASE_THRESHOLD;
        /// Bytes the pool holds from the driver (``CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT``).
        reserved_mem_current: u64 = PoolAttribute::RESERVED_MEM_CURRENT;
        /// The high-water mark of ``reserved_mem_current``, in bytes
        /// (``CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH``).
        reserved_mem_high: u64 = PoolAttribute::RESERVED_MEM_HIGH;
        /// Whether the driver may insert dependencies between streams to reuse memory
        /// (``CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES``).
        reuse_allow_internal_dependencies: bool = PoolAttribute::REUSE_ALLOW_INTERNAL_DEPENDENCIES;
        /// Whether memory whose free has completed may be reused without a dependency
        /// (``CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC``).
        reuse_allow_opportunistic: bool = PoolAttribute::REUSE_ALLOW_OPPORTUNISTIC;
        /// Whether memory freed on one stream may be reused on a stream that waits on an event recorded
        /// after the free (``CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES``).
        reuse_follow_event_dependencies: bool = PoolAttribute::REUSE_FOLLOW_EVENT_DEPENDENCIES;
        /// Bytes allocated from the pool and not freed (``CU_MEMPOOL_ATTR_USED_MEM_CURRENT``).
        used_mem_current: u64 = PoolAttribute::USED_MEM_CURRENT;
        /// The high-water mark of ``used_mem_current``, in bytes (``CU_MEMPOOL_ATTR_USED_MEM_HIGH``).
        used_mem_high: u64 = PoolAttribute::USED_MEM_HIGH;
    ]
);

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

attribute_class!(
    PyGraphMemoryAttributes,
    "GraphMemoryResourceAttributes",
    [
        /// Bytes of graph memory the device holds from the driver.
        reserved_mem_current: u64 = GRAPH_MEM_RESERVED;
        /// The high water mark of ``reserved_mem_current``; settable to 0.
        reserved_mem_high: u64 = GRAPH_MEM_RESERVED_HIGH;
        /// Bytes of graph memory in use by graphs.
        used_mem_current: u64 = GRAPH_MEM_USED;
        /// The high water mark of ``used_mem_current``; settable to 0.
        used_mem_high: u64 = GRAPH_MEM_USED_HIGH;
    ]

    #[new]
    #[pyo3(signature = (*_args, **_kwargs), text_signature = None)]
    fn py_new(_args: &Bound<'_, PyTuple>, _kwargs: Option<&Bound<'_, PyAny>>) -> PyResult<Self> {
        Err(pyo3::exceptions::PyRuntimeError::new_err(
            "GraphMemoryResourceAttributes cannot be instantiated directly. Use \
             GraphMemoryResource(device).attributes.",
        ))
    }

    #[setter]
    fn set_reserved_mem_high(&self, py: Python<'_>, value: u64) -> PyResult<()> {
        self.reset(py, "reserved_mem_high", GRAPH_MEM_RESERVED_HIGH, value)
    }

    #[setter]
    fn set_used_mem_high(&self, py: Python<'_>, value: u64) -> PyResult<()> {
        self.reset(py, "used_mem_high", GRAPH_MEM_USED_HIGH, value)
    }
);
