//! The in-memory cluster: the API server's objects with resource versions (the cluster's and
//! each object's), change notifications, writes with resource-version preconditions (and
//! conflicts injected on demand, as a busy API server gives them), the status subresource,
//! finalizers and deletion, the eviction API with PodDisruptionBudgets and their status
//! bookkeeping, and Events. The scheduler, registrar and workload controllers that play
//! Kubernetes around it build on its inputs (`apply_*`, `bind`).

mod workloads;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use dovetail_core::cluster::UNREGISTERED_TAINT;
use dovetail_core::node::Node;
use dovetail_core::nodepool::NodePool;
use dovetail_core::pod::{Pod, PodInterner, PodKey};
use dovetail_core::taints::Taint;
use tokio::sync::watch;

#[cfg(test)]
use crate::IntOrPercent;
use crate::{BoxFuture, Event, NodeClaimUpdate, NodeUpdate, Pdb};
use crate::{ClusterError, ClusterView, ClusterWriter, NodeClaim, NodeClaimStatus, Snapshot};

/// Events kept (the newest), for tests and reports.
const EVENTS_KEPT: usize = 10_000;

pub use workloads::{Deployment, Job, JobStatus, Pick, Registrar, WorkloadStep, Workloads};

/// The sim cluster.
pub struct SimCluster {
    state: Mutex<State>,
    tx: watch::Sender<u64>,
    synced: AtomicBool,
    /// The API server's clock: NodeClaims created get their `creationTimestamp` from it
    /// (without one, none, as a test that does not care).
    clock: Option<Arc<dyn dovetail_core::clock::Clock>>,
}

struct State {
    objects: Snapshot,
    /// The last snapshot handed out, until the next change.
    shared: Option<Arc<Snapshot>>,
    /// Conditional writes still to refuse with `Conflict` (another writer got there first).
    conflicts: u32,
    events: std::collections::VecDeque<Event>,
    /// Writes made through the writer seam (the plane's API calls), by kind.
    writes: std::collections::BTreeMap<&'static str, u64>,
    /// One copy of what the pods of a workload share, as the kube view keeps them.
    interner: PodInterner,
    /// Pods deleted through the writer seam with the grace period asked (the newest
    /// [`EVENTS_KEPT`]).
    deleted: std::collections::VecDeque<(PodKey, Option<i64>)>,
}

impl Default for SimCluster {
    fn default() -> Self {
        SimCluster::new()
    }
}

impl SimCluster {
    pub fn new() -> Self {
        let state = State {
            objects: Snapshot::default(),
            shared: None,
            conflicts: 0,
            events: Default::default(),
            writes: Default::default(),
            interner: PodInterner::default(),
            deleted: Default::default(),
        };
        SimCluster { state: Mutex::new(state), tx: watch::channel(0).0, synced: AtomicBool::new(true), clock: None }
    }

    /// The same, stamping the objects it creates with `clock`'s time, as an API server does.
    pub fn with_clock(mut self, clock: Arc<dyn dovetail_core::clock::Clock>) -> Self {
        self.clock = Some(clock);
        self
    }

    /// Whether the view reports the initial lists in (a cache warming up says no).
    pub fn set_synced(&self, synced: bool) {
        self.synced.store(synced, Ordering::SeqCst);
    }

    /// The next `n` writes made from a read (with a resource-version precondition) fail
    /// with `Conflict`, as when another writer changed the object in between.
    pub fn inject_conflicts(&self, n: u32) {
        self.lock().conflicts = n;
    }

    /// The Events recorded (the newest [`EVENTS_KEPT`]).
    pub fn events(&self) -> Vec<Event> {
        self.lock().events.iter().cloned().collect()
    }

    /// Pods the writer seam deleted (bypassing PDBs), each with the grace period asked
    /// (`None`: the pod's own); the sim stops them at once either way.
    pub fn deleted_with_grace(&self) -> Vec<(PodKey, Option<i64>)> {
        self.lock().deleted.iter().cloned().collect()
    }

