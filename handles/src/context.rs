//! [`ContextHandle`]: primary, created and borrowed contexts, the registry of contexts this crate
//! created, the per-thread cache that turns "the context current now" into a handle; and running
//! work in a context: [`ContextScope`] and the crate's `in_context` helpers, built on
//! `scope::run_in`.

use std::cell::RefCell;
use std::collections::HashMap;
use std::fmt;
use std::marker::PhantomData;
use std::sync::{Arc, Mutex, OnceLock, Weak};

use cuda_sys::types::{CUcontext, CUdevice};
use cuda_sys::{CudaError, CudaErrorCode, Driver};

use crate::error::HandleError;
use crate::flags::ContextFlags;
use crate::report::{report_leak, Consequence, Subject};
use crate::scope::{activate, report_restore, restore, run_in, Switch};
use crate::sys::{as_ctx, check, current_context, driver, init};

/// How a context was obtained, which fixes how it is released.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ContextKind {
    /// A device's primary context, retained (`cuDevicePrimaryCtxRetain`) for as long as the
    /// handle lives and released (`cuDevicePrimaryCtxRelease`) after the last clone drops.
    Primary,
    /// A context this crate created (`cuCtxCreate`) and destroys (`cuCtxDestroy`) after the
    /// last clone drops.
    Created,
    /// A context made by someone else; nothing is released and its owner must keep it alive
    /// for as long as the handle (and every recipe that holds it) lives.
    Borrowed,
}

/// Aligned to 128 bytes, so that a box has its cache lines to itself (Intel's adjacent-line
/// prefetcher pairs 64-byte lines): it is read by every allocation on its streams, and its
/// reference count is written by every default-stream recipe made and dropped; a neighbour's
/// writes on the same line would slow those down (handles/DESIGN.md, "Layout").
#[repr(align(128))]
struct ContextBox {
    raw: usize,
    device: CUdevice,
    kind: ContextKind,
    /// For a borrowed context, its unique id (`cuCtxGetId`) when custody first saw it, so that
    /// binding a recipe can tell that its owner destroyed it (the raw value may even name a
    /// newer context by then); 0 for the contexts custody holds, which cannot go first.
    id: u64,
}

/// A CUDA context: primary (retained), created (owned) or borrowed.
///
/// Cloning is one atomic increment. Two handles are equal when they name the same `CUcontext`.
/// A recipe holds a `ContextHandle`, so a primary context stays retained and a created context
/// stays alive until every free recorded against it has run.
#[derive(Clone)]
pub struct ContextHandle(Arc<ContextBox>);

fn created_registry() -> &'static Mutex<HashMap<usize, Weak<ContextBox>>> {
    static REGISTRY: OnceLock<Mutex<HashMap<usize, Weak<ContextBox>>>> = OnceLock::new();
    REGISTRY.get_or_init(|| Mutex::new(HashMap::new()))
}

enum CacheEntry {
    /// A primary context; the thread keeps it retained while cached.
    Strong(ContextHandle),
    /// A context this crate created; cached without keeping it alive.
    Weak(usize, Weak<ContextBox>),
}

thread_local! {
    /// The last context recorded on this thread, so recording a default-stream token costs one
    /// `cuCtxGetCurrent` and no lookup.
    static LAST_CONTEXT: RefCell<Option<CacheEntry>> = const { RefCell::new(None) };
}

impl ContextHandle {
    /// Gives up this handle: when it was the last one, returns the context's state, whose drop
    /// releases or destroys the context; `None` (and no driver call) otherwise. Atomic against
    /// other holders (`Arc::into_inner`).
    pub(crate) fn into_last(self) -> Option<Box<dyn Send>> {
        Arc::into_inner(self.0).map(|last| Box::new(last) as Box<dyn Send>)
    }

