//! The deferred-cleanup queue (docs/decisions.md D7, D9): a lock-free queue that user-object
//! destructors and non-blocking drops push onto, a worker thread that drains it,
//! [`drain_deferred_cleanup`] for a synchronous drain, and the exit rule (what is still queued at
//! exit is leaked).

use std::any::Any;
use std::cell::Cell;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::ptr;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};
use std::thread::Thread;

use crossbeam_queue::SegQueue;

use crate::lifecycle::exiting;

use crate::sync_free::{run_sync_free, SyncFree};

/// Something the cleanup worker drops or runs.
pub(crate) enum Deferred {
    /// A payload whose user object's last reference went (a graph attachment): dropped.
    Payload(Box<dyn Any + Send>),
    /// A synchronous free waiting for its event.
    SyncFree(SyncFree),
}

/// One item of the queue, and its link. A user object's data pointer is the node its payload
/// will be queued in, made with the user object ([`Node::leak_payload`]), so that the
/// destructor queues it without allocating or freeing anything; the consumer frees the node
/// once the item has run.
pub(crate) struct Node {
    next: *mut Node,
    item: Deferred,
}

impl Node {
    /// A node holding `payload`, leaked, for a user object's data pointer; its destructor
    /// queues it ([`user_object_destructor`]) and the consumer frees it.
    pub(crate) fn leak_payload(payload: Box<dyn Any + Send>) -> *mut Node {
        Box::into_raw(Box::new(Node {
            next: ptr::null_mut(),
            item: Deferred::Payload(payload),
        }))
    }

    /// The payload of a node from [`Node::leak_payload`] that was never queued (the user
    /// object could not be created).
    ///
    /// # Safety
    /// `node` came from [`Node::leak_payload`], was handed to no driver that may still call the
    /// destructor with it, and is reclaimed once.
    pub(crate) unsafe fn reclaim_payload(node: *mut Node) -> Box<dyn Any + Send> {
        // SAFETY: the caller's promise: the node is ours, from `Box::into_raw`.
        let node = unsafe { Box::from_raw(node) };
        match node.item {
            Deferred::Payload(payload) => payload,
            Deferred::SyncFree(_) => unreachable!("leak_payload makes payload nodes only"),
        }
    }
}

/// The queue: a lock-free stack of [`Node`]s (push is one compare-and-swap, and takes no lock,
/// so it is safe inside a user-object destructor that runs on a driver thread or synchronously
/// inside our own `cuGraphExecDestroy` call). The consumer takes the whole stack at once (one
/// swap) and runs it oldest first. No node is ever popped singly, so the stack has no ABA
/// problem; a taken node is reachable from the consumer's [`TAKEN`] list only.
///
/// On its own 128-byte block: every push and every take writes it, and the worker's state
/// should not share its lines.
#[repr(align(128))]
struct Queue {
    head: AtomicPtr<Node>,
    /// Queued or taken and not yet started (incremented before a push, so never below zero).
    pending: AtomicUsize,
    /// Set by the worker before it parks and checks the queue once more; a push wakes it only
    /// while it is set (no write to the worker's state otherwise).
    worker_sleeping: AtomicBool,
}

static QUEUE: Queue = Queue {
    head: AtomicPtr::new(ptr::null_mut()),
    pending: AtomicUsize::new(0),
    worker_sleeping: AtomicBool::new(false),
};

impl Queue {
    /// Pushes `node` (one owned box, leaked into the stack).
    fn push(&self, node: *mut Node) {
        self.pending.fetch_add(1, Ordering::Relaxed);
        let mut head = self.head.load(Ordering::Relaxed);
        loop {
            // SAFETY: `node` is owned by the caller and not yet reachable by anyone else.
            unsafe { (*node).next = head };
            // SeqCst: ordered against the worker's `worker_sleeping` store and its check of
            // the head before it parks, so that either it sees this node or the pusher sees it
            // sleeping.
            match self
                .head
                .compare_exchange_weak(head, node, Ordering::SeqCst, Ordering::Relaxed)
            {
                Ok(_) => return,
                Err(now) => head = now,
            }
        }
    }

