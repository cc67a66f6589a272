//! Where and how a claim launches: its zone (the cheapest available offering, spread among
//! ties), its capacity types and candidate types in launch order, and the zone it moves to
//! after insufficient capacity.

use std::collections::BTreeMap;

use crate::catalog::{CapacityType, InstanceType, Offering};
use crate::labels;
use crate::ledger::{MicroDollars, micro_dollars};
use crate::nodepool::NodeClaimSpec;
use crate::requirements::Requirements;
use crate::resources::ResourceList;
use crate::scheduling::NewClaim;

/// A zone choice for a claim.
#[derive(Clone, Debug, PartialEq)]
pub struct ZoneChoice {
    pub zone: String,
    pub capacity_type: CapacityType,
    /// The cheapest available offering's price there.
    pub price: f64,
}

/// Picks the zone of a claim: the cheapest available offering over its candidate types
/// (spot before on-demand when both are allowed and spot is offered anywhere, as Karpenter
/// launches spot when the claim allows it), skipping offerings `unavailable` says are ICE'd;
/// among zones within 0.1% of the cheapest price, the one with the fewest claims in `spread`,
/// then by name. `None` when nothing is available.
pub fn pick_zone<'a>(
    offerings: impl IntoIterator<Item = (&'a str, &'a Offering)>,
    capacity_types: &[CapacityType],
    unavailable: impl Fn(&str, &Offering) -> bool,
    spread: &BTreeMap<String, usize>,
) -> Option<ZoneChoice> {
    let allowed = |c: CapacityType| capacity_types.is_empty() || capacity_types.contains(&c);
    // Cheapest price per (capacity type, zone).
    let mut best: BTreeMap<(CapacityType, &str), f64> = BTreeMap::new();
    for (instance_type, o) in offerings {
        if !o.available || !allowed(o.capacity_type) || unavailable(instance_type, o) {
            continue;
        }
        let e = best.entry((o.capacity_type, o.zone.as_str())).or_insert(o.price);
        *e = e.min(o.price);
    }
    let ct = [CapacityType::Spot, CapacityType::OnDemand, CapacityType::Reserved]
        .into_iter()
        .find(|c| best.keys().any(|(k, _)| k == c))?;
    let zones: Vec<(&str, f64)> = best.iter().filter(|((c, _), _)| *c == ct).map(|((_, z), p)| (*z, *p)).collect();
    let cheapest = zones.iter().map(|(_, p)| *p).fold(f64::INFINITY, f64::min);
    let (zone, price) = zones.into_iter().filter(|(_, p)| *p <= cheapest * 1.001).min_by(|a, b| {
        let (na, nb) = (spread.get(a.0).copied().unwrap_or(0), spread.get(b.0).copied().unwrap_or(0));
        na.cmp(&nb).then_with(|| a.0.cmp(b.0))
    })?;
    Some(ZoneChoice { zone: zone.to_string(), capacity_type: ct, price })
}

/// The capacity types a claim's requirements allow, spot first.
pub fn capacity_types(reqs: &Requirements) -> Vec<CapacityType> {
    let req = reqs.get(labels::CAPACITY_TYPE);
    [CapacityType::Spot, CapacityType::OnDemand].into_iter().filter(|c| req.has(c.as_str())).collect()
}

/// The zones of `zones` a claim's requirements allow.
pub fn allowed_zones(reqs: &Requirements, zones: &[String]) -> Vec<String> {
    let req = reqs.get(labels::ZONE);
    zones.iter().filter(|z| req.has(z)).cloned().collect()
}

/// How a new claim of a round is launched and reserved.
#[derive(Clone, Debug, PartialEq)]
pub struct ClaimPlan {
    /// The zone it launches in: the solver's launch zone, else the cheapest available.
    pub zone: String,
    pub capacity_types: Vec<CapacityType>,
    /// Candidate type names, in the solver's order (cheapest first).
    pub instance_types: Vec<String>,
    /// The zones (of the plane's) it may move to after insufficient capacity.
    pub zones: Vec<String>,
    /// What the ledger reserves: the most the claim can hold and cost, since the provider
    /// picks among its types (the largest candidate's capacity, the dearest offering in the
    /// zone).
    pub resources: ResourceList,
    pub price_per_hour: MicroDollars,
}

