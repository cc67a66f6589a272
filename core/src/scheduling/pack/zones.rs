//! The zone passes of a round: pods with zone-keyed topology rules (zone spread, zone pod
//! affinity) placed zone by zone, so each lands in a zone its rule allows and zone counts
//! stay even.

use crate::scheduling::classes::Class;
use crate::scheduling::scheduler::Scheduler;

use super::Ctx;
use super::bins::{Bin, Round, pin_zone, share_of, take_share};

impl Scheduler<'_> {
    /// Zone-keyed pods of member `m`: each pod tries the zones in turn (starting where the
    /// last one of its class went), preferring claims that planned for it, then any claim of
    /// the zone it fits, so it lands in a zone its spread or affinity allows and zone counts
    /// stay even. A zone with no claim at all gets one.
    pub(super) fn zone_pass(&mut self, ctx: &Ctx<'_>, round: &mut Round<'_>, m: usize, classes: &mut [Class]) {
        let zone_slots = round.zone_slots;
        let mut planned_in: Vec<Vec<usize>> = vec![Vec::new(); zone_slots];
        let mut shares = 0usize;
        for (b, bin) in round.bins.iter().enumerate() {
            if let Some(&(_, n)) = bin.share.iter().find(|(x, _)| *x == m) {
                planned_in[bin.zone.unwrap_or(0)].push(b);
                shares += n;
            }
        }
        // The class's shares, plus its part of the quota for every zone no claim of this
        // round was planned in.
        let q: usize = round.quota[m].iter().sum();
        let mut to_place = shares
            + (0..round.zone_names.len())
                .filter(|&z| round.zone_bins[z].is_empty())
                .map(|z| (z + 1) * q / zone_slots - z * q / zone_slots)
                .sum::<usize>();
        let mut planned_cursor = vec![0usize; zone_slots];
        let mut any_cursor = vec![0usize; zone_slots];
        let mut start = 0usize;
        while to_place > 0 && classes[ctx.members[m]].remaining() > 0 {
            let mut placed = false;
            for step in 0..zone_slots {
                let z = (start + step) % zone_slots;
                // A claim that planned pods of this class in this zone.
                let mut candidate = None;
                while let Some(&b) = planned_in[z].get(planned_cursor[z]) {
                    if share_of(&round.bins[b].share, m) > 0 && round.fits(ctx, m, &round.bins[b]) {
                        candidate = Some(b);
                        break;
                    }
                    planned_cursor[z] += 1;
                }
                // Else a claim of the zone that already has pods and room.
                if candidate.is_none() {
                    let mut i = any_cursor[z];
                    while let Some(&b) = round.zone_bins[z].get(i) {
                        if round.fits(ctx, m, &round.bins[b]) {
                            if !round.bins[b].node.pods.is_empty() {
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
                if candidate.is_none() && z < round.zone_names.len() && round.zone_bins[z].is_empty() {
                    candidate = self.open_zone_bin(ctx, round, m, z);
                }
                let Some(b) = candidate else { continue };
                let bin = &mut round.bins[b];
                if let Some(z) = bin.zone
                    && !pin_zone(&mut bin.node, &round.zone_names[z])
                {
                    continue;
                }
                if self.try_one(ctx, &mut bin.node, &mut bin.left, m, classes) {
                    take_share(&mut bin.share, m);
                    if round.quota[m][bin.col] > 0 {
                        round.quota[m][bin.col] -= 1;
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
        for bin in round.bins.iter_mut() {
            bin.share.retain(|(x, _)| *x != m);
        }
    }

    /// Opens a claim of the cheapest column offered in zone `z` that a pod of member `m`
    /// fits on, within the pool's limits.
    fn open_zone_bin(&mut self, ctx: &Ctx<'_>, round: &mut Round<'_>, m: usize, z: usize) -> Option<usize> {
        let k = (0..round.columns.len())
            .filter(|&k| {
                round.compat[m][k]
                    && round.column_zones[k].contains(&z)
                    && ctx.packing.demand[m].iter().zip(&round.columns[k].alloc).all(|(d, a)| *d <= *a)
                    && self.within_limits(ctx.t, round.columns[k].it)
            })
            .min_by(|&a, &b| round.columns[a].price.total_cmp(&round.columns[b].price))?;
        let node = self.new_packed(ctx.t, round.columns[k].it);
        self.next_hostname += 1;
        self.subtract_limits(ctx.t, &node);
        round.bins.push(Bin { col: k, zone: Some(z), node, left: round.columns[k].alloc.clone(), share: Vec::new() });
        round.zone_bins[z].push(round.bins.len() - 1);
        Some(round.bins.len() - 1)
    }
}
