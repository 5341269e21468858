//! Memory: allocations backed by real host bytes, memory pools and their accounting, and the
//! byte copies and fills. The state's operations on them (the address table, pointer
//! resolution, the hazard checks on uses and frees, pool allocation) are in `state/memory.rs`.
//!
//! Device memory lives at addresses inside a reserved, inaccessible range of the process's
//! address space (so it is never mistaken for a host pointer) and is backed by separate heap
//! bytes. Host-accessible memory (`cuMemAllocHost`, managed memory, host pools) is backed at its
//! own address. A device pool hands a freed address out again to an allocation ordered after
//! the free (`docs/driver-facts.md` F18); every other device address is fresh. So an address
//! does not identify an allocation: [`Alloc::id`] does, and the hazard checker, the queries and
//! graph nodes go by it.

use std::alloc::Layout;
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use crate::clock::VectorClock;
use crate::codes::{self, Res};
use crate::ipc::Arena;
use crate::os::SharedMap;
use crate::thread::lock;

/// Alignment of device pointers.
pub(crate) const DEVICE_ALIGN: u64 = 512;
/// Pools reserve and release memory in multiples of this size.
pub(crate) const POOL_GRANULARITY: u64 = 2 << 20;
/// The least a pool reserves when it grows, and so the least it holds while anything is in
/// use: a 1000-byte allocation from a new pool reserved 32 MiB on an H200 (driver 580.159.04).
/// A pool's `maxSize` is rounded up to a multiple of it (guess, the one rule found that fits the
/// measurement that a pool created with a 2 MiB `maxSize` gives a 4 MiB allocation).
pub(crate) const POOL_CHUNK: u64 = 32 << 20;
/// Memory each emulated device reports (80 GiB).
pub(crate) const DEVICE_MEMORY: u64 = 80 << 30;
/// How many freed ranges are remembered for use-after-free and double-free reports.
pub(crate) const FREED_MEMORY: usize = 1 << 18;
/// How many freed blocks a pool remembers for handing their addresses out again.
pub(crate) const FREE_BLOCKS: usize = 1024;

/// A block of device addresses a stream-ordered free gave back to its pool: its address can be
/// handed out again to an allocation ordered after that free (`docs/driver-facts.md` F18).
pub(crate) struct FreeBlock {
    pub(crate) addr: u64,
    /// The bytes of address space the block spans (its size rounded up to [`DEVICE_ALIGN`]).
    pub(crate) span: u64,
    /// The identity of the stream the free was issued on (`Stream::id`), and its time there.
    pub(crate) stream: u64,
    pub(crate) time: u64,
}

/// Where an allocation's bytes are.
pub(crate) struct Backing {
    ptr: *mut u8,
    len: usize,
    owner: Owner,
}

enum Owner {
    Heap(Layout),
    Arena(Arc<Arena>, u64),
    Mapped(#[allow(dead_code)] Arc<SharedMap>),
    /// The program's own bytes (`cuMemHostRegister`): never freed here.
    Program,
}

// SAFETY: a Backing is plain memory owned by the value; concurrent access to the bytes is the
// program's business, exactly as with device memory.
unsafe impl Send for Backing {}
// SAFETY: as for Send; the struct has no interior mutability.
unsafe impl Sync for Backing {}

impl Backing {
    /// Zeroed heap bytes, `None` when the host cannot give them.
    pub(crate) fn heap(len: usize, align: usize) -> Option<Arc<Backing>> {
        let layout = Layout::from_size_align(len.max(1), align).ok()?;
        // SAFETY: the layout has a non-zero size.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        (!ptr.is_null()).then(|| {
            Arc::new(Backing {
                ptr,
                len,
                owner: Owner::Heap(layout),
            })
        })
    }

    /// A block of a shared pool arena, returned to it on drop.
    pub(crate) fn arena(arena: Arc<Arena>, offset: u64, len: usize) -> Arc<Backing> {
        // SAFETY: the arena handed out [offset, offset + len) inside its mapping.
        let ptr = unsafe { arena.map().ptr().add(offset as usize) };
        Arc::new(Backing {
            ptr,
            len,
            owner: Owner::Arena(arena, offset),
        })
    }

    /// A view of a mapping another process owns (an imported pool allocation).
    pub(crate) fn mapped(map: Arc<SharedMap>, offset: u64, len: usize) -> Option<Arc<Backing>> {
        if offset.checked_add(len as u64)? > map.len() as u64 {
            return None;
        }
        // SAFETY: checked above that the range lies inside the mapping.
        let ptr = unsafe { map.ptr().add(offset as usize) };
        Some(Arc::new(Backing {
            ptr,
            len,
            owner: Owner::Mapped(map),
        }))
    }

    /// The program's own `len` bytes at `ptr`, registered with `cuMemHostRegister`: read and
    /// written where they are, left to the program when the registration goes.
    pub(crate) fn program(ptr: *mut u8, len: usize) -> Arc<Backing> {
        Arc::new(Backing {
            ptr,
            len,
            owner: Owner::Program,
        })
    }

    pub(crate) fn ptr(&self) -> *mut u8 {
        self.ptr
    }
}

