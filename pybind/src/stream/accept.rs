//! How a stream argument is accepted: a `Stream`, a `GraphBuilder` (its captured stream), or
//! any object with `__cuda_stream__` (wrapped, kept alive while the wrapper lives); a stream
//! given as a handle (`Stream.from_handle`); and the default stream as a handle, for the
//! arguments that default to it.

use std::sync::{Arc, Weak};

use handles::StreamHandle;
use pyo3::exceptions::{PyOverflowError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyTuple, PyType};

use super::class::PyStream;
use crate::errors::{closed, expected, refuse_positional_stream, Error};
use crate::graph::class::PyGraphBuilder;
use crate::report::PyObjRef;
use crate::sync::Locked;

/// Accepts a stream argument: a `Stream`, a `GraphBuilder` (its captured stream), or an object
/// with `__cuda_stream__` (wrapped, kept alive while the wrapper lives).
///
/// # Errors
/// `TypeError` for `None` or anything else; `RuntimeError` for a closed stream; what the
/// protocol object or the driver raises.
pub(crate) fn accept_stream(object: &Bound<'_, PyAny>) -> PyResult<StreamHandle> {
    if let Ok(stream) = object.cast::<PyStream>() {
        return stream.get().handle();
    }
    if let Ok(builder) = object.cast::<PyGraphBuilder>() {
        return builder.get().stream_handle();
    }
    if object.is_none() {
        return Err(stream_required());
    }
    if crate::ffi::hasattr(object, "__cuda_stream__")? {
        return Ok(wrap_protocol(object)?.0);
    }
    Err(expected(
        "Stream (or an object with __cuda_stream__)",
        object,
    ))
}

/// The `TypeError` for a missing or `None` stream where one is required.
pub(crate) fn stream_required() -> PyErr {
    PyTypeError::new_err(
        "stream is required and must not be None: pass a Stream explicitly, e.g. \
         Device().create_stream() or custody.default_stream()",
    )
}

/// A keyword-only `stream` that a method's signature lets default to `None`, so that one passed
/// by position reaches the method (and gets [`refuse_positional_stream`]'s message, after
/// `extra` collected it) instead of pyo3's: `None` here, given or missing, is refused as
/// [`accept_stream`] refuses it.
///
/// [`refuse_positional_stream`]: crate::errors::refuse_positional_stream
pub(crate) fn required_stream<'py>(
    stream: Option<&Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyAny>> {
    match stream {
        Some(stream) if !stream.is_none() => Ok(stream.clone()),
        _ => Err(stream_required()),
    }
}

/// The keyword-only `stream` of `on.method(<positional>, *extra, stream=...)`: refused when
/// passed by position ([`refuse_positional_stream`]), then as [`required_stream`] refuses it.
pub(crate) fn keyword_stream<'py>(
    on: &Bound<'_, PyAny>,
    method: &str,
    positional: &[&str],
    extra: &Bound<'_, PyTuple>,
    stream: Option<&Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyAny>> {
    refuse_positional_stream(on, method, positional, extra)?;
    required_stream(stream)
}

/// Runs `f` with a stream argument's handle borrowed, for an operation that makes no driver
/// call and runs no Python code: a `Stream`'s handle under its lock, neither cloned nor
/// released (two atomic operations fewer than [`accept_stream`]); anything else accepted as
/// [`accept_stream`] does. `f` must not release the GIL: a `close()` of the stream on another
/// thread waits for the lock while attached.
///
/// # Errors
/// As [`accept_stream`].
pub(crate) fn with_stream<R>(
    object: &Bound<'_, PyAny>,
    f: impl FnOnce(&StreamHandle) -> R,
) -> PyResult<R> {
    if let Ok(stream) = object.cast::<PyStream>() {
        let guard = stream.get().handle.locked();
        return match guard.as_ref() {
            Some(handle) => Ok(f(handle)),
            None => {
                drop(guard);
                Err(closed("Stream"))
            }
        };
    }
    let handle = accept_stream(object)?;
    Ok(f(&handle))
}

