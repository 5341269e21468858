//! GPU-only checks of the memory crate against a real driver (the `gpu` feature, turned on by
//! the GPU bundle): every resource allocates, fills, copies, reads back and frees; the driver's
//! pointer attributes agree with what each resource claims; graph memory under capture; the
//! stream hand-off; adoption failure leaves the pointer usable; a drop on a thread without a
//! context frees. What only the emulator can observe (call log, hazards) is in the other files.

#![cfg(feature = "gpu")]

mod adopt;

use std::sync::Arc;

use adopt::Ownership;
use handles::sys_types::CUstreamCaptureMode;
use handles::CaptureStatus;
use handles::{
    ContextHandle, EventFlags, EventHandle, GraphExecHandle, GraphInstantiateFlags, HandleError,
    StreamFlags, StreamHandle,
};
use memory::{
    Buffer, DeviceMemoryResource, DeviceMemoryResourceOptions, GraphMemoryResource,
    LegacyPinnedMemoryResource, ManagedMemoryResource, MemoryError, MemoryResource,
    PinnedMemoryResource, PinnedMemoryResourceOptions, PoolMemoryResource,
    SynchronousMemoryResource,
};

fn stream() -> StreamHandle {
    StreamHandle::create(
        &ContextHandle::primary(0).expect("device 0"),
        StreamFlags::DEFAULT,
        0,
    )
    .expect("stream")
}

fn read(buffer: &Buffer, stream: &StreamHandle) -> Vec<u8> {
    let mut bytes = vec![0u8; buffer.size()];
    buffer
        .copy_to_host(&mut bytes, stream)
        .expect("copy to host");
    bytes
}

fn resources() -> Vec<(&'static str, Arc<dyn MemoryResource>)> {
    vec![
        ("device current pool", DeviceMemoryResource::new(0).unwrap()),
        (
            "device owned pool",
            DeviceMemoryResource::with_options(0, DeviceMemoryResourceOptions::default()).unwrap(),
        ),
        (
            "pinned pool",
            PinnedMemoryResource::new(PinnedMemoryResourceOptions::default()).unwrap(),
        ),
        ("legacy pinned", LegacyPinnedMemoryResource::new()),
        ("managed", ManagedMemoryResource::new()),
        ("synchronous", SynchronousMemoryResource::new(0).unwrap()),
    ]
}

#[test]
fn every_resource_allocates_fills_copies_and_frees() {
    let s = stream();
    for (name, mr) in resources() {
        let a = Arc::clone(&mr)
            .allocate_owned(4096, &s)
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let b = Arc::clone(&mr).allocate_owned(4096, &s).unwrap();
        a.fill(0xdead_beefu32, &s).unwrap();
        a.copy_to(&b, &s).unwrap();
        assert_eq!(
            read(&b, &s),
            0xdead_beefu32.to_ne_bytes().repeat(1024),
            "{name}"
        );
        // What the driver says about the pointer agrees with the resource.
        let view = adopt::from_handle(a.ptr(), 4096, Ownership::Borrowed, None).unwrap();
        assert_eq!(
            view.is_device_accessible().unwrap(),
            mr.is_device_accessible(),
            "{name}"
        );
        assert_eq!(
            view.is_host_accessible().unwrap(),
            mr.is_host_accessible(),
            "{name}"
        );
        assert_eq!(view.is_managed().unwrap(), mr.is_managed(), "{name}");
        if let Some(device) = mr.device_id() {
            assert_eq!(view.device_id().unwrap(), Some(device), "{name}");
        }
        a.close().unwrap_or_else(|e| panic!("{name}: {e}"));
        b.close().unwrap();
    }
    s.synchronize().unwrap();
}

