//! What `docs/driver-probe/probe.c` measured on an NVIDIA H200 (driver 580.159.04, CUDA 13.0),
//! one case per fact of `docs/driver-probe/h200-580.159.04.txt` that no other module checks.
//!
//! Lines the probe printed from inside a `FORK(...)` block are not facts (CUDA does not survive
//! `fork()`) and have no case here; neither do facts the `basics_*` and `facts_*` modules
//! already check. Where a probe fact came out of a sequence of calls, its case replays the
//! probe's sequence up to that call, asserting every measured result on the way. Anything a
//! case asserts that the probe did not print is marked *documented* or *not measured* where it
//! is asserted. Re-measure on any other driver: several of these (the pool's 32 MiB
//! reservation, a `maxSize` that does not limit a 4 MiB allocation, G4's exceptions; fact IDs are
//! those of `docs/driver-facts.md`) are the driver's choices, not documented rules.

use std::ffi::c_void;
use std::sync::Arc;

use cuda_sys::types::{
    CUcontext, CUgraph, CUmemPool_attribute, CUmemoryPool, CUstream, CUstreamCaptureMode,
    CUDA_MEMSET_NODE_PARAMS, CU_STREAM_LEGACY, CU_STREAM_NULL,
};
use cuda_sys::CudaErrorCode;

use crate::driver::{
    ctx_destroy, ctx_get_current, ctx_pop_current, ctx_push_current, ctx_set_current, device_get,
    device_get_count, device_get_default_mem_pool, driver, driver_get_version, event_create,
    event_destroy, event_synchronize, get_proc_address, graph_add_memset_node, graph_clone,
    graph_create, graph_destroy, graph_retain_user_object_move, init, launch_host_func, mem_alloc,
    mem_alloc_async, mem_alloc_from_pool_async, mem_alloc_host, mem_alloc_managed, mem_free,
    mem_free_async, mem_free_host, mem_pool_create, mem_pool_create_raw, mem_pool_destroy,
    mem_pool_get_attribute, memcpy, memcpy_dtoh, memset_d16, memset_d32, memset_d8,
    memset_d8_async, pointer_device_ordinal, pointer_memory_type, pointer_mempool,
    pointer_range_size, primary_ctx_get_state, primary_ctx_release, stream_begin_capture,
    stream_create, stream_create_with_priority, stream_destroy, stream_end_capture,
    stream_get_flags, stream_get_priority, stream_query, stream_synchronize, user_object_create,
    user_object_create_with_flags, user_object_release, RawPoolProps, Ret, LOCATION_TYPE_DEVICE,
    LOCATION_TYPE_HOST, MEM_ATTACH_GLOBAL, STREAM_NON_BLOCKING,
};
use crate::support::{
    device0, on_fresh_thread, primary_current, reserved, used, Primary, Probe, Shared,
};

const MIB: u64 = 1 << 20;

// ---------------------------------------------------------------------------------------------
// Devices and contexts

#[test]
fn measured_device_get_ordinal_99_is_invalid_device() {
    on_fresh_thread("device-99", || {
        init();
        device_get(99).fails_with(CudaErrorCode::INVALID_DEVICE);
    });
}

/// The probe read the primary context's state before anything retained it. Every case releases
/// what it retains, so the primary context is inactive at the start of a case.
#[test]
fn measured_primary_ctx_state_before_retain_is_inactive_with_flags_0() {
    on_fresh_thread("primary-state-before", || {
        init();
        let (flags, active) = primary_ctx_get_state(device0()).check();
        assert_eq!(active, 0, "nothing has retained the primary context yet");
        assert_eq!(flags, 0);
    });
}

#[test]
fn measured_primary_ctx_release_at_refcount_0_is_invalid_context() {
    on_fresh_thread("primary-release-unretained", || {
        init();
        let (_, active) = primary_ctx_get_state(device0()).check();
        assert_eq!(
            active, 0,
            "precondition: nothing holds the primary context (a release would drop its reference)"
        );
        primary_ctx_release(device0()).fails_with(CudaErrorCode::INVALID_CONTEXT);
        let (_, active) = primary_ctx_get_state(device0()).check();
        assert_eq!(active, 0);
    });
}

#[test]
fn measured_ctx_destroy_of_primary_is_invalid_context() {
    on_fresh_thread("destroy-primary", || {
        init();
        let primary = Primary::retain();
        ctx_destroy(primary.ctx()).fails_with(CudaErrorCode::INVALID_CONTEXT);
        // The primary context is still usable.
        ctx_set_current(primary.ctx()).check();
        assert_eq!(ctx_get_current().check(), primary.ctx());
        assert_eq!(ctx_pop_current().check(), primary.ctx());
    });
}

#[test]
fn measured_ctx_push_current_null_is_invalid_value() {
    on_fresh_thread("push-null", || {
        init();
        ctx_push_current(std::ptr::null_mut()).fails_with(CudaErrorCode::INVALID_VALUE);
        assert!(ctx_get_current().check().is_null(), "nothing was pushed");
    });
}

