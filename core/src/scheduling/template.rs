//! NodeClaim templates (one per NodePool) and DaemonSet overhead groups.

use crate::catalog::InstanceType;
use crate::labels;
use crate::nodepool::NodePool;
use crate::pod::{HostPort, Pod};
use crate::requirements::{Requirement, Requirements};
use crate::resources::ResourceList;
use crate::taints::{self, Effect, Taint, Toleration, TolerationOp};

use super::filter::{self, FilterInput};
use super::view::PodView;
use super::{MinValuesPolicy, PoolInput};

/// Instance types of a template that the same set of DaemonSets would run on.
#[derive(Clone, Debug)]
pub struct DaemonGroup {
    /// Summed requests of the DaemonSets (with `pods`), empty when there are none.
    pub overhead: ResourceList,
    pub host_ports: Vec<HostPort>,
    /// Indices into the pool's instance types.
    pub types: Vec<usize>,
}

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
}

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
        Ok(Template {
            pool,
            pool_index,
            instance_types: &input.instance_types,
            requirements,
            types,
            daemon_groups,
            group_of,
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
