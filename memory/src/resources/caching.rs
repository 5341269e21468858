//! [`CachingMemoryResource`]: an opt-in cache over another memory resource that keeps freed
//! blocks per (stream, size class) and lends them out again with no driver call on the same
//! stream, and after an event wait on another, with [`CachingStats`] and [`Trimmed`]. The
//! design (which streams are "the same", fences for streams the cache cannot keep alive, when a
//! block serves another stream, declared uses, size classes, flushes) is in handles/DESIGN.md,
//! "Caching memory resource".

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use handles::{
    CaptureStatus, CleanupError, CleanupStep, CleanupWarning, CleanupWarningKind, Consequence,
    ContextHandle, CudaErrorCode, DeallocationRecipe, DefaultStream, DevicePtrHandle, EventFlags,
    EventHandle, HandleError, Lender, OwnedAllocation, Returned, StreamFlags, StreamHandle,
    ThreadToken,
};

use crate::buffer::{Accessibility, IpcRole};
use crate::checks::check_size;
use crate::{AdoptError, Buffer, MemoryError, MemoryResource};

/// The smallest size class, in bytes: every request up to it takes a block of this size.
const MIN_BLOCK_SIZE: usize = 512;

/// Size classes per doubling above [`MIN_BLOCK_SIZE`]: a block is at most 25% larger than the
/// request it serves (plus the rounding up to 512 bytes).
const CLASSES_PER_DOUBLING: usize = 4;

/// Events kept for reuse (per cache), so that a fence costs `cuEventRecord` and not also
/// `cuEventCreate` and `cuEventDestroy`.
const SPARE_EVENTS: usize = 64;

/// The size class of a request of `size` bytes (at least one): its index and its size in bytes
/// (the size of the block allocated from the upstream resource). `None` when the class would
/// exceed `isize::MAX` bytes (such a request is not cached).
///
/// Classes: 512 bytes, then four per doubling (640, 768, 896, 1024, 1280, ...).
fn size_class(size: usize) -> Option<(usize, usize)> {
    if size <= MIN_BLOCK_SIZE {
        return Some((0, MIN_BLOCK_SIZE));
    }
    // 2^p < size <= 2^(p + 1), p >= 9.
    let p = (usize::BITS - 1 - (size - 1).leading_zeros()) as usize;
    let base = 1usize << p;
    let step = base / CLASSES_PER_DOUBLING;
    let k = (size - base).div_ceil(step); // 1..=4
    let class = base + k * step; // at most 2^(p + 1)
    if class > isize::MAX as usize {
        return None;
    }
    Some(((p - 9) * CLASSES_PER_DOUBLING + k, class))
}

/// What [`CachingMemoryResource::stats`] reports: the blocks the cache holds from its upstream
/// resource, split into those lent out and those waiting in a bin, and how allocations were
/// served. Every byte the cache holds is counted once: `in_use_bytes + cached_bytes` is what
/// the upstream resource has allocated for the cache and not yet freed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CachingStats {
    /// Blocks lent out (their buffers, or a graph that keeps them, not yet gone).
    pub in_use_blocks: usize,
    /// Their sizes in bytes (block sizes: the requests rounded up to their size class).
    pub in_use_bytes: usize,
    /// Blocks waiting in a bin.
    pub cached_blocks: usize,
    /// Their sizes in bytes.
    pub cached_bytes: usize,
    /// Allocations served from a bin: `hits - cross_stream_hits` on the stream the block was
    /// last freed on (no driver call), `cross_stream_hits` on another.
    pub hits: u64,
    /// Of the hits, those on another stream than the block's last free, each after the
    /// allocation's stream was made to wait for an event (`cuStreamWaitEvent`; no host wait).
    pub cross_stream_hits: u64,
    /// Allocations that took a new block from the upstream resource (one it refused is not
    /// counted).
    pub misses: u64,
    /// Events recorded (`cuEventRecord`): one at each free on a stream the cache cannot keep
    /// alive (a stream wrapped without an owner), and one for each cross-stream hit of a block
    /// that did not carry one.
    pub events_recorded: u64,
    /// Blocks freed through the upstream resource's own release rule (trims, closes, blocks
    /// given back after the cache was closed or that could not be binned).
    pub freed_blocks: u64,
    /// Allocations that the upstream resource refused for lack of memory and that were retried
    /// once after the bins were flushed.
    pub out_of_memory_retries: u64,
}

/// What [`CachingMemoryResource::trim`] did: the cached blocks it freed and those it could not
/// free now, and the blocks lent out, which it does not touch.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Trimmed {
    /// Cached blocks freed (their frees issued).
    pub freed_blocks: usize,
    /// Their sizes in bytes.
    pub freed_bytes: usize,
    /// Cached blocks left in their bins because their stream is being captured (by a capture
    /// begun through custody): a free there would join the capture; or because the trimming
    /// thread has such a capture of its own running, which a free in the driver's default mode
    /// would invalidate (docs/driver-facts.md F27). A later trim frees them.
    pub kept_blocks: usize,
    /// Their sizes in bytes.
    pub kept_bytes: usize,
    /// Blocks lent out (buffers not yet closed or dropped): not the trim's to free.
    pub in_use_blocks: usize,
    /// Their sizes in bytes.
    pub in_use_bytes: usize,
}

/// Which stream a bin serves: what makes "the same stream" for a block's reuse with no driver
/// call. Each value names one stream for as long as a block is binned under it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Key {
    /// A stream the block's recipe keeps alive (created, or wrapped with an owner,
    /// [`StreamHandle::pins_its_stream`]): its raw value, which no other stream can get while
    /// the block holds it.
    Pinned(usize),
    /// A stream wrapped without an owner: the driver's id (`cuStreamGetId`, unique for the life
    /// of the process, [`StreamHandle::unpinned_id`]), so that a later stream under the same raw
    /// value is another key.
    Unpinned(u64),
    /// Such a stream whose id the driver did not give: its blocks serve other streams only
    /// (after their fence), never an allocation with no wait.
    Anonymous,
    /// The legacy default stream of a context (raw value): the legacy and null tokens, and a
    /// per-thread-default-stream free made away from its thread (D6). The recipe holds the
    /// context, so the stream lives.
    Legacy(usize),
    /// A thread's per-thread default stream in a context (raw value, thread token): reached
    /// only from that thread.
    PerThread(usize, u64),
}