#[test]
fn measured_ctx_pop_current_null_out_on_empty_stack_is_invalid_context() {
    on_fresh_thread("pop-null-out", || {
        let d = init();
        // SAFETY: a NULL out-pointer is the input under test; the driver does not write it.
        let status = unsafe { (d.cuCtxPopCurrent_v2)(std::ptr::null_mut()) };
        Ret::from_status("cuCtxPopCurrent_v2", status).fails_with(CudaErrorCode::INVALID_CONTEXT);
    });
}

#[test]
fn measured_default_mem_pool_without_context_succeeds() {
    init();
    // Retained on the test thread (retaining binds no context), current on no thread.
    let _primary = Primary::retain();
    on_fresh_thread("default-pool-no-context", || {
        init();
        assert!(!device_get_default_mem_pool(device0()).check().is_null());
        assert!(ctx_get_current().check().is_null());
    });
}

#[test]
fn measured_mem_alloc_async_null_token_without_context_is_invalid_context() {
    init();
    // Retained on the test thread (retaining binds no context), current on no thread.
    let _primary = Primary::retain();
    on_fresh_thread("alloc-async-no-context", || {
        init();
        mem_alloc_async(64, CU_STREAM_NULL).fails_with(CudaErrorCode::INVALID_CONTEXT);
    });
}

// ---------------------------------------------------------------------------------------------
// Streams and events

/// Stream priorities clamp to the device's range: [-5, 0] on an H200.
#[test]
fn measured_stream_priority_below_range_clamps_to_greatest() {
    on_fresh_thread("priority-low", || {
        init();
        let _primary = primary_current();
        let s = stream_create_with_priority(0, -10).check();
        assert_eq!(stream_get_priority(s).check(), -5);
        stream_destroy(s).check();
    });
}

#[test]
fn measured_stream_priority_above_range_clamps_to_least() {
    on_fresh_thread("priority-high", || {
        init();
        let _primary = primary_current();
        let s = stream_create_with_priority(0, 5).check();
        assert_eq!(stream_get_priority(s).check(), 0);
        stream_destroy(s).check();
    });
}

#[test]
fn measured_stream_create_flags_7_is_invalid_value() {
    on_fresh_thread("stream-flags-7", || {
        init();
        let _primary = primary_current();
        stream_create(7).fails_with(CudaErrorCode::INVALID_VALUE);
    });
}

#[test]
fn measured_stream_get_flags_of_legacy_token_is_0() {
    on_fresh_thread("legacy-flags", || {
        init();
        let _primary = primary_current();
        assert_eq!(stream_get_flags(CU_STREAM_LEGACY).check(), 0);
    });
}

#[test]
fn measured_stream_get_priority_of_null_token_is_0() {
    on_fresh_thread("null-priority", || {
        init();
        let _primary = primary_current();
        assert_eq!(stream_get_priority(CU_STREAM_NULL).check(), 0);
    });
}

#[test]
fn measured_stream_destroy_of_legacy_token_is_invalid_handle() {
    on_fresh_thread("destroy-legacy", || {
        init();
        let _primary = primary_current();
        stream_destroy(CU_STREAM_LEGACY).fails_with(CudaErrorCode::INVALID_HANDLE);
        stream_synchronize(CU_STREAM_LEGACY).check(); // still there
    });
}

#[test]
fn measured_stream_destroy_of_null_is_invalid_handle() {
    on_fresh_thread("destroy-null", || {
        init();
        let _primary = primary_current();
        stream_destroy(CU_STREAM_NULL).fails_with(CudaErrorCode::INVALID_HANDLE);
        stream_synchronize(CU_STREAM_NULL).check(); // still there
    });
}

#[test]
fn measured_event_synchronize_of_never_recorded_event_succeeds() {
    on_fresh_thread("event-sync-unrecorded", || {
        init();
        let _primary = primary_current();
        let e = event_create(0).check();
        event_synchronize(e).check();
        event_destroy(e).check();
    });
}

#[test]
fn measured_event_create_flags_0xff_is_invalid_value() {
    on_fresh_thread("event-flags-ff", || {
        init();
        let _primary = primary_current();
        event_create(0xff).fails_with(CudaErrorCode::INVALID_VALUE);
    });
}

// ---------------------------------------------------------------------------------------------
// Synchronous allocation and freeing

#[test]
fn measured_mem_alloc_of_1_pib_is_out_of_memory() {
    on_fresh_thread("alloc-huge", || {
        init();
        let _primary = primary_current();
        mem_alloc(1 << 50).fails_with(CudaErrorCode::OUT_OF_MEMORY);
    });
}

#[test]
fn measured_mem_free_of_0_succeeds() {
    on_fresh_thread("free-0", || {
        init();
        let _primary = primary_current();
        mem_free(0).check();
    });
}

#[test]
fn measured_mem_free_of_interior_pointer_is_invalid_value() {
    on_fresh_thread("free-interior", || {
        init();
        let _primary = primary_current();
        let p = mem_alloc(256).check();
        mem_free(p + 16).fails_with(CudaErrorCode::INVALID_VALUE);
        mem_free(p).check();
    });
}

