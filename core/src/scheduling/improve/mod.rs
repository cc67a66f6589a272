//! Stage 5 of a solve: moves that lower the cost of the dovetail packer's plan.
//!
//! The moves touch only *free* pods: pods no topology rule involves (they own no spread,
//! affinity or anti-affinity group and no group selects them), with no host port and no
//! volume topology, on claims the packer opened (right-sized at the end). Moving such a pod
//! between claims of its NodePool changes nothing any constraint reads, and every move still
//! goes through the same `can_add` checks as packing. Prices are the plan's own
//! ([`super::price`]): what each claim would launch at once right-sized.
//!
//! 1. **Exact re-pack** of small inputs: when the claims holding only free pods hold at most
//!    [`EXACT_MAX_PODS`] of them, those pods are re-packed by the exact search
//!    ([`super::exact`]) and the claims replaced if that is cheaper.
//! 2. **Local moves**, least-filled claims first, until none lowers the cost or the work
//!    budget is spent: *close* a claim and re-place its pods on other claims (which may grow
//!    into a larger type: a merge when they all go to one claim); *split* a claim into two
//!    smaller ones. *Re-sizing* each claim to the cheapest type that fits is what
//!    right-sizing does after this stage, and every price here assumes it.
//!
//! Disruption's consolidation needs the same moves on running nodes; they work on
//! [`Scheduler`] state, which a consolidation simulation builds the same way.

mod moves;
mod repack;

use std::collections::HashMap;
use std::rc::Rc;

use crate::labels;
use crate::pod::Pod;
use crate::requirements::Requirements;
use crate::resources::{ResourceList, ResourceName};

use super::nodes::PlannedNode;
use super::output::Target;
use super::price::Pricer;
use super::scheduler::{Scheduler, pinned_zone};
use super::view::{PodData, PodView};

/// Inputs with at most this many free pods on free claims are re-packed exactly.
pub const EXACT_MAX_PODS: usize = 50;
/// The exact search runs when it has at most this many states (see [`exact::states`]).
const EXACT_STATES: usize = 20_000;
/// Prices the local moves may compute in one solve.
const MOVE_BUDGET: usize = 40_000;
/// Claims considered per round of local moves (the least filled).
const CANDIDATES: usize = 48;
/// Only claims fuller than this (their largest share of a resource on the type they were
/// sized for) are left alone: a full claim is neither closed nor split with profit.
const CANDIDATE_FILL: f64 = 0.9;
/// Claims each pod of a closed claim may move to (those with the most room).
const RECEIVERS: usize = 24;
/// Types tried for the first half of a split (the dearest below the claim's price).
const SPLIT_TYPES: usize = 8;
/// A move must save at least this much ($/hour) to be made.
const EPSILON: f64 = 1e-9;

/// Runs the stage on the packer's plan.
pub(crate) fn improve(state: &mut Scheduler<'_>) {
    let mut run = Improve::new(state);
    run.exact(state);
    run.local(state);
}

/// The stage's working state.
pub(crate) struct Improve {
    pricer: Pricer,
    /// Per pending pod: free to move.
    free: Vec<bool>,
    /// Per pending pod: its position in the placement order (`usize::MAX`: none).
    position: Vec<usize>,
    /// Prices computed by local moves so far.
    spent: usize,
    /// Per claim: its price and launch type as it stands (pools without limits only; a
    /// claim's entry is dropped when it changes).
    known: Vec<Option<(f64, usize)>>,
    /// Per claim: no move was found for it since it last changed.
    settled: Vec<bool>,
    /// Per pending pod: its equivalence class, and per class its derived data and requests.
    class_of: Vec<u32>,
    class_data: HashMap<usize, Rc<ClassData>>,
    /// Per claim: its pods grouped by class, until it changes.
    grouped: HashMap<usize, Rc<Vec<Group>>>,
    /// The resources pending pods request: the dense vectors' dimensions.
    dims: Vec<ResourceName>,
}

/// What the moves read of a class: its pods' data, the requests of one, and those as a
/// dense vector over [`Improve::dims`].
type ClassData = (PodData, ResourceList, Vec<i64>);

/// Pods of one class: the class's data and the pods.
type Group = (Rc<ClassData>, Vec<usize>);

