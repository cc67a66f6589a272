//! Pods, pod templates and Nodes.

use std::collections::BTreeMap;

use dovetail_core::labels::Labels;
use dovetail_core::node::Node;
use dovetail_core::pod::{
    self, ContainerResources, HostPort, InclusionPolicy, NodeAffinity, Pod, PodAffinity, PodAffinityTerm, PodKey,
    TopologySpreadConstraint, WhenUnsatisfiable,
};
use dovetail_core::requirements::Requirements;
use dovetail_core::taints::{Effect, Toleration, TolerationOp};
use k8s_openapi::api::core::v1 as core;

use super::{ConversionError, Ctx, label_selector, requirements, resource_list, taint};

/// The annotations a pod keeps: the ones dovetail reads, and no others, so a cache of many
/// pods does not hold everything tools write there.
/// - Karpenter's (`karpenter.sh/do-not-disrupt`);
/// - `kubernetes.io/config.mirror`, which marks a static pod's mirror (never evicted, never
///   counted on its node);
/// - `controller.kubernetes.io/pod-deletion-cost`, which the disruption cost reads.
pub fn kept_annotation(key: &str) -> bool {
    key.starts_with("karpenter.sh/")
        || key == dovetail_core::pod::MIRROR_ANNOTATION
        || key == dovetail_core::disruption::candidates::DELETION_COST_ANNOTATION
}