/// A block waiting in a bin.
struct Cached {
    /// The block, its recipe its last free's (or, for a fenced block, the cache's own stream of
    /// the block's context, `CachingMemoryResource::drain`).
    block: DevicePtrHandle,
    /// For a block last freed on a stream the cache cannot keep alive: an event recorded there
    /// at the free, after which the block may be used anywhere. The stream is never named again.
    fence: Option<EventHandle>,
}

/// One stream's bins: blocks whose last free was ordered on that stream, by size class.
struct StreamBins {
    key: Key,
    /// Indexed by size class.
    classes: Vec<Vec<Cached>>,
}

#[derive(Default)]
struct State {
    /// Few streams in practice: searched in order, the last one used first.
    streams: Vec<StreamBins>,
    stats: CachingStats,
    closed: bool,
}

impl State {
    fn bin(&mut self, key: Key, class: usize) -> &mut Vec<Cached> {
        let index = match self.streams.iter().position(|bins| bins.key == key) {
            Some(index) => index,
            None => {
                self.streams.push(StreamBins {
                    key,
                    classes: Vec::new(),
                });
                self.streams.len() - 1
            }
        };
        let classes = &mut self.streams[index].classes;
        if classes.len() <= class {
            classes.resize_with(class + 1, Vec::new);
        }
        &mut classes[class]
    }

    /// Bins `cached` (counted as cached, no longer lent out).
    fn put(&mut self, key: Key, class: usize, cached: Cached) {
        let size = cached.block.size();
        self.stats.in_use_blocks -= 1;
        self.stats.in_use_bytes -= size;
        self.stats.cached_blocks += 1;
        self.stats.cached_bytes += size;
        self.bin(key, class).push(cached);
    }

    /// A cached block of `class` last freed on `key`'s stream, counted as lent out and as a hit.
    /// The stream found moves to the front, so that a stream in use is found first.
    #[inline]
    fn take(&mut self, key: Key, class: usize) -> Option<Cached> {
        let index = self.streams.iter().position(|bins| bins.key == key)?;
        let cached = self.streams[index].classes.get_mut(class)?.pop()?;
        if index != 0 {
            self.streams.swap(0, index);
        }
        self.taken(&cached);
        Some(cached)
    }

    /// A block of `class` from another stream's bin than `key`'s, for an allocation on that
    /// stream: from a bin that keeps another block of the class (a stream's last cached block
    /// of a size stays its own, so that two streams never take turns with one block, each
    /// waiting for the other), or from any bin when `pressed` (the upstream is out of memory);
    /// fenced blocks first (they need only a wait). Counted as lent out and as a hit; the caller
    /// orders it and counts the cross-stream hit, or puts it back.
    fn steal(&mut self, key: Option<Key>, class: usize, pressed: bool) -> Option<(Key, Cached)> {
        let found = [true, false].into_iter().find_map(|fenced| {
            self.streams.iter().enumerate().find_map(|(index, bins)| {
                let bin = bins.classes.get(class)?;
                let spare = bin.len() >= 2 || pressed || bins.key == Key::Anonymous;
                if Some(bins.key) == key || !spare {
                    return None;
                }
                let at = bin.iter().rposition(|c| c.fence.is_some() == fenced)?;
                Some((index, at))
            })
        });
        let (index, at) = found?;
        let bins = &mut self.streams[index];
        let (from, cached) = (bins.key, bins.classes[class].remove(at));
        self.taken(&cached);
        Some((from, cached))
    }

    fn taken(&mut self, cached: &Cached) {
        let size = cached.block.size();
        self.stats.cached_blocks -= 1;
        self.stats.cached_bytes -= size;
        self.stats.in_use_blocks += 1;
        self.stats.in_use_bytes += size;
        self.stats.hits += 1;
    }

    /// A block taken out and not used after all: back in its bin, its hit not counted.
    fn untake(&mut self, key: Key, class: usize, cached: Cached) {
        self.stats.hits -= 1;
        self.put(key, class, cached);
    }

    /// Puts back a block [`State::drain`] took out (counted as cached again).
    fn rebin(&mut self, key: Key, class: usize, cached: Cached) {
        self.stats.cached_blocks += 1;
        self.stats.cached_bytes += cached.block.size();
        self.bin(key, class).push(cached);
    }

    /// Every cached block with its bin, out of the bins (the caller frees them outside the
    /// lock).
    fn drain(&mut self) -> Vec<(Key, usize, Cached)> {
        let blocks: Vec<(Key, usize, Cached)> = std::mem::take(&mut self.streams)
            .into_iter()
            .flat_map(|bins| {
                let key = bins.key;
                bins.classes
                    .into_iter()
                    .enumerate()
                    .flat_map(move |(class, bin)| bin.into_iter().map(move |c| (key, class, c)))
            })
            .collect();
        self.stats.cached_blocks = 0;
        self.stats.cached_bytes = 0;
        blocks
    }

    /// A lent block that is not coming back to a bin (freed instead).
    fn returned(&mut self, size: usize) {
        self.stats.in_use_blocks -= 1;
        self.stats.in_use_bytes -= size;
        self.stats.freed_blocks += 1;
    }
}

/// A cached block without a recipe: none can be (a block is lent only with one, and keeps it).
#[cold]
fn no_recipe() -> HandleError {
    HandleError::InvalidArgument {
        what: "block",
        reason: "a cached block without a deallocation recipe".into(),
    }
}

