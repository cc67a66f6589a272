//! Karpenter's node overhead model (AWS provider, `types.go`): VM memory overhead,
//! kube-reserved, system-reserved, eviction thresholds and maxPods.

use crate::resources::{ResourceList, ResourceName};

use super::InstanceTypeInfo;

/// Karpenter's default `VM_MEMORY_OVERHEAD_PERCENT`.
pub const DEFAULT_VM_MEMORY_OVERHEAD_PERCENT: f64 = 0.075;

const MIB: i64 = 1024 * 1024;
const GIB: i64 = 1024 * MIB;

/// A hard eviction threshold: an absolute amount or a percentage of capacity.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum EvictionThreshold {
    Amount(i64),
    Percent(f64),
}

/// The kubelet settings of an `EC2NodeClass` that change a node's allocatable.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct KubeletConfig {
    pub max_pods: Option<u32>,
    pub pods_per_core: Option<u32>,
    /// Overrides per resource of the computed kube-reserved.
    pub kube_reserved: ResourceList,
    pub system_reserved: ResourceList,
    /// `memory.available` threshold.
    pub eviction_memory: Option<EvictionThreshold>,
    /// `nodefs.available` threshold.
    pub eviction_nodefs: Option<EvictionThreshold>,
}

/// `EC2NodeClass.spec.instanceStorePolicy`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InstanceStorePolicy {
    /// The instance-store disks are striped into one array that holds the node's
    /// ephemeral storage (kubelet and container images) instead of the root volume.
    Raid0,
}

/// Everything about a node class that shapes its instance types.
#[derive(Clone, Debug, PartialEq)]
pub struct NodeClassSettings {
    pub kubelet: KubeletConfig,
    /// Root volume size in bytes; AL2023's default is 20Gi.
    pub root_volume_bytes: i64,
    /// With RAID0, a type with instance storage gets its total as ephemeral storage.
    pub instance_store_policy: Option<InstanceStorePolicy>,
    pub vm_memory_overhead_percent: f64,
    /// ENIs reserved for other uses (`RESERVED_ENIS`).
    pub reserved_enis: u32,
}

impl Default for NodeClassSettings {
    fn default() -> Self {
        NodeClassSettings {
            kubelet: KubeletConfig::default(),
            root_volume_bytes: 20 * GIB,
            instance_store_policy: None,
            vm_memory_overhead_percent: DEFAULT_VM_MEMORY_OVERHEAD_PERCENT,
            reserved_enis: 0,
        }
    }
}

/// The node's ephemeral-storage capacity in bytes: the instance store's total (GB are
/// 10^9 bytes, as Karpenter's `%dG`) under RAID0 when the type has one, else the root volume.
pub fn ephemeral_storage(info: &InstanceTypeInfo, s: &NodeClassSettings) -> i64 {
    match (s.instance_store_policy, info.local_storage_gb) {
        (Some(InstanceStorePolicy::Raid0), Some(gb)) if gb > 0 => gb as i64 * 1_000_000_000,
        _ => s.root_volume_bytes,
    }
}

/// `ENIs × (IPv4 per ENI − 1) + 2`, after reserved ENIs.
pub fn eni_limited_pods(info: &InstanceTypeInfo, reserved_enis: u32) -> i64 {
    let usable = info.enis.saturating_sub(reserved_enis) as i64;
    if usable == 0 {
        return 0;
    }
    usable * (info.ipv4_per_eni as i64 - 1).max(0) + 2
}

/// maxPods: the kubelet setting, else ENI-limited density, capped by podsPerCore.
pub fn max_pods(info: &InstanceTypeInfo, s: &NodeClassSettings) -> i64 {
    let mut count = match s.kubelet.max_pods {
        Some(n) => n as i64,
        None => eni_limited_pods(info, s.reserved_enis),
    };
    if let Some(ppc) = s.kubelet.pods_per_core.filter(|p| *p > 0) {
        count = count.min(ppc as i64 * info.vcpu as i64);
    }
    count
}

/// Memory capacity in bytes: physical memory (less 64 MiB on arm64) minus the VM overhead
/// percentage, rounded up to whole MiB.
pub fn memory_capacity(info: &InstanceTypeInfo, s: &NodeClassSettings) -> i64 {
    let mut mib = info.memory_mib as i64;
    if info.arch == "arm64" {
        mib -= 64;
    }
    let overhead_mib = ((mib * MIB) as f64 * s.vm_memory_overhead_percent / MIB as f64).ceil() as i64;
    (mib - overhead_mib) * MIB
}

