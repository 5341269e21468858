//! Raw CUDA driver types (from cudarc's `sys` module), a checked symbol loader and [`CudaError`].
//!
//! This is the only place that knows how the driver library is found and which symbols custody
//! uses. Nothing here owns a CUDA resource: ownership lives in the `handles` crate.
//!
//! Architecture invariant: loading never panics. A missing library, a missing symbol or a driver
//! older than CUDA 12.0 is a [`LoadError`] that names what was missing.

#![allow(non_snake_case)]

// The modules' layers, lowest first: `types` and `status` (driver types and status codes),
// `loader` (finds the driver and its entry points), `error` (a failed call, described by the
// loaded driver). Each imports only from layers below it; a tidy test fails on a cycle.
mod error;
mod loader;
mod status;
pub mod types;

pub use error::CudaError;
pub use loader::{
    driver, fn_types, Driver, LoadError, DRIVER_ENV, MIN_DRIVER_VERSION, OPTIONAL_SYMBOLS, SYMBOLS,
};
pub use status::CudaErrorCode;

/// The raw status a driver entry point returns (`CUresult` in C), kept as an integer so that
/// an unknown code from a newer driver is never undefined behaviour.
pub type CUresult = u32;

/// Calls `$m!` with the list of every driver entry point custody declares, as
/// `name(arg: Type, ...);` items, types resolved against [`types`].
///
/// The loader builds [`Driver`] from this list (through [`with_driver_functions_by_need!`]) and
/// the emulated driver exports and checks every one of them, so the two can never disagree on a
/// name or a signature.
#[macro_export]
macro_rules! with_driver_functions {
    ($m:ident) => {
        $crate::__driver_function_list! { @all $m }
    };
}

