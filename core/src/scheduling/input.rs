//! What a solve takes: the snapshot of the cluster (NodePools with their instance types,
//! existing nodes, bound pods, DaemonSets, namespaces) and the options that change its
//! policy.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::catalog::InstanceType;
use crate::labels::Labels;
use crate::node::Node;
use crate::nodepool::NodePool;
use crate::pod::Pod;

/// Karpenter's `PREFERENCE_POLICY`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum PreferencePolicy {
    /// Treat preferences as requirements, relaxing them one at a time when a pod fails.
    #[default]
    Respect,
    /// Ignore preferred affinities and ScheduleAnyway spread constraints.
    Ignore,
}

/// Karpenter's `MIN_VALUES_POLICY`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum MinValuesPolicy {
    /// A NodeClaim that cannot cover `minValues` is not created.
    #[default]
    Strict,
    /// `minValues` is lowered to what the types cover, and the claim is marked relaxed.
    BestEffort,
}

/// Which placement policy a solve uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Packer {
    /// Karpenter's per-pod greedy, for parity and comparison.
    Karpenter,
    /// Equivalence classes, LP-guided instance types, right-sizing.
    #[default]
    Dovetail,
}

/// Options of one solve.
#[derive(Clone, Debug)]
pub struct SolveOptions {
    pub packer: Packer,
    pub preference_policy: PreferencePolicy,
    pub min_values_policy: MinValuesPolicy,
    /// Instance types kept per NodeClaim (Karpenter: 600).
    pub max_instance_types: usize,
    /// Instance types considered per launch (AWS provider: 60).
    pub max_launch_types: usize,
    /// With the dovetail packer on small inputs, also compute Karpenter's plan and keep the
    /// cheaper (`super::PARITY_CHECK_PODS`). Off only to look at the packer's own plan.
    pub parity_fallback: bool,
}

impl Default for SolveOptions {
    fn default() -> Self {
        SolveOptions {
            packer: Packer::default(),
            preference_policy: PreferencePolicy::Respect,
            min_values_policy: MinValuesPolicy::Strict,
            max_instance_types: 600,
            max_launch_types: 60,
            parity_fallback: true,
        }
    }
}

/// A NodePool with the instance types it can launch (shared between pools of one node
/// class).
#[derive(Clone, Debug)]
pub struct PoolInput {
    pub pool: NodePool,
    pub instance_types: Arc<Vec<InstanceType>>,
}

/// What the cluster looks like when the solve runs.
#[derive(Clone, Debug, Default)]
pub struct Snapshot {
    pub nodepools: Vec<PoolInput>,
    /// Existing nodes and in-flight NodeClaims.
    pub nodes: Vec<Node>,
    /// Pods bound to nodes (for resources, host ports and topology counts), shared with the
    /// cluster's cache rather than copied.
    pub bound_pods: Vec<Arc<Pod>>,
    /// One pod template per DaemonSet.
    pub daemonsets: Vec<Pod>,
    /// Namespace labels, for namespace selectors.
    pub namespaces: BTreeMap<String, Labels>,
}

impl PreferencePolicy {
    /// Whether preferences are honoured (then relaxed) rather than ignored.
    pub fn respects(&self) -> bool {
        *self == PreferencePolicy::Respect
    }
}
