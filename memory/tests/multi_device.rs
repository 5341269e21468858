//! Two devices: memory of device 1 freed on a thread where device 0's primary
//! context is current must be freed in device 1's context and leave device 0's current. Pool
//! buffers (a created stream of device 1, or the legacy token bound while device 1's primary
//! context was current) dropped and closed; `cuMemAlloc` memory (the deferred D9 free); pinned
//! host memory (`cuMemAllocHost` and a host pool); one pool per device with its used memory
//! accounted on the right one; `set_deallocation_stream` to another device's stream refused;
//! copies between devices; a host pool used by both devices (every device is granted access to
//! a host pool); a device pool's peer access granted to device 1 and revoked
//! (`MemoryPoolHandle::set_access`); IPC of a device-1 pool into a child process that frees its import in device 1's
//! context; a device-1 graph that retains a device-1 buffer, released by deferred cleanup while
//! device 0 is current.
//!
//! Runs on the emulator (two devices by default) and on a real driver: everywhere the current
//! context before and after, the bytes read back, pools' `USED_MEM_CURRENT` and pointer
//! attributes; on the emulator also which context was current during each free and which stream
//! it ran on (the call log), hazards and live allocations. With fewer than two devices every
//! test prints "skipped: needs a second device (the driver sees N)" and returns.

mod common;

use std::io::{ErrorKind, Read, Write};
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use handles::PoolAttribute;
use handles::{ContextHandle, EventFlags, EventHandle, MemoryPoolHandle, StreamHandle};
use memory::{
    Buffer, DeviceMemoryResource, DeviceMemoryResourceOptions, Graph, IpcBufferDescriptor,
    LegacyPinnedMemoryResource, MemoryError, MemoryResource, PinnedMemoryResource,
    PinnedMemoryResourceOptions, PoolMemoryResource, SynchronousMemoryResource,
};
use sendfd::{RecvWithFd, SendWithFd};
use test_support::emu::{Call, Emulator};

const SIZE: usize = 4096;

/// Set in the IPC child process to the path of the parent's socket.
const IPC_CHILD: &str = "CUSTODY_MEMORY_MULTI_DEVICE_IPC_CHILD";

/// Whether the driver sees two devices; when not, prints the stated skip line.
fn two_devices() -> bool {
    let count = handles::device_count().expect("cuDeviceGetCount");
    if count < 2 {
        eprintln!("skipped: needs a second device (the driver sees {count})");
    }
    count >= 2
}

fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(29) ^ seed)
        .collect()
}

/// `pool`'s `USED_MEM_CURRENT` in bytes once device `device`'s primary context has finished
/// its work, read on a helper thread (the caller's binding is untouched).
fn used_on(device: i32, pool: &MemoryPoolHandle) -> u64 {
    let pool = pool.clone();
    on_fresh_thread(move || {
        let context = primary(device);
        context.make_current().expect("cuCtxSetCurrent");
        context.synchronize().expect("cuCtxSynchronize");
        let used = pool
            .attribute(PoolAttribute::USED_MEM_CURRENT)
            .expect("cuMemPoolGetAttribute(USED_MEM_CURRENT)");
        ContextHandle::clear_current().expect("cuCtxSetCurrent(NULL)");
        used
    })
}

/// A resource with a pool of its own on `device`: its used memory starts at 0 and only the
/// calling test changes it.
fn owned_pool(device: i32) -> Arc<DeviceMemoryResource> {
    DeviceMemoryResource::with_options(device, DeviceMemoryResourceOptions::default())
        .expect("a pool of its own")
}

/// What [`under_device_0`] saw: the thread's id in the call log, the calls `f` made (from
/// `from`, before `to`) and the context current when `f` was done.
struct Span {
    thread: u64,
    from: u64,
    to: u64,
    after: u64,
}

/// Runs `f` on a fresh thread with device 0's primary context current.
fn under_device_0<R: Send + 'static>(f: impl FnOnce() -> R + Send + 'static) -> (R, Span) {
    on_fresh_thread(move || {
        primary(0)
            .make_current()
            .expect("cuCtxSetCurrent(device 0)");
        let (thread, from) = (tid(), mark());
        let result = f();
        let (to, after) = (mark(), current_raw());
        ContextHandle::clear_current().expect("cuCtxSetCurrent(NULL)");
        (
            result,
            Span {
                thread,
                from,
                to,
                after,
            },
        )
    })
}

/// On the emulator: the context switches and frees `span` made, with the context current
/// during each.
fn switches_and_frees(emu: &Emulator, span: &Span) -> Vec<(String, u64)> {
    emu.calls_since(span.from)
        .into_iter()
        .filter(|c| {
            c.thread == span.thread
                && c.seq < span.to
                && matches!(
                    c.function.as_str(),
                    "cuCtxSetCurrent" | "cuMemFreeAsync" | "cuMemFree_v2" | "cuMemFreeHost"
                )
        })
        .map(|c| (c.function, c.context))
        .collect()
}

