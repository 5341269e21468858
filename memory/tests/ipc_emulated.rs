//! IPC import bookkeeping observed through the emulator's call log and hazard checker
//! (docs/reference-notes.md section 5, "IPC import", cases 59, 62 and 63). The emulator lets one
//! process import its own exported pool, so both sides run here; a real driver cannot be
//! assumed to (an H200 run refused it), so there only what needs no import runs and the rest
//! says it skips. `ipc.rs` runs the real two-process exchange on the emulator and on a GPU.

mod common;

use std::sync::{Arc, Barrier};

use common::*;
use memory::{
    Buffer, DeviceMemoryResource, DeviceMemoryResourceOptions, IpcBufferDescriptor, MemoryError,
    MemoryResource, PoolMemoryResource,
};

/// What the skipping tests need of the emulator.
const ONE_PROCESS_IPC: &str = "one-process pool IPC (a pool exported and imported by the same \
                               process) and its call log";

struct Exported {
    buffer: Buffer,
    descriptor: IpcBufferDescriptor,
    exporter: Arc<DeviceMemoryResource>,
}

struct Imported {
    buffer: Buffer,
    descriptor: IpcBufferDescriptor,
    imported: Arc<DeviceMemoryResource>,
}

fn ipc_resource() -> Arc<DeviceMemoryResource> {
    DeviceMemoryResource::with_options(
        0,
        DeviceMemoryResourceOptions {
            max_size: 0,
            ipc_enabled: true,
        },
    )
    .unwrap()
}

/// A 4096-byte buffer of an IPC pool, filled with `0x33`, and its descriptor.
fn exported(stream: &handles::StreamHandle) -> Exported {
    let exporter = ipc_resource();
    let buffer = exporter.allocate(4096, stream).unwrap();
    buffer.fill(0x33u8, stream).unwrap();
    stream.synchronize().unwrap();
    let descriptor = buffer.ipc_descriptor().unwrap();
    Exported {
        buffer,
        descriptor,
        exporter,
    }
}

/// [`exported`], and the same pool imported again by this process (the emulator only).
fn imported(stream: &handles::StreamHandle) -> Imported {
    let e = exported(stream);
    let fd = e.exporter.export_pool().unwrap();
    let imported = DeviceMemoryResource::import_pool(0, std::os::fd::AsFd::as_fd(&fd)).unwrap();
    Imported {
        buffer: e.buffer,
        descriptor: e.descriptor,
        imported,
    }
}

fn imports_since(emu: &test_support::emu::Emulator, from: u64) -> Vec<u64> {
    emu.calls_named("cuMemPoolImportPointer", from)
        .into_iter()
        .filter(|c| c.result == 0)
        .map(|c| c.seq)
        .collect()
}

#[test]
fn imports_of_one_descriptor_share_the_mapping_and_keep_their_own_recipes() {
    let _serial = start();
    let Some(emu) = emulator_or_skip(ONE_PROCESS_IPC) else {
        return;
    };
    let (s0, s1, s2) = (stream_on(0), stream_on(0), stream_on(0));
    let e = imported(&s0);
    let from = mark();
    let first = Buffer::from_ipc_descriptor(&e.imported, &e.descriptor, &s1).unwrap();
    let second = Buffer::from_ipc_descriptor(&e.imported, &e.descriptor, &s2).unwrap();
    assert_eq!(imports_since(&emu, from).len(), 1, "one driver import");
    assert_eq!(first.ptr(), second.ptr());
    let ptr = first.ptr();
    let alloc = alloc_of(ptr);
    assert_eq!(read(&first, &s1), vec![0x33; 4096]);
    first.fill(0x44u8, &s1).unwrap();

    // The first to go leaves an event on its stream, and frees nothing.
    let closed_first = mark();
    first.close().unwrap();
    assert_eq!(emu.count_calls("cuMemFreeAsync", alloc, closed_first), 0);
    let records = emu.calls_named("cuEventRecord", closed_first);
    assert_eq!(records.len(), 1, "{records:#?}");
    assert_eq!(records[0].stream, Some(s1.raw() as u64));

    // The last one waits for it on its own stream, then unmaps there.
    let closed_second = mark();
    second.close().unwrap();
    let waits = emu.calls_named("cuStreamWaitEvent", closed_second);
    assert_eq!(waits.len(), 1, "{waits:#?}");
    assert_eq!(waits[0].stream, Some(s2.raw() as u64));
    let free = emu.only_call("cuMemFreeAsync", alloc, closed_second);
    assert_eq!((free.stream, free.result), (Some(s2.raw() as u64), 0));
    assert!(free.seq > waits[0].seq);
    assert!(!emu.is_live(alloc));
    s2.synchronize().unwrap();
    assert_eq!(read(&e.buffer, &s0), vec![0x44; 4096], "one memory");
    e.buffer.close().unwrap();
    assert_no_hazards();
}