/// Plans a claim the solver made from `types` (its pool's); `None` when no zone can take it.
pub fn plan_claim(c: &NewClaim, spec: &NodeClaimSpec, types: &[InstanceType], zones: &[String]) -> Option<ClaimPlan> {
    let capacity_types = capacity_types(&spec.requirements);
    let candidates = || c.instance_types.iter().map(|&t| &types[t as usize]);
    let zone = match &c.launch {
        Some(l) => l.zone.clone(),
        None => {
            let offerings = candidates().flat_map(|it| it.offerings.iter().map(move |o| (it.name.as_str(), o)));
            pick_zone(offerings, &capacity_types, |_, _| false, &BTreeMap::new())?.zone
        }
    };
    let mut resources = ResourceList::new();
    let mut price = 0.0f64;
    for it in candidates() {
        resources = resources.max_with(&it.capacity);
        for o in it.offerings.iter().filter(|o| o.zone == zone && capacity_types.contains(&o.capacity_type)) {
            price = price.max(o.price);
        }
    }
    Some(ClaimPlan {
        zone,
        instance_types: candidates().map(|it| it.name.clone()).collect(),
        zones: allowed_zones(&spec.requirements, zones),
        capacity_types,
        resources,
        price_per_hour: micro_dollars(price),
    })
}

/// Instance types by name: built once for the launches of a round or a reconcile, not for
/// each claim (a pool knows hundreds of types; a burst launches thousands of claims).
pub type TypesByName<'a> = crate::shared::FastMap<&'a str, &'a InstanceType>;

/// The index [`launch_order`] reads (and drift, prices and launch labels): the first type of
/// a name, as a search in order finds it.
pub fn types_by_name(types: &[InstanceType]) -> TypesByName<'_> {
    let mut out = TypesByName::with_capacity_and_hasher(types.len(), Default::default());
    for t in types {
        out.entry(t.name.as_str()).or_insert(t);
    }
    out
}

/// A claim's candidate types in the order a launch tries them: by the cheapest offering in
/// `zone` among the allowed capacity types (types not offered there last), then by name.
pub fn launch_order(
    by_name: &TypesByName<'_>,
    names: &[String],
    zone: &str,
    capacity_types: &[CapacityType],
) -> Vec<String> {
    let allowed = |c: CapacityType| capacity_types.is_empty() || capacity_types.contains(&c);
    let mut priced: Vec<(f64, &String)> = names
        .iter()
        .map(|n| {
            let price = by_name
                .get(n.as_str())
                .into_iter()
                .flat_map(|t| t.offerings.iter())
                .filter(|o| o.zone == zone && o.available && allowed(o.capacity_type))
                .map(|o| o.price)
                .fold(f64::INFINITY, f64::min);
            (price, n)
        })
        .collect();
    priced.sort_by(|a, b| a.0.total_cmp(&b.0).then_with(|| a.1.cmp(b.1)));
    priced.into_iter().map(|(_, n)| n.clone()).collect()
}

/// A launch's candidate types without those the ledger marks unavailable in `zone` for every
/// allowed capacity type (Karpenter filters ICE'd offerings before the 60 cheapest go to
/// CreateFleet). `Err` with every offering tried when none is left: the launch finds no
/// capacity without a call.
pub fn unmarked_candidates(
    names: &[String],
    zone: &str,
    capacity_types: &[CapacityType],
    marked: &std::collections::BTreeSet<crate::ledger::Offering>,
) -> Result<Vec<String>, Vec<crate::ledger::Offering>> {
    let cts: Vec<CapacityType> = if capacity_types.is_empty() {
        vec![CapacityType::Spot, CapacityType::OnDemand]
    } else {
        capacity_types.to_vec()
    };
    let key = |t: &str, ct: CapacityType| crate::ledger::Offering {
        instance_type: t.to_string(),
        zone: zone.to_string(),
        capacity_type: ct,
    };
    let kept: Vec<String> =
        names.iter().filter(|t| cts.iter().any(|&ct| !marked.contains(&key(t, ct)))).cloned().collect();
    if kept.is_empty() && !names.is_empty() {
        return Err(names.iter().flat_map(|t| cts.iter().map(move |&ct| key(t, ct))).collect());
    }
    Ok(kept)
}

/// The zone a claim moves to after insufficient capacity: the cheapest available offering of
/// its candidate types among the zones it may use, skipping what `unavailable` (the ledger's
/// ICE marks) excludes; `prefer` (the claim's own zone) wins a tie.
pub fn relaunch_zone(
    types: &[InstanceType],
    names: &[String],
    capacity_types: &[CapacityType],
    zones: &[String],
    prefer: Option<&str>,
    unavailable: impl Fn(&str, &Offering) -> bool,
) -> Option<ZoneChoice> {
    let names: std::collections::HashSet<&str> = names.iter().map(String::as_str).collect();
    let offerings = types
        .iter()
        .filter(|t| names.contains(t.name.as_str()))
        .flat_map(|t| t.offerings.iter().map(move |o| (t.name.as_str(), o)))
        .filter(|(_, o)| zones.contains(&o.zone));
    // A tie goes to the zone with the fewest claims: the preferred one counts none.
    let others: BTreeMap<String, usize> =
        zones.iter().filter(|z| prefer.is_some_and(|p| p != z.as_str())).map(|z| (z.clone(), 1)).collect();
    pick_zone(offerings, capacity_types, unavailable, &others)
}
