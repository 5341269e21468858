//! One thin wrapper per driver entry point the conformance cases call, returning the raw status.
//!
//! Each wrapper makes exactly one driver call and hands back a [`Ret`]: the driver's own name
//! for the call, the status it returned and the out-value (meaningful only on success). Cases
//! then say what they expect: [`check`] (or [`Ret::check`]) for `CUDA_SUCCESS`, and
//! [`Ret::fails_with`] for a specific error. Failures print the error's name, never a bare number.
//!
//! The wrappers are safe functions although they pass raw handles through: a conformance case is
//! a raw driver sequence, and the unit of failure is the test process (each case runs in its own
//! process on the GPU host). Cases pass only handles they created and have not destroyed, except
//! where a case says otherwise; out-pointers are always valid locals.

use std::ffi::{c_char, c_int, c_uint, c_void, CStr};
use std::ptr;

use cuda_sys::types::{
    CUcontext, CUdevice, CUdeviceptr, CUevent, CUgraph, CUgraphExec, CUgraphNode, CUhostFn,
    CUmemAllocationHandleType, CUmemAllocationType, CUmemLocation, CUmemLocationType,
    CUmemPoolProps, CUmemPoolPtrExportData, CUmemPool_attribute, CUmemoryPool, CUpointer_attribute,
    CUstream, CUstreamCaptureMode, CUuserObject, CUDA_MEMSET_NODE_PARAMS,
};
use cuda_sys::{CUresult, CudaErrorCode, Driver};

/// The loaded driver; panics with the loader's reason when there is none. Every case comes here
/// first, so this also installs the stack dump the GPU runner asks a hung case for
/// (`test_support::stacks`).
pub fn driver() -> &'static Driver {
    test_support::stacks::dump_stacks_on_signal();
    match cuda_sys::driver() {
        Ok(driver) => driver,
        Err(error) => panic!(
            "no CUDA driver could be loaded: {error}\n\
             set {}=<path to libcuda_emu.so> (`cargo xtask test` does), or run on a GPU host",
            cuda_sys::DRIVER_ENV
        ),
    }
}

/// Loads the driver and calls `cuInit(0)`, which every case does first.
#[track_caller]
pub fn init() -> &'static Driver {
    let d = driver();
    // SAFETY: cuInit takes a flags word and no pointers.
    let status = unsafe { (d.cuInit)(0) };
    check(Ret::new("cuInit", status, ()));
    d
}

/// The outcome of one driver call: which call, what it returned, and its out-value.
#[must_use = "a driver status must be checked or asserted"]
pub struct Ret<T = ()> {
    /// The driver's name for the entry point.
    pub call: &'static str,
    /// The status it returned.
    pub code: CudaErrorCode,
    value: T,
}

impl Ret {
    /// Wraps the status of a driver call a case made directly (a NULL out-pointer, say).
    pub fn from_status(call: &'static str, status: CUresult) -> Ret {
        Ret::new(call, status, ())
    }

    /// Wraps the status and out-value of a call a case made directly, through an entry point
    /// it resolved itself (with `cuGetProcAddress_v2`).
    pub fn with_value<T>(call: &'static str, status: CUresult, value: T) -> Ret<T> {
        Ret::new(call, status, value)
    }
}

impl<T> Ret<T> {
    fn new(call: &'static str, status: CUresult, value: T) -> Ret<T> {
        Ret {
            call,
            code: CudaErrorCode(status),
            value,
        }
    }

    /// The out-value, after asserting `CUDA_SUCCESS`.
    #[track_caller]
    pub fn check(self) -> T {
        check(self)
    }

    /// The status and the out-value, for a case that accepts either outcome (the out-value
    /// means something only on success, or where the driver documents it for a failure).
    pub fn into_parts(self) -> (CudaErrorCode, T) {
        (self.code, self.value)
    }

    /// Asserts that the call returned `expected` (an error), discarding the out-value.
    #[track_caller]
    pub fn fails_with(self, expected: CudaErrorCode) {
        assert!(
            self.code == expected,
            "{} returned {:?}, expected {:?}",
            self.call,
            self.code,
            expected
        );
    }
}

/// Asserts that a call returned `CUDA_SUCCESS` and returns its out-value; on failure the panic
/// names the call and the error (`cuMemFreeAsync failed: CUDA_ERROR_INVALID_CONTEXT(201)`).
#[track_caller]
pub fn check<T>(ret: Ret<T>) -> T {
    assert!(ret.code.is_success(), "{} failed: {:?}", ret.call, ret.code);
    ret.value
}

/// Calls a driver function through the loaded driver and wraps the status, out-value last.
macro_rules! call {
    ($name:ident($($arg:expr),* $(,)?) => $value:expr) => {{
        let d = driver();
        // A required symbol is always there; an optional one the driver lacks fails the case here.
        let f = d.$name().unwrap_or_else(|e| panic!("{e}"));
        // SAFETY: see the module header: out-pointers are valid locals written only by the
        // driver, and handles are values the calling case created and has not destroyed.
        let status = unsafe { f($($arg),*) };
        Ret::new(stringify!($name), status, $value)
    }};
}

// ---------------------------------------------------------------------------------------------
// Version and devices

/// `cuDriverGetVersion`.
pub fn driver_get_version() -> Ret<c_int> {
    let mut version = 0;
    call!(cuDriverGetVersion(&mut version) => version)
}

