//! Vector clocks for the stream-order hazard checker.
//!
//! A component is a stream handle; its value counts the operations enqueued on that stream. A
//! clock `C` says "everything up to time `C[s]` on stream `s` happens before me".

use std::collections::BTreeMap;

/// A sparse vector clock: absent components are 0.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct VectorClock(BTreeMap<u64, u64>);

impl VectorClock {
    /// The time of component `c`.
    pub(crate) fn get(&self, c: u64) -> u64 {
        self.0.get(&c).copied().unwrap_or(0)
    }

    /// Advances component `c` by one and returns its new time.
    pub(crate) fn tick(&mut self, c: u64) -> u64 {
        let t = self.0.entry(c).or_insert(0);
        *t += 1;
        *t
    }

    /// Raises component `c` to at least `t`.
    pub(crate) fn raise(&mut self, c: u64, t: u64) {
        let e = self.0.entry(c).or_insert(0);
        if *e < t {
            *e = t;
        }
    }

    /// Component-wise maximum with `other`.
    pub(crate) fn merge(&mut self, other: &VectorClock) {
        for (&c, &t) in &other.0 {
            self.raise(c, t);
        }
    }

    /// The components and their times.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.0.iter().map(|(&c, &t)| (c, t))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merge_takes_maxima() {
        let mut a = VectorClock::default();
        a.tick(1);
        a.tick(1);
        let mut b = VectorClock::default();
        b.tick(1);
        b.tick(2);
        b.merge(&a);
        assert_eq!(b.get(1), 2);
        assert_eq!(b.get(2), 1);
        assert_eq!(b.get(3), 0);
    }
}
