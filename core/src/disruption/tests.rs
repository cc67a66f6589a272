//! The disruption planner's tests: a pool of initialized nodes in a ledger and a snapshot.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use super::*;
use crate::catalog::{CapacityType, Catalog, NodeClassSettings};
use crate::cluster::{IntOrPercent, NodeClaim, Pdb, TERMINATION_FINALIZER};
use crate::labels::{self, LabelSelector};
use crate::ledger::{ClaimRequest, Command, Entry, LaunchBatch, State, Step};
use crate::node::Node;
use crate::nodepool::{Budget, BudgetNodes, NodeClaimSpec};
use crate::pod::PodKey;
use crate::requirements::Requirements;
use crate::resources::ResourceList;

const POOL: &str = "default";
const ZONE: &str = "us-east-1a";

fn types() -> &'static [InstanceType] {
    static TYPES: OnceLock<Vec<InstanceType>> = OnceLock::new();
    TYPES.get_or_init(|| {
        let c = Catalog::embedded("us-east-1").expect("catalog");
        c.instance_types(&NodeClassSettings::default(), None)
            .into_iter()
            .filter(|t| t.name == "m5.large" || t.name == "m5.xlarge")
            .collect()
    })
}

struct World {
    pool: NodePool,
    ledger: State,
    snap: Snapshot,
    memory: Memory,
    now: Millis,
    cloud_drift: BTreeMap<String, String>,
    nominated: BTreeMap<String, Millis>,
    /// The validation delay; 0 unless a test is about it.
    validation: Millis,
    /// Commands a round may propose; 1 (Karpenter's) unless a test is about it.
    max_commands: usize,
}

impl World {
    fn new() -> Self {
        let mut ledger = State::default();
        let e = Entry { term: 1, at: 0, command: Command::SetPool { pool: POOL.into(), limits: ResourceList::new() } };
        ledger.apply(&e);
        World {
            pool: NodePool::new(POOL, Requirements::new()),
            ledger,
            snap: Snapshot::default(),
            memory: Memory::default(),
            now: 1_000_000,
            cloud_drift: BTreeMap::new(),
            nominated: BTreeMap::new(),
            validation: 0,
            max_commands: 1,
        }
    }

    fn propose(&mut self, command: Command) -> crate::ledger::Outcome {
        self.ledger.apply(&Entry { term: 1, at: self.now, command })
    }

    fn budgets(&mut self, budgets: Vec<Budget>) {
        self.propose(Command::SetBudgets { pool: POOL.into(), budgets, rate: None });
    }

    /// An initialized m5.large node `id` (claim, NodeClaim stamped with the pool's hash,
    /// node) running `pods`.
    fn node(&mut self, id: &str, pods: &[&str]) {
        let req = ClaimRequest {
            id: id.into(),
            zone: ZONE.into(),
            resources: ResourceList::cpu_mem(2000, 8 << 30),
            price_per_hour: 96_000,
        };
        self.propose(Command::Reserve { pool: POOL.into(), claims: vec![req] });
        let batch = LaunchBatch { id: format!("b-{id}"), claims: vec![id.to_string()].into() };
        self.propose(Command::Launch { zone: ZONE.into(), batches: vec![batch] });
        let launched = Step::Launched {
            batch: format!("b-{id}"),
            instance: format!("i-{id}"),
            resources: ResourceList::cpu_mem(2000, 8 << 30),
            allocatable: ResourceList::cpu_mem(1930, 7 << 30),
            price_per_hour: 96_000,
            instance_type: "m5.large".into(),
            capacity_type: CapacityType::OnDemand,
        };
        let steps =
            vec![(id.to_string(), launched), (id.to_string(), Step::Registered), (id.to_string(), Step::Initialized)];
        self.propose(Command::Advance { steps });
        let annotations: labels::Labels = [
            (drift::HASH_ANNOTATION.to_string(), drift::template_hash(&self.pool)),
            (drift::HASH_VERSION_ANNOTATION.to_string(), drift::HASH_VERSION.to_string()),
        ]
        .into_iter()
        .collect();
        let nc = NodeClaim {
            name: id.into(),
            spec: NodeClaimSpec {
                nodepool: POOL.into(),
                annotations,
                expire_after: self.pool.expire_after,
                termination_grace_period: self.pool.termination_grace_period,
                ..NodeClaimSpec::default()
            },
            finalizers: vec![TERMINATION_FINALIZER.into()],
            deleting: false,
            status: Default::default(),
            resource_version: 1,
            created: Some(self.now),
        };
        self.snap.nodeclaims.insert(id.into(), Arc::new(nc));
        let node = Node {
            name: format!("node-{id}"),
            labels: [
                (labels::NODEPOOL.to_string(), POOL.to_string()),
                (labels::INSTANCE_TYPE.to_string(), "m5.large".to_string()),
                (labels::CAPACITY_TYPE.to_string(), "on-demand".to_string()),
                (labels::ZONE.to_string(), ZONE.to_string()),
            ]
            .into_iter()
            .collect(),
            allocatable: ResourceList::cpu_mem(1930, 7 << 30),
            initialized: true,
            ready: true,
            provider_id: Some(crate::lifecycle::provider_id(ZONE, &format!("i-{id}"))),
            ..Node::default()
        };
        self.snap.nodes.insert(node.name.clone(), Arc::new(node));
        for p in pods {
            self.pod(id, p);
        }
    }

