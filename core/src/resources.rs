//! Resource names and resource lists (requests, allocatable, capacity, limits).
//!
//! A [`ResourceList`] is a sparse, sorted list of `(name, amount)`; a name that is absent
//! means "not mentioned", which matters for limits (an absent limit is no limit) and for
//! taking the minimum over daemon overhead groups, as in Karpenter. Amounts are integers in
//! each resource's canonical unit: millicores for `cpu`, whole units (bytes, pods, devices)
//! for everything else, rounded up from the quantity as Kubernetes rounds.

use std::fmt;
use std::sync::Arc;

use crate::quantity::{Format, Quantity};

/// A resource name. Well-known names are variants so comparisons are cheap.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ResourceName {
    Cpu,
    Memory,
    Pods,
    EphemeralStorage,
    /// `nodes`: only meaningful in NodePool limits; every node counts one.
    Nodes,
    NvidiaGpu,
    AmdGpu,
    AwsNeuron,
    AwsNeuronCore,
    HabanaGaudi,
    AwsPodEni,
    Efa,
    /// Any other (extended) resource, by its full name.
    Other(Arc<str>),
}

impl ResourceName {
    /// The resource's Kubernetes name.
    pub fn as_str(&self) -> &str {
        match self {
            ResourceName::Cpu => "cpu",
            ResourceName::Memory => "memory",
            ResourceName::Pods => "pods",
            ResourceName::EphemeralStorage => "ephemeral-storage",
            ResourceName::Nodes => "nodes",
            ResourceName::NvidiaGpu => "nvidia.com/gpu",
            ResourceName::AmdGpu => "amd.com/gpu",
            ResourceName::AwsNeuron => "aws.amazon.com/neuron",
            ResourceName::AwsNeuronCore => "aws.amazon.com/neuroncore",
            ResourceName::HabanaGaudi => "habana.ai/gaudi",
            ResourceName::AwsPodEni => "vpc.amazonaws.com/pod-eni",
            ResourceName::Efa => "vpc.amazonaws.com/efa",
            ResourceName::Other(s) => s,
        }
    }

    /// Parses a Kubernetes resource name (never fails: unknown names are extended resources).
    pub fn parse(s: &str) -> ResourceName {
        match s {
            "cpu" => ResourceName::Cpu,
            "memory" => ResourceName::Memory,
            "pods" => ResourceName::Pods,
            "ephemeral-storage" => ResourceName::EphemeralStorage,
            "nodes" => ResourceName::Nodes,
            "nvidia.com/gpu" => ResourceName::NvidiaGpu,
            "amd.com/gpu" => ResourceName::AmdGpu,
            "aws.amazon.com/neuron" => ResourceName::AwsNeuron,
            "aws.amazon.com/neuroncore" => ResourceName::AwsNeuronCore,
            "habana.ai/gaudi" => ResourceName::HabanaGaudi,
            "vpc.amazonaws.com/pod-eni" => ResourceName::AwsPodEni,
            "vpc.amazonaws.com/efa" => ResourceName::Efa,
            other => ResourceName::Other(Arc::from(other)),
        }
    }

    /// Resources whose presence marks an instance type as exotic (GPUs and accelerators).
    pub fn is_exotic(&self) -> bool {
        matches!(
            self,
            ResourceName::NvidiaGpu
                | ResourceName::AmdGpu
                | ResourceName::AwsNeuron
                | ResourceName::AwsNeuronCore
                | ResourceName::HabanaGaudi
        )
    }

    /// Converts a quantity into this resource's canonical integer unit.
    pub fn amount_of(&self, q: &Quantity) -> i64 {
        match self {
            ResourceName::Cpu => q.milli_value(),
            _ => q.value(),
        }
    }

    /// Converts an amount back into a quantity for display.
    pub fn quantity_of(&self, amount: i64) -> Quantity {
        match self {
            ResourceName::Cpu => Quantity::from_milli(amount),
            ResourceName::Memory | ResourceName::EphemeralStorage => Quantity::from_units_binary(amount),
            _ => Quantity::from_units(amount),
        }
    }
}

