//! Small internal helpers around the raw driver: loading, checking a status, reading the
//! current context. Nothing here owns a resource.

use std::sync::OnceLock;

use cuda_sys::types::CUcontext;
use cuda_sys::{CudaError, CudaErrorCode, Driver};

use crate::error::HandleError;

/// The process's driver, or the load error. After the first success this is one atomic load.
#[inline]
pub(crate) fn driver() -> Result<&'static Driver, HandleError> {
    static LOADED: OnceLock<&'static Driver> = OnceLock::new();
    match LOADED.get() {
        Some(d) => Ok(d),
        None => load_driver(&LOADED),
    }
}

#[cold]
fn load_driver(cache: &OnceLock<&'static Driver>) -> Result<&'static Driver, HandleError> {
    let d = cuda_sys::driver().map_err(HandleError::Load)?;
    Ok(*cache.get_or_init(|| d))
}

/// The driver error for `call` returning `status` (not `CUDA_SUCCESS`), built off the hot path.
#[cold]
#[inline(never)]
pub(crate) fn error(call: &'static str, status: u32) -> HandleError {
    HandleError::Driver(CudaError::new(call, CudaErrorCode(status)))
}

/// `cuCtxGetCurrent` as a raw value and status, for hot paths: `Ok(0)` for none (including a
/// driver never initialised), `Err(status)` for a failure.
#[inline]
pub(crate) fn current_context_raw(d: &Driver) -> Result<usize, u32> {
    let mut ctx: CUcontext = std::ptr::null_mut();
    // SAFETY: `ctx` is a valid out-pointer; it is read only after success.
    let status = unsafe { (d.cuCtxGetCurrent)(&mut ctx) };
    match status {
        0 => Ok(ctx as usize),
        s if s == CudaErrorCode::NOT_INITIALIZED.0 => Ok(0),
        s => Err(s),
    }
}

/// `cuCtxSetCurrent(ctx)` returning the raw status, for hot paths.
#[inline]
pub(crate) fn set_current_raw(d: &Driver, ctx: usize) -> u32 {
    // SAFETY: the caller holds a handle that keeps `ctx` alive, or `ctx` is the context that
    // was current a moment ago (or NULL, which unbinds).
    unsafe { (d.cuCtxSetCurrent)(as_ctx(ctx)) }
}

/// `Ok(())` for `CUDA_SUCCESS`, else the driver error for `call`.
#[inline]
pub(crate) fn check(call: &'static str, status: u32) -> Result<(), HandleError> {
    if status == 0 {
        Ok(())
    } else {
        Err(HandleError::Driver(CudaError::new(
            call,
            CudaErrorCode(status),
        )))
    }
}

/// Like [`check`] for a call whose stream argument was an unbound default-stream token: the
/// driver's `CUDA_ERROR_INVALID_CONTEXT` means "no context to resolve the token against".
#[inline]
pub(crate) fn check_token(call: &'static str, status: u32, token: bool) -> Result<(), HandleError> {
    if token
        && (status == CudaErrorCode::INVALID_CONTEXT.0
            || status == CudaErrorCode::NOT_INITIALIZED.0)
    {
        return Err(HandleError::NoCurrentContext);
    }
    check(call, status)
}

/// The context current on the calling thread as a raw value (0 for none). A driver that was
/// never initialised has no current context, so `CUDA_ERROR_NOT_INITIALIZED` reads as 0.
///
/// Driver calls: `cuCtxGetCurrent`.
#[inline]
pub(crate) fn current_context(d: &Driver) -> Result<usize, HandleError> {
    current_context_raw(d).map_err(|status| error("cuCtxGetCurrent", status))
}

static INIT: OnceLock<Result<(), HandleError>> = OnceLock::new();

/// Initialises the driver once per process (`cuInit(0)`); later calls return the first outcome.
///
/// Driver calls: `cuInit`.
pub(crate) fn init() -> Result<&'static Driver, HandleError> {
    let d = driver()?;
    INIT.get_or_init(|| {
        crate::lifecycle::register_exit_hook();
        // SAFETY: `cuInit` takes only flags, which must be 0.
        let status = unsafe { (d.cuInit)(0) };
        check("cuInit", status)
    })
    .clone()?;
    Ok(d)
}

/// Raw handles are stored as `usize` so that the boxes are `Send + Sync`; these turn them back.
#[inline]
pub(crate) fn as_ctx(raw: usize) -> CUcontext {
    raw as CUcontext
}

/// `CU_STREAM_CAPTURE_MODE_RELAXED`: a thread in this mode is refused no "potentially unsafe"
/// call by another thread's capture.
pub(crate) const CAPTURE_MODE_RELAXED: u32 = 2;

/// Sets the calling thread's stream-capture interaction mode to `mode` (`CU_STREAM_CAPTURE_MODE_*`)
/// and returns the mode it had; the driver's status when that failed.
///
/// Driver calls: `cuThreadExchangeStreamCaptureMode`.
pub(crate) fn exchange_capture_mode(d: &Driver, mode: u32) -> Result<u32, u32> {
    let mut mode = mode;
    // SAFETY: `mode` is 4 bytes of storage for the enum, read and written by the driver as an
    // integer; the call affects only the calling thread.
    let status = unsafe {
        (d.cuThreadExchangeStreamCaptureMode)(
            (&mut mode as *mut u32).cast::<cuda_sys::types::CUstreamCaptureMode>(),
        )
    };
    if status == 0 {
        Ok(mode)
    } else {
        Err(status)
    }
}
