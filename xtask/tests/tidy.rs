//! Tidy checks, written as ordinary tests (rust-analyzer's habit): the crate dependency graph,
//! a `//!` header on every Rust file, no ignored tests, and docs and code that cite only documents
//! in the repository and say what code is for rather than which issue added it.

use std::collections::{BTreeMap, BTreeSet};
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

/// The layered crates (package names), lowest first: each may depend (normally) only on the one
/// before it. Folders: `cuda-sys/`, `handles/`, `memory/`, `pybind/`.
const CHAIN: [&str; 4] = [
    "cuda-custody-sys",
    "cuda-custody-handles",
    "cuda-custody-memory",
    "cuda-custody-python",
];

/// The facade users depend on (`custody/`): it re-exports memory and handles.
const FACADE: &str = "cuda-custody";
/// The emulated driver (`cuda-emu/`).
const EMU: &str = "cuda-custody-emu";
/// The crates' shared test support (`test-support/`): the emulator's client and test helpers.
const TEST_SUPPORT: &str = "cuda-custody-test-support";
/// PyTorch's pluggable allocator (`torch-allocator/`): a C-ABI library over memory, a sibling of
/// the Python bindings.
const TORCH: &str = "cuda-custody-torch";

/// Every crate of the project, workspace members and the excluded `pybind`.
const PROJECT_CRATES: [&str; 9] = [
    "cuda-custody-sys",
    "cuda-custody-emu",
    "cuda-custody-handles",
    "cuda-custody-memory",
    "cuda-custody",
    "cuda-custody-test-support",
    "cuda-custody-python",
    "cuda-custody-torch",
    "xtask",
];

/// Whether `from` may depend on `to` with dependency kind `kind` (`normal`, `build`, `dev`).
fn edge_allowed(from: &str, to: &str, kind: &str) -> bool {
    let position = |name: &str| CHAIN.iter().position(|c| *c == name);
    let (sys, handles, memory) = (CHAIN[0], CHAIN[1], CHAIN[2]);
    // Any crate's tests may use the shared test support; nothing else may depend on it.
    if to == TEST_SUPPORT {
        return kind == "dev" && from != EMU && from != "xtask";
    }
    match from {
        // The emulator uses cuda-sys's types only (and its tests may use cuda-sys too).
        _ if from == EMU => to == sys,
        // Test support reads the emulator through cuda-sys's loader; its helpers start tests
        // and read contexts through handles.
        _ if from == TEST_SUPPORT => to == sys || to == handles,
        // The facade re-exports memory and handles; never cuda-sys (the driver is handles').
        _ if from == FACADE => to == memory || to == handles,
        // xtask drives cargo; it links against no workspace crate.
        "xtask" => false,
        // The C-ABI allocator for PyTorch, like the bindings: memory's buffers and handles'
        // streams; never cuda-sys.
        _ if from == TORCH => to == memory || to == handles,
        // The bindings wrap handles' streams, events and contexts as well as memory's buffers
        // (the bindings' own design: pybind depends on memory and handles); never cuda-sys.
        _ if from == CHAIN[3] && to == handles => true,
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
        "dependencies must follow cuda-sys <- handles <- memory <- pybind (the facade custody \
         uses memory and handles; cuda-emu cuda-sys only; test-support cuda-sys and handles, \
         and only tests use it; xtask no workspace crate); these do not: {wrong:?}"
    );
}

#[test]
fn the_dependency_rule_itself() {
    let [sys, handles, memory, pybind] = CHAIN;
    assert!(edge_allowed(handles, sys, "normal"));
    assert!(edge_allowed(memory, handles, "normal"));
    assert!(edge_allowed(pybind, memory, "normal"));
    assert!(edge_allowed(pybind, handles, "normal"));
    assert!(
        !edge_allowed(pybind, sys, "normal"),
        "the bindings reach the driver only through handles"
    );
    assert!(edge_allowed(memory, sys, "dev"));
    assert!(edge_allowed(EMU, sys, "normal"));
    assert!(
        !edge_allowed(memory, sys, "normal"),
        "memory reaches the driver only through handles"
    );
    assert!(
        !edge_allowed(sys, handles, "dev"),
        "no upward edge, not even for tests"
    );
    assert!(!edge_allowed(handles, EMU, "dev"));
    assert!(!edge_allowed(EMU, handles, "normal"));
    assert!(!edge_allowed("xtask", sys, "normal"));
    assert!(edge_allowed(TORCH, memory, "normal"));
    assert!(edge_allowed(TORCH, handles, "normal"));
    assert!(
        !edge_allowed(TORCH, sys, "normal"),
        "the C-ABI library never calls the driver"
    );
    assert!(
        !edge_allowed(pybind, TORCH, "normal"),
        "siblings, no edge between them"
    );
    assert!(edge_allowed(FACADE, memory, "normal"));
    assert!(edge_allowed(FACADE, handles, "normal"));
    assert!(
        !edge_allowed(FACADE, sys, "normal"),
        "the facade reaches the driver only through handles"
    );
    assert!(
        !edge_allowed(memory, FACADE, "dev"),
        "nothing below uses the facade"
    );
    assert!(edge_allowed(sys, TEST_SUPPORT, "dev"));
    assert!(edge_allowed(memory, TEST_SUPPORT, "dev"));
    assert!(
        !edge_allowed(handles, TEST_SUPPORT, "normal"),
        "only tests use the test support"
    );
    assert!(edge_allowed(TEST_SUPPORT, handles, "normal"));
    assert!(!edge_allowed(TEST_SUPPORT, memory, "normal"));
}

