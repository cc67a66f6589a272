//! Core NodeClaim specs into `karpenter.sh/v1` NodeClaim objects.

use std::collections::BTreeMap;

use dovetail_core::nodepool::NodeClaimSpec;
use dovetail_core::requirements::Requirements;
use k8s_openapi::api::core::v1::Taint as K8sTaint;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};

use super::{ConversionError, Ctx, requirements, resource_list, taint};
use crate::crd::{self, NodeClassReference, NodeSelectorRequirementWithMinValues};

/// The `node selector requirements` form of requirements, as Karpenter writes them on a
/// NodeClaim (bounded sets become `Gte`/`Lte`).
pub fn node_selector_requirements(reqs: &Requirements) -> Vec<NodeSelectorRequirementWithMinValues> {
    let mut out = Vec::new();
    for (key, r) in reqs.iter() {
        let min_values = r.min_values.map(|m| m as i32);
        let mut push = |op: &str, values: Vec<String>| {
            out.push(NodeSelectorRequirementWithMinValues {
                key: key.to_string(),
                operator: op.to_string(),
                values: (!values.is_empty()).then_some(values),
                min_values,
            })
        };
        if r.gte().is_some() || r.lte().is_some() {
            if let Some(g) = r.gte() {
                push("Gte", vec![g.to_string()]);
            }
            if let Some(l) = r.lte() {
                push("Lte", vec![l.to_string()]);
            }
            if !r.values().is_empty() {
                push("NotIn", r.values().to_vec());
            }
            continue;
        }
        push(r.operator().as_str(), r.values().to_vec());
    }
    out
}

fn taints(ts: &[dovetail_core::taints::Taint]) -> Option<Vec<K8sTaint>> {
    (!ts.is_empty()).then(|| {
        ts.iter()
            .map(|t| K8sTaint {
                key: t.key.clone(),
                value: (!t.value.is_empty()).then(|| t.value.clone()),
                effect: t.effect.as_str().to_string(),
                time_added: None,
            })
            .collect()
    })
}

fn duration(d: Option<std::time::Duration>) -> String {
    match d {
        None => "Never".into(),
        Some(d) => format!("{}s", d.as_secs()),
    }
}

/// A NodeClaim object named `name`, owned by its NodePool (`nodepool_uid` when known).
pub fn nodeclaim(name: &str, spec: &NodeClaimSpec, nodepool_uid: Option<&str>) -> crd::NodeClaim {
    let requests: BTreeMap<String, Quantity> =
        spec.requests.iter().map(|(n, v)| (n.to_string(), Quantity(n.quantity_of(v).to_string()))).collect();
    let mut nc = crd::NodeClaim::new(
        name,
        crd::NodeClaimSpec {
            taints: taints(&spec.taints),
            startup_taints: taints(&spec.startup_taints),
            requirements: node_selector_requirements(&spec.requirements),
            resources: Some(crd::nodeclaim::ResourceRequirements { requests: Some(requests) }),
            node_class_ref: NodeClassReference {
                group: spec.node_class.group.clone(),
                kind: spec.node_class.kind.clone(),
                name: spec.node_class.name.clone(),
            },
            termination_grace_period: spec.termination_grace_period.map(|d| duration(Some(d))),
            expire_after: Some(duration(spec.expire_after)),
        },
    );
    nc.metadata = ObjectMeta {
        name: Some(name.to_string()),
        labels: Some(spec.labels.clone()),
        annotations: Some(spec.annotations.clone()),
        finalizers: Some(vec!["karpenter.sh/termination".into()]),
        owner_references: nodepool_uid.map(|uid| {
            vec![OwnerReference {
                api_version: "karpenter.sh/v1".into(),
                kind: "NodePool".into(),
                name: spec.nodepool.clone(),
                uid: uid.to_string(),
                block_owner_deletion: Some(true),
                controller: None,
            }]
        }),
        ..Default::default()
    };
    nc
}

