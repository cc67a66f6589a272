//! The dovetail packer: the same constraints as the parity packer (every placement goes
//! through the same `can_add` checks), a different placement policy.
//!
//! 1. Pods collapse into equivalence classes.
//! 2. Existing nodes are filled first, class by class.
//! 3. Each class is routed to the highest-weight NodePool that can take it.
//! 4. Per NodePool, NodeClaims are opened one instance type at a time: dual prices from an
//!    LP over the remaining demand (resources, plus one "slot" per node for groups that allow
//!    only a few pods per node) value each class; the assignment LP splits classes over types
//!    (`round`); what is left goes, type by type, to the column worth the most per dollar
//!    (`pool`). Classes of which only a few pods fit a node are packed first, by patterns
//!    (`patterns`).
//! 5. Whatever could not be placed that way goes through Karpenter's per-pod loop, which
//!    also produces the reasons for unschedulable pods.
//! 6. Each claim's candidate types are re-derived from its final contents, so it launches
//!    as the cheapest type that fits (right-sizing, a later stage).

mod bins;
mod columns;
mod patterns;
mod pool;
mod round;
mod zones;

use std::collections::HashMap;

use crate::resources::{ResourceList, ResourceName};
use crate::taints::{self, Effect, Taint};

use super::classes::{self, Class};
use super::nodes::PlannedNode;
use super::scheduler::{Scheduler, pinned_zone};
use super::view::{PodData, PodView};

use columns::{Packing, TypeColumn};

/// What packing one template reads: its classes and their derived data.
struct Ctx<'c> {
    /// The template.
    pub t: usize,
    /// The classes packed here (indices into the solve's classes).
    pub members: &'c [usize],
    /// Per class of the solve.
    pub data: &'c [PodData],
    pub views: &'c [PodView],
    /// Per member: demand vectors and values.
    pub packing: &'c Packing<'c>,
    pub columns: &'c [TypeColumn],
    /// Per member, per column: whether the class may use the column.
    pub compat: &'c [Vec<bool>],
}

fn tolerates_hard(pool_taints: &[Taint], tolerations: &[taints::Toleration]) -> bool {
    let hard: Vec<Taint> = pool_taints.iter().filter(|t| t.effect != Effect::PreferNoSchedule).cloned().collect();
    taints::tolerates_all(&hard, tolerations)
}

