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
//!
//! The clone is taken attached to the interpreter ([`SharedBuffer::get`] asks for the `Python`
//! token, which code running with the GIL released does not have), so while a garbage collection
//! runs the `Arc`'s count does not grow: [`SharedBuffer::held_alone`] is then a stable answer to
//! "does the Python object alone hold this memory", which its traversal needs. The traversal may
//! take no lock, so that answer is read without one: from a `Weak` of the buffer and a reader of
//! its memory's handle count, both taken when the state is made, and a flag cleared (under the
//! lock) when the buffer is taken out. Nothing here makes or drops a Python object under the
//! lock.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};

use handles::binding::{lent_block_kind, HandleCount};
use handles::{DeallocationRecipe, DefaultStream, ReleaseKind, StreamHandle};
use memory::{Buffer, MemoryError};
use pyo3::Python;

use crate::errors::Error;
use crate::report::release;
use crate::sync::Locked;

/// A buffer shared by the references to one Python object; see the module header.
pub(crate) struct SharedBuffer {
    state: Mutex<Option<Arc<Buffer>>>,
    /// The state as the collector's traversal reads it, without the lock.
    seen: Seen,
    /// Imported from another process (kept after the close, as cuda.core reports it).
    mapped: bool,
}

/// What [`SharedBuffer::held_alone`] reads instead of the state: set when the state is made,
/// except `open`, cleared under the state's lock before the buffer is taken out.
struct Seen {
    /// The buffer the state holds: its strong count is the state's reference and the
    /// operations'.
    buffer: Weak<Buffer>,
    /// How many handles share the memory (a graph, a DLPack capsule or an import adds one).
    handles: HandleCount,
    /// Whether the state still holds the buffer.
    open: AtomicBool,
}

impl SharedBuffer {
    pub(crate) fn new(buffer: Buffer) -> SharedBuffer {
        let buffer = Arc::new(buffer);
        SharedBuffer {
            mapped: buffer.is_mapped(),
            seen: Seen {
                buffer: Arc::downgrade(&buffer),
                handles: HandleCount::of(buffer.handle()),
                open: AtomicBool::new(true),
            },
            state: Mutex::new(Some(buffer)),
        }
    }

