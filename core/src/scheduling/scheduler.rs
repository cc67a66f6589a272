//! The parity solve: Karpenter's `Scheduler.Solve` loop over pending pods, placing each on
//! an existing node, else on a NodeClaim planned in this solve, else on a new NodeClaim
//! from the highest-weight NodePool that can take it, relaxing preferences on failure.

use std::collections::{HashMap, VecDeque};

use crate::labels;
use crate::pod::Pod;
use crate::requirements::Operator;
use crate::resources::{ResourceList, ResourceName};

use super::nodes::{Addition, ExistingNode, PlannedNode};
use super::template::Template;
use super::topology::Topology;
use super::view::{PodData, PodView};
use super::{MinValuesPolicy, PreferencePolicy, Snapshot, SolveOptions};

/// Where a pod was placed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Target {
    /// Index into the snapshot's nodes.
    Existing(usize),
    /// A planned NodeClaim, by its id.
    Planned(usize),
}

/// One placement, in the order the solve made it, with the zone the node was known to be in
/// at that moment (`None` when its zone was still open).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Placement {
    pub pod: usize,
    pub target: Target,
    pub zone: Option<String>,
}

/// The single zone a set of requirements pins, if any.
pub fn pinned_zone(reqs: &crate::requirements::Requirements) -> Option<String> {
    let z = reqs.get(labels::ZONE);
    (reqs.has(labels::ZONE) && !z.is_complement() && z.values().len() == 1).then(|| z.values()[0].clone())
}

/// The state of one solve.
pub struct Scheduler<'a> {
    pub pods: &'a [Pod],
    pub opts: &'a SolveOptions,
    pub templates: Vec<Template<'a>>,
    pub existing: Vec<ExistingNode<'a>>,
    pub planned: Vec<PlannedNode>,
    /// Remaining limits per template; `None` when the pool has none.
    pub remaining: Vec<Option<ResourceList>>,
    pub topology: Topology<'a>,
    pub warnings: Vec<String>,
    /// Every placement, in order.
    pub order: Vec<Placement>,
    pub(super) tolerate_prefer_no_schedule: bool,
    pub(super) next_hostname: usize,
    /// Pin the claim of every pod that zone-keyed topology counts to one zone when it is
    /// placed, so that its count is never lost (the dovetail packer sets this; Karpenter
    /// leaves such claims open).
    pub(super) pin_counted: bool,
    /// Rotates the zone chosen when pinning.
    pub(super) pin_cursor: usize,
}

impl<'a> Scheduler<'a> {
    /// Prepares templates, existing nodes, limits and topology.
    pub fn new(snapshot: &'a Snapshot, pods: &'a [Pod], opts: &'a SolveOptions) -> Self {
        let mut order: Vec<usize> = (0..snapshot.nodepools.len()).collect();
        order.sort_by(|&a, &b| {
            let (pa, pb) = (&snapshot.nodepools[a].pool, &snapshot.nodepools[b].pool);
            pb.weight.cmp(&pa.weight).then_with(|| pb.name.cmp(&pa.name))
        });
        let mut templates = Vec::new();
        let mut warnings = Vec::new();
        for i in order {
            match Template::new(&snapshot.nodepools[i], i, &snapshot.daemonsets, opts.min_values_policy) {
                Ok(t) => templates.push(t),
                Err(w) => warnings.push(w),
            }
        }
        let tolerate_prefer_no_schedule = snapshot
            .nodepools
            .iter()
            .any(|p| p.pool.taints.iter().any(|t| t.effect == crate::taints::Effect::PreferNoSchedule));

        let mut bound: HashMap<&str, Vec<&Pod>> = HashMap::new();
        for p in &snapshot.bound_pods {
            if let Some(n) = &p.node_name
                && !p.terminal
            {
                bound.entry(n.as_str()).or_default().push(p);
            }
        }
        let mut existing: Vec<ExistingNode<'a>> = snapshot
            .nodes
            .iter()
            .enumerate()
            .map(|(i, n)| {
                ExistingNode::new(
                    n,
                    i,
                    bound.get(n.name.as_str()).map(Vec::as_slice).unwrap_or(&[]),
                    &snapshot.daemonsets,
                )
            })
            .collect();
        existing
            .sort_by(|a, b| b.node.initialized.cmp(&a.node.initialized).then_with(|| a.node.name.cmp(&b.node.name)));

        let remaining = templates
            .iter()
            .map(|t| {
                if t.pool.limits.is_empty() {
                    return None;
                }
                let mut r = t.pool.limits.clone();
                for n in &snapshot.nodes {
                    if n.nodepool() == Some(t.pool.name.as_str()) {
                        let mut cap = n.capacity.clone();
                        cap.set(ResourceName::Nodes, 1);
                        r = r.subtracted(&cap);
                    }
                }
                Some(r)
            })
            .collect();

        let mut topology = Topology::new(snapshot, opts.preference_policy);
        for (i, p) in pods.iter().enumerate() {
            // Pods of one workload come in a row and share their groups.
            if i > 0 && Topology::same_spec(&pods[i - 1], p) {
                topology.update_like(i, i - 1);
            } else {
                topology.update(i, p, &PodView::new(p));
            }
        }
        for n in &existing {
            topology.register(labels::HOSTNAME, n.node.hostname());
        }
        Scheduler {
            pods,
            opts,
            templates,
            existing,
            planned: Vec::new(),
            remaining,
            topology,
            warnings,
            order: Vec::new(),
            tolerate_prefer_no_schedule,
            next_hostname: 0,
            pin_counted: false,
            pin_cursor: 0,
        }
    }

