//! Interop with other array libraries: the pieces of `custody.utils.StridedMemoryView` that read
//! or make C structures (a producer's DLPack tensor, `_DLPackTensor`; a view's own export,
//! `_dlpack_export`; where an address lives, `_dlpack_device_of_pointer`), and the export rule of
//! a buffer: a consumer stream named at an export (`__dlpack__(stream=s)`, a view with a consumer
//! stream) waits for the buffer's deallocation stream and is declared a use of the memory, so
//! the free is ordered after the consumer's work (pybind/DESIGN.md, "Exports to other
//! libraries").

use handles::{EventFlags, EventHandle, MemoryType, StreamHandle};
use memory::Buffer;
use pyo3::exceptions::{PyAttributeError, PyBufferError};
use pyo3::prelude::*;
use pyo3::types::{PyCapsule, PyDict, PyInt, PyTuple};

use crate::errors::Error;
use crate::ffi::dlpack::{consume, exchange_api, export, ForeignTensor, Keep, TensorSpec};
use crate::ffi::wrap_foreign_stream;
use crate::stream::accept::accept_stream;

/// `kDLCPU`, `kDLCUDA`, `kDLCUDAHost`, `kDLCUDAManaged`.
pub(crate) const DL_CPU: i32 = 1;
pub(crate) const DL_CUDA: i32 = 2;
pub(crate) const DL_CUDA_HOST: i32 = 3;
pub(crate) const DL_CUDA_MANAGED: i32 = 13;

/// A producer's DLPack tensor, consumed from its capsule (renamed ``"used_..."``): its
/// description, and the tensor itself, whose deleter runs when this object goes (the views
/// holding it keep it). ``_DLPackTensor(capsule)``: ``BufferError`` for anything but an unused
/// DLPack capsule, a tensor of another major version than 1 (released at once) or a malformed
/// one.
#[pyclass(frozen, name = "_DLPackTensor", module = "custody._custody")]
pub(crate) struct PyDlpackTensor {
    info: TensorSpec,
    _tensor: ForeignTensor,
}

#[pymethods]
impl PyDlpackTensor {
    #[new]
    fn new(capsule: &Bound<'_, PyAny>) -> PyResult<PyDlpackTensor> {
        let (tensor, info) = consume(capsule)?;
        Ok(PyDlpackTensor {
            info,
            _tensor: tensor,
        })
    }

    /// The address of the first element (the tensor's ``data`` plus its ``byte_offset``).
    #[getter]
    fn data(&self) -> u64 {
        self.info.data
    }

    /// ``(device_type, device_id)`` as the producer said.
    #[getter]
    fn device(&self) -> (i32, i32) {
        self.info.device
    }

    /// The shape, a tuple of ints.
    #[getter]
    fn shape<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        PyTuple::new(py, &self.info.shape)
    }

    /// The strides in elements, or None (C-contiguous).
    #[getter]
    fn strides<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyTuple>>> {
        self.info
            .strides
            .as_ref()
            .map(|strides| PyTuple::new(py, strides))
            .transpose()
    }

    /// DLPack's ``(code, bits, lanes)`` of the elements.
    #[getter]
    fn dtype(&self) -> (u8, u8, u16) {
        self.info.dtype
    }

    /// Whether the producer marked the tensor read-only (a versioned tensor's flag).
    #[getter]
    fn readonly(&self) -> bool {
        self.info.readonly
    }
}

/// A DLPack capsule of ``ptr``'s memory on ``device`` with ``shape``, ``strides`` (in elements;
/// None for C order) and DLPack's ``dtype`` ``(code, bits, lanes)``, versioned (with the
/// read-only flag) or not, whose tensor keeps ``owner`` until its deleter runs.
/// ``ValueError`` for strides of another length than the shape.
#[pyfunction]
#[allow(clippy::too_many_arguments)] // the tensor's fields, as the view hands them over
fn _dlpack_export<'py>(
    py: Python<'py>,
    owner: Py<PyAny>,
    ptr: u64,
    device: (i32, i32),
    shape: Vec<i64>,
    strides: Option<Vec<i64>>,
    dtype: (u8, u8, u16),
    readonly: bool,
    versioned: bool,
) -> PyResult<Bound<'py, PyCapsule>> {
    let spec = TensorSpec {
        data: ptr,
        device,
        shape,
        strides,
        dtype,
        readonly,
    };
    export(py, spec, Keep::Object(owner), versioned)
}

