//! The two kinds of capacity a pod can be simulated onto: existing nodes and NodeClaims
//! planned in this solve (Karpenter's `ExistingNode` and scheduling `NodeClaim`).

use crate::labels;
use crate::node::Node;
use crate::pod::{HostPort, Pod};
use crate::requirements::{Requirement, Requirements};
use crate::resources::{ResourceList, ResourceName};
use crate::taints::{self, Taint};

use super::filter::{self, FilterInput};
use super::template::{Template, daemon_fits_node};
use super::topology::Topology;
use super::view::PodData;

/// An existing node with what is left on it.
pub struct ExistingNode<'a> {
    pub node: &'a Node,
    pub index: usize,
    pub taints: Vec<Taint>,
    pub requirements: Requirements,
    /// Allocatable minus bound pods minus DaemonSets that will still land there.
    pub remaining: ResourceList,
    pub host_ports: Vec<HostPort>,
    /// Pending pods placed here by this solve.
    pub pods: Vec<usize>,
    /// Taken out of the cluster for a trial (`Scheduler::take_out`): it takes no pod.
    pub out: bool,
}

impl<'a> ExistingNode<'a> {
    /// Prepares a node: subtracts its bound pods and the DaemonSets that would still run
    /// on it (those not already running there), never below zero.
    pub fn new(node: &'a Node, index: usize, bound: &[&Pod], daemonsets: &[Pod]) -> Self {
        let taints = node.effective_taints();
        let requirements = node.node_requirements();
        let mut used = ResourceList::new();
        let mut running_daemons = ResourceList::new();
        let mut host_ports = Vec::new();
        // Every solve prepares every node over every bound pod: the requests are added in
        // place, with the pod's slot, not copied first.
        for p in bound {
            used.add(&p.requests);
            used.add_amount(ResourceName::Pods, 1);
            if p.daemon {
                running_daemons.add(&p.requests);
                running_daemons.add_amount(ResourceName::Pods, 1);
            }
            host_ports.extend(p.host_ports.iter().cloned());
        }
        let mut daemons = ResourceList::new();
        for ds in daemonsets {
            if daemon_fits_node(ds, &taints, &requirements) {
                daemons.add(&ds.requests_with_pod_slot());
                host_ports.extend(ds.host_ports.iter().cloned());
            }
        }
        let mut pending_daemons = daemons.subtracted(&running_daemons);
        for (n, v) in pending_daemons.clone().iter() {
            if v < 0 {
                pending_daemons.set(n.clone(), 0);
            }
        }
        let remaining = node.allocatable.subtracted(&used).subtracted(&pending_daemons);
        ExistingNode { node, index, taints, requirements, remaining, host_ports, pods: Vec::new(), out: false }
    }

    /// The requirements the node would have with the pod on it, if it can take it. Every
    /// solve asks this of most nodes for most pods, and the callers do not report why a node
    /// was refused, so the cheap checks go first and no refusal is formatted.
    pub fn can_add(
        &self,
        topo: &Topology<'_>,
        idx: usize,
        pod: &Pod,
        data: &PodData,
        tolerations: &[taints::Toleration],
    ) -> Option<Requirements> {
        if self.out || !data.requests.fits_in(&self.remaining) {
            return None;
        }
        if taints::first_untolerated(&self.taints, tolerations).is_some() {
            return None;
        }
        if pod.host_ports.iter().any(|p| self.host_ports.iter().any(|q| p.conflicts(q))) {
            return None;
        }
        self.requirements.compatible(&data.requirements, false).ok()?;
        let mut base = self.requirements.clone();
        base.add_all(&data.requirements);
        try_volume_alternatives(pod, &base, false, |reqs| {
            let topo_reqs = topo
                .add_requirements(idx, pod, &self.taints, &data.strict_requirements, &reqs, false)
                .map_err(|e| e.to_string())?;
            reqs.compatible(&topo_reqs, false).map_err(|e| e.to_string())?;
            let mut reqs = reqs;
            reqs.add_all(&topo_reqs);
            Ok(reqs)
        })
        .ok()
    }

    /// Places the pod.
    pub fn add(&mut self, topo: &mut Topology<'_>, idx: usize, pod: &Pod, data: &PodData, reqs: Requirements) {
        self.pods.push(idx);
        self.remaining.subtract(&data.requests);
        topo.record(idx, pod, &self.taints, &reqs, false);
        self.requirements = reqs;
        self.host_ports.extend(pod.host_ports.iter().cloned());
    }
}

/// Tries each volume topology alternative of the pod in turn (none: one try without),
/// returning the first that works or the last error.
pub fn try_volume_alternatives(
    pod: &Pod,
    base: &Requirements,
    allow_undefined_well_known: bool,
    mut attempt: impl FnMut(Requirements) -> Result<Requirements, String>,
) -> Result<Requirements, String> {
    if pod.volume_requirements.is_empty() {
        return attempt(base.clone());
    }
    let mut last = String::new();
    for vol in &pod.volume_requirements {
        let mut reqs = base.clone();
        if let Err(e) = reqs.compatible(vol, allow_undefined_well_known) {
            last = format!("incompatible volume requirements, {e}");
            continue;
        }
        reqs.add_all(vol);
        match attempt(reqs) {
            Ok(r) => return Ok(r),
            Err(e) => last = e,
        }
    }
    Err(last)
}

