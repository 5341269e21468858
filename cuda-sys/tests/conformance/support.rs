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

/// Eight bytes of pinned, device-mapped host memory (`cuMemHostAlloc` with
/// `CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_PORTABLE`, zeroed), for stream memory
/// operations: the host reads and writes it through its host address, streams through
/// [`HostWord::dev`]. Freed by [`HostWord::free`] once no stream uses it (never by a drop, so
/// that a failing case cannot free memory a blocked stream still polls).
pub struct HostWord {
    host: *mut std::ffi::c_void,
    dev: cuda_sys::types::CUdeviceptr,
}

// SAFETY: pinned host memory is valid on every thread until `cuMemFreeHost`, which only
// `HostWord::free(self)` calls; all accesses through the struct are atomic.
unsafe impl Send for HostWord {}
// SAFETY: as above.
unsafe impl Sync for HostWord {}

impl HostWord {
    /// Allocates and zeroes the word; needs a current context.
    #[track_caller]
    pub fn new() -> HostWord {
        use crate::driver::{
            mem_host_alloc, mem_host_get_device_pointer, MEMHOSTALLOC_DEVICEMAP,
            MEMHOSTALLOC_PORTABLE,
        };
        let host = mem_host_alloc(64, MEMHOSTALLOC_DEVICEMAP | MEMHOSTALLOC_PORTABLE).check();
        assert!(!host.is_null(), "cuMemHostAlloc returned NULL");
        let dev = mem_host_get_device_pointer(host).check();
        assert_ne!(dev, 0, "cuMemHostGetDevicePointer returned 0");
        let word = HostWord { host, dev };
        word.write64(0);
        word
    }

    /// The device pointer streams use.
    pub fn dev(&self) -> cuda_sys::types::CUdeviceptr {
        self.dev
    }

    fn atomic32(&self) -> &std::sync::atomic::AtomicU32 {
        // SAFETY: the allocation is 64 bytes, page-aligned, and lives until `free(self)`.
        unsafe { std::sync::atomic::AtomicU32::from_ptr(self.host.cast()) }
    }

    fn atomic64(&self) -> &std::sync::atomic::AtomicU64 {
        // SAFETY: as for `atomic32`.
        unsafe { std::sync::atomic::AtomicU64::from_ptr(self.host.cast()) }
    }

    /// The low 32 bits, as the host sees them now.
    pub fn read(&self) -> u32 {
        self.atomic32().load(std::sync::atomic::Ordering::SeqCst)
    }

    /// All 64 bits, as the host sees them now.
    pub fn read64(&self) -> u64 {
        self.atomic64().load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Stores all 64 bits from the host.
    pub fn write64(&self, value: u64) {
        self.atomic64()
            .store(value, std::sync::atomic::Ordering::SeqCst);
    }

    /// Whether the low 32 bits read `value`, looking until they do or [`LIVENESS_BOUND`] has
    /// passed: for work the case has already let run, written without any driver call on the
    /// host (the host only reads its own memory).
    pub fn comes_to(&self, value: u32) -> bool {
        let deadline = Instant::now() + LIVENESS_BOUND;
        while self.read() != value {
            if Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        true
    }

    /// `cuMemFreeHost`, once no stream uses the word any more.
    #[track_caller]
    pub fn free(self) {
        crate::driver::mem_free_host(self.host).check();
    }
}

/// A flag that releases what waits on it: the case sets it with [`Flag::release`], and so do
/// a drop (also when the case fails, so that no stream stays blocked) and a watchdog thread
/// after [`LIVENESS_BOUND`] (so that a driver that never gets there cannot hang the case, which
/// then fails on [`Flag::watchdog_fired`]). Not a timing assertion: the watchdog only turns a
/// hang into a failure.
pub struct Flag {
    word: Arc<HostWord>,
    /// What releasing writes (all 64 bits).
    released_value: u64,
    state: Arc<(Mutex<bool>, Condvar)>,
    fired: Arc<std::sync::atomic::AtomicBool>,
    watchdog: Option<std::thread::JoinHandle<()>>,
}

impl Flag {
    /// A new flag at 0 that releasing sets to 1, its watchdog started.
    #[track_caller]
    pub fn new() -> Flag {
        Flag::releasing_to(1)
    }

    /// A new flag at 0 that releasing sets to `released_value` (64 bits), its watchdog started.
    #[track_caller]
    pub fn releasing_to(released_value: u64) -> Flag {
        let word = Arc::new(HostWord::new());
        let state = Arc::new((Mutex::new(false), Condvar::new()));
        let fired = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let watchdog = {
            let (word, state, fired) = (Arc::clone(&word), Arc::clone(&state), Arc::clone(&fired));
            std::thread::spawn(move || {
                let (released, changed) = &*state;
                let guard = lock(released);
                let (guard, timeout) = changed
                    .wait_timeout_while(guard, LIVENESS_BOUND, |released| !*released)
                    .unwrap_or_else(PoisonError::into_inner);
                drop(guard);
                if timeout.timed_out() {
                    fired.store(true, std::sync::atomic::Ordering::SeqCst);
                    word.write64(released_value);
                }
            })
        };
        Flag {
            word,
            released_value,
            state,
            fired,
            watchdog: Some(watchdog),
        }
    }

    /// The device pointer a `cuStreamWaitValue32(.., 1, GEQ)` waits on.
    pub fn dev(&self) -> cuda_sys::types::CUdeviceptr {
        self.word.dev()
    }

    /// Stores `value` (64 bits) from the host without releasing the flag.
    pub fn write64(&self, value: u64) {
        self.word.write64(value);
    }

    /// Writes the released value from the host, which satisfies the waits, and stops the
    /// watchdog.
    pub fn release(&self) {
        self.word.write64(self.released_value);
        let (released, changed) = &*self.state;
        *lock(released) = true;
        changed.notify_all();
    }

    /// Whether the watchdog had to release the flag (the case waited [`LIVENESS_BOUND`]).
    pub fn watchdog_fired(&self) -> bool {
        self.fired.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Releases the flag, joins the watchdog and frees the word; every stream waiting on it
    /// must have finished (synchronise them first).
    #[track_caller]
    pub fn free(mut self) {
        self.release();
        if let Some(watchdog) = self.watchdog.take() {
            watchdog.join().expect("the watchdog thread");
        }
        let word = Arc::clone(&self.word);
        drop(self);
        Arc::try_unwrap(word)
            .unwrap_or_else(|_| panic!("the flag's word is still shared"))
            .free();
    }
}

impl Drop for Flag {
    fn drop(&mut self) {
        self.release();
        if let Some(watchdog) = self.watchdog.take() {
            let _ = watchdog.join();
        }
    }
}
