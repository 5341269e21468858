//! The command line itself: what a newcomer types first.

use std::process::Command;

/// `cargo xtask COMMAND --help` prints the usage and exits 0 without doing the command's work,
/// for each command whose arguments xtask reads (`foreign-tests` and `bench` have their own
/// help; `gpu-test` hands its arguments to `run.py`).
#[test]
fn every_command_answers_help_with_the_usage() {
    for command in ["test", "wheel", "gpu-bundle", "demo"] {
        for flag in ["--help", "-h"] {
            let out = Command::new(env!("CARGO_BIN_EXE_xtask"))
                .args([command, flag])
                .output()
                .expect("xtask runs");
            let stdout = String::from_utf8_lossy(&out.stdout);
            assert!(
                out.status.success(),
                "`xtask {command} {flag}` failed: {:?}\n{}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            );
            assert!(
                stdout.starts_with("usage: cargo xtask <command>"),
                "`xtask {command} {flag}` printed {stdout:?}"
            );
        }
    }
}
