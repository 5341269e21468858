//! Whole-process cases, each run in a child process of this test binary: a driver that was
//! never initialised (docs/reference-notes.md section 5, case 5, unified by docs/decisions.md D1)
//! and deferred cleanup still queued at exit (case 58, docs/decisions.md D7); and two failing frees
//! reported apart (needs the emulator's fault injection).

mod common;

use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};

use common::*;
use handles::{
    ContextHandle, DeallocationRecipe, DevicePtrHandle, HandleError, StreamFlags, StreamHandle,
    UserObjectOwnership,
};

const CHILD: &str = "HANDLES_TEST_CHILD";

/// Runs this binary's test `name` alone in a child process with [`CHILD`] set; returns its
/// exit status and stderr.
fn run_child(name: &str) -> (std::process::ExitStatus, String) {
    let output = Command::new(std::env::current_exe().unwrap())
        .args([name, "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD, "1")
        .output()
        .expect("spawn the child test process");
    (
        output.status,
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

fn is_child() -> bool {
    std::env::var_os(CHILD).is_some()
}

#[test]
fn never_initialised_driver_reads_as_no_current_context() {
    if is_child() {
        // Nothing in this process has called cuInit.
        let error = DeallocationRecipe::record(&StreamHandle::legacy()).unwrap_err();
        assert_eq!(error, HandleError::NoCurrentContext);
        assert!(ContextHandle::current().unwrap().is_none());
        eprintln!("child: checked");
        return;
    }
    let _serial = start();
    let (status, stderr) = run_child("never_initialised_driver_reads_as_no_current_context");
    assert!(status.success(), "child failed: {stderr}");
    assert!(stderr.contains("child: checked"), "{stderr}");
}

/// Blocks the cleanup consumer until the process exits, so that what is queued behind it is
/// still queued at exit.
struct BlockUntilExit;

static BLOCKING: AtomicBool = AtomicBool::new(false);

impl Drop for BlockUntilExit {
    fn drop(&mut self) {
        BLOCKING.store(true, Ordering::SeqCst);
        loop {
            std::thread::park();
        }
    }
}

/// Says so if it is ever dropped.
struct Loud;

impl Drop for Loud {
    fn drop(&mut self) {
        eprintln!("child: queued payload was dropped");
    }
}

#[test]
fn cleanup_still_queued_at_exit_is_leaked() {
    if is_child() {
        let a = primary(0);
        // The worker takes this one and never finishes it.
        drop(UserObjectOwnership::new(&a, Box::new(BlockUntilExit)).unwrap());
        while !BLOCKING.load(Ordering::SeqCst) {
            std::thread::yield_now();
        }
        // These stay queued behind it: a payload and a synchronous free.
        drop(UserObjectOwnership::new(&a, Box::new(Loud)).unwrap());
        let stream = StreamHandle::create(&a, StreamFlags::DEFAULT, 0).unwrap();
        drop(DevicePtrHandle::alloc(64, &stream).unwrap());
        assert!(handles::deferred_cleanup_pending() >= 2);
        eprintln!("child: exiting with cleanup queued");
        std::process::exit(0);
    }
    let _serial = start();
    let (status, stderr) = run_child("cleanup_still_queued_at_exit_is_leaked");
    assert!(status.success(), "child failed: {stderr}");
    assert!(
        stderr.contains("child: exiting with cleanup queued"),
        "{stderr}"
    );
    assert!(!stderr.contains("queued payload was dropped"), "{stderr}");
    assert!(!stderr.contains("cleanup error"), "{stderr}");
}

#[test]
fn two_failing_frees_are_two_distinct_reports() {
    let _serial = start();
    let Some(emu) = emulator_or_skip("fault injection to make two frees fail") else {
        return;
    };
    let a = primary(0);
    let stream = StreamHandle::create(&a, StreamFlags::DEFAULT, 0).unwrap();
    let first = pool_buffer(&stream).unwrap();
    let second = pool_buffer(&stream).unwrap();
    let (p1, p2) = (first.ptr(), second.ptr());
    emu.inject_fault("cuMemFreeAsync", 1, cuda_sys::CudaErrorCode::INVALID_VALUE);
    emu.inject_fault("cuMemFreeAsync", 2, cuda_sys::CudaErrorCode::INVALID_VALUE);
    drop(first);
    drop(second);
    let (e1, e2) = (errors_for(p1), errors_for(p2));
    assert_eq!((e1.len(), e2.len()), (1, 1));
    assert!(e1[0].to_string().contains(&format!("(0x{p1:x})")));
    assert!(e2[0].to_string().contains(&format!("(0x{p2:x})")));
}
