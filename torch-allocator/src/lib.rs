//! custody as PyTorch's CUDA allocator: the C functions `torch.cuda.memory.CUDAPluggableAllocator`
//! loads from `libcustody_torch.so`, over custody buffers from each device's current memory pool.
//!
//! ```python
//! import torch
//! allocator = torch.cuda.memory.CUDAPluggableAllocator(
//!     "libcustody_torch.so", "custody_torch_malloc", "custody_torch_free")
//! torch.cuda.memory.change_current_allocator(allocator)   # before the first CUDA allocation
//! ```
//!
//! (`custody.interop.use_custody_in_torch()` does this from Python.) Each block PyTorch asks for
//! is a [`memory::Buffer`] of [`DeviceMemoryResource::new`]'s pool (`cuMemAllocFromPoolAsync`),
//! allocated on the stream PyTorch passes, which becomes the block's deallocation recipe: when
//! PyTorch frees the block (the tensor's storage goes, on whichever thread), custody frees it with
//! `cuMemFreeAsync` on that stream, in that stream's context, ordered after every use declared
//! with [`custody_torch_record_use`] (each declared stream gets an event the free waits for: no
//! host wait; docs/decisions.md D12). PyTorch's own caching allocator is bypassed: every block
//! goes to the driver's pool, which keeps freed memory for reuse (its release threshold).
//!
//! What a pluggable allocator does not get from PyTorch: `Tensor.record_stream` is a no-op
//! (PyTorch's `CUDAPluggableAllocator::recordStream` does nothing), so a tensor used on another
//! stream must be declared with [`custody_torch_record_use`]
//! (`custody.interop.torch_record_stream(tensor, stream)`); PyTorch's memory statistics
//! (`torch.cuda.memory_allocated`) stay at zero ([`custody_torch_live_bytes`] counts instead);
//! graph capture's private pools (`torch.cuda.graph`) need hooks the pluggable allocator does not
//! have.
//!
//! The one rule the caller keeps: a stream a block was allocated on, or declared a use of, stays
//! alive until the block is freed. PyTorch's default stream (a token) and the streams of its
//! stream pool (`torch.cuda.Stream()`, never destroyed) always do; a `torch.cuda.ExternalStream`
//! destroyed before the tensors allocated on it are freed does not, and a free on a destroyed
//! stream kills the process (docs/driver-facts.md F11).
#![allow(unsafe_code)]

use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_void};
use std::io::Write;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};

use handles::StreamHandle;
use memory::{Buffer, DeviceMemoryResource, MemoryResource};

/// The blocks PyTorch holds, by address.
#[derive(Default)]
struct Live {
    buffers: HashMap<usize, Buffer>,
    bytes: usize,
}

fn live() -> MutexGuard<'static, Live> {
    static LIVE: OnceLock<Mutex<Live>> = OnceLock::new();
    LIVE.get_or_init(Mutex::default)
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
}

/// Each device's resource (its current pool, borrowed), made on first use.
fn resource(device: i32) -> Result<Arc<DeviceMemoryResource>, memory::MemoryError> {
    static RESOURCES: OnceLock<Mutex<HashMap<i32, Arc<DeviceMemoryResource>>>> = OnceLock::new();
    let mut resources = RESOURCES
        .get_or_init(Mutex::default)
        .lock()
        .unwrap_or_else(PoisonError::into_inner);
    if let Some(found) = resources.get(&device) {
        return Ok(found.clone());
    }
    let made = DeviceMemoryResource::new(device)?;
    resources.insert(device, made.clone());
    Ok(made)
}

thread_local! {
    static LAST_ERROR: RefCell<String> = const { RefCell::new(String::new()) };
}

fn set_last_error(text: String) {
    LAST_ERROR.with(|last| *last.borrow_mut() = text);
}

/// Wraps the stream PyTorch passed.
///
/// # Safety
/// `stream` is a default-stream token (0, 0x1, 0x2) or a live stream that stays alive while any
/// buffer or use recorded with the handle lives (the crate's one rule).
unsafe fn wrap(stream: *mut c_void) -> Result<StreamHandle, String> {
    // SAFETY: the caller's contract, passed on: a token, or a stream that outlives every recipe
    // and use recorded with it.
    unsafe { handles::raw::wrap_stream(stream as usize, None) }
        .map_err(|error| format!("the stream {stream:p} was refused: {error}"))
}

fn allocate(size: usize, device: c_int, stream: *mut c_void) -> Result<*mut c_void, String> {
    if size == 0 {
        return Ok(std::ptr::null_mut());
    }
    // SAFETY: `custody_torch_malloc`'s contract is `wrap`'s.
    let stream = unsafe { wrap(stream) }?;
    let resource = resource(device).map_err(|error| format!("device {device}: {error}"))?;
    let buffer = resource
        .allocate(size, &stream)
        .map_err(|error| format!("{size} bytes on device {device}: {error}"))?;
    let ptr = buffer.ptr() as usize;
    let mut live = live();
    live.bytes += size;
    live.buffers.insert(ptr, buffer);
    Ok(ptr as *mut c_void)
}

