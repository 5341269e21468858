//! Shared helpers for the memory integration tests: the emulator when it is the loaded driver,
//! contexts and streams, pool usage and pointer attributes, call-log filters, captured cleanup
//! reports, and a recording memory resource.
//!
//! The same tests run against the emulated driver (`CUSTODY_CUDA_DRIVER=.../libcuda_emu.so`)
//! and against a real one (the GPU bundle). What any driver shows (return values and errors,
//! the bytes read back, the current context, recipes through the `Buffer` API, a pool's
//! `USED_MEM_CURRENT`, pointer attributes, what a memory resource's `deallocate` saw, reports)
//! is asserted everywhere; what only the emulator can show (its call log, hazards, live
//! allocations, fault injection) is asserted inside [`with_emulator`], through [`EmuLog`]. A
//! test that needs the emulator or a second device to run at all says so on stderr and returns
//! ("skipped ...": [`emulator_or_skip`], [`second_device_or_skip`]); one that needs them for a
//! part only runs the rest and says "partly skipped ..." ([`emulator_or_skip_rest`],
//! [`second_device_or_skip_part`]), which the GPU runner counts as a pass, not a skip.
//! Tests serialise through [`start`] and filter the process-wide logs by their own pointers and
//! threads, so they pass one per process (nextest, the GPU runner) and all in one process
//! (`--test-threads=1`).
//!
//! `CUSTODY_TEST_PRETEND_REAL_DRIVER=1` makes [`emulator`] answer `None` while the emulator is
//! loaded, so the real-driver branches run (and are checked) on a machine without a GPU; with
//! `CUSTODY_EMU_DEVICE_COUNT=1` as well, the one-device branches run too (docs/testing.md).
//! These few functions mirror `handles/tests/common`, which a test of another crate cannot use.

#![allow(dead_code)]

use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use cuda_sys::emu::{Call, Emulator, Hazard};
use handles::ops::{self, PointerAttributes};
use handles::sys_types::{CUdeviceptr, MemPoolAttribute};
use handles::{
    CleanupError, CleanupWarning, ContextHandle, DevicePtrHandle, HandleError, MemoryPoolHandle,
    StreamHandle,
};
use memory::{Buffer, MemoryError, MemoryResource, Ownership};

/// Set (to anything but `0`) to make the tests treat the emulator as a real driver.
pub const PRETEND_REAL_DRIVER: &str = "CUSTODY_TEST_PRETEND_REAL_DRIVER";

/// The emulator's test interface when the loaded driver is the emulator (and
/// [`PRETEND_REAL_DRIVER`] is not set); `None` for a real driver.
///
/// # Panics
/// When no driver loads at all: the tests fail with the loader's reason rather than pass
/// vacuously.
pub fn emulator() -> Option<Emulator> {
    if let Err(error) = cuda_sys::driver() {
        panic!(
            "the memory integration tests need a CUDA driver: {error} (for the emulator, run \
             `cargo build -p cuda-emu` and set CUSTODY_CUDA_DRIVER=$PWD/target/debug/libcuda_emu.so)"
        );
    }
    if std::env::var_os(PRETEND_REAL_DRIVER).is_some_and(|v| v != "0") {
        return None;
    }
    Emulator::get()
}

/// Runs the emulator-only assertions in `f` when the emulator is the loaded driver.
pub fn with_emulator<R>(f: impl FnOnce(&Emulator) -> R) -> Option<R> {
    emulator().map(|emu| f(&emu))
}

/// The emulator, or `None` after printing why the calling test skips on a real driver.
/// `needs` completes "needs the emulator's ...".
pub fn emulator_or_skip(needs: &str) -> Option<Emulator> {
    let emu = emulator();
    if emu.is_none() {
        eprintln!("skipped on a real driver: needs the emulator's {needs}");
    }
    emu
}

/// [`emulator_or_skip`] for the rest of a test whose first part ran on any driver: prints
/// "partly skipped ...", which the GPU runner does not count as a skip (the test passed what it
/// could check).
pub fn emulator_or_skip_rest(needs: &str) -> Option<Emulator> {
    let emu = emulator();
    if emu.is_none() {
        eprintln!("partly skipped on a real driver: the rest needs the emulator's {needs}");
    }
    emu
}

