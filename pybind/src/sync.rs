//! `Mutex::lock` as every module of the bindings takes it: a lock that a panic poisoned is taken
//! as it is, since what each one guards is swapped or cloned whole, never left half-changed.

use std::sync::{Mutex, MutexGuard, PoisonError};

/// [`Mutex::lock`], poisoned or not.
pub(crate) trait Locked<T> {
    /// The guard; a poisoned lock's too.
    fn locked(&self) -> MutexGuard<'_, T>;
}

impl<T> Locked<T> for Mutex<T> {
    #[inline]
    fn locked(&self) -> MutexGuard<'_, T> {
        self.lock().unwrap_or_else(PoisonError::into_inner)
    }
}
