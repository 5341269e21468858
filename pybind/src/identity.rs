//! How custody's Python objects compare and hash: by the driver handle or the memory they wrap,
//! with the kind of object mixed into the hash, so that objects of different classes over equal
//! raw values hash apart.

use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};

use pyo3::prelude::*;
use pyo3::pyclass::boolean_struct::True;
use pyo3::pyclass::CompareOp;
use pyo3::PyClass;

/// A hash of `(kind, raw)`: objects of different kinds that wrap equal raw values hash apart.
pub(crate) fn hash_of(kind: &str, raw: u64) -> u64 {
    let mut hasher = DefaultHasher::new();
    kind.hash(&mut hasher);
    raw.hash(&mut hasher);
    hasher.finish()
}

/// `__richcmp__` of a class `T` whose objects are compared by `equal`: its answer for `==`, the
/// opposite for `!=`; `NotImplemented` for the orderings and for an object of another class.
///
/// # Errors
/// What making the answer's `bool` raises (nothing in practice).
pub(crate) fn compare<T>(
    other: &Bound<'_, PyAny>,
    op: CompareOp,
    equal: impl FnOnce(&T) -> bool,
) -> PyResult<Py<PyAny>>
where
    T: PyClass<Frozen = True> + Sync,
{
    let py = other.py();
    let Ok(other) = other.cast::<T>() else {
        return Ok(py.NotImplemented());
    };
    let answer = match op {
        CompareOp::Eq => equal(other.get()),
        CompareOp::Ne => !equal(other.get()),
        _ => return Ok(py.NotImplemented()),
    };
    Ok(answer.into_pyobject(py)?.to_owned().into_any().unbind())
}

/// `__richcmp__` of a class `T` whose objects wrap a driver handle that `close()` lets go of
/// (`Stream`, `Event`), as [`compare`] answers it: an object is equal to itself, and to another
/// object of its class over the same raw handle while both are open (`open_raw`: the raw handle,
/// `None` once closed).
///
/// # Errors
/// As [`compare`].
pub(crate) fn compare_handles<T>(
    this: &T,
    other: &Bound<'_, PyAny>,
    op: CompareOp,
    open_raw: impl Fn(&T) -> Option<usize>,
) -> PyResult<Py<PyAny>>
where
    T: PyClass<Frozen = True> + Sync,
{
    compare(other, op, |other: &T| {
        std::ptr::eq(this, other) || open_raw(this).is_some_and(|raw| open_raw(other) == Some(raw))
    })
}