/// Every `.rs` file of the project, skipping build output, virtual environments, the GPU bundle
/// and hidden folders (`.git`, `.venv`, `.cargo`).
fn rust_files() -> Vec<PathBuf> {
    walk_files(|name| name.ends_with(".rs"))
}

/// Every file under the workspace root whose name passes `keep`, skipping what
/// [`rust_files`] skips.
fn walk_files(keep: impl Fn(&str) -> bool) -> Vec<PathBuf> {
    fn walk(dir: &Path, keep: &dyn Fn(&str) -> bool, out: &mut Vec<PathBuf>) {
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
                walk(&path, keep, out);
            } else if file_type.is_file() && keep(&name) {
                out.push(path);
            }
        }
    }
    let mut files = Vec::new();
    walk(&workspace_root(), &keep, &mut files);
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

/// Every file git tracks in the workspace (`git ls-files`); where git or the repository is not
/// there (an unpacked source archive), every file the walk of [`rust_files`] finds.
fn tracked_files() -> Vec<PathBuf> {
    let root = workspace_root();
    let listed = Command::new("git")
        .args(["ls-files", "-z"])
        .current_dir(&root)
        .output()
        .ok()
        .filter(|output| output.status.success() && !output.stdout.is_empty());
    match listed {
        Some(output) => String::from_utf8_lossy(&output.stdout)
            .split('\0')
            .filter(|name| !name.is_empty())
            .map(|name| root.join(name))
            .filter(|path| path.is_file())
            .collect(),
        None => walk_files(|_| true),
    }
}

/// Names of documents that live outside the repository (the design brief, the measured driver
/// facts, the notes on the reference implementation, and the folder that held them). Written in
/// pieces so that this file does not match itself. Cite `docs/decisions.md`,
/// `docs/driver-facts.md` and `docs/reference-notes.md` instead.
const OUTSIDE_DOCUMENTS: [&str; 5] = [
    concat!("BRI", "EF"),
    concat!("driver", "_facts"),
    concat!("cuda_core", "_behavior"),
    concat!("shared/", "design"),
    concat!("shared/", "reference"),
];

/// Files allowed to name the documents above. None: the repository's own docs restate them.
/// A file added here says why.
const OUTSIDE_DOCUMENT_EXCEPTIONS: [&str; 0] = [];

/// Whether `line` names a document outside the repository. The brief's name counts only as a whole
/// word, so "briefly" and "BRIEFING" do not.
fn cites_outside_document(line: &str) -> Option<&'static str> {
    OUTSIDE_DOCUMENTS.iter().copied().find(|name| {
        line.match_indices(name).any(|(at, _)| {
            let before = line[..at].chars().next_back();
            let after = line[at + name.len()..].chars().next();
            let word = |c: Option<char>| c.is_some_and(|c| c.is_alphanumeric() || c == '_');
            !name.starts_with(concat!("BRI", "EF")) || (!word(before) && !word(after))
        })
    })
}

/// Whether `line` places code by the issue that asked for it: the word "issue" or "issues" (any
/// case, standing alone), a space, an optional `#`, then a number.
fn places_by_issue(line: &str) -> bool {
    let lower = line.to_ascii_lowercase();
    lower.match_indices("issue").any(|(at, word)| {
        let before = lower[..at].chars().next_back();
        if before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_') {
            return false;
        }
        let rest = &lower[at + word.len()..];
        let rest = rest.strip_prefix('s').unwrap_or(rest);
        let Some(rest) = rest.strip_prefix(' ') else {
            return false;
        };
        let rest = rest.strip_prefix('#').unwrap_or(rest);
        rest.starts_with(|c: char| c.is_ascii_digit())
    })
}

/// Source files, where comments and docstrings must say what code is for, not which issue added
/// it. Markdown may narrate history (`docs/gpu-validation.md` does) and is not checked for this.
fn is_code(path: &Path) -> bool {
    matches!(
        path.extension().and_then(|e| e.to_str()),
        Some("rs" | "py" | "pyi" | "toml" | "c" | "sh")
    )
}

