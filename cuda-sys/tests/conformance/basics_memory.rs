//! Basics: memory pools and their attributes, stream-ordered allocation, `cuMemAlloc`, memset
//! and memcpy read back, pointer attributes.

use cuda_sys::types::{CUmemPool_attribute, CU_STREAM_NULL};

use crate::driver::{
    ctx_synchronize, device_get_default_mem_pool, device_get_mem_pool, init, mem_alloc,
    mem_alloc_async, mem_alloc_from_pool_async, mem_alloc_host, mem_free, mem_free_async,
    mem_free_host, mem_get_info, mem_pool_create, mem_pool_destroy, mem_pool_get_attribute,
    mem_pool_trim_to, memcpy, memcpy_async, memcpy_dtoh, memcpy_htod, memset_d16, memset_d32,
    memset_d32_async, memset_d8, memset_d8_async, pointer_context, pointer_device_ordinal,
    pointer_get_attributes, pointer_is_managed, pointer_memory_type, pointer_mempool,
    stream_create, stream_destroy, stream_synchronize, MEMORYTYPE_DEVICE, MEMORYTYPE_HOST,
    STREAM_NON_BLOCKING,
};
use crate::support::{device0, new_pool, on_fresh_thread, primary_current, reserved, used, N};

#[test]
fn basic_pool_create_and_destroy() {
    on_fresh_thread("pool-create", || {
        init();
        let _primary = primary_current();
        let pool = mem_pool_create(device0()).check();
        assert!(!pool.is_null());
        assert_eq!(used(pool), 0);
        assert_eq!(reserved(pool), 0);
        mem_pool_destroy(pool).check();
    });
}

#[test]
fn basic_default_pool_is_the_device_current_pool() {
    on_fresh_thread("default-pool", || {
        init();
        let _primary = primary_current();
        let default = device_get_default_mem_pool(device0()).check();
        assert!(!default.is_null());
        assert_eq!(device_get_mem_pool(device0()).check(), default);
        let own = new_pool();
        assert_ne!(own, default, "a created pool is not the default pool");
        mem_pool_destroy(own).check();
    });
}

#[test]
fn basic_pool_attributes_track_alloc_free_and_trim() {
    on_fresh_thread("pool-attributes", || {
        init();
        let _primary = primary_current();
        let pool = new_pool(); // release threshold u64::MAX: nothing is released on sync
        let s = stream_create(STREAM_NON_BLOCKING).check();
        assert_eq!((used(pool), reserved(pool)), (0, 0), "a new pool is empty");

        let p = mem_alloc_from_pool_async(N, pool, s).check();
        stream_synchronize(s).check();
        assert_ne!(p, 0);
        let used_after_alloc = used(pool);
        assert!(
            used_after_alloc >= N as u64,
            "used {used_after_alloc} < {N}"
        );
        assert!(reserved(pool) >= used_after_alloc, "reserved < used");
        let used_high =
            mem_pool_get_attribute(pool, CUmemPool_attribute::CU_MEMPOOL_ATTR_USED_MEM_HIGH)
                .check();
        assert!(used_high >= used_after_alloc);

        mem_free_async(p, s).check();
        stream_synchronize(s).check();
        assert_eq!(used(pool), 0, "freed and synchronized: nothing is in use");
        assert!(
            reserved(pool) >= N as u64,
            "with a release threshold of u64::MAX the pool keeps its reservation"
        );

        mem_pool_trim_to(pool, 0).check();
        assert_eq!(
            reserved(pool),
            0,
            "trimming to 0 releases everything unused"
        );
        stream_destroy(s).check();
        mem_pool_destroy(pool).check();
    });
}

#[test]
fn basic_mem_alloc_async_uses_the_current_pool() {
    on_fresh_thread("alloc-async", || {
        init();
        let _primary = primary_current();
        let s = stream_create(STREAM_NON_BLOCKING).check();
        let default = device_get_mem_pool(device0()).check();
        let p = mem_alloc_async(N, s).check();
        assert_ne!(p, 0);
        memset_d32_async(p, 0xDEAD_BEEF, N / 4, s).check();
        stream_synchronize(s).check();
        assert_eq!(pointer_mempool(p).check(), default);
        let bytes = memcpy_dtoh(p, 8).check();
        assert_eq!(bytes, [0xEF, 0xBE, 0xAD, 0xDE, 0xEF, 0xBE, 0xAD, 0xDE]);
        mem_free_async(p, s).check();
        stream_synchronize(s).check();
        stream_destroy(s).check();
    });
}

#[test]
fn basic_memset_and_memcpy_read_back() {
    on_fresh_thread("memset-memcpy", || {
        init();
        let _primary = primary_current();
        let a = mem_alloc(4096).check();
        let b = mem_alloc(4096).check();

        memset_d8(a, 0xAB, 4096).check();
        assert!(memcpy_dtoh(a, 4096).check().iter().all(|&x| x == 0xAB));

        memset_d16(a, 0x1234, 8).check(); // 16 bytes
        let head = memcpy_dtoh(a, 20).check();
        assert_eq!(&head[..4], &[0x34, 0x12, 0x34, 0x12]);
        assert_eq!(
            &head[16..],
            &[0xAB; 4],
            "memset D16 wrote past its 8 elements"
        );

        memset_d32(a, 0x0102_0304, 2).check();
        assert_eq!(
            &memcpy_dtoh(a, 12).check()[..],
            &[4, 3, 2, 1, 4, 3, 2, 1, 0x34, 0x12, 0x34, 0x12]
        );

        let pattern: Vec<u8> = (0..4096u32).map(|i| (i * 7 % 251) as u8).collect();
        memcpy_htod(a, &pattern).check();
        memcpy(b, a, 4096).check();
        assert_eq!(memcpy_dtoh(b, 4096).check(), pattern);

        mem_free(a).check();
        mem_free(b).check();
    });
}

