//! The exported driver entry points, one module per area. Every function runs through
//! [`crate::log::entry`] (call log, fault injection, the callback rule, panic containment).
//!
//! Exports that differ only in a parameter or two (a `_v2` form, a 32- or 64-bit value, a
//! record or a wait) are their signature and one call to the family's body, which takes the
//! export's name and runs `entry` itself, so that each is logged under its own name (`copy`,
//! `memset`, `memory_operation`, `stream_property`, ...); a family whose exports also share
//! their signature is one macro (`edge_exports!`, `node_link_exports!`, `event_node_exports!`,
//! `prefetch_batch_exports!`). A stream argument is resolved for the call log by
//! `CallInfo::resolve_stream` or `CallInfo::lock_stream`. An export that answers one value
//! through an out-pointer it checks first runs through [`answer`], one that runs wholly on the
//! locked state through [`with_state`].
//!
//! Safety contract of every export (the driver's own): pointer arguments are null or valid for
//! the reads and writes the CUDA driver API documents for them; handles are plain values and
//! are never dereferenced.

mod context;
mod device;
mod graph;
mod graph_cond;
mod graph_nodes;
mod info;
mod memory;
pub(crate) mod names;
mod pool;
mod ranges;
mod stream;
pub(crate) mod unsupported;

pub(crate) use context::*;
pub(crate) use device::*;
pub(crate) use graph::*;
pub(crate) use graph_cond::*;
pub(crate) use graph_nodes::*;
pub(crate) use info::*;
pub(crate) use memory::*;
pub(crate) use pool::*;
pub(crate) use ranges::*;
pub(crate) use stream::*;

use crate::codes::{self, Res};

/// The exports beyond custody's loader list (`cuda_sys::with_driver_functions!`), by name: what
/// `cuGetProcAddress` hands out for them.
macro_rules! extra_exports {
    ($($name:ident)*) => {
        /// Our export named exactly `name` among those beyond custody's loader list.
        pub(crate) fn extra_named(name: &str) -> Option<*mut std::ffi::c_void> {
            match name {
                $(stringify!($name) => Some($name as *const () as *mut std::ffi::c_void),)*
                _ => None,
            }
        }
    };
}

/// Fails with `CUDA_ERROR_INVALID_VALUE` for a null out-pointer (checked before any effect).
pub(crate) fn need<T>(p: *const T) -> Res {
    if p.is_null() {
        Err(codes::INVALID_VALUE)
    } else {
        Ok(())
    }
}

/// Fails with `CUDA_ERROR_INVALID_VALUE` for a flag outside `known` (checked before any effect).
pub(crate) fn known_flags(flags: std::ffi::c_uint, known: std::ffi::c_uint) -> Res {
    if flags & !known == 0 {
        Ok(())
    } else {
        Err(codes::INVALID_VALUE)
    }
}

/// Writes `v` through an out-pointer, refusing null.
///
/// # Safety
/// `p` is null or valid for a write of `T` (the driver API's contract for out-pointers).
pub(crate) unsafe fn put<T>(p: *mut T, v: T) -> Res {
    need(p)?;
    // SAFETY: non-null, and valid for a write per this function's contract; unaligned writes
    // tolerate a caller's packed buffer.
    unsafe { p.write_unaligned(v) };
    Ok(())
}

/// Writes `v` through an optional out-pointer (null: ignored).
///
/// # Safety
/// As [`put`].
pub(crate) unsafe fn put_opt<T>(p: *mut T, v: T) {
    if !p.is_null() {
        // SAFETY: non-null, valid per the contract.
        unsafe { p.write_unaligned(v) };
    }
}

/// An out-pointer its caller vouches for: null, or valid for a write of `T` (the driver API's
/// contract for out-pointers), for [`answer`] to check and write.
pub(crate) struct Out<T>(*mut T);

impl<T> Out<T> {
    /// # Safety
    /// `p` is null or valid for a write of `T` as long as the `Out` lives.
    pub(crate) unsafe fn new(p: *mut T) -> Self {
        Out(p)
    }
}

/// The body of an export that answers one value through the out-pointer `out`, logged as
/// `function` with no stream or pointer: `out` is checked non-null before anything else, then
/// `value` computes the answer (taking the driver state's lock itself), which is written through
/// `out`.
pub(crate) fn answer<T>(
    function: &'static str,
    out: Out<T>,
    value: impl FnOnce(&mut crate::log::CallInfo) -> Res<T>,
) -> cuda_sys::CUresult {
    crate::log::entry(function, None, None, |info| {
        need(out.0)?;
        let v = value(info)?;
        // SAFETY: checked non-null; valid for a write per `Out::new`'s contract.
        unsafe { put(out.0, v) }
    })
}

