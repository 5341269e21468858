//! Queries and small controls that NVIDIA's cuda.core reads beyond custody's own needs: device
//! attributes, UUIDs and PCI bus ids, stream priorities, event timing, pointer and address-range
//! queries, host memory registration, pools by location (the managed pool of no preferred
//! location), graph node queries and the device's graph memory attributes.
//!
//! Most of these entry points are not in custody's loader list; the cases resolve them by their
//! base name with `cuGetProcAddress_v2` for CUDA 13.0, as cuda.core does, which hands out the
//! newest form (`cuDeviceGetUuid` gives `cuDeviceGetUuid_v2`, `cuGraphNodeGetDependencies` the
//! `_v2` form with edge data).
//!
//! What each case asserts is marked where it is asserted: *measured* where NVIDIA's cuda.core 1.2
//! test suite, run on an H200 (driver 580.159.04, CUDA 13.0; its per-test outcomes are the
//! comparison column of `cargo xtask foreign-tests`), passed a test that depends on it (the test
//! is named); *documented* where only the CUDA driver API reference says so, for the GPU run of
//! this suite to settle.

use std::ffi::{c_int, c_uint, c_void, CStr};
use std::ptr;

use cuda_sys::types::{CUdeviceptr, CUevent, CUgraph, CUgraphNode, CUmemoryPool, CUstream};
use cuda_sys::{CUresult, CudaErrorCode};

use crate::driver::{
    driver, event_create, event_destroy, event_record, event_synchronize, get_proc_address,
    graph_add_empty_node, graph_create, graph_destroy, graph_exec_destroy, graph_instantiate,
    graph_launch, init, mem_alloc, mem_alloc_async, mem_alloc_managed, mem_free, mem_free_async,
    mem_pool_destroy, mem_pool_get_attribute, mem_pool_set_attribute, stream_begin_capture,
    stream_create, stream_create_with_priority, stream_destroy, stream_end_capture,
    stream_get_priority, stream_synchronize, Ret, EVENT_DISABLE_TIMING, MEM_ATTACH_GLOBAL,
    STREAM_NON_BLOCKING,
};
use crate::support::{device0, on_fresh_thread, primary_current, N};

/// An entry point beyond the loader's list, as `cuGetProcAddress_v2` hands out its base name
/// `name` for CUDA `version`; panics (failing the case) when the driver does not have it.
#[track_caller]
fn entry_point(name: &CStr, version: c_int) -> *mut c_void {
    let (pfn, status) = get_proc_address(name, version).check();
    assert!(
        !pfn.is_null() && status == 0,
        "cuGetProcAddress_v2({name:?}, {version}) gave {pfn:?}, symbol status {status}"
    );
    pfn
}

/// Casts the function pointer `cuGetProcAddress_v2` gave for `$name` (for CUDA 13.0, or the
/// version given) to its C signature.
macro_rules! resolve {
    ($name:literal as $ty:ty) => {
        resolve!($name @ 13000 as $ty)
    };
    ($name:literal @ $version:literal as $ty:ty) => {{
        let pfn = entry_point($name, $version);
        // SAFETY: the driver hands out `$name` under the signature the CUDA 13.0 headers give
        // it, which `$ty` restates.
        unsafe { std::mem::transmute::<*mut c_void, $ty>(pfn) }
    }};
}

/// Calls a resolved entry point and wraps its status.
macro_rules! status {
    ($name:literal, $call:expr) => {{
        // SAFETY: the arguments are valid locals and live handles of the calling case, as the
        // entry point's documentation asks.
        let status: CUresult = unsafe { $call };
        Ret::from_status($name, status)
    }};
}

fn device_attribute(attr: c_int) -> c_int {
    let f = driver()
        .cuDeviceGetAttribute()
        .unwrap_or_else(|e| panic!("{e}"));
    let mut value = -1;
    // SAFETY: a valid out-pointer and device 0.
    let status = unsafe {
        f(
            &mut value,
            std::mem::transmute::<u32, cuda_sys::types::CUdevice_attribute>(attr as u32),
            device0(),
        )
    };
    Ret::from_status("cuDeviceGetAttribute", status).check();
    value
}

