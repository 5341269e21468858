//! The built-in memory resources: stream-ordered pools ([`DeviceMemoryResource`],
//! [`PinnedMemoryResource`]), synchronous allocators ([`LegacyPinnedMemoryResource`],
//! [`ManagedMemoryResource`], [`SynchronousMemoryResource`]), graph memory
//! ([`GraphMemoryResource`]) and the opt-in cache over any of them
//! ([`CachingMemoryResource`]).
//!
//! Memory a resource allocates is freed by its handle's release rule (`cuMemFreeAsync` for
//! pools and graph memory; an event and the cleanup worker for the synchronous ones, so that a
//! drop never waits, docs/decisions.md D9). `deallocate` is for explicit calls and for memory
//! adopted with [`crate::Ownership::MemoryResource`].

/// The [`MemoryResource`](crate::MemoryResource) impl of a built-in resource, written once: each
/// states only what differs. `allocate` makes the handle of `size` bytes ordered on `stream`
/// (after `Buffer::allocated`'s size checks) and says how it takes part in IPC;
/// `deallocate` is the [`OwnedAllocation`](handles::OwnedAllocation) method that frees;
/// `accessibility` is where the memory can be used; `adopt`, for a resource whose adopted memory
/// takes a built-in release rule, makes that handle. The doc comments given go to the methods.
macro_rules! builtin_resource {
    (
        $ty:ty,
        $(#[$allocate_doc:meta])*
        allocate($mr:ident, $size:ident, $stream:ident) $allocate:block
        $(#[$deallocate_doc:meta])*
        deallocate: $free:ident,
        accessibility($this:ident) $access:block
        $(
            $(#[$adopt_doc:meta])*
            adopt($adopter:ident, $allocation:ident, $on:ident) $adopt:block
        )?
    ) => {
        impl crate::MemoryResource for $ty {
            $(#[$allocate_doc])*
            #[inline]
            fn allocate_owned(
                self: std::sync::Arc<Self>,
                $size: usize,
                $stream: &handles::StreamHandle,
            ) -> Result<crate::Buffer, crate::MemoryError> {
                crate::Buffer::allocated(self, $size, |$mr| $allocate)
            }

            $(#[$deallocate_doc])*
            fn deallocate(
                &self,
                allocation: handles::OwnedAllocation,
                stream: &handles::StreamHandle,
            ) -> Result<(), crate::MemoryError> {
                Ok(allocation.$free(stream)?)
            }

            fn accessibility(&$this) -> crate::Accessibility $access

            $(
                $(#[$adopt_doc])*
                fn adopt(
                    self: std::sync::Arc<Self>,
                    $allocation: handles::OwnedAllocation,
                    $on: &handles::StreamHandle,
                ) -> Result<handles::DevicePtrHandle, crate::AdoptError> {
                    let $adopter = self;
                    $adopt
                }
            )?
        }
    };
}

/// `allocate_managed`, the typed allocation of a resource of managed memory, written once.
macro_rules! allocate_managed {
    ($ty:ty) => {
        impl $ty {
            /// [`MemoryResource::allocate`](crate::MemoryResource::allocate), typed as a
            /// [`ManagedBuffer`](crate::ManagedBuffer).
            ///
            /// # Errors
            /// As [`MemoryResource::allocate`](crate::MemoryResource::allocate) for this
            /// resource.
            ///
            /// Driver calls: as [`MemoryResource::allocate`](crate::MemoryResource::allocate)
            /// for this resource.
            pub fn allocate_managed(
                self: &std::sync::Arc<Self>,
                size: usize,
                stream: &handles::StreamHandle,
            ) -> Result<crate::ManagedBuffer, crate::MemoryError> {
                crate::MemoryResource::allocate(self, size, stream).map(crate::ManagedBuffer::new)
            }
        }
    };
}

mod caching;
mod graph;
mod pool;
mod synchronous;

pub use caching::{CachingMemoryResource, CachingStats, Trimmed};
pub use graph::GraphMemoryResource;
pub use pool::{
    DeviceMemoryResource, DeviceMemoryResourceOptions, ManagedPoolMemoryResource,
    PinnedMemoryResource, PinnedMemoryResourceOptions, PoolMemoryResource,
};
pub use synchronous::{
    LegacyPinnedMemoryResource, ManagedMemoryResource, SynchronousMemoryResource,
};
