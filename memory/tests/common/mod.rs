//! Helpers for the memory integration tests: those every crate's tests share come from the
//! test-support crate (the emulator when it is the loaded driver, skip helpers, call-log
//! filters through `EmuLog`, captured reports, `start`); here, the memory-only ones (streams,
//! pool usage, foreign allocations and a recording memory resource).
//!
//! The same tests run against the emulated driver (`CUSTODY_CUDA_DRIVER=.../libcuda_emu.so`)
//! and against a real one (the GPU bundle). What any driver shows (return values and errors,
//! the bytes read back, the current context, recipes through the `Buffer` API, a pool's
//! `USED_MEM_CURRENT`, pointer attributes, what a memory resource's `deallocate` saw, reports)
//! is asserted everywhere; what only the emulator can show (its call log, hazards, live
//! allocations, fault injection) is asserted inside [`with_emulator`], through [`EmuLog`].

#![allow(dead_code, unused_imports)]

use std::sync::{Arc, Mutex};

pub use test_support::emu::{AllocationId, Call, Emulator, Hazard};
pub use test_support::*;

use handles::sys_types::CUdeviceptr;
use handles::PoolAttribute;
use handles::{
    ContextHandle, DevicePtrHandle, HandleError, MemoryPoolHandle, OwnedAllocation, StreamFlags,
    StreamHandle,
};
use memory::{Accessibility, Buffer, MemoryError, MemoryResource};

/// A created stream in device `n`'s primary context.
pub fn stream_on(n: i32) -> StreamHandle {
    StreamHandle::create(&primary(n), StreamFlags::DEFAULT, 0).expect("stream")
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
            .attribute(PoolAttribute::USED_MEM_CURRENT)
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
    fn allocate_owned(
        self: Arc<Self>,
        size: usize,
        stream: &StreamHandle,
    ) -> Result<Buffer, MemoryError> {
        let ptr = foreign_allocation(self.device, size, stream);
        Buffer::adopt(unowned(ptr, size), self, Some(stream)).map_err(|refused| {
            let _ = refused.allocation.into_raw(); // allocated elsewhere: leaked, as a test's
            refused.error
        })
    }

    fn deallocate(
        &self,
        allocation: OwnedAllocation,
        stream: &StreamHandle,
    ) -> Result<(), MemoryError> {
        let (ptr, size) = (allocation.ptr(), allocation.size());
        self.deallocations.lock().unwrap().push(Deallocation {
            ptr,
            size,
            stream: stream.raw() as usize,
            current_context: current_raw(),
        });
        if let Some(message) = self.fail_with.lock().unwrap().clone() {
            // Freeing nothing: the test frees the memory afterwards (through `unowned`).
            let _ = allocation.into_raw();
            return Err(MemoryError::Handle(HandleError::deallocator(message)));
        }
        Ok(allocation.free_async(stream)?)
    }

    fn accessibility(&self) -> Accessibility {
        Accessibility::device(self.device)
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

/// cuda.core's `close(stream)` in Rust: hand the free over to `stream`, then close
/// (docs/decisions.md D4). When the hand-over fails the buffer is dropped with its old recipe
/// (tests that check it stays open call `set_deallocation_stream` themselves).
pub fn close_on(buffer: Buffer, stream: &StreamHandle) -> Result<(), MemoryError> {
    buffer.set_deallocation_stream(stream)?;
    buffer.close()
}

/// The right to free memory at `ptr` that no buffer owns (the test allocated it, or a view or
/// a failed free left it with the test), for one of [`OwnedAllocation`]'s frees.
pub fn unowned(ptr: CUdeviceptr, size: usize) -> OwnedAllocation {
    // SAFETY: each caller holds memory that no buffer or handle owns any more and frees it
    // once, through the token.
    unsafe { handles::raw::owned_allocation(ptr, size) }
}
