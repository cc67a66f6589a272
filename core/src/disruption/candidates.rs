//! Which of a pool's nodes may be disrupted, and what moving their pods costs (Karpenter's
//! `NewCandidate`, `ValidatePodsDisruptable` and the disruption costs).
//!
//! Every node gets an answer: a [`Candidate`], or the [`Blocker`] that keeps it (the reason
//! `explain` prints and the `Consolidatable` condition carries).

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use crate::catalog::CapacityType;
use crate::cluster::{NodeClaim, Pdb, Snapshot};
use crate::labels;
use crate::ledger::{Claim, ClaimState, Millis};
use crate::node::Node;
use crate::plane::{DO_NOT_DISRUPT, disrupted_taint, do_not_disrupt};
use crate::pod::{Pod, PodKey};
use crate::resources::ResourceName;

pub use crate::pod::MIRROR_ANNOTATION;
/// The annotation that makes a pod cheaper (or dearer) to evict.
pub const DELETION_COST_ANNOTATION: &str = "controller.kubernetes.io/pod-deletion-cost";

/// Why a node is not a candidate.
#[derive(Clone, Debug, PartialEq)]
pub enum Blocker {
    /// The claim is not initialized (or is terminating, or has no node or NodeClaim yet).
    NotInitialized { state: &'static str },
    /// Its NodeClaim or Node is being deleted.
    Deleting,
    /// A disruption command holds it already.
    Leased { command: String },
    /// `karpenter.sh/do-not-disrupt: "true"` on the node.
    NodeDoNotDisrupt,
    /// A pod with an active `karpenter.sh/do-not-disrupt`.
    PodDoNotDisrupt { pod: PodKey },
    /// A PodDisruptionBudget that allows no disruption covers a pod.
    Pdb { pod: PodKey, pdb: PodKey },
    /// More than one PodDisruptionBudget covers a pod (the eviction API refuses it).
    ManyPdbs { pod: PodKey, pdbs: Vec<PodKey> },
    /// A pending pod is nominated to it (kube-scheduler's `status.nominatedNodeName`: the
    /// node it preempted room on).
    Nominated { pod: PodKey },
    /// The provisioner planned pending pods onto it (Karpenter's nomination window): they
    /// are on their way there.
    Planned { until: u64 },
}

impl fmt::Display for Blocker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Blocker::NotInitialized { state } => write!(f, "its nodeclaim is {state}, not initialized"),
            Blocker::Deleting => f.write_str("it is being deleted"),
            Blocker::Leased { command } => write!(f, "disruption command {command} holds it"),
            Blocker::NodeDoNotDisrupt => write!(f, "the node has {DO_NOT_DISRUPT}"),
            Blocker::PodDoNotDisrupt { pod } => write!(f, "pod {pod} has {DO_NOT_DISRUPT}"),
            Blocker::Pdb { pod, pdb } => write!(f, "pdb {pdb} allows no disruption of pod {pod}"),
            Blocker::ManyPdbs { pod, pdbs } => {
                let names: Vec<String> = pdbs.iter().map(ToString::to_string).collect();
                write!(f, "pod {pod} is covered by several pdbs ({})", names.join(", "))
            }
            Blocker::Nominated { pod } => write!(f, "pending pod {pod} is nominated to it"),
            Blocker::Planned { until } => {
                write!(
                    f,
                    "pending pods were planned onto it (nominated until {})",
                    crate::clock::rfc3339(*until / 1000)
                )
            }
        }
    }
}

/// A node that may be disrupted.
#[derive(Clone, Debug)]
pub struct Candidate<'a> {
    pub claim: &'a Claim,
    pub node: &'a Node,
    pub nodeclaim: &'a NodeClaim,
    /// The pods that must move elsewhere (see [`is_reschedulable`]), by key.
    pub pods: Vec<&'a Arc<Pod>>,
    pub instance_type: Option<&'a str>,
    pub capacity_type: Option<CapacityType>,
    pub zone: Option<&'a str>,
    /// What it costs now ($/hour): its offering's price, else what the ledger holds for it.
    pub price: f64,
    /// `1 + Σ max(0, eviction cost)` over its pods.
    pub reschedule_cost: f64,
    /// The reschedule cost times the share of its lifetime left (`expireAfter`).
    pub disruption_cost: f64,
}

impl Candidate<'_> {
    /// Karpenter's consolidation order key: price per unit of disruption.
    pub fn savings_ratio(&self) -> f64 {
        self.price / self.reschedule_cost
    }

    pub fn is_empty(&self) -> bool {
        self.pods.is_empty()
    }

    /// How full its pods (those that would move) make the node: the larger of their share of
    /// its allocatable CPU and memory. A resource the node does not list counts as full when
    /// the pods ask for it and as empty when they do not. Pod slots are not counted: what a
    /// repack's new nodes must hold is CPU and memory; each brings its own slots.
    pub fn fill(&self) -> f64 {
        let share = |have: i64, asked: i64| match (have, asked) {
            (h, a) if h > 0 => a as f64 / h as f64,
            (_, a) if a > 0 => 1.0,
            _ => 0.0,
        };
        [ResourceName::Cpu, ResourceName::Memory]
            .iter()
            .map(|r| share(self.node.allocatable.get(r), self.pods.iter().map(|p| p.requests.get(r)).sum()))
            .fold(0.0, f64::max)
    }
}

