//! custody: CUDA memory whose lifetime is owned correctly.
//!
//! A CUDA buffer is freed wherever its last reference drops: on another thread, in a garbage
//! collector, or when a CUDA graph that held it is destroyed. The free needs a stream that
//! orders it after every use and a context that makes the driver call legal on that thread.
//! custody records both when the buffer is made (the *deallocation recipe*) and uses them
//! whoever frees it.
//!
//! This crate is the one to depend on: it re-exports the public API of custody's layers,
//! [`memory`] (buffers, typed views, memory resources, graphs, IPC) and [`handles`] (contexts,
//! streams, events, pools, device pointers and their recipes, cleanup reports, and the
//! `unsafe` doors in [`raw`]). Start with [`DeviceMemoryResource`] and [`Buffer`];
//! `ARCHITECTURE.md` ("Entry points") says where to read next, and
//! `examples/first_program.rs` is a whole first program.
//!
//! ```
//! use std::sync::Arc;
//! use custody::{ContextHandle, DeviceMemoryResource, MemoryResource, StreamFlags, StreamHandle};
//!
//! let stream = StreamHandle::create(&ContextHandle::primary(0)?, StreamFlags::DEFAULT, 0)?;
//! let mr = DeviceMemoryResource::new(0)?;
//! let mut buffer = mr.allocate(4 * 256, &stream)?;
//! buffer.as_slice_mut::<u32>()?.copy_from_slice(&[7; 256], &stream)?;
//! assert_eq!(buffer.as_slice::<u32>()?.to_vec(&stream)?, [7; 256]);
//! buffer.close()?; // or drop it, anywhere: the recipe makes the free legal and ordered
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! The driver is loaded at first use from `CUSTODY_CUDA_DRIVER`, else `libcuda.so.1`; point the
//! variable at the emulated driver (`cargo build -p cuda-custody-emu`, then
//! `target/debug/libcuda_emu.so`) to run any custody program without a GPU. Every example in
//! these docs runs on it (`cargo xtask test`).

// `deny`, with one `allow`: wrapping a cudarc stream (`cudarc`, behind its feature) hands its raw
// `CUstream` to `handles::raw::wrap_stream`, keeping the cudarc stream alive as the owner.
#![deny(unsafe_code)]

#[cfg(feature = "cudarc")]
pub mod cudarc;

/// The handle layer: every CUDA resource custody owns, the deallocation recipe, teardown in
/// the recipe's context, cleanup reports and deferred cleanup (`handles/DESIGN.md`).
///
/// ```
/// let context = custody::handles::ContextHandle::primary(0)?;
/// assert_eq!(context.device(), 0);
/// # Ok::<(), custody::HandleError>(())
/// ```
pub use handles;

/// The memory layer: buffers, typed views, memory resources, graphs that retain buffers, IPC.
///
/// ```
/// let mr = custody::memory::DeviceMemoryResource::new(0)?;
/// assert_eq!(custody::memory::MemoryResource::device_id(&*mr), Some(0));
/// # Ok::<(), custody::MemoryError>(())
/// ```
pub use memory;

/// The doors through which a raw address or a raw driver handle enters custody: every function
/// is `unsafe`, the caller vouching for what the value names.
///
/// ```
/// let mut host = vec![0u8; 8];
/// // SAFETY: `host` outlives the view; nothing touches it until the view is gone.
/// let view = unsafe { custody::raw::borrowed(host.as_mut_ptr() as u64, host.len()) };
/// let stream = custody::StreamHandle::create(&custody::ContextHandle::primary(0)?, custody::StreamFlags::DEFAULT, 0)?;
/// view.as_range().copy_from_host(&[3; 8], &stream)?;
/// drop(view);
/// assert_eq!(host, [3; 8]);
/// # Ok::<(), custody::HandleError>(())
/// ```
pub use handles::raw;

