//! `IPCBufferDescriptor`: what another process needs to import one buffer (the pool's export data
//! for it and its size), its 96-byte form, and the descriptor argument of an import.

use memory::{IpcBufferDescriptor, MemoryError};
use pyo3::exceptions::{PyRuntimeError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::pyclass::CompareOp;
use pyo3::types::{PyBytes, PyTuple};

use crate::errors::{ipc_data, Error};
use crate::identity::compare;

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
    pub(super) fn of(descriptor: &IpcBufferDescriptor) -> PyIpcBufferDescriptor {
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
        let export = ipc_data(&self.payload, "IPC buffer descriptor: its payload")?;
        // The importing pool's device: whether the export data belongs to that pool is the
        // driver's to say (cuMemPoolImportPointer refuses another pool's), as with cuda.core.
        IpcBufferDescriptor::from_parts(export, self.size, pool_device).map_err(descriptor_error)
    }
}

/// The descriptor argument of an import: an `IPCBufferDescriptor`, or its 96-byte form.
pub(super) fn descriptor_of(
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
        MemoryError::InvalidSize { .. } | MemoryError::Ipc(_) => {
            PyValueError::new_err(format!("invalid IPC buffer descriptor: {error}"))
        }
        other => Error::Memory(other).into(),
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
        compare(other, op, |other: &PyIpcBufferDescriptor| {
            self.payload == other.payload && self.size == other.size
        })
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
