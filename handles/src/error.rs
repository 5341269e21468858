//! [`HandleError`]: the one error type of the handles crate.

use cuda_sys::{CudaError, CudaErrorCode, LoadError};

/// Why a handle operation failed.
///
/// Every "no context" situation, whether found by custody (no context current when a
/// default-stream token is recorded) or reported by the driver while resolving a default-stream
/// token (`CUDA_ERROR_INVALID_CONTEXT`, or `CUDA_ERROR_NOT_INITIALIZED` from a driver that was
/// never initialised), is the single variant [`HandleError::NoCurrentContext`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum HandleError {
    /// A driver call failed; carries the function, the code and the driver's description.
    #[error(transparent)]
    Driver(#[from] CudaError),
    /// The driver library could not be loaded.
    #[error(transparent)]
    Load(#[from] LoadError),
    /// A default-stream token needed a current context and the calling thread had none.
    #[error("no CUDA context is current")]
    NoCurrentContext,
    /// An argument was rejected before any driver call was made, so nothing was allocated,
    /// adopted or changed.
    #[error("invalid {what}: {reason}")]
    InvalidArgument {
        /// The argument, by name (`size`, `ptr`, `stream`).
        what: &'static str,
        /// Why it was rejected.
        reason: String,
    },
    /// The resource was already released, or the cleanup machinery has shut down at exit.
    #[error("the handle is closed")]
    Closed,
    /// A [`Deallocator`](crate::Deallocator) supplied by the caller failed.
    #[error("deallocator failed: {message}")]
    Deallocator {
        /// The deallocator's own account of the failure.
        message: String,
    },
}

impl HandleError {
    /// The driver status behind this error, when a driver call failed.
    pub fn code(&self) -> Option<CudaErrorCode> {
        match self {
            HandleError::Driver(error) => Some(error.code),
            _ => None,
        }
    }

    /// The driver's name for the failure (`CUDA_ERROR_INVALID_VALUE`), or a short name for the
    /// errors that are not driver statuses (`NoCurrentContext`).
    pub fn name(&self) -> &'static str {
        match self {
            HandleError::Driver(error) => error.code.name(),
            HandleError::Load(_) => "Load",
            HandleError::NoCurrentContext => "NoCurrentContext",
            HandleError::InvalidArgument { .. } => "InvalidArgument",
            HandleError::Closed => "Closed",
            HandleError::Deallocator { .. } => "Deallocator",
        }
    }

    pub(crate) fn invalid(what: &'static str, reason: impl Into<String>) -> Self {
        HandleError::InvalidArgument {
            what,
            reason: reason.into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_are_lower_case_without_a_trailing_period() {
        let errors = [
            HandleError::NoCurrentContext,
            HandleError::invalid("size", "a zero-byte allocation is rejected by the driver"),
            HandleError::Closed,
            HandleError::Deallocator {
                message: "out of memory".into(),
            },
            HandleError::Driver(CudaError {
                call: "cuMemFreeAsync",
                code: CudaErrorCode::INVALID_VALUE,
                description: "invalid argument".into(),
            }),
        ];
        for error in errors {
            let text = error.to_string();
            assert!(!text.ends_with('.'), "{text}");
            assert!(!text.starts_with(char::is_uppercase), "{text}");
        }
        assert_eq!(
            HandleError::NoCurrentContext.to_string(),
            "no CUDA context is current"
        );
    }

    #[test]
    fn code_and_name_come_from_the_driver_status() {
        let error = HandleError::Driver(CudaError {
            call: "cuMemFree_v2",
            code: CudaErrorCode::INVALID_VALUE,
            description: String::new(),
        });
        assert_eq!(error.code(), Some(CudaErrorCode::INVALID_VALUE));
        assert_eq!(error.name(), "CUDA_ERROR_INVALID_VALUE");
        assert_eq!(HandleError::NoCurrentContext.code(), None);
        assert_eq!(HandleError::NoCurrentContext.name(), "NoCurrentContext");
    }
}
