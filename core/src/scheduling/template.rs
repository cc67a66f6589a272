//! NodeClaim templates (one per NodePool) and DaemonSet overhead groups.

use crate::catalog::InstanceType;
use crate::labels;
use crate::nodepool::NodePool;
use crate::pod::Pod;
use crate::requirements::{Requirement, Requirements};
use crate::resources::{ResourceList, ResourceName};
use crate::taints::{self, Effect, Taint, Toleration, TolerationOp};

pub use super::filter::DaemonGroup;
use super::filter::{self, FilterInput};
use super::input::{MinValuesPolicy, PoolInput};
use super::view::PodView;

/// A NodePool prepared for scheduling (Karpenter's `NodeClaimTemplate`).
pub struct Template<'a> {
    pub pool: &'a NodePool,
    /// Index of the pool in the snapshot.
    pub pool_index: usize,
    pub instance_types: &'a [InstanceType],
    /// Pool requirements and labels, `karpenter.sh/nodepool`, node class label, and
    /// `registered`/`initialized` for DaemonSet matching.
    pub requirements: Requirements,
    /// Indices of the instance types that meet the pool's requirements, in catalog order.
    pub types: Vec<usize>,
    pub daemon_groups: Vec<DaemonGroup>,
    /// For each instance type index, its daemon group (if the type is in `types`).
    pub group_of: Vec<Option<usize>>,
    /// For each instance type index, allocatable cpu (millicores), memory and pods, or
    /// `None` when some allocatable amount is negative (nothing fits): the fast path of
    /// the fit checks that run once per type per finished claim.
    pub dense_alloc: Vec<Option<[i64; 3]>>,
    /// The capacity types any offering of the pool's types has.
    pub capacity_types: Vec<crate::catalog::CapacityType>,
}

/// The resources of [`Template::dense_alloc`].
pub const DENSE: [ResourceName; 3] = [ResourceName::Cpu, ResourceName::Memory, ResourceName::Pods];

impl Template<'_> {
    /// Whether `requests` plus the daemon overhead of type `t`'s group fit on `t`; the same
    /// answer as `ResourceList::fits_in_with`, from a precomputed [`Need`].
    pub fn fits(&self, need: &Need, t: usize) -> bool {
        let Some(g) = self.group_of[t] else { return false };
        let Some(alloc) = &self.dense_alloc[t] else { return false };
        let (dense, rest) = &need.per_group[g];
        dense.iter().zip(alloc).all(|(n, a)| n <= a)
            && rest.iter().all(|(name, v)| *v <= self.instance_types[t].allocatable.get(name))
    }

    /// Whether `requests` alone fit on type `t` (`ResourceList::fits_in`).
    pub fn fits_plain(&self, need: &Split, t: usize) -> bool {
        let Some(alloc) = &self.dense_alloc[t] else { return false };
        need.0.iter().zip(alloc).all(|(n, a)| n <= a)
            && need.1.iter().all(|(name, v)| *v <= self.instance_types[t].allocatable.get(name))
    }

    /// Splits `requests` for [`Template::fits_plain`].
    pub fn need_plain(&self, requests: &ResourceList) -> Split {
        let dense = DENSE.map(|r| requests.get(&r));
        let rest = requests.iter().filter(|(n, v)| !DENSE.contains(n) && *v > 0).map(|(n, v)| (n.clone(), v)).collect();
        (dense, rest)
    }

    /// Precomputes `requests` plus each daemon group's overhead for [`Template::fits`].
    pub fn need(&self, requests: &ResourceList) -> Need {
        Need {
            per_group: self
                .daemon_groups
                .iter()
                .map(|g| {
                    let total = requests.merged(&g.overhead);
                    let dense = DENSE.map(|r| total.get(&r));
                    let rest = total
                        .iter()
                        .filter(|(n, v)| !DENSE.contains(n) && *v > 0)
                        .map(|(n, v)| (n.clone(), v))
                        .collect();
                    (dense, rest)
                })
                .collect(),
        }
    }
}

/// Requests plus each daemon group's overhead, split into the dense resources and the rest.
pub struct Need {
    per_group: Vec<Split>,
}

/// Amounts of the [`DENSE`] resources, and of the others.
pub type Split = ([i64; 3], Vec<(ResourceName, i64)>);

