//! The emulated driver's state: devices, contexts, streams, events and the tables of every
//! other object, behind one process-wide lock, plus the enqueue path that feeds the executor
//! and the hazard checker.
//!
//! Architecture invariant: a handle is validated against its live table before use and never
//! dereferenced; handle values are never reused within a process, so a stale handle is always
//! recognised, except the one destroyed stream's handle a test hands to the next stream
//! (`custodyEmuReuseStreamHandle`); streams carry an identity of their own (`Stream::id`) for
//! the hazard checker's clocks and `cuStreamGetId`.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet, VecDeque};
use std::sync::{Arc, LazyLock, Mutex, MutexGuard};

use crate::clock::VectorClock;
use crate::codes::{self, Res};
use crate::exec::{Dep, Op, StreamCore};
use crate::graph::{Capture, Graph, GraphExec, UserObject};
use crate::log::CallInfo;
use crate::thread::{current_context, lock, thread_id};

// The state's operations on memory and on graphs, beside the types they use (`crate::memory`,
// `crate::graph`, which know nothing of the state), and what a thread's exit waits for.
mod graph;
mod memory;
mod thread_exit;
use crate::memory::{Alloc, Freed, Pool};

/// Handle values start here and step by 0x100, so no handle is ever a token (0, 1, 2), a small
/// integer, or reused.
const HANDLE_BASE: u64 = 0x5c00_0000_0000;

/// `CU_STREAM_NON_BLOCKING`.
pub(crate) const STREAM_NON_BLOCKING: u32 = 1;
/// Stream priorities on an H200: greatest (numerically lowest) and least.
pub(crate) const GREATEST_PRIORITY: i32 = -5;
pub(crate) const LEAST_PRIORITY: i32 = 0;

static STATE: LazyLock<Mutex<State>> = LazyLock::new(|| Mutex::new(State::new()));

/// Locks the driver state.
pub(crate) fn state() -> MutexGuard<'static, State> {
    lock(&STATE)
}

/// Locks the driver state and checks that `cuInit` has run.
pub(crate) fn initialized() -> Res<MutexGuard<'static, State>> {
    let st = state();
    if st.initialized {
        Ok(st)
    } else {
        Err(codes::NOT_INITIALIZED)
    }
}

pub(crate) struct Device {
    pub(crate) primary: u64,
    pub(crate) primary_refs: u32,
    pub(crate) primary_flags: u32,
    pub(crate) default_pool: u64,
    pub(crate) current_pool: u64,
}

pub(crate) struct Context {
    pub(crate) device: i32,
    pub(crate) primary: bool,
    pub(crate) alive: bool,
    pub(crate) legacy: u64,
    /// Created and per-thread streams (not the legacy stream).
    pub(crate) streams: BTreeSet<u64>,
    /// The last operation and the clock of each stream destroyed with work the host has not
    /// seen complete: a context or device synchronisation still waits for that work and observes
    /// it (`cuCtxSynchronize`: "all preceding requested tasks"; `cuStreamDestroy`: the queued work
    /// still runs). Dropped once done and observed.
    pub(crate) retired: Vec<(Dep, VectorClock)>,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum StreamKind {
    Created,
    Legacy,
    PerThread,
}

pub(crate) struct Stream {
    /// The stream's identity in the hazard checker's clocks and `cuStreamGetId`: its handle,
    /// except for a stream given a destroyed stream's handle
    /// ([`State::reuse_stream_handle`]), which gets a fresh identity, so that the old
    /// stream's work is never mistaken for the new one's.
    pub(crate) id: u64,
    pub(crate) ctx: u64,
    pub(crate) device: i32,
    pub(crate) kind: StreamKind,
    pub(crate) flags: u32,
    pub(crate) priority: i32,
    pub(crate) core: Arc<StreamCore>,
    pub(crate) clock: VectorClock,
    /// The version of the host clock last merged into `clock`.
    pub(crate) host_seen: u64,
    /// The capture this stream takes part in, if any.
    pub(crate) capture: Option<u64>,
}

impl Stream {
    /// Whether the legacy stream synchronises with this stream.
    pub(crate) fn blocking(&self) -> bool {
        self.kind != StreamKind::Legacy && self.flags & STREAM_NON_BLOCKING == 0
    }
}

impl CallInfo {
    /// Records that the call resolved its stream argument to `r`, and `r`'s context. (The call
    /// log's record is defined in `log`, below the state; the state, which knows the streams,
    /// fills it in.)
    pub(crate) fn resolved(&mut self, st: &State, r: u64) {
        self.resolved_stream = Some(r);
        self.stream_context = st.streams.get(&r).map(|s| s.ctx);
    }

