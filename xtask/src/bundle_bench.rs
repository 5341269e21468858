//! The benchmark part of the GPU bundle: the release build of `memory/benches/custody_vs_raw`,
//! `bench/python_bench.py` and `bench_run.py`, which `run.py --bench` uses to run both against
//! the real driver and write their JSON into the results folder (for `cargo xtask bench
//! --from-results`).

use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use serde_json::{json, Value};

use crate::cmd;

/// The Rust benchmark target (in package `memory`).
const RUST_BENCH: &str = "custody_vs_raw";

/// Builds the benchmark binary and copies it, the Python benchmark and the bench runner into
/// `bundle`. Returns the manifest's `bench` entry.
pub fn add_to_bundle(root: &Path, bundle: &Path) -> Result<Value> {
    let binary = build_rust_bench()?;
    fs::create_dir_all(bundle.join("bench"))?;
    let copy = |from: &Path, to: &str| -> Result<()> {
        fs::copy(from, bundle.join(to))
            .with_context(|| format!("copying {} into the bundle", from.display()))?;
        Ok(())
    };
    copy(&binary, &format!("bench/{RUST_BENCH}"))?;
    copy(&root.join("bench/python_bench.py"), "bench/python_bench.py")?;
    copy(&root.join("xtask/bundle/bench_run.py"), "bench_run.py")?;
    Ok(json!({
        "rust": format!("bench/{RUST_BENCH}"),
        "python": "bench/python_bench.py",
    }))
}

/// `cargo bench --no-run -p cuda-custody-memory --bench custody_vs_raw`; returns the executable.
fn build_rust_bench() -> Result<PathBuf> {
    let mut command = cmd::cargo();
    command
        .args([
            "bench",
            "--no-run",
            "-p",
            cmd::MEMORY_PACKAGE,
            "--bench",
            RUST_BENCH,
            "--message-format=json-render-diagnostics",
        ])
        // As for the test binaries: no debug info, so the bundle stays small.
        .env("CARGO_PROFILE_BENCH_DEBUG", "0")
        .env("CARGO_PROFILE_BENCH_STRIP", "debuginfo");
    let mut executable = None;
    cmd::cargo_artifacts(&mut command, "cargo bench --no-run", |message| {
        if message["target"]["name"] == RUST_BENCH {
            if let Some(path) = message["executable"].as_str() {
                executable = Some(PathBuf::from(path));
            }
        }
        Ok(())
    })?;
    executable.context("cargo built no custody_vs_raw executable")
}
