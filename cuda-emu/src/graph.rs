//! Graphs, graph execs, stream capture and user objects: their types, and how a launch runs its
//! steps. The state's operations on them (adding nodes, instantiation, launch, capture, user
//! object references) are in `state/graph.rs`.
//!
//! A graph is a list of nodes in creation order, which is a topological order as long as edges
//! come only with a node (its dependencies must exist when it is added); `cuGraphAddDependencies`
//! can add an edge to an older node, so instantiation orders the nodes by their dependencies
//! (creation order among nodes free to go). A launch is one stream operation that runs the
//! nodes in that order on the stream's worker thread. Hazard bookkeeping for the nodes' memory
//! happens when the launch is enqueued, like any other operation.
//!
//! User objects are counted references with a destructor. Graphs, graph clones and graph execs
//! hold references. When the last reference goes the destructor runs: on the calling thread,
//! inside the driver call that dropped it, when no launch is pending (G2), or on the stream's
//! worker thread after the last pending launch of a destroyed exec completes (G3).

use crate::clock::VectorClock;
use std::collections::{BTreeMap, HashMap};
use std::ffi::c_void;
use std::sync::{Arc, Mutex};

use crate::codes::{self, Res};
use crate::memory::{copy_bytes, fill, Backing, Mem, PoolCore};
use crate::thread::run_callback;

/// `CU_STREAM_CAPTURE_MODE_*`.
pub(crate) const MODE_GLOBAL: u32 = 0;
pub(crate) const MODE_THREAD_LOCAL: u32 = 1;
pub(crate) const MODE_RELAXED: u32 = 2;

thread_local! {
    /// This thread's capture interaction mode (`cuThreadExchangeStreamCaptureMode`): which
    /// captures make "potentially unsafe" calls on this thread illegal. Global by default.
    static THREAD_MODE: std::cell::Cell<u32> = const { std::cell::Cell::new(MODE_GLOBAL) };
}

/// This thread's capture interaction mode.
pub(crate) fn thread_mode() -> u32 {
    THREAD_MODE
        .try_with(std::cell::Cell::get)
        .unwrap_or(MODE_GLOBAL)
}

/// Sets this thread's capture interaction mode and returns the previous one.
pub(crate) fn exchange_thread_mode(mode: u32) -> u32 {
    THREAD_MODE
        .try_with(|m| m.replace(mode))
        .unwrap_or(MODE_GLOBAL)
}
/// `CU_MEMORYTYPE_*`.
pub(crate) const MEMTYPE_HOST: u32 = 1;
pub(crate) const MEMTYPE_DEVICE: u32 = 2;
pub(crate) const MEMTYPE_UNIFIED: u32 = 4;

/// A destructor-carrying callback: a C function and its argument.
#[derive(Clone, Copy)]
pub(crate) struct Callback {
    pub(crate) func: unsafe extern "C" fn(*mut c_void),
    pub(crate) data: usize,
}

impl Callback {
    /// Runs the callback with driver calls forbidden on this thread.
    pub(crate) fn run(self) {
        run_callback(|| {
            // SAFETY: the program registered this function and argument with the driver, which
            // promises to call it exactly like this.
            unsafe { (self.func)(self.data as *mut c_void) }
        });
    }
}

/// Runs destructors; the caller holds no emulator lock.
pub(crate) fn run_destructors(destructors: Vec<Callback>) {
    for d in destructors {
        d.run();
    }
}

pub(crate) struct UserObject {
    pub(crate) destructor: Callback,
    pub(crate) refs: u64,
}

/// One side of a copy node (`CUDA_MEMCPY3D`'s src* or dst* fields).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Operand {
    pub(crate) memtype: u32,
    pub(crate) ptr: u64,
    pub(crate) x: u64,
    pub(crate) y: u64,
    pub(crate) z: u64,
    pub(crate) pitch: u64,
    pub(crate) height: u64,
    /// The identity of the live allocation the operand was in when the node was made (`None`
    /// for memory a graph allocates and for host memory the driver does not know).
    pub(crate) alloc: Option<u64>,
}

impl Operand {
    /// Byte offset of row `y`, slice `z` of the copy.
    fn row(&self, y: u64, z: u64) -> u64 {
        self.x + (self.y + y) * self.pitch + (self.z + z) * self.pitch * self.height
    }
}

