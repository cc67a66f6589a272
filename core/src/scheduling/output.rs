//! What a solve returns: new NodeClaims (their pods, candidate types, requirements and
//! the launch they would get), pods placed on existing nodes, a reason for every pod that
//! could not be placed, and every placement in order.

use crate::catalog::{CapacityType, InstanceType};
use crate::labels;
use crate::requirements::{Requirement, Requirements};
use crate::resources::ResourceList;

use super::input::PoolInput;

/// The cheapest launch of a NodeClaim, as the AWS provider would make it.
#[derive(Clone, Debug, PartialEq)]
pub struct Launch {
    /// Index into the pool's instance types.
    pub instance_type: usize,
    pub zone: String,
    pub capacity_type: CapacityType,
    pub price: f64,
}

/// A NodeClaim the solve decided to create.
#[derive(Clone, Debug)]
pub struct NewClaim {
    /// Index of the NodePool in the snapshot.
    pub pool: usize,
    /// Indices of the pending pods it hosts.
    pub pods: Vec<usize>,
    /// Indices into the pool's instance types, cheapest first, at most
    /// `max_instance_types` (`u32`: thousands of claims each hold hundreds).
    pub instance_types: Vec<u32>,
    /// Final requirements, with `capacity-type In [...]`; the `instance-type In [...]`
    /// requirement is `instance_types` (see [`NewClaim::full_requirements`]), kept apart so
    /// thousands of claims do not each hold hundreds of type names.
    pub requirements: Requirements,
    /// Pod requests plus the smallest DaemonSet overhead among its types.
    pub requests: ResourceList,
    pub min_values_relaxed: bool,
    /// `None` when no type has an available offering (cannot happen for a claim the solve
    /// made, kept for callers that re-check later).
    pub launch: Option<Launch>,
}

impl NewClaim {
    /// The requirements with `node.kubernetes.io/instance-type In [candidates]`, as the
    /// NodeClaim carries them. `its` are the pool's instance types.
    pub fn full_requirements(&self, its: &[InstanceType]) -> Requirements {
        let mut reqs = self.requirements.clone();
        let min_values = reqs.get(labels::INSTANCE_TYPE).min_values;
        reqs.add(
            labels::INSTANCE_TYPE,
            Requirement::is_in(self.instance_types.iter().map(|&t| its[t as usize].name.as_str()))
                .with_min_values(min_values),
        );
        reqs
    }

    /// The NodeClaim spec to create for this claim (Karpenter's `ToNodeClaim`): the pool's
    /// template with the solved requirements and requests.
    pub fn to_spec(&self, input: &PoolInput) -> crate::nodepool::NodeClaimSpec {
        let pool = &input.pool;
        let mut labels = pool.labels.clone();
        labels.insert(labels::NODEPOOL.to_string(), pool.name.clone());
        labels.insert(labels::EC2NODECLASS.to_string(), pool.node_class.name.clone());
        let mut requirements = self.full_requirements(&input.instance_types);
        requirements.remove(labels::REGISTERED);
        requirements.remove(labels::INITIALIZED);
        let mut annotations = pool.annotations.clone();
        annotations
            .insert("karpenter.sh/nodeclaim-min-values-relaxed".to_string(), self.min_values_relaxed.to_string());
        // What drift compares the NodePool with later.
        annotations.insert(
            crate::disruption::drift::HASH_ANNOTATION.to_string(),
            crate::disruption::drift::template_hash(pool),
        );
        annotations.insert(
            crate::disruption::drift::HASH_VERSION_ANNOTATION.to_string(),
            crate::disruption::drift::HASH_VERSION.to_string(),
        );
        crate::nodepool::NodeClaimSpec {
            nodepool: pool.name.clone(),
            labels,
            annotations,
            taints: pool.taints.clone(),
            startup_taints: pool.startup_taints.clone(),
            requirements,
            requests: self.requests.clone(),
            node_class: pool.node_class.clone(),
            expire_after: pool.expire_after,
            termination_grace_period: pool.termination_grace_period,
        }
    }
}

/// Pods placed on an existing node.
#[derive(Clone, Debug)]
pub struct ExistingPlacement {
    /// Index into the snapshot's nodes.
    pub node: usize,
    pub pods: Vec<usize>,
}

/// The outcome of a solve. Every pending pod is in exactly one of `claims`, `existing` or
/// `errors`.
#[derive(Clone, Debug, Default)]
pub struct Results {
    pub claims: Vec<NewClaim>,
    pub existing: Vec<ExistingPlacement>,
    /// `(pod index, reason)`, ordered by pod index.
    pub errors: Vec<(usize, String)>,
    /// NodePools that could not take part, and why.
    pub warnings: Vec<String>,
    /// Every placement in the order the solve made it; `Target::Planned` holds an index into
    /// `claims`.
    pub order: Vec<Placement>,
}

impl Results {
    /// The $/hour of every new claim's launch.
    pub fn cost_per_hour(&self) -> f64 {
        self.claims.iter().filter_map(|c| c.launch.as_ref()).map(|l| l.price).sum()
    }

    /// The number of pods placed (on new or existing capacity).
    pub fn scheduled(&self) -> usize {
        self.claims.iter().map(|c| c.pods.len()).sum::<usize>()
            + self.existing.iter().map(|e| e.pods.len()).sum::<usize>()
    }
}

/// Where a pod was placed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Target {
    /// Index into the snapshot's nodes.
    Existing(usize),
    /// A planned NodeClaim, by its id.
    Planned(usize),
}

/// One placement, in the order the solve made it, with the zone the node was known to be in
/// at that moment (`None` when its zone was still open).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Placement {
    pub pod: usize,
    pub target: Target,
    pub zone: Option<String>,
}
