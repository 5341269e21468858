//! `cargo xtask test`: builds the emulated driver, then runs every Rust test of the workspace, the
//! doctests (every doc example runs on the emulator), the facade's new-user program, `cargo doc`
//! with warnings denied and (once
//! `pybind/` exists) the pytest suite against it, and prints one summary line per suite.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};

use crate::cmd::{self, DRIVER_ENV, EMULATOR_FILE};

/// How one suite ended.
enum Outcome {
    Passed,
    Failed(String),
    Skipped(String),
}

struct Suite {
    name: &'static str,
    how: String,
    outcome: Outcome,
}

/// Runs `cargo xtask test`.
pub fn run() -> Result<()> {
    let root = cmd::workspace_root();
    let metadata = cmd::metadata()?;
    let emulator = build_emulator(&cmd::target_dir(&metadata)?)?;
    eprintln!("xtask test: {DRIVER_ENV}={}", emulator.display());

    let suites = vec![
        rust_suite(&emulator)?,
        doc_suite(&emulator)?,
        example_suite(&emulator)?,
        rustdoc_suite()?,
        python_suite(&root, &emulator)?,
    ];

    println!();
    println!("xtask test summary:");
    let (mut passed, mut failed, mut skipped) = (0, 0, 0);
    for suite in &suites {
        let verdict = match &suite.outcome {
            Outcome::Passed => {
                passed += 1;
                "passed".to_owned()
            }
            Outcome::Failed(why) => {
                failed += 1;
                format!("FAILED ({why})")
            }
            Outcome::Skipped(why) => {
                skipped += 1;
                format!("skipped ({why})")
            }
        };
        println!("  {:<7} {verdict} [{}]", suite.name, suite.how);
    }
    println!("suites: {passed} passed, {failed} failed, {skipped} skipped");
    if failed > 0 {
        bail!("{failed} suite(s) failed");
    }
    Ok(())
}

/// `cargo build -p cuda-custody-emu`; returns the absolute path of `target/debug/libcuda_emu.so`.
pub fn build_emulator(target_dir: &Path) -> Result<PathBuf> {
    cmd::run(cmd::cargo().args(["build", "-p", cmd::EMU_PACKAGE]))
        .context("building the emulated driver (cuda-emu)")?;
    let emulator = target_dir.join("debug").join(EMULATOR_FILE);
    if !emulator.is_file() {
        bail!(
            "cargo built cuda-emu but {} does not exist (is cuda-emu a cdylib named cuda_emu?)",
            emulator.display()
        );
    }
    Ok(emulator.canonicalize()?)
}

fn rust_suite(emulator: &Path) -> Result<Suite> {
    let nextest = cmd::succeeds(
        std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()),
        ["nextest", "--version"],
    );
    let mut command = cmd::cargo();
    let how = if nextest {
        command.args(["nextest", "run", "--workspace", "--no-fail-fast"]);
        "cargo nextest run --workspace".to_owned()
    } else {
        eprintln!(
            "xtask test: cargo-nextest is not installed; falling back to \
             `cargo test --workspace -- --test-threads=1` (install it with `cargo install cargo-nextest`)"
        );
        command.args([
            "test",
            "--workspace",
            "--no-fail-fast",
            "--",
            "--test-threads=1",
        ]);
        "cargo test --workspace -- --test-threads=1 (cargo-nextest not found)".to_owned()
    };
    command.env(DRIVER_ENV, emulator);
    let exit = cmd::status(&mut command)?;
    let outcome = if exit.success() {
        Outcome::Passed
    } else {
        Outcome::Failed(exit.to_string())
    };
    Ok(Suite {
        name: "rust",
        how,
        outcome,
    })
}

/// The doc examples, which nextest does not run: `cargo test --workspace --doc` against the
/// emulator.
fn doc_suite(emulator: &Path) -> Result<Suite> {
    let mut command = cmd::cargo();
    command
        .args(["test", "--workspace", "--doc", "--no-fail-fast"])
        .env(DRIVER_ENV, emulator);
    let exit = cmd::status(&mut command)?;
    let outcome = if exit.success() {
        Outcome::Passed
    } else {
        Outcome::Failed(exit.to_string())
    };
    Ok(Suite {
        name: "doctest",
        how: "cargo test --workspace --doc".to_owned(),
        outcome,
    })
}

