//! [`StreamHandle`]: created streams (which embed their context), wrapped foreign streams, and
//! the three default-stream tokens, unbound or bound to a context.

use std::any::Any;
use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};

use cuda_sys::types::{CUcontext, CUstream};

use cuda_sys::{Driver, LoadError};

use crate::context::{context_for_current, ContextHandle};
use crate::context::{in_context, in_context_or_undo};
use crate::error::HandleError;
use crate::flags::StreamFlags;
use crate::report::Subject;
use crate::scope::release_in;
use crate::sys::{check, check_token, driver, init};

/// How many captures begun through custody (`begin_capture`) have not ended yet.
static ACTIVE_CAPTURES: AtomicUsize = AtomicUsize::new(0);

/// Whether any capture begun through custody (`begin_capture`) may still be running: one
/// relaxed atomic load, so that a path that would otherwise not ask the driver (an allocation, a
/// free on a default-stream token) asks only while such a capture runs. A capture begun by code
/// outside custody is not counted.
#[inline]
pub fn capture_may_be_active() -> bool {
    ACTIVE_CAPTURES.load(Ordering::Relaxed) != 0
}

/// Runs `f`, driver calls that free memory, so that no capture forbids them: with the calling
/// thread's stream-capture interaction mode relaxed while a capture begun through custody may be
/// running ([`relaxed`]), as it is otherwise (one atomic load). In the default (global) mode a
/// free on a stream not being captured, beside a global capture on any thread or a thread-local
/// one on this thread, is refused and breaks that capture (docs/driver-facts.md F27); a free
/// whose last reference goes during someone's capture must break nothing (handles/DESIGN.md,
/// "Frees beside a capture"). A capture begun outside custody is not seen.
#[inline]
pub(crate) fn beside_captures<R>(d: &Driver, f: impl FnOnce() -> R) -> R {
    if capture_may_be_active() {
        relaxed(d, f)
    } else {
        f()
    }
}

/// Runs `f` with the calling thread's stream-capture interaction mode relaxed (no capture
/// forbids it anything, F27), then puts the thread's mode back. When relaxing fails `f` runs in
/// the thread's own mode, where a capture may refuse its calls (that refusal is then `f`'s
/// error, reported or returned by its caller as any other). When putting the mode back fails
/// the thread stays relaxed, said on stderr: nothing was lost, the outcome is `f`'s.
///
/// Driver calls: `cuThreadExchangeStreamCaptureMode` (twice).
#[cold]
#[inline(never)]
pub(crate) fn relaxed<R>(d: &Driver, f: impl FnOnce() -> R) -> R {
    let previous = crate::sys::exchange_capture_mode(d, crate::sys::CAPTURE_MODE_RELAXED);
    let value = f();
    if let Ok(previous) = previous {
        if let Err(status) = crate::sys::exchange_capture_mode(d, previous) {
            crate::report::stderr_line(format_args!(
                "custody: the stream-capture interaction mode relaxed for a free could not be \
                 put back (cuThreadExchangeStreamCaptureMode: {}); this thread stays relaxed",
                cuda_sys::CudaErrorCode(status).name()
            ));
        }
    }
    value
}

thread_local! {
    /// How many captures begun through custody on this thread, in a mode other than relaxed,
    /// have not ended yet (ended on this thread).
    static THIS_THREAD_CAPTURES: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// Whether this thread began a capture through custody (`begin_capture`), in global or
/// thread-local mode, that it has not ended: while it runs the driver forbids this thread
/// "potentially unsafe" calls in its default interaction mode (a `cuMemFreeAsync` on another
/// stream among them, docs/driver-facts.md F27), refusing them and invalidating the capture. A
/// capture ended on another thread (a relaxed one may be) is still counted here until the thread
/// begins or ends another.
pub fn this_thread_may_be_capturing() -> bool {
    capture_may_be_active() && THIS_THREAD_CAPTURES.with(std::cell::Cell::get) != 0
}

/// Counts a capture begun (`relaxed`: in relaxed mode, which forbids this thread nothing).
pub(crate) fn note_capture_begun(relaxed: bool) {
    ACTIVE_CAPTURES.fetch_add(1, Ordering::Relaxed);
    if !relaxed {
        THIS_THREAD_CAPTURES.with(|n| n.set(n.get() + 1));
    }
}

/// Counts a capture ended (successfully or invalidated).
pub(crate) fn note_capture_ended() {
    THIS_THREAD_CAPTURES.with(|n| n.set(n.get().saturating_sub(1)));
    let _ = ACTIVE_CAPTURES.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
        Some(n.saturating_sub(1))
    });
}

