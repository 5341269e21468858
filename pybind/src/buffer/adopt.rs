//! `Buffer.from_handle` / `ManagedBuffer.from_handle`: memory allocated elsewhere, adopted with a
//! memory resource that frees it, kept alive by an owner, or viewed; the address argument as
//! cuda.core accepts it.

use std::sync::Arc;

use handles::StreamHandle;
use memory::{Buffer, ManagedBuffer, MemoryError};
use pyo3::exceptions::{PyOverflowError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyInt;

use super::class::{Kept, PyBuffer};
use crate::errors::{expected, Error};
use crate::ffi::{call_method, hasattr, owned_allocation, unowned_handle, HeldObject};
use crate::report::PyObjRef;
use crate::resource::adapter::resolve;
use crate::stream::accept::{accept_stream, default_stream_handle};

/// `Buffer.from_handle` / `ManagedBuffer.from_handle`.
#[allow(clippy::too_many_arguments)]
pub(super) fn adopt(
    py: Python<'_>,
    ptr: u64,
    size: usize,
    mr: Option<&Bound<'_, PyAny>>,
    owner: Option<&Bound<'_, PyAny>>,
    stream: Option<&Bound<'_, PyAny>>,
    managed: bool,
) -> PyResult<Py<PyAny>> {
    let mr = mr.filter(|o| !o.is_none());
    let owner = owner.filter(|o| !o.is_none());
    let stream = stream.filter(|o| !o.is_none());
    // First, as `allocate` does: no memory is larger (nothing is kept, `deallocate` not called).
    if size > isize::MAX as usize {
        return Err(Error::from(MemoryError::InvalidSize {
            size,
            reason: "no allocation can exceed isize::MAX bytes",
        })
        .into());
    }
    if ptr.checked_add(size as u64).is_none() {
        return Err(PyValueError::new_err(format!(
            "the range of {size} bytes at 0x{ptr:x} wraps past the end of the address space \
             (ptr + size must be below 2**64)"
        )));
    }
    if mr.is_some() && owner.is_some() {
        return Err(PyValueError::new_err(
            "owner and memory resource cannot be both specified together: with mr the buffer \
             owns the memory, with owner it only keeps the owner alive",
        ));
    }
    if stream.is_some() && mr.is_none() {
        return Err(PyValueError::new_err(
            "stream requires a memory resource (mr): a stream orders a free, and without mr \
             nothing is freed",
        ));
    }
    let recorded: Option<StreamHandle> = match (stream, mr) {
        (Some(stream), _) => Some(accept_stream(stream)?),
        (None, Some(_)) => Some(default_stream_handle()),
        (None, None) => None,
    };
    if let Some(mr) = mr {
        let (native, python) = resolve(mr, ptr, size)?;
        let (resource, owed) = python.unzip();
        let kept = Kept {
            owner: None,
            resource,
            owed,
        };
        let buffer = py
            .detach(move || {
                let allocation = owned_allocation(ptr, size);
                let adopted = if managed {
                    ManagedBuffer::adopt(allocation, native, recorded.as_ref())
                        .map(ManagedBuffer::into_buffer)
                } else {
                    Buffer::adopt(allocation, native, recorded.as_ref())
                };
                // A refused adoption takes nothing: the pointer stays the caller's.
                adopted.map_err(|refused| {
                    let _ = refused.allocation.into_raw();
                    refused.error
                })
            })
            .map_err(Error::from)?;
        return PyBuffer::wrap(py, buffer, Some(mr.clone().unbind()), managed, kept);
    }
    let (owner_box, kept) = match owner {
        Some(owner) => {
            let held = Arc::new(PyObjRef::new(owner.clone().unbind()));
            let kept = Kept {
                owner: Some(HeldObject::new(&held)),
                resource: None,
                owed: None,
            };
            let owner_box: Box<dyn std::any::Any + Send + Sync> = Box::new(held);
            (Some(owner_box), kept)
        }
        None => (None, Kept::default()),
    };
    let handle = unowned_handle(ptr, size, owner_box).map_err(Error::from)?;
    let buffer = if managed {
        ManagedBuffer::from_parts(handle, None).into_buffer()
    } else {
        Buffer::from_parts(handle, None)
    };
    PyBuffer::wrap(py, buffer, None, managed, kept)
}

/// `from_handle`'s positional parameters (its `stream` is keyword-only).
pub(super) const FROM_HANDLE: &[&str] = &["ptr", "size", "mr=None", "owner=None"];

/// An address given as a pointer-like value, as cuda.core accepts it: an `int`, or an object
/// with `__index__` or `__int__` (`cuda.bindings.driver.CUdeviceptr`, a NumPy integer); not a
/// `float`.
pub(super) fn address(object: &Bound<'_, PyAny>) -> PyResult<u64> {
    if object.is_none() {
        return Err(PyTypeError::new_err(
            "a pointer (int) is required, got None",
        ));
    }
    let py = object.py();
    let value = if object.is_instance_of::<PyInt>() {
        object.clone()
    } else if hasattr(object, "__index__")? {
        call_method(object, "__index__", (), None)?
    } else if hasattr(object, "__int__")? && !object.is_instance_of::<pyo3::types::PyFloat>() {
        call_method(object, "__int__", (), None)?
    } else {
        return Err(expected("pointer (int, or an object with __int__)", object));
    };
    value.extract::<u64>().map_err(|error| {
        if error.is_instance_of::<PyOverflowError>(py) {
            PyOverflowError::new_err(format!(
                "a pointer is an unsigned 64-bit int, got {}",
                // The int the object gave (its `__index__` or `__int__`), not the object.
                value.repr().map(|r| r.to_string()).unwrap_or_default()
            ))
        } else {
            expected("pointer (int, or an object with __int__)", object)
        }
    })
}
