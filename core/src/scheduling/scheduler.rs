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
    tolerate_prefer_no_schedule: bool,
    next_hostname: usize,
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
            topology.update(i, p, &PodView::new(p));
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
            tolerate_prefer_no_schedule,
            next_hostname: 0,
        }
    }

    /// Runs the solve; returns the error of every pod that could not be placed.
    pub fn solve(&mut self) -> HashMap<usize, String> {
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
        let data: Vec<PodData> =
            self.pods.iter().map(|p| PodData::new(p, &PodView::new(p), self.opts.preference_policy)).collect();
        queue.sort_by(|&a, &b| {
            let (ra, rb) = (&data[a].requests, &data[b].requests);
            rb.get(&ResourceName::Cpu)
                .cmp(&ra.get(&ResourceName::Cpu))
                .then_with(|| rb.get(&ResourceName::Memory).cmp(&ra.get(&ResourceName::Memory)))
                .then_with(|| self.pods[a].creation.cmp(&self.pods[b].creation))
                .then_with(|| self.pods[a].key.cmp(&self.pods[b].key))
        });
        let mut queue: VecDeque<usize> = queue.into();
        let mut last_len: HashMap<usize, usize> = HashMap::new();
        while let Some(&idx) = queue.front() {
            if last_len.get(&idx) == Some(&queue.len()) {
                break;
            }
            queue.pop_front();
            match self.try_schedule(idx) {
                Ok(()) => {
                    errors.remove(&idx);
                }
                Err(e) => {
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

    fn try_schedule(&mut self, idx: usize) -> Result<(), String> {
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
            if let Ok(reqs) = self.existing[n].can_add(&self.topology, idx, pod, data, &view.tolerations) {
                self.existing[n].add(&mut self.topology, idx, pod, data, reqs);
                return Ok(());
            }
        }
        // (b) NodeClaims planned in this solve, least-full first.
        self.planned.sort_by_key(|p| p.pods.len());
        let relax_min_values = self.opts.min_values_policy == MinValuesPolicy::BestEffort;
        for c in 0..self.planned.len() {
            let claim = &self.planned[c];
            let template = &self.templates[claim.template];
            if let Ok(add) =
                claim.can_add(template, &self.topology, idx, pod, data, &view.tolerations, relax_min_values, true)
            {
                let claim = &mut self.planned[c];
                claim.add(&self.templates[claim.template], &mut self.topology, idx, pod, data, add);
                return Ok(());
            }
        }
        // (c) a new NodeClaim from the highest-weight template that can take the pod.
        if self.templates.is_empty() {
            return Err("nodepool requirements filtered out all available instance types".into());
        }
        let mut errs = Vec::new();
        for t in 0..self.templates.len() {
            match self.try_new_claim(t, idx, view, data, relax_min_values) {
                Ok((claim, add)) => {
                    let mut claim = claim;
                    claim.add(&self.templates[t], &mut self.topology, idx, pod, data, add);
                    self.subtract_limits(t, &claim);
                    self.planned.push(claim);
                    self.next_hostname += 1;
                    return Ok(());
                }
                Err(e) => errs.push(format!("nodepool {:?}: {e}", self.templates[t].pool.name)),
            }
        }
        Err(errs.join("; "))
    }

    fn try_new_claim(
        &self,
        t: usize,
        idx: usize,
        view: &PodView,
        data: &PodData,
        relax_min_values: bool,
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
        let hostname = format!("hostname-placeholder-{:04}", self.next_hostname + 1);
        let claim = PlannedNode::new(t, template, types, hostname);
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

    /// Karpenter's `subtractMax`: a new claim consumes, from the pool's remaining limits, the
    /// largest capacity among its candidate types (it may launch as any of them); and one
    /// node.
    fn subtract_limits(&mut self, t: usize, claim: &PlannedNode) {
        let Some(remaining) = &mut self.remaining[t] else { return };
        let mut max = ResourceList::new();
        for &i in &claim.types {
            max = max.max_with(&self.templates[t].instance_types[i].capacity);
        }
        max.set(ResourceName::Nodes, 1);
        *remaining = remaining.subtracted(&max);
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