impl fmt::Display for ResourceName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A sparse list of resource amounts, sorted by name, at most one entry per name.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct ResourceList {
    entries: Vec<(ResourceName, i64)>,
}

impl ResourceList {
    /// An empty list.
    pub fn new() -> Self {
        ResourceList { entries: Vec::new() }
    }

    /// A list from `(name, amount)` pairs; repeated names are summed.
    pub fn from_pairs(pairs: impl IntoIterator<Item = (ResourceName, i64)>) -> Self {
        let mut r = ResourceList::new();
        for (n, v) in pairs {
            r.add_amount(n, v);
        }
        r
    }

    /// `cpu` in millicores and `memory` in bytes, the common case in tests and examples.
    pub fn cpu_mem(cpu_milli: i64, memory_bytes: i64) -> Self {
        ResourceList::from_pairs([(ResourceName::Cpu, cpu_milli), (ResourceName::Memory, memory_bytes)])
    }

    /// The amount of `name`, 0 when absent.
    pub fn get(&self, name: &ResourceName) -> i64 {
        self.find(name).map(|i| self.entries[i].1).unwrap_or(0)
    }

    /// Whether `name` is present (possibly with amount 0).
    pub fn contains(&self, name: &ResourceName) -> bool {
        self.find(name).is_some()
    }

    fn find(&self, name: &ResourceName) -> Option<usize> {
        self.entries.binary_search_by(|(n, _)| n.cmp(name)).ok()
    }

    /// Sets `name` to `amount`.
    pub fn set(&mut self, name: ResourceName, amount: i64) {
        match self.entries.binary_search_by(|(n, _)| n.cmp(&name)) {
            Ok(i) => self.entries[i].1 = amount,
            Err(i) => self.entries.insert(i, (name, amount)),
        }
    }

    /// Adds `amount` to `name`, inserting it when absent.
    pub fn add_amount(&mut self, name: ResourceName, amount: i64) {
        match self.entries.binary_search_by(|(n, _)| n.cmp(&name)) {
            Ok(i) => self.entries[i].1 = self.entries[i].1.saturating_add(amount),
            Err(i) => self.entries.insert(i, (name, amount)),
        }
    }

    /// Removes `name`.
    pub fn remove(&mut self, name: &ResourceName) {
        if let Some(i) = self.find(name) {
            self.entries.remove(i);
        }
    }

    /// Iterates over `(name, amount)` in name order.
    pub fn iter(&self) -> impl Iterator<Item = (&ResourceName, i64)> {
        self.entries.iter().map(|(n, v)| (n, *v))
    }

    /// Whether the list has no entries.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// `self + other`, every name of either side present (Karpenter's `Merge`).
    pub fn merged(&self, other: &ResourceList) -> ResourceList {
        let mut r = self.clone();
        r.add(other);
        r
    }

    /// Adds `other` into `self` (Karpenter's `MergeInto`).
    pub fn add(&mut self, other: &ResourceList) {
        for (n, v) in other.iter() {
            self.add_amount(n.clone(), v);
        }
    }

    /// `self - other` over the names of `self` only (Karpenter's `Subtract`).
    pub fn subtracted(&self, other: &ResourceList) -> ResourceList {
        ResourceList {
            entries: self.entries.iter().map(|(n, v)| (n.clone(), v.saturating_sub(other.get(n)))).collect(),
        }
    }

    /// Subtracts `other` from `self`, inserting names of `other` that are absent
    /// (Karpenter's `SubtractFrom`).
    pub fn subtract(&mut self, other: &ResourceList) {
        for (n, v) in other.iter() {
            self.add_amount(n.clone(), -v);
        }
    }

    /// Whether `self` (requests) fits into `total` (allocatable): every amount of `total`
    /// is non-negative and every request is at most what `total` has of it.
    pub fn fits_in(&self, total: &ResourceList) -> bool {
        if total.entries.iter().any(|(_, v)| *v < 0) {
            return false;
        }
        self.entries.iter().all(|(n, v)| *v <= total.get(n))
    }