    /// Writes made through the writer seam so far, by method.
    pub fn writes(&self) -> std::collections::BTreeMap<&'static str, u64> {
        self.lock().writes.clone()
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Runs one change: `f` gets the objects and the version this change makes (to stamp the
    /// objects it changes with), then the resource version is bumped, PDB status kept and
    /// watchers notified.
    fn change<T>(&self, f: impl FnOnce(&mut Snapshot, u64) -> Result<T, ClusterError>) -> Result<u64, ClusterError> {
        let version = {
            let mut state = self.lock();
            let s = &mut state.objects;
            let version = s.resource_version + 1;
            f(s, version)?;
            s.resource_version = version;
            refresh_pdbs(s);
            state.shared = None;
            version
        };
        self.tx.send_replace(version);
        Ok(version)
    }

    /// A write through the writer seam: counted, and refused with `Conflict` while injected
    /// conflicts last (`conditional`: it carries a precondition).
    fn write<T>(
        &self,
        method: &'static str,
        conditional: Option<(&'static str, &str)>,
        f: impl FnOnce(&mut Snapshot, u64) -> Result<T, ClusterError>,
    ) -> Result<u64, ClusterError> {
        {
            let mut state = self.lock();
            *state.writes.entry(method).or_default() += 1;
            if let Some((kind, name)) = conditional
                && state.conflicts > 0
            {
                state.conflicts -= 1;
                return Err(ClusterError::Conflict { kind, name: name.to_string() });
            }
        }
        self.change(f)
    }

    /// Creates or replaces a pod (a user, or a workload controller).
    pub fn apply_pod(&self, mut pod: Pod) -> u64 {
        self.lock().interner.intern(&mut pod);
        self.change(|s, _| {
            s.pods.insert(pod.key.clone(), Arc::new(pod));
            Ok(())
        })
        .unwrap_or_default()
    }

    /// Creates or replaces pods in one change (a controller's round).
    pub fn apply_pods(&self, mut pods: Vec<Pod>) -> u64 {
        if pods.is_empty() {
            return self.lock().objects.resource_version;
        }
        {
            let mut state = self.lock();
            for pod in &mut pods {
                state.interner.intern(pod);
            }
        }
        self.change(|s, _| {
            for pod in pods {
                s.pods.insert(pod.key.clone(), Arc::new(pod));
            }
            Ok(())
        })
        .unwrap_or_default()
    }

    /// Deletes the pods that are there, in one change; returns how many went.
    pub fn delete_pods(&self, keys: &[PodKey]) -> usize {
        if keys.is_empty() {
            return 0;
        }
        let mut gone = 0;
        let changed = self.change(|s, _| {
            gone = keys.iter().filter(|k| s.pods.remove(k).is_some()).count();
            Ok(())
        });
        debug_assert!(changed.is_ok(), "an infallible change");
        gone
    }

    /// Makes an object unreadable, as a NodeClaim of a newer Karpenter is to the kube adapter:
    /// it leaves the typed caches and is kept by identity only
    /// ([`dovetail_core::cluster::Unreadable`]).
    pub fn make_unreadable(&self, u: dovetail_core::cluster::Unreadable) -> u64 {
        self.change(|s, _| {
            match u.kind {
                dovetail_core::cluster::UnreadableKind::NodeClaim => s.nodeclaims.remove(&u.name).map(|_| ()),
                dovetail_core::cluster::UnreadableKind::Node => s.nodes.remove(&u.name).map(|_| ()),
            };
            s.unreadable.insert(dovetail_core::cluster::Unreadable::key(u.kind, &u.name), Arc::new(u));
            Ok(())
        })
        .unwrap_or_default()
    }

    /// Binds a pending pod to a node (what kube-scheduler does).
    pub fn bind(&self, key: &PodKey, node: &str) -> Result<u64, ClusterError> {
        self.change(|s, _| {
            if !s.nodes.contains_key(node) {
                return Err(not_found("node", node.to_string()));
            }
            let bound = s.pods.get(key).ok_or_else(|| not_found("pod", key.to_string()))?.node_name.is_some();
            if bound {
                return Err(ClusterError::Conflict { kind: "pod", name: key.to_string() });
            }
            s.pods.update(key, |pod| {
                pod.node_name = Some(node.to_string());
                pod.unschedulable = false;
            });
            Ok(())
        })
    }

    /// Creates or replaces a node (the registrar, or a user's existing nodes).
    pub fn apply_node(&self, mut node: Node) -> u64 {
        self.change(|s, v| {
            node.resource_version = v;
            s.nodes.insert(node.name.clone(), Arc::new(node));
            Ok(())
        })
        .unwrap_or_default()
    }

    pub fn apply_nodepool(&self, pool: NodePool) -> u64 {
        self.change(|s, _| {
            s.nodepools.insert(pool.name.clone(), Arc::new(pool));
            Ok(())
        })
        .unwrap_or_default()
    }

    /// Creates or replaces a DaemonSet (its pod template).
    pub fn apply_daemonset(&self, template: Pod) -> u64 {
        self.change(|s, _| {
            s.daemonsets.insert(template.key.clone(), Arc::new(template));
            Ok(())
        })
        .unwrap_or_default()
    }

    /// Creates or replaces a PDB; its status is computed here.
    pub fn apply_pdb(&self, pdb: Pdb) -> u64 {
        self.change(|s, _| {
            s.pdbs.insert(pdb.key.clone(), Arc::new(pdb));
            Ok(())
        })
        .unwrap_or_default()
    }
}

/// A launched instance as its node will register it.
#[derive(Clone, Debug, PartialEq)]
pub struct Registration {
    /// The NodeClaim it was launched for.
    pub claim: String,
    pub node_name: String,
    pub provider_id: String,
    /// The instance's labels (type, zone, capacity type, ...).
    pub labels: dovetail_core::labels::Labels,
    pub capacity: dovetail_core::resources::ResourceList,
    pub allocatable: dovetail_core::resources::ResourceList,
}

impl SimCluster {
    /// What a kubelet does when the instance boots (kwok-like): a Ready Node with the
    /// NodeClaim's labels, taints and startup taints, plus `karpenter.sh/unregistered:NoExecute`.
    /// `NotFound` when the NodeClaim is gone (the instance leaked); `AlreadyExists` when the
    /// node is there.
    pub fn register(&self, r: &Registration) -> Result<u64, ClusterError> {
        self.change(|s, v| {
            if s.nodes.contains_key(&r.node_name) {
                return Err(ClusterError::AlreadyExists { kind: "node", name: r.node_name.clone() });
            }
            let claim = s.nodeclaims.get(&r.claim).ok_or_else(|| not_found("nodeclaim", r.claim.clone()))?;
            let mut labels = r.labels.clone();
            labels.extend(claim.spec.labels.iter().map(|(k, v)| (k.clone(), v.clone())));
            labels.insert(dovetail_core::labels::NODEPOOL.to_string(), claim.spec.nodepool.clone());
            labels.insert(dovetail_core::labels::HOSTNAME.to_string(), r.node_name.clone());
            let mut taints = claim.spec.taints.clone();
            taints.extend(claim.spec.startup_taints.iter().cloned());
            taints.push(Taint::new(UNREGISTERED_TAINT, "", dovetail_core::taints::Effect::NoExecute));
            let node = Node {
                name: r.node_name.clone(),
                labels: labels.into(),
                taints,
                capacity: r.capacity.clone(),
                allocatable: r.allocatable.clone(),
                initialized: false,
                requirements: None,
                unschedulable: false,
                provider_id: Some(r.provider_id.clone()),
                ready: true,
                finalizers: Vec::new(),
                // A kubelet registers its node with no owner; registration adds it.
                owner_claim: None,
                deleting: false,
                do_not_disrupt: false,
                resource_version: v,
            };
            s.nodes.insert(node.name.clone(), Arc::new(node));
            Ok(())
        })
    }

    /// What kube-scheduler does: binds pending pods to existing schedulable nodes with the
    /// same predicates as `dovetail-core` (resources, taints, requirements, affinity, topology),
    /// in one pass. Returns how many pods it bound.
    pub fn schedule(&self) -> usize {
        let snap = self.snapshot();
        // kube-scheduler honours every taint; core's simulation ignores the boot taints of
        // nodes not yet initialized (Karpenter expects them to go), so the nodes are given to
        // it as initialized.
        let nodes: Vec<Node> = snap
            .nodes
            .values()
            .filter(|n| !n.unschedulable)
            .map(|n| Node { initialized: true, ..n.as_ref().clone() })
            .collect();
        let ours = |p: &&Arc<Pod>| p.uses_default_scheduler() && !p.scheduling_gated;
        if nodes.is_empty() {
            // Nothing to place on: no copy of the pending pods (300,000 of them are about
            // 250 MB) just to mark them.
            self.mark_unschedulable(snap.pending().filter(ours).map(|p| &p.key));
            return 0;
        }
        let pending: Vec<Pod> = snap.pending().filter(ours).map(|p| p.as_ref().clone()).collect();
        if pending.is_empty() {
            return 0;
        }
        let mut input = snap.scheduling_input(nodes, Vec::new());
        // kube-scheduler takes pods from its queue one at a time, roughly first come first
        // served: an old pod is not passed over by every newer one. Here (an approximation;
        // priority is not looked at, as the packer does not), pods that waited through an
        // earlier pass (marked unschedulable) go first and those that came since after, each group in one solve of the dovetail packer (largest first within
        // it; pods of a class skip the nodes an earlier twin could not use, so a pass over
        // 100,000 pods and 10,000 nodes is linear, not quadratic). In one solve of both, a
        // small pod left to a node's room by the Router lost that room to every larger pod
        // that arrived meanwhile, pass after pass (the soak's expiry waves: 17 minutes).
        let (waited, arrived): (Vec<Pod>, Vec<Pod>) = pending.into_iter().partition(|p| p.unschedulable);
        let mut bound = 0;
        let mut unplaced: Vec<PodKey> = Vec::new();
        for group in [waited, arrived] {
            if group.is_empty() {
                continue;
            }
            let results = dovetail_core::scheduling::solve(&input, &group, &Default::default());
            let mut placed = vec![false; group.len()];
            let mut now_bound: Vec<Arc<Pod>> = Vec::new();
            for placement in &results.existing {
                let node = &input.nodes[placement.node].name;
                for &i in &placement.pods {
                    if self.bind(&group[i].key, node).is_ok() {
                        bound += 1;
                        placed[i] = true;
                        now_bound.push(Arc::new(Pod {
                            node_name: Some(node.clone()),
                            unschedulable: false,
                            ..group[i].clone()
                        }));
                    }
                }
            }
            // What the first group took is taken for the second.
            input.bound_pods.extend(now_bound);
            unplaced.extend(group.into_iter().zip(placed).filter(|(_, p)| !*p).map(|(pod, _)| pod.key));
        }
        self.mark_unschedulable(unplaced.iter());
        bound
    }

    /// What kube-scheduler writes of a pod it could not place: `PodScheduled=False,
    /// reason=Unschedulable` (only for its own pods, not gated or nominated ones).
    fn mark_unschedulable<'a>(&self, keys: impl Iterator<Item = &'a PodKey>) {
        let keys: Vec<&PodKey> = keys.collect();
        let unmarked = {
            let state = self.lock();
            keys.iter().any(|k| state.objects.pods.get(*k).is_some_and(|p| markable(p)))
        };
        if !unmarked {
            return;
        }
        let changed = self.change(|s, _| {
            for k in keys {
                if s.pods.get(k).is_some_and(|p| markable(p)) {
                    s.pods.update(k, |p| p.unschedulable = true);
                }
            }
            Ok(())
        });
        debug_assert!(changed.is_ok(), "an infallible change");
    }
}

/// Whether kube-scheduler would mark the pod unschedulable now (not marked yet).
fn markable(p: &Pod) -> bool {
    p.node_name.is_none()
        && !p.unschedulable
        && !p.terminal
        && !p.deleting
        && !p.scheduling_gated
        && p.nominated_node.is_none()
        && p.uses_default_scheduler()
}

fn not_found(kind: &'static str, name: String) -> ClusterError {
    ClusterError::NotFound { kind, name }
}

/// The disruption controller's bookkeeping: `disruptionsAllowed` of every PDB from the pods
/// it selects (healthy = bound to an existing node). A PDB with neither field allows none.
fn refresh_pdbs(s: &mut Snapshot) {
    let Snapshot { pdbs, pods, nodes, .. } = s;
    for pdb in pdbs.values_mut() {
        let (mut expected, mut healthy) = (0i32, 0i32);
        for p in pods.values() {
            if p.terminal || p.key.namespace != pdb.key.namespace || !pdb.selector.matches(&p.labels) {
                continue;
            }
            expected += 1;
            if p.node_name.as_ref().is_some_and(|n| nodes.contains_key(n)) {
                healthy += 1;
            }
        }
        let allowed = match (pdb.max_unavailable, pdb.min_available) {
            (Some(max), _) => max.of(expected) - (expected - healthy),
            (None, Some(min)) => healthy - min.of(expected),
            (None, None) => 0,
        }
        .max(0);
        if pdb.disruptions_allowed != allowed {
            Arc::make_mut(pdb).disruptions_allowed = allowed;
        }
    }
}

impl ClusterView for SimCluster {
    fn snapshot(&self) -> Arc<Snapshot> {
        let mut state = self.lock();
        if let Some(s) = &state.shared {
            return s.clone();
        }
        let s = Arc::new(state.objects.clone());
        state.shared = Some(s.clone());
        s
    }

