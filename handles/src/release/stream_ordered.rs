//! The stream-ordered family: pool memory (`cuMemAllocFromPoolAsync`, holding its pool) and
//! the device's current pool's (`cuMemAllocAsync`), freed with `cuMemFreeAsync` on the recipe's
//! stream. The hot path: on a created or wrapped stream, no context call at all (D2, F4, F8).

use std::borrow::Cow;

use cuda_sys::types::CUstream;
use cuda_sys::Driver;

use super::{finish, Family, Free, Issued, Outcome, ReleaseKind};
use crate::pool::MemoryPoolHandle;
use crate::scope::Ran;
use crate::stream::StreamHandle;

/// The pool an allocation came from. An owned pool is embedded (it must outlive the
/// allocation); a borrowed pool (a device's default or current pool) is kept as its raw value,
/// since a handle to it would keep nothing alive and would cost an atomic increment and
/// decrement per allocation on the hot path.
pub(crate) enum PoolRef {
    Owned(MemoryPoolHandle),
    Borrowed { raw: usize, device: Option<i32> },
}

impl PoolRef {
    #[inline]
    pub(crate) fn of(pool: &MemoryPoolHandle) -> PoolRef {
        if pool.is_owned() {
            PoolRef::Owned(pool.clone())
        } else {
            PoolRef::Borrowed {
                raw: pool.raw() as usize,
                device: pool.device(),
            }
        }
    }

    pub(crate) fn handle(&self) -> MemoryPoolHandle {
        match self {
            PoolRef::Owned(pool) => pool.clone(),
            PoolRef::Borrowed { raw, device } => {
                MemoryPoolHandle::borrowed_unchecked(*raw, *device)
            }
        }
    }
}

/// Pool memory (`pool`: its pool) or the device's current pool's (`pool: None`).
pub(crate) struct StreamOrdered {
    pub(crate) pool: Option<PoolRef>,
}

impl Family for StreamOrdered {
    #[inline]
    fn kind(&self) -> ReleaseKind {
        match self.pool {
            Some(_) => ReleaseKind::Pool,
            None => ReleaseKind::Async,
        }
    }

    fn resource(&self) -> Cow<'static, str> {
        Cow::Borrowed(match self.pool {
            Some(_) => "pool allocation",
            None => "stream-ordered allocation",
        })
    }

    fn operation(&self) -> &'static str {
        "cuMemFreeAsync"
    }

    /// A free on a default-stream token may run on the legacy stream, blocked by a capture; on
    /// a created or wrapped stream the free finds a capture from its own refusal (F16).
    #[inline]
    fn looks_first(&self, stream: &StreamHandle, _explicit: bool) -> bool {
        !stream.identifies_its_context()
    }

    #[inline]
    fn issue(&mut self, free: &Free<'_>) -> Issued {
        free_async(self, free)
    }

    fn undo(&self, d: &'static Driver, ptr: u64, stream: CUstream) {
        let _ = free_async_raw(d, ptr, stream);
    }

    fn pool(&self) -> Option<&PoolRef> {
        self.pool.as_ref()
    }
}

/// `cuMemFreeAsync(ptr, stream)`: the status. The caller owns the pointer and frees it once;
/// it keeps the stream alive, with the context it needs current (none for a created or wrapped
/// stream, F4, F8).
#[inline]
pub(crate) fn free_async_raw(d: &Driver, ptr: u64, stream: CUstream) -> u32 {
    // SAFETY: as the caller promises above.
    unsafe { (d.cuMemFreeAsync)(ptr, stream) }
}

/// The stream-ordered free of `family`'s memory (also a graph allocation's): raw statuses,
/// nothing built unless something went wrong. On a created or wrapped stream with no context
/// call (D2); on a token in the recipe's context.
#[inline]
pub(crate) fn free_async(family: &impl Family, free: &Free<'_>) -> Issued {
    let (d, ptr, raw_stream) = (free.d, free.ptr, free.stream.raw());
    let ran = free.run(|| free_async_raw(d, ptr, raw_stream));
    match ran {
        Ran::Done {
            value: 0,
            restore: 0,
            ..
        } => Issued::Done(Ok(())),
        Ran::Done { value, .. } if value != 0 => Issued::Refused(ran),
        ran => Issued::Done(not_restored(family, ran, free)),
    }
}

/// The free ran but the context was not activated or restored.
#[cold]
#[inline(never)]
fn not_restored(family: &impl Family, ran: Ran<u32>, free: &Free<'_>) -> Outcome {
    let ran = ran.map(super::checked("cuMemFreeAsync"));
    finish(
        ran,
        family,
        "cuMemFreeAsync",
        free.ptr,
        free.recipe,
        free.explicit,
    )
}
