//! The lifecycle planner's tests: a world of a ledger and a snapshot the plans are applied to.

use std::sync::{Arc, OnceLock};

use proptest::prelude::*;

use super::*;
use crate::catalog::{Catalog, NodeClassSettings};
use crate::cluster::UNREGISTERED_TAINT;
use crate::labels;
use crate::ledger::{ClaimRequest, Command, Entry, State};
use crate::nodepool::NodeClaimSpec;
use crate::pod::{Pod, PodKey};
use crate::requirements::{Requirement, Requirements};
use crate::resources::ResourceList;
use crate::taints::{Effect as TaintEffect, Taint};

const POOL: &str = "default";
const ZONE: &str = "us-east-1a";

fn m5() -> &'static [InstanceType] {
    static TYPES: OnceLock<Vec<InstanceType>> = OnceLock::new();
    TYPES.get_or_init(|| {
        let c = Catalog::embedded("us-east-1").expect("catalog");
        c.instance_types(&NodeClassSettings::default(), None)
            .into_iter()
            .filter(|t| t.name == "m5.large" || t.name == "m5.xlarge")
            .collect()
    })
}

/// The pool's claims in the ledger, the cluster as a snapshot, and the planner's memory:
/// plans are applied here as the executor and the zone actors would (cloud effects only
/// when a test says so).
struct World {
    ledger: State,
    snap: Snapshot,
    memory: Memory,
    now: Millis,
    synced: bool,
    busy: BTreeSet<String>,
    unavailable: BTreeSet<Offering>,
}

impl World {
    fn new() -> Self {
        let mut ledger = State::default();
        ledger.apply(&entry(0, Command::SetPool { pool: POOL.into(), limits: ResourceList::new() }));
        World {
            ledger,
            snap: Snapshot::default(),
            memory: Memory::default(),
            now: 1_000_000,
            synced: true,
            busy: BTreeSet::new(),
            unavailable: BTreeSet::new(),
        }
    }

    fn propose(&mut self, command: Command) {
        let e = entry(self.now, command);
        self.ledger.apply(&e);
    }

    /// A claim reserved and created, then moved along by `steps`.
    fn claim(&mut self, id: &str, steps: Vec<Step>) {
        let req = ClaimRequest {
            id: id.into(),
            zone: ZONE.into(),
            resources: ResourceList::cpu_mem(2000, 8 << 30),
            price_per_hour: 96_000,
        };
        self.propose(Command::Reserve { pool: POOL.into(), claims: vec![req] });
        let mut reqs = Requirements::new();
        reqs.add(labels::INSTANCE_TYPE, Requirement::is_in(["m5.large", "m5.xlarge"]));
        reqs.add(labels::CAPACITY_TYPE, Requirement::is_in(["on-demand"]));
        let nc = NodeClaim {
            name: id.into(),
            spec: NodeClaimSpec {
                nodepool: POOL.into(),
                requirements: reqs,
                labels: [("team".to_string(), "web".to_string())].into(),
                startup_taints: vec![Taint::new("example.com/booting", "", TaintEffect::NoSchedule)],
                ..NodeClaimSpec::default()
            },
            finalizers: vec![TERMINATION_FINALIZER.into()],
            deleting: false,
            status: Default::default(),
            resource_version: 1,
            created: Some(self.now),
        };
        self.snap.nodeclaims.insert(id.into(), Arc::new(nc));
        for s in steps {
            self.step(id, s);
        }
    }

    /// A launch call for claim `id` in batch `batch`, as the ZoneActor records it first.
    fn launch_call(&mut self, id: &str, batch: &str) {
        let batch = crate::ledger::LaunchBatch { id: batch.into(), claims: vec![id.into()].into() };
        self.propose(Command::Launch { zone: ZONE.into(), batches: vec![batch] });
    }

    fn step(&mut self, id: &str, step: Step) {
        let step = match step {
            Step::Launched {
                instance, resources, allocatable, price_per_hour, instance_type, capacity_type, ..
            } => {
                self.launch_call(id, &format!("b-{id}"));
                Step::Launched {
                    batch: format!("b-{id}"),
                    instance,
                    resources,
                    allocatable,
                    price_per_hour,
                    instance_type,
                    capacity_type,
                }
            }
            s => s,
        };
        self.propose(Command::Advance { steps: vec![(id.into(), step)] });
    }

    /// The node a launched claim's instance registers as (ready, with the unregistered
    /// taint and the claim's startup taint, and a taint of the node lifecycle controller).
    fn node(&mut self, instance: &str) -> String {
        let name = format!("ip-{instance}");
        let node = Node {
            name: name.clone(),
            labels: [(labels::NODEPOOL.to_string(), POOL.to_string())].into(),
            taints: vec![
                Taint::new(UNREGISTERED_TAINT, "", TaintEffect::NoExecute),
                Taint::new("example.com/booting", "", TaintEffect::NoSchedule),
                Taint::new("node.kubernetes.io/network-unavailable", "", TaintEffect::NoSchedule),
            ],
            allocatable: ResourceList::cpu_mem(1930, 7 << 30),
            provider_id: Some(provider_id(ZONE, instance)),
            ready: true,
            ..Node::default()
        };
        self.snap.nodes.insert(name.clone(), Arc::new(node));
        name
    }

