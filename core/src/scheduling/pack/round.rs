//! Phase 1 of packing a template: one round of the assignment LP. The LP (over the columns
//! whose reduced cost at the current dual prices is small) decides how many pods of each
//! class go on each type and how many claims of each type to open: the whole claims it asks
//! for, or, in the last round (or when it asks for less than one of anything), enough for
//! everything. Every class's share of a type is spread evenly over that type's claims, and
//! the claims are filled in passes, each cycling over the claims zone by zone so that zone
//! counts grow evenly: first the pods capped per node (hostname anti-affinity, hostname
//! spread), then the pods with zone-keyed topology rules (each claim pinned to its zone as
//! it gets its first one), then the rest; finally each claim is topped up by balance.

use std::collections::HashMap;

use crate::scheduling::classes::Class;
use crate::scheduling::scheduler::Scheduler;

use super::Ctx;
use super::bins::{Bin, Round, add_share, clear_share, pin_zone, take_share};
use super::columns::{TypeColumn, quotas};

impl Scheduler<'_> {
    /// Runs one round; returns false when nothing is left to do.
    pub(super) fn pack_round(&mut self, ctx: &Ctx<'_>, force_last: bool, classes: &mut [Class]) -> bool {
        if ctx.members.iter().all(|&c| classes[c].remaining() == 0) {
            return false;
        }
        let Some((mut round, y)) = self.plan_round(ctx, force_last, classes) else { return false };
        self.open_bins(ctx, &mut round, &y, classes);
        if round.bins.is_empty() {
            return false;
        }
        // Interleave the claims of all types so each pass grows every zone evenly.
        let mut order: Vec<usize> = (0..round.bins.len()).collect();
        let mut rank = vec![0usize; round.bins.len()];
        let mut seen: Vec<usize> = vec![0; round.columns.len()];
        for (b, bin) in round.bins.iter().enumerate() {
            rank[b] = seen[bin.col];
            seen[bin.col] += 1;
        }
        order.sort_by_key(|&b| (rank[b], b));
        let pass_of: Vec<usize> = ctx
            .members
            .iter()
            .map(|&c| {
                let c = &classes[c];
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
        let pressure = cap_pressure(ctx, &round, classes);
        for (b, bin) in round.bins.iter().enumerate() {
            round.zone_bins[bin.zone.unwrap_or(0)].push(b);
        }
        for pass in 0..4 {
            if pass == 1 || pass == 2 {
                for m in (0..ctx.members.len()).filter(|&m| pass_of[m] == pass) {
                    self.zone_pass(ctx, &mut round, m, classes);
                }
            } else {
                self.cycle_pass(ctx, &mut round, &order, |m| pass_of[m] == pass, &pressure, classes);
            }
        }
        self.top_up(ctx, &mut round, classes);
        let mut placed_any = false;
        for bin in round.bins {
            if bin.node.pods.is_empty() {
                self.release_limits(ctx.t, &bin.node);
                continue;
            }
            placed_any = true;
            let mut node = bin.node;
            node.right_size = true;
            self.planned.push(node);
        }
        placed_any && !round.last
    }

    /// Picks the round's columns (small reduced cost, at most six, plus the best for each
    /// class), runs the assignment LP on them, and lays out the zones. Returns the round and
    /// the LP's claim counts per column.
    fn plan_round<'c>(&self, ctx: &Ctx<'c>, force_last: bool, classes: &[Class]) -> Option<(Round<'c>, Vec<f64>)> {
        let (t, members, packing, columns, compat) = (ctx.t, ctx.members, ctx.packing, ctx.columns, ctx.compat);
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
        let sub_columns: Vec<&'c TypeColumn> = kept.iter().map(|&i| &columns[i]).collect();
        let sub_compat: Vec<Vec<bool>> = compat.iter().map(|row| kept.iter().map(|&i| row[i]).collect()).collect();
        let (quota, y) = quotas(&sub_columns, members, classes, packing, &sub_compat)?;
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
        let zone_slots = zone_names.len().max(1);
        // When zone-keyed topology counts any of these pods, every claim is pinned to its
        // zone from the start, so that each pod is counted where it will really run.
        let pin_all = members.iter().any(|&c| {
            classes[c].remaining() > 0 && self.topology.counted_beyond_hostname(&self.pods[classes[c].pods[0]])
        });
        let round = Round {
            columns: sub_columns,
            compat: sub_compat,
            quota,
            last,
            zone_names,
            column_zones,
            zone_slots,
            pin_all,
            bins: Vec::new(),
            zone_bins: vec![Vec::new(); zone_slots],
        };
        Some((round, y))
    }

    /// Opens the round's claims column by column (reserving the pool's limits for each) and
    /// spreads each class's quota of a column over that column's claims: capped classes
    /// round-robin under their cap, zone-keyed classes zone by zone, the rest evenly.
    fn open_bins(&mut self, ctx: &Ctx<'_>, round: &mut Round<'_>, y: &[f64], classes: &[Class]) {
        let (t, members, packing) = (ctx.t, ctx.members, ctx.packing);
        for k in 0..round.columns.len() {
            let col = round.columns[k];
            let count = if round.last {
                (0..col.alloc.len())
                    .filter(|&r| col.alloc[r] > 0.0)
                    .map(|r| {
                        (0..members.len()).map(|m| round.quota[m][k] as f64 * packing.demand[m][r]).sum::<f64>()
                            / col.alloc[r]
                    })
                    .fold(0.0_f64, f64::max)
                    .ceil()
            } else {
                (y[k] + 1e-6).floor()
            } as usize;
            if count == 0 || round.quota.iter().all(|q| q[k] == 0) {
                continue;
            }
            let zone_count = round.column_zones[k].len().max(1);
            let first = round.bins.len();
            for b in 0..count {
                if !self.within_limits(t, col.it) {
                    break;
                }
                let mut node = self.new_packed(t, col.it);
                self.next_hostname += 1;
                // Reserve the pool's limits now; given back if the claim stays empty.
                self.subtract_limits(t, &node);
                let zones = &round.column_zones[k];
                let zone = (!zones.is_empty()).then(|| zones[b % zone_count]);
                if round.pin_all
                    && let Some(z) = zone
                {
                    pin_zone(&mut node, &round.zone_names[z]);
                }
                round.bins.push(Bin { col: k, zone, node, left: col.alloc.clone(), share: Vec::new() });
            }
            let count = round.bins.len() - first;
            if count == 0 {
                continue;
            }
            // Pods capped per node go round-robin over the claims, never more than the cap
            // of their group on one claim; one cursor across groups, so different groups
            // start on different claims.
            let mut groups: Vec<usize> = Vec::new();
            for m in 0..members.len() {
                if let Some(&g) = classes[members[m]].caps.first()
                    && round.quota[m][k] > 0
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
                    for _ in 0..round.quota[m][k] {
                        let Some(step) = (0..count).find(|s| used[(next + s) % count] < cap) else { break };
                        let b = (next + step) % count;
                        used[b] += 1;
                        add_share(&mut round.bins[first + b].share, m);
                        next = (b + 1) % count;
                    }
                }
            }
            // Zone-keyed classes spread over zones first (so zone counts stay even), then
            // over the zone's claims; the rest evenly over all claims.
            for m in 0..members.len() {
                let q = round.quota[m][k];
                let c = &classes[members[m]];
                if q == 0 || !c.caps.is_empty() {
                    continue;
                }
                if c.zonal_spread || c.zonal_affinity {
                    for z in 0..zone_count.min(count) {
                        let qz = (z + 1) * q / zone_count - z * q / zone_count;
                        let nz = (count + zone_count - 1 - z) / zone_count;
                        for j in 0..qz {
                            add_share(&mut round.bins[first + (j * nz / qz) * zone_count + z].share, m);
                        }
                    }
                } else {
                    for j in 0..q {
                        add_share(&mut round.bins[first + j * count / q].share, m);
                    }
                }
            }
        }
    }

    /// Cycles over the claims (in `order`) that still have planned pods of the members
    /// `in_pass` selects, one pod per class per claim per cycle, so claims fill evenly; a
    /// class blocked on a claim (topology, capacity) leaves its share there to the top-up.
    fn cycle_pass(
        &mut self,
        ctx: &Ctx<'_>,
        round: &mut Round<'_>,
        order: &[usize],
        in_pass: impl Fn(usize) -> bool,
        pressure: &[f64],
        classes: &mut [Class],
    ) {
        let by_size = |m: usize, k: usize| -> f64 {
            ctx.packing.demand[m]
                .iter()
                .zip(&round.columns[k].alloc)
                .filter(|(_, a)| **a > 0.0)
                .map(|(d, a)| d / a)
                .sum()
        };
        let sizes: Vec<Vec<f64>> =
            (0..ctx.members.len()).map(|m| (0..round.columns.len()).map(|k| by_size(m, k)).collect()).collect();
        let mut active: Vec<usize> =
            order.iter().copied().filter(|&b| round.bins[b].share.iter().any(|&(m, n)| n > 0 && in_pass(m))).collect();
        let mut ms: Vec<usize> = Vec::new();
        while !active.is_empty() {
            let mut still: Vec<usize> = Vec::with_capacity(active.len());
            for &b in &active {
                let bin = &mut round.bins[b];
                ms.clear();
                ms.extend(bin.share.iter().filter(|&&(m, n)| n > 0 && in_pass(m)).map(|&(m, _)| m));
                // Capped pods of the most crowded group first (it decides how many claims
                // are needed), then larger pods first.
                let col = bin.col;
                ms.sort_by(|&x, &y| pressure[y].total_cmp(&pressure[x]).then(sizes[y][col].total_cmp(&sizes[x][col])));
                let mut progress = false;
                for &m in &ms {
                    if classes[ctx.members[m]].remaining() > 0
                        && self.try_one(ctx, &mut bin.node, &mut bin.left, m, classes)
                    {
                        take_share(&mut bin.share, m);
                        round.quota[m][bin.col] -= 1;
                        progress = true;
                    } else {
                        clear_share(&mut bin.share, m);
                    }
                }
                if progress && bin.share.iter().any(|&(m, n)| n > 0 && in_pass(m)) {
                    still.push(b);
                }
            }
            active = still;
        }
    }

    /// Each claim takes, by balance, pods of classes that still have quota on its type.
    fn top_up(&mut self, ctx: &Ctx<'_>, round: &mut Round<'_>, classes: &mut [Class]) {
        let members = ctx.members;
        let mut wanting: Vec<Vec<usize>> =
            (0..round.columns.len()).map(|k| (0..members.len()).filter(|&m| round.quota[m][k] > 0).collect()).collect();
        let mut blocked = vec![usize::MAX; members.len()];
        for b in 0..round.bins.len() {
            let k = round.bins[b].col;
            wanting[k].retain(|&m| round.quota[m][k] > 0 && classes[members[m]].remaining() > 0);
            if wanting[k].is_empty() {
                continue;
            }
            let alloc = &round.columns[k].alloc;
            loop {
                let bin = &round.bins[b];
                let mut best: Option<(f64, usize)> = None;
                for &m in &wanting[k] {
                    if blocked[m] == b || round.quota[m][k] == 0 || classes[members[m]].remaining() == 0 {
                        continue;
                    }
                    let d = &ctx.packing.demand[m];
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
                let bin = &mut round.bins[b];
                if self.try_one(ctx, &mut bin.node, &mut bin.left, m, classes) {
                    round.quota[m][k] -= 1;
                } else {
                    blocked[m] = b;
                }
            }
        }
    }
}

/// How crowded each member's cap group is: its pods per claim slot this round (0 for
/// uncapped classes).
fn cap_pressure(ctx: &Ctx<'_>, round: &Round<'_>, classes: &[Class]) -> Vec<f64> {
    let mut group_total: HashMap<usize, usize> = HashMap::new();
    for bin in &round.bins {
        for &(m, n) in &bin.share {
            if let Some(&g) = classes[ctx.members[m]].caps.first() {
                *group_total.entry(g).or_insert(0) += n;
            }
        }
    }
    ctx.members
        .iter()
        .map(|&c| match classes[c].caps.first() {
            None => 0.0,
            Some(&g) => {
                group_total.get(&g).copied().unwrap_or(0) as f64
                    / (round.bins.len() * ctx.packing.caps[g].cap).max(1) as f64
            }
        })
        .collect()
}
