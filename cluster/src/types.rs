//! The objects of the Kubernetes seam, as the control plane sees them.

use std::collections::BTreeMap;
use std::sync::Arc;

use dovetail_core::labels::LabelSelector;
use dovetail_core::node::Node;
use dovetail_core::nodepool::{NodeClaimSpec, NodePool};
use dovetail_core::pod::{Pod, PodKey};
use dovetail_core::resources::ResourceList;

/// A status condition (`Launched`, `Registered`, `Initialized`, `Drifted`, ...).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Condition {
    pub kind: String,
    pub status: bool,
    pub reason: String,
    pub message: String,
}

/// `status` of a NodeClaim.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct NodeClaimStatus {
    /// `aws:///<zone>/<instance id>` once launched.
    pub provider_id: Option<String>,
    pub node_name: Option<String>,
    pub capacity: ResourceList,
    pub allocatable: ResourceList,
    pub conditions: Vec<Condition>,
}

impl NodeClaimStatus {
    /// The condition of a kind, if set.
    pub fn condition(&self, kind: &str) -> Option<&Condition> {
        self.conditions.iter().find(|c| c.kind == kind)
    }

    /// Sets (or replaces) a condition.
    pub fn set_condition(&mut self, c: Condition) {
        match self.conditions.iter_mut().find(|x| x.kind == c.kind) {
            Some(x) => *x = c,
            None => self.conditions.push(c),
        }
    }
}

/// A NodeClaim object.
#[derive(Clone, Debug, PartialEq)]
pub struct NodeClaim {
    /// The claim id: the idempotency key everywhere (ledger, cloud tag, object name).
    pub name: String,
    pub spec: NodeClaimSpec,
    pub finalizers: Vec<String>,
    /// `metadata.deletionTimestamp` is set.
    pub deleting: bool,
    pub status: NodeClaimStatus,
}

/// An integer or a percentage, as PDBs write `minAvailable`/`maxUnavailable`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IntOrPercent {
    Int(i32),
    Percent(i32),
}

impl IntOrPercent {
    /// The amount out of `total` (percentages rounded up, as the disruption controller does).
    pub fn of(&self, total: i32) -> i32 {
        match *self {
            IntOrPercent::Int(n) => n,
            IntOrPercent::Percent(p) => {
                (i64::from(total) * i64::from(p)).div_euclid(100) as i32
                    + i32::from((i64::from(total) * i64::from(p)) % 100 != 0)
            }
        }
    }
}

/// A PodDisruptionBudget with its status.
#[derive(Clone, Debug, PartialEq)]
pub struct Pdb {
    pub key: PodKey,
    pub selector: LabelSelector,
    pub min_available: Option<IntOrPercent>,
    pub max_unavailable: Option<IntOrPercent>,
    /// `status.disruptionsAllowed`, kept by the cluster's disruption controller.
    pub disruptions_allowed: i32,
}

/// Everything the cluster holds at one resource version. Objects are shared.
#[derive(Clone, Debug, Default)]
pub struct Snapshot {
    pub resource_version: u64,
    pub pods: BTreeMap<PodKey, Arc<Pod>>,
    pub nodes: BTreeMap<String, Arc<Node>>,
    pub nodeclaims: BTreeMap<String, Arc<NodeClaim>>,
    pub nodepools: BTreeMap<String, Arc<NodePool>>,
    /// DaemonSets by key, each as its pod template.
    pub daemonsets: BTreeMap<PodKey, Arc<Pod>>,
    pub pdbs: BTreeMap<PodKey, Arc<Pdb>>,
}

impl Snapshot {
    /// Pods not bound to a node (and not finished).
    pub fn pending(&self) -> impl Iterator<Item = &Arc<Pod>> {
        self.pods.values().filter(|p| p.node_name.is_none() && !p.terminal)
    }

    /// The capacity the solver may place pods on: every node, and every NodeClaim not deleting
    /// whose node has not registered, as a node with the claim's requirements (its allocatable
    /// once launched, until then its requests, so only the pods planned onto it fit).
    pub fn capacity_nodes(&self) -> Vec<Node> {
        let mut nodes: Vec<Node> = self.nodes.values().map(|n| n.as_ref().clone()).collect();
        for c in self.nodeclaims.values() {
            if c.deleting || c.status.node_name.as_ref().is_some_and(|n| self.nodes.contains_key(n)) {
                continue;
            }
            let allocatable =
                if c.status.allocatable.is_empty() { c.spec.requests.clone() } else { c.status.allocatable.clone() };
            nodes.push(Node {
                name: c.name.clone(),
                labels: c.spec.labels.clone(),
                taints: c.spec.taints.clone(),
                capacity: allocatable.clone(),
                allocatable,
                initialized: false,
                requirements: Some(c.spec.requirements.clone()),
                unschedulable: false,
                provider_id: c.status.provider_id.clone(),
            });
        }
        nodes
    }

    /// The solver's input over this cluster: `nodes` (chosen by the caller), every bound pod and
    /// every DaemonSet, with `pools` to launch from.
    pub fn scheduling_input(
        &self,
        nodes: Vec<Node>,
        pools: Vec<dovetail_core::scheduling::PoolInput>,
    ) -> dovetail_core::scheduling::Snapshot {
        dovetail_core::scheduling::Snapshot {
            nodepools: pools,
            nodes,
            bound_pods: self
                .pods
                .values()
                .filter(|p| p.node_name.is_some() && !p.terminal)
                .map(|p| p.as_ref().clone())
                .collect(),
            daemonsets: self.daemonsets.values().map(|p| p.as_ref().clone()).collect(),
            namespaces: Default::default(),
        }
    }

    /// Pods bound to `node`.
    pub fn pods_on<'a>(&'a self, node: &'a str) -> impl Iterator<Item = &'a Arc<Pod>> {
        self.pods.values().filter(move |p| p.node_name.as_deref() == Some(node))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentages_round_up() {
        assert_eq!(IntOrPercent::Percent(50).of(3), 2);
        assert_eq!(IntOrPercent::Percent(10).of(10), 1);
        assert_eq!(IntOrPercent::Percent(0).of(10), 0);
        assert_eq!(IntOrPercent::Int(2).of(10), 2);
    }
}