/// Allocating and freeing: a device's stream-ordered pool resource and the trait every
/// resource implements; [`Buffer`] is what they hand out.
///
/// ```
/// use std::sync::Arc;
/// use custody::{ContextHandle, DeviceMemoryResource, DeviceMemoryResourceOptions, MemoryResource, StreamFlags, StreamHandle};
///
/// let stream = StreamHandle::create(&ContextHandle::primary(0)?, StreamFlags::DEFAULT, 0)?;
/// let own_pool = DeviceMemoryResource::with_options(0, DeviceMemoryResourceOptions::default())?;
/// let buffer = own_pool.allocate(1 << 20, &stream)?;
/// assert_eq!(buffer.size(), 1 << 20);
/// assert!(buffer.deallocation_stream().is_some_and(|s| s.ptr_eq(&stream)));
/// drop(buffer); // freed on `stream`, without waiting for the GPU
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub use memory::{Buffer, DeviceMemoryResource, DeviceMemoryResourceOptions, MemoryResource};

/// Typed views of a buffer, over element ranges: shared ([`DeviceSlice`]) for copies out,
/// exclusive ([`DeviceSliceMut`]) for copies in and fills. The exclusivity is that of a borrow
/// of one [`Buffer`] value, not of its memory: another buffer over the same allocation can write
/// it meanwhile (memory-safe; stream order orders the writes; see [`DeviceSliceMut`]). Elements
/// are plain bytes ([`Pod`], [`Zeroable`], from `bytemuck`).
///
/// ```
/// use std::sync::Arc;
/// use custody::{ContextHandle, DeviceMemoryResource, DeviceSlice, DeviceSliceMut, MemoryResource, Pod, StreamFlags, StreamHandle};
///
/// fn halves<'a, T: Pod>(
///     view: &DeviceSlice<'a, T>,
/// ) -> Result<(DeviceSlice<'a, T>, DeviceSlice<'a, T>), custody::MemoryError> {
///     Ok((view.slice(..view.len() / 2)?, view.slice(view.len() / 2..)?))
/// }
/// let stream = StreamHandle::create(&ContextHandle::primary(0)?, StreamFlags::DEFAULT, 0)?;
/// let mut buffer = Arc::clone(&DeviceMemoryResource::new(0)?).allocate(8 * 4, &stream)?;
/// let mut all: DeviceSliceMut<'_, u64> = buffer.as_slice_mut()?;
/// all.copy_from_slice(&[1, 2, 3, 4], &stream)?;
/// let view = buffer.as_slice::<u64>()?;
/// let (low, high) = halves(&view)?;
/// assert_eq!((low.to_vec(&stream)?, high.to_vec(&stream)?), (vec![1, 2], vec![3, 4]));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub use memory::{DeviceSlice, DeviceSliceMut, Pod, Zeroable};

/// Fill patterns of 8, 16 or 32 bits.
///
/// ```
/// use std::sync::Arc;
/// use custody::{ContextHandle, DeviceMemoryResource, FillValue, MemoryResource, StreamFlags, StreamHandle};
///
/// let stream = StreamHandle::create(&ContextHandle::primary(0)?, StreamFlags::DEFAULT, 0)?;
/// let buffer = Arc::clone(&DeviceMemoryResource::new(0)?).allocate(8, &stream)?;
/// buffer.fill(FillValue::U16(0x0102), &stream)?;
/// let mut bytes = [0u8; 8];
/// buffer.copy_to_host(&mut bytes, &stream)?;
/// assert_eq!(bytes, 0x0102u16.to_ne_bytes().repeat(4).as_slice());
/// assert_eq!(FillValue::from_bytes(&[1, 2, 3, 4])?.width(), 4);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub use memory::FillValue;

/// Managed memory (`cuMemAllocManaged`): reachable from the host and every device.
///
/// ```
/// use custody::{ContextHandle, ManagedBuffer, ManagedMemoryResource, StreamFlags, StreamHandle};
///
/// let stream = StreamHandle::create(&ContextHandle::primary(0)?, StreamFlags::DEFAULT, 0)?;
/// let managed: ManagedBuffer = ManagedMemoryResource::new().allocate_managed(64, &stream)?;
/// assert_eq!(managed.as_buffer().is_managed(), Ok(true));
/// managed.close()?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub use memory::{ManagedBuffer, ManagedMemoryResource};