/// Allocates `size` bytes on device `device`, ordered on `stream`, which becomes the block's
/// deallocation recipe (with `stream`'s context; a default-stream token binds to the context
/// current on the calling thread). Returns the address, null for 0 bytes, and null on failure
/// (out of memory, more than `isize::MAX` bytes, a refused stream, no current context for a
/// token), with the
/// reason in [`custody_torch_last_error`]. PyTorch's `CUDAPluggableAllocator` signature (`void* (size_t, int, cudaStream_t)`).
///
/// Driver calls: `cuStreamGetCtx` (a stream custody did not create), `cuCtxGetCurrent` (a token),
/// `cuMemAllocFromPoolAsync`; on a device's first block `cuDeviceGet`, `cuDeviceGetMemPool`.
///
/// # Safety
/// `stream` is a default-stream token (0, 0x1, 0x2) or a live stream that stays alive until the
/// block is freed (PyTorch's default and pool streams always do).
#[no_mangle]
pub unsafe extern "C" fn custody_torch_malloc(
    size: usize,
    device: c_int,
    stream: *mut c_void,
) -> *mut c_void {
    let result = catch_unwind(AssertUnwindSafe(|| allocate(size, device, stream)))
        .unwrap_or_else(|_| Err("custody_torch_malloc panicked".to_owned()));
    match result {
        Ok(ptr) => ptr,
        Err(text) => {
            set_last_error(format!("custody_torch_malloc: {text}"));
            std::ptr::null_mut()
        }
    }
}

/// Frees the block at `ptr` with its recipe: `cuMemFreeAsync` on the stream it was allocated
/// on, in that stream's context, after waiting (`cuStreamWaitEvent`) for every stream declared
/// with [`custody_torch_record_use`]. Never blocks. `size`, `device` and `stream` are PyTorch's
/// record of the block and are not needed. A failure is written to stderr (nothing can receive
/// it here; a write that fails is dropped, never a panic); a null or unknown `ptr` is ignored (an
/// unknown one is written to stderr too).
/// PyTorch's `CUDAPluggableAllocator` signature (`void (void*, size_t, int, cudaStream_t)`).
///
/// Driver calls: `cuEventCreate`, `cuEventRecord`, `cuStreamWaitEvent`, `cuEventDestroy` (per
/// declared use), `cuMemFreeAsync`.
#[no_mangle]
pub extern "C" fn custody_torch_free(
    ptr: *mut c_void,
    size: usize,
    device: c_int,
    stream: *mut c_void,
) {
    let _ = (size, device, stream);
    if ptr.is_null() {
        return;
    }
    let taken = {
        let mut live = live();
        let taken = live.buffers.remove(&(ptr as usize));
        if let Some(buffer) = &taken {
            live.bytes -= buffer.size();
        }
        taken
    };
    match taken {
        // The drop frees with the recipe and reports a failure through the cleanup-error
        // reporter (stderr), outside the lock.
        Some(buffer) => {
            if catch_unwind(AssertUnwindSafe(|| drop(buffer))).is_err() {
                stderr_line(format_args!("custody_torch_free: freeing {ptr:p} panicked"));
            }
        }
        None => stderr_line(format_args!(
            "custody_torch_free: {ptr:p} was not allocated by custody_torch_malloc"
        )),
    }
}

/// Writes one line to stderr, ignoring a failed write (a closed stderr, a pipe nobody reads):
/// `eprintln!` panics on a failed write, and a panic out of an `extern "C"` function aborts the
/// process.
fn stderr_line(line: std::fmt::Arguments<'_>) {
    let _ = writeln!(std::io::stderr(), "{line}");
}

/// Declares that work on `stream` uses the block at `ptr` (what `Tensor.record_stream` does for
/// PyTorch's own allocator): its free, whenever it comes, first makes the deallocation stream
/// wait for an event recorded on `stream` then, so it is ordered after all of `stream`'s work
/// enqueued before the free. No driver call now for a created or wrapped stream. Returns 0; 1
/// for an address that is not a live block's start; 2 when the stream is refused (another
/// device's, a token with no current context), with the reason in [`custody_torch_last_error`].
///
/// # Safety
/// `stream` is a default-stream token (0, 0x1, 0x2) or a live stream that stays alive until the
/// block is freed.
#[no_mangle]
pub unsafe extern "C" fn custody_torch_record_use(ptr: *mut c_void, stream: *mut c_void) -> c_int {
    let result = catch_unwind(AssertUnwindSafe(|| -> Result<c_int, String> {
        // SAFETY: this function's contract is `wrap`'s.
        let stream = unsafe { wrap(stream) }?;
        let live = live();
        let Some(buffer) = live.buffers.get(&(ptr as usize)) else {
            return Ok(1);
        };
        // No driver call for a stream that carries its context; a token reads the current one.
        buffer
            .record_use(&stream)
            .map(|()| 0)
            .map_err(|error| format!("{ptr:p}: {error}"))
    }))
    .unwrap_or_else(|_| Err("custody_torch_record_use panicked".to_owned()));
    match result {
        Ok(status) => status,
        Err(text) => {
            set_last_error(format!("custody_torch_record_use: {text}"));
            2
        }
    }
}

/// The number of blocks allocated and not yet freed.
#[no_mangle]
pub extern "C" fn custody_torch_live_allocations() -> usize {
    live().buffers.len()
}

/// The bytes of the blocks allocated and not yet freed.
#[no_mangle]
pub extern "C" fn custody_torch_live_bytes() -> usize {
    live().bytes
}

/// Copies the calling thread's last failure text (UTF-8, NUL-terminated when it fits) into
/// `buf` of `len` bytes and returns its length without the NUL; 0 when there was none.
///
/// # Safety
/// `buf` is null or writable for `len` bytes.
#[no_mangle]
pub unsafe extern "C" fn custody_torch_last_error(buf: *mut c_char, len: usize) -> usize {
    LAST_ERROR.with(|last| {
        let text = last.borrow();
        let n = text.len();
        if !buf.is_null() && n < len {
            // SAFETY: `buf` is writable for `len > n` bytes (the contract), and `text` is `n`
            // initialised bytes that do not overlap it.
            unsafe {
                std::ptr::copy_nonoverlapping(text.as_ptr(), buf.cast::<u8>(), n);
                buf.add(n).write(0);
            }
        }
        n
    })
}
