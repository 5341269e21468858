//! Interoperability with [cudarc](https://docs.rs/cudarc) (the `cudarc` feature): a cudarc
//! stream wrapped as a custody stream, and custody memory passed to cudarc kernel launches.
//!
//! Both crates use cudarc's bindings, so a custody handle's raw value *is* a cudarc
//! `sys` value: a [`StreamHandle`]'s `raw()` is a `CUstream`, a view's
//! [`DeviceSlice::device_ptr`](crate::DeviceSlice::device_ptr) a `CUdeviceptr`, which cudarc's
//! launch builder takes as an argument (`builder.arg(&ptr)`; `u64` is a `DeviceRepr`). Both
//! must load the same driver: custody loads `CUSTODY_CUDA_DRIVER` (else `libcuda.so.1`), cudarc
//! the system's `libcuda.so`; with the emulated driver named in `CUSTODY_CUDA_DRIVER`, the two
//! are different drivers and must not share handles.
//!
//! ```no_run
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use std::sync::Arc;
//! use custody::{DeviceMemoryResource, MemoryResource};
//!
//! let context = cudarc::driver::CudaContext::new(0)?;
//! let theirs = context.new_stream()?;
//! let ours = custody::cudarc::stream(&theirs)?; // keeps `theirs` alive while custody needs it
//! let mut buffer = Arc::clone(&DeviceMemoryResource::new(0)?).allocate(4 * 256, &ours)?;
//! let ptr = buffer.as_slice_mut::<f32>()?.device_ptr(); // for `launch_builder(..).arg(&ptr)`
//! # let _ = ptr;
//! drop(theirs); // the buffer's recipe still holds the stream: its free is ordered on it
//! drop(buffer);
//! # Ok(())
//! # }
//! ```

use std::sync::Arc;

use cudarc::driver::CudaStream;

use crate::{HandleError, StreamHandle};

/// A custody stream for a cudarc stream: the same `CUstream`, its context read from the driver
/// (`cuStreamGetCtx`), and the cudarc `Arc` kept by the handle, so the stream is not destroyed
/// while the handle, a clone of it, or a deallocation recipe recorded with it lives. cudarc's
/// default stream (a null `CUstream`) becomes custody's unbound legacy token.
///
/// # Errors
/// [`HandleError::Driver`] when `cuStreamGetCtx` rejects the stream (custody and cudarc loaded
/// different drivers, say).
///
/// Driver calls: `cuStreamGetCtx`, and those of wrapping its context (`cuCtxGetCurrent`,
/// `cuCtxSetCurrent`, `cuCtxGetDevice`, `cuDevicePrimaryCtxGetState`,
/// `cuDevicePrimaryCtxRetain`).
#[allow(unsafe_code)]
pub fn stream(stream: &Arc<CudaStream>) -> Result<StreamHandle, HandleError> {
    let raw = stream.cu_stream() as usize;
    let owner: Box<dyn std::any::Any + Send + Sync> = Box::new(Arc::clone(stream));
    // SAFETY: `raw` is the live stream of `stream`; the handle keeps `owner` (a strong reference
    // to the cudarc stream, which destroys its `CUstream` only when the last reference goes)
    // until its last clone drops, so the stream outlives every use custody makes of it.
    unsafe { crate::raw::wrap_stream(raw, Some(owner)) }
}
