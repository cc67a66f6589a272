//! Garbage collection, as Karpenter's `instance.garbagecollection` and
//! `nodeclaim.garbagecollection`:
//! - instances of dovetail's NodePools (the cluster's tag and `karpenter.sh/nodepool`) that no
//!   NodeClaim knows (a launch whose result was lost, a claim deleted while its launch was
//!   under way) are terminated once older than the grace period, and the Node such an
//!   instance registered is deleted with it. Instances without both tags (a managed node
//!   group's, the controller's own host, anything else) are never touched.
//! - orphaned Nodes (of a NodePool, not Ready, no NodeClaim, their instance not running) are
//!   deleted.
//! - NodeClaims whose instance is gone from the cloud (terminated from the console, reclaimed
//!   without a notice) and whose Node is not Ready are ended: their claim goes to
//!   `Terminating`, and the lifecycle drains what is left, deletes the Node and the NodeClaim.
//!
//! Fenced like every effect: nothing runs before the cluster view has synced (a NodeClaim
//! missing from it may only not be listed yet); the leader proposes the instances to the
//! ledger in its term (`Command::Collect`), the ledger rejects any that a claim holds, that a
//! claim it records is tagged on, or whose launch batch it still records, and only the others
//! are terminated, while the term lasts. NodeClaims are ended by a ledger entry
//! (`Command::Advance`) like any other step.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use dovetail_cloud::{CloudError, CloudProvider, Instance, InstanceState, TAG_LAUNCH_BATCH, TAG_NODEPOOL};
use dovetail_cluster::{ClusterView, ClusterWriter, NodeUpdate};
use dovetail_core::clock::Clock;
use dovetail_core::cluster::{Snapshot, TERMINATION_FINALIZER};
use dovetail_core::ledger::{ClaimState, Collectable, Command, Entry, Outcome, Step, Term};
use dovetail_raft::{Ledger, read_with};

use crate::config::GcConfig;
use crate::errors::Errors;
use crate::metrics::Metrics;

/// What one pass did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Collected {
    /// Instances no NodeClaim knows and older than the grace, proposed.
    pub proposed: usize,
    /// Terminated.
    pub terminated: Vec<String>,
    /// Nodes of terminated instances, and orphaned ones, deleted.
    pub nodes: Vec<String>,
    /// NodeClaims whose instance was gone, ended.
    pub claims: Vec<String>,
}

/// What a pass works with.
pub struct Gc {
    pub cloud: Arc<dyn CloudProvider>,
    pub ledger: Arc<dyn Ledger>,
    pub view: Arc<dyn ClusterView>,
    pub cluster: Arc<dyn ClusterWriter>,
    pub clock: Arc<dyn Clock>,
    pub errors: Arc<Errors>,
    pub metrics: Arc<Metrics>,
    pub cfg: GcConfig,
}

/// The instance id of a provider id (`aws:///<zone>/<instance id>`).
fn instance_of(provider_id: &str) -> Option<&str> {
    provider_id.rsplit('/').next().filter(|id| !id.is_empty())
}

impl Gc {
    /// One pass, if this node leads and the cluster view has synced.
    pub async fn pass(&self) -> Collected {
        let leadership = self.ledger.leadership().borrow().clone();
        if !leadership.leader || !self.view.synced() {
            return Collected::default();
        }
        let term = leadership.term;
        let listed = match self.cloud.list().await {
            Ok(l) => l,
            Err(e) => {
                self.errors.warn("collect_instances", e.kind(), "cloud", &e);
                return Collected::default();
            }
        };
        // Read after the list: a NodeClaim made while listing is seen.
        let snap = self.view.snapshot();
        let (mut out, orphans) = self.collect_instances(term, &listed, &snap).await;
        let gone: Vec<String> = out.terminated.iter().chain(&orphans).cloned().collect();
        out.nodes = self.delete_nodes(term, &gone, &snap).await;
        out.claims = self.end_claims(term, &listed, &snap).await;
        out
    }

