//! The cluster seam on a real API server, with kube-rs.
//!
//! [`KubeCluster::start`] discovers the API versions the server serves (`policy/v1` or, before
//! Kubernetes 1.21, `policy/v1beta1` for PodDisruptionBudgets and evictions), starts one watch
//! per kind into the caches of [`store`], and is the [`ClusterView`] over them (synced once
//! every kind listed once) and the [`ClusterWriter`] on the API: NodeClaims created by name,
//! writes made from a read carry its `resourceVersion` in a merge patch (the server answers 409
//! when the object changed since), NodeClaim status through the status subresource, evictions
//! through the eviction subresource (429 while a PDB allows none), Events. Every request goes
//! through a token bucket (`qps`, `burst`), as client-go's rate limiter does.

pub mod store;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use dovetail_api::convert::{self, ConversionError};
use dovetail_api::crd;
use dovetail_core::clock::Clock;
use dovetail_core::node::Node;
use dovetail_core::pod::PodKey;
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1 as k8s;
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use serde_json::json;
use tokio::sync::{Mutex as AsyncMutex, watch};

use crate::{
    BoxFuture, ClusterError, ClusterView, ClusterWriter, Event, NodeClaim, NodeClaimStatus, NodeClaimUpdate,
    NodeUpdate, Snapshot,
};
use store::{Cached, KINDS, Shared};

/// The field manager of dovetail's writes, and the source of its Events.
pub const FIELD_MANAGER: &str = "dovetail";

/// Client settings.
#[derive(Clone, Debug)]
pub struct KubeSettings {
    /// Requests per second, sustained (Karpenter's `KUBE_CLIENT_QPS`: 200).
    pub qps: f64,
    /// Requests allowed at once above the rate (Karpenter's `KUBE_CLIENT_BURST`: 300).
    pub burst: u32,
}

impl Default for KubeSettings {
    fn default() -> Self {
        KubeSettings { qps: 200.0, burst: 300 }
    }
}

/// API versions found by discovery.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Versions {
    /// `policy/v1` or `policy/v1beta1`: PodDisruptionBudgets and the Eviction body.
    pub policy: String,
    /// The server's `major.minor`.
    pub server: String,
}

/// A token bucket on the injected clock.
struct Bucket {
    tokens: f64,
    at: u64,
}