fn is_out_of_memory(error: &MemoryError) -> bool {
    matches!(error, MemoryError::Handle(e) if e.code() == Some(CudaErrorCode::OUT_OF_MEMORY))
}

/// What a warning of [`CachingMemoryResource`] is about, one bit each: said once per cache.
#[derive(Clone, Copy)]
enum NotCached {
    Capturing = 1,
    Unfenced = 2,
    NotLendable = 4,
}

impl NotCached {
    fn why(self) -> &'static str {
        match self {
            NotCached::Capturing => {
                "allocations on a stream being captured by a capture begun through custody"
            }
            NotCached::Unfenced => {
                "blocks freed on a stream wrapped without an owner when no event could be \
                 recorded there (they are freed)"
            }
            NotCached::NotLendable => {
                "its upstream resource's buffers that cannot be lent (graph memory, or a \
                 buffer of another size than asked)"
            }
        }
    }
}

/// A cache over another memory resource (composition: the upstream resource allocates and
/// frees every block), opt-in, in the manner of PyTorch's and CuPy's caching allocators, with
/// custody's deallocation recipes kept exact, on every stream its user passes.
///
/// - **Reuse on the same stream, with no driver call.** A buffer's memory goes back to a bin of
///   the stream its free is ordered on when its last reference goes (its recipe's stream: the
///   allocation stream, or the one [`Buffer::set_deallocation_stream`] named last), and an
///   allocation on that stream takes it again: work enqueued there after the free is ordered
///   after every earlier use by stream order, as the free itself would have been. "The same
///   stream" is a created stream or one wrapped with an owner by its raw value (the block's
///   recipe keeps it alive), a stream wrapped without an owner (`raw::wrap_stream(raw, None)`,
///   Python's `Stream.from_handle(int)`) by the driver's id for it
///   ([`StreamHandle::unpinned_id`]), which a later stream under the same value does not share,
///   and a default stream by its context (and thread, for the per-thread stream).
/// - **Streams the cache cannot keep alive.** A stream wrapped without an owner may be
///   destroyed by its maker while a block waits, and its value handed to a new stream. So the
///   free of a block on it records an event there (`cuEventRecord`: the last moment the stream
///   is known to live), and from then on the cache never names that stream: the block's
///   recipe moves to a stream of the cache's own in the same context, whose free of it waits
///   for the event first, and another stream that takes the block waits for it. Cost: one
///   `cuEventRecord` per free on such a stream (none on the others).
/// - **Reuse on another stream, after an event wait.** An allocation on a stream with no block
///   of its size class cached takes one freed on another stream when that stream's bin keeps
///   another one of the class (its last stays its own, so that two streams never take turns
///   with one block, each waiting for the other), or from any stream when the upstream resource
///   is out of memory: its stream first waits (`cuStreamWaitEvent`) for the event recorded at
///   the block's free, or for one recorded on the block's stream then. No host wait, no polling.
/// - **Declared uses** ([`Buffer::record_use`], docs/decisions.md D12) are ordered before the
///   block enters its bin: the free's stream waits for an event recorded on each use stream at
///   the free (`cuStreamWaitEvent`), as for any free, so a reuse after it follows them.
/// - **Captures** (D11): an allocation on a stream being captured by a capture begun through
///   custody goes to the upstream resource, which decides (a pool refuses it), and no block
///   serves another stream while such a capture runs; a buffer freed on a capturing stream goes
///   to the capture's graph and its block comes back when the graph is gone.
/// - **Never off silently.** What the cache cannot cache goes to the upstream resource and is
///   said once per cache through the cleanup-warning reporter
///   ([`CleanupWarningKind::NotCached`]; a `CUDAWarning` in Python): allocations on a stream
///   being captured, blocks freed on an unpinned stream when no event could be recorded there
///   (freed instead), and upstream buffers that cannot be lent.
/// - **Size classes**: requests are rounded up to 512 bytes, then to one of four classes per
///   doubling (a block is at most 25% larger than the request); [`Buffer::size`] is the size
///   asked for. A block serves requests of its class only (no splitting, no best fit).
/// - **Streams stay alive** while blocks of theirs are cached, for those a recipe keeps alive
///   (created streams, wrapped ones with an owner, a default stream's context):
///   [`CachingMemoryResource::trim`] frees them.
/// - **No IPC**: a lent buffer is not exportable ([`Buffer::ipc_descriptor`] refuses it with
///   [`MemoryError::Ipc`]), even over an IPC-enabled pool: another process could not follow
///   the block's reuse.
/// - **Flushes**: [`CachingMemoryResource::trim`] frees every cached block it can through the
///   upstream resource's own release rule and says what it freed and what not
///   ([`Trimmed`]); [`CachingMemoryResource::close`] frees them all and from then on frees every
///   block given back; an allocation the upstream refuses with `CUDA_ERROR_OUT_OF_MEMORY` takes
///   another stream's block if one of its class is cached, else flushes and retries once.
///   Dropping the resource (after its last buffer) frees what it still holds.
/// - **Pass-through** ([`CachingMemoryResource::PASS_THROUGH_ENV`], read once per process):
///   nothing is cached; every allocation and free is the upstream resource's, for tools that
///   follow the driver's allocations (compute-sanitizer's leak and stream-ordered race checks).
///
/// The upstream resource's own statistics (a pool's used and reserved memory) count cached
/// blocks as allocated, which they are; [`CachingStats`] splits them. Thread-safe: the bins are
/// behind one mutex, never held across a driver call or a free.
///
/// Driver calls: none for an allocation served from its stream's bin nor for a free that goes to
/// a bin of a stream the cache can keep alive; `cuEventRecord` for a free on one it cannot;
/// `cuStreamWaitEvent` (and `cuEventRecord`) for a block serving another stream; the upstream
/// resource's otherwise.
pub struct CachingMemoryResource {
    state: Mutex<State>,
    /// Mirrors `state.closed` for the allocation path's check without the lock.
    closed: AtomicBool,
    /// Events for fences, recorded or not (a leaf lock: pushed and popped only).
    events: Mutex<Vec<EventHandle>>,
    /// The cache's own stream of each context it has fenced blocks of: where their frees go,
    /// after their fence (a leaf lock).
    drains: Mutex<Vec<StreamHandle>>,
    /// The warnings said ([`NotCached`] bits).
    warned: AtomicU8,
    access: Accessibility,
    upstream: Arc<dyn MemoryResource>,
}