/// On the emulator: the one call of `function` for allocation `id` since `from`, asserted to
/// have succeeded without a context switch of its own (docs/decisions.md D2: a free on a created
/// stream needs no context, docs/driver-facts.md F4, F8): the calls before it on its thread do
/// not end with custody's switch (`cuCtxGetCurrent`, `cuCtxSetCurrent`).
fn assert_freed_without_a_switch(
    emu: &Emulator,
    function: &str,
    id: AllocationId,
    from: u64,
) -> Call {
    let call = emu.only_call(function, id, from);
    assert_eq!(call.result, 0, "{call:?}");
    let before: Vec<String> = emu
        .calls()
        .into_iter()
        .filter(|c| c.thread == call.thread && c.seq < call.seq)
        .map(|c| c.function)
        .collect();
    assert!(
        !before.ends_with(&["cuCtxGetCurrent".to_owned(), "cuCtxSetCurrent".to_owned()]),
        "{function} needed no context switch: {before:?}"
    );
    call
}

/// On the emulator: the one call of `function` for allocation `id` since `from`, asserted to
/// have run with `context` current and to have succeeded.
fn assert_ran_in(
    emu: &Emulator,
    function: &str,
    id: AllocationId,
    from: u64,
    context: u64,
) -> Call {
    let call = emu.only_call(function, id, from);
    assert_eq!(
        call.context, context,
        "{function} ran with context 0x{:x} current, not 0x{context:x}",
        call.context
    );
    assert_eq!(call.result, 0, "{call:?}");
    call
}

/// How a device-1 buffer's recipe is recorded.
#[derive(Debug, Clone, Copy)]
enum Recipe {
    /// A created stream of device 1.
    Stream,
    /// The legacy token, bound while device 1's primary context is current.
    LegacyToken,
}

/// Allocates `SIZE` bytes from `mr` (a pool of device 1) with the recipe `how`, on a thread
/// with no context; the allocation and `pattern(seed)` are complete on return. Returns the
/// buffer, its recipe's stream and, on the emulator, the allocation's call.
fn device_1_buffer(
    mr: &Arc<DeviceMemoryResource>,
    how: Recipe,
    seed: u8,
) -> (Buffer, StreamHandle, Option<Call>) {
    let ctx1 = primary(1);
    let (me, from) = (tid(), mark());
    let (buffer, stream) = match how {
        Recipe::Stream => {
            let s1 = stream_on(1);
            (Arc::clone(mr).allocate(SIZE, &s1).unwrap(), s1)
        }
        Recipe::LegacyToken => {
            ctx1.make_current().unwrap();
            let buffer = mr.allocate(SIZE, &StreamHandle::legacy()).unwrap();
            ContextHandle::clear_current().unwrap();
            let recorded = buffer.deallocation_stream().unwrap();
            (buffer, recorded)
        }
    };
    let recipe = buffer
        .handle()
        .clone()
        .recipe()
        .expect("a pool buffer has a recipe");
    assert_eq!(
        recipe.context().raw(),
        ctx1.raw(),
        "{how:?}: bound to device 1"
    );
    assert_eq!(buffer.device_id(), Ok(Some(1)));
    // The recorded token means nothing without a current context: work on device 1's legacy
    // stream through a bound token.
    let work = StreamHandle::bound_default_stream(handles::DefaultStream::Legacy, &ctx1);
    let work = if stream.default_kind().is_some() {
        &work
    } else {
        &stream
    };
    buffer.copy_from_host(&pattern(seed, SIZE), work).unwrap();
    assert_eq!(read(&buffer, work), pattern(seed, SIZE));
    let alloc = with_emulator(|emu| {
        let allocs = emu.calls_named_on("cuMemAllocFromPoolAsync", me, from);
        assert_eq!(allocs.len(), 1, "{allocs:#?}");
        // D2: on device 1's created stream the allocation makes no context current (this
        // thread has none); the token's is made in device 1's context.
        let expected = match how {
            Recipe::Stream => 0,
            Recipe::LegacyToken => ctx1.raw() as u64,
        };
        assert_eq!(
            allocs[0].context, expected,
            "{how:?}: allocated with the right context current"
        );
        allocs.into_iter().next().unwrap()
    });
    (buffer, stream, alloc)
}

/// A device-1 pool buffer freed on a thread where device 0's primary context is current, by
/// a drop (`close == false`) or an explicit close: freed, in device 1's context, on the
/// recipe's stream; device 0's context current afterwards.
fn pool_free_under_device_0(how: Recipe, close: bool) {
    let (ctx0, ctx1) = (primary(0), primary(1));
    let mr = owned_pool(1);
    let (buffer, stream, alloc) = device_1_buffer(&mr, how, 3);
    let ptr = buffer.ptr();
    let id = alloc_of(ptr);
    assert!(used_on(1, mr.pool()) >= SIZE as u64);
    let from = mark();
    let (closed, span) = under_device_0(move || {
        if close {
            buffer.close()
        } else {
            drop(buffer);
            Ok(())
        }
    });
    assert_eq!(closed, Ok(()), "{how:?}");
    assert_eq!(
        span.after,
        ctx0.raw() as u64,
        "{how:?}: device 0's context current again"
    );
    assert_eq!(
        used_on(1, mr.pool()),
        0,
        "{how:?}: freed into device 1's pool"
    );
    assert!(errors_for(ptr).is_empty(), "{:?}", errors_for(ptr));
    with_emulator(|emu| {
        // D2: a created stream's free runs with the dropping thread's own context (device 0's)
        // and no switch (F8); a token's needs device 1's context made current.
        let (c0, c1) = (ctx0.raw() as u64, ctx1.raw() as u64);
        let expected = match how {
            Recipe::Stream => c0,
            Recipe::LegacyToken => c1,
        };
        let free = assert_ran_in(emu, "cuMemFreeAsync", id, from, expected);
        assert_eq!(free.thread, span.thread, "freed by the dropping thread");
        assert_eq!(
            free.stream,
            Some(stream.raw() as u64),
            "on the recipe's stream"
        );
        assert_eq!(
            free.resolved_stream,
            alloc.as_ref().unwrap().resolved_stream,
            "{how:?}: the stream the allocation was ordered on"
        );
        let expected = match how {
            Recipe::Stream => vec![("cuMemFreeAsync".to_owned(), c0)],
            Recipe::LegacyToken => vec![
                ("cuCtxSetCurrent".to_owned(), c0),
                ("cuMemFreeAsync".to_owned(), c1),
                ("cuCtxSetCurrent".to_owned(), c1),
            ],
        };
        assert_eq!(
            switches_and_frees(emu, &span),
            expected,
            "{how:?}: a token's free makes device 1 current and restores device 0; a created \
             stream's switches nothing"
        );
        assert!(!emu.is_live(id));
    });
    assert_no_hazards();
}

