//! Running cargo and other programs: echoing each command, checking its exit status, and
//! reading `cargo metadata`.

use std::ffi::OsStr;
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Command, ExitStatus, Stdio};

use anyhow::{bail, Context, Result};
use serde_json::Value;

/// The environment variable the driver loader reads (cuda-sys's `DRIVER_ENV`; xtask does not
/// depend on cuda-sys, so the name is repeated here).
pub const DRIVER_ENV: &str = "CUSTODY_CUDA_DRIVER";

/// The emulated driver's package (folder `cuda-emu/`, library `libcuda_emu.so`).
pub const EMU_PACKAGE: &str = "cuda-custody-emu";

/// PyTorch's pluggable allocator over custody (`torch-allocator/`), a C-ABI library.
pub const TORCH_PACKAGE: &str = "cuda-custody-torch";

/// The file the torch allocator's package builds (`<target>/<profile>/libcustody_torch.so`).
pub const TORCH_FILE: &str = "libcustody_torch.so";

/// The environment variable `custody.interop` reads the torch allocator's path from.
pub const TORCH_ENV: &str = "CUSTODY_TORCH_ALLOCATOR";
/// The memory crate's package (folder `memory/`): the hand-off demo and the benchmarks.
pub const MEMORY_PACKAGE: &str = "cuda-custody-memory";

/// The facade's package (folder `custody/`).
pub const FACADE_PACKAGE: &str = "cuda-custody";
/// The facade's new-user program (`custody/examples/first_program.rs`), run by `cargo xtask
/// test` on the emulator and by the GPU bundle on the real driver.
pub const FIRST_PROGRAM: &str = "first_program";
/// The facade's cudarc example (`custody/examples/cudarc_interop.rs`, `cudarc` feature): a
/// kernel launch on a real GPU, a stated skip on the emulator.
pub const CUDARC_EXAMPLE: &str = "cudarc_interop";

/// The workspace root (the folder above `xtask/`).
///
/// `cargo xtask` (`cargo run`) sets `CARGO_MANIFEST_DIR` for the process, so the root is read at
/// run time; the compile-time value is only a fallback. A binary built by another checkout that
/// shares the target directory must not send this one's commands to that checkout.
pub fn workspace_root() -> PathBuf {
    let manifest_dir = std::env::var_os("CARGO_MANIFEST_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")));
    manifest_dir
        .parent()
        .expect("xtask lives one level below the workspace root")
        .to_path_buf()
}

/// A `cargo` command run from the workspace root, using the same cargo that runs xtask.
pub fn cargo() -> Command {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut command = Command::new(cargo);
    command.current_dir(workspace_root());
    command
}

/// The command line as one printable string.
pub fn display(command: &Command) -> String {
    let mut parts = vec![command.get_program().to_string_lossy().into_owned()];
    parts.extend(command.get_args().map(|a| a.to_string_lossy().into_owned()));
    let envs: Vec<String> = command
        .get_envs()
        .filter_map(|(k, v)| Some(format!("{}={}", k.to_string_lossy(), v?.to_string_lossy())))
        .collect();
    if envs.is_empty() {
        parts.join(" ")
    } else {
        format!("{} {}", envs.join(" "), parts.join(" "))
    }
}

/// Runs `command` with inherited stdio and returns its exit status (echoing it first).
pub fn status(command: &mut Command) -> Result<ExitStatus> {
    eprintln!("$ {}", display(command));
    command
        .status()
        .with_context(|| format!("could not start `{}`", display(command)))
}

/// Runs `command` and fails unless it exits 0.
pub fn run(command: &mut Command) -> Result<()> {
    let exit = status(command)?;
    if !exit.success() {
        bail!("`{}` failed ({exit})", display(command));
    }
    Ok(())
}

/// Runs `command` with its output captured and returns its stdout; fails, with its stderr,
/// unless it exits 0. `what` names the command in the errors.
pub fn stdout_of(command: &mut Command, what: &str) -> Result<Vec<u8>> {
    let output = command
        .output()
        .with_context(|| format!("could not run {what}"))?;
    if !output.status.success() {
        bail!("{what} failed: {}", String::from_utf8_lossy(&output.stderr));
    }
    Ok(output.stdout)
}

