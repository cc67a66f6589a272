//! The packer's linear-programming view of a template: instance types as columns (price,
//! allocatable after DaemonSets, per-node cap slots), class demand vectors, dual prices that
//! value each resource, the assignment LP that splits classes over types, and the greedy
//! choice of the column worth the most per dollar.

use crate::resources::{ResourceList, ResourceName};
use crate::scheduling::bound::dual_prices;
use crate::scheduling::classes::{CapGroup, Class};
use crate::scheduling::scheduler::Scheduler;

/// LP units of a resource amount.
pub(super) fn unit(r: &ResourceName) -> f64 {
    match r {
        ResourceName::Cpu => 1000.0,
        ResourceName::Memory | ResourceName::EphemeralStorage => (1u64 << 30) as f64,
        _ => 1.0,
    }
}

/// A candidate instance type of a template, in vector form.
pub(super) struct TypeColumn {
    /// Index into the pool's instance types.
    pub(super) it: usize,
    pub(super) price: f64,
    /// Allocatable minus its DaemonSet group's overhead, per dimension (resources, then cap
    /// group slots).
    pub(super) alloc: Vec<f64>,
}

/// The state of the packer for one template.
pub(super) struct Packing<'c> {
    pub(super) dims: &'c [ResourceName],
    pub(super) caps: &'c [CapGroup],
    /// Per class: its demand vector (resources then slots).
    pub(super) demand: Vec<Vec<f64>>,
    /// Per class: value at the current dual prices.
    pub(super) value: Vec<f64>,
    /// Dual price of each dimension.
    pub(super) prices: Vec<f64>,
}

impl Packing<'_> {
    pub(super) fn vector(dims: &[ResourceName], caps: &[CapGroup], r: &ResourceList, class_caps: &[usize]) -> Vec<f64> {
        let mut v: Vec<f64> = dims.iter().map(|d| r.get(d) as f64 / unit(d)).collect();
        v.extend((0..caps.len()).map(|g| if class_caps.contains(&g) { 1.0 } else { 0.0 }));
        v
    }
}

impl Scheduler<'_> {
    /// The template's types as columns (price of the cheapest offering, allocatable after
    /// DaemonSets), without dominated ones.
    pub(super) fn type_columns(&self, t: usize, dims: &[ResourceName], caps: &[CapGroup]) -> Vec<TypeColumn> {
        let template = &self.templates[t];
        let mut cols: Vec<(TypeColumn, bool)> = template
            .types
            .iter()
            .filter_map(|&i| {
                let it = &template.instance_types[i];
                let price = it.cheapest_price(&template.requirements);
                if !price.is_finite() || price == f64::MAX {
                    return None;
                }
                let mut alloc = it.allocatable.clone();
                if let Some(g) = template.group_of[i] {
                    alloc = alloc.subtracted(&template.daemon_groups[g].overhead);
                }
                if alloc.iter().any(|(_, v)| v < 0) {
                    return None;
                }
                let mut v: Vec<f64> = dims.iter().map(|d| alloc.get(d) as f64 / unit(d)).collect();
                v.extend(caps.iter().map(|c| c.cap as f64));
                Some((TypeColumn { it: i, price, alloc: v }, it.exotic))
            })
            .collect();
        cols.sort_by(|a, b| a.0.price.total_cmp(&b.0.price).then_with(|| a.0.it.cmp(&b.0.it)));
        let keep: Vec<bool> = (0..cols.len())
            .map(|i| {
                let (c, c_exotic) = (&cols[i].0, cols[i].1);
                !cols.iter().enumerate().any(|(j, (d, d_exotic))| {
                    j != i
                        && d.price <= c.price
                        && (!d_exotic || c_exotic)
                        && d.alloc.iter().zip(&c.alloc).all(|(x, y)| x >= y)
                        && (d.price < c.price || d.alloc != c.alloc || d_exotic != &c_exotic || j < i)
                })
            })
            .collect();
        cols.into_iter().zip(keep).filter(|(_, k)| *k).map(|((c, _), _)| c).collect()
    }

    /// Recomputes class values from dual prices over the remaining demand.
    pub(super) fn reprice(
        &self,
        packing: &mut Packing<'_>,
        members: &[usize],
        classes: &[Class],
        columns: &[TypeColumn],
    ) {
        let n = packing.dims.len() + packing.caps.len();
        let mut demand = vec![0.0; n];
        for (m, &c) in members.iter().enumerate() {
            let left = classes[c].remaining() as f64;
            for (d, v) in demand.iter_mut().zip(&packing.demand[m]) {
                *d += left * v;
            }
        }
        let cols: Vec<(f64, Vec<f64>)> = columns.iter().map(|c| (c.price, c.alloc.clone())).collect();
        let prices = dual_prices(&cols, &demand).unwrap_or_else(|| {
            // Without an LP answer, price each resource at the cheapest rate any type sells it.
            (0..n)
                .map(|r| cols.iter().filter(|(_, a)| a[r] > 0.0).map(|(p, a)| p / a[r]).fold(f64::INFINITY, f64::min))
                .map(|v| if v.is_finite() { v / n as f64 } else { 0.0 })
                .collect()
        });
        for m in 0..members.len() {
            packing.value[m] = packing.demand[m].iter().zip(&prices).map(|(a, b)| a * b).sum::<f64>().max(1e-12);
        }
        packing.prices = prices;
    }
}

