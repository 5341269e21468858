//! Holding a stream with stream memory operations, for tests that show when a free runs on any
//! driver: a [`HostFlag`] (a word of pinned, device-mapped host memory), [`hold`] (a
//! `cuStreamWaitValue32_v2` that keeps the stream's later work waiting until the host releases
//! the flag), [`write`] (a `cuStreamWriteValue32_v2` marker, stored when its stream reaches it)
//! and [`query`] (`cuStreamQuery`), as `docs/driver-facts.md` measured F14 and F15.
//!
//! Driver calls are made here directly, not through `handles`: these are the test's own
//! observations, and the product has no use for stream memory operations. Every call needs the
//! context its stream belongs to (or, for a token, the one to resolve it in) current on the
//! calling thread.

use std::ffi::c_void;
use std::sync::atomic::{AtomicU32, Ordering};

use cuda_sys::types::{CUdeviceptr, CUgraph, CUstream, CUstreamCaptureMode};
use cuda_sys::{CudaErrorCode, Driver};

/// `CU_MEMHOSTALLOC_PORTABLE`: pinned for every context.
const MEMHOSTALLOC_PORTABLE: u32 = 0x1;
/// `CU_MEMHOSTALLOC_DEVICEMAP`: mapped into the device's address space.
const MEMHOSTALLOC_DEVICEMAP: u32 = 0x2;
/// `CU_STREAM_WAIT_VALUE_GEQ`: wait until `(int32_t)(*addr - value) >= 0`.
const STREAM_WAIT_VALUE_GEQ: u32 = 0;

fn d() -> &'static Driver {
    cuda_sys::driver().expect("a CUDA driver")
}

#[track_caller]
fn checked(call: &str, status: u32) {
    assert_eq!(
        CudaErrorCode(status),
        CudaErrorCode::SUCCESS,
        "{call}: {}",
        CudaErrorCode(status).name()
    );
}

/// A 32-bit word of pinned host memory that streams can wait on: 0 until [`HostFlag::release`]
/// writes 1. Dropping it releases it (so a failing test never leaves a stream held), but never
/// frees it: a held stream may still be polling it. [`HostFlag::free`] frees it once no stream
/// waits on it any more.
pub struct HostFlag {
    host: *mut c_void,
    dev: CUdeviceptr,
}

// SAFETY: pinned host memory is valid on every thread until `cuMemFreeHost`, which only
// `HostFlag::free(self)` calls; the struct accesses it atomically.
unsafe impl Send for HostFlag {}
// SAFETY: as above.
unsafe impl Sync for HostFlag {}

impl HostFlag {
    /// Allocates the word (64 bytes of `cuMemHostAlloc` with `CU_MEMHOSTALLOC_DEVICEMAP |
    /// CU_MEMHOSTALLOC_PORTABLE`), zeroed. Needs a current context.
    ///
    /// # Panics
    /// When the driver lacks the entry points or refuses.
    #[track_caller]
    pub fn new() -> HostFlag {
        let d = d();
        let alloc = d.cuMemHostAlloc().expect("cuMemHostAlloc");
        let device_pointer = d
            .cuMemHostGetDevicePointer_v2()
            .expect("cuMemHostGetDevicePointer_v2");
        let mut host: *mut c_void = std::ptr::null_mut();
        // SAFETY: `host` is a valid out-pointer; the flags are the driver's documented values.
        let status = unsafe {
            alloc(
                &mut host,
                64,
                MEMHOSTALLOC_DEVICEMAP | MEMHOSTALLOC_PORTABLE,
            )
        };
        checked("cuMemHostAlloc", status);
        let mut dev: CUdeviceptr = 0;
        // SAFETY: `host` is pinned memory just allocated with DEVICEMAP; flags must be 0.
        let status = unsafe { device_pointer(&mut dev, host, 0) };
        checked("cuMemHostGetDevicePointer_v2", status);
        let flag = HostFlag { host, dev };
        flag.word().store(0, Ordering::SeqCst);
        flag
    }

    fn word(&self) -> &AtomicU32 {
        // SAFETY: 64 bytes, page-aligned, alive until `free(self)`.
        unsafe { AtomicU32::from_ptr(self.host.cast()) }
    }

    /// The device address streams wait on.
    pub fn dev(&self) -> CUdeviceptr {
        self.dev
    }

    /// The word as the host reads it now (a marker [`write`] stored, or 0).
    pub fn read(&self) -> u32 {
        self.word().load(Ordering::SeqCst)
    }

