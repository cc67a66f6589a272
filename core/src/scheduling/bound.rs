//! The cost lower bound of `../shared/design/goals.md`: LB = max(LB_fluid, LB_count).
//!
//! LB_fluid is one joint LP over all pods: offerings `o` (NodePool × instance type × zone ×
//! capacity type) with price `p_o` and allocatable `a_o` (less the DaemonSets that land
//! there), classes `k` of identical pods with the offerings `O_k` they may use and demand
//! `D_k`:
//!
//! ```text
//! min Σ_o p_o y_o   s.t.  Σ_k w_{k,o,r} ≤ a_{o,r} y_o   ∀ o, r
//!                         Σ_{o∈O_k} w_{k,o,r} ≥ D_{k,r}  ∀ k, r        y, w ≥ 0
//! ```
//!
//! Classes with the same offering set are merged into groups `g` (exact). The bound is
//! computed from the dual, `max Σ D_{g,r} π_{g,r}` subject to
//! `Σ_r a_{o,r} max_{g∋o} π_{g,r} ≤ p_o` for every offering, solved with `microlp`; any
//! non-negative `π` scaled to satisfy those constraints is a valid bound (weak duality), so
//! the reported figure is certified by re-checking every offering's constraint, whatever
//! the solver's precision.
//!
//! LB_count, exactly as goals.md defines it: the largest group of pods that must sit on
//! distinct nodes (self-selecting required hostname anti-affinity) × the cheapest offering
//! that fits one of them. (Summing each member's cheapest fitting offering would also be a
//! valid bound, and a tighter one; the goals' figure is kept so that R compares.)

use std::collections::{BTreeMap, HashMap};

use crate::labels;
use crate::pod::Pod;
use crate::requirements::Requirements;
use crate::resources::{ResourceList, ResourceName};
use crate::taints::{self, Effect, Taint};

use super::input::{MinValuesPolicy, Snapshot};
use super::template::Template;
use super::view::PodView;

/// The lower bound of a set of pods, in $/hour.
#[derive(Clone, Debug, PartialEq)]
pub struct LowerBound {
    pub fluid: f64,
    pub count: f64,
    /// `max(fluid, count)`.
    pub value: f64,
    /// The price of the cheapest offering any of the pods can use.
    pub cheapest_offering: f64,
    /// Pods that no offering can take (left out of the bound).
    pub unplaceable: usize,
}

/// One offering column of the LP.
struct Column {
    price: f64,
    /// Allocatable per LP resource (after DaemonSet overhead), in LP units.
    alloc: Vec<f64>,
    /// Which groups may use it.
    members: Vec<bool>,
}

/// Scale of each resource in the LP (cores, GiB, counts), for numerical stability.
fn unit(r: &ResourceName) -> f64 {
    match r {
        ResourceName::Cpu => 1000.0,
        ResourceName::Memory | ResourceName::EphemeralStorage => (1u64 << 30) as f64,
        _ => 1.0,
    }
}

/// A pod class for the bound: identical requests and placement rules.
struct Class {
    requests: ResourceList,
    count: usize,
    /// Columns (index) the class can use, as a bitset key.
    columns: Vec<bool>,
}

fn tolerates(pool_taints: &[Taint], pod: &Pod) -> bool {
    // PreferNoSchedule taints can always be relaxed away.
    let hard: Vec<Taint> = pool_taints.iter().filter(|t| t.effect != Effect::PreferNoSchedule).cloned().collect();
    taints::tolerates_all(&hard, &pod.tolerations)
}

