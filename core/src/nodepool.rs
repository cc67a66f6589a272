//! NodePool and NodeClaim specifications as Karpenter v1 has them, in domain terms.

use std::time::Duration;

use crate::labels::Labels;
use crate::requirements::Requirements;
use crate::resources::ResourceList;
use crate::taints::Taint;

/// `spec.template.spec.nodeClassRef`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Default)]
pub struct NodeClassRef {
    pub group: String,
    pub kind: String,
    pub name: String,
}

impl NodeClassRef {
    /// A reference to an `EC2NodeClass`.
    pub fn ec2(name: &str) -> Self {
        NodeClassRef { group: "karpenter.k8s.aws".into(), kind: "EC2NodeClass".into(), name: name.into() }
    }
}

/// `spec.disruption.consolidationPolicy`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum ConsolidationPolicy {
    WhenEmpty,
    #[default]
    WhenEmptyOrUnderutilized,
    Balanced,
}

/// A disruption reason a budget can name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DisruptionReason {
    Underutilized,
    Empty,
    Drifted,
}

impl DisruptionReason {
    /// Every reason a budget may name.
    pub const ALL: [DisruptionReason; 3] =
        [DisruptionReason::Underutilized, DisruptionReason::Empty, DisruptionReason::Drifted];

    /// The name Karpenter uses (budgets' `reasons`, the `reason` metric label).
    pub fn as_str(&self) -> &'static str {
        match self {
            DisruptionReason::Underutilized => "Underutilized",
            DisruptionReason::Empty => "Empty",
            DisruptionReason::Drifted => "Drifted",
        }
    }

    /// The reason of a name, as [`DisruptionReason::as_str`] writes it.
    pub fn parse(s: &str) -> Option<DisruptionReason> {
        DisruptionReason::ALL.into_iter().find(|r| r.as_str() == s)
    }
}

impl std::fmt::Display for DisruptionReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// `budgets[].nodes`: a percentage (rounded up) or a count.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BudgetNodes {
    Percent(u8),
    Count(u32),
}

/// One disruption budget.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Budget {
    pub nodes: BudgetNodes,
    /// A UTC cron schedule; with `duration`, the budget is active only in its windows.
    pub schedule: Option<String>,
    pub duration: Option<Duration>,
    /// Empty means every reason.
    pub reasons: Vec<DisruptionReason>,
}

/// `spec.disruption`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Disruption {
    pub consolidation_policy: ConsolidationPolicy,
    /// `None` is `Never`. Default `0s`.
    pub consolidate_after: Option<Duration>,
    pub budgets: Vec<Budget>,
    /// dovetail's rate budget, from the NodePool's `dovetail.dev/disruption-rate` annotation.
    pub rate: Option<crate::disruption::budget::Rate>,
}

impl Default for Disruption {
    fn default() -> Self {
        Disruption {
            consolidation_policy: ConsolidationPolicy::default(),
            consolidate_after: Some(Duration::ZERO),
            budgets: vec![Budget { nodes: BudgetNodes::Percent(10), schedule: None, duration: None, reasons: vec![] }],
            rate: None,
        }
    }
}

/// Karpenter's default `expireAfter`.
pub const DEFAULT_EXPIRE_AFTER: Duration = Duration::from_secs(720 * 3600);

/// A NodePool (`karpenter.sh/v1`).
#[derive(Clone, Debug, PartialEq)]
pub struct NodePool {
    pub name: String,
    /// 0 when unset; higher is preferred.
    pub weight: i32,
    /// `spec.template.metadata.labels`.
    pub labels: Labels,
    pub annotations: Labels,
    /// `spec.template.spec.requirements`, including `minValues`.
    pub requirements: Requirements,
    pub taints: Vec<Taint>,
    /// Present at boot, ignored for scheduling.
    pub startup_taints: Vec<Taint>,
    /// `spec.limits`; an absent resource is unlimited.
    pub limits: ResourceList,
    pub node_class: NodeClassRef,
    /// `None` is `Never`.
    pub expire_after: Option<Duration>,
    pub termination_grace_period: Option<Duration>,
    pub disruption: Disruption,
}

