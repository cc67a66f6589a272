//! What a launched instance registers as when the sim plays its kubelet: the node is named
//! after the instance, its provider id is `aws:///<zone>/<id>`, and it carries the instance's
//! labels, capacity and allocatable. Used by `simulate`, the benchmarks and the tests.

use dovetail_cloud::Instance;
use dovetail_cluster::sim::Registration;

/// The provider id Karpenter's AWS provider writes for an instance.
pub fn provider_id(inst: &Instance) -> String {
    dovetail_core::lifecycle::provider_id(&inst.zone, &inst.id)
}

/// The registration of every instance launched for a NodeClaim (untagged ones are not ours).
pub fn registrations(instances: &[Instance]) -> Vec<Registration> {
    instances
        .iter()
        .filter_map(|inst| {
            Some(Registration {
                claim: inst.claim.clone()?,
                node_name: format!("ip-{}", inst.id),
                provider_id: provider_id(inst),
                labels: inst.labels.clone(),
                capacity: inst.capacity.clone(),
                allocatable: inst.allocatable.clone(),
            })
        })
        .collect()
}
