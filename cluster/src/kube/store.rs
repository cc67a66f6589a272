//! The reflector caches: one watch per kind, each event converted into core's objects as it
//! arrives (the Kubernetes object itself, `managedFields` and all, is dropped at once), and
//! applied to one [`Snapshot`] under a lock. A (re)list is buffered from `Init` to `InitDone`
//! and swapped in whole, so an object never goes missing while a watch restarts (after a
//! 410 Gone, or an API server restart); the kind counts as synced from its first `InitDone`.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Debug;
use std::sync::{Arc, Mutex, MutexGuard};

use dovetail_api::convert::{self, ConversionError, Ctx};
use dovetail_api::crd;
use dovetail_core::cluster::{
    IntOrPercent, NodeClaim, Pdb, Snapshot, Unreadable, UnreadableKind, VolumeClaim, VolumeError,
};
use dovetail_core::labels::Labels;
use dovetail_core::node::Node;
use dovetail_core::nodepool::NodePool;
use dovetail_core::pod::{Pod, PodInterner, PodKey};
use dovetail_core::requirements::Requirements;
use futures::StreamExt;
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1 as k8s;
use k8s_openapi::api::storage::v1::StorageClass;
use kube::Api;
use kube::api::DynamicObject;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use serde::de::DeserializeOwned;
use tokio::sync::watch;

/// Every kind the view watches; the view is synced once each has listed once.
pub const KINDS: [&str; 11] = [
    "Pod",
    "Node",
    "NodeClaim",
    "NodePool",
    "EC2NodeClass",
    "DaemonSet",
    "PodDisruptionBudget",
    "Namespace",
    "PersistentVolumeClaim",
    "PersistentVolume",
    "StorageClass",
];

/// The caches and what the kube writer needs beside core's objects.
#[derive(Default)]
pub struct Store {
    pub snap: Snapshot,
    /// The last snapshot handed out, until the next change.
    pub shared: Option<Arc<Snapshot>>,
    pub synced: BTreeSet<&'static str>,
    pub nodeclasses: BTreeMap<String, Arc<crd::EC2NodeClass>>,
    /// NodePool uids, for the ownerReference of the NodeClaims made for them.
    pub pool_uids: BTreeMap<String, String>,
    /// NodePool status as read, so that a restarted controller keeps each condition's
    /// transition time and does not rewrite a status that has not changed.
    pub pool_statuses: BTreeMap<String, crd::NodePoolStatus>,
    /// EC2NodeClass status as read (valid or not), for the same reason.
    pub class_statuses: BTreeMap<String, crd::EC2NodeClassStatus>,
    /// NodeClaim uids, for the ownerReference of their Nodes.
    pub claim_uids: BTreeMap<String, String>,
    /// NodeClaim conditions as written, so that a status write keeps each transition time.
    pub claim_conditions: BTreeMap<String, Vec<crd::Condition>>,
    /// Objects that could not be converted, by `Kind name`, with the field at fault.
    pub invalid: BTreeMap<String, ConversionError>,
    /// Watch errors seen, by kind (each retried with backoff).
    pub watch_errors: BTreeMap<&'static str, u64>,
    /// Pending pods whose volumes cannot be placed, with why (logged once per change).
    pub volume_errors: BTreeMap<PodKey, VolumeError>,
    /// One copy of what the pods (and DaemonSet templates) of a workload share.
    pub interner: PodInterner,
}

