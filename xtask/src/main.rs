//! `cargo xtask`: the project's chores as one Rust program (rust-analyzer's pattern).
//!
//! - `cargo xtask test`: every test on this machine, against the emulated driver.
//! - `cargo xtask wheel`: the Python package's portable manylinux wheels (abi3, and free-threaded
//!   when an interpreter is named), their tags and glibc floor checked by auditwheel.
//! - `cargo xtask gpu-bundle`: a self-contained folder of test binaries, the emulator and a
//!   Python runner for a GPU host that has no Rust toolchain.
//! - `cargo xtask gpu-test`: the bundle, built and run in place on a machine with a GPU.
//! - `cargo xtask demo`: the stream hand-off example in Rust and Python, on a real GPU when one
//!   is usable and on the emulated driver otherwise.
//! - `cargo xtask foreign-tests`: a pytest tree that uses the CUDA driver (cuda.core's test
//!   suite) run on the emulated driver and on a real one, outcomes side by side.
//! - `cargo xtask bench`: custody against the raw driver (Rust) and against cuda.core, CuPy and
//!   raw calls (Python), then `docs/benchmarks.md`; `--from-results DIR` renders a GPU run's JSON.
//!
//! Architecture invariant: xtask depends on no workspace crate; it drives `cargo`, `python3` and
//! the binaries they build, and fails loudly (non-zero exit) on any failure.

mod bench;
mod bundle;
mod bundle_bench;
mod cmd;
mod demo;
mod foreign;
mod test;
mod venv;
mod wheel;

use std::process::ExitCode;

const USAGE: &str = "\
usage: cargo xtask <command>

commands:
  test         build the emulated driver and run every test against it
               (cargo nextest, or cargo test when nextest is missing; then, if pybind exists,
               pytest and the install check of the wheel in a fresh venv)
  wheel        build the Python package's manylinux wheels into target/wheels/ (zig-linked for
               glibc 2.28, checked by maturin and auditwheel; twine check of the metadata) and
               print their tags and glibc floor; --free-threaded PYTHON (or
               CUSTODY_FREE_THREADED_PYTHON) adds a wheel for that free-threaded CPython;
               --debug, --out DIR
  gpu-bundle   build gpu-bundle/: test binaries, the emulated driver and run.py for a GPU host
  gpu-test     build the bundle and run it here (needs a GPU); arguments go to run.py
  demo         the stream hand-off example in Rust and Python: on a real GPU when one is usable,
               else on the emulated driver (says which); --emulator forces the emulator
  foreign-tests --tests DIR [--python PY | --venv DIR] [--preset cuda-core] [PATH ...]
               run a pytest tree that reaches the CUDA driver through libcuda.so.1 (NVIDIA's
               cuda.core tests) on the emulated driver and on the real one (when one loads; else
               says so), per test both outcomes and whether they agree; --real-results DIR
               compares with recorded JUnit XML; --help for the rest; results in
               target/foreign-tests/ (results.md, results.json)
  bench        custody against the raw driver, cuda.core and CuPy; regenerates docs/benchmarks.md
               (real driver if libcuda.so.1 has a device, else the emulator; says which)
               --emulator, --stub, --full|--quick, --no-python; --from-results DIR [--label NAME]
               renders a GPU run's JSON (run.py --bench); --render re-renders the stored runs;
               --help for the rest";

fn main() -> ExitCode {
    let mut args = std::env::args().skip(1);
    let Some(command) = args.next() else {
        eprintln!("{USAGE}");
        return ExitCode::from(2);
    };
    let rest: Vec<String> = args.collect();
    if asks_for_help(&command, &rest) {
        println!("{USAGE}");
        return ExitCode::SUCCESS;
    }
    let outcome = match command.as_str() {
        "test" => no_arguments(&command, &rest).and_then(|()| test::run()),
        "gpu-bundle" => no_arguments(&command, &rest).and_then(|()| bundle::build().map(|_| ())),
        "gpu-test" => bundle::run_in_place(&rest),
        "wheel" => wheel::run(&rest),
        "demo" => demo::run(&rest),
        "bench" => bench::run(&rest),
        "foreign-tests" => foreign::run(&rest),
        "help" | "-h" | "--help" => {
            println!("{USAGE}");
            Ok(())
        }
        other => {
            eprintln!("xtask: unknown command {other:?}\n\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("xtask {command}: error: {error:#}");
            ExitCode::FAILURE
        }
    }
}

/// `cargo xtask COMMAND --help` (or `-h`) prints the usage and does nothing else, for every
/// command whose arguments xtask reads itself: `foreign-tests` and `bench` print their own
/// longer help, and `gpu-test` hands its arguments to `run.py`.
fn asks_for_help(command: &str, rest: &[String]) -> bool {
    !matches!(command, "foreign-tests" | "bench" | "gpu-test")
        && rest.iter().any(|a| a == "-h" || a == "--help")
}

fn no_arguments(command: &str, rest: &[String]) -> anyhow::Result<()> {
    anyhow::ensure!(
        rest.is_empty(),
        "`cargo xtask {command}` takes no arguments (got {rest:?})"
    );
    Ok(())
}
