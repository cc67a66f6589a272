//! The cluster seam on a real API server, with kube-rs.
//!
//! [`KubeCluster::start`] discovers the API versions the server serves (`policy/v1` or, before
//! Kubernetes 1.21, `policy/v1beta1` for PodDisruptionBudgets; the eviction version as `/api/v1`
//! lists `pods/eviction`, `policy/v1` from 1.22), starts one watch
//! per kind into the caches of [`store`], and is the [`ClusterView`] over them (synced once
//! every kind listed once) and the [`ClusterWriter`] on the API: NodeClaims created by name,
//! writes made from a read carry its `resourceVersion` in a merge patch (the server answers 409
//! when the object changed since), NodeClaim status through the status subresource, evictions
//! through the eviction subresource (429 while a PDB allows none), Events. Every request goes
//! through a token bucket (`qps`, `burst`), as client-go's rate limiter does.

mod list;
pub mod store;
#[cfg(test)]
mod test_server;
mod writer;

pub use writer::taints_json;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use dovetail_api::convert::ConversionError;
use dovetail_api::crd;
use dovetail_core::clock::Clock;
use dovetail_core::pod::PodKey;
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1 as k8s;
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use serde_json::json;
use tokio::sync::{Mutex as AsyncMutex, watch};

use crate::{ClusterError, ClusterView, Snapshot};
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
    /// `policy/v1` or `policy/v1beta1`: PodDisruptionBudgets.
    pub policy: String,
    /// The Eviction body's `apiVersion`, as `/api/v1` lists `pods/eviction` (1.21 serves
    /// `policy/v1` PodDisruptionBudgets but `policy/v1beta1` evictions).
    pub eviction: String,
    /// The server's `major.minor`.
    pub server: String,
    /// Whether the server streams a watch's initial list (`sendInitialEvents`, the WatchList
    /// feature: on by default in 1.32 and from 1.34; refused with 422 where it is off).
    pub streaming_lists: bool,
}

/// How the reflectors list and watch. Lists are served from the API server's watch cache
/// (`resourceVersion=0`, "any" semantics: what Karpenter's informers ask too), never a quorum
/// read of etcd: a relist of 300,000 pods is the cache's work, not etcd's. Where the server
/// streams lists, kube's watcher does with this configuration (the initial list comes as watch
/// events); elsewhere the list is one answer (the cache does not paginate) that
/// [`list::follow_listed`] reads as it arrives. The caches wait for every kind's list before
/// anything acts, and an object one list does not show yet counts as missing only after a
/// grace, so a list slightly older than etcd is safe.
pub fn watch_config(streaming_lists: bool) -> watcher::Config {
    let mut cfg = watcher::Config::default().any_semantic();
    cfg.page_size = None;
    if streaming_lists { cfg.streaming_lists() } else { cfg }
}

