//! The stream family: `Stream`, how a stream argument is accepted, `Event` and its IPC
//! descriptor, `Context`, and the device-level functions the Python `Device` class is built on.
//!
//! The object protocols follow cuda.core 1.2: streams, events and contexts are weak-referenceable,
//! compare equal when they wrap the same driver handle and hash by it; `Stream` can be
//! subclassed in Python (`MyStream._init(...)`, `MyStream._legacy_default()`).
//!
//! The modules, lowest first; each imports only those before it (pybind/DESIGN.md, "Module
//! order"):
//!
//! - `class`: `Stream`'s struct, which every other family names, with its constructor and
//!   handle accessor.
//! - `accept`: how a stream argument is accepted (a `Stream`, a `GraphBuilder`'s captured
//!   stream, or any object with `__cuda_stream__`), and the default stream as a handle.
//! - `context`: `Context`, and the context functions `Device` uses.
//! - `device`: the device queries `Device` uses, and `custody.Device` made from Rust.
//! - `event`: `Event` (made by `Stream.record` or `Device.create_event`) and
//!   `IPCEventDescriptor`.
//! - `methods`: `Stream`'s methods, the default-stream singletons, and the streams `Device`
//!   creates.

pub(crate) mod accept;
pub(crate) mod class;
pub(crate) mod context;
mod device;
mod event;
pub(crate) mod methods;

use handles::DefaultStream;
use pyo3::prelude::*;

use class::PyStream;
use context::{_current_context, _primary_context, _set_current, _synchronize_context, PyContext};
use device::{
    _can_access_peer, _device_attribute, _device_count, _device_name, _device_pci_bus_id,
    _device_uuid,
};
use event::{_create_event, PyEvent, PyIpcEventDescriptor};
use methods::{_create_stream, _stream_accept, default_stream, singleton, PyStreamInit};

/// Registers the stream classes and functions on the module.
pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    add_classes!(
        m,
        [
            PyStream,
            PyStreamInit,
            PyEvent,
            PyIpcEventDescriptor,
            PyContext
        ]
    );
    m.add(
        "LEGACY_DEFAULT_STREAM",
        singleton(py, DefaultStream::Legacy)?.clone_ref(py),
    )?;
    m.add(
        "PER_THREAD_DEFAULT_STREAM",
        singleton(py, DefaultStream::PerThread)?.clone_ref(py),
    )?;
    add_functions!(
        m,
        [
            default_stream,
            _stream_accept,
            _device_count,
            _device_attribute,
            _device_name,
            _device_pci_bus_id,
            _device_uuid,
            _can_access_peer,
            _primary_context,
            _set_current,
            _current_context,
            _synchronize_context,
            _create_stream,
            _create_event
        ]
    );
    Ok(())
}