/// Pinned host memory: from a host-located pool, or from `cuMemAllocHost`.
///
/// ```
/// use std::sync::Arc;
/// use custody::{
///     ContextHandle, LegacyPinnedMemoryResource, MemoryResource, PinnedMemoryResource,
///     PinnedMemoryResourceOptions, StreamFlags, StreamHandle,
/// };
///
/// let stream = StreamHandle::create(&ContextHandle::primary(0)?, StreamFlags::DEFAULT, 0)?;
/// let pool = PinnedMemoryResource::new(PinnedMemoryResourceOptions::default())?;
/// let pinned = pool.allocate(256, &stream)?;
/// let legacy = LegacyPinnedMemoryResource::new().allocate(256, &stream)?;
/// assert_eq!(pinned.is_host_accessible(), Ok(true));
/// assert_eq!(legacy.device_id(), Ok(None));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub use memory::{LegacyPinnedMemoryResource, PinnedMemoryResource, PinnedMemoryResourceOptions};

/// Device memory from the synchronous `cuMemAlloc`, in the device's primary context; its
/// drops never wait for the GPU (an event and the cleanup worker do).
///
/// ```
/// use custody::{MemoryResource, StreamHandle, SynchronousMemoryResource};
///
/// let mr = SynchronousMemoryResource::new(0)?;
/// // No context current: a default-stream token is replaced by the resource's bound one.
/// let buffer = mr.allocate(4096, &StreamHandle::legacy())?;
/// assert!(buffer.deallocation_stream().is_some_and(|s| s.context().is_some()));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub use memory::SynchronousMemoryResource;

/// An opt-in cache over another memory resource: a buffer's memory goes back to a bin of the
/// stream its free is ordered on, and the next allocation of its size class on that stream takes
/// it again without a driver call; `trim` and `close` free what is cached through the upstream.
///
/// ```
/// use std::sync::Arc;
/// use custody::{
///     CachingMemoryResource, ContextHandle, DeviceMemoryResource, MemoryResource, StreamFlags,
///     StreamHandle,
/// };
///
/// let stream = StreamHandle::create(&ContextHandle::primary(0)?, StreamFlags::NON_BLOCKING, 0)?;
/// let mr = CachingMemoryResource::new(DeviceMemoryResource::new(0)?);
/// let first = mr.allocate(1000, &stream)?;
/// let ptr = first.ptr();
/// first.close()?; // cached: no cuMemFreeAsync
/// let again = mr.allocate(900, &stream)?; // the same 1024-byte block
/// assert_eq!((again.ptr(), again.size()), (ptr, 900));
/// assert_eq!((mr.stats().hits, mr.stats().misses), (1, 1));
/// again.close()?;
/// mr.trim()?; // cuMemFreeAsync on `stream`
/// assert_eq!(mr.stats().cached_bytes, 0);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub use memory::{CachingMemoryResource, CachingStats, Trimmed};

/// Graphs recorded by stream capture: graph allocations belong to the graph; fills and copies
/// through the builder make the graph retain the buffers they touch.
///
/// ```
/// use std::sync::Arc;
/// use custody::{CaptureMode, ContextHandle, DeviceMemoryResource, GraphBuilder, GraphMemoryResource, MemoryResource, StreamFlags, StreamHandle};
///
/// let stream = StreamHandle::create(&ContextHandle::primary(0)?, StreamFlags::NON_BLOCKING, 0)?;
/// let kept = Arc::clone(&DeviceMemoryResource::new(0)?).allocate(64, &stream)?;
/// let builder = GraphBuilder::new(&stream)?;
/// builder.begin_building(CaptureMode::ThreadLocal)?;
/// let scratch = builder.allocate(64)?; // a graph allocation, from a GraphMemoryResource
/// builder.fill(&scratch, 9u8)?;
/// builder.copy(&kept, &scratch)?; // `kept` is retained by the graph
/// drop(scratch); // freed inside the capture
/// let graph = builder.end_building()?;
/// graph.launch(&stream)?;
/// let mut bytes = [0u8; 64];
/// kept.copy_to_host(&mut bytes, &stream)?;
/// assert_eq!(bytes, [9; 64]);
/// assert!(GraphMemoryResource::new(99).is_err(), "no device 99");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub use memory::{CaptureMode, GraphBuilder, GraphMemoryResource};

