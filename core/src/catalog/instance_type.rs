//! A schedulable instance type: its label domain, capacity, overhead, allocatable and
//! offerings, resolved from catalog facts as Karpenter's AWS provider resolves them.

use std::fmt;
use std::sync::Arc;

use crate::labels;
use crate::requirements::{Requirement, Requirements};
use crate::resources::{ResourceList, ResourceName};

use super::overhead::{ephemeral_storage, max_pods, memory_capacity, overhead};
use super::{Catalog, InstanceTypeInfo, NodeClassSettings};

/// `karpenter.sh/capacity-type`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum CapacityType {
    Spot,
    OnDemand,
    Reserved,
}

impl CapacityType {
    /// Every capacity type.
    pub const ALL: [CapacityType; 3] = [CapacityType::Spot, CapacityType::OnDemand, CapacityType::Reserved];

    /// The label value.
    pub fn as_str(&self) -> &'static str {
        match self {
            CapacityType::Spot => "spot",
            CapacityType::OnDemand => "on-demand",
            CapacityType::Reserved => "reserved",
        }
    }

    /// Parses a label value.
    pub fn parse(s: &str) -> Option<CapacityType> {
        Some(match s {
            "spot" => CapacityType::Spot,
            "on-demand" => CapacityType::OnDemand,
            "reserved" => CapacityType::Reserved,
            _ => return None,
        })
    }
}

impl fmt::Display for CapacityType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Where and how an instance type can be bought.
#[derive(Clone, Debug, PartialEq)]
pub struct Offering {
    pub zone: String,
    pub zone_id: String,
    /// The zone's position in the catalog (for fast filtering).
    pub zone_index: u8,
    pub capacity_type: CapacityType,
    /// $/hour.
    pub price: f64,
    /// False when the offering has no price or is marked unavailable (ICE).
    pub available: bool,
}

impl Offering {
    /// Whether the offering satisfies `reqs` on zone, zone id and capacity type
    /// (undefined keys allow everything, as Karpenter's offering compatibility check).
    pub fn compatible(&self, reqs: &Requirements) -> bool {
        reqs.get(labels::ZONE).has(&self.zone)
            && reqs.get(labels::CAPACITY_TYPE).has(self.capacity_type.as_str())
            && reqs.get(labels::ZONE_ID).has(&self.zone_id)
    }
}

/// The offering-relevant part of some requirements (zone, zone id, capacity type),
/// extracted once so that checking many offerings does not look the keys up each time.
#[derive(Clone, Debug)]
pub struct OfferingFilter<'r> {
    zone: &'r Requirement,
    zone_id: &'r Requirement,
    /// Accepted capacity types: spot, on-demand, reserved.
    capacity_types: [bool; 3],
    /// Per zone index, two bits: known, accepted.
    zones: std::cell::Cell<u64>,
}

impl<'r> OfferingFilter<'r> {
    /// The filter of `reqs`.
    pub fn new(reqs: &'r Requirements) -> Self {
        let ct = reqs.get(labels::CAPACITY_TYPE);
        OfferingFilter {
            zone: reqs.get(labels::ZONE),
            zone_id: reqs.get(labels::ZONE_ID),
            capacity_types: [ct.has("spot"), ct.has("on-demand"), ct.has("reserved")],
            zones: std::cell::Cell::new(0),
        }
    }

    /// Whether the offering is available and compatible.
    pub fn accepts(&self, o: &Offering) -> bool {
        if !o.available {
            return false;
        }
        let ct = match o.capacity_type {
            CapacityType::Spot => 0,
            CapacityType::OnDemand => 1,
            CapacityType::Reserved => 2,
        };
        if !self.capacity_types[ct] {
            return false;
        }
        let i = u64::from(o.zone_index.min(31)) * 2;
        let bits = self.zones.get();
        if bits >> i & 1 == 1 {
            return bits >> (i + 1) & 1 == 1;
        }
        let ok = self.zone.has(&o.zone) && self.zone_id.has(&o.zone_id);
        if o.zone_index < 32 {
            self.zones.set(bits | 1 << i | u64::from(ok) << (i + 1));
        }
        ok
    }
}

