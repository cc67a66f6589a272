//! Pods as the scheduler sees them: identity, requests, and every scheduling constraint.

use std::fmt;

use crate::labels::{LabelSelector, Labels};
use crate::requirements::{Requirement, Requirements};
use crate::resources::{ResourceList, ResourceName};
use crate::shared::{Interner, Shared};
use crate::taints::Toleration;

/// `namespace/name`, the identity users see.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PodKey {
    pub namespace: String,
    pub name: String,
}

impl PodKey {
    /// A key from its parts.
    pub fn new(namespace: &str, name: &str) -> Self {
        PodKey { namespace: namespace.to_string(), name: name.to_string() }
    }
}

impl fmt::Display for PodKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// Required and preferred node affinity. Each term is the intersection of its
/// `matchExpressions`; required terms are ORed.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct NodeAffinity {
    pub required: Vec<Requirements>,
    pub preferred: Vec<(i32, Requirements)>,
}

/// One pod (anti-)affinity term.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct PodAffinityTerm {
    /// `None` selects no pod (a term without a selector is a no-op, as in Kubernetes).
    pub selector: Option<LabelSelector>,
    /// Explicit namespaces; with neither these nor a selector, the pod's own namespace.
    pub namespaces: Vec<String>,
    pub namespace_selector: Option<LabelSelector>,
    pub topology_key: String,
}

/// Required and preferred terms of pod affinity or of pod anti-affinity.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct PodAffinity {
    pub required: Vec<PodAffinityTerm>,
    pub preferred: Vec<(i32, PodAffinityTerm)>,
}

impl PodAffinity {
    /// Whether there is any term.
    pub fn is_empty(&self) -> bool {
        self.required.is_empty() && self.preferred.is_empty()
    }
}

/// `whenUnsatisfiable` of a topology spread constraint.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WhenUnsatisfiable {
    DoNotSchedule,
    ScheduleAnyway,
}

/// `nodeAffinityPolicy` / `nodeTaintsPolicy`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum InclusionPolicy {
    Honor,
    Ignore,
}

/// A topology spread constraint.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct TopologySpreadConstraint {
    pub max_skew: i32,
    pub topology_key: String,
    pub when_unsatisfiable: WhenUnsatisfiable,
    pub selector: Option<LabelSelector>,
    pub min_domains: Option<i32>,
    /// Default `Honor`.
    pub node_affinity_policy: Option<InclusionPolicy>,
    /// Default `Ignore`.
    pub node_taints_policy: Option<InclusionPolicy>,
    pub match_label_keys: Vec<String>,
}

/// A host port a container binds.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct HostPort {
    /// Empty means every address (`0.0.0.0`).
    pub ip: String,
    pub port: u16,
    pub protocol: String,
}

impl HostPort {
    /// Whether two host ports collide (same port and protocol, overlapping address).
    pub fn conflicts(&self, other: &HostPort) -> bool {
        let any = |ip: &str| ip.is_empty() || ip == "0.0.0.0";
        self.port == other.port
            && self.protocol == other.protocol
            && (any(&self.ip) || any(&other.ip) || self.ip == other.ip)
    }
}

