//! The dovetail packer: the same constraints as the parity solve (every placement goes
//! through the same `can_add` checks), a different placement policy.
//!
//! 1. Pods collapse into equivalence classes.
//! 2. Existing nodes are filled first, class by class.
//! 3. Each class is routed to the highest-weight NodePool that can take it.
//! 4. Per NodePool, NodeClaims are opened one instance type at a time: dual prices from an
//!    LP over the remaining demand (resources, plus one "slot" per node for groups that allow
//!    only a few pods per node) value each class; the type whose estimated fill is worth the
//!    most per dollar is chosen; claims of that type are filled (per-node-capped classes
//!    first, then by value density) and repeated while they fill as well as estimated.
//! 5. Whatever could not be placed that way goes through Karpenter's per-pod loop, which
//!    also produces the reasons for unschedulable pods.
//! 6. Each claim's candidate types are re-derived from its final contents, so it launches
//!    as the cheapest type that fits (right-sizing).

use std::collections::HashMap;

use crate::resources::{ResourceList, ResourceName};
use crate::taints::{self, Effect, Taint};

use super::bound::dual_prices;
use super::classes::{self, CapGroup, Class};
use super::scheduler::Scheduler;
use super::view::{PodData, PodView};

/// LP units of a resource amount.
fn unit(r: &ResourceName) -> f64 {
    match r {
        ResourceName::Cpu => 1000.0,
        ResourceName::Memory | ResourceName::EphemeralStorage => (1u64 << 30) as f64,
        _ => 1.0,
    }
}

/// A candidate instance type of a template, in vector form.
struct TypeColumn {
    /// Index into the pool's instance types.
    it: usize,
    price: f64,
    /// Allocatable minus its DaemonSet group's overhead, per dimension (resources, then cap
    /// group slots).
    alloc: Vec<f64>,
}

/// The state of the packer for one template.
struct Packing<'c> {
    dims: &'c [ResourceName],
    caps: &'c [CapGroup],
    /// Per class: its demand vector (resources then slots).
    demand: Vec<Vec<f64>>,
    /// Per class: value at the current dual prices.
    value: Vec<f64>,
    /// Dual price of each dimension.
    prices: Vec<f64>,
}

impl Packing<'_> {
    fn vector(dims: &[ResourceName], caps: &[CapGroup], r: &ResourceList, class_caps: &[usize]) -> Vec<f64> {
        let mut v: Vec<f64> = dims.iter().map(|d| r.get(d) as f64 / unit(d)).collect();
        v.extend((0..caps.len()).map(|g| if class_caps.contains(&g) { 1.0 } else { 0.0 }));
        v
    }
}

/// A claim opened in a round of phase 1.
struct Bin {
    /// Its column among the round's columns.
    col: usize,
    /// Index into the round's zones, when its type is offered in some zone.
    zone: Option<usize>,
    node: super::nodes::PlannedNode,
    left: Vec<f64>,
    /// Planned pods per class of the round (member, count), sparse.
    share: Vec<(usize, usize)>,
}

fn add_share(share: &mut Vec<(usize, usize)>, m: usize) {
    match share.iter_mut().rev().find(|(x, _)| *x == m) {
        Some((_, n)) => *n += 1,
        None => share.push((m, 1)),
    }
}

fn share_of(share: &[(usize, usize)], m: usize) -> usize {
    share.iter().find(|(x, _)| *x == m).map_or(0, |(_, n)| *n)
}

fn take_share(share: &mut [(usize, usize)], m: usize) {
    if let Some((_, n)) = share.iter_mut().find(|(x, _)| *x == m) {
        *n = n.saturating_sub(1);
    }
}

fn clear_share(share: &mut [(usize, usize)], m: usize) {
    if let Some((_, n)) = share.iter_mut().find(|(x, _)| *x == m) {
        *n = 0;
    }
}

/// Narrows a claim to one zone, unless it is already pinned. False when the claim cannot be
/// in that zone.
fn pin_zone(node: &mut super::nodes::PlannedNode, zone: &str) -> bool {
    if super::scheduler::pinned_zone(&node.requirements).is_some() {
        return true;
    }
    let mut pinned = node.requirements.clone();
    pinned.add(crate::labels::ZONE, crate::requirements::Requirement::is_in([zone]));
    if pinned.get(crate::labels::ZONE).is_empty() {
        return false;
    }
    node.requirements = pinned;
    true
}

fn tolerates_hard(pool_taints: &[Taint], tolerations: &[taints::Toleration]) -> bool {
    let hard: Vec<Taint> = pool_taints.iter().filter(|t| t.effect != Effect::PreferNoSchedule).cloned().collect();
    taints::tolerates_all(&hard, tolerations)
}

