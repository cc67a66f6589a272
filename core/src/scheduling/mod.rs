//! The provisioning simulation at Karpenter parity.
//!
//! [`solve`] takes a [`Snapshot`] of the cluster (NodePools with their instance types,
//! existing nodes, running pods, DaemonSets, namespaces) and the pending pods to place, and
//! returns [`Results`]: new NodeClaims with their pods, candidate instance types (cheapest
//! first) and the launch they would get, pods placed on existing nodes, and a reason for
//! every pod that could not be placed. It can run on any subset of pods and NodePools
//! against any snapshot, which is how the per-NodePool actors will call it.
//!
//! The algorithm follows Karpenter v1.14's `Scheduler.Solve` (see
//! `docs/scheduling.md`); where Karpenter is non-deterministic (Go map order, unstable sorts)
//! dovetail breaks ties by name.

mod bound;
mod classes;
mod filter;
mod launch;
mod nodes;
mod packer;
mod scheduler;
mod template;
mod topology;
mod validate;
mod view;

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::catalog::{CapacityType, InstanceType};
use crate::labels::{self, Labels};
use crate::node::Node;
use crate::nodepool::NodePool;
use crate::pod::Pod;
use crate::requirements::{Requirement, Requirements};
use crate::resources::ResourceList;

pub use bound::{LowerBound, lower_bound};
pub use filter::unmet_min_values;
pub use scheduler::{Placement, Target};
pub use topology::{TopologyError, TopologyType};
pub use validate::{Semantics, validate};

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
}

