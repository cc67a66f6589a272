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

use std::collections::HashMap;

use crate::labels;
use crate::pod::Pod;
use crate::requirements::Requirements;
use crate::resources::{ResourceList, ResourceName};

use super::exact;
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
/// Claims each pod of a closed claim may move to (those with the most room).
const RECEIVERS: usize = 24;
/// Types tried for the first half of a split (the cheapest below the claim's price).
const SPLIT_TYPES: usize = 8;
/// A move must save at least this much ($/hour) to be made.
const EPSILON: f64 = 1e-9;

/// Runs the stage on the packer's plan.
pub fn improve(state: &mut Scheduler<'_>) {
    let mut run = Improve::new(state);
    run.exact(state);
    run.local(state);
}

/// The stage's working state.
struct Improve {
    pricer: Pricer,
    /// Per pending pod: free to move.
    free: Vec<bool>,
    /// Per pending pod: its position in the placement order.
    position: HashMap<usize, usize>,
    /// Prices computed by local moves so far.
    spent: usize,
}

/// A claim's requirements as right-sizing reads them (no hostname placeholder).
fn node_requirements(c: &PlannedNode) -> Requirements {
    let mut r = c.requirements.clone();
    r.remove(labels::HOSTNAME);
    r
}

impl Improve {
    fn new(state: &Scheduler<'_>) -> Self {
        let mut free = vec![false; state.pods.len()];
        for c in state.planned.iter().filter(|c| c.right_size) {
            for &p in &c.pods {
                free[p] = is_free(state, p, &state.pods[p]);
            }
        }
        let position = state.order.iter().enumerate().map(|(i, p)| (p.pod, i)).collect();
        Improve { pricer: Pricer::new(state.opts), free, position, spent: 0 }
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
        let claim = &state.planned[c];
        let cap = Self::cap(state, Some(c), claim.template);
        self.price(state, claim.template, &node_requirements(claim), &claim.requests, &claim.pod_ports, cap.as_ref())
    }

    // ---------------------------------------------------------------- exact re-pack

    /// Re-packs the pods of every all-free claim exactly, when there are few of them.
    fn exact(&mut self, state: &mut Scheduler<'_>) {
        let claims: Vec<usize> = (0..state.planned.len()).filter(|&c| self.all_free(state, c)).collect();
        let pods: Vec<usize> = claims.iter().flat_map(|&c| state.planned[c].pods.iter().copied()).collect();
        if pods.is_empty() || pods.len() > EXACT_MAX_PODS || state.pods.len() > 4 * EXACT_MAX_PODS {
            return;
        }
        let mut current = 0.0;
        for &c in &claims {
            match self.claim_price(state, c) {
                Some((p, _)) => current += p,
                None => return,
            }
        }
        let Some(problem) = ExactInput::build(state, &claims) else { return };
        let mut pricing = ExactPricing { state: &*state, input: &problem, pricer: &mut self.pricer };
        let Some((cost, nodes)) = exact::solve(&problem.counts(), &mut pricing, EXACT_STATES) else { return };
        if cost >= current - EPSILON {
            return;
        }
        // Replace the claims: take every pod out, then open one claim per node.
        for &c in &claims {
            let old = state.planned[c].clone();
            state.release_limits(old.template, &old);
            let claim = &mut state.planned[c];
            claim.pods.clear();
            claim.requests = ResourceList::new();
        }
        let mut left: Vec<Vec<usize>> = problem.members.clone();
        let mut stranded: Vec<(usize, usize)> = Vec::new();
        for node in nodes {
            let t = node.group;
            let members: Vec<usize> = node
                .pods
                .iter()
                .enumerate()
                .flat_map(|(k, &n)| {
                    let take = (n as usize).min(left[k].len());
                    left[k].drain(..take).collect::<Vec<_>>()
                })
                .collect();
            if !self.open_with(state, t, &members) {
                stranded.extend(members.into_iter().map(|p| (p, t)));
            }
        }
        for (k, rest) in left.into_iter().enumerate() {
            stranded.extend(rest.into_iter().map(|p| (p, problem.template[k])));
        }
        self.place_stranded(state, stranded);
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
        if let Some(&i) = self.position.get(&p)
            && let Some(entry) = state.order.get_mut(i)
        {
            entry.target = Target::Planned(id);
            entry.zone = zone;
        }
    }

