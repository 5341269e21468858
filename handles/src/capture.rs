//! Stream capture: [`capture_status`], [`begin_capture`] and [`end_capture`] (which counts the
//! captures custody began, for [`capture_may_be_active`]), and ending a capture to discard it
//! ([`discard_capture`], and [`abandon_capture`] for a drop, which reports); `retain_in_capture`,
//! which attaches memory to a capture, lives with the graph nodes (`graph_nodes.rs`).

use cuda_sys::types::{CUgraph, CUstreamCaptureMode, CUstreamCaptureStatus};

use crate::context::ContextHandle;
use crate::error::HandleError;
use crate::graph::GraphHandle;
use crate::release::CaptureAllocations;
use crate::report::{report, CleanupStep, Consequence, Subject};
use crate::stream::{capture_state, CaptureState, StreamHandle};

/// `CUDA_ERROR_STREAM_CAPTURE_INVALIDATED`.
const CAPTURE_INVALIDATED: u32 = 901;

/// Whether a stream is being captured into a graph.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CaptureStatus {
    /// Not capturing: work runs.
    None,
    /// Capturing: work is recorded into a graph.
    Active,
    /// Capturing, but the capture failed and must be ended.
    Invalidated,
}

pub use crate::stream::{capture_may_be_active, this_thread_may_be_capturing};

/// Whether `stream` is capturing.
///
/// # Errors
/// [`HandleError::NoCurrentContext`] for an unbound token with no context;
/// [`HandleError::Driver`] otherwise (the legacy stream while another stream of its context
/// captures: `CUDA_ERROR_STREAM_CAPTURE_IMPLICIT`).
///
/// Driver calls: `cuCtxGetCurrent`, `cuCtxSetCurrent` (if needed), `cuStreamIsCapturing`.
pub fn capture_status(stream: &StreamHandle) -> Result<CaptureStatus, HandleError> {
    let mut status: u32 = 0;
    stream.run("cuStreamIsCapturing", |d, s| {
        // SAFETY: `status` is 4 bytes of storage for the enum, read as an integer; the stream
        // is alive.
        unsafe {
            (d.cuStreamIsCapturing)(s, (&mut status as *mut u32).cast::<CUstreamCaptureStatus>())
        }
    })?;
    Ok(match status {
        0 => CaptureStatus::None,
        1 => CaptureStatus::Active,
        _ => CaptureStatus::Invalidated,
    })
}

/// Begins capturing `stream` into a graph (`mode`: `CU_STREAM_CAPTURE_MODE_*`); end it with
/// [`end_capture`].
///
/// # Errors
/// As [`capture_status`]; the driver refuses the legacy stream and a stream already capturing.
///
/// Driver calls: `cuCtxGetCurrent`, `cuCtxSetCurrent` (if needed), `cuStreamBeginCapture_v2`,
/// `cuStreamGetCaptureInfo_v2` (which capture it is, for its graph allocations).
pub fn begin_capture(stream: &StreamHandle, mode: CUstreamCaptureMode) -> Result<(), HandleError> {
    let mut state = CaptureState::Free;
    stream.run("cuStreamBeginCapture_v2", |d, s| {
        // SAFETY: the stream is alive and its context current.
        let status = unsafe { (d.cuStreamBeginCapture_v2)(s, mode) };
        if status == 0 {
            // Which capture this is, for its graph allocations (`release/graph.rs`).
            state = capture_state(d, s);
        }
        status
    })?;
    crate::stream::note_capture_begun(mode == CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED);
    if let Some(capture) = state.capture_id() {
        CaptureAllocations::begun(capture);
    }
    Ok(())
}

/// The id of the capture `stream` is in, when a capture begun through custody may be running
/// (its graph allocations are found by it); `None` otherwise, with no driver call.
fn capture_of(stream: &StreamHandle) -> Option<u64> {
    if !CaptureAllocations::any_running() {
        return None;
    }
    let mut state = CaptureState::Free;
    let _ = stream.run("cuStreamGetCaptureInfo_v2", |d, s| {
        state = capture_state(d, s);
        0
    });
    state.capture_id()
}

