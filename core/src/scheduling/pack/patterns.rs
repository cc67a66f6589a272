//! Large pods: classes of which at most [`LARGE_COPIES`] pods fit the node type that holds
//! them most cheaply (and that no zone-keyed topology rule counts) are packed by patterns (how many pods of each class one node of a type holds), the cutting-stock way.
//! The assignment LP of `round` treats pods as fluid, which is exact enough when hundreds
//! fit a node and poor when one to three do: its rounding then strands a node's worth of
//! room per class.
//!
//! Column generation finds the patterns: the covering LP `min Σ price_j x_j` subject to
//! `Σ_j a_kj x_j ≥ n_k` over the patterns found so far, solved through its dual (the prices
//! `π_k` a pod of each class is worth); for every node type, the pattern worth the most at
//! those prices (a small knapsack: a node holds a few large pods) joins the LP while it is
//! worth more than the node costs. The LP's pattern counts are rounded down and opened; the
//! remainder is solved once more and its counts rounded up, largest fractions first, until
//! it is covered. Every pod still goes through the packer's checks when placed.

use microlp::{ComparisonOp, OptimizationDirection, Problem};

use crate::scheduling::classes::Class;
use crate::scheduling::scheduler::Scheduler;

use super::Ctx;

/// A class is large when at most this many of its pods fit the type that holds them most
/// cheaply (price per pod).
pub const LARGE_COPIES: usize = 8;
/// Patterns are generated for at most this many large classes (a trace with a hundred kinds
/// of 1-GPU pods is left to the assignment LP: generation would cost more than it saves).
const MAX_CLASSES: usize = 32;
/// Rounds of pattern generation per LP.
const GENERATIONS: usize = 60;
/// Patterns added per round (the most valuable per dollar).
const NEW_PER_GENERATION: usize = 8;
/// Search nodes one knapsack may visit: with many large classes (a trace's 1-GPU pods) the
/// search keeps the best pattern found within it, and the LP then stops a little short of
/// its optimum rather than taking long.
const KNAPSACK_NODES: usize = 4_000;

/// A node type holding so many pods of each (large) member class.
#[derive(Clone, Debug, PartialEq)]
struct Pattern {
    /// Its column.
    col: usize,
    /// Pods per large member (indexed like the problem's members).
    pods: Vec<u32>,
}

/// How many pods of a demand vector fit an allocation vector.
fn copies(demand: &[f64], alloc: &[f64]) -> usize {
    let mut n = usize::MAX;
    for (d, a) in demand.iter().zip(alloc) {
        if *d > 0.0 {
            n = n.min(((a + 1e-9) / d).floor().max(0.0) as usize);
        }
    }
    if n == usize::MAX { 0 } else { n }
}

