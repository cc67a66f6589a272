//! Topology on the plan's end state: topology spread (DoNotSchedule) and required pod
//! affinity replayed in placement order, and required pod anti-affinity in both directions.

use std::collections::{BTreeMap, HashMap};

use crate::labels::{self, LabelSelector, Labels};
use crate::pod::{Pod, PodAffinityTerm, TopologySpreadConstraint, WhenUnsatisfiable};
use crate::scheduling::input::Snapshot;

use crate::taints::{self, Effect, Taint};

use super::{EndNode, domain, label_ok, pod_fits_labels};

/// Whether `other` (a pod in `other_ns`) is one of the pods a term of a pod in `owner_ns`
/// selects.
fn term_selects(term: &PodAffinityTerm, owner_ns: &str, other: &Pod, snapshot: &Snapshot) -> bool {
    let Some(sel) = &term.selector else { return false };
    let ns = other.key.namespace.as_str();
    let ns_ok = if term.namespaces.is_empty() && term.namespace_selector.is_none() {
        ns == owner_ns
    } else {
        term.namespaces.iter().any(|n| n == ns)
            || term
                .namespace_selector
                .as_ref()
                .is_some_and(|s| s.matches(snapshot.namespaces.get(ns).unwrap_or(&Labels::new())))
    };
    ns_ok && sel.matches(&other.labels)
}

/// A spread constraint (with its namespace and its selector, `matchLabelKeys` included)
/// shared by some placed pods.
struct SpreadGroup<'a> {
    constraint: &'a TopologySpreadConstraint,
    owner: &'a Pod,
    selector: LabelSelector,
    /// Matching pods per domain so far.
    counts: BTreeMap<String, i64>,
}

/// A required pod affinity term (with its owner's namespace) of some placed pods.
struct AffinityGroup<'a> {
    term: &'a PodAffinityTerm,
    namespace: &'a str,
    counts: HashMap<String, usize>,
    total: usize,
}