/// Ends the capture of `stream` and returns the captured graph, owned (destroyed in the
/// stream's context after its last handle goes).
///
/// # Errors
/// As [`capture_status`]; `CUDA_ERROR_STREAM_CAPTURE_INVALIDATED` when the capture failed (it
/// has ended all the same).
///
/// Driver calls: `cuCtxGetCurrent` (twice for an unbound token), `cuCtxSetCurrent` (if needed),
/// `cuStreamGetCaptureInfo_v2` (while a capture begun through custody runs: which capture ends,
/// for its graph allocations; again after a failure), `cuStreamEndCapture`; `cuGraphDestroy` when
/// the last graph handle drops.
pub fn end_capture(stream: &StreamHandle) -> Result<GraphHandle, HandleError> {
    let context = match stream.context() {
        Some(context) => context.clone(),
        None => ContextHandle::current()?.ok_or(HandleError::NoCurrentContext)?,
    };
    let capture = capture_of(stream);
    let mut graph: CUgraph = std::ptr::null_mut();
    let result = stream.run("cuStreamEndCapture", |d, s| {
        // SAFETY: `graph` is a valid out-pointer read after success; the stream is alive.
        let status = unsafe { (d.cuStreamEndCapture)(s, &mut graph) };
        if status == 0 || status == CAPTURE_INVALIDATED {
            // The capture is over either way.
            crate::stream::note_capture_ended();
        }
        status
    });
    if let Err(error) = result {
        // A capture that ended without a graph (invalidated, a fork left unjoined): its
        // allocations never get memory. One still running (ended on the wrong thread) goes on.
        if let Some(capture) = capture {
            if capture_of(stream) != Some(capture) {
                CaptureAllocations::ended_without_graph(capture);
            }
        }
        return Err(error);
    }
    let allocations = capture.and_then(CaptureAllocations::built);
    Ok(GraphHandle::from_captured(graph, &context, allocations))
}

/// Ends the capture of `stream` and discards what it recorded (the graph is destroyed once its
/// last handle goes; what the capture retained is then released). A capture that was
/// invalidated has ended all the same, so `CUDA_ERROR_STREAM_CAPTURE_INVALIDATED` is success
/// here: the capture is over, which is all a discard asks.
///
/// # Errors
/// As [`end_capture`], without the invalidated capture. Then the capture may still be running
/// (a thread-local or global capture ended on another thread): [`capture_status`] says.
///
/// Driver calls: as [`end_capture`].
pub fn discard_capture(stream: &StreamHandle) -> Result<(), HandleError> {
    match end_capture(stream) {
        Ok(graph) => {
            drop(graph);
            Ok(())
        }
        Err(HandleError::Driver(error)) if error.code.0 == CAPTURE_INVALIDATED => Ok(()),
        Err(error) => Err(error),
    }
}

/// [`discard_capture`] where no caller can receive an error (a graph builder dropped while
/// building): a failure is reported through the cleanup-error hook (docs/decisions.md D3), as
/// resource `stream capture`, operation `cuStreamEndCapture`, the stream's handle as the address,
/// with [`Consequence::StillCapturing`] when the stream is still being captured afterwards, else
/// [`Consequence::Leaked`] (the capture is over, but what it recorded was never handed back).
///
/// Driver calls: as [`discard_capture`]; after a failure `cuStreamIsCapturing`.
pub fn abandon_capture(stream: &StreamHandle) {
    if let Err(error) = discard_capture(stream) {
        let still = matches!(
            capture_status(stream),
            Ok(CaptureStatus::Active | CaptureStatus::Invalidated)
        );
        let consequence = if still {
            Consequence::StillCapturing
        } else {
            Consequence::Leaked
        };
        let context = stream.context().map_or(0, |c| c.raw() as u64);
        let raw = stream.raw_usize() as u64;
        report(
            Subject::new("stream capture", "cuStreamEndCapture", raw, raw, context),
            CleanupStep::Operation,
            consequence,
            error,
        );
    }
}
