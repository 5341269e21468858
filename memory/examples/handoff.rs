//! The stream hand-off demo in Rust: who frees a buffer, on which stream, in which context.
//!
//! Three scenarios, each checked, on whatever driver loads (`CUSTODY_CUDA_DRIVER`, else the
//! system's `libcuda.so.1`):
//!
//! 1. **Hand-off.** A producer stream fills a buffer, a consumer stream waits on an event and
//!    reads it, and `set_deallocation_stream(consumer)` orders the free after the read.
//! 2. **Context-less drop.** A buffer recorded with the legacy default stream (a token whose
//!    meaning depends on the calling thread's context) is dropped on a thread that never had
//!    a context. The raw driver would fail there (`CUDA_ERROR_INVALID_CONTEXT`,
//!    docs/driver-facts.md F2); custody makes the recorded context current, frees, and restores.
//! 3. **Graph-retained.** A CUDA graph (the memory crate's `Graph`: a memset node and a memcpy
//!    node) keeps the buffer alive after the user closed it, and the launch still fills and
//!    copies it; closing the executable queues the memory for deferred cleanup, which frees it
//!    with its recipe while the user's thread has another context current.
//!
//! For each free it prints the pointer, the stream and context it ran in, the thread, and the
//! thread's context before and after. On the emulated driver those facts come from the
//! emulator's call log (and its hazard checker); on a real driver, from what custody knows
//! (the recorded recipe, `cuCtxGetCurrent` around the drop) and the pool's used memory coming
//! back to its baseline. The first lines say which driver was loaded.
//!
//! Run: `cargo xtask demo` (chooses the driver), or by hand:
//! `CUSTODY_CUDA_DRIVER=$PWD/target/debug/libcuda_emu.so cargo run -p cuda-custody-memory --example handoff`.
//! `--probe-driver` only says which driver loads: exit 0 for a real driver with a device,
//! 3 for the emulated driver, 2 when no usable driver loads. `--no-call-log` ignores the
//! emulator's call log and shows what a real driver would show (to try that path here).
//!
//! Which thread runs a deferred free (custody's cleanup worker, or `drain_deferred_cleanup` on the
//! caller's thread) is a race: on the emulator the call log says which; either way a probe queued
//! after the frees shows the context the worker was left with.

use std::ffi::{c_char, c_int, CStr};
use std::fmt::Display;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use handles::PoolAttribute;
use handles::{
    ContextFlags, ContextHandle, DevicePtrHandle, EventFlags, EventHandle, StreamFlags,
    StreamHandle, UserObjectOwnership,
};
use memory::{
    Buffer, DeviceMemoryResource, DeviceMemoryResourceOptions, Graph, MemoryResource,
    PoolMemoryResource,
};
use test_support::emu::{Call, Emulator};

/// Bytes per buffer: a multiple of 4 (fills) and small enough for any device.
const SIZE: usize = 1 << 16;

type Result<T, E = String> = std::result::Result<T, E>;

fn err(what: &str, error: impl Display) -> String {
    format!("{what}: {error}")
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args
        .iter()
        .map(String::as_str)
        .collect::<Vec<_>>()
        .as_slice()
    {
        [] | ["--no-call-log"] => match run(args.is_empty()) {
            Ok(()) => ExitCode::SUCCESS,
            Err(error) => {
                println!("\nhandoff (Rust): FAILED: {error}");
                ExitCode::FAILURE
            }
        },
        ["--probe-driver"] => probe(),
        _ => {
            eprintln!("usage: handoff [--probe-driver | --no-call-log]");
            ExitCode::from(64)
        }
    }
}

/// Which driver loads, in one line; see the module doc for the exit codes.
fn probe() -> ExitCode {
    match describe_driver() {
        Ok(driver) => {
            println!("{}", driver.line());
            if driver.emulated {
                ExitCode::from(3)
            } else {
                ExitCode::SUCCESS
            }
        }
        Err(error) => {
            println!("no usable CUDA driver: {error}");
            ExitCode::from(2)
        }
    }
}

/// The loaded driver, as the first lines of the output say it.
struct DriverInfo {
    path: String,
    version: i32,
    emulated: bool,
    devices: i32,
    /// Device 0's name (a real driver).
    name: String,
}

