//! `Buffer` and `ManagedBuffer` (a thin shell around a `memory::Buffer` shared by the object's
//! references, [`SharedBuffer`]), adoption with `from_handle`, copies and fills, DLPack, and IPC
//! descriptors.
//!
//! The structs of `Buffer` and `ManagedBuffer`, which graphs and resources name, are in
//! `classes`; their methods are here.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use handles::{MemAdvice, MemLocation, StreamHandle};
use memory::{Buffer, FillValue, IpcBufferDescriptor, ManagedBuffer, MemoryError};
use pyo3::exceptions::{PyBufferError, PyOverflowError, PyRuntimeError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::pyclass::{CompareOp, PyTraverseError, PyVisit};
use pyo3::types::{PyBytes, PyDict, PyInt, PyTuple, PyType};

use crate::classes::{Kept, PyBuffer, PyGraphBuilder, PyManagedBuffer};
use crate::errors::{class_name, expected, stream_is_keyword_only, Error};
use crate::ffi::{
    call_method, dlpack_capsule, dlpack_capsule_versioned, getattr, hasattr, owned_allocation,
    unowned_handle, DLPACK_VERSION,
};
use crate::location::{kind_name, location, location_object, required_location};
use crate::report::{release, PyObjRef};
use crate::resource::{pool_of, python_device_id, resolve};
use crate::shared::SharedBuffer;
use crate::stream::{accept_stream, default_stream_handle, required_stream, with_stream};

/// `kDLCPU`, `kDLCUDA`, `kDLCUDAHost`, `kDLCUDAManaged`.
const DL_CPU: i32 = 1;
const DL_CUDA: i32 = 2;
const DL_CUDA_HOST: i32 = 3;
const DL_CUDA_MANAGED: i32 = 13;

impl PyBuffer {
    /// The memory resource of an empty buffer (`allocate(0)`), which describes its (absent)
    /// memory.
    fn empty_of<'py>(&self, py: Python<'py>) -> Option<Bound<'py, PyAny>> {
        if self.identity.1 != 0 || self.buffer().is_closed() {
            return None;
        }
        Some(self.memory_resource_object(py)?.into_bound(py))
    }

    fn open_handle(&self, py: Python<'_>) -> PyResult<handles::DevicePtrHandle> {
        Ok(self.open(py)?.handle().clone())
    }

    /// The memory resource object (a new reference).
    fn memory_resource_object(&self, py: Python<'_>) -> Option<Py<PyAny>> {
        lock(&self.mr).as_ref().map(|mr| mr.clone_ref(py))
    }

    /// The memory's device: a Python resource that frees it is asked now (its `device_id` is
    /// read only when asked); otherwise what the memory knows. `None` for no device.
    fn device_of(&self, py: Python<'_>, buffer: &Buffer) -> PyResult<Option<i32>> {
        if let Some(mr) = self.empty_of(py) {
            let id: Option<i32> = getattr(mr.as_any(), "device_id")?.extract()?;
            return Ok(id.filter(|&id| id >= 0));
        }
        if self.kept.resource.is_some() {
            if let Some(mr) = self.memory_resource_object(py) {
                let id = python_device_id(mr.bind(py))?;
                return Ok((id >= 0).then_some(id));
            }
        }
        let id = py.detach(|| buffer.device_id()).map_err(Error::from)?;
        if id.is_none() && self.memory_resource_object(py).is_none() {
            // Adopted memory with no resource: pinned (or registered) host memory belongs to the
            // device whose context the driver says made it, as cuda.core reports.
            let ptr = buffer.ptr();
            let attributes = py
                .detach(|| handles::pointer_attributes(ptr))
                .map_err(Error::from)?;
            if let Some(attributes) = attributes {
                if attributes.memory_type == handles::MemoryType::Host
                    && attributes.device_ordinal >= 0
                {
                    return Ok(Some(attributes.device_ordinal));
                }
            }
        }
        Ok(id)
    }

    fn dlpack_device_of(&self, py: Python<'_>) -> PyResult<(i32, i32)> {
        let buffer = self.open(py)?;
        let (device, host, mut managed) = match self.empty_of(py) {
            Some(mr) => (
                getattr(mr.as_any(), "is_device_accessible")?.extract()?,
                getattr(mr.as_any(), "is_host_accessible")?.extract()?,
                getattr(mr.as_any(), "is_managed")
                    .and_then(|v| v.extract())
                    .unwrap_or(false),
            ),
            None => py
                .detach(|| -> Result<_, MemoryError> {
                    Ok((
                        buffer.is_device_accessible()?,
                        buffer.is_host_accessible()?,
                        buffer.is_managed()?,
                    ))
                })
                .map_err(Error::from)?,
        };
        if device && host && !managed && self.kept.resource.is_some() {
            // A Python resource's memory: whether it is managed, the driver says.
            let ptr = buffer.ptr();
            managed = py
                .detach(|| handles::pointer_attributes(ptr))
                .map_err(Error::from)?
                .is_some_and(|attributes| attributes.is_managed);
        }
        // Pinned host memory is device 0 whatever the resource says (cuda.core does not ask a
        // resource whose device_id raises, like one of pinned memory bound to no GPU).
        let id = if managed || (device && !host) {
            self.device_of(py, &buffer)?
        } else {
            None
        };
        Ok(match (device, host, managed) {
            (_, _, true) => (DL_CUDA_MANAGED, id.unwrap_or(0)),
            (true, true, false) => (DL_CUDA_HOST, 0),
            (true, false, false) => (DL_CUDA, id.unwrap_or(0)),
            (false, true, false) => (DL_CPU, 0),
            (false, false, false) => {
                return Err(PyBufferError::new_err(
                    "buffer is neither device-accessible nor host-accessible",
                ))
            }
        })
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// `Buffer.from_handle` / `ManagedBuffer.from_handle`.
#[allow(clippy::too_many_arguments)]
fn adopt(
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
        let kept = Kept {
            owner: None,
            resource: python,
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
                owner: Some(Arc::downgrade(&held)),
                resource: None,
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

/// `from_handle`'s `stream` is keyword-only: `TypeError` when `extra` collected one given by
/// position.
fn from_handle_keywords(class: &str, extra: &Bound<'_, PyTuple>) -> PyResult<()> {
    if extra.is_empty() {
        return Ok(());
    }
    Err(stream_is_keyword_only(
        &format!("{class}.from_handle"),
        "from 2 to 4 positional arguments",
        4 + extra.len(),
        "from_handle(ptr, size, mr, owner, stream=s)",
    ))
}

/// Copies `src` into `dst` on `stream` (`handle`), or records the copy into a graph builder's
/// capture (which then keeps both buffers alive).
fn copy(
    py: Python<'_>,
    stream: &Bound<'_, PyAny>,
    handle: &StreamHandle,
    dst: &PyBuffer,
    src: &PyBuffer,
) -> PyResult<()> {
    let (dst, src) = (dst.open(py)?, src.open(py)?);
    if let Ok(builder) = stream.cast::<PyGraphBuilder>() {
        let builder = builder.get().builder()?;
        py.detach(|| builder.copy(&dst, &src))
            .map_err(Error::from)?;
        return Ok(());
    }
    py.detach(|| src.copy_to(&dst, handle))
        .map_err(Error::from)?;
    Ok(())
}

/// An address given as a pointer-like value, as cuda.core accepts it: an `int`, or an object
/// with `__index__` or `__int__` (`cuda.bindings.driver.CUdeviceptr`, a NumPy integer); not a
/// `float`.
fn address(object: &Bound<'_, PyAny>) -> PyResult<u64> {
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
                object.repr().map(|r| r.to_string()).unwrap_or_default()
            ))
        } else {
            expected("pointer (int, or an object with __int__)", object)
        }
    })
}