    /// Retains device `ordinal`'s primary context (initialising the driver on first use).
    ///
    /// The calling thread's current context is not changed.
    ///
    /// # Errors
    /// [`HandleError::Driver`] when initialisation, the device lookup or the retain fails
    /// (`CUDA_ERROR_INVALID_DEVICE` for an ordinal out of range); [`HandleError::Load`] when no
    /// driver loads.
    ///
    /// Driver calls: `cuInit` (once), `cuDeviceGet`, `cuDevicePrimaryCtxRetain`;
    /// `cuDevicePrimaryCtxRelease` when the last clone drops.
    pub fn primary(ordinal: i32) -> Result<ContextHandle, HandleError> {
        let d = init()?;
        let device = device_of_ordinal(d, ordinal)?;
        let mut ctx: CUcontext = std::ptr::null_mut();
        // SAFETY: `ctx` is a valid out-pointer; read only after success.
        let status = unsafe { (d.cuDevicePrimaryCtxRetain)(&mut ctx, device) };
        check("cuDevicePrimaryCtxRetain", status)?;
        Ok(ContextHandle(Arc::new(ContextBox {
            raw: ctx as usize,
            device,
            kind: ContextKind::Primary,
            id: 0,
        })))
    }

    /// Creates a new context on device `ordinal` with `flags` (`CU_CTX_*`;
    /// [`ContextFlags::SCHED_AUTO`] for the driver's defaults), owned by the handle.
    ///
    /// The driver pushes a created context onto the calling thread's stack; this pops it again,
    /// so the caller's binding is unchanged. Use [`ContextHandle::make_current`] to bind it.
    ///
    /// # Errors
    /// [`HandleError::Driver`] when initialisation, the device lookup, the creation or the pop
    /// fails; a context whose pop failed is destroyed before returning.
    ///
    /// Driver calls: `cuInit` (once), `cuDeviceGet`, `cuCtxCreate_v2`, `cuCtxPopCurrent_v2`;
    /// `cuCtxDestroy_v2` when the last clone drops.
    pub fn create(ordinal: i32, flags: ContextFlags) -> Result<ContextHandle, HandleError> {
        let d = init()?;
        let device = device_of_ordinal(d, ordinal)?;
        let mut ctx: CUcontext = std::ptr::null_mut();
        // SAFETY: `ctx` is a valid out-pointer; read only after success.
        let status = unsafe { (d.cuCtxCreate_v2)(&mut ctx, flags.bits(), device) };
        check("cuCtxCreate_v2", status)?;
        let mut popped: CUcontext = std::ptr::null_mut();
        // SAFETY: the context just created is on top of this thread's stack; `popped` is a
        // valid out-pointer.
        let status = unsafe { (d.cuCtxPopCurrent_v2)(&mut popped) };
        if let Err(error) = check("cuCtxPopCurrent_v2", status) {
            // SAFETY: `ctx` was created above and is owned by nobody else.
            let _ = unsafe { (d.cuCtxDestroy_v2)(ctx) };
            return Err(error);
        }
        let handle = ContextHandle(Arc::new(ContextBox {
            raw: ctx as usize,
            device,
            kind: ContextKind::Created,
            id: 0,
        }));
        let mut registry = created_registry().lock().unwrap_or_else(|e| e.into_inner());
        registry.retain(|_, weak| weak.strong_count() > 0);
        registry.insert(ctx as usize, Arc::downgrade(&handle.0));
        drop(registry);
        Ok(handle)
    }