impl DriverInfo {
    fn line(&self) -> String {
        let version = format!(
            "CUDA {}.{} ({})",
            self.version / 1000,
            self.version % 1000 / 10,
            self.version
        );
        if self.emulated {
            format!(
                "emulated driver (cuda-emu, no GPU): {}, {version}, {} emulated devices",
                self.path, self.devices
            )
        } else {
            format!(
                "real GPU: {} (device 0 of {}); driver {}, {version}",
                self.name, self.devices, self.path
            )
        }
    }
}

/// Loads the driver, initialises it and reads device 0's name.
///
/// The example calls two driver functions that custody does not wrap (`cuDeviceGetCount`,
/// `cuDeviceGetName`) directly: an application may; the libraries leave driver calls to the
/// handles crate.
fn describe_driver() -> Result<DriverInfo> {
    let d = cuda_sys::driver().map_err(|e| err("loading the driver", e))?;
    // Initialises the driver and checks that device 0 exists.
    drop(ContextHandle::primary(0).map_err(|e| err("device 0's primary context", e))?);
    let mut devices: c_int = 0;
    // SAFETY: `devices` is a valid out-pointer; the driver is initialised (above).
    let status = unsafe { (d.cuDeviceGetCount)(&mut devices) };
    if status != 0 {
        return Err(format!("cuDeviceGetCount returned {status}"));
    }
    let mut device = 0;
    // SAFETY: `device` is a valid out-pointer; ordinal 0 exists (checked above).
    let status = unsafe { (d.cuDeviceGet)(&mut device, 0) };
    if status != 0 {
        return Err(format!("cuDeviceGet(0) returned {status}"));
    }
    let mut name = [0 as c_char; 256];
    // An optional symbol (diagnostics only): a driver without it shows "unknown".
    let status = match d.cuDeviceGetName {
        // SAFETY: `name` is writable for the 256 bytes passed as its length; `device` is valid.
        Some(get_name) => unsafe { get_name(name.as_mut_ptr(), name.len() as c_int, device) },
        None => 1,
    };
    let name = if status == 0 {
        // SAFETY: on success the driver wrote a NUL-terminated string into `name`.
        unsafe { CStr::from_ptr(name.as_ptr()) }
            .to_string_lossy()
            .into_owned()
    } else {
        format!("device 0 (cuDeviceGetName returned {status})")
    };
    Ok(DriverInfo {
        path: d.path().to_owned(),
        version: d.version(),
        emulated: d.is_emulated(),
        devices,
        name,
    })
}

/// What one drop or close saw on the thread that ran it.
#[derive(Clone, Debug)]
struct Observed {
    /// The thread's name ("main", "dropper", "custody-cleanup").
    thread: String,
    /// The thread's id in the emulator's call log.
    emu_thread: Option<u64>,
    /// The thread's current context just before and just after (0: none).
    before: u64,
    after: u64,
    /// The call-log window of the drop: `from <= seq < to`.
    from: u64,
    to: u64,
    /// What `close()` returned, for an explicit close.
    outcome: Option<String>,
}

/// The stream and context custody's recipe held just before the release.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Recorded {
    stream: u64,
    context: u64,
}

/// The recipe the memory's handle holds now.
fn recorded(handle: &DevicePtrHandle) -> Result<Recorded> {
    let recipe = handle
        .recipe()
        .ok_or("the buffer has no deallocation recipe")?;
    Ok(Recorded {
        stream: recipe.stream().raw() as u64,
        context: recipe.context().raw() as u64,
    })
}

/// The raw context current on the calling thread (0 for none).
fn current_raw() -> Result<u64> {
    Ok(ContextHandle::current()
        .map_err(|e| err("cuCtxGetCurrent", e))?
        .map_or(0, |c| c.raw() as u64))
}

/// The sequence number the next logged call will get.
fn mark(emu: Option<Emulator>) -> u64 {
    emu.and_then(|e| e.calls().last().map(|c| c.seq + 1))
        .unwrap_or(0)
}

/// Runs `release` on the calling thread, recording the thread's context around it.
fn observe(emu: Option<Emulator>, release: impl FnOnce() -> Option<String>) -> Result<Observed> {
    let before = current_raw()?;
    let from = mark(emu);
    let outcome = release();
    let to = mark(emu);
    let after = current_raw()?;
    Ok(Observed {
        thread: std::thread::current()
            .name()
            .unwrap_or("unnamed")
            .to_owned(),
        emu_thread: emu.map(|e| e.thread_id()),
        before,
        after,
        from,
        to,
        outcome,
    })
}

