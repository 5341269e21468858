//! Basics: the per-thread context stack, primary-context retain/release, created contexts.

use std::ptr;

use cuda_sys::CudaErrorCode;

use crate::driver::{
    ctx_create, ctx_destroy, ctx_get_current, ctx_get_device, ctx_pop_current, ctx_push_current,
    ctx_set_current, ctx_synchronize, init, primary_ctx_get_state, primary_ctx_release,
    primary_ctx_retain,
};
use crate::support::{device0, on_fresh_thread, primary_current, Primary, Shared};

#[test]
fn basic_ctx_get_current_on_fresh_thread_is_null() {
    on_fresh_thread("fresh", || {
        init();
        assert!(ctx_get_current().check().is_null());
        ctx_get_device().fails_with(CudaErrorCode::INVALID_CONTEXT);
        ctx_synchronize().fails_with(CudaErrorCode::INVALID_CONTEXT);
    });
}

#[test]
fn basic_ctx_pop_on_empty_stack() {
    on_fresh_thread("pop-empty", || {
        init();
        ctx_pop_current().fails_with(CudaErrorCode::INVALID_CONTEXT);
        assert!(ctx_get_current().check().is_null());
    });
}

#[test]
fn basic_ctx_push_twice_pop_twice() {
    on_fresh_thread("push-twice", || {
        init();
        let primary = Primary::retain();
        let p = primary.ctx();
        ctx_push_current(p).check();
        ctx_push_current(p).check();
        assert_eq!(ctx_get_current().check(), p);
        assert_eq!(ctx_pop_current().check(), p);
        assert_eq!(ctx_get_current().check(), p, "one push is left");
        assert_eq!(ctx_pop_current().check(), p);
        assert!(ctx_get_current().check().is_null(), "the stack is empty");
        ctx_pop_current().fails_with(CudaErrorCode::INVALID_CONTEXT);
    });
}

#[test]
fn basic_ctx_set_current_on_empty_stack_binds() {
    on_fresh_thread("set-empty", || {
        init();
        let primary = Primary::retain();
        ctx_set_current(primary.ctx()).check();
        assert_eq!(ctx_get_current().check(), primary.ctx());
        assert_eq!(ctx_get_device().check(), device0());
        assert_eq!(ctx_pop_current().check(), primary.ctx());
        assert!(ctx_get_current().check().is_null());
    });
}

#[test]
fn basic_ctx_set_current_replaces_top_of_stack() {
    on_fresh_thread("set-replaces", || {
        init();
        let primary = Primary::retain();
        let c = ctx_create(device0()).check(); // stack: [C]
        ctx_push_current(primary.ctx()).check(); // [C, P]
        assert_eq!(ctx_get_current().check(), primary.ctx());
        ctx_set_current(c).check(); // [C, C]: the top is replaced, nothing pushed
        assert_eq!(ctx_get_current().check(), c);
        assert_eq!(ctx_pop_current().check(), c);
        assert_eq!(ctx_get_current().check(), c, "the bottom entry is still C");
        assert_eq!(ctx_pop_current().check(), c);
        assert!(ctx_get_current().check().is_null());
        ctx_destroy(c).check();
    });
}

#[test]
fn basic_ctx_set_null_pops_top_of_stack() {
    on_fresh_thread("set-null", || {
        init();
        let primary = Primary::retain();
        let c = ctx_create(device0()).check(); // [C]
        ctx_push_current(primary.ctx()).check(); // [C, P]
        ctx_set_current(ptr::null_mut()).check(); // [C]
        assert_eq!(ctx_get_current().check(), c, "set NULL pops one entry");
        ctx_set_current(ptr::null_mut()).check(); // []
        assert!(ctx_get_current().check().is_null());
        ctx_set_current(ptr::null_mut()).check(); // no-op on an empty stack
        assert!(ctx_get_current().check().is_null());
        ctx_destroy(c).check();
    });
}

#[test]
fn basic_ctx_create_pushes_and_destroy_pops() {
    on_fresh_thread("create-destroy", || {
        init();
        let primary = primary_current(); // [P]
        let c = ctx_create(device0()).check(); // [P, C]
        assert!(!c.is_null());
        assert_ne!(
            c,
            primary.ctx(),
            "a created context is not the primary context"
        );
        assert_eq!(
            ctx_get_current().check(),
            c,
            "cuCtxCreate makes the new context current"
        );
        assert_eq!(ctx_get_device().check(), device0());
        ctx_destroy(c).check(); // destroying the current context pops it
        assert_eq!(ctx_get_current().check(), primary.ctx());
        assert_eq!(ctx_pop_current().check(), primary.ctx());
        assert!(ctx_get_current().check().is_null());
    });
}

