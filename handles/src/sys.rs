//! Small internal helpers around the raw driver: loading, checking a status, reading the
//! current context. Nothing here owns a resource.

use std::sync::OnceLock;

use cuda_sys::types::CUcontext;
use cuda_sys::{CudaError, CudaErrorCode, Driver};

use crate::HandleError;

/// The process's driver, or the load error.
#[inline]
pub(crate) fn driver() -> Result<&'static Driver, HandleError> {
    cuda_sys::driver().map_err(HandleError::Load)
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
    let mut ctx: CUcontext = std::ptr::null_mut();
    // SAFETY: `ctx` is a valid out-pointer; it is read only after success.
    let status = unsafe { (d.cuCtxGetCurrent)(&mut ctx) };
    if status == CudaErrorCode::NOT_INITIALIZED.0 {
        return Ok(0);
    }
    check("cuCtxGetCurrent", status)?;
    Ok(ctx as usize)
}

static INIT: OnceLock<Result<(), HandleError>> = OnceLock::new();

/// Initialises the driver once per process (`cuInit(0)`); later calls return the first outcome.
///
/// Driver calls: `cuInit`.
pub(crate) fn init() -> Result<&'static Driver, HandleError> {
    let d = driver()?;
    INIT.get_or_init(|| {
        crate::deferred::register_exit_hook();
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
