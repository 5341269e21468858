//! Measures what custody adds to a stream-ordered allocation and free: raw
//! `cuMemAllocFromPoolAsync` + `cuMemFreeAsync` pairs against `DevicePtrHandle::alloc_from_pool`
//! and drop (created stream and legacy token), single thread, 256 bytes, device 0's default
//! pool. Then checks, on whatever driver is loaded, that a legacy-token buffer dropped on a thread with
//! no context is freed with no cleanup error and leaves that thread with no context.
//!
//! Run: `cargo run --release -p handles --example pool_pair_cost` (a real driver), or with
//! `CUSTODY_CUDA_DRIVER` pointing at the emulator. Prints one line per measurement.

use std::time::Instant;

use handles::sys_types::{CUdeviceptr, MemPoolAttribute};
use handles::{
    cleanup_error_count, ContextHandle, DevicePtrHandle, MemoryPoolHandle, StreamHandle,
};

const PAIRS: usize = 100_000;
const REPEATS: usize = 5;

fn best_ns_per_pair(mut run: impl FnMut()) -> f64 {
    (0..REPEATS)
        .map(|_| {
            let start = Instant::now();
            run();
            start.elapsed().as_nanos() as f64 / PAIRS as f64
        })
        .fold(f64::INFINITY, f64::min)
}

fn main() {
    let d = cuda_sys::driver().expect("a CUDA driver");
    println!("driver: {} (version {})", d.path(), d.version());
    let a = ContextHandle::primary(0).expect("device 0");
    a.make_current().unwrap();
    let stream = StreamHandle::create(&a, 0, 0).unwrap();
    let pool = MemoryPoolHandle::device_default(0).unwrap();
    let (raw_pool, raw_stream) = (pool.raw(), stream.raw());

    let raw = best_ns_per_pair(|| {
        for _ in 0..PAIRS {
            let mut ptr: CUdeviceptr = 0;
            // SAFETY: valid out-pointer; pool and stream are alive; a context is current.
            let status =
                unsafe { (d.cuMemAllocFromPoolAsync)(&mut ptr, 256, raw_pool, raw_stream) };
            assert_eq!(status, 0);
            // SAFETY: `ptr` was just allocated and is freed once.
            let status = unsafe { (d.cuMemFreeAsync)(ptr, raw_stream) };
            assert_eq!(status, 0);
        }
    });
    stream.synchronize().unwrap();
    let created = best_ns_per_pair(|| {
        for _ in 0..PAIRS {
            drop(DevicePtrHandle::alloc_from_pool(256, &pool, &stream).unwrap());
        }
    });
    stream.synchronize().unwrap();
    let legacy_stream = StreamHandle::legacy();
    let legacy = best_ns_per_pair(|| {
        for _ in 0..PAIRS {
            drop(DevicePtrHandle::alloc_from_pool(256, &pool, &legacy_stream).unwrap());
        }
    });
    legacy_stream.synchronize().unwrap();
    println!("raw alloc+free pair:               {raw:8.1} ns");
    println!(
        "custody, created stream:           {created:8.1} ns ({:.3}x raw)",
        created / raw
    );
    println!(
        "custody, legacy token:             {legacy:8.1} ns ({:.3}x raw)",
        legacy / raw
    );

    // Cross-thread drop with no context on the dropping thread, on this driver.
    let errors_before = cleanup_error_count();
    let buffer = DevicePtrHandle::alloc_from_pool(1 << 20, &pool, &legacy_stream).unwrap();
    ContextHandle::clear_current().unwrap();
    let after = std::thread::spawn(move || {
        drop(buffer);
        ContextHandle::current().unwrap().map(|c| c.raw() as usize)
    })
    .join()
    .unwrap();
    a.make_current().unwrap();
    StreamHandle::legacy().synchronize().unwrap();
    let used = pool
        .attribute_u64(MemPoolAttribute::CU_MEMPOOL_ATTR_USED_MEM_CURRENT)
        .unwrap();
    println!(
        "cross-thread legacy drop: cleanup errors {}, dropping thread context afterwards {:?}, pool used bytes {used}",
        cleanup_error_count() - errors_before,
        after
    );
    assert_eq!(cleanup_error_count(), errors_before);
    assert_eq!(after, None);
}
