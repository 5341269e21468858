//! One Python `deallocate` at a time on each thread (docs/decisions.md D10): a Python memory
//! resource's `deallocate` is never entered on a thread where one is already running there.
//!
//! A release can start inside a running `deallocate`: the call drops the last reference to
//! another buffer, runs the cyclic garbage collector (or an allocation does), or closes a buffer
//! explicitly. Entering the resource's `deallocate` again there would re-enter user code that
//! may hold a non-reentrant lock (a deadlock) or be half-way through changing its state. Such a
//! nested call is queued on the thread instead, with the context that the release made current
//! for it (its recipe's), and run when the running call returns, on the same thread:
//!
//! - in the order the releases happened, each with its recipe's context current (made current
//!   and restored around the call, as a release does) and on its own recorded stream; a queued
//!   call that releases more queues those behind it;
//! - a nested release returns at once, as if freed: a nested explicit `close()` cannot return
//!   the free's error, so a queued call that fails (raises, or cannot have its context made
//!   current) is reported as a `CUDAWarning`, naming the resource and the pointer, and the
//!   others still run;
//! - the running call's own outcome is unchanged (returned to its explicit `close()` or reported
//!   by its drop); the queued calls run before that outcome is delivered, so their reports come
//!   first.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::sync::Arc;

use handles::{ContextHandle, ContextScope, StreamHandle};
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::errors::Failure;
use crate::report::{report, with_python, OwedFree, PyObjRef};
use crate::stream::class::PyStream;
use crate::stream::methods::default_stream;

/// One call of a Python memory resource's `deallocate(ptr, size, stream=...)`.
pub(crate) struct Deallocate {
    /// The Python memory resource.
    pub(crate) resource: Arc<PyObjRef>,
    /// Its class's name, for messages.
    pub(crate) type_name: Arc<str>,
    pub(crate) ptr: u64,
    pub(crate) size: usize,
    /// The recipe's stream; `None` for host-only memory, which has no recipe: `deallocate`
    /// then gets `default_stream()`.
    pub(crate) stream: Option<StreamHandle>,
    /// The free this call makes, owed until the call is made or skipped (then taken and
    /// dropped, before Python runs); still there if the call never happens: a call dropped
    /// unmade reports that itself (see its `Drop`), and one on a thread stopped at exit (never
    /// dropped) is named by the report at the end of the interpreter's shutdown.
    pub(crate) owed: Option<OwedFree>,
}

/// A queued call and the context its release made current for it (`None`: none was).
struct Queued {
    call: Deallocate,
    context: Option<ContextHandle>,
}

impl Drop for Deallocate {
    /// A call dropped while its free is still owed was never made and never reported: a call
    /// the queue could not take, or one still queued when this thread's storage is torn down.
    /// It is reported here (the memory is leaked), so that no owed free goes unnamed.
    fn drop(&mut self) {
        if self.owed.take().is_some() {
            report(&format!(
                "{} was not called: it was released inside another deallocate call on a thread \
                 that is exiting, where it could not wait for that call to return, so the \
                 memory is leaked",
                self.name()
            ));
        }
    }
}

thread_local! {
    /// Whether a Python `deallocate` is running on this thread.
    static RUNNING: Cell<bool> = const { Cell::new(false) };
    /// Calls released while one was running, in order.
    static QUEUE: RefCell<VecDeque<Queued>> = const { RefCell::new(VecDeque::new()) };
}

impl Deallocate {
    /// `<Class>.deallocate(0x<ptr>, <size>)`.
    fn name(&self) -> String {
        format!(
            "{}.deallocate(0x{:x}, {})",
            self.type_name, self.ptr, self.size
        )
    }