    fn pod_on(&mut self, name: &str, node: &str) -> PodKey {
        let mut p = Pod::new("default", name, ResourceList::cpu_mem(100, 1 << 20));
        p.node_name = Some(node.into());
        let key = p.key.clone();
        self.snap.pods.insert(key.clone(), Arc::new(p));
        key
    }

    fn plan(&mut self) -> Plan {
        let claims: Vec<Claim> = self.ledger.claims_of(POOL).cloned().collect();
        let zones = vec!["us-east-1a".to_string(), "us-east-1b".to_string()];
        let input = Input {
            pool: POOL,
            claims: &claims,
            batches: self.ledger.batches(),
            snapshot: &self.snap,
            synced: self.synced,
            now: self.now,
            types: m5(),
            zones: &zones,
            unavailable: &self.unavailable,
            busy: &self.busy,
            interrupted: &crate::interruption::interrupted_claims(&self.ledger, POOL),
        };
        reconcile(&input, &Config::default(), &mut self.memory)
    }

    /// Commits the plan's steps and runs its cluster effects (cloud effects are the
    /// zone actors': not run here).
    fn apply(&mut self, plan: &Plan) {
        if !plan.steps.is_empty() {
            self.propose(Command::Advance { steps: plan.steps.clone() });
        }
        for e in &plan.effects {
            apply_effect(&mut self.snap, e);
        }
    }

    fn state(&self, id: &str) -> Option<ClaimState> {
        self.ledger.claim(id).map(|c| c.state.clone())
    }
}

fn entry(at: Millis, command: Command) -> Entry {
    Entry { term: 1, at, command }
}

/// What the API server does with a cluster effect.
fn apply_effect(snap: &mut Snapshot, e: &Effect) {
    let claim = e.claim.clone();
    match &e.action {
        Action::PatchStatus(p) => {
            if let Some(nc) = snap.nodeclaims.get_mut(&claim)
                && let Some(s) = p.apply(&nc.status)
            {
                Arc::make_mut(nc).status = s;
            }
        }
        Action::DeleteNodeClaim => {
            if let Some(nc) = snap.nodeclaims.get_mut(&claim) {
                if nc.finalizers.is_empty() {
                    snap.nodeclaims.remove(&claim);
                } else {
                    Arc::make_mut(nc).deleting = true;
                }
            }
        }
        Action::Launched { labels, status } => {
            if let Some(nc) = snap.nodeclaims.get_mut(&claim) {
                let nc = Arc::make_mut(nc);
                nc.spec.labels.extend(labels.iter().cloned());
                if let Some(s) = status.apply(&nc.status) {
                    nc.status = s;
                }
            }
        }
        Action::RemoveFinalizer => {
            if let Some(nc) = snap.nodeclaims.get_mut(&claim) {
                let nc = Arc::make_mut(nc);
                nc.finalizers.retain(|f| f != TERMINATION_FINALIZER);
                if nc.deleting && nc.finalizers.is_empty() {
                    snap.nodeclaims.remove(&claim);
                }
            }
        }
        Action::PatchNode { node, patch } => {
            if let Some(n) = snap.nodes.get_mut(node)
                && let Some(patched) = patch.apply(n)
            {
                let gone = patched.deleting && patched.finalizers.is_empty();
                *Arc::make_mut(n) = patched;
                if gone {
                    snap.nodes.remove(node);
                }
            }
        }
        Action::DeleteNode { node } => {
            if let Some(n) = snap.nodes.get_mut(node) {
                if n.finalizers.is_empty() {
                    snap.nodes.remove(node);
                } else {
                    Arc::make_mut(n).deleting = true;
                }
            }
        }
        Action::Evict(p) | Action::DeletePod { pod: p, .. } => {
            snap.pods.remove(p);
        }
        Action::CreateNodeClaim(_) | Action::Launch { .. } | Action::Terminate { .. } | Action::Event(_) => {}
    }
}

fn launched(instance: &str) -> Step {
    Step::Launched {
        batch: String::new(),
        instance: instance.into(),
        resources: ResourceList::cpu_mem(2000, 8 << 30),
        allocatable: ResourceList::cpu_mem(1930, 7 << 30),
        price_per_hour: 96_000,
        instance_type: "m5.large".into(),
        capacity_type: crate::catalog::CapacityType::OnDemand,
    }
}

fn has(plan: &Plan, f: impl Fn(&Action) -> bool) -> bool {
    plan.effects.iter().any(|e| f(&e.action))
}

#[test]
fn a_view_that_is_not_synced_terminates_nothing() {
    let mut w = World::new();
    w.claim("default-abcde", vec![launched("i-1"), Step::Registered]);
    // The node is missing: on an unsynced view that means nothing.
    w.synced = false;
    w.now += 3_600_000;
    assert!(w.plan().is_empty());
}

#[test]
fn a_node_missing_from_one_snapshot_terminates_nothing() {
    let mut w = World::new();
    w.claim("default-abcde", vec![launched("i-1"), Step::Registered]);
    // A relist shows the node missing once; it is back on the next snapshot.
    let plan = w.plan();
    assert!(plan.steps.is_empty(), "{:?}", plan.steps);
    let node = w.node("i-1");
    w.now += 10_000;
    let plan = w.plan();
    w.apply(&plan);
    assert!(w.plan().steps.is_empty());
    // Missing for good: lost only once the absence outlived the grace.
    w.snap.nodes.remove(&node);
    w.now += 10_000;
    assert!(w.plan().steps.is_empty());
    w.now += 25_000;
    assert!(w.plan().steps.is_empty(), "the grace counts from the first absence");
    w.now += 10_000;
    let plan = w.plan();
    assert!(plan.steps.contains(&("default-abcde".into(), Step::Terminating)), "{:?}", plan.steps);
}

