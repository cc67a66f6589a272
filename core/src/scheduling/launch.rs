//! Which offering a NodeClaim would launch as: the AWS provider's filter chain
//! (compatible-available, exotic types avoided, spot pricier than on-demand dropped,
//! 60 cheapest types), then spot before on-demand and the cheapest offering, with ties
//! spread across zones.

use std::collections::{BTreeMap, HashMap};

use crate::catalog::CapacityType;
use crate::labels;
use crate::requirements::Requirements;

use super::{Launch, NewClaim, SolveOptions};

/// Per-solve memo: claims with the same requirements in the same template share the list
/// of types that meet them, cheapest first.
#[derive(Default)]
pub struct Cache {
    by_price: HashMap<(Requirements, usize), Vec<usize>>,
    /// Per template, per requirements.
    prices: Vec<HashMap<Requirements, Vec<[f64; 2]>>>,
}

impl Cache {
    /// The template's types that meet `reqs` and have an offering they allow, ordered by
    /// their cheapest such offering, then name.
    pub fn by_price(&mut self, template: &super::template::Template<'_>, t: usize, reqs: Requirements) -> &[usize] {
        self.by_price.entry((reqs, t)).or_insert_with_key(|(reqs, _)| {
            let its = template.instance_types;
            let filter = crate::catalog::OfferingFilter::new(reqs);
            // The template's types meet its requirements; check only what `reqs` adds.
            let beyond = reqs.keys_beyond(&template.requirements);
            let mut keyed: Vec<(f64, &str, usize)> = template
                .types
                .iter()
                .map(|&i| (its[i].cheapest_price_with(&filter), its[i].name.as_str(), i))
                .filter(|(p, _, i)| *p < f64::MAX && its[*i].requirements.intersects_ok_on(&beyond))
                .collect();
            keyed.sort_by(|a, b| a.0.total_cmp(&b.0).then_with(|| a.1.cmp(b.1)));
            keyed.into_iter().map(|(_, _, i)| i).collect()
        })
    }

    /// Per type of the template, the cheapest spot and on-demand offering `reqs` accept
    /// (`f64::MAX` when none), indexed like the pool's instance types.
    fn prices(&mut self, template: &super::template::Template<'_>, t: usize, reqs: &Requirements) -> &[[f64; 2]] {
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
        template: &super::template::Template<'_>,
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