    /// Resolves the call's stream argument `s` (a default-stream token or a created stream,
    /// [`State::resolve_stream`]) and records what it resolved to.
    pub(crate) fn resolve_stream(&mut self, st: &mut State, s: u64) -> Res<u64> {
        let r = st.resolve_stream(s)?;
        self.resolved(st, r);
        Ok(r)
    }

    /// Locks the initialized driver state and resolves the call's stream argument `s`, as
    /// [`CallInfo::resolve_stream`]. Returns the locked state and the resolved stream.
    pub(crate) fn lock_stream(&mut self, s: u64) -> Res<(MutexGuard<'static, State>, u64)> {
        let mut st = initialized()?;
        let r = self.resolve_stream(&mut st, s)?;
        Ok((st, r))
    }
}

pub(crate) struct Event {
    pub(crate) ctx: u64,
    /// The `CU_EVENT_*` creation flags.
    pub(crate) flags: u32,
    /// When the host saw the last record's stream reach it (set by the record's operation; the
    /// timing `cuEventElapsedTime` reports).
    pub(crate) recorded_at: Arc<Mutex<Option<std::time::Instant>>>,
    /// The last record: the stream position it waits for and the clock it carries.
    pub(crate) record: Option<(Dep, VectorClock)>,
    /// Set when last recorded in a capture: (capture id, captured nodes).
    pub(crate) captured: Option<(u64, Vec<usize>)>,
    /// An interprocess event's shared page (`CU_EVENT_INTERPROCESS`, or opened with
    /// `cuIpcOpenEventHandle`): every record also counts there, for other processes to see.
    pub(crate) ipc: Option<Arc<crate::ipc::IpcEvent>>,
    /// Opened with `cuIpcOpenEventHandle`: waits and queries that find no record made in this
    /// process follow the shared page (the exporting process's records).
    pub(crate) imported: bool,
}

impl Event {
    /// For an imported event not recorded in this process: the latest record the shared page
    /// shows, to wait for or query (`None`: the local record, if any, is what counts).
    pub(crate) fn shared_target(&self) -> Option<(Arc<crate::ipc::IpcEvent>, u64)> {
        match &self.ipc {
            Some(ipc) if self.imported && self.record.is_none() && self.captured.is_none() => {
                Some((ipc.clone(), ipc.latest()))
            }
            _ => None,
        }
    }
}

pub(crate) struct State {
    pub(crate) initialized: bool,
    pub(crate) devices: Vec<Device>,
    pub(crate) contexts: HashMap<u64, Context>,
    pub(crate) streams: HashMap<u64, Stream>,
    pub(crate) destroyed_streams: HashSet<u64>,
    /// A destroyed stream's handle that the next created stream gets
    /// (`custodyEmuReuseStreamHandle`), as a real driver may hand a freed handle out again.
    pub(crate) reused_stream_handle: Option<u64>,
    pub(crate) per_thread: HashMap<(u64, u64), u64>,
    pub(crate) events: HashMap<u64, Event>,
    pub(crate) pools: HashMap<u64, Pool>,
    pub(crate) allocs: BTreeMap<u64, Alloc>,
    pub(crate) freed: BTreeMap<u64, Freed>,
    pub(crate) freed_order: VecDeque<u64>,
    /// Address ranges that graph allocation nodes hand out when their graph runs.
    pub(crate) graph_reserved: BTreeMap<u64, u64>,
    /// Graph allocations freed since the last `cuDeviceGraphMemTrim` of their device: address
    /// -> (device, bytes). Their memory still counts as the graphs' (used and reserved).
    pub(crate) graph_cached: BTreeMap<u64, (i32, u64)>,
    pub(crate) graphs: HashMap<u64, Graph>,
    /// Node handle -> (graph, index in the graph).
    pub(crate) nodes: HashMap<u64, (u64, usize)>,
    pub(crate) execs: HashMap<u64, GraphExec>,
    /// Conditional handles (`cuGraphConditionalHandleCreate`), until their graph is destroyed.
    pub(crate) conditions: HashMap<u64, crate::graph::Condition>,
    /// A conditional node's body graphs ([`crate::graph::NodeKind::Conditional`]'s `bodies`):
    /// the driver-owned array that `phGraph_out` points to, alive as long as the node.
    pub(crate) cond_bodies: HashMap<u64, Box<[u64]>>,
    pub(crate) user_objects: HashMap<u64, UserObject>,
    pub(crate) captures: HashMap<u64, Capture>,
    /// What the host has seen complete (stream, event and context synchronisation, synchronous
    /// calls). Shared by all host threads: the emulator sees one global order of driver calls,
    /// so work one thread has waited for is complete for every call issued afterwards.
    pub(crate) host_clock: VectorClock,
    /// Bumped whenever `host_clock` grows.
    pub(crate) host_version: u64,
    /// Bytes of `cuMemAlloc` memory per device.
    pub(crate) device_direct: HashMap<i32, u64>,
    next_handle: u64,
    pub(crate) va_base: u64,
    pub(crate) va_next: u64,
    pub(crate) next_capture_id: u64,
    /// The last allocation identity handed out ([`crate::memory::Alloc::id`]).
    pub(crate) next_alloc_id: u64,
}

impl State {
    fn new() -> State {
        let va_base = crate::os::reserve_device_va();
        State {
            initialized: false,
            devices: Vec::new(),
            contexts: HashMap::new(),
            streams: HashMap::new(),
            destroyed_streams: HashSet::new(),
            reused_stream_handle: None,
            per_thread: HashMap::new(),
            events: HashMap::new(),
            pools: HashMap::new(),
            allocs: BTreeMap::new(),
            freed: BTreeMap::new(),
            freed_order: VecDeque::new(),
            graph_reserved: BTreeMap::new(),
            graph_cached: BTreeMap::new(),
            graphs: HashMap::new(),
            nodes: HashMap::new(),
            execs: HashMap::new(),
            conditions: HashMap::new(),
            cond_bodies: HashMap::new(),
            user_objects: HashMap::new(),
            captures: HashMap::new(),
            host_clock: VectorClock::default(),
            host_version: 1,
            device_direct: HashMap::new(),
            next_handle: 0,
            va_base,
            va_next: va_base + 0x1000_0000,
            next_capture_id: 1,
            next_alloc_id: 0,
        }
    }

