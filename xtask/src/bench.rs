//! `cargo xtask bench`: runs the benchmarks (custody against the raw driver in Rust, and against
//! cuda.core, CuPy and raw calls in Python) and regenerates `docs/benchmarks.md` from their JSON.
//!
//! - `cargo xtask bench [--emulator] [--full|--quick] [--no-python]`: builds the emulated driver;
//!   uses the real driver if `libcuda.so.1` loads with a device (or `CUSTODY_CUDA_DRIVER` if set),
//!   else the emulator, and says which; runs `memory/benches/custody_vs_raw` and
//!   `bench/python_bench.py` (on a release wheel of pybind) against it; stores their JSON under
//!   `docs/benchmarks/<run>/`; renders the document.
//! - `cargo xtask bench --from-results DIR [--label NAME]`: takes the JSON a GPU host wrote
//!   (`run.py --bench --out DIR` puts it in `DIR/bench/`), stores it as run `NAME` (default: from
//!   the device name, `h200` for an NVIDIA H200) and renders the document.
//! - `cargo xtask bench --render`: renders the document from the stored JSON only.
//! - `cargo xtask bench --stub`: as `--emulator`, on the stub driver (`bench/stub_driver.c`,
//!   compiled here with `cc`: the emulator with a few-nanosecond allocation hot path), stored as
//!   run `stub`: the bindings' own overhead, with cuda.core and cuda-bindings beside custody.
//!
//! On the emulator or the stub, `libcuda.so.1` is linked to the driver in a folder put first on
//! `LD_LIBRARY_PATH`, so that cuda.core and cuda-bindings, where `.venv` has them, run on it too.
//!
//! Rendering replaces only what lies between `<!-- bench:NAME:begin -->` and
//! `<!-- bench:NAME:end -->` in `docs/benchmarks.md` (a run without markers gets a new section at
//! the end), so the hand-written analysis around the tables survives. Tables are computed here;
//! plots are drawn by `bench/plot.py` with matplotlib in `.venv` (see `plot_run`).

use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};
use serde_json::{json, Value};

use crate::cmd::{self, DRIVER_ENV, EMULATOR_FILE};

/// Where the stored runs and plots live, relative to the workspace root.
const RUNS_DIR: &str = "docs/benchmarks";
/// The document.
const DOC: &str = "docs/benchmarks.md";

/// `cargo xtask bench --help`.
const USAGE: &str = "\
usage: cargo xtask bench [--emulator | --stub] [--full | --quick] [--no-python] [--label NAME]
       cargo xtask bench --from-results DIR [--label NAME]
       cargo xtask bench --render

Measures custody against the raw driver (Rust, memory/benches/custody_vs_raw) and against
cuda.core, CuPy, PyTorch and raw calls (Python, bench/python_bench.py), stores the JSON under
docs/benchmarks/<run>/ and renders docs/benchmarks.md.

  (no driver option)   the real driver when libcuda.so.1 loads with a device (or the one
                       CUSTODY_CUDA_DRIVER names), else the emulator; says which
  --emulator           the emulated driver (run `emulator`): overhead ratios only
  --stub               the stub driver, bench/stub_driver.c compiled with cc over the emulator
                       (run `stub`): the bindings' own overhead
  --full, --quick      full or quick sampling (default: quick on the emulator and the stub,
                       full on a real driver)
  --no-python          the Rust benchmark only
  --label NAME         store the run as NAME (lower-case letters, digits and '-')
  --from-results DIR   store a GPU host's results (run.py --bench --out DIR writes DIR/bench/)
                       as run NAME (default: from the device, `h200`), then render
  --render             re-render docs/benchmarks.md from the stored JSON only
  -h, --help           this text";

#[derive(Debug, Default)]
struct Options {
    help: bool,
    from_results: Option<PathBuf>,
    label: Option<String>,
    render_only: bool,
    emulator: bool,
    stub: bool,
    python: bool,
    /// `Some(true)`: full sampling; `Some(false)`: quick; `None`: quick on the emulator, full
    /// on a real driver.
    full: Option<bool>,
}

fn parse(args: &[String]) -> Result<Options> {
    let mut options = Options {
        python: true,
        ..Options::default()
    };
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--from-results" => {
                options.from_results = Some(PathBuf::from(
                    it.next().context("--from-results needs a folder")?,
                ))
            }
            "--label" => options.label = Some(it.next().context("--label needs a name")?.clone()),
            "--render" => options.render_only = true,
            "--emulator" => options.emulator = true,
            "--stub" => options.stub = true,
            "--no-python" => options.python = false,
            "--full" => options.full = Some(true),
            "--quick" => options.full = Some(false),
            "-h" | "--help" => options.help = true,
            other => bail!(
                "unknown argument {other:?} (expected --from-results DIR, --label NAME, --render, \
                 --emulator, --stub, --no-python, --full, --quick, --help)"
            ),
        }
    }
    if let Some(label) = &options.label {
        anyhow::ensure!(
            !label.is_empty()
                && label
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-'),
            "--label must be lower-case letters, digits and '-' (got {label:?})"
        );
    }
    Ok(options)
}

/// Runs `cargo xtask bench`.
pub fn run(args: &[String]) -> Result<()> {
    let options = parse(args)?;
    if options.help {
        println!("{USAGE}");
        return Ok(());
    }
    let root = cmd::workspace_root();
    if let Some(results) = &options.from_results {
        let label = import_results(&root, results, options.label.as_deref())?;
        println!("xtask bench: stored {} as run `{label}`", results.display());
    } else if !options.render_only {
        measure(&root, &options)?;
    }
    render(&root)
}

/// Which driver the measurement uses.
enum DriverChoice {
    Emulator(PathBuf),
    /// `bench/stub_driver.c` over the emulator.
    Stub(PathBuf),
    /// The system's `libcuda.so.1` (no environment variable).
    System(String),
    /// `CUSTODY_CUDA_DRIVER` as the caller set it.
    Given(PathBuf),
}

/// Asks `libcuda.so.1` through ctypes whether it initialises and has a device; returns its
/// device 0's name.
fn probe_system_driver() -> Option<String> {
    const PROBE: &str = "import ctypes\n\
        l = ctypes.CDLL('libcuda.so.1')\n\
        n = ctypes.c_int(0)\n\
        assert l.cuInit(0) == 0 and l.cuDeviceGetCount(ctypes.byref(n)) == 0 and n.value > 0\n\
        d = ctypes.c_int(0); b = ctypes.create_string_buffer(256)\n\
        assert l.cuDeviceGet(ctypes.byref(d), 0) == 0 and l.cuDeviceGetName(b, 256, d) == 0\n\
        print(b.value.decode())\n";
    let output = Command::new("python3").args(["-c", PROBE]).output().ok()?;
    output
        .status
        .success()
        .then(|| String::from_utf8_lossy(&output.stdout).trim().to_owned())
}

