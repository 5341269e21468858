//! Paired, interleaved sampling on criterion, and the JSON record `cargo xtask bench` reads.
//!
//! A [`Comparison`] is one criterion benchmark whose every sample runs *all* its variants
//! back to back with the same iteration count, starting with a different variant each sample.
//! A drift in the machine (clock, other processes, a driver's background work) therefore lands
//! on raw and custody alike, and each sample gives one paired measurement per variant; ratios
//! are medians of per-sample ratios. Criterion sizes the samples, warms up, filters and prints;
//! the figure it prints is the comparison's subject (a custody variant). The paired samples of
//! every variant go to a JSON file ([`write_json`]); `cargo xtask bench` turns that file into
//! the tables and plots of `docs/benchmarks.md`.

use std::cell::RefCell;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use criterion::{BenchmarkId, Criterion, SamplingMode};

/// How long and how often to sample: the full run (a GPU host) or a quick one (the emulator on
/// a small machine).
#[derive(Debug, Clone)]
pub struct Settings {
    pub quick: bool,
    /// Samples per comparison (criterion's `sample_size`, at least 10).
    pub samples: usize,
    pub warm_up: Duration,
    /// Measured time of the subject variant per comparison; the other variants take about as
    /// long again each.
    pub measurement: Duration,
    /// The largest number of live buffers the `live` group holds.
    pub max_live: usize,
    /// Thread counts of the `threads` group.
    pub threads: Vec<usize>,
    /// Counting mode, for instruction counts under callgrind (`bench/callgrind.py --rust`):
    /// run only the variants named `group/variant` (or `group/param/variant`) in
    /// `CUSTODY_BENCH_VARIANT` (`;`-separated), `CUSTODY_BENCH_COUNT` iterations each, once, without criterion.
    pub count: Option<(u64, Vec<String>)>,
}

impl Settings {
    /// From the environment: `CUSTODY_BENCH_QUICK=1` for the short run,
    /// `CUSTODY_BENCH_MAX_LIVE=N` and `CUSTODY_BENCH_THREADS=1,2,4` to override.
    pub fn from_env() -> Settings {
        let quick = std::env::var("CUSTODY_BENCH_QUICK").is_ok_and(|v| v != "0" && !v.is_empty());
        let max_live = std::env::var("CUSTODY_BENCH_MAX_LIVE")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(1_000_000);
        let threads = std::env::var("CUSTODY_BENCH_THREADS")
            .ok()
            .map(|v| v.split(',').filter_map(|t| t.trim().parse().ok()).collect())
            .unwrap_or_else(|| vec![1, 2, 4, 8, 16]);
        let count = std::env::var("CUSTODY_BENCH_COUNT")
            .ok()
            .and_then(|v| v.parse().ok())
            .map(|n| {
                let names = std::env::var("CUSTODY_BENCH_VARIANT").unwrap_or_default();
                (n, names.split(';').map(|v| v.trim().to_owned()).collect())
            });
        if quick {
            Settings {
                count,
                quick,
                samples: 15,
                warm_up: Duration::from_millis(100),
                measurement: Duration::from_millis(400),
                max_live,
                threads,
            }
        } else {
            Settings {
                count,
                quick,
                samples: 30,
                warm_up: Duration::from_millis(500),
                measurement: Duration::from_millis(2000),
                max_live,
                threads,
            }
        }
    }
}

/// One way of doing the measured operation. `run(iters)` performs `iters` iterations and
/// returns the time they took, excluding any setup it chose not to time.
pub struct Variant<'a> {
    pub name: &'static str,
    pub what: &'static str,
    pub run: Box<dyn FnMut(u64) -> Duration + 'a>,
}

impl<'a> Variant<'a> {
    pub fn new(
        name: &'static str,
        what: &'static str,
        run: impl FnMut(u64) -> Duration + 'a,
    ) -> Variant<'a> {
        Variant {
            name,
            what,
            run: Box::new(run),
        }
    }
}

/// Times `iters` runs of `f`.
#[inline]
pub fn timed(iters: u64, mut f: impl FnMut()) -> Duration {
    let start = Instant::now();
    for _ in 0..iters {
        f();
    }
    start.elapsed()
}

