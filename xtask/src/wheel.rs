//! `cargo xtask wheel`: portable manylinux wheels of the Python package, checked by a tool.
//!
//! maturin links the extension with zig (`--zig`) against the glibc of [`GLIBC_FLOOR`], so that
//! the wheel installs on every Linux distribution with that glibc or a newer one, whatever the
//! build machine has (Debian 12 here, glibc 2.36, which without zig gave a
//! `manylinux_2_34` wheel). Two tools check the result, and either failing fails the command:
//! maturin's own audit (`--auditwheel check` against `--compatibility manylinux_X_Y`) and
//! `auditwheel show`, whose reported platform tag gives the glibc floor that this module prints
//! and compares with [`GLIBC_FLOOR`] and with the tag in the wheel's file name. The extension
//! must also import its unwinder from `libgcc_s.so.1` instead of carrying zig's libunwind
//! ([`system_libgcc_s`] says why).
//!
//! One abi3 wheel (CPython 3.11 and later) is always built. A free-threaded interpreter (CPython
//! 3.14t; the stable ABI does not exist there) gets a version-specific wheel of its own when
//! `--free-threaded PYTHON` or the environment variable [`FREE_THREADED_ENV`] names it.
//!
//! The tools (maturin with zig, auditwheel, and twine for the metadata check) are installed into
//! the project's `.venv` by this module: CI has only Rust, Python and pip.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, ensure, Context, Result};

use crate::cmd;
use crate::venv::{in_venv, venv_python};

/// The newest glibc a wheel may need: 2.28 (manylinux_2_28: RHEL/Rocky/Alma 8, Debian 10,
/// Ubuntu 18.10 and everything newer). Older systems (glibc 2.17-2.27) are past their
/// distributions' end of life, and CPython 3.11, the package's floor, is rarely found on them.
pub const GLIBC_FLOOR: (u32, u32) = (2, 28);

/// The environment variable naming a free-threaded interpreter to build a wheel for.
pub const FREE_THREADED_ENV: &str = "CUSTODY_FREE_THREADED_PYTHON";

/// Where `cargo xtask wheel` puts its wheels, under the target directory.
pub const WHEEL_DIR: &str = "wheels";

/// The packaging tools and the versions they were tried with: maturin with its `zig` extra
/// (ziglang from PyPI, a self-contained zig toolchain), auditwheel (reads a wheel's ELF symbol
/// versions; no patchelf needed for `show`).
const BUILD_TOOLS: &[&str] = &[
    "maturin[zig]>=1.5,<2",
    "ziglang>=0.13,<0.18",
    "auditwheel>=6,<7",
];

/// twine, for `twine check` of the metadata (long description, URLs); `cargo xtask wheel` only.
const METADATA_TOOLS: &[&str] = &["twine>=5,<8"];

/// Which cargo profile the extension is built with.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Profile {
    /// `--release`: what the GPU bundle and users get.
    Release,
    /// The dev profile: what `cargo xtask test` installs (the check needs no optimisation).
    Debug,
}

/// A built and checked wheel.
#[derive(Debug)]
pub struct Wheel {
    /// The `.whl` file.
    pub path: PathBuf,
    /// The `Tag:` lines of its `WHEEL` file (`cp311-abi3-manylinux_2_28_x86_64`).
    pub tags: Vec<String>,
    /// The glibc floor as `auditwheel show` reported it.
    pub glibc_floor: (u32, u32),
    /// `auditwheel show`'s platform tag (`manylinux_2_28_x86_64`).
    pub audited_tag: String,
    /// `auditwheel show`'s whole report.
    pub report: String,
}