/// Topology spread (DoNotSchedule) and required pod affinity, replayed in placement order:
/// when a pod was placed, its domain's matching pods (bound, or placed before it) must have
/// kept `maxSkew` against the least populated eligible domain, and a pod with required
/// affinity must have found a matching pod in its domain (or been the first such pod
/// anywhere, matching its own term). Domains are the end state's.
pub(super) fn check_spread_and_affinity(
    snapshot: &Snapshot,
    nodes: &[EndNode],
    members: &[(&Pod, usize, Option<usize>)],
    domain_of: &dyn Fn(usize, &str) -> Option<String>,
    out: &mut Vec<String>,
) {
    let mut spread: Vec<SpreadGroup<'_>> = Vec::new();
    let mut spread_index: HashMap<(String, String), usize> = HashMap::new();
    let mut affinity: Vec<AffinityGroup<'_>> = Vec::new();
    let mut affinity_index: HashMap<(&PodAffinityTerm, &str), usize> = HashMap::new();
    // The groups each member holds.
    let mut holds: Vec<(Vec<usize>, Vec<usize>)> = vec![(Vec::new(), Vec::new()); members.len()];
    for (mi, (pod, _, pending)) in members.iter().enumerate() {
        if pending.is_none() {
            continue;
        }
        for c in pod.topology_spread.iter().filter(|c| c.when_unsatisfiable == WhenUnsatisfiable::DoNotSchedule) {
            let Some(base) = &c.selector else { continue };
            let mut sel = base.clone();
            for k in &c.match_label_keys {
                if let Some(v) = pod.labels.get(k) {
                    sel = sel.with_expression(crate::labels::SelectorRequirement {
                        key: k.clone(),
                        op: crate::labels::SelectorOp::In,
                        values: vec![v.clone()],
                    });
                }
            }
            // Pods whose node affinity (or, under a taints policy of Honor, tolerations)
            // differ see different eligible domains: separate groups.
            let affinity = if c.node_affinity_policy == Some(crate::pod::InclusionPolicy::Ignore) {
                String::new()
            } else {
                format!("{:?}/{:?}", pod.node_selector, pod.node_affinity.required)
            };
            let tolerations = if c.node_taints_policy == Some(crate::pod::InclusionPolicy::Honor) {
                format!("{:?}", pod.tolerations)
            } else {
                String::new()
            };
            let key = (pod.key.namespace.clone(), format!("{}/{sel:?}/{affinity}/{tolerations}", c_key(c)));
            let g = *spread_index.entry(key).or_insert_with(|| {
                spread.push(SpreadGroup { constraint: c, owner: pod, selector: sel, counts: BTreeMap::new() });
                spread.len() - 1
            });
            holds[mi].0.push(g);
        }
        for t in &pod.pod_affinity.required {
            let a = *affinity_index.entry((t, pod.key.namespace.as_str())).or_insert_with(|| {
                affinity.push(AffinityGroup {
                    term: t,
                    namespace: pod.key.namespace.as_str(),
                    counts: HashMap::new(),
                    total: 0,
                });
                affinity.len() - 1
            });
            holds[mi].1.push(a);
        }
    }
    // Eligible nodes and known domains of each spread group (zero counts included); the
    // zones the claims' NodePools allow count as domains too, as Karpenter's do.
    // (zone, pool taints) of every offering a pool may launch.
    let pool_zones: Vec<(&str, &[Taint])> = {
        let mut z: Vec<(&str, &[Taint])> = Vec::new();
        for input in &snapshot.nodepools {
            let r = input.pool.requirements.get(labels::ZONE);
            for it in input.instance_types.iter() {
                for o in &it.offerings {
                    let entry = (o.zone.as_str(), input.pool.taints.as_slice());
                    if r.has(&o.zone) && !z.contains(&entry) {
                        z.push(entry);
                    }
                }
            }
        }
        z
    };
    let mut eligible: Vec<Vec<bool>> = Vec::new();
    for g in spread.iter_mut() {
        let c = g.constraint;
        let owner = g.owner;
        let ok: Vec<bool> = (0..nodes.len())
            .map(|n| {
                let affinity_ok = c.node_affinity_policy == Some(crate::pod::InclusionPolicy::Ignore)
                    || pod_fits_labels(owner, &nodes[n].labels);
                let taints_ok = c.node_taints_policy != Some(crate::pod::InclusionPolicy::Honor) || {
                    let hard: Vec<Taint> =
                        nodes[n].taints.iter().filter(|t| t.effect != Effect::PreferNoSchedule).cloned().collect();
                    taints::tolerates_all(&hard, &owner.tolerations)
                };
                affinity_ok && taints_ok
            })
            .collect();
        for (n, node_ok) in ok.iter().enumerate() {
            if *node_ok && let Some(d) = domain(nodes, n, &c.topology_key) {
                g.counts.entry(d.to_string()).or_insert(0);
            }
        }
        if c.topology_key == labels::ZONE {
            for &(z, pool_taints) in &pool_zones {
                let zone_ok = c.node_affinity_policy == Some(crate::pod::InclusionPolicy::Ignore)
                    || (owner.node_selector.get(labels::ZONE).is_none_or(|v| v == z)
                        && (owner.node_affinity.required.is_empty()
                            || owner.node_affinity.required.iter().any(|t| label_ok(t.get(labels::ZONE), Some(z)))));
                let taints_ok = c.node_taints_policy != Some(crate::pod::InclusionPolicy::Honor) || {
                    let hard: Vec<Taint> =
                        pool_taints.iter().filter(|t| t.effect != Effect::PreferNoSchedule).cloned().collect();
                    taints::tolerates_all(&hard, &owner.tolerations)
                };
                if zone_ok && taints_ok {
                    g.counts.entry(z.to_string()).or_insert(0);
                }
            }
        }
        eligible.push(ok);
    }
    for (mi, (pod, n, _)) in members.iter().enumerate() {
        for &g in &holds[mi].0 {
            let group = &spread[g];
            let c = group.constraint;
            let key = c.topology_key.as_str();
            let Some(d) = domain_of(mi, key) else { continue };
            let have = group.counts.get(&d).copied().unwrap_or(0);
            let min = if key == labels::HOSTNAME || group.counts.len() < c.min_domains.unwrap_or(1).max(1) as usize {
                0
            } else {
                group.counts.values().copied().min().unwrap_or(0)
            };
            if have + 1 - min > i64::from(c.max_skew) {
                out.push(format!(
                    "pod {}: placed in {key}={d} with {have} matching pods there against a minimum of {min}, \
                     beyond maxSkew {}",
                    pod.key, c.max_skew
                ));
            }
        }
        for &a in &holds[mi].1 {
            let group = &affinity[a];
            let key = group.term.topology_key.as_str();
            let self_match = term_selects(group.term, group.namespace, pod, snapshot);
            // An open zone (Karpenter semantics) was allowed by the domains that had matching
            // pods then; the zone it launched in must have been one of them.
            let Some(d) = domain_of(mi, key).or_else(|| domain(nodes, *n, key).map(str::to_string)) else {
                out.push(format!("pod {}: its node has no {key} domain for its required pod affinity", pod.key));
                continue;
            };
            if group.counts.get(&d).copied().unwrap_or(0) == 0 && !(self_match && group.total == 0) {
                out.push(format!("pod {}: required pod affinity on {key} found no matching pod in {d}", pod.key));
            }
        }
        // Count the pod where it landed.
        for (g, group) in spread.iter_mut().enumerate() {
            if pod.key.namespace == group.owner.key.namespace
                && eligible[g][*n]
                && group.selector.matches(&pod.labels)
                && let Some(d) = domain_of(mi, &group.constraint.topology_key)
            {
                *group.counts.entry(d).or_insert(0) += 1;
            }
        }
        for group in affinity.iter_mut() {
            if term_selects(group.term, group.namespace, pod, snapshot)
                && let Some(d) = domain_of(mi, &group.term.topology_key)
            {
                *group.counts.entry(d).or_insert(0) += 1;
                group.total += 1;
            }
        }
    }
}