impl Scheduler<'_> {
    /// Packs the template's large classes by patterns; the rest is left to the later phases.
    /// Returns whether it placed any pod.
    pub(super) fn pack_patterns(&mut self, ctx: &Ctx<'_>, classes: &mut [Class]) -> bool {
        let cols: Vec<usize> =
            (0..ctx.columns.len()).filter(|&j| self.within_limits(ctx.t, ctx.columns[j].it)).collect();
        // A class is large when few of its pods fit the type that holds them most cheaply, by
        // resources (a per-node cap of its hostname anti-affinity or spread does not make a
        // small pod large).
        let nres = ctx.packing.dims.len();
        let large: Vec<usize> = (0..ctx.members.len())
            .filter(|&m| {
                let c = &classes[ctx.members[m]];
                if c.remaining() == 0 || c.zonal_spread || c.zonal_affinity {
                    return false;
                }
                let demand = &ctx.packing.demand[m][..nres];
                let best = cols
                    .iter()
                    .filter(|&&j| ctx.compat[m][j])
                    .map(|&j| (copies(demand, &ctx.columns[j].alloc[..nres]), ctx.columns[j].price))
                    .filter(|(n, _)| *n > 0)
                    .min_by(|a, b| (a.1 / a.0 as f64).total_cmp(&(b.1 / b.0 as f64)));
                best.is_some_and(|(n, _)| n <= LARGE_COPIES)
                    && !self.topology.counted_beyond_hostname(&self.pods[c.pods[0]])
            })
            .collect();
        if large.is_empty() || large.len() > MAX_CLASSES {
            return false;
        }
        let mut opened: Vec<(usize, Vec<f64>)> = Vec::new();
        for last in [false, true] {
            let counts: Vec<u32> = large.iter().map(|&m| classes[ctx.members[m]].remaining() as u32).collect();
            if counts.iter().all(|&n| n == 0) {
                break;
            }
            let Some((patterns, x)) = generate(ctx, &large, &counts, &cols) else { break };
            let before = opened.len();
            for (p, n) in round_counts(&patterns, &x, &counts, last) {
                for _ in 0..n {
                    if let Some(bin) = self.open_pattern(ctx, &large, &patterns[p], classes) {
                        opened.push(bin);
                    }
                }
            }
            if opened.len() == before {
                break;
            }
        }
        let placed = !opened.is_empty();
        // The room the large pods leave is paid for: the other classes fill it first (not the
        // pods zone-keyed topology counts: these claims are not pinned to a zone).
        let small: Vec<usize> = (0..ctx.members.len())
            .filter(|m| !large.contains(m))
            .filter(|&m| !self.topology.counted_beyond_hostname(&self.pods[classes[ctx.members[m]].pods[0]]))
            .collect();
        for (c, mut left) in opened {
            let placeholder = self.new_planned(ctx.t, Vec::new());
            let mut bin = std::mem::replace(&mut self.planned[c], placeholder);
            for &m in &small {
                while classes[ctx.members[m]].remaining() > 0 && self.try_one(ctx, &mut bin, &mut left, m, classes) {}
            }
            self.planned[c] = bin;
        }
        placed
    }

    /// Opens one claim of the pattern's type and places its pods; its index among the
    /// planned claims and the room it has left, `None` when it took none.
    fn open_pattern(
        &mut self,
        ctx: &Ctx<'_>,
        large: &[usize],
        pattern: &Pattern,
        classes: &mut [Class],
    ) -> Option<(usize, Vec<f64>)> {
        let col = &ctx.columns[pattern.col];
        if !self.within_limits(ctx.t, col.it) {
            return None;
        }
        let mut bin = self.new_packed(ctx.t, col.it);
        self.next_hostname += 1;
        let mut left = col.alloc.clone();
        for (i, &n) in pattern.pods.iter().enumerate() {
            for _ in 0..n {
                if !self.try_one(ctx, &mut bin, &mut left, large[i], classes) {
                    break;
                }
            }
        }
        if bin.pods.is_empty() {
            return None;
        }
        self.subtract_limits(ctx.t, &bin);
        bin.right_size = true;
        self.planned.push(bin);
        Some((self.planned.len() - 1, left))
    }
}

/// Column generation over the large members: the patterns found and the LP's count of each.
fn generate(ctx: &Ctx<'_>, large: &[usize], counts: &[u32], cols: &[usize]) -> Option<(Vec<Pattern>, Vec<f64>)> {
    // Start from one-class patterns: every class is covered.
    let mut patterns: Vec<Pattern> = Vec::new();
    for (i, &m) in large.iter().enumerate() {
        if counts[i] == 0 {
            continue;
        }
        for &j in cols.iter().filter(|&&j| ctx.compat[m][j]) {
            let n = copies(&ctx.packing.demand[m], &ctx.columns[j].alloc).min(counts[i] as usize);
            if n > 0 {
                let mut pods = vec![0u32; large.len()];
                pods[i] = n as u32;
                patterns.push(Pattern { col: j, pods });
            }
        }
    }
    if patterns.is_empty() {
        return None;
    }
    let (mut sol, pi) = dual(ctx, &patterns, counts)?;
    let mut last_bound = sol.objective();
    let mut stalled = 0;
    for _ in 0..GENERATIONS {
        let duals: Vec<f64> = pi.iter().map(|v| sol.var_value(*v).max(0.0)).collect();
        // The patterns worth more than their node costs, the best (per dollar) first.
        let mut found: Vec<(f64, Pattern)> = Vec::new();
        for &j in cols {
            let (value, pods) = knapsack(ctx, large, counts, &duals, j);
            let price = ctx.columns[j].price;
            if value > price * (1.0 + 1e-6) + 1e-9 {
                let p = Pattern { col: j, pods };
                if !patterns.contains(&p) {
                    found.push((value / price, p));
                }
            }
        }
        if found.is_empty() {
            break;
        }
        found.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.col.cmp(&b.1.col)));
        for (_, p) in found.into_iter().take(NEW_PER_GENERATION) {
            let expr: Vec<(microlp::Variable, f64)> =
                p.pods.iter().enumerate().filter(|(_, n)| **n > 0).map(|(i, n)| (pi[i], *n as f64)).collect();
            let price = ctx.columns[p.col].price;
            let next = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || {
                sol.add_constraint(expr.as_slice(), ComparisonOp::Le, price)
            }))
            .ok()?
            .ok()?;
            sol = next.into_solution().ok()?;
            patterns.push(p);
        }
        // Stop once the bound has barely moved for a few generations (the tail of column
        // generation improves the LP, not the rounded plan).
        let bound = sol.objective();
        if last_bound - bound < 1e-4 * last_bound.abs().max(1e-9) {
            stalled += 1;
            if stalled >= 3 {
                break;
            }
        } else {
            stalled = 0;
        }
        last_bound = bound;
    }
    let x = primal(ctx, &patterns, counts)?;
    Some((patterns, x))
}

