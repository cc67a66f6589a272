//! Series read at scrape time from the cluster's view: Karpenter's node, pod and NodePool
//! gauges, and dovetail's error counts. Nothing is kept between scrapes, so a node that is
//! gone has no series left behind.

use std::collections::BTreeMap;
use std::sync::Arc;

use dovetail_cluster::ClusterView;
use dovetail_core::cluster::Snapshot;
use dovetail_core::labels;
use dovetail_core::resources::{ResourceList, ResourceName};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::DescriptorEncoder;
use prometheus_client::metrics::MetricType;

use super::{Labels, Metrics};
use crate::errors::Errors;

/// Karpenter's gauges of the cluster's state, from the view at each scrape.
pub struct ClusterState {
    pub view: Arc<dyn ClusterView>,
    /// Served only while this is true (the control node leads, as only Karpenter's leader
    /// serves them: several replicas must not each report the cluster); always when `None`.
    pub leading: Option<Arc<std::sync::atomic::AtomicBool>>,
}

impl std::fmt::Debug for ClusterState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ClusterState")
    }
}

/// A resource's amount in Karpenter's unit: cores for CPU, bytes and counts otherwise.
fn amount(name: &ResourceName, v: i64) -> f64 {
    match name {
        ResourceName::Cpu => v as f64 / 1000.0,
        _ => v as f64,
    }
}

fn gauge(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    rows: impl IntoIterator<Item = (Labels, f64)>,
) -> Result<(), std::fmt::Error> {
    let mut family = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
    for (labels, value) in rows {
        family.encode_family(&labels)?.encode_gauge(&value)?;
    }
    Ok(())
}

/// The labels Karpenter puts on a node's series.
fn node_labels(node: &dovetail_core::node::Node, nodepool: &str) -> Labels {
    let label = |k: &str| node.labels.get(k).cloned().unwrap_or_default();
    vec![
        ("node_name", node.name.clone()),
        ("nodepool", nodepool.to_string()),
        ("instance_type", label(labels::INSTANCE_TYPE)),
        ("capacity_type", label(labels::CAPACITY_TYPE)),
        ("zone", label(labels::ZONE)),
        ("arch", label(labels::ARCH)),
    ]
}

/// Pool of a node: its `karpenter.sh/nodepool` label (empty for nodes of no NodePool).
fn pool_of(node: &dovetail_core::node::Node) -> String {
    node.labels.get(labels::NODEPOOL).cloned().unwrap_or_default()
}

fn by_resource(base: &Labels, list: &ResourceList) -> Vec<(Labels, f64)> {
    list.iter()
        .map(|(r, v)| {
            let mut l = base.clone();
            l.push(("resource_type", r.as_str().to_string()));
            (l, amount(r, v))
        })
        .collect()
}

