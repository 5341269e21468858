//! The state's graph operations: graphs and their nodes, instantiation and launch, user
//! objects and their references, and stream capture. The types they work on are in
//! [`crate::graph`].

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use crate::codes::{self, Res};
use crate::graph::{
    dependency_order, run_destructors, thread_mode, Callback, Copy3D, ExecLife, Graph, GraphExec,
    Node, NodeKind, Step, COND_IF, COND_SWITCH, COND_WHILE, MODE_GLOBAL, MODE_RELAXED,
    MODE_THREAD_LOCAL,
};
use crate::log;
use crate::memory::{AllocKind, Backing};
use crate::state::{State, StreamKind};
use crate::thread::{lock, thread_id};

impl State {
    pub(crate) fn graph(&mut self, g: u64) -> Res<&mut Graph> {
        self.graphs.get_mut(&g).ok_or(codes::BAD_HANDLE)
    }

    /// Node handles -> indices in graph `g`.
    pub(crate) fn node_indices(&self, g: u64, handles: &[u64]) -> Res<Vec<usize>> {
        handles
            .iter()
            .map(|h| match self.nodes.get(h) {
                Some(&(graph, i)) if graph == g => Ok(i),
                _ => Err(codes::INVALID_VALUE),
            })
            .collect()
    }

    /// Adds a node to graph `g`; returns its handle.
    pub(crate) fn add_node(
        &mut self,
        g: u64,
        kind: NodeKind,
        deps: Vec<usize>,
    ) -> Res<(u64, usize)> {
        let handle = self.new_handle();
        let graph = self.graph(g)?;
        let index = graph.nodes.len();
        graph.nodes.push(Node { handle, kind, deps });
        self.nodes.insert(handle, (g, index));
        Ok((handle, index))
    }

    /// Validates a node's memory at creation: live memory, or memory a graph allocates.
    /// Returns the identity of the live allocation it lies in, if any.
    pub(crate) fn check_node_memory(
        &mut self,
        addr: u64,
        len: u64,
        host_ok: bool,
        function: &'static str,
    ) -> Res<Option<u64>> {
        if let Some((&start, &size)) = self.graph_reserved.range(..=addr).next_back() {
            if addr < start + size {
                return if addr + len <= start + size {
                    Ok(None)
                } else {
                    Err(codes::OUT_OF_RANGE)
                };
            }
        }
        self.resolve(addr, len, host_ok, function, 0).map(|t| t.id)
    }

    /// Resolves a node's memory at launch, and checks that it is still the allocation the node
    /// was made for: an address the pool has handed out again (`docs/driver-facts.md` F18)
    /// belongs to another allocation, and a node that touches it is a `use_after_free` of the
    /// node's own, even though the address is live.
    fn resolve_node_memory(
        &mut self,
        addr: u64,
        len: u64,
        host_ok: bool,
        made_for: Option<u64>,
        stream: u64,
    ) -> Option<crate::memory::Target> {
        const F: &str = "cuGraphLaunch";
        let t = self.resolve(addr, len, host_ok, F, stream).ok()?;
        match (made_for, t.id) {
            (Some(then), Some(now)) if then != now => {
                log::hazard(log::Hazard {
                    kind: "use_after_free",
                    ptr: addr,
                    alloc: Some(then),
                    function: F,
                    stream,
                    detail: format!(
                        "{F}: a node made for allocation #{then} touches {addr:#x}, which was freed and now belongs to allocation #{now}"
                    ),
                });
                None
            }
            _ => Some(t),
        }
    }

    /// Takes `count` more references on user object `uo`.
    pub(crate) fn retain_user_object(&mut self, uo: u64, count: u64) -> Res {
        let o = self.user_objects.get_mut(&uo).ok_or(codes::BAD_HANDLE)?;
        o.refs += count;
        Ok(())
    }

    /// Drops `count` references on `uo`; returns its destructor when that was the last.
    pub(crate) fn release_user_object(&mut self, uo: u64, count: u64) -> Res<Option<Callback>> {
        let o = self.user_objects.get_mut(&uo).ok_or(codes::BAD_HANDLE)?;
        if count > o.refs {
            return Err(codes::OVER_RELEASE);
        }
        o.refs -= count;
        if o.refs == 0 {
            let d = o.destructor;
            self.user_objects.remove(&uo);
            return Ok(Some(d));
        }
        Ok(None)
    }

