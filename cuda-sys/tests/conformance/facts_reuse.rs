//! docs/driver-facts.md F18: a stream-ordered pool hands a freed address out again.
//!
//! So an address does not identify an allocation: the emulator's queries, its hazard checker and
//! every test follow an allocation by its identity (`test_support`'s `AllocationId`, the
//! driver's `CU_POINTER_ATTRIBUTE_BUFFER_ID`), never by its address alone.

use std::collections::{HashMap, HashSet};

use cuda_sys::types::{CUdeviceptr, CUstream};

use crate::driver::{
    init, mem_alloc_async, mem_alloc_from_pool_async, mem_free_async, mem_pool_destroy,
    pointer_buffer_id, stream_create, stream_destroy, stream_get_id, stream_synchronize, Ret,
    STREAM_NON_BLOCKING,
};
use crate::support::{new_pool, on_fresh_thread, primary_current, used};

/// Allocates 64 bytes with `alloc` and frees them on `s` at once, 64 times, reading each
/// allocation's `CU_POINTER_ATTRIBUTE_BUFFER_ID` while it is live; then asserts that some
/// address was handed out more than once (F18) and that every allocation had its own buffer id
/// (documented: "a process-wide unique ID for an allocated memory region"), reused address or
/// not.
fn freed_addresses_come_back(s: CUstream, alloc: impl Fn() -> Ret<CUdeviceptr>) {
    let mut seen: HashMap<CUdeviceptr, usize> = HashMap::new();
    let mut buffer_ids = HashSet::new();
    for _ in 0..64 {
        let p = alloc().check();
        assert_ne!(p, 0);
        assert!(
            buffer_ids.insert(pointer_buffer_id(p).check()),
            "a buffer id was handed out twice"
        );
        *seen.entry(p).or_default() += 1;
        mem_free_async(p, s).check();
    }
    stream_synchronize(s).check();
    assert!(
        seen.values().any(|&n| n > 1),
        "64 allocate/free rounds on one stream never reused an address: {seen:x?}"
    );
}

#[test]
fn f18_created_pool_hands_a_freed_address_out_again() {
    on_fresh_thread("f18-created-pool", || {
        init();
        let _primary = primary_current();
        let pool = new_pool();
        let s = stream_create(STREAM_NON_BLOCKING).check();
        freed_addresses_come_back(s, || mem_alloc_from_pool_async(64, pool, s));
        assert_eq!(used(pool), 0);
        stream_destroy(s).check();
        mem_pool_destroy(pool).check();
    });
}

#[test]
fn f18_current_pool_hands_a_freed_address_out_again() {
    on_fresh_thread("f18-current-pool", || {
        init();
        let _primary = primary_current();
        let s = stream_create(STREAM_NON_BLOCKING).check();
        freed_addresses_come_back(s, || mem_alloc_async(64, s));
        stream_destroy(s).check();
    });
}

/// `cuStreamGetId` is "unique for the life of the program" (the driver API documentation): 64
/// streams created and destroyed one after another each get their own id, whether or not the
/// driver hands a destroyed stream's handle value out again (which it may, as a freed pointer:
/// the hazard RAPIDS rmm reported as rmm#649, and what a cache keyed on stream handles must
/// survive; how often it did is printed). custody's caching resource keys a stream it cannot keep alive on this id.
#[test]
fn stream_ids_stay_unique_when_stream_handles_come_back() {
    on_fresh_thread("stream-ids", || {
        init();
        let _primary = primary_current();
        let mut ids = HashSet::new();
        let mut handles: HashMap<usize, usize> = HashMap::new();
        for _ in 0..64 {
            let s = stream_create(STREAM_NON_BLOCKING).check();
            assert!(
                ids.insert(stream_get_id(s).check()),
                "a stream id came back"
            );
            *handles.entry(s as usize).or_default() += 1;
            stream_destroy(s).check();
        }
        let reused = handles.values().filter(|&&n| n > 1).count();
        println!("64 streams created and destroyed: {reused} handle values came back");
    });
}
