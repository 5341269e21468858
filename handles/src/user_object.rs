//! [`UserObjectOwnership`]: one reference to a CUDA user object whose payload is a Rust value,
//! the primitive through which graphs keep Rust values (buffers) alive and hand them to the
//! deferred-cleanup queue when the driver lets go (docs/decisions.md D7).

use std::any::Any;
use std::fmt;

use cuda_sys::types::{CUgraph, CUuserObject};

use crate::context::in_context;
use crate::context::ContextHandle;
use crate::deferred::{ensure_worker, user_object_destructor, Node};
use crate::error::HandleError;
use crate::scope::destroy_in_context;
use crate::sys::check;

/// `CU_USER_OBJECT_NO_DESTRUCTOR_SYNC`.
const USER_OBJECT_NO_DESTRUCTOR_SYNC: u32 = 1;
/// `CU_GRAPH_USER_OBJECT_MOVE`.
const GRAPH_USER_OBJECT_MOVE: u32 = 1;

/// One reference to a CUDA user object whose payload is a Rust value.
///
/// Made with `CU_USER_OBJECT_NO_DESTRUCTOR_SYNC`; its destructor only queues the payload for
/// the cleanup worker (no lock, no driver call), so the payload (a buffer, a stream, anything
/// `Send`) is dropped on the worker or in [`crate::drain_deferred_cleanup`], where its frees
/// run with their recipes. Move the reference into a graph with
/// [`UserObjectOwnership::move_into_graph`]; dropping it instead releases it.
pub struct UserObjectOwnership {
    raw: usize,
    context: ContextHandle,
    held: bool,
}

impl UserObjectOwnership {
    /// Wraps `payload` in a new user object (one reference, held by the returned value), with
    /// `context` current. Starts the cleanup worker if it is not running.
    ///
    /// # Errors
    /// [`HandleError::Driver`] when the creation fails; the payload is then dropped on the
    /// calling thread.
    ///
    /// Driver calls: `cuCtxGetCurrent`, `cuCtxSetCurrent` (if needed), `cuUserObjectCreate`;
    /// `cuUserObjectRelease` when dropped unmoved.
    pub fn new(
        context: &ContextHandle,
        payload: Box<dyn Any + Send>,
    ) -> Result<UserObjectOwnership, HandleError> {
        UserObjectOwnership::try_new(context, payload).map_err(|(error, payload)| {
            drop(payload);
            error
        })
    }

    /// [`UserObjectOwnership::new`], giving the payload back when the creation fails, so that
    /// the caller decides where it goes (a free handed to a capture must not recurse into its
    /// own drop).
    pub(crate) fn try_new(
        context: &ContextHandle,
        payload: Box<dyn Any + Send>,
    ) -> Result<UserObjectOwnership, (HandleError, Box<dyn Any + Send>)> {
        ensure_worker();
        let data = Node::leak_payload(payload);
        let created = in_context(context, "cuUserObjectCreate", |d| {
            let mut raw: CUuserObject = std::ptr::null_mut();
            // SAFETY: `raw` is a valid out-pointer; `data` stays valid until the destructor
            // takes it back, exactly once.
            let status = unsafe {
                (d.cuUserObjectCreate)(
                    &mut raw,
                    data.cast(),
                    Some(user_object_destructor),
                    1,
                    USER_OBJECT_NO_DESTRUCTOR_SYNC,
                )
            };
            check("cuUserObjectCreate", status).map(|()| raw as usize)
        });
        match created {
            Ok(raw) => Ok(UserObjectOwnership {
                raw,
                context: context.clone(),
                held: true,
            }),
            Err(error) => {
                // SAFETY: the driver did not take `data` (creation failed): it is still ours,
                // reclaimed once.
                let payload = unsafe { Node::reclaim_payload(data) };
                Err((error, payload))
            }
        }
    }

    /// The raw `CUuserObject`.
    pub fn raw(&self) -> CUuserObject {
        self.raw as CUuserObject
    }

    /// Moves this reference into the raw graph `graph` (`CU_GRAPH_USER_OBJECT_MOVE`), alive for
    /// the call; for [`UserObjectOwnership::move_into_graph`].
    ///
    /// # Errors
    /// As [`UserObjectOwnership::move_into_graph`].
    pub(crate) fn move_into_raw_graph(mut self, graph: CUgraph) -> Result<(), HandleError> {
        let raw = self.raw;
        in_context(&self.context, "cuGraphRetainUserObject", |d| {
            // SAFETY: we hold one reference to the user object and the caller keeps the graph
            // alive for the call.
            let status = unsafe {
                (d.cuGraphRetainUserObject)(graph, raw as CUuserObject, 1, GRAPH_USER_OBJECT_MOVE)
            };
            check("cuGraphRetainUserObject", status)
        })?;
        self.held = false;
        Ok(())
    }
}

impl UserObjectOwnership {
    /// Makes `graph` (a raw graph, alive for the call: the graph a stream is being captured
    /// into) take a reference of its own (flags 0); this one stays held.
    ///
    /// # Errors
    /// [`HandleError::Driver`] when the driver refuses.
    ///
    /// Driver calls: `cuCtxGetCurrent`, `cuCtxSetCurrent` (if needed), `cuGraphRetainUserObject`.
    pub(crate) fn retain_in_raw_graph(&self, graph: CUgraph) -> Result<(), HandleError> {
        let raw = self.raw;
        in_context(&self.context, "cuGraphRetainUserObject", |d| {
            // SAFETY: the caller keeps `graph` alive for the call; we hold a reference to the
            // user object; flags 0 makes the graph take one of its own.
            let status = unsafe { (d.cuGraphRetainUserObject)(graph, raw as CUuserObject, 1, 0) };
            check("cuGraphRetainUserObject", status)
        })
    }
}

impl Drop for UserObjectOwnership {
    fn drop(&mut self) {
        if !self.held {
            return;
        }
        let raw = self.raw;
        destroy_in_context(
            "user object",
            "cuUserObjectRelease",
            raw,
            self.context.raw_usize(),
            |d| {
                // SAFETY: we hold exactly one reference and give it up.
                unsafe { (d.cuUserObjectRelease)(raw as CUuserObject, 1) }
            },
        );
    }
}

impl fmt::Debug for UserObjectOwnership {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "UserObjectOwnership(0x{:x}, held {})",
            self.raw, self.held
        )
    }
}