/// A NodeClaim planned in this solve.
#[derive(Clone, Debug)]
pub struct PlannedNode {
    /// Unique within a solve.
    pub id: usize,
    /// Index of its template.
    pub template: usize,
    /// `hostname-placeholder-NNNN`: its hostname domain for topology.
    pub hostname: String,
    pub requirements: Requirements,
    /// Indices into the pool's instance types.
    pub types: Vec<usize>,
    /// Sum of pod requests (DaemonSet overhead is added at the end).
    pub requests: ResourceList,
    pub pods: Vec<usize>,
    pub pod_ports: Vec<HostPort>,
    pub min_values_relaxed: bool,
    /// Candidate types are re-derived from the final contents (the dovetail packer opens
    /// claims for one type and lets them launch as the cheapest type that fits).
    pub right_size: bool,
    /// Classes (the packer's) with a pod here that may take twins by `add_twin`.
    pub twins: Vec<usize>,
    /// Largest allocatable per resource over `types` minus the smallest daemon overhead:
    /// a quick necessary condition before the exact per-type check.
    envelope: ResourceList,
}

/// What adding a pod to a planned node would change.
pub struct Addition {
    pub requirements: Requirements,
    pub types: Vec<usize>,
    pub relaxed_min_values: Vec<(String, u32)>,
}

impl PlannedNode {
    /// An empty claim of a template, limited to `types`; its placeholder hostname derives
    /// from `id`.
    pub fn new(template_index: usize, template: &Template<'_>, types: Vec<usize>, id: usize) -> Self {
        let hostname = format!("hostname-placeholder-{id:04}");
        let mut requirements = template.requirements.clone();
        requirements.add(labels::HOSTNAME, Requirement::is_in([hostname.as_str()]));
        let envelope = envelope(template, &types);
        PlannedNode {
            id,
            template: template_index,
            hostname,
            requirements,
            types,
            requests: ResourceList::new(),
            pods: Vec::new(),
            pod_ports: Vec::new(),
            min_values_relaxed: false,
            right_size: false,
            twins: Vec::new(),
            envelope,
        }
    }

    /// Replaces the claim's candidate types.
    pub fn set_types(&mut self, template: &Template<'_>, types: Vec<usize>) {
        self.envelope = envelope(template, &types);
        self.types = types;
    }

    /// Karpenter's `NodeClaim.CanAdd`.
    #[allow(clippy::too_many_arguments)]
    pub fn can_add(
        &self,
        template: &Template<'_>,
        topo: &Topology<'_>,
        idx: usize,
        pod: &Pod,
        data: &PodData,
        tolerations: &[taints::Toleration],
        relax_min_values: bool,
        quick_reject: bool,
    ) -> Result<Addition, String> {
        if let Some(t) = taints::first_untolerated(&template.pool.taints, tolerations) {
            return Err(format!("did not tolerate taint (taint={t})"));
        }
        let total = self.requests.merged(&data.requests);
        if quick_reject && !total.fits_in(&self.envelope) {
            return Err("exceeds the resources of every remaining instance type".into());
        }
        // A pod with no node requirements of its own: the claim's requirements change only
        // if topology narrows them; when it does not, the filter runs on them as they are.
        if data.requirements.is_empty() && pod.volume_requirements.is_empty() {
            let topo_reqs = topo
                .add_requirements(idx, pod, &template.pool.taints, &data.strict_requirements, &self.requirements, true)
                .map_err(|e| e.to_string())?;
            if topo_reqs == self.requirements {
                let filtered = self.filter(template, &topo_reqs, &total, pod, data, quick_reject, relax_min_values)?;
                return Ok(Addition {
                    requirements: topo_reqs,
                    types: filtered.types,
                    relaxed_min_values: filtered.relaxed_min_values,
                });
            }
        }
        self.requirements
            .compatible(&data.requirements, true)
            .map_err(|e| format!("incompatible requirements, {e}"))?;
        let mut base = self.requirements.clone();
        base.add_all(&data.requirements);
        let mut result = None;
        let reqs = try_volume_alternatives(pod, &base, true, |reqs| {
            let topo_reqs = topo
                .add_requirements(idx, pod, &template.pool.taints, &data.strict_requirements, &reqs, true)
                .map_err(|e| e.to_string())?;
            reqs.compatible(&topo_reqs, true).map_err(|e| e.to_string())?;
            let mut reqs = reqs;
            reqs.add_all(&topo_reqs);
            result = Some(self.filter(template, &reqs, &total, pod, data, quick_reject, relax_min_values)?);
            Ok(reqs)
        })?;
        let filtered = result.expect("invariant: a successful attempt sets the filter result");
        Ok(Addition { requirements: reqs, types: filtered.types, relaxed_min_values: filtered.relaxed_min_values })
    }