#[test]
fn basic_async_memset_and_memcpy_read_back() {
    on_fresh_thread("async-memset-memcpy", || {
        init();
        let _primary = primary_current();
        let pool = new_pool();
        let s = stream_create(STREAM_NON_BLOCKING).check();
        let a = mem_alloc_from_pool_async(4096, pool, s).check();
        let b = mem_alloc_from_pool_async(4096, pool, s).check();
        memset_d8_async(a, 0x5A, 4096, s).check();
        memcpy_async(b, a, 4096, s).check();
        memset_d8_async(a, 0x00, 16, s).check();
        stream_synchronize(s).check();
        assert!(memcpy_dtoh(b, 4096).check().iter().all(|&x| x == 0x5A));
        assert_eq!(
            &memcpy_dtoh(a, 17).check()[..],
            &[[0u8; 16].as_slice(), &[0x5A]].concat()[..]
        );
        mem_free_async(a, s).check();
        mem_free_async(b, s).check();
        stream_synchronize(s).check();
        assert_eq!(used(pool), 0);
        stream_destroy(s).check();
        mem_pool_destroy(pool).check();
    });
}

#[test]
fn basic_pointer_attributes_of_device_memory() {
    on_fresh_thread("pointer-device", || {
        init();
        let primary = primary_current();
        let p = mem_alloc(N).check();
        assert_eq!(pointer_context(p).check(), primary.ctx());
        assert_eq!(pointer_memory_type(p).check(), MEMORYTYPE_DEVICE);
        assert_eq!(pointer_device_ordinal(p).check(), 0);
        assert!(!pointer_is_managed(p).check());
        // An interior pointer has the same attributes.
        assert_eq!(pointer_memory_type(p + 4096).check(), MEMORYTYPE_DEVICE);
        mem_free(p).check();
    });
}

/// `cuPointerGetAttributes` reads several attributes in one call (so no free on another thread
/// can fall between them); unlike `cuPointerGetAttribute`, which fails with
/// `CUDA_ERROR_INVALID_VALUE` for an address the driver does not know, it succeeds (documented)
/// and, measured (`docs/driver-facts.md` F19), writes memory type 0, not managed and device
/// ordinal -2, and leaves the range size unwritten (the helper's storage holds 7 before the call).
/// Asked of live memory, of the same address once freed, and of pageable host memory.
/// (`handles::pointer_attributes` relies on it and starts its range size at 0.)
#[test]
fn basic_pointer_get_attributes_reads_an_unknown_address_as_null_values() {
    on_fresh_thread("pointer-get-attributes", || {
        init();
        let _primary = primary_current();
        let p = mem_alloc(N).check();
        let (kind, managed, ordinal, range) = pointer_get_attributes(p + 16).check();
        assert_eq!(
            (kind, managed, ordinal, range),
            (MEMORYTYPE_DEVICE, 0, 0, N)
        );
        mem_free(p).check();
        pointer_memory_type(p).fails_with(cuda_sys::CudaErrorCode::INVALID_VALUE);
        assert_eq!(
            pointer_get_attributes(p).check(),
            (0, 0, -2, 7),
            "a freed address: NULL values, ordinal -2, range size unwritten"
        );
        let pageable = vec![0u8; 64];
        assert_eq!(
            pointer_get_attributes(pageable.as_ptr() as u64).check(),
            (0, 0, -2, 7),
            "pageable host memory: NULL values, ordinal -2, range size unwritten"
        );
    });
}

#[test]
fn basic_pointer_attributes_of_pool_memory() {
    on_fresh_thread("pointer-pool", || {
        init();
        let _primary = primary_current();
        let pool = new_pool();
        let p = mem_alloc_from_pool_async(N, pool, CU_STREAM_NULL).check();
        ctx_synchronize().check();
        assert_eq!(pointer_mempool(p).check(), pool);
        assert_eq!(pointer_memory_type(p).check(), MEMORYTYPE_DEVICE);
        assert_eq!(pointer_device_ordinal(p).check(), 0);
        mem_free_async(p, CU_STREAM_NULL).check();
        ctx_synchronize().check();
        mem_pool_destroy(pool).check();
    });
}

#[test]
fn basic_pointer_attributes_of_host_memory() {
    on_fresh_thread("pointer-host", || {
        init();
        let primary = primary_current();
        let h = mem_alloc_host(4096).check();
        assert!(!h.is_null());
        let addr = h as u64;
        assert_eq!(pointer_memory_type(addr).check(), MEMORYTYPE_HOST);
        assert_eq!(pointer_context(addr).check(), primary.ctx());
        // Pinned host memory is host-accessible: write it directly, copy it to the device.
        // SAFETY: `h` is a live 4096-byte allocation from cuMemAllocHost.
        unsafe { std::ptr::write_bytes(h.cast::<u8>(), 0x42, 4096) };
        let d = mem_alloc(4096).check();
        memcpy(d, addr, 4096).check();
        assert!(memcpy_dtoh(d, 4096).check().iter().all(|&x| x == 0x42));
        mem_free(d).check();
        mem_free_host(h).check();
    });
}

#[test]
fn basic_mem_get_info() {
    on_fresh_thread("mem-info", || {
        init();
        let _primary = primary_current();
        let (free, total) = mem_get_info().check();
        assert!(total > 0);
        assert!(free <= total);
    });
}
