//! Primary contexts, created contexts and the per-thread context stack.

use std::collections::BTreeSet;

use cuda_sys::types::*;
use cuda_sys::CUresult;

use super::{answer, context_arg, need, put, put_opt, synchronize_context, wait_and_observe, Out};
use crate::codes::{self, Res};
use crate::log::entry;
use crate::state::{initialized, state, Context, State};
use crate::thread::{current_context, with_context_stack};

#[no_mangle]
pub unsafe extern "C" fn cuDevicePrimaryCtxRetain(pctx: *mut CUcontext, dev: CUdevice) -> CUresult {
    // SAFETY: the caller's out-pointer (driver contract).
    let out = unsafe { Out::new(pctx) };
    answer("cuDevicePrimaryCtxRetain", out, |_| {
        let mut st = initialized()?;
        let primary = st.device(dev)?.primary;
        if st.device(dev)?.primary_refs == 0 {
            st.activate_context(primary);
        }
        st.device_mut(dev)?.primary_refs += 1;
        Ok(primary as CUcontext)
    })
}

/// Ends a primary context's life when its last reference goes: waits for its streams, then
/// retires it (its `cuMemAlloc` memory goes with it).
fn release_primary(dev: CUdevice) -> Res {
    let (primary, targets) = {
        let mut st = initialized()?;
        let d = st.device_mut(dev)?;
        if d.primary_refs == 0 {
            return Err(codes::RELEASE_UNRETAINED_PRIMARY);
        }
        d.primary_refs -= 1;
        if d.primary_refs > 0 {
            return Ok(());
        }
        let primary = d.primary;
        (primary, st.context_targets(primary))
    };
    wait_and_observe(&targets.0, &targets.1);
    let mut st = state();
    if st.device(dev)?.primary_refs == 0 {
        st.retire_context(primary, "cuDevicePrimaryCtxRelease_v2");
    }
    Ok(())
}

#[no_mangle]
pub unsafe extern "C" fn cuDevicePrimaryCtxRelease_v2(dev: CUdevice) -> CUresult {
    entry("cuDevicePrimaryCtxRelease_v2", None, None, |_| {
        release_primary(dev)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuDevicePrimaryCtxGetState(
    dev: CUdevice,
    flags: *mut c_uint,
    active: *mut c_int,
) -> CUresult {
    entry("cuDevicePrimaryCtxGetState", None, None, |_| {
        need(flags)?;
        need(active)?;
        let st = initialized()?;
        let d = st.device(dev)?;
        // SAFETY: both checked non-null (driver contract).
        unsafe {
            put(flags, d.primary_flags)?;
            put(active, c_int::from(d.primary_refs > 0))
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxCreate_v2(
    pctx: *mut CUcontext,
    _flags: c_uint,
    dev: CUdevice,
) -> CUresult {
    // SAFETY: the caller's out-pointer (driver contract).
    answer("cuCtxCreate_v2", unsafe { Out::new(pctx) }, |_| {
        let mut st = initialized()?;
        st.device(dev)?;
        let handle = st.new_handle();
        st.contexts.insert(
            handle,
            Context {
                device: dev,
                primary: false,
                alive: false,
                legacy: 0,
                streams: BTreeSet::new(),
                retired: Vec::new(),
            },
        );
        st.activate_context(handle);
        with_context_stack(|s| s.push(handle));
        Ok(handle as CUcontext)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxDestroy_v2(ctx: CUcontext) -> CUresult {
    let ctx = ctx as u64;
    entry("cuCtxDestroy_v2", None, None, |_| {
        let targets = {
            let st = initialized()?;
            let c = st.contexts.get(&ctx).ok_or(codes::BAD_CONTEXT)?;
            if c.primary {
                return Err(codes::DESTROY_PRIMARY);
            }
            if !c.alive {
                return Err(codes::BAD_CONTEXT);
            }
            st.context_targets(ctx)
        };
        // The driver lets the context's pending work finish before it goes.
        wait_and_observe(&targets.0, &targets.1);
        let mut st = state();
        st.live_context(ctx)?;
        st.retire_context(ctx, "cuCtxDestroy_v2");
        with_context_stack(|s| {
            if s.last() == Some(&ctx) {
                s.pop();
            }
        });
        Ok(())
    })
}

/// The body of `cuCtxPushCurrent_v2` and `cuCtxSetCurrent`, with the driver state locked and
/// initialized: `null` answers for a NULL `ctx`; a live `ctx` goes on the calling thread's
/// context stack through `place`.
fn make_current(
    ctx: CUcontext,
    null: impl FnOnce() -> Res,
    place: impl FnOnce(&mut Vec<u64>, u64),
) -> Res {
    let st = initialized()?;
    let ctx = ctx as u64;
    if ctx == 0 {
        return null();
    }
    st.live_context(ctx)?;
    with_context_stack(|s| place(s, ctx));
    Ok(())
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxPushCurrent_v2(ctx: CUcontext) -> CUresult {
    entry("cuCtxPushCurrent_v2", None, None, |_| {
        make_current(ctx, || Err(codes::PUSH_NULL), Vec::push)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxPopCurrent_v2(pctx: *mut CUcontext) -> CUresult {
    entry("cuCtxPopCurrent_v2", None, None, |_| {
        drop(initialized()?);
        let top = with_context_stack(|s| s.pop()).ok_or(codes::POP_EMPTY)?;
        // SAFETY: optional out-pointer (driver contract).
        unsafe { put_opt(pctx, top as CUcontext) };
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxSetCurrent(ctx: CUcontext) -> CUresult {
    entry("cuCtxSetCurrent", None, None, |_| {
        make_current(
            ctx,
            // NULL pops the top of the stack (documented, and measured on an H200:
            // conformance basic_ctx_set_null_pops_top_of_stack); a no-op on an empty stack.
            || {
                with_context_stack(|s| s.pop());
                Ok(())
            },
            |s, ctx| match s.last_mut() {
                Some(top) => *top = ctx,
                None => s.push(ctx),
            },
        )
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxGetCurrent(pctx: *mut CUcontext) -> CUresult {
    // SAFETY: the caller's out-pointer (driver contract).
    answer("cuCtxGetCurrent", unsafe { Out::new(pctx) }, |_| {
        drop(initialized()?);
        Ok(current_context() as CUcontext)
    })
}

/// The device of context `ctx` (NULL: the current context), the body of `cuCtxGetDevice` and its
/// `_v2` form (`function`).
///
/// # Safety
/// `device` is null or valid for a write (the driver API's contract for out-pointers).
pub(crate) unsafe fn context_device(
    function: &'static str,
    device: *mut CUdevice,
    ctx: CUcontext,
) -> CUresult {
    // SAFETY: valid per this function's contract.
    answer(function, unsafe { Out::new(device) }, |_| {
        let st = initialized()?;
        let c = context_arg(&st, ctx)?;
        Ok(st.contexts[&c].device)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxGetDevice(device: *mut CUdevice) -> CUresult {
    // SAFETY: the caller's out-pointer (driver contract).
    unsafe { context_device("cuCtxGetDevice", device, std::ptr::null_mut()) }
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxSynchronize() -> CUresult {
    entry("cuCtxSynchronize", None, None, |_| {
        synchronize_context(State::current_ctx)
    })
}