#[test]
fn a_claim_whose_nodeclaim_or_node_cannot_be_read_is_never_taken_for_deleted() {
    use crate::cluster::{Unreadable, UnreadableKind};
    let mut w = World::new();
    w.claim("default-abcde", vec![launched("i-1"), Step::Registered, Step::Initialized]);
    let node = w.node("i-1");
    w.claim("default-fghij", vec![launched("i-2"), Step::Registered, Step::Initialized]);
    let other = w.node("i-2");
    let plan = w.plan();
    w.apply(&plan);
    // A newer Karpenter rewrote the first NodeClaim with a field the adapter cannot convert,
    // and the second claim's Node got a taint effect it does not know: both leave the typed
    // caches and are kept by identity.
    w.snap.nodeclaims.remove("default-abcde");
    let kept = |kind, name: &str, provider: &str| Unreadable {
        kind,
        name: name.into(),
        uid: "u".into(),
        provider_id: Some(provider_id(ZONE, provider)),
        labels: Default::default(),
        error: "spec: unknown".into(),
    };
    let u = kept(UnreadableKind::NodeClaim, "default-abcde", "i-1");
    w.snap.unreadable.insert(Unreadable::key(u.kind, &u.name), Arc::new(u));
    w.snap.nodes.remove(&other);
    let u = kept(UnreadableKind::Node, &other, "i-2");
    w.snap.unreadable.insert(Unreadable::key(u.kind, &u.name), Arc::new(u));
    // Far past the grace after which a missing NodeClaim or Node means deleted: nothing.
    for _ in 0..10 {
        w.now += 60_000;
        let plan = w.plan();
        assert!(plan.steps.is_empty() && plan.effects.is_empty(), "{:?} {:?}", plan.steps, plan.effects);
    }
    assert!(w.snap.nodes.contains_key(&node));
    assert_eq!(w.state("default-abcde"), Some(ClaimState::Initialized { instance: "i-1".into() }));
    // Once readable again it is planned as before; once really gone, it is lost.
    w.snap.unreadable.clear();
    w.now += 60_000;
    assert!(w.plan().steps.is_empty(), "the absence starts counting now");
    w.now += 60_000;
    let plan = w.plan();
    assert!(plan.steps.contains(&("default-abcde".into(), Step::Terminating)), "{:?}", plan.steps);
}

#[test]
fn registration_patches_single_items_and_initialization_follows_in_one_plan() {
    let mut w = World::new();
    w.claim("default-abcde", vec![launched("i-1")]);
    let node = w.node("i-1");
    let plan = w.plan();
    assert_eq!(plan.steps, vec![("default-abcde".to_string(), Step::Registered)], "the startup taint holds init");
    w.apply(&plan);
    let n = &w.snap.nodes[&node];
    assert!(!n.taints.iter().any(|t| t.key == UNREGISTERED_TAINT));
    assert!(n.taints.iter().any(|t| t.key == "node.kubernetes.io/network-unavailable"), "others' taints stay");
    assert_eq!(n.labels.get("team").map(String::as_str), Some("web"));
    assert_eq!(n.finalizers, vec![TERMINATION_FINALIZER.to_string()]);
    let nc = &w.snap.nodeclaims["default-abcde"];
    assert!(nc.status.is("Launched") && nc.status.is("Registered"));
    assert_eq!(nc.status.node_name.as_deref(), Some(node.as_str()));
    // The startup taint goes, but the node lifecycle controller's not-ready taint is still on:
    // not initialized yet (Karpenter waits for the known ephemeral taints too).
    let n = Arc::make_mut(w.snap.nodes.get_mut(&node).expect("node"));
    n.taints.retain(|t| t.key != "example.com/booting");
    n.taints.push(Taint::new("node.kubernetes.io/not-ready", "", TaintEffect::NoSchedule));
    assert!(w.plan().steps.is_empty(), "not-ready taint on");
    let n = Arc::make_mut(w.snap.nodes.get_mut(&node).expect("node"));
    n.taints.retain(|t| t.key != "node.kubernetes.io/not-ready");
    let plan = w.plan();
    assert_eq!(plan.steps, vec![("default-abcde".to_string(), Step::Initialized)]);
    w.apply(&plan);
    assert_eq!(w.snap.nodes[&node].labels.get(labels::INITIALIZED).map(String::as_str), Some("true"));
    assert!(w.plan().is_empty());
}

#[test]
fn a_label_or_taint_an_admin_takes_off_a_registered_node_stays_off() {
    let mut w = World::new();
    w.claim("default-abcde", vec![launched("i-1")]);
    let nc = Arc::make_mut(w.snap.nodeclaims.get_mut("default-abcde").expect("nodeclaim"));
    nc.spec.taints = vec![Taint::new("dedicated", "batch", TaintEffect::NoExecute)];
    let node = w.node("i-1");
    let plan = w.plan();
    w.apply(&plan);
    let n = &w.snap.nodes[&node];
    assert_eq!(n.labels.get(labels::REGISTERED).map(String::as_str), Some("true"));
    assert!(n.taints.iter().any(|t| t.key == "dedicated"), "registration put the claim's taint on");
    // An admin takes the taint and a label off the registered node.
    let n = Arc::make_mut(w.snap.nodes.get_mut(&node).expect("node"));
    n.taints.retain(|t| t.key != "dedicated");
    n.labels.remove("team");
    for _ in 0..3 {
        let plan = w.plan();
        assert!(
            !has(
                &plan,
                |a| matches!(a, Action::PatchNode { patch, .. } if !patch.add_taints.is_empty() || patch.labels.iter().any(|(k, _)| k == "team"))
            ),
            "registration is not applied again: {:?}",
            plan.effects
        );
        w.apply(&plan);
    }
    let n = &w.snap.nodes[&node];
    assert!(!n.taints.iter().any(|t| t.key == "dedicated") && !n.labels.contains_key("team"));
}

