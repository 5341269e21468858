//! The driver conformance suite: raw CUDA driver call sequences with asserted results.
//!
//! The same binary runs against two drivers and must pass on both:
//! - the emulated driver (`cuda-emu`), in CI and in `cargo xtask test`, which point
//!   `CUSTODY_CUDA_DRIVER` at `target/debug/libcuda_emu.so`;
//! - a real `libcuda` on a GPU host, through `cargo xtask gpu-bundle` (its `run.py` runs every
//!   case in its own process against the real driver and again against the bundled emulator, and
//!   tabulates both) or `cargo xtask gpu-test`.
//!
//! So the emulator's fidelity is measured, not assumed: a case that passes on the real driver and
//! fails on the emulator is an emulator bug; a case that fails on the real driver is a wrong
//! belief about the driver, to be corrected here and in `docs/driver-facts.md`.
//!
//! # What it encodes
//! Every row of `docs/driver-facts.md` except F11 (`cuMemFreeAsync` on a destroyed stream kills the
//! process, so it has no safe case here; the emulator's hazard checker covers it):
//! - F1-F3 (`facts_free::f01..f03`): with no current context, `cuMemFreeAsync` on a
//!   default-stream token (NULL, `CU_STREAM_LEGACY`, `CU_STREAM_PER_THREAD`) fails with
//!   `CUDA_ERROR_INVALID_CONTEXT` and frees nothing;
//! - F4-F6: a created stream identifies its context, so freeing on it, `cuMemFree_v2`,
//!   `cuStreamGetCtx` and `cuStreamSynchronize` all work with no current context;
//! - F7-F8: with another context current, a free on the NULL token silently succeeds (ordered on
//!   the wrong context's legacy stream), as do frees on the owner's created stream and `cuMemFree_v2`;
//! - F9-F10: after the owning created context is destroyed, `cuMemFree_v2` of its memory fails with
//!   `CUDA_ERROR_INVALID_VALUE`, while a pool allocation can still be freed from another context;
//! - F12: a per-thread-default-stream allocation freed on another thread with 0x2 succeeds;
//! - F13: destroying a stream with a live stream-ordered allocation leaves the allocation valid;
//! - F14, F15 (`facts_ordering::f14_*`, `f15_*`): thread A's per-thread stream held by
//!   `cuStreamWaitValue32_v2` on a flag in pinned host memory; thread B's
//!   `cuStreamWriteValue32_v2` of a marker waits for it on the legacy stream (`CU_STREAM_LEGACY`
//!   or NULL) and does not on B's own per-thread stream, a created blocking stream or a
//!   non-blocking one; an event B records on the legacy stream waits for A too (not yet
//!   measured; custody's cross-thread synchronous frees and declared uses rely on it); plus
//!   (`basic_stream_wait_value*`) the stream memory operations themselves, as documented;
//! - F16 (`facts_capture::f16_*`): `cuMemFreeAsync` during a capture (each mode) of pool memory
//!   allocated before it fails with `CUDA_ERROR_INVALID_VALUE`, captures nothing and leaves the
//!   capture valid and the memory allocated; a graph allocation freed in its capture is a free
//!   node;
//! - F17 (`facts_capture::f17_*`): the first `cuEventSynchronize` or `cuEventQuery`, from any
//!   thread, of an event recorded in a thread-local capture fails with
//!   `CUDA_ERROR_CAPTURED_EVENT` and invalidates the capture; a later query is
//!   `CUDA_ERROR_INVALID_VALUE`; `cuStreamWaitEvent` of the event joins the waiting stream;
//! - F26 (`facts_capture::f26_*`): `cuMemPoolGetAttribute` on the thread of a thread-local
//!   capture that F17's query invalidated, before the capture ends, is
//!   `CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED`;
//! - F19-F21 (`basics_memory::basic_pointer_get_attributes_*`, `ipc_events::ipc_event_handle_*`,
//!   `ipc::ipc_host_numa_pool_*`): what `cuPointerGetAttributes` writes for an unknown address,
//!   `cuIpcGetEventHandle` of a plain event, and a host NUMA pool's device access;
//! - F18 (`facts_reuse::f18_*`): 64 allocate/free rounds of 64 bytes on one stream get some
//!   address back more than once, each allocation with its own `CU_POINTER_ATTRIBUTE_BUFFER_ID`;
//! - G1-G3 (`facts_graph`): a user object moved into a graph outlives `cuGraphDestroy` while an
//!   executable exists; its destructor runs inside `cuGraphExecDestroy` on the calling thread when
//!   no launch is pending, and later, on a driver thread, when one is;
//! - G4: driver calls made from a host function or a user-object destructor. The table only says
//!   "may fail"; the cases assert what an H200 with driver 580.159.04 returned: `cuCtxGetCurrent`
//!   and `cuMemAlloc_v2` are refused with `CUDA_ERROR_NOT_PERMITTED`, while `cuStreamSynchronize`
//!   of an idle created stream succeeds.
//!
//! plus the basics custody relies on (`basics_*`): the context stack (push, pop, set, set NULL,
//! pop on an empty stack), primary-context retain/release and state, created contexts, streams
//! (flags, priority, context), host functions, events, stream waits, memory pools and their
//! attributes, stream-ordered allocation, memset/memcpy read back, pointer attributes, and error
//! codes for invalid input that is safe to pass to a real driver;
//!
//! plus conditional graph nodes as NVIDIA's cuda.core builds them (`conditional`): handles, IF,
//! WHILE and SWITCH nodes with their driver-made body graphs (what cuda.core's tests passing on
//! an H200 imply) and, run on the H200 on 2026-12-01, the node type, the documented limits, the
//! body a condition's default launch value chooses at launch, and a node built in a capture
//! (`cuStreamBeginCaptureToGraph`, `cuStreamUpdateCaptureDependencies`);
//!
//! plus what was measured on an NVIDIA H200 (driver 580.159.04, CUDA 13.0):
//! - `measured`: one case per fact printed by the driver probe (`docs/driver-probe/probe.c`,
//!   its output in `docs/driver-probe/h200-580.159.04.txt`) that no other module checks, each
//!   replaying the probe's sequence; what a case asserts beyond the probe's output is marked
//!   *documented* or *not measured* where it is asserted;
//! - `ipc`: pool IPC, seen while building the memory crate's IPC: `cuMemPoolExportPointer` of an
//!   IPC-capable pool's allocation fails with `CUDA_ERROR_INVALID_VALUE` until the pool has been
//!   exported once; and, in a second process (the test binary run again as a child, the pool's
//!   descriptor passed with `SCM_RIGHTS`), two imports of the same export data give the same
//!   address, which the first `cuMemFreeAsync` unmaps for both (the second free fails with
//!   `CUDA_ERROR_INVALID_VALUE`).
//!
//! # Rules every case follows
//! - It calls `cuInit(0)` first, and does its work on fresh threads (a fresh thread has an empty
//!   context stack), so cases pass both one per process (nextest, the GPU runner) and all in one
//!   process (`cargo test -- --test-threads=1`): every retain is released, every pool is its own.
//! - It asserts results and the order of events, never durations. Where it must wait for a
//!   driver thread it waits at most `support::LIVENESS_BOUND`, which only turns a hang into a
//!   failure.
//! - It passes the real driver no destroyed or garbage stream or event handle.
//!
//! Emulator-only cases (the hazard checker, fault injection, call-log queries) are not here: they
//! live in `cuda-sys/tests/emulator_only.rs`, which the GPU runner skips on a real driver.

#[path = "conformance/driver.rs"]
mod driver;
#[path = "conformance/support.rs"]
mod support;

#[path = "conformance/basics_context.rs"]
mod basics_context;
#[path = "conformance/basics_errors.rs"]
mod basics_errors;
#[path = "conformance/basics_memory.rs"]
mod basics_memory;
#[path = "conformance/basics_streams.rs"]
mod basics_streams;
#[path = "conformance/conditional.rs"]
mod conditional;
#[path = "conformance/facts_capture.rs"]
mod facts_capture;
#[path = "conformance/facts_free.rs"]
mod facts_free;
#[path = "conformance/facts_graph.rs"]
mod facts_graph;
#[path = "conformance/facts_ordering.rs"]
mod facts_ordering;
#[path = "conformance/facts_reuse.rs"]
mod facts_reuse;
#[path = "conformance/ipc.rs"]
mod ipc;
#[path = "conformance/ipc_events.rs"]
mod ipc_events;
#[path = "conformance/measured.rs"]
mod measured;
#[path = "conformance/queries.rs"]
mod queries;
