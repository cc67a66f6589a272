//! Well-known label keys, their normalisation, restricted labels, and label selectors.

use std::collections::BTreeMap;

/// A label set, ordered so iteration is deterministic.
pub type Labels = BTreeMap<String, String>;

pub const ZONE: &str = "topology.kubernetes.io/zone";
pub const REGION: &str = "topology.kubernetes.io/region";
pub const INSTANCE_TYPE: &str = "node.kubernetes.io/instance-type";
pub const ARCH: &str = "kubernetes.io/arch";
pub const OS: &str = "kubernetes.io/os";
pub const HOSTNAME: &str = "kubernetes.io/hostname";
pub const WINDOWS_BUILD: &str = "node.kubernetes.io/windows-build";

pub const NODEPOOL: &str = "karpenter.sh/nodepool";
pub const CAPACITY_TYPE: &str = "karpenter.sh/capacity-type";
pub const INITIALIZED: &str = "karpenter.sh/initialized";
pub const REGISTERED: &str = "karpenter.sh/registered";
pub const DO_NOT_SYNC_TAINTS: &str = "karpenter.sh/do-not-sync-taints";

pub const INSTANCE_CATEGORY: &str = "karpenter.k8s.aws/instance-category";
pub const INSTANCE_FAMILY: &str = "karpenter.k8s.aws/instance-family";
pub const INSTANCE_GENERATION: &str = "karpenter.k8s.aws/instance-generation";
pub const INSTANCE_SIZE: &str = "karpenter.k8s.aws/instance-size";
pub const INSTANCE_CPU: &str = "karpenter.k8s.aws/instance-cpu";
pub const INSTANCE_CPU_MANUFACTURER: &str = "karpenter.k8s.aws/instance-cpu-manufacturer";
pub const INSTANCE_CPU_SUSTAINED_CLOCK: &str = "karpenter.k8s.aws/instance-cpu-sustained-clock-speed-mhz";
pub const INSTANCE_MEMORY: &str = "karpenter.k8s.aws/instance-memory";
pub const INSTANCE_EBS_BANDWIDTH: &str = "karpenter.k8s.aws/instance-ebs-bandwidth";
pub const INSTANCE_NETWORK_BANDWIDTH: &str = "karpenter.k8s.aws/instance-network-bandwidth";
pub const INSTANCE_LOCAL_NVME: &str = "karpenter.k8s.aws/instance-local-nvme";
pub const INSTANCE_GPU_NAME: &str = "karpenter.k8s.aws/instance-gpu-name";
pub const INSTANCE_GPU_MANUFACTURER: &str = "karpenter.k8s.aws/instance-gpu-manufacturer";
pub const INSTANCE_GPU_COUNT: &str = "karpenter.k8s.aws/instance-gpu-count";
pub const INSTANCE_GPU_MEMORY: &str = "karpenter.k8s.aws/instance-gpu-memory";
pub const INSTANCE_ACCELERATOR_NAME: &str = "karpenter.k8s.aws/instance-accelerator-name";
pub const INSTANCE_ACCELERATOR_MANUFACTURER: &str = "karpenter.k8s.aws/instance-accelerator-manufacturer";
pub const INSTANCE_ACCELERATOR_COUNT: &str = "karpenter.k8s.aws/instance-accelerator-count";
pub const INSTANCE_HYPERVISOR: &str = "karpenter.k8s.aws/instance-hypervisor";
pub const INSTANCE_ENCRYPTION_IN_TRANSIT: &str = "karpenter.k8s.aws/instance-encryption-in-transit-supported";
pub const INSTANCE_CAPABILITY_FLEX: &str = "karpenter.k8s.aws/instance-capability-flex";
pub const INSTANCE_TENANCY: &str = "karpenter.k8s.aws/instance-tenancy";
pub const NITRO_SANDBOX: &str = "karpenter.k8s.aws/nitro-sandbox";
pub const CAPACITY_RESERVATION_ID: &str = "karpenter.k8s.aws/capacity-reservation-id";
pub const CAPACITY_RESERVATION_TYPE: &str = "karpenter.k8s.aws/capacity-reservation-type";
pub const CAPACITY_RESERVATION_INTERRUPTIBLE: &str = "karpenter.k8s.aws/capacity-reservation-interruptible";
pub const PLACEMENT_GROUP_ID: &str = "karpenter.k8s.aws/placement-group-id";
pub const PLACEMENT_GROUP_PARTITION: &str = "karpenter.k8s.aws/placement-group-partition";
pub const EC2NODECLASS: &str = "karpenter.k8s.aws/ec2nodeclass";
pub const ZONE_ID: &str = "topology.k8s.aws/zone-id";