    /// Wraps a context made by other code, without taking ownership; see
    /// [`crate::raw::wrap_context`], whose caller vouches for `raw`.
    ///
    /// # Errors
    /// [`HandleError::InvalidArgument`] for a null context; [`HandleError::Driver`] when the
    /// driver rejects `raw`.
    ///
    /// Driver calls: `cuCtxGetCurrent`, `cuCtxSetCurrent` (twice, when `raw` is not already
    /// current), `cuCtxGetDevice`, `cuDevicePrimaryCtxGetState`, `cuDevicePrimaryCtxRetain`;
    /// `cuCtxGetId` for a context that is neither primary nor one this crate created.
    pub(crate) fn from_raw_borrowed(raw: CUcontext) -> Result<ContextHandle, HandleError> {
        if raw.is_null() {
            return Err(HandleError::invalid(
                "context",
                "a null context cannot be wrapped",
            ));
        }
        let d = init()?;
        let raw = raw as usize;
        if let Some(handle) = lookup_created(raw) {
            return Ok(handle);
        }
        let device =
            run_in(d, raw, || current_device(d)).into_result("cuCtxGetDevice", raw, drop)?;
        identify(raw, device)
    }

    /// The context current on the calling thread, if any.
    ///
    /// A primary context comes back retained and a context created by this crate comes back
    /// sharing its ownership; any other context is borrowed.
    ///
    /// # Errors
    /// [`HandleError::Driver`] when a query fails.
    ///
    /// Driver calls: `cuCtxGetCurrent`; on the first sight of a context on this thread also
    /// `cuCtxGetDevice`, `cuDevicePrimaryCtxGetState`, `cuDevicePrimaryCtxRetain`; `cuCtxGetId`
    /// for a context that is neither primary nor one this crate created.
    pub fn current() -> Result<Option<ContextHandle>, HandleError> {
        let d = driver()?;
        match current_context(d)? {
            0 => Ok(None),
            raw => Ok(Some(context_for_current(raw)?)),
        }
    }

    /// Binds this context to the calling thread (replacing the top of its context stack).
    ///
    /// # Errors
    /// [`HandleError::Driver`] when the driver refuses.
    ///
    /// Driver calls: `cuCtxSetCurrent`.
    pub fn make_current(&self) -> Result<(), HandleError> {
        let d = driver()?;
        // SAFETY: the handle keeps the context alive (or its owner vouched for it).
        let status = unsafe { (d.cuCtxSetCurrent)(self.raw()) };
        check("cuCtxSetCurrent", status)
    }

    /// Unbinds whatever context is current on the calling thread (`cuCtxSetCurrent(NULL)`).
    ///
    /// # Errors
    /// [`HandleError::Driver`] when the driver refuses.
    ///
    /// Driver calls: `cuCtxSetCurrent`.
    pub fn clear_current() -> Result<(), HandleError> {
        let d = driver()?;
        // SAFETY: NULL is always an acceptable argument: it pops the top of the stack.
        let status = unsafe { (d.cuCtxSetCurrent)(std::ptr::null_mut()) };
        check("cuCtxSetCurrent", status)
    }

    /// The raw `CUcontext`, valid while this handle lives.
    #[inline]
    pub fn raw(&self) -> CUcontext {
        as_ctx(self.0.raw)
    }

    /// The device ordinal the context belongs to.
    #[inline]
    pub fn device(&self) -> i32 {
        self.0.device
    }

    /// How the context was obtained and how it will be released.
    pub fn kind(&self) -> ContextKind {
        self.0.kind
    }

    /// Whether both handles share one box (not merely the same raw context).
    pub fn ptr_eq(&self, other: &ContextHandle) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }

    /// Refuses a borrowed context that its owner destroyed: `cuCtxGetId` must still answer
    /// with the id it had when custody first saw it. Free for the contexts custody holds
    /// (primary, created), which live as long as this handle.
    ///
    /// # Errors
    /// [`HandleError::ContextDestroyed`].
    ///
    /// Driver calls: `cuCtxGetId` (borrowed contexts only).
    #[inline]
    pub(crate) fn check_alive(&self) -> Result<(), HandleError> {
        if self.0.kind != ContextKind::Borrowed {
            return Ok(());
        }
        self.check_borrowed_alive()
    }

    #[cold]
    fn check_borrowed_alive(&self) -> Result<(), HandleError> {
        let found = match context_id(driver()?, self.0.raw) {
            Ok(id) if id == self.0.id => return Ok(()),
            Ok(id) => format!(
                "cuCtxGetId names another context (id {id}, not {})",
                self.0.id
            ),
            Err(error) => error,
        };
        Err(HandleError::ContextDestroyed {
            context: self.0.raw as u64,
            found,
        })
    }

    pub(crate) fn raw_usize(&self) -> usize {
        self.0.raw
    }
}