/// The cache's counters and its upstream resource (no driver call; takes the bins' lock for
/// the counters).
impl fmt::Debug for CachingMemoryResource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CachingMemoryResource")
            .field("upstream", &self.upstream)
            .field("closed", &self.is_closed())
            .field("stats", &self.stats())
            .finish()
    }
}

impl CachingMemoryResource {
    /// A cache over `upstream` (a pool, a synchronous resource, a resource of the caller's),
    /// empty. No driver call.
    pub fn new(upstream: Arc<dyn MemoryResource>) -> Arc<CachingMemoryResource> {
        Arc::new(CachingMemoryResource {
            state: Mutex::new(State::default()),
            closed: AtomicBool::new(false),
            events: Mutex::new(Vec::new()),
            drains: Mutex::new(Vec::new()),
            warned: AtomicU8::new(0),
            access: upstream.accessibility(),
            upstream,
        })
    }

    /// The environment variable that turns every [`CachingMemoryResource`] of the process into a
    /// pass-through: set to anything but empty or `0` when the process first asks
    /// ([`CachingMemoryResource::passes_through`], read once), each allocation goes to the upstream
    /// resource and each free back to it, as if there were no cache (PyTorch's
    /// `PYTORCH_NO_CUDA_MEMORY_CACHING` does the same for its allocator). For tools that follow the
    /// driver's allocations, such as compute-sanitizer's leak and stream-ordered race checks, which
    /// cannot see a block that goes back to a bin.
    pub const PASS_THROUGH_ENV: &str = "CUSTODY_CACHING_PASS_THROUGH";

    /// Whether caches pass everything through to their upstream resource ([`Self::PASS_THROUGH_ENV`]),
    /// as read the first time any cache asks, for the rest of the process. No driver call.
    pub fn passes_through() -> bool {
        static PASS_THROUGH: OnceLock<bool> = OnceLock::new();
        *PASS_THROUGH.get_or_init(|| {
            std::env::var_os(Self::PASS_THROUGH_ENV).is_some_and(|v| !v.is_empty() && v != "0")
        })
    }

    /// The resource that allocates and frees the blocks.
    pub fn upstream(&self) -> &Arc<dyn MemoryResource> {
        &self.upstream
    }

    /// A snapshot of the cache's counters ([`CachingStats`]). No driver call.
    pub fn stats(&self) -> CachingStats {
        self.lock().stats
    }

    /// Frees the cached blocks now, through the upstream resource's own release rule (for a
    /// pool `cuMemFreeAsync` on the block's stream, which does not block; for the synchronous
    /// resources `cuStreamSynchronize` of the block's stream, then the free), and says what it
    /// did ([`Trimmed`]): a block whose stream is being captured by a capture begun through
    /// custody stays in its bin (its free would join the capture), and buffers lent out are not
    /// touched (their blocks come back to the bins as usual). On a thread that began such a
    /// capture (global or thread-local mode) and has not ended it, every block stays: the
    /// driver forbids that thread "potentially unsafe" calls, and a `cuMemFreeAsync` of pool
    /// memory on another stream, not captured, is one: on an H200 it was refused and
    /// invalidated the capture (docs/driver-facts.md F27). A block last freed on a stream
    /// wrapped without an owner is freed on the cache's own stream of its context, after the
    /// event recorded at its free: the wrapped stream may be gone.
    ///
    /// # Errors
    /// The first failing free ([`MemoryError::Handle`]); the blocks after it are freed as a
    /// drop frees them (not blocking, failures reported through the cleanup-error hook), so
    /// only the blocks on capturing streams stay in the bins either way.
    ///
    /// Driver calls: the upstream resource's frees, one per block freed; `cuStreamWaitEvent`
    /// before each free of a block with a fence (and `cuStreamCreateWithPriority` for the
    /// cache's own stream of a context, once); `cuStreamIsCapturing` per block while a custody
    /// capture runs.
    pub fn trim(&self) -> Result<Trimmed, MemoryError> {
        let blocks = self.lock().drain();
        let mut kept = Vec::new();
        let mut free = Vec::new();
        // On a thread with a capture of its own running (global or thread-local mode) every
        // block stays: in the driver's default mode its `cuMemFreeAsync`, on a stream not being
        // captured, is refused there and invalidates that capture (docs/driver-facts.md F27;
        // handles relaxes the mode around its frees, but a fenced block's `cuStreamWaitEvent`
        // comes first, and a later trim loses nothing).
        let own_capture = handles::this_thread_may_be_capturing();
        for (key, class, cached) in blocks {
            if own_capture {
                kept.push((key, class, cached));
                continue;
            }
            if handles::capture_may_be_active() && cached.fence.is_none() {
                let capturing = cached.block.deallocation_stream().is_some_and(|stream| {
                    !matches!(handles::capture_status(&stream), Ok(CaptureStatus::None))
                });
                if capturing {
                    kept.push((key, class, cached));
                    continue;
                }
            }
            free.push(cached);
        }
        let mut report = Trimmed {
            freed_blocks: free.len(),
            freed_bytes: free.iter().map(|c| c.block.size()).sum(),
            kept_blocks: kept.len(),
            kept_bytes: kept.iter().map(|(_, _, c)| c.block.size()).sum(),
            ..Trimmed::default()
        };
        {
            let mut state = self.lock();
            state.stats.freed_blocks += free.len() as u64;
            for (key, class, cached) in kept {
                state.rebin(key, class, cached);
            }
            report.in_use_blocks = state.stats.in_use_blocks;
            report.in_use_bytes = state.stats.in_use_bytes;
        }
        self.free_all(free)?;
        Ok(report)
    }