/// Measured: cuda.core's managed-memory tests (`memory/test_managed_ops.py`) ran rather than
/// skipped, so memory pools and concurrent managed access are reported; its IPC tests
/// (`memory_ipc/`) ran, so POSIX file descriptors are among the pool handle types; and the
/// compute capability is 9.0 (an H200). Attribute numbers as in the CUDA 13.0 headers.
#[test]
fn device_attributes_cuda_core_reads() {
    on_fresh_thread("device-attributes", || {
        init();
        assert_eq!(device_attribute(75), 9, "COMPUTE_CAPABILITY_MAJOR");
        assert_eq!(device_attribute(76), 0, "COMPUTE_CAPABILITY_MINOR");
        assert_eq!(device_attribute(83), 1, "MANAGED_MEMORY");
        assert_eq!(device_attribute(89), 1, "CONCURRENT_MANAGED_ACCESS");
        assert_eq!(device_attribute(115), 1, "MEMORY_POOLS_SUPPORTED");
        assert_ne!(
            device_attribute(119) & 0x1,
            0,
            "MEMPOOL_SUPPORTED_HANDLE_TYPES has CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR"
        );
    });
}

type DeviceGetUuid = unsafe extern "C" fn(*mut [u8; 16], c_int) -> CUresult;

/// Measured (`test_device.py::test_uuid`): `cuDeviceGetUuid_v2` answers, and cuda.core's
/// `Device.uuid` is its 16 bytes. Documented: the UUID identifies the device, so two calls give
/// the same bytes, and it is not all zeros; without MIG the first form (`cuDeviceGetUuid` for
/// CUDA 11.0) gives the same bytes.
#[test]
fn device_uuid_is_stable_and_the_same_through_both_forms() {
    on_fresh_thread("device-uuid", || {
        init();
        let v2 = resolve!(c"cuDeviceGetUuid" as DeviceGetUuid);
        let v1 = resolve!(c"cuDeviceGetUuid" @ 11000 as DeviceGetUuid);
        let (mut a, mut b, mut c) = ([0u8; 16], [0u8; 16], [0u8; 16]);
        status!("cuDeviceGetUuid_v2", v2(&mut a, device0())).check();
        status!("cuDeviceGetUuid_v2", v2(&mut b, device0())).check();
        status!("cuDeviceGetUuid", v1(&mut c, device0())).check();
        assert_eq!(a, b);
        assert_eq!(a, c);
        assert_ne!(a, [0u8; 16]);
    });
}

type DeviceGetPciBusId = unsafe extern "C" fn(*mut std::ffi::c_char, c_int, c_int) -> CUresult;

/// Documented: `cuDeviceGetPCIBusId` writes `domain:bus:device.function` in hexadecimal and
/// needs room for 13 bytes with the NUL; the parts are the device's `PCI_DOMAIN_ID` (50),
/// `PCI_BUS_ID` (33) and `PCI_DEVICE_ID` (34) attributes. Not yet measured (cuda.core's
/// `test_device.py::test_pci_bus_id` compares with the runtime, which the H200 run had; a GPU
/// run of this suite settles the case and the letters' case).
#[test]
fn pci_bus_id_names_the_device_attributes() {
    on_fresh_thread("pci-bus-id", || {
        init();
        let get = resolve!(c"cuDeviceGetPCIBusId" as DeviceGetPciBusId);
        let mut text = [0 as std::ffi::c_char; 13];
        status!("cuDeviceGetPCIBusId", get(text.as_mut_ptr(), 13, device0())).check();
        // SAFETY: the driver wrote a NUL-terminated string into the 13 bytes.
        let id = unsafe { CStr::from_ptr(text.as_ptr()) }
            .to_str()
            .expect("ASCII")
            .to_owned();
        let hex =
            |part: &str| i32::from_str_radix(part, 16).unwrap_or_else(|e| panic!("{id}: {e}"));
        let (domain, rest) = id.split_once(':').expect("domain:");
        let (bus, rest) = rest.split_once(':').expect("bus:");
        let (device, function) = rest.split_once('.').expect("device.function");
        assert_eq!(domain.len(), 4, "{id}");
        assert_eq!(hex(domain), device_attribute(50), "PCI_DOMAIN_ID in {id}");
        assert_eq!(hex(bus), device_attribute(33), "PCI_BUS_ID in {id}");
        assert_eq!(hex(device), device_attribute(34), "PCI_DEVICE_ID in {id}");
        hex(function);
    });
}