/// `cargo xtask wheel [--debug] [--free-threaded PYTHON] [--out DIR]`.
pub fn run(args: &[String]) -> Result<()> {
    let mut profile = Profile::Release;
    let mut free_threaded = std::env::var_os(FREE_THREADED_ENV)
        .filter(|v| !v.is_empty())
        .map(PathBuf::from);
    let mut out = None;
    let mut args = args.iter();
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--debug" => profile = Profile::Debug,
            "--free-threaded" => {
                free_threaded = Some(PathBuf::from(
                    args.next()
                        .context("--free-threaded needs an interpreter")?,
                ))
            }
            "--out" => out = Some(PathBuf::from(args.next().context("--out needs a folder")?)),
            other => bail!(
                "unknown argument {other:?} (cargo xtask wheel [--debug] \
                 [--free-threaded PYTHON] [--out DIR])"
            ),
        }
    }
    let root = cmd::workspace_root();
    let out = match out {
        Some(out) => out,
        None => cmd::target_dir(&cmd::metadata()?)?.join(WHEEL_DIR),
    };
    let wheels = build(&root, profile, &out, free_threaded.as_deref())?;
    check_metadata(&root, &wheels)?;
    println!();
    for wheel in &wheels {
        print_wheel(wheel);
    }
    if free_threaded.is_none() {
        println!(
            "xtask wheel: no free-threaded wheel (set {FREE_THREADED_ENV}=/path/to/python3.14t \
             or pass --free-threaded PYTHON)"
        );
    }
    Ok(())
}

/// Prints what a user needs to know of a wheel: file, tags, glibc floor, and auditwheel's
/// report.
pub fn print_wheel(wheel: &Wheel) {
    println!("wheel {}", wheel.path.display());
    println!("  auditwheel show:");
    for line in wheel.report.lines().filter(|l| !l.trim().is_empty()) {
        println!("    | {line}");
    }
    println!("  tags:        {}", wheel.tags.join(", "));
    println!(
        "  glibc floor: {}.{} (auditwheel show: consistent with {}; required at most {}.{})",
        wheel.glibc_floor.0, wheel.glibc_floor.1, wheel.audited_tag, GLIBC_FLOOR.0, GLIBC_FLOOR.1
    );
}

/// Installs maturin (with zig) and auditwheel into `.venv` when missing; returns its
/// interpreter.
pub fn build_tools(root: &Path) -> Result<PathBuf> {
    let python = venv_python(root)?;
    let bin = root.join(".venv/bin");
    let missing = !cmd::succeeds(&python, ["-c", "import ziglang"])
        || !bin.join("auditwheel").is_file()
        || !bin.join("maturin").is_file();
    if missing {
        pip_install(&python, BUILD_TOOLS).context("installing maturin, zig and auditwheel")?;
    }
    Ok(python)
}

fn pip_install(python: &Path, packages: &[&str]) -> Result<()> {
    cmd::run(
        Command::new(python)
            .args(["-m", "pip", "install", "--quiet"])
            .args(packages),
    )
}

/// Builds the abi3 wheel (and, with `free_threaded`, a version-specific wheel for that
/// interpreter) into `out`, replacing any custody wheel there, and checks each one's glibc
/// floor. Fails when a wheel needs a newer glibc than [`GLIBC_FLOOR`] or claims a tag that
/// `auditwheel show` does not confirm.
pub fn build(
    root: &Path,
    profile: Profile,
    out: &Path,
    free_threaded: Option<&Path>,
) -> Result<Vec<Wheel>> {
    if let Some(interpreter) = free_threaded {
        ensure!(
            cmd::succeeds(
                interpreter,
                [
                    "-c",
                    "import sys, sysconfig; sys.exit(0 if sysconfig.get_config_var('Py_GIL_DISABLED') else 1)"
                ]
            ),
            "{} is not a free-threaded CPython ({FREE_THREADED_ENV} / --free-threaded)",
            interpreter.display()
        );
    }
    let python = build_tools(root)?;
    fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    for old in custody_wheels(out)? {
        fs::remove_file(&old).with_context(|| format!("removing {}", old.display()))?;
    }
    maturin_build(root, profile, out, &python, Abi::Stable)
        .context("building the abi3 wheel (cargo xtask wheel)")?;
    if let Some(interpreter) = free_threaded {
        maturin_build(root, profile, out, interpreter, Abi::VersionSpecific).with_context(
            || {
                format!(
                    "building the free-threaded wheel for {}",
                    interpreter.display()
                )
            },
        )?;
    }
    let paths = custody_wheels(out)?;
    let expected = 1 + usize::from(free_threaded.is_some());
    ensure!(
        paths.len() == expected,
        "maturin left {} custody wheel(s) in {}, expected {expected}",
        paths.len(),
        out.display()
    );
    let wheels: Vec<Wheel> = paths
        .into_iter()
        .map(|path| audit(root, path))
        .collect::<Result<_>>()?;
    check_abis(&wheels, free_threaded.is_some())?;
    Ok(wheels)
}