    fn synced(&self) -> bool {
        self.synced.load(Ordering::SeqCst)
    }

    fn changes(&self) -> watch::Receiver<u64> {
        self.tx.subscribe()
    }
}

/// Deletes a node at version `v`: gone at once without finalizers, else marked.
fn delete_node_in(s: &mut Snapshot, v: u64, name: &str) -> Result<(), ClusterError> {
    let n = s.nodes.get_mut(name).ok_or_else(|| not_found("node", name.to_string()))?;
    if n.finalizers.is_empty() {
        s.nodes.remove(name);
    } else if !n.deleting {
        let n = Arc::make_mut(n);
        n.deleting = true;
        n.resource_version = v;
    }
    Ok(())
}

/// Deletes a NodeClaim at version `v`: gone at once without finalizers, else marked.
fn delete_nodeclaim_in(s: &mut Snapshot, v: u64, name: &str) -> Result<(), ClusterError> {
    let c = s.nodeclaims.get_mut(name).ok_or_else(|| not_found("nodeclaim", name.to_string()))?;
    if c.finalizers.is_empty() {
        s.nodeclaims.remove(name);
    } else if !c.deleting {
        let c = Arc::make_mut(c);
        c.deleting = true;
        c.resource_version = v;
    }
    Ok(())
}

/// A write made from a read: refused unless the object is still at that version.
fn precondition(kind: &'static str, name: &str, have: u64, want: u64) -> Result<(), ClusterError> {
    if have == want { Ok(()) } else { Err(ClusterError::Conflict { kind, name: name.to_string() }) }
}

impl SimCluster {
    fn create_nodeclaim_now(&self, mut claim: NodeClaim) -> Result<u64, ClusterError> {
        // The server's time, never the caller's.
        claim.created = self.clock.as_ref().map(|c| c.now_millis());
        self.write("create_nodeclaim", None, |s, v| {
            if s.nodeclaims.contains_key(&claim.name) {
                return Err(ClusterError::AlreadyExists { kind: "nodeclaim", name: claim.name.clone() });
            }
            claim.resource_version = v;
            claim.deleting = false;
            s.nodeclaims.insert(claim.name.clone(), Arc::new(claim));
            Ok(())
        })
    }

