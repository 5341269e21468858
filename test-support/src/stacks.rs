//! Stack dumps of a hung test process on request: [`dump_stacks_on_signal`] installs a handler for
//! [`STACK_DUMP_SIGNAL`] that writes the receiving thread's backtrace to stderr, so that the GPU
//! runner (`run.py`), when a test exceeds its timeout, can send the signal to every thread of the
//! process before it kills it and keep what they print (the GPU host has no gdb or eu-stack).
//! How to read the result: docs/testing.md, "When a test hangs".
//!
//! **Not async-signal-safe, on purpose.** The handler allocates, takes std's backtrace lock,
//! reads `/proc` and symbolises frames, none of which is allowed in a signal handler. It is a
//! diagnostic for a process that is already hung and about to be killed, sent only by the runner:
//! if the interrupted thread held the allocator's lock, that thread's dump never comes (and the
//! runner moves on after a few seconds). Nothing in a passing test ever receives the signal.
//! It lives in the test-support crate, which only tests link; the product has no part of it.

/// The signal the GPU runner sends to each thread of a hung test process (`SIGUSR2`; `run.py`
/// uses the same number and first checks in `/proc/<pid>/status` that the process catches it).
#[cfg(target_os = "linux")]
pub const STACK_DUMP_SIGNAL: i32 = libc::SIGUSR2;

/// The first line of a thread's dump, followed by its thread id; the runner waits for the
/// matching [`DUMP_END`] line.
pub const DUMP_BEGIN: &str = "custody-stack-dump begin tid";
/// The last line of a thread's dump, followed by its thread id.
pub const DUMP_END: &str = "custody-stack-dump end tid";

/// Installs (once per process) the handler that writes the receiving thread's backtrace to
/// stderr when [`STACK_DUMP_SIGNAL`] arrives: a `custody-stack-dump begin tid N (name)` line,
/// `std::backtrace::Backtrace::force_capture()`, and `custody-stack-dump end tid N`. Called by
/// every test's `start()` (the `helpers` feature) and by the cuda-sys conformance suite's driver
/// accessor; idempotent and cheap after the first call. It leaves alone a handler something else
/// in the process installed for the signal first. Elsewhere than Linux it does nothing.
///
/// # Panics
/// When `sigaction` refuses the handler (it does not for a valid signal number).
pub fn dump_stacks_on_signal() {
    #[cfg(target_os = "linux")]
    {
        static INSTALLED: std::sync::Once = std::sync::Once::new();
        INSTALLED.call_once(install);
    }
}

#[cfg(target_os = "linux")]
fn install() {
    // SAFETY: a zeroed `sigaction` is a valid value of the C struct; it only receives the
    // current action here.
    let mut current: libc::sigaction = unsafe { std::mem::zeroed() };
    // SAFETY: a valid signal number; no new action (null), the current one written to `current`.
    let status = unsafe { libc::sigaction(STACK_DUMP_SIGNAL, std::ptr::null(), &mut current) };
    if status != 0 || current.sa_sigaction != libc::SIG_DFL {
        // Something in the process (a library loaded before the first test) handles the signal
        // already: leave it its handler; the runner then gets no dumps from this process.
        return;
    }
    // SAFETY: a zeroed `sigaction` is a valid value of the C struct (no handler, no flags, an
    // empty mask); the fields set below are the documented ones.
    let mut action: libc::sigaction = unsafe { std::mem::zeroed() };
    action.sa_sigaction = on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t;
    // SA_RESTART: a thread interrupted in a futex wait or a read goes back to it afterwards.
    // Not SA_ONSTACK: std's alternate signal stacks are too small for symbolisation.
    action.sa_flags = libc::SA_RESTART;
    // SAFETY: `action.sa_mask` is a valid `sigset_t` to initialise.
    unsafe { libc::sigemptyset(&mut action.sa_mask) };
    // SAFETY: a valid signal number and a fully initialised `sigaction`; the old action is not
    // asked for (null).
    let status = unsafe { libc::sigaction(STACK_DUMP_SIGNAL, &action, std::ptr::null_mut()) };
    assert_eq!(
        status,
        0,
        "sigaction({STACK_DUMP_SIGNAL}): {}",
        std::io::Error::last_os_error()
    );
}

/// The handler (see the module's note: not async-signal-safe, a diagnostic of a hung process).
#[cfg(target_os = "linux")]
extern "C" fn on_signal(_signal: libc::c_int) {
    // A panic must not unwind out of an `extern "C"` function (it would abort the process, and
    // with it the other threads' dumps).
    let _ = std::panic::catch_unwind(|| {
        // SAFETY: gettid has no preconditions.
        let tid = unsafe { libc::gettid() };
        // The kernel's name for the thread: `std::thread::current()` is not usable in a thread
        // that is exiting (its thread-local data may be gone), and driver threads have no Rust
        // name at all.
        let name = std::fs::read_to_string("/proc/thread-self/comm")
            .map(|n| n.trim_end().to_owned())
            .unwrap_or_default();
        let backtrace = std::backtrace::Backtrace::force_capture();
        let text = format!("\n{DUMP_BEGIN} {tid} ({name})\n{backtrace}\n{DUMP_END} {tid}\n");
        write_stderr(text.as_bytes());
    });
}

/// Writes `bytes` to file descriptor 2 directly: std's `Stderr` takes a lock and borrows a
/// `RefCell` that the interrupted code may hold.
#[cfg(target_os = "linux")]
fn write_stderr(mut bytes: &[u8]) {
    while !bytes.is_empty() {
        // SAFETY: `bytes` is a valid buffer of `bytes.len()` bytes; fd 2 may be closed, which
        // only makes the write fail.
        let written = unsafe { libc::write(2, bytes.as_ptr().cast(), bytes.len()) };
        match usize::try_from(written) {
            Ok(0) | Err(_) => {
                if std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted
                    || written == 0
                {
                    return;
                }
            }
            Ok(n) => bytes = &bytes[n.min(bytes.len())..],
        }
    }
}