#[test]
fn measured_mem_free_twice_is_invalid_value() {
    on_fresh_thread("free-twice", || {
        init();
        let _primary = primary_current();
        let p = mem_alloc(256).check();
        mem_free(p).check();
        mem_free(p).fails_with(CudaErrorCode::INVALID_VALUE);
    });
}

#[test]
fn measured_mem_alloc_host_of_0_bytes_succeeds() {
    on_fresh_thread("alloc-host-0", || {
        init();
        let _primary = primary_current();
        let h = mem_alloc_host(0).check();
        if !h.is_null() {
            // Not measured: whatever cuMemAllocHost handed out, cuMemFreeHost takes back.
            mem_free_host(h).check();
        }
    });
}

#[test]
fn measured_mem_free_host_of_heap_pointer_is_invalid_value() {
    on_fresh_thread("free-host-malloc", || {
        init();
        let _primary = primary_current();
        let heap = Box::new([0u8; 16]);
        mem_free_host(heap.as_ptr().cast_mut().cast()).fails_with(CudaErrorCode::INVALID_VALUE);
        drop(heap);
    });
}

#[test]
fn measured_mem_free_host_of_null_succeeds() {
    on_fresh_thread("free-host-null", || {
        init();
        let _primary = primary_current();
        mem_free_host(std::ptr::null_mut()).check();
    });
}

#[test]
fn measured_mem_alloc_managed_with_flags_0_is_invalid_value() {
    on_fresh_thread("managed-flags-0", || {
        init();
        let _primary = primary_current();
        mem_alloc_managed(64, 0).fails_with(CudaErrorCode::INVALID_VALUE);
    });
}

#[test]
fn measured_mem_alloc_managed_global_succeeds() {
    on_fresh_thread("managed-global", || {
        init();
        let _primary = primary_current();
        let p = mem_alloc_managed(64, MEM_ATTACH_GLOBAL).check();
        assert_ne!(p, 0);
        mem_free(p).check(); // documented (the probe did not print this status)
    });
}

// ---------------------------------------------------------------------------------------------
// Stream-ordered allocation and freeing

#[test]
fn measured_mem_alloc_async_of_0_bytes_succeeds() {
    on_fresh_thread("alloc-async-0", || {
        init();
        let _primary = primary_current();
        let s = stream_create(0).check();
        let p = mem_alloc_async(0, s).check();
        // Not measured: what it handed out is freed (cuMemFreeAsync of NULL succeeds, as
        // measured; any other pointer is an allocation like any other).
        mem_free_async(p, s).check();
        stream_synchronize(s).check();
        stream_destroy(s).check();
    });
}

#[test]
fn measured_mem_alloc_from_pool_async_of_0_bytes_succeeds() {
    on_fresh_thread("alloc-pool-0", || {
        init();
        let _primary = primary_current();
        let pool = mem_pool_create(device0()).check();
        let s = stream_create(0).check();
        let p = mem_alloc_from_pool_async(0, pool, s).check();
        // Not measured: what it handed out is freed (cuMemFreeAsync of NULL succeeds, as
        // measured; any other pointer is an allocation like any other).
        mem_free_async(p, s).check();
        stream_synchronize(s).check();
        stream_destroy(s).check();
        mem_pool_destroy(pool).check();
    });
}

#[test]
fn measured_mem_free_async_of_0_succeeds() {
    on_fresh_thread("free-async-0", || {
        init();
        let _primary = primary_current();
        let s = stream_create(0).check();
        mem_free_async(0, s).check();
        stream_synchronize(s).check();
        stream_destroy(s).check();
    });
}

#[test]
fn measured_mem_free_async_of_never_allocated_address_is_invalid_value() {
    on_fresh_thread("free-async-unknown", || {
        init();
        let _primary = primary_current();
        let s = stream_create(0).check();
        mem_free_async(0x1000, s).fails_with(CudaErrorCode::INVALID_VALUE);
        stream_destroy(s).check();
    });
}

#[test]
fn measured_mem_free_async_twice_on_one_stream_is_invalid_value() {
    on_fresh_thread("free-async-twice", || {
        init();
        let _primary = primary_current();
        let s = stream_create(0).check();
        let p = mem_alloc_async(64, s).check();
        mem_free_async(p, s).check();
        mem_free_async(p, s).fails_with(CudaErrorCode::INVALID_VALUE);
        stream_synchronize(s).check();
        stream_destroy(s).check();
    });
}

#[test]
fn measured_mem_free_async_again_after_synchronize_is_invalid_value() {
    on_fresh_thread("free-async-after-sync", || {
        init();
        let _primary = primary_current();
        let s = stream_create(0).check();
        let p = mem_alloc_async(64, s).check();
        mem_free_async(p, s).check();
        mem_free_async(p, s).fails_with(CudaErrorCode::INVALID_VALUE);
        stream_synchronize(s).check();
        mem_free_async(p, s).fails_with(CudaErrorCode::INVALID_VALUE);
        stream_destroy(s).check();
    });
}

