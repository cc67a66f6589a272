//! Which offering a NodeClaim would launch as: the AWS provider's filter chain
//! (compatible-available, exotic types avoided, spot pricier than on-demand dropped,
//! 60 cheapest types), then spot before on-demand and the cheapest offering, with ties
//! spread across zones.

use std::collections::BTreeMap;

use crate::catalog::{CapacityType, InstanceType, Offering};
use crate::labels;

use super::{Launch, NewClaim, SolveOptions};

/// The launch of `claim`, or `None` if no offering is left.
pub fn choose(
    its: &[InstanceType],
    claim: &NewClaim,
    opts: &SolveOptions,
    zone_use: &mut BTreeMap<String, usize>,
) -> Option<Launch> {
    let reqs = &claim.requirements;
    // Compatible and available, and the claim's requests fit.
    let mut types: Vec<usize> = claim
        .instance_types
        .iter()
        .copied()
        .filter(|&t| {
            let it = &its[t];
            reqs.is_compatible(&it.requirements, true)
                && claim.requests.fits_in(&it.allocatable)
                && it.has_compatible_offering(reqs)
        })
        .collect();
    let min_values = reqs.has_min_values();
    if !min_values {
        let generic: Vec<usize> = types.iter().copied().filter(|&t| !its[t].exotic).collect();
        if !generic.is_empty() {
            types = generic;
        }
    }
    let offerings = |t: usize| its[t].offerings.iter().filter(|o| o.available && o.compatible(reqs));
    let ct_req = reqs.get(labels::CAPACITY_TYPE);
    let mixed = ct_req.has("spot") && ct_req.has("on-demand");
    let cheapest_od = types
        .iter()
        .flat_map(|&t| offerings(t))
        .filter(|o| o.capacity_type == CapacityType::OnDemand)
        .map(|o| o.price)
        .fold(f64::MAX, f64::min);
    let keep = |o: &Offering| !(mixed && !min_values && o.capacity_type == CapacityType::Spot && o.price > cheapest_od);
    let mut keyed: Vec<(f64, &str, usize)> = types
        .iter()
        .map(|&t| (offerings(t).filter(|o| keep(o)).map(|o| o.price).fold(f64::MAX, f64::min), its[t].name.as_str(), t))
        .collect();
    keyed.sort_by(|a, b| a.0.total_cmp(&b.0).then_with(|| a.1.cmp(b.1)));
    keyed.truncate(opts.max_launch_types);
    let types: Vec<usize> = keyed.into_iter().map(|(_, _, t)| t).collect();
    let capacity_type = if ct_req.has("spot")
        && types.iter().any(|&t| offerings(t).any(|o| o.capacity_type == CapacityType::Spot && keep(o)))
    {
        CapacityType::Spot
    } else {
        CapacityType::OnDemand
    };
    let mut best: Option<(usize, &Offering)> = None;
    for &t in &types {
        for o in offerings(t).filter(|o| o.capacity_type == capacity_type && keep(o)) {
            let better = match best {
                None => true,
                Some((_, b)) => {
                    o.price < b.price
                        || (o.price == b.price
                            && (zone_use.get(&o.zone).copied().unwrap_or(0), &o.zone)
                                < (zone_use.get(&b.zone).copied().unwrap_or(0), &b.zone))
                }
            };
            if better {
                best = Some((t, o));
            }
        }
    }
    let (t, o) = best?;
    *zone_use.entry(o.zone.clone()).or_insert(0) += 1;
    Some(Launch { instance_type: t, zone: o.zone.clone(), capacity_type, price: o.price })
}
