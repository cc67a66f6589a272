//! EC2NodeClass settings that shape instance types (kubelet, root volume, instance store).

use std::collections::BTreeMap;

use dovetail_core::catalog::overhead::EvictionThreshold;
use dovetail_core::catalog::{InstanceStorePolicy, KubeletConfig, NodeClassSettings};
use dovetail_core::labels;
use dovetail_core::resources::{ResourceList, ResourceName};

use super::{ConversionError, Ctx, quantity};
use crate::crd::{EC2NodeClass, EC2NodeClassSpec};

fn reserved(
    ctx: &Ctx,
    field: &str,
    m: Option<&std::collections::BTreeMap<String, String>>,
) -> Result<ResourceList, ConversionError> {
    let mut out = ResourceList::new();
    for (k, v) in m.into_iter().flatten() {
        if !matches!(k.as_str(), "cpu" | "memory" | "ephemeral-storage" | "pid") {
            return Err(ctx.err(format!("{field}.{k}"), "supported keys are cpu, memory, ephemeral-storage and pid"));
        }
        if k == "pid" {
            continue;
        }
        let q = quantity(ctx, &format!("{field}.{k}"), v)?;
        let n = ResourceName::parse(k);
        out.set(n.clone(), n.amount_of(&q));
    }
    Ok(out)
}

fn threshold(ctx: &Ctx, field: &str, v: &str) -> Result<EvictionThreshold, ConversionError> {
    if let Some(p) = v.strip_suffix('%') {
        let p: f64 = p.parse().map_err(|_| ctx.err(field, format!("{v:?} is not a percentage")))?;
        if !(0.0..=100.0).contains(&p) {
            return Err(ctx.err(field, format!("{v:?} is not between 0% and 100%")));
        }
        return Ok(EvictionThreshold::Percent(p));
    }
    Ok(EvictionThreshold::Amount(quantity(ctx, field, v)?.value()))
}

/// Karpenter's validation of an EC2NodeClass as served by an API server: the rules its CRD
/// carries in CEL (and dovetail's generated CRDs carry too), checked here because a server older
/// than 1.25 drops them. `plan` and `simulate` read partial node classes (only what changes a
/// node's allocatable), so only the controller calls this. The messages are Karpenter's.
pub fn validate_nodeclass(nc: &EC2NodeClass) -> Result<(), ConversionError> {
    let name = nc.metadata.name.clone().unwrap_or_default();
    let ctx = Ctx::new(format!("EC2NodeClass {name:?}"));
    let spec = &nc.spec;
    match (&spec.role, &spec.instance_profile) {
        (Some(_), Some(_)) | (None, None) => {
            return Err(ctx.err("spec", "must specify exactly one of ['role', 'instanceProfile']"));
        }
        (Some(r), None) if r.is_empty() => return Err(ctx.err("spec.role", "role cannot be empty")),
        (None, Some(p)) if p.is_empty() => {
            return Err(ctx.err("spec.instanceProfile", "instanceProfile cannot be empty"));
        }
        _ => {}
    }
    ami_terms(&ctx, spec)?;
    let f = "spec.subnetSelectorTerms";
    if spec.subnet_selector_terms.is_empty() {
        return Err(ctx.err(f, "subnetSelectorTerms cannot be empty"));
    }
    for (i, t) in spec.subnet_selector_terms.iter().enumerate() {
        let f = format!("{f}[{i}]");
        // Karpenter's subnet terms have no `name`; its schema (and dovetail's) prunes one.
        match (&t.id, &t.tags) {
            (None, None) => return Err(ctx.err(f, "expected at least one, got none, ['tags', 'id']")),
            (Some(_), Some(_)) => {
                return Err(ctx.err(
                    f,
                    "'id' is mutually exclusive, cannot be set with a combination of other fields in a subnet selector term",
                ));
            }
            _ => tags(&ctx, &format!("{f}.tags"), t.tags.as_ref())?,
        }
    }
    let f = "spec.securityGroupSelectorTerms";
    if spec.security_group_selector_terms.is_empty() {
        return Err(ctx.err(f, "securityGroupSelectorTerms cannot be empty"));
    }
    for (i, t) in spec.security_group_selector_terms.iter().enumerate() {
        let f = format!("{f}[{i}]");
        let set = [t.tags.is_some(), t.id.is_some(), t.name.is_some()].iter().filter(|b| **b).count();
        if set == 0 {
            return Err(ctx.err(f, "expected at least one, got none, ['tags', 'id', 'name']"));
        }
        for (field, on) in [("id", t.id.is_some()), ("name", t.name.is_some())] {
            if on && set > 1 {
                return Err(ctx.err(
                    f,
                    format!(
                        "'{field}' is mutually exclusive, cannot be set with a combination of other fields in a security group selector term"
                    ),
                ));
            }
        }
        tags(&ctx, &format!("{f}.tags"), t.tags.as_ref())?;
    }
    for key in spec.tags.iter().flatten().map(|(k, _)| k) {
        let f = format!("spec.tags.{key}");
        if key.is_empty() {
            return Err(ctx.err("spec.tags", "empty tag keys aren't supported"));
        }
        let restricted =
            ["eks:eks-cluster-name", "karpenter.sh/nodepool", "karpenter.sh/nodeclaim", labels::EC2NODECLASS];
        if let Some(r) = restricted.iter().find(|r| key == *r) {
            return Err(ctx.err(f, format!("tag contains a restricted tag matching {r}")));
        }
        if key.starts_with("kubernetes.io/cluster") {
            return Err(ctx.err(f, "tag contains a restricted tag matching kubernetes.io/cluster/"));
        }
    }
    let mappings = spec.block_device_mappings.as_deref().unwrap_or_default();
    if mappings.iter().filter(|b| b.root_volume).count() > 1 {
        return Err(ctx.err("spec.blockDeviceMappings", "must have only one blockDeviceMappings with rootVolume"));
    }
    for (i, b) in mappings.iter().enumerate() {
        if let Some(ebs) = &b.ebs
            && ebs.snapshot_id.is_none()
            && ebs.volume_size.is_none()
        {
            return Err(
                ctx.err(format!("spec.blockDeviceMappings[{i}].ebs"), "snapshotID or volumeSize must be defined")
            );
        }
    }
    Ok(())
}

