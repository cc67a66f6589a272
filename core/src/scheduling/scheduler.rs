//! The state of one solve, shared by both packers: the templates in weight order, the
//! existing nodes with what is left on them, the NodeClaims planned so far, what remains of
//! each NodePool's limits, the topology counts, and every placement in order.

use crate::shared::FastMap;

use crate::labels;
use crate::pod::Pod;
use crate::resources::{ResourceList, ResourceName};

use super::input::{Snapshot, SolveOptions};
use super::nodes::{Addition, ExistingNode, PlannedNode};
use super::output::{Placement, Target};
use super::room::RoomTree;
use super::template::Template;
use super::topology::Topology;
use super::view::{PodData, PodView};

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
    /// What the existing nodes have left, for the scan in order to pass over those with no
    /// room (kept up to date wherever one changes).
    pub(super) room: RoomTree,
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
    /// The highest weight of any template (claims of lower-weight pools are only joined by
    /// pods no higher-weight pool can take).
    pub(super) max_weight: i32,
    /// Reasons for pods a later stage (improve) handed back to the per-pod loop and that
    /// stayed unplaced.
    pub(super) leftover_errors: FastMap<usize, String>,
    /// The dovetail packer's equivalence class of each pending pod (`u32::MAX`: none).
    pub(super) class_of: Vec<u32>,
    /// While a trial runs, the existing nodes as they were before each change
    /// (trials: `Scheduler::checkpoint`).
    pub(super) trail: Option<Vec<Saved>>,
    /// A trial's bound on the new claims it may plan: the per-pod loop stops once it is
    /// passed (the move is no move then, and its remaining pods need not be tried).
    pub(super) claim_cap: Option<usize>,
}

/// What an existing node was before a placement changed it (a trial's journal).
pub(super) struct Saved {
    pub(super) node: usize,
    pub(super) remaining: ResourceList,
    pub(super) requirements: crate::requirements::Requirements,
    pub(super) host_ports: usize,
    pub(super) pods: usize,
    pub(super) out: bool,
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
        let max_weight = templates.iter().map(|t| t.pool.weight).max().unwrap_or(0);
        let tolerate_prefer_no_schedule = snapshot
            .nodepools
            .iter()
            .any(|p| p.pool.taints.iter().any(|t| t.effect == crate::taints::Effect::PreferNoSchedule));

