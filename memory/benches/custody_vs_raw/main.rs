//! custody against the raw driver, side by side in one process, same pool and streams: the
//! alloc+free pair, drops on another thread, `set_deallocation_stream`, deferred cleanup,
//! concurrent threads, and the pair with many live buffers.
//!
//! Run through `cargo xtask bench` (the emulated driver, or a real one if it loads), or alone:
//! `CUSTODY_CUDA_DRIVER=... cargo bench -p cuda-custody-memory --bench custody_vs_raw [-- FILTER]`. The
//! environment chooses the length (`CUSTODY_BENCH_QUICK=1`), the largest live-buffer count
//! (`CUSTODY_BENCH_MAX_LIVE`), the thread counts (`CUSTODY_BENCH_THREADS=1,2,4`) and where the
//! paired samples go (`CUSTODY_BENCH_JSON=path`). See `paired.rs` for how variants are
//! interleaved and `docs/benchmarks.md` for the results.
//!
//! The raw variants call the driver through `cuda_sys::driver()`: the only code outside the
//! `handles` crate that does, and only as a baseline. Every allocation is 256 bytes from device
//! 0's current memory pool, the pool `DeviceMemoryResource::new(0)` allocates from.

mod paired;

use std::ffi::c_void;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use criterion::Criterion;
use cuda_sys::types::{CUcontext, CUdeviceptr, CUgraph, CUmemoryPool, CUstream, CUuserObject};
use cuda_sys::Driver;
use handles::{
    drain_deferred_cleanup, ContextHandle, DevicePtrHandle, GraphHandle, MemoryPoolHandle,
    StreamFlags, StreamHandle, UserObjectOwnership,
};
use memory::{
    Buffer, CachingMemoryResource, DeviceMemoryResource, MemoryResource, PoolMemoryResource,
};

use paired::{timed, Comparison, Settings, Variant};

/// Bytes per allocation, as in docs/driver-facts.md "Costs".
const SIZE: usize = 256;

/// What every group shares: the driver, device 0's primary context (current on the main
/// thread), one created stream, the resource and its pool.
struct Setup {
    d: &'static Driver,
    ctx: ContextHandle,
    stream: StreamHandle,
    mr: Arc<DeviceMemoryResource>,
}

impl Setup {
    fn pool(&self) -> &MemoryPoolHandle {
        self.mr.pool()
    }

    fn sync(&self) {
        self.stream.synchronize().expect("cuStreamSynchronize");
    }
}

/// Raw pointers are plain integers, so raw variants can hand them to other threads.
#[derive(Clone, Copy)]
struct Raw {
    d: &'static Driver,
    ctx: usize,
    pool: usize,
    stream: usize,
}

impl Raw {
    fn of(setup: &Setup, stream: &StreamHandle) -> Raw {
        Raw {
            d: setup.d,
            ctx: setup.ctx.raw() as usize,
            pool: setup.pool().raw() as usize,
            stream: stream.raw() as usize,
        }
    }

    #[inline]
    fn alloc(&self) -> CUdeviceptr {
        let mut ptr: CUdeviceptr = 0;
        // SAFETY: valid out-pointer; the pool (a device's current pool) and the stream (kept by
        // the caller's StreamHandle) are alive; the calling thread has the context current.
        let status = unsafe {
            (self.d.cuMemAllocFromPoolAsync)(
                &mut ptr,
                SIZE,
                self.pool as CUmemoryPool,
                self.stream as CUstream,
            )
        };
        assert_eq!(status, 0, "cuMemAllocFromPoolAsync");
        ptr
    }

    #[inline]
    fn free(&self, ptr: CUdeviceptr) {
        // SAFETY: `ptr` came from `alloc` and is freed once; the stream is alive.
        let status = unsafe { (self.d.cuMemFreeAsync)(ptr, self.stream as CUstream) };
        assert_eq!(status, 0, "cuMemFreeAsync");
    }

    #[inline]
    fn current(&self) -> CUcontext {
        let mut ctx: CUcontext = std::ptr::null_mut();
        // SAFETY: valid out-pointer.
        let status = unsafe { (self.d.cuCtxGetCurrent)(&mut ctx) };
        assert_eq!(status, 0, "cuCtxGetCurrent");
        ctx
    }

