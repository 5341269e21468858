//! Fault sweep: every driver call on every teardown path fails once, with each of
//! `CUDA_ERROR_INVALID_CONTEXT`, `CUDA_ERROR_OUT_OF_MEMORY`, `CUDA_ERROR_ILLEGAL_ADDRESS` and
//! `CUDA_ERROR_DEINITIALIZED`, and nothing is lost (docs/decisions.md D3):
//!
//! - the failure is reported exactly once (to the cleanup-error hook on a drop or deferred
//!   cleanup, as the returned error of an explicit close), attributed to the resource
//!   (operation, pointer or handle, context) and naming the failing call and its error;
//!   `CUDA_ERROR_DEINITIALIZED` is never reported;
//! - nothing crashes and nothing is freed twice (the hazard checker sees no double free, use
//!   after free or unordered free; no pointer has two successful frees);
//! - the bookkeeping stays consistent: the hook and `cleanup_error_count` agree, no deferred
//!   cleanup is left queued, a pointer is still allocated exactly when no free of it succeeded,
//!   the thread's context binding is its own again unless the failing call was the restore, and
//!   the same teardown runs clean afterwards.
//!
//! Each scenario is run once without a fault to learn its teardown's driver calls from the
//! emulator's call log (every thread: the dropping thread, the cleanup worker), then once per
//! (call, error) with the fault injected into that call. Needs the emulator's fault injection:
//! on a real driver each test says so and returns.

mod adopt;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use adopt::Ownership;
use handles::{
    CleanupError, ContextFlags, ContextHandle, CudaErrorCode, EventFlags, EventHandle,
    OwnedAllocation, StreamFlags, StreamHandle,
};
use memory::{
    Accessibility, Buffer, DeviceMemoryResource, DeviceMemoryResourceOptions, Graph,
    LegacyPinnedMemoryResource, ManagedMemoryResource, MemoryError, MemoryResource,
    PoolMemoryResource, SynchronousMemoryResource,
};
use test_support::emu::{AllocationId, Call, Emulator};

// ---------------------------------------------------------------------------------------------
// Support

const ERRORS: [CudaErrorCode; 4] = [
    CudaErrorCode::INVALID_CONTEXT,
    CudaErrorCode::OUT_OF_MEMORY,
    CudaErrorCode::ILLEGAL_ADDRESS,
    CudaErrorCode::DEINITIALIZED,
];

const FREES: [&str; 3] = ["cuMemFreeAsync", "cuMemFree_v2", "cuMemFreeHost"];

static SERIAL: Mutex<()> = Mutex::new(());

/// The emulator, or `None` after saying why the calling test skips on a real driver.
fn emulator_or_skip() -> Option<Emulator> {
    // CUSTODY_TEST_PRETEND_REAL_DRIVER runs the real-driver branch on the emulator.
    let pretend = std::env::var_os("CUSTODY_TEST_PRETEND_REAL_DRIVER").is_some_and(|v| v != "0");
    let emu = Emulator::get().filter(|_| !pretend);
    if emu.is_none() {
        eprintln!("skipped on a real driver: needs fault injection");
    }
    emu
}

fn reports() -> &'static Mutex<Vec<CleanupError>> {
    static REPORTS: OnceLock<Mutex<Vec<CleanupError>>> = OnceLock::new();
    static INSTALLED: OnceLock<()> = OnceLock::new();
    let all = REPORTS.get_or_init(|| Mutex::new(Vec::new()));
    INSTALLED.get_or_init(|| {
        handles::set_cleanup_error_hook(Box::new(|e| reports().lock().unwrap().push(e.clone())));
        // Warnings are not what this file checks; keep stderr quiet.
        handles::set_cleanup_warning_hook(Box::new(|_| {}));
    });
    all
}

#[must_use = "hold the guard for the whole test"]
fn start(emu: &Emulator) -> MutexGuard<'static, ()> {
    let guard = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let _ = reports();
    handles::drain_deferred_cleanup();
    emu.clear_faults();
    emu.clear_hazards();
    guard
}

