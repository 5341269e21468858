//! The driver's flag words as typed sets: one newtype per flag family (`CU_STREAM_*`,
//! `CU_EVENT_*`, `CU_CTX_*`, `CU_MEM_ATTACH_*`, `CUDA_GRAPH_INSTANTIATE_FLAG_*`).
//!
//! Each constant is named after the driver's flag without its family prefix
//! ([`StreamFlags::NON_BLOCKING`] is `CU_STREAM_NON_BLOCKING`) and has the driver's value (from
//! cudarc's bindgen output; the graph flags, which cudarc defines per CUDA version, are written
//! out and checked by a unit test), so a word passes to the driver unchanged. Bits
//! custody does not name (a newer driver's) can still be given with `from_bits_retain`; custody
//! passes every bit through as it is and the driver judges it, exactly as with a bare word.
//!
//! ```
//! use handles::{EventFlags, StreamFlags};
//!
//! assert_eq!(StreamFlags::NON_BLOCKING.bits(), 0x1);
//! assert_eq!(StreamFlags::DEFAULT, StreamFlags::empty());
//! let ipc = EventFlags::INTERPROCESS | EventFlags::DISABLE_TIMING;
//! assert_eq!(ipc.bits(), 0x6);
//! assert!(ipc.contains(EventFlags::DISABLE_TIMING));
//! ```

use cuda_sys::types::{CUctx_flags, CUevent_flags, CUmemAttach_flags, CUstream_flags};