/// `amiSelectorTerms` and `amiFamily` as Karpenter's CRD rules check them.
fn ami_terms(ctx: &Ctx, spec: &EC2NodeClassSpec) -> Result<(), ConversionError> {
    let f = "spec.amiSelectorTerms";
    let terms = &spec.ami_selector_terms;
    if terms.is_empty() {
        return Err(ctx.err(f, "should have at least 1 items"));
    }
    let mut alias_family = None;
    for (i, t) in terms.iter().enumerate() {
        let f = format!("{f}[{i}]");
        let others = t.tags.is_some() || t.name.is_some() || t.owner.is_some();
        if t.tags.is_none() && t.id.is_none() && t.name.is_none() && t.alias.is_none() && t.ssm_parameter.is_none() {
            return Err(ctx.err(f, "expected at least one, got none, ['tags', 'id', 'name', 'alias', 'ssmParameter']"));
        }
        if t.id.is_some() && (t.alias.is_some() || others) {
            return Err(ctx.err(
                f,
                "'id' is mutually exclusive, cannot be set with a combination of other fields in amiSelectorTerms",
            ));
        }
        tags(ctx, &format!("{f}.tags"), t.tags.as_ref())?;
        let Some(alias) = &t.alias else { continue };
        if t.id.is_some() || others {
            return Err(ctx.err(
                f,
                "'alias' is mutually exclusive, cannot be set with a combination of other fields in amiSelectorTerms",
            ));
        }
        if terms.len() != 1 {
            return Err(
                ctx.err(f, "'alias' is mutually exclusive, cannot be set with a combination of other amiSelectorTerms")
            );
        }
        let f = format!("{f}.alias");
        let (family, version) = alias
            .split_once('@')
            .filter(|(fam, v)| !fam.is_empty() && !v.is_empty() && fam.chars().all(|c| c.is_ascii_alphanumeric()))
            .ok_or_else(|| ctx.err(&f, "'alias' is improperly formatted, must match the format 'family@version'"))?;
        let family_name = match family {
            "al2" => "AL2",
            "al2023" => "AL2023",
            "bottlerocket" => "Bottlerocket",
            "windows2019" => "Windows2019",
            "windows2022" => "Windows2022",
            "windows2025" => "Windows2025",
            _ => {
                return Err(ctx.err(
                    f,
                    "family is not supported, must be one of the following: 'al2', 'al2023', 'bottlerocket', 'windows2019', 'windows2022', 'windows2025'",
                ));
            }
        };
        if family.starts_with("windows") && version != "latest" {
            return Err(ctx.err(f, "windows families may only specify version 'latest'"));
        }
        alias_family = Some(family_name);
    }
    match (alias_family, spec.ami_family.as_deref()) {
        (None, None) => {
            Err(ctx.err("spec.amiFamily", "must specify amiFamily if amiSelectorTerms does not contain an alias"))
        }
        (Some(want), Some(got)) if got != want && got != "Custom" => Err(ctx.err(
            "spec.amiFamily",
            format!("if set, amiFamily must be '{want}' or 'Custom' when using an {want} alias"),
        )),
        _ => Ok(()),
    }
}