    /// Drops a set of references; returns the destructors that are now due.
    pub(crate) fn release_refs(&mut self, refs: &[(u64, u64)]) -> Vec<Callback> {
        refs.iter()
            .filter_map(|&(uo, n)| self.release_user_object(uo, n).ok().flatten())
            .collect()
    }

    /// Destroys graph `g`; returns the destructors now due.
    pub(crate) fn destroy_graph(&mut self, g: u64) -> Res<Vec<Callback>> {
        let graph = self.graphs.remove(&g).ok_or(codes::BAD_HANDLE)?;
        let mut due = Vec::new();
        for n in &graph.nodes {
            self.nodes.remove(&n.handle);
            // A conditional node's body graphs live as long as the node.
            if let NodeKind::Conditional { bodies, .. } = n.kind {
                for body in self.cond_bodies.remove(&bodies).unwrap_or_default().iter() {
                    due.extend(self.destroy_graph(*body).unwrap_or_default());
                }
            }
        }
        self.conditions.retain(|_, c| c.graph != g);
        let refs: Vec<(u64, u64)> = graph.user_objects.into_iter().collect();
        due.extend(self.release_refs(&refs));
        Ok(due)
    }

    /// Adds a conditional node to graph `g` with fresh, empty body graphs: one for WHILE, one
    /// or two for IF, `size` (at least 1) for SWITCH (documented; anything else is
    /// `CUDA_ERROR_INVALID_VALUE`, as is a handle the driver did not make). Returns the node's
    /// handle and the body graphs' array, which stays where it is as long as the node.
    pub(crate) fn add_conditional(
        &mut self,
        g: u64,
        deps: Vec<usize>,
        cond: u64,
        ctype: u32,
        size: u32,
    ) -> Res<(u64, *const u64)> {
        self.graph(g)?;
        let value = self
            .conditions
            .get(&cond)
            .ok_or(codes::INVALID_VALUE)?
            .default;
        let size_ok = match ctype {
            COND_IF => size == 1 || size == 2,
            COND_WHILE => size == 1,
            COND_SWITCH => size >= 1,
            _ => false,
        };
        if !size_ok {
            return Err(codes::INVALID_VALUE);
        }
        let graphs: Box<[u64]> = (0..size)
            .map(|_| {
                let body = self.new_handle();
                self.graphs.insert(body, Graph::default());
                body
            })
            .collect();
        let at = graphs.as_ptr();
        let bodies = self.new_handle();
        self.cond_bodies.insert(bodies, graphs);
        let kind = NodeKind::Conditional {
            cond,
            ctype,
            value,
            bodies,
        };
        let (handle, _) = self.add_node(g, kind, deps)?;
        Ok((handle, at))
    }

    /// The body graphs of conditional node kind `kind` (none for other kinds).
    pub(crate) fn bodies_of(&self, kind: &NodeKind) -> &[u64] {
        match kind {
            NodeKind::Conditional { bodies, .. } => {
                self.cond_bodies.get(bodies).map_or(&[], |b| &b[..])
            }
            _ => &[],
        }
    }

    /// Graph `g`'s nodes in launch order, each conditional node replaced by the nodes of the
    /// body its value chooses (IF: the first body when non-zero, the second, if any, when
    /// zero; SWITCH: body `value`, none when out of range; WHILE: none when zero, and when
    /// non-zero `endless` is set). A cycle, or a body graph destroyed by the caller, is
    /// `CUDA_ERROR_INVALID_VALUE` (not measured).
    fn launch_order(&self, g: u64, out: &mut Vec<NodeKind>, endless: &mut bool) -> Res {
        let graph = self.graphs.get(&g).ok_or(codes::INVALID_VALUE)?;
        let order = dependency_order(&graph.nodes).ok_or(codes::INVALID_VALUE)?;
        for i in order {
            let kind = graph.nodes[i].kind;
            let NodeKind::Conditional { ctype, value, .. } = kind else {
                out.push(kind);
                continue;
            };
            let bodies = self.bodies_of(&kind);
            let chosen = match ctype {
                COND_IF if value != 0 => bodies.first(),
                COND_IF => bodies.get(1),
                COND_SWITCH => bodies.get(value as usize),
                _ => {
                    *endless |= value != 0;
                    None
                }
            };
            if let Some(&body) = chosen {
                self.launch_order(body, out, endless)?;
            }
        }
        Ok(())
    }