        let mut bound: FastMap<&str, Vec<&Pod>> = FastMap::default();
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
        let room = RoomTree::new(&existing);
        Scheduler {
            pods,
            opts,
            templates,
            existing,
            room,
            planned: Vec::new(),
            remaining,
            topology,
            warnings,
            order: Vec::new(),
            tolerate_prefer_no_schedule,
            next_hostname: 0,
            pin_counted: false,
            pin_cursor: 0,
            max_weight,
            leftover_errors: FastMap::default(),
            class_of: Vec::new(),
            trail: None,
            claim_cap: None,
        }
    }

    /// Remembers existing node `n` as it is, when journaling.
    pub(super) fn save_existing(&mut self, n: usize) {
        let Some(trail) = &mut self.trail else { return };
        let e = &self.existing[n];
        trail.push(Saved {
            node: n,
            remaining: e.remaining.clone(),
            requirements: e.requirements.clone(),
            host_ports: e.host_ports.len(),
            pods: e.pods.len(),
            out: e.out,
        });
    }

    /// The first existing node from `from` on (in order) that takes pod `idx` as `view` and
    /// `data` describe it, with the node's requirements once it does; the room tree passes
    /// over the nodes with no room for it.
    pub(super) fn first_existing(
        &self,
        from: usize,
        idx: usize,
        view: &PodView,
        data: &PodData,
    ) -> Option<(usize, crate::requirements::Requirements)> {
        let pod = &self.pods[idx];
        let mut from = from;
        while let Some(n) = self.room.first(from, &data.requests) {
            if let Some(reqs) = self.existing[n].can_add(&self.topology, idx, pod, data, &view.tolerations) {
                return Some((n, reqs));
            }
            from = n + 1;
        }
        None
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
        self.save_existing(n);
        self.existing[n].add(&mut self.topology, idx, &self.pods[idx], data, reqs);
        self.room.update(n, &self.existing[n]);
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
    pub(super) fn pinned_new_claim(
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

    pub(super) fn try_new_claim(
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

    /// Makes room under template `t`'s limits for a claim of capacity `need`, if the pool's
    /// planned claims can give it back. Each claim reserves the largest capacity among its
    /// candidates (Karpenter's `subtractMax`), so a batch of small claims can exhaust a large
    /// limit at a few percent of use. For each limited resource short of `need`, the claims
    /// give up their largest candidates down to a common level (water-filling: the largest
    /// reservations shrink first, none below its own smallest candidate), just enough for
    /// `need`. Returns whether `need` now fits.
    pub(super) fn make_room(&mut self, t: usize, need: &ResourceList) -> bool {
        let Some(limits) = self.remaining[t].as_ref().map(|r| r.iter().map(|(n, _)| n.clone()).collect::<Vec<_>>())
        else {
            return true;
        };
        let its = self.templates[t].instance_types;
        for r in limits.iter().filter(|n| **n != ResourceName::Nodes) {
            let left = self.remaining[t].as_ref().map_or(0, |rem| rem.get(r));
            let deficit = need.get(r) - left;
            if deficit <= 0 {
                continue;
            }
            // (claim, reservation of r, smallest candidate's r)
            let claims: Vec<(usize, i64, i64)> = self
                .planned
                .iter()
                .enumerate()
                // A claim whose requirements ask for minValues keeps its candidates: narrowing
                // them could leave fewer values than the pool asks for.
                .filter(|(_, c)| {
                    c.template == t && !c.pods.is_empty() && c.types.len() > 1 && !asks_min_values(&c.requirements)
                })
                .map(|(i, c)| {
                    let caps = c.types.iter().map(|&ty| its[ty].capacity.get(r));
                    let (lo, hi) = caps.fold((i64::MAX, 0), |(lo, hi), v| (lo.min(v), hi.max(v)));
                    (i, hi, lo)
                })
                .collect();
            let freed = |level: i64| -> i64 { claims.iter().map(|&(_, hi, lo)| (hi - level.max(lo)).max(0)).sum() };
            if freed(0) < deficit {
                return false;
            }
            // The highest level that frees enough.
            let (mut lo, mut hi) = (0i64, claims.iter().map(|c| c.1).max().unwrap_or(0));
            while lo < hi {
                let mid = lo + (hi - lo + 1) / 2;
                if freed(mid) >= deficit { lo = mid } else { hi = mid - 1 }
            }
            for &(c, res, floor) in &claims {
                let level = lo.max(floor);
                if res <= level {
                    continue;
                }
                let old = self.planned[c].clone();
                self.release_limits(t, &old);
                let kept: Vec<usize> =
                    old.types.iter().copied().filter(|&ty| its[ty].capacity.get(r) <= level).collect();
                self.planned[c].set_types(&self.templates[t], kept);
                let claim = self.planned[c].clone();
                self.subtract_limits(t, &claim);
            }
        }
        self.remaining[t]
            .as_ref()
            .is_none_or(|rem| rem.iter().all(|(n, v)| if *n == ResourceName::Nodes { v > 0 } else { need.get(n) <= v }))
    }

    /// The capacity of the cheapest type of template `t` that could hold the pod alone (its
    /// requirements met, its requests and the type's DaemonSets fitting): what a new claim
    /// for it needs of the pool's limits at least.
    pub(super) fn least_need(&self, t: usize, data: &PodData) -> Option<ResourceList> {
        let template = &self.templates[t];
        let need = template.need(&data.requests);
        template
            .types
            .iter()
            .copied()
            .filter(|&ty| {
                template.fits(&need, ty) && template.instance_types[ty].requirements.intersects_ok(&data.requirements)
            })
            .map(|ty| (template.instance_types[ty].cheapest_price(&data.requirements), ty))
            .filter(|(p, _)| *p < f64::MAX)
            .min_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)))
            .map(|(_, ty)| template.instance_types[ty].capacity.clone())
    }

    /// Narrows planned claim `c` (of a pool with limits) to the candidates no larger, in
    /// every resource the limits name, than its cheapest candidate (its contents fit all of
    /// them already), and moves its reservation of the pool's limits to match. Returns
    /// whether the reservation shrank.
    pub(super) fn tighten_claim(&mut self, c: usize) -> bool {
        let claim = &self.planned[c];
        let t = claim.template;
        if self.remaining[t].is_none() || claim.pods.is_empty() || claim.types.len() < 2 {
            return false;
        }
        let template = &self.templates[t];
        let its = template.instance_types;
        let limited: Vec<&ResourceName> =
            template.pool.limits.iter().map(|(n, _)| n).filter(|n| **n != ResourceName::Nodes).collect();
        let filter = crate::catalog::OfferingFilter::new(&claim.requirements);
        let Some(&cheapest) = claim.types.iter().min_by(|&&a, &&b| {
            its[a].cheapest_price_with(&filter).total_cmp(&its[b].cheapest_price_with(&filter)).then(a.cmp(&b))
        }) else {
            return false;
        };
        let bound = &its[cheapest].capacity;
        let tight: Vec<usize> = claim
            .types
            .iter()
            .copied()
            .filter(|&i| limited.iter().all(|n| its[i].capacity.get(n) <= bound.get(n)))
            .collect();
        if tight.len() == claim.types.len()
            || !super::filter::unmet_min_values(its, &tight, &claim.requirements).is_empty()
        {
            return false;
        }
        let before = self.reservation(t, claim);
        let old = claim.clone();
        self.release_limits(t, &old);
        self.planned[c].set_types(&self.templates[t], tight);
        let claim = self.planned[c].clone();
        self.subtract_limits(t, &claim);
        self.reservation(t, &claim) != before
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

/// Whether any of `reqs` asks for a minimum number of values (`minValues`).
pub(super) fn asks_min_values(reqs: &crate::requirements::Requirements) -> bool {
    reqs.iter().any(|(_, r)| r.min_values.is_some())
}
