//! The family that frees nothing: memory an owner object keeps alive (the owner is dropped with
//! the box, [`crate::raw::with_owner`]) or that is merely borrowed ([`crate::raw::borrowed`]).
//! It has no recipe, so recipe changes and declared uses record nothing for it, and it never
//! needs a context: said here once for every place that asks ([`Family::needs_recipe`]).

use std::any::Any;
use std::borrow::Cow;

use super::{Family, Free, Issued, ReleaseKind};
use crate::stream::StreamHandle;

/// Owner-kept (`owner`) or borrowed (`None`) memory.
pub(crate) struct Kept {
    /// Held only for its drop, with the box.
    pub(crate) owner: Option<Box<dyn Any + Send + Sync>>,
}

impl Family for Kept {
    fn kind(&self) -> ReleaseKind {
        match self.owner {
            Some(_) => ReleaseKind::Owner,
            None => ReleaseKind::NonOwning,
        }
    }

    fn needs_recipe(&self) -> bool {
        false
    }

    fn resource(&self) -> Cow<'static, str> {
        Cow::Borrowed(match self.owner {
            Some(_) => "owner-kept memory",
            None => "borrowed memory",
        })
    }

    fn operation(&self) -> &'static str {
        "none"
    }

    fn looks_first(&self, _stream: &StreamHandle, _explicit: bool) -> bool {
        false
    }

    fn issue(&mut self, _free: &Free<'_>) -> Issued {
        Issued::Done(Ok(()))
    }
}
