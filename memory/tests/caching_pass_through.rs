//! `CUSTODY_CACHING_PASS_THROUGH` (`CachingMemoryResource::PASS_THROUGH_ENV`): with it set when
//! the process first asks, a cache keeps nothing: every allocation is the upstream resource's
//! (its size as asked, no size class), every free goes straight back to it (the pool's used
//! memory returns to its baseline, and on the emulator the allocation is gone), and an
//! allocation on the same stream after a free is a new one (no hit). The variable is read once
//! per process, so the test runs its checks in a child process, this test binary again, with the
//! variable set (as `ipc.rs` runs its child). Runs on the emulator and on a real driver.

mod common;

use std::process::Command;

use common::*;
use memory::{CachingMemoryResource, DeviceMemoryResource, MemoryResource};

/// Set in the child process: it runs the checks.
const CHILD: &str = "CUSTODY_MEMORY_PASS_THROUGH_CHILD";

#[test]
fn a_pass_through_cache_allocates_and_frees_every_buffer_through_its_upstream() {
    if std::env::var_os(CHILD).is_some() {
        child();
        return;
    }
    let _serial = start();
    let output = Command::new(std::env::current_exe().expect("the test binary"))
        .args([
            "--exact",
            "a_pass_through_cache_allocates_and_frees_every_buffer_through_its_upstream",
            "--test-threads=1",
            "--nocapture",
        ])
        .env(CHILD, "1")
        .env(CachingMemoryResource::PASS_THROUGH_ENV, "1")
        .output()
        .expect("running the child");
    let text = String::from_utf8_lossy(&output.stdout).into_owned()
        + &String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success() && text.contains("pass-through: every check passed"),
        "the child failed:\n{text}"
    );
}

/// The checks, in a process where the variable is set.
fn child() {
    let _serial = start();
    assert!(
        CachingMemoryResource::passes_through(),
        "read from the variable"
    );
    let base = device_used();
    let s = stream_on(0);
    let mr = CachingMemoryResource::new(DeviceMemoryResource::new(0).expect("device 0's pool"));
    let first = mr.allocate(1000, &s).expect("allocate");
    assert_eq!(first.size(), 1000);
    let (ptr, alloc) = (first.ptr(), alloc_of(first.ptr()));
    with_emulator(|emu| {
        let block = emu.allocation_at(ptr).expect("live");
        assert_eq!(
            block.size, 1000,
            "the upstream's own allocation, no size class"
        );
    });
    first.close().expect("close");
    assert_eq!(mr.stats().cached_blocks, 0, "nothing binned");
    with_emulator(|emu| assert!(!emu.is_live(alloc), "freed through the upstream"));
    assert_eq!(device_used(), base, "the pool has it back");
    assert!(
        memory::binding::allocate_cached(&mr, 1000, &s).is_none(),
        "no hit to serve"
    );
    let again = mr.allocate(1000, &s).expect("allocate");
    again.close().expect("close");
    let stats = mr.stats();
    assert_eq!(
        (stats.hits, stats.cached_blocks, stats.in_use_blocks),
        (0, 0, 0),
        "{stats:?}"
    );
    assert_eq!(device_used(), base);
    assert_no_hazards();
    println!("pass-through: every check passed");
}
