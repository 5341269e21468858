//! `MemoryResource`'s struct, which every resource extends (the Rust resource of a built-in,
//! whether its buffers are managed, whether `allocate` needs a stream), with the constructors the
//! built-ins use; and a device ordinal argument, as the resources' constructors take it. Its
//! methods are in `methods`.

use std::sync::Arc;

use memory::MemoryResource;
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;

use crate::errors::expected;

/// The base class of memory resources; subclass it in Python.
///
/// A subclass implements ``allocate`` (usually returning ``Buffer.from_handle(ptr, size,
/// mr=self, stream=stream)``), ``deallocate``, ``is_device_accessible``,
/// ``is_host_accessible`` and ``device_id`` (read only when asked, never at adoption). Its
/// ``deallocate`` runs at teardown from whatever thread drops the buffer, with the recipe's
/// context current and the GIL held only for that call; a host-only resource
/// (``is_device_accessible`` False) has no recipe: adoption needs no context, any ``stream``
/// given has nothing to order, and ``deallocate`` receives ``default_stream()`` with no
/// context made current; an exception from it is reported as a :class:`CUDAWarning` (re-raised by an explicit
/// ``close()``). It is never entered on a thread where a ``deallocate`` call is already
/// running: a buffer released inside one (its last reference dropped, a garbage collection, a
/// ``close()``) is freed right after that call returns, on the same thread, in its own recipe's
/// context (a failure then is a :class:`CUDAWarning`). Once the interpreter is finalizing it is
/// not called: the memory is leaked and that is reported on stderr (``atexit`` handlers still
/// free through it).
///
/// ``MemoryResource(*args, **kwargs)`` accepts and ignores any arguments (for subclasses).
#[pyclass(frozen, subclass, weakref, name = "MemoryResource", module = "custody")]
pub struct PyMemoryResource {
    /// The Rust resource of a built-in; `None` for a Python subclass of this class.
    pub(crate) native: Option<Arc<dyn MemoryResource>>,
    /// Whether `allocate` returns `ManagedBuffer`s.
    pub(super) managed: bool,
    /// Whether `allocate` takes no stream (the resource allocates synchronously; the free is
    /// then ordered on the default stream).
    pub(super) stream_optional: bool,
}

/// The `TypeError` of the base class's `what`, naming the class called: `MemoryResource` itself,
/// or a subclass that does not implement `what`.
pub(super) fn not_implemented(class: &str, what: &str) -> PyErr {
    if class == "MemoryResource" {
        PyTypeError::new_err(format!(
            "MemoryResource.{what} must be implemented by subclasses"
        ))
    } else {
        PyTypeError::new_err(format!(
            "{class}.{what} must be implemented: {class} subclasses MemoryResource without \
             defining it"
        ))
    }
}

impl PyMemoryResource {
    pub(super) fn native(&self, what: &str) -> PyResult<&Arc<dyn MemoryResource>> {
        self.native
            .as_ref()
            .ok_or_else(|| not_implemented("MemoryResource", what))
    }

    pub(super) fn builtin(
        native: Arc<dyn MemoryResource>,
        managed: bool,
    ) -> PyClassInitializer<Self> {
        PyClassInitializer::from(PyMemoryResource {
            native: Some(native),
            managed,
            stream_optional: false,
        })
    }

    /// A built-in over another resource's memory (the caching resource): its buffers are
    /// managed, and its stream optional, as `upstream`'s.
    pub(super) fn over(
        native: Arc<dyn MemoryResource>,
        upstream: &PyMemoryResource,
    ) -> PyClassInitializer<Self> {
        PyClassInitializer::from(PyMemoryResource {
            native: Some(native),
            managed: upstream.managed,
            stream_optional: upstream.stream_optional,
        })
    }

    /// A built-in whose `allocate` takes an optional stream (a synchronous allocator).
    pub(super) fn synchronous(native: Arc<dyn MemoryResource>) -> PyClassInitializer<Self> {
        PyClassInitializer::from(PyMemoryResource {
            native: Some(native),
            managed: false,
            stream_optional: true,
        })
    }
}

/// A device ordinal given as an `int` or a `Device`.
pub(super) fn device_ordinal(device: &Bound<'_, PyAny>) -> PyResult<i32> {
    if device.is_none() {
        return Err(PyTypeError::new_err(
            "a device (int or Device) is required, got None",
        ));
    }
    let value = if device.hasattr("device_id")? && !device.is_instance_of::<pyo3::types::PyInt>() {
        device.getattr("device_id")?
    } else {
        device.clone()
    };
    let ordinal: i64 = value
        .extract()
        .map_err(|_| expected("device ordinal (int) or Device", device))?;
    if ordinal < 0 {
        return Err(PyValueError::new_err(format!(
            "a device ordinal is not negative, got {ordinal}"
        )));
    }
    i32::try_from(ordinal)
        .map_err(|_| PyValueError::new_err(format!("device ordinal {ordinal} is out of range")))
}
