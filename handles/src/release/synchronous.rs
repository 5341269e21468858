//! The synchronous family: `cuMemAlloc`, pinned host (`cuMemAllocHost`) and managed
//! (`cuMemAllocManaged`) memory, whose frees are synchronous in the driver. A drop records an
//! event on the recipe's stream and hands the free to the cleanup worker (never blocking the
//! dropping thread, docs/decisions.md D9; `sync_free.rs` runs the job); an explicit release
//! synchronises the stream and frees before returning.

use std::borrow::Cow;

use cuda_sys::types::{CUevent, CUstream};
use cuda_sys::Driver;

use super::{finish, subject, Family, Free, Issued, Outcome, ReleaseKind};
use crate::deferred::{self, Deferred};
use crate::error::HandleError;
use crate::event::{create_raw, destroy_raw};
use crate::flags::EventFlags;
use crate::recipe::DeallocationRecipe;
use crate::report::{report, CleanupStep, Consequence, Subject};
use crate::scope::{report_restore, run_in, Ran};
use crate::stream::{capture_state, CaptureState, StreamHandle};
use crate::sync_free::{SyncFree, SyncKind};
use crate::sys::{check, error};

/// `cuMemAlloc` ([`ReleaseKind::Synchronous`]), pinned host ([`ReleaseKind::PinnedHost`]) or
/// managed ([`ReleaseKind::Managed`]) memory.
pub(crate) struct Synchronous {
    kind: ReleaseKind,
}

impl Synchronous {
    /// `cuMemAlloc` memory.
    pub(crate) const DEVICE: Synchronous = Synchronous {
        kind: ReleaseKind::Synchronous,
    };
    /// Pinned host memory (`cuMemAllocHost`).
    pub(crate) const PINNED_HOST: Synchronous = Synchronous {
        kind: ReleaseKind::PinnedHost,
    };
    /// Managed memory (`cuMemAllocManaged`).
    pub(crate) const MANAGED: Synchronous = Synchronous {
        kind: ReleaseKind::Managed,
    };

    /// The family of `kind`; `None` for a kind that is not synchronous.
    pub(crate) fn of(kind: ReleaseKind) -> Option<Synchronous> {
        matches!(
            kind,
            ReleaseKind::Synchronous | ReleaseKind::PinnedHost | ReleaseKind::Managed
        )
        .then_some(Synchronous { kind })
    }

    fn sync_kind(&self) -> SyncKind {
        match self.kind {
            ReleaseKind::PinnedHost => SyncKind::Host,
            _ => SyncKind::Device,
        }
    }

    fn name(&self) -> &'static str {
        match self.kind {
            ReleaseKind::PinnedHost => "pinned host allocation",
            ReleaseKind::Managed => "managed allocation",
            _ => "cuMemAlloc allocation",
        }
    }
}

impl Family for Synchronous {
    fn kind(&self) -> ReleaseKind {
        self.kind
    }

    fn resource(&self) -> Cow<'static, str> {
        Cow::Borrowed(self.name())
    }

    fn operation(&self) -> &'static str {
        self.sync_kind().operation()
    }

    /// An explicit free looks first; a drop asks where its ordering event would be recorded.
    fn looks_first(&self, _stream: &StreamHandle, explicit: bool) -> bool {
        explicit
    }

    fn issue(&mut self, free: &Free<'_>) -> Issued {
        if free.explicit {
            Issued::Done(self.free_now(free))
        } else {
            self.free_later(free)
        }
    }

    fn undo(&self, d: &'static Driver, ptr: u64, _stream: CUstream) {
        let _ = self.sync_kind().free(d, ptr);
    }
}

impl Synchronous {
    /// An explicit release: waits for the free's stream on the calling thread, then frees.
    fn free_now(&self, free: &Free<'_>) -> Outcome {
        let (d, ptr, kind) = (free.d, free.ptr, self.sync_kind());
        let raw_stream = free.stream.raw();
        let run = || {
            if free.other_thread {
                // D6: work enqueued on the legacy stream waits for the recording thread's
                // per-thread stream (F14); synchronising the legacy stream alone is not
                // measured to, so an event recorded there is waited for.
                wait_for_new_event(d, raw_stream)?;
            } else {
                // SAFETY: the recipe keeps the stream alive; a created or wrapped stream
                // needs no context (F6), for a token the recipe's context is current.
                let status = unsafe { (d.cuStreamSynchronize)(raw_stream) };
                check("cuStreamSynchronize", status)?;
            }
            kind.free(d, ptr)
        };
        // D2: `cuStreamSynchronize` of a created stream and the synchronous frees need no
        // context (F5, F6).
        finish(
            free.run(run),
            self,
            kind.operation(),
            ptr,
            free.recipe,
            true,
        )
    }

