//! Drift: a node no longer matches what its NodePool (or NodeClass) asks for.
//!
//! - **NodePool drift**: the template hash on the NodeClaim (`karpenter.sh/nodepool-hash`,
//!   stamped at creation) differs from the NodePool's now. The hash covers the template's
//!   labels, annotations, taints, startup taints, NodeClass reference, `expireAfter` and
//!   `terminationGracePeriod`; requirements are checked apart and budgets never drift a node.
//!   A NodeClaim stamped by another hash version (Karpenter's, before a migration) is not
//!   drifted by its hash.
//! - **Requirements drift**: a label of the node is outside what the NodePool's requirements
//!   allow now.
//! - **Instance type gone**: the node's type, or its offering in its zone and capacity type,
//!   is no longer one the NodePool can launch.
//! - **NodeClass drift**: reported by the cloud provider (image, network, node class spec).

use std::fmt;

use crate::catalog::InstanceType;
use crate::labels;
use crate::node::Node;
use crate::nodepool::NodePool;
use crate::plane::{TypesByName, types_by_name};

/// The NodeClaim annotation with the NodePool's template hash.
pub const HASH_ANNOTATION: &str = "karpenter.sh/nodepool-hash";
/// The NodeClaim annotation naming how the hash was computed.
pub const HASH_VERSION_ANNOTATION: &str = "karpenter.sh/nodepool-hash-version";
/// dovetail's hash version.
pub const HASH_VERSION: &str = "dovetail-v1";

/// Why a node drifted (the `Drifted` condition's reason).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Drift {
    NodePool,
    Requirements {
        key: String,
        value: String,
    },
    InstanceTypeNotFound {
        instance_type: String,
    },
    /// The cloud provider's reason (`AMIDrift`, `SubnetDrift`, `NodeClassDrift`, ...).
    NodeClass(String),
}

impl Drift {
    /// The condition reason, as Karpenter writes it.
    pub fn reason(&self) -> &str {
        match self {
            Drift::NodePool => "NodePoolDrifted",
            Drift::Requirements { .. } => "RequirementsDrifted",
            Drift::InstanceTypeNotFound { .. } => "InstanceTypeNotFound",
            Drift::NodeClass(r) => r,
        }
    }
}

impl fmt::Display for Drift {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Drift::NodePool => f.write_str("the nodepool's template changed"),
            Drift::Requirements { key, value } => {
                write!(f, "label {key}={value} is no longer allowed by the nodepool's requirements")
            }
            Drift::InstanceTypeNotFound { instance_type } => {
                write!(f, "instance type {instance_type} is no longer offered to the nodepool")
            }
            Drift::NodeClass(r) => write!(f, "the node class drifted ({r})"),
        }
    }
}

/// The NodePool's template hash: FNV-1a (64 bits) over a canonical rendering of the hashed
/// fields, as hex. Stable across processes and versions of this crate.
pub fn template_hash(pool: &NodePool) -> String {
    let mut text = String::new();
    let mut field = |name: &str, value: &str| {
        text.push_str(name);
        text.push('\u{1f}');
        text.push_str(value);
        text.push('\u{1e}');
    };
    for (k, v) in &pool.labels {
        field("label", &format!("{k}={v}"));
    }
    for (k, v) in &pool.annotations {
        field("annotation", &format!("{k}={v}"));
    }
    for t in &pool.taints {
        field("taint", &format!("{}={}:{}", t.key, t.value, t.effect.as_str()));
    }
    for t in &pool.startup_taints {
        field("startup-taint", &format!("{}={}:{}", t.key, t.value, t.effect.as_str()));
    }
    let nc = &pool.node_class;
    field("node-class", &format!("{}/{}/{}", nc.group, nc.kind, nc.name));
    field("expire-after", &format!("{:?}", pool.expire_after.map(|d| d.as_millis())));
    field("termination-grace-period", &format!("{:?}", pool.termination_grace_period.map(|d| d.as_millis())));
    let mut h = crate::shared::Fnv::default();
    h.write(text.as_bytes());
    format!("{:016x}", h.finish())
}

/// Why a node of `pool` drifted, if it did. `annotations` are its NodeClaim's; `types` the
/// instance types the pool can launch now; `cloud` what the cloud provider reported.
pub fn drifted(
    node: &Node,
    annotations: &labels::Labels,
    pool: &NodePool,
    types: &[InstanceType],
    cloud: Option<&str>,
) -> Option<Drift> {
    DriftCheck::new(pool, &types_by_name(types)).drifted(node, annotations, cloud)
}

/// [`drifted`] for every node of a pool in a round: the pool's hash worked out once and its
/// types found by name (a round asks it of every node of the pool).
pub struct DriftCheck<'m, 'a> {
    pool: &'a NodePool,
    hash: String,
    types: &'m TypesByName<'a>,
}

