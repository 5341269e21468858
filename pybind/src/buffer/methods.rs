//! `Buffer`'s methods (its struct, which graphs and resources name, is in `class`): closing,
//! the recipe's streams (`set_deallocation_stream`, `record_use`), copies and fills, the
//! memory's properties, DLPack, IPC export and import, and the garbage collector's
//! `__traverse__` / `__clear__` / `__del__`.

use handles::StreamHandle;
use memory::{Buffer, FillValue, IpcError, MemoryError};
use pyo3::exceptions::{PyBufferError, PyOverflowError, PyRuntimeError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::pyclass::{CompareOp, PyTraverseError, PyVisit};
use pyo3::types::{PyDict, PyInt, PyTuple, PyType};

use super::adopt::{address, adopt, FROM_HANDLE};
use super::class::{Kept, PyBuffer};
use super::ipc::{descriptor_of, PyIpcBufferDescriptor};
use super::shared::SharedBuffer;
use crate::errors::{expected, refuse_positional_stream, size_argument, Error};
use crate::ffi::dlpack::{export, Keep, TensorSpec, DLPACK_VERSION};
use crate::ffi::{call_method, getattr};
use crate::graph::class::PyGraphBuilder;
use crate::identity::compare;
use crate::interop::{
    consumer_stream, cuda_array_interface, export_to_stream, no_interface_for_host_memory, DL_CPU,
    DL_CUDA, DL_CUDA_HOST, DL_CUDA_MANAGED,
};
use crate::report::release;
use crate::resource::adapter::python_device_id;
use crate::resource::pools::pool_of;
use crate::stream::accept::{accept_stream, keyword_stream, with_stream};

/// Runs `attached` on `method`'s stream argument when the stream carries its context (a created
/// or wrapped stream, borrowed under its lock, the GIL held: `attached` makes no driver call);
/// for a default-stream token, whose context is the current one, returns the token instead, for
/// the caller to use with the GIL released. `TypeError("<method>() requires a Stream, got
/// None")` for `None`; otherwise as `with_stream` accepts the stream.
fn with_context_stream<T>(
    method: &str,
    stream: &Bound<'_, PyAny>,
    attached: impl FnOnce(&StreamHandle) -> T,
) -> PyResult<Result<T, StreamHandle>> {
    if stream.is_none() {
        return Err(PyTypeError::new_err(format!(
            "{method}() requires a Stream, got None"
        )));
    }
    with_stream(stream, |stream| match stream.context() {
        Some(_) => Ok(attached(stream)),
        None => Err(stream.clone()),
    })
}

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
        self.mr.as_ref().map(|mr| mr.clone_ref(py))
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

    /// One answer to where the memory can be used (`property`: `is_device_accessible`,
    /// `is_host_accessible` or `is_managed`): for an empty buffer its resource's (the memory is
    /// absent; a resource that cannot say whether it is managed is not), else `memory`'s.
    fn accessible(
        &self,
        py: Python<'_>,
        property: &str,
        memory: fn(&Buffer) -> Result<bool, MemoryError>,
    ) -> PyResult<bool> {
        if let Some(mr) = self.empty_of(py) {
            let answer = getattr(mr.as_any(), property).and_then(|value| value.extract());
            return match property {
                "is_managed" => Ok(answer.unwrap_or(false)),
                _ => answer,
            };
        }
        let buffer = self.open(py)?;
        Ok(py.detach(|| memory(&buffer)).map_err(Error::from)?)
    }

    fn dlpack_device_of(&self, py: Python<'_>) -> PyResult<(i32, i32)> {
        let buffer = self.open(py)?;
        let device = self.accessible(py, "is_device_accessible", Buffer::is_device_accessible)?;
        let host = self.accessible(py, "is_host_accessible", Buffer::is_host_accessible)?;
        let mut managed = self.accessible(py, "is_managed", Buffer::is_managed)?;
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
        size: &Bound<'_, PyAny>,
        mr: Option<&Bound<'_, PyAny>>,
        owner: Option<&Bound<'_, PyAny>>,
        extra: &Bound<'_, PyTuple>,
        stream: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Py<PyAny>> {
        let class = py.get_type::<PyBuffer>();
        refuse_positional_stream(class.as_any(), "from_handle", FROM_HANDLE, extra)?;
        adopt(
            py,
            address(ptr)?,
            size_argument("size", size)?,
            mr,
            owner,
            stream,
            false,
        )
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
        let stream = keyword_stream(
            cls.as_any(),
            "from_ipc_descriptor",
            &["mr", "ipc_descriptor"],
            extra,
            stream,
        )?;
        let stream = accept_stream(&stream)?;
        let pool = pool_of(mr)
            .ok_or_else(|| expected("DeviceMemoryResource or PinnedMemoryResource", mr))?;
        if !pool.is_mapped() && !pool.is_ipc_enabled() {
            return Err(crate::resource::ipc::not_ipc_enabled());
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
                MemoryError::Ipc(IpcError::ClaimExceedsMapping { .. }) => {
                    PyValueError::new_err(error.to_string())
                }
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
            None => buffer.close(py).map_err(Error::from),
        };
        if result.is_ok() {
            self.kept.let_go();
        }
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
    /// ``stream`` alive until the free, except a stream wrapped from a bare ``int``
    /// (``Stream.from_handle(int)``), which its owner must keep until then: a destroyed stream
    /// is undefined in the driver. A default stream is bound to the current context (the
    /// per-thread default stream also to the calling thread; freed on another thread, the event
    /// is recorded on that context's legacy default stream, which waits for it). While
    /// ``stream`` is being captured into a graph at the free, the free waits until the capture
    /// ends. A buffer that frees nothing (``from_handle`` without ``mr``) records nothing.
    ///
    /// ``TypeError`` for None or a non-stream; ``RuntimeError`` for a closed buffer or stream, a
    /// default stream with no current context, or a stream whose context (one made by other
    /// code) has been destroyed; ``ValueError`` for a stream of another device (for device
    /// memory; pinned and managed memory accept any device's stream). On error nothing is
    /// recorded.
    fn record_use(&self, py: Python<'_>, stream: &Bound<'_, PyAny>) -> PyResult<()> {
        let buffer = self.buffer();
        // Recording on a stream that carries its context makes no driver call; a default-stream
        // token reads the current context.
        match with_context_stream("record_use", stream, |stream| buffer.record_use(stream))? {
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
    /// ``TypeError`` for None or a non-stream; ``RuntimeError`` for a closed buffer or stream, a
    /// default stream with no current context, or a stream whose context (one made by other
    /// code) has been destroyed; ``ValueError`` for a stream of another device. On error the
    /// old recipe stays.
    fn set_deallocation_stream(&self, py: Python<'_>, stream: &Bound<'_, PyAny>) -> PyResult<()> {
        let buffer = self.buffer();
        // On a stream that carries its context the swap makes no driver call (D10 holds), which
        // saves the GIL round trip. Only dropping the old recipe's last reference to a stream or
        // context calls the driver: that runs with the GIL released, after the stream's lock.
        let swapped = with_context_stream("set_deallocation_stream", stream, |stream| {
            buffer.replace_deallocation_stream(stream)
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
        let stream = &keyword_stream(slf.as_any(), "copy_to", &["dst=None"], extra, stream)?;
        let this = slf.get();
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
        let stream = &keyword_stream(slf.as_any(), "copy_from", &["src"], extra, stream)?;
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
        let stream = &keyword_stream(slf.as_any(), "fill", &["value"], extra, stream)?;
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
        self.kept.owner.as_ref()?.get(py)
    }

    /// Whether a device can access the memory (``RuntimeError`` once closed).
    #[getter]
    fn is_device_accessible(&self, py: Python<'_>) -> PyResult<bool> {
        self.accessible(py, "is_device_accessible", Buffer::is_device_accessible)
    }

    /// Whether the host can access the memory (``RuntimeError`` once closed).
    #[getter]
    fn is_host_accessible(&self, py: Python<'_>) -> PyResult<bool> {
        self.accessible(py, "is_host_accessible", Buffer::is_host_accessible)
    }

    /// Whether the memory is managed (``RuntimeError`` once closed).
    #[getter]
    fn is_managed(&self, py: Python<'_>) -> PyResult<bool> {
        self.accessible(py, "is_managed", Buffer::is_managed)
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
                MemoryError::Ipc(reason) if !buffer.is_mapped() => PyRuntimeError::new_err(
                    format!("Memory resource is not IPC-enabled ({reason})"),
                ),
                other => Error::from(other).into(),
            })?;
        Ok(PyIpcBufferDescriptor::of(&inner))
    }

    /// A DLPack capsule of a 1-D uint8 tensor of ``size`` elements over this memory; the tensor
    /// keeps the memory alive until its deleter runs. With ``max_version`` at least ``(1, 0)`` a
    /// ``"dltensor_versioned"`` capsule (DLPack 1.0, writable, not a copy), else a ``"dltensor"``
    /// one.
    ///
    /// ``stream`` is the consumer's stream: 1 (legacy default), 2 (per-thread default), a
    /// stream's handle, or (custody's addition) a :class:`Stream` or an object with
    /// ``__cuda_stream__``. That stream first waits for the work queued on the buffer's deallocation
    /// stream (an event, no host wait), and it is declared a use of the memory, as
    /// :meth:`record_use` declares one, so the buffer's free, wherever it happens, waits for the
    /// consumer's work. The declaration needs a stream custody can keep alive until the free: a
    /// default stream, one custody created, or one wrapped with its owner
    /// (``Stream.from_handle(obj)`` of an object with ``__cuda_stream__``); the bare handle of
    /// another library's stream only waits (declare its use yourself with :meth:`record_use` of
    /// such a wrapper). ``None`` (DLPack's default) and -1 order nothing.
    ///
    /// ``BufferError`` for ``copy=True``, a ``dl_device`` other than the buffer's own, a
    /// ``max_version`` that is not two ints, memory neither a device nor the host can access, a
    /// ``stream`` of 0 or another negative value, or a deallocation stream being captured;
    /// ``TypeError`` for a ``stream`` that is no stream; ``ValueError`` for another device's stream (device
    /// memory); ``RuntimeError`` once closed. Nothing is exported, waited for or declared on
    /// error.
    #[pyo3(signature = (*, stream = None, max_version = None, dl_device = None, copy = None))]
    fn __dlpack__<'py>(
        &self,
        py: Python<'py>,
        stream: Option<&Bound<'py, PyAny>>,
        max_version: Option<&Bound<'py, PyAny>>,
        dl_device: Option<&Bound<'py, PyAny>>,
        copy: Option<bool>,
    ) -> PyResult<Bound<'py, PyAny>> {
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
                return Err(PyBufferError::new_err(format!(
                    "Sorry, not supported: dl_device other than None or the buffer's own \
                     ({device_type}, {device_id}), got {}",
                    requested.repr().map(|r| r.to_string()).unwrap_or_default()
                )));
            }
        }
        let spec = TensorSpec::bytes_of(&handle, (device_type, device_id))?;
        if let Some(consumer) = consumer_stream(py, stream)? {
            export_to_stream(py, &*self.open(py)?, &consumer)?;
        }
        Ok(export(py, spec, Keep::Memory(handle), versioned)?.into_any())
    }

    /// Applies :meth:`__dlpack__`'s stream rule without exporting: ``stream`` (1, 2 or a
    /// stream's handle) waits for the buffer's deallocation stream and is declared a use when
    /// custody can keep it alive. What ``StridedMemoryView`` calls for a buffer it views through
    /// the CUDA Array Interface with a consumer stream. Errors as :meth:`__dlpack__`'s for
    /// ``stream``.
    fn _export_to_stream(&self, py: Python<'_>, stream: &Bound<'_, PyAny>) -> PyResult<()> {
        let buffer = self.open(py)?;
        if let Some(consumer) = consumer_stream(py, Some(stream))? {
            export_to_stream(py, &buffer, &consumer)?;
        }
        Ok(())
    }

    /// The CUDA Array Interface (version 3): the memory as a 1-D ``uint8`` array of ``size``
    /// elements, writable, with ``stream`` the deallocation stream (1 for the legacy default
    /// stream, 2 for the per-thread one, else the stream's handle; None for memory with no
    /// recipe), on which a consumer must order its use. The interface names no consumer stream,
    /// so nothing is declared: a consumer reading on another stream declares it with
    /// :meth:`record_use`, or views the buffer with ``StridedMemoryView`` and a consumer stream.
    /// ``RuntimeError`` once closed; ``AttributeError`` for memory no device can access.
    #[getter]
    fn __cuda_array_interface__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let buffer = self.open(py)?;
        if self.dlpack_device_of(py)?.0 == DL_CPU {
            return Err(no_interface_for_host_memory());
        }
        let stream = buffer.deallocation_stream();
        cuda_array_interface(py, buffer.ptr(), buffer.size(), stream.as_ref())
    }

    /// ``(device_type, device_id)``: kDLCPU (1), kDLCUDA (2), kDLCUDAHost (3) or kDLCUDAManaged
    /// (13); memory adopted from elsewhere is asked of the driver (managed or not).
    /// ``RuntimeError`` once closed.
    fn __dlpack_device__(&self, py: Python<'_>) -> PyResult<(i32, i32)> {
        self.open(py)?;
        self.dlpack_device_of(py)
    }

    // Only visits: it takes no lock and no reference (pybind/DESIGN.md, "Rules (D10)").
    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        visit.call(&self.mr)?;
        // The handle's references are this object's only while it alone holds the memory.
        if self.inner.as_ref().is_some_and(SharedBuffer::held_alone) {
            for kept in [&self.kept.owner, &self.kept.resource]
                .into_iter()
                .flatten()
            {
                kept.visit(&visit)?;
            }
        }
        Ok(())
    }

    /// Breaks a garbage cycle: frees the memory (with its recipe, and its resource still
    /// alive). The memory resource object goes with this object.
    fn __clear__(&self, py: Python<'_>) {
        if let Some(buffer) = self.inner.as_ref().and_then(SharedBuffer::take) {
            release(py, move || drop(buffer));
        }
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
        compare(other, op, |other: &PyBuffer| {
            // Two open buffers over the same bytes are equal (a view of a buffer equals it); a
            // closed buffer equals only itself.
            std::ptr::eq(self, other)
                || (self.identity == other.identity
                    && !self.buffer().is_closed()
                    && !other.buffer().is_closed())
        })
    }

    fn __hash__(&self) -> u64 {
        crate::identity::hash_of(
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