    /// A drop (D9): order with an event on the caller, free on the cleanup worker. The event is
    /// made in the recipe's context (events belong to one). D11: an event recorded in a capture
    /// could never be waited for (F17): ask first, where the event would be recorded.
    fn free_later(&self, free: &Free<'_>) -> Issued {
        if crate::lifecycle::exiting() {
            return Issued::Done(Ok(())); // at exit: leaked, never freed unsafely
        }
        let (d, ptr, recipe) = (free.d, free.ptr, free.recipe);
        let raw_stream = free.stream.raw();
        let mut event = 0usize;
        let mut captured = CaptureState::Free;
        let ran = run_in(d, recipe.context_raw(), || {
            captured = capture_state(d, raw_stream);
            match captured {
                CaptureState::Free => {}
                // Not knowing, no event is recorded (it might be captured): the worker waits for
                // the whole context instead, and the failure is reported (D3).
                CaptureState::Unknown(status) => {
                    captured = CaptureState::Free;
                    return Err(error("cuStreamGetCaptureInfo_v2", status));
                }
                _ => return Ok(()),
            }
            let raw = create_raw(EventFlags::DISABLE_TIMING)?;
            // SAFETY: the event was just created in the current (recipe) context; the recipe
            // keeps the stream alive.
            let status = unsafe { (d.cuEventRecord)(raw as CUevent, raw_stream) };
            if let Err(error) = check("cuEventRecord", status) {
                destroy_raw(raw);
                return Err(error);
            }
            event = raw;
            Ok(())
        });
        if captured != CaptureState::Free {
            if let Ran::Done { restore, .. } = ran {
                if restore != 0 {
                    report_restore(
                        subject(self, "cuStreamGetCaptureInfo_v2", ptr, recipe),
                        Consequence::ContextNotRestored,
                        restore,
                    );
                }
            }
            return Issued::Captured(captured);
        }
        let clean = matches!(
            ran,
            Ran::Done {
                value: Ok(()),
                restore: 0,
                ..
            }
        );
        let report_recipe = !clean || recipe.ptds_thread().is_some();
        deferred::push(Deferred::SyncFree(SyncFree {
            ptr,
            kind: self.sync_kind(),
            resource: self.name(),
            stream: raw_stream as u64,
            recipe: recipe.clone(),
            event,
        }));
        // Reported after the push: an event failure only means the worker synchronises the
        // whole context instead, but no driver error is treated as success (D3).
        if report_recipe {
            self.report_ordering(ran, ptr, recipe);
        }
        Issued::Done(Ok(()))
    }

    /// Reports what went wrong ordering a deferred synchronous free: the worker will
    /// synchronise the whole context instead of waiting for an event.
    #[cold]
    #[inline(never)]
    fn report_ordering(&self, ran: Ran<Outcome>, ptr: u64, recipe: &DeallocationRecipe) {
        let subject = || subject(self, "cuEventRecord", ptr, recipe);
        match ran {
            Ran::NotActivated(failure) => report(
                subject(),
                CleanupStep::ActivateContext,
                Consequence::OrderedByContextSynchronize,
                HandleError::Driver(failure.error()),
            ),
            Ran::Done { value, restore, .. } => {
                if let Err(error) = value {
                    report(
                        subject(),
                        CleanupStep::Ordering,
                        Consequence::OrderedByContextSynchronize,
                        error,
                    );
                }
                if restore != 0 {
                    report_restore(subject(), Consequence::ContextNotRestored, restore);
                }
            }
        }
    }
}

/// Records a new event on `raw_stream` (a token resolved in the current context, or a stream) and
/// waits for it on the calling thread, then destroys it.
///
/// Driver calls: `cuEventCreate`, `cuEventRecord`, `cuEventSynchronize`, `cuEventDestroy_v2`.
fn wait_for_new_event(d: &Driver, raw_stream: CUstream) -> Outcome {
    let raw = create_raw(EventFlags::DISABLE_TIMING)?;
    let event = raw as CUevent;
    // SAFETY: the event was just created in the current context; the caller keeps the stream
    // alive.
    let status = unsafe { (d.cuEventRecord)(event, raw_stream) };
    let waited = check("cuEventRecord", status).and_then(|()| {
        // SAFETY: the event is ours and was recorded.
        let status = unsafe { (d.cuEventSynchronize)(event) };
        check("cuEventSynchronize", status)
    });
    if let Err(error) = check("cuEventDestroy_v2", destroy_raw(raw)) {
        // The event is internal; its leak does not change the free's outcome (D3: reported).
        report(
            Subject::new(
                "ordering event",
                "cuEventDestroy_v2",
                raw as u64,
                raw_stream as u64,
                0,
            ),
            CleanupStep::Operation,
            Consequence::Leaked,
            error,
        );
    }
    waited
}