/// A claim's requirements as right-sizing reads them (no hostname placeholder).
fn node_requirements(c: &PlannedNode) -> Requirements {
    let mut r = c.requirements.clone();
    r.remove(labels::HOSTNAME);
    r
}

impl Improve {
    pub(crate) fn new(state: &Scheduler<'_>) -> Self {
        let mut free = vec![false; state.pods.len()];
        for c in state.planned.iter().filter(|c| c.right_size) {
            for &p in &c.pods {
                free[p] = is_free(state, p, &state.pods[p]);
            }
        }
        let position = positions(state);
        let class_of = state.class_of.clone();
        // One pod per class is enough to name the resources requested.
        let classes = class_of.iter().filter(|&&k| k != u32::MAX).max().map_or(0, |&k| k as usize + 1);
        let mut seen = vec![false; classes];
        let mut dims: Vec<ResourceName> = Vec::new();
        for &p in state.planned.iter().flat_map(|c| c.pods.iter()) {
            if let Some(&k) = class_of.get(p)
                && let Some(s) = seen.get_mut(k as usize)
            {
                if *s {
                    continue;
                }
                *s = true;
            }
            for (n, v) in state.pods[p].requests_with_pod_slot().iter() {
                if v > 0 && !dims.contains(n) {
                    dims.push(n.clone());
                }
            }
        }
        Improve {
            pricer: Pricer::new(state.opts),
            free,
            position,
            spent: 0,
            known: Vec::new(),
            settled: Vec::new(),
            class_of,
            class_data: HashMap::new(),
            grouped: HashMap::new(),
            dims,
        }
    }

    /// Whether claim `c` holds only free pods (and any).
    fn all_free(&self, state: &Scheduler<'_>, c: usize) -> bool {
        let claim = &state.planned[c];
        claim.right_size && !claim.pods.is_empty() && claim.pods.iter().all(|&p| self.free[p])
    }

    /// What the claim's candidates may reserve of its pool's limits: what it holds now
    /// plus what is left.
    fn cap(state: &Scheduler<'_>, c: Option<usize>, t: usize) -> Option<ResourceList> {
        let remaining = state.remaining[t].as_ref()?;
        let held = c.and_then(|c| state.remaining_limit_types(&state.planned[c])).unwrap_or_default();
        Some(ResourceList::from_pairs(
            remaining.iter().filter(|(n, _)| **n != ResourceName::Nodes).map(|(n, v)| (n.clone(), v + held.get(n))),
        ))
    }

    /// How many more claims template `t`'s `limits.nodes` allows (unbounded without one).
    fn nodes_left(state: &Scheduler<'_>, t: usize) -> i64 {
        match &state.remaining[t] {
            Some(r) if r.contains(&ResourceName::Nodes) => r.get(&ResourceName::Nodes),
            _ => i64::MAX,
        }
    }

    /// The price of a node of template `t` with `reqs` holding `requests` and `ports`.
    fn price(
        &mut self,
        state: &Scheduler<'_>,
        t: usize,
        reqs: &Requirements,
        requests: &ResourceList,
        ports: &[crate::pod::HostPort],
        cap: Option<&ResourceList>,
    ) -> Option<(f64, usize)> {
        self.spent += 1;
        self.pricer.price(&state.templates[t], t, reqs, requests, ports, cap)
    }

    /// The price of claim `c` as it stands.
    fn claim_price(&mut self, state: &Scheduler<'_>, c: usize) -> Option<(f64, usize)> {
        if let Some(Some(known)) = self.known.get(c) {
            return Some(*known);
        }
        let claim = &state.planned[c];
        let cap = Self::cap(state, Some(c), claim.template);
        let price = self.price(
            state,
            claim.template,
            &node_requirements(claim),
            &claim.requests,
            &claim.pod_ports,
            cap.as_ref(),
        );
        if cap.is_none()
            && let Some(p) = price
        {
            if self.known.len() <= c {
                self.known.resize(c + 1, None);
            }
            self.known[c] = Some(p);
        }
        price
    }

    /// Forgets what was known of claim `c` (it changed).
    fn touch(&mut self, c: usize) {
        if let Some(k) = self.known.get_mut(c) {
            *k = None;
        }
        if let Some(s) = self.settled.get_mut(c) {
            *s = false;
        }
        self.grouped.remove(&c);
    }