impl<'a> Template<'a> {
    /// Builds a template, or says why the pool can launch nothing.
    pub fn new(
        input: &'a PoolInput,
        pool_index: usize,
        daemonsets: &[Pod],
        min_values: MinValuesPolicy,
    ) -> Result<Template<'a>, String> {
        let pool = &input.pool;
        let mut requirements = pool.requirements.clone();
        let mut pool_labels = pool.labels.clone();
        pool_labels.insert(labels::NODEPOOL.to_string(), pool.name.clone());
        pool_labels.insert(labels::EC2NODECLASS.to_string(), pool.node_class.name.clone());
        requirements.add_all(&Requirements::from_labels(&pool_labels));
        requirements.add(labels::REGISTERED, Requirement::is_in(["true"]));
        requirements.add(labels::INITIALIZED, Requirement::is_in(["true"]));

        let all: Vec<usize> = (0..input.instance_types.len()).collect();
        let empty_group = [DaemonGroup { overhead: ResourceList::new(), host_ports: Vec::new(), types: all.clone() }];
        let group_of_all = vec![Some(0); input.instance_types.len()];
        let result = filter::filter_instance_types(&FilterInput {
            instance_types: &input.instance_types,
            candidates: &all,
            requirements: &requirements,
            pod_requests: &ResourceList::new(),
            total_requests: &ResourceList::new(),
            pod_ports: &[],
            claim_ports: &[],
            groups: &empty_group,
            group_of: &group_of_all,
            relax_min_values: min_values == MinValuesPolicy::BestEffort,
            base: None,
        });
        let types = match result {
            Ok(r) => r.types,
            Err(e) => {
                return Err(format!(
                    "nodepool {:?} skipped: its requirements filtered out all instance types ({e})",
                    pool.name
                ));
            }
        };

        let mut daemon_groups: Vec<DaemonGroup> = Vec::new();
        let mut keys: Vec<Vec<usize>> = Vec::new();
        let mut group_of = vec![None; input.instance_types.len()];
        for &t in &types {
            let it = &input.instance_types[t];
            let compatible: Vec<usize> = daemonsets
                .iter()
                .enumerate()
                .filter(|(_, ds)| daemon_compatible(pool, &requirements, it, ds))
                .map(|(i, _)| i)
                .collect();
            let g = match keys.iter().position(|k| *k == compatible) {
                Some(g) => g,
                None => {
                    let mut overhead = ResourceList::new();
                    let mut host_ports = Vec::new();
                    for &i in &compatible {
                        overhead.add(&daemonsets[i].requests_with_pod_slot());
                        host_ports.extend(daemonsets[i].host_ports.iter().cloned());
                    }
                    keys.push(compatible);
                    daemon_groups.push(DaemonGroup { overhead, host_ports, types: Vec::new() });
                    daemon_groups.len() - 1
                }
            };
            daemon_groups[g].types.push(t);
            group_of[t] = Some(g);
        }
        let dense_alloc = input
            .instance_types
            .iter()
            .map(|it| (!it.allocatable.iter().any(|(_, v)| v < 0)).then(|| DENSE.map(|r| it.allocatable.get(&r))))
            .collect();
        let mut capacity_types = Vec::new();
        for &t in &types {
            for o in &input.instance_types[t].offerings {
                if !capacity_types.contains(&o.capacity_type) {
                    capacity_types.push(o.capacity_type);
                }
            }
        }
        Ok(Template {
            capacity_types,
            pool,
            pool_index,
            instance_types: &input.instance_types,
            requirements,
            types,
            daemon_groups,
            group_of,
            dense_alloc,
        })
    }
}

fn prefer_no_schedule_toleration() -> Toleration {
    Toleration {
        key: String::new(),
        op: TolerationOp::Exists,
        value: String::new(),
        effect: Some(Effect::PreferNoSchedule),
    }
}

/// Whether a DaemonSet would run on this pool's nodes of this instance type (Karpenter's
/// `isDaemonPodCompatible`): its taints tolerated (PreferNoSchedule always is), and some
/// required node affinity term compatible with the pool and the type.
fn daemon_compatible(pool: &NodePool, pool_reqs: &Requirements, it: &InstanceType, ds: &Pod) -> bool {
    let mut tolerations = ds.tolerations.clone();
    tolerations.push(prefer_no_schedule_toleration());
    if !taints::tolerates_all(&pool.taints, &tolerations) {
        return false;
    }
    let mut view = PodView::new(ds);
    loop {
        let reqs = view.requirements(false);
        if pool_reqs.is_compatible(&reqs, true) && it.requirements.intersects_ok(&reqs) {
            return true;
        }
        if view.required_terms.len() > 1 {
            view.required_terms.remove(0);
        } else {
            return false;
        }
    }
}

/// Whether a DaemonSet would run on an existing node with these taints and labels.
pub fn daemon_fits_node(ds: &Pod, node_taints: &[Taint], node_reqs: &Requirements) -> bool {
    taints::tolerates_all(node_taints, &ds.tolerations)
        && node_reqs.is_compatible(&PodView::new(ds).requirements(false), false)
}