/// A pod.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Pod {
    pub key: PodKey,
    /// Shared with the pods of the same workload (see [`crate::shared`]), as are the node
    /// selector, affinity, tolerations and spread constraints.
    pub labels: Shared<Labels>,
    /// Effective requests (containers, init containers, overhead; limits where requests
    /// are unset), without the implicit `pods: 1`.
    pub requests: ResourceList,
    pub node_selector: Shared<Labels>,
    pub node_affinity: Shared<NodeAffinity>,
    pub pod_affinity: Shared<PodAffinity>,
    pub pod_anti_affinity: Shared<PodAffinity>,
    pub tolerations: Shared<Vec<Toleration>>,
    pub topology_spread: Shared<Vec<TopologySpreadConstraint>>,
    pub host_ports: Vec<HostPort>,
    /// Set when the pod is bound to a node.
    pub node_name: Option<String>,
    pub priority: i32,
    /// Orders pods of equal size (creation time, or input order).
    pub creation: i64,
    /// Owned by a DaemonSet: never provisioned for.
    pub daemon: bool,
    /// Owned by its Node (`v1` `Node` owner reference): the API object of a static pod, which
    /// the kubelet runs from a file and recreates whenever it is deleted. Such a mirror pod is
    /// never provisioned for, evicted or moved (see [`Pod::is_mirror`]).
    pub owned_by_node: bool,
    /// A node selector term uses `matchFields`, which Karpenter does not support.
    pub uses_match_fields: bool,
    /// Phase `Succeeded`/`Failed`, or being deleted: ignored for topology.
    pub terminal: bool,
    /// Volume topology alternatives (PV node affinity / StorageClass allowed topologies);
    /// the seam for volume topology, tried in order. Empty means no volume constraint.
    pub volume_requirements: Vec<Requirements>,
    /// The PersistentVolumeClaims the pod mounts, by name in its namespace (a generic
    /// ephemeral volume's claim is `<pod>-<volume>`): the cluster adapter resolves them into
    /// `volume_requirements` through [`crate::cluster::Storage`].
    pub volume_claims: Vec<String>,
    /// Annotations the scheduler reads (`karpenter.sh/do-not-disrupt`, ...).
    pub annotations: Labels,
    /// `spec.terminationGracePeriodSeconds` (Kubernetes' default, 30, when unset).
    pub termination_grace_seconds: Option<i64>,
    /// `metadata.deletionTimestamp` is set: the pod is terminating (never evicted again).
    pub deleting: bool,
    /// `status.startTime`, Unix milliseconds (a do-not-disrupt duration runs from it).
    pub started_at: Option<u64>,
    /// The scheduler marked it `PodScheduled=False, reason=Unschedulable`: only such pods are
    /// provisioned for.
    pub unschedulable: bool,
    /// `spec.schedulingGates` is not empty: no scheduler looks at it yet.
    pub scheduling_gated: bool,
    /// `spec.schedulerName` when it is not `default-scheduler`.
    pub scheduler_name: Option<String>,
    /// `status.nominatedNodeName`: the scheduler is preempting pods for it on that node.
    pub nominated_node: Option<String>,
}

/// One copy of each distinct shared part of the pods a cache holds (see [`crate::shared`]):
/// the pods of one workload then share their labels, selector, affinity, tolerations and
/// spread constraints.
#[derive(Default)]
pub struct PodInterner {
    labels: Interner<Labels>,
    node_affinity: Interner<NodeAffinity>,
    pod_affinity: Interner<PodAffinity>,
    tolerations: Interner<Vec<Toleration>>,
    spread: Interner<Vec<TopologySpreadConstraint>>,
}

impl PodInterner {
    /// Points the pod's shared parts at the one copy of each value.
    pub fn intern(&mut self, pod: &mut Pod) {
        self.labels.intern(&mut pod.labels);
        self.labels.intern(&mut pod.node_selector);
        self.node_affinity.intern(&mut pod.node_affinity);
        self.pod_affinity.intern(&mut pod.pod_affinity);
        self.pod_affinity.intern(&mut pod.pod_anti_affinity);
        self.tolerations.intern(&mut pod.tolerations);
        self.spread.intern(&mut pod.topology_spread);
    }