#[test]
fn docs_and_code_cite_only_documents_in_the_repository() {
    let files = tracked_files();
    assert!(
        files.len() > 20,
        "found only {files:?}: is the listing broken?"
    );
    let mut offending = Vec::new();
    for path in &files {
        let name = relative(path);
        if OUTSIDE_DOCUMENT_EXCEPTIONS.contains(&name.as_str()) {
            continue;
        }
        let Ok(text) = fs::read_to_string(path) else {
            continue; // not text (images)
        };
        for (n, line) in text.lines().enumerate() {
            if let Some(document) = cites_outside_document(line) {
                offending.push(format!(
                    "{name}:{}: names {document:?}: {}",
                    n + 1,
                    line.trim()
                ));
            }
        }
    }
    assert!(
        offending.is_empty(),
        "cite the repository's own documents (docs/decisions.md D4, docs/driver-facts.md F11, \
         docs/reference-notes.md section 6 item 3), not files outside it:\n{}",
        offending.join("\n")
    );
}

#[test]
fn code_says_what_it_is_for_not_which_issue_added_it() {
    let mut offending = Vec::new();
    for path in tracked_files().iter().filter(|path| is_code(path)) {
        let Ok(text) = fs::read_to_string(path) else {
            continue;
        };
        for (n, line) in text.lines().enumerate() {
            if places_by_issue(line) {
                offending.push(format!("{}:{}: {}", relative(path), n + 1, line.trim()));
            }
        }
    }
    assert!(
        offending.is_empty(),
        "say what the code is for instead of naming the issue that added it:\n{}",
        offending.join("\n")
    );
}

#[test]
fn the_citation_rules_themselves() {
    let brief = concat!("BRI", "EF");
    assert_eq!(
        cites_outside_document(&format!("as decided ({brief}.md D4)")),
        Some(brief)
    );
    assert_eq!(
        cites_outside_document(&format!("(../../{}.md F2)", concat!("driver", "_facts"))),
        Some(concat!("driver", "_facts"))
    );
    assert!(
        cites_outside_document(&format!("in /work/{}/BR.md", concat!("shared/", "design")))
            .is_some()
    );
    assert_eq!(cites_outside_document("runs each variant briefly"), None);
    assert_eq!(cites_outside_document(&format!("{brief}ING notes")), None);
    assert_eq!(
        cites_outside_document("docs/decisions.md D4; docs/driver-facts.md F11"),
        None
    );
    // Built from pieces so that this file does not match itself.
    assert!(places_by_issue(concat!(
        "// Added for memory (Iss",
        "ue #4): pools"
    )));
    assert!(places_by_issue(concat!(
        "//! Stress (iss",
        "ue 9): threads"
    )));
    assert!(places_by_issue(concat!(
        "\"\"\"Fuzzing (iss",
        "ues #9, #10).\"\"\""
    )));
    assert!(!places_by_issue("// an issue with the driver: see F16"));
    assert!(!places_by_issue("// tissue 3"));
    assert!(!places_by_issue("// the issue #-sign"));
}

