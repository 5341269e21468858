//! Tidy checks, written as ordinary tests (rust-analyzer's habit): the crate dependency graph,
//! a `//!` header on every Rust file, and no ignored tests.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives one level below the workspace root")
        .to_path_buf()
}

/// The layered crates, lowest first: each may depend (normally) only on the one before it.
const CHAIN: [&str; 4] = ["cuda-sys", "handles", "memory", "pybind"];

/// Every crate of the project, workspace members and the excluded `pybind`.
const PROJECT_CRATES: [&str; 6] = [
    "cuda-sys", "cuda-emu", "handles", "memory", "pybind", "xtask",
];

/// Whether `from` may depend on `to` with dependency kind `kind` (`normal`, `build`, `dev`).
fn edge_allowed(from: &str, to: &str, kind: &str) -> bool {
    let position = |name: &str| CHAIN.iter().position(|c| *c == name);
    match from {
        // The emulator uses cuda-sys's types only (and its tests may use cuda-sys too).
        "cuda-emu" => to == "cuda-sys",
        // xtask drives cargo; it links against no workspace crate.
        "xtask" => false,
        // The bindings wrap handles' streams, events and contexts as well as memory's buffers
        // (issue #6: "pybind depends on memory and handles"); never cuda-sys.
        "pybind" if to == "handles" => true,
        _ => match (position(from), position(to)) {
            // Normal and build dependencies: exactly one layer down.
            (Some(f), Some(t)) if kind != "dev" => t + 1 == f,
            // Tests may reach further down the same chain, never up or sideways.
            (Some(f), Some(t)) => t < f,
            _ => false,
        },
    }
}

fn cargo_metadata(manifest: Option<&Path>) -> Value {
    let cargo = option_env!("CARGO").unwrap_or("cargo");
    let mut command = Command::new(cargo);
    command
        .args(["metadata", "--no-deps", "--format-version", "1"])
        .current_dir(workspace_root());
    if let Some(manifest) = manifest {
        command.arg("--manifest-path").arg(manifest);
    }
    let output = command.output().expect("running cargo metadata");
    assert!(
        output.status.success(),
        "cargo metadata failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).expect("cargo metadata JSON")
}

/// (from, to, kind) for every dependency of a listed package on a project crate.
fn project_edges(metadata: &Value, only: Option<&str>) -> Vec<(String, String, String)> {
    let mut edges = Vec::new();
    for package in metadata["packages"].as_array().expect("packages") {
        let from = package["name"].as_str().expect("package name");
        if !PROJECT_CRATES.contains(&from) || only.is_some_and(|o| o != from) {
            continue;
        }
        for dependency in package["dependencies"].as_array().expect("dependencies") {
            let to = dependency["name"].as_str().expect("dependency name");
            if PROJECT_CRATES.contains(&to) {
                let kind = dependency["kind"].as_str().unwrap_or("normal");
                edges.push((from.to_owned(), to.to_owned(), kind.to_owned()));
            }
        }
    }
    edges
}

#[test]
fn crate_dependencies_point_one_way() {
    let root = workspace_root();
    let mut edges = project_edges(&cargo_metadata(None), None);
    let pybind = root.join("pybind/Cargo.toml");
    if pybind.is_file() {
        edges.extend(project_edges(
            &cargo_metadata(Some(&pybind)),
            Some("pybind"),
        ));
    }
    let wrong: Vec<String> = edges
        .iter()
        .filter(|(from, to, kind)| !edge_allowed(from, to, kind))
        .map(|(from, to, kind)| format!("{from} -> {to} ({kind})"))
        .collect();
    assert!(
        wrong.is_empty(),
        "dependencies must follow cuda-sys <- handles <- memory <- pybind (cuda-emu may use \
         cuda-sys only; xtask no workspace crate); these do not: {wrong:?}"
    );
}

#[test]
fn the_dependency_rule_itself() {
    assert!(edge_allowed("handles", "cuda-sys", "normal"));
    assert!(edge_allowed("memory", "handles", "normal"));
    assert!(edge_allowed("pybind", "memory", "normal"));
    assert!(edge_allowed("pybind", "handles", "normal"));
    assert!(
        !edge_allowed("pybind", "cuda-sys", "normal"),
        "the bindings reach the driver only through handles"
    );
    assert!(edge_allowed("memory", "cuda-sys", "dev"));
    assert!(edge_allowed("cuda-emu", "cuda-sys", "normal"));
    assert!(
        !edge_allowed("memory", "cuda-sys", "normal"),
        "memory reaches the driver only through handles"
    );
    assert!(
        !edge_allowed("cuda-sys", "handles", "dev"),
        "no upward edge, not even for tests"
    );
    assert!(!edge_allowed("handles", "cuda-emu", "dev"));
    assert!(!edge_allowed("cuda-emu", "handles", "normal"));
    assert!(!edge_allowed("xtask", "cuda-sys", "normal"));
}

/// Every `.rs` file of the project, skipping build output, virtual environments, the GPU bundle
/// and hidden folders (`.git`, `.venv`, `.cargo`).
fn rust_files() -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        let entries =
            fs::read_dir(dir).unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()));
        for entry in entries {
            let entry = entry.expect("directory entry");
            let path = entry.path();
            let name = entry.file_name().to_string_lossy().into_owned();
            let file_type = entry.file_type().expect("file type");
            if file_type.is_dir() {
                if name.starts_with('.')
                    || ["target", "gpu-bundle", "__pycache__"].contains(&name.as_str())
                {
                    continue;
                }
                walk(&path, out);
            } else if file_type.is_file() && name.ends_with(".rs") {
                out.push(path);
            }
        }
    }
    let mut files = Vec::new();
    walk(&workspace_root(), &mut files);
    files.sort();
    files
}

fn relative(path: &Path) -> String {
    path.strip_prefix(workspace_root())
        .unwrap_or(path)
        .display()
        .to_string()
}

#[test]
fn every_rust_file_opens_with_a_module_doc_line() {
    let files = rust_files();
    assert!(files.len() > 5, "found only {files:?}: is the walk broken?");
    let missing: Vec<String> = files
        .iter()
        .filter(|path| {
            let text = fs::read_to_string(path).unwrap_or_default();
            !text
                .lines()
                .next()
                .is_some_and(|line| line.starts_with("//!"))
        })
        .map(|path| relative(path))
        .collect();
    assert!(
        missing.is_empty(),
        "every .rs file must open with a `//!` line saying what lives there; these do not: {missing:?}"
    );
}

#[test]
fn no_ignored_tests() {
    // Built from pieces so that this file does not match itself.
    let attribute = ["#[", "ignore"].concat();
    let offending: Vec<String> = rust_files()
        .iter()
        .flat_map(|path| {
            let text = fs::read_to_string(path).unwrap_or_default();
            text.lines()
                .enumerate()
                .filter(|(_, line)| {
                    let line = line.trim_start();
                    line.starts_with(&attribute)
                        || (line.starts_with("#[cfg_attr(") && line.contains(", ignore"))
                })
                .map(|(n, _)| format!("{}:{}", relative(path), n + 1))
                .collect::<Vec<_>>()
        })
        .collect();
    assert!(
        offending.is_empty(),
        "tests are never ignored: skip on a specific condition with a message, or delete the \
         test; found at {offending:?}"
    );
}
