//! The emulated CUDA driver: a `libcuda` replacement for machines without a GPU, with a
//! stream-order hazard checker, fault injection and a call log.
//!
//! Point the loader at it (`CUSTODY_CUDA_DRIVER=$PWD/target/debug/libcuda_emu.so`) and any
//! custody program runs its real driver code path on the CPU. The crate is a `cdylib` exporting
//! every symbol of [`cuda_sys::with_driver_functions!`] under the driver's exact names (`_v2`
//! suffixes included), plus `cuGetProcAddress` and `cuGetProcAddress_v2`, and the extra
//! `custodyEmu*` symbols that `test_support::emu` (the test-support crate) calls.
//!
//! Fact IDs (F1-F18, G1-G5) here and in the crate's modules are those of
//! `docs/driver-facts.md`: what a real driver was measured to do.
//!
//! # The model
//! - **Devices**: `CUSTODY_EMU_DEVICE_COUNT` of them (default 2), named
//!   `custody emulated device N`, compute capability 9.0, 80 GiB each, unified addressing,
//!   memory pools, managed memory; peers can access each other. `cuDriverGetVersion` says 13000.
//!   `cuInit` must come first (`CUDA_ERROR_NOT_INITIALIZED`), except for `cuDriverGetVersion`,
//!   `cuGetErrorName`/`String` and `cuGetProcAddress*`.
//! - **Contexts**: one context stack per host thread; primary contexts are retained and
//!   released per device (same handle every time; memory of `cuMemAlloc` goes with the
//!   context when the last reference is released); `cuCtxCreate` pushes, `cuCtxDestroy` waits
//!   for the context's work, frees its `cuMemAlloc`/host/managed memory (F9), destroys its
//!   streams and pops it from the calling thread if current. `cuCtxSetCurrent(NULL)` pops the top
//!   of the thread's stack (a no-op on an empty stack).
//! - **Streams**: created streams belong to the current context (F4, F6); the tokens NULL and
//!   `CU_STREAM_LEGACY` mean the legacy stream of the calling thread's current context, and
//!   `CU_STREAM_PER_THREAD` that thread's per-thread stream in it (F1-F3, F7, F12). Priorities
//!   clamp to [-5, 0]. The legacy stream synchronises with every blocking stream of its context
//!   in both directions (non-blocking streams are exempt; per-thread streams are blocking):
//!   work on it waits for every thread's per-thread stream, while a per-thread stream, a created
//!   blocking stream and a non-blocking stream wait for no other thread's per-thread stream
//!   (measured: `docs/driver-facts.md` F14, F15). Execution and the hazard checker's clocks
//!   follow the same rule. A thread's exit waits for the work of its per-thread streams and
//!   observes it, as a synchronisation would (measured: a real driver holds the exit until that
//!   work has run, F24; `state::thread_exit`).
//! - **Execution** (the `exec` module): each stream runs its operations in order, asynchronously
//!   to the host. Cheap operations on an idle stream run inline; anything that must wait, and
//!   every host function and graph launch, runs on a worker thread the stream starts on demand.
//!   Events record stream positions; `cuStreamWaitEvent` makes a stream wait for one; the
//!   synchronize calls block; the query calls return `CUDA_ERROR_NOT_READY` while work is pending.
//!   A destroyed stream's queued work still runs, and a context or device synchronisation waits
//!   for it and observes it (documented for `cuCtxSynchronize` and `cuStreamDestroy`; conformance
//!   `basic_ctx_synchronize_waits_for_a_destroyed_streams_work`).
//!   Stream memory operations (`cuStreamWaitValue32_v2`/`64_v2`, `cuStreamWriteValue32_v2`/
//!   `64_v2`) on device memory or pinned host memory (`cuMemAllocHost`, `cuMemHostAlloc`; its
//!   device pointer from `cuMemHostGetDevicePointer_v2` is its host address): a wait holds its
//!   stream, on the stream's worker thread, which polls the memory until the condition holds
//!   (whoever writes it: the host, or another stream's write), while the host and the other
//!   streams go on; a write stores its value when its stream reaches it. Both are uses of
//!   their memory for the hazard checker.
//! - **Memory**: real bytes. Device pointers live in a reserved, inaccessible 1 TiB address
//!   range (so a device pointer is never a host address); host, managed
//!   and host-pool memory is backed at its own address. `cuMemcpy` treats a pointer the driver
//!   does not know, outside the device range, as pageable host memory; copies involving pageable
//!   memory return only when done. Accesses past an allocation's end fail with
//!   `CUDA_ERROR_INVALID_VALUE`. Freeing NULL (`cuMemFree`, `cuMemFreeHost`, `cuMemFreeAsync`)
//!   succeeds and does nothing; zero bytes from `cuMemAllocHost` and the stream-ordered
//!   allocators succeed and give NULL, while `cuMemAlloc`/`cuMemAllocManaged` refuse them.
//!   Memory pools: a default pool per device, created pools on a device or on the host,
//!   `maxSize` (rounded up to 32 MiB, so a 2 MiB pool gives a 4 MiB allocation, as measured),
//!   release threshold, used/reserved counters (a pool that grows reserves at least 32 MiB, as
//!   an H200 did for a 1000-byte allocation, in 2 MiB steps beyond; reserved shrinks at
//!   synchronisation down to what the used bytes need, or the threshold, or on
//!   `cuMemPoolTrimTo`), access descriptors, stream-ordered allocation and free (memory goes
//!   back to the pool when the free runs on its stream). A device pool hands a freed address out
//!   again (measured: `docs/driver-facts.md` F18) to the next allocation of the same size
//!   (rounded up to 512 bytes) that is ordered after the free (the same stream, an event wait,
//!   host synchronisation), with fresh bytes; other device addresses (`cuMemAlloc`, graph
//!   allocations) are never reused, and host addresses are whatever the system allocator gives.
//!   Every allocation has an identity, unique and never reused, which the queries, the hazards
//!   and the call log carry (`id`, `alloc`) and `CU_POINTER_ATTRIBUTE_BUFFER_ID` returns.
//! - **Pool IPC**: a pool created with `CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR` is carved from
//!   a `memfd` (1 GiB sparse, or `maxSize`); exporting it gives a new descriptor; another process
//!   imports it by descriptor and maps it; exported pointers carry the arena's id and offset in
//!   the 64 bytes of `CUmemPoolPtrExportData`. Two facts measured on an H200 (driver
//!   580.159.04; conformance module `ipc`): `cuMemPoolExportPointer` refuses the allocations of
//!   a pool that was never exported with `cuMemPoolExportToShareableHandle`
//!   (`CUDA_ERROR_INVALID_VALUE`), and exports them once it has been (for good, whether the
//!   descriptor is still open or not);
//!   and a second `cuMemPoolImportPointer` of a pointer that the same imported pool has mapped
//!   and not freed gives the same address, not counted: the first `cuMemFreeAsync` unmaps it,
//!   and a second free of the address is `CUDA_ERROR_INVALID_VALUE` and a `double_free` hazard
//!   (the failing second free was measured; the equal address is inferred from it, and the
//!   conformance case asserts it).
//!   An import through another imported pool of the same exported one, or after the mapping was
//!   freed, gets a fresh address (not measured).
//! - **Graphs**: empty, host, memset (1/2/4-byte elements, 2-D), memcpy (host/device/unified,
//!   up to 3-D, no arrays), memory allocation and free nodes; clone; instantiate (flag
//!   `AUTO_FREE_ON_LAUNCH` honoured); a launch is one stream operation running the nodes in
//!   dependency order. Stream capture in the three modes, with fork and join through events,
//!   `CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED` for synchronous or synchronising calls that the
//!   capture mode forbids (after the calling thread's interaction mode,
//!   `cuThreadExchangeStreamCaptureMode`: global by default, relaxed forbids nothing; conformance
//!   `basic_*relaxed*`), and for a stream-ordered allocation or free on a stream not being
//!   captured beside such a capture (measured: F27, conformance `f27_*`), `..._IMPLICIT` for
//!   the legacy stream, invalidation,
//!   `..._UNJOINED`.
//!   A captured `cuMemFreeAsync` of a graph allocation is a free node; of any other memory it
//!   fails with `CUDA_ERROR_INVALID_VALUE`, captures nothing and leaves the capture valid
//!   (measured: `docs/driver-facts.md` F16). `cuMemPoolGetAttribute` on the thread of a
//!   thread-local capture that has been invalidated and not ended fails with
//!   `CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED` (measured there only, F26; elsewhere in a capture
//!   it is answered). An event last recorded in a capture:
//!   the first `cuEventSynchronize` or `cuEventQuery` on any thread fails with
//!   `CUDA_ERROR_CAPTURED_EVENT` and invalidates the capture, a query after that with
//!   `CUDA_ERROR_INVALID_VALUE` (measured, F17); `cuStreamWaitEvent` on it joins the waiting
//!   stream to the capture (measured; conformance `f17_*`).
//! - **User objects**: counted references held by the program, graphs, clones and execs; the
//!   destructor runs when the last goes, on the calling thread inside the call (G2) or, when an
//!   exec is destroyed with a launch pending, on the stream's worker thread after that launch
//!   (G3). A capture that ends without a graph (invalidated, unjoined) discards the graph it
//!   recorded into, and the destructors of what only that graph held run inside
//!   `cuStreamEndCapture`, as inside `cuGraphDestroy` (read from the documentation, not yet
//!   measured: conformance `basic_an_*_capture_releases_the_user_objects_its_graph_held_*`).
//!   A driver call from a destructor or host function returns
//!   `CUDA_ERROR_NOT_PERMITTED` (G4), except `cuStreamSynchronize` of an idle stream and
//!   `cuDriverGetVersion`, which the real driver was measured to allow.
//! - **Entry points**: every name of the CUDA 13.3 driver API is exported (`api::names` lists
//!   them with the version each variant appeared in). The ones the emulator serves are custody's
//!   (`cuda_sys::with_driver_functions!`) plus what NVIDIA's cuda.core 1.2 asks for in the same
//!   domain (`api::info`, `api::ranges`, `api::graph_nodes`, `api::memory`): device UUIDs,
//!   PCI bus ids and total memory, host memory registration (`cuMemHostRegister`: the
//!   program's own bytes, known as host memory until `cuMemHostUnregister`),
//!   the stream priority range, stream and context ids, the CUDA 13 `_v2` context and stream
//!   queries, event records with flags and event timing (`cuEventElapsedTime`: host time at
//!   which each record's stream reached it), `cuPointerGetAttributes` (an unknown pointer reads
//!   as the H200 wrote it: NULL values, no error, F19), address ranges, pools by location (`cuMemGetMemPool` and
//!   friends), managed pools, managed memory advice, prefetch and range attributes (bookkeeping
//!   only: all memory is one host memory), the managed pool of no preferred location, graph
//!   event record/wait nodes, node and edge queries, edges added and removed
//!   (`cuGraphAddDependencies`), `cuGraphInstantiateWithParams`, upload, the graph memory
//!   attributes (freed graph memory counts until `cuDeviceGraphMemTrim`), conditional nodes
//!   (`api::graph_cond`: `cuGraphConditionalHandleCreate`, and `cuGraphAddNode`/`_v2` with
//!   `CU_GRAPH_NODE_TYPE_CONDITIONAL` parameters, IF with one or two bodies, WHILE, SWITCH with
//!   any number; the driver makes the empty body graphs and writes its array of them to
//!   `phGraph_out`; they are cloned and destroyed with their node's graph; other node types
//!   through `cuGraphAddNode` answer `CUDA_ERROR_NOT_SUPPORTED`), captures into an existing graph
//!   (`cuStreamBeginCaptureToGraph`: a failed capture leaves that graph to its owner) and a
//!   capture's dependencies set or added by hand (`cuStreamUpdateCaptureDependencies`/`_v2`),
//!   which is how cuda.core builds conditional nodes in a stream capture, and IPC events
//!   (`cuIpcGetEventHandle`/`cuIpcOpenEventHandle`: an interprocess event's records are counted
//!   on a shared memfd page that another process opens through `/proc/<pid>/fd`). **Every other
//!   entry point returns `CUDA_ERROR_NOT_SUPPORTED`** without reading its arguments
//!   (`api::unsupported`; `CUSTODY_EMU_WARN_UNSUPPORTED=1` names each on stderr the first time
//!   it is called, and `CUSTODY_EMU_UNSUPPORTED_LOG=FILE` appends a line `PID NAME` per call,
//!   child processes included): kernels, modules and libraries, textures and arrays, graphics
//!   interop, virtual memory management, external resources, green contexts, multicast, legacy
//!   IPC memory handles, and `cuGetExportTable`, the driver's private tables through which the
//!   CUDA runtime (`cudart`) starts: they are undocumented, so the runtime API does not work
//!   on the emulator (the table id asked for goes with the report).
//! - **`cuGetProcAddress`**: a name of the driver API resolves to the variant its requested
//!   version means (at most 13000, the version this driver reports): our implementation, or the
//!   variant's `CUDA_ERROR_NOT_SUPPORTED` export. `cuGetProcAddress_v2` succeeds for a name it
//!   does not know, with `CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND` in the status (measured); the
//!   older `cuGetProcAddress` returns `CUDA_ERROR_NOT_FOUND`.
//! - **Bad input** never crashes: null out-pointers, unknown or destroyed handles (handle values
//!   are never reused, unless a test asks `custodyEmuReuseStreamHandle` to hand a destroyed
//!   stream's handle to the next stream, as a real driver may), unknown pointers and double
//!   frees return error codes. Every code chosen
//!   without a measurement is listed in the `codes` module, in one place.
//!
//! # What it checks (test-only powers)
//! - **Hazards** (the `clock` module): every stream has a vector clock. An operation ticks its
//!   stream and inherits what the host has seen complete; an event record snapshots the clock;
//!   a stream wait merges it; the legacy stream's implicit synchronisation merges clocks like it
//!   orders execution; host synchronisation (stream, event or context synchronize, a successful
//!   query, synchronous copies, fills and frees) adds the waited-for clock to the host clock. Host
//!   threads share that clock: the emulator sees one global order of calls, so work that one
//!   thread has waited for is complete for every later call. Every use of an allocation (fill,
//!   copy, graph node, the stream-ordered allocation itself) records its (stream, time). A free not
//!   ordered after every recorded use is `unordered_free`; a use of a stream-ordered allocation
//!   on a stream not ordered after the allocation (no event wait, host synchronisation or legacy
//!   barrier in between) is `use_before_alloc` (compute-sanitizer's stream-ordered race check
//!   reports the same as use-before-alloc); a use after the free was issued is
//!   `use_after_free` (a graph node also when its allocation was freed and the address now
//!   belongs to another one: nodes remember the identity of the memory they were made for);
//!   freeing a freed or unknown pointer is `double_free`; a free on a destroyed
//!   stream is `free_on_destroyed_stream` (where the real driver crashes, F11); a thread that
//!   ends while its per-thread stream has operations no synchronisation has seen complete is
//!   `thread_exit_with_pending_per_thread_work` (a real driver holds that exit until the GPU has
//!   run them, which beside other processes was seen to take minutes, F24). Synchronous frees
//!   are ordered after everything. Detection is at enqueue time, on logical clocks, so it is
//!   deterministic.
//! - **Fault injection**: `custodyEmuInjectFault(function, nth, error)` makes the nth next call
//!   of a function (any thread) return `error` without effect, once.
//! - **Stream handle reuse**: `custodyEmuReuseStreamHandle(handle)` makes the next created
//!   stream take a destroyed stream's handle (a new stream, with its own `cuStreamGetId` and its
//!   own place in the clocks), for tests of code that keys anything on stream handles.
//! - **Queries**: `custodyEmuQuery("allocations" | "hazards" | "calls")` as JSON; the call log
//!   records function, thread, current context, stream as passed and resolved, device pointer,
//!   the identity of the allocation made or freed, and result for every exported driver call.
//!
//! # Environment
//! - `CUSTODY_EMU_DEVICE_COUNT`: number of devices (default 2).
//! - `CUSTODY_EMU_CALL_LOG_LIMIT`: most recent calls kept in the log (default 262,144; 0 turns
//!   the log off).
//! - `CUSTODY_EMU_HAZARD_STDERR`: when set, every hazard is also printed on stderr.
//! - `CUSTODY_EMU_WARN_UNSUPPORTED`: when set, the first call of each entry point the emulator
//!   does not serve is named on stderr.
//! - `CUSTODY_EMU_UNSUPPORTED_LOG`: a file to which every call of such an entry point appends
//!   `PID NAME[ id=HEX]\n` (one write per line, so processes can share it); the differential
//!   harness (`xtask/foreign/foreign_tests.py`) classes tests by it.
//!
//! # Not emulated
//! Kernels, modules, textures and arrays; peer copies between contexts (all memory is one host
//! memory); `_ptds` entry points (the `CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM` flag is
//! ignored); the effect of memory advice and prefetch (recorded, reported, not acted on); event
//! timing on the device's clock (host time stands in); virtual memory management; child graph
//! nodes, node removal and graph launches into a capture; graph exec update; a conditional
//! node's value set at run time (only kernels set one, `cudaGraphSetConditional`): every launch
//! sees the handle's default launch value, with or without `CU_GRAPH_COND_ASSIGN_DEFAULT`, so
//! instantiation puts in each conditional node's place the body that value chooses (IF: the
//! first when non-zero, the second, if any, when zero; SWITCH: body `value`, none when out of
//! range; WHILE: none when zero), and a WHILE node whose default is non-zero, which a GPU would
//! run for ever with no kernel to clear it, instantiates but its launch answers
//! `CUDA_ERROR_NOT_SUPPORTED`; `cuGraphNodeGetParams` (CUDA 13.2; the emulator reports 13.0, so
//! cuda.core 1.2 gives a conditional node it finds in a graph no type or branches, as on the
//! H200's 13.0 driver); the body-graph node-type rules (bodies take any node type here); an
//! interprocess event recorded in the importing process is seen there but not
//! by the exporter, which follows its own records; the
//! real driver's opportunistic reuse of memory whose free has completed on the GPU without being
//! ordered before the new allocation (it depends on timing), and its suballocation of blocks of
//! other sizes; the real driver's crash on a destroyed stream (F11: an error and a
//! hazard instead); stream memory operations in a capture (refused with
//! `CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED`, the capture invalidated; a real driver captures
//! them), their batch form `cuStreamBatchMemOp` and the pre-11.7 names without `_v2`.
//! Concurrent copies into the same bytes race exactly as on a GPU.