    fn nodeclaim_now(&self, name: &str) -> Result<Arc<NodeClaim>, ClusterError> {
        self.lock().objects.nodeclaims.get(name).cloned().ok_or_else(|| not_found("nodeclaim", name.to_string()))
    }

    fn update_status_now(&self, name: &str, status: NodeClaimStatus, rv: u64) -> Result<u64, ClusterError> {
        self.write("update_nodeclaim_status", Some(("nodeclaim", name)), |s, v| {
            let c = s.nodeclaims.get_mut(name).ok_or_else(|| not_found("nodeclaim", name.to_string()))?;
            precondition("nodeclaim", name, c.resource_version, rv)?;
            let c = Arc::make_mut(c);
            c.status = status;
            c.resource_version = v;
            Ok(())
        })
    }

    fn update_metadata_now(&self, name: &str, update: NodeClaimUpdate, rv: u64) -> Result<u64, ClusterError> {
        self.write("update_nodeclaim_metadata", Some(("nodeclaim", name)), |s, v| {
            let c = s.nodeclaims.get_mut(name).ok_or_else(|| not_found("nodeclaim", name.to_string()))?;
            precondition("nodeclaim", name, c.resource_version, rv)?;
            let c = Arc::make_mut(c);
            // Labels merge, as a merge patch of `metadata.labels` does.
            c.spec.labels.extend(update.labels);
            c.finalizers = update.finalizers;
            c.resource_version = v;
            if c.deleting && c.finalizers.is_empty() {
                s.nodeclaims.remove(name);
            }
            Ok(())
        })
    }