/// Graphs built node by node; every node that touches a buffer keeps its memory alive until
/// the graph, its clones, executables and launches are gone.
///
/// ```
/// use std::sync::Arc;
/// use custody::{ContextHandle, DeviceMemoryResource, Graph, GraphExec, GraphNode, MemoryResource, StreamFlags, StreamHandle};
///
/// let stream = StreamHandle::create(&ContextHandle::primary(0)?, StreamFlags::DEFAULT, 0)?;
/// let mr = DeviceMemoryResource::new(0)?;
/// let (a, b) = (mr.allocate(16, &stream)?, mr.allocate(16, &stream)?);
/// let graph = Graph::new(0)?;
/// let set: GraphNode = graph.add_memset(&[], &a, 5u8)?;
/// graph.add_memcpy(&[set], &b, &a)?;
/// a.close()?; // the graph keeps it
/// let exec: GraphExec = graph.instantiate()?;
/// exec.launch(&stream)?;
/// let mut bytes = [0u8; 16];
/// b.copy_to_host(&mut bytes, &stream)?;
/// assert_eq!(bytes, [5; 16]);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub use memory::{Graph, GraphExec, GraphNode};

/// IPC: pools made shareable with other processes, and the bytes that let another process
/// import one buffer.
///
/// ```
/// use std::sync::Arc;
/// use custody::{ContextHandle, DeviceMemoryResource, DeviceMemoryResourceOptions, IpcBufferDescriptor, MemoryResource, PoolMemoryResource, StreamFlags, StreamHandle};
///
/// let stream = StreamHandle::create(&ContextHandle::primary(0)?, StreamFlags::DEFAULT, 0)?;
/// let options = DeviceMemoryResourceOptions { ipc_enabled: true, ..Default::default() };
/// let mr = DeviceMemoryResource::with_options(0, options)?;
/// assert!(mr.is_ipc_enabled());
/// let buffer = mr.allocate(4096, &stream)?;
/// let descriptor = buffer.ipc_descriptor()?;
/// let bytes = descriptor.to_bytes(); // send these, and the pool (`export_pool`), over a socket
/// assert_eq!(IpcBufferDescriptor::from_bytes(&bytes)?, descriptor);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub use memory::{IpcBufferDescriptor, PoolMemoryResource};

/// Errors: the memory layer's, the handle layer's it wraps, a driver call's, a failed load.
///
/// ```
/// use custody::{ContextHandle, CudaError, CudaErrorCode, DeviceMemoryResource, HandleError, LoadError, MemoryError, MemoryResource, StreamFlags, StreamHandle};
///
/// let stream = StreamHandle::create(&ContextHandle::primary(0)?, StreamFlags::DEFAULT, 0)?;
/// let mr = DeviceMemoryResource::new(0)?;
/// let error = mr.allocate(usize::MAX, &stream).unwrap_err();
/// assert!(matches!(error, MemoryError::InvalidSize { size: usize::MAX, .. }));
/// assert_eq!(error.code(), None); // found before any driver call
/// // No context current: an unbound default-stream token cannot be resolved.
/// let error = mr.allocate(16, &StreamHandle::legacy()).unwrap_err();
/// assert_eq!(error, MemoryError::Handle(HandleError::NoCurrentContext));
/// assert_eq!(CudaErrorCode::INVALID_VALUE.name(), "CUDA_ERROR_INVALID_VALUE");
/// fn _is_error(_: &dyn std::error::Error) {}
/// # let _ = |e: CudaError, l: LoadError| { _is_error(&e); _is_error(&l); };
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub use handles::{CudaError, CudaErrorCode, HandleError, LoadError};
/// The memory layer's error: what a buffer or resource operation refused, or the handle
/// layer's error it wraps.
///
/// ```
/// use custody::{ContextHandle, DeviceMemoryResource, MemoryError, MemoryResource, StreamFlags, StreamHandle};
///
/// let stream = StreamHandle::create(&ContextHandle::primary(0)?, StreamFlags::DEFAULT, 0)?;
/// let mr = DeviceMemoryResource::new(0)?;
/// let refused = mr.allocate(usize::MAX, &stream);
/// assert!(matches!(refused, Err(MemoryError::InvalidSize { size: usize::MAX, .. })));
/// // Zero bytes: an empty buffer, with no memory and no driver call (as in Python).
/// let empty = mr.allocate(0, &stream)?;
/// assert_eq!((empty.size(), empty.ptr()), (0, 0));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[doc(inline)]
pub use memory::MemoryError;