    fn pod(&mut self, id: &str, name: &str) {
        let mut p = Pod::new("default", name, ResourceList::cpu_mem(200, 256 << 20));
        p.node_name = Some(format!("node-{id}"));
        p.labels = crate::shared::Shared::new([("app".to_string(), "web".to_string())].into_iter().collect());
        p.started_at = Some(0);
        self.snap.pods.insert(p.key.clone(), Arc::new(p));
    }

    fn plan(&mut self) -> Plan {
        let leases: BTreeMap<String, String> = self
            .ledger
            .disruptions()
            .iter()
            .flat_map(|(id, d)| d.candidates.iter().map(move |c| (c.clone(), id.clone())))
            .collect();
        let available: BTreeMap<DisruptionReason, u32> =
            [DisruptionReason::Empty, DisruptionReason::Drifted, DisruptionReason::Underutilized]
                .into_iter()
                .map(|r| (r, self.ledger.allowance(POOL, r, &[], self.now).map(|a| a.available()).unwrap_or(0)))
                .collect();
        let claims: Vec<Claim> = self.ledger.claims_of(POOL).cloned().collect();
        let pools = [PoolInput { pool: self.pool.clone(), instance_types: Arc::new(types().to_vec()) }];
        let input = Input {
            pool: &self.pool,
            types: types(),
            claims: &claims,
            leases: &leases,
            available: &available,
            cloud_drift: &self.cloud_drift,
            nominated: &self.nominated,
            snapshot: &self.snap,
            pools: &pools,
            opts: &SolveOptions::default(),
            spot_to_spot: false,
            validation: self.validation,
            max_commands: self.max_commands,
            synced: true,
            now: self.now,
        };
        plan(&input, &mut self.memory)
    }

    fn verdict(plan: &Plan, id: &str) -> Verdict {
        plan.decisions.get(id).map(|d| d.verdict.clone()).unwrap_or(Verdict::Keep("no decision".into()))
    }
}

fn budget(nodes: BudgetNodes) -> Budget {
    Budget { nodes, schedule: None, duration: None, reasons: vec![] }
}

#[test]
fn empty_nodes_go_once_settled_and_within_the_budget_and_every_node_gets_a_reason() {
    let mut w = World::new();
    for i in 0..20 {
        let id = format!("n{i:02}");
        if i < 5 { w.node(&id, &[]) } else { w.node(&id, &[&format!("web-{i}")]) }
    }
    // First sight: the nodes' pod history is unknown, so they wait consolidateAfter (0s: one round).
    let first = w.plan();
    assert_eq!(first.decisions.len(), 20, "every node has a decision");
    w.now += 1_000;
    let plan = w.plan();
    let proposal = plan.first().cloned().expect("emptiness proposes");
    assert_eq!(proposal.method, Method::Emptiness);
    assert_eq!(proposal.candidates.len(), 2, "10% of 20 nodes, rounded up");
    let exhausted = (0..5)
        .filter(|i| matches!(World::verdict(&plan, &format!("n{i:02}")), Verdict::BudgetExhausted { .. }))
        .count();
    assert_eq!(exhausted, 3);
    assert!(matches!(World::verdict(&plan, "n07"), Verdict::Keep(why) if why.contains("another command goes first")));
    // Granted: the two count as disrupting, nothing more is proposed.
    let out = w.propose(Command::Disrupt {
        pool: POOL.into(),
        command: "c1".into(),
        reason: DisruptionReason::Empty,
        candidates: proposal.candidates.clone(),
        replacements: vec![],
        not_ready: vec![],
    });
    assert_eq!(out, crate::ledger::Outcome::Disrupting { refused: None });
    let after = w.plan();
    assert_eq!(after.first(), None);
    let leased = &proposal.candidates[0];
    assert!(matches!(World::verdict(&after, leased), Verdict::Blocked(Blocker::Leased { .. })));
    let shown = after.decisions.get(leased).map(|d| d.verdict.to_string()).unwrap_or_default();
    assert!(shown.contains("disruption command c1 holds it"), "{shown}");
}

#[test]
fn expire_after_counts_from_the_nodeclaims_creation_not_from_when_the_ledger_took_it_over() {
    let mut w = World::new();
    w.now = 100_000_000;
    w.pool.expire_after = Some(Duration::from_secs(3600));
    // A NodeClaim made 59 minutes ago (by Karpenter before a migration, or before a restart
    // of a ledger that kept no log), taken over by the ledger now.
    w.node("migrated", &["web-1"]);
    let made = w.now - 59 * 60_000;
    let nc = w.snap.nodeclaims.get("migrated").cloned().expect("nodeclaim");
    w.snap.nodeclaims.insert("migrated".into(), Arc::new(NodeClaim { created: Some(made), ..nc.as_ref().clone() }));
    assert!(w.plan().expired.is_empty());
    w.now += 60_000;
    let plan = w.plan();
    assert_eq!(plan.expired, vec!["migrated".to_string()], "an hour after its creation, a minute after its adoption");
}

#[test]
fn a_node_running_only_a_static_pod_is_empty() {
    let mut w = World::new();
    w.node("static", &[]);
    // kube-proxy as a static pod: its mirror has its Node as owner (the annotation the
    // kubelet also writes is the converter's to keep: tested there).
    let mut mirror = Pod::new("kube-system", "kube-proxy-node-static", ResourceList::cpu_mem(100, 128 << 20));
    mirror.node_name = Some("node-static".into());
    mirror.owned_by_node = true;
    w.snap.pods.insert(mirror.key.clone(), Arc::new(mirror));
    w.plan();
    w.now += 1_000;
    let plan = w.plan();
    let proposal = plan.first().cloned().expect("the node is empty");
    assert_eq!((proposal.method, proposal.candidates.clone()), (Method::Emptiness, vec!["static".to_string()]));
}

