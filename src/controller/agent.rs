//! The node agent: what kubelets and the cloud's node lifecycle controller would do for a
//! cloud's instances, through the real API. It runs inside `dovetail controller --cloud sim`
//! for the sim's instances, and as `dovetail node-agent` (a test tool, like kwok) for the
//! instances of an EC2 endpoint that launches no real machines (moto), so several control
//! nodes can share one cloud and its instances join the cluster.
//!
//! - An instance launched for a NodeClaim registers as a Node (after the registration delay)
//!   named after the instance, with its `providerID`, the instance's and the NodeClaim's labels,
//!   the NodeClaim's taints and startup taints and `karpenter.sh/unregistered`, its capacity and
//!   allocatable, and a Ready condition. The API server's admission adds
//!   `node.kubernetes.io/not-ready`; the agent removes it as a node lifecycle controller does
//!   for a Ready node.
//! - Its Lease in `kube-node-lease` and its Ready heartbeat are renewed, so a cluster's node
//!   lifecycle controller never finds it unreachable.
//! - Pods bound to it are set Running and Ready; pods deleted on it are removed (what the
//!   kubelet does once their containers stopped).
//! - A Node whose instance is gone is deleted, as the cloud node lifecycle controller does.
//!
//! Only Nodes with the [`SIM_LABEL`] are the agent's: a cluster's other nodes are left alone.
//! The instances are the cloud seam's `list` (every live instance tagged for the cluster);
//! only those launched for a NodeClaim the cluster shows register.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use dovetail_cloud::CloudProvider;
use dovetail_cloud::sim::Restored;
use dovetail_cluster::kube::{KubeCluster, rfc3339, taints_json};
use dovetail_cluster::{ClusterError, ClusterView, ClusterWriter, Snapshot};
use dovetail_core::catalog::CapacityType;
use dovetail_core::clock::Clock;
use dovetail_core::cluster::UNREGISTERED_TAINT;
use dovetail_core::labels;
use dovetail_core::lifecycle::adopt::parse_provider_id;
use dovetail_core::pod::PodKey;
use serde_json::json;

/// The label that marks a Node the node agent made.
pub const SIM_LABEL: &str = "dovetail.sh/sim-node";
const NOT_READY: &str = "node.kubernetes.io/not-ready";

/// How the agent paces itself.
#[derive(Clone, Debug)]
pub struct AgentConfig {
    pub registration_delay_ms: u64,
    /// How often a node's Lease and Ready heartbeat are renewed (kubelet: 10 s).
    pub renew_every_ms: u64,
}

/// Write counters of the agent (kubelet-side requests, apart from dovetail's own).
#[derive(Clone, Debug, Default)]
pub struct AgentStats {
    pub writes: BTreeMap<&'static str, u64>,
    pub errors: BTreeMap<String, u64>,
}

pub struct Agent {
    cluster: Arc<KubeCluster>,
    cloud: Arc<dyn CloudProvider>,
    clock: Arc<dyn Clock>,
    config: AgentConfig,
    /// When each instance (by provider id) was first seen unregistered.
    seen: BTreeMap<String, u64>,
    /// When each node's Lease and heartbeat were last renewed.
    renewed: BTreeMap<String, u64>,
    /// Pods set Running, until the view shows it (one write each).
    started: BTreeSet<PodKey>,
    pub stats: AgentStats,
}

fn quantities(list: &dovetail_core::resources::ResourceList) -> serde_json::Value {
    list.iter().map(|(n, v)| (n.to_string(), json!(n.quantity_of(v).to_string()))).collect()
}

