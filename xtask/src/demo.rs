//! `cargo xtask demo`: the stream hand-off example, in Rust (`memory/examples/handoff.rs`) and in
//! Python (`examples/handoff.py`), on a real GPU when one is usable here and on the emulated
//! driver otherwise, saying which.
//!
//! The driver is chosen once for both: `--emulator` forces the emulator; a `CUSTODY_CUDA_DRIVER`
//! already set in the environment is used as it is; otherwise the Rust example's
//! `--probe-driver` mode tries the system driver (`libcuda.so.1`) with the variable unset, and
//! when that finds no device the emulator is built and the variable points at it.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{bail, Context, Result};

use crate::cmd::{self, DRIVER_ENV};

/// The Rust example's name (`memory/examples/handoff.rs`).
const RUST_EXAMPLE: &str = "handoff";
/// The Python example, relative to the workspace root.
const PYTHON_EXAMPLE: &str = "examples/handoff.py";

/// The driver both examples run against.
struct Driver {
    /// `CUSTODY_CUDA_DRIVER` for the examples; `None` leaves it unset (the system driver).
    library: Option<PathBuf>,
    /// One line for the summary: what it is and why it was chosen.
    description: String,
}

/// How one example ended.
enum Outcome {
    /// Exit status 0; the example's last line when it says it skipped something.
    Passed(Option<String>),
    Failed(String),
    Skipped(String),
}

/// Runs `cargo xtask demo [--emulator]`.
pub fn run(args: &[String]) -> Result<()> {
    let force_emulator = match args {
        [] => false,
        [flag] if flag == "--emulator" => true,
        _ => bail!("usage: cargo xtask demo [--emulator] (got {args:?})"),
    };
    let root = cmd::workspace_root();
    let target_dir = cmd::target_dir(&cmd::metadata()?)?;

    let example = cmd::cargo_build(
        &["-p", cmd::MEMORY_PACKAGE, "--example", RUST_EXAMPLE],
        "the Rust example",
        target_dir.join("debug/examples").join(RUST_EXAMPLE),
    )?;

    let driver = choose_driver(&example, &target_dir, force_emulator)?;
    eprintln!("xtask demo: driver: {}", driver.description);

    println!();
    let rust = run_example(&mut Command::new(&example), &driver, &root);
    println!();
    let python = python_example(&root, &driver);

    println!();
    println!("xtask demo summary:");
    println!("  driver  {}", driver.description);
    let mut failed = 0;
    for (name, how, outcome) in [
        ("rust", relative(&example, &root), &rust),
        ("python", format!("{PYTHON_EXAMPLE} in .venv"), &python),
    ] {
        let verdict = match outcome {
            Outcome::Passed(None) => "passed".to_owned(),
            Outcome::Passed(Some(note)) => format!("passed, but: {note}"),
            Outcome::Failed(why) => {
                failed += 1;
                format!("FAILED ({why})")
            }
            Outcome::Skipped(why) => format!("skipped ({why})"),
        };
        println!("  {name:<7} {verdict} [{how}]");
    }
    println!(
        "  side by side with cuda.core 1.2 (on a GPU host): python3 examples/differential.py \
         (README.md)"
    );
    if failed > 0 {
        bail!("{failed} example(s) failed");
    }
    Ok(())
}

/// Picks the driver: forced emulator, the caller's `CUSTODY_CUDA_DRIVER`, a real driver with a
/// device, or the emulator as the fallback.
fn choose_driver(example: &Path, target_dir: &Path, force_emulator: bool) -> Result<Driver> {
    let emulator = |why: String| -> Result<Driver> {
        let library = crate::test::build_emulator(target_dir)?;
        Ok(Driver {
            description: format!("emulated driver {} ({why})", library.display()),
            library: Some(library),
        })
    };
    if force_emulator {
        return emulator("--emulator".to_owned());
    }
    if let Some(library) = std::env::var_os(DRIVER_ENV).filter(|v| !v.is_empty()) {
        let library = PathBuf::from(library);
        return Ok(Driver {
            description: format!(
                "{} (from {DRIVER_ENV} in the environment; unset it to let the demo choose)",
                library.display()
            ),
            library: Some(library),
        });
    }
    let mut probe = Command::new(example);
    probe.arg("--probe-driver").env_remove(DRIVER_ENV);
    eprintln!("$ {}", cmd::display(&probe));
    let output = probe
        .output()
        .with_context(|| format!("could not run {} --probe-driver", example.display()))?;
    let said = String::from_utf8_lossy(&output.stdout).trim().to_owned();
    if output.status.success() {
        return Ok(Driver {
            library: None,
            description: said,
        });
    }
    eprintln!("xtask demo: {said}");
    let reason = if said.contains("cannot open shared object file") {
        "no CUDA driver is installed on this machine".to_owned()
    } else {
        format!("no usable CUDA device: {said}")
    };
    emulator(reason)
}

/// Runs one example with the chosen driver, passing its output through line by line and
/// keeping its last line for the summary.
fn run_example(command: &mut Command, driver: &Driver, root: &Path) -> Outcome {
    command.current_dir(root).stdout(Stdio::piped());
    match &driver.library {
        Some(library) => command.env(DRIVER_ENV, library),
        None => command.env_remove(DRIVER_ENV),
    };
    eprintln!("$ {}", cmd::display(command));
    let mut child = match command.spawn() {
        Ok(child) => child,
        Err(error) => return Outcome::Failed(format!("could not start it: {error}")),
    };
    let mut last = String::new();
    if let Some(stdout) = child.stdout.take() {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            println!("{line}");
            if !line.trim().is_empty() {
                last = line;
            }
        }
    }
    match child.wait() {
        Ok(exit) if exit.success() => {
            Outcome::Passed(last.contains("skipped").then(|| last.trim().to_owned()))
        }
        Ok(exit) => Outcome::Failed(exit.to_string()),
        Err(error) => Outcome::Failed(error.to_string()),
    }
}

/// The Python example in `.venv`, with pybind built into it as `cargo xtask test` does.
fn python_example(root: &Path, driver: &Driver) -> Outcome {
    if !root.join("pybind/pyproject.toml").is_file() {
        return Outcome::Skipped("pybind/pyproject.toml does not exist yet".to_owned());
    }
    let installed = cmd::metadata()
        .and_then(|metadata| cmd::target_dir(&metadata))
        .and_then(|target_dir| crate::test::install_test_wheel(root, &target_dir));
    match installed {
        Ok((_, python)) => {
            let mut command = crate::venv::in_venv(root, python);
            command.arg(PYTHON_EXAMPLE);
            run_example(&mut command, driver, root)
        }
        Err(error) => Outcome::Failed(format!("{error:#}")),
    }
}

fn relative(path: &Path, root: &Path) -> String {
    path.strip_prefix(root)
        .unwrap_or(path)
        .display()
        .to_string()
}