/// Whether the driver sees at least two devices; when not, prints why the calling test skips.
pub fn second_device_or_skip(needs: &str) -> bool {
    let count = handles::device_count().expect("cuDeviceGetCount");
    if count < 2 {
        eprintln!("skipped: needs a second device for {needs}; the driver sees {count}");
    }
    count >= 2
}

/// [`second_device_or_skip`] for a part of a test (the rest runs with one device): when there
/// is no second device, prints "partly skipped ...", which the GPU runner does not count as a
/// skip.
pub fn second_device_or_skip_part(part: &str) -> bool {
    let count = handles::device_count().expect("cuDeviceGetCount");
    if count < 2 {
        eprintln!("partly skipped: needs a second device for {part}; the driver sees {count}");
    }
    count >= 2
}

/// The calling thread's id in the call log; 0 without the emulator (then nothing reads it).
pub fn tid() -> u64 {
    with_emulator(|emu| emu.thread_id()).unwrap_or(0)
}

/// The sequence number of the next call: calls with `seq >= mark()` come later. 0 without the
/// emulator (then nothing reads it).
pub fn mark() -> u64 {
    with_emulator(|emu| emu.calls().last().map_or(0, |c| c.seq + 1)).unwrap_or(0)
}

/// Queries of the emulator's call log, hazards and allocations, for use inside
/// [`with_emulator`].
pub trait EmuLog {
    /// Calls since `from` (any thread).
    fn calls_since(&self, from: u64) -> Vec<Call>;
    /// Calls since `from` whose pointer argument is `ptr`.
    fn calls_for(&self, ptr: u64, from: u64) -> Vec<Call>;
    /// Calls of `function` since `from` on `thread`.
    fn calls_named_on(&self, function: &str, thread: u64, from: u64) -> Vec<Call>;
    /// Calls of `function` since `from` (any thread).
    fn calls_named(&self, function: &str, from: u64) -> Vec<Call>;
    /// The one call of `function` with pointer `ptr` since `from`.
    fn only_call(&self, function: &str, ptr: u64, from: u64) -> Call;
    /// How many calls of `function` with pointer `ptr` since `from`.
    fn count_calls(&self, function: &str, ptr: u64, from: u64) -> usize;
    /// The hazards the checker saw for `ptr` since [`start`].
    fn hazards_for(&self, ptr: u64) -> Vec<Hazard>;
    /// Whether the emulator still holds an allocation at `ptr`.
    fn is_live(&self, ptr: u64) -> bool;
}

impl EmuLog for Emulator {
    fn calls_since(&self, from: u64) -> Vec<Call> {
        self.calls().into_iter().filter(|c| c.seq >= from).collect()
    }

    fn calls_for(&self, ptr: u64, from: u64) -> Vec<Call> {
        self.calls()
            .into_iter()
            .filter(|c| c.ptr == Some(ptr) && c.seq >= from)
            .collect()
    }

    fn calls_named_on(&self, function: &str, thread: u64, from: u64) -> Vec<Call> {
        self.calls()
            .into_iter()
            .filter(|c| c.function == function && c.thread == thread && c.seq >= from)
            .collect()
    }

    fn calls_named(&self, function: &str, from: u64) -> Vec<Call> {
        self.calls()
            .into_iter()
            .filter(|c| c.function == function && c.seq >= from)
            .collect()
    }

    fn only_call(&self, function: &str, ptr: u64, from: u64) -> Call {
        let calls: Vec<Call> = self
            .calls_for(ptr, from)
            .into_iter()
            .filter(|c| c.function == function)
            .collect();
        assert_eq!(
            calls.len(),
            1,
            "expected one {function}(0x{ptr:x}), got {calls:#?}"
        );
        calls.into_iter().next().unwrap()
    }

    fn count_calls(&self, function: &str, ptr: u64, from: u64) -> usize {
        self.calls_for(ptr, from)
            .iter()
            .filter(|c| c.function == function)
            .count()
    }

