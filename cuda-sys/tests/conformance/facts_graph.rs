//! docs/driver-facts.md G1-G5: when a graph user object's destructor runs, on which thread, and
//! what driver calls return when made from a destructor or a host function; how many executables
//! a graph holding memory nodes may have.
//!
//! Every case asserts the order of marks (see `support::Probe`), never how long anything took.
//! Where the facts table measured "a launch queued behind a 300 ms host function", the cases
//! queue the launch behind a host function blocked on a gate that the case opens itself: the
//! same situation, with no dependence on the machine's speed.

use std::sync::Arc;

use cuda_sys::types::{CUgraph, CUgraphExec};
use cuda_sys::CudaErrorCode;

use crate::driver::{
    ctx_get_current, graph_add_empty_node, graph_create, graph_destroy, graph_exec_destroy,
    graph_instantiate, graph_launch, graph_release_user_object, graph_retain_user_object_move,
    init, launch_host_func, mem_alloc, mem_alloc_async, mem_free, memset_d8_async,
    stream_begin_capture, stream_create, stream_destroy, stream_end_capture, stream_synchronize,
    user_object_create, STREAM_NON_BLOCKING,
};
use crate::support::{block_stream, on_fresh_thread, position, primary_current, Probe, Shared};

/// A one-node graph owning a user object (`CU_USER_OBJECT_NO_DESTRUCTOR_SYNC`, moved in with
/// `CU_GRAPH_USER_OBJECT_MOVE`) whose destructor runs `destructor`; instantiated.
fn graph_with_user_object(destructor: impl FnOnce() + Send + 'static) -> (CUgraph, CUgraphExec) {
    let graph = graph_create().check();
    graph_add_empty_node(graph).check();
    let object = user_object_create(destructor).check();
    graph_retain_user_object_move(graph, object).check();
    let exec = graph_instantiate(graph).check();
    (graph, exec)
}

/// A destructor that marks `destructor` in `probe`.
fn mark_destructor(probe: &Arc<Probe>) -> impl FnOnce() + Send + 'static {
    let probe = Arc::clone(probe);
    move || probe.mark("destructor")
}

#[test]
fn g1_graph_destroy_keeps_user_object_while_exec_lives() {
    on_fresh_thread("g1", || {
        init();
        let _primary = primary_current();
        let probe = Probe::new();
        let (graph, exec) = graph_with_user_object(mark_destructor(&probe));
        graph_destroy(graph).check();
        assert!(
            probe.find("destructor").is_none(),
            "the destructor ran although the executable still holds a reference"
        );
        graph_exec_destroy(exec).check();
        assert!(
            probe.wait_for("destructor").is_some(),
            "the destructor never ran"
        );
    });
}

#[test]
fn g2_destructor_runs_inside_exec_destroy_on_calling_thread() {
    on_fresh_thread("g2", || {
        init();
        let _primary = primary_current();
        let probe = Probe::new();
        let (graph, exec) = graph_with_user_object(mark_destructor(&probe));
        graph_destroy(graph).check();

        probe.mark("exec_destroy_called");
        graph_exec_destroy(exec).check(); // no launch pending
        probe.mark("exec_destroy_returned");

        assert_eq!(
            probe.labels(),
            ["exec_destroy_called", "destructor", "exec_destroy_returned"],
            "the destructor runs synchronously inside cuGraphExecDestroy"
        );
        let destructor = probe.find("destructor").expect("destructor mark");
        assert_eq!(
            destructor.thread,
            std::thread::current().id(),
            "the destructor runs on the thread that called cuGraphExecDestroy"
        );
    });
}

#[test]
fn g3_destructor_deferred_behind_pending_launch_to_driver_thread() {
    on_fresh_thread("g3", || {
        init();
        let _primary = primary_current();
        let s = stream_create(STREAM_NON_BLOCKING).check();
        let probe = Probe::new();
        let (graph, exec) = graph_with_user_object(mark_destructor(&probe));
        graph_destroy(graph).check();

        block_stream(s, &probe).check(); // the facts table's 300 ms host function
        graph_launch(exec, s).check(); // queued behind it
        graph_exec_destroy(exec).check(); // at once
        probe.mark("exec_destroy_returned");
        assert!(
            probe.find("destructor").is_none(),
            "the destructor ran inside cuGraphExecDestroy although a launch was pending: {:?}",
            probe.labels()
        );

        probe.open_gate();
        stream_synchronize(s).check();
        let destructor = probe
            .wait_for("destructor")
            .unwrap_or_else(|| panic!("the destructor never ran: {:?}", probe.labels()));
        let labels = probe.labels();
        assert!(position(&labels, "exec_destroy_returned") < position(&labels, "gate_released"));
        assert!(
            position(&labels, "gate_released") < position(&labels, "destructor"),
            "the destructor ran before the launch completed: {labels:?}"
        );
        assert_ne!(
            destructor.thread,
            std::thread::current().id(),
            "a deferred destructor runs on a driver thread, not the caller"
        );
        stream_destroy(s).check();
    });
}

