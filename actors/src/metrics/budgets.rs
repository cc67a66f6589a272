//! Karpenter's disruption budget gauges, per NodePool and reason:
//! `karpenter_nodepools_allowed_disruptions` (what the active budgets allow disrupting at once,
//! before taking off the nodes disrupting already; 2147483647 when no budget covers the reason)
//! and `karpenter_nodepools_nodes_consuming_budgets` (those nodes: leased to a command,
//! terminating, or not Ready).
//!
//! Set by the NodePool actor at each disruption round from the ledger's own count
//! ([`dovetail_core::ledger::State::allowance`], the numbers the ledger grants leases by), so
//! they are what was enforced. Only the leader runs rounds: a pool's series are removed when
//! its actor stops leading, is retired or stops, and all of them when a term's actors are
//! dropped, so a follower serves none and a deleted pool leaves none behind.

use dovetail_core::ledger::Allowance;
use dovetail_core::nodepool::DisruptionReason;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use super::Labels;

const REASONS: [DisruptionReason; 3] =
    [DisruptionReason::Underutilized, DisruptionReason::Empty, DisruptionReason::Drifted];

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

    /// Removes every pool's series (the control node's acting actors are gone).
    pub fn clear(&self) {
        self.allowed.clear();
        self.consuming.clear();
    }

    /// Removes `nodepool`'s series (it no longer leads, or is gone).
    pub fn forget(&self, nodepool: &str) {
        for reason in REASONS {
            let l = labels(nodepool, reason);
            self.allowed.remove(&l);
            self.consuming.remove(&l);
        }
    }
}
