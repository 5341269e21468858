//! `MemoryResource` (subclassable in Python) and the built-in resources, and the adapter that
//! lets a Python subclass free adopted memory at teardown ([`PyResourceAdapter`]).
//!
//! Which `deallocate` frees memory adopted with `Buffer.from_handle(ptr, size, mr=...)`: a
//! built-in resource (or a Python subclass of one that does not override `deallocate`) frees with
//! its own rule, without Python; any other Python subclass gets its own `deallocate(ptr, size,
//! stream=...)` called, from whatever thread drops the buffer, with the recipe's context current
//! and the GIL held only for that call. Memory a built-in `allocate` returned is always freed by
//! the built-in rule.

use std::os::fd::{AsRawFd, IntoRawFd, OwnedFd};
use std::sync::{Arc, Mutex, OnceLock, PoisonError, Weak};

use handles::sys_types::{CUdeviceptr, CUmemPool_attribute};
use handles::{HandleError, ManagedPoolLocation, MemoryPoolHandle, OwnedAllocation, StreamHandle};
use memory::{
    Buffer, CachingMemoryResource, DeviceMemoryResource, DeviceMemoryResourceOptions,
    GraphMemoryResource, LegacyPinnedMemoryResource, ManagedMemoryResource,
    ManagedPoolMemoryResource, MemoryError, MemoryResource, PinnedMemoryResource,
    PinnedMemoryResourceOptions, PoolMemoryResource, SynchronousMemoryResource,
};
use pyo3::exceptions::{PyRuntimeError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};

use crate::classes::{Kept, PyBuffer, PyGraphBuilder};
use crate::errors::{class_name, expected, stream_is_keyword_only, Error};
use crate::ffi::{call_method, getattr, hasattr, owned_allocation, with_borrowed_fd};
use crate::graph::allocate_in;
use crate::nested;
use crate::options::{check_options, option};
use crate::report::{refuse_allocation_at_exit, OwedFree, PyObjRef};
use crate::stream::{accept_stream, default_stream_handle, required_stream};

/// The base class of memory resources; subclass it in Python.
///
/// A subclass implements ``allocate`` (usually returning ``Buffer.from_handle(ptr, size,
/// mr=self, stream=stream)``), ``deallocate``, ``is_device_accessible``,
/// ``is_host_accessible`` and ``device_id`` (read only when asked, never at adoption). Its
/// ``deallocate`` runs at teardown from whatever thread drops the buffer, with the recipe's
/// context current and the GIL held only for that call; a host-only resource
/// (``is_device_accessible`` False) has no recipe: adoption needs no context, any ``stream``
/// given has nothing to order, and ``deallocate`` receives ``default_stream()`` with no
/// context made current; an exception from it is reported as a :class:`CUDAWarning` (re-raised by an explicit
/// ``close()``). It is never entered on a thread where a ``deallocate`` call is already
/// running: a buffer released inside one (its last reference dropped, a garbage collection, a
/// ``close()``) is freed right after that call returns, on the same thread, in its own recipe's
/// context (a failure then is a :class:`CUDAWarning`). Once the interpreter is finalizing it is
/// not called: the memory is leaked and that is reported on stderr (``atexit`` handlers still
/// free through it).
///
/// ``MemoryResource(*args, **kwargs)`` accepts and ignores any arguments (for subclasses).
#[pyclass(frozen, subclass, weakref, name = "MemoryResource", module = "custody")]
pub struct PyMemoryResource {
    /// The Rust resource of a built-in; `None` for a Python subclass of this class.
    pub(crate) native: Option<Arc<dyn MemoryResource>>,
    /// Whether `allocate` returns `ManagedBuffer`s.
    managed: bool,
    /// Whether `allocate` takes no stream (the resource allocates synchronously; the free is
    /// then ordered on the default stream).
    stream_optional: bool,
}

/// The `TypeError` of the base class's `what`, naming the class called: `MemoryResource` itself,
/// or a subclass that does not implement `what`.
fn not_implemented(class: &str, what: &str) -> PyErr {
    if class == "MemoryResource" {
        PyTypeError::new_err(format!(
            "MemoryResource.{what} must be implemented by subclasses"
        ))
    } else {
        PyTypeError::new_err(format!(
            "{class}.{what} must be implemented: {class} subclasses MemoryResource without \
             defining it"
        ))
    }
}

/// The Rust resource of a built-in `mr`; for a Python subclass, [`not_implemented`] naming its
/// class.
fn native_of<'a>(
    mr: &'a Bound<'_, PyMemoryResource>,
    what: &str,
) -> PyResult<&'a Arc<dyn MemoryResource>> {
    mr.get()
        .native
        .as_ref()
        .ok_or_else(|| not_implemented(&class_name(mr.as_any()), what))
}

impl PyMemoryResource {
    fn native(&self, what: &str) -> PyResult<&Arc<dyn MemoryResource>> {
        self.native
            .as_ref()
            .ok_or_else(|| not_implemented("MemoryResource", what))
    }

    fn builtin(native: Arc<dyn MemoryResource>, managed: bool) -> PyClassInitializer<Self> {
        PyClassInitializer::from(PyMemoryResource {
            native: Some(native),
            managed,
            stream_optional: false,
        })
    }

    /// A built-in over another resource's memory (the caching resource): its buffers are
    /// managed, and its stream optional, as `upstream`'s.
    fn over(
        native: Arc<dyn MemoryResource>,
        upstream: &PyMemoryResource,
    ) -> PyClassInitializer<Self> {
        PyClassInitializer::from(PyMemoryResource {
            native: Some(native),
            managed: upstream.managed,
            stream_optional: upstream.stream_optional,
        })
    }

    /// A built-in whose `allocate` takes an optional stream (a synchronous allocator).
    fn synchronous(native: Arc<dyn MemoryResource>) -> PyClassInitializer<Self> {
        PyClassInitializer::from(PyMemoryResource {
            native: Some(native),
            managed: false,
            stream_optional: true,
        })
    }
}

#[pymethods]
impl PyMemoryResource {
    #[new]
    #[pyo3(signature = (*_args, **_kwargs), text_signature = "(*args, **kwargs)")]
    fn py_new(_args: &Bound<'_, PyTuple>, _kwargs: Option<&Bound<'_, PyAny>>) -> Self {
        PyMemoryResource {
            native: None,
            managed: false,
            stream_optional: false,
        }
    }