/// What the driver says about a stream about to be used for a free, while a capture may run
/// (docs/decisions.md D11).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CaptureState {
    /// Not capturing: the stream can be used.
    Free,
    /// Being captured into `graph` (the capture graph, alive while the capture runs).
    Capturing {
        /// The raw `CUgraph` being captured into.
        graph: usize,
        /// The capture's id, unique in the process (`cuStreamGetCaptureInfo_v2`'s `id_out`):
        /// which capture a stream is in, whatever stream began it.
        id: u64,
    },
    /// Captured, but the capture was invalidated: nothing may be enqueued until it ends.
    Invalidated {
        /// The capture's id, as for [`CaptureState::Capturing`].
        id: u64,
    },
    /// The legacy stream while a blocking stream of its context is being captured
    /// (`CUDA_ERROR_STREAM_CAPTURE_IMPLICIT`): work on it would join (and break) that capture.
    Blocked,
    /// The query itself failed with this status: nothing is known.
    Unknown(u32),
}

/// `CUDA_ERROR_STREAM_CAPTURE_IMPLICIT`.
const CAPTURE_IMPLICIT: u32 = 906;

/// Asks the driver whether the stream `raw` is capturing (`cuStreamGetCaptureInfo_v2`). For a
/// default-stream token the caller makes the context to resolve it in current.
///
/// Driver calls: `cuStreamGetCaptureInfo_v2`.
pub(crate) fn capture_state(d: &Driver, raw: CUstream) -> CaptureState {
    let mut status: u32 = 0;
    let mut id: u64 = 0;
    let mut graph: cuda_sys::types::CUgraph = std::ptr::null_mut();
    // SAFETY: `status` is 4 bytes of storage for the enum, read as an integer; `id` and `graph`
    // are valid out-pointers; the optional outputs are null; the caller's handle keeps the
    // stream alive.
    let result = unsafe {
        (d.cuStreamGetCaptureInfo_v2)(
            raw,
            (&mut status as *mut u32).cast(),
            &mut id,
            &mut graph,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
        )
    };
    match (result, status) {
        (0, 0) => CaptureState::Free,
        (0, 1) if !graph.is_null() => CaptureState::Capturing {
            graph: graph as usize,
            id,
        },
        (0, _) => CaptureState::Invalidated { id },
        (CAPTURE_IMPLICIT, _) => CaptureState::Blocked,
        (status, _) => CaptureState::Unknown(status),
    }
}

impl CaptureState {
    /// The id of the capture the stream is in (running or invalidated), if any.
    pub(crate) fn capture_id(self) -> Option<u64> {
        match self {
            CaptureState::Capturing { id, .. } | CaptureState::Invalidated { id } => Some(id),
            _ => None,
        }
    }
}

/// One of the three default-stream tokens. They are not streams: the driver resolves them
/// against the context current on the calling thread (and, for the per-thread default stream,
/// against the thread itself).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DefaultStream {
    /// `NULL` (0): the legacy default stream, since custody loads the non-`_ptsz` entry points.
    Null,
    /// `CU_STREAM_LEGACY` (0x1).
    Legacy,
    /// `CU_STREAM_PER_THREAD` (0x2).
    PerThread,
}

impl DefaultStream {
    /// The token's raw value.
    pub fn raw(self) -> CUstream {
        self.value() as CUstream
    }