#[test]
fn device_1_pool_buffer_dropped_under_device_0_is_freed_in_device_1s_context() {
    let _serial = start();
    if !two_devices() {
        return;
    }
    pool_free_under_device_0(Recipe::Stream, false);
    pool_free_under_device_0(Recipe::LegacyToken, false);
}

#[test]
fn device_1_pool_buffer_closed_under_device_0_is_freed_in_device_1s_context() {
    let _serial = start();
    if !two_devices() {
        return;
    }
    pool_free_under_device_0(Recipe::Stream, true);
    pool_free_under_device_0(Recipe::LegacyToken, true);
}

/// A synchronously freed device-1 buffer (`cuMemAlloc` or `cuMemAllocHost`) dropped on a
/// thread where device 0 is current: the drop records an event in device 1's context and
/// makes no blocking call; deferred cleanup frees it with `free_call` in device 1's context;
/// device 0 stays current on the dropping thread, and on this one across the drain.
fn deferred_free_under_device_0(buffer: Buffer, free_call: &'static str) {
    let (ctx0, ctx1) = (primary(0), primary(1));
    let ptr = buffer.ptr();
    let id = alloc_of(ptr);
    let stream = buffer.deallocation_stream().unwrap();
    assert!(attributes(ptr).is_some());
    let from = mark();
    let ((), span) = under_device_0(move || drop(buffer));
    let dropper = span.thread;
    assert_eq!(
        span.after,
        ctx0.raw() as u64,
        "device 0's context current after the drop"
    );
    with_emulator(|emu| {
        let on_dropper: Vec<Call> = emu
            .calls_since(from)
            .into_iter()
            .filter(|c| c.thread == dropper)
            .collect();
        let record = on_dropper
            .iter()
            .find(|c| c.function == "cuEventRecord")
            .unwrap_or_else(|| panic!("the drop recorded no event: {on_dropper:#?}"));
        assert_eq!(record.context, ctx1.raw() as u64, "the event is device 1's");
        assert_eq!(
            record.stream,
            Some(stream.raw() as u64),
            "on the recipe's stream"
        );
        for blocking in [
            "cuMemFree_v2",
            "cuMemFreeHost",
            "cuStreamSynchronize",
            "cuEventSynchronize",
            "cuCtxSynchronize",
        ] {
            assert!(
                !on_dropper.iter().any(|c| c.function == blocking),
                "the drop called {blocking}"
            );
        }
    });
    ctx0.make_current().unwrap();
    handles::drain_deferred_cleanup();
    assert_eq!(
        current_raw(),
        ctx0.raw() as u64,
        "the drain left device 0 current"
    );
    ContextHandle::clear_current().unwrap();
    assert!(
        attributes(ptr).is_none(),
        "freed: the driver no longer knows the address"
    );
    assert!(errors_for(ptr).is_empty(), "{:?}", errors_for(ptr));
    with_emulator(|emu| {
        let free = assert_ran_in(emu, free_call, id, from, ctx1.raw() as u64);
        assert_ne!(
            free.thread, dropper,
            "freed by the cleanup worker or a drain"
        );
        assert!(!emu.is_live(id));
    });
    assert_no_hazards();
}