    /// Allocates ``size`` bytes ordered on ``stream`` (keyword-only), which also orders the
    /// eventual free.
    ///
    /// Zero bytes give an empty buffer of this resource (address 0, no driver call).
    /// ``LegacyPinnedMemoryResource`` and ``SynchronousMemoryResource`` need no ``stream`` (the
    /// free is then ordered on the default stream). ``OverflowError`` for negative sizes or more
    /// than ``isize::MAX``; ``TypeError`` for a missing, None or non-stream ``stream``, or one
    /// passed by position, the message naming the class called; ``RuntimeError`` for a closed
    /// stream or a default stream with no current context; :class:`CUDAError` for the driver's
    /// failure; ``RuntimeError`` (``the interpreter is shutting down: ...``) on a thread other
    /// than the interpreter's exit thread once custody's ``atexit`` callback has run. The base
    /// class raises ``TypeError``, and so does a subclass that does not define it.
    // pyo3 parses the arguments: under the 3.11 stable ABI the method is called with
    // `METH_FASTCALL | METH_KEYWORDS` and keyword names are compared in place, so the usual
    // call `allocate(n, stream=s)` builds no argument tuple and no keyword dict (a hand parser
    // over `*args, **kwargs` made pyo3 build both, -871 instructions per allocate+close;
    // pybind/DESIGN.md, "Hot path"). `stream` defaults to `None` and `*extra` (the shared
    // empty tuple for such a call) catches a stream passed by position, so that those errors
    // still name the class called (`allocate_arguments`). No `**kwargs`: with one pyo3 falls
    // back to `METH_VARARGS | METH_KEYWORDS` (a tuple and a dict per call, +990 instructions
    // per allocate+close), so an unknown keyword gets pyo3's message, which names the base
    // class `MemoryResource`.
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
        refuse_allocation_at_exit(slf.as_any())?;
        let this = slf.get();
        let (size, stream) = allocate_arguments(slf, size, extra, stream, this.stream_optional)?;
        let native = Arc::clone(native_of(slf, "allocate")?);
        let py = slf.py();
        let mr = || Some(slf.clone().into_any().unbind());
        let stream = match stream {
            Some(stream) => {
                if let Ok(builder) = stream.cast::<PyGraphBuilder>() {
                    if slf.is_instance_of::<PyGraphMemoryResource>() {
                        if size == 0 {
                            builder.get().builder()?;
                            return PyBuffer::empty(py, mr(), this.managed);
                        }
                        return allocate_in(
                            py,
                            builder.get(),
                            size,
                            slf.clone().into_any().unbind(),
                        );
                    }
                }
                accept_stream(&stream)?
            }
            // Resources whose memory is allocated synchronously: the free is ordered on the
            // default stream, bound to the current context.
            None => default_stream_handle(),
        };
        if size == 0 {
            return PyBuffer::empty(py, mr(), this.managed);
        }
        let buffer = py
            .detach(move || native.allocate(size, &stream))
            .map_err(|e| allocation_error(slf, e))?;
        PyBuffer::wrap(py, buffer, mr(), this.managed, Kept::default())
    }

    /// Frees ``size`` bytes at ``ptr``, which this resource allocated, ordered on ``stream``
    /// (keyword-only), as the resource's own buffers are freed; raises on failure
    /// (:class:`CUDAError`). ``TypeError`` for a missing, ``None`` or non-stream ``stream`` or one
    /// passed by position (it is keyword-only); ``RuntimeError`` for a closed stream. The base
    /// class raises ``TypeError``.
    #[pyo3(
        signature = (ptr, size, *extra, stream = None),
        text_signature = "($self, ptr, size, *, stream)"
    )]
    fn deallocate(
        slf: &Bound<'_, Self>,
        py: Python<'_>,
        ptr: CUdeviceptr,
        size: usize,
        extra: &Bound<'_, PyTuple>,
        stream: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        if !extra.is_empty() {
            return Err(stream_is_keyword_only(
                &format!("{}.deallocate", class_name(slf.as_any())),
                "2 positional arguments",
                2 + extra.len(),
                "deallocate(ptr, size, stream=s)",
            ));
        }
        let native = Arc::clone(native_of(slf, "deallocate")?);
        let stream = accept_stream(&required_stream(stream)?)?;
        py.detach(move || native.deallocate(owned_allocation(ptr, size), &stream))
            .map_err(Error::from)?;
        Ok(())
    }

    /// Whether a device can access the memory. The base class raises ``TypeError``.
    #[getter]
    fn is_device_accessible(slf: &Bound<'_, Self>) -> PyResult<bool> {
        Ok(native_of(slf, "is_device_accessible")?.is_device_accessible())
    }

    /// Whether the host can access the memory. The base class raises ``TypeError``.
    #[getter]
    fn is_host_accessible(slf: &Bound<'_, Self>) -> PyResult<bool> {
        Ok(native_of(slf, "is_host_accessible")?.is_host_accessible())
    }

    /// The device the memory belongs to; -1 for memory bound to no device. The base class raises
    /// ``TypeError``.
    #[getter]
    fn device_id(slf: &Bound<'_, Self>) -> PyResult<i32> {
        Ok(native_of(slf, "device_id")?.device_id().unwrap_or(-1))
    }

    /// Whether the memory is managed (False for the base class).
    #[getter]
    fn is_managed(&self) -> bool {
        self.native.as_ref().is_some_and(|mr| mr.is_managed())
    }
}

/// The class name the user called a method on (`DeviceMemoryResource`, a Python subclass).
fn type_name(object: &Bound<'_, PyAny>) -> String {
    class_name(object)
}

/// An allocation's error, with the capture-state errors in cuda.core's words, naming the class
/// called.
fn allocation_error(mr: &Bound<'_, PyMemoryResource>, error: MemoryError) -> PyErr {
    if pool_of(mr.as_any()).is_some_and(|pool| pool.is_mapped()) {
        return PyTypeError::new_err("Cannot allocate from a mapped IPC-enabled memory resource");
    }
    match error {
        MemoryError::StreamCapturing => pyo3::exceptions::PyRuntimeError::new_err(format!(
            "{} cannot perform memory operations on a capturing stream (consider using \
             GraphMemoryResource).",
            type_name(mr.as_any())
        )),
        MemoryError::NotCapturing => pyo3::exceptions::PyRuntimeError::new_err(format!(
            "{} cannot perform memory operations on a non-capturing stream. Allocate from a \
             graph memory resource only while a stream is being captured.",
            type_name(mr.as_any())
        )),
        other => Error::from(other).into(),
    }
}

/// `MemoryResource.allocate`'s arguments `(size, *, stream)` as pyo3 collected them, with
/// CPython's messages naming the class called. A missing or `None` stream is `None` when
/// `stream_optional`, and refused otherwise.
fn allocate_arguments<'py>(
    mr: &Bound<'py, PyMemoryResource>,
    size: &Bound<'py, PyAny>,
    extra: &Bound<'py, PyTuple>,
    stream: Option<&Bound<'py, PyAny>>,
    stream_optional: bool,
) -> PyResult<(usize, Option<Bound<'py, PyAny>>)> {
    let name = || format!("{}.allocate()", type_name(mr.as_any()));
    if !extra.is_empty() {
        return Err(stream_is_keyword_only(
            &format!("{}.allocate", type_name(mr.as_any())),
            "1 positional argument",
            1 + extra.len(),
            "allocate(size, stream=s)",
        ));
    }
    let stream = stream.filter(|s| !s.is_none()).cloned();
    if stream.is_none() && !stream_optional {
        return Err(PyTypeError::new_err(format!(
            "{} missing 1 required keyword argument: 'stream' (stream is required and must \
             not be None: pass a Stream explicitly, e.g. Device().create_stream() or \
             custody.default_stream())",
            name()
        )));
    }
    let size: usize = size.extract()?;
    Ok((size, stream))
}

/// A Python memory resource seen from Rust: `deallocate` calls the object's `deallocate`
/// (attached to the interpreter for that call only); whether the memory is device-, host- or
/// managed memory is read once, when the buffer is adopted. `device_id` is not read then (it
/// may raise, or not be known yet): the adapter reports none, so no stream is checked against
/// it, and `Buffer.device_id` asks the Python object when asked.
pub(crate) struct PyResourceAdapter {
    object: Arc<PyObjRef>,
    type_name: Arc<str>,
    device: bool,
    host: bool,
    managed: bool,
    /// The one free this adapter's buffer owes through Python (an adapter is made per
    /// adoption), handed to the call when `deallocate` comes.
    owed: Mutex<Option<OwedFree>>,
}

impl MemoryResource for PyResourceAdapter {
    fn allocate(
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
            stream: self.device.then(|| stream.clone()),
            owed: self
                .owed
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .take(),
        })
        .map_err(|failure| {
            // Raised: the exception travels in the error, for an explicit close to re-raise.
            // Skipped: the interpreter is finalizing (or this thread may not attach any more),
            // the memory is leaked, never freed by half a Python, and the skip is reported.
            MemoryError::Handle(HandleError::deallocator(failure))
        })
    }

    fn is_device_accessible(&self) -> bool {
        self.device
    }

    fn is_host_accessible(&self) -> bool {
        self.host
    }

    fn device_id(&self) -> Option<i32> {
        None
    }

    fn is_managed(&self) -> bool {
        self.managed
    }

    /// The Python class's name: what reports call the resource.
    fn name(&self) -> &str {
        &self.type_name
    }
}

/// What [`resolve`] finds: the Rust resource, and for an adapter a `Weak` to its Python object.
pub(crate) type Resolved = (Arc<dyn MemoryResource>, Option<Weak<PyObjRef>>);

/// The Rust resource that will own memory adopted with `mr=` (`size` bytes at `ptr`): a
/// built-in's own (unless a Python subclass overrides `deallocate`), or an adapter calling the
/// Python object, with a `Weak` to the reference the adapter holds (for the collector). An
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
    let weak = Arc::downgrade(&object);
    let type_name: Arc<str> = Arc::from(mr.get_type().name()?.to_string());
    let owed = OwedFree::new(Arc::clone(&type_name), ptr, size);
    let adapter: Arc<dyn MemoryResource> = Arc::new(PyResourceAdapter {
        object,
        type_name,
        device,
        host,
        managed,
        owed: Mutex::new(Some(owed)),
    });
    Ok((adapter, Some(weak)))
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

