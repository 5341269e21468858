//! docs/driver-facts.md F1-F10, F12, F13: freeing with no current context, or the wrong one.
//!
//! F11 (`cuMemFreeAsync` on a destroyed stream) kills the process on a real driver and has no
//! case here. Each case allocates from a pool of its own, so that `USED_MEM_CURRENT` tells
//! exactly whether its free happened.
//!
//! The `f05_mem_free_host_*` and `f05_mem_free_of_managed_*` cases extend F5 to `cuMemFreeHost`
//! and to managed memory's `cuMemFree`, and the `f04_alloc_*` cases show stream-ordered
//! allocation on a created stream with no (or another) context current, as measured on the H200
//! (docs/driver-probe/h200-580.159.04-alloc-context.txt): custody makes these calls with no
//! context calls (docs/decisions.md D2). The same frees with another context current
//! (`f08_mem_free_host_*`, `f08_mem_free_of_managed_*`) passed on the H200 on 2026-12-01.

use cuda_sys::types::{c_void, CUstream, CU_STREAM_LEGACY, CU_STREAM_NULL, CU_STREAM_PER_THREAD};

/// `CU_MEM_ATTACH_GLOBAL`.
const MEM_ATTACH_GLOBAL: u32 = 1;
use cuda_sys::CudaErrorCode;

use crate::driver::{
    ctx_create, ctx_destroy, ctx_get_current, ctx_synchronize, init, mem_alloc, mem_alloc_async,
    mem_alloc_from_pool_async, mem_alloc_host, mem_alloc_managed, mem_free, mem_free_async,
    mem_free_host, mem_pool_destroy, memcpy_dtoh, memset_d8, memset_d8_async, pointer_context,
    pointer_memory_type, stream_create, stream_destroy, stream_get_ctx, stream_synchronize,
    STREAM_NON_BLOCKING,
};
use crate::support::{
    device0, new_pool, on_fresh_thread, primary_current, used, Primary, Shared, N,
};

/// F1-F3: the owner allocates `N` bytes from its own pool on a created stream; a thread with no
/// current context frees them on `token`, which fails with `CUDA_ERROR_INVALID_CONTEXT` and frees
/// nothing; the owner then frees them properly.
fn free_async_on_token_without_context_fails(token: CUstream) {
    let token = Shared(token);
    on_fresh_thread("owner", move || {
        init();
        let _primary = primary_current();
        let pool = new_pool();
        let s = stream_create(STREAM_NON_BLOCKING).check();
        let p = mem_alloc_from_pool_async(N, pool, s).check();
        stream_synchronize(s).check();
        let used_before = used(pool);
        assert!(used_before >= N as u64);

        on_fresh_thread("no-context", move || {
            init();
            assert!(
                ctx_get_current().check().is_null(),
                "a fresh thread has no context"
            );
            mem_free_async(p, token.get()).fails_with(CudaErrorCode::INVALID_CONTEXT);
            assert!(ctx_get_current().check().is_null());
        });

        ctx_synchronize().check();
        assert_eq!(used(pool), used_before, "the failed free freed nothing");
        mem_free_async(p, s).check();
        stream_synchronize(s).check();
        assert_eq!(used(pool), 0);
        stream_destroy(s).check();
        mem_pool_destroy(pool).check();
    });
}

#[test]
fn f01_free_async_null_token_without_context() {
    free_async_on_token_without_context_fails(CU_STREAM_NULL);
}

#[test]
fn f02_free_async_legacy_token_without_context() {
    free_async_on_token_without_context_fails(CU_STREAM_LEGACY);
}

#[test]
fn f03_free_async_per_thread_token_without_context() {
    free_async_on_token_without_context_fails(CU_STREAM_PER_THREAD);
}

