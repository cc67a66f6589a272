//! The simulation's promises, as properties over random clusters (nodes of four types in
//! three zones and a fourth no NodePool offers, some still booting, in an untainted pool and
//! a tainted one; pods with zone and hostname spread, a zone spread honouring taints, zone
//! affinity, zone and hostname anti-affinity, and tolerating the taint; pending pods; a pool
//! limit):
//!
//! - a move tried after any number of others decides exactly as on a state built from
//!   scratch for it;
//! - a node taken out is as a node the cluster never had;
//! - a move tried after others were kept decides as on the cluster where they were made.

use std::sync::{Arc, OnceLock};

use proptest::prelude::*;

use super::*;
use crate::catalog::{Catalog, InstanceType, NodeClassSettings};
use crate::cluster::{NodeClaim, NodeClaimStatus};
use crate::labels::{self, LabelSelector};
use crate::nodepool::{NodeClaimSpec, NodePool};
use crate::pod::{PodAffinityTerm, TopologySpreadConstraint, WhenUnsatisfiable};
use crate::requirements::{Requirement, Requirements};
use crate::resources::{ResourceList, ResourceName};

const TYPES: [&str; 4] = ["m5.large", "m5.xlarge", "c5.xlarge", "r5.large"];
/// The pools offer the first three; nodes may also be in the fourth (a domain no seed knows).
const ZONES: [&str; 4] = ["us-east-1a", "us-east-1b", "us-east-1c", "us-east-1d"];
const TAINT: &str = "dedicated";

fn types() -> &'static Arc<Vec<InstanceType>> {
    static TYPES_: OnceLock<Arc<Vec<InstanceType>>> = OnceLock::new();
    TYPES_.get_or_init(|| {
        let c = Catalog::embedded("us-east-1").expect("catalog");
        let all = c.instance_types(&NodeClassSettings::default(), None);
        Arc::new(all.into_iter().filter(|t| TYPES.contains(&t.name.as_str())).collect())
    })
}

/// A random pod: (cpu index, memory index, app, kind) where kind 0 is plain, 1 zone spread,
/// 2 hostname spread, 3 zone affinity, 4 zone anti-affinity, 5 hostname anti-affinity, 6 a
/// zone spread honouring taints (`nodeTaintsPolicy: Honor`), 7 plain and tolerating the
/// tainted pool's taint.
type PodSpec = (usize, usize, u8, u8);

fn pod(name: &str, (cpu, mem, app, kind): PodSpec) -> Pod {
    let cpus = [100, 250, 500, 1000];
    let mems = [128, 512, 1024, 2048];
    let mut p = Pod::new("default", name, ResourceList::cpu_mem(cpus[cpu % 4], mems[mem % 4] << 20));
    let app = format!("app{}", app % 3);
    p.labels.insert("app".into(), app.clone());
    let selector = Some(LabelSelector::from_labels([("app", app.as_str())]));
    let term = |key: &str| PodAffinityTerm {
        selector: selector.clone(),
        namespaces: Vec::new(),
        namespace_selector: None,
        topology_key: key.to_string(),
    };
    let spread = |key: &str| TopologySpreadConstraint {
        max_skew: 1,
        topology_key: key.to_string(),
        when_unsatisfiable: WhenUnsatisfiable::DoNotSchedule,
        selector: selector.clone(),
        min_domains: None,
        node_affinity_policy: None,
        node_taints_policy: None,
        match_label_keys: Vec::new(),
    };
    match kind % 8 {
        1 => p.topology_spread.push(spread(labels::ZONE)),
        6 => p.topology_spread.push(TopologySpreadConstraint {
            node_taints_policy: Some(crate::pod::InclusionPolicy::Honor),
            ..spread(labels::ZONE)
        }),
        7 => p.tolerations.push(crate::taints::Toleration::exists(TAINT, None)),
        2 => p.topology_spread.push(spread(labels::HOSTNAME)),
        3 => p.pod_affinity.required.push(term(labels::ZONE)),
        4 => p.pod_anti_affinity.required.push(term(labels::ZONE)),
        5 => p.pod_anti_affinity.required.push(term(labels::HOSTNAME)),
        _ => {}
    }
    p
}

/// A node: (type index, zone index, initialized, in the tainted pool, its pods).
type NodeSpec = (usize, usize, bool, bool, Vec<PodSpec>);