/// A device ordinal given as an `int` or a `Device`.
fn device_ordinal(device: &Bound<'_, PyAny>) -> PyResult<i32> {
    if device.is_none() {
        return Err(PyTypeError::new_err(
            "a device (int or Device) is required, got None",
        ));
    }
    let value = if device.hasattr("device_id")? && !device.is_instance_of::<pyo3::types::PyInt>() {
        device.getattr("device_id")?
    } else {
        device.clone()
    };
    let ordinal: i64 = value
        .extract()
        .map_err(|_| expected("device ordinal (int) or Device", device))?;
    if ordinal < 0 {
        return Err(PyValueError::new_err(format!(
            "a device ordinal is not negative, got {ordinal}"
        )));
    }
    i32::try_from(ordinal)
        .map_err(|_| PyValueError::new_err(format!("device ordinal {ordinal} is out of range")))
}

/// A pool resource, for IPC and attributes.
#[derive(Clone)]
enum Pool {
    Device(Arc<DeviceMemoryResource>),
    Pinned(Arc<PinnedMemoryResource>),
    Managed(Arc<ManagedPoolMemoryResource>),
}

impl Pool {
    fn as_pool(&self) -> &dyn PoolMemoryResource {
        match self {
            Pool::Device(mr) => mr.as_ref(),
            Pool::Pinned(mr) => mr.as_ref(),
            Pool::Managed(mr) => mr.as_ref(),
        }
    }

    fn export(&self, py: Python<'_>) -> PyResult<OwnedFd> {
        if !self.as_pool().is_ipc_enabled() && !self.as_pool().is_closed() {
            return Err(not_ipc_enabled());
        }
        let pool = self.clone();
        Ok(py
            .detach(move || pool.as_pool().export_pool())
            .map_err(Error::from)?)
    }

    /// The class name of the resource kind, as `IPCAllocationHandle` records it.
    fn kind(&self) -> &'static str {
        match self {
            Pool::Device(_) => "DeviceMemoryResource",
            Pool::Pinned(_) => "PinnedMemoryResource",
            Pool::Managed(_) => "ManagedMemoryResource",
        }
    }

    pub(crate) fn import_buffer(
        &self,
        descriptor: &memory::IpcBufferDescriptor,
        stream: &StreamHandle,
    ) -> Result<Buffer, MemoryError> {
        match self {
            Pool::Device(mr) => Buffer::from_ipc_descriptor(mr, descriptor, stream),
            Pool::Pinned(mr) => Buffer::from_ipc_descriptor(mr, descriptor, stream),
            Pool::Managed(mr) => Buffer::from_ipc_descriptor(mr, descriptor, stream),
        }
    }
}

/// `RuntimeError("Memory resource is not IPC-enabled")`, cuda.core's words.
pub(crate) fn not_ipc_enabled() -> PyErr {
    pyo3::exceptions::PyRuntimeError::new_err(
        "Memory resource is not IPC-enabled: make its pool with ipc_enabled=True",
    )
}

/// A pool resource's identity across processes: the UUID naming its pool (made on first use for
/// an exporting pool, carried over for an imported one), and the shareable handle
/// `allocation_handle` exported once and kept (so that a pickle sent to a spawned process can
/// pass its file descriptor, which must stay open until the process starts).
#[derive(Default)]
pub(crate) struct PoolIpc {
    uuid: OnceLock<Py<PyAny>>,
    /// Never made or dropped under the lock.
    handle: Mutex<Option<Py<PyAny>>>,
}

impl PoolIpc {
    /// The pool's UUID (`None` for a pool that cannot be shared).
    fn uuid(&self, py: Python<'_>, pool: &dyn PoolMemoryResource) -> PyResult<Option<Py<PyAny>>> {
        if !pool.is_ipc_enabled() && !pool.is_mapped() {
            return Ok(None);
        }
        if let Some(uuid) = self.uuid.get() {
            return Ok(Some(uuid.clone_ref(py)));
        }
        let made = py.import("uuid")?.call_method0("uuid4")?.unbind();
        Ok(Some(self.uuid.get_or_init(|| made).clone_ref(py)))
    }

    /// A new `IPCAllocationHandle` owning a fresh export of `pool` (the caller's).
    fn new_handle(&self, py: Python<'_>, pool: &Pool) -> PyResult<Py<PyAny>> {
        let fd = pool.export(py)?;
        let uuid = self.uuid(py, pool.as_pool())?;
        let handle = py
            .import("custody")?
            .getattr("IPCAllocationHandle")?
            .call_method1(
                "_init",
                (
                    fd.as_raw_fd(),
                    uuid,
                    pool.kind(),
                    pool.as_pool().pool().device().unwrap_or(-1),
                ),
            )?;
        // The handle object owns the descriptor now.
        let _ = fd.into_raw_fd();
        Ok(handle.unbind())
    }

    /// The kept handle, exported on first use (again if it was closed).
    fn kept_handle(&self, py: Python<'_>, pool: &Pool) -> PyResult<Py<PyAny>> {
        let kept = self
            .handle
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .as_ref()
            .map(|h| h.clone_ref(py));
        if let Some(kept) = kept {
            if !kept.bind(py).getattr("is_closed")?.extract::<bool>()? {
                return Ok(kept);
            }
        }
        let made = self.new_handle(py, pool)?;
        let old = self
            .handle
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .replace(made.clone_ref(py));
        drop(old);
        Ok(made)
    }
}

/// What an `IPCAllocationHandle` records besides its file descriptor: the pool's UUID, the
/// kind of resource that exported it and that resource's device (-1 for a pinned pool).
struct HandleParts {
    fd: i32,
    uuid: Option<Py<PyAny>>,
    kind: Option<String>,
    device: Option<i32>,
}

/// A shareable handle argument of `from_allocation_handle`: an `IPCAllocationHandle`, or a bare
/// file descriptor (which records nothing else).
fn handle_parts(object: &Bound<'_, PyAny>) -> PyResult<HandleParts> {
    let fd = fd_of(object)?;
    let handle_type = object
        .py()
        .import("custody")?
        .getattr("IPCAllocationHandle")?;
    if !object.is_instance(&handle_type)? {
        return Ok(HandleParts {
            fd,
            uuid: None,
            kind: None,
            device: None,
        });
    }
    let uuid = object.getattr("uuid")?;
    Ok(HandleParts {
        fd,
        uuid: (!uuid.is_none()).then(|| uuid.unbind()),
        kind: object.getattr("_kind")?.extract()?,
        device: object.getattr("_device_id")?.extract()?,
    })
}

/// The resource of `kind` this process already has for the pool named `uuid`, if any
/// (`TypeError` when it has the pool as the other kind).
fn registered_pool(py: Python<'_>, uuid: &Py<PyAny>, kind: &str) -> PyResult<Option<Py<PyAny>>> {
    let found = py
        .import("custody")?
        .getattr("_registered_pool")?
        .call1((uuid.clone_ref(py), kind))?;
    Ok((!found.is_none()).then(|| found.unbind()))
}

/// Opens the pool another process exported as `allocation_handle` (an `IPCAllocationHandle`
/// or a bare file descriptor), asked for as a resource of `requested` kind: the resource this
/// process already has for it, else the pool opened as the kind the handle records (a pinned
/// pool's handle opens a `PinnedMemoryResource` whichever class was asked; `device` is the
/// device asked for, for a device pool).
fn import_pool_object(
    py: Python<'_>,
    requested: &'static str,
    device: Option<i32>,
    allocation_handle: &Bound<'_, PyAny>,
) -> PyResult<Py<PyAny>> {
    let parts = handle_parts(allocation_handle)?;
    if let Some(uuid) = &parts.uuid {
        if let Some(mr) = registered_pool(py, uuid, requested)? {
            return Ok(mr);
        }
    }
    let kind = parts.kind.as_deref().unwrap_or(requested);
    let mr = with_borrowed_fd(parts.fd, |fd| -> PyResult<Py<PyAny>> {
        if kind == "PinnedMemoryResource" {
            let inner = py
                .detach(|| PinnedMemoryResource::import_pool(fd))
                .map_err(Error::from)?;
            let init = PyMemoryResource::builtin(inner.clone(), false).add_subclass(
                PyPinnedMemoryResource {
                    inner,
                    ipc: PoolIpc::default(),
                    numa_id: -1,
                },
            );
            return Ok(Py::new(py, init)?.into_any());
        }
        let ordinal = device.or(parts.device.filter(|d| *d >= 0)).unwrap_or(0);
        let inner = py
            .detach(|| DeviceMemoryResource::import_pool(ordinal, fd))
            .map_err(Error::from)?;
        let init =
            PyMemoryResource::builtin(inner.clone(), false).add_subclass(PyDeviceMemoryResource {
                inner,
                ipc: PoolIpc::default(),
            });
        Ok(Py::new(py, init)?.into_any())
    })??;
    if let Some(uuid) = parts.uuid {
        let _ = set_imported_uuid(mr.bind(py), uuid);
    }
    py.import("custody")?
        .getattr("_register_pool")?
        .call1((mr.clone_ref(py),))?;
    Ok(mr)
}