/// The snapshot handed out: the caches, with each pending pod's volume claims resolved into
/// its topology alternatives. A pod whose claims cannot be resolved (a claim, its volume or
/// its class not found) is left out, as Karpenter does not provision for it; why is logged
/// once per change (`said`: what the last snapshot said, replaced by what this one finds).
///
/// It works on a copy taken under the store's lock, which is cheap (the pods are a
/// [`dovetail_core::cluster::chunked::ChunkedMap`]: a pointer per chunk); nothing here holds
/// the lock the watches need.
pub fn resolve_volumes(mut snap: Snapshot, said: &mut BTreeMap<PodKey, VolumeError>) -> Snapshot {
    let with_volumes: Vec<Arc<Pod>> = snap.pods.pending().filter(|p| !p.volume_claims.is_empty()).cloned().collect();
    let mut errors = BTreeMap::new();
    for pod in with_volumes {
        match snap.storage.requirements(&pod) {
            Ok(reqs) => {
                let mut p = pod.as_ref().clone();
                p.volume_requirements = reqs;
                snap.pods.insert(p.key.clone(), Arc::new(p));
            }
            Err(e) => {
                if said.get(&pod.key) != Some(&e) {
                    tracing::warn!(pod = %pod.key, error = %e, "not provisioning for pod {}: {e}", pod.key);
                }
                snap.pods.remove(&pod.key);
                errors.insert(pod.key.clone(), e);
            }
        }
    }
    *said = errors;
    snap
}

/// The store with its change signal.
pub struct Shared {
    store: Mutex<Store>,
    tx: watch::Sender<u64>,
}

impl Shared {
    pub fn new() -> Self {
        Shared { store: Mutex::new(Store::default()), tx: watch::channel(0).0 }
    }

    pub fn lock(&self) -> MutexGuard<'_, Store> {
        self.store.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.tx.subscribe()
    }

    /// Runs one change to the caches: bumps the view's resource version, drops the shared
    /// snapshot and notifies watchers.
    pub fn change(&self, f: impl FnOnce(&mut Store)) {
        let version = {
            let mut s = self.lock();
            f(&mut s);
            s.snap.resource_version += 1;
            s.shared = None;
            s.snap.resource_version
        };
        self.tx.send_replace(version);
    }
}

impl Default for Shared {
    fn default() -> Self {
        Shared::new()
    }
}

/// A kind the view caches: how its objects convert and where they go.
pub trait Cached: kube::Resource + Clone + DeserializeOwned + Debug + Send + 'static {
    const KIND: &'static str;
    type Item: Send + 'static;
    /// `namespace/name`, or the name of a cluster-scoped object.
    fn id(&self) -> String {
        let meta = self.meta();
        match &meta.namespace {
            Some(ns) => format!("{ns}/{}", meta.name.as_deref().unwrap_or_default()),
            None => meta.name.clone().unwrap_or_default(),
        }
    }
    fn convert(&self) -> Result<Self::Item, ConversionError>;
    /// Makes the item share what it has in common with what is cached (the pods of one
    /// workload, their labels and constraints), before it is buffered or stored.
    fn share(_store: &mut Store, _item: &mut Self::Item) {}
    fn upsert(store: &mut Store, item: Self::Item);
    fn remove(store: &mut Store, id: &str);
    fn clear(store: &mut Store);
    /// What is kept of an object that cannot be used (after [`Cached::remove`]): the status
    /// it shows, so that a restarted controller keeps its transition times.
    fn remember_invalid(&self, _store: &mut Store) {}
}

fn pod_key(id: &str) -> PodKey {
    match id.split_once('/') {
        Some((ns, name)) => PodKey::new(ns, name),
        None => PodKey::new("default", id),
    }
}

impl Cached for k8s::Pod {
    const KIND: &'static str = "Pod";
    type Item = Pod;
    fn convert(&self) -> Result<Pod, ConversionError> {
        convert::pod_object(self)
    }
    fn share(store: &mut Store, item: &mut Pod) {
        store.interner.intern(item);
    }
    fn upsert(store: &mut Store, item: Pod) {
        store.snap.pods.insert(item.key.clone(), Arc::new(item));
    }
    fn remove(store: &mut Store, id: &str) {
        store.snap.pods.remove(&pod_key(id));
    }
    fn clear(store: &mut Store) {
        store.snap.pods.clear();
    }
}