impl ContextHandle {
    /// Blocks the calling thread until all work queued in this context (on every stream of it)
    /// has finished. The caller's context binding is unchanged afterwards.
    ///
    /// # Errors
    /// [`HandleError::Driver`] when the wait fails; [`HandleError::ContextNotActivated`] or
    /// [`HandleError::ContextNotRestored`] when the context switch around it does.
    ///
    /// Driver calls: `cuCtxGetCurrent`, `cuCtxSetCurrent` (when this context is not current),
    /// `cuCtxSynchronize`.
    pub fn synchronize(&self) -> Result<(), HandleError> {
        in_context(self, "cuCtxSynchronize", |d| {
            // SAFETY: takes no arguments; `in_context` makes this context current.
            let status = unsafe { (d.cuCtxSynchronize)() };
            check("cuCtxSynchronize", status)
        })
    }
}

impl PartialEq for ContextHandle {
    fn eq(&self, other: &Self) -> bool {
        self.0.raw == other.0.raw
    }
}

impl Eq for ContextHandle {}

impl fmt::Debug for ContextHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "ContextHandle(0x{:x}, device {}, {:?})",
            self.0.raw, self.0.device, self.0.kind
        )
    }
}

impl Drop for ContextBox {
    fn drop(&mut self) {
        if crate::lifecycle::exiting() {
            return;
        }
        let Ok(d) = driver() else { return };
        let result = match self.kind {
            ContextKind::Borrowed => return,
            ContextKind::Primary => {
                // SAFETY: this box retained the primary context once; this releases it once.
                let status = unsafe { (d.cuDevicePrimaryCtxRelease_v2)(self.device) };
                ("cuDevicePrimaryCtxRelease_v2", status)
            }
            ContextKind::Created => {
                {
                    let mut registry = created_registry().lock().unwrap_or_else(|e| e.into_inner());
                    if registry
                        .get(&self.raw)
                        .is_some_and(|w| w.strong_count() == 0)
                    {
                        registry.remove(&self.raw);
                    }
                }
                // SAFETY: this box created the context and is its last owner.
                let status = unsafe { (d.cuCtxDestroy_v2)(as_ctx(self.raw)) };
                ("cuCtxDestroy_v2", status)
            }
        };
        if let Err(error) = check(result.0, result.1) {
            let raw = self.raw as u64;
            report_leak(Subject::new("context", result.0, raw, 0, raw), error);
        }
    }
}

fn device_of_ordinal(d: &cuda_sys::Driver, ordinal: i32) -> Result<CUdevice, HandleError> {
    let mut device: CUdevice = 0;
    // SAFETY: `device` is a valid out-pointer; read only after success.
    let status = unsafe { (d.cuDeviceGet)(&mut device, ordinal) };
    check("cuDeviceGet", status)?;
    Ok(device)
}

/// The device of the context current on the calling thread.
fn current_device(d: &cuda_sys::Driver) -> Result<CUdevice, HandleError> {
    let mut device: CUdevice = 0;
    // SAFETY: `device` is a valid out-pointer; read only after success.
    let status = unsafe { (d.cuCtxGetDevice)(&mut device) };
    check("cuCtxGetDevice", status)?;
    Ok(device)
}

fn lookup_created(raw: usize) -> Option<ContextHandle> {
    let registry = created_registry().lock().unwrap_or_else(|e| e.into_inner());
    registry
        .get(&raw)
        .and_then(Weak::upgrade)
        .map(ContextHandle)
}

