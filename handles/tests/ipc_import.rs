//! The IPC-import release rule: a pointer imported from an IPC-shared pool (`import_pointer`)
//! is freed with `cuMemFreeAsync` on its recipe stream in its recipe context once the last
//! import of it goes (imports of one pointer share the process's one mapping), and the handle
//! holds the imported pool. Export and import run in one process here (the emulator allows it; no real driver was
//! asked, and the memory crate's IPC test covers two processes), so that case runs on the
//! emulator only; a refused import runs on both.

mod common;

use std::ffi::c_int;

use common::*;
use cuda_sys::types::{
    c_void, CUmemAllocationHandleType, CUmemAllocationType, CUmemLocationType, CUmemPoolProps,
    CUmemPoolPtrExportData, CUmemoryPool,
};
use handles::{
    CleanupError, CudaErrorCode, DevicePtrHandle, HandleError, MemoryPoolHandle, ReleaseKind,
    StreamFlags, StreamHandle,
};

fn ipc_pool_props() -> CUmemPoolProps {
    // SAFETY: a plain C struct for which all-zero is a valid value.
    let mut props: CUmemPoolProps = unsafe { std::mem::zeroed() };
    props.allocType = CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
    props.handleTypes = CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    props.location.type_ = CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
    props.location.id = 0;
    props
}

/// A pool exported and imported again by this process (the emulator allows it), and a 4096-byte
/// allocation of the exporter with its export data.
struct OneProcessIpc {
    a: handles::ContextHandle,
    stream: StreamHandle,
    exporter: MemoryPoolHandle,
    imported: MemoryPoolHandle,
    imported_raw: CUmemoryPool,
    original: DevicePtrHandle,
    export: CUmemPoolPtrExportData,
}

impl OneProcessIpc {
    fn new() -> OneProcessIpc {
        let a = primary(0);
        let d = cuda_sys::driver().unwrap();
        let stream = StreamHandle::create(&a, StreamFlags::DEFAULT, 0).unwrap();
        let exporter = MemoryPoolHandle::create(&ipc_pool_props()).unwrap();

        let mut fd: c_int = -1;
        // SAFETY: `fd` is a valid out-buffer for a POSIX file descriptor handle.
        let status = unsafe {
            (d.cuMemPoolExportToShareableHandle)(
                (&mut fd as *mut c_int).cast::<c_void>(),
                exporter.raw(),
                CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
                0,
            )
        };
        assert_eq!(status, 0);
        let mut imported_raw: CUmemoryPool = std::ptr::null_mut();
        // SAFETY: `fd` came from the export above; the out-pointer is valid.
        let status = unsafe {
            (d.cuMemPoolImportFromShareableHandle)(
                &mut imported_raw,
                fd as usize as *mut c_void,
                CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
                0,
            )
        };
        assert_eq!(status, 0);
        // SAFETY: `imported_raw` was imported above and is destroyed only after every handle made
        // from it (and every allocation) is gone.
        let imported = unsafe { handles::raw::wrap_pool(imported_raw, Some(0)) }.unwrap();

        let original = DevicePtrHandle::alloc_from_pool(4096, &exporter, &stream).unwrap();
        stream.synchronize().unwrap();
        // SAFETY: a plain C struct of bytes.
        let mut export: CUmemPoolPtrExportData = unsafe { std::mem::zeroed() };
        // SAFETY: `export` is a valid out-buffer; the pointer is a live pool allocation.
        let status = unsafe { (d.cuMemPoolExportPointer)(&mut export, original.ptr()) };
        assert_eq!(status, 0);

        OneProcessIpc {
            a,
            stream,
            exporter,
            imported,
            imported_raw,
            original,
            export,
        }
    }
}

