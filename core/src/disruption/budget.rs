//! Disruption budgets as Karpenter counts them, and dovetail's rate budget.
//!
//! A budget caps how many of a NodePool's nodes may be *disrupting at once* for a reason:
//! `allowed` is the minimum, over the active budgets that cover the reason, of the budget's
//! `nodes` (a count, or a percentage of the pool's nodes rounded up); an inactive budget
//! (outside its schedule's windows) allows anything, a reason no budget covers is unbounded,
//! and a budget whose schedule does not parse allows nothing (it fails closed). Nodes that
//! are disrupting already (leased by a command, terminating, or not ready) are taken off:
//! `available = max(allowed - disrupting, 0)`.
//!
//! The rate budget (`dovetail.dev/disruption-rate: "5/10m"`) caps how many nodes may *start*
//! disrupting in any window of that length, so a faster evaluator never means more churn.
//!
//! The ledger's `apply` calls these when a command asks for a disruption lease, so what they
//! say holds whatever order NodePool actors propose in and across failovers; the planners call
//! the same functions to pre-filter candidates.

use std::fmt;

use crate::clock::to_millis;
use crate::ledger::Millis;
use crate::nodepool::{Budget, BudgetNodes, DisruptionReason};

use super::cron::Cron;

/// What Karpenter returns for "no limit" (`math.MaxInt32`).
pub const UNBOUNDED: u32 = i32::MAX as u32;

/// The NodePool annotation of the rate budget.
pub const RATE_ANNOTATION: &str = "dovetail.dev/disruption-rate";

/// What one budget allows now, for a pool of `nodes` nodes: [`UNBOUNDED`] outside its
/// windows, 0 when its schedule is invalid.
pub fn budget_allows(b: &Budget, nodes: u32, now: Millis) -> u32 {
    match (&b.schedule, b.duration) {
        (None, None) => {}
        (Some(s), Some(d)) => match Cron::parse(s) {
            Ok(cron) if cron.is_active(now, d) => {}
            Ok(_) => return UNBOUNDED,
            Err(_) => return 0,
        },
        // A schedule without a duration (or the reverse) is invalid: closed.
        _ => return 0,
    }
    match b.nodes {
        BudgetNodes::Count(n) => n,
        // Rounded up, as Karpenter's `GetScaledValueFromIntOrPercent(.., true)`.
        BudgetNodes::Percent(p) => {
            let v = (u64::from(p) * u64::from(nodes)).div_ceil(100);
            u32::try_from(v).unwrap_or(UNBOUNDED)
        }
    }
}

/// How many nodes may be disrupting at once for `reason` (before taking off those that are):
/// the minimum over the budgets that name the reason (or name none), [`UNBOUNDED`] if none
/// does.
pub fn allowed(budgets: &[Budget], reason: DisruptionReason, nodes: u32, now: Millis) -> u32 {
    budgets
        .iter()
        .filter(|b| b.reasons.is_empty() || b.reasons.contains(&reason))
        .map(|b| budget_allows(b, nodes, now))
        .min()
        .unwrap_or(UNBOUNDED)
}

/// How many more nodes may start disrupting for `reason` now.
pub fn available(budgets: &[Budget], reason: DisruptionReason, nodes: u32, disrupting: u32, now: Millis) -> u32 {
    allowed(budgets, reason, nodes, now).saturating_sub(disrupting)
}

/// The rate budget: at most `nodes` nodes start disrupting in any window of `per`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rate {
    pub nodes: u32,
    pub per: Millis,
}

impl Rate {
    /// Parses `"N/DURATION"` (`"5/10m"`); the error says what is wrong.
    pub fn parse(s: &str) -> Result<Rate, String> {
        let (n, per) = s.split_once('/').ok_or_else(|| format!("{s:?}: expected NODES/DURATION, such as \"5/10m\""))?;
        let nodes: u32 = n.trim().parse().map_err(|_| format!("{s:?}: {n:?} is not a number of nodes"))?;
        let per = crate::nodepool::parse_duration(per.trim())
            .map_err(|e| format!("{s:?}: {e}"))?
            .filter(|d| !d.is_zero())
            .ok_or_else(|| format!("{s:?}: the window must be a positive duration"))?;
        Ok(Rate { nodes, per: to_millis(per) })
    }