/// A schedulable instance type.
#[derive(Clone, Debug, PartialEq)]
pub struct InstanceType {
    pub name: String,
    /// The label domain: one value for most keys, every offered zone and capacity type.
    /// Shared: a copy of the type that differs in its offerings (the ICE marks taken out)
    /// shares it.
    pub requirements: Arc<Requirements>,
    pub capacity: ResourceList,
    /// kube-reserved + system-reserved + eviction threshold.
    pub overhead: ResourceList,
    /// `capacity - overhead`.
    pub allocatable: ResourceList,
    pub offerings: Vec<Offering>,
    /// A metal size or a GPU/accelerator type, avoided unless a pod needs it.
    pub exotic: bool,
}

/// Splits a type name with Karpenter's `(^[a-z]+)(\-[0-9]+tb)?([0-9]+).*\.` into category and
/// generation.
pub fn category_and_generation(name: &str) -> Option<(&str, &str)> {
    let dot = name.find('.')?;
    let b = name.as_bytes();
    let cat_end = b.iter().position(|c| !c.is_ascii_lowercase()).unwrap_or(b.len());
    if cat_end == 0 || cat_end >= dot {
        return None;
    }
    let mut i = cat_end;
    // optional "-<digits>tb"
    if b[i] == b'-' {
        let mut j = i + 1;
        while j < b.len() && b[j].is_ascii_digit() {
            j += 1;
        }
        if j > i + 1 && name[j..].starts_with("tb") {
            i = j + 2;
        }
    }
    let gen_start = i;
    while i < b.len() && b[i].is_ascii_digit() {
        i += 1;
    }
    if i == gen_start || i > dot {
        return None;
    }
    Some((&name[..cat_end], &name[gen_start..i]))
}

fn kebab(s: &str) -> String {
    s.to_lowercase().replace(' ', "-")
}

