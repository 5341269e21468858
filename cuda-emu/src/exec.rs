//! The execution model: every stream runs its work in order, asynchronously to the host.
//!
//! Each stream has a [`StreamCore`]: a FIFO of operations and two counters, `enqueued` and
//! `completed`. An operation may depend on other streams reaching a count ([`Dep`]): that is
//! how event waits and the legacy stream's implicit synchronisation are executed.
//!
//! An operation is run inline, on the enqueuing thread, when the stream is idle, its
//! dependencies are met and it is not marked `defer` (plain copies, fills, allocation
//! bookkeeping). Everything else (host functions, graph launches, work queued behind pending
//! work) runs on a worker thread that the stream starts on demand and that exits when the
//! queue is empty: the driver-internal thread of G3. Inline execution never changes what the
//! hazard checker reports, which depends only on the order of calls.

use std::collections::VecDeque;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};

use crate::thread::lock;

/// A stream's queue and progress counters.
pub(crate) struct StreamCore {
    /// The stream's handle (for thread names and the log).
    pub(crate) handle: u64,
    enqueued: AtomicU64,
    completed: AtomicU64,
    queue: Mutex<Queue>,
}

struct Queue {
    ops: VecDeque<(u64, Op)>,
    worker: bool,
}

/// "Stream `core` has completed its `seq`-th operation."
#[derive(Clone)]
pub(crate) struct Dep {
    pub(crate) core: Arc<StreamCore>,
    pub(crate) seq: u64,
}

impl Dep {
    pub(crate) fn done(&self) -> bool {
        self.core.completed() >= self.seq
    }
}

/// One stream operation.
pub(crate) struct Op {
    /// What must complete first.
    pub(crate) deps: Vec<Dep>,
    /// The work; `None` for a marker (event record, stream wait).
    pub(crate) run: Option<Box<dyn FnOnce() + Send>>,
    /// Never run inline: host functions and graph launches.
    pub(crate) defer: bool,
}

static PROGRESS: Mutex<()> = Mutex::new(());
static PROGRESS_CV: Condvar = Condvar::new();
/// Threads inside [`wait_until`]; progress skips the lock and the wake-up when there are none.
static WAITERS: AtomicUsize = AtomicUsize::new(0);

fn notify_progress() {
    // A waiter registers (SeqCst) before it checks its condition, and we publish progress
    // (SeqCst) before reading WAITERS: either it sees our progress or we see it and wake it.
    if WAITERS.load(Ordering::SeqCst) > 0 {
        let _guard = lock(&PROGRESS);
        PROGRESS_CV.notify_all();
    }
}

/// Blocks until `cond()` holds; `cond` is re-evaluated whenever any stream makes progress.
pub(crate) fn wait_until(cond: impl Fn() -> bool) {
    if cond() {
        return;
    }
    let mut guard = lock(&PROGRESS);
    WAITERS.fetch_add(1, Ordering::SeqCst);
    while !cond() {
        guard = PROGRESS_CV
            .wait(guard)
            .unwrap_or_else(std::sync::PoisonError::into_inner);
    }
    WAITERS.fetch_sub(1, Ordering::SeqCst);
}

/// Blocks until every dependency in `deps` is met.
pub(crate) fn wait_all(deps: &[Dep]) {
    wait_until(|| deps.iter().all(Dep::done));
}

impl StreamCore {
    pub(crate) fn new(handle: u64) -> Arc<StreamCore> {
        Arc::new(StreamCore {
            handle,
            enqueued: AtomicU64::new(0),
            completed: AtomicU64::new(0),
            queue: Mutex::new(Queue {
                ops: VecDeque::new(),
                worker: false,
            }),
        })
    }

    /// Operations enqueued so far.
    pub(crate) fn enqueued(&self) -> u64 {
        self.enqueued.load(Ordering::SeqCst)
    }

    /// Operations completed so far.
    pub(crate) fn completed(&self) -> u64 {
        self.completed.load(Ordering::SeqCst)
    }

    /// A dependency on everything enqueued so far, or `None` when all of it is done.
    pub(crate) fn tail(self: &Arc<Self>) -> Option<Dep> {
        let seq = self.enqueued();
        (self.completed() < seq).then(|| Dep {
            core: self.clone(),
            seq,
        })
    }

    /// A dependency on everything enqueued so far, even when already done.
    pub(crate) fn tail_always(self: &Arc<Self>) -> Dep {
        Dep {
            core: self.clone(),
            seq: self.enqueued(),
        }
    }

    /// Enqueues `op` and returns its sequence number. The caller holds the global state lock,
    /// which orders all enqueues.
    pub(crate) fn submit(self: &Arc<Self>, op: Op) -> u64 {
        let seq = self.enqueued.load(Ordering::SeqCst) + 1;
        self.enqueued.store(seq, Ordering::SeqCst);
        let mut queue = lock(&self.queue);
        let inline = !op.defer
            && queue.ops.is_empty()
            && self.completed() + 1 == seq
            && op.deps.iter().all(Dep::done);
        if inline {
            drop(queue);
            if let Some(run) = op.run {
                let _ = catch_unwind(AssertUnwindSafe(run));
            }
            self.finish(seq);
            return seq;
        }
        queue.ops.push_back((seq, op));
        if !queue.worker {
            queue.worker = true;
            let core = self.clone();
            let spawned = std::thread::Builder::new()
                .name(format!("cuda-emu-stream-{:x}", self.handle))
                .spawn(move || core.work());
            if spawned.is_err() {
                // No thread to be had: run the queue here rather than never.
                drop(queue);
                self.work();
            }
        }
        seq
    }

    fn finish(&self, seq: u64) {
        self.completed.store(seq, Ordering::SeqCst);
        notify_progress();
    }

    fn work(&self) {
        loop {
            let (seq, op) = {
                let mut queue = lock(&self.queue);
                match queue.ops.pop_front() {
                    Some(next) => next,
                    None => {
                        queue.worker = false;
                        return;
                    }
                }
            };
            wait_all(&op.deps);
            if let Some(run) = op.run {
                let _ = catch_unwind(AssertUnwindSafe(run));
            }
            self.finish(seq);
        }
    }
}