fn taint() -> crate::taints::Taint {
    crate::taints::Taint { key: TAINT.into(), value: "x".into(), effect: crate::taints::Effect::NoSchedule }
}

struct World {
    snap: Snapshot,
    pools: Vec<PoolInput>,
    /// Each node's claim id and name, with its pods.
    nodes: Vec<(String, String, Vec<Arc<Pod>>)>,
}

fn world(nodes: &[NodeSpec], pending: &[PodSpec], limit_cpu: Option<i64>) -> World {
    let mut snap = Snapshot::default();
    let pool = |name: &str| {
        let mut pool = NodePool::new(name, Requirements::new());
        pool.requirements.add(labels::ZONE, Requirement::is_in(ZONES[..3].iter().copied()));
        pool.requirements.add(labels::CAPACITY_TYPE, Requirement::is_in(["on-demand"]));
        if let Some(cpu) = limit_cpu {
            pool.limits = ResourceList::from_pairs([(ResourceName::Cpu, cpu * 1000)]);
        }
        pool
    };
    let (untainted, mut tainted) = (pool("default"), pool("tainted"));
    tainted.taints.push(taint());
    let mut out = Vec::new();
    for (i, (t, z, initialized, in_tainted, pods)) in nodes.iter().enumerate() {
        let t = &types()[t % types().len()];
        let zone = ZONES[z % 4];
        let pool_name = if *in_tainted { "tainted" } else { "default" };
        let name = format!("node-{i}");
        let claim = format!("claim-{i}");
        let provider = crate::lifecycle::provider_id(zone, &format!("i-{i}"));
        let mut labels: crate::labels::Labels = [
            (labels::NODEPOOL.to_string(), pool_name.to_string()),
            (labels::INSTANCE_TYPE.to_string(), t.name.clone()),
            (labels::CAPACITY_TYPE.to_string(), "on-demand".to_string()),
            (labels::ZONE.to_string(), zone.to_string()),
            (labels::HOSTNAME.to_string(), name.clone()),
        ]
        .into_iter()
        .collect();
        if *initialized {
            labels.insert(labels::INITIALIZED.to_string(), "true".to_string());
        }
        let node = Node {
            name: name.clone(),
            labels: labels.into(),
            capacity: t.capacity.clone(),
            allocatable: t.allocatable.clone(),
            initialized: *initialized,
            ready: true,
            provider_id: Some(provider.clone()),
            taints: if *in_tainted { vec![taint()] } else { Vec::new() },
            ..Node::default()
        };
        snap.nodes.insert(name.clone(), Arc::new(node));
        let nc = NodeClaim {
            name: claim.clone(),
            spec: NodeClaimSpec { nodepool: pool_name.into(), ..NodeClaimSpec::default() },
            finalizers: Vec::new(),
            deleting: false,
            status: NodeClaimStatus {
                provider_id: Some(provider),
                node_name: Some(name.clone()),
                ..NodeClaimStatus::default()
            },
            resource_version: 1,
            created: None,
        };
        snap.nodeclaims.insert(claim.clone(), Arc::new(nc));
        let mut bound = Vec::new();
        for (k, spec) in pods.iter().enumerate() {
            let mut p = pod(&format!("p-{i}-{k}"), *spec);
            p.node_name = Some(name.clone());
            let p = Arc::new(p);
            snap.pods.insert(p.key.clone(), p.clone());
            bound.push(p);
        }
        out.push((claim, name, bound));
    }
    for (k, spec) in pending.iter().enumerate() {
        let mut p = pod(&format!("pending-{k}"), *spec);
        p.unschedulable = true;
        snap.pods.insert(p.key.clone(), Arc::new(p));
    }
    let pools = [untainted, tainted].into_iter().map(|pool| PoolInput { pool, instance_types: types().clone() });
    World { snap, pools: pools.collect(), nodes: out }
}

/// A new claim in names: its pool, instance types, pods and launch (type, zone, price).
type ClaimSummary = (usize, Vec<u32>, Vec<String>, Option<(usize, String, u64)>);

/// An outcome in names: what two simulations must agree on.
#[derive(Debug, PartialEq)]
struct Summary {
    errors: Vec<(String, String)>,
    existing: Vec<(String, Vec<String>)>,
    claims: Vec<ClaimSummary>,
}