/// Variants measured side by side.
pub struct Comparison<'a> {
    /// Criterion group and JSON group (`pair`, `threads`, ...).
    pub group: &'static str,
    /// The parameter within the group (thread count, live buffers), if any.
    pub param: Option<u64>,
    pub title: &'static str,
    /// What one operation is (the unit is nanoseconds per such operation).
    pub op: &'static str,
    /// Operations per iteration (threads × 1 for the `threads` group): per-operation times are
    /// the iteration's time divided by this, so they read as inverse throughput.
    pub ops_per_iter: u64,
    /// The variant ratios are taken against.
    pub baseline: Option<&'static str>,
    /// The variant whose time criterion prints.
    pub subject: &'static str,
    pub variants: Vec<Variant<'a>>,
    /// Run after each variant in each sample, untimed (a stream synchronisation).
    pub between: Box<dyn FnMut() + 'a>,
}

/// One comparison's paired samples, ready for JSON.
struct Record {
    group: &'static str,
    param: Option<u64>,
    title: &'static str,
    op: &'static str,
    baseline: Option<&'static str>,
    subject: &'static str,
    variants: Vec<(&'static str, &'static str)>,
    /// `samples[k][v]`: nanoseconds per operation of variant `v` in sample `k`.
    samples: Vec<Vec<f64>>,
    iters: Vec<u64>,
}

thread_local! {
    static RECORDS: RefCell<Vec<Record>> = const { RefCell::new(Vec::new()) };
}

/// Runs `comparison` as one criterion benchmark and records its paired samples.
pub fn run(c: &mut Criterion, settings: &Settings, comparison: Comparison<'_>) {
    let Comparison {
        group: group_name,
        param,
        title,
        op,
        ops_per_iter,
        baseline,
        subject,
        mut variants,
        mut between,
    } = comparison;
    if let Some((iters, wanted)) = &settings.count {
        for v in &mut variants {
            let name = match param {
                Some(p) => format!("{group_name}/{p}/{}", v.name),
                None => format!("{group_name}/{}", v.name),
            };
            if wanted.contains(&name) {
                let took = (v.run)(*iters);
                between();
                println!("counted {name}: {iters} iterations in {took:?}");
            }
        }
        return;
    }
    let subject_index = variants
        .iter()
        .position(|v| v.name == subject)
        .expect("the subject is one of the variants");
    let names: Vec<(&'static str, &'static str)> =
        variants.iter().map(|v| (v.name, v.what)).collect();
    let mut calls = 0usize;
    let mut samples: Vec<(u64, Vec<Duration>)> = Vec::new();

    let mut group = c.benchmark_group(group_name);
    group
        .sample_size(settings.samples)
        .warm_up_time(settings.warm_up)
        .measurement_time(settings.measurement)
        .nresamples(2_000)
        .sampling_mode(SamplingMode::Flat);
    let id = match param {
        Some(p) => BenchmarkId::new(subject, p),
        None => BenchmarkId::from_parameter(subject),
    };
    group.bench_function(id, |b| {
        b.iter_custom(|iters| {
            let n = variants.len();
            let first = calls % n;
            calls += 1;
            let mut times = vec![Duration::ZERO; n];
            for k in 0..n {
                let v = (first + k) % n;
                times[v] = (variants[v].run)(iters);
                between();
            }
            let subject_time = times[subject_index];
            samples.push((iters, times));
            subject_time
        })
    });
    group.finish();

    // Criterion's warm-up calls the routine too; the measured samples are the last
    // `sample_size` calls (test mode and `--profile-time` make fewer or other calls: keep what
    // there is).
    if samples.len() > settings.samples {
        samples.drain(..samples.len() - settings.samples);
    }
    if samples.is_empty() {
        return; // filtered out
    }
    let per_op = |d: Duration, iters: u64| d.as_nanos() as f64 / (iters * ops_per_iter) as f64;
    let record = Record {
        group: group_name,
        param,
        title,
        op,
        baseline,
        subject,
        variants: names,
        iters: samples.iter().map(|(i, _)| *i).collect(),
        samples: samples
            .iter()
            .map(|(iters, times)| times.iter().map(|d| per_op(*d, *iters)).collect())
            .collect(),
    };
    print_summary(&record);
    RECORDS.with(|r| r.borrow_mut().push(record));
}

pub fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    let n = values.len();
    if n == 0 {
        f64::NAN
    } else if n % 2 == 1 {
        values[n / 2]
    } else {
        (values[n / 2 - 1] + values[n / 2]) / 2.0
    }
}