/// A program that depends on cudarc with another CUDA-version feature than custody's default
/// (`cuda-12080`) next to custody compiles, when it turns custody's default off and names the
/// same version (custody/README.md): the feature is forwarded, not pinned. Checked with a
/// scratch crate outside the workspace, `cargo check --offline` (the workspace's build has
/// fetched every package) with the workspace's lock file, in a target directory of its own.
#[test]
fn custody_compiles_next_to_a_cudarc_of_another_cuda_version() {
    let root = workspace_root();
    let scratch = root.join("target/tidy/cudarc-next-to-custody");
    fs::create_dir_all(scratch.join("src")).expect("creating the scratch crate");
    let manifest = format!(
        r#"[package]
name = "cudarc-next-to-custody"
version = "0.0.0"
edition = "2021"
publish = false

[workspace]

[dependencies]
cudarc = {{ version = "0.19", default-features = false, features = ["std", "driver", "dynamic-loading", "cuda-12080"] }}
custody = {{ package = "cuda-custody", path = "{}", default-features = false, features = ["cuda-12080"] }}
"#,
        root.join("custody").display()
    );
    fs::write(scratch.join("Cargo.toml"), manifest).expect("writing the scratch manifest");
    // The two crates' types are one: a custody stream's raw value is a cudarc `CUstream`.
    fs::write(
        scratch.join("src/main.rs"),
        "//! Uses cudarc and custody side by side.\n\
         fn main() {\n    \
         let raw: cudarc::driver::sys::CUstream = custody::StreamHandle::legacy().raw();\n    \
         println!(\"{raw:?}\");\n}\n",
    )
    .expect("writing the scratch program");
    fs::copy(root.join("Cargo.lock"), scratch.join("Cargo.lock")).expect("copying Cargo.lock");
    let cargo = option_env!("CARGO").unwrap_or("cargo");
    let output = Command::new(cargo)
        .args(["check", "--offline", "--quiet"])
        .current_dir(&scratch)
        .env("CARGO_TARGET_DIR", scratch.join("target"))
        .output()
        .expect("running cargo check on the scratch crate");
    assert!(
        output.status.success(),
        "custody (default features off, cuda-12080) next to cudarc with cuda-12080 does not \
         compile:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
}

/// The "no CUDA driver" error (`cuda-sys/src/loader.rs`) tells its reader which command builds
/// the emulated driver: the package name it gives is the emulator's (`cuda-emu/Cargo.toml`), so
/// renaming the package cannot leave the advice stale.
#[test]
fn the_no_driver_error_names_the_emulators_package() {
    let root = workspace_root();
    let manifest =
        fs::read_to_string(root.join("cuda-emu/Cargo.toml")).expect("cuda-emu/Cargo.toml");
    let package = manifest
        .lines()
        .find_map(|line| line.strip_prefix("name = \""))
        .and_then(|rest| rest.strip_suffix('"'))
        .expect("cuda-emu/Cargo.toml names its package first");
    assert_eq!(package, EMU);
    let loader = fs::read_to_string(root.join("cuda-sys/src/loader.rs")).expect("loader.rs");
    let command = format!("cargo build -p {package}");
    assert!(
        loader.contains(&command),
        "cuda-sys/src/loader.rs's no-driver advice must say `{command}`"
    );
}

/// The string literals of a Rust source file (comments skipped), each with its line: a message
/// a user may see is one of them.
fn string_literals(source: &str) -> Vec<(usize, String)> {
    let chars: Vec<char> = source.chars().collect();
    let mut out = Vec::new();
    let (mut i, mut line) = (0, 1);
    while i < chars.len() {
        let c = chars[i];
        let next = chars.get(i + 1).copied();
        if c == '\n' {
            line += 1;
        } else if c == '/' && next == Some('/') {
            while i < chars.len() && chars[i] != '\n' {
                i += 1;
            }
            continue;
        } else if c == '/' && next == Some('*') {
            while i + 1 < chars.len() && !(chars[i] == '*' && chars[i + 1] == '/') {
                line += usize::from(chars[i] == '\n');
                i += 1;
            }
            i += 2;
            continue;
        } else if c == '\'' {
            // A character literal ('"', '\'', 'x'); a lifetime ('a) has no closing quote.
            if next == Some('\\') {
                i += 4;
                while i < chars.len() && chars[i - 1] != '\'' {
                    i += 1;
                }
                continue;
            }
            if chars.get(i + 2) == Some(&'\'') {
                i += 3;
                continue;
            }
        } else if c == 'r'
            && matches!(next, Some('"' | '#'))
            && !i
                .checked_sub(1)
                .is_some_and(|p| chars[p].is_alphanumeric() || chars[p] == '_')
        {
            let mut j = i + 1;
            let mut hashes = 0;
            while chars.get(j) == Some(&'#') {
                hashes += 1;
                j += 1;
            }
            if chars.get(j) == Some(&'"') {
                let start_line = line;
                let mut text = String::new();
                j += 1;
                while j < chars.len() {
                    if chars[j] == '"' && (1..=hashes).all(|k| chars.get(j + k) == Some(&'#')) {
                        break;
                    }
                    line += usize::from(chars[j] == '\n');
                    text.push(chars[j]);
                    j += 1;
                }
                out.push((start_line, text));
                i = j + 1 + hashes;
                continue;
            }
        } else if c == '"' {
            let start_line = line;
            let mut text = String::new();
            i += 1;
            while i < chars.len() && chars[i] != '"' {
                if chars[i] == '\\' {
                    text.push(chars[i]);
                    i += 1;
                }
                line += usize::from(chars[i] == '\n');
                text.push(chars[i]);
                i += 1;
            }
            out.push((start_line, text));
        }
        i += 1;
    }
    out
}

/// How the project's code cites its own documents, which a user of the library or the Python
/// package does not have: a Markdown file, the docs folder or a source folder, a decision (D4),
/// a measured driver fact (F16, G2), a numbered section or scenario of the reference notes.
/// Returns what matched.
fn cites_the_repository(text: &str) -> Option<String> {
    let lower = text.to_ascii_lowercase();
    for folder in [
        "docs/",
        "pybind/",
        "handles/",
        "memory/",
        "cuda-sys/",
        "cuda-emu/",
        "xtask/",
        "src/",
        "tests/",
    ] {
        for (at, _) in lower.match_indices(folder) {
            let before = lower[..at].chars().next_back();
            if !before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == '-') {
                return Some(folder.to_owned());
            }
        }
    }
    for (at, _) in lower.match_indices(".md") {
        let before = lower[..at].chars().next_back();
        let after = lower[at + 3..].chars().next();
        if before.is_some_and(char::is_alphanumeric) && !after.is_some_and(char::is_alphanumeric) {
            return Some(".md".to_owned());
        }
    }
    for phrase in ["section ", "scenario ", "scenarios "] {
        for (at, _) in lower.match_indices(phrase) {
            if lower[at + phrase.len()..].starts_with(|c: char| c.is_ascii_digit()) {
                return Some(phrase.trim().to_owned());
            }
        }
    }
    let chars: Vec<char> = text.chars().collect();
    for (i, &c) in chars.iter().enumerate() {
        if !matches!(c, 'D' | 'F' | 'G') {
            continue;
        }
        if i > 0 && (chars[i - 1].is_alphanumeric() || chars[i - 1] == '_') {
            continue;
        }
        let digits = chars[i + 1..]
            .iter()
            .take_while(|d| d.is_ascii_digit())
            .count();
        let after = chars.get(i + 1 + digits);
        if (1..=2).contains(&digits) && !after.is_some_and(|a| a.is_alphanumeric() || *a == '_') {
            return Some(chars[i..=i + digits].iter().collect());
        }
    }
    None
}