/// kube-reserved CPU in millicores: 6% of the first core, 1% of the second, 0.5% of cores
/// 3-4 and 0.25% of every core above 4.
pub fn kube_reserved_cpu_milli(vcpu: u32) -> i64 {
    let cpu = vcpu as i64 * 1000;
    let tiers = [(0i64, 1000i64, 0.06), (1000, 2000, 0.01), (2000, 4000, 0.005), (4000, 1 << 31, 0.0025)];
    let mut total = 0;
    for (start, end, pct) in tiers {
        if cpu >= start {
            let r = if cpu < end { cpu - start } else { end - start };
            total += (r as f64 * pct) as i64;
        }
    }
    total
}

/// The node overhead (kube-reserved + system-reserved + eviction threshold); the
/// `nodefs.available` threshold is a share of `storage`, the node's ephemeral storage.
pub fn overhead(info: &InstanceTypeInfo, s: &NodeClassSettings, memory_capacity: i64, storage: i64) -> ResourceList {
    // AL2023 sizes kube-reserved memory by ENI-limited pods, whatever maxPods says.
    let pods_for_memory = eni_limited_pods(info, 0);
    let mut kube = ResourceList::from_pairs([
        (ResourceName::Cpu, kube_reserved_cpu_milli(info.vcpu)),
        (ResourceName::Memory, (11 * pods_for_memory + 255) * MIB),
        (ResourceName::EphemeralStorage, GIB),
    ]);
    for (n, v) in s.kubelet.kube_reserved.iter() {
        kube.set(n.clone(), v);
    }
    let eviction_amount = |t: Option<EvictionThreshold>, capacity: i64, default: i64| match t {
        None => default,
        Some(EvictionThreshold::Amount(a)) => a,
        Some(EvictionThreshold::Percent(p)) => {
            let p = if p >= 100.0 { 0.0 } else { p };
            (capacity as f64 / 100.0 * p).ceil() as i64
        }
    };
    let eviction = ResourceList::from_pairs([
        (ResourceName::Memory, eviction_amount(s.kubelet.eviction_memory, memory_capacity, 100 * MIB)),
        (
            ResourceName::EphemeralStorage,
            eviction_amount(s.kubelet.eviction_nodefs, storage, (storage as f64 / 100.0 * 10.0).ceil() as i64),
        ),
    ]);
    let mut total = kube;
    total.add(&s.kubelet.system_reserved);
    total.add(&eviction);
    total
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalog::Catalog;

    fn info(name: &str) -> InstanceTypeInfo {
        let c = Catalog::embedded("us-east-1").unwrap();
        c.instance_types.into_iter().find(|t| t.name == name).unwrap()
    }

    #[test]
    fn cpu_tiers() {
        assert_eq!(kube_reserved_cpu_milli(1), 60);
        assert_eq!(kube_reserved_cpu_milli(2), 70);
        assert_eq!(kube_reserved_cpu_milli(4), 80);
        assert_eq!(kube_reserved_cpu_milli(8), 90);
        assert_eq!(kube_reserved_cpu_milli(96), 310);
    }

    #[test]
    fn eni_limited_pods_match_the_data_readme() {
        assert_eq!(eni_limited_pods(&info("m5.large"), 0), 29);
        assert_eq!(eni_limited_pods(&info("c7g.16xlarge"), 0), 737);
        assert_eq!(eni_limited_pods(&info("p5.48xlarge"), 0), 100);
    }

    #[test]
    fn pods_per_core_caps_max_pods() {
        let s = NodeClassSettings {
            kubelet: KubeletConfig { pods_per_core: Some(4), ..Default::default() },
            ..Default::default()
        };
        assert_eq!(max_pods(&info("m5.large"), &s), 8);
        let s = NodeClassSettings {
            kubelet: KubeletConfig { max_pods: Some(110), ..Default::default() },
            ..Default::default()
        };
        assert_eq!(max_pods(&info("m5.large"), &s), 110);
    }

    #[test]
    fn memory_capacity_subtracts_vm_overhead() {
        // 8192 MiB - ceil(8192 * 0.075) = 8192 - 615 = 7577 MiB
        assert_eq!(memory_capacity(&info("m5.large"), &NodeClassSettings::default()), 7577 * MIB);
    }
}