/// A handle for `raw` on `device`: the retained primary context if that is what `raw` is,
/// otherwise a borrowed handle.
fn identify(raw: usize, device: CUdevice) -> Result<ContextHandle, HandleError> {
    let d = driver()?;
    let mut flags = 0u32;
    let mut active = 0i32;
    // SAFETY: both out-pointers are valid; read only after success.
    let status = unsafe { (d.cuDevicePrimaryCtxGetState)(device, &mut flags, &mut active) };
    check("cuDevicePrimaryCtxGetState", status)?;
    if active != 0 {
        let primary = ContextHandle::primary(device)?;
        if primary.0.raw == raw {
            return Ok(primary);
        }
    }
    let id = context_id(d, raw).map_err(|found| HandleError::ContextDestroyed {
        context: raw as u64,
        found,
    })?;
    Ok(ContextHandle(Arc::new(ContextBox {
        raw,
        device,
        kind: ContextKind::Borrowed,
        id,
    })))
}

/// `cuCtxGetId(raw)`: the context's unique id, or what the driver said instead.
fn context_id(d: &Driver, raw: usize) -> Result<u64, String> {
    let mut id: std::ffi::c_ulonglong = 0;
    // SAFETY: `id` is a valid out-pointer, read only after success; the caller's word (or the
    // driver's own answer) vouches for `raw`.
    let status = unsafe { (d.cuCtxGetId)(as_ctx(raw), &mut id) };
    check("cuCtxGetId", status).map_err(|error| error.to_string())?;
    Ok(id)
}

/// A handle for `raw`, which is current on the calling thread. Cached per thread: the common
/// case (the same context as last time) costs no driver call and no allocation.
pub(crate) fn context_for_current(raw: usize) -> Result<ContextHandle, HandleError> {
    let hit = LAST_CONTEXT
        .try_with(|cell| match &*cell.borrow() {
            Some(CacheEntry::Strong(handle)) if handle.0.raw == raw => Some(handle.clone()),
            Some(CacheEntry::Weak(cached, weak)) if *cached == raw => {
                weak.upgrade().map(ContextHandle)
            }
            _ => None,
        })
        .ok()
        .flatten();
    if let Some(handle) = hit {
        return Ok(handle);
    }
    let handle = match lookup_created(raw) {
        Some(handle) => handle,
        None => identify(raw, current_device(driver()?)?)?,
    };
    let entry = match handle.0.kind {
        ContextKind::Primary => Some(CacheEntry::Strong(handle.clone())),
        ContextKind::Created => Some(CacheEntry::Weak(raw, Arc::downgrade(&handle.0))),
        // A borrowed context's raw value can be reused after its owner destroys it: not cached.
        ContextKind::Borrowed => None,
    };
    if let Some(entry) = entry {
        let old = LAST_CONTEXT
            .try_with(|cell| cell.borrow_mut().replace(entry))
            .ok()
            .flatten();
        drop(old);
    }
    Ok(handle)
}