/// The NodePools and NodeClaims as cached ([`KubeCluster::pools_and_claims`]).
#[derive(Clone, Debug, Default)]
pub struct PoolsAndClaims {
    pub nodepools: std::collections::BTreeMap<String, Arc<dovetail_core::nodepool::NodePool>>,
    pub nodeclaims: std::collections::BTreeMap<String, Arc<dovetail_core::cluster::NodeClaim>>,
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
    /// Unix ms until which writes wait (a throttled answer asked for it).
    paused_until: AtomicU64,
    throttles: AtomicU64,
    /// Requests made outside the watches (each admitted by the rate limit).
    requests: AtomicU64,
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

/// The API client the adapter expects, from a kube `Config`: with kube's own retry layer off.
/// That layer retries every 429, 503 and 504 up to 15 times with a backoff that grows to
/// minutes, inside the call: an eviction a PodDisruptionBudget refuses would hang there (and
/// every write queued behind it) instead of coming back to be retried per pod with its own
/// backoff. The adapter retries itself: a throttled write pauses its writes for the server's
/// `retryAfterSeconds` ([`KubeCluster::api_error`]), and the plane asks again.
pub fn client(mut config: kube::Config) -> Result<kube::Client, kube::Error> {
    config.default_retry = false;
    kube::Client::try_from(config)
}

/// How long the writes pause after a throttled one whose answer names no wait (the API's
/// priority and fairness usually says 1 s), and the longest pause taken whatever it says.
const THROTTLE_PAUSE_MS: u64 = 1_000;
const MAX_THROTTLE_PAUSE_MS: u64 = 30_000;

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
        let streaming = versions.streaming_lists;
        tasks.push(spawn::<k8s::Pod>(Api::all(client.clone()), &shared, streaming));
        tasks.push(spawn::<k8s::Node>(Api::all(client.clone()), &shared, streaming));
        tasks.push(spawn::<crd::NodeClaim>(Api::all(client.clone()), &shared, streaming));
        tasks.push(spawn::<crd::NodePool>(Api::all(client.clone()), &shared, streaming));
        tasks.push(spawn::<crd::EC2NodeClass>(Api::all(client.clone()), &shared, streaming));
        tasks.push(spawn::<DaemonSet>(Api::all(client.clone()), &shared, streaming));
        tasks.push(spawn::<k8s::Namespace>(Api::all(client.clone()), &shared, streaming));
        tasks.push(spawn::<k8s::PersistentVolumeClaim>(Api::all(client.clone()), &shared, streaming));
        tasks.push(spawn::<k8s::PersistentVolume>(Api::all(client.clone()), &shared, streaming));
        tasks.push(spawn::<StorageClass>(Api::all(client.clone()), &shared, streaming));
        let (group, version) = versions.policy.split_once('/').unwrap_or(("policy", "v1"));
        let ar = ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk(group, version, "PodDisruptionBudget"),
            "poddisruptionbudgets",
        );
        let pdbs: Api<DynamicObject> = Api::all_with(client.clone(), &ar);
        let sh = shared.clone();
        tasks.push(tokio::spawn(async move { store::follow(pdbs, sh, streaming).await }));
        let now = clock.now_millis();
        let bucket = AsyncMutex::new(Bucket { tokens: f64::from(settings.burst), at: now });
        Ok(KubeCluster {
            client,
            shared,
            versions,
            settings,
            clock,
            bucket,
            paused_until: AtomicU64::new(0),
            throttles: AtomicU64::new(0),
            requests: AtomicU64::new(0),
            events: AtomicU64::new(0),
            tasks,
        })
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

    /// The NodePools and NodeClaims as cached: what the controller's NodePool bookkeeping
    /// reads, without building a whole snapshot (which copies the pods' index).
    pub fn pools_and_claims(&self) -> PoolsAndClaims {
        let s = self.shared.lock();
        PoolsAndClaims { nodepools: s.snap.nodepools.clone(), nodeclaims: s.snap.nodeclaims.clone() }
    }

    /// Objects cached per kind (for `/metrics`), without building a snapshot.
    pub fn counts(&self) -> Vec<(&'static str, usize)> {
        let s = self.shared.lock();
        let snap = &s.snap;
        vec![
            ("pod", snap.pods.len()),
            ("node", snap.nodes.len()),
            ("nodeclaim", snap.nodeclaims.len()),
            ("nodepool", snap.nodepools.len()),
            ("daemonset", snap.daemonsets.len()),
            ("poddisruptionbudget", snap.pdbs.len()),
        ]
    }

    /// A NodePool's status as last read (a valid NodePool's).
    pub fn nodepool_status(&self, name: &str) -> Option<crd::NodePoolStatus> {
        self.shared.lock().pool_statuses.get(name).cloned()
    }

    /// An EC2NodeClass's status as last read (valid or not).
    pub fn nodeclass_status(&self, name: &str) -> Option<crd::EC2NodeClassStatus> {
        self.shared.lock().class_statuses.get(name).cloned()
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

    /// An API error as the seam says it; a throttled one (429, not a PodDisruptionBudget's)
    /// also pauses the adapter's requests (writes and the reads they make) for the wait the
    /// server asked for.
    fn api_error(&self, kind: &'static str, name: &str, e: kube::Error) -> ClusterError {
        if let kube::Error::Api(s) = &e
            && s.code == 429
        {
            self.throttled(s.details.as_ref().map_or(0, |d| d.retry_after_seconds));
        }
        api_error(kind, name, e)
    }

    /// Pauses the writes for `retry_after_seconds` (or [`THROTTLE_PAUSE_MS`] when 0), capped.
    fn throttled(&self, retry_after_seconds: u32) {
        let wait = match u64::from(retry_after_seconds) * 1000 {
            0 => THROTTLE_PAUSE_MS,
            ms => ms.min(MAX_THROTTLE_PAUSE_MS),
        };
        let until = self.clock.now_millis().saturating_add(wait);
        self.paused_until.fetch_max(until, Ordering::Relaxed);
        self.throttles.fetch_add(1, Ordering::Relaxed);
        tracing::warn!(pause_ms = wait, "the API server throttled a write: writes pause for {wait} ms");
    }

    /// Throttled answers so far (each paused the writes).
    pub fn throttles(&self) -> u64 {
        self.throttles.load(Ordering::Relaxed)
    }

    /// Requests made so far outside the watches: the writes and the reads they need
    /// (retries and conflicts counted).
    pub fn requests(&self) -> u64 {
        self.requests.load(Ordering::Relaxed)
    }

    /// Waits until a request made now would not wait: the throttle pause over and a token of
    /// the rate limit there (none is taken; [`KubeCluster::admit`] takes it). Bounded: at most
    /// the longest pause and a full bucket's refill.
    async fn paced(&self) {
        for _ in 0..4 {
            let paused = self.paused_until.load(Ordering::Relaxed).saturating_sub(self.clock.now_millis());
            if paused > 0 {
                tokio::time::sleep(std::time::Duration::from_millis(paused)).await;
                continue;
            }
            let wait_ms = {
                let b = self.bucket.lock().await;
                let elapsed = self.clock.now_millis().saturating_sub(b.at) as f64 / 1000.0;
                let tokens = (b.tokens + elapsed * self.settings.qps).min(f64::from(self.settings.burst));
                if tokens >= 1.0 { 0.0 } else { (1.0 - tokens) / self.settings.qps * 1000.0 }
            };
            if wait_ms <= 0.0 {
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(wait_ms.ceil() as u64)).await;
        }
    }

    /// Waits out a throttle pause, then for a token of the client's rate limit (every request
    /// outside the watches comes through here, and is counted).
    async fn admit(&self) {
        self.requests.fetch_add(1, Ordering::Relaxed);
        let paused = self.paused_until.load(Ordering::Relaxed).saturating_sub(self.clock.now_millis());
        if paused > 0 {
            tokio::time::sleep(std::time::Duration::from_millis(paused)).await;
        }
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
        self.patch_status::<crd::NodePool>("NodePool", name, json!({ "status": status })).await
    }

    /// Writes an EC2NodeClass's status (through the status subresource, merged).
    pub async fn patch_nodeclass_status(
        &self,
        name: &str,
        status: &crd::EC2NodeClassStatus,
    ) -> Result<u64, ClusterError> {
        // A merge patch leaves out what the status no longer has: a part that resolves to
        // nothing now is removed by name.
        let mut value = json!(status);
        if let Some(fields) = value.as_object_mut() {
            for key in ["subnets", "securityGroups", "amis", "instanceProfile"] {
                fields.entry(key).or_insert(serde_json::Value::Null);
            }
        }
        self.patch_status::<crd::EC2NodeClass>("EC2NodeClass", name, json!({ "status": value })).await
    }

    /// Merges `patch` into a cluster-scoped object's status subresource.
    async fn patch_status<K>(
        &self,
        kind: &'static str,
        name: &str,
        patch: serde_json::Value,
    ) -> Result<u64, ClusterError>
    where
        K: kube::Resource<DynamicType = (), Scope = kube::core::ClusterResourceScope>
            + Clone
            + serde::de::DeserializeOwned
            + std::fmt::Debug,
    {
        self.admit().await;
        let api: Api<K> = Api::all(self.client.clone());
        let out = api
            .patch_status(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map_err(|e| self.api_error(kind, name, e))?;
        Ok(version_of(out.meta()))
    }

    /// A Node object made by the sim cloud's node agent: created as a kubelet registers it.
    pub async fn create_node(&self, node: &k8s::Node) -> Result<u64, ClusterError> {
        self.admit().await;
        let name = node.metadata.name.clone().unwrap_or_default();
        let api: Api<k8s::Node> = Api::all(self.client.clone());
        let out = api.create(&PostParams::default(), node).await.map_err(|e| self.api_error("node", &name, e))?;
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
        .map_err(|e| self.api_error(kind, &key.to_string(), e))?;
        Ok(version_of(&meta))
    }

    /// Merges a patch into a Node (the sim node agent removing `node.kubernetes.io/not-ready`).
    pub async fn patch_node_raw(&self, name: &str, patch: &serde_json::Value) -> Result<u64, ClusterError> {
        self.admit().await;
        let api: Api<k8s::Node> = Api::all(self.client.clone());
        let out = api
            .patch(name, &PatchParams::default(), &Patch::Merge(patch))
            .await
            .map_err(|e| self.api_error("node", name, e))?;
        Ok(version_of(&out.metadata))
    }

    /// Deletes a pod at once (grace period 0): what the kubelet finishes once the containers
    /// of a pod being deleted stopped.
    pub async fn delete_pod_now(&self, pod: &PodKey) -> Result<(), ClusterError> {
        self.admit().await;
        let api: Api<k8s::Pod> = Api::namespaced(self.client.clone(), &pod.namespace);
        let dp = DeleteParams { grace_period_seconds: Some(0), ..DeleteParams::default() };
        api.delete(&pod.name, &dp).await.map_err(|e| self.api_error("pod", &pod.to_string(), e))?;
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
                    Err(e) => Err(self.api_error("lease", node, e)),
                }
            }
            Err(e) => Err(self.api_error("lease", node, e)),
        }
    }

    /// Deletes a node's Lease.
    pub async fn delete_lease(&self, node: &str) -> Result<(), ClusterError> {
        use k8s_openapi::api::coordination::v1::Lease;
        self.admit().await;
        let api: Api<Lease> = Api::namespaced(self.client.clone(), "kube-node-lease");
        api.delete(node, &DeleteParams::default()).await.map_err(|e| self.api_error("lease", node, e))?;
        Ok(())
    }
}

