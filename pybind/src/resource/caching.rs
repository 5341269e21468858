//! `CachingMemoryResource`: an opt-in cache over a built-in resource (`memory::CachingMemoryResource`),
//! whose same-stream hits keep the GIL.

use std::sync::Arc;

use memory::{CachingMemoryResource, MemoryResource};
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};

use super::class::PyMemoryResource;
use super::graph::PyGraphMemoryResource;
use super::methods::{allocate_arguments, allocation_error};
use crate::buffer::class::{Kept, PyBuffer};
use crate::errors::{class_name, expected, Error};
use crate::stream::accept::{accept_stream, default_stream_handle};

/// An opt-in cache over a built-in memory resource (``upstream``: a
/// :class:`DeviceMemoryResource`, :class:`PinnedMemoryResource`,
/// :class:`SynchronousMemoryResource`, ... or a Python subclass of one, whose built-in
/// allocation it uses), as PyTorch's and CuPy's caching allocators keep memory, on every stream
/// it is given. A buffer closed or dropped goes back to a bin of the stream its free is ordered
/// on (its deallocation stream: the allocation's, or the one ``set_deallocation_stream`` named
/// last), and the next ``allocate`` of its size class on that same stream gets the memory again
/// without a driver call; work enqueued there after the free is ordered after every earlier use
/// by stream order. That holds for a stream custody created, a default stream, and a stream
/// wrapped from another library (``Stream.from_handle(int)``, a ``__cuda_stream__`` object):
/// custody cannot keep a stream wrapped from a bare ``int`` alive, so the close records an event
/// on it (``cuEventRecord``, its one driver call) and the cache never names that stream again,
/// which may then be destroyed and its handle given to a new stream safely. A stream with no
/// block of the size cached takes one freed on another stream after waiting for an event
/// recorded there (``cuStreamWaitEvent``: no host wait), when that stream keeps another one of
/// the size, or from any stream when the upstream is out of memory (before the cache is
/// flushed). Streams declared with ``Buffer.record_use`` are waited for before the memory goes
/// back to a bin. Sizes are rounded up to 512 bytes, then to one of four classes per doubling
/// (at most 25% more); ``Buffer.size`` is the size asked for. What the cache cannot cache it says
/// once, as a :class:`CUDAWarning`, and leaves to the upstream resource: allocations on a stream
/// being captured (the upstream allocates, and a pool refuses), blocks freed on a wrapped stream
/// where no event could be recorded (freed at once), and upstream buffers that cannot be lent. A
/// cached block keeps a created stream (or a ``__cuda_stream__`` object) alive until
/// :meth:`trim` or :meth:`close` frees it. Its buffers cannot be exported to another process
/// (``ipc_descriptor`` raises ``RuntimeError``), even over an IPC-enabled pool.
///
/// ``CachingMemoryResource(upstream)``. ``TypeError`` for anything but a built-in memory
/// resource (a ``MemoryResource`` subclass that allocates in Python, or a
/// :class:`GraphMemoryResource`, whose memory belongs to its graph). The upstream resource's
/// own statistics count cached memory as allocated, which it is; :attr:`stats` tells cached
/// from lent out.
///
/// With the environment variable ``CUSTODY_CACHING_PASS_THROUGH`` set (to anything but empty or
/// ``0``) when the process first allocates through a cache, every cache of the process passes
/// each allocation and each free through to its upstream resource and caches nothing, as if it
/// were not there: for tools that follow the driver's allocations, such as compute-sanitizer's
/// leak and stream-ordered race checks, which cannot see memory kept in a bin.
#[pyclass(frozen, extends = PyMemoryResource, name = "CachingMemoryResource", module = "custody")]
pub struct PyCachingMemoryResource {
    inner: Arc<CachingMemoryResource>,
    upstream: Py<PyAny>,
}

/// `Ok`, a new `dict` of the counters `$fields` of `$value` (a struct of ints), each keyed by
/// its field's name, in the order given: what `stats` and `trim` return.
macro_rules! counters_dict {
    ($py:expr, $value:expr, [$($field:ident),+ $(,)?]) => {{
        let dict = PyDict::new($py);
        $(dict.set_item(stringify!($field), $value.$field)?;)+
        Ok(dict)
    }};
}

#[pymethods]
impl PyCachingMemoryResource {
    #[new]
    fn py_new(upstream: &Bound<'_, PyAny>) -> PyResult<PyClassInitializer<Self>> {
        let Ok(mr) = upstream.cast::<PyMemoryResource>() else {
            return Err(expected("MemoryResource", upstream));
        };
        if mr.is_instance_of::<PyGraphMemoryResource>() {
            return Err(PyTypeError::new_err(
                "CachingMemoryResource cannot cache a GraphMemoryResource: graph memory belongs \
                 to its graph",
            ));
        }
        let Some(native) = mr.get().native.clone() else {
            return Err(PyTypeError::new_err(format!(
                "CachingMemoryResource caches a built-in memory resource, not {} (a \
                 MemoryResource subclass that allocates in Python)",
                class_name(upstream)
            )));
        };
        let inner = CachingMemoryResource::new(native);
        Ok(
            PyMemoryResource::over(inner.clone(), mr.get()).add_subclass(Self {
                inner,
                upstream: upstream.clone().unbind(),
            }),
        )
    }