    /// Runs the parity solve; returns the error of every pod that could not be placed.
    pub fn solve(&mut self) -> HashMap<usize, String> {
        let (mut errors, queue) = self.validate_pods();
        errors.extend(self.run_queue(queue));
        errors
    }

    /// Splits the pods into those Karpenter ignores (with the reason) and the rest, in
    /// Karpenter's queue order: CPU, then memory descending, then creation, then name.
    pub fn validate_pods(&self) -> (HashMap<usize, String>, Vec<usize>) {
        let mut errors: HashMap<usize, String> = HashMap::new();
        let mut queue: Vec<usize> = Vec::new();
        for (i, p) in self.pods.iter().enumerate() {
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
        let plain = |p: &Pod| {
            p.topology_spread.is_empty()
                && p.pod_affinity.required.is_empty()
                && p.pod_affinity.preferred.is_empty()
                && p.pod_anti_affinity.required.is_empty()
                && p.pod_anti_affinity.preferred.is_empty()
                && PodView::new(p).relax(tolerate).is_none()
        };
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
        let pod = &self.pods[idx];
        // (a) existing nodes, in order.
        for n in 0..self.existing.len() {
            if let Some(reqs) = self.existing[n].can_add(&self.topology, idx, pod, data, &view.tolerations) {
                self.place_existing(n, idx, data, reqs);
                return Ok(());
            }
        }
        // (b) NodeClaims planned in this solve, least-full first.
        self.planned.sort_by_key(|p| p.pods.len());
        let relax_min_values = self.opts.min_values_policy == MinValuesPolicy::BestEffort;
        let counted = self.pin_counted && self.topology.counted_beyond_hostname(pod);
        for c in 0..self.planned.len() {
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
            match self.try_new_claim(t, idx, view, data, relax_min_values, None) {
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

    /// Places a pod on an existing node and records it.
    pub(super) fn place_existing(
        &mut self,
        n: usize,
        idx: usize,
        data: &PodData,
        reqs: crate::requirements::Requirements,
    ) {
        let zone = pinned_zone(&reqs);
        self.existing[n].add(&mut self.topology, idx, &self.pods[idx], data, reqs);
        self.order.push(Placement { pod: idx, target: Target::Existing(self.existing[n].index), zone });
    }

    /// Places a pod on a planned NodeClaim and records it.
    pub(super) fn place_planned(&mut self, c: usize, idx: usize, data: &PodData, add: Addition) {
        let claim = &mut self.planned[c];
        claim.add(&self.templates[claim.template], &mut self.topology, idx, &self.pods[idx], data, add);
        self.order.push(Placement {
            pod: idx,
            target: Target::Planned(claim.id),
            zone: pinned_zone(&claim.requirements),
        });
    }

    /// A new claim for the pod pinned to one of the zones `reqs` allow (taken in turn from
    /// a rotating start), if any works.
    fn pinned_new_claim(
        &mut self,
        t: usize,
        idx: usize,
        view: &PodView,
        data: &PodData,
        relax_min_values: bool,
        reqs: &crate::requirements::Requirements,
    ) -> Option<(PlannedNode, Addition)> {
        let allowed = reqs.get(labels::ZONE);
        let template = &self.templates[t];
        let mut zones: Vec<&str> = template
            .types
            .iter()
            .flat_map(|&i| template.instance_types[i].offerings.iter())
            .filter(|o| o.available && allowed.has(&o.zone))
            .map(|o| o.zone.as_str())
            .collect();
        zones.sort_unstable();
        zones.dedup();
        let zones: Vec<String> = zones.into_iter().map(str::to_string).collect();
        for k in 0..zones.len() {
            let z = &zones[(self.pin_cursor + k) % zones.len()];
            if let Ok(found) = self.try_new_claim(t, idx, view, data, relax_min_values, Some(z)) {
                self.pin_cursor += k + 1;
                return Some(found);
            }
        }
        None
    }

    fn try_new_claim(
        &self,
        t: usize,
        idx: usize,
        view: &PodView,
        data: &PodData,
        relax_min_values: bool,
        zone: Option<&str>,
    ) -> Result<(PlannedNode, Addition), String> {
        let template = &self.templates[t];
        let mut types = template.types.clone();
        if let Some(remaining) = &self.remaining[t] {
            if remaining.contains(&ResourceName::Nodes) && remaining.get(&ResourceName::Nodes) <= 0 {
                return Err("node limits have been exhausted for nodepool".into());
            }
            types.retain(|&i| {
                let cap = &template.instance_types[i].capacity;
                remaining.iter().all(|(n, left)| *n == ResourceName::Nodes || cap.get(n) <= left)
            });
            if types.is_empty() {
                return Err("all available instance types exceed limits for nodepool".into());
            }
        }
        let mut claim = self.new_planned(t, types);
        if let Some(z) = zone {
            claim.requirements.add(labels::ZONE, crate::requirements::Requirement::is_in([z]));
        }
        let add = claim.can_add(
            template,
            &self.topology,
            idx,
            &self.pods[idx],
            data,
            &view.tolerations,
            relax_min_values,
            false,
        )?;
        Ok((claim, add))
    }

    /// For a pool with limits, the capacity a planned claim reserved (of the resources the
    /// limits name): its candidates may not exceed it.
    pub fn remaining_limit_types(&self, planned: &PlannedNode) -> Option<ResourceList> {
        let template = &self.templates[planned.template];
        if template.pool.limits.is_empty() {
            return None;
        }
        let mut cap = ResourceList::new();
        for &t in &planned.types {
            cap = cap.max_with(&template.instance_types[t].capacity);
        }
        Some(ResourceList::from_pairs(
            template
                .pool
                .limits
                .iter()
                .filter(|(n, _)| **n != ResourceName::Nodes)
                .map(|(n, _)| (n.clone(), cap.get(n))),
        ))
    }

    /// An empty NodeClaim of template `t` limited to `types`, with the next id.
    pub(super) fn new_planned(&self, t: usize, types: Vec<usize>) -> PlannedNode {
        let id = self.next_hostname + 1;
        PlannedNode::new(t, &self.templates[t], types, id)
    }

    /// Karpenter's `subtractMax`: a new claim consumes, from the pool's remaining limits, the
    /// largest capacity among its candidate types (it may launch as any of them); and one
    /// node.
    pub(super) fn subtract_limits(&mut self, t: usize, claim: &PlannedNode) {
        let max = self.reservation(t, claim);
        let Some(remaining) = &mut self.remaining[t] else { return };
        *remaining = remaining.subtracted(&max);
    }

    /// What a claim holds of its pool's limits: the largest capacity among its candidates,
    /// and one node.
    fn reservation(&self, t: usize, claim: &PlannedNode) -> ResourceList {
        let mut max = ResourceList::new();
        for &i in &claim.types {
            max = max.max_with(&self.templates[t].instance_types[i].capacity);
        }
        max.set(ResourceName::Nodes, 1);
        max
    }

    /// Gives back what `subtract_limits` took for a claim that ended up unused.
    pub(super) fn release_limits(&mut self, t: usize, claim: &PlannedNode) {
        let max = self.reservation(t, claim);
        let Some(remaining) = &mut self.remaining[t] else { return };
        for (n, v) in max.iter() {
            if remaining.contains(n) {
                remaining.add_amount(n.clone(), v);
            }
        }
    }
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

impl PreferencePolicy {
    /// Whether preferences are honoured (then relaxed) rather than ignored.
    pub fn respects(&self) -> bool {
        *self == PreferencePolicy::Respect
    }
}