#[test]
fn measured_mem_free_async_of_mem_alloc_memory_succeeds() {
    on_fresh_thread("free-async-mem-alloc", || {
        init();
        let _primary = primary_current();
        let s = stream_create(0).check();
        let p = mem_alloc(256).check();
        mem_free_async(p, s).check();
        stream_synchronize(s).check();
        stream_destroy(s).check();
    });
}

// ---------------------------------------------------------------------------------------------
// Fills and copies

#[test]
fn measured_memset_d8_past_the_end_is_invalid_value() {
    on_fresh_thread("memset-past-end", || {
        init();
        let _primary = primary_current();
        let p = mem_alloc(256).check();
        memset_d8(p, 1, 512).fails_with(CudaErrorCode::INVALID_VALUE);
        mem_free(p).check();
    });
}

#[test]
fn measured_memset_d32_unaligned_is_invalid_value() {
    on_fresh_thread("memset-d32-unaligned", || {
        init();
        let _primary = primary_current();
        let p = mem_alloc(256).check();
        memset_d32(p + 1, 1, 4).fails_with(CudaErrorCode::INVALID_VALUE);
        mem_free(p).check();
    });
}

#[test]
fn measured_memset_d16_unaligned_is_invalid_value() {
    on_fresh_thread("memset-d16-unaligned", || {
        init();
        let _primary = primary_current();
        let p = mem_alloc(256).check();
        memset_d16(p + 1, 1, 4).fails_with(CudaErrorCode::INVALID_VALUE);
        mem_free(p).check();
    });
}

#[test]
fn measured_memset_d8_of_0_bytes_succeeds() {
    on_fresh_thread("memset-0", || {
        init();
        let _primary = primary_current();
        let p = mem_alloc(256).check();
        memset_d8(p, 1, 0).check();
        mem_free(p).check();
    });
}

#[test]
fn measured_memcpy_dtoh_past_the_end_is_invalid_value() {
    on_fresh_thread("dtoh-past-end", || {
        init();
        let _primary = primary_current();
        let p = mem_alloc(256).check();
        memcpy_dtoh(p, 512).fails_with(CudaErrorCode::INVALID_VALUE);
        mem_free(p).check();
    });
}

#[test]
fn measured_memcpy_of_0_bytes_succeeds() {
    on_fresh_thread("memcpy-0", || {
        init();
        let _primary = primary_current();
        let p = mem_alloc(256).check();
        memcpy(p, p, 0).check();
        mem_free(p).check();
    });
}

// ---------------------------------------------------------------------------------------------
// Pointer attributes

#[test]
fn measured_pointer_memory_type_of_stack_address_is_invalid_value() {
    on_fresh_thread("pointer-stack-type", || {
        init();
        let _primary = primary_current();
        let local = [0u8; 512];
        pointer_memory_type(local.as_ptr() as u64).fails_with(CudaErrorCode::INVALID_VALUE);
    });
}

#[test]
fn measured_pointer_device_ordinal_of_stack_address_is_invalid_value() {
    on_fresh_thread("pointer-stack-ordinal", || {
        init();
        let _primary = primary_current();
        let local = [0u8; 512];
        pointer_device_ordinal(local.as_ptr() as u64).fails_with(CudaErrorCode::INVALID_VALUE);
    });
}

#[test]
fn measured_pointer_range_size_of_interior_pointer_is_the_allocation_size() {
    on_fresh_thread("pointer-range-size", || {
        init();
        let _primary = primary_current();
        let p = mem_alloc(256).check();
        assert_eq!(pointer_range_size(p + 8).check(), 256);
        mem_free(p).check();
    });
}

#[test]
fn measured_pointer_mempool_of_mem_alloc_memory_is_null() {
    on_fresh_thread("pointer-mempool-null", || {
        init();
        let _primary = primary_current();
        let p = mem_alloc(256).check();
        assert!(pointer_mempool(p).check().is_null());
        mem_free(p).check();
    });
}

// ---------------------------------------------------------------------------------------------
// Memory pools

#[test]
fn measured_mem_pool_destroy_of_default_pool_is_invalid_value() {
    on_fresh_thread("destroy-default-pool", || {
        init();
        let _primary = primary_current();
        let default = device_get_default_mem_pool(device0()).check();
        mem_pool_destroy(default).fails_with(CudaErrorCode::INVALID_VALUE);
        assert_eq!(device_get_default_mem_pool(device0()).check(), default);
    });
}

#[test]
fn measured_mem_pool_destroy_with_live_allocation_succeeds() {
    on_fresh_thread("destroy-pool-live", || {
        init();
        let _primary = primary_current();
        let pool = mem_pool_create(device0()).check();
        let s = stream_create(0).check();
        let p = mem_alloc_from_pool_async(1000, pool, s).check();
        stream_synchronize(s).check();
        mem_pool_destroy(pool).check();
        // Documented, not measured (the probe's attempt ran in a forked child, which proves
        // nothing): the allocation outlives the destroyed pool and is freed as usual.
        mem_free_async(p, s).check();
        stream_synchronize(s).check();
        stream_destroy(s).check();
    });
}