impl Drop for Backing {
    fn drop(&mut self) {
        match &self.owner {
            // SAFETY: allocated in `heap` with this layout, freed once.
            Owner::Heap(layout) => unsafe { std::alloc::dealloc(self.ptr, *layout) },
            Owner::Arena(arena, offset) => arena.free(*offset, self.len as u64),
            Owner::Mapped(_) | Owner::Program => {}
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum AllocKind {
    Device,
    Host,
    Managed,
    Pool,
    Ipc,
    /// The program's host memory, page-locked by `cuMemHostRegister`.
    Registered,
}

impl AllocKind {
    pub(crate) fn name(self) -> &'static str {
        match self {
            AllocKind::Device => "device",
            AllocKind::Host => "host",
            AllocKind::Managed => "managed",
            AllocKind::Pool => "pool",
            AllocKind::Ipc => "ipc",
            AllocKind::Registered => "registered",
        }
    }

    /// Whether the address is the host address of the bytes.
    pub(crate) fn host_accessible(self, pool_host: bool) -> bool {
        matches!(
            self,
            AllocKind::Host | AllocKind::Managed | AllocKind::Registered
        ) || pool_host
    }
}

/// One live allocation.
pub(crate) struct Alloc {
    /// The allocation's identity: unique in the process and never reused, unlike its address
    /// (a pool hands a freed address out again: `docs/driver-facts.md` F18). Set by
    /// [`State::insert_alloc`].
    pub(crate) id: u64,
    pub(crate) addr: u64,
    pub(crate) size: u64,
    pub(crate) kind: AllocKind,
    /// -1 for host memory.
    pub(crate) device: i32,
    /// Owning context (`cuMemAlloc`, `cuMemAllocHost`, managed), 0 otherwise.
    pub(crate) ctx: u64,
    pub(crate) pool: Option<u64>,
    pub(crate) pool_core: Option<Arc<PoolCore>>,
    /// Whether it lives in host memory (host pool, pinned, managed).
    pub(crate) host: bool,
    pub(crate) backing: Arc<Backing>,
    /// The last use on each stream: component -> time.
    pub(crate) uses: VectorClock,
    /// For a stream-ordered allocation, where it was made: its stream's clock component and
    /// the time of the allocation there. A use on a stream whose clock has not reached it is
    /// `use_before_alloc`.
    pub(crate) made: Option<(u64, u64)>,
    /// Offset inside a shared pool arena: of the block itself for an allocation of an
    /// IPC-capable pool (exportable), of the exporter's block it maps for an import.
    pub(crate) ipc_offset: Option<u64>,
}

impl Alloc {
    /// An allocation of `size` bytes at `addr` of `kind` on `device` (-1: host memory), living in
    /// host memory or not (`host`): of no context, pool or arena block, and used by no stream
    /// yet. Its identity is set by [`State::insert_alloc`](crate::state::State::insert_alloc).
    pub(crate) fn new(
        addr: u64,
        size: u64,
        kind: AllocKind,
        device: i32,
        host: bool,
        backing: Arc<Backing>,
    ) -> Alloc {
        Alloc {
            id: 0,
            addr,
            size,
            kind,
            device,
            ctx: 0,
            pool: None,
            pool_core: None,
            host,
            backing,
            uses: VectorClock::default(),
            made: None,
            ipc_offset: None,
        }
    }
}

/// A freed range, remembered to classify later uses and frees.
pub(crate) struct Freed {
    /// The identity of the allocation that was freed.
    pub(crate) id: u64,
    pub(crate) size: u64,
    pub(crate) host: bool,
    pub(crate) by: &'static str,
    pub(crate) how: &'static str,
}

/// The bytes an operation touches: an allocation's backing at an offset, or pageable host
/// memory at a raw address.
#[derive(Clone)]
pub(crate) enum Mem {
    Backed(Arc<Backing>, usize),
    Host(usize),
}

impl Mem {
    pub(crate) fn ptr(&self) -> *mut u8 {
        match self {
            // SAFETY: resolution checked that offset lies inside the backing.
            Mem::Backed(b, off) => unsafe { b.ptr().add(*off) },
            Mem::Host(addr) => *addr as *mut u8,
        }
    }

    pub(crate) fn is_pageable(&self) -> bool {
        matches!(self, Mem::Host(_))
    }

    pub(crate) fn offset(&self, by: usize) -> Mem {
        match self {
            Mem::Backed(b, off) => Mem::Backed(b.clone(), off + by),
            Mem::Host(addr) => Mem::Host(addr + by),
        }
    }
}

/// A resolved operand: its bytes and the allocation it belongs to (for hazard bookkeeping).
#[derive(Clone)]
pub(crate) struct Target {
    pub(crate) mem: Mem,
    /// The start address of the live allocation, if the operand is one.
    pub(crate) alloc: Option<u64>,
    /// That allocation's identity.
    pub(crate) id: Option<u64>,
}

/// Copies `len` bytes (overlap allowed).
pub(crate) fn copy_bytes(dst: &Mem, src: &Mem, len: usize) {
    if len == 0 {
        return;
    }
    // SAFETY: both operands were resolved and range-checked against live allocations, or are
    // host memory the caller vouched for by passing it (the driver's contract); `copy` allows
    // overlap.
    unsafe { std::ptr::copy(src.ptr(), dst.ptr(), len) }
}

/// Fills `count` elements of `elem` bytes (1, 2 or 4) with `value`, in `height` rows `pitch`
/// bytes apart.
pub(crate) fn fill(dst: &Mem, value: u32, elem: usize, count: usize, height: usize, pitch: usize) {
    let bytes = value.to_ne_bytes();
    for row in 0..height.max(1) {
        let base = dst.ptr().wrapping_add(row * pitch);
        for i in 0..count {
            // SAFETY: resolution checked that rows * pitch + count * elem bytes lie inside the
            // destination allocation (or caller-provided host memory).
            unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), base.add(i * elem), elem) }
        }
    }
}

