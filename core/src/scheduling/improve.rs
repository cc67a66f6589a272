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
use std::rc::Rc;

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
    fn new(state: &Scheduler<'_>) -> Self {
        let mut free = vec![false; state.pods.len()];
        for c in state.planned.iter().filter(|c| c.right_size) {
            for &p in &c.pods {
                free[p] = is_free(state, p, &state.pods[p]);
            }
        }
        let position = state.order.iter().enumerate().map(|(i, p)| (p.pod, i)).collect();
        let placed: Vec<usize> = state.planned.iter().flat_map(|c| c.pods.iter().copied()).collect();
        let class_of = state.class_of.clone();
        let mut dims: Vec<ResourceName> = Vec::new();
        for &p in &placed {
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
        // The pools' node limits: the claims replaced give back their nodes.
        for t in 0..state.templates.len() {
            let released = claims.iter().filter(|&&c| state.planned[c].template == t).count() as i64;
            let opened = nodes.iter().filter(|n| n.group == t).count() as i64;
            if opened > released && opened - released > Self::nodes_left(state, t) {
                return;
            }
        }
        // Replace the claims: take every pod out, then open one claim per node.
        for &c in &claims {
            self.touch(c);
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

    // ---------------------------------------------------------------- local moves

    /// Rounds of close and split moves over the least-filled free claims.
    fn local(&mut self, state: &mut Scheduler<'_>) {
        loop {
            if self.spent >= MOVE_BUDGET {
                return;
            }
            // Per round: how full each claim is, and per pool the claims with the most room
            // in the types they launch as (the receivers a closed claim's pods try).
            let mut fill: Vec<(f64, usize)> = Vec::new();
            let mut room: Vec<(usize, i64, usize)> = Vec::new();
            for c in 0..state.planned.len() {
                let claim = &state.planned[c];
                if !claim.right_size || claim.pods.is_empty() {
                    continue;
                }
                // Ranked by the type the claim was sized for (its first candidate): pricing
                // every claim of a large plan each round would cost more than the moves.
                let Some(&ty) = claim.types.first() else { continue };
                let alloc = state.templates[claim.template].instance_types[ty].allocatable.get(&ResourceName::Cpu);
                room.push((claim.template, alloc - claim.requests.get(&ResourceName::Cpu), c));
                let full = utilization(state, c, ty);
                if full < CANDIDATE_FILL && self.all_free(state, c) {
                    fill.push((full, c));
                }
            }
            room.sort_by_key(|&(t, left, c)| (t, std::cmp::Reverse(left), c));
            let mut receivers: HashMap<usize, Vec<usize>> = HashMap::new();
            for (t, _, c) in room {
                let list = receivers.entry(t).or_default();
                if list.len() <= RECEIVERS {
                    list.push(c);
                }
            }
            fill.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
            if self.settled.len() < state.planned.len() {
                self.settled.resize(state.planned.len(), false);
            }
            let candidates: Vec<usize> =
                fill.iter().map(|&(_, c)| c).filter(|&c| !self.settled[c]).take(CANDIDATES).collect();
            let mut improved = false;
            for c in candidates {
                if self.spent >= MOVE_BUDGET {
                    return;
                }
                if !self.all_free(state, c) {
                    continue;
                }
                let t = state.planned[c].template;
                let list = receivers.get(&t).cloned().unwrap_or_default();
                if self.close(state, c, &list) || self.split(state, c) {
                    improved = true;
                } else if let Some(s) = self.settled.get_mut(c) {
                    *s = true;
                }
            }
            if !improved {
                return;
            }
        }
    }

    /// Closes claim `a` if its pods fit, for less than it costs, on other claims of its
    /// pool. Its pods go, class by class (largest first), into the room the receivers have
    /// in the types they launch as (which costs nothing), and what is left to the receiver
    /// whose price it raises least (it may grow into a larger type: a merge when everything
    /// goes to one claim).
    fn close(&mut self, state: &mut Scheduler<'_>, a: usize, candidates: &[usize]) -> bool {
        let Some((saved, _)) = self.claim_price(state, a) else { return false };
        let t = state.planned[a].template;
        let template = &state.templates[t];
        let mut receivers: Vec<Receiver> = Vec::new();
        for &b in candidates {
            let claim = &state.planned[b];
            if b == a || claim.template != t || claim.pods.is_empty() || !claim.right_size {
                continue;
            }
            let Some((price, ty)) = self.claim_price(state, b) else { continue };
            let claim = &state.planned[b];
            let room = template.group_of[ty].map(|g| {
                self.dense(
                    &template.instance_types[ty]
                        .allocatable
                        .subtracted(&template.daemon_groups[g].overhead)
                        .subtracted(&claim.requests),
                )
            });
            receivers.push(Receiver {
                b,
                reqs: node_requirements(claim),
                requests: claim.requests.clone(),
                price,
                room,
                free: self.all_free(state, b),
            });
        }
        receivers.sort_by_key(|r| std::cmp::Reverse(r.room.as_ref().map_or(0, |x| x.first().copied().unwrap_or(0))));
        receivers.truncate(RECEIVERS);
        if receivers.is_empty() {
            return false;
        }
        let mut moves: Vec<(usize, usize)> = Vec::new();
        let mut left: Vec<(PodData, ResourceList, Vec<usize>)> = Vec::new();
        for (class, pods) in self.claim_groups(state, a).iter() {
            let (data, requests, dense) = &**class;
            let mut pods = pods.clone();
            // Free room first: the receiver keeps its type and its price.
            for r in receivers.iter_mut() {
                if pods.is_empty() {
                    break;
                }
                let Some(room) = r.room.as_mut() else { continue };
                if !data.requirements.is_empty()
                    && merge_requirements(&r.reqs, &data.requirements).as_ref() != Some(&r.reqs)
                {
                    continue;
                }
                let take = fit_count(room, dense, pods.len());
                if take > 0 {
                    for (x, d) in room.iter_mut().zip(dense) {
                        *x -= d * take as i64;
                    }
                    r.requests.add(&requests.scaled(take as i64));
                    moves.extend(pods.split_off(pods.len() - take).into_iter().map(|p| (p, r.b)));
                }
            }
            if !pods.is_empty() {
                left.push((data.clone(), requests.clone(), pods));
            }
        }
        // The rest, all together, to the receiver whose price it raises least. When most of
        // the claim does not fit free room, closing it means buying about as much room as it
        // has: not tried.
        let leftover: usize = left.iter().map(|(_, _, pods)| pods.len()).sum();
        if leftover == 0 {
            return self.commit_moves(state, a, &moves);
        }
        if 2 * leftover > state.planned[a].pods.len() {
            return false;
        }
        let mut extra = ResourceList::new();
        for (_, requests, pods) in &left {
            extra.add(&requests.scaled(pods.len() as i64));
        }
        let mut best: Option<(f64, usize)> = None;
        for (i, r) in receivers.iter().enumerate() {
            let mut merged = Some(r.reqs.clone());
            for (data, _, _) in &left {
                merged = merged.and_then(|m| merge_requirements(&m, &data.requirements));
            }
            let Some(merged) = merged else { continue };
            // A claim with pods the moves do not own keeps its requirements as they are.
            if merged != r.reqs && !r.free {
                continue;
            }
            let total = r.requests.merged(&extra);
            let cap = Self::cap(state, Some(r.b), t);
            let ports = &state.planned[r.b].pod_ports;
            let Some((after, _)) = self.price(state, t, &merged, &total, ports, cap.as_ref()) else { continue };
            let delta = after - r.price;
            if delta < saved - EPSILON && best.is_none_or(|(d, _)| delta < d) {
                best = Some((delta, i));
            }
        }
        let Some((_, i)) = best else { return false };
        let b = receivers[i].b;
        moves.extend(left.into_iter().flat_map(|(_, _, pods)| pods.into_iter().map(move |p| (p, b))));
        self.commit_moves(state, a, &moves)
    }

    /// Splits claim `a` in two when two smaller claims cost less: its pods, largest first,
    /// fill the first node (each of the dearest types cheaper than the claim in turn) and
    /// the rest go to a second one.
    fn split(&mut self, state: &mut Scheduler<'_>, a: usize) -> bool {
        let claim = &state.planned[a];
        if claim.pods.len() < 2 {
            return false;
        }
        let Some((price, _)) = self.claim_price(state, a) else { return false };
        let t = claim.template;
        if Self::nodes_left(state, t) < 1 {
            return false;
        }
        let reqs = node_requirements(claim);
        let pod_count = claim.pods.len();
        let groups = self.claim_groups(state, a);
        let rungs = self.pricer.rungs(&state.templates[t], t, &reqs);
        let template = &state.templates[t];
        let cap = Self::cap(state, Some(a), t);
        let mut best: Option<(f64, Vec<usize>)> = None;
        // The first node is tried as each of the largest types cheaper than the claim (the
        // dearest first): a split pays when one node takes most of the pods.
        for r in rungs.iter().rev().filter(|r| r.key < price - EPSILON && !r.exotic).take(SPLIT_TYPES) {
            if self.spent >= MOVE_BUDGET {
                break;
            }
            // First fit into this type, class by class, largest first.
            let Some(g) = template.group_of[r.ty] else { continue };
            let mut room =
                self.dense(&template.instance_types[r.ty].allocatable.subtracted(&template.daemon_groups[g].overhead));
            let mut first = vec![0i64; self.dims.len()];
            let mut rest = vec![0i64; self.dims.len()];
            let mut second: Vec<usize> = Vec::new();
            for (class, pods) in groups.iter() {
                let dense = &class.2;
                let fits = fit_count(&room, dense, pods.len());
                for ((x, f), (q, d)) in room.iter_mut().zip(first.iter_mut()).zip(rest.iter_mut().zip(dense)) {
                    *x -= d * fits as i64;
                    *f += d * fits as i64;
                    *q += d * (pods.len() - fits) as i64;
                }
                second.extend_from_slice(&pods[fits..]);
            }
            let (first, rest) = (self.sparse(&first), self.sparse(&rest));
            if second.is_empty() || second.len() == pod_count {
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
        self.touch(a);
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
            self.touch(a);
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
        self.touch(a);
        let mut by_receiver: Vec<(usize, Vec<usize>)> = Vec::new();
        for &(p, b) in moves {
            take_out(state, a, p);
            match by_receiver.iter_mut().find(|(x, _)| *x == b) {
                Some((_, pods)) => pods.push(p),
                None => by_receiver.push((b, vec![p])),
            }
        }
        state.planned[a].types.clear();
        let mut stranded: Vec<(usize, usize)> = Vec::new();
        for (b, pods) in by_receiver {
            self.touch(b);
            let t = state.planned[b].template;
            let held = state.planned[b].clone();
            state.release_limits(t, &held);
            let mut claim = held;
            // Let the receiver grow into any type its pool (and limits) allow.
            let mut extra = ResourceList::new();
            for &p in &pods {
                extra.add(&state.pods[p].requests_with_pod_slot());
            }
            let cap = Self::cap(state, None, t);
            let wide = self.fitting_types(state, &claim, &extra, cap.as_ref());
            // The cheapest type that takes them all: each pod's check is then one type.
            let types = wide.first().map_or(wide.clone(), |&ty| vec![ty]);
            claim.set_types(&state.templates[t], types);
            let mut added = Vec::new();
            for p in pods {
                if self.add_to(state, &mut claim, p) {
                    added.push(p);
                } else {
                    stranded.push((p, t));
                }
            }
            let id = claim.id;
            state.planned[b] = claim;
            for p in added {
                self.retarget(state, p, id);
            }
            let claim = state.planned[b].clone();
            state.subtract_limits(t, &claim);
            self.settle(state, b);
        }
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

/// A claim that may take the pods of a closed one.
struct Receiver {
    b: usize,
    /// Its requirements and requests with the pods it would take so far.
    reqs: Requirements,
    requests: ResourceList,
    price: f64,
    /// What its launch type has left (over the stage's dimensions), until a move makes it
    /// grow.
    room: Option<Vec<i64>>,
    /// Whether it holds only free pods (then it may take pods that narrow its requirements).
    free: bool,
}

/// How many of `n` pods of demand `d` fit in `room` (dense vectors).
fn fit_count(room: &[i64], d: &[i64], n: usize) -> usize {
    let mut fits = n as i64;
    for (r, x) in room.iter().zip(d) {
        if *x > 0 {
            fits = fits.min((r / x).max(0));
        }
    }
    fits.max(0) as usize
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