/// Messages a user sees come from the string literals of the library crates and the Python
/// bindings (error texts, exception messages): none cites a document of the repository (a pip
/// user has none of them); each says the rule itself. Comments may cite them. The bindings'
/// docstrings are checked by `pybind/tests/test_stubs.py`, on the built package.
#[test]
fn messages_cite_no_document_of_the_repository() {
    let root = workspace_root();
    let mut offending = Vec::new();
    let mut literals = 0;
    for folder in [
        "cuda-sys/src",
        "handles/src",
        "memory/src",
        "custody/src",
        "pybind/src",
    ] {
        for path in walk_files(|name| name.ends_with(".rs"))
            .into_iter()
            .filter(|path| path.starts_with(root.join(folder)))
        {
            let source = fs::read_to_string(&path).expect("a Rust source");
            for (line, text) in string_literals(&source) {
                literals += 1;
                if let Some(found) = cites_the_repository(&text) {
                    offending.push(format!("{}:{line}: {found:?} in {text:?}", relative(&path)));
                }
            }
        }
    }
    assert!(
        literals > 200,
        "found only {literals} string literals: is the scan broken?"
    );
    assert!(
        offending.is_empty(),
        "a message cites a document its reader does not have; say the rule itself:\n{}",
        offending.join("\n")
    );
}

#[test]
fn the_message_rules_themselves() {
    let literals = string_literals(concat!(
        "// \"in a comment\"\n",
        "let a = \"one\"; /* \"block\" */ let b = 'x'; let q = '\"';\n",
        "fn f<'a>(s: &'a str) { g(\"two\\\" still two\", r#\"three \"quoted\"\"#); }\n",
        "let c = \"multi\n line\";",
    ));
    let texts: Vec<&str> = literals.iter().map(|(_, t)| t.as_str()).collect();
    assert_eq!(
        texts,
        [
            "one",
            "two\\\" still two",
            "three \"quoted\"",
            "multi\n line"
        ]
    );
    assert_eq!(literals[3].0, 4);
    for cited in [
        concat!("(docs/decisions", ".md D1)"),
        "as decided (D10)",
        "measured (F16)",
        "section 6 item 5",
        "see pybind/src/buffer.rs",
        "README.md says",
    ] {
        assert!(cites_the_repository(cited).is_some(), "{cited}");
    }
    for plain in [
        "no CUDA context is current",
        "cuMemFreeAsync failed: CUDA_ERROR_INVALID_VALUE (1)",
        "built into target/debug/libcuda_emu.so",
        "a pointer is an unsigned 64-bit int, got 0xD1",
        "kDLCUDAManaged (13)",
        "FD 3 is not a pool",
    ] {
        assert_eq!(cites_the_repository(plain), None, "{plain}");
    }
}

/// The crates whose modules the DAG check reads: (name for messages, `src` folder).
const MODULE_GRAPH_CRATES: [(&str, &str); 8] = [
    ("cuda-sys", "cuda-sys/src"),
    ("handles", "handles/src"),
    ("memory", "memory/src"),
    ("pybind", "pybind/src"),
    ("cuda-emu", "cuda-emu/src"),
    ("test-support", "test-support/src"),
    ("custody", "custody/src"),
    ("xtask", "xtask/src"),
];

/// A crate's modules, one per file: `src/a.rs` and `src/a/mod.rs` are `a`, `src/a/b.rs` is
/// `a::b`; the crate root (`lib.rs` or `main.rs`) is the empty path.
fn module_files(src: &Path) -> Vec<(String, PathBuf)> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        let entries =
            fs::read_dir(dir).unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()));
        for entry in entries {
            let path = entry.expect("directory entry").path();
            if path.is_dir() {
                walk(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }
    let mut files = Vec::new();
    walk(src, &mut files);
    files.sort();
    let mut out = Vec::new();
    for file in files {
        let rel = file.strip_prefix(src).expect("below src");
        let mut parts: Vec<String> = rel
            .iter()
            .map(|p| p.to_string_lossy().into_owned())
            .collect();
        let last = parts.pop().expect("a file name");
        let stem = last.trim_end_matches(".rs").to_owned();
        // Files below src/bin are binaries of their own, not modules of the library.
        if parts.first().is_some_and(|p| p == "bin") {
            continue;
        }
        if !(stem == "mod" || (parts.is_empty() && (stem == "lib" || stem == "main"))) {
            parts.push(stem);
        }
        out.push((parts.join("::"), file));
    }
    out
}

/// The code of a file with comments, string literals and its `#[cfg(test)]` module left out:
/// what its imports are made of.
fn code_of(text: &str) -> String {
    let text = match text.find("#[cfg(test)]\nmod ") {
        Some(at) => &text[..at],
        None => text,
    };
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '/' if chars.peek() == Some(&'/') => {
                for c in chars.by_ref() {
                    if c == '\n' {
                        out.push('\n');
                        break;
                    }
                }
            }
            '"' => {
                let mut escaped = false;
                for c in chars.by_ref() {
                    if escaped {
                        escaped = false;
                    } else if c == '\\' {
                        escaped = true;
                    } else if c == '"' {
                        break;
                    }
                }
                out.push_str("\"\"");
            }
            c => out.push(c),
        }
    }
    out
}

