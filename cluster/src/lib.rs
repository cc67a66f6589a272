//! The Kubernetes seam of dovetail.
//!
//! [`ClusterView`] is what the control plane reads: a consistent [`Snapshot`] of pods, nodes,
//! NodeClaims, NodePools, DaemonSets and PDBs at one resource version, a "synced" signal (the
//! initial lists are in) and change notifications (a watch of the resource version). It is
//! shaped so that kube-runtime reflectors can fill it: each watch event replaces one object
//! and bumps the version. [`ClusterWriter`] is what the control plane changes: NodeClaims
//! (created by name, so a duplicate create is refused), their status, node taints, labels and
//! cordon, evictions (refused while a PDB allows no disruption) and deletes with finalizers.
//!
//! [`sim::SimCluster`] implements both in memory; the kube implementation comes later.

pub mod sim;
mod types;

use std::sync::Arc;

pub use types::{Condition, IntOrPercent, NodeClaim, NodeClaimStatus, Pdb, Snapshot};

use dovetail_core::pod::PodKey;
use dovetail_core::taints::Taint;

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
    /// The object changed since it was read.
    #[error("{kind} {name} changed since it was read")]
    Conflict { kind: &'static str, name: String },
    #[error("cluster unavailable: {reason}")]
    Unavailable { reason: String },
}

/// The read side.
pub trait ClusterView: Send + Sync {
    /// Everything at one resource version. Cheap: objects are shared, not copied.
    fn snapshot(&self) -> Arc<Snapshot>;
    /// Whether the initial lists of every kind are in.
    fn synced(&self) -> bool;
    /// Notified with the resource version after every change.
    fn changes(&self) -> tokio::sync::watch::Receiver<u64>;
}

/// The write side. Every method is one API call; none retries.
pub trait ClusterWriter: Send + Sync {
    /// Creates a NodeClaim named `claim.name`; a second create of the name is `AlreadyExists`.
    fn create_nodeclaim(&self, claim: NodeClaim) -> Result<u64, ClusterError>;
    /// Replaces a NodeClaim's status (conditions, provider id, node name).
    fn update_nodeclaim_status(&self, name: &str, status: NodeClaimStatus) -> Result<u64, ClusterError>;
    /// Marks a NodeClaim for deletion; it goes once its finalizers are removed.
    fn delete_nodeclaim(&self, name: &str) -> Result<u64, ClusterError>;
    /// Removes one finalizer of a NodeClaim (deleting it if it was marked and none are left).
    fn remove_nodeclaim_finalizer(&self, name: &str, finalizer: &str) -> Result<u64, ClusterError>;
    /// Sets a node's taints.
    fn set_node_taints(&self, node: &str, taints: Vec<Taint>) -> Result<u64, ClusterError>;
    /// Adds or replaces node labels.
    fn label_node(&self, node: &str, labels: &[(String, String)]) -> Result<u64, ClusterError>;
    /// Sets `spec.unschedulable`.
    fn cordon(&self, node: &str, unschedulable: bool) -> Result<u64, ClusterError>;
    /// Evicts a pod through the eviction API: refused while a PDB selecting it allows no
    /// disruption.
    fn evict(&self, pod: &PodKey) -> Result<u64, ClusterError>;
    /// Deletes a pod directly, bypassing PDBs (a drain past its terminationGracePeriod).
    fn delete_pod(&self, pod: &PodKey) -> Result<u64, ClusterError>;
    /// Deletes a node object.
    fn delete_node(&self, node: &str) -> Result<u64, ClusterError>;
}