#[test]
fn imported_pointer_is_freed_with_its_recipe_and_holds_its_pool() {
    let _serial = start();
    // Whether a real driver lets a process import the pool it exported itself was never
    // measured (cuda-sys/tests/conformance/ipc.rs); the memory crate's `ipc` test runs the
    // two-process exchange, through this release rule, on a GPU.
    let Some(emu) = emulator_or_skip(
        "one-process pool IPC (a pool exported and imported by the same process) and its call \
         log to see the imported pointer's free",
    ) else {
        return;
    };
    let OneProcessIpc {
        a,
        stream,
        imported,
        imported_raw,
        original,
        export,
        exporter: _exporter,
    } = OneProcessIpc::new();
    let d = cuda_sys::driver().unwrap();
    let view = handles::import_pointer(&imported, &export.reserved, 4096, &stream).unwrap();
    assert_eq!(view.kind(), ReleaseKind::IpcImport);
    assert_eq!(view.pool().as_ref(), Some(&imported));
    let ptr = view.ptr();
    let alloc = alloc_of(ptr);
    // A second import of the same pointer shares the process's one mapping: the same address,
    // and its release only gives its reference back (no free).
    let second = handles::import_pointer(&imported, &export.reserved, 4096, &stream).unwrap();
    assert_eq!(second.ptr(), ptr, "one mapping per process");
    assert!(!second.ptr_eq(&view), "a handle of its own");
    let from = mark();
    drop(second);
    assert!(
        emu.calls_for(alloc, from)
            .iter()
            .all(|c| c.function != "cuMemFreeAsync"),
        "the mapping stays while another import holds it"
    );
    let from = mark();
    let after = on_fresh_thread(move || {
        drop(view);
        current_raw()
    });
    let free = emu.only_call("cuMemFreeAsync", alloc, from);
    assert_eq!(
        (free.context, free.stream, free.result),
        (a.raw() as u64, Some(stream.raw() as u64), 0)
    );
    assert_eq!(after, 0);
    original.release().unwrap();
    stream.synchronize().unwrap();
    drop(imported);
    // SAFETY: every allocation imported through the pool has been freed.
    assert_eq!(unsafe { (d.cuMemPoolDestroy)(imported_raw) }, 0);
    assert_no_hazards();
}

#[test]
fn bad_export_data_is_a_driver_error_and_imports_nothing() {
    let _serial = start();
    let a = primary(0);
    let stream = StreamHandle::create(&a, StreamFlags::DEFAULT, 0).unwrap();
    let pool = default_pool();
    let used_before = default_used(&a);
    let live_before = with_emulator(|emu| emu.live_allocations().len());
    // SAFETY: a plain C struct of bytes.
    let export: CUmemPoolPtrExportData = unsafe { std::mem::zeroed() };
    let error = handles::import_pointer(&pool, &export.reserved, 64, &stream).unwrap_err();
    assert!(
        matches!(error, HandleError::Driver(ref e) if e.call == "cuMemPoolImportPointer"),
        "{error:?}"
    );
    assert_eq!(current_raw(), 0);
    assert_eq!(default_used(&a), used_before, "nothing taken from the pool");
    with_emulator(|emu| assert_eq!(Some(emu.live_allocations().len()), live_before));
}

/// A release or an import that reports (a cleanup-error hook) must not do so
/// while holding the IPC registry's lock. The hook here takes a lock that another thread holds
/// while it imports: reported under the registry's lock, the hook waits for that thread and that
/// thread waits for the registry, a deadlock (the Python layer's hook takes the GIL, with the
/// same order inverted). The hook gives up after a long while instead of hanging, so that the
/// test fails rather than hangs; it asserts that the hook got the lock.
///
/// `trigger` makes one failing cleanup happen inside a release or an import of `ipc` (with an
/// injected fault), and the importing thread imports `ipc`'s pointer once the report begins.
fn a_report_is_not_made_under_the_registry_lock(
    emu: &Emulator,
    ipc: &OneProcessIpc,
    trigger: impl FnOnce(&Emulator, &OneProcessIpc),
) -> Vec<CleanupError> {
    use std::sync::mpsc;
    use std::sync::{Arc, Mutex};
    use std::time::{Duration, Instant};

    let held = Arc::new(Mutex::new(()));
    let (go, importing) = mpsc::channel::<()>();
    let go = Mutex::new(Some(go));
    let reports: Arc<Mutex<Vec<(CleanupError, bool)>>> = Arc::default();
    {
        let (held, reports) = (Arc::clone(&held), Arc::clone(&reports));
        handles::set_cleanup_error_hook(Box::new(move |error| {
            // The importing thread imports now, holding `held` throughout.
            if let Some(go) = go.lock().unwrap().take() {
                let _ = go.send(());
            }
            let deadline = Instant::now() + Duration::from_secs(20);
            let took = loop {
                if held.try_lock().is_ok() {
                    break true;
                }
                if Instant::now() > deadline {
                    break false; // a deadlock: give up so that the test fails, not hangs
                }
                std::thread::sleep(Duration::from_millis(1));
            };
            reports.lock().unwrap().push((error.clone(), took));
        }));
    }
    let importer = {
        let (held, imported, export) = (Arc::clone(&held), ipc.imported.clone(), ipc.export);
        let stream = StreamHandle::create(&ipc.a, StreamFlags::DEFAULT, 0).unwrap();
        let (ready, started) = mpsc::channel::<()>();
        let thread = std::thread::spawn(move || {
            let _held = held.lock().unwrap();
            ready.send(()).unwrap();
            if importing.recv().is_ok() {
                let import = handles::import_pointer(&imported, &export.reserved, 4096, &stream);
                drop(import.expect("the importing thread's import"));
            }
            stream.synchronize().unwrap();
        });
        started.recv().unwrap();
        thread
    };
    trigger(emu, ipc);
    let reports = std::mem::take(&mut *reports.lock().unwrap());
    // Back to the shared hooks (a serial run keeps one process for every test).
    handles::set_cleanup_error_hook(Box::new(|error| {
        captured().errors.lock().unwrap().push(error.clone());
    }));
    // Replacing the hook dropped `go`: had nothing been reported, the importing thread would
    // have stopped waiting then.
    importer.join().unwrap();
    assert!(!reports.is_empty(), "the injected fault was reported");
    for (error, took) in &reports {
        assert!(
            took,
            "the hook could not take a lock the importing thread held: reported under the \
             registry's lock ({error})"
        );
    }
    reports.into_iter().map(|(error, _)| error).collect()
}