/// The cluster on a kube-apiserver.
pub struct KubeCluster {
    client: kube::Client,
    shared: Arc<Shared>,
    versions: Versions,
    settings: KubeSettings,
    clock: Arc<dyn Clock>,
    bucket: AsyncMutex<Bucket>,
    events: AtomicU64,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Drop for KubeCluster {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

fn api_error(kind: &'static str, name: &str, e: kube::Error) -> ClusterError {
    match e {
        kube::Error::Api(s) => match s.code {
            404 => ClusterError::NotFound { kind, name: name.to_string() },
            409 if s.reason == "AlreadyExists" => ClusterError::AlreadyExists { kind, name: name.to_string() },
            409 => ClusterError::Conflict { kind, name: name.to_string() },
            429 => ClusterError::Throttled { kind, name: name.to_string() },
            code => ClusterError::Unavailable { reason: format!("{kind} {name}: HTTP {code}: {}", s.message) },
        },
        other => ClusterError::Unavailable { reason: format!("{kind} {name}: {other}") },
    }
}

fn version_of(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> u64 {
    meta.resource_version.as_deref().and_then(|v| v.parse().ok()).unwrap_or(0)
}

fn conversion(kind: &'static str, name: &str, e: ConversionError) -> ClusterError {
    ClusterError::Unavailable { reason: format!("{kind} {name} as read cannot be used: {e}") }
}

/// RFC 3339 of Unix milliseconds, as Kubernetes writes times (`micro`: with microseconds, as
/// a MicroTime such as a Lease's `renewTime` is written).
fn time_of(ms: u64, micro: bool) -> String {
    let ts = i64::try_from(ms)
        .ok()
        .and_then(|ms| k8s_openapi::jiff::Timestamp::from_millisecond(ms).ok())
        .unwrap_or(k8s_openapi::jiff::Timestamp::UNIX_EPOCH);
    ts.strftime(if micro { "%Y-%m-%dT%H:%M:%S.%6fZ" } else { "%Y-%m-%dT%H:%M:%SZ" }).to_string()
}

/// RFC 3339 of Unix milliseconds, to the second.
pub fn rfc3339(ms: u64) -> String {
    time_of(ms, false)
}

impl KubeCluster {
    /// Discovers the server's versions and starts the watches (inside a tokio runtime).
    pub async fn start(
        client: kube::Client,
        settings: KubeSettings,
        clock: Arc<dyn Clock>,
    ) -> Result<Self, ClusterError> {
        let versions = discover(&client).await?;
        let shared = Arc::new(Shared::new());
        let mut tasks = Vec::new();
        let cfg = watcher::Config::default();
        tasks.push(spawn::<k8s::Pod>(Api::all(client.clone()), &shared, cfg.clone()));
        tasks.push(spawn::<k8s::Node>(Api::all(client.clone()), &shared, cfg.clone()));
        tasks.push(spawn::<crd::NodeClaim>(Api::all(client.clone()), &shared, cfg.clone()));
        tasks.push(spawn::<crd::NodePool>(Api::all(client.clone()), &shared, cfg.clone()));
        tasks.push(spawn::<crd::EC2NodeClass>(Api::all(client.clone()), &shared, cfg.clone()));
        tasks.push(spawn::<DaemonSet>(Api::all(client.clone()), &shared, cfg.clone()));
        tasks.push(spawn::<k8s::Namespace>(Api::all(client.clone()), &shared, cfg.clone()));
        tasks.push(spawn::<k8s::PersistentVolumeClaim>(Api::all(client.clone()), &shared, cfg.clone()));
        tasks.push(spawn::<k8s::PersistentVolume>(Api::all(client.clone()), &shared, cfg.clone()));
        tasks.push(spawn::<StorageClass>(Api::all(client.clone()), &shared, cfg.clone()));
        let (group, version) = versions.policy.split_once('/').unwrap_or(("policy", "v1"));
        let ar = ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk(group, version, "PodDisruptionBudget"),
            "poddisruptionbudgets",
        );
        let pdbs: Api<DynamicObject> = Api::all_with(client.clone(), &ar);
        let sh = shared.clone();
        tasks.push(tokio::spawn(async move { store::follow(pdbs, sh, cfg).await }));
        let now = clock.now_millis();
        let bucket = AsyncMutex::new(Bucket { tokens: f64::from(settings.burst), at: now });
        Ok(KubeCluster { client, shared, versions, settings, clock, bucket, events: AtomicU64::new(0), tasks })
    }

    /// The versions discovery found.
    pub fn versions(&self) -> &Versions {
        &self.versions
    }

    pub fn client(&self) -> &kube::Client {
        &self.client
    }

    /// The EC2NodeClasses, by name.
    pub fn nodeclasses(&self) -> std::collections::BTreeMap<String, Arc<crd::EC2NodeClass>> {
        self.shared.lock().nodeclasses.clone()
    }

    /// Objects that could not be used, by `Kind name`, with the field at fault.
    pub fn invalid(&self) -> std::collections::BTreeMap<String, ConversionError> {
        self.shared.lock().invalid.clone()
    }

    /// Kinds not listed yet (empty once synced).
    pub fn unsynced(&self) -> Vec<&'static str> {
        let s = self.shared.lock();
        KINDS.iter().copied().filter(|k| !s.synced.contains(k)).collect()
    }

    /// Watch errors seen so far, by kind.
    pub fn watch_errors(&self) -> std::collections::BTreeMap<&'static str, u64> {
        self.shared.lock().watch_errors.clone()
    }