    /// Closes the resource: it allocates nothing more ([`MemoryError::ResourceClosed`]), its
    /// cached blocks are freed as [`CachingMemoryResource::trim`] frees them (a capturing
    /// stream's too: that free goes to the capture's graph, D11), and every block given back
    /// later (a buffer still lent out, closed or dropped) is freed at once through the upstream
    /// resource. Idempotent.
    ///
    /// Unlike the other resources, which a Rust program closes by dropping their last `Arc`,
    /// a cache has a close of its own: every buffer it lends holds the cache (its block comes
    /// back to it), so the cache's drop, which frees what it holds, comes only after the last
    /// of them. `close` gives the memory back to the upstream resource now, while buffers are
    /// still out, and for good: a block given back later is freed, not cached (a
    /// [`CachingMemoryResource::trim`] frees only what is cached now, and the cache fills
    /// again).
    ///
    /// # Errors
    /// As [`CachingMemoryResource::trim`].
    ///
    /// Driver calls: as [`CachingMemoryResource::trim`].
    pub fn close(&self) -> Result<(), MemoryError> {
        let blocks = {
            let mut state = self.lock();
            state.closed = true;
            self.closed.store(true, Ordering::Release);
            let blocks = state.drain();
            state.stats.freed_blocks += blocks.len() as u64;
            blocks
        };
        self.free_all(blocks.into_iter().map(|(_, _, c)| c).collect())
    }

    /// A same-stream hit or `None`: `memory::binding::allocate_cached`, which says when.
    pub(crate) fn allocate_cached(
        self: &Arc<Self>,
        size: usize,
        stream: &StreamHandle,
    ) -> Option<Buffer> {
        if size == 0
            || self.is_closed()
            || Self::passes_through()
            || handles::capture_may_be_active()
        {
            return None;
        }
        let key = if stream.pins_its_stream() {
            Key::Pinned(stream.raw() as usize)
        } else {
            Key::Unpinned(stream.unpinned_id()?)
        };
        let (index, _) = size_class(size)?;
        let cached = self.lock().take(key, index)?;
        self.lend(cached, size, stream).ok()
    }

    /// Whether [`CachingMemoryResource::close`] was called.
    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Says `what` once for this cache through the cleanup-warning reporter. Never under a lock.
    #[cold]
    fn warn_once(&self, what: NotCached, stream: &StreamHandle) {
        let bit = what as u8;
        if self.warned.fetch_or(bit, Ordering::Relaxed) & bit != 0 {
            return;
        }
        handles::report_warning(CleanupWarning {
            operation: "CachingMemoryResource",
            ptr: 0,
            stream: stream.raw() as u64,
            context: stream.context().map_or(0, |c| c.raw() as u64),
            kind: CleanupWarningKind::NotCached { why: what.why() },
        });
    }

    /// The bin an allocation on `stream` looks in: `Ok(None)` for a stream wrapped without an
    /// owner whose id the driver did not give (it takes other streams' blocks only).
    ///
    /// # Errors
    /// [`HandleError::NoCurrentContext`] for an unbound token on a thread with no context.
    ///
    /// Driver calls: `cuCtxGetCurrent` for an unbound token.
    fn key_of(stream: &StreamHandle) -> Result<Option<Key>, HandleError> {
        let key = if stream.pins_its_stream() {
            Some(Key::Pinned(stream.raw() as usize))
        } else if let Some(kind) = stream.default_kind() {
            let context = match stream.context() {
                Some(context) => context.raw() as usize,
                None => DeallocationRecipe::record(stream)?.context().raw() as usize,
            };
            Some(match kind {
                DefaultStream::PerThread => Key::PerThread(context, ThreadToken::current().value()),
                DefaultStream::Null | DefaultStream::Legacy => Key::Legacy(context),
            })
        } else {
            stream.unpinned_id().map(Key::Unpinned)
        };
        Ok(key)
    }

    /// Lends `cached` (counted as lent out) as `size` bytes ordered on `stream`; its fence, no
    /// longer needed (the caller has ordered `stream` after it, or `stream` is its stream), goes
    /// back to the spare events.
    ///
    /// # Errors
    /// [`HandleError::WrongDevice`](handles::HandleError::WrongDevice) and the other refusals of `DevicePtrHandle::lend`; the
    /// block is then freed by its own rule (after its fence), not cached.
    #[inline]
    fn lend(
        self: &Arc<Self>,
        cached: Cached,
        size: usize,
        stream: &StreamHandle,
    ) -> Result<Buffer, MemoryError> {
        let Cached { block, fence } = cached;
        match DevicePtrHandle::lend(block, size, stream, Arc::clone(self)) {
            Ok(handle) => {
                if let Some(fence) = fence {
                    self.spare(fence);
                }
                Ok(Buffer::new(
                    handle,
                    Some(Arc::clone(self) as Arc<dyn MemoryResource>),
                    Some(self.access),
                    IpcRole::None,
                ))
            }
            Err((error, block)) => {
                self.lock().returned(block.size());
                self.free(Cached { block, fence }, false)?;
                Err(MemoryError::Handle(error))
            }
        }
    }

    /// An event for a fence in `context`: a spare one, or a new one.
    ///
    /// Driver calls: `cuEventCreate` (in `context`) when there is no spare one.
    fn event(&self, context: &ContextHandle) -> Result<EventHandle, HandleError> {
        let spare = {
            let mut events = self.events.lock().unwrap_or_else(|e| e.into_inner());
            events
                .iter()
                .rposition(|e| e.context().ptr_eq(context))
                .map(|at| events.swap_remove(at))
        };
        match spare {
            Some(event) => Ok(event),
            None => EventHandle::create(context, EventFlags::DISABLE_TIMING),
        }
    }