/// `cuGetProcAddress_v2` with flags 0: (the function pointer, the symbol status as its integer
/// value, so that no status a newer driver might return is ever held in a Rust enum).
pub fn get_proc_address(symbol: &CStr, cuda_version: c_int) -> Ret<(*mut c_void, u32)> {
    let mut pfn = ptr::null_mut();
    let mut status: u32 = u32::MAX;
    let status_out = (&mut status as *mut u32).cast();
    let ret =
        call!(cuGetProcAddress_v2(symbol.as_ptr(), &mut pfn, cuda_version, 0, status_out) => ());
    Ret::new(ret.call, ret.code.0, (pfn, status))
}

/// `cuDeviceGet`.
pub fn device_get(ordinal: c_int) -> Ret<CUdevice> {
    let mut device = 0;
    call!(cuDeviceGet(&mut device, ordinal) => device)
}

/// `cuDeviceGetCount`.
pub fn device_get_count() -> Ret<c_int> {
    let mut count = 0;
    call!(cuDeviceGetCount(&mut count) => count)
}

/// `cuDeviceGetName`, decoded up to the first NUL.
pub fn device_get_name(device: CUdevice) -> Ret<String> {
    let mut buf = [0 as c_char; 256];
    let ret = call!(cuDeviceGetName(buf.as_mut_ptr(), buf.len() as c_int, device) => ());
    let bytes: Vec<u8> = buf
        .iter()
        .take_while(|&&c| c != 0)
        .map(|&c| c as u8)
        .collect();
    Ret::new(
        ret.call,
        ret.code.0,
        String::from_utf8_lossy(&bytes).into_owned(),
    )
}

/// `cuDeviceGetDefaultMemPool`.
pub fn device_get_default_mem_pool(device: CUdevice) -> Ret<CUmemoryPool> {
    let mut pool = ptr::null_mut();
    call!(cuDeviceGetDefaultMemPool(&mut pool, device) => pool)
}

/// `cuDeviceGetMemPool` (the device's current pool).
pub fn device_get_mem_pool(device: CUdevice) -> Ret<CUmemoryPool> {
    let mut pool = ptr::null_mut();
    call!(cuDeviceGetMemPool(&mut pool, device) => pool)
}

/// `cuMemGetInfo_v2`: (free, total) bytes.
pub fn mem_get_info() -> Ret<(usize, usize)> {
    let (mut free, mut total) = (0, 0);
    call!(cuMemGetInfo_v2(&mut free, &mut total) => (free, total))
}

// ---------------------------------------------------------------------------------------------
// Contexts

/// `cuDevicePrimaryCtxRetain`.
pub fn primary_ctx_retain(device: CUdevice) -> Ret<CUcontext> {
    let mut ctx = ptr::null_mut();
    call!(cuDevicePrimaryCtxRetain(&mut ctx, device) => ctx)
}

/// `cuDevicePrimaryCtxRelease_v2`.
pub fn primary_ctx_release(device: CUdevice) -> Ret {
    call!(cuDevicePrimaryCtxRelease_v2(device) => ())
}

/// `cuDevicePrimaryCtxGetState`: (flags, active).
pub fn primary_ctx_get_state(device: CUdevice) -> Ret<(c_uint, c_int)> {
    let (mut flags, mut active) = (0, 0);
    call!(cuDevicePrimaryCtxGetState(device, &mut flags, &mut active) => (flags, active))
}

/// `cuCtxCreate_v2` with flags 0 (pushes the new context on the calling thread's stack).
pub fn ctx_create(device: CUdevice) -> Ret<CUcontext> {
    let mut ctx = ptr::null_mut();
    call!(cuCtxCreate_v2(&mut ctx, 0, device) => ctx)
}

/// `cuCtxDestroy_v2`.
pub fn ctx_destroy(ctx: CUcontext) -> Ret {
    call!(cuCtxDestroy_v2(ctx) => ())
}

/// `cuCtxPushCurrent_v2`.
pub fn ctx_push_current(ctx: CUcontext) -> Ret {
    call!(cuCtxPushCurrent_v2(ctx) => ())
}

/// `cuCtxPopCurrent_v2`: the popped context.
pub fn ctx_pop_current() -> Ret<CUcontext> {
    let mut ctx = ptr::null_mut();
    call!(cuCtxPopCurrent_v2(&mut ctx) => ctx)
}

/// `cuCtxSetCurrent` (NULL pops the top of the stack).
pub fn ctx_set_current(ctx: CUcontext) -> Ret {
    call!(cuCtxSetCurrent(ctx) => ())
}

/// `cuCtxGetCurrent`: the current context, NULL for none.
pub fn ctx_get_current() -> Ret<CUcontext> {
    let mut ctx = ptr::null_mut();
    call!(cuCtxGetCurrent(&mut ctx) => ctx)
}

/// `cuCtxGetDevice`.
pub fn ctx_get_device() -> Ret<CUdevice> {
    let mut device = 0;
    call!(cuCtxGetDevice(&mut device) => device)
}

/// `cuCtxSynchronize`.
pub fn ctx_synchronize() -> Ret {
    call!(cuCtxSynchronize() => ())
}

// ---------------------------------------------------------------------------------------------
// Streams, host functions and events

/// `CU_STREAM_NON_BLOCKING`.
pub const STREAM_NON_BLOCKING: c_uint = 1;

/// `cuStreamCreate`.
pub fn stream_create(flags: c_uint) -> Ret<CUstream> {
    let mut stream = ptr::null_mut();
    call!(cuStreamCreate(&mut stream, flags) => stream)
}

