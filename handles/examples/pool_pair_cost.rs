//! Measures what custody adds to a stream-ordered allocation and free: raw
//! `cuMemAllocFromPoolAsync` + `cuMemFreeAsync` pairs against `DevicePtrHandle::alloc_from_pool`
//! and drop (created stream and legacy token), single thread, 256 bytes, device 0's default
//! pool. Then checks, on whatever driver is loaded, that a legacy-token buffer dropped on a thread with
//! no context is freed with no cleanup error and leaves that thread with no context.
//!
//! Run: `cargo run --release -p cuda-custody-handles --example pool_pair_cost` (a real driver), or with
//! `CUSTODY_CUDA_DRIVER` pointing at the emulator. Prints one line per measurement.

use std::time::Instant;

use handles::sys_types::CUdeviceptr;
use handles::PoolAttribute;
use handles::{
    cleanup_error_count, ContextHandle, DevicePtrHandle, MemoryPoolHandle, StreamFlags,
    StreamHandle,
};

const PAIRS: usize = 50_000;
const ROUNDS: usize = 9;

fn ns_per_pair(run: &mut dyn FnMut()) -> f64 {
    let start = Instant::now();
    run();
    start.elapsed().as_nanos() as f64 / PAIRS as f64
}

fn main() {
    let d = cuda_sys::driver().expect("a CUDA driver");
    println!("driver: {} (version {})", d.path(), d.version());
    let a = ContextHandle::primary(0).expect("device 0");
    a.make_current().unwrap();
    let stream = StreamHandle::create(&a, StreamFlags::DEFAULT, 0).unwrap();
    let pool = MemoryPoolHandle::device_default(0).unwrap();
    let (raw_pool, raw_stream) = (pool.raw(), stream.raw());

    let mut raw_run = || {
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
    };
    let mut raw_checked_run = || {
        for _ in 0..PAIRS {
            let mut ctx = std::ptr::null_mut();
            // SAFETY: valid out-pointer.
            let status = unsafe { (d.cuCtxGetCurrent)(&mut ctx) };
            assert_eq!(status, 0);
            let mut ptr: CUdeviceptr = 0;
            // SAFETY: valid out-pointer; pool and stream are alive; a context is current.
            let status =
                unsafe { (d.cuMemAllocFromPoolAsync)(&mut ptr, 256, raw_pool, raw_stream) };
            assert_eq!(status, 0);
            // SAFETY: valid out-pointer.
            let status = unsafe { (d.cuCtxGetCurrent)(&mut ctx) };
            assert_eq!(status, 0);
            // SAFETY: `ptr` was just allocated and is freed once.
            let status = unsafe { (d.cuMemFreeAsync)(ptr, raw_stream) };
            assert_eq!(status, 0);
        }
    };
    let legacy_raw = handles::sys_types::CU_STREAM_LEGACY;
    let mut raw_legacy_run = || {
        for _ in 0..PAIRS {
            let mut ctx = std::ptr::null_mut();
            // SAFETY: valid out-pointer.
            let status = unsafe { (d.cuCtxGetCurrent)(&mut ctx) };
            assert_eq!(status, 0);
            let mut ptr: CUdeviceptr = 0;
            // SAFETY: valid out-pointer; the pool is alive; a context is current for the token.
            let status =
                unsafe { (d.cuMemAllocFromPoolAsync)(&mut ptr, 256, raw_pool, legacy_raw) };
            assert_eq!(status, 0);
            // SAFETY: valid out-pointer.
            let status = unsafe { (d.cuCtxGetCurrent)(&mut ctx) };
            assert_eq!(status, 0);
            // SAFETY: `ptr` was just allocated and is freed once.
            let status = unsafe { (d.cuMemFreeAsync)(ptr, legacy_raw) };
            assert_eq!(status, 0);
        }
    };
    let mut get_current_run = || {
        for _ in 0..PAIRS {
            let mut ctx = std::ptr::null_mut();
            // SAFETY: valid out-pointer.
            let status = unsafe { (d.cuCtxGetCurrent)(&mut ctx) };
            assert_eq!(status, 0);
        }
    };
    let mut created_run = || {
        for _ in 0..PAIRS {
            drop(DevicePtrHandle::alloc_from_pool(256, &pool, &stream).unwrap());
        }
    };
    let legacy_stream = StreamHandle::legacy();
    let mut legacy_run = || {
        for _ in 0..PAIRS {
            drop(DevicePtrHandle::alloc_from_pool(256, &pool, &legacy_stream).unwrap());
        }
    };
    // Interleaved rounds, best of each: drift in the machine affects every variant alike.
    let mut best = [f64::INFINITY; 6];
    for _ in 0..ROUNDS {
        let runs: [&mut dyn FnMut(); 6] = [
            &mut raw_run,
            &mut raw_checked_run,
            &mut raw_legacy_run,
            &mut get_current_run,
            &mut created_run,
            &mut legacy_run,
        ];
        for (slot, run) in best.iter_mut().zip(runs) {
            *slot = slot.min(ns_per_pair(run));
            stream.synchronize().unwrap();
            StreamHandle::legacy().synchronize().unwrap();
        }
    }
    let [raw, raw_checked, raw_legacy, get_current, created, legacy] = best;
    println!("raw alloc+free pair:               {raw:8.1} ns");
    println!(
        "raw pair + 2 cuCtxGetCurrent:      {raw_checked:8.1} ns ({:.3}x raw)",
        raw_checked / raw
    );
    println!(
        "raw legacy pair + 2 cuCtxGetCurrent: {raw_legacy:6.1} ns ({:.3}x raw)",
        raw_legacy / raw
    );
    println!("one cuCtxGetCurrent:               {get_current:8.1} ns");
    println!(
        "custody, created stream:           {created:8.1} ns ({:.3}x raw)",
        created / raw
    );
    println!(
        "custody, legacy token:             {legacy:8.1} ns ({:.3}x raw legacy)",
        legacy / raw_legacy
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
    let used = pool.attribute(PoolAttribute::USED_MEM_CURRENT).unwrap();
    println!(
        "cross-thread legacy drop: cleanup errors {}, dropping thread context afterwards {:?}, pool used bytes {used}",
        cleanup_error_count() - errors_before,
        after
    );
    assert_eq!(cleanup_error_count(), errors_before);
    assert_eq!(after, None);
}