impl ClusterState {
    fn encode_snapshot(
        &self,
        s: &Snapshot,
        synced: bool,
        encoder: &mut DescriptorEncoder,
    ) -> Result<(), std::fmt::Error> {
        gauge(
            encoder,
            "karpenter_cluster_state_synced",
            "1 when the controller's view of the cluster has listed every kind once, else 0",
            [(Vec::new(), if synced { 1.0 } else { 0.0 })],
        )?;
        // Per node: allocatable, and what its pods and daemons request.
        let mut requests: BTreeMap<&str, (ResourceList, ResourceList)> = BTreeMap::new();
        for p in s.pods.values().filter(|p| !p.terminal) {
            if let Some(n) = p.node_name.as_deref() {
                let e = requests.entry(n).or_default();
                if p.daemon { e.1.add(&p.requests) } else { e.0.add(&p.requests) }
            }
        }
        let mut allocatable = Vec::new();
        let mut pod_requests = Vec::new();
        let mut daemon_requests = Vec::new();
        for n in s.nodes.values() {
            let base = node_labels(n, &pool_of(n));
            allocatable.extend(by_resource(&base, &n.allocatable));
            if let Some((pods, daemons)) = requests.get(n.name.as_str()) {
                pod_requests.extend(by_resource(&base, pods));
                daemon_requests.extend(by_resource(&base, daemons));
            }
        }
        gauge(encoder, "karpenter_nodes_allocatable", "Node allocatable, by node and resource type", allocatable)?;
        gauge(
            encoder,
            "karpenter_nodes_total_pod_requests",
            "Requests of the pods bound to the node (DaemonSet pods apart), by node and resource type",
            pod_requests,
        )?;
        gauge(
            encoder,
            "karpenter_nodes_total_daemon_requests",
            "Requests of the DaemonSet pods bound to the node, by node and resource type",
            daemon_requests,
        )?;
        // One series per pod, as Karpenter's pods_state.
        let pods = s.pods.values().filter(|p| !p.terminal).map(|p| {
            let node = p.node_name.as_deref().and_then(|n| s.nodes.get(n));
            let label = |k: &str| node.and_then(|n| n.labels.get(k).cloned()).unwrap_or_default();
            let phase = match (&p.node_name, p.started_at) {
                (Some(_), Some(_)) => "Running",
                _ => "Pending",
            };
            let labels: Labels = vec![
                ("name", p.key.name.clone()),
                ("namespace", p.key.namespace.clone()),
                ("node", p.node_name.clone().unwrap_or_default()),
                ("nodepool", label(labels::NODEPOOL)),
                ("zone", label(labels::ZONE)),
                ("arch", label(labels::ARCH)),
                ("capacity_type", label(labels::CAPACITY_TYPE)),
                ("instance_type", label(labels::INSTANCE_TYPE)),
                ("phase", phase.to_string()),
            ];
            (labels, 1.0)
        });
        gauge(
            encoder,
            "karpenter_pods_state",
            "Pod state: one series per pod, labelled with its node and phase",
            pods,
        )?;
        gauge(
            encoder,
            "karpenter_scheduler_queue_depth",
            "Pods waiting for a node: not bound, marked unschedulable by the scheduler, not gated",
            [(Vec::new(), s.provisionable().count() as f64)],
        )?;
        // NodePools: their limits, and what their NodeClaims hold (capacity once launched,
        // requests until then), as the ledger counts usage.
        let mut limits = Vec::new();
        for p in s.nodepools.values() {
            limits.extend(by_resource(&vec![("nodepool", p.name.clone())], &p.limits));
        }
        gauge(encoder, "karpenter_nodepools_limit", "The NodePool's limits, by resource type", limits)?;
        let mut usage: BTreeMap<&str, ResourceList> =
            s.nodepools.keys().map(|k| (k.as_str(), ResourceList::new())).collect();
        for c in s.nodeclaims.values() {
            let held = if c.status.capacity.is_empty() { &c.spec.requests } else { &c.status.capacity };
            usage.entry(c.spec.nodepool.as_str()).or_default().add(held);
        }
        let usage = usage.into_iter().flat_map(|(p, u)| by_resource(&vec![("nodepool", p.to_string())], &u));
        gauge(encoder, "karpenter_nodepools_usage", "What the NodePool's NodeClaims hold, by resource type", usage)?;
        Ok(())
    }
}

impl Collector for ClusterState {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        if self.leading.as_ref().is_some_and(|l| !l.load(std::sync::atomic::Ordering::SeqCst)) {
            return Ok(());
        }
        let s = self.view.snapshot();
        self.encode_snapshot(&s, self.view.synced(), &mut encoder)
    }
}

/// `dovetail_errors_total`: every error the plane met, by action and kind.
pub struct ErrorCounts(pub Arc<Errors>);

impl std::fmt::Debug for ErrorCounts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ErrorCounts")
    }
}

impl Collector for ErrorCounts {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let mut family = encoder.encode_descriptor(
            "dovetail_errors",
            "Errors the control plane met (each logged with its object), by action and kind",
            None,
            MetricType::Counter,
        )?;
        for (key, n) in self.0.counts() {
            let (action, kind) = key.split_once('/').unwrap_or((key.as_str(), ""));
            let labels: Labels = vec![("action", action.to_string()), ("kind", kind.to_string())];
            family.encode_family(&labels)?.encode_counter::<Labels, u64, f64>(&n, None)?;
        }
        Ok(())
    }
}