#[test]
fn consolidate_after_waits_from_the_last_pod_change_and_never_keeps_every_node() {
    let mut w = World::new();
    w.pool.disruption.consolidate_after = Some(Duration::from_secs(30));
    w.node("a", &["web-1"]);
    w.plan();
    // Its pod goes: the wait starts now.
    w.snap.pods.remove(&PodKey::new("default", "web-1"));
    w.now += 10_000;
    let p = w.plan();
    // The change is seen by this plan: the wait starts now.
    assert_eq!(World::verdict(&p, "a"), Verdict::Settling { changed_ago: 0, after: 30_000 });
    assert!(World::verdict(&p, "a").to_string().contains("its pods changed 0s ago; consolidateAfter is 30s"));
    // Its NodeClaim's conditions: not consolidatable yet, with a message that does not tick.
    let [c, d] = p.conditions("a").expect("conditions");
    assert_eq!((c.kind.as_str(), c.status, c.reason.as_str()), ("Consolidatable", false, "Settling"));
    assert_eq!(c.message, "its pods changed within its consolidateAfter (30s)");
    assert_eq!((d.kind.as_str(), d.status), ("Drifted", false));
    w.now += 29_000;
    let p = w.plan();
    assert_eq!(p.first(), None);
    assert_eq!(
        p.conditions("a").map(|[c, _]| c.message),
        Some("its pods changed within its consolidateAfter (30s)".into())
    );
    w.now += 1_000;
    let p = w.plan();
    assert_eq!(p.conditions("a").map(|[c, _]| (c.status, c.reason)), Some((true, "Consolidatable".into())));
    assert_eq!(p.first().map(|p| p.candidates.clone()), Some(vec!["a".to_string()]));
    w.pool.disruption.consolidate_after = None;
    let never = w.plan();
    assert_eq!(never.first(), None);
    assert!(matches!(World::verdict(&never, "a"), Verdict::Keep(why) if why.contains("Never")));
}

#[test]
fn an_expired_node_is_terminated_whatever_the_budget_or_its_pods_say() {
    let mut w = World::new();
    w.pool.expire_after = Some(Duration::from_secs(3600));
    w.budgets(vec![budget(BudgetNodes::Count(0))]);
    w.node("old", &["web-1"]);
    let mut p = Pod::new("default", "precious", ResourceList::cpu_mem(100, 1 << 20));
    p.annotations.insert(crate::plane::DO_NOT_DISRUPT.into(), "true".into());
    p.node_name = Some("node-old".into());
    w.snap.pods.insert(p.key.clone(), Arc::new(p));
    w.now += 3_599_000;
    assert!(w.plan().expired.is_empty());
    w.now += 1_000;
    let plan = w.plan();
    assert_eq!(plan.expired, vec!["old".to_string()]);
    assert!(World::verdict(&plan, "old").to_string().contains("expireAfter (3600s)"));
}

#[test]
fn a_drifted_node_goes_one_per_command_empty_first_and_waits_for_its_budget() {
    let mut w = World::new();
    w.pool.disruption.consolidate_after = None;
    w.budgets(vec![budget(BudgetNodes::Percent(100))]);
    w.node("busy", &["web-1"]);
    w.node("idle", &[]);
    w.node("idle2", &[]);
    assert_eq!(w.plan().first(), None, "nothing drifted");
    w.pool.labels.insert("team".into(), "payments".into());
    let plan = w.plan();
    let proposal = plan.first().cloned().expect("drift proposes");
    assert_eq!((proposal.method, proposal.candidates.len()), (Method::Drift, 1));
    assert!(proposal.candidates[0].starts_with("idle"), "an empty node first");
    assert!(World::verdict(&plan, &proposal.candidates[0]).to_string().contains("template changed"));
    let [_, drifted] = plan.conditions("busy").expect("conditions");
    assert_eq!((drifted.status, drifted.reason.as_str()), (true, "NodePoolDrifted"));
    assert_eq!(drifted.message, "the nodepool's template changed");
    w.budgets(vec![Budget { reasons: vec![DisruptionReason::Drifted], ..budget(BudgetNodes::Count(0)) }]);
    let blocked = w.plan();
    assert_eq!(blocked.first(), None);
    assert!(matches!(World::verdict(&blocked, "idle"), Verdict::BudgetExhausted { method: Method::Drift }));
    // The cloud's drift counts the same way.
    let mut w2 = World::new();
    w2.budgets(vec![budget(BudgetNodes::Percent(100))]);
    w2.pool.disruption.consolidate_after = None;
    w2.node("x", &[]);
    w2.cloud_drift.insert("x".into(), "AMIDrift".into());
    let p = w2.plan();
    assert!(World::verdict(&p, "x").to_string().contains("AMIDrift"), "{:?}", World::verdict(&p, "x"));
}

