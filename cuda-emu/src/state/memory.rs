//! The state's memory operations: the address table (insertion, lookup, removal, the
//! remembered frees), pointer resolution for copies and fills, the hazard checks on uses and
//! frees, and allocation from pools (a device pool's freed addresses handed out again,
//! `docs/driver-facts.md` F18). The types they work on are in [`crate::memory`].

use crate::codes::{self, Res};
use crate::log::{self, Hazard};
use crate::memory::{
    round_up, Alloc, AllocKind, Backing, Freed, Mem, Pool, Target, DEVICE_ALIGN, FREED_MEMORY,
};
use crate::os::DEVICE_VA_SIZE;
use crate::state::State;
use crate::thread::lock;

impl State {
    pub(crate) fn create_default_pool(&mut self, device: i32) -> u64 {
        let handle = self.new_handle();
        self.pools.insert(
            handle,
            Pool {
                default: true,
                ..Pool::new(device, false, 0)
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
                default: true,
                managed,
                ..Pool::new(device, true, 0)
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
    /// A memset on stream `stream` of memory from a host-located pool needs the stream's device
    /// to have been granted access to the pool (`cuMemPoolSetAccess`): a host pool starts with
    /// none, in the process that made it and in one that imported it, and the memset is then
    /// `CUDA_ERROR_INVALID_VALUE` (measured on an H200, driver 580.159.04:
    /// `docs/driver-facts.md` F21; copies were not measured and are not checked).
    pub(crate) fn check_device_access(&self, alloc: Option<u64>, stream: u64) -> Res {
        let Some(pool) = alloc.and_then(|start| self.allocs[&start].pool) else {
            return Ok(());
        };
        let (Some(p), Some(s)) = (self.pools.get(&pool), self.streams.get(&stream)) else {
            return Ok(());
        };
        let device = cuda_sys::types::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE as u32;
        let granted = p
            .access
            .iter()
            .any(|&((kind, id), flags)| kind == device && id == s.device && flags != 0);
        // Measured for IPC-capable (shareable) host pools, made here or imported; a host pool
        // without a shareable handle type was not, and is left as it was.
        let shareable = p.handle_types != 0 || p.imported.is_some();
        if p.host && !p.managed && shareable && !granted {
            return Err(codes::NO_POOL_ACCESS);
        }
        Ok(())
    }

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

    /// Records a use of allocation `alloc` at `time` on stream `stream` (whose clock is already
    /// advanced), and reports `use_before_alloc` when the allocation is stream-ordered and
    /// `stream` is not ordered after it (made on another stream with no event wait, host
    /// synchronisation or legacy-stream barrier in between).
    pub(crate) fn record_use(&mut self, alloc: Option<u64>, stream: u64, time: u64) {
        let (id, clock) = self
            .streams
            .get(&stream)
            .map_or((stream, None), |s| (s.id, Some(&s.clock)));
        let Some(a) = alloc.and_then(|p| self.allocs.get_mut(&p)) else {
            return;
        };
        a.uses.raise(id, time);
        let Some((made_on, made_at)) = a.made else {
            return;
        };
        if clock.is_none_or(|clock| clock.get(made_on) >= made_at) {
            return;
        }
        let function = log::current_function();
        log::hazard(Hazard {
            kind: "use_before_alloc",
            ptr: a.addr,
            alloc: Some(a.id),
            function,
            stream,
            detail: format!(
                "{function} on stream {stream:#x} uses {:#x} (allocation #{}), which was allocated \
                 on stream {made_on:#x} at #{made_at}, with nothing ordering this stream after it",
                a.addr, a.id
            ),
        });
    }

    /// Marks the allocation at `addr` as made in stream order on `stream` at `time`.
    pub(crate) fn record_stream_ordered_allocation(&mut self, addr: u64, stream: u64, time: u64) {
        let id = self.streams.get(&stream).map_or(stream, |s| s.id);
        if let Some(a) = self.allocs.get_mut(&addr) {
            a.made = Some((id, time));
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
            pool: Some(pool),
            pool_core: Some(core),
            ipc_offset,
            ..Alloc::new(addr, size, AllocKind::Pool, device, host, backing)
        });
        Ok(addr)
    }
}