#[test]
fn device_1_cumemalloc_buffer_dropped_under_device_0_is_freed_later_in_device_1s_context() {
    let _serial = start();
    if !two_devices() {
        return;
    }
    let (ctx0, ctx1) = (primary(0), primary(1));
    let mr = SynchronousMemoryResource::new(1).unwrap();
    // A created stream of device 1 becomes the recipe's stream.
    let s1 = stream_on(1);
    let on_stream = mr.allocate(SIZE, &s1).unwrap();
    assert!(on_stream.deallocation_stream().unwrap().ptr_eq(&s1));
    on_stream.copy_from_host(&pattern(5, SIZE), &s1).unwrap();
    assert_eq!(read(&on_stream, &s1), pattern(5, SIZE));
    deferred_free_under_device_0(on_stream, "cuMemFree_v2");
    // A token while device 0 is current: replaced by the legacy stream bound to device 1.
    ctx0.make_current().unwrap();
    let on_token = mr.allocate(SIZE, &StreamHandle::legacy()).unwrap();
    assert_eq!(current_raw(), ctx0.raw() as u64);
    ContextHandle::clear_current().unwrap();
    let recipe = on_token.handle().clone().recipe().unwrap();
    assert_eq!(
        recipe.context().raw(),
        ctx1.raw(),
        "bound to device 1's context"
    );
    assert_eq!(on_token.device_id(), Ok(Some(1)));
    deferred_free_under_device_0(on_token, "cuMemFree_v2");
    // An explicit close under device 0 frees now, in device 1's context.
    let closed = mr.allocate(SIZE, &s1).unwrap();
    let ptr = closed.ptr();
    let id = alloc_of(ptr);
    let from = mark();
    let (result, span) = under_device_0(move || closed.close());
    assert_eq!(result, Ok(()));
    assert_eq!(
        span.after,
        ctx0.raw() as u64,
        "device 0's context current after the close"
    );
    assert!(attributes(ptr).is_none(), "freed by the close itself");
    with_emulator(|emu| {
        // D2: `cuStreamSynchronize` of a created stream and `cuMemFree` need no context (F5,
        // F6): device 0's stays current, unswitched.
        let free = assert_ran_in(emu, "cuMemFree_v2", id, from, ctx0.raw() as u64);
        assert_freed_without_a_switch(emu, "cuMemFree_v2", id, from);
        assert_eq!(
            free.thread, span.thread,
            "the close freed on its own thread"
        );
    });
    assert_no_hazards();
}

#[test]
fn device_1_pinned_buffers_dropped_under_device_0_are_freed_in_device_1s_context() {
    let _serial = start();
    if !two_devices() {
        return;
    }
    let (ctx0, _ctx1) = (primary(0), primary(1));
    let s1 = stream_on(1);
    // cuMemAllocHost in device 1's context: the deferred cuMemFreeHost runs there too.
    let legacy = LegacyPinnedMemoryResource::new()
        .allocate(SIZE, &s1)
        .unwrap();
    assert_eq!(legacy.is_host_accessible(), Ok(true));
    legacy.copy_from_host(&pattern(7, SIZE), &s1).unwrap();
    assert_eq!(read(&legacy, &s1), pattern(7, SIZE));
    deferred_free_under_device_0(legacy, "cuMemFreeHost");

    // A host pool, allocated on device 1's stream: a stream-ordered free in device 1's context.
    let mr = PinnedMemoryResource::new(PinnedMemoryResourceOptions::default()).unwrap();
    let pooled = mr.allocate(SIZE, &s1).unwrap();
    let ptr = pooled.ptr();
    let id = alloc_of(ptr);
    pooled.copy_from_host(&pattern(8, SIZE), &s1).unwrap();
    assert_eq!(read(&pooled, &s1), pattern(8, SIZE));
    assert!(used_on(1, mr.pool()) >= SIZE as u64);
    let from = mark();
    let ((), span) = under_device_0(move || drop(pooled));
    assert_eq!(span.after, ctx0.raw() as u64);
    assert_eq!(used_on(1, mr.pool()), 0, "back in the host pool");
    with_emulator(|emu| {
        // D2: on device 1's created stream, with device 0's context current, no switch (F8).
        let free = assert_ran_in(emu, "cuMemFreeAsync", id, from, ctx0.raw() as u64);
        assert_freed_without_a_switch(emu, "cuMemFreeAsync", id, from);
        assert_eq!(free.thread, span.thread);
        assert_eq!(free.stream, Some(s1.raw() as u64));
        assert!(!emu.is_live(id));
    });
    assert_no_hazards();
}

#[test]
fn each_device_has_its_own_pool_and_usage_is_accounted_on_it() {
    let _serial = start();
    if !two_devices() {
        return;
    }
    let (mr0, mr1) = (
        DeviceMemoryResource::new(0).unwrap(),
        DeviceMemoryResource::new(1).unwrap(),
    );
    assert_ne!(
        mr0.pool().raw(),
        mr1.pool().raw(),
        "one current pool per device"
    );
    assert_eq!(mr0.pool().device(), Some(0));
    assert_eq!(mr1.pool().device(), Some(1));
    let (s0, s1) = (stream_on(0), stream_on(1));
    let (base0, base1) = (used_on(0, mr0.pool()), used_on(1, mr1.pool()));

    const BIG: usize = 1 << 20;
    let on1 = mr1.allocate(BIG, &s1).unwrap();
    assert_eq!(on1.device_id(), Ok(Some(1)));
    assert_eq!(attributes(on1.ptr()).map(|a| a.device_ordinal), Some(1));
    assert!(
        used_on(1, mr1.pool()) >= base1 + BIG as u64,
        "counted on device 1's pool"
    );
    assert_eq!(used_on(0, mr0.pool()), base0, "not on device 0's");
    let on0 = mr0.allocate(BIG / 2, &s0).unwrap();
    assert!(used_on(0, mr0.pool()) >= base0 + (BIG / 2) as u64);
    let with1 = used_on(1, mr1.pool());
    on0.close().unwrap();
    assert_eq!(used_on(0, mr0.pool()), base0, "device 0's back to baseline");
    assert_eq!(used_on(1, mr1.pool()), with1, "device 1's untouched");
    drop(on1);
    assert_eq!(used_on(1, mr1.pool()), base1, "device 1's back to baseline");

    // Pools of their own, one per device, account the same way.
    let (own0, own1) = (owned_pool(0), owned_pool(1));
    assert_ne!(own0.pool().raw(), own1.pool().raw());
    let a = own1.allocate(SIZE, &s1).unwrap();
    let a_id = alloc_of(a.ptr());
    assert!(used_on(1, own1.pool()) >= SIZE as u64);
    assert_eq!(used_on(0, own0.pool()), 0);
    // A pool of device 1 refuses a stream of device 0.
    assert_eq!(
        own1.allocate(SIZE, &s0).map(|_| ()),
        Err(MemoryError::Handle(handles::HandleError::WrongDevice {
            expected: 1,
            found: 0
        }))
    );
    a.close().unwrap();
    assert_eq!(used_on(1, own1.pool()), 0);
    with_emulator(|emu| assert!(!emu.is_live(a_id)));
    assert_no_hazards();
}