#[test]
fn do_not_disrupt_and_pdbs_block_and_say_which() {
    let mut w = World::new();
    w.node("a", &["web-1"]);
    w.node("b", &[]);
    let mut p = Pod::new("default", "batch", ResourceList::cpu_mem(100, 1 << 20));
    p.annotations.insert(crate::plane::DO_NOT_DISRUPT.into(), "true".into());
    p.node_name = Some("node-b".into());
    w.snap.pods.insert(p.key.clone(), Arc::new(p));
    let pdb = Pdb {
        key: PodKey::new("default", "web"),
        selector: LabelSelector::from_labels([("app", "web")]),
        min_available: Some(IntOrPercent::Int(1)),
        max_unavailable: None,
        disruptions_allowed: 0,
    };
    w.snap.pdbs.insert(pdb.key.clone(), Arc::new(pdb));
    let plan = w.plan();
    assert!(
        World::verdict(&plan, "a").to_string().contains("pdb default/web allows no disruption of pod default/web-1")
    );
    assert!(World::verdict(&plan, "b").to_string().contains("pod default/batch has karpenter.sh/do-not-disrupt"));
    let mut node = w.snap.nodes.get("node-a").map(|n| n.as_ref().clone()).expect("node");
    node.do_not_disrupt = true;
    w.snap.nodes.insert(node.name.clone(), Arc::new(node));
    assert!(World::verdict(&w.plan(), "a").to_string().contains("the node has karpenter.sh/do-not-disrupt"));
}

#[test]
fn nothing_is_decided_on_an_unsynced_view() {
    let mut w = World::new();
    w.node("a", &[]);
    let claims: Vec<Claim> = w.ledger.claims_of(POOL).cloned().collect();
    let (leases, available, drift) = (BTreeMap::new(), BTreeMap::new(), BTreeMap::new());
    let input = Input {
        pool: &w.pool,
        types: types(),
        claims: &claims,
        leases: &leases,
        available: &available,
        cloud_drift: &drift,
        nominated: &BTreeMap::new(),
        snapshot: &w.snap,
        pools: &[],
        opts: &SolveOptions::default(),
        spot_to_spot: false,
        validation: 0,
        max_commands: 1,
        synced: false,
        now: w.now,
    };
    assert_eq!(plan(&input, &mut w.memory), Plan::default());
}

/// Gives node `id` room for `slots` pods (the world's nodes have no pod slots of their own).
fn pod_slots(w: &mut World, id: &str, slots: i64) {
    let name = format!("node-{id}");
    let mut n = w.snap.nodes[&name].as_ref().clone();
    n.allocatable.set(crate::resources::ResourceName::Pods, slots);
    w.snap.nodes.insert(name, Arc::new(n));
}

fn pod_of(w: &mut World, id: &str, name: &str, cpu: i64) {
    let mut p = Pod::new("default", name, ResourceList::cpu_mem(cpu, 256 << 20));
    p.node_name = Some(format!("node-{id}"));
    p.started_at = Some(0);
    w.snap.pods.insert(p.key.clone(), Arc::new(p));
}

#[test]
fn underused_nodes_are_consolidated_once_the_command_held_for_the_validation_delay() {
    let mut w = World::new();
    w.validation = 15_000;
    w.budgets(vec![budget(BudgetNodes::Percent(100))]);
    for id in ["a", "b", "c"] {
        w.node(id, &[]);
        pod_of(&mut w, id, &format!("web-{id}"), 200);
    }
    let first = w.plan();
    assert_eq!(first.first(), None, "validating");
    let shown = World::verdict(&first, "a").to_string();
    assert!(shown.contains("validating: acts in 15s"), "{shown}");
    w.now += 14_000;
    assert_eq!(w.plan().first(), None);
    w.now += 1_000;
    let plan = w.plan();
    let p = plan.first().cloned().expect("validated");
    assert_eq!(p.method, Method::MultiNodeConsolidation);
    assert_eq!(p.candidates.len(), 3, "three nodes of one small pod each fold onto one");
    assert_eq!(p.replacements.len(), 1);
    assert!(p.detail.contains("replaced by one cheaper node"), "{}", p.detail);
}

#[test]
fn a_changed_command_starts_its_validation_again() {
    let mut w = World::new();
    w.validation = 15_000;
    w.budgets(vec![budget(BudgetNodes::Percent(100))]);
    for id in ["a", "b", "c"] {
        w.node(id, &[]);
        pod_of(&mut w, id, &format!("web-{id}"), 200);
    }
    assert_eq!(w.plan().first(), None);
    w.now += 10_000;
    // A pod lands on c: the three nodes now need a larger replacement, another command.
    pod_of(&mut w, "c", "web-late", 1_500);
    assert_eq!(w.plan().first(), None);
    w.now += 10_000;
    assert_eq!(w.plan().first(), None, "only 10 s since the command changed");
    w.now += 5_000;
    assert!(w.plan().first().is_some());
}

#[test]
fn a_node_whose_pods_fit_nowhere_cheaper_stays_and_says_why() {
    let mut w = World::new();
    // On-demand only: no spot replacement undercuts two on-demand m5.large.
    w.pool.requirements.add(labels::CAPACITY_TYPE, crate::requirements::Requirement::is_in(["on-demand"]));
    w.budgets(vec![budget(BudgetNodes::Percent(100))]);
    for id in ["a", "b"] {
        w.node(id, &[]);
        pod_of(&mut w, id, &format!("big-{id}"), 1_500);
    }
    let plan = w.plan();
    assert_eq!(plan.first(), None);
    let shown = World::verdict(&plan, "a").to_string();
    assert!(shown.contains("no cheaper node"), "{shown}");
}

/// A pool that launches on-demand m5.large only: no new node undercuts one of its nodes, so
/// each can only go by a delete.
fn delete_only_world() -> World {
    let mut w = World::new();
    w.pool.requirements.add(labels::INSTANCE_TYPE, crate::requirements::Requirement::is_in(["m5.large"]));
    w.pool.requirements.add(labels::CAPACITY_TYPE, crate::requirements::Requirement::is_in(["on-demand"]));
    w.budgets(vec![budget(BudgetNodes::Percent(100))]);
    w
}

