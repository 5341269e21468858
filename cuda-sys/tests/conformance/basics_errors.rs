//! Basics: error codes for invalid input that a real driver rejects without crashing (null
//! out-pointers, zero sizes, unknown addresses, out-of-range ordinals, missing contexts).

use std::ptr;

use cuda_sys::CudaErrorCode;

use crate::driver::{
    device_get, device_get_count, device_get_name, driver_get_version, init, mem_alloc, mem_free,
    pointer_memory_type, stream_create, Ret,
};
use crate::support::{device0, on_fresh_thread, primary_current, Primary};

/// Asserts `status` is `CUDA_ERROR_INVALID_VALUE` for the call named `call`.
#[track_caller]
fn invalid_value(call: &'static str, status: cuda_sys::CUresult) {
    Ret::from_status(call, status).fails_with(CudaErrorCode::INVALID_VALUE);
}

#[test]
fn basic_driver_version_and_devices() {
    on_fresh_thread("version", || {
        init();
        assert!(driver_get_version().check() >= cuda_sys::MIN_DRIVER_VERSION);
        let count = device_get_count().check();
        assert!(count >= 1, "no device");
        assert!(!device_get_name(device0()).check().is_empty());
    });
}

#[test]
fn basic_error_device_get_out_of_range() {
    on_fresh_thread("device-range", || {
        init();
        let count = device_get_count().check();
        device_get(count).fails_with(CudaErrorCode::INVALID_DEVICE);
        device_get(-1).fails_with(CudaErrorCode::INVALID_DEVICE);
    });
}

#[test]
fn basic_error_null_out_pointers_for_version_device_and_context() {
    on_fresh_thread("null-out-ctx", || {
        let d = init();
        // A NULL out-pointer is the input under test in each call below: the driver documents
        // CUDA_ERROR_INVALID_VALUE for it and does not write through it.
        // SAFETY: NULL out-pointer under test, never written.
        invalid_value("cuDriverGetVersion", unsafe {
            (d.cuDriverGetVersion)(ptr::null_mut())
        });
        // SAFETY: NULL out-pointer under test, never written.
        invalid_value("cuDeviceGet", unsafe {
            (d.cuDeviceGet)(ptr::null_mut(), 0)
        });
        // SAFETY: NULL out-pointer under test, never written.
        invalid_value("cuDeviceGetCount", unsafe {
            (d.cuDeviceGetCount)(ptr::null_mut())
        });
        // SAFETY: NULL out-pointer under test, never written.
        invalid_value("cuCtxGetCurrent", unsafe {
            (d.cuCtxGetCurrent)(ptr::null_mut())
        });
    });
}

#[test]
fn basic_error_null_out_pointers_for_streams_events_and_memory() {
    on_fresh_thread("null-out-stream", || {
        let d = init();
        let _primary = primary_current();
        // A NULL out-pointer is the input under test in each call below: the driver documents
        // CUDA_ERROR_INVALID_VALUE for it and does not write through it.
        // SAFETY: NULL out-pointer under test, never written.
        invalid_value("cuStreamCreate", unsafe {
            (d.cuStreamCreate().expect("cuStreamCreate"))(ptr::null_mut(), 0)
        });
        // SAFETY: NULL out-pointer under test, never written.
        invalid_value("cuEventCreate", unsafe {
            (d.cuEventCreate)(ptr::null_mut(), 0)
        });
        // SAFETY: NULL out-pointer under test, never written.
        invalid_value("cuMemAlloc_v2", unsafe {
            (d.cuMemAlloc_v2)(ptr::null_mut(), 4096)
        });
        let props = crate::driver::device_pool_props(device0());
        // SAFETY: NULL out-pointer under test, never written; `props` is a valid pool description.
        invalid_value("cuMemPoolCreate", unsafe {
            (d.cuMemPoolCreate)(ptr::null_mut(), &props)
        });
    });
}

#[test]
fn basic_error_zero_size_mem_alloc() {
    on_fresh_thread("zero-size", || {
        init();
        let _primary = primary_current();
        mem_alloc(0).fails_with(CudaErrorCode::INVALID_VALUE);
    });
}

#[test]
fn basic_error_mem_free_of_never_allocated_address() {
    on_fresh_thread("free-unknown", || {
        init();
        let _primary = primary_current();
        // A host heap address: certainly not an allocation the driver made.
        let host = Box::new([0u8; 64]);
        let address = host.as_ptr() as u64;
        mem_free(address).fails_with(CudaErrorCode::INVALID_VALUE);
        drop(host);
    });
}

#[test]
fn basic_error_pointer_attribute_of_unknown_address() {
    on_fresh_thread("pointer-unknown", || {
        init();
        let _primary = primary_current();
        let host = Box::new([0u8; 64]);
        pointer_memory_type(host.as_ptr() as u64).fails_with(CudaErrorCode::INVALID_VALUE);
        drop(host);
    });
}

#[test]
fn basic_error_mem_alloc_and_stream_create_without_context() {
    init();
    // Retained on the test thread (retaining binds no context), current on no thread.
    let _primary = Primary::retain();
    on_fresh_thread("no-context", || {
        init();
        mem_alloc(4096).fails_with(CudaErrorCode::INVALID_CONTEXT);
        stream_create(0).fails_with(CudaErrorCode::INVALID_CONTEXT);
    });
}
