//! Device queries and whole-context synchronisation, which the Python bindings' `Device` needs:
//! [`device_count`] and [`ContextHandle::synchronize`].

use std::ffi::c_int;

use crate::context::ContextHandle;
use crate::scope::in_context;
use crate::sys::{check, init};
use crate::HandleError;

/// How many devices the driver sees (initialising it on first use).
///
/// # Errors
/// [`HandleError::Load`] when no driver loads; [`HandleError::Driver`] when `cuInit` or the
/// count fails.
///
/// Driver calls: `cuInit` (once), `cuDeviceGetCount`.
pub fn device_count() -> Result<i32, HandleError> {
    let d = init()?;
    let mut count: c_int = 0;
    // SAFETY: `count` is a valid out-pointer; read only after success.
    let status = unsafe { (d.cuDeviceGetCount)(&mut count) };
    check("cuDeviceGetCount", status)?;
    Ok(count)
}

impl ContextHandle {
    /// Blocks the calling thread until all work queued in this context (on every stream of it)
    /// has finished. The caller's context binding is unchanged afterwards.
    ///
    /// # Errors
    /// [`HandleError::Driver`] when the wait fails; [`HandleError::ContextNotActivated`] or
    /// [`HandleError::ContextNotRestored`] when the context switch around it does.
    ///
    /// Driver calls: `cuCtxGetCurrent`, `cuCtxSetCurrent` (when this context is not current),
    /// `cuCtxSynchronize`.
    pub fn synchronize(&self) -> Result<(), HandleError> {
        in_context(self, "cuCtxSynchronize", |d| {
            // SAFETY: takes no arguments; `in_context` makes this context current.
            let status = unsafe { (d.cuCtxSynchronize)() };
            check("cuCtxSynchronize", status)
        })
    }
}