#[test]
fn a_launched_nodeclaim_is_labelled_with_what_it_launched_as_in_the_write_that_shows_its_instance() {
    let mut w = World::new();
    w.claim("default-abcde", vec![launched("i-1")]);
    let plan = w.plan();
    let launched: Vec<_> = plan
        .effects
        .iter()
        .filter_map(|e| match &e.action {
            Action::Launched { labels, status } => Some((labels.clone(), status.clone())),
            Action::PatchStatus(_) => panic!("the status goes with the labels: {e:?}"),
            _ => None,
        })
        .collect();
    assert_eq!(launched.len(), 1, "{:?}", plan.effects);
    let (labels, status) = &launched[0];
    let label = |k: &str| labels.iter().find(|(key, _)| key == k).map(|(_, v)| v.as_str());
    assert_eq!(label(labels::INSTANCE_TYPE), Some("m5.large"));
    assert_eq!(label(labels::ZONE), Some(ZONE));
    assert_eq!(label(labels::CAPACITY_TYPE), Some("on-demand"));
    assert_eq!(label(labels::ARCH), Some("amd64"), "the type's single-valued labels too");
    assert_eq!(status.provider_id.as_deref(), Some("aws:///us-east-1a/i-1"));
    w.apply(&plan);
    assert!(!has(&w.plan(), |a| matches!(a, Action::Launched { .. } | Action::PatchStatus(_))), "done once shown");
}

#[test]
fn initialization_waits_for_ready_and_the_extended_resources_asked_for() {
    let mut w = World::new();
    w.claim("default-gpu", vec![launched("i-1")]);
    let nc = w.snap.nodeclaims.get_mut("default-gpu").expect("claim");
    let nc = Arc::make_mut(nc);
    nc.spec.startup_taints.clear();
    nc.spec.requests.set(ResourceName::NvidiaGpu, 1);
    let node = w.node("i-1");
    {
        let n = Arc::make_mut(w.snap.nodes.get_mut(&node).expect("node"));
        n.taints.retain(|t| t.key == UNREGISTERED_TAINT);
        n.ready = false;
    }
    let plan = w.plan();
    w.apply(&plan);
    assert!(matches!(w.state("default-gpu"), Some(ClaimState::Registered { .. })));
    Arc::make_mut(w.snap.nodes.get_mut(&node).expect("node")).ready = true;
    assert!(w.plan().steps.is_empty(), "the GPU is not registered yet");
    Arc::make_mut(w.snap.nodes.get_mut(&node).expect("node")).allocatable.set(ResourceName::NvidiaGpu, 1);
    assert_eq!(w.plan().steps, vec![("default-gpu".to_string(), Step::Initialized)]);
}

#[test]
fn a_nodeclaim_deleted_by_hand_completes_through_its_finalizer() {
    let mut w = World::new();
    w.claim("default-abcde", vec![launched("i-1")]);
    let node = w.node("i-1");
    let plan = w.plan();
    w.apply(&plan);
    let pod = w.pod_on("web-0", &node);
    // kubectl delete nodeclaim: the API server marks it; the finalizer holds it.
    Arc::make_mut(w.snap.nodeclaims.get_mut("default-abcde").expect("claim")).deleting = true;
    let plan = w.plan();
    assert!(plan.steps.contains(&("default-abcde".into(), Step::Terminating)));
    assert!(has(&plan, |a| matches!(a, Action::Evict(p) if *p == pod)), "drained first");
    assert!(!has(&plan, |a| matches!(a, Action::Terminate { .. })), "the instance waits for the drain");
    w.apply(&plan);
    assert!(w.snap.nodes[&node].taints.iter().any(|t| t.key == "karpenter.sh/disrupted"));
    assert!(!w.snap.nodes[&node].unschedulable, "tainted, not cordoned");
    let plan = w.plan();
    let terminate = plan.effects.iter().find(|e| matches!(e.action, Action::Terminate { .. })).cloned();
    assert!(matches!(terminate.map(|e| e.action), Some(Action::Terminate { instance: Some(ref i), .. }) if i == "i-1"));
    // The zone actor terminated it.
    w.propose(Command::Advance { steps: vec![("default-abcde".into(), Step::InstanceGone)] });
    let plan = w.plan();
    w.apply(&plan);
    assert_eq!(w.state("default-abcde"), None, "the claim is gone from the ledger");
    assert!(w.snap.nodeclaims.is_empty(), "and its NodeClaim from the cluster");
    assert!(w.snap.nodes.is_empty(), "and its node");
    assert!(w.plan().is_empty());
}