/// `cuStreamCreateWithPriority`.
pub fn stream_create_with_priority(flags: c_uint, priority: c_int) -> Ret<CUstream> {
    let mut stream = ptr::null_mut();
    call!(cuStreamCreateWithPriority(&mut stream, flags, priority) => stream)
}

/// `cuStreamDestroy_v2`.
pub fn stream_destroy(stream: CUstream) -> Ret {
    call!(cuStreamDestroy_v2(stream) => ())
}

/// `cuStreamGetCtx`.
pub fn stream_get_ctx(stream: CUstream) -> Ret<CUcontext> {
    let mut ctx = ptr::null_mut();
    call!(cuStreamGetCtx(stream, &mut ctx) => ctx)
}

/// `cuStreamGetId`.
pub fn stream_get_id(stream: CUstream) -> Ret<u64> {
    let mut id = 0;
    call!(cuStreamGetId(stream, &mut id) => id)
}

/// `cuStreamGetFlags`.
pub fn stream_get_flags(stream: CUstream) -> Ret<c_uint> {
    let mut flags = 0;
    call!(cuStreamGetFlags(stream, &mut flags) => flags)
}

/// `cuStreamGetPriority`.
pub fn stream_get_priority(stream: CUstream) -> Ret<c_int> {
    let mut priority = 0;
    call!(cuStreamGetPriority(stream, &mut priority) => priority)
}

/// `cuStreamSynchronize`.
pub fn stream_synchronize(stream: CUstream) -> Ret {
    call!(cuStreamSynchronize(stream) => ())
}

/// `cuStreamQuery`.
pub fn stream_query(stream: CUstream) -> Ret {
    call!(cuStreamQuery(stream) => ())
}

/// `cuStreamWaitEvent` with flags 0.
pub fn stream_wait_event(stream: CUstream, event: CUevent) -> Ret {
    call!(cuStreamWaitEvent(stream, event, 0) => ())
}

type Callback = Box<dyn FnOnce() + Send + 'static>;

fn into_user_data(f: impl FnOnce() + Send + 'static) -> *mut c_void {
    let callback: Box<Callback> = Box::new(Box::new(f));
    Box::into_raw(callback).cast()
}

/// Takes back a callback the driver refused, so that it is dropped instead of leaked.
fn reclaim_user_data(data: *mut c_void) {
    // SAFETY: `data` came from `into_user_data` and the driver refused it, so nothing else
    // will ever read it.
    drop(unsafe { Box::from_raw(data.cast::<Callback>()) });
}

/// The host function and user-object destructor every case registers: runs the boxed closure
/// once. A panic is caught (it must not unwind into the driver) and reported on stderr; the
/// case then fails because the marks the closure should have left are missing.
extern "C" fn run_callback(data: *mut c_void) {
    // SAFETY: `data` came from `into_user_data`; the driver calls a host function or a
    // user-object destructor exactly once per registration.
    let callback = unsafe { Box::from_raw(data.cast::<Callback>()) };
    if std::panic::catch_unwind(std::panic::AssertUnwindSafe(callback)).is_err() {
        eprintln!("conformance: a host function or destructor panicked");
    }
}

const RUN_CALLBACK: CUhostFn = Some(run_callback);

/// `cuLaunchHostFunc` running `f` in stream order on a driver thread.
pub fn launch_host_func(stream: CUstream, f: impl FnOnce() + Send + 'static) -> Ret {
    let data = into_user_data(f);
    let ret = call!(cuLaunchHostFunc(stream, RUN_CALLBACK, data) => ());
    if !ret.code.is_success() {
        reclaim_user_data(data);
    }
    ret
}

/// `CU_EVENT_DISABLE_TIMING`.
pub const EVENT_DISABLE_TIMING: c_uint = 2;

/// `cuEventCreate`.
pub fn event_create(flags: c_uint) -> Ret<CUevent> {
    let mut event = ptr::null_mut();
    call!(cuEventCreate(&mut event, flags) => event)
}

/// `cuEventDestroy_v2`.
pub fn event_destroy(event: CUevent) -> Ret {
    call!(cuEventDestroy_v2(event) => ())
}

/// `cuEventRecord`.
pub fn event_record(event: CUevent, stream: CUstream) -> Ret {
    call!(cuEventRecord(event, stream) => ())
}

/// `cuEventSynchronize`.
pub fn event_synchronize(event: CUevent) -> Ret {
    call!(cuEventSynchronize(event) => ())
}

/// `cuEventQuery`.
pub fn event_query(event: CUevent) -> Ret {
    call!(cuEventQuery(event) => ())
}

// ---------------------------------------------------------------------------------------------
// Memory

/// `cuMemAlloc_v2`.
pub fn mem_alloc(bytes: usize) -> Ret<CUdeviceptr> {
    let mut dptr = 0;
    call!(cuMemAlloc_v2(&mut dptr, bytes) => dptr)
}

/// `cuMemFree_v2`.
pub fn mem_free(dptr: CUdeviceptr) -> Ret {
    call!(cuMemFree_v2(dptr) => ())
}

/// `cuMemAllocHost_v2`.
pub fn mem_alloc_host(bytes: usize) -> Ret<*mut c_void> {
    let mut p = ptr::null_mut();
    call!(cuMemAllocHost_v2(&mut p, bytes) => p)
}