/// A fill pattern: an int in [0, 256) (8 bits) or an object exposing 1, 2 or 4 bytes through
/// the buffer protocol (8, 16 or 32 bits).
fn fill_value(value: &Bound<'_, PyAny>) -> PyResult<FillValue> {
    let py = value.py();
    if value.is_none() {
        return Err(PyTypeError::new_err("a fill value is required, got None"));
    }
    if value.is_instance_of::<PyInt>() {
        let v: i64 = value.extract().map_err(|_| {
            PyOverflowError::new_err("a fill value given as an int must be in [0, 256)")
        })?;
        let byte = u8::try_from(v).map_err(|_| {
            PyOverflowError::new_err(format!(
                "a fill value given as an int must be in [0, 256), got {v}"
            ))
        })?;
        return Ok(FillValue::U8(byte));
    }
    let view = py
        .import("builtins")?
        .getattr("memoryview")?
        .call1((value,))
        .map_err(|_| expected("int or an object with the buffer protocol", value))?;
    let bytes: Vec<u8> = view.call_method0("tobytes")?.extract()?;
    Ok(FillValue::from_bytes(&bytes).map_err(Error::from)?)
}

#[pymethods]
impl PyBuffer {
    #[new]
    #[pyo3(signature = (*_args, **_kwargs), text_signature = None)]
    fn py_new(_args: &Bound<'_, PyTuple>, _kwargs: Option<&Bound<'_, PyAny>>) -> PyResult<Self> {
        Err(PyRuntimeError::new_err(
            "Buffer objects cannot be instantiated directly: use MemoryResource.allocate() or \
             Buffer.from_handle()",
        ))
    }