    fn hazards_for(&self, ptr: u64) -> Vec<Hazard> {
        self.hazards()
            .into_iter()
            .filter(|h| h.ptr == ptr)
            .collect()
    }

    fn is_live(&self, ptr: u64) -> bool {
        self.live_allocations().iter().any(|a| a.ptr == ptr)
    }
}

static SERIAL: Mutex<()> = Mutex::new(());

/// Starts a test: the guard serialises it with the other tests of this process (fault
/// injection, the hazard list, the deferred queue and the device pool's used memory are
/// process-wide); the calling thread has no context, the report hooks are installed, earlier
/// deferred work has finished and, on the emulator, hazards and faults are cleared.
#[must_use = "hold the guard for the whole test"]
pub fn start() -> MutexGuard<'static, ()> {
    let guard = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    // First, so that a missing driver fails with the loader's reason.
    let emu = emulator();
    let _ = captured();
    while current_raw() != 0 {
        ContextHandle::clear_current().expect("cuCtxSetCurrent(NULL)");
    }
    handles::drain_deferred_cleanup();
    if let Some(emu) = emu {
        emu.clear_faults();
        emu.clear_hazards();
    }
    guard
}

/// On the emulator, asserts the hazard checker saw nothing since [`start`]; a real driver has
/// no hazard checker.
pub fn assert_no_hazards() {
    with_emulator(|emu| {
        let hazards = emu.hazards();
        assert!(hazards.is_empty(), "hazards: {hazards:#?}");
    });
}

/// Device `n`'s primary context (retained).
pub fn primary(n: i32) -> ContextHandle {
    ContextHandle::primary(n).expect("primary context")
}

/// A created stream in device `n`'s primary context.
pub fn stream_on(n: i32) -> StreamHandle {
    StreamHandle::create(&primary(n), 0, 0).expect("stream")
}

/// The raw context current on the calling thread (0 for none).
pub fn current_raw() -> u64 {
    ContextHandle::current()
        .expect("cuCtxGetCurrent")
        .map_or(0, |c| c.raw() as u64)
}

/// Runs `f` on a new thread that has never had a context.
pub fn on_fresh_thread<R: Send + 'static>(f: impl FnOnce() -> R + Send + 'static) -> R {
    std::thread::spawn(f).join().expect("test thread panicked")
}

/// `pool`'s `CU_MEMPOOL_ATTR_USED_MEM_CURRENT` in bytes, read once every stream of device 0's
/// primary context has finished its work (so stream-ordered frees issued there have happened).
/// Runs on a helper thread, so the caller's binding and its thread's call log are untouched.
pub fn pool_used(pool: &MemoryPoolHandle) -> u64 {
    let pool = pool.clone();
    on_fresh_thread(move || {
        let context = primary(0);
        context.make_current().expect("cuCtxSetCurrent");
        context.synchronize().expect("cuCtxSynchronize");
        let used = pool
            .attribute_u64(MemPoolAttribute::CU_MEMPOOL_ATTR_USED_MEM_CURRENT)
            .expect("cuMemPoolGetAttribute(USED_MEM_CURRENT)");
        ContextHandle::clear_current().expect("cuCtxSetCurrent(NULL)");
        used
    })
}

/// Device 0's current pool: the pool of `DeviceMemoryResource::new(0)`, of
/// [`foreign_allocation`] and of [`RecordingResource`].
pub fn device_pool() -> MemoryPoolHandle {
    MemoryPoolHandle::device_current(0).expect("device 0's pool")
}

/// [`pool_used`] for [`device_pool`].
pub fn device_used() -> u64 {
    pool_used(&device_pool())
}

/// What the driver knows about `ptr` (`None`: an address it does not know, such as memory
/// freed with `cuMemFree` or `cuMemFreeHost`).
pub fn attributes(ptr: u64) -> Option<PointerAttributes> {
    ops::pointer_attributes(ptr).expect("cuPointerGetAttribute")
}

/// Every cleanup error and warning reported in this process.
pub struct Captured {
    pub errors: Mutex<Vec<CleanupError>>,
    pub warnings: Mutex<Vec<CleanupWarning>>,
}