/// A run name from a device name: `NVIDIA H200` -> `h200`.
fn slug(device: &str) -> String {
    let lower = device.to_ascii_lowercase();
    let lower = lower.strip_prefix("nvidia ").unwrap_or(&lower);
    let mut out = String::new();
    for c in lower.chars() {
        if c.is_ascii_alphanumeric() {
            out.push(c);
        } else if !out.ends_with('-') && !out.is_empty() {
            out.push('-');
        }
    }
    let out = out.trim_end_matches('-').to_owned();
    if out.is_empty() {
        "gpu".to_owned()
    } else {
        out
    }
}

fn measure(root: &Path, options: &Options) -> Result<()> {
    let metadata = cmd::metadata()?;
    let target_dir = cmd::target_dir(&metadata)?;
    cmd::run(cmd::cargo().args(["build", "--release", "-p", cmd::EMU_PACKAGE]))
        .context("building the emulated driver")?;
    let emulator = target_dir
        .join("release")
        .join(EMULATOR_FILE)
        .canonicalize()
        .context("the release emulator was not built")?;

    let choice = if options.stub {
        DriverChoice::Stub(build_stub(root, &target_dir, &emulator)?)
    } else if options.emulator {
        DriverChoice::Emulator(emulator.clone())
    } else if let Some(given) = std::env::var_os(DRIVER_ENV) {
        DriverChoice::Given(PathBuf::from(given))
    } else if let Some(device) = probe_system_driver() {
        DriverChoice::System(device)
    } else {
        DriverChoice::Emulator(emulator.clone())
    };
    let (label, driver_env, emulated) = match &choice {
        DriverChoice::Emulator(path) => {
            println!(
                "xtask bench: driver: the EMULATED driver {} (no usable libcuda.so.1, or --emulator); \
                 its figures are overhead ratios only",
                path.display()
            );
            ("emulator".to_owned(), Some(path.clone()), true)
        }
        DriverChoice::Stub(path) => {
            println!(
                "xtask bench: driver: the STUB driver {} (the emulator, with a few-nanosecond \
                 allocation hot path); its figures are the bindings' overhead only",
                path.display()
            );
            ("stub".to_owned(), Some(path.clone()), true)
        }
        DriverChoice::System(device) => {
            println!("xtask bench: driver: the system's libcuda.so.1, device 0: {device}");
            (slug(device), None, false)
        }
        DriverChoice::Given(path) => {
            let emulated = path.file_name().is_some_and(|n| n == EMULATOR_FILE);
            println!(
                "xtask bench: driver: {}={} (as set by the caller{})",
                DRIVER_ENV,
                path.display(),
                if emulated { ", the emulator" } else { "" }
            );
            let label = if emulated {
                "emulator".to_owned()
            } else {
                "local".to_owned()
            };
            (label, Some(path.clone()), emulated)
        }
    };
    let label = options.label.clone().unwrap_or(label);
    let full = options.full.unwrap_or(!emulated);
    let run_dir = root.join(RUNS_DIR).join(&label);
    fs::create_dir_all(&run_dir)?;
    let rust_json = run_dir.join("rust.json");

    let mut bench = cmd::cargo();
    bench
        .args([
            "bench",
            "-p",
            cmd::MEMORY_PACKAGE,
            "--bench",
            "custody_vs_raw",
            "--",
            "--noplot",
            "--discard-baseline",
        ])
        .env("CUSTODY_BENCH_JSON", &rust_json);
    if !full {
        bench.env("CUSTODY_BENCH_QUICK", "1");
    }
    if let Some(path) = &driver_env {
        bench.env(DRIVER_ENV, path);
    }
    cmd::run(&mut bench).context("the Rust benchmark failed")?;

    let python_json = run_dir.join("python.json");
    if !options.python {
        println!("xtask bench: Python benchmark skipped (--no-python)");
    } else if !root.join("pybind/pyproject.toml").is_file() {
        println!("xtask bench: Python benchmark skipped: pybind/pyproject.toml does not exist yet");
    } else {
        let site = release_wheel_site(root, &target_dir)?;
        let python = crate::venv::venv_python(root)?;
        let mut command = crate::venv::in_venv(root, &python);
        command
            .arg(root.join("bench/python_bench.py"))
            .arg("--json")
            .arg(&python_json)
            .env("PYTHONPATH", &site);
        if !full {
            command.arg("--quick");
        }
        if let Some(raw) = raw_c_pair(&rust_json)? {
            command.arg("--raw-c-ns").arg(format!("{raw:.1}"));
        }
        if let Some(path) = &driver_env {
            command.env(DRIVER_ENV, path);
            // cuda.core and cuda-bindings load `libcuda.so.1`: the same driver, where installed.
            let lib = libcuda_folder(&target_dir, path)?;
            let mut paths = vec![lib];
            // Each entry of an inherited LD_LIBRARY_PATH (a `:`-separated list), after it.
            if let Some(inherited) = std::env::var_os("LD_LIBRARY_PATH") {
                paths.extend(std::env::split_paths(&inherited));
            }
            command.env("LD_LIBRARY_PATH", std::env::join_paths(paths)?);
            command.env("CUSTODY_EMU_DEVICE_COUNT", "1");
        }
        cmd::run(&mut command).context("the Python benchmark failed")?;
    }
    println!("xtask bench: results stored in {}", run_dir.display());
    Ok(())
}

/// Compiles `bench/stub_driver.c` against the release emulator into
/// `<target>/release/stub-driver/libcuda.so.1` (the system C compiler, `cc`, which Rust's
/// linking already needs); returns its path.
fn build_stub(root: &Path, target_dir: &Path, emulator: &Path) -> Result<PathBuf> {
    let dir = target_dir.join("release").join("stub-driver");
    fs::create_dir_all(&dir)?;
    let out = dir.join("libcuda.so.1");
    let emulator_dir = emulator.parent().context("the emulator's folder")?;
    cmd::run(
        Command::new("cc")
            .args(["-O2", "-Wall", "-Wextra", "-Werror", "-shared", "-fPIC"])
            .arg("-ftls-model=initial-exec")
            .arg(format!("-DSTUB_EMULATOR=\"{}\"", emulator.display()))
            .arg("-o")
            .arg(&out)
            .arg(root.join("bench/stub_driver.c"))
            // The emulator is a dependency of the stub (every symbol the stub does not define
            // is the emulator's), found through the run path.
            .arg("-Wl,--no-as-needed")
            .arg(format!("-L{}", emulator_dir.display()))
            .arg(format!("-l:{EMULATOR_FILE}"))
            .arg(format!("-Wl,-rpath,{}", emulator_dir.display()))
            .arg("-ldl"),
    )
    .context("compiling bench/stub_driver.c (needs a C compiler, cc)")?;
    Ok(out)
}