/// Counts the nodes of dovetail's NodePools that join and leave the cluster
/// (`karpenter_nodes_created_total`, `karpenter_nodes_terminated_total`), from the view's
/// changes, at most once a `every`.
pub async fn follow_nodes(view: Arc<dyn ClusterView>, metrics: Arc<Metrics>, every: std::time::Duration) {
    let mut changes = view.changes();
    let mut known: Option<BTreeMap<String, String>> = None;
    loop {
        if view.synced() {
            let s = view.snapshot();
            let now: BTreeMap<String, String> = s
                .nodes
                .values()
                .filter(|n| n.labels.contains_key(labels::NODEPOOL))
                .map(|n| (n.name.clone(), pool_of(n)))
                .collect();
            // The first synced view is the baseline: nodes there joined before.
            if let Some(before) = &known {
                let mut per_pool: BTreeMap<&str, (u64, u64)> = BTreeMap::new();
                for (name, pool) in &now {
                    if !before.contains_key(name) {
                        per_pool.entry(pool).or_default().0 += 1;
                    }
                }
                for (name, pool) in before {
                    if !now.contains_key(name) {
                        per_pool.entry(pool).or_default().1 += 1;
                    }
                }
                for (pool, (created, terminated)) in per_pool {
                    metrics.nodes_changed(pool, created, terminated);
                }
            }
            known = Some(now);
        }
        if changes.changed().await.is_err() {
            return;
        }
        tokio::time::sleep(every).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dovetail_cluster::sim::SimCluster;

    #[test]
    fn the_state_series_come_from_the_view_at_scrape_time() {
        let cluster = Arc::new(SimCluster::new());
        let m = Metrics::new();
        m.collect(ClusterState { view: cluster.clone(), leading: None });
        let text = m.encode();
        assert!(text.contains("# TYPE karpenter_nodes_allocatable gauge\n"), "{text}");
        assert!(text.contains("# TYPE karpenter_pods_state gauge\n"), "{text}");
        assert!(text.contains("karpenter_scheduler_queue_depth 0"), "{text}");
    }

    #[test]
    fn a_node_and_its_pods_are_read_with_karpenters_labels_and_only_by_the_leader() {
        use dovetail_core::node::Node;
        use dovetail_core::pod::{Pod, PodKey};
        let cluster = Arc::new(SimCluster::new());
        let mut node = Node { name: "n1".into(), ready: true, ..Node::default() };
        node.labels.insert(labels::NODEPOOL.into(), "default".into());
        node.labels.insert(labels::INSTANCE_TYPE.into(), "m5.large".into());
        node.allocatable = ResourceList::cpu_mem(1_930, 7 << 30);
        cluster.apply_node(node);
        let pod = |name: &str, on: Option<&str>| Pod {
            key: PodKey::new("default", name),
            requests: ResourceList::cpu_mem(500, 1 << 30),
            node_name: on.map(str::to_string),
            ..Pod::default()
        };
        cluster.apply_pod(pod("bound", Some("n1")));
        // Marked unschedulable by kube-scheduler: what waits for a node.
        cluster.apply_pod(Pod { unschedulable: true, ..pod("pending", None) });
        let leading = Arc::new(std::sync::atomic::AtomicBool::new(true));
        let m = Metrics::new();
        m.collect(ClusterState { view: cluster.clone(), leading: Some(leading.clone()) });
        let text = m.encode();
        let sum = |series: &str, l: &[(&str, &str)]| super::super::sum_of(&text, series, l);
        let alloc =
            [("node_name", "n1"), ("nodepool", "default"), ("instance_type", "m5.large"), ("resource_type", "cpu")];
        assert_eq!(sum("karpenter_nodes_allocatable", &alloc), 1.93, "{text}");
        assert_eq!(sum("karpenter_nodes_total_pod_requests", &[("node_name", "n1"), ("resource_type", "cpu")]), 0.5);
        assert_eq!(sum("karpenter_pods_state", &[("name", "bound"), ("node", "n1"), ("nodepool", "default")]), 1.0);
        assert_eq!(sum("karpenter_scheduler_queue_depth", &[]), 1.0, "the pending pod: {text}");
        // A control node that does not lead serves none of the cluster's state.
        leading.store(false, std::sync::atomic::Ordering::SeqCst);
        let follower = m.encode();
        assert!(
            !follower.contains("karpenter_nodes_allocatable") && !follower.contains("karpenter_pods_state"),
            "{follower}"
        );
    }
}
