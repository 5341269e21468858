//! Helpers for the handles integration tests: those every crate's tests share come from the
//! test-support crate (the emulator when it is the loaded driver, skip helpers, call-log
//! filters, captured reports, `start`); here, the handles-only ones (another context, pool usage,
//! a pool buffer).
//!
//! The same tests run against the emulated driver (`CUSTODY_CUDA_DRIVER=.../libcuda_emu.so`)
//! and against a real one (the GPU bundle). What any driver shows (return values and errors,
//! the current context, recipes, pool used memory, pointer attributes, reports and counters)
//! is asserted everywhere; what only the emulator can show (its call log, hazards, live
//! allocations, fault injection) is asserted inside [`with_emulator`], or a test that needs it
//! to run at all says so on stderr and returns ([`emulator_or_skip`]).

#![allow(dead_code, unused_imports)]

pub use test_support::emu::{AllocationId, Call, Emulator, Hazard};
pub use test_support::*;

use handles::PoolAttribute;
use handles::{
    ContextFlags, ContextHandle, DevicePtrHandle, HandleError, MemoryPoolHandle, OwnedAllocation,
};

/// A context other than device 0's primary one, for "another context is current" cases:
/// device 1's primary context when there is a second device, else a context created on
/// device 0 (either is a different `CUcontext`, which is all these cases need).
pub fn other_context() -> ContextHandle {
    if handles::device_count().expect("cuDeviceGetCount") >= 2 {
        primary(1)
    } else {
        ContextHandle::create(0, ContextFlags::SCHED_AUTO).expect("cuCtxCreate on device 0")
    }
}

/// `pool`'s `CU_MEMPOOL_ATTR_USED_MEM_CURRENT` in bytes, read once every stream of `context`
/// has finished its work (so stream-ordered frees issued there have happened). Runs on a helper
/// thread with `context` current, so the caller's binding and its thread's call log are
/// untouched.
pub fn pool_used(pool: &MemoryPoolHandle, context: &ContextHandle) -> u64 {
    let (pool, context) = (pool.clone(), context.clone());
    on_fresh_thread(move || {
        context.make_current().expect("cuCtxSetCurrent");
        context.synchronize().expect("cuCtxSynchronize");
        let used = pool
            .attribute(PoolAttribute::USED_MEM_CURRENT)
            .expect("cuMemPoolGetAttribute(USED_MEM_CURRENT)");
        ContextHandle::clear_current().expect("cuCtxSetCurrent(NULL)");
        used
    })
}

/// [`pool_used`] for device 0's default pool, the pool [`pool_buffer`] allocates from.
pub fn default_used(context: &ContextHandle) -> u64 {
    pool_used(&default_pool(), context)
}

/// Device 0's default pool.
pub fn default_pool() -> MemoryPoolHandle {
    MemoryPoolHandle::device_default(0).expect("default pool")
}

/// Allocates [`POOL_BUFFER`] bytes from device 0's default pool on `stream`.
pub fn pool_buffer(stream: &handles::StreamHandle) -> Result<DevicePtrHandle, HandleError> {
    DevicePtrHandle::alloc_from_pool(POOL_BUFFER as usize, &default_pool(), stream)
}

/// The size in bytes of a [`pool_buffer`].
pub const POOL_BUFFER: u64 = 256;

/// The right to free `size` bytes at a test address (`0x3000`, say) that nothing allocated:
/// for `Deallocator` tests, whose deallocators record what they are handed and never touch it.
pub fn test_allocation(ptr: u64, size: usize) -> OwnedAllocation {
    // SAFETY: the token only reaches the tests' own deallocators, which record its address and
    // size and never free or dereference it.
    unsafe { handles::raw::owned_allocation(ptr, size) }
}