/// Integer quotas `q[member][column]` from the assignment LP:
///
/// ```text
/// min Σ_t p_t y_t   s.t.  Σ_k d_{k,r} x_{k,t} ≤ a_{t,r} y_t   ∀ t, r
///                         Σ_t x_{k,t} = n_k                 ∀ k       x, y ≥ 0
/// ```
///
/// over classes merged by demand and usable types (`x_{k,t}` only where class `k` may use
/// type `t`); fractional counts are rounded by largest remainder.
pub(super) fn quotas(
    columns: &[&TypeColumn],
    members: &[usize],
    classes: &[Class],
    packing: &Packing<'_>,
    compat: &[Vec<bool>],
) -> Option<(Vec<Vec<usize>>, Vec<f64>)> {
    use microlp::{ComparisonOp, OptimizationDirection, Problem};
    // Each LP dimension: a resource, or a cap group with pods here. (Merging cap groups,
    // which would shrink the LP, was measured to cost 3-5% in R on the benchmark mix.)
    let nres = packing.dims.len();
    let mut lp_dims: Vec<Vec<usize>> = (0..nres).map(|r| vec![r]).collect();
    for (g, _) in packing.caps.iter().enumerate() {
        if members.iter().any(|&c| classes[c].remaining() > 0 && classes[c].caps.contains(&g)) {
            lp_dims.push(vec![nres + g]);
        }
    }
    let lp_demand =
        |m: usize| -> Vec<f64> { lp_dims.iter().map(|set| set.iter().map(|&r| packing.demand[m][r]).sum()).collect() };
    // Merge classes with the same LP demand and usable types. Capped classes (a per-node
    // cap spreads them anyway) merge by cap group and by memory per core, at their average
    // demand: a much smaller LP (3 ms instead of 11 on the 1k mix) for the same R.
    let mut lp_classes: Vec<(Vec<u64>, &Vec<bool>, Vec<usize>)> = Vec::new();
    let mut sums: Vec<(Vec<f64>, f64)> = Vec::new();
    for (m, &c) in members.iter().enumerate() {
        let n = classes[c].remaining();
        if n == 0 {
            continue;
        }
        let demand = lp_demand(m);
        let capped = !classes[c].caps.is_empty();
        let mut key: Vec<u64> =
            demand.iter().enumerate().map(|(j, v)| if capped && j < nres { 0 } else { v.to_bits() }).collect();
        if capped {
            // Memory per core, bucketed as compute, general and memory-optimised types
            // offer it (2, 4, 8 GiB per core).
            let cpu = packing.dims.iter().position(|d| *d == ResourceName::Cpu).map_or(0.0, |i| demand[i]);
            let mem = packing.dims.iter().position(|d| *d == ResourceName::Memory).map_or(0.0, |i| demand[i]);
            let per_core = mem / cpu.max(1e-9);
            key.push(if per_core <= 3.0 {
                0
            } else if per_core <= 6.0 {
                1
            } else {
                2
            });
        }
        match lp_classes.iter().position(|(k, cp, _)| *k == key && **cp == compat[m]) {
            Some(i) => {
                lp_classes[i].2.push(m);
                for (s, d) in sums[i].0.iter_mut().zip(&demand) {
                    *s += d * n as f64;
                }
                sums[i].1 += n as f64;
            }
            None => {
                lp_classes.push((key, &compat[m], vec![m]));
                sums.push((demand.iter().map(|d| d * n as f64).collect(), n as f64));
            }
        }
    }
    let lp_class_demand: Vec<Vec<f64>> = sums.iter().map(|(s, n)| s.iter().map(|v| v / n.max(1.0)).collect()).collect();
    if lp_classes.is_empty() {
        return None;
    }
    let mut p = Problem::new(OptimizationDirection::Minimize);
    let y: Vec<microlp::Variable> = columns.iter().map(|c| p.add_var(c.price, (0.0, f64::INFINITY))).collect();
    let mut x: Vec<Vec<Option<microlp::Variable>>> = Vec::new();
    for (_, cp, _) in &lp_classes {
        x.push((0..columns.len()).map(|t| cp[t].then(|| p.add_var(0.0, (0.0, f64::INFINITY)))).collect());
    }
    for (t, col) in columns.iter().enumerate() {
        for (j, set) in lp_dims.iter().enumerate() {
            let mut expr: Vec<(microlp::Variable, f64)> = Vec::new();
            for k in 0..lp_classes.len() {
                let d = lp_class_demand[k][j];
                if let Some(v) = x[k][t]
                    && d > 0.0
                {
                    expr.push((v, d));
                }
            }
            if !expr.is_empty() {
                expr.push((y[t], -set.iter().map(|&r| col.alloc[r]).sum::<f64>()));
                p.add_constraint(expr.as_slice(), ComparisonOp::Le, 0.0);
            }
        }
    }
    for (k, (_, _, ms)) in lp_classes.iter().enumerate() {
        let n: usize = ms.iter().map(|&m| classes[members[m]].remaining()).sum();
        let expr: Vec<(microlp::Variable, f64)> = x[k].iter().flatten().map(|v| (*v, 1.0)).collect();
        if expr.is_empty() {
            return None;
        }
        p.add_constraint(expr.as_slice(), ComparisonOp::Ge, n as f64);
    }
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| p.solve())).ok()?.ok()?;
    let sol = outcome.solution()?;
    let mut quota = vec![vec![0usize; columns.len()]; members.len()];
    for (k, (_, _, ms)) in lp_classes.iter().enumerate() {
        let n: usize = ms.iter().map(|&m| classes[members[m]].remaining()).sum();
        // Largest remainder rounding of the class's split over types.
        let frac: Vec<(usize, f64)> =
            (0..columns.len()).filter_map(|t| x[k][t].map(|v| (t, sol.var_value(v).max(0.0)))).collect();
        let mut counts: Vec<(usize, usize, f64)> =
            frac.iter().map(|&(t, v)| (t, v.floor() as usize, v - v.floor())).collect();
        let mut assigned: usize = counts.iter().map(|c| c.1).sum();
        counts.sort_by(|a, b| b.2.total_cmp(&a.2).then(a.0.cmp(&b.0)));
        let len = counts.len();
        let mut i = 0;
        while assigned < n && len > 0 {
            counts[i % len].1 += 1;
            assigned += 1;
            i += 1;
        }
        while assigned > n {
            if let Some(c) = counts.iter_mut().rev().find(|c| c.1 > 0) {
                c.1 -= 1;
            }
            assigned -= 1;
        }
        // Hand each member class a share of every type in proportion to its size (member
        // classes may be in different cap groups, which must spread alike): cumulative
        // rounding keeps every type's total exact.
        let mut per_type: Vec<(usize, usize)> = counts.iter().map(|c| (c.0, c.1)).filter(|c| c.1 > 0).collect();
        per_type.sort();
        let mut before = 0usize;
        for &m in ms {
            let after = before + classes[members[m]].remaining();
            for &(t, cnt) in &per_type {
                quota[m][t] += cnt * after / n.max(1) - cnt * before / n.max(1);
            }
            before = after;
        }
    }
    let ys: Vec<f64> = y.iter().map(|v| sol.var_value(*v).max(0.0)).collect();
    Some((quota, ys))
}

