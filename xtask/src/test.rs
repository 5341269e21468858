//! `cargo xtask test`: builds the emulated driver, then runs every Rust test of the workspace, the
//! doctests (every doc example runs on the emulator), the facade's new-user program, `cargo doc`
//! with warnings denied and (once `pybind/` exists) the pytest suite and the install check
//! against it, and prints one summary line per suite.
//!
//! The Python package is built once, as the portable wheel `cargo xtask wheel` builds (debug
//! profile; its glibc floor checked), and that one wheel is both installed into `.venv` for
//! pytest and installed by pip into a fresh virtual environment for the install check
//! (`pybind/smoke/installed_wheel.py`), so that a wheel missing its extension, stubs, `py.typed`
//! or metadata fails here.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};

use crate::cmd::{self, DRIVER_ENV, EMULATOR_FILE};
use crate::venv::{in_venv, venv_python};

/// How one suite ended.
enum Outcome {
    Passed,
    Failed(String),
    Skipped(String),
}

impl Outcome {
    /// Runs `command`: passed when it exits 0, failed with its exit status otherwise.
    fn of(command: &mut Command) -> Result<Outcome> {
        let exit = cmd::status(command)?;
        Ok(if exit.success() {
            Outcome::Passed
        } else {
            Outcome::Failed(exit.to_string())
        })
    }
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
    let target_dir = cmd::target_dir(&metadata)?;
    let emulator = build_emulator(&target_dir)?;
    eprintln!("xtask test: {DRIVER_ENV}={}", emulator.display());

    let mut suites = vec![
        rust_suite(&emulator)?,
        doc_suite(&emulator)?,
        example_suite(&emulator)?,
        rustdoc_suite()?,
        gpu_build_suite(&metadata)?,
    ];
    suites.extend(python_suites(&root, &emulator, &target_dir));

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
        println!("  {:<9} {verdict} [{}]", suite.name, suite.how);
    }
    println!("suites: {passed} passed, {failed} failed, {skipped} skipped");
    if failed > 0 {
        bail!("{failed} suite(s) failed");
    }
    Ok(())
}

/// `cargo build -p cuda-custody-emu`; returns the absolute path of `target/debug/libcuda_emu.so`.
pub fn build_emulator(target_dir: &Path) -> Result<PathBuf> {
    let emulator = cmd::cargo_build(
        &["-p", cmd::EMU_PACKAGE],
        "the emulated driver (cuda-emu, a cdylib named cuda_emu)",
        target_dir.join("debug").join(EMULATOR_FILE),
    )?;
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
    let outcome = Outcome::of(&mut command)?;
    Ok(Suite {
        name: "rust",
        how,
        outcome,
    })
}

/// The doc examples, which nextest does not run: `cargo test --workspace --doc` against the
/// emulator, with the facade's `cudarc` feature on. cudarc loads `libcuda.so` (or
/// `libcuda.so.1`) from the library path itself, so a folder whose two names link to the
/// emulator goes first on `LD_LIBRARY_PATH`: the process then loads the emulator once, and
/// custody's and cudarc's handles name the same driver's objects.
fn doc_suite(emulator: &Path) -> Result<Suite> {
    let libcuda = emulator
        .parent()
        .context("the emulator's folder")?
        .join("libcuda-emu");
    std::fs::create_dir_all(&libcuda)?;
    for name in ["libcuda.so", "libcuda.so.1"] {
        let link = libcuda.join(name);
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(emulator, &link)
            .with_context(|| format!("linking {} to {}", link.display(), emulator.display()))?;
    }
    let mut paths = vec![libcuda];
    if let Some(inherited) = std::env::var_os("LD_LIBRARY_PATH") {
        paths.extend(std::env::split_paths(&inherited));
    }
    let mut command = cmd::cargo();
    command
        .args([
            "test",
            "--workspace",
            "--doc",
            "--no-fail-fast",
            "--features",
        ])
        .arg(format!("{}/cudarc", cmd::FACADE_PACKAGE))
        .env(DRIVER_ENV, emulator)
        .env("LD_LIBRARY_PATH", std::env::join_paths(paths)?);
    let outcome = Outcome::of(&mut command)?;
    Ok(Suite {
        name: "doctest",
        how: format!(
            "cargo test --workspace --doc --features {}/cudarc (cudarc's libcuda.so: the emulator)",
            cmd::FACADE_PACKAGE
        ),
        outcome,
    })
}