/// The module paths `code` (of module `module`) names: `crate::a::b`, `super::x` and the items
/// of `use crate::{a, b::c}` groups, as written (not yet resolved to modules).
fn named_paths(module: &str, code: &str) -> Vec<Vec<String>> {
    let parent: Vec<String> = module
        .split("::")
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .collect();
    let mut out = Vec::new();
    for (prefix, base) in [
        ("crate::", Vec::new()),
        ("super::", parent[..parent.len().saturating_sub(1)].to_vec()),
    ] {
        let mut from = 0;
        while let Some(at) = code[from..].find(prefix) {
            let start = from + at;
            from = start + prefix.len();
            let before = code[..start].chars().next_back();
            if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':') {
                continue;
            }
            let rest = &code[from..];
            if rest.starts_with('{') {
                // `use crate::{a::b, c}`: every item of the group (one level is enough here).
                let end = rest.find('}').unwrap_or(rest.len());
                for item in rest[1..end].split(',') {
                    let path: Vec<String> = item
                        .trim()
                        .split("::")
                        .map(|s| s.trim().to_owned())
                        .filter(|s| !s.is_empty() && s != "{")
                        .collect();
                    if !path.is_empty() {
                        out.push(base.iter().cloned().chain(path).collect());
                    }
                }
                continue;
            }
            let len = rest
                .bytes()
                .take_while(|b| b.is_ascii_alphanumeric() || *b == b'_' || *b == b':')
                .count();
            let path: Vec<String> = base
                .iter()
                .cloned()
                .chain(
                    rest[..len]
                        .split("::")
                        .filter(|s| !s.is_empty())
                        .map(str::to_owned),
                )
                .collect();
            let after = &rest[len..];
            if rest[..len].ends_with("::") && after.starts_with('{') {
                // `crate::a::{B, c::D}`: each item, under the path before the group (one level;
                // a nested group contributes its first segment, which is enough for modules).
                let end = after.find('}').unwrap_or(after.len());
                for item in after[1..end].split(',') {
                    let tail: Vec<String> = item
                        .trim()
                        .split("::")
                        .map(|s| s.trim().trim_start_matches('{').to_owned())
                        .filter(|s| !s.is_empty())
                        .collect();
                    out.push(path.iter().cloned().chain(tail).collect());
                }
            } else if len > 0 {
                out.push(path);
            }
        }
    }
    out
}

/// The import graph of one crate's modules: `module -> modules it names`, where a path is
/// resolved to the longest module that prefixes it, and a name a module re-exports (`pub use
/// a::B;` in `lib.rs`, `pub(crate) use class::B;` in a folder's `mod.rs`) also to the module it
/// comes from. Edges to the root itself and to oneself are left out (the root declares every
/// module; that is not an import), and so are a module's edges to its own children.
fn module_graph(src: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let modules: Vec<(String, String)> = module_files(src)
        .into_iter()
        .map(|(module, file)| {
            let text = fs::read_to_string(&file).expect("reading a module");
            (module, text)
        })
        .collect();
    graph_of(&modules)
}

