//! Memory: allocations backed by real host bytes, the address table, memory pools and their
//! accounting, pointer resolution for copies and fills, and the hazard checks on uses and
//! frees.
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
use crate::log::{self, lock, Hazard};
use crate::os::{SharedMap, DEVICE_VA_SIZE};
use crate::state::State;

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
const FREED_MEMORY: usize = 1 << 18;
/// How many freed blocks a pool remembers for handing their addresses out again.
const FREE_BLOCKS: usize = 1024;

/// A block of device addresses a stream-ordered free gave back to its pool: its address can be
/// handed out again to an allocation ordered after that free (`docs/driver-facts.md` F18).
pub(crate) struct FreeBlock {
    pub(crate) addr: u64,
    /// The bytes of address space the block spans (its size rounded up to [`DEVICE_ALIGN`]).
    pub(crate) span: u64,
    /// The stream the free was issued on, and its time there.
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
            Owner::Mapped(_) => {}
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
}

impl AllocKind {
    pub(crate) fn name(self) -> &'static str {
        match self {
            AllocKind::Device => "device",
            AllocKind::Host => "host",
            AllocKind::Managed => "managed",
            AllocKind::Pool => "pool",
            AllocKind::Ipc => "ipc",
        }
    }

    /// Whether the address is the host address of the bytes.
    pub(crate) fn host_accessible(self, pool_host: bool) -> bool {
        matches!(self, AllocKind::Host | AllocKind::Managed) || pool_host
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
    /// Offset inside a shared pool arena: of the block itself for an allocation of an
    /// IPC-capable pool (exportable), of the exporter's block it maps for an import.
    pub(crate) ipc_offset: Option<u64>,
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

fn round_up(v: u64, to: u64) -> u64 {
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

impl State {
    pub(crate) fn create_default_pool(&mut self, device: i32) -> u64 {
        let handle = self.new_handle();
        self.pools.insert(
            handle,
            Pool {
                device,
                host: false,
                handle_types: 0,
                core: PoolCore::new(0),
                default: true,
                access: Vec::new(),
                arena: None,
                exported: false,
                imported: None,
                imported_id: 0,
                free_blocks: VecDeque::new(),
                managed: false,
            },
        );
        handle
    }

    /// A location's default pool that no device entry holds: the host's (`host`), a host NUMA
    /// node's, or a managed pool (`managed`) of a device or of no location.
    pub(crate) fn create_location_pool(&mut self, kind: u32, id: i32, managed: bool) -> u64 {
        let handle = self.new_handle();
        let device = if kind == 1 { id } else { -1 };
        self.pools.insert(
            handle,
            Pool {
                device,
                host: true,
                handle_types: 0,
                core: PoolCore::new(0),
                default: true,
                access: Vec::new(),
                arena: None,
                exported: false,
                imported: None,
                imported_id: 0,
                free_blocks: VecDeque::new(),
                managed,
            },
        );
        handle
    }

    /// A fresh, never reused device address range of `size` bytes.
    pub(crate) fn device_va(&mut self, size: u64) -> Res<u64> {
        let addr = self.va_next;
        let next = addr
            .checked_add(round_up(size.max(1), DEVICE_ALIGN))
            .ok_or(codes::OUT_OF_MEMORY)?;
        if next > self.va_base + DEVICE_VA_SIZE {
            return Err(codes::OUT_OF_MEMORY);
        }
        self.va_next = next;
        Ok(addr)
    }

    /// Whether `addr` lies in the device address range.
    pub(crate) fn is_device_va(&self, addr: u64) -> bool {
        addr >= self.va_base && addr < self.va_base + DEVICE_VA_SIZE
    }

    /// Bytes of device `device` in use (allocations plus pool reservations).
    pub(crate) fn device_used(&self, device: i32) -> u64 {
        let direct = self.device_direct.get(&device).copied().unwrap_or(0);
        let pooled: u64 = self
            .pools
            .values()
            .filter(|p| p.device == device && p.imported.is_none())
            .map(|p| lock(&p.core.stats).reserved)
            .sum();
        direct + pooled
    }

    /// Adds a live allocation under a fresh identity, which it returns, forgetting any freed
    /// range it overlaps (pools hand freed addresses out again, and the system allocator reuses
    /// host addresses).
    pub(crate) fn insert_alloc(&mut self, mut a: Alloc) -> u64 {
        self.next_alloc_id += 1;
        a.id = self.next_alloc_id;
        let id = a.id;
        let end = a.addr + a.size;
        // Freed ranges are disjoint and sorted: walk back from `end` until one ends before us.
        let mut stale = Vec::new();
        for (&p, f) in self.freed.range(..end).rev() {
            if p + f.size <= a.addr {
                break;
            }
            stale.push(p);
        }
        for p in stale {
            self.freed.remove(&p);
        }
        if a.kind == AllocKind::Device {
            *self.device_direct.entry(a.device).or_insert(0) += a.size;
        }
        if self.is_graph_allocation(&a) {
            // A graph allocation made again at its address takes its cached memory back.
            self.graph_cached.remove(&a.addr);
        }
        self.allocs.insert(a.addr, a);
        id
    }

    /// The identity of the live allocation starting at `addr`.
    pub(crate) fn alloc_id(&self, addr: u64) -> Option<u64> {
        self.allocs.get(&addr).map(|a| a.id)
    }

    /// Removes a live allocation from the table (the caller remembers it as freed).
    pub(crate) fn remove_alloc(&mut self, addr: u64) -> Option<Alloc> {
        let a = self.allocs.remove(&addr)?;
        if a.kind == AllocKind::Device {
            if let Some(n) = self.device_direct.get_mut(&a.device) {
                *n = n.saturating_sub(a.size);
            }
        }
        if self.is_graph_allocation(&a) {
            // Freed graph memory stays with the graphs until cuDeviceGraphMemTrim.
            self.graph_cached.insert(a.addr, (a.device, a.size));
        }
        Some(a)
    }

    /// The start of the live allocation containing `addr`.
    pub(crate) fn find_live(&self, addr: u64) -> Option<u64> {
        let (&start, a) = self.allocs.range(..=addr).next_back()?;
        (addr < start + a.size).then_some(start)
    }

    /// The start of the freed range containing `addr`.
    pub(crate) fn find_freed(&self, addr: u64) -> Option<u64> {
        let (&start, f) = self.freed.range(..=addr).next_back()?;
        (addr < start + f.size).then_some(start)
    }

    /// Remembers a freed allocation's range.
    pub(crate) fn remember_freed(&mut self, a: &Alloc, by: &'static str, how: &'static str) {
        self.freed.insert(
            a.addr,
            Freed {
                id: a.id,
                size: a.size,
                host: a.host,
                by,
                how,
            },
        );
        self.freed_order.push_back(a.addr);
        while self.freed_order.len() > FREED_MEMORY {
            if let Some(old) = self.freed_order.pop_front() {
                self.freed.remove(&old);
            }
        }
    }

    /// Resolves `len` bytes at `addr` for an operation by `function` on `stream` (0 for none).
    ///
    /// A pointer in a live allocation must fit in it; a freed device pointer is a
    /// use-after-free hazard; any other pointer outside the device range is pageable host
    /// memory when `host_ok`.
    pub(crate) fn resolve(
        &mut self,
        addr: u64,
        len: u64,
        host_ok: bool,
        function: &'static str,
        stream: u64,
    ) -> Res<Target> {
        if addr == 0 {
            return Err(codes::INVALID_VALUE);
        }
        if let Some(start) = self.find_live(addr) {
            let a = &self.allocs[&start];
            let off = addr - start;
            if off.checked_add(len).is_none_or(|end| end > a.size) {
                return Err(codes::OUT_OF_RANGE);
            }
            return Ok(Target {
                mem: Mem::Backed(a.backing.clone(), off as usize),
                alloc: Some(start),
                id: Some(a.id),
            });
        }
        if let Some(start) = self.find_freed(addr) {
            let f = &self.freed[&start];
            if !(f.host && host_ok) {
                let detail = format!(
                    "{function} touches {addr:#x}, inside {start:#x} ({} bytes, allocation #{}), which was freed by {} ({})",
                    f.size, f.id, f.by, f.how
                );
                log::hazard(Hazard {
                    kind: "use_after_free",
                    ptr: addr,
                    alloc: Some(f.id),
                    function,
                    stream,
                    detail,
                });
                return Err(codes::FREED_POINTER);
            }
        }
        if host_ok && !self.is_device_va(addr) {
            return Ok(Target {
                mem: Mem::Host(addr as usize),
                alloc: None,
                id: None,
            });
        }
        Err(codes::BAD_POINTER)
    }

    /// Records a use of allocation `alloc` at `time` on stream `stream`.
    pub(crate) fn record_use(&mut self, alloc: Option<u64>, stream: u64, time: u64) {
        if let Some(a) = alloc.and_then(|p| self.allocs.get_mut(&p)) {
            a.uses.raise(stream, time);
        }
    }

    /// Checks that a free of `alloc` on `stream` (whose clock is already advanced) is ordered
    /// after every recorded use; reports `unordered_free` when it is not.
    pub(crate) fn check_free_order(&self, alloc: u64, stream: u64, function: &'static str) {
        let (Some(a), Some(s)) = (self.allocs.get(&alloc), self.streams.get(&stream)) else {
            return;
        };
        let late: Vec<String> = a
            .uses
            .iter()
            .filter(|&(c, t)| s.clock.get(c) < t)
            .map(|(c, t)| format!("use #{t} on stream {c:#x}"))
            .collect();
        if !late.is_empty() {
            log::hazard(Hazard {
                kind: "unordered_free",
                ptr: alloc,
                alloc: Some(a.id),
                function,
                stream,
                detail: format!(
                    "{function} of {alloc:#x} (allocation #{}) on stream {stream:#x} is not ordered after {}",
                    a.id,
                    late.join(", ")
                ),
            });
        }
    }

    /// Reports a free of a pointer that is not live.
    pub(crate) fn report_bad_free(&self, addr: u64, function: &'static str, stream: u64) {
        let (detail, alloc) = match self.find_freed(addr) {
            Some(start) => {
                let f = &self.freed[&start];
                let detail = format!(
                    "{function} of {addr:#x}, which was freed by {} ({}) as allocation #{}",
                    f.by, f.how, f.id
                );
                (detail, Some(f.id))
            }
            None => (
                format!("{function} of {addr:#x}, which is not a known allocation"),
                None,
            ),
        };
        log::hazard(Hazard {
            kind: "double_free",
            ptr: addr,
            alloc,
            function,
            stream,
            detail,
        });
    }

    /// Takes a live allocation out of the table at `addr` (which must be its start), leaving a
    /// freed record.
    pub(crate) fn take_alloc(
        &mut self,
        addr: u64,
        by: &'static str,
        how: &'static str,
    ) -> Option<Alloc> {
        let a = self.remove_alloc(addr)?;
        self.remember_freed(&a, by, how);
        Some(a)
    }
}

impl State {
    /// Takes from pool `pool`'s free list the newest block of `size`'s span that an allocation
    /// on `stream` is ordered after.
    fn reusable_block(&mut self, pool: u64, size: u64, stream: u64) -> Option<u64> {
        let clock = &self.streams.get(&stream)?.clock;
        let p = self.pools.get_mut(&pool)?;
        let span = round_up(size.max(1), DEVICE_ALIGN);
        let at = p
            .free_blocks
            .iter()
            .rposition(|b| b.span == span && clock.get(b.stream) >= b.time)?;
        p.free_blocks.remove(at).map(|b| b.addr)
    }

    /// Carves `size` bytes out of pool `pool` (accounting, bytes, address) for an allocation
    /// on stream `stream`, whose clock already includes the allocation, and registers it.
    /// Returns its address.
    ///
    /// A device pool hands out again the most recently freed block of the same span whose free
    /// the allocation is ordered after (same stream, an event wait, host synchronisation): the
    /// real driver reuses addresses (`docs/driver-facts.md` F18). The bytes are fresh either
    /// way. (The real driver may also reuse a block whose free has merely completed on the
    /// GPU; the emulator does not, so that which address comes back depends only on the order
    /// of calls.)
    pub(crate) fn pool_alloc(&mut self, pool: u64, size: u64, stream: u64) -> Res<u64> {
        let (core, arena, host, device) = {
            let p = self.pools.get(&pool).ok_or(codes::BAD_HANDLE)?;
            if p.imported.is_some() {
                return Err(codes::INVALID_VALUE);
            }
            (p.core.clone(), p.arena.clone(), p.host, p.device)
        };
        core.take(size)?;
        let made = match &arena {
            Some(arena) => arena
                .alloc(size)
                .map(|off| (Backing::arena(arena.clone(), off, size as usize), Some(off))),
            None => Backing::heap(size as usize, if host { 4096 } else { 256 }).map(|b| (b, None)),
        };
        let Some((backing, ipc_offset)) = made else {
            core.give_back(size);
            return Err(codes::OUT_OF_MEMORY);
        };
        let addr = if host {
            backing.ptr() as u64
        } else if let Some(addr) = self.reusable_block(pool, size, stream) {
            addr
        } else {
            match self.device_va(size) {
                Ok(a) => a,
                Err(e) => {
                    core.give_back(size);
                    return Err(e);
                }
            }
        };
        self.insert_alloc(Alloc {
            id: 0,
            addr,
            size,
            kind: AllocKind::Pool,
            device,
            ctx: 0,
            pool: Some(pool),
            pool_core: Some(core),
            host,
            backing,
            uses: VectorClock::default(),
            ipc_offset,
        });
        Ok(addr)
    }
}