/// A folder holding `libcuda.so.1`, a link to `driver` (itself when it is named so).
fn libcuda_folder(target_dir: &Path, driver: &Path) -> Result<PathBuf> {
    if driver.file_name().is_some_and(|n| n == "libcuda.so.1") {
        return Ok(driver
            .parent()
            .context("the driver's folder")?
            .to_path_buf());
    }
    let dir = target_dir.join("release").join("emu-lib");
    fs::create_dir_all(&dir)?;
    let link = dir.join("libcuda.so.1");
    let _ = fs::remove_file(&link);
    std::os::unix::fs::symlink(driver, &link)
        .with_context(|| format!("linking {} to {}", link.display(), driver.display()))?;
    Ok(dir)
}

/// Builds pybind's release wheel (the artifact the GPU bundle carries) and unpacks it into a
/// folder for `PYTHONPATH`, leaving `.venv`'s development install alone.
fn release_wheel_site(root: &Path, target_dir: &Path) -> Result<PathBuf> {
    crate::venv::venv_python(root)?;
    let wheels = target_dir.join("bench-wheel");
    let site = target_dir.join("bench-site");
    for dir in [&wheels, &site] {
        if dir.exists() {
            fs::remove_dir_all(dir)?;
        }
        fs::create_dir_all(dir)?;
    }
    crate::wheel::build(root, crate::wheel::Profile::Release, &wheels, None)
        .context("building the pybind release wheel")?;
    for entry in fs::read_dir(&wheels)? {
        let path = entry?.path();
        if path.extension().is_some_and(|e| e == "whl") {
            cmd::run(
                Command::new("python3")
                    .args(["-m", "zipfile", "-e"])
                    .arg(&path)
                    .arg(&site),
            )
            .context("unpacking the wheel")?;
        }
    }
    Ok(site)
}

/// The median raw pair of the Rust benchmark (`pair` / `raw`), if it ran.
fn raw_c_pair(rust_json: &Path) -> Result<Option<f64>> {
    if !rust_json.is_file() {
        return Ok(None);
    }
    let run = Suite::load(rust_json)?;
    Ok(run.find("pair", None).and_then(|c| c.median("raw")))
}

/// Copies `DIR/bench/{rust,python}.json` (or `DIR/{rust,python}.json`) into a stored run.
fn import_results(root: &Path, results: &Path, label: Option<&str>) -> Result<String> {
    let source = if results.join("bench").is_dir() {
        results.join("bench")
    } else {
        results.to_path_buf()
    };
    let files: Vec<PathBuf> = ["rust.json", "python.json"]
        .iter()
        .map(|f| source.join(f))
        .filter(|p| p.is_file())
        .collect();
    if files.is_empty() {
        bail!(
            "{} has no rust.json or python.json (run.py --bench writes them to <out>/bench/)",
            source.display()
        );
    }
    let first = Suite::load(&files[0])?;
    if first.driver_emulated() {
        eprintln!(
            "xtask bench: warning: {} was measured on the EMULATED driver",
            files[0].display()
        );
    }
    let label = match label {
        Some(label) => label.to_owned(),
        None if first.driver_emulated() => "emulator".to_owned(),
        None => slug(&first.device()),
    };
    let run_dir = root.join(RUNS_DIR).join(&label);
    refuse_to_overwrite(&run_dir, &label, &files)?;
    fs::create_dir_all(&run_dir)?;
    for file in &files {
        let name = file.file_name().context("a file name")?;
        fs::copy(file, run_dir.join(name))
            .with_context(|| format!("copying {}", file.display()))?;
    }
    // Keep the GPU run's own summary next to it when there is one (driver, GPU, test results).
    if results.join("summary.md").is_file() {
        fs::copy(
            results.join("summary.md"),
            run_dir.join("gpu-run-summary.md"),
        )?;
    }
    Ok(label)
}

/// Refuses to store `files` as run `label` when that run already holds a measurement made at
/// another time (a suite whose `unix_time` differs, or one the new results lack): the previous
/// run stays beside the new one in `docs/benchmarks.md` only if it is moved aside first.
fn refuse_to_overwrite(run_dir: &Path, label: &str, files: &[PathBuf]) -> Result<()> {
    let when = |path: &Path| -> Result<i64> {
        Ok(Suite::load(path)?.json["unix_time"].as_i64().unwrap_or(0))
    };
    for name in ["rust.json", "python.json"] {
        let stored = run_dir.join(name);
        if !stored.is_file() {
            continue;
        }
        let new = files
            .iter()
            .find(|f| f.file_name().is_some_and(|n| n == name));
        let same = match new {
            Some(new) => when(new)? == when(&stored)?,
            None => false,
        };
        if !same {
            bail!(
                "run `{label}` ({}) already holds another measurement ({name} of {}); keep it \
                 beside the new one: `git mv {} {}-DATE` and rename its `bench:{label}:` markers \
                 in docs/benchmarks.md, or import with --label NAME",
                run_dir.display(),
                date(when(&stored)?),
                run_dir.display(),
                run_dir.display(),
            );
        }
    }
    Ok(())
}

// ----------------------------------------------------------------------------------------
// Reading the JSON and computing the statistics.