impl InstanceType {
    /// Resolves catalog facts under a node class's settings, limited to `zones` if given.
    pub fn resolve(
        info: &InstanceTypeInfo,
        catalog: &Catalog,
        settings: &NodeClassSettings,
        zones: Option<&[String]>,
    ) -> InstanceType {
        let available_zones: Vec<&String> =
            info.zones.iter().filter(|z| zones.is_none_or(|allowed| allowed.contains(z))).collect();
        let mut offerings = Vec::new();
        for z in &available_zones {
            let zone_id = catalog.zone_id(z).unwrap_or_default().to_string();
            let zone_index =
                catalog.zones.iter().position(|c| &c.name == *z).unwrap_or(u8::MAX as usize).min(u8::MAX as usize)
                    as u8;
            for (ct, price) in [(CapacityType::Spot, info.spot_price), (CapacityType::OnDemand, info.on_demand_price)] {
                if !info.usage_classes.iter().any(|u| u == ct.as_str()) {
                    continue;
                }
                offerings.push(Offering {
                    zone: (*z).clone(),
                    zone_id: zone_id.clone(),
                    zone_index,
                    capacity_type: ct,
                    price: price.unwrap_or(f64::MAX),
                    available: price.is_some(),
                });
            }
        }

        let mut r = Requirements::new();
        let is = |v: &str| Requirement::is_in([v]);
        let none = Requirement::does_not_exist;
        r.add(labels::INSTANCE_TYPE, is(&info.name));
        r.add(labels::ARCH, is(&info.arch));
        r.add(labels::OS, is("linux"));
        r.add(labels::ZONE, Requirement::is_in(available_zones.iter().map(|z| z.as_str())));
        r.add(labels::REGION, is(&catalog.region));
        r.add(labels::WINDOWS_BUILD, none());
        let cts: Vec<&str> =
            info.usage_classes.iter().map(String::as_str).filter(|u| *u == "spot" || *u == "on-demand").collect();
        r.add(labels::CAPACITY_TYPE, Requirement::is_in(cts));
        r.add(labels::INSTANCE_CPU, is(&info.vcpu.to_string()));
        r.add(
            labels::INSTANCE_CPU_MANUFACTURER,
            info.cpu_manufacturer.as_deref().map(|m| is(&kebab(m))).unwrap_or_else(none),
        );
        r.add(
            labels::INSTANCE_CPU_SUSTAINED_CLOCK,
            info.sustained_clock_ghz.map(|g| is(&((g * 1000.0).round() as i64).to_string())).unwrap_or_else(none),
        );
        r.add(labels::INSTANCE_MEMORY, is(&info.memory_mib.to_string()));
        let mbps = |v: Option<u64>| v.map(|b| is(&b.to_string())).unwrap_or_else(none);
        r.add(labels::INSTANCE_EBS_BANDWIDTH, mbps(info.ebs_bandwidth_mbps));
        r.add(labels::INSTANCE_NETWORK_BANDWIDTH, mbps(info.network_bandwidth_mbps));
        let (family, size) = info.name.split_once('.').unwrap_or((&info.name, ""));
        match category_and_generation(&info.name) {
            Some((c, g)) => {
                r.add(labels::INSTANCE_CATEGORY, is(c));
                r.add(labels::INSTANCE_GENERATION, is(g));
            }
            None => {
                r.add(labels::INSTANCE_CATEGORY, none());
                r.add(labels::INSTANCE_GENERATION, none());
            }
        }
        r.add(labels::INSTANCE_FAMILY, is(family));
        r.add(labels::INSTANCE_SIZE, is(size));
        r.add(labels::INSTANCE_CAPABILITY_FLEX, is(if family.contains("-flex") { "true" } else { "false" }));
        r.add(labels::INSTANCE_LOCAL_NVME, info.local_nvme_gb.map(|g| is(&g.to_string())).unwrap_or_else(none));
        match &info.gpu {
            Some(g) => {
                r.add(labels::INSTANCE_GPU_NAME, is(&kebab(&g.name)));
                r.add(labels::INSTANCE_GPU_MANUFACTURER, is(&kebab(&g.manufacturer)));
                r.add(labels::INSTANCE_GPU_COUNT, is(&g.count.to_string()));
                r.add(labels::INSTANCE_GPU_MEMORY, is(&g.memory_mib.to_string()));
            }
            None => {
                for k in [
                    labels::INSTANCE_GPU_NAME,
                    labels::INSTANCE_GPU_MANUFACTURER,
                    labels::INSTANCE_GPU_COUNT,
                    labels::INSTANCE_GPU_MEMORY,
                ] {
                    r.add(k, none());
                }
            }
        }
        match &info.neuron {
            Some(n) => {
                r.add(labels::INSTANCE_ACCELERATOR_NAME, is(&kebab(&n.name)));
                r.add(labels::INSTANCE_ACCELERATOR_MANUFACTURER, is("aws"));
                r.add(labels::INSTANCE_ACCELERATOR_COUNT, is(&n.devices.to_string()));
            }
            None => {
                for k in [
                    labels::INSTANCE_ACCELERATOR_NAME,
                    labels::INSTANCE_ACCELERATOR_MANUFACTURER,
                    labels::INSTANCE_ACCELERATOR_COUNT,
                ] {
                    r.add(k, none());
                }
            }
        }
        r.add(labels::INSTANCE_HYPERVISOR, info.hypervisor.as_deref().map(is).unwrap_or_else(none));
        r.add(labels::INSTANCE_ENCRYPTION_IN_TRANSIT, none());
        r.add(labels::NITRO_SANDBOX, none());
        r.add(labels::INSTANCE_TENANCY, Requirement::is_in(["default", "dedicated"]));
        let zone_ids: Vec<&str> = available_zones.iter().filter_map(|z| catalog.zone_id(z)).collect();
        if !zone_ids.is_empty() {
            r.add(labels::ZONE_ID, Requirement::is_in(zone_ids));
        }
        r.add(labels::CAPACITY_RESERVATION_ID, none());
        r.add(labels::CAPACITY_RESERVATION_TYPE, none());
        r.add(labels::CAPACITY_RESERVATION_INTERRUPTIBLE, none());

        let mem = memory_capacity(info, settings);
        let storage = ephemeral_storage(info, settings);
        let mut capacity = ResourceList::from_pairs([
            (ResourceName::Cpu, info.vcpu as i64 * 1000),
            (ResourceName::Memory, mem),
            (ResourceName::EphemeralStorage, storage),
            (ResourceName::Pods, max_pods(info, settings)),
        ]);
        let mut extended = |name: ResourceName, n: i64| {
            if n > 0 {
                capacity.set(name, n);
            }
        };
        extended(ResourceName::AwsPodEni, info.branch_enis.unwrap_or(0) as i64);
        if let Some(g) = &info.gpu {
            let name = match g.manufacturer.as_str() {
                "NVIDIA" => Some(ResourceName::NvidiaGpu),
                "AMD" => Some(ResourceName::AmdGpu),
                "Habana" => Some(ResourceName::HabanaGaudi),
                _ => None,
            };
            if let Some(name) = name {
                extended(name, g.count as i64);
            }
        }
        if let Some(n) = &info.neuron {
            extended(ResourceName::AwsNeuron, n.devices as i64);
            extended(ResourceName::AwsNeuronCore, (n.devices * n.cores_per_device) as i64);
        }
        extended(ResourceName::Efa, info.efa as i64);
        let overhead = overhead(info, settings, mem, storage);
        let allocatable = capacity.subtracted(&overhead);
        let exotic = size.contains("metal") || capacity.iter().any(|(n, v)| n.is_exotic() && v > 0);
        InstanceType {
            name: info.name.clone(),
            requirements: Arc::new(r),
            capacity,
            overhead,
            allocatable,
            offerings,
            exotic,
        }
    }