/// The raw context current on the calling thread (0 for none), straight from the driver: it
/// may be a context the failed teardown left current and then released.
fn current() -> u64 {
    let d = cuda_sys::driver().expect("driver");
    let mut raw = std::ptr::null_mut();
    // SAFETY: `raw` is a valid out-pointer, read only after success.
    let status = unsafe { (d.cuCtxGetCurrent)(&mut raw) };
    assert_eq!(status, 0, "cuCtxGetCurrent");
    raw as u64
}

fn primary(n: i32) -> ContextHandle {
    ContextHandle::primary(n).expect("primary context")
}

fn stream_in(context: &ContextHandle) -> StreamHandle {
    StreamHandle::create(context, StreamFlags::DEFAULT, 0).expect("stream")
}

/// Another context than device 0's primary one: device 1's primary context when there is one.
fn other_context() -> ContextHandle {
    if handles::device_count().expect("cuDeviceGetCount") >= 2 {
        primary(1)
    } else {
        ContextHandle::create(0, ContextFlags::SCHED_AUTO).expect("cuCtxCreate")
    }
}

/// Runs everything queued for deferred cleanup; no driver call of its own.
fn finish_deferred() {
    loop {
        handles::drain_deferred_cleanup();
        if handles::deferred_cleanup_pending() == 0 {
            return;
        }
    }
}

/// How a pointer's memory is freed, for giving back what a failed teardown leaked.
#[derive(Clone, Copy, Debug)]
enum Memory {
    /// Stream-ordered (pool, IPC import): `cuMemFreeAsync`.
    Pool,
    /// `cuMemAlloc` / `cuMemAllocManaged`: `cuMemFree`.
    Device,
    /// `cuMemAllocHost`: `cuMemFreeHost`.
    Host,
}

/// An [`Attribution::ptr`] for handles the test cannot know in advance (custody's own events).
const ANY: u64 = 0;

/// What a report of `operation` must name: the resource (a pointer or raw handle) and context.
#[derive(Clone, Debug)]
struct Attribution {
    operation: &'static str,
    ptr: u64,
    context: u64,
}

