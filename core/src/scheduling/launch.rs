//! Which offering a NodeClaim would launch as: the AWS provider's filter chain
//! (compatible-available, exotic types avoided, spot pricier than on-demand dropped,
//! 60 cheapest types), then spot before on-demand and the cheapest offering, with ties
//! spread across zones.

use std::collections::{BTreeMap, HashMap};

use crate::catalog::{CapacityType, InstanceType, Offering};
use crate::labels;
use crate::requirements::Requirements;
use crate::resources::ResourceList;

use super::{Launch, NewClaim, SolveOptions};

/// Per-solve memo: claims with the same requirements in the same template share the list
/// of types that meet them, cheapest first.
#[derive(Default)]
pub struct Cache {
    by_price: HashMap<(Requirements, usize), Vec<usize>>,
    launches: HashMap<(Requirements, ResourceList, Vec<usize>), Option<LaunchOffers>>,
}

/// A claim's launch capacity type and its offerings of that type, cheapest first.
type LaunchOffers = (CapacityType, Vec<(f64, usize, String)>);

impl Cache {
    /// The template's types that meet `reqs` and have an offering they allow, ordered by
    /// their cheapest such offering, then name.
    pub fn by_price(&mut self, template: &super::template::Template<'_>, t: usize, reqs: Requirements) -> &[usize] {
        self.by_price.entry((reqs, t)).or_insert_with_key(|(reqs, _)| {
            let its = template.instance_types;
            let filter = crate::catalog::OfferingFilter::new(reqs);
            let mut keyed: Vec<(f64, &str, usize)> = template
                .types
                .iter()
                .map(|&i| (its[i].cheapest_price_with(&filter), its[i].name.as_str(), i))
                .filter(|(p, _, i)| *p < f64::MAX && its[*i].requirements.intersects_ok(reqs))
                .collect();
            keyed.sort_by(|a, b| a.0.total_cmp(&b.0).then_with(|| a.1.cmp(b.1)));
            keyed.into_iter().map(|(_, _, i)| i).collect()
        })
    }

    /// The launch of `claim`, or `None` if no offering is left.
    pub fn choose(
        &mut self,
        its: &[InstanceType],
        claim: &NewClaim,
        opts: &SolveOptions,
        zone_use: &mut BTreeMap<String, usize>,
    ) -> Option<Launch> {
        let key = (claim.requirements.clone(), claim.requests.clone(), claim.instance_types.clone());
        let (capacity_type, offers) =
            self.launches.entry(key).or_insert_with(|| offerings(its, claim, opts)).as_ref()?;
        let cheapest = offers.first()?.0;
        let (_, t, zone) = offers
            .iter()
            .take_while(|(p, _, _)| *p == cheapest)
            .min_by_key(|(_, _, z)| (zone_use.get(z).copied().unwrap_or(0), z.clone()))?;
        *zone_use.entry(zone.clone()).or_insert(0) += 1;
        Some(Launch { instance_type: *t, zone: zone.clone(), capacity_type: *capacity_type, price: cheapest })
    }
}

/// The launchable offerings of a claim's capacity type, cheapest first.
fn offerings(its: &[InstanceType], claim: &NewClaim, opts: &SolveOptions) -> Option<LaunchOffers> {
    let reqs = &claim.requirements;
    let filter = crate::catalog::OfferingFilter::new(reqs);
    // Available, and the claim's requests fit. (The candidates already meet the claim's
    // requirements: they were filtered against them.)
    let mut types: Vec<usize> = claim
        .instance_types
        .iter()
        .copied()
        .filter(|&t| {
            let it = &its[t];
            claim.requests.fits_in(&it.allocatable) && it.offerings.iter().any(|o| filter.accepts(o))
        })
        .collect();
    let min_values = reqs.has_min_values();
    if !min_values {
        let generic: Vec<usize> = types.iter().copied().filter(|&t| !its[t].exotic).collect();
        if !generic.is_empty() {
            types = generic;
        }
    }
    let filter = &filter;
    let offers = |t: usize| its[t].offerings.iter().filter(move |o| filter.accepts(o));
    let ct_req = reqs.get(labels::CAPACITY_TYPE);
    let mixed = ct_req.has("spot") && ct_req.has("on-demand");
    let cheapest_od = types
        .iter()
        .flat_map(|&t| offers(t))
        .filter(|o| o.capacity_type == CapacityType::OnDemand)
        .map(|o| o.price)
        .fold(f64::MAX, f64::min);
    let keep = |o: &Offering| !(mixed && !min_values && o.capacity_type == CapacityType::Spot && o.price > cheapest_od);
    let mut keyed: Vec<(f64, &str, usize)> = types
        .iter()
        .map(|&t| (offers(t).filter(|o| keep(o)).map(|o| o.price).fold(f64::MAX, f64::min), its[t].name.as_str(), t))
        .collect();
    keyed.sort_by(|a, b| a.0.total_cmp(&b.0).then_with(|| a.1.cmp(b.1)));
    keyed.truncate(opts.max_launch_types);
    let types: Vec<usize> = keyed.into_iter().map(|(_, _, t)| t).collect();
    let capacity_type = if ct_req.has("spot")
        && types.iter().any(|&t| offers(t).any(|o| o.capacity_type == CapacityType::Spot && keep(o)))
    {
        CapacityType::Spot
    } else {
        CapacityType::OnDemand
    };
    let mut out: Vec<(f64, usize, String)> = types
        .iter()
        .flat_map(|&t| {
            offers(t).filter(|o| o.capacity_type == capacity_type && keep(o)).map(move |o| (o.price, t, o.zone.clone()))
        })
        .collect();
    if out.is_empty() {
        return None;
    }
    out.sort_by(|a, b| a.0.total_cmp(&b.0).then_with(|| a.1.cmp(&b.1)).then_with(|| a.2.cmp(&b.2)));
    Some((capacity_type, out))
}