/// Computes the bound over `pods[which]`, assumed to need new capacity.
pub fn lower_bound(snapshot: &Snapshot, pods: &[Pod], which: &[usize]) -> LowerBound {
    let templates: Vec<Template<'_>> = snapshot
        .nodepools
        .iter()
        .enumerate()
        .filter_map(|(i, p)| Template::new(p, i, &snapshot.daemonsets, MinValuesPolicy::BestEffort).ok())
        .collect();

    // Offerings: (template, type, offering) with price and allocatable after daemons.
    struct Off<'t> {
        template: usize,
        it: usize,
        zone: &'t str,
        zone_id: &'t str,
        capacity_type: &'static str,
        price: f64,
        alloc: ResourceList,
    }
    let mut offs: Vec<Off<'_>> = Vec::new();
    for (ti, t) in templates.iter().enumerate() {
        for &i in &t.types {
            let it = &t.instance_types[i];
            let mut alloc = it.allocatable.clone();
            if let Some(g) = t.group_of[i] {
                alloc = alloc.subtracted(&t.daemon_groups[g].overhead);
            }
            for o in it.offerings.iter().filter(|o| o.available && o.compatible(&t.requirements)) {
                offs.push(Off {
                    template: ti,
                    it: i,
                    zone: &o.zone,
                    zone_id: &o.zone_id,
                    capacity_type: o.capacity_type.as_str(),
                    price: o.price,
                    alloc: alloc.clone(),
                });
            }
        }
    }

    // Classes of identical (requests, strict requirements, tolerations).
    type Key = (ResourceList, Requirements, crate::shared::Shared<Vec<crate::taints::Toleration>>);
    let mut by_key: HashMap<Key, usize> = HashMap::new();
    let mut classes: Vec<(Class, usize)> = Vec::new(); // (class, representative pod)
    let mut class_of: HashMap<usize, usize> = HashMap::new();
    for &p in which {
        let pod = &pods[p];
        let reqs = PodView::new(pod).requirements(false);
        let key = (pod.requests_with_pod_slot(), reqs, pod.tolerations.clone());
        let c = match by_key.get(&key) {
            Some(&c) => {
                classes[c].0.count += 1;
                c
            }
            None => {
                by_key.insert(key.clone(), classes.len());
                classes.push((Class { requests: key.0, count: 1, columns: Vec::new() }, p));
                classes.len() - 1
            }
        };
        class_of.insert(p, c);
    }
    let mut unplaceable = 0;
    for (class, rep) in &mut classes {
        let pod = &pods[*rep];
        let reqs = PodView::new(pod).requirements(false);
        let compat_templates: Vec<bool> = templates
            .iter()
            .map(|t| tolerates(&t.pool.taints, pod) && t.requirements.is_compatible(&reqs, true))
            .collect();
        class.columns = offs
            .iter()
            .map(|o| {
                compat_templates[o.template] && {
                    let it = &templates[o.template].instance_types[o.it];
                    it.requirements.intersects_ok(&reqs)
                        && reqs.get(labels::ZONE).has(o.zone)
                        && reqs.get(labels::ZONE_ID).has(o.zone_id)
                        && reqs.get(labels::CAPACITY_TYPE).has(o.capacity_type)
                        && class.requests.fits_in(&o.alloc)
                }
            })
            .collect();
        if !class.columns.iter().any(|c| *c) {
            unplaceable += class.count;
            class.count = 0;
        }
    }

    let cheapest_offering = offs
        .iter()
        .enumerate()
        .filter(|(i, _)| classes.iter().any(|(c, _)| c.count > 0 && c.columns[*i]))
        .map(|(_, o)| o.price)
        .fold(f64::INFINITY, f64::min);
    let count = count_bound(pods, which, &classes, &offs.iter().map(|o| o.price).collect::<Vec<_>>(), &class_of);

    // Resources demanded.
    let mut resources: Vec<ResourceName> = Vec::new();
    for (c, _) in classes.iter().filter(|(c, _)| c.count > 0) {
        for (r, v) in c.requests.iter() {
            if v > 0 && !resources.contains(r) {
                resources.push(r.clone());
            }
        }
    }
    // Groups of classes with identical offering sets.
    let mut groups: Vec<(Vec<bool>, Vec<f64>)> = Vec::new();
    for (c, _) in classes.iter().filter(|(c, _)| c.count > 0) {
        let demand: Vec<f64> = resources.iter().map(|r| c.requests.get(r) as f64 * c.count as f64 / unit(r)).collect();
        match groups.iter_mut().find(|(cols, _)| *cols == c.columns) {
            Some((_, d)) => d.iter_mut().zip(&demand).for_each(|(a, b)| *a += b),
            None => groups.push((c.columns.clone(), demand)),
        }
    }
    // Columns, merged when identical and pruned when dominated.
    let mut columns: BTreeMap<(u64, Vec<u64>, Vec<bool>), ()> = BTreeMap::new();
    for (i, o) in offs.iter().enumerate() {
        let members: Vec<bool> = groups.iter().map(|(cols, _)| cols[i]).collect();
        if !members.iter().any(|m| *m) {
            continue;
        }
        let alloc: Vec<u64> = resources.iter().map(|r| o.alloc.get(r).max(0) as u64).collect();
        columns.insert((o.price.to_bits(), alloc, members), ());
    }
    let mut cols: Vec<Column> = columns
        .into_keys()
        .map(|(p, a, m)| Column {
            price: f64::from_bits(p),
            alloc: a.iter().zip(&resources).map(|(v, r)| *v as f64 / unit(r)).collect(),
            members: m,
        })
        .collect();
    cols.sort_by(|a, b| a.price.total_cmp(&b.price));
    let all_cols: Vec<&Column> = cols.iter().collect();
    let kept: Vec<&Column> = all_cols
        .iter()
        .enumerate()
        .filter(|(i, c)| {
            !all_cols.iter().enumerate().any(|(j, d)| {
                j != *i
                    && d.price <= c.price
                    && d.alloc.iter().zip(&c.alloc).all(|(x, y)| x >= y)
                    && d.members.iter().zip(&c.members).all(|(x, y)| *x || !*y)
                    && (d.price < c.price || d.alloc != c.alloc || d.members != c.members || j < *i)
            })
        })
        .map(|(_, c)| *c)
        .collect();

    let pi = solve_dual(&groups, &kept, resources.len())
        .unwrap_or_else(|| per_resource_prices(&groups, &all_cols, resources.len()));
    let fluid = certify(&groups, &all_cols, &pi, resources.len());
    LowerBound {
        fluid,
        count,
        value: fluid.max(count),
        cheapest_offering: if cheapest_offering.is_finite() { cheapest_offering } else { 0.0 },
        unplaceable,
    }
}

