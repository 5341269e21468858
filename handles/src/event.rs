//! [`EventHandle`]: an event created in a context, destroyed when its last handle drops.

use std::fmt;
use std::sync::Arc;

use cuda_sys::types::{CUevent, CUipcEventHandle};
use cuda_sys::CudaErrorCode;

use crate::context::ContextHandle;
use crate::context::{in_context, in_context_or_undo};
use crate::error::HandleError;
use crate::flags::EventFlags;
use crate::report::Subject;
use crate::scope::release_in;
use crate::stream::StreamHandle;
use crate::sys::{check, driver};

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

impl EventHandle {
    /// Creates an event in `context` with `flags` (`CU_EVENT_*`; [`EventFlags::DISABLE_TIMING`]
    /// for an event that only orders work).
    ///
    /// # Errors
    /// [`HandleError::Driver`] when the creation fails; [`HandleError::ContextNotActivated`] or
    /// [`HandleError::ContextNotRestored`] for the switch to `context` (an event made before a
    /// failed restore is destroyed).
    ///
    /// Driver calls: `cuCtxGetCurrent`, `cuCtxSetCurrent` (if needed), `cuEventCreate`.
    pub fn create(context: &ContextHandle, flags: EventFlags) -> Result<EventHandle, HandleError> {
        EventHandle::made_in(context, "cuEventCreate", |_| create_raw(flags))
    }

