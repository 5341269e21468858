//! The graph-allocation family: memory allocated with `cuMemAllocAsync` on a stream being
//! captured, an allocation node of the captured graph, with no memory behind it until a launch
//! runs that node. Freed with `cuMemFreeAsync` on the recipe's stream: inside its capture that
//! free is a free node of the graph (F16: `facts_capture::f16_graph_allocation_freed_in_its_
//! capture_is_a_free_node`); after the graph ran, an ordinary stream-ordered free; a free the
//! driver refuses while the stream is captured is handed to that capture's graph (D11). What
//! a graph allocation's free may do in which capture is this family's to decide.

use std::borrow::Cow;

use cuda_sys::types::CUstream;
use cuda_sys::Driver;

use super::stream_ordered::{free_async, free_async_raw};
use super::{Family, Free, Issued, ReleaseKind};
use crate::stream::StreamHandle;

/// A graph allocation ([`DevicePtrHandle::alloc_graph`](crate::DevicePtrHandle::alloc_graph)).
pub(crate) struct GraphAllocation;

impl Family for GraphAllocation {
    fn kind(&self) -> ReleaseKind {
        ReleaseKind::Graph
    }

    fn resource(&self) -> Cow<'static, str> {
        Cow::Borrowed("graph allocation")
    }

    fn operation(&self) -> &'static str {
        "cuMemFreeAsync"
    }

    /// As a stream-ordered free: a token looks first, a created stream learns of a capture that
    /// does not own the allocation from the free's refusal.
    fn looks_first(&self, stream: &StreamHandle, _explicit: bool) -> bool {
        !stream.identifies_its_context()
    }

    fn issue(&mut self, free: &Free<'_>) -> Issued {
        free_async(self, free)
    }

    fn undo(&self, d: &'static Driver, ptr: u64, stream: CUstream) {
        let _ = free_async_raw(d, ptr, stream);
    }
}