type CtxGetStreamPriorityRange = unsafe extern "C" fn(*mut c_int, *mut c_int) -> CUresult;

/// Measured (`test_stream.py::test_stream_priority`): a stream created with priority 0 and one
/// with -1 report those priorities, and cuda.core refuses priority 1 as outside the range it
/// reads with `cuCtxGetStreamPriorityRange`: the least priority is 0, the greatest at most -1.
#[test]
fn stream_priority_range_and_priorities() {
    on_fresh_thread("stream-priorities", || {
        init();
        let _primary = primary_current();
        let range = resolve!(c"cuCtxGetStreamPriorityRange" as CtxGetStreamPriorityRange);
        let (mut least, mut greatest) = (i32::MIN, i32::MIN);
        status!(
            "cuCtxGetStreamPriorityRange",
            range(&mut least, &mut greatest)
        )
        .check();
        assert_eq!(least, 0);
        assert!(greatest <= -1, "greatest priority {greatest}");
        for priority in [0, -1] {
            let s = stream_create_with_priority(STREAM_NON_BLOCKING, priority).check();
            assert_eq!(stream_get_priority(s).check(), priority);
            stream_destroy(s).check();
        }
    });
}

type EventElapsedTime = unsafe extern "C" fn(*mut f32, CUevent, CUevent) -> CUresult;

/// Documented (`cuEventElapsedTime_v2`): the time from the first event to the second, in
/// milliseconds, so two records in stream order give a value >= 0 one way and <= 0 the other;
/// an event created with `CU_EVENT_DISABLE_TIMING` is refused with `CUDA_ERROR_INVALID_HANDLE`.
/// Only the sign is asserted (no durations). Measured: `test_event.py::test_timing_success`
/// relies on the `_v2` form answering (it needs a kernel, so the emulator does not run it).
#[test]
fn event_elapsed_time_sign_and_timing_disabled() {
    on_fresh_thread("event-elapsed", || {
        init();
        let _primary = primary_current();
        let elapsed = resolve!(c"cuEventElapsedTime" as EventElapsedTime);
        let s = stream_create(STREAM_NON_BLOCKING).check();
        let (start, end) = (event_create(0).check(), event_create(0).check());
        event_record(start, s).check();
        let p = mem_alloc_async(N, s).check();
        mem_free_async(p, s).check();
        event_record(end, s).check();
        event_synchronize(end).check();
        let (mut forward, mut backward) = (f32::NAN, f32::NAN);
        status!("cuEventElapsedTime_v2", elapsed(&mut forward, start, end)).check();
        status!("cuEventElapsedTime_v2", elapsed(&mut backward, end, start)).check();
        assert!(
            forward >= 0.0 && forward.is_finite(),
            "start -> end: {forward} ms"
        );
        assert!(
            backward <= 0.0 && backward.is_finite(),
            "end -> start: {backward} ms"
        );

        let untimed = event_create(EVENT_DISABLE_TIMING).check();
        event_record(untimed, s).check();
        event_synchronize(untimed).check();
        let mut ms = 0.0f32;
        status!("cuEventElapsedTime_v2", elapsed(&mut ms, start, untimed))
            .fails_with(CudaErrorCode::INVALID_HANDLE);
        for e in [start, end, untimed] {
            event_destroy(e).check();
        }
        stream_destroy(s).check();
    });
}

type MemGetAddressRange =
    unsafe extern "C" fn(*mut CUdeviceptr, *mut usize, CUdeviceptr) -> CUresult;
type PointerGetAttributes =
    unsafe extern "C" fn(c_uint, *const c_int, *mut *mut c_void, CUdeviceptr) -> CUresult;