/// `cuMemFreeHost`.
pub fn mem_free_host(p: *mut c_void) -> Ret {
    call!(cuMemFreeHost(p) => ())
}

/// `CU_MEMHOSTALLOC_PORTABLE`: pinned memory usable from every context.
pub const MEMHOSTALLOC_PORTABLE: c_uint = 0x1;
/// `CU_MEMHOSTALLOC_DEVICEMAP`: pinned memory mapped into the device's address space.
pub const MEMHOSTALLOC_DEVICEMAP: c_uint = 0x2;

/// `cuMemHostAlloc`.
pub fn mem_host_alloc(bytes: usize, flags: c_uint) -> Ret<*mut c_void> {
    let mut p = ptr::null_mut();
    call!(cuMemHostAlloc(&mut p, bytes, flags) => p)
}

/// `cuMemHostGetDevicePointer_v2` with flags 0: the device pointer of mapped pinned memory.
pub fn mem_host_get_device_pointer(p: *mut c_void) -> Ret<CUdeviceptr> {
    let mut dptr = 0;
    call!(cuMemHostGetDevicePointer_v2(&mut dptr, p, 0) => dptr)
}

/// `CU_STREAM_WAIT_VALUE_GEQ`: wait until `(int32_t)(*addr - value) >= 0`.
pub const STREAM_WAIT_VALUE_GEQ: c_uint = 0;
/// `CU_STREAM_WAIT_VALUE_EQ`: wait until `*addr == value`.
pub const STREAM_WAIT_VALUE_EQ: c_uint = 1;

/// `cuStreamWaitValue32_v2`.
pub fn stream_wait_value32(stream: CUstream, addr: CUdeviceptr, value: u32, flags: c_uint) -> Ret {
    call!(cuStreamWaitValue32_v2(stream, addr, value, flags) => ())
}

/// `cuStreamWriteValue32_v2` with flags 0.
pub fn stream_write_value32(stream: CUstream, addr: CUdeviceptr, value: u32) -> Ret {
    call!(cuStreamWriteValue32_v2(stream, addr, value, 0) => ())
}

/// `cuStreamWaitValue64_v2`.
pub fn stream_wait_value64(stream: CUstream, addr: CUdeviceptr, value: u64, flags: c_uint) -> Ret {
    call!(cuStreamWaitValue64_v2(stream, addr, value, flags) => ())
}

/// `cuStreamWriteValue64_v2` with flags 0.
pub fn stream_write_value64(stream: CUstream, addr: CUdeviceptr, value: u64) -> Ret {
    call!(cuStreamWriteValue64_v2(stream, addr, value, 0) => ())
}

/// `CU_MEM_ATTACH_GLOBAL`.
pub const MEM_ATTACH_GLOBAL: c_uint = 1;

/// `cuMemAllocManaged`.
pub fn mem_alloc_managed(bytes: usize, flags: c_uint) -> Ret<CUdeviceptr> {
    let mut dptr = 0;
    call!(cuMemAllocManaged(&mut dptr, bytes, flags) => dptr)
}

/// `cuMemAdvise_v2` with a location (`CU_MEM_LOCATION_TYPE_*`, id).
pub fn mem_advise(
    dptr: CUdeviceptr,
    bytes: usize,
    advice: c_uint,
    location: (c_uint, c_int),
) -> Ret {
    let location = cuda_sys::types::RawMemLocation {
        type_: location.0,
        id: location.1,
    };
    call!(cuMemAdvise_v2(dptr, bytes, advice, location) => ())
}

/// `cuMemRangeGetAttribute` of a 4-byte attribute (`CU_MEM_RANGE_ATTRIBUTE_*` as its integer),
/// over the whole of `[dptr, dptr + bytes)`.
pub fn mem_range_attribute_i32(dptr: CUdeviceptr, bytes: usize, attribute: c_uint) -> Ret<c_int> {
    let mut value: c_int = 0x7777;
    call!(cuMemRangeGetAttribute((&mut value as *mut c_int).cast(), 4, attribute, dptr, bytes) => value)
}

/// `cuMemAllocAsync` (from the device's current pool).
pub fn mem_alloc_async(bytes: usize, stream: CUstream) -> Ret<CUdeviceptr> {
    let mut dptr = 0;
    call!(cuMemAllocAsync(&mut dptr, bytes, stream) => dptr)
}

/// `cuMemAllocFromPoolAsync`.
pub fn mem_alloc_from_pool_async(
    bytes: usize,
    pool: CUmemoryPool,
    stream: CUstream,
) -> Ret<CUdeviceptr> {
    let mut dptr = 0;
    call!(cuMemAllocFromPoolAsync(&mut dptr, bytes, pool, stream) => dptr)
}

/// `cuMemFreeAsync`.
pub fn mem_free_async(dptr: CUdeviceptr, stream: CUstream) -> Ret {
    call!(cuMemFreeAsync(dptr, stream) => ())
}

/// `cuMemcpy` (device to device, by unified address).
pub fn memcpy(dst: CUdeviceptr, src: CUdeviceptr, bytes: usize) -> Ret {
    call!(cuMemcpy(dst, src, bytes) => ())
}

/// `cuMemcpyAsync`.
pub fn memcpy_async(dst: CUdeviceptr, src: CUdeviceptr, bytes: usize, stream: CUstream) -> Ret {
    call!(cuMemcpyAsync(dst, src, bytes, stream) => ())
}