#[test]
fn an_import_needs_an_imported_pool_and_a_truthful_descriptor() {
    let _serial = start();
    let (s0, s1) = (stream_on(0), stream_on(0));
    // The exporter's own resource, or another IPC pool of this process, is not an imported
    // pool: refused on any driver, before any import.
    let e = exported(&s0);
    let own = ipc_resource();
    for exporting in [&e.exporter, &own] {
        assert!(!exporting.is_mapped());
        assert!(matches!(
            Buffer::from_ipc_descriptor(exporting, &e.descriptor, &s1),
            Err(MemoryError::Ipc(_))
        ));
    }
    assert_eq!(read(&e.buffer, &s0), vec![0x33; 4096], "untouched");
    e.buffer.close().unwrap();
    let Some(emu) = emulator_or_skip_rest(ONE_PROCESS_IPC) else {
        return;
    };
    let e = imported(&s0);
    // A claimed size past the allocation: the import made for the check is undone on the
    // given stream.
    let mut bytes = e.descriptor.to_bytes();
    bytes[24..32].copy_from_slice(&(1u64 << 20).to_le_bytes());
    let oversized = IpcBufferDescriptor::from_bytes(&bytes).unwrap();
    let from = mark();
    let error = Buffer::from_ipc_descriptor(&e.imported, &oversized, &s1).unwrap_err();
    assert!(matches!(error, MemoryError::Ipc(_)), "{error}");
    let imports = imports_since(&emu, from);
    assert_eq!(imports.len(), 1);
    let undone = emu.calls_named("cuMemFreeAsync", from);
    assert_eq!(undone.len(), 1, "{undone:#?}");
    assert_eq!(undone[0].stream, Some(s1.raw() as u64));
    assert!(!emu.is_live(
        undone[0]
            .alloc
            .expect("the undone import freed an allocation")
    ));
    // A truthful import afterwards works.
    let good = Buffer::from_ipc_descriptor(&e.imported, &e.descriptor, &s1).unwrap();
    assert_eq!(read(&good, &s1), vec![0x33; 4096]);
    good.close().unwrap();
    s1.synchronize().unwrap();
    e.buffer.close().unwrap();
    assert_no_hazards();
}

#[test]
fn concurrent_imports_and_closes_map_and_unmap_in_pairs() {
    let _serial = start();
    let Some(emu) = emulator_or_skip(ONE_PROCESS_IPC) else {
        return;
    };
    let s0 = stream_on(0);
    let e = Arc::new(imported(&s0));
    let from = mark();
    let barrier = Arc::new(Barrier::new(4));
    let threads: Vec<_> = (0..4)
        .map(|_| {
            let (e, barrier) = (Arc::clone(&e), Arc::clone(&barrier));
            std::thread::spawn(move || {
                let s = stream_on(0);
                barrier.wait();
                for _ in 0..25 {
                    let buffer = Buffer::from_ipc_descriptor(&e.imported, &e.descriptor, &s)
                        .expect("import");
                    assert_eq!(buffer.size(), 4096);
                    buffer.close().expect("close");
                }
                s.synchronize().unwrap();
            })
        })
        .collect();
    for thread in threads {
        thread.join().expect("importing thread");
    }
    let imported = imports_since(&emu, from);
    let frees = emu
        .calls_named("cuMemFreeAsync", from)
        .iter()
        .filter(|c| c.result == 0)
        .count();
    assert!(!imported.is_empty() && imported.len() <= 100);
    assert_eq!(frees, imported.len(), "every mapping unmapped exactly once");
    assert!(emu.live_allocations().iter().all(|a| a.kind != "ipc"));
    let Ok(e) = Arc::try_unwrap(e) else {
        panic!("threads joined")
    };
    e.buffer.close().unwrap();
    assert_no_hazards();
}