/// Keeps an object that could not be converted by identity ([`Unreadable`]), with the error
/// its conversion recorded.
fn keep_unreadable(
    store: &mut Store,
    kind: UnreadableKind,
    meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
    provider_id: Option<String>,
) {
    let name = meta.name.clone().unwrap_or_default();
    let key = Unreadable::key(kind, &name);
    let error = store.invalid.get(&key).map(ToString::to_string).unwrap_or_default();
    let kept = Unreadable {
        kind,
        name,
        uid: meta.uid.clone().unwrap_or_default(),
        provider_id: provider_id.filter(|p| !p.is_empty()),
        labels: meta.labels.clone().unwrap_or_default(),
        error,
    };
    store.snap.unreadable.insert(key, Arc::new(kept));
}

fn forget_unreadable(store: &mut Store, kind: UnreadableKind, name: &str) {
    store.snap.unreadable.remove(&Unreadable::key(kind, name));
}

fn clear_unreadable(store: &mut Store, kind: UnreadableKind) {
    store.snap.unreadable.retain(|_, u| u.kind != kind);
}

impl Cached for k8s::Node {
    const KIND: &'static str = "Node";
    type Item = Node;
    fn convert(&self) -> Result<Node, ConversionError> {
        convert::node(&Ctx::new(format!("Node {}", self.id())), self)
    }
    fn upsert(store: &mut Store, item: Node) {
        forget_unreadable(store, UnreadableKind::Node, &item.name);
        store.snap.nodes.insert(item.name.clone(), Arc::new(item));
    }
    fn remove(store: &mut Store, id: &str) {
        forget_unreadable(store, UnreadableKind::Node, id);
        store.snap.nodes.remove(id);
    }
    fn clear(store: &mut Store) {
        clear_unreadable(store, UnreadableKind::Node);
        store.snap.nodes.clear();
    }
    /// A Node that cannot be read still stands on its instance: nothing takes it for lost.
    fn remember_invalid(&self, store: &mut Store) {
        let provider_id = self.spec.as_ref().and_then(|s| s.provider_id.clone());
        keep_unreadable(store, UnreadableKind::Node, &self.metadata, provider_id);
    }
}

impl Cached for crd::NodeClaim {
    const KIND: &'static str = "NodeClaim";
    type Item = (NodeClaim, Vec<crd::Condition>, String);
    fn convert(&self) -> Result<Self::Item, ConversionError> {
        let conditions = self.status.as_ref().and_then(|s| s.conditions.clone()).unwrap_or_default();
        Ok((convert::nodeclaim_from_object(self)?, conditions, self.metadata.uid.clone().unwrap_or_default()))
    }
    fn upsert(store: &mut Store, (claim, conditions, uid): Self::Item) {
        forget_unreadable(store, UnreadableKind::NodeClaim, &claim.name);
        store.claim_conditions.insert(claim.name.clone(), conditions);
        store.claim_uids.insert(claim.name.clone(), uid);
        store.snap.nodeclaims.insert(claim.name.clone(), Arc::new(claim));
    }
    fn remove(store: &mut Store, id: &str) {
        forget_unreadable(store, UnreadableKind::NodeClaim, id);
        store.claim_conditions.remove(id);
        store.claim_uids.remove(id);
        store.snap.nodeclaims.remove(id);
    }
    fn clear(store: &mut Store) {
        clear_unreadable(store, UnreadableKind::NodeClaim);
        store.claim_conditions.clear();
        store.claim_uids.clear();
        store.snap.nodeclaims.clear();
    }
    /// A NodeClaim that cannot be read (a newer Karpenter's field) still owns its instance
    /// and its Node: kept by identity, so neither looks orphaned to garbage collection.
    fn remember_invalid(&self, store: &mut Store) {
        let provider_id = self.status.as_ref().and_then(|s| s.provider_id.clone());
        keep_unreadable(store, UnreadableKind::NodeClaim, &self.metadata, provider_id);
    }
}