    #[inline]
    fn set_current(&self, ctx: CUcontext) {
        // SAFETY: `ctx` is the primary context (retained by the setup) or NULL.
        let status = unsafe { (self.d.cuCtxSetCurrent)(ctx) };
        assert_eq!(status, 0, "cuCtxSetCurrent");
    }

    /// custody's teardown protocol written out by hand: read the current context, make the
    /// recipe's current if it differs, free, restore.
    #[inline]
    fn free_in_context(&self, ptr: CUdeviceptr) {
        let previous = self.current();
        let target = self.ctx as CUcontext;
        if previous != target {
            self.set_current(target);
        }
        self.free(ptr);
        if previous != target {
            self.set_current(previous);
        }
    }
}

/// A thread with no current context that runs timed jobs for the cross-thread variants.
struct Helper {
    jobs: mpsc::Sender<Box<dyn FnOnce() -> Duration + Send>>,
    done: mpsc::Receiver<Duration>,
}

impl Helper {
    fn start() -> Helper {
        let (jobs, job_rx) = mpsc::channel::<Box<dyn FnOnce() -> Duration + Send>>();
        let (done_tx, done) = mpsc::channel();
        std::thread::Builder::new()
            .name("bench-helper".into())
            .spawn(move || {
                for job in job_rx {
                    if done_tx.send(job()).is_err() {
                        break;
                    }
                }
            })
            .expect("spawning the helper thread");
        Helper { jobs, done }
    }

    fn run(&self, job: impl FnOnce() -> Duration + Send + 'static) -> Duration {
        self.jobs.send(Box::new(job)).expect("helper alive");
        self.done.recv().expect("helper answered")
    }
}