/// Solves the dual LP; `None` when the solver fails (the caller then uses a weaker but
/// still valid price vector).
fn solve_dual(groups: &[(Vec<bool>, Vec<f64>)], cols: &[&Column], nres: usize) -> Option<Vec<Vec<f64>>> {
    use microlp::{ComparisonOp, OptimizationDirection, Problem};
    let mut p = Problem::new(OptimizationDirection::Maximize);
    let pi: Vec<Vec<microlp::Variable>> =
        groups.iter().map(|(_, d)| d.iter().map(|&dr| p.add_var(dr, (0.0, f64::INFINITY))).collect()).collect();
    for c in cols {
        let member_groups: Vec<usize> = (0..groups.len()).filter(|g| c.members[*g]).collect();
        if member_groups.len() == 1 {
            let g = member_groups[0];
            let expr: Vec<(microlp::Variable, f64)> =
                (0..nres).filter(|r| c.alloc[*r] > 0.0).map(|r| (pi[g][r], c.alloc[r])).collect();
            if !expr.is_empty() {
                p.add_constraint(expr.as_slice(), ComparisonOp::Le, c.price);
            }
            continue;
        }
        let mu: Vec<microlp::Variable> = (0..nres).map(|_| p.add_var(0.0, (0.0, f64::INFINITY))).collect();
        let expr: Vec<(microlp::Variable, f64)> =
            (0..nres).filter(|r| c.alloc[*r] > 0.0).map(|r| (mu[r], c.alloc[r])).collect();
        if !expr.is_empty() {
            p.add_constraint(expr.as_slice(), ComparisonOp::Le, c.price);
        }
        for &g in &member_groups {
            for r in 0..nres {
                p.add_constraint([(pi[g][r], 1.0), (mu[r], -1.0)].as_slice(), ComparisonOp::Le, 0.0);
            }
        }
    }
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| p.solve())).ok()?.ok()?;
    let sol = outcome.solution()?;
    Some(pi.iter().map(|row| row.iter().map(|v| sol.var_value(*v).max(0.0)).collect()).collect())
}

