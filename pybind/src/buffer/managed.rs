//! `ManagedBuffer`'s methods (its struct is in `class`): adoption, read-mostly, preferred-location
//! and accessed-by advice, prefetch and discard; and the batch functions over several managed
//! buffers (`prefetch_batch`, `discard_batch`, `discard_prefetch_batch`).

use std::sync::Arc;

use handles::{MemAdvice, MemLocation, StreamHandle};
use memory::{Buffer, MemoryError};
use pyo3::exceptions::{PyRuntimeError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyTuple, PyType};

use super::adopt::{address, adopt, FROM_HANDLE};
use super::class::{PyBuffer, PyManagedBuffer};
use crate::errors::{class_name, refuse_positional_stream, size_argument, Error};
use crate::location::{kind_name, location, location_object, required_location};
use crate::stream::accept::{accept_stream, keyword_stream};

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
        size: &Bound<'_, PyAny>,
        mr: Option<&Bound<'_, PyAny>>,
        owner: Option<&Bound<'_, PyAny>>,
        extra: &Bound<'_, PyTuple>,
        stream: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Py<PyAny>> {
        refuse_positional_stream(cls.as_any(), "from_handle", FROM_HANDLE, extra)?;
        adopt(
            cls.py(),
            address(ptr)?,
            size_argument("size", size)?,
            mr,
            owner,
            stream,
            true,
        )
    }

    /// Whether read-mostly advice is set (``CU_MEM_ADVISE_SET_READ_MOSTLY``: reads may be
    /// served from read-only copies on every processor that reads); assigning gives or takes
    /// back that advice. ``ValueError`` for memory that is not managed; ``RuntimeError`` once
    /// closed; :class:`CUDAError` when the driver refuses.
    #[getter]
    fn read_mostly(slf: &Bound<'_, Self>) -> PyResult<bool> {
        Self::with_open(slf, Buffer::read_mostly)
    }

    #[setter]
    fn set_read_mostly(slf: &Bound<'_, Self>, value: bool) -> PyResult<()> {
        let advice = if value {
            MemAdvice::SetReadMostly
        } else {
            MemAdvice::UnsetReadMostly
        };
        Self::with_open(slf, |buffer| buffer.advise(advice))
    }

    /// Where the memory is advised to live: a :class:`Device`, a :class:`Host`, or ``None``
    /// for no preference; assigning one gives that advice, ``None`` takes it back. Errors as
    /// :attr:`read_mostly`; ``TypeError`` for a value that is no location.
    #[getter]
    fn preferred_location(slf: &Bound<'_, Self>) -> PyResult<Py<PyAny>> {
        let location = Self::with_open(slf, Buffer::preferred_location)?;
        location_object(slf.py(), location)
    }

    #[setter]
    fn set_preferred_location(slf: &Bound<'_, Self>, value: &Bound<'_, PyAny>) -> PyResult<()> {
        let advice = match location(value, true)? {
            Some(location) => MemAdvice::SetPreferredLocation(location),
            None => MemAdvice::UnsetPreferredLocation,
        };
        Self::with_open(slf, |buffer| buffer.advise(advice))
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
    fn set_accessed_by(slf: &Bound<'_, Self>, value: &Bound<'_, PyAny>) -> PyResult<()> {
        let mut wanted = Vec::new();
        for item in value.try_iter()? {
            let location = accessed_by_location(&item?)?;
            if !wanted.contains(&location) {
                wanted.push(location);
            }
        }
        Self::with_open(slf, |buffer| {
            let current = buffer.accessed_by()?;
            for gone in current.iter().filter(|l| !wanted.contains(l)) {
                buffer.advise(MemAdvice::UnsetAccessedBy(*gone))?;
            }
            for new in wanted.iter().filter(|l| !current.contains(l)) {
                buffer.advise(MemAdvice::SetAccessedBy(*new))?;
            }
            Ok(())
        })
    }

    /// The locations accessed-by advice is set for, as objects (for :attr:`accessed_by`).
    fn _accessed_by_list(slf: &Bound<'_, Self>) -> PyResult<Vec<Py<PyAny>>> {
        let locations = Self::with_open(slf, Buffer::accessed_by)?;
        locations
            .into_iter()
            .map(|l| location_object(slf.py(), Some(l)))
            .collect()
    }

    /// Gives (``on``) or takes back accessed-by advice for one location (for
    /// :attr:`accessed_by`).
    fn _advise_accessed_by(
        slf: &Bound<'_, Self>,
        location: &Bound<'_, PyAny>,
        on: bool,
    ) -> PyResult<()> {
        let location = accessed_by_location(location)?;
        let advice = if on {
            MemAdvice::SetAccessedBy(location)
        } else {
            MemAdvice::UnsetAccessedBy(location)
        };
        Self::with_open(slf, |buffer| buffer.advise(advice))
    }

    /// Where the memory was last prefetched to (:meth:`prefetch`, the batch functions): a
    /// :class:`Device`, a :class:`Host`, or ``None`` when it never was (read from the driver's
    /// ``CU_MEM_RANGE_ATTRIBUTE_LAST_PREFETCH_LOCATION``; not in cuda.core 1.2). Errors as
    /// :attr:`read_mostly`.
    #[getter]
    fn last_prefetch_location(slf: &Bound<'_, Self>) -> PyResult<Py<PyAny>> {
        let location = Self::with_open(slf, Buffer::last_prefetch_location)?;
        location_object(slf.py(), location)
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
        location: &Bound<'_, PyAny>,
        extra: &Bound<'_, PyTuple>,
        stream: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        Self::migrate(slf, "prefetch", location, extra, stream, Buffer::prefetch)
    }

    /// Discards the memory's contents (they read as undefined until written; no pages are
    /// migrated back), ordered on ``stream`` (keyword-only, as :meth:`prefetch`); does not
    /// block. Errors as :meth:`prefetch`; :class:`CUDAError` from a driver before CUDA 12.8.
    #[pyo3(signature = (*extra, stream = None), text_signature = "($self, *, stream)")]
    fn discard(
        slf: &Bound<'_, Self>,
        extra: &Bound<'_, PyTuple>,
        stream: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let stream = keyword_stream(slf.as_any(), "discard", &[], extra, stream)?;
        let stream = accept_stream(&stream)?;
        Self::with_open(slf, |buffer| buffer.discard(&stream))
    }

    /// Discards the memory's contents and migrates it to ``location``, ordered on ``stream``
    /// (keyword-only, as :meth:`prefetch`); does not block. Errors as :meth:`discard`.
    #[pyo3(
        signature = (location, *extra, stream = None),
        text_signature = "($self, location, *, stream)"
    )]
    fn discard_prefetch(
        slf: &Bound<'_, Self>,
        location: &Bound<'_, PyAny>,
        extra: &Bound<'_, PyTuple>,
        stream: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let op = Buffer::discard_prefetch;
        Self::migrate(slf, "discard_prefetch", location, extra, stream, op)
    }
}

