//! The Kubernetes objects the control plane reads and the changes it asks for, as plain data.
//!
//! A [`Snapshot`] is everything the cluster holds at one resource version (pods, nodes,
//! NodeClaims, NodePools, DaemonSets, PDBs); the planners read it. The changes they ask for
//! are patches ([`NodePatch`], [`StatusPatch`]) that add or remove one item (a taint, a
//! label, a finalizer, a condition) rather than replace a list, so that what others wrote
//! (the node lifecycle controller, the cloud controller) survives: the executor applies a
//! patch to a fresh read and writes it with that read's resource version as a precondition.
//! The `dovetail-cluster` crate's seam and its implementations move these objects.

use std::collections::{BTreeMap, HashSet};
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use crate::labels::{LabelSelector, Labels};
use crate::node::Node;
use crate::nodepool::{NodeClaimSpec, NodePool};
use crate::pod::{Pod, PodKey};
use crate::resources::ResourceList;
use crate::shared::{FastMap, FastSet};
use crate::taints::Taint;

pub mod chunked;
mod pods;
mod storage;

pub use pods::Pods;
pub use storage::{MAX_VOLUME_ALTERNATIVES, Storage, VolumeClaim, VolumeError};

/// The finalizer every NodeClaim (and every Node dovetail registers) carries until its
/// instance is gone.
pub const TERMINATION_FINALIZER: &str = "karpenter.sh/termination";

/// The taint a node registers with, until the NodeClaim lifecycle applied its NodeClaim's
/// labels and taints.
pub const UNREGISTERED_TAINT: &str = "karpenter.sh/unregistered";

/// A status condition (`Launched`, `Registered`, `Initialized`, `Drifted`, ...).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Condition {
    pub kind: String,
    pub status: bool,
    pub reason: String,
    pub message: String,
}

impl Condition {
    /// A true condition whose reason is its kind (how Karpenter writes lifecycle conditions).
    pub fn met(kind: &str) -> Self {
        Condition { kind: kind.into(), status: true, reason: kind.into(), message: String::new() }
    }
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

    /// Whether a condition of this kind is set and true.
    pub fn is(&self, kind: &str) -> bool {
        self.condition(kind).is_some_and(|c| c.status)
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
    /// `metadata.resourceVersion`: the precondition of a write made from this read.
    pub resource_version: u64,
    /// `metadata.creationTimestamp`, Unix ms, once the API server made the object (`None` on
    /// one not created yet). `expireAfter` counts from it, as in Karpenter: not from when a
    /// ledger took the claim over (a restart, or a migration from Karpenter, must not reset
    /// every node's expiry).
    pub created: Option<u64>,
}

impl NodeClaim {
    /// When the claim's life began for `expireAfter`: its object's creation, else (an object
    /// not read back from a server yet) `fallback`, the ledger's reservation time.
    pub fn born(&self, fallback: u64) -> u64 {
        self.created.unwrap_or(fallback)
    }
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
                let scaled = i64::from(total) * i64::from(p);
                i32::try_from(scaled.div_euclid(100) + i64::from(scaled % 100 != 0)).unwrap_or(i32::MAX)
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

/// The kind of an object kept by identity only ([`Unreadable`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum UnreadableKind {
    NodeClaim,
    Node,
}

impl UnreadableKind {
    pub fn as_str(self) -> &'static str {
        match self {
            UnreadableKind::NodeClaim => "NodeClaim",
            UnreadableKind::Node => "Node",
        }
    }
}

/// An object the cluster adapter could not convert (a field of a newer Karpenter, a value
/// out of range), kept by identity: what it owns must never look orphaned. A NodeClaim that
/// cannot be read still owns its instance and its Node, so garbage collection leaves them
/// alone and the lifecycle does not take the claim for deleted. The error names the field.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unreadable {
    pub kind: UnreadableKind,
    pub name: String,
    pub uid: String,
    /// `status.providerID` of a NodeClaim, `spec.providerID` of a Node.
    pub provider_id: Option<String>,
    pub labels: Labels,
    /// Why it could not be converted (the object and field).
    pub error: String,
}

impl Unreadable {
    /// The key it is kept under in [`Snapshot::unreadable`].
    pub fn key(kind: UnreadableKind, name: &str) -> String {
        format!("{} {name}", kind.as_str())
    }
}