/// A pod's eviction cost (Karpenter's `EvictionCost`): `1 + deletion-cost/2^27 +
/// priority/2^25`, within [-10, 10].
pub fn eviction_cost(p: &Pod) -> f64 {
    let mut cost = 1.0;
    if let Some(v) = p.annotations.get(DELETION_COST_ANNOTATION)
        && let Ok(c) = v.trim().parse::<i64>()
    {
        cost += c as f64 / f64::from(1u32 << 27);
    }
    cost += f64::from(p.priority) / f64::from(1u32 << 25);
    cost.clamp(-10.0, 10.0)
}

/// Whether a pod must move when its node goes: not finished or going already, not a
/// DaemonSet's or a mirror pod, and not tolerating the disrupted taint (such pods stay until
/// the node goes, and are not evicted).
pub fn is_reschedulable(p: &Pod) -> bool {
    !p.terminal
        && !p.deleting
        && !p.daemon
        && !p.is_mirror()
        && !p.tolerations.iter().any(|t| t.tolerates(&disrupted_taint()))
}

/// PodDisruptionBudgets by namespace, for matching pods.
pub struct PdbIndex<'a> {
    by_namespace: BTreeMap<&'a str, Vec<&'a Pdb>>,
}

impl<'a> PdbIndex<'a> {
    pub fn new(snapshot: &'a Snapshot) -> Self {
        let mut by_namespace: BTreeMap<&str, Vec<&Pdb>> = BTreeMap::new();
        for pdb in snapshot.pdbs.values() {
            by_namespace.entry(pdb.key.namespace.as_str()).or_default().push(pdb);
        }
        PdbIndex { by_namespace }
    }

    /// The budgets covering a pod.
    pub fn of(&self, p: &Pod) -> Vec<&'a Pdb> {
        self.by_namespace
            .get(p.key.namespace.as_str())
            .map(|v| v.iter().copied().filter(|pdb| pdb.selector.matches(&p.labels)).collect())
            .unwrap_or_default()
    }
}

/// What keeps a pod's node from voluntary disruption, if anything: an active do-not-disrupt,
/// a budget allowing nothing, or several budgets. `eventual` (drift on a NodeClaim with a
/// terminationGracePeriod) ignores them all: the grace period bounds the wait.
pub fn pod_blocker(p: &Pod, pdbs: &PdbIndex<'_>, now: Millis, eventual: bool) -> Option<Blocker> {
    if eventual || !is_reschedulable(p) {
        return None;
    }
    if do_not_disrupt(p, now) {
        return Some(Blocker::PodDoNotDisrupt { pod: p.key.clone() });
    }
    let covering = pdbs.of(p);
    match covering.as_slice() {
        [] => None,
        [one] if one.disruptions_allowed > 0 => None,
        [one] => Some(Blocker::Pdb { pod: p.key.clone(), pdb: one.key.clone() }),
        many => Some(Blocker::ManyPdbs { pod: p.key.clone(), pdbs: many.iter().map(|b| b.key.clone()).collect() }),
    }
}

/// A claim with its node and NodeClaim, as the disruption methods read them.
pub struct Pieces<'a> {
    pub claim: &'a Claim,
    pub node: Option<&'a Node>,
    pub nodeclaim: Option<&'a NodeClaim>,
    /// Every pod bound to the node.
    pub pods: Vec<&'a Arc<Pod>>,
}