    /// Allocates ``size`` bytes ordered on ``stream`` (keyword-only), which also orders the
    /// eventual free: a cached block of its size class last freed on ``stream`` when there is
    /// one (no driver call, the GIL kept), else another stream's after ``stream`` waited for its
    /// event, else a new block from the upstream resource (the GIL released for both). Zero bytes
    /// give an empty buffer (address 0, no driver call). ``RuntimeError`` for one byte or more once
    /// :meth:`close` was called; otherwise as ``MemoryResource.allocate`` (``OverflowError``,
    /// ``TypeError``, :class:`CUDAError` for the upstream's failure, after one retry with the cache
    /// flushed when it was out of memory, and ``RuntimeError`` at exit).
    #[pyo3(
        signature = (size, *extra, stream = None),
        text_signature = "($self, size, *, stream)"
    )]
    fn allocate(
        slf: &Bound<'_, Self>,
        size: &Bound<'_, PyAny>,
        extra: &Bound<'_, PyTuple>,
        stream: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Py<PyAny>> {
        let base = slf.as_super();
        let (size, stream) = allocate_arguments(base, size, extra, stream)?;
        let this = base.get();
        let py = slf.py();
        let mr = || Some(slf.clone().into_any().unbind());
        let stream = match stream {
            Some(stream) => accept_stream(&stream)?,
            None => default_stream_handle(),
        };
        if size == 0 {
            return PyBuffer::empty(py, mr(), this.managed);
        }
        let inner = &slf.get().inner;
        // A same-stream hit never calls the driver nor waits beyond the bins' lock: the GIL
        // stays held. Another stream's block (an event wait) and the upstream's: released.
        let buffer = match memory::binding::allocate_cached(inner, size, &stream) {
            Some(buffer) => buffer,
            None => {
                let inner = Arc::clone(inner);
                py.detach(move || inner.allocate(size, &stream))
                    .map_err(|e| allocation_error(base, e))?
            }
        };
        PyBuffer::wrap(py, buffer, mr(), this.managed, Kept::default())
    }

    /// The resource the cache allocates from and frees through.
    #[getter]
    fn upstream(&self, py: Python<'_>) -> Py<PyAny> {
        self.upstream.clone_ref(py)
    }

    /// The cache's counters, as a new ``dict`` of ints: ``in_use_blocks`` and ``in_use_bytes``
    /// (blocks lent out, by block size: the requests rounded up to their class),
    /// ``cached_blocks`` and ``cached_bytes`` (blocks waiting in a bin), ``hits`` (allocations
    /// served from a bin), of which ``cross_stream_hits`` were on another stream than the block's
    /// last free (each after an event wait), ``misses`` (allocations that took a new block from the
    /// upstream), ``events_recorded`` (one per free on a stream wrapped from a bare ``int``, and per
    /// cross-stream hit of a block that had none), ``freed_blocks`` (blocks freed through the
    /// upstream: trims, closes, blocks given back after the close) and ``out_of_memory_retries``.
    /// ``in_use_bytes + cached_bytes`` is what the upstream holds for the cache.
    #[getter]
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let stats = self.inner.stats();
        counters_dict!(
            py,
            stats,
            [
                in_use_blocks,
                in_use_bytes,
                cached_blocks,
                cached_bytes,
                hits,
                cross_stream_hits,
                misses,
                events_recorded,
                freed_blocks,
                out_of_memory_retries,
            ]
        )
    }

    /// Frees the cached blocks now through the upstream resource (for a pool
    /// ``cuMemFreeAsync``, which does not block; for the synchronous resources after the block's
    /// stream has drained), the GIL released, and returns what it did, a ``dict`` of ints:
    /// ``freed_blocks`` and ``freed_bytes``; ``kept_blocks`` and ``kept_bytes``, blocks left in their
    /// bins because their stream is being captured (a free there would join the capture; a later
    /// trim frees them); ``in_use_blocks`` and ``in_use_bytes``, buffers lent out, which it does not
    /// touch. A block last freed on a stream wrapped from a bare ``int`` is freed on a stream of the
    /// cache's own after that free's event (the wrapped stream may be gone). :class:`CUDAError` for
    /// the first free that fails (the others are still freed, their failures reported as
    /// :class:`CUDAWarning`); only blocks on capturing streams stay in the bins either way.
    fn trim<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let inner = Arc::clone(&self.inner);
        let trimmed = py.detach(move || inner.trim()).map_err(Error::from)?;
        counters_dict!(
            py,
            trimmed,
            [
                freed_blocks,
                freed_bytes,
                kept_blocks,
                kept_bytes,
                in_use_blocks,
                in_use_bytes,
            ]
        )
    }

    /// Closes the resource: it allocates nothing more (``RuntimeError``), its cached blocks are
    /// freed as :meth:`trim` frees them, and every buffer still out frees its memory through the
    /// upstream when it is closed or dropped. Idempotent. :class:`CUDAError` as :meth:`trim`.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        let inner = Arc::clone(&self.inner);
        Ok(py.detach(move || inner.close()).map_err(Error::from)?)
    }

    /// Whether :meth:`close` was called.
    #[getter]
    fn is_closed(&self) -> bool {
        self.inner.is_closed()
    }
}
