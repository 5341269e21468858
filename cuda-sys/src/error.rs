//! [`CudaError`]: a failed driver call, with the driver's error name and description.

use std::fmt;

use crate::status::CudaErrorCode;
use crate::CUresult;

/// A driver call that returned something other than `CUDA_SUCCESS`.
///
/// Carries the function called (the driver's own name, such as `cuMemFreeAsync`), the code, and
/// the driver's description of it (`cuGetErrorString`), read when the error was made.
#[derive(Clone, PartialEq, Eq, thiserror::Error)]
#[error("{call} failed: {}: {description}", code.name())]
pub struct CudaError {
    /// The driver function that failed.
    pub call: &'static str,
    /// The status it returned.
    pub code: CudaErrorCode,
    /// The driver's description of `code`.
    pub description: String,
}

impl CudaError {
    /// Builds the error for `call` returning `code`, asking the loaded driver (if any) for the
    /// description. Driver calls: `cuGetErrorString`.
    pub fn new(call: &'static str, code: CudaErrorCode) -> Self {
        let description = crate::loader::describe(code)
            .unwrap_or_else(|| "no description (driver not loaded)".to_owned());
        CudaError {
            call,
            code,
            description,
        }
    }

    /// Turns a raw status into `Ok(())` or the error for `call`.
    ///
    /// # Errors
    /// [`CudaError`] when `status` is not `CUDA_SUCCESS`.
    pub fn check(call: &'static str, status: CUresult) -> Result<(), CudaError> {
        if status == 0 {
            Ok(())
        } else {
            Err(CudaError::new(call, CudaErrorCode(status)))
        }
    }
}

impl fmt::Debug for CudaError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CudaError({}: {:?})", self.call, self.code)
    }
}
