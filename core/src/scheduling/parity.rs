//! The parity packer: Karpenter's `Scheduler.Solve` loop over pending pods, placing each on
//! an existing node, else on a NodeClaim planned in this solve, else on a new NodeClaim
//! from the highest-weight NodePool that can take it, relaxing preferences on failure. The
//! dovetail packer hands it whatever it could not place, so every pod that stays
//! unplaced gets Karpenter's reason.

use std::collections::{HashMap, VecDeque};

use crate::labels;
use crate::pod::Pod;
use crate::requirements::Operator;
use crate::resources::ResourceName;

use super::input::MinValuesPolicy;
use super::scheduler::{Scheduler, pinned_zone};
use super::view::{PodData, PodView};

impl Scheduler<'_> {
    /// Runs the parity solve; returns the error of every pod that could not be placed.
    pub fn solve(&mut self) -> HashMap<usize, String> {
        let (mut errors, queue) = self.validate_pods();
        errors.extend(self.run_queue(queue));
        errors
    }

    /// Splits the pods into those Karpenter ignores (with the reason) and the rest, in
    /// Karpenter's queue order: CPU, then memory descending, then creation, then name.
    pub fn validate_pods(&self) -> (HashMap<usize, String>, Vec<usize>) {
        let all: Vec<usize> = (0..self.pods.len()).collect();
        self.validate_subset(&all)
    }

    /// [`Scheduler::validate_pods`] of some of the pods.
    pub fn validate_subset(&self, pods: &[usize]) -> (HashMap<usize, String>, Vec<usize>) {
        let mut errors: HashMap<usize, String> = HashMap::new();
        let mut queue: Vec<usize> = Vec::new();
        for &i in pods {
            let Some(p) = self.pods.get(i) else { continue };
            match validate(p) {
                Ok(()) => queue.push(i),
                Err(e) => {
                    errors.insert(i, format!("ignoring pod, {e}"));
                }
            }
        }
        let pods = self.pods;
        queue.sort_by(|&a, &b| {
            let (ra, rb) = (&pods[a].requests, &pods[b].requests);
            rb.get(&ResourceName::Cpu)
                .cmp(&ra.get(&ResourceName::Cpu))
                .then_with(|| rb.get(&ResourceName::Memory).cmp(&ra.get(&ResourceName::Memory)))
                .then_with(|| pods[a].creation.cmp(&pods[b].creation))
                .then_with(|| pods[a].key.cmp(&pods[b].key))
        });
        (errors, queue)
    }

    /// Karpenter's loop over a queue: each pod is tried (relaxing preferences on failure)
    /// and requeued until a whole pass makes no progress.
    ///
    /// A twin of a pod that failed, tried while nothing was placed since, fails the same way:
    /// for pods with no topology (spread or pod affinity) and no preferences to relax, that
    /// error is reused instead of trying every node and claim again. The outcome is the same;
    /// a burst of pods that fit nowhere no longer costs pods x nodes.
    pub fn run_queue(&mut self, queue: Vec<usize>) -> HashMap<usize, String> {
        let mut errors: HashMap<usize, String> = HashMap::new();
        let class = super::classes::ids(self.pods, &queue);
        let tolerate = self.tolerate_prefer_no_schedule;
        let plain = |p: &Pod| plain(p, tolerate);
        // Successful placements so far, and per class the last failure with that count.
        let mut placed = 0usize;
        let mut failed: HashMap<usize, (usize, String)> = HashMap::new();
        let mut queue: VecDeque<usize> = queue.into();
        let mut last_len: HashMap<usize, usize> = HashMap::new();
        while let Some(&idx) = queue.front() {
            if last_len.get(&idx) == Some(&queue.len()) {
                break;
            }
            queue.pop_front();
            let c = class.get(&idx).copied();
            let known = c.and_then(|c| failed.get(&c)).filter(|(at, _)| *at == placed).map(|(_, e)| e.clone());
            let result = match known {
                Some(e) => Err(e),
                None => self.try_schedule(idx),
            };
            match result {
                Ok(()) => {
                    placed += 1;
                    errors.remove(&idx);
                    if self.claim_cap.is_some_and(|cap| self.planned.len() > cap) {
                        break;
                    }
                }
                Err(e) => {
                    if let Some(c) = c
                        && plain(&self.pods[idx])
                    {
                        failed.insert(c, (placed, e.clone()));
                    }
                    errors.insert(idx, e);
                    let pod = &self.pods[idx];
                    self.topology.update(idx, pod, &PodView::new(pod));
                    queue.push_back(idx);
                    last_len.insert(idx, queue.len());
                }
            }
        }
        errors
    }

    pub(super) fn try_schedule(&mut self, idx: usize) -> Result<(), String> {
        let pod = &self.pods[idx];
        let mut view = PodView::new(pod);
        loop {
            let data = PodData::new(pod, &view, self.opts.preference_policy);
            match self.add(idx, &view, &data) {
                Ok(()) => return Ok(()),
                Err(e) => {
                    if view.relax(self.tolerate_prefer_no_schedule).is_none() {
                        return Err(e);
                    }
                    self.topology.update(idx, pod, &view);
                }
            }
        }
    }

    fn add(&mut self, idx: usize, view: &PodView, data: &PodData) -> Result<(), String> {
        // (a) existing nodes, in order (passing over those with no room for it).
        if let Some((n, reqs)) = self.first_existing(0, idx, view, data) {
            self.place_existing(n, idx, data, reqs);
            return Ok(());
        }
        let pod = &self.pods[idx];
        // (b) NodeClaims planned in this solve, least-full first. Weight is a strict
        // priority: a claim of a pool weighted below the highest-weight pool that could
        // open a claim for the pod is passed over (Karpenter's in-flight check ignores
        // weight, so a pod a weighted pool should take can ride on a lower pool's claim
        // planned earlier in the batch; docs/scheduling.md).
        self.planned.sort_by_key(|p| p.pods.len());
        let relax_min_values = self.opts.min_values_policy == MinValuesPolicy::BestEffort;
        let counted = self.pin_counted && self.topology.counted_beyond_hostname(pod);
        let mut best_weight: Option<Option<i32>> = None;
        for c in 0..self.planned.len() {
            let weight = self.templates[self.planned[c].template].pool.weight;
            if weight < self.max_weight {
                let best = *best_weight.get_or_insert_with(|| {
                    self.first_template_for(idx, view, data).map(|t| self.templates[t].pool.weight)
                });
                if best.is_some_and(|b| b > weight) {
                    continue;
                }
            }
            let claim = &self.planned[c];
            if counted && pinned_zone(&claim.requirements).is_none() {
                continue;
            }
            let template = &self.templates[claim.template];
            if let Ok(add) =
                claim.can_add(template, &self.topology, idx, pod, data, &view.tolerations, relax_min_values, true)
            {
                self.place_planned(c, idx, data, add);
                return Ok(());
            }
        }
        // (c) a new NodeClaim from the highest-weight template that can take the pod.
        if self.templates.is_empty() {
            return Err("nodepool requirements filtered out all available instance types".into());
        }
        let mut errs = Vec::new();
        for t in 0..self.templates.len() {
            let mut attempt = self.try_new_claim(t, idx, view, data, relax_min_values, None);
            if attempt.is_err()
                && self.remaining[t].is_some()
                && let Some(need) = self.least_need(t, data)
                && self.make_room(t, &need)
            {
                attempt = self.try_new_claim(t, idx, view, data, relax_min_values, None);
            }
            match attempt {
                Ok((claim, add)) => {
                    let (claim, add) = if counted && pinned_zone(&add.requirements).is_none() {
                        self.pinned_new_claim(t, idx, view, data, relax_min_values, &add.requirements)
                            .unwrap_or((claim, add))
                    } else {
                        (claim, add)
                    };
                    self.planned.push(claim);
                    self.next_hostname += 1;
                    let c = self.planned.len() - 1;
                    self.place_planned(c, idx, data, add);
                    let claim = self.planned[c].clone();
                    self.subtract_limits(t, &claim);
                    return Ok(());
                }
                Err(e) => errs.push(format!("nodepool {:?}: {e}", self.templates[t].pool.name)),
            }
        }
        Err(errs.join("; "))
    }
}

