//! The resource family: `MemoryResource` (subclassable in Python), the built-in resources, pool
//! attributes and IPC, the caching resource, and the adapter that lets a Python subclass free
//! adopted memory at teardown.
//!
//! Which `deallocate` frees memory adopted with `Buffer.from_handle(ptr, size, mr=...)`: a
//! built-in resource (or a Python subclass of one that does not override `deallocate`) frees with
//! its own rule, without Python; any other Python subclass gets its own `deallocate(ptr, size,
//! stream=...)` called, from whatever thread drops the buffer, with the recipe's context current
//! and the GIL held only for that call. Memory a built-in `allocate` returned is always freed by
//! the built-in rule.
//!
//! The modules, lowest first; each imports only those before it (pybind/DESIGN.md, "Module
//! order"):
//!
//! - `class`: `MemoryResource`'s struct, which every resource extends, with its constructors;
//!   device ordinal arguments.
//! - `attributes`: `MemoryPoolAttributes` and `GraphMemoryResourceAttributes`, read from the
//!   driver when asked.
//! - `closable`: a pool resource as its Python object holds it, with the object's closed state
//!   (`close()`), which the Rust resource does not have.
//! - `ipc`: what the pool resources share for IPC: the pool of a resource, its UUID and kept
//!   allocation handle, the handle arguments of an import.
//! - `pools`: `DeviceMemoryResource`, `PinnedMemoryResource`, `ManagedMemoryResource` (the
//!   stream-ordered pools) and their base `_MemPool`, opening a pool another process exported, a resource's pool.
//! - `synchronous`: `LegacyPinnedMemoryResource`, `LegacyManagedMemoryResource`,
//!   `SynchronousMemoryResource`.
//! - `graph`: `GraphMemoryResource`.
//! - `methods`: `MemoryResource`'s methods (`allocate`, `deallocate`, what its memory is).
//! - `adapter`: a Python subclass seen from Rust ([`PyResourceAdapter`]), and resolving the
//!   resource that will own adopted memory.
//! - `caching`: `CachingMemoryResource`.
//!
//! [`PyResourceAdapter`]: adapter::PyResourceAdapter

pub(crate) mod adapter;
mod attributes;
mod caching;
mod class;
mod closable;
mod graph;
pub(crate) mod ipc;
mod methods;
pub(crate) mod pools;
mod synchronous;

use pyo3::prelude::*;

use attributes::{PyGraphMemoryAttributes, PyPoolAttributes};
use caching::PyCachingMemoryResource;
use class::PyMemoryResource;
use graph::PyGraphMemoryResource;
use pools::{PyDeviceMemoryResource, PyManagedMemoryResource, PyMemPool, PyPinnedMemoryResource};
use synchronous::{
    PyLegacyManagedMemoryResource, PyLegacyPinnedMemoryResource, PySynchronousMemoryResource,
};

/// Registers the resource classes on the module.
pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    add_classes!(
        m,
        [
            PyMemoryResource,
            PyMemPool,
            PyDeviceMemoryResource,
            PyPinnedMemoryResource,
            PyLegacyPinnedMemoryResource,
            PyManagedMemoryResource,
            PyLegacyManagedMemoryResource,
            PySynchronousMemoryResource,
            PyGraphMemoryResource,
            PyCachingMemoryResource,
            PyPoolAttributes,
            PyGraphMemoryAttributes
        ]
    );
    Ok(())
}