    /// Waits for a token of the client's rate limit.
    async fn admit(&self) {
        let wait_ms = {
            let mut b = self.bucket.lock().await;
            let now = self.clock.now_millis();
            let elapsed = now.saturating_sub(b.at) as f64 / 1000.0;
            b.tokens = (b.tokens + elapsed * self.settings.qps).min(f64::from(self.settings.burst));
            b.at = now;
            b.tokens -= 1.0;
            if b.tokens >= 0.0 { 0.0 } else { -b.tokens / self.settings.qps * 1000.0 }
        };
        if wait_ms > 0.0 {
            tokio::time::sleep(std::time::Duration::from_millis(wait_ms.ceil() as u64)).await;
        }
    }

    /// Writes a NodePool's status (through the status subresource, merged).
    pub async fn patch_nodepool_status(&self, name: &str, status: &crd::NodePoolStatus) -> Result<u64, ClusterError> {
        self.admit().await;
        let api: Api<crd::NodePool> = Api::all(self.client.clone());
        let patch = json!({ "status": status });
        let out = api
            .patch_status(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map_err(|e| api_error("NodePool", name, e))?;
        Ok(version_of(&out.metadata))
    }

    /// A Node object made by the sim cloud's node agent: created as a kubelet registers it.
    pub async fn create_node(&self, node: &k8s::Node) -> Result<u64, ClusterError> {
        self.admit().await;
        let name = node.metadata.name.clone().unwrap_or_default();
        let api: Api<k8s::Node> = Api::all(self.client.clone());
        let out = api.create(&PostParams::default(), node).await.map_err(|e| api_error("node", &name, e))?;
        Ok(version_of(&out.metadata))
    }

    /// Merges a patch into an object's status subresource (the sim node agent: a Node's
    /// Ready condition, a Pod's phase).
    pub async fn patch_status_raw(
        &self,
        kind: &'static str,
        key: &PodKey,
        patch: &serde_json::Value,
    ) -> Result<u64, ClusterError> {
        self.admit().await;
        let pp = PatchParams::default();
        let meta = match kind {
            "node" => {
                let api: Api<k8s::Node> = Api::all(self.client.clone());
                api.patch_status(&key.name, &pp, &Patch::Merge(patch)).await.map(|o| o.metadata)
            }
            _ => {
                let api: Api<k8s::Pod> = Api::namespaced(self.client.clone(), &key.namespace);
                api.patch_status(&key.name, &pp, &Patch::Merge(patch)).await.map(|o| o.metadata)
            }
        }
        .map_err(|e| api_error(kind, &key.to_string(), e))?;
        Ok(version_of(&meta))
    }

    /// Merges a patch into a Node (the sim node agent removing `node.kubernetes.io/not-ready`).
    pub async fn patch_node_raw(&self, name: &str, patch: &serde_json::Value) -> Result<u64, ClusterError> {
        self.admit().await;
        let api: Api<k8s::Node> = Api::all(self.client.clone());
        let out = api
            .patch(name, &PatchParams::default(), &Patch::Merge(patch))
            .await
            .map_err(|e| api_error("node", name, e))?;
        Ok(version_of(&out.metadata))
    }

    /// Deletes a pod at once (grace period 0): what the kubelet finishes once the containers
    /// of a pod being deleted stopped.
    pub async fn delete_pod_now(&self, pod: &PodKey) -> Result<(), ClusterError> {
        self.admit().await;
        let api: Api<k8s::Pod> = Api::namespaced(self.client.clone(), &pod.namespace);
        let dp = DeleteParams { grace_period_seconds: Some(0), ..DeleteParams::default() };
        api.delete(&pod.name, &dp).await.map_err(|e| api_error("pod", &pod.to_string(), e))?;
        Ok(())
    }

    /// Renews (or creates) a node's Lease in `kube-node-lease`, as its kubelet does.
    pub async fn renew_lease(&self, node: &str, now_ms: u64) -> Result<(), ClusterError> {
        use k8s_openapi::api::coordination::v1::Lease;
        self.admit().await;
        let api: Api<Lease> = Api::namespaced(self.client.clone(), "kube-node-lease");
        let time = time_of(now_ms, true);
        let patch = json!({ "spec": { "holderIdentity": node, "leaseDurationSeconds": 40, "renewTime": time } });
        match api.patch(node, &PatchParams::default(), &Patch::Merge(&patch)).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(s)) if s.code == 404 => {
                let lease: Lease = serde_json::from_value(json!({
                    "apiVersion": "coordination.k8s.io/v1",
                    "kind": "Lease",
                    "metadata": { "name": node, "namespace": "kube-node-lease" },
                    "spec": { "holderIdentity": node, "leaseDurationSeconds": 40, "renewTime": time },
                }))
                .map_err(|e| ClusterError::Unavailable { reason: format!("lease {node}: {e}") })?;
                self.admit().await;
                match api.create(&PostParams::default(), &lease).await {
                    Ok(_) => Ok(()),
                    Err(e) => Err(api_error("lease", node, e)),
                }
            }
            Err(e) => Err(api_error("lease", node, e)),
        }
    }

    /// Deletes a node's Lease.
    pub async fn delete_lease(&self, node: &str) -> Result<(), ClusterError> {
        use k8s_openapi::api::coordination::v1::Lease;
        self.admit().await;
        let api: Api<Lease> = Api::namespaced(self.client.clone(), "kube-node-lease");
        api.delete(node, &DeleteParams::default()).await.map_err(|e| api_error("lease", node, e))?;
        Ok(())
    }
}