#[test]
fn a_stream_of_another_device_is_refused_as_deallocation_stream() {
    let _serial = start();
    if !two_devices() {
        return;
    }
    let (ctx0, ctx1) = (primary(0), primary(1));
    let (s0, s1) = (stream_on(0), stream_on(1));
    let mr = owned_pool(1);
    let buffer = mr.allocate(SIZE, &s1).unwrap();
    let ptr = buffer.ptr();
    let id = alloc_of(ptr);
    buffer.copy_from_host(&pattern(9, SIZE), &s1).unwrap();
    s1.synchronize().unwrap();
    let from = mark();
    let wrong = Err(MemoryError::Handle(handles::HandleError::WrongDevice {
        expected: 1,
        found: 0,
    }));
    assert_eq!(buffer.set_deallocation_stream(&s0), wrong);
    // A token bound to device 0's context, and an unbound one while device 0 is current.
    let bound0 = StreamHandle::bound_default_stream(handles::DefaultStream::Legacy, &ctx0);
    assert_eq!(buffer.set_deallocation_stream(&bound0), wrong);
    ctx0.make_current().unwrap();
    assert_eq!(
        buffer.set_deallocation_stream(&StreamHandle::legacy()),
        wrong
    );
    assert_eq!(current_raw(), ctx0.raw() as u64);
    ContextHandle::clear_current().unwrap();
    // Unchanged: open, same recipe, same bytes, still allocated.
    assert_eq!(buffer.ptr(), ptr);
    assert!(buffer.deallocation_stream().unwrap().ptr_eq(&s1));
    assert_eq!(
        buffer.handle().clone().recipe().unwrap().context().raw(),
        ctx1.raw()
    );
    assert!(used_on(1, mr.pool()) >= SIZE as u64);
    assert_eq!(read(&buffer, &s1), pattern(9, SIZE));
    with_emulator(|emu| {
        assert_eq!(
            emu.count_calls("cuMemFreeAsync", id, from),
            0,
            "nothing freed"
        );
        assert!(emu.is_live(id));
    });

    // The reverse: device 0's memory refuses device 1's stream.
    let mr0 = owned_pool(0);
    let on0 = mr0.allocate(SIZE, &s0).unwrap();
    assert_eq!(
        on0.set_deallocation_stream(&s1),
        Err(MemoryError::Handle(handles::HandleError::WrongDevice {
            expected: 0,
            found: 1
        }))
    );
    assert!(on0.deallocation_stream().unwrap().ptr_eq(&s0));
    on0.close().unwrap();
    assert_eq!(used_on(0, mr0.pool()), 0);

    // Another stream of device 1 is accepted; the hand-off is ordered by an event, and the
    // free then runs on it, in device 1's context, under device 0.
    let other1 = stream_on(1);
    let ready = EventHandle::create(&ctx1, EventFlags::DISABLE_TIMING).unwrap();
    ready.record(&s1).unwrap();
    other1.wait_event(&ready).unwrap();
    buffer.set_deallocation_stream(&other1).unwrap();
    assert!(buffer.deallocation_stream().unwrap().ptr_eq(&other1));
    let from = mark();
    let ((), span) = under_device_0(move || drop(buffer));
    assert_eq!(span.after, ctx0.raw() as u64);
    assert_eq!(used_on(1, mr.pool()), 0);
    with_emulator(|emu| {
        // D2: a created stream of device 1 needs no switch under device 0 (F8).
        let free = assert_ran_in(emu, "cuMemFreeAsync", id, from, ctx0.raw() as u64);
        assert_freed_without_a_switch(emu, "cuMemFreeAsync", id, from);
        assert_eq!(free.stream, Some(other1.raw() as u64));
    });
    assert_no_hazards();
}