#[test]
fn f04_free_async_created_stream_without_context() {
    on_fresh_thread("owner", || {
        init();
        let _primary = primary_current();
        let pool = new_pool();
        let s = stream_create(STREAM_NON_BLOCKING).check();
        let p = mem_alloc_from_pool_async(N, pool, s).check();
        stream_synchronize(s).check();

        let stream = Shared(s);
        on_fresh_thread("no-context", move || {
            init();
            mem_free_async(p, stream.get()).check();
            stream_synchronize(stream.get()).check();
            assert!(
                ctx_get_current().check().is_null(),
                "freeing on a created stream binds no context to the thread"
            );
        });

        stream_synchronize(s).check();
        assert_eq!(used(pool), 0, "the free on the created stream happened");
        stream_destroy(s).check();
        mem_pool_destroy(pool).check();
    });
}

#[test]
fn f05_mem_free_without_context() {
    on_fresh_thread("owner", || {
        init();
        let _primary = primary_current();
        let p = mem_alloc(N).check();
        on_fresh_thread("no-context", move || {
            init();
            assert!(ctx_get_current().check().is_null());
            mem_free(p).check();
            assert!(ctx_get_current().check().is_null());
        });
    });
}

#[test]
fn f06_stream_get_ctx_and_synchronize_without_context() {
    on_fresh_thread("owner", || {
        init();
        let primary = primary_current();
        let s = stream_create(STREAM_NON_BLOCKING).check();
        let p = mem_alloc(N).check();
        memset_d8_async(p, 0x11, N, s).check(); // something for the synchronize to wait on

        let (stream, ctx) = (Shared(s), Shared(primary.ctx()));
        on_fresh_thread("no-context", move || {
            init();
            assert_eq!(stream_get_ctx(stream.get()).check(), ctx.get());
            stream_synchronize(stream.get()).check();
            assert!(ctx_get_current().check().is_null());
        });

        assert_eq!(memcpy_dtoh(p, 4).check(), [0x11; 4]);
        mem_free(p).check();
        stream_destroy(s).check();
    });
}

#[test]
fn f07_free_async_null_token_with_other_context_current() {
    on_fresh_thread("owner", || {
        init();
        let primary = primary_current();
        let pool = new_pool();
        let s = stream_create(STREAM_NON_BLOCKING).check();
        let p = mem_alloc_from_pool_async(N, pool, s).check();
        stream_synchronize(s).check();

        let other = ctx_create(device0()).check(); // now current
        assert_ne!(other, primary.ctx());
        // Succeeds, ordered on the other context's legacy stream: nothing reveals the mistake.
        mem_free_async(p, CU_STREAM_NULL).check();
        ctx_synchronize().check(); // the other context's work, the free included
        ctx_destroy(other).check();

        assert_eq!(ctx_get_current().check(), primary.ctx());
        assert_eq!(used(pool), 0, "the free happened");
        stream_destroy(s).check();
        mem_pool_destroy(pool).check();
    });
}

#[test]
fn f08_free_async_primary_stream_with_other_context_current() {
    on_fresh_thread("owner", || {
        init();
        let _primary = primary_current();
        let pool = new_pool();
        let s = stream_create(STREAM_NON_BLOCKING).check();
        let p = mem_alloc_from_pool_async(N, pool, s).check();

        let other = ctx_create(device0()).check(); // now current
        mem_free_async(p, s).check();
        stream_synchronize(s).check();
        ctx_destroy(other).check();

        assert_eq!(used(pool), 0, "the free happened");
        stream_destroy(s).check();
        mem_pool_destroy(pool).check();
    });
}

#[test]
fn f08_mem_free_with_other_context_current() {
    on_fresh_thread("owner", || {
        init();
        let primary = primary_current();
        let p = mem_alloc(N).check();
        assert_eq!(pointer_context(p).check(), primary.ctx());
        let other = ctx_create(device0()).check(); // now current
        mem_free(p).check();
        ctx_destroy(other).check();
    });
}

/// The stream-ordered allocation an [`allocation_on_a_created_stream`] case makes.
#[derive(Clone, Copy, Debug)]
enum StreamOrdered {
    /// `cuMemAllocFromPoolAsync` from a pool of device 0.
    FromPool,
    /// `cuMemAllocAsync` (device 0's current pool).
    Async,
}