/// Work queued on another stream than an import's deallocation stream, and not declared with
/// `record_use`, has run before an explicit close unmaps the import: the close waits for the
/// recipe's context first (`cuCtxSynchronize`), then frees on the recipe's stream. cuda.core's
/// worker-pool and send-buffers IPC tests fill an import on a non-blocking stream and close it
/// at once, with its free on the legacy stream; on an H200 that use ran after the unmap, a
/// device fault (docs/cuda-core-compat.md, "The H200-only failures"). Fails without the wait:
/// the emulator's hazard checker reports the free as `unordered_free`.
#[test]
fn closing_an_import_waits_for_undeclared_work_on_other_streams_before_the_unmap() {
    let _serial = start();
    let Some(emu) = emulator_or_skip(ONE_PROCESS_IPC) else {
        return;
    };
    let s0 = stream_on(0);
    let e = imported(&s0);
    primary(0).make_current().unwrap();
    let legacy = handles::StreamHandle::legacy();
    let other = handles::StreamHandle::create(&primary(0), handles::StreamFlags::NON_BLOCKING, 0)
        .expect("stream");
    let import = Buffer::from_ipc_descriptor(&e.imported, &e.descriptor, &legacy).unwrap();
    let alloc = alloc_of(import.ptr());
    import.fill(0x5au8, &other).unwrap();
    let closed = mark();
    import.close().unwrap();
    let syncs = emu.calls_named("cuCtxSynchronize", closed);
    let free = emu.only_call("cuMemFreeAsync", alloc, closed);
    assert_eq!(free.result, 0);
    assert!(
        syncs.iter().any(|c| c.seq < free.seq),
        "the close did not wait for the context before the unmap: {syncs:#?}"
    );
    assert!(!emu.is_live(alloc));
    assert_eq!(read(&e.buffer, &s0), vec![0x5a; 4096], "the fill landed");
    e.buffer.close().unwrap();
    assert_no_hazards();
}

/// The close that hands back the recipe's remains (what the Python binding uses) is the same
/// close: an import held alone waits for its recipe's context before the unmap, as `close`
/// does (on d7f8154 it skipped the wait, and the hazard checker reported the
/// free as `unordered_free`), and waits for the free's stream after it.
#[test]
fn closing_an_import_with_its_remains_waits_as_close_does() {
    let _serial = start();
    let Some(emu) = emulator_or_skip(ONE_PROCESS_IPC) else {
        return;
    };
    let s0 = stream_on(0);
    let e = imported(&s0);
    let s1 = stream_on(0);
    let other = handles::StreamHandle::create(&primary(0), handles::StreamFlags::NON_BLOCKING, 0)
        .expect("stream");
    let import = Buffer::from_ipc_descriptor(&e.imported, &e.descriptor, &s1).unwrap();
    let alloc = alloc_of(import.ptr());
    import.fill(0x5bu8, &other).unwrap();
    let closed = mark();
    let (result, remains) = memory::binding::close_with_remains(import);
    result.unwrap();
    assert!(remains.is_none(), "`s1` is still held here");
    let syncs = emu.calls_named("cuCtxSynchronize", closed);
    let free = emu.only_call("cuMemFreeAsync", alloc, closed);
    assert_eq!((free.stream, free.result), (Some(s1.raw() as u64), 0));
    assert!(
        syncs.iter().any(|c| c.seq < free.seq),
        "the close did not wait for the context before the unmap: {syncs:#?}"
    );
    let after = emu.calls_named("cuStreamSynchronize", free.seq);
    assert!(
        after.iter().any(|c| c.stream == Some(s1.raw() as u64)),
        "the close did not wait for the unmap: {after:#?}"
    );
    assert!(!emu.is_live(alloc));
    assert_eq!(read(&e.buffer, &s0), vec![0x5b; 4096], "the fill landed");
    e.buffer.close().unwrap();
    assert_no_hazards();
}

