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
    DevicePtrHandle, HandleError, MemoryPoolHandle, ReleaseKind, StreamFlags, StreamHandle,
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
