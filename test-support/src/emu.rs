//! A typed client for the emulated driver's extra C symbols: fault injection and queries for
//! live allocations, stream-order hazards and the call log.
//!
//! The symbols are resolved from the same library as the driver, so the client sees the state
//! of the driver the process is actually using. On a real driver [`Emulator::get`] is `None`.
//! (Moved here from `test_support::emu`: only tests use it, and its JSON parsing needs serde, which
//! the product does not.)
//!
//! The C interface (all exported by `cuda-emu`):
//! - `int custodyEmuVersion(void)`: the query interface version, [`INTERFACE_VERSION`].
//! - `CUresult custodyEmuInjectFault(const char *function, unsigned nth, CUresult error)`:
//!   the `nth` next call (1 = the very next) of `function` returns `error` without effect, once.
//! - `void custodyEmuClearFaults(void)`.
//! - `size_t custodyEmuQuery(const char *what, char *buf, size_t len)`: writes the JSON for
//!   `what` (`allocations`, `hazards`, `calls`) NUL-terminated into `buf` when it fits and
//!   returns its length in bytes without the NUL; an unknown `what` returns 0. Allocations,
//!   hazards and calls carry allocation identities (`id`, `alloc`): addresses are reused.
//! - `void custodyEmuClear(const char *what)`: forgets the recorded `hazards` or `calls`.
//! - `unsigned long long custodyEmuThreadId(void)`: the calling thread's id in the call log.
//! - `CUresult custodyEmuReuseStreamHandle(unsigned long long handle)`: the next created stream
//!   takes `handle`, a destroyed stream's (a new stream with another `cuStreamGetId`).

use std::ffi::{c_char, c_int, c_uint, CString};

use serde::Deserialize;

use cuda_sys::{CUresult, CudaErrorCode, Driver};

/// The version of the query interface this client speaks.
pub const INTERFACE_VERSION: i32 = 1;

/// An allocation's identity in the emulated driver: unique in the process and never reused.
///
/// An address is not an identity: a pool hands a freed address out again
/// (`docs/driver-facts.md` F18), so a test that follows an allocation takes its identity while
/// it is live ([`Emulator::allocation_at`]) and compares identities from then on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Deserialize)]
#[serde(transparent)]
pub struct AllocationId(pub u64);

impl std::fmt::Display for AllocationId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "allocation #{}", self.0)
    }
}

/// One live allocation the emulated driver holds.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Allocation {
    /// The allocation's identity (its address may be handed out again once it is freed).
    pub id: AllocationId,
    /// Device (or host) address.
    pub ptr: u64,
    /// Size in bytes.
    pub size: u64,
    /// `device` (`cuMemAlloc`), `host` (`cuMemAllocHost`), `managed`, `pool`
    /// (stream-ordered, from a memory pool) or `ipc` (an imported pool allocation).
    pub kind: String,
    /// The device it lives on, -1 for host memory.
    pub device: i32,
    /// The memory pool, for stream-ordered allocations.
    pub pool: Option<u64>,
}

/// One stream-order or lifetime violation the hazard checker saw.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Hazard {
    /// `unordered_free`, `use_before_alloc` (a use on a stream not ordered after the
    /// allocation's stream-ordered allocation), `use_after_free`, `double_free`,
    /// `free_on_destroyed_stream` or
    /// `thread_exit_with_pending_per_thread_work` (a thread ended with operations on its
    /// per-thread stream that no synchronisation had seen complete; `ptr` is 0 and `stream` the
    /// per-thread stream: docs/driver-facts.md F24).
    pub kind: String,
    /// The address involved.
    pub ptr: u64,
    /// The identity ([`Allocation::id`]) of the allocation involved: the live one for an
    /// unordered free, the freed one for a use after free or a double free; `None` when the
    /// address was never allocated.
    #[serde(default)]
    pub alloc: Option<AllocationId>,
    /// The driver function that performed the offending operation.
    pub function: String,
    /// The stream it was issued on (0 for synchronous operations).
    pub stream: u64,
    /// A sentence saying what was not ordered after what.
    pub detail: String,
}