/// Whether a close of an import waits before the unmap is decided by the
/// release that is the last one (the handle's), not by a count read before it: while another
/// holder of the import's handle drops on another thread at the same moment, either the close
/// is the last release (it waits, then unmaps) or the other holder's drop is (a drop never
/// waits, docs/decisions.md D9; its free runs on that thread). Never does the close's thread
/// unmap without the wait. Many rounds, as the two threads race: the close used to find out
/// whether it was last with `Arc::try_unwrap`, which fails while the other holder is there and
/// then drops the close's reference, the last one if the other holder dropped in between; the
/// close's release then ran as a drop on the closing thread, without the wait (1 run in 12 of
/// 200 rounds, 2 runs in 6 of 2000 rounds, on the emulator; none in 21 since `Arc::into_inner`).
#[test]
fn an_import_closed_while_another_holder_drops_waits_whenever_the_close_unmaps() {
    let _serial = start();
    let Some(emu) = emulator_or_skip(ONE_PROCESS_IPC) else {
        return;
    };
    let s0 = stream_on(0);
    let e = imported(&s0);
    let s1 = stream_on(0);
    for round in 0..2000 {
        emu.clear_calls();
        let import = Buffer::from_ipc_descriptor(&e.imported, &e.descriptor, &s1).unwrap();
        let alloc = alloc_of(import.ptr());
        let other_holder = import.handle().clone();
        let barrier = Arc::new(Barrier::new(2));
        let dropper = {
            let barrier = Arc::clone(&barrier);
            std::thread::spawn(move || {
                barrier.wait();
                drop(other_holder);
                test_support::tid()
            })
        };
        let closed = mark();
        barrier.wait();
        import.close().unwrap();
        let dropper_thread = dropper.join().unwrap();
        handles::drain_deferred_cleanup();
        let free = emu.only_call("cuMemFreeAsync", alloc, closed);
        if free.thread != dropper_thread {
            let syncs = emu.calls_named("cuCtxSynchronize", closed);
            assert!(
                syncs
                    .iter()
                    .any(|c| c.seq < free.seq && c.thread == free.thread),
                "round {round}: the close unmapped without waiting: {syncs:#?}"
            );
        }
        s1.synchronize().unwrap();
    }
    e.buffer.close().unwrap();
    assert_no_hazards();
}

/// The wait before an import's unmap runs with the closing thread's capture mode relaxed: a
/// capture another library began in global mode on another thread is neither refused nor broken
/// by it (docs/decisions.md D11). On d7f8154 the close's `cuCtxSynchronize`
/// ran in the thread's own (global) mode: refused with `CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED`,
/// the close returned that error, and the other thread's capture was invalidated.
#[test]
fn closing_an_import_leaves_another_threads_global_capture_alone() {
    use handles::sys_types::CUstreamCaptureMode;
    use test_support::stream_ops::{begin_foreign_capture, end_foreign_capture};

    let _serial = start();
    let Some(emu) = emulator_or_skip(ONE_PROCESS_IPC) else {
        return;
    };
    let s0 = stream_on(0);
    let e = imported(&s0);
    let s1 = stream_on(0);
    let import = Buffer::from_ipc_descriptor(&e.imported, &e.descriptor, &s1).unwrap();
    let alloc = alloc_of(import.ptr());
    let captured = stream_on(0);
    let raw = captured.raw() as usize;
    let (began, capturing) = std::sync::mpsc::channel();
    let (end, ending) = std::sync::mpsc::channel::<()>();
    let capturer = std::thread::spawn(move || {
        primary(0).make_current().unwrap();
        begin_foreign_capture(
            raw as handles::sys_types::CUstream,
            CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_GLOBAL,
        );
        began.send(()).unwrap();
        ending.recv().unwrap();
        let ended = end_foreign_capture(raw as handles::sys_types::CUstream);
        handles::ContextHandle::clear_current().unwrap();
        ended
    });
    capturing.recv().unwrap();
    let closed = mark();
    let result = import.close();
    end.send(()).unwrap();
    let ended = capturer.join().unwrap();
    result.expect("the close's wait is not refused by another thread's capture");
    assert_eq!(
        ended,
        handles::CudaErrorCode::SUCCESS,
        "the capture stays valid"
    );
    let free = emu.only_call("cuMemFreeAsync", alloc, closed);
    let syncs = emu.calls_named("cuCtxSynchronize", closed);
    assert!(
        syncs.iter().any(|c| c.seq < free.seq && c.result == 0),
        "the close waited for the context before the unmap: {syncs:#?}"
    );
    drop(captured);
    e.buffer.close().unwrap();
    assert_no_hazards();
}