/// Which ABI a build targets.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Abi {
    /// pybind's default `abi3` feature: one wheel for CPython 3.11+.
    Stable,
    /// `--no-default-features`: the interpreter's own ABI (a free-threaded one has no stable
    /// ABI before 3.15).
    VersionSpecific,
}

/// Fails unless there is exactly one `abi3` wheel and, with `free_threaded`, exactly one wheel
/// whose ABI tag is a free-threaded one (`cp314t`).
fn check_abis(wheels: &[Wheel], free_threaded: bool) -> Result<()> {
    let abis = |wheel: &Wheel| -> Vec<String> {
        wheel
            .tags
            .iter()
            .filter_map(|tag| tag.split('-').nth(1).map(str::to_owned))
            .collect()
    };
    let all = |wheel: &Wheel, ok: fn(&str) -> bool| {
        let abis = abis(wheel);
        !abis.is_empty() && abis.iter().all(|abi| ok(abi))
    };
    let stable = wheels
        .iter()
        .filter(|w| all(w, |abi| abi == "abi3"))
        .count();
    let threaded = wheels
        .iter()
        .filter(|w| all(w, |abi| abi.starts_with("cp") && abi.ends_with('t')))
        .count();
    let tags: Vec<&Vec<String>> = wheels.iter().map(|w| &w.tags).collect();
    ensure!(
        stable == 1,
        "expected one abi3 wheel, found {stable}: {tags:?}"
    );
    ensure!(
        threaded == usize::from(free_threaded),
        "expected {} free-threaded (cp3XYt) wheel(s), found {threaded}: {tags:?}",
        usize::from(free_threaded)
    );
    Ok(())
}

fn maturin_build(
    root: &Path,
    profile: Profile,
    out: &Path,
    interpreter: &Path,
    abi: Abi,
) -> Result<()> {
    let compatibility = format!("manylinux_{}_{}", GLIBC_FLOOR.0, GLIBC_FLOOR.1);
    let libgcc_s = system_libgcc_s()?;
    let mut command = in_venv(root, root.join(".venv/bin/maturin"));
    command.arg("build");
    if profile == Profile::Release {
        command.arg("--release");
    }
    if abi == Abi::VersionSpecific {
        command.arg("--no-default-features");
    }
    command
        .args(["--zig", "--compatibility", &compatibility])
        .args(["--auditwheel", "check"])
        .args(["--manifest-path", "pybind/Cargo.toml"])
        .arg("--interpreter")
        .arg(interpreter)
        .arg("--out")
        .arg(out)
        // rustc flags for the extension crate only (maturin runs `cargo rustc`): see
        // `system_libgcc_s`.
        .args(["--", "-C"])
        .arg(format!("link-arg={}", libgcc_s.display()));
    cmd::run(&mut command)
}

/// The build machine's `libgcc_s.so.1`, linked into the extension ahead of zig's own unwinder.
///
/// Rust's standard library unwinds through libgcc_s (`-lgcc_s`), and zig replaces that with a
/// static copy of LLVM's libunwind inside the extension. glibc's `pthread_exit` (which CPython
/// up to 3.13 calls on a daemon thread that wakes up during finalization, possibly inside a
/// custody call) unwinds with the process's libgcc_s, and Rust's personality routine then
/// handed libgcc_s's context to the bundled libunwind: a segmentation fault at exit
/// (`pybind/tests/test_shutdown_busy.py`). Named first, libgcc_s defines the `_Unwind_*`
/// symbols before zig's archive is searched, so the extension imports them from libgcc_s, as
/// a gcc-linked build does (manylinux allows `libgcc_s.so.1`; the imported versions are
/// GCC_3.0 to GCC_4.2.0). [`check_unwinder`] checks the result.
fn system_libgcc_s() -> Result<PathBuf> {
    for compiler in ["gcc", "cc"] {
        let Ok(output) = Command::new(compiler)
            .arg("-print-file-name=libgcc_s.so.1")
            .output()
        else {
            continue;
        };
        let path = PathBuf::from(String::from_utf8_lossy(&output.stdout).trim());
        // A compiler that does not know the file prints the bare name back.
        if output.status.success() && path.is_absolute() && path.is_file() {
            return Ok(path);
        }
    }
    bail!(
        "no libgcc_s.so.1 found (`gcc -print-file-name=libgcc_s.so.1`); the extension must \
         import its unwinder from it (on Debian: apt-get install gcc)"
    )
}