/// The facade's examples on the emulator: the new-user program
/// (`custody/examples/first_program.rs`), which checks what it shows and exits non-zero when a
/// check fails, and the cudarc one (built with the `cudarc` feature; it says it skipped its
/// kernel launch, which is not emulated).
fn example_suite(emulator: &Path) -> Result<Suite> {
    let mut failed = Vec::new();
    for (example, features) in [
        (cmd::FIRST_PROGRAM, None),
        (cmd::CUDARC_EXAMPLE, Some("cudarc")),
    ] {
        let mut command = cmd::cargo();
        command.args(["run", "--quiet", "-p", cmd::FACADE_PACKAGE]);
        if let Some(features) = features {
            command.args(["--features", features]);
        }
        command
            .args(["--example", example])
            .env(DRIVER_ENV, emulator);
        let exit = cmd::status(&mut command)?;
        if !exit.success() {
            failed.push(format!("{example}: {exit}"));
        }
    }
    let outcome = if failed.is_empty() {
        Outcome::Passed
    } else {
        Outcome::Failed(failed.join("; "))
    };
    Ok(Suite {
        name: "example",
        how: format!(
            "cargo run -p {} --example {} (and --features cudarc --example {})",
            cmd::FACADE_PACKAGE,
            cmd::FIRST_PROGRAM,
            cmd::CUDARC_EXAMPLE
        ),
        outcome,
    })
}

/// `cargo doc --workspace --no-deps` with warnings denied: every intra-doc link resolves and
/// every doc comment parses.
fn rustdoc_suite() -> Result<Suite> {
    let mut command = cmd::cargo();
    command
        .args(["doc", "--workspace", "--no-deps", "--quiet", "--features"])
        .arg(format!("{}/cudarc", cmd::FACADE_PACKAGE))
        .env("RUSTDOCFLAGS", "-D warnings");
    let outcome = Outcome::of(&mut command)?;
    Ok(Suite {
        name: "rustdoc",
        how: "cargo doc --workspace --no-deps (custody's cudarc feature on), RUSTDOCFLAGS=-D warnings"
            .to_owned(),
        outcome,
    })
}

/// `cargo check --tests` of the GPU bundle's packages with their `gpu` features: the tests that
/// run only on a GPU host are compiled here too, so that a change of an API they call is caught
/// before a bundle is built (`cargo xtask gpu-bundle`). Checked, not run: they need a real driver.
fn gpu_build_suite(metadata: &serde_json::Value) -> Result<Suite> {
    let (packages, features) = cmd::gpu_selection(metadata)?;
    let mut command = cmd::cargo();
    command.args(["check", "--tests", "--quiet"]);
    for package in &packages {
        command.args(["-p", package]);
    }
    if !features.is_empty() {
        command.args(["--features", &features.join(",")]);
    }
    let outcome = Outcome::of(&mut command)?;
    Ok(Suite {
        name: "gpu-build",
        how: format!(
            "cargo check --tests of the GPU bundle's packages with {} (compiled, not run: a GPU host runs them)",
            features.join(",")
        ),
        outcome,
    })
}

/// Where `cargo xtask test` builds its (debug) wheel, under the target directory.
const TEST_WHEEL_DIR: &str = "wheels-debug";

/// The install check's virtual environment, under the target directory (made anew every run).
const INSTALL_CHECK_VENV: &str = "install-check-venv";

/// The install check's program, relative to the workspace root.
pub const INSTALL_CHECK: &str = "pybind/smoke/installed_wheel.py";

/// The pytest suite and the install check, sharing one wheel.
fn python_suites(root: &Path, emulator: &Path, target_dir: &Path) -> Vec<Suite> {
    let pytest_how = "pytest pybind/tests in .venv (the debug wheel installed)".to_owned();
    let install_how = format!("pip install of the wheel into a fresh venv, then {INSTALL_CHECK}");
    let both = |pytest: Outcome, install: Outcome| {
        vec![
            Suite {
                name: "pytest",
                how: pytest_how.clone(),
                outcome: pytest,
            },
            Suite {
                name: "install",
                how: install_how.clone(),
                outcome: install,
            },
        ]
    };
    if !root.join("pybind/pyproject.toml").is_file() {
        let why = "pybind/pyproject.toml does not exist yet";
        return both(
            Outcome::Skipped(why.to_owned()),
            Outcome::Skipped(why.to_owned()),
        );
    }
    let (wheel, python) = match install_test_wheel(root, target_dir) {
        Ok(built) => built,
        Err(error) => {
            let why = format!("building and installing the wheel: {error:#}");
            return both(Outcome::Failed(why.clone()), Outcome::Failed(why));
        }
    };
    let pytest = run_pytest(root, emulator, target_dir, &python)
        .unwrap_or_else(|error| Outcome::Failed(format!("{error:#}")));
    let install = install_check(
        root,
        Path::new("python3"),
        &wheel.path,
        &target_dir.join(INSTALL_CHECK_VENV),
        emulator,
    )
    .map_or_else(
        |error| Outcome::Failed(format!("{error:#}")),
        |()| Outcome::Passed,
    );
    both(pytest, install)
}

