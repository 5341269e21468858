//! Graph memory and stream capture (docs/reference-notes.md section 5, "Graph memory resource
//! and capture", Rust side): a graph allocation needs a capturing stream, its recipe is the
//! capturing stream, closing it during the capture adds a free to the graph and after the
//! capture issues an ordinary `cuMemFreeAsync`; a pool resource refuses a capturing stream.
//! Runs on the emulator and on a real driver; which stream a free ran on, and that a refusal
//! allocated nothing, are read from the emulator's call log only.

mod common;

use std::sync::Arc;

use common::*;
use handles::sys_types::CUstreamCaptureMode;
use handles::GraphExecHandle;
use handles::{CaptureStatus, GraphInstantiateFlags};
use memory::{
    DeviceMemoryResource, GraphMemoryResource, MemoryError, MemoryResource, PoolMemoryResource,
};

const RELAXED: CUstreamCaptureMode = CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED;

/// On the emulator, asserts no allocation was attempted since `from`.
fn assert_no_alloc_calls(from: u64) {
    with_emulator(|emu| {
        let allocs: Vec<String> = emu
            .calls_since(from)
            .into_iter()
            .filter(|c| c.function.starts_with("cuMemAlloc"))
            .map(|c| c.function)
            .collect();
        assert!(allocs.is_empty(), "{allocs:?}");
    });
}

/// On the emulator, asserts allocation `alloc`'s one free since `from` ran on `stream` and
/// succeeded.
fn assert_freed_on(alloc: AllocationId, from: u64, stream: &handles::StreamHandle) {
    with_emulator(|emu| {
        let free = emu.only_call("cuMemFreeAsync", alloc, from);
        assert_eq!((free.stream, free.result), (Some(stream.raw() as u64), 0));
    });
}

/// On the emulator, asserts that the one `cuMemFreeAsync` of address `ptr` since `from` ran on
/// `stream` and succeeded: for a graph allocation freed inside its capture, which is no live
/// allocation yet (it has no identity until the graph runs), so only its address names it.
fn assert_capture_freed_on(ptr: u64, from: u64, stream: &handles::StreamHandle) {
    with_emulator(|emu| {
        let frees: Vec<_> = emu
            .calls_at(ptr, from)
            .into_iter()
            .filter(|c| c.function == "cuMemFreeAsync")
            .map(|c| (c.stream, c.result))
            .collect();
        assert_eq!(frees, [(Some(stream.raw() as u64), 0)]);
    });
}

#[test]
fn graph_allocation_needs_a_capturing_stream() {
    let _serial = start();
    let s = stream_on(0);
    let gmr = GraphMemoryResource::new(0).unwrap();
    let from = mark();
    assert_eq!(
        Arc::clone(&gmr).allocate(256, &s).unwrap_err(),
        MemoryError::NotCapturing
    );
    if second_device_or_skip_part("a stream of another device") {
        assert_eq!(
            gmr.allocate(256, &stream_on(1)).unwrap_err(),
            MemoryError::WrongDevice {
                expected: 0,
                found: 1
            }
        );
    }
    assert_no_alloc_calls(from);
}

/// A graph memory resource for a device that does not exist is refused when
/// made (it was accepted, to fail only at an allocation), as a device's pool resource is.
#[test]
fn graph_memory_resource_refuses_a_device_that_does_not_exist() {
    let _serial = start();
    let count = handles::device_count().unwrap();
    for missing in [count, 99] {
        let refused = GraphMemoryResource::new(missing).unwrap_err();
        assert_eq!(
            refused.code(),
            Some(handles::CudaErrorCode::INVALID_DEVICE),
            "{refused}"
        );
    }
    assert_eq!(GraphMemoryResource::new(0).unwrap().device_id(), Some(0));
}