fn spawn<K: Cached>(api: Api<K>, shared: &Arc<Shared>, streaming: bool) -> tokio::task::JoinHandle<()> {
    let sh = shared.clone();
    tokio::spawn(async move { store::follow(api, sh, streaming).await })
}

/// Which policy version the server serves for PodDisruptionBudgets and for evictions, and its
/// version. Only a 404 means a version is not served; any other error is returned (the caller
/// retries), not read as "an older server".
async fn discover(client: &kube::Client) -> Result<Versions, ClusterError> {
    let unavailable = |what: &str, e: kube::Error| ClusterError::Unavailable { reason: format!("{what}: {e}") };
    let info = client.apiserver_version().await.map_err(|e| unavailable("reading the API server's version", e))?;
    let policy = match client.list_api_group_resources("policy/v1").await {
        Ok(list) if list.resources.iter().any(|r| r.name == "poddisruptionbudgets") => "policy/v1",
        Ok(_) => "policy/v1beta1",
        Err(kube::Error::Api(s)) if s.code == 404 => "policy/v1beta1",
        Err(e) => return Err(unavailable("discovering policy/v1", e)),
    };
    let core = client.list_core_api_resources("v1").await.map_err(|e| unavailable("discovering the core API", e))?;
    let eviction = core
        .resources
        .iter()
        .find(|r| r.name == "pods/eviction")
        .and_then(|r| Some(format!("{}/{}", r.group.as_deref()?, r.version.as_deref()?)))
        // Servers that do not say (before 1.22 the entry carries no group or version) take
        // the PodDisruptionBudgets' version, which is policy/v1beta1 there except on 1.21.
        .unwrap_or_else(
            || if info.minor.trim_end_matches('+') == "21" { "policy/v1beta1".into() } else { policy.into() },
        );
    let streaming_lists = streams_lists(client).await?;
    Ok(Versions {
        policy: policy.to_string(),
        eviction,
        server: format!("{}.{}", info.major, info.minor),
        streaming_lists,
    })
}

