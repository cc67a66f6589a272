//! A NodePool's provisioning round as a planner: from the pods the Router handed the pool
//! and the cluster as it is, the claims to reserve in the ledger, each with its NodeClaim
//! object, and the pods it could not place.
//!
//! The solve sees the whole cluster (existing nodes, in-flight NodeClaims and their bound
//! pods), so zone spread, pod affinity and anti-affinity against running pods hold for the
//! new claims; offerings the ledger marks unavailable (insufficient capacity) are not
//! offered to it, so a round does not pick an exhausted offering again. Claims are named
//! as Karpenter names NodeClaims, by [`Names`]; an id the ledger refuses as live already is
//! renamed with [`rename`].

use std::collections::BTreeSet;
use std::sync::Arc;

use crate::catalog::InstanceType;
use crate::cluster::{NodeClaim, NodeClaimStatus, Snapshot, TERMINATION_FINALIZER};
use crate::ledger::{ClaimRequest, Offering};
use crate::plane::{Names, plan_claim};
use crate::pod::Pod;
use crate::scheduling::{self, NewClaim, PoolInput, SolveOptions};

/// What a round reads.
pub struct RoundInput<'a> {
    /// The pool, its requirements narrowed to the zones it launches in.
    pub pool: &'a PoolInput,
    pub cluster: &'a Snapshot,
    /// The pods to place.
    pub pods: &'a [Pod],
    /// The zones the plane launches in.
    pub zones: &'a [String],
    /// Offerings the ledger marks unavailable now.
    pub unavailable: &'a BTreeSet<Offering>,
    pub opts: &'a SolveOptions,
}

/// A claim of the round.
#[derive(Clone, Debug, PartialEq)]
pub struct PlannedClaim {
    pub reserve: ClaimRequest,
    pub nodeclaim: NodeClaim,
    /// Its pods (indices into the round's).
    pub pods: Vec<usize>,
}

/// The round's plan.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Round {
    pub claims: Vec<PlannedClaim>,
    /// Pods that fit existing or in-flight capacity: left to the scheduler.
    pub on_existing: Vec<usize>,
    /// Pods no claim could be made for, with why.
    pub unplaced: Vec<(usize, String)>,
}

/// The pool's types with the offerings the ledger marks unavailable taken out (shared when
/// none of them is marked).
pub fn available_types(types: &Arc<Vec<InstanceType>>, unavailable: &BTreeSet<Offering>) -> Arc<Vec<InstanceType>> {
    let marked = |t: &InstanceType, o: &crate::catalog::Offering| {
        unavailable.contains(&Offering {
            instance_type: t.name.clone(),
            zone: o.zone.clone(),
            capacity_type: o.capacity_type,
        })
    };
    if unavailable.is_empty() || !types.iter().any(|t| t.offerings.iter().any(|o| o.available && marked(t, o))) {
        return types.clone();
    }
    let mut out: Vec<InstanceType> = types.as_ref().clone();
    for t in &mut out {
        let name = t.name.clone();
        for o in &mut t.offerings {
            if unavailable.contains(&Offering {
                instance_type: name.clone(),
                zone: o.zone.clone(),
                capacity_type: o.capacity_type,
            }) {
                o.available = false;
            }
        }
    }
    Arc::new(out)
}

/// Plans one round.
pub fn plan_round(input: &RoundInput<'_>, names: &mut Names) -> Round {
    let pool = PoolInput {
        pool: input.pool.pool.clone(),
        instance_types: available_types(&input.pool.instance_types, input.unavailable),
    };
    // Existing nodes and in-flight claims count for topology (spread, affinity over running
    // pods) but take no new pod: the Router placed on them what fits already, and an
    // in-flight claim's room is its own pods' (they are pending, not bound, so it would look
    // empty here).
    let nodes: Vec<crate::node::Node> =
        input.cluster.capacity_nodes().into_iter().map(|n| crate::node::Node { unschedulable: true, ..n }).collect();
    let snapshot = input.cluster.scheduling_input(nodes, vec![pool.clone()]);
    let results = scheduling::solve(&snapshot, input.pods, input.opts);
    let mut round = Round {
        on_existing: results.existing.iter().flat_map(|e| e.pods.iter().copied()).collect(),
        unplaced: results.errors.iter().map(|(i, why)| (*i, why.clone())).collect(),
        claims: Vec::new(),
    };
    // Names drawn this round: 5 characters of 27 collide now and then in a round of
    // thousands of claims, and the ledger grants an id once.
    let mut taken: BTreeSet<String> = BTreeSet::new();
    for c in &results.claims {
        let id = unique_claim_name(names, &pool.pool.name, |id| {
            taken.contains(id) || input.cluster.nodeclaims.contains_key(id)
        });
        let Some(planned) = planned_claim(c, &pool, input.zones, id.clone()) else {
            let why = "no zone the plane launches in offers its instance types".to_string();
            round.unplaced.extend(c.pods.iter().map(|&p| (p, why.clone())));
            continue;
        };
        taken.insert(id);
        round.claims.push(planned);
    }
    round
}

