//! The graph-allocation family: memory allocated with `cuMemAllocAsync` on a stream being
//! captured through custody, an allocation node of the captured graph, with no memory behind it
//! until a launch runs that node (docs/decisions.md D11; handles/DESIGN.md, "Graph
//! allocations"). What its free does depends on where its capture is, which
//! [`CaptureAllocations`] (one per capture, shared by its allocations, the graph it produced,
//! the graph's clones and executables) keeps:
//!
//! - issued inside the capture that allocated it (the same capture id, whichever of its streams
//!   the free is on): a free node of the graph (F16: `facts_capture::f16_graph_allocation_
//!   freed_in_its_capture_is_a_free_node`), ordered after the declared uses on streams of the
//!   same capture by captured event edges. A use on a stream outside that capture cannot be
//!   ordered inside the graph: the free then waits for the first launch, as below;
//! - issued while its stream is captured by another capture: like any other memory, handed to
//!   that capture's graph (the spine's hand-over), never a free node of a graph that did not
//!   allocate it;
//! - after its capture ended and before the graph's first launch through custody: the memory
//!   does not exist, so the free waits in [`CaptureAllocations`] for that launch and is then
//!   issued ordered after it;
//! - after a launch: an ordinary stream-ordered free;
//! - of a capture that produced no graph (discarded, invalidated, unjoined), or of a graph
//!   destroyed before any launch: the memory never existed, and nothing is freed or said.
//!
//! A graph whose capture allocated memory it does not free itself is launched once through
//! custody: a later launch would allocate that memory again, with nothing to free it
//! ([`CaptureAllocations::may_launch`], `HandleError::GraphLaunchedOnce`).

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};

use cuda_sys::types::CUstream;
use cuda_sys::Driver;

use super::stream_ordered::{free_async, free_async_raw};
use super::{Family, Free, Issued, Kept, PtrBox, Release, ReleaseKind};
use crate::context::{in_context, ContextHandle};
use crate::error::HandleError;
use crate::recipe::DeallocationRecipe;
use crate::report::{report, CleanupStep, Consequence, Subject};
use crate::stream::{capture_state, CaptureState, StreamHandle};

/// Where a capture that may have allocated graph memory is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// The capture runs: a free inside it is a free node.
    Capturing,
    /// The capture produced a graph, not launched through custody yet: the memory does not
    /// exist, frees wait for the first launch.
    Built,
    /// A launch through custody ran (or was queued): the memory exists from then on.
    Launched,
    /// No graph came of the capture, or it was destroyed unlaunched: there never was memory.
    Discarded,
}

struct State {
    phase: Phase,
    /// Frees waiting for the graph's first launch (their boxes, each its memory's last).
    parked: Vec<Arc<PtrBox>>,
    /// Allocations made by the capture.
    allocated: usize,
    /// Of those, the ones freed inside the capture (free nodes).
    freed_inside: usize,
}

/// The graph allocations of one capture begun through custody (see the module header): its
/// phase, the frees waiting for its graph's first launch, and how many allocations the graph
/// does not free itself. Shared by the capture's allocations (their family) and, through
/// [`LaunchSide`], by the graph the capture produced, its clones and executables.
pub(crate) struct CaptureAllocations {
    /// The capture's id (`cuStreamGetCaptureInfo_v2`), unique in the process.
    capture: u64,
    /// A leaf lock: held to read or change the state, never across a driver call or a free.
    state: Mutex<State>,
}

/// The captures begun through custody that have not ended, by id: where an allocation in a
/// capture finds its [`CaptureAllocations`], and where the end of the capture does.
fn running() -> &'static Mutex<HashMap<u64, Arc<CaptureAllocations>>> {
    static RUNNING: OnceLock<Mutex<HashMap<u64, Arc<CaptureAllocations>>>> = OnceLock::new();
    RUNNING.get_or_init(|| Mutex::new(HashMap::new()))
}