/// A selector term's tags: no empty key or value.
fn tags(ctx: &Ctx, field: &str, tags: Option<&BTreeMap<String, String>>) -> Result<(), ConversionError> {
    if tags.into_iter().flatten().any(|(k, v)| k.is_empty() || v.is_empty()) {
        return Err(ctx.err(field, "empty tag keys or values aren't supported"));
    }
    Ok(())
}

/// The settings of an EC2NodeClass that change its nodes' allocatable.
pub fn node_class_settings(nc: &EC2NodeClass) -> Result<NodeClassSettings, ConversionError> {
    let name = nc.metadata.name.clone().unwrap_or_default();
    let ctx = Ctx::new(format!("EC2NodeClass {name:?}"));
    let mut s = NodeClassSettings::default();
    if let Some(k) = &nc.spec.kubelet {
        let f = "spec.kubelet";
        let non_negative = |field: &str, v: Option<i32>| -> Result<Option<u32>, ConversionError> {
            v.map(|v| {
                u32::try_from(v).map_err(|_| ctx.err(format!("{f}.{field}"), format!("must not be negative, got {v}")))
            })
            .transpose()
        };
        s.kubelet = KubeletConfig {
            max_pods: non_negative("maxPods", k.max_pods)?,
            pods_per_core: non_negative("podsPerCore", k.pods_per_core)?,
            kube_reserved: reserved(&ctx, &format!("{f}.kubeReserved"), k.kube_reserved.as_ref())?,
            system_reserved: reserved(&ctx, &format!("{f}.systemReserved"), k.system_reserved.as_ref())?,
            eviction_memory: None,
            eviction_nodefs: None,
        };
        for (key, v) in k.eviction_hard.iter().flatten() {
            let field = format!("{f}.evictionHard.{key}");
            match key.as_str() {
                "memory.available" => s.kubelet.eviction_memory = Some(threshold(&ctx, &field, v)?),
                "nodefs.available" => s.kubelet.eviction_nodefs = Some(threshold(&ctx, &field, v)?),
                "nodefs.inodesFree" | "imagefs.available" | "imagefs.inodesFree" | "pid.available" => {}
                _ => return Err(ctx.err(field, "unsupported eviction signal")),
            }
        }
    }
    for (i, b) in nc.spec.block_device_mappings.iter().flatten().enumerate() {
        if b.root_volume
            && let Some(size) = b.ebs.as_ref().and_then(|e| e.volume_size.as_ref())
        {
            s.root_volume_bytes =
                quantity(&ctx, &format!("spec.blockDeviceMappings[{i}].ebs.volumeSize"), size)?.value();
        }
    }
    s.instance_store_policy = match nc.spec.instance_store_policy.as_deref() {
        None => None,
        Some("RAID0") => Some(InstanceStorePolicy::Raid0),
        Some(other) => {
            return Err(
                ctx.err("spec.instanceStorePolicy", format!("unknown policy {other:?}; the only policy is RAID0"))
            );
        }
    };
    if let Some(f) = &nc.spec.ami_family
        && !matches!(f.as_str(), "AL2023" | "AL2" | "Custom")
    {
        return Err(
            ctx.err("spec.amiFamily", format!("AMI family {f:?} is not supported yet (AL2023, AL2 and Custom are)"))
        );
    }
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The getting-started EC2NodeClass with `edit` applied to its spec (as YAML).
    fn class(edit: &str) -> EC2NodeClass {
        let mut v: serde_json::Value = serde_json::json!({
            "apiVersion": "karpenter.k8s.aws/v1", "kind": "EC2NodeClass", "metadata": {"name": "default"},
            "spec": {
                "role": "KarpenterNodeRole-demo",
                "amiSelectorTerms": [{"alias": "al2023@latest"}],
                "subnetSelectorTerms": [{"tags": {"karpenter.sh/discovery": "demo"}}],
                "securityGroupSelectorTerms": [{"tags": {"karpenter.sh/discovery": "demo"}}],
            }
        });
        let patch: serde_json::Value = serde_yaml::from_str(edit).expect("edit is YAML");
        for (k, val) in patch.as_object().into_iter().flatten() {
            if val.is_null() {
                v["spec"].as_object_mut().map(|m| m.remove(k));
            } else {
                v["spec"][k] = val.clone();
            }
        }
        serde_json::from_value(v).expect("an EC2NodeClass")
    }

    fn rejects(edit: &str, field: &str, message: &str) {
        let e = validate_nodeclass(&class(edit)).expect_err(edit);
        assert_eq!(e.object, "EC2NodeClass \"default\"");
        assert_eq!(e.field, field, "{edit}: {e}");
        assert!(e.message.contains(message), "{edit}: {e}");
    }

    #[test]
    fn the_getting_started_class_is_valid_and_each_karpenter_rule_names_its_field() {
        validate_nodeclass(&class("{}")).expect("getting-started is valid");
        validate_nodeclass(&class("{role: null, instanceProfile: p}")).expect("an instance profile instead");
        validate_nodeclass(&class("{amiSelectorTerms: [{id: ami-1}, {name: n, owner: o}], amiFamily: AL2023}"))
            .expect("ids and names with a family");
        rejects("{instanceProfile: p}", "spec", "exactly one of ['role', 'instanceProfile']");
        rejects("{role: null}", "spec", "exactly one of ['role', 'instanceProfile']");
        rejects("{role: ''}", "spec.role", "role cannot be empty");
        rejects("{amiSelectorTerms: []}", "spec.amiSelectorTerms", "at least 1");
        rejects("{amiSelectorTerms: [{}]}", "spec.amiSelectorTerms[0]", "expected at least one");
        rejects("{amiSelectorTerms: [{id: ami-1, name: n}]}", "spec.amiSelectorTerms[0]", "'id' is mutually exclusive");
        rejects(
            "{amiSelectorTerms: [{alias: al2023@latest, owner: o}]}",
            "spec.amiSelectorTerms[0]",
            "'alias' is mutually",
        );
        rejects(
            "{amiSelectorTerms: [{alias: al2023@latest}, {id: ami-1}]}",
            "spec.amiSelectorTerms[0]",
            "other amiSelectorTerms",
        );
        rejects("{amiSelectorTerms: [{alias: al2023}]}", "spec.amiSelectorTerms[0].alias", "family@version");
        rejects("{amiSelectorTerms: [{alias: ubuntu@1}]}", "spec.amiSelectorTerms[0].alias", "family is not supported");
        rejects(
            "{amiSelectorTerms: [{alias: windows2022@v1}]}",
            "spec.amiSelectorTerms[0].alias",
            "only specify version 'latest'",
        );
        rejects("{amiSelectorTerms: [{tags: {a: ''}}]}", "spec.amiSelectorTerms[0].tags", "empty tag keys or values");
        rejects("{amiSelectorTerms: [{id: ami-1}]}", "spec.amiFamily", "must specify amiFamily");
        rejects("{amiFamily: AL2}", "spec.amiFamily", "must be 'AL2023' or 'Custom'");
        validate_nodeclass(&class("{amiFamily: Custom}")).expect("Custom goes with any alias");
        rejects("{subnetSelectorTerms: []}", "spec.subnetSelectorTerms", "cannot be empty");
        rejects(
            "{subnetSelectorTerms: [{id: subnet-1, tags: {a: b}}]}",
            "spec.subnetSelectorTerms[0]",
            "'id' is mutually",
        );
        rejects("{securityGroupSelectorTerms: []}", "spec.securityGroupSelectorTerms", "cannot be empty");
        rejects("{securityGroupSelectorTerms: [{}]}", "spec.securityGroupSelectorTerms[0]", "expected at least one");
        rejects(
            "{securityGroupSelectorTerms: [{name: n, tags: {a: b}}]}",
            "spec.securityGroupSelectorTerms[0]",
            "'name' is mutually",
        );
        rejects(
            "{securityGroupSelectorTerms: [{id: sg-1, name: n}]}",
            "spec.securityGroupSelectorTerms[0]",
            "'id' is mutually",
        );
        rejects(
            "{tags: {kubernetes.io/cluster/demo: owned}}",
            "spec.tags.kubernetes.io/cluster/demo",
            "kubernetes.io/cluster/",
        );
        rejects("{tags: {karpenter.sh/nodeclaim: x}}", "spec.tags.karpenter.sh/nodeclaim", "karpenter.sh/nodeclaim");
        rejects(
            "{blockDeviceMappings: [{rootVolume: true, ebs: {volumeSize: 20Gi}}, {rootVolume: true, ebs: {volumeSize: 20Gi}}]}",
            "spec.blockDeviceMappings",
            "only one blockDeviceMappings with rootVolume",
        );
        rejects(
            "{blockDeviceMappings: [{ebs: {encrypted: true}}]}",
            "spec.blockDeviceMappings[0].ebs",
            "snapshotID or volumeSize",
        );
    }
}
