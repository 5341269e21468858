//! The device queries the Python `Device` class is built on (the device count, attributes,
//! UUID, name, PCI address, peer access), and a `custody.Device` made from Rust.

use pyo3::prelude::*;

use crate::errors::Error;

/// `custody.Device(ordinal)`.
pub(crate) fn device_object(py: Python<'_>, ordinal: i32) -> PyResult<Bound<'_, PyAny>> {
    py.import("custody")?.getattr("Device")?.call1((ordinal,))
}

/// How many devices the driver sees.
#[pyfunction]
pub(crate) fn _device_count(py: Python<'_>) -> PyResult<i32> {
    Ok(py.detach(handles::device_count).map_err(Error::from)?)
}

/// Device `device_id`'s attribute number `attribute` (`cuDeviceGetAttribute`).
#[pyfunction]
pub(crate) fn _device_attribute(py: Python<'_>, device_id: i32, attribute: u32) -> PyResult<i32> {
    Ok(py
        .detach(|| handles::device_attribute(device_id, attribute))
        .map_err(Error::from)?)
}

/// Device `device_id`'s UUID, 16 bytes (`cuDeviceGetUuid`).
#[pyfunction]
pub(crate) fn _device_uuid(py: Python<'_>, device_id: i32) -> PyResult<Vec<u8>> {
    Ok(py
        .detach(|| handles::device_uuid(device_id))
        .map_err(Error::from)?
        .to_vec())
}

/// Device `device_id`'s name (`cuDeviceGetName`).
#[pyfunction]
pub(crate) fn _device_name(py: Python<'_>, device_id: i32) -> PyResult<String> {
    Ok(py
        .detach(|| handles::device_name(device_id))
        .map_err(Error::from)?)
}

/// Device `device_id`'s PCI address, `domain:bus:device.function` (`cuDeviceGetPCIBusId`).
#[pyfunction]
pub(crate) fn _device_pci_bus_id(py: Python<'_>, device_id: i32) -> PyResult<String> {
    Ok(py
        .detach(|| handles::device_pci_bus_id(device_id))
        .map_err(Error::from)?)
}

/// Whether device `device_id` can access device `peer`'s memory (`cuDeviceCanAccessPeer`).
#[pyfunction]
pub(crate) fn _can_access_peer(py: Python<'_>, device_id: i32, peer: i32) -> PyResult<bool> {
    Ok(py
        .detach(|| handles::device_can_access_peer(device_id, peer))
        .map_err(Error::from)?)
}