impl Cached for crd::NodePool {
    const KIND: &'static str = "NodePool";
    type Item = (NodePool, String, Option<crd::NodePoolStatus>);
    fn convert(&self) -> Result<Self::Item, ConversionError> {
        Ok((convert::nodepool(self)?, self.metadata.uid.clone().unwrap_or_default(), self.status.clone()))
    }
    fn upsert(store: &mut Store, (pool, uid, status): Self::Item) {
        store.pool_uids.insert(pool.name.clone(), uid);
        match status {
            Some(status) => store.pool_statuses.insert(pool.name.clone(), status),
            None => store.pool_statuses.remove(&pool.name),
        };
        store.snap.nodepools.insert(pool.name.clone(), Arc::new(pool));
    }
    fn remove(store: &mut Store, id: &str) {
        store.pool_uids.remove(id);
        store.pool_statuses.remove(id);
        store.snap.nodepools.remove(id);
    }
    fn clear(store: &mut Store) {
        store.pool_uids.clear();
        store.pool_statuses.clear();
        store.snap.nodepools.clear();
    }
    fn remember_invalid(&self, store: &mut Store) {
        if let Some(status) = &self.status {
            store.pool_statuses.insert(self.id(), status.clone());
        }
    }
}

impl Cached for crd::EC2NodeClass {
    const KIND: &'static str = "EC2NodeClass";
    type Item = crd::EC2NodeClass;
    fn convert(&self) -> Result<Self::Item, ConversionError> {
        // Checked here so that a bad one is reported; the object itself is what is kept.
        convert::validate_nodeclass(self)?;
        convert::node_class_settings(self)?;
        let mut nc = self.clone();
        nc.metadata.managed_fields = None;
        Ok(nc)
    }
    fn upsert(store: &mut Store, item: Self::Item) {
        let name = item.metadata.name.clone().unwrap_or_default();
        match &item.status {
            Some(status) => store.class_statuses.insert(name.clone(), status.clone()),
            None => store.class_statuses.remove(&name),
        };
        store.nodeclasses.insert(name, Arc::new(item));
    }
    fn remove(store: &mut Store, id: &str) {
        store.class_statuses.remove(id);
        store.nodeclasses.remove(id);
    }
    fn clear(store: &mut Store) {
        store.class_statuses.clear();
        store.nodeclasses.clear();
    }
    fn remember_invalid(&self, store: &mut Store) {
        if let Some(status) = &self.status {
            store.class_statuses.insert(self.id(), status.clone());
        }
    }
}

impl Cached for DaemonSet {
    const KIND: &'static str = "DaemonSet";
    type Item = Pod;
    fn convert(&self) -> Result<Pod, ConversionError> {
        let id = self.id();
        let ctx = Ctx::new(format!("DaemonSet {id}"));
        let spec = &self.spec;
        let template = spec.template.spec.as_ref().ok_or_else(|| ctx.err("spec.template.spec", "missing"))?;
        let tmeta = spec.template.metadata.clone().unwrap_or_default();
        let key = pod_key(&id);
        let meta = convert::PodMeta {
            namespace: key.namespace,
            name: key.name,
            labels: tmeta.labels.unwrap_or_default(),
            annotations: tmeta.annotations.unwrap_or_default(),
            creation: 0,
            daemon: true,
            owned_by_node: false,
            terminal: false,
        };
        convert::pod_from_spec(&ctx, "spec.template.spec", meta, template)
    }
    fn share(store: &mut Store, item: &mut Pod) {
        store.interner.intern(item);
    }
    fn upsert(store: &mut Store, item: Pod) {
        store.snap.daemonsets.insert(item.key.clone(), Arc::new(item));
    }
    fn remove(store: &mut Store, id: &str) {
        store.snap.daemonsets.remove(&pod_key(id));
    }
    fn clear(store: &mut Store) {
        store.snap.daemonsets.clear();
    }
}

