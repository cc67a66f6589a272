//! Instance garbage collection, as Karpenter's `instance.garbagecollection`: the instances
//! tagged for the cluster that no claim knows (a launch whose result was lost, a controller
//! replaced mid-launch, an instance made by hand with the cluster's tag) are terminated once
//! older than the grace period. Instances without the cluster's tag are never listed, so never
//! touched.
//!
//! Fenced like every effect: the leader proposes the instances to the ledger in its term
//! (`Command::Collect`), the ledger rejects any that a claim holds or whose launch batch it
//! still records, and only the others are terminated, while the term lasts.

use std::sync::Arc;
use std::time::Duration;

use dovetail_cloud::{CloudError, CloudProvider, InstanceState, TAG_LAUNCH_BATCH};
use dovetail_core::clock::Clock;
use dovetail_core::ledger::{Command, Entry, Outcome};
use dovetail_raft::Ledger;

use crate::config::GcConfig;
use crate::errors::Errors;
use crate::metrics::Metrics;

/// What one pass did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Collected {
    /// Instances no claim knows and older than the grace, proposed.
    pub proposed: usize,
    /// Terminated.
    pub terminated: Vec<String>,
}

/// What a pass works with.
pub struct Gc {
    pub cloud: Arc<dyn CloudProvider>,
    pub ledger: Arc<dyn Ledger>,
    pub clock: Arc<dyn Clock>,
    pub errors: Arc<Errors>,
    pub metrics: Arc<Metrics>,
    pub cfg: GcConfig,
}

impl Gc {
    /// One pass, if this node leads.
    pub async fn pass(&self) -> Collected {
        let leadership = self.ledger.leadership().borrow().clone();
        if !leadership.leader {
            return Collected::default();
        }
        let term = leadership.term;
        let now = self.clock.now();
        let listed = match self.cloud.list().await {
            Ok(l) => l,
            Err(e) => {
                self.errors.warn("collect_instances", e.kind(), "cloud", &e);
                return Collected::default();
            }
        };
        // Instances a claim names by tag are the lifecycle's; the rest, once old enough.
        let candidates: Vec<(String, Option<String>)> = listed
            .iter()
            .filter(|i| matches!(i.state, InstanceState::Pending | InstanceState::Running))
            .filter(|i| i.claim.is_none() && now.saturating_sub(i.launched_at) >= self.cfg.grace)
            .map(|i| (i.id.clone(), i.tags.get(TAG_LAUNCH_BATCH).cloned()))
            .collect();
        if candidates.is_empty() {
            return Collected::default();
        }
        let proposed = candidates.len();
        let ids: Vec<String> = candidates.iter().map(|(id, _)| id.clone()).collect();
        let entry = Entry { term, at: self.clock.now_millis(), command: Command::Collect { instances: candidates } };
        let rejected = match self.ledger.propose(entry).await.map(|c| c.outcome) {
            Ok(Outcome::Advanced { rejected }) => rejected,
            Ok(other) => {
                self.errors.note("collect_instances", "refused", "ledger", &format!("{other:?}"));
                return Collected { proposed, terminated: Vec::new() };
            }
            Err(e) => {
                self.errors.warn("collect_instances", "ledger", "ledger", &e);
                return Collected { proposed, terminated: Vec::new() };
            }
        };
        for (id, why) in &rejected {
            tracing::debug!(instance = %id, why = %why, "garbage collection: instance kept");
        }
        let doomed: Vec<String> = ids.into_iter().filter(|id| !rejected.iter().any(|(r, _)| r == id)).collect();
        if doomed.is_empty() || !self.ledger.leadership().borrow().is_current(term) {
            return Collected { proposed, terminated: Vec::new() };
        }
        let results = self.cloud.terminate(&doomed).await;
        let mut terminated = Vec::new();
        for (id, r) in doomed.into_iter().zip(results) {
            match r {
                Ok(()) => {
                    tracing::info!(instance = %id, "garbage collection: terminated an instance tagged for the cluster that no NodeClaim knows");
                    terminated.push(id);
                }
                // Gone since it was listed: nothing to do, nothing to count.
                Err(CloudError::NotFound { .. }) => {}
                Err(e) => self.errors.warn("collect_instances", e.kind(), &format!("instance/{id}"), &e),
            }
        }
        self.metrics.collected(terminated.len() as u64);
        Collected { proposed, terminated }
    }

    /// A pass every `cfg.every`, until the task is dropped.
    pub async fn run(self) {
        loop {
            self.pass().await;
            tokio::time::sleep(self.cfg.every.max(Duration::from_secs(1))).await;
        }
    }
}