    /// Claim `c`'s pods grouped by class (see [`Improve::groups`]).
    fn claim_groups(&mut self, state: &Scheduler<'_>, c: usize) -> Rc<Vec<Group>> {
        if let Some(g) = self.grouped.get(&c) {
            return g.clone();
        }
        let own = state.planned[c].pods.clone();
        let g = Rc::new(self.groups(state, &own));
        self.grouped.insert(c, g.clone());
        g
    }

    /// Opens a claim of template `t` for `pods` (sized by the pricer, then checked pod by
    /// pod); false if some pod could not be added (the claim then holds none of them).
    fn open_with(&mut self, state: &mut Scheduler<'_>, t: usize, pods: &[usize]) -> bool {
        let mut requests = ResourceList::new();
        let mut reqs = state.templates[t].requirements.clone();
        for &p in pods {
            requests.add(&state.pods[p].requests_with_pod_slot());
            let data = pod_data(state, p);
            let Some(merged) = merge_requirements(&reqs, &data.requirements) else { return false };
            reqs = merged;
        }
        if Self::nodes_left(state, t) < 1 {
            return false;
        }
        let cap = Self::cap(state, None, t);
        let Some((_, ty)) = self.pricer.price(&state.templates[t], t, &reqs, &requests, &[], cap.as_ref()) else {
            return false;
        };
        let mut node = state.new_packed(t, ty);
        state.next_hostname += 1;
        let mut added: Vec<usize> = Vec::new();
        for &p in pods {
            if !self.add_to(state, &mut node, p) {
                // Undo: the claim is dropped; its pods go back to the caller.
                for &q in &added {
                    self.unplace(state, q);
                }
                return false;
            }
            added.push(p);
        }
        node.right_size = true;
        state.subtract_limits(t, &node);
        let id = node.id;
        state.planned.push(node);
        for &p in &added {
            self.retarget(state, p, id);
        }
        true
    }

    /// Adds free pod `p` to `node` with the packer's checks.
    fn add_to(&self, state: &mut Scheduler<'_>, node: &mut PlannedNode, p: usize) -> bool {
        let data = pod_data(state, p);
        let pod = &state.pods[p];
        let template = &state.templates[node.template];
        let tolerations = &pod.tolerations;
        match node.can_add(template, &state.topology, p, pod, &data, tolerations, false, false) {
            Ok(add) => {
                node.add(template, &mut state.topology, p, pod, &data, add);
                true
            }
            Err(_) => false,
        }
    }

    /// Points pod `p`'s placement at claim `id`.
    fn retarget(&self, state: &mut Scheduler<'_>, p: usize, id: usize) {
        let zone = state.planned.iter().find(|c| c.id == id).and_then(|c| pinned_zone(&c.requirements));
        if let Some(&i) = self.position.get(p)
            && let Some(entry) = state.order.get_mut(i)
        {
            entry.target = Target::Planned(id);
            entry.zone = zone;
        }
    }

    /// Marks pod `p` as not placed (its placement entry points nowhere until placed again).
    fn unplace(&self, state: &mut Scheduler<'_>, p: usize) {
        if let Some(&i) = self.position.get(p)
            && let Some(entry) = state.order.get_mut(i)
        {
            entry.target = Target::Planned(usize::MAX);
        }
    }

    /// Pods a move could not re-place after all (a check refused what the prices allowed),
    /// with their templates: each gets a claim of its own, else goes through the per-pod
    /// loop, so every pod still ends placed or with a reason.
    fn place_stranded(&mut self, state: &mut Scheduler<'_>, pods: Vec<(usize, usize)>) {
        let mut loop_pods = Vec::new();
        for (p, t) in pods {
            if !self.open_with(state, t, &[p]) {
                loop_pods.push(p);
            }
        }
        if !loop_pods.is_empty() {
            // Drop their stale entries; the loop records new ones.
            let set: std::collections::HashSet<usize> = loop_pods.iter().copied().collect();
            state.order.retain(|e| !set.contains(&e.pod));
            self.position = positions(state);
            let errors = state.run_queue(loop_pods);
            state.leftover_errors.extend(errors);
        }
    }

