//! Shared helpers for the memory integration tests: the emulator, contexts and streams, call-log
//! filters, captured cleanup reports, and a recording memory resource. Tests run against the
//! emulated driver (`CUSTODY_CUDA_DRIVER=.../libcuda_emu.so`), serialise through [`start`] and
//! filter the process-wide logs by their own pointers and threads, so they pass one per process
//! (nextest) and all in one process (`--test-threads=1`).

#![allow(dead_code)]

use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use cuda_sys::emu::{Call, Emulator, Hazard};
use handles::sys_types::CUdeviceptr;
use handles::{
    CleanupError, CleanupWarning, ContextHandle, DevicePtrHandle, HandleError, MemoryPoolHandle,
    StreamHandle,
};
use memory::{Buffer, MemoryError, MemoryResource, Ownership};

/// The emulator's test interface; these tests fail with this message on any other driver.
pub fn emu() -> Emulator {
    Emulator::get().expect(
        "the memory integration tests need the emulated driver: build it with \
         `cargo build -p cuda-emu` and set CUSTODY_CUDA_DRIVER=$PWD/target/debug/libcuda_emu.so",
    )
}

static SERIAL: Mutex<()> = Mutex::new(());

/// Starts a test: the guard serialises it with the other tests of this process; the calling
/// thread has no context, the report hooks are installed, earlier deferred work has finished,
/// and hazards and faults are cleared.
#[must_use = "hold the guard for the whole test"]
pub fn start() -> MutexGuard<'static, ()> {
    let guard = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let _ = captured();
    while current_raw() != 0 {
        ContextHandle::clear_current().expect("cuCtxSetCurrent(NULL)");
    }
    handles::drain_deferred_cleanup();
    emu().clear_faults();
    emu().clear_hazards();
    guard
}

/// The calling thread's id in the call log.
pub fn tid() -> u64 {
    emu().thread_id()
}

/// The sequence number of the next call: calls with `seq >= mark()` come later.
pub fn mark() -> u64 {
    emu().calls().last().map_or(0, |c| c.seq + 1)
}

/// Calls since `from` whose pointer argument is `ptr`.
pub fn calls_for(ptr: u64, from: u64) -> Vec<Call> {
    emu()
        .calls()
        .into_iter()
        .filter(|c| c.ptr == Some(ptr) && c.seq >= from)
        .collect()
}

/// Calls of `function` since `from` on `thread`.
pub fn calls_named_on(function: &str, thread: u64, from: u64) -> Vec<Call> {
    emu()
        .calls()
        .into_iter()
        .filter(|c| c.function == function && c.thread == thread && c.seq >= from)
        .collect()
}

/// The one call of `function` with pointer `ptr` since `from`.
pub fn only_call(function: &str, ptr: u64, from: u64) -> Call {
    let calls: Vec<Call> = calls_for(ptr, from)
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

/// How many calls of `function` with pointer `ptr` since `from`.
pub fn count_calls(function: &str, ptr: u64, from: u64) -> usize {
    calls_for(ptr, from)
        .iter()
        .filter(|c| c.function == function)
        .count()
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

/// The hazards the checker saw for `ptr` since [`start`].
pub fn hazards_for(ptr: u64) -> Vec<Hazard> {
    emu()
        .hazards()
        .into_iter()
        .filter(|h| h.ptr == ptr)
        .collect()
}

/// Asserts the hazard checker saw nothing since [`start`].
pub fn assert_no_hazards() {
    let hazards = emu().hazards();
    assert!(hazards.is_empty(), "hazards: {hazards:#?}");
}

/// Whether the emulator still holds an allocation at `ptr`.
pub fn is_live(ptr: u64) -> bool {
    emu().live_allocations().iter().any(|a| a.ptr == ptr)
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
