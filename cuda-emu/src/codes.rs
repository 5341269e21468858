//! Every status the emulator returns, named by the situation that produces it, in one place.
//!
//! Codes marked *measured* come from docs/driver-facts.md or from the driver
//! probe (`docs/driver-probe/`, an H200 with driver 580.159.04; conformance module `measured`);
//! *documented* ones from the driver API documentation; codes marked *guess* were chosen without
//! a measurement. The conformance suite run on a real GPU will confirm or correct the guesses:
//! change them here and nowhere else.

use cuda_sys::{CUresult, CudaErrorCode as C};

/// The result of an emulated call body: `Err` carries the status to return.
pub(crate) type Res<T = ()> = Result<T, CUresult>;

/// `cuMemHostRegister` of a range that overlaps memory the driver knows (documented).
pub(crate) const ALREADY_REGISTERED: CUresult = C::HOST_MEMORY_ALREADY_REGISTERED.0;
/// `cuMemHostUnregister` of an address no registration starts at (documented).
pub(crate) const NOT_REGISTERED: CUresult = C::HOST_MEMORY_NOT_REGISTERED.0;
/// `CUDA_SUCCESS`.
pub(crate) const SUCCESS: CUresult = C::SUCCESS.0;
/// A call other than `cuDriverGetVersion`/`cuGetError*`/`cuGetProcAddress*` before `cuInit`
/// (documented).
pub(crate) const NOT_INITIALIZED: CUresult = C::NOT_INITIALIZED.0;
/// A null out-pointer or a malformed argument (documented).
pub(crate) const INVALID_VALUE: CUresult = C::INVALID_VALUE.0;
/// A call that needs a context on a thread with none current (measured: F1-F3).
pub(crate) const NO_CONTEXT: CUresult = C::INVALID_CONTEXT.0;
/// A context handle that is unknown, destroyed, or an inactive primary context, passed as an
/// argument or current on the calling thread (guess: the driver may say
/// `CUDA_ERROR_CONTEXT_IS_DESTROYED` for a destroyed current context).
pub(crate) const BAD_CONTEXT: CUresult = C::INVALID_CONTEXT.0;
/// `cuCtxPopCurrent` with an empty context stack, with or without an out-pointer (measured).
pub(crate) const POP_EMPTY: CUresult = C::INVALID_CONTEXT.0;
/// `cuCtxPushCurrent(NULL)` (measured).
pub(crate) const PUSH_NULL: CUresult = C::INVALID_VALUE.0;
/// `cuCtxDestroy` of a primary context (measured).
pub(crate) const DESTROY_PRIMARY: CUresult = C::INVALID_CONTEXT.0;
/// `cuDevicePrimaryCtxRelease` of a primary context that is not retained (measured).
pub(crate) const RELEASE_UNRETAINED_PRIMARY: CUresult = C::INVALID_CONTEXT.0;
/// An unknown or destroyed stream, event, graph, graph node, graph exec, memory pool or user
/// object handle (measured for `cuStreamDestroy` of the NULL and legacy tokens; otherwise a
/// guess: the real driver crashes on a destroyed or garbage stream, F11 and the probe).
pub(crate) const BAD_HANDLE: CUresult = C::INVALID_HANDLE.0;
/// `cuEventRecord` on a stream of another context than the event's (documented).
pub(crate) const EVENT_CONTEXT_MISMATCH: CUresult = C::INVALID_HANDLE.0;
/// A device ordinal out of range (documented).
pub(crate) const BAD_DEVICE: CUresult = C::INVALID_DEVICE.0;
/// A pointer the driver does not know where it needs a device pointer; `cuMemFree` of an
/// unknown or interior pointer or of memory that went with its context, `cuMemFreeHost` of
/// memory it did not allocate, pointer attributes of a host address (measured: F9, the probe).
pub(crate) const BAD_POINTER: CUresult = C::INVALID_VALUE.0;
/// An access past the end of an allocation: fills, copies, memset nodes (measured).
pub(crate) const OUT_OF_RANGE: CUresult = C::INVALID_VALUE.0;
/// A use or free of memory whose free was already issued, or `cuMemFreeAsync` of an address
/// never allocated (measured for the frees, including `cuMemFreeAsync` of the address of a
/// second IPC import of one pointer after the first was freed, conformance module `ipc`; also a
/// hazard).
pub(crate) const FREED_POINTER: CUresult = C::INVALID_VALUE.0;
/// A zero-byte `cuMemAlloc` (measured) or `cuMemAllocManaged` (documented). Zero bytes from
/// `cuMemAllocHost` and the stream-ordered allocators succeed (measured).
pub(crate) const ZERO_SIZE: CUresult = C::INVALID_VALUE.0;
/// `cuMemFreeAsync` on a capturing stream of memory that is not a graph allocation (pool
/// memory allocated before the capture; measured on an H200, driver 580.159.04, in global,
/// thread-local and relaxed captures: driver facts F16, conformance `facts_capture::f16_*`).
/// Nothing is captured and the capture stays valid.
pub(crate) const CAPTURED_FREE: CUresult = C::INVALID_VALUE.0;
/// `cuMemHostGetDevicePointer` of a pointer that is not pinned host memory from
/// `cuMemAllocHost`/`cuMemHostAlloc` (guess).
pub(crate) const NOT_HOST_MAPPED: CUresult = C::INVALID_VALUE.0;
/// A stream memory operation (`cuStreamWaitValue*`, `cuStreamWriteValue*`) with unknown flags,
/// an address not aligned to the value's size, or memory the driver does not know or that is
/// managed (documented: managed memory cannot be used), or pageable host memory (guess).
pub(crate) const BAD_MEMOP: CUresult = C::INVALID_VALUE.0;
/// A stream memory operation on a capturing stream: capturing them as graph nodes is not
/// emulated, so the call fails and invalidates the capture (a real driver captures it).
pub(crate) const MEMOP_IN_CAPTURE: CUresult = C::STREAM_CAPTURE_UNSUPPORTED.0;
/// `cuMemFreeAsync` of host memory from `cuMemAllocHost` (guess).
pub(crate) const NOT_STREAM_ORDERED: CUresult = C::INVALID_VALUE.0;
/// An allocation larger than the device (measured: `cuMemAlloc` of 1 PiB), the pool's `maxSize`
/// rounded up to 32 MiB (guess), or the host can give.
pub(crate) const OUT_OF_MEMORY: CUresult = C::OUT_OF_MEMORY.0;
/// Work still pending (documented for the query functions).
pub(crate) const NOT_READY: CUresult = C::NOT_READY.0;
/// A driver call from a host function or a user-object destructor (documented rule, G4; the
/// code measured for every call tried there except `cuStreamSynchronize` of an idle stream and
/// `cuDriverGetVersion`, which succeed).
pub(crate) const NOT_PERMITTED: CUresult = C::NOT_PERMITTED.0;
/// `cuGetProcAddress` (the CUDA 11.3 entry point, which has no symbol status) of a symbol the
/// emulator does not export (documented). `cuGetProcAddress_v2` succeeds and says
/// `CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND` in the status instead (measured).
pub(crate) const NOT_FOUND: CUresult = C::NOT_FOUND.0;
/// An unsupported or unknown attribute (guess).
pub(crate) const BAD_ATTRIBUTE: CUresult = C::INVALID_VALUE.0;
/// `cuMemPoolDestroy` of a device's default pool (measured).
pub(crate) const DESTROY_DEFAULT_POOL: CUresult = C::INVALID_VALUE.0;
/// `cuMemPoolExportPointer` of an allocation from an IPC-capable pool that was never exported
/// with `cuMemPoolExportToShareableHandle` (measured on an H200, driver 580.159.04; conformance
/// module `ipc`); once the pool has been exported, its pointers export.
pub(crate) const POOL_NOT_EXPORTED: CUresult = C::INVALID_VALUE.0;
/// `cuDeviceSetMemPool` with a pool of another device or a host pool (guess).
pub(crate) const POOL_DEVICE_MISMATCH: CUresult = C::INVALID_VALUE.0;
/// A graph launched again while a memory it allocates is still live (guess).
pub(crate) const GRAPH_ALLOCATION_LIVE: CUresult = C::INVALID_VALUE.0;
/// Releasing more user-object references than are held (guess).
pub(crate) const OVER_RELEASE: CUresult = C::INVALID_VALUE.0;
/// A call that is not allowed while a stream capture is active (`cuMemAlloc` in a global
/// capture, `cuStreamSynchronize` of a capturing stream), or capture of the legacy stream
/// (documented, and measured for those three).
pub(crate) const CAPTURE_UNSUPPORTED: CUresult = C::STREAM_CAPTURE_UNSUPPORTED.0;
/// `cuMemPoolGetAttribute` on a thread whose own thread-local capture the driver had invalidated
/// (measured: docs/driver-facts.md F26).
pub(crate) const POOL_QUERY_IN_CAPTURE: CUresult = C::STREAM_CAPTURE_UNSUPPORTED.0;
/// Work on the legacy stream while a blocking stream of its context captures (documented).
pub(crate) const CAPTURE_IMPLICIT: CUresult = C::STREAM_CAPTURE_IMPLICIT.0;
/// Work on, or the end of, a capture that an illegal call invalidated (documented; measured for
/// `cuMemAllocAsync`, `cuMemsetD8Async` and `cuStreamEndCapture`).
pub(crate) const CAPTURE_INVALIDATED: CUresult = C::STREAM_CAPTURE_INVALIDATED.0;
/// `cuStreamEndCapture` while a forked stream has not joined back (documented).
pub(crate) const CAPTURE_UNJOINED: CUresult = C::STREAM_CAPTURE_UNJOINED.0;
/// `cuStreamEndCapture` from another thread than the one that began a non-relaxed capture
/// (documented).
pub(crate) const CAPTURE_WRONG_THREAD: CUresult = C::STREAM_CAPTURE_WRONG_THREAD.0;
/// `cuStreamWaitEvent` joining a stream of one capture to an event of another (documented).
pub(crate) const CAPTURE_ISOLATION: CUresult = C::STREAM_CAPTURE_ISOLATION.0;
/// `cuEventSynchronize` of an event last recorded in a capture, which also invalidates that
/// capture (measured on an H200, driver 580.159.04, from another thread than the one that began
/// a thread-local capture and from the capturing thread: driver facts F17, conformance
/// `facts_capture::f17_*`; in the other capture modes, a guess: the same).
pub(crate) const CAPTURED_EVENT_SYNCHRONIZE: CUresult = C::CAPTURED_EVENT.0;
/// `cuEventQuery` of an event last recorded in a capture that is already invalidated (or over):
/// `CUDA_ERROR_INVALID_VALUE`. While the capture is active the query is refused with
/// [`CAPTURED_EVENT_SYNCHRONIZE`]'s code and invalidates it (measured on an H200, driver
/// 580.159.04, on the capturing thread and on another: driver facts F17).
pub(crate) const CAPTURED_EVENT_QUERY: CUresult = C::INVALID_VALUE.0;
/// `cuStreamEndCapture` on a stream that is not capturing (measured), or `cuStreamBeginCapture`
/// on one that already is (guess).
pub(crate) const CAPTURE_STATE: CUresult = C::ILLEGAL_STATE.0;
/// An entry point the emulator does not serve (`api::unsupported`: kernels, modules, textures,
/// graphics interop, virtual memory management and the rest), or a feature of a served one that
/// it does not model (documented code for an unsupported operation).
pub(crate) const NOT_SUPPORTED: CUresult = C::NOT_SUPPORTED.0;
/// `cuEventElapsedTime` with an event created with `CU_EVENT_DISABLE_TIMING` (documented).
pub(crate) const EVENT_NO_TIMING: CUresult = C::INVALID_HANDLE.0;
/// `cuIpcGetEventHandle` of an event made without `CU_EVENT_INTERPROCESS` (flags 0, or
/// `CU_EVENT_DISABLE_TIMING` alone): `CUDA_ERROR_INVALID_HANDLE`, not `INVALID_VALUE`
/// (measured on an H200, driver 580.159.04: driver facts F20).
pub(crate) const IPC_EVENT_NOT_INTERPROCESS: CUresult = C::INVALID_HANDLE.0;
/// A memset by a device that was not granted access to the host pool of the memory
/// (`docs/driver-facts.md` F21): `CUDA_ERROR_INVALID_VALUE`.
pub(crate) const NO_POOL_ACCESS: CUresult = C::INVALID_VALUE.0;
/// `cuEventElapsedTime` with an event that was never recorded (documented).
pub(crate) const EVENT_NOT_RECORDED: CUresult = C::INVALID_HANDLE.0;
/// An emulator bug caught as a panic: never expected.
pub(crate) const INTERNAL: CUresult = C::UNKNOWN.0;