    /// The pods of `pods` grouped by class (identical requests and requirements), largest
    /// first.
    fn groups(&mut self, state: &Scheduler<'_>, pods: &[usize]) -> Vec<Group> {
        let mut by_class: Vec<(usize, Vec<usize>)> = Vec::new();
        for &p in pods {
            let k = match self.class_of.get(p) {
                Some(&k) if k != u32::MAX => k as usize,
                _ => usize::MAX - p,
            };
            match by_class.iter_mut().find(|(x, _)| *x == k) {
                Some((_, members)) => members.push(p),
                None => by_class.push((k, vec![p])),
            }
        }
        let mut out: Vec<Group> = Vec::with_capacity(by_class.len());
        for (k, members) in by_class {
            let data = match self.class_data.get(&k) {
                Some(d) => d.clone(),
                None => {
                    let requests = state.pods[members[0]].requests_with_pod_slot();
                    let dense = self.dense(&requests);
                    let d = Rc::new((pod_data(state, members[0]), requests, dense));
                    self.class_data.insert(k, d.clone());
                    d
                }
            };
            out.push((data, members));
        }
        out.sort_by_key(|(d, _)| std::cmp::Reverse((d.1.get(&ResourceName::Cpu), d.1.get(&ResourceName::Memory))));
        out
    }

    /// `r` over [`Improve::dims`].
    fn dense(&self, r: &ResourceList) -> Vec<i64> {
        self.dims.iter().map(|d| r.get(d)).collect()
    }

    /// A dense vector as a resource list.
    fn sparse(&self, v: &[i64]) -> ResourceList {
        ResourceList::from_pairs(self.dims.iter().cloned().zip(v.iter().copied()).filter(|(_, x)| *x != 0))
    }
}

/// Per pending pod: its position in the placement order (`usize::MAX`: none).
fn positions(state: &Scheduler<'_>) -> Vec<usize> {
    let mut position = vec![usize::MAX; state.pods.len()];
    for (i, e) in state.order.iter().enumerate() {
        if let Some(slot) = position.get_mut(e.pod) {
            *slot = i;
        }
    }
    position
}

/// Removes free pod `p` from claim `c` (its requirements stay as narrowed as they were).
fn take_out(state: &mut Scheduler<'_>, c: usize, p: usize) {
    let requests = state.pods[p].requests_with_pod_slot();
    let claim = &mut state.planned[c];
    claim.pods.retain(|&x| x != p);
    claim.requests = claim.requests.subtracted(&requests);
}

/// Whether a pod can move freely: no topology involves it, no host port, no volume.
fn is_free(state: &Scheduler<'_>, idx: usize, pod: &Pod) -> bool {
    pod.host_ports.is_empty()
        && pod.volume_requirements.is_empty()
        && !state.topology.constrains(idx, pod)
        && !state.topology.selected(pod)
}

fn pod_data(state: &Scheduler<'_>, p: usize) -> PodData {
    let pod = &state.pods[p];
    PodData::new(pod, &PodView::new(pod), state.opts.preference_policy)
}

/// `a ∩ b`, `None` when they exclude each other.
fn merge_requirements(a: &Requirements, b: &Requirements) -> Option<Requirements> {
    if b.is_empty() {
        return Some(a.clone());
    }
    a.compatible(b, true).ok()?;
    let mut m = a.clone();
    m.add_all(b);
    Some(m)
}

#[cfg(test)]
mod tests {
    //! Each move on a plan built by hand: claims opened as the packer would, then one move.

    use std::sync::Arc;

    use super::*;
    use crate::catalog::{Catalog, NodeClassSettings};
    use crate::nodepool::NodePool;
    use crate::scheduling::{PoolInput, Snapshot, SolveOptions};

    fn snapshot(families: &[&str]) -> Snapshot {
        let c = Catalog::embedded("us-east-1").expect("catalog");
        let types: Vec<_> = c
            .instance_types(&NodeClassSettings::default(), None)
            .into_iter()
            .filter(|t| families.iter().any(|f| t.name.starts_with(f)))
            .collect();
        let mut reqs = Requirements::new();
        reqs.add(labels::CAPACITY_TYPE, crate::requirements::Requirement::is_in(["on-demand"]));
        Snapshot {
            nodepools: vec![PoolInput { pool: NodePool::new("default", reqs), instance_types: Arc::new(types) }],
            ..Default::default()
        }
    }