    /// Whether any offering is available and compatible with `reqs`.
    pub fn has_compatible_offering(&self, reqs: &Requirements) -> bool {
        let f = OfferingFilter::new(reqs);
        self.offerings.iter().any(|o| f.accepts(o))
    }

    /// The price of the cheapest offering the filter accepts, `f64::MAX` if none.
    pub fn cheapest_price_with(&self, f: &OfferingFilter<'_>) -> f64 {
        self.offerings.iter().filter(|o| f.accepts(o)).map(|o| o.price).fold(f64::MAX, f64::min)
    }

    /// The cheapest available offering compatible with `reqs`.
    pub fn cheapest_offering(&self, reqs: &Requirements) -> Option<&Offering> {
        self.offerings.iter().filter(|o| o.available && o.compatible(reqs)).min_by(|a, b| a.price.total_cmp(&b.price))
    }

    /// The price of the cheapest compatible available offering, `f64::MAX` if none
    /// (Karpenter's `OrderByPrice` key).
    pub fn cheapest_price(&self, reqs: &Requirements) -> f64 {
        self.cheapest_offering(reqs).map(|o| o.price).unwrap_or(f64::MAX)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalog::Catalog;

    fn resolve(name: &str) -> InstanceType {
        let c = Catalog::embedded("us-east-1").unwrap();
        let info = c.instance_types.iter().find(|t| t.name == name).unwrap();
        InstanceType::resolve(info, &c, &NodeClassSettings::default(), None)
    }

    #[test]
    fn category_regex() {
        assert_eq!(category_and_generation("m5.large"), Some(("m", "5")));
        assert_eq!(category_and_generation("c7gn.16xlarge"), Some(("c", "7")));
        assert_eq!(category_and_generation("u-6tb1.56xlarge"), Some(("u", "1")));
        assert_eq!(category_and_generation("inf2.xlarge"), Some(("inf", "2")));
        assert_eq!(category_and_generation("mac-m4.metal"), None);
        assert_eq!(category_and_generation("x"), None);
    }

    #[test]
    fn allocatable_matches_the_data_estimate() {
        // The data README estimates allocatable with the same formulas (without daemonsets).
        let c = Catalog::embedded("us-east-1").unwrap();
        let raw: serde_json::Value =
            serde_json::from_str(include_str!("../../tests/data/allocatable-samples.json")).unwrap();
        for (name, v) in raw.as_object().unwrap() {
            let info = c.instance_types.iter().find(|t| &t.name == name).unwrap();
            let it = InstanceType::resolve(info, &c, &NodeClassSettings::default(), None);
            assert_eq!(it.allocatable.get(&ResourceName::Cpu), v["cpu_m"].as_i64().unwrap(), "{name} cpu");
            assert_eq!(
                it.allocatable.get(&ResourceName::Memory),
                v["memory_mib"].as_i64().unwrap() * 1024 * 1024,
                "{name} memory"
            );
        }
    }

    #[test]
    fn labels_and_offerings() {
        let it = resolve("g5.xlarge");
        assert!(it.exotic);
        assert!(it.requirements.get(labels::INSTANCE_GPU_NAME).has("a10g"));
        assert!(it.requirements.get(labels::INSTANCE_CATEGORY).has("g"));
        assert_eq!(it.capacity.get(&ResourceName::NvidiaGpu), 1);
        let m = resolve("m5.large");
        assert!(!m.exotic);
        assert!(m.requirements.get(labels::INSTANCE_GENERATION).has("5"));
        assert!(m.requirements.get(labels::CAPACITY_TYPE).has("spot"));
        let spot = m.offerings.iter().find(|o| o.capacity_type == CapacityType::Spot).unwrap();
        let od = m.offerings.iter().find(|o| o.capacity_type == CapacityType::OnDemand).unwrap();
        assert!(spot.price < od.price);
        assert!(resolve("m5.metal").exotic);
    }
}
