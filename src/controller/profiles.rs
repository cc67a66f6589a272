//! Garbage collection of the instance profiles dovetail manages for EC2NodeClasses (those
//! naming a role): a profile whose class is gone and that no NodeClaim names any more is
//! deleted, as Karpenter's instance profile garbage collection.
//!
//! It runs as a task of its own on the leader's term, never in the NodePools' sync: it waits
//! on IAM, and a new leader's first decisions waited for it while it ran inside its first sync
//! (1.3-1.4 s on moto late in the 20-round HA run, docs/benchmarks.md).

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use dovetail_cloud::aws::AwsProvider;
use dovetail_cluster::ClusterView;
use dovetail_cluster::kube::KubeCluster;
use dovetail_core::clock::Clock;
use dovetail_raft::Ledger;

/// How often a pass looks whether a collection is due.
const PASS_EVERY: Duration = Duration::from_secs(5);

/// The collection's memory within a term.
struct ProfileCollector {
    aws: Arc<AwsProvider>,
    /// When the managed instance profiles were last collected, and the classes kept then (one
    /// of them gone makes the next collection due).
    collected: Option<(u64, BTreeSet<String>)>,
    /// When the last collection failed (the next waits).
    failed_at: Option<u64>,
}

impl ProfileCollector {
    /// One pass: the collection if it is due (never collected in this term, a class kept at
    /// the last one gone, or 30 min passed), and not within 5 min of a failure.
    async fn pass(&mut self, cluster: &KubeCluster, now: u64, current: &(dyn Fn() -> bool + Send + Sync)) {
        const EVERY_MS: u64 = 30 * 60 * 1000;
        const AFTER_FAILURE_MS: u64 = 5 * 60 * 1000;
        // Never on a view that is not synced, nor while a NodeClaim cannot be read (it may name
        // a class): a class missing from such a view is not gone.
        if let Some(at) = self.failed_at
            && now.saturating_sub(at) < AFTER_FAILURE_MS
        {
            return;
        }
        let invalid = cluster.invalid();
        if !cluster.synced() || invalid.keys().any(|k| k.starts_with("NodeClaim ")) {
            return;
        }
        let mut keep: BTreeSet<String> = cluster.nodeclasses().keys().cloned().collect();
        // A class that fails validation still exists.
        keep.extend(invalid.keys().filter_map(|k| k.strip_prefix("EC2NodeClass ")).map(str::to_string));
        keep.extend(cluster.pools_and_claims().nodeclaims.values().map(|nc| nc.spec.node_class.name.clone()));
        let due = match &self.collected {
            None => true,
            Some((at, kept)) => now.saturating_sub(*at) >= EVERY_MS || !kept.is_subset(&keep),
        };
        if !due {
            return;
        }
        let collected =
            tokio::time::timeout(Duration::from_secs(60), self.aws.collect_instance_profiles(&keep, current)).await;
        let failed = match collected {
            Ok(Ok(deleted)) => {
                if !deleted.is_empty() {
                    tracing::info!(deleted = deleted.len(), "instance profiles of gone EC2NodeClasses deleted");
                }
                self.collected = Some((now, keep));
                self.failed_at = None;
                return;
            }
            Ok(Err(e)) => e.to_string(),
            Err(_) => "it took over 60 s".to_string(),
        };
        tracing::warn!(error = %failed, "collecting the instance profiles of gone EC2NodeClasses failed; asked again in 5 min");
        self.failed_at = Some(now);
    }
}

/// Runs the collection for `term`: a pass every 5 s, the first 5 s into the term; nothing is
/// deleted once this node no longer leads in it (checked before each deletion too).
pub async fn follow(
    aws: Arc<AwsProvider>,
    cluster: Arc<KubeCluster>,
    ledger: Arc<dyn Ledger>,
    clock: Arc<dyn Clock>,
    term: u64,
) {
    let mut collector = ProfileCollector { aws, collected: None, failed_at: None };
    let watch = ledger.leadership();
    let current = move || watch.borrow().is_current(term);
    loop {
        tokio::time::sleep(PASS_EVERY).await;
        if current() {
            collector.pass(&cluster, clock.now_millis(), &current).await;
        }
    }
}