/// A `karpenter.sh/v1` NodeClaim object as core reads it: its spec (the NodePool from the
/// `karpenter.sh/nodepool` label), finalizers, deletion mark, status and resource version.
pub fn nodeclaim_from_object(nc: &crd::NodeClaim) -> Result<dovetail_core::cluster::NodeClaim, ConversionError> {
    use dovetail_core::cluster::{Condition as CoreCondition, NodeClaim as CoreNodeClaim, NodeClaimStatus};
    let name = nc.metadata.name.clone().unwrap_or_default();
    let ctx = Ctx::new(format!("NodeClaim {name:?}"));
    if name.is_empty() {
        return Err(ctx.err("metadata.name", "a NodeClaim needs a name"));
    }
    let labels = nc.metadata.labels.clone().unwrap_or_default();
    let nodepool = labels.get(dovetail_core::labels::NODEPOOL).cloned().unwrap_or_default();
    let spec = &nc.spec;
    let exprs: Vec<_> = spec
        .requirements
        .iter()
        .map(|r| (r.key.clone(), r.operator.clone(), r.values.clone().unwrap_or_default(), r.min_values))
        .collect();
    let requirements = requirements(&ctx, "spec.requirements", &exprs, true)?;
    let mut taints = Vec::new();
    for (i, t) in spec.taints.iter().flatten().enumerate() {
        taints.push(taint(&ctx, &format!("spec.taints[{i}]"), t)?);
    }
    let mut startup_taints = Vec::new();
    for (i, t) in spec.startup_taints.iter().flatten().enumerate() {
        startup_taints.push(taint(&ctx, &format!("spec.startupTaints[{i}]"), t)?);
    }
    let requests =
        resource_list(&ctx, "spec.resources.requests", spec.resources.as_ref().and_then(|r| r.requests.as_ref()))?;
    let parse = |field: &str, v: Option<&String>| match v {
        None => Ok(None),
        Some(s) => dovetail_core::nodepool::parse_duration(s).map_err(|e| ctx.err(field, e)),
    };
    let expire_after = parse("spec.expireAfter", spec.expire_after.as_ref())?;
    let termination_grace_period = parse("spec.terminationGracePeriod", spec.termination_grace_period.as_ref())?;
    let status = nc.status.clone().unwrap_or_default();
    let conditions = status
        .conditions
        .iter()
        .flatten()
        .map(|c| CoreCondition {
            kind: c.type_.clone(),
            status: c.status == "True",
            reason: c.reason.clone().unwrap_or_default(),
            message: c.message.clone().unwrap_or_default(),
        })
        .collect();
    Ok(CoreNodeClaim {
        name,
        spec: dovetail_core::nodepool::NodeClaimSpec {
            nodepool,
            labels,
            annotations: nc.metadata.annotations.clone().unwrap_or_default(),
            taints,
            startup_taints,
            requirements,
            requests,
            node_class: dovetail_core::nodepool::NodeClassRef {
                group: spec.node_class_ref.group.clone(),
                kind: spec.node_class_ref.kind.clone(),
                name: spec.node_class_ref.name.clone(),
            },
            expire_after,
            termination_grace_period,
        },
        finalizers: nc.metadata.finalizers.clone().unwrap_or_default(),
        deleting: nc.metadata.deletion_timestamp.is_some(),
        status: NodeClaimStatus {
            provider_id: status.provider_id.clone(),
            node_name: status.node_name.clone(),
            capacity: resource_list(&ctx, "status.capacity", status.capacity.as_ref())?,
            allocatable: resource_list(&ctx, "status.allocatable", status.allocatable.as_ref())?,
            conditions,
        },
        resource_version: nc.metadata.resource_version.as_deref().and_then(|v| v.parse().ok()).unwrap_or(0),
        created: nc.metadata.creation_timestamp.as_ref().and_then(|t| u64::try_from(t.0.as_millisecond()).ok()),
    })
}

fn quantities(list: &dovetail_core::resources::ResourceList) -> Option<BTreeMap<String, Quantity>> {
    (!list.is_empty())
        .then(|| list.iter().map(|(n, v)| (n.to_string(), Quantity(n.quantity_of(v).to_string()))).collect())
}

/// Core conditions as the API writes them. Each keeps the transition time `previous` gives it
/// when its status did not change, and gets `now` (RFC 3339) otherwise: Karpenter's condition
/// schema requires `type`, `status`, `reason`, `message` and `lastTransitionTime`.
pub fn conditions_object(
    conditions: &[dovetail_core::cluster::Condition],
    previous: &[crd::Condition],
    now: &str,
) -> Vec<crd::Condition> {
    conditions
        .iter()
        .map(|c| {
            let s = if c.status { "True" } else { "False" };
            let since = previous
                .iter()
                .find(|p| p.type_ == c.kind && p.status == s)
                .and_then(|p| p.last_transition_time.clone())
                .unwrap_or_else(|| now.to_string());
            crd::Condition {
                type_: c.kind.clone(),
                status: s.to_string(),
                reason: Some(if c.reason.is_empty() { c.kind.clone() } else { c.reason.clone() }),
                // Never empty: an API server before the go-openapi fix (1.20 among them) reads
                // "" in a custom object as null, and Karpenter's CRDs (not nullable, and the
                // NodePool's requiring a message) then refuse the whole status.
                message: Some(if c.message.is_empty() { format!("{} is {s}", c.kind) } else { c.message.clone() }),
                last_transition_time: Some(since),
                observed_generation: None,
            }
        })
        .collect()
}

