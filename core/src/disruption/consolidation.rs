//! Consolidation: whether a set of candidates can go (their pods fitting elsewhere), and with
//! what (nothing, or one cheaper node), as Karpenter's `computeConsolidation`.
//!
//! The simulation ([`super::simulation`]) places the candidates' pods with their nodes taken
//! out: every other node (initialized: a plan that needs an uninitialized node is no plan)
//! may take them, and any NodePool may offer the one replacement. The decision:
//!
//! - a pod that fits nowhere: no move;
//! - no new node: **delete**;
//! - more than one new node: no move for Karpenter's methods; dovetail's repack (`max_new`
//!   above 1) takes m candidates onto n < m new nodes when the n together launch for less than
//!   the m cost (at worst: each new node's dearest kept type), with the same spot rules;
//! - one new node: **replace**, if some of its instance types launch for less than the
//!   candidates cost together (their worst-case price: the dearest offering the replacement may
//!   land on). A replacement that allows both spot and on-demand is pinned to spot, so a spot
//!   shortage never becomes a dearer on-demand launch. Spot candidates whose replacement may be
//!   spot are replaced by spot only with spot-to-spot consolidation on, and then (for one
//!   candidate) only when at least [`SPOT_TO_SPOT_MIN_TYPES`] spot types are cheaper; the
//!   launch is limited to the cheapest of them, so the cloud cannot pick one that invites
//!   another consolidation.
//!
//! A single candidate no one new node could replace (every pool spot only, for a spot node
//! with spot-to-spot off; or nothing any pool launches cheaper than it) can only go by a
//! delete: its trial stops at the first pod that needs a new node, and the pool remembers
//! that pod ([`super::memory::Stuck`]). Next round, while that pod fits on no other node, the
//! trial is skipped: no way of placing the other pods makes room for it.
//!
//! A delete, or a move allowed one new node, is not tried when the other nodes' room, counted,
//! cannot hold its pods together however they were placed (with, for the latter, the most room
//! any type that costs less than the candidates has): see `scheduling::room::Rooms`. A repack
//! is always tried.

use crate::catalog::{CapacityType, InstanceType};
use crate::labels;
use crate::pod::PodKey;
use crate::requirements::Requirement;
use crate::scheduling::{self, NewClaim, PoolInput};

use super::candidates::Candidate;
use super::memory::Stuck;
use super::simulation::Simulation;

/// Karpenter's `MinInstanceTypesForSpotToSpotConsolidation`.
pub const SPOT_TO_SPOT_MIN_TYPES: usize = 15;

/// The one new node a replacement launches.
#[derive(Clone, Debug)]
pub struct Replacement {
    /// Index into the pools the simulation was given.
    pub pool: usize,
    /// The solver's claim, its instance types narrowed to those cheaper than the candidates
    /// (and to spot when pinned).
    pub claim: NewClaim,
    /// The worst-case price of the dearest type kept ($/hour).
    pub price: f64,
}

/// A consolidation that holds.
#[derive(Clone, Debug)]
pub struct Move {
    pub candidates: Vec<String>,
    /// The new nodes launched first: none (a delete), one (Karpenter's replace), or several
    /// fewer than the candidates (a repack).
    pub replacements: Vec<Replacement>,
    /// What the candidates cost together ($/hour).
    pub cost: f64,
}

impl Move {
    /// The $/hour it saves at worst.
    pub fn savings(&self) -> f64 {
        self.cost - self.replacements.iter().map(|r| r.price).sum::<f64>()
    }
}

/// The worst-case price of launching `t` under the claim's requirements: its dearest available
/// offering in an allowed zone and capacity type (`None`: none).
fn worst_price(t: &InstanceType, claim: &NewClaim) -> Option<f64> {
    let zone = claim.requirements.get(labels::ZONE);
    let capacity = claim.requirements.get(labels::CAPACITY_TYPE);
    t.offerings
        .iter()
        .filter(|o| o.available && zone.has(&o.zone) && capacity.has(o.capacity_type.as_str()))
        .map(|o| o.price)
        .reduce(f64::max)
}

