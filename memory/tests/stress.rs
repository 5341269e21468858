//! Stress: N threads each doing M random operations on buffers (allocate from random
//! memory resources on random streams, fill, copy, read back, hand buffers to other threads,
//! move a free to another stream with `set_deallocation_stream` after an event wait, attach to
//! graphs and launch them, close or drop anywhere, on threads with and without a context), as a
//! *correctly ordered* program: whenever a buffer moves to another stream or thread, an event is
//! recorded on the stream that used it last and the new stream waits for it before anything
//! else, and the free is handed to the new stream. Nothing may be lost:
//!
//! - everywhere: every operation succeeds, nothing is reported to the cleanup hooks, bytes read
//!   back are the bytes written, every adopted allocation is deallocated exactly once, and every
//!   pool's `USED_MEM_CURRENT` is back to its baseline once the context is synchronised;
//! - on the emulator ([`Emulator::get`]): the hazard checker saw nothing (no unordered free, use
//!   after free, double free or free on a destroyed stream) and the driver holds no allocation
//!   that was not live before the run.
//!
//! Bounded in count and time. Environment (docs/reliability.md): `CUSTODY_STRESS_THREADS`
//! (default 4), `CUSTODY_STRESS_OPS` (operations per thread, default 1000),
//! `CUSTODY_STRESS_SECONDS` (a thread stops early past this, default 20),
//! `CUSTODY_STRESS_SEED` (default: from the clock; printed, so a failing run can be repeated).

mod adopt;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use adopt::Ownership;
use handles::PoolAttribute;
use handles::{
    ContextHandle, DefaultStream, EventFlags, EventHandle, MemoryPoolHandle, OwnedAllocation,
    StreamFlags, StreamHandle,
};
use memory::{
    Accessibility, Buffer, DeviceMemoryResource, DeviceMemoryResourceOptions, Graph, GraphExec,
    LegacyPinnedMemoryResource, ManagedMemoryResource, MemoryError, MemoryResource,
    PinnedMemoryResource, PinnedMemoryResourceOptions, PoolMemoryResource,
    SynchronousMemoryResource,
};
use test_support::emu::{AllocationId, Emulator};

// ---------------------------------------------------------------------------------------------
// Configuration and randomness

/// How big a run is; read from the environment, printed before the run.
#[derive(Debug, Clone, Copy)]
struct Config {
    threads: usize,
    ops: usize,
    seconds: u64,
    seed: u64,
}

fn env_number(name: &str, default: u64) -> u64 {
    match std::env::var(name) {
        Ok(text) => text
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("{name}={text:?} is not a non-negative integer")),
        Err(_) => default,
    }
}

impl Config {
    fn from_env() -> Config {
        let clock = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        Config {
            threads: env_number("CUSTODY_STRESS_THREADS", 4).max(1) as usize,
            ops: env_number("CUSTODY_STRESS_OPS", 1000) as usize,
            seconds: env_number("CUSTODY_STRESS_SECONDS", 20),
            seed: env_number("CUSTODY_STRESS_SEED", clock),
        }
    }
}

/// SplitMix64: small, seedable, good enough to pick operations (no dependency needed).
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (`n > 0`).
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    fn chance(&mut self, percent: u64) -> bool {
        self.next() % 100 < percent
    }
}

// ---------------------------------------------------------------------------------------------
// The world the threads share

/// A memory resource of the caller's (as a Python subclass would be): device 0 pool memory
/// adopted with `Ownership::MemoryResource`, freed through `deallocate` at teardown. The memory
/// comes from a backing buffer the resource keeps until `deallocate` closes it on the stream it
/// is given; counts allocations and deallocations so that "each freed exactly once" holds on
/// any driver.
struct AdoptingResource {
    backing: Arc<DeviceMemoryResource>,
    allocated: AtomicU64,
    deallocated: AtomicU64,
    live: Mutex<HashMap<u64, Buffer>>,
}