/// A solver's claim as the ledger reserves it and the cluster holds it, named `id`; `None`
/// when no zone of `zones` offers its instance types.
pub fn planned_claim(c: &NewClaim, pool: &PoolInput, zones: &[String], id: String) -> Option<PlannedClaim> {
    let spec = c.to_spec(pool);
    let plan = plan_claim(c, &spec, &pool.instance_types, zones)?;
    Some(PlannedClaim {
        reserve: ClaimRequest {
            id: id.clone(),
            zone: plan.zone,
            resources: plan.resources,
            price_per_hour: plan.price_per_hour,
        },
        nodeclaim: NodeClaim {
            name: id,
            spec,
            finalizers: vec![TERMINATION_FINALIZER.to_string()],
            deleting: false,
            status: NodeClaimStatus::default(),
            resource_version: 0,
            created: None,
        },
        pods: c.pods.clone(),
    })
}

/// A claim name `taken` does not hold. Bounded: past 64 draws (a pool of millions of
/// claims) the last one is returned, and the ledger refuses it if it is live.
pub fn unique_claim_name(names: &mut Names, pool: &str, taken: impl Fn(&str) -> bool) -> String {
    let mut id = names.claim(pool);
    for _ in 0..64 {
        if !taken(&id) {
            break;
        }
        id = names.claim(pool);
    }
    id
}