    /// Keeps `event` for another fence (dropped, destroying it, beyond [`SPARE_EVENTS`]).
    fn spare(&self, event: EventHandle) {
        let mut events = self.events.lock().unwrap_or_else(|e| e.into_inner());
        if events.len() < SPARE_EVENTS {
            events.push(event);
            return;
        }
        drop(events);
        drop(event);
    }

    /// An event recorded now on `stream` (in `context`, the stream's), counted.
    ///
    /// Driver calls: `cuEventRecord` (and `cuEventCreate` without a spare event), in `context`.
    fn fence(
        &self,
        stream: &StreamHandle,
        context: &ContextHandle,
    ) -> Result<EventHandle, HandleError> {
        let event = self.event(context)?;
        event.record(stream)?;
        self.lock().stats.events_recorded += 1;
        Ok(event)
    }

    /// The cache's own stream in `context` (non-blocking, created once): where the frees of
    /// fenced blocks go, after their fence.
    ///
    /// Driver calls: `cuStreamCreateWithPriority` (in `context`) the first time.
    fn drain(&self, context: &ContextHandle) -> Result<StreamHandle, HandleError> {
        let find = |drains: &[StreamHandle]| {
            drains
                .iter()
                .find(|s| s.context().is_some_and(|c| c.ptr_eq(context)))
                .cloned()
        };
        if let Some(stream) = find(&self.drains.lock().unwrap_or_else(|e| e.into_inner())) {
            return Ok(stream);
        }
        let made = StreamHandle::create(context, StreamFlags::NON_BLOCKING, 0)?;
        let mut drains = self.drains.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(stream) = find(&drains) {
            return Ok(stream); // another thread made one first; `made` goes
        }
        drains.push(made.clone());
        Ok(made)
    }

    /// Frees a block taken out of the bins through its own release rule: explicitly (returning
    /// the error, possibly blocking) or as a drop. A fenced block's recipe is the cache's own
    /// stream, which first waits for the fence; if that wait fails the block is leaked (a free
    /// not ordered after its last use would let the pool hand it out under that use), returned
    /// as the error or reported.
    ///
    /// Driver calls: `cuStreamWaitEvent` for a fenced block; the block's own free.
    fn free(&self, cached: Cached, explicit: bool) -> Result<(), HandleError> {
        let Cached { block, fence } = cached;
        if let Some(fence) = fence {
            let ordered = block
                .deallocation_stream()
                .ok_or_else(no_recipe)
                .and_then(|drain| drain.wait_event(&fence).map(|()| drain));
            match ordered {
                Ok(_) => self.spare(fence),
                Err(error) => {
                    let (ptr, context) = (block.ptr(), fence.context().raw() as u64);
                    std::mem::forget(block);
                    if explicit {
                        return Err(error);
                    }
                    handles::report_error(CleanupError {
                        resource: "CachingMemoryResource".into(),
                        operation: "cuStreamWaitEvent",
                        step: CleanupStep::Ordering,
                        consequence: Consequence::Leaked,
                        ptr,
                        stream: 0,
                        context,
                        error,
                    });
                    return Ok(());
                }
            }
        }
        if explicit {
            block.release()
        } else {
            drop(block);
            Ok(())
        }
    }

    /// Frees `blocks` (out of the bins): each explicitly until one fails, the rest as a drop
    /// frees them (without blocking, failures reported through the cleanup-error hook), so that
    /// nothing is kept and no failure is lost.
    ///
    /// # Errors
    /// The first failure.
    fn free_all(&self, blocks: Vec<Cached>) -> Result<(), MemoryError> {
        let mut result = Ok(());
        for cached in blocks {
            let explicit = result.is_ok();
            if let Err(error) = self.free(cached, explicit) {
                result = Err(MemoryError::from(error));
            }
        }
        result
    }

    /// A block of another stream's bin for an allocation on `stream` (bin `key`), its stream
    /// made to wait for the block's last use first: the event recorded at its free, or one
    /// recorded on its stream now. `None` (nothing changed) when no bin can give one, while a
    /// custody capture runs, or when the ordering fails (the block goes back).
    ///
    /// Driver calls: `cuStreamWaitEvent` on `stream`; `cuEventRecord` on the block's stream for
    /// a block without a fence (`cuEventCreate` without a spare event).
    fn borrow(
        &self,
        key: Option<Key>,
        class: usize,
        pressed: bool,
        stream: &StreamHandle,
    ) -> Option<Cached> {
        if handles::capture_may_be_active() {
            return None;
        }
        let (from, mut cached) = self.lock().steal(key, class, pressed)?;
        let ordered = (|| -> Result<(), HandleError> {
            let fence = match cached.fence.take() {
                Some(fence) => fence,
                None => {
                    let recipe = cached.block.recipe().ok_or_else(no_recipe)?;
                    // A default stream's work is waited for on its context's legacy stream,
                    // which waits for every blocking stream of the context, the recording
                    // thread's per-thread stream included (docs/driver-facts.md F14).
                    let on = match from {
                        Key::Legacy(_) | Key::PerThread(..) => StreamHandle::bound_default_stream(
                            DefaultStream::Legacy,
                            recipe.context(),
                        ),
                        _ => recipe.stream().clone(),
                    };
                    self.fence(&on, recipe.context())?
                }
            };
            let waited = stream.wait_event(&fence);
            match &waited {
                Ok(()) => self.spare(fence),
                Err(_) => cached.fence = Some(fence), // still the block's ordering
            }
            waited
        })();
        match ordered {
            Ok(()) => {
                self.lock().stats.cross_stream_hits += 1;
                Some(cached)
            }
            Err(_) => {
                self.lock().untake(from, class, cached);
                None
            }
        }
    }