    /// Marks pod `p` as not placed (its placement entry points nowhere until placed again).
    fn unplace(&self, state: &mut Scheduler<'_>, p: usize) {
        if let Some(&i) = self.position.get(&p)
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
            self.position = state.order.iter().enumerate().map(|(i, e)| (e.pod, i)).collect();
            let errors = state.run_queue(loop_pods);
            state.leftover_errors.extend(errors);
        }
    }

    // ---------------------------------------------------------------- local moves

    /// Rounds of close and split moves over the least-filled free claims.
    fn local(&mut self, state: &mut Scheduler<'_>) {
        loop {
            if self.spent >= MOVE_BUDGET {
                return;
            }
            let mut fill: Vec<(f64, usize)> = Vec::new();
            for c in 0..state.planned.len() {
                if !self.all_free(state, c) {
                    continue;
                }
                let Some((_, ty)) = self.claim_price(state, c) else { continue };
                fill.push((utilization(state, c, ty), c));
            }
            fill.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
            let mut improved = false;
            for &(_, c) in fill.iter().take(CANDIDATES) {
                if self.spent >= MOVE_BUDGET {
                    return;
                }
                if !self.all_free(state, c) {
                    continue;
                }
                improved |= self.close(state, c) || self.split(state, c);
            }
            if !improved {
                return;
            }
        }
    }

    /// Closes claim `a` if its pods fit, for less than it costs, on other claims of its
    /// pool (each pod where it raises the price least).
    fn close(&mut self, state: &mut Scheduler<'_>, a: usize) -> bool {
        let Some((saved, _)) = self.claim_price(state, a) else { return false };
        let t = state.planned[a].template;
        // Receivers: other claims of the pool, most room first.
        let mut receivers: Vec<(i64, usize)> = Vec::new();
        for (b, claim) in state.planned.iter().enumerate() {
            if b == a || claim.template != t || claim.pods.is_empty() || !claim.right_size {
                continue;
            }
            let cpu = claim.requests.get(&ResourceName::Cpu);
            receivers.push((cpu, b));
        }
        receivers.sort();
        receivers.truncate(RECEIVERS);
        if receivers.is_empty() {
            return false;
        }
        // Tentative contents of the receivers.
        let mut tentative: HashMap<usize, (Requirements, ResourceList, f64)> = HashMap::new();
        let mut moves: Vec<(usize, usize)> = Vec::new();
        let mut pods = state.planned[a].pods.clone();
        pods.sort_by_key(|&p| std::cmp::Reverse(size_key(&state.pods[p])));
        let mut added = 0.0;
        for p in pods {
            let data = pod_data(state, p);
            let requests = state.pods[p].requests_with_pod_slot();
            let mut best: Option<(f64, usize, Requirements, ResourceList, f64)> = None;
            for &(_, b) in &receivers {
                let claim = &state.planned[b];
                let (reqs, held, price) = match tentative.get(&b) {
                    Some((r, q, p)) => (r.clone(), q.clone(), *p),
                    None => {
                        let Some((price, _)) = self.claim_price(state, b) else { continue };
                        (node_requirements(claim), claim.requests.clone(), price)
                    }
                };
                let Some(merged) = merge_requirements(&reqs, &data.requirements) else { continue };
                // A claim with pods the moves do not own keeps its requirements as they are.
                if merged != reqs && !self.all_free(state, b) {
                    continue;
                }
                let total = held.merged(&requests);
                let cap = Self::cap(state, Some(b), t);
                let Some((after, _)) = self.price(state, t, &merged, &total, &claim.pod_ports, cap.as_ref()) else {
                    continue;
                };
                let delta = after - price;
                if best.as_ref().is_none_or(|(d, ..)| delta < *d) {
                    best = Some((delta, b, merged, total, after));
                }
            }
            let Some((delta, b, merged, total, after)) = best else { return false };
            added += delta;
            if added >= saved - EPSILON {
                return false;
            }
            tentative.insert(b, (merged, total, after));
            moves.push((p, b));
        }
        self.commit_moves(state, a, &moves)
    }

    /// Splits claim `a` in two when two smaller claims cost less: its pods, largest first,
    /// fill the first node (each candidate type cheaper than the claim in turn) and the rest
    /// go to a second one.
    fn split(&mut self, state: &mut Scheduler<'_>, a: usize) -> bool {
        let claim = &state.planned[a];
        if claim.pods.len() < 2 {
            return false;
        }
        let Some((price, _)) = self.claim_price(state, a) else { return false };
        let t = claim.template;
        let reqs = node_requirements(claim);
        let mut pods = claim.pods.clone();
        pods.sort_by_key(|&p| std::cmp::Reverse(size_key(&state.pods[p])));
        let rungs = self.pricer.rungs(&state.templates[t], t, &reqs);
        let template = &state.templates[t];
        let cap = Self::cap(state, Some(a), t);
        let mut best: Option<(f64, Vec<usize>)> = None;
        for r in rungs.iter().filter(|r| r.key < price - EPSILON && !r.exotic).take(SPLIT_TYPES) {
            if self.spent >= MOVE_BUDGET {
                break;
            }
            // First fit into this type.
            let Some(g) = template.group_of[r.ty] else { continue };
            let overhead = &template.daemon_groups[g].overhead;
            let alloc = &template.instance_types[r.ty].allocatable;
            let mut first = ResourceList::new();
            let mut rest = ResourceList::new();
            let mut second: Vec<usize> = Vec::new();
            for &p in &pods {
                let req = state.pods[p].requests_with_pod_slot();
                let with = first.merged(&req);
                if with.fits_in_with(overhead, alloc) {
                    first = with;
                } else {
                    rest.add(&req);
                    second.push(p);
                }
            }
            if second.is_empty() || second.len() == pods.len() {
                continue;
            }
            let Some((p1, _)) = self.price(state, t, &reqs, &first, &[], cap.as_ref()) else { continue };
            let Some((p2, _)) = self.price(state, t, &reqs, &rest, &[], cap.as_ref()) else { continue };
            if p1 + p2 < price - EPSILON && best.as_ref().is_none_or(|(b, _)| p1 + p2 < *b) {
                best = Some((p1 + p2, second));
            }
        }
        let Some((_, second)) = best else { return false };
        let t = state.planned[a].template;
        for &p in &second {
            take_out(state, a, p);
        }
        self.settle(state, a);
        if self.open_with(state, t, &second) {
            return true;
        }
        // The checks refused the new claim: put the pods back where they were.
        let mut claim = state.planned[a].clone();
        let mut back = true;
        for &p in &second {
            back &= self.add_to(state, &mut claim, p);
        }
        if back {
            state.planned[a] = claim;
            self.settle(state, a);
        } else {
            self.place_stranded(state, second.into_iter().map(|p| (p, t)).collect());
        }
        false
    }

    /// Moves pods `(pod, to)` out of claim `a`, which ends empty.
    fn commit_moves(&mut self, state: &mut Scheduler<'_>, a: usize, moves: &[(usize, usize)]) -> bool {
        let old = state.planned[a].clone();
        state.release_limits(old.template, &old);
        let mut stranded: Vec<(usize, usize)> = Vec::new();
        for &(p, b) in moves {
            take_out(state, a, p);
            let t = state.planned[b].template;
            let held = state.planned[b].clone();
            state.release_limits(t, &held);
            let mut claim = held.clone();
            // Let the receiver grow into any type its pool (and limits) allow.
            let cap = Self::cap(state, None, t);
            let wide = self.fitting_types(state, &claim, &state.pods[p].requests_with_pod_slot(), cap.as_ref());
            claim.set_types(&state.templates[t], wide);
            if self.add_to(state, &mut claim, p) {
                let id = claim.id;
                state.planned[b] = claim;
                self.retarget(state, p, id);
            } else {
                stranded.push((p, t));
            }
            state.subtract_limits(t, &state.planned[b].clone());
            self.settle(state, b);
        }
        state.planned[a].types.clear();
        self.place_stranded(state, stranded);
        true
    }

    /// Every type of claim `c`'s pool that meets its requirements and fits its pods plus
    /// `extra`, within `cap`.
    fn fitting_types(
        &mut self,
        state: &Scheduler<'_>,
        claim: &PlannedNode,
        extra: &ResourceList,
        cap: Option<&ResourceList>,
    ) -> Vec<usize> {
        let t = claim.template;
        let template = &state.templates[t];
        let rungs = self.pricer.rungs(template, t, &node_requirements(claim));
        let need = template.need(&claim.requests.merged(extra));
        rungs
            .iter()
            .map(|r| r.ty)
            .filter(|&ty| {
                template.fits(&need, ty)
                    && cap.is_none_or(|cap| cap.iter().all(|(n, v)| template.instance_types[ty].capacity.get(n) <= v))
            })
            .collect()
    }

    /// Narrows claim `c`'s candidates to the types that fit it, no larger than its
    /// cheapest (what right-sizing will launch), and moves its reservation of the pool's
    /// limits to match.
    fn settle(&mut self, state: &mut Scheduler<'_>, c: usize) {
        let claim = state.planned[c].clone();
        if claim.pods.is_empty() {
            return;
        }
        let t = claim.template;
        state.release_limits(t, &claim);
        let cap = Self::cap(state, None, t);
        let types = self.fitting_types(state, &claim, &ResourceList::new(), cap.as_ref());
        if let Some(&cheapest) = types.first() {
            let its = state.templates[t].instance_types;
            let bound = &its[cheapest].capacity;
            let tight: Vec<usize> = types
                .iter()
                .copied()
                .filter(|&i| {
                    let limited = state.templates[t].pool.limits.iter().map(|(n, _)| n);
                    [ResourceName::Cpu, ResourceName::Memory]
                        .iter()
                        .chain(limited)
                        .filter(|n| **n != ResourceName::Nodes)
                        .all(|n| its[i].capacity.get(n) <= bound.get(n))
                })
                .collect();
            state.planned[c].set_types(&state.templates[t], tight);
        }
        let claim = state.planned[c].clone();
        state.subtract_limits(t, &claim);
    }
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

