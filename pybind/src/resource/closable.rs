//! [`ClosablePool`]: a pool resource as its Python object holds it, the Rust resource and the
//! object's closed state ([`Closed`]). cuda.core's pool resources have a `close()` after which they allocate,
//! export and import nothing; a Rust resource has no such state (it goes with its last `Arc`,
//! and an owned pool with its last buffer), so the object keeps it here, as `SharedBuffer` keeps
//! a buffer's.
//!
//! The object's `MemoryResource` base holds the same `Arc` as its Rust resource, so a closed
//! pool refuses allocations wherever they come from: the object's `allocate`, and a caching
//! resource over it taking a new block.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use handles::{DevicePtrHandle, OwnedAllocation, StreamHandle};
use memory::{Accessibility, AdoptError, Buffer, MemoryError, MemoryResource};

/// Whether a pool resource's Python object was closed, and its class's name, as
/// `MemoryError::ResourceClosed` says it.
pub(crate) struct Closed {
    class: &'static str,
    closed: AtomicBool,
}

impl Closed {
    /// From now on the pool allocates, exports and imports nothing; `deallocate` and the
    /// buffers already made keep working. Idempotent.
    pub(crate) fn close(&self) {
        self.closed.store(true, Ordering::Release);
    }

    pub(crate) fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    /// # Errors
    /// [`MemoryError::ResourceClosed`] once closed.
    #[inline]
    pub(crate) fn check_open(&self) -> Result<(), MemoryError> {
        if self.is_closed() {
            return Err(MemoryError::ResourceClosed {
                resource: self.class,
            });
        }
        Ok(())
    }
}

/// A pool resource and its Python object's closed state; see the module header.
pub(crate) struct ClosablePool<R> {
    resource: Arc<R>,
    closed: Closed,
}

impl<R> ClosablePool<R> {
    pub(crate) fn new(resource: Arc<R>, class: &'static str) -> Arc<ClosablePool<R>> {
        Arc::new(ClosablePool {
            resource,
            closed: Closed {
                class,
                closed: AtomicBool::new(false),
            },
        })
    }

    /// The Rust resource.
    pub(crate) fn resource(&self) -> &Arc<R> {
        &self.resource
    }

    /// The object's closed state.
    pub(crate) fn closed(&self) -> &Closed {
        &self.closed
    }
}

impl<R: MemoryResource> MemoryResource for ClosablePool<R> {
    /// The resource's allocation, refused once closed for a size it could allocate (zero bytes
    /// still give an empty buffer, and a size past `isize::MAX` is refused as the resource
    /// refuses it).
    #[inline]
    fn allocate_owned(
        self: Arc<Self>,
        size: usize,
        stream: &StreamHandle,
    ) -> Result<Buffer, MemoryError> {
        if size != 0 && size <= isize::MAX as usize {
            self.closed.check_open()?;
        }
        Arc::clone(&self.resource).allocate_owned(size, stream)
    }

    fn deallocate(
        &self,
        allocation: OwnedAllocation,
        stream: &StreamHandle,
    ) -> Result<(), MemoryError> {
        self.resource.deallocate(allocation, stream)
    }

    fn accessibility(&self) -> Accessibility {
        self.resource.accessibility()
    }

    fn name(&self) -> &str {
        self.resource.name()
    }

    fn adopt(
        self: Arc<Self>,
        allocation: OwnedAllocation,
        stream: &StreamHandle,
    ) -> Result<DevicePtrHandle, AdoptError> {
        Arc::clone(&self.resource).adopt(allocation, stream)
    }
}