// The modules' layers, lowest first; each imports only from layers below it (a tidy test fails
// on a cycle): `codes`, `clock`, `os`, `thread` (per-thread state, `lock`); `log` (call log,
// hazards, faults, `entry`), `exec` (stream execution), `ipc`; `memory` (allocation and pool
// types); `graph` (graph, capture and user-object types); `state` (the driver's state and,
// in `state/memory.rs` and `state/graph.rs`, its operations on memory and graphs); `api` (the
// exported driver functions) and `query` (the test interface's symbols).
pub(crate) mod api;
mod clock;
mod codes;
mod exec;
mod graph;
mod ipc;
mod log;
mod memory;
mod os;
pub mod query;
mod state;
mod thread;

#[cfg(test)]
mod tests {
    /// Every export coerces to the loader's function type: names and signatures cannot drift
    /// from `cuda_sys::with_driver_functions!`.
    #[test]
    fn exports_match_the_driver_function_list() {
        macro_rules! check {
            ($($name:ident($($arg:ident: $ty:ty),* $(,)?);)*) => {
                $(let _: cuda_sys::fn_types::$name = crate::api::$name;)*
                let names: &[&str] = &[$(stringify!($name)),*];
                for name in names {
                    assert!(crate::api::export_named(name).is_some(), "{name}");
                }
            };
        }
        cuda_sys::with_driver_functions!(check);
    }

