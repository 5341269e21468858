//! What the conformance cases share: fresh threads, a primary-context guard, test pools, and a
//! [`Probe`] that host functions and user-object destructors leave marks in.
//!
//! Nothing here asserts a duration. Where a case must wait for something a driver thread does,
//! it waits at most [`LIVENESS_BOUND`], which only turns a hang into a failure.

use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::ThreadId;
use std::time::{Duration, Instant};

use cuda_sys::types::{CUcontext, CUdevice, CUmemPool_attribute, CUmemoryPool, CUstream};
use cuda_sys::CudaErrorCode;

use crate::driver::{
    check, ctx_set_current, device_get, launch_host_func, mem_pool_create, mem_pool_get_attribute,
    mem_pool_set_attribute, primary_ctx_release, primary_ctx_retain, Ret,
};

/// How long a case waits for a driver thread before it fails instead of hanging. Not a timing
/// expectation: every wait on it is for an event that the case has already made inevitable.
pub const LIVENESS_BOUND: Duration = Duration::from_secs(60);

/// Bytes in each test allocation: 1 MiB, large enough that pool accounting cannot round it away.
pub const N: usize = 1 << 20;

/// A raw driver value carried to another thread.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shared<T: Copy>(pub T);

// SAFETY: the values carried are driver handles (contexts, streams, pools, events), opaque
// process-wide identifiers that the driver accepts from any thread.
unsafe impl<T: Copy> Send for Shared<T> {}
// SAFETY: as above; `Shared` gives out only copies.
unsafe impl<T: Copy> Sync for Shared<T> {}

impl<T: Copy> Shared<T> {
    /// The carried value. (A method, so that closures capture the whole `Shared`, which is
    /// `Send`, rather than its field, which may not be.)
    pub fn get(self) -> T {
        self.0
    }
}

/// Runs `f` on a new thread, which starts with an empty context stack, and returns its result;
/// a panic on that thread is re-raised here.
pub fn on_fresh_thread<R, F>(name: &str, f: F) -> R
where
    R: Send + 'static,
    F: FnOnce() -> R + Send + 'static,
{
    let handle = std::thread::Builder::new()
        .name(name.to_owned())
        .spawn(f)
        .expect("spawning a test thread");
    match handle.join() {
        Ok(value) => value,
        Err(panic) => std::panic::resume_unwind(panic),
    }
}

/// Device 0, which every case uses.
#[track_caller]
pub fn device0() -> CUdevice {
    device_get(0).check()
}

/// One retain of device 0's primary context, released on drop. Retaining does not make the
/// context current; [`Primary::make_current`] does.
pub struct Primary {
    device: CUdevice,
    ctx: CUcontext,
}

impl Primary {
    /// `cuDevicePrimaryCtxRetain` on device 0.
    #[track_caller]
    pub fn retain() -> Primary {
        let device = device0();
        let ctx = primary_ctx_retain(device).check();
        assert!(!ctx.is_null(), "cuDevicePrimaryCtxRetain returned NULL");
        Primary { device, ctx }
    }

    /// The primary context.
    pub fn ctx(&self) -> CUcontext {
        self.ctx
    }

    /// `cuCtxSetCurrent(primary)` on the calling thread.
    #[track_caller]
    pub fn make_current(&self) {
        ctx_set_current(self.ctx).check();
    }
}

impl Drop for Primary {
    fn drop(&mut self) {
        let ret = primary_ctx_release(self.device);
        if !std::thread::panicking() {
            check(ret);
        }
    }
}

/// Retains device 0's primary context and makes it current on the calling thread.
#[track_caller]
pub fn primary_current() -> Primary {
    let primary = Primary::retain();
    primary.make_current();
    primary
}

/// A new pool on device 0 that keeps what it reserves across synchronization (release
/// threshold `u64::MAX`), so that reserved memory changes only on `cuMemPoolTrimTo`.
#[track_caller]
pub fn new_pool() -> CUmemoryPool {
    let pool = mem_pool_create(device0()).check();
    assert!(!pool.is_null(), "cuMemPoolCreate returned NULL");
    mem_pool_set_attribute(
        pool,
        CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
        u64::MAX,
    )
    .check();
    pool
}