    /// Wraps ``size`` bytes at ``ptr``, allocated elsewhere.
    ///
    /// - No ``mr``/``owner``: a view; nothing is freed.
    /// - ``owner``: kept alive until the memory's last reference goes; nothing is freed.
    /// - ``mr``: the buffer owns the memory; at teardown ``mr.deallocate(ptr, size,
    ///   stream=...)`` runs with the recorded stream (``stream``, else ``default_stream()``
    ///   bound to the current context), in that recipe's context, on whatever thread drops it.
    ///   Prefer a created stream if the buffer may be freed on another thread.
    ///
    /// The pointer is taken on the caller's word: custody does not check that it is device or
    /// host memory of this process, and one that is not (or a ``size`` larger than the
    /// allocation) can crash the process when a copy or fill uses it, as in cuda.core.
    ///
    /// ``size`` 0: without ``mr`` (a view, or kept alive by ``owner``) a zero-size buffer is
    /// returned (``size`` 0, ``handle`` the given ``ptr``, which may be 0 for a view), and
    /// closing it frees nothing; with ``mr``, ``ValueError`` ("invalid size of 0 bytes"): a
    /// buffer that owns its memory needs at least one byte, and ``deallocate`` is not called.
    ///
    /// The recipe is recorded before ownership is taken: on any error the pointer is still
    /// the caller's and ``deallocate`` is not called. ``ValueError``: ``stream`` without
    /// ``mr``, ``mr`` with ``owner``, zero size with ``mr``, a null pointer with ``mr`` or
    /// ``owner``, a range that wraps past the end of the address space (``ptr + size`` not
    /// below ``2**64``, with or without ``mr``); ``TypeError``: a bad ``mr`` or stream, or a
    /// ``stream`` passed by position (it is keyword-only);
    /// ``OverflowError``: negative or too large numbers, and a ``size`` over ``isize::MAX``
    /// (as ``allocate``; checked first); ``RuntimeError``: no CUDA context is current for a
    /// default stream, or a closed stream.
    #[staticmethod]
    #[pyo3(
        signature = (ptr, size, mr = None, owner = None, *extra, stream = None),
        text_signature = "(ptr, size, mr=None, owner=None, *, stream=None)"
    )]
    fn from_handle(
        py: Python<'_>,
        ptr: &Bound<'_, PyAny>,
        size: usize,
        mr: Option<&Bound<'_, PyAny>>,
        owner: Option<&Bound<'_, PyAny>>,
        extra: &Bound<'_, PyTuple>,
        stream: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Py<PyAny>> {
        from_handle_keywords("Buffer", extra)?;
        adopt(py, address(ptr)?, size, mr, owner, stream, false)
    }

    /// Imports a buffer another process shared, from ``mr`` (a pool opened with
    /// ``from_allocation_handle``); ``stream`` (required, keyword-only) orders its eventual free.
    /// Does not block.
    ///
    /// ``TypeError``: ``mr`` is not a pool resource, a missing or bad ``stream`` or descriptor;
    /// ``RuntimeError``: ``mr`` is not an imported pool, or a closed stream; ``ValueError``: a
    /// malformed descriptor, or one the pool cannot hold; :class:`CUDAError`: the driver refused
    /// the import.
    #[classmethod]
    #[pyo3(
        signature = (mr, ipc_descriptor, *extra, stream = None),
        text_signature = "($cls, mr, ipc_descriptor, *, stream)"
    )]
    fn from_ipc_descriptor(
        cls: &Bound<'_, PyType>,
        mr: &Bound<'_, PyAny>,
        ipc_descriptor: &Bound<'_, PyAny>,
        extra: &Bound<'_, PyTuple>,
        stream: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Py<PyAny>> {
        let py = cls.py();
        if !extra.is_empty() {
            return Err(stream_is_keyword_only(
                &format!("{}.from_ipc_descriptor", cls.name()?),
                "2 positional arguments",
                2 + extra.len(),
                "from_ipc_descriptor(mr, ipc_descriptor, stream=s)",
            ));
        }
        let stream = accept_stream(&required_stream(stream)?)?;
        let pool = pool_of(mr)
            .ok_or_else(|| expected("DeviceMemoryResource or PinnedMemoryResource", mr))?;
        if !pool.is_mapped() && !pool.is_ipc_enabled() {
            return Err(crate::resource::not_ipc_enabled());
        }
        let descriptor = descriptor_of(ipc_descriptor, pool.device())?;
        if !pool.is_mapped() {
            return Err(PyRuntimeError::new_err(
                "the memory resource is not a pool imported from another process \
                 (open one with from_allocation_handle)",
            ));
        }
        let buffer = py
            .detach(|| pool.import_buffer(&descriptor, &stream))
            .map_err(|error| match error {
                // The descriptor does not fit the pool (its size exceeds what was mapped).
                MemoryError::Ipc { .. } => PyValueError::new_err(error.to_string()),
                other => Error::from(other).into(),
            })?;
        PyBuffer::wrap(
            py,
            buffer,
            Some(mr.clone().unbind()),
            false,
            Kept::default(),
        )
    }

    /// Closes the buffer; when it holds the last reference to the memory, frees it now.
    ///
    /// ``close()`` on a closed buffer is a no-op. ``close(stream=s)`` is exactly
    /// ``set_deallocation_stream(s)`` then ``close()`` (so it raises on a closed buffer, and on a
    /// bad stream, ``TypeError`` or ``RuntimeError`` as there, leaves the buffer open with its old
    /// recipe). A failing free raises (:class:`CUDAError`, or what a Python ``deallocate`` raised);
    /// the buffer is closed either way. The free is ordered on the recorded deallocation stream.
    /// May block for memory whose free is synchronous in the driver (pinned, managed,
    /// ``cuMemAlloc``); stream-ordered frees do not wait, except an imported buffer's
    /// (``is_mapped``): its close first waits for every stream of the buffer's context, so that
    /// work queued on another stream than the deallocation stream (and not declared with
    /// :meth:`record_use`) has run before the unmap (a use of an unmapped import is a device
    /// fault that ends the context), then frees, then waits for its deallocation stream, so the
    /// unmap has run when it returns (the driver requires an importing process's free to have
    /// completed before the exporting process frees the allocation: close imports, then tell
    /// the exporter). The first wait is left out while a capture begun through custody may run.
    #[pyo3(signature = (stream = None))]
    fn close(&self, py: Python<'_>, stream: Option<&Bound<'_, PyAny>>) -> PyResult<()> {
        let buffer = self.buffer();
        let stream = match stream.filter(|s| !s.is_none()) {
            Some(stream) => Some(accept_stream(stream)?),
            None => None,
        };
        let result = match &stream {
            Some(stream) => release(py, || buffer.close_on(stream)),
            None => buffer.close(py),
        };
        Ok(result.map_err(Error::from)?)
    }

    /// Declares that work on ``stream`` uses this buffer (PyTorch's ``record_stream`` is the
    /// analogue): when the memory is freed, by ``close()``, a drop, the garbage collector or a
    /// graph's deferred cleanup, on any thread, the deallocation stream first waits
    /// (``cuStreamWaitEvent``) for an event recorded on ``stream`` at that moment, so the free is
    /// ordered after all work enqueued on ``stream`` before it, including work enqueued after
    /// this call. Nothing is synchronised or polled, now or at the free; a drop does not block.
    /// Works with every memory kind; ``set_deallocation_stream`` keeps the recorded uses;
    /// recording a stream twice, or the deallocation stream, adds nothing. The buffer keeps
    /// ``stream`` alive until the free. A default stream is bound to the current context (the
    /// per-thread default stream also to the calling thread; freed on another thread, the event
    /// is recorded on that context's legacy default stream, which waits for it). While
    /// ``stream`` is being captured into a graph at the free, the free waits until the capture
    /// ends. A buffer that frees nothing (``from_handle`` without ``mr``) records nothing.
    ///
    /// ``TypeError`` for None or a non-stream; ``RuntimeError`` for a closed buffer or stream,
    /// or a default stream with no current context; ``ValueError`` for a stream of another
    /// device (for device memory; pinned and managed memory accept any device's stream). On
    /// error nothing is recorded.
    fn record_use(&self, py: Python<'_>, stream: &Bound<'_, PyAny>) -> PyResult<()> {
        if stream.is_none() {
            return Err(PyTypeError::new_err(
                "record_use() requires a Stream, got None",
            ));
        }
        let buffer = self.buffer();
        // A stream that carries its context: recording makes no driver call, so it runs
        // attached with the stream borrowed; a default-stream token reads the current context.
        let recorded = with_stream(stream, |stream| match stream.context() {
            Some(_) => Ok(buffer.record_use(stream)),
            None => Err(stream.clone()),
        })?;
        match recorded {
            Ok(result) => Ok(result.map_err(Error::from)?),
            Err(token) => Ok(py
                .detach(|| buffer.record_use(&token))
                .map_err(Error::from)?),
        }
    }

    /// Records the free on ``stream`` from now on: the whole recipe is replaced atomically,
    /// seen by every holder of the memory. Nothing is freed or synchronised: order the work on
    /// the old stream before the new one yourself.
    ///
    /// ``TypeError`` for None or a non-stream; ``RuntimeError`` for a closed buffer or stream,
    /// or a default stream with no current context; ``ValueError`` for a stream of another
    /// device. On error the old recipe stays.
    fn set_deallocation_stream(&self, py: Python<'_>, stream: &Bound<'_, PyAny>) -> PyResult<()> {
        if stream.is_none() {
            return Err(PyTypeError::new_err(
                "set_deallocation_stream() requires a Stream, got None",
            ));
        }
        let buffer = self.buffer();
        // A stream that carries its context: the swap makes no driver call (D10 holds), so it
        // runs attached, saving the GIL round trip, with the stream borrowed, not cloned. Only
        // dropping the old recipe's last reference to a stream or context calls the driver:
        // that runs with the GIL released, after the stream's lock.
        let swapped = with_stream(stream, |stream| match stream.context() {
            Some(_) => Ok(buffer.replace_deallocation_stream(stream)),
            None => Err(stream.clone()),
        })?;
        let old = match swapped {
            Ok(replaced) => replaced.map_err(Error::from)?,
            Err(token) => {
                // A default-stream token: recording the recipe reads the current context.
                py.detach(|| buffer.set_deallocation_stream(&token))
                    .map_err(Error::from)?;
                return Ok(());
            }
        };
        if let Some(last) = old.and_then(handles::DeallocationRecipe::into_last_references) {
            py.detach(move || drop(last));
        }
        Ok(())
    }

    /// Copies this buffer into ``dst`` (allocated from ``memory_resource`` with ``stream`` if
    /// omitted), ordered on ``stream``, and returns ``dst``. Does not block; a
    /// :class:`GraphBuilder` as ``stream`` records the copy into its graph, which then keeps both
    /// buffers' memory alive. ``TypeError`` for a ``dst`` that is not a :class:`Buffer`;
    /// ``TypeError`` for a missing, ``None`` or non-stream ``stream`` or one passed by position (it
    /// is keyword-only); ``RuntimeError`` for a closed stream or buffer; ``ValueError`` for a size
    /// mismatch or no memory resource to allocate from; :class:`CUDAError` on a driver failure.
    /// Zero bytes: after these checks nothing is done and no driver call is made.
    #[pyo3(
        signature = (dst = None, *extra, stream = None),
        text_signature = "($self, dst=None, *, stream)"
    )]
    fn copy_to(
        slf: &Bound<'_, Self>,
        py: Python<'_>,
        dst: Option<&Bound<'_, PyAny>>,
        extra: &Bound<'_, PyTuple>,
        stream: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Py<PyAny>> {
        if !extra.is_empty() {
            return Err(stream_is_keyword_only(
                &format!("{}.copy_to", class_name(slf.as_any())),
                "from 0 to 1 positional arguments",
                1 + extra.len(),
                "copy_to(dst, stream=s)",
            ));
        }
        let this = slf.get();
        let stream = &required_stream(stream)?;
        let handle = accept_stream(stream)?;
        let size = this.open_handle(py)?.size();
        let dst = match dst.filter(|d| !d.is_none()) {
            Some(dst) => dst.clone(),
            None => {
                let mr = this.memory_resource_object(py).ok_or_else(|| {
                    PyValueError::new_err(
                        "copy_to() without dst allocates from the buffer's memory_resource, \
                         and this buffer has none",
                    )
                })?;
                let kwargs = PyDict::new(py);
                kwargs.set_item("stream", stream)?;
                call_method(mr.bind(py), "allocate", (size,), Some(&kwargs))?
            }
        };
        let target = dst
            .cast::<PyBuffer>()
            .map_err(|_| expected("Buffer", &dst))?;
        copy(py, stream, &handle, target.get(), this)?;
        Ok(dst.unbind())
    }

    /// Copies ``src`` into this buffer, ordered on ``stream``. Does not block; a
    /// :class:`GraphBuilder` as ``stream`` records the copy into its graph, which then keeps both
    /// buffers' memory alive. ``TypeError`` for a ``src`` that is not a :class:`Buffer`;
    /// ``TypeError`` for a missing, ``None`` or non-stream ``stream`` or one passed by position (it
    /// is keyword-only); ``RuntimeError`` for a closed stream or buffer; ``ValueError`` for a size
    /// mismatch; :class:`CUDAError` on a driver failure.
    /// Zero bytes: after these checks nothing is done and no driver call is made.
    #[pyo3(
        signature = (src, *extra, stream = None),
        text_signature = "($self, src, *, stream)"
    )]
    fn copy_from(
        slf: &Bound<'_, Self>,
        py: Python<'_>,
        src: &Bound<'_, PyAny>,
        extra: &Bound<'_, PyTuple>,
        stream: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        if !extra.is_empty() {
            return Err(stream_is_keyword_only(
                &format!("{}.copy_from", class_name(slf.as_any())),
                "1 positional argument",
                1 + extra.len(),
                "copy_from(src, stream=s)",
            ));
        }
        let stream = &required_stream(stream)?;
        let handle = accept_stream(stream)?;
        let source = src
            .cast::<PyBuffer>()
            .map_err(|_| expected("Buffer", src))?;
        copy(py, stream, &handle, slf.get(), source.get())
    }

    /// Fills the buffer with ``value`` repeated: an int in [0, 256) (8 bits) or an object of 1, 2
    /// or 4 bytes through the buffer protocol (8, 16 or 32 bits), ordered on ``stream``. Does not
    /// block; a :class:`GraphBuilder` as ``stream`` records the fill into its graph, which then
    /// keeps the buffer's memory alive. ``TypeError`` for ``None`` or another kind of ``value``;
    /// ``OverflowError`` for an int out of range; ``ValueError`` for another width or a size that
    /// is not a multiple of it; ``TypeError`` for a missing, ``None`` or non-stream ``stream`` or
    /// one passed by position (it is keyword-only); ``RuntimeError`` for a closed stream or buffer;
    /// :class:`CUDAError` on a driver failure.
    /// An empty buffer: after these checks nothing is done and no driver call is made.
    #[pyo3(
        signature = (value, *extra, stream = None),
        text_signature = "($self, value, *, stream)"
    )]
    fn fill(
        slf: &Bound<'_, Self>,
        py: Python<'_>,
        value: &Bound<'_, PyAny>,
        extra: &Bound<'_, PyTuple>,
        stream: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        if !extra.is_empty() {
            return Err(stream_is_keyword_only(
                &format!("{}.fill", class_name(slf.as_any())),
                "1 positional argument",
                1 + extra.len(),
                "fill(value, stream=s)",
            ));
        }
        let stream = &required_stream(stream)?;
        let value = fill_value(value)?;
        let buffer = slf.get().open(py)?;
        if let Ok(builder) = stream.cast::<PyGraphBuilder>() {
            // Recorded into the graph, which keeps the buffer alive.
            let builder = builder.get().builder()?;
            py.detach(|| builder.fill(&buffer, value))
                .map_err(Error::from)?;
            return Ok(());
        }
        let handle = accept_stream(stream)?;
        py.detach(|| buffer.fill(value, &handle))
            .map_err(Error::from)?;
        Ok(())
    }

    /// The address as an int (a host address for pinned memory); 0 once closed.
    #[getter]
    fn handle(&self) -> u64 {
        self.buffer().ptr()
    }

    /// The size in bytes; 0 once closed.
    #[getter]
    fn size(&self) -> usize {
        self.buffer().size()
    }

    /// Whether the buffer was closed.
    #[getter]
    fn is_closed(&self) -> bool {
        self.buffer().is_closed()
    }

    /// The resource the memory came from (or that frees it); None for views and once
    /// closed.
    #[getter]
    fn memory_resource(&self, py: Python<'_>) -> Option<Py<PyAny>> {
        if self.buffer().is_closed() {
            return None;
        }
        self.memory_resource_object(py)
    }

    /// The ``owner`` given to ``from_handle``; None otherwise and once closed.
    #[getter]
    fn owner(&self, py: Python<'_>) -> Option<Py<PyAny>> {
        if self.buffer().is_closed() {
            return None;
        }
        let kept = self.kept.owner.as_ref()?.upgrade()?;
        Some(kept.get().clone_ref(py))
    }

    /// Whether a device can access the memory (``RuntimeError`` once closed).
    #[getter]
    fn is_device_accessible(&self, py: Python<'_>) -> PyResult<bool> {
        if let Some(mr) = self.empty_of(py) {
            return getattr(mr.as_any(), "is_device_accessible")?.extract();
        }
        let buffer = self.open(py)?;
        Ok(py
            .detach(|| buffer.is_device_accessible())
            .map_err(Error::from)?)
    }

    /// Whether the host can access the memory (``RuntimeError`` once closed).
    #[getter]
    fn is_host_accessible(&self, py: Python<'_>) -> PyResult<bool> {
        if let Some(mr) = self.empty_of(py) {
            return getattr(mr.as_any(), "is_host_accessible")?.extract();
        }
        let buffer = self.open(py)?;
        Ok(py
            .detach(|| buffer.is_host_accessible())
            .map_err(Error::from)?)
    }

    /// Whether the memory is managed (``RuntimeError`` once closed).
    #[getter]
    fn is_managed(&self, py: Python<'_>) -> PyResult<bool> {
        if let Some(mr) = self.empty_of(py) {
            return Ok(getattr(mr.as_any(), "is_managed")
                .and_then(|v| v.extract())
                .unwrap_or(false));
        }
        let buffer = self.open(py)?;
        Ok(py.detach(|| buffer.is_managed()).map_err(Error::from)?)
    }

    /// The device the memory belongs to; -1 for memory bound to no device. For memory a Python
    /// resource frees, that resource's ``device_id``, read now (it may raise); for pinned or
    /// registered host memory adopted with no resource, the device the driver names
    /// (``CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL``: the one whose context made or registered it).
    /// ``RuntimeError`` once closed.
    #[getter]
    fn device_id(&self, py: Python<'_>) -> PyResult<i32> {
        let buffer = self.open(py)?;
        Ok(self.device_of(py, &buffer)?.unwrap_or(-1))
    }

    /// Whether the buffer was imported from another process.
    #[getter]
    fn is_mapped(&self) -> bool {
        self.buffer().is_mapped()
    }

    /// The descriptor another process needs to import this buffer with
    /// ``Buffer.from_ipc_descriptor`` (``cuMemPoolExportPointer``). ``RuntimeError`` for a closed
    /// buffer, or one that does not come from an IPC-enabled pool or was itself imported.
    #[getter]
    fn ipc_descriptor(&self, py: Python<'_>) -> PyResult<PyIpcBufferDescriptor> {
        let buffer = self.open(py)?;
        let inner = py
            .detach(|| buffer.ipc_descriptor())
            .map_err(|error| match error {
                MemoryError::Ipc { reason } if !buffer.is_mapped() => PyRuntimeError::new_err(
                    format!("Memory resource is not IPC-enabled ({reason})"),
                ),
                other => Error::from(other).into(),
            })?;
        Ok(PyIpcBufferDescriptor::of(&inner))
    }

    /// A DLPack capsule of a 1-D uint8 tensor of ``size`` elements over this memory; the tensor
    /// keeps the memory alive until its deleter runs. With ``max_version`` at least ``(1, 0)`` a
    /// ``"dltensor_versioned"`` capsule (DLPack 1.0, writable, not a copy), else a ``"dltensor"``
    /// one. ``stream`` is accepted and not used: order the consumer after the producer's work
    /// yourself. ``BufferError`` for ``copy=True``, a ``dl_device`` other than the buffer's own, a
    /// ``max_version`` that is not two ints, or memory neither a device nor the host can access;
    /// ``RuntimeError`` once closed.
    #[pyo3(signature = (*, stream = None, max_version = None, dl_device = None, copy = None))]
    fn __dlpack__<'py>(
        &self,
        py: Python<'py>,
        stream: Option<&Bound<'py, PyAny>>,
        max_version: Option<&Bound<'py, PyAny>>,
        dl_device: Option<&Bound<'py, PyAny>>,
        copy: Option<bool>,
    ) -> PyResult<Bound<'py, PyAny>> {
        // The consumer orders its use after the producer's work: `stream` is accepted and not
        // used (the memory's own stream is not known to be the last writer).
        let _ = stream;
        let mut versioned = false;
        if let Some(version) = max_version.filter(|v| !v.is_none()) {
            let (major, _minor): (i64, i64) = version
                .cast::<PyTuple>()
                .ok()
                .filter(|t| t.len() == 2)
                .and_then(|t| t.extract().ok())
                .ok_or_else(|| {
                    PyBufferError::new_err(format!(
                        "Expected max_version tuple[int, int], got {}",
                        version.repr().map(|r| r.to_string()).unwrap_or_default()
                    ))
                })?;
            versioned = major >= i64::from(DLPACK_VERSION.0);
        }
        if copy == Some(true) {
            return Err(PyBufferError::new_err("Sorry, not supported: copy=True"));
        }
        let handle = self.open_handle(py)?;
        let (device_type, device_id) = self.dlpack_device_of(py)?;
        if let Some(requested) = dl_device.filter(|d| !d.is_none()) {
            // The buffer's own device is what it gives anyway; anything else would be a copy.
            if requested.extract::<(i32, i32)>().ok() != Some((device_type, device_id)) {
                return Err(PyBufferError::new_err(
                    "Sorry, not supported: dl_device other than None",
                ));
            }
        }
        if versioned {
            Ok(dlpack_capsule_versioned(py, handle, device_type, device_id)?.into_any())
        } else {
            Ok(dlpack_capsule(py, handle, device_type, device_id)?.into_any())
        }
    }

    /// ``(device_type, device_id)``: kDLCPU (1), kDLCUDA (2), kDLCUDAHost (3) or kDLCUDAManaged
    /// (13); memory adopted from elsewhere is asked of the driver (managed or not).
    /// ``RuntimeError`` once closed.
    fn __dlpack_device__(&self, py: Python<'_>) -> PyResult<(i32, i32)> {
        self.open(py)?;
        self.dlpack_device_of(py)
    }

    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        if let Ok(mr) = self.mr.try_lock() {
            if let Some(mr) = mr.as_ref() {
                visit.call(mr)?;
            }
        }
        let Some(buffer) = &self.inner else {
            return Ok(());
        };
        // The handle's references are this object's only while it alone holds the memory.
        if buffer.held_alone() {
            for kept in [&self.kept.owner, &self.kept.resource]
                .into_iter()
                .flatten()
            {
                // Alive: the memory's handle, which only this object holds, holds it.
                if let Some(kept) = kept.upgrade() {
                    visit.call(kept.get())?;
                }
            }
        }
        Ok(())
    }

    /// Breaks a garbage cycle: frees the memory (with its recipe, and its resource still
    /// alive), then lets go of the memory resource object.
    fn __clear__(&self, py: Python<'_>) {
        if let Some(buffer) = self.inner.as_ref().and_then(SharedBuffer::take) {
            release(py, move || drop(buffer));
        }
        let mr = lock(&self.mr).take();
        drop(mr);
    }

    /// Run by the collector on every object of a garbage cycle before it clears any (and by
    /// the deallocation of a Python subclass's instances): frees memory whose free calls a
    /// Python `deallocate` now, while that resource and what it refers to are intact.
    fn __del__(&self, py: Python<'_>) {
        if self.kept.resource.is_none() {
            return;
        }
        if let Some(buffer) = self.inner.as_ref().and_then(SharedBuffer::take) {
            release(py, move || drop(buffer));
        }
    }

    /// Returns the buffer.
    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    /// Closes the buffer as ``close()`` does (raising what it raises); never suppresses an
    /// exception.
    #[pyo3(signature = (*_exc))]
    fn __exit__(&self, py: Python<'_>, _exc: &Bound<'_, PyTuple>) -> PyResult<bool> {
        self.close(py, None)?;
        Ok(false)
    }

    fn __richcmp__(&self, other: &Bound<'_, PyAny>, op: CompareOp) -> PyResult<Py<PyAny>> {
        let py = other.py();
        let Ok(other) = other.cast::<PyBuffer>() else {
            return Ok(py.NotImplemented());
        };
        let other = other.get();
        // Two open buffers over the same bytes are equal (a view of a buffer equals it); a
        // closed buffer equals only itself.
        let equal = std::ptr::eq(self, other)
            || (self.identity == other.identity
                && !self.buffer().is_closed()
                && !other.buffer().is_closed());
        match op {
            CompareOp::Eq => Ok(equal.into_pyobject(py)?.to_owned().into_any().unbind()),
            CompareOp::Ne => Ok((!equal).into_pyobject(py)?.to_owned().into_any().unbind()),
            _ => Ok(py.NotImplemented()),
        }
    }

    fn __hash__(&self) -> u64 {
        crate::stream::hash_of(
            "Buffer",
            self.identity.0 ^ (self.identity.1 as u64).rotate_left(32),
        )
    }

    fn __repr__(&self, py: Python<'_>) -> String {
        let buffer = self.buffer();
        match self.open_handle(py) {
            Err(_) => "<Buffer closed>".to_owned(),
            Ok(handle) => {
                let mapped = if buffer.is_mapped() {
                    " is_mapped=True"
                } else {
                    ""
                };
                format!(
                    "<Buffer ptr=0x{:x} size={}{mapped}>",
                    handle.ptr(),
                    handle.size()
                )
            }
        }
    }
}