    /// Makes the next created stream take `handle`, the handle of a destroyed stream; `false`
    /// (and nothing changes) when `handle` is not one.
    pub(crate) fn reuse_stream_handle(&mut self, handle: u64) -> bool {
        if !self.destroyed_streams.contains(&handle) || self.streams.contains_key(&handle) {
            return false;
        }
        self.reused_stream_handle = Some(handle);
        true
    }

    /// The handle and the identity of a stream about to be created: a fresh handle, or the
    /// destroyed stream's handle [`State::reuse_stream_handle`] named (no longer destroyed)
    /// with a fresh identity.
    pub(crate) fn new_stream_handle(&mut self) -> (u64, u64) {
        match self.reused_stream_handle.take() {
            Some(handle) if self.destroyed_streams.remove(&handle) => (handle, self.new_handle()),
            _ => {
                let handle = self.new_handle();
                (handle, handle)
            }
        }
    }

    /// A fresh handle value, never handed out before in this process.
    pub(crate) fn new_handle(&mut self) -> u64 {
        self.next_handle += 1;
        HANDLE_BASE + self.next_handle * 0x100
    }

    /// `cuInit`: creates the devices (count from `CUSTODY_EMU_DEVICE_COUNT`, default 2), their
    /// (inactive) primary contexts and default memory pools.
    pub(crate) fn init(&mut self) {
        if self.initialized {
            return;
        }
        let count = std::env::var("CUSTODY_EMU_DEVICE_COUNT")
            .ok()
            .and_then(|v| v.trim().parse::<i32>().ok())
            .unwrap_or(2)
            .clamp(0, 64);
        for ordinal in 0..count {
            let primary = self.new_handle();
            self.contexts.insert(
                primary,
                Context {
                    device: ordinal,
                    primary: true,
                    alive: false,
                    legacy: 0,
                    streams: BTreeSet::new(),
                    retired: Vec::new(),
                },
            );
            let pool = self.create_default_pool(ordinal);
            self.devices.push(Device {
                primary,
                primary_refs: 0,
                primary_flags: 0,
                default_pool: pool,
                current_pool: pool,
            });
        }
        self.initialized = true;
    }

    pub(crate) fn device(&self, ordinal: i32) -> Res<&Device> {
        usize::try_from(ordinal)
            .ok()
            .and_then(|i| self.devices.get(i))
            .ok_or(codes::BAD_DEVICE)
    }

    pub(crate) fn device_mut(&mut self, ordinal: i32) -> Res<&mut Device> {
        usize::try_from(ordinal)
            .ok()
            .and_then(|i| self.devices.get_mut(i))
            .ok_or(codes::BAD_DEVICE)
    }