fn spawn<K: Cached>(api: Api<K>, shared: &Arc<Shared>, cfg: watcher::Config) -> tokio::task::JoinHandle<()> {
    let sh = shared.clone();
    tokio::spawn(async move { store::follow(api, sh, cfg).await })
}

/// Which policy version the server serves, and its version.
async fn discover(client: &kube::Client) -> Result<Versions, ClusterError> {
    let info = client
        .apiserver_version()
        .await
        .map_err(|e| ClusterError::Unavailable { reason: format!("reading the API server's version: {e}") })?;
    let serves = |list: &k8s_openapi::apimachinery::pkg::apis::meta::v1::APIResourceList| {
        list.resources.iter().any(|r| r.name == "poddisruptionbudgets")
    };
    let policy = match client.list_api_group_resources("policy/v1").await {
        Ok(list) if serves(&list) => "policy/v1",
        _ => "policy/v1beta1",
    };
    Ok(Versions { policy: policy.to_string(), server: format!("{}.{}", info.major, info.minor) })
}

impl ClusterView for KubeCluster {
    fn snapshot(&self) -> Arc<Snapshot> {
        let mut s = self.shared.lock();
        if let Some(shared) = &s.shared {
            return shared.clone();
        }
        let snap = Arc::new(s.view());
        s.shared = Some(snap.clone());
        snap
    }

    fn synced(&self) -> bool {
        let s = self.shared.lock();
        KINDS.iter().all(|k| s.synced.contains(k))
    }

    fn changes(&self) -> watch::Receiver<u64> {
        self.shared.subscribe()
    }
}

impl KubeCluster {
    /// The uid of the object an Event is about, or `None` (logged) when it cannot be read:
    /// the Event is still recorded, by name.
    async fn uid_of(&self, kind: crate::ObjectKind, namespace: &str, name: &str) -> Option<String> {
        use crate::ObjectKind;
        let cached = {
            let s = self.shared.lock();
            match kind {
                ObjectKind::NodeClaim => s.claim_uids.get(name).cloned(),
                ObjectKind::NodePool => s.pool_uids.get(name).cloned(),
                ObjectKind::Pod | ObjectKind::Node => None,
            }
        };
        if cached.is_some() {
            return cached;
        }
        self.admit().await;
        let c = self.client.clone();
        let meta = match kind {
            ObjectKind::Pod => Api::<k8s::Pod>::namespaced(c, namespace).get_metadata(name).await.map(|m| m.metadata),
            ObjectKind::Node => Api::<k8s::Node>::all(c).get_metadata(name).await.map(|m| m.metadata),
            ObjectKind::NodeClaim => Api::<crd::NodeClaim>::all(c).get_metadata(name).await.map(|m| m.metadata),
            ObjectKind::NodePool => Api::<crd::NodePool>::all(c).get_metadata(name).await.map(|m| m.metadata),
        };
        match meta {
            Ok(m) => m.uid,
            Err(e) => {
                tracing::debug!(object = %name, error = %e, "reading the uid of {name} for its event failed; recording it by name");
                None
            }
        }
    }
}