    /// A new block of `class_size` bytes from the upstream resource, ordered on `stream`,
    /// counted as lent out; the upstream's buffer itself when it cannot be lent (a graph
    /// allocation, or a buffer of another size than asked). On `CUDA_ERROR_OUT_OF_MEMORY`:
    /// another stream's cached block of the class (`Ok(Err(..))` is never that), else the bins
    /// are flushed and the allocation retried once.
    fn fresh_block(
        &self,
        key: Option<Key>,
        class: (usize, usize),
        stream: &StreamHandle,
    ) -> Result<Fresh, MemoryError> {
        let (index, class_size) = class;
        let buffer = match Arc::clone(&self.upstream).allocate_owned(class_size, stream) {
            Err(error) if is_out_of_memory(&error) => {
                if let Some(cached) = self.borrow(key, index, true, stream) {
                    return Ok(Fresh::Cached(cached));
                }
                let blocks = {
                    let mut state = self.lock();
                    let blocks = state.drain();
                    state.stats.freed_blocks += blocks.len() as u64;
                    if !blocks.is_empty() {
                        state.stats.out_of_memory_retries += 1;
                    }
                    blocks
                };
                if blocks.is_empty() {
                    return Err(error); // nothing cached: nothing to retry with
                }
                self.free_all(blocks.into_iter().map(|(_, _, c)| c).collect())?;
                Arc::clone(&self.upstream).allocate_owned(class_size, stream)?
            }
            result => result?,
        };
        // Counted once the upstream has allocated: a refused allocation is no miss.
        let block = if buffer.size() == class_size {
            buffer.into_block()
        } else {
            Err(buffer)
        };
        let mut state = self.lock();
        state.stats.misses += 1;
        match block {
            Ok(block) => {
                state.stats.in_use_blocks += 1;
                state.stats.in_use_bytes += class_size;
                Ok(Fresh::Block(block))
            }
            Err(buffer) => {
                drop(state);
                self.warn_once(NotCached::NotLendable, stream);
                Ok(Fresh::Buffer(buffer))
            }
        }
    }

    /// Takes back a block whose last free was ordered on `stream` (in `context`): bins it, or
    /// frees it (a closed cache, a size no class has, a stream it cannot fence), through its own
    /// rule: explicitly (returning the error, possibly blocking) for an explicit release, as a
    /// drop otherwise. `pinned`: the raw value of `stream`, which keeps it alive through the
    /// block's recipe.
    ///
    /// Driver calls: none for a stream the recipe keeps alive; `cuEventRecord` (and the first
    /// time `cuEventCreate` and `cuStreamCreateWithPriority`) for one it does not; the block's
    /// free when it is not binned.
    fn take_back(
        &self,
        block: DevicePtrHandle,
        stream: Option<&StreamHandle>,
        pinned: Option<usize>,
        explicit: bool,
    ) -> Result<(), HandleError> {
        let size = block.size();
        let class = size_class(size).filter(|&(_, c)| c == size).map(|(i, _)| i);
        let (Some(class), false) = (class, self.is_closed()) else {
            self.lock().returned(size);
            return self.free(Cached { block, fence: None }, explicit);
        };
        let (key, fence, block) = match (pinned, stream) {
            (Some(raw), _) => (Key::Pinned(raw), None, block),
            (None, None) => {
                self.lock().returned(size);
                return self.free(Cached { block, fence: None }, explicit);
            }
            (None, Some(stream)) => match self.keyed(block, stream) {
                Ok(keyed) => keyed,
                Err((block, unfenced)) => {
                    if unfenced {
                        self.warn_once(NotCached::Unfenced, stream);
                    }
                    self.lock().returned(size);
                    return self.free(Cached { block, fence: None }, explicit);
                }
            },
        };
        let cached = Cached { block, fence };
        let mut state = self.lock();
        if state.closed {
            state.returned(size);
            drop(state);
            return self.free(cached, explicit);
        }
        state.put(key, class, cached);
        Ok(())
    }

    /// The bin of a block freed on `stream`, a stream the block's recipe does not keep alive by
    /// its value: a default stream (its context, and thread for the per-thread stream), or a
    /// stream wrapped without an owner, for which the block gets a fence recorded there now and
    /// its recipe moves to the cache's own stream of that context. The block back with `true`
    /// when that stream cannot be fenced (the caller frees it on `stream`, alive now).
    #[allow(clippy::type_complexity)]
    fn keyed(
        &self,
        block: DevicePtrHandle,
        stream: &StreamHandle,
    ) -> Result<(Key, Option<EventHandle>, DevicePtrHandle), (DevicePtrHandle, bool)> {
        let Some(recipe) = block.recipe() else {
            return Err((block, false));
        };
        let context = recipe.context().raw() as usize;
        if let Some(kind) = stream.default_kind() {
            let key = match (kind, recipe.ptds_thread()) {
                (DefaultStream::PerThread, Some(thread)) => Key::PerThread(context, thread.value()),
                _ => Key::Legacy(context),
            };
            return Ok((key, None, block));
        }
        let key = stream.unpinned_id().map_or(Key::Anonymous, Key::Unpinned);
        let fenced = self.fence(stream, recipe.context()).and_then(|fence| {
            let drain = self.drain(recipe.context())?;
            block.set_deallocation_stream(&drain)?;
            Ok(fence)
        });
        drop(recipe); // its stream reference goes with the block's old recipe
        match fenced {
            Ok(fence) => Ok((key, Some(fence), block)),
            Err(_) => Err((block, true)),
        }
    }
}

/// A block for an allocation from [`CachingMemoryResource::fresh_block`].
enum Fresh {
    /// A new block from the upstream.
    Block(DevicePtrHandle),
    /// Another stream's cached block, ordered for the allocation's stream.
    Cached(Cached),
    /// The upstream's own buffer, which cannot be lent.
    Buffer(Buffer),
}