/// Everything the cluster holds at one resource version. Objects are shared.
#[derive(Clone, Debug, Default)]
pub struct Snapshot {
    pub resource_version: u64,
    pub pods: Pods,
    pub nodes: BTreeMap<String, Arc<Node>>,
    pub nodeclaims: BTreeMap<String, Arc<NodeClaim>>,
    pub nodepools: BTreeMap<String, Arc<NodePool>>,
    /// DaemonSets by key, each as its pod template.
    pub daemonsets: BTreeMap<PodKey, Arc<Pod>>,
    pub pdbs: BTreeMap<PodKey, Arc<Pdb>>,
    /// Namespaces' labels, for pod affinity terms with a namespace selector.
    pub namespaces: BTreeMap<String, Labels>,
    /// What volume topology reads.
    pub storage: Storage,
    /// NodeClaims and Nodes that could not be converted, by `Kind name` ([`Unreadable`]).
    pub unreadable: BTreeMap<String, Arc<Unreadable>>,
}

impl Snapshot {
    /// The NodeClaim `name` exists but could not be read.
    pub fn unreadable_claim(&self, name: &str) -> Option<&Unreadable> {
        self.unreadable.get(&Unreadable::key(UnreadableKind::NodeClaim, name)).map(|u| u.as_ref())
    }

    /// Whether an object that could not be read names `provider_id` (a NodeClaim's instance,
    /// or a Node on it).
    pub fn unreadable_owns(&self, provider_id: &str) -> Option<&Unreadable> {
        self.unreadable.values().find(|u| u.provider_id.as_deref() == Some(provider_id)).map(|u| u.as_ref())
    }

    /// Pods not bound to a node (and not finished).
    pub fn pending(&self) -> impl Iterator<Item = &Arc<Pod>> {
        self.pods.pending()
    }

    /// Pods a node should be provisioned for (Karpenter's `IsProvisionable`): not bound, not
    /// finished or being deleted, not a DaemonSet's, not nominated to a node (preempting),
    /// not held by a scheduling gate, and marked by the scheduler
    /// `PodScheduled=False, reason=Unschedulable` (so pods of another scheduler, which never
    /// get that mark from kube-scheduler, are left alone).
    pub fn provisionable(&self) -> impl Iterator<Item = &Arc<Pod>> {
        self.pending().filter(|p| p.is_provisionable())
    }

    /// The capacity the solver may place pods on: every node not being deleted, and every
    /// NodeClaim not deleting whose node has not joined, as a node with the claim's
    /// requirements (its allocatable once launched, until then its requests, so only the
    /// pods planned onto it fit). A node that has joined but is not initialized is in flight,
    /// as Karpenter counts it: its boot taints (the known ephemeral ones, and its NodeClaim's
    /// startup taints) do not keep pods off it.
    pub fn capacity_nodes(&self) -> Vec<Node> {
        // The claims by their node's provider id and by node name: a node that joined is
        // counted once, as itself, before its NodeClaim names it. The provider id is asked
        // first (a node name can come back: EC2 reuses private IPs), then the owner, then the
        // name; every claim a node matches is joined.
        let mut by_provider: FastMap<&str, &NodeClaim> = FastMap::default();
        let mut by_node: FastMap<&str, Vec<&NodeClaim>> = FastMap::default();
        for c in self.nodeclaims.values() {
            if let Some(p) = c.status.provider_id.as_deref() {
                by_provider.insert(p, c);
            }
            if let Some(n) = c.status.node_name.as_deref() {
                by_node.entry(n).or_default().push(c);
            }
        }
        let mut joined: FastSet<&str> = FastSet::default();
        let mut nodes: Vec<Node> = Vec::with_capacity(self.nodes.len() + self.nodeclaims.len());
        for n in self.nodes.values() {
            let mut matched: Vec<&NodeClaim> = Vec::new();
            matched.extend(n.provider_id.as_deref().and_then(|p| by_provider.get(p)).copied());
            matched.extend(n.owner_claim.as_deref().and_then(|c| self.nodeclaims.get(c)).map(|c| c.as_ref()));
            matched.extend(by_node.get(n.name.as_str()).into_iter().flatten().copied());
            // A claim whose node is being deleted is not capacity either.
            joined.extend(matched.iter().map(|c| c.name.as_str()));
            if n.deleting {
                continue;
            }
            let mut node = n.as_ref().clone();
            match matched.first() {
                // Booting: its claim's startup taints are not in the way either.
                Some(c) if !n.initialized => {
                    node.taints
                        .retain(|t| !c.spec.startup_taints.iter().any(|s| s.key == t.key && s.effect == t.effect));
                }
                Some(_) => {}
                // A node with no NodeClaim is not managed (Karpenter's view): nothing of it is
                // in flight, every taint it has counts (a NotReady one takes no pods).
                None => node.initialized = true,
            }
            nodes.push(node);
        }
        for c in self.nodeclaims.values() {
            if c.deleting || joined.contains(c.name.as_str()) {
                continue;
            }
            let allocatable =
                if c.status.allocatable.is_empty() { c.spec.requests.clone() } else { c.status.allocatable.clone() };
            nodes.push(Node {
                name: c.name.clone(),
                labels: c.spec.labels.clone().into(),
                taints: c.spec.taints.clone(),
                capacity: allocatable.clone(),
                allocatable,
                initialized: false,
                requirements: Some(c.spec.requirements.clone()),
                provider_id: c.status.provider_id.clone(),
                ..Node::default()
            });
        }
        nodes
    }