/// The mutable accounting of a memory pool, shared with the stream operations that return
/// memory to it.
pub(crate) struct PoolCore {
    pub(crate) stats: Mutex<PoolStats>,
    /// The most the pool may hold: its `maxSize` rounded up to [`POOL_CHUNK`]s, or the device's
    /// memory when it has none.
    limit: u64,
}

/// The most a pool created with `max_size` (0: none) may hold, in bytes.
pub(crate) fn pool_limit(max_size: u64) -> u64 {
    if max_size == 0 {
        DEVICE_MEMORY
    } else {
        round_up(max_size, POOL_CHUNK).min(DEVICE_MEMORY)
    }
}

#[derive(Default, Clone)]
pub(crate) struct PoolStats {
    pub(crate) used: u64,
    pub(crate) used_high: u64,
    pub(crate) reserved: u64,
    pub(crate) reserved_high: u64,
    pub(crate) release_threshold: u64,
    pub(crate) reuse_follow_event_dependencies: bool,
    pub(crate) reuse_allow_opportunistic: bool,
    pub(crate) reuse_allow_internal_dependencies: bool,
}

pub(crate) fn round_up(v: u64, to: u64) -> u64 {
    v.div_ceil(to) * to
}

impl PoolCore {
    pub(crate) fn new(max_size: u64) -> Arc<PoolCore> {
        Arc::new(PoolCore {
            stats: Mutex::new(PoolStats {
                reuse_follow_event_dependencies: true,
                reuse_allow_opportunistic: true,
                reuse_allow_internal_dependencies: true,
                ..PoolStats::default()
            }),
            limit: pool_limit(max_size),
        })
    }

    /// What the pool must keep reserved to hold `used` bytes.
    fn needed(&self, used: u64) -> u64 {
        if used == 0 {
            0
        } else {
            round_up(used, POOL_GRANULARITY)
                .max(POOL_CHUNK)
                .min(self.limit)
        }
    }

