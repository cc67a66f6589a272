//! The capacity an interrupted node's pods need, launched on the warning rather than after
//! the instance is gone: the provisioning solve places the nodes' reschedulable pods on the
//! cluster without those nodes (existing room first, as Karpenter's provisioner would once
//! they were pending), and the new claims it makes are the replacements. A replacement is
//! sized by its pods, not copied from the node it replaces.

use std::collections::{BTreeMap, BTreeSet, HashSet};

use crate::cluster::Snapshot;
use crate::disruption::candidates::is_reschedulable;
use crate::pod::Pod;
use crate::scheduling::{self, NewClaim, PoolInput, SolveOptions};

/// An interrupted node: its instance (what the ledger records) and its node's name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Going {
    pub instance: String,
    pub node: String,
}

/// What [`size`] found.
#[derive(Debug, Default)]
pub struct Sizing {
    /// New claims, each with the instances whose pods it takes.
    pub claims: Vec<(NewClaim, Vec<String>)>,
    /// Pods that fit on existing room (no new capacity needed for them).
    pub on_existing: usize,
    /// Pods no capacity can take, with why (they will be pending, as on Karpenter).
    pub unplaced: Vec<(String, String)>,
    /// NodePools that could not take part, and why.
    pub warnings: Vec<String>,
}

/// What else a sizing must leave alone.
#[derive(Debug, Default)]
pub struct Promised<'a> {
    /// Nodes interrupted earlier, whose pods were sized then: they take none of these pods,
    /// even when the snapshot does not show their taint yet.
    pub gone_before: BTreeSet<String>,
    /// NodeClaims launched as the earlier interruptions' replacements: their room is their
    /// pods', still bound on the nodes going (so it would look free).
    pub replacements: BTreeSet<String>,
    /// Pods planned onto capacity by the provisioner and not bound yet (the Router's holds:
    /// each pod and the node or NodeClaim it goes to): counted as bound there.
    pub held: &'a [(crate::pod::PodKey, String)],
}