/// Wraps an object implementing the `__cuda_stream__` protocol (`(version, handle)`); the
/// handle keeps the object, seen through the returned `Weak`.
pub(super) fn wrap_protocol(object: &Bound<'_, PyAny>) -> PyResult<(StreamHandle, Weak<PyObjRef>)> {
    if let Ok(class) = object.cast::<PyType>() {
        // The class has `__cuda_stream__` too; calling it would say "unbound method ... needs
        // an argument", naming neither the argument nor the mistake.
        return Err(PyTypeError::new_err(format!(
            "a stream (a Stream, or an object with __cuda_stream__) expected, got the class {} \
             itself: pass an instance, e.g. Device().create_stream()",
            class.name()?
        )));
    }
    let info = crate::ffi::call_method(object, "__cuda_stream__", (), None)?;
    let tuple = info.cast::<PyTuple>().map_err(|_| {
        PyTypeError::new_err("__cuda_stream__ must return a (version, handle) tuple")
    })?;
    if tuple.len() != 2 {
        return Err(PyTypeError::new_err(
            "__cuda_stream__ must return a (version, handle) tuple",
        ));
    }
    let version: i64 = tuple.get_item(0)?.extract()?;
    if version != 0 {
        return Err(PyValueError::new_err(format!(
            "__cuda_stream__ protocol version {version} is not supported (0 is)"
        )));
    }
    let raw = handle_value(
        &tuple.get_item(1)?,
        " (the handle __cuda_stream__ returned)",
    )?;
    let owner = Arc::new(PyObjRef::new(object.clone().unbind()));
    let weak = Arc::downgrade(&owner);
    let stream = object
        .py()
        .detach(|| crate::ffi::wrap_foreign_stream(raw, Some(Box::new(owner))))
        .map_err(Error::from)?;
    // A stream custody made comes back as its own handle, and the owner is dropped: the weak
    // reference is dead then.
    Ok((stream, weak))
}

/// Wraps a stream given as an `int` handle or an object with `__cuda_stream__` (then also the
/// `Weak` through which the handle's reference to it is seen).
pub(super) fn stream_from_handle(
    py: Python<'_>,
    handle: &Bound<'_, PyAny>,
) -> PyResult<(StreamHandle, Option<Weak<PyObjRef>>)> {
    if handle.is_none() {
        return Err(PyTypeError::new_err(
            "a stream handle (int) is required, got None",
        ));
    }
    if crate::ffi::hasattr(handle, "__cuda_stream__")? {
        let (stream, protocol) = wrap_protocol(handle)?;
        return Ok((stream, Some(protocol)));
    }
    let raw = handle_value(handle, "")?;
    let stream = py
        .detach(|| crate::ffi::wrap_foreign_stream(raw, None))
        .map_err(Error::from)?;
    Ok((stream, None))
}

/// A stream handle given as an int (`source` says where it came from, for the message):
/// `OverflowError` naming it for a negative or too large value (pyo3's own conversion says only
/// "can't convert negative int to unsigned"), `TypeError` for anything but an int.
fn handle_value(value: &Bound<'_, PyAny>, source: &str) -> PyResult<usize> {
    value.extract::<usize>().map_err(|error| {
        if error.is_instance_of::<PyOverflowError>(value.py()) {
            PyOverflowError::new_err(format!(
                "a stream handle is an unsigned 64-bit int{source}, got {}",
                value.repr().map(|r| r.to_string()).unwrap_or_default()
            ))
        } else {
            expected(&format!("int stream handle{source}"), value)
        }
    })
}

/// Whether `CUDA_PYTHON_CUDA_PER_THREAD_DEFAULT_STREAM` selects the per-thread default stream:
/// its value read as C's `strtol` would (leading blanks, a sign, digits; "123foo" is 123) is not
/// zero. Read on every call.
pub(crate) fn per_thread_selected() -> bool {
    let Ok(value) = std::env::var("CUDA_PYTHON_CUDA_PER_THREAD_DEFAULT_STREAM") else {
        return false;
    };
    let text = value.trim_start();
    let digits = text.strip_prefix(['+', '-']).unwrap_or(text);
    digits
        .chars()
        .take_while(char::is_ascii_digit)
        .any(|c| c != '0')
}

/// The default stream as a handle (for `Buffer.from_handle` without `stream`).
pub(crate) fn default_stream_handle() -> StreamHandle {
    if per_thread_selected() {
        StreamHandle::per_thread()
    } else {
        StreamHandle::legacy()
    }
}