fn lock_running() -> MutexGuard<'static, HashMap<u64, Arc<CaptureAllocations>>> {
    running().lock().unwrap_or_else(PoisonError::into_inner)
}

impl CaptureAllocations {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A capture begun through custody, with id `capture`, is running.
    pub(crate) fn begun(capture: u64) {
        let allocations = Arc::new(CaptureAllocations {
            capture,
            state: Mutex::new(State {
                phase: Phase::Capturing,
                parked: Vec::new(),
                allocated: 0,
                freed_inside: 0,
            }),
        });
        lock_running().insert(capture, allocations);
    }

    /// Whether a capture begun through custody may still be running (no driver call): the end
    /// of a capture asks for its id only then.
    pub(crate) fn any_running() -> bool {
        !lock_running().is_empty()
    }

    /// The running capture `capture`'s allocations; `None` for a capture custody did not begin.
    pub(crate) fn of_running(capture: u64) -> Option<Arc<CaptureAllocations>> {
        lock_running().get(&capture).cloned()
    }

    /// Capture `capture` ended with a graph: frees wait for its first launch. Returns what the
    /// graph, its clones and executables hold, when the capture allocated anything.
    pub(crate) fn built(capture: u64) -> Option<Arc<LaunchSide>> {
        let allocations = lock_running().remove(&capture)?;
        let mut state = allocations.lock();
        if state.allocated == 0 {
            return None;
        }
        state.phase = Phase::Built;
        drop(state);
        Some(Arc::new(LaunchSide(allocations)))
    }

    /// Capture `capture` ended without a graph (discarded, invalidated, unjoined): its
    /// allocations never had memory.
    pub(crate) fn ended_without_graph(capture: u64) {
        if let Some(allocations) = lock_running().remove(&capture) {
            allocations.discard();
        }
    }

    /// No graph will launch: what waits is let go (each frees nothing), later frees free
    /// nothing.
    fn discard(&self) {
        let parked = {
            let mut state = self.lock();
            if state.phase != Phase::Launched {
                state.phase = Phase::Discarded;
            }
            std::mem::take(&mut state.parked)
        };
        drop(parked); // outside the lock: each release reads the phase
    }

    /// An allocation of this capture was made.
    pub(crate) fn allocated(&self) {
        self.lock().allocated += 1;
    }

    fn phase(&self) -> Phase {
        self.lock().phase
    }

    /// Refuses a launch that would allocate memory nothing frees: once the graph ran, a
    /// later launch allocates again every allocation the capture did not free itself.
    ///
    /// # Errors
    /// [`HandleError::GraphLaunchedOnce`].
    pub(crate) fn may_launch(&self) -> Result<(), HandleError> {
        let state = self.lock();
        let not_freed = state.allocated - state.freed_inside;
        if state.phase == Phase::Launched && not_freed > 0 {
            return Err(HandleError::GraphLaunchedOnce {
                allocations: not_freed,
            });
        }
        Ok(())
    }

    /// A launch on `stream` (in the graph's `context`) succeeded: the memory exists from then
    /// on. The frees that waited are issued, each ordered after the launch: the launch stream
    /// is declared as a use (docs/decisions.md D12; a default-stream token bound to the
    /// graph's context, where the launch resolved it). If that cannot be recorded, the launch
    /// stream is synchronised first; if that fails too, the memory is leaked and reported,
    /// never freed unordered.
    ///
    /// Driver calls: none when nothing waited; else per free those of its release (the use's
    /// `cuStreamGetCaptureInfo_v2`, `cuEventCreate`, `cuEventRecord`, `cuStreamWaitEvent`,
    /// `cuEventDestroy_v2`, then `cuMemFreeAsync`), `cuStreamSynchronize` if a use cannot be
    /// recorded.
    pub(crate) fn launched(&self, stream: &StreamHandle, context: &ContextHandle) -> WaitingFrees {
        let parked = {
            let mut state = self.lock();
            state.phase = Phase::Launched;
            std::mem::take(&mut state.parked)
        };
        let launch = match stream.default_kind() {
            Some(kind) if stream.context().is_none() && !parked.is_empty() => {
                StreamHandle::bound_default_stream(kind, context)
            }
            _ => stream.clone(),
        };
        WaitingFrees { parked, launch }
    }