/// One driver call, as the emulator logged it.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Call {
    /// Order of the call in the process, from 0.
    pub seq: u64,
    /// The driver function called.
    pub function: String,
    /// The calling thread ([`Emulator::thread_id`] on that thread).
    pub thread: u64,
    /// The context current on the calling thread when the call was made (0 for none).
    pub context: u64,
    /// The stream argument as passed (a handle or a token), if the function takes one.
    pub stream: Option<u64>,
    /// The stream the call resolved to (a token resolved against the thread's context).
    pub resolved_stream: Option<u64>,
    /// The context that owns [`resolved_stream`](Call::resolved_stream): the one a
    /// stream-ordered call is ordered in, whichever context is current (`None` when the call
    /// resolved no stream, or destroyed it).
    #[serde(default)]
    pub stream_context: Option<u64>,
    /// The device pointer argument, if the function takes one.
    pub ptr: Option<u64>,
    /// The identity ([`Allocation::id`]) of the allocation the call made (the allocation
    /// calls, `cuMemPoolImportPointer`), or of the live allocation its pointer argument [`ptr`]
    /// was in when the call was made (frees, fills, copies, pointer attributes, pointer
    /// export), whether or not the call succeeded; `None` when there was none.
    ///
    /// [`ptr`]: Call::ptr
    #[serde(default)]
    pub alloc: Option<AllocationId>,
    /// The returned status.
    pub result: CUresult,
}

type InjectFault = unsafe extern "C" fn(*const c_char, c_uint, CUresult) -> CUresult;
type ClearFaults = unsafe extern "C" fn();
type Query = unsafe extern "C" fn(*const c_char, *mut c_char, usize) -> usize;
type Clear = unsafe extern "C" fn(*const c_char);
type ThreadId = unsafe extern "C" fn() -> u64;
type Version = unsafe extern "C" fn() -> c_int;
type ReuseStreamHandle = unsafe extern "C" fn(u64) -> CUresult;

/// The emulated driver's test interface. Only exists when the loaded driver is `cuda-emu`.
#[derive(Clone, Copy)]
pub struct Emulator {
    inject_fault: InjectFault,
    clear_faults: ClearFaults,
    query: Query,
    clear: Clear,
    thread_id: ThreadId,
    reuse_stream_handle: ReuseStreamHandle,
}

impl std::fmt::Debug for Emulator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Emulator")
    }
}

impl Emulator {
    /// The emulator's interface when the process's driver is the emulator; `None` for a real
    /// driver or when no driver loads.
    pub fn get() -> Option<Emulator> {
        Emulator::from_driver(cuda_sys::driver().ok()?)
    }

    /// The emulator's interface when `driver` is the emulator (speaking
    /// [`INTERFACE_VERSION`]); `None` otherwise.
    pub fn from_driver(driver: &Driver) -> Option<Emulator> {
        // SAFETY: each type is the C signature documented in this module's header, which
        // cuda-emu exports (here and in each block below).
        let version: Version = unsafe { driver.extra_symbol(c"custodyEmuVersion")? };
        // SAFETY: `custodyEmuVersion` takes no arguments.
        if unsafe { version() } != INTERFACE_VERSION {
            return None;
        }
        Some(Emulator {
            // SAFETY: see above.
            inject_fault: unsafe { driver.extra_symbol(c"custodyEmuInjectFault")? },
            // SAFETY: see above.
            clear_faults: unsafe { driver.extra_symbol(c"custodyEmuClearFaults")? },
            // SAFETY: see above.
            query: unsafe { driver.extra_symbol(c"custodyEmuQuery")? },
            // SAFETY: see above.
            clear: unsafe { driver.extra_symbol(c"custodyEmuClear")? },
            // SAFETY: see above.
            thread_id: unsafe { driver.extra_symbol(c"custodyEmuThreadId")? },
            // SAFETY: see above.
            reuse_stream_handle: unsafe { driver.extra_symbol(c"custodyEmuReuseStreamHandle")? },
        })
    }

