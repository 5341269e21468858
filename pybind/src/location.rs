//! Managed-memory locations between Python and Rust: a `Device` or `Host` argument as a
//! [`MemLocation`] (through the package's `_coerce_location`, which knows both classes), and a
//! location read back from the driver as the `Device` or `Host` object it names.

use handles::MemLocation;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::ffi::call;

/// A location argument; `None` for `None` when `allow_none` (else `ValueError`), `TypeError`
/// for anything that is neither a `Device` nor a `Host`.
pub(crate) fn location(
    value: &Bound<'_, PyAny>,
    allow_none: bool,
) -> PyResult<Option<MemLocation>> {
    let py = value.py();
    let keywords = PyDict::new(py);
    keywords.set_item("allow_none", allow_none)?;
    let coerce = py.import("custody")?.getattr("_coerce_location")?;
    let spec = call(&coerce, (value,), Some(&keywords))?;
    if spec.is_none() {
        return Ok(None);
    }
    let kind: String = spec.getattr("kind")?.extract()?;
    let id: i32 = spec.getattr("id")?.extract()?;
    Ok(Some(match kind.as_str() {
        "device" => MemLocation::Device(id),
        "host" => MemLocation::Host,
        "host_numa" => MemLocation::HostNuma(id),
        "host_numa_current" => MemLocation::HostNumaCurrent,
        other => {
            return Err(PyValueError::new_err(format!(
                "unknown location kind {other:?}"
            )))
        }
    }))
}

/// A location argument that must name one.
pub(crate) fn required_location(value: &Bound<'_, PyAny>) -> PyResult<MemLocation> {
    match location(value, false)? {
        Some(location) => Ok(location),
        None => unreachable!("_coerce_location refuses None unless allowed"),
    }
}

/// The kind name of a location, as the messages and `_coerce_location` spell it.
pub(crate) fn kind_name(location: MemLocation) -> &'static str {
    match location {
        MemLocation::Device(_) => "device",
        MemLocation::Host => "host",
        MemLocation::HostNuma(_) => "host_numa",
        MemLocation::HostNumaCurrent => "host_numa_current",
    }
}

/// The `Device` or `Host` object for a location (`None` for none).
pub(crate) fn location_object(
    py: Python<'_>,
    location: Option<MemLocation>,
) -> PyResult<Py<PyAny>> {
    let Some(location) = location else {
        return Ok(py.None());
    };
    let id = match location {
        MemLocation::Device(id) | MemLocation::HostNuma(id) => id,
        MemLocation::Host | MemLocation::HostNumaCurrent => 0,
    };
    let make = py.import("custody")?.getattr("_location_object")?;
    Ok(call(&make, (kind_name(location), id), None)?.unbind())
}