/// Picks the column whose estimated fill is worth the most per dollar. Returns it, the
/// estimated value, and the fill order (capped classes first, then by value density).
pub(super) fn best_column(
    columns: &[TypeColumn],
    allowed: &[usize],
    live: &[usize],
    packing: &Packing<'_>,
    classes: &[Class],
    members: &[usize],
    compat: &[Vec<bool>],
) -> Option<(usize, f64, Vec<usize>)> {
    let mut best: Option<(f64, usize, f64, Vec<usize>)> = None;
    for &ci in allowed {
        let col = &columns[ci];
        let mut order: Vec<(bool, f64, usize)> = live
            .iter()
            .filter(|&&m| compat[m][ci])
            .map(|&m| {
                let size: f64 = packing.demand[m]
                    .iter()
                    .zip(&col.alloc)
                    .filter(|(_, a)| **a > 0.0)
                    .map(|(d, a)| d / a)
                    .sum::<f64>()
                    .max(1e-12);
                (classes[members[m]].caps.is_empty(), -(packing.value[m] / size), m)
            })
            .collect();
        if order.is_empty() {
            continue;
        }
        order.sort_by(|a, b| a.0.cmp(&b.0).then(a.1.total_cmp(&b.1)).then(a.2.cmp(&b.2)));
        let mut left = col.alloc.clone();
        let mut value = 0.0;
        for &(_, _, m) in &order {
            let d = &packing.demand[m];
            let mut n = classes[members[m]].remaining() as f64;
            for (need, have) in d.iter().zip(&left) {
                if *need > 0.0 {
                    n = n.min((have / need + 1e-9).floor());
                }
            }
            if n >= 1.0 {
                for (h, need) in left.iter_mut().zip(d) {
                    *h -= n * need;
                }
                value += n * packing.value[m];
            }
        }
        let efficiency = value / col.price;
        if value > 0.0
            && best.as_ref().is_none_or(|(e, _, v, _)| {
                efficiency > *e * (1.0 + 1e-9) || (efficiency >= *e * (1.0 - 1e-9) && value > *v)
            })
        {
            best = Some((efficiency, ci, value, order.into_iter().map(|(_, _, m)| m).collect()));
        }
    }
    best.map(|(_, ci, value, order)| (ci, value, order))
}
