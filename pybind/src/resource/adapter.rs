//! A Python memory resource seen from Rust ([`PyResourceAdapter`]: its `deallocate` called at
//! teardown, one at a time per thread through `nested`), and which Rust resource will own memory
//! adopted with `mr=` ([`resolve`]).

use std::sync::{Arc, Mutex};

use handles::{HandleError, OwnedAllocation, StreamHandle};
use memory::{Accessibility, Buffer, MemoryError, MemoryResource};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use super::class::PyMemoryResource;
use crate::errors::expected;
use crate::ffi::{getattr, HeldObject};
use crate::nested;
use crate::report::{OwedFree, OwedMark, PyObjRef};
use crate::sync::Locked;

/// A Python memory resource seen from Rust: `deallocate` calls the object's `deallocate`
/// (attached to the interpreter for that call only); whether the memory is device-, host- or
/// managed memory is read once, when the buffer is adopted. `device_id` is not read then (it
/// may raise, or not be known yet): the adapter reports none, so no stream is checked against
/// it, and `Buffer.device_id` asks the Python object when asked.
pub(crate) struct PyResourceAdapter {
    object: Arc<PyObjRef>,
    type_name: Arc<str>,
    /// Read when adopted; no `device_id` (see above).
    accessibility: Accessibility,
    /// The one free this adapter's buffer owes through Python (an adapter is made per
    /// adoption), handed to the call when `deallocate` comes.
    owed: Mutex<Option<OwedFree>>,
}

impl MemoryResource for PyResourceAdapter {
    fn allocate_owned(
        self: Arc<Self>,
        _size: usize,
        _stream: &StreamHandle,
    ) -> Result<Buffer, MemoryError> {
        Err(MemoryError::Handle(HandleError::deallocator(format!(
            "{} allocates through Python only",
            self.type_name
        ))))
    }

    fn deallocate(
        &self,
        allocation: OwnedAllocation,
        stream: &StreamHandle,
    ) -> Result<(), MemoryError> {
        // The Python resource frees by its own means: it gets the address and size.
        let (ptr, size) = allocation.into_raw();
        // Queued instead when a Python deallocate is running on this thread (D10).
        nested::deallocate(nested::Deallocate {
            resource: Arc::clone(&self.object),
            type_name: Arc::clone(&self.type_name),
            ptr,
            size,
            // Host-only memory has no recipe: its deallocate gets `default_stream()`, as in
            // cuda.core, and no context is made current for it.
            stream: self.accessibility.device.then(|| stream.clone()),
            owed: self.owed.locked().take(),
        })
        .map_err(|failure| {
            // Raised: the exception travels in the error, for an explicit close to re-raise.
            // Skipped: the interpreter is finalizing (or this thread may not attach any more),
            // the memory is leaked, never freed by half a Python, and the skip is reported.
            MemoryError::Handle(HandleError::deallocator(failure))
        })
    }

    fn accessibility(&self) -> Accessibility {
        self.accessibility
    }

    /// The Python class's name: what reports call the resource.
    fn name(&self) -> &str {
        &self.type_name
    }
}

/// What [`resolve`] finds: the Rust resource, and for an adapter its Python object as the buffer
/// sees it and the mark its buffer sets when it lets go of the memory ([`OwedMark`]).
pub(crate) type Resolved = (Arc<dyn MemoryResource>, Option<(HeldObject, OwedMark)>);

/// The Rust resource that will own memory adopted with `mr=` (`size` bytes at `ptr`): a
/// built-in's own (unless a Python subclass overrides `deallocate`), or an adapter calling the
/// Python object, with the reference the adapter holds as the buffer sees it (for the `owner`
/// property's sibling checks and the collector). An
/// adapter registers the free it will owe through Python ([`OwedFree`]) until its `deallocate`
/// comes, or it is dropped (a refused adoption).
///
/// # Errors
/// `TypeError` when `mr` is not a `MemoryResource`; what reading its properties raises.
pub(crate) fn resolve(mr: &Bound<'_, PyAny>, ptr: u64, size: usize) -> PyResult<Resolved> {
    let py = mr.py();
    let base = mr
        .cast::<PyMemoryResource>()
        .map_err(|_| expected("MemoryResource", mr))?;
    if let Some(native) = &base.get().native {
        let own = mr.get_type().getattr("deallocate")?;
        let builtin = py.get_type::<PyMemoryResource>().getattr("deallocate")?;
        if own.is(&builtin) {
            return Ok((Arc::clone(native), None));
        }
    }
    let device: bool = getattr(mr, "is_device_accessible")?.extract()?;
    let host: bool = getattr(mr, "is_host_accessible")?.extract()?;
    let managed: bool = match getattr(mr, "is_managed") {
        Ok(value) => value.extract()?,
        Err(_) => false,
    };
    let object = Arc::new(PyObjRef::new(mr.clone().unbind()));
    let held = HeldObject::new(&object);
    let type_name: Arc<str> = Arc::from(mr.get_type().name()?.to_string());
    let owed = OwedFree::new(Arc::clone(&type_name), ptr, size);
    let mark = owed.mark();
    let adapter: Arc<dyn MemoryResource> = Arc::new(PyResourceAdapter {
        object,
        type_name,
        accessibility: Accessibility {
            device,
            host,
            device_id: None,
            managed,
        },
        owed: Mutex::new(Some(owed)),
    });
    Ok((adapter, Some((held, mark))))
}

/// A Python memory resource's `device_id`, read now: -1 for none (negative or `None`).
///
/// # Errors
/// What reading the property raises; `TypeError` for a non-int; `ValueError` out of range.
pub(crate) fn python_device_id(mr: &Bound<'_, PyAny>) -> PyResult<i32> {
    let id: Option<i64> = getattr(mr, "device_id")?.extract()?;
    match id {
        None => Ok(-1),
        Some(id) if id < 0 => Ok(-1),
        Some(id) => {
            i32::try_from(id).map_err(|_| PyValueError::new_err(format!("invalid device_id {id}")))
        }
    }
}