    /// Terminates the instances of dovetail's NodePools that no NodeClaim knows, older than
    /// the grace, and finds the orphaned Nodes (of a NodePool, not Ready, no NodeClaim, their
    /// instance not running): both go through one `Collect` entry, and what the ledger lets go
    /// is returned in `terminated` (instances) and `orphans` (the instances of orphaned Nodes,
    /// whose Nodes are deleted).
    async fn collect_instances(&self, term: Term, listed: &[Instance], snap: &Snapshot) -> (Collected, Vec<String>) {
        let now = self.clock.now();
        // What a NodeClaim names, or an object that could not be read (a newer Karpenter's
        // NodeClaim, a Node with a bad field): those still own their instances.
        let mut referenced: BTreeSet<&str> =
            snap.nodeclaims.values().filter_map(|nc| nc.status.provider_id.as_deref().and_then(instance_of)).collect();
        let unreadable: BTreeSet<&str> =
            snap.unreadable.values().filter_map(|u| u.provider_id.as_deref().and_then(instance_of)).collect();
        referenced.extend(unreadable.iter().copied());
        let claim_exists = |c: &str| snap.nodeclaims.contains_key(c) || snap.unreadable_claim(c).is_some();
        // Only what dovetail launched: an instance with the cluster's tag alone (a managed node
        // group's, the controller's own host) is never a candidate.
        let leaked: Vec<Collectable> = listed
            .iter()
            .filter(|i| i.tags.contains_key(TAG_NODEPOOL))
            .filter(|i| matches!(i.state, InstanceState::Pending | InstanceState::Running))
            .filter(|i| now.saturating_sub(i.launched_at) >= self.cfg.grace)
            .filter(|i| !referenced.contains(i.id.as_str()))
            .filter(|i| !i.claim.as_deref().is_some_and(claim_exists))
            .map(|i| Collectable {
                id: i.id.clone(),
                claim: i.claim.clone(),
                batch: i.tags.get(TAG_LAUNCH_BATCH).cloned(),
            })
            .collect();
        let alive: BTreeSet<&str> = listed
            .iter()
            .filter(|i| matches!(i.state, InstanceState::Pending | InstanceState::Running | InstanceState::Stopped))
            .map(|i| i.id.as_str())
            .collect();
        let claimed_nodes: BTreeSet<&str> =
            snap.nodeclaims.values().filter_map(|nc| nc.status.node_name.as_deref()).collect();
        let orphans: Vec<Collectable> = snap
            .nodes
            .values()
            .filter(|n| n.nodepool().is_some() && !n.ready && !claimed_nodes.contains(n.name.as_str()))
            .filter(|n| n.owner_claim.as_deref().is_none_or(|c| !claim_exists(c)))
            .filter_map(|n| n.provider_id.as_deref().and_then(instance_of))
            .filter(|id| !alive.contains(id) && !referenced.contains(id))
            .map(|id| Collectable { id: id.to_string(), claim: None, batch: None })
            .collect();
        if leaked.is_empty() && orphans.is_empty() {
            return (Collected::default(), Vec::new());
        }
        let proposed = leaked.len();
        let leaked_ids: Vec<String> = leaked.iter().map(|c| c.id.clone()).collect();
        let orphan_ids: Vec<String> = orphans.iter().map(|c| c.id.clone()).collect();
        let mut instances = leaked;
        instances.extend(orphans);
        let entry = Entry { term, at: self.clock.now_millis(), command: Command::Collect { instances } };
        let rejected = match self.ledger.propose(entry).await.map(|c| c.outcome) {
            Ok(Outcome::Advanced { rejected }) => rejected,
            Ok(other) => {
                self.errors.note("collect_instances", "refused", "ledger", &format!("{other:?}"));
                return (Collected { proposed, ..Collected::default() }, Vec::new());
            }
            Err(e) => {
                self.errors.warn("collect_instances", "ledger", "ledger", &e);
                return (Collected { proposed, ..Collected::default() }, Vec::new());
            }
        };
        for (id, why) in &rejected {
            tracing::debug!(instance = %id, why = %why, "garbage collection: instance kept");
        }
        let let_go = |ids: Vec<String>| -> Vec<String> {
            ids.into_iter().filter(|id| !rejected.iter().any(|(r, _)| r == id)).collect()
        };
        let (doomed, orphans) = (let_go(leaked_ids), let_go(orphan_ids));
        if !self.ledger.leadership().borrow().is_current(term) {
            return (Collected { proposed, ..Collected::default() }, Vec::new());
        }
        let results = if doomed.is_empty() { Vec::new() } else { self.cloud.terminate(&doomed).await };
        let mut terminated = Vec::new();
        for (id, r) in doomed.into_iter().zip(results) {
            match r {
                Ok(()) => {
                    tracing::info!(instance = %id, "garbage collection: terminated an instance of a NodePool that no NodeClaim knows");
                    terminated.push(id);
                }
                // Gone since it was listed: nothing to do, nothing to count.
                Err(CloudError::NotFound { .. }) => {}
                Err(e) => self.errors.warn("collect_instances", e.kind(), &format!("instance/{id}"), &e),
            }
        }
        self.metrics.collected(terminated.len() as u64);
        (Collected { proposed, terminated, ..Collected::default() }, orphans)
    }