/// Why no one new node can replace `candidate`, if none can: the replacement would be spot
/// for a spot node with spot-to-spot consolidation off (every pool launches spot only), or
/// nothing any pool launches costs less than the candidate. Its only move is then a delete,
/// and a trial stops at the first pod that needs a new node.
fn replacement_ruled_out(sim: &Simulation<'_>, candidate: &Candidate<'_>, spot_to_spot: bool) -> Option<String> {
    let (cheapest, spot_only) = sim.new_node_floor();
    if spot_only && !spot_to_spot && candidate.capacity_type == Some(CapacityType::Spot) {
        return Some("spot-to-spot consolidation is off".into());
    }
    (cheapest >= candidate.price).then(|| no_cheaper(candidate.price))
}

/// Whether `candidates` can be consolidated, and how; the error says why not. `max_new` is
/// how many new nodes the move may launch: 1 for Karpenter's methods, fewer than the
/// candidates for a repack. With `stuck` (what the pool remembers of single-node moves),
/// a single candidate that no new node can replace ([`replacement_ruled_out`]) is first
/// asked whether the pod its last trial found no other node for fits elsewhere now; when
/// it does not, the move cannot hold and is not tried.
pub fn consolidate(
    sim: &mut Simulation<'_>,
    pools: &[PoolInput],
    candidates: &[&Candidate<'_>],
    spot_to_spot: bool,
    max_new: usize,
    stuck: Option<&mut Stuck>,
) -> Result<Move, String> {
    let cost: f64 = candidates.iter().map(|c| c.price).sum();
    let ids: Vec<String> = candidates.iter().map(|c| c.claim.id.clone()).collect();
    let names: Vec<&str> = ids.iter().map(String::as_str).collect();
    let ruled_out = match candidates {
        [c] if max_new == 1 => replacement_ruled_out(sim, c, spot_to_spot),
        _ => None,
    };
    let mut stuck = stuck.filter(|_| ruled_out.is_some());
    let cap = if ruled_out.is_some() { 0 } else { max_new };
    if let (Some(why), Some(memo), [id]) = (&ruled_out, stuck.as_deref_mut(), names.as_slice())
        && let Some(key) = memo.get(id).cloned()
    {
        if sim.fits_elsewhere(id, &key) == Some(false) {
            memo.skipped_one();
            return Err(format!("pod {key} fits on no other node, and {why}"));
        }
        memo.forget(id);
    }
    // A move whose pods the other nodes' room cannot hold together however placed (with
    // the one new node that costs less than the candidates, when it may launch one).
    let new_below = match cap {
        0 => Some(None),
        1 => Some(Some(cost)),
        _ => None,
    };
    if let Some(new_below) = new_below
        && let Some(short) = sim.room_rules_out(&names, new_below)
    {
        if let Some(memo) = stuck.as_deref_mut() {
            memo.skipped_one();
        }
        return Err(match &ruled_out {
            Some(why) => format!("{short}, and {why}"),
            None => short,
        });
    }
    let outcome = sim.try_move_within(&names, Some(cap))?;
    let first = outcome.stuck.and_then(|i| outcome.pod(i)).map(|p| &p.key);
    let failed = outcome.capped || !outcome.results.errors.is_empty();
    if failed && let (Some(memo), Some(key), [id]) = (stuck, first, names.as_slice()) {
        memo.remember(id, key.clone());
    }
    if outcome.capped {
        return Err(match &ruled_out {
            Some(why) => needs_new(first, why),
            None => format!("its pods would need more than {max_new} new nodes"),
        });
    }
    if let Some((i, why)) = outcome.results.errors.first() {
        let pod = outcome.pod(*i).map(|p| p.key.to_string()).unwrap_or_default();
        return Err(format!("pod {pod} would fit nowhere else: {why}"));
    }
    let results = outcome.results;
    match results.claims.len() {
        0 => return Ok(Move { candidates: ids, replacements: Vec::new(), cost }),
        1 => {}
        n if n <= max_new => {
            return repack(pools, candidates, results.claims, cost, spot_to_spot).map(|replacements| Move {
                candidates: ids,
                replacements,
                cost,
            });
        }
        n => return Err(format!("its pods would need {n} new nodes")),
    }
    let Some(mut claim) = results.claims.into_iter().next() else {
        return Err("no replacement".into());
    };
    let Some(pool) = pools.get(claim.pool) else { return Err("the replacement's nodepool is gone".into()) };
    let types = &pool.instance_types;
    let all_spot = spot_rules(candidates, &mut claim, spot_to_spot)?;
    let spot_only = !claim.requirements.get(labels::CAPACITY_TYPE).has(CapacityType::OnDemand.as_str());
    let mut priced = priced(types, &claim);
    priced.retain(|(p, _)| *p < cost);
    if priced.is_empty() {
        return Err(no_cheaper(cost));
    }
    // Karpenter's `filterOutSameInstanceType`: when several nodes go and the replacement could
    // be one of their own types, it must be cheaper than that node, or the move is no better
    // than deleting the others.
    if candidates.len() > 1 {
        let same = candidates
            .iter()
            .filter(|c| c.instance_type.is_some_and(|t| priced.iter().any(|(_, i)| types[*i as usize].name == t)))
            .map(|c| c.price)
            .reduce(f64::min);
        if let Some(cap) = same {
            priced.retain(|(p, _)| *p < cap);
            if priced.is_empty() {
                return Err("the replacement would be one of the nodes' own types at no lower price".into());
            }
        }
    }
    if all_spot && spot_only && candidates.len() == 1 {
        if priced.len() < SPOT_TO_SPOT_MIN_TYPES {
            return Err(format!(
                "only {} spot types are cheaper; spot-to-spot needs {SPOT_TO_SPOT_MIN_TYPES}",
                priced.len()
            ));
        }
        priced.truncate(SPOT_TO_SPOT_MIN_TYPES);
    }
    let replacement = narrowed(types, claim, priced)?;
    Ok(Move { candidates: ids, replacements: vec![replacement], cost })
}

/// No replacement undercuts `cost`.
fn no_cheaper(cost: f64) -> String {
    format!("no cheaper node than ${cost:.4}/h takes its pods")
}

/// A single-node move that needed a new node no replacement may be.
fn needs_new(pod: Option<&PodKey>, why: &str) -> String {
    match pod {
        Some(p) => format!("pod {p} would need a new node, and {why}"),
        None => format!("its pods would need a new node, and {why}"),
    }
}

/// Karpenter's spot rules on a replacement: candidates that are all spot, whose replacement
/// may be spot, are spot-to-spot, allowed only with the setting on, and then replaced by spot
/// only; any other replacement that allows both spot and on-demand is pinned to spot (its
/// types were kept by their spot price, so a spot shortage never becomes a dearer on-demand
/// launch). Returns whether every candidate is spot.
fn spot_rules(candidates: &[&Candidate<'_>], claim: &mut NewClaim, spot_to_spot: bool) -> Result<bool, String> {
    let all_spot = candidates.iter().all(|c| c.capacity_type == Some(CapacityType::Spot));
    let capacity = claim.requirements.get(labels::CAPACITY_TYPE);
    let allows_spot = capacity.has(CapacityType::Spot.as_str());
    let allows_on_demand = capacity.has(CapacityType::OnDemand.as_str());
    if all_spot && allows_spot {
        if !spot_to_spot {
            return Err("spot-to-spot consolidation is off".into());
        }
        claim.requirements.add(labels::CAPACITY_TYPE, Requirement::is_in([CapacityType::Spot.as_str()]));
    } else if allows_spot && allows_on_demand {
        claim.requirements.add(labels::CAPACITY_TYPE, Requirement::is_in([CapacityType::Spot.as_str()]));
    }
    Ok(all_spot)
}

/// The claim's instance types with their worst-case price, cheapest first.
fn priced(types: &[InstanceType], claim: &NewClaim) -> Vec<(f64, u32)> {
    let mut priced: Vec<(f64, u32)> = claim
        .instance_types
        .iter()
        .filter_map(|&t| {
            let it = types.get(t as usize)?;
            worst_price(it, claim).map(|p| (p, t))
        })
        .collect();
    priced.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
    priced
}

/// The replacement launching `claim` narrowed to the `priced` types kept: its price is the
/// dearest kept type's worst case, its launch the cheapest available offering of them that
/// the claim's requirements (zones, capacity types) allow.
fn narrowed(types: &[InstanceType], mut claim: NewClaim, priced: Vec<(f64, u32)>) -> Result<Replacement, String> {
    let price = priced.iter().map(|(p, _)| *p).fold(0.0, f64::max);
    claim.instance_types = priced.into_iter().map(|(_, t)| t).collect();
    let zone = claim.requirements.get(labels::ZONE);
    let capacity = claim.requirements.get(labels::CAPACITY_TYPE);
    let launch = claim
        .instance_types
        .iter()
        .filter_map(|&t| types.get(t as usize).map(|it| (t, it)))
        .flat_map(|(t, it)| it.offerings.iter().map(move |o| (t, o)))
        .filter(|(_, o)| o.available && zone.has(&o.zone) && capacity.has(o.capacity_type.as_str()))
        .min_by(|a, b| a.1.price.total_cmp(&b.1.price).then(a.0.cmp(&b.0)).then_with(|| a.1.zone.cmp(&b.1.zone)));
    let Some((t, o)) = launch else { return Err("no offering of the replacement is available".into()) };
    claim.launch = Some(scheduling::Launch {
        instance_type: t as usize,
        zone: o.zone.clone(),
        capacity_type: o.capacity_type,
        price: o.price,
    });
    Ok(Replacement { pool: claim.pool, claim, price })
}

/// dovetail's repack: the candidates' pods onto several new nodes (fewer than the
/// candidates, checked by the caller's `max_new`) that together cost less than the
/// candidates at worst. Each new node keeps the types within an equal share of the saving
/// over its cheapest, so however the cloud picks among them the total stays below `cost`.
fn repack(
    pools: &[PoolInput],
    candidates: &[&Candidate<'_>],
    claims: Vec<NewClaim>,
    cost: f64,
    spot_to_spot: bool,
) -> Result<Vec<Replacement>, String> {
    let n = claims.len();
    let mut each: Vec<(NewClaim, Vec<(f64, u32)>)> = Vec::with_capacity(n);
    for mut claim in claims {
        let Some(pool) = pools.get(claim.pool) else { return Err("a replacement's nodepool is gone".into()) };
        spot_rules(candidates, &mut claim, spot_to_spot)?;
        let priced = priced(&pool.instance_types, &claim);
        if priced.is_empty() {
            return Err("no offering of a replacement is available".into());
        }
        each.push((claim, priced));
    }
    let least: f64 = each.iter().map(|(_, p)| p[0].0).sum();
    if least >= cost {
        return Err(format!(
            "its pods would need {n} new nodes costing at least ${least:.4}/h, not less than ${cost:.4}/h"
        ));
    }
    let share = (cost - least) / n as f64;
    let mut out = Vec::with_capacity(n);
    for (claim, mut priced) in each {
        let cap = priced[0].0 + share;
        priced.retain(|(p, _)| *p < cap);
        let Some(pool) = pools.get(claim.pool) else { return Err("a replacement's nodepool is gone".into()) };
        out.push(narrowed(&pool.instance_types, claim, priced)?);
    }
    Ok(out)
}