/// `cuMemcpyHtoD_v2` from a host slice.
pub fn memcpy_htod(dst: CUdeviceptr, src: &[u8]) -> Ret {
    call!(cuMemcpyHtoD_v2(dst, src.as_ptr().cast(), src.len()) => ())
}

/// `cuMemcpyDtoH_v2` of `bytes` bytes into a new vector.
pub fn memcpy_dtoh(src: CUdeviceptr, bytes: usize) -> Ret<Vec<u8>> {
    let mut out = vec![0u8; bytes];
    let ret = call!(cuMemcpyDtoH_v2(out.as_mut_ptr().cast(), src, bytes) => ());
    Ret::new(ret.call, ret.code.0, out)
}

/// `cuMemsetD8_v2`: `count` bytes.
pub fn memset_d8(dst: CUdeviceptr, value: u8, count: usize) -> Ret {
    call!(cuMemsetD8_v2(dst, value, count) => ())
}

/// `cuMemsetD16_v2`: `count` 16-bit elements.
pub fn memset_d16(dst: CUdeviceptr, value: u16, count: usize) -> Ret {
    call!(cuMemsetD16_v2(dst, value, count) => ())
}

/// `cuMemsetD32_v2`: `count` 32-bit elements.
pub fn memset_d32(dst: CUdeviceptr, value: u32, count: usize) -> Ret {
    call!(cuMemsetD32_v2(dst, value, count) => ())
}

/// `cuMemsetD8Async`.
pub fn memset_d8_async(dst: CUdeviceptr, value: u8, count: usize, stream: CUstream) -> Ret {
    call!(cuMemsetD8Async(dst, value, count, stream) => ())
}

/// `cuMemsetD32Async`.
pub fn memset_d32_async(dst: CUdeviceptr, value: u32, count: usize, stream: CUstream) -> Ret {
    call!(cuMemsetD32Async(dst, value, count, stream) => ())
}

/// `CU_MEMORYTYPE_HOST`.
pub const MEMORYTYPE_HOST: c_uint = 1;
/// `CU_MEMORYTYPE_DEVICE`.
pub const MEMORYTYPE_DEVICE: c_uint = 2;

/// `cuPointerGetAttribute(CU_POINTER_ATTRIBUTE_CONTEXT)`.
pub fn pointer_context(dptr: CUdeviceptr) -> Ret<CUcontext> {
    let mut ctx: CUcontext = ptr::null_mut();
    let attr = CUpointer_attribute::CU_POINTER_ATTRIBUTE_CONTEXT;
    call!(cuPointerGetAttribute((&mut ctx as *mut CUcontext).cast(), attr, dptr) => ctx)
}

/// `cuPointerGetAttribute(CU_POINTER_ATTRIBUTE_MEMORY_TYPE)`.
pub fn pointer_memory_type(dptr: CUdeviceptr) -> Ret<c_uint> {
    let mut value: c_uint = 0;
    let attr = CUpointer_attribute::CU_POINTER_ATTRIBUTE_MEMORY_TYPE;
    call!(cuPointerGetAttribute((&mut value as *mut c_uint).cast(), attr, dptr) => value)
}

/// `cuPointerGetAttributes` of `CU_POINTER_ATTRIBUTE_MEMORY_TYPE`, `_IS_MANAGED`,
/// `_DEVICE_ORDINAL` and `_RANGE_SIZE` in one call: (memory type, is managed, ordinal, range size).
pub fn pointer_get_attributes(dptr: CUdeviceptr) -> Ret<(c_uint, c_uint, c_int, usize)> {
    use CUpointer_attribute as A;
    let (mut kind, mut managed, mut ordinal, mut range) =
        (7 as c_uint, 7 as c_uint, 7 as c_int, 7usize);
    let mut attributes = [
        A::CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
        A::CU_POINTER_ATTRIBUTE_IS_MANAGED,
        A::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
        A::CU_POINTER_ATTRIBUTE_RANGE_SIZE,
    ];
    let mut data: [*mut c_void; 4] = [
        (&mut kind as *mut c_uint).cast(),
        (&mut managed as *mut c_uint).cast(),
        (&mut ordinal as *mut c_int).cast(),
        (&mut range as *mut usize).cast(),
    ];
    call!(cuPointerGetAttributes(4, attributes.as_mut_ptr(), data.as_mut_ptr(), dptr) => (kind, managed, ordinal, range))
}

/// `cuPointerGetAttribute(CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL)`.
pub fn pointer_device_ordinal(dptr: CUdeviceptr) -> Ret<c_int> {
    let mut value: c_int = -1;
    let attr = CUpointer_attribute::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL;
    call!(cuPointerGetAttribute((&mut value as *mut c_int).cast(), attr, dptr) => value)
}

/// `cuPointerGetAttribute(CU_POINTER_ATTRIBUTE_IS_MANAGED)`.
pub fn pointer_is_managed(dptr: CUdeviceptr) -> Ret<bool> {
    let mut value: c_uint = 0;
    let attr = CUpointer_attribute::CU_POINTER_ATTRIBUTE_IS_MANAGED;
    call!(cuPointerGetAttribute((&mut value as *mut c_uint).cast(), attr, dptr) => value != 0)
}

/// `cuPointerGetAttribute(CU_POINTER_ATTRIBUTE_RANGE_SIZE)`.
pub fn pointer_range_size(dptr: CUdeviceptr) -> Ret<usize> {
    let mut value: usize = 0;
    let attr = CUpointer_attribute::CU_POINTER_ATTRIBUTE_RANGE_SIZE;
    call!(cuPointerGetAttribute((&mut value as *mut usize).cast(), attr, dptr) => value)
}