/// Builds the candidate, or says what blocks it. `lease`: the command holding the claim;
/// `types`: the pool's instance types by name; `eventual`: the method ignores pod-level
/// blocks (see [`pod_blocker`]).
pub fn candidate<'a>(
    pieces: &Pieces<'a>,
    lease: Option<&str>,
    types: &crate::plane::TypesByName<'a>,
    pdbs: &PdbIndex<'_>,
    now: Millis,
    eventual: bool,
) -> Result<Candidate<'a>, Blocker> {
    let claim = pieces.claim;
    let (Some(node), Some(nc)) = (pieces.node, pieces.nodeclaim) else {
        return Err(Blocker::NotInitialized { state: claim.state.name() });
    };
    if !matches!(claim.state, ClaimState::Initialized { .. }) {
        return Err(Blocker::NotInitialized { state: claim.state.name() });
    }
    if nc.deleting || node.deleting {
        return Err(Blocker::Deleting);
    }
    if let Some(command) = lease {
        return Err(Blocker::Leased { command: command.to_string() });
    }
    if node.do_not_disrupt || nc.spec.annotations.get(DO_NOT_DISRUPT).is_some_and(|v| v == "true") {
        return Err(Blocker::NodeDoNotDisrupt);
    }
    let eventual = eventual && nc.spec.termination_grace_period.is_some();
    let mut pods = Vec::new();
    let mut reschedule_cost = 1.0;
    for p in &pieces.pods {
        if let Some(b) = pod_blocker(p, pdbs, now, eventual) {
            return Err(b);
        }
        if is_reschedulable(p) {
            reschedule_cost += eviction_cost(p).max(0.0);
            pods.push(*p);
        }
    }
    pods.sort_by(|a, b| a.key.cmp(&b.key));
    let instance_type = node.labels.get(labels::INSTANCE_TYPE).map(String::as_str);
    let capacity_type = node.labels.get(labels::CAPACITY_TYPE).and_then(|c| CapacityType::parse(c));
    let zone = node.labels.get(labels::ZONE).map(String::as_str);
    let offered = instance_type.and_then(|name| types.get(name)).and_then(|t| {
        t.offerings.iter().find(|o| Some(o.zone.as_str()) == zone && Some(o.capacity_type) == capacity_type)
    });
    let price = offered.map(|o| o.price).unwrap_or(claim.price_per_hour as f64 / 1e6);
    let lifetime_left = match nc.spec.expire_after {
        Some(d) if !d.is_zero() => {
            let total = crate::clock::to_millis(d) as f64;
            let age = now.saturating_sub(nc.born(claim.reserved_at)) as f64;
            ((total - age) / total).clamp(0.0, 1.0)
        }
        _ => 1.0,
    };
    Ok(Candidate {
        claim,
        node,
        nodeclaim: nc,
        pods,
        instance_type,
        capacity_type,
        zone,
        price,
        reschedule_cost,
        disruption_cost: reschedule_cost * lifetime_left,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::IntOrPercent;
    use crate::labels::LabelSelector;

    fn pod(name: &str) -> Pod {
        let mut p = Pod::new("default", name, crate::resources::ResourceList::cpu_mem(100, 1 << 20));
        p.labels = crate::shared::Shared::new([("app".to_string(), "web".to_string())].into_iter().collect());
        p
    }

    fn pdb(name: &str, allowed: i32) -> Pdb {
        Pdb {
            key: PodKey::new("default", name),
            selector: LabelSelector::from_labels([("app", "web")]),
            min_available: Some(IntOrPercent::Int(1)),
            max_unavailable: None,
            disruptions_allowed: allowed,
        }
    }

    fn index(pdbs: Vec<Pdb>) -> Snapshot {
        let mut s = Snapshot::default();
        for p in pdbs {
            s.pdbs.insert(p.key.clone(), Arc::new(p));
        }
        s
    }

    #[test]
    fn eviction_cost_follows_deletion_cost_and_priority_within_bounds() {
        let mut p = pod("a");
        assert_eq!(eviction_cost(&p), 1.0);
        p.annotations.insert(DELETION_COST_ANNOTATION.into(), (1i64 << 27).to_string());
        assert_eq!(eviction_cost(&p), 2.0);
        p.priority = i32::MAX;
        assert_eq!(eviction_cost(&p), 10.0, "clamped");
        p.annotations.insert(DELETION_COST_ANNOTATION.into(), "not a number".into());
        p.priority = -(1 << 30);
        assert_eq!(eviction_cost(&p), -10.0, "clamped below");
    }

    #[test]
    fn a_pdb_allowing_nothing_or_several_pdbs_block_and_an_eventual_method_ignores_them() {
        let one_ok = index(vec![pdb("ok", 1)]);
        let p = pod("a");
        assert_eq!(pod_blocker(&p, &PdbIndex::new(&one_ok), 0, false), None);
        let zero = index(vec![pdb("none", 0)]);
        assert!(matches!(pod_blocker(&p, &PdbIndex::new(&zero), 0, false), Some(Blocker::Pdb { .. })));
        assert_eq!(pod_blocker(&p, &PdbIndex::new(&zero), 0, true), None, "drift with a grace period");
        let two = index(vec![pdb("x", 5), pdb("y", 5)]);
        let b = pod_blocker(&p, &PdbIndex::new(&two), 0, false).expect("blocked");
        assert!(matches!(&b, Blocker::ManyPdbs { pdbs, .. } if pdbs.len() == 2));
        assert!(b.to_string().contains("several pdbs"), "{b}");
        let mut other_ns = pod("a");
        other_ns.key = PodKey::new("other", "a");
        assert_eq!(pod_blocker(&other_ns, &PdbIndex::new(&zero), 0, false), None, "a pdb covers its namespace only");
        let mut daemon = pod("d");
        daemon.daemon = true;
        assert_eq!(pod_blocker(&daemon, &PdbIndex::new(&zero), 0, false), None, "a daemon pod does not move");
    }

    #[test]
    fn do_not_disrupt_blocks_while_active() {
        let mut p = pod("a");
        p.annotations.insert(DO_NOT_DISRUPT.into(), "10m".into());
        p.started_at = Some(0);
        let none = index(vec![]);
        assert!(matches!(pod_blocker(&p, &PdbIndex::new(&none), 60_000, false), Some(Blocker::PodDoNotDisrupt { .. })));
        assert_eq!(pod_blocker(&p, &PdbIndex::new(&none), 600_000, false), None, "its ten minutes ran out");
    }
}