/// A pool's reservation granule for small allocations on an H200 with driver 580.159.04.
const POOL_CHUNK: u64 = 32 * MIB;

/// `CU_MEMPOOL_ATTR_*` of `pool`, read as the probe read them.
fn pool_attr(pool: CUmemoryPool, attr: CUmemPool_attribute) -> u64 {
    mem_pool_get_attribute(pool, attr).check()
}

#[test]
fn measured_pool_reserves_32_mib_for_a_1000_byte_allocation() {
    on_fresh_thread("pool-1000", || {
        init();
        let _primary = primary_current();
        let pool = mem_pool_create(device0()).check();
        let s = stream_create(0).check();
        let p = mem_alloc_from_pool_async(1000, pool, s).check();
        stream_synchronize(s).check();
        assert_eq!(used(pool), 1000);
        assert_eq!(reserved(pool), POOL_CHUNK);
        mem_free_async(p, s).check();
        stream_synchronize(s).check();
        stream_destroy(s).check();
        mem_pool_destroy(pool).check();
    });
}

/// What the probe read from a new pool (default release threshold) around a 1000-byte
/// allocation freed at once: after the free, before and after synchronizing.
struct FreeCycle {
    after_free: (u64, u64),
    after_sync: (u64, u64),
    used_high: u64,
    release_threshold: u64,
}

fn pool_free_cycle() -> FreeCycle {
    let pool = mem_pool_create(device0()).check();
    let s = stream_create(0).check();
    let p = mem_alloc_from_pool_async(1000, pool, s).check();
    mem_free_async(p, s).check();
    let after_free = (used(pool), reserved(pool));
    stream_synchronize(s).check();
    let after_sync = (used(pool), reserved(pool));
    let used_high = pool_attr(pool, CUmemPool_attribute::CU_MEMPOOL_ATTR_USED_MEM_HIGH);
    let release_threshold = pool_attr(pool, CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD);
    stream_destroy(s).check();
    mem_pool_destroy(pool).check();
    FreeCycle {
        after_free,
        after_sync,
        used_high,
        release_threshold,
    }
}

#[test]
fn measured_pool_free_without_synchronize_keeps_the_reservation() {
    on_fresh_thread("pool-free-no-sync", || {
        init();
        let _primary = primary_current();
        assert_eq!(pool_free_cycle().after_free, (0, POOL_CHUNK));
    });
}

#[test]
fn measured_pool_free_and_synchronize_with_threshold_0_releases_everything() {
    on_fresh_thread("pool-free-sync", || {
        init();
        let _primary = primary_current();
        assert_eq!(pool_free_cycle().after_sync, (0, 0));
    });
}

#[test]
fn measured_pool_used_high_keeps_the_peak_after_free() {
    on_fresh_thread("pool-used-high", || {
        init();
        let _primary = primary_current();
        assert_eq!(pool_free_cycle().used_high, 1000);
    });
}

#[test]
fn measured_pool_release_threshold_defaults_to_0() {
    on_fresh_thread("pool-threshold", || {
        init();
        let _primary = primary_current();
        assert_eq!(pool_free_cycle().release_threshold, 0);
    });
}

#[test]
fn measured_pool_with_max_size_2_mib_gives_a_4_mib_allocation() {
    on_fresh_thread("pool-max-size", || {
        init();
        let _primary = primary_current();
        let mut props = RawPoolProps::new(LOCATION_TYPE_DEVICE, device0());
        props.max_size = 2 << 20;
        let pool = mem_pool_create_raw(&props).check();
        let s = stream_create(0).check();
        let p = mem_alloc_from_pool_async(4 << 20, pool, s).check();
        mem_free_async(p, s).check();
        stream_synchronize(s).check();
        stream_destroy(s).check();
        mem_pool_destroy(pool).check();
    });
}

#[test]
fn measured_host_located_pool_create_succeeds() {
    on_fresh_thread("pool-host", || {
        init();
        let _primary = primary_current();
        let pool = mem_pool_create_raw(&RawPoolProps::new(LOCATION_TYPE_HOST, 0)).check();
        assert!(!pool.is_null());
        mem_pool_destroy(pool).check();
    });
}

#[test]
fn measured_pool_create_on_device_7_is_invalid_value() {
    on_fresh_thread("pool-device-7", || {
        init();
        let _primary = primary_current();
        // Device 7 did not exist on the one-GPU host; past the last device here too.
        let ordinal = device_get_count().check().max(7);
        mem_pool_create_raw(&RawPoolProps::new(LOCATION_TYPE_DEVICE, ordinal))
            .fails_with(CudaErrorCode::INVALID_VALUE);
    });
}

// ---------------------------------------------------------------------------------------------
// G4: driver calls from a host function