/// The `custody-*.whl` files in `folder`, sorted.
fn custody_wheels(folder: &Path) -> Result<Vec<PathBuf>> {
    let mut wheels = Vec::new();
    for entry in fs::read_dir(folder).with_context(|| format!("reading {}", folder.display()))? {
        let path = entry?.path();
        let name = path.file_name().unwrap_or_default().to_string_lossy();
        if name.starts_with("custody-") && name.ends_with(".whl") {
            wheels.push(path);
        }
    }
    wheels.sort();
    Ok(wheels)
}

/// Reads the wheel's tags and runs `auditwheel show` on it.
fn audit(root: &Path, path: PathBuf) -> Result<Wheel> {
    let inspection = inspect(root, &path)?;
    check_unwinder(&path, &inspection)?;
    let tags = inspection.tags;
    let output = in_venv(root, root.join(".venv/bin/auditwheel"))
        .arg("show")
        .arg(&path)
        .output()
        .context("running auditwheel show")?;
    let report = String::from_utf8_lossy(&output.stdout).into_owned();
    ensure!(
        output.status.success(),
        "auditwheel show {} failed: {}{}",
        path.display(),
        report,
        String::from_utf8_lossy(&output.stderr)
    );
    let audited_tag = audited_platform_tag(&report).with_context(|| {
        format!(
            "auditwheel show printed no platform tag for {}:\n{report}",
            path.display()
        )
    })?;
    let glibc_floor = manylinux_version(&audited_tag)
        .with_context(|| format!("auditwheel's tag {audited_tag:?} is not a manylinux tag"))?;
    let wheel = Wheel {
        path,
        tags,
        glibc_floor,
        audited_tag,
        report,
    };
    check_floor(&wheel)?;
    Ok(wheel)
}

/// Fails unless the audited floor is at most [`GLIBC_FLOOR`] and at most what every tag of the
/// wheel claims (a wheel tagged `manylinux_2_17` that needs 2.28 would install and then fail
/// to import).
fn check_floor(wheel: &Wheel) -> Result<()> {
    let name = wheel.path.display();
    ensure!(
        wheel.glibc_floor <= GLIBC_FLOOR,
        "{name} needs glibc {}.{} (auditwheel show: {}), above the floor {}.{}",
        wheel.glibc_floor.0,
        wheel.glibc_floor.1,
        wheel.audited_tag,
        GLIBC_FLOOR.0,
        GLIBC_FLOOR.1
    );
    ensure!(
        !wheel.tags.is_empty(),
        "{name} has no Tag in its WHEEL file"
    );
    for tag in &wheel.tags {
        let platform = tag.rsplit('-').next().unwrap_or_default();
        let claimed = manylinux_version(platform)
            .with_context(|| format!("{name}: tag {tag:?} is not a manylinux tag"))?;
        ensure!(
            claimed >= wheel.glibc_floor && claimed <= GLIBC_FLOOR,
            "{name}: tag {tag:?} claims glibc {}.{}, but auditwheel show says {}",
            claimed.0,
            claimed.1,
            wheel.audited_tag
        );
    }
    Ok(())
}

/// The platform tag in `auditwheel show`'s report ("... is consistent with the following
/// platform tag: "manylinux_2_28_x86_64"."), which auditwheel wraps across lines.
fn audited_platform_tag(report: &str) -> Option<String> {
    let flat = report.split_whitespace().collect::<Vec<_>>().join(" ");
    let marker = "consistent with the following platform tag: \"";
    let start = flat.find(marker)? + marker.len();
    let end = flat[start..].find('"')?;
    Some(flat[start..start + end].to_owned())
}

