//! [`SharedBuffer`]: a `memory::Buffer` as a Python object holds it: shared by every reference
//! to the object and by every thread, closed at most once, answering 0 for its address and size
//! once closed (cuda.core's `Buffer` keeps this state in its Python layer; the Rust `Buffer` is
//! an owned value, consumed by its close).
//!
//! The state is one `Mutex<Option<Arc<Buffer>>>`. An operation clones the `Arc` under the lock
//! and runs outside it, so a close on another thread meanwhile does not wait for it: the close
//! takes the buffer out, and the memory is freed when the operation's reference goes (reported,
//! not returned), as the handle's release rule says. Of concurrent closes exactly one takes the
//! buffer; the others are no-ops.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use handles::{DeallocationRecipe, DevicePtrHandle, StreamHandle};
use memory::{Buffer, FillValue, IpcBufferDescriptor, MemoryError};

/// A buffer shared by the references to one Python object; see the module header.
pub(crate) struct SharedBuffer {
    state: Mutex<Option<Arc<Buffer>>>,
    /// Imported from another process (kept after the close, as cuda.core reports it).
    mapped: bool,
}

impl SharedBuffer {
    pub(crate) fn new(buffer: Buffer) -> SharedBuffer {
        SharedBuffer {
            mapped: buffer.is_mapped(),
            state: Mutex::new(Some(Arc::new(buffer))),
        }
    }

    #[inline]
    fn lock(&self) -> MutexGuard<'_, Option<Arc<Buffer>>> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The open buffer, for one operation.
    ///
    /// # Errors
    /// [`MemoryError::Closed`].
    #[inline]
    pub(crate) fn get(&self) -> Result<Arc<Buffer>, MemoryError> {
        self.lock().clone().ok_or(MemoryError::Closed)
    }

    /// Closes the buffer: frees now when nothing else holds the memory and returns the
    /// outcome; a no-op when already closed.
    pub(crate) fn close(&self) -> Result<(), MemoryError> {
        let taken = self.lock().take();
        close_taken(taken)
    }

    /// `set_deallocation_stream(stream)` then `close()`, atomically with respect to other
    /// closes (docs/decisions.md D4). When the new recipe cannot be recorded the buffer stays
    /// open with its old one.
    ///
    /// # Errors
    /// [`MemoryError::Closed`]; the recording's error; the free's error.
    pub(crate) fn close_on(&self, stream: &StreamHandle) -> Result<(), MemoryError> {
        let mut guard = self.lock();
        let buffer = guard.as_ref().ok_or(MemoryError::Closed)?;
        buffer.set_deallocation_stream(stream)?;
        let taken = guard.take();
        drop(guard);
        close_taken(taken)
    }

    pub(crate) fn is_closed(&self) -> bool {
        self.lock().is_none()
    }

    /// The address; 0 once closed.
    pub(crate) fn ptr(&self) -> u64 {
        self.lock().as_ref().map_or(0, |b| b.ptr())
    }

    /// The size in bytes; 0 once closed.
    pub(crate) fn size(&self) -> usize {
        self.lock().as_ref().map_or(0, |b| b.size())
    }

    pub(crate) fn is_mapped(&self) -> bool {
        self.mapped
    }

    /// A new reference to the memory (DLPack, graph attachments).
    ///
    /// # Errors
    /// [`MemoryError::Closed`].
    pub(crate) fn handle(&self) -> Result<DevicePtrHandle, MemoryError> {
        Ok(self.get()?.handle().clone())
    }

    /// # Errors
    /// [`MemoryError::Closed`]; as `Buffer::set_deallocation_stream`.
    pub(crate) fn set_deallocation_stream(&self, stream: &StreamHandle) -> Result<(), MemoryError> {
        self.lock()
            .as_ref()
            .ok_or(MemoryError::Closed)?
            .set_deallocation_stream(stream)
    }

    /// # Errors
    /// [`MemoryError::Closed`]; as `Buffer::replace_deallocation_stream`.
    pub(crate) fn replace_deallocation_stream(
        &self,
        stream: &StreamHandle,
    ) -> Result<Option<DeallocationRecipe>, MemoryError> {
        self.lock()
            .as_ref()
            .ok_or(MemoryError::Closed)?
            .replace_deallocation_stream(stream)
    }

    /// # Errors
    /// [`MemoryError::Closed`]; as `Buffer::is_device_accessible`.
    pub(crate) fn is_device_accessible(&self) -> Result<bool, MemoryError> {
        self.get()?.is_device_accessible()
    }

    /// # Errors
    /// [`MemoryError::Closed`]; as `Buffer::is_host_accessible`.
    pub(crate) fn is_host_accessible(&self) -> Result<bool, MemoryError> {
        self.get()?.is_host_accessible()
    }

    /// # Errors
    /// [`MemoryError::Closed`]; as `Buffer::is_managed`.
    pub(crate) fn is_managed(&self) -> Result<bool, MemoryError> {
        self.get()?.is_managed()
    }

    /// # Errors
    /// [`MemoryError::Closed`]; as `Buffer::device_id`.
    pub(crate) fn device_id(&self) -> Result<Option<i32>, MemoryError> {
        self.get()?.device_id()
    }

    /// # Errors
    /// [`MemoryError::Closed`] (either buffer); as `Buffer::copy_to`.
    pub(crate) fn copy_to(
        &self,
        dst: &SharedBuffer,
        stream: &StreamHandle,
    ) -> Result<(), MemoryError> {
        let (src, dst) = (self.get()?, dst.get()?);
        src.copy_to(&dst, stream)
    }

    /// # Errors
    /// [`MemoryError::Closed`]; as `Buffer::fill`.
    pub(crate) fn fill(&self, value: FillValue, stream: &StreamHandle) -> Result<(), MemoryError> {
        self.get()?.fill(value, stream)
    }

    /// # Errors
    /// [`MemoryError::Closed`]; as `Buffer::ipc_descriptor`.
    pub(crate) fn ipc_descriptor(&self) -> Result<IpcBufferDescriptor, MemoryError> {
        self.get()?.ipc_descriptor()
    }
}

/// Closes a buffer taken out of the state: when an operation in flight still holds it, its
/// reference frees the memory when it goes.
fn close_taken(taken: Option<Arc<Buffer>>) -> Result<(), MemoryError> {
    match taken.map(Arc::try_unwrap) {
        None => Ok(()),
        Some(Ok(buffer)) => buffer.close(),
        Some(Err(shared)) => {
            drop(shared);
            Ok(())
        }
    }
}