/// A node of [`delete_only_world`] running one pod of 1,500m (of 1,930m), with 29 pod slots.
fn full_node(w: &mut World, id: &str) {
    w.node(id, &[]);
    pod_of(w, id, &format!("big-{id}"), 1_500);
    pod_slots(w, id, 29);
}

/// A node only a delete could move is not tried when the other nodes' room, counted, cannot
/// hold its pods: two nodes each running 1,500m of 1,930m.
#[test]
fn a_node_only_a_delete_could_move_is_not_tried_when_the_other_nodes_room_cannot_hold_its_pods() {
    let mut w = delete_only_world();
    full_node(&mut w, "a");
    full_node(&mut w, "b");
    let plan = w.plan();
    assert_eq!(plan.first(), None);
    for id in ["a", "b"] {
        let said = World::verdict(&plan, id).to_string();
        let want = "its largest pod by CPU (1500m) fits on no other node, and no cheaper node than";
        assert!(said.contains(want), "{said}");
    }
    assert_eq!(w.memory.stuck.get("a"), None, "no trial: no pod to remember");
    assert_eq!(w.memory.stuck.skipped(), 2);
}

/// A node only a delete could move, whose pod the room of another node would hold but its
/// taint refuses. Its trial stops at the first pod that needs a new node, and the next round
/// asks that pod alone whether it fits on another node now: while it does not, the trial is
/// skipped with the same answer; once it does, the move is tried and holds.
#[test]
fn a_node_only_a_delete_could_move_asks_first_whether_the_pod_that_kept_it_fits_now() {
    let mut w = delete_only_world();
    full_node(&mut w, "a");
    full_node(&mut w, "b");
    // Room for either pod, behind a taint neither tolerates (and never a candidate itself).
    w.node("tainted", &[]);
    pod_slots(&mut w, "tainted", 29);
    let mut t = w.snap.nodes["node-tainted"].as_ref().clone();
    t.taints.push(crate::taints::Taint {
        key: "dedicated".into(),
        value: "x".into(),
        effect: crate::taints::Effect::NoSchedule,
    });
    t.do_not_disrupt = true;
    w.snap.nodes.insert("node-tainted".into(), Arc::new(t));
    let first = w.plan();
    assert_eq!(first.first(), None);
    let said = World::verdict(&first, "a").to_string();
    assert!(said.contains("pod default/big-a would need a new node, and no cheaper node than"), "{said}");
    assert_eq!(w.memory.stuck.get("a"), Some(&PodKey::new("default", "big-a")));
    assert_eq!(w.memory.stuck.skipped(), 0, "the first round tries every move");

    // Something changes that gives big-a no room: a third full node. a and b are not tried
    // again; each names the pod that fits on no other node.
    full_node(&mut w, "c");
    w.now += 60_000;
    let second = w.plan();
    assert_eq!(second.first(), None);
    for id in ["a", "b"] {
        let said = World::verdict(&second, id).to_string();
        let want = format!("pod default/big-{id} fits on no other node, and no cheaper node than");
        assert!(said.contains(&want), "{said}");
    }
    assert!(w.memory.stuck.skipped() >= 2, "a and b skipped: {}", w.memory.stuck.skipped());

    // b's pod shrinks (a new pod in its place): big-a fits on b now, so a is tried, and goes.
    w.snap.pods.remove(&PodKey::new("default", "big-b"));
    pod_of(&mut w, "b", "small-b", 300);
    w.now += 60_000;
    let skipped = w.memory.stuck.skipped();
    let third = w.plan();
    let p = third.first().cloned().unwrap_or_else(|| panic!("big-a fits on b: {:?}", third.decisions));
    assert_eq!((p.candidates, p.replacements.len()), (vec!["a".to_string()], 0));
    assert_eq!(w.memory.stuck.get("a"), None, "a's pod fit: nothing left to remember");
    assert!(w.memory.stuck.skipped() <= skipped + 1, "only c may have been skipped");
}

/// A repack takes the emptiest candidates, not the first by savings. Three nodes run one
/// pod of 1,500m (first by savings: one pod each to evict) and three run three pods of 300m;
/// every node is full by its pod slots, so no pod moves onto another node, and a pool of
/// on-demand m5.large has no cheaper node for any one of them. With room for three in the
/// budget, the three 1,500m pods need three new nodes; the nine 300m pods go onto two.
#[test]
fn a_repack_takes_the_emptiest_nodes_the_budget_has_room_for_not_the_first_by_savings() {
    let mut w = delete_only_world();
    w.budgets(vec![budget(BudgetNodes::Count(3))]);
    for id in ["f1", "f2", "f3"] {
        w.node(id, &[]);
        pod_of(&mut w, id, &format!("big-{id}"), 1_500);
        pod_slots(&mut w, id, 1);
    }
    for id in ["e1", "e2", "e3"] {
        w.node(id, &[]);
        for k in 0..3 {
            pod_of(&mut w, id, &format!("small-{id}-{k}"), 300);
        }
        pod_slots(&mut w, id, 3);
    }
    let plan = w.plan();
    let p = plan.first().cloned().unwrap_or_else(|| panic!("a repack of e1, e2, e3: {:?}", plan.decisions));
    assert_eq!(p.method, Method::Repack);
    let mut candidates = p.candidates.clone();
    candidates.sort();
    assert_eq!(candidates, ["e1", "e2", "e3"]);
    assert_eq!(p.replacements.len(), 2, "nine pods of 300m on two m5.large: {}", p.detail);
    for id in ["f1", "f2", "f3"] {
        let said = World::verdict(&plan, id).to_string();
        assert!(said.starts_with("kept"), "{id}: {said}");
    }
}

