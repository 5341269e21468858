//! The process's life as custody sees it: an `atexit` hook sets a flag, and from then on no handle
//! calls the driver ([`exiting`]; docs/decisions.md D7).

use std::ffi::c_int;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;

static EXITING: AtomicBool = AtomicBool::new(false);
static AT_EXIT: OnceLock<()> = OnceLock::new();

extern "C" {
    fn atexit(callback: extern "C" fn()) -> c_int;
}

extern "C" fn on_exit() {
    EXITING.store(true, Ordering::SeqCst);
}

/// Registers the exit hook once. Called when the driver is first initialised and when the
/// worker starts.
pub(crate) fn register_exit_hook() {
    AT_EXIT.get_or_init(|| {
        // SAFETY: `on_exit` is a plain `extern "C"` function with no arguments that only
        // stores an atomic; registering it has no other effect.
        let _ = unsafe { atexit(on_exit) };
    });
}

/// Whether the process is exiting (`main` returned or `exit` was called). From then on no
/// handle calls the driver: frees and destructions are leaked, never run against a driver that
/// may be tearing down.
#[inline]
pub fn exiting() -> bool {
    EXITING.load(Ordering::Relaxed)
}
