//! What the pool resources share for IPC: the pool behind a resource object (`Pool`, the Rust
//! resource with the object's closed state, and `PoolAccess` as buffers see it), the pool's
//! UUID and the allocation handle it keeps (`PoolIpc`), and the handle argument of `from_allocation_handle` (an `IPCAllocationHandle` or a file
//! descriptor).

use std::os::fd::{AsRawFd, IntoRawFd, OwnedFd};
use std::sync::{Arc, Mutex, OnceLock};

use handles::StreamHandle;
use memory::{
    Buffer, DeviceMemoryResource, ManagedPoolMemoryResource, MemoryError, MemoryResource,
    PinnedMemoryResource, PoolMemoryResource,
};
use pyo3::prelude::*;

use super::closable::{ClosablePool, Closed};
use crate::errors::{expected, Error};
use crate::ffi::{call_method, getattr, hasattr};
use crate::sync::Locked;

/// A pool resource object's pool, for IPC and attributes.
#[derive(Clone)]
pub(super) enum Pool {
    Device(Arc<ClosablePool<DeviceMemoryResource>>),
    Pinned(Arc<ClosablePool<PinnedMemoryResource>>),
    Managed(Arc<ClosablePool<ManagedPoolMemoryResource>>),
}

impl Pool {
    pub(super) fn as_pool(&self) -> &dyn PoolMemoryResource {
        match self {
            Pool::Device(mr) => mr.resource().as_ref(),
            Pool::Pinned(mr) => mr.resource().as_ref(),
            Pool::Managed(mr) => mr.resource().as_ref(),
        }
    }

    /// A device pool resource object's pool.
    pub(super) fn device(mr: Arc<DeviceMemoryResource>) -> Pool {
        Pool::Device(ClosablePool::new(mr, "DeviceMemoryResource"))
    }

    /// A pinned pool resource object's pool.
    pub(super) fn pinned(mr: Arc<PinnedMemoryResource>) -> Pool {
        Pool::Pinned(ClosablePool::new(mr, "PinnedMemoryResource"))
    }

    /// A managed pool resource object's pool.
    pub(super) fn managed(mr: Arc<ManagedPoolMemoryResource>) -> Pool {
        Pool::Managed(ClosablePool::new(mr, "ManagedMemoryResource"))
    }

    /// The pool as the memory resource `MemoryResource`'s struct holds: the `ClosablePool`, so
    /// that a closed object's pool refuses allocations wherever they come from.
    pub(super) fn as_resource(&self) -> Arc<dyn MemoryResource> {
        match self {
            Pool::Device(mr) => mr.clone(),
            Pool::Pinned(mr) => mr.clone(),
            Pool::Managed(mr) => mr.clone(),
        }
    }

    /// The object's closed state.
    fn closed(&self) -> &Closed {
        match self {
            Pool::Device(mr) => mr.closed(),
            Pool::Pinned(mr) => mr.closed(),
            Pool::Managed(mr) => mr.closed(),
        }
    }

    /// Closes the object's pool ([`Closed::close`]).
    pub(super) fn close(&self) {
        self.closed().close();
    }

    pub(super) fn is_closed(&self) -> bool {
        self.closed().is_closed()
    }

    /// A new export of the pool (the caller's): ``RuntimeError`` once the object was closed,
    /// then for a pool made without ``ipc_enabled``.
    fn export(&self, py: Python<'_>) -> PyResult<OwnedFd> {
        self.closed().check_open().map_err(Error::from)?;
        if !self.as_pool().is_ipc_enabled() {
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
        self.closed().check_open()?;
        match self {
            Pool::Device(mr) => Buffer::from_ipc_descriptor(mr.resource(), descriptor, stream),
            Pool::Pinned(mr) => Buffer::from_ipc_descriptor(mr.resource(), descriptor, stream),
            Pool::Managed(mr) => Buffer::from_ipc_descriptor(mr.resource(), descriptor, stream),
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
    pub(super) uuid: OnceLock<Py<PyAny>>,
    /// Never made or dropped under the lock.
    handle: Mutex<Option<Py<PyAny>>>,
}

impl PoolIpc {
    /// The pool's UUID (`None` for a pool that cannot be shared).
    pub(super) fn uuid(
        &self,
        py: Python<'_>,
        pool: &dyn PoolMemoryResource,
    ) -> PyResult<Option<Py<PyAny>>> {
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
    pub(super) fn new_handle(&self, py: Python<'_>, pool: &Pool) -> PyResult<Py<PyAny>> {
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
    pub(super) fn kept_handle(&self, py: Python<'_>, pool: &Pool) -> PyResult<Py<PyAny>> {
        let kept = self.handle.locked().as_ref().map(|h| h.clone_ref(py));
        if let Some(kept) = kept {
            if !kept.bind(py).getattr("is_closed")?.extract::<bool>()? {
                return Ok(kept);
            }
        }
        let made = self.new_handle(py, pool)?;
        let old = self.handle.locked().replace(made.clone_ref(py));
        drop(old);
        Ok(made)
    }
}

/// What an `IPCAllocationHandle` records besides its file descriptor: the pool's UUID, the
/// kind of resource that exported it and that resource's device (-1 for a pinned pool).
pub(super) struct HandleParts {
    pub(super) fd: i32,
    pub(super) uuid: Option<Py<PyAny>>,
    pub(super) kind: Option<String>,
    pub(super) device: Option<i32>,
}

/// A shareable handle argument of `from_allocation_handle`: an `IPCAllocationHandle`, or a bare
/// file descriptor (which records nothing else).
pub(super) fn handle_parts(object: &Bound<'_, PyAny>) -> PyResult<HandleParts> {
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
pub(super) fn registered_pool(
    py: Python<'_>,
    uuid: &Py<PyAny>,
    kind: &str,
) -> PyResult<Option<Py<PyAny>>> {
    let found = py
        .import("custody")?
        .getattr("_registered_pool")?
        .call1((uuid.clone_ref(py), kind))?;
    Ok((!found.is_none()).then(|| found.unbind()))
}

/// A pool resource, as the buffer module sees it (IPC imports).
pub(crate) struct PoolAccess(pub(super) Pool);

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
