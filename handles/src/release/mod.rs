//! The teardown of device memory: [`PtrBox`], the box every clone of a
//! [`DevicePtrHandle`](crate::DevicePtrHandle) shares; [`Release`], the release families (one
//! small type per file below, each answering the questions of [`Family`]); and the spine that
//! runs them, [`PtrBox::release_now`]: take the recipe, the capture check (docs/decisions.md
//! D11), the declared uses (D12), then the family's issue. Families work on the box's parts and
//! never name the handle (the handle's module sits above this one). handles/DESIGN.md,
//! "Release families".

mod capture;
mod deallocator;
mod graph;
mod ipc;
mod kept;
mod lent;
mod stream_ordered;
mod synchronous;
mod uses;

use std::borrow::Cow;
use std::sync::{Arc, Mutex};

use cuda_sys::Driver;

use crate::error::HandleError;
use crate::pool::MemoryPoolHandle;
use crate::recipe::DeallocationRecipe;
use crate::report::Subject;
use crate::scope::Ran;
use crate::stream::{beside_captures, capture_may_be_active, CaptureState, StreamHandle};
use crate::sys::{check, driver};

pub(crate) use deallocator::UserDeallocator;
pub use graph::WaitingFrees;
pub(crate) use graph::{allocations_of_capture, CaptureAllocations, GraphAllocation, LaunchSide};
pub(crate) use ipc::Ipc;
pub(crate) use kept::Kept;
pub use lent::Returned;
pub(crate) use lent::{GiveBack, Lent};
pub(crate) use stream_ordered::{PoolRef, StreamOrdered};
pub(crate) use synchronous::Synchronous;

/// Which family a pointer belongs to, fixing how it is released.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ReleaseKind {
    /// `cuMemAllocFromPoolAsync`; freed with `cuMemFreeAsync` on the recipe stream; holds its
    /// pool.
    Pool,
    /// `cuMemAllocAsync` (the device's current pool); freed with `cuMemFreeAsync`.
    Async,
    /// A graph allocation: `cuMemAllocAsync` on a stream being captured, an allocation node of
    /// the captured graph; freed with `cuMemFreeAsync` (a free node while its capture runs).
    Graph,
    /// `cuMemAlloc`; freed with `cuMemFree` after the recipe stream's work (never blocking a
    /// drop: see [`DevicePtrHandle`](crate::DevicePtrHandle)).
    Synchronous,
    /// `cuMemAllocHost` (pinned host memory); freed with `cuMemFreeHost`, like
    /// [`ReleaseKind::Synchronous`].
    PinnedHost,
    /// `cuMemAllocManaged`; freed with `cuMemFree`, like [`ReleaseKind::Synchronous`].
    Managed,
    /// `cuMemPoolImportPointer` (IPC import); freed with `cuMemFreeAsync`; holds its pool.
    IpcImport,
    /// Adopted with a [`Deallocator`](crate::Deallocator), which frees it.
    Deallocator,
    /// Host memory adopted with a [`Deallocator`](crate::Deallocator) (a host-only resource's):
    /// no device work can touch it, so no recipe orders or legalises its free. The deallocator
    /// receives the legacy default-stream token, unbound, and no context is made current.
    HostDeallocator,
    /// Memory lent by a [`Lender`](crate::Lender)
    /// ([`DevicePtrHandle::lend`](crate::DevicePtrHandle::lend)): at the last drop the lender's
    /// block goes back to it with this handle's last recipe, after the declared uses are ordered
    /// before it; no driver call of its own.
    Lent,
    /// Kept alive by an owner object, dropped with the last handle; nothing is freed.
    Owner,
    /// Not owned: nothing happens at release.
    NonOwning,
}

/// What a free comes to: returned by an explicit release, reported (and `Ok`) for a drop.
pub(crate) type Outcome = Result<(), HandleError>;

