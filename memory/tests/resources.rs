//! The built-in memory resources against the emulated driver: owned pools and their lifetime,
//! pool limits, pinned pools, the synchronous resources whose drops never wait on the GPU
//! (BRIEF.md D9) while an explicit close does, adoption by a synchronous resource, managed
//! buffers, and explicit `deallocate` errors.

mod common;

use std::sync::Arc;

use common::*;
use handles::sys_types::MemPoolAttribute;
use handles::{CudaErrorCode, DevicePtrHandle, HandleError, StreamHandle};
use memory::{
    Buffer, DeviceMemoryResource, DeviceMemoryResourceOptions, LegacyPinnedMemoryResource,
    ManagedBuffer, ManagedMemoryResource, MemoryError, MemoryResource, Ownership,
    PinnedMemoryResource, PinnedMemoryResourceOptions, PoolMemoryResource,
    SynchronousMemoryResource,
};

const BLOCKING: [&str; 4] = [
    "cuStreamSynchronize",
    "cuEventSynchronize",
    "cuMemFree_v2",
    "cuMemFreeHost",
];

#[test]
fn owned_pool_outlives_its_resource_until_the_last_buffer_is_freed() {
    let _serial = start();
    let s = stream_on(0);
    let mr = DeviceMemoryResource::with_options(0, DeviceMemoryResourceOptions::default()).unwrap();
    assert!(mr.pool().is_owned());
    let buffer = Arc::clone(&mr).allocate(1000, &s).unwrap();
    s.synchronize().unwrap();
    let used = mr
        .pool()
        .attribute_u64(MemPoolAttribute::CU_MEMPOOL_ATTR_USED_MEM_CURRENT)
        .unwrap();
    assert!(used >= 1000, "{used}");
    let pool = mr.pool().clone();
    let from = mark();
    drop(mr);
    buffer.close().unwrap();
    s.synchronize().unwrap();
    assert_eq!(
        pool.attribute_u64(MemPoolAttribute::CU_MEMPOOL_ATTR_USED_MEM_CURRENT)
            .unwrap(),
        0
    );
    let destroys = || {
        emu()
            .calls()
            .iter()
            .filter(|c| c.seq >= from && c.function == "cuMemPoolDestroy")
            .count()
    };
    assert_eq!(destroys(), 0, "our clone still holds the pool");
    drop(pool);
    assert_eq!(destroys(), 1);
}

#[test]
fn max_size_limits_the_pool_and_a_refused_allocation_changes_nothing() {
    let _serial = start();
    let s = stream_on(0);
    let mr = DeviceMemoryResource::with_options(
        0,
        DeviceMemoryResourceOptions {
            // Drivers round a pool's limit up to their reservation granularity (an H200 gave
            // 4 MiB from a 2 MiB pool): 32 MiB is a whole number of granules everywhere known.
            max_size: 32 << 20,
            ipc_enabled: false,
        },
    )
    .unwrap();
    let error = Arc::clone(&mr).allocate(256 << 20, &s).unwrap_err();
    assert!(
        matches!(error, MemoryError::Handle(HandleError::Driver(ref e)) if e.call == "cuMemAllocFromPoolAsync"),
        "{error}"
    );
    let fits = Arc::clone(&mr).allocate(1 << 20, &s).unwrap();
    fits.close().unwrap();
    assert_no_hazards();
}

#[test]
fn pinned_pool_memory_is_usable_from_the_host_and_any_device() {
    let _serial = start();
    let (s0, s1) = (stream_on(0), stream_on(1));
    let mr = PinnedMemoryResource::new(PinnedMemoryResourceOptions::default()).unwrap();
    assert_eq!(mr.pool().device(), None);
    let on0 = Arc::clone(&mr).allocate(64, &s0).unwrap();
    let on1 = Arc::clone(&mr).allocate(64, &s1).unwrap();
    assert_eq!(on1.is_host_accessible(), Ok(true));
    assert_eq!(on1.is_device_accessible(), Ok(true));
    assert_eq!(on1.device_id(), Ok(None));
    on0.fill(9u8, &s0).unwrap();
    assert_eq!(read(&on0, &s0), vec![9; 64]);
    s0.synchronize().unwrap(); // ordering the fill before the copy is the caller's job
    on0.copy_to(&on1, &s1).unwrap();
    assert_eq!(read(&on1, &s1), vec![9; 64]);
    on0.close().unwrap();
    on1.close().unwrap();
}

/// What a dropping thread did, and who freed the memory afterwards.
fn drop_on_fresh_thread(buffer: Buffer, free_call: &'static str) {
    let ptr = buffer.ptr();
    let from = mark();
    let dropper = on_fresh_thread(move || {
        let me = tid();
        drop(buffer);
        me
    });
    let dropped: Vec<String> = emu()
        .calls()
        .into_iter()
        .filter(|c| c.thread == dropper && c.seq >= from)
        .map(|c| c.function)
        .collect();
    assert!(dropped.iter().any(|f| f == "cuEventRecord"), "{dropped:?}");
    for blocking in BLOCKING {
        assert!(
            !dropped.iter().any(|f| f == blocking),
            "the drop called {blocking}: {dropped:?}"
        );
    }
    handles::drain_deferred_cleanup();
    let free = only_call(free_call, ptr, from);
    assert_ne!(
        free.thread, dropper,
        "freed by the cleanup worker or a drain"
    );
    assert_eq!(free.result, 0);
    assert!(!is_live(ptr));
}

