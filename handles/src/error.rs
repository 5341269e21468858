//! [`HandleError`]: the one error type of the handles crate.

use std::fmt;
use std::sync::Arc;

use cuda_sys::{CudaError, CudaErrorCode, LoadError};

/// The error a [`Deallocator`](crate::Deallocator) returns, kept whole: its `Display`, its
/// source chain and its concrete type (`downcast_ref`, through `Deref` to the error), so that a
/// binding can hand the caller the very exception its user code raised.
///
/// Clones share the error. Two are equal when they share it or read the same, which is what
/// lets [`HandleError`] derive its equality.
#[derive(Clone)]
pub struct DeallocatorSource(Arc<dyn std::error::Error + Send + Sync>);

impl std::ops::Deref for DeallocatorSource {
    type Target = dyn std::error::Error + Send + Sync;

    fn deref(&self) -> &Self::Target {
        &*self.0
    }
}

impl fmt::Debug for DeallocatorSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

impl fmt::Display for DeallocatorSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&*self.0, f)
    }
}

impl std::error::Error for DeallocatorSource {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.0.source()
    }
}

impl PartialEq for DeallocatorSource {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0) || self.0.to_string() == other.0.to_string()
    }
}

impl Eq for DeallocatorSource {}

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
    /// Something of one device given where another's is needed: a stream whose context is on
    /// another device than the memory it would order (here), or, in the crates above, an IPC
    /// descriptor of another device than its pool, device memory of another device than its
    /// graph, a launch stream of another device than the graph. Rejected before any driver
    /// call, so nothing was allocated, adopted or re-recorded. The one such error of custody.
    #[error("wrong device: device {found} given where device {expected} is needed")]
    WrongDevice {
        /// The device needed: the memory's (or the graph's).
        expected: i32,
        /// The device of what was given: the stream's context (or the descriptor, the memory).
        found: i32,
    },
    /// A stream (or a default-stream token bound to a context) whose context custody does not
    /// hold, one made by other code, was destroyed by that code: it can order no free or use.
    /// Found when a recipe or a declared use is bound (`cuCtxGetId` on the context no longer
    /// answers with the id it had when custody first saw it), so nothing was recorded and an
    /// old recipe stays (docs/decisions.md D4).
    #[error("the stream's context 0x{context:x} has been destroyed: {found}")]
    ContextDestroyed {
        /// The context, as an integer.
        context: u64,
        /// What the driver said instead of the context's id.
        found: String,
    },
    /// An IPC import whose exporter claims more bytes than the allocation the driver mapped for
    /// it holds (`cuPointerGetAttributes`' range): refused, the mapping made for the check freed
    /// again.
    #[error("invalid size: the import claims {claimed} bytes but the imported allocation holds {extent}")]
    ImportExceedsMapping {
        /// The exporter's claim, in bytes.
        claimed: usize,
        /// The mapped allocation's size, in bytes.
        extent: usize,
    },
    /// A launch of a graph that has run once and allocates memory it does not free itself:
    /// its first launch made that memory, whose free is outside the graph, and another launch
    /// would allocate it again with nothing to free it (docs/decisions.md D11). Refused before
    /// any driver call.
    #[error(
        "the graph has run once and allocates memory it does not free itself ({allocations} \
         graph allocation(s) not freed inside its capture): another launch would allocate that \
         memory again, and nothing would free it, so such a graph is launched once; free the \
         allocations inside the capture (close their buffers while building) to launch it as \
         often as you like"
    )]
    GraphLaunchedOnce {
        /// How many of the capture's allocations the graph does not free.
        allocations: usize,
    },
    /// The context `operation` needs could not be made current (`cuCtxGetCurrent` or
    /// `cuCtxSetCurrent` failed), so `operation` did not run. For a release, the resource was
    /// not released (its handle is gone: the memory has leaked).
    #[error("{operation} did not run: making its context 0x{context:x} current failed: {error}")]
    ContextNotActivated {
        /// The operation that did not run (`cuMemFreeAsync`, `deallocate`, ...).
        operation: &'static str,
        /// The context that could not be made current, as an integer.
        context: u64,
        /// The context call's failure.
        error: CudaError,
    },
    /// `operation` ran and succeeded (a release: the resource *was* released), but the calling
    /// thread's previous context could not be put back afterwards: `context` is still current.
    #[error(
        "{operation} succeeded, but the calling thread's previous context 0x{previous:x} was not \
         restored (context 0x{context:x} is still current): {error}"
    )]
    ContextNotRestored {
        /// The operation that succeeded.
        operation: &'static str,
        /// The context that was current before, as an integer (0: none).
        previous: u64,
        /// The context left current, as an integer.
        context: u64,
        /// `cuCtxSetCurrent`'s failure.
        error: CudaError,
    },
    /// A [`Deallocator`](crate::Deallocator) supplied by the caller failed (or panicked).
    #[error("deallocator failed: {source}")]
    Deallocator {
        /// The deallocator's own error, whole.
        source: DeallocatorSource,
    },
}

