//! EC2NodeClass settings that shape instance types (kubelet, root volume, instance store).

use dovetail_core::catalog::overhead::EvictionThreshold;
use dovetail_core::catalog::{InstanceStorePolicy, KubeletConfig, NodeClassSettings};
use dovetail_core::resources::{ResourceList, ResourceName};

use super::{ConversionError, Ctx, quantity};
use crate::crd::EC2NodeClass;

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