fn summary(o: &Outcome) -> Summary {
    let key = |i: &usize| o.pod(*i).map(|p| p.key.to_string()).unwrap_or_default();
    let mut existing: Vec<(String, Vec<String>)> = o
        .results
        .existing
        .iter()
        .zip(&o.existing_nodes)
        .map(|(e, n)| {
            let mut pods: Vec<String> = e.pods.iter().map(key).collect();
            pods.sort();
            (n.clone(), pods)
        })
        .collect();
    existing.sort();
    let claims = o
        .results
        .claims
        .iter()
        .map(|c| {
            let mut pods: Vec<String> = c.pods.iter().map(key).collect();
            pods.sort();
            let launch = c.launch.as_ref().map(|l| (l.instance_type, l.zone.clone(), (l.price * 1e6) as u64));
            (c.pool, c.instance_types.clone(), pods, launch)
        })
        .collect();
    Summary { errors: o.results.errors.iter().map(|(i, e)| (key(i), e.clone())).collect(), existing, claims }
}

fn pod_spec() -> impl Strategy<Value = PodSpec> {
    (0..4usize, 0..4usize, 0..3u8, 0..8u8)
}

fn node_spec() -> impl Strategy<Value = NodeSpec> {
    node_with_pods(0..5)
}

/// A node of any type, in any zone (the fourth, which no pool offers, one time in five),
/// mostly initialized, in the tainted pool one time in four, with `pods` pods.
fn node_with_pods(pods: std::ops::Range<usize>) -> impl Strategy<Value = NodeSpec> {
    (
        0..4usize,
        prop_oneof![4 => 0..3usize, 1 => Just(3usize)],
        prop::bool::weighted(0.85),
        prop::bool::weighted(0.25),
        prop::collection::vec(pod_spec(), pods),
    )
}

/// Each node's pods as a mover borrows them.
fn refs(w: &World) -> Vec<Vec<&Arc<Pod>>> {
    w.nodes.iter().map(|(_, _, pods)| pods.iter().collect()).collect()
}

