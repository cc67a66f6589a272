//! Which offering a NodeClaim would launch as: the AWS provider's filter chain
//! (compatible-available, exotic types avoided, spot pricier than on-demand dropped,
//! 60 cheapest types), then spot before on-demand and the cheapest offering, with ties
//! spread across zones.

use std::collections::{BTreeMap, HashMap};

use crate::catalog::CapacityType;
use crate::labels;
use crate::requirements::Requirements;

use super::input::SolveOptions;
use super::output::{Launch, NewClaim};
use super::right_size::Finalized;
use super::template::Template;

/// Per-solve memo: claims with the same requirements in the same template share the
/// price table of their offerings.
#[derive(Default)]
pub struct Cache {
    /// Per template, per requirements.
    prices: Vec<HashMap<Requirements, Vec<[f64; 2]>>>,
}

impl Cache {
    /// Per type of the template, the cheapest spot and on-demand offering `reqs` accept
    /// (`f64::MAX` when none), indexed like the pool's instance types.
    fn prices(&mut self, template: &Template<'_>, t: usize, reqs: &Requirements) -> &[[f64; 2]] {
        if self.prices.len() <= t {
            self.prices.resize_with(t + 1, HashMap::new);
        }
        let per_template = &mut self.prices[t];
        if !per_template.contains_key(reqs) {
            let filter = crate::catalog::OfferingFilter::new(reqs);
            let table = template
                .instance_types
                .iter()
                .map(|it| {
                    let mut p = [f64::MAX; 2];
                    for o in it.offerings.iter().filter(|o| filter.accepts(o)) {
                        let i = match o.capacity_type {
                            CapacityType::Spot => 0,
                            CapacityType::OnDemand => 1,
                            CapacityType::Reserved => continue,
                        };
                        p[i] = p[i].min(o.price);
                    }
                    p
                })
                .collect();
            per_template.insert(reqs.clone(), table);
        }
        per_template.get(reqs).map(Vec::as_slice).unwrap_or(&[])
    }

    /// The launch of `claim` (of template `t`), or `None` if no offering is left.
    ///
    /// The AWS provider's choice: the claim's candidates that fit and have an available
    /// offering; exotic types dropped unless nothing else is left (or minValues applies);
    /// with both spot and on-demand allowed, spot offerings pricier than the cheapest
    /// on-demand one dropped; the `max_launch_types` cheapest types (by price, then name);
    /// spot if any of them offers it, else on-demand; the cheapest offering of that capacity
    /// type, and among equally cheap ones the zone this solve has launched least in (then by
    /// name), which spreads identical claims over zones.
    pub fn choose(
        &mut self,
        template: &Template<'_>,
        t: usize,
        claim: &NewClaim,
        opts: &SolveOptions,
        zone_use: &mut BTreeMap<String, usize>,
    ) -> Option<Launch> {
        let its = template.instance_types;
        let reqs = &claim.requirements;
        let prices = self.prices(template, t, reqs);
        let need = template.need_plain(&claim.requests);
        let mut types: Vec<usize> = claim
            .instance_types
            .iter()
            .map(|&i| i as usize)
            .filter(|&i| prices[i][0] < f64::MAX || prices[i][1] < f64::MAX)
            .filter(|&i| template.fits_plain(&need, i))
            .collect();
        let min_values = reqs.has_min_values();
        if !min_values && types.iter().any(|&i| !its[i].exotic) {
            types.retain(|&i| !its[i].exotic);
        }
        let ct_req = reqs.get(labels::CAPACITY_TYPE);
        let mixed = ct_req.has("spot") && ct_req.has("on-demand");
        let cheapest_od =
            if mixed && !min_values { types.iter().map(|&i| prices[i][1]).fold(f64::MAX, f64::min) } else { f64::MAX };
        // A type's price once spot offerings pricier than the cheapest on-demand one are
        // dropped, and whether it keeps a spot offering.
        let kept_spot = |i: usize| prices[i][0] < f64::MAX && prices[i][0] <= cheapest_od;
        let kept = |i: usize| if kept_spot(i) { prices[i][0].min(prices[i][1]) } else { prices[i][1] };
        let mut keyed: Vec<(f64, &str, usize)> = types.iter().map(|&i| (kept(i), its[i].name.as_str(), i)).collect();
        let order = |a: &(f64, &str, usize), b: &(f64, &str, usize)| a.0.total_cmp(&b.0).then_with(|| a.1.cmp(b.1));
        if keyed.len() > opts.max_launch_types && opts.max_launch_types > 0 {
            keyed.select_nth_unstable_by(opts.max_launch_types - 1, order);
        }
        keyed.truncate(opts.max_launch_types);
        let capacity_type = if ct_req.has("spot") && keyed.iter().any(|&(_, _, i)| kept_spot(i)) {
            CapacityType::Spot
        } else {
            CapacityType::OnDemand
        };
        let slot = usize::from(capacity_type != CapacityType::Spot);
        let best = keyed.iter().map(|&(_, _, i)| prices[i][slot]).fold(f64::MAX, f64::min);
        if best == f64::MAX {
            return None;
        }
        // Every offering at that price, of the chosen capacity type.
        let filter = crate::catalog::OfferingFilter::new(reqs);
        let mut pick: Option<(usize, usize, &str)> = None;
        for &(_, _, i) in keyed.iter().filter(|&&(_, _, i)| prices[i][slot] == best) {
            for o in its[i].offerings.iter().filter(|o| o.capacity_type == capacity_type && o.price == best) {
                if !filter.accepts(o) {
                    continue;
                }
                let cand = (zone_use.get(&o.zone).copied().unwrap_or(0), i, o.zone.as_str());
                let better = match pick {
                    None => true,
                    Some(p) => (cand.0, cand.2, cand.1) < (p.0, p.2, p.1),
                };
                if better {
                    pick = Some(cand);
                }
            }
        }
        let (_, i, zone) = pick?;
        *zone_use.entry(zone.to_string()).or_insert(0) += 1;
        Some(Launch { instance_type: i, zone: zone.to_string(), capacity_type, price: best })
    }
}