#[test]
fn a_node_deleted_by_hand_is_drained_before_its_instance_goes() {
    let mut w = World::new();
    w.claim("default-abcde", vec![launched("i-1")]);
    let node = w.node("i-1");
    let plan = w.plan();
    w.apply(&plan);
    let pod = w.pod_on("web-0", &node);
    // kubectl delete node: the finalizer holds it.
    Arc::make_mut(w.snap.nodes.get_mut(&node).expect("node")).deleting = true;
    let plan = w.plan();
    assert!(plan.steps.contains(&("default-abcde".into(), Step::Terminating)));
    assert!(has(&plan, |a| matches!(a, Action::Evict(p) if *p == pod)));
    assert!(!has(&plan, |a| matches!(a, Action::Terminate { .. } | Action::DeleteNode { .. })));
    w.apply(&plan);
    assert!(w.snap.nodes.contains_key(&node), "still there: its finalizer waits for the instance");
    assert!(has(&w.plan(), |a| matches!(a, Action::Terminate { .. })), "drained: now the instance");
}

#[test]
fn a_claim_deleted_mid_launch_terminates_what_its_batch_made() {
    let mut w = World::new();
    w.claim("default-abcde", vec![]);
    let batch = crate::ledger::LaunchBatch { id: "b1".into(), claims: vec!["default-abcde".into()].into() };
    w.propose(Command::Launch { zone: ZONE.into(), batches: vec![batch.clone()] });
    Arc::make_mut(w.snap.nodeclaims.get_mut("default-abcde").expect("claim")).deleting = true;
    let plan = w.plan();
    assert!(plan.steps.contains(&("default-abcde".into(), Step::Terminating)));
    assert!(
        has(&plan, |a| matches!(a, Action::Terminate { instance: None, batch: Some(b), .. } if *b == batch)),
        "{:?}",
        plan.effects
    );
    assert!(!plan.steps.contains(&("default-abcde".into(), Step::Gone)), "not gone until the batch is looked up");
}

#[test]
fn a_reserved_claim_whose_zone_has_no_capacity_launches_in_another() {
    let mut w = World::new();
    w.claim("default-abcde", vec![]);
    let launch_zone = |p: &Plan| {
        p.effects.iter().find_map(|e| match &e.action {
            Action::Launch { zone, .. } => Some(zone.clone()),
            _ => None,
        })
    };
    assert_eq!(launch_zone(&w.plan()).as_deref(), Some(ZONE));
    for t in ["m5.large", "m5.xlarge"] {
        w.unavailable.insert(Offering {
            instance_type: t.into(),
            zone: ZONE.into(),
            capacity_type: crate::catalog::CapacityType::OnDemand,
        });
    }
    assert_eq!(launch_zone(&w.plan()).as_deref(), Some("us-east-1b"), "ICE marks respected");
    w.unavailable.extend(["m5.large", "m5.xlarge"].map(|t| Offering {
        instance_type: t.into(),
        zone: "us-east-1b".into(),
        capacity_type: crate::catalog::CapacityType::OnDemand,
    }));
    let plan = w.plan();
    assert_eq!(launch_zone(&plan), None);
    assert!(plan.steps.contains(&("default-abcde".into(), Step::Gone)), "released: {:?}", plan.steps);
}

/// A claim whose first call found no capacity is asked for again marked as called before, so
/// its zone queues it ahead of the claims waiting for their first call (its launch timeout
/// runs from that call); a claim never called, and one launching, say which they are.
#[test]
fn a_claim_called_before_is_launched_again_marked_to_go_ahead_of_the_queue() {
    let again = |p: &Plan, id: &str| {
        p.effects.iter().find_map(|e| match &e.action {
            Action::Launch { again, .. } if e.claim == id => Some(*again),
            _ => None,
        })
    };
    let mut w = World::new();
    w.claim("default-abcde", vec![]);
    assert_eq!(again(&w.plan(), "default-abcde"), Some(false), "never called");
    w.launch_call("default-abcde", "b-1");
    assert_eq!(again(&w.plan(), "default-abcde"), Some(true), "launching: its call was made");
    w.propose(Command::Advance { steps: vec![("default-abcde".into(), Step::Unlaunched { batch: "b-1".into() })] });
    assert_eq!(again(&w.plan(), "default-abcde"), Some(true), "reserved again after no capacity");
}

/// After insufficient capacity a claim goes to the cheapest offering left, not to the next
/// type in a zone that just ran out (the 60 cheapest types at a time would each be tried
/// there first).
#[test]
fn a_claim_out_of_capacity_in_its_zone_moves_to_the_cheapest_offering_left() {
    let mut w = World::new();
    w.claim("default-abcde", vec![]);
    w.unavailable.insert(Offering {
        instance_type: "m5.large".into(),
        zone: ZONE.into(),
        capacity_type: crate::catalog::CapacityType::OnDemand,
    });
    let zone = w.plan().effects.iter().find_map(|e| match &e.action {
        Action::Launch { zone, .. } => Some(zone.clone()),
        _ => None,
    });
    assert_eq!(zone.as_deref(), Some("us-east-1b"), "m5.large in b is cheaper than m5.xlarge in a");
}

#[test]
fn a_claim_busy_in_its_round_and_a_round_cut_off_before_the_create() {
    let mut w = World::new();
    w.claim("default-abcde", vec![]);
    w.snap.nodeclaims.clear();
    w.busy.insert("default-abcde".into());
    w.now += 60_000;
    assert!(w.plan().is_empty(), "its round is still creating it");
    w.busy.clear();
    assert_eq!(w.plan().steps, vec![("default-abcde".to_string(), Step::Gone)], "cut off by a restart");
}