fn movers<'a>(w: &'a World, refs: &'a [Vec<&'a Arc<Pod>>]) -> Vec<Mover<'a>> {
    w.nodes.iter().zip(refs).map(|((claim, node, _), pods)| Mover { claim, node, pods }).collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn a_move_tried_after_others_decides_as_on_a_state_built_for_it(
        nodes in prop::collection::vec(node_spec(), 2..9),
        pending in prop::collection::vec(pod_spec(), 0..4),
        limit in prop::option::of(4i64..40),
        moves in prop::collection::vec(prop::collection::btree_set(0..9usize, 1..4), 1..8),
    ) {
        let w = world(&nodes, &pending, limit);
        let r = refs(&w);
        let all = movers(&w, &r);
        let prepared = Prepared::new(&w.snap, &w.pools, &all, &SolveOptions::default());
        let mut sim = prepared.simulation();
        for m in moves {
            let names: Vec<&str> = m.iter().filter_map(|i| w.nodes.get(*i)).map(|(c, _, _)| c.as_str()).collect();
            if names.is_empty() {
                continue;
            }
            let tried = sim.try_move(&names).map(|o| summary(&o));
            let built = fresh(&prepared, &names).map(|o| summary(&o));
            prop_assert_eq!(tried, built, "move {:?}", names);
        }
    }

    #[test]
    fn a_node_taken_out_is_as_a_node_the_cluster_never_had(
        nodes in prop::collection::vec(node_spec(), 2..9),
        limit in prop::option::of(4i64..40),
        moves in prop::collection::vec(prop::collection::btree_set(0..9usize, 1..4), 1..6),
    ) {
        let w = world(&nodes, &[], limit);
        let r = refs(&w);
        let all = movers(&w, &r);
        let opts = SolveOptions::default();
        let prepared = Prepared::new(&w.snap, &w.pools, &all, &opts);
        let mut sim = prepared.simulation();
        for m in moves {
            let names: Vec<&str> = m.iter().filter_map(|i| all.get(*i)).map(|c| c.claim).collect();
            if names.is_empty() {
                continue;
            }
            let tried = sim.try_move(&names).map(|o| summary(&o));
            let never = prepared.without(&names).map(|o| summary(&o));
            prop_assert_eq!(tried, never, "move {:?}", names);
        }
    }

    #[test]
    fn a_move_tried_after_others_were_kept_decides_as_on_the_cluster_where_they_were_made(
        nodes in prop::collection::vec(node_spec(), 3..9),
        kept in prop::collection::vec(prop::collection::btree_set(0..9usize, 1..3), 1..3),
        moves in prop::collection::vec(prop::collection::btree_set(0..9usize, 1..3), 1..5),
    ) {
        // No pending pods (they were placed before the moves were kept) and no limit (a kept
        // move's candidates still hold theirs).
        let w = world(&nodes, &[], None);
        let r = refs(&w);
        let all = movers(&w, &r);
        let opts = SolveOptions::default();
        let prepared = Prepared::new(&w.snap, &w.pools, &all, &opts);
        let mut sim = prepared.simulation();
        // The cluster as the kept moves leave it: their nodes gone, their pods where they went.
        let mut made = w.snap.clone();
        for k in kept {
            let names: Vec<&str> = k.iter().filter_map(|i| all.get(*i)).map(|c| c.claim).collect();
            let Ok(outcome) = sim.try_move(&names) else { continue };
            // Only moves onto existing nodes: a kept move's new nodes are not in the cluster.
            if !outcome.results.errors.is_empty() || !outcome.results.claims.is_empty() {
                continue;
            }
            let placed = sim.keep(&names).map_err(TestCaseError::fail)?;
            for m in k.iter().filter_map(|i| all.get(*i)) {
                made.nodes.remove(m.node);
                made.nodeclaims.remove(m.claim);
            }
            for (key, node) in placed {
                let node = node.ok_or_else(|| TestCaseError::fail("a kept move placed a pod on a new node"))?;
                let mut p = made.pods.get(&key).map(|p| p.as_ref().clone()).ok_or_else(|| TestCaseError::fail("pod"))?;
                p.node_name = Some(node);
                made.pods.insert(key, Arc::new(p));
            }
        }
        let left: Vec<Mover<'_>> = all.iter().filter(|m| made.nodes.contains_key(m.node)).copied().collect();
        let scratch = Prepared::new(&made, &w.pools, &left, &opts);
        for m in moves {
            let names: Vec<&str> = m.iter().filter_map(|i| left.get(*i)).map(|c| c.claim).collect();
            if names.is_empty() {
                continue;
            }
            // A node a kept move put pods on moves with them on the made cluster, not in the
            // simulation (its pods there are the kept move's): those are refused here.
            let tried = sim.try_move(&names);
            if let Err(why) = &tried {
                prop_assert!(why.contains("command of this round"), "{}", why);
                continue;
            }
            let built = scratch.simulation().try_move(&names).map(|o| summary(&o));
            prop_assert_eq!(tried.map(|o| summary(&o)), built, "move {:?}", names);
        }
    }

    /// What lets consolidation skip a trial: a pod of a candidate that fits on no other node
    /// (the candidate's node out, its other pods not placed) is one no trial of the candidate
    /// leaves on an existing node, however its other pods go; and the answer leaves the
    /// state as it was.
    #[test]
    fn a_pod_that_fits_on_no_other_node_is_one_no_trial_of_its_node_places_on_an_existing_node(
        nodes in prop::collection::vec(node_spec(), 2..9),
        pending in prop::collection::vec(pod_spec(), 0..4),
        limit in prop::option::of(4i64..40),
    ) {
        let w = world(&nodes, &pending, limit);
        let r = refs(&w);
        let all = movers(&w, &r);
        let prepared = Prepared::new(&w.snap, &w.pools, &all, &SolveOptions::default());
        let mut sim = prepared.simulation();
        for m in &all {
            let Ok(before) = sim.try_move(&[m.claim]) else { continue };
            for p in m.pods {
                if sim.fits_elsewhere(m.claim, &p.key) == Some(false) {
                    let on_existing = before
                        .results
                        .existing
                        .iter()
                        .flat_map(|e| &e.pods)
                        .filter_map(|&i| before.pod(i))
                        .any(|q| q.key == p.key);
                    prop_assert!(!on_existing, "{} refused everywhere yet placed: {:?}", p.key, summary(&before));
                }
            }
            // Asking changed nothing: the same trial decides the same.
            let after = sim.try_move(&[m.claim]).map(|o| summary(&o));
            prop_assert_eq!(after, Ok(summary(&before)));
        }
    }

    /// What lets consolidation skip a delete's trial by counting: when the other nodes'
    /// room cannot hold a candidate's pods together, no trial of it places them all on
    /// existing nodes (initialized ones: a pod on a booting node is an error), whatever the
    /// pods ask besides (spread, affinity, taints); counting changes nothing, and after a
    /// kept move it counts the room that move left.
    #[test]
    fn pods_the_other_nodes_room_rules_out_are_pods_no_trial_places_all_on_existing_nodes(
        nodes in prop::collection::vec(crowded_node_spec(), 2..7),
        pending in prop::collection::vec(pod_spec(), 0..4),
        limit in prop::option::of(4i64..40),
        keep in 0..7usize,
        below in 0.0f64..0.6,
    ) {
        let w = world(&nodes, &pending, limit);
        let r = refs(&w);
        let all = movers(&w, &r);
        let prepared = Prepared::new(&w.snap, &w.pools, &all, &SolveOptions::default());
        let mut sim = prepared.simulation();
        // What consolidation accepts of a one-new-node trial: one claim, with a type whose
        // dearest offering it may land on costs less than `below`.
        let replaced = |o: &Outcome| {
            let [claim] = o.results.claims.as_slice() else { return false };
            let zone = claim.requirements.get(labels::ZONE);
            let capacity = claim.requirements.get(labels::CAPACITY_TYPE);
            claim.instance_types.iter().filter_map(|&i| w.pools.get(claim.pool)?.instance_types.get(i as usize)).any(|t| {
                t.offerings
                    .iter()
                    .filter(|o| o.available && zone.has(&o.zone) && capacity.has(o.capacity_type.as_str()))
                    .map(|o| o.price)
                    .reduce(f64::max)
                    .is_some_and(|p| p < below)
            })
        };
        let check = |sim: &mut Simulation<'_>| -> Result<(), TestCaseError> {
            for m in &all {
                let Ok(before) = sim.try_move(&[m.claim]) else { continue };
                if let Some(why) = sim.room_rules_out(&[m.claim], None) {
                    let all_on_existing = before.results.claims.is_empty() && before.results.errors.is_empty();
                    prop_assert!(!all_on_existing, "{} ruled out ({why}) yet placed: {:?}", m.claim, summary(&before));
                }
                if let Some(why) = sim.room_rules_out(&[m.claim], Some(below)) {
                    let one = sim.try_move_within(&[m.claim], Some(1)).map_err(TestCaseError::fail)?;
                    let moved = !one.capped && one.results.errors.is_empty() && one.results.claims.len() <= 1;
                    prop_assert!(
                        !(moved && (one.results.claims.is_empty() || replaced(&one))),
                        "{} ruled out below ${below:.4}/h ({why}) yet it goes: {:?}", m.claim, summary(&one)
                    );
                }
                let after = sim.try_move(&[m.claim]).map(|o| summary(&o));
                prop_assert_eq!(after, Ok(summary(&before)));
            }
            // Two candidates together, as Karpenter's multi-node move tries a prefix: allowed
            // one new node, costing less than `below` for both.
            for pair in all.windows(2) {
                let ids = [pair[0].claim, pair[1].claim];
                if let Some(why) = sim.room_rules_out(&ids, Some(below)) {
                    let Ok(one) = sim.try_move_within(&ids, Some(1)) else { continue };
                    let moved = !one.capped && one.results.errors.is_empty() && one.results.claims.len() <= 1;
                    prop_assert!(
                        !(moved && (one.results.claims.is_empty() || replaced(&one))),
                        "{ids:?} ruled out below ${below:.4}/h ({why}) yet they go: {:?}", summary(&one)
                    );
                }
            }
            Ok(())
        };
        check(&mut sim)?;
        // After a move kept for good (when it holds), the count is of the room it left.
        if let Some(m) = all.get(keep)
            && sim.try_move(&[m.claim]).is_ok_and(|o| o.results.errors.is_empty())
            && sim.keep(&[m.claim]).is_ok()
        {
            check(&mut sim)?;
        }
    }
}

