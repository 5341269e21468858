//! cuda.core's options parameters: an options dataclass (custody's, cuda.core's, or a subclass),
//! a dict of its fields, or `None` for the defaults; [`check_options`] accepts or refuses one as
//! cuda.core 1.2 does, and [`option`] reads a field of it. Every family that takes options
//! (streams and events, graphs, memory resources) reads them here.

use pyo3::exceptions::{PyOverflowError, PyTypeError};
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::ffi::{getattr, hasattr};

/// Checks an options parameter as cuda.core 1.2 does before building its options dataclass:
/// `None` (the defaults), an instance of the dataclass named `class` (custody's, cuda.core's,
/// or a subclass), or a dict whose keys are among `fields` (what `class(**dict)` accepts).
/// Every options parameter is checked here before [`option`] reads it; what comes back is the
/// parameter for [`option`] to read, `None` when it was missing or `None`.
///
/// # Errors
/// `TypeError` for a dict key that is not a field (or not a string), and for any other type
/// (an int, a string, an arbitrary object), as cuda.core refuses them.
pub(crate) fn check_options<'a, 'py>(
    options: Option<&'a Bound<'py, PyAny>>,
    class: &str,
    fields: &[&str],
) -> PyResult<Option<&'a Bound<'py, PyAny>>> {
    let Some(options) = options.filter(|o| !o.is_none()) else {
        return Ok(None);
    };
    if let Ok(dict) = options.cast::<PyDict>() {
        for key in dict.keys() {
            let Ok(key) = key.extract::<String>() else {
                return Err(PyTypeError::new_err(format!(
                    "{class}: option names (dict keys) must be strings, got {}",
                    key.get_type().name()?
                )));
            };
            if !fields.contains(&key.as_str()) {
                return Err(PyTypeError::new_err(format!(
                    "{class}.__init__() got an unexpected keyword argument '{key}' (its fields: \
                     {})",
                    fields.join(", ")
                )));
            }
        }
        return Ok(Some(options));
    }
    for base in options.get_type().mro() {
        if base.getattr("__name__")?.extract::<String>()? == class {
            return Ok(Some(options));
        }
    }
    Err(PyTypeError::new_err(format!(
        "options must be provided as an object of type {class} or as a dict with its fields, \
         got {}",
        options.get_type().name()?
    )))
}

/// Reads option `name` from an options object (attribute) or a dict (key), once
/// [`check_options`] accepted it.
pub(crate) fn option<'py, T: pyo3::conversion::FromPyObjectOwned<'py>>(
    options: Option<&Bound<'py, PyAny>>,
    name: &str,
    default: T,
) -> PyResult<T> {
    let Some(options) = options else {
        return Ok(default);
    };
    let value = if let Ok(dict) = options.cast::<PyDict>() {
        dict.get_item(name)?
    } else if hasattr(options, name)? {
        Some(getattr(options, name)?)
    } else {
        None
    };
    match value {
        Some(value) if !value.is_none() => value.extract::<T>().map_err(|error| {
            let error: PyErr = error.into();
            let py = value.py();
            let text = format!("option {name}: {}", error.value(py));
            if error.is_instance_of::<PyOverflowError>(py) {
                PyOverflowError::new_err(text)
            } else {
                PyTypeError::new_err(text)
            }
        }),
        _ => Ok(default),
    }
}