/// `CU_MEMPOOL_ATTR_USED_MEM_CURRENT`.
#[track_caller]
pub fn used(pool: CUmemoryPool) -> u64 {
    mem_pool_get_attribute(pool, CUmemPool_attribute::CU_MEMPOOL_ATTR_USED_MEM_CURRENT).check()
}

/// `CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT`.
#[track_caller]
pub fn reserved(pool: CUmemoryPool) -> u64 {
    mem_pool_get_attribute(
        pool,
        CUmemPool_attribute::CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT,
    )
    .check()
}

/// One thing a host function, a destructor or the case itself recorded.
#[derive(Clone, Debug)]
pub struct Mark {
    /// What happened.
    pub label: &'static str,
    /// The thread it happened on.
    pub thread: ThreadId,
    /// A driver status recorded with it, if any.
    pub code: Option<CudaErrorCode>,
}

/// An ordered log of [`Mark`]s plus a gate that a host function can block a stream on.
///
/// Cases assert the order of marks and the threads they came from, never durations.
#[derive(Default)]
pub struct Probe {
    marks: Mutex<Vec<Mark>>,
    marked: Condvar,
    gate_open: Mutex<bool>,
    gate_changed: Condvar,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Probe {
    /// A new, empty probe with its gate closed.
    pub fn new() -> Arc<Probe> {
        Arc::new(Probe::default())
    }

    /// Records `label` from the calling thread.
    pub fn mark(&self, label: &'static str) {
        self.push(label, None);
    }

    /// Records `label` and a driver status from the calling thread.
    pub fn mark_code(&self, label: &'static str, code: CudaErrorCode) {
        self.push(label, Some(code));
    }

    fn push(&self, label: &'static str, code: Option<CudaErrorCode>) {
        lock(&self.marks).push(Mark {
            label,
            thread: std::thread::current().id(),
            code,
        });
        self.marked.notify_all();
    }

    /// Every mark so far, in order.
    pub fn marks(&self) -> Vec<Mark> {
        lock(&self.marks).clone()
    }

    /// The labels so far, in order.
    pub fn labels(&self) -> Vec<&'static str> {
        lock(&self.marks).iter().map(|m| m.label).collect()
    }

    /// The first mark called `label`.
    pub fn find(&self, label: &str) -> Option<Mark> {
        lock(&self.marks).iter().find(|m| m.label == label).cloned()
    }

    /// Waits (at most [`LIVENESS_BOUND`]) for a mark called `label`.
    pub fn wait_for(&self, label: &str) -> Option<Mark> {
        let deadline = Instant::now() + LIVENESS_BOUND;
        let mut marks = lock(&self.marks);
        loop {
            if let Some(mark) = marks.iter().find(|m| m.label == label) {
                return Some(mark.clone());
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return None;
            }
            marks = self
                .marked
                .wait_timeout(marks, left)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
    }

    /// Opens the gate: a host function blocked in [`Probe::wait_gate`] returns.
    pub fn open_gate(&self) {
        *lock(&self.gate_open) = true;
        self.gate_changed.notify_all();
    }

    /// Blocks until the gate opens; `false` if [`LIVENESS_BOUND`] passed first.
    pub fn wait_gate(&self) -> bool {
        let guard = lock(&self.gate_open);
        let (guard, _) = self
            .gate_changed
            .wait_timeout_while(guard, LIVENESS_BOUND, |open| !*open)
            .unwrap_or_else(PoisonError::into_inner);
        *guard
    }
}

/// Enqueues on `stream` a host function that marks `gate_entered`, blocks until the case calls
/// [`Probe::open_gate`], then marks `gate_released` (or `gate_timed_out`). Work enqueued on
/// `stream` after it cannot start before the case opens the gate, whatever the machine's speed.
#[track_caller]
pub fn block_stream(stream: CUstream, probe: &Arc<Probe>) -> Ret {
    let probe = Arc::clone(probe);
    launch_host_func(stream, move || {
        probe.mark("gate_entered");
        if probe.wait_gate() {
            probe.mark("gate_released");
        } else {
            probe.mark("gate_timed_out");
        }
    })
}

/// The position of `label` in `labels`, with a readable failure.
#[track_caller]
pub fn position(labels: &[&'static str], label: &str) -> usize {
    labels
        .iter()
        .position(|l| *l == label)
        .unwrap_or_else(|| panic!("no mark {label:?} in {labels:?}"))
}