#[test]
fn when_empty_leaves_nodes_with_pods_alone() {
    let mut w = World::new();
    w.pool.disruption.consolidation_policy = ConsolidationPolicy::WhenEmpty;
    w.budgets(vec![budget(BudgetNodes::Percent(100))]);
    for id in ["a", "b"] {
        w.node(id, &[]);
        pod_of(&mut w, id, &format!("web-{id}"), 200);
    }
    let plan = w.plan();
    assert_eq!(plan.first(), None);
    assert!(World::verdict(&plan, "a").to_string().contains("WhenEmpty"));
}

#[test]
fn a_command_terminates_its_candidates_once_its_replacement_is_initialized_and_rolls_back_if_it_fails() {
    let mut w = World::new();
    w.budgets(vec![budget(BudgetNodes::Percent(100))]);
    w.node("old", &[]);
    let replacement = ClaimRequest {
        id: "new".into(),
        zone: ZONE.into(),
        resources: ResourceList::cpu_mem(2000, 8 << 30),
        price_per_hour: 50_000,
    };
    let out = w.propose(Command::Disrupt {
        pool: POOL.into(),
        command: "c".into(),
        reason: DisruptionReason::Underutilized,
        candidates: vec!["old".into()],
        replacements: vec![replacement],
        not_ready: vec![],
    });
    assert_eq!(out, crate::ledger::Outcome::Disrupting { refused: None });
    let cmd = w.ledger.disruptions().get("c").cloned().expect("command");
    let timeout = 600_000;
    assert_eq!(progress(&w.ledger, &cmd, w.now, timeout), Progress::Waiting);
    assert!(
        matches!(progress(&w.ledger, &cmd, w.now + timeout, timeout), Progress::RollBack(why) if why.contains("600s"))
    );
    let batch = LaunchBatch { id: "b-new".into(), claims: vec!["new".to_string()].into() };
    w.propose(Command::Launch { zone: ZONE.into(), batches: vec![batch] });
    let launched = Step::Launched {
        batch: "b-new".into(),
        instance: "i-new".into(),
        resources: ResourceList::cpu_mem(2000, 8 << 30),
        allocatable: ResourceList::cpu_mem(1930, 7 << 30),
        price_per_hour: 50_000,
        instance_type: "m5.large".into(),
        capacity_type: CapacityType::Spot,
    };
    let steps = vec![("new".to_string(), launched), ("new".to_string(), Step::Registered)];
    w.propose(Command::Advance { steps });
    assert_eq!(progress(&w.ledger, &cmd, w.now, timeout), Progress::Waiting);
    w.propose(Command::Advance { steps: vec![("new".into(), Step::Initialized)] });
    assert_eq!(progress(&w.ledger, &cmd, w.now, timeout), Progress::Terminate(vec!["old".into()]));
    w.propose(Command::Advance { steps: vec![("old".into(), Step::Terminating)] });
    assert_eq!(progress(&w.ledger, &cmd, w.now, timeout), Progress::Done);
    // A replacement that fails rolls the command back.
    w.node("old2", &[]);
    let out = w.propose(Command::Disrupt {
        pool: POOL.into(),
        command: "d".into(),
        reason: DisruptionReason::Drifted,
        candidates: vec!["old2".into()],
        replacements: vec![ClaimRequest {
            id: "new2".into(),
            zone: ZONE.into(),
            resources: ResourceList::cpu_mem(2000, 8 << 30),
            price_per_hour: 50_000,
        }],
        not_ready: vec![],
    });
    assert_eq!(out, crate::ledger::Outcome::Disrupting { refused: None });
    let cmd = w.ledger.disruptions().get("d").cloned().expect("command");
    w.propose(Command::Advance { steps: vec![("new2".into(), Step::Gone)] });
    assert_eq!(progress(&w.ledger, &cmd, w.now, timeout), Progress::RollBack("replacement new2 is gone".into()));
}

#[test]
fn consolidation_is_not_simulated_again_while_nothing_changed() {
    let mut w = World::new();
    w.pool.requirements.add(labels::CAPACITY_TYPE, crate::requirements::Requirement::is_in(["on-demand"]));
    w.budgets(vec![budget(BudgetNodes::Percent(100))]);
    for id in ["a", "b"] {
        w.node(id, &[]);
        pod_of(&mut w, id, &format!("big-{id}"), 1_500);
    }
    let first = w.plan();
    assert!(World::verdict(&first, "a").to_string().contains("no cheaper node"));
    w.now += 60_000;
    let again = w.plan();
    let shown = World::verdict(&again, "a").to_string();
    assert!(shown.contains("no consolidation was found 60s ago and nothing changed since"), "{shown}");
    // Its NodeClaim's message stays what the simulating round said: no write for a quiet round.
    let message = |p: &Plan| p.conditions("a").map(|[c, _]| c.message);
    assert_eq!(message(&again), message(&first));
    assert!(
        message(&first).is_some_and(|m| m.starts_with("kept: ") && m.contains("no cheaper node")),
        "{:?}",
        message(&first)
    );
    // A pod goes: simulated again, and now b's pod fits on a.
    w.snap.pods.remove(&PodKey::new("default", "big-a"));
    w.now += 1_000;
    let changed = w.plan();
    assert!(!World::verdict(&changed, "a").to_string().contains("nothing changed"));
    // Unchanged for longer than the recheck: simulated again.
    let mut w2 = World::new();
    w2.pool.requirements.add(labels::CAPACITY_TYPE, crate::requirements::Requirement::is_in(["on-demand"]));
    w2.budgets(vec![budget(BudgetNodes::Percent(100))]);
    for id in ["a", "b"] {
        w2.node(id, &[]);
        pod_of(&mut w2, id, &format!("big-{id}"), 1_500);
    }
    w2.plan();
    w2.now += CONSOLIDATION_RECHECK;
    assert!(World::verdict(&w2.plan(), "a").to_string().contains("no cheaper node"), "rechecked after 5 minutes");
}