/// Makes a fresh virtual environment `venv` with `base_python`, installs `wheel` into it with
/// pip (no index: the package has no dependencies) and runs the install check there, isolated
/// from the source tree (`python -I`, run from inside the environment), against `driver`.
pub fn install_check(
    root: &Path,
    base_python: &Path,
    wheel: &Path,
    venv: &Path,
    driver: &Path,
) -> Result<()> {
    if venv.exists() {
        std::fs::remove_dir_all(venv).with_context(|| format!("removing {}", venv.display()))?;
    }
    cmd::run(Command::new(base_python).args(["-m", "venv"]).arg(venv))
        .context("creating the install check's virtual environment")?;
    let python = venv.join("bin/python");
    cmd::run(&mut pip_install_wheel(
        &python,
        "--disable-pip-version-check",
        wheel,
    ))
    .context("pip could not install the wheel into a fresh virtual environment")?;
    cmd::run(
        Command::new(&python)
            .arg("-I")
            .arg(root.join(INSTALL_CHECK))
            .current_dir(venv)
            .env(DRIVER_ENV, driver),
    )
    .context("the install check failed on the freshly installed wheel")
}

/// Builds the package's wheel as `cargo xtask test` does (`cargo xtask wheel`'s build in the
/// debug profile, into `target/wheels-debug/`) and installs it into `.venv` (replacing any
/// earlier build of the package), creating the environment when missing; returns the wheel and
/// the environment's interpreter.
pub fn install_test_wheel(
    root: &Path,
    target_dir: &Path,
) -> Result<(crate::wheel::Wheel, PathBuf)> {
    let mut wheels = crate::wheel::build(
        root,
        crate::wheel::Profile::Debug,
        &target_dir.join(TEST_WHEEL_DIR),
        None,
    )?;
    let wheel = wheels.remove(0);
    crate::wheel::print_wheel(&wheel);
    let python = venv_python(root)?;
    cmd::run(&mut pip_install_wheel(
        &python,
        "--force-reinstall",
        &wheel.path,
    ))
    .context("installing the wheel into .venv")?;
    Ok((wheel, python))
}

/// `python -m pip install` of the local `wheel` alone (no index: the package has no
/// dependencies), quietly, with one more pip option (`option`).
fn pip_install_wheel(python: &Path, option: &str, wheel: &Path) -> Command {
    let mut command = Command::new(python);
    command
        .args([
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-index",
            "--no-deps",
            option,
        ])
        .arg(wheel);
    command
}

/// pytest on the package installed in `.venv`, with the PyTorch allocator's library built
/// (debug) and named in `CUSTODY_TORCH_ALLOCATOR` for the tests that drive it from Python.
fn run_pytest(root: &Path, emulator: &Path, target_dir: &Path, python: &Path) -> Result<Outcome> {
    cmd::run(cmd::cargo().args(["build", "-p", cmd::TORCH_PACKAGE]))
        .context("building the PyTorch allocator's library")?;
    let exit = cmd::status(
        in_venv(root, python)
            .args(["-m", "pytest", "pybind/tests"])
            .env(DRIVER_ENV, emulator)
            .env(
                cmd::TORCH_ENV,
                target_dir.join("debug").join(cmd::TORCH_FILE),
            ),
    )?;
    Ok(match exit.code() {
        Some(0) => Outcome::Passed,
        // pytest's "no tests collected": a suite that tests nothing has not passed.
        Some(5) => Outcome::Failed("pytest collected no tests".to_owned()),
        _ => Outcome::Failed(exit.to_string()),
    })
}