    /// The claim's types that can take it with `reqs` and `total` requests.
    #[allow(clippy::too_many_arguments)]
    fn filter(
        &self,
        template: &Template<'_>,
        reqs: &Requirements,
        total: &ResourceList,
        pod: &Pod,
        data: &PodData,
        quick_reject: bool,
        relax_min_values: bool,
    ) -> Result<filter::Filtered, String> {
        // A claim down to one type (the packer's): the same checks as the filter without
        // building its report; the full filter runs only to explain a failure.
        if quick_reject
            && let [t] = self.types[..]
            && !reqs.has_min_values()
            && self.single_type_ok(template, t, reqs, total, pod)
        {
            return Ok(filter::Filtered { types: vec![t], relaxed_min_values: Vec::new() });
        }
        filter::filter_instance_types(&FilterInput {
            instance_types: template.instance_types,
            candidates: &self.types,
            requirements: reqs,
            pod_requests: &data.requests,
            total_requests: total,
            pod_ports: &pod.host_ports,
            claim_ports: &self.pod_ports,
            groups: &template.daemon_groups,
            group_of: &template.group_of,
            relax_min_values,
            base: Some(&template.requirements),
        })
        .map_err(|e| e.to_string())
    }

    /// Whether type `t` can still launch this claim with `reqs` and `total` requests: it
    /// meets the requirements (beyond its pool's, which it meets), offers an available
    /// offering they allow, fits the requests with its DaemonSets, and no host port
    /// collides (what `filter_instance_types` checks for each candidate).
    fn single_type_ok(
        &self,
        template: &Template<'_>,
        t: usize,
        reqs: &Requirements,
        total: &ResourceList,
        pod: &Pod,
    ) -> bool {
        let Some(g) = template.group_of[t] else { return false };
        let group = &template.daemon_groups[g];
        let it = &template.instance_types[t];
        let filter = crate::catalog::OfferingFilter::new(reqs);
        it.requirements.intersects_ok_on(&reqs.keys_beyond(&template.requirements))
            && it.offerings.iter().any(|o| filter.accepts(o))
            && total.fits_in_with(&group.overhead, &it.allocatable)
            && !pod.host_ports.iter().any(|p| {
                self.pod_ports.iter().any(|q| p.conflicts(q)) || group.host_ports.iter().any(|q| p.conflicts(q))
            })
    }

    /// Adds a pod identical to one the claim already took through `can_add`/`add`, when only
    /// its resources can make a difference: the caller vouches that no topology constrains
    /// the pod and it binds no host port, so its requirements are already the claim's (the
    /// intersection is idempotent). Every candidate type must still fit the pods with its
    /// DaemonSets; otherwise nothing changes and false is returned (the full check decides).
    pub fn add_twin(
        &mut self,
        template: &Template<'_>,
        topo: &mut Topology<'_>,
        idx: usize,
        pod: &Pod,
        data: &PodData,
    ) -> bool {
        let total = self.requests.merged(&data.requests);
        let fits = self.types.iter().all(|&t| {
            template.group_of[t].is_some_and(|g| {
                total.fits_in_with(&template.daemon_groups[g].overhead, &template.instance_types[t].allocatable)
            })
        });
        if !fits {
            return false;
        }
        self.pods.push(idx);
        self.requests = total;
        topo.record(idx, pod, &template.pool.taints, &self.requirements, true);
        true
    }

    /// Places the pod (Karpenter's `NodeClaim.Add`).
    pub fn add(
        &mut self,
        template: &Template<'_>,
        topo: &mut Topology<'_>,
        idx: usize,
        pod: &Pod,
        data: &PodData,
        add: Addition,
    ) {
        self.pods.push(idx);
        if add.types.len() != self.types.len() {
            self.envelope = envelope(template, &add.types);
        }
        self.types = add.types;
        self.requests.add(&data.requests);
        let mut reqs = add.requirements;
        for (key, n) in add.relaxed_min_values {
            reqs.get_mut(&key).min_values = Some(n);
            self.min_values_relaxed = true;
        }
        topo.register(labels::HOSTNAME, &self.hostname);
        topo.record(idx, pod, &template.pool.taints, &reqs, true);
        self.requirements = reqs;
        self.pod_ports.extend(pod.host_ports.iter().cloned());
    }
}

fn envelope(template: &Template<'_>, types: &[usize]) -> ResourceList {
    let mut env = ResourceList::new();
    let mut min_daemon: Option<ResourceList> = None;
    for &t in types {
        env = env.max_with(&template.instance_types[t].allocatable);
        if let Some(g) = template.group_of[t] {
            let o = &template.daemon_groups[g].overhead;
            min_daemon = Some(match min_daemon {
                None => o.clone(),
                Some(m) => m.min_with(o),
            });
        }
    }
    if let Some(m) = min_daemon {
        env = env.subtracted(&m);
    }
    // Negative entries would make `fits_in` reject everything; the exact check decides.
    for (n, v) in env.clone().iter() {
        if v < 0 {
            env.set(n.clone(), 0);
        }
    }
    env
}