/// What a pod's owner references say: whether a DaemonSet owns it, and whether its Node does
/// (`v1` `Node`: a static pod's mirror, as Karpenter's `IsOwnedByNode` reads it).
pub fn owners(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> (bool, bool) {
    let refs = || meta.owner_references.iter().flatten();
    (refs().any(|o| o.kind == "DaemonSet"), refs().any(|o| o.kind == "Node" && o.api_version == "v1"))
}

/// The identity and metadata a pod gets (from its own metadata or a workload's).
#[derive(Clone, Debug, Default)]
pub struct PodMeta {
    pub namespace: String,
    pub name: String,
    pub labels: Labels,
    pub annotations: Labels,
    /// Orders pods of equal size.
    pub creation: i64,
    pub daemon: bool,
    /// Owned by its Node: a mirror pod.
    pub owned_by_node: bool,
    pub terminal: bool,
}

pub(super) fn node_selector_term(
    ctx: &Ctx,
    field: &str,
    t: &core::NodeSelectorTerm,
) -> Result<(Requirements, bool), ConversionError> {
    let exprs: Vec<_> = t
        .match_expressions
        .iter()
        .flatten()
        .map(|e| (e.key.clone(), e.operator.clone(), e.values.clone().unwrap_or_default(), None))
        .collect();
    let reqs = requirements(ctx, &format!("{field}.matchExpressions"), &exprs, false)?;
    Ok((reqs, t.match_fields.as_ref().is_some_and(|f| !f.is_empty())))
}

fn affinity_term(ctx: &Ctx, field: &str, t: &core::PodAffinityTerm) -> Result<PodAffinityTerm, ConversionError> {
    if t.topology_key.is_empty() {
        return Err(ctx.err(format!("{field}.topologyKey"), "topologyKey must not be empty"));
    }
    Ok(PodAffinityTerm {
        selector: label_selector(ctx, &format!("{field}.labelSelector"), t.label_selector.as_ref())?,
        namespaces: t.namespaces.clone().unwrap_or_default(),
        namespace_selector: label_selector(ctx, &format!("{field}.namespaceSelector"), t.namespace_selector.as_ref())?,
        topology_key: t.topology_key.clone(),
    })
}

fn pod_affinity(
    ctx: &Ctx,
    field: &str,
    required: Option<&Vec<core::PodAffinityTerm>>,
    preferred: Option<&Vec<core::WeightedPodAffinityTerm>>,
) -> Result<PodAffinity, ConversionError> {
    let mut out = PodAffinity::default();
    for (i, t) in required.into_iter().flatten().enumerate() {
        out.required.push(affinity_term(
            ctx,
            &format!("{field}.requiredDuringSchedulingIgnoredDuringExecution[{i}]"),
            t,
        )?);
    }
    for (i, t) in preferred.into_iter().flatten().enumerate() {
        let f = format!("{field}.preferredDuringSchedulingIgnoredDuringExecution[{i}]");
        if !(1..=100).contains(&t.weight) {
            return Err(ctx.err(format!("{f}.weight"), format!("weight must be in 1..100, got {}", t.weight)));
        }
        out.preferred.push((t.weight, affinity_term(ctx, &format!("{f}.podAffinityTerm"), &t.pod_affinity_term)?));
    }
    Ok(out)
}

fn toleration(ctx: &Ctx, field: &str, t: &core::Toleration) -> Result<Toleration, ConversionError> {
    let op_name = t.operator.clone().unwrap_or_default();
    let op = TolerationOp::parse(&op_name).ok_or_else(|| {
        ctx.err(format!("{field}.operator"), format!("unknown operator {op_name:?}; expected Equal, Exists, Gt or Lt"))
    })?;
    let value = t.value.clone().unwrap_or_default();
    if op == TolerationOp::Exists && !value.is_empty() {
        return Err(ctx.err(format!("{field}.value"), "value must be empty when operator is Exists"));
    }
    let key = t.key.clone().unwrap_or_default();
    if key.is_empty() && op != TolerationOp::Exists {
        return Err(ctx.err(format!("{field}.operator"), "operator must be Exists when key is empty"));
    }
    let effect = match t.effect.as_deref() {
        None | Some("") => None,
        Some(e) => Some(Effect::parse(e).ok_or_else(|| {
            ctx.err(
                format!("{field}.effect"),
                format!("unknown effect {e:?}; expected NoSchedule, PreferNoSchedule or NoExecute"),
            )
        })?),
    };
    Ok(Toleration { key, op, value, effect })
}

fn policy(ctx: &Ctx, field: &str, v: Option<&String>) -> Result<Option<InclusionPolicy>, ConversionError> {
    match v.map(String::as_str) {
        None => Ok(None),
        Some("Honor") => Ok(Some(InclusionPolicy::Honor)),
        Some("Ignore") => Ok(Some(InclusionPolicy::Ignore)),
        Some(o) => Err(ctx.err(field, format!("unknown policy {o:?}; expected Honor or Ignore"))),
    }
}

fn spread(
    ctx: &Ctx,
    field: &str,
    t: &core::TopologySpreadConstraint,
) -> Result<TopologySpreadConstraint, ConversionError> {
    if t.max_skew < 1 {
        return Err(ctx.err(format!("{field}.maxSkew"), format!("maxSkew must be at least 1, got {}", t.max_skew)));
    }
    if t.topology_key.is_empty() {
        return Err(ctx.err(format!("{field}.topologyKey"), "topologyKey must not be empty"));
    }
    let when = match t.when_unsatisfiable.as_str() {
        "DoNotSchedule" => WhenUnsatisfiable::DoNotSchedule,
        "ScheduleAnyway" => WhenUnsatisfiable::ScheduleAnyway,
        o => {
            return Err(ctx.err(
                format!("{field}.whenUnsatisfiable"),
                format!("unknown value {o:?}; expected DoNotSchedule or ScheduleAnyway"),
            ));
        }
    };
    if let Some(m) = t.min_domains
        && (m < 1 || when != WhenUnsatisfiable::DoNotSchedule)
    {
        return Err(ctx.err(
            format!("{field}.minDomains"),
            "minDomains must be at least 1 and needs whenUnsatisfiable: DoNotSchedule",
        ));
    }
    Ok(TopologySpreadConstraint {
        max_skew: t.max_skew,
        topology_key: t.topology_key.clone(),
        when_unsatisfiable: when,
        selector: label_selector(ctx, &format!("{field}.labelSelector"), t.label_selector.as_ref())?,
        min_domains: t.min_domains,
        node_affinity_policy: policy(ctx, &format!("{field}.nodeAffinityPolicy"), t.node_affinity_policy.as_ref())?,
        node_taints_policy: policy(ctx, &format!("{field}.nodeTaintsPolicy"), t.node_taints_policy.as_ref())?,
        match_label_keys: t.match_label_keys.clone().unwrap_or_default(),
    })
}

fn container_resources(ctx: &Ctx, field: &str, c: &core::Container) -> Result<ContainerResources, ConversionError> {
    let r = c.resources.as_ref();
    Ok(ContainerResources {
        requests: resource_list(ctx, &format!("{field}.resources.requests"), r.and_then(|r| r.requests.as_ref()))?,
        limits: resource_list(ctx, &format!("{field}.resources.limits"), r.and_then(|r| r.limits.as_ref()))?,
    })
}

fn host_ports(ctx: &Ctx, field: &str, c: &core::Container, out: &mut Vec<HostPort>) -> Result<(), ConversionError> {
    for (i, p) in c.ports.iter().flatten().enumerate() {
        let Some(hp) = p.host_port.filter(|hp| *hp != 0) else { continue };
        let port = u16::try_from(hp).ok().filter(|p| *p > 0).ok_or_else(|| {
            ctx.err(format!("{field}.ports[{i}].hostPort"), format!("hostPort must be in 1..65535, got {hp}"))
        })?;
        out.push(HostPort {
            ip: p.host_ip.clone().unwrap_or_default(),
            port,
            protocol: p.protocol.clone().unwrap_or_else(|| "TCP".into()),
        });
    }
    Ok(())
}

/// Converts a pod spec. `field` prefixes field paths (`spec` for a Pod,
/// `spec.template.spec` for a workload).
pub fn pod_from_spec(ctx: &Ctx, field: &str, meta: PodMeta, spec: &core::PodSpec) -> Result<Pod, ConversionError> {
    let mut containers = Vec::new();
    let mut ports = Vec::new();
    for (i, c) in spec.containers.iter().enumerate() {
        let f = format!("{field}.containers[{i}]");
        containers.push(container_resources(ctx, &f, c)?);
        host_ports(ctx, &f, c, &mut ports)?;
    }
    let mut inits = Vec::new();
    for (i, c) in spec.init_containers.iter().flatten().enumerate() {
        let f = format!("{field}.initContainers[{i}]");
        inits.push((container_resources(ctx, &f, c)?, c.restart_policy.as_deref() == Some("Always")));
        host_ports(ctx, &f, c, &mut ports)?;
    }
    let overhead = resource_list(ctx, &format!("{field}.overhead"), spec.overhead.as_ref())?;
    let pod_level = ContainerResources {
        requests: resource_list(
            ctx,
            &format!("{field}.resources.requests"),
            spec.resources.as_ref().and_then(|r| r.requests.as_ref()),
        )?,
        limits: resource_list(
            ctx,
            &format!("{field}.resources.limits"),
            spec.resources.as_ref().and_then(|r| r.limits.as_ref()),
        )?,
    };
    let requests = pod::pod_requests(&containers, &inits, &pod_level, &overhead);

    let mut node_affinity = NodeAffinity::default();
    let mut uses_match_fields = false;
    let mut pod_aff = PodAffinity::default();
    let mut anti = PodAffinity::default();
    if let Some(aff) = &spec.affinity {
        if let Some(na) = &aff.node_affinity {
            let nf = format!("{field}.affinity.nodeAffinity");
            if let Some(req) = &na.required_during_scheduling_ignored_during_execution {
                for (i, t) in req.node_selector_terms.iter().enumerate() {
                    let (r, mf) = node_selector_term(
                        ctx,
                        &format!("{nf}.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[{i}]"),
                        t,
                    )?;
                    uses_match_fields |= mf;
                    node_affinity.required.push(r);
                }
            }
            for (i, t) in na.preferred_during_scheduling_ignored_during_execution.iter().flatten().enumerate() {
                let f = format!("{nf}.preferredDuringSchedulingIgnoredDuringExecution[{i}]");
                if !(1..=100).contains(&t.weight) {
                    return Err(ctx.err(format!("{f}.weight"), format!("weight must be in 1..100, got {}", t.weight)));
                }
                let (r, _) = node_selector_term(ctx, &format!("{f}.preference"), &t.preference)?;
                node_affinity.preferred.push((t.weight, r));
            }
        }
        if let Some(pa) = &aff.pod_affinity {
            pod_aff = pod_affinity(
                ctx,
                &format!("{field}.affinity.podAffinity"),
                pa.required_during_scheduling_ignored_during_execution.as_ref(),
                pa.preferred_during_scheduling_ignored_during_execution.as_ref(),
            )?;
        }
        if let Some(pa) = &aff.pod_anti_affinity {
            anti = pod_affinity(
                ctx,
                &format!("{field}.affinity.podAntiAffinity"),
                pa.required_during_scheduling_ignored_during_execution.as_ref(),
                pa.preferred_during_scheduling_ignored_during_execution.as_ref(),
            )?;
        }
    }
    let mut tolerations = Vec::new();
    for (i, t) in spec.tolerations.iter().flatten().enumerate() {
        tolerations.push(toleration(ctx, &format!("{field}.tolerations[{i}]"), t)?);
    }
    let mut topology_spread = Vec::new();
    for (i, t) in spec.topology_spread_constraints.iter().flatten().enumerate() {
        topology_spread.push(spread(ctx, &format!("{field}.topologySpreadConstraints[{i}]"), t)?);
    }
    // The claims its volumes mount: a PersistentVolumeClaim by name, a generic ephemeral
    // volume by the name its controller gives the claim it creates.
    let volume_claims = spec
        .volumes
        .iter()
        .flatten()
        .filter_map(|v| match (&v.persistent_volume_claim, &v.ephemeral) {
            (Some(c), _) => Some(c.claim_name.clone()),
            (None, Some(_)) => Some(format!("{}-{}", meta.name, v.name)),
            (None, None) => None,
        })
        .collect();
    Ok(Pod {
        key: PodKey { namespace: meta.namespace, name: meta.name },
        labels: meta.labels.into(),
        requests,
        node_selector: spec.node_selector.clone().unwrap_or_default().into(),
        node_affinity: node_affinity.into(),
        pod_affinity: pod_aff.into(),
        pod_anti_affinity: anti.into(),
        tolerations: tolerations.into(),
        topology_spread: topology_spread.into(),
        host_ports: ports,
        node_name: spec.node_name.clone().filter(|n| !n.is_empty()),
        priority: spec.priority.unwrap_or(0),
        creation: meta.creation,
        daemon: meta.daemon,
        owned_by_node: meta.owned_by_node,
        uses_match_fields,
        terminal: meta.terminal,
        volume_requirements: Vec::new(),
        volume_claims,
        annotations: meta.annotations.into_iter().filter(|(k, _)| kept_annotation(k)).collect(),
        termination_grace_seconds: spec.termination_grace_period_seconds,
        scheduling_gated: spec.scheduling_gates.as_ref().is_some_and(|g| !g.is_empty()),
        scheduler_name: spec.scheduler_name.clone().filter(|s| !s.is_empty() && s != "default-scheduler"),
        // Status (the scheduler's mark, start time, nomination) is read by the cluster adapter.
        ..Pod::default()
    })
}

/// Converts a Node.
pub fn node(ctx: &Ctx, n: &core::Node) -> Result<Node, ConversionError> {
    let name = n.metadata.name.clone().unwrap_or_default();
    if name.is_empty() {
        return Err(ctx.err("metadata.name", "a Node needs a name"));
    }
    let spec = n.spec.clone().unwrap_or_default();
    let status = n.status.clone().unwrap_or_default();
    let mut taints = Vec::new();
    for (i, t) in spec.taints.iter().flatten().enumerate() {
        taints.push(taint(ctx, &format!("spec.taints[{i}]"), t)?);
    }
    let allocatable = resource_list(ctx, "status.allocatable", status.allocatable.as_ref())?;
    let capacity = match &status.capacity {
        Some(c) => resource_list(ctx, "status.capacity", Some(c))?,
        None => allocatable.clone(),
    };
    if allocatable.is_empty() {
        return Err(ctx.err("status.allocatable", "a Node needs status.allocatable (cpu, memory, pods) to take pods"));
    }
    let ready =
        status.conditions.as_ref().and_then(|cs| cs.iter().find(|c| c.type_ == "Ready")).map(|c| c.status == "True");
    let labels: BTreeMap<String, String> = n.metadata.labels.clone().unwrap_or_default();
    let owner_claim = n
        .metadata
        .owner_references
        .iter()
        .flatten()
        .find(|o| o.kind == "NodeClaim" && o.api_version.starts_with("karpenter.sh/"))
        .map(|o| o.name.clone());
    // A node that just joined, Ready with `karpenter.sh/unregistered` still on it, is capacity
    // in flight, not capacity lost (a 20 x 1,000 run re-provisioned 60 nodes for pods counted
    // onto 52 that had just joined, when Ready alone made a node initialized).
    let managed = labels.contains_key(dovetail_core::labels::NODEPOOL) || owner_claim.is_some();
    let initialized = Node::initialized_by(&labels, ready.unwrap_or(true), managed);
    Ok(Node {
        name,
        labels: labels.into(),
        taints,
        capacity,
        allocatable,
        initialized,
        requirements: None,
        unschedulable: spec.unschedulable.unwrap_or(false),
        provider_id: spec.provider_id.clone(),
        ready: ready.unwrap_or(true),
        finalizers: n.metadata.finalizers.clone().unwrap_or_default(),
        owner_claim,
        deleting: n.metadata.deletion_timestamp.is_some(),
        do_not_disrupt: n
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(dovetail_core::plane::DO_NOT_DISRUPT))
            .is_some_and(|v| v == "true"),
        resource_version: n.metadata.resource_version.as_deref().and_then(|v| v.parse().ok()).unwrap_or(0),
    })
}