    /// Whether `self + extra` fits into `total`, without building the sum.
    pub fn fits_in_with(&self, extra: &ResourceList, total: &ResourceList) -> bool {
        if total.entries.iter().any(|(_, v)| *v < 0) {
            return false;
        }
        self.entries.iter().all(|(n, v)| v.saturating_add(extra.get(n)) <= total.get(n))
            && extra.entries.iter().all(|(n, v)| self.contains(n) || *v <= total.get(n))
    }

    /// The names whose request exceeds `total`, for error messages.
    pub fn exceeding(&self, total: &ResourceList) -> Vec<ResourceName> {
        self.entries.iter().filter(|(n, v)| *v > total.get(n)).map(|(n, _)| n.clone()).collect()
    }

    /// The per-name maximum over both lists, every name of either present.
    pub fn max_with(&self, other: &ResourceList) -> ResourceList {
        let mut r = self.clone();
        for (n, v) in other.iter() {
            match r.find(n) {
                Some(i) => r.entries[i].1 = r.entries[i].1.max(v),
                None => r.set(n.clone(), v),
            }
        }
        r
    }

    /// The per-name minimum, keeping only names present in both (Karpenter's `MinResources`).
    pub fn min_with(&self, other: &ResourceList) -> ResourceList {
        ResourceList {
            entries: self
                .entries
                .iter()
                .filter_map(|(n, v)| other.find(n).map(|i| (n.clone(), (*v).min(other.entries[i].1))))
                .collect(),
        }
    }

    /// Every amount multiplied by `k`.
    pub fn scaled(&self, k: i64) -> ResourceList {
        ResourceList { entries: self.entries.iter().map(|(n, v)| (n.clone(), v.saturating_mul(k))).collect() }
    }
}

impl fmt::Display for ResourceList {
    /// Like Karpenter's `resources.String`: `{"cpu":"100m","memory":"1Gi","pods":"1"}`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.entries.is_empty() {
            return f.write_str("{}");
        }
        let mut items: Vec<(String, String)> =
            self.entries.iter().map(|(n, v)| (n.as_str().to_string(), n.quantity_of(*v).to_string())).collect();
        items.sort();
        f.write_str("{")?;
        for (i, (k, v)) in items.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "\"{k}\":\"{v}\"")?;
        }
        f.write_str("}")
    }
}

/// Formats a memory amount in bytes the way users write it (`1536Mi`).
pub fn format_bytes(bytes: i64) -> String {
    let q = Quantity::from_units_binary(bytes);
    debug_assert_eq!(q.format(), Format::BinarySi);
    q.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fits_follows_karpenter() {
        let alloc = ResourceList::cpu_mem(2000, 4 << 30);
        assert!(ResourceList::cpu_mem(2000, 4 << 30).fits_in(&alloc));
        assert!(!ResourceList::cpu_mem(2001, 0).fits_in(&alloc));
        let gpu = ResourceList::from_pairs([(ResourceName::NvidiaGpu, 1)]);
        assert!(!gpu.fits_in(&alloc), "an absent resource has nothing to give");
        let negative = ResourceList::from_pairs([(ResourceName::Cpu, 10), (ResourceName::Pods, -1)]);
        assert!(!ResourceList::new().fits_in(&negative), "negative totals fit nothing");
    }

    #[test]
    fn min_keeps_common_names_only() {
        let a = ResourceList::cpu_mem(100, 200);
        let b = ResourceList::from_pairs([(ResourceName::Cpu, 50)]);
        assert_eq!(a.min_with(&b), ResourceList::from_pairs([(ResourceName::Cpu, 50)]));
    }

    #[test]
    fn displays_like_karpenter() {
        let r = ResourceList::from_pairs([
            (ResourceName::Memory, 100 << 20),
            (ResourceName::Cpu, 1500),
            (ResourceName::Pods, 1),
        ]);
        assert_eq!(r.to_string(), r#"{"cpu":"1500m","memory":"100Mi","pods":"1"}"#);
    }
}