    /// The token for a raw value, if it is one (0, 0x1 or 0x2).
    pub fn from_raw(raw: CUstream) -> Option<DefaultStream> {
        match raw as usize {
            0 => Some(DefaultStream::Null),
            1 => Some(DefaultStream::Legacy),
            2 => Some(DefaultStream::PerThread),
            _ => None,
        }
    }

    fn value(self) -> usize {
        match self {
            DefaultStream::Null => 0,
            DefaultStream::Legacy => 1,
            DefaultStream::PerThread => 2,
        }
    }
}

/// How a stream is released when its last handle drops.
enum StreamRelease {
    /// Created by this crate: destroyed (`cuStreamDestroy`) in its context.
    Owned,
    /// Made by someone else; an optional owner object is dropped, nothing is destroyed.
    Foreign(#[allow(dead_code)] Option<Box<dyn Any + Send + Sync>>),
    /// A default-stream token: nothing to release.
    Token(DefaultStream),
}

/// Aligned to 128 bytes, so that a box has its cache lines to itself (Intel's adjacent-line
/// prefetcher pairs 64-byte lines): its reference count is written by every recipe made and
/// dropped (one per allocation), and two streams' boxes made back to back would otherwise share
/// a line, so that threads working on different streams would slow one another down
/// (handles/DESIGN.md, "Layout").
#[repr(align(128))]
struct StreamBox {
    raw: usize,
    /// The driver's id of a stream wrapped without an owner (`cuStreamGetId` when it was
    /// wrapped: unique for the life of the process, where the raw value may come to name another
    /// stream once this one is destroyed); 0 for every other stream and when the driver did not
    /// answer.
    id: u64,
    context: Option<ContextHandle>,
    release: StreamRelease,
}

/// A stream: created (owned, embedding its [`ContextHandle`]), foreign (wrapped, with the
/// context the driver reports for it), or a default-stream token, unbound or bound to a context.
///
/// Cloning is one atomic increment; a handle never re-points. A deallocation recipe holds a
/// `StreamHandle`, so a created stream outlives every free ordered on it even after the user's
/// last handle is gone (docs/driver-facts.md F11).
#[derive(Clone)]
pub struct StreamHandle(Arc<StreamBox>);

fn owned_registry() -> &'static Mutex<HashMap<usize, Weak<StreamBox>>> {
    static REGISTRY: OnceLock<Mutex<HashMap<usize, Weak<StreamBox>>>> = OnceLock::new();
    REGISTRY.get_or_init(|| Mutex::new(HashMap::new()))
}

pub(crate) fn unbound_token(kind: DefaultStream) -> &'static StreamHandle {
    static TOKENS: OnceLock<[StreamHandle; 3]> = OnceLock::new();
    let tokens = TOKENS.get_or_init(|| {
        [
            DefaultStream::Null,
            DefaultStream::Legacy,
            DefaultStream::PerThread,
        ]
        .map(|kind| {
            StreamHandle(Arc::new(StreamBox {
                raw: kind.value(),
                id: 0,
                context: None,
                release: StreamRelease::Token(kind),
            }))
        })
    });
    &tokens[kind.value()]
}

impl StreamHandle {
    /// Gives up this handle: when it was the last one, returns the stream's state, whose drop
    /// may call `cuStreamDestroy` (created streams) or release a context; `None` (and no driver
    /// call) otherwise. Atomic against other holders (`Arc::into_inner`).
    pub(crate) fn into_last(self) -> Option<Box<dyn Send>> {
        Arc::into_inner(self.0).map(|last| Box::new(last) as Box<dyn Send>)
    }