/// [`module_graph`] over `(module, source text)` pairs.
fn graph_of(files: &[(String, String)]) -> BTreeMap<String, BTreeSet<String>> {
    let modules: BTreeSet<String> = files.iter().map(|(m, _)| m.clone()).collect();
    // Re-exports: (re-exporting module, name) -> defining module.
    let mut reexports: BTreeMap<(String, String), String> = BTreeMap::new();
    for (module, text) in files {
        let code = code_of(text);
        let parent = module.rsplit_once("::").map_or("", |(parent, _)| parent);
        let within = |path: &str| {
            if module.is_empty() {
                path.to_owned()
            } else {
                format!("{module}::{path}")
            }
        };
        for statement in code.split(';') {
            let mut statement = statement.trim();
            // Attributes on the statement (`#[doc(inline)]`).
            while let Some(rest) = statement.strip_prefix("#[") {
                statement = rest.split_once(']').map_or("", |(_, after)| after).trim();
            }
            let Some(rest) = ["pub use ", "pub(crate) use ", "pub(super) use "]
                .iter()
                .find_map(|prefix| statement.strip_prefix(prefix))
            else {
                continue;
            };
            let (path, names) = match rest.find("::{") {
                Some(at) => (&rest[..at], rest[at + 3..].trim_end_matches('}').to_owned()),
                None => match rest.rfind("::") {
                    Some(at) => (&rest[..at], rest[at + 2..].to_owned()),
                    None => continue,
                },
            };
            // The defining module, from the path as written: absolute, relative to this
            // module or to its parent; a bare path names a child (or another crate).
            let source = if let Some(path) = path.strip_prefix("crate::") {
                path.to_owned()
            } else if let Some(path) = path.strip_prefix("self::") {
                within(path)
            } else if let Some(path) = path.strip_prefix("super::") {
                if parent.is_empty() {
                    path.to_owned()
                } else {
                    format!("{parent}::{path}")
                }
            } else {
                within(path)
            };
            if !modules.contains(&source) {
                continue;
            }
            for name in names.split(',') {
                let name = name.split(" as ").last().unwrap_or(name).trim();
                if !name.is_empty() {
                    reexports.insert((module.clone(), name.to_owned()), source.clone());
                }
            }
        }
    }
    // The modules a path names: the longest module prefixing it and, when that module
    // re-exports the next name, the modules that re-export leads to.
    let resolve = |path: &[String]| -> Vec<String> {
        let mut path = path.to_vec();
        let mut found = Vec::new();
        // A chain of re-exports is short; the bound only guards against a loop.
        for _ in 0..16 {
            let len = (0..=path.len())
                .rev()
                .find(|&len| modules.contains(&path[..len].join("::")))
                .unwrap_or(0);
            let module = path[..len].join("::");
            if !module.is_empty() {
                found.push(module.clone());
            }
            let Some(name) = path.get(len).cloned() else {
                break;
            };
            let Some(source) = reexports.get(&(module, name.clone())) else {
                break;
            };
            path = source
                .split("::")
                .filter(|s| !s.is_empty())
                .map(str::to_owned)
                .chain([name])
                .collect();
        }
        found
    };
    let mut graph = BTreeMap::new();
    for (module, text) in files {
        let code = code_of(text);
        let targets: BTreeSet<String> = named_paths(module, &code)
            .iter()
            .flat_map(|path| resolve(path))
            .filter(|target| !target.is_empty() && target != module)
            // A module naming its own child (`use self::x` aside) is declaring, not importing.
            .filter(|target| !target.starts_with(&format!("{module}::")) || module.is_empty())
            .collect();
        graph.insert(module.clone(), targets);
    }
    graph
}

/// A cycle of `graph`, if it has one, as the modules along it.
fn find_cycle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    #[derive(Clone, Copy, PartialEq)]
    enum Mark {
        New,
        Open,
        Done,
    }
    fn visit(
        node: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
        marks: &mut BTreeMap<String, Mark>,
        stack: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        marks.insert(node.to_owned(), Mark::Open);
        stack.push(node.to_owned());
        for next in graph.get(node).into_iter().flatten() {
            match marks.get(next).copied().unwrap_or(Mark::New) {
                Mark::Open => {
                    let at = stack.iter().position(|m| m == next).expect("on the stack");
                    let mut cycle = stack[at..].to_vec();
                    cycle.push(next.clone());
                    return Some(cycle);
                }
                Mark::New => {
                    if let Some(cycle) = visit(next, graph, marks, stack) {
                        return Some(cycle);
                    }
                }
                Mark::Done => {}
            }
        }
        stack.pop();
        marks.insert(node.to_owned(), Mark::Done);
        None
    }
    let mut marks = BTreeMap::new();
    for node in graph.keys() {
        if marks.get(node).copied().unwrap_or(Mark::New) == Mark::New {
            if let Some(cycle) = visit(node, graph, &mut marks, &mut Vec::new()) {
                return Some(cycle);
            }
        }
    }
    None
}

/// Each crate's modules import one another one way (their graph is a DAG); pybind's layering
/// is in pybind/DESIGN.md, "Module order".
#[test]
fn each_crates_modules_import_one_another_without_a_cycle() {
    let root = workspace_root();
    let mut wrong = Vec::new();
    for (name, src) in MODULE_GRAPH_CRATES {
        let src = root.join(src);
        if !src.is_dir() {
            continue;
        }
        if let Some(cycle) = find_cycle(&module_graph(&src)) {
            wrong.push(format!("{name}: {}", cycle.join(" -> ")));
        }
    }
    assert!(
        wrong.is_empty(),
        "modules must depend one way (move what both sides need into a module below them):\n{}",
        wrong.join("\n")
    );
}

