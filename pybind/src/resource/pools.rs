//! The stream-ordered pool resources: `DeviceMemoryResource`, `PinnedMemoryResource` and
//! `ManagedMemoryResource`, and their base `_MemPool` (cuda.core's name: the IPC and attribute
//! methods they share, and closing), opening a pool another process exported, and the pool of a resource object.

use std::sync::Arc;

use handles::{HandleError, ManagedPoolLocation};
use memory::{
    DeviceMemoryResource, DeviceMemoryResourceOptions, ManagedPoolMemoryResource, MemoryResource,
    PinnedMemoryResource, PinnedMemoryResourceOptions, PoolMemoryResource,
};
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;

use super::attributes::PyPoolAttributes;
use super::class::{device_ordinal, PyMemoryResource};
use super::ipc::{handle_parts, registered_pool, Pool, PoolAccess, PoolIpc};
use crate::errors::Error;
use crate::ffi::with_borrowed_fd;
use crate::options::{check_options, option};

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
            let init =
                PyMemPool::initializer(Pool::pinned(inner), PyPinnedMemoryResource { numa_id: -1 });
            return Ok(Py::new(py, init)?.into_any());
        }
        let ordinal = device.or(parts.device.filter(|d| *d >= 0)).unwrap_or(0);
        let inner = py
            .detach(|| DeviceMemoryResource::import_pool(ordinal, fd))
            .map_err(Error::from)?;
        let init = PyMemPool::initializer(
            Pool::device(inner.clone()),
            PyDeviceMemoryResource { inner },
        );
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
    match mr.cast::<PyMemPool>() {
        Ok(pool) => pool.get().ipc.uuid.set(uuid),
        Err(_) => Err(uuid),
    }
}

/// The pool of a built-in pool resource object, if `mr` is one.
pub(crate) fn pool_of(mr: &Bound<'_, PyAny>) -> Option<PoolAccess> {
    let pool = mr.cast::<PyMemPool>().ok()?;
    Some(PoolAccess(pool.get().pool.clone()))
}

/// The base of the stream-ordered pool resources (cuda.core's ``_MemPool``): what a pool shares
/// with other processes, its attributes, and closing it. Not instantiated directly: a
/// :class:`DeviceMemoryResource`, :class:`PinnedMemoryResource` or :class:`ManagedMemoryResource`
/// is one.
#[pyclass(frozen, extends = PyMemoryResource, subclass, name = "_MemPool", module = "custody")]
pub struct PyMemPool {
    pool: Pool,
    ipc: PoolIpc,
}

impl PyMemPool {
    /// The initializer of the pool resource `resource` over `pool` (its buffers are managed for
    /// a managed pool).
    fn initializer<T: pyo3::PyClass<BaseType = PyMemPool>>(
        pool: Pool,
        resource: T,
    ) -> PyClassInitializer<T> {
        let managed = matches!(pool, Pool::Managed(_));
        PyMemoryResource::builtin(pool.as_resource(), managed)
            .add_subclass(PyMemPool {
                pool,
                ipc: PoolIpc::default(),
            })
            .add_subclass(resource)
    }
}

#[pymethods]
impl PyMemPool {
    /// Whether the pool can be shared with other processes.
    #[getter]
    fn is_ipc_enabled(&self) -> bool {
        self.pool.as_pool().is_ipc_enabled()
    }

    /// Whether the pool was imported from another process (it then only imports buffers, with
    /// ``Buffer.from_ipc_descriptor``).
    #[getter]
    fn is_mapped(&self) -> bool {
        self.pool.as_pool().is_mapped()
    }

    /// The raw ``CUmemoryPool`` as an int.
    #[getter]
    fn handle(&self) -> usize {
        self.pool.as_pool().pool().raw() as usize
    }

    /// The pool's attributes (:class:`MemoryPoolAttributes`), read from the driver when accessed.
    #[getter]
    fn attributes(&self) -> PyPoolAttributes {
        PyPoolAttributes {
            pool: self.pool.as_pool().pool().clone(),
        }
    }

    /// The pool's shareable handle, an :class:`IPCAllocationHandle` exported once and
    /// kept by this resource, for another process's ``from_allocation_handle`` (it
    /// pickles for ``multiprocessing``). ``RuntimeError("Memory resource is not
    /// IPC-enabled")`` for a pool made without ``ipc_enabled``, ``RuntimeError`` for a
    /// closed resource; :class:`CUDAError` on a driver failure.
    #[getter(allocation_handle)]
    fn kept_allocation_handle(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        self.ipc.kept_handle(py, &self.pool)
    }

    /// A new shareable handle the caller owns: an :class:`IPCAllocationHandle` of a
    /// fresh export of the pool, its file descriptor closed with the handle. Errors as
    /// :attr:`allocation_handle`.
    fn get_allocation_handle(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        self.ipc.new_handle(py, &self.pool)
    }

    /// The UUID naming the pool across processes (the same in the process that made
    /// it and in every process that opened it); ``None`` unless the pool can be
    /// shared.
    #[getter]
    fn uuid(&self, py: Python<'_>) -> PyResult<Option<Py<PyAny>>> {
        self.ipc.uuid(py, self.pool.as_pool())
    }

    /// Whether this resource made its pool (and it goes with the last of the resource
    /// and its buffers); ``False`` for a device's current pool.
    #[getter]
    fn is_handle_owned(&self) -> bool {
        self.pool.as_pool().pool().is_owned()
    }

    /// Closes this resource: ``allocate`` (of one byte or more: zero bytes still give an empty
    /// buffer, which holds no memory), ``get_allocation_handle``, pickling and
    /// ``Buffer.from_ipc_descriptor`` then raise a ``RuntimeError`` naming the class
    /// (``"DeviceMemoryResource has been closed"``); ``deallocate`` and the buffers already made
    /// keep working. The pool goes with the last of this object and its buffers
    /// (an owned pool outlives its allocations). Idempotent.
    fn close(&self) {
        self.pool.close();
    }

    /// Whether :meth:`close` was called.
    #[getter]
    fn is_closed(&self) -> bool {
        self.pool.is_closed()
    }
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
#[pyclass(frozen, extends = PyMemPool, subclass, name = "DeviceMemoryResource", module = "custody")]
pub struct PyDeviceMemoryResource {
    inner: Arc<DeviceMemoryResource>,
}

#[pymethods]
impl PyDeviceMemoryResource {
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
        Ok(PyMemPool::initializer(
            Pool::device(inner.clone()),
            Self { inner },
        ))
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
}

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
#[pyclass(frozen, extends = PyMemPool, subclass, name = "PinnedMemoryResource", module = "custody")]
pub struct PyPinnedMemoryResource {
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

#[pymethods]
impl PyPinnedMemoryResource {
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
        Ok(PyMemPool::initializer(
            Pool::pinned(inner),
            Self {
                numa_id: numa_id.unwrap_or(-1),
            },
        ))
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
#[pyclass(frozen, extends = PyMemPool, subclass, name = "ManagedMemoryResource", module = "custody")]
pub struct PyManagedMemoryResource {
    inner: Arc<ManagedPoolMemoryResource>,
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

#[pymethods]
impl PyManagedMemoryResource {
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
        Ok(PyMemPool::initializer(
            Pool::managed(inner.clone()),
            Self { inner },
        ))
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
}
