//! Which existing nodes may still have room for a pod: a max tree over what each has left of
//! CPU, memory and pod slots.
//!
//! A solve asks the existing nodes in order for each pod it places (Karpenter's first fit).
//! In a packed cluster nearly every node refuses on resources alone, and disruption's
//! simulation asks that for every candidate's pods, every round: at 2,000 nodes that scan
//! was about a third of the soak's time. The tree passes over runs of nodes none of which has the
//! CPU, the memory or the pod slot a pod asks for, and finds the node the scan in order
//! would: a node it passes over is one `ResourceList::fits_in` refuses.

use crate::labels;
use crate::resources::{ResourceList, ResourceName};

use super::nodes::ExistingNode;
use super::template::Template;

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

/// What the existing nodes could take of a set of moved pods, counted without placing them:
/// each usable node's room (initialized, not taken out, nothing overcommitted), largest CPU
/// first and largest memory first.
///
/// A consolidation trial places a candidate's pods one by one (Karpenter's first fit). When
/// the nodes' room together cannot hold them, however they were placed, the trial fails
/// whatever its order: this answers that in a count. Of the `j` pods asking the most CPU,
/// each asks at least the `j`-th one's CPU and at least the least memory among them, so a
/// node holds at most as many of them as its room holds copies of that; fewer than `j` over
/// all nodes, and no placement of the pods exists (memory the same way round). Only a
/// necessary condition: room that is there may still be refused (taints, requirements,
/// topology, ports), so a count that passes says nothing, and the trial decides.
pub struct Rooms {
    /// The usable nodes' room, most CPU first.
    by_cpu: Vec<NodeRoom>,
    /// The same, most memory first.
    by_memory: Vec<NodeRoom>,
}

/// What one node has left for moved pods.
#[derive(Clone, Copy, Debug)]
struct NodeRoom {
    /// The node's index in the snapshot's nodes (`usize::MAX`: a new node).
    node: usize,
    /// Millicores.
    cpu: i64,
    /// Bytes.
    memory: i64,
    /// Pod slots.
    slots: i64,
}

/// What one pod asks of a node's CPU and memory.
pub type Ask = (i64, i64);