/// Runs `call` (driver calls returning a status and a value) inside a host function on a new
/// stream of the current context and returns what it got.
fn inside_host_function<T: Send + 'static>(
    call: impl FnOnce() -> (CudaErrorCode, T) + Send + 'static,
) -> (CudaErrorCode, T) {
    let s = stream_create(STREAM_NON_BLOCKING).check();
    let slot = Arc::new(std::sync::Mutex::new(None));
    let probe = Probe::new();
    let (host_slot, host_probe) = (Arc::clone(&slot), Arc::clone(&probe));
    launch_host_func(s, move || {
        let result = call();
        *host_slot.lock().unwrap() = Some(result);
        host_probe.mark("called");
    })
    .check();
    stream_synchronize(s).check();
    stream_destroy(s).check();
    assert!(probe.find("called").is_some(), "the host function ran");
    let result = slot.lock().unwrap().take();
    result.expect("the host function recorded its result")
}

#[test]
fn measured_driver_get_version_inside_host_function_succeeds() {
    on_fresh_thread("g4-host-version", || {
        init();
        let _primary = primary_current();
        let (code, version) = inside_host_function(|| {
            let ret = driver_get_version();
            (ret.code, ret.code.is_success().then(|| ret.check()))
        });
        assert_eq!(code, CudaErrorCode::SUCCESS);
        assert_eq!(version, Some(driver_get_version().check()));
    });
}

#[test]
fn measured_stream_query_inside_host_function_is_not_permitted() {
    on_fresh_thread("g4-host-query", || {
        init();
        let _primary = primary_current();
        let (code, ()) = inside_host_function(|| (stream_query(CU_STREAM_LEGACY).code, ()));
        assert_eq!(code, CudaErrorCode::NOT_PERMITTED);
    });
}

#[test]
fn measured_event_create_inside_host_function_is_not_permitted() {
    on_fresh_thread("g4-host-event", || {
        init();
        let _primary = primary_current();
        let (code, event) = inside_host_function(|| {
            let ret = event_create(0);
            let code = ret.code;
            (code, code.is_success().then(|| Shared(ret.check())))
        });
        if let Some(event) = event {
            // A driver that allowed it leaks nothing.
            event_destroy(event.get()).check();
        }
        assert_eq!(code, CudaErrorCode::NOT_PERMITTED);
    });
}

#[test]
fn measured_ctx_set_current_inside_host_function_is_not_permitted() {
    on_fresh_thread("g4-host-set-current", || {
        init();
        let primary = primary_current();
        let ctx = Shared(primary.ctx());
        let (code, ()) = inside_host_function(move || (ctx_set_current(ctx.get()).code, ()));
        assert_eq!(code, CudaErrorCode::NOT_PERMITTED);
    });
}

// ---------------------------------------------------------------------------------------------
// User objects

#[test]
fn measured_user_object_create_with_flags_0_is_invalid_value() {
    on_fresh_thread("user-object-flags-0", || {
        init();
        let _primary = primary_current();
        let probe = Probe::new();
        let destructor_probe = Arc::clone(&probe);
        user_object_create_with_flags(0, move || destructor_probe.mark("destructor"))
            .fails_with(CudaErrorCode::INVALID_VALUE);
        assert!(probe.find("destructor").is_none());
    });
}

#[test]
fn measured_user_object_release_of_last_reference_runs_destructor_inside_it() {
    on_fresh_thread("user-object-release", || {
        init();
        let _primary = primary_current();
        let probe = Probe::new();
        let destructor_probe = Arc::clone(&probe);
        let object = user_object_create(move || destructor_probe.mark("destructor")).check();
        probe.mark("release_called");
        user_object_release(object, 1).check();
        probe.mark("release_returned");
        assert_eq!(
            probe.labels(),
            ["release_called", "destructor", "release_returned"]
        );
        let destructor = probe.find("destructor").expect("destructor mark");
        assert_eq!(destructor.thread, std::thread::current().id());
    });
}

/// Runs `call` inside the destructor of a user object whose last reference the case releases
/// with `cuUserObjectRelease` (so it runs on the calling thread, inside the release).
fn status_inside_release_destructor(
    call: impl FnOnce() -> CudaErrorCode + Send + 'static,
) -> CudaErrorCode {
    let probe = Probe::new();
    let destructor_probe = Arc::clone(&probe);
    let object =
        user_object_create(move || destructor_probe.mark_code("destructor", call())).check();
    user_object_release(object, 1).check();
    let mark = probe
        .find("destructor")
        .expect("the destructor ran inside cuUserObjectRelease");
    mark.code.expect("the destructor recorded a status")
}

#[test]
fn measured_ctx_get_current_inside_release_destructor_is_not_permitted() {
    on_fresh_thread("g4-release-get-current", || {
        init();
        let _primary = primary_current();
        let code = status_inside_release_destructor(|| ctx_get_current().code);
        assert_eq!(code, CudaErrorCode::NOT_PERMITTED);
    });
}

#[test]
fn measured_mem_alloc_inside_release_destructor_is_not_permitted() {
    on_fresh_thread("g4-release-alloc", || {
        init();
        let _primary = primary_current();
        let code = status_inside_release_destructor(|| {
            let ret = mem_alloc(64);
            let code = ret.code;
            if code.is_success() {
                let _ = mem_free(ret.check());
            }
            code
        });
        assert_eq!(code, CudaErrorCode::NOT_PERMITTED);
    });
}

