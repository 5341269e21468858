//! The buffer family: `Buffer` and `ManagedBuffer`, thin shells around a `memory::Buffer` shared by
//! the object's references; adoption with `from_handle`; copies and fills; DLPack; managed-memory
//! placement and its batch functions; IPC descriptors.
//!
//! The modules, lowest first; each imports only those before it (pybind/DESIGN.md, "Module
//! order"):
//!
//! - `shared`: [`SharedBuffer`], the closable state of one Python buffer over the Rust buffer.
//! - `class`: the structs of `Buffer` and `ManagedBuffer`, which graphs and resources name (they
//!   make buffers), with their `Drop` and the constructors and accessors the others call.
//! - `adopt`: `from_handle` (a pointer adopted with a memory resource, an owner, or as a view).
//! - `ipc`: `IPCBufferDescriptor`, what another process needs to import one buffer.
//! - `methods`: `Buffer`'s methods: close, streams of the recipe, copies, fills, properties,
//!   DLPack, garbage collection.
//! - `managed`: `ManagedBuffer`'s methods (advice, prefetch, discard) and the batch functions.
//!
//! [`SharedBuffer`]: shared::SharedBuffer

mod adopt;
pub(crate) mod class;
mod ipc;
mod managed;
mod methods;
mod shared;

use pyo3::prelude::*;

use class::{PyBuffer, PyManagedBuffer};
use ipc::PyIpcBufferDescriptor;
use managed::{discard_batch, discard_prefetch_batch, prefetch_batch};

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
    add_classes!(m, [PyManagedBuffer, PyIpcBufferDescriptor]);
    add_functions!(m, [prefetch_batch, discard_batch, discard_prefetch_batch]);
    Ok(())
}