/// What a family's free is given: the driver, the memory, the recipe and the stream the free is
/// issued on ([`DeallocationRecipe::free_stream`], read once), and whether the release is
/// explicit (return errors, may block) or a drop (report, never block: docs/decisions.md D9).
pub(crate) struct Free<'a> {
    pub(crate) d: &'static Driver,
    pub(crate) ptr: u64,
    pub(crate) size: usize,
    pub(crate) recipe: &'a DeallocationRecipe,
    pub(crate) stream: &'a StreamHandle,
    /// A per-thread-default-stream free away from its recording thread (D6): `stream` is the
    /// legacy token.
    pub(crate) other_thread: bool,
    pub(crate) explicit: bool,
    /// The capture `stream` is being captured by, when the family frees inside it
    /// ([`Family::frees_inside`]: a graph allocation's own capture): the free is a free node.
    pub(crate) inside: Option<u64>,
}

impl Free<'_> {
    /// Runs `f`, the free's driver calls, where they are legal: as it is on a created or wrapped
    /// stream, which identifies its context (no context call, D2), in the recipe's context on a
    /// default-stream token; and beside a capture custody began, with the thread's capture
    /// interaction mode relaxed ([`beside_captures`], F27).
    #[inline]
    pub(crate) fn run<R>(&self, f: impl FnOnce() -> R) -> Ran<R> {
        let d = self.d;
        if self.stream.identifies_its_context() {
            Ran::unswitched(beside_captures(d, f))
        } else {
            crate::scope::run_in(d, self.recipe.context_raw(), || beside_captures(d, f))
        }
    }
}

/// What a family's issue came to.
pub(crate) enum Issued {
    /// Done: the outcome to return (for a drop, reported already and `Ok`).
    Done(Outcome),
    /// Not issued: the stream it would run on is in `state` (captured, blocked by a capture or
    /// its capture invalidated): the spine defers the free (D11).
    Captured(CaptureState),
    /// The driver refused the free (raw status): if its stream is being captured (F16) the
    /// spine defers it, otherwise this is the outcome.
    Refused(Ran<u32>),
    /// Not issued: the memory does not exist before its graph's first launch (a graph
    /// allocation whose capture ended): the free waits for that launch (`graph.rs`).
    WaitsForLaunch,
}

/// The questions every release family answers. The spine ([`PtrBox::release_now`]) asks them
/// through [`Release`], whose dispatch is one line per family.
pub(crate) trait Family {
    /// The kind reported by [`DevicePtrHandle::kind`](crate::DevicePtrHandle::kind).
    fn kind(&self) -> ReleaseKind;

    /// Whether the memory has a recipe (stream and context that order and legalise its free).
    /// Without one, [`Family::free_unrecorded`] frees it, and recipe changes and declared uses
    /// record nothing.
    fn needs_recipe(&self) -> bool {
        true
    }

    /// The resource as its user knows it, for reports (built on error paths only).
    fn resource(&self) -> Cow<'static, str>;

    /// The driver function (or `deallocate`, `give_back`) that frees, for reports.
    fn operation(&self) -> &'static str;

    /// Whether the free must ask whether `stream` (the one it is issued on) is being captured
    /// before it is issued, while a capture may run (the rule: handles/DESIGN.md, "Release
    /// families and the spine", step 2).
    fn looks_first(&self, stream: &StreamHandle, explicit: bool) -> bool;

    /// Whether a free whose stream is being captured by capture `capture` (its id) belongs in
    /// that capture instead of being handed to its graph: a graph allocation's own capture, of
    /// which the free is then a free node (`graph.rs`). No family but that one says yes.
    fn frees_inside(&self, _capture: u64) -> bool {
        false
    }

