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
