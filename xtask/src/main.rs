//! `cargo xtask`: the project's chores as one Rust program (rust-analyzer's pattern).
//!
//! - `cargo xtask test`: every test on this machine, against the emulated driver.
//! - `cargo xtask gpu-bundle`: a self-contained folder of test binaries, the emulator and a
//!   Python runner for a GPU host that has no Rust toolchain.
//! - `cargo xtask gpu-test`: the bundle, built and run in place on a machine with a GPU.
//! - `cargo xtask demo`: the stream hand-off example in Rust and Python, on a real GPU when one
//!   is usable and on the emulated driver otherwise.
//! - `cargo xtask bench`: not built yet.
//!
//! Architecture invariant: xtask depends on no workspace crate; it drives `cargo`, `python3` and
//! the binaries they build, and fails loudly (non-zero exit) on any failure.

mod bundle;
mod cmd;
mod demo;
mod test;

use std::process::ExitCode;

const USAGE: &str = "\
usage: cargo xtask <command>

commands:
  test         build the emulated driver and run every test against it
               (cargo nextest, or cargo test when nextest is missing; then pytest if pybind exists)
  gpu-bundle   build gpu-bundle/: test binaries, the emulated driver and run.py for a GPU host
  gpu-test     build the bundle and run it here (needs a GPU); arguments go to run.py
  demo         the stream hand-off example in Rust and Python: on a real GPU when one is usable,
               else on the emulated driver (says which); --emulator forces the emulator
  bench        the benchmarks (not built yet)";

fn main() -> ExitCode {
    let mut args = std::env::args().skip(1);
    let Some(command) = args.next() else {
        eprintln!("{USAGE}");
        return ExitCode::from(2);
    };
    let rest: Vec<String> = args.collect();
    let outcome = match command.as_str() {
        "test" => no_arguments(&command, &rest).and_then(|()| test::run()),
        "gpu-bundle" => no_arguments(&command, &rest).and_then(|()| bundle::build().map(|_| ())),
        "gpu-test" => bundle::run_in_place(&rest),
        "demo" => demo::run(&rest),
        "bench" => not_built("bench", "the benchmarks are"),
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

fn no_arguments(command: &str, rest: &[String]) -> anyhow::Result<()> {
    anyhow::ensure!(
        rest.is_empty(),
        "`cargo xtask {command}` takes no arguments (got {rest:?})"
    );
    Ok(())
}

/// `bench` exists as a command so that the README's commands are stable, but it fails until it
/// is built: a placeholder that "passes" would be a fake.
fn not_built(command: &str, what_is: &str) -> anyhow::Result<()> {
    anyhow::bail!(
        "{what_is} not built yet: `cargo xtask {command}` has nothing to run (planned; see README.md)"
    )
}
