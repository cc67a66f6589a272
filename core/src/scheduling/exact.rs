//! The cheapest packing of a small set of pods, found exactly: a dynamic program over how
//! many pods of each class are left. Each step opens one node holding at least one pod of
//! the first class left (any node of a plan can be opened first, so this loses nothing and
//! visits each set of nodes once), priced by the caller as the plan would price it (the
//! cheapest launch of a right-sized claim). A state's best cost is computed once; a node
//! whose price plus a lower bound on the rest cannot beat the best found for its state is
//! not followed.
//!
//! Its size is known before it starts: with `n_k` pods of class `k` there are `Π (n_k + 1)`
//! states and as many distinct nodes to price, and the work is at most the sum over states
//! of their sub-multisets. [`solve`] refuses problems with more states than its caller
//! allows, so a large input costs nothing and never gets a wrong answer. The improve stage
//! uses it to re-pack the pods no topology rule ties down, and `plan` to report how far a
//! small plan is from the cheapest one.

/// What the program asks of its caller.
pub trait Pricing {
    /// The price of one node holding `pods` (per class) and the group (NodePool) it would
    /// belong to; `None` when no type of any group can take them together.
    fn price(&mut self, pods: &[u32]) -> Option<(f64, usize)>;
    /// A lower bound on the cost of placing `pods` (per class), however they are split.
    fn lower(&self, pods: &[u32]) -> f64;
}

/// One node of the answer.
#[derive(Clone, Debug, PartialEq)]
pub struct Node {
    pub group: usize,
    /// Pods per class.
    pub pods: Vec<u32>,
    pub price: f64,
}

/// The number of states of a problem with these class counts (saturating).
pub fn states(counts: &[u32]) -> usize {
    counts.iter().fold(1usize, |acc, &n| acc.saturating_mul(n as usize + 1))
}

/// The cheapest plan for `counts` pods per class: its cost and nodes. `None` when the
/// problem has more than `max_states` states or some pod fits no node.
pub fn solve(counts: &[u32], pricing: &mut dyn Pricing, max_states: usize) -> Option<(f64, Vec<Node>)> {
    let total = states(counts);
    if total > max_states || counts.is_empty() {
        return None;
    }
    let mut stride = vec![1usize; counts.len()];
    for k in 1..counts.len() {
        stride[k] = stride[k - 1] * (counts[k - 1] as usize + 1);
    }
    let mut dp = Dp {
        counts: counts.to_vec(),
        stride,
        best: vec![f64::NAN; total],
        choice: vec![usize::MAX; total],
        price: vec![f64::NAN; total],
        group: vec![usize::MAX; total],
        pricing,
    };
    let start = total - 1;
    let cost = dp.best(start);
    if !cost.is_finite() {
        return None;
    }
    let mut nodes = Vec::new();
    let mut s = start;
    while s != 0 {
        let c = dp.choice[s];
        if c == usize::MAX {
            return None;
        }
        nodes.push(Node { group: dp.group[c], pods: dp.decode(c), price: dp.price[c] });
        s -= c;
    }
    Some((cost, nodes))
}

struct Dp<'p> {
    counts: Vec<u32>,
    /// Mixed-radix place value of each class (radix `counts[k] + 1`).
    stride: Vec<usize>,
    /// Per state: the best cost (NaN: not computed; infinite: cannot be placed).
    best: Vec<f64>,
    /// Per state: the node opened first in its best plan.
    choice: Vec<usize>,
    /// Per node (a state's encoding): its price (NaN: not asked; infinite: impossible).
    price: Vec<f64>,
    group: Vec<usize>,
    pricing: &'p mut dyn Pricing,
}