/// A valid fallback: each group prices only its most expensive-to-cover resource.
fn per_resource_prices(groups: &[(Vec<bool>, Vec<f64>)], cols: &[&Column], nres: usize) -> Vec<Vec<f64>> {
    groups
        .iter()
        .enumerate()
        .map(|(g, (_, d))| {
            let mut best = (0.0, vec![0.0; nres]);
            for r in 0..nres {
                let cost_per_unit = cols
                    .iter()
                    .filter(|c| c.members[g] && c.alloc[r] > 0.0)
                    .map(|c| c.price / c.alloc[r])
                    .fold(f64::INFINITY, f64::min);
                if cost_per_unit.is_finite() && d[r] * cost_per_unit > best.0 {
                    let mut v = vec![0.0; nres];
                    v[r] = cost_per_unit;
                    best = (d[r] * cost_per_unit, v);
                }
            }
            best.1
        })
        .collect()
}

/// Scales `pi` until every offering's dual constraint holds exactly and returns the bound.
fn certify(groups: &[(Vec<bool>, Vec<f64>)], cols: &[&Column], pi: &[Vec<f64>], nres: usize) -> f64 {
    let mut scale: f64 = 1.0;
    for c in cols {
        let used: f64 = (0..nres)
            .map(|r| {
                let mu = (0..groups.len()).filter(|g| c.members[*g]).map(|g| pi[g][r]).fold(0.0, f64::max);
                c.alloc[r] * mu
            })
            .sum();
        if used > c.price && used > 0.0 {
            scale = scale.min(c.price / used);
        }
    }
    // A hair below the exact scale absorbs rounding in the sums above.
    let scale = scale * (1.0 - 1e-9);
    groups.iter().zip(pi).map(|((_, d), p)| d.iter().zip(p).map(|(a, b)| a * b).sum::<f64>()).sum::<f64>() * scale
}

/// LB_count over the largest group of pods that must be on distinct nodes.
fn count_bound(
    pods: &[Pod],
    which: &[usize],
    classes: &[(Class, usize)],
    prices: &[f64],
    class_of: &HashMap<usize, usize>,
) -> f64 {
    // The cheapest offering that fits a pod of each class.
    let class_min: Vec<f64> = classes
        .iter()
        .map(|(c, _)| {
            c.columns.iter().zip(prices).filter(|(ok, _)| **ok).map(|(_, p)| *p).fold(f64::INFINITY, f64::min)
        })
        .collect();
    // Self-exclusive groups, keyed by kind, namespace and selector.
    let mut groups: BTreeMap<String, Vec<usize>> = BTreeMap::new();
    for &p in which {
        let pod = &pods[p];
        for t in &pod.pod_anti_affinity.required {
            if t.topology_key == labels::HOSTNAME
                && t.namespaces.is_empty()
                && t.namespace_selector.is_none()
                && let Some(sel) = &t.selector
                && sel.matches(&pod.labels)
            {
                groups.entry(format!("anti/{}/{:?}", pod.key.namespace, sel)).or_default().push(p);
            }
        }
    }
    groups
        .values()
        .map(|members| {
            let fits: Vec<f64> = members
                .iter()
                .filter_map(|p| class_of.get(p).map(|&c| class_min[c]))
                .filter(|v| v.is_finite())
                .collect();
            if fits.is_empty() { 0.0 } else { fits.len() as f64 * fits.iter().copied().fold(f64::INFINITY, f64::min) }
        })
        .fold(0.0, f64::max)
}

/// Dual prices of a single-group covering LP: `max Σ_r d_r π_r` subject to
/// `Σ_r a_{t,r} π_r ≤ p_t` for every column; what each unit of a resource is worth when
/// the cheapest mix of columns covers the demand. Guidance for the packer, not a bound.
pub(super) fn dual_prices(columns: &[(f64, Vec<f64>)], demand: &[f64]) -> Option<Vec<f64>> {
    let groups = vec![(vec![true; columns.len()], demand.to_vec())];
    let cols: Vec<Column> =
        columns.iter().map(|(p, a)| Column { price: *p, alloc: a.clone(), members: vec![true] }).collect();
    let refs: Vec<&Column> = cols.iter().collect();
    solve_dual(&groups, &refs, demand.len()).map(|mut v| v.remove(0))
}