    /// Writes 1 from the host: every wait on the flag is satisfied.
    pub fn release(&self) {
        self.word().store(1, Ordering::SeqCst);
    }

    /// Frees the word; every stream that waited on it must have gone past the wait (synchronise
    /// them first).
    #[track_caller]
    pub fn free(self) {
        self.release();
        let host = self.host;
        std::mem::forget(self);
        // SAFETY: allocated by `cuMemHostAlloc` in `new`, freed once, no stream waits any more.
        let status = unsafe { (d().cuMemFreeHost)(host) };
        checked("cuMemFreeHost", status);
    }
}

impl Drop for HostFlag {
    fn drop(&mut self) {
        // Not freed: a held stream may still poll the word. Released, so that it goes on.
        self.release();
    }
}

/// Holds `stream` (a raw stream or a token, resolved in the calling thread's current context):
/// its later work waits until `flag` is released (`cuStreamWaitValue32_v2(stream, flag, 1,
/// CU_STREAM_WAIT_VALUE_GEQ)`).
///
/// # Panics
/// When the driver lacks the entry point or refuses.
#[track_caller]
pub fn hold(stream: CUstream, flag: &HostFlag) {
    let wait = d()
        .cuStreamWaitValue32_v2()
        .expect("cuStreamWaitValue32_v2");
    // SAFETY: the flag's device address stays valid while the wait may poll it (never freed
    // before the stream went past it); the caller vouches for `stream`.
    let status = unsafe { wait(stream, flag.dev(), 1, STREAM_WAIT_VALUE_GEQ) };
    checked("cuStreamWaitValue32_v2", status);
}

/// Queues a store of `value` into `word` on `stream` (a raw stream or a token, resolved in the
/// calling thread's current context): `cuStreamWriteValue32_v2(stream, word, value, 0)`. The host
/// sees the value once the stream reaches the write.
///
/// # Panics
/// When the driver lacks the entry point or refuses.
#[track_caller]
pub fn write(stream: CUstream, word: &HostFlag, value: u32) {
    let write = d()
        .cuStreamWriteValue32_v2()
        .expect("cuStreamWriteValue32_v2");
    // SAFETY: the word's device address stays valid until `HostFlag::free`, which needs every
    // stream that writes it to have gone past the write; the caller vouches for `stream`.
    let status = unsafe { write(stream, word.dev(), value, 0) };
    checked("cuStreamWriteValue32_v2", status);
}

/// `cuStreamQuery(stream)` on the calling thread: `CudaErrorCode::SUCCESS` when its work is done,
/// `CudaErrorCode::NOT_READY` while some is pending.
///
/// # Panics
/// When the driver lacks the entry point.
pub fn query(stream: CUstream) -> CudaErrorCode {
    let query = d().cuStreamQuery().expect("cuStreamQuery");
    // SAFETY: the caller vouches for `stream` (a token, or a live stream).
    CudaErrorCode(unsafe { query(stream) })
}

/// Begins capturing `stream` in `mode` straight through the driver, as another library would: custody does not count the
/// capture (`handles::capture_may_be_active` does not see it). End it with
/// [`end_foreign_capture`].
///
/// # Panics
/// When the driver refuses.
#[track_caller]
pub fn begin_foreign_capture(stream: CUstream, mode: CUstreamCaptureMode) {
    // SAFETY: the caller vouches for `stream`, a live created stream.
    let status = unsafe { (d().cuStreamBeginCapture_v2)(stream, mode) };
    checked("cuStreamBeginCapture_v2", status);
}

/// Ends the capture [`begin_foreign_capture`] began on `stream` and destroys the graph it made:
/// the end's status (`CUDA_ERROR_STREAM_CAPTURE_INVALIDATED` when a call on some thread broke
/// the capture meanwhile; the capture has ended either way).
pub fn end_foreign_capture(stream: CUstream) -> CudaErrorCode {
    let mut graph: CUgraph = std::ptr::null_mut();
    // SAFETY: `graph` is a valid out-pointer; the caller vouches for `stream`.
    let status = unsafe { (d().cuStreamEndCapture)(stream, &mut graph) };
    if !graph.is_null() {
        // SAFETY: the graph was just made by the capture and is destroyed once.
        let _ = unsafe { (d().cuGraphDestroy)(graph) };
    }
    CudaErrorCode(status)
}
