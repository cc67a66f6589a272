//! An ordered map that is cheap to clone: its entries sit in sorted chunks of at most
//! [`CHUNK`] entries, each shared behind an `Arc`. A clone copies one pointer per chunk (a
//! cluster of 300,000 pods: about 2,300), not every entry; a write copies the one chunk it
//! changes if a clone still shares it. So a cache can hand out a snapshot of every pod while
//! holding its lock for microseconds, and the watches that write the cache never wait for a
//! copy of it.

use std::borrow::Borrow;
use std::collections::BTreeMap;
use std::ops::Bound;
use std::sync::Arc;

/// Most entries a chunk holds: one full chunk is split in two.
pub const CHUNK: usize = 128;

/// The map: chunks by their first key, each a sorted map of up to [`CHUNK`] entries; no
/// chunk is empty, and chunks do not overlap.
#[derive(Clone, Debug)]
pub struct ChunkedMap<K, V> {
    chunks: BTreeMap<K, Arc<BTreeMap<K, V>>>,
    len: usize,
}

impl<K, V> Default for ChunkedMap<K, V> {
    fn default() -> Self {
        ChunkedMap { chunks: BTreeMap::new(), len: 0 }
    }
}

impl<K: Ord + Clone, V: Clone> ChunkedMap<K, V> {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The first key of the chunk that holds (or would hold) `key`: the last chunk starting
    /// at or before it, else the first chunk.
    fn chunk_of<Q>(&self, key: &Q) -> Option<&K>
    where
        K: Borrow<Q>,
        Q: Ord + ?Sized,
    {
        self.chunks
            .range::<Q, _>((Bound::Unbounded, Bound::Included(key)))
            .next_back()
            .map(|(k, _)| k)
            .or_else(|| self.chunks.keys().next())
    }

    pub fn get<Q>(&self, key: &Q) -> Option<&V>
    where
        K: Borrow<Q>,
        Q: Ord + ?Sized,
    {
        let first = self.chunk_of(key)?;
        self.chunks.get::<K>(first)?.get(key)
    }

    pub fn contains_key<Q>(&self, key: &Q) -> bool
    where
        K: Borrow<Q>,
        Q: Ord + ?Sized,
    {
        self.get(key).is_some()
    }

    /// The value of `key` to change in place (its chunk copied first if a clone shares it).
    pub fn get_mut<Q>(&mut self, key: &Q) -> Option<&mut V>
    where
        K: Borrow<Q>,
        Q: Ord + ?Sized,
    {
        let first = self.chunk_of(key)?.clone();
        let chunk = self.chunks.get_mut::<K>(&first)?;
        if !chunk.contains_key(key) {
            return None;
        }
        Arc::make_mut(chunk).get_mut(key)
    }

    /// Inserts or replaces; the value replaced.
    pub fn insert(&mut self, key: K, value: V) -> Option<V> {
        let Some(first) = self.chunk_of(&key).cloned() else {
            self.chunks.insert(key.clone(), Arc::new(BTreeMap::from([(key, value)])));
            self.len = 1;
            return None;
        };
        // A key before every chunk goes into the first, which then starts at it.
        let mut chunk = match self.chunks.remove(&first) {
            Some(c) => c,
            None => Arc::new(BTreeMap::new()),
        };
        let old = Arc::make_mut(&mut chunk).insert(key, value);
        if old.is_none() {
            self.len += 1;
        }
        self.put(chunk);
        old
    }

    /// Puts a chunk back under its first key, split in two when full.
    fn put(&mut self, mut chunk: Arc<BTreeMap<K, V>>) {
        if chunk.len() > CHUNK {
            let middle = chunk.keys().nth(chunk.len() / 2).cloned();
            if let Some(middle) = middle {
                let upper = Arc::make_mut(&mut chunk).split_off(&middle);
                self.chunks.insert(middle, Arc::new(upper));
            }
        }
        if let Some(first) = chunk.keys().next().cloned() {
            self.chunks.insert(first, chunk);
        }
    }

    pub fn remove<Q>(&mut self, key: &Q) -> Option<V>
    where
        K: Borrow<Q>,
        Q: Ord + ?Sized,
    {
        let first = self.chunk_of(key)?.clone();
        if !self.chunks.get::<K>(&first)?.contains_key(key) {
            return None;
        }
        let mut chunk = self.chunks.remove::<K>(&first)?;
        let old = Arc::make_mut(&mut chunk).remove(key);
        if old.is_some() {
            self.len -= 1;
        }
        // An emptied chunk goes; one that lost its first key is filed under its new one; one
        // down to a quarter takes in the chunk after it when both fit in one, so a map that
        // shrank (pods deleted in their thousands) is not left in many tiny chunks, each a
        // pointer every clone copies.
        if chunk.len() < CHUNK / 4
            && let Some(first) = chunk.keys().next()
            && let Some((next, after)) = self.chunks.range::<K, _>((Bound::Excluded(first), Bound::Unbounded)).next()
            && chunk.len() + after.len() <= CHUNK
        {
            let next = next.clone();
            if let Some(after) = self.chunks.remove::<K>(&next) {
                let after = Arc::try_unwrap(after).unwrap_or_else(|shared| (*shared).clone());
                Arc::make_mut(&mut chunk).extend(after);
            }
        }
        self.put(chunk);
        old
    }

