//! The IPC family ([`Ipc`]): the process's one mapping of an imported pointer (held by the
//! registry in `ipc.rs` and freed with `cuMemFreeAsync` under its lock), and one import's share
//! of it (given back to the registry, which frees the mapping with the last share). An explicit release of a share, the last reference to it, waits for the recipe's
//! context before the unmap and for the free's stream after it (docs/decisions.md D11, "The
//! wait before an import's unmap").

use std::borrow::Cow;
use std::sync::Arc;

use super::deallocator::deallocate;
use super::stream_ordered::{free_async_raw, PoolRef};
use super::{finish, Family, Free, Issued, Outcome, ReleaseKind};
use crate::allocation::Deallocator;
use crate::pool::MemoryPoolHandle;
use crate::scope::run_in;
use crate::stream::{beside_captures, capture_may_be_active, relaxed, StreamHandle};
use crate::sys::check;

/// An imported pointer of `pool`: the process's one mapping (`share: None`, the registry's,
/// made by `cuMemPoolImportPointer`), or one import's reference to it, given back by `share`
/// (the registry's deallocator).
pub(crate) struct Ipc {
    pool: PoolRef,
    share: Option<Arc<dyn Deallocator>>,
}

impl Ipc {
    /// The mapping (`share: None`) or a share of it, of `pool`.
    pub(crate) fn new(pool: &MemoryPoolHandle, share: Option<Arc<dyn Deallocator>>) -> Ipc {
        Ipc {
            pool: PoolRef::of(pool),
            share,
        }
    }
}

impl Family for Ipc {
    fn kind(&self) -> ReleaseKind {
        ReleaseKind::IpcImport
    }

    fn resource(&self) -> Cow<'static, str> {
        Cow::Borrowed("IPC-imported allocation")
    }

    fn operation(&self) -> &'static str {
        match self.share {
            None => "cuMemFreeAsync",
            Some(_) => "deallocate",
        }
    }

    fn looks_first(&self, _stream: &StreamHandle, _explicit: bool) -> bool {
        true
    }

    /// The mapping: `cuMemFreeAsync`, kept in the recipe's context (no measurement shows an
    /// imported pointer's free succeeding without one); the registry serialises imports and
    /// this free (it releases the mapping holding its lock).
    ///
    /// A share: given back, in the recipe's context. Explicitly (the share's last reference:
    /// the decision and the release are one step), first waits for every stream of that
    /// context, so that work queued on another stream than the deallocation stream and not
    /// declared ([`record_use`](crate::DevicePtrHandle::record_use)) has run before the mapping
    /// can go (an unordered use of an unmapped import is a device fault that ends the context,
    /// where a pool free only hands the bytes back); and afterwards waits for the free's
    /// stream, so that when the release returns this share's part of the unmap has run (the
    /// exporting process may free its allocation then). A drop does neither (D9).
    fn issue(&mut self, free: &Free<'_>) -> Issued {
        let Some(share) = &self.share else {
            let (d, ptr, raw_stream) = (free.d, free.ptr, free.stream.raw());
            let ran = run_in(d, free.recipe.context_raw(), || {
                beside_captures(d, || free_async_raw(d, ptr, raw_stream))
            });
            let ran = ran.map(super::checked("cuMemFreeAsync"));
            return Issued::Done(finish(
                ran,
                self,
                "cuMemFreeAsync",
                ptr,
                free.recipe,
                free.explicit,
            ));
        };
        Issued::Done(deallocate(self, share.as_ref(), free, |give_back| {
            if !free.explicit {
                return give_back();
            }
            // Relaxed throughout, whoever began a capture: an explicit close is not the hot
            // path, and in the thread's default mode the wait and the unmap's free are both
            // refused beside a global capture, breaking it (F27).
            relaxed(free.d, || {
                let waited = wait_for_context(free.d);
                let (result, freed) = give_back();
                let result = result.and(waited).and_then(|()| wait_for_free_stream(free));
                (result, freed)
            })
        }))
    }

    fn undo(&self, d: &'static cuda_sys::Driver, ptr: u64, stream: cuda_sys::types::CUstream) {
        let _ = free_async_raw(d, ptr, stream);
    }

    fn pool(&self) -> Option<&PoolRef> {
        Some(&self.pool)
    }
}

/// `cuCtxSynchronize` of the current (recipe) context, made with the calling thread's capture
/// mode relaxed (the caller's [`relaxed`]), so that a capture on another thread, custody's or
/// another library's, neither refuses it nor is broken by it (F27; as the cleanup worker's
/// frees, `facts_capture::basic_a_relaxed_thread_*`). Left out while a capture begun through
/// custody may run: it could be this thread's own, whose stream a context synchronisation would
/// wait on (not measured).
///
/// Driver calls: `cuCtxSynchronize`.
fn wait_for_context(d: &'static cuda_sys::Driver) -> Outcome {
    if capture_may_be_active() {
        return Ok(());
    }
    // SAFETY: takes no arguments; the recipe's context is current.
    check("cuCtxSynchronize", unsafe { (d.cuCtxSynchronize)() })
}

/// `cuStreamSynchronize` of the free's stream when it carries its context; of the legacy stream
/// of the recipe's context (current) for an unbound token, which waits for every blocking stream
/// of it (docs/driver-facts.md F14).
///
/// Driver calls: `cuStreamSynchronize`.
fn wait_for_free_stream(free: &Free<'_>) -> Outcome {
    let stream = match free.stream.context() {
        Some(_) => free.stream.raw(),
        None => StreamHandle::legacy().raw(),
    };
    // SAFETY: the recipe keeps the stream alive; its context is current.
    check("cuStreamSynchronize", unsafe {
        (free.d.cuStreamSynchronize)(stream)
    })
}
