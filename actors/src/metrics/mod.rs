//! Prometheus metrics: Karpenter's series under Karpenter's names, types, labels and buckets
//! where dovetail's meaning is the same, and dovetail's own under `dovetail_*`.
//!
//! Events (a NodeClaim created, a cloud call, a message received, a proposal committed) are
//! counted where they happen, through the [`Metrics`] the plane is given. The cluster's state
//! (nodes, pods, NodePool usage) is read from the cluster's view at scrape time
//! ([`state::ClusterState`]), so a gauge is never stale. `encode` writes the Prometheus text
//! format (0.0.4), which `promtool check metrics` lints and every scraper reads.
//!
//! Karpenter series whose names Prometheus's own lint refuses (gauges ending in `_count`,
//! `karpenter_cluster_utilization_percent`) are not served; docs/operations.md lists them
//! with the dovetail series to use instead.

pub mod budgets;
pub mod cost;
pub mod metered;
mod register;
pub mod state;
mod text;

pub use text::{sum_of, to_prometheus_text};

use std::sync::Mutex;
use std::sync::atomic::AtomicU64;

use prometheus_client::collector::Collector;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

/// A series' labels, in the order Karpenter lists them.
pub type Labels = Vec<(&'static str, String)>;

type Histograms = Family<Labels, Histogram, fn() -> Histogram>;

/// Karpenter's `DurationBuckets` (seconds), used by its duration histograms.
pub const DURATION_BUCKETS: [f64; 36] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 3.5,
    4.0, 4.5, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 15.0, 20.0, 25.0, 30.0, 40.0, 50.0, 60.0,
];

fn duration_histogram() -> Histogram {
    Histogram::new(DURATION_BUCKETS)
}

