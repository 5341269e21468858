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
//!   and allocated from; [`StreamFlags`], [`EventFlags`], [`ContextFlags`], [`MemAttachFlags`],
//!   [`GraphInstantiateFlags`]: the driver's flag words their constructors take, typed.
//! - [`DevicePtrHandle`], [`DeallocationRecipe`], [`Deallocator`]: memory and how it is freed
//!   (D1, D4, D5, D9); [`Lender`]: where memory lent out of a lender's block goes back; [`DeviceRange`]: checked byte ranges, the input of every copy and fill;
//!   [`OwnedAllocation`]: the right to free memory outside custody.
//! - [`MemAdvice`], [`MemLocation`], [`prefetch_batch`]: where managed memory lives (advice,
//!   prefetch, discard and the range attributes that report them).
//! - [`raw`]: the `unsafe` doors through which raw addresses and driver handles enter.
//! - [`set_cleanup_error_hook`] and friends: where failures that no caller can receive go (D3).
//! - [`drain_deferred_cleanup`], [`UserObjectOwnership`], [`GraphHandle`], [`GraphExecHandle`]:
//!   cleanup deferred by CUDA graphs (D7).
//!
//! See `handles/DESIGN.md` for the model, the lock order and which code runs on which thread.

// Modules in alphabetical order; which uses which, lowest first, is handles/DESIGN.md's
// "Modules" table (a tidy test checks that the crate's module imports form no cycle).
mod allocation;
/// What only a binding needs (the recipe's remains, lent blocks' families).
pub mod binding;
mod capture;
mod context;
mod deferred;
mod device;
mod deviceptr;
mod error;
mod event;
mod flags;
mod graph;
mod graph_nodes;
mod ipc;
mod lender;
mod lifecycle;
mod managed;
mod pointer;
mod pool;
mod range;
/// The `unsafe` doors for raw addresses and raw driver handles.
pub mod raw;
mod recipe;
mod release;
mod report;
mod scope;
mod stream;
mod sync_free;
mod sys;
mod user_object;

pub use allocation::{AdoptError, Deallocator, DeallocatorPanic, OwnedAllocation};
pub use capture::{
    abandon_capture, begin_capture, capture_may_be_active, capture_status, discard_capture,
    end_capture, this_thread_may_be_capturing, CaptureStatus,
};
pub use context::{ContextHandle, ContextKind, ContextScope};
pub use deferred::{
    deferred_cleanup_pending, deferred_frees_waiting_for_a_capture, drain_deferred_cleanup,
};
pub use device::{
    check_device, device_attribute, device_can_access_peer, device_count, device_name,
    device_pci_bus_id, device_uuid, graph_mem_attribute, graph_mem_trim, set_graph_mem_attribute,
    stream_priority_range,
};
pub use deviceptr::DevicePtrHandle;
pub use error::{DeallocatorSource, HandleError};
pub use event::EventHandle;
pub use flags::{ContextFlags, EventFlags, GraphInstantiateFlags, MemAttachFlags, StreamFlags};
pub use graph::{GraphExecHandle, GraphHandle};
pub use graph_nodes::{retain_in_capture, GraphNode};
pub use ipc::{export_pointer, import_pointer};
pub use lender::Lender;
pub use lifecycle::exiting;
pub use managed::{discard_batch, discard_prefetch_batch, prefetch_batch, MemAdvice, MemLocation};
pub use pointer::{pointer_attributes, MemoryType, PointerAttributes};
pub use pool::{
    create_managed_pool, create_pool, export_pool, import_pool, managed_pools_supported,
    ManagedPoolLocation, MemAccess, MemoryPoolHandle, PoolAttribute, PoolAttributeValue,
    PoolLocation, PoolSpec,
};
pub use range::DeviceRange;
pub use recipe::{DeallocationRecipe, RecipeRemains, ThreadToken};
pub use release::{ReleaseKind, Returned, WaitingFrees};
pub use report::{
    cleanup_error_count, cleanup_warning_count, report_error, report_warning,
    reset_cleanup_error_hook, reset_cleanup_warning_hook, set_cleanup_error_hook,
    set_cleanup_warning_hook, CleanupError, CleanupStep, CleanupWarning, CleanupWarningKind,
    Consequence,
};
pub use stream::{DefaultStream, StreamHandle};
pub use user_object::UserObjectOwnership;

/// Re-exported so that callers name driver types and errors without a direct `cuda-sys`
/// dependency.
pub use cuda_sys::{types as sys_types, CudaError, CudaErrorCode, LoadError};
