//! [`DeallocationRecipe`]: the stream, context and (for the per-thread default stream) thread
//! that a free needs, recorded when memory is allocated or adopted (docs/decisions.md D1).

use std::cell::Cell;
use std::fmt;
use std::num::NonZeroU64;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::context::{context_for_current, ContextHandle};
use crate::error::HandleError;
use crate::stream::{unbound_token, DefaultStream, StreamHandle};
use crate::sys::{current_context, driver};

/// A process-unique identity for a host thread.
///
/// A token is never reused in the life of the process (as `std::thread::ThreadId` is not), so
/// a recipe cannot mistake a new thread for the one that recorded it; unlike a `ThreadId` it is
/// a plain non-zero integer, which reports and warnings carry as it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ThreadToken(NonZeroU64);

static NEXT_THREAD: AtomicU64 = AtomicU64::new(1);

thread_local! {
    static THIS_THREAD: Cell<u64> = const { Cell::new(0) };
}

impl ThreadToken {
    /// The calling thread's token (assigned on first use).
    #[inline]
    pub fn current() -> ThreadToken {
        let value = THIS_THREAD
            .try_with(|cell| {
                let value = cell.get();
                if value != 0 {
                    return value;
                }
                let value = NEXT_THREAD.fetch_add(1, Ordering::Relaxed);
                cell.set(value);
                value
            })
            // During thread-local destruction: a fresh value, equal to no recorded thread.
            .unwrap_or_else(|_| NEXT_THREAD.fetch_add(1, Ordering::Relaxed));
        // The counter starts at 1 and a u64 does not wrap in the life of a process.
        ThreadToken(NonZeroU64::new(value).unwrap_or(NonZeroU64::MAX))
    }

    /// The token as an integer (never 0).
    pub fn value(self) -> u64 {
        self.0.get()
    }
}

/// The stream and context that will order and legalise a free.
///
/// Recorded when memory is allocated or adopted, replaced wholesale by
/// [`DevicePtrHandle::set_deallocation_stream`](crate::DevicePtrHandle::set_deallocation_stream),
/// and used once, by whoever drops the last handle. A created stream brings its own context; a
/// foreign stream the context the driver reported when it was wrapped; a default-stream token
/// is bound to the context current when the recipe is recorded, and a per-thread-default-stream
/// recipe also remembers the recording thread. The recipe holds the stream and the context, so
/// neither can be destroyed before the free runs.
///
/// # Errors
/// Recording fails with [`HandleError::NoCurrentContext`] when the stream is an unbound
/// default-stream token and no context is current on the calling thread.
///
/// Driver calls: `cuCtxGetCurrent` (recording a token), `cuCtxSetCurrent` and the free
/// (teardown).
#[derive(Clone)]
pub struct DeallocationRecipe {
    bound: Bound,
    ptds_thread: Option<ThreadToken>,
    /// The context's raw value, copied so that teardown compares it with the current context
    /// without reaching into the context's box.
    context_raw: usize,
}

/// The last reference to a recipe's stream or context, returned by
/// [`DeallocationRecipe::into_last_references`]; dropping it destroys the stream or releases the
/// context (driver calls).
pub struct RecipeRemains {
    /// Held only for its drop.
    _last: Box<dyn Send>,
}

impl fmt::Debug for RecipeRemains {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("RecipeRemains")
    }
}

/// How the stream and the context are held: one handle when the stream carries its context
/// (one atomic increment per recipe instead of two), a token kind and a context otherwise.
#[derive(Clone)]
enum Bound {
    /// A created or foreign stream, or a bound token: the stream's context is the recipe's.
    Stream(StreamHandle),
    /// An unbound default-stream token, bound to the context current at recording.
    Token(DefaultStream, ContextHandle),
}

impl DeallocationRecipe {
    /// Gives up this recipe's stream and context. When the recipe held the last reference to
    /// either, returns what remains, whose drop may make a driver call (`cuStreamDestroy` for
    /// a created stream, a context release): the caller chooses where to drop it (a binding:
    /// with the interpreter lock released). `None` when it held no last reference: then nothing
    /// was destroyed and no driver call was made. Atomic against other holders, so a
    /// concurrent drop elsewhere cannot make this recipe's release the last one unnoticed.
    pub fn into_last_references(self) -> Option<RecipeRemains> {
        match self.bound {
            Bound::Stream(stream) => stream.into_last().map(|_last| RecipeRemains { _last }),
            Bound::Token(_, context) => context.into_last().map(|_last| RecipeRemains { _last }),
        }
    }