#[test]
fn pool_memory_returns_to_the_pool_when_dropped_on_a_thread_without_a_context() {
    let s = stream();
    let mr = DeviceMemoryResource::with_options(0, DeviceMemoryResourceOptions::default()).unwrap();
    let used = |mr: &DeviceMemoryResource| {
        mr.pool()
            .attribute(handles::PoolAttribute::USED_MEM_CURRENT)
            .unwrap()
    };
    let buffer = mr.allocate(1 << 20, &s).unwrap();
    assert!(used(&mr) >= 1 << 20);
    std::thread::spawn(move || drop(buffer)).join().unwrap();
    s.synchronize().unwrap();
    assert_eq!(used(&mr), 0);
}

#[test]
fn graph_memory_under_capture() {
    let s = stream();
    let gmr = GraphMemoryResource::new(0).unwrap();
    assert_eq!(
        gmr.allocate(4096, &s).unwrap_err(),
        MemoryError::NotCapturing
    );
    handles::begin_capture(&s, CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED).unwrap();
    assert_eq!(handles::capture_status(&s).unwrap(), CaptureStatus::Active);
    let refused = DeviceMemoryResource::new(0)
        .unwrap()
        .allocate(4096, &s)
        .unwrap_err();
    let buffer = gmr.allocate(4096, &s).unwrap();
    buffer.fill(0x42u8, &s).unwrap();
    let graph = handles::end_capture(&s).unwrap();
    assert_eq!(refused, MemoryError::StreamCapturing);
    let exec = GraphExecHandle::instantiate(&graph, GraphInstantiateFlags::empty()).unwrap();
    exec.launch(&s).unwrap();
    assert_eq!(read(&buffer, &s), vec![0x42; 4096]);
    buffer.close().unwrap();
    s.synchronize().unwrap();
}

#[test]
fn stream_hand_off() {
    let a = ContextHandle::primary(0).unwrap();
    let (producer, consumer) = (stream(), stream());
    let mr = DeviceMemoryResource::new(0).unwrap();
    let buffer = mr.allocate(1 << 20, &producer).unwrap();
    let out = mr.allocate(1 << 20, &consumer).unwrap();
    buffer.fill(0x77u8, &producer).unwrap();
    let event = EventHandle::create(&a, EventFlags::DISABLE_TIMING).unwrap();
    event.record(&producer).unwrap();
    consumer.wait_event(&event).unwrap();
    buffer.set_deallocation_stream(&consumer).unwrap();
    buffer.copy_to(&out, &consumer).unwrap();
    buffer.close().unwrap();
    assert_eq!(read(&out, &consumer), vec![0x77; 1 << 20]);
    out.close().unwrap();
}

#[test]
fn adoption_failure_leaves_the_pointer_usable_by_the_caller() {
    let s = stream();
    let mr = DeviceMemoryResource::new(0).unwrap();
    let owned = mr.allocate(4096, &s).unwrap();
    let handle = owned.handle().clone();
    let ptr = handle.ptr();
    // Stand-in for memory allocated elsewhere: this handle is given up unreleased.
    std::mem::forget(handle);
    drop(owned); // the forgotten reference keeps it allocated
    s.synchronize().unwrap();
    let for_thread: Arc<dyn MemoryResource> = mr.clone();
    let error = std::thread::spawn(move || {
        adopt::from_handle(ptr, 4096, Ownership::MemoryResource(for_thread), None).unwrap_err()
    })
    .join()
    .unwrap();
    assert_eq!(error, MemoryError::Handle(HandleError::NoCurrentContext));
    let view = adopt::from_handle(ptr, 4096, Ownership::Borrowed, None).unwrap();
    view.fill(5u8, &s).unwrap();
    assert_eq!(
        read(&view, &s),
        vec![5; 4096],
        "still the caller's, still allocated"
    );
    drop(view);
    // SAFETY: the memory was given up above and nothing else frees it.
    let allocation = unsafe { handles::raw::owned_allocation(ptr, 4096) };
    mr.deallocate(allocation, &s).unwrap();
    s.synchronize().unwrap();
}
