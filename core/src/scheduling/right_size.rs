//! Right-sizing and finalizing planned NodeClaims: each claim's candidate types become
//! what its final contents allow (cheapest first), the smallest DaemonSet overhead among
//! them is added to its requests, and the instance-type and capacity-type requirements are
//! pinned, as Karpenter's `FinalizeScheduling` and `ToNodeClaim` do.

use std::collections::HashMap;

use crate::labels;
use crate::requirements::{Requirement, Requirements};
use crate::resources::ResourceList;

use super::filter::unmet_min_values;
use super::input::{MinValuesPolicy, SolveOptions};
use super::nodes::PlannedNode;
use super::output::NewClaim;
use super::scheduler::Scheduler;
use super::template::Template;

/// Per-solve memo: claims with the same requirements in the same template share the list
/// of types that meet them, cheapest first.
#[derive(Default)]
pub struct PriceOrder {
    by_price: HashMap<(Requirements, usize), Vec<usize>>,
}

impl PriceOrder {
    /// The template's types that meet `reqs` and have an offering they allow, ordered by
    /// their cheapest such offering, then name.
    pub fn by_price(&mut self, template: &Template<'_>, t: usize, reqs: Requirements) -> &[usize] {
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
}

/// The candidate types of a right-sized claim, cheapest first: every type of the pool
/// that meets its final requirements, has an offering they allow, and fits its pods with
/// its DaemonSets (no host port conflict), within what the claim reserved of the pool's
/// limits; at most `max` of them.
pub fn right_size(
    template: &Template<'_>,
    planned: &PlannedNode,
    limit_cap: Option<ResourceList>,
    max: usize,
    cache: &mut PriceOrder,
) -> Result<Vec<usize>, String> {
    let its = template.instance_types;
    let mut reqs = planned.requirements.clone();
    reqs.remove(labels::HOSTNAME);
    let by_price = cache.by_price(template, planned.template, reqs);
    let ports_ok: Vec<bool> = template
        .daemon_groups
        .iter()
        .map(|g| !planned.pod_ports.iter().any(|p| g.host_ports.iter().any(|q| p.conflicts(q))))
        .collect();
    let need = template.need(&planned.requests);
    let mut types: Vec<usize> = by_price
        .iter()
        .copied()
        .filter(|&t| {
            let Some(g) = template.group_of[t] else { return false };
            ports_ok[g]
                && template.fits(&need, t)
                && limit_cap.as_ref().is_none_or(|cap| cap.iter().all(|(n, v)| its[t].capacity.get(n) <= v))
        })
        .take(max)
        .collect();
    types.shrink_to_fit();
    if types.is_empty() {
        types = planned.types.clone();
    }
    Ok(types)
}

/// Karpenter's `FinalizeScheduling` + `ToNodeClaim`: drop the placeholder hostname, add the
/// smallest daemon overhead, order types by price, truncate, and pin the instance-type and
/// capacity-type requirements.
pub fn finalize(
    template: &Template<'_>,
    planned: &PlannedNode,
    types: Vec<usize>,
    presorted: bool,
    opts: &SolveOptions,
) -> Result<NewClaim, String> {
    let its = template.instance_types;
    let mut reqs = planned.requirements.clone();
    reqs.remove(labels::HOSTNAME);
    let mut used = vec![false; template.daemon_groups.len()];
    for &t in &types {
        if let Some(g) = template.group_of[t] {
            used[g] = true;
        }
    }
    let mut min_overhead: Option<ResourceList> = None;
    for (g, _) in used.iter().enumerate().filter(|(_, u)| **u) {
        let o = &template.daemon_groups[g].overhead;
        if !o.is_empty() {
            min_overhead = Some(match min_overhead {
                None => o.clone(),
                Some(m) => m.min_with(o),
            });
        }
    }
    let mut requests = planned.requests.clone();
    if let Some(m) = min_overhead {
        requests.add(&m);
    }
    let mut types = types;
    if !presorted {
        let offering_filter = crate::catalog::OfferingFilter::new(&reqs);
        let mut keyed: Vec<(f64, &str, usize)> =
            types.iter().map(|&t| (its[t].cheapest_price_with(&offering_filter), its[t].name.as_str(), t)).collect();
        keyed.sort_by(|a, b| a.0.total_cmp(&b.0).then_with(|| a.1.cmp(b.1)));
        types = keyed.into_iter().map(|(_, _, t)| t).collect();
    }
    types.truncate(opts.max_instance_types);
    if reqs.has_min_values() && opts.min_values_policy == MinValuesPolicy::Strict {
        let unmet = unmet_min_values(its, &types, &reqs);
        if !unmet.is_empty() {
            let keys: Vec<&str> = unmet.iter().map(|(k, _)| k.as_str()).collect();
            return Err(format!(
                "pod didn't schedule because NodePool {:?} couldn't meet minValues requirements, validating minValues, \
                 minValues requirement is not met for label(s) [{}]",
                template.pool.name,
                keys.join(" ")
            ));
        }
    }
    // The capacity types the candidates offer (stopping once every type the pool's
    // offerings could have is seen).
    let mut cts: Vec<&str> = Vec::new();
    let offering_filter = crate::catalog::OfferingFilter::new(&reqs);
    let possible = template.capacity_types.iter().filter(|c| reqs.get(labels::CAPACITY_TYPE).has(c.as_str())).count();
    'types: for &t in &types {
        for o in &its[t].offerings {
            if offering_filter.accepts(o) && !cts.contains(&o.capacity_type.as_str()) {
                cts.push(o.capacity_type.as_str());
                if cts.len() >= possible {
                    break 'types;
                }
            }
        }
    }
    if !cts.is_empty() {
        reqs.add(labels::CAPACITY_TYPE, Requirement::is_in(cts));
    }
    Ok(NewClaim {
        pool: template.pool_index,
        pods: planned.pods.clone(),
        instance_types: types.into_iter().map(|t| t as u32).collect(),
        requirements: reqs,
        requests,
        min_values_relaxed: planned.min_values_relaxed,
        launch: None,
    })
}

/// A planned claim once finalized.
pub struct Finalized {
    /// Its template (index into the solve's templates).
    pub template: usize,
    /// Its id in the solve (`PlannedNode::id`).
    pub id: usize,
    pub claim: NewClaim,
}

/// Finalizes every planned claim that holds pods, in planning order: right-sized claims (the
/// dovetail packer's) get every type that fits their contents within what they reserved of
/// the pool's limits; the others keep their candidates, ordered by price. A claim that
/// cannot be finalized (minValues no longer met) gives its pods that error.
pub fn finalize_all(state: &Scheduler<'_>, opts: &SolveOptions, errors: &mut HashMap<usize, String>) -> Vec<Finalized> {
    let mut out = Vec::new();
    let mut cache = PriceOrder::default();
    for planned in &state.planned {
        if planned.pods.is_empty() {
            continue;
        }
        let template = &state.templates[planned.template];
        let finalized = if planned.right_size {
            let cap = state.remaining_limit_types(planned);
            right_size(template, planned, cap, opts.max_instance_types, &mut cache)
                .and_then(|types| finalize(template, planned, types, true, opts))
        } else {
            finalize(template, planned, planned.types.clone(), false, opts)
        };
        match finalized {
            Ok(claim) => out.push(Finalized { template: planned.template, id: planned.id, claim }),
            Err(e) => {
                for &p in &planned.pods {
                    errors.insert(p, e.clone());
                }
            }
        }
    }
    out
}