impl Scheduler<'_> {
    /// The first template (the highest-weight one) that could open a new claim for the pod.
    pub(super) fn first_template_for(&self, idx: usize, view: &PodView, data: &PodData) -> Option<usize> {
        let relax_min_values = self.opts.min_values_policy == MinValuesPolicy::BestEffort;
        (0..self.templates.len()).find(|&t| self.try_new_claim(t, idx, view, data, relax_min_values, None).is_ok())
    }
}

/// A pod with no topology (spread, pod affinity or anti-affinity) and no preferences to
/// relax: where it fits depends on each node's own room, requirements, taints and ports, and
/// on the pods already placed only through the node.
pub(super) fn plain(p: &Pod, tolerate_prefer_no_schedule: bool) -> bool {
    p.topology_spread.is_empty()
        && p.pod_affinity.required.is_empty()
        && p.pod_affinity.preferred.is_empty()
        && p.pod_anti_affinity.required.is_empty()
        && p.pod_anti_affinity.preferred.is_empty()
        && PodView::new(p).relax(tolerate_prefer_no_schedule).is_none()
}

/// Karpenter's pod validation: pods it ignores, and why.
fn validate(pod: &Pod) -> Result<(), String> {
    let view = PodView::new(pod);
    let reqs = view.requirements(true);
    if reqs.get_defined(labels::NODEPOOL).is_some_and(|r| r.operator() == Operator::DoesNotExist) {
        return Err(format!(
            "configured to not run on a Karpenter provisioned node (requirement={} DoesNotExist)",
            labels::NODEPOOL
        ));
    }
    if pod.uses_match_fields {
        return Err("node selector term with matchFields is not supported".into());
    }
    let mut keys: Vec<&str> = pod.node_selector.keys().map(String::as_str).collect();
    for term in &pod.node_affinity.required {
        keys.extend(term.iter().map(|(k, _)| k));
    }
    for key in keys {
        if let Some(reason) = labels::restricted_label_reason(key) {
            return Err(reason);
        }
    }
    let ct = reqs.get(labels::CAPACITY_TYPE);
    if reqs.has(labels::CAPACITY_TYPE)
        && ct.operator() == Operator::In
        && !ct.values().iter().any(|v| matches!(v.as_str(), "spot" | "on-demand" | "reserved"))
    {
        return Err(format!(
            "invalid values: {:?} for key: {}, expected one of: [on-demand spot reserved]",
            ct.values(),
            labels::CAPACITY_TYPE
        ));
    }
    Ok(())
}
