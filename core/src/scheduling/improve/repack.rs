//! The exact re-pack of small inputs: the pods of every claim that holds only free pods,
//! re-packed by the exact search ([`crate::scheduling::exact`]) and the claims replaced when
//! that is cheaper.

use std::collections::HashMap;

use crate::requirements::Requirements;
use crate::resources::{ResourceList, ResourceName};
use crate::scheduling::exact;
use crate::scheduling::price::Pricer;
use crate::scheduling::scheduler::Scheduler;

use super::{EPSILON, EXACT_MAX_PODS, EXACT_STATES, Improve, merge_requirements, pod_data};

impl Improve {
    /// Re-packs the pods of every all-free claim exactly, when there are few of them.
    pub(super) fn exact(&mut self, state: &mut Scheduler<'_>) {
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
        let ids = crate::scheduling::classes::ids(state.pods, &idx);
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