    /// Pods planned onto capacity earlier (`held`: each pod and the node or NodeClaim it was
    /// planned onto), each as bound there: those still pending, not in `skip` (pods being
    /// solved now), whose capacity is among `nodes` (what [`Snapshot::capacity_nodes`] gave).
    /// A NodeClaim whose node joined is that node, matched as `capacity_nodes` matches it (by
    /// provider id, then by the claim's node name). A solve given these does not plan other
    /// pods onto capacity they are on their way to; holds on capacity gone count for nothing.
    pub fn held_as_bound(&self, held: &[(PodKey, String)], skip: &HashSet<PodKey>, nodes: &[Node]) -> Vec<Arc<Pod>> {
        if held.is_empty() || nodes.is_empty() {
            return Vec::new();
        }
        let capacity: FastSet<&str> = nodes.iter().map(|n| n.name.as_str()).collect();
        let by_provider: FastMap<&str, &str> =
            nodes.iter().filter_map(|n| Some((n.provider_id.as_deref()?, n.name.as_str()))).collect();
        let mut out = Vec::new();
        for (key, node) in held {
            if skip.contains(key) {
                continue;
            }
            let Some(pod) = self.pods.get(key).filter(|p| p.node_name.is_none() && !p.terminal) else { continue };
            let claim = self.nodeclaims.get(node);
            let joined = claim
                .and_then(|c| c.status.provider_id.as_deref())
                .and_then(|p| by_provider.get(p).copied())
                .or_else(|| claim.and_then(|c| c.status.node_name.as_deref()));
            let Some(on) = joined.into_iter().chain([node.as_str()]).find(|n| capacity.contains(n)) else { continue };
            let mut p = pod.as_ref().clone();
            p.node_name = Some(on.to_string());
            out.push(Arc::new(p));
        }
        out
    }

    /// Pods on their way off their node: those that must move (see
    /// [`crate::disruption::candidates::is_reschedulable`]) from a node being disrupted, that
    /// is deleting or tainted `karpenter.sh/disrupted` (a command holds it). Karpenter's
    /// provisioner simulates them with the pending pods ("pods on nodes marked for deletion").
    pub fn pods_to_move(&self) -> Vec<&Arc<Pod>> {
        let going: FastSet<&str> = self.nodes.values().filter(|n| n.is_disrupting()).map(|n| n.name.as_str()).collect();
        if going.is_empty() {
            return Vec::new();
        }
        self.pods
            .values()
            .filter(|p| {
                p.node_name.as_deref().is_some_and(|n| going.contains(n))
                    && crate::disruption::candidates::is_reschedulable(p)
            })
            .collect()
    }

