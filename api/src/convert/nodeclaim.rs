//! Core NodeClaim specs into `karpenter.sh/v1` NodeClaim objects.

use std::collections::BTreeMap;

use dovetail_core::nodepool::NodeClaimSpec;
use dovetail_core::requirements::Requirements;
use k8s_openapi::api::core::v1::Taint as K8sTaint;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};

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
}