/// The median of `values` (NaN when empty).
fn median(values: &[f64]) -> f64 {
    let mut v: Vec<f64> = values.iter().copied().filter(|x| x.is_finite()).collect();
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// The `q` quantile (0..=1) by linear interpolation.
fn quantile(values: &[f64], q: f64) -> f64 {
    let mut v: Vec<f64> = values.iter().copied().filter(|x| x.is_finite()).collect();
    v.sort_by(f64::total_cmp);
    if v.is_empty() {
        return f64::NAN;
    }
    let pos = q * (v.len() - 1) as f64;
    let (lo, hi) = (pos.floor() as usize, pos.ceil() as usize);
    v[lo] + (v[hi] - v[lo]) * (pos - lo as f64)
}

struct VariantSamples {
    name: String,
    what: String,
    ns: Vec<f64>,
}

struct Comparison {
    group: String,
    param: Option<u64>,
    title: String,
    op: String,
    baseline: Option<String>,
    variants: Vec<VariantSamples>,
}

impl Comparison {
    fn samples(&self, name: &str) -> Option<&[f64]> {
        self.variants
            .iter()
            .find(|v| v.name == name)
            .map(|v| v.ns.as_slice())
    }

    fn median(&self, name: &str) -> Option<f64> {
        self.samples(name).map(median)
    }

    /// Median over samples of `a / b` (paired).
    fn ratio(&self, a: &str, b: &str) -> Option<f64> {
        let (a, b) = (self.samples(a)?, self.samples(b)?);
        let r: Vec<f64> = a.iter().zip(b).map(|(x, y)| x / y).collect();
        Some(median(&r))
    }

    /// Median over samples of `a - b` (paired), nanoseconds.
    fn delta(&self, a: &str, b: &str) -> Option<f64> {
        let (a, b) = (self.samples(a)?, self.samples(b)?);
        let d: Vec<f64> = a.iter().zip(b).map(|(x, y)| x - y).collect();
        Some(median(&d))
    }

    /// The medians a ratio or delta of `a` and `b` compares, for a target's text:
    /// `A ns against B ns` (NaN for a variant not measured).
    fn against(&self, a: &str, b: &str) -> String {
        format!(
            "{:.0} ns against {:.0} ns",
            self.median(a).unwrap_or(f64::NAN),
            self.median(b).unwrap_or(f64::NAN)
        )
    }
}

/// One suite's JSON (`rust.json` or `python.json`).
struct Suite {
    json: Value,
    comparisons: Vec<Comparison>,
}

impl Suite {
    fn load(path: &Path) -> Result<Suite> {
        let text =
            fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        let json: Value =
            serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
        if json["format"] != "custody-bench/1" {
            bail!("{} is not a custody-bench/1 file", path.display());
        }
        let mut comparisons = Vec::new();
        for c in json["comparisons"].as_array().into_iter().flatten() {
            let text = |k: &str| c[k].as_str().unwrap_or_default().to_owned();
            comparisons.push(Comparison {
                group: text("group"),
                param: c["param"].as_u64(),
                title: text("title"),
                op: text("op"),
                baseline: c["baseline"].as_str().map(str::to_owned),
                variants: c["variants"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|v| VariantSamples {
                        name: v["name"].as_str().unwrap_or_default().to_owned(),
                        what: v["what"].as_str().unwrap_or_default().to_owned(),
                        ns: v["ns_per_op"]
                            .as_array()
                            .into_iter()
                            .flatten()
                            .map(|x| x.as_f64().unwrap_or(f64::NAN))
                            .collect(),
                    })
                    .collect(),
            });
        }
        Ok(Suite { json, comparisons })
    }

    fn find(&self, group: &str, param: Option<u64>) -> Option<&Comparison> {
        self.comparisons
            .iter()
            .find(|c| c.group == group && (param.is_none() || c.param == param))
    }

    fn group(&self, group: &str) -> Vec<&Comparison> {
        self.comparisons
            .iter()
            .filter(|c| c.group == group)
            .collect()
    }

    fn driver_emulated(&self) -> bool {
        self.json["driver"]["emulated"].as_bool().unwrap_or(false)
    }

    /// Run on the stub driver (`bench/stub_driver.c`, over the emulator).
    fn driver_stub(&self) -> bool {
        self.json["driver"]["stub"].as_bool().unwrap_or(false)
            || self.json["driver"]["path"]
                .as_str()
                .is_some_and(|p| p.contains("stub-driver"))
    }

    fn device(&self) -> String {
        self.json["driver"]["device"]
            .as_str()
            .unwrap_or("unknown")
            .to_owned()
    }
}

/// A stored run: `docs/benchmarks/<label>/`.
struct Run {
    label: String,
    dir: PathBuf,
    rust: Option<Suite>,
    python: Option<Suite>,
}

impl Run {
    fn load(dir: &Path) -> Result<Option<Run>> {
        let label = dir
            .file_name()
            .context("a run folder name")?
            .to_string_lossy()
            .into_owned();
        let load = |name: &str| -> Result<Option<Suite>> {
            let path = dir.join(name);
            path.is_file().then(|| Suite::load(&path)).transpose()
        };
        let (rust, python) = (load("rust.json")?, load("python.json")?);
        if rust.is_none() && python.is_none() {
            return Ok(None);
        }
        Ok(Some(Run {
            label,
            dir: dir.to_path_buf(),
            rust,
            python,
        }))
    }

    fn any(&self) -> &Suite {
        self.rust
            .as_ref()
            .or(self.python.as_ref())
            .expect("a run has a suite")
    }
}

// ----------------------------------------------------------------------------------------
// Targets.

/// Whether a target was met; `None` when it was not measured (the text says why).
struct Target {
    name: &'static str,
    measured: String,
    met: Option<bool>,
    /// The figure the verdict is drawn from, with its limit (for `summary.json` and the targets
    /// plot): a ratio (`unit` "x") or a difference in nanoseconds (`unit` "ns").
    value: Option<f64>,
    limit: Limit,
}

/// A target's limit.
#[derive(Clone, Copy)]
enum Limit {
    /// Met when the value is at most this.
    AtMost(f64, &'static str),
    /// Met when the value is at least this.
    AtLeast(f64, &'static str),
}

impl Limit {
    fn met(self, value: f64) -> Option<bool> {
        value.is_finite().then_some(match self {
            Limit::AtMost(limit, _) => value <= limit,
            Limit::AtLeast(limit, _) => value >= limit,
        })
    }

    fn json(self) -> Value {
        match self {
            Limit::AtMost(limit, unit) => json!({"at_most": limit, "unit": unit}),
            Limit::AtLeast(limit, unit) => json!({"at_least": limit, "unit": unit}),
        }
    }
}

impl Target {
    /// A measured target: the verdict is the limit applied to `value`.
    fn measured(name: &'static str, limit: Limit, value: f64, measured: String) -> Target {
        Target {
            name,
            measured,
            met: limit.met(value),
            value: value.is_finite().then_some(value),
            limit,
        }
    }

    /// A target not measured in this run, saying why.
    fn missing(name: &'static str, limit: Limit, why: String) -> Target {
        Target {
            name,
            measured: why,
            met: None,
            value: None,
            limit,
        }
    }
}

fn x(v: f64) -> String {
    format!("{v:.2}x")
}

fn targets(run: &Run) -> Vec<Target> {
    let mut out = Vec::new();
    let rust = run.rust.as_ref();
    let python = run.python.as_ref();
    let no_rust = || "not measured (no Rust results)".to_owned();

    // 1. Rust pairs, against the raw pair measured beside them.
    let pair = rust.and_then(|r| r.find("pair", None));
    for (name, variant, limit) in [
        (
            "Rust DevicePtrHandle alloc+free pair ≤ 1.05 × the raw driver pair",
            "handle",
            1.05,
        ),
        (
            "Rust Buffer allocate+close ≤ 1.10 × the raw driver pair",
            "buffer, close",
            1.10,
        ),
    ] {
        let limit = Limit::AtMost(limit, "x");
        out.push(
            match pair.and_then(|c| c.ratio(variant, "raw").map(|r| (c, r))) {
                Some((c, r)) => Target::measured(
                    name,
                    limit,
                    r,
                    format!(
                        "{} ({}, {:+.0} ns, paired)",
                        x(r),
                        c.against(variant, "raw"),
                        c.delta(variant, "raw").unwrap_or(f64::NAN)
                    ),
                ),
                None => Target::missing(name, limit, no_rust()),
            },
        );
    }

    // The caching resource's Rust pair (a same-stream hit), in nanoseconds.
    let name = "Rust caching pair (allocate+close, a same-stream hit) ≤ 100 ns";
    let limit = Limit::AtMost(100.0, "ns");
    out.push(
        match pair.and_then(|c| c.median("caching, close").map(|m| (c, m))) {
            Some((c, m)) => Target::measured(
                name,
                limit,
                m,
                format!(
                    "{m:.0} ns ({} the raw pair's {:.0} ns, paired)",
                    c.ratio("caching, close", "raw").map_or("-".into(), x),
                    c.median("raw").unwrap_or(f64::NAN)
                ),
            ),
            None if rust.is_some() => Target::missing(
                name,
                limit,
                "not measured (no `caching, close` variant)".into(),
            ),
            None => Target::missing(name, limit, no_rust()),
        },
    );

    // 2. Python against cuda.core (and PyTorch): custody's time over theirs for the same calls,
    //    paired in one run (a ratio below 1 is faster). The caching variant on a wrapped stream
    //    was `custody (caching): allocate+close` before the created-stream one was added.
    let py_pair = python.and_then(|p| p.find("py-pair", None));
    let py_set = python.and_then(|p| p.find("py-set_deallocation_stream", None));
    let wrapped = |c: &Comparison| -> &'static str {
        const NOW: &str = "custody (caching, wrapped stream): allocate+close";
        const BEFORE: &str = "custody (caching): allocate+close";
        if c.samples(NOW).is_none() && c.samples(BEFORE).is_some() {
            BEFORE
        } else {
            NOW
        }
    };
    let wrapped_name = py_pair.map_or("custody (caching, wrapped stream): allocate+close", wrapped);
    const CORE: &str = "cuda.core: allocate+close";
    const TORCH: &str = "PyTorch: caching_allocator_alloc+delete";
    for (name, comparison, custody, other, who, limit) in [
        (
            "Python allocate+close ≤ 0.75 × cuda.core's time",
            py_pair,
            "custody: allocate+close",
            CORE,
            "cuda.core",
            0.75,
        ),
        (
            "Python allocate+close from the caching resource on a created stream ≤ 0.35 × cuda.core's time",
            py_pair,
            "custody (caching, created stream): allocate+close",
            CORE,
            "cuda.core",
            0.35,
        ),
        (
            "Python allocate+close from the caching resource on a wrapped stream ≤ 0.35 × cuda.core's time",
            py_pair,
            wrapped_name,
            CORE,
            "cuda.core",
            0.35,
        ),
        (
            "Python caching allocate+close on a created stream ≤ PyTorch's caching_allocator_alloc+delete",
            py_pair,
            "custody (caching, created stream): allocate+close",
            TORCH,
            "PyTorch",
            1.0,
        ),
        (
            "Python caching allocate+close on a wrapped stream ≤ PyTorch's caching_allocator_alloc+delete",
            py_pair,
            wrapped_name,
            TORCH,
            "PyTorch",
            1.0,
        ),
        (
            "Python set_deallocation_stream ≤ 0.4 × cuda.core's time",
            py_set,
            "custody: set_deallocation_stream",
            "cuda.core: set_deallocation_stream",
            "cuda.core",
            0.4,
        ),
    ] {
        let limit = Limit::AtMost(limit, "x");
        let ratio = comparison.and_then(|c| c.ratio(custody, other));
        out.push(match (ratio, comparison) {
            (Some(r), Some(c)) => Target::measured(
                name,
                limit,
                r,
                format!("{} ({}, paired)", x(r), c.against(custody, other)),
            ),
            _ if comparison.is_some_and(|c| c.samples(other).is_some()) => Target::missing(
                name,
                limit,
                format!("not measured (no `{custody}` variant)"),
            ),
            _ => Target::missing(name, limit, python_missing(python, who)),
        });
    }

    // 3. Cross-thread drop of a created-stream buffer (no context call, D2).
    let name = "cross-thread drop of a created-stream buffer within 50 ns of a same-thread drop";
    let limit = Limit::AtMost(50.0, "ns");
    out.push(match rust.and_then(|r| r.find("drop", None)) {
        Some(c) => {
            let d = c.delta("other thread", "same thread").unwrap_or(f64::NAN);
            let token = c
                .delta("other thread, legacy token", "same thread")
                .map_or(String::new(), |t| {
                    format!("; a legacy-token buffer, activating its context: {t:+.0} ns")
                });
            Target::measured(
                name,
                limit,
                d,
                format!(
                    "{d:+.0} ns ({}, paired{token})",
                    c.against("other thread", "same thread")
                ),
            )
        }
        None => Target::missing(name, limit, no_rust()),
    });

    // 4. Eight threads: custody's throughput over raw's, paired.
    let eight = rust.and_then(|r| r.find("threads", Some(8)));
    for (name, variant) in [
        (
            "8-thread DevicePtrHandle throughput ≥ 0.9 × the raw driver's",
            "handle",
        ),
        (
            "8-thread Buffer allocate+close throughput ≥ 0.9 × the raw driver's",
            "buffer, close",
        ),
    ] {
        let limit = Limit::AtLeast(0.9, "x");
        out.push(
            match eight.and_then(|c| c.ratio("raw", variant).map(|r| (c, r))) {
                Some((c, r)) => Target::measured(
                    name,
                    limit,
                    r,
                    format!(
                    "{} ({} per pair, wall time over all threads' pairs; raw+2 cuCtxGetCurrent {})",
                    x(r),
                    c.against(variant, "raw"),
                    c.ratio("raw", "raw+2 cuCtxGetCurrent").map_or("not measured".into(), x)
                ),
                ),
                None => {
                    Target::missing(name, limit, "not measured (no 8-thread comparison)".into())
                }
            },
        );
    }

    // 5. Live buffers.
    let name = "flat cost from 1 to 1e6 live buffers";
    // Flat: custody's ratio to the raw pair never grows more than 10% over its value with one
    // live buffer (the driver's own growth is not custody's). The value is that growth.
    let limit = Limit::AtMost(1.10, "x");
    let live = rust.map(|r| r.group("live")).unwrap_or_default();
    out.push(match (live.first(), live.last()) {
        (Some(first), Some(last)) if live.len() > 1 => {
            let (r0, r1) = (
                first.ratio("handle", "raw").unwrap_or(f64::NAN),
                last.ratio("handle", "raw").unwrap_or(f64::NAN),
            );
            let worst = live
                .iter()
                .filter_map(|c| c.ratio("handle", "raw"))
                .fold(f64::NAN, f64::max);
            let (h0, h1) = (
                first.median("handle").unwrap_or(f64::NAN),
                last.median("handle").unwrap_or(f64::NAN),
            );
            let (w0, w1) = (
                first.median("raw").unwrap_or(f64::NAN),
                last.median("raw").unwrap_or(f64::NAN),
            );
            Target::measured(
                name,
                limit,
                worst / r0,
                format!(
                    "custody/raw {} at {} live, {} at {}, at most {}; custody {h0:.0} → {h1:.0} ns, raw {w0:.0} → {w1:.0} ns",
                    x(r0),
                    first.param.unwrap_or(0),
                    x(r1),
                    last.param.unwrap_or(0),
                    x(worst)
                ),
            )
        }
        _ => Target::missing(name, limit, no_rust()),
    });
    out
}

fn python_missing(python: Option<&Suite>, who: &str) -> String {
    let Some(python) = python else {
        return "not measured (no Python results)".to_owned();
    };
    for skip in python.json["skipped"].as_array().into_iter().flatten() {
        if skip["name"] == who {
            return format!(
                "not measured ({who}: {})",
                skip["reason"].as_str().unwrap_or("skipped")
            );
        }
    }
    "not measured".to_owned()
}

// ----------------------------------------------------------------------------------------
// Rendering.

fn ns(v: Option<f64>) -> String {
    match v {
        Some(v) if v.is_finite() && v >= 100.0 => format!("{v:.0}"),
        Some(v) if v.is_finite() => format!("{v:.1}"),
        _ => "-".to_owned(),
    }
}

fn verdict(met: Option<bool>) -> &'static str {
    match met {
        Some(true) => "met",
        Some(false) => "**missed**",
        None => "not measured",
    }
}

fn header(run: &Run) -> String {
    let s = run.any();
    let d = &s.json["driver"];
    let version = d["version"].as_i64().unwrap_or(0);
    let when = s.json["unix_time"].as_i64().unwrap_or(0);
    let host = &s.json["host"];
    let mut out = String::new();
    let _ = writeln!(
        out,
        "Measured {} (unix time {when}) on {} {} with {} CPUs; driver `{}` (CUDA {}.{}, {}), device 0: {}.",
        date(when),
        host["os"].as_str().unwrap_or("?"),
        host["arch"].as_str().unwrap_or("?"),
        host["cpus"].as_u64().unwrap_or(0),
        d["path"].as_str().unwrap_or("?"),
        version / 1000,
        version % 1000 / 10,
        if s.driver_emulated() { "the **emulated** driver" } else { "a real driver" },
        d["device"].as_str().unwrap_or("?"),
    );
    if let Some(rust) = &run.rust {
        let st = &rust.json["settings"];
        let _ = writeln!(
            out,
            "Rust: {} run, {} paired samples per comparison, ~{} ms measured per variant, up to {} live buffers.",
            if st["quick"].as_bool().unwrap_or(false) { "quick" } else { "full" },
            st["samples"].as_u64().unwrap_or(0),
            st["measurement_ms"].as_u64().unwrap_or(0),
            st["max_live"].as_u64().unwrap_or(0),
        );
    }
    if let Some(py) = &run.python {
        let st = &py.json["settings"];
        let versions: Vec<String> = py.json["versions"]
            .as_object()
            .into_iter()
            .flatten()
            .map(|(k, v)| format!("{k} {}", v.as_str().unwrap_or("?")))
            .collect();
        let _ = writeln!(
            out,
            "Python {}: {} pairs × {} interleaved repetitions; {}.",
            py.json["host"]["python"].as_str().unwrap_or("?"),
            st["pairs"].as_u64().unwrap_or(0),
            st["samples"].as_u64().unwrap_or(0),
            if versions.is_empty() {
                "no library versions recorded".to_owned()
            } else {
                versions.join(", ")
            }
        );
    }
    out
}

/// `YYYY-MM-DD` (UTC) from a unix time, without a date crate.
fn date(unix: i64) -> String {
    let days = unix.div_euclid(86_400);
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    format!("{:04}-{:02}-{:02}", if m <= 2 { y + 1 } else { y }, m, d)
}

/// A table of every variant of one comparison.
fn comparison_table(out: &mut String, c: &Comparison) {
    let _ = writeln!(out, "\n**{}**", c.title);
    let base = c.baseline.as_deref();
    let _ = writeln!(
        out,
        "\n| variant | median ns/{op} | p25–p75 | × {b} | Δ ns vs {b} | what is timed |",
        op = c.op,
        b = base.unwrap_or("-")
    );
    let _ = writeln!(out, "|---|---:|---:|---:|---:|---|");
    for v in &c.variants {
        let (ratio, delta) = match base {
            Some(b) if b != v.name => (
                c.ratio(&v.name, b)
                    .map_or("-".into(), |r| format!("{r:.3}")),
                c.delta(&v.name, b)
                    .map_or("-".into(), |d| format!("{d:+.0}")),
            ),
            Some(_) => ("1".to_owned(), "0".to_owned()),
            None => ("-".to_owned(), "-".to_owned()),
        };
        let _ = writeln!(
            out,
            "| {} | {} | {}–{} | {ratio} | {delta} | {} |",
            v.name,
            ns(Some(median(&v.ns))),
            ns(Some(quantile(&v.ns, 0.25))),
            ns(Some(quantile(&v.ns, 0.75))),
            v.what
        );
    }
}

/// One table for a parametrised group: a row per parameter.
fn param_table(out: &mut String, comparisons: &[&Comparison], param_name: &str, throughput: bool) {
    let Some(first) = comparisons.first() else {
        return;
    };
    let names: Vec<&str> = first.variants.iter().map(|v| v.name.as_str()).collect();
    let base = first.baseline.as_deref().unwrap_or("raw");
    let _ = writeln!(out, "\n**{}**", first.title);
    let mut head = format!("\n| {param_name} |");
    let mut rule = "\n|---:|".to_owned();
    for n in &names {
        let _ = write!(head, " {n} ns/{} |", first.op);
        rule.push_str("---:|");
    }
    for n in names.iter().filter(|n| **n != base) {
        if throughput {
            let _ = write!(head, " {n} throughput × {base} |");
        } else {
            let _ = write!(head, " {n} × {base} |");
        }
        rule.push_str("---:|");
    }
    out.push_str(&head);
    out.push_str(&rule);
    out.push('\n');
    for c in comparisons {
        let mut row = format!("| {} |", c.param.unwrap_or(0));
        for n in &names {
            let _ = write!(row, " {} |", ns(c.median(n)));
        }
        for n in names.iter().filter(|n| **n != base) {
            let r = if throughput {
                c.ratio(base, n)
            } else {
                c.ratio(n, base)
            };
            let _ = write!(row, " {} |", r.map_or("-".into(), |r| format!("{r:.3}")));
        }
        out.push_str(&row);
        out.push('\n');
    }
    if throughput {
        let _ = writeln!(
            out,
            "\nns/pair is wall time divided by all threads' pairs (inverse throughput); the ratio is \
             custody's throughput over raw's, the median of paired samples."
        );
    }
}

/// The generated text of one run.
fn render_run(run: &Run, rel_dir: &str, plots: &[String]) -> String {
    let mut out = String::new();
    out.push_str(&header(run));
    if run.any().driver_stub() {
        out.push_str(
            "\n> **Stub-driver figures.** `bench/stub_driver.c`: the emulator, with \
             `cuMemAllocFromPoolAsync`, `cuMemFreeAsync`, `cuCtxGetCurrent`, \
             `cuStreamIsCapturing`, `cuEventRecord` and `cuStreamWaitEvent` answered in a few \
             nanoseconds, so that what is timed is the \
             bindings' own work. Not GPU figures: on a GPU every library also pays the driver's \
             own time (about 670 ns per pair on the H200), which brings ratios closer to 1.\n",
        );
    } else if run.any().driver_emulated() {
        out.push_str(
            "\n> **Emulator figures.** The emulated driver runs on the CPU, behind one lock; its \
             absolute times say nothing about a GPU. Only custody's overhead as a ratio to the \
             emulator's raw calls carries over, and only roughly: an emulated call costs more \
             than a real one, which shrinks ratios, while custody's own extra driver calls \
             (`cuCtxGetCurrent`, `cuCtxSetCurrent`) cost more too, which grows them.\n",
        );
    }
    out.push_str("\n### Targets\n\n| target | measured | verdict |\n|---|---|---|\n");
    for t in targets(run) {
        let _ = writeln!(out, "| {} | {} | {} |", t.name, t.measured, verdict(t.met));
    }
    if let Some(rust) = &run.rust {
        out.push_str("\n### Rust (`memory/benches/custody_vs_raw`)\n");
        for group in [
            "pair",
            "pair-legacy",
            "drop",
            "set_deallocation_stream",
            "deferred",
        ] {
            for c in rust.group(group) {
                comparison_table(&mut out, c);
            }
        }
        param_table(&mut out, &rust.group("threads"), "threads", true);
        param_table(&mut out, &rust.group("live"), "live buffers", false);
    }
    if let Some(py) = &run.python {
        out.push_str("\n### Python (`bench/python_bench.py`)\n");
        for skip in py.json["skipped"].as_array().into_iter().flatten() {
            let _ = writeln!(
                out,
                "\n- skipped {}: {}",
                skip["name"].as_str().unwrap_or("?"),
                skip["reason"].as_str().unwrap_or("?")
            );
        }
        for c in py.comparisons.iter().filter(|c| c.group != "py-threads") {
            comparison_table(&mut out, c);
        }
        param_table(&mut out, &py.group("py-threads"), "threads", false);
        let ratios: Vec<(&String, f64)> = py.json["findings"]
            .as_object()
            .into_iter()
            .flatten()
            .filter(|(k, _)| k.starts_with("custody / cuda.core"))
            .filter_map(|(k, v)| Some((k, v.as_f64()?)))
            .collect();
        if !ratios.is_empty() {
            out.push_str(
                "\n**custody's time over cuda.core's for the same calls** (median of paired \
                 repetitions; below 1 is faster)\n\n| calls | custody / cuda.core |\n|---|---:|\n",
            );
            for (k, v) in ratios {
                let what = k.trim_start_matches("custody / cuda.core, ");
                let _ = writeln!(out, "| {what} | {v:.3} |");
            }
        }
        if let Some(raw) = py.json["raw_c_pair_ns"].as_f64() {
            let _ = writeln!(
                out,
                "\nRaw C pair from the Rust benchmark of this run: {raw:.1} ns."
            );
        }
    }
    if !plots.is_empty() {
        out.push_str("\n### Plots\n\n");
        for p in plots {
            let _ = writeln!(out, "![{p}]({rel_dir}/{p})");
        }
    }
    out
}

/// Draws the run's PNGs with `bench/plot.py` in `.venv` (matplotlib, installed on first use).
///
/// matplotlib rather than the plotters crate: plotters needs a system font stack or a bundled
/// font to draw text, and would add its dependency tree to every `cargo xtask` build, while
/// `.venv` already exists for the Python suite.
fn plot_run(root: &Path, run: &Run) -> Result<Vec<String>> {
    let python = crate::venv::venv_python(root)?;
    if !cmd::succeeds(&python, ["-c", "import matplotlib"]) {
        cmd::run(Command::new(&python).args(["-m", "pip", "install", "--quiet", "matplotlib"]))
            .context("installing matplotlib into .venv for the plots")?;
    }
    let stdout = cmd::stdout_of(
        crate::venv::in_venv(root, &python)
            .arg(root.join("bench/plot.py"))
            .arg(&run.dir),
        "bench/plot.py",
    )?;
    Ok(String::from_utf8_lossy(&stdout)
        .lines()
        .filter(|l| l.ends_with(".png"))
        .map(str::to_owned)
        .collect())
}

/// Replaces the text between a run's markers in the document, or appends a section.
fn splice(doc: &str, label: &str, device: &str, body: &str) -> String {
    let begin = format!("<!-- bench:{label}:begin -->");
    let end = format!("<!-- bench:{label}:end -->");
    if let (Some(b), Some(e)) = (doc.find(&begin), doc.find(&end)) {
        if b < e {
            return format!("{}{begin}\n{}\n{}", &doc[..b], body.trim_end(), &doc[e..]);
        }
    }
    format!(
        "{}\n## {device} (run `{label}`)\n\n{begin}\n{}\n{end}\n",
        doc.trim_end(),
        body.trim_end()
    )
}

fn render(root: &Path) -> Result<()> {
    let runs_dir = root.join(RUNS_DIR);
    let mut runs = Vec::new();
    if runs_dir.is_dir() {
        let mut dirs: Vec<PathBuf> = fs::read_dir(&runs_dir)?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.is_dir())
            .collect();
        dirs.sort();
        for dir in dirs {
            if let Some(run) = Run::load(&dir)? {
                runs.push(run);
            }
        }
    }
    if runs.is_empty() {
        bail!("no stored runs under {} to render", runs_dir.display());
    }
    let doc_path = root.join(DOC);
    let mut doc = fs::read_to_string(&doc_path).unwrap_or_else(|_| "# Benchmarks\n".to_owned());
    for run in &runs {
        // The summary first: the targets plot is drawn from it.
        write_summary(run)?;
        let plots = plot_run(root, run)?;
        let body = render_run(run, &format!("benchmarks/{}", run.label), &plots);
        doc = splice(&doc, &run.label, &run.any().device(), &body);
        println!(
            "xtask bench: rendered run `{}` ({} plots)",
            run.label,
            plots.len()
        );
    }
    fs::write(&doc_path, doc)?;
    println!("xtask bench: wrote {}", doc_path.display());
    Ok(())
}