#[test]
fn the_module_graph_check_itself() {
    // Paths as written: crate paths, groups, super paths; comments and strings do not count.
    let code = code_of(
        "use crate::a::{B, c::D};\nuse super::e;\n// crate::f\nlet s = \"crate::g\";\ncrate::h::i();\n",
    );
    let paths = named_paths("x::y", &code);
    let paths: Vec<String> = paths.iter().map(|p| p.join("::")).collect();
    assert!(paths.contains(&"a::B".to_owned()), "{paths:?}");
    assert!(paths.contains(&"a::c::D".to_owned()), "{paths:?}");
    assert!(paths.contains(&"x::e".to_owned()), "{paths:?}");
    assert!(paths.contains(&"h::i".to_owned()), "{paths:?}");
    assert!(
        !paths
            .iter()
            .any(|p| p.starts_with('f') || p.starts_with('g')),
        "{paths:?}"
    );
    // A cycle is found, and a DAG passes.
    let graph = |edges: &[(&str, &str)]| {
        let mut g: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for (from, to) in edges {
            g.entry((*from).to_owned())
                .or_default()
                .insert((*to).to_owned());
            g.entry((*to).to_owned()).or_default();
        }
        g
    };
    assert_eq!(find_cycle(&graph(&[("a", "b"), ("b", "c")])), None);
    let cycle = find_cycle(&graph(&[("a", "b"), ("b", "c"), ("c", "a")])).expect("a cycle");
    assert_eq!(cycle.first(), cycle.last());
    assert_eq!(cycle.len(), 4);
    // On a real crate it finds the imports (so that an acyclic verdict is not vacuous): the
    // handles crate's device pointers use streams and recipes, through `use crate::...` and
    // re-exported names alike.
    let handles = module_graph(&workspace_root().join("handles/src"));
    let deviceptr = &handles["deviceptr"];
    for used in ["stream", "recipe", "scope", "error"] {
        assert!(
            deviceptr.contains(used),
            "deviceptr -> {used}: {deviceptr:?}"
        );
    }
    assert!(
        handles["stream"].contains("context"),
        "{:?}",
        handles["stream"]
    );
    // A name that a folder's `mod.rs` re-exports leads to the module that defines it (as well
    // as to the folder), so that a cycle through a family's re-exported names is found.
    let crate_of = |files: &[(&str, &str)]| -> Vec<(String, String)> {
        files
            .iter()
            .map(|(m, text)| ((*m).to_owned(), (*text).to_owned()))
            .collect()
    };
    let family = |class: &str| {
        crate_of(&[
            ("", "mod fam;\nmod user;\n"),
            (
                "fam",
                "mod class;\nmod methods;\npub(crate) use class::Thing;\n\
                 pub(crate) use self::methods::{run, stop as halt};\n",
            ),
            ("fam::class", class),
            ("fam::methods", "use super::Thing;\npub fn run() {}\n"),
            (
                "user",
                "use crate::fam::{halt, Thing};\npub fn helper() {}\n",
            ),
        ])
    };
    let acyclic = graph_of(&family("pub struct Thing;\n"));
    for used in ["fam", "fam::class", "fam::methods"] {
        assert!(
            acyclic["user"].contains(used),
            "user -> {used}: {acyclic:?}"
        );
    }
    assert!(
        acyclic["fam::methods"].contains("fam::class"),
        "{acyclic:?}"
    );
    assert_eq!(find_cycle(&acyclic), None);
    let cyclic = graph_of(&family("use crate::user::helper;\npub struct Thing;\n"));
    let cycle = find_cycle(&cyclic).expect("user -> fam::class -> user");
    assert!(cycle.contains(&"fam::class".to_owned()), "{cycle:?}");
    // And so on the bindings' folders: a resource makes buffers, through the buffer family's
    // re-exported struct.
    let pybind = module_graph(&workspace_root().join("pybind/src"));
    assert!(
        pybind["resource::methods"].contains("buffer::class"),
        "{:?}",
        pybind["resource::methods"]
    );
}

/// Every tracked Python file compiles (`python3 -m py_compile`): the GPU bundle's runners
/// (`xtask/bundle/*.py`) and the benchmarks run only on a GPU host, so a syntax error there
/// would otherwise first show in a GPU run.
#[test]
fn every_python_file_compiles() {
    let files: Vec<PathBuf> = tracked_files()
        .into_iter()
        .filter(|path| path.extension().is_some_and(|e| e == "py"))
        .collect();
    assert!(
        files.len() > 5,
        "found only {files:?}: is the listing broken?"
    );
    // `compile()` only, so nothing is written next to the sources (no __pycache__).
    const CHECK: &str = "import sys\n\
        bad = []\n\
        for name in sys.argv[1:]:\n\
        \x20   try:\n\
        \x20       compile(open(name, 'rb').read(), name, 'exec')\n\
        \x20   except SyntaxError as e:\n\
        \x20       bad.append('%s:%s: %s' % (name, e.lineno, e.msg))\n\
        print('\\n'.join(bad))\n\
        sys.exit(1 if bad else 0)\n";
    let output = Command::new("python3")
        .arg("-c")
        .arg(CHECK)
        .args(&files)
        .output()
        .expect("python3 runs (CI has Python 3.11)");
    assert!(
        output.status.success(),
        "these Python files do not compile:\n{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}