impl PyManagedBuffer {
    /// `method(location, *, stream)`, a stream-ordered move of the memory to `location`
    /// (`prefetch`, `discard_prefetch`): the stream, then the location, then the buffer checked,
    /// and `op` run as `with_open` runs it.
    fn migrate(
        slf: &Bound<'_, Self>,
        method: &str,
        location: &Bound<'_, PyAny>,
        extra: &Bound<'_, PyTuple>,
        stream: Option<&Bound<'_, PyAny>>,
        op: impl FnOnce(&Buffer, MemLocation, &StreamHandle) -> Result<(), MemoryError> + Send,
    ) -> PyResult<()> {
        let stream = keyword_stream(slf.as_any(), method, &["location"], extra, stream)?;
        let stream = accept_stream(&stream)?;
        let location = required_location(location)?;
        Self::with_open(slf, |buffer| op(buffer, location, &stream))
    }

    /// `run` on the open buffer with the GIL released (every managed-memory query and advice is
    /// a driver call): `RuntimeError` once closed, the driver's failure as `errors` maps it.
    fn with_open<T: Send>(
        slf: &Bound<'_, Self>,
        run: impl FnOnce(&Buffer) -> Result<T, MemoryError> + Send,
    ) -> PyResult<T> {
        let py = slf.py();
        let buffer = slf.as_super().get().open(py)?;
        Ok(py.detach(|| run(&buffer)).map_err(Error::from)?)
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
pub(super) fn prefetch_batch(
    py: Python<'_>,
    stream: &Bound<'_, PyAny>,
    buffers: &Bound<'_, PyAny>,
    locations: &Bound<'_, PyAny>,
) -> PyResult<()> {
    let op = memory::prefetch_batch;
    migrate_batch(py, "prefetch_batch", stream, buffers, locations, op)
}

/// Discards the contents of ``buffers`` (a sequence of managed :class:`Buffer` objects),
/// ordered on ``stream``, in one driver call (``cuMemDiscardBatchAsync``); does not block.
/// Errors as :func:`prefetch_batch`.
#[pyfunction]
#[pyo3(signature = (stream, buffers))]
pub(super) fn discard_batch(
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
pub(super) fn discard_prefetch_batch(
    py: Python<'_>,
    stream: &Bound<'_, PyAny>,
    buffers: &Bound<'_, PyAny>,
    locations: &Bound<'_, PyAny>,
) -> PyResult<()> {
    let op = memory::discard_prefetch_batch;
    migrate_batch(py, "discard_prefetch_batch", stream, buffers, locations, op)
}

/// `function(stream, buffers, locations)`, a batch move of managed memory
/// (`prefetch_batch`, `discard_prefetch_batch`): the arguments read as those say, then `op`, one
/// driver call, run with the GIL released.
fn migrate_batch(
    py: Python<'_>,
    function: &str,
    stream: &Bound<'_, PyAny>,
    buffers: &Bound<'_, PyAny>,
    locations: &Bound<'_, PyAny>,
    op: impl FnOnce(&[&Buffer], &[MemLocation], &StreamHandle) -> Result<(), MemoryError> + Send,
) -> PyResult<()> {
    let stream = accept_stream(stream)?;
    let buffers = batch_buffers(py, function, buffers)?;
    let locations = batch_locations(function, locations, buffers.len())?;
    let refs: Vec<&Buffer> = buffers.iter().map(|b| b.as_ref()).collect();
    Ok(py
        .detach(|| op(&refs, &locations, &stream))
        .map_err(Error::from)?)
}