#[test]
fn copies_between_devices_read_back_the_right_bytes() {
    let _serial = start();
    if !two_devices() {
        return;
    }
    let ctx0 = primary(0);
    let (s0, s1) = (stream_on(0), stream_on(1));
    let (mr0, mr1) = (owned_pool(0), owned_pool(1));
    let on0 = mr0.allocate(SIZE, &s0).unwrap();
    let on1 = mr1.allocate(SIZE, &s1).unwrap();

    // Device 0 -> device 1, on device 1's stream, with device 0's context current.
    on0.copy_from_host(&pattern(11, SIZE), &s0).unwrap();
    s0.synchronize().unwrap(); // ordering across streams is the caller's job
    ctx0.make_current().unwrap();
    on0.copy_to(&on1, &s1).unwrap();
    assert_eq!(current_raw(), ctx0.raw() as u64, "the binding is untouched");
    ContextHandle::clear_current().unwrap();
    assert_eq!(read(&on1, &s1), pattern(11, SIZE));

    // Device 1 -> device 0, on device 0's stream.
    on1.copy_from_host(&pattern(12, SIZE), &s1).unwrap();
    s1.synchronize().unwrap();
    on0.copy_from(&on1, &s0).unwrap();
    assert_eq!(read(&on0, &s0), pattern(12, SIZE));

    // A new buffer from device 1's resource, copied on device 1's stream, then back.
    let copy = on1.copy_to_new(&s1).unwrap();
    assert_eq!(copy.device_id(), Ok(Some(1)));
    assert_eq!(read(&copy, &s1), pattern(12, SIZE));

    // Fills on each device, seen by the other.
    on1.fill(0xA5u8, &s1).unwrap();
    s1.synchronize().unwrap();
    on1.copy_to(&on0, &s0).unwrap();
    assert_eq!(read(&on0, &s0), vec![0xA5; SIZE]);

    for b in [on0, on1, copy] {
        b.close().unwrap();
    }
    s0.synchronize().unwrap();
    s1.synchronize().unwrap();
    assert_eq!(used_on(0, mr0.pool()), 0);
    assert_eq!(used_on(1, mr1.pool()), 0);
    assert_no_hazards();
}

#[test]
fn a_host_pool_is_used_by_both_devices() {
    let _serial = start();
    if !two_devices() {
        return;
    }
    // The memory crate grants every device access to a host pool (cuMemPoolSetAccess when
    // the pool is made) and has no setter for a device pool's peer access, so this is the
    // pool access it offers across devices.
    let (_ctx0, ctx1) = (primary(0), primary(1));
    let (s0, s1) = (stream_on(0), stream_on(1));
    let host = PinnedMemoryResource::new(PinnedMemoryResourceOptions::default()).unwrap();
    let shared = host.allocate(SIZE, &s1).unwrap();
    assert_eq!(shared.device_id(), Ok(None));
    let ptr = shared.ptr();
    let id = alloc_of(ptr);
    // Written by device 0's stream, read into device 1's memory on device 1's stream.
    s1.synchronize().unwrap();
    shared.fill(0x3Cu8, &s0).unwrap();
    s0.synchronize().unwrap();
    let mr1 = owned_pool(1);
    let on1 = mr1.allocate(SIZE, &s1).unwrap();
    shared.copy_to(&on1, &s1).unwrap();
    assert_eq!(read(&on1, &s1), vec![0x3C; SIZE]);
    // And the other way, device 1 writing, device 0 reading.
    on1.copy_from_host(&pattern(13, SIZE), &s1).unwrap();
    shared.copy_from(&on1, &s1).unwrap();
    s1.synchronize().unwrap();
    assert_eq!(read(&shared, &s0), pattern(13, SIZE));
    // Host memory takes a deallocation stream of either device; device 0's, under device 1.
    shared.set_deallocation_stream(&s0).unwrap();
    let from = mark();
    ctx1.make_current().unwrap();
    drop(shared);
    assert_eq!(
        current_raw(),
        ctx1.raw() as u64,
        "device 1's context current again"
    );
    ContextHandle::clear_current().unwrap();
    assert_eq!(used_on(0, host.pool()), 0);
    with_emulator(|emu| {
        // D2: device 0's created stream needs no switch under device 1 (F8).
        let free = assert_ran_in(emu, "cuMemFreeAsync", id, from, ctx1.raw() as u64);
        assert_freed_without_a_switch(emu, "cuMemFreeAsync", id, from);
        assert_eq!(free.stream, Some(s0.raw() as u64));
    });
    on1.close().unwrap();
    assert_eq!(used_on(1, mr1.pool()), 0);
    assert_no_hazards();
}