/// G1 with the graph's reference given back by `cuGraphReleaseUserObject` instead of
/// `cuGraphDestroy`, the graph staying alive: the executable keeps its own reference, and a
/// launch in flight keeps it after the executable is destroyed (G3). handles'
/// `GraphExecHandle::instantiate` rests on this for the executable's own attachment (what
/// `GraphExecHandle::retain` adds). Read from the CUDA documentation (an executable holds
/// references of its own to its graph's user objects); no GPU run has shown it yet.
#[test]
fn g1_graph_release_after_instantiate_keeps_user_object_for_exec_and_launch() {
    on_fresh_thread("g1-release", || {
        init();
        let _primary = primary_current();
        let s = stream_create(STREAM_NON_BLOCKING).check();
        let probe = Probe::new();
        let graph = graph_create().check();
        graph_add_empty_node(graph).check();
        let object = user_object_create(mark_destructor(&probe)).check();
        graph_retain_user_object_move(graph, object).check();
        let exec = graph_instantiate(graph).check();
        graph_release_user_object(graph, object).check();
        assert!(
            probe.find("destructor").is_none(),
            "the destructor ran although the executable was instantiated holding a reference"
        );

        block_stream(s, &probe).check();
        graph_launch(exec, s).check(); // queued behind the gate
        graph_exec_destroy(exec).check();
        probe.mark("exec_destroy_returned");
        assert!(
            probe.find("destructor").is_none(),
            "the destructor ran although a launch was pending: {:?}",
            probe.labels()
        );
        probe.open_gate();
        stream_synchronize(s).check();
        probe
            .wait_for("destructor")
            .unwrap_or_else(|| panic!("the destructor never ran: {:?}", probe.labels()));
        let labels = probe.labels();
        assert!(
            position(&labels, "gate_released") < position(&labels, "destructor"),
            "the destructor ran before the launch completed: {labels:?}"
        );
        graph_destroy(graph).check();
        stream_destroy(s).check();
    });
}

/// G4 in a host function: the host function runs `call` (one driver call, returning its status)
/// and the case returns what it got.
fn status_inside_host_function(
    call: impl FnOnce() -> CudaErrorCode + Send + 'static,
) -> CudaErrorCode {
    let probe = Probe::new();
    let s = stream_create(STREAM_NON_BLOCKING).check();
    let host_probe = Arc::clone(&probe);
    launch_host_func(s, move || host_probe.mark_code("call", call())).check();
    stream_synchronize(s).check();
    stream_destroy(s).check();
    let mark = probe.find("call").expect("the host function ran");
    mark.code.expect("the host function recorded a status")
}

/// G4 in a deferred destructor (G3's situation: the launch is pending when the executable is
/// destroyed, so the destructor runs later on a driver thread): the destructor runs `call` and
/// the case returns what it got.
fn status_inside_deferred_destructor(
    call: impl FnOnce() -> CudaErrorCode + Send + 'static,
) -> CudaErrorCode {
    let s = stream_create(STREAM_NON_BLOCKING).check();
    let probe = Probe::new();
    let destructor_probe = Arc::clone(&probe);
    let (graph, exec) =
        graph_with_user_object(move || destructor_probe.mark_code("destructor", call()));
    graph_destroy(graph).check();
    block_stream(s, &probe).check();
    graph_launch(exec, s).check();
    graph_exec_destroy(exec).check();
    probe.open_gate();
    stream_synchronize(s).check();
    let mark = probe.wait_for("destructor").expect("the destructor ran");
    assert_ne!(
        mark.thread,
        std::thread::current().id(),
        "the destructor was deferred"
    );
    stream_destroy(s).check();
    mark.code.expect("the destructor recorded a status")
}

/// G4 in a synchronous destructor (G2's situation: it runs inside our own `cuGraphExecDestroy`,
/// on the calling thread): the destructor runs `call` and the case returns what it got.
fn status_inside_synchronous_destructor(
    call: impl FnOnce() -> CudaErrorCode + Send + 'static,
) -> CudaErrorCode {
    let probe = Probe::new();
    let destructor_probe = Arc::clone(&probe);
    let (graph, exec) =
        graph_with_user_object(move || destructor_probe.mark_code("destructor", call()));
    graph_destroy(graph).check();
    graph_exec_destroy(exec).check();
    let mark = probe
        .find("destructor")
        .expect("the destructor ran inside cuGraphExecDestroy");
    assert_eq!(mark.thread, std::thread::current().id());
    mark.code.expect("the destructor recorded a status")
}