    pub fn clear(&mut self) {
        self.chunks.clear();
        self.len = 0;
    }

    /// Entries in key order.
    pub fn iter(&self) -> impl DoubleEndedIterator<Item = (&K, &V)> + '_ {
        self.chunks.values().flat_map(|c| c.iter())
    }

    pub fn keys(&self) -> impl DoubleEndedIterator<Item = &K> + '_ {
        self.iter().map(|(k, _)| k)
    }

    pub fn values(&self) -> impl DoubleEndedIterator<Item = &V> + '_ {
        self.iter().map(|(_, v)| v)
    }

    /// How many chunks hold the entries (what a clone copies).
    pub fn chunks(&self) -> usize {
        self.chunks.len()
    }
}

impl<'a, K: Ord + Clone, V: Clone> IntoIterator for &'a ChunkedMap<K, V> {
    type Item = (&'a K, &'a V);
    type IntoIter = Box<dyn DoubleEndedIterator<Item = (&'a K, &'a V)> + 'a>;
    fn into_iter(self) -> Self::IntoIter {
        Box::new(self.iter())
    }
}

impl<K: Ord + Clone, V: Clone> FromIterator<(K, V)> for ChunkedMap<K, V> {
    fn from_iter<I: IntoIterator<Item = (K, V)>>(iter: I) -> Self {
        let mut m = ChunkedMap::new();
        for (k, v) in iter {
            m.insert(k, v);
        }
        m
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    proptest::proptest! {
        /// Whatever the writes, the map reads as a `BTreeMap` given the same writes, and a
        /// clone taken midway keeps what it saw.
        #[test]
        fn it_reads_as_a_btreemap_and_a_clone_keeps_what_it_saw(
            ops in proptest::collection::vec((0_u8..4, 0_u16..600, 0_u32..1000), 1..2000)
        ) {
            let mut m: ChunkedMap<u16, u32> = ChunkedMap::new();
            let mut want: BTreeMap<u16, u32> = BTreeMap::new();
            let mut kept: Option<(ChunkedMap<u16, u32>, BTreeMap<u16, u32>)> = None;
            for (i, (op, k, v)) in ops.into_iter().enumerate() {
                match op {
                    0 | 1 => proptest::prop_assert_eq!(m.insert(k, v), want.insert(k, v)),
                    2 => proptest::prop_assert_eq!(m.remove(&k), want.remove(&k)),
                    _ => {
                        if let (Some(a), Some(b)) = (m.get_mut(&k), want.get_mut(&k)) {
                            *a = v;
                            *b = v;
                        }
                        proptest::prop_assert_eq!(m.get(&k), want.get(&k));
                    }
                }
                if i == 500 {
                    kept = Some((m.clone(), want.clone()));
                }
                proptest::prop_assert_eq!(m.len(), want.len());
            }
            proptest::prop_assert!(m.iter().eq(want.iter()));
            proptest::prop_assert!(m.keys().rev().eq(want.keys().rev()));
            for k in 0..600u16 {
                proptest::prop_assert_eq!(m.get(&k), want.get(&k));
            }
            if let Some((snapshot, seen)) = kept {
                proptest::prop_assert!(snapshot.iter().eq(seen.iter()), "a clone keeps what it saw");
            }
        }
    }

    #[test]
    fn a_clone_copies_a_pointer_per_chunk_and_a_write_copies_one_chunk() {
        let m: ChunkedMap<u32, Arc<u32>> = (0..100_000u32).map(|i| (i, Arc::new(i))).collect();
        assert_eq!(m.len(), 100_000);
        assert!(m.chunks() <= 100_000 / (CHUNK / 2) + 1, "{} chunks", m.chunks());
        let snapshot = m.clone();
        let mut m = m;
        m.insert(50_000, Arc::new(7));
        assert_eq!(snapshot.get(&50_000).map(|v| **v), Some(50_000), "the snapshot keeps its value");
        assert_eq!(m.get(&50_000).map(|v| **v), Some(7));
        // Every value but those of the one chunk copied is still shared with the snapshot.
        let shared = m.values().zip(snapshot.values()).filter(|(a, b)| Arc::ptr_eq(a, b)).count();
        assert!(shared >= 100_000 - CHUNK, "{shared} shared");
        let unshared_chunks =
            m.chunks.values().zip(snapshot.chunks.values()).filter(|(a, b)| !Arc::ptr_eq(a, b)).count();
        assert_eq!(unshared_chunks, 1, "one chunk copied");
        // Most entries deleted, scattered: the chunks shrink with the map.
        for k in (0..100_000u32).filter(|k| k % 10 != 0) {
            m.remove(&k);
        }
        assert_eq!(m.len(), 10_000);
        assert!(m.chunks() <= 10_000 / (CHUNK / 4) + 1, "{} chunks for 10,000 entries", m.chunks());
        assert!(m.keys().copied().eq((0..100_000u32).step_by(10)));
    }
}