/// Gives the claims whose ids the ledger refused as live a new name, unique among the
/// claims and not one `in_cluster` says a NodeClaim has (one being deleted keeps its name a
/// while after the ledger forgot it), and keeps the others.
pub fn rename(
    claims: &mut [PlannedClaim],
    refused: &BTreeSet<String>,
    names: &mut Names,
    in_cluster: impl Fn(&str) -> bool,
) {
    // Every id the claims hold now, the refused ones included (they stay taken once renamed).
    let mut taken: BTreeSet<String> = claims.iter().map(|c| c.reserve.id.clone()).collect();
    for c in claims.iter_mut().filter(|c| refused.contains(&c.reserve.id)) {
        let id = unique_claim_name(names, &c.nodeclaim.spec.nodepool, |id| taken.contains(id) || in_cluster(id));
        taken.insert(id.clone());
        c.reserve.id = id.clone();
        c.nodeclaim.name = id;
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::catalog::{CapacityType, Catalog, NodeClassSettings};
    use crate::labels;
    use crate::node::Node;
    use crate::nodepool::NodePool;
    use crate::pod::{PodAffinity, PodAffinityTerm, TopologySpreadConstraint, WhenUnsatisfiable};
    use crate::requirements::{Requirement, Requirements};
    use crate::resources::ResourceList;

    fn pool() -> PoolInput {
        let c = Catalog::embedded("us-east-1").expect("catalog");
        let types: Vec<InstanceType> = c
            .instance_types(&NodeClassSettings::default(), None)
            .into_iter()
            .filter(|t| t.name.starts_with("m5."))
            .collect();
        let mut reqs = Requirements::new();
        reqs.add(labels::CAPACITY_TYPE, Requirement::is_in(["on-demand"]));
        reqs.add(labels::ZONE, Requirement::is_in(["us-east-1a", "us-east-1b"]));
        PoolInput { pool: NodePool::new("default", reqs), instance_types: Arc::new(types) }
    }

    fn zones() -> Vec<String> {
        vec!["us-east-1a".into(), "us-east-1b".into()]
    }

    fn web(name: &str) -> Pod {
        let mut p = Pod::new("default", name, ResourceList::cpu_mem(1000, 1 << 30));
        p.labels.insert("app".into(), "web".into());
        p
    }

    /// A node in `zone` running `pods`.
    fn running(snap: &mut Snapshot, zone: &str, pods: Vec<Pod>) {
        let name = format!("node-{zone}");
        let node = Node {
            name: name.clone(),
            labels: crate::node::NodeLabels::from([
                (labels::ZONE.to_string(), zone.to_string()),
                (labels::HOSTNAME.to_string(), name.clone()),
                (labels::INSTANCE_TYPE.to_string(), "m5.large".to_string()),
            ]),
            allocatable: ResourceList::from_pairs([
                (crate::resources::ResourceName::Cpu, 1930),
                (crate::resources::ResourceName::Memory, 7 << 30),
                (crate::resources::ResourceName::Pods, 29),
            ]),
            initialized: true,
            ready: true,
            ..Node::default()
        };
        // Full: nothing more fits on it.
        let mut filler = Pod::new("default", &format!("filler-{zone}"), ResourceList::cpu_mem(1900, 1 << 30));
        filler.node_name = Some(name.clone());
        snap.pods.insert(filler.key.clone(), Arc::new(filler));
        for mut p in pods {
            p.node_name = Some(name.clone());
            snap.pods.insert(p.key.clone(), Arc::new(p));
        }
        snap.nodes.insert(name, Arc::new(node));
    }

    #[test]
    fn a_zone_spread_counts_the_running_pods() {
        // Two web pods run in us-east-1a; a zone spread of max skew 1 puts the new ones in b.
        let mut snap = Snapshot::default();
        running(&mut snap, "us-east-1a", vec![web("web-0"), web("web-1")]);
        let spread = TopologySpreadConstraint {
            max_skew: 1,
            topology_key: labels::ZONE.into(),
            when_unsatisfiable: WhenUnsatisfiable::DoNotSchedule,
            selector: Some(crate::labels::LabelSelector::new(
                BTreeMap::from([("app".into(), "web".into())]),
                Vec::new(),
            )),
            min_domains: None,
            node_affinity_policy: None,
            node_taints_policy: None,
            match_label_keys: Vec::new(),
        };
        let pods: Vec<Pod> = (2..4)
            .map(|i| {
                let mut p = web(&format!("web-{i}"));
                p.topology_spread = vec![spread.clone()].into();
                p
            })
            .collect();
        let pool = pool();
        let zones = zones();
        let input = RoundInput {
            pool: &pool,
            cluster: &snap,
            pods: &pods,
            zones: &zones,
            unavailable: &BTreeSet::new(),
            opts: &SolveOptions::default(),
        };
        let round = plan_round(&input, &mut Names::new(1));
        assert!(round.unplaced.is_empty(), "{:?}", round.unplaced);
        for c in &round.claims {
            assert_eq!(c.reserve.zone, "us-east-1b", "{:?}", c.reserve);
        }
        assert_eq!(round.claims.iter().map(|c| c.pods.len()).sum::<usize>(), 2);
    }

    #[test]
    fn anti_affinity_against_running_pods_holds_for_new_claims() {
        let mut snap = Snapshot::default();
        running(&mut snap, "us-east-1a", vec![web("web-0")]);
        // A pod anti-affine (by zone) to web pods: not in us-east-1a.
        let mut p = Pod::new("default", "loner", ResourceList::cpu_mem(500, 1 << 30));
        p.pod_anti_affinity = PodAffinity {
            required: vec![PodAffinityTerm {
                selector: Some(crate::labels::LabelSelector::new(
                    BTreeMap::from([("app".into(), "web".into())]),
                    Vec::new(),
                )),
                namespaces: Vec::new(),
                namespace_selector: None,
                topology_key: labels::ZONE.into(),
            }],
            ..PodAffinity::default()
        }
        .into();
        let pods = vec![p];
        let pool = pool();
        let zones = zones();
        let input = RoundInput {
            pool: &pool,
            cluster: &snap,
            pods: &pods,
            zones: &zones,
            unavailable: &BTreeSet::new(),
            opts: &SolveOptions::default(),
        };
        let round = plan_round(&input, &mut Names::new(1));
        assert_eq!(round.claims.len(), 1, "{round:?}");
        assert_eq!(round.claims[0].reserve.zone, "us-east-1b");
    }

    #[test]
    fn ice_marks_are_respected_on_the_first_choice() {
        let snap = Snapshot::default();
        let pods = vec![web("web-0")];
        let pool = pool();
        let zones = zones();
        // Every m5 offering in us-east-1a is out of capacity.
        let unavailable: BTreeSet<Offering> = pool
            .instance_types
            .iter()
            .map(|t| Offering {
                instance_type: t.name.clone(),
                zone: "us-east-1a".into(),
                capacity_type: CapacityType::OnDemand,
            })
            .collect();
        let input = RoundInput {
            pool: &pool,
            cluster: &snap,
            pods: &pods,
            zones: &zones,
            unavailable: &unavailable,
            opts: &SolveOptions::default(),
        };
        let round = plan_round(&input, &mut Names::new(1));
        assert_eq!(round.claims.len(), 1);
        assert_eq!(round.claims[0].reserve.zone, "us-east-1b");
        assert!(round.claims[0].nodeclaim.name.starts_with("default-"));
        assert_eq!(round.claims[0].nodeclaim.finalizers, vec![TERMINATION_FINALIZER.to_string()]);
    }

    /// A round of one web pod over `snap`, with no offering marked.
    fn web_round(snap: &Snapshot, names: &mut Names) -> Round {
        let pods = vec![web("web-0")];
        let (pool, zones) = (pool(), zones());
        let input = RoundInput {
            pool: &pool,
            cluster: snap,
            pods: &pods,
            zones: &zones,
            unavailable: &BTreeSet::new(),
            opts: &SolveOptions::default(),
        };
        plan_round(&input, names)
    }

    #[test]
    fn refused_ids_are_renamed() {
        let mut names = Names::new(1);
        let mut round = web_round(&Snapshot::default(), &mut names);
        let old = round.claims[0].reserve.id.clone();
        rename(&mut round.claims, &BTreeSet::from([old.clone()]), &mut names, |_| false);
        assert_ne!(round.claims[0].reserve.id, old);
        assert_eq!(round.claims[0].reserve.id, round.claims[0].nodeclaim.name);
    }

    #[test]
    fn a_renamed_claim_does_not_take_the_name_of_a_nodeclaim_still_in_the_cluster() {
        let mut names = Names::new(1);
        let mut round = web_round(&Snapshot::default(), &mut names);
        let old = round.claims[0].reserve.id.clone();
        // The next draw names a NodeClaim still being deleted: the rename draws again.
        let held = names.clone().claim("default");
        rename(&mut round.claims, &BTreeSet::from([old.clone()]), &mut names, |id| id == held);
        assert_ne!(round.claims[0].reserve.id, old);
        assert_ne!(round.claims[0].reserve.id, held);
    }

    #[test]
    fn a_name_drawn_twice_is_drawn_again() {
        let first = Names::new(5).claim("default");
        let id = unique_claim_name(&mut Names::new(5), "default", |id| id == first);
        assert_ne!(id, first);
        assert!(id.starts_with("default-"));
    }

    #[test]
    fn claims_sharing_a_refused_id_get_distinct_names() {
        let mut names = Names::new(1);
        let mut round = web_round(&Snapshot::default(), &mut names);
        let twin = round.claims[0].clone();
        round.claims.push(twin.clone());
        // A third claim holds the name the next draw makes: the rename must not take it.
        let next = names.clone().claim("default");
        let mut third = twin;
        third.reserve.id = next.clone();
        third.nodeclaim.name = next.clone();
        round.claims.push(third);
        let old = round.claims[0].reserve.id.clone();
        rename(&mut round.claims, &BTreeSet::from([old.clone()]), &mut names, |_| false);
        let ids: BTreeSet<&String> = round.claims.iter().map(|c| &c.reserve.id).collect();
        assert_eq!(ids.len(), 3, "three distinct names: {ids:?}");
        assert!(!ids.contains(&old));
        assert_eq!(round.claims[2].reserve.id, next, "the claim not refused keeps its name");
    }

    #[test]
    fn a_round_skips_names_of_nodeclaims_in_the_view() {
        let taken = Names::new(1).claim("default");
        let mut snap = Snapshot::default();
        let round = web_round(&snap, &mut Names::new(1));
        assert_eq!(round.claims[0].reserve.id, taken, "the same seed draws the same name");
        snap.nodeclaims.insert(taken.clone(), Arc::new(round.claims[0].nodeclaim.clone()));
        let again = web_round(&snap, &mut Names::new(1));
        assert_ne!(again.claims[0].reserve.id, taken);
    }
}