/// A claim whose launch calls go on failing (each leaves it `Reserved` again) is given up 5
/// minutes after its first call, as Karpenter gives one up 5 minutes after its first failure.
#[test]
fn a_launch_that_outlives_its_timeout_is_terminated() {
    let mut w = World::new();
    w.claim("default-abcde", vec![]);
    w.now += 60_000;
    w.launch_call("default-abcde", "b-1");
    w.propose(Command::Advance { steps: vec![("default-abcde".into(), Step::Unlaunched { batch: "b-1".into() })] });
    // A second call later does not restart the count.
    w.now += 2 * 60_000;
    w.launch_call("default-abcde", "b-2");
    w.now += 3 * 60_000 - 1;
    assert!(!w.plan().steps.contains(&("default-abcde".into(), Step::Terminating)));
    w.now += 1;
    let plan = w.plan();
    assert!(plan.steps.contains(&("default-abcde".into(), Step::Terminating)), "{:?}", plan.steps);
    assert!(has(
        &plan,
        |a| matches!(a, Action::Event(e) if e.reason == "LivenessTimeout" && e.message.contains("of its first call"))
    ));
}

/// 2,200 claims decided at once launch at EC2's 2 a second after a burst of 1,000: the last
/// wait 10 minutes for their first call in the plane's queue. Deleted at 5 minutes (the launch
/// timeout counted from creation), their pods went to new claims at the back of the same
/// queue, and the soak's opening burst took 16-17 minutes to place (10 after). A claim that
/// waits for its first call has not failed to launch: it is given up only at the registration
/// timeout.
#[test]
fn a_claim_still_waiting_for_its_first_launch_call_outlives_the_launch_timeout() {
    let mut w = World::new();
    w.claim("default-abcde", vec![]);
    w.now += 10 * 60_000;
    assert!(!w.plan().steps.contains(&("default-abcde".into(), Step::Terminating)));
    // Its first call at 10 minutes, still launching at 14: kept.
    w.launch_call("default-abcde", "b-1");
    w.now += 4 * 60_000;
    assert!(!w.plan().steps.contains(&("default-abcde".into(), Step::Terminating)));
    // Never called in 15 minutes: given up, and the event says why.
    let mut queued = World::new();
    queued.claim("default-fghij", vec![]);
    queued.now += 15 * 60_000 - 1;
    assert!(!queued.plan().steps.contains(&("default-fghij".into(), Step::Terminating)));
    queued.now += 1;
    let plan = queued.plan();
    assert!(plan.steps.contains(&("default-fghij".into(), Step::Terminating)), "{:?}", plan.steps);
    assert!(has(
        &plan,
        |a| matches!(a, Action::Event(e) if e.reason == "LivenessTimeout" && e.message.contains("no launch call was made"))
    ));
}

/// A claim reserved again after a restart (the single-node ledger starts empty and adopts the
/// cluster's NodeClaims) keeps its NodeClaim's age: an instance that has not registered for
/// 15 minutes since its NodeClaim was created is given up at once, not 15 minutes later.
#[test]
fn the_registration_timeout_counts_from_the_nodeclaims_creation_not_the_restart() {
    let mut w = World::new();
    w.now = 3_600_000;
    w.claim("default-abcde", vec![launched("i-1")]);
    // The NodeClaim was created 20 minutes before the claim was reserved (again).
    let made = w.now - 20 * 60_000;
    let nc = w.snap.nodeclaims.get_mut("default-abcde").expect("claim");
    Arc::make_mut(nc).created = Some(made);
    w.now += 1_000;
    let plan = w.plan();
    assert!(plan.steps.contains(&("default-abcde".into(), Step::Terminating)), "{:?}", plan.steps);
    // One created just now waits its 15 minutes.
    let mut fresh = World::new();
    fresh.claim("default-fghij", vec![launched("i-2")]);
    fresh.now += 14 * 60_000;
    assert!(!fresh.plan().steps.contains(&("default-fghij".into(), Step::Terminating)));
    fresh.now += 60_000;
    assert!(fresh.plan().steps.contains(&("default-fghij".into(), Step::Terminating)));
}

#[test]
fn orphaned_objects_lose_their_finalizers() {
    let mut w = World::new();
    w.claim("default-abcde", vec![launched("i-1")]);
    let node = w.node("i-1");
    let plan = w.plan();
    w.apply(&plan);
    // The claim went from the ledger; its objects were left being deleted.
    let gone = vec![
        ("default-abcde".to_string(), Step::Terminating),
        ("default-abcde".to_string(), Step::InstanceGone),
        ("default-abcde".to_string(), Step::Gone),
    ];
    w.propose(Command::Advance { steps: gone });
    Arc::make_mut(w.snap.nodeclaims.get_mut("default-abcde").expect("claim")).deleting = true;
    Arc::make_mut(w.snap.nodes.get_mut(&node).expect("node")).deleting = true;
    let plan = w.plan();
    assert!(has(&plan, |a| matches!(a, Action::RemoveFinalizer)));
    assert!(has(&plan, |a| matches!(a, Action::PatchNode { patch, .. } if !patch.remove_finalizers.is_empty())));
}