    /// Copies graph `g` (new node handles, new references on its user objects).
    pub(crate) fn clone_graph(&mut self, g: u64) -> Res<u64> {
        let (nodes, uos) = {
            let graph = self.graphs.get(&g).ok_or(codes::BAD_HANDLE)?;
            (graph.nodes.clone(), graph.user_objects.clone())
        };
        let clone = self.new_handle();
        self.graphs.insert(clone, Graph::default());
        for n in nodes {
            let kind = match n.kind {
                NodeKind::Conditional {
                    cond,
                    ctype,
                    value,
                    bodies,
                } => {
                    // The clone's node gets copies of the bodies.
                    let originals = self.cond_bodies.get(&bodies).cloned().unwrap_or_default();
                    let copies = originals
                        .iter()
                        .map(|&b| self.clone_graph(b))
                        .collect::<Res<Box<[u64]>>>()?;
                    let bodies = self.new_handle();
                    self.cond_bodies.insert(bodies, copies);
                    NodeKind::Conditional {
                        cond,
                        ctype,
                        value,
                        bodies,
                    }
                }
                kind => kind,
            };
            self.add_node(clone, kind, n.deps)?;
        }
        for (&uo, &n) in &uos {
            self.retain_user_object(uo, n)?;
        }
        self.graph(clone)?.user_objects = uos;
        Ok(clone)
    }

    /// Instantiates graph `g`; a graph whose edges form a cycle is refused with
    /// `CUDA_ERROR_INVALID_VALUE` (a guess: no driver was asked). Conditional nodes are
    /// resolved here ([`State::launch_order`]): their values cannot change between launches.
    /// A graph holding memory allocation or free nodes while an executable of it exists is
    /// refused with `CUDA_ERROR_NOT_SUPPORTED` (docs/driver-facts.md G5).
    pub(crate) fn instantiate(&mut self, g: u64, flags: u64) -> Res<u64> {
        let (nodes, refs, endless) = {
            let graph = self.graphs.get(&g).ok_or(codes::BAD_HANDLE)?;
            let refs: Vec<(u64, u64)> = graph.user_objects.iter().map(|(&u, &n)| (u, n)).collect();
            let (mut nodes, mut endless) = (Vec::new(), false);
            self.launch_order(g, &mut nodes, &mut endless)?;
            (nodes, refs, endless)
        };
        let holds_memory_nodes = nodes
            .iter()
            .any(|kind| matches!(kind, NodeKind::MemAlloc { .. } | NodeKind::MemFree { .. }));
        let memory_graph = holds_memory_nodes.then_some(g);
        if memory_graph.is_some() && self.execs.values().any(|e| e.memory_graph == memory_graph) {
            return Err(codes::NOT_SUPPORTED);
        }
        for &(uo, n) in &refs {
            self.retain_user_object(uo, n)?;
        }
        let handle = self.new_handle();
        self.execs.insert(
            handle,
            GraphExec {
                nodes,
                endless,
                auto_free: flags & 1 != 0,
                life: Arc::new(Mutex::new(ExecLife {
                    pending: 0,
                    destroyed: false,
                    refs,
                    done: Default::default(),
                })),
                memory_graph,
            },
        );
        Ok(handle)
    }

    /// Destroys a graph exec; returns the destructors due now (none if a launch is pending: the
    /// last pending launch releases them on its worker thread).
    pub(crate) fn destroy_exec(&mut self, e: u64) -> Res<Vec<Callback>> {
        let exec = self.execs.remove(&e).ok_or(codes::BAD_HANDLE)?;
        let (refs, done) = {
            let mut life = lock(&exec.life);
            life.destroyed = true;
            if life.pending == 0 {
                (std::mem::take(&mut life.refs), life.done.clone())
            } else {
                (Vec::new(), Default::default())
            }
        };
        if !refs.is_empty() {
            // The destructors run now, after every launch of the exec: the host knows those
            // launches are done (G2).
            self.host_observed(&done);
        }
        Ok(self.release_refs(&refs))
    }