/// The covering LP's dual over `patterns` (what a pod of each class is worth), solved, with
/// its variables: a new pattern is a new row of it.
fn dual(ctx: &Ctx<'_>, patterns: &[Pattern], counts: &[u32]) -> Option<(microlp::Solution, Vec<microlp::Variable>)> {
    let mut p = Problem::new(OptimizationDirection::Maximize);
    let pi: Vec<microlp::Variable> = counts.iter().map(|&n| p.add_var(n as f64, (0.0, f64::INFINITY))).collect();
    for pat in patterns {
        let expr: Vec<(microlp::Variable, f64)> =
            pat.pods.iter().enumerate().filter(|(_, n)| **n > 0).map(|(i, n)| (pi[i], *n as f64)).collect();
        p.add_constraint(expr.as_slice(), ComparisonOp::Le, ctx.columns[pat.col].price);
    }
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| p.solve())).ok()?.ok()?;
    Some((outcome.into_solution().ok()?, pi))
}

/// The covering LP itself: how many nodes of each pattern.
fn primal(ctx: &Ctx<'_>, patterns: &[Pattern], counts: &[u32]) -> Option<Vec<f64>> {
    let mut p = Problem::new(OptimizationDirection::Minimize);
    let x: Vec<microlp::Variable> =
        patterns.iter().map(|pat| p.add_var(ctx.columns[pat.col].price, (0.0, f64::INFINITY))).collect();
    for (i, &n) in counts.iter().enumerate() {
        if n == 0 {
            continue;
        }
        let expr: Vec<(microlp::Variable, f64)> = patterns
            .iter()
            .zip(&x)
            .filter(|(pat, _)| pat.pods[i] > 0)
            .map(|(pat, v)| (*v, pat.pods[i] as f64))
            .collect();
        p.add_constraint(expr.as_slice(), ComparisonOp::Ge, n as f64);
    }
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| p.solve())).ok()?.ok()?;
    let sol = outcome.solution()?;
    Some(x.iter().map(|v| sol.var_value(*v).max(0.0)).collect())
}

/// The pattern of column `j` worth the most at the dual prices: how many pods of each large
/// member (no more than are left) one node holds, by depth-first search with a bound.
fn knapsack(ctx: &Ctx<'_>, large: &[usize], counts: &[u32], duals: &[f64], j: usize) -> (f64, Vec<u32>) {
    let alloc = &ctx.columns[j].alloc;
    // Items worth something that fit, best value per share of the node first.
    let mut items: Vec<(usize, f64)> = (0..large.len())
        .filter(|&i| counts[i] > 0 && duals[i] > 1e-12 && ctx.compat[large[i]][j])
        .filter(|&i| copies(&ctx.packing.demand[large[i]], alloc) > 0)
        .map(|i| {
            let share = ctx.packing.demand[large[i]]
                .iter()
                .zip(alloc)
                .filter(|(_, a)| **a > 0.0)
                .map(|(d, a)| d / a)
                .fold(0.0, f64::max)
                .max(1e-12);
            (i, duals[i] / share)
        })
        .collect();
    items.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    let order: Vec<usize> = items.iter().map(|(i, _)| *i).collect();
    let mut best = (0.0, vec![0u32; large.len()]);
    let mut current = vec![0u32; large.len()];
    let mut left = alloc.clone();
    let mut visits = 0usize;
    // Per suffix of `order`, per dimension: the best value per unit any item left has, and
    // whether any item left uses the dimension (the bound reads only those).
    let dims = alloc.len();
    let mut rates = vec![vec![0.0f64; dims]; order.len() + 1];
    let mut used = vec![vec![false; dims]; order.len() + 1];
    for k in (0..order.len()).rev() {
        let i = order[k];
        let demand = &ctx.packing.demand[large[i]];
        for d in 0..dims {
            let own = if demand[d] > 0.0 { duals[i] / demand[d] } else { 0.0 };
            rates[k][d] = rates[k + 1][d].max(own);
            used[k][d] = used[k + 1][d] || demand[d] > 0.0;
        }
    }
    let mut s = Search { ctx, large, counts, duals, order: &order, visits: &mut visits, rates: &rates, used: &used };
    s.run(0, 0.0, &mut left, &mut current, &mut best);
    best
}

