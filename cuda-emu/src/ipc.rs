//! Pool IPC: memory pools exportable as a POSIX file descriptor are carved out of a `memfd`
//! arena that another process can map; exported pointers carry the arena's id and the offset.

use std::os::fd::{BorrowedFd, RawFd};
use std::sync::{Arc, Mutex};

use crate::os::SharedMap;
use crate::thread::lock;

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

// ---------------------------------------------------------------------------------------------
// Interprocess events

const EVENT_MAGIC: &[u8; 8] = b"CUEMUEV1";
/// Bytes of an interprocess event's shared page: magic, id, records begun, records completed.
const EVENT_PAGE: usize = 4096;
const RECORDED: usize = 16;
const COMPLETED: usize = 24;

/// The part of an interprocess event (`CU_EVENT_INTERPROCESS`) that other processes see: a page
/// of a memfd holding two counters, the number of records begun and the highest record number
/// whose stream has reached it. The exporting process keeps the memfd open for the event's
/// life; an importing process opens it through `/proc/<pid>/fd/<fd>`, which the 64 bytes of
/// `CUipcEventHandle` name (with the event's id, checked against the page, so that a reused
/// descriptor number is not taken for the event).
pub(crate) struct IpcEvent {
    map: SharedMap,
    id: u64,
}

impl IpcEvent {
    /// A new event's shared page, no record begun.
    pub(crate) fn create() -> std::io::Result<Arc<IpcEvent>> {
        let map = SharedMap::create("cuda-emu-event", EVENT_PAGE)?;
        let id = arena_id();
        let mut header = [0u8; 16];
        header[..8].copy_from_slice(EVENT_MAGIC);
        header[8..16].copy_from_slice(&id.to_le_bytes());
        // SAFETY: the mapping is EVENT_PAGE bytes long and nobody else uses it yet.
        unsafe { std::ptr::copy_nonoverlapping(header.as_ptr(), map.ptr(), header.len()) };
        Ok(Arc::new(IpcEvent { map, id }))
    }

    fn counter(&self, offset: usize) -> &std::sync::atomic::AtomicU64 {
        // SAFETY: `offset` is 8-aligned inside the page-aligned mapping, which lives as long as
        // `self`; every process touches these bytes only through atomics.
        unsafe {
            &*self
                .map
                .ptr()
                .add(offset)
                .cast::<std::sync::atomic::AtomicU64>()
        }
    }

    /// Begins a record: its number, for [`IpcEvent::complete`] once its stream reaches it.
    pub(crate) fn begin_record(&self) -> u64 {
        use std::sync::atomic::Ordering;
        self.counter(RECORDED).fetch_add(1, Ordering::SeqCst) + 1
    }

    /// Record `number` has been reached by its stream.
    pub(crate) fn complete(&self, number: u64) {
        use std::sync::atomic::Ordering;
        self.counter(COMPLETED).fetch_max(number, Ordering::SeqCst);
    }

    /// The latest record begun so far (0: never recorded), what a wait or query is about.
    pub(crate) fn latest(&self) -> u64 {
        use std::sync::atomic::Ordering;
        self.counter(RECORDED).load(Ordering::SeqCst)
    }

    /// Whether record `number` (and so every earlier one) has been reached.
    pub(crate) fn reached(&self, number: u64) -> bool {
        use std::sync::atomic::Ordering;
        self.counter(COMPLETED).load(Ordering::SeqCst) >= number
    }

    /// Blocks until record `number` has been reached. Another process's progress wakes no
    /// condition variable here, so this polls, backing off to a millisecond.
    pub(crate) fn wait(&self, number: u64) {
        let mut pause = std::time::Duration::from_micros(20);
        while !self.reached(number) {
            std::thread::sleep(pause);
            pause = (pause * 2).min(std::time::Duration::from_millis(1));
        }
    }

    /// The 64 bytes of `CUipcEventHandle`: magic, this process's id, the memfd's descriptor
    /// number, the event's id.
    pub(crate) fn encode(&self) -> [u8; 64] {
        use std::os::fd::AsRawFd;
        let mut out = [0u8; 64];
        out[..8].copy_from_slice(EVENT_MAGIC);
        out[8..12].copy_from_slice(&std::process::id().to_le_bytes());
        out[12..16].copy_from_slice(&self.map.file().as_raw_fd().to_le_bytes());
        out[16..24].copy_from_slice(&self.id.to_le_bytes());
        out
    }

    /// Opens the event a handle names (`None`: not an emulator event handle, or its exporting
    /// process or event is gone).
    pub(crate) fn open(handle: &[u8; 64]) -> Option<Arc<IpcEvent>> {
        if &handle[..8] != EVENT_MAGIC {
            return None;
        }
        let pid = u32::from_le_bytes(handle[8..12].try_into().ok()?);
        let fd = i32::from_le_bytes(handle[12..16].try_into().ok()?);
        let id = u64::from_le_bytes(handle[16..24].try_into().ok()?);
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(format!("/proc/{pid}/fd/{fd}"))
            .ok()?;
        let map = SharedMap::map(file).ok()?;
        if map.len() < EVENT_PAGE {
            return None;
        }
        let mut header = [0u8; 16];
        // SAFETY: the mapping is at least EVENT_PAGE bytes long.
        unsafe { std::ptr::copy_nonoverlapping(map.ptr(), header.as_mut_ptr(), header.len()) };
        if &header[..8] != EVENT_MAGIC || header[8..16] != id.to_le_bytes() {
            return None;
        }
        Some(Arc::new(IpcEvent { map, id }))
    }
}
