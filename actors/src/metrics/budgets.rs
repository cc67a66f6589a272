//! Karpenter's disruption budget gauges, per NodePool and reason:
//! `karpenter_nodepools_allowed_disruptions` (what the active budgets allow disrupting at once,
//! before taking off the nodes disrupting already; 2147483647 when no budget covers the reason)
//! and `karpenter_nodepools_nodes_consuming_budgets` (those nodes: leased to a command,
//! terminating, or not Ready).
//!
//! Set by the NodePool actor at each disruption round from the ledger's own count
//! ([`dovetail_core::ledger::State::allowance`], the numbers the ledger grants leases by).
//! Only the leader runs rounds: a pool's series are removed when its actor stops leading, is
//! retired or stops, and all of them when a term's actors are dropped, so a follower serves
//! none and a deleted pool leaves none behind.
//!
//! Two differences from Karpenter's: a pool with a rate budget (`dovetail.dev/disruption-rate`,
//! dovetail's, with no Karpenter series) may be held by it below what these say; and the nodes
//! a percentage is taken of include the terminating ones whose instance still runs (Karpenter
//! leaves those out, so its percentages can come out lower).

use std::collections::BTreeMap;

use dovetail_core::ledger::Allowance;
use dovetail_core::nodepool::DisruptionReason;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use super::Labels;

/// The two budget gauge families.
#[derive(Clone, Debug, Default)]
pub struct BudgetGauges {
    allowed: Family<Labels, Gauge>,
    consuming: Family<Labels, Gauge>,
}

/// Karpenter's labels: the pool, and the reason as budgets name it (`Underutilized`).
fn labels(nodepool: &str, reason: DisruptionReason) -> Labels {
    vec![("nodepool", nodepool.to_string()), ("reason", reason.as_str().to_string())]
}

impl BudgetGauges {
    pub(super) fn register(&self, r: &mut Registry) {
        r.register(
            "karpenter_nodepools_allowed_disruptions",
            "The number of nodes of the nodepool its active disruption budgets allow disrupting at once for the reason (before taking off those disrupting already)",
            self.allowed.clone(),
        );
        r.register(
            "karpenter_nodepools_nodes_consuming_budgets",
            "The number of nodes of the nodepool counted against its disruption budgets for the reason: leased to a command, terminating, or not Ready",
            self.consuming.clone(),
        );
    }

    /// What the ledger counted for `nodepool` and `reason` this round.
    pub fn set(&self, nodepool: &str, reason: DisruptionReason, a: &Allowance) {
        let l = labels(nodepool, reason);
        self.allowed.get_or_create(&l).set(i64::from(a.allowed));
        self.consuming.get_or_create(&l).set(i64::from(a.disrupting));
    }

    /// `nodepool`'s series as the ledger counted them this round: each reason it counted set
    /// in place (never removed and made again, which a scrape in between would see as a gap),
    /// the others removed.
    pub fn update(&self, nodepool: &str, allowances: &BTreeMap<DisruptionReason, Allowance>) {
        for reason in DisruptionReason::ALL {
            match allowances.get(&reason) {
                Some(a) => self.set(nodepool, reason, a),
                None => {
                    let l = labels(nodepool, reason);
                    self.allowed.remove(&l);
                    self.consuming.remove(&l);
                }
            }
        }
    }

    /// Removes every pool's series (the control node's acting actors are gone).
    pub fn clear(&self) {
        self.allowed.clear();
        self.consuming.clear();
    }

    /// Removes `nodepool`'s series (it no longer leads, or is gone).
    pub fn forget(&self, nodepool: &str) {
        for reason in DisruptionReason::ALL {
            let l = labels(nodepool, reason);
            self.allowed.remove(&l);
            self.consuming.remove(&l);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::{Metrics, sum_of};

    fn allowance(allowed: u32, disrupting: u32) -> Allowance {
        Allowance { nodes: 10, disrupting, allowed, rate_left: None }
    }

    #[test]
    fn a_round_sets_the_reasons_counted_and_removes_the_others_and_forget_and_clear_remove_a_pools() {
        let m = Metrics::new();
        let both =
            BTreeMap::from([(DisruptionReason::Empty, allowance(3, 1)), (DisruptionReason::Drifted, allowance(0, 1))]);
        m.budgets.update("a", &both);
        m.budgets.update("b", &both);
        let text = m.encode();
        let at = |text: &str, series: &str, pool: &str, reason: &str| {
            sum_of(text, series, &[("nodepool", pool), ("reason", reason)])
        };
        assert_eq!(at(&text, "karpenter_nodepools_allowed_disruptions", "a", "Empty"), 3.0, "{text}");
        assert_eq!(at(&text, "karpenter_nodepools_nodes_consuming_budgets", "a", "Drifted"), 1.0, "{text}");
        assert!(!text.contains("reason=\"Underutilized\""), "not counted, not served: {text}");
        // The next round counts Empty only: Drifted's series go, Empty's is set in place.
        m.budgets.update("a", &BTreeMap::from([(DisruptionReason::Empty, allowance(4, 0))]));
        let text = m.encode();
        assert_eq!(at(&text, "karpenter_nodepools_allowed_disruptions", "a", "Empty"), 4.0, "{text}");
        assert!(!text.contains("nodepool=\"a\",reason=\"Drifted\""), "{text}");
        m.budgets.forget("a");
        let text = m.encode();
        assert!(!text.contains("nodepool=\"a\""), "{text}");
        assert!(text.contains("nodepool=\"b\",reason=\"Drifted\""), "another pool's stay: {text}");
        m.budgets.clear();
        assert!(!m.encode().contains("nodepool=\"b\""), "cleared");
    }
}
