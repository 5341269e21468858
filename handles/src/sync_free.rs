//! Synchronous frees deferred to the cleanup worker (docs/decisions.md D9): [`SyncFree`], the job a
//! drop of `cuMemAlloc`, pinned host or managed memory queues (the pointer, its recipe and the
//! event that orders it), and [`run_sync_free`], which waits for the event and frees.

use cuda_sys::types::c_void;
use cuda_sys::Driver;

use crate::error::HandleError;
use crate::event::destroy_raw;
use crate::recipe::DeallocationRecipe;
use crate::report::{report, CleanupStep, Consequence, Subject};
use crate::scope::run_in;
use crate::stream::beside_captures;
use crate::sys::{check, driver};

/// The synchronous frees that go through the cleanup worker (docs/decisions.md D9).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SyncKind {
    Device,
    Host,
}

impl SyncKind {
    pub(crate) fn operation(self) -> &'static str {
        match self {
            SyncKind::Device => "cuMemFree_v2",
            SyncKind::Host => "cuMemFreeHost",
        }
    }

    pub(crate) fn free(self, d: &Driver, ptr: u64) -> Result<(), HandleError> {
        match self {
            SyncKind::Device => {
                // SAFETY: the allocation is owned by the caller's released box and is freed
                // once; the recipe's context is current.
                let status = unsafe { (d.cuMemFree_v2)(ptr) };
                check("cuMemFree_v2", status)
            }
            SyncKind::Host => {
                // SAFETY: as above, for a `cuMemAllocHost` allocation.
                let status = unsafe { (d.cuMemFreeHost)(ptr as *mut c_void) };
                check("cuMemFreeHost", status)
            }
        }
    }
}

/// A synchronous free waiting for its event on the cleanup worker.
pub(crate) struct SyncFree {
    pub(crate) ptr: u64,
    pub(crate) kind: SyncKind,
    /// The resource as reports name it (`cuMemAlloc allocation`, ...).
    pub(crate) resource: &'static str,
    pub(crate) recipe: DeallocationRecipe,
    /// The stream the event was recorded on (the recipe's, or the legacy token for a
    /// per-thread-default-stream free away from its recording thread), for reports.
    pub(crate) stream: u64,
    /// The event recorded on the recipe stream at drop time; 0 when recording failed, in which
    /// case the worker synchronises the whole context instead.
    pub(crate) event: usize,
}

/// Runs a deferred synchronous free on the cleanup worker (or a draining thread), in the
/// recipe's context (`cuEventSynchronize` and `cuEventDestroy` without one are not measured):
/// wait for the event (or, without one, the whole context), free, destroy the event; report
/// failures.
pub(crate) fn run_sync_free(job: SyncFree) {
    let SyncFree {
        ptr,
        kind,
        resource,
        recipe,
        stream,
        event,
    } = job;
    let Ok(d) = driver() else { return };
    let operation = kind.operation();
    let mut destroyed = Ok(());
    let ran = run_in(d, recipe.context_raw(), || {
        beside_captures(d, || {
            let waited = if event != 0 {
                // SAFETY: the event was created and recorded at drop time and is owned by this job.
                let status = unsafe { (d.cuEventSynchronize)(event as cuda_sys::types::CUevent) };
                let waited = check("cuEventSynchronize", status);
                // The event is this job's own: its destruction failing leaks it, which is
                // reported below, after the restore, like the free's own failure (D3).
                destroyed = check("cuEventDestroy_v2", destroy_raw(event));
                waited
            } else {
                // SAFETY: no arguments; the recipe's context is current.
                let status = unsafe { (d.cuCtxSynchronize)() };
                check("cuCtxSynchronize", status)
            };
            // A failed wait means the free cannot be proven ordered: leak rather than free early.
            waited?;
            kind.free(d, ptr)
        })
    });
    ran.report(|| {
        Subject::new(
            resource,
            operation,
            ptr,
            stream,
            recipe.context_raw() as u64,
        )
    });
    if let Err(error) = destroyed {
        // The memory was freed (or its wait failed, reported above); the event leaked. Named by
        // the pointer whose free it ordered (the event is internal).
        report(
            Subject::new(
                "ordering event",
                "cuEventDestroy_v2",
                ptr,
                stream,
                recipe.context_raw() as u64,
            ),
            CleanupStep::Operation,
            Consequence::Leaked,
            error,
        );
    }
}