    /// One key per node and per NodeClaim (its kind and name, hashed), with whether it is
    /// being deleted: what a pending pod may have been counted against. A key gone since an
    /// earlier look, or newly marked for deletion, means capacity went away, so the pods counted
    /// against it need placing again.
    pub fn capacity_keys(&self) -> impl Iterator<Item = (u64, bool)> + '_ {
        let key = |kind: u8, name: &str| {
            let mut h = std::hash::DefaultHasher::new();
            kind.hash(&mut h);
            name.hash(&mut h);
            h.finish()
        };
        let nodes = self.nodes.values().map(move |n| (key(0, &n.name), n.deleting));
        let claims = self.nodeclaims.values().map(move |c| (key(1, &c.name), c.deleting));
        nodes.chain(claims)
    }

    /// The solver's input over this cluster: `nodes` (chosen by the caller), every bound pod and
    /// every DaemonSet, with `pools` to launch from.
    pub fn scheduling_input(
        &self,
        nodes: Vec<Node>,
        pools: Vec<crate::scheduling::PoolInput>,
    ) -> crate::scheduling::Snapshot {
        crate::scheduling::Snapshot {
            nodepools: pools,
            nodes,
            bound_pods: self.pods.values().filter(|p| p.node_name.is_some() && !p.terminal).cloned().collect(),
            daemonsets: self.daemonsets.values().map(|p| p.as_ref().clone()).collect(),
            namespaces: self.namespaces.clone(),
        }
    }

    /// Pods bound to `node`.
    pub fn pods_on<'a>(&'a self, node: &'a str) -> impl Iterator<Item = &'a Arc<Pod>> {
        self.pods.values().filter(move |p| p.node_name.as_deref() == Some(node))
    }

    /// Bound pods by node, in one pass (for callers that look at many nodes; every planning
    /// round of every pool builds it over every pod, so it is hashed, not ordered).
    pub fn pods_by_node(&self) -> FastMap<&str, Vec<&Arc<Pod>>> {
        let mut out: FastMap<&str, Vec<&Arc<Pod>>> =
            FastMap::with_capacity_and_hasher(self.nodes.len(), Default::default());
        for p in self.pods.values() {
            if let Some(n) = p.node_name.as_deref() {
                out.entry(n).or_default().push(p);
            }
        }
        out
    }

    /// Nodes by provider id.
    pub fn nodes_by_provider_id(&self) -> FastMap<&str, &Arc<Node>> {
        self.nodes.values().filter_map(|n| Some((n.provider_id.as_deref()?, n))).collect()
    }
}

/// A change to a node that adds or removes single items, so that what others wrote stays.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct NodePatch {
    pub add_taints: Vec<Taint>,
    /// Removed by key and effect.
    pub remove_taints: Vec<Taint>,
    /// Set (added or replaced).
    pub labels: Vec<(String, String)>,
    pub add_finalizers: Vec<String>,
    pub remove_finalizers: Vec<String>,
    /// Made owned by this NodeClaim (an ownerReference).
    pub owner_claim: Option<String>,
}

impl NodePatch {
    /// The node with the patch applied, or `None` when it changes nothing (no write needed).
    pub fn apply(&self, node: &Node) -> Option<Node> {
        let mut n = node.clone();
        n.taints.retain(|t| !self.remove_taints.iter().any(|r| r.key == t.key && r.effect == t.effect));
        for t in &self.add_taints {
            if !n.taints.iter().any(|x| x.key == t.key && x.effect == t.effect) {
                n.taints.push(t.clone());
            }
        }
        for (k, v) in &self.labels {
            n.labels.insert(k.clone(), v.clone());
        }
        n.finalizers.retain(|f| !self.remove_finalizers.contains(f));
        for f in &self.add_finalizers {
            if !n.finalizers.contains(f) {
                n.finalizers.push(f.clone());
            }
        }
        if self.owner_claim.is_some() {
            n.owner_claim.clone_from(&self.owner_claim);
        }
        (n != *node).then_some(n)
    }

    pub fn is_empty(&self) -> bool {
        self.add_taints.is_empty()
            && self.remove_taints.is_empty()
            && self.labels.is_empty()
            && self.add_finalizers.is_empty()
            && self.remove_finalizers.is_empty()
            && self.owner_claim.is_none()
    }
}

/// A change to a NodeClaim's status (the status subresource): fields set when given,
/// conditions set by kind; everything else stays as read.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct StatusPatch {
    pub provider_id: Option<String>,
    pub node_name: Option<String>,
    pub capacity: Option<ResourceList>,
    pub allocatable: Option<ResourceList>,
    pub conditions: Vec<Condition>,
}