#[test]
fn a_nodeclaim_left_behind_by_a_released_claim_is_deleted_after_the_grace() {
    let mut w = World::new();
    // A round released its claim; its create landed late: an object the ledger does not know.
    w.claim("default-late0", vec![]);
    let steps = vec![("default-late0".to_string(), Step::Gone)];
    w.propose(Command::Advance { steps });
    assert!(w.plan().is_empty(), "within the grace");
    w.now += 31_000;
    let plan = w.plan();
    assert!(has(&plan, |a| matches!(a, Action::DeleteNodeClaim)), "{:?}", plan.effects);
    w.apply(&plan);
    let plan = w.plan();
    assert!(has(&plan, |a| matches!(a, Action::RemoveFinalizer)));
    w.apply(&plan);
    assert!(w.snap.nodeclaims.is_empty());
}

/// A claim in some state with a cluster showing something of it.
#[derive(Clone, Debug)]
struct Case {
    steps: Vec<Step>,
    nodeclaim: bool,
    nc_deleting: bool,
    node: bool,
    node_ready: bool,
    node_deleting: bool,
    startup_taint: bool,
    pods: usize,
    advance_ms: u64,
    /// A claim with no steps is launching (its batch recorded) rather than reserved.
    launching: bool,
    /// Its zone's offerings are marked out of capacity.
    ice: bool,
}

fn case() -> impl Strategy<Value = Case> {
    let steps = prop_oneof![
        Just(vec![]),
        Just(vec![launched("i-1")]),
        Just(vec![launched("i-1"), Step::Registered]),
        Just(vec![launched("i-1"), Step::Registered, Step::Initialized]),
        Just(vec![launched("i-1"), Step::Terminating]),
        Just(vec![Step::Terminating]),
        Just(vec![launched("i-1"), Step::Terminating, Step::InstanceGone]),
    ];
    (
        steps,
        any::<bool>(),
        any::<bool>(),
        any::<bool>(),
        any::<bool>(),
        any::<bool>(),
        any::<bool>(),
        0usize..3,
        0u64..1_200_000,
        any::<(bool, bool)>(),
    )
        .prop_map(
            |(
                steps,
                nodeclaim,
                nc_deleting,
                node,
                node_ready,
                node_deleting,
                startup_taint,
                pods,
                advance_ms,
                flags,
            )| {
                Case {
                    steps,
                    nodeclaim,
                    nc_deleting,
                    node,
                    node_ready,
                    node_deleting,
                    startup_taint,
                    pods,
                    advance_ms,
                    launching: flags.0,
                    ice: flags.1,
                }
            },
        )
}

fn world_of(cases: &[Case]) -> World {
    let mut w = World::new();
    for (i, c) in cases.iter().enumerate() {
        let id = format!("default-{i:05}");
        let instance = format!("i-{i}");
        let steps: Vec<Step> = c
            .steps
            .iter()
            .map(|s| match s {
                Step::Launched { .. } => launched(&instance),
                s => s.clone(),
            })
            .collect();
        let fresh = steps.is_empty();
        w.claim(&id, steps);
        if fresh && c.launching {
            w.launch_call(&id, &format!("b-{id}"));
        }
        if c.ice {
            for t in ["m5.large", "m5.xlarge"] {
                w.unavailable.insert(Offering {
                    instance_type: t.into(),
                    zone: ZONE.into(),
                    capacity_type: crate::catalog::CapacityType::OnDemand,
                });
            }
        }
        if !c.nodeclaim {
            w.snap.nodeclaims.remove(&id);
        } else if c.nc_deleting {
            Arc::make_mut(w.snap.nodeclaims.get_mut(&id).expect("claim")).deleting = true;
        }
        if c.node {
            let node = w.node(&instance);
            let n = Arc::make_mut(w.snap.nodes.get_mut(&node).expect("node"));
            n.ready = c.node_ready;
            n.deleting = c.node_deleting;
            if c.node_deleting {
                n.finalizers.push(TERMINATION_FINALIZER.into());
            }
            if !c.startup_taint {
                n.taints.retain(|t| t.key != "example.com/booting");
            }
            for p in 0..c.pods {
                w.pod_on(&format!("p-{i}-{p}"), &node);
            }
        }
    }
    w.now += cases.iter().map(|c| c.advance_ms).max().unwrap_or(0);
    w
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    /// Reconciling, applying the plan (its steps committed, its cluster effects done) and
    /// reconciling again proposes nothing new, and asks for no cluster change that is not
    /// already made (the cloud's and the evictions' effects wait for the world).
    #[test]
    fn reconcile_is_idempotent(cases in prop::collection::vec(case(), 1..6)) {
        let mut w = world_of(&cases);
        let first = w.plan();
        w.apply(&first);
        let again = w.plan();
        prop_assert!(again.steps.is_empty(), "new steps after applying {:?}: {:?}", first.steps, again.steps);
        for e in &again.effects {
            let mut snap = w.snap.clone();
            let before = format!("{:?}", (&snap.nodes, &snap.nodeclaims));
            if matches!(e.action, Action::Evict(_) | Action::DeletePod { .. }) {
                continue;
            }
            apply_effect(&mut snap, e);
            prop_assert_eq!(before, format!("{:?}", (&snap.nodes, &snap.nodeclaims)), "{:?} changes the cluster again", e);
        }
    }

    /// Whatever the view, an unsynced one plans nothing.
    #[test]
    fn an_unsynced_view_plans_nothing(cases in prop::collection::vec(case(), 1..6)) {
        let mut w = world_of(&cases);
        w.synced = false;
        prop_assert!(w.plan().is_empty());
    }
}