/// Calls `$m!` with the same list split in two, as `required { items } optional { items }`.
///
/// *Required*: the entry points the product calls (the `handles` crate) and the loader's own
/// `cuDriverGetVersion`; a driver without one of them does not load ([`LoadError::MissingSymbol`]).
/// *Optional*: the ones only tests and diagnostics call (the conformance suite's raw sequences,
/// error descriptions), and the queries behind features that are not about memory lifetimes
/// (device attributes, names and UUIDs, stream flags, event timing, graph memory attributes,
/// graph upload: what the Python bindings' cuda.core surface reports); each is an `Option` in
/// [`Driver`], and a driver without it loads, its absence an error only where it is used. A new
/// entry point goes under `optional` unless the product's memory handling calls it.
#[macro_export]
macro_rules! with_driver_functions_by_need {
    ($m:ident) => {
        $crate::__driver_function_list! { @split $m }
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __driver_function_list {
    (@$mode:ident $m:ident) => {
        $crate::__driver_function_list! {
            @emit $mode $m
            required {
                cuInit(Flags: c_uint);
                cuDriverGetVersion(driverVersion: *mut c_int);
                cuDeviceGet(device: *mut CUdevice, ordinal: c_int);
                cuDeviceGetCount(count: *mut c_int);
                cuDeviceGetDefaultMemPool(pool_out: *mut CUmemoryPool, dev: CUdevice);
                cuDeviceGetMemPool(pool: *mut CUmemoryPool, dev: CUdevice);
                cuDevicePrimaryCtxRetain(pctx: *mut CUcontext, dev: CUdevice);
                cuDevicePrimaryCtxRelease_v2(dev: CUdevice);
                cuDevicePrimaryCtxGetState(dev: CUdevice, flags: *mut c_uint, active: *mut c_int);
                cuCtxCreate_v2(pctx: *mut CUcontext, flags: c_uint, dev: CUdevice);
                cuCtxDestroy_v2(ctx: CUcontext);
                cuCtxPopCurrent_v2(pctx: *mut CUcontext);
                cuCtxSetCurrent(ctx: CUcontext);
                cuCtxGetCurrent(pctx: *mut CUcontext);
                cuCtxGetDevice(device: *mut CUdevice);
                cuCtxGetId(ctx: CUcontext, ctxId: *mut c_ulonglong);
                cuCtxSynchronize();
                cuStreamCreateWithPriority(phStream: *mut CUstream, flags: c_uint, priority: c_int);
                cuStreamDestroy_v2(hStream: CUstream);
                cuStreamGetCtx(hStream: CUstream, pctx: *mut CUcontext);
                cuStreamGetId(hStream: CUstream, streamId: *mut c_ulonglong);
                cuStreamSynchronize(hStream: CUstream);
                cuStreamWaitEvent(hStream: CUstream, hEvent: CUevent, Flags: c_uint);
                cuStreamBeginCapture_v2(hStream: CUstream, mode: CUstreamCaptureMode);
                cuStreamEndCapture(hStream: CUstream, phGraph: *mut CUgraph);
                cuStreamIsCapturing(hStream: CUstream, captureStatus: *mut CUstreamCaptureStatus);
                cuStreamGetCaptureInfo_v2(hStream: CUstream, captureStatus_out: *mut CUstreamCaptureStatus, id_out: *mut cuuint64_t, graph_out: *mut CUgraph, dependencies_out: *mut *const CUgraphNode, numDependencies_out: *mut usize);
                cuThreadExchangeStreamCaptureMode(mode: *mut CUstreamCaptureMode);
                cuEventCreate(phEvent: *mut CUevent, Flags: c_uint);
                cuEventDestroy_v2(hEvent: CUevent);
                cuEventRecord(hEvent: CUevent, hStream: CUstream);
                cuEventSynchronize(hEvent: CUevent);
                cuEventQuery(hEvent: CUevent);
                cuMemAlloc_v2(dptr: *mut CUdeviceptr, bytesize: usize);
                cuMemFree_v2(dptr: CUdeviceptr);
                cuMemAllocHost_v2(pp: *mut *mut c_void, bytesize: usize);
                cuMemFreeHost(p: *mut c_void);
                cuMemAllocManaged(dptr: *mut CUdeviceptr, bytesize: usize, flags: c_uint);
                cuMemAllocAsync(dptr: *mut CUdeviceptr, bytesize: usize, hStream: CUstream);
                cuMemAllocFromPoolAsync(dptr: *mut CUdeviceptr, bytesize: usize, pool: CUmemoryPool, hStream: CUstream);
                cuMemFreeAsync(dptr: CUdeviceptr, hStream: CUstream);
                cuMemcpyAsync(dst: CUdeviceptr, src: CUdeviceptr, ByteCount: usize, hStream: CUstream);
                cuMemsetD8Async(dstDevice: CUdeviceptr, uc: c_uchar, N: usize, hStream: CUstream);
                cuMemsetD16Async(dstDevice: CUdeviceptr, us: c_ushort, N: usize, hStream: CUstream);
                cuMemsetD32Async(dstDevice: CUdeviceptr, ui: c_uint, N: usize, hStream: CUstream);
                cuPointerGetAttribute(data: *mut c_void, attribute: CUpointer_attribute, ptr: CUdeviceptr);
                cuPointerGetAttributes(numAttributes: c_uint, attributes: *mut CUpointer_attribute, data: *mut *mut c_void, ptr: CUdeviceptr);
                cuMemPoolCreate(pool: *mut CUmemoryPool, poolProps: *const CUmemPoolProps);
                cuMemPoolDestroy(pool: CUmemoryPool);
                cuMemPoolGetAttribute(pool: CUmemoryPool, attr: CUmemPool_attribute, value: *mut c_void);
                cuMemPoolSetAccess(pool: CUmemoryPool, map: *const CUmemAccessDesc, count: usize);
                cuMemPoolExportToShareableHandle(handle_out: *mut c_void, pool: CUmemoryPool, handleType: CUmemAllocationHandleType, flags: c_ulonglong);
                cuMemPoolImportFromShareableHandle(pool_out: *mut CUmemoryPool, handle: *mut c_void, handleType: CUmemAllocationHandleType, flags: c_ulonglong);
                cuMemPoolExportPointer(shareData_out: *mut CUmemPoolPtrExportData, ptr: CUdeviceptr);
                cuMemPoolImportPointer(ptr_out: *mut CUdeviceptr, pool: CUmemoryPool, shareData: *mut CUmemPoolPtrExportData);
                cuGraphCreate(phGraph: *mut CUgraph, flags: c_uint);
                cuGraphDestroy(hGraph: CUgraph);
                cuGraphClone(phGraphClone: *mut CUgraph, originalGraph: CUgraph);
                cuGraphInstantiateWithFlags(phGraphExec: *mut CUgraphExec, hGraph: CUgraph, flags: c_ulonglong);
                cuGraphLaunch(hGraphExec: CUgraphExec, hStream: CUstream);
                cuGraphExecDestroy(hGraphExec: CUgraphExec);
                cuGraphAddEmptyNode(phGraphNode: *mut CUgraphNode, hGraph: CUgraph, dependencies: *const CUgraphNode, numDependencies: usize);
                cuGraphAddHostNode(phGraphNode: *mut CUgraphNode, hGraph: CUgraph, dependencies: *const CUgraphNode, numDependencies: usize, nodeParams: *const CUDA_HOST_NODE_PARAMS);
                cuGraphAddMemsetNode(phGraphNode: *mut CUgraphNode, hGraph: CUgraph, dependencies: *const CUgraphNode, numDependencies: usize, memsetParams: *const CUDA_MEMSET_NODE_PARAMS, ctx: CUcontext);
                cuGraphAddMemcpyNode(phGraphNode: *mut CUgraphNode, hGraph: CUgraph, dependencies: *const CUgraphNode, numDependencies: usize, copyParams: *const CUDA_MEMCPY3D, ctx: CUcontext);
                cuUserObjectCreate(object_out: *mut CUuserObject, ptr: *mut c_void, destroy: CUhostFn, initialRefcount: c_uint, flags: c_uint);
                cuUserObjectRelease(object: CUuserObject, count: c_uint);
                cuGraphRetainUserObject(graph: CUgraph, object: CUuserObject, count: c_uint, flags: c_uint);
                cuGraphReleaseUserObject(graph: CUgraph, object: CUuserObject, count: c_uint);
            }
            optional {
                cuGetErrorName(error: CUresult, pStr: *mut *const c_char);
                cuGetErrorString(error: CUresult, pStr: *mut *const c_char);
                cuGetProcAddress_v2(symbol: *const c_char, pfn: *mut *mut c_void, cudaVersion: c_int, flags: cuuint64_t, symbolStatus: *mut CUdriverProcAddressQueryResult);
                cuDeviceGetName(name: *mut c_char, len: c_int, dev: CUdevice);
                cuDeviceGetPCIBusId(pciBusId: *mut c_char, len: c_int, dev: CUdevice);
                cuDeviceGetAttribute(pi: *mut c_int, attrib: CUdevice_attribute, dev: CUdevice);
                cuDeviceCanAccessPeer(canAccessPeer: *mut c_int, dev: CUdevice, peerDev: CUdevice);
                cuDeviceSetMemPool(dev: CUdevice, pool: CUmemoryPool);
                cuCtxPushCurrent_v2(ctx: CUcontext);
                cuStreamCreate(phStream: *mut CUstream, Flags: c_uint);
                cuStreamGetFlags(hStream: CUstream, flags: *mut c_uint);
                cuStreamGetPriority(hStream: CUstream, priority: *mut c_int);
                cuStreamQuery(hStream: CUstream);
                cuLaunchHostFunc(hStream: CUstream, fn_: CUhostFn, userData: *mut c_void);
                cuMemGetInfo_v2(free: *mut usize, total: *mut usize);
                cuMemcpy(dst: CUdeviceptr, src: CUdeviceptr, ByteCount: usize);
                cuMemcpyHtoD_v2(dstDevice: CUdeviceptr, srcHost: *const c_void, ByteCount: usize);
                cuMemcpyDtoH_v2(dstHost: *mut c_void, srcDevice: CUdeviceptr, ByteCount: usize);
                cuMemsetD8_v2(dstDevice: CUdeviceptr, uc: c_uchar, N: usize);
                cuMemsetD16_v2(dstDevice: CUdeviceptr, us: c_ushort, N: usize);
                cuMemsetD32_v2(dstDevice: CUdeviceptr, ui: c_uint, N: usize);
                cuMemPoolSetAttribute(pool: CUmemoryPool, attr: CUmemPool_attribute, value: *mut c_void);
                cuMemPoolTrimTo(pool: CUmemoryPool, minBytesToKeep: usize);
                cuMemPoolGetAccess(flags: *mut CUmemAccess_flags, memPool: CUmemoryPool, location: *mut CUmemLocation);
                cuGraphAddMemAllocNode(phGraphNode: *mut CUgraphNode, hGraph: CUgraph, dependencies: *const CUgraphNode, numDependencies: usize, nodeParams: *mut CUDA_MEM_ALLOC_NODE_PARAMS);
                cuGraphAddMemFreeNode(phGraphNode: *mut CUgraphNode, hGraph: CUgraph, dependencies: *const CUgraphNode, numDependencies: usize, dptr: CUdeviceptr);
                cuUserObjectRetain(object: CUuserObject, count: c_uint);
                cuMemHostAlloc(pp: *mut *mut c_void, bytesize: usize, Flags: c_uint);
                cuMemHostGetDevicePointer_v2(pdptr: *mut CUdeviceptr, p: *mut c_void, Flags: c_uint);
                cuStreamWaitValue32_v2(stream: CUstream, addr: CUdeviceptr, value: c_uint, flags: c_uint);
                cuStreamWaitValue64_v2(stream: CUstream, addr: CUdeviceptr, value: cuuint64_t, flags: c_uint);
                cuStreamWriteValue32_v2(stream: CUstream, addr: CUdeviceptr, value: c_uint, flags: c_uint);
                cuStreamWriteValue64_v2(stream: CUstream, addr: CUdeviceptr, value: cuuint64_t, flags: c_uint);
                cuDeviceGetUuid(uuid: *mut c_void, dev: CUdevice);
                cuDeviceGetUuid_v2(uuid: *mut c_void, dev: CUdevice);
                cuCtxGetStreamPriorityRange(leastPriority: *mut c_int, greatestPriority: *mut c_int);
                cuEventElapsedTime(pMilliseconds: *mut f32, hStart: CUevent, hEnd: CUevent);
                cuGraphUpload(hGraphExec: CUgraphExec, hStream: CUstream);
                cuDeviceGetGraphMemAttribute(device: CUdevice, attr: c_uint, value: *mut c_void);
                cuDeviceSetGraphMemAttribute(device: CUdevice, attr: c_uint, value: *mut c_void);
                cuDeviceGraphMemTrim(device: CUdevice);
                cuIpcGetEventHandle(pHandle: *mut CUipcEventHandle, event: CUevent);
                cuIpcOpenEventHandle(phEvent: *mut CUevent, handle: CUipcEventHandle);
                cuMemGetMemPool(pool: *mut CUmemoryPool, location: *mut RawMemLocation, type_: c_uint);
                cuMemAdvise_v2(devPtr: CUdeviceptr, count: usize, advice: c_uint, location: RawMemLocation);
                cuMemPrefetchAsync_v2(devPtr: CUdeviceptr, count: usize, location: RawMemLocation, flags: c_uint, hStream: CUstream);
                cuMemRangeGetAttribute(data: *mut c_void, dataSize: usize, attribute: c_uint, devPtr: CUdeviceptr, count: usize);
                cuMemPrefetchBatchAsync(dptrs: *const CUdeviceptr, sizes: *const usize, count: usize, prefetchLocs: *const RawMemLocation, prefetchLocIdxs: *const usize, numPrefetchLocs: usize, flags: c_ulonglong, hStream: CUstream);
                cuMemDiscardBatchAsync(dptrs: *const CUdeviceptr, sizes: *const usize, count: usize, flags: c_ulonglong, hStream: CUstream);
                cuMemDiscardAndPrefetchBatchAsync(dptrs: *const CUdeviceptr, sizes: *const usize, count: usize, prefetchLocs: *const RawMemLocation, prefetchLocIdxs: *const usize, numPrefetchLocs: usize, flags: c_ulonglong, hStream: CUstream);
            }
        }
    };
    (@emit all $m:ident required { $($required:tt)* } optional { $($optional:tt)* }) => {
        $m! { $($required)* $($optional)* }
    };
    (@emit split $m:ident required { $($required:tt)* } optional { $($optional:tt)* }) => {
        $m! { required { $($required)* } optional { $($optional)* } }
    };
}
