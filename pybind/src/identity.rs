//! How custody's Python objects hash: by the driver handle or the memory they wrap, with the
//! kind of object mixed in, so that objects of different classes over equal raw values hash
//! apart.

use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};

/// A hash of `(kind, raw)`: objects of different kinds that wrap equal raw values hash apart.
pub(crate) fn hash_of(kind: &str, raw: u64) -> u64 {
    let mut hasher = DefaultHasher::new();
    kind.hash(&mut hasher);
    raw.hash(&mut hasher);
    hasher.finish()
}