/// `cuMemAlloc_v2` of 4 KiB, freeing the memory at once if the driver allowed it (so that a
/// driver that does leaks nothing), returning the allocation's status.
fn mem_alloc_status() -> CudaErrorCode {
    let ret = mem_alloc(4096);
    let code = ret.code;
    if code.is_success() {
        let _ = mem_free(ret.check());
    }
    code
}

// G4. NVIDIA documents that a host function or user-object destructor "must not make any CUDA
// API calls", and that such calls "may" return CUDA_ERROR_NOT_PERMITTED, without saying which.
// The expectations below were measured on an H200 with driver 580.159.04 (CUDA 13.0), and they
// are not what one would guess: a thread-local read (cuCtxGetCurrent) and an allocation are
// refused with NOT_PERMITTED, while synchronizing an idle created stream is allowed. The
// emulator does the same: it refuses every call there with NOT_PERMITTED except those measured
// to succeed (cuStreamSynchronize of an idle stream, and cuDriverGetVersion: see
// measured.rs). Re-measure on any other driver.
// Synchronizing a busy stream, or the host function's own stream, is not tried: it could
// deadlock on a driver that allows it.

#[test]
fn g4_ctx_get_current_inside_host_function_is_not_permitted() {
    on_fresh_thread("g4-host-get-current", || {
        init();
        let _primary = primary_current();
        let code = status_inside_host_function(|| ctx_get_current().code);
        assert_eq!(code, CudaErrorCode::NOT_PERMITTED);
    });
}

#[test]
fn g4_mem_alloc_inside_host_function_is_not_permitted() {
    on_fresh_thread("g4-host-alloc", || {
        init();
        let _primary = primary_current();
        let code = status_inside_host_function(mem_alloc_status);
        assert_eq!(code, CudaErrorCode::NOT_PERMITTED);
    });
}

#[test]
fn g4_stream_synchronize_of_idle_stream_inside_host_function_succeeds() {
    on_fresh_thread("g4-host-sync", || {
        init();
        let _primary = primary_current();
        let idle = Shared(stream_create(STREAM_NON_BLOCKING).check());
        let code = status_inside_host_function(move || stream_synchronize(idle.get()).code);
        assert_eq!(code, CudaErrorCode::SUCCESS);
        stream_destroy(idle.get()).check();
    });
}

#[test]
fn g4_ctx_get_current_inside_deferred_destructor_is_not_permitted() {
    on_fresh_thread("g4-destructor-get-current", || {
        init();
        let _primary = primary_current();
        let code = status_inside_deferred_destructor(|| ctx_get_current().code);
        assert_eq!(code, CudaErrorCode::NOT_PERMITTED);
    });
}

#[test]
fn g4_mem_alloc_inside_deferred_destructor_is_not_permitted() {
    on_fresh_thread("g4-destructor-alloc", || {
        init();
        let _primary = primary_current();
        let code = status_inside_deferred_destructor(mem_alloc_status);
        assert_eq!(code, CudaErrorCode::NOT_PERMITTED);
    });
}

#[test]
fn g4_stream_synchronize_of_idle_stream_inside_deferred_destructor_succeeds() {
    on_fresh_thread("g4-destructor-sync", || {
        init();
        let _primary = primary_current();
        let idle = Shared(stream_create(STREAM_NON_BLOCKING).check());
        let code = status_inside_deferred_destructor(move || stream_synchronize(idle.get()).code);
        assert_eq!(code, CudaErrorCode::SUCCESS);
        stream_destroy(idle.get()).check();
    });
}

#[test]
fn g4_ctx_get_current_inside_synchronous_destructor_is_not_permitted() {
    on_fresh_thread("g4-sync-destructor-get-current", || {
        init();
        let _primary = primary_current();
        let code = status_inside_synchronous_destructor(|| ctx_get_current().code);
        assert_eq!(code, CudaErrorCode::NOT_PERMITTED);
    });
}

/// G5: a graph holding a memory allocation node has one executable at a time. Nothing is
/// launched, so nothing is allocated: the graph is instantiated, instantiated again while the
/// first executable exists (refused), and again once it is destroyed (accepted).
#[test]
fn g5_a_graph_with_a_memory_node_has_one_executable_at_a_time() {
    on_fresh_thread("g5", || {
        init();
        let _primary = primary_current();
        let s = stream_create(STREAM_NON_BLOCKING).check();
        stream_begin_capture(
            s,
            cuda_sys::types::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
        )
        .check();
        let q = mem_alloc_async(1024, s).check();
        memset_d8_async(q, 0x44, 1024, s).check();
        let graph = stream_end_capture(s).check();
        let first = graph_instantiate(graph).check();
        graph_instantiate(graph).fails_with(CudaErrorCode::NOT_SUPPORTED);
        graph_exec_destroy(first).check();
        let again = graph_instantiate(graph).check();
        graph_exec_destroy(again).check();
        graph_destroy(graph).check();
        stream_destroy(s).check();
    });
}
