//! IPC import bookkeeping observed through the emulator's call log and hazard checker
//! (cuda_core_behavior.md section 5, "IPC import", cases 59, 62 and 63). The emulator lets one
//! process import its own exported pool, so both sides run here; `ipc.rs` runs the real two
//! process exchange on the emulator and on a GPU.

mod common;

use std::sync::{Arc, Barrier};

use common::*;
use memory::{
    Buffer, DeviceMemoryResource, DeviceMemoryResourceOptions, IpcBufferDescriptor, MemoryError,
    MemoryResource, PoolMemoryResource,
};

struct Exported {
    buffer: Buffer,
    descriptor: IpcBufferDescriptor,
    imported: Arc<DeviceMemoryResource>,
}

/// A 4096-byte buffer of an IPC pool, filled with `0x33`, and the same pool imported again.
fn exported(stream: &handles::StreamHandle) -> Exported {
    let mr = DeviceMemoryResource::with_options(
        0,
        DeviceMemoryResourceOptions {
            max_size: 0,
            ipc_enabled: true,
        },
    )
    .unwrap();
    let buffer = Arc::clone(&mr).allocate(4096, stream).unwrap();
    buffer.fill(0x33u8, stream).unwrap();
    stream.synchronize().unwrap();
    let descriptor = buffer.ipc_descriptor().unwrap();
    let fd = mr.export_pool().unwrap();
    let imported = DeviceMemoryResource::import_pool(0, std::os::fd::AsFd::as_fd(&fd)).unwrap();
    Exported {
        buffer,
        descriptor,
        imported,
    }
}

fn imports_since(from: u64) -> Vec<u64> {
    emu()
        .calls()
        .into_iter()
        .filter(|c| c.seq >= from && c.function == "cuMemPoolImportPointer" && c.result == 0)
        .map(|c| c.seq)
        .collect()
}

#[test]
fn imports_of_one_descriptor_share_the_mapping_and_keep_their_own_recipes() {
    let _serial = start();
    let (s0, s1, s2) = (stream_on(0), stream_on(0), stream_on(0));
    let e = exported(&s0);
    let from = mark();
    let first = Buffer::from_ipc_descriptor(&e.imported, &e.descriptor, &s1).unwrap();
    let second = Buffer::from_ipc_descriptor(&e.imported, &e.descriptor, &s2).unwrap();
    assert_eq!(imports_since(from).len(), 1, "one driver import");
    assert_eq!(first.ptr(), second.ptr());
    let ptr = first.ptr();
    assert_eq!(read(&first, &s1), vec![0x33; 4096]);
    first.fill(0x44u8, &s1).unwrap();

    // The first to go leaves an event on its stream, and frees nothing.
    let closed_first = mark();
    first.close().unwrap();
    assert_eq!(count_calls("cuMemFreeAsync", ptr, closed_first), 0);
    let records: Vec<_> = emu()
        .calls()
        .into_iter()
        .filter(|c| c.seq >= closed_first && c.function == "cuEventRecord")
        .collect();
    assert_eq!(records.len(), 1, "{records:#?}");
    assert_eq!(records[0].stream, Some(s1.raw() as u64));

    // The last one waits for it on its own stream, then unmaps there.
    let closed_second = mark();
    second.close().unwrap();
    let waits: Vec<_> = emu()
        .calls()
        .into_iter()
        .filter(|c| c.seq >= closed_second && c.function == "cuStreamWaitEvent")
        .collect();
    assert_eq!(waits.len(), 1, "{waits:#?}");
    assert_eq!(waits[0].stream, Some(s2.raw() as u64));
    let free = only_call("cuMemFreeAsync", ptr, closed_second);
    assert_eq!((free.stream, free.result), (Some(s2.raw() as u64), 0));
    assert!(free.seq > waits[0].seq);
    assert!(!is_live(ptr));
    s2.synchronize().unwrap();
    assert_eq!(read(&e.buffer, &s0), vec![0x44; 4096], "one memory");
    e.buffer.close().unwrap();
    assert_no_hazards();
}

#[test]
fn an_import_needs_an_imported_pool_and_a_truthful_descriptor() {
    let _serial = start();
    let (s0, s1) = (stream_on(0), stream_on(0));
    let e = exported(&s0);
    // The exporter's own resource is not an imported pool.
    let own = DeviceMemoryResource::with_options(
        0,
        DeviceMemoryResourceOptions {
            max_size: 0,
            ipc_enabled: true,
        },
    )
    .unwrap();
    assert!(!own.is_mapped());
    assert!(matches!(
        Buffer::from_ipc_descriptor(&own, &e.descriptor, &s1),
        Err(MemoryError::Ipc { .. })
    ));
    // A claimed size past the allocation: the import made for the check is undone on the
    // given stream.
    let mut bytes = e.descriptor.to_bytes();
    bytes[24..32].copy_from_slice(&(1u64 << 20).to_le_bytes());
    let oversized = IpcBufferDescriptor::from_bytes(&bytes).unwrap();
    let from = mark();
    let error = Buffer::from_ipc_descriptor(&e.imported, &oversized, &s1).unwrap_err();
    assert!(matches!(error, MemoryError::Ipc { .. }), "{error}");
    let imports = imports_since(from);
    assert_eq!(imports.len(), 1);
    let undone: Vec<_> = emu()
        .calls()
        .into_iter()
        .filter(|c| c.seq >= from && c.function == "cuMemFreeAsync")
        .collect();
    assert_eq!(undone.len(), 1, "{undone:#?}");
    assert_eq!(undone[0].stream, Some(s1.raw() as u64));
    assert!(!is_live(undone[0].ptr.unwrap()));
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
    let s0 = stream_on(0);
    let e = Arc::new(exported(&s0));
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
    let calls = emu().calls();
    let imported: Vec<u64> = calls
        .iter()
        .filter(|c| c.seq >= from && c.function == "cuMemPoolImportPointer" && c.result == 0)
        .map(|c| c.seq)
        .collect();
    let frees = calls
        .iter()
        .filter(|c| c.seq >= from && c.function == "cuMemFreeAsync" && c.result == 0)
        .count();
    assert!(!imported.is_empty() && imported.len() <= 100);
    assert_eq!(frees, imported.len(), "every mapping unmapped exactly once");
    assert!(emu().live_allocations().iter().all(|a| a.kind != "ipc"));
    let Ok(e) = Arc::try_unwrap(e) else {
        panic!("threads joined")
    };
    e.buffer.close().unwrap();
    assert_no_hazards();
}