fn pair(c: &mut Criterion, s: &Settings, setup: &Setup) {
    let raw = Raw::of(setup, &setup.stream);
    let (pool, stream, mr) = (setup.pool(), &setup.stream, &setup.mr);
    // The opt-in cache over the same pool: after the first pair every allocation is a hit.
    let cache = CachingMemoryResource::new(Arc::clone(mr) as Arc<dyn MemoryResource>);
    let cache = &cache;
    // A stream made outside custody, wrapped without an owner, as Python's
    // `Stream.from_handle(int)` wraps a PyTorch, CuPy or JAX stream: a stream the cache cannot
    // keep alive. (A stream custody created comes back as itself from `wrap_stream`.)
    let foreign = {
        let mut raw: CUstream = std::ptr::null_mut();
        let create = setup.d.cuStreamCreate().expect("cuStreamCreate");
        // SAFETY: valid out-pointer; the setup's context is current on this thread.
        assert_eq!(unsafe { create(&mut raw, 0) }, 0, "cuStreamCreate");
        raw as usize
    };
    // SAFETY: the stream is never destroyed (it lives as long as the process).
    let wrapped = unsafe { handles::raw::wrap_stream(foreign, None) }.expect("wrap_stream");
    assert!(!wrapped.pins_its_stream());
    let wrapped = &wrapped;
    // Two streams, a block moving from one to the other each pair: `other`'s allocations take
    // blocks freed on `stream` (which holds a spare one) after an event wait.
    let other = StreamHandle::create(&setup.ctx, StreamFlags::DEFAULT, 0).expect("second stream");
    let other = &other;
    let spare = [
        Arc::clone(cache).allocate(SIZE, stream).unwrap(),
        Arc::clone(cache).allocate(SIZE, stream).unwrap(),
    ];
    drop(spare);
    paired::run(
        c,
        s,
        Comparison {
            group: "pair",
            param: None,
            title: "alloc+free pair, one thread, created stream",
            op: "pair",
            ops_per_iter: 1,
            baseline: Some("raw"),
            subject: "handle",
            variants: vec![
                Variant::new(
                    "raw",
                    "cuMemAllocFromPoolAsync + cuMemFreeAsync",
                    move |n| timed(n, || raw.free(raw.alloc())),
                ),
                Variant::new(
                    "raw+2 cuCtxGetCurrent",
                    "the raw pair plus the context check custody makes before each call",
                    move |n| {
                        timed(n, || {
                            raw.current();
                            let p = raw.alloc();
                            raw.current();
                            raw.free(p);
                        })
                    },
                ),
                Variant::new(
                    "handle",
                    "DevicePtrHandle::alloc_from_pool + drop",
                    move |n| {
                        timed(n, || {
                            drop(DevicePtrHandle::alloc_from_pool(SIZE, pool, stream).unwrap())
                        })
                    },
                ),
                Variant::new(
                    "buffer, drop",
                    "DeviceMemoryResource::allocate + drop",
                    move |n| timed(n, || drop(Arc::clone(mr).allocate(SIZE, stream).unwrap())),
                ),
                Variant::new(
                    "buffer, close",
                    "DeviceMemoryResource::allocate + Buffer::close",
                    move |n| {
                        timed(n, || {
                            let b = Arc::clone(mr).allocate(SIZE, stream).unwrap();
                            b.close().unwrap();
                        })
                    },
                ),
                Variant::new(
                    "caching, close",
                    "CachingMemoryResource::allocate + Buffer::close (a same-stream hit: no driver call)",
                    move |n| {
                        timed(n, || {
                            let b = Arc::clone(cache).allocate(SIZE, stream).unwrap();
                            b.close().unwrap();
                        })
                    },
                ),
                Variant::new(
                    "caching, close, wrapped stream",
                    "as caching, close, on the stream wrapped without an owner (raw::wrap_stream(raw, None), Python's Stream.from_handle(int)): a same-stream hit, and the close records an event on the stream",
                    move |n| {
                        timed(n, || {
                            let b = Arc::clone(cache).allocate(SIZE, wrapped).unwrap();
                            b.close().unwrap();
                        })
                    },
                ),
                Variant::new(
                    "caching, cross-stream",
                    "CachingMemoryResource::allocate on a second stream of a block freed on the first (an event recorded there, waited for on the second), Buffer::set_deallocation_stream back to the first, Buffer::close",
                    move |n| {
                        timed(n, || {
                            let b = Arc::clone(cache).allocate(SIZE, other).unwrap();
                            b.set_deallocation_stream(stream).unwrap();
                            b.close().unwrap();
                        })
                    },
                ),
            ],
            between: Box::new(|| {
                setup.sync();
                other.synchronize().expect("second stream sync");
                wrapped.synchronize().expect("wrapped stream sync");
            }),
        },
    );

    let legacy = StreamHandle::legacy();
    let raw_legacy = Raw {
        stream: legacy.raw() as usize,
        ..raw
    };
    let legacy = &legacy;
    paired::run(
        c,
        s,
        Comparison {
            group: "pair-legacy",
            param: None,
            title: "alloc+free pair, one thread, legacy default stream token",
            op: "pair",
            ops_per_iter: 1,
            baseline: Some("raw"),
            subject: "handle",
            variants: vec![
                Variant::new(
                    "raw",
                    "cuMemAllocFromPoolAsync + cuMemFreeAsync on CU_STREAM_LEGACY",
                    move |n| timed(n, || raw_legacy.free(raw_legacy.alloc())),
                ),
                Variant::new(
                    "handle",
                    "DevicePtrHandle::alloc_from_pool + drop, legacy token (bound at capture)",
                    move |n| {
                        timed(n, || {
                            drop(DevicePtrHandle::alloc_from_pool(SIZE, pool, legacy).unwrap())
                        })
                    },
                ),
            ],
            between: Box::new(|| legacy.synchronize().expect("legacy sync")),
        },
    );
}