/// Sizes the capacity for `going`'s pods: the cluster without those nodes (nor their pods)
/// and without what is `promised`, the NodePools `pools`, the pods placed by
/// [`scheduling::solve`]. The new claims keep the order the solve made them in.
pub fn size(
    snap: &Snapshot,
    pools: &[PoolInput],
    going: &[Going],
    promised: &Promised<'_>,
    opts: &SolveOptions,
) -> Sizing {
    let gone_before = &promised.gone_before;
    let nodes: BTreeSet<&str> = going.iter().map(|g| g.node.as_str()).collect();
    let instance_of: BTreeMap<&str, &str> = going.iter().map(|g| (g.node.as_str(), g.instance.as_str())).collect();
    // Their pods, unbound, with where each came from.
    let mut pods: Vec<Pod> = Vec::new();
    let mut from: Vec<&str> = Vec::new();
    for p in snap.pods.values() {
        let Some(node) = p.node_name.as_deref().filter(|n| nodes.contains(n)) else { continue };
        if !is_reschedulable(p) {
            continue;
        }
        pods.push(Pod { node_name: None, nominated_node: None, ..p.as_ref().clone() });
        from.push(instance_of.get(node).copied().unwrap_or_default());
    }
    if pods.is_empty() {
        return Sizing::default();
    }
    let capacity: Vec<_> = snap
        .capacity_nodes()
        .into_iter()
        .filter(|n| {
            !nodes.contains(n.name.as_str())
                && !gone_before.contains(&n.name)
                && !promised.replacements.contains(&n.name)
        })
        .collect();
    let held = snap.held_as_bound(promised.held, &HashSet::new(), &capacity);
    let mut input = snap.scheduling_input(capacity, pools.to_vec());
    let leaving: HashSet<&str> = nodes.iter().copied().chain(gone_before.iter().map(String::as_str)).collect();
    input.bound_pods.retain(|p| p.node_name.as_deref().is_none_or(|n| !leaving.contains(n)));
    input.bound_pods.extend(held);
    let results = scheduling::solve(&input, &pods, opts);
    let on_existing = results.existing.iter().map(|e| e.pods.len()).sum();
    let claims = results
        .claims
        .into_iter()
        .map(|c| {
            let serves: BTreeSet<String> = c.pods.iter().filter_map(|&i| from.get(i)).map(|s| s.to_string()).collect();
            (c, serves.into_iter().collect())
        })
        .collect();
    let unplaced =
        results.errors.into_iter().filter_map(|(i, why)| Some((pods.get(i)?.key.to_string(), why))).collect();
    Sizing { claims, on_existing, unplaced, warnings: results.warnings }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    use crate::catalog::{Catalog, NodeClassSettings};
    use crate::labels;
    use crate::node::Node;
    use crate::nodepool::NodePool;
    use crate::requirements::Requirements;
    use crate::resources::{ResourceList, ResourceName};

    const ZONE: &str = "us-east-1a";

    fn node(snap: &mut Snapshot, name: &str, pods: usize) {
        let n = Node {
            name: name.into(),
            labels: [
                (labels::NODEPOOL.to_string(), "default".to_string()),
                (labels::INSTANCE_TYPE.to_string(), "m5.large".to_string()),
                (labels::CAPACITY_TYPE.to_string(), "spot".to_string()),
                (labels::ZONE.to_string(), ZONE.to_string()),
            ]
            .into_iter()
            .collect(),
            allocatable: ResourceList::from_pairs([
                (ResourceName::Cpu, 1930),
                (ResourceName::Memory, 7 << 30),
                (ResourceName::Pods, 29),
            ]),
            initialized: true,
            ready: true,
            provider_id: Some(crate::lifecycle::provider_id(ZONE, &format!("i-{name}"))),
            ..Node::default()
        };
        snap.nodes.insert(name.into(), Arc::new(n));
        for i in 0..pods {
            let mut p = Pod::new("default", &format!("{name}-{i}"), ResourceList::cpu_mem(300, 256 << 20));
            p.node_name = Some(name.into());
            snap.pods.insert(p.key.clone(), Arc::new(p));
        }
    }

    fn pools() -> Vec<PoolInput> {
        let c = Catalog::embedded("us-east-1").expect("catalog");
        let types: Vec<_> = c
            .instance_types(&NodeClassSettings::default(), None)
            .into_iter()
            .filter(|t| t.name == "m5.large" || t.name == "m5.xlarge")
            .collect();
        vec![PoolInput { pool: NodePool::new("default", Requirements::new()), instance_types: Arc::new(types) }]
    }

    #[test]
    fn the_pods_go_to_existing_room_first_and_the_rest_to_new_claims_naming_their_instance_and_nodes_gone_before_take_none()
     {
        let mut snap = Snapshot::default();
        node(&mut snap, "a", 6);
        node(&mut snap, "b", 5);
        let going = [Going { instance: "i-a".into(), node: "a".into() }];
        let none = Promised::default();
        let s = size(&snap, &pools(), &going, &none, &SolveOptions::default());
        assert_eq!(s.on_existing, 1, "one 300m pod fits b's 430m");
        let on_new: usize = s.claims.iter().map(|(c, _)| c.pods.len()).sum();
        assert_eq!(on_new, 5);
        assert!(s.claims.iter().all(|(_, serves)| serves == &["i-a".to_string()]));
        assert!(s.unplaced.is_empty(), "{:?}", s.unplaced);
        // b interrupted in an earlier run (its taint not seen yet): a's pods all go to new claims.
        let b_gone = Promised { gone_before: BTreeSet::from(["b".to_string()]), ..Promised::default() };
        let s = size(&snap, &pools(), &going, &b_gone, &SolveOptions::default());
        assert_eq!(s.on_existing, 0);
        assert_eq!(s.claims.iter().map(|(c, _)| c.pods.len()).sum::<usize>(), 6);
        assert!(s.claims.iter().all(|(_, serves)| serves == &["i-a".to_string()]), "b's pods are not sized again");
        // Both going: nothing is left to fit on; b's pods are counted against b's instance.
        let both = [going[0].clone(), Going { instance: "i-b".into(), node: "b".into() }];
        let s = size(&snap, &pools(), &both, &none, &SolveOptions::default());
        assert_eq!(s.on_existing, 0);
        assert_eq!(s.claims.iter().map(|(c, _)| c.pods.len()).sum::<usize>(), 11);
        let served: BTreeSet<&str> = s.claims.iter().flat_map(|(_, v)| v.iter().map(String::as_str)).collect();
        assert_eq!(served, ["i-a", "i-b"].into_iter().collect());
        assert!(size(&snap, &pools(), &[], &none, &SolveOptions::default()).claims.is_empty());
    }

    /// An in-flight NodeClaim with room for six 300m pods (not joined: no node yet).
    fn in_flight(snap: &mut Snapshot, name: &str) {
        use crate::cluster::{NodeClaim, NodeClaimStatus};
        use crate::nodepool::NodeClaimSpec;
        let c = NodeClaim {
            name: name.into(),
            spec: NodeClaimSpec {
                nodepool: "default".into(),
                labels: [(labels::NODEPOOL.to_string(), "default".to_string())].into_iter().collect(),
                requests: ResourceList::from_pairs([
                    (ResourceName::Cpu, 1930),
                    (ResourceName::Memory, 7 << 30),
                    (ResourceName::Pods, 29),
                ]),
                ..NodeClaimSpec::default()
            },
            finalizers: Vec::new(),
            deleting: false,
            status: NodeClaimStatus::default(),
            resource_version: 1,
            created: None,
        };
        snap.nodeclaims.insert(name.into(), Arc::new(c));
    }

    /// Room already promised is not free: an earlier interruption's replacement (its pods
    /// still bound on the node going) takes none of these pods, and a pod the provisioner
    /// holds on an in-flight claim keeps its room there.
    #[test]
    fn an_earlier_replacement_and_held_pods_keep_their_room() {
        let mut snap = Snapshot::default();
        node(&mut snap, "a", 6);
        in_flight(&mut snap, "r-b");
        let going = [Going { instance: "i-a".into(), node: "a".into() }];
        let free = size(&snap, &pools(), &going, &Promised::default(), &SolveOptions::default());
        assert_eq!(free.on_existing, 6, "without promises the claim looks free");
        let replacement = Promised { replacements: BTreeSet::from(["r-b".to_string()]), ..Promised::default() };
        let s = size(&snap, &pools(), &going, &replacement, &SolveOptions::default());
        assert_eq!(s.on_existing, 0, "b's replacement is b's pods'");
        assert_eq!(s.claims.iter().map(|(c, _)| c.pods.len()).sum::<usize>(), 6);
        // A pending pod of 1500m held on r-b: one of a's pods fits beside it.
        let held_pod = Pod::new("default", "held", ResourceList::cpu_mem(1500, 256 << 20));
        snap.pods.insert(held_pod.key.clone(), Arc::new(held_pod.clone()));
        let held = [(held_pod.key.clone(), "r-b".to_string())];
        let s =
            size(&snap, &pools(), &going, &Promised { held: &held, ..Promised::default() }, &SolveOptions::default());
        assert_eq!(s.on_existing, 1, "430m left beside the held pod");
    }
}