/// The sim's instances as the cluster remembers them: every Node of the agent with a
/// provider id whose NodeClaim exists, and NodeClaims launched but not registered yet.
pub fn remembered(snap: &Snapshot) -> Vec<Restored> {
    let mut out: BTreeMap<String, Restored> = BTreeMap::new();
    let by_provider = snap.nodes_by_provider_id();
    for nc in snap.nodeclaims.values() {
        let Some(provider) = nc.status.provider_id.as_deref() else { continue };
        let Some((zone, id)) = parse_provider_id(provider) else { continue };
        let node = by_provider.get(provider);
        if node.is_some_and(|n| !n.labels.contains_key(SIM_LABEL)) {
            continue;
        }
        let label = |key: &str| {
            node.and_then(|n| n.labels.get(key)).or_else(|| nc.spec.labels.get(key)).cloned().or_else(|| {
                let r = nc.spec.requirements.get_defined(key)?;
                match r.values() {
                    [v] if r.operator() == dovetail_core::requirements::Operator::In => Some(v.clone()),
                    _ => None,
                }
            })
        };
        let (Some(instance_type), Some(capacity_type)) = (label(labels::INSTANCE_TYPE), label(labels::CAPACITY_TYPE))
        else {
            continue;
        };
        let capacity_type = if capacity_type == "spot" { CapacityType::Spot } else { CapacityType::OnDemand };
        out.insert(
            id.to_string(),
            Restored {
                id: id.to_string(),
                claim: nc.name.clone(),
                nodepool: nc.spec.nodepool.clone(),
                instance_type,
                zone: zone.to_string(),
                capacity_type,
                labels: nc.spec.labels.clone(),
            },
        );
    }
    out.into_values().collect()
}

/// The sim's instances as the ledger remembers them: every live claim it records as launched
/// (its instance, zone, type and capacity type); the restore skips those the cluster's Nodes
/// gave it already. A leader that died between its launch's answer and the NodeClaim's status
/// leaves only this record; without it the new leader's sim would never run the instance, and
/// the claim would wait for the registration timeout (on EC2 the instance outlives the
/// leader). Read inside the ledger's read: nothing of the state is cloned but these.
pub fn launched<'a>(
    claims: impl IntoIterator<Item = &'a dovetail_core::ledger::Claim>,
    snap: &Snapshot,
) -> Vec<Restored> {
    claims
        .into_iter()
        .filter(|c| !c.state.is_terminating())
        .filter_map(|c| {
            let instance = c.state.instance()?;
            let (instance_type, capacity_type) = c.launched_as.clone()?;
            let nc = snap.nodeclaims.get(&c.id);
            Some(Restored {
                id: instance.to_string(),
                claim: c.id.clone(),
                nodepool: c.pool.clone(),
                instance_type,
                zone: c.zone.clone(),
                capacity_type,
                labels: nc.map(|nc| nc.spec.labels.clone()).unwrap_or_default(),
            })
        })
        .collect()
}

impl Agent {
    pub fn new(
        cluster: Arc<KubeCluster>,
        cloud: Arc<dyn CloudProvider>,
        clock: Arc<dyn Clock>,
        config: AgentConfig,
    ) -> Self {
        Agent {
            cluster,
            cloud,
            clock,
            config,
            seen: BTreeMap::new(),
            renewed: BTreeMap::new(),
            started: BTreeSet::new(),
            stats: AgentStats::default(),
        }
    }

    fn failed(&mut self, action: &str, object: &str, e: &ClusterError) {
        tracing::warn!(action, object, error = %e, "node agent: {action} {object} failed");
        *self.stats.errors.entry(format!("{action}/{}", e.kind())).or_default() += 1;
    }

    fn wrote(&mut self, what: &'static str) {
        *self.stats.writes.entry(what).or_default() += 1;
    }