    /// Keeps `waiting` (a box whose free must wait for the first launch) until that launch, or
    /// lets it go at once when the phase changed meanwhile.
    fn park(&self, waiting: Arc<PtrBox>) {
        let mut state = self.lock();
        if matches!(state.phase, Phase::Capturing | Phase::Built) {
            state.parked.push(waiting);
            return;
        }
        drop(state);
        drop(waiting); // launched or discarded meanwhile: released as the phase says now
    }
}

/// The frees that waited for a graph's first launch
/// ([`GraphExecHandle::launch_then_free`](crate::GraphExecHandle::launch_then_free)): issued
/// when this is dropped, each ordered after the launch (the launch stream declared as a use,
/// docs/decisions.md D12; the launch stream synchronised if that cannot be recorded; leaked and
/// reported if that fails too, never freed unordered). Drop it with no lock held: the frees
/// may report.
#[must_use = "dropping it issues the frees"]
pub struct WaitingFrees {
    parked: Vec<Arc<PtrBox>>,
    launch: StreamHandle,
}

impl Drop for WaitingFrees {
    fn drop(&mut self) {
        let (parked, launch) = (std::mem::take(&mut self.parked), &self.launch);
        for mut waiting in parked {
            if waiting.record_use(launch).is_err() {
                if let Err(unordered) = launch.synchronize() {
                    if let Some(only) = Arc::get_mut(&mut waiting) {
                        if let Release::Graph(family) = &mut only.release {
                            family.unordered = Some(Box::new(unordered));
                        }
                    }
                }
            }
            drop(waiting); // its memory's last reference: the free runs
        }
    }
}

/// What a graph the capture produced, its clones and executables hold of its
/// [`CaptureAllocations`]: when the last of them goes before any launch, the allocations never
/// had memory (what waits is let go, freeing nothing).
pub(crate) struct LaunchSide(Arc<CaptureAllocations>);

impl LaunchSide {
    pub(crate) fn allocations(&self) -> &CaptureAllocations {
        &self.0
    }
}

impl Drop for LaunchSide {
    fn drop(&mut self) {
        self.0.discard();
    }
}

/// A graph allocation ([`DevicePtrHandle::alloc_graph`](crate::DevicePtrHandle::alloc_graph))
/// of a capture begun through custody.
pub(crate) struct GraphAllocation {
    allocations: Arc<CaptureAllocations>,
    /// Set when the free could not be ordered after the launch it waited for: the memory is
    /// leaked and this reported, rather than freed unordered. Boxed: it is rare, and inline it
    /// would make every `PtrBox` (all families share its size) 48 bytes larger.
    unordered: Option<Box<HandleError>>,
}

impl GraphAllocation {
    pub(crate) fn new(allocations: Arc<CaptureAllocations>) -> GraphAllocation {
        GraphAllocation {
            allocations,
            unordered: None,
        }
    }

    /// The capture that allocated the memory.
    pub(crate) fn allocations(&self) -> &Arc<CaptureAllocations> {
        &self.allocations
    }

    /// The free could not be ordered after the launch it waited for.
    #[cold]
    fn leak(&self, error: HandleError, free: &Free<'_>) -> Issued {
        if free.explicit {
            return Issued::Done(Err(error));
        }
        report(
            Subject::new(
                self.resource(),
                "cuMemFreeAsync",
                free.ptr,
                free.stream.raw_usize() as u64,
                free.recipe.context_raw() as u64,
            ),
            CleanupStep::Ordering,
            Consequence::Leaked,
            error,
        );
        Issued::Done(Ok(()))
    }
}

