//! The in-memory cluster: the API server's objects with resource versions, change
//! notifications, the eviction API with PodDisruptionBudgets and their status bookkeeping.
//! The scheduler, registrar and workload controllers that play Kubernetes around it build on
//! its inputs (`apply_*`, `bind`).

mod workloads;

use std::sync::{Arc, Mutex, MutexGuard};

use dovetail_core::node::Node;
use dovetail_core::nodepool::NodePool;
use dovetail_core::pod::{Pod, PodKey};
use dovetail_core::taints::Taint;
use tokio::sync::watch;

#[cfg(test)]
use crate::IntOrPercent;
use crate::Pdb;
use crate::{ClusterError, ClusterView, ClusterWriter, NodeClaim, NodeClaimStatus, Snapshot};

pub use workloads::{Deployment, Job, JobStatus, Registrar, WorkloadStep, Workloads};

/// The sim cluster.
pub struct SimCluster {
    state: Mutex<State>,
    tx: watch::Sender<u64>,
}

struct State {
    objects: Snapshot,
    /// The last snapshot handed out, until the next change.
    shared: Option<Arc<Snapshot>>,
}

impl Default for SimCluster {
    fn default() -> Self {
        SimCluster::new()
    }
}

impl SimCluster {
    pub fn new() -> Self {
        SimCluster { state: Mutex::new(State { objects: Snapshot::default(), shared: None }), tx: watch::channel(0).0 }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Runs one change: bumps the resource version, keeps PDB status, notifies watchers.
    fn change<T>(&self, f: impl FnOnce(&mut Snapshot) -> Result<T, ClusterError>) -> Result<u64, ClusterError> {
        let version = {
            let mut state = self.lock();
            let s = &mut state.objects;
            f(s)?;
            s.resource_version += 1;
            refresh_pdbs(s);
            let version = s.resource_version;
            state.shared = None;
            version
        };
        self.tx.send_replace(version);
        Ok(version)
    }

    /// Creates or replaces a pod (a user, or a workload controller).
    pub fn apply_pod(&self, pod: Pod) -> u64 {
        self.change(|s| {
            s.pods.insert(pod.key.clone(), Arc::new(pod));
            Ok(())
        })
        .unwrap_or_default()
    }

    /// Creates or replaces pods in one change (a controller's round).
    pub fn apply_pods(&self, pods: Vec<Pod>) -> u64 {
        if pods.is_empty() {
            return self.lock().objects.resource_version;
        }
        self.change(|s| {
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
        let _ = self.change(|s| {
            gone = keys.iter().filter(|k| s.pods.remove(k).is_some()).count();
            Ok(())
        });
        gone
    }

    /// Binds a pending pod to a node (what kube-scheduler does).
    pub fn bind(&self, key: &PodKey, node: &str) -> Result<u64, ClusterError> {
        self.change(|s| {
            if !s.nodes.contains_key(node) {
                return Err(not_found("node", node.to_string()));
            }
            let pod = s.pods.get_mut(key).ok_or_else(|| not_found("pod", key.to_string()))?;
            if pod.node_name.is_some() {
                return Err(ClusterError::Conflict { kind: "pod", name: key.to_string() });
            }
            Arc::make_mut(pod).node_name = Some(node.to_string());
            Ok(())
        })
    }

    /// Creates or replaces a node (the registrar, or a user's existing nodes).
    pub fn apply_node(&self, node: Node) -> u64 {
        self.change(|s| {
            s.nodes.insert(node.name.clone(), Arc::new(node));
            Ok(())
        })
        .unwrap_or_default()
    }

    pub fn apply_nodepool(&self, pool: NodePool) -> u64 {
        self.change(|s| {
            s.nodepools.insert(pool.name.clone(), Arc::new(pool));
            Ok(())
        })
        .unwrap_or_default()
    }

    /// Creates or replaces a DaemonSet (its pod template).
    pub fn apply_daemonset(&self, template: Pod) -> u64 {
        self.change(|s| {
            s.daemonsets.insert(template.key.clone(), Arc::new(template));
            Ok(())
        })
        .unwrap_or_default()
    }

    /// Creates or replaces a PDB; its status is computed here.
    pub fn apply_pdb(&self, pdb: Pdb) -> u64 {
        self.change(|s| {
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

/// The taint every node registers with until Karpenter (here: the NodeClaim lifecycle) has
/// applied its NodeClaim's labels and taints.
pub const UNREGISTERED_TAINT: &str = "karpenter.sh/unregistered";

impl SimCluster {
    /// What a kubelet does when the instance boots (kwok-like): a Ready Node with the
    /// NodeClaim's labels, taints and startup taints, plus `karpenter.sh/unregistered:NoExecute`.
    /// `NotFound` when the NodeClaim is gone (the instance leaked); `AlreadyExists` when the
    /// node is there.
    pub fn register(&self, r: &Registration) -> Result<u64, ClusterError> {
        self.change(|s| {
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
                labels,
                taints,
                capacity: r.capacity.clone(),
                allocatable: r.allocatable.clone(),
                initialized: false,
                requirements: None,
                unschedulable: false,
                provider_id: Some(r.provider_id.clone()),
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
        if nodes.is_empty() {
            return 0;
        }
        let pending: Vec<Pod> = snap.pending().map(|p| p.as_ref().clone()).collect();
        if pending.is_empty() {
            return 0;
        }
        let input = snap.scheduling_input(nodes, Vec::new());
        // The dovetail packer: pods of a class skip the nodes an earlier twin could not use,
        // so a pass over 100,000 pods and 10,000 nodes is linear, not quadratic.
        let results = dovetail_core::scheduling::solve(&input, &pending, &Default::default());
        let mut bound = 0;
        for placement in &results.existing {
            let node = &input.nodes[placement.node].name;
            for &i in &placement.pods {
                if self.bind(&pending[i].key, node).is_ok() {
                    bound += 1;
                }
            }
        }
        bound
    }
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
        true
    }

    fn changes(&self) -> watch::Receiver<u64> {
        self.tx.subscribe()
    }
}

impl ClusterWriter for SimCluster {
    fn create_nodeclaim(&self, claim: NodeClaim) -> Result<u64, ClusterError> {
        self.change(|s| {
            if s.nodeclaims.contains_key(&claim.name) {
                return Err(ClusterError::AlreadyExists { kind: "nodeclaim", name: claim.name.clone() });
            }
            s.nodeclaims.insert(claim.name.clone(), Arc::new(claim));
            Ok(())
        })
    }

    fn update_nodeclaim_status(&self, name: &str, status: NodeClaimStatus) -> Result<u64, ClusterError> {
        self.change(|s| {
            let c = s.nodeclaims.get_mut(name).ok_or_else(|| not_found("nodeclaim", name.to_string()))?;
            Arc::make_mut(c).status = status;
            Ok(())
        })
    }

    fn delete_nodeclaim(&self, name: &str) -> Result<u64, ClusterError> {
        self.change(|s| {
            let c = s.nodeclaims.get_mut(name).ok_or_else(|| not_found("nodeclaim", name.to_string()))?;
            if c.finalizers.is_empty() {
                s.nodeclaims.remove(name);
            } else {
                Arc::make_mut(c).deleting = true;
            }
            Ok(())
        })
    }

    fn remove_nodeclaim_finalizer(&self, name: &str, finalizer: &str) -> Result<u64, ClusterError> {
        self.change(|s| {
            let c = s.nodeclaims.get_mut(name).ok_or_else(|| not_found("nodeclaim", name.to_string()))?;
            let c = Arc::make_mut(c);
            c.finalizers.retain(|f| f != finalizer);
            if c.deleting && c.finalizers.is_empty() {
                s.nodeclaims.remove(name);
            }
            Ok(())
        })
    }

    fn set_node_taints(&self, node: &str, taints: Vec<Taint>) -> Result<u64, ClusterError> {
        self.change(|s| {
            let n = s.nodes.get_mut(node).ok_or_else(|| not_found("node", node.to_string()))?;
            Arc::make_mut(n).taints = taints;
            Ok(())
        })
    }

    fn label_node(&self, node: &str, labels: &[(String, String)]) -> Result<u64, ClusterError> {
        self.change(|s| {
            let n = Arc::make_mut(s.nodes.get_mut(node).ok_or_else(|| not_found("node", node.to_string()))?);
            for (k, v) in labels {
                n.labels.insert(k.clone(), v.clone());
            }
            Ok(())
        })
    }

    fn cordon(&self, node: &str, unschedulable: bool) -> Result<u64, ClusterError> {
        self.change(|s| {
            let n = s.nodes.get_mut(node).ok_or_else(|| not_found("node", node.to_string()))?;
            Arc::make_mut(n).unschedulable = unschedulable;
            Ok(())
        })
    }

    fn evict(&self, pod: &PodKey) -> Result<u64, ClusterError> {
        self.change(|s| {
            let p = s.pods.get(pod).ok_or_else(|| not_found("pod", pod.to_string()))?;
            let counted = p.node_name.as_ref().is_some_and(|n| s.nodes.contains_key(n));
            if counted
                && let Some(pdb) = s.pdbs.values().find(|b| {
                    b.key.namespace == pod.namespace && b.selector.matches(&p.labels) && b.disruptions_allowed <= 0
                })
            {
                return Err(ClusterError::DisruptionBudget { pod: pod.to_string(), pdb: pdb.key.to_string() });
            }
            s.pods.remove(pod);
            Ok(())
        })
    }

    fn delete_pod(&self, key: &PodKey) -> Result<u64, ClusterError> {
        self.change(|s| s.pods.remove(key).map(|_| ()).ok_or_else(|| not_found("pod", key.to_string())))
    }

    fn delete_node(&self, node: &str) -> Result<u64, ClusterError> {
        self.change(|s| s.nodes.remove(node).map(|_| ()).ok_or_else(|| not_found("node", node.to_string())))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dovetail_core::labels::LabelSelector;
    use dovetail_core::nodepool::{NodeClaimSpec, NodeClassRef};
    use dovetail_core::requirements::Requirements;
    use dovetail_core::resources::{ResourceList, ResourceName};
    use std::collections::BTreeMap;

    fn pod(name: &str, app: &str) -> Pod {
        Pod {
            key: PodKey::new("default", name),
            labels: BTreeMap::from([("app".to_string(), app.to_string())]),
            requests: ResourceList::cpu_mem(100, 1 << 20),
            ..Pod::default()
        }
    }

    fn claim(name: &str) -> NodeClaim {
        NodeClaim {
            name: name.into(),
            spec: NodeClaimSpec {
                nodepool: "default".into(),
                labels: BTreeMap::new(),
                annotations: BTreeMap::new(),
                taints: Vec::new(),
                startup_taints: Vec::new(),
                requirements: Requirements::new(),
                requests: ResourceList::new(),
                node_class: NodeClassRef::default(),
                expire_after: None,
                termination_grace_period: None,
            },
            finalizers: vec!["karpenter.sh/termination".into()],
            deleting: false,
            status: NodeClaimStatus::default(),
        }
    }

    #[test]
    fn a_nodeclaim_is_created_once_and_goes_when_its_finalizer_does() {
        let c = SimCluster::new();
        let mut changes = c.changes();
        let v = c.create_nodeclaim(claim("default-abc")).expect("created");
        assert_eq!(*changes.borrow_and_update(), v);
        assert_eq!(
            c.create_nodeclaim(claim("default-abc")),
            Err(ClusterError::AlreadyExists { kind: "nodeclaim", name: "default-abc".into() })
        );
        c.delete_nodeclaim("default-abc").expect("marked");
        assert!(c.snapshot().nodeclaims["default-abc"].deleting, "kept while finalized");
        c.remove_nodeclaim_finalizer("default-abc", "karpenter.sh/termination").expect("finalizer");
        assert!(c.snapshot().nodeclaims.is_empty());
        assert!(changes.has_changed().unwrap_or(false));
    }

    #[test]
    fn evictions_respect_the_pdb_and_its_status_follows_the_pods() {
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
        c.evict(&PodKey::new("default", "web-0")).expect("one may go");
        assert_eq!(
            c.evict(&PodKey::new("default", "web-1")),
            Err(ClusterError::DisruptionBudget { pod: "default/web-1".into(), pdb: "default/web".into() })
        );
        // A replacement lands: one may go again.
        c.apply_pod(pod("web-3", "web"));
        c.bind(&PodKey::new("default", "web-3"), "n1").expect("bind");
        c.evict(&PodKey::new("default", "web-1")).expect("allowed again");
        // Pods no PDB selects are always evictable.
        c.apply_pod(pod("batch-0", "batch"));
        c.bind(&PodKey::new("default", "batch-0"), "n1").expect("bind");
        c.evict(&PodKey::new("default", "batch-0")).expect("no budget");
    }

    #[test]
    fn the_registrar_makes_an_unregistered_node_and_the_scheduler_binds_to_ready_ones() {
        let c = SimCluster::new();
        let mut nc = claim("default-x");
        nc.spec.labels.insert("team".into(), "web".into());
        c.create_nodeclaim(nc).expect("claim");
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
        // Leaked: no claim.
        let leaked = Registration { claim: "gone".into(), node_name: "ip-2".into(), ..reg.clone() };
        assert!(matches!(c.register(&leaked), Err(ClusterError::NotFound { .. })));

        c.apply_pod(pod("a", "web"));
        assert_eq!(c.schedule(), 0, "the unregistered taint keeps pods off");
        c.set_node_taints("ip-10-0-0-1", Vec::new()).expect("registered by the lifecycle");
        assert_eq!(c.schedule(), 1);
        assert_eq!(c.snapshot().pods_on("ip-10-0-0-1").count(), 1);
        // A pod too big for any node stays pending.
        let mut big = pod("big", "web");
        big.requests = ResourceList::cpu_mem(64_000, 1 << 30);
        c.apply_pod(big);
        assert_eq!(c.schedule(), 0);
        assert_eq!(c.snapshot().pending().count(), 1);
    }

    #[test]
    fn node_writes_and_binding() {
        let c = SimCluster::new();
        assert!(matches!(c.cordon("nope", true), Err(ClusterError::NotFound { .. })));
        c.apply_node(Node { name: "n1".into(), ..Node::default() });
        c.cordon("n1", true).expect("cordon");
        c.label_node("n1", &[("karpenter.sh/initialized".into(), "true".into())]).expect("label");
        c.set_node_taints("n1", Vec::new()).expect("taints");
        let s = c.snapshot();
        assert!(s.nodes["n1"].unschedulable);
        assert_eq!(s.nodes["n1"].labels.get("karpenter.sh/initialized").map(String::as_str), Some("true"));
        c.apply_pod(pod("a", "x"));
        assert_eq!(c.snapshot().pending().count(), 1);
        c.bind(&PodKey::new("default", "a"), "n1").expect("bind");
        assert!(matches!(c.bind(&PodKey::new("default", "a"), "n1"), Err(ClusterError::Conflict { .. })));
        assert_eq!(c.snapshot().pods_on("n1").count(), 1);
        c.delete_node("n1").expect("delete");
        assert!(c.snapshot().nodes.is_empty());
    }
}