/// Whether the server streams initial lists: a watch asking for them (on Namespaces, which
/// every reflector here may read) is answered, or refused as invalid (422: the WatchList
/// feature is off, or the server predates it and refuses `resourceVersionMatch` on a watch).
/// Any other error is returned, not read as "unsupported" (the caller retries).
async fn streams_lists(client: &kube::Client) -> Result<bool, ClusterError> {
    let api: Api<k8s::Namespace> = Api::all(client.clone());
    let params = kube::api::WatchParams::streaming_lists().timeout(1);
    match api.watch(&params, "0").await {
        // The stream is dropped unread: only the answer's status mattered.
        Ok(_) => Ok(true),
        Err(kube::Error::Api(s)) if s.code == 422 || s.code == 400 => Ok(false),
        Err(e) => Err(ClusterError::Unavailable { reason: format!("discovering streaming lists: {e}") }),
    }
}

impl ClusterView for KubeCluster {
    /// The caches as one snapshot. Under the store's lock only a copy is taken (cheap: the
    /// pods are shared by chunk); the volumes are resolved after the lock is let go, so the
    /// watches never wait for a snapshot being built. One built is kept until the next change.
    fn snapshot(&self) -> Arc<Snapshot> {
        let (copy, mut said, version) = {
            let s = self.shared.lock();
            if let Some(shared) = &s.shared {
                return shared.clone();
            }
            (s.snap.clone(), s.volume_errors.clone(), s.snap.resource_version)
        };
        let snap = Arc::new(store::resolve_volumes(copy, &mut said));
        let mut s = self.shared.lock();
        // Kept only if nothing changed meanwhile (a change made its own copy stale).
        if s.snap.resource_version == version {
            s.volume_errors = said;
            s.shared = Some(snap.clone());
        }
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