    /// The event `make` makes (with the driver's `call`) while `context` is current, owned by
    /// the new handle; an event made before a failed restore is destroyed.
    fn made_in(
        context: &ContextHandle,
        call: &'static str,
        make: impl FnOnce(&'static cuda_sys::Driver) -> Result<usize, HandleError>,
    ) -> Result<EventHandle, HandleError> {
        let raw = in_context_or_undo(context, call, make, |_, raw| {
            // Still in `context`, since the restore failed: destroy what was made.
            destroy_raw(raw);
        })?;
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
    /// event's context); [`HandleError::Driver`] otherwise; [`HandleError::ContextNotActivated`]
    /// or [`HandleError::ContextNotRestored`] for the switch to the event's context.
    ///
    /// Driver calls: `cuCtxGetCurrent`, `cuCtxSetCurrent` (if needed), `cuEventRecord`.
    pub fn record(&self, stream: &StreamHandle) -> Result<(), HandleError> {
        in_context(&self.0.context, "cuEventRecord", |d| {
            // SAFETY: both handles keep their resources alive; the event's context is current.
            let status = unsafe { (d.cuEventRecord)(self.raw(), stream.raw()) };
            check("cuEventRecord", status)
        })
    }

    /// Blocks the calling thread until the recorded work has finished.
    ///
    /// # Errors
    /// [`HandleError::Driver`] when the driver reports a failure; as [`EventHandle::record`]
    /// for the context switch.
    ///
    /// Driver calls: `cuCtxGetCurrent`, `cuCtxSetCurrent` (if needed), `cuEventSynchronize`.
    pub fn synchronize(&self) -> Result<(), HandleError> {
        in_context(&self.0.context, "cuEventSynchronize", |d| {
            // SAFETY: the handle keeps the event alive; its context is current.
            let status = unsafe { (d.cuEventSynchronize)(self.raw()) };
            check("cuEventSynchronize", status)
        })
    }

    /// Whether the recorded work has finished, without blocking.
    ///
    /// # Errors
    /// [`HandleError::Driver`] for any status other than success or `CUDA_ERROR_NOT_READY`; as
    /// [`EventHandle::record`] for the context switch.
    ///
    /// Driver calls: `cuCtxGetCurrent`, `cuCtxSetCurrent` (if needed), `cuEventQuery`.
    pub fn query(&self) -> Result<bool, HandleError> {
        in_context(&self.0.context, "cuEventQuery", |d| {
            // SAFETY: the handle keeps the event alive; its context is current.
            let status = unsafe { (d.cuEventQuery)(self.raw()) };
            if status == CudaErrorCode::NOT_READY.0 {
                Ok(false)
            } else {
                check("cuEventQuery", status).map(|()| true)
            }
        })
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
pub(crate) fn create_raw(flags: EventFlags) -> Result<usize, HandleError> {
    let d = driver()?;
    let mut raw: CUevent = std::ptr::null_mut();
    // SAFETY: `raw` is a valid out-pointer; read only after success.
    let status = unsafe { (d.cuEventCreate)(&mut raw, flags.bits()) };
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

/// Sharing events between processes, for the Python bindings' `Event.ipc_descriptor` and
/// `Event.from_ipc_descriptor`.
impl EventHandle {
    /// The driver's 64-byte handle another process opens this event with (the event must have
    /// been created with `CU_EVENT_INTERPROCESS | CU_EVENT_DISABLE_TIMING`).
    ///
    /// # Errors
    /// [`HandleError::Driver`] (`CUDA_ERROR_INVALID_VALUE` for an event not created for
    /// interprocess use); [`HandleError::Load`] when the driver lacks `cuIpcGetEventHandle`.
    ///
    /// Driver calls: `cuCtxGetCurrent`, `cuCtxSetCurrent` (if needed), `cuIpcGetEventHandle`.
    pub fn ipc_handle(&self) -> Result<[u8; 64], HandleError> {
        in_context(&self.0.context, "cuIpcGetEventHandle", |d| {
            let get = d.cuIpcGetEventHandle().map_err(HandleError::Load)?;
            let mut handle = CUipcEventHandle { reserved: [0; 64] };
            // SAFETY: the handle keeps the event alive; `handle` is the 64-byte out-buffer.
            let status = unsafe { get(&mut handle, self.raw()) };
            check("cuIpcGetEventHandle", status)?;
            Ok(handle.reserved.map(|c| c as u8))
        })
    }

    /// Opens, in `context`, an event another process shared as `handle` (its
    /// [`EventHandle::ipc_handle`]). The new handle is owned here: destroyed with its last
    /// clone, like any event; it behaves as an event created with `CU_EVENT_DISABLE_TIMING`
    /// whose records are the exporting process's.
    ///
    /// # Errors
    /// [`HandleError::Driver`] when the driver refuses the handle; [`HandleError::Load`] when it
    /// lacks `cuIpcOpenEventHandle`.
    ///
    /// Driver calls: `cuCtxGetCurrent`, `cuCtxSetCurrent` (if needed), `cuIpcOpenEventHandle`.
    pub fn open_ipc(
        context: &ContextHandle,
        handle: &[u8; 64],
    ) -> Result<EventHandle, HandleError> {
        EventHandle::made_in(context, "cuIpcOpenEventHandle", |d| {
            let open = d.cuIpcOpenEventHandle().map_err(HandleError::Load)?;
            let handle = CUipcEventHandle {
                reserved: handle.map(|b| b as std::ffi::c_char),
            };
            let mut raw: CUevent = std::ptr::null_mut();
            // SAFETY: `raw` is a valid out-pointer; `handle` is passed by value.
            let status = unsafe { open(&mut raw, handle) };
            check("cuIpcOpenEventHandle", status)?;
            Ok(raw as usize)
        })
    }
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
        in_context(&self.0.context, "cuEventElapsedTime", |d| {
            let elapsed = d.cuEventElapsedTime().map_err(HandleError::Load)?;
            let mut ms: f32 = 0.0;
            // SAFETY: both handles keep their events alive; `ms` is a valid out-pointer.
            let status = unsafe { elapsed(&mut ms, start.raw(), self.raw()) };
            check("cuEventElapsedTime", status)?;
            Ok(ms)
        })
    }
}

impl Drop for EventBox {
    fn drop(&mut self) {
        let (raw, context) = (self.raw, self.context.raw_usize());
        release_in(
            context,
            || Subject::new("event", "cuEventDestroy_v2", raw as u64, 0, context as u64),
            |_| check("cuEventDestroy_v2", destroy_raw(raw)),
        );
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

impl StreamHandle {
    /// Makes all future work on this stream wait for `event`'s last recorded work. Does not
    /// block the host.
    ///
    /// # Errors
    /// As [`StreamHandle::synchronize`].
    ///
    /// Driver calls: `cuStreamWaitEvent` (inside the stream's context).
    pub fn wait_event(&self, event: &EventHandle) -> Result<(), HandleError> {
        self.run("cuStreamWaitEvent", |d, s| {
            // SAFETY: both handles keep their resources alive.
            unsafe { (d.cuStreamWaitEvent)(s, event.raw(), 0) }
        })
    }
}