/// Documented: `cuMemGetAddressRange_v2` of an address inside an allocation gives its base and
/// size; `cuPointerGetAttributes` reads several attributes at once (MEMORY_TYPE 2 = device,
/// DEVICE_ORDINAL, IS_MANAGED). Measured: cuda.core's `Buffer` properties read these for device
/// and managed buffers (`memory/test_managed_ops.py`, `test_object_protocols.py`).
#[test]
fn address_range_and_pointer_attributes() {
    on_fresh_thread("address-range", || {
        init();
        let _primary = primary_current();
        let range = resolve!(c"cuMemGetAddressRange" as MemGetAddressRange);
        let attributes = resolve!(c"cuPointerGetAttributes" as PointerGetAttributes);
        let p = mem_alloc(N).check();
        let (mut base, mut size) = (0, 0);
        status!(
            "cuMemGetAddressRange_v2",
            range(&mut base, &mut size, p + 4096)
        )
        .check();
        assert_eq!((base, size), (p, N));

        let managed = mem_alloc_managed(N, MEM_ATTACH_GLOBAL).check();
        // CU_POINTER_ATTRIBUTE_MEMORY_TYPE (2), _DEVICE_ORDINAL (9), _IS_MANAGED (8).
        let attrs: [c_int; 3] = [2, 9, 8];
        for (ptr, managed_expected) in [(p, 0u32), (managed, 1u32)] {
            let (mut kind, mut ordinal, mut is_managed) = (0u32, -1i32, 7u32);
            let mut slots: [*mut c_void; 3] = [
                (&mut kind as *mut u32).cast(),
                (&mut ordinal as *mut i32).cast(),
                (&mut is_managed as *mut u32).cast(),
            ];
            status!(
                "cuPointerGetAttributes",
                attributes(3, attrs.as_ptr(), slots.as_mut_ptr(), ptr)
            )
            .check();
            assert_eq!(ordinal, 0);
            assert_eq!(is_managed, managed_expected);
            if managed_expected == 0 {
                assert_eq!(kind, 2, "MEMORY_TYPE of cuMemAlloc memory is DEVICE");
            }
        }
        mem_free(managed).check();
        mem_free(p).check();
    });
}

type MemHostRegister = unsafe extern "C" fn(*mut c_void, usize, c_uint) -> CUresult;
type MemHostUnregister = unsafe extern "C" fn(*mut c_void) -> CUresult;

/// Documented: `cuMemHostRegister` page-locks the program's own bytes in the current context;
/// the driver then knows the range as host memory (`CU_POINTER_ATTRIBUTE_MEMORY_TYPE` host, the
/// context's device as `DEVICE_ORDINAL`, not managed); registering it again is
/// `CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED`; `cuMemHostUnregister` ends the registration (the
/// address is unknown again) and a second one is `CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED`. Not
/// yet measured: cuda.core's `test_memory.py::test_buffer_external_pinned_registered` relies on
/// it, but that file did not import in the H200 run; a GPU run of this suite settles it.
#[test]
fn host_register_makes_program_memory_known_until_unregistered() {
    on_fresh_thread("host-register", || {
        init();
        let _primary = primary_current();
        let register = resolve!(c"cuMemHostRegister" as MemHostRegister);
        let unregister = resolve!(c"cuMemHostUnregister" as MemHostUnregister);
        let layout = std::alloc::Layout::from_size_align(8192, 4096).expect("layout");
        // SAFETY: a non-zero size; freed below with the same layout.
        let bytes = unsafe { std::alloc::alloc_zeroed(layout) };
        assert!(!bytes.is_null());
        let p = bytes.cast::<c_void>();
        status!("cuMemHostRegister", register(p, 8192, 0)).check();
        let (kind, managed, ordinal, _) = crate::driver::pointer_get_attributes(p as u64).check();
        assert_eq!(
            kind,
            crate::driver::MEMORYTYPE_HOST,
            "registered memory is host memory"
        );
        assert_eq!((managed, ordinal), (0, 0));
        status!("cuMemHostRegister", register(p, 8192, 0))
            .fails_with(CudaErrorCode::HOST_MEMORY_ALREADY_REGISTERED);
        status!("cuMemHostUnregister", unregister(p)).check();
        crate::driver::pointer_memory_type(p as u64).fails_with(CudaErrorCode::INVALID_VALUE);
        status!("cuMemHostUnregister", unregister(p))
            .fails_with(CudaErrorCode::HOST_MEMORY_NOT_REGISTERED);
        // SAFETY: allocated above with this layout; no registration is left.
        unsafe { std::alloc::dealloc(bytes, layout) };
    });
}