impl NodePool {
    /// A NodePool with defaults and the given requirements, for tests and examples.
    pub fn new(name: &str, requirements: Requirements) -> Self {
        NodePool {
            name: name.to_string(),
            weight: 0,
            labels: Labels::new(),
            annotations: Labels::new(),
            requirements,
            taints: Vec::new(),
            startup_taints: Vec::new(),
            limits: ResourceList::new(),
            node_class: NodeClassRef::ec2("default"),
            expire_after: Some(DEFAULT_EXPIRE_AFTER),
            termination_grace_period: None,
            disruption: Disruption::default(),
        }
    }
}

/// Sorts NodePools as Karpenter's `OrderByWeight`: weight descending, then name descending.
pub fn order_by_weight(pools: &mut [NodePool]) {
    pools.sort_by(|a, b| b.weight.cmp(&a.weight).then_with(|| b.name.cmp(&a.name)));
}

/// A NodeClaim's spec (`karpenter.sh/v1`), as the scheduler produces it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct NodeClaimSpec {
    pub nodepool: String,
    pub labels: Labels,
    pub annotations: Labels,
    pub taints: Vec<Taint>,
    pub startup_taints: Vec<Taint>,
    /// Includes the `node.kubernetes.io/instance-type In [...]` and
    /// `karpenter.sh/capacity-type In [...]` requirements of the chosen types.
    pub requirements: Requirements,
    /// Pod requests plus the smallest daemon overhead.
    pub requests: ResourceList,
    pub node_class: NodeClassRef,
    pub expire_after: Option<Duration>,
    pub termination_grace_period: Option<Duration>,
}

/// Parses a Go-style duration as NodePools write them (`720h`, `30m`, `1h30m`, `10s`,
/// `0s`); `Never` is `Ok(None)`.
pub fn parse_duration(s: &str) -> Result<Option<Duration>, String> {
    if s == "Never" {
        return Ok(None);
    }
    if s.is_empty() {
        return Err("empty duration".into());
    }
    let mut total = 0f64;
    let mut rest = s;
    while !rest.is_empty() {
        let num_end = rest.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(rest.len());
        if num_end == 0 {
            return Err(format!("invalid duration {s:?}"));
        }
        let n: f64 = rest[..num_end].parse().map_err(|_| format!("invalid duration {s:?}"))?;
        rest = &rest[num_end..];
        let unit_end = rest.find(|c: char| c.is_ascii_digit() || c == '.').unwrap_or(rest.len());
        let secs = match &rest[..unit_end] {
            "h" => 3600.0,
            "m" => 60.0,
            "s" => 1.0,
            "ms" => 0.001,
            "us" | "µs" => 0.000_001,
            "ns" => 0.000_000_001,
            "" if n == 0.0 && rest.is_empty() => 0.0,
            u => return Err(format!("invalid duration {s:?}: unknown unit {u:?}")),
        };
        total += n * secs;
        rest = &rest[unit_end..];
    }
    // A number too large for a duration is an error, not a panic (user data reaches here).
    Duration::try_from_secs_f64(total).map(Some).map_err(|_| format!("invalid duration {s:?}: out of range"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("720h").unwrap(), Some(Duration::from_secs(720 * 3600)));
        assert_eq!(parse_duration("1h30m").unwrap(), Some(Duration::from_secs(5400)));
        assert_eq!(parse_duration("0s").unwrap(), Some(Duration::ZERO));
        assert_eq!(parse_duration("0").unwrap(), Some(Duration::ZERO));
        assert_eq!(parse_duration("Never").unwrap(), None);
        assert!(parse_duration("5x").is_err());
        assert!(parse_duration("h").is_err());
    }

    #[test]
    fn a_duration_too_large_is_an_error_not_a_panic() {
        let huge = format!("{}h", "9".repeat(400));
        assert!(parse_duration(&huge).is_err());
        assert!(parse_duration("99999999999999999999h").is_err());
        assert!(parse_duration("1.5.5h").is_err());
    }

    #[test]
    fn weight_order_breaks_ties_by_name_descending() {
        let mut pools = vec![
            NodePool::new("a", Requirements::new()),
            NodePool { weight: 10, ..NodePool::new("z", Requirements::new()) },
            NodePool::new("b", Requirements::new()),
        ];
        order_by_weight(&mut pools);
        let names: Vec<_> = pools.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(names, ["z", "b", "a"]);
    }
}