/// Runs the cargo build `command`, which prints JSON messages (`--message-format=json...`),
/// echoing it first, and hands each `compiler-artifact` message to `artifact` as cargo prints
/// it; fails when cargo fails or `artifact` does. `what` names the build in the errors.
pub fn cargo_artifacts(
    command: &mut Command,
    what: &str,
    mut artifact: impl FnMut(&Value) -> Result<()>,
) -> Result<()> {
    command.stdout(Stdio::piped());
    eprintln!("$ {}", display(command));
    let mut child = command
        .spawn()
        .with_context(|| format!("could not start {what}"))?;
    let stdout = child.stdout.take().context("cargo's stdout")?;
    for line in BufReader::new(stdout).lines() {
        let Ok(message) = serde_json::from_str::<Value>(&line?) else {
            continue;
        };
        if message["reason"] == "compiler-artifact" {
            artifact(&message)?;
        }
    }
    let exit = child.wait()?;
    if !exit.success() {
        bail!("{what} failed ({exit})");
    }
    Ok(())
}

/// Runs `cargo build ARGS` and returns `artifact`, the file it makes; fails, naming `what` it
/// builds, when cargo fails or the file is not there.
pub fn cargo_build(args: &[&str], what: &str, artifact: PathBuf) -> Result<PathBuf> {
    run(cargo().arg("build").args(args)).with_context(|| format!("building {what}"))?;
    if !artifact.is_file() {
        bail!(
            "cargo built {what} but {} does not exist",
            artifact.display()
        );
    }
    Ok(artifact)
}

/// Whether `program args...` runs and exits 0 (output discarded).
pub fn succeeds<I, S>(program: impl AsRef<OsStr>, args: I) -> bool
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    Command::new(program)
        .args(args)
        .current_dir(workspace_root())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// `cargo metadata --no-deps --format-version 1` (no resolution, no download).
pub fn metadata() -> Result<Value> {
    let stdout = stdout_of(
        cargo().args(["metadata", "--no-deps", "--format-version", "1"]),
        "cargo metadata",
    )?;
    serde_json::from_slice(&stdout).context("cargo metadata printed malformed JSON")
}

/// The target directory cargo builds into (honours `CARGO_TARGET_DIR`).
pub fn target_dir(metadata: &Value) -> Result<PathBuf> {
    metadata["target_directory"]
        .as_str()
        .map(PathBuf::from)
        .context("cargo metadata has no target_directory")
}

/// The emulated driver's file name in a target profile folder.
pub const EMULATOR_FILE: &str = "libcuda_emu.so";

/// Packages whose tests do not belong on a GPU host: xtask's need cargo; cuda-emu's test the
/// emulator itself, which the conformance suite's emulator column already covers; the test
/// support crate has none.
const EXCLUDED_PACKAGES: &[&str] = &["xtask", EMU_PACKAGE, "cuda-custody-test-support"];

/// The workspace members (except [`EXCLUDED_PACKAGES`]) and the `--features` that turn on each
/// one's `gpu` feature.
pub fn gpu_selection(metadata: &Value) -> Result<(Vec<String>, Vec<String>)> {
    let members: Vec<&str> = metadata["workspace_members"]
        .as_array()
        .context("cargo metadata has no workspace_members")?
        .iter()
        .filter_map(Value::as_str)
        .collect();
    let mut packages = Vec::new();
    let mut features = Vec::new();
    for package in metadata["packages"].as_array().into_iter().flatten() {
        let (Some(id), Some(name)) = (package["id"].as_str(), package["name"].as_str()) else {
            continue;
        };
        if !members.contains(&id) || EXCLUDED_PACKAGES.contains(&name) {
            continue;
        }
        if package["features"].get("gpu").is_some() {
            features.push(format!("{name}/gpu"));
        }
        packages.push(name.to_owned());
    }
    Ok((packages, features))
}