/// Records the UUID an imported resource's pool had in the exporting process.
fn set_imported_uuid(mr: &Bound<'_, PyAny>, uuid: Py<PyAny>) -> Result<(), Py<PyAny>> {
    if let Ok(device) = mr.cast::<PyDeviceMemoryResource>() {
        return device.get().ipc.uuid.set(uuid);
    }
    if let Ok(pinned) = mr.cast::<PyPinnedMemoryResource>() {
        return pinned.get().ipc.uuid.set(uuid);
    }
    Err(uuid)
}

/// The pool of a built-in pool resource object, if `mr` is one.
pub(crate) fn pool_of(mr: &Bound<'_, PyAny>) -> Option<PoolAccess> {
    if let Ok(device) = mr.cast::<PyDeviceMemoryResource>() {
        return Some(PoolAccess(Pool::Device(Arc::clone(&device.get().inner))));
    }
    if let Ok(pinned) = mr.cast::<PyPinnedMemoryResource>() {
        return Some(PoolAccess(Pool::Pinned(Arc::clone(&pinned.get().inner))));
    }
    if let Ok(managed) = mr.cast::<PyManagedMemoryResource>() {
        return Some(PoolAccess(Pool::Managed(Arc::clone(&managed.get().inner))));
    }
    None
}

/// A pool resource, as the buffer module sees it (IPC imports).
pub(crate) struct PoolAccess(Pool);

impl PoolAccess {
    pub(crate) fn import_buffer(
        &self,
        descriptor: &memory::IpcBufferDescriptor,
        stream: &StreamHandle,
    ) -> Result<Buffer, MemoryError> {
        self.0.import_buffer(descriptor, stream)
    }

    pub(crate) fn is_mapped(&self) -> bool {
        self.0.as_pool().is_mapped()
    }

    /// Whether the pool can be shared with other processes.
    pub(crate) fn is_ipc_enabled(&self) -> bool {
        self.0.as_pool().is_ipc_enabled()
    }

    /// The pool's device; `None` for a pinned host pool.
    pub(crate) fn device(&self) -> Option<i32> {
        self.0.as_pool().pool().device()
    }
}

/// A memory pool's attributes, read from the driver (``cuMemPoolGetAttribute``, the GIL
/// released) on each access; sizes in bytes. Reading one raises :class:`CUDAError` on a driver
/// failure. The repr lists every attribute with its value. Cannot be instantiated directly:
/// ``DeviceMemoryResource.attributes``, ``PinnedMemoryResource.attributes``.
#[pyclass(frozen, weakref, name = "MemoryPoolAttributes", module = "custody")]
pub struct PyPoolAttributes {
    pool: MemoryPoolHandle,
}

impl PyPoolAttributes {
    fn read(&self, py: Python<'_>, attribute: CUmemPool_attribute) -> PyResult<u64> {
        let pool = self.pool.clone();
        Ok(py
            .detach(move || pool.attribute_u64(attribute))
            .map_err(Error::from)?)
    }

    fn flag(&self, py: Python<'_>, attribute: CUmemPool_attribute) -> PyResult<bool> {
        let pool = self.pool.clone();
        Ok(py
            .detach(move || pool.attribute_i32(attribute))
            .map_err(Error::from)?
            != 0)
    }
}

#[pymethods]
impl PyPoolAttributes {
    /// Bytes allocated from the pool and not freed (``CU_MEMPOOL_ATTR_USED_MEM_CURRENT``).
    #[getter]
    fn used_mem_current(&self, py: Python<'_>) -> PyResult<u64> {
        self.read(py, CUmemPool_attribute::CU_MEMPOOL_ATTR_USED_MEM_CURRENT)
    }

    /// The high-water mark of ``used_mem_current``, in bytes (``CU_MEMPOOL_ATTR_USED_MEM_HIGH``).
    #[getter]
    fn used_mem_high(&self, py: Python<'_>) -> PyResult<u64> {
        self.read(py, CUmemPool_attribute::CU_MEMPOOL_ATTR_USED_MEM_HIGH)
    }

    /// Bytes the pool holds from the driver (``CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT``).
    #[getter]
    fn reserved_mem_current(&self, py: Python<'_>) -> PyResult<u64> {
        self.read(
            py,
            CUmemPool_attribute::CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT,
        )
    }

    /// The high-water mark of ``reserved_mem_current``, in bytes
    /// (``CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH``).
    #[getter]
    fn reserved_mem_high(&self, py: Python<'_>) -> PyResult<u64> {
        self.read(py, CUmemPool_attribute::CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH)
    }

    /// Bytes the pool keeps after a synchronisation before memory goes back to the OS
    /// (``CU_MEMPOOL_ATTR_RELEASE_THRESHOLD``).
    #[getter]
    fn release_threshold(&self, py: Python<'_>) -> PyResult<u64> {
        self.read(py, CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD)
    }

    /// Whether memory freed on one stream may be reused on a stream that waits on an event recorded
    /// after the free (``CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES``).
    #[getter]
    fn reuse_follow_event_dependencies(&self, py: Python<'_>) -> PyResult<bool> {
        self.flag(
            py,
            CUmemPool_attribute::CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES,
        )
    }

    /// Whether memory whose free has completed may be reused without a dependency
    /// (``CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC``).
    #[getter]
    fn reuse_allow_opportunistic(&self, py: Python<'_>) -> PyResult<bool> {
        self.flag(
            py,
            CUmemPool_attribute::CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC,
        )
    }

    /// Whether the driver may insert dependencies between streams to reuse memory
    /// (``CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES``).
    #[getter]
    fn reuse_allow_internal_dependencies(&self, py: Python<'_>) -> PyResult<bool> {
        self.flag(
            py,
            CUmemPool_attribute::CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES,
        )
    }

    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        Ok(format!(
            "MemoryPoolAttributes(release_threshold={}, reserved_mem_current={}, \
             reserved_mem_high={}, reuse_allow_internal_dependencies={}, \
             reuse_allow_opportunistic={}, reuse_follow_event_dependencies={}, \
             used_mem_current={}, used_mem_high={})",
            self.release_threshold(py)?,
            self.reserved_mem_current(py)?,
            self.reserved_mem_high(py)?,
            py_bool(self.reuse_allow_internal_dependencies(py)?),
            py_bool(self.reuse_allow_opportunistic(py)?),
            py_bool(self.reuse_follow_event_dependencies(py)?),
            self.used_mem_current(py)?,
            self.used_mem_high(py)?,
        ))
    }
}

/// `True` / `False`, as Python writes a bool.
fn py_bool(value: bool) -> &'static str {
    if value {
        "True"
    } else {
        "False"
    }
}

/// The `#[pymethods]` block of a pool resource: `$extra` (its constructor and importer) plus
/// the IPC and attribute methods both pool resources share; `$name` is the Python class's
/// name, for the docstrings that say it.
macro_rules! pool_methods {
    ($ty:ty, $variant:ident, $name:literal, { $($extra:tt)* }) => {
        #[pymethods]
        impl $ty {
            $($extra)*

            /// Whether the pool can be shared with other processes.
            #[getter]
            fn is_ipc_enabled(&self) -> bool {
                self.inner.is_ipc_enabled()
            }

            /// Whether the pool was imported from another process (it then only imports buffers, with
            /// ``Buffer.from_ipc_descriptor``).
            #[getter]
            fn is_mapped(&self) -> bool {
                self.inner.is_mapped()
            }

            /// The raw ``CUmemoryPool`` as an int.
            #[getter]
            fn handle(&self) -> usize {
                self.inner.pool().raw() as usize
            }

            /// The pool's attributes (:class:`MemoryPoolAttributes`), read from the driver when accessed.
            #[getter]
            fn attributes(&self) -> PyPoolAttributes {
                PyPoolAttributes {
                    pool: self.inner.pool().clone(),
                }
            }

            /// The pool's shareable handle, an :class:`IPCAllocationHandle` exported once and
            /// kept by this resource, for another process's ``from_allocation_handle`` (it
            /// pickles for ``multiprocessing``). ``RuntimeError("Memory resource is not
            /// IPC-enabled")`` for a pool made without ``ipc_enabled``, ``RuntimeError`` for a
            /// closed resource; :class:`CUDAError` on a driver failure.
            #[getter(allocation_handle)]
            fn kept_allocation_handle(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
                self.ipc.kept_handle(py, &Pool::$variant(Arc::clone(&self.inner)))
            }

            /// A new shareable handle the caller owns: an :class:`IPCAllocationHandle` of a
            /// fresh export of the pool, its file descriptor closed with the handle. Errors as
            /// :attr:`allocation_handle`.
            fn get_allocation_handle(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
                self.ipc.new_handle(py, &Pool::$variant(Arc::clone(&self.inner)))
            }

            /// The UUID naming the pool across processes (the same in the process that made
            /// it and in every process that opened it); ``None`` unless the pool can be
            /// shared.
            #[getter]
            fn uuid(&self, py: Python<'_>) -> PyResult<Option<Py<PyAny>>> {
                self.ipc.uuid(py, self.inner.as_ref())
            }

            /// Whether this resource made its pool (and it goes with the last of the resource
            /// and its buffers); ``False`` for a device's current pool.
            #[getter]
            fn is_handle_owned(&self) -> bool {
                self.inner.pool().is_owned()
            }

            #[doc = concat!("Closes this resource: ``allocate`` (of one byte or more: zero bytes still give an empty\nbuffer, which holds no memory), ``get_allocation_handle``, pickling and\n``Buffer.from_ipc_descriptor`` then raise ``RuntimeError(\"", $name, " has been closed\")``;\n``deallocate`` and the buffers already made keep working. The pool goes with the last of\nthis object and its buffers (an owned pool outlives its allocations). Idempotent.")]
            fn close(&self) {
                self.inner.close();
            }

            /// Whether :meth:`close` was called.
            #[getter]
            fn is_closed(&self) -> bool {
                self.inner.is_closed()
            }
        }
    };
}

