//! Buffers and memory resources on custody's handles: allocate, adopt, hand over, close.
//!
//! - [`Buffer`]: memory with its deallocation recipe (docs/decisions.md D1), an owned value.
//!   [`Buffer::close`] consumes it, frees now and returns the free's error; a drop frees
//!   without waiting on the GPU and reports a failure (D3, D9);
//!   [`Buffer::set_deallocation_stream`] hands the free over to another stream, atomically
//!   (D4); [`Buffer::adopt`] takes memory allocated elsewhere into custody, validating before
//!   it takes ownership (D5); [`Buffer::from_parts`] builds a buffer over a handle (a view,
//!   owner-kept memory, a resource of the caller's). Copies, fills, host transfers; typed views [`DeviceSlice`] and
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
//! - [`binding`]: what only a binding needs (the Python bindings: a close and a recipe swap that
//!   hand back what they would drop, the caching resource's allocation that never calls the
//!   driver), in one module whose name says so, as `handles::binding`.
//!
//! This crate makes no driver call itself: every one goes through the `handles` crate
//! (`handles::DeviceRange` for copies and fills, `handles` functions for pointer attributes, pool IPC
//! and capture queries).

//!
//! # Soundness
//!
//! Safe code cannot make this crate read, write or free memory it does not own. Every entry
//! that names memory takes what only an `unsafe` call can make from a raw address: a
//! [`handles::DevicePtrHandle`] (`handles::raw::borrowed`, `handles::raw::with_owner`, or one
//! custody allocated) or a [`handles::OwnedAllocation`] (`handles::raw::owned_allocation`).
//! Copies and fills go through `handles::DeviceRange`s, bounded by the handle's size. So this
//! program, which overwrote an immutable `Vec` through a safe `Buffer::from_handle`, no longer
//! compiles:
//!
//! ```compile_fail
//! # fn demo(stream: &handles::StreamHandle) -> Result<(), memory::MemoryError> {
//! let words = vec![0u8; 16]; // immutable
//! let view = memory::Buffer::from_handle(words.as_ptr() as u64, 16, memory::Ownership::Borrowed, None)?;
//! view.copy_from_host(&[0xff; 16], stream)?;
//! # Ok(())
//! # }
//! ```
//!
//! nor does its nearest spelling today, without `unsafe`:
//!
//! ```compile_fail,E0133
//! # fn demo(stream: &handles::StreamHandle) -> Result<(), memory::MemoryError> {
//! let words = vec![0u8; 16];
//! // error[E0133]: call to unsafe function `handles::raw::borrowed` requires an unsafe block
//! let view = memory::Buffer::from_parts(handles::raw::borrowed(words.as_ptr() as u64, 16), None);
//! view.copy_from_host(&[0xff; 16], stream)?;
//! # Ok(())
//! # }
//! ```
//!
//! and a memory resource's `deallocate` cannot be handed an arbitrary address either:
//!
//! ```compile_fail,E0133
//! # use memory::MemoryResource;
//! # fn demo(stream: &handles::StreamHandle) -> Result<(), memory::MemoryError> {
//! let mr = memory::DeviceMemoryResource::new(0)?;
//! // error[E0133]: the right to free is made only by an unsafe call
//! mr.deallocate(handles::raw::owned_allocation(0xdead_0000, 16), stream)?;
//! # Ok(())
//! # }
//! ```
//!
//! With `unsafe`, and its promise kept (the bytes outlive the view, and no Rust reference to
//! them is used while the copy runs), the view works:
//!
//! ```
//! # let stream = handles::StreamHandle::create(&handles::ContextHandle::primary(0)?, handles::StreamFlags::DEFAULT, 0)?;
//! let mut words = vec![0u8; 16];
//! // SAFETY: `words` outlives `view`; nothing reads or writes it until `view` is gone.
//! let view = unsafe { handles::raw::borrowed(words.as_mut_ptr() as u64, words.len()) };
//! let view = memory::Buffer::from_parts(view, None);
//! view.copy_from_host(&[0xff; 16], &stream)?;
//! view.close()?;
//! assert_eq!(words, [0xff; 16]);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

#![forbid(unsafe_code)]

// The modules' layers, lowest first; each imports only from layers below it (a tidy test fails
// on a cycle): `error`; `checks` (sizes, stream devices); `buffer` (`Buffer`, `ManagedBuffer` and
// the `MemoryResource` trait, which name each other); `copy` (fills, copies, host transfers);
// `slice` (typed views); `managed` (managed-memory placement); `resources`, `ipc` and `graph`
// (what makes and uses buffers); `binding` (what only a binding needs, over all of them).
pub mod binding;
mod buffer;
mod checks;
mod copy;
mod error;
mod graph;
mod ipc;
mod managed;
mod resources;
mod slice;

pub use buffer::{Accessibility, AdoptError, Buffer, ManagedBuffer, MemoryResource};
/// The element types of the typed views: plain bytes (`bytemuck`), derivable for your own
/// `#[repr(C)]` structs with `bytemuck`'s derive.
pub use bytemuck::{self, Pod, Zeroable};
pub use copy::FillValue;
pub use error::{GraphError, IpcError, MemoryError};
pub use graph::{CaptureMode, Graph, GraphBuilder, GraphExec, GraphNode};
pub use ipc::IpcBufferDescriptor;
pub use managed::{discard_batch, discard_prefetch_batch, prefetch_batch};
pub use resources::{
    CachingMemoryResource, CachingStats, DeviceMemoryResource, DeviceMemoryResourceOptions,
    GraphMemoryResource, LegacyPinnedMemoryResource, ManagedMemoryResource,
    ManagedPoolMemoryResource, PinnedMemoryResource, PinnedMemoryResourceOptions,
    PoolMemoryResource, SynchronousMemoryResource, Trimmed,
};
pub use slice::{DeviceSlice, DeviceSliceMut};

#[cfg(test)]
mod tests {
    use super::*;

    /// Buffers, resources and graphs may be shared with and sent to any thread.
    #[test]
    fn buffers_resources_and_graphs_are_send_and_sync() {
        fn check<T: Send + Sync>() {}
        check::<Buffer>();
        check::<ManagedBuffer>();
        check::<std::sync::Arc<dyn MemoryResource>>();
        check::<Graph>();
        check::<GraphExec>();
        check::<GraphBuilder>();
    }
}