    fn pod(name: &str, cpu_milli: i64, mem_mib: i64) -> Pod {
        Pod::new("default", name, ResourceList::cpu_mem(cpu_milli, mem_mib << 20))
    }

    /// Opens one claim per group of pods and returns the stage's state over them.
    fn planned(state: &mut Scheduler<'_>, groups: &[&[usize]]) -> Improve {
        let mut opener = Improve::new(state);
        for g in groups {
            assert!(opener.open_with(state, 0, g), "claim for {g:?}");
        }
        Improve::new(state)
    }

    /// The plan's cost and its claims that hold pods.
    fn plan(run: &mut Improve, state: &Scheduler<'_>) -> (f64, Vec<usize>) {
        let live: Vec<usize> = (0..state.planned.len()).filter(|&c| !state.planned[c].pods.is_empty()).collect();
        let cost = live.iter().map(|&c| run.claim_price(state, c).expect("priced").0).sum();
        (cost, live)
    }

    #[test]
    fn merge_puts_two_claims_on_one_node_when_that_is_cheaper() {
        // A cpu-heavy pod alone is a c5.large; a memory-heavy one an r5.large. Together they
        // fit one r5.large: one node for less than two.
        let snap = snapshot(&["c5.", "r5."]);
        let pods = vec![pod("cpu", 1500, 1024), pod("mem", 200, 12 * 1024)];
        let opts = SolveOptions::default();
        let mut state = Scheduler::new(&snap, &pods, &opts);
        let mut run = planned(&mut state, &[&[0], &[1]]);
        let (before, live) = plan(&mut run, &state);
        assert_eq!(live.len(), 2);
        assert!(run.merge(&mut state, live[0], &live), "merged");
        let (after, live) = plan(&mut run, &state);
        assert_eq!(live.len(), 1, "one claim holds both");
        assert_eq!(state.planned[live[0]].pods.len(), 2);
        assert!(after < before - EPSILON, "{after} < {before}");
    }

    #[test]
    fn merge_is_refused_when_one_node_costs_as_much_as_two() {
        // m5 prices are linear in size: one m5.xlarge costs what two m5.large do.
        let snap = snapshot(&["m5."]);
        let pods = vec![pod("a", 1500, 1024), pod("b", 1500, 1024)];
        let opts = SolveOptions::default();
        let mut state = Scheduler::new(&snap, &pods, &opts);
        let mut run = planned(&mut state, &[&[0], &[1]]);
        let (_, live) = plan(&mut run, &state);
        assert!(!run.merge(&mut state, live[0], &live));
        assert_eq!(plan(&mut run, &state).1.len(), 2, "nothing moved");
    }

    #[test]
    fn close_moves_pods_into_free_room_elsewhere() {
        // The second claim (an r5.large with one small pod) has room for the first's pod.
        let snap = snapshot(&["c5.", "r5."]);
        let pods = vec![pod("cpu", 1000, 1024), pod("mem", 200, 8 * 1024)];
        let opts = SolveOptions::default();
        let mut state = Scheduler::new(&snap, &pods, &opts);
        let mut run = planned(&mut state, &[&[0], &[1]]);
        let (before, live) = plan(&mut run, &state);
        assert!(run.close(&mut state, live[0], &live), "closed");
        let (after, live) = plan(&mut run, &state);
        assert_eq!(live.len(), 1);
        assert!(after < before - EPSILON, "{after} < {before}");
    }

    #[test]
    fn split_makes_two_smaller_nodes_when_they_cost_less() {
        // Three pods of 1.5 vCPU need an m5.2xlarge together ($0.384); an m5.xlarge takes
        // two and an m5.large the third ($0.288).
        let snap = snapshot(&["m5."]);
        let pods = vec![pod("a", 1500, 1024), pod("b", 1500, 1024), pod("c", 1500, 1024)];
        let opts = SolveOptions::default();
        let mut state = Scheduler::new(&snap, &pods, &opts);
        let mut run = planned(&mut state, &[&[0, 1, 2]]);
        let (before, live) = plan(&mut run, &state);
        assert!(run.split(&mut state, live[0]), "split");
        let (after, live) = plan(&mut run, &state);
        assert_eq!(live.len(), 2);
        assert!(after < before - EPSILON, "{after} < {before}");
        assert!((after - 0.288).abs() < 1e-6, "{after}");
    }
}