    /// Records a recipe for `stream` on the calling thread.
    ///
    /// # Errors
    /// [`HandleError::NoCurrentContext`] for an unbound token with no current context;
    /// [`HandleError::Driver`] when reading the current context fails;
    /// [`HandleError::ContextDestroyed`] for a stream whose context, one custody does not hold
    /// (made by other code), was destroyed by its owner (docs/decisions.md D4).
    ///
    /// Driver calls: `cuCtxGetCurrent` (unbound tokens only; the first time a context is seen
    /// on a thread also `cuCtxGetDevice`, `cuDevicePrimaryCtxGetState`,
    /// `cuDevicePrimaryCtxRetain`, and for a context custody does not hold `cuCtxGetId`);
    /// `cuCtxGetId` for a stream whose context custody does not hold.
    pub fn record(stream: &StreamHandle) -> Result<DeallocationRecipe, HandleError> {
        let current = match stream.unbound_kind() {
            None => 0, // the stream carries its context: nothing to read
            Some(_) => current_context(driver()?)?,
        };
        DeallocationRecipe::bind_with_current(stream, current)
    }

    /// [`DeallocationRecipe::record`], then checked against `device` (the memory's, when known):
    /// what every recipe of memory and every declared use is recorded with.
    ///
    /// # Errors
    /// As [`DeallocationRecipe::record`]; [`HandleError::WrongDevice`] for a stream of another
    /// device.
    // Always inlined: a call here moves the 80-byte result twice, on every allocation of a
    // caching resource and every recipe swap (callgrind: +35 instructions per
    // `set_deallocation_stream`).
    #[inline(always)]
    pub(crate) fn record_for(
        stream: &StreamHandle,
        device: Option<i32>,
    ) -> Result<DeallocationRecipe, HandleError> {
        let recipe = DeallocationRecipe::record(stream)?;
        recipe.check_device(device)?;
        Ok(recipe)
    }

    /// Binds `stream` given the context current on the calling thread (`current`, 0 for none),
    /// which the caller has just read: no driver call on the common paths.
    #[inline]
    pub(crate) fn bind_with_current(
        stream: &StreamHandle,
        current: usize,
    ) -> Result<DeallocationRecipe, HandleError> {
        let ptds_thread =
            (stream.default_kind() == Some(DefaultStream::PerThread)).then(ThreadToken::current);
        let (bound, context_raw) = match stream.unbound_kind() {
            None => {
                // D4: a context made by other code may have been destroyed by it since.
                stream.carried_context().check_alive()?;
                (
                    Bound::Stream(stream.clone()),
                    stream.carried_context().raw_usize(),
                )
            }
            Some(kind) => {
                if current == 0 {
                    return Err(HandleError::NoCurrentContext);
                }
                (Bound::Token(kind, context_for_current(current)?), current)
            }
        };
        Ok(DeallocationRecipe {
            bound,
            ptds_thread,
            context_raw,
        })
    }

    /// A recipe from parts the caller already holds, with no driver call: `stream` in
    /// `context`. A per-thread-default-stream token records the calling thread.
    ///
    /// # Errors
    /// [`HandleError::InvalidArgument`] when `stream` carries a different context than
    /// `context`.
    pub fn with_context(
        stream: &StreamHandle,
        context: &ContextHandle,
    ) -> Result<DeallocationRecipe, HandleError> {
        if let Some(own) = stream.context() {
            if own != context {
                return Err(HandleError::invalid(
                    "stream",
                    format!(
                        "the stream belongs to context 0x{:x}, not 0x{:x}",
                        own.raw_usize(),
                        context.raw_usize()
                    ),
                ));
            }
        }
        let bound = match stream.unbound_kind() {
            None => Bound::Stream(stream.clone()),
            Some(kind) => Bound::Token(kind, context.clone()),
        };
        Ok(DeallocationRecipe {
            bound,
            ptds_thread: (stream.default_kind() == Some(DefaultStream::PerThread))
                .then(ThreadToken::current),
            context_raw: context.raw_usize(),
        })
    }