impl Rooms {
    pub(super) fn new(existing: &[ExistingNode<'_>]) -> Self {
        let mut by_cpu: Vec<NodeRoom> = existing
            .iter()
            .filter(|e| !e.out && e.node.initialized && e.remaining.iter().all(|(_, v)| v >= 0))
            .map(|e| NodeRoom {
                node: e.index,
                cpu: e.remaining.get(&ResourceName::Cpu),
                memory: e.remaining.get(&ResourceName::Memory),
                slots: e.remaining.get(&ResourceName::Pods),
            })
            .filter(|r| r.slots > 0)
            .collect();
        let mut by_memory = by_cpu.clone();
        by_cpu.sort_by_key(|r| std::cmp::Reverse(r.cpu));
        by_memory.sort_by_key(|r| std::cmp::Reverse(r.memory));
        Rooms { by_cpu, by_memory }
    }

    /// Why `asks` (one per pod) cannot all go onto the nodes other than `without` (snapshot
    /// indices), with one more node of room `new` (CPU, memory, pod slots) when given, if
    /// their room alone rules it out.
    pub fn rule_out(&self, asks: &[Ask], without: &[usize], new: Option<[i64; 3]>) -> Option<String> {
        let mut without = without.to_vec();
        without.sort_unstable();
        let without = without.as_slice();
        let mut asks = asks.to_vec();
        asks.sort_by_key(|a| std::cmp::Reverse(a.0));
        let extra = new.map(|[cpu, memory, slots]| NodeRoom { node: usize::MAX, cpu, memory, slots });
        let by_cpu = |r: &NodeRoom| (r.cpu, r.memory);
        if let Some(short) = shortfall(&self.by_cpu, extra, &asks, without, by_cpu, |a| (a.0, a.1)) {
            return Some(describe_shortfall(short, "CPU", ResourceName::Cpu, new.is_some()));
        }
        asks.sort_by_key(|a| std::cmp::Reverse(a.1));
        let by_memory = |r: &NodeRoom| (r.memory, r.cpu);
        let short = shortfall(&self.by_memory, extra, &asks, without, by_memory, |a| (a.1, a.0))?;
        Some(describe_shortfall(short, "memory", ResourceName::Memory, new.is_some()))
    }
}

/// A count that came up short, in words.
fn describe_shortfall((need, held, least): (usize, usize, i64), what: &str, name: ResourceName, new: bool) -> String {
    let least = name.quantity_of(least);
    match (need, new) {
        (1, false) => format!("its largest pod by {what} ({least}) fits on no other node"),
        (1, true) => {
            format!("its largest pod by {what} ({least}) fits on no other node, nor on one new node that costs less")
        }
        (_, false) => format!(
            "its {need} largest pods by {what} ({least} or more each) fit on no other nodes together (room for {held})"
        ),
        (_, true) => format!(
            "its {need} largest pods by {what} ({least} or more each) fit on no other nodes together, even with one new node that costs less (room for {held})"
        ),
    }
}

/// The first `j` for which the `j` largest asks (sorted by one resource, largest first) find
/// room for fewer than `j` of them on `rooms` (sorted by the same resource, largest first;
/// `without` sorted) and `extra`, with how many those hold and the `j`-th ask. `room` and
/// `ask` read a node's room and a pod's ask as (the sorted resource, the other one).
fn shortfall(
    rooms: &[NodeRoom],
    extra: Option<NodeRoom>,
    asks: &[Ask],
    without: &[usize],
    room: impl Fn(&NodeRoom) -> (i64, i64),
    ask: impl Fn(&Ask) -> (i64, i64),
) -> Option<(usize, usize, i64)> {
    let mut least_other = i64::MAX;
    for (i, a) in asks.iter().enumerate() {
        let (main, other) = ask(a);
        // Sorted: the rest ask none of it either, and room for none of it is no bound.
        if main <= 0 {
            return None;
        }
        least_other = least_other.min(other);
        let need = i + 1;
        let copies = |r: &NodeRoom| {
            let (have, have_other) = room(r);
            let by_other = if least_other > 0 { have_other / least_other } else { i64::MAX };
            usize::try_from((have / main).min(by_other).min(r.slots).max(0)).unwrap_or(usize::MAX)
        };
        let mut held = extra.as_ref().map_or(0, copies);
        for r in rooms {
            if held >= need || room(r).0 < main {
                break;
            }
            if without.binary_search(&r.node).is_err() {
                held = held.saturating_add(copies(r));
            }
        }
        if held < need {
            return Some((need, held, main));
        }
    }
    None
}

/// Each price any pool's types launch for (their cheapest available offering in a zone and
/// capacity type the pool allows), ascending, with the most room (allocatable CPU, memory and
/// pod slots, each the most of any type) of the types launching at that price or less: the
/// room of one new node that costs less than a price is at most the entry before it.
pub(super) fn new_node_rooms(templates: &[Template<'_>]) -> Vec<(f64, [i64; 3])> {
    let mut types: Vec<(f64, [i64; 3])> = Vec::new();
    for t in templates {
        let capacity = t.requirements.get(labels::CAPACITY_TYPE);
        let zone = t.requirements.get(labels::ZONE);
        for it in t.types.iter().filter_map(|&i| t.instance_types.get(i)) {
            let cheapest = it
                .offerings
                .iter()
                .filter(|o| o.available && zone.has(&o.zone) && capacity.has(o.capacity_type.as_str()))
                .map(|o| o.price)
                .reduce(f64::min);
            if let Some(price) = cheapest {
                let a = &it.allocatable;
                types.push((
                    price,
                    [a.get(&ResourceName::Cpu), a.get(&ResourceName::Memory), a.get(&ResourceName::Pods)],
                ));
            }
        }
    }
    types.sort_by(|a, b| a.0.total_cmp(&b.0));
    let mut most = [0i64; 3];
    for (_, room) in &mut types {
        most = [most[0].max(room[0]), most[1].max(room[1]), most[2].max(room[2])];
        *room = most;
    }
    types
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

    /// Room that cannot hold a candidate's pods together, however they were placed, is
    /// ruled out by count: by CPU (memory counted alongside), by memory, and only over the
    /// nodes that may take moved pods (the candidate's own, one taken out, one still booting
    /// and an overcommitted one do not count).
    #[test]
    fn pods_the_other_nodes_room_cannot_hold_together_are_ruled_out_by_count() {
        let gib = 1i64 << 30;
        let mut nodes = nodes(&[1_500, 800, 800, 4_000, 4_000, 4_000, 4_000]);
        for n in &mut nodes {
            n.initialized = true;
        }
        // Node 4 is still booting; node 5 is taken out below; node 6 is overcommitted (on a
        // resource the count does not read: it takes no pod, as `fits_in` says).
        nodes[4].initialized = false;
        let mut existing: Vec<ExistingNode<'_>> =
            nodes.iter().enumerate().map(|(i, n)| ExistingNode::new(n, i, &[], &[])).collect();
        existing[5].out = true;
        existing[6].remaining.set(ResourceName::EphemeralStorage, -1);
        let rooms = Rooms::new(&existing);
        let without = [3];

        // Two pods of 1 CPU: only node 0 has room for one.
        let two = [(1_000, gib), (1_000, gib)];
        let why = rooms.rule_out(&two, &without, None).expect("room for one only");
        assert_eq!(why, "its 2 largest pods by CPU (1 or more each) fit on no other nodes together (room for 1)");
        // With the candidate's own node counted, they would fit: it is left out by index only.
        assert_eq!(rooms.rule_out(&two, &[], None), None);
        // 1 CPU and 700m: node 0 takes the first, a node of 800m the second.
        assert_eq!(rooms.rule_out(&[(1_000, gib), (700, gib)], &without, None), None);
        // Memory counted alongside CPU: three small pods of 3 GiB each, on nodes of 4 GiB.
        let big_memory = [(100, 3 * gib), (100, 3 * gib), (100, 3 * gib), (100, 3 * gib)];
        assert!(rooms.rule_out(&big_memory[..3], &without, None).is_none(), "one per node, three nodes");
        let why = rooms.rule_out(&big_memory, &without, None).expect("three nodes hold three");
        assert!(why.contains("its 4 largest pods by CPU (100m or more each)"), "{why}");
        assert!(why.ends_with("(room for 3)"), "{why}");
        // Pods that ask no CPU: the memory count.
        let no_cpu = [(0, 3 * gib), (0, 3 * gib), (0, 3 * gib), (0, 3 * gib)];
        let why = rooms.rule_out(&no_cpu, &without, None).expect("three nodes hold three");
        assert_eq!(why, "its 4 largest pods by memory (3Gi or more each) fit on no other nodes together (room for 3)");
        // One pod: said as one.
        assert_eq!(
            rooms.rule_out(&[(4_500, gib)], &without, None).as_deref(),
            Some("its largest pod by CPU (4500m) fits on no other node")
        );
        // One new node counted besides: room for the second of two pods of 1 CPU, not for a
        // third; a new node too small for either adds nothing.
        assert_eq!(rooms.rule_out(&two, &without, Some([1_000, 4 * gib, 10])), None);
        let three = [(1_000, gib); 3];
        let why = rooms.rule_out(&three, &without, Some([1_500, 4 * gib, 10])).expect("room for two");
        assert_eq!(
            why,
            "its 3 largest pods by CPU (1 or more each) fit on no other nodes together, even with one new node that costs less (room for 2)"
        );
        assert!(rooms.rule_out(&two, &without, Some([900, 4 * gib, 10])).is_some());
        assert_eq!(
            rooms.rule_out(&[(4_500, gib)], &without, Some([4_000, 8 * gib, 10])).as_deref(),
            Some("its largest pod by CPU (4500m) fits on no other node, nor on one new node that costs less")
        );
        // Pods asking nothing are never ruled out.
        assert_eq!(rooms.rule_out(&[(0, 0); 40], &without, None), None);
        // Pod slots count: a node with one slot left holds one pod however small.
        let mut slotted = nodes.clone();
        slotted.truncate(1);
        slotted[0].allocatable.set(ResourceName::Pods, 1);
        let one: Vec<ExistingNode<'_>> =
            slotted.iter().enumerate().map(|(i, n)| ExistingNode::new(n, i, &[], &[])).collect();
        let rooms = Rooms::new(&one);
        assert!(rooms.rule_out(&[(10, 1 << 20)], &[], None).is_none());
        assert!(rooms.rule_out(&[(10, 1 << 20), (10, 1 << 20)], &[], None).is_some());
    }
}