    /// Creates a stream in `context` with `flags` (`CU_STREAM_*`: [`StreamFlags::DEFAULT`] for a
    /// blocking stream, [`StreamFlags::NON_BLOCKING`]) and `priority` (0 is the
    /// default; lower numbers are higher priorities). The stream embeds the context, so the
    /// context lives at least as long as the stream.
    ///
    /// The calling thread's binding is unchanged afterwards.
    ///
    /// # Errors
    /// [`HandleError::Driver`] when the creation fails; [`HandleError::ContextNotActivated`]
    /// when `context` cannot be made current; [`HandleError::ContextNotRestored`] when the
    /// caller's context cannot be put back (the stream just created is destroyed first).
    ///
    /// Driver calls: `cuCtxGetCurrent`, `cuCtxSetCurrent` (when `context` is not current),
    /// `cuStreamCreateWithPriority`; `cuStreamDestroy_v2` when the last clone drops.
    pub fn create(
        context: &ContextHandle,
        flags: StreamFlags,
        priority: i32,
    ) -> Result<StreamHandle, HandleError> {
        let raw = in_context_or_undo(
            context,
            "cuStreamCreateWithPriority",
            |d| {
                let mut raw: CUstream = std::ptr::null_mut();
                // SAFETY: `raw` is a valid out-pointer; `in_context_or_undo` makes `context`
                // current.
                let status =
                    unsafe { (d.cuStreamCreateWithPriority)(&mut raw, flags.bits(), priority) };
                check("cuStreamCreateWithPriority", status).map(|()| raw)
            },
            |d, raw| {
                // SAFETY: the stream was just created and is owned by nobody else; its context is
                // still current, because restoring the caller's failed.
                let _ = unsafe { (d.cuStreamDestroy_v2)(raw) };
            },
        )?;
        let handle = StreamHandle(Arc::new(StreamBox {
            raw: raw as usize,
            id: 0,
            context: Some(context.clone()),
            release: StreamRelease::Owned,
        }));
        let mut registry = owned_registry().lock().unwrap_or_else(|e| e.into_inner());
        registry.insert(raw as usize, Arc::downgrade(&handle.0));
        drop(registry);
        Ok(handle)
    }

    /// The process-wide unbound handle for a default-stream token. It carries no context: a
    /// recipe recorded with it binds the context current at that moment.
    pub fn default_stream(kind: DefaultStream) -> StreamHandle {
        unbound_token(kind).clone()
    }

    /// The unbound legacy default stream (`CU_STREAM_LEGACY`).
    pub fn legacy() -> StreamHandle {
        StreamHandle::default_stream(DefaultStream::Legacy)
    }

    /// The unbound per-thread default stream (`CU_STREAM_PER_THREAD`).
    pub fn per_thread() -> StreamHandle {
        StreamHandle::default_stream(DefaultStream::PerThread)
    }

    /// A default-stream token bound to `context`: it means that context's legacy (or, for the
    /// calling thread, per-thread) stream wherever it is used, and keeps the context alive.
    pub fn bound_default_stream(kind: DefaultStream, context: &ContextHandle) -> StreamHandle {
        StreamHandle(Arc::new(StreamBox {
            raw: kind.value(),
            id: 0,
            context: Some(context.clone()),
            release: StreamRelease::Token(kind),
        }))
    }

    /// Wraps a stream made by other code; see [`crate::raw::wrap_stream`], whose caller vouches
    /// for `raw`.
    ///
    /// # Errors
    /// [`HandleError::Driver`] when `cuStreamGetCtx` rejects the stream.
    ///
    /// Driver calls: `cuStreamGetCtx` and those of [`ContextHandle::from_raw_borrowed`], and
    /// `cuStreamGetId` without an owner (none for tokens or streams this crate owns).
    pub(crate) fn from_raw(
        raw: usize,
        owner: Option<Box<dyn Any + Send + Sync>>,
    ) -> Result<StreamHandle, HandleError> {
        if let Some(kind) = DefaultStream::from_raw(raw as CUstream) {
            return Ok(StreamHandle::default_stream(kind));
        }
        let owned = {
            let registry = owned_registry().lock().unwrap_or_else(|e| e.into_inner());
            registry.get(&raw).and_then(Weak::upgrade)
        };
        if let Some(owned) = owned {
            return Ok(StreamHandle(owned));
        }
        let d = init()?;
        let mut ctx: CUcontext = std::ptr::null_mut();
        // SAFETY: the caller vouches for `raw`; `ctx` is a valid out-pointer read after success.
        let status = unsafe { (d.cuStreamGetCtx)(raw as CUstream, &mut ctx) };
        check("cuStreamGetCtx", status)?;
        let current = crate::sys::current_context(d)?;
        let context = if current == ctx as usize {
            context_for_current(current)?
        } else {
            ContextHandle::from_raw_borrowed(ctx)?
        };
        // A stream nothing here keeps alive is told from a later stream under the same value by
        // its id (0 if the driver does not answer: then it has none).
        let id = if owner.is_none() {
            let mut id: u64 = 0;
            // SAFETY: the caller vouches for `raw`; `id` is a valid out-pointer.
            let status = unsafe { (d.cuStreamGetId)(raw as CUstream, &mut id) };
            if status == 0 {
                id
            } else {
                0
            }
        } else {
            0
        };
        Ok(StreamHandle(Arc::new(StreamBox {
            raw,
            id,
            context: Some(context),
            release: StreamRelease::Foreign(owner),
        })))
    }