    /// Every symbol of the driver API table is exported: implemented, or answering
    /// `CUDA_ERROR_NOT_SUPPORTED`.
    #[test]
    fn every_driver_api_symbol_is_exported() {
        let mut unsupported = 0;
        for &(_, _, symbol) in crate::api::names::VARIANTS {
            if crate::api::export_named(symbol).is_none() {
                assert!(
                    crate::api::unsupported::unsupported_named(symbol).is_some(),
                    "{symbol} is neither implemented nor answered as not supported"
                );
                unsupported += 1;
            }
        }
        assert!(unsupported < crate::api::names::VARIANTS.len());
    }

    /// `cuGetProcAddress` picks the newest variant the asked-for version knows.
    #[test]
    fn variants_follow_the_requested_version() {
        use crate::api::variant_for;
        assert_eq!(variant_for("cuMemAlloc", 3020), Ok("cuMemAlloc_v2"));
        assert_eq!(variant_for("cuMemAlloc", 2000), Ok("cuMemAlloc"));
        assert_eq!(variant_for("cuCtxCreate", 11040), Ok("cuCtxCreate_v3"));
        assert_eq!(variant_for("cuCtxCreate", 13000), Ok("cuCtxCreate_v4"));
        assert_eq!(
            variant_for("cuStreamGetCaptureInfo", 12030),
            Ok("cuStreamGetCaptureInfo_v3")
        );
        assert_eq!(
            variant_for("cuStreamGetCaptureInfo", 12000),
            Ok("cuStreamGetCaptureInfo_v2")
        );
        assert_eq!(variant_for("cuMemGetMemPool", 12000), Err(true));
        assert_eq!(variant_for("cuNoSuchThing", 13000), Err(false));
        assert_eq!(variant_for("cuMemAlloc_v2", 13000), Err(false));
    }
}