/// A node with more pods than [`node_spec`]'s: room runs short, and counting has something
/// to rule out.
fn crowded_node_spec() -> impl Strategy<Value = NodeSpec> {
    node_with_pods(2..9)
}

/// A pod that requires a label a node lacks is refused there alone, yet goes there once a
/// pod placed before it narrows the node's requirements to define that label: no answer on
/// its own holds for it, so none is given (and no trial is skipped on one).
#[test]
fn a_pod_whose_fit_another_pods_requirements_can_open_gets_no_answer_alone() {
    let mut w = world(&[(1, 0, true, false, vec![]), (1, 0, true, false, vec![])], &[], None);
    let on_candidate = |name: &str, cpu: i64| {
        let mut p = Pod::new("default", name, ResourceList::cpu_mem(cpu, 512 << 20));
        p.node_name = Some("node-0".into());
        p
    };
    // q goes first (more CPU) and leaves node-1 requiring `team NotIn [b]`; p requires
    // `team In [a]`, which node-1's labels alone do not define.
    let mut q = on_candidate("q", 1_000);
    let mut not_b = Requirements::new();
    not_b.add("team", Requirement::not_in(["b"]));
    q.node_affinity.required.push(not_b);
    let mut p = on_candidate("p", 500);
    p.node_selector.insert("team".into(), "a".into());
    let (q, p) = (Arc::new(q), Arc::new(p));
    for pod in [&q, &p] {
        w.snap.pods.insert(pod.key.clone(), pod.clone());
    }
    w.nodes[0].2 = vec![q.clone(), p.clone()];
    let r = refs(&w);
    let all = movers(&w, &r);
    let prepared = Prepared::new(&w.snap, &w.pools, &all, &SolveOptions::default());
    let mut sim = prepared.simulation();
    let trial = sim.try_move(&["claim-0"]).expect("prepared");
    let placed: Vec<String> = trial
        .results
        .existing
        .iter()
        .flat_map(|e| &e.pods)
        .filter_map(|&i| trial.pod(i))
        .map(|p| p.key.to_string())
        .collect();
    assert!(placed.contains(&p.key.to_string()), "p follows q onto node-1: {:?}", summary(&trial));
    assert_eq!(sim.fits_elsewhere("claim-0", &p.key), None, "p's fit alone says nothing");
    assert_eq!(sim.fits_elsewhere("claim-0", &q.key), None, "q has node requirements too");
}