/// Label keys that Karpenter (core and AWS provider) knows the values of for every instance
/// type: a requirement on one of them never needs a NodePool to define it.
pub const WELL_KNOWN: &[&str] = &[
    NODEPOOL,
    ZONE,
    REGION,
    INSTANCE_TYPE,
    ARCH,
    OS,
    CAPACITY_TYPE,
    WINDOWS_BUILD,
    CAPACITY_RESERVATION_ID,
    CAPACITY_RESERVATION_TYPE,
    CAPACITY_RESERVATION_INTERRUPTIBLE,
    INSTANCE_HYPERVISOR,
    INSTANCE_ENCRYPTION_IN_TRANSIT,
    NITRO_SANDBOX,
    INSTANCE_CATEGORY,
    INSTANCE_CAPABILITY_FLEX,
    INSTANCE_FAMILY,
    INSTANCE_GENERATION,
    INSTANCE_SIZE,
    INSTANCE_LOCAL_NVME,
    INSTANCE_CPU,
    INSTANCE_CPU_MANUFACTURER,
    INSTANCE_CPU_SUSTAINED_CLOCK,
    INSTANCE_MEMORY,
    INSTANCE_EBS_BANDWIDTH,
    INSTANCE_NETWORK_BANDWIDTH,
    INSTANCE_GPU_NAME,
    INSTANCE_GPU_MANUFACTURER,
    INSTANCE_GPU_COUNT,
    INSTANCE_GPU_MEMORY,
    INSTANCE_ACCELERATOR_NAME,
    INSTANCE_ACCELERATOR_MANUFACTURER,
    INSTANCE_ACCELERATOR_COUNT,
    ZONE_ID,
    INSTANCE_TENANCY,
    PLACEMENT_GROUP_ID,
    PLACEMENT_GROUP_PARTITION,
];

/// Whether `key` is a well-known label.
pub fn is_well_known(key: &str) -> bool {
    WELL_KNOWN.contains(&key)
}

/// Label domains users may not use in requirements (besides the well-known keys in them).
pub const RESTRICTED_DOMAINS: &[&str] = &["karpenter.sh", "karpenter.k8s.aws"];

/// Maps deprecated beta keys to their stable names, as Karpenter's `NormalizedLabels`.
pub fn normalize_key(key: &str) -> &str {
    match key {
        "failure-domain.beta.kubernetes.io/zone" => ZONE,
        // The EBS CSI driver's zone key, as Karpenter's AWS provider normalises it (volume
        // topology of EBS volumes and of classes that use it).
        "topology.ebs.csi.aws.com/zone" => ZONE,
        "failure-domain.beta.kubernetes.io/region" => REGION,
        "beta.kubernetes.io/arch" => ARCH,
        "beta.kubernetes.io/os" => OS,
        "beta.kubernetes.io/instance-type" => INSTANCE_TYPE,
        other => other,
    }
}

/// Karpenter's `IsRestrictedLabel`: `None` when `key` may be used in a requirement or
/// NodePool label, otherwise the reason it may not.
pub fn restricted_label_reason(key: &str) -> Option<String> {
    if is_well_known(key) {
        return None;
    }
    let domain = key.split_once('/').map(|(d, _)| d).unwrap_or("");
    let restricted = RESTRICTED_DOMAINS.iter().any(|r| domain == *r || domain.ends_with(&format!(".{r}")));
    if restricted || key == HOSTNAME {
        return Some(format!(
            "using label {key} is not allowed as it might interfere with the internal provisioning logic; \
             specify a well known label or a custom label that does not use a restricted domain ({})",
            RESTRICTED_DOMAINS.join(", ")
        ));
    }
    None
}

/// Checks a label key the way Kubernetes' `IsQualifiedName` does: an optional DNS-subdomain
/// prefix and `/`, then a name of at most 63 characters of `[A-Za-z0-9_.-]`, starting and
/// ending alphanumeric.
pub fn qualified_name_error(key: &str) -> Option<String> {
    let (prefix, name) = match key.split_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, key),
    };
    if let Some(p) = prefix {
        if p.is_empty() || p.len() > 253 {
            return Some("prefix part must be a non-empty DNS subdomain of at most 253 characters".into());
        }
        let ok = p.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && label.bytes().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'-')
                && !label.starts_with('-')
                && !label.ends_with('-')
        });
        if !ok {
            return Some(format!("prefix part {p:?} must be a lowercase DNS subdomain"));
        }
    }
    if let Some(e) = label_value_error(name) {
        return Some(e);
    }
    if name.is_empty() {
        return Some("name part must be non-empty".into());
    }
    None
}