/// The knapsack's depth-first search over `order`.
struct Search<'a, 'c> {
    ctx: &'a Ctx<'c>,
    large: &'a [usize],
    counts: &'a [u32],
    duals: &'a [f64],
    order: &'a [usize],
    visits: &'a mut usize,
    /// Per suffix, per dimension: the best value per unit left.
    rates: &'a [Vec<f64>],
    /// Per suffix, per dimension: whether an item left uses it.
    used: &'a [Vec<bool>],
}

impl Search<'_, '_> {
    /// Depth-first over `order[k..]`; `value` is what `current` is worth.
    fn run(&mut self, k: usize, value: f64, left: &mut Vec<f64>, current: &mut Vec<u32>, best: &mut (f64, Vec<u32>)) {
        *self.visits += 1;
        if value > best.0 + 1e-12 {
            *best = (value, current.clone());
        }
        if k == self.order.len() || *self.visits > KNAPSACK_NODES {
            return;
        }
        let demand_of = |i: usize| &self.ctx.packing.demand[self.large[i]];
        // Bound: whatever is left, filled with the best value per unit of each dimension.
        let mut bound = f64::INFINITY;
        for (d, l) in left.iter().enumerate() {
            if self.used[k][d] {
                bound = bound.min(l.max(0.0) * self.rates[k][d]);
            }
        }
        if value + bound <= best.0 + 1e-12 {
            return;
        }
        let i = self.order[k];
        let demand = demand_of(i).clone();
        let most = copies(&demand, left).min(self.counts[i] as usize);
        for n in (0..=most).rev() {
            for (l, d) in left.iter_mut().zip(&demand) {
                *l -= n as f64 * d;
            }
            current[i] = n as u32;
            self.run(k + 1, value + n as f64 * self.duals[i], left, current, best);
            for (l, d) in left.iter_mut().zip(&demand) {
                *l += n as f64 * d;
            }
        }
        current[i] = 0;
    }
}

/// How many nodes of each pattern to open: the LP's counts rounded down, or (`last`) rounded
/// up, largest fractions first, while some class's pods are not yet covered.
fn round_counts(patterns: &[Pattern], x: &[f64], counts: &[u32], last: bool) -> Vec<(usize, usize)> {
    let mut out: Vec<(usize, usize)> =
        x.iter().enumerate().map(|(p, v)| (p, (v + 1e-6).floor() as usize)).filter(|(_, n)| *n > 0).collect();
    if !last {
        return out;
    }
    let mut covered = vec![0u64; counts.len()];
    for &(p, n) in &out {
        for (c, k) in covered.iter_mut().zip(&patterns[p].pods) {
            *c += n as u64 * *k as u64;
        }
    }
    let mut fractions: Vec<(f64, usize)> =
        x.iter().enumerate().map(|(p, v)| (v - (v + 1e-6).floor(), p)).filter(|(f, _)| *f > 1e-6).collect();
    fractions.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
    for (_, p) in fractions {
        let short = covered.iter().zip(counts).any(|(c, n)| *c < *n as u64);
        if !short {
            break;
        }
        // Only a pattern that covers a class still short is worth opening.
        if !patterns[p].pods.iter().zip(covered.iter().zip(counts)).any(|(k, (c, n))| *k > 0 && c < &(*n as u64)) {
            continue;
        }
        for (c, k) in covered.iter_mut().zip(&patterns[p].pods) {
            *c += *k as u64;
        }
        match out.iter_mut().find(|(q, _)| *q == p) {
            Some((_, n)) => *n += 1,
            None => out.push((p, 1)),
        }
    }
    out
}
