//! The PyTorch allocator's C functions driven as PyTorch drives them, by a stand-in for it here:
//! a block allocated on a stream is freed on that stream (its recipe), on whichever thread
//! frees it, ordered after the streams declared with `custody_torch_record_use` (the hazard
//! checker clean with the declaration and reporting the unordered free without it), and the
//! pool's used memory comes back to where it was. Runs on the emulator and on a real driver
//! (the bytes and the pool's memory everywhere; the call log and the hazard checker on the
//! emulator). The real PyTorch runs it in `pybind/tests/test_interop_torch.py` on a GPU host.

use std::ffi::c_void;

use custody_torch::{
    custody_torch_free, custody_torch_last_error, custody_torch_live_allocations,
    custody_torch_live_bytes, custody_torch_malloc, custody_torch_record_use,
};
use handles::PoolAttribute;
use handles::{
    ContextHandle, EventFlags, EventHandle, MemoryPoolHandle, StreamFlags, StreamHandle,
};
use memory::Buffer;
use test_support::*;

const SIZE: usize = 4096;

fn stream_on(n: i32) -> StreamHandle {
    StreamHandle::create(&primary(n), StreamFlags::DEFAULT, 0).expect("stream")
}

fn raw(stream: &StreamHandle) -> *mut c_void {
    stream.raw() as *mut c_void
}

/// Device 0's current pool's used bytes once the primary context's work is done (on a helper
/// thread, so the caller's context stays as it is).
fn device_used() -> u64 {
    on_fresh_thread(|| {
        let context = primary(0);
        context.make_current().expect("cuCtxSetCurrent");
        context.synchronize().expect("cuCtxSynchronize");
        let used = MemoryPoolHandle::device_current(0)
            .expect("device 0's pool")
            .attribute(PoolAttribute::USED_MEM_CURRENT)
            .expect("cuMemPoolGetAttribute");
        ContextHandle::clear_current().expect("cuCtxSetCurrent(NULL)");
        used
    })
}

/// A custody view of the block at `ptr` (frees nothing), for the stand-in's work on it.
fn view(ptr: *mut c_void) -> Buffer {
    // SAFETY: `ptr` is a live block of SIZE bytes from custody_torch_malloc, and the view is
    // dropped before the test frees the block.
    let handle = unsafe { handles::raw::borrowed(ptr as u64, SIZE) };
    Buffer::from_parts(handle, None)
}

fn last_error() -> String {
    let mut text = vec![0u8; 512];
    // SAFETY: `text` is writable for its length.
    let n = unsafe { custody_torch_last_error(text.as_mut_ptr().cast(), text.len()) };
    text.truncate(n);
    String::from_utf8(text).unwrap()
}

/// PyTorch's pattern: a block allocated on stream `a`, written on `a`, then read on `b` (after
/// `b` waited for `a`'s write); the free comes later, from another thread with no context.
struct Scene {
    a: StreamHandle,
    b: StreamHandle,
    ptr: *mut c_void,
    out: Buffer,
}

impl Scene {
    fn new() -> Scene {
        let (a, b) = (stream_on(0), stream_on(0));
        // SAFETY: `a` is a live created stream that outlives the block.
        let ptr = unsafe { custody_torch_malloc(SIZE, 0, raw(&a)) };
        assert!(!ptr.is_null(), "{}", last_error());
        let block = view(ptr);
        block.fill(0x5au8, &a).unwrap();
        let written = EventHandle::create(&primary(0), EventFlags::DISABLE_TIMING).unwrap();
        written.record(&a).unwrap();
        b.wait_event(&written).unwrap();
        let out = memory::DeviceMemoryResource::new(0)
            .unwrap()
            .allocate_on(SIZE, &b);
        block.copy_to(&out, &b).unwrap();
        Scene { a, b, ptr, out }
    }

    /// Frees the block on a fresh thread (no context current), as PyTorch's last reference
    /// going on another thread would.
    fn free_elsewhere(&self) {
        let ptr = self.ptr as usize;
        on_fresh_thread(move || {
            custody_torch_free(ptr as *mut c_void, SIZE, 0, std::ptr::null_mut())
        });
    }

    fn finish(self) -> Vec<u8> {
        let mut bytes = vec![0u8; SIZE];
        self.out.copy_to_host(&mut bytes, &self.b).unwrap();
        self.b.synchronize().unwrap();
        self.a.synchronize().unwrap();
        self.out.close().unwrap();
        bytes
    }
}

/// `allocate` with the stream `&b` for the test's own scratch buffer.
trait AllocateOn {
    fn allocate_on(self, size: usize, stream: &StreamHandle) -> Buffer;
}

impl AllocateOn for std::sync::Arc<memory::DeviceMemoryResource> {
    fn allocate_on(self, size: usize, stream: &StreamHandle) -> Buffer {
        use memory::MemoryResource;
        self.allocate(size, stream).expect("allocate")
    }
}