impl MemoryResource for CachingMemoryResource {
    /// Allocates `size` bytes ordered on `stream`: a cached block of the size class of `size`
    /// whose last free was ordered on `stream` when there is one (no driver call), else another
    /// stream's when one may serve it (after `stream` waits for an event, see
    /// [`CachingMemoryResource`]), else a new block of the class's size from the upstream
    /// resource. The buffer reports `size` bytes and this resource; its free gives the block back
    /// (see [`CachingMemoryResource`]). On a stream a custody capture is capturing, or for a
    /// request whose class would exceed `isize::MAX` bytes, the upstream resource allocates
    /// `size` bytes itself and the buffer is its own.
    ///
    /// # Errors
    /// [`MemoryError::InvalidSize`]; [`MemoryError::ResourceClosed`] after
    /// [`CachingMemoryResource::close`]; [`HandleError::WrongDevice`](handles::HandleError::WrongDevice) for a stream of another
    /// device than the memory's; [`MemoryError::Handle`] with
    /// [`HandleError::NoCurrentContext`] for an unbound default stream on a thread with no
    /// context; the upstream resource's errors (after one retry for
    /// `CUDA_ERROR_OUT_OF_MEMORY`), or a failed flush's before that retry. Nothing is allocated
    /// on error.
    ///
    /// Driver calls: none from the stream's own bin; `cuStreamWaitEvent` (and `cuEventRecord`)
    /// for another stream's block; otherwise the upstream resource's allocation (and on
    /// `CUDA_ERROR_OUT_OF_MEMORY` the frees of [`CachingMemoryResource::trim`]);
    /// `cuCtxGetCurrent` for an unbound default stream; `cuStreamIsCapturing` only while a
    /// custody capture runs.
    fn allocate_owned(
        self: Arc<Self>,
        size: usize,
        stream: &StreamHandle,
    ) -> Result<Buffer, MemoryError> {
        if size == 0 {
            return Ok(Buffer::empty(self));
        }
        check_size(size)?;
        if self.is_closed() {
            return Err(MemoryError::ResourceClosed {
                resource: "CachingMemoryResource",
            });
        }
        let class = match size_class(size) {
            Some(class) if !Self::passes_through() => class,
            _ => return Arc::clone(&self.upstream).allocate_owned(size, stream),
        };
        if handles::capture_may_be_active()
            && handles::capture_status(stream)? != CaptureStatus::None
        {
            self.warn_once(NotCached::Capturing, stream);
            return Arc::clone(&self.upstream).allocate_owned(size, stream);
        }
        let key = Self::key_of(stream)?;
        if let Some(key) = key {
            let cached = self.lock().take(key, class.0);
            if let Some(cached) = cached {
                return self.lend(cached, size, stream);
            }
        }
        if let Some(cached) = self.borrow(key, class.0, false, stream) {
            return self.lend(cached, size, stream);
        }
        match self.fresh_block(key, class, stream)? {
            Fresh::Block(block) => self.lend(Cached { block, fence: None }, size, stream),
            Fresh::Cached(cached) => self.lend(cached, size, stream),
            Fresh::Buffer(buffer) => Ok(buffer),
        }
    }

    /// Frees memory adopted with this resource as owner, through the upstream resource's
    /// `deallocate` (not cached).
    ///
    /// # Errors
    /// The upstream resource's.
    ///
    /// Driver calls: the upstream resource's `deallocate`.
    fn deallocate(
        &self,
        allocation: OwnedAllocation,
        stream: &StreamHandle,
    ) -> Result<(), MemoryError> {
        self.upstream.deallocate(allocation, stream)
    }

    /// The upstream resource's.
    fn accessibility(&self) -> Accessibility {
        self.access
    }

    fn name(&self) -> &str {
        "CachingMemoryResource"
    }

    /// Adopts with the upstream resource's rule (adopted memory is never cached).
    fn adopt(
        self: Arc<Self>,
        allocation: OwnedAllocation,
        stream: &StreamHandle,
    ) -> Result<DevicePtrHandle, AdoptError> {
        Arc::clone(&self.upstream).adopt(allocation, stream)
    }
}

impl Lender for CachingMemoryResource {
    /// Bins `block` under its free's stream (see [`CachingMemoryResource`]), or frees it (a
    /// closed cache) through its own release rule: explicitly (returning the error, possibly
    /// blocking) for an explicit release, as a drop otherwise.
    fn give_back(
        &self,
        block: DevicePtrHandle,
        returned: &Returned<'_>,
    ) -> Result<(), HandleError> {
        let (bin, explicit) = (returned.bin, returned.explicit);
        if bin.is_some() {
            // A stream the recipe keeps alive: its raw value is the key.
            return self.take_back(block, None, bin, explicit);
        }
        self.take_back(block, Some(returned.stream), None, explicit)
    }

    fn name(&self) -> &str {
        "CachingMemoryResource"
    }
}

impl Drop for CachingMemoryResource {
    /// Frees what is still cached, as drops (a fenced block after its fence, on the cache's own
    /// stream), before the upstream resource goes.
    fn drop(&mut self) {
        let blocks = self
            .state
            .get_mut()
            .unwrap_or_else(|e| e.into_inner())
            .drain();
        for (_, _, cached) in blocks {
            let _ = self.free(cached, false);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn size_classes_round_up_by_at_most_a_quarter() {
        assert_eq!(size_class(1), Some((0, 512)));
        assert_eq!(size_class(512), Some((0, 512)));
        assert_eq!(size_class(513), Some((1, 640)));
        assert_eq!(size_class(1024), Some((4, 1024)));
        assert_eq!(size_class(1025), Some((5, 1280)));
        assert_eq!(size_class(1 << 20), Some((10 * 4 + 4, 1 << 20)));
        assert_eq!(size_class(isize::MAX as usize), None);
        let mut previous = 0;
        for size in (1..200_000).step_by(37) {
            let (index, class) = size_class(size).unwrap();
            assert!(class >= size && (class <= 512 || class - size <= size / 4));
            // A class size is its own class: a block's size finds its bin again.
            assert_eq!(size_class(class), Some((index, class)));
            assert!(index >= previous);
            previous = index;
        }
    }
}