fn drops(c: &mut Criterion, s: &Settings, setup: &Setup) {
    let raw = Raw::of(setup, &setup.stream);
    let (pool, stream) = (setup.pool(), &setup.stream);
    let helper = Helper::start();
    let helper = &helper;
    let legacy = StreamHandle::legacy();
    let legacy = &legacy;
    let handles = move |n: u64| -> Vec<DevicePtrHandle> {
        (0..n)
            .map(|_| DevicePtrHandle::alloc_from_pool(SIZE, pool, stream).unwrap())
            .collect()
    };
    let raws = move |n: u64| -> Vec<CUdeviceptr> { (0..n).map(|_| raw.alloc()).collect() };
    paired::run(
        c,
        s,
        Comparison {
            group: "drop",
            param: None,
            title: "free of a live buffer: same thread vs another thread with no context",
            op: "free",
            ops_per_iter: 1,
            baseline: Some("same thread"),
            subject: "other thread",
            variants: vec![
                Variant::new("raw", "cuMemFreeAsync on the allocating thread", move |n| {
                    let ptrs = raws(n);
                    let start = Instant::now();
                    for p in ptrs {
                        raw.free(p);
                    }
                    start.elapsed()
                }),
                Variant::new(
                    "raw, other thread",
                    "cuCtxGetCurrent + cuCtxSetCurrent + cuMemFreeAsync + cuCtxSetCurrent(NULL), on a thread with no context",
                    move |n| {
                        let ptrs = raws(n);
                        helper.run(move || {
                            let start = Instant::now();
                            for p in ptrs {
                                raw.free_in_context(p);
                            }
                            start.elapsed()
                        })
                    },
                ),
                Variant::new(
                    "same thread",
                    "drop of a DevicePtrHandle on the allocating thread (context current)",
                    move |n| {
                        let hs = handles(n);
                        let start = Instant::now();
                        drop(hs);
                        start.elapsed()
                    },
                ),
                Variant::new(
                    "other thread",
                    "drop of a DevicePtrHandle on a thread with no context (a created stream: no context call, D2)",
                    move |n| {
                        let hs = handles(n);
                        helper.run(move || {
                            let start = Instant::now();
                            drop(hs);
                            start.elapsed()
                        })
                    },
                ),
                Variant::new(
                    "other thread, legacy token",
                    "as other thread, for buffers recorded on the legacy default stream token (activation and restore of the bound context)",
                    move |n| {
                        let hs: Vec<DevicePtrHandle> = (0..n)
                            .map(|_| DevicePtrHandle::alloc_from_pool(SIZE, pool, legacy).unwrap())
                            .collect();
                        helper.run(move || {
                            let start = Instant::now();
                            drop(hs);
                            start.elapsed()
                        })
                    },
                ),
            ],
            between: Box::new(|| {
                setup.sync();
                legacy.synchronize().expect("legacy sync");
            }),
        },
    );
}

fn set_deallocation_stream(c: &mut Criterion, s: &Settings, setup: &Setup) {
    let other = StreamHandle::create(&setup.ctx, StreamFlags::DEFAULT, 0).expect("second stream");
    let (stream, other) = (&setup.stream, &other);
    let handle = DevicePtrHandle::alloc_from_pool(SIZE, setup.pool(), stream).unwrap();
    let owned: Buffer = setup.mr.allocate(SIZE, stream).unwrap();
    let (handle, buffer) = (&handle, &owned);
    paired::run(
        c,
        s,
        Comparison {
            group: "set_deallocation_stream",
            param: None,
            title: "set_deallocation_stream, alternating between two created streams",
            op: "call",
            ops_per_iter: 1,
            baseline: None,
            subject: "buffer",
            variants: vec![
                Variant::new(
                    "handle",
                    "DevicePtrHandle::set_deallocation_stream",
                    move |n| {
                        let start = Instant::now();
                        for i in 0..n {
                            let to = if i % 2 == 0 { other } else { stream };
                            handle.set_deallocation_stream(to).unwrap();
                        }
                        start.elapsed()
                    },
                ),
                Variant::new("buffer", "Buffer::set_deallocation_stream", move |n| {
                    let start = Instant::now();
                    for i in 0..n {
                        let to = if i % 2 == 0 { other } else { stream };
                        buffer.set_deallocation_stream(to).unwrap();
                    }
                    start.elapsed()
                }),
            ],
            between: Box::new(|| {}),
        },
    );
    owned.close().unwrap();
    setup.sync();
}