    fn is_empty(&self) -> bool {
        self.head.load(Ordering::SeqCst).is_null()
    }

    /// The next item for the consumer on this thread (which holds [`CONSUMER`], or is nested
    /// inside its own consumption): from the list it took before, else the whole stack, taken
    /// now and reversed to oldest first.
    fn next(&self) -> Option<Deferred> {
        let mut first = TAKEN.with(Cell::get);
        if first.is_null() {
            let mut taken = self.head.swap(ptr::null_mut(), Ordering::Acquire);
            // Reverse: the stack's top is the newest.
            while !taken.is_null() {
                // SAFETY: the swap made every node of the taken list this thread's alone;
                // each came from `Box::into_raw` and is visited once.
                let next = unsafe { (*taken).next };
                // SAFETY: as above.
                unsafe { (*taken).next = first };
                first = taken;
                taken = next;
            }
            if first.is_null() {
                return None;
            }
        }
        // SAFETY: `first` heads this thread's taken list (above, or left by an earlier call on
        // this thread): owned, from `Box::into_raw`, unlinked here once.
        let node = unsafe { Box::from_raw(first) };
        TAKEN.with(|t| t.set(node.next));
        self.pending.fetch_sub(1, Ordering::Relaxed);
        Some(node.item)
    }
}

/// Frees that wait for a capture to end (docs/decisions.md D11): a free on the legacy stream
/// while a blocking stream of its context is captured, or on a stream whose capture was
/// invalidated (or could not take the memory). Retried by the worker every [`PARKED_RETRY`]
/// while any wait, and by every [`drain_deferred_cleanup`]. Rare: a plain lock-free queue.
static PARKED: SegQueue<Box<dyn Any + Send>> = SegQueue::new();

/// How often the worker retries parked frees.
const PARKED_RETRY: std::time::Duration = std::time::Duration::from_millis(20);

/// Held by whoever is consuming the queue (the worker or a [`drain_deferred_cleanup`] caller)
/// while it takes and processes items, so that a drain returns only when everything queued
/// before it has been processed. Never taken by a push.
static CONSUMER: Mutex<()> = Mutex::new(());

static WORKER: OnceLock<Option<Thread>> = OnceLock::new();

thread_local! {
    /// Whether this thread holds [`CONSUMER`] (a nested drain must not take it again).
    static CONSUMING: Cell<bool> = const { Cell::new(false) };
    /// Whether this thread is the cleanup worker.
    static IS_WORKER: Cell<bool> = const { Cell::new(false) };
    /// The nodes this thread took from the queue and has not started yet, oldest first: a
    /// drain nested in one of their drops runs them too, as it would have found them queued.
    static TAKEN: Cell<*mut Node> = const { Cell::new(ptr::null_mut()) };
}

/// On the worker only: after a failed restore left a recipe's context current, unbind it, so
/// that the worker keeps no context of its own between items. Otherwise every later item would
/// "restore" that stale binding, and once its context is destroyed each such restore would
/// fail and be reported again. User threads keep whatever the failed restore left (reported).
fn unbind_worker_after_failed_restore() {
    if !IS_WORKER.with(Cell::get) || !crate::scope::take_restore_failed() {
        return;
    }
    if let Ok(d) = crate::sys::driver() {
        // Retrying what failed: its failure was reported already, and if this retry fails
        // too the mark stays and the next item tries again.
        if crate::sys::set_current_raw(d, 0) != 0 {
            crate::scope::note_restore_failed();
        }
    }
}