impl StatusPatch {
    /// The status with the patch applied, or `None` when it changes nothing.
    pub fn apply(&self, status: &NodeClaimStatus) -> Option<NodeClaimStatus> {
        // Every reconcile asks this of every claim, and most patches change nothing: that is
        // answered without copying the status.
        if !self.changes(status) {
            return None;
        }
        let mut s = status.clone();
        if let Some(p) = &self.provider_id {
            s.provider_id = Some(p.clone());
        }
        if let Some(n) = &self.node_name {
            s.node_name = Some(n.clone());
        }
        if let Some(c) = &self.capacity {
            s.capacity = c.clone();
        }
        if let Some(a) = &self.allocatable {
            s.allocatable = a.clone();
        }
        for c in &self.conditions {
            s.set_condition(c.clone());
        }
        (s != *status).then_some(s)
    }

    /// Whether applying the patch would change `status` (each condition compared with the
    /// one of its kind it would replace; of two of one kind in the patch, the last counts).
    fn changes(&self, status: &NodeClaimStatus) -> bool {
        let differs = |new: &Option<String>, old: &Option<String>| new.is_some() && new != old;
        differs(&self.provider_id, &status.provider_id)
            || differs(&self.node_name, &status.node_name)
            || self.capacity.as_ref().is_some_and(|c| *c != status.capacity)
            || self.allocatable.as_ref().is_some_and(|a| *a != status.allocatable)
            || self.conditions.iter().enumerate().any(|(i, c)| {
                !self.conditions[i + 1..].iter().any(|later| later.kind == c.kind)
                    && status.condition(&c.kind) != Some(c)
            })
    }
}

/// The kind of object an event is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum ObjectKind {
    Pod,
    Node,
    NodeClaim,
    NodePool,
}