    /// The raw `CUstream` (or token value), valid while this handle lives.
    #[inline]
    pub fn raw(&self) -> CUstream {
        self.0.raw as CUstream
    }

    /// The context the stream belongs to: a created stream's own, a foreign stream's as the
    /// driver reported it, a bound token's; `None` for an unbound token.
    #[inline]
    pub fn context(&self) -> Option<&ContextHandle> {
        self.0.context.as_ref()
    }

    /// Which default-stream token this is, if it is one.
    #[inline]
    pub fn default_kind(&self) -> Option<DefaultStream> {
        match self.0.release {
            StreamRelease::Token(kind) => Some(kind),
            _ => None,
        }
    }

    /// Whether this handle created the stream and will destroy it.
    pub fn is_owned(&self) -> bool {
        matches!(self.0.release, StreamRelease::Owned)
    }

    /// Whether holding this handle keeps the stream from being destroyed, so that its raw value
    /// names this stream for as long as the handle lives: a created stream (the handle destroys
    /// it), or a wrapped one with an owner object (which keeps it alive, as the `__cuda_stream__`
    /// provider does). A stream wrapped without an owner, and a default-stream token, do not:
    /// its maker may destroy it while the handle lives, and a new stream may get its value. What
    /// a block cache keys its bins on ([`DevicePtrHandle::lend`](crate::DevicePtrHandle::lend)).
    #[inline]
    pub fn pins_its_stream(&self) -> bool {
        matches!(
            self.0.release,
            StreamRelease::Owned | StreamRelease::Foreign(Some(_))
        )
    }

    /// The driver's id of a stream wrapped without an owner (`cuStreamGetId`, read when it was
    /// wrapped), unique for the life of the process: what tells this stream from a later one the
    /// driver hands the same raw value once this one is destroyed (which its maker may do while
    /// this handle lives, [`StreamHandle::pins_its_stream`]). `None` for every other stream
    /// (whose raw value names it while a handle lives) and when the driver did not answer. No
    /// driver call.
    #[inline]
    pub fn unpinned_id(&self) -> Option<u64> {
        (self.0.id != 0).then_some(self.0.id)
    }