/// Converts a live Pod object with its status: the scheduler's `Unschedulable` mark, the
/// nomination, start time, phase and deletion mark.
pub fn pod_object(p: &core::Pod) -> Result<Pod, ConversionError> {
    let meta = &p.metadata;
    let ctx = Ctx::new(format!(
        "Pod {}/{}",
        meta.namespace.as_deref().unwrap_or("default"),
        meta.name.as_deref().unwrap_or_default()
    ));
    let spec = p.spec.as_ref().ok_or_else(|| ctx.err("spec", "a Pod needs a spec"))?;
    let status = p.status.as_ref();
    let phase = status.and_then(|s| s.phase.as_deref()).unwrap_or_default();
    let (daemon, owned_by_node) = owners(meta);
    let pm = PodMeta {
        namespace: meta.namespace.clone().unwrap_or_else(|| "default".into()),
        name: meta.name.clone().unwrap_or_default(),
        labels: meta.labels.clone().unwrap_or_default(),
        annotations: meta.annotations.clone().unwrap_or_default(),
        creation: meta.creation_timestamp.as_ref().map_or(0, |t| t.0.as_millisecond()),
        daemon,
        owned_by_node,
        terminal: matches!(phase, "Succeeded" | "Failed"),
    };
    let mut pod = pod_from_spec(&ctx, "spec", pm, spec)?;
    pod.deleting = meta.deletion_timestamp.is_some();
    pod.unschedulable = status.and_then(|s| s.conditions.as_ref()).is_some_and(|cs| {
        cs.iter()
            .any(|c| c.type_ == "PodScheduled" && c.status == "False" && c.reason.as_deref() == Some("Unschedulable"))
    });
    pod.nominated_node = status.and_then(|s| s.nominated_node_name.clone()).filter(|n| !n.is_empty());
    pod.started_at = status.and_then(|s| s.start_time.as_ref()).and_then(|t| u64::try_from(t.0.as_millisecond()).ok());
    Ok(pod)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn live(value: serde_json::Value) -> Pod {
        let p: core::Pod = serde_json::from_value(value).expect("a pod");
        pod_object(&p).expect("converts")
    }

    #[test]
    fn a_static_pods_mirror_keeps_what_says_so_and_the_deletion_cost_survives() {
        let mirror = live(serde_json::json!({
            "metadata": {"name": "kube-proxy-ip-1", "namespace": "kube-system",
                         "annotations": {"kubernetes.io/config.mirror": "abc", "kubernetes.io/config.source": "file",
                                         "kubernetes.io/config.hash": "abc"},
                         "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": "ip-1", "uid": "u1"}]},
            "spec": {"nodeName": "ip-1", "containers": [{"name": "proxy"}]}
        }));
        assert!(mirror.owned_by_node && mirror.is_mirror());
        assert_eq!(mirror.annotations.keys().collect::<Vec<_>>(), ["kubernetes.io/config.mirror"]);
        // Owned by its Node alone (an annotation some tool stripped): still a mirror.
        let owned = live(serde_json::json!({
            "metadata": {"name": "nginx-proxy-ip-1", "namespace": "kube-system",
                         "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": "ip-1", "uid": "u1"}]},
            "spec": {"nodeName": "ip-1", "containers": [{"name": "proxy"}]}
        }));
        assert!(owned.is_mirror());
        assert!(!owned.is_provisionable(), "never provisioned for");
        let web = live(serde_json::json!({
            "metadata": {"name": "web-1", "namespace": "shop",
                         "annotations": {"controller.kubernetes.io/pod-deletion-cost": "-100",
                                         "karpenter.sh/do-not-disrupt": "true", "prometheus.io/scrape": "true"},
                         "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web", "uid": "u2"}]},
            "spec": {"containers": [{"name": "app"}]}
        }));
        assert!(!web.is_mirror() && !web.daemon);
        assert_eq!(
            web.annotations.keys().collect::<Vec<_>>(),
            ["controller.kubernetes.io/pod-deletion-cost", "karpenter.sh/do-not-disrupt"]
        );
    }
}