#[test]
fn a_block_is_freed_on_its_allocation_stream_after_a_declared_use() {
    let _serial = start();
    let base = device_used();
    let scene = Scene::new();
    let alloc = alloc_of(scene.ptr as u64);
    assert_eq!(custody_torch_live_allocations(), 1);
    assert_eq!(custody_torch_live_bytes(), SIZE);
    // SAFETY: `b` is a live created stream that outlives the block.
    assert_eq!(
        unsafe { custody_torch_record_use(scene.ptr, raw(&scene.b)) },
        0
    );
    let from = mark();
    scene.free_elsewhere();
    assert_eq!(custody_torch_live_allocations(), 0);
    assert_eq!(custody_torch_live_bytes(), 0);
    with_emulator(|emu| {
        let free = emu.only_call("cuMemFreeAsync", alloc, from);
        assert_eq!(
            free.stream,
            Some(scene.a.raw() as u64),
            "freed on a, its recipe"
        );
        assert_eq!(
            free.stream_context,
            Some(primary(0).raw() as u64),
            "a's context: no context made current for a created stream"
        );
        assert_eq!(
            emu.hazards_for(alloc),
            vec![],
            "ordered after the read on b"
        );
    });
    assert_eq!(scene.finish(), vec![0x5a; SIZE], "b read what a wrote");
    assert_eq!(device_used(), base, "freed");
    assert_no_hazards();
}

#[test]
fn without_the_declared_use_the_checker_reports_the_unordered_free() {
    let _serial = start();
    let Some(emu) = emulator_or_skip("hazard checker to see the unordered free") else {
        return;
    };
    let scene = Scene::new();
    let alloc = alloc_of(scene.ptr as u64);
    scene.free_elsewhere();
    let _ = scene.finish();
    let hazards = emu.hazards_for(alloc);
    assert!(
        hazards.iter().any(|h| h.kind == "unordered_free"),
        "{hazards:#?}"
    );
    emu.clear_hazards();
}

#[test]
fn the_default_stream_binds_the_allocating_threads_context() {
    let _serial = start();
    let base = device_used();
    let context = primary(0);
    context.make_current().unwrap();
    // SAFETY: 0 is the default-stream token.
    let ptr = unsafe { custody_torch_malloc(SIZE, 0, std::ptr::null_mut()) };
    assert!(!ptr.is_null(), "{}", last_error());
    let alloc = alloc_of(ptr as u64);
    view(ptr).fill(1u8, &StreamHandle::legacy()).unwrap();
    ContextHandle::clear_current().unwrap();
    let from = mark();
    let ptr = ptr as usize;
    on_fresh_thread(move || custody_torch_free(ptr as *mut c_void, SIZE, 0, std::ptr::null_mut()));
    with_emulator(|emu| {
        let free = emu.only_call("cuMemFreeAsync", alloc, from);
        assert_eq!(
            free.context,
            primary(0).raw() as u64,
            "the recorded context, made current on the freeing thread"
        );
    });
    assert_eq!(device_used(), base, "freed");
    assert_no_hazards();
}

#[test]
fn bad_input_is_refused_and_changes_nothing() {
    let _serial = start();
    let a = stream_on(0);
    // Zero bytes: no block, nothing to free.
    // SAFETY: `a` is a live created stream.
    assert!(unsafe { custody_torch_malloc(0, 0, raw(&a)) }.is_null());
    assert_eq!(custody_torch_live_allocations(), 0);
    // More than any allocation can be: null, and the reason is kept.
    // SAFETY: as above.
    assert!(unsafe { custody_torch_malloc(usize::MAX, 0, raw(&a)) }.is_null());
    assert!(
        last_error().contains("custody_torch_malloc"),
        "{}",
        last_error()
    );
    // A device that does not exist.
    // SAFETY: as above.
    assert!(unsafe { custody_torch_malloc(SIZE, 99, raw(&a)) }.is_null());
    assert!(last_error().contains("device 99"), "{}", last_error());
    assert_eq!(custody_torch_live_allocations(), 0);
    // record_use of an address that is no block: 1, nothing recorded.
    let mut local = 0u8;
    let not_a_block = (&mut local as *mut u8).cast::<c_void>();
    // SAFETY: `a` is a live created stream.
    assert_eq!(unsafe { custody_torch_record_use(not_a_block, raw(&a)) }, 1);
    // A free of an address that is no block, and of null, is ignored.
    custody_torch_free(not_a_block, 1, 0, std::ptr::null_mut());
    custody_torch_free(std::ptr::null_mut(), 0, 0, std::ptr::null_mut());
    // A block's use on another device's stream is refused with 2 (device memory).
    if second_device_or_skip_part("a stream of another device") {
        // SAFETY: as above.
        let ptr = unsafe { custody_torch_malloc(SIZE, 0, raw(&a)) };
        let other = stream_on(1);
        // SAFETY: `other` is a live created stream.
        assert_eq!(unsafe { custody_torch_record_use(ptr, raw(&other)) }, 2);
        assert!(
            last_error().contains("custody_torch_record_use"),
            "{}",
            last_error()
        );
        custody_torch_free(ptr, SIZE, 0, raw(&a));
    }
    a.synchronize().unwrap();
    assert_eq!(custody_torch_live_allocations(), 0);
    assert_no_hazards();
}