/// The capsule ``"dlpack_exchange_api"`` of DLPack's C exchange table for
/// ``StridedMemoryView`` (set on the type as ``__dlpack_c_exchange_api__``): a C consumer takes
/// a view's tensor (its ``__dlpack__(max_version=(1, 0))``) and makes a view of a tensor through
/// it; it allocates nothing and names no current stream.
#[pyfunction]
fn _dlpack_exchange_api(py: Python<'_>) -> PyResult<Bound<'_, PyCapsule>> {
    exchange_api(py)
}

/// ``(device_type, device_ordinal)`` of the memory at ``ptr`` as the driver says
/// (``cuPointerGetAttributes``): kDLCUDA for device memory, kDLCUDAManaged for managed memory,
/// kDLCUDAHost for pinned or registered host memory; the ordinal is the device the memory
/// belongs to. ``BufferError`` for an address the driver does not know.
#[pyfunction]
fn _dlpack_device_of_pointer(py: Python<'_>, ptr: u64) -> PyResult<(i32, i32)> {
    let attributes = py
        .detach(|| handles::pointer_attributes(ptr))
        .map_err(Error::from)?
        .ok_or_else(|| {
            PyBufferError::new_err(format!(
                "{ptr:#x} is not memory the CUDA driver knows (device, pinned or managed)"
            ))
        })?;
    let kind = match attributes.memory_type {
        _ if attributes.is_managed => DL_CUDA_MANAGED,
        MemoryType::Device => DL_CUDA,
        MemoryType::Host => DL_CUDA_HOST,
        MemoryType::Unified => DL_CUDA_MANAGED,
        other => {
            return Err(PyBufferError::new_err(format!(
                "{ptr:#x} is memory of type {other:?}, which no array protocol describes"
            )))
        }
    };
    Ok((kind, attributes.device_ordinal))
}

/// The consumer stream an export names: ``None`` and -1 name none (no ordering); 1 and 2 the
/// legacy and per-thread default streams; any other positive int a stream's handle (one custody
/// created gives that stream back; another is wrapped on the caller's word, as DLPack's
/// ``stream`` argument is the consumer's promise that the stream is live); a stream object as
/// [`accept_stream`] takes it (a `Stream`, or an object with `__cuda_stream__`, kept alive).
///
/// # Errors
/// `BufferError` for 0 (DLPack disallows it: it could mean either default stream) and for any
/// other negative value; what [`accept_stream`] raises for anything else (`TypeError` for a
/// non-stream); `CUDAError` when the driver refuses the handle.
pub(crate) fn consumer_stream(
    py: Python<'_>,
    stream: Option<&Bound<'_, PyAny>>,
) -> PyResult<Option<StreamHandle>> {
    let Some(stream) = stream.filter(|s| !s.is_none()) else {
        return Ok(None);
    };
    if !stream.is_instance_of::<PyInt>() {
        // custody's extension of the protocol: a stream object, kept alive by the use.
        return accept_stream(stream).map(Some);
    }
    let value: i128 = stream.extract()?;
    match value {
        -1 => Ok(None),
        0 => Err(PyBufferError::new_err(
            "stream=0 is ambiguous (DLPack disallows it): pass 1 for the legacy default stream, \
             2 for the per-thread one, a stream's handle, or -1 for no ordering",
        )),
        v if v < 0 => Err(PyBufferError::new_err(format!(
            "stream={v} is not a stream: pass a stream's handle, 1, 2, or -1 for no ordering"
        ))),
        v => {
            let raw = usize::try_from(v).map_err(|_| {
                PyBufferError::new_err(format!("stream={v} is too large for a stream handle"))
            })?;
            Ok(Some(
                py.detach(|| wrap_foreign_stream(raw, None))
                    .map_err(Error::from)?,
            ))
        }
    }
}

/// Whether custody keeps `stream` alive for as long as a use recorded with it needs it: a
/// default stream (bound to its context), a stream custody created, or one wrapped with the
/// object that owns it. A bare handle of another library's stream is not: a use declared on it
/// would make the free wait on a stream that library may destroy first, and a free that waits on
/// a destroyed stream kills the process (docs/driver-facts.md F11).
fn can_keep(stream: &StreamHandle) -> bool {
    stream.default_kind().is_some() || stream.pins_its_stream()
}

/// The export rule: makes `consumer` wait for the buffer's pending work on its deallocation
/// stream (an event recorded there, `cuStreamWaitEvent` on `consumer`: no host wait; nothing
/// when they are the same stream or the memory has no recipe), and declares `consumer` a use of
/// the memory ([`Buffer::record_use`]) when custody can keep it alive ([`can_keep`]), so that the
/// free, wherever it happens, waits for the consumer's work. The declaration comes first: a
/// refused stream changes nothing.
///
/// # Errors
/// What [`Buffer::record_use`] refuses (a closed buffer, another device's stream for device
/// memory, a default stream with no current context); `BufferError` while the deallocation
/// stream is being captured through custody (an event there would be a capture node); what the
/// driver says about the event or the wait.
///
/// Driver calls: `cuCtxGetCurrent` (a default stream), `cuEventCreate`, `cuEventRecord`,
/// `cuStreamWaitEvent`, `cuEventDestroy`; `cuStreamIsCapturing` while a custody capture may run.
pub(crate) fn export_to_stream(
    py: Python<'_>,
    buffer: &Buffer,
    consumer: &StreamHandle,
) -> PyResult<()> {
    const CAPTURED: &str = "the buffer's deallocation stream is being captured into a graph: an \
         export cannot order a consumer after it (pass stream=-1 and order it yourself)";
    let captured = py
        .detach(|| -> Result<bool, Error> {
            let producer = buffer.deallocation_stream();
            let waits = producer
                .as_ref()
                .filter(|p| !(p.raw() == consumer.raw() && p.context() == consumer.context()));
            if let Some(producer) = waits {
                if handles::capture_may_be_active()
                    && !matches!(
                        handles::capture_status(producer)?,
                        handles::CaptureStatus::None
                    )
                {
                    return Ok(true);
                }
            }
            if can_keep(consumer) {
                buffer.record_use(consumer)?;
            }
            if let Some(producer) = waits {
                let context = producer
                    .context()
                    .or(consumer.context())
                    .cloned()
                    .ok_or(handles::HandleError::NoCurrentContext)?;
                let pending = EventHandle::create(&context, EventFlags::DISABLE_TIMING)?;
                pending.record(producer)?;
                consumer.wait_event(&pending)?;
            }
            Ok(false)
        })
        .map_err(PyErr::from)?;
    if captured {
        return Err(PyBufferError::new_err(CAPTURED));
    }
    Ok(())
}

/// `__cuda_array_interface__` (version 3) of `size` bytes at `ptr` as a 1-D `uint8` array, with
/// the stream a consumer must order itself after (`stream`, the deallocation stream; the
/// default-stream tokens as CAI writes them, 1 and 2, never 0), or None when the memory has no
/// recipe.
pub(crate) fn cuda_array_interface<'py>(
    py: Python<'py>,
    ptr: u64,
    size: usize,
    stream: Option<&StreamHandle>,
) -> PyResult<Bound<'py, PyDict>> {
    let interface = PyDict::new(py);
    interface.set_item("shape", (size,))?;
    interface.set_item("typestr", "|u1")?;
    interface.set_item("data", (ptr, false))?;
    interface.set_item("strides", py.None())?;
    interface.set_item("version", 3)?;
    let stream = stream.map(|s| match s.default_kind() {
        Some(handles::DefaultStream::PerThread) => 2,
        Some(_) => 1,
        None => s.raw() as usize,
    });
    interface.set_item("stream", stream)?;
    Ok(interface)
}

/// `AttributeError` for memory no device can access: the CUDA Array Interface describes device
/// memory only (so `hasattr(buffer, "__cuda_array_interface__")` is False for it).
pub(crate) fn no_interface_for_host_memory() -> PyErr {
    PyAttributeError::new_err(
        "host memory has no __cuda_array_interface__ (no device can access it): use DLPack",
    )
}

/// Registers the interop classes and functions on the module.
pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyDlpackTensor>()?;
    m.add_function(wrap_pyfunction!(_dlpack_export, m)?)?;
    m.add_function(wrap_pyfunction!(_dlpack_exchange_api, m)?)?;
    m.add_function(wrap_pyfunction!(_dlpack_device_of_pointer, m)?)?;
    Ok(())
}
