//! Pool IPC for pointers: [`export_pointer`], the bytes another process needs to import an
//! allocation of an IPC-capable pool, and [`import_pointer`], which imports one, with the one
//! registry of this process's imported mappings and its one lock.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use cuda_sys::types::CUmemPoolPtrExportData;

use crate::allocation::{Deallocator, OwnedAllocation};
use crate::context::ContextHandle;
use crate::deviceptr::DevicePtrHandle;
use crate::error::HandleError;
use crate::event::EventHandle;
use crate::flags::EventFlags;
use crate::pool::MemoryPoolHandle;
use crate::recipe::DeallocationRecipe;
use crate::report::HoldReports;
use crate::stream::StreamHandle;
use crate::sys::{check, driver};

/// The 64 bytes (`CUmemPoolPtrExportData`) another process needs to import `ptr`, an allocation
/// from an IPC-capable pool, with [`import_pointer`].
///
/// # Errors
/// [`HandleError::Driver`] (`CUDA_ERROR_INVALID_VALUE` when the pool is not IPC-capable).
///
/// Driver calls: `cuMemPoolExportPointer`.
pub fn export_pointer(ptr: &DevicePtrHandle) -> Result<[u8; 64], HandleError> {
    let d = driver()?;
    let mut data = CUmemPoolPtrExportData { reserved: [0; 64] };
    // SAFETY: `data` is a valid out-buffer; the handle keeps the allocation alive.
    let status = unsafe { (d.cuMemPoolExportPointer)(&mut data, ptr.ptr()) };
    check("cuMemPoolExportPointer", status)?;
    Ok(data.reserved)
}

/// Imports the pointer another process exported as `export_data` ([`export_pointer`]) from
/// `pool`, a pool imported from that process ([`crate::import_pool`]); `size` is the exported
/// allocation's size in bytes (the exporter's claim, checked against what the driver maps) and
/// `stream` orders this import's eventual release.
///
/// Each import is a handle of its own, with its own recipe, but a driver maps an allocation
/// once per process (a second import of one pointer returns the same address, and the first
/// `cuMemFreeAsync` unmaps it for all, measured on an H200): so imports of one pointer share one
/// mapping, counted here. A handle's release gives its reference back: while others hold the
/// mapping, an event recorded on its stream orders it; the last one frees the mapping on its own
/// stream after waiting for those events. Imports and that last free hold the registry's lock,
/// so a new import never picks up a mapping about to go.
///
/// # Errors
/// [`HandleError::NoCurrentContext`] for an unbound token with no context and
/// [`HandleError::WrongDevice`] for a stream of another device than the pool (both before
/// anything is imported); [`HandleError::ImportExceedsMapping`] when the mapped
/// allocation is smaller than `size` (a mapping made for the check is freed again on `stream`);
/// [`HandleError::Driver`] when the driver rejects the export data.
///
/// Driver calls: `cuCtxGetCurrent` (a default-stream token); for the first import of a mapping
/// `cuCtxSetCurrent` (if needed), `cuMemPoolImportPointer`, `cuPointerGetAttributes` (the extent
/// check). At release: `cuEventCreate` and `cuEventRecord` while other imports hold the mapping;
/// for the last, `cuStreamWaitEvent` per earlier release, then `cuMemFreeAsync`.
pub fn import_pointer(
    pool: &MemoryPoolHandle,
    export_data: &[u8; 64],
    size: usize,
    stream: &StreamHandle,
) -> Result<DevicePtrHandle, HandleError> {
    // This import's recipe is validated before anything is imported (it cannot fail later).
    let recipe = DeallocationRecipe::record_for(stream, pool.device())?;
    let key = ImportKey {
        pool: pool.raw() as usize,
        export_data: *export_data,
    };
    let ptr = acquire(pool, &key, size, stream)?;
    let share: Arc<dyn Deallocator> = Arc::new(ImportRelease { key });
    Ok(DevicePtrHandle::share_of_import(
        ptr, size, pool, recipe, share,
    ))
}

/// One mapping of another process's allocation, per (pool, export data).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct ImportKey {
    pool: usize,
    export_data: [u8; 64],
}

/// The driver's import of one mapping, shared by every handle that imported it.
struct ImportEntry {
    /// The real import (`cuMemPoolImportPointer`; freed with `cuMemFreeAsync` on release, only
    /// by [`give_back`], under the registry's lock).
    mapping: DevicePtrHandle,
    /// Size in bytes of the imported allocation, as the driver reports it.
    extent: usize,
    /// Handles that hold the mapping.
    live: usize,
    /// Recorded on the release streams of handles already gone.
    gone: Vec<EventHandle>,
}

