//! Interprocess events: `cuIpcGetEventHandle` in one process, `cuIpcOpenEventHandle` in another.
//!
//! Measured through NVIDIA's cuda.core 1.2 test suite on an H200 (driver 580.159.04):
//! `memory_ipc/test_event_ipc.py::TestIpcEventProperties` passed there, so an event created with
//! `CU_EVENT_INTERPROCESS | CU_EVENT_DISABLE_TIMING` and recorded gives a handle that a second
//! process opens. Documented (CUDA driver API reference), for a GPU run of this case to settle:
//! the opened event follows the exporting process's record, so querying it while that record's
//! stream is held back answers `CUDA_ERROR_NOT_READY`, and once the stream is released
//! `cuEventSynchronize` returns and a query succeeds; an event created without
//! `CU_EVENT_INTERPROCESS` has no handle (`CUDA_ERROR_INVALID_VALUE`).
//!
//! The second process is this test binary run again as a child (like `ipc.rs`), with [`CHILD`]
//! holding the handle's 64 bytes in hex; it reports each step on its standard output and reads
//! "go" from its standard input before waiting.

use std::ffi::{c_void, CStr};
use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};

use cuda_sys::types::CUevent;
use cuda_sys::{CUresult, CudaErrorCode};

use crate::driver::{
    event_create, event_destroy, event_query, event_record, event_synchronize, get_proc_address,
    init, stream_create, stream_destroy, stream_synchronize, Ret, EVENT_DISABLE_TIMING,
    STREAM_NON_BLOCKING,
};
use crate::support::{block_stream, on_fresh_thread, primary_current, Probe};

/// Set in the child process: the handle to open, 128 hex digits.
const CHILD: &str = "CUSTODY_CONFORMANCE_IPC_EVENT_CHILD";
/// `CU_EVENT_INTERPROCESS`.
const EVENT_INTERPROCESS: u32 = 0x4;

type IpcGetEventHandle = unsafe extern "C" fn(*mut [u8; 64], CUevent) -> CUresult;
type IpcOpenEventHandle = unsafe extern "C" fn(*mut CUevent, [u8; 64]) -> CUresult;

#[track_caller]
fn entry_point(name: &CStr) -> *mut c_void {
    let (pfn, status) = get_proc_address(name, 13000).check();
    assert!(
        !pfn.is_null() && status == 0,
        "no {name:?} (symbol status {status})"
    );
    pfn
}

fn get_handle(event: CUevent) -> Ret<[u8; 64]> {
    // SAFETY: the driver hands out cuIpcGetEventHandle under this signature (CUDA 13.0 headers).
    let f = unsafe {
        std::mem::transmute::<*mut c_void, IpcGetEventHandle>(entry_point(c"cuIpcGetEventHandle"))
    };
    let mut handle = [0u8; 64];
    // SAFETY: a valid 64-byte out-buffer and a live event of the calling case.
    let status = unsafe { f(&mut handle, event) };
    Ret::with_value("cuIpcGetEventHandle", status, handle)
}

fn open_handle(handle: [u8; 64]) -> Ret<CUevent> {
    // SAFETY: the driver hands out cuIpcOpenEventHandle under this signature; the handle is
    // passed by value, as CUipcEventHandle is.
    let f = unsafe {
        std::mem::transmute::<*mut c_void, IpcOpenEventHandle>(entry_point(c"cuIpcOpenEventHandle"))
    };
    let mut event = std::ptr::null_mut();
    // SAFETY: a valid out-pointer; the handle came from the parent's cuIpcGetEventHandle.
    let status = unsafe { f(&mut event, handle) };
    Ret::with_value("cuIpcOpenEventHandle", status, event)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(text: &str) -> [u8; 64] {
    let mut out = [0u8; 64];
    for (k, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&text[2 * k..2 * k + 2], 16).expect("hex digits");
    }
    out
}

/// Documented: only an interprocess event has a handle. Measured (`docs/driver-facts.md` F20):
/// asking for one of another event is `CUDA_ERROR_INVALID_HANDLE`.
#[test]
fn ipc_event_handle_needs_an_interprocess_event() {
    on_fresh_thread("ipc-event-plain", || {
        init();
        let _primary = primary_current();
        for flags in [0, EVENT_DISABLE_TIMING] {
            let plain = event_create(flags).check();
            get_handle(plain).fails_with(CudaErrorCode::INVALID_HANDLE);
            event_destroy(plain).check();
        }
    });
}

/// Measured: a second process opens the handle of a recorded interprocess event. Documented:
/// the opened event is pending while the exporter's stream is held back, complete after.
#[test]
fn ipc_event_opened_in_another_process_follows_the_record() {
    if let Some(text) = std::env::var_os(CHILD) {
        let text = text.into_string().expect("hex handle");
        return on_fresh_thread("ipc-event-importer", move || importer(unhex(&text)));
    }
    on_fresh_thread("ipc-event-exporter", || {
        init();
        let _primary = primary_current();
        let s = stream_create(STREAM_NON_BLOCKING).check();
        let probe = Probe::new();
        block_stream(s, &probe).check();
        let event = event_create(EVENT_DISABLE_TIMING | EVENT_INTERPROCESS).check();
        event_record(event, s).check();
        let handle = get_handle(event).check();

        let name = format!(
            "{}::ipc_event_opened_in_another_process_follows_the_record",
            module_path!().split_once("::").map_or("", |(_, m)| m)
        );
        let mut child = Command::new(std::env::current_exe().expect("the test binary's path"))
            .args([&name, "--exact", "--nocapture", "--test-threads=1"])
            .env(CHILD, hex(&handle))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn the importing process");
        let mut lines = BufReader::new(child.stdout.take().expect("child stdout")).lines();
        let mut said = Vec::new();
        // libtest prints the case's name before its output, on the same line.
        let pending = lines.by_ref().map_while(Result::ok).find(|l| {
            said.push(l.clone());
            l.contains("ipc-event:")
        });
        probe.open_gate();
        let mut stdin = child.stdin.take().expect("child stdin");
        let _ = writeln!(stdin, "go");
        drop(stdin);
        let rest: Vec<String> = lines.map_while(Result::ok).collect();
        let output = child.wait_with_output().expect("wait for the child");
        stream_synchronize(s).check();
        event_destroy(event).check();
        stream_destroy(s).check();
        assert!(
            output.status.success()
                && pending.is_some_and(|l| l.ends_with("ipc-event: pending"))
                && rest.iter().any(|l| l.ends_with("ipc-event: ok")),
            "the importing process failed ({}): {said:?} {rest:?}\n{}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        );
    });
}

/// The child's side: opens the event, finds it pending, waits for "go", synchronizes, queries.
fn importer(handle: [u8; 64]) {
    init();
    let _primary = primary_current();
    let event = open_handle(handle).check();
    event_query(event).fails_with(CudaErrorCode::NOT_READY);
    println!("ipc-event: pending");
    let mut line = String::new();
    std::io::stdin().read_line(&mut line).expect("read go");
    assert_eq!(line.trim(), "go");
    event_synchronize(event).check();
    event_query(event).check();
    event_destroy(event).check();
    println!("ipc-event: ok");
}