/// What a [`ContextProbe`] saw: the thread that dropped it, that thread's id in the call log,
/// and its current context.
type ProbeSeen = (String, Option<u64>, Result<u64>);

/// A deferred-cleanup payload that records, when it is dropped (by custody's cleanup worker, or
/// in `drain_deferred_cleanup`), the thread and the context current on it: queued right after
/// the graph's frees, it shows the context the worker was left with.
struct ContextProbe {
    emu: Option<Emulator>,
    seen: Arc<Mutex<Option<ProbeSeen>>>,
}

impl Drop for ContextProbe {
    fn drop(&mut self) {
        let thread = std::thread::current()
            .name()
            .unwrap_or("unnamed")
            .to_owned();
        let seen = (thread, self.emu.map(|e| e.thread_id()), current_raw());
        *self.seen.lock().unwrap_or_else(|e| e.into_inner()) = Some(seen);
    }
}

/// Names for raw values (contexts, streams, threads) in the output.
#[derive(Default)]
struct Names(Vec<(&'static str, u64, String)>);

impl Names {
    fn add(&mut self, kind: &'static str, raw: u64, name: impl Into<String>) {
        self.0.push((kind, raw, name.into()));
    }

    fn get(&self, kind: &str, raw: u64) -> String {
        if kind == "context" && raw == 0 {
            return "none".to_owned();
        }
        match self.0.iter().find(|(k, r, _)| *k == kind && *r == raw) {
            Some((_, _, name)) if kind == "thread" => name.clone(),
            Some((_, _, name)) => format!("{name} (0x{raw:x})"),
            None if kind == "thread" => format!("thread {raw}"),
            None => format!("0x{raw:x}"),
        }
    }
}

/// The demo's state: the driver, names, and the checks that failed.
struct Demo {
    emu: Option<Emulator>,
    names: Names,
    failures: Vec<String>,
    /// The current scenario's checks, printed at its end.
    checks: Vec<(bool, String)>,
    /// Cleanup errors and warnings reported through custody's hooks.
    reports: Arc<Mutex<Vec<String>>>,
}

impl Demo {
    /// Records a check; [`Demo::print_checks`] prints the scenario's checks after its facts.
    fn check(&mut self, ok: bool, what: impl Into<String>) {
        let what = what.into();
        if !ok {
            self.failures.push(what.clone());
        }
        self.checks.push((ok, what));
    }

    fn print_checks(&mut self) {
        println!("  checks:");
        for (ok, what) in self.checks.drain(..) {
            println!("    [{}] {what}", if ok { "ok" } else { "FAILED" });
        }
    }

    fn ctx(&self, raw: u64) -> String {
        self.names.get("context", raw)
    }

    fn stream(&self, raw: u64) -> String {
        self.names.get("stream", raw)
    }

    /// Prints what a free looked like, from the call log on the emulator and from the recipe
    /// and the thread's context on a real driver, and checks it ran on `stream` in `context`
    /// and left the thread's context as it found it.
    fn report_free(
        &mut self,
        ptr: u64,
        seen: &Observed,
        recorded: Recorded,
        stream: &StreamHandle,
        context: &ContextHandle,
    ) {
        let (stream_raw, context_raw) = (stream.raw() as u64, context.raw() as u64);
        self.check(
            recorded
                == Recorded {
                    stream: stream_raw,
                    context: context_raw,
                },
            format!(
                "custody's recipe at the free: stream {}, context {}",
                self.stream(recorded.stream),
                self.ctx(recorded.context)
            ),
        );
        println!("  freed 0x{ptr:x}:");
        println!(
            "    by       {}, on thread {}",
            seen.outcome
                .as_deref()
                .unwrap_or("the last reference's drop"),
            seen.thread
        );
        println!(
            "    thread's context before {}, after {}",
            self.ctx(seen.before),
            self.ctx(seen.after)
        );
        self.check(
            seen.before == seen.after,
            format!(
                "thread {}'s context binding is unchanged by the free",
                seen.thread
            ),
        );
        let Some(emu) = self.emu else {
            println!(
                "    stream   {} (custody's recipe; a real driver keeps no call log)",
                self.stream(recorded.stream)
            );
            println!(
                "    context  {} (custody's recipe)",
                self.ctx(recorded.context)
            );
            return;
        };
        let calls: Vec<Call> = emu
            .calls()
            .into_iter()
            .filter(|c| c.seq >= seen.from && c.seq < seen.to)
            .collect();
        let frees: Vec<&Call> = calls
            .iter()
            .filter(|c| c.ptr == Some(ptr) && c.function.starts_with("cuMemFree"))
            .collect();
        let [free] = frees.as_slice() else {
            self.check(
                false,
                format!(
                    "exactly one free of 0x{ptr:x} in the call log (found {})",
                    frees.len()
                ),
            );
            return;
        };
        let passed = free.stream.unwrap_or(0);
        let resolved = free.resolved_stream.unwrap_or(passed);
        println!(
            "    stream   {}{} (emulator's call log)",
            self.stream(passed),
            if resolved != passed {
                format!(", which the driver resolved to 0x{resolved:x}")
            } else {
                String::new()
            }
        );
        println!(
            "    context  {} current{} (emulator's call log)",
            self.ctx(free.context),
            match free.stream_context {
                Some(owner) if owner != free.context => {
                    format!("; the stream belongs to {}", self.ctx(owner))
                }
                _ => String::new(),
            }
        );
        // The thread's calls in the window; a cuCtxSetCurrent's target is the context the
        // thread's next call saw (the last one's, the context found after the release).
        let on_thread: Vec<&Call> = calls.iter().filter(|c| c.thread == free.thread).collect();
        let steps: Vec<String> = on_thread
            .iter()
            .enumerate()
            .map(|(i, c)| match c.function.as_str() {
                "cuCtxSetCurrent" => {
                    let target = on_thread.get(i + 1).map_or(seen.after, |next| next.context);
                    format!("cuCtxSetCurrent({})", self.ctx(target))
                }
                "cuCtxGetCurrent" => format!("cuCtxGetCurrent() = {}", self.ctx(c.context)),
                f if c.ptr == Some(ptr) => format!(
                    "{f}(0x{ptr:x}, {}) = {}",
                    self.stream(c.stream.unwrap_or(0)),
                    if c.result == 0 {
                        "CUDA_SUCCESS".to_owned()
                    } else {
                        format!("error {}", c.result)
                    }
                ),
                f => match c.ptr {
                    Some(other) => format!("{f}(0x{other:x}, ..)"),
                    None => format!("{f}()"),
                },
            })
            .collect();
        println!(
            "    driver calls on {}: {}",
            self.names.get("thread", free.thread),
            steps.join(", ")
        );
        let hazards: Vec<String> = emu
            .hazards()
            .into_iter()
            .filter(|h| h.ptr == ptr)
            .map(|h| format!("{}: {}", h.kind, h.detail))
            .collect();
        println!(
            "    hazards  {}",
            if hazards.is_empty() {
                "none (the checker saw the free ordered after every use)".to_owned()
            } else {
                hazards.join("; ")
            }
        );
        self.check(free.result == 0, "the free succeeded");
        self.check(
            passed == stream_raw,
            format!("freed on the recorded stream {}", self.stream(stream_raw)),
        );
        if stream.default_kind().is_some() {
            // A token means "the current context's stream": custody makes the recorded context
            // current for the call (docs/decisions.md D2).
            self.check(
                free.context == context_raw,
                format!(
                    "freed with the recorded context {} current",
                    self.ctx(context_raw)
                ),
            );
        } else {
            // A created stream names its context: the free is ordered there with whatever
            // context the thread has, so custody switches none (docs/decisions.md D2,
            // docs/driver-facts.md F4, F8).
            self.check(
                free.stream_context == Some(context_raw),
                format!(
                    "freed on a stream of the recorded context {}",
                    self.ctx(context_raw)
                ),
            );
            // Other calls of the same window (a deferred cleanup drain destroying a graph
            // executable, say) may switch contexts for themselves; the free itself runs with the
            // thread's own context, whatever it is.
            self.check(
                free.context == seen.before,
                format!(
                    "no context switch for a free on a created stream: freed with the thread's own {} current",
                    self.ctx(seen.before)
                ),
            );
        }
        self.check(
            Some(free.thread) == seen.emu_thread,
            format!("freed on the releasing thread ({})", seen.thread),
        );
        self.check(hazards.is_empty(), "no stream-order hazard");
    }

    /// Checks that the pool's used memory is back to `baseline` once `stream` has drained.
    fn check_pool(&mut self, mr: &DeviceMemoryResource, baseline: u64, stream: &StreamHandle) {
        if let Err(error) = stream.synchronize() {
            self.check(false, err("synchronizing the deallocation stream", error));
            return;
        }
        match mr.pool().attribute(PoolAttribute::USED_MEM_CURRENT) {
            Ok(used) => self.check(
                used == baseline,
                format!(
                    "pool used memory back at its baseline: {used} bytes (baseline {baseline})"
                ),
            ),
            Err(error) => self.check(false, err("reading the pool's used memory", error)),
        }
    }

    fn check_reports(&mut self) {
        let reports: Vec<String> =
            std::mem::take(&mut *self.reports.lock().unwrap_or_else(|e| e.into_inner()));
        for report in &reports {
            println!("  custody reported: {report}");
        }
        self.check(reports.is_empty(), "no cleanup error or warning reported");
        self.print_checks();
    }
}

fn used(mr: &DeviceMemoryResource) -> Result<u64> {
    mr.pool()
        .attribute(PoolAttribute::USED_MEM_CURRENT)
        .map_err(|e| err("reading the pool's used memory", e))
}

/// Runs the three scenarios; `call_log` false ignores the emulator's call log and hazard
/// checker and shows what a real driver would show.
fn run(call_log: bool) -> Result<()> {
    println!("custody hand-off demo (Rust)");
    let driver = describe_driver()?;
    println!("driver: {}", driver.line());
    let emu = Emulator::get().filter(|_| call_log);
    if !call_log {
        println!("        --no-call-log: the emulator's call log is ignored, as on a real driver");
    }
    if emu.is_some() {
        println!("        facts below are read from the emulator's call log and hazard checker");
    } else {
        println!(
            "        facts below are what custody recorded, cuCtxGetCurrent around each free, \
             and the pool's used memory"
        );
    }

    let reports = Arc::new(Mutex::new(Vec::new()));
    let sink = reports.clone();
    handles::set_cleanup_error_hook(Box::new(move |e| {
        sink.lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(format!("cleanup error: {e}"));
    }));
    let sink = reports.clone();
    handles::set_cleanup_warning_hook(Box::new(move |w| {
        sink.lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(format!("cleanup warning: {w}"));
    }));

    let mut demo = Demo {
        emu,
        names: Names::default(),
        failures: Vec::new(),
        checks: Vec::new(),
        reports,
    };
    if let Some(emu) = emu {
        demo.names.add("thread", emu.thread_id(), "main");
    }

    let a = ContextHandle::primary(0).map_err(|e| err("device 0's primary context", e))?;
    let b = ContextHandle::create(0, ContextFlags::SCHED_AUTO)
        .map_err(|e| err("creating a second context", e))?;
    demo.names.add("context", a.raw() as u64, "A");
    demo.names.add("context", b.raw() as u64, "B");
    println!(
        "contexts: A = device 0's primary context (0x{:x}); B = a second context on device 0 (0x{:x})",
        a.raw() as u64,
        b.raw() as u64
    );
    a.make_current().map_err(|e| err("making A current", e))?;
    // A pool of the demo's own, so that its used memory starts at 0 and only the demo moves it.
    let mr = DeviceMemoryResource::with_options(0, DeviceMemoryResourceOptions::default())
        .map_err(|e| err("creating a memory pool", e))?;
    println!("memory:   a stream-ordered memory pool of the demo's own on device 0");

    hand_off(&mut demo, &a, &mr)?;
    contextless_drop(&mut demo, &a, &mr)?;
    graph_retained(&mut demo, &a, &b, &mr)?;

    ContextHandle::clear_current().map_err(|e| err("cuCtxSetCurrent(NULL)", e))?;
    println!();
    let errors = handles::cleanup_error_count();
    if errors != 0 {
        demo.failures
            .push(format!("{errors} cleanup errors were reported"));
    }
    if demo.failures.is_empty() {
        if demo.emu.is_some() {
            println!(
                "handoff (Rust): passed on the emulated driver: 3 scenarios; the call log shows every \
                 free on its recorded stream, in its recorded context, with the freeing thread's \
                 context restored, and the hazard checker saw each free ordered after every use"
            );
        } else {
            println!(
                "handoff (Rust): passed on {}: 3 scenarios; every free left the freeing thread's \
                 context as it was and the pool's used memory back at its baseline (streams and \
                 contexts shown are custody's recipes: a real driver keeps no call log)",
                if driver.emulated {
                    "the emulated driver (--no-call-log)"
                } else {
                    "a real GPU"
                }
            );
        }
        Ok(())
    } else {
        Err(format!(
            "{} check(s) failed: {}",
            demo.failures.len(),
            demo.failures.join("; ")
        ))
    }
}

/// Scenario 1: producer and consumer streams, the free handed to the consumer.
fn hand_off(demo: &mut Demo, a: &ContextHandle, mr: &Arc<DeviceMemoryResource>) -> Result<()> {
    println!("\n[1/3] stream hand-off: the producer fills, the consumer reads, the consumer frees");
    let producer = StreamHandle::create(a, StreamFlags::DEFAULT, 0)
        .map_err(|e| err("creating a stream", e))?;
    let consumer = StreamHandle::create(a, StreamFlags::DEFAULT, 0)
        .map_err(|e| err("creating a stream", e))?;
    demo.names.add("stream", producer.raw() as u64, "producer");
    demo.names.add("stream", consumer.raw() as u64, "consumer");
    let baseline = used(mr)?;
    let buffer = mr
        .allocate(SIZE, &producer)
        .map_err(|e| err("allocating", e))?;
    let ptr = buffer.ptr();
    println!(
        "  allocated 0x{ptr:x} ({SIZE} bytes) on {}; recipe: {}",
        demo.stream(producer.raw() as u64),
        recipe_text(demo, &buffer)
    );
    buffer
        .fill(0x5au8, &producer)
        .map_err(|e| err("fill on the producer", e))?;
    let filled = EventHandle::create(a, EventFlags::DISABLE_TIMING).map_err(|e| err("event", e))?;
    filled.record(&producer).map_err(|e| err("record", e))?;
    consumer
        .wait_event(&filled)
        .map_err(|e| err("consumer waits", e))?;
    println!("  producer: fill with 0x5a, record an event; consumer: wait for the event");
    buffer
        .set_deallocation_stream(&consumer)
        .map_err(|e| err("set_deallocation_stream", e))?;
    println!(
        "  set_deallocation_stream(consumer): recipe now {}",
        recipe_text(demo, &buffer)
    );
    let mut bytes = vec![0u8; SIZE];
    buffer
        .copy_to_host(&mut bytes, &consumer)
        .map_err(|e| err("consumer reads", e))?;
    let read_ok = bytes.iter().all(|&b| b == 0x5a);
    let recipe = recorded(buffer.handle())?;
    let seen = observe(demo.emu, || {
        Some(match buffer.close() {
            Ok(()) => "close() -> Ok(())".to_owned(),
            Err(error) => format!("close() -> Err({error})"),
        })
    })?;
    demo.check(
        read_ok,
        format!("the consumer read back {SIZE} bytes of 0x5a"),
    );
    demo.check(
        seen.outcome
            .as_deref()
            .is_some_and(|o| o.ends_with("Ok(())")),
        "close() returned Ok",
    );
    demo.report_free(ptr, &seen, recipe, &consumer, a);
    demo.check_pool(mr, baseline, &consumer);
    demo.check_reports();
    Ok(())
}

/// Scenario 2: a legacy-default-stream buffer dropped on a thread that never had a context.
fn contextless_drop(
    demo: &mut Demo,
    a: &ContextHandle,
    mr: &Arc<DeviceMemoryResource>,
) -> Result<()> {
    println!(
        "\n[2/3] a buffer recorded with the legacy default stream, dropped on a thread with no context"
    );
    let legacy = StreamHandle::legacy();
    demo.names
        .add("stream", legacy.raw() as u64, "legacy default stream token");
    let baseline = used(mr)?;
    let buffer = mr
        .allocate(SIZE, &legacy)
        .map_err(|e| err("allocating", e))?;
    let ptr = buffer.ptr();
    buffer
        .fill(0x11u8, &legacy)
        .map_err(|e| err("fill on the legacy stream", e))?;
    println!(
        "  allocated 0x{ptr:x} ({SIZE} bytes) on thread main with A current; recipe: {}",
        recipe_text(demo, &buffer)
    );
    println!(
        "  (on a thread with no context the raw cuMemFreeAsync(0x{ptr:x}, CU_STREAM_LEGACY) fails \
         with CUDA_ERROR_INVALID_CONTEXT: docs/driver-facts.md F2)"
    );
    let recipe = recorded(buffer.handle())?;
    let emu = demo.emu;
    let dropper = std::thread::Builder::new()
        .name("dropper".into())
        .spawn(move || {
            observe(emu, move || {
                drop(buffer);
                None
            })
        })
        .map_err(|e| err("spawning a thread", e))?;
    let seen = dropper
        .join()
        .map_err(|_| "the dropping thread panicked".to_owned())??;
    if let Some(id) = seen.emu_thread {
        demo.names.add("thread", id, "dropper");
    }
    println!("  dropped on a new thread, \"dropper\", that never set a context");
    demo.check(seen.before == 0, "the dropping thread had no context");
    demo.report_free(ptr, &seen, recipe, &legacy, a);
    // The main thread still has A current: the legacy token resolves to A's legacy stream.
    demo.check_pool(mr, baseline, &legacy);
    demo.check_reports();
    Ok(())
}

/// Scenario 3: a buffer kept alive by a CUDA graph, freed by deferred cleanup.
fn graph_retained(
    demo: &mut Demo,
    a: &ContextHandle,
    b: &ContextHandle,
    mr: &Arc<DeviceMemoryResource>,
) -> Result<()> {
    println!("\n[3/3] a buffer retained by a CUDA graph, freed by deferred cleanup");
    let work = StreamHandle::create(a, StreamFlags::DEFAULT, 0)
        .map_err(|e| err("creating a stream", e))?;
    demo.names.add("stream", work.raw() as u64, "work");
    let baseline = used(mr)?;
    let buffer = mr.allocate(SIZE, &work).map_err(|e| err("allocating", e))?;
    let out = mr.allocate(SIZE, &work).map_err(|e| err("allocating", e))?;
    let ptr = buffer.ptr();
    println!(
        "  allocated 0x{ptr:x} ({SIZE} bytes) on {}; recipe: {}",
        demo.stream(work.raw() as u64),
        recipe_text(demo, &buffer)
    );
    let recipe = recorded(buffer.handle())?;

    let graph = Graph::in_context(a).map_err(|e| err("creating a graph", e))?;
    let fill = graph
        .add_memset(&[], &buffer, 0x22u8)
        .map_err(|e| err("adding a memset node", e))?;
    graph
        .add_memcpy(&[fill], &out, &buffer)
        .map_err(|e| err("adding a memcpy node", e))?;
    println!(
        "  a graph (memory crate's Graph): a memset node fills the buffer with 0x22, a memcpy node \
         copies it into a second buffer; each node retains the memory it touches"
    );
    work.synchronize().map_err(|e| err("synchronize", e))?;
    let held = used(mr)?;
    let from = mark(demo.emu);
    buffer.close().map_err(|e| err("close", e))?;
    let freed_early = match demo.emu {
        Some(emu) => emu
            .calls()
            .iter()
            .any(|c| c.seq >= from && c.ptr == Some(ptr) && c.function.starts_with("cuMemFree")),
        None => {
            work.synchronize().map_err(|e| err("synchronize", e))?;
            used(mr)? != held
        }
    };
    println!("  the user closed the buffer (close() -> Ok(()))");
    demo.check(
        !freed_early,
        "the user's close() freed nothing: the graph still holds the memory",
    );

    let exec = graph.instantiate().map_err(|e| err("instantiate", e))?;
    graph.close();
    exec.launch(&work).map_err(|e| err("launch", e))?;
    let mut bytes = vec![0u8; SIZE];
    out.copy_to_host(&mut bytes, &work)
        .map_err(|e| err("reading the copy", e))?;
    out.close().map_err(|e| err("close", e))?;
    println!(
        "  instantiated, graph definition closed (the executable keeps the nodes: \
         docs/driver-facts.md G1), launched on work"
    );
    demo.check(
        bytes.iter().all(|&b| b == 0x22),
        "after the user's close, the launch filled the memory and copied it out: read back 0x22",
    );

    b.make_current().map_err(|e| err("making B current", e))?;
    println!("  thread main now has context B current (not the buffer's context)");
    let main_before = current_raw()?;
    let from = mark(demo.emu);
    exec.close();
    println!(
        "  executable closed: the nodes' user objects let go, and their destructor queued the \
         memory for deferred cleanup (it may make no CUDA call itself: docs/driver-facts.md G4)"
    );
    let drained = handles::drain_deferred_cleanup();
    println!("  drain_deferred_cleanup() on thread main ran {drained} queued item(s)");
    if demo.emu.is_none() {
        // A driver may run the destructor later, on its own thread (G3): wait for the frees.
        let deadline = Instant::now() + Duration::from_secs(30);
        while {
            work.synchronize().map_err(|e| err("synchronize", e))?;
            used(mr)? != baseline
        } && Instant::now() < deadline
        {
            handles::drain_deferred_cleanup();
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    let to = mark(demo.emu);
    let main_after = current_raw()?;
    let probe = probe_cleanup_thread(demo, a)?;

    // Which thread freed: the call log says; a real driver does not, so both are shown.
    let main_id = demo.emu.map(|e| e.thread_id());
    let free_thread = demo.emu.and_then(|emu| {
        emu.calls()
            .into_iter()
            .find(|c| {
                c.seq >= from
                    && c.seq < to
                    && c.ptr == Some(ptr)
                    && c.function.starts_with("cuMemFree")
            })
            .map(|c| c.thread)
    });
    let seen = match (free_thread, demo.emu) {
        (Some(thread), Some(emu)) if Some(thread) != main_id => {
            demo.names.add("thread", thread, "custody-cleanup");
            let first = emu
                .calls()
                .into_iter()
                .find(|c| c.seq >= from && c.seq < to && c.thread == thread);
            let after = match &probe {
                (name, Some(id), Ok(ctx)) if *id == thread && name == "custody-cleanup" => *ctx,
                _ => u64::MAX,
            };
            Observed {
                thread: "custody-cleanup".to_owned(),
                emu_thread: Some(thread),
                before: first.map_or(u64::MAX, |c| c.context),
                after,
                from,
                to,
                outcome: Some("deferred cleanup in custody's cleanup worker".to_owned()),
            }
        }
        _ => Observed {
            thread: "main".to_owned(),
            emu_thread: main_id,
            before: main_before,
            after: main_after,
            from,
            to,
            outcome: Some(if demo.emu.is_some() {
                "deferred cleanup in drain_deferred_cleanup()".to_owned()
            } else {
                "deferred cleanup (this thread's drain_deferred_cleanup() or custody's cleanup \
                 worker: without a call log custody does not say which; shown: the caller's thread)"
                    .to_owned()
            }),
        },
    };
    demo.report_free(ptr, &seen, recipe, &work, a);
    demo.check(
        main_before == b.raw() as u64 && main_after == b.raw() as u64,
        format!(
            "thread main kept context B current throughout (before {}, after {})",
            demo.ctx(main_before),
            demo.ctx(main_after)
        ),
    );
    match probe {
        (thread, _, Ok(ctx)) => {
            println!(
                "  the cleanup queue's next item ran on thread {thread}, with context {} current",
                demo.ctx(ctx)
            );
            if thread != "main" {
                demo.check(
                    ctx == 0,
                    "custody's cleanup worker was left with no context after the frees",
                );
            }
        }
        (_, _, Err(error)) => demo.check(false, err("probing the cleanup worker", error)),
    }
    a.make_current().map_err(|e| err("making A current", e))?;
    demo.check_pool(mr, baseline, &work);
    demo.check_reports();
    Ok(())
}

/// Queues a [`ContextProbe`] for deferred cleanup and waits (bounded) for the cleanup worker to
/// drop it, draining on this thread if it does not.
fn probe_cleanup_thread(demo: &Demo, context: &ContextHandle) -> Result<ProbeSeen> {
    let seen = Arc::new(Mutex::new(None));
    let probe = ContextProbe {
        emu: demo.emu,
        seen: seen.clone(),
    };
    // Releasing the only reference runs the user object's destructor, which queues the probe.
    drop(
        UserObjectOwnership::new(context, Box::new(probe))
            .map_err(|e| err("cuUserObjectCreate", e))?,
    );
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        if let Some(seen) = seen.lock().unwrap_or_else(|e| e.into_inner()).take() {
            return Ok(seen);
        }
        if Instant::now() > deadline {
            handles::drain_deferred_cleanup();
        }
        if Instant::now() > deadline + Duration::from_secs(25) {
            return Err("the probe was not dropped within 30 s".to_owned());
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// The buffer's recipe, as custody recorded it.
fn recipe_text(demo: &Demo, buffer: &Buffer) -> String {
    match buffer.handle().recipe() {
        Some(recipe) => format!(
            "free on stream {} in context {}{}",
            demo.stream(recipe.stream().raw() as u64),
            demo.ctx(recipe.context().raw() as u64),
            if recipe.ptds_thread().is_some() {
                " (per-thread default stream of the recording thread)"
            } else {
                ""
            }
        ),
        None => "none (a view: nothing will be freed)".to_owned(),
    }
}