/// Chooses the launch of every finalized claim, in order, spreading equally cheap
/// offerings over zones across the whole solve.
pub fn choose_all(templates: &[Template<'_>], finalized: &mut [Finalized], opts: &SolveOptions) {
    let mut zone_use: BTreeMap<String, usize> = BTreeMap::new();
    let mut cache = Cache::default();
    for f in finalized {
        f.claim.launch = cache.choose(&templates[f.template], f.template, &f.claim, opts, &mut zone_use);
    }
}

/// A candidate instance type as the launch sees it, under a claim's requirements.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Rung {
    /// Index into the pool's instance types.
    pub ty: usize,
    /// Its cheapest accepted offering: the right-sizing order.
    pub key: f64,
    /// Its cheapest accepted spot and on-demand offerings (`f64::MAX` when none).
    pub spot: f64,
    pub od: f64,
    pub exotic: bool,
}

/// The capacity types a claim's requirements leave open, as the launch reads them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Market {
    /// Spot is allowed.
    pub spot: bool,
    /// Spot and on-demand are both allowed (spot pricier than on-demand is then dropped).
    pub mixed: bool,
    /// The requirements carry `minValues` (no exotic or spot filtering then).
    pub min_values: bool,
}

impl Market {
    /// The market of some requirements.
    pub fn of(reqs: &Requirements) -> Market {
        let ct = reqs.get(labels::CAPACITY_TYPE);
        Market { spot: ct.has("spot"), mixed: ct.has("spot") && ct.has("on-demand"), min_values: reqs.has_min_values() }
    }
}

/// The price [`Cache::choose`] would launch a claim at, given its candidates (the types
/// that fit it) as rungs; `None` when no offering is left. The same filter chain: exotic
/// types dropped unless nothing else remains (or minValues applies), spot offerings
/// pricier than the cheapest on-demand one dropped when both are allowed, the
/// `max_launch` cheapest types, spot if any of them keeps a spot offering.
pub fn decide(rungs: &[Rung], market: Market, max_launch: usize) -> Option<(f64, usize)> {
    let drop_exotic = !market.min_values && rungs.iter().any(|r| !r.exotic);
    let kept_types = || rungs.iter().filter(move |r| !(drop_exotic && r.exotic));
    let cheapest_od =
        if market.mixed && !market.min_values { kept_types().map(|r| r.od).fold(f64::MAX, f64::min) } else { f64::MAX };
    let kept_spot = |r: &Rung| r.spot < f64::MAX && r.spot <= cheapest_od;
    let kept = |r: &Rung| if kept_spot(r) { r.spot.min(r.od) } else { r.od };
    let mut keyed: Vec<(f64, usize, &Rung)> = kept_types().enumerate().map(|(i, r)| (kept(r), i, r)).collect();
    // Rungs come in right-sizing order (price, then name), so their position breaks ties
    // as `choose` does by name.
    keyed.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
    keyed.truncate(max_launch);
    let spot = market.spot && keyed.iter().any(|(_, _, r)| kept_spot(r));
    let mut best: Option<(f64, usize)> = None;
    for (_, _, r) in &keyed {
        let p = if spot { r.spot } else { r.od };
        if p < f64::MAX && best.is_none_or(|(b, _)| p < b) {
            best = Some((p, r.ty));
        }
    }
    best
}

/// [`decide`] (the price and a type launched at it) over candidates read one at a time in
/// right-sizing order, stopping as soon
/// as no later candidate can change the answer: once a type that is kept for sure has
/// been seen, a candidate whose cheapest offering costs more than both the answer so far
/// and (with both markets open) the cheapest on-demand offering so far cannot be picked,
/// cannot lower the on-demand floor that drops spot offerings, and cannot turn the choice
/// to spot. At most `max_types` candidates are read (the claim keeps that many).
pub fn launch_price_and_type(
    candidates: impl IntoIterator<Item = Rung>,
    market: Market,
    max_types: usize,
    max_launch: usize,
) -> Option<(f64, usize)> {
    let mut seen: Vec<Rung> = Vec::new();
    let mut settled = false;
    let mut bound = f64::NEG_INFINITY;
    for r in candidates.into_iter().take(max_types) {
        if settled && r.key > bound {
            // Recompute with what was seen: the bound only grows, so this runs rarely.
            let answer = decide(&seen, market, max_launch);
            let floor = if market.mixed && !market.min_values {
                seen.iter().filter(|s| market.min_values || !s.exotic).map(|s| s.od).fold(f64::MAX, f64::min)
            } else {
                f64::NEG_INFINITY
            };
            bound = answer.map_or(f64::MAX, |(p, _)| p).max(floor);
            if r.key > bound {
                return answer;
            }
        }
        settled |= market.min_values || !r.exotic;
        seen.push(r);
    }
    decide(&seen, market, max_launch)
}