#[test]
fn measured_mem_free_async_inside_release_destructor_is_not_permitted() {
    on_fresh_thread("g4-release-free-async", || {
        init();
        let _primary = primary_current();
        let code = status_inside_release_destructor(|| mem_free_async(0, CU_STREAM_NULL).code);
        assert_eq!(code, CudaErrorCode::NOT_PERMITTED);
    });
}

/// A graph owning a user object (moved in), and a clone of it; returns both.
fn graph_and_clone_with_user_object(probe: &Arc<Probe>) -> (CUgraph, CUgraph) {
    let destructor_probe = Arc::clone(probe);
    let graph = graph_create().check();
    let object = user_object_create(move || destructor_probe.mark("destructor")).check();
    graph_retain_user_object_move(graph, object).check();
    let clone = graph_clone(graph).check();
    (graph, clone)
}

#[test]
fn measured_user_object_outlives_original_graph_while_a_clone_holds_it() {
    on_fresh_thread("clone-holds", || {
        init();
        let _primary = primary_current();
        let probe = Probe::new();
        let (graph, clone) = graph_and_clone_with_user_object(&probe);
        graph_destroy(graph).check();
        assert!(probe.find("destructor").is_none());
        graph_destroy(clone).check();
    });
}

#[test]
fn measured_destroying_the_last_clone_runs_the_destructor_inside_it() {
    on_fresh_thread("clone-destroy", || {
        init();
        let _primary = primary_current();
        let probe = Probe::new();
        let (graph, clone) = graph_and_clone_with_user_object(&probe);
        graph_destroy(graph).check();
        probe.mark("destroy_called");
        graph_destroy(clone).check();
        probe.mark("destroy_returned");
        assert_eq!(
            probe.labels(),
            ["destroy_called", "destructor", "destroy_returned"]
        );
        let destructor = probe.find("destructor").expect("destructor mark");
        assert_eq!(destructor.thread, std::thread::current().id());
    });
}

// ---------------------------------------------------------------------------------------------
// Graph memset nodes

fn memset_params(dst: u64, element_size: u32, width: usize) -> CUDA_MEMSET_NODE_PARAMS {
    CUDA_MEMSET_NODE_PARAMS {
        dst,
        pitch: 0,
        value: 1,
        elementSize: element_size,
        width,
        height: 1,
    }
}

/// A graph and a 256-byte allocation for memset nodes; `f` adds nodes; both are released.
fn with_memset_graph(f: impl FnOnce(CUgraph, u64, CUcontext)) {
    let primary = primary_current();
    let graph = graph_create().check();
    let p = mem_alloc(256).check();
    f(graph, p, primary.ctx());
    graph_destroy(graph).check();
    mem_free(p).check();
}

#[test]
fn measured_graph_memset_node_with_element_size_3_is_invalid_value() {
    on_fresh_thread("memset-node-3", || {
        init();
        with_memset_graph(|graph, p, ctx| {
            graph_add_memset_node(graph, &memset_params(p, 3, 4), ctx)
                .fails_with(CudaErrorCode::INVALID_VALUE);
        });
    });
}

#[test]
fn measured_graph_memset_node_past_the_end_is_invalid_value() {
    on_fresh_thread("memset-node-past-end", || {
        init();
        with_memset_graph(|graph, p, ctx| {
            // 128 four-byte elements: 512 bytes on a 256-byte allocation.
            graph_add_memset_node(graph, &memset_params(p, 4, 128), ctx)
                .fails_with(CudaErrorCode::INVALID_VALUE);
        });
    });
}

#[test]
fn measured_graph_memset_node_with_null_context_succeeds() {
    on_fresh_thread("memset-node-null-ctx", || {
        init();
        with_memset_graph(|graph, p, ctx| {
            graph_add_memset_node(graph, &memset_params(p, 4, 4), ctx).check();
            graph_add_memset_node(graph, &memset_params(p, 4, 4), std::ptr::null_mut()).check();
        });
    });
}

// ---------------------------------------------------------------------------------------------
// Stream capture

const GLOBAL: CUstreamCaptureMode = CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_GLOBAL;

#[test]
fn measured_begin_capture_on_legacy_token_is_unsupported() {
    on_fresh_thread("capture-legacy", || {
        init();
        let _primary = primary_current();
        stream_begin_capture(CU_STREAM_LEGACY, GLOBAL)
            .fails_with(CudaErrorCode::STREAM_CAPTURE_UNSUPPORTED);
        stream_synchronize(CU_STREAM_LEGACY).check(); // not capturing
    });
}

