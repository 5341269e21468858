//! The GPU runner's parts that need no GPU (`xtask/bundle/run.py --self-test`): its parser of
//! compute-sanitizer's reports on recorded output, a run under a stand-in sanitizer, the hang
//! diagnostics' Python stacks of a hung Python process and the child it spawned, and the parts
//! a bounded call runs (`--tests-only`, `--pytest-only`) on a stand-in bundle, their rows and
//! logs written as each test ends (docs/testing.md, "When a test hangs", "Splitting a bundle
//! run across calls" and "Under compute-sanitizer").

use std::path::Path;
use std::process::Command;

#[test]
fn the_gpu_runner_passes_its_self_test() {
    let run = Path::new(env!("CARGO_MANIFEST_DIR")).join("bundle/run.py");
    let output = Command::new("python3")
        .arg("-B")
        .arg(&run)
        .arg("--self-test")
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .output()
        .expect("python3 runs (CI has Python 3.11)");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success() && stdout.contains("run.py self-test: passed"),
        "{}{}",
        stdout,
        String::from_utf8_lossy(&output.stderr)
    );
}
