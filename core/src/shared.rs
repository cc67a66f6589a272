//! Values many objects hold the same copy of, and the interner that makes them one copy.
//!
//! The pods of one Deployment carry the same labels, tolerations, affinity and spread
//! constraints. A [`Shared`] field holds them behind an `Arc`, and an [`Interner`] (kept by a
//! cache that converts objects as they arrive) hands every equal value the same `Arc`, so a
//! cluster of 300,000 pods keeps each distinct value once rather than once per pod. Cloning a
//! pod then copies pointers, not maps.
//!
//! `Shared` reads like the value it holds (`Deref`), and writing through it (`DerefMut`)
//! copies the value first when another holder shares it (`Arc::make_mut`), so code that builds
//! or edits a pod does not see the sharing.

use std::borrow::Borrow;
use std::collections::HashSet;
use std::fmt;
use std::hash::{Hash, Hasher};
use std::ops::{Deref, DerefMut};
use std::sync::Arc;

/// A value behind an `Arc`, copied on write.
#[derive(Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct Shared<T>(Arc<T>);

impl<T> Shared<T> {
    pub fn new(value: T) -> Self {
        Shared(Arc::new(value))
    }

    /// Whether two handles hold the very same copy (not merely equal values).
    pub fn same(a: &Self, b: &Self) -> bool {
        Arc::ptr_eq(&a.0, &b.0)
    }
}

impl<T> Clone for Shared<T> {
    fn clone(&self) -> Self {
        Shared(Arc::clone(&self.0))
    }
}

impl<T> Deref for Shared<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0
    }
}

impl<T: Clone> DerefMut for Shared<T> {
    /// Copies the value first if another holder shares it.
    fn deref_mut(&mut self) -> &mut T {
        Arc::make_mut(&mut self.0)
    }
}

impl<T> From<T> for Shared<T> {
    fn from(value: T) -> Self {
        Shared::new(value)
    }
}

impl<T: Hash> Hash for Shared<T> {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.0.hash(state);
    }
}

impl<T: fmt::Debug> fmt::Debug for Shared<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl<'a, T> IntoIterator for &'a Shared<T>
where
    &'a T: IntoIterator,
{
    type Item = <&'a T as IntoIterator>::Item;
    type IntoIter = <&'a T as IntoIterator>::IntoIter;
    fn into_iter(self) -> Self::IntoIter {
        (&*self.0).into_iter()
    }
}

/// Looks a `Shared` up by the value it holds.
struct Entry<T>(Arc<T>);

impl<T: PartialEq> PartialEq for Entry<T> {
    fn eq(&self, other: &Self) -> bool {
        *self.0 == *other.0
    }
}

impl<T: Eq> Eq for Entry<T> {}

impl<T: Hash> Hash for Entry<T> {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.0.hash(state);
    }
}

impl<T> Borrow<T> for Entry<T> {
    fn borrow(&self) -> &T {
        &self.0
    }
}

/// One copy of each distinct value. Values no object holds any more are swept when the set
/// has doubled since the last sweep, so the set stays within twice the values in use.
pub struct Interner<T> {
    values: HashSet<Entry<T>>,
    swept_at: usize,
}

impl<T> Default for Interner<T> {
    fn default() -> Self {
        Interner { values: HashSet::new(), swept_at: 0 }
    }
}

impl<T: Hash + Eq> Interner<T> {
    /// The one copy of `value`'s value (`value` itself, when it is the first of its value).
    pub fn intern(&mut self, value: &mut Shared<T>) {
        if let Some(Entry(canonical)) = self.values.get::<T>(&value.0) {
            value.0 = Arc::clone(canonical);
            return;
        }
        if self.values.len() >= 2 * self.swept_at.max(512) {
            self.sweep();
        }
        self.values.insert(Entry(Arc::clone(&value.0)));
    }

    /// Drops the values only the interner holds.
    pub fn sweep(&mut self) {
        self.values.retain(|e| Arc::strong_count(&e.0) > 1);
        self.swept_at = self.values.len();
    }

    /// How many distinct values are kept.
    pub fn len(&self) -> usize {
        self.values.len()
    }

    pub fn is_empty(&self) -> bool {
        self.values.is_empty()
    }
}

/// A map keyed by what every planning round hashes over the whole cluster (node names,
/// provider ids, pod indices, topology domains): hashed with foldhash, not SipHash. These maps
/// live for one round or one solve, so keys chosen to collide could slow that round and no
/// more; SipHash's resistance to them was 8-12% of the soak's profile. Maps an actor keeps
/// stay on SipHash.
pub type FastMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;

/// A set hashed as [`FastMap`] is.
pub type FastSet<K> = std::collections::HashSet<K, foldhash::fast::RandomState>;

/// FNV-1a (64 bits): a hash stable across processes and versions, for names and fingerprints
/// derived from content (launch templates, client tokens, NodePool template hashes).
#[derive(Clone, Copy, Debug)]
pub struct Fnv(u64);

impl Default for Fnv {
    fn default() -> Self {
        Fnv(0xcbf2_9ce4_8422_2325)
    }
}

impl Fnv {
    pub fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 ^= u64::from(*b);
            self.0 = self.0.wrapping_mul(0x0100_0000_01b3);
        }
    }

    pub fn write_u64(&mut self, v: u64) {
        self.write(&v.to_le_bytes());
    }

    pub fn finish(&self) -> u64 {
        self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_values_become_one_copy_and_writes_copy_first() {
        let mut interner = Interner::default();
        let mut a = Shared::new(vec![1, 2]);
        let mut b = Shared::new(vec![1, 2]);
        let mut c = Shared::new(vec![3]);
        interner.intern(&mut a);
        interner.intern(&mut b);
        interner.intern(&mut c);
        assert!(Shared::same(&a, &b));
        assert!(!Shared::same(&a, &c));
        assert_eq!(interner.len(), 2);

        b.push(3);
        assert_eq!(*a, vec![1, 2], "a write through one holder leaves the others alone");
        assert_eq!(*b, vec![1, 2, 3]);
        assert!(!Shared::same(&a, &b));
    }

    #[test]
    fn values_no_one_holds_are_swept() {
        let mut interner = Interner::default();
        let mut kept = Shared::new(0_u32);
        interner.intern(&mut kept);
        for i in 1..2000_u32 {
            let mut v = Shared::new(i);
            interner.intern(&mut v);
        }
        assert!(interner.len() <= 1024, "swept as it grew: {} kept", interner.len());
        interner.sweep();
        assert_eq!(interner.len(), 1);
        let mut again = Shared::new(0_u32);
        interner.intern(&mut again);
        assert!(Shared::same(&kept, &again), "a value still held stays the one copy");
    }
}