/// Nodes and pods as they were, a node that becomes a candidate is a move not tried yet: the
/// cluster is not quiet for it. Under load, consolidation ran while an evicted pod's successor
/// was not ready (its PDB allowing nothing), found nothing, and stayed quiet for 5 minutes
/// once the PDB allowed again (the suite's scale-down stopped at 4 nodes of 6 pods). The same
/// holds for a node whose pods have just been still for `consolidateAfter`.
#[test]
fn consolidation_is_simulated_again_when_a_node_becomes_a_candidate_with_nothing_else_changed() {
    let ssd = |w: &mut World, id: &str| {
        let name = format!("node-{id}");
        let mut n = w.snap.nodes.get(&name).map(|n| n.as_ref().clone()).expect("node");
        n.labels.insert("disk".into(), "ssd".into());
        w.snap.nodes.insert(name, Arc::new(n));
        let mut p = Pod::new("default", &format!("big-{id}"), ResourceList::cpu_mem(1_000, 256 << 20));
        p.node_name = Some(format!("node-{id}"));
        p.node_selector = crate::shared::Shared::new([("disk".to_string(), "ssd".to_string())].into_iter().collect());
        p.started_at = Some(0);
        w.snap.pods.insert(p.key.clone(), Arc::new(p));
    };
    let pdb = |allowed: i32| Pdb {
        key: PodKey::new("default", "web"),
        selector: LabelSelector::from_labels([("app", "web")]),
        min_available: Some(IntOrPercent::Int(1)),
        max_unavailable: None,
        disruptions_allowed: allowed,
    };
    // a and b each run a pod only an ssd node takes (neither has room for the other's, and
    // the pool launches no ssd node); c runs one small pod its PDB holds.
    let mut w = World::new();
    w.budgets(vec![budget(BudgetNodes::Percent(100))]);
    for id in ["a", "b"] {
        w.node(id, &[]);
        ssd(&mut w, id);
    }
    w.node("c", &["web-c"]);
    w.snap.pdbs.insert(PodKey::new("default", "web"), Arc::new(pdb(0)));
    let first = w.plan();
    assert_eq!(first.first(), None, "{:?}", first.decisions);
    assert!(World::verdict(&first, "c").to_string().contains("pdb default/web allows no disruption"));
    w.now += 10_000;
    let quiet = w.plan();
    assert!(World::verdict(&quiet, "a").to_string().contains("nothing changed since"), "{:?}", quiet.decisions);
    // The PDB allows one again: c's pod fits on a, and c goes.
    w.snap.pdbs.insert(PodKey::new("default", "web"), Arc::new(pdb(1)));
    w.now += 10_000;
    let again = w.plan();
    assert_eq!(again.first().map(|p| p.candidates.clone()), Some(vec!["c".to_string()]), "{:?}", again.decisions);

    // The same with c's pods not yet still for consolidateAfter when the rest was found quiet.
    let mut w = World::new();
    w.pool.disruption.consolidate_after = Some(Duration::from_secs(30));
    w.budgets(vec![budget(BudgetNodes::Percent(100))]);
    for id in ["a", "b"] {
        w.node(id, &[]);
        ssd(&mut w, id);
    }
    w.plan();
    w.now += 30_000;
    w.node("c", &["web-c"]);
    let first = w.plan();
    assert_eq!(first.first(), None, "{:?}", first.decisions);
    assert!(matches!(World::verdict(&first, "c"), Verdict::Settling { .. }), "{:?}", World::verdict(&first, "c"));
    assert!(matches!(World::verdict(&first, "a"), Verdict::Keep(_)), "{:?}", World::verdict(&first, "a"));
    w.now += 30_000;
    let settled = w.plan();
    assert_eq!(settled.first().map(|p| p.candidates.clone()), Some(vec!["c".to_string()]), "{:?}", settled.decisions);
}

#[test]
fn a_node_a_pending_pod_is_nominated_to_is_not_disrupted() {
    let mut w = World::new();
    w.budgets(vec![budget(BudgetNodes::Percent(100))]);
    w.node("a", &[]);
    let mut p = Pod::new("default", "preemptor", ResourceList::cpu_mem(100, 1 << 20));
    p.nominated_node = Some("node-a".into());
    w.snap.pods.insert(p.key.clone(), Arc::new(p));
    let plan = w.plan();
    assert_eq!(plan.first(), None);
    assert!(World::verdict(&plan, "a").to_string().contains("pending pod default/preemptor is nominated to it"));
}

