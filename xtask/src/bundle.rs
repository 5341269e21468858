//! `cargo xtask gpu-bundle` and `cargo xtask gpu-test`.
//!
//! The GPU host has Python 3.12 and a driver but no Rust toolchain, so the bundle carries
//! everything prebuilt: the workspace's test binaries (release, no debug info, `gpu` features on),
//! the emulated driver, the demo (the Rust hand-off example and the Python scripts under
//! `examples/`), `manifest.json` describing them, and `run.py` (stdlib only), which runs each
//! test in its own process against the real driver, runs the conformance suite again against the
//! bundled emulator, runs the demo and the differential script against cuda.core, and tabulates
//! everything; with `sanitizer.py` beside it, `run.py --sanitizer` runs the tests and the demo
//! under NVIDIA's compute-sanitizer instead.

use std::collections::HashMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};
use serde_json::{json, Value};

use crate::cmd::{self, EMULATOR_FILE};

/// The bundle's folder under the workspace root (gitignored).
pub const BUNDLE_DIR: &str = "gpu-bundle";

/// The archive of the bundle beside its folder (gitignored): what travels to the GPU host.
pub const BUNDLE_ARCHIVE: &str = "gpu-bundle.tar.xz";

/// The most the bundle's archive may weigh: it travels to the GPU host by hand. (The folder is
/// about five times larger: some thirty test binaries that each link the same crates.)
const MAX_ARCHIVE_BYTES: u64 = 30 * 1024 * 1024;

/// The Rust examples the bundle carries (built by the same `cargo test --no-run`, which builds
/// every example), as `examples/<name>`: the demo, the facade's new-user program, and its cudarc
/// example (built because the facade's `gpu` feature turns on `cudarc`).
const BUNDLED_EXAMPLES: &[&str] = &["handoff", cmd::FIRST_PROGRAM, cmd::CUDARC_EXAMPLE];

/// The Python scripts of `examples/` the bundle carries: the demo, the differential script and
/// their helper.
const BUNDLED_SCRIPTS: &[&str] = &["handoff.py", "differential.py", "driverlog.py"];

/// An example cargo built: its name and executable.
type Example = (String, PathBuf);

/// One test binary in the bundle.
struct TestBinary {
    package: String,
    target: String,
    kind: String,
    source: PathBuf,
    /// Declared emulator-only by its package (see [`emulator_only_targets`]).
    declared_emulator_only: bool,
}

impl TestBinary {
    /// The file name in the bundle: `<package>--<target>`.
    fn file_name(&self) -> String {
        format!("{}--{}", self.package, self.target)
    }

    /// How run.py treats it: `conformance` (real driver and emulator), `emulator-only` (the
    /// bundled emulator only) or `driver` (real driver).
    fn role(&self) -> &'static str {
        match self.target.as_str() {
            "conformance" => "conformance",
            "emulator_only" => "emulator-only",
            _ if self.declared_emulator_only => "emulator-only",
            _ => "driver",
        }
    }
}