    /// One pass over the instances, nodes and pods.
    pub async fn step(&mut self) {
        if !self.cluster.synced() {
            return;
        }
        let instances = match self.cloud.list().await {
            Ok(i) => i,
            Err(e) => {
                // Throttled or unreachable: the next pass lists again.
                tracing::warn!(error = %e, "node agent: listing the cloud's instances failed");
                *self.stats.errors.entry(format!("list/{}", e.kind())).or_default() += 1;
                return;
            }
        };
        let snap = self.cluster.snapshot();
        let now = self.clock.now_millis();
        let live: BTreeSet<String> = instances.iter().map(dovetail_actors::kubelet::provider_id).collect();
        self.seen.retain(|p, _| live.contains(p));
        let nodes = snap.nodes_by_provider_id();
        let mut sim_nodes: BTreeSet<String> = BTreeSet::new();
        // Heartbeats and registrations are written many at once (a kubelet each, as a
        // cluster's kubelets do): one at a time, a pass over 2,000 nodes took tens of seconds
        // and new nodes waited behind the heartbeats of old ones.
        let mut renewals: Vec<String> = Vec::new();
        let mut creates: Vec<(String, k8s_openapi::api::core::v1::Node)> = Vec::new();
        for node in snap.nodes.values().filter(|n| n.labels.contains_key(SIM_LABEL)) {
            let ours = node.provider_id.as_ref().is_some_and(|p| live.contains(p));
            if !ours {
                if !node.deleting {
                    let name = node.name.clone();
                    match self.cluster.delete_node(&name).await {
                        Ok(_) | Err(ClusterError::NotFound { .. }) => self.wrote("node_delete"),
                        Err(e) => self.failed("delete", &format!("node {name}"), &e),
                    }
                    if let Err(e) = self.cluster.delete_lease(&name).await
                        && !matches!(e, ClusterError::NotFound { .. })
                    {
                        self.failed("delete", &format!("lease {name}"), &e);
                    }
                }
                continue;
            }
            sim_nodes.insert(node.name.clone());
            if node.taints.iter().any(|t| t.key == NOT_READY) {
                let taints = taints_json(node.taints.iter().filter(|t| t.key != NOT_READY));
                let patch = json!({
                    "metadata": { "resourceVersion": node.resource_version.to_string() },
                    "spec": { "taints": taints },
                });
                match self.cluster.patch_node_raw(&node.name, &patch).await {
                    Ok(_) => self.wrote("node_taints"),
                    // Changed since read (dovetail registering it): the next pass reads it again.
                    Err(ClusterError::Conflict { .. }) => {}
                    Err(e) => self.failed("untaint", &format!("node {}", node.name), &e),
                }
            }
            let due =
                self.renewed.get(&node.name).is_none_or(|at| now.saturating_sub(*at) >= self.config.renew_every_ms);
            if due || !node.ready {
                renewals.push(node.name.clone());
            }
        }
        self.renewed.retain(|n, _| sim_nodes.contains(n));
        for inst in &instances {
            let provider = dovetail_actors::kubelet::provider_id(inst);
            if nodes.contains_key(provider.as_str()) {
                continue;
            }
            let Some(claim) = inst.claim.as_ref().and_then(|c| snap.nodeclaims.get(c)) else { continue };
            let since = *self.seen.entry(provider.clone()).or_insert(now);
            if now.saturating_sub(since) < self.config.registration_delay_ms {
                continue;
            }
            let name = format!("ip-{}", inst.id);
            let mut node_labels = inst.labels.clone();
            node_labels.extend(claim.spec.labels.iter().map(|(k, v)| (k.clone(), v.clone())));
            node_labels.insert(labels::NODEPOOL.to_string(), claim.spec.nodepool.clone());
            node_labels.insert(labels::HOSTNAME.to_string(), name.clone());
            node_labels.insert(SIM_LABEL.to_string(), "true".to_string());
            let unregistered =
                dovetail_core::taints::Taint::new(UNREGISTERED_TAINT, "", dovetail_core::taints::Effect::NoExecute);
            let taints = taints_json(claim.spec.taints.iter().chain(&claim.spec.startup_taints).chain([&unregistered]));
            let time = rfc3339(now);
            let body = json!({
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": { "name": name, "labels": node_labels },
                "spec": { "providerID": provider, "taints": taints },
                "status": {
                    "capacity": quantities(&inst.capacity),
                    "allocatable": quantities(&inst.allocatable),
                    "conditions": [ready_condition(&time)],
                },
            });
            match serde_json::from_value(body) {
                Ok(node) => creates.push((name, node)),
                Err(e) => self.failed(
                    "register",
                    &format!("node {name}"),
                    &ClusterError::Unavailable { reason: e.to_string() },
                ),
            }
        }
        // New nodes first: they hold pods waiting for capacity.
        let cluster = &self.cluster;
        let registered = at_once(creates.into_iter().map(|(name, node)| {
            let cluster = cluster.clone();
            async move {
                let r = match cluster.create_node(&node).await {
                    Ok(_) | Err(ClusterError::AlreadyExists { .. }) => Ok(()),
                    Err(e) => Err(e),
                };
                (name, r)
            }
        }))
        .await;
        for (name, r) in registered {
            match r {
                Ok(()) => {
                    self.wrote("node_create");
                    renewals.insert(0, name);
                }
                Err(e) => self.failed("register", &format!("node {name}"), &e),
            }
        }
        self.pods(&snap, &sim_nodes, now).await;
        let cluster = &self.cluster;
        let renewed = at_once(renewals.into_iter().map(|name| {
            let cluster = cluster.clone();
            async move {
                let r = renew(&cluster, &name, now).await;
                (name, r)
            }
        }))
        .await;
        for (name, r) in renewed {
            match r {
                Ok(()) => {
                    self.wrote("node_status");
                    self.wrote("lease");
                    self.renewed.insert(name, now);
                }
                Err((action, e)) => self.failed(action, &format!("node {name}"), &e),
            }
        }
    }