#[derive(Clone, Copy, Debug)]
pub(crate) struct Copy3D {
    pub(crate) src: Operand,
    pub(crate) dst: Operand,
    pub(crate) width: u64,
    pub(crate) height: u64,
    pub(crate) depth: u64,
}

impl Copy3D {
    /// Checks the shape; returns (first byte offset, extent) of an operand.
    pub(crate) fn extent(&self, o: &Operand) -> Res<(u64, u64)> {
        let (h, d) = (self.height.max(1), self.depth.max(1));
        if (h > 1 || d > 1) && o.pitch < self.width {
            return Err(codes::INVALID_VALUE);
        }
        if d > 1 && o.height < h {
            return Err(codes::INVALID_VALUE);
        }
        let first = o.row(0, 0);
        let last = o.row(h - 1, d - 1) + self.width;
        Ok((first, last - first))
    }

    /// Whether `o` is host-accessible memory.
    pub(crate) fn host_ok(o: &Operand) -> bool {
        o.memtype == MEMTYPE_HOST || o.memtype == MEMTYPE_UNIFIED
    }
}

#[derive(Clone, Copy, Debug)]
pub(crate) struct Memset {
    /// As [`Operand::alloc`], for `dst`.
    pub(crate) alloc: Option<u64>,
    pub(crate) dst: u64,
    pub(crate) value: u32,
    pub(crate) elem: u32,
    pub(crate) width: u64,
    pub(crate) height: u64,
    pub(crate) pitch: u64,
}

impl Memset {
    pub(crate) fn extent(&self) -> Res<u64> {
        if !matches!(self.elem, 1 | 2 | 4) || self.width == 0 || self.height == 0 {
            return Err(codes::INVALID_VALUE);
        }
        let row = self.width * u64::from(self.elem);
        if self.height > 1 && self.pitch < row {
            return Err(codes::INVALID_VALUE);
        }
        Ok((self.height - 1) * self.pitch + row)
    }
}

#[derive(Clone, Copy)]
pub(crate) enum NodeKind {
    Empty,
    Host(Callback),
    Memset(Memset),
    Memcpy(Copy3D),
    MemAlloc {
        addr: u64,
        size: u64,
        device: i32,
    },
    MemFree {
        addr: u64,
    },
    /// Records an event: in the emulator, when the whole launch has run (a launch is one stream
    /// operation), which orders everything waiting for it at least as late as the node would.
    EventRecord {
        event: u64,
    },
    /// Waits for an event's last record as of the launch.
    EventWait {
        event: u64,
    },
    /// A conditional node (`CU_GRAPH_NODE_TYPE_CONDITIONAL`): `ctype` is the
    /// `CUgraphConditionalNodeType`, `cond` the conditional handle, `value` the handle's default
    /// launch value (the value every launch sees: kernels, which alone can set it, are not
    /// emulated), `bodies` the key of its body graphs in `State::cond_bodies`. Instantiation
    /// puts the chosen body's nodes in its place.
    Conditional {
        cond: u64,
        ctype: u32,
        value: u32,
        bodies: u64,
    },
}

/// `CUgraphConditionalNodeType`.
pub(crate) const COND_IF: u32 = 0;
pub(crate) const COND_WHILE: u32 = 1;
pub(crate) const COND_SWITCH: u32 = 2;

/// A conditional handle (`cuGraphConditionalHandleCreate`): the graph it was made for and its
/// default launch value.
pub(crate) struct Condition {
    pub(crate) graph: u64,
    pub(crate) default: u32,
}

impl NodeKind {
    /// `CUgraphNodeType` of the node.
    pub(crate) fn type_code(&self) -> u32 {
        match self {
            NodeKind::Memcpy(_) => 1,
            NodeKind::Memset(_) => 2,
            NodeKind::Host(_) => 3,
            NodeKind::Empty => 5,
            NodeKind::EventWait { .. } => 6,
            NodeKind::EventRecord { .. } => 7,
            NodeKind::MemAlloc { .. } => 10,
            NodeKind::MemFree { .. } => 11,
            NodeKind::Conditional { .. } => 13,
        }
    }
}

#[derive(Clone)]
pub(crate) struct Node {
    pub(crate) handle: u64,
    pub(crate) kind: NodeKind,
    pub(crate) deps: Vec<usize>,
}