/// `summary.json` next to a run's samples: medians, paired ratios and the target verdicts.
fn write_summary(run: &Run) -> Result<()> {
    let mut comparisons = Vec::new();
    for suite in [&run.rust, &run.python].into_iter().flatten() {
        for c in &suite.comparisons {
            let variants: Vec<Value> = c
                .variants
                .iter()
                .map(|v| {
                    let base = c.baseline.as_deref().filter(|b| *b != v.name);
                    json!({
                        "name": v.name,
                        "median_ns": median(&v.ns),
                        "p25_ns": quantile(&v.ns, 0.25),
                        "p75_ns": quantile(&v.ns, 0.75),
                        "ratio_to_baseline": base.and_then(|b| c.ratio(&v.name, b)),
                        "delta_ns_to_baseline": base.and_then(|b| c.delta(&v.name, b)),
                    })
                })
                .collect();
            comparisons.push(json!({
                "group": c.group, "param": c.param, "baseline": c.baseline, "variants": variants,
            }));
        }
    }
    let targets: Vec<Value> = targets(run)
        .into_iter()
        .map(|t| {
            json!({
                "target": t.name, "measured": t.measured, "met": t.met,
                "value": t.value, "limit": t.limit.json(),
            })
        })
        .collect();
    let summary = json!({
        "format": "custody-bench-summary/1",
        "run": run.label,
        "device": run.any().device(),
        "emulated": run.any().driver_emulated(),
        "targets": targets,
        "comparisons": comparisons,
    });
    fs::write(
        run.dir.join("summary.json"),
        serde_json::to_string_pretty(&summary)? + "\n",
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slugs_name_runs_after_devices() {
        assert_eq!(slug("NVIDIA H200"), "h200");
        assert_eq!(slug("NVIDIA H100 80GB HBM3"), "h100-80gb-hbm3");
        assert_eq!(
            slug("custody emulated device 0"),
            "custody-emulated-device-0"
        );
        assert_eq!(slug("???"), "gpu");
    }

    #[test]
    fn statistics_are_medians_and_paired_ratios() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), 2.5);
        assert_eq!(quantile(&[1.0, 2.0, 3.0, 4.0, 5.0], 0.25), 2.0);
        let c = Comparison {
            group: "pair".into(),
            param: None,
            title: String::new(),
            op: "pair".into(),
            baseline: Some("raw".into()),
            variants: vec![
                VariantSamples {
                    name: "raw".into(),
                    what: String::new(),
                    ns: vec![100.0, 200.0, 400.0],
                },
                VariantSamples {
                    name: "handle".into(),
                    what: String::new(),
                    ns: vec![110.0, 230.0, 400.0],
                },
            ],
        };
        assert_eq!(c.ratio("handle", "raw"), Some(1.1));
        assert_eq!(c.delta("handle", "raw"), Some(10.0));
        assert_eq!(c.ratio("missing", "raw"), None);
    }

    #[test]
    fn splicing_keeps_the_text_around_the_markers() {
        let doc = "# B\nintro\n<!-- bench:h200:begin -->\nold\n<!-- bench:h200:end -->\nanalysis\n";
        let out = splice(doc, "h200", "NVIDIA H200", "new table");
        assert_eq!(
            out,
            "# B\nintro\n<!-- bench:h200:begin -->\nnew table\n<!-- bench:h200:end -->\nanalysis\n"
        );
        let appended = splice(doc, "emulator", "emu", "t");
        assert!(appended.starts_with(doc.trim_end()));
        assert!(appended.contains("## emu (run `emulator`)\n\n<!-- bench:emulator:begin -->\nt\n<!-- bench:emulator:end -->"));
    }

    #[test]
    fn dates_are_civil_utc() {
        assert_eq!(date(0), "1970-01-01");
        assert_eq!(date(1_700_000_000), "2023-11-14");
    }

    #[test]
    fn arguments_are_checked() {
        let args = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert!(parse(&args(&["--bogus"])).is_err());
        assert!(parse(&args(&["--label", "H200"])).is_err());
        let o = parse(&args(&[
            "--from-results",
            "r",
            "--label",
            "h200",
            "--no-python",
        ]))
        .unwrap();
        assert_eq!(o.from_results, Some(PathBuf::from("r")));
        assert_eq!(o.label.as_deref(), Some("h200"));
        assert!(!o.python);
    }

    #[test]
    fn help_asks_for_the_usage_which_names_every_option() {
        let args = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert!(parse(&args(&["--help"])).unwrap().help);
        assert!(parse(&args(&["-h"])).unwrap().help);
        assert!(!parse(&args(&["--stub"])).unwrap().help);
        // Every option `parse` accepts (the list its refusal gives) is in the usage text.
        let refusal = parse(&args(&["--bogus"])).unwrap_err().to_string();
        let listed = refusal.split("(expected ").nth(1).unwrap();
        for option in listed.trim_end_matches(')').split(", ") {
            let option = option.split(' ').next().unwrap();
            assert!(USAGE.contains(option), "the usage does not name {option}");
        }
    }
}