    /// Calls the Python `deallocate`, attached for the call. The free is no longer owed from
    /// here on: the call is made, or skipped and reported.
    fn invoke(&mut self) -> Result<(), Failure> {
        drop(self.owed.take());
        let outcome = with_python(|py| -> PyResult<()> {
            let kwargs = PyDict::new(py);
            match &self.stream {
                Some(stream) => kwargs.set_item("stream", PyStream::new(stream.clone()))?,
                None => kwargs.set_item("stream", default_stream(py)?)?,
            }
            crate::ffi::call_method(
                self.resource.get().bind(py),
                "deallocate",
                (self.ptr, self.size),
                Some(&kwargs),
            )?;
            Ok(())
        });
        match outcome {
            Some(Ok(())) => Ok(()),
            Some(Err(exception)) => Err(Failure::Raised {
                text: format!("{} raised {exception}", self.name()),
                exception,
            }),
            None => Err(Failure::Skipped {
                text: format!(
                    "{} was not called: the interpreter is shutting down, so the memory is \
                     leaked",
                    self.name()
                ),
            }),
        }
    }
}

/// Resets [`RUNNING`] when the outermost call ends, even by a panic.
struct Running;

impl Drop for Running {
    fn drop(&mut self) {
        let _ = RUNNING.try_with(|running| running.set(false));
    }
}

/// Runs `call` now, or queues it when a Python `deallocate` is running on this thread (see the
/// module documentation). A queued call returns `Ok(())` at once.
///
/// Driver calls: `cuCtxGetCurrent` when queueing; for each queued call run afterwards,
/// `cuCtxGetCurrent` and `cuCtxSetCurrent` (when its context is not current) around it.
pub(crate) fn deallocate(mut call: Deallocate) -> Result<(), Failure> {
    let running = RUNNING.try_with(|running| running.replace(true));
    match running {
        // Thread-local storage is gone (the thread is exiting): nothing can be queued.
        Err(_) => return call.invoke(),
        Ok(true) => {
            // The release made the recipe's context current for this call: keep it. A stream
            // that carries its context names it with no driver call; for a default-stream token
            // it is read. Host-only memory has no recipe, and needs no context.
            let context = match &call.stream {
                Some(stream) => match stream.context() {
                    Some(context) => Some(context.clone()),
                    None => match ContextHandle::current() {
                        Ok(context) => context,
                        Err(error) => {
                            // Run later in whatever context is current then, the call would
                            // not get its recipe's (D2): it is not made, and said so.
                            report(&format!(
                                "{} was not called: it was released inside another \
                                 deallocate call on this thread, and the context its release \
                                 made current for it could not be read ({error}), so the \
                                 memory is leaked",
                                call.name()
                            ));
                            drop(call.owed.take());
                            return Ok(());
                        }
                    },
                },
                None => None,
            };
            let queued = Queued { call, context };
            // A queue that cannot take it (this thread's storage is being torn down) drops
            // it, and the drop reports the call it never makes.
            let _ = QUEUE.try_with(|queue| queue.borrow_mut().push_back(queued));
            return Ok(());
        }
        Ok(false) => {}
    }
    let running = Running;
    let outcome = call.invoke();
    while let Some(next) = QUEUE
        .try_with(|queue| queue.borrow_mut().pop_front())
        .ok()
        .flatten()
    {
        run_queued(next);
    }
    drop(running);
    outcome
}

/// Runs a queued call in its context and reports what went wrong (after the restore).
fn run_queued(queued: Queued) {
    let Queued { mut call, context } = queued;
    let scope = match context.as_ref().map(ContextScope::enter).transpose() {
        Ok(scope) => scope,
        Err(error) => {
            report(&format!(
                "{} was not called: its recipe's context 0x{:x} could not be made current \
                 ({error}), so the memory is leaked",
                call.name(),
                context.as_ref().map_or(0, |c| c.raw() as usize)
            ));
            return;
        }
    };
    let outcome = call.invoke();
    let restored = scope.map_or(Ok(()), ContextScope::exit);
    match outcome {
        Ok(()) => {}
        Err(Failure::Raised { text, .. }) => report(&format!(
            "{text} (a release made inside another deallocate call on this thread, run after \
             it returned); the memory may have leaked"
        )),
        Err(Failure::Skipped { text }) => report(&text),
    }
    if let Err(error) = restored {
        report(&format!(
            "{} ran, but the caller's context could not be restored afterwards ({error}); \
             the recipe's context is still current",
            call.name()
        ));
    }
}