    /// Issues the free (the spine has checked the capture and ordered the declared uses).
    fn issue(&mut self, free: &Free<'_>) -> Issued;

    /// Frees memory that has no recipe ([`Family::needs_recipe`] false).
    fn free_unrecorded(&mut self, _ptr: u64, _size: usize, _explicit: bool) -> Outcome {
        Ok(())
    }

    /// Gives the memory back right after a failed allocation step, its recipe's context
    /// current (the allocating families; nothing for the others).
    fn undo(&self, _d: &'static Driver, _ptr: u64, _stream: cuda_sys::types::CUstream) {}

    /// The free cannot be ordered after a declared use (D12): what the family must give up so
    /// that nothing reuses the memory unordered (a lent block is leaked with it).
    fn unordered(&mut self) {}

    /// The pool the memory came from, if the family holds one.
    fn pool(&self) -> Option<&PoolRef> {
        None
    }
}

/// How a pointer is released, fixed at creation: one family each.
pub(crate) enum Release {
    StreamOrdered(StreamOrdered),
    Graph(GraphAllocation),
    Synchronous(Synchronous),
    Deallocator(UserDeallocator),
    Ipc(Ipc),
    Lent(Lent),
    Kept(Kept),
}

/// Runs `$body` with `$family` bound to the family inside `$release`.
macro_rules! each_family {
    ($release:expr, $family:ident => $body:expr) => {
        match $release {
            Release::StreamOrdered($family) => $body,
            Release::Graph($family) => $body,
            Release::Synchronous($family) => $body,
            Release::Deallocator($family) => $body,
            Release::Ipc($family) => $body,
            Release::Lent($family) => $body,
            Release::Kept($family) => $body,
        }
    };
}

impl Family for Release {
    #[inline]
    fn kind(&self) -> ReleaseKind {
        each_family!(self, f => f.kind())
    }

    #[inline]
    fn needs_recipe(&self) -> bool {
        each_family!(self, f => f.needs_recipe())
    }

    #[cold]
    fn resource(&self) -> Cow<'static, str> {
        each_family!(self, f => f.resource())
    }

    fn operation(&self) -> &'static str {
        each_family!(self, f => f.operation())
    }

    #[inline]
    fn looks_first(&self, stream: &StreamHandle, explicit: bool) -> bool {
        each_family!(self, f => f.looks_first(stream, explicit))
    }

    fn frees_inside(&self, capture: u64) -> bool {
        each_family!(self, f => f.frees_inside(capture))
    }

    #[inline]
    fn issue(&mut self, free: &Free<'_>) -> Issued {
        each_family!(self, f => f.issue(free))
    }

    fn free_unrecorded(&mut self, ptr: u64, size: usize, explicit: bool) -> Outcome {
        each_family!(self, f => f.free_unrecorded(ptr, size, explicit))
    }

    #[cold]
    fn undo(&self, d: &'static Driver, ptr: u64, stream: cuda_sys::types::CUstream) {
        each_family!(self, f => f.undo(d, ptr, stream))
    }

    #[cold]
    fn unordered(&mut self) {
        each_family!(self, f => f.unordered())
    }

    fn pool(&self) -> Option<&PoolRef> {
        each_family!(self, f => f.pool())
    }
}

impl Release {
    /// The pool the memory came from (pool allocations and IPC imports), as a handle.
    pub(crate) fn pool_handle(&self) -> Option<MemoryPoolHandle> {
        self.pool().map(PoolRef::handle)
    }

    /// For lent memory, the kind of the lender's block behind it.
    pub(crate) fn lent_block_kind(&self) -> Option<ReleaseKind> {
        match self {
            Release::Lent(lent) => lent.block_kind(),
            _ => None,
        }
    }
}

/// The memory behind a [`DevicePtrHandle`](crate::DevicePtrHandle), shared by its clones.
pub(crate) struct PtrBox {
    pub(crate) ptr: u64,
    pub(crate) size: usize,
    /// The device the memory lives on when known; recipes must be in a context of it.
    pub(crate) device: Option<i32>,
    /// The only mutable field: replaced wholesale, read once at teardown. `None` for the
    /// families without a recipe, and after release (unless the release put it back).
    pub(crate) recipe: Mutex<Option<DeallocationRecipe>>,
    pub(crate) release: Release,
    /// Streams other than the deallocation stream that use the memory (declared uses, D12),
    /// bound like recipes; at the free, the free's stream waits for the work enqueued on each
    /// so far. Apart from the recipe, so that replacing the recipe (D4) carries them over.
    /// Empty (no allocation) for most memory.
    pub(crate) uses: Mutex<Vec<DeallocationRecipe>>,
    released: bool,
    /// A free being retried after it waited for a capture (the box a deferred free gave its
    /// family to): its one-time warnings were reported already.
    retried: bool,
}

impl PtrBox {
    pub(crate) fn new(
        ptr: u64,
        size: usize,
        device: Option<i32>,
        recipe: Option<DeallocationRecipe>,
        release: Release,
    ) -> PtrBox {
        PtrBox {
            ptr,
            size,
            device,
            recipe: Mutex::new(recipe),
            release,
            uses: Mutex::new(Vec::new()),
            released: false,
            retried: false,
        }
    }