    fn delete_nodeclaim_now(&self, name: &str) -> Result<u64, ClusterError> {
        self.write("delete_nodeclaim", None, |s, v| delete_nodeclaim_in(s, v, name))
    }

    fn node_now(&self, name: &str) -> Result<Arc<Node>, ClusterError> {
        self.lock().objects.nodes.get(name).cloned().ok_or_else(|| not_found("node", name.to_string()))
    }

    fn update_node_now(&self, name: &str, update: NodeUpdate, rv: u64) -> Result<u64, ClusterError> {
        self.write("update_node", Some(("node", name)), |s, v| {
            let n = s.nodes.get_mut(name).ok_or_else(|| not_found("node", name.to_string()))?;
            precondition("node", name, n.resource_version, rv)?;
            let n = Arc::make_mut(n);
            if *n.labels != update.labels {
                n.labels = update.labels.into();
            }
            n.taints = update.taints;
            n.finalizers = update.finalizers;
            n.owner_claim = update.owner_claim;
            // A NodePool's node (its label, or an owner claim) is initialized once the
            // lifecycle labels it, as the kube adapter reads it; another keeps what it was
            // given.
            if n.labels.contains_key(dovetail_core::labels::NODEPOOL) || n.owner_claim.is_some() {
                n.initialized = Node::initialized_by(&n.labels, n.ready, true);
            }
            n.resource_version = v;
            if n.deleting && n.finalizers.is_empty() {
                s.nodes.remove(name);
            }
            Ok(())
        })
    }

    fn delete_node_now(&self, name: &str) -> Result<u64, ClusterError> {
        self.write("delete_node", None, |s, v| delete_node_in(s, v, name))
    }

    fn evict_now(&self, pod: &PodKey) -> Result<u64, ClusterError> {
        self.write("evict", None, |s, _| {
            let p = s.pods.get(pod).ok_or_else(|| not_found("pod", pod.to_string()))?;
            let counted = p.node_name.as_ref().is_some_and(|n| s.nodes.contains_key(n));
            let covering: Vec<_> =
                s.pdbs.values().filter(|b| b.key.namespace == pod.namespace && b.selector.matches(&p.labels)).collect();
            // As the eviction subresource: a running pod several budgets cover is refused (500).
            if counted && covering.len() > 1 {
                return Err(ClusterError::ManyPdbs { pod: pod.to_string() });
            }
            if counted && let Some(pdb) = covering.iter().find(|b| b.disruptions_allowed <= 0) {
                return Err(ClusterError::DisruptionBudget { pod: pod.to_string(), pdb: pdb.key.to_string() });
            }
            // A mirror pod's kubelet writes it again at once while its node runs.
            if !(counted && p.is_mirror()) {
                s.pods.remove(pod);
            }
            Ok(())
        })
    }

    fn delete_pod_now(&self, key: &PodKey, grace_seconds: Option<i64>) -> Result<u64, ClusterError> {
        let v = self.write("delete_pod", None, |s, _| {
            let p = s.pods.get(key).ok_or_else(|| not_found("pod", key.to_string()))?;
            // A mirror pod's kubelet writes it again at once while its node runs.
            if !(p.is_mirror() && p.node_name.as_ref().is_some_and(|n| s.nodes.contains_key(n))) {
                s.pods.remove(key);
            }
            Ok(())
        })?;
        let mut state = self.lock();
        if state.deleted.len() >= EVENTS_KEPT {
            state.deleted.pop_front();
        }
        state.deleted.push_back((key.clone(), grace_seconds));
        Ok(v)
    }

    /// Deletes a node as a user or the cloud node lifecycle controller does (held by its
    /// finalizers, if any); not counted as the plane's write.
    pub fn remove_node(&self, name: &str) -> Result<u64, ClusterError> {
        self.change(|s, v| delete_node_in(s, v, name))
    }

    /// Deletes a NodeClaim as `kubectl delete nodeclaim` does (held by its finalizers).
    pub fn remove_nodeclaim(&self, name: &str) -> Result<u64, ClusterError> {
        self.change(|s, v| delete_nodeclaim_in(s, v, name))
    }
}

impl ClusterWriter for SimCluster {
    fn create_nodeclaim(&self, claim: NodeClaim) -> BoxFuture<'_, Result<u64, ClusterError>> {
        let r = self.create_nodeclaim_now(claim);
        Box::pin(async move { r })
    }

    fn get_nodeclaim<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<Arc<NodeClaim>, ClusterError>> {
        let r = self.nodeclaim_now(name);
        Box::pin(async move { r })
    }