/// `(2, 28)` for `manylinux_2_28_x86_64`; the legacy aliases too (`manylinux2014` is 2.17).
fn manylinux_version(platform: &str) -> Option<(u32, u32)> {
    if let Some(rest) = platform.strip_prefix("manylinux_") {
        let mut parts = rest.splitn(3, '_');
        let major = parts.next()?.parse().ok()?;
        let minor = parts.next()?.parse().ok()?;
        parts.next()?;
        return Some((major, minor));
    }
    match platform.split('_').next()? {
        "manylinux2014" => Some((2, 17)),
        "manylinux2010" => Some((2, 12)),
        "manylinux1" => Some((2, 5)),
        _ => None,
    }
}

/// What [`inspect`] reads from a wheel.
struct Inspection {
    /// The `Tag:` lines of its `*.dist-info/WHEEL`.
    tags: Vec<String>,
    /// Whether the extension imports `_Unwind_RaiseException` (from libgcc_s) rather than
    /// carrying an unwinder of its own.
    imports_unwinder: bool,
}

/// Reads the wheel's tags and the extension's dynamic symbols, with the venv's Python and
/// pyelftools (auditwheel's dependency): xtask has no zip or ELF reader of its own.
fn inspect(root: &Path, wheel: &Path) -> Result<Inspection> {
    const INSPECT: &str = "import io, sys, zipfile\n\
        from elftools.elf.elffile import ELFFile\n\
        with zipfile.ZipFile(sys.argv[1]) as z:\n\
        \x20   name = next(n for n in z.namelist() if n.endswith('.dist-info/WHEEL'))\n\
        \x20   for line in z.read(name).decode().splitlines():\n\
        \x20       if line.startswith('Tag:'):\n\
        \x20           print('tag', line.split(':', 1)[1].strip())\n\
        \x20   for name in z.namelist():\n\
        \x20       if name.startswith('custody/_custody') and name.endswith('.so'):\n\
        \x20           dynsym = ELFFile(io.BytesIO(z.read(name))).get_section_by_name('.dynsym')\n\
        \x20           for sym in dynsym.iter_symbols():\n\
        \x20               if sym.name == '_Unwind_RaiseException' and sym['st_shndx'] == 'SHN_UNDEF':\n\
        \x20                   print('imports-unwinder')\n";
    let output = in_venv(root, root.join(".venv/bin/python"))
        .args(["-c", INSPECT])
        .arg(wheel)
        .output()
        .context("reading the wheel's WHEEL file and extension")?;
    ensure!(
        output.status.success(),
        "could not inspect {}: {}",
        wheel.display(),
        String::from_utf8_lossy(&output.stderr)
    );
    let stdout = String::from_utf8_lossy(&output.stdout);
    Ok(Inspection {
        tags: stdout
            .lines()
            .filter_map(|l| l.strip_prefix("tag "))
            .map(str::to_owned)
            .collect(),
        imports_unwinder: stdout.lines().any(|l| l == "imports-unwinder"),
    })
}

/// Fails unless the extension imports its unwinder (see [`system_libgcc_s`]).
fn check_unwinder(path: &Path, inspection: &Inspection) -> Result<()> {
    ensure!(
        inspection.imports_unwinder,
        "{}: the extension does not import _Unwind_RaiseException, so it carries an unwinder \
         of its own (zig's libunwind), which crashes when glibc unwinds a thread through it \
         with libgcc_s (pthread_exit at interpreter exit)",
        path.display()
    );
    Ok(())
}

/// `twine check --strict` of every wheel: the long description renders and the metadata is
/// complete enough for an index.
fn check_metadata(root: &Path, wheels: &[Wheel]) -> Result<()> {
    let python = venv_python(root)?;
    if !root.join(".venv/bin/twine").is_file() {
        pip_install(&python, METADATA_TOOLS).context("installing twine")?;
    }
    let mut command = in_venv(root, root.join(".venv/bin/twine"));
    command.args(["check", "--strict"]);
    for wheel in wheels {
        command.arg(&wheel.path);
    }
    cmd::run(&mut command).context("twine check of the wheels' metadata")
}

#[cfg(test)]
mod tests {
    use super::*;