/// Adopting memory allocated elsewhere: the right to free it ([`OwnedAllocation`], made by an
/// `unsafe` promise) goes to a buffer whose resource frees it; a refused adoption gives it
/// back ([`AdoptError`]).
///
/// ```
/// use std::sync::Arc;
/// use custody::{raw, AdoptError, Buffer, ContextHandle, DeviceMemoryResource, MemoryResource, OwnedAllocation, PoolMemoryResource, StreamFlags, StreamHandle};
///
/// let stream = StreamHandle::create(&ContextHandle::primary(0)?, StreamFlags::DEFAULT, 0)?;
/// let mr = DeviceMemoryResource::new(0)?;
/// // Memory "allocated elsewhere": here a pool allocation whose handle gives it up.
/// let elsewhere = custody::DevicePtrHandle::alloc_from_pool(256, mr.pool(), &stream)?;
/// let (ptr, size) = (elsewhere.ptr(), elsewhere.size());
/// std::mem::forget(elsewhere);
/// // SAFETY: `ptr` is a pool allocation of `size` bytes that nothing else frees.
/// let allocation: OwnedAllocation = unsafe { raw::owned_allocation(ptr, size) };
/// let buffer = Buffer::adopt(allocation, mr.clone(), Some(&stream)).map_err(|e: AdoptError| e.error)?;
/// buffer.close()?; // `mr.deallocate` frees it, on `stream`
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub use handles::OwnedAllocation;
/// A refused adoption: why, and the allocation, given back untouched.
///
/// ```
/// use custody::{raw, AdoptError, Buffer, ContextHandle, DeviceMemoryResource, DevicePtrHandle, PoolMemoryResource, StreamFlags, StreamHandle};
///
/// let stream = StreamHandle::create(&ContextHandle::primary(0)?, StreamFlags::DEFAULT, 0)?;
/// let mr = DeviceMemoryResource::new(0)?;
/// let elsewhere = DevicePtrHandle::alloc_from_pool(256, mr.pool(), &stream)?;
/// let (ptr, size) = (elsewhere.ptr(), elsewhere.size());
/// std::mem::forget(elsewhere);
/// // SAFETY: a pool allocation of `size` bytes that nothing else frees.
/// let allocation = unsafe { raw::owned_allocation(ptr, size) };
/// // No context is current, so the legacy default-stream token cannot be recorded.
/// let refused: AdoptError = Buffer::adopt(allocation, mr.clone(), Some(&StreamHandle::legacy())).unwrap_err();
/// let buffer = Buffer::adopt(refused.allocation, mr.clone(), Some(&stream)).map_err(|e| e.error)?;
/// assert_eq!(buffer.size(), 256);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[doc(inline)]
pub use memory::AdoptError;

/// Contexts: a device's primary context (retained), or one custody created (with
/// [`ContextFlags`], `CU_CTX_*`).
///
/// ```
/// use custody::{ContextFlags, ContextHandle, ContextKind};
///
/// let primary = ContextHandle::primary(0)?;
/// assert_eq!(primary.kind(), ContextKind::Primary);
/// let created = ContextHandle::create(0, ContextFlags::SCHED_AUTO)?;
/// assert_eq!(created.kind(), ContextKind::Created);
/// assert!(ContextHandle::current()?.is_none()); // custody never leaves one current
/// primary.make_current()?;
/// assert_eq!(ContextHandle::current()?, Some(primary));
/// ContextHandle::clear_current()?;
/// # Ok::<(), custody::HandleError>(())
/// ```
pub use handles::{ContextFlags, ContextHandle, ContextKind};