impl MemoryResource for AdoptingResource {
    fn allocate_owned(
        self: Arc<Self>,
        size: usize,
        stream: &StreamHandle,
    ) -> Result<Buffer, MemoryError> {
        let backing = self.backing.allocate(size, stream)?;
        let ptr = backing.ptr();
        self.allocated.fetch_add(1, Ordering::Relaxed);
        self.live.lock().unwrap().insert(ptr, backing);
        adopt::from_handle(ptr, size, Ownership::MemoryResource(self), Some(stream))
    }

    fn deallocate(
        &self,
        allocation: OwnedAllocation,
        stream: &StreamHandle,
    ) -> Result<(), MemoryError> {
        // The address is a backing buffer's, which closing frees: the token is given up.
        let (ptr, _) = allocation.into_raw();
        let backing = self.live.lock().unwrap().remove(&ptr);
        let backing = backing.unwrap_or_else(|| {
            panic!("deallocate(0x{ptr:x}) of a pointer that is not live: a double free")
        });
        self.deallocated.fetch_add(1, Ordering::Relaxed);
        close_on(backing, stream)
    }

    fn accessibility(&self) -> Accessibility {
        Accessibility::device(0)
    }
}

/// A buffer handed from one thread to another: the event recorded on the stream that used it
/// last, which the receiver's stream waits for before touching it.
struct Handoff {
    buffer: Held,
    event: EventHandle,
}

/// A buffer a thread holds exclusively: every use is issued on `stream`, which is also its
/// deallocation stream; `bytes` is what it holds, when known.
struct Held {
    buffer: Buffer,
    stream: StreamHandle,
    bytes: Option<u8>,
}

struct World {
    context: ContextHandle,
    /// Created streams (blocking and non-blocking) and the legacy default stream bound to the
    /// context; any thread may use any of them.
    streams: Vec<StreamHandle>,
    resources: Vec<(&'static str, Arc<dyn MemoryResource>)>,
    adopting: Arc<AdoptingResource>,
    mailboxes: Vec<Mutex<Vec<Handoff>>>,
    counts: Mutex<BTreeMap<&'static str, u64>>,
    deadline: Instant,
}

impl World {
    fn count(&self, what: &'static str, n: u64) {
        *self.counts.lock().unwrap().entry(what).or_default() += n;
    }
}

fn used(pool: &MemoryPoolHandle) -> u64 {
    pool.attribute(PoolAttribute::USED_MEM_CURRENT)
        .expect("cuMemPoolGetAttribute(USED_MEM_CURRENT)")
}

/// Records an event on `from` and makes `to` wait for it: everything issued on `from` so far
/// is ordered before anything issued on `to` from now on.
fn order(world: &World, from: &StreamHandle, to: &StreamHandle) -> EventHandle {
    let event = EventHandle::create(&world.context, EventFlags::DISABLE_TIMING).expect("event");
    event.record(from).expect("cuEventRecord");
    to.wait_event(&event).expect("cuStreamWaitEvent");
    event
}

// ---------------------------------------------------------------------------------------------
// One thread's operations

struct Worker<'w> {
    world: &'w World,
    index: usize,
    rng: Rng,
    own_stream: StreamHandle,
    held: Vec<Held>,
    graphs: Vec<(Graph, Option<GraphExec>)>,
}

const MAX_HELD: usize = 12;
const MAX_GRAPHS: usize = 4;

