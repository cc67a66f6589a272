//! The Kubernetes seam of dovetail.
//!
//! [`ClusterView`] is what the control plane reads: a consistent [`Snapshot`] of pods, nodes,
//! NodeClaims, NodePools, DaemonSets and PDBs at one resource version, a "synced" signal (the
//! initial lists are in) and change notifications (a watch of the resource version). It is
//! shaped so that kube-runtime reflectors can fill it: each watch event replaces one object
//! and bumps the version.
//!
//! [`ClusterWriter`] is what the control plane changes, one API call per method, as futures:
//! NodeClaims created by name (a duplicate create is `AlreadyExists`), reads of one object
//! with its resource version, and writes that carry the resource version they were made from
//! as a precondition (`Conflict` when the object changed since: the caller reads again and
//! re-applies its patch), the status subresource apart from the object, evictions (refused
//! with `DisruptionBudget` while a PDB allows none: HTTP 429), deletes with finalizers, and
//! Events. No method retries.
//!
//! [`sim::SimCluster`] implements both in memory with the same semantics (resource versions,
//! conflicts, the status subresource, finalizers); [`kube::KubeCluster`] implements them on a
//! real API server.

pub mod kube;
pub mod sim;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

pub use dovetail_core::cluster::{
    Condition, Event, IntOrPercent, NodeClaim, NodeClaimStatus, NodePatch, ObjectKind, Pdb, Snapshot, StatusPatch,
};

use dovetail_core::labels::Labels;
use dovetail_core::node::Node;
use dovetail_core::pod::PodKey;
use dovetail_core::taints::Taint;

/// A boxed future, so that the seam stays object safe (`Arc<dyn ClusterWriter>`).
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// What a write can fail with.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ClusterError {
    /// The object exists already (a NodeClaim created twice).
    #[error("{kind} {name} already exists")]
    AlreadyExists { kind: &'static str, name: String },
    #[error("{kind} {name} not found")]
    NotFound { kind: &'static str, name: String },
    /// An eviction a PodDisruptionBudget does not allow now (HTTP 429 in Kubernetes).
    #[error("evicting pod {pod} would violate PodDisruptionBudget {pdb}")]
    DisruptionBudget { pod: String, pdb: String },
    /// An eviction the API refuses because more than one PodDisruptionBudget covers the pod
    /// (HTTP 500 in Kubernetes: "This pod has more than one PodDisruptionBudget, which the
    /// eviction subresource does not support"). It stays refused until the budgets are mended,
    /// so it is backed off like a budget's refusal and reported on the pod.
    #[error("pod {pod} is covered by more than one PodDisruptionBudget, which the eviction API does not support")]
    ManyPdbs { pod: String },
    /// The object changed since it was read (its resource version is not the precondition's).
    #[error("{kind} {name} changed since it was read")]
    Conflict { kind: &'static str, name: String },
    /// The API server asked the client to slow down (HTTP 429 without a PDB).
    #[error("throttled writing {kind} {name}")]
    Throttled { kind: &'static str, name: String },
    #[error("cluster unavailable: {reason}")]
    Unavailable { reason: String },
}

impl ClusterError {
    /// A short name of the error, for counters.
    pub fn kind(&self) -> &'static str {
        match self {
            ClusterError::AlreadyExists { .. } => "already_exists",
            ClusterError::NotFound { .. } => "not_found",
            ClusterError::DisruptionBudget { .. } => "disruption_budget",
            ClusterError::ManyPdbs { .. } => "many_pdbs",
            ClusterError::Conflict { .. } => "conflict",
            ClusterError::Throttled { .. } => "throttled",
            ClusterError::Unavailable { .. } => "unavailable",
        }
    }
}

/// The read side.
pub trait ClusterView: Send + Sync {
    /// Everything at one resource version. Cheap: objects are shared, not copied.
    fn snapshot(&self) -> Arc<Snapshot>;
    /// Whether the initial lists of every kind are in. Until then nothing may act on the
    /// snapshot: an object missing from it may only not be listed yet.
    fn synced(&self) -> bool;
    /// Notified with the resource version after every change.
    fn changes(&self) -> tokio::sync::watch::Receiver<u64>;
}

/// The fields of a node a write sets (from a read and a [`NodePatch`] applied to it).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct NodeUpdate {
    pub labels: Labels,
    pub taints: Vec<Taint>,
    pub finalizers: Vec<String>,
    /// The NodeClaim that owns the node (an ownerReference, written once set).
    pub owner_claim: Option<String>,
}

impl NodeUpdate {
    pub fn of(node: &Node) -> Self {
        NodeUpdate {
            labels: (*node.labels).clone(),
            taints: node.taints.clone(),
            finalizers: node.finalizers.clone(),
            owner_claim: node.owner_claim.clone(),
        }
    }
}

/// The metadata of a NodeClaim a write sets (from a read, changed): its labels merge, its
/// finalizers are replaced.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct NodeClaimUpdate {
    pub labels: Labels,
    pub finalizers: Vec<String>,
}