    /// How many more nodes may start at `now`, given when the pool's recent starts were (one
    /// entry per node).
    pub fn available(&self, starts: &[Millis], now: Millis) -> u32 {
        let recent = starts.iter().filter(|t| **t <= now && now - **t < self.per).count();
        self.nodes.saturating_sub(u32::try_from(recent).unwrap_or(u32::MAX))
    }
}

impl fmt::Display for Rate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}s", self.nodes, self.per / 1000)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::nodepool::BudgetNodes::{Count, Percent};

    fn budget(nodes: BudgetNodes) -> Budget {
        Budget { nodes, schedule: None, duration: None, reasons: vec![] }
    }

    /// 2026-11-25 (a Wednesday) at `h`:00 UTC.
    fn wednesday(h: u64) -> Millis {
        (20_782 * 1_440 + h * 60) * 60_000
    }

    #[test]
    fn percentages_round_up_and_the_least_active_budget_wins() {
        assert_eq!(allowed(&[budget(Percent(10))], DisruptionReason::Empty, 11, 0), 2, "1.1 rounds up to 2");
        assert_eq!(allowed(&[budget(Percent(10))], DisruptionReason::Empty, 0, 0), 0);
        assert_eq!(allowed(&[budget(Percent(100))], DisruptionReason::Empty, 7, 0), 7);
        let two = [budget(Percent(50)), budget(Count(3))];
        assert_eq!(allowed(&two, DisruptionReason::Underutilized, 20, 0), 3);
        assert_eq!(available(&two, DisruptionReason::Underutilized, 20, 2, 0), 1);
        assert_eq!(available(&two, DisruptionReason::Underutilized, 20, 5, 0), 0, "never below zero");
    }

    #[test]
    fn reasons_scope_a_budget_and_an_uncovered_reason_is_unbounded() {
        let only_drift = [Budget { reasons: vec![DisruptionReason::Drifted], ..budget(Count(0)) }];
        assert_eq!(allowed(&only_drift, DisruptionReason::Drifted, 10, 0), 0);
        assert_eq!(allowed(&only_drift, DisruptionReason::Empty, 10, 0), UNBOUNDED, "aws/karpenter-provider-aws#7026");
        assert_eq!(allowed(&[], DisruptionReason::Empty, 10, 0), UNBOUNDED);
    }

    #[test]
    fn a_scheduled_budget_binds_only_in_its_window_and_an_invalid_one_fails_closed() {
        // No disruption during business hours.
        let freeze = Budget {
            nodes: Count(0),
            schedule: Some("0 9 * * 1-5".into()),
            duration: Some(Duration::from_secs(8 * 3600)),
            reasons: vec![],
        };
        let budgets = [budget(Percent(10)), freeze.clone()];
        assert_eq!(allowed(&budgets, DisruptionReason::Empty, 30, wednesday(10)), 0);
        assert_eq!(allowed(&budgets, DisruptionReason::Empty, 30, wednesday(18)), 3);
        let broken = Budget { schedule: Some("0 9 * *".into()), ..freeze.clone() };
        assert_eq!(allowed(&[budget(Percent(10)), broken], DisruptionReason::Empty, 30, wednesday(18)), 0);
        let half = Budget { duration: None, ..freeze };
        assert_eq!(allowed(&[half], DisruptionReason::Empty, 30, wednesday(18)), 0, "schedule without duration");
    }

    #[test]
    fn the_rate_counts_starts_in_a_sliding_window() {
        let r = Rate::parse("5/10m").expect("parses");
        assert_eq!(r, Rate { nodes: 5, per: 600_000 });
        let starts = [0, 100_000, 100_000, 500_000];
        assert_eq!(r.available(&starts, 500_000), 1);
        assert_eq!(r.available(&starts, 600_000), 2, "the start at 0 left the window");
        assert_eq!(r.available(&starts, 1_200_000), 5);
        for (bad, says) in [("5", "NODES/DURATION"), ("x/10m", "number"), ("5/0s", "positive"), ("5/10x", "unit")] {
            let e = Rate::parse(bad).expect_err(bad);
            assert!(e.contains(says), "{bad}: {e}");
        }
    }
}