    /// Puts a used recipe back into the box (no atomic operation: the box is ours alone), so
    /// that it goes with the box, or to the caller that asked for its remains.
    #[inline]
    fn keep_recipe(&mut self, recipe: DeallocationRecipe) {
        *self.recipe.get_mut().unwrap_or_else(|e| e.into_inner()) = Some(recipe);
    }

    /// The recipe the release left in the box (see [`PtrBox::keep_recipe`]).
    pub(crate) fn take_recipe(&mut self) -> Option<DeallocationRecipe> {
        self.recipe
            .get_mut()
            .unwrap_or_else(|e| e.into_inner())
            .take()
    }

    /// The release of `this` when it is the last reference (else nothing), explicit, and the
    /// recipe the release left behind (`None` when other references remain, the memory has no
    /// recipe, or the free was deferred).
    pub(crate) fn release_last(this: Arc<PtrBox>) -> (Outcome, Option<DeallocationRecipe>) {
        // `into_inner`, not `try_unwrap`: when another holder drops at the same moment, exactly
        // one of the two releases is the last. `try_unwrap` fails while the other holder is
        // still there and then drops this reference, which could be the last one by then: the
        // close's release would run as a drop on this thread (not returning its error, and for
        // an IPC import unmapping without the close's wait). The box is released where it was
        // put (bound by reference, not moved again: one copy of the box fewer).
        match Arc::into_inner(this) {
            Some(ref mut inner) => {
                let result = inner.release_now(true);
                (result, inner.take_recipe())
            }
            None => (Ok(()), None),
        }
    }

    /// Replaces the recipe with one recorded now for `stream`, checked against the memory's
    /// device, in one swap under the recipe's lock; hands back the old one (`None` when the
    /// memory has no recipe: nothing recorded).
    pub(crate) fn replace_recipe(
        &self,
        stream: &StreamHandle,
    ) -> Result<Option<DeallocationRecipe>, HandleError> {
        if !self.release.needs_recipe() {
            return Ok(None);
        }
        let recipe = DeallocationRecipe::record_for(stream, self.device)?;
        Ok(self
            .recipe
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .replace(recipe))
    }

    /// Adds a declared use of `stream` (D12), bound as a recipe and checked against the memory's
    /// device; the same target once. Nothing for memory without a recipe.
    pub(crate) fn record_use(&self, stream: &StreamHandle) -> Outcome {
        if !self.release.needs_recipe() {
            return Ok(());
        }
        let recorded = DeallocationRecipe::record_for(stream, self.device)?;
        let mut uses = self.uses.lock().unwrap_or_else(|e| e.into_inner());
        if !uses.iter().any(|u| u.same_target(&recorded)) {
            uses.push(recorded);
        }
        Ok(())
    }