    /// Enqueues a launch of exec `e` on stream `s`.
    pub(crate) fn launch(&mut self, e: u64, s: u64) -> Res {
        const F: &str = "cuGraphLaunch";
        let (nodes, auto_free, life) = {
            let exec = self.execs.get(&e).ok_or(codes::BAD_HANDLE)?;
            if exec.endless {
                log::note_unsupported(F, "while-loop");
                return Err(codes::NOT_SUPPORTED);
            }
            (exec.nodes.clone(), exec.auto_free, exec.life.clone())
        };
        if self.enqueue_check(s)? {
            // Launching a graph into a capture (a child graph node) is not emulated.
            return Err(codes::CAPTURE_UNSUPPORTED);
        }
        // A graph cannot run while memory it allocates is still live.
        for n in &nodes {
            if let NodeKind::MemAlloc { addr, .. } = *n {
                if self.allocs.contains_key(&addr) && !auto_free {
                    return Err(codes::GRAPH_ALLOCATION_LIVE);
                }
            }
        }
        let (mut deps, time) = self.prepare(s);
        for n in &nodes {
            if let NodeKind::EventWait { event } = *n {
                let record = self.events.get(&event).and_then(|e| e.record.clone());
                if let Some((dep, clock)) = record {
                    deps.push(dep);
                    if let Some(st) = self.streams.get_mut(&s) {
                        st.clock.merge(&clock);
                    }
                }
            }
        }
        let nodes_for_records: Vec<u64> = nodes
            .iter()
            .filter_map(|n| match *n {
                NodeKind::EventRecord { event } => Some(event),
                _ => None,
            })
            .collect();
        let mut steps = Vec::new();
        for n in &nodes {
            if let NodeKind::MemAlloc { addr, .. } = *n {
                if let Some(a) =
                    self.take_alloc(addr, F, "was freed on relaunch (auto free on launch)")
                {
                    steps.push(Step::Release {
                        backing: a.backing,
                        core: a.pool_core,
                        size: a.size,
                    });
                }
            }
        }
        for n in nodes {
            match n {
                NodeKind::Empty
                | NodeKind::EventRecord { .. }
                | NodeKind::EventWait { .. }
                | NodeKind::Conditional { .. } => {}
                NodeKind::Host(cb) => steps.push(Step::Host(cb)),
                NodeKind::Memset(m) => {
                    let Ok(len) = m.extent() else { continue };
                    if let Some(t) = self.resolve_node_memory(m.dst, len, false, m.alloc, s) {
                        self.record_use(t.alloc, s, time);
                        steps.push(Step::Fill { dst: t.mem, m });
                    }
                }
                NodeKind::Memcpy(c) => {
                    let (Ok((sf, sl)), Ok((df, dl))) = (c.extent(&c.src), c.extent(&c.dst)) else {
                        continue;
                    };
                    let src = self.resolve_node_memory(
                        c.src.ptr + sf,
                        sl,
                        Copy3D::host_ok(&c.src),
                        c.src.alloc,
                        s,
                    );
                    let dst = self.resolve_node_memory(
                        c.dst.ptr + df,
                        dl,
                        Copy3D::host_ok(&c.dst),
                        c.dst.alloc,
                        s,
                    );
                    if let (Some(src), Some(dst)) = (src, dst) {
                        self.record_use(src.alloc, s, time);
                        self.record_use(dst.alloc, s, time);
                        steps.push(Step::Copy {
                            dst: dst.mem,
                            src: src.mem,
                            c,
                            dst_first: df,
                            src_first: sf,
                        });
                    }
                }
                NodeKind::MemAlloc { addr, size, device } => {
                    let Some(backing) = Backing::heap(size as usize, 64) else {
                        return Err(codes::OUT_OF_MEMORY);
                    };
                    let a = crate::memory::Alloc::new(
                        addr,
                        size,
                        AllocKind::Pool,
                        device,
                        false,
                        backing,
                    );
                    self.insert_alloc(a);
                    self.record_use(Some(addr), s, time);
                }
                NodeKind::MemFree { addr } => {
                    if self.allocs.contains_key(&addr) {
                        self.check_free_order(addr, s, F);
                        if let Some(a) = self.take_alloc(addr, F, "was freed by a graph free node")
                        {
                            steps.push(Step::Release {
                                backing: a.backing,
                                core: a.pool_core,
                                size: a.size,
                            });
                        }
                    } else {
                        self.report_bad_free(addr, F, s);
                    }
                }
            }
        }
        lock(&life).pending += 1;
        let launch_clock = self.streams[&s].clock.clone();
        let run = move || {
            for step in steps {
                step.run();
            }
            let (refs, done) = {
                let mut l = lock(&life);
                l.pending -= 1;
                l.done.merge(&launch_clock);
                if l.destroyed && l.pending == 0 {
                    (std::mem::take(&mut l.refs), l.done.clone())
                } else {
                    (Vec::new(), Default::default())
                }
            };
            if !refs.is_empty() {
                // The exec was destroyed while this launch was pending (G3): its user-object
                // references go now, on this driver thread, which knows the launches are done.
                let due = {
                    let mut st = crate::state::state();
                    st.host_observed(&done);
                    st.release_refs(&refs)
                };
                run_destructors(due);
            }
        };
        let seq = self.submit(s, deps, Some(Box::new(run)), true);
        let core = self.streams[&s].core.clone();
        let clock = self.streams[&s].clock.clone();
        for n in &nodes_for_records {
            if let Some(ev) = self.events.get_mut(n) {
                // The launch's completion time stands for the node's.
                let slot: Arc<Mutex<Option<std::time::Instant>>> = Default::default();
                ev.recorded_at = slot;
                ev.record = Some((
                    crate::exec::Dep {
                        core: core.clone(),
                        seq,
                    },
                    clock.clone(),
                ));
                ev.captured = None;
            }
        }
        Ok(())
    }