/// Builds `gpu-bundle/` and returns its path.
pub fn build() -> Result<PathBuf> {
    let root = cmd::workspace_root();
    let metadata = cmd::metadata()?;
    let target_dir = cmd::target_dir(&metadata)?;
    let bundle = root.join(BUNDLE_DIR);

    let emulator = cmd::cargo_build(
        &["--release", "-p", cmd::EMU_PACKAGE],
        "the emulated driver",
        target_dir.join("release").join(EMULATOR_FILE),
    )?;
    let (binaries, examples) = build_test_binaries(&metadata)?;

    if bundle.exists() {
        fs::remove_dir_all(&bundle)
            .with_context(|| format!("removing the old {}", bundle.display()))?;
    }
    fs::create_dir_all(bundle.join("bin"))?;
    let mut entries = Vec::new();
    for binary in &binaries {
        let file = format!("bin/{}", binary.file_name());
        copy(&binary.source, &bundle.join(&file))?;
        entries.push(json!({
            "file": file,
            "package": binary.package,
            "target": binary.target,
            "kind": binary.kind,
            "role": binary.role(),
        }));
    }
    copy(&emulator, &bundle.join(EMULATOR_FILE))?;
    copy(&root.join("xtask/bundle/run.py"), &bundle.join("run.py"))?;
    // `run.py --sanitizer`'s finding of compute-sanitizer and its parser of the tools' reports.
    copy(
        &root.join("xtask/bundle/sanitizer.py"),
        &bundle.join("sanitizer.py"),
    )?;
    let demo = bundle_demo(&root, &bundle, &examples)?;
    let python = bundle_python(&root, &bundle)?;
    // The benchmarks, run by `run.py --bench`.
    let bench = crate::bundle_bench::add_to_bundle(&root, &bundle)?;
    // The differential harness, run by `run.py --foreign-tests DIR` on a pytest tree carried
    // beside the bundle (cuda.core's tests are never part of it).
    let foreign = bundle_foreign(&root, &bundle)?;

    let manifest = json!({
        "format": 1,
        "commit": git_commit(&root),
        "built_on": host_description(),
        "emulator": EMULATOR_FILE,
        "binaries": entries,
        "python": python,
        "demo": demo,
        "bench": bench,
        "foreign": foreign,
    });
    fs::write(
        bundle.join("manifest.json"),
        serde_json::to_string_pretty(&manifest)? + "\n",
    )?;

    let size = folder_size(&bundle)?;
    println!(
        "gpu-bundle: {} test binaries, the emulated driver, the demo, run.py{}; {:.1} MiB in {}",
        binaries.len(),
        if python.is_null() {
            " (no Python package: pybind does not exist yet)"
        } else {
            ", the Python wheel and tests"
        },
        size as f64 / (1024.0 * 1024.0),
        bundle.display()
    );
    let archive = cmd::workspace_root().join(BUNDLE_ARCHIVE);
    let mut tar = Command::new("tar");
    tar.arg("-cJf")
        .arg(&archive)
        .arg("-C")
        .arg(cmd::workspace_root())
        .arg(BUNDLE_DIR)
        .env("XZ_OPT", "-6 -T0");
    cmd::run(&mut tar).context("archiving the bundle with tar and xz")?;
    let archived = fs::metadata(&archive)?.len();
    println!(
        "gpu-bundle: {:.1} MiB as {}",
        archived as f64 / (1024.0 * 1024.0),
        archive.display()
    );
    if archived > MAX_ARCHIVE_BYTES {
        bail!(
            "the bundle's archive is {archived} bytes, over the {MAX_ARCHIVE_BYTES}-byte limit: \
             strip or drop something"
        );
    }
    println!("gpu-bundle: on the GPU host `tar -xJf {BUNDLE_ARCHIVE}`, then");
    println!("gpu-bundle: run `python3 {BUNDLE_DIR}/run.py --out results`");
    println!(
        "gpu-bundle: add `--bench` (or `--bench-only`) for the benchmarks, then here \
         `cargo xtask bench --from-results results`"
    );
    Ok(bundle)
}

/// `cargo xtask gpu-test [run.py arguments]`: the bundle, built and run here.
pub fn run_in_place(run_args: &[String]) -> Result<()> {
    let bundle = build()?;
    let mut command = Command::new("python3");
    command
        .arg(bundle.join("run.py"))
        .args(run_args)
        .current_dir(cmd::workspace_root());
    cmd::run(&mut command).context("the GPU run failed (see the table above and --out)")
}

/// The test targets each package declares emulator-only in its Cargo.toml, for integration tests
/// that need the emulator's query interface (hazards, call log, fault injection):
///
/// ```toml
/// [package.metadata.custody]
/// emulator-only-tests = ["deferred_cleanup", "teardown_context"]
/// ```
///
/// A target named `emulator_only` is emulator-only without being declared.
fn emulator_only_targets(metadata: &Value) -> HashMap<String, Vec<String>> {
    metadata["packages"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|p| {
            let name = p["name"].as_str()?.to_owned();
            let targets = p["metadata"]["custody"]["emulator-only-tests"]
                .as_array()?
                .iter()
                .filter_map(|t| Some(t.as_str()?.to_owned()))
                .collect();
            Some((name, targets))
        })
        .collect()
}