/// Runs fallible driver work `f` in `context` for an explicit operation (see
/// [`Ran::into_result`]).
#[inline]
pub(crate) fn in_context<R>(
    context: &ContextHandle,
    operation: &'static str,
    f: impl FnOnce(&'static Driver) -> Result<R, HandleError>,
) -> Result<R, HandleError> {
    let d = driver()?;
    let target = context.raw_usize();
    run_in(d, target, || f(d)).into_result(operation, target, drop)
}

/// [`in_context`] for work that makes something (a stream, an event): when the restore fails,
/// `undo` gives it back in `context`, which is still current, before the error returns.
#[inline]
pub(crate) fn in_context_or_undo<R>(
    context: &ContextHandle,
    operation: &'static str,
    f: impl FnOnce(&'static Driver) -> Result<R, HandleError>,
    undo: impl FnOnce(&'static Driver, R),
) -> Result<R, HandleError> {
    let d = driver()?;
    let target = context.raw_usize();
    run_in(d, target, || f(d)).into_result(operation, target, |value| undo(d, value))
}

/// Makes a context current for a while and puts the caller's binding back (docs/decisions.md
/// D2), for code outside this crate; this crate uses the same two steps through `run_in`.
///
/// [`ContextScope::enter`] reads the current context and, only if it differs from the target,
/// makes the target current; [`ContextScope::exit`] (or dropping the scope) restores the
/// previous binding with `cuCtxSetCurrent(previous)`, where a previous NULL returns the thread
/// to "no context". Restoring replaces the top of the context stack, so deeper entries of the
/// caller's stack are untouched. The scope never panics: a restore that fails inside `Drop` is
/// reported through the cleanup-error hook.
///
/// The scope borrows the context it made current, so the context outlives it; one entered on a
/// temporary does not compile:
///
/// ```compile_fail
/// # fn main() -> Result<(), handles::HandleError> {
/// let scope = handles::ContextScope::enter(&handles::ContextHandle::primary(0)?)?;
/// // error[E0716]: temporary value dropped while borrowed
/// scope.exit()
/// # }
/// ```
///
/// ```no_run
/// # fn main() -> Result<(), handles::HandleError> {
/// let context = handles::ContextHandle::primary(0)?;
/// let scope = handles::ContextScope::enter(&context)?;
/// // ... driver work that needs `context` current ...
/// scope.exit()
/// # }
/// ```
///
/// The scope is bound to its thread (`!Send`).
#[must_use = "the previous context is restored when the scope ends"]
pub struct ContextScope<'ctx> {
    switch: Switch,
    target: &'ctx ContextHandle,
    done: bool,
    _thread_bound: PhantomData<*const ()>,
}

impl<'ctx> ContextScope<'ctx> {
    /// Makes `target` current on the calling thread if it is not already.
    ///
    /// # Errors
    /// [`HandleError::Driver`] when reading or setting the current context fails; nothing is
    /// changed then.
    ///
    /// Driver calls: `cuCtxGetCurrent`, `cuCtxSetCurrent` (only when the target differs).
    #[inline]
    pub fn enter(target: &'ctx ContextHandle) -> Result<ContextScope<'ctx>, HandleError> {
        let d = driver()?;
        let switch = activate(d, target.raw_usize()).map_err(|f| HandleError::Driver(f.error()))?;
        Ok(ContextScope {
            switch,
            target,
            done: false,
            _thread_bound: PhantomData,
        })
    }

    /// The context that was current when the scope was entered (NULL for none).
    pub fn previous(&self) -> CUcontext {
        as_ctx(self.switch.previous)
    }

    /// Whether entering changed the current context (and so leaving will restore it).
    pub fn switched(&self) -> bool {
        self.switch.switched
    }

    /// Restores the previous binding now and returns the outcome instead of reporting it.
    ///
    /// # Errors
    /// [`HandleError::Driver`] naming `cuCtxSetCurrent` when the restore fails; the target
    /// context is then still current.
    ///
    /// Driver calls: `cuCtxSetCurrent` (only when entering switched).
    pub fn exit(mut self) -> Result<(), HandleError> {
        self.done = true;
        let d = driver()?;
        match restore(d, self.switch) {
            0 => Ok(()),
            status => Err(HandleError::Driver(CudaError::new(
                "cuCtxSetCurrent",
                CudaErrorCode(status),
            ))),
        }
    }
}

impl Drop for ContextScope<'_> {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        self.done = true;
        let Ok(d) = driver() else { return };
        let status = restore(d, self.switch);
        if status != 0 {
            report_restore(
                Subject::context("ContextScope", self.target.raw_usize()),
                Consequence::ContextNotRestored,
                status,
            );
        }
    }
}

impl fmt::Debug for ContextScope<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "ContextScope(previous 0x{:x}, target 0x{:x}, switched {})",
            self.switch.previous,
            self.target.raw_usize(),
            self.switch.switched
        )
    }
}