#[test]
fn pool_resource_refuses_a_capturing_stream() {
    let _serial = start();
    let s = stream_on(0);
    let mr = DeviceMemoryResource::new(0).unwrap();
    let base = pool_used(mr.pool());
    handles::begin_capture(&s, RELAXED).unwrap();
    assert!(handles::capture_may_be_active());
    let from = mark();
    let refused = Arc::clone(&mr).allocate(256, &s).unwrap_err();
    let graph = handles::end_capture(&s).unwrap();
    assert_eq!(refused, MemoryError::StreamCapturing);
    assert_no_alloc_calls(from);
    drop(graph);
    assert_eq!(pool_used(mr.pool()), base, "nothing was allocated");
    // Capture over: allocation works again.
    let buffer = Arc::clone(&mr).allocate(256, &s).unwrap();
    assert!(pool_used(mr.pool()) >= base + 256);
    buffer.close().unwrap();
    assert_eq!(pool_used(mr.pool()), base, "freed");
}

#[test]
fn closing_during_capture_adds_the_free_to_the_graph() {
    let _serial = start();
    let s = stream_on(0);
    let gmr = GraphMemoryResource::new(0).unwrap();
    handles::begin_capture(&s, RELAXED).unwrap();
    let buffer = gmr.allocate(1024, &s).unwrap();
    let ptr = buffer.ptr();
    assert!(buffer.deallocation_stream().unwrap().ptr_eq(&s));
    buffer.fill(0x11u8, &s).unwrap();
    let from = mark();
    buffer.close().unwrap();
    assert_capture_freed_on(ptr, from, &s);
    assert_eq!(handles::capture_status(&s).unwrap(), CaptureStatus::Active);
    let graph = handles::end_capture(&s).unwrap();
    let exec = GraphExecHandle::instantiate(&graph, GraphInstantiateFlags::empty()).unwrap();
    exec.launch(&s).unwrap();
    s.synchronize().unwrap();
    drop(exec);
    drop(graph);
    assert_no_hazards();
}

#[test]
fn closing_after_capture_is_an_ordinary_free_on_the_capture_stream() {
    let _serial = start();
    let s = stream_on(0);
    let gmr = GraphMemoryResource::new(0).unwrap();
    handles::begin_capture(&s, RELAXED).unwrap();
    let buffer = gmr.allocate(1024, &s).unwrap();
    buffer.fill(0x22u8, &s).unwrap();
    let graph = handles::end_capture(&s).unwrap();
    assert_eq!(handles::capture_status(&s).unwrap(), CaptureStatus::None);
    let exec = GraphExecHandle::instantiate(&graph, GraphInstantiateFlags::empty()).unwrap();
    exec.launch(&s).unwrap();
    // The graph's allocation is live (an allocation with an identity) once the graph ran.
    let alloc = alloc_of(buffer.ptr());
    assert_eq!(
        read(&buffer, &s),
        vec![0x22; 1024],
        "the graph wrote the memory"
    );
    assert!(buffer.deallocation_stream().unwrap().ptr_eq(&s));
    let from = mark();
    buffer.close().unwrap();
    assert_freed_on(alloc, from, &s);
    s.synchronize().unwrap();
    drop(exec);
    drop(graph);
    assert_no_hazards();
}

#[test]
fn a_capture_stream_can_become_the_deallocation_stream() {
    let _serial = start();
    let (s, capturing) = (stream_on(0), stream_on(0));
    let mr = DeviceMemoryResource::new(0).unwrap();
    let base = pool_used(mr.pool());
    let buffer = Arc::clone(&mr).allocate(256, &s).unwrap();
    s.synchronize().unwrap();
    let alloc = alloc_of(buffer.ptr());
    handles::begin_capture(&capturing, RELAXED).unwrap();
    buffer.set_deallocation_stream(&capturing).unwrap();
    assert!(buffer.deallocation_stream().unwrap().ptr_eq(&capturing));
    let graph = handles::end_capture(&capturing).unwrap();
    drop(graph);
    assert!(pool_used(mr.pool()) >= base + 256);
    let from = mark();
    buffer.close().unwrap();
    assert_eq!(pool_used(mr.pool()), base, "freed after the capture ended");
    assert_freed_on(alloc, from, &capturing);
    assert_no_hazards();
}