    #[inline]
    fn lock(&self) -> MutexGuard<'_, Option<Arc<Buffer>>> {
        self.state.locked()
    }

    /// Takes the buffer out of the locked `state`, the traversal told first.
    #[inline]
    fn take_out(&self, state: &mut Option<Arc<Buffer>>) -> Option<Arc<Buffer>> {
        self.seen.open.store(false, Ordering::Release);
        state.take()
    }

    /// The open buffer, for one operation (which may then release the GIL).
    ///
    /// # Errors
    /// [`Error::Closed`].
    #[inline]
    pub(crate) fn get(&self, _attached: Python<'_>) -> Result<Arc<Buffer>, Error> {
        self.lock().clone().ok_or(Error::Closed)
    }

    /// Takes the buffer out for a release that reports instead of returning (a deallocation,
    /// the garbage collector): dropping it frees the memory when nothing else holds it.
    pub(crate) fn take(&self) -> Option<Arc<Buffer>> {
        self.take_out(&mut self.lock())
    }

    /// Whether the buffer is open, no operation holds it and nothing else holds its memory
    /// (no graph, DLPack capsule or import shares the handle). Stable while a collection runs
    /// (see the module header): other holders only let go then. Takes no lock: the collector's
    /// traversal asks.
    pub(crate) fn held_alone(&self) -> bool {
        self.seen.open.load(Ordering::Acquire)
            && self.seen.buffer.strong_count() == 1
            && self.seen.handles.get() == 1
    }

    /// Closes the buffer: frees now when nothing else holds the memory and returns the
    /// outcome; a no-op when already closed. Called attached to the interpreter; the free runs
    /// with the GIL released unless it is one that never blocks and runs no user code
    /// ([`free_never_blocks`]): then detaching would cost more than the free (a release and
    /// re-acquisition of the GIL is about 350 instructions; pybind/DESIGN.md, "Hot path").
    pub(crate) fn close(&self, py: Python<'_>) -> Result<(), MemoryError> {
        let Some(taken) = self.take_out(&mut self.lock()) else {
            return Ok(());
        };
        // An operation in flight holds the buffer: its reference frees when it goes.
        let Some(buffer) = Arc::into_inner(taken) else {
            return Ok(());
        };
        if !free_never_blocks(&buffer) {
            return release(py, move || close_owned(buffer));
        }
        // The free does not drop the recipe: when it held the last reference to its stream or
        // context, their remains come back, and go with the GIL released (destroying a stream
        // or releasing a context is not documented as non-blocking).
        let (result, remains) = memory::binding::close_with_remains(buffer);
        if let Some(last) = remains {
            release(py, move || drop(last));
        }
        result
    }

    /// Whether the buffer was closed, for its object's deallocation (no lock: the object is
    /// being destroyed, nothing else can reach this).
    pub(crate) fn into_open(self) -> Option<Arc<Buffer>> {
        self.state
            .into_inner()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// `set_deallocation_stream(stream)` then `close()`, atomically with respect to other
    /// closes (docs/decisions.md D4). When the new recipe cannot be recorded the buffer stays
    /// open with its old one.
    ///
    /// # Errors
    /// [`Error::Closed`]; the recording's error; the free's error.
    pub(crate) fn close_on(&self, stream: &StreamHandle) -> Result<(), Error> {
        let mut guard = self.lock();
        let buffer = guard.as_ref().ok_or(Error::Closed)?;
        let old = memory::binding::replace_deallocation_stream(buffer, stream)?;
        let taken = self.take_out(&mut guard);
        drop(guard);
        // The old recipe may hold the last reference to a wrapped stream's Python object.
        drop(old);
        Ok(close_taken(taken)?)
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

    /// # Errors
    /// [`Error::Closed`]; as `Buffer::set_deallocation_stream`.
    pub(crate) fn set_deallocation_stream(&self, stream: &StreamHandle) -> Result<(), Error> {
        // The old recipe is dropped after the lock: it may hold the last reference to a
        // wrapped stream's Python object.
        drop(self.replace_deallocation_stream(stream)?);
        Ok(())
    }

    /// # Errors
    /// [`Error::Closed`]; as `Buffer::record_use`.
    pub(crate) fn record_use(&self, stream: &StreamHandle) -> Result<(), Error> {
        Ok(self
            .lock()
            .as_ref()
            .ok_or(Error::Closed)?
            .record_use(stream)?)
    }

    /// # Errors
    /// [`Error::Closed`]; as `memory::binding::replace_deallocation_stream`.
    pub(crate) fn replace_deallocation_stream(
        &self,
        stream: &StreamHandle,
    ) -> Result<Option<DeallocationRecipe>, Error> {
        let guard = self.lock();
        let buffer = guard.as_ref().ok_or(Error::Closed)?;
        Ok(memory::binding::replace_deallocation_stream(
            buffer, stream,
        )?)
    }
}

/// Closes a buffer taken out of the state: when an operation in flight still holds it, its
/// reference frees the memory when it goes.
fn close_taken(taken: Option<Arc<Buffer>>) -> Result<(), MemoryError> {
    match taken.and_then(Arc::into_inner) {
        None => Ok(()),
        Some(buffer) => close_owned(buffer),
    }
}

fn close_owned(buffer: Buffer) -> Result<(), MemoryError> {
    if buffer.is_mapped() {
        close_import(buffer)
    } else {
        buffer.close()
    }
}

/// Whether closing `buffer` (held by nothing else in this object) can only be
/// `cuMemFreeAsync` on its recipe's stream, with `cuCtxGetCurrent`/`cuCtxSetCurrent` in the
/// recipe's context for a default-stream token: stream-ordered pool or async memory that was
/// not imported (an import's close waits for its stream), or such memory lent by the caching
/// resource (given back to its bin, or freed so). Such a free never blocks and calls
/// no user code (no Python `deallocate`, no report: an explicit close returns its error), so
/// it may run attached (docs/decisions.md D10). The memory resource outlives it: the Python
/// buffer holds the resource object, which holds the Rust resource and its pool.
fn free_never_blocks(buffer: &Buffer) -> bool {
    let handle = buffer.handle();
    let stream_ordered = |kind| matches!(kind, ReleaseKind::Pool | ReleaseKind::Async);
    // Memory lent by the caching resource goes back to its bin (no driver call), or is freed by
    // its block's own rule: the same rule then decides.
    (stream_ordered(handle.kind()) || lent_block_kind(handle).is_some_and(stream_ordered))
        && !buffer.is_mapped()
}

/// Closes an imported buffer (`memory::Buffer::close`, which first waits for every stream of the
/// recipe's context when the buffer holds its memory alone, so that undeclared work on other
/// streams has run before the unmap) and waits for its deallocation stream, so that when `close()`
/// returns this import's part of the unmap has run (and the unmap itself, when it held the
/// process's mapping last). The driver requires an importing process's free to have *completed*
/// before the exporting process frees the allocation; with this, a consumer that closes its
/// imports and then tells the exporter (a queue, a pipe) keeps that rule without knowing which
/// stream the unmap went to. A stream that carries its context is synchronised; a default-stream
/// token, its recipe context's legacy stream (which waits for every blocking stream of the
/// context, docs/driver-facts.md F14).
///
/// Driver calls: those of the close (`cuCtxSynchronize` first, for an import held alone), then
/// `cuStreamSynchronize`.
fn close_import(buffer: Buffer) -> Result<(), MemoryError> {
    let wait = buffer.handle().recipe().map(|recipe| {
        let stream = recipe.stream();
        if stream.context().is_some() {
            stream.clone()
        } else {
            StreamHandle::bound_default_stream(DefaultStream::Legacy, recipe.context())
        }
    });
    buffer.close()?;
    if let Some(stream) = wait {
        stream.synchronize()?;
    }
    Ok(())
}
