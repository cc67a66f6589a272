//! Local moves: rounds over the least-filled claims, each closed (its pods re-placed on
//! other claims of its pool) or split in two when that costs less.

use std::collections::HashMap;

use crate::requirements::Requirements;
use crate::resources::{ResourceList, ResourceName};
use crate::scheduling::nodes::PlannedNode;
use crate::scheduling::scheduler::Scheduler;
use crate::scheduling::view::PodData;

use super::{
    CANDIDATE_FILL, CANDIDATES, EPSILON, Improve, MOVE_BUDGET, RECEIVERS, SPLIT_TYPES, merge_requirements,
    node_requirements, pod_data, take_out,
};

impl Improve {
    /// Rounds of close and split moves over the least-filled free claims.
    pub(super) fn local(&mut self, state: &mut Scheduler<'_>) {
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
                if self.close(state, c, &list) || self.merge(state, c, &list) || self.split(state, c) {
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
    pub(crate) fn close(&mut self, state: &mut Scheduler<'_>, a: usize, candidates: &[usize]) -> bool {
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

    /// Merges claim `a` into another claim `b` of its pool when one node that takes both
    /// (their requirements merged; it may be a larger type than either) costs less than the
    /// two. `close` turns this down when most of `a` does not fit free room; a merge prices
    /// exactly that case, one receiver at a time.
    pub(crate) fn merge(&mut self, state: &mut Scheduler<'_>, a: usize, candidates: &[usize]) -> bool {
        let Some((price_a, _)) = self.claim_price(state, a) else { return false };
        let t = state.planned[a].template;
        let reqs_a = node_requirements(&state.planned[a]);
        let pods: Vec<usize> = state.planned[a].pods.clone();
        let mut extra = ResourceList::new();
        for &p in &pods {
            extra.add(&state.pods[p].requests_with_pod_slot());
        }
        let held_a = state.remaining_limit_types(&state.planned[a]).unwrap_or_default();
        let mut best: Option<(f64, usize)> = None;
        for &b in candidates {
            if self.spent >= MOVE_BUDGET {
                break;
            }
            let claim = &state.planned[b];
            if b == a || claim.template != t || !self.all_free(state, b) {
                continue;
            }
            let Some(merged) = merge_requirements(&node_requirements(claim), &reqs_a) else { continue };
            let total = claim.requests.merged(&extra);
            let Some((price_b, _)) = self.claim_price(state, b) else { continue };
            // What the merged claim may reserve: what both hold plus what is left.
            let cap = Self::cap(state, Some(b), t).map(|mut cap| {
                for (n, v) in held_a.iter() {
                    if cap.contains(n) {
                        cap.set(n.clone(), cap.get(n).saturating_add(v));
                    }
                }
                cap
            });
            let ports = state.planned[b].pod_ports.clone();
            let Some((after, _)) = self.price(state, t, &merged, &total, &ports, cap.as_ref()) else { continue };
            let gain = price_a + price_b - after;
            if gain > EPSILON && best.is_none_or(|(g, _)| gain > g) {
                best = Some((gain, b));
            }
        }
        let Some((_, b)) = best else { return false };
        let moves: Vec<(usize, usize)> = pods.into_iter().map(|p| (p, b)).collect();
        self.commit_moves(state, a, &moves)
    }

    /// Splits claim `a` in two when two smaller claims cost less: its pods, largest first,
    /// fill the first node (each of the dearest types cheaper than the claim in turn) and
    /// the rest go to a second one.
    pub(crate) fn split(&mut self, state: &mut Scheduler<'_>, a: usize) -> bool {
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
    ///
    /// Nothing changes (and it returns false) unless every receiver has a type that meets
    /// its requirements merged with its new pods' and fits them all: a committed move never
    /// leaves a claim with no candidates.
    fn commit_moves(&mut self, state: &mut Scheduler<'_>, a: usize, moves: &[(usize, usize)]) -> bool {
        let mut by_receiver: Vec<(usize, Vec<usize>)> = Vec::new();
        for &(p, b) in moves {
            match by_receiver.iter_mut().find(|(x, _)| *x == b) {
                Some((_, pods)) => pods.push(p),
                None => by_receiver.push((b, vec![p])),
            }
        }
        // Each receiver's type, checked before anything moves: the cheapest type of its pool
        // (within its limits) that meets the merged requirements and takes every pod.
        let mut chosen: Vec<usize> = Vec::with_capacity(by_receiver.len());
        for (b, pods) in &by_receiver {
            let claim = &state.planned[*b];
            let t = claim.template;
            let mut reqs = Some(node_requirements(claim));
            let mut extra = ResourceList::new();
            for &p in pods {
                extra.add(&state.pods[p].requests_with_pod_slot());
                reqs = reqs.and_then(|r| merge_requirements(&r, &pod_data(state, p).requirements));
            }
            let Some(reqs) = reqs else { return false };
            let held = claim.clone();
            state.release_limits(t, &held);
            let cap = Self::cap(state, None, t);
            state.subtract_limits(t, &held);
            let Some(&ty) = self.fitting_types(state, &held, &reqs, &extra, cap.as_ref()).first() else {
                return false;
            };
            chosen.push(ty);
        }
        let old = state.planned[a].clone();
        state.release_limits(old.template, &old);
        self.touch(a);
        for &(p, _) in moves {
            take_out(state, a, p);
        }
        state.planned[a].types.clear();
        let mut stranded: Vec<(usize, usize)> = Vec::new();
        for ((b, pods), ty) in by_receiver.into_iter().zip(chosen) {
            self.touch(b);
            let t = state.planned[b].template;
            let held = state.planned[b].clone();
            state.release_limits(t, &held);
            let mut claim = held;
            // The cheapest type that takes them all: each pod's check is then one type.
            claim.set_types(&state.templates[t], vec![ty]);
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

    /// Every type of claim `c`'s pool that meets `reqs` and fits its pods plus `extra`,
    /// within `cap`.
    fn fitting_types(
        &mut self,
        state: &Scheduler<'_>,
        claim: &PlannedNode,
        reqs: &Requirements,
        extra: &ResourceList,
        cap: Option<&ResourceList>,
    ) -> Vec<usize> {
        let t = claim.template;
        let template = &state.templates[t];
        let rungs = self.pricer.rungs(template, t, reqs);
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
    pub(super) fn settle(&mut self, state: &mut Scheduler<'_>, c: usize) {
        let claim = state.planned[c].clone();
        if claim.pods.is_empty() {
            return;
        }
        let t = claim.template;
        state.release_limits(t, &claim);
        let cap = Self::cap(state, None, t);
        let types = self.fitting_types(state, &claim, &node_requirements(&claim), &ResourceList::new(), cap.as_ref());
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
            // minValues counts values over the candidates: narrowing must not go below it.
            let its = state.templates[t].instance_types;
            if crate::scheduling::filter::unmet_min_values(its, &tight, &claim.requirements).is_empty() {
                state.planned[c].set_types(&state.templates[t], tight);
            }
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
