//! Packing one template's classes into new NodeClaims: phase 1 (rounds of the assignment
//! LP, `round`), then phase 2, type by type, the column whose estimated fill is worth the
//! most per dollar, while its claims fill as well as estimated. Every pod goes through the
//! same checks as the parity packer (`PlannedNode::can_add`).

use std::collections::HashMap;

use crate::requirements::Requirements;
use crate::resources::ResourceName;
use crate::scheduling::classes::{CapGroup, Class};
use crate::scheduling::nodes::PlannedNode;
use crate::scheduling::output::{Placement, Target};
use crate::scheduling::scheduler::{Scheduler, pinned_zone};
use crate::scheduling::view::{PodData, PodView};

use super::Ctx;
use super::bins::pin_zone;
use super::columns::{Packing, TypeColumn, best_column};

impl Scheduler<'_> {
    /// Packs a template's classes into new NodeClaims. Returns true when the pool's limits
    /// stopped it before every class was placed. Classes no type of the pool can start a
    /// claim for are marked `deferred` (the per-pod loop takes them).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn pack_template(
        &mut self,
        t: usize,
        members: &[usize],
        classes: &mut [Class],
        caps: &[CapGroup],
        data: &[PodData],
        views: &[PodView],
        deferred: &mut [bool],
    ) -> bool {
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
        let demand: Vec<Vec<f64>> =
            members.iter().map(|&c| Packing::vector(&dims, caps, &classes[c].requests, &classes[c].caps)).collect();
        let compat = self.compatibility(t, members, data, &columns, &demand);
        let mut packing = Packing { dims: &dims, caps, demand, value: vec![0.0; members.len()], prices: Vec::new() };
        self.reprice(&mut packing, members, classes, &columns);

        // Large pods first, by patterns (see `patterns`).
        let patterned = {
            let ctx = Ctx { t, members, data, views, packing: &packing, columns: &columns, compat: &compat };
            self.pack_patterns(&ctx, classes)
        };
        if patterned && members.iter().any(|&c| classes[c].remaining() > 0) {
            self.reprice(&mut packing, members, classes, &columns);
        }

        // Phase 1: rounds of the assignment LP (see `round`).
        const ROUNDS: usize = 1;
        for round in 0..ROUNDS {
            let ctx = Ctx { t, members, data, views, packing: &packing, columns: &columns, compat: &compat };
            if !self.pack_round(&ctx, round + 1 == ROUNDS, classes) {
                break;
            }
        }

        // Phase 2: whatever is left, type by type, by estimated value per dollar.
        let pin_all = members.iter().any(|&c| {
            classes[c].remaining() > 0 && self.topology.counted_beyond_hostname(&self.pods[classes[c].pods[0]])
        });
        let mut zone_cursor = 0usize;
        let mut rounds = 0usize;
        loop {
            rounds += 1;
            let live: Vec<usize> =
                (0..members.len()).filter(|&m| classes[members[m]].remaining() > 0 && !deferred[members[m]]).collect();
            if live.is_empty() {
                return false;
            }
            // Limits: the types that still fit, and the node count.
            let allowed: Vec<usize> = (0..columns.len()).filter(|&i| self.within_limits(t, columns[i].it)).collect();
            if allowed.is_empty() {
                if self.room_for(t, &columns, &compat, &live) {
                    continue;
                }
                return true;
            }
            if rounds.is_multiple_of(64) {
                self.reprice(&mut packing, members, classes, &columns);
            }
            let Some((col, estimate, order)) =
                best_column(&columns, &allowed, &live, &packing, classes, members, &compat)
            else {
                if allowed.len() < columns.len() {
                    // The types the limits still allow fit none of them: unless the pool's
                    // claims can give back reservations they do not need, the rest goes
                    // to the next pool.
                    if self.room_for(t, &columns, &compat, &live) {
                        continue;
                    }
                    return true;
                }
                // No class can use any type: leave them to the per-pod loop.
                for &m in &live {
                    deferred[members[m]] = true;
                }
                return false;
            };
            let ctx = Ctx { t, members, data, views, packing: &packing, columns: &columns, compat: &compat };
            self.open_column(&ctx, col, estimate, &order, pin_all, &mut zone_cursor, classes, deferred);
        }
    }

    /// Makes room under the pool's limits (see `Scheduler::make_room`) for the cheapest
    /// column some class still waiting could use; whether it did.
    fn room_for(&mut self, t: usize, columns: &[TypeColumn], compat: &[Vec<bool>], live: &[usize]) -> bool {
        let Some(col) = (0..columns.len())
            .filter(|&i| live.iter().any(|&m| compat[m][i]))
            .min_by(|&a, &b| columns[a].price.total_cmp(&columns[b].price))
        else {
            return false;
        };
        let need = self.templates[t].instance_types[columns[col].it].capacity.clone();
        !self.within_limits(t, columns[col].it) && self.make_room(t, &need)
    }

    /// Which columns each member may use: its requirements meet the type's, an offering it
    /// allows is available, and one of its pods fits.
    fn compatibility(
        &self,
        t: usize,
        members: &[usize],
        data: &[PodData],
        columns: &[TypeColumn],
        demand: &[Vec<f64>],
    ) -> Vec<Vec<bool>> {
        let template = &self.templates[t];
        let mut cache: HashMap<&Requirements, Vec<bool>> = HashMap::new();
        members
            .iter()
            .enumerate()
            .map(|(m, &c)| {
                let by_requirements = cache.entry(&data[c].requirements).or_insert_with(|| {
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
                });
                by_requirements
                    .iter()
                    .zip(columns)
                    .map(|(ok, col)| *ok && demand[m].iter().zip(&col.alloc).all(|(d, a)| *d <= *a + 1e-9))
                    .collect()
            })
            .collect()
    }

    /// Opens claims of column `col`, filling each in `order`, while they fill as well as
    /// estimated, the pool's limits allow, and classes remain.
    #[allow(clippy::too_many_arguments)]
    fn open_column(
        &mut self,
        ctx: &Ctx<'_>,
        col: usize,
        estimate: f64,
        order: &[usize],
        pin_all: bool,
        zone_cursor: &mut usize,
        classes: &mut [Class],
        deferred: &mut [bool],
    ) {
        let (t, members, columns) = (ctx.t, ctx.members, ctx.columns);
        loop {
            let mut bin = self.new_packed(t, columns[col].it);
            self.next_hostname += 1;
            if pin_all {
                // Zones in turn, as the claims of phase 1 do (see `round`).
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
                    let z = zones[*zone_cursor % zones.len()].to_string();
                    *zone_cursor += 1;
                    pin_zone(&mut bin, &z);
                }
            }
            let mut left = columns[col].alloc.clone();
            let realized = self.fill_bin(ctx, &mut bin, &mut left, order, classes);
            if bin.pods.is_empty() {
                // Its first class cannot start a claim of this type: give it to the loop.
                if let Some(&m) = order.iter().find(|&&m| classes[members[m]].remaining() > 0 && !deferred[members[m]])
                {
                    deferred[members[m]] = true;
                }
                return;
            }
            self.subtract_limits(t, &bin);
            bin.right_size = true;
            self.planned.push(bin);
            let still_live = order.iter().any(|&m| classes[members[m]].remaining() > 0 && !deferred[members[m]]);
            if realized < 0.97 * estimate || !still_live || !self.within_limits(t, columns[col].it) {
                return;
            }
        }
    }

    /// Adds pods to a claim in `order`, each class while its vector fits in `left`. Returns
    /// the value placed.
    fn fill_bin(
        &mut self,
        ctx: &Ctx<'_>,
        bin: &mut PlannedNode,
        left: &mut [f64],
        order: &[usize],
        classes: &mut [Class],
    ) -> f64 {
        let mut value = 0.0;
        for &m in order {
            while classes[ctx.members[m]].remaining() > 0 && self.try_one(ctx, bin, left, m, classes) {
                value += ctx.packing.value[m];
            }
        }
        value
    }

    /// Adds the next pod of class `members[m]` to a claim if its vector fits in `left` and
    /// Karpenter's checks (requirements, topology, types) allow it.
    pub(super) fn try_one(
        &mut self,
        ctx: &Ctx<'_>,
        bin: &mut PlannedNode,
        left: &mut [f64],
        m: usize,
        classes: &mut [Class],
    ) -> bool {
        let c = ctx.members[m];
        let d = &ctx.packing.demand[m];
        if classes[c].remaining() == 0 || !d.iter().zip(left.iter()).all(|(need, have)| *need <= *have + 1e-9) {
            return false;
        }
        let template = &self.templates[bin.template];
        let idx = classes[c].pods[classes[c].next];
        let pod = &self.pods[idx];
        let data = &ctx.data[c];
        // A twin of a pod already here needs only its resources checked (see `add_twin`).
        let twin_ok =
            pod.host_ports.is_empty() && pod.volume_requirements.is_empty() && !self.topology.constrains(idx, pod);
        let placed = if twin_ok && bin.twins.contains(&c) && bin.add_twin(template, &mut self.topology, idx, pod, data)
        {
            true
        } else {
            match bin.can_add(template, &self.topology, idx, pod, data, &ctx.views[c].tolerations, false, true) {
                Ok(add) => {
                    bin.add(template, &mut self.topology, idx, pod, data, add);
                    if twin_ok && !bin.twins.contains(&c) {
                        bin.twins.push(c);
                    }
                    true
                }
                Err(_) => false,
            }
        };
        if !placed {
            return false;
        }
        self.order.push(Placement { pod: idx, target: Target::Planned(bin.id), zone: pinned_zone(&bin.requirements) });
        classes[c].next += 1;
        for (h, n) in left.iter_mut().zip(d) {
            *h -= n;
        }
        true
    }
}