    /// Pods on the agent's nodes: started once bound, removed once deleted.
    async fn pods(&mut self, snap: &Snapshot, sim_nodes: &BTreeSet<String>, now: u64) {
        let time = rfc3339(now);
        self.started.retain(|k| snap.pods.get(k).is_some_and(|p| p.started_at.is_none()));
        let mut starts: Vec<PodKey> = Vec::new();
        for pod in snap.pods.values() {
            let Some(node) = pod.node_name.as_deref() else { continue };
            if !sim_nodes.contains(node) {
                continue;
            }
            if pod.deleting {
                match self.cluster.delete_pod_now(&pod.key).await {
                    Ok(()) | Err(ClusterError::NotFound { .. }) => self.wrote("pod_delete"),
                    Err(e) => self.failed("remove", &format!("pod {}", pod.key), &e),
                }
                continue;
            }
            if pod.started_at.is_some() || pod.terminal || self.started.contains(&pod.key) {
                continue;
            }
            starts.push(pod.key.clone());
        }
        let cond = |t: &str| json!({ "type": t, "status": "True", "lastTransitionTime": time });
        let patch = json!({ "status": {
            "phase": "Running",
            "startTime": time,
            "hostIP": "127.0.0.1",
            "podIP": "127.0.0.1",
            "conditions": [cond("Initialized"), cond("Ready"), cond("ContainersReady"), cond("PodScheduled")],
        }});
        let cluster = &self.cluster;
        let started = at_once(starts.into_iter().map(|key| {
            let (cluster, patch) = (cluster.clone(), patch.clone());
            async move {
                let r = cluster.patch_status_raw("pod", &key, &patch).await.map(|_| ());
                (key, r)
            }
        }))
        .await;
        for (key, r) in started {
            match r {
                Ok(()) => {
                    self.wrote("pod_status");
                    self.started.insert(key);
                }
                Err(ClusterError::NotFound { .. }) => {}
                Err(e) => self.failed("start", &format!("pod {key}"), &e),
            }
        }
    }
}

/// Writes at once, at most.
const WRITES_AT_ONCE: usize = 32;

/// Runs `writes`, at most [`WRITES_AT_ONCE`] in flight; their results in completion order.
async fn at_once<F>(writes: impl Iterator<Item = F>) -> Vec<F::Output>
where
    F: std::future::Future + Send + 'static,
    F::Output: Send + 'static,
{
    let mut set = tokio::task::JoinSet::new();
    let mut out = Vec::new();
    let mut writes = writes.peekable();
    while writes.peek().is_some() || !set.is_empty() {
        while set.len() < WRITES_AT_ONCE {
            match writes.next() {
                Some(w) => {
                    set.spawn(w);
                }
                None => break,
            }
        }
        match set.join_next().await {
            Some(Ok(r)) => out.push(r),
            Some(Err(e)) => tracing::warn!(error = %e, "node agent: a write task failed"),
            None => break,
        }
    }
    out
}

/// A node's Ready heartbeat and Lease; the failed action with its error.
async fn renew(cluster: &KubeCluster, name: &str, now: u64) -> Result<(), (&'static str, ClusterError)> {
    let time = rfc3339(now);
    let patch = json!({ "status": { "conditions": [ready_condition(&time)] } });
    cluster.patch_status_raw("node", &PodKey::new("", name), &patch).await.map_err(|e| ("heartbeat", e))?;
    cluster.renew_lease(name, now).await.map_err(|e| ("renew", e))
}

fn ready_condition(time: &str) -> serde_json::Value {
    json!({
        "type": "Ready",
        "status": "True",
        "reason": "KubeletReady",
        "message": "the dovetail sim node agent plays this node's kubelet",
        "lastHeartbeatTime": time,
        "lastTransitionTime": time,
    })
}

