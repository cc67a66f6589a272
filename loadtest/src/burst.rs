//! The interruption burst's side of a run: the sim's events forwarded to a real SQS queue
//! (`--sqs-endpoint`), and the burst's figures for the report.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use dovetail_actors::interruption::GetInterruptionStats;
use dovetail_actors::plane::Plane;
use dovetail_cloud::sim::SimCloud;
use dovetail_cluster::ClusterView;
use dovetail_cluster::sim::SimCluster;
use dovetail_core::clock::{DEFAULT_EPOCH, to_millis};
use dovetail_core::plane::Latencies;
use dovetail_raft::Ledger;

use crate::run::Percentiles;

/// Forwards what the sim's EC2 sends to its queue to `to` (as EventBridge would), every 50 ms
/// until `stop`; up to eight SendMessageBatch calls at once. A send that fails is logged and
/// its messages are lost to the run (the burst's report counts them lost).
pub(crate) async fn forward(
    from: Arc<dovetail_cloud::sim::SimQueue>,
    to: Arc<dovetail_cloud::aws::SqsQueue>,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    const IN_FLIGHT: usize = 8;
    loop {
        let bodies = from.take_all();
        let mut sends = tokio::task::JoinSet::new();
        for chunk in bodies.chunks(10) {
            if sends.len() >= IN_FLIGHT {
                log_send(sends.join_next().await);
            }
            let (to, chunk) = (to.clone(), chunk.to_vec());
            sends.spawn(async move { to.send(&chunk).await.map_err(|e| (chunk.len(), e)) });
        }
        while let Some(done) = sends.join_next().await {
            log_send(Some(done));
        }
        tokio::select! {
            changed = stop.changed() => if changed.is_err() || *stop.borrow() { return },
            () = tokio::time::sleep(Duration::from_millis(50)) => {}
        }
    }
}

/// A forwarding send's end: done, or how many messages it could not send and why.
type Sent = Result<Result<(), (usize, dovetail_cloud::CloudError)>, tokio::task::JoinError>;

fn log_send(done: Option<Sent>) {
    match done {
        Some(Ok(Err((n, e)))) => tracing::warn!(messages = n, error = %e, "loadtest.sqs: not forwarded"),
        Some(Err(e)) => tracing::warn!(error = %e, "loadtest.sqs: a forwarding task failed"),
        Some(Ok(Ok(()))) | None => {}
    }
}

/// The burst's figures (none without one): its rate, the instances handled from the first
/// message sent to the last deleted (on the wall clock only; with messages lost it says how
/// fast the handled ones went, not the burst), each instance's time from its message to its first
/// replacement's launch (the cloud's record of it, kept after the instance went), and per
/// instance whether it was handled: recorded in the ledger as acting, its replacements sized,
/// its node tainted (or drained and gone already); the rest are lost.
pub(crate) async fn counts(
    (burst_sent, launched): (&BTreeMap<String, u64>, &BTreeMap<String, u64>),
    (plane, ledger, cloud, cluster): (&Plane, &dyn Ledger, &SimCloud, &SimCluster),
    realtime: bool,
) -> Option<crate::report::BurstCounts> {
    let first = *burst_sent.values().min()?;
    let epoch = to_millis(DEFAULT_EPOCH);
    let stats = plane.interruption.as_ref()?.send(GetInterruptionStats).await.ok()?;
    let messages = burst_sent.len() as u64;
    let span_ms = stats.last_deleted.saturating_sub(epoch).saturating_sub(first).max(1);
    let launched = launched.clone();
    let sent = burst_sent.clone();
    let read = dovetail_raft::read_with(ledger, move |s| {
        let mut to_launch = Latencies::default();
        let mut sized: Vec<String> = Vec::new();
        let mut recorded = 0u64;
        for (instance, at) in &sent {
            let Some(r) = s.interruption(instance) else { continue };
            recorded += 1;
            if r.acts && r.sized {
                sized.push(instance.clone());
            }
            if let Some(first_launch) = r.replacements.iter().filter_map(|c| launched.get(c)).min() {
                to_launch.record(first_launch.saturating_sub(*at));
            }
        }
        (to_launch, recorded, sized)
    })
    .await;
    let (to_launch, recorded, sized) = match read {
        Ok(r) => r,
        Err(e) => {
            tracing::warn!(error = %e, "loadtest.burst: the ledger could not be read");
            (Latencies::default(), 0, Vec::new())
        }
    };
    // Tainted, or gone: by the node of the instance's provider id.
    let snap = cluster.snapshot();
    let taint = dovetail_core::plane::disrupted_taint();
    let nodes = snap.nodes_by_provider_id();
    let provider: BTreeMap<String, String> =
        cloud.instances().iter().map(|i| (i.id.clone(), dovetail_actors::kubelet::provider_id(i))).collect();
    let handled = sized
        .iter()
        .filter(|i| match provider.get(*i).and_then(|p| nodes.get(p.as_str())) {
            None => true,
            Some(n) => n.taints.iter().any(|t| t.key == taint.key && t.effect == taint.effect),
        })
        .count() as u64;
    Some(crate::report::BurstCounts {
        messages,
        handled,
        lost: messages.saturating_sub(handled),
        handled_per_second: realtime.then(|| handled as f64 * 1000.0 / span_ms as f64),
        sent_to_launch: Percentiles::of(&to_launch),
        recorded,
        left_in_queue: cloud.queue().len() as u64,
    })
}