/// Stream-ordered allocation and free on a created stream of device 0's primary context, on a
/// fresh thread with no context current (`other: false`) or with a newly created context current
/// (`other: true`): both succeed, the memory is usable on the stream, and the thread's binding is
/// unchanged (docs/driver-probe/h200-580.159.04-alloc-context.txt).
fn allocation_on_a_created_stream(kind: StreamOrdered, other: bool) {
    on_fresh_thread("owner", move || {
        init();
        let primary = primary_current();
        let pool = new_pool();
        let s = Shared(stream_create(STREAM_NON_BLOCKING).check());
        let p_pool = Shared(pool);
        let primary_ctx = Shared(primary.ctx());
        on_fresh_thread("allocating", move || {
            init();
            let other = other.then(|| ctx_create(device0()).check()); // now current
            let before = ctx_get_current().check();
            let p = match kind {
                StreamOrdered::FromPool => {
                    mem_alloc_from_pool_async(N, p_pool.get(), s.get()).check()
                }
                StreamOrdered::Async => mem_alloc_async(N, s.get()).check(),
            };
            memset_d8_async(p, 0x3c, N, s.get()).check();
            stream_synchronize(s.get()).check();
            mem_free_async(p, s.get()).check();
            stream_synchronize(s.get()).check();
            assert_eq!(
                ctx_get_current().check(),
                before,
                "the binding is unchanged"
            );
            if let Some(other) = other {
                assert_ne!(other, primary_ctx.get());
                ctx_destroy(other).check();
            }
        });
        assert_eq!(used(pool), 0, "freed into the pool it came from");
        stream_destroy(s.get()).check();
        mem_pool_destroy(pool).check();
    });
}

#[test]
fn f04_alloc_from_pool_async_on_a_created_stream_without_context() {
    allocation_on_a_created_stream(StreamOrdered::FromPool, false);
}

#[test]
fn f04_alloc_async_on_a_created_stream_without_context() {
    allocation_on_a_created_stream(StreamOrdered::Async, false);
}

#[test]
fn f08_alloc_from_pool_async_on_a_created_stream_with_other_context_current() {
    allocation_on_a_created_stream(StreamOrdered::FromPool, true);
}

#[test]
fn f08_alloc_async_on_a_created_stream_with_other_context_current() {
    allocation_on_a_created_stream(StreamOrdered::Async, true);
}

/// Which synchronous free a [`synchronous_free_without_its_context`] case makes.
#[derive(Clone, Copy, Debug)]
enum SyncFree {
    /// `cuMemAllocHost` memory, freed with `cuMemFreeHost`.
    PinnedHost,
    /// `cuMemAllocManaged` memory, freed with `cuMemFree_v2`.
    Managed,
}

/// F5/F8 for the other synchronous frees custody makes without a context (docs/decisions.md
/// D2): the owner allocates with device 0's primary context current; the memory is then freed
/// on a fresh thread with no context current (`other: false`), or on the owner's thread with a
/// newly created context current (`other: true`). The free succeeds, binds nothing, and the
/// driver no longer knows the address.
fn synchronous_free_without_its_context(kind: SyncFree, other: bool) {
    on_fresh_thread("owner", move || {
        init();
        let primary = primary_current();
        let p = match kind {
            SyncFree::PinnedHost => mem_alloc_host(N).check() as u64,
            SyncFree::Managed => mem_alloc_managed(N, MEM_ATTACH_GLOBAL).check(),
        };
        let free = move || match kind {
            SyncFree::PinnedHost => mem_free_host(p as *mut c_void).check(),
            SyncFree::Managed => mem_free(p).check(),
        };
        if other {
            let other = ctx_create(device0()).check(); // now current
            assert_ne!(other, primary.ctx());
            free();
            assert_eq!(ctx_get_current().check(), other, "the binding is unchanged");
            ctx_destroy(other).check();
        } else {
            on_fresh_thread("no-context", move || {
                init();
                assert!(ctx_get_current().check().is_null());
                free();
                assert!(
                    ctx_get_current().check().is_null(),
                    "the free bound no context to the thread"
                );
            });
        }
        pointer_memory_type(p).fails_with(CudaErrorCode::INVALID_VALUE);
    });
}

