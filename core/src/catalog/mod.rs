//! The EC2 instance-type catalog: raw facts (shapes, zones, prices) loaded from JSON, and
//! their resolution into schedulable [`InstanceType`]s under a node class's kubelet
//! settings, with Karpenter's overhead model.
//!
//! The default catalog (us-east-1) is compiled into the binary from
//! `core/data/catalog-us-east-1.json`; `docs/catalog.md` documents the format so users can
//! supply another region's catalog.

mod instance_type;
pub mod overhead;

use serde::Deserialize;

pub use instance_type::{CapacityType, InstanceType, Offering, OfferingFilter};
pub use overhead::{DEFAULT_VM_MEMORY_OVERHEAD_PERCENT, InstanceStorePolicy, KubeletConfig, NodeClassSettings};

/// The format tag every catalog file carries.
pub const FORMAT: &str = "dovetail-catalog/v1";

const EMBEDDED_US_EAST_1: &str = include_str!("../../data/catalog-us-east-1.json");

/// Why a catalog could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum CatalogError {
    #[error("parsing catalog JSON: {0}")]
    Json(#[from] serde_json::Error),
    #[error("catalog format is {found:?}, expected {FORMAT:?}")]
    Format { found: String },
    #[error(
        "no catalog is built in for region {region:?} (only us-east-1); pass --catalog with a catalog for that region"
    )]
    UnknownRegion { region: String },
    #[error("instance type {name:?}: {reason}")]
    InstanceType { name: String, reason: String },
}

/// An availability zone.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
pub struct Zone {
    pub name: String,
    pub id: String,
}

/// A GPU model on an instance type.
#[derive(Clone, Debug, Deserialize, PartialEq)]
pub struct GpuInfo {
    pub name: String,
    pub manufacturer: String,
    pub count: u32,
    /// Per GPU.
    pub memory_mib: u64,
}

/// Neuron (Inferentia/Trainium) devices on an instance type.
#[derive(Clone, Debug, Deserialize, PartialEq)]
pub struct NeuronInfo {
    pub name: String,
    pub devices: u32,
    pub cores_per_device: u32,
}

/// The facts about one instance type, as the catalog file holds them.
#[derive(Clone, Debug, Deserialize, PartialEq)]
pub struct InstanceTypeInfo {
    pub name: String,
    pub vcpu: u32,
    pub memory_mib: u64,
    pub arch: String,
    #[serde(default)]
    pub cpu_manufacturer: Option<String>,
    #[serde(default)]
    pub sustained_clock_ghz: Option<f64>,
    #[serde(default)]
    pub hypervisor: Option<String>,
    #[serde(default)]
    pub bare_metal: bool,
    #[serde(default)]
    pub burstable: bool,
    /// ENIs on the default network card.
    pub enis: u32,
    pub ipv4_per_eni: u32,
    /// Branch ENIs for security groups per pod, when the type supports trunking.
    #[serde(default)]
    pub branch_enis: Option<u32>,
    #[serde(default)]
    pub efa: u32,
    #[serde(default)]
    pub local_nvme_gb: Option<u64>,
    /// Total instance-store size in GB (10^9 bytes), NVMe or not: node ephemeral storage
    /// under `instanceStorePolicy: RAID0`.
    #[serde(default)]
    pub local_storage_gb: Option<u64>,
    /// Baseline network bandwidth, `karpenter.k8s.aws/instance-network-bandwidth`.
    #[serde(default)]
    pub network_bandwidth_mbps: Option<u64>,
    /// Maximum EBS bandwidth, `karpenter.k8s.aws/instance-ebs-bandwidth`.
    #[serde(default)]
    pub ebs_bandwidth_mbps: Option<u64>,
    #[serde(default)]
    pub gpu: Option<GpuInfo>,
    #[serde(default)]
    pub neuron: Option<NeuronInfo>,
    /// `on-demand` and/or `spot`.
    pub usage_classes: Vec<String>,
    /// Zones offering the type.
    pub zones: Vec<String>,
    /// $/hour; a type without a price has no available offering of that capacity type.
    pub on_demand_price: Option<f64>,
    pub spot_price: Option<f64>,
}

/// A region's catalog.
#[derive(Clone, Debug, Deserialize)]
pub struct Catalog {
    pub format: String,
    pub region: String,
    pub zones: Vec<Zone>,
    pub instance_types: Vec<InstanceTypeInfo>,
}

impl Catalog {
    /// Parses a catalog file.
    pub fn from_json(s: &str) -> Result<Catalog, CatalogError> {
        let c: Catalog = serde_json::from_str(s)?;
        if c.format != FORMAT {
            return Err(CatalogError::Format { found: c.format });
        }
        for it in &c.instance_types {
            if it.vcpu == 0 || it.memory_mib == 0 {
                return Err(CatalogError::InstanceType {
                    name: it.name.clone(),
                    reason: "vcpu and memory_mib must be positive".into(),
                });
            }
        }
        Ok(c)
    }

    /// The catalog compiled into the binary for `region`.
    pub fn embedded(region: &str) -> Result<Catalog, CatalogError> {
        match region {
            "us-east-1" => Catalog::from_json(EMBEDDED_US_EAST_1),
            _ => Err(CatalogError::UnknownRegion { region: region.to_string() }),
        }
    }

    /// The zone id of a zone name.
    pub fn zone_id(&self, zone: &str) -> Option<&str> {
        self.zones.iter().find(|z| z.name == zone).map(|z| z.id.as_str())
    }

    /// Resolves every instance type under `settings`, with one offering per (zone,
    /// capacity type) the type is sold in. `zones` limits the zones (a node class's subnet
    /// zones); `None` means every zone of the region.
    pub fn instance_types(&self, settings: &NodeClassSettings, zones: Option<&[String]>) -> Vec<InstanceType> {
        self.instance_types.iter().map(|info| InstanceType::resolve(info, self, settings, zones)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn embedded_catalog_loads() {
        let c = Catalog::embedded("us-east-1").unwrap();
        assert_eq!(c.region, "us-east-1");
        assert!(c.instance_types.len() > 1300);
        assert_eq!(c.zone_id("us-east-1a"), Some("use1-az2"));
        assert!(matches!(Catalog::embedded("eu-west-1"), Err(CatalogError::UnknownRegion { .. })));
    }

    #[test]
    fn rejects_other_formats() {
        let err = Catalog::from_json(r#"{"format":"x","region":"r","zones":[],"instance_types":[]}"#);
        assert!(matches!(err, Err(CatalogError::Format { .. })));
    }
}