#[test]
fn the_last_imports_release_reports_after_letting_go_of_the_registry_lock() {
    let _serial = start();
    let Some(emu) = emulator_or_skip(
        "one-process pool IPC and fault injection (a stream whose destruction fails under the \
         release of an import's mapping)",
    ) else {
        return;
    };
    let ipc = OneProcessIpc::new();
    let reports = a_report_is_not_made_under_the_registry_lock(&emu, &ipc, |emu, ipc| {
        // The mapping's recipe holds the last reference to `s1` once the import's own recipe
        // moved to `s2`: the last release gives the mapping `s2`'s recipe, and `s1` goes,
        // inside the registry's give-back, with a destruction that fails.
        let s1 = StreamHandle::create(&ipc.a, StreamFlags::DEFAULT, 0).unwrap();
        let s2 = StreamHandle::create(&ipc.a, StreamFlags::DEFAULT, 0).unwrap();
        let import = handles::import_pointer(&ipc.imported, &ipc.export.reserved, 4096, &s1)
            .expect("import");
        import.set_deallocation_stream(&s2).unwrap();
        drop(s1);
        assert!(emu.inject_fault("cuStreamDestroy_v2", 1, CudaErrorCode::INVALID_VALUE));
        drop(import);
        s2.synchronize().unwrap();
    });
    assert!(
        reports.iter().any(|e| e.operation == "cuStreamDestroy_v2"),
        "{reports:#?}"
    );
    let OneProcessIpc {
        stream,
        original,
        imported,
        imported_raw,
        ..
    } = ipc;
    finish_ipc(original, stream, imported, imported_raw);
}

#[test]
fn a_short_import_reports_its_free_after_letting_go_of_the_registry_lock() {
    let _serial = start();
    let Some(emu) = emulator_or_skip(
        "one-process pool IPC and fault injection (the free of a mapping shorter than claimed \
         fails)",
    ) else {
        return;
    };
    let ipc = OneProcessIpc::new();
    let reports = a_report_is_not_made_under_the_registry_lock(&emu, &ipc, |emu, ipc| {
        // A claim of more bytes than the export holds: the mapping made for the check is freed
        // again (under the registry's lock, so that nobody picks it up meanwhile), and that free
        // fails.
        assert!(emu.inject_fault("cuMemFreeAsync", 1, CudaErrorCode::INVALID_VALUE));
        let refused =
            handles::import_pointer(&ipc.imported, &ipc.export.reserved, 8192, &ipc.stream);
        assert!(
            matches!(refused, Err(HandleError::ImportExceedsMapping { .. })),
            "{refused:?}"
        );
    });
    assert!(
        reports.iter().any(|e| e.operation == "cuMemFreeAsync"),
        "{reports:#?}"
    );
    let OneProcessIpc {
        stream,
        original,
        imported,
        imported_raw,
        ..
    } = ipc;
    finish_ipc(original, stream, imported, imported_raw);
}

/// Frees the exporter's allocation and destroys the imported pool.
fn finish_ipc(
    original: DevicePtrHandle,
    stream: StreamHandle,
    imported: MemoryPoolHandle,
    imported_raw: CUmemoryPool,
) {
    original.release().unwrap();
    stream.synchronize().unwrap();
    drop(imported);
    handles::drain_deferred_cleanup();
    let d = cuda_sys::driver().unwrap();
    // SAFETY: every allocation imported through the pool has been freed, or leaked with its
    // failed free (the emulator keeps such a mapping; its pool then refuses the destruction).
    let _ = unsafe { (d.cuMemPoolDestroy)(imported_raw) };
}