/// `cuPointerGetAttribute(CU_POINTER_ATTRIBUTE_BUFFER_ID)`: the allocation's process-wide
/// unique id (documented).
pub fn pointer_buffer_id(dptr: CUdeviceptr) -> Ret<u64> {
    let mut value: u64 = 0;
    let attr = CUpointer_attribute::CU_POINTER_ATTRIBUTE_BUFFER_ID;
    call!(cuPointerGetAttribute((&mut value as *mut u64).cast(), attr, dptr) => value)
}

/// `cuPointerGetAttribute(CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE)`.
pub fn pointer_mempool(dptr: CUdeviceptr) -> Ret<CUmemoryPool> {
    let mut pool: CUmemoryPool = ptr::null_mut();
    let attr = CUpointer_attribute::CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE;
    call!(cuPointerGetAttribute((&mut pool as *mut CUmemoryPool).cast(), attr, dptr) => pool)
}

// ---------------------------------------------------------------------------------------------
// Memory pools

/// The properties of a plain device pool: pinned device memory on `device`, no IPC handle type.
pub fn device_pool_props(device: CUdevice) -> CUmemPoolProps {
    CUmemPoolProps {
        allocType: CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED,
        handleTypes: CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_NONE,
        location: CUmemLocation {
            type_: CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
            id: device,
        },
        win32SecurityAttributes: ptr::null_mut(),
        reserved: [0; 64],
    }
}

/// `cuMemPoolCreate` of a plain device pool on `device`.
pub fn mem_pool_create(device: CUdevice) -> Ret<CUmemoryPool> {
    let props = device_pool_props(device);
    let mut pool = ptr::null_mut();
    call!(cuMemPoolCreate(&mut pool, &props) => pool)
}

/// `CUmemPoolProps` with every enumerator a plain integer, so that values the CUDA 12.0 types
/// do not know (`CU_MEM_LOCATION_TYPE_HOST`) are never held in a Rust enum. `max_size` is the
/// field CUDA 12.2 put at the start of `reserved`.
#[repr(C)]
pub struct RawPoolProps {
    /// `CUmemAllocationType`.
    pub alloc_type: u32,
    /// `CUmemAllocationHandleType` bits.
    pub handle_types: u32,
    /// `CUmemLocationType`.
    pub location_type: u32,
    /// The location's id (device ordinal, NUMA node).
    pub location_id: c_int,
    /// Unused on Linux.
    pub win32_security_attributes: *mut c_void,
    /// `maxSize` (CUDA 12.2): 0 for the driver's default.
    pub max_size: usize,
    /// Zero.
    pub reserved: [u8; 56],
}

const _: () = assert!(std::mem::size_of::<RawPoolProps>() == std::mem::size_of::<CUmemPoolProps>());

/// `CU_MEM_ALLOCATION_TYPE_PINNED`.
pub const ALLOCATION_TYPE_PINNED: u32 = 1;
/// `CU_MEM_LOCATION_TYPE_DEVICE`.
pub const LOCATION_TYPE_DEVICE: u32 = 1;
/// `CU_MEM_LOCATION_TYPE_HOST` (CUDA 12.2).
pub const LOCATION_TYPE_HOST: u32 = 2;

impl RawPoolProps {
    /// Pinned memory at (`location_type`, `location_id`), no IPC handle type, no `maxSize`.
    pub fn new(location_type: u32, location_id: c_int) -> RawPoolProps {
        RawPoolProps {
            alloc_type: ALLOCATION_TYPE_PINNED,
            handle_types: 0,
            location_type,
            location_id,
            win32_security_attributes: ptr::null_mut(),
            max_size: 0,
            reserved: [0; 56],
        }
    }
}

/// `cuMemPoolCreate` with raw properties.
pub fn mem_pool_create_raw(props: &RawPoolProps) -> Ret<CUmemoryPool> {
    let props = (props as *const RawPoolProps).cast::<CUmemPoolProps>();
    let mut pool = ptr::null_mut();
    call!(cuMemPoolCreate(&mut pool, props) => pool)
}

/// `cuMemPoolDestroy`.
pub fn mem_pool_destroy(pool: CUmemoryPool) -> Ret {
    call!(cuMemPoolDestroy(pool) => ())
}

/// `cuMemPoolGetAttribute` of a 64-bit attribute (`CU_MEMPOOL_ATTR_*_MEM_*`, the threshold).
pub fn mem_pool_get_attribute(pool: CUmemoryPool, attr: CUmemPool_attribute) -> Ret<u64> {
    let mut value: u64 = 0;
    call!(cuMemPoolGetAttribute(pool, attr, (&mut value as *mut u64).cast()) => value)
}

/// `cuMemPoolSetAttribute` of a 64-bit attribute.
pub fn mem_pool_set_attribute(pool: CUmemoryPool, attr: CUmemPool_attribute, value: u64) -> Ret {
    let mut value = value;
    call!(cuMemPoolSetAttribute(pool, attr, (&mut value as *mut u64).cast()) => ())
}

/// `CU_MEM_LOCATION_TYPE_HOST_NUMA` (CUDA 12.2): host memory of one NUMA node.
pub const LOCATION_TYPE_HOST_NUMA: u32 = 3;