/// A graph attachment's payload that counts its drop, so a sample knows when every deferred
/// free has run (on the worker or in a drain).
struct Counted {
    handle: Option<DevicePtrHandle>,
    done: Arc<AtomicUsize>,
}

impl Drop for Counted {
    fn drop(&mut self) {
        drop(self.handle.take());
        self.done.fetch_add(1, Ordering::Release);
    }
}

/// The raw baseline's user-object destructor: nothing to do (the pointer is freed by the
/// baseline itself), as cheap as a destructor can be.
extern "C" fn no_op_destructor(_: *mut c_void) {}

fn deferred(c: &mut Criterion, s: &Settings, setup: &Setup) {
    let raw = Raw::of(setup, &setup.stream);
    let (pool, stream, ctx) = (setup.pool(), &setup.stream, &setup.ctx);
    paired::run(
        c,
        s,
        Comparison {
            group: "deferred",
            param: None,
            title: "deferred cleanup: buffers held by a CUDA graph, freed when the graph is destroyed",
            op: "buffer",
            ops_per_iter: 1,
            baseline: Some("raw graph+free"),
            subject: "deferred",
            variants: vec![
                Variant::new(
                    "raw free",
                    "cuMemFreeAsync of each pointer on the allocating thread (no graph)",
                    move |n| {
                        let ptrs: Vec<_> = (0..n).map(|_| raw.alloc()).collect();
                        let start = Instant::now();
                        for p in ptrs {
                            raw.free(p);
                        }
                        start.elapsed()
                    },
                ),
                Variant::new(
                    "raw graph+free",
                    "cuGraphDestroy of a graph holding one no-op user object per pointer, then cuMemFreeAsync of each",
                    move |n| {
                        let d = raw.d;
                        let mut graph: CUgraph = std::ptr::null_mut();
                        // SAFETY: valid out-pointer; flags 0; the context is current.
                        assert_eq!(unsafe { (d.cuGraphCreate)(&mut graph, 0) }, 0);
                        let ptrs: Vec<_> = (0..n).map(|_| raw.alloc()).collect();
                        for _ in 0..n {
                            let mut object: CUuserObject = std::ptr::null_mut();
                            // SAFETY: valid out-pointer; the destructor ignores its argument.
                            let status = unsafe {
                                (d.cuUserObjectCreate)(
                                    &mut object,
                                    std::ptr::null_mut(),
                                    Some(no_op_destructor),
                                    1,
                                    1, // CU_USER_OBJECT_NO_DESTRUCTOR_SYNC
                                )
                            };
                            assert_eq!(status, 0);
                            // SAFETY: the graph and our one reference are alive; MOVE hands
                            // the reference to the graph.
                            let status =
                                unsafe { (d.cuGraphRetainUserObject)(graph, object, 1, 1) };
                            assert_eq!(status, 0);
                        }
                        let start = Instant::now();
                        // SAFETY: we created the graph and destroy it once.
                        assert_eq!(unsafe { (d.cuGraphDestroy)(graph) }, 0);
                        for p in ptrs {
                            raw.free(p);
                        }
                        start.elapsed()
                    },
                ),
                Variant::new(
                    "deferred",
                    "drop of a GraphHandle holding one buffer per user object; destructors queue, the worker and drain_deferred_cleanup free",
                    move |n| {
                        let graph = GraphHandle::create(ctx).unwrap();
                        let done = Arc::new(AtomicUsize::new(0));
                        for _ in 0..n {
                            let handle = DevicePtrHandle::alloc_from_pool(SIZE, pool, stream).unwrap();
                            let payload = Counted {
                                handle: Some(handle),
                                done: Arc::clone(&done),
                            };
                            UserObjectOwnership::new(ctx, Box::new(payload))
                                .unwrap()
                                .move_into_graph(&graph)
                                .unwrap();
                        }
                        let start = Instant::now();
                        drop(graph);
                        let target = n as usize;
                        while done.load(Ordering::Acquire) < target {
                            drain_deferred_cleanup();
                            if done.load(Ordering::Acquire) < target {
                                std::thread::yield_now();
                            }
                        }
                        start.elapsed()
                    },
                ),
            ],
            between: Box::new(|| setup.sync()),
        },
    );
}

