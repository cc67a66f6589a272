//! The pods of a snapshot, with the index of the pending ones.

use std::ops::Deref;
use std::sync::Arc;

use super::chunked::ChunkedMap;
use crate::pod::{Pod, PodKey};

/// The pods by key, with an index of the pending ones (not bound, not finished) kept as
/// pods are inserted and removed, so that finding what to provision for reads the pending
/// pods only, not every pod of the cluster. Reads go through `Deref` to the map, a
/// [`ChunkedMap`]: a snapshot of 300,000 pods is a clone of a few thousand chunk pointers.
#[derive(Clone, Debug, Default)]
pub struct Pods {
    all: ChunkedMap<PodKey, Arc<Pod>>,
    /// The pending pods' keys (a set; chunked too: a burst of 100,000 pending pods copies a
    /// pointer per chunk in a snapshot, not every key).
    pending: ChunkedMap<PodKey, ()>,
}

impl Pods {
    fn is_pending(p: &Pod) -> bool {
        p.node_name.is_none() && !p.terminal
    }

    /// Inserts or replaces a pod, returning the one it replaced.
    pub fn insert(&mut self, key: PodKey, pod: Arc<Pod>) -> Option<Arc<Pod>> {
        if Self::is_pending(&pod) {
            self.pending.insert(key.clone(), ());
        } else {
            self.pending.remove(&key);
        }
        self.all.insert(key, pod)
    }

    /// Changes a pod in place (copied first if it is shared) and re-indexes it; `None` when
    /// there is no such pod.
    pub fn update<R>(&mut self, key: &PodKey, f: impl FnOnce(&mut Pod) -> R) -> Option<R> {
        let pod = self.all.get_mut(key)?;
        let p = Arc::make_mut(pod);
        let out = f(p);
        if Self::is_pending(p) {
            self.pending.insert(key.clone(), ());
        } else {
            self.pending.remove(key);
        }
        Some(out)
    }

    pub fn remove(&mut self, key: &PodKey) -> Option<Arc<Pod>> {
        self.pending.remove(key);
        self.all.remove(key)
    }

    pub fn clear(&mut self) {
        self.pending.clear();
        self.all.clear();
    }

    /// Pods not bound to a node (and not finished), from the index.
    pub fn pending(&self) -> impl Iterator<Item = &Arc<Pod>> {
        self.pending.keys().filter_map(|k| self.all.get(k))
    }

    /// How many pods are pending.
    pub fn pending_len(&self) -> usize {
        self.pending.len()
    }
}

impl Deref for Pods {
    type Target = ChunkedMap<PodKey, Arc<Pod>>;
    fn deref(&self) -> &Self::Target {
        &self.all
    }
}

impl FromIterator<(PodKey, Arc<Pod>)> for Pods {
    fn from_iter<I: IntoIterator<Item = (PodKey, Arc<Pod>)>>(iter: I) -> Self {
        let mut pods = Pods::default();
        for (k, p) in iter {
            pods.insert(k, p);
        }
        pods
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::ResourceList;

    #[test]
    fn the_pending_index_follows_inserts_updates_and_removes() {
        let mut pods = Pods::default();
        let key = |n: &str| PodKey::new("default", n);
        for n in ["a", "b", "c"] {
            pods.insert(key(n), Arc::new(Pod::new("default", n, ResourceList::new())));
        }
        let mut done = Pod::new("default", "d", ResourceList::new());
        done.terminal = true;
        pods.insert(key("d"), Arc::new(done));
        let names = |p: &Pods| p.pending().map(|p| p.key.name.clone()).collect::<Vec<_>>();
        assert_eq!(names(&pods), ["a", "b", "c"], "a finished pod is not pending");
        pods.update(&key("b"), |p| p.node_name = Some("n1".into()));
        assert_eq!(names(&pods), ["a", "c"], "a bound pod leaves the index");
        let mut rebound = Pod::new("default", "c", ResourceList::new());
        rebound.node_name = Some("n2".into());
        pods.insert(key("c"), Arc::new(rebound));
        assert_eq!(names(&pods), ["a"], "a replaced pod is re-indexed");
        pods.remove(&key("a"));
        assert_eq!(pods.pending_len(), 0);
        assert_eq!(pods.len(), 3, "reads go to the map");
        assert_eq!(pods.update(&key("zz"), |_| ()), None);
        // The index always equals a scan.
        pods.update(&key("b"), |p| p.node_name = None);
        assert_eq!(pods.values().filter(|p| p.node_name.is_none() && !p.terminal).count(), pods.pending_len());
        assert_eq!(names(&pods), ["b"]);
    }

    proptest::proptest! {
        /// Whatever the writes, the index holds exactly the pods a scan finds pending.
        #[test]
        fn the_pending_index_always_equals_a_scan(
            ops in proptest::collection::vec((0_u8..4, 0_u8..8, proptest::option::of(0_u8..3), proptest::bool::ANY), 1..64)
        ) {
            let mut pods = Pods::default();
            for (op, n, node, terminal) in ops {
                let key = PodKey::new("default", &format!("p{n}"));
                let node_name = node.map(|i| format!("n{i}"));
                match op {
                    0 => {
                        let mut p = Pod::new("default", &key.name, ResourceList::new());
                        p.node_name = node_name;
                        p.terminal = terminal;
                        pods.insert(key, Arc::new(p));
                    }
                    1 => {
                        pods.update(&key, |p| {
                            p.node_name = node_name;
                            p.terminal = terminal;
                        });
                    }
                    2 => {
                        pods.remove(&key);
                    }
                    _ if n == 0 => pods.clear(),
                    _ => {}
                }
                let scan: Vec<&PodKey> =
                    pods.values().filter(|p| p.node_name.is_none() && !p.terminal).map(|p| &p.key).collect();
                let index: Vec<&PodKey> = pods.pending().map(|p| &p.key).collect();
                proptest::prop_assert_eq!(&index, &scan);
                proptest::prop_assert_eq!(pods.pending_len(), scan.len());
            }
        }
    }
}
