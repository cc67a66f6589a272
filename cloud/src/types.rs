//! The domain types of the cloud seam.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

pub use dovetail_core::ledger::LaunchBatch;

use dovetail_core::catalog::{CapacityType, InstanceType};
use dovetail_core::labels::Labels;
use dovetail_core::requirements::Operator;
use dovetail_core::resources::ResourceList;

/// Tag carrying the NodeClaim's name: how a re-launch finds the instance it already made.
pub const TAG_NODECLAIM: &str = "karpenter.sh/nodeclaim";
/// Tag carrying the launch batch an instance was made by: how a re-drive finds what a call
/// made before its per-claim tags were written.
pub const TAG_LAUNCH_BATCH: &str = "dovetail.dev/launch-batch";
/// Tag carrying the NodePool's name.
pub const TAG_NODEPOOL: &str = "karpenter.sh/nodepool";
/// Prefix of the cluster ownership tag, `kubernetes.io/cluster/<name>` = `owned`.
pub const TAG_CLUSTER_PREFIX: &str = "kubernetes.io/cluster/";

/// One offering: an instance type in a zone with a capacity type.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct OfferingKey {
    pub instance_type: String,
    pub zone: String,
    pub capacity_type: CapacityType,
}

impl fmt::Display for OfferingKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}:{}", self.capacity_type.as_str(), self.instance_type, self.zone)
    }
}

/// What the caller resolved of an EC2NodeClass (the AWS provider resolves the rest itself).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct NodeClass {
    pub name: String,
    /// Subnet selector terms: tag maps and ids, ORed.
    pub subnet_selector: Vec<BTreeMap<String, String>>,
    pub security_group_selector: Vec<BTreeMap<String, String>>,
    /// `amiSelectorTerms`: an alias (`al2023@latest`), or tags/ids/names.
    pub ami_alias: Option<String>,
    pub ami_selector: Vec<BTreeMap<String, String>>,
    /// `spec.role`: the AWS provider manages an instance profile for it.
    pub role: Option<String>,
    /// `spec.instanceProfile`, set on the launch template.
    pub instance_profile: Option<String>,
    pub tags: BTreeMap<String, String>,
    /// Hash of the spec, for drift.
    pub hash: String,
}

/// A NodeClaim to launch in one zone.
#[derive(Clone, Debug, PartialEq)]
pub struct LaunchRequest {
    /// The NodeClaim's name: the idempotency key.
    pub claim: String,
    /// The launch batch the ledger recorded the claim in before the call: its id tags every
    /// instance the call makes and derives the call's client token; its claims are who the
    /// batch's untagged instances are assigned to on a re-drive.
    pub batch: LaunchBatch,
    pub nodepool: String,
    pub node_class: NodeClass,
    /// The zone the caller chose.
    pub zone: String,
    /// Candidate types, cheapest first; the provider picks among them.
    pub instance_types: Vec<String>,
    /// Allowed capacity types; spot is preferred when allowed.
    pub capacity_types: Vec<CapacityType>,
    /// Labels the node will carry besides the type's own.
    pub labels: Labels,
    /// Extra tags (the node class's and the user's).
    pub tags: BTreeMap<String, String>,
}

/// A claim whose instance is looked for (by its tag, or among its batch's untagged ones).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Lookup {
    pub claim: String,
    pub batch: Option<LaunchBatch>,
}

/// The lifecycle of an instance as the cloud reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InstanceState {
    Pending,
    Running,
    /// Stopping or stopped: still the cluster's (Karpenter keeps it), not serving.
    Stopped,
    ShuttingDown,
    Terminated,
}

/// A launched instance.
#[derive(Clone, Debug, PartialEq)]
pub struct Instance {
    pub id: String,
    /// The NodeClaim it was launched for (from its tag), if any.
    pub claim: Option<String>,
    pub instance_type: String,
    pub zone: String,
    pub capacity_type: CapacityType,
    /// $/hour of its offering.
    pub price: f64,
    /// The node's labels as the provider knows them (type labels, zone, capacity type, pool).
    pub labels: Labels,
    pub capacity: ResourceList,
    pub allocatable: ResourceList,
    pub state: InstanceState,
    /// When it was launched, on the cloud's clock.
    pub launched_at: Duration,
    pub tags: BTreeMap<String, String>,
    /// The image it runs (for drift).
    pub image: String,
    /// The node class hash it was launched with (for drift).
    pub node_class_hash: String,
}

/// Why an instance drifted from its node class.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DriftReason {
    /// The AMI the node class selects changed.
    Image,
    /// The node class spec changed.
    NodeClass,
    /// Its subnet or security groups are no longer selected.
    Network,
}

impl DriftReason {
    /// Karpenter's AWS provider's reason, as the NodeClaim's `Drifted` condition says it.
    pub fn as_str(&self) -> &'static str {
        match self {
            DriftReason::Image => "AMIDrift",
            DriftReason::NodeClass => "NodeClassDrift",
            DriftReason::Network => "SubnetDrift",
        }
    }
}

/// A message of the interruption queue.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QueueMessage {
    pub id: String,
    /// Handle for delete/visibility; changes with every receive.
    pub receipt: String,
    /// The EventBridge event, as JSON.
    pub body: String,
    /// When it was sent to the queue, milliseconds since the Unix epoch (SQS's
    /// `SentTimestamp`; on the cloud's clock for the sim), when the queue says.
    pub sent: Option<u64>,
}

/// The labels an instance type gives its nodes: every requirement with exactly one value.
pub(crate) fn type_labels(it: &InstanceType) -> Labels {
    let mut labels = Labels::new();
    for (k, req) in it.requirements.iter() {
        if req.operator() == Operator::In && req.values().len() == 1 {
            labels.insert(k.to_string(), req.values()[0].clone());
        }
    }
    labels
}

/// Requests one CreateFleet call can carry together (same zone, batch, types, capacity types,
/// node class, pool, labels and tags).
pub fn same_shape(a: &LaunchRequest, b: &LaunchRequest) -> bool {
    a.zone == b.zone
        && a.batch.id == b.batch.id
        && a.instance_types == b.instance_types
        && a.capacity_types == b.capacity_types
        && a.node_class == b.node_class
        && a.nodepool == b.nodepool
        && a.labels == b.labels
        && a.tags == b.tags
}

/// Assigns a batch's untagged instances to its claims that have none, deterministically, so
/// that every re-drive agrees whatever it groups: the claims in the batch's order, the
/// instances by id. Returns `(instance index, claim)` pairs.
pub(crate) fn assign_untagged<'a>(
    batch: &'a LaunchBatch,
    has_instance: impl Fn(&str) -> bool,
    untagged: &[&str],
) -> Vec<(usize, &'a str)> {
    let mut order: Vec<usize> = (0..untagged.len()).collect();
    order.sort_by(|a, b| untagged[*a].cmp(untagged[*b]));
    let claims = batch.claims.iter().map(String::as_str).filter(|c| !has_instance(c));
    order.into_iter().zip(claims).collect()
}

/// The requests still `open`, grouped by [`same_shape`], in first-arrival order.
pub(crate) fn group_identical(requests: &[LaunchRequest], open: impl Fn(usize) -> bool) -> Vec<Vec<usize>> {
    let mut groups: Vec<Vec<usize>> = Vec::new();
    for i in (0..requests.len()).filter(|&i| open(i)) {
        match groups.iter_mut().find(|g| same_shape(&requests[g[0]], &requests[i])) {
            Some(g) => g.push(i),
            None => groups.push(vec![i]),
        }
    }
    groups
}