/// Every series dovetail counts as things happen, and the registry that serves them with the
/// scrape-time collectors.
#[derive(Debug)]
pub struct Metrics {
    registry: Mutex<Registry>,
    nodeclaims_created: Family<Labels, Counter>,
    nodeclaims_terminated: Family<Labels, Counter>,
    nodeclaims_disrupted: Family<Labels, Counter>,
    nodes_created: Family<Labels, Counter>,
    nodes_terminated: Family<Labels, Counter>,
    disruption_decisions: Family<Labels, Counter>,
    scheduling_duration: Histograms,
    provisioner_scheduling_duration: Histogram,
    cloud_duration: Histograms,
    cloud_errors: Family<Labels, Counter>,
    launch_failures: Family<Labels, Counter>,
    interruption_received: Family<Labels, Counter>,
    interruption_deleted: Counter,
    interruption_unmatched: Counter,
    interruption_queue_duration: Histogram,
    proposals: Family<Labels, Counter>,
    proposal_duration: Histograms,
    commit_index: Gauge,
    failovers: Counter,
    collected: Counter,
    collected_claims: Counter,
    collected_nodes: Counter,
    cost_ratio: Gauge<f64, AtomicU64>,
    effects_in_flight: Gauge,
    effects_running: Gauge,
    /// Karpenter's disruption budget gauges, set by the NodePool actors.
    pub budgets: budgets::BudgetGauges,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

impl Metrics {
    fn lock(&self) -> std::sync::MutexGuard<'_, Registry> {
        self.registry.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Adds a collector read at every scrape (the cluster's state, the errors, the ledger).
    pub fn collect(&self, collector: impl Collector) {
        self.lock().register_collector(Box::new(collector));
    }

    /// The scrape: every series in the Prometheus text format (0.0.4).
    pub fn encode(&self) -> String {
        let mut open_metrics = String::new();
        if let Err(e) = prometheus_client::encoding::text::encode_registry(&mut open_metrics, &self.lock()) {
            // Only a collector's formatting fails here; what was written is served.
            tracing::warn!(error = %e, "encoding the metrics failed part way");
        }
        to_prometheus_text(&open_metrics)
    }

    /// A NodeClaim created (`reason`: `provisioned`, a disruption reason, or `interrupted`).
    pub fn nodeclaim_created(&self, nodepool: &str, reason: &str) {
        let labels = vec![
            ("reason", reason.to_string()),
            ("nodepool", nodepool.to_string()),
            ("min_values_relaxed", "false".into()),
        ];
        self.nodeclaims_created.get_or_create(&labels).inc();
    }

    /// A NodeClaim whose instance is gone and whose finalizer was removed.
    pub fn nodeclaim_terminated(&self, nodepool: &str, capacity_type: &str) {
        let labels = vec![("nodepool", nodepool.to_string()), ("capacity_type", capacity_type.to_string())];
        self.nodeclaims_terminated.get_or_create(&labels).inc();
    }

    /// A NodeClaim disrupted (voluntarily, or by an interruption).
    pub fn nodeclaim_disrupted(&self, reason: &str, nodepool: &str, capacity_type: &str) {
        let labels = vec![
            ("reason", reason.to_string()),
            ("nodepool", nodepool.to_string()),
            ("capacity_type", capacity_type.to_string()),
        ];
        self.nodeclaims_disrupted.get_or_create(&labels).inc();
    }

    /// Nodes of a pool that joined or left the cluster.
    pub fn nodes_changed(&self, nodepool: &str, created: u64, terminated: u64) {
        let labels = vec![("nodepool", nodepool.to_string())];
        if created > 0 {
            self.nodes_created.get_or_create(&labels).inc_by(created);
        }
        if terminated > 0 {
            self.nodes_terminated.get_or_create(&labels).inc_by(terminated);
        }
    }

    /// A disruption command committed.
    pub fn disruption_decision(&self, decision: &str, reason: &str, consolidation_type: &str) {
        let labels = vec![
            ("decision", decision.to_string()),
            ("reason", reason.to_string()),
            ("consolidation_type", consolidation_type.to_string()),
        ];
        self.disruption_decisions.get_or_create(&labels).inc();
    }

    /// One scheduling simulation of the provisioner (the Router's solve).
    pub fn scheduling(&self, seconds: f64) {
        self.scheduling_duration.get_or_create(&vec![("controller", "provisioner".to_string())]).observe(seconds);
        self.provisioner_scheduling_duration.observe(seconds);
    }

    /// One cloud provider call, with its error kind when it failed.
    pub fn cloud_call(&self, method: &str, provider: &str, seconds: f64, error: Option<&str>) {
        let mut labels = vec![
            ("controller", controller_of(method).to_string()),
            ("method", method.to_string()),
            ("provider", provider.to_string()),
        ];
        self.cloud_duration.get_or_create(&labels).observe(seconds);
        if let Some(error) = error {
            labels.push(("error", error.to_string()));
            self.cloud_errors.get_or_create(&labels).inc();
        }
    }

    /// A launch that failed, by the offering it asked for.
    pub fn launch_failed(&self, zone: &str, capacity_type: &str, reason: &str) {
        let labels = vec![
            ("zone", zone.to_string()),
            ("capacity_type", capacity_type.to_string()),
            ("reason", reason.to_string()),
        ];
        self.launch_failures.get_or_create(&labels).inc();
    }

    /// An interruption message received, by Karpenter's message type.
    pub fn interruption_received(&self, message_type: &str) {
        self.interruption_received.get_or_create(&vec![("message_type", message_type.to_string())]).inc();
    }

    /// Interruption messages deleted from their queue.
    pub fn interruption_deleted(&self, n: u64) {
        self.interruption_deleted.inc_by(n);
    }

    /// Interruption notices dropped: no claim knows their instance.
    pub fn interruption_unmatched(&self, n: u64) {
        self.interruption_unmatched.inc_by(n);
    }

    /// A message's time in its queue: from EC2's sending to its receipt.
    pub fn interruption_queued(&self, seconds: f64) {
        self.interruption_queue_duration.observe(seconds.max(0.0));
    }

    /// A proposal's outcome and its time to commit.
    pub fn proposal(&self, command: &str, outcome: &str, seconds: f64, index: Option<u64>) {
        let labels = vec![("command", command.to_string()), ("outcome", outcome.to_string())];
        self.proposals.get_or_create(&labels).inc();
        if outcome == "committed" {
            self.proposal_duration.get_or_create(&vec![("command", command.to_string())]).observe(seconds);
        }
        if let Some(i) = index.and_then(|i| i64::try_from(i).ok()) {
            // The gauge only goes forward: proposals commit out of order as they return.
            let mut seen = self.commit_index.get();
            while i > seen {
                match self.commit_index.inner().compare_exchange(
                    seen,
                    i,
                    std::sync::atomic::Ordering::Relaxed,
                    std::sync::atomic::Ordering::Relaxed,
                ) {
                    Ok(_) => break,
                    Err(now) => seen = now,
                }
            }
        }
    }

    /// Instances terminated by garbage collection.
    pub fn collected(&self, n: u64) {
        self.collected.inc_by(n);
    }

    /// R of the live fleet, as last computed.
    pub fn set_cost_ratio(&self, r: f64) {
        self.cost_ratio.set(r);
    }

    /// The executor's effects held (`in_flight`) and under way (`running`), each +1 or -1.
    pub fn effects(&self, in_flight: i64, running: i64) {
        self.effects_in_flight.inc_by(in_flight);
        self.effects_running.inc_by(running);
    }

    /// NodeClaims ended by garbage collection (their instance gone).
    pub fn collected_claims(&self, n: u64) {
        self.collected_claims.inc_by(n);
    }

    /// Nodes deleted with the instances garbage collection terminated.
    pub fn collected_nodes(&self, n: u64) {
        self.collected_nodes.inc_by(n);
    }

    /// The ledger's leader changed.
    pub fn failover(&self) {
        self.failovers.inc();
    }

    /// Observations so far of a counter family's series whose labels include all of `labels`
    /// (for tests and reports).
    pub fn count(&self, series: &str, labels: &[(&str, &str)]) -> u64 {
        let text = self.encode();
        sum_of(&text, series, labels) as u64
    }
}

/// The Karpenter controller that makes a cloud provider call of this method.
fn controller_of(method: &str) -> &'static str {
    match method {
        "Create" | "Get" => "nodeclaim.lifecycle",
        "Delete" => "nodeclaim.termination",
        "List" => "nodeclaim.garbagecollection",
        "IsDrifted" => "nodeclaim.disruption",
        _ => "provisioner",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_are_named_with_their_total_suffix_and_no_eof_is_written() {
        let m = Metrics::new();
        m.nodeclaim_created("default", "provisioned");
        m.nodeclaim_created("default", "provisioned");
        m.cloud_call("Create", "aws", 0.2, Some("insufficient_capacity"));
        let text = m.encode();
        assert!(text.contains("# TYPE karpenter_nodeclaims_created_total counter\n"), "{text}");
        assert!(text.contains("# HELP karpenter_nodeclaims_created_total Number of"), "{text}");
        assert!(!text.contains("# EOF") && !text.contains("# UNIT"), "{text}");
        assert!(text.contains("# TYPE karpenter_cloudprovider_duration_seconds histogram\n"), "{text}");
        assert_eq!(m.count("karpenter_nodeclaims_created_total", &[("nodepool", "default")]), 2);
        assert_eq!(m.count("karpenter_nodeclaims_created_total", &[("nodepool", "other")]), 0);
        let errors = &[("method", "Create"), ("error", "insufficient_capacity")];
        assert_eq!(m.count("karpenter_cloudprovider_errors_total", errors), 1);
        assert_eq!(m.count("karpenter_cloudprovider_duration_seconds_count", &[("provider", "aws")]), 1);
    }

    #[test]
    fn the_commit_index_only_goes_forward() {
        let m = Metrics::new();
        m.proposal("reserve", "committed", 0.01, Some(7));
        m.proposal("advance", "committed", 0.01, Some(5));
        assert_eq!(m.count("dovetail_ledger_commit_index", &[]), 7);
        assert_eq!(m.count("dovetail_ledger_proposals_total", &[("command", "reserve")]), 1);
    }
}
