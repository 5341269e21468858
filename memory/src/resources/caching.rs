//! [`CachingMemoryResource`]: an opt-in cache over another memory resource that keeps freed
//! blocks per (stream, size class) and lends them out again on the same stream without a
//! driver call, with [`CachingStats`]. The design (what "the same stream" means, declared uses,
//! size classes, flushes) is in handles/DESIGN.md, "Caching memory resource".

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use handles::{
    CaptureStatus, CudaErrorCode, DevicePtrHandle, HandleError, Lender, OwnedAllocation, Returned,
    StreamHandle,
};

use crate::buffer::{Accessibility, IpcRole};
use crate::checks::{check_size, device_error};
use crate::{AdoptError, Buffer, MemoryError, MemoryResource};

/// The smallest size class, in bytes: every request up to it takes a block of this size.
const MIN_BLOCK_SIZE: usize = 512;

/// Size classes per doubling above [`MIN_BLOCK_SIZE`]: a block is at most 25% larger than the
/// request it serves (plus the rounding up to 512 bytes).
const CLASSES_PER_DOUBLING: usize = 4;

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
    /// Blocks waiting in a bin for an allocation on their stream.
    pub cached_blocks: usize,
    /// Their sizes in bytes.
    pub cached_bytes: usize,
    /// Allocations served from a bin (no driver call).
    pub hits: u64,
    /// Allocations that took a new block from the upstream resource (one it refused is not
    /// counted).
    pub misses: u64,
    /// Blocks freed through the upstream resource's own release rule (trims, closes, frees
    /// on a default-stream token, blocks given back after the cache was closed).
    pub freed_blocks: u64,
    /// Allocations that the upstream resource refused for lack of memory and that were retried
    /// once after the bins were flushed.
    pub out_of_memory_retries: u64,
}

/// One stream's bins: blocks whose recipe orders their free on that stream, by size class.
struct StreamBins {
    /// The stream's raw value. Unique while a block sits here: each block's recipe holds the
    /// stream, so it cannot be destroyed and its value handed to a new stream.
    stream: usize,
    /// Indexed by size class.
    classes: Vec<Vec<DevicePtrHandle>>,
}

#[derive(Default)]
struct State {
    /// Few streams in practice: searched in order.
    streams: Vec<StreamBins>,
    stats: CachingStats,
    closed: bool,
}