    /// The spine of every free. `explicit`: return errors (and block where the family does);
    /// otherwise report them and never block.
    ///
    /// 1. Take the recipe; memory without one is freed by its family as it is.
    /// 2. **Looks first** (D11): the condition below, [`Family::looks_first`] or declared
    ///    uses, and a capture that may run (or a free away from its recording thread, or
    ///    declared uses); the rule and why is stated once, in handles/DESIGN.md ("Release
    ///    families and the spine", step 2). A captured stream's graph takes the memory, a
    ///    blocked one parks the free (`capture.rs`).
    /// 3. The declared uses (D12): the free's stream waits for each (`uses.rs`).
    /// 4. The family's issue.
    pub(crate) fn release_now(&mut self, explicit: bool) -> Outcome {
        self.released = true;
        let Some(recipe) = self.take_recipe() else {
            return self.release.free_unrecorded(self.ptr, self.size, explicit);
        };
        let d = driver()?;
        // D6: a per-thread-default-stream free away from its recording thread is issued on the
        // legacy stream of the recipe's context (F14); every other free on the recorded stream.
        let (stream, other_thread) = recipe.free_target();
        let has_uses = !self
            .uses
            .get_mut()
            .unwrap_or_else(|e| e.into_inner())
            .is_empty();
        let mut inside = None;
        if (has_uses || self.release.looks_first(stream, explicit))
            && (other_thread || has_uses || capture_may_be_active())
        {
            match self.defer_if_captured(d, &recipe) {
                capture::Checked::Free => {}
                capture::Checked::Deferred => {
                    self.keep_recipe(recipe);
                    return Ok(());
                }
                capture::Checked::Inside(capture) => inside = Some(capture),
            }
        }
        if has_uses {
            match self.order_after_uses(d, &recipe, stream, inside) {
                Ok(uses::UsesOrdered::Yes) => {}
                Ok(uses::UsesOrdered::WaitForCapture) => {
                    self.defer_captured(CaptureState::Blocked, recipe);
                    return Ok(());
                }
                Ok(uses::UsesOrdered::OutsideTheCapture) => {
                    // A use on a stream outside the capture cannot be ordered inside the graph:
                    // the free waits for the graph's first launch instead.
                    self.wait_for_launch(recipe);
                    return Ok(());
                }
                Err(error) => {
                    self.release.unordered();
                    return self.unordered_use(error, &recipe, stream, explicit);
                }
            }
        }
        let free = Free {
            d,
            ptr: self.ptr,
            size: self.size,
            recipe: &recipe,
            stream,
            other_thread,
            explicit,
            inside,
        };
        match self.release.issue(&free) {
            // The hot path on its own arm: `Ok(())` is written as it is, where the general arm
            // moves the whole outcome (an 80-byte `HandleError`'s room).
            Issued::Done(Ok(())) => {
                self.keep_recipe(recipe);
                Ok(())
            }
            Issued::Done(result) => {
                self.keep_recipe(recipe);
                result
            }
            Issued::Captured(state) => {
                self.warn_waits_for_capture(&recipe, state);
                self.defer_captured(state, recipe);
                Ok(())
            }
            Issued::Refused(ran) => self.refused(d, ran, recipe, explicit),
            Issued::WaitsForLaunch => {
                self.wait_for_launch(recipe);
                Ok(())
            }
        }
    }

    /// F16: the driver refuses a captured free of memory the capture did not allocate; if that
    /// is why, the graph being captured takes the memory, otherwise the refusal is the outcome.
    #[cold]
    #[inline(never)]
    fn refused(
        &mut self,
        d: &'static Driver,
        ran: Ran<u32>,
        recipe: DeallocationRecipe,
        explicit: bool,
    ) -> Outcome {
        let result = if self.defer_if_captured(d, &recipe) == capture::Checked::Deferred {
            Ok(())
        } else {
            let operation = self.release.operation();
            let ran = ran.map(checked(operation));
            finish(ran, &self.release, operation, self.ptr, &recipe, explicit)
        };
        self.keep_recipe(recipe);
        result
    }
}

impl Drop for PtrBox {
    fn drop(&mut self) {
        if self.released || crate::lifecycle::exiting() {
            return;
        }
        let _ = self.release_now(false);
    }
}

/// `operation` on `ptr` with `recipe`, for reports.
#[cold]
pub(crate) fn subject(
    family: &(impl Family + ?Sized),
    operation: &'static str,
    ptr: u64,
    recipe: &DeallocationRecipe,
) -> Subject {
    Subject::new(
        family.resource(),
        operation,
        ptr,
        recipe.free_stream().raw_usize() as u64,
        recipe.context_raw() as u64,
    )
}

/// Hands a release's outcome to its caller: an explicit release returns it (a restore failure
/// after a failed free is reported, since one error is returned), a drop reports everything.
#[cold]
#[inline(never)]
pub(crate) fn finish(
    ran: Ran<Outcome>,
    family: &(impl Family + ?Sized),
    operation: &'static str,
    ptr: u64,
    recipe: &DeallocationRecipe,
    explicit: bool,
) -> Outcome {
    let subject = || subject(family, operation, ptr, recipe);
    if explicit {
        ran.into_result_for(operation, recipe.context_raw(), subject, drop)
    } else {
        ran.report(subject);
        Ok(())
    }
}

/// A driver status as a result for `call`, for the outcome of work run in a context.
#[inline]
pub(crate) fn checked(call: &'static str) -> impl FnOnce(u32) -> Outcome {
    move |status| check(call, status)
}