impl Worker<'_> {
    fn random_stream(&mut self) -> StreamHandle {
        let n = self.world.streams.len();
        match self.rng.below(n + 1) {
            i if i < n => self.world.streams[i].clone(),
            _ => self.own_stream.clone(),
        }
    }

    fn take_random(&mut self) -> Option<Held> {
        if self.held.is_empty() {
            return None;
        }
        let i = self.rng.below(self.held.len());
        Some(self.held.swap_remove(i))
    }

    /// Receives what other threads handed over: waits on the producer's event from a stream
    /// of this thread's choosing and hands the free over to it.
    fn receive(&mut self) {
        let arrived: Vec<Handoff> =
            std::mem::take(&mut *self.world.mailboxes[self.index].lock().unwrap());
        for Handoff { mut buffer, event } in arrived {
            let stream = self.random_stream();
            stream.wait_event(&event).expect("cuStreamWaitEvent");
            buffer
                .buffer
                .set_deallocation_stream(&stream)
                .expect("set_deallocation_stream");
            buffer.stream = stream;
            self.world.count("received", 1);
            self.keep(buffer);
        }
    }

    fn keep(&mut self, held: Held) {
        self.held.push(held);
        while self.held.len() > MAX_HELD {
            let victim = self.take_random().expect("held");
            drop(victim);
            self.world.count("drop (over the limit)", 1);
        }
    }

    fn step(&mut self) {
        self.receive();
        match self.rng.below(100) {
            0..=21 => self.allocate(),
            22..=33 => self.fill(),
            34..=38 => self.verify(),
            39..=44 => self.copy_to_new(),
            45..=53 => self.move_stream(),
            54..=63 => self.hand_off(),
            64..=71 => self.attach_to_graph(),
            72..=75 => self.drop_graph(),
            76..=84 => self.drop_buffer(),
            85..=90 => self.close_buffer(),
            91..=94 => self.close_on_another_stream(),
            95..=97 => self.drop_on_a_thread_without_context(),
            _ => {
                handles::drain_deferred_cleanup();
                self.world.count("drain_deferred_cleanup", 1);
            }
        }
    }

    fn allocate(&mut self) {
        let (name, mr) = {
            let i = self.rng.below(self.world.resources.len());
            let (name, mr) = &self.world.resources[i];
            (*name, Arc::clone(mr))
        };
        let stream = self.random_stream();
        // Sizes from one byte to 64 KiB, mostly multiples of 4 (u32 fills), some odd.
        let size = if self.rng.chance(80) {
            4 * (1 + self.rng.below(16 << 10))
        } else {
            1 + self.rng.below(64 << 10)
        };
        let buffer = mr
            .allocate_owned(size, &stream)
            .unwrap_or_else(|e| panic!("{name}.allocate({size}): {e}"));
        assert_eq!(buffer.size(), size);
        self.world.count("allocate", 1);
        self.keep(Held {
            buffer,
            stream,
            bytes: None,
        });
    }

    fn fill(&mut self) {
        let Some(mut held) = self.take_random() else {
            return;
        };
        let byte = self.rng.next() as u8;
        held.buffer.fill(byte, &held.stream).expect("fill");
        held.bytes = Some(byte);
        self.world.count("fill", 1);
        self.keep(held);
    }

    fn verify(&mut self) {
        let Some(held) = self.take_random() else {
            return;
        };
        if let Some(byte) = held.bytes {
            let mut host = vec![0u8; held.buffer.size()];
            held.buffer
                .copy_to_host(&mut host, &held.stream)
                .expect("copy_to_host");
            if let Some(at) = host.iter().position(|&b| b != byte) {
                panic!(
                    "{:?}: byte {at} is 0x{:02x}, expected 0x{byte:02x}",
                    held.buffer, host[at]
                );
            }
            self.world.count("verify", 1);
        }
        self.keep(held);
    }

    fn copy_to_new(&mut self) {
        let Some(held) = self.take_random() else {
            return;
        };
        let copy = held.buffer.copy_to_new(&held.stream).expect("copy_to_new");
        let bytes = held.bytes;
        let stream = held.stream.clone();
        self.world.count("copy_to_new", 1);
        self.keep(held);
        self.keep(Held {
            buffer: copy,
            stream,
            bytes,
        });
    }

    fn move_stream(&mut self) {
        let Some(mut held) = self.take_random() else {
            return;
        };
        let to = self.random_stream();
        let _event = order(self.world, &held.stream, &to);
        held.buffer
            .set_deallocation_stream(&to)
            .expect("set_deallocation_stream");
        held.stream = to;
        self.world.count("set_deallocation_stream after a wait", 1);
        self.keep(held);
    }

    fn hand_off(&mut self) {
        let Some(held) = self.take_random() else {
            return;
        };
        let event =
            EventHandle::create(&self.world.context, EventFlags::DISABLE_TIMING).expect("event");
        event.record(&held.stream).expect("cuEventRecord");
        let to = self.rng.below(self.world.mailboxes.len());
        self.world.mailboxes[to].lock().unwrap().push(Handoff {
            buffer: held,
            event,
        });
        self.world.count("hand off", 1);
    }

    /// Attaches a buffer to a graph with a memset node; most of the time the graph is then
    /// instantiated and launched on the buffer's stream (so the memset is ordered like any
    /// other use). The graph is never launched again: after a later move of the buffer to
    /// another stream, a launch on the old stream would be unordered.
    fn attach_to_graph(&mut self) {
        // Device memory only: what a memset node may write on any driver.
        let device_only: Vec<usize> = (0..self.held.len())
            .filter(|&i| {
                !self.held[i]
                    .buffer
                    .is_host_accessible()
                    .expect("open buffer")
            })
            .collect();
        if device_only.is_empty() {
            return;
        }
        let i = device_only[self.rng.below(device_only.len())];
        let mut held = self.held.swap_remove(i);
        let graph = Graph::in_context(&self.world.context).expect("graph");
        let byte = self.rng.next() as u8;
        graph
            .add_memset(&[], &held.buffer, byte)
            .expect("add_memset");
        self.world.count("attach to a graph", 1);
        let exec = if self.rng.chance(70) {
            let exec = graph.instantiate().expect("instantiate");
            exec.launch(&held.stream).expect("launch");
            held.bytes = Some(byte);
            self.world.count("graph launch", 1);
            Some(exec)
        } else {
            None
        };
        self.graphs.push((graph, exec));
        while self.graphs.len() > MAX_GRAPHS {
            let i = self.rng.below(self.graphs.len());
            drop(self.graphs.swap_remove(i));
        }
        self.keep(held);
    }

    fn drop_graph(&mut self) {
        if self.graphs.is_empty() {
            return;
        }
        let i = self.rng.below(self.graphs.len());
        let (graph, exec) = self.graphs.swap_remove(i);
        if self.rng.chance(50) {
            drop(graph);
            drop(exec);
        } else {
            drop(exec);
            graph.close();
        }
        self.world.count("drop a graph", 1);
    }

    fn drop_buffer(&mut self) {
        if let Some(held) = self.take_random() {
            drop(held);
            self.world.count("drop", 1);
        }
    }

    fn close_buffer(&mut self) {
        if let Some(held) = self.take_random() {
            held.buffer.close().expect("close");
            self.world.count("close", 1);
        }
    }

    fn close_on_another_stream(&mut self) {
        if let Some(held) = self.take_random() {
            let to = self.random_stream();
            let _event = order(self.world, &held.stream, &to);
            close_on(held.buffer, &to).expect("close(stream)");
            self.world.count("close(stream) after a wait", 1);
        }
    }

    fn drop_on_a_thread_without_context(&mut self) {
        if let Some(held) = self.take_random() {
            std::thread::spawn(move || {
                assert!(ContextHandle::current().unwrap().is_none());
                drop(held);
                assert!(ContextHandle::current().unwrap().is_none());
            })
            .join()
            .expect("dropping thread panicked");
            self.world.count("drop on a thread without a context", 1);
        }
    }

    /// Lets go of everything, in random order and ways.
    fn finish(mut self) {
        self.receive();
        while !self.held.is_empty() {
            match self.rng.below(3) {
                0 => self.drop_buffer(),
                1 => self.close_buffer(),
                _ => self.close_on_another_stream(),
            }
        }
        while !self.graphs.is_empty() {
            self.drop_graph();
        }
    }
}