/// `dovetail node-agent`: the agent alone, for the instances of `--cloud aws` (moto in the
/// tests), until SIGINT or SIGTERM. It reads the same settings as the controller (kubeconfig,
/// endpoint, region, cluster name, `--sim-registration-delay-ms`) and acts on nothing else.
pub fn run(args: &super::ControllerArgs, otel: &crate::telemetry::TelemetryArgs) -> std::process::ExitCode {
    use std::process::ExitCode;
    let settings = match super::Settings::resolve(args) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    if settings.cloud != super::CloudKind::Aws {
        eprintln!("error: node-agent plays the kubelets of --cloud aws (the controller's sim cloud has its own)");
        return ExitCode::from(2);
    }
    let telemetry = match super::logs(&settings, otel) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    let code = standalone_blocking(settings);
    if let Some(t) = telemetry {
        t.shutdown();
    }
    code
}

fn standalone_blocking(settings: super::Settings) -> std::process::ExitCode {
    use std::process::ExitCode;
    let sys = match dovetail_actors::system() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("error: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match sys.block_on(standalone(settings)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn standalone(s: super::Settings) -> Result<(), String> {
    let clock: Arc<dyn Clock> = Arc::new(dovetail_core::clock::SystemClock);
    let (client, access) = super::client(&s).await?;
    let kube_settings = dovetail_cluster::kube::KubeSettings { qps: s.kube_client_qps, burst: s.kube_client_burst };
    let cluster = Arc::new(KubeCluster::start(client, kube_settings, clock.clone()).await.map_err(|e| e.to_string())?);
    let v = cluster.versions();
    let provider = super::aws::provider(&s, &access, &v.server, clock.clone()).await?;
    super::wait_synced(&cluster).await;
    tracing::info!("node agent: caches synced, playing the kubelets of the cloud's instances");
    let config = AgentConfig { registration_delay_ms: s.sim_registration_delay_ms, renew_every_ms: 10_000 };
    let mut agent = Agent::new(cluster, Arc::new(provider), clock, config);
    let shutdown = super::shutdown_signal();
    tokio::pin!(shutdown);
    loop {
        agent.step().await;
        tokio::select! {
            () = tokio::time::sleep(std::time::Duration::from_millis(300)) => {}
            () = &mut shutdown => break,
        }
    }
    tracing::info!(writes = ?agent.stats.writes, errors = ?agent.stats.errors, "node agent: stopping");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use dovetail_core::ledger::{Claim, ClaimState};
    use dovetail_core::resources::ResourceList;

    /// A claim the ledger records as launched is a sim instance of the new leader's cloud,
    /// with its type and capacity type as launched and its NodeClaim's labels; a claim not
    /// launched yet is not (its launch is re-driven).
    #[test]
    fn the_ledgers_launched_claims_are_instances_to_restore() {
        let claim = |id: &str, state: ClaimState, launched_as: Option<(String, CapacityType)>| Claim {
            id: id.into(),
            pool: "default".into(),
            zone: "us-east-1a".into(),
            resources: ResourceList::new(),
            allocatable: ResourceList::new(),
            price_per_hour: 0,
            launched_as,
            state,
            reserved_at: 0,
            changed_at: 0,
            tried_at: None,
        };
        let m5 = Some(("m5.large".to_string(), CapacityType::Spot));
        let claims = [
            claim("launched", ClaimState::Launched { instance: "i-1".into() }, m5.clone()),
            claim("initialized", ClaimState::Initialized { instance: "i-2".into() }, m5),
            claim("reserved", ClaimState::Reserved, None),
        ];
        let mut snap = Snapshot::default();
        let mut nc = dovetail_core::cluster::NodeClaim {
            name: "launched".into(),
            spec: Default::default(),
            finalizers: Vec::new(),
            deleting: false,
            status: Default::default(),
            resource_version: 1,
            created: None,
        };
        nc.spec.labels.insert("team".into(), "a".into());
        snap.nodeclaims.insert("launched".into(), Arc::new(nc));
        let got = launched(&claims, &snap);
        let ids: Vec<(&str, &str)> = got.iter().map(|r| (r.claim.as_str(), r.id.as_str())).collect();
        assert_eq!(ids, [("launched", "i-1"), ("initialized", "i-2")]);
        let first = &got[0];
        assert_eq!(
            (first.instance_type.as_str(), first.capacity_type, first.zone.as_str(), first.nodepool.as_str()),
            ("m5.large", CapacityType::Spot, "us-east-1a", "default")
        );
        assert_eq!(first.labels.get("team").map(String::as_str), Some("a"));
    }
}