/// Streams whose boxes share no cache line with one another, whatever the handles' layout: each
/// is created on a thread of its own (glibc gives a new thread its own arena) and followed by
/// 4 KiB of spacer allocations, kept with the streams.
struct PaddedStreams(
    Vec<StreamHandle>,
    #[allow(dead_code)] Vec<Vec<Box<[u8; 256]>>>,
);

fn padded_streams(ctx: &ContextHandle, count: usize) -> PaddedStreams {
    let (streams, spacers) = std::thread::scope(|scope| {
        let made: Vec<_> = (0..count)
            .map(|_| {
                scope.spawn(|| {
                    let stream =
                        StreamHandle::create(ctx, StreamFlags::DEFAULT, 0).expect("stream");
                    let spacer: Vec<Box<[u8; 256]>> =
                        (0..16).map(|_| Box::new([0u8; 256])).collect();
                    (stream, spacer)
                })
            })
            .collect();
        made.into_iter()
            .map(|h| h.join().expect("stream thread"))
            .unzip()
    });
    PaddedStreams(streams, spacers)
}

/// `threads` threads, each with its own created stream (same context, same pool), allocating
/// and freeing concurrently; the time is the wall time from a common start to the last thread's
/// end, so per-pair figures read as inverse throughput.
fn threads(c: &mut Criterion, s: &Settings, setup: &Setup) {
    for &count in &s.threads {
        // Created back to back on one thread, as an application's would be: their boxes are
        // neighbouring allocations, which may share cache lines unless the handles pad them.
        let streams: Vec<StreamHandle> = (0..count)
            .map(|_| StreamHandle::create(&setup.ctx, StreamFlags::DEFAULT, 0).expect("stream"))
            .collect();
        let streams = &streams;
        let padded = padded_streams(&setup.ctx, count);
        let padded = &padded.0;
        let own: Vec<Arc<DeviceMemoryResource>> = (0..count)
            .map(|_| DeviceMemoryResource::new(0).expect("a resource per thread"))
            .collect();
        let own = &own;
        let ctx = &setup.ctx;
        let pool = setup.pool();
        let mr = &setup.mr;
        // Runs `body(thread index, iters)` on `count` threads with the context current and
        // returns the wall time between a common start and the last one's end.
        let concurrent = move |iters: u64, body: &(dyn Fn(usize, u64) + Sync)| -> Duration {
            let barrier = Barrier::new(count + 1);
            std::thread::scope(|scope| {
                for t in 0..count {
                    let barrier = &barrier;
                    scope.spawn(move || {
                        ctx.make_current().unwrap();
                        barrier.wait();
                        body(t, iters);
                        barrier.wait();
                    });
                }
                barrier.wait();
                let start = Instant::now();
                barrier.wait();
                start.elapsed()
            })
        };
        let raws: Vec<Raw> = streams.iter().map(|st| Raw::of(setup, st)).collect();
        let raws = &raws;
        paired::run(
            c,
            s,
            Comparison {
                group: "threads",
                param: Some(count as u64),
                title: "threads allocating and freeing concurrently, one created stream each",
                op: "pair",
                ops_per_iter: count as u64,
                baseline: Some("raw"),
                subject: "handle",
                variants: vec![
                    Variant::new(
                        "raw",
                        "cuMemAllocFromPoolAsync + cuMemFreeAsync",
                        move |n| {
                            concurrent(n, &|t, n| {
                                let raw = raws[t];
                                for _ in 0..n {
                                    raw.free(raw.alloc());
                                }
                            })
                        },
                    ),
                    Variant::new(
                        "raw+2 cuCtxGetCurrent",
                        "the raw pair plus two cuCtxGetCurrent (what custody's pair cost before D2 skipped them)",
                        move |n| {
                            concurrent(n, &|t, n| {
                                let raw = raws[t];
                                for _ in 0..n {
                                    raw.current();
                                    let p = raw.alloc();
                                    raw.current();
                                    raw.free(p);
                                }
                            })
                        },
                    ),
                    Variant::new(
                        "handle",
                        "DevicePtrHandle::alloc_from_pool + drop",
                        move |n| {
                            concurrent(n, &|t, n| {
                                let st = &streams[t];
                                for _ in 0..n {
                                    drop(DevicePtrHandle::alloc_from_pool(SIZE, pool, st).unwrap());
                                }
                            })
                        },
                    ),
                    Variant::new(
                        "handle, padded streams",
                        "as handle, each thread's stream created on a thread of its own, 4 KiB of spacers after it (no two streams' boxes on one cache line, whatever the handles' layout)",
                        move |n| {
                            concurrent(n, &|t, n| {
                                let st = &padded[t];
                                for _ in 0..n {
                                    drop(DevicePtrHandle::alloc_from_pool(SIZE, pool, st).unwrap());
                                }
                            })
                        },
                    ),
                    Variant::new(
                        "buffer, close",
                        "DeviceMemoryResource::allocate + Buffer::close",
                        move |n| {
                            concurrent(n, &|t, n| {
                                let st = &streams[t];
                                for _ in 0..n {
                                    let b = Arc::clone(mr).allocate(SIZE, st).unwrap();
                                    b.close().unwrap();
                                }
                            })
                        },
                    ),
                    Variant::new(
                        "buffer, close, a resource per thread",
                        "as buffer, close, each thread allocating from a DeviceMemoryResource of its own (same pool): what sharing one resource between threads costs",
                        move |n| {
                            concurrent(n, &|t, n| {
                                let st = &streams[t];
                                let mr = &own[t];
                                for _ in 0..n {
                                    let b = Arc::clone(mr).allocate(SIZE, st).unwrap();
                                    b.close().unwrap();
                                }
                            })
                        },
                    ),
                ],
                between: Box::new(move || {
                    for st in streams.iter().chain(padded) {
                        st.synchronize().unwrap();
                    }
                }),
            },
        );
    }
}