impl Cached for k8s::Namespace {
    const KIND: &'static str = "Namespace";
    type Item = (String, Labels);
    fn convert(&self) -> Result<Self::Item, ConversionError> {
        Ok((self.id(), self.metadata.labels.clone().unwrap_or_default()))
    }
    fn upsert(store: &mut Store, (name, labels): Self::Item) {
        store.snap.namespaces.insert(name, labels);
    }
    fn remove(store: &mut Store, id: &str) {
        store.snap.namespaces.remove(id);
    }
    fn clear(store: &mut Store) {
        store.snap.namespaces.clear();
    }
}

impl Cached for k8s::PersistentVolumeClaim {
    const KIND: &'static str = "PersistentVolumeClaim";
    type Item = (String, VolumeClaim);
    fn convert(&self) -> Result<Self::Item, ConversionError> {
        Ok((self.id(), convert::volume_claim(self)))
    }
    fn upsert(store: &mut Store, (id, claim): Self::Item) {
        store.snap.storage.claims.insert(id, claim);
    }
    fn remove(store: &mut Store, id: &str) {
        store.snap.storage.claims.remove(id);
    }
    fn clear(store: &mut Store) {
        store.snap.storage.claims.clear();
    }
}

impl Cached for k8s::PersistentVolume {
    const KIND: &'static str = "PersistentVolume";
    type Item = (String, Vec<Requirements>);
    fn convert(&self) -> Result<Self::Item, ConversionError> {
        Ok((self.id(), convert::volume_topology(self)?))
    }
    fn upsert(store: &mut Store, (name, terms): Self::Item) {
        store.snap.storage.volumes.insert(name, terms);
    }
    fn remove(store: &mut Store, id: &str) {
        store.snap.storage.volumes.remove(id);
    }
    fn clear(store: &mut Store) {
        store.snap.storage.volumes.clear();
    }
}

impl Cached for StorageClass {
    const KIND: &'static str = "StorageClass";
    type Item = (String, Vec<Requirements>);
    fn convert(&self) -> Result<Self::Item, ConversionError> {
        Ok((self.id(), convert::class_topology(self)?))
    }
    fn upsert(store: &mut Store, (name, terms): Self::Item) {
        store.snap.storage.classes.insert(name, terms);
    }
    fn remove(store: &mut Store, id: &str) {
        store.snap.storage.classes.remove(id);
    }
    fn clear(store: &mut Store) {
        store.snap.storage.classes.clear();
    }
}

fn int_or_percent(
    ctx: &Ctx,
    field: &str,
    v: Option<&serde_json::Value>,
) -> Result<Option<IntOrPercent>, ConversionError> {
    match v {
        None | Some(serde_json::Value::Null) => Ok(None),
        Some(serde_json::Value::Number(n)) => n
            .as_i64()
            .and_then(|n| i32::try_from(n).ok())
            .map(|n| Some(IntOrPercent::Int(n)))
            .ok_or_else(|| ctx.err(field, format!("{n} is not a 32-bit integer"))),
        Some(serde_json::Value::String(s)) => match s.strip_suffix('%').map(str::parse::<i32>) {
            Some(Ok(p)) => Ok(Some(IntOrPercent::Percent(p))),
            _ => s
                .parse::<i32>()
                .map(|n| Some(IntOrPercent::Int(n)))
                .map_err(|_| ctx.err(field, format!("{s:?} is neither an integer nor a percentage"))),
        },
        Some(other) => Err(ctx.err(field, format!("{other} is neither an integer nor a percentage"))),
    }
}