#[derive(Default)]
pub(crate) struct Graph {
    pub(crate) nodes: Vec<Node>,
    /// User object -> references this graph holds.
    pub(crate) user_objects: BTreeMap<u64, u64>,
}

/// An exec's life: its launches still pending, whether it was destroyed, and the user-object
/// references it holds (released when it is destroyed and nothing is pending, G3).
pub(crate) struct ExecLife {
    pub(crate) pending: usize,
    pub(crate) destroyed: bool,
    pub(crate) refs: Vec<(u64, u64)>,
    /// The clocks of the launches that have run to completion, merged: what the host has learnt
    /// once a user-object destructor runs because they are done (a destructor runs after the
    /// work that held its object, G2/G3, so whatever it sets in motion is ordered after it).
    pub(crate) done: VectorClock,
}

pub(crate) struct GraphExec {
    pub(crate) nodes: Vec<NodeKind>,
    /// A WHILE node whose condition is non-zero: on a GPU the loop runs until a kernel clears
    /// the condition; no kernel runs here, so a launch is refused (`CUDA_ERROR_NOT_SUPPORTED`).
    pub(crate) endless: bool,
    pub(crate) auto_free: bool,
    pub(crate) life: Arc<Mutex<ExecLife>>,
    /// The graph it was made from, when that graph holds memory allocation or free nodes: such a
    /// graph has one executable at a time (docs/driver-facts.md G5).
    pub(crate) memory_graph: Option<u64>,
}

/// One stream capture.
pub(crate) struct Capture {
    pub(crate) origin: u64,
    pub(crate) mode: u32,
    pub(crate) thread: u64,
    pub(crate) graph: u64,
    /// Whether the capture made its graph (`cuStreamBeginCapture`), and so destroys it when
    /// the capture fails; a graph captured into (`cuStreamBeginCaptureToGraph`) is the caller's.
    pub(crate) owns_graph: bool,
    pub(crate) invalidated: bool,
    /// Stream -> the nodes its next captured operation depends on.
    pub(crate) ends: HashMap<u64, Vec<usize>>,
    /// Stream -> the node handles last returned by `cuStreamGetCaptureInfo`.
    pub(crate) info_buffers: HashMap<u64, Vec<u64>>,
}

/// What a launch does on the stream, resolved when it is enqueued.
pub(crate) enum Step {
    Host(Callback),
    Fill {
        dst: Mem,
        m: Memset,
    },
    Copy {
        dst: Mem,
        src: Mem,
        c: Copy3D,
        dst_first: u64,
        src_first: u64,
    },
    Release {
        backing: Arc<Backing>,
        core: Option<Arc<PoolCore>>,
        size: u64,
    },
}

impl Step {
    /// Runs this step on the launch's stream.
    pub(crate) fn run(self) {
        match self {
            Step::Host(cb) => cb.run(),
            Step::Fill { dst, m } => fill(
                &dst,
                m.value,
                m.elem as usize,
                m.width as usize,
                m.height as usize,
                m.pitch as usize,
            ),
            Step::Copy {
                dst,
                src,
                c,
                dst_first,
                src_first,
            } => {
                for z in 0..c.depth.max(1) {
                    for y in 0..c.height.max(1) {
                        let d = dst.offset((c.dst.row(y, z) - dst_first) as usize);
                        let s = src.offset((c.src.row(y, z) - src_first) as usize);
                        copy_bytes(&d, &s, c.width as usize);
                    }
                }
            }
            Step::Release {
                backing,
                core,
                size,
            } => {
                drop(backing);
                if let Some(core) = core {
                    core.give_back(size);
                }
            }
        }
    }
}

/// The nodes' indices in an order that runs every node after its dependencies, earliest-created
/// first among those ready; `None` when the edges form a cycle.
pub(crate) fn dependency_order(nodes: &[Node]) -> Option<Vec<usize>> {
    let mut done = vec![false; nodes.len()];
    let mut order = Vec::with_capacity(nodes.len());
    while order.len() < nodes.len() {
        let next = (0..nodes.len())
            .find(|&i| !done[i] && nodes[i].deps.iter().all(|&d| d < nodes.len() && done[d]))?;
        done[next] = true;
        order.push(next);
    }
    Some(order)
}
