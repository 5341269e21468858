//! The project's Python virtual environment (`.venv`): creating it with the tools the Python
//! suites need, and running commands inside it.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result};

use crate::cmd;

/// The virtual environment's interpreter, creating `.venv` and installing maturin, pytest,
/// hypothesis (the property-based tests, `pybind/tests/test_fuzz.py`) and NumPy (the
/// `StridedMemoryView` tests, `pybind/tests/test_strided_memory_view.py`: its dtypes are NumPy's)
/// into it when missing.
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
    if !cmd::succeeds(&python, ["-c", "import numpy"]) {
        missing.push("numpy");
    }
    if !missing.is_empty() {
        cmd::run(
            Command::new(&python)
                .args(["-m", "pip", "install", "--quiet"])
                .args(&missing),
        )
        .context("installing maturin, pytest, hypothesis and numpy into .venv")?;
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