/// Taints as the API writes them (`value` left out when empty).
pub fn taints_json<'a>(taints: impl IntoIterator<Item = &'a dovetail_core::taints::Taint>) -> serde_json::Value {
    serde_json::Value::Array(
        taints
            .into_iter()
            .map(|t| {
                let mut o = json!({ "key": t.key, "effect": t.effect.as_str() });
                if !t.value.is_empty() {
                    o["value"] = json!(t.value);
                }
                o
            })
            .collect(),
    )
}

impl ClusterWriter for KubeCluster {
    fn create_nodeclaim(&self, claim: NodeClaim) -> BoxFuture<'_, Result<u64, ClusterError>> {
        Box::pin(async move {
            self.admit().await;
            let uid = self.shared.lock().pool_uids.get(&claim.spec.nodepool).cloned();
            let obj = convert::nodeclaim(&claim.name, &claim.spec, uid.as_deref());
            let api: Api<crd::NodeClaim> = Api::all(self.client.clone());
            let pp = PostParams { field_manager: Some(FIELD_MANAGER.into()), ..PostParams::default() };
            let out = api.create(&pp, &obj).await.map_err(|e| api_error("nodeclaim", &claim.name, e))?;
            Ok(version_of(&out.metadata))
        })
    }

    fn get_nodeclaim<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<Arc<NodeClaim>, ClusterError>> {
        Box::pin(async move {
            self.admit().await;
            let api: Api<crd::NodeClaim> = Api::all(self.client.clone());
            let obj = api.get(name).await.map_err(|e| api_error("nodeclaim", name, e))?;
            let conditions = obj.status.as_ref().and_then(|s| s.conditions.clone()).unwrap_or_default();
            let claim = convert::nodeclaim_from_object(&obj).map_err(|e| conversion("nodeclaim", name, e))?;
            self.shared.lock().claim_conditions.insert(name.to_string(), conditions);
            Ok(Arc::new(claim))
        })
    }

    fn update_nodeclaim_status<'a>(
        &'a self,
        name: &'a str,
        status: NodeClaimStatus,
        resource_version: u64,
    ) -> BoxFuture<'a, Result<u64, ClusterError>> {
        Box::pin(async move {
            self.admit().await;
            let previous = self.shared.lock().claim_conditions.get(name).cloned().unwrap_or_default();
            let body = convert::nodeclaim_status_object(&status, &previous, &rfc3339(self.clock.now_millis()));
            let patch = json!({ "metadata": { "resourceVersion": resource_version.to_string() }, "status": body });
            let api: Api<crd::NodeClaim> = Api::all(self.client.clone());
            let out = api
                .patch_status(name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .map_err(|e| api_error("nodeclaim", name, e))?;
            if let Some(cs) = out.status.as_ref().and_then(|s| s.conditions.clone()) {
                self.shared.lock().claim_conditions.insert(name.to_string(), cs);
            }
            Ok(version_of(&out.metadata))
        })
    }

    fn update_nodeclaim_metadata<'a>(
        &'a self,
        name: &'a str,
        update: NodeClaimUpdate,
        resource_version: u64,
    ) -> BoxFuture<'a, Result<u64, ClusterError>> {
        Box::pin(async move {
            self.admit().await;
            // Labels merge; finalizers are replaced whole, as read and changed, under the
            // read's resource version.
            let patch = json!({ "metadata": {
                "resourceVersion": resource_version.to_string(),
                "labels": update.labels,
                "finalizers": update.finalizers,
            } });
            let api: Api<crd::NodeClaim> = Api::all(self.client.clone());
            match api.patch(name, &PatchParams::default(), &Patch::Merge(&patch)).await {
                Ok(out) => Ok(version_of(&out.metadata)),
                // The last finalizer removed from an object being deleted: it is gone.
                Err(kube::Error::Api(s)) if s.code == 404 => {
                    Err(ClusterError::NotFound { kind: "nodeclaim", name: name.into() })
                }
                Err(e) => Err(api_error("nodeclaim", name, e)),
            }
        })
    }

    fn delete_nodeclaim<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<u64, ClusterError>> {
        Box::pin(async move {
            self.admit().await;
            let api: Api<crd::NodeClaim> = Api::all(self.client.clone());
            let out = api.delete(name, &DeleteParams::default()).await.map_err(|e| api_error("nodeclaim", name, e))?;
            Ok(out.left().map_or(0, |o| version_of(&o.metadata)))
        })
    }

    fn get_node<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<Arc<Node>, ClusterError>> {
        Box::pin(async move {
            self.admit().await;
            let api: Api<k8s::Node> = Api::all(self.client.clone());
            let obj = api.get(name).await.map_err(|e| api_error("node", name, e))?;
            let node = convert::node(&convert::Ctx::new(format!("Node {name}")), &obj)
                .map_err(|e| conversion("node", name, e))?;
            Ok(Arc::new(node))
        })
    }

    fn update_node<'a>(
        &'a self,
        name: &'a str,
        update: NodeUpdate,
        resource_version: u64,
    ) -> BoxFuture<'a, Result<u64, ClusterError>> {
        Box::pin(async move {
            self.admit().await;
            // Labels merge (a patch only sets them); taints and finalizers are replaced whole,
            // as read and patched, under the read's resource version. The owner (at
            // registration) is written as the node's one ownerReference, as Karpenter's
            // registration does: a node dovetail registers was created by its kubelet, with none.
            let mut patch = json!({
                "metadata": {
                    "resourceVersion": resource_version.to_string(),
                    "labels": update.labels,
                    "finalizers": update.finalizers,
                },
                "spec": { "taints": taints_json(&update.taints) },
            });
            // The owner's uid, when the node does not carry that owner yet.
            let owner = update.owner_claim.as_ref().and_then(|claim| {
                let s = self.shared.lock();
                let owned = s.snap.nodes.get(name).is_some_and(|n| n.owner_claim.as_ref() == Some(claim));
                (!owned).then(|| (claim, s.claim_uids.get(claim).cloned()))
            });
            if let Some((claim, uid)) = owner {
                match uid {
                    Some(uid) => {
                        patch["metadata"]["ownerReferences"] = json!([{
                            "apiVersion": "karpenter.sh/v1",
                            "kind": "NodeClaim",
                            "name": claim,
                            "uid": uid,
                            "blockOwnerDeletion": true,
                        }]);
                    }
                    // Not cached yet (the claim's watch event is behind): the write is retried.
                    None => {
                        return Err(ClusterError::Unavailable {
                            reason: format!("node {name}: the uid of its owner, NodeClaim {claim}, is not cached yet"),
                        });
                    }
                }
            }
            let api: Api<k8s::Node> = Api::all(self.client.clone());
            let out = api
                .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .map_err(|e| api_error("node", name, e))?;
            Ok(version_of(&out.metadata))
        })
    }

    fn delete_node<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<u64, ClusterError>> {
        Box::pin(async move {
            self.admit().await;
            let api: Api<k8s::Node> = Api::all(self.client.clone());
            let out = api.delete(name, &DeleteParams::default()).await.map_err(|e| api_error("node", name, e))?;
            Ok(out.left().map_or(0, |o| version_of(&o.metadata)))
        })
    }

    fn evict<'a>(&'a self, pod: &'a PodKey) -> BoxFuture<'a, Result<u64, ClusterError>> {
        Box::pin(async move {
            self.admit().await;
            let body = json!({
                "apiVersion": self.versions.policy,
                "kind": "Eviction",
                "metadata": { "name": pod.name, "namespace": pod.namespace },
            });
            let url = format!("/api/v1/namespaces/{}/pods/{}/eviction", pod.namespace, pod.name);
            let req = http::Request::post(url)
                .header(http::header::CONTENT_TYPE, "application/json")
                .body(serde_json::to_vec(&body).unwrap_or_default())
                .map_err(|e| ClusterError::Unavailable { reason: format!("eviction request for {pod}: {e}") })?;
            match self.client.request::<serde_json::Value>(req).await {
                Ok(_) => Ok(self.shared.lock().snap.resource_version),
                Err(kube::Error::Api(s)) if s.code == 429 => {
                    // The eviction API answers 429 while a PodDisruptionBudget allows none.
                    let pdb = s
                        .details
                        .as_ref()
                        .and_then(|d| d.causes.iter().find(|c| c.reason == "DisruptionBudget"))
                        .map(|c| c.message.clone())
                        .unwrap_or_default();
                    if pdb.is_empty() && !s.message.contains("disruption budget") {
                        return Err(ClusterError::Throttled { kind: "pod", name: pod.to_string() });
                    }
                    Err(ClusterError::DisruptionBudget { pod: pod.to_string(), pdb })
                }
                // The pod's namespace is being deleted (the API refuses new content there,
                // evictions included): the namespace controller deletes the pod; the drain
                // waits for it to go, as after an eviction.
                Err(kube::Error::Api(s)) if s.code == 403 && s.message.contains("being terminated") => {
                    Ok(self.shared.lock().snap.resource_version)
                }
                Err(e) => Err(api_error("pod", &pod.to_string(), e)),
            }
        })
    }

    fn delete_pod<'a>(&'a self, pod: &'a PodKey) -> BoxFuture<'a, Result<u64, ClusterError>> {
        Box::pin(async move {
            self.admit().await;
            let api: Api<k8s::Pod> = Api::namespaced(self.client.clone(), &pod.namespace);
            let out = api
                .delete(&pod.name, &DeleteParams::default())
                .await
                .map_err(|e| api_error("pod", &pod.to_string(), e))?;
            Ok(out.left().map_or(0, |o| version_of(&o.metadata)))
        })
    }

    fn record_event(&self, event: Event) -> BoxFuture<'_, Result<(), ClusterError>> {
        Box::pin(async move {
            let (kind, api_version) = match event.kind {
                crate::ObjectKind::Pod => ("Pod", "v1"),
                crate::ObjectKind::Node => ("Node", "v1"),
                crate::ObjectKind::NodeClaim => ("NodeClaim", "karpenter.sh/v1"),
                crate::ObjectKind::NodePool => ("NodePool", "karpenter.sh/v1"),
            };
            let (namespace, name) = match event.name.split_once('/') {
                Some((ns, n)) if event.kind == crate::ObjectKind::Pod => (ns.to_string(), n.to_string()),
                _ => ("default".to_string(), event.name.clone()),
            };
            // The object's uid (cached, or read): `kubectl describe` lists the events whose
            // involvedObject names the object's uid.
            let uid = self.uid_of(event.kind, &namespace, &name).await;
            self.admit().await;
            let now = self.clock.now_millis();
            let seq = self.events.fetch_add(1, Ordering::Relaxed);
            let time = rfc3339(now);
            let body = json!({
                "apiVersion": "v1",
                "kind": "Event",
                "metadata": { "name": format!("{name}.{now:x}{seq:x}"), "namespace": namespace },
                "involvedObject": {
                    "kind": kind,
                    "apiVersion": api_version,
                    "name": name,
                    "uid": uid,
                    "namespace": if event.kind == crate::ObjectKind::Pod { Some(&namespace) } else { None },
                },
                "reason": event.reason,
                "message": event.message,
                "type": if event.warning { "Warning" } else { "Normal" },
                "source": { "component": FIELD_MANAGER },
                "firstTimestamp": time,
                "lastTimestamp": time,
                "count": 1,
            });
            let ev: k8s::Event = serde_json::from_value(body)
                .map_err(|e| ClusterError::Unavailable { reason: format!("event for {kind} {name}: {e}") })?;
            let api: Api<k8s::Event> = Api::namespaced(self.client.clone(), &namespace);
            api.create(&PostParams::default(), &ev).await.map_err(|e| api_error("event", &name, e))?;
            Ok(())
        })
    }
}