/// Karpenter's nomination window: a node the provisioner planned pending pods onto is not
/// disrupted until the window ends, then it is (empty, it goes).
#[test]
fn a_node_the_provisioner_planned_pods_onto_is_not_disrupted_until_the_window_ends() {
    let mut w = World::new();
    w.budgets(vec![budget(BudgetNodes::Percent(100))]);
    w.node("a", &[]);
    w.nominated.insert("node-a".into(), w.now + 20_000);
    let plan = w.plan();
    assert_eq!(plan.first(), None);
    let said = World::verdict(&plan, "a").to_string();
    assert!(said.contains("pending pods were planned onto it (nominated until 1970-01-01T00:17:00Z)"), "{said}");
    w.now += 20_000;
    let plan = w.plan();
    assert_eq!(plan.first().map(|p| p.candidates.clone()), Some(vec!["a".to_string()]), "the window is over");
}

/// Pending pods are in the consolidation's simulation, as Karpenter's: they keep the room
/// they would take, so a node whose pods fit only in that room stays. Without them, it goes.
#[test]
fn pending_pods_keep_the_room_they_would_take_from_a_consolidation() {
    let world = |pending: bool| {
        let mut w = World::new();
        w.pool.requirements.add(labels::CAPACITY_TYPE, crate::requirements::Requirement::is_in(["on-demand"]));
        w.budgets(vec![budget(BudgetNodes::Percent(100))]);
        w.node("a", &[]);
        pod_of(&mut w, "a", "web-a", 1_000);
        w.node("b", &[]);
        pod_of(&mut w, "b", "web-b", 200);
        // b is not a candidate: only a's move is in question; it has room for 29 pods.
        pod_slots(&mut w, "b", 29);
        let b = w.snap.nodes["node-b"].as_ref().clone();
        w.snap.nodes.insert("node-b".into(), Arc::new(Node { do_not_disrupt: true, ..b }));
        if pending {
            let mut p = Pod::new("default", "waiting", ResourceList::cpu_mem(1_500, 256 << 20));
            p.unschedulable = true;
            w.snap.pods.insert(p.key.clone(), Arc::new(p));
        }
        w
    };
    let mut w = world(false);
    let plan = w.plan();
    let p = plan.first().cloned().unwrap_or_else(|| panic!("a's pod fits on b: {:?}", plan.decisions));
    assert_eq!((p.candidates, p.replacements.len()), (vec!["a".to_string()], 0));
    let mut w = world(true);
    let plan = w.plan();
    assert_eq!(plan.first(), None, "the pending pod takes b's room first");
    let said = World::verdict(&plan, "a").to_string();
    assert!(said.contains("no cheaper node"), "{said}");
}

#[test]
fn several_commands_go_at_once_each_simulated_with_the_ones_before_it() {
    let mut w = World::new();
    // On-demand m5.large only: no replacement is ever cheaper, so moves are deletions.
    w.pool.requirements.add(labels::INSTANCE_TYPE, crate::requirements::Requirement::is_in(["m5.large"]));
    w.pool.requirements.add(labels::CAPACITY_TYPE, crate::requirements::Requirement::is_in(["on-demand"]));
    w.budgets(vec![budget(BudgetNodes::Percent(100))]);
    // a's pod goes nowhere but a new node, no cheaper (so no multi-node prefix, which must
    // start with a, holds);
    // b's goes to c; c then receives it and is not a candidate; d's goes to c too, beside b's.
    for (id, cpu) in [("a", 1900), ("b", 300), ("c", 300), ("d", 900)] {
        w.node(id, &[]);
        pod_of(&mut w, id, &format!("web-{id}"), cpu);
        pod_slots(&mut w, id, 29);
    }
    let one = w.plan();
    let ids = |plan: &Plan| -> Vec<Vec<String>> { plan.proposals.iter().map(|p| p.candidates.clone()).collect() };
    assert_eq!(ids(&one), vec![vec!["b".to_string()]], "Karpenter's one command a round: {:?}", one.decisions);
    assert!(World::verdict(&one, "d").to_string().contains("waits for a later round"), "{:?}", one.decisions);
    w.max_commands = 10;
    w.memory = Memory::default();
    let many = w.plan();
    assert_eq!(ids(&many), vec![vec!["b".to_string()], vec!["d".to_string()]], "{:?}", many.decisions);
    assert!(many.proposals.iter().all(|p| p.method == Method::SingleNodeConsolidation && p.replacements.is_empty()));
    let c = World::verdict(&many, "c").to_string();
    assert!(c.contains("pods of a command of this round go to it"), "{c}");
    assert!(World::verdict(&many, "a").to_string().contains("no cheaper node"), "{:?}", many.decisions);
    // Within the budget: with room for one node, one command.
    w.budgets(vec![budget(BudgetNodes::Count(1))]);
    w.memory = Memory::default();
    assert_eq!(ids(&w.plan()), vec![vec!["b".to_string()]]);
}

/// A command whose own validation ended but that waits for the one before it in its round's
/// chain is due with that one, not at once: the caller would otherwise plan again at every
/// tick of its clock until the first is due.
#[test]
fn a_command_waiting_only_for_the_one_before_it_is_due_with_that_one() {
    let p = |c: &str| Proposal {
        method: Method::SingleNodeConsolidation,
        reason: DisruptionReason::Underutilized,
        candidates: vec![c.to_string()],
        replacements: vec![],
        detail: String::new(),
    };
    // b has validated since 0 s; a, before it in the chain, started at 20 s.
    let m = Memory { pending: vec![(p("a"), 20_000), (p("b"), 0)], ..Memory::default() };
    assert_eq!(m.validation_due(15_000, 25_000), Some(35_000));
    assert_eq!(m.validation_due(15_000, 35_000), None, "nothing waits past now");
}