/// `cuMemPoolSetAccess` of one device: `flags` as `CU_MEM_ACCESS_FLAGS_PROT_*` (0 none, 3
/// read-write).
pub fn mem_pool_set_access(pool: CUmemoryPool, device: c_int, flags: u32) -> Ret {
    use cuda_sys::types::{CUmemAccessDesc, CUmemAccess_flags, CUmemLocation, CUmemLocationType};
    let desc = CUmemAccessDesc {
        location: CUmemLocation {
            type_: CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
            id: device,
        },
        flags: if flags == 0 {
            CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_NONE
        } else {
            CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE
        },
    };
    call!(cuMemPoolSetAccess(pool, &desc, 1) => ())
}

/// `cuMemPoolGetAccess` of one device, as the `CU_MEM_ACCESS_FLAGS_PROT_*` integer.
pub fn mem_pool_get_access(pool: CUmemoryPool, device: c_int) -> Ret<u32> {
    use cuda_sys::types::{CUmemAccess_flags, CUmemLocation, CUmemLocationType};
    let mut flags = CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_NONE;
    let mut location = CUmemLocation {
        type_: CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
        id: device,
    };
    call!(cuMemPoolGetAccess(&mut flags, pool, &mut location) => flags as u32)
}

/// `cuMemPoolTrimTo`.
pub fn mem_pool_trim_to(pool: CUmemoryPool, min_bytes_to_keep: usize) -> Ret {
    call!(cuMemPoolTrimTo(pool, min_bytes_to_keep) => ())
}

// ---------------------------------------------------------------------------------------------
// Pool IPC

/// `CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR`, as a `handleTypes` bit.
pub const HANDLE_TYPE_POSIX_FD: u32 = 1;

/// `cuMemPoolExportToShareableHandle` as a POSIX file descriptor, flags 0: the new descriptor,
/// which the caller owns and closes.
pub fn mem_pool_export_to_fd(pool: CUmemoryPool) -> Ret<c_int> {
    let mut fd: c_int = -1;
    let kind = CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    let out = (&mut fd as *mut c_int).cast();
    call!(cuMemPoolExportToShareableHandle(out, pool, kind, 0) => fd)
}

/// `cuMemPoolImportFromShareableHandle` of a POSIX file descriptor (passed as the handle value
/// itself, cast to a pointer, as the driver API says), flags 0. The descriptor stays the
/// caller's.
pub fn mem_pool_import_from_fd(fd: c_int) -> Ret<CUmemoryPool> {
    let mut pool = ptr::null_mut();
    let kind = CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    let handle = fd as usize as *mut c_void;
    call!(cuMemPoolImportFromShareableHandle(&mut pool, handle, kind, 0) => pool)
}

/// `cuMemPoolExportPointer`: the 64 bytes of `CUmemPoolPtrExportData`.
pub fn mem_pool_export_pointer(dptr: CUdeviceptr) -> Ret<[u8; 64]> {
    let mut data = CUmemPoolPtrExportData { reserved: [0; 64] };
    let ret = call!(cuMemPoolExportPointer(&mut data, dptr) => ());
    Ret::new(ret.call, ret.code.0, data.reserved)
}

/// `cuMemPoolImportPointer` of 64 bytes of export data from an imported pool.
pub fn mem_pool_import_pointer(pool: CUmemoryPool, data: &[u8; 64]) -> Ret<CUdeviceptr> {
    let mut share = CUmemPoolPtrExportData { reserved: *data };
    let mut dptr = 0;
    call!(cuMemPoolImportPointer(&mut dptr, pool, &mut share) => dptr)
}

// ---------------------------------------------------------------------------------------------
// Graphs and user objects

/// `CU_USER_OBJECT_NO_DESTRUCTOR_SYNC`.
pub const USER_OBJECT_NO_DESTRUCTOR_SYNC: c_uint = 1;
/// `CU_GRAPH_USER_OBJECT_MOVE`.
pub const GRAPH_USER_OBJECT_MOVE: c_uint = 1;

/// `cuGraphCreate` with flags 0.
pub fn graph_create() -> Ret<CUgraph> {
    let mut graph = ptr::null_mut();
    call!(cuGraphCreate(&mut graph, 0) => graph)
}

/// `cuGraphDestroy`.
pub fn graph_destroy(graph: CUgraph) -> Ret {
    call!(cuGraphDestroy(graph) => ())
}

/// `cuGraphClone`.
pub fn graph_clone(graph: CUgraph) -> Ret<CUgraph> {
    let mut clone = ptr::null_mut();
    call!(cuGraphClone(&mut clone, graph) => clone)
}

/// `cuGraphAddMemsetNode` with no dependencies.
pub fn graph_add_memset_node(
    graph: CUgraph,
    params: &CUDA_MEMSET_NODE_PARAMS,
    ctx: CUcontext,
) -> Ret<CUgraphNode> {
    let mut node = ptr::null_mut();
    call!(cuGraphAddMemsetNode(&mut node, graph, ptr::null(), 0, params, ctx) => node)
}

/// `cuStreamBeginCapture_v2`.
pub fn stream_begin_capture(stream: CUstream, mode: CUstreamCaptureMode) -> Ret {
    call!(cuStreamBeginCapture_v2(stream, mode) => ())
}