/// Checks a label value as Kubernetes' `IsValidLabelValue`: empty, or at most 63 characters
/// of `[A-Za-z0-9_.-]` starting and ending alphanumeric.
pub fn label_value_error(v: &str) -> Option<String> {
    if v.is_empty() {
        return None;
    }
    if v.len() > 63 {
        return Some(format!("{v:?} must be no more than 63 characters"));
    }
    let b = v.as_bytes();
    let ok = b.iter().all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric();
    if !ok {
        return Some(format!(
            "{v:?} must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character"
        ));
    }
    None
}

/// A label selector operator (`matchExpressions[].operator`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum SelectorOp {
    In,
    NotIn,
    Exists,
    DoesNotExist,
}

/// One `matchExpressions` entry.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SelectorRequirement {
    pub key: String,
    pub op: SelectorOp,
    /// Sorted and deduplicated.
    pub values: Vec<String>,
}

/// A Kubernetes `LabelSelector`. Requirements are kept sorted so equal selectors compare
/// and hash equal however they were written.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LabelSelector {
    pub match_labels: BTreeMap<String, String>,
    pub match_expressions: Vec<SelectorRequirement>,
}

impl LabelSelector {
    /// A selector from `matchLabels` and `matchExpressions`, canonicalised.
    pub fn new(match_labels: BTreeMap<String, String>, mut match_expressions: Vec<SelectorRequirement>) -> Self {
        for e in &mut match_expressions {
            e.values.sort();
            e.values.dedup();
        }
        match_expressions.sort();
        match_expressions.dedup();
        LabelSelector { match_labels, match_expressions }
    }

    /// A selector matching exactly these labels.
    pub fn from_labels<'a>(labels: impl IntoIterator<Item = (&'a str, &'a str)>) -> Self {
        LabelSelector::new(labels.into_iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(), Vec::new())
    }

    /// Adds an `In [value]` expression (used for `matchLabelKeys`).
    pub fn with_expression(mut self, req: SelectorRequirement) -> Self {
        self.match_expressions.push(req);
        LabelSelector::new(self.match_labels, self.match_expressions)
    }

    /// Whether the selector matches `labels`. An empty selector matches everything.
    pub fn matches(&self, labels: &Labels) -> bool {
        self.match_labels.iter().all(|(k, v)| labels.get(k) == Some(v))
            && self.match_expressions.iter().all(|e| {
                let v = labels.get(&e.key);
                match e.op {
                    SelectorOp::In => v.is_some_and(|v| e.values.binary_search(v).is_ok()),
                    SelectorOp::NotIn => v.is_none_or(|v| e.values.binary_search(v).is_err()),
                    SelectorOp::Exists => v.is_some(),
                    SelectorOp::DoesNotExist => v.is_none(),
                }
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn restricted_labels() {
        assert!(restricted_label_reason("karpenter.sh/capacity-type").is_none());
        assert!(restricted_label_reason("karpenter.sh/foo").is_some());
        assert!(restricted_label_reason("sub.karpenter.k8s.aws/foo").is_some());
        assert!(restricted_label_reason(HOSTNAME).is_some());
        assert!(restricted_label_reason("example.com/team").is_none());
    }

    #[test]
    fn qualified_names() {
        assert!(qualified_name_error("example.com/team").is_none());
        assert!(qualified_name_error("team").is_none());
        assert!(qualified_name_error("Example.com/team").is_some());
        assert!(qualified_name_error("-team").is_some());
        assert!(qualified_name_error("example.com/").is_some());
    }

    #[test]
    fn selectors_match() {
        let labels: Labels = [("app", "web"), ("tier", "1")].into_iter().map(|(k, v)| (k.into(), v.into())).collect();
        assert!(LabelSelector::default().matches(&labels));
        assert!(LabelSelector::from_labels([("app", "web")]).matches(&labels));
        let s = LabelSelector::new(
            BTreeMap::new(),
            vec![SelectorRequirement { key: "tier".into(), op: SelectorOp::NotIn, values: vec!["2".into()] }],
        );
        assert!(s.matches(&labels));
        let s = LabelSelector::new(
            BTreeMap::new(),
            vec![SelectorRequirement { key: "zone".into(), op: SelectorOp::Exists, values: vec![] }],
        );
        assert!(!s.matches(&labels));
    }
}
