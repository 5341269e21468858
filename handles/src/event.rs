//! [`EventHandle`]: an event created in a context, destroyed when its last handle drops.

use std::fmt;
use std::sync::Arc;

use cuda_sys::types::CUevent;
use cuda_sys::CudaErrorCode;

use crate::context::{ContextHandle, ContextScope};
use crate::report::{report, CleanupError};
use crate::stream::StreamHandle;
use crate::sys::{check, driver};
use crate::HandleError;

struct EventBox {
    raw: usize,
    context: ContextHandle,
}

/// A CUDA event, owned, embedding the context it was created in.
///
/// Cloning is one atomic increment. The event is destroyed (in its context) when the last clone
/// drops; a failure then is reported through the cleanup-error hook.
#[derive(Clone)]
pub struct EventHandle(Arc<EventBox>);

/// `CU_EVENT_DISABLE_TIMING`: the cheapest event, for ordering only.
pub const EVENT_DISABLE_TIMING: u32 = 0x2;

impl EventHandle {
    /// Creates an event in `context` with `flags` (`CU_EVENT_*`).
    ///
    /// # Errors
    /// [`HandleError::Driver`] when the context switch or the creation fails.
    ///
    /// Driver calls: `cuCtxGetCurrent`, `cuCtxSetCurrent` (if needed), `cuEventCreate`.
    pub fn create(context: &ContextHandle, flags: u32) -> Result<EventHandle, HandleError> {
        let scope = ContextScope::enter(context)?;
        let raw = create_raw(flags);
        let restored = scope.exit();
        let raw = raw?;
        if let Err(error) = restored {
            // Still in `context`, since the restore failed: destroy what was made.
            destroy_raw(raw);
            return Err(error);
        }
        Ok(EventHandle(Arc::new(EventBox {
            raw,
            context: context.clone(),
        })))
    }

    /// Records the event on `stream`: it completes when the work queued there so far has.
    /// Does not block.
    ///
    /// # Errors
    /// [`HandleError::NoCurrentContext`] when `stream` is an unbound token (resolved in the
    /// event's context); [`HandleError::Driver`] otherwise.
    ///
    /// Driver calls: `cuCtxGetCurrent`, `cuCtxSetCurrent` (if needed), `cuEventRecord`.
    pub fn record(&self, stream: &StreamHandle) -> Result<(), HandleError> {
        let d = driver()?;
        let scope = ContextScope::enter(&self.0.context)?;
        // SAFETY: both handles keep their resources alive; the event's context is current.
        let status = unsafe { (d.cuEventRecord)(self.raw(), stream.raw()) };
        let restored = scope.exit();
        check("cuEventRecord", status)?;
        restored
    }

    /// Blocks the calling thread until the recorded work has finished.
    ///
    /// # Errors
    /// [`HandleError::Driver`] when the driver reports a failure.
    ///
    /// Driver calls: `cuEventSynchronize`.
    pub fn synchronize(&self) -> Result<(), HandleError> {
        let d = driver()?;
        let scope = ContextScope::enter(&self.0.context)?;
        // SAFETY: the handle keeps the event alive; its context is current.
        let status = unsafe { (d.cuEventSynchronize)(self.raw()) };
        let restored = scope.exit();
        check("cuEventSynchronize", status)?;
        restored
    }

    /// Whether the recorded work has finished, without blocking.
    ///
    /// # Errors
    /// [`HandleError::Driver`] for any status other than success or `CUDA_ERROR_NOT_READY`.
    ///
    /// Driver calls: `cuEventQuery`.
    pub fn query(&self) -> Result<bool, HandleError> {
        let d = driver()?;
        let scope = ContextScope::enter(&self.0.context)?;
        // SAFETY: the handle keeps the event alive; its context is current.
        let status = unsafe { (d.cuEventQuery)(self.raw()) };
        let restored = scope.exit();
        let done = if status == CudaErrorCode::NOT_READY.0 {
            false
        } else {
            check("cuEventQuery", status)?;
            true
        };
        restored?;
        Ok(done)
    }

    /// The raw `CUevent`, valid while this handle lives.
    pub fn raw(&self) -> CUevent {
        self.0.raw as CUevent
    }

    /// The context the event was created in.
    pub fn context(&self) -> &ContextHandle {
        &self.0.context
    }
}

/// Creates an event in the current context. Driver calls: `cuEventCreate`.
pub(crate) fn create_raw(flags: u32) -> Result<usize, HandleError> {
    let d = driver()?;
    let mut raw: CUevent = std::ptr::null_mut();
    // SAFETY: `raw` is a valid out-pointer; read only after success.
    let status = unsafe { (d.cuEventCreate)(&mut raw, flags) };
    check("cuEventCreate", status)?;
    Ok(raw as usize)
}

/// Destroys an event made by [`create_raw`], returning the driver's status.
/// Driver calls: `cuEventDestroy_v2`.
pub(crate) fn destroy_raw(raw: usize) -> u32 {
    let Ok(d) = driver() else { return 0 };
    // SAFETY: the caller owns the event and never uses it again.
    unsafe { (d.cuEventDestroy_v2)(raw as CUevent) }
}

/// Event timing, for the Python bindings' `Event.__sub__`.
impl EventHandle {
    /// The time in milliseconds from `start`'s completion to this event's, as the driver
    /// measured it (both created with timing, recorded and completed).
    ///
    /// # Errors
    /// [`HandleError::Driver`]: `CUDA_ERROR_INVALID_HANDLE` when either event was created
    /// without timing or never recorded, `CUDA_ERROR_NOT_READY` when either has not completed;
    /// [`HandleError::Load`] when the driver lacks `cuEventElapsedTime`.
    ///
    /// Driver calls: `cuCtxGetCurrent`, `cuCtxSetCurrent` (if needed), `cuEventElapsedTime`.
    pub fn elapsed_since(&self, start: &EventHandle) -> Result<f32, HandleError> {
        let d = driver()?;
        let elapsed = d.cuEventElapsedTime().map_err(HandleError::Load)?;
        let scope = ContextScope::enter(&self.0.context)?;
        let mut ms: f32 = 0.0;
        // SAFETY: both handles keep their events alive; `ms` is a valid out-pointer.
        let status = unsafe { elapsed(&mut ms, start.raw(), self.raw()) };
        let restored = scope.exit();
        check("cuEventElapsedTime", status)?;
        restored?;
        Ok(ms)
    }
}

impl Drop for EventBox {
    fn drop(&mut self) {
        if crate::deferred::exiting() {
            return;
        }
        let outcome = ContextScope::enter(&self.context).and_then(|scope| {
            let destroyed = check("cuEventDestroy_v2", destroy_raw(self.raw));
            let restored = scope.exit();
            destroyed.and(restored)
        });
        if let Err(error) = outcome {
            report(CleanupError {
                operation: "cuEventDestroy_v2",
                ptr: self.raw as u64,
                stream: 0,
                context: self.context.raw_usize() as u64,
                error,
            });
        }
    }
}

impl fmt::Debug for EventHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "EventHandle(0x{:x}, context 0x{:x})",
            self.0.raw,
            self.0.context.raw_usize()
        )
    }
}