impl Scheduler<'_> {
    /// Runs the dovetail packer; returns the error of every pod that could not be placed.
    pub fn solve_dovetail(&mut self) -> HashMap<usize, String> {
        self.pin_counted = true;
        let (mut errors, queue) = self.validate_pods();
        let (mut classes, caps) = classes::build(self.pods, &queue);
        self.class_of = vec![u32::MAX; self.pods.len()];
        for (k, class) in classes.iter().enumerate() {
            for &p in &class.pods {
                self.class_of[p] = k as u32;
            }
        }
        let data: Vec<PodData> = classes
            .iter()
            .map(|c| {
                let p = &self.pods[c.pods[0]];
                PodData::new(p, &PodView::new(p), self.opts.preference_policy)
            })
            .collect();
        let views: Vec<PodView> = classes.iter().map(|c| PodView::new(&self.pods[c.pods[0]])).collect();

        // Largest first, as Karpenter orders its queue.
        let mut by_size: Vec<usize> = (0..classes.len()).collect();
        by_size.sort_by(|&a, &b| {
            let (ra, rb) = (&classes[a].requests, &classes[b].requests);
            rb.get(&ResourceName::Cpu)
                .cmp(&ra.get(&ResourceName::Cpu))
                .then_with(|| rb.get(&ResourceName::Memory).cmp(&ra.get(&ResourceName::Memory)))
                .then_with(|| a.cmp(&b))
        });

        if !self.existing.is_empty() {
            for &c in &by_size {
                self.fill_existing(&mut classes[c], &data[c], &views[c]);
            }
        }

        // Route each class to the highest-weight template it can use.
        let mut route: Vec<Option<usize>> = vec![None; classes.len()];
        for (c, class) in classes.iter().enumerate() {
            route[c] = self.next_template(0, &data[c], &views[c], &class.requests);
        }
        // Templates are packed in priority order (weight, then name, descending): weight is a
        // strict priority, so a class goes to the highest-weight pool that can take it and
        // never rides on a lower-weight pool's claims. Before opening claims of its own pool,
        // a class fills room on claims already planned for pools of at least its pool's
        // weight (Karpenter tries in-flight claims before opening one). A pool that reaches
        // its limits hands the rest of its classes to the next pool by weight, which is then
        // packed (again) in the next pass.
        let mut deferred = vec![false; classes.len()];
        for _pass in 0..=self.templates.len() {
            let mut spilled = false;
            for t in 0..self.templates.len() {
                let members: Vec<usize> =
                    by_size.iter().copied().filter(|&c| route[c] == Some(t) && classes[c].remaining() > 0).collect();
                if members.is_empty() {
                    continue;
                }
                if self.templates.len() > 1 && !self.planned.is_empty() {
                    let weight = self.templates[t].pool.weight;
                    for &c in &members {
                        self.fill_planned(&mut classes[c], &data[c], &views[c], weight);
                    }
                }
                let members: Vec<usize> = members.into_iter().filter(|&c| classes[c].remaining() > 0).collect();
                if members.is_empty() {
                    continue;
                }
                let exhausted = self.pack_template(t, &members, &mut classes, &caps, &data, &views, &mut deferred);
                if exhausted {
                    // Limits reached: the rest goes to the next pool that can take it.
                    for &c in &members {
                        if classes[c].remaining() > 0 && !deferred[c] {
                            route[c] = self.next_template(t + 1, &data[c], &views[c], &classes[c].requests);
                            spilled |= route[c].is_some();
                        }
                    }
                }
            }
            if !spilled {
                break;
            }
        }

        // Everything left goes through Karpenter's per-pod loop, in its queue order.
        let mut leftover: Vec<usize> =
            classes.iter().flat_map(|c| c.pods[c.next..].iter().copied()).collect::<Vec<_>>();
        let position: HashMap<usize, usize> = queue.iter().enumerate().map(|(i, p)| (*p, i)).collect();
        leftover.sort_by_key(|p| position.get(p).copied().unwrap_or(usize::MAX));
        errors.extend(self.run_queue(leftover));
        errors
    }

    /// The first template at or after `from` whose taints, requirements and some type fit
    /// the class.
    fn next_template(&self, from: usize, data: &PodData, view: &PodView, requests: &ResourceList) -> Option<usize> {
        (from..self.templates.len()).find(|&t| {
            let tpl = &self.templates[t];
            tolerates_hard(&tpl.pool.taints, &view.tolerations)
                && tpl.requirements.is_compatible(&data.requirements, true)
                && tpl.types.iter().any(|&i| {
                    let it = &tpl.instance_types[i];
                    let mut need = requests.clone();
                    if let Some(g) = tpl.group_of[i] {
                        need.add(&tpl.daemon_groups[g].overhead);
                    }
                    need.fits_in(&it.allocatable) && it.requirements.intersects_ok(&data.requirements)
                })
        })
    }

    /// A claim of template `t` opened for instance type `it`. The labels some spread
    /// constraint's node filter reads (the architecture, say) are pinned to the type's: a
    /// claim that left them open would be counted as a node the filter takes, and could then
    /// be right-sized to a type it does not take (kube-scheduler would not count its pods
    /// there, and a spread placed against that count would be off).
    pub(super) fn new_packed(&self, t: usize, it: usize) -> PlannedNode {
        let mut node = self.new_planned(t, vec![it]);
        let labels = &self.templates[t].instance_types[it].requirements;
        for key in self.topology.filter_keys() {
            if labels.has(key) && !node.requirements.has(key) {
                node.requirements.add(key, labels.get(key).clone());
            }
        }
        node
    }

    /// Places pods of a class on existing nodes until one does not fit anywhere.
    fn fill_existing(&mut self, class: &mut Class, data: &PodData, view: &PodView) {
        let mut start = 0;
        while class.remaining() > 0 {
            let idx = class.pods[class.next];
            match self.first_existing(start, idx, view, data) {
                Some((n, reqs)) => {
                    self.place_existing(n, idx, data, reqs);
                    class.next += 1;
                    // Nodes before `n` could not take this pod; they will not take its twin.
                    start = n;
                }
                None => break,
            }
        }
    }

    /// Places pods of a class on claims already planned (of pools weighted at least
    /// `min_weight`) until one does not fit on any of them.
    fn fill_planned(&mut self, class: &mut Class, data: &PodData, view: &PodView, min_weight: i32) {
        let mut start = 0;
        // A pod that zone-keyed topology counts only joins claims already pinned to a zone
        // (on an open one its count would be lost).
        let counted = self.topology.counted_beyond_hostname(&self.pods[class.pods[class.next]]);
        while class.remaining() > 0 {
            let idx = class.pods[class.next];
            let pod = &self.pods[idx];
            let found = (start..self.planned.len()).find_map(|n| {
                let claim = &self.planned[n];
                if counted && pinned_zone(&claim.requirements).is_none() {
                    return None;
                }
                let template = &self.templates[claim.template];
                if template.pool.weight < min_weight {
                    return None;
                }
                if let Ok(a) = claim.can_add(template, &self.topology, idx, pod, data, &view.tolerations, false, true) {
                    return Some((n, a, None));
                }
                // A claim the packer opened for one type may grow into any type of its pool
                // that the pool's limits still allow (Karpenter's in-flight claims keep every
                // candidate type).
                if !claim.right_size {
                    return None;
                }
                let wider = self.widened_types(claim);
                if wider.len() <= claim.types.len() {
                    return None;
                }
                let mut trial = claim.clone();
                trial.set_types(template, wider);
                trial
                    .can_add(template, &self.topology, idx, pod, data, &view.tolerations, false, true)
                    .ok()
                    .map(|a| (n, a, Some(trial.types)))
            });
            match found {
                Some((n, add, wider)) => {
                    let t = self.planned[n].template;
                    let widened = wider.is_some();
                    if let Some(wider) = wider {
                        // Swap the claim's reservation against the pool's limits for one over
                        // its new candidates.
                        let old = self.planned[n].clone();
                        self.release_limits(t, &old);
                        self.planned[n].set_types(&self.templates[t], wider);
                    }
                    self.place_planned(n, idx, data, add);
                    if widened {
                        let claim = self.planned[n].clone();
                        self.subtract_limits(t, &claim);
                        // Reserve what the grown claim needs, not its largest candidate.
                        self.tighten_claim(n);
                    }
                    class.next += 1;
                    start = n;
                }
                None => break,
            }
        }
    }

    /// Every type of a claim's pool that the pool's limits allow it to grow into, given back
    /// what the claim holds now.
    fn widened_types(&self, claim: &PlannedNode) -> Vec<usize> {
        let t = claim.template;
        let template = &self.templates[t];
        let Some(remaining) = &self.remaining[t] else { return template.types.clone() };
        let mut held = ResourceList::new();
        for &i in &claim.types {
            held = held.max_with(&template.instance_types[i].capacity);
        }
        template
            .types
            .iter()
            .copied()
            .filter(|&i| {
                let cap = &template.instance_types[i].capacity;
                remaining.iter().all(|(n, left)| *n == ResourceName::Nodes || cap.get(n) <= left + held.get(n))
            })
            .collect()
    }

    /// Whether a claim of instance type `it` still fits template `t`'s limits.
    pub(super) fn within_limits(&self, t: usize, it: usize) -> bool {
        let Some(remaining) = &self.remaining[t] else { return true };
        if remaining.contains(&ResourceName::Nodes) && remaining.get(&ResourceName::Nodes) <= 0 {
            return false;
        }
        let cap = &self.templates[t].instance_types[it].capacity;
        remaining.iter().all(|(n, left)| *n == ResourceName::Nodes || cap.get(n) <= left)
    }
}