impl Dp<'_> {
    fn decode(&self, s: usize) -> Vec<u32> {
        self.stride.iter().zip(&self.counts).map(|(st, n)| ((s / st) % (*n as usize + 1)) as u32).collect()
    }

    fn node_price(&mut self, c: usize) -> f64 {
        if self.price[c].is_nan() {
            let pods = self.decode(c);
            match self.pricing.price(&pods) {
                Some((p, g)) => {
                    self.price[c] = p;
                    self.group[c] = g;
                }
                None => self.price[c] = f64::INFINITY,
            }
        }
        self.price[c]
    }

    /// The best cost of placing state `s` (infinite when it cannot be).
    fn best(&mut self, s: usize) -> f64 {
        if s == 0 {
            return 0.0;
        }
        if !self.best[s].is_nan() {
            return self.best[s];
        }
        let have = self.decode(s);
        let Some(k0) = have.iter().position(|&n| n > 0) else { return 0.0 };
        // Every sub-multiset with at least one pod of class k0, largest counts first (good
        // plans early make the bound prune more).
        let mut c = have.clone();
        let mut best = f64::INFINITY;
        let mut choice = usize::MAX;
        loop {
            let code: usize = c.iter().zip(&self.stride).map(|(n, st)| *n as usize * st).sum();
            let price = self.node_price(code);
            if price.is_finite() {
                let rest = s - code;
                let rest_pods: Vec<u32> = have.iter().zip(&c).map(|(h, n)| h - n).collect();
                if price + self.pricing.lower(&rest_pods) < best - 1e-9 {
                    let tail = self.best(rest);
                    if price + tail < best - 1e-9 {
                        best = price + tail;
                        choice = code;
                    }
                }
            }
            // Next sub-multiset, counting down; class k0 changes slowest and stays >= 1.
            let mut k = have.len();
            loop {
                k -= 1;
                if k == k0 {
                    if c[k0] > 1 {
                        c[k0] -= 1;
                        break;
                    }
                    self.best[s] = best;
                    self.choice[s] = choice;
                    return best;
                }
                if c[k] > 0 {
                    c[k] -= 1;
                    break;
                }
                c[k] = have[k];
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two resources; a node is the cheapest of `kinds` (capacity, price) it fits.
    struct Kinds {
        kinds: Vec<([i64; 2], f64)>,
        demand: Vec<[i64; 2]>,
    }

    impl Pricing for Kinds {
        fn price(&mut self, pods: &[u32]) -> Option<(f64, usize)> {
            let used = (0..2).map(|d| pods.iter().zip(&self.demand).map(|(n, x)| *n as i64 * x[d]).sum::<i64>());
            let used: Vec<i64> = used.collect();
            self.kinds
                .iter()
                .filter(|(cap, _)| cap[0] >= used[0] && cap[1] >= used[1])
                .map(|(_, p)| *p)
                .min_by(f64::total_cmp)
                .map(|p| (p, 0))
        }
        fn lower(&self, _pods: &[u32]) -> f64 {
            0.0
        }
    }

    #[test]
    fn two_smaller_nodes_beat_one_large() {
        // Ten 1-cpu pods: 16 cpu for 0.612 against 8 + 4 cpu for 0.459 (the issue's
        // c6a.4xlarge against c6a.2xlarge + c6a.xlarge, less what kube-reserved takes).
        let mut k = Kinds {
            kinds: vec![([3_920, 100], 0.153), ([7_910, 100], 0.306), ([15_890, 100], 0.612)],
            demand: vec![[1_000, 1]],
        };
        let (cost, nodes) = solve(&[10], &mut k, 1_000).expect("small");
        assert!((cost - 0.459).abs() < 1e-9, "{cost} {nodes:?}");
        assert_eq!(nodes.iter().map(|n| n.pods[0]).sum::<u32>(), 10);
    }

    #[test]
    fn mixed_classes_and_the_size_limit() {
        // 5 × (3,1) and 6 × (1,3): an 8×8 node (1.8) holds two of each, a 4×4 node (1.0)
        // one of each. Three 8×8 nodes (2+2, 2+2, 1+2) cost 5.4; any plan with a 4×4 node
        // leaves a (5,7) or larger remainder that needs an 8×8 or two 4×4 more.
        let mut k = Kinds { kinds: vec![([4, 4], 1.0), ([8, 8], 1.8)], demand: vec![[3, 1], [1, 3]] };
        let (cost, nodes) = solve(&[5, 6], &mut k, 1_000).expect("small");
        assert!((cost - 5.4).abs() < 1e-9, "{cost} {nodes:?}");
        assert_eq!(states(&[5, 6]), 42);
        assert!(solve(&[5, 6], &mut k, 41).is_none(), "42 states are more than 41");
        // A pod that fits no node: no plan.
        let mut k = Kinds { kinds: vec![([4, 4], 1.0)], demand: vec![[5, 1]] };
        assert!(solve(&[1], &mut k, 10).is_none());
    }
}