impl Family for GraphAllocation {
    fn kind(&self) -> ReleaseKind {
        ReleaseKind::Graph
    }

    fn resource(&self) -> Cow<'static, str> {
        Cow::Borrowed("graph allocation")
    }

    fn operation(&self) -> &'static str {
        "cuMemFreeAsync"
    }

    /// Always: only the capture that allocated the memory may take its free as a free node
    /// (the driver accepts a captured free of another graph's allocation, which would become
    /// that graph's node: lost if it never launches, doubled if it launches twice).
    fn looks_first(&self, _stream: &StreamHandle, _explicit: bool) -> bool {
        true
    }

    fn frees_inside(&self, capture: u64) -> bool {
        capture == self.allocations.capture
    }

    fn issue(&mut self, free: &Free<'_>) -> Issued {
        if let Some(error) = self.unordered.take() {
            return self.leak(*error, free);
        }
        if free.inside.is_some() {
            // A free node of the graph that allocated the memory.
            let issued = free_async(self, free);
            if matches!(issued, Issued::Done(Ok(()))) {
                self.allocations.lock().freed_inside += 1;
            }
            return issued;
        }
        match self.allocations.phase() {
            Phase::Launched => free_async(self, free),
            // Never launched through custody and nothing can launch it: nothing to free.
            Phase::Discarded => Issued::Done(Ok(())),
            // The memory does not exist before the first launch (or the free's stream left the
            // capture, which has not ended): the free waits for that launch.
            Phase::Capturing | Phase::Built => Issued::WaitsForLaunch,
        }
    }

    fn undo(&self, d: &'static Driver, ptr: u64, stream: CUstream) {
        let _ = free_async_raw(d, ptr, stream);
    }
}

impl PtrBox {
    /// Gives this free's family to a new box that waits, with the same recipe and declared
    /// uses, for the graph's first launch ([`CaptureAllocations::launched`] issues it then).
    pub(super) fn wait_for_launch(&mut self, recipe: DeallocationRecipe) {
        let release = std::mem::replace(&mut self.release, Release::Kept(Kept { owner: None }));
        let Release::Graph(family) = &release else {
            self.release = release;
            return;
        };
        let allocations = Arc::clone(family.allocations());
        let uses = std::mem::take(self.uses.get_mut().unwrap_or_else(|e| e.into_inner()));
        let mut waiting = PtrBox::new(self.ptr, self.size, self.device, Some(recipe), release);
        *waiting.uses.get_mut().unwrap_or_else(|e| e.into_inner()) = uses;
        allocations.park(Arc::new(waiting));
    }
}

/// The capture `stream` is in, when it is one custody began: for an allocation on it.
/// `None` otherwise (not capturing, or a capture begun by other code, whose end custody does
/// not see: its allocations are ordinary stream-ordered memory).
///
/// # Errors
/// [`HandleError::ContextNotActivated`] / [`HandleError::ContextNotRestored`] around the query.
///
/// Driver calls: `cuCtxGetCurrent`, `cuCtxSetCurrent` (if needed), `cuStreamGetCaptureInfo_v2`
/// (only while a capture begun through custody runs, and for a stream that carries its
/// context).
pub(crate) fn allocations_of_capture(
    stream: &StreamHandle,
) -> Result<Option<Arc<CaptureAllocations>>, HandleError> {
    if !CaptureAllocations::any_running() {
        return Ok(None);
    }
    let Some(context) = stream.context() else {
        return Ok(None);
    };
    let raw = stream.raw();
    let state = in_context(context, "cuStreamGetCaptureInfo_v2", |d| {
        Ok(capture_state(d, raw))
    })?;
    Ok(match state {
        CaptureState::Capturing { id, .. } => CaptureAllocations::of_running(id),
        _ => None,
    })
}
