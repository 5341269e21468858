//! GPU-only tests: compiled only with `--features gpu` (which `cargo xtask gpu-bundle` and
//! `cargo xtask gpu-test` turn on), and meant to run only against a real driver.
//!
//! They guard the GPU run itself: a bundle that silently tested the emulator, or a machine
//! without a device, fails here rather than passing as "GPU-tested".

#![cfg(feature = "gpu")]

use std::ffi::c_int;

#[test]
fn gpu_loaded_driver_is_real_and_has_a_device() {
    let driver = match cuda_sys::driver() {
        Ok(driver) => driver,
        Err(error) => panic!("no CUDA driver could be loaded on the GPU host: {error}"),
    };
    assert!(
        !driver.is_emulated(),
        "the GPU run loaded the emulated driver ({}); unset {}",
        driver.path(),
        cuda_sys::DRIVER_ENV
    );
    assert!(driver.version() >= cuda_sys::MIN_DRIVER_VERSION);
    // SAFETY: cuInit takes a flags word and no pointers.
    let status = unsafe { (driver.cuInit)(0) };
    assert_eq!(
        cuda_sys::CudaErrorCode(status),
        cuda_sys::CudaErrorCode::SUCCESS
    );
    let mut count: c_int = 0;
    // SAFETY: `count` is a valid out-pointer, read only after success.
    let status = unsafe { (driver.cuDeviceGetCount)(&mut count) };
    assert_eq!(
        cuda_sys::CudaErrorCode(status),
        cuda_sys::CudaErrorCode::SUCCESS
    );
    assert!(count >= 1, "the real driver reports no device");
}