/// Orders pods largest first (cpu, then memory).
fn size_key(pod: &Pod) -> (i64, i64) {
    (pod.requests.get(&ResourceName::Cpu), pod.requests.get(&ResourceName::Memory))
}

/// `a ∩ b`, `None` when they exclude each other.
fn merge_requirements(a: &Requirements, b: &Requirements) -> Option<Requirements> {
    a.compatible(b, true).ok()?;
    let mut m = a.clone();
    m.add_all(b);
    Some(m)
}

/// How full claim `c` would be as type `ty`: its largest share of any resource.
fn utilization(state: &Scheduler<'_>, c: usize, ty: usize) -> f64 {
    let claim = &state.planned[c];
    let alloc = &state.templates[claim.template].instance_types[ty].allocatable;
    claim
        .requests
        .iter()
        .filter(|(_, v)| *v > 0)
        .map(|(n, v)| v as f64 / alloc.get(n).max(1) as f64)
        .fold(0.0, f64::max)
}

/// The exact search's view of the free claims: one class per (template, pod class), with
/// its pods, requirements and requests.
struct ExactInput {
    /// Per class: its template, requirements, requests and pods.
    template: Vec<usize>,
    requirements: Vec<Requirements>,
    requests: Vec<ResourceList>,
    members: Vec<Vec<usize>>,
    /// Per class, per resource it requests: the least a unit costs on its pool's types.
    rates: Vec<Vec<(ResourceName, f64)>>,
}