fn c_key(c: &TopologySpreadConstraint) -> String {
    format!(
        "{}/{}/{:?}/{:?}/{:?}",
        c.topology_key, c.max_skew, c.min_domains, c.node_affinity_policy, c.node_taints_policy
    )
}

/// Required pod anti-affinity, both directions, on the end state (a clash at the end was a
/// clash when the second pod of the pair was placed).
pub(super) fn check_anti_affinity(
    snapshot: &Snapshot,
    nodes: &[EndNode],
    members: &[(&Pod, usize, Option<usize>)],
    out: &mut Vec<String>,
) {
    let mut anti: HashMap<(&PodAffinityTerm, &str), Vec<usize>> = HashMap::new();
    for (mi, (pod, _, _)) in members.iter().enumerate() {
        for t in &pod.pod_anti_affinity.required {
            anti.entry((t, pod.key.namespace.as_str())).or_default().push(mi);
        }
    }
    let mut anti_terms: Vec<_> = anti.into_iter().collect();
    anti_terms.sort_by_key(|(_, h)| h[0]);
    for ((term, ns), holders) in anti_terms {
        let key = term.topology_key.as_str();
        let mut by_domain: HashMap<&str, (Vec<usize>, Vec<usize>)> = HashMap::new();
        for &h in &holders {
            if let Some(d) = domain(nodes, members[h].1, key) {
                by_domain.entry(d).or_default().0.push(h);
            }
        }
        for (mi, (pod, n, _)) in members.iter().enumerate() {
            if let Some(d) = domain(nodes, *n, key)
                && let Some(e) = by_domain.get_mut(d)
                && term_selects(term, ns, pod, snapshot)
            {
                e.1.push(mi);
            }
        }
        let mut doms: Vec<_> = by_domain.into_iter().collect();
        doms.sort_by(|a, b| a.0.cmp(b.0));
        for (d, (hs, ms)) in doms {
            let new = |i: usize| members[i].2.is_some();
            let clash = hs.iter().find_map(|&h| ms.iter().find(|&&m| m != h && (new(h) || new(m))).map(|&m| (h, m)));
            if let Some((h, m)) = clash {
                out.push(format!(
                    "pod {}: required anti-affinity on {key} violated by pod {} in {d}",
                    members[h].0.key, members[m].0.key
                ));
            }
        }
    }
}