impl<'m, 'a> DriftCheck<'m, 'a> {
    /// `types`: the pool's types by name.
    pub fn new(pool: &'a NodePool, types: &'m TypesByName<'a>) -> Self {
        DriftCheck { pool, hash: template_hash(pool), types }
    }

    /// Why the node drifted, if it did (see [`drifted`]).
    pub fn drifted(&self, node: &Node, annotations: &labels::Labels, cloud: Option<&str>) -> Option<Drift> {
        if annotations.get(HASH_VERSION_ANNOTATION).is_some_and(|v| v == HASH_VERSION)
            && annotations.get(HASH_ANNOTATION).is_some_and(|h| *h != self.hash)
        {
            return Some(Drift::NodePool);
        }
        for (key, req) in self.pool.requirements.iter() {
            if let Some(value) = node.labels.get(key)
                && !req.has(value)
            {
                return Some(Drift::Requirements { key: key.to_string(), value: value.clone() });
            }
        }
        if let Some(name) = node.labels.get(labels::INSTANCE_TYPE) {
            let zone = node.labels.get(labels::ZONE);
            let capacity = node.labels.get(labels::CAPACITY_TYPE);
            let offered = self.types.get(name.as_str()).is_some_and(|t| {
                t.offerings.iter().any(|o| {
                    zone.is_none_or(|z| o.zone == *z) && capacity.is_none_or(|c| o.capacity_type.as_str() == c)
                })
            });
            if !offered {
                return Some(Drift::InstanceTypeNotFound { instance_type: name.clone() });
            }
        }
        cloud.map(|r| Drift::NodeClass(r.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::requirements::{Requirement, Requirements};
    use crate::taints::{Effect, Taint};

    #[test]
    fn the_hash_changes_with_the_template_and_not_with_requirements_or_budgets() {
        let pool = NodePool::new("default", Requirements::new());
        let h = template_hash(&pool);
        assert_eq!(h, template_hash(&pool.clone()), "stable");
        assert_eq!(h.len(), 16);
        let mut reqs = pool.clone();
        reqs.requirements.add(labels::CAPACITY_TYPE, Requirement::is_in(["spot"]));
        reqs.disruption.budgets.clear();
        reqs.limits.set(crate::resources::ResourceName::Cpu, 10);
        assert_eq!(template_hash(&reqs), h);
        let mut tainted = pool.clone();
        tainted.taints.push(Taint::new("dedicated", "gpu", Effect::NoSchedule));
        assert_ne!(template_hash(&tainted), h);
        let mut labelled = pool.clone();
        labelled.labels.insert("team".into(), "a".into());
        assert_ne!(template_hash(&labelled), h);
        let mut expiring = pool;
        expiring.expire_after = None;
        assert_ne!(template_hash(&expiring), h);
    }

    #[test]
    fn a_node_drifts_by_hash_requirements_type_or_cloud() {
        let mut pool = NodePool::new("default", Requirements::new());
        let mut node = Node::default();
        node.labels.insert(labels::CAPACITY_TYPE.into(), "on-demand".into());
        let stamped: labels::Labels = [
            (HASH_ANNOTATION.to_string(), template_hash(&pool)),
            (HASH_VERSION_ANNOTATION.to_string(), HASH_VERSION.to_string()),
        ]
        .into_iter()
        .collect();
        assert_eq!(drifted(&node, &stamped, &pool, &[], None), None);
        assert_eq!(drifted(&node, &stamped, &pool, &[], Some("AMIDrift")), Some(Drift::NodeClass("AMIDrift".into())));
        let mut foreign = stamped.clone();
        foreign.insert(HASH_VERSION_ANNOTATION.into(), "v3".into());
        pool.labels.insert("team".into(), "a".into());
        assert_eq!(drifted(&node, &stamped, &pool, &[], None), Some(Drift::NodePool));
        assert_eq!(drifted(&node, &foreign, &pool, &[], None), None, "another hash version is not drift");
        pool.requirements.add(labels::CAPACITY_TYPE, Requirement::is_in(["spot"]));
        let d = drifted(&node, &foreign, &pool, &[], None).expect("drifted");
        assert_eq!(d.reason(), "RequirementsDrifted");
        assert!(d.to_string().contains("karpenter.sh/capacity-type=on-demand"), "{d}");
        node.labels.insert(labels::CAPACITY_TYPE.into(), "spot".into());
        node.labels.insert(labels::INSTANCE_TYPE.into(), "m5.large".into());
        let gone = drifted(&node, &foreign, &pool, &[], None).expect("drifted");
        assert_eq!(gone, Drift::InstanceTypeNotFound { instance_type: "m5.large".into() });
    }
}