#[test]
fn basic_created_ctx_destroy_leaves_fresh_thread_without_context() {
    on_fresh_thread("created-destroy", || {
        init();
        let c = ctx_create(device0()).check();
        assert_eq!(ctx_get_current().check(), c);
        ctx_destroy(c).check();
        assert!(ctx_get_current().check().is_null());
        ctx_pop_current().fails_with(CudaErrorCode::INVALID_CONTEXT);
    });
}

#[test]
fn basic_created_ctx_destroyed_from_another_thread() {
    let c = on_fresh_thread("creator", || {
        init();
        let c = ctx_create(device0()).check();
        assert_eq!(ctx_pop_current().check(), c);
        Shared(c)
    });
    on_fresh_thread("destroyer", move || {
        init();
        let c = c.get();
        ctx_destroy(c).check();
        assert!(ctx_get_current().check().is_null());
    });
}

#[test]
fn basic_primary_ctx_retain_release_refcount_and_state() {
    on_fresh_thread("primary-state", || {
        init();
        let device = device0();
        // Other cases in the same process release what they retain, but assert relative to the
        // state found so that one failed case cannot fail this one too.
        let (_, active_before) = primary_ctx_get_state(device).check();
        let a = primary_ctx_retain(device).check();
        assert!(!a.is_null());
        let (_, active) = primary_ctx_get_state(device).check();
        assert_eq!(active, 1, "a retained primary context is active");
        assert!(
            ctx_get_current().check().is_null(),
            "retaining does not make the primary context current"
        );
        let b = primary_ctx_retain(device).check();
        assert_eq!(a, b, "the primary context is one context");
        primary_ctx_release(device).check();
        let (_, active) = primary_ctx_get_state(device).check();
        assert_eq!(active, 1, "one retain is still held");
        primary_ctx_release(device).check();
        let (_, active_after) = primary_ctx_get_state(device).check();
        assert_eq!(active_after, active_before, "retains and releases balance");
        if active_before == 0 {
            assert_eq!(
                active_after, 0,
                "the last release deactivates the primary context"
            );
        }
    });
}

#[test]
fn basic_primary_ctx_is_one_context_across_threads() {
    let primary = on_fresh_thread("retain-a", || {
        init();
        Shared(primary_ctx_retain(device0()).check())
    });
    let other = on_fresh_thread("retain-b", || {
        init();
        Shared(primary_ctx_retain(device0()).check())
    });
    assert_eq!(primary, other);
    on_fresh_thread("release", || {
        init();
        primary_ctx_release(device0()).check();
        primary_ctx_release(device0()).check();
    });
}

/// Runs a driver call from a thread-local destructor that runs after the driver's own
/// per-thread state on that thread was torn down, and keeps its status.
struct ReleaseAtThreadExit {
    device: cuda_sys::types::CUdevice,
    status: std::sync::Arc<std::sync::Mutex<Option<CudaErrorCode>>>,
}

impl Drop for ReleaseAtThreadExit {
    fn drop(&mut self) {
        let code = primary_ctx_release(self.device).code;
        *self.status.lock().unwrap_or_else(|e| e.into_inner()) = Some(code);
    }
}

thread_local! {
    static AT_EXIT: std::cell::RefCell<Option<ReleaseAtThreadExit>> =
        const { std::cell::RefCell::new(None) };
}

#[test]
fn basic_primary_ctx_release_from_a_thread_exit_destructor() {
    // cuda.core releases primary contexts from thread-exit destructors. This thread-local is
    // registered before the first driver call on the thread, so (destructors run in reverse
    // order of registration) its destructor runs after the driver's own per-thread state is
    // gone: the call must still be answered, not crash the process.
    let status = std::sync::Arc::new(std::sync::Mutex::new(None));
    let seen = status.clone();
    std::thread::Builder::new()
        .name("exit-release".into())
        .spawn(move || {
            AT_EXIT.with(|slot| *slot.borrow_mut() = None);
            init();
            let device = device0();
            primary_ctx_retain(device).check();
            AT_EXIT.with(|slot| {
                *slot.borrow_mut() = Some(ReleaseAtThreadExit {
                    device,
                    status: seen,
                })
            });
        })
        .expect("spawn")
        .join()
        .expect("the thread exits without a panic");
    let code = status.lock().unwrap_or_else(|e| e.into_inner()).take();
    assert_eq!(code, Some(CudaErrorCode::SUCCESS));
}