#[test]
fn pending_pods_keep_their_room_and_the_node_they_go_to_is_not_consolidated() {
    // Two m5.large nodes, one with a small pod; a pending pod that fits on the first.
    let nodes: Vec<NodeSpec> = vec![(0, 0, true, false, vec![(0, 0, 0, 0)]), (0, 0, true, false, vec![(0, 0, 1, 0)])];
    let w = world(&nodes, &[(3, 3, 2, 0)], None);
    let r = refs(&w);
    let all = movers(&w, &r);
    let prepared = Prepared::new(&w.snap, &w.pools, &all, &SolveOptions::default());
    let mut sim = prepared.simulation();
    let first = sim.try_move(&["claim-0"]).expect_err("the pending pod goes to node-0");
    assert!(first.contains("pending pod default/pending-0"), "{first}");
    let second = sim.try_move(&["claim-1"]).expect("node-1 takes no pending pod");
    assert!(second.results.errors.is_empty(), "{:?}", second.results.errors);
    assert_eq!(second.existing_nodes, vec!["node-0".to_string()], "its pod joins node-0 beside the pending one");
}

#[test]
fn a_move_that_needs_more_new_nodes_than_allowed_stops_at_the_first_too_many() {
    // One m5.xlarge with five 1-vCPU pods and no other node: they need two new nodes (the
    // largest type holds three).
    let nodes: Vec<NodeSpec> = vec![(1, 0, true, false, vec![(3, 0, 0, 0); 5])];
    let w = world(&nodes, &[], None);
    let r = refs(&w);
    let all = movers(&w, &r);
    let prepared = Prepared::new(&w.snap, &w.pools, &all, &SolveOptions::default());
    let mut sim = prepared.simulation();
    let free = sim.try_move(&["claim-0"]).expect("prepared");
    assert_eq!((free.capped, free.results.claims.len(), free.results.errors.len()), (false, 2, 0));
    let capped = sim.try_move_within(&["claim-0"], Some(1)).expect("prepared");
    assert!(capped.capped, "{:?}", capped.results);
    assert!(!capped.results.errors.is_empty(), "the pods not tried are unplaced");
    assert!(
        capped.results.errors.iter().all(|(_, e)| e.contains("more than 1 new nodes")),
        "{:?}",
        capped.results.errors
    );
    // Undone as any trial: the same move, unbounded, decides as before.
    assert_eq!(summary(&sim.try_move(&["claim-0"]).expect("prepared")), summary(&free));
}