#[pymethods]
impl PyManagedBuffer {
    #[new]
    #[pyo3(signature = (*_args, **_kwargs), text_signature = None)]
    fn py_new(
        _args: &Bound<'_, PyTuple>,
        _kwargs: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<PyClassInitializer<Self>> {
        Err(PyRuntimeError::new_err(
            "ManagedBuffer objects cannot be instantiated directly: use \
             ManagedMemoryResource.allocate() or ManagedBuffer.from_handle()",
        ))
    }

    /// As :meth:`Buffer.from_handle`, for managed memory (reported host- and
    /// device-accessible and managed without asking the driver). ``size`` 0 as there: a
    /// zero-size ``ManagedBuffer`` without ``mr``, ``ValueError`` with ``mr``.
    #[classmethod]
    #[pyo3(
        signature = (ptr, size, mr = None, owner = None, *extra, stream = None),
        text_signature = "($cls, ptr, size, mr=None, owner=None, *, stream=None)"
    )]
    fn from_handle(
        cls: &Bound<'_, PyType>,
        ptr: &Bound<'_, PyAny>,
        size: usize,
        mr: Option<&Bound<'_, PyAny>>,
        owner: Option<&Bound<'_, PyAny>>,
        extra: &Bound<'_, PyTuple>,
        stream: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Py<PyAny>> {
        from_handle_keywords(&cls.name()?.to_string(), extra)?;
        adopt(cls.py(), address(ptr)?, size, mr, owner, stream, true)
    }

    /// Whether read-mostly advice is set (``CU_MEM_ADVISE_SET_READ_MOSTLY``: reads may be
    /// served from read-only copies on every processor that reads); assigning gives or takes
    /// back that advice. ``ValueError`` for memory that is not managed; ``RuntimeError`` once
    /// closed; :class:`CUDAError` when the driver refuses.
    #[getter]
    fn read_mostly(slf: &Bound<'_, Self>, py: Python<'_>) -> PyResult<bool> {
        let buffer = slf.as_super().get().open(py)?;
        Ok(py.detach(|| buffer.read_mostly()).map_err(Error::from)?)
    }

    #[setter]
    fn set_read_mostly(slf: &Bound<'_, Self>, py: Python<'_>, value: bool) -> PyResult<()> {
        let buffer = slf.as_super().get().open(py)?;
        let advice = if value {
            MemAdvice::SetReadMostly
        } else {
            MemAdvice::UnsetReadMostly
        };
        Ok(py.detach(|| buffer.advise(advice)).map_err(Error::from)?)
    }

    /// Where the memory is advised to live: a :class:`Device`, a :class:`Host`, or ``None``
    /// for no preference; assigning one gives that advice, ``None`` takes it back. Errors as
    /// :attr:`read_mostly`; ``TypeError`` for a value that is no location.
    #[getter]
    fn preferred_location(slf: &Bound<'_, Self>, py: Python<'_>) -> PyResult<Py<PyAny>> {
        let buffer = slf.as_super().get().open(py)?;
        let location = py
            .detach(|| buffer.preferred_location())
            .map_err(Error::from)?;
        location_object(py, location)
    }

    #[setter]
    fn set_preferred_location(
        slf: &Bound<'_, Self>,
        py: Python<'_>,
        value: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        let advice = match location(value, true)? {
            Some(location) => MemAdvice::SetPreferredLocation(location),
            None => MemAdvice::UnsetPreferredLocation,
        };
        let buffer = slf.as_super().get().open(py)?;
        Ok(py.detach(|| buffer.advise(advice)).map_err(Error::from)?)
    }

    /// The devices (and ``Host()``) the memory is advised to stay mapped for
    /// (``CU_MEM_ADVISE_SET_ACCESSED_BY``): a live set, read from the driver on each use, whose
    /// ``add`` and ``discard`` give and take back the advice; assigning a set of locations
    /// makes the advice that set (all are checked before any changes). Only a :class:`Device` or
    /// ``Host()`` qualifies (``ValueError`` for a NUMA node); errors otherwise as
    /// :attr:`read_mostly`.
    #[getter]
    fn accessed_by<'py>(slf: &Bound<'py, Self>, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        py.import("custody")?.getattr("_AccessedBy")?.call1((slf,))
    }

    #[setter]
    fn set_accessed_by(
        slf: &Bound<'_, Self>,
        py: Python<'_>,
        value: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        let mut wanted = Vec::new();
        for item in value.try_iter()? {
            let location = accessed_by_location(&item?)?;
            if !wanted.contains(&location) {
                wanted.push(location);
            }
        }
        let buffer = slf.as_super().get().open(py)?;
        py.detach(|| {
            let current = buffer.accessed_by()?;
            for gone in current.iter().filter(|l| !wanted.contains(l)) {
                buffer.advise(MemAdvice::UnsetAccessedBy(*gone))?;
            }
            for new in wanted.iter().filter(|l| !current.contains(l)) {
                buffer.advise(MemAdvice::SetAccessedBy(*new))?;
            }
            Ok::<(), MemoryError>(())
        })
        .map_err(Error::from)?;
        Ok(())
    }

    /// The locations accessed-by advice is set for, as objects (for :attr:`accessed_by`).
    fn _accessed_by_list(slf: &Bound<'_, Self>, py: Python<'_>) -> PyResult<Vec<Py<PyAny>>> {
        let buffer = slf.as_super().get().open(py)?;
        let locations = py.detach(|| buffer.accessed_by()).map_err(Error::from)?;
        locations
            .into_iter()
            .map(|l| location_object(py, Some(l)))
            .collect()
    }

    /// Gives (``on``) or takes back accessed-by advice for one location (for
    /// :attr:`accessed_by`).
    fn _advise_accessed_by(
        slf: &Bound<'_, Self>,
        py: Python<'_>,
        location: &Bound<'_, PyAny>,
        on: bool,
    ) -> PyResult<()> {
        let location = accessed_by_location(location)?;
        let advice = if on {
            MemAdvice::SetAccessedBy(location)
        } else {
            MemAdvice::UnsetAccessedBy(location)
        };
        let buffer = slf.as_super().get().open(py)?;
        Ok(py.detach(|| buffer.advise(advice)).map_err(Error::from)?)
    }

    /// Where the memory was last prefetched to (:meth:`prefetch`, the batch functions): a
    /// :class:`Device`, a :class:`Host`, or ``None`` when it never was (read from the driver's
    /// ``CU_MEM_RANGE_ATTRIBUTE_LAST_PREFETCH_LOCATION``; not in cuda.core 1.2). Errors as
    /// :attr:`read_mostly`.
    #[getter]
    fn last_prefetch_location(slf: &Bound<'_, Self>, py: Python<'_>) -> PyResult<Py<PyAny>> {
        let buffer = slf.as_super().get().open(py)?;
        let location = py
            .detach(|| buffer.last_prefetch_location())
            .map_err(Error::from)?;
        location_object(py, location)
    }

    /// Migrates the memory to ``location`` (a :class:`Device` or :class:`Host`), ordered on
    /// ``stream`` (keyword-only: a :class:`Stream`, a :class:`GraphBuilder`, or an object with
    /// ``__cuda_stream__``); does not block. ``ValueError`` for memory that is not managed or
    /// for ``location=None``, ``TypeError`` for a value that is no location or a missing
    /// stream; ``RuntimeError`` once closed; :class:`CUDAError` when the driver refuses.
    #[pyo3(
        signature = (location, *extra, stream = None),
        text_signature = "($self, location, *, stream)"
    )]
    fn prefetch(
        slf: &Bound<'_, Self>,
        py: Python<'_>,
        location: &Bound<'_, PyAny>,
        extra: &Bound<'_, PyTuple>,
        stream: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        if !extra.is_empty() {
            return Err(stream_is_keyword_only(
                &format!("{}.prefetch", class_name(slf.as_any())),
                "1 positional argument",
                1 + extra.len(),
                "prefetch(location, stream=s)",
            ));
        }
        let stream = accept_stream(&required_stream(stream)?)?;
        let location = required_location(location)?;
        let buffer = slf.as_super().get().open(py)?;
        Ok(py
            .detach(|| buffer.prefetch(location, &stream))
            .map_err(Error::from)?)
    }

    /// Discards the memory's contents (they read as undefined until written; no pages are
    /// migrated back), ordered on ``stream`` (keyword-only, as :meth:`prefetch`); does not
    /// block. Errors as :meth:`prefetch`; :class:`CUDAError` from a driver before CUDA 12.8.
    #[pyo3(signature = (*extra, stream = None), text_signature = "($self, *, stream)")]
    fn discard(
        slf: &Bound<'_, Self>,
        py: Python<'_>,
        extra: &Bound<'_, PyTuple>,
        stream: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        if !extra.is_empty() {
            return Err(stream_is_keyword_only(
                &format!("{}.discard", class_name(slf.as_any())),
                "no positional arguments",
                extra.len(),
                "discard(stream=s)",
            ));
        }
        let stream = accept_stream(&required_stream(stream)?)?;
        let buffer = slf.as_super().get().open(py)?;
        Ok(py.detach(|| buffer.discard(&stream)).map_err(Error::from)?)
    }

    /// Discards the memory's contents and migrates it to ``location``, ordered on ``stream``
    /// (keyword-only, as :meth:`prefetch`); does not block. Errors as :meth:`discard`.
    #[pyo3(
        signature = (location, *extra, stream = None),
        text_signature = "($self, location, *, stream)"
    )]
    fn discard_prefetch(
        slf: &Bound<'_, Self>,
        py: Python<'_>,
        location: &Bound<'_, PyAny>,
        extra: &Bound<'_, PyTuple>,
        stream: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        if !extra.is_empty() {
            return Err(stream_is_keyword_only(
                &format!("{}.discard_prefetch", class_name(slf.as_any())),
                "1 positional argument",
                1 + extra.len(),
                "discard_prefetch(location, stream=s)",
            ));
        }
        let stream = accept_stream(&required_stream(stream)?)?;
        let location = required_location(location)?;
        let buffer = slf.as_super().get().open(py)?;
        Ok(py
            .detach(|| buffer.discard_prefetch(location, &stream))
            .map_err(Error::from)?)
    }
}