impl Default for SolveOptions {
    fn default() -> Self {
        SolveOptions {
            packer: Packer::default(),
            preference_policy: PreferencePolicy::Respect,
            min_values_policy: MinValuesPolicy::Strict,
            max_instance_types: 600,
            max_launch_types: 60,
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
    /// Pods bound to nodes (for resources, host ports and topology counts).
    pub bound_pods: Vec<Pod>,
    /// One pod template per DaemonSet.
    pub daemonsets: Vec<Pod>,
    /// Namespace labels, for namespace selectors.
    pub namespaces: BTreeMap<String, Labels>,
}

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

/// The equivalence class of each pod: pods whose scheduling inputs are identical (their names
/// and creation order aside) share an id; ids count from 0 in order of first appearance.
pub fn pod_classes(pods: &[Pod]) -> Vec<usize> {
    let all: Vec<usize> = (0..pods.len()).collect();
    let ids = classes::ids(pods, &all);
    all.iter().map(|i| ids.get(i).copied().unwrap_or(*i)).collect()
}

/// Runs the Karpenter-parity provisioning simulation of `pods` against `snapshot`.
pub fn solve(snapshot: &Snapshot, pods: &[Pod], opts: &SolveOptions) -> Results {
    let mut s = scheduler::Scheduler::new(snapshot, pods, opts);
    let mut errors = match opts.packer {
        Packer::Karpenter => s.solve(),
        Packer::Dovetail => s.solve_dovetail(),
    };
    let mut claims = Vec::new();
    let mut claim_of: BTreeMap<usize, usize> = BTreeMap::new();
    let mut zone_use: BTreeMap<String, usize> = BTreeMap::new();
    let mut cache = launch::Cache::default();
    for planned in &s.planned {
        if planned.pods.is_empty() {
            continue;
        }
        let template = &s.templates[planned.template];
        let finalized = if planned.right_size {
            let r =
                right_size(template, planned, s.remaining_limit_types(planned), opts.max_instance_types, &mut cache);
            r.and_then(|types| finalize(template, planned, types, true, opts))
        } else {
            finalize(template, planned, planned.types.clone(), false, opts)
        };
        match finalized {
            Ok(mut claim) => {
                claim.launch = cache.choose(template, planned.template, &claim, opts, &mut zone_use);
                claim_of.insert(planned.id, claims.len());
                claims.push(claim);
            }
            Err(e) => {
                for &p in &planned.pods {
                    errors.insert(p, e.clone());
                }
            }
        }
    }
    let existing = s
        .existing
        .iter()
        .filter(|n| !n.pods.is_empty())
        .map(|n| ExistingPlacement { node: n.index, pods: n.pods.clone() })
        .collect();
    let mut errors: Vec<(usize, String)> = errors.into_iter().collect();
    errors.sort_by_key(|(i, _)| *i);
    let order = s
        .order
        .iter()
        .filter_map(|p| match p.target {
            Target::Existing(_) => Some(p.clone()),
            Target::Planned(id) => claim_of.get(&id).map(|&c| Placement { target: Target::Planned(c), ..p.clone() }),
        })
        .collect();
    Results { claims, existing, errors, warnings: std::mem::take(&mut s.warnings), order }
}

/// The candidate types of a right-sized claim, cheapest first: every type of the pool
/// that meets its final requirements, has an offering they allow, and fits its pods with
/// its DaemonSets (no host port conflict), within what the claim reserved of the pool's
/// limits; at most `max` of them.
fn right_size(
    template: &template::Template<'_>,
    planned: &nodes::PlannedNode,
    limit_cap: Option<ResourceList>,
    max: usize,
    cache: &mut launch::Cache,
) -> Result<Vec<usize>, String> {
    let its = template.instance_types;
    let mut reqs = planned.requirements.clone();
    reqs.remove(labels::HOSTNAME);
    let by_price = cache.by_price(template, planned.template, reqs);
    let ports_ok: Vec<bool> = template
        .daemon_groups
        .iter()
        .map(|g| !planned.pod_ports.iter().any(|p| g.host_ports.iter().any(|q| p.conflicts(q))))
        .collect();
    let need = template.need(&planned.requests);
    let mut types: Vec<usize> = by_price
        .iter()
        .copied()
        .filter(|&t| {
            let Some(g) = template.group_of[t] else { return false };
            ports_ok[g]
                && template.fits(&need, t)
                && limit_cap.as_ref().is_none_or(|cap| cap.iter().all(|(n, v)| its[t].capacity.get(n) <= v))
        })
        .take(max)
        .collect();
    types.shrink_to_fit();
    if types.is_empty() {
        types = planned.types.clone();
    }
    Ok(types)
}

/// Karpenter's `FinalizeScheduling` + `ToNodeClaim`: drop the placeholder hostname, add the
/// smallest daemon overhead, order types by price, truncate, and pin the instance-type and
/// capacity-type requirements.
fn finalize(
    template: &template::Template<'_>,
    planned: &nodes::PlannedNode,
    types: Vec<usize>,
    presorted: bool,
    opts: &SolveOptions,
) -> Result<NewClaim, String> {
    let its = template.instance_types;
    let mut reqs = planned.requirements.clone();
    reqs.remove(labels::HOSTNAME);
    let mut used = vec![false; template.daemon_groups.len()];
    for &t in &types {
        if let Some(g) = template.group_of[t] {
            used[g] = true;
        }
    }
    let mut min_overhead: Option<ResourceList> = None;
    for (g, _) in used.iter().enumerate().filter(|(_, u)| **u) {
        let o = &template.daemon_groups[g].overhead;
        if !o.is_empty() {
            min_overhead = Some(match min_overhead {
                None => o.clone(),
                Some(m) => m.min_with(o),
            });
        }
    }
    let mut requests = planned.requests.clone();
    if let Some(m) = min_overhead {
        requests.add(&m);
    }
    let mut types = types;
    if !presorted {
        let offering_filter = crate::catalog::OfferingFilter::new(&reqs);
        let mut keyed: Vec<(f64, &str, usize)> =
            types.iter().map(|&t| (its[t].cheapest_price_with(&offering_filter), its[t].name.as_str(), t)).collect();
        keyed.sort_by(|a, b| a.0.total_cmp(&b.0).then_with(|| a.1.cmp(b.1)));
        types = keyed.into_iter().map(|(_, _, t)| t).collect();
    }
    types.truncate(opts.max_instance_types);
    if reqs.has_min_values() && opts.min_values_policy == MinValuesPolicy::Strict {
        let unmet = unmet_min_values(its, &types, &reqs);
        if !unmet.is_empty() {
            let keys: Vec<&str> = unmet.iter().map(|(k, _)| k.as_str()).collect();
            return Err(format!(
                "pod didn't schedule because NodePool {:?} couldn't meet minValues requirements, validating minValues, \
                 minValues requirement is not met for label(s) [{}]",
                template.pool.name,
                keys.join(" ")
            ));
        }
    }
    // The capacity types the candidates offer (stopping once every type the pool's
    // offerings could have is seen).
    let mut cts: Vec<&str> = Vec::new();
    let offering_filter = crate::catalog::OfferingFilter::new(&reqs);
    let possible = template.capacity_types.iter().filter(|c| reqs.get(labels::CAPACITY_TYPE).has(c.as_str())).count();
    'types: for &t in &types {
        for o in &its[t].offerings {
            if offering_filter.accepts(o) && !cts.contains(&o.capacity_type.as_str()) {
                cts.push(o.capacity_type.as_str());
                if cts.len() >= possible {
                    break 'types;
                }
            }
        }
    }
    if !cts.is_empty() {
        reqs.add(labels::CAPACITY_TYPE, Requirement::is_in(cts));
    }
    Ok(NewClaim {
        pool: template.pool_index,
        pods: planned.pods.clone(),
        instance_types: types.into_iter().map(|t| t as u32).collect(),
        requirements: reqs,
        requests,
        min_values_relaxed: planned.min_values_relaxed,
        launch: None,
    })
}

#[cfg(test)]
mod tests;