#[test]
fn f05_mem_free_host_without_context() {
    synchronous_free_without_its_context(SyncFree::PinnedHost, false);
}

#[test]
fn f05_mem_free_of_managed_memory_without_context() {
    synchronous_free_without_its_context(SyncFree::Managed, false);
}

#[test]
fn f08_mem_free_host_with_other_context_current() {
    synchronous_free_without_its_context(SyncFree::PinnedHost, true);
}

#[test]
fn f08_mem_free_of_managed_memory_with_other_context_current() {
    synchronous_free_without_its_context(SyncFree::Managed, true);
}

#[test]
fn f09_mem_free_after_owning_context_destroyed() {
    on_fresh_thread("owner", || {
        init();
        let primary = primary_current();
        let owner = ctx_create(device0()).check(); // [P, C]
        let p = mem_alloc(N).check();
        assert_eq!(pointer_context(p).check(), owner);
        ctx_destroy(owner).check(); // [P]; the memory went with the context
        assert_eq!(ctx_get_current().check(), primary.ctx());
        // The primary context is current, so a missing context is not the reason it fails.
        mem_free(p).fails_with(CudaErrorCode::INVALID_VALUE);
    });
}

#[test]
fn f10_free_async_pool_allocation_after_owning_context_destroyed() {
    on_fresh_thread("owner", || {
        init();
        let primary = primary_current();
        let pool = new_pool();
        let owner = ctx_create(device0()).check(); // [P, C]
        let p = mem_alloc_from_pool_async(N, pool, CU_STREAM_NULL).check();
        ctx_synchronize().check();
        ctx_destroy(owner).check(); // [P]
        assert_eq!(ctx_get_current().check(), primary.ctx());

        mem_free_async(p, CU_STREAM_NULL).check(); // on the primary context's legacy stream
        ctx_synchronize().check();
        assert_eq!(
            used(pool),
            0,
            "the pool allocation outlived its context and was freed"
        );
        mem_pool_destroy(pool).check();
    });
}

#[test]
fn f12_per_thread_allocation_freed_on_another_thread() {
    on_fresh_thread("owner", || {
        init();
        let primary = primary_current();
        let pool = Shared(new_pool());
        let ctx = Shared(primary.ctx());

        let p = on_fresh_thread("t1", move || {
            init();
            make_current(ctx.get());
            let p = mem_alloc_from_pool_async(N, pool.get(), CU_STREAM_PER_THREAD).check();
            stream_synchronize(CU_STREAM_PER_THREAD).check();
            p
        });
        on_fresh_thread("t2", move || {
            init();
            make_current(ctx.get());
            // Succeeds, but ordered on T2's per-thread stream, not T1's.
            mem_free_async(p, CU_STREAM_PER_THREAD).check();
            stream_synchronize(CU_STREAM_PER_THREAD).check();
        });

        assert_eq!(used(pool.get()), 0, "the free on T2 happened");
        mem_pool_destroy(pool.get()).check();
    });
}

/// `cuCtxSetCurrent`, checked (for threads other than the one holding the [`Primary`] guard).
#[track_caller]
fn make_current(ctx: cuda_sys::types::CUcontext) {
    crate::driver::ctx_set_current(ctx).check();
}

#[test]
fn f13_stream_destroy_with_live_async_allocation() {
    on_fresh_thread("owner", || {
        init();
        let _primary: Primary = primary_current();
        let pool = new_pool();
        let s = stream_create(STREAM_NON_BLOCKING).check();
        let p = mem_alloc_from_pool_async(N, pool, s).check();
        stream_synchronize(s).check();
        stream_destroy(s).check();

        assert!(used(pool) >= N as u64, "the allocation outlived its stream");
        memset_d8(p, 0x5A, N).check();
        assert_eq!(memcpy_dtoh(p + (N as u64) - 16, 16).check(), [0x5A; 16]);
        mem_free_async(p, CU_STREAM_NULL).check();
        ctx_synchronize().check();
        assert_eq!(used(pool), 0);
        mem_pool_destroy(pool).check();
    });
}