/// A location accessed-by advice takes: a device or the host, not a NUMA node.
fn accessed_by_location(value: &Bound<'_, PyAny>) -> PyResult<MemLocation> {
    let location = required_location(value)?;
    match location {
        MemLocation::Device(_) | MemLocation::Host => Ok(location),
        other => Err(PyValueError::new_err(format!(
            "accessed_by does not support location_type='{}': give a Device or Host()",
            kind_name(other)
        ))),
    }
}

/// The open buffers of a batch function's ``buffers`` (a sequence of :class:`Buffer`).
fn batch_buffers(
    py: Python<'_>,
    function: &str,
    buffers: &Bound<'_, PyAny>,
) -> PyResult<Vec<Arc<Buffer>>> {
    let not_a_sequence = || {
        PyTypeError::new_err(format!(
            "{function}() takes a sequence of Buffers, got {} (for one buffer, use the \
             ManagedBuffer method)",
            class_name(buffers)
        ))
    };
    if buffers.cast::<PyBuffer>().is_ok() || buffers.is_instance_of::<pyo3::types::PyString>() {
        return Err(not_a_sequence());
    }
    let mut out = Vec::new();
    for item in buffers.try_iter().map_err(|_| not_a_sequence())? {
        let item = item?;
        let buffer = item.cast::<PyBuffer>().map_err(|_| {
            PyTypeError::new_err(format!(
                "{function}() takes a sequence of Buffers; item {} is {}",
                out.len(),
                class_name(&item)
            ))
        })?;
        out.push(buffer.get().open(py)?);
    }
    if out.is_empty() {
        return Err(PyValueError::new_err(format!(
            "{function}() needs at least one buffer"
        )));
    }
    Ok(out)
}