/// Installs (once) hooks that record every report.
pub fn captured() -> &'static Captured {
    static CAPTURED: OnceLock<Captured> = OnceLock::new();
    static INSTALLED: OnceLock<()> = OnceLock::new();
    let all = CAPTURED.get_or_init(|| Captured {
        errors: Mutex::new(Vec::new()),
        warnings: Mutex::new(Vec::new()),
    });
    INSTALLED.get_or_init(|| {
        handles::set_cleanup_error_hook(Box::new(|e| {
            captured().errors.lock().unwrap().push(e.clone());
        }));
        handles::set_cleanup_warning_hook(Box::new(|w| {
            captured().warnings.lock().unwrap().push(w.clone());
        }));
    });
    all
}

/// The cleanup errors reported for `ptr`.
pub fn errors_for(ptr: u64) -> Vec<CleanupError> {
    captured()
        .errors
        .lock()
        .unwrap()
        .iter()
        .filter(|e| e.ptr == ptr)
        .cloned()
        .collect()
}

/// `size` bytes of stream-ordered memory from device `device`'s current pool that no handle
/// owns, ordered on `stream`: memory "allocated elsewhere", for adoption tests.
pub fn foreign_allocation(device: i32, size: usize, stream: &StreamHandle) -> CUdeviceptr {
    let pool = MemoryPoolHandle::device_current(device).expect("device pool");
    let handle = DevicePtrHandle::alloc_from_pool(size, &pool, stream).expect("allocation");
    let ptr = handle.ptr();
    // Giving up the handle without releasing it leaves the memory with nobody: the caller's.
    std::mem::forget(handle);
    ptr
}

/// One `deallocate` call as [`RecordingResource`] saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Deallocation {
    pub ptr: u64,
    pub size: usize,
    /// The stream argument's raw value.
    pub stream: usize,
    /// The context current on the calling thread during the call.
    pub current_context: u64,
}

/// A memory resource of the caller's (as a Python subclass would be): device memory of device
/// `device`, freed with `cuMemFreeAsync`, recording every `deallocate`.
pub struct RecordingResource {
    pub device: i32,
    pub deallocations: Mutex<Vec<Deallocation>>,
    /// When set, `deallocate` fails (after recording) without freeing.
    pub fail_with: Mutex<Option<String>>,
}

impl RecordingResource {
    pub fn new(device: i32) -> Arc<RecordingResource> {
        Arc::new(RecordingResource {
            device,
            deallocations: Mutex::new(Vec::new()),
            fail_with: Mutex::new(None),
        })
    }

    pub fn deallocations(&self) -> Vec<Deallocation> {
        self.deallocations.lock().unwrap().clone()
    }
}

impl MemoryResource for RecordingResource {
    fn allocate(
        self: Arc<Self>,
        size: usize,
        stream: &StreamHandle,
    ) -> Result<Buffer, MemoryError> {
        let ptr = foreign_allocation(self.device, size, stream);
        Buffer::from_handle(ptr, size, Ownership::MemoryResource(self), Some(stream))
    }

    fn deallocate(
        &self,
        ptr: CUdeviceptr,
        size: usize,
        stream: &StreamHandle,
    ) -> Result<(), MemoryError> {
        self.deallocations.lock().unwrap().push(Deallocation {
            ptr,
            size,
            stream: stream.raw() as usize,
            current_context: current_raw(),
        });
        if let Some(message) = self.fail_with.lock().unwrap().clone() {
            return Err(MemoryError::Handle(HandleError::Deallocator { message }));
        }
        Ok(handles::ops::free_async(ptr, stream)?)
    }

    fn is_device_accessible(&self) -> bool {
        true
    }

    fn is_host_accessible(&self) -> bool {
        false
    }

    fn device_id(&self) -> Option<i32> {
        Some(self.device)
    }
}

/// The buffer's bytes, read on `stream`.
pub fn read(buffer: &Buffer, stream: &StreamHandle) -> Vec<u8> {
    let mut bytes = vec![0u8; buffer.size()];
    buffer
        .copy_to_host(&mut bytes, stream)
        .expect("copy to host");
    bytes
}