/// Streams and events: created streams carry their context; default-stream tokens are bound
/// to the context current when a recipe records them. Creation flags are typed sets named
/// after the driver's (`CU_STREAM_NON_BLOCKING` is [`StreamFlags::NON_BLOCKING`],
/// `CU_EVENT_DISABLE_TIMING` is [`EventFlags::DISABLE_TIMING`]).
///
/// ```
/// use custody::{ContextHandle, DefaultStream, EventFlags, EventHandle, StreamFlags, StreamHandle};
///
/// let context = ContextHandle::primary(0)?;
/// let producer = StreamHandle::create(&context, StreamFlags::DEFAULT, 0)?;
/// let consumer = StreamHandle::create(&context, StreamFlags::NON_BLOCKING, 0)?;
/// assert_eq!(consumer.flags()?, StreamFlags::NON_BLOCKING);
/// let done = EventHandle::create(&context, EventFlags::DISABLE_TIMING)?;
/// done.record(&producer)?;
/// consumer.wait_event(&done)?; // the consumer's later work runs after the producer's
/// consumer.synchronize()?;
/// assert_eq!(StreamHandle::legacy().default_kind(), Some(DefaultStream::Legacy));
/// assert!(producer.context().is_some_and(|c| c.ptr_eq(&context)));
/// # Ok::<(), custody::HandleError>(())
/// ```
pub use handles::{DefaultStream, EventFlags, EventHandle, StreamFlags, StreamHandle};

/// Memory pools: a device's current pool (borrowed) or one a resource owns, and their
/// attributes, typed by the width of their value (a byte count is a `u64`, a reuse flag a
/// `bool`).
///
/// ```
/// use custody::{MemoryPoolHandle, PoolAttribute};
///
/// let pool = MemoryPoolHandle::device_current(0)?;
/// assert!(!pool.is_owned());
/// assert_eq!(pool.device(), Some(0));
/// let _used: u64 = pool.attribute(PoolAttribute::USED_MEM_CURRENT)?;
/// # Ok::<(), custody::HandleError>(())
/// ```
pub use handles::{MemoryPoolHandle, PoolAttribute, PoolAttributeValue};

/// A buffer's memory as the handle layer holds it: its release rule, its recipe, and the
/// checked byte ranges that copies and fills take; managed memory is attached as
/// [`MemAttachFlags`] say (`CU_MEM_ATTACH_*`).
///
/// ```
/// use std::sync::Arc;
/// use custody::{ContextHandle, DeallocationRecipe, DeviceMemoryResource, DevicePtrHandle, DeviceRange, MemAttachFlags, MemoryResource, ReleaseKind, StreamFlags, StreamHandle};
///
/// let stream = StreamHandle::create(&ContextHandle::primary(0)?, StreamFlags::DEFAULT, 0)?;
/// let buffer = Arc::clone(&DeviceMemoryResource::new(0)?).allocate(64, &stream)?;
/// let handle: &DevicePtrHandle = buffer.handle();
/// assert_eq!(handle.kind(), ReleaseKind::Pool);
/// let recipe: DeallocationRecipe = handle.recipe().expect("pool memory has a recipe");
/// assert!(recipe.stream().ptr_eq(&stream));
/// let tail: DeviceRange<'_> = handle.range(32, 32)?;
/// tail.fill_u8(1, &stream)?;
/// assert!(handle.range(32, 33).is_err()); // out of bounds, refused before any driver call
/// let managed = DevicePtrHandle::alloc_managed(64, MemAttachFlags::GLOBAL, &stream)?;
/// assert_eq!(managed.kind(), ReleaseKind::Managed);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub use handles::{DeallocationRecipe, DevicePtrHandle, DeviceRange, MemAttachFlags, ReleaseKind};

/// How adopted memory is freed at teardown, for callers of the handle layer: a
/// [`Deallocator`] receives the [`OwnedAllocation`] and the recipe's stream, with the
/// recipe's context current.
///
/// ```
/// use std::sync::Arc;
/// use custody::{raw, ContextHandle, Deallocator, DevicePtrHandle, HandleError, MemoryPoolHandle, OwnedAllocation, StreamFlags, StreamHandle};
///
/// struct FreeAsync;
/// impl Deallocator for FreeAsync {
///     fn deallocate(&self, allocation: OwnedAllocation, stream: &StreamHandle) -> Result<(), HandleError> {
///         allocation.free_async(stream)
///     }
/// }
/// let stream = StreamHandle::create(&ContextHandle::primary(0)?, StreamFlags::DEFAULT, 0)?;
/// let elsewhere = DevicePtrHandle::alloc_from_pool(128, &MemoryPoolHandle::device_current(0)?, &stream)?;
/// let (ptr, size) = (elsewhere.ptr(), elsewhere.size());
/// std::mem::forget(elsewhere);
/// // SAFETY: a pool allocation of `size` bytes that nothing else frees.
/// let allocation = unsafe { raw::owned_allocation(ptr, size) };
/// let adopted = DevicePtrHandle::adopt(allocation, &stream, Arc::new(FreeAsync)).map_err(|e| e.error)?;
/// adopted.release()?; // FreeAsync frees it, on `stream`
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub use handles::Deallocator;