/// A batch function's ``locations``: one location for every buffer, or a list or tuple of one
/// per buffer.
fn batch_locations(
    function: &str,
    locations: &Bound<'_, PyAny>,
    count: usize,
) -> PyResult<Vec<MemLocation>> {
    if locations.is_instance_of::<pyo3::types::PyList>()
        || locations.is_instance_of::<pyo3::types::PyTuple>()
    {
        let given = locations
            .try_iter()?
            .map(|l| required_location(&l?))
            .collect::<PyResult<Vec<_>>>()?;
        if given.len() != count {
            return Err(PyValueError::new_err(format!(
                "{function}(): locations has length {}, buffers has length {count} (give one \
                 location, or one per buffer)",
                given.len()
            )));
        }
        return Ok(given);
    }
    Ok(vec![required_location(locations)?; count])
}

/// Migrates each of ``buffers`` (a sequence of managed :class:`Buffer` objects) to its
/// location, ordered on ``stream``, in one driver call (``cuMemPrefetchBatchAsync``); does not
/// block. ``locations``: one :class:`Device` or :class:`Host` for all, or a list or tuple of one
/// per buffer (``ValueError`` when the lengths differ). ``TypeError`` for a single buffer or
/// anything but a sequence of buffers, or a missing stream; ``ValueError`` for an empty sequence
/// or memory that is not managed; ``RuntimeError`` for a closed buffer; :class:`CUDAError` when
/// the driver refuses (or predates CUDA 12.8).
#[pyfunction]
#[pyo3(signature = (stream, buffers, locations))]
fn prefetch_batch(
    py: Python<'_>,
    stream: &Bound<'_, PyAny>,
    buffers: &Bound<'_, PyAny>,
    locations: &Bound<'_, PyAny>,
) -> PyResult<()> {
    let stream = accept_stream(stream)?;
    let buffers = batch_buffers(py, "prefetch_batch", buffers)?;
    let locations = batch_locations("prefetch_batch", locations, buffers.len())?;
    let refs: Vec<&Buffer> = buffers.iter().map(|b| b.as_ref()).collect();
    Ok(py
        .detach(|| memory::prefetch_batch(&refs, &locations, &stream))
        .map_err(Error::from)?)
}