/// The pair with 1 to `max_live` other buffers alive in the same pool (allocated through
/// custody, as an application's would be).
fn live(c: &mut Criterion, s: &Settings, setup: &Setup) {
    let raw = Raw::of(setup, &setup.stream);
    let (pool, stream) = (setup.pool(), &setup.stream);
    let mut live: Vec<DevicePtrHandle> = Vec::new();
    let mut count = 1usize;
    while count <= s.max_live {
        let grow = Instant::now();
        live.extend(
            (live.len()..count)
                .map(|_| DevicePtrHandle::alloc_from_pool(SIZE, pool, stream).unwrap()),
        );
        setup.sync();
        if count >= 100_000 {
            println!(
                "live: {count} buffers allocated in {:.2} s",
                grow.elapsed().as_secs_f64()
            );
        }
        paired::run(
            c,
            s,
            Comparison {
                group: "live",
                param: Some(count as u64),
                title: "alloc+free pair with N other buffers alive in the pool",
                op: "pair",
                ops_per_iter: 1,
                baseline: Some("raw"),
                subject: "handle",
                variants: vec![
                    Variant::new(
                        "raw",
                        "cuMemAllocFromPoolAsync + cuMemFreeAsync",
                        move |n| timed(n, || raw.free(raw.alloc())),
                    ),
                    Variant::new(
                        "handle",
                        "DevicePtrHandle::alloc_from_pool + drop",
                        move |n| {
                            timed(n, || {
                                drop(DevicePtrHandle::alloc_from_pool(SIZE, pool, stream).unwrap())
                            })
                        },
                    ),
                ],
                between: Box::new(|| setup.sync()),
            },
        );
        count *= 10;
    }
    let free = Instant::now();
    let n = live.len();
    drop(live);
    setup.sync();
    if n >= 100_000 {
        println!(
            "live: {n} buffers freed in {:.2} s",
            free.elapsed().as_secs_f64()
        );
    }
}