/// The body of an export that runs wholly on the driver state, locked and checked initialized
/// first, logged as `function` with no stream or pointer.
pub(crate) fn with_state(
    function: &'static str,
    body: impl FnOnce(&mut crate::state::State) -> Res,
) -> cuda_sys::CUresult {
    crate::log::entry(function, None, None, |_| {
        body(&mut *crate::state::initialized()?)
    })
}

/// Reads `*p`, refusing null.
///
/// # Safety
/// `p` is null or valid for a read of `T`.
pub(crate) unsafe fn get<T>(p: *const T) -> Res<T> {
    need(p)?;
    // SAFETY: non-null, valid per the contract.
    Ok(unsafe { p.read_unaligned() })
}

/// Reads an array of `n` items (null with `n == 0` is an empty array).
///
/// # Safety
/// `p` is valid for `n` reads of `T` when `n > 0`.
pub(crate) unsafe fn get_slice<T: Copy>(p: *const T, n: usize) -> Res<Vec<T>> {
    if n == 0 {
        return Ok(Vec::new());
    }
    need(p)?;
    // SAFETY: valid for n reads per the contract.
    Ok((0..n)
        .map(|i| unsafe { p.add(i).read_unaligned() })
        .collect())
}

/// The context a call names: `ctx`, which must be live, or the calling thread's current context
/// for NULL (the `_v2` context queries, conditional handles and nodes).
pub(crate) fn context_arg(st: &crate::state::State, ctx: cuda_sys::types::CUcontext) -> Res<u64> {
    match ctx as u64 {
        0 => st.current_ctx(),
        c => st.live_context(c),
    }
}

/// Waits for the work of the context `which` picks (holding no lock) and records that the host
/// has seen it complete; refused where a capture forbids it (the body of `cuCtxSynchronize` and
/// its `_v2` form).
pub(crate) fn synchronize_context(which: impl FnOnce(&crate::state::State) -> Res<u64>) -> Res {
    let (deps, clock) = {
        let mut st = crate::state::initialized()?;
        let ctx = which(&st)?;
        st.check_unsafe_call()?;
        st.context_targets(ctx)
    };
    wait_and_observe(&deps, &clock);
    Ok(())
}

/// Waits (holding no lock) for `deps`, then records that the host has seen `clock` complete.
pub(crate) fn wait_and_observe(deps: &[crate::exec::Dep], clock: &crate::clock::VectorClock) {
    crate::exec::wait_all(deps);
    crate::state::state().host_observed(clock);
}

// BEGIN EXTRA EXPORTS (every export beyond custody's loader list, for `cuGetProcAddress`)
extra_exports! {
    cuCtxGetDevice_v2
    cuCtxGetFlags
    cuCtxGetId
    cuCtxGetStreamPriorityRange
    cuCtxSynchronize_v2
    cuDeviceGetGraphMemAttribute
    cuDeviceGetUuid
    cuDeviceGetUuid_v2
    cuDeviceGraphMemTrim
    cuDeviceSetGraphMemAttribute
    cuDeviceTotalMem_v2
    cuEventElapsedTime
    cuEventElapsedTime_v2
    cuEventRecordWithFlags
    cuGetExportTable
    cuIpcGetEventHandle
    cuIpcOpenEventHandle
    cuGraphAddDependencies
    cuGraphAddDependencies_v2
    cuGraphAddEventRecordNode
    cuGraphAddEventWaitNode
    cuGraphAddNode
    cuGraphAddNode_v2
    cuGraphConditionalHandleCreate
    cuGraphEventRecordNodeGetEvent
    cuGraphEventWaitNodeGetEvent
    cuGraphExecGetFlags
    cuGraphGetEdges
    cuGraphGetEdges_v2
    cuGraphGetNodes
    cuGraphGetRootNodes
    cuGraphInstantiateWithParams
    cuGraphNodeGetDependencies
    cuGraphNodeGetDependencies_v2
    cuGraphNodeGetDependentNodes
    cuGraphNodeGetDependentNodes_v2
    cuGraphNodeGetType
    cuGraphRemoveDependencies
    cuGraphRemoveDependencies_v2
    cuGraphUpload
    cuMemAdvise
    cuMemAdvise_v2
    cuMemDiscardAndPrefetchBatchAsync
    cuMemDiscardBatchAsync
    cuMemGetAddressRange_v2
    cuMemGetDefaultMemPool
    cuMemGetMemPool
    cuMemHostRegister
    cuMemHostRegister_v2
    cuMemHostUnregister
    cuMemPrefetchAsync
    cuMemPrefetchAsync_v2
    cuMemPrefetchBatchAsync
    cuMemRangeGetAttribute
    cuMemRangeGetAttributes
    cuMemSetMemPool
    cuStreamBeginCaptureToGraph
    cuStreamGetCaptureInfo_v3
    cuStreamUpdateCaptureDependencies
    cuStreamUpdateCaptureDependencies_v2
    cuStreamGetCtx_v2
    cuStreamGetDevice
    cuStreamGetId
}
// END EXTRA EXPORTS