impl ExactInput {
    fn build(state: &Scheduler<'_>, claims: &[usize]) -> Option<ExactInput> {
        let mut pods: Vec<(usize, usize)> = Vec::new();
        for &c in claims {
            for &p in &state.planned[c].pods {
                pods.push((state.planned[c].template, p));
            }
        }
        pods.sort();
        let idx: Vec<usize> = pods.iter().map(|&(_, p)| p).collect();
        let ids = super::classes::ids(state.pods, &idx);
        let mut key_of: HashMap<(usize, usize), usize> = HashMap::new();
        let mut input = ExactInput {
            template: Vec::new(),
            requirements: Vec::new(),
            requests: Vec::new(),
            members: Vec::new(),
            rates: Vec::new(),
        };
        for &(t, p) in &pods {
            let class = *ids.get(&p)?;
            let k = *key_of.entry((t, class)).or_insert_with(|| {
                input.template.push(t);
                input.requirements.push(pod_data(state, p).requirements);
                input.requests.push(state.pods[p].requests_with_pod_slot());
                input.members.push(Vec::new());
                input.members.len() - 1
            });
            input.members[k].push(p);
        }
        for k in 0..input.members.len() {
            let template = &state.templates[input.template[k]];
            let rates = input.requests[k]
                .iter()
                .filter(|(_, v)| *v > 0)
                .map(|(n, _)| {
                    let rate = template
                        .types
                        .iter()
                        .filter_map(|&ty| {
                            let it = &template.instance_types[ty];
                            let price = it.cheapest_price(&template.requirements);
                            let alloc = it.allocatable.get(n);
                            (price < f64::MAX && alloc > 0).then(|| price / alloc as f64)
                        })
                        .fold(f64::INFINITY, f64::min);
                    (n.clone(), if rate.is_finite() { rate } else { 0.0 })
                })
                .collect();
            input.rates.push(rates);
        }
        Some(input)
    }

