//! Which existing nodes may still have room for a pod: a max tree over what each has left of
//! CPU, memory and pod slots.
//!
//! A solve asks the existing nodes in order for each pod it places (Karpenter's first fit).
//! In a packed cluster nearly every node refuses on resources alone, and disruption's
//! simulation asks that for every candidate's pods, every round: at 2,000 nodes that scan
//! was about a third of the soak's time. The tree passes over runs of nodes none of which has the
//! CPU, the memory or the pod slot a pod asks for, and finds the node the scan in order
//! would: a node it passes over is one `ResourceList::fits_in` refuses.

use crate::resources::{ResourceList, ResourceName};

use super::nodes::ExistingNode;

/// What a node has left of the resources the tree keeps, in this order.
const KEPT: [ResourceName; 3] = [ResourceName::Cpu, ResourceName::Memory, ResourceName::Pods];

type Room = [i64; 3];

/// A node that takes nothing (taken out, or padding past the last node).
const NOTHING: Room = [i64::MIN; 3];

/// Each node's room in the leaves, the most of each resource below every inner entry.
pub(super) struct RoomTree {
    /// Nodes, as the scheduler's `existing`.
    len: usize,
    /// Leaves: the power of two at or above `len`.
    leaves: usize,
    /// Entry 1 is the root; entry `i` has children `2i` and `2i + 1`.
    tree: Vec<Room>,
}

fn room_of(node: &ExistingNode<'_>) -> Room {
    if node.out {
        return NOTHING;
    }
    KEPT.map(|k| node.remaining.get(&k))
}

/// Whether a node (or every node under an entry, when `room` is their maxima) could take
/// `need`. Each kept resource a pod does not ask for counts as a need of 0: a node with less
/// than 0 of it left is refused by `fits_in` whatever the pod asks.
fn may_take(room: &Room, need: &Room) -> bool {
    room.iter().zip(need).all(|(have, want)| have >= want)
}

impl RoomTree {
    pub(super) fn new(existing: &[ExistingNode<'_>]) -> Self {
        let len = existing.len();
        let leaves = len.next_power_of_two().max(1);
        let mut tree = vec![NOTHING; 2 * leaves];
        for (n, node) in existing.iter().enumerate() {
            tree[leaves + n] = room_of(node);
        }
        for i in (1..leaves).rev() {
            tree[i] = max(&tree[2 * i], &tree[2 * i + 1]);
        }
        RoomTree { len, leaves, tree }
    }

    /// Node `n` changed (a pod placed, taken out, or restored by a rollback).
    pub(super) fn update(&mut self, n: usize, node: &ExistingNode<'_>) {
        debug_assert!(n < self.len, "node {n} of {}", self.len);
        if n >= self.len {
            return;
        }
        let mut i = self.leaves + n;
        self.tree[i] = room_of(node);
        while i > 1 {
            i /= 2;
            self.tree[i] = max(&self.tree[2 * i], &self.tree[2 * i + 1]);
        }
    }

    /// The first node at `from` or after it that may have room for `requests`; every node
    /// before it from `from` on has not.
    pub(super) fn first(&self, from: usize, requests: &ResourceList) -> Option<usize> {
        if from >= self.len {
            return None;
        }
        let need = KEPT.map(|k| requests.get(&k));
        self.descend(1, (0, self.leaves), from, &need)
    }

    fn descend(&self, i: usize, (lo, hi): (usize, usize), from: usize, need: &Room) -> Option<usize> {
        if hi <= from || lo >= self.len || !may_take(&self.tree[i], need) {
            return None;
        }
        if hi - lo == 1 {
            return Some(lo);
        }
        let mid = lo + (hi - lo) / 2;
        self.descend(2 * i, (lo, mid), from, need).or_else(|| self.descend(2 * i + 1, (mid, hi), from, need))
    }
}

fn max(a: &Room, b: &Room) -> Room {
    [a[0].max(b[0]), a[1].max(b[1]), a[2].max(b[2])]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::node::Node;

    fn nodes(cpus: &[i64]) -> Vec<Node> {
        cpus.iter()
            .enumerate()
            .map(|(i, cpu)| {
                let mut allocatable = ResourceList::cpu_mem(*cpu, 4 << 30);
                allocatable.set(ResourceName::Pods, 110);
                Node { name: format!("n{i}"), allocatable, ..Node::default() }
            })
            .collect()
    }

    /// The tree's answer is the scan in order's, for every start and request, as nodes fill,
    /// go out and come back.
    #[test]
    fn the_first_node_with_room_is_the_one_the_scan_in_order_finds() {
        let cpus: Vec<i64> = (0..37).map(|i| (i * 7919 % 13) * 100).collect();
        let nodes = nodes(&cpus);
        let mut existing: Vec<ExistingNode<'_>> =
            nodes.iter().enumerate().map(|(i, n)| ExistingNode::new(n, i, &[], &[])).collect();
        let mut tree = RoomTree::new(&existing);
        let scan = |existing: &[ExistingNode<'_>], from: usize, req: &ResourceList| {
            (from..existing.len()).find(|&n| !existing[n].out && req.fits_in(&existing[n].remaining))
        };
        let check = |existing: &[ExistingNode<'_>], tree: &RoomTree| {
            for cpu in [0, 100, 250, 600, 1_200, 5_000] {
                for mem in [0, 1 << 30, 5 << 30] {
                    let req = ResourceList::cpu_mem(cpu, mem);
                    for from in 0..=existing.len() {
                        let want = scan(existing, from, &req);
                        let got = tree.first(from, &req);
                        // The tree may stop at a node fits_in then refuses only on a resource it
                        // does not keep; here it keeps every one asked for, so it is exact.
                        assert_eq!(got, want, "cpu {cpu} mem {mem} from {from}");
                    }
                }
            }
        };
        check(&existing, &tree);
        // Nodes fill up, one goes out, then they come back as a rollback restores them.
        let before: Vec<ResourceList> = existing.iter().map(|e| e.remaining.clone()).collect();
        for n in [3, 8, 20, 36] {
            existing[n].remaining.subtract(&ResourceList::cpu_mem(cpus[n] / 2 + 50, 1 << 30));
            tree.update(n, &existing[n]);
        }
        existing[11].out = true;
        tree.update(11, &existing[11]);
        check(&existing, &tree);
        for (n, r) in before.into_iter().enumerate() {
            existing[n].remaining = r;
            existing[n].out = false;
            tree.update(n, &existing[n]);
        }
        check(&existing, &tree);
        // No nodes at all.
        let none = RoomTree::new(&[]);
        assert_eq!(none.first(0, &ResourceList::cpu_mem(1, 1)), None);
    }
}