/// `cargo test --no-run --release` of the selected packages with their `gpu` features, reading
/// the test executables, and the examples cargo builds with them, from cargo's JSON messages.
/// Returns the test binaries and every example.
fn build_test_binaries(metadata: &Value) -> Result<(Vec<TestBinary>, Vec<Example>)> {
    let (packages, features) = cmd::gpu_selection(metadata)?;
    let emulator_only = emulator_only_targets(metadata);
    let names: HashMap<String, String> = metadata["packages"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|p| Some((p["id"].as_str()?.to_owned(), p["name"].as_str()?.to_owned())))
        .collect();

    let mut command = cmd::cargo();
    command.args([
        "test",
        "--no-run",
        "--release",
        "--message-format=json-render-diagnostics",
    ]);
    for package in &packages {
        command.args(["-p", package]);
    }
    if !features.is_empty() {
        command.args(["--features", &features.join(",")]);
    }
    // Release has no debug info by default; say so explicitly so that a profile change in
    // Cargo.toml cannot bloat the bundle.
    command
        .env("CARGO_PROFILE_RELEASE_DEBUG", "0")
        .env("CARGO_PROFILE_RELEASE_STRIP", "debuginfo");
    let mut binaries = Vec::new();
    let mut examples = Vec::new();
    cmd::cargo_artifacts(&mut command, "cargo test --no-run", |message| {
        let Some(executable) = message["executable"].as_str() else {
            return Ok(());
        };
        if message["target"]["kind"][0] == "example" && message["profile"]["test"] != true {
            let name = message["target"]["name"].as_str().unwrap_or_default();
            examples.push((name.to_owned(), PathBuf::from(executable)));
            return Ok(());
        }
        if message["profile"]["test"] != true {
            return Ok(());
        }
        let package_id = message["package_id"].as_str().unwrap_or_default();
        let package = names
            .get(package_id)
            .cloned()
            .with_context(|| format!("unknown package {package_id} in cargo's output"))?;
        let kind = message["target"]["kind"][0]
            .as_str()
            .unwrap_or("unknown")
            .to_owned();
        let target = if kind == "test" {
            message["target"]["name"]
                .as_str()
                .unwrap_or("unknown")
                .to_owned()
        } else {
            // Unit tests of the library (or binary) target.
            kind.clone()
        };
        let declared_emulator_only = kind == "test"
            && emulator_only
                .get(&package)
                .is_some_and(|targets| targets.contains(&target));
        binaries.push(TestBinary {
            package,
            target,
            kind,
            source: PathBuf::from(executable),
            declared_emulator_only,
        });
        Ok(())
    })?;
    if binaries.is_empty() {
        bail!("cargo built no test binaries");
    }
    binaries.sort_by_key(TestBinary::file_name);
    Ok((binaries, examples))
}

/// The demo under `examples/`: the Rust examples in [`BUNDLED_EXAMPLES`] (from the test build)
/// and the Python scripts in [`BUNDLED_SCRIPTS`]. Returns the manifest's `demo` entry.
fn bundle_demo(root: &Path, bundle: &Path, built: &[Example]) -> Result<Value> {
    fs::create_dir_all(bundle.join("examples"))?;
    let mut rust = serde_json::Map::new();
    for name in BUNDLED_EXAMPLES {
        let Some((_, executable)) = built.iter().find(|(built, _)| built == name) else {
            bail!("cargo test --no-run did not build the example {name:?}");
        };
        let file = format!("examples/{name}");
        copy(executable, &bundle.join(&file))?;
        rust.insert((*name).to_owned(), Value::String(file));
    }
    let mut scripts = serde_json::Map::new();
    for script in BUNDLED_SCRIPTS {
        let file = format!("examples/{script}");
        copy(&root.join(&file), &bundle.join(&file))?;
        scripts.insert((*script).to_owned(), Value::String(file));
    }
    Ok(json!({ "rust": rust, "python": scripts }))
}

/// The differential harness (`cargo xtask foreign-tests`'s script and its pytest plugin) under
/// `foreign/`. Returns the manifest's `foreign` entry.
fn bundle_foreign(root: &Path, bundle: &Path) -> Result<Value> {
    fs::create_dir_all(bundle.join("foreign"))?;
    for source in [crate::foreign::SCRIPT, crate::foreign::PLUGIN] {
        let name = Path::new(source)
            .file_name()
            .context("the harness files have names")?;
        copy(&root.join(source), &bundle.join("foreign").join(name))?;
    }
    Ok(json!({ "script": "foreign/foreign_tests.py" }))
}

/// When `pybind/` exists: the portable release wheel (`cargo xtask wheel`'s abi3 wheel,
/// `manylinux_2_28`, which pip installs on the GPU host's glibc and Python 3.11+), the pytest
/// files and the install check, under `python/`. Returns the manifest's `python` entry (`null`
/// without pybind).
fn bundle_python(root: &Path, bundle: &Path) -> Result<Value> {
    if !root.join("pybind/pyproject.toml").is_file() {
        return Ok(Value::Null);
    }
    let wheels = bundle.join("python/wheels");
    let built = crate::wheel::build(root, crate::wheel::Profile::Release, &wheels, None)
        .context("building the pybind wheel")?;
    for wheel in &built {
        crate::wheel::print_wheel(wheel);
    }
    // The tests, the examples some of them run (`tests/../examples`) and the install check.
    for folder in ["tests", "examples", "smoke"] {
        let source = root.join("pybind").join(folder);
        if source.is_dir() {
            copy_tree(&source, &bundle.join("python").join(folder))?;
        }
    }
    // PyTorch's pluggable allocator (the GPU host has no Rust toolchain to build it), which
    // `run.py` names in CUSTODY_TORCH_ALLOCATOR for pytest.
    cmd::run(cmd::cargo().args(["build", "--release", "-p", cmd::TORCH_PACKAGE]))
        .context("building the PyTorch allocator's library")?;
    let metadata = cmd::metadata()?;
    let torch_library = format!("python/lib/{}", cmd::TORCH_FILE);
    fs::create_dir_all(bundle.join("python/lib"))?;
    copy(
        &cmd::target_dir(&metadata)?
            .join("release")
            .join(cmd::TORCH_FILE),
        &bundle.join(&torch_library),
    )?;
    let wheel_files: Vec<String> = built
        .iter()
        .filter_map(|w| w.path.file_name())
        .map(|name| format!("python/wheels/{}", name.to_string_lossy()))
        .collect();
    Ok(json!({
        "wheels": wheel_files,
        "tests": "python/tests",
        "install_check": "python/smoke/installed_wheel.py",
        "torch_allocator": torch_library,
    }))
}