/// The facade's new-user program (`custody/examples/first_program.rs`), which checks what it
/// shows and exits non-zero when a check fails: run on the emulator.
fn example_suite(emulator: &Path) -> Result<Suite> {
    let mut command = cmd::cargo();
    command
        .args(["run", "--quiet", "-p", cmd::FACADE_PACKAGE, "--example"])
        .arg(cmd::FIRST_PROGRAM)
        .env(DRIVER_ENV, emulator);
    let exit = cmd::status(&mut command)?;
    let outcome = if exit.success() {
        Outcome::Passed
    } else {
        Outcome::Failed(exit.to_string())
    };
    Ok(Suite {
        name: "example",
        how: format!(
            "cargo run -p {} --example {}",
            cmd::FACADE_PACKAGE,
            cmd::FIRST_PROGRAM
        ),
        outcome,
    })
}

/// `cargo doc --workspace --no-deps` with warnings denied: every intra-doc link resolves and
/// every doc comment parses.
fn rustdoc_suite() -> Result<Suite> {
    let mut command = cmd::cargo();
    command
        .args(["doc", "--workspace", "--no-deps", "--quiet"])
        .env("RUSTDOCFLAGS", "-D warnings");
    let exit = cmd::status(&mut command)?;
    let outcome = if exit.success() {
        Outcome::Passed
    } else {
        Outcome::Failed(exit.to_string())
    };
    Ok(Suite {
        name: "rustdoc",
        how: "cargo doc --workspace --no-deps, RUSTDOCFLAGS=-D warnings".to_owned(),
        outcome,
    })
}

fn python_suite(root: &Path, emulator: &Path) -> Result<Suite> {
    let how = "pytest pybind/tests in .venv".to_owned();
    if !root.join("pybind/pyproject.toml").is_file() {
        return Ok(Suite {
            name: "pytest",
            how,
            outcome: Outcome::Skipped("pybind/pyproject.toml does not exist yet".to_owned()),
        });
    }
    let outcome = match run_pytest(root, emulator) {
        Ok(outcome) => outcome,
        Err(error) => Outcome::Failed(format!("{error:#}")),
    };
    Ok(Suite {
        name: "pytest",
        how,
        outcome,
    })
}

/// The virtual environment's interpreter, creating `.venv` and installing maturin, pytest and
/// hypothesis (the property-based tests, `pybind/tests/test_fuzz.py`) into it when missing.
pub fn venv_python(root: &Path) -> Result<PathBuf> {
    let venv = root.join(".venv");
    let python = venv.join("bin/python");
    if !python.is_file() {
        cmd::run(Command::new("python3").arg("-m").arg("venv").arg(&venv))
            .context("creating .venv (on Debian: apt-get install python3-venv)")?;
    }
    let mut missing = Vec::new();
    if !venv.join("bin/maturin").is_file() {
        missing.push("maturin");
    }
    if !cmd::succeeds(&python, ["-c", "import pytest"]) {
        missing.push("pytest");
    }
    if !cmd::succeeds(&python, ["-c", "import hypothesis"]) {
        missing.push("hypothesis");
    }
    if !missing.is_empty() {
        cmd::run(
            Command::new(&python)
                .args(["-m", "pip", "install", "--quiet"])
                .args(&missing),
        )
        .context("installing maturin, pytest and hypothesis into .venv")?;
    }
    Ok(python)
}

/// A command run inside `.venv` (as if activated).
pub fn in_venv(root: &Path, program: impl AsRef<std::ffi::OsStr>) -> Command {
    let venv = root.join(".venv");
    let mut path = std::ffi::OsString::from(venv.join("bin"));
    if let Some(old) = std::env::var_os("PATH") {
        path.push(":");
        path.push(old);
    }
    let mut command = Command::new(program);
    command
        .current_dir(root)
        .env("VIRTUAL_ENV", &venv)
        .env("PATH", path);
    command
}

/// Builds pybind and installs it into `.venv` (`maturin develop`), creating the environment
/// when missing; returns the environment's interpreter.
pub fn develop_pybind(root: &Path) -> Result<PathBuf> {
    let python = venv_python(root)?;
    let maturin = root.join(".venv/bin/maturin");
    cmd::run(in_venv(root, &maturin).args(["develop", "--manifest-path", "pybind/Cargo.toml"]))
        .context("building and installing pybind with maturin develop")?;
    Ok(python)
}

fn run_pytest(root: &Path, emulator: &Path) -> Result<Outcome> {
    let python = develop_pybind(root)?;
    let exit = cmd::status(
        in_venv(root, &python)
            .args(["-m", "pytest", "pybind/tests"])
            .env(DRIVER_ENV, emulator),
    )?;
    Ok(match exit.code() {
        Some(0) => Outcome::Passed,
        // pytest's "no tests collected": a suite that tests nothing has not passed.
        Some(5) => Outcome::Failed("pytest collected no tests".to_owned()),
        _ => Outcome::Failed(exit.to_string()),
    })
}