/// Declares flag families whose empty word the driver names too: for each, the `bitflags` set
/// of the driver's enum `$driver` (every flag has the value `$driver::$value`), with `Default`
/// the empty word, and that word under the driver's name (`$empty`, from `$empty_value`).
macro_rules! driver_flags {
    ($(
        $(#[$meta:meta])*
        $name:ident($driver:ident) {
            $($(#[$flag_attr:ident $($flag_args:tt)*])* $flag:ident: $value:ident,)*
        }
        $(#[$empty_meta:meta])*
        empty $empty:ident: $empty_value:ident,
    )*) => {$(
        bitflags::bitflags! {
            $(#[$meta])*
            #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
            pub struct $name: u32 {
                $($(#[$flag_attr $($flag_args)*])* const $flag = $driver::$value as u32;)*
            }
        }

        impl $name {
            $(#[$empty_meta])*
            pub const $empty: $name = $name::from_bits_retain($driver::$empty_value as u32);
        }
    )*};
}

driver_flags! {
    /// A stream's creation flags (`CU_STREAM_*`), for [`crate::StreamHandle::create`] and
    /// returned by [`crate::StreamHandle::flags`].
    StreamFlags(CUstream_flags) {
        /// `CU_STREAM_NON_BLOCKING`: work on the stream does not synchronise with the legacy
        /// default stream (0x1).
        NON_BLOCKING: CU_STREAM_NON_BLOCKING,
    }
    /// `CU_STREAM_DEFAULT` (0): a blocking stream, which synchronises with the legacy default
    /// stream.
    empty DEFAULT: CU_STREAM_DEFAULT,

    /// An event's creation flags (`CU_EVENT_*`), for [`crate::EventHandle::create`].
    EventFlags(CUevent_flags) {
        /// `CU_EVENT_BLOCKING_SYNC`: a thread waiting on the event blocks instead of spinning
        /// (0x1).
        BLOCKING_SYNC: CU_EVENT_BLOCKING_SYNC,
        /// `CU_EVENT_DISABLE_TIMING`: the event records no timestamp; the cheapest event, for
        /// ordering only (0x2).
        DISABLE_TIMING: CU_EVENT_DISABLE_TIMING,
        /// `CU_EVENT_INTERPROCESS`: the event may be shared with another process
        /// (`cuIpcGetEventHandle`); the driver requires `DISABLE_TIMING` with it (0x4).
        INTERPROCESS: CU_EVENT_INTERPROCESS,
    }
    /// `CU_EVENT_DEFAULT` (0): a timing event that waiting threads spin on.
    empty DEFAULT: CU_EVENT_DEFAULT,

    /// A created context's flags (`CU_CTX_*`), for [`crate::ContextHandle::create`]. The
    /// scheduling policy is one of the `SCHED_*` values (they share the bits of
    /// `CU_CTX_SCHED_MASK`); the others combine freely.
    ContextFlags(CUctx_flags) {
        /// `CU_CTX_SCHED_SPIN`: a thread waiting for the device spins (0x1).
        SCHED_SPIN: CU_CTX_SCHED_SPIN,
        /// `CU_CTX_SCHED_YIELD`: a thread waiting for the device yields its CPU (0x2).
        SCHED_YIELD: CU_CTX_SCHED_YIELD,
        /// `CU_CTX_SCHED_BLOCKING_SYNC`: a thread waiting for the device blocks (0x4).
        SCHED_BLOCKING_SYNC: CU_CTX_SCHED_BLOCKING_SYNC,
        /// `CU_CTX_MAP_HOST`: pinned host memory may be mapped into the device's address
        /// space (0x8; always on in current drivers).
        MAP_HOST: CU_CTX_MAP_HOST,
        /// `CU_CTX_LMEM_RESIZE_TO_MAX`: local memory kept at its largest size after a launch
        /// resized it (0x10).
        LMEM_RESIZE_TO_MAX: CU_CTX_LMEM_RESIZE_TO_MAX,
    }
    /// `CU_CTX_SCHED_AUTO` (0): the driver picks the scheduling policy from the number of
    /// active contexts and processors.
    empty SCHED_AUTO: CU_CTX_SCHED_AUTO,
}

bitflags::bitflags! {
    /// How managed memory is attached (`CU_MEM_ATTACH_*`), for
    /// [`crate::DevicePtrHandle::alloc_managed`].
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
    pub struct MemAttachFlags: u32 {
        /// `CU_MEM_ATTACH_GLOBAL`: the memory may be accessed from any stream on any device
        /// (0x1).
        const GLOBAL = CUmemAttach_flags::CU_MEM_ATTACH_GLOBAL as u32;
        /// `CU_MEM_ATTACH_HOST`: the memory is not accessed from the device until it is
        /// attached to a stream (0x2).
        const HOST = CUmemAttach_flags::CU_MEM_ATTACH_HOST as u32;
        /// `CU_MEM_ATTACH_SINGLE`: the memory is accessed only from the stream it is attached
        /// to (0x4; `cuStreamAttachMemAsync` only, `cuMemAllocManaged` refuses it).
        const SINGLE = CUmemAttach_flags::CU_MEM_ATTACH_SINGLE as u32;
    }
}

bitflags::bitflags! {
    /// A graph's instantiation flags (`CUDA_GRAPH_INSTANTIATE_FLAG_*`), for
    /// [`crate::GraphExecHandle::instantiate`]. The driver takes them as an `unsigned long
    /// long`.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
    pub struct GraphInstantiateFlags: u64 {
        /// `CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH`: memory the graph allocated and
        /// did not free is freed when the graph is launched again (0x1).
        const AUTO_FREE_ON_LAUNCH = 0x1;
        /// `CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD`: upload the graph as part of instantiation
        /// (0x2; `cuGraphInstantiateWithParams` only).
        const UPLOAD = 0x2;
        /// `CUDA_GRAPH_INSTANTIATE_FLAG_DEVICE_LAUNCH`: the graph may be launched from the
        /// device (0x4).
        const DEVICE_LAUNCH = 0x4;
        /// `CUDA_GRAPH_INSTANTIATE_FLAG_USE_NODE_PRIORITY`: kernel nodes run at their own
        /// priority instead of the launch stream's (0x8).
        const USE_NODE_PRIORITY = 0x8;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The values are the driver's: a word passes to the driver unchanged.
    #[test]
    fn values_are_the_drivers() {
        assert_eq!(StreamFlags::DEFAULT.bits(), 0);
        assert_eq!(StreamFlags::NON_BLOCKING.bits(), 1);
        assert_eq!(EventFlags::DEFAULT.bits(), 0);
        assert_eq!(EventFlags::DISABLE_TIMING.bits(), 2);
        assert_eq!(EventFlags::INTERPROCESS.bits(), 4);
        assert_eq!(ContextFlags::SCHED_AUTO.bits(), 0);
        assert_eq!(ContextFlags::SCHED_BLOCKING_SYNC.bits(), 4);
        assert_eq!(MemAttachFlags::GLOBAL.bits(), 1);
        assert_eq!(MemAttachFlags::HOST.bits(), 2);
        assert_eq!(GraphInstantiateFlags::AUTO_FREE_ON_LAUNCH.bits(), 1);
    }

    /// Bits custody does not name are kept, not dropped: the driver judges them.
    #[test]
    fn unnamed_bits_are_kept() {
        assert_eq!(EventFlags::from_bits_retain(0x80).bits(), 0x80);
        assert_eq!(ContextFlags::from_bits_retain(0x20).bits(), 0x20);
    }
}