/// A spot warning for `claim`'s instance `instance` at `w.now`, and (with `replacement`) the
/// capacity for its pods reserved.
fn interrupt(w: &mut World, claim: &str, instance: &str, replacement: Option<&str>) {
    let notice = crate::ledger::Notice {
        instance: instance.into(),
        kind: crate::interruption::Kind::SpotInterrupted,
        claim: Some(claim.into()),
        deadline: w.now + 120_000,
        acts: true,
        unavailable: None,
    };
    w.propose(Command::Interrupt { notices: vec![notice] });
    let replacements = replacement
        .map(|id| crate::ledger::Replacement {
            pool: POOL.into(),
            claim: ClaimRequest {
                id: id.into(),
                zone: ZONE.into(),
                resources: ResourceList::cpu_mem(2000, 8 << 30),
                price_per_hour: 96_000,
            },
            serves: vec![instance.into()],
        })
        .into_iter()
        .collect();
    w.propose(Command::ReplaceInterrupted { instances: vec![instance.into()], replacements });
}

#[test]
fn an_interrupted_node_drains_once_its_replacement_is_ready() {
    let mut w = World::new();
    w.claim("default-a", vec![launched("i-1")]);
    let node = w.node("i-1");
    let plan = w.plan();
    w.apply(&plan);
    let pod = w.pod_on("web-0", &node);
    interrupt(&mut w, "default-a", "i-1", Some("default-r"));
    w.now += 10_000;
    let plan = w.plan();
    assert!(!plan.steps.contains(&("default-a".into(), Step::Terminating)), "its replacement is not ready");
    for s in [launched("i-2"), Step::Registered, Step::Initialized] {
        w.step("default-r", s);
    }
    let plan = w.plan();
    assert!(plan.steps.contains(&("default-a".into(), Step::Terminating)), "{:?}", plan.steps);
    assert!(has(&plan, |a| matches!(a, Action::Event(e) if e.reason == "InterruptionDraining")));
    assert!(has(&plan, |a| matches!(a, Action::Evict(p) if *p == pod)), "evicted while there is time");
}

#[test]
fn an_interrupted_node_drains_by_its_deadline_without_its_replacement() {
    let mut w = World::new();
    w.claim("default-a", vec![launched("i-1")]);
    let node = w.node("i-1");
    let plan = w.plan();
    w.apply(&plan);
    let pod = w.pod_on("web-0", &node);
    let warned = w.now;
    interrupt(&mut w, "default-a", "i-1", Some("default-r"));
    w.now = warned + 120_000 - 45_001;
    assert!(!w.plan().steps.contains(&("default-a".into(), Step::Terminating)));
    w.now += 1;
    let plan = w.plan();
    assert!(plan.steps.contains(&("default-a".into(), Step::Terminating)), "the drain lead reached");
    assert!(has(&plan, |a| matches!(a, Action::Evict(p) if *p == pod)));
    w.apply(&plan);
    // The pod was evicted in the world; put it back as if its PDB refused: at the deadline
    // less its 30 s grace it is deleted, PDBs or not.
    let pod = w.pod_on("web-0", &node);
    w.now = warned + 120_000 - 30_000;
    let plan = w.plan();
    assert!(has(&plan, |a| matches!(a, Action::DeletePod { pod: p, .. } if *p == pod)), "{:?}", plan.effects);
}

/// EC2 takes the instance at the deadline: a pod whose grace period is longer than what is
/// left when it must go is deleted with what is left, not its own (it would be killed
/// mid-shutdown otherwise); a pod whose grace fits keeps its own.
#[test]
fn an_interrupted_nodes_pods_are_deleted_with_their_grace_cut_to_the_deadline() {
    let mut w = World::new();
    w.claim("default-a", vec![launched("i-1")]);
    let node = w.node("i-1");
    let plan = w.plan();
    w.apply(&plan);
    let slow = w.pod_on("slow", &node);
    let quick = w.pod_on("quick", &node);
    for (key, grace) in [(&slow, 300), (&quick, 10)] {
        let mut p = w.snap.pods.get(key).map(|p| p.as_ref().clone()).expect("pod");
        p.termination_grace_seconds = Some(grace);
        w.snap.pods.insert(key.clone(), Arc::new(p));
    }
    let warned = w.now;
    interrupt(&mut w, "default-a", "i-1", None);
    // The drain starts 45 s before the deadline: the slow pod is past its own grace's start
    // and goes now, told it has 45 s; the quick one is evicted.
    w.now = warned + 120_000 - 45_000;
    let plan = w.plan();
    let deleted: Vec<(PodKey, Option<i64>)> = plan
        .effects
        .iter()
        .filter_map(|e| match &e.action {
            Action::DeletePod { pod, grace_seconds } => Some((pod.clone(), *grace_seconds)),
            _ => None,
        })
        .collect();
    assert_eq!(deleted, vec![(slow, Some(45))], "{:?}", plan.effects);
    assert!(has(&plan, |a| matches!(a, Action::Evict(p) if *p == quick)));
    // 5 s before the deadline the quick one, if still there, is deleted with 5 s.
    w.now = warned + 120_000 - 5_000;
    let plan = w.plan();
    assert!(
        has(&plan, |a| matches!(a, Action::DeletePod { pod, grace_seconds: Some(5) } if *pod == quick)),
        "{:?}",
        plan.effects
    );
}
