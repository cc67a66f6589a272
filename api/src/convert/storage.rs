//! PersistentVolumeClaims, PersistentVolumes and StorageClasses, as volume topology reads them.

use dovetail_core::cluster::VolumeClaim;
use dovetail_core::requirements::{Requirement, Requirements};
use k8s_openapi::api::core::v1 as core;
use k8s_openapi::api::storage::v1::StorageClass;

use super::pod::node_selector_term;
use super::{ConversionError, Ctx};

/// A claim: the volume it is bound to and its class.
pub fn volume_claim(pvc: &core::PersistentVolumeClaim) -> VolumeClaim {
    let spec = pvc.spec.as_ref();
    VolumeClaim {
        volume_name: spec.and_then(|s| s.volume_name.clone()).filter(|v| !v.is_empty()),
        storage_class: spec.and_then(|s| s.storage_class_name.clone()),
    }
}

/// A volume's node affinity: the terms of `spec.nodeAffinity.required`, any one of which
/// must hold (none: the volume is reachable from every node). A local or hostPath volume's
/// hostname is left out, as Karpenter leaves it out: the pod's next node is a new one.
pub fn volume_topology(pv: &core::PersistentVolume) -> Result<Vec<Requirements>, ConversionError> {
    let ctx = Ctx::new(format!("PersistentVolume {}", pv.metadata.name.as_deref().unwrap_or_default()));
    let spec = pv.spec.as_ref();
    let on_a_node = spec.is_some_and(|s| s.local.is_some() || s.host_path.is_some());
    let terms = spec
        .and_then(|s| s.node_affinity.as_ref())
        .and_then(|a| a.required.as_ref())
        .map(|r| r.node_selector_terms.as_slice())
        .unwrap_or_default();
    let mut out = Vec::new();
    for (i, t) in terms.iter().enumerate() {
        let (mut reqs, _) = node_selector_term(&ctx, &format!("spec.nodeAffinity.required.nodeSelectorTerms[{i}]"), t)?;
        if on_a_node {
            reqs.remove(dovetail_core::labels::HOSTNAME);
        }
        out.push(reqs);
    }
    Ok(out)
}

/// A class's `allowedTopologies`: any one term must hold where its volumes are created
/// (none: anywhere).
pub fn class_topology(sc: &StorageClass) -> Result<Vec<Requirements>, ConversionError> {
    let ctx = Ctx::new(format!("StorageClass {}", sc.metadata.name.as_deref().unwrap_or_default()));
    let mut out = Vec::new();
    for (i, t) in sc.allowed_topologies.iter().flatten().enumerate() {
        let mut reqs = Requirements::new();
        for (j, e) in t.match_label_expressions.iter().flatten().enumerate() {
            if e.key.is_empty() || e.values.is_empty() {
                return Err(ctx.err(
                    format!("allowedTopologies[{i}].matchLabelExpressions[{j}]"),
                    "needs a key and at least one value",
                ));
            }
            reqs.add(&e.key, Requirement::is_in(e.values.iter().map(String::as_str)));
        }
        out.push(reqs);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_local_volume_pins_its_node_and_a_class_its_zones() {
        let pv: core::PersistentVolume = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "pv-1"},
            "spec": {"nodeAffinity": {"required": {"nodeSelectorTerms": [
                {"matchExpressions": [{"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["us-west-2a"]}]},
                {"matchExpressions": [{"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["us-west-2b"]}]}
            ]}}}
        }))
        .expect("a PersistentVolume");
        let terms = volume_topology(&pv).expect("valid");
        assert_eq!(terms.len(), 2);
        assert_eq!(terms[1].get("topology.kubernetes.io/zone").any().as_deref(), Some("us-west-2b"));

        let sc: StorageClass = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "gp3"}, "provisioner": "ebs.csi.aws.com",
            "allowedTopologies": [{"matchLabelExpressions": [{"key": "topology.ebs.csi.aws.com/zone", "values": ["us-west-2c"]}]}]
        }))
        .expect("a StorageClass");
        let terms = class_topology(&sc).expect("valid");
        assert_eq!(terms.len(), 1);
        assert_eq!(terms[0].get("topology.kubernetes.io/zone").any().as_deref(), Some("us-west-2c"));

        let bad: StorageClass = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "bad"}, "provisioner": "x",
            "allowedTopologies": [{"matchLabelExpressions": [{"key": "zone", "values": []}]}]
        }))
        .expect("a StorageClass");
        let e = class_topology(&bad).expect_err("no values");
        assert_eq!(e.field, "allowedTopologies[0].matchLabelExpressions[0]");
    }

    #[test]
    fn a_local_volume_does_not_pin_its_old_hostname() {
        let pv = |source: serde_json::Value| -> core::PersistentVolume {
            let mut spec = serde_json::json!({"nodeAffinity": {"required": {"nodeSelectorTerms": [
                {"matchExpressions": [
                    {"key": "kubernetes.io/hostname", "operator": "In", "values": ["ip-10-0-0-1"]},
                    {"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["us-west-2a"]}
                ]}
            ]}}});
            if let (Some(spec), Some(source)) = (spec.as_object_mut(), source.as_object()) {
                spec.extend(source.clone());
            }
            serde_json::from_value(serde_json::json!({"metadata": {"name": "pv"}, "spec": spec})).expect("a PV")
        };
        for source in
            [serde_json::json!({"local": {"path": "/mnt/disk"}}), serde_json::json!({"hostPath": {"path": "/data"}})]
        {
            let terms = volume_topology(&pv(source.clone())).expect("valid");
            assert!(!terms[0].has("kubernetes.io/hostname"), "{source}: the hostname is dropped");
            assert_eq!(terms[0].get("topology.kubernetes.io/zone").any().as_deref(), Some("us-west-2a"), "{source}");
        }
        let csi =
            volume_topology(&pv(serde_json::json!({"csi": {"driver": "ebs.csi.aws.com", "volumeHandle": "vol-1"}})))
                .expect("valid");
        assert!(csi[0].has("kubernetes.io/hostname"), "any other volume keeps its hostname");
    }
}