/// `CU_STREAM_CAPTURE_STATUS_NONE` and `_ACTIVE`, as plain integers.
pub const CAPTURE_STATUS_NONE: u32 = 0;
/// See [`CAPTURE_STATUS_NONE`].
pub const CAPTURE_STATUS_ACTIVE: u32 = 1;
/// `CU_STREAM_CAPTURE_STATUS_INVALIDATED`: the capture was broken and must be ended.
pub const CAPTURE_STATUS_INVALIDATED: u32 = 2;

/// `cuStreamIsCapturing`: the status as its integer value (so that no value a newer driver
/// might return is ever held in a Rust enum).
pub fn stream_is_capturing(stream: CUstream) -> Ret<u32> {
    let mut status: u32 = u32::MAX;
    let out = (&mut status as *mut u32).cast();
    let ret = call!(cuStreamIsCapturing(stream, out) => ());
    Ret::new(ret.call, ret.code.0, status)
}

/// `cuStreamGetCaptureInfo_v2`: (the capture status as its integer value, the capture's unique
/// id, the graph being captured into; NULL when the stream is not capturing).
pub fn stream_get_capture_info(stream: CUstream) -> Ret<(u32, u64, CUgraph)> {
    let mut status: u32 = u32::MAX;
    let mut id: u64 = 0;
    let mut graph = ptr::null_mut();
    let out = (&mut status as *mut u32).cast();
    let ret = call!(cuStreamGetCaptureInfo_v2(
        stream,
        out,
        &mut id,
        &mut graph,
        ptr::null_mut(),
        ptr::null_mut()
    ) => ());
    Ret::new(ret.call, ret.code.0, (status, id, graph))
}

/// `cuThreadExchangeStreamCaptureMode`: sets the calling thread's capture interaction mode
/// (`CU_STREAM_CAPTURE_MODE_*` as an integer) and returns the previous one.
pub fn thread_exchange_capture_mode(mode: u32) -> Ret<u32> {
    let mut value = mode;
    let out = (&mut value as *mut u32).cast::<CUstreamCaptureMode>();
    call!(cuThreadExchangeStreamCaptureMode(out) => value)
}

/// `cuStreamEndCapture`: the captured graph (NULL when the capture failed).
pub fn stream_end_capture(stream: CUstream) -> Ret<CUgraph> {
    let mut graph = ptr::null_mut();
    call!(cuStreamEndCapture(stream, &mut graph) => graph)
}

/// `cuGraphAddEmptyNode` with no dependencies.
pub fn graph_add_empty_node(graph: CUgraph) -> Ret<CUgraphNode> {
    let mut node = ptr::null_mut();
    call!(cuGraphAddEmptyNode(&mut node, graph, ptr::null(), 0) => node)
}

/// `cuGraphInstantiateWithFlags` with flags 0.
pub fn graph_instantiate(graph: CUgraph) -> Ret<CUgraphExec> {
    let mut exec = ptr::null_mut();
    call!(cuGraphInstantiateWithFlags(&mut exec, graph, 0) => exec)
}

/// `cuGraphLaunch`.
pub fn graph_launch(exec: CUgraphExec, stream: CUstream) -> Ret {
    call!(cuGraphLaunch(exec, stream) => ())
}

/// `cuGraphExecDestroy`.
pub fn graph_exec_destroy(exec: CUgraphExec) -> Ret {
    call!(cuGraphExecDestroy(exec) => ())
}

/// `cuUserObjectCreate` with one reference and `CU_USER_OBJECT_NO_DESTRUCTOR_SYNC`, whose
/// destructor runs `destructor` once.
pub fn user_object_create(destructor: impl FnOnce() + Send + 'static) -> Ret<CUuserObject> {
    user_object_create_with_flags(USER_OBJECT_NO_DESTRUCTOR_SYNC, destructor)
}

/// `cuUserObjectCreate` with one reference and `flags`, whose destructor runs `destructor`
/// once (or never, when the driver refuses the object).
pub fn user_object_create_with_flags(
    flags: c_uint,
    destructor: impl FnOnce() + Send + 'static,
) -> Ret<CUuserObject> {
    let data = into_user_data(destructor);
    let mut object = ptr::null_mut();
    let ret = call!(cuUserObjectCreate(&mut object, data, RUN_CALLBACK, 1, flags) => object);
    if !ret.code.is_success() {
        reclaim_user_data(data);
    }
    ret
}

/// `cuGraphRetainUserObject(graph, object, 1, CU_GRAPH_USER_OBJECT_MOVE)`: moves the caller's
/// one reference into the graph.
pub fn graph_retain_user_object_move(graph: CUgraph, object: CUuserObject) -> Ret {
    call!(cuGraphRetainUserObject(graph, object, 1, GRAPH_USER_OBJECT_MOVE) => ())
}

/// `cuGraphRetainUserObject(graph, object, 1, 0)`: the graph takes a reference of its own; the
/// caller keeps its one.
pub fn graph_retain_user_object(graph: CUgraph, object: CUuserObject) -> Ret {
    call!(cuGraphRetainUserObject(graph, object, 1, 0) => ())
}

/// `cuGraphReleaseUserObject(graph, object, 1)`: gives back one reference the graph holds.
pub fn graph_release_user_object(graph: CUgraph, object: CUuserObject) -> Ret {
    call!(cuGraphReleaseUserObject(graph, object, 1) => ())
}

/// `cuUserObjectRelease`.
pub fn user_object_release(object: CUuserObject, count: c_uint) -> Ret {
    call!(cuUserObjectRelease(object, count) => ())
}
