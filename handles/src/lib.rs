//! Reference-counted CUDA handles whose release is correct wherever the last reference drops.
//!
//! This is the only crate that calls the driver. Every resource is an `Arc` box that embeds
//! what it depends on (a stream its context, a pool allocation its pool, a recipe its stream);
//! the release rule is fixed when the handle is made and a handle never re-points. The one
//! mutable field anywhere is a [`DevicePtrHandle`]'s [`DeallocationRecipe`].
//!
//! - [`ContextHandle`], [`ContextScope`]: contexts, and running code in one without disturbing
//!   the caller's binding (docs/decisions.md D2).
//! - [`StreamHandle`], [`EventHandle`], [`MemoryPoolHandle`]: the things a free is ordered on
//!   and allocated from.
//! - [`DevicePtrHandle`], [`DeallocationRecipe`], [`Deallocator`]: memory and how it is freed
//!   (D1, D4, D5, D9); [`DeviceRange`]: checked byte ranges, the input of every copy and fill;
//!   [`OwnedAllocation`]: the right to free memory outside custody.
//! - [`raw`]: the `unsafe` doors through which raw addresses and driver handles enter.
//! - [`set_cleanup_error_hook`] and friends: where failures that no caller can receive go (D3).
//! - [`drain_deferred_cleanup`], [`UserObjectOwnership`], [`GraphHandle`], [`GraphExecHandle`]:
//!   cleanup deferred by CUDA graphs (D7).
//!
//! See `handles/DESIGN.md` for the model, the lock order and which code runs on which thread.

mod context;
mod deferred;
/// Device count, attributes and names, and context synchronisation (what the Python bindings'
/// `Device` needs).
mod device;
mod deviceptr;
mod error;
mod event;
mod graph;
/// Pointer attributes, pool creation, pool IPC and stream capture.
pub mod ops;
mod pool;
mod range;
/// The `unsafe` doors for raw addresses and raw driver handles.
pub mod raw;
mod recipe;
mod report;
mod scope;
mod stream;
mod sys;
mod user_object;

pub use context::{ContextHandle, ContextKind};
pub use deferred::{
    deferred_cleanup_pending, deferred_frees_waiting_for_a_capture, drain_deferred_cleanup, exiting,
};
pub use device::{
    device_attribute, device_can_access_peer, device_count, device_name, device_uuid,
    graph_mem_attribute, graph_mem_trim, set_graph_mem_attribute, stream_priority_range,
};
pub use deviceptr::{AdoptError, Deallocator, DevicePtrHandle, OwnedAllocation, ReleaseKind};
pub use error::{DeallocatorSource, HandleError};
pub use event::{EventHandle, EVENT_DISABLE_TIMING};
pub use graph::{retain_in_capture, GraphExecHandle, GraphHandle, GraphNode};
pub use pool::MemoryPoolHandle;
pub use range::DeviceRange;
pub use recipe::{DeallocationRecipe, RecipeRemains, ThreadToken};
pub use report::{
    cleanup_error_count, cleanup_warning_count, reset_cleanup_error_hook,
    reset_cleanup_warning_hook, set_cleanup_error_hook, set_cleanup_warning_hook, CleanupError,
    CleanupStep, CleanupWarning, CleanupWarningKind, Consequence,
};
pub use scope::ContextScope;
pub use stream::{DefaultStream, StreamHandle};
pub use user_object::UserObjectOwnership;

/// Re-exported so that callers name driver types and errors without a direct `cuda-sys`
/// dependency.
pub use cuda_sys::{types as sys_types, CudaError, CudaErrorCode, LoadError};