fn run_thread(world: &World, index: usize, config: Config) -> usize {
    let mut rng = Rng::new(config.seed ^ (index as u64 + 1).wrapping_mul(0xa076_1d64_78bd_642f));
    // Half of the threads work with the context current, half with none (every call then
    // binds the recipe's context itself and restores "none").
    if rng.chance(50) {
        world.context.make_current().expect("cuCtxSetCurrent");
    }
    let own_stream = StreamHandle::create(&world.context, StreamFlags::DEFAULT, 0).expect("stream");
    let mut worker = Worker {
        world,
        index,
        rng,
        own_stream,
        held: Vec::new(),
        graphs: Vec::new(),
    };
    let mut done = 0;
    while done < config.ops && Instant::now() < world.deadline {
        worker.step();
        done += 1;
    }
    worker.finish();
    done
}

// ---------------------------------------------------------------------------------------------
// The test

/// Drains deferred cleanup until `done` holds or a minute passes (a user object's destructor
/// may run on a driver thread after the launch that held it has finished).
fn drain_until(context: &ContextHandle, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        context.synchronize().expect("cuCtxSynchronize");
        handles::drain_deferred_cleanup();
        if handles::deferred_cleanup_pending() == 0 && done() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "deferred cleanup did not finish within a minute"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn random_operations_on_many_threads_lose_nothing() {
    let config = Config::from_env();
    eprintln!(
        "stress: {} threads x {} operations, seed {} (repeat with CUSTODY_STRESS_SEED={}), \
         bounded by {} s",
        config.threads, config.ops, config.seed, config.seed, config.seconds
    );
    // CUSTODY_TEST_PRETEND_REAL_DRIVER runs the real-driver branch on the emulator
    // (docs/testing.md).
    let pretend = std::env::var_os("CUSTODY_TEST_PRETEND_REAL_DRIVER").is_some_and(|v| v != "0");
    let emu = Emulator::get().filter(|_| !pretend);
    if emu.is_none() {
        eprintln!("stress: a real driver: hazards and live allocations are not observable here");
    }
    let context = ContextHandle::primary(0).expect("device 0");
    handles::drain_deferred_cleanup();
    // By identity: a pool hands freed addresses out again (docs/driver-facts.md F18).
    let baseline_live: HashSet<AllocationId> = emu.map_or_else(HashSet::new, |emu| {
        emu.clear_hazards();
        emu.live_allocations().iter().map(|a| a.id).collect()
    });
    let errors_before = handles::cleanup_error_count();
    let warnings_before = handles::cleanup_warning_count();

    let device_pool = DeviceMemoryResource::new(0).expect("device pool");
    let owned_pool = DeviceMemoryResource::with_options(0, DeviceMemoryResourceOptions::default())
        .expect("owned device pool");
    let pinned_pool =
        PinnedMemoryResource::new(PinnedMemoryResourceOptions::default()).expect("pinned pool");
    let adopting = Arc::new(AdoptingResource {
        backing: Arc::clone(&device_pool),
        allocated: AtomicU64::new(0),
        deallocated: AtomicU64::new(0),
        live: Mutex::new(HashMap::new()),
    });
    context.synchronize().expect("cuCtxSynchronize");
    let pools: Vec<(&str, MemoryPoolHandle)> = vec![
        ("device current pool", device_pool.pool().clone()),
        ("owned device pool", owned_pool.pool().clone()),
        ("pinned pool", pinned_pool.pool().clone()),
    ];
    let baseline_used: Vec<u64> = pools.iter().map(|(_, pool)| used(pool)).collect();

    let started = Instant::now();
    let world = World {
        streams: vec![
            StreamHandle::create(&context, StreamFlags::DEFAULT, 0).expect("stream"),
            StreamHandle::create(&context, StreamFlags::DEFAULT, 0).expect("stream"),
            // CU_STREAM_NON_BLOCKING: no implicit ordering with the legacy stream.
            StreamHandle::create(&context, StreamFlags::NON_BLOCKING, 0).expect("stream"),
            StreamHandle::bound_default_stream(DefaultStream::Legacy, &context),
        ],
        resources: vec![
            (
                "device current pool",
                device_pool as Arc<dyn MemoryResource>,
            ),
            ("owned device pool", owned_pool),
            ("pinned pool", pinned_pool),
            ("legacy pinned", LegacyPinnedMemoryResource::new()),
            ("managed", ManagedMemoryResource::new()),
            (
                "synchronous",
                SynchronousMemoryResource::new(0).expect("synchronous resource"),
            ),
            ("adopting (user resource)", adopting.clone()),
        ],
        adopting,
        mailboxes: (0..config.threads)
            .map(|_| Mutex::new(Vec::new()))
            .collect(),
        counts: Mutex::new(BTreeMap::new()),
        deadline: started + Duration::from_secs(config.seconds),
        context: context.clone(),
    };

    let done: Vec<usize> = std::thread::scope(|scope| {
        let threads: Vec<_> = (0..config.threads)
            .map(|i| {
                let world = &world;
                std::thread::Builder::new()
                    .name(format!("stress-{i}"))
                    .spawn_scoped(scope, move || run_thread(world, i, config))
                    .expect("spawn")
            })
            .collect();
        threads
            .into_iter()
            .map(|t| t.join().expect("a stress thread panicked"))
            .collect()
    });
    // Hand-offs to threads that had already finished: freed here, on the producer's stream.
    let mut orphans = 0;
    for mailbox in &world.mailboxes {
        orphans += mailbox.lock().unwrap().drain(..).count();
    }
    world.count(
        "hand-offs dropped after the receiver finished",
        orphans as u64,
    );

    let World {
        streams,
        resources,
        adopting,
        counts,
        ..
    } = world;
    drop(streams);
    drop(resources);
    drain_until(&context, || {
        emu.into_iter().all(|emu| {
            emu.live_allocations()
                .iter()
                .all(|a| baseline_live.contains(&a.id))
        }) && adopting.live.lock().unwrap().is_empty()
    });
    let elapsed = started.elapsed();

    let ops: usize = done.iter().sum();
    let counts = counts.into_inner().unwrap();
    eprintln!(
        "stress: {ops} operations on {} threads in {:.2} s (seed {}): {counts:?}",
        config.threads,
        elapsed.as_secs_f64(),
        config.seed
    );

    assert_eq!(
        handles::cleanup_error_count() - errors_before,
        0,
        "cleanup errors were reported"
    );
    assert_eq!(
        handles::cleanup_warning_count() - warnings_before,
        0,
        "cleanup warnings were reported (no per-thread default stream is used here)"
    );
    assert_eq!(
        adopting.allocated.load(Ordering::Relaxed),
        adopting.deallocated.load(Ordering::Relaxed),
        "every adopted allocation is deallocated exactly once"
    );
    context.synchronize().expect("cuCtxSynchronize");
    for ((name, pool), before) in pools.iter().zip(&baseline_used) {
        assert_eq!(
            used(pool),
            *before,
            "{name}: USED_MEM_CURRENT is not back to its baseline"
        );
    }
    if let Some(emu) = emu {
        let hazards = emu.hazards();
        let live: Vec<_> = emu
            .live_allocations()
            .into_iter()
            .filter(|a| !baseline_live.contains(&a.id))
            .collect();
        eprintln!(
            "stress: emulator: {} hazards, {} live allocations left",
            hazards.len(),
            live.len()
        );
        assert!(hazards.is_empty(), "hazards: {hazards:#?}");
        assert!(live.is_empty(), "live allocations: {live:#?}");
    }
    assert!(ops > 0, "the run did no operation");
}

/// cuda.core's `close(stream)` in Rust: hand the free over to `stream`, then close
/// (docs/decisions.md D4).
fn close_on(buffer: Buffer, stream: &StreamHandle) -> Result<(), MemoryError> {
    buffer.set_deallocation_stream(stream)?;
    buffer.close()
}