/// Drains deferred cleanup until `done()` holds: on a GPU a graph's user-object destructor may
/// still be on its way from a driver thread (docs/driver-facts.md G3), so this polls, for at most a
/// minute, before failing. Not a timing assertion: the limit only bounds a hang.
fn drain_until(mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        handles::drain_deferred_cleanup();
        if done() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "deferred cleanup did not complete"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn a_device_1_graph_releases_its_buffer_in_device_1s_context_while_device_0_is_current() {
    let _serial = start();
    if !two_devices() {
        return;
    }
    let (ctx0, ctx1) = (primary(0), primary(1));
    let s1 = stream_on(1);
    let mr = owned_pool(1);
    let buffer = mr.allocate(SIZE, &s1).unwrap();
    let ptr = buffer.ptr();
    let id = alloc_of(ptr);
    let graph = Graph::new(1).unwrap();
    assert_eq!(graph.device_id(), 1);
    assert_eq!(graph.context().raw(), ctx1.raw());
    graph.add_memset(&[], &buffer, 0x5Au8).unwrap();
    // A device-0 graph refuses device 1's memory.
    assert_eq!(
        Graph::new(0)
            .unwrap()
            .add_memset(&[], &buffer, 1u8)
            .map(|_| ()),
        Err(MemoryError::Handle(handles::HandleError::WrongDevice {
            expected: 1,
            found: 0
        }))
    );
    let exec = graph.instantiate().unwrap();
    exec.launch(&s1).unwrap();
    assert_eq!(read(&buffer, &s1), vec![0x5A; SIZE]);

    // Everything below with device 0's context current on this thread.
    ctx0.make_current().unwrap();
    let from = mark();
    buffer.close().unwrap(); // the graph still retains the memory
    assert!(
        used_on(1, mr.pool()) >= SIZE as u64,
        "retained by the graph"
    );
    with_emulator(|emu| {
        assert_eq!(emu.count_calls("cuMemFreeAsync", id, from), 0);
        assert!(emu.is_live(id));
    });
    graph.close();
    exec.launch(&s1).unwrap(); // the executable still retains it
    s1.synchronize().unwrap();
    exec.close();
    drain_until(|| used_on(1, mr.pool()) == 0);
    assert_eq!(
        current_raw(),
        ctx0.raw() as u64,
        "device 0's context current throughout"
    );
    assert!(errors_for(ptr).is_empty(), "{:?}", errors_for(ptr));
    ContextHandle::clear_current().unwrap();
    with_emulator(|emu| {
        // D2: freed by the worker or a drain on device 1's created stream, without switching
        // to device 1's context (F4, F8).
        let free = assert_freed_without_a_switch(emu, "cuMemFreeAsync", id, from);
        assert_eq!(
            free.stream,
            Some(s1.raw() as u64),
            "on the buffer's recipe stream"
        );
        assert!(!emu.is_live(id));
    });
    assert_no_hazards();
}

fn ipc_resource_on_1() -> Arc<DeviceMemoryResource> {
    DeviceMemoryResource::with_options(
        1,
        DeviceMemoryResourceOptions {
            max_size: 0,
            ipc_enabled: true,
        },
    )
    .expect("an IPC-enabled pool on device 1")
}

#[test]
fn a_device_1_ipc_buffer_is_freed_in_the_importers_device_1_context() {
    if let Some(path) = std::env::var_os(IPC_CHILD) {
        return ipc_child(&path);
    }
    let _serial = start();
    if !two_devices() {
        return;
    }
    let s1 = stream_on(1);
    let mr = ipc_resource_on_1();
    let buffer = mr.allocate(SIZE, &s1).unwrap();
    buffer.copy_from_host(&pattern(21, SIZE), &s1).unwrap();
    s1.synchronize().unwrap();
    let descriptor = buffer.ipc_descriptor().unwrap();
    assert_eq!(descriptor.device_id(), Some(1));
    assert_eq!(descriptor.size(), SIZE);
    let pool_fd = mr.export_pool().unwrap();

    let path = std::env::temp_dir().join(format!(
        "custody-multi-device-ipc-{}.sock",
        std::process::id()
    ));
    let _ = std::fs::remove_file(&path);
    let listener = UnixListener::bind(&path).unwrap();
    listener.set_nonblocking(true).unwrap();
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "a_device_1_ipc_buffer_is_freed_in_the_importers_device_1_context",
            "--exact",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(IPC_CHILD, &path)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn the child");
    let mut connection = loop {
        match listener.accept() {
            Ok((connection, _)) => break connection,
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                if child.try_wait().unwrap().is_some() {
                    let output = child.wait_with_output().unwrap();
                    panic!(
                        "the child exited before connecting: {}",
                        String::from_utf8_lossy(&output.stderr)
                    );
                }
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(e) => panic!("accept: {e}"),
        }
    };
    let _ = std::fs::remove_file(&path);
    connection.set_nonblocking(false).unwrap();
    let sent = connection
        .send_with_fd(&descriptor.to_bytes(), &[pool_fd.as_raw_fd()])
        .unwrap();
    assert_eq!(sent, IpcBufferDescriptor::LEN);
    drop(pool_fd);
    let mut reply = String::new();
    connection.read_to_string(&mut reply).unwrap();
    let output = child.wait_with_output().unwrap();
    assert!(
        output.status.success() && reply == "ok",
        "child failed ({}), replied {reply:?}:\n{}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    // The child wrote through the shared pool and freed its import before replying.
    assert_eq!(read(&buffer, &s1), pattern(22, SIZE));
    let ctx0 = primary(0);
    let ((), span) = under_device_0(move || drop(buffer));
    assert_eq!(span.after, ctx0.raw() as u64);
    assert_eq!(used_on(1, mr.pool()), 0);
    assert_no_hazards();
}

/// The importing side of the IPC test: runs in the child process. Imports the device-1
/// buffer on a stream of device 1, with device 0's context current on this thread, checks the
/// bytes, writes back, and drops the import there: freed in device 1's context, device 0's
/// current afterwards.
fn ipc_child(path: &std::ffi::OsStr) {
    let mut connection = UnixStream::connect(path).expect("connect to the parent");
    let mut bytes = [0u8; 2 * IpcBufferDescriptor::LEN];
    let mut fds = [-1; 1];
    let (n, nfds) = connection.recv_with_fd(&mut bytes, &mut fds).unwrap();
    assert_eq!((n, nfds), (IpcBufferDescriptor::LEN, 1));
    // SAFETY: `recv_with_fd` reported one descriptor received with SCM_RIGHTS; it is new in
    // this process and owned by nobody else.
    let pool_fd = unsafe { OwnedFd::from_raw_fd(fds[0]) };
    let descriptor = IpcBufferDescriptor::from_bytes(&bytes[..n]).unwrap();
    assert_eq!(descriptor.device_id(), Some(1));

    let (ctx0, ctx1) = (primary(0), primary(1));
    let (s0, s1) = (stream_on(0), stream_on(1));
    let mr = DeviceMemoryResource::import_pool(1, pool_fd.as_fd()).unwrap();
    drop(pool_fd);
    assert_eq!(mr.pool().device(), Some(1));
    assert_eq!(
        Buffer::from_ipc_descriptor(&mr, &descriptor, &s0).map(|_| ()),
        Err(MemoryError::Handle(handles::HandleError::WrongDevice {
            expected: 1,
            found: 0
        })),
        "a stream of device 0 cannot order the import of device 1's memory"
    );
    ctx0.make_current().unwrap();
    let import = Buffer::from_ipc_descriptor(&mr, &descriptor, &s1).unwrap();
    assert!(import.is_mapped());
    assert_eq!(import.device_id(), Ok(Some(1)));
    assert_eq!(read(&import, &s1), pattern(21, SIZE), "the parent's bytes");
    import.copy_from_host(&pattern(22, SIZE), &s1).unwrap();
    s1.synchronize().unwrap();
    let ptr = import.ptr();
    let id = alloc_of(ptr);
    let from = mark();
    let me = tid();
    drop(import);
    assert_eq!(
        current_raw(),
        ctx0.raw() as u64,
        "device 0's context current again"
    );
    // The free must complete before the exporter frees.
    s1.synchronize().unwrap();
    assert!(errors_for(ptr).is_empty(), "{:?}", errors_for(ptr));
    with_emulator(|emu| {
        let free = assert_ran_in(emu, "cuMemFreeAsync", id, from, ctx1.raw() as u64);
        assert_eq!(free.thread, me);
        assert_eq!(free.stream, Some(s1.raw() as u64));
        let hazards = emu.hazards();
        assert!(hazards.is_empty(), "hazards: {hazards:#?}");
    });
    ContextHandle::clear_current().unwrap();
    connection.write_all(b"ok").unwrap();
}

/// Peer access to a pool (`MemoryPoolHandle::access`, `set_access`): the pool's own device has
/// read-write access, device 1 none until granted, and none again once revoked; an empty change
/// makes no driver call.
#[test]
fn peer_access_to_a_pool_is_granted_and_revoked() {
    let _serial = start();
    if !two_devices() {
        return;
    }
    let mr = owned_pool(0);
    let pool = mr.pool();
    assert_eq!(pool.access(0).unwrap(), handles::MemAccess::ReadWrite);
    assert_eq!(pool.access(1).unwrap(), handles::MemAccess::None);
    let from = mark();
    pool.set_access(&[]).unwrap();
    with_emulator(|emu| assert!(emu.calls_named("cuMemPoolSetAccess", from).is_empty()));
    pool.set_access(&[(1, handles::MemAccess::ReadWrite)])
        .unwrap();
    assert_eq!(pool.access(1).unwrap(), handles::MemAccess::ReadWrite);
    pool.set_access(&[(1, handles::MemAccess::None)]).unwrap();
    assert_eq!(pool.access(1).unwrap(), handles::MemAccess::None);
}

/// A graph of device 0 launched (or uploaded) on a stream of device 1 is
/// refused before any driver call (`HandleError::WrongDevice`, as copies and `record_use`
/// refuse another device's stream), instead of being handed to the driver without a word.
#[test]
fn a_graph_is_not_launched_on_another_devices_stream() {
    let _serial = start();
    if !two_devices() {
        return;
    }
    let (s0, s1) = (stream_on(0), stream_on(1));
    let buffer = memory::DeviceMemoryResource::new(0)
        .unwrap()
        .allocate(256, &s0)
        .unwrap();
    let graph = memory::Graph::new(0).unwrap();
    graph.add_memset(&[], &buffer, 0x5au8).unwrap();
    let exec = graph.instantiate().unwrap();
    let me = test_support::tid();
    let from = mark();
    for refused in [
        exec.launch(&s1).unwrap_err(),
        exec.upload(&s1).unwrap_err(),
        graph.launch(&s1).unwrap_err(),
    ] {
        assert_eq!(
            refused,
            MemoryError::Handle(handles::HandleError::WrongDevice {
                expected: 0,
                found: 1
            })
        );
    }
    with_emulator(|emu| {
        let launches: Vec<String> = emu
            .names_on(me, from)
            .into_iter()
            .filter(|name| name.starts_with("cuGraphLaunch") || name.starts_with("cuGraphUpload"))
            .collect();
        assert!(launches.is_empty(), "{launches:?}");
    });
    exec.launch(&s0).expect("its own device's stream");
    s0.synchronize().unwrap();
    assert_eq!(read(&buffer, &s0), vec![0x5a; 256]);
    exec.close();
    graph.close();
    handles::drain_deferred_cleanup();
    buffer.close().unwrap();
}