    fn counts(&self) -> Vec<u32> {
        self.members.iter().map(|m| m.len() as u32).collect()
    }
}

/// Prices the exact search's nodes with the plan's pricer.
struct ExactPricing<'a, 's> {
    state: &'a Scheduler<'s>,
    input: &'a ExactInput,
    pricer: &'a mut Pricer,
}

impl exact::Pricing for ExactPricing<'_, '_> {
    fn price(&mut self, pods: &[u32]) -> Option<(f64, usize)> {
        let first = pods.iter().position(|&n| n > 0)?;
        let group = self.input.template[first];
        let template = &self.state.templates[group];
        let mut reqs = template.requirements.clone();
        let mut requests = ResourceList::new();
        for (k, &n) in pods.iter().enumerate() {
            if n == 0 {
                continue;
            }
            if self.input.template[k] != group {
                return None;
            }
            reqs = merge_requirements(&reqs, &self.input.requirements[k])?;
            for _ in 0..n {
                requests.add(&self.input.requests[k]);
            }
        }
        let cap = Improve::cap(self.state, None, group);
        self.pricer.price(template, group, &reqs, &requests, &[], cap.as_ref()).map(|(p, _)| (p, group))
    }

    fn lower(&self, pods: &[u32]) -> f64 {
        // Per resource, every pod's request at the cheapest rate its pool sells it; the
        // largest of them.
        let mut per: HashMap<&ResourceName, f64> = HashMap::new();
        for (k, &n) in pods.iter().enumerate() {
            for (name, rate) in &self.input.rates[k] {
                *per.entry(name).or_insert(0.0) += n as f64 * self.input.requests[k].get(name) as f64 * rate;
            }
        }
        per.values().copied().fold(0.0, f64::max)
    }
}