/// Measured (`memory/test_managed_ops.py`, whose fixture makes a `ManagedMemoryResource()` with
/// no options): `cuMemGetMemPool` with location type `CU_MEM_LOCATION_TYPE_NONE` and allocation
/// type `CU_MEM_ALLOCATION_TYPE_MANAGED` gives a pool that allocates. Documented: that location
/// type is valid only with the managed allocation type (pinned: `CUDA_ERROR_INVALID_VALUE`), and
/// until `cuMemSetMemPool` the current pool is the default one.
#[test]
fn managed_pool_of_no_preferred_location() {
    type MemGetMemPool =
        unsafe extern "C" fn(*mut CUmemoryPool, *mut [c_int; 2], c_uint) -> CUresult;
    on_fresh_thread("managed-pool-none", || {
        init();
        let _primary = primary_current();
        let current = resolve!(c"cuMemGetMemPool" as MemGetMemPool);
        let default = resolve!(c"cuMemGetDefaultMemPool" as MemGetMemPool);
        // CUmemLocation {type: CU_MEM_LOCATION_TYPE_NONE (0), id}; MANAGED = 2, PINNED = 1.
        let mut none = [0, -1];
        let (mut pool, mut default_pool) = (ptr::null_mut(), ptr::null_mut());
        status!("cuMemGetMemPool", current(&mut pool, &mut none, 2)).check();
        status!(
            "cuMemGetDefaultMemPool",
            default(&mut default_pool, &mut none, 2)
        )
        .check();
        assert!(!pool.is_null());
        assert_eq!(pool, default_pool);
        let mut other = ptr::null_mut();
        status!("cuMemGetMemPool", current(&mut other, &mut none, 1))
            .fails_with(CudaErrorCode::INVALID_VALUE);

        let s = stream_create(STREAM_NON_BLOCKING).check();
        let p = crate::driver::mem_alloc_from_pool_async(N, pool, s).check();
        stream_synchronize(s).check();
        assert_ne!(p, 0);
        mem_free_async(p, s).check();
        stream_synchronize(s).check();
        stream_destroy(s).check();
    });
}

/// Measured: cuda.core reads a pool's release threshold and raises it to `u64::MAX` when it is 0
/// (every memory-resource test goes through that). Documented: a created pool's threshold is 0,
/// and `USED_MEM_CURRENT` counts an allocation's bytes while it lives.
#[test]
fn pool_release_threshold_and_used_memory() {
    use cuda_sys::types::MemPoolAttribute as A;
    on_fresh_thread("pool-attributes", || {
        init();
        let _primary = primary_current();
        let pool = crate::driver::mem_pool_create(0).check();
        assert_eq!(
            mem_pool_get_attribute(pool, A::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD).check(),
            0
        );
        mem_pool_set_attribute(pool, A::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, u64::MAX).check();
        assert_eq!(
            mem_pool_get_attribute(pool, A::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD).check(),
            u64::MAX
        );
        let s = stream_create(STREAM_NON_BLOCKING).check();
        let p = crate::driver::mem_alloc_from_pool_async(N, pool, s).check();
        stream_synchronize(s).check();
        assert!(
            mem_pool_get_attribute(pool, A::CU_MEMPOOL_ATTR_USED_MEM_CURRENT).check() >= N as u64
        );
        mem_free_async(p, s).check();
        stream_synchronize(s).check();
        assert_eq!(
            mem_pool_get_attribute(pool, A::CU_MEMPOOL_ATTR_USED_MEM_CURRENT).check(),
            0
        );
        stream_destroy(s).check();
        mem_pool_destroy(pool).check();
    });
}

type GraphGetNodes = unsafe extern "C" fn(CUgraph, *mut CUgraphNode, *mut usize) -> CUresult;
type NodeGetType = unsafe extern "C" fn(CUgraphNode, *mut c_uint) -> CUresult;
type NodeGetRelated =
    unsafe extern "C" fn(CUgraphNode, *mut CUgraphNode, *mut c_void, *mut usize) -> CUresult;
type GraphAddDependencies = unsafe extern "C" fn(
    CUgraph,
    *const CUgraphNode,
    *const CUgraphNode,
    *const c_void,
    usize,
) -> CUresult;