impl State {
    fn bin(&mut self, stream: usize, class: usize) -> &mut Vec<DevicePtrHandle> {
        let index = match self.streams.iter().position(|bins| bins.stream == stream) {
            Some(index) => index,
            None => {
                self.streams.push(StreamBins {
                    stream,
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

    /// A cached block of `class` for `stream`, counted as lent out.
    #[inline]
    fn take(&mut self, stream: usize, class: usize) -> Option<DevicePtrHandle> {
        let bins = self.streams.iter_mut().find(|bins| bins.stream == stream)?;
        let block = bins.classes.get_mut(class)?.pop()?;
        let size = block.size();
        self.stats.cached_blocks -= 1;
        self.stats.cached_bytes -= size;
        self.stats.in_use_blocks += 1;
        self.stats.in_use_bytes += size;
        self.stats.hits += 1;
        Some(block)
    }

    /// Every cached block, out of the bins (the caller frees them outside the lock).
    fn drain(&mut self) -> Vec<DevicePtrHandle> {
        let blocks: Vec<DevicePtrHandle> = std::mem::take(&mut self.streams)
            .into_iter()
            .flat_map(|bins| bins.classes.into_iter().flatten())
            .collect();
        self.stats.cached_blocks = 0;
        self.stats.cached_bytes = 0;
        self.stats.freed_blocks += blocks.len() as u64;
        blocks
    }

    /// A lent block that is not coming back to a bin (freed instead).
    fn returned(&mut self, size: usize) {
        self.stats.in_use_blocks -= 1;
        self.stats.in_use_bytes -= size;
    }
}

/// Frees `blocks` through their own release rules (the upstream resource's frees): each
/// explicitly until one fails, the rest as a drop frees them (without blocking, failures
/// reported through the cleanup-error hook), so that nothing is kept and no failure is lost.
///
/// # Errors
/// The first failure.
fn free_blocks(blocks: Vec<DevicePtrHandle>) -> Result<(), MemoryError> {
    let mut result = Ok(());
    for block in blocks {
        if result.is_ok() {
            result = block.release().map_err(MemoryError::from);
        } else {
            drop(block);
        }
    }
    result
}

fn is_out_of_memory(error: &MemoryError) -> bool {
    matches!(error, MemoryError::Handle(e) if e.code() == Some(CudaErrorCode::OUT_OF_MEMORY))
}

/// A cache over another memory resource (composition: the upstream resource allocates and
/// frees every block), opt-in, in the manner of PyTorch's and CuPy's caching allocators, with
/// custody's deallocation recipes kept exact.
///
/// - **Reuse on the same stream only.** A buffer's memory goes back to a bin of the stream its
///   free is ordered on when its last reference goes (its recipe's stream: the allocation
///   stream, or the one [`Buffer::set_deallocation_stream`] named last), and an allocation on
///   that stream takes it again with no driver call: work enqueued there after the free is
///   ordered after every earlier use by stream order, as the free itself would have been. An
///   allocation on another stream never takes it (it allocates from the upstream resource).
/// - **Declared uses** ([`Buffer::record_use`], docs/decisions.md D12) are ordered before the
///   block enters its bin: the free's stream waits for an event recorded on each use stream at
///   the free (`cuStreamWaitEvent`), as for any free, so a reuse on that stream follows them.
/// - **Default-stream tokens** (legacy, per-thread) are not cached: an allocation on one goes
///   straight to the upstream resource (the buffer is the upstream's), and memory whose last
///   free is ordered on one is freed, with that exact recipe (docs/decisions.md D6 applies).
///   Neither is an allocation on a stream being captured by a capture begun through custody
///   (D11): it goes to the upstream resource, which decides (a pool refuses it).
/// - **Size classes**: requests are rounded up to 512 bytes, then to one of four classes per
///   doubling (a block is at most 25% larger than the request); [`Buffer::size`] is the size
///   asked for. A block serves requests of its class only (no splitting, no best fit).
/// - **Streams stay alive** while blocks of theirs are cached: a block's recipe holds its
///   stream. [`CachingMemoryResource::trim`] frees them. So only streams whose handle keeps
///   them alive are cached on ([`StreamHandle::pins_its_stream`]: created streams, and wrapped
///   ones with an owner object); on a stream wrapped without one, which its maker may destroy
///   while a block would wait in its bin, the upstream resource allocates and frees as it would
///   alone, and a lent block whose free was moved to such a stream is freed, not cached.
/// - **No IPC**: a lent buffer is not exportable ([`Buffer::ipc_descriptor`] refuses it with
///   [`MemoryError::Ipc`]), even over an IPC-enabled pool: another process could not follow
///   the block's reuse.
/// - **Flushes**: [`CachingMemoryResource::trim`] frees every cached block through the upstream
///   resource's own release rule (`cuMemFreeAsync` on the block's stream for a pool);
///   [`CachingMemoryResource::close`] trims and from then on frees every block given back; an
///   allocation the upstream refuses with `CUDA_ERROR_OUT_OF_MEMORY` trims and retries once.
///   Dropping the resource (after its last buffer) frees what it still holds.
/// - **Pass-through** ([`CachingMemoryResource::PASS_THROUGH_ENV`], read once per process): nothing is cached; every
///   allocation and free is the upstream resource's, as on a default-stream token.
///
/// The upstream resource's own statistics (a pool's used and reserved memory) count cached
/// blocks as allocated, which they are; [`CachingStats`] splits them. Thread-safe: the bins are
/// behind one mutex, never held across a driver call or a free.
///
/// Driver calls: none for an allocation served from a bin and none for a free that goes to one;
/// the upstream resource's otherwise.
pub struct CachingMemoryResource {
    /// Declared before `upstream`: cached blocks go before the resource that made them.
    state: Mutex<State>,
    /// Mirrors `state.closed` for the allocation path's check without the lock.
    closed: AtomicBool,
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

    /// Frees every cached block now, through the upstream resource's own release rule (for a
    /// pool `cuMemFreeAsync` on the block's stream, which does not block; for the synchronous
    /// resources `cuStreamSynchronize` of the block's stream, then the free). Buffers lent out
    /// are not touched; their blocks come back to the bins as usual.
    ///
    /// # Errors
    /// The first failing free ([`MemoryError::Handle`]); the blocks after it are freed as a
    /// drop frees them (not blocking, failures reported through the cleanup-error hook), so
    /// the bins are empty either way.
    ///
    /// Driver calls: the upstream resource's frees, one per cached block.
    pub fn trim(&self) -> Result<(), MemoryError> {
        let blocks = self.lock().drain();
        free_blocks(blocks)
    }

    /// Closes the resource: it allocates nothing more ([`MemoryError::ResourceClosed`]), its
    /// cached blocks are freed as [`CachingMemoryResource::trim`] frees them, and every block
    /// given back later (a buffer still lent out, closed or dropped) is freed at once through
    /// the upstream resource. Idempotent.
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
            state.drain()
        };
        free_blocks(blocks)
    }

    /// [`MemoryResource::allocate`] when a cached block serves it, `None` otherwise (nothing
    /// done: a miss, a request no bin serves, a closed resource, a capture begun through custody
    /// running anywhere): the allocation path that never calls the driver and never blocks
    /// beyond the bins' lock, for a caller that would otherwise give up a lock of its own around
    /// the call (a binding, the Python interpreter lock) and can then call `allocate`.
    ///
    /// Driver calls: none.
    pub fn allocate_cached(self: &Arc<Self>, size: usize, stream: &StreamHandle) -> Option<Buffer> {
        if size == 0
            || self.is_closed()
            || !stream.pins_its_stream()
            || Self::passes_through()
            || handles::capture_may_be_active()
        {
            return None;
        }
        let (index, _) = size_class(size)?;
        let block = self.lock().take(stream.raw() as usize, index)?;
        self.lend(block, size, stream).ok()
    }

    /// Lends `block` (counted as lent out) as `size` bytes ordered on `stream`.
    ///
    /// # Errors
    /// [`MemoryError::WrongDevice`] and the other refusals of `DevicePtrHandle::lend`; the
    /// block is then freed by its own rule, not cached.
    #[inline]
    fn lend(
        self: &Arc<Self>,
        block: DevicePtrHandle,
        size: usize,
        stream: &StreamHandle,
    ) -> Result<Buffer, MemoryError> {
        match DevicePtrHandle::lend(block, size, stream, Arc::clone(self)) {
            Ok(handle) => Ok(Buffer::new(
                handle,
                Some(Arc::clone(self) as Arc<dyn MemoryResource>),
                Some(self.access),
                IpcRole::None,
            )),
            Err((error, block)) => {
                {
                    let mut state = self.lock();
                    state.returned(block.size());
                    state.stats.freed_blocks += 1;
                }
                drop(block); // freed by its own rule, not cached
                Err(device_error(error))
            }
        }
    }

    /// Whether [`CachingMemoryResource::close`] was called.
    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A new block of `class_size` bytes from the upstream resource, ordered on `stream`,
    /// counted as lent out; the upstream's buffer itself when it cannot be cached (a graph
    /// allocation, or a buffer of another size than asked). On `CUDA_ERROR_OUT_OF_MEMORY` the
    /// bins are flushed and the allocation retried once.
    fn fresh_block(
        &self,
        class_size: usize,
        stream: &StreamHandle,
    ) -> Result<Result<DevicePtrHandle, Buffer>, MemoryError> {
        let buffer = match Arc::clone(&self.upstream).allocate(class_size, stream) {
            Err(error) if is_out_of_memory(&error) => {
                let blocks = {
                    let mut state = self.lock();
                    let blocks = state.drain();
                    if !blocks.is_empty() {
                        state.stats.out_of_memory_retries += 1;
                    }
                    blocks
                };
                if blocks.is_empty() {
                    return Err(error); // nothing cached: nothing to retry with
                }
                free_blocks(blocks)?;
                Arc::clone(&self.upstream).allocate(class_size, stream)?
            }
            result => result?,
        };
        // Counted once the upstream has allocated: a refused allocation is no miss.
        let block = if buffer.size() == class_size {
            buffer.into_block()
        } else {
            Err(buffer)
        };
        let block = match block {
            Ok(block) => block,
            Err(buffer) => {
                self.lock().stats.misses += 1;
                return Ok(Err(buffer));
            }
        };
        let mut state = self.lock();
        state.stats.misses += 1;
        state.stats.in_use_blocks += 1;
        state.stats.in_use_bytes += class_size;
        Ok(Ok(block))
    }

    /// Whether an allocation on `stream` may use the bins: a stream whose handle keeps it alive
    /// (created, or wrapped with an owner: [`StreamHandle::pins_its_stream`]; a block binned
    /// under a stream wrapped without one could outlive it, its free then failing, and its
    /// value could name a new stream), not being captured by a capture begun through custody.
    ///
    /// Driver calls: `cuStreamIsCapturing` only while a custody capture runs.
    #[inline]
    fn caches_on(stream: &StreamHandle) -> Result<bool, MemoryError> {
        if !stream.pins_its_stream() || Self::passes_through() {
            return Ok(false);
        }
        Ok(!handles::capture_may_be_active()
            || handles::capture_status(stream)? == CaptureStatus::None)
    }
}

impl MemoryResource for CachingMemoryResource {
    /// Allocates `size` bytes ordered on `stream`: a cached block of the size class of `size`
    /// whose last free was ordered on `stream` when there is one (no driver call), else a new
    /// block of the class's size from the upstream resource. The buffer reports `size` bytes
    /// and this resource; its free gives the block back (see [`CachingMemoryResource`]). On a
    /// default-stream token, on a stream wrapped without an owner (which the cache cannot keep
    /// alive: [`StreamHandle::pins_its_stream`]), on a stream a custody capture is capturing, or for a request whose
    /// class would exceed `isize::MAX` bytes, the upstream resource allocates `size` bytes
    /// itself and the buffer is its own.
    ///
    /// # Errors
    /// [`MemoryError::InvalidSize`]; [`MemoryError::ResourceClosed`] after
    /// [`CachingMemoryResource::close`]; [`MemoryError::WrongDevice`] for a stream of another
    /// device than the memory's; the upstream resource's errors (after one retry for
    /// `CUDA_ERROR_OUT_OF_MEMORY`), or a failed flush's before that retry. Nothing is
    /// allocated on error.
    ///
    /// Driver calls: none from a bin; otherwise the upstream resource's allocation (and on
    /// `CUDA_ERROR_OUT_OF_MEMORY` the frees of [`CachingMemoryResource::trim`]);
    /// `cuStreamIsCapturing` only while a custody capture runs.
    fn allocate(
        self: Arc<Self>,
        size: usize,
        stream: &StreamHandle,
    ) -> Result<Buffer, MemoryError> {
        check_size(size)?;
        if self.is_closed() {
            return Err(MemoryError::ResourceClosed {
                resource: "CachingMemoryResource",
            });
        }
        let class = match size_class(size) {
            Some(class) if Self::caches_on(stream)? => class,
            _ => return Arc::clone(&self.upstream).allocate(size, stream),
        };
        let (index, class_size) = class;
        let key = stream.raw() as usize;
        let cached = self.lock().take(key, index);
        let block = match cached {
            Some(block) => block,
            None => match self.fresh_block(class_size, stream)? {
                Ok(block) => block,
                Err(buffer) => return Ok(buffer),
            },
        };
        self.lend(block, size, stream)
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
    /// Bins `block` under its free's stream, or frees it (a default-stream token, or a closed
    /// cache) through its own release rule: explicitly (returning the error, possibly blocking)
    /// for an explicit release, as a drop otherwise.
    fn give_back(
        &self,
        block: DevicePtrHandle,
        returned: &Returned<'_>,
    ) -> Result<(), HandleError> {
        let (bin, explicit) = (returned.bin, returned.explicit);
        let size = block.size();
        {
            let mut state = self.lock();
            match (bin, size_class(size)) {
                (Some(stream), Some((class, class_size)))
                    if !state.closed && class_size == size =>
                {
                    state.stats.in_use_blocks -= 1;
                    state.stats.in_use_bytes -= size;
                    state.stats.cached_blocks += 1;
                    state.stats.cached_bytes += size;
                    state.bin(stream, class).push(block);
                    return Ok(());
                }
                _ => {
                    state.returned(size);
                    state.stats.freed_blocks += 1;
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

    fn name(&self) -> &str {
        "CachingMemoryResource"
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