    /// Makes the `nth` next call (1 = the very next, on any thread) of `function` fail with
    /// `error` and have no effect. Returns `false` if `function` is not an emulated entry point.
    pub fn inject_fault(&self, function: &str, nth: u32, error: CudaErrorCode) -> bool {
        let Ok(name) = CString::new(function) else {
            return false;
        };
        // SAFETY: `name` is NUL-terminated and outlives the call.
        unsafe { (self.inject_fault)(name.as_ptr(), nth, error.0) == 0 }
    }

    /// Removes every pending injected fault.
    pub fn clear_faults(&self) {
        // SAFETY: takes no arguments.
        unsafe { (self.clear_faults)() }
    }

    fn query_json(&self, what: &str) -> String {
        let what = CString::new(what).expect("static query names have no NUL");
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            // SAFETY: `buf` is writable for `buf.len()` bytes; `what` is NUL-terminated.
            let needed = unsafe { (self.query)(what.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
            if needed < buf.len() {
                buf.truncate(needed);
                return String::from_utf8_lossy(&buf).into_owned();
            }
            buf.resize(needed + 1, 0);
        }
    }

    fn query<T: for<'de> Deserialize<'de>>(&self, what: &str) -> Vec<T> {
        let json = self.query_json(what);
        serde_json::from_str(&json)
            .unwrap_or_else(|error| panic!("cuda-emu returned malformed {what} JSON: {error}"))
    }

    /// Every allocation the emulated driver still holds.
    pub fn live_allocations(&self) -> Vec<Allocation> {
        self.query("allocations")
    }

    /// The live allocation that starts at `ptr`, if any: take its [`Allocation::id`] while it
    /// is live to recognise it later, whatever the pool does with its address.
    pub fn allocation_at(&self, ptr: u64) -> Option<Allocation> {
        self.live_allocations().into_iter().find(|a| a.ptr == ptr)
    }

    /// Whether the allocation with identity `id` is still live.
    pub fn allocation_is_live(&self, id: AllocationId) -> bool {
        self.live_allocations().iter().any(|a| a.id == id)
    }

    /// Every hazard seen since start or the last [`Emulator::clear_hazards`].
    pub fn hazards(&self) -> Vec<Hazard> {
        self.query("hazards")
    }

    /// Every driver call logged since start or the last [`Emulator::clear_calls`].
    pub fn calls(&self) -> Vec<Call> {
        self.query("calls")
    }

    /// Forgets recorded hazards.
    pub fn clear_hazards(&self) {
        // SAFETY: the literal is NUL-terminated.
        unsafe { (self.clear)(c"hazards".as_ptr()) }
    }

    /// Forgets the call log.
    pub fn clear_calls(&self) {
        // SAFETY: the literal is NUL-terminated.
        unsafe { (self.clear)(c"calls".as_ptr()) }
    }

    /// The calling thread's id as it appears in [`Call::thread`].
    pub fn thread_id(&self) -> u64 {
        // SAFETY: takes no arguments.
        unsafe { (self.thread_id)() }
    }

    /// Makes the next stream created take `handle`, the handle of a stream destroyed before, as
    /// a real driver may hand a freed stream's handle out again: a new stream (another
    /// `cuStreamGetId`, its own place in the hazard checker's order) under the old value.
    /// Returns `false` (nothing changes) when `handle` is not a destroyed stream's.
    pub fn reuse_stream_handle(&self, handle: u64) -> bool {
        // SAFETY: takes a plain integer.
        unsafe { (self.reuse_stream_handle)(handle) == 0 }
    }
}