    /// Whether both handles share one box.
    pub fn ptr_eq(&self, other: &StreamHandle) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }

    /// How many handles share this stream (recipes recorded on it included); for a binding
    /// that must know whether it holds the only one (a garbage collector's traversal).
    pub fn handle_count(&self) -> usize {
        Arc::strong_count(&self.0)
    }

    #[inline]
    pub(crate) fn raw_usize(&self) -> usize {
        self.0.raw
    }

    /// The token kind of an unbound token; `None` for any stream that carries a context.
    #[inline]
    pub(crate) fn unbound_kind(&self) -> Option<DefaultStream> {
        match (&self.0.release, &self.0.context) {
            (StreamRelease::Token(kind), None) => Some(*kind),
            _ => None,
        }
    }

    /// The context of a stream known to carry one (everything but an unbound token).
    #[inline]
    pub(crate) fn carried_context(&self) -> &ContextHandle {
        match &self.0.context {
            Some(context) => context,
            // Only unbound tokens lack a context, and recipes never hold one as a stream.
            None => unreachable!("an unbound token carries no context"),
        }
    }

    #[inline]
    pub(crate) fn is_unbound_token(&self) -> bool {
        self.0.context.is_none()
    }

    /// Runs `f` with the stream's context current (for an unbound token: the caller's, not
    /// switched), as an explicit operation named `operation`.
    #[inline]
    pub(crate) fn in_own_context<R>(
        &self,
        operation: &'static str,
        f: impl FnOnce(&'static Driver) -> Result<R, HandleError>,
    ) -> Result<R, HandleError> {
        match &self.0.context {
            None => f(driver()?),
            Some(context) => in_context(context, operation, f),
        }
    }

    /// Runs one driver call `call` on this stream (given the raw stream) in the stream's context
    /// and checks its status; for an unbound token, in the caller's context, where "no context"
    /// is [`HandleError::NoCurrentContext`].
    #[inline]
    pub(crate) fn run(
        &self,
        call: &'static str,
        f: impl FnOnce(&'static Driver, CUstream) -> u32,
    ) -> Result<(), HandleError> {
        let token = self.is_unbound_token();
        self.in_own_context(call, |d| check_token(call, f(d, self.raw()), token))
    }

    /// [`StreamHandle::run`] followed by `cuStreamSynchronize` on the same stream.
    pub(crate) fn run_then_synchronize(
        &self,
        call: &'static str,
        f: impl FnOnce(&'static Driver, CUstream) -> u32,
    ) -> Result<(), HandleError> {
        let token = self.is_unbound_token();
        self.in_own_context(call, |d| {
            check_token(call, f(d, self.raw()), token)?;
            // SAFETY: the handle keeps the stream alive; its context is current (or the token
            // resolves against the caller's).
            let status = unsafe { (d.cuStreamSynchronize)(self.raw()) };
            check_token("cuStreamSynchronize", status, token)
        })
    }

    /// Whether work ordered on this stream needs no context current: a created or wrapped
    /// stream identifies its context, so `cuMemFreeAsync` on it, `cuStreamSynchronize` of it,
    /// the synchronous frees and stream-ordered allocations on it succeed with no context or
    /// another one current (docs/driver-facts.md F4, F5, F6, F8;
    /// docs/driver-probe/h200-580.159.04-alloc-context.txt; docs/decisions.md D2). Every token,
    /// bound or not, means something only against a current context (F1-F3).
    #[inline]
    pub(crate) fn identifies_its_context(&self) -> bool {
        !matches!(self.0.release, StreamRelease::Token(_))
    }

    /// A free `call` ordered on this stream: on a created or wrapped stream with no context
    /// calls at all ([`StreamHandle::identifies_its_context`]), otherwise as
    /// [`StreamHandle::run`].
    #[inline]
    pub(crate) fn run_free(
        &self,
        call: &'static str,
        f: impl FnOnce(&'static Driver, CUstream) -> u32,
    ) -> Result<(), HandleError> {
        if self.identifies_its_context() {
            check(call, f(driver()?, self.raw()))
        } else {
            self.run(call, f)
        }
    }

    /// `cuStreamSynchronize` of this stream, then the synchronous free `call`, with the context
    /// rule of [`StreamHandle::run_free`]. Nothing is freed when the wait fails.
    pub(crate) fn synchronize_then_free(
        &self,
        call: &'static str,
        free: impl FnOnce(&'static Driver) -> u32,
    ) -> Result<(), HandleError> {
        let token = self.is_unbound_token();
        let run = |d: &'static Driver| -> Result<(), HandleError> {
            // SAFETY: the handle keeps the stream alive; a created stream needs no context
            // (F6), a token resolves in the context current here.
            let status = unsafe { (d.cuStreamSynchronize)(self.raw()) };
            check_token("cuStreamSynchronize", status, token)?;
            check(call, free(d))
        };
        if self.identifies_its_context() {
            run(driver()?)
        } else {
            self.in_own_context(call, run)
        }
    }

    /// Blocks the calling thread until all work queued on the stream has finished.
    ///
    /// # Errors
    /// [`HandleError::NoCurrentContext`] for an unbound token on a thread with no context;
    /// [`HandleError::Driver`] otherwise; [`HandleError::ContextNotActivated`] or
    /// [`HandleError::ContextNotRestored`] when the switch to the stream's context fails.
    ///
    /// Driver calls: `cuStreamSynchronize` (inside the stream's context, see
    /// [`crate::ContextScope`]).
    pub fn synchronize(&self) -> Result<(), HandleError> {
        self.run("cuStreamSynchronize", |d, s| {
            // SAFETY: the handle keeps the stream alive; its context is current (or the token
            // resolves against the caller's).
            unsafe { (d.cuStreamSynchronize)(s) }
        })
    }

    /// Releases this handle now; when it is the last one of a created stream, destroys the
    /// stream and returns the outcome instead of reporting it.
    ///
    /// # Errors
    /// [`HandleError::Driver`] when `cuStreamDestroy` fails (the handle is gone either way);
    /// [`HandleError::ContextNotActivated`] or [`HandleError::ContextNotRestored`] for the
    /// switch to the stream's context.
    ///
    /// Driver calls: `cuCtxGetCurrent`, `cuCtxSetCurrent` (if needed), `cuStreamDestroy_v2`.
    pub fn close(self) -> Result<(), HandleError> {
        // `into_inner`: exactly one of two releases at the same moment is the last (a failed
        // `try_unwrap` would drop a reference that may be the last by then, as a drop).
        match Arc::into_inner(self.0) {
            Some(mut stream) => {
                let result = if stream.unregister() {
                    let raw = stream.raw;
                    in_context(stream.owned_context(), "cuStreamDestroy_v2", |d| {
                        check("cuStreamDestroy_v2", destroy(d, raw))
                    })
                } else {
                    Ok(())
                };
                stream.release = StreamRelease::Foreign(None);
                result
            }
            None => Ok(()),
        }
    }
}

/// `cuStreamDestroy_v2(raw)`: the status.
fn destroy(d: &Driver, raw: usize) -> u32 {
    // SAFETY: the caller is the box that created the stream and its last owner; its context is
    // current.
    unsafe { (d.cuStreamDestroy_v2)(raw as CUstream) }
}

impl StreamBox {
    /// For an owned stream: removes it from the registry (so no wrapper finds it any more) and
    /// says that it must be destroyed; `false` for every other kind.
    fn unregister(&mut self) -> bool {
        if !matches!(self.release, StreamRelease::Owned) {
            return false;
        }
        let mut registry = owned_registry().lock().unwrap_or_else(|e| e.into_inner());
        if registry
            .get(&self.raw)
            .is_some_and(|w| w.strong_count() == 0)
        {
            registry.remove(&self.raw);
        }
        true
    }

    /// An owned stream's context (every owned stream has one).
    fn owned_context(&self) -> &ContextHandle {
        match &self.context {
            Some(context) => context,
            None => unreachable!("an owned stream embeds its context"),
        }
    }
}

impl Drop for StreamBox {
    fn drop(&mut self) {
        if crate::lifecycle::exiting() || !self.unregister() {
            return;
        }
        let (raw, context) = (self.raw, self.owned_context().raw_usize());
        release_in(
            context,
            || {
                Subject::new(
                    "stream",
                    "cuStreamDestroy_v2",
                    raw as u64,
                    raw as u64,
                    context as u64,
                )
            },
            |d| check("cuStreamDestroy_v2", destroy(d, raw)),
        );
    }
}

/// What a stream was created with, for the Python bindings' `Stream.is_nonblocking` and
/// `Stream.priority`.
impl StreamHandle {
    /// The stream's creation flags ([`StreamFlags::NON_BLOCKING`] or not). For an unbound
    /// token, those of the token in the caller's context.
    ///
    /// # Errors
    /// [`HandleError::NoCurrentContext`] for an unbound token on a thread with no context;
    /// [`HandleError::Driver`] otherwise; [`HandleError::Load`] when the driver lacks
    /// `cuStreamGetFlags`.
    ///
    /// Driver calls: `cuStreamGetFlags` (inside the stream's context).
    pub fn flags(&self) -> Result<StreamFlags, HandleError> {
        let flags = self.property("cuStreamGetFlags", Driver::cuStreamGetFlags)?;
        Ok(StreamFlags::from_bits_retain(flags))
    }

    /// The stream's priority (lower numbers are higher priorities; the driver clamps what it
    /// was created with to the device's range).
    ///
    /// # Errors
    /// As [`StreamHandle::flags`], for `cuStreamGetPriority`.
    ///
    /// Driver calls: `cuStreamGetPriority` (inside the stream's context).
    pub fn priority(&self) -> Result<i32, HandleError> {
        self.property("cuStreamGetPriority", Driver::cuStreamGetPriority)
    }

    /// A property the driver reads into one out-value (`cuStreamGetFlags`, `cuStreamGetPriority`:
    /// `entry` is the optional entry point's accessor), inside the stream's context.
    fn property<T: Default>(
        &self,
        call: &'static str,
        entry: fn(&Driver) -> Result<unsafe extern "C" fn(CUstream, *mut T) -> u32, LoadError>,
    ) -> Result<T, HandleError> {
        let token = self.is_unbound_token();
        self.in_own_context(call, |d| {
            let get = entry(d).map_err(HandleError::Load)?;
            let mut value = T::default();
            // SAFETY: the handle keeps the stream alive; `value` is a valid out-pointer of the
            // type `entry`'s function writes.
            let status = unsafe { get(self.raw(), &mut value) };
            check_token(call, status, token)?;
            Ok(value)
        })
    }
}

impl fmt::Debug for StreamHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match &self.0.release {
            StreamRelease::Owned => "owned",
            StreamRelease::Foreign(_) => "foreign",
            StreamRelease::Token(_) if self.0.context.is_some() => "bound token",
            StreamRelease::Token(_) => "token",
        };
        write!(f, "StreamHandle(0x{:x}, {kind}", self.0.raw)?;
        if let Some(context) = &self.0.context {
            write!(f, ", context 0x{:x}", context.raw_usize())?;
        }
        f.write_str(")")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_values_round_trip() {
        for kind in [
            DefaultStream::Null,
            DefaultStream::Legacy,
            DefaultStream::PerThread,
        ] {
            assert_eq!(DefaultStream::from_raw(kind.raw()), Some(kind));
        }
        assert_eq!(DefaultStream::Legacy.raw() as usize, 0x1);
        assert_eq!(DefaultStream::PerThread.raw() as usize, 0x2);
        assert_eq!(DefaultStream::from_raw(0x1000 as CUstream), None);
    }

    #[test]
    fn unbound_tokens_are_process_wide_and_carry_no_context() {
        let legacy = StreamHandle::legacy();
        assert!(legacy.ptr_eq(&StreamHandle::legacy()), "one shared box");
        assert!(legacy.context().is_none());
        assert_eq!(legacy.default_kind(), Some(DefaultStream::Legacy));
        assert!(!legacy.is_owned());
        assert_eq!(format!("{legacy:?}"), "StreamHandle(0x1, token)");
    }

    #[test]
    fn handles_are_send_and_sync() {
        fn check<T: Send + Sync>() {}
        check::<StreamHandle>();
        check::<ContextHandle>();
        check::<crate::DevicePtrHandle>();
        check::<crate::MemoryPoolHandle>();
        check::<crate::EventHandle>();
        check::<crate::DeallocationRecipe>();
        check::<crate::UserObjectOwnership>();
        check::<crate::GraphExecHandle>();
    }
}
