//! The test-only records: the call log, injected faults and hazards, plus [`entry`], the
//! wrapper every exported driver function runs through.

use std::collections::VecDeque;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{LazyLock, Mutex};

use cuda_sys::CUresult;
use serde::Serialize;

use crate::codes::{self, Res};
use crate::thread::{current_context, in_callback_now, lock, thread_id};

/// What a call body found out for the call log.
#[derive(Default)]
pub(crate) struct CallInfo {
    /// The stream the call resolved to, if it takes one.
    pub(crate) resolved_stream: Option<u64>,
    /// The context that owns that stream: the one a stream-ordered call is ordered in, whatever
    /// context is current (docs/driver-facts.md F4, F8).
    pub(crate) stream_context: Option<u64>,
    /// The identity of the allocation the call made, freed or imported.
    pub(crate) alloc: Option<u64>,
}

/// One logged call, serialised as `test_support::emu::Call`.
#[derive(Clone, Serialize)]
pub(crate) struct CallRecord {
    seq: u64,
    function: &'static str,
    thread: u64,
    context: u64,
    stream: Option<u64>,
    resolved_stream: Option<u64>,
    stream_context: Option<u64>,
    ptr: Option<u64>,
    alloc: Option<u64>,
    result: CUresult,
}

/// One hazard, serialised as `test_support::emu::Hazard`.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct Hazard {
    pub(crate) kind: &'static str,
    pub(crate) ptr: u64,
    /// The identity of the allocation involved (the live one for an unordered free, the freed
    /// one for a use after free or a double free), when the emulator knows one.
    pub(crate) alloc: Option<u64>,
    pub(crate) function: &'static str,
    pub(crate) stream: u64,
    pub(crate) detail: String,
}

struct CallLog {
    next_seq: u64,
    records: VecDeque<CallRecord>,
    limit: usize,
}

static CALLS: LazyLock<Mutex<CallLog>> = LazyLock::new(|| {
    let limit = std::env::var("CUSTODY_EMU_CALL_LOG_LIMIT")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1 << 18);
    Mutex::new(CallLog {
        next_seq: 0,
        records: VecDeque::new(),
        limit,
    })
});

static HAZARDS: Mutex<Vec<Hazard>> = Mutex::new(Vec::new());

struct Fault {
    function: String,
    remaining: u32,
    error: CUresult,
}

static FAULTS: Mutex<Vec<Fault>> = Mutex::new(Vec::new());
static FAULT_COUNT: AtomicUsize = AtomicUsize::new(0);

/// Records a hazard.
pub(crate) fn hazard(h: Hazard) {
    if std::env::var_os("CUSTODY_EMU_HAZARD_STDERR").is_some() {
        eprintln!(
            "cuda-emu hazard: {} at {:#x} in {}: {}",
            h.kind, h.ptr, h.function, h.detail
        );
    }
    lock(&HAZARDS).push(h);
}

/// Puts back the entry point an [`entry`] interrupted, when it returns.
struct RestoreFunction(&'static str);

impl Drop for RestoreFunction {
    fn drop(&mut self) {
        let _ = CURRENT_FUNCTION.try_with(|f| f.set(self.0));
    }
}

pub(crate) fn hazards_snapshot() -> Vec<Hazard> {
    lock(&HAZARDS).clone()
}

pub(crate) fn calls_snapshot() -> Vec<CallRecord> {
    lock(&CALLS).records.iter().cloned().collect()
}

pub(crate) fn clear_hazards() {
    lock(&HAZARDS).clear();
}

pub(crate) fn clear_calls() {
    lock(&CALLS).records.clear();
}

/// Arms a fault: the `nth` next call of `function` returns `error`, once.
pub(crate) fn inject_fault(function: &str, nth: u32, error: CUresult) {
    lock(&FAULTS).push(Fault {
        function: function.to_owned(),
        remaining: nth,
        error,
    });
    FAULT_COUNT.fetch_add(1, Ordering::SeqCst);
}

pub(crate) fn clear_faults() {
    let mut faults = lock(&FAULTS);
    FAULT_COUNT.fetch_sub(faults.len(), Ordering::SeqCst);
    faults.clear();
}

fn take_fault(function: &str) -> Option<CUresult> {
    if FAULT_COUNT.load(Ordering::SeqCst) == 0 {
        return None;
    }
    let mut faults = lock(&FAULTS);
    let mut fired = None;
    for (i, f) in faults.iter_mut().enumerate() {
        if f.function == function {
            f.remaining -= 1;
            if f.remaining == 0 && fired.is_none() {
                fired = Some(i);
            }
        }
    }
    let i = fired?;
    let error = faults.remove(i).error;
    FAULT_COUNT.fetch_sub(1, Ordering::SeqCst);
    Some(error)
}

/// The driver calls a host function or user-object destructor may make. Measured on an H200
/// (conformance `g4_*` and `measured::*_inside_*`): synchronising an idle created stream and
/// `cuDriverGetVersion` succeed there, while `cuCtxGetCurrent`, `cuCtxSetCurrent`,
/// `cuMemAlloc`, `cuMemFreeAsync`, `cuStreamQuery` and `cuEventCreate` are refused. Everything
/// not listed is refused with `CUDA_ERROR_NOT_PERMITTED`.
const ALLOWED_IN_CALLBACKS: &[&str] = &["cuStreamSynchronize", "cuDriverGetVersion"];

thread_local! {
    /// The entry point this thread is in (for hazards found below it).
    static CURRENT_FUNCTION: std::cell::Cell<&'static str> = const { std::cell::Cell::new("") };
}

/// The driver entry point the calling thread is in, "" outside one.
pub(crate) fn current_function() -> &'static str {
    CURRENT_FUNCTION
        .try_with(std::cell::Cell::get)
        .unwrap_or("")
}

