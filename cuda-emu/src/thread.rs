//! The calling thread's driver state (its small id, its context stack, whether it is running a
//! callback) and [`lock`], the one way the emulator takes a mutex.

use std::cell::{Cell, RefCell};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};

static NEXT_THREAD_ID: AtomicU64 = AtomicU64::new(1);

thread_local! {
    static THREAD_ID: u64 = NEXT_THREAD_ID.fetch_add(1, Ordering::Relaxed);
    static CONTEXT_STACK: RefCell<Vec<u64>> = const { RefCell::new(Vec::new()) };
    static IN_CALLBACK: Cell<bool> = const { Cell::new(false) };
}

/// Locks `m`, ignoring poisoning: a panic inside the emulator is turned into
/// `CUDA_ERROR_UNKNOWN` by [`entry`](crate::log::entry), and the state it guarded stays usable.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The calling thread's small, stable id (1, 2, ... in order of first use).
pub(crate) fn thread_id() -> u64 {
    // 0 on an exiting thread whose id is gone (see `current_context`).
    THREAD_ID.try_with(|id| *id).unwrap_or(0)
}

/// The context on top of the calling thread's stack, 0 for none.
///
/// A thread that is exiting may call the driver from another thread-local's destructor after
/// its stack was destroyed (cuda.core releases primary contexts that way): it has no context.
pub(crate) fn current_context() -> u64 {
    CONTEXT_STACK
        .try_with(|s| s.borrow().last().copied().unwrap_or(0))
        .unwrap_or(0)
}

/// Runs `f` on the calling thread's context stack (last = top). On an exiting thread whose
/// stack is already gone, `f` sees an empty stack and what it pushes is dropped with the thread.
pub(crate) fn with_context_stack<R>(f: impl FnOnce(&mut Vec<u64>) -> R) -> R {
    let mut f = Some(f);
    let done = CONTEXT_STACK.try_with(|s| (f.take().expect("called once"))(&mut s.borrow_mut()));
    match done {
        Ok(r) => r,
        Err(_) => (f.take().expect("not called"))(&mut Vec::new()),
    }
}

/// Runs user code (a host function or a user-object destructor) with driver calls forbidden on
/// this thread (G4), catching a panic so that it cannot unwind into the emulator.
pub(crate) fn run_callback(f: impl FnOnce()) {
    let was = IN_CALLBACK.try_with(|c| c.replace(true)).unwrap_or(false);
    let _ = catch_unwind(AssertUnwindSafe(f));
    let _ = IN_CALLBACK.try_with(|c| c.set(was));
}

/// Whether the calling thread is running a host function or a user-object destructor.
pub(crate) fn in_callback_now() -> bool {
    IN_CALLBACK.try_with(Cell::get).unwrap_or(false)
}
