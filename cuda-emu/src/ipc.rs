//! Pool IPC: memory pools exportable as a POSIX file descriptor are carved out of a `memfd`
//! arena that another process can map; exported pointers carry the arena's id and the offset.

use std::os::fd::{BorrowedFd, RawFd};
use std::sync::{Arc, Mutex};

use crate::log::lock;
use crate::os::SharedMap;

/// Bytes at the start of an arena file: magic, arena id, device, host flag.
pub(crate) const HEADER: u64 = 4096;
const MAGIC: &[u8; 8] = b"CUEMUPL1";
const EXPORT_MAGIC: &[u8; 8] = b"CUEMUPT1";
/// Capacity of an IPC pool without a `maxSize` (sparse: only touched pages use memory).
const DEFAULT_CAPACITY: u64 = 1 << 30;

/// A shared pool arena and its free list (offsets into the file).
pub(crate) struct Arena {
    map: Arc<SharedMap>,
    free: Mutex<Vec<(u64, u64)>>,
    pub(crate) id: u64,
}

/// What an arena file's header says.
pub(crate) struct Header {
    pub(crate) id: u64,
    pub(crate) device: i32,
    pub(crate) host: bool,
}

fn arena_id() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(1);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    (u64::from(std::process::id()) << 32)
        ^ nanos.rotate_left(17)
        ^ N.fetch_add(1, Ordering::Relaxed)
}

impl Arena {
    /// Creates an arena for a pool on `device` (`host` for a host pool) of `max_size` bytes
    /// (0: the default capacity).
    pub(crate) fn create(device: i32, host: bool, max_size: u64) -> std::io::Result<Arc<Arena>> {
        let capacity = if max_size == 0 {
            DEFAULT_CAPACITY
        } else {
            max_size
        };
        let map = SharedMap::create("cuda-emu-pool", (HEADER + capacity) as usize)?;
        let id = arena_id();
        let mut header = [0u8; 32];
        header[..8].copy_from_slice(MAGIC);
        header[8..16].copy_from_slice(&id.to_le_bytes());
        header[16..20].copy_from_slice(&device.to_le_bytes());
        header[20] = u8::from(host);
        // SAFETY: the mapping is at least HEADER bytes long and nobody else uses it yet.
        unsafe { std::ptr::copy_nonoverlapping(header.as_ptr(), map.ptr(), header.len()) };
        Ok(Arc::new(Arena {
            map: Arc::new(map),
            free: Mutex::new(vec![(HEADER, capacity)]),
            id,
        }))
    }

    pub(crate) fn map(&self) -> &SharedMap {
        &self.map
    }

    /// A block of `size` bytes (first fit, 512-byte aligned), as an offset into the file.
    pub(crate) fn alloc(&self, size: u64) -> Option<u64> {
        let size = size.max(1).div_ceil(512) * 512;
        let mut free = lock(&self.free);
        let i = free.iter().position(|&(_, len)| len >= size)?;
        let (off, len) = free[i];
        if len == size {
            free.remove(i);
        } else {
            free[i] = (off + size, len - size);
        }
        Some(off)
    }

    /// Returns a block.
    pub(crate) fn free(&self, off: u64, size: u64) {
        let size = size.max(1).div_ceil(512) * 512;
        let mut free = lock(&self.free);
        let i = free.partition_point(|&(o, _)| o < off);
        free.insert(i, (off, size));
        if i + 1 < free.len() && free[i].0 + free[i].1 == free[i + 1].0 {
            free[i].1 += free[i + 1].1;
            free.remove(i + 1);
        }
        if i > 0 && free[i - 1].0 + free[i - 1].1 == free[i].0 {
            free[i - 1].1 += free[i].1;
            free.remove(i);
        }
    }

    /// A new file descriptor for the arena file (the caller owns it).
    pub(crate) fn export_fd(&self) -> std::io::Result<RawFd> {
        use std::os::fd::IntoRawFd;
        Ok(self.map.file().try_clone()?.into_raw_fd())
    }
}

/// Maps the arena behind `fd` (which stays the caller's) and reads its header.
pub(crate) fn import(fd: RawFd) -> Option<(Arc<SharedMap>, Header)> {
    if fd < 0 {
        return None;
    }
    // SAFETY: the caller passes an open descriptor per the driver's contract; it is only
    // borrowed long enough to duplicate it.
    let owned = unsafe { BorrowedFd::borrow_raw(fd) }
        .try_clone_to_owned()
        .ok()?;
    let map = SharedMap::map(std::fs::File::from(owned)).ok()?;
    if (map.len() as u64) < HEADER {
        return None;
    }
    let mut header = [0u8; 32];
    // SAFETY: the mapping is at least HEADER bytes long.
    unsafe { std::ptr::copy_nonoverlapping(map.ptr(), header.as_mut_ptr(), header.len()) };
    if &header[..8] != MAGIC {
        return None;
    }
    let id = u64::from_le_bytes(header[8..16].try_into().ok()?);
    let device = i32::from_le_bytes(header[16..20].try_into().ok()?);
    let host = header[20] != 0;
    Some((Arc::new(map), Header { id, device, host }))
}

/// The 64 bytes of `CUmemPoolPtrExportData` for a block.
pub(crate) fn encode_export(arena_id: u64, offset: u64, size: u64) -> [u8; 64] {
    let mut out = [0u8; 64];
    out[..8].copy_from_slice(EXPORT_MAGIC);
    out[8..16].copy_from_slice(&arena_id.to_le_bytes());
    out[16..24].copy_from_slice(&offset.to_le_bytes());
    out[24..32].copy_from_slice(&size.to_le_bytes());
    out
}

/// Decodes export data: (arena id, offset, size).
pub(crate) fn decode_export(data: &[u8; 64]) -> Option<(u64, u64, u64)> {
    if &data[..8] != EXPORT_MAGIC {
        return None;
    }
    Some((
        u64::from_le_bytes(data[8..16].try_into().ok()?),
        u64::from_le_bytes(data[16..24].try_into().ok()?),
        u64::from_le_bytes(data[24..32].try_into().ok()?),
    ))
}
