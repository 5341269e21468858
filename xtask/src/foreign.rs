//! `cargo xtask foreign-tests`: a pytest tree that reaches the CUDA driver through `libcuda.so.1`
//! (NVIDIA's cuda.core test suite, say), run on the emulated driver and on a real driver, with
//! per-test outcomes side by side.
//!
//! The work is done by `xtask/foreign/foreign_tests.py` (stdlib-only Python, so that the GPU
//! bundle's `run.py` can run the same harness on a host without Rust); this command builds the
//! emulator, passes it in, and puts the results under `target/foreign-tests/` unless `--out` says
//! otherwise. Arguments go to the script (`cargo xtask foreign-tests --help` lists them).

use std::process::Command;

use anyhow::{Context, Result};

use crate::cmd;

/// The harness script, relative to the workspace root.
pub const SCRIPT: &str = "xtask/foreign/foreign_tests.py";
/// The pytest plugin the script loads, relative to the workspace root.
pub const PLUGIN: &str = "xtask/foreign/custody_outcomes.py";

/// Runs `cargo xtask foreign-tests ARGS`.
pub fn run(args: &[String]) -> Result<()> {
    let root = cmd::workspace_root();
    let metadata = cmd::metadata()?;
    let target = cmd::target_dir(&metadata)?;
    let mut command = Command::new("python3");
    command.arg(root.join(SCRIPT));
    if args.iter().any(|a| a == "-h" || a == "--help") {
        return cmd::run(command.args(args));
    }
    let emulator = crate::test::build_emulator(&target)?;
    command.arg("--emulator").arg(&emulator);
    if !args.iter().any(|a| a == "--out" || a.starts_with("--out=")) {
        command.arg("--out").arg(target.join("foreign-tests"));
    }
    command.args(args).current_dir(&root);
    cmd::run(&mut command).context("the differential run failed (see its output above)")
}
