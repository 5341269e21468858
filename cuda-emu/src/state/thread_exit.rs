//! A thread's exit waits for its per-thread default streams (`docs/driver-facts.md` F24): a
//! thread that ends with work pending on `CU_STREAM_PER_THREAD` does not finish ending until
//! that work has run. The first per-thread stream a thread gets arms a thread-local watch
//! ([`watch_this_thread`]) whose destructor, run by the thread's exit, waits for each of the
//! thread's per-thread streams and lets the host observe them, as a synchronisation would.
//!
//! A thread whose per-thread stream has operations no synchronisation has seen complete when it
//! ends is also reported, as a `thread_exit_with_pending_per_thread_work` hazard: on a real
//! driver that exit waits for the GPU (beside other processes it was seen not to finish for
//! minutes), so a program must synchronise the stream before the thread ends. The check is on
//! the logical clocks, like every hazard: the emulator may have run the work already.

use std::cell::Cell;

use crate::exec::wait_all;
use crate::log::{self, Hazard};
use crate::state::{state, State};

thread_local! {
    /// The emulator's id of this thread once it has a per-thread stream (0: none yet).
    static WATCH: ExitWatch = const { ExitWatch(Cell::new(0)) };
}

/// Armed with the thread's id; its drop is the thread's exit.
struct ExitWatch(Cell<u64>);

impl Drop for ExitWatch {
    fn drop(&mut self) {
        let thread = self.0.get();
        if thread != 0 {
            let targets = state().exiting_threads_streams(thread);
            for (dep, clock) in targets {
                wait_all(&[dep]);
                state().host_observed(&clock);
            }
        }
    }
}

/// Arms the calling thread's exit watch (`thread` is its emulator id); a no-op once armed, and
/// on a thread whose thread-locals are already being destroyed.
pub(crate) fn watch_this_thread(thread: u64) {
    let _ = WATCH.try_with(|w| w.0.set(thread));
}

impl State {
    /// What the exit of `thread` waits for: the tail and clock of each of its live per-thread
    /// streams. Reports a stream with operations the host has not seen complete.
    fn exiting_threads_streams(
        &self,
        thread: u64,
    ) -> Vec<(crate::exec::Dep, crate::clock::VectorClock)> {
        let mut targets = Vec::new();
        for (&(t, _ctx), &s) in &self.per_thread {
            let Some(stream) = self.streams.get(&s).filter(|_| t == thread) else {
                continue;
            };
            let (issued, seen) = (stream.clock.get(s), self.host_clock.get(s));
            if seen < issued {
                log::hazard(Hazard {
                    kind: "thread_exit_with_pending_per_thread_work",
                    ptr: 0,
                    alloc: None,
                    function: "thread exit",
                    stream: s,
                    detail: format!(
                        "thread {thread} ended with operations #{}-#{issued} on its per-thread \
                         stream {s:#x} that no synchronisation had seen complete: a real driver \
                         holds the thread's exit until they have run; synchronise the stream \
                         before the thread ends",
                        seen + 1
                    ),
                });
            }
            targets.push(self.stream_target(s));
        }
        targets
    }
}