fn print_summary(record: &Record) {
    let base = record
        .baseline
        .and_then(|b| record.variants.iter().position(|(n, _)| *n == b));
    for (v, (name, _)) in record.variants.iter().enumerate() {
        let mut values: Vec<f64> = record.samples.iter().map(|s| s[v]).collect();
        let med = median(&mut values);
        let ratio = match base {
            Some(b) if b != v => {
                let mut ratios: Vec<f64> = record.samples.iter().map(|s| s[v] / s[b]).collect();
                format!(
                    "  {:.3}x {}",
                    median(&mut ratios),
                    record.baseline.unwrap_or("")
                )
            }
            _ => String::new(),
        };
        println!("    {:<28} {:>10.1} ns/{}{ratio}", name, med, record.op);
    }
}

/// Where the driver came from, for the JSON header.
pub struct DriverInfo {
    pub path: String,
    pub version: i32,
    pub emulated: bool,
    pub device: String,
}

fn json_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

fn json_number(x: f64) -> String {
    if x.is_finite() {
        format!("{x:.3}")
    } else {
        "null".to_owned()
    }
}

/// Writes every recorded comparison to `path` (format `custody-bench/1`, suite `rust`).
///
/// Written by hand rather than with serde: the benchmark target then needs no dependency
/// beyond criterion, and the shape is flat.
pub fn write_json(path: &str, settings: &Settings, driver: &DriverInfo) -> std::io::Result<()> {
    let when = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    let mut out = String::new();
    out.push_str("{\n  \"format\": \"custody-bench/1\",\n  \"suite\": \"rust\",\n");
    out.push_str(&format!("  \"unix_time\": {when},\n"));
    out.push_str(&format!(
        "  \"driver\": {{\"path\": {}, \"version\": {}, \"emulated\": {}, \"device\": {}}},\n",
        json_string(&driver.path),
        driver.version,
        driver.emulated,
        json_string(&driver.device)
    ));
    out.push_str(&format!(
        "  \"host\": {{\"os\": {}, \"arch\": {}, \"cpus\": {cpus}}},\n",
        json_string(std::env::consts::OS),
        json_string(std::env::consts::ARCH)
    ));
    out.push_str(&format!(
        "  \"settings\": {{\"quick\": {}, \"samples\": {}, \"measurement_ms\": {}, \"max_live\": {}}},\n",
        settings.quick,
        settings.samples,
        settings.measurement.as_millis(),
        settings.max_live
    ));
    out.push_str("  \"comparisons\": [\n");
    RECORDS.with(|records| {
        let records = records.borrow();
        for (i, r) in records.iter().enumerate() {
            out.push_str("    {");
            out.push_str(&format!("\"group\": {}, ", json_string(r.group)));
            out.push_str(&format!(
                "\"param\": {}, ",
                r.param.map_or("null".to_owned(), |p| p.to_string())
            ));
            out.push_str(&format!("\"title\": {}, ", json_string(r.title)));
            out.push_str(&format!("\"op\": {}, ", json_string(r.op)));
            out.push_str(&format!(
                "\"baseline\": {}, ",
                r.baseline.map_or("null".to_owned(), json_string)
            ));
            out.push_str(&format!("\"subject\": {},\n", json_string(r.subject)));
            out.push_str("     \"variants\": [\n");
            for (v, (name, what)) in r.variants.iter().enumerate() {
                let values: Vec<String> = r.samples.iter().map(|s| json_number(s[v])).collect();
                out.push_str(&format!(
                    "       {{\"name\": {}, \"what\": {}, \"ns_per_op\": [{}]}}{}\n",
                    json_string(name),
                    json_string(what),
                    values.join(", "),
                    if v + 1 < r.variants.len() { "," } else { "" }
                ));
            }
            let iters: Vec<String> = r.iters.iter().map(u64::to_string).collect();
            out.push_str(&format!("     ], \"iters\": [{}]}}", iters.join(", ")));
            out.push_str(if i + 1 < records.len() { ",\n" } else { "\n" });
        }
    });
    out.push_str("  ]\n}\n");
    if let Some(parent) = std::path::Path::new(path).parent() {
        if !parent.as_os_str().is_empty() {
            std::fs::create_dir_all(parent)?;
        }
    }
    std::fs::write(path, out)
}