fn copy(from: &Path, to: &Path) -> Result<()> {
    fs::copy(from, to)
        .with_context(|| format!("copying {} to {}", from.display(), to.display()))?;
    Ok(())
}

fn copy_tree(from: &Path, to: &Path) -> Result<()> {
    fs::create_dir_all(to)?;
    for entry in fs::read_dir(from)? {
        let entry = entry?;
        let name = entry.file_name();
        if name == "__pycache__" {
            continue;
        }
        let path = entry.path();
        if entry.file_type()?.is_dir() {
            copy_tree(&path, &to.join(&name))?;
        } else {
            copy(&path, &to.join(&name))?;
        }
    }
    Ok(())
}

fn folder_size(path: &Path) -> Result<u64> {
    let mut total = 0;
    for entry in fs::read_dir(path)? {
        let entry = entry?;
        let meta = entry.metadata()?;
        total += if meta.is_dir() {
            folder_size(&entry.path())?
        } else {
            meta.len()
        };
    }
    Ok(total)
}

/// `git rev-parse HEAD`, with `-dirty` when the tree has changes; `unknown` outside git.
fn git_commit(root: &Path) -> String {
    let read = |args: &[&str]| {
        Command::new("git")
            .args(args)
            .current_dir(root)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
    };
    match read(&["rev-parse", "HEAD"]) {
        Some(head) => {
            let dirty = read(&["status", "--porcelain"]).is_some_and(|s| !s.is_empty());
            if dirty {
                format!("{head}-dirty")
            } else {
                head
            }
        }
        None => "unknown".to_owned(),
    }
}

fn host_description() -> String {
    let rustc = Command::new("rustc")
        .arg("--version")
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_default();
    format!(
        "{} {}; {rustc}",
        std::env::consts::OS,
        std::env::consts::ARCH
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn binary(target: &str, declared: bool) -> TestBinary {
        TestBinary {
            package: "handles".to_owned(),
            target: target.to_owned(),
            kind: "test".to_owned(),
            source: PathBuf::new(),
            declared_emulator_only: declared,
        }
    }

    #[test]
    fn roles_follow_names_and_declarations() {
        assert_eq!(binary("conformance", false).role(), "conformance");
        assert_eq!(binary("emulator_only", false).role(), "emulator-only");
        assert_eq!(binary("teardown_context", true).role(), "emulator-only");
        assert_eq!(binary("teardown_context", false).role(), "driver");
        assert_eq!(
            binary("teardown_context", false).file_name(),
            "handles--teardown_context"
        );
    }

    #[test]
    fn emulator_only_tests_are_read_from_package_metadata() {
        let metadata = json!({
            "packages": [
                {"name": "handles", "metadata": {"custody": {"emulator-only-tests": ["a", "b"]}}},
                {"name": "memory", "metadata": null},
            ]
        });
        let declared = emulator_only_targets(&metadata);
        assert_eq!(
            declared.get("handles"),
            Some(&vec!["a".to_owned(), "b".to_owned()])
        );
        assert_eq!(declared.get("memory"), None);
    }

    #[test]
    fn gpu_features_are_selected_for_members_that_define_them() {
        let metadata = json!({
            "workspace_members": ["id-sys", "id-emu", "id-handles", "id-xtask"],
            "packages": [
                {"id": "id-sys", "name": "cuda-custody-sys", "features": {"gpu": []}},
                {"id": "id-emu", "name": "cuda-custody-emu", "features": {"gpu": []}},
                {"id": "id-handles", "name": "cuda-custody-handles", "features": {}},
                {"id": "id-xtask", "name": "xtask", "features": {}},
                {"id": "id-dep", "name": "cudarc", "features": {"gpu": []}},
            ]
        });
        let (packages, features) = cmd::gpu_selection(&metadata).unwrap();
        assert_eq!(packages, ["cuda-custody-sys", "cuda-custody-handles"]);
        assert_eq!(features, ["cuda-custody-sys/gpu"]);
    }
}
