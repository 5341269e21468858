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
    /// The memory resource was closed ([`crate::CachingMemoryResource::close`]): it allocates
    /// nothing more. (The Python bindings' closed pool resource objects say it too: a Rust pool
    /// resource has no close, it goes with its last `Arc`.)
    #[error("the {resource} has been closed")]
    ResourceClosed {
        /// The resource's type name.
        resource: &'static str,
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
    /// An IPC export or import that cannot be done: what went wrong is the [`IpcError`].
    #[error("ipc: {0}")]
    Ipc(#[from] IpcError),
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
    /// A graph operation that the graph's or builder's state does not allow: what it is, is the
    /// [`GraphError`].
    #[error("graph: {0}")]
    Graph(#[from] GraphError),
}

/// Why an IPC export or import cannot be done ([`MemoryError::Ipc`]); found before any driver
/// call, except [`IpcError::ClaimExceedsMapping`] (after the import's mapping was read back).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum IpcError {
    /// A pool export from a pool not made with `ipc_enabled`.
    #[error("the memory pool was not made with ipc_enabled")]
    PoolNotIpcEnabled,
    /// A pool export from a pool that was itself imported from another process.
    #[error("the memory pool was imported from another process")]
    PoolImported,
    /// A buffer export of memory that does not come from an IPC-enabled pool.
    #[error("the buffer does not come from an ipc-enabled memory pool")]
    BufferNotExportable,
    /// A buffer export of a buffer that was itself imported.
    #[error("an imported buffer cannot be exported again")]
    BufferImported,
    /// An allocation from a pool imported from another process (it maps the exporter's
    /// allocations only).
    #[error("a pool imported from another process cannot allocate")]
    ImportedPoolAllocates,
    /// A buffer import into a memory resource that is not a pool imported from another process.
    #[error("the memory resource is not a pool imported from another process")]
    NotAnImportedPool,
    /// A serialised descriptor of another length than [`crate::IpcBufferDescriptor::LEN`].
    #[error("a descriptor is {expected} bytes, not {len}")]
    DescriptorLength {
        /// The length a descriptor has, in bytes.
        expected: usize,
        /// The length given, in bytes.
        len: usize,
    },
    /// Bytes that do not start with a custody descriptor's magic.
    #[error("not a custody ipc buffer descriptor")]
    NotADescriptor,
    /// A descriptor of a version this build does not read.
    #[error("descriptor version {0} is not supported")]
    DescriptorVersion(u32),
    /// A descriptor of a shareable handle type other than a POSIX file descriptor.
    #[error("descriptor handle type {0} is not supported")]
    DescriptorHandleType(u32),
    /// A descriptor's device below -1 (-1 is a pinned host pool's).
    #[error("invalid device {0}")]
    DescriptorDevice(i32),
    /// A descriptor whose reserved bytes are not zero.
    #[error("reserved descriptor bytes are not zero")]
    DescriptorReserved,
    /// A descriptor that claims more bytes than the allocation the driver mapped for it holds:
    /// the descriptor does not match the imported pool's allocation (the mapping made for the
    /// check is freed again). Read from [`HandleError::ImportExceedsMapping`].
    #[error("the import claims {claimed} bytes but the imported allocation holds {extent}")]
    ClaimExceedsMapping {
        /// The size the descriptor claims, in bytes.
        claimed: usize,
        /// The size of the mapped allocation, in bytes.
        extent: usize,
    },
}

/// Why a graph, an executable graph or a graph builder refused an operation
/// ([`MemoryError::Graph`]); found before any driver call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum GraphError {
    /// The graph was closed ([`crate::Graph::close`]).
    #[error("the graph is closed")]
    GraphClosed,
    /// The executable graph was closed ([`crate::GraphExec::close`]).
    #[error("the executable graph is closed")]
    ExecClosed,
    /// A builder operation that needs a capture running, and none does.
    #[error("the builder is not building")]
    NotBuilding,
    /// A capture begun on a builder that is building already.
    #[error("the builder is already building")]
    AlreadyBuilding,
    /// A builder on a stream that does not carry its context (an unbound default-stream
    /// token): a capture needs a created or wrapped stream.
    #[error("a graph builder needs a stream that carries its context (a created stream)")]
    StreamWithoutContext,
}

impl MemoryError {
    /// The driver status behind this error, when a driver call failed.
    pub fn code(&self) -> Option<CudaErrorCode> {
        match self {
            MemoryError::Handle(error) => error.code(),
            _ => None,
        }
    }

    /// A stream (descriptor, graph) of device `found` for memory (a graph) on device
    /// `expected`: the handles crate's [`HandleError::WrongDevice`], the one such error.
    #[cold]
    pub(crate) fn wrong_device(expected: i32, found: i32) -> MemoryError {
        MemoryError::Handle(HandleError::WrongDevice { expected, found })
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
            MemoryError::wrong_device(0, 1),
            MemoryError::NotCapturing,
            MemoryError::StreamCapturing,
            IpcError::NotADescriptor.into(),
            IpcError::ClaimExceedsMapping {
                claimed: 2,
                extent: 1,
            }
            .into(),
            MemoryError::OwnershipConflict {
                reason: "a stream needs a memory resource",
            },
            MemoryError::NoMemoryResource,
            GraphError::GraphClosed.into(),
            GraphError::StreamWithoutContext.into(),
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
            HandleError::from(MemoryError::NoMemoryResource),
            HandleError::deallocator("the buffer has no memory resource to allocate from")
        );
        assert_eq!(MemoryError::NoMemoryResource.code(), None);
    }
}