impl<'a> Scheduler<'a> {
    /// Runs the dovetail packer; returns the error of every pod that could not be placed.
    pub fn solve_dovetail(&mut self) -> HashMap<usize, String> {
        self.pin_counted = true;
        let (mut errors, queue) = self.validate_pods();
        let (mut classes, caps) = classes::build(self.pods, &queue);
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
        // Templates are packed from the lowest weight up, so that a class that several pools
        // can take first fills room already open on claims of lower-weight pools (Karpenter
        // tries in-flight claims before opening one) and only then opens claims of its own,
        // highest-weight, pool. A pool that reaches its limits hands the rest of its classes
        // to the next pool by weight, which is then packed (again) in the next pass.
        let mut deferred = vec![false; classes.len()];
        for _pass in 0..=self.templates.len() {
            let mut spilled = false;
            for t in (0..self.templates.len()).rev() {
                let members: Vec<usize> =
                    by_size.iter().copied().filter(|&c| route[c] == Some(t) && classes[c].remaining() > 0).collect();
                if members.is_empty() {
                    continue;
                }
                if self.templates.len() > 1 && !self.planned.is_empty() {
                    for &c in &members {
                        self.fill_planned(&mut classes[c], &data[c], &views[c]);
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

    /// Places pods of a class on existing nodes until one does not fit anywhere.
    /// A claim of template `t` opened for instance type `it`. The labels some spread
    /// constraint's node filter reads (the architecture, say) are pinned to the type's: a
    /// claim that left them open would be counted as a node the filter takes, and could then
    /// be right-sized to a type it does not take (kube-scheduler would not count its pods
    /// there, and a spread placed against that count would be off).
    fn new_packed(&self, t: usize, it: usize) -> super::nodes::PlannedNode {
        let mut node = self.new_planned(t, vec![it]);
        let labels = &self.templates[t].instance_types[it].requirements;
        for key in self.topology.filter_keys() {
            if labels.has(key) && !node.requirements.has(key) {
                node.requirements.add(key, labels.get(key).clone());
            }
        }
        node
    }

    fn fill_existing(&mut self, class: &mut Class, data: &PodData, view: &PodView) {
        let mut start = 0;
        while class.remaining() > 0 {
            let idx = class.pods[class.next];
            let pod = &self.pods[idx];
            let found = (start..self.existing.len()).find_map(|n| {
                self.existing[n].can_add(&self.topology, idx, pod, data, &view.tolerations).map(|r| (n, r))
            });
            match found {
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

    /// Places pods of a class on claims already planned (by other pools) until one does not
    /// fit on any of them.
    fn fill_planned(&mut self, class: &mut Class, data: &PodData, view: &PodView) {
        let mut start = 0;
        // A pod that zone-keyed topology counts only joins claims already pinned to a zone
        // (on an open one its count would be lost).
        let counted = self.topology.counted_beyond_hostname(&self.pods[class.pods[class.next]]);
        while class.remaining() > 0 {
            let idx = class.pods[class.next];
            let pod = &self.pods[idx];
            let found = (start..self.planned.len()).find_map(|n| {
                let claim = &self.planned[n];
                if counted && super::scheduler::pinned_zone(&claim.requirements).is_none() {
                    return None;
                }
                let template = &self.templates[claim.template];
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
    fn widened_types(&self, claim: &super::nodes::PlannedNode) -> Vec<usize> {
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

    /// Packs a template's classes into new NodeClaims. Returns true when the pool's limits
    /// stopped it before every class was placed.
    #[allow(clippy::too_many_arguments)]
    fn pack_template(
        &mut self,
        t: usize,
        members: &[usize],
        classes: &mut [Class],
        caps: &[CapGroup],
        data: &[PodData],
        views: &[PodView],
        deferred: &mut [bool],
    ) -> bool {
        let template = &self.templates[t];
        // Dimensions: every resource the classes request.
        let mut dims: Vec<ResourceName> = Vec::new();
        for &c in members {
            for (r, v) in classes[c].requests.iter() {
                if v > 0 && !dims.contains(r) {
                    dims.push(r.clone());
                }
            }
        }
        let columns = self.type_columns(t, &dims, caps);
        if columns.is_empty() {
            return false;
        }
        // Which columns each class may use (by its requirements and offerings).
        let mut compat_cache: HashMap<&crate::requirements::Requirements, Vec<bool>> = HashMap::new();
        let compat: Vec<Vec<bool>> = members
            .iter()
            .map(|&c| {
                compat_cache
                    .entry(&data[c].requirements)
                    .or_insert_with(|| {
                        columns
                            .iter()
                            .map(|col| {
                                let it = &template.instance_types[col.it];
                                it.requirements.intersects_ok(&data[c].requirements)
                                    && it.offerings.iter().any(|o| {
                                        o.available
                                            && o.compatible(&template.requirements)
                                            && o.compatible(&data[c].requirements)
                                    })
                            })
                            .collect()
                    })
                    .clone()
            })
            .collect();
        let demand_vectors: Vec<Vec<f64>> =
            members.iter().map(|&c| Packing::vector(&dims, caps, &classes[c].requests, &classes[c].caps)).collect();
        // A class may only be assigned to types one of its pods fits on.
        let compat: Vec<Vec<bool>> = compat
            .into_iter()
            .enumerate()
            .map(|(m, row)| {
                row.into_iter()
                    .zip(&columns)
                    .map(|(ok, col)| ok && demand_vectors[m].iter().zip(&col.alloc).all(|(d, a)| *d <= *a + 1e-9))
                    .collect()
            })
            .collect();
        let mut packing =
            Packing { dims: &dims, caps, demand: demand_vectors, value: vec![0.0; members.len()], prices: Vec::new() };
        self.reprice(&mut packing, members, classes, &columns);

        // Phase 1: rounds of the assignment LP (see `pack_round`).
        const ROUNDS: usize = 1;
        for round in 0..ROUNDS {
            let go =
                self.pack_round(t, round + 1 == ROUNDS, members, classes, data, views, &packing, &columns, &compat);
            if !go {
                break;
            }
        }

        // Phase 2: whatever is left, type by type, by estimated value per dollar.
        let pin_all = members.iter().any(|&c| {
            classes[c].remaining() > 0 && self.topology.counted_beyond_hostname(&self.pods[classes[c].pods[0]])
        });
        let mut zone_cursor = 0usize;
        let mut exhausted = false;
        let mut rounds = 0usize;
        loop {
            rounds += 1;
            let live: Vec<usize> =
                (0..members.len()).filter(|&m| classes[members[m]].remaining() > 0 && !deferred[members[m]]).collect();
            if live.is_empty() {
                break;
            }
            // Limits: the types that still fit, and the node count.
            let allowed: Vec<usize> = (0..columns.len()).filter(|&i| self.within_limits(t, columns[i].it)).collect();
            if allowed.is_empty() {
                exhausted = true;
                break;
            }
            if rounds.is_multiple_of(64) {
                self.reprice(&mut packing, members, classes, &columns);
            }
            let Some((col, estimate, order)) =
                best_column(&columns, &allowed, &live, &packing, classes, members, &compat)
            else {
                if allowed.len() < columns.len() {
                    // The types the limits still allow fit none of them: the rest goes to
                    // the next pool.
                    exhausted = true;
                } else {
                    // No class can use any type: leave them to the per-pod loop.
                    for &m in &live {
                        deferred[members[m]] = true;
                    }
                }
                break;
            };
            loop {
                let mut bin = self.new_packed(t, columns[col].it);
                self.next_hostname += 1;
                if pin_all {
                    // Zones in turn, as the claims of phase 1 do (see `pack_round`).
                    let template = &self.templates[t];
                    let mut zones: Vec<&str> = template.instance_types[columns[col].it]
                        .offerings
                        .iter()
                        .filter(|o| o.available && o.compatible(&template.requirements))
                        .map(|o| o.zone.as_str())
                        .collect();
                    zones.sort_unstable();
                    zones.dedup();
                    if !zones.is_empty() {
                        let z = zones[zone_cursor % zones.len()].to_string();
                        zone_cursor += 1;
                        pin_zone(&mut bin, &z);
                    }
                }
                let mut left = columns[col].alloc.clone();
                let mut allowance = vec![usize::MAX; members.len()];
                let realized =
                    self.fill_bin(&mut bin, &mut left, &order, members, classes, data, views, &packing, &mut allowance);
                if bin.pods.is_empty() {
                    // Its first class cannot start a claim of this type: give it to the loop.
                    if let Some(&m) =
                        order.iter().find(|&&m| classes[members[m]].remaining() > 0 && !deferred[members[m]])
                    {
                        deferred[members[m]] = true;
                    }
                    break;
                }
                self.subtract_limits(t, &bin);
                bin.right_size = true;
                self.planned.push(bin);
                let still_live = order.iter().any(|&m| classes[members[m]].remaining() > 0 && !deferred[members[m]]);
                if realized < 0.97 * estimate || !still_live || !self.within_limits(t, columns[col].it) {
                    break;
                }
            }
        }
        exhausted
    }

    /// One round of phase 1. The assignment LP (over the columns whose reduced cost at the
    /// current dual prices is small) decides how many pods of each class go on each type and
    /// how many claims of each type to open: the whole claims it asks for, or, in the last
    /// round (or when it asks for less than one of anything), enough for everything. Every
    /// class's share of a type is spread evenly over that type's claims, and the claims are
    /// filled in three passes, each cycling over the claims zone by zone so that zone counts
    /// grow evenly: first the pods capped per node (hostname anti-affinity, hostname spread),
    /// then the pods with zone-keyed topology rules (each claim pinned to its zone as it gets
    /// its first one), then the rest; finally each claim is topped up by balance. The
    /// fractional remainder goes to the next round, where the LP picks smaller types.
    /// Returns false when nothing is left to do.
    #[allow(clippy::too_many_arguments)]
    fn pack_round(
        &mut self,
        t: usize,
        force_last: bool,
        members: &[usize],
        classes: &mut [Class],
        data: &[PodData],
        views: &[PodView],
        packing: &Packing<'_>,
        columns: &[TypeColumn],
        compat: &[Vec<bool>],
    ) -> bool {
        if members.iter().all(|&c| classes[c].remaining() == 0) {
            return false;
        }
        // Columns worth considering: small reduced cost, plus the best for each class.
        let keep: Vec<bool> = columns
            .iter()
            .map(|c| {
                let worth: f64 = c.alloc.iter().zip(&packing.prices).map(|(a, p)| a * p).sum();
                c.price - worth <= 0.01 * c.price
            })
            .collect();
        let allowed: Vec<bool> = columns.iter().map(|c| self.within_limits(t, c.it)).collect();
        let mut kept: Vec<usize> = (0..columns.len()).filter(|&i| keep[i] && allowed[i]).collect();
        // At most the six most efficient of them: a small LP solves fast, and with more
        // columns the benchmark plans came out no cheaper (docs/benchmarks.md).
        const MAX_COLUMNS: usize = 6;
        let eff = |i: usize| -> f64 {
            let worth: f64 = columns[i].alloc.iter().zip(&packing.prices).map(|(a, p)| a * p).sum();
            columns[i].price / worth.max(1e-12)
        };
        kept.sort_by(|&a, &b| eff(a).total_cmp(&eff(b)).then(a.cmp(&b)));
        kept.truncate(MAX_COLUMNS);
        for m in 0..members.len() {
            if classes[members[m]].remaining() == 0 || kept.iter().any(|&i| compat[m][i]) {
                continue;
            }
            let best =
                (0..columns.len()).filter(|&i| compat[m][i] && allowed[i]).min_by(|&a, &b| eff(a).total_cmp(&eff(b)));
            if let Some(b) = best
                && !kept.contains(&b)
            {
                kept.push(b);
            }
        }
        kept.sort_unstable();
        let sub_columns: Vec<&TypeColumn> = kept.iter().map(|&i| &columns[i]).collect();
        let sub_compat: Vec<Vec<bool>> = compat.iter().map(|row| kept.iter().map(|&i| row[i]).collect()).collect();
        let Some((mut quota, y)) = quotas(&sub_columns, members, classes, packing, &sub_compat) else { return false };
        let whole: f64 = y.iter().map(|v| (v + 1e-6).floor()).sum();
        let last = force_last || whole < 1.0;

        // The zones each type is offered in (within the pool's requirements), as indices into
        // every zone a claim of this round could be pinned to.
        let template = &self.templates[t];
        let mut zone_names: Vec<String> = Vec::new();
        let column_zones: Vec<Vec<usize>> = sub_columns
            .iter()
            .map(|col| {
                let it = &template.instance_types[col.it];
                let mut z: Vec<usize> = Vec::new();
                for o in it.offerings.iter().filter(|o| o.available && o.compatible(&template.requirements)) {
                    let i = match zone_names.iter().position(|n| *n == o.zone) {
                        Some(i) => i,
                        None => {
                            zone_names.push(o.zone.clone());
                            zone_names.len() - 1
                        }
                    };
                    if !z.contains(&i) {
                        z.push(i);
                    }
                }
                z
            })
            .collect();
        // Zones in name order, so that zone rotation is stable.
        let mut rename: Vec<usize> = (0..zone_names.len()).collect();
        rename.sort_by(|&a, &b| zone_names[a].cmp(&zone_names[b]));
        let mut rank_of = vec![0usize; zone_names.len()];
        for (r, &z) in rename.iter().enumerate() {
            rank_of[z] = r;
        }
        let column_zones: Vec<Vec<usize>> = column_zones
            .into_iter()
            .map(|zs| {
                let mut zs: Vec<usize> = zs.into_iter().map(|z| rank_of[z]).collect();
                zs.sort_unstable();
                zs
            })
            .collect();
        zone_names.sort();
        // Pseudo-zone 0 stands for "no zone" when no type names one.
        let zone_slots = zone_names.len().max(1);

        // When zone-keyed topology counts any of these pods, every claim is pinned to its
        // zone from the start, so that each pod is counted where it will really run.
        let pin_all = members.iter().any(|&c| {
            classes[c].remaining() > 0 && self.topology.counted_beyond_hostname(&self.pods[classes[c].pods[0]])
        });
        // The claims of this round, each with its planned pods per class.
        let mut bins: Vec<Bin> = Vec::new();
        for (k, col) in sub_columns.iter().enumerate() {
            let count = if last {
                (0..col.alloc.len())
                    .filter(|&r| col.alloc[r] > 0.0)
                    .map(|r| {
                        (0..members.len()).map(|m| quota[m][k] as f64 * packing.demand[m][r]).sum::<f64>()
                            / col.alloc[r]
                    })
                    .fold(0.0_f64, f64::max)
                    .ceil()
            } else {
                (y[k] + 1e-6).floor()
            } as usize;
            if count == 0 || quota.iter().all(|q| q[k] == 0) {
                continue;
            }
            let zones = &column_zones[k];
            let zone_count = zones.len().max(1);
            let first = bins.len();
            for b in 0..count {
                if !self.within_limits(t, col.it) {
                    break;
                }
                let mut node = self.new_packed(t, col.it);
                self.next_hostname += 1;
                // Reserve the pool's limits now; given back if the claim stays empty.
                self.subtract_limits(t, &node);
                let zone = (!zones.is_empty()).then(|| zones[b % zone_count]);
                if pin_all && let Some(z) = zone {
                    pin_zone(&mut node, &zone_names[z]);
                }
                bins.push(Bin { col: k, zone, node, left: col.alloc.clone(), share: Vec::new() });
            }
            let count = bins.len() - first;
            if count == 0 {
                continue;
            }
            // Pods capped per node go round-robin over the claims, never more than the cap
            // of their group on one claim; one cursor across groups, so different groups
            // start on different claims.
            let mut groups: Vec<usize> = Vec::new();
            for m in 0..members.len() {
                if let Some(&g) = classes[members[m]].caps.first()
                    && quota[m][k] > 0
                    && !groups.contains(&g)
                {
                    groups.push(g);
                }
            }
            let mut next = 0usize;
            let mut used = vec![0usize; count];
            for g in groups {
                let cap = packing.caps[g].cap;
                used.iter_mut().for_each(|u| *u = 0);
                for m in 0..members.len() {
                    if classes[members[m]].caps.first() != Some(&g) {
                        continue;
                    }
                    for _ in 0..quota[m][k] {
                        let Some(step) = (0..count).find(|s| used[(next + s) % count] < cap) else { break };
                        let b = (next + step) % count;
                        used[b] += 1;
                        add_share(&mut bins[first + b].share, m);
                        next = (b + 1) % count;
                    }
                }
            }
            // Zone-keyed classes spread over zones first (so zone counts stay even), then
            // over the zone's claims; the rest evenly over all claims.
            for m in 0..members.len() {
                let q = quota[m][k];
                let c = &classes[members[m]];
                if q == 0 || !c.caps.is_empty() {
                    continue;
                }
                if c.zonal_spread || c.zonal_affinity {
                    for z in 0..zone_count.min(count) {
                        let qz = (z + 1) * q / zone_count - z * q / zone_count;
                        let nz = (count + zone_count - 1 - z) / zone_count;
                        for j in 0..qz {
                            add_share(&mut bins[first + (j * nz / qz) * zone_count + z].share, m);
                        }
                    }
                } else {
                    for j in 0..q {
                        add_share(&mut bins[first + j * count / q].share, m);
                    }
                }
            }
        }
        if bins.is_empty() {
            return false;
        }
        // Interleave the claims of all types so each pass grows every zone evenly.
        let mut order: Vec<usize> = (0..bins.len()).collect();
        let mut rank = vec![0usize; bins.len()];
        let mut seen: Vec<usize> = vec![0; sub_columns.len()];
        for (b, bin) in bins.iter().enumerate() {
            rank[b] = seen[bin.col];
            seen[bin.col] += 1;
        }
        order.sort_by_key(|&b| (rank[b], b));

        let pass_of: Vec<usize> = (0..members.len())
            .map(|m| {
                let c = &classes[members[m]];
                if !c.caps.is_empty() {
                    0
                } else if c.zonal_spread {
                    1
                } else if c.zonal_affinity {
                    2
                } else {
                    3
                }
            })
            .collect();
        let by_size = |m: usize, k: usize| -> f64 {
            packing.demand[m].iter().zip(&sub_columns[k].alloc).filter(|(_, a)| **a > 0.0).map(|(d, a)| d / a).sum()
        };
        // How crowded each class's cap group is: its pods per claim slot this round.
        let mut group_total: HashMap<usize, usize> = HashMap::new();
        for bin in &bins {
            for &(m, n) in &bin.share {
                if let Some(&g) = classes[members[m]].caps.first() {
                    *group_total.entry(g).or_insert(0) += n;
                }
            }
        }
        let pressure: Vec<f64> = (0..members.len())
            .map(|m| match classes[members[m]].caps.first() {
                None => 0.0,
                Some(&g) => {
                    group_total.get(&g).copied().unwrap_or(0) as f64 / (bins.len() * packing.caps[g].cap).max(1) as f64
                }
            })
            .collect();
        // The claims of each zone, and of each class in each zone (with a cursor: claims a
        // class's pods no longer fit on are never looked at again this round).
        let mut zone_bins: Vec<Vec<usize>> = vec![Vec::new(); zone_slots];
        for (b, bin) in bins.iter().enumerate() {
            zone_bins[bin.zone.unwrap_or(0)].push(b);
        }
        let fits = |m: usize, bin: &Bin| -> bool {
            sub_compat[m][bin.col] && packing.demand[m].iter().zip(&bin.left).all(|(need, have)| *need <= *have + 1e-9)
        };
        for pass in 0..4 {
            if pass == 1 || pass == 2 {
                // Zone-keyed pods: each pod tries the zones in turn (starting where the last
                // one of its class went), preferring claims that planned for it, then any
                // claim of the zone it fits, so it lands in a zone its spread or affinity
                // allows and zone counts stay even.
                let ms: Vec<usize> = (0..members.len()).filter(|&m| pass_of[m] == pass).collect();
                for m in ms {
                    let mut planned_in: Vec<Vec<usize>> = vec![Vec::new(); zone_slots];
                    let mut shares = 0usize;
                    for (b, bin) in bins.iter().enumerate() {
                        if let Some(&(_, n)) = bin.share.iter().find(|(x, _)| *x == m) {
                            planned_in[bin.zone.unwrap_or(0)].push(b);
                            shares += n;
                        }
                    }
                    // The class's shares, plus its part of the quota for every zone no
                    // claim of this round was planned in.
                    let q: usize = quota[m].iter().sum();
                    let mut to_place = shares
                        + (0..zone_names.len())
                            .filter(|&z| zone_bins[z].is_empty())
                            .map(|z| (z + 1) * q / zone_slots - z * q / zone_slots)
                            .sum::<usize>();
                    let mut planned_cursor = vec![0usize; zone_slots];
                    let mut any_cursor = vec![0usize; zone_slots];
                    let mut start = 0usize;
                    while to_place > 0 && classes[members[m]].remaining() > 0 {
                        let mut placed = false;
                        for step in 0..zone_slots {
                            let z = (start + step) % zone_slots;
                            // A claim that planned pods of this class in this zone.
                            let mut candidate = None;
                            while let Some(&b) = planned_in[z].get(planned_cursor[z]) {
                                if share_of(&bins[b].share, m) > 0 && fits(m, &bins[b]) {
                                    candidate = Some(b);
                                    break;
                                }
                                planned_cursor[z] += 1;
                            }
                            // Else a claim of the zone that already has pods and room.
                            if candidate.is_none() {
                                let mut i = any_cursor[z];
                                while let Some(&b) = zone_bins[z].get(i) {
                                    if fits(m, &bins[b]) {
                                        if !bins[b].node.pods.is_empty() {
                                            candidate = Some(b);
                                            break;
                                        }
                                    } else if i == any_cursor[z] {
                                        any_cursor[z] += 1;
                                    }
                                    i += 1;
                                    if i - any_cursor[z] > 64 {
                                        break;
                                    }
                                }
                            }
                            // No claim in this zone at all yet: open one, so the zone can be used.
                            if candidate.is_none()
                                && z < zone_names.len()
                                && zone_bins[z].is_empty()
                                && let Some(k) = (0..sub_columns.len())
                                    .filter(|&k| {
                                        sub_compat[m][k]
                                            && column_zones[k].contains(&z)
                                            && packing.demand[m]
                                                .iter()
                                                .zip(&sub_columns[k].alloc)
                                                .all(|(d, a)| *d <= *a)
                                            && self.within_limits(t, sub_columns[k].it)
                                    })
                                    .min_by(|&a, &b| sub_columns[a].price.total_cmp(&sub_columns[b].price))
                            {
                                let node = self.new_packed(t, sub_columns[k].it);
                                self.next_hostname += 1;
                                self.subtract_limits(t, &node);
                                bins.push(Bin {
                                    col: k,
                                    zone: Some(z),
                                    node,
                                    left: sub_columns[k].alloc.clone(),
                                    share: Vec::new(),
                                });
                                zone_bins[z].push(bins.len() - 1);
                                candidate = Some(bins.len() - 1);
                            }
                            let Some(b) = candidate else { continue };
                            let bin = &mut bins[b];
                            if let Some(z) = bin.zone
                                && !pin_zone(&mut bin.node, &zone_names[z])
                            {
                                continue;
                            }
                            if self.try_one(&mut bin.node, &mut bin.left, m, members, classes, data, views, packing) {
                                take_share(&mut bin.share, m);
                                if quota[m][bin.col] > 0 {
                                    quota[m][bin.col] -= 1;
                                }
                                start = (z + 1) % zone_slots;
                                placed = true;
                                break;
                            }
                        }
                        if !placed {
                            break;
                        }
                        to_place -= 1;
                    }
                    for bin in bins.iter_mut() {
                        bin.share.retain(|(x, _)| *x != m);
                    }
                }
                continue;
            }
            // The other passes cycle over the claims that still have planned pods of the
            // pass, one pod per class per claim per cycle, so claims fill evenly.
            let mut active: Vec<usize> = order
                .iter()
                .copied()
                .filter(|&b| bins[b].share.iter().any(|&(m, n)| n > 0 && pass_of[m] == pass))
                .collect();
            let mut ms: Vec<usize> = Vec::new();
            while !active.is_empty() {
                let mut still: Vec<usize> = Vec::with_capacity(active.len());
                for &b in &active {
                    let bin = &mut bins[b];
                    ms.clear();
                    ms.extend(bin.share.iter().filter(|&&(m, n)| n > 0 && pass_of[m] == pass).map(|&(m, _)| m));
                    // Capped pods of the most crowded group first (it decides how many claims
                    // are needed), then larger pods first.
                    ms.sort_by(|&x, &y| {
                        pressure[y].total_cmp(&pressure[x]).then(by_size(y, bin.col).total_cmp(&by_size(x, bin.col)))
                    });
                    let mut progress = false;
                    for &m in &ms {
                        if classes[members[m]].remaining() > 0
                            && self.try_one(&mut bin.node, &mut bin.left, m, members, classes, data, views, packing)
                        {
                            take_share(&mut bin.share, m);
                            quota[m][bin.col] -= 1;
                            progress = true;
                        } else {
                            // Blocked here (topology, capacity): its share moves to the top-up.
                            clear_share(&mut bin.share, m);
                        }
                    }
                    if progress && bin.share.iter().any(|&(m, n)| n > 0 && pass_of[m] == pass) {
                        still.push(b);
                    }
                }
                active = still;
            }
        }
        // Top-up: each claim takes, by balance, pods of classes that still have quota on its
        // type.
        let mut wanting: Vec<Vec<usize>> =
            (0..sub_columns.len()).map(|k| (0..members.len()).filter(|&m| quota[m][k] > 0).collect()).collect();
        let mut blocked = vec![usize::MAX; members.len()];
        for (b, bin) in bins.iter_mut().enumerate() {
            let k = bin.col;
            wanting[k].retain(|&m| quota[m][k] > 0 && classes[members[m]].remaining() > 0);
            if wanting[k].is_empty() {
                continue;
            }
            let alloc = &sub_columns[k].alloc;
            loop {
                let mut best: Option<(f64, usize)> = None;
                for &m in &wanting[k] {
                    if blocked[m] == b || quota[m][k] == 0 || classes[members[m]].remaining() == 0 {
                        continue;
                    }
                    let d = &packing.demand[m];
                    if !d.iter().zip(bin.left.iter()).all(|(need, have)| *need <= *have + 1e-9) {
                        continue;
                    }
                    let score: f64 = d
                        .iter()
                        .zip(bin.left.iter())
                        .zip(alloc)
                        .filter(|(_, a)| **a > 0.0)
                        .map(|((need, have), a)| (need / a) * (have / a))
                        .sum();
                    if best.is_none_or(|(s, _)| score > s) {
                        best = Some((score, m));
                    }
                }
                let Some((_, m)) = best else { break };
                if self.try_one(&mut bin.node, &mut bin.left, m, members, classes, data, views, packing) {
                    quota[m][k] -= 1;
                } else {
                    blocked[m] = b;
                }
            }
        }
        let mut placed_any = false;
        for bin in bins {
            if bin.node.pods.is_empty() {
                self.release_limits(t, &bin.node);
                continue;
            }
            placed_any = true;
            let mut node = bin.node;
            node.right_size = true;
            self.planned.push(node);
        }
        placed_any && !last
    }

    /// The template's types as columns (price of the cheapest offering, allocatable after
    /// DaemonSets), without dominated ones.
    fn type_columns(&self, t: usize, dims: &[ResourceName], caps: &[CapGroup]) -> Vec<TypeColumn> {
        let template = &self.templates[t];
        let mut cols: Vec<(TypeColumn, bool)> = template
            .types
            .iter()
            .filter_map(|&i| {
                let it = &template.instance_types[i];
                let price = it.cheapest_price(&template.requirements);
                if !price.is_finite() || price == f64::MAX {
                    return None;
                }
                let mut alloc = it.allocatable.clone();
                if let Some(g) = template.group_of[i] {
                    alloc = alloc.subtracted(&template.daemon_groups[g].overhead);
                }
                if alloc.iter().any(|(_, v)| v < 0) {
                    return None;
                }
                let mut v: Vec<f64> = dims.iter().map(|d| alloc.get(d) as f64 / unit(d)).collect();
                v.extend(caps.iter().map(|c| c.cap as f64));
                Some((TypeColumn { it: i, price, alloc: v }, it.exotic))
            })
            .collect();
        cols.sort_by(|a, b| a.0.price.total_cmp(&b.0.price).then_with(|| a.0.it.cmp(&b.0.it)));
        let keep: Vec<bool> = (0..cols.len())
            .map(|i| {
                let (c, c_exotic) = (&cols[i].0, cols[i].1);
                !cols.iter().enumerate().any(|(j, (d, d_exotic))| {
                    j != i
                        && d.price <= c.price
                        && (!d_exotic || c_exotic)
                        && d.alloc.iter().zip(&c.alloc).all(|(x, y)| x >= y)
                        && (d.price < c.price || d.alloc != c.alloc || d_exotic != &c_exotic || j < i)
                })
            })
            .collect();
        cols.into_iter().zip(keep).filter(|(_, k)| *k).map(|((c, _), _)| c).collect()
    }

    /// Whether a claim of instance type `it` still fits template `t`'s limits.
    fn within_limits(&self, t: usize, it: usize) -> bool {
        let Some(remaining) = &self.remaining[t] else { return true };
        if remaining.contains(&ResourceName::Nodes) && remaining.get(&ResourceName::Nodes) <= 0 {
            return false;
        }
        let cap = &self.templates[t].instance_types[it].capacity;
        remaining.iter().all(|(n, left)| *n == ResourceName::Nodes || cap.get(n) <= left)
    }

    /// Recomputes class values from dual prices over the remaining demand.
    fn reprice(&self, packing: &mut Packing<'_>, members: &[usize], classes: &[Class], columns: &[TypeColumn]) {
        let n = packing.dims.len() + packing.caps.len();
        let mut demand = vec![0.0; n];
        for (m, &c) in members.iter().enumerate() {
            let left = classes[c].remaining() as f64;
            for (d, v) in demand.iter_mut().zip(&packing.demand[m]) {
                *d += left * v;
            }
        }
        let cols: Vec<(f64, Vec<f64>)> = columns.iter().map(|c| (c.price, c.alloc.clone())).collect();
        let prices = dual_prices(&cols, &demand).unwrap_or_else(|| {
            // Without an LP answer, price each resource at the cheapest rate any type sells it.
            (0..n)
                .map(|r| cols.iter().filter(|(_, a)| a[r] > 0.0).map(|(p, a)| p / a[r]).fold(f64::INFINITY, f64::min))
                .map(|v| if v.is_finite() { v / n as f64 } else { 0.0 })
                .collect()
        });
        for m in 0..members.len() {
            packing.value[m] = packing.demand[m].iter().zip(&prices).map(|(a, b)| a * b).sum::<f64>().max(1e-12);
        }
        packing.prices = prices;
    }

    /// Adds pods to a claim in `order`, each class up to `allowance[m]` pods, while its
    /// vector fits in `left`. Returns the value placed.
    #[allow(clippy::too_many_arguments)]
    fn fill_bin(
        &mut self,
        bin: &mut super::nodes::PlannedNode,
        left: &mut [f64],
        order: &[usize],
        members: &[usize],
        classes: &mut [Class],
        data: &[PodData],
        views: &[PodView],
        packing: &Packing<'_>,
        allowance: &mut [usize],
    ) -> f64 {
        let mut value = 0.0;
        for &m in order {
            while allowance[m] > 0
                && classes[members[m]].remaining() > 0
                && self.try_one(bin, left, m, members, classes, data, views, packing)
            {
                allowance[m] -= 1;
                value += packing.value[m];
            }
        }
        value
    }

    /// Adds the next pod of class `members[m]` to a claim if its vector fits in `left` and
    /// Karpenter's checks (requirements, topology, types) allow it.
    #[allow(clippy::too_many_arguments)]
    fn try_one(
        &mut self,
        bin: &mut super::nodes::PlannedNode,
        left: &mut [f64],
        m: usize,
        members: &[usize],
        classes: &mut [Class],
        data: &[PodData],
        views: &[PodView],
        packing: &Packing<'_>,
    ) -> bool {
        let c = members[m];
        let d = &packing.demand[m];
        if classes[c].remaining() == 0 || !d.iter().zip(left.iter()).all(|(need, have)| *need <= *have + 1e-9) {
            return false;
        }
        let template = &self.templates[bin.template];
        let idx = classes[c].pods[classes[c].next];
        let pod = &self.pods[idx];
        // A twin of a pod already here needs only its resources checked (see `add_twin`).
        let twin_ok =
            pod.host_ports.is_empty() && pod.volume_requirements.is_empty() && !self.topology.constrains(idx, pod);
        let placed =
            if twin_ok && bin.twins.contains(&c) && bin.add_twin(template, &mut self.topology, idx, pod, &data[c]) {
                true
            } else {
                match bin.can_add(template, &self.topology, idx, pod, &data[c], &views[c].tolerations, false, true) {
                    Ok(add) => {
                        bin.add(template, &mut self.topology, idx, pod, &data[c], add);
                        if twin_ok && !bin.twins.contains(&c) {
                            bin.twins.push(c);
                        }
                        true
                    }
                    Err(_) => false,
                }
            };
        match placed {
            true => {
                self.order.push(super::scheduler::Placement {
                    pod: idx,
                    target: super::scheduler::Target::Planned(bin.id),
                    zone: super::scheduler::pinned_zone(&bin.requirements),
                });
                classes[c].next += 1;
                for (h, n) in left.iter_mut().zip(d) {
                    *h -= n;
                }
                true
            }
            false => false,
        }
    }
}

/// Integer quotas `q[member][column]` from the assignment LP:
///
/// ```text
/// min Σ_t p_t y_t   s.t.  Σ_k d_{k,r} x_{k,t} ≤ a_{t,r} y_t   ∀ t, r
///                         Σ_t x_{k,t} = n_k                 ∀ k       x, y ≥ 0
/// ```
///
/// over classes merged by demand and usable types (`x_{k,t}` only where class `k` may use
/// type `t`); fractional counts are rounded by largest remainder.
fn quotas(
    columns: &[&TypeColumn],
    members: &[usize],
    classes: &[Class],
    packing: &Packing<'_>,
    compat: &[Vec<bool>],
) -> Option<(Vec<Vec<usize>>, Vec<f64>)> {
    use microlp::{ComparisonOp, OptimizationDirection, Problem};
    // Each LP dimension: a resource, or a cap group with pods here. (Merging cap groups,
    // which would shrink the LP, was measured to cost 3-5% in R on the benchmark mix.)
    let nres = packing.dims.len();
    let mut lp_dims: Vec<Vec<usize>> = (0..nres).map(|r| vec![r]).collect();
    for (g, _) in packing.caps.iter().enumerate() {
        if members.iter().any(|&c| classes[c].remaining() > 0 && classes[c].caps.contains(&g)) {
            lp_dims.push(vec![nres + g]);
        }
    }
    let lp_demand =
        |m: usize| -> Vec<f64> { lp_dims.iter().map(|set| set.iter().map(|&r| packing.demand[m][r]).sum()).collect() };
    // Merge classes with the same LP demand and usable types. Capped classes (a per-node
    // cap spreads them anyway) merge by cap group and by memory per core, at their average
    // demand: a much smaller LP (3 ms instead of 11 on the 1k mix) for the same R.
    let mut lp_classes: Vec<(Vec<u64>, &Vec<bool>, Vec<usize>)> = Vec::new();
    let mut sums: Vec<(Vec<f64>, f64)> = Vec::new();
    for (m, &c) in members.iter().enumerate() {
        let n = classes[c].remaining();
        if n == 0 {
            continue;
        }
        let demand = lp_demand(m);
        let capped = !classes[c].caps.is_empty();
        let mut key: Vec<u64> =
            demand.iter().enumerate().map(|(j, v)| if capped && j < nres { 0 } else { v.to_bits() }).collect();
        if capped {
            // Memory per core, bucketed as compute, general and memory-optimised types
            // offer it (2, 4, 8 GiB per core).
            let cpu = packing.dims.iter().position(|d| *d == ResourceName::Cpu).map_or(0.0, |i| demand[i]);
            let mem = packing.dims.iter().position(|d| *d == ResourceName::Memory).map_or(0.0, |i| demand[i]);
            let per_core = mem / cpu.max(1e-9);
            key.push(if per_core <= 3.0 {
                0
            } else if per_core <= 6.0 {
                1
            } else {
                2
            });
        }
        match lp_classes.iter().position(|(k, cp, _)| *k == key && **cp == compat[m]) {
            Some(i) => {
                lp_classes[i].2.push(m);
                for (s, d) in sums[i].0.iter_mut().zip(&demand) {
                    *s += d * n as f64;
                }
                sums[i].1 += n as f64;
            }
            None => {
                lp_classes.push((key, &compat[m], vec![m]));
                sums.push((demand.iter().map(|d| d * n as f64).collect(), n as f64));
            }
        }
    }
    let lp_class_demand: Vec<Vec<f64>> = sums.iter().map(|(s, n)| s.iter().map(|v| v / n.max(1.0)).collect()).collect();
    if lp_classes.is_empty() {
        return None;
    }
    let mut p = Problem::new(OptimizationDirection::Minimize);
    let y: Vec<microlp::Variable> = columns.iter().map(|c| p.add_var(c.price, (0.0, f64::INFINITY))).collect();
    let mut x: Vec<Vec<Option<microlp::Variable>>> = Vec::new();
    for (_, cp, _) in &lp_classes {
        x.push((0..columns.len()).map(|t| cp[t].then(|| p.add_var(0.0, (0.0, f64::INFINITY)))).collect());
    }
    for (t, col) in columns.iter().enumerate() {
        for (j, set) in lp_dims.iter().enumerate() {
            let mut expr: Vec<(microlp::Variable, f64)> = Vec::new();
            for k in 0..lp_classes.len() {
                let d = lp_class_demand[k][j];
                if let Some(v) = x[k][t]
                    && d > 0.0
                {
                    expr.push((v, d));
                }
            }
            if !expr.is_empty() {
                expr.push((y[t], -set.iter().map(|&r| col.alloc[r]).sum::<f64>()));
                p.add_constraint(expr.as_slice(), ComparisonOp::Le, 0.0);
            }
        }
    }
    for (k, (_, _, ms)) in lp_classes.iter().enumerate() {
        let n: usize = ms.iter().map(|&m| classes[members[m]].remaining()).sum();
        let expr: Vec<(microlp::Variable, f64)> = x[k].iter().flatten().map(|v| (*v, 1.0)).collect();
        if expr.is_empty() {
            return None;
        }
        p.add_constraint(expr.as_slice(), ComparisonOp::Ge, n as f64);
    }
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| p.solve())).ok()?.ok()?;
    let sol = outcome.solution()?;
    let mut quota = vec![vec![0usize; columns.len()]; members.len()];
    for (k, (_, _, ms)) in lp_classes.iter().enumerate() {
        let n: usize = ms.iter().map(|&m| classes[members[m]].remaining()).sum();
        // Largest remainder rounding of the class's split over types.
        let frac: Vec<(usize, f64)> =
            (0..columns.len()).filter_map(|t| x[k][t].map(|v| (t, sol.var_value(v).max(0.0)))).collect();
        let mut counts: Vec<(usize, usize, f64)> =
            frac.iter().map(|&(t, v)| (t, v.floor() as usize, v - v.floor())).collect();
        let mut assigned: usize = counts.iter().map(|c| c.1).sum();
        counts.sort_by(|a, b| b.2.total_cmp(&a.2).then(a.0.cmp(&b.0)));
        let len = counts.len();
        let mut i = 0;
        while assigned < n && len > 0 {
            counts[i % len].1 += 1;
            assigned += 1;
            i += 1;
        }
        while assigned > n {
            if let Some(c) = counts.iter_mut().rev().find(|c| c.1 > 0) {
                c.1 -= 1;
            }
            assigned -= 1;
        }
        // Hand each member class a share of every type in proportion to its size (member
        // classes may be in different cap groups, which must spread alike): cumulative
        // rounding keeps every type's total exact.
        let mut per_type: Vec<(usize, usize)> = counts.iter().map(|c| (c.0, c.1)).filter(|c| c.1 > 0).collect();
        per_type.sort();
        let mut before = 0usize;
        for &m in ms {
            let after = before + classes[members[m]].remaining();
            for &(t, cnt) in &per_type {
                quota[m][t] += cnt * after / n.max(1) - cnt * before / n.max(1);
            }
            before = after;
        }
    }
    let ys: Vec<f64> = y.iter().map(|v| sol.var_value(*v).max(0.0)).collect();
    Some((quota, ys))
}

/// Picks the column whose estimated fill is worth the most per dollar. Returns it, the
/// estimated value, and the fill order (capped classes first, then by value density).
fn best_column(
    columns: &[TypeColumn],
    allowed: &[usize],
    live: &[usize],
    packing: &Packing<'_>,
    classes: &[Class],
    members: &[usize],
    compat: &[Vec<bool>],
) -> Option<(usize, f64, Vec<usize>)> {
    let mut best: Option<(f64, usize, f64, Vec<usize>)> = None;
    for &ci in allowed {
        let col = &columns[ci];
        let mut order: Vec<(bool, f64, usize)> = live
            .iter()
            .filter(|&&m| compat[m][ci])
            .map(|&m| {
                let size: f64 = packing.demand[m]
                    .iter()
                    .zip(&col.alloc)
                    .filter(|(_, a)| **a > 0.0)
                    .map(|(d, a)| d / a)
                    .sum::<f64>()
                    .max(1e-12);
                (classes[members[m]].caps.is_empty(), -(packing.value[m] / size), m)
            })
            .collect();
        if order.is_empty() {
            continue;
        }
        order.sort_by(|a, b| a.0.cmp(&b.0).then(a.1.total_cmp(&b.1)).then(a.2.cmp(&b.2)));
        let mut left = col.alloc.clone();
        let mut value = 0.0;
        for &(_, _, m) in &order {
            let d = &packing.demand[m];
            let mut n = classes[members[m]].remaining() as f64;
            for (need, have) in d.iter().zip(&left) {
                if *need > 0.0 {
                    n = n.min((have / need + 1e-9).floor());
                }
            }
            if n >= 1.0 {
                for (h, need) in left.iter_mut().zip(d) {
                    *h -= n * need;
                }
                value += n * packing.value[m];
            }
        }
        let efficiency = value / col.price;
        if value > 0.0
            && best.as_ref().is_none_or(|(e, _, v, _)| {
                efficiency > *e * (1.0 + 1e-9) || (efficiency >= *e * (1.0 - 1e-9) && value > *v)
            })
        {
            best = Some((efficiency, ci, value, order.into_iter().map(|(_, _, m)| m).collect()));
        }
    }
    best.map(|(_, ci, value, order)| (ci, value, order))
}
