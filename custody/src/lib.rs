//! custody: CUDA memory whose lifetime is owned correctly.
//!
//! A CUDA buffer is freed wherever its last reference drops: on another thread, in a garbage
//! collector, or when a CUDA graph that held it is destroyed. The free needs a stream that
//! orders it after every use and a context that makes the driver call legal on that thread.
//! custody records both when the buffer is made (the *deallocation recipe*) and uses them
//! whoever frees it.
//!
//! This crate is the one to depend on: it re-exports the public API of custody's layers,
//! [`memory`] (buffers, memory resources, graphs, IPC) and [`handles`] (contexts, streams,
//! events, pools, device pointers and their recipes, cleanup reports). Start with
//! [`DeviceMemoryResource`] and [`Buffer`]; `ARCHITECTURE.md` ("Entry points") says where to
//! read next.
//!
//! The driver is loaded at first use from `CUSTODY_CUDA_DRIVER`, else `libcuda.so.1`; point the
//! variable at the emulated driver (`cargo build -p cuda-custody-emu`, then
//! `target/debug/libcuda_emu.so`) to run any custody program without a GPU.

#![forbid(unsafe_code)]

pub use handles;
pub use memory;

/// The doors through which a raw address or driver handle enters custody (`unsafe`).
pub use handles::raw;

pub use memory::{
    AdoptError, Buffer, CaptureMode, DeviceMemoryResource, DeviceMemoryResourceOptions,
    DeviceSlice, DeviceSliceMut, FillValue, Graph, GraphBuilder, GraphExec, GraphMemoryResource,
    GraphNode, IpcBufferDescriptor, LegacyPinnedMemoryResource, ManagedBuffer,
    ManagedMemoryResource, MemoryError, MemoryResource, PinnedMemoryResource,
    PinnedMemoryResourceOptions, Pod, PoolMemoryResource, SynchronousMemoryResource, Zeroable,
};

pub use handles::{
    cleanup_error_count, cleanup_warning_count, deferred_cleanup_pending, device_count,
    drain_deferred_cleanup, reset_cleanup_error_hook, reset_cleanup_warning_hook,
    set_cleanup_error_hook, set_cleanup_warning_hook, CleanupError, CleanupWarning,
    CleanupWarningKind, ContextHandle, ContextKind, CudaError, CudaErrorCode, DeallocationRecipe,
    Deallocator, DefaultStream, DevicePtrHandle, DeviceRange, EventHandle, HandleError, LoadError,
    MemoryPoolHandle, OwnedAllocation, ReleaseKind, StreamHandle, EVENT_DISABLE_TIMING,
};
