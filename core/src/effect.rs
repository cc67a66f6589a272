//! Effects: what a planner asks the world to do, as values.
//!
//! A planner returns ledger commands and effects; the actor proposes the commands and hands
//! the effects to the executor only once their intent committed in the current term. Each
//! effect serves one claim (its ledger id) and has a [`Effect::key`]: the executor runs at
//! most one effect of a key at a time, so a planner may ask for the same effect on every
//! reconcile until the world shows it done (effects are idempotent: a patch that changes
//! nothing writes nothing, a second eviction of a pod that is going is harmless).

use crate::cluster::{Event, NodeClaim, NodePatch, StatusPatch};
use crate::ledger::LaunchBatch;
use crate::pod::PodKey;

/// One effect, for one claim.
#[derive(Clone, Debug, PartialEq)]
pub struct Effect {
    /// The claim it serves.
    pub claim: String,
    pub action: Action,
}

/// What to do.
#[derive(Clone, Debug, PartialEq)]
pub enum Action {
    /// Create the NodeClaim object (named by its claim id; an existing one is fine).
    CreateNodeClaim(Box<NodeClaim>),
    /// Patch the claim's NodeClaim status (the status subresource).
    PatchStatus(StatusPatch),
    /// Mark the claim's NodeClaim for deletion (it goes once its finalizer is removed).
    DeleteNodeClaim,
    /// Remove the termination finalizer from the claim's NodeClaim.
    RemoveFinalizer,
    /// A launched claim's NodeClaim: labelled with what it launched as (labels added or
    /// changed, none removed), then its status patched, in that order: a provider id the
    /// cluster shows always comes with the labels that say what the instance is.
    Launched { labels: Vec<(String, String)>, status: StatusPatch },
    /// Patch a node (taints, labels, finalizers: single items added or removed).
    PatchNode { node: String, patch: NodePatch },
    /// Delete a node object.
    DeleteNode { node: String },
    /// Evict a pod through the eviction API (PodDisruptionBudgets respected).
    Evict(PodKey),
    /// Delete a pod, bypassing PDBs (a drain past its terminationGracePeriod, or an
    /// interruption's deadline), with this grace period in seconds (`None`: the pod's own).
    DeletePod { pod: PodKey, grace_seconds: Option<i64> },
    /// Launch the claim's instance in `zone` (a re-drive carries the batch the ledger
    /// recorded, whose instances are looked up first). `again`: a launch call was made for it
    /// before (its launch timeout runs from that call), so it goes ahead of the claims queued
    /// for their first.
    Launch { zone: String, batch: Option<LaunchBatch>, again: bool },
    /// Terminate the claim's instance: the one named, or whatever its batch made for it.
    Terminate { zone: String, instance: Option<String>, batch: Option<LaunchBatch> },
    /// Record a Kubernetes Event.
    Event(Event),
}

impl Effect {
    pub fn new(claim: &str, action: Action) -> Self {
        Effect { claim: claim.to_string(), action }
    }

    /// The executor's deduplication key: one effect of a key in flight at a time.
    pub fn key(&self) -> String {
        let c = &self.claim;
        match &self.action {
            Action::CreateNodeClaim(_) => format!("create/{c}"),
            Action::PatchStatus(_) => format!("status/{c}"),
            Action::DeleteNodeClaim => format!("delete/{c}"),
            Action::RemoveFinalizer => format!("finalizer/{c}"),
            // One status write of a claim at a time, whichever action makes it.
            Action::Launched { .. } => format!("status/{c}"),
            Action::PatchNode { node, .. } => format!("node/{node}"),
            Action::DeleteNode { node } => format!("delete-node/{node}"),
            Action::Evict(p) | Action::DeletePod { pod: p, .. } => format!("pod/{p}"),
            Action::Launch { .. } => format!("launch/{c}"),
            Action::Terminate { .. } => format!("terminate/{c}"),
            Action::Event(e) => format!("event/{c}/{}", e.reason),
        }
    }

    /// A short name of the action, for logs and error counters.
    pub fn kind(&self) -> &'static str {
        match &self.action {
            Action::CreateNodeClaim(_) => "create_nodeclaim",
            Action::PatchStatus(_) => "patch_nodeclaim_status",
            Action::DeleteNodeClaim => "delete_nodeclaim",
            Action::RemoveFinalizer => "remove_nodeclaim_finalizer",
            Action::Launched { .. } => "patch_nodeclaim_launched",
            Action::PatchNode { .. } => "patch_node",
            Action::DeleteNode { .. } => "delete_node",
            Action::Evict(_) => "evict",
            Action::DeletePod { .. } => "delete_pod",
            Action::Launch { .. } => "launch",
            Action::Terminate { .. } => "terminate",
            Action::Event(_) => "event",
        }
    }

    /// Whether the zone actors run it (cloud calls) rather than the cluster executor.
    pub fn is_cloud(&self) -> bool {
        matches!(self.action, Action::Launch { .. } | Action::Terminate { .. })
    }
}