/// A scenario, set up and ready to tear down.
struct Prepared {
    /// The context current on the tearing-down thread (none when `None`).
    bind: Option<ContextHandle>,
    /// The teardown itself; an explicit close returns its error.
    teardown: Box<dyn FnOnce() -> Result<(), MemoryError> + Send>,
    /// Memory the teardown frees: address, kind and identity (the address alone does not
    /// name an allocation: a pool hands freed addresses out again, docs/driver-facts.md F18).
    memory: Vec<(u64, Memory, AllocationId)>,
    /// Reports the teardown may make, by operation.
    attributions: Vec<Attribution>,
    /// Raw graphs and executables the teardown destroys (destroyed here if a failure leaked
    /// them, so that the buffers they retain are freed).
    graphs: Vec<(u64, &'static str)>,
    /// The context of the teardown's recipe: where the thread's binding may be left when the
    /// restoring `cuCtxSetCurrent` failed.
    recipe_context: u64,
    /// What must outlive the teardown (exporting buffers, pools); dropped after the checks.
    keep: Vec<Box<dyn std::any::Any + Send>>,
}

/// What one teardown came to.
struct Run {
    result: Result<(), MemoryError>,
    before: u64,
    after: u64,
    calls: Vec<Call>,
    reports: Vec<CleanupError>,
    counted: u64,
}

fn run(
    emu: &Emulator,
    prepared: Prepared,
    fault: Option<(&'static str, u32, CudaErrorCode)>,
) -> (Run, Prepared) {
    let Prepared {
        bind,
        teardown,
        memory,
        attributions,
        graphs,
        recipe_context,
        keep,
    } = prepared;
    let reported_before = reports().lock().unwrap().len();
    let counted_before = handles::cleanup_error_count();
    emu.clear_calls();
    let emu_copy = *emu;
    let (result, before, after, window) = std::thread::spawn(move || {
        if let Some(context) = &bind {
            context.make_current().expect("cuCtxSetCurrent");
        }
        let before = current();
        let mark = || emu_copy.calls().last().map_or(0, |c| c.seq + 1);
        let armed = mark();
        if let Some((function, nth, error)) = fault {
            assert!(emu_copy.inject_fault(function, nth, error), "{function}");
        }
        let result = teardown();
        finish_deferred();
        let disarmed = mark();
        emu_copy.clear_faults();
        let after = current();
        ContextHandle::clear_current().expect("cuCtxSetCurrent(NULL)");
        (result, before, after, armed..disarmed)
    })
    .join()
    .expect("the tearing-down thread panicked");
    let calls: Vec<Call> = emu
        .calls()
        .into_iter()
        .filter(|c| window.contains(&c.seq))
        .collect();
    let reports: Vec<CleanupError> = reports().lock().unwrap()[reported_before..].to_vec();
    let counted = handles::cleanup_error_count() - counted_before;
    (
        Run {
            result,
            before,
            after,
            calls,
            reports,
            counted,
        },
        Prepared {
            bind: None,
            teardown: Box::new(|| Ok(())),
            memory,
            attributions,
            graphs,
            recipe_context,
            keep,
        },
    )
}

/// `ptr`, `kind` and the identity of the live allocation at `ptr`, for [`Prepared::memory`].
fn held(ptr: u64, kind: Memory) -> (u64, Memory, AllocationId) {
    let emu = Emulator::get().expect("the fault sweep runs on the emulator");
    let alloc = emu.allocation_at(ptr).expect("a live allocation").id;
    (ptr, kind, alloc)
}

fn succeeded_frees(calls: &[Call], alloc: AllocationId) -> usize {
    calls
        .iter()
        .filter(|c| FREES.contains(&c.function.as_str()) && c.alloc == Some(alloc) && c.result == 0)
        .count()
}

fn destroyed(calls: &[Call], function: &str) -> bool {
    calls
        .iter()
        .any(|c| c.function == function && c.result == 0)
}

/// Gives back what a failed teardown leaked: graphs first (their payloads free the buffers they
/// retain), then memory still allocated.
fn give_back_leaks(emu: &Emulator, leftover: &Prepared, calls: &[Call]) {
    let d = cuda_sys::driver().expect("driver");
    for &(raw, function) in &leftover.graphs {
        if destroyed(calls, function) {
            continue;
        }
        let status = match function {
            // SAFETY: the teardown's destruction of this graph failed, so it is still alive and
            // nothing else uses it.
            "cuGraphDestroy" => unsafe { (d.cuGraphDestroy)(raw as _) },
            // SAFETY: as above, for the executable.
            _ => unsafe { (d.cuGraphExecDestroy)(raw as _) },
        };
        assert_eq!(status, 0, "{function}(0x{raw:x}) while giving back a leak");
    }
    finish_deferred();
    let context = primary(0);
    let stream = stream_in(&context);
    for &(ptr, kind, alloc) in &leftover.memory {
        if !emu.allocation_is_live(alloc) {
            continue;
        }
        // SAFETY: the emulator still holds this allocation and no buffer or handle does (the
        // sweep leaked it); it is freed once, here.
        let leaked = unsafe { handles::raw::owned_allocation(ptr, 0) };
        match kind {
            Memory::Pool => leaked.free_async(&stream),
            Memory::Device => leaked.free_device_sync(&stream),
            Memory::Host => leaked.free_host_sync(&stream),
        }
        .unwrap_or_else(|e| panic!("giving back leaked 0x{ptr:x}: {e}"));
    }
    stream.synchronize().expect("cuStreamSynchronize");
}

/// The driver failure behind an explicit close's error: (call, code).
/// (A context switch that failed around the operation names its own call.)
fn driver_failure(error: &MemoryError) -> Option<(&'static str, CudaErrorCode)> {
    match error {
        MemoryError::Handle(error) => error.driver_error().map(|e| (e.call, e.code)),
        _ => None,
    }
}

fn report_failure(report: &CleanupError) -> Option<(&'static str, CudaErrorCode)> {
    report.error.driver_error().map(|e| (e.call, e.code))
}

/// Figures of one scenario's sweep.
#[derive(Debug, Default)]
struct Sweep {
    calls: usize,
    runs: usize,
    reported: usize,
    returned: usize,
    leaked: usize,
}

/// Sweeps one scenario: learn its teardown's calls, then fail each once with each error.
fn sweep(name: &str, prepare: impl Fn() -> Prepared) {
    let Some(emu) = emulator_or_skip() else {
        return;
    };
    let _serial = start(&emu);
    let baseline: Vec<AllocationId> = emu.live_allocations().iter().map(|a| a.id).collect();
    // A teardown may release the last handle of a primary context (a recipe's or a stream's).
    let primaries: Vec<Attribution> = (0..handles::device_count().expect("cuDeviceGetCount"))
        .map(|n| {
            let raw = primary(n).raw() as u64;
            Attribution {
                operation: "cuDevicePrimaryCtxRelease_v2",
                ptr: raw,
                context: raw,
            }
        })
        .collect();

    // The clean run: which calls the teardown makes, in order, on every thread.
    let (clean, leftover) = run(&emu, prepare(), None);
    assert!(clean.result.is_ok(), "{name}: {:?}", clean.result);
    assert!(clean.reports.is_empty(), "{name}: {:#?}", clean.reports);
    assert!(emu.hazards().is_empty(), "{name}: {:#?}", emu.hazards());
    for &(ptr, _, alloc) in &leftover.memory {
        assert_eq!(
            succeeded_frees(&clean.calls, alloc),
            1,
            "{name}: 0x{ptr:x} freed once"
        );
    }
    drop(leftover);
    let mut seen: BTreeMap<&'static str, u32> = BTreeMap::new();
    let mut targets = Vec::new();
    for call in &clean.calls {
        let function: &'static str = Box::leak(call.function.clone().into_boxed_str());
        let nth = seen.entry(function).or_default();
        *nth += 1;
        targets.push((function, *nth));
    }
    assert!(
        !targets.is_empty(),
        "{name}: the teardown made no driver call"
    );

    let mut figures = Sweep {
        calls: targets.len(),
        ..Sweep::default()
    };
    for &(function, nth) in &targets {
        for error in ERRORS {
            let what = format!("{name}: {function} #{nth} failing with {}", error.name());
            emu.clear_hazards();
            let (run, leftover) = run(&emu, prepare(), Some((function, nth, error)));
            figures.runs += 1;

            // The fault happened, once, where it was aimed.
            let failed: Vec<&Call> = run.calls.iter().filter(|c| c.result != 0).collect();
            assert_eq!(failed.len(), 1, "{what}: failed calls {failed:#?}");
            assert_eq!(failed[0].function, function, "{what}");
            assert_eq!(failed[0].result, error.0, "{what}");

            // Reported exactly once, attributed; DEINITIALIZED never reported.
            assert_eq!(
                run.counted,
                run.reports.len() as u64,
                "{what}: hook and counter agree"
            );
            let returned = run.result.as_ref().err();
            if let Some(error_returned) = returned {
                assert_eq!(
                    driver_failure(error_returned),
                    Some((function, error)),
                    "{what}: the explicit close returns the failure"
                );
            }
            if error == CudaErrorCode::DEINITIALIZED {
                assert!(
                    run.reports.is_empty(),
                    "{what}: reported {:#?}",
                    run.reports
                );
            } else {
                let total = run.reports.len() + usize::from(returned.is_some());
                assert_eq!(
                    total, 1,
                    "{what}: reports {:#?}, returned {returned:?}",
                    run.reports
                );
                for report in &run.reports {
                    assert_eq!(
                        report_failure(report),
                        Some((function, error)),
                        "{what}: {report}"
                    );
                    assert_eq!(report.error_name(), error.name(), "{what}");
                    let expected = leftover
                        .attributions
                        .iter()
                        .chain(&primaries)
                        .find(|a| {
                            a.operation == report.operation && (a.ptr == report.ptr || a.ptr == ANY)
                        })
                        .unwrap_or_else(|| panic!("{what}: unexpected report {report}"));
                    assert_eq!(report.context, expected.context, "{what}: {report}");
                }
                figures.reported += run.reports.len();
                figures.returned += usize::from(returned.is_some());
            }

            // No crash got here; nothing freed twice or unordered.
            let hazards = emu.hazards();
            assert!(hazards.is_empty(), "{what}: hazards {hazards:#?}");
            let live: Vec<AllocationId> = emu.live_allocations().iter().map(|a| a.id).collect();
            for &(ptr, _, alloc) in &leftover.memory {
                let frees = succeeded_frees(&run.calls, alloc);
                assert!(frees <= 1, "{what}: 0x{ptr:x} freed {frees} times");
                assert_eq!(
                    live.contains(&alloc),
                    frees == 0,
                    "{what}: 0x{ptr:x} is allocated exactly when no free of it succeeded"
                );
                figures.leaked += usize::from(frees == 0);
            }

            // Bookkeeping: nothing queued; the binding is the thread's own unless the restore
            // failed (then the recipe's context is still current, and the failure said so).
            assert_eq!(handles::deferred_cleanup_pending(), 0, "{what}");
            if run.after != run.before {
                assert_eq!(function, "cuCtxSetCurrent", "{what}: binding changed");
                assert_eq!(run.after, leftover.recipe_context, "{what}");
            }
            give_back_leaks(&emu, &leftover, &run.calls);
            drop(leftover);
            finish_deferred();
        }
    }

    // The same teardown runs clean after all that, and nothing is left over.
    emu.clear_hazards();
    let (again, leftover) = run(&emu, prepare(), None);
    assert!(again.result.is_ok(), "{name}: {:?}", again.result);
    assert!(again.reports.is_empty(), "{name}: {:#?}", again.reports);
    drop(leftover);
    finish_deferred();
    assert!(emu.hazards().is_empty(), "{name}: {:#?}", emu.hazards());
    let left: Vec<u64> = emu
        .live_allocations()
        .iter()
        .filter(|a| !baseline.contains(&a.id))
        .map(|a| a.ptr)
        .collect();
    assert!(left.is_empty(), "{name}: still allocated {left:x?}");
    eprintln!(
        "fault sweep: {name}: {} calls x {} errors = {} faulted runs; {} reported, {} returned, \
         {} leaked and given back",
        figures.calls,
        ERRORS.len(),
        figures.runs,
        figures.reported,
        figures.returned,
        figures.leaked
    );
}

// ---------------------------------------------------------------------------------------------
// Scenarios

fn device_pool() -> Arc<DeviceMemoryResource> {
    DeviceMemoryResource::new(0).expect("device pool")
}

/// A buffer of `mr` on `stream`, filled (so it has been used on its stream).
fn used_buffer(mr: Arc<dyn MemoryResource>, stream: &StreamHandle) -> Buffer {
    let buffer = Arc::clone(&mr)
        .allocate_owned(4096, stream)
        .expect("allocate");
    buffer.fill(0x5au8, stream).expect("fill");
    buffer
}

fn free_attribution(
    operation: &'static str,
    buffer: &Buffer,
    context: &ContextHandle,
) -> Attribution {
    Attribution {
        operation,
        ptr: buffer.ptr(),
        context: context.raw() as u64,
    }
}

/// A buffer dropped (or closed) by a thread with `bind` current (or none).
fn buffer_teardown(
    mr: Arc<dyn MemoryResource>,
    memory: Memory,
    operations: &[&'static str],
    bind: Option<ContextHandle>,
    explicit: bool,
) -> Prepared {
    let context = primary(0);
    let stream = stream_in(&context);
    let buffer = used_buffer(mr, &stream);
    let ptr = buffer.ptr();
    Prepared {
        bind,
        attributions: operations
            .iter()
            .map(|op| free_attribution(op, &buffer, &context))
            .collect(),
        memory: vec![held(ptr, memory)],
        graphs: Vec::new(),
        recipe_context: context.raw() as u64,
        teardown: Box::new(move || {
            if explicit {
                buffer.close()
            } else {
                drop(buffer);
                Ok(())
            }
        }),
        keep: vec![Box::new(stream)],
    }
}

const POOL_FREE: &[&str] = &["cuMemFreeAsync"];
/// A drop of a synchronous family: the event recorded at the drop, then the worker's wait,
/// free and event destruction, all attributed to the buffer.
const SYNC_DROP: &[&str] = &["cuEventRecord", "cuMemFree_v2", "cuEventDestroy_v2"];
const HOST_DROP: &[&str] = &["cuEventRecord", "cuMemFreeHost", "cuEventDestroy_v2"];

#[test]
fn pool_buffer_dropped_on_a_thread_without_a_context() {
    sweep("pool buffer dropped, no context", || {
        buffer_teardown(device_pool(), Memory::Pool, POOL_FREE, None, false)
    });
}

#[test]
fn pool_buffer_dropped_on_a_thread_with_another_context() {
    sweep("pool buffer dropped, another context current", || {
        buffer_teardown(
            device_pool(),
            Memory::Pool,
            POOL_FREE,
            Some(other_context()),
            false,
        )
    });
}

#[test]
fn pool_buffer_closed_explicitly() {
    sweep("pool buffer closed", || {
        buffer_teardown(device_pool(), Memory::Pool, POOL_FREE, None, true)
    });
}

#[test]
fn last_buffer_of_an_owned_pool_dropped() {
    sweep("last buffer of an owned pool dropped", || {
        let mr = DeviceMemoryResource::with_options(0, DeviceMemoryResourceOptions::default())
            .expect("owned pool");
        let pool = mr.pool().raw() as u64;
        let mut prepared = buffer_teardown(mr, Memory::Pool, POOL_FREE, None, false);
        prepared.attributions.push(Attribution {
            operation: "cuMemPoolDestroy",
            ptr: pool,
            context: 0,
        });
        prepared
    });
}

#[test]
fn cumemalloc_buffer_dropped() {
    sweep("cuMemAlloc buffer dropped", || {
        let mr = SynchronousMemoryResource::new(0).expect("synchronous resource");
        buffer_teardown(mr, Memory::Device, SYNC_DROP, None, false)
    });
}

#[test]
fn cumemalloc_buffer_closed_explicitly() {
    sweep("cuMemAlloc buffer closed", || {
        let mr = SynchronousMemoryResource::new(0).expect("synchronous resource");
        buffer_teardown(mr, Memory::Device, &["cuMemFree_v2"], None, true)
    });
}

#[test]
fn pinned_host_buffer_dropped() {
    sweep("pinned host buffer dropped", || {
        buffer_teardown(
            LegacyPinnedMemoryResource::new(),
            Memory::Host,
            HOST_DROP,
            Some(other_context()),
            false,
        )
    });
}

#[test]
fn pinned_host_buffer_closed_explicitly() {
    sweep("pinned host buffer closed", || {
        buffer_teardown(
            LegacyPinnedMemoryResource::new(),
            Memory::Host,
            &["cuMemFreeHost"],
            None,
            true,
        )
    });
}

#[test]
fn managed_buffer_dropped() {
    sweep("managed buffer dropped", || {
        buffer_teardown(
            ManagedMemoryResource::new(),
            Memory::Device,
            SYNC_DROP,
            None,
            false,
        )
    });
}

/// A memory resource of the caller's: pool memory adopted with `Ownership::MemoryResource`,
/// freed by `deallocate` (with `cuMemFreeAsync` on the stream it is given).
struct UserResource {
    pool: Arc<DeviceMemoryResource>,
    backing: Mutex<BTreeMap<u64, Buffer>>,
}

impl MemoryResource for UserResource {
    fn allocate_owned(
        self: Arc<Self>,
        size: usize,
        stream: &StreamHandle,
    ) -> Result<Buffer, MemoryError> {
        let backing = self.pool.allocate(size, stream)?;
        let ptr = backing.ptr();
        self.backing.lock().unwrap().insert(ptr, backing);
        adopt::from_handle(ptr, size, Ownership::MemoryResource(self), Some(stream))
    }

    fn deallocate(
        &self,
        allocation: OwnedAllocation,
        stream: &StreamHandle,
    ) -> Result<(), MemoryError> {
        // The address is a backing buffer's, which closing frees: the token is given up.
        let (ptr, _) = allocation.into_raw();
        let backing = self
            .backing
            .lock()
            .unwrap()
            .remove(&ptr)
            .expect("a live pointer");
        close_on(backing, stream)
    }

    fn accessibility(&self) -> Accessibility {
        Accessibility::device(0)
    }
}

#[test]
fn adopted_buffer_of_a_user_memory_resource_dropped() {
    sweep("adopted buffer (user memory resource) dropped", || {
        let mr = Arc::new(UserResource {
            pool: device_pool(),
            backing: Mutex::new(BTreeMap::new()),
        });
        buffer_teardown(
            mr,
            Memory::Pool,
            &["deallocate"],
            Some(other_context()),
            false,
        )
    });
}

#[test]
fn buffer_retained_by_a_graph_freed_by_deferred_cleanup() {
    sweep("graph-retained buffer freed by deferred cleanup", || {
        let context = primary(0);
        let stream = stream_in(&context);
        let buffer = used_buffer(device_pool(), &stream);
        let graph = Graph::new(0).expect("graph");
        graph.add_memset(&[], &buffer, 0x11u8).expect("memset node");
        let exec = graph.instantiate().expect("instantiate");
        exec.launch(&stream).expect("launch");
        stream.synchronize().expect("launch finished");
        let (graph_raw, exec_raw) = (
            graph.handle().unwrap().raw() as u64,
            exec.handle().unwrap().raw() as u64,
        );
        let ctx = context.raw() as u64;
        let ptr = buffer.ptr();
        buffer.close().expect("close: the graph keeps the memory");
        Prepared {
            bind: None,
            attributions: vec![
                Attribution {
                    operation: "cuGraphExecDestroy",
                    ptr: exec_raw,
                    context: ctx,
                },
                Attribution {
                    operation: "cuGraphDestroy",
                    ptr: graph_raw,
                    context: ctx,
                },
                Attribution {
                    operation: "cuMemFreeAsync",
                    ptr,
                    context: ctx,
                },
            ],
            memory: vec![held(ptr, Memory::Pool)],
            graphs: vec![
                (exec_raw, "cuGraphExecDestroy"),
                (graph_raw, "cuGraphDestroy"),
            ],
            recipe_context: ctx,
            teardown: Box::new(move || {
                drop(exec);
                drop(graph);
                Ok(())
            }),
            keep: vec![Box::new(stream)],
        }
    });
}

#[test]
fn stream_released_with_the_last_recipe_that_held_it() {
    sweep("stream released by the last recipe", || {
        let context = primary(0);
        let stream = stream_in(&context);
        let buffer = used_buffer(device_pool(), &stream);
        let (ctx, ptr, stream_raw) = (context.raw() as u64, buffer.ptr(), stream.raw() as u64);
        // The buffer's recipe is the only holder of the stream when the teardown runs.
        drop(stream);
        Prepared {
            bind: None,
            attributions: vec![
                Attribution {
                    operation: "cuMemFreeAsync",
                    ptr,
                    context: ctx,
                },
                Attribution {
                    operation: "cuStreamDestroy_v2",
                    ptr: stream_raw,
                    context: ctx,
                },
            ],
            memory: vec![held(ptr, Memory::Pool)],
            graphs: Vec::new(),
            recipe_context: ctx,
            teardown: Box::new(move || {
                drop(buffer);
                Ok(())
            }),
            keep: Vec::new(),
        }
    });
}

#[test]
fn created_context_released_with_its_last_stream_and_buffer() {
    sweep("created context released by the last buffer", || {
        let created = ContextHandle::create(0, ContextFlags::SCHED_AUTO).expect("cuCtxCreate");
        let stream = stream_in(&created);
        let buffer = used_buffer(device_pool(), &stream);
        let (ctx, ptr, stream_raw) = (created.raw() as u64, buffer.ptr(), stream.raw() as u64);
        drop((created, stream));
        Prepared {
            bind: None,
            attributions: vec![
                Attribution {
                    operation: "cuMemFreeAsync",
                    ptr,
                    context: ctx,
                },
                Attribution {
                    operation: "cuStreamDestroy_v2",
                    ptr: stream_raw,
                    context: ctx,
                },
                Attribution {
                    operation: "cuCtxDestroy_v2",
                    ptr: ctx,
                    context: ctx,
                },
            ],
            memory: vec![held(ptr, Memory::Pool)],
            graphs: Vec::new(),
            recipe_context: ctx,
            teardown: Box::new(move || {
                drop(buffer);
                Ok(())
            }),
            keep: Vec::new(),
        }
    });
}

#[test]
fn event_released() {
    sweep("event released", || {
        let context = primary(0);
        let stream = stream_in(&context);
        let event = EventHandle::create(&context, EventFlags::DISABLE_TIMING).expect("event");
        event.record(&stream).expect("record");
        Prepared {
            bind: Some(other_context()),
            attributions: vec![Attribution {
                operation: "cuEventDestroy_v2",
                ptr: event.raw() as u64,
                context: context.raw() as u64,
            }],
            memory: Vec::new(),
            graphs: Vec::new(),
            recipe_context: context.raw() as u64,
            teardown: Box::new(move || {
                drop(event);
                Ok(())
            }),
            keep: vec![Box::new(stream)],
        }
    });
}

#[test]
fn two_ipc_imports_of_one_mapping_dropped() {
    sweep("two IPC imports of one mapping dropped", || {
        let context = primary(0);
        let (s0, s1, s2) = (
            stream_in(&context),
            stream_in(&context),
            stream_in(&context),
        );
        let mr = DeviceMemoryResource::with_options(
            0,
            DeviceMemoryResourceOptions {
                max_size: 0,
                ipc_enabled: true,
            },
        )
        .expect("IPC pool");
        let exported = used_buffer(mr.clone(), &s0);
        s0.synchronize().expect("sync");
        let descriptor = exported.ipc_descriptor().expect("descriptor");
        let fd = mr.export_pool().expect("export");
        let imported =
            DeviceMemoryResource::import_pool(0, std::os::fd::AsFd::as_fd(&fd)).expect("import");
        let first = Buffer::from_ipc_descriptor(&imported, &descriptor, &s1).expect("import 1");
        let second = Buffer::from_ipc_descriptor(&imported, &descriptor, &s2).expect("import 2");
        first.fill(0x22u8, &s1).expect("fill");
        second.fill(0x33u8, &s2).expect("fill");
        let ptr = first.ptr();
        Prepared {
            bind: None,
            attributions: vec![
                Attribution {
                    operation: "deallocate",
                    ptr,
                    context: context.raw() as u64,
                },
                // The event the first import left for the last one, released after the unmap.
                Attribution {
                    operation: "cuEventDestroy_v2",
                    ptr: ANY,
                    context: context.raw() as u64,
                },
            ],
            memory: vec![held(ptr, Memory::Pool)],
            graphs: Vec::new(),
            recipe_context: context.raw() as u64,
            teardown: Box::new(move || {
                drop(first);
                drop(second);
                Ok(())
            }),
            keep: vec![
                Box::new(exported),
                Box::new(imported),
                Box::new(mr),
                Box::new(fd),
                Box::new((s0, s1, s2)),
            ],
        }
    });
}

/// cuda.core's `close(stream)` in Rust: hand the free over to `stream`, then close
/// (docs/decisions.md D4).
fn close_on(buffer: Buffer, stream: &StreamHandle) -> Result<(), MemoryError> {
    buffer.set_deallocation_stream(stream)?;
    buffer.close()
}