/// Starts the worker thread once, and waits (briefly, the first time) until it has set itself
/// up; `None` if the thread could not be spawned (then only [`drain_deferred_cleanup`] empties
/// the queue).
pub(crate) fn ensure_worker() -> Option<&'static Thread> {
    WORKER
        .get_or_init(|| {
            crate::lifecycle::register_exit_hook();
            let (ready, started) = std::sync::mpsc::channel();
            match std::thread::Builder::new()
                .name("custody-cleanup".into())
                .spawn(move || worker_main(ready))
            {
                Ok(handle) => {
                    // The worker's setup makes one driver call; nothing waits on the GPU.
                    let _ = started.recv_timeout(std::time::Duration::from_secs(10));
                    Some(handle.thread().clone())
                }
                Err(error) => {
                    crate::report::stderr_line(format_args!("custody: could not start the cleanup worker ({error}); deferred cleanup runs only in drain_deferred_cleanup()"));
                    None
                }
            }
        })
        .as_ref()
}

/// Parks `payload` (a handle whose free must wait for a capture to end): the worker retries it
/// (dropping it again) every [`PARKED_RETRY`], and so does every drain.
pub(crate) fn park(payload: Box<dyn Any + Send>) {
    ensure_worker();
    PARKED.push(payload);
    if let Some(Some(worker)) = WORKER.get() {
        worker.unpark();
    }
}

/// Moves every parked payload onto the queue, to be dropped (and so retried) by its consumer.
fn unpark_all() {
    let waiting = PARKED.len();
    for _ in 0..waiting {
        let Some(payload) = PARKED.pop() else { break };
        QUEUE.push(Node::leak_payload(payload));
    }
}

/// Queues an item from ordinary Rust code (starting the worker if needed) and wakes the worker.
pub(crate) fn push(item: Deferred) {
    ensure_worker();
    push_from_callback(Box::into_raw(Box::new(Node {
        next: ptr::null_mut(),
        item,
    })));
}

/// Queues a node and wakes the worker if it sleeps, without starting anything: safe in a
/// user-object destructor (no lock that user code may hold, no driver call, no allocation).
#[inline]
fn push_from_callback(node: *mut Node) {
    QUEUE.push(node);
    // A plain load first: while the worker is awake, a push writes nothing it reads.
    if QUEUE.worker_sleeping.load(Ordering::SeqCst)
        && QUEUE.worker_sleeping.swap(false, Ordering::SeqCst)
    {
        if let Some(Some(worker)) = WORKER.get() {
            worker.unpark();
        }
    }
}

/// The destructor installed on every user object made by
/// [`UserObjectOwnership`](crate::UserObjectOwnership): it takes the payload back and queues it.
///
/// Runs on a driver thread or synchronously inside a driver call made by any thread
/// (docs/driver-facts.md G2, G3); it makes no driver call and takes no lock.
pub(crate) extern "C" fn user_object_destructor(data: *mut std::ffi::c_void) {
    if data.is_null() {
        return;
    }
    // `data` is the node leaked by `UserObjectOwnership::new` (`Node::leak_payload`), and the
    // driver calls a user object's destructor exactly once: it is queued as it is.
    push_from_callback(data.cast::<Node>());
}

fn worker_main(ready: std::sync::mpsc::Sender<()>) {
    IS_WORKER.with(|w| w.set(true));
    // The worker captures nothing, so no capture needs it kept from "potentially unsafe" calls
    // (`cuMemFree`, `cuMemFreeHost`, `cuCtxSynchronize`); in the default (global) mode a user's
    // global capture on another thread would make the worker's synchronous frees fail and break
    // that capture (docs/decisions.md D11). If this fails the worker carries on in the default
    // mode, said on stderr.
    let _ = crate::sys::init();
    if let Err(status) = relax_capture_mode() {
        crate::report::stderr_line(format_args!(
            "custody: the cleanup worker could not relax its stream-capture mode \
             (cuThreadExchangeStreamCaptureMode: {}); its synchronous frees may fail during \
             another thread's global capture",
            cuda_sys::CudaErrorCode(status).name()
        ));
    }
    let _ = ready.send(());
    drop(ready);
    loop {
        if exiting() {
            return;
        }
        if !QUEUE.is_empty() {
            consume();
        }
        // Say so before the last look at the queue: a push after that look sees the flag and
        // wakes the worker (both sides SeqCst).
        QUEUE.worker_sleeping.store(true, Ordering::SeqCst);
        if QUEUE.is_empty() {
            if PARKED.is_empty() {
                std::thread::park();
            } else {
                std::thread::park_timeout(PARKED_RETRY);
                unpark_all();
            }
        }
        QUEUE.worker_sleeping.store(false, Ordering::Relaxed);
    }
}

