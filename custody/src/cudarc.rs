//! Interoperability with [cudarc](https://docs.rs/cudarc) (the `cudarc` feature): a cudarc
//! stream wrapped as a custody stream, and custody memory passed to cudarc kernel launches.
//!
//! Both crates use cudarc's bindings, so a custody handle's raw value *is* a cudarc
//! `sys` value: a [`StreamHandle`]'s `raw()` is a `CUstream`, a view's
//! [`DeviceSlice::device_ptr`](crate::DeviceSlice::device_ptr) a `CUdeviceptr`, which cudarc's
//! launch builder takes as an argument (`builder.arg(&ptr)`; `u64` is a `DeviceRepr`). Both
//! must load the same driver: custody loads `CUSTODY_CUDA_DRIVER` (else `libcuda.so.1`), cudarc
//! the first `libcuda.so` (or `libcuda.so.1`, ...) the library path finds. Where
//! `CUSTODY_CUDA_DRIVER` names the emulated driver, the two are different drivers and must not
//! share handles, unless the library path's `libcuda.so` is that same file (the process then
//! loads it once): `cargo xtask test` links it so for these doc examples, which run on the
//! emulator (kernel launches are not emulated; `examples/cudarc_interop.rs` launches one on a
//! GPU host).
//!
//! ```
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
/// `cuDevicePrimaryCtxRetain`; `cuCtxGetId` for a context that is not primary).
///
/// ```
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use std::sync::Arc;
/// use custody::{DeviceMemoryResource, MemoryResource};
///
/// let theirs = cudarc::driver::CudaContext::new(0)?.new_stream()?;
/// let ours = custody::cudarc::stream(&theirs)?;
/// assert_eq!(ours.raw(), theirs.cu_stream()); // one stream, two handles
/// assert!(ours.context().is_some()); // read from the driver
/// let mut buffer = Arc::clone(&DeviceMemoryResource::new(0)?).allocate(4 * 64, &ours)?;
/// buffer.as_slice_mut::<f32>()?.copy_from_slice(&[1.5; 64], &ours)?;
/// drop(theirs); // custody's handle keeps cudarc's stream alive
/// assert_eq!(buffer.as_slice::<f32>()?.to_vec(&ours)?, [1.5; 64]);
/// drop(buffer); // freed on the wrapped stream
/// # Ok(())
/// # }
/// ```
#[allow(unsafe_code)]
pub fn stream(stream: &Arc<CudaStream>) -> Result<StreamHandle, HandleError> {
    let raw = stream.cu_stream() as usize;
    let owner: Box<dyn std::any::Any + Send + Sync> = Box::new(Arc::clone(stream));
    // SAFETY: `raw` is the live stream of `stream`; the handle keeps `owner` (a strong reference
    // to the cudarc stream, which destroys its `CUstream` only when the last reference goes)
    // until its last clone drops, so the stream outlives every use custody makes of it.
    unsafe { crate::raw::wrap_stream(raw, Some(owner)) }
}