/// The `status` object of a core NodeClaim status (conditions as [`conditions_object`]).
pub fn nodeclaim_status_object(
    status: &dovetail_core::cluster::NodeClaimStatus,
    previous: &[crd::Condition],
    now: &str,
) -> crd::NodeClaimStatus {
    // `Ready` is the root condition, as Karpenter's: true once launched, registered and
    // initialized.
    let mut all: Vec<_> = status.conditions.iter().filter(|c| c.kind != "Ready").cloned().collect();
    {
        let waiting: Vec<&str> = ["Launched", "Registered", "Initialized"]
            .into_iter()
            .filter(|k| !status.conditions.iter().any(|c| c.kind == *k && c.status))
            .collect();
        all.push(dovetail_core::cluster::Condition {
            kind: "Ready".into(),
            status: waiting.is_empty(),
            reason: if waiting.is_empty() { "Ready".into() } else { "AwaitingReconciliation".into() },
            message: if waiting.is_empty() { String::new() } else { format!("not yet {}", waiting.join(", ")) },
        });
    }
    let conditions = conditions_object(&all, previous, now);
    crd::NodeClaimStatus {
        node_name: status.node_name.clone(),
        provider_id: status.provider_id.clone(),
        image_id: None,
        capacity: quantities(&status.capacity),
        allocatable: quantities(&status.allocatable),
        last_pod_event_time: None,
        conditions: (!conditions.is_empty()).then_some(conditions),
    }
}

/// A NodePool's `status`: what its nodes hold (`resources`, `nodes` among them, as Karpenter's
/// counter writes it), and its conditions (as [`conditions_object`]).
pub fn nodepool_status_object(
    resources: &dovetail_core::resources::ResourceList,
    nodes: i64,
    conditions: &[dovetail_core::cluster::Condition],
    previous: &[crd::Condition],
    now: &str,
) -> crd::NodePoolStatus {
    let mut res = quantities(resources).unwrap_or_default();
    res.insert("nodes".into(), Quantity(nodes.to_string()));
    crd::NodePoolStatus {
        resources: Some(res),
        nodes: Some(nodes),
        conditions: Some(conditions_object(conditions, previous, now)),
    }
}

#[cfg(test)]
mod tests {
    use dovetail_core::requirements::{Operator, Requirement};

    use super::*;

    #[test]
    fn bounded_requirements_are_written_as_gte_lte() {
        let mut r = Requirements::new();
        r.add("gen", Requirement::new("gen", Operator::Gt, &["4".into()]).expect("integer"));
        r.add("gen", Requirement::new("gen", Operator::Lt, &["9".into()]).expect("integer"));
        r.add("zone", Requirement::is_in(["a", "b"]));
        let out = node_selector_requirements(&r);
        let ops: Vec<(&str, &str)> = out.iter().map(|x| (x.key.as_str(), x.operator.as_str())).collect();
        assert_eq!(ops, [("gen", "Gte"), ("gen", "Lte"), ("zone", "In")]);
        assert_eq!(out[0].values.as_deref(), Some(&["5".to_string()][..]));
    }

    #[test]
    fn a_nodeclaim_object_round_trips_through_core() {
        let mut reqs = Requirements::new();
        reqs.add("node.kubernetes.io/instance-type", Requirement::is_in(["m5.large", "c5.large"]));
        let spec = NodeClaimSpec {
            nodepool: "default".into(),
            labels: [("karpenter.sh/nodepool".to_string(), "default".to_string())].into(),
            requirements: reqs.clone(),
            requests: dovetail_core::resources::ResourceList::from_pairs([(
                dovetail_core::resources::ResourceName::Cpu,
                1500,
            )]),
            node_class: dovetail_core::nodepool::NodeClassRef::ec2("default"),
            ..NodeClaimSpec::default()
        };
        let mut obj = nodeclaim("default-abc", &spec, Some("uid-1"));
        obj.metadata.resource_version = Some("42".into());
        let back = nodeclaim_from_object(&obj).expect("converts");
        assert_eq!(back.name, "default-abc");
        assert_eq!(back.spec.nodepool, "default");
        assert_eq!(back.spec.requirements, reqs);
        assert_eq!(back.spec.requests, spec.requests);
        assert_eq!(back.resource_version, 42);
        assert_eq!(back.finalizers, vec!["karpenter.sh/termination".to_string()]);
    }

    #[test]
    fn a_condition_keeps_its_transition_time_while_its_status_holds() {
        use dovetail_core::cluster::{Condition, NodeClaimStatus};
        let status = NodeClaimStatus {
            conditions: vec![Condition::met("Launched"), Condition::met("Registered")],
            ..NodeClaimStatus::default()
        };
        let previous = vec![crd::Condition {
            type_: "Launched".into(),
            status: "True".into(),
            last_transition_time: Some("2026-01-01T00:00:00Z".into()),
            ..crd::Condition::default()
        }];
        let out = nodeclaim_status_object(&status, &previous, "2026-02-02T00:00:00Z");
        let cs = out.conditions.expect("conditions");
        assert_eq!(cs[0].last_transition_time.as_deref(), Some("2026-01-01T00:00:00Z"));
        assert_eq!(cs[1].last_transition_time.as_deref(), Some("2026-02-02T00:00:00Z"));
        assert_eq!(cs[1].reason.as_deref(), Some("Registered"), "a reason is required");
        assert_eq!(cs[1].message.as_deref(), Some("Registered is True"), "a message is required, and never empty");
    }
}