    /// Before enqueuing on stream `s`: `Ok(true)` when it captures (the operation becomes a
    /// node), an error when its capture was invalidated, and the legacy stream's rule that it
    /// may not be used while a blocking stream of its context captures.
    pub(crate) fn enqueue_check(&mut self, s: u64) -> Res<bool> {
        let (capture, kind, ctx) = {
            let st = self.streams.get(&s).ok_or(codes::BAD_HANDLE)?;
            (st.capture, st.kind, st.ctx)
        };
        if let Some(id) = capture {
            let c = self.captures.get(&id).ok_or(codes::CAPTURE_INVALIDATED)?;
            return if c.invalidated {
                Err(codes::CAPTURE_INVALIDATED)
            } else {
                Ok(true)
            };
        }
        if kind == StreamKind::Legacy {
            let capturing: Vec<u64> = self.contexts[&ctx]
                .streams
                .iter()
                .filter_map(|o| self.streams.get(o))
                .filter(|o| o.blocking())
                .filter_map(|o| o.capture)
                .collect();
            if !capturing.is_empty() {
                for id in capturing {
                    self.invalidate_capture(id);
                }
                return Err(codes::CAPTURE_IMPLICIT);
            }
        }
        Ok(false)
    }

    /// Adds a captured operation on stream `s` as a node.
    pub(crate) fn capture_node(&mut self, s: u64, kind: NodeKind) -> Res<u64> {
        let id = self.streams[&s].capture.ok_or(codes::CAPTURE_STATE)?;
        let (graph, deps) = {
            let c = self.captures.get(&id).ok_or(codes::CAPTURE_INVALIDATED)?;
            (c.graph, c.ends.get(&s).cloned().unwrap_or_default())
        };
        let (handle, index) = self.add_node(graph, kind, deps)?;
        if let Some(c) = self.captures.get_mut(&id) {
            c.ends.insert(s, vec![index]);
        }
        Ok(handle)
    }

    pub(crate) fn invalidate_capture(&mut self, id: u64) {
        if let Some(c) = self.captures.get_mut(&id) {
            c.invalidated = true;
        }
    }

