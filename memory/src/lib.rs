//! Buffers and memory resources on custody's handles: allocate, adopt, hand over, close.
//!
//! - [`Buffer`]: memory with its deallocation recipe (docs/decisions.md D1), an owned value.
//!   [`Buffer::close`] consumes it, frees now and returns the free's error; a drop frees
//!   without waiting on the GPU and reports a failure (D3, D9);
//!   [`Buffer::set_deallocation_stream`] hands the free over to another stream, atomically
//!   (D4); [`Buffer::from_handle`] adopts memory allocated elsewhere, validating before it
//!   takes ownership (D5); [`Buffer::from_parts`] builds a buffer for a resource of the
//!   caller's. Copies, fills, host transfers; typed views [`DeviceSlice`] and
//!   [`DeviceSliceMut`] over element ranges.
//! - [`MemoryResource`]: the object-safe trait every resource implements (Python subclasses
//!   too, through the bindings), and the built-in resources: [`DeviceMemoryResource`],
//!   [`PinnedMemoryResource`], [`LegacyPinnedMemoryResource`], [`ManagedMemoryResource`],
//!   [`SynchronousMemoryResource`], [`GraphMemoryResource`].
//! - Graphs that keep the buffers they use alive: [`Graph`] (explicit memset, memcpy,
//!   host-function and empty nodes), [`GraphExec`], [`GraphBuilder`] (stream capture); the
//!   retained buffers are freed by the cleanup worker with their recipes (D6, D7).
//! - IPC: [`IpcBufferDescriptor`], [`PoolMemoryResource::export_pool`],
//!   [`Buffer::from_ipc_descriptor`].
//!
//! This crate makes no driver call itself: every one goes through the `handles` crate
//! (`handles::DeviceRange` for copies and fills, `handles::ops` for pointer attributes, pool IPC
//! and capture queries).

// `deny`, not `forbid`, for now: the few places where this crate's safe API still hands a raw
// address to custody carry an `allow` and say so; once the API takes `handles::OwnedAllocation` /
// `DevicePtrHandle` values instead, this goes back to `forbid`.
#![deny(unsafe_code)]

mod buffer;
mod error;
mod graph;
mod ipc;
mod resource;
mod resources;
mod slice;

pub use buffer::{Buffer, FillValue, ManagedBuffer, Ownership};
/// The element types of the typed views: plain bytes (`bytemuck`), derivable for your own
/// `#[repr(C)]` structs with `bytemuck`'s derive.
pub use bytemuck::{self, Pod, Zeroable};
pub use error::MemoryError;
pub use graph::{CaptureMode, Graph, GraphBuilder, GraphExec, GraphNode};
pub use ipc::IpcBufferDescriptor;
pub use resource::MemoryResource;
pub use resources::{
    DeviceMemoryResource, DeviceMemoryResourceOptions, GraphMemoryResource,
    LegacyPinnedMemoryResource, ManagedMemoryResource, PinnedMemoryResource,
    PinnedMemoryResourceOptions, PoolMemoryResource, SynchronousMemoryResource,
};
pub use slice::{DeviceSlice, DeviceSliceMut};