    /// `ctx` when it is a live context (an active primary or a created one not destroyed).
    ///
    /// # Errors
    /// `BAD_CONTEXT` for any other value.
    pub(crate) fn live_context(&self, ctx: u64) -> Res<u64> {
        match self.contexts.get(&ctx) {
            Some(c) if c.alive => Ok(ctx),
            _ => Err(codes::BAD_CONTEXT),
        }
    }

    /// The context current on the calling thread.
    ///
    /// # Errors
    /// `NO_CONTEXT` with none current, `BAD_CONTEXT` when it was destroyed.
    pub(crate) fn current_ctx(&self) -> Res<u64> {
        match current_context() {
            0 => Err(codes::NO_CONTEXT),
            c => self.live_context(c),
        }
    }

    /// Makes a context live: gives it a fresh legacy stream.
    pub(crate) fn activate_context(&mut self, ctx: u64) {
        let legacy = self.new_handle();
        let Some(c) = self.contexts.get_mut(&ctx) else {
            return;
        };
        c.alive = true;
        c.legacy = legacy;
        let device = c.device;
        self.streams.insert(
            legacy,
            Stream {
                id: legacy,
                ctx,
                device,
                kind: StreamKind::Legacy,
                flags: 0,
                priority: LEAST_PRIORITY,
                core: StreamCore::new(legacy),
                clock: VectorClock::default(),
                host_seen: 0,
                capture: None,
            },
        );
    }

    /// Every stream of `ctx`, the legacy stream included.
    pub(crate) fn context_streams(&self, ctx: u64) -> Vec<u64> {
        let Some(c) = self.contexts.get(&ctx) else {
            return Vec::new();
        };
        let mut out: Vec<u64> = c.streams.iter().copied().collect();
        if c.alive {
            out.push(c.legacy);
        }
        out
    }

    /// Ends a context's life: its streams are destroyed (their queued work still runs) and its
    /// `cuMemAlloc`/`cuMemAllocHost`/`cuMemAllocManaged` memory goes with it (F9). Pool memory
    /// stays (F10).
    pub(crate) fn retire_context(&mut self, ctx: u64, by: &'static str) {
        for s in self.context_streams(ctx) {
            self.destroy_stream_entry(s);
        }
        self.per_thread.retain(|_, s| self.streams.contains_key(s));
        let owned: Vec<u64> = self
            .allocs
            .iter()
            .filter(|(_, a)| a.ctx == ctx && a.pool.is_none())
            .map(|(&p, _)| p)
            .collect();
        for p in owned {
            if let Some(a) = self.remove_alloc(p) {
                self.remember_freed(&a, by, "it went with its context");
            }
        }
        if let Some(c) = self.contexts.get_mut(&ctx) {
            c.alive = false;
            c.streams.clear();
            c.legacy = 0;
        }
    }

    /// Removes a stream from the live table; remembers its handle as destroyed.
    pub(crate) fn destroy_stream_entry(&mut self, s: u64) {
        if let Some(stream) = self.streams.remove(&s) {
            let host = &self.host_clock;
            let seen = |dep: &Dep, clock: &VectorClock| {
                dep.done() && clock.iter().all(|(c, t)| host.get(c) >= t)
            };
            if let Some(c) = self.contexts.get_mut(&stream.ctx) {
                c.streams.remove(&s);
                c.retired.retain(|(dep, clock)| !seen(dep, clock));
                let last = stream.core.tail_always();
                if !seen(&last, &stream.clock) {
                    c.retired.push((last, stream.clock.clone()));
                }
            }
            if let Some(id) = stream.capture {
                self.invalidate_capture(id);
            }
            self.destroyed_streams.insert(s);
        }
    }

    /// The calling thread's per-thread default stream in `ctx`, created on first use.
    pub(crate) fn per_thread_stream(&mut self, ctx: u64) -> u64 {
        let key = (thread_id(), ctx);
        if let Some(&s) = self.per_thread.get(&key) {
            if self.streams.contains_key(&s) {
                return s;
            }
        }
        let handle = self.new_handle();
        let device = self.contexts.get(&ctx).map_or(0, |c| c.device);
        self.streams.insert(
            handle,
            Stream {
                id: handle,
                ctx,
                device,
                kind: StreamKind::PerThread,
                flags: 0,
                priority: LEAST_PRIORITY,
                core: StreamCore::new(handle),
                clock: VectorClock::default(),
                host_seen: 0,
                capture: None,
            },
        );
        if let Some(c) = self.contexts.get_mut(&ctx) {
            c.streams.insert(handle);
        }
        self.per_thread.insert(key, handle);
        // Its exit now waits for this stream (docs/driver-facts.md F24).
        thread_exit::watch_this_thread(key.0);
        handle
    }