    /// The rule for "potentially unsafe" calls (synchronous allocation, freeing, copying,
    /// synchronising, and a stream-ordered allocation or free on a stream not being captured,
    /// measured: docs/driver-facts.md F27), after the calling thread's capture interaction mode (the driver API's
    /// description of `cuThreadExchangeStreamCaptureMode`): in global mode (the default) not
    /// allowed while this thread has a non-relaxed capture or another thread has a global one;
    /// in thread-local mode only this thread's non-relaxed captures count; in relaxed mode none.
    /// The offending captures are invalidated.
    pub(crate) fn check_unsafe_call(&mut self) -> Res {
        let me = thread_id();
        let mode = thread_mode();
        if mode == MODE_RELAXED {
            return Ok(());
        }
        let offended: Vec<u64> = self
            .captures
            .iter()
            .filter(|(_, c)| !c.invalidated)
            .filter(|(_, c)| {
                (c.thread == me && c.mode != MODE_RELAXED)
                    || (mode == MODE_GLOBAL && c.thread != me && c.mode == MODE_GLOBAL)
            })
            .map(|(&id, _)| id)
            .collect();
        if offended.is_empty() {
            return Ok(());
        }
        for id in offended {
            self.invalidate_capture(id);
        }
        Err(codes::CAPTURE_UNSUPPORTED)
    }

    /// `cuMemPoolGetAttribute`'s rule in a capture, as far as it was measured
    /// (docs/driver-facts.md F26): refused with `CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED` on a
    /// thread that began a thread-local capture which an illegal call had invalidated and which
    /// has not ended, unless the thread's interaction mode is relaxed (documented to forbid
    /// nothing). Not measured, and so allowed as before: the query during a valid capture, during
    /// a global or relaxed capture, and from another thread.
    pub(crate) fn check_pool_query_in_capture(&self) -> Res {
        let me = thread_id();
        if thread_mode() == MODE_RELAXED {
            return Ok(());
        }
        let refused = self
            .captures
            .values()
            .any(|c| c.thread == me && c.mode == MODE_THREAD_LOCAL && c.invalidated);
        if refused {
            return Err(codes::POOL_QUERY_IN_CAPTURE);
        }
        Ok(())
    }

    /// Ends the capture that stream `s` began; returns the graph. A capture that was invalidated
    /// or left a forked stream unjoined produces no graph: the graph it recorded into (when the
    /// capture made it) is destroyed, and the destructors of the user objects that graph held
    /// last come back with the error, for the caller to run once the state is unlocked, as
    /// `cuGraphDestroy` runs them.
    pub(crate) fn end_capture(&mut self, s: u64) -> Result<u64, (u32, Vec<Callback>)> {
        let id = self.streams[&s]
            .capture
            .ok_or((codes::CAPTURE_STATE, Vec::new()))?;
        let (origin, mode, thread) = {
            let c = &self.captures[&id];
            (c.origin, c.mode, c.thread)
        };
        if origin != s {
            return Err((codes::CAPTURE_STATE, Vec::new()));
        }
        if mode != MODE_RELAXED && thread != thread_id() {
            return Err((codes::CAPTURE_WRONG_THREAD, Vec::new()));
        }
        let c = self.captures.remove(&id).expect("capture exists");
        for stream in c.ends.keys() {
            if let Some(st) = self.streams.get_mut(stream) {
                st.capture = None;
            }
        }
        let failed = if c.invalidated {
            Some(codes::CAPTURE_INVALIDATED)
        } else {
            // Every forked stream must have joined back into the origin stream.
            let graph = &self.graphs[&c.graph];
            let mut joined: HashSet<usize> = HashSet::new();
            let mut stack: Vec<usize> = c.ends.get(&s).cloned().unwrap_or_default();
            while let Some(n) = stack.pop() {
                if joined.insert(n) {
                    stack.extend(graph.nodes[n].deps.iter().copied());
                }
            }
            let unjoined = c
                .ends
                .iter()
                .filter(|(&stream, _)| stream != s)
                .any(|(_, ends)| ends.iter().any(|n| !joined.contains(n)));
            unjoined.then_some(codes::CAPTURE_UNJOINED)
        };
        match failed {
            None => Ok(c.graph),
            Some(code) => {
                // The discarded graph releases its references like a destroyed one: a user
                // object it held last is destroyed.
                let due = if c.owns_graph {
                    self.destroy_graph(c.graph).unwrap_or_default()
                } else {
                    Vec::new()
                };
                Err((code, due))
            }
        }
    }
}