    /// Deletes the Nodes of `gone` instances (those terminated, as Karpenter's instance garbage
    /// collection does, and the orphans'), taking dovetail's termination finalizer off first:
    /// no NodeClaim is there to drain them.
    async fn delete_nodes(&self, term: Term, terminated: &[String], snap: &Snapshot) -> Vec<String> {
        let gone: BTreeSet<&str> = terminated.iter().map(String::as_str).collect();
        let mut deleted = Vec::new();
        for node in snap.nodes.values() {
            let Some(instance) = node.provider_id.as_deref().and_then(instance_of) else { continue };
            if !gone.contains(instance) || !self.ledger.leadership().borrow().is_current(term) {
                continue;
            }
            let object = format!("node/{}", node.name);
            if node.finalizers.iter().any(|f| f == TERMINATION_FINALIZER) {
                let mut update = NodeUpdate::of(node);
                update.finalizers.retain(|f| f != TERMINATION_FINALIZER);
                if let Err(e) = self.cluster.update_node(&node.name, update, node.resource_version).await {
                    self.errors.warn("collect_node", e.kind(), &object, &e);
                    continue;
                }
            }
            match self.cluster.delete_node(&node.name).await {
                Ok(_) => {
                    tracing::info!(node = %node.name, instance, "garbage collection: deleted a node of a NodePool whose instance is gone and that no NodeClaim knew");
                    deleted.push(node.name.clone());
                }
                Err(dovetail_cluster::ClusterError::NotFound { .. }) => {}
                Err(e) => self.errors.warn("collect_node", e.kind(), &object, &e),
            }
        }
        self.metrics.collected_nodes(deleted.len() as u64);
        deleted
    }

    /// Ends the registered claims whose instance the cloud no longer has (absent from the list,
    /// shutting down or terminated; a stopped one is still there, as Karpenter) and whose Node
    /// is not Ready.
    async fn end_claims(&self, term: Term, listed: &[Instance], snap: &Snapshot) -> Vec<String> {
        let alive: BTreeSet<&str> = listed
            .iter()
            .filter(|i| matches!(i.state, InstanceState::Pending | InstanceState::Running | InstanceState::Stopped))
            .map(|i| i.id.as_str())
            .collect();
        let registered = read_with(self.ledger.as_ref(), |st| {
            st.claims()
                .values()
                .filter_map(|c| match &c.state {
                    ClaimState::Registered { instance } | ClaimState::Initialized { instance } => {
                        Some((c.id.clone(), instance.clone()))
                    }
                    _ => None,
                })
                .collect::<Vec<_>>()
        })
        .await;
        let registered = match registered {
            Ok(r) => r,
            Err(e) => {
                self.errors.warn("collect_nodeclaims", "ledger", "ledger", &e);
                return Vec::new();
            }
        };
        let node_ready = |claim: &str| {
            let name = snap.nodeclaims.get(claim).and_then(|nc| nc.status.node_name.clone());
            name.and_then(|n| snap.nodes.get(&n)).is_some_and(|n| n.ready)
        };
        let gone: Vec<(String, String)> =
            registered.into_iter().filter(|(c, i)| !alive.contains(i.as_str()) && !node_ready(c)).collect();
        if gone.is_empty() {
            return Vec::new();
        }
        let steps = gone.iter().map(|(c, _)| (c.clone(), Step::Terminating)).collect();
        let entry = Entry { term, at: self.clock.now_millis(), command: Command::Advance { steps } };
        let rejected = match self.ledger.propose(entry).await.map(|c| c.outcome) {
            Ok(Outcome::Advanced { rejected }) => rejected,
            Ok(other) => {
                self.errors.note("collect_nodeclaims", "refused", "ledger", &format!("{other:?}"));
                return Vec::new();
            }
            Err(e) => {
                self.errors.warn("collect_nodeclaims", "ledger", "ledger", &e);
                return Vec::new();
            }
        };
        let mut ended = Vec::new();
        for (claim, instance) in gone {
            if rejected.iter().any(|(r, _)| *r == claim) {
                continue;
            }
            tracing::info!(nodeclaim = %claim, instance = %instance, "garbage collection: the instance of a NodeClaim is gone from the cloud; the NodeClaim ends");
            ended.push(claim);
        }
        self.metrics.collected_claims(ended.len() as u64);
        ended
    }

    /// Passes until the task is dropped: every 10 s for the first 20 (as Karpenter, so what
    /// a restart leaked goes soon), then every `cfg.every`.
    pub async fn run(self) {
        const EARLY_PASSES: usize = 20;
        let early = self.cfg.every.min(Duration::from_secs(10));
        for n in 0usize.. {
            self.pass().await;
            let every = if n < EARLY_PASSES { early } else { self.cfg.every };
            tokio::time::sleep(every.max(Duration::from_secs(1))).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::instance_of;

    #[test]
    fn a_provider_id_names_its_instance() {
        assert_eq!(instance_of("aws:///us-east-1a/i-0abc"), Some("i-0abc"));
        assert_eq!(instance_of("aws:///us-east-1a/"), None);
    }
}