/// PodDisruptionBudgets are watched as dynamic objects, at the version discovery found
/// (`policy/v1`, or `policy/v1beta1` before Kubernetes 1.21): the fields read are the same.
impl Cached for DynamicObject {
    const KIND: &'static str = "PodDisruptionBudget";
    type Item = Pdb;
    fn convert(&self) -> Result<Pdb, ConversionError> {
        let id = self.id();
        let ctx = Ctx::new(format!("PodDisruptionBudget {id}"));
        let spec = self.data.get("spec");
        let selector: Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector> = match spec
            .and_then(|s| s.get("selector"))
        {
            None | Some(serde_json::Value::Null) => None,
            Some(v) => Some(serde_json::from_value(v.clone()).map_err(|e| ctx.err("spec.selector", e.to_string()))?),
        };
        let selector = convert::label_selector(&ctx, "spec.selector", selector.as_ref())?
            .unwrap_or_else(|| dovetail_core::labels::LabelSelector::new(Default::default(), Vec::new()));
        let allowed = self
            .data
            .get("status")
            .and_then(|s| s.get("disruptionsAllowed"))
            .and_then(serde_json::Value::as_i64)
            .and_then(|n| i32::try_from(n).ok())
            .unwrap_or(0);
        Ok(Pdb {
            key: pod_key(&id),
            selector,
            min_available: int_or_percent(&ctx, "spec.minAvailable", spec.and_then(|s| s.get("minAvailable")))?,
            max_unavailable: int_or_percent(&ctx, "spec.maxUnavailable", spec.and_then(|s| s.get("maxUnavailable")))?,
            disruptions_allowed: allowed,
        })
    }
    fn upsert(store: &mut Store, item: Pdb) {
        store.snap.pdbs.insert(item.key.clone(), Arc::new(item));
    }
    fn remove(store: &mut Store, id: &str) {
        store.snap.pdbs.remove(&pod_key(id));
    }
    fn clear(store: &mut Store) {
        store.snap.pdbs.clear();
    }
}

/// A (re)list under way: what it converted so far (kept until it ends, then swapped in
/// whole, so an object never goes missing while a watch restarts), every object it returned,
/// valid or not (an invalid one deleted while the watch was down must not stay reported),
/// and the listed objects that cannot be used (few: what is kept of them).
pub(super) struct Listing<K: Cached> {
    items: Vec<K::Item>,
    listed: BTreeSet<String>,
    unusable: Vec<K>,
}

impl<K: Cached> Listing<K> {
    pub(super) fn new() -> Self {
        Listing { items: Vec::new(), listed: BTreeSet::new(), unusable: Vec::new() }
    }

    /// One listed object, converted as it arrives and sharing what the cached objects share
    /// (a list of 300,000 pods is buffered converted, never as API objects).
    pub(super) fn add(&mut self, shared: &Shared, obj: K) {
        self.listed.insert(obj.id());
        match converted(shared, &obj) {
            Some(mut item) => {
                K::share(&mut shared.lock(), &mut item);
                self.items.push(item);
            }
            None => self.unusable.push(obj),
        }
    }

    /// The list is complete: it replaces the kind's cache whole, and the kind is synced.
    pub(super) fn finish(self, shared: &Shared) {
        let Listing { items, listed, unusable } = self;
        shared.change(|s| {
            let prefix = format!("{} ", K::KIND);
            s.invalid.retain(|key, _| key.strip_prefix(&prefix).is_none_or(|id| listed.contains(id)));
            K::clear(s);
            for item in items {
                K::upsert(s, item);
            }
            for obj in &unusable {
                obj.remember_invalid(s);
            }
            s.synced.insert(K::KIND);
        });
    }
}

/// An object added or changed, as a watch reports it.
pub(super) fn apply<K: Cached>(shared: &Shared, obj: K) {
    let id = obj.id();
    let item = converted(shared, &obj);
    shared.change(|s| match item {
        Some(mut item) => {
            K::share(s, &mut item);
            K::upsert(s, item);
        }
        None => {
            K::remove(s, &id);
            obj.remember_invalid(s);
        }
    });
}

/// An object deleted, as a watch reports it.
pub(super) fn delete<K: Cached>(shared: &Shared, obj: &K) {
    let id = obj.id();
    shared.change(|s| {
        s.invalid.remove(&format!("{} {id}", K::KIND));
        K::remove(s, &id);
    });
}

/// A watch error, counted (and logged by the caller).
pub(super) fn watch_error<K: Cached>(shared: &Shared) {
    *shared.lock().watch_errors.entry(K::KIND).or_default() += 1;
}