impl HandleError {
    /// The driver status behind this error, when a driver call failed (the context call's, for
    /// [`HandleError::ContextNotActivated`] and [`HandleError::ContextNotRestored`]).
    pub fn code(&self) -> Option<CudaErrorCode> {
        self.driver_error().map(|error| error.code)
    }

    /// The failed driver call behind this error, if one failed.
    pub fn driver_error(&self) -> Option<&CudaError> {
        match self {
            HandleError::Driver(error)
            | HandleError::ContextNotActivated { error, .. }
            | HandleError::ContextNotRestored { error, .. } => Some(error),
            _ => None,
        }
    }

    /// The driver's name for the failure (`CUDA_ERROR_INVALID_VALUE`), or a short name for the
    /// errors that are not driver statuses (`NoCurrentContext`).
    pub fn name(&self) -> &'static str {
        match self {
            HandleError::Driver(error)
            | HandleError::ContextNotActivated { error, .. }
            | HandleError::ContextNotRestored { error, .. } => error.code.name(),
            HandleError::Load(_) => "Load",
            HandleError::NoCurrentContext => "NoCurrentContext",
            HandleError::InvalidArgument { .. } => "InvalidArgument",
            HandleError::WrongDevice { .. } => "WrongDevice",
            HandleError::ContextDestroyed { .. } => "ContextDestroyed",
            HandleError::ImportExceedsMapping { .. } => "ImportExceedsMapping",
            HandleError::GraphLaunchedOnce { .. } => "GraphLaunchedOnce",
            HandleError::Deallocator { .. } => "Deallocator",
        }
    }

    /// A [`HandleError::Deallocator`] carrying `source` (any error, or a message:
    /// `HandleError::deallocator("pool exhausted")`).
    pub fn deallocator(source: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> Self {
        HandleError::Deallocator {
            source: DeallocatorSource(Arc::from(source.into())),
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
            HandleError::WrongDevice {
                expected: 0,
                found: 1,
            },
            HandleError::deallocator("out of memory"),
            HandleError::ImportExceedsMapping {
                claimed: 8192,
                extent: 4096,
            },
            HandleError::ContextNotActivated {
                operation: "cuMemFreeAsync",
                context: 0xa,
                error: CudaError {
                    call: "cuCtxSetCurrent",
                    code: CudaErrorCode::INVALID_CONTEXT,
                    description: "invalid device context".into(),
                },
            },
            HandleError::ContextNotRestored {
                operation: "cuMemFreeAsync",
                previous: 0,
                context: 0xa,
                error: CudaError {
                    call: "cuCtxSetCurrent",
                    code: CudaErrorCode::INVALID_VALUE,
                    description: "invalid argument".into(),
                },
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

    #[test]
    fn a_deallocator_error_keeps_its_source_whole() {
        #[derive(Debug)]
        struct Refused(u32);
        impl std::fmt::Display for Refused {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                write!(f, "refused {}", self.0)
            }
        }
        impl std::error::Error for Refused {}

        let error = HandleError::deallocator(Refused(7));
        assert_eq!(error.to_string(), "deallocator failed: refused 7");
        let HandleError::Deallocator { source } = &error else {
            panic!("{error:?}")
        };
        assert_eq!(source.downcast_ref::<Refused>().map(|r| r.0), Some(7));
        let chained = std::error::Error::source(&error).map(ToString::to_string);
        assert_eq!(chained.as_deref(), Some("refused 7"));
        assert_eq!(error.clone(), error, "a clone shares the source");
        assert_eq!(error, HandleError::deallocator("refused 7"), "same text");
        assert_ne!(error, HandleError::deallocator("refused 8"));
    }
}