/// A [`Deallocator`] (or a [`MemoryResource`]'s `deallocate`) that panicked: the source of the
/// [`HandleError::Deallocator`] its call became, saying whether the memory was freed first.
pub use handles::DeallocatorPanic;

/// Where frees that no caller can receive report: a process-wide hook for errors and one for
/// warnings (default: a line on stderr each), and counters.
///
/// ```
/// use std::sync::{atomic::{AtomicU64, Ordering}, Arc};
/// use custody::{
///     cleanup_error_count, cleanup_warning_count, reset_cleanup_error_hook, reset_cleanup_warning_hook,
///     set_cleanup_error_hook, set_cleanup_warning_hook, CleanupError, CleanupWarning, CleanupWarningKind,
///     ContextHandle, DeviceMemoryResource, MemoryResource, StreamHandle,
/// };
///
/// static WAITED: AtomicU64 = AtomicU64::new(0);
/// set_cleanup_error_hook(Box::new(|error: &CleanupError| eprintln!("cleanup failed: {error}")));
/// set_cleanup_warning_hook(Box::new(|warning: &CleanupWarning| {
///     if matches!(warning.kind, CleanupWarningKind::PerThreadStreamFreeWaitsForCapture { .. }) {
///         WAITED.fetch_add(1, Ordering::Relaxed);
///     }
/// }));
/// let (errors, warnings) = (cleanup_error_count(), cleanup_warning_count());
/// // A buffer on the per-thread default stream, dropped on another thread: freed on the legacy
/// // stream of its context, after this thread's per-thread work; nothing to report.
/// let context = ContextHandle::primary(0)?;
/// context.make_current()?;
/// let buffer = Arc::clone(&DeviceMemoryResource::new(0)?).allocate(64, &StreamHandle::per_thread())?;
/// std::thread::spawn(move || drop(buffer)).join().unwrap();
/// assert_eq!(WAITED.load(Ordering::Relaxed), 0);
/// assert_eq!(cleanup_warning_count(), warnings);
/// assert_eq!(cleanup_error_count(), errors);
/// StreamHandle::legacy().synchronize()?;
/// ContextHandle::clear_current()?;
/// reset_cleanup_error_hook();
/// reset_cleanup_warning_hook();
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub use handles::{
    cleanup_error_count, cleanup_warning_count, reset_cleanup_error_hook,
    reset_cleanup_warning_hook, set_cleanup_error_hook, set_cleanup_warning_hook, CleanupError,
    CleanupWarning, CleanupWarningKind,
};

/// Deferred cleanup: what graphs let go of is freed by custody's cleanup worker; draining runs
/// what is queued on the calling thread (tests, shutdown).
///
/// ```
/// use std::sync::Arc;
/// use custody::{deferred_cleanup_pending, drain_deferred_cleanup, ContextHandle, DeviceMemoryResource, Graph, MemoryResource, StreamFlags, StreamHandle};
///
/// let stream = StreamHandle::create(&ContextHandle::primary(0)?, StreamFlags::DEFAULT, 0)?;
/// let buffer = Arc::clone(&DeviceMemoryResource::new(0)?).allocate(64, &stream)?;
/// let graph = Graph::new(0)?;
/// graph.add_memset(&[], &buffer, 1u8)?;
/// buffer.close()?;
/// graph.close(); // the graph's hold on the buffer goes to the cleanup queue
/// drain_deferred_cleanup();
/// assert_eq!(deferred_cleanup_pending(), 0);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub use handles::{deferred_cleanup_pending, drain_deferred_cleanup};

/// The number of devices the driver sees.
///
/// ```
/// assert!(custody::device_count()? >= 1);
/// # Ok::<(), custody::HandleError>(())
/// ```
pub use handles::device_count;