/// A Kubernetes Event (Karpenter's reasons).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Event {
    pub kind: ObjectKind,
    /// `namespace/name` for pods, the name otherwise.
    pub name: String,
    pub warning: bool,
    pub reason: String,
    pub message: String,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::ResourceName;
    use crate::taints::Effect;

    #[test]
    fn percentages_round_up() {
        assert_eq!(IntOrPercent::Percent(50).of(3), 2);
        assert_eq!(IntOrPercent::Percent(10).of(10), 1);
        assert_eq!(IntOrPercent::Percent(0).of(10), 0);
        assert_eq!(IntOrPercent::Int(2).of(10), 2);
        assert_eq!(IntOrPercent::Percent(i32::MAX).of(i32::MAX), i32::MAX, "saturates");
    }

    /// A patch that changes nothing is answered without copying the status; every other
    /// answer is the status with the patch applied, as before: over every combination of a
    /// few statuses and patches, `apply` says what copying, applying and comparing says.
    #[test]
    fn a_status_patch_changes_a_status_exactly_when_applying_it_to_a_copy_does() {
        let by_copy = |p: &StatusPatch, status: &NodeClaimStatus| {
            let mut s = status.clone();
            if let Some(v) = &p.provider_id {
                s.provider_id = Some(v.clone());
            }
            if let Some(v) = &p.node_name {
                s.node_name = Some(v.clone());
            }
            if let Some(v) = &p.capacity {
                s.capacity = v.clone();
            }
            if let Some(v) = &p.allocatable {
                s.allocatable = v.clone();
            }
            for c in &p.conditions {
                s.set_condition(c.clone());
            }
            (s != *status).then_some(s)
        };
        let unmet = |kind: &str| Condition { status: false, ..Condition::met(kind) };
        let cpu = |m: i64| ResourceList::from_pairs([(ResourceName::Cpu, m)]);
        let mut statuses = vec![NodeClaimStatus::default()];
        for pid in [None, Some("aws:///a/i-1")] {
            for node in [None, Some("n1")] {
                for conditions in
                    [vec![], vec![Condition::met("Launched")], vec![unmet("Launched"), unmet("Registered")]]
                {
                    statuses.push(NodeClaimStatus {
                        provider_id: pid.map(String::from),
                        node_name: node.map(String::from),
                        capacity: cpu(1_000),
                        allocatable: cpu(900),
                        conditions,
                    });
                }
            }
        }
        let mut patches = vec![StatusPatch::default()];
        for pid in [None, Some("aws:///a/i-1"), Some("aws:///a/i-2")] {
            for node in [None, Some("n1"), Some("n2")] {
                for capacity in [None, Some(cpu(1_000)), Some(cpu(2_000))] {
                    for conditions in [
                        vec![],
                        vec![Condition::met("Launched")],
                        vec![unmet("Launched"), Condition::met("Launched")],
                        vec![Condition::met("Launched"), unmet("Launched")],
                        vec![Condition::met("Registered")],
                    ] {
                        patches.push(StatusPatch {
                            provider_id: pid.map(String::from),
                            node_name: node.map(String::from),
                            allocatable: capacity.clone().map(|c| c.subtracted(&cpu(100))),
                            capacity: capacity.clone(),
                            conditions,
                        });
                    }
                }
            }
        }
        let mut changed = 0;
        for status in &statuses {
            for patch in &patches {
                let want = by_copy(patch, status);
                changed += usize::from(want.is_some());
                assert_eq!(patch.apply(status), want, "{patch:?} on {status:?}");
            }
        }
        assert!(changed > 0 && changed < statuses.len() * patches.len(), "both answers are covered: {changed}");
    }

    #[test]
    fn a_node_patch_adds_and_removes_single_items_and_keeps_the_rest() {
        let node = Node {
            name: "n".into(),
            taints: vec![
                Taint::new(UNREGISTERED_TAINT, "", Effect::NoExecute),
                Taint::new("node.kubernetes.io/not-ready", "", Effect::NoSchedule),
            ],
            ..Node::default()
        };
        let patch = NodePatch {
            remove_taints: vec![Taint::new(UNREGISTERED_TAINT, "", Effect::NoExecute)],
            labels: vec![("karpenter.sh/registered".into(), "true".into())],
            add_finalizers: vec![TERMINATION_FINALIZER.into()],
            ..NodePatch::default()
        };
        let after = patch.apply(&node).expect("changed");
        assert_eq!(after.taints.len(), 1, "the lifecycle controller's taint stays");
        assert_eq!(after.taints[0].key, "node.kubernetes.io/not-ready");
        assert_eq!(after.finalizers, vec![TERMINATION_FINALIZER.to_string()]);
        assert_eq!(patch.apply(&after), None, "applied twice changes nothing");
    }

    fn claim(name: &str, provider_id: Option<&str>, node_name: Option<&str>) -> Arc<NodeClaim> {
        Arc::new(NodeClaim {
            name: name.into(),
            spec: NodeClaimSpec {
                taints: vec![Taint::new("team", "a", Effect::NoSchedule)],
                startup_taints: vec![Taint::new("cni/booting", "", Effect::NoSchedule)],
                ..NodeClaimSpec::default()
            },
            finalizers: Vec::new(),
            deleting: false,
            status: NodeClaimStatus {
                provider_id: provider_id.map(Into::into),
                node_name: node_name.map(Into::into),
                ..NodeClaimStatus::default()
            },
            resource_version: 1,
            created: None,
        })
    }

    /// Held pods count where they were planned while pending: on an in-flight claim as
    /// itself, on a claim that joined as its node (found by provider id before the claim names
    /// it); not once bound, deleted, finished, being solved again, or when their capacity went.
    #[test]
    fn held_pods_are_bound_to_their_capacity_only_while_it_and_they_are_there() {
        let mut snap = Snapshot::default();
        snap.nodeclaims.insert("flying".into(), claim("flying", Some("aws:///z/i-1"), None));
        snap.nodeclaims.insert("joined".into(), claim("joined", Some("aws:///z/i-2"), None));
        let node =
            Node { name: "ip-2".into(), provider_id: Some("aws:///z/i-2".into()), ready: true, ..Node::default() };
        snap.nodes.insert("ip-2".into(), Arc::new(node));
        let pod = |name: &str, on: Option<&str>, terminal: bool| {
            let mut p = Pod::new("default", name, ResourceList::new());
            p.node_name = on.map(Into::into);
            p.terminal = terminal;
            Arc::new(p)
        };
        for p in [
            pod("a", None, false),
            pod("b", None, false),
            pod("c", Some("ip-2"), false),
            pod("e", None, false),
            pod("f", None, false),
            pod("g", None, true),
        ] {
            snap.pods.insert(p.key.clone(), p);
        }
        let key = |n: &str| PodKey::new("default", n);
        let held: Vec<(PodKey, String)> = [
            ("a", "flying"), // in flight: as the claim
            ("b", "joined"), // joined: as its node
            ("c", "flying"), // bound meanwhile
            ("d", "flying"), // deleted
            ("e", "gone"),   // its claim went
            ("f", "flying"), // being solved again
            ("g", "flying"), // finished
        ]
        .iter()
        .map(|(p, n)| (key(p), n.to_string()))
        .collect();
        let skip: HashSet<PodKey> = [key("f")].into_iter().collect();
        let nodes = snap.capacity_nodes();
        let bound: Vec<(String, Option<String>)> = snap
            .held_as_bound(&held, &skip, &nodes)
            .iter()
            .map(|p| (p.key.name.clone(), p.node_name.clone()))
            .collect();
        assert_eq!(bound, vec![("a".into(), Some("flying".into())), ("b".into(), Some("ip-2".into()))]);
        assert!(snap.held_as_bound(&held, &skip, &[]).is_empty(), "no capacity, nothing held");
    }

    /// A node that joined (Ready, as the agent and kubelets make them) and is not yet
    /// initialized is in flight: counted once whether or not its NodeClaim names it yet, and
    /// neither its boot taints nor its claim's startup taints keep pods off it; its claim's own
    /// taints do. Initialized, every taint it has counts. A claim whose node is being deleted
    /// is no capacity.
    #[test]
    fn a_joined_node_is_capacity_in_flight_until_initialized_and_counted_once() {
        let booting = vec![
            Taint::new(UNREGISTERED_TAINT, "", Effect::NoExecute),
            Taint::new("node.kubernetes.io/not-ready", "", Effect::NoSchedule),
            Taint::new("cni/booting", "", Effect::NoSchedule),
            Taint::new("team", "a", Effect::NoSchedule),
        ];
        let node = |name: &str, pid: &str, initialized: bool, deleting: bool| {
            Arc::new(Node {
                name: name.into(),
                provider_id: Some(pid.into()),
                taints: booting.clone(),
                ready: true,
                initialized,
                deleting,
                ..Node::default()
            })
        };
        let mut snap = Snapshot::default();
        // a: joined, its claim does not name it yet (found by provider id).
        snap.nodeclaims.insert("a".into(), claim("a", Some("aws:///z/i-a"), None));
        snap.nodes.insert("ip-a".into(), node("ip-a", "aws:///z/i-a", false, false));
        // b: joined and registered, initialized.
        snap.nodeclaims.insert("b".into(), claim("b", Some("aws:///z/i-b"), Some("ip-b")));
        snap.nodes.insert("ip-b".into(), node("ip-b", "aws:///z/i-b", true, false));
        // c: launched, no node yet.
        snap.nodeclaims.insert("c".into(), claim("c", Some("aws:///z/i-c"), None));
        // d: its node is being deleted.
        snap.nodeclaims.insert("d".into(), claim("d", Some("aws:///z/i-d"), Some("ip-d")));
        snap.nodes.insert("ip-d".into(), node("ip-d", "aws:///z/i-d", true, true));
        // z: no NodeClaim (not managed), NotReady: not in flight, its taints count.
        let lost = Node { ready: false, ..node("ip-z", "aws:///z/i-z", false, false).as_ref().clone() };
        snap.nodes.insert("ip-z".into(), Arc::new(lost));

        let nodes = snap.capacity_nodes();
        let names: Vec<&str> = nodes.iter().map(|n| n.name.as_str()).collect();
        assert_eq!(names, ["ip-a", "ip-b", "ip-z", "c"], "each joined node once, as itself; none for a node going");
        assert!(nodes[2].effective_taints().iter().any(|t| t.key == "node.kubernetes.io/not-ready"), "a lost node");
        let keys = |n: &Node| n.effective_taints().into_iter().map(|t| t.key).collect::<Vec<_>>();
        assert_eq!(keys(&nodes[0]), ["team"], "in flight: only the claim's own taints");
        assert_eq!(keys(&nodes[1]), booting.iter().map(|t| t.key.clone()).collect::<Vec<_>>(), "initialized: all");
        assert_eq!(keys(&nodes[3]), ["team"]);
    }

    #[test]
    fn a_status_patch_sets_conditions_by_kind() {
        let mut status = NodeClaimStatus::default();
        status.set_condition(Condition::met("Launched"));
        let patch = StatusPatch {
            node_name: Some("n".into()),
            conditions: vec![Condition::met("Registered")],
            ..StatusPatch::default()
        };
        let after = patch.apply(&status).expect("changed");
        assert!(after.is("Launched") && after.is("Registered"));
        assert_eq!(patch.apply(&after), None);
    }
}