    const REPORT: &str =
        "\ncustody-0.1.0-cp311-abi3-manylinux_2_28_x86_64.whl is consistent with\n\
        the following platform tag: \"manylinux_2_28_x86_64\".\n\nThe wheel references external \
        versioned symbols in these\nsystem-provided shared libraries: libc.so.6 with versions\n";

    fn wheel(tags: &[&str], audited: &str) -> Wheel {
        Wheel {
            path: PathBuf::from("custody.whl"),
            tags: tags.iter().map(|t| (*t).to_owned()).collect(),
            glibc_floor: manylinux_version(audited).unwrap(),
            audited_tag: audited.to_owned(),
            report: String::new(),
        }
    }

    #[test]
    fn reads_auditwheels_wrapped_platform_tag() {
        assert_eq!(
            audited_platform_tag(REPORT).as_deref(),
            Some("manylinux_2_28_x86_64")
        );
        assert_eq!(audited_platform_tag("nothing useful"), None);
    }

    #[test]
    fn the_abi_check_wants_one_abi3_wheel_and_one_free_threaded_one_when_asked() {
        let abi3 = || {
            wheel(
                &["cp311-abi3-manylinux_2_28_x86_64"],
                "manylinux_2_28_x86_64",
            )
        };
        let ft = wheel(
            &["cp314-cp314t-manylinux_2_28_x86_64"],
            "manylinux_2_28_x86_64",
        );
        let gil = wheel(
            &["cp314-cp314-manylinux_2_28_x86_64"],
            "manylinux_2_28_x86_64",
        );
        assert!(check_abis(&[abi3()], false).is_ok());
        assert!(check_abis(&[abi3(), ft], true).is_ok());
        // A free-threaded build that came out abi3, or for the GIL build, is refused.
        assert!(check_abis(&[abi3()], true).is_err());
        assert!(check_abis(&[abi3(), abi3()], true).is_err());
        assert!(check_abis(&[abi3(), gil], true).is_err());
    }

    #[test]
    fn an_extension_with_its_own_unwinder_is_refused() {
        let inspection = |imports_unwinder| Inspection {
            tags: vec![],
            imports_unwinder,
        };
        assert!(check_unwinder(Path::new("w.whl"), &inspection(true)).is_ok());
        let error = check_unwinder(Path::new("w.whl"), &inspection(false))
            .unwrap_err()
            .to_string();
        assert!(error.contains("unwinder of its own"), "{error}");
    }

    #[test]
    fn manylinux_versions_include_the_legacy_aliases() {
        assert_eq!(manylinux_version("manylinux_2_28_x86_64"), Some((2, 28)));
        assert_eq!(manylinux_version("manylinux_2_34_x86_64"), Some((2, 34)));
        assert_eq!(manylinux_version("manylinux2014_x86_64"), Some((2, 17)));
        assert_eq!(manylinux_version("linux_x86_64"), None);
        assert_eq!(manylinux_version("musllinux_1_2_x86_64"), None);
    }

    #[test]
    fn the_floor_check_refuses_newer_glibc_and_false_tags() {
        // A wheel of one tag whose symbols auditwheel places at `audited`.
        let floor = |tag, audited| check_floor(&wheel(&[tag], audited));
        assert!(floor("cp311-abi3-manylinux_2_28_x86_64", "manylinux_2_28_x86_64").is_ok());
        // Older than the floor is fine too.
        assert!(floor("cp311-abi3-manylinux_2_17_x86_64", "manylinux_2_17_x86_64").is_ok());
        // Today's wheel without zig: glibc 2.34.
        let error = floor("cp39-abi3-manylinux_2_34_x86_64", "manylinux_2_34_x86_64")
            .unwrap_err()
            .to_string();
        assert!(error.contains("needs glibc 2.34"), "{error}");
        // A tag that claims less than the symbols need.
        let error = floor("cp311-abi3-manylinux_2_17_x86_64", "manylinux_2_28_x86_64")
            .unwrap_err()
            .to_string();
        assert!(error.contains("claims glibc 2.17"), "{error}");
        // A plain linux tag is not portable.
        assert!(floor("cp311-abi3-linux_x86_64", "manylinux_2_28_x86_64").is_err());
        assert!(check_floor(&wheel(&[], "manylinux_2_28_x86_64")).is_err());
    }
}