/// Whether criterion's command-line filter (its first positional argument) may select a
/// benchmark of `group`, so that a filtered run skips the setup of the groups it will not run
/// (a million live buffers, sixteen threads' streams). Errs on the side of running.
fn wanted(group: &str) -> bool {
    const WITH_VALUE: &[&str] = &[
        "-c",
        "--color",
        "-s",
        "--save-baseline",
        "-b",
        "--baseline",
        "--baseline-lenient",
        "--load-baseline",
        "--format",
        "--profile-time",
        "--sample-size",
        "--warm-up-time",
        "--measurement-time",
        "--nresamples",
        "--noise-threshold",
        "--confidence-level",
        "--significance-level",
        "--plotting-backend",
        "--output-format",
    ];
    let mut args = std::env::args().skip(1);
    let mut filter = None;
    while let Some(arg) = args.next() {
        if WITH_VALUE.contains(&arg.as_str()) {
            args.next();
        } else if !arg.starts_with('-') {
            filter = Some(arg);
            break;
        }
    }
    let Some(filter) = filter else { return true };
    let plain = filter.trim_start_matches('^');
    if plain.contains(|c: char| !(c.is_ascii_alphanumeric() || "/_- ,".contains(c))) {
        return true;
    }
    plain.starts_with(group)
        || group.starts_with(plain)
        || !filter.starts_with('^') && group.contains(plain)
}

fn device_name(d: &Driver) -> String {
    let mut device = 0;
    // SAFETY: valid out-pointer; the driver was initialised by the setup.
    if unsafe { (d.cuDeviceGet)(&mut device, 0) } != 0 {
        return "unknown".to_owned();
    }
    let mut name = [0 as std::ffi::c_char; 256];
    // An optional symbol (diagnostics only).
    let Some(get_name) = d.cuDeviceGetName else {
        return "unknown".to_owned();
    };
    // SAFETY: the buffer holds 256 bytes, as passed.
    if unsafe { get_name(name.as_mut_ptr(), 256, device) } != 0 {
        return "unknown".to_owned();
    }
    // SAFETY: the driver wrote a NUL-terminated string into the buffer.
    unsafe { std::ffi::CStr::from_ptr(name.as_ptr()) }
        .to_string_lossy()
        .into_owned()
}

fn main() {
    // First, so that `--help` and `--list` answer without a driver.
    let mut c = Criterion::default().configure_from_args();
    let settings = Settings::from_env();
    let d = match cuda_sys::driver() {
        Ok(d) => d,
        Err(error) => {
            eprintln!("custody_vs_raw: no CUDA driver: {error}");
            std::process::exit(2);
        }
    };
    let ctx = ContextHandle::primary(0).expect("device 0's primary context");
    ctx.make_current()
        .expect("make the primary context current");
    let setup = Setup {
        d,
        stream: StreamHandle::create(&ctx, StreamFlags::DEFAULT, 0).expect("a created stream"),
        mr: DeviceMemoryResource::new(0).expect("device 0's memory resource"),
        ctx,
    };
    let info = paired::DriverInfo {
        path: d.path().to_owned(),
        version: d.version(),
        emulated: d.is_emulated(),
        device: device_name(d),
    };
    println!(
        "custody_vs_raw: driver {} (version {}, {}), device 0: {}; {} run",
        info.path,
        info.version,
        if info.emulated { "EMULATED" } else { "real" },
        info.device,
        if settings.quick { "quick" } else { "full" }
    );

    type Group = fn(&mut Criterion, &Settings, &Setup);
    let groups: [(&str, Group); 6] = [
        ("pair", pair),
        ("drop", drops),
        ("set_deallocation_stream", set_deallocation_stream),
        ("deferred", deferred),
        ("threads", threads),
        ("live", live),
    ];
    for (name, group) in groups {
        let selected = match &settings.count {
            // Counting mode: only the groups of the named variants (`pair-legacy/..` is `pair`'s).
            Some((_, names)) => names
                .iter()
                .any(|n| n.split('/').next().is_some_and(|g| g.starts_with(name))),
            None => wanted(name),
        };
        if selected {
            group(&mut c, &settings, &setup);
        }
    }
    c.final_summary();

    if let Ok(path) = std::env::var("CUSTODY_BENCH_JSON") {
        paired::write_json(&path, &settings, &info).expect("writing the benchmark JSON");
        println!("custody_vs_raw: paired samples written to {path}");
    }
}