    /// Checks that the recipe's context is on `device` (the memory's, when known).
    ///
    /// # Errors
    /// [`HandleError::WrongDevice`] for another device.
    pub(crate) fn check_device(&self, device: Option<i32>) -> Result<(), HandleError> {
        match device {
            Some(expected) if self.context().device() != expected => {
                Err(HandleError::WrongDevice {
                    expected,
                    found: self.context().device(),
                })
            }
            _ => Ok(()),
        }
    }

    /// The stream the free is ordered on (for a token, resolved in [`Self::context`]).
    #[inline]
    pub fn stream(&self) -> &StreamHandle {
        match &self.bound {
            Bound::Stream(stream) => stream,
            Bound::Token(kind, _) => unbound_token(*kind),
        }
    }

    /// The context the free runs in.
    #[inline]
    pub fn context(&self) -> &ContextHandle {
        match &self.bound {
            Bound::Stream(stream) => stream.carried_context(),
            Bound::Token(_, context) => context,
        }
    }

    /// The context's raw value, without touching the context's box.
    #[inline]
    pub(crate) fn context_raw(&self) -> usize {
        self.context_raw
    }

    /// The thread that recorded a per-thread-default-stream recipe; `None` otherwise.
    #[inline]
    pub fn ptds_thread(&self) -> Option<ThreadToken> {
        self.ptds_thread
    }

    /// Whether a free with this recipe on the calling thread is a per-thread-default-stream free
    /// away from the recording thread: then it is issued on the legacy stream of the recipe's
    /// context, which waits for the recording thread's per-thread stream (docs/decisions.md D6,
    /// docs/driver-facts.md F14), where this thread's own per-thread stream would not (F12, F15).
    /// `false` for every other recipe. No driver call.
    #[inline]
    pub fn is_other_thread(&self) -> bool {
        match self.ptds_thread {
            None => false,
            Some(recorded) => recorded != ThreadToken::current(),
        }
    }

    /// Whether `other` names the same stream in the same context (and, for the per-thread
    /// default stream, the same recording thread): a second use of it orders nothing more.
    #[inline]
    pub(crate) fn same_target(&self, other: &DeallocationRecipe) -> bool {
        self.stream().raw_usize() == other.stream().raw_usize()
            && self.context_raw == other.context_raw
            && self.ptds_thread == other.ptds_thread
    }

    /// The stream a free with this recipe is issued on when it runs on the calling thread: the
    /// recorded stream, except for a per-thread-default-stream recipe away from its recording
    /// thread ([`DeallocationRecipe::is_other_thread`]), which gives the unbound legacy token
    /// (`CU_STREAM_LEGACY`), resolved in the recipe's context. No driver call.
    #[inline]
    pub fn free_stream(&self) -> &StreamHandle {
        self.free_target().0
    }

    /// [`DeallocationRecipe::free_stream`] and [`DeallocationRecipe::is_other_thread`] at once
    /// (the thread is read once).
    #[inline]
    pub(crate) fn free_target(&self) -> (&StreamHandle, bool) {
        if self.is_other_thread() {
            (unbound_token(DefaultStream::Legacy), true)
        } else {
            (self.stream(), false)
        }
    }
}

impl fmt::Debug for DeallocationRecipe {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "DeallocationRecipe(stream 0x{:x}, context 0x{:x}",
            self.stream().raw_usize(),
            self.context().raw_usize()
        )?;
        if let Some(thread) = self.ptds_thread {
            write!(f, ", ptds thread {}", thread.value())?;
        }
        f.write_str(")")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thread_tokens_are_unique_and_stable() {
        let here = ThreadToken::current();
        assert_eq!(here, ThreadToken::current());
        let other = std::thread::spawn(ThreadToken::current).join().unwrap();
        let third = std::thread::spawn(ThreadToken::current).join().unwrap();
        assert_ne!(here, other);
        assert_ne!(
            other, third,
            "a token is never reused after its thread exits"
        );
        assert_ne!(here.value(), 0);
    }
}