/// Documented: a graph's nodes, its roots (nodes with no dependency), a node's type, its
/// dependencies and dependents (the `_v2` forms, with NULL edge data). Measured: cuda.core's
/// graph definitions read these (`test_object_protocols.py`'s graph-node objects, on the H200).
#[test]
fn graph_node_queries() {
    on_fresh_thread("graph-queries", || {
        init();
        let _primary = primary_current();
        let get_nodes = resolve!(c"cuGraphGetNodes" as GraphGetNodes);
        let get_roots = resolve!(c"cuGraphGetRootNodes" as GraphGetNodes);
        let get_type = resolve!(c"cuGraphNodeGetType" as NodeGetType);
        let deps = resolve!(c"cuGraphNodeGetDependencies" as NodeGetRelated);
        let dependents = resolve!(c"cuGraphNodeGetDependentNodes" as NodeGetRelated);
        let add_deps = resolve!(c"cuGraphAddDependencies" as GraphAddDependencies);

        let graph = graph_create().check();
        let a = graph_add_empty_node(graph).check();
        let b = graph_add_empty_node(graph).check();
        status!(
            "cuGraphAddDependencies_v2",
            add_deps(graph, &a, &b, ptr::null(), 1)
        )
        .check();

        let mut count = 0usize;
        status!(
            "cuGraphGetNodes",
            get_nodes(graph, ptr::null_mut(), &mut count)
        )
        .check();
        assert_eq!(count, 2);
        let mut roots = [ptr::null_mut(); 2];
        let mut n = roots.len();
        status!(
            "cuGraphGetRootNodes",
            get_roots(graph, roots.as_mut_ptr(), &mut n)
        )
        .check();
        assert_eq!((n, roots[0]), (1, a));
        let mut kind = u32::MAX;
        status!("cuGraphNodeGetType", get_type(b, &mut kind)).check();
        assert_eq!(kind, 5, "CU_GRAPH_NODE_TYPE_EMPTY");

        let mut found = [ptr::null_mut(); 2];
        let mut n = found.len();
        status!(
            "cuGraphNodeGetDependencies_v2",
            deps(b, found.as_mut_ptr(), ptr::null_mut(), &mut n)
        )
        .check();
        assert_eq!((n, found[0]), (1, a));
        let mut n = found.len();
        status!(
            "cuGraphNodeGetDependentNodes_v2",
            dependents(a, found.as_mut_ptr(), ptr::null_mut(), &mut n)
        )
        .check();
        assert_eq!((n, found[0]), (1, b));
        graph_destroy(graph).check();
    });
}

type DeviceGraphMemAttribute = unsafe extern "C" fn(c_int, c_uint, *mut u64) -> CUresult;
type DeviceGraphMemTrim = unsafe extern "C" fn(c_int) -> CUresult;

/// Measured (`graph/test_graph_memory_resource.py::test_graph_mem_set_attributes`): after a
/// graph allocation (captured `cuMemAllocAsync`) has run and been freed with `cuMemFreeAsync`
/// outside the graph, the device's graph memory still shows used and reserved bytes, and after
/// `cuDeviceGraphMemTrim` the high watermarks are still above 0; the high watermarks can be
/// reset to 0. Documented: setting a watermark to anything but 0, or a current value at all, is
/// `CUDA_ERROR_INVALID_VALUE` (cuda.core refuses those itself, so the H200 was not asked).
#[test]
fn graph_memory_stays_until_trim() {
    on_fresh_thread("graph-memory", || {
        init();
        let _primary = primary_current();
        let get = resolve!(c"cuDeviceGetGraphMemAttribute" as DeviceGraphMemAttribute);
        let set = resolve!(c"cuDeviceSetGraphMemAttribute" as DeviceGraphMemAttribute);
        let trim = resolve!(c"cuDeviceGraphMemTrim" as DeviceGraphMemTrim);
        let read = |attr: c_uint| {
            let mut v = u64::MAX;
            status!("cuDeviceGetGraphMemAttribute", get(device0(), attr, &mut v)).check();
            v
        };
        // CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT 0, _USED_MEM_HIGH 1, _RESERVED_MEM_CURRENT 2,
        // _RESERVED_MEM_HIGH 3.
        let s: CUstream = stream_create(STREAM_NON_BLOCKING).check();
        stream_begin_capture(
            s,
            cuda_sys::types::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED,
        )
        .check();
        let p = mem_alloc_async(1024, s).check();
        let graph = stream_end_capture(s).check();
        let exec = graph_instantiate(graph).check();
        graph_launch(exec, s).check();
        stream_synchronize(s).check();
        for attr in 0..4 {
            assert!(
                read(attr) > 0,
                "graph memory attribute {attr} after the launch"
            );
        }
        mem_free_async(p, s).check();
        stream_synchronize(s).check();
        for attr in 0..4 {
            assert!(
                read(attr) > 0,
                "graph memory attribute {attr} after the free"
            );
        }
        graph_exec_destroy(exec).check();
        graph_destroy(graph).check();
        status!("cuDeviceGraphMemTrim", trim(device0())).check();
        assert!(
            read(1) > 0 && read(3) > 0,
            "the high watermarks outlive the trim"
        );
        let mut zero = 0u64;
        status!("cuDeviceSetGraphMemAttribute", set(device0(), 1, &mut zero)).check();
        status!("cuDeviceSetGraphMemAttribute", set(device0(), 3, &mut zero)).check();
        let mut one = 1u64;
        status!("cuDeviceSetGraphMemAttribute", set(device0(), 1, &mut one))
            .fails_with(CudaErrorCode::INVALID_VALUE);
        status!("cuDeviceSetGraphMemAttribute", set(device0(), 0, &mut zero))
            .fails_with(CudaErrorCode::INVALID_VALUE);
        stream_destroy(s).check();
    });
}

