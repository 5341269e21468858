//! [`LaunchGate`]: the frees of a built graph's own allocations that wait for its first launch
//! (docs/decisions.md D11; `handles/DESIGN.md`, "Frees on a capturing stream").
//!
//! A graph allocation ([`super::GraphBuilder::allocate`]) not freed inside its capture has no
//! memory behind it until a launch runs its allocation node: a `cuMemFreeAsync` between
//! [`super::GraphBuilder::end_building`] and that launch is refused (`CUDA_ERROR_INVALID_VALUE`),
//! and the launch would then allocate memory nobody frees. So a buffer closed or dropped in that
//! window parks its handle here, and the first launch through custody issues the free, ordered
//! after that launch.

use std::mem;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use handles::{DevicePtrHandle, StreamHandle};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// The capture runs: a free is a free node of the graph.
    Capturing,
    /// The capture ended and no launch through custody has run: the memory does not exist yet.
    Built,
    /// A launch ran (or was queued): the memory exists; a free is an ordinary stream-ordered one.
    Launched,
}

struct GateState {
    phase: Phase,
    /// Handles of buffers closed or dropped while [`Phase::Built`].
    parked: Vec<DevicePtrHandle>,
}

/// The allocations of one capture: shared by its buffers' [`GraphSlot`]s, by the builder, by the
/// graph the capture produced, its clones and the executables made from them.
pub(crate) struct LaunchGate {
    state: Mutex<GateState>,
}

impl LaunchGate {
    pub(crate) fn new() -> Arc<LaunchGate> {
        Arc::new(LaunchGate {
            state: Mutex::new(GateState {
                phase: Phase::Capturing,
                parked: Vec::new(),
            }),
        })
    }

    fn lock(&self) -> MutexGuard<'_, GateState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The capture ended with a graph: frees wait for its first launch.
    pub(crate) fn built(&self) {
        let mut state = self.lock();
        if state.phase == Phase::Capturing {
            state.phase = Phase::Built;
        }
    }

    /// A launch on `stream` succeeded: the memory exists from that launch on. The parked frees
    /// are issued, each ordered after the launch (the launch stream is declared as a use,
    /// docs/decisions.md D12; if that fails, the launch stream is synchronised first).
    ///
    /// Driver calls: none when nothing is parked; else per parked handle those of
    /// [`DevicePtrHandle::record_use`] and of its free (`cuMemFreeAsync`).
    pub(crate) fn launched(&self, stream: &StreamHandle) {
        let parked = {
            let mut state = self.lock();
            state.phase = Phase::Launched;
            mem::take(&mut state.parked)
        };
        for handle in parked {
            if handle.record_use(stream).is_err() {
                // Unordered otherwise; a failure here is the launch stream's and is reported by
                // the free that follows if it matters.
                let _ = stream.synchronize();
            }
            // The last reference frees with its recipe; a failure is reported by the drop.
            drop(handle);
        }
    }

    /// Takes `handle` from a buffer being closed or dropped: parked while the graph is built and
    /// not launched, else given back to be released at once.
    fn park(&self, handle: DevicePtrHandle) -> Option<DevicePtrHandle> {
        let mut state = self.lock();
        if state.phase == Phase::Built {
            state.parked.push(handle);
            None
        } else {
            Some(handle)
        }
    }
}

impl Drop for LaunchGate {
    fn drop(&mut self) {
        // Never launched through custody, and nothing can launch it any more: the memory of the
        // parked handles never existed, so there is nothing to free (a free would be refused).
        // Their recipes' references leak with them.
        let state = self.state.get_mut().unwrap_or_else(PoisonError::into_inner);
        for handle in state.parked.drain(..) {
            mem::forget(handle);
        }
    }
}

/// A graph allocation's link to its capture's [`LaunchGate`], held by its [`crate::Buffer`]
/// ahead of the buffer's own handle: a second reference to the memory, which the buffer's close
/// or drop gives to the gate before releasing its own (so that while the graph waits for its
/// first launch, the buffer's release is not the last one and frees nothing).
pub(crate) struct GraphSlot {
    gate: Arc<LaunchGate>,
    handle: Option<DevicePtrHandle>,
}

impl GraphSlot {
    pub(crate) fn new(gate: Arc<LaunchGate>, handle: DevicePtrHandle) -> GraphSlot {
        GraphSlot {
            gate,
            handle: Some(handle),
        }
    }
}

impl Drop for GraphSlot {
    fn drop(&mut self) {
        if let Some(handle) = self.handle.take() {
            // Given back: dropped here, before the buffer's own reference, which then frees.
            drop(self.gate.park(handle));
        }
    }
}