#[test]
fn synchronous_resources_never_block_a_drop() {
    let _serial = start();
    let s = stream_on(0);
    let from = mark();
    let sync = SynchronousMemoryResource::new(0)
        .unwrap()
        .allocate(256, &s)
        .unwrap();
    let pinned = LegacyPinnedMemoryResource::new().allocate(256, &s).unwrap();
    let managed = ManagedMemoryResource::new().allocate(256, &s).unwrap();
    let allocs: Vec<String> = emu()
        .calls()
        .into_iter()
        .filter(|c| c.seq >= from && c.function.starts_with("cuMemAlloc"))
        .map(|c| c.function)
        .collect();
    assert_eq!(
        allocs,
        ["cuMemAlloc_v2", "cuMemAllocHost_v2", "cuMemAllocManaged"]
    );
    assert_eq!(managed.is_managed(), Ok(true));
    drop_on_fresh_thread(sync, "cuMemFree_v2");
    drop_on_fresh_thread(pinned, "cuMemFreeHost");
    drop_on_fresh_thread(managed, "cuMemFree_v2");
    assert_no_hazards();
}

#[test]
fn explicit_close_of_synchronous_memory_waits_and_frees_before_returning() {
    let _serial = start();
    let s = stream_on(0);
    for mr in [
        SynchronousMemoryResource::new(0).unwrap() as Arc<dyn MemoryResource>,
        LegacyPinnedMemoryResource::new(),
        ManagedMemoryResource::new(),
    ] {
        let buffer = mr.allocate(128, &s).unwrap();
        let ptr = buffer.ptr();
        buffer.fill(1u8, &s).unwrap();
        let from = mark();
        buffer.close().unwrap();
        let here = calls_named_on("cuStreamSynchronize", tid(), from);
        assert_eq!(here.len(), 1, "{here:?}");
        assert!(!is_live(ptr), "freed before close returned");
    }
    assert_no_hazards();
}

#[test]
fn synchronous_resource_records_its_own_bound_legacy_stream_for_tokens() {
    let _serial = start();
    let a = primary(0);
    let mr = SynchronousMemoryResource::new(0).unwrap();
    // A thread with no context, and the per-thread token: allocation needs neither.
    let buffer = on_fresh_thread(move || mr.allocate(64, &StreamHandle::per_thread()).unwrap());
    let recorded = buffer.deallocation_stream().unwrap().unwrap();
    assert_eq!(
        recorded.raw() as usize,
        0x1,
        "the legacy stream, not the per-thread one"
    );
    assert_eq!(recorded.context(), Some(&a));
    let ptr = buffer.ptr();
    let warnings_before = handles::cleanup_warning_count();
    on_fresh_thread(move || drop(buffer));
    handles::drain_deferred_cleanup();
    assert_eq!(
        handles::cleanup_warning_count(),
        warnings_before,
        "no per-thread warning"
    );
    assert!(!is_live(ptr));
}

#[test]
fn memory_adopted_by_a_synchronous_resource_gets_its_non_blocking_rule() {
    let _serial = start();
    let s = stream_on(0);
    // Allocated elsewhere: handles whose memory is given up unreleased.
    let host = DevicePtrHandle::alloc_host(256, &s).unwrap();
    let device = DevicePtrHandle::alloc(256, &s).unwrap();
    let (host_ptr, device_ptr) = (host.ptr(), device.ptr());
    std::mem::forget(host);
    std::mem::forget(device);
    let pinned = Buffer::from_handle(
        host_ptr,
        256,
        Ownership::MemoryResource(LegacyPinnedMemoryResource::new()),
        Some(&s),
    )
    .unwrap();
    assert_eq!(
        pinned.handle().unwrap().kind(),
        handles::ReleaseKind::PinnedHost
    );
    let sync = Buffer::from_handle(
        device_ptr,
        256,
        Ownership::MemoryResource(SynchronousMemoryResource::new(0).unwrap()),
        Some(&s),
    )
    .unwrap();
    assert_eq!(
        sync.handle().unwrap().kind(),
        handles::ReleaseKind::Synchronous
    );
    assert_eq!(sync.handle().unwrap().device(), Some(0));
    drop_on_fresh_thread(pinned, "cuMemFreeHost");
    drop_on_fresh_thread(sync, "cuMemFree_v2");
}

#[test]
fn managed_buffers() {
    let _serial = start();
    let s = stream_on(0);
    let mr = ManagedMemoryResource::new();
    let buffer = mr.allocate_managed(64, &s).unwrap();
    assert_eq!(buffer.is_managed(), Ok(true));
    assert_eq!(buffer.is_host_accessible(), Ok(true));
    assert_eq!(buffer.is_device_accessible(), Ok(true));
    buffer.fill(0x0102_0304u32, &stream_on(1)).unwrap(); // any device's stream
    s.synchronize().unwrap();
    let ptr = buffer.ptr();
    let from = mark();
    let view = ManagedBuffer::from_handle(ptr, 64, Ownership::Borrowed, None).unwrap();
    assert_eq!(view.is_managed(), Ok(true));
    assert_eq!(
        count_calls("cuPointerGetAttribute", ptr, from),
        0,
        "the caller vouched"
    );
    assert_eq!(read(&view, &s), 0x0102_0304u32.to_ne_bytes().repeat(16));
    view.into_buffer().close().unwrap();
    assert!(is_live(ptr), "a view frees nothing");
    buffer.into_buffer().close().unwrap();
    assert!(!is_live(ptr));
}

#[test]
fn explicit_deallocate_returns_the_driver_error() {
    let _serial = start();
    let s = stream_on(0);
    let mr = DeviceMemoryResource::new(0).unwrap();
    let ptr = foreign_allocation(0, 256, &s);
    mr.deallocate(ptr, 256, &s).unwrap();
    assert!(!is_live(ptr));
    let error = mr.deallocate(ptr, 256, &s).unwrap_err();
    assert_eq!(error.code(), Some(CudaErrorCode::INVALID_VALUE));
    emu().clear_hazards(); // the double free above was deliberate
}