/// Runs one exported driver call: refuses it inside a callback (G4), applies an injected fault,
/// runs `body` (a panic becomes `CUDA_ERROR_UNKNOWN`), and logs it.
///
/// `stream` and `ptr` are the stream and device-pointer arguments as passed, for the log.
pub(crate) fn entry(
    function: &'static str,
    stream: Option<u64>,
    ptr: Option<u64>,
    body: impl FnOnce(&mut CallInfo) -> Res,
) -> CUresult {
    let outer = CURRENT_FUNCTION
        .try_with(|f| f.replace(function))
        .unwrap_or("");
    let _restore = RestoreFunction(outer);
    let context = current_context();
    let mut info = CallInfo::default();
    let result = if in_callback_now() && !ALLOWED_IN_CALLBACKS.contains(&function) {
        codes::NOT_PERMITTED
    } else if let Some(error) = take_fault(function) {
        error
    } else {
        match catch_unwind(AssertUnwindSafe(|| body(&mut info))) {
            Ok(Ok(())) => codes::SUCCESS,
            Ok(Err(code)) => code,
            Err(_) => codes::INTERNAL,
        }
    };
    let mut log = lock(&CALLS);
    if log.limit > 0 {
        let seq = log.next_seq;
        log.next_seq += 1;
        if log.records.len() >= log.limit {
            log.records.pop_front();
        }
        log.records.push_back(CallRecord {
            seq,
            function,
            thread: thread_id(),
            context,
            stream,
            resolved_stream: info.resolved_stream,
            stream_context: info.stream_context,
            ptr,
            alloc: info.alloc,
            result,
        });
    }
    result
}

/// The body of every entry point the emulator does not serve (`api::unsupported`): logged like
/// any call, and `CUDA_ERROR_NOT_SUPPORTED`. With `CUSTODY_EMU_WARN_UNSUPPORTED` set, the first
/// call of each such function is also reported on stderr; with `CUSTODY_EMU_UNSUPPORTED_LOG`
/// naming a file, every call appends a line to it (see [`note_unsupported`]).
pub(crate) fn not_supported(function: &'static str) -> CUresult {
    note_unsupported(function, "");
    entry(function, None, None, |_| Err(codes::NOT_SUPPORTED))
}

/// Reports a call of an entry point the emulator does not serve: on stderr the first time
/// (`CUSTODY_EMU_WARN_UNSUPPORTED`), and as a line `PID NAME[ DETAIL]` appended to the file
/// named by `CUSTODY_EMU_UNSUPPORTED_LOG` every time (one `write` of one line to a file opened
/// for appending, so the lines of several processes sharing the file do not interleave).
/// The differential harness (`xtask/foreign/foreign_tests.py`) reads that file to say which
/// unsupported entry points each test called.
pub(crate) fn note_unsupported(function: &'static str, detail: &str) {
    static WARNED: Mutex<Vec<&'static str>> = Mutex::new(Vec::new());
    if std::env::var_os("CUSTODY_EMU_WARN_UNSUPPORTED").is_some() {
        let mut warned = lock(&WARNED);
        if !warned.contains(&function) {
            warned.push(function);
            eprintln!("cuda-emu: {function} is not emulated (CUDA_ERROR_NOT_SUPPORTED){detail}");
        }
    }
    if let Some(path) = std::env::var_os("CUSTODY_EMU_UNSUPPORTED_LOG") {
        use std::io::Write;
        let line = format!("{} {function}{detail}\n", std::process::id());
        if let Ok(mut file) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
        {
            // A log for tools: a failed write loses a line, never the call.
            let _ = file.write_all(line.as_bytes());
        }
    }
}