impl NodeClaimUpdate {
    pub fn of(claim: &NodeClaim) -> Self {
        NodeClaimUpdate { labels: claim.spec.labels.clone(), finalizers: claim.finalizers.clone() }
    }
}

/// The write side. Every method is one API call; none retries. Writes made from a read carry
/// its resource version and fail with `Conflict` when the object changed since.
///
/// A writer may pace its calls (a client's rate limit, a pause a throttled answer asked for):
/// [`ClusterWriter::ready`] waits that out, so a caller that must check something right
/// before a call (the executor's term) checks it after the wait, not before it.
pub trait ClusterWriter: Send + Sync {
    /// Waits until a call made now would be sent without waiting for the writer's pacing
    /// (none, for a writer that does not pace). Takes nothing: a call after it may still wait
    /// briefly if others called in between.
    fn ready(&self) -> BoxFuture<'_, ()> {
        Box::pin(std::future::ready(()))
    }
    /// Creates a NodeClaim named `claim.name`, owned by its NodePool; a second create of the
    /// name is `AlreadyExists`, and a NodePool the writer knows is gone is `NotFound` (kind
    /// `nodepool`: the API server's adapter reads its synced cache; the sim cluster does not
    /// check).
    fn create_nodeclaim(&self, claim: NodeClaim) -> BoxFuture<'_, Result<u64, ClusterError>>;
    /// Reads one NodeClaim (with its resource version).
    fn get_nodeclaim<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<Arc<NodeClaim>, ClusterError>>;
    /// Writes a NodeClaim's status through the status subresource.
    fn update_nodeclaim_status<'a>(
        &'a self,
        name: &'a str,
        status: NodeClaimStatus,
        resource_version: u64,
    ) -> BoxFuture<'a, Result<u64, ClusterError>>;
    /// Writes a NodeClaim's labels (added or changed, none removed) and finalizers; one being
    /// deleted goes once no finalizer is left.
    fn update_nodeclaim_metadata<'a>(
        &'a self,
        name: &'a str,
        update: NodeClaimUpdate,
        resource_version: u64,
    ) -> BoxFuture<'a, Result<u64, ClusterError>>;
    /// Marks a NodeClaim for deletion; it goes once its finalizers are removed.
    fn delete_nodeclaim<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<u64, ClusterError>>;
    /// Reads one node (with its resource version).
    fn get_node<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<Arc<Node>, ClusterError>>;
    /// Writes a node's labels, taints and finalizers; one being deleted goes once no
    /// finalizer is left.
    fn update_node<'a>(
        &'a self,
        name: &'a str,
        update: NodeUpdate,
        resource_version: u64,
    ) -> BoxFuture<'a, Result<u64, ClusterError>>;
    /// Deletes a node (marked for deletion while it has finalizers).
    fn delete_node<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<u64, ClusterError>>;
    /// Evicts a pod through the eviction API: refused while a PDB selecting it allows no
    /// disruption.
    fn evict<'a>(&'a self, pod: &'a PodKey) -> BoxFuture<'a, Result<u64, ClusterError>>;
    /// Deletes a pod directly, bypassing PDBs (a drain past its terminationGracePeriod), with
    /// `grace_seconds` instead of the pod's own grace period when set.
    fn delete_pod<'a>(
        &'a self,
        pod: &'a PodKey,
        grace_seconds: Option<i64>,
    ) -> BoxFuture<'a, Result<u64, ClusterError>>;
    /// Records a Kubernetes Event.
    fn record_event(&self, event: Event) -> BoxFuture<'_, Result<(), ClusterError>>;
}
