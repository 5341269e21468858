//! Streams, events, host functions and stream capture.

use std::collections::HashMap;
use std::sync::MutexGuard;

use cuda_sys::types::*;
use cuda_sys::CUresult;

use super::{
    answer, get_slice, known_flags, need, put, put_opt, wait_and_observe, with_state, Out,
};
use crate::clock::VectorClock;
use crate::codes::{self, Res};
use crate::exec::{Dep, StreamCore};
use crate::graph::{run_destructors, Callback, Capture, Graph, NodeKind, MODE_RELAXED};
use crate::ipc::IpcEvent;
use crate::log::{entry, CallInfo};
use crate::state::{
    initialized, Event, State, Stream, StreamKind, GREATEST_PRIORITY, LEAST_PRIORITY,
    STREAM_NON_BLOCKING,
};
use crate::thread::thread_id;

fn create_stream(ph: *mut CUstream, flags: c_uint, priority: c_int) -> Res {
    need(ph)?;
    known_flags(flags, STREAM_NON_BLOCKING)?;
    let mut st = initialized()?;
    let ctx = st.current_ctx()?;
    let (handle, id) = st.new_stream_handle();
    let device = st.contexts[&ctx].device;
    st.streams.insert(
        handle,
        Stream {
            id,
            ctx,
            device,
            kind: StreamKind::Created,
            flags,
            priority: priority.clamp(GREATEST_PRIORITY, LEAST_PRIORITY),
            core: StreamCore::new(handle),
            clock: VectorClock::default(),
            host_seen: 0,
            capture: None,
        },
    );
    st.contexts
        .get_mut(&ctx)
        .expect("current context is live")
        .streams
        .insert(handle);
    // SAFETY: checked non-null (driver contract).
    unsafe { put(ph, handle as CUstream) }
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamCreate(ph: *mut CUstream, flags: c_uint) -> CUresult {
    entry("cuStreamCreate", None, None, |_| {
        create_stream(ph, flags, LEAST_PRIORITY)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamCreateWithPriority(
    ph: *mut CUstream,
    flags: c_uint,
    priority: c_int,
) -> CUresult {
    entry("cuStreamCreateWithPriority", None, None, |_| {
        create_stream(ph, flags, priority)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamDestroy_v2(s: CUstream) -> CUresult {
    let s = s as u64;
    entry("cuStreamDestroy_v2", Some(s), None, |info| {
        let mut st = initialized()?;
        match st.streams.get(&s) {
            Some(stream) if stream.kind == StreamKind::Created => {}
            _ => return Err(codes::BAD_HANDLE),
        }
        info.resolved(&st, s);
        // Queued work still runs; async allocations stay valid (F13).
        st.destroy_stream_entry(s);
        Ok(())
    })
}

/// The body of a query of one property of a stream (`cuStreamGetFlags` and its kin): refuses a
/// null `out`, resolves `s` for the call log, and writes what `read` makes of the resolved
/// stream (its handle and its record) through `out`.
///
/// # Safety
/// `out` is null or valid for a write of `T` (the driver API's contract for out-pointers).
pub(crate) unsafe fn stream_property<T>(
    function: &'static str,
    s: CUstream,
    out: *mut T,
    read: impl FnOnce(u64, &Stream) -> T,
) -> CUresult {
    let s = s as u64;
    entry(function, Some(s), None, |info| {
        need(out)?;
        let (st, r) = info.lock_stream(s)?;
        // SAFETY: checked non-null; valid per this function's contract.
        unsafe { put(out, read(r, &st.streams[&r])) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamGetCtx(s: CUstream, pctx: *mut CUcontext) -> CUresult {
    // SAFETY: the caller's out-pointer (driver contract).
    unsafe {
        stream_property("cuStreamGetCtx", s, pctx, |_, stream| {
            stream.ctx as CUcontext
        })
    }
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamGetFlags(s: CUstream, flags: *mut c_uint) -> CUresult {
    // SAFETY: the caller's out-pointer (driver contract).
    unsafe { stream_property("cuStreamGetFlags", s, flags, |_, stream| stream.flags) }
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamGetPriority(s: CUstream, priority: *mut c_int) -> CUresult {
    // SAFETY: the caller's out-pointer (driver contract).
    unsafe {
        stream_property("cuStreamGetPriority", s, priority, |_, stream| {
            stream.priority
        })
    }
}

/// Resolves `s` for a synchronisation or a query and returns what that waits for or looks at:
/// the stream's last operation and the clock it carries. A capturing stream refuses both: the
/// capture is invalidated and the call answers `CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED`.
fn synchronization_target(st: &mut State, info: &mut CallInfo, s: u64) -> Res<(Dep, VectorClock)> {
    let r = info.resolve_stream(st, s)?;
    if let Some(id) = st.streams[&r].capture {
        st.invalidate_capture(id);
        return Err(codes::CAPTURE_UNSUPPORTED);
    }
    Ok(st.stream_target(r))
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamSynchronize(s: CUstream) -> CUresult {
    let s = s as u64;
    entry("cuStreamSynchronize", Some(s), None, |info| {
        let (dep, clock) = {
            let mut st = initialized()?;
            let (dep, clock) = synchronization_target(&mut st, info, s)?;
            if crate::thread::in_callback_now() && !dep.done() {
                // Waiting for pending work from a callback could deadlock (the callback may be
                // that work); only an idle stream is measured to succeed there (guess).
                return Err(codes::NOT_PERMITTED);
            }
            (dep, clock)
        };
        wait_and_observe(&[dep], &clock);
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamQuery(s: CUstream) -> CUresult {
    let s = s as u64;
    entry("cuStreamQuery", Some(s), None, |info| {
        let mut st = initialized()?;
        let (dep, clock) = synchronization_target(&mut st, info, s)?;
        if !dep.done() {
            return Err(codes::NOT_READY);
        }
        st.host_observed(&clock);
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamWaitEvent(s: CUstream, e: CUevent, flags: c_uint) -> CUresult {
    let (s, e) = (s as u64, e as u64);
    entry("cuStreamWaitEvent", Some(s), None, |info| {
        let (mut st, r) = info.lock_stream(s)?;
        if flags > 1 {
            return Err(codes::INVALID_VALUE);
        }
        let (record, captured, shared) = {
            let ev = st.events.get(&e).ok_or(codes::BAD_HANDLE)?;
            (ev.record.clone(), ev.captured.clone(), ev.shared_target())
        };
        if let Some((id, nodes)) = captured {
            // A capture fork or join.
            if !st.captures.contains_key(&id) {
                return Err(codes::CAPTURE_INVALIDATED);
            }
            if st.streams[&r].kind == StreamKind::Legacy {
                return Err(codes::CAPTURE_IMPLICIT);
            }
            match st.streams[&r].capture {
                Some(other) if other != id => return Err(codes::CAPTURE_ISOLATION),
                Some(_) => {
                    let c = st.captures.get_mut(&id).expect("checked");
                    let ends = c.ends.entry(r).or_default();
                    for n in nodes {
                        if !ends.contains(&n) {
                            ends.push(n);
                        }
                    }
                }
                None => {
                    st.captures
                        .get_mut(&id)
                        .expect("checked")
                        .ends
                        .insert(r, nodes);
                    st.streams.get_mut(&r).expect("resolved").capture = Some(id);
                }
            }
            return Ok(());
        }
        if st.enqueue_check(r)? {
            // Waiting during capture on an event recorded outside it adds nothing (guess).
            return Ok(());
        }
        if let Some((ipc, number)) = shared {
            // Another process's record: the stream waits (on its worker thread) until the
            // shared page shows it reached.
            let (deps, _) = st.prepare(r);
            st.submit(r, deps, Some(Box::new(move || ipc.wait(number))), true);
            return Ok(());
        }
        let Some((dep, clock)) = record else {
            return Ok(()); // never recorded: nothing to wait for
        };
        let (mut deps, _) = st.prepare(r);
        st.streams
            .get_mut(&r)
            .expect("resolved")
            .clock
            .merge(&clock);
        deps.push(dep);
        st.submit(r, deps, None, false);
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuLaunchHostFunc(s: CUstream, f: CUhostFn, data: *mut c_void) -> CUresult {
    let s = s as u64;
    entry("cuLaunchHostFunc", Some(s), None, |info| {
        let func = f.ok_or(codes::INVALID_VALUE)?;
        let cb = Callback {
            func,
            data: data as usize,
        };
        let (mut st, r) = info.lock_stream(s)?;
        if st.enqueue_check(r)? {
            st.capture_node(r, NodeKind::Host(cb))?;
            return Ok(());
        }
        let (deps, _) = st.prepare(r);
        st.submit(r, deps, Some(Box::new(move || cb.run())), true);
        Ok(())
    })
}

/// `CU_STREAM_WAIT_VALUE_GEQ`, `_EQ`, `_AND`, `_NOR`; `_FLUSH` may be or-ed in.
const WAIT_CONDITION: u32 = 0x3;
const WAIT_FLUSH: u32 = 1 << 30;
/// `CU_STREAM_WRITE_VALUE_NO_MEMORY_BARRIER`.
const WRITE_NO_MEMORY_BARRIER: u32 = 1;

/// Whether `current` satisfies wait condition `condition` against `value`, in `bits`-bit
/// arithmetic (GEQ is the driver's cyclic comparison: `(int)(*addr - value) >= 0`).
fn wait_satisfied(current: u64, value: u64, condition: u32, bits: u32) -> bool {
    let mask = if bits == 64 {
        u64::MAX
    } else {
        (1 << bits) - 1
    };
    let (current, value) = (current & mask, value & mask);
    match condition {
        0 => {
            let diff = current.wrapping_sub(value) & mask;
            diff >> (bits - 1) == 0
        }
        1 => current == value,
        2 => current & value != 0,
        _ => !(current | value) & mask != 0,
    }
}

/// Reads (or writes) the `bits`-bit value at `ptr` atomically.
///
/// # Safety
/// `ptr` is valid for `bits / 8` bytes and aligned to them, for the whole call.
unsafe fn load_value(ptr: *mut u8, bits: u32) -> u64 {
    use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::SeqCst};
    if bits == 64 {
        // SAFETY: per this function's contract.
        unsafe { AtomicU64::from_ptr(ptr.cast()) }.load(SeqCst)
    } else {
        // SAFETY: per this function's contract.
        u64::from(unsafe { AtomicU32::from_ptr(ptr.cast()) }.load(SeqCst))
    }
}

/// See [`load_value`].
///
/// # Safety
/// As [`load_value`].
unsafe fn store_value(ptr: *mut u8, value: u64, bits: u32) {
    use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::SeqCst};
    if bits == 64 {
        // SAFETY: per this function's contract.
        unsafe { AtomicU64::from_ptr(ptr.cast()) }.store(value, SeqCst);
    } else {
        // SAFETY: per this function's contract; the value is truncated to 32 bits by design.
        unsafe { AtomicU32::from_ptr(ptr.cast()) }.store(value as u32, SeqCst);
    }
}

/// A stream memory operation on `s`: a wait (`wait`) blocks the stream's later work until the
/// condition holds on the `bits`-bit value at `addr`, polled on the stream's worker thread (so
/// the host and other streams go on; the host releases it by writing the memory, another
/// stream by a write operation); a write stores `value` when the stream reaches it. The body of
/// `cuStreamWaitValue32_v2` and its three kin (`function`), one per width and direction.
fn memory_operation(
    function: &'static str,
    s: CUstream,
    addr: u64,
    value: impl Into<u64>,
    flags: u32,
    bits: u32,
    wait: bool,
) -> CUresult {
    let (s, value) = (s as u64, value.into());
    entry(function, Some(s), Some(addr), |info| {
        let valid_flags = if wait {
            WAIT_CONDITION | WAIT_FLUSH
        } else {
            WRITE_NO_MEMORY_BARRIER
        };
        if flags & !valid_flags != 0 || !addr.is_multiple_of(u64::from(bits / 8)) {
            return Err(codes::BAD_MEMOP);
        }
        let (mut st, r) = info.lock_stream(s)?;
        if st.enqueue_check(r)? {
            let id = st.streams[&r].capture.expect("capturing");
            st.invalidate_capture(id);
            return Err(codes::MEMOP_IN_CAPTURE);
        }
        let target = st
            .resolve(addr, u64::from(bits / 8), false, function, r)
            .map_err(|_| codes::BAD_MEMOP)?;
        let managed = target
            .alloc
            .and_then(|start| st.allocs.get(&start))
            .is_some_and(|a| a.kind == crate::memory::AllocKind::Managed);
        if managed {
            return Err(codes::BAD_MEMOP);
        }
        info.alloc = target.id;
        let (deps, time) = st.prepare(r);
        st.record_use(target.alloc, r, time);
        let mem = target.mem;
        let condition = flags & WAIT_CONDITION;
        let run: Box<dyn FnOnce() + Send> = if wait {
            Box::new(move || {
                let mut polls = 0u32;
                loop {
                    // SAFETY: `mem` keeps the allocation's bytes alive; the address was
                    // range-checked and is aligned to the value's size (checked above).
                    let current = unsafe { load_value(mem.ptr(), bits) };
                    if wait_satisfied(current, value, condition, bits) {
                        break;
                    }
                    polls = polls.saturating_add(1);
                    if polls < 64 {
                        std::hint::spin_loop();
                    } else if polls < 1024 {
                        std::thread::yield_now();
                    } else {
                        std::thread::sleep(std::time::Duration::from_micros(100));
                    }
                }
            })
        } else {
            // SAFETY: as for the wait.
            Box::new(move || unsafe { store_value(mem.ptr(), value, bits) })
        };
        // A wait always runs on the stream's worker thread, which it may hold for as long as the
        // memory says; a write may run at once when the stream is idle.
        st.submit(r, deps, Some(run), wait);
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamWaitValue32_v2(
    s: CUstream,
    addr: CUdeviceptr,
    value: c_uint,
    flags: c_uint,
) -> CUresult {
    memory_operation("cuStreamWaitValue32_v2", s, addr, value, flags, 32, true)
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamWaitValue64_v2(
    s: CUstream,
    addr: CUdeviceptr,
    value: cuuint64_t,
    flags: c_uint,
) -> CUresult {
    memory_operation("cuStreamWaitValue64_v2", s, addr, value, flags, 64, true)
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamWriteValue32_v2(
    s: CUstream,
    addr: CUdeviceptr,
    value: c_uint,
    flags: c_uint,
) -> CUresult {
    memory_operation("cuStreamWriteValue32_v2", s, addr, value, flags, 32, false)
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamWriteValue64_v2(
    s: CUstream,
    addr: CUdeviceptr,
    value: cuuint64_t,
    flags: c_uint,
) -> CUresult {
    memory_operation("cuStreamWriteValue64_v2", s, addr, value, flags, 64, false)
}

#[no_mangle]
pub unsafe extern "C" fn cuEventCreate(ph: *mut CUevent, flags: c_uint) -> CUresult {
    // SAFETY: the caller's out-pointer (driver contract).
    answer("cuEventCreate", unsafe { Out::new(ph) }, |_| {
        // CU_EVENT_BLOCKING_SYNC | CU_EVENT_DISABLE_TIMING | CU_EVENT_INTERPROCESS.
        known_flags(flags, 0x7)?;
        let mut st = initialized()?;
        let ctx = st.current_ctx()?;
        let ipc = if flags & EVENT_INTERPROCESS != 0 {
            Some(IpcEvent::create().map_err(|_| codes::OUT_OF_MEMORY)?)
        } else {
            None
        };
        let handle = st.new_handle();
        st.events.insert(
            handle,
            Event {
                ctx,
                flags,
                recorded_at: Default::default(),
                record: None,
                captured: None,
                ipc,
                imported: false,
            },
        );
        Ok(handle as CUevent)
    })
}

/// `CU_EVENT_DISABLE_TIMING`.
const EVENT_DISABLE_TIMING: u32 = 0x2;
/// `CU_EVENT_INTERPROCESS`.
const EVENT_INTERPROCESS: u32 = 0x4;

/// `CUipcEventHandle` (`CU_IPC_HANDLE_SIZE`, 64 opaque bytes), passed by value to
/// `cuIpcOpenEventHandle`: the loader's type, so that the signatures match custody's.
pub type IpcEventHandle = CUipcEventHandle;

/// The handle of an interprocess event for another process to open. Documented: the event must
/// have been created with `CU_EVENT_INTERPROCESS` (which goes with `CU_EVENT_DISABLE_TIMING`);
/// any other event is refused with `CUDA_ERROR_INVALID_VALUE` (the documented code; not measured).
#[no_mangle]
pub unsafe extern "C" fn cuIpcGetEventHandle(out: *mut IpcEventHandle, e: CUevent) -> CUresult {
    let e = e as u64;
    // SAFETY: the caller's 64-byte CUipcEventHandle (driver contract).
    answer("cuIpcGetEventHandle", unsafe { Out::new(out) }, |_| {
        let st = initialized()?;
        let ev = st.events.get(&e).ok_or(codes::BAD_HANDLE)?;
        let Some(ipc) = ev
            .ipc
            .as_ref()
            .filter(|_| ev.flags & EVENT_INTERPROCESS != 0)
        else {
            return Err(codes::IPC_EVENT_NOT_INTERPROCESS);
        };
        let reserved = ipc.encode().map(|b| b as std::ffi::c_char);
        Ok(IpcEventHandle { reserved })
    })
}

/// Opens an event another process exported with `cuIpcGetEventHandle`, in the current context.
/// Documented: the result behaves like a local event created with `CU_EVENT_DISABLE_TIMING`
/// (here: `CU_EVENT_DISABLE_TIMING | CU_EVENT_INTERPROCESS`), and is destroyed with
/// `cuEventDestroy`; waiting for it or querying it follows the exporting process's latest record.
/// A handle that names no live emulator event is refused with `CUDA_ERROR_INVALID_VALUE` (not
/// measured).
#[no_mangle]
pub unsafe extern "C" fn cuIpcOpenEventHandle(
    ph: *mut CUevent,
    handle: IpcEventHandle,
) -> CUresult {
    // SAFETY: the caller's out-pointer (driver contract).
    answer("cuIpcOpenEventHandle", unsafe { Out::new(ph) }, |_| {
        let mut st = initialized()?;
        let ctx = st.current_ctx()?;
        let bytes = handle.reserved.map(|c| c as u8);
        let ipc = IpcEvent::open(&bytes).ok_or(codes::INVALID_VALUE)?;
        let event = st.new_handle();
        st.events.insert(
            event,
            Event {
                ctx,
                flags: EVENT_DISABLE_TIMING | EVENT_INTERPROCESS,
                recorded_at: Default::default(),
                record: None,
                captured: None,
                ipc: Some(ipc),
                imported: true,
            },
        );
        Ok(event as CUevent)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuEventDestroy_v2(e: CUevent) -> CUresult {
    let e = e as u64;
    with_state("cuEventDestroy_v2", |st| {
        st.events.remove(&e).map(|_| ()).ok_or(codes::BAD_HANDLE)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuEventRecord(e: CUevent, s: CUstream) -> CUresult {
    let (e, s) = (e as u64, s as u64);
    entry("cuEventRecord", Some(s), None, |info| {
        let mut st = initialized()?;
        let ev_ctx = st.events.get(&e).ok_or(codes::BAD_HANDLE)?.ctx;
        let r = info.resolve_stream(&mut st, s)?;
        if st.streams[&r].ctx != ev_ctx {
            return Err(codes::EVENT_CONTEXT_MISMATCH);
        }
        if st.enqueue_check(r)? {
            let id = st.streams[&r].capture.expect("capturing");
            let ends = st.captures[&id].ends.get(&r).cloned().unwrap_or_default();
            let ev = st.events.get_mut(&e).expect("checked");
            ev.captured = Some((id, ends));
            ev.record = None;
            return Ok(());
        }
        let (deps, _) = st.prepare(r);
        // A fresh slot per record: a later record never changes what an earlier one saw.
        let slot: std::sync::Arc<std::sync::Mutex<Option<std::time::Instant>>> = Default::default();
        let stamp = slot.clone();
        // An interprocess event counts the record on its shared page too.
        let shared = st.events[&e]
            .ipc
            .clone()
            .map(|ipc| (ipc.begin_record(), ipc));
        let run = move || {
            *crate::thread::lock(&stamp) = Some(std::time::Instant::now());
            if let Some((number, ipc)) = shared {
                ipc.complete(number);
            }
        };
        let seq = st.submit(r, deps, Some(Box::new(run)), false);
        let core = st.streams[&r].core.clone();
        let clock = st.streams[&r].clock.clone();
        let ev = st.events.get_mut(&e).expect("checked");
        ev.recorded_at = slot;
        ev.record = Some((crate::exec::Dep { core, seq }, clock));
        ev.captured = None;
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuEventSynchronize(e: CUevent) -> CUresult {
    let e = e as u64;
    entry("cuEventSynchronize", None, None, |_| {
        let record = {
            let mut st = initialized()?;
            let ev = st.events.get(&e).ok_or(codes::BAD_HANDLE)?;
            if let Some((id, _)) = ev.captured {
                // Measured from another thread (F17): refused, and the capture is invalidated.
                st.invalidate_capture(id);
                return Err(codes::CAPTURED_EVENT_SYNCHRONIZE);
            }
            if let Some((ipc, number)) = ev.shared_target() {
                drop(st);
                ipc.wait(number);
                return Ok(());
            }
            ev.record.clone()
        };
        if let Some((dep, clock)) = record {
            wait_and_observe(&[dep], &clock);
        }
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuEventQuery(e: CUevent) -> CUresult {
    let e = e as u64;
    with_state("cuEventQuery", |st| {
        let ev = st.events.get(&e).ok_or(codes::BAD_HANDLE)?;
        if let Some((id, _)) = ev.captured {
            // Measured on both threads (F17): while the capture is active, refused as the
            // documented CUDA_ERROR_CAPTURED_EVENT, which invalidates the capture; once it is
            // invalidated (or over), CUDA_ERROR_INVALID_VALUE.
            if st.captures.get(&id).is_some_and(|c| !c.invalidated) {
                st.invalidate_capture(id);
                return Err(codes::CAPTURED_EVENT_SYNCHRONIZE);
            }
            return Err(codes::CAPTURED_EVENT_QUERY);
        }
        if let Some((ipc, number)) = ev.shared_target() {
            return if ipc.reached(number) {
                Ok(())
            } else {
                Err(codes::NOT_READY)
            };
        }
        if let Some((dep, clock)) = ev.record.clone() {
            if !dep.done() {
                return Err(codes::NOT_READY);
            }
            st.host_observed(&clock);
        }
        Ok(())
    })
}

/// Begins a capture on stream `s` in `mode`: into a new graph, or (`into`: the graph and the
/// nodes the first captured work depends on) into an existing one, which the capture does not
/// own (`cuStreamBeginCaptureToGraph`: an invalidated or unjoined capture leaves it in place).
fn begin_capture(
    function: &'static str,
    s: u64,
    mode: u32,
    into: Option<(u64, Vec<u64>)>,
) -> CUresult {
    entry(function, Some(s), None, |info| {
        let (mut st, r) = info.lock_stream(s)?;
        if mode > MODE_RELAXED {
            return Err(codes::INVALID_VALUE);
        }
        if st.streams[&r].kind == StreamKind::Legacy {
            return Err(codes::CAPTURE_UNSUPPORTED);
        }
        if st.streams[&r].capture.is_some() {
            return Err(codes::CAPTURE_STATE);
        }
        let (graph, ends, owns_graph) = match into {
            Some((graph, deps)) => {
                st.graphs.get(&graph).ok_or(codes::BAD_HANDLE)?;
                (graph, st.node_indices(graph, &deps)?, false)
            }
            None => {
                let graph = st.new_handle();
                st.graphs.insert(graph, Graph::default());
                (graph, Vec::new(), true)
            }
        };
        let id = st.next_capture_id;
        st.next_capture_id += 1;
        st.captures.insert(
            id,
            Capture {
                origin: r,
                mode,
                thread: thread_id(),
                graph,
                owns_graph,
                invalidated: false,
                ends: HashMap::from([(r, ends)]),
                info_buffers: HashMap::new(),
            },
        );
        st.streams.get_mut(&r).expect("resolved").capture = Some(id);
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamBeginCapture_v2(
    s: CUstream,
    mode: CUstreamCaptureMode,
) -> CUresult {
    begin_capture("cuStreamBeginCapture_v2", s as u64, mode as u32, None)
}

/// Edge data (`CUgraphEdgeData`, 8 bytes each) must be NULL or plain: the only edges emulated.
///
/// # Safety
/// `edges` is NULL or holds `n` items.
pub(crate) unsafe fn plain_edge_data(edges: *const c_void, n: usize) -> Res {
    if !edges.is_null() && n > 0 {
        // SAFETY: per this function's contract.
        let data: Vec<u64> = unsafe { get_slice(edges.cast::<u64>(), n)? };
        if data.iter().any(|&d| d != 0) {
            return Err(codes::NOT_SUPPORTED);
        }
    }
    Ok(())
}

/// Begins a capture of stream `s` into the existing graph `g`, the first captured work
/// depending on `deps` (nodes of `g`); `cuStreamEndCapture` hands back `g`.
#[no_mangle]
pub unsafe extern "C" fn cuStreamBeginCaptureToGraph(
    s: CUstream,
    g: CUgraph,
    deps: *const CUgraphNode,
    edges: *const c_void,
    n: usize,
    mode: CUstreamCaptureMode,
) -> CUresult {
    // SAFETY: the caller's arrays (driver contract).
    let read = unsafe { plain_edge_data(edges, n).and_then(|()| node_handles(deps, n)) };
    match read {
        Ok(deps) => begin_capture(
            "cuStreamBeginCaptureToGraph",
            s as u64,
            mode as u32,
            Some((g as u64, deps)),
        ),
        Err(e) => entry("cuStreamBeginCaptureToGraph", Some(s as u64), None, |_| {
            Err(e)
        }),
    }
}

/// `CU_STREAM_ADD_CAPTURE_DEPENDENCIES` and `CU_STREAM_SET_CAPTURE_DEPENDENCIES`.
const CAPTURE_DEPS_ADD: c_uint = 0;
const CAPTURE_DEPS_SET: c_uint = 1;

/// Adds to or replaces the nodes stream `s`'s next captured work depends on (nodes of its
/// capture's graph). Documented: a stream not capturing is `CUDA_ERROR_ILLEGAL_STATE`, flags
/// other than ADD or SET `CUDA_ERROR_INVALID_VALUE`.
///
/// # Safety
/// `deps` holds `n` handles and `edges` is NULL or `n` items, when `n > 0`.
unsafe fn update_capture_deps(
    function: &'static str,
    s: CUstream,
    deps: *const CUgraphNode,
    edges: *const c_void,
    n: usize,
    flags: c_uint,
) -> CUresult {
    let s = s as u64;
    entry(function, Some(s), None, |info| {
        if flags != CAPTURE_DEPS_ADD && flags != CAPTURE_DEPS_SET {
            return Err(codes::INVALID_VALUE);
        }
        // SAFETY: per this function's contract.
        let deps = unsafe {
            plain_edge_data(edges, n)?;
            node_handles(deps, n)?
        };
        let (mut st, r) = info.lock_stream(s)?;
        let id = st.streams[&r].capture.ok_or(codes::CAPTURE_STATE)?;
        let graph = st.captures.get(&id).ok_or(codes::CAPTURE_STATE)?.graph;
        let indices = st.node_indices(graph, &deps)?;
        let c = st.captures.get_mut(&id).ok_or(codes::CAPTURE_STATE)?;
        let ends = c.ends.entry(r).or_default();
        if flags == CAPTURE_DEPS_SET {
            ends.clear();
        }
        for i in indices {
            if !ends.contains(&i) {
                ends.push(i);
            }
        }
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamUpdateCaptureDependencies(
    s: CUstream,
    deps: *mut CUgraphNode,
    n: usize,
    flags: c_uint,
) -> CUresult {
    // SAFETY: the caller's array (driver contract).
    unsafe {
        update_capture_deps(
            "cuStreamUpdateCaptureDependencies",
            s,
            deps,
            std::ptr::null(),
            n,
            flags,
        )
    }
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamUpdateCaptureDependencies_v2(
    s: CUstream,
    deps: *mut CUgraphNode,
    edges: *const c_void,
    n: usize,
    flags: c_uint,
) -> CUresult {
    // SAFETY: the caller's arrays (driver contract).
    unsafe {
        update_capture_deps(
            "cuStreamUpdateCaptureDependencies_v2",
            s,
            deps,
            edges,
            n,
            flags,
        )
    }
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamEndCapture(s: CUstream, ph: *mut CUgraph) -> CUresult {
    let s = s as u64;
    entry("cuStreamEndCapture", Some(s), None, |info| {
        need(ph)?;
        let (mut st, r) = info.lock_stream(s)?;
        let (result, due) = match st.end_capture(r) {
            Ok(g) => (Ok(g), Vec::new()),
            Err((code, due)) => (Err(code), due),
        };
        drop(st);
        // A discarded graph's user-object destructors run here, on the calling thread and with
        // the state unlocked, as inside `cuGraphDestroy`.
        run_destructors(due);
        let g = *result.as_ref().unwrap_or(&0);
        // SAFETY: checked non-null (driver contract).
        unsafe { put(ph, g as CUgraph)? };
        result.map(|_| ())
    })
}

fn capture_status(st: &State, r: u64) -> u32 {
    match st.streams[&r].capture.and_then(|id| st.captures.get(&id)) {
        None => CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE as u32,
        Some(c) if c.invalidated => {
            CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_INVALIDATED as u32
        }
        Some(_) => CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_ACTIVE as u32,
    }
}

/// The start of a capture query of `s` (`cuStreamIsCapturing`, `cuStreamGetCaptureInfo_v2`):
/// refuses a null `status`, resolves `s` for the call log, refuses to ask the legacy stream
/// while a blocking stream of its context captures, and writes the capture status through
/// `status`. Returns the locked state and the resolved stream.
///
/// # Safety
/// `status` is null or valid for a write (the driver API's contract for out-pointers).
unsafe fn capture_query(
    info: &mut CallInfo,
    s: u64,
    status: *mut CUstreamCaptureStatus,
) -> Res<(MutexGuard<'static, State>, u64)> {
    need(status)?;
    let (st, r) = info.lock_stream(s)?;
    check_legacy_query(&st, r)?;
    // SAFETY: checked non-null, valid per this function's contract; the value is a valid
    // enumerator.
    unsafe { put(status.cast::<u32>(), capture_status(&st, r))? };
    Ok((st, r))
}

/// The legacy stream may not even be asked about capture while a blocking stream of its
/// context captures.
fn check_legacy_query(st: &State, r: u64) -> Res {
    let stream = &st.streams[&r];
    if stream.kind != StreamKind::Legacy {
        return Ok(());
    }
    let capturing = st.contexts[&stream.ctx]
        .streams
        .iter()
        .filter_map(|o| st.streams.get(o))
        .any(|o| o.blocking() && o.capture.is_some());
    if capturing {
        Err(codes::CAPTURE_IMPLICIT)
    } else {
        Ok(())
    }
}

#[no_mangle]
pub unsafe extern "C" fn cuThreadExchangeStreamCaptureMode(
    mode: *mut CUstreamCaptureMode,
) -> CUresult {
    entry("cuThreadExchangeStreamCaptureMode", None, None, |_| {
        need(mode)?;
        let mode = mode.cast::<u32>();
        // SAFETY: checked non-null; the driver API reads and writes the enum in place.
        let new = unsafe { mode.read_unaligned() };
        if new > crate::graph::MODE_RELAXED {
            return Err(codes::INVALID_VALUE);
        }
        let old = crate::graph::exchange_thread_mode(new);
        // SAFETY: as above.
        unsafe { put(mode, old) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamIsCapturing(
    s: CUstream,
    status: *mut CUstreamCaptureStatus,
) -> CUresult {
    let s = s as u64;
    entry("cuStreamIsCapturing", Some(s), None, |info| {
        // SAFETY: the caller's out-pointer (driver contract).
        unsafe { capture_query(info, s, status) }.map(|_| ())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamGetCaptureInfo_v2(
    s: CUstream,
    status: *mut CUstreamCaptureStatus,
    id_out: *mut cuuint64_t,
    graph_out: *mut CUgraph,
    deps_out: *mut *const CUgraphNode,
    n_out: *mut usize,
) -> CUresult {
    let s = s as u64;
    entry("cuStreamGetCaptureInfo_v2", Some(s), None, |info| {
        // SAFETY: the caller's out-pointer (driver contract).
        let (mut st, r) = unsafe { capture_query(info, s, status)? };
        let Some(id) = st.streams[&r].capture else {
            return Ok(());
        };
        let graph = st.captures[&id].graph;
        let ends = st.captures[&id].ends.get(&r).cloned().unwrap_or_default();
        let handles: Vec<u64> = ends
            .iter()
            .map(|&i| st.graphs[&graph].nodes[i].handle)
            .collect();
        let c = st.captures.get_mut(&id).expect("capturing");
        let buffer = c.info_buffers.entry(r).or_default();
        *buffer = handles;
        let (ptr, n) = (buffer.as_ptr().cast::<CUgraphNode>(), buffer.len());
        // SAFETY: optional out-pointers (driver contract); the node array lives in the capture
        // until the next call for this stream or the end of the capture.
        unsafe {
            put_opt(id_out, id);
            put_opt(graph_out, graph as CUgraph);
            put_opt(deps_out, ptr);
            put_opt(n_out, n);
        }
        Ok(())
    })
}

/// Reads a dependency array of node handles.
///
/// # Safety
/// `deps` is valid for `n` reads when `n > 0`.
pub(crate) unsafe fn node_handles(deps: *const CUgraphNode, n: usize) -> Res<Vec<u64>> {
    // SAFETY: per this function's contract.
    Ok(unsafe { get_slice(deps, n)? }
        .into_iter()
        .map(|h| h as u64)
        .collect())
}

#[cfg(test)]
mod tests {
    use super::wait_satisfied;

    #[test]
    fn wait_conditions_follow_the_driver_documentation() {
        // GEQ is cyclic: (int32_t)(*addr - value) >= 0.
        assert!(wait_satisfied(5, 5, 0, 32));
        assert!(wait_satisfied(6, 5, 0, 32));
        assert!(!wait_satisfied(4, 5, 0, 32));
        assert!(
            wait_satisfied(1, u64::from(u32::MAX), 0, 32),
            "wraps around"
        );
        assert!(!wait_satisfied(u64::from(u32::MAX), 1, 0, 32));
        assert!(wait_satisfied(1, u64::MAX, 0, 64));
        // EQ, AND, NOR.
        assert!(wait_satisfied(7, 7, 1, 32) && !wait_satisfied(7, 8, 1, 32));
        assert!(wait_satisfied(0b0110, 0b0100, 2, 32) && !wait_satisfied(0b0010, 0b0100, 2, 32));
        assert!(wait_satisfied(0, 0, 3, 32), "~(0 | 0) != 0");
        assert!(!wait_satisfied(u64::from(u32::MAX), 0, 3, 32));
        assert!(
            wait_satisfied(u64::from(u32::MAX), 0, 3, 64),
            "the high bits are clear"
        );
        // A 32-bit wait ignores the high bits of the value.
        assert!(wait_satisfied(3, (1 << 32) | 3, 1, 32));
    }
}