/// The probe's invalidated capture, replayed through its first `steps` calls after
/// `cuStreamBeginCapture` (global mode, on a new non-blocking stream), each asserted:
/// 1. `cuMemAlloc` (synchronous, so illegal in a global capture): `STREAM_CAPTURE_UNSUPPORTED`;
/// 2. `cuMemAllocAsync` on the capturing stream: `STREAM_CAPTURE_INVALIDATED`;
/// 3. `cuMemsetD8Async` on it: `STREAM_CAPTURE_INVALIDATED`;
/// 4. `cuStreamSynchronize` of it: `STREAM_CAPTURE_UNSUPPORTED`;
/// 5. `cuStreamEndCapture`: `STREAM_CAPTURE_INVALIDATED`.
///
/// With fewer than 5 steps the capture is ended anyway and its status is not asserted (not
/// measured after a shorter sequence).
fn invalidated_capture(steps: usize) {
    let _primary = primary_current();
    let target = mem_alloc(64).check(); // a live pointer for the fill
    let s = stream_create(STREAM_NON_BLOCKING).check();
    stream_begin_capture(s, GLOBAL).check();
    let mut ended = false;
    for step in 1..=steps {
        match step {
            1 => mem_alloc(64).fails_with(CudaErrorCode::STREAM_CAPTURE_UNSUPPORTED),
            2 => mem_alloc_async(64, s).fails_with(CudaErrorCode::STREAM_CAPTURE_INVALIDATED),
            3 => memset_d8_async(target, 1, 64, s)
                .fails_with(CudaErrorCode::STREAM_CAPTURE_INVALIDATED),
            4 => stream_synchronize(s).fails_with(CudaErrorCode::STREAM_CAPTURE_UNSUPPORTED),
            5 => {
                ended = true;
                stream_end_capture(s).fails_with(CudaErrorCode::STREAM_CAPTURE_INVALIDATED);
            }
            _ => unreachable!("the probe's sequence has 5 steps"),
        }
    }
    if !ended {
        let ret = stream_end_capture(s);
        if ret.code.is_success() {
            graph_destroy(ret.check()).check();
        }
    }
    stream_destroy(s).check();
    mem_free(target).check();
}

#[test]
fn measured_mem_alloc_during_global_capture_is_unsupported() {
    on_fresh_thread("capture-mem-alloc", || {
        init();
        invalidated_capture(1);
    });
}

#[test]
fn measured_mem_alloc_async_on_invalidated_capture_is_invalidated() {
    on_fresh_thread("capture-alloc-async", || {
        init();
        invalidated_capture(2);
    });
}

#[test]
fn measured_memset_async_on_invalidated_capture_is_invalidated() {
    on_fresh_thread("capture-memset", || {
        init();
        invalidated_capture(3);
    });
}

#[test]
fn measured_stream_synchronize_of_capturing_stream_is_unsupported() {
    on_fresh_thread("capture-sync", || {
        init();
        invalidated_capture(4);
    });
}

#[test]
fn measured_end_capture_after_invalidation_is_invalidated() {
    on_fresh_thread("capture-end-invalidated", || {
        init();
        invalidated_capture(5);
    });
}

/// A clean global capture of `cuMemAllocAsync` + `cuMemFreeAsync` on a new non-blocking stream;
/// returns the stream, still alive, and the captured graph.
fn clean_capture() -> (CUstream, CUgraph) {
    let s = stream_create(STREAM_NON_BLOCKING).check();
    stream_begin_capture(s, GLOBAL).check();
    let p = mem_alloc_async(64, s).check();
    mem_free_async(p, s).check();
    let graph = stream_end_capture(s).check();
    assert!(!graph.is_null());
    (s, graph)
}

#[test]
fn measured_clean_capture_of_alloc_and_free_ends_successfully() {
    on_fresh_thread("capture-clean", || {
        init();
        let _primary = primary_current();
        let (s, graph) = clean_capture();
        graph_destroy(graph).check();
        stream_destroy(s).check();
    });
}

#[test]
fn measured_end_capture_when_not_capturing_is_illegal_state() {
    on_fresh_thread("capture-end-twice", || {
        init();
        let _primary = primary_current();
        let (s, graph) = clean_capture();
        stream_end_capture(s).fails_with(CudaErrorCode::ILLEGAL_STATE);
        graph_destroy(graph).check();
        stream_destroy(s).check();
    });
}

// ---------------------------------------------------------------------------------------------
// cuGetProcAddress

/// `CU_GET_PROC_ADDRESS_SUCCESS`, `CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND`.
const PROC_FOUND: u32 = 0;
const PROC_SYMBOL_NOT_FOUND: u32 = 1;

#[test]
fn measured_get_proc_address_of_mem_free_is_the_v2_export() {
    on_fresh_thread("proc-mem-free", || {
        init();
        let (pfn, status) = get_proc_address(c"cuMemFree", 12000).check();
        assert_eq!(status, PROC_FOUND);
        assert_eq!(pfn, driver().cuMemFree_v2 as *mut c_void);
    });
}

#[test]
fn measured_get_proc_address_of_unknown_symbol_succeeds_with_symbol_not_found() {
    on_fresh_thread("proc-unknown", || {
        init();
        let (_, status) = get_proc_address(c"cuNoSuchThing", 12000).check();
        assert_eq!(status, PROC_SYMBOL_NOT_FOUND);
    });
}