    /// Accounts an allocation of `size` bytes. A pool that must grow reserves at least a
    /// [`POOL_CHUNK`] more.
    pub(crate) fn take(&self, size: u64) -> Res {
        let mut s = lock(&self.stats);
        let used = s.used + size;
        if used > self.limit {
            return Err(codes::OUT_OF_MEMORY);
        }
        s.used = used;
        s.used_high = s.used_high.max(used);
        if used > s.reserved {
            let grow = round_up(used - s.reserved, POOL_GRANULARITY).max(POOL_CHUNK);
            s.reserved = (s.reserved + grow).min(self.limit);
            s.reserved_high = s.reserved_high.max(s.reserved);
        }
        Ok(())
    }

    /// Returns `size` bytes to the pool (they stay reserved).
    pub(crate) fn give_back(&self, size: u64) {
        let mut s = lock(&self.stats);
        s.used = s.used.saturating_sub(size);
    }

    /// After a synchronisation, memory above the release threshold goes back to the system.
    pub(crate) fn release_after_sync(&self) {
        let mut s = lock(&self.stats);
        let keep = self.needed(s.used).max(s.release_threshold);
        if s.reserved > keep {
            s.reserved = keep;
        }
    }

    /// `cuMemPoolTrimTo`.
    pub(crate) fn trim_to(&self, min_keep: u64) {
        let mut s = lock(&self.stats);
        let keep = self
            .needed(s.used)
            .max(round_up(min_keep, POOL_GRANULARITY));
        if s.reserved > keep {
            s.reserved = keep;
        }
    }
}

/// A memory pool.
pub(crate) struct Pool {
    /// -1 for a host pool.
    pub(crate) device: i32,
    pub(crate) host: bool,
    pub(crate) handle_types: u32,
    pub(crate) core: Arc<PoolCore>,
    pub(crate) default: bool,
    /// (location type, location id) -> access flags.
    pub(crate) access: Vec<((u32, i32), u32)>,
    /// Shared arena for IPC-capable pools.
    pub(crate) arena: Option<Arc<Arena>>,
    /// Whether `cuMemPoolExportToShareableHandle` has succeeded on it: a real driver exports no
    /// pointer of a pool that was never exported (measured on an H200, driver 580.159.04).
    pub(crate) exported: bool,
    /// An imported pool: its mapping of the exporter's arena.
    pub(crate) imported: Option<Arc<SharedMap>>,
    pub(crate) imported_id: u64,
    /// Freed device address ranges, oldest first, at most [`FREE_BLOCKS`]. Host pools keep
    /// none: their addresses are the bytes' host addresses.
    pub(crate) free_blocks: VecDeque<FreeBlock>,
    /// A pool of managed memory (`CU_MEM_ALLOCATION_TYPE_MANAGED`): host-accessible bytes at
    /// their own address, reported as device memory that is not `IS_MANAGED` (cuda.core 1.2
    /// relies on that for pool-allocated managed memory).
    pub(crate) managed: bool,
}

impl Pool {
    /// A pool of `device` (-1: none) holding host memory (`host`) or not, of at most `max_size`
    /// bytes (0: no limit, [`pool_limit`]): not a default pool, of no handle types, with no
    /// access granted beyond its own device, not exported, imported or freed from yet.
    pub(crate) fn new(device: i32, host: bool, max_size: u64) -> Pool {
        Pool {
            device,
            host,
            handle_types: 0,
            core: PoolCore::new(max_size),
            default: false,
            access: Vec::new(),
            arena: None,
            exported: false,
            imported: None,
            imported_id: 0,
            free_blocks: VecDeque::new(),
            managed: false,
        }
    }

    /// Remembers the range of a stream-ordered free issued on `stream` at `time`, for reuse.
    pub(crate) fn remember_free_block(&mut self, addr: u64, size: u64, stream: u64, time: u64) {
        if self.host || self.imported.is_some() {
            return;
        }
        if self.free_blocks.len() == FREE_BLOCKS {
            self.free_blocks.pop_front();
        }
        self.free_blocks.push_back(FreeBlock {
            addr,
            span: round_up(size.max(1), DEVICE_ALIGN),
            stream,
            time,
        });
    }
}