    fn update_nodeclaim_status<'a>(
        &'a self,
        name: &'a str,
        status: NodeClaimStatus,
        resource_version: u64,
    ) -> BoxFuture<'a, Result<u64, ClusterError>> {
        let r = self.update_status_now(name, status, resource_version);
        Box::pin(async move { r })
    }

    fn update_nodeclaim_metadata<'a>(
        &'a self,
        name: &'a str,
        update: NodeClaimUpdate,
        resource_version: u64,
    ) -> BoxFuture<'a, Result<u64, ClusterError>> {
        let r = self.update_metadata_now(name, update, resource_version);
        Box::pin(async move { r })
    }

    fn delete_nodeclaim<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<u64, ClusterError>> {
        let r = self.delete_nodeclaim_now(name);
        Box::pin(async move { r })
    }

    fn get_node<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<Arc<Node>, ClusterError>> {
        let r = self.node_now(name);
        Box::pin(async move { r })
    }

    fn update_node<'a>(
        &'a self,
        name: &'a str,
        update: NodeUpdate,
        resource_version: u64,
    ) -> BoxFuture<'a, Result<u64, ClusterError>> {
        let r = self.update_node_now(name, update, resource_version);
        Box::pin(async move { r })
    }

    fn delete_node<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<u64, ClusterError>> {
        let r = self.delete_node_now(name);
        Box::pin(async move { r })
    }

    fn evict<'a>(&'a self, pod: &'a PodKey) -> BoxFuture<'a, Result<u64, ClusterError>> {
        let r = self.evict_now(pod);
        Box::pin(async move { r })
    }

    /// The sim's pods stop at once, whatever their grace period: the grace asked for is
    /// recorded ([`SimCluster::deleted_with_grace`]).
    fn delete_pod<'a>(
        &'a self,
        pod: &'a PodKey,
        grace_seconds: Option<i64>,
    ) -> BoxFuture<'a, Result<u64, ClusterError>> {
        let r = self.delete_pod_now(pod, grace_seconds);
        Box::pin(async move { r })
    }

    fn record_event(&self, event: Event) -> BoxFuture<'_, Result<(), ClusterError>> {
        let mut state = self.lock();
        *state.writes.entry("record_event").or_default() += 1;
        if state.events.len() >= EVENTS_KEPT {
            state.events.pop_front();
        }
        state.events.push_back(event);
        Box::pin(async { Ok(()) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dovetail_core::labels::LabelSelector;
    use dovetail_core::nodepool::NodeClaimSpec;
    use dovetail_core::resources::{ResourceList, ResourceName};
    use std::collections::BTreeMap;

    fn pod(name: &str, app: &str) -> Pod {
        Pod {
            key: PodKey::new("default", name),
            labels: BTreeMap::from([("app".to_string(), app.to_string())]).into(),
            requests: ResourceList::cpu_mem(100, 1 << 20),
            ..Pod::default()
        }
    }

    fn claim(name: &str) -> NodeClaim {
        NodeClaim {
            name: name.into(),
            spec: NodeClaimSpec { nodepool: "default".into(), ..NodeClaimSpec::default() },
            finalizers: vec!["karpenter.sh/termination".into()],
            deleting: false,
            status: NodeClaimStatus::default(),
            resource_version: 0,
            created: None,
        }
    }

    #[tokio::test]
    async fn a_nodeclaim_is_created_once_and_goes_when_its_finalizer_does() {
        let c = SimCluster::new();
        let mut changes = c.changes();
        let v = c.create_nodeclaim(claim("default-abc")).await.expect("created");
        assert_eq!(*changes.borrow_and_update(), v);
        assert_eq!(
            c.create_nodeclaim(claim("default-abc")).await,
            Err(ClusterError::AlreadyExists { kind: "nodeclaim", name: "default-abc".into() })
        );
        c.delete_nodeclaim("default-abc").await.expect("marked");
        let read = c.get_nodeclaim("default-abc").await.expect("read");
        assert!(read.deleting, "kept while finalized");
        let update = NodeClaimUpdate { finalizers: Vec::new(), ..NodeClaimUpdate::of(&read) };
        c.update_nodeclaim_metadata("default-abc", update, read.resource_version).await.expect("finalizer");
        assert!(c.snapshot().nodeclaims.is_empty());
        assert!(changes.has_changed().unwrap_or(false));
    }

    #[tokio::test]
    async fn a_write_from_a_stale_read_is_a_conflict() {
        let c = SimCluster::new();
        c.create_nodeclaim(claim("default-abc")).await.expect("created");
        let read = c.get_nodeclaim("default-abc").await.expect("read");
        // Someone else writes in between.
        let update = NodeClaimUpdate { finalizers: Vec::new(), ..NodeClaimUpdate::of(&read) };
        c.update_nodeclaim_metadata("default-abc", update, read.resource_version).await.expect("first");
        let mut status = read.status.clone();
        status.node_name = Some("n".into());
        assert_eq!(
            c.update_nodeclaim_status("default-abc", status.clone(), read.resource_version).await,
            Err(ClusterError::Conflict { kind: "nodeclaim", name: "default-abc".into() })
        );
        let fresh = c.get_nodeclaim("default-abc").await.expect("read");
        c.update_nodeclaim_status("default-abc", status, fresh.resource_version).await.expect("from a fresh read");
        let after = c.get_nodeclaim("default-abc").await.expect("read");
        assert_eq!(after.status.node_name.as_deref(), Some("n"));
        assert!(after.finalizers.is_empty(), "the status subresource leaves the rest as it was");
        // An injected conflict, as a busy API server gives them.
        c.inject_conflicts(1);
        let status = after.status.clone();
        assert!(matches!(
            c.update_nodeclaim_status("default-abc", status.clone(), after.resource_version).await,
            Err(ClusterError::Conflict { .. })
        ));
        c.update_nodeclaim_status("default-abc", status, after.resource_version).await.expect("the next one goes");
    }

    #[tokio::test]
    async fn a_node_with_a_finalizer_stays_while_deleted_until_it_is_removed() {
        let c = SimCluster::new();
        c.apply_node(Node {
            name: "n1".into(),
            finalizers: vec!["karpenter.sh/termination".into()],
            ..Node::default()
        });
        c.remove_node("n1").expect("deleted by hand");
        let n = c.get_node("n1").await.expect("still there");
        assert!(n.deleting);
        let mut update = NodeUpdate::of(&n);
        update.finalizers.clear();
        c.update_node("n1", update, n.resource_version).await.expect("finalizer removed");
        assert!(c.snapshot().nodes.is_empty(), "gone with its last finalizer");
        assert!(c.writes().get("update_node").is_some_and(|n| *n == 1), "{:?}", c.writes());
    }

    #[tokio::test]
    async fn evictions_respect_the_pdb_and_its_status_follows_the_pods() {
        let c = SimCluster::new();
        c.apply_node(Node { name: "n1".into(), ..Node::default() });
        for i in 0..3 {
            c.apply_pod(pod(&format!("web-{i}"), "web"));
            c.bind(&PodKey::new("default", &format!("web-{i}")), "n1").expect("bind");
        }
        c.apply_pdb(Pdb {
            key: PodKey::new("default", "web"),
            selector: LabelSelector::new(BTreeMap::from([("app".to_string(), "web".to_string())]), Vec::new()),
            min_available: Some(IntOrPercent::Int(2)),
            max_unavailable: None,
            disruptions_allowed: 0,
        });
        assert_eq!(c.snapshot().pdbs[&PodKey::new("default", "web")].disruptions_allowed, 1);
        c.evict(&PodKey::new("default", "web-0")).await.expect("one may go");
        assert_eq!(
            c.evict(&PodKey::new("default", "web-1")).await,
            Err(ClusterError::DisruptionBudget { pod: "default/web-1".into(), pdb: "default/web".into() })
        );
        // A replacement lands: one may go again.
        c.apply_pod(pod("web-3", "web"));
        c.bind(&PodKey::new("default", "web-3"), "n1").expect("bind");
        c.evict(&PodKey::new("default", "web-1")).await.expect("allowed again");
        // Pods no PDB selects are always evictable.
        c.apply_pod(pod("batch-0", "batch"));
        c.bind(&PodKey::new("default", "batch-0"), "n1").expect("bind");
        c.evict(&PodKey::new("default", "batch-0")).await.expect("no budget");
    }

    #[tokio::test]
    async fn the_registrar_makes_an_unregistered_node_and_the_scheduler_binds_to_ready_ones() {
        let c = SimCluster::new();
        let mut nc = claim("default-x");
        nc.spec.labels.insert("team".into(), "web".into());
        c.create_nodeclaim(nc).await.expect("claim");
        let reg = Registration {
            claim: "default-x".into(),
            node_name: "ip-10-0-0-1".into(),
            provider_id: "aws:///us-east-1a/i-1".into(),
            labels: BTreeMap::from([("topology.kubernetes.io/zone".to_string(), "us-east-1a".to_string())]),
            capacity: ResourceList::from_pairs([
                (ResourceName::Cpu, 2000),
                (ResourceName::Memory, 8 << 30),
                (ResourceName::Pods, 29),
            ]),
            allocatable: ResourceList::from_pairs([
                (ResourceName::Cpu, 1900),
                (ResourceName::Memory, 7 << 30),
                (ResourceName::Pods, 29),
            ]),
        };
        c.register(&reg).expect("registered");
        assert!(matches!(c.register(&reg), Err(ClusterError::AlreadyExists { .. })));
        let n = c.snapshot().nodes["ip-10-0-0-1"].clone();
        assert_eq!(n.labels.get("team").map(String::as_str), Some("web"));
        assert_eq!(n.labels.get("karpenter.sh/nodepool").map(String::as_str), Some("default"));
        assert!(n.taints.iter().any(|t| t.key == UNREGISTERED_TAINT));
        assert!(n.ready);
        // Leaked: no claim.
        let leaked = Registration { claim: "gone".into(), node_name: "ip-2".into(), ..reg.clone() };
        assert!(matches!(c.register(&leaked), Err(ClusterError::NotFound { .. })));

        c.apply_pod(pod("a", "web"));
        assert_eq!(c.schedule(), 0, "the unregistered taint keeps pods off");
        assert!(
            c.snapshot().pods.get(&PodKey::new("default", "a")).expect("the pod").unschedulable,
            "marked as kube-scheduler marks it"
        );
        let mut update = NodeUpdate::of(&n);
        update.taints.clear();
        c.update_node("ip-10-0-0-1", update, n.resource_version).await.expect("registered by the lifecycle");
        assert_eq!(c.schedule(), 1);
        assert_eq!(c.snapshot().pods_on("ip-10-0-0-1").count(), 1);
        assert!(
            !c.snapshot().pods.get(&PodKey::new("default", "a")).expect("the pod").unschedulable,
            "bound pods lose the mark"
        );
        // A pod too big for any node stays pending, marked; a gated one is not looked at.
        let mut big = pod("big", "web");
        big.requests = ResourceList::cpu_mem(64_000, 1 << 30);
        c.apply_pod(big);
        let mut gated = pod("gated", "web");
        gated.scheduling_gated = true;
        c.apply_pod(gated);
        let mut other = pod("other", "web");
        other.scheduler_name = Some("my-scheduler".into());
        c.apply_pod(other);
        assert_eq!(c.schedule(), 0);
        let provisionable: Vec<String> = c.snapshot().provisionable().map(|p| p.key.name.clone()).collect();
        assert_eq!(provisionable, vec!["big".to_string()]);
        assert_eq!(c.snapshot().pending().count(), 3);
    }

    /// kube-scheduler's queue order: a pod that waited through a pass is placed before a
    /// larger one that arrived since. One solve of both gave the larger the room, largest
    /// first, and a small pod could wait behind every larger newcomer.
    #[test]
    fn a_pod_that_waited_through_a_pass_is_placed_before_a_larger_one_that_came_since() {
        let c = SimCluster::new();
        let mut small = pod("small", "web");
        small.requests = ResourceList::cpu_mem(250, 1 << 20);
        c.apply_pod(small);
        assert_eq!(c.schedule(), 0, "no node yet");
        assert!(c.snapshot().pods.get(&PodKey::new("default", "small")).is_some_and(|p| p.unschedulable));
        c.apply_node(Node {
            name: "n1".into(),
            allocatable: ResourceList::from_pairs([
                (ResourceName::Cpu, 1000),
                (ResourceName::Memory, 8 << 30),
                (ResourceName::Pods, 29),
            ]),
            ready: true,
            initialized: true,
            ..Node::default()
        });
        let mut large = pod("large", "web");
        large.requests = ResourceList::cpu_mem(900, 1 << 20);
        c.apply_pod(large);
        assert_eq!(c.schedule(), 1, "room for one of the two");
        let snap = c.snapshot();
        let on_n1: Vec<&str> = snap.pods_on("n1").map(|p| p.key.name.as_str()).collect();
        assert_eq!(on_n1, ["small"], "the pod that waited goes first");
        assert!(snap.pods.get(&PodKey::new("default", "large")).is_some_and(|p| p.unschedulable), "marked");
    }

    #[tokio::test]
    async fn node_writes_and_binding() {
        let c = SimCluster::new();
        assert!(matches!(c.get_node("nope").await, Err(ClusterError::NotFound { .. })));
        c.apply_node(Node { name: "n1".into(), ..Node::default() });
        let n = c.get_node("n1").await.expect("read");
        let mut update = NodeUpdate::of(&n);
        update.labels.insert("karpenter.sh/initialized".into(), "true".into());
        c.update_node("n1", update, n.resource_version).await.expect("label");
        let s = c.snapshot();
        assert_eq!(s.nodes["n1"].labels.get("karpenter.sh/initialized").map(String::as_str), Some("true"));
        assert!(s.nodes["n1"].resource_version > n.resource_version, "each write stamps the object");
        // A NodePool's node is in flight until labelled initialized, as the kube adapter reads it.
        let labels = [("karpenter.sh/nodepool".to_string(), "default".to_string())].into_iter().collect();
        c.apply_node(Node { name: "n2".into(), labels, ready: true, ..Node::default() });
        let n2 = c.get_node("n2").await.expect("read");
        let mut update = NodeUpdate::of(&n2);
        update.labels.insert("karpenter.sh/registered".into(), "true".into());
        let rv = c.update_node("n2", update, n2.resource_version).await.expect("registered");
        assert!(!c.snapshot().nodes["n2"].initialized, "registered, not initialized");
        let n2 = c.get_node("n2").await.expect("read");
        let mut update = NodeUpdate::of(&n2);
        update.labels.insert("karpenter.sh/initialized".into(), "true".into());
        c.update_node("n2", update, rv).await.expect("initialized");
        assert!(c.snapshot().nodes["n2"].initialized);
        c.apply_pod(pod("a", "x"));
        assert_eq!(c.snapshot().pending().count(), 1);
        c.bind(&PodKey::new("default", "a"), "n1").expect("bind");
        assert!(matches!(c.bind(&PodKey::new("default", "a"), "n1"), Err(ClusterError::Conflict { .. })));
        assert_eq!(c.snapshot().pods_on("n1").count(), 1);
        c.delete_node("n1").await.expect("delete");
        assert!(!c.snapshot().nodes.contains_key("n1"));
    }

    #[tokio::test]
    async fn events_are_kept_and_synced_can_be_withheld() {
        let c = SimCluster::new();
        assert!(c.synced());
        c.set_synced(false);
        assert!(!c.synced());
        let e = Event {
            kind: crate::ObjectKind::NodeClaim,
            name: "default-abc".into(),
            warning: true,
            reason: "LivenessTimeout".into(),
            message: "m".into(),
        };
        c.record_event(e.clone()).await.expect("recorded");
        assert_eq!(c.events(), vec![e]);
    }
}