/// Discards the contents of ``buffers`` (a sequence of managed :class:`Buffer` objects),
/// ordered on ``stream``, in one driver call (``cuMemDiscardBatchAsync``); does not block.
/// Errors as :func:`prefetch_batch`.
#[pyfunction]
#[pyo3(signature = (stream, buffers))]
fn discard_batch(
    py: Python<'_>,
    stream: &Bound<'_, PyAny>,
    buffers: &Bound<'_, PyAny>,
) -> PyResult<()> {
    let stream = accept_stream(stream)?;
    let buffers = batch_buffers(py, "discard_batch", buffers)?;
    let refs: Vec<&Buffer> = buffers.iter().map(|b| b.as_ref()).collect();
    Ok(py
        .detach(|| memory::discard_batch(&refs, &stream))
        .map_err(Error::from)?)
}

/// Discards the contents of ``buffers`` and migrates each to its location, ordered on
/// ``stream``, in one driver call (``cuMemDiscardAndPrefetchBatchAsync``); does not block.
/// ``locations`` and errors as :func:`prefetch_batch`.
#[pyfunction]
#[pyo3(signature = (stream, buffers, locations))]
fn discard_prefetch_batch(
    py: Python<'_>,
    stream: &Bound<'_, PyAny>,
    buffers: &Bound<'_, PyAny>,
    locations: &Bound<'_, PyAny>,
) -> PyResult<()> {
    let stream = accept_stream(stream)?;
    let buffers = batch_buffers(py, "discard_prefetch_batch", buffers)?;
    let locations = batch_locations("discard_prefetch_batch", locations, buffers.len())?;
    let refs: Vec<&Buffer> = buffers.iter().map(|b| b.as_ref()).collect();
    Ok(py
        .detach(|| memory::discard_prefetch_batch(&refs, &locations, &stream))
        .map_err(Error::from)?)
}

/// What another process needs to import one buffer: the pool's export data for it (the payload:
/// the driver's 64-byte ``CUmemPoolPtrExportData``, then the pool's device as 4 bytes,
/// little-endian, -1 for a pinned host pool) and its size in bytes. ``bytes(descriptor)`` is 96
/// bytes; picklable (as ``_init(payload, size)``, cuda.core's form, where a 64-byte payload names
/// no device). Compared by value. Cannot be instantiated directly (``RuntimeError``).
#[pyclass(frozen, name = "IPCBufferDescriptor", module = "custody")]
pub struct PyIpcBufferDescriptor {
    payload: Vec<u8>,
    size: usize,
}