/// Sets the calling thread's capture interaction mode to relaxed; the driver's status when that
/// failed.
///
/// Driver calls: `cuThreadExchangeStreamCaptureMode`.
fn relax_capture_mode() -> Result<(), u32> {
    let Ok(d) = crate::sys::driver() else {
        return Ok(()); // no driver: nothing will be freed
    };
    crate::sys::exchange_capture_mode(d, crate::sys::CAPTURE_MODE_RELAXED).map(drop)
}

/// Pops and processes until the queue is empty, holding [`CONSUMER`] unless this thread already
/// does (a drain nested in a payload's drop).
fn consume() -> usize {
    let nested = CONSUMING.with(Cell::get);
    let guard = if nested {
        None
    } else {
        Some(CONSUMER.lock().unwrap_or_else(|e| e.into_inner()))
    };
    CONSUMING.with(|c| c.set(true));
    let mut processed = 0;
    while !exiting() {
        let Some(item) = QUEUE.next() else { break };
        process(item);
        processed += 1;
    }
    if !nested {
        CONSUMING.with(|c| c.set(false));
    }
    drop(guard);
    processed
}

fn process(item: Deferred) {
    let outcome = catch_unwind(AssertUnwindSafe(move || match item {
        Deferred::Payload(payload) => drop(payload),
        Deferred::SyncFree(job) => run_sync_free(job),
    }));
    if outcome.is_err() {
        crate::report::stderr_line(format_args!(
            "custody: a deferred-cleanup payload panicked while being dropped; continuing"
        ));
    }
    unbind_worker_after_failed_restore();
}

/// Runs every queued deferred cleanup on the calling thread and returns how many items ran.
///
/// Returns when everything queued before the call, and everything those items queued in turn
/// (a graph executable destroyed by a payload whose user object's destructor runs
/// synchronously), has been processed, including an item the worker was processing when the
/// call began. Frees run with their recipes, under [`ContextScope`](crate::ContextScope), so
/// the caller's context binding is unchanged afterwards.
///
/// Do not call this while holding a lock that a payload's drop may need (in Python, the GIL:
/// the bindings release it first). Calling it from inside a payload's drop is allowed. After
/// the process began exiting it does nothing.
///
/// Driver calls: those of the queued frees (`cuMemFreeAsync`, `cuEventSynchronize`,
/// `cuMemFree_v2`, `cuMemFreeHost`, ...), each inside its recipe's context.
pub fn drain_deferred_cleanup() -> usize {
    if exiting() {
        return 0;
    }
    // A drain also starts the worker (a program's first drain is usually early), so that it has
    // set itself up before frees are queued.
    ensure_worker();
    unpark_all();
    consume()
}

/// How many deferred cleanups are queued and not yet started (frees waiting for a capture to
/// end are counted by [`deferred_frees_waiting_for_a_capture`]).
pub fn deferred_cleanup_pending() -> usize {
    QUEUE.pending.load(Ordering::Relaxed)
}

/// How many frees wait for a capture to end: on the legacy stream while a blocking stream of its
/// context is captured, or on a stream whose capture was invalidated (docs/decisions.md D11).
/// They are retried by the cleanup worker and by [`drain_deferred_cleanup`], and leaked at exit.
pub fn deferred_frees_waiting_for_a_capture() -> usize {
    PARKED.len()
}