    /// How many distinct values are kept, over all parts.
    pub fn len(&self) -> usize {
        self.labels.len()
            + self.node_affinity.len()
            + self.pod_affinity.len()
            + self.tolerations.len()
            + self.spread.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The annotation the kubelet writes on a mirror (static) pod.
pub const MIRROR_ANNOTATION: &str = "kubernetes.io/config.mirror";

impl Pod {
    /// A pod with a name, namespace and requests, for tests and generators.
    pub fn new(namespace: &str, name: &str, requests: ResourceList) -> Self {
        Pod { key: PodKey::new(namespace, name), requests, ..Default::default() }
    }

    /// The pod's requests plus the `pods: 1` every pod consumes.
    pub fn requests_with_pod_slot(&self) -> ResourceList {
        let mut r = self.requests.clone();
        r.add_amount(ResourceName::Pods, 1);
        r
    }

    /// Whether it is a mirror pod: the API object of a static pod that the kubelet runs from
    /// its own manifest (owned by its Node, or carrying `kubernetes.io/config.mirror`).
    /// Evicting or deleting one achieves nothing (the kubelet writes it again), so a drain
    /// never waits for it and an emptiness check never counts it, as in Karpenter
    /// (`IsOwnedByNode`).
    pub fn is_mirror(&self) -> bool {
        self.owned_by_node || self.annotations.contains_key(MIRROR_ANNOTATION)
    }

    /// Whether a node should be provisioned for it (Karpenter's `IsProvisionable`): unbound,
    /// not finished or terminating, not a DaemonSet's or a mirror pod, not nominated, not
    /// gated, and marked unschedulable by the scheduler.
    pub fn is_provisionable(&self) -> bool {
        self.node_name.is_none()
            && !self.terminal
            && !self.deleting
            && !self.daemon
            && !self.is_mirror()
            && self.nominated_node.is_none()
            && !self.scheduling_gated
            && self.unschedulable
    }

    /// Whether the default scheduler (kube-scheduler) schedules it.
    pub fn uses_default_scheduler(&self) -> bool {
        self.scheduler_name.as_deref().is_none_or(|s| s == "default-scheduler")
    }

    /// Whether the pod has any anti-affinity term.
    pub fn has_pod_anti_affinity(&self) -> bool {
        !self.pod_anti_affinity.is_empty()
    }

    /// Whether the pod has required anti-affinity terms.
    pub fn has_required_pod_anti_affinity(&self) -> bool {
        !self.pod_anti_affinity.required.is_empty()
    }
}

/// The requests of one container.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ContainerResources {
    pub requests: ResourceList,
    pub limits: ResourceList,
}

impl ContainerResources {
    /// Requests, with limits standing in for requests that are not set (API defaulting).
    pub fn effective_requests(&self) -> ResourceList {
        let mut r = self.requests.clone();
        for (n, v) in self.limits.iter() {
            if !r.contains(n) {
                r.set(n.clone(), v);
            }
        }
        r
    }
}

/// Whether a resource may be set at pod level (`spec.resources`, PodLevelResources): cpu,
/// memory and hugepages.
pub fn is_pod_level_resource(name: &ResourceName) -> bool {
    matches!(name, ResourceName::Cpu | ResourceName::Memory) || name.as_str().starts_with("hugepages-")
}

/// Computes a pod's requests as Kubernetes' `PodRequests`: the sum of containers and
/// sidecars (init containers with `restartPolicy: Always`), at least the largest init
/// container step; then, for each resource the pod sets at pod level (`spec.resources`,
/// PodLevelResources: cpu, memory, hugepages), the pod-level request instead (a pod-level
/// limit stands in for a request no container and no pod-level request sets, as API
/// defaulting does); plus pod overhead.
pub fn pod_requests(
    containers: &[ContainerResources],
    init_containers: &[(ContainerResources, bool)],
    pod_level: &ContainerResources,
    overhead: &ResourceList,
) -> ResourceList {
    let mut reqs = ResourceList::new();
    for c in containers {
        reqs.add(&c.effective_requests());
    }
    let mut sidecars = ResourceList::new();
    let mut init_max = ResourceList::new();
    for (c, restart_always) in init_containers {
        let cr = c.effective_requests();
        let step = if *restart_always {
            reqs.add(&cr);
            sidecars.add(&cr);
            sidecars.clone()
        } else {
            cr.merged(&sidecars)
        };
        init_max = init_max.max_with(&step);
    }
    let mut out = reqs.max_with(&init_max);
    for (n, v) in pod_level.requests.iter() {
        if is_pod_level_resource(n) {
            out.set(n.clone(), v);
        }
    }
    for (n, v) in pod_level.limits.iter() {
        if is_pod_level_resource(n) && !pod_level.requests.contains(n) && out.get(n) == 0 {
            out.set(n.clone(), v);
        }
    }
    out.add(overhead);
    out
}

/// The requirements a pod places on a node: `nodeSelector`, the first required node
/// affinity term, and (when `with_preferred`) the heaviest preferred term, as Karpenter's
/// `NewPodRequirements` / `NewStrictPodRequirements`.
pub fn pod_requirements(node_selector: &Labels, affinity: &NodeAffinity, with_preferred: bool) -> Requirements {
    let mut r = Requirements::new();
    for (k, v) in node_selector {
        r.add(k, Requirement::is_in([v.as_str()]));
    }
    if with_preferred && let Some((_, heaviest)) = heaviest(&affinity.preferred) {
        r.add_all(heaviest);
    }
    if let Some(first) = affinity.required.first() {
        r.add_all(first);
    }
    r
}

/// The heaviest weighted term (the first among equals).
pub fn heaviest<T>(terms: &[(i32, T)]) -> Option<&(i32, T)> {
    let mut best: Option<&(i32, T)> = None;
    for t in terms {
        if best.is_none_or(|b| t.0 > b.0) {
            best = Some(t);
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pods_of_one_workload_share_their_parts_once_interned() {
        let replica = |name: &str| {
            let mut p = Pod::new("shop", name, ResourceList::cpu_mem(250, 1 << 28));
            p.labels.insert("app".into(), "web".into());
            p.tolerations.push(Toleration::exists("node.kubernetes.io/not-ready", None));
            p.topology_spread.push(TopologySpreadConstraint {
                max_skew: 1,
                topology_key: crate::labels::ZONE.into(),
                when_unsatisfiable: WhenUnsatisfiable::ScheduleAnyway,
                selector: None,
                min_domains: None,
                node_affinity_policy: None,
                node_taints_policy: None,
                match_label_keys: Vec::new(),
            });
            p
        };
        let mut interner = PodInterner::default();
        let (mut a, mut b) = (replica("web-1"), replica("web-2"));
        let mut other = replica("db-1");
        other.labels.insert("app".into(), "db".into());
        for p in [&mut a, &mut b, &mut other] {
            interner.intern(p);
        }
        assert!(Shared::same(&a.labels, &b.labels));
        assert!(Shared::same(&a.tolerations, &b.tolerations));
        assert!(Shared::same(&a.topology_spread, &b.topology_spread));
        assert!(Shared::same(&a.node_affinity, &b.node_affinity));
        assert!(Shared::same(&a.pod_affinity, &a.pod_anti_affinity), "both empty: one copy");
        assert!(!Shared::same(&a.labels, &other.labels));
        assert!(Shared::same(&a.tolerations, &other.tolerations));

        // A pod changed later copies what it changes; the others keep theirs.
        b.labels.insert("canary".into(), "true".into());
        assert_eq!(a.labels.get("canary"), None);
        assert_eq!(b.labels.get("canary").map(String::as_str), Some("true"));
    }

    #[test]
    fn only_pods_the_scheduler_marked_unschedulable_are_provisioned() {
        let marked = Pod { unschedulable: true, ..Pod::new("default", "p", ResourceList::new()) };
        assert!(marked.is_provisionable());
        assert!(!Pod { unschedulable: false, ..marked.clone() }.is_provisionable(), "not tried by the scheduler yet");
        assert!(!Pod { scheduling_gated: true, ..marked.clone() }.is_provisionable(), "gated");
        assert!(
            !Pod { nominated_node: Some("n".into()), ..marked.clone() }.is_provisionable(),
            "nominated (preempting)"
        );
        assert!(!Pod { daemon: true, ..marked.clone() }.is_provisionable(), "a DaemonSet's");
        assert!(!Pod { deleting: true, ..marked.clone() }.is_provisionable(), "terminating");
        assert!(!Pod { terminal: true, ..marked.clone() }.is_provisionable(), "finished");
        assert!(!Pod { node_name: Some("n".into()), ..marked.clone() }.is_provisionable(), "bound");
        let other = Pod { scheduler_name: Some("my-scheduler".into()), ..marked };
        assert!(!other.uses_default_scheduler(), "kube-scheduler never marks another scheduler's pods");
    }

    fn cpu(m: i64) -> ResourceList {
        ResourceList::from_pairs([(ResourceName::Cpu, m)])
    }

    #[test]
    fn limits_default_requests() {
        let c = ContainerResources { requests: ResourceList::new(), limits: cpu(500) };
        assert_eq!(pod_requests(&[c], &[], &ContainerResources::default(), &ResourceList::new()), cpu(500));
    }

    #[test]
    fn init_containers_and_sidecars() {
        let main = ContainerResources { requests: cpu(100), limits: ResourceList::new() };
        let init = ContainerResources { requests: cpu(1000), limits: ResourceList::new() };
        let sidecar = ContainerResources { requests: cpu(50), limits: ResourceList::new() };
        // A plain init container larger than the steady state dominates.
        assert_eq!(
            pod_requests(
                std::slice::from_ref(&main),
                &[(init.clone(), false)],
                &ContainerResources::default(),
                &ResourceList::new()
            ),
            cpu(1000)
        );
        // A sidecar adds to the steady state and to later init steps.
        let r = pod_requests(
            std::slice::from_ref(&main),
            &[(sidecar, true), (init, false)],
            &ContainerResources::default(),
            &cpu(10),
        );
        assert_eq!(r, cpu(1050 + 10));
    }

    #[test]
    fn pod_level_resources_replace_the_containers_sum() {
        let main = ContainerResources { requests: cpu(100), limits: ResourceList::new() };
        let mem = |b: i64| ResourceList::from_pairs([(ResourceName::Memory, b)]);
        // Pod-level cpu replaces the containers' cpu; overhead still adds.
        let pod = ContainerResources { requests: cpu(2000), limits: ResourceList::new() };
        assert_eq!(pod_requests(std::slice::from_ref(&main), &[], &pod, &cpu(10)), cpu(2010));
        // Containers that request nothing: the pod-level request is the pod's request.
        let empty = ContainerResources::default();
        let pod = ContainerResources { requests: cpu(100).merged(&mem(128 << 20)), limits: ResourceList::new() };
        assert_eq!(pod_requests(&[empty.clone(), empty.clone()], &[], &pod, &ResourceList::new()), pod.requests);
        // A pod-level limit alone defaults the request when no container sets it.
        let pod = ContainerResources { requests: ResourceList::new(), limits: mem(1 << 30) };
        assert_eq!(pod_requests(&[empty], &[], &pod, &ResourceList::new()), mem(1 << 30));
        let pod = ContainerResources { requests: ResourceList::new(), limits: cpu(4000) };
        assert_eq!(pod_requests(std::slice::from_ref(&main), &[], &pod, &ResourceList::new()), cpu(100));
        // Extended resources are never pod-level.
        let gpu = ResourceList::from_pairs([(ResourceName::NvidiaGpu, 1)]);
        let pod = ContainerResources { requests: gpu, limits: ResourceList::new() };
        assert_eq!(pod_requests(std::slice::from_ref(&main), &[], &pod, &ResourceList::new()), cpu(100));
    }

    #[test]
    fn heaviest_preferred_term_is_used() {
        let mut a = Requirements::new();
        a.add("zone", Requirement::is_in(["a"]));
        let mut b = Requirements::new();
        b.add("zone", Requirement::is_in(["b"]));
        let aff = NodeAffinity { required: vec![], preferred: vec![(1, a), (5, b)] };
        let r = pod_requirements(&Labels::new(), &aff, true);
        assert!(r.get("zone").has("b") && !r.get("zone").has("a"));
        assert!(!pod_requirements(&Labels::new(), &aff, false).has("zone"));
    }
}