impl PyIpcBufferDescriptor {
    fn of(descriptor: &IpcBufferDescriptor) -> PyIpcBufferDescriptor {
        let mut payload = descriptor.export_data().to_vec();
        payload.extend_from_slice(&descriptor.device_id().unwrap_or(-1).to_le_bytes());
        PyIpcBufferDescriptor {
            payload,
            size: descriptor.size(),
        }
    }

    /// The device the payload names: `Some(None)` for a pinned host pool, `None` when it names
    /// none.
    fn named_device(&self) -> Option<Option<i32>> {
        let bytes: [u8; 4] = self.payload.get(64..68)?.try_into().ok()?;
        let device = i32::from_le_bytes(bytes);
        Some((device >= 0).then_some(device))
    }

    /// The descriptor for an import into a pool of `pool_device` (the device the payload names
    /// is not checked against it: the driver refuses export data of another pool).
    ///
    /// # Errors
    /// `ValueError` for a payload shorter than 64 bytes or a bad size.
    fn resolve(&self, pool_device: Option<i32>) -> PyResult<IpcBufferDescriptor> {
        let export: [u8; 64] = self
            .payload
            .get(..64)
            .and_then(|bytes| bytes.try_into().ok())
            .ok_or_else(|| {
                PyValueError::new_err(format!(
                    "invalid IPC buffer descriptor: its payload is {} bytes; expected at least 64",
                    self.payload.len()
                ))
            })?;
        // The importing pool's device: whether the export data belongs to that pool is the
        // driver's to say (cuMemPoolImportPointer refuses another pool's), as with cuda.core.
        IpcBufferDescriptor::from_parts(export, self.size, pool_device).map_err(descriptor_error)
    }
}

/// The descriptor argument of an import: an `IPCBufferDescriptor`, or its 96-byte form.
fn descriptor_of(
    object: &Bound<'_, PyAny>,
    pool_device: Option<i32>,
) -> PyResult<IpcBufferDescriptor> {
    if let Ok(descriptor) = object.cast::<PyIpcBufferDescriptor>() {
        return descriptor.get().resolve(pool_device);
    }
    if object.is_instance_of::<PyBytes>() {
        let bytes: Vec<u8> = object.extract()?;
        return parse_descriptor(&bytes);
    }
    let name = object
        .get_type()
        .name()
        .map(|n| n.to_string())
        .unwrap_or_default();
    Err(PyTypeError::new_err(format!(
        "Argument 'ipc_descriptor' has incorrect type (expected IPCBufferDescriptor or bytes, \
         got {name})"
    )))
}

fn descriptor_error(error: MemoryError) -> PyErr {
    match error {
        MemoryError::InvalidSize { .. } | MemoryError::Ipc { .. } => {
            PyValueError::new_err(format!("invalid IPC buffer descriptor: {error}"))
        }
        other => Error(other).into(),
    }
}

fn parse_descriptor(bytes: &[u8]) -> PyResult<IpcBufferDescriptor> {
    IpcBufferDescriptor::from_bytes(bytes).map_err(descriptor_error)
}

#[pymethods]
impl PyIpcBufferDescriptor {
    #[new]
    #[pyo3(signature = (*_args, **_kwargs), text_signature = None)]
    fn py_new(_args: &Bound<'_, PyTuple>, _kwargs: Option<&Bound<'_, PyAny>>) -> PyResult<Self> {
        Err(PyRuntimeError::new_err(
            "IPCBufferDescriptor objects cannot be instantiated directly. Use \
             Buffer.ipc_descriptor or IPCBufferDescriptor.from_bytes().",
        ))
    }

    /// A descriptor from its payload and size, as unpickling makes it; checked when
    /// imported (``ValueError`` for a payload shorter than 64 bytes). A 64-byte payload names
    /// no device: the importing pool's is taken.
    #[staticmethod]
    fn _init(reserved: Vec<u8>, size: usize) -> PyIpcBufferDescriptor {
        PyIpcBufferDescriptor {
            payload: reserved,
            size,
        }
    }

    /// Parses the serialised form (``ValueError`` when malformed).
    #[staticmethod]
    fn from_bytes(data: &[u8]) -> PyResult<Self> {
        Ok(PyIpcBufferDescriptor::of(&parse_descriptor(data)?))
    }

    /// The serialised form, 96 bytes.
    fn __bytes__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyBytes>> {
        let descriptor = self.resolve(self.named_device().flatten())?;
        Ok(PyBytes::new(py, &descriptor.to_bytes()))
    }

    /// The buffer's size in bytes.
    #[getter]
    fn size(&self) -> usize {
        self.size
    }

    /// The pool's device; -1 for a pinned host pool or a payload that names none.
    #[getter]
    fn device_id(&self) -> i32 {
        self.named_device().flatten().unwrap_or(-1)
    }

    fn __richcmp__(&self, other: &Bound<'_, PyAny>, op: CompareOp) -> PyResult<Py<PyAny>> {
        let py = other.py();
        let Ok(other) = other.cast::<PyIpcBufferDescriptor>() else {
            return Ok(py.NotImplemented());
        };
        let other = other.get();
        let equal = self.payload == other.payload && self.size == other.size;
        match op {
            CompareOp::Eq => Ok(equal.into_pyobject(py)?.to_owned().into_any().unbind()),
            CompareOp::Ne => Ok((!equal).into_pyobject(py)?.to_owned().into_any().unbind()),
            _ => Ok(py.NotImplemented()),
        }
    }

    fn __hash__(&self) -> u64 {
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        std::hash::Hash::hash(&self.payload, &mut hasher);
        std::hash::Hash::hash(&self.size, &mut hasher);
        std::hash::Hasher::finish(&hasher)
    }

    fn __reduce__<'py>(
        slf: &Bound<'py, Self>,
    ) -> PyResult<(Bound<'py, PyAny>, (Bound<'py, PyBytes>, usize))> {
        let py = slf.py();
        let init = slf.get_type().getattr("_init")?;
        let this = slf.get();
        Ok((init, (PyBytes::new(py, &this.payload), this.size)))
    }

    fn __repr__(&self) -> String {
        format!(
            "<IPCBufferDescriptor size={} device_id={}>",
            self.size,
            self.device_id()
        )
    }
}

/// Registers the buffer classes on the module.
pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyBuffer>()?;
    // pyo3 defines `__del__` as a plain method; assigning it again makes CPython install it as
    // the type's finalizer (`tp_finalize`), which the collector runs on garbage cycles (pyo3's
    // deallocation does not call it, so an ordinary drop pays nothing for it). Subclasses
    // (`ManagedBuffer`, Python subclasses) inherit it.
    let buffer_type = m.py().get_type::<PyBuffer>();
    let finalizer = buffer_type.getattr("__del__")?;
    buffer_type.setattr("__del__", finalizer)?;
    m.add_class::<PyManagedBuffer>()?;
    m.add_class::<PyIpcBufferDescriptor>()?;
    m.add_function(wrap_pyfunction!(prefetch_batch, m)?)?;
    m.add_function(wrap_pyfunction!(discard_batch, m)?)?;
    m.add_function(wrap_pyfunction!(discard_prefetch_batch, m)?)?;
    Ok(())
}