    /// Resolves a stream argument: the tokens NULL and `CU_STREAM_LEGACY` to the legacy stream
    /// of the calling thread's context, `CU_STREAM_PER_THREAD` to the calling thread's
    /// per-thread stream in it, and a handle to itself.
    ///
    /// # Errors
    /// `NO_CONTEXT`/`BAD_CONTEXT` for a token without a usable current context, `BAD_HANDLE`
    /// for an unknown or destroyed stream.
    pub(crate) fn resolve_stream(&mut self, s: u64) -> Res<u64> {
        match s {
            0 | 1 => {
                let ctx = self.current_ctx()?;
                Ok(self.contexts[&ctx].legacy)
            }
            2 => {
                let ctx = self.current_ctx()?;
                Ok(self.per_thread_stream(ctx))
            }
            h if self.streams.contains_key(&h) => Ok(h),
            _ => Err(codes::BAD_HANDLE),
        }
    }

    /// Orders the next operation on stream `s`: computes the streams it must wait for (the
    /// legacy stream's implicit synchronisation) and advances the stream's clock, which
    /// inherits what the host has seen complete. Returns the dependencies and the operation's
    /// time on the stream's component.
    pub(crate) fn prepare(&mut self, s: u64) -> (Vec<Dep>, u64) {
        let mut deps = Vec::new();
        let mut merged = VectorClock::default();
        let (ctx, kind, blocking) = {
            let st = &self.streams[&s];
            (st.ctx, st.kind, st.blocking())
        };
        if let Some(c) = self.contexts.get(&ctx) {
            if kind == StreamKind::Legacy {
                for other in &c.streams {
                    if let Some(o) = self.streams.get(other) {
                        if o.blocking() {
                            deps.extend(o.core.tail());
                            merged.merge(&o.clock);
                        }
                    }
                }
            } else if blocking {
                if let Some(l) = self.streams.get(&c.legacy) {
                    deps.extend(l.core.tail());
                    merged.merge(&l.clock);
                }
            }
        }
        let stream = self.streams.get_mut(&s).expect("prepared stream is live");
        if stream.host_seen != self.host_version {
            stream.clock.merge(&self.host_clock);
            stream.host_seen = self.host_version;
        }
        stream.clock.merge(&merged);
        let time = stream.clock.tick(stream.id);
        (deps, time)
    }

    /// Enqueues `run` on stream `s` after `deps`.
    pub(crate) fn submit(
        &mut self,
        s: u64,
        deps: Vec<Dep>,
        run: Option<Box<dyn FnOnce() + Send>>,
        defer: bool,
    ) -> u64 {
        let core = self.streams[&s].core.clone();
        core.submit(Op { deps, run, defer })
    }

    /// What waiting for stream `s` means: its current tail and clock.
    pub(crate) fn stream_target(&self, s: u64) -> (Dep, VectorClock) {
        let st = &self.streams[&s];
        (st.core.tail_always(), st.clock.clone())
    }

    /// Records that the host has seen work complete: merges `clock` into the host clock and
    /// lets pools release memory above their release threshold.
    pub(crate) fn host_observed(&mut self, clock: &VectorClock) {
        if clock.iter().any(|(c, t)| self.host_clock.get(c) < t) {
            self.host_clock.merge(clock);
            self.host_version += 1;
        }
        for pool in self.pools.values() {
            pool.core.release_after_sync();
        }
    }

    /// The targets of a whole-context synchronisation.
    pub(crate) fn context_targets(&self, ctx: u64) -> (Vec<Dep>, VectorClock) {
        let mut deps = Vec::new();
        let mut clock = VectorClock::default();
        for s in self.context_streams(ctx) {
            let (d, c) = self.stream_target(s);
            deps.push(d);
            clock.merge(&c);
        }
        if let Some(c) = self.contexts.get(&ctx) {
            for (d, c) in &c.retired {
                deps.push(d.clone());
                clock.merge(c);
            }
        }
        (deps, clock)
    }

    /// The targets of a device-wide synchronisation (all contexts of `device`, or all devices
    /// for `None`).
    pub(crate) fn device_targets(&self, device: Option<i32>) -> (Vec<Dep>, VectorClock) {
        let mut deps = Vec::new();
        let mut clock = VectorClock::default();
        for st in self.streams.values() {
            if device.is_none_or(|d| d == st.device) {
                deps.push(st.core.tail_always());
                clock.merge(&st.clock);
            }
        }
        for c in self.contexts.values() {
            if device.is_none_or(|d| d == c.device) {
                for (d, c) in &c.retired {
                    deps.push(d.clone());
                    clock.merge(c);
                }
            }
        }
        (deps, clock)
    }
}