/// Follows one kind until the process ends. Where the server streams lists, kube's watcher
/// does (each object of the initial list arrives as an event); elsewhere, and on a server
/// that refuses a streamed list later, [`super::list::follow_listed`] lists from the watch
/// cache, reading the answer as it arrives.
pub async fn follow<K: Cached>(api: Api<K>, shared: Arc<Shared>, streaming: bool) {
    if !streaming {
        super::list::follow_listed(api, shared).await;
        return;
    }
    let config = super::watch_config(true);
    let mut events = watcher::watcher(api.clone(), config).default_backoff().boxed();
    let mut listing: Option<Listing<K>> = None;
    while let Some(event) = events.next().await {
        match event {
            Ok(Event::Init) => listing = Some(Listing::new()),
            Ok(Event::InitApply(obj)) => listing.get_or_insert_with(Listing::new).add(&shared, obj),
            Ok(Event::InitDone) => listing.take().unwrap_or_else(Listing::new).finish(&shared),
            Ok(Event::Apply(obj)) => apply(&shared, obj),
            Ok(Event::Delete(obj)) => delete(&shared, &obj),
            Err(e) => {
                watch_error::<K>(&shared);
                if refuses_streaming(&e) {
                    // An API server of a mixed-version group (or with the feature turned off
                    // since discovery) refuses streamed lists: this kind lists instead.
                    tracing::warn!(kind = K::KIND, error = %e, "the API server refused a streamed list of {}; listing instead", K::KIND);
                    super::list::follow_listed(api, shared).await;
                    return;
                }
                tracing::warn!(kind = K::KIND, error = %e, "watch of {} failed; retrying with backoff", K::KIND);
            }
        }
    }
}

/// Whether a watch error is the server refusing a streamed list (422 at the watch's start).
fn refuses_streaming(e: &watcher::Error) -> bool {
    matches!(e, watcher::Error::WatchStartFailed(kube::Error::Api(s)) if s.code == 422)
}

/// The object converted, or `None` with the error recorded (named by object and field) and
/// logged once per change of message.
fn converted<K: Cached>(shared: &Shared, obj: &K) -> Option<K::Item> {
    let key = format!("{} {}", K::KIND, obj.id());
    match obj.convert() {
        Ok(item) => {
            shared.lock().invalid.remove(&key);
            Some(item)
        }
        Err(e) => {
            let mut s = shared.lock();
            if s.invalid.get(&key) != Some(&e) {
                tracing::warn!(object = %key, field = %e.field, error = %e, "ignoring {key}: {e}");
                s.invalid.insert(key, e);
            }
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dovetail_core::shared::Shared;

    fn replica(name: &str, team: &str) -> k8s::Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "namespace": "shop", "labels": {"app": "web", "team": team},
                         "annotations": {"prometheus.io/scrape": "true", "karpenter.sh/do-not-disrupt": "true"}},
            "spec": {"nodeName": "n1", "containers": [{"name": "app", "resources": {"requests": {"cpu": "1"}}}],
                     "tolerations": [{"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute"}]}
        }))
        .expect("a pod")
    }

    #[test]
    fn cached_pods_of_one_workload_share_their_labels_and_keep_only_karpenters_annotations() {
        let mut store = Store::default();
        for (name, team) in [("web-1", "a"), ("web-2", "a"), ("web-3", "b")] {
            let mut item = replica(name, team).convert().expect("converts");
            k8s::Pod::share(&mut store, &mut item);
            k8s::Pod::upsert(&mut store, item);
        }
        let pod = |n: &str| store.snap.pods.get(&PodKey::new("shop", n)).cloned().expect("cached");
        let (one, two, three) = (pod("web-1"), pod("web-2"), pod("web-3"));
        assert!(Shared::same(&one.labels, &two.labels), "equal labels are one copy");
        assert!(!Shared::same(&one.labels, &three.labels));
        assert!(Shared::same(&one.tolerations, &three.tolerations));
        assert_eq!(one.annotations.keys().collect::<Vec<_>>(), ["karpenter.sh/do-not-disrupt"]);
    }
}