/// Device memory from a stream-ordered pool: the device's current pool, or with options a pool
/// of its own. Buffers it allocates are freed with ``cuMemFreeAsync`` on their recipe, without
/// Python.
///
/// ``DeviceMemoryResource(device_id, options=None)``: ``device_id`` an int or a
/// :class:`Device`; ``options`` a :class:`DeviceMemoryResourceOptions` (or a dict of its
/// fields) for a pool of its own. ``TypeError`` for ``None`` or a non-int device,
/// ``ValueError`` for a negative ordinal, :class:`CUDAError` for a device the driver does not
/// have or a pool it refuses.
///
/// ``pickle`` (a ``copyreg`` reducer for the exact type) sends the pool of an IPC-enabled
/// resource: exported as a file descriptor and handed to the receiving process by
/// ``multiprocessing``'s resource sharer (the sending process must be alive; each pickle is
/// read at most once). A process opens a given pool once and gets its own object back.
/// ``RuntimeError`` for a closed or non-IPC resource.
#[pyclass(frozen, extends = PyMemoryResource, subclass, name = "DeviceMemoryResource", module = "custody")]
pub struct PyDeviceMemoryResource {
    inner: Arc<DeviceMemoryResource>,
    ipc: PoolIpc,
}

pool_methods!(PyDeviceMemoryResource, Device, "DeviceMemoryResource", {
    #[new]
    #[pyo3(signature = (device_id, options = None))]
    fn py_new(
        py: Python<'_>,
        device_id: &Bound<'_, PyAny>,
        options: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<PyClassInitializer<Self>> {
        let ordinal = device_ordinal(device_id)?;
        let options = check_options(
            options,
            "DeviceMemoryResourceOptions",
            &["ipc_enabled", "max_size"],
        )?;
        let inner = match options {
            None => py
                .detach(|| DeviceMemoryResource::new(ordinal))
                .map_err(Error::from)?,
            Some(options) => {
                let options = DeviceMemoryResourceOptions {
                    ipc_enabled: option(Some(options), "ipc_enabled", false)?,
                    max_size: option(Some(options), "max_size", 0usize)?,
                };
                py.detach(|| DeviceMemoryResource::with_options(ordinal, options))
                    .map_err(Error::from)?
            }
        };
        let ipc = PoolIpc::default();
        Ok(PyMemoryResource::builtin(inner.clone(), false).add_subclass(Self { inner, ipc }))
    }

    /// Opens a device pool another process exported (``allocation_handle``: its
    /// :class:`IPCAllocationHandle`, or a file descriptor as an int or an object with
    /// ``fileno()`` or ``handle``; it stays the caller's to close); the resource only imports
    /// buffers (``Buffer.from_ipc_descriptor``). A pool this process has already opened (or
    /// made) gives that resource back (``TypeError`` when it is a ``PinnedMemoryResource``'s);
    /// a pinned pool's handle opens a ``PinnedMemoryResource``. ``TypeError`` for anything else;
    /// :class:`CUDAError` when the driver refuses the descriptor.
    #[classmethod]
    fn from_allocation_handle(
        cls: &Bound<'_, pyo3::types::PyType>,
        device_id: &Bound<'_, PyAny>,
        allocation_handle: &Bound<'_, PyAny>,
    ) -> PyResult<Py<PyAny>> {
        let py = cls.py();
        let ordinal = device_ordinal(device_id)?;
        import_pool_object(py, "DeviceMemoryResource", Some(ordinal), allocation_handle)
    }

    /// The devices other than the pool's own whose kernels and copies may use its memory: a
    /// live set of :class:`Device` objects, read from the driver on each use
    /// (``cuMemPoolGetAccess``); ``in``, ``add`` and ``discard`` take a :class:`Device` or an
    /// ordinal (the pool's own device is ignored). Assigning an iterable of them grants
    /// read-write access to those and revokes it from the rest, in one ``cuMemPoolSetAccess``
    /// call that affects every allocation of the pool. ``ValueError`` for an ordinal out of
    /// range, ``TypeError`` for anything else (before any change); :class:`CUDAError` when the
    /// driver refuses (a device that cannot reach this one's memory).
    #[getter]
    fn peer_accessible_by<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyAny>> {
        slf.py()
            .import("custody")?
            .getattr("_PeerAccessibleBy")?
            .call1((slf,))
    }

    #[setter]
    fn set_peer_accessible_by(&self, py: Python<'_>, devices: &Bound<'_, PyAny>) -> PyResult<()> {
        let mut wanted = Vec::new();
        for device in devices.try_iter()? {
            let ordinal = self.peer_ordinal(&device?)?;
            if let Some(ordinal) = ordinal {
                if !wanted.contains(&ordinal) {
                    wanted.push(ordinal);
                }
            }
        }
        let current = self.peers(py)?;
        let changes: Vec<(i32, handles::MemAccess)> = wanted
            .iter()
            .filter(|d| !current.contains(d))
            .map(|&d| (d, handles::MemAccess::ReadWrite))
            .chain(
                current
                    .iter()
                    .filter(|d| !wanted.contains(d))
                    .map(|&d| (d, handles::MemAccess::None)),
            )
            .collect();
        let pool = self.inner.pool().clone();
        Ok(py
            .detach(|| pool.set_access(&changes))
            .map_err(Error::from)?)
    }

    /// The ordinals of the peers with access (for :attr:`peer_accessible_by`).
    fn _peer_ids(&self, py: Python<'_>) -> PyResult<Vec<i32>> {
        self.peers(py)
    }

    /// Grants (``on``) or revokes one device's access; the pool's own device is ignored (for
    /// :attr:`peer_accessible_by`).
    fn _set_peer_access(
        &self,
        py: Python<'_>,
        device: &Bound<'_, PyAny>,
        on: bool,
    ) -> PyResult<()> {
        let Some(ordinal) = self.peer_ordinal(device)? else {
            return Ok(());
        };
        let access = if on {
            handles::MemAccess::ReadWrite
        } else {
            handles::MemAccess::None
        };
        let pool = self.inner.pool().clone();
        Ok(py
            .detach(|| pool.set_access(&[(ordinal, access)]))
            .map_err(Error::from)?)
    }
});

impl PyDeviceMemoryResource {
    /// A peer given as a `Device` or an ordinal: `None` for the pool's own device;
    /// `ValueError` for an ordinal no device has.
    fn peer_ordinal(&self, device: &Bound<'_, PyAny>) -> PyResult<Option<i32>> {
        let ordinal = device_ordinal(device)?;
        let count = device
            .py()
            .detach(handles::device_count)
            .map_err(Error::from)?;
        if ordinal >= count {
            return Err(PyValueError::new_err(format!(
                "device ordinal {ordinal} is out of range: the driver sees {count} devices"
            )));
        }
        Ok((Some(ordinal) != self.inner.device_id()).then_some(ordinal))
    }

    /// The devices other than the pool's own with any access to its memory.
    fn peers(&self, py: Python<'_>) -> PyResult<Vec<i32>> {
        let pool = self.inner.pool().clone();
        let own = self.inner.device_id();
        Ok(py
            .detach(|| -> Result<Vec<i32>, HandleError> {
                let mut peers = Vec::new();
                for ordinal in 0..handles::device_count()? {
                    if Some(ordinal) != own && pool.access(ordinal)? != handles::MemAccess::None {
                        peers.push(ordinal);
                    }
                }
                Ok(peers)
            })
            .map_err(Error::from)?)
    }
}

/// A file descriptor given as an int, or an object with `handle` / `fileno()`.
fn fd_of(object: &Bound<'_, PyAny>) -> PyResult<i32> {
    if let Ok(fd) = object.extract::<i32>() {
        return Ok(fd);
    }
    if hasattr(object, "fileno")? {
        return call_method(object, "fileno", (), None)?.extract();
    }
    if hasattr(object, "handle")? {
        return getattr(object, "handle")?.extract();
    }
    Err(expected("file descriptor (int)", object))
}

/// Pinned host memory from a stream-ordered, host-located pool of its own. Buffers it allocates
/// are freed with ``cuMemFreeAsync`` on their recipe, without Python.
///
/// ``PinnedMemoryResource(options=None)``: ``options`` a :class:`PinnedMemoryResourceOptions`
/// (or a dict of its fields). :class:`CUDAError` when the driver refuses the pool.
///
/// ``pickle`` (a ``copyreg`` reducer for the exact type) sends the pool of an IPC-enabled
/// resource: exported as a file descriptor and handed to the receiving process by
/// ``multiprocessing``'s resource sharer (the sending process must be alive; each pickle is
/// read at most once). A process opens a given pool once and gets its own object back.
/// ``RuntimeError`` for a closed or non-IPC resource.
#[pyclass(frozen, extends = PyMemoryResource, subclass, name = "PinnedMemoryResource", module = "custody")]
pub struct PyPinnedMemoryResource {
    inner: Arc<PinnedMemoryResource>,
    ipc: PoolIpc,
    /// The NUMA node the pool was made on, -1 for the operating system's placement (or not
    /// known: an imported pool).
    numa_id: i32,
}

/// `CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID` of the current context's device (device 0 when no context
/// is current), -1 when the driver does not say (no NUMA, an older driver).
fn current_host_numa_id(py: Python<'_>) -> i32 {
    const HOST_NUMA_ID: u32 = 134;
    py.detach(|| {
        let device = match handles::ContextHandle::current() {
            Ok(Some(context)) => context.device(),
            _ => 0,
        };
        handles::device_attribute(device, HOST_NUMA_ID).unwrap_or(-1)
    })
}

pool_methods!(PyPinnedMemoryResource, Pinned, "PinnedMemoryResource", {
    #[new]
    #[pyo3(signature = (options = None))]
    fn py_new(
        py: Python<'_>,
        options: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<PyClassInitializer<Self>> {
        let options = check_options(
            options,
            "PinnedMemoryResourceOptions",
            &["ipc_enabled", "max_size", "numa_id"],
        )?;
        let ipc_enabled = option(options, "ipc_enabled", false)?;
        let numa_id = match option::<Option<i64>>(options, "numa_id", None)? {
            Some(node) if node < 0 => {
                return Err(PyValueError::new_err(format!(
                    "numa_id must be >= 0, got {node}"
                )))
            }
            Some(node) => Some(
                i32::try_from(node)
                    .map_err(|_| PyValueError::new_err(format!("numa_id {node} is too large")))?,
            ),
            None if ipc_enabled => {
                let node = current_host_numa_id(py);
                if node < 0 {
                    return Err(PyRuntimeError::new_err(
                        "Cannot determine host NUMA ID for IPC-enabled pinned memory pool. The \
                         system may not support NUMA, or no CUDA context is active. Set numa_id \
                         explicitly or call Device.set_current() first.",
                    ));
                }
                Some(node)
            }
            None => None,
        };
        let options = PinnedMemoryResourceOptions {
            ipc_enabled,
            max_size: option(options, "max_size", 0usize)?,
            numa_id,
        };
        let inner = py
            .detach(|| PinnedMemoryResource::new(options))
            .map_err(Error::from)?;
        let ipc = PoolIpc::default();
        Ok(
            PyMemoryResource::builtin(inner.clone(), false).add_subclass(Self {
                inner,
                ipc,
                numa_id: numa_id.unwrap_or(-1),
            }),
        )
    }

    /// The host NUMA node the pool's memory lives on, or -1 when the operating system places
    /// it (no ``numa_id`` given and IPC disabled).
    #[getter]
    fn numa_id(&self) -> i32 {
        self.numa_id
    }

    /// Opens a pinned pool another process exported (``allocation_handle``: its
    /// :class:`IPCAllocationHandle`, or a file descriptor as an int or an object with
    /// ``fileno()`` or ``handle``; it stays the caller's to close); the resource only imports
    /// buffers (``Buffer.from_ipc_descriptor``). A pool this process has already opened (or
    /// made) gives that resource back (``TypeError`` when it is a ``DeviceMemoryResource``'s);
    /// a device pool's handle opens a ``DeviceMemoryResource`` of its device. ``TypeError`` for
    /// anything else; :class:`CUDAError` when the driver refuses the descriptor.
    #[classmethod]
    fn from_allocation_handle(
        cls: &Bound<'_, pyo3::types::PyType>,
        allocation_handle: &Bound<'_, PyAny>,
    ) -> PyResult<Py<PyAny>> {
        let py = cls.py();
        import_pool_object(py, "PinnedMemoryResource", None, allocation_handle)
    }
});

/// Pinned host memory from ``cuMemAllocHost``; ``LegacyPinnedMemoryResource()`` makes no driver
/// call. ``allocate``'s ``stream`` may be omitted (the free is then ordered on the default
/// stream). A drop never waits: the free runs on the cleanup worker after the recorded stream's
/// work.
#[pyclass(frozen, extends = PyMemoryResource, subclass, name = "LegacyPinnedMemoryResource", module = "custody")]
pub struct PyLegacyPinnedMemoryResource;

#[pymethods]
impl PyLegacyPinnedMemoryResource {
    #[new]
    fn py_new() -> PyClassInitializer<Self> {
        PyMemoryResource::synchronous(LegacyPinnedMemoryResource::new()).add_subclass(Self)
    }
}

/// Managed memory from ``cuMemAllocManaged`` (attached globally; any CUDA 12 driver), in the
/// context of ``allocate``'s stream; ``allocate`` returns :class:`ManagedBuffer`. The pointers
/// carry ``CU_POINTER_ATTRIBUTE_IS_MANAGED``. Dropping a buffer never waits: the free
/// (``cuMemFree``) runs on the cleanup worker after the recorded stream's work; an explicit
/// ``close`` or ``deallocate`` waits for the stream first. ``LegacyManagedMemoryResource()``
/// makes no driver call. Not in cuda.core, whose managed resource is
/// :class:`ManagedMemoryResource` (a managed pool, CUDA 13).
#[pyclass(frozen, extends = PyMemoryResource, subclass, name = "LegacyManagedMemoryResource", module = "custody")]
pub struct PyLegacyManagedMemoryResource;

#[pymethods]
impl PyLegacyManagedMemoryResource {
    #[new]
    fn py_new() -> PyClassInitializer<Self> {
        PyMemoryResource::builtin(ManagedMemoryResource::new(), true).add_subclass(Self)
    }
}

/// Managed memory from a stream-ordered managed memory pool (``CU_MEM_ALLOCATION_TYPE_MANAGED``,
/// a CUDA 13 driver): accessible from the host and every device, migrated by the driver;
/// ``allocate`` returns :class:`ManagedBuffer`, freed with ``cuMemFreeAsync`` on its recipe.
///
/// ``ManagedMemoryResource(options=None)``: with no options, the driver's current managed pool
/// of no preferred location (borrowed: ``is_handle_owned`` is False); with
/// :class:`ManagedMemoryResourceOptions` (or a dict of its fields), a pool of its own preferring
/// their location. ``ValueError`` for an invalid location, ``RuntimeError`` when ``host_numa``
/// must be derived and the current device reports no host NUMA node, ``RuntimeError("...
/// requires CUDA 13.0 or later")`` on an older driver, :class:`CUDAError` when the driver
/// refuses the pool. The pool cannot be shared with other processes (``is_ipc_enabled`` is
/// False).
#[pyclass(frozen, extends = PyMemoryResource, subclass, name = "ManagedMemoryResource", module = "custody")]
pub struct PyManagedMemoryResource {
    inner: Arc<ManagedPoolMemoryResource>,
    ipc: PoolIpc,
}

/// The `ManagedMemoryLocationType` values, in the order cuda.core's message lists them.
const MANAGED_LOCATION_TYPES: [&str; 3] = ["device", "host", "host_numa"];

/// The preferred location `ManagedMemoryResourceOptions` name, with cuda.core 1.2's rules and
/// messages: without ``preferred_location_type``, ``preferred_location`` is a device ordinal,
/// -1 for the host or ``None`` for no preference; with it, the type says what the location is.
fn managed_location(
    py: Python<'_>,
    options: Option<&Bound<'_, PyAny>>,
) -> PyResult<ManagedPoolLocation> {
    let options = check_options(
        options,
        "ManagedMemoryResourceOptions",
        &["preferred_location", "preferred_location_type"],
    )?;
    let location = option::<Option<i64>>(options, "preferred_location", None)?;
    let kind = option::<Option<String>>(options, "preferred_location_type", None)?;
    let ordinal = |value: i64| {
        i32::try_from(value).map_err(|_| {
            PyValueError::new_err(format!("preferred_location {value} is out of range"))
        })
    };
    match kind.as_deref() {
        None => match location {
            None => Ok(ManagedPoolLocation::None),
            Some(-1) => Ok(ManagedPoolLocation::Host),
            Some(value) if value < 0 => Err(PyValueError::new_err(format!(
                "preferred_location must be a device ordinal (>= 0), -1 for host, or None for \
                 no preference, got {value}"
            ))),
            Some(value) => Ok(ManagedPoolLocation::Device(ordinal(value)?)),
        },
        Some("device") => match location {
            Some(value) if value >= 0 => Ok(ManagedPoolLocation::Device(ordinal(value)?)),
            other => Err(PyValueError::new_err(format!(
                "preferred_location must be a device ordinal (>= 0) when \
                 preferred_location_type is 'device', got {}",
                other.map_or("None".to_owned(), |v| v.to_string())
            ))),
        },
        Some("host") => match location {
            None => Ok(ManagedPoolLocation::Host),
            Some(value) => Err(PyValueError::new_err(format!(
                "preferred_location must be None when preferred_location_type is 'host', got \
                 {value}"
            ))),
        },
        Some("host_numa") => match location {
            None => {
                let node = current_host_numa_id(py);
                if node < 0 {
                    return Err(PyRuntimeError::new_err(
                        "Cannot determine host NUMA ID for the current CUDA device. The system \
                         may not support NUMA, or no CUDA context is active. Set \
                         preferred_location to an explicit NUMA node ID or call \
                         Device.set_current() first.",
                    ));
                }
                Ok(ManagedPoolLocation::HostNuma(node))
            }
            Some(value) if value < 0 => Err(PyValueError::new_err(format!(
                "preferred_location must be a NUMA node ID (>= 0) or None when \
                 preferred_location_type is 'host_numa', got {value}"
            ))),
            Some(value) => Ok(ManagedPoolLocation::HostNuma(ordinal(value)?)),
        },
        Some(other) => {
            let listed: Vec<String> = MANAGED_LOCATION_TYPES
                .iter()
                .map(|t| format!("'{t}'"))
                .collect();
            Err(PyValueError::new_err(format!(
                "'{other}' is not a valid ManagedMemoryLocationType. Must be None, {} or {}",
                listed[..listed.len() - 1].join(", "),
                listed[listed.len() - 1]
            )))
        }
    }
}

pool_methods!(PyManagedMemoryResource, Managed, "ManagedMemoryResource", {
    #[new]
    #[pyo3(signature = (options = None))]
    fn py_new(
        py: Python<'_>,
        options: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<PyClassInitializer<Self>> {
        let options = options.filter(|o| !o.is_none());
        let location = managed_location(py, options)?;
        if !py
            .detach(handles::managed_pools_supported)
            .map_err(Error::from)?
        {
            return Err(PyRuntimeError::new_err(
                "ManagedMemoryResource requires CUDA 13.0 or later: this driver has no managed \
                 memory pools (custody's Rust ManagedMemoryResource uses cuMemAllocManaged)",
            ));
        }
        let own_pool = options.is_some();
        let inner = py
            .detach(|| {
                if own_pool {
                    ManagedPoolMemoryResource::new(location)
                } else {
                    ManagedPoolMemoryResource::current(location)
                }
            })
            .map_err(Error::from)?;
        let ipc = PoolIpc::default();
        Ok(PyMemoryResource::builtin(inner.clone(), true).add_subclass(Self { inner, ipc }))
    }

    /// The preferred location: ``None`` when the driver decides, else ``(type, id)`` with
    /// ``type`` a :class:`ManagedMemoryLocationType`: ``("device", ordinal)``,
    /// ``("host", None)`` or ``("host_numa", node)``.
    #[getter]
    fn preferred_location(&self, py: Python<'_>) -> PyResult<Option<Py<PyAny>>> {
        let (kind, id) = match self.inner.preferred_location() {
            ManagedPoolLocation::None => return Ok(None),
            ManagedPoolLocation::Device(ordinal) => ("DEVICE", Some(ordinal)),
            ManagedPoolLocation::Host => ("HOST", None),
            ManagedPoolLocation::HostNuma(node) => ("HOST_NUMA", Some(node)),
        };
        let kind = py
            .import("custody")?
            .getattr("ManagedMemoryLocationType")?
            .getattr(kind)?;
        Ok(Some((kind, id).into_pyobject(py)?.into_any().unbind()))
    }
});

/// Device memory from ``cuMemAlloc`` in the device's primary context: no context need be
/// current; a default stream is replaced by the legacy stream bound to that context, and
/// ``allocate``'s ``stream`` may be omitted. ``SynchronousMemoryResource(device_id)`` retains
/// the device's primary context: ``TypeError`` or ``ValueError`` for a bad ordinal,
/// :class:`CUDAError` for a device the driver does not have.
#[pyclass(frozen, extends = PyMemoryResource, subclass, name = "SynchronousMemoryResource", module = "custody")]
pub struct PySynchronousMemoryResource;

#[pymethods]
impl PySynchronousMemoryResource {
    #[new]
    fn py_new(py: Python<'_>, device_id: &Bound<'_, PyAny>) -> PyResult<PyClassInitializer<Self>> {
        let ordinal = device_ordinal(device_id)?;
        let inner = py
            .detach(|| SynchronousMemoryResource::new(ordinal))
            .map_err(Error::from)?;
        Ok(PyMemoryResource::synchronous(inner).add_subclass(Self))
    }
}

/// Graph memory: allocations on a stream that is being captured.
#[pyclass(frozen, extends = PyMemoryResource, subclass, name = "GraphMemoryResource", module = "custody")]
pub struct PyGraphMemoryResource;

#[pymethods]
impl PyGraphMemoryResource {
    #[new]
    #[pyo3(signature = (device_id, *_args, **_kwargs))]
    fn py_new(
        device_id: &Bound<'_, PyAny>,
        _args: &Bound<'_, PyTuple>,
        _kwargs: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<PyClassInitializer<Self>> {
        let ordinal = device_ordinal(device_id)?;
        Ok(PyMemoryResource::builtin(GraphMemoryResource::new(ordinal), false).add_subclass(Self))
    }

    /// The device's graph memory use (:class:`GraphMemoryResourceAttributes`,
    /// ``cuDeviceGetGraphMemAttribute``).
    #[getter]
    fn attributes(slf: &Bound<'_, Self>) -> PyResult<PyGraphMemoryAttributes> {
        let base = slf.as_super().get();
        let device = base.native("attributes")?.device_id().unwrap_or(0);
        Ok(PyGraphMemoryAttributes { device })
    }

    /// Returns the graph memory the device keeps cached, and no graph uses, to the OS
    /// (``cuDeviceGraphMemTrim``). :class:`CUDAError` on a driver failure.
    fn trim(slf: &Bound<'_, Self>, py: Python<'_>) -> PyResult<()> {
        let device = slf
            .as_super()
            .get()
            .native("trim")?
            .device_id()
            .unwrap_or(0);
        py.detach(|| handles::graph_mem_trim(device))
            .map_err(Error::from)?;
        Ok(())
    }

    /// Does nothing: graph memory belongs to the graphs.
    fn close(&self) {}
}

/// `CUgraphMem_attribute` numbers.
const GRAPH_MEM_USED: u32 = 0;
const GRAPH_MEM_USED_HIGH: u32 = 1;
const GRAPH_MEM_RESERVED: u32 = 2;
const GRAPH_MEM_RESERVED_HIGH: u32 = 3;

/// A device's graph memory use in bytes, read when asked; the high water marks can be reset
/// to 0 (``AttributeError`` for another value, or for setting the current values). Cannot be
/// instantiated directly (``RuntimeError``).
#[pyclass(frozen, name = "GraphMemoryResourceAttributes", module = "custody")]
pub struct PyGraphMemoryAttributes {
    device: i32,
}

impl PyGraphMemoryAttributes {
    fn read(&self, py: Python<'_>, attribute: u32) -> PyResult<u64> {
        let device = self.device;
        Ok(py
            .detach(|| handles::graph_mem_attribute(device, attribute))
            .map_err(Error::from)?)
    }

    fn reset(&self, py: Python<'_>, name: &str, attribute: u32, value: u64) -> PyResult<()> {
        if value != 0 {
            return Err(pyo3::exceptions::PyAttributeError::new_err(format!(
                "Attribute '{name}' may only be set to zero (got {value})."
            )));
        }
        let device = self.device;
        py.detach(|| handles::set_graph_mem_attribute(device, attribute, 0))
            .map_err(Error::from)?;
        Ok(())
    }
}

#[pymethods]
impl PyGraphMemoryAttributes {
    #[new]
    #[pyo3(signature = (*_args, **_kwargs), text_signature = None)]
    fn py_new(_args: &Bound<'_, PyTuple>, _kwargs: Option<&Bound<'_, PyAny>>) -> PyResult<Self> {
        Err(pyo3::exceptions::PyRuntimeError::new_err(
            "GraphMemoryResourceAttributes cannot be instantiated directly. Use \
             GraphMemoryResource(device).attributes.",
        ))
    }

    /// Bytes of graph memory the device holds from the driver.
    #[getter]
    fn reserved_mem_current(&self, py: Python<'_>) -> PyResult<u64> {
        self.read(py, GRAPH_MEM_RESERVED)
    }

    /// The high water mark of ``reserved_mem_current``; settable to 0.
    #[getter]
    fn reserved_mem_high(&self, py: Python<'_>) -> PyResult<u64> {
        self.read(py, GRAPH_MEM_RESERVED_HIGH)
    }

    #[setter]
    fn set_reserved_mem_high(&self, py: Python<'_>, value: u64) -> PyResult<()> {
        self.reset(py, "reserved_mem_high", GRAPH_MEM_RESERVED_HIGH, value)
    }

    /// Bytes of graph memory in use by graphs.
    #[getter]
    fn used_mem_current(&self, py: Python<'_>) -> PyResult<u64> {
        self.read(py, GRAPH_MEM_USED)
    }

    /// The high water mark of ``used_mem_current``; settable to 0.
    #[getter]
    fn used_mem_high(&self, py: Python<'_>) -> PyResult<u64> {
        self.read(py, GRAPH_MEM_USED_HIGH)
    }

    #[setter]
    fn set_used_mem_high(&self, py: Python<'_>, value: u64) -> PyResult<()> {
        self.reset(py, "used_mem_high", GRAPH_MEM_USED_HIGH, value)
    }

    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        Ok(format!(
            "GraphMemoryResourceAttributes(reserved_mem_current={}, reserved_mem_high={}, \
             used_mem_current={}, used_mem_high={})",
            self.reserved_mem_current(py)?,
            self.reserved_mem_high(py)?,
            self.used_mem_current(py)?,
            self.used_mem_high(py)?,
        ))
    }
}

/// An opt-in cache over a built-in memory resource (``upstream``: a
/// :class:`DeviceMemoryResource`, :class:`PinnedMemoryResource`,
/// :class:`SynchronousMemoryResource`, ... or a Python subclass of one, whose built-in
/// allocation it uses), as PyTorch's and CuPy's caching allocators keep memory. A buffer
/// closed or dropped goes back to a bin of the stream
/// its free is ordered on (its deallocation stream: the allocation's, or the one
/// ``set_deallocation_stream`` named last), and the next ``allocate`` of its size class on that
/// same stream gets the memory again without a driver call; work enqueued there after the free
/// is ordered after every earlier use by stream order. Another stream never gets it. Streams
/// declared with ``Buffer.record_use`` are waited for (``cuStreamWaitEvent`` on the free's
/// stream) before the memory goes back to a bin. Sizes are rounded up to 512 bytes, then to one
/// of four classes per doubling (at most 25% more); ``Buffer.size`` is the size asked for. A
/// default stream, or a stream being captured, is not cached: the upstream resource allocates
/// (and frees) as it would alone, and so is a stream wrapped from a bare ``int``
/// (``Stream.from_handle(int)``: custody cannot keep it alive, and its maker may destroy it). A
/// cached block keeps its stream alive until :meth:`trim` or :meth:`close` frees it. Its buffers cannot be exported to another process
/// (``ipc_descriptor`` raises ``RuntimeError``), even over an IPC-enabled pool.
///
/// ``CachingMemoryResource(upstream)``. ``TypeError`` for anything but a built-in memory
/// resource (a ``MemoryResource`` subclass that allocates in Python, or a
/// :class:`GraphMemoryResource`, whose memory belongs to its graph). The upstream resource's
/// own statistics count cached memory as allocated, which it is; :attr:`stats` tells cached
/// from lent out.
#[pyclass(frozen, extends = PyMemoryResource, name = "CachingMemoryResource", module = "custody")]
pub struct PyCachingMemoryResource {
    inner: Arc<CachingMemoryResource>,
    upstream: Py<PyAny>,
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
    /// one (no driver call, the GIL kept), else a new block from the upstream resource (the GIL
    /// released). Zero bytes give an empty buffer (address 0, no driver call).
    /// ``RuntimeError`` for one byte or more once :meth:`close` was called; otherwise as
    /// ``MemoryResource.allocate`` (``OverflowError``, ``TypeError``, :class:`CUDAError` for
    /// the upstream's failure, after one retry with the cache flushed when it was out of
    /// memory, and ``RuntimeError`` at exit).
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
        refuse_allocation_at_exit(slf.as_any())?;
        let base = slf.as_super();
        let this = base.get();
        let (size, stream) = allocate_arguments(base, size, extra, stream, this.stream_optional)?;
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
        // A hit never calls the driver nor waits beyond the bins' lock: the GIL stays held.
        let buffer = match inner.allocate_cached(size, &stream) {
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
    /// served from a bin), ``misses`` (allocations that took a new block from the upstream),
    /// ``freed_blocks`` (blocks freed through the upstream: trims, closes, frees on a default
    /// stream) and ``out_of_memory_retries``. ``in_use_bytes + cached_bytes`` is what the
    /// upstream holds for the cache.
    #[getter]
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let stats = self.inner.stats();
        let dict = PyDict::new(py);
        dict.set_item("in_use_blocks", stats.in_use_blocks)?;
        dict.set_item("in_use_bytes", stats.in_use_bytes)?;
        dict.set_item("cached_blocks", stats.cached_blocks)?;
        dict.set_item("cached_bytes", stats.cached_bytes)?;
        dict.set_item("hits", stats.hits)?;
        dict.set_item("misses", stats.misses)?;
        dict.set_item("freed_blocks", stats.freed_blocks)?;
        dict.set_item("out_of_memory_retries", stats.out_of_memory_retries)?;
        Ok(dict)
    }

    /// Frees every cached block now through the upstream resource (for a pool
    /// ``cuMemFreeAsync`` on the block's stream, which does not block; for the synchronous
    /// resources after its stream has drained), the GIL released. Buffers lent out are not
    /// touched. :class:`CUDAError` for the first free that fails (the others are still freed,
    /// their failures reported as :class:`CUDAWarning`); the bins are empty either way.
    fn trim(&self, py: Python<'_>) -> PyResult<()> {
        let inner = Arc::clone(&self.inner);
        Ok(py.detach(move || inner.trim()).map_err(Error::from)?)
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

/// Registers the resource classes on the module.
pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyMemoryResource>()?;
    m.add_class::<PyDeviceMemoryResource>()?;
    m.add_class::<PyPinnedMemoryResource>()?;
    m.add_class::<PyLegacyPinnedMemoryResource>()?;
    m.add_class::<PyManagedMemoryResource>()?;
    m.add_class::<PyLegacyManagedMemoryResource>()?;
    m.add_class::<PySynchronousMemoryResource>()?;
    m.add_class::<PyGraphMemoryResource>()?;
    m.add_class::<PyCachingMemoryResource>()?;
    m.add_class::<PyPoolAttributes>()?;
    m.add_class::<PyGraphMemoryAttributes>()?;
    Ok(())
}
