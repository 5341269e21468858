//! [`MemoryError`]: the one error type of the memory crate.

use handles::{CudaErrorCode, HandleError};

/// Why a buffer or memory-resource operation failed.
///
/// Every variant but [`MemoryError::Handle`] is found before any driver call is made, so the
/// buffer (or resource) it concerns is unchanged: nothing allocated, adopted, freed, or
/// re-recorded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum MemoryError {
    /// A handle operation failed: a driver error ([`HandleError::Driver`]), no current context
    /// for a default-stream token ([`HandleError::NoCurrentContext`]), a memory resource's
    /// `deallocate` failing ([`HandleError::Deallocator`]), ...
    #[error(transparent)]
    Handle(#[from] HandleError),
    /// A size in bytes that no allocation can have: zero, or more than `isize::MAX`.
    #[error("invalid size of {size} bytes: {reason}")]
    InvalidSize {
        /// The size asked for, in bytes.
        size: usize,
        /// Why it was rejected.
        reason: &'static str,
    },
    /// A copy between buffers (or a host slice) of different sizes.
    #[error("size mismatch: the source holds {src} bytes and the destination {dst}")]
    SizeMismatch {
        /// The source's size in bytes.
        src: usize,
        /// The destination's size in bytes.
        dst: usize,
    },
    /// A fill pattern of a width other than 1, 2 or 4 bytes, or a buffer whose size or address
    /// is not a multiple of the pattern's width.
    #[error("invalid fill with a {width}-byte pattern: {reason}")]
    InvalidFill {
        /// The pattern's width in bytes.
        width: usize,
        /// Why it was rejected.
        reason: &'static str,
    },
    /// The buffer was closed. (A Rust [`crate::Buffer`] is consumed by its close, so this comes
    /// from holders that share one, such as the Python bindings.)
    #[error("the buffer is closed")]
    Closed,
    /// A typed view whose element type does not fit the buffer: a size that is not a multiple of
    /// the element size, an address not aligned for it, or a zero-sized element type.
    #[error("cannot view the buffer as {element_size}-byte elements: {reason}")]
    Layout {
        /// `size_of` the element type, in bytes.
        element_size: usize,
        /// Why it was rejected.
        reason: &'static str,
    },
    /// An element range outside a typed view (`start..end` of a view of `len` elements).
    #[error("element range {start}..{end} is out of bounds for a view of {len} elements")]
    OutOfRange {
        /// The first element asked for (`usize::MAX` when it overflows).
        start: usize,
        /// One past the last element asked for (`usize::MAX` when it overflows).
        end: usize,
        /// The view's length in elements.
        len: usize,
    },
    /// The memory resource was closed ([`crate::PoolMemoryResource::close`]): it allocates,
    /// exports and imports nothing more.
    #[error("the {resource} has been closed")]
    ResourceClosed {
        /// The resource's type name.
        resource: &'static str,
    },
    /// A stream (or descriptor) of another device than the memory's.
    #[error("wrong device: the memory is on device {expected}, the stream or descriptor on device {found}")]
    WrongDevice {
        /// The device the memory (or memory resource) is on.
        expected: i32,
        /// The device of the stream (or IPC descriptor) given.
        found: i32,
    },
    /// A graph allocation on a stream that is not capturing.
    #[error(
        "the stream is not capturing: a graph memory resource allocates only during stream capture"
    )]
    NotCapturing,
    /// A pool allocation on a stream that is capturing.
    #[error(
        "the stream is capturing: allocate with a graph memory resource during stream capture"
    )]
    StreamCapturing,
    /// An IPC export or import that cannot be done (a pool without IPC, a malformed
    /// descriptor, a descriptor that does not match the imported pool).
    #[error("ipc: {reason}")]
    Ipc {
        /// What was wrong.
        reason: String,
    },
    /// A deallocation stream without a memory resource to free with (the bindings' adoption,
    /// `Buffer.from_handle(ptr, size, stream=...)`): a stream orders a free, and without a
    /// memory resource nothing is freed. (In Rust, [`crate::Buffer::from_parts`] takes no
    /// stream.)
    #[error("conflicting ownership: {reason}")]
    OwnershipConflict {
        /// What conflicted.
        reason: &'static str,
    },
    /// The operation needs the buffer's memory resource and the buffer has none (an adopted
    /// view).
    #[error("the buffer has no memory resource to allocate from")]
    NoMemoryResource,
    /// A managed-memory operation (advice, prefetch, discard) on memory that is neither from a
    /// managed memory resource nor managed by the driver's account (found with a pointer query
    /// at most, before the operation's own driver call).
    #[error(
        "{operation} needs a managed-memory allocation (cuMemAllocManaged or a managed memory \
         pool); this buffer's memory is not managed"
    )]
    NotManaged {
        /// The operation refused.
        operation: &'static str,
    },
    /// A graph operation that the graph's or builder's state does not allow: a closed graph or
    /// executable, a builder that is not building (or already is), a stream a builder cannot
    /// capture.
    #[error("graph: {reason}")]
    Graph {
        /// What was wrong.
        reason: &'static str,
    },
}

impl MemoryError {
    /// The driver status behind this error, when a driver call failed.
    pub fn code(&self) -> Option<CudaErrorCode> {
        match self {
            MemoryError::Handle(error) => error.code(),
            _ => None,
        }
    }

    pub(crate) fn ipc(reason: impl Into<String>) -> MemoryError {
        MemoryError::Ipc {
            reason: reason.into(),
        }
    }
}

/// The handles crate's view of a memory-resource failure (for its [`handles::Deallocator`]):
/// a handle error passes through, anything else becomes [`HandleError::Deallocator`].
impl From<MemoryError> for HandleError {
    fn from(error: MemoryError) -> HandleError {
        match error {
            MemoryError::Handle(error) => error,
            other => HandleError::deallocator(other),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_are_lower_case_without_a_trailing_period() {
        let errors = [
            MemoryError::InvalidSize {
                size: 0,
                reason: "zero bytes",
            },
            MemoryError::SizeMismatch { src: 1, dst: 2 },
            MemoryError::InvalidFill {
                width: 3,
                reason: "a pattern is 1, 2 or 4 bytes wide",
            },
            MemoryError::Closed,
            MemoryError::Layout {
                element_size: 4,
                reason: "the buffer's size is not a multiple of the element size",
            },
            MemoryError::OutOfRange {
                start: 1,
                end: 9,
                len: 4,
            },
            MemoryError::ResourceClosed {
                resource: "DeviceMemoryResource",
            },
            MemoryError::WrongDevice {
                expected: 0,
                found: 1,
            },
            MemoryError::NotCapturing,
            MemoryError::StreamCapturing,
            MemoryError::ipc("a malformed descriptor"),
            MemoryError::OwnershipConflict {
                reason: "a stream needs a memory resource",
            },
            MemoryError::NoMemoryResource,
            MemoryError::Graph {
                reason: "the graph is closed",
            },
            MemoryError::Handle(HandleError::NoCurrentContext),
        ];
        for error in errors {
            let text = error.to_string();
            assert!(!text.ends_with('.'), "{text}");
            assert!(!text.starts_with(char::is_uppercase), "{text}");
        }
    }

    #[test]
    fn converts_to_a_handle_error_for_the_deallocator() {
        assert_eq!(
            HandleError::from(MemoryError::Handle(HandleError::NoCurrentContext)),
            HandleError::NoCurrentContext
        );
        assert_eq!(
            HandleError::from(MemoryError::Closed),
            HandleError::deallocator("the buffer is closed")
        );
        assert_eq!(MemoryError::Closed.code(), None);
    }
}