/// Every live mapping in the process: the one registry, and its lock is the one that serialises
/// imports with the free of a mapping. Held while importing and while the last reference's
/// free is issued. A leaf lock: no user code runs under it, and nothing is reported while it is
/// held: what fails under it (a short mapping's free, the mapping's own free, a stream whose last
/// reference a replaced recipe held) is reported once the lock is let go ([`HoldReports`], taken
/// before the lock by [`registry`]).
static IMPORTS: Mutex<Option<HashMap<ImportKey, ImportEntry>>> = Mutex::new(None);

/// The registry's lock, with the reports made while it is held kept until after it: the guard
/// drops first (its field comes first), then the held reports are made.
struct Registry {
    guard: MutexGuard<'static, Option<HashMap<ImportKey, ImportEntry>>>,
    _reports: HoldReports,
}

fn registry() -> Registry {
    let reports = HoldReports::new();
    Registry {
        guard: IMPORTS.lock().unwrap_or_else(PoisonError::into_inner),
        _reports: reports,
    }
}

/// The address of the mapping for `key`, importing it (and checking its extent against `size`)
/// if this process does not hold it yet; counts one more holder.
fn acquire(
    pool: &MemoryPoolHandle,
    key: &ImportKey,
    size: usize,
    stream: &StreamHandle,
) -> Result<u64, HandleError> {
    let mut registry = registry();
    let map = registry.guard.get_or_insert_with(HashMap::new);
    if let Some(entry) = map.get_mut(key) {
        check_extent(size, entry.extent)?;
        entry.live += 1;
        return Ok(entry.mapping.ptr());
    }
    let export_data = CUmemPoolPtrExportData {
        reserved: key.export_data,
    };
    let mapping = DevicePtrHandle::import_from_pool(pool, &export_data, size, stream)?;
    let ptr = mapping.ptr();
    // `size` is the exporter's claim; every range of the handle trusts it, so it is checked
    // against what the driver mapped, and later imports of the same pointer, with claims of
    // their own, against the same extent. A short mapping is freed again (on `stream`, the lock
    // held, so that nobody picks it up meanwhile; a failure reported after the lock) by its drop.
    let extent = crate::pointer::pointer_attributes(ptr)?.map_or(0, |a| a.range_size);
    check_extent(size, extent)?;
    map.insert(
        *key,
        ImportEntry {
            mapping,
            extent,
            live: 1,
            gone: Vec::new(),
        },
    );
    Ok(ptr)
}

fn check_extent(claimed: usize, extent: usize) -> Result<(), HandleError> {
    if extent < claimed {
        return Err(HandleError::ImportExceedsMapping { claimed, extent });
    }
    Ok(())
}

/// Gives one handle's reference back, its work done on `stream`: records an event there if
/// others still hold the mapping; otherwise frees the mapping on `stream` after the events of
/// those that went before. Runs with `stream`'s recipe context current (at teardown).
///
/// A reference is given back only once its stream's work is ordered before the unmap: if that
/// ordering fails (no event, no wait, no new recipe), the reference is kept and the mapping
/// leaks (the error is returned) rather than being unmapped unordered.
fn give_back(key: &ImportKey, stream: &StreamHandle) -> Result<(), HandleError> {
    let mut registry = registry();
    let Some(map) = registry.guard.as_mut() else {
        return Ok(());
    };
    let Some(entry) = map.get_mut(key) else {
        return Ok(());
    };
    if entry.live > 1 {
        let context = match stream.context() {
            Some(context) => context.clone(),
            None => ContextHandle::current()?.ok_or(HandleError::NoCurrentContext)?,
        };
        let event = EventHandle::create(&context, EventFlags::DISABLE_TIMING)?;
        event.record(stream)?;
        entry.live -= 1;
        entry.gone.push(event);
        return Ok(());
    }
    for event in &entry.gone {
        stream.wait_event(event)?;
    }
    // The replaced recipe may hold a stream's last reference: dropped after the lock.
    let replaced = entry.mapping.0.replace_recipe(stream)?;
    let Some(entry) = map.remove(key) else {
        return Ok(());
    };
    // Issued before the lock goes: no import can pick up the mapping now.
    let freed = entry.mapping.release();
    drop(registry);
    drop(replaced);
    drop(entry.gone);
    freed
}

/// Gives an imported handle's reference to its mapping back (the handle's release rule).
struct ImportRelease {
    key: ImportKey,
}

impl Deallocator for ImportRelease {
    fn deallocate(
        &self,
        allocation: OwnedAllocation,
        stream: &StreamHandle,
    ) -> Result<(), HandleError> {
        // The address is the shared mapping's: this handle's reference is what is given back.
        let _ = allocation.into_raw();
        give_back(&self.key, stream)
    }

    fn name(&self) -> &str {
        "IPC-imported allocation"
    }
}