/// Measured on the H200 (`docs/driver-facts.md` F22: one NUMA node, the GPU's own NUMA id -1):
/// `CU_MEM_ADVISE_SET_PREFERRED_LOCATION` on `cuMemAllocManaged` memory reads back, through the
/// legacy attribute and the CUDA 12.2 type/id pair, as device 0 -> (0, DEVICE, 0), the host ->
/// (-1, HOST, -1), and host NUMA node 0 -> accepted but not kept: (-2, INVALID, -2).
#[test]
fn managed_preferred_location_reads_back_as_measured() {
    use crate::driver::{mem_advise, mem_range_attribute_i32};
    const SET_PREFERRED: u32 = 3; // CU_MEM_ADVISE_SET_PREFERRED_LOCATION
    on_fresh_thread("managed-preferred-location", || {
        // CU_MEM_RANGE_ATTRIBUTE_PREFERRED_LOCATION, ..._TYPE, ..._ID.
        let (legacy, kind, id) = (2, 5, 6);
        init();
        let _primary = primary_current();
        let bytes = 1 << 21;
        for (location, expected) in [
            ((1, 0), (0, 1, 0)),
            ((2, 0), (-1, 2, -1)),
            ((3, 0), (-2, 0, -2)),
        ] {
            let p = mem_alloc_managed(bytes, 1).check();
            mem_advise(p, bytes, SET_PREFERRED, location).check();
            let read = (
                mem_range_attribute_i32(p, bytes, legacy).check(),
                mem_range_attribute_i32(p, bytes, kind).check(),
                mem_range_attribute_i32(p, bytes, id).check(),
            );
            assert_eq!(read, expected, "preferred location {location:?}");
            mem_free(p).check();
        }
    });
}

/// Measured on the H200 (`docs/driver-facts.md` F23): `cuMemRangeGetAttribute` of managed memory
/// on a thread with no context current is `CUDA_ERROR_INVALID_CONTEXT` (custody's range queries
/// and advice make the memory's context current for it).
#[test]
fn managed_range_attribute_needs_a_current_context() {
    use crate::driver::{ctx_set_current, mem_range_attribute_i32};
    on_fresh_thread("managed-range-no-context", || {
        init();
        let primary = primary_current();
        let bytes = 1 << 16;
        let p = mem_alloc_managed(bytes, 1).check();
        ctx_set_current(std::ptr::null_mut()).check();
        // CU_MEM_RANGE_ATTRIBUTE_READ_MOSTLY.
        mem_range_attribute_i32(p, bytes, 1).fails_with(cuda_sys::CudaErrorCode::INVALID_CONTEXT);
        ctx_set_current(primary.ctx()).check();
        assert_eq!(mem_range_attribute_i32(p, bytes, 1).check(), 0);
        mem_free(p).check();
    });
}
