//! Disruption's behaviour suite: one test per behaviour Karpenter users rely on (and
//! dovetail's rate budget), each on the NodePool actor with the sim cloud, the sim cluster,
//! the in-process ledger and a manual clock. The pool's world and helpers are `pool`'s; the
//! methods' own tests (emptiness, replacement, rollback, expiration, NodeClass drift) are
//! there too.

use std::sync::Arc;
use std::time::Duration;

use dovetail_actors::pool::{Disrupt, GetDecisions, Reconfigure, Retire};
use dovetail_cloud::CloudProvider;
use dovetail_cluster::ClusterView;
use dovetail_core::catalog::CapacityType;
use dovetail_core::clock::Clock;
use dovetail_core::cluster::{IntOrPercent, Pdb};
use dovetail_core::disruption::budget::Rate;
use dovetail_core::labels::{self, LabelSelector};
use dovetail_core::ledger::{ClaimState, Entry, State};
use dovetail_core::nodepool::{Budget, BudgetNodes, DisruptionReason, NodePool};
use dovetail_core::plane::DO_NOT_DISRUPT;
use dovetail_core::pod::{Pod, PodKey};
use dovetail_core::requirements::{Requirement, Requirements};
use dovetail_core::resources::ResourceList;
use dovetail_raft::{BoxFuture, Committed, Leadership, Ledger, LedgerError};
use tokio::sync::watch;

use crate::common::{node_class, state, types};
use crate::pool::{
    World, another_actor, disrupt_until, disrupting_world_full, disrupting_world_over, launched, m5_large_on_demand,
    pods, provision, register_all,
};

fn budget(nodes: BudgetNodes) -> Budget {
    Budget { nodes, schedule: None, duration: None, reasons: vec![] }
}

/// `n` nodes of the pool, each running one pod of `cpu_milli` (1500m fills an m5.large).
/// Returns the pods' keys.
async fn nodes(w: &World, n: usize, cpu_milli: i64) -> Vec<PodKey> {
    let pending = pods(n, cpu_milli);
    let keys = pending.iter().map(|p| p.key.clone()).collect();
    w.cluster.apply_pods(pending.clone());
    w.pool.send(provision(pending)).await.expect("mailbox");
    launched(w, n).await;
    register_all(w).await;
    assert_eq!(w.cluster.schedule(), n);
    keys
}

/// Every bound pod made small (300m, 256Mi) in place, with `shape` applied (labels,
/// annotations): the nodes become underused.
fn shrink(w: &World, shape: impl Fn(usize, &mut Pod)) {
    let snap = w.cluster.snapshot();
    let mut bound: Vec<&Arc<Pod>> = snap.pods.values().filter(|p| p.node_name.is_some()).collect();
    bound.sort_by(|a, b| a.key.cmp(&b.key));
    for (i, p) in bound.into_iter().enumerate() {
        w.cluster.delete_pods(std::slice::from_ref(&p.key));
        let mut small = Pod {
            key: p.key.clone(),
            requests: ResourceList::cpu_mem(300, 1 << 28),
            node_name: p.node_name.clone(),
            ..Pod::default()
        };
        shape(i, &mut small);
        w.cluster.apply_pod(small);
    }
}

/// Every node's decision, rendered.
async fn said(w: &World) -> Vec<String> {
    let decisions = w.pool.send(GetDecisions).await.expect("decisions");
    decisions.values().map(|d| d.verdict.to_string()).collect()
}

/// Plans `rounds` times (with the validation delay passed after the first) and returns the
/// ledger: for checking that nothing was granted.
async fn rounds(w: &World, rounds: usize) -> State {
    for i in 0..rounds {
        w.pool.send(Disrupt).await.expect("mailbox");
        tokio::time::sleep(Duration::from_millis(20)).await;
        if i == 0 {
            w.clock.advance(Duration::from_secs(15));
        }
    }
    state(w.ledger.as_ref()).await
}

/// Karpenter's percentages round up: 50% of three nodes lets two go at once.
#[actix_rt::test]
async fn a_percentage_budget_rounds_up() {
    let w = disrupting_world_full(
        m5_large_on_demand(ResourceList::new()),
        vec![budget(BudgetNodes::Percent(50))],
        None,
        false,
    )
    .await;
    let keys = nodes(&w, 3, 1500).await;
    w.cluster.delete_pods(&keys);
    w.pool.send(Disrupt).await.expect("mailbox");
    w.clock.advance(Duration::from_secs(15));
    let s = disrupt_until(&w, "a command", |s| !s.disruptions().is_empty()).await;
    let cmd = s.disruptions().values().next().cloned().expect("a command");
    assert_eq!(cmd.candidates.len(), 2, "ceil(3 x 50%) = 2");
}

/// A budget with a schedule binds only within its window (UTC cron plus duration): nothing
/// goes in the window, and the nodes go once it ends.
#[actix_rt::test]
async fn a_scheduled_budget_binds_only_in_its_window() {
    // The manual clock starts at 2026-01-01T00:00:00Z: inside a daily 00:00 + 2h window.
    let closed = Budget {
        nodes: BudgetNodes::Count(0),
        schedule: Some("0 0 * * *".into()),
        duration: Some(Duration::from_secs(2 * 3600)),
        reasons: vec![],
    };
    let budgets = vec![closed, budget(BudgetNodes::Percent(100))];
    let w = disrupting_world_full(m5_large_on_demand(ResourceList::new()), budgets, None, false).await;
    let keys = nodes(&w, 2, 1500).await;
    w.cluster.delete_pods(&keys);
    let s = rounds(&w, 5).await;
    assert!(s.disruptions().is_empty(), "within the window: {:?}", s.disruptions());
    assert!(said(&w).await.iter().all(|v| v.contains("budgets allow no more")), "{:?}", said(&w).await);
    w.clock.advance(Duration::from_secs(2 * 3600));
    w.pool.send(Disrupt).await.expect("mailbox");
    w.clock.advance(Duration::from_secs(15));
    disrupt_until(&w, "both gone after the window", |s| s.claims().is_empty()).await;
}

/// A budget's reasons scope it: a budget of zero for drift stops drift and nothing else.
#[actix_rt::test]
async fn a_budget_binds_only_the_reasons_it_names() {
    let drift_closed = Budget {
        nodes: BudgetNodes::Count(0),
        schedule: None,
        duration: None,
        reasons: vec![DisruptionReason::Drifted],
    };
    let w = disrupting_world_full(m5_large_on_demand(ResourceList::new()), vec![drift_closed], None, false).await;
    let keys = nodes(&w, 2, 1500).await;
    // Both drift from the node class; one of them is also empty.
    let changed = dovetail_cloud::NodeClass { hash: "h2".into(), ..node_class() };
    let pool = m5_large_on_demand(ResourceList::new());
    w.pool.send(Reconfigure { pool, types: types(), node_class: changed }).await.expect("mailbox");
    w.cluster.delete_pods(&keys[..1]);
    w.pool.send(Disrupt).await.expect("mailbox");
    w.clock.advance(Duration::from_secs(15));
    let s = disrupt_until(&w, "a command", |s| !s.disruptions().is_empty()).await;
    let cmd = s.disruptions().values().next().cloned().expect("a command");
    assert_eq!(cmd.reason, DisruptionReason::Empty, "emptiness's, not drift's: {cmd:?}");
    disrupt_until(&w, "the empty node goes", |s| s.claims().len() == 1).await;
    let s = rounds(&w, 5).await;
    assert_eq!(s.claims().len(), 1, "the drifted node with a pod stays: drift's budget is zero");
    let decisions = said(&w).await;
    assert!(decisions.iter().any(|v| v.contains("(drift) but the nodepool's budgets allow no more")), "{decisions:?}");
}

/// A schedule that is not a cron expression fails closed: the budget allows nothing.
#[actix_rt::test]
async fn an_invalid_schedule_fails_closed() {
    let broken = Budget {
        nodes: BudgetNodes::Percent(100),
        schedule: Some("every monday".into()),
        duration: Some(Duration::from_secs(3600)),
        reasons: vec![],
    };
    let w = disrupting_world_full(m5_large_on_demand(ResourceList::new()), vec![broken], None, false).await;
    let keys = nodes(&w, 2, 1500).await;
    w.cluster.delete_pods(&keys);
    let s = rounds(&w, 5).await;
    assert!(s.disruptions().is_empty() && s.claims().len() == 2, "{:?}", s.disruptions());
    assert!(said(&w).await.iter().all(|v| v.contains("budgets allow no more")), "{:?}", said(&w).await);
}

/// Nodes already disrupting count against the budget, and so does a node that is not Ready
/// (Karpenter counts both): with a budget of one and a NotReady node, nothing else goes.
#[actix_rt::test]
async fn nodes_not_ready_count_against_the_budget() {
    let w = disrupting_world_full(
        m5_large_on_demand(ResourceList::new()),
        vec![budget(BudgetNodes::Count(1))],
        None,
        false,
    )
    .await;
    let keys = nodes(&w, 3, 1500).await;
    w.cluster.delete_pods(&keys[..2]);
    // The node with the pod goes NotReady.
    let snap = w.cluster.snapshot();
    let busy = snap.pods.get(&keys[2]).and_then(|p| p.node_name.clone()).expect("bound");
    let node = snap.nodes.get(&busy).expect("node").as_ref().clone();
    w.cluster.apply_node(dovetail_core::node::Node { ready: false, ..node.clone() });
    let s = rounds(&w, 5).await;
    assert!(s.disruptions().is_empty(), "the NotReady node takes the budget: {:?}", s.disruptions());
    w.cluster.apply_node(dovetail_core::node::Node { ready: true, ..node });
    w.pool.send(Disrupt).await.expect("mailbox");
    w.clock.advance(Duration::from_secs(15));
    let s = disrupt_until(&w, "a command", |s| !s.disruptions().is_empty()).await;
    assert_eq!(s.disruptions().values().map(|d| d.candidates.len()).sum::<usize>(), 1, "one at a time");
}

/// A ledger whose leadership the test moves (the in-process one always leads): a control
/// node that stops leading and leads again.
struct Moved {
    inner: Arc<dyn Ledger>,
    leadership: watch::Sender<Leadership>,
}

impl Ledger for Moved {
    fn propose(&self, entry: Entry) -> BoxFuture<'_, Result<Committed, LedgerError>> {
        self.inner.propose(entry)
    }

    fn read<'a>(&'a self, f: Box<dyn FnOnce(&State) + Send + 'a>) -> BoxFuture<'a, Result<(), LedgerError>> {
        self.inner.read(f)
    }

    fn leadership(&self) -> watch::Receiver<Leadership> {
        self.leadership.subscribe()
    }
}

/// Rounds until the pool's budget gauges read `want` ((reason, allowed, consuming); empty:
/// no series), at most 50; the last scrape.
async fn budget_gauges(w: &World, want: &[(&str, f64, f64)]) -> String {
    let pool = m5_large_on_demand(ResourceList::new()).name;
    let read = |text: &str| -> Vec<(String, f64, f64)> {
        ["Underutilized", "Empty", "Drifted"]
            .into_iter()
            .filter(|r| text.contains(&format!("nodepool=\"{pool}\",reason=\"{r}\"")))
            .map(|r| {
                let l = [("nodepool", pool.as_str()), ("reason", r)];
                let sum = |series| dovetail_actors::metrics::sum_of(text, series, &l);
                (
                    r.to_string(),
                    sum("karpenter_nodepools_allowed_disruptions"),
                    sum("karpenter_nodepools_nodes_consuming_budgets"),
                )
            })
            .collect()
    };
    let want: Vec<(String, f64, f64)> = want.iter().map(|(r, a, c)| (r.to_string(), *a, *c)).collect();
    let mut text = String::new();
    for _ in 0..50 {
        w.pool.send(Disrupt).await.expect("mailbox");
        tokio::time::sleep(Duration::from_millis(20)).await;
        text = w.metrics.encode();
        if read(&text) == want {
            return text;
        }
    }
    panic!("the budget gauges never read {want:?}: {:?}\n{text}", read(&text));
}

/// Karpenter's budget gauges are the ledger's count: per reason, what the active budgets
/// allow at once (50% of 4 nodes rounded up; a drift budget of 0; no budget for a reason is
/// MaxInt32) and the nodes counted against them (a NotReady one). Only a leading actor of a
/// live pool serves them: a follower's and a retired pool's series are gone.
#[actix_rt::test]
async fn the_budget_gauges_show_what_the_ledger_allows_and_only_the_leader_serves_them() {
    let drift_closed = Budget {
        nodes: BudgetNodes::Count(0),
        schedule: None,
        duration: None,
        reasons: vec![DisruptionReason::Drifted],
    };
    let half = Budget {
        reasons: vec![DisruptionReason::Underutilized, DisruptionReason::Drifted],
        ..budget(BudgetNodes::Percent(50))
    };
    let (tx, _) = watch::channel(Leadership { term: dovetail_raft::FIRST_TERM, leader: true, leader_id: None });
    let leadership = tx.clone();
    let over = move |inner: Arc<dyn Ledger>| -> Arc<dyn Ledger> { Arc::new(Moved { inner, leadership }) };
    let pool = m5_large_on_demand(ResourceList::new());
    let w = disrupting_world_over(pool, vec![drift_closed, half], None, false, over).await;
    let keys = nodes(&w, 4, 1500).await;
    let snap = w.cluster.snapshot();
    let busy = snap.pods.get(&keys[0]).and_then(|p| p.node_name.clone()).expect("bound");
    let node = snap.nodes.get(&busy).expect("node").as_ref().clone();
    w.cluster.apply_node(dovetail_core::node::Node { ready: false, ..node });
    let unbounded = f64::from(i32::MAX);
    let leading = [("Underutilized", 2.0, 1.0), ("Empty", unbounded, 1.0), ("Drifted", 0.0, 1.0)];
    budget_gauges(&w, &leading).await;
    // Deposed: the series go with the next round.
    tx.send_modify(|l| l.leader = false);
    budget_gauges(&w, &[]).await;
    tx.send_modify(|l| {
        l.leader = true;
        l.term += 1;
    });
    budget_gauges(&w, &leading).await;
    // Its NodePool gone: none either, at once.
    w.pool.send(Retire).await.expect("mailbox");
    assert!(!budget_series(&w.metrics.encode()), "retired");
    budget_gauges(&w, &[]).await;
    // Back, then its actor stopped (with no round after): its series go with it.
    let pool = m5_large_on_demand(ResourceList::new());
    w.pool.send(Reconfigure { pool, types: types(), node_class: node_class() }).await.expect("mailbox");
    budget_gauges(&w, &leading).await;
    w.pool.send(dovetail_actors::Restart).await.expect("mailbox");
    let mut gone = false;
    for _ in 0..50 {
        tokio::time::sleep(Duration::from_millis(20)).await;
        gone = !budget_series(&w.metrics.encode());
        if gone {
            break;
        }
    }
    assert!(gone, "the stopped actor's series: {}", w.metrics.encode());
}

/// Whether a scrape has any budget gauge sample.
fn budget_series(text: &str) -> bool {
    text.lines().any(|l| {
        l.starts_with("karpenter_nodepools_allowed_disruptions{")
            || l.starts_with("karpenter_nodepools_nodes_consuming_budgets{")
    })
}

/// dovetail's rate budget: at most one node starts disrupting per ten minutes, however many
/// the concurrency budget would allow.
#[actix_rt::test]
async fn the_rate_budget_paces_disruptions() {
    let rate = Rate::parse("1/10m").expect("a rate");
    let all = vec![budget(BudgetNodes::Percent(100))];
    let w = disrupting_world_full(m5_large_on_demand(ResourceList::new()), all, Some(rate), false).await;
    let keys = nodes(&w, 3, 1500).await;
    w.cluster.delete_pods(&keys);
    w.pool.send(Disrupt).await.expect("mailbox");
    w.clock.advance(Duration::from_secs(15));
    let s = disrupt_until(&w, "the first command", |s| !s.disruptions().is_empty()).await;
    assert_eq!(s.disruptions().values().map(|d| d.candidates.len()).sum::<usize>(), 1, "one per window");
    disrupt_until(&w, "the first gone", |s| s.claims().len() == 2).await;
    // Nine minutes on, still within the window.
    w.clock.advance(Duration::from_secs(9 * 60));
    let s = rounds(&w, 4).await;
    assert_eq!(s.claims().len(), 2, "the rate holds the others: {:?}", s.disruptions());
    w.clock.advance(Duration::from_secs(60));
    w.pool.send(Disrupt).await.expect("mailbox");
    w.clock.advance(Duration::from_secs(15));
    disrupt_until(&w, "the second gone", |s| s.claims().len() == 1).await;
}

/// `karpenter.sh/do-not-disrupt: "true"` on a pod keeps its node; a duration keeps it until
/// the duration has run since the pod started.
#[actix_rt::test]
async fn do_not_disrupt_keeps_a_node_and_a_duration_runs_out() {
    let all = vec![budget(BudgetNodes::Percent(100))];
    let w = disrupting_world_full(m5_large_on_demand(ResourceList::new()), all, None, false).await;
    nodes(&w, 2, 1500).await;
    let started = w.clock.now_millis();
    shrink(&w, |i, p| {
        let v = if i == 0 { "true" } else { "5m" };
        p.annotations.insert(DO_NOT_DISRUPT.into(), v.into());
        p.started_at = Some(started);
    });
    let s = rounds(&w, 5).await;
    assert!(s.disruptions().is_empty(), "{:?}", s.disruptions());
    let decisions = said(&w).await;
    assert_eq!(decisions.iter().filter(|v| v.contains("has karpenter.sh/do-not-disrupt")).count(), 2, "{decisions:?}");
    // Five minutes after the pod started, its protection is over: its node goes, its pod
    // moves next to the one that keeps its node.
    w.clock.advance(Duration::from_secs(5 * 60));
    w.pool.send(Disrupt).await.expect("mailbox");
    w.clock.advance(Duration::from_secs(15));
    let s = disrupt_until(&w, "the timed node goes", |s| s.claims().len() == 1).await;
    let kept = s.claims().values().next().expect("one left").clone();
    let snap = w.cluster.snapshot();
    let node = snap.nodeclaims[&kept.id].status.node_name.clone().expect("node");
    let first = snap.pods.values().find(|p| p.annotations.get(DO_NOT_DISRUPT).is_some_and(|v| v == "true"));
    assert_eq!(first.and_then(|p| p.node_name.clone()), Some(node), "the node with the \"true\" pod stays");
}

/// A PodDisruptionBudget that allows no disruption keeps the nodes of the pods it covers;
/// once it allows one, consolidation goes on.
#[actix_rt::test]
async fn a_pdb_allowing_nothing_keeps_its_pods_nodes() {
    let all = vec![budget(BudgetNodes::Percent(100))];
    let w = disrupting_world_full(m5_large_on_demand(ResourceList::new()), all, None, false).await;
    nodes(&w, 2, 1500).await;
    shrink(&w, |_, p| {
        p.labels.insert("app".into(), "web".into());
    });
    // The sim cluster keeps `disruptionsAllowed` as the disruption controller does: two
    // healthy pods, two available needed, none allowed.
    let pdb = |min| Pdb {
        key: PodKey::new("default", "web"),
        selector: LabelSelector::from_labels([("app", "web")]),
        min_available: Some(IntOrPercent::Int(min)),
        max_unavailable: None,
        disruptions_allowed: 0,
    };
    w.cluster.apply_pdb(pdb(2));
    let s = rounds(&w, 5).await;
    assert!(s.disruptions().is_empty(), "{:?}", s.disruptions());
    let decisions = said(&w).await;
    assert!(decisions.iter().all(|v| v.contains("pdb default/web allows no disruption")), "{decisions:?}");
    w.cluster.apply_pdb(pdb(1));
    assert_eq!(w.cluster.snapshot().pdbs[&PodKey::new("default", "web")].disruptions_allowed, 1);
    w.pool.send(Disrupt).await.expect("mailbox");
    w.clock.advance(Duration::from_secs(15));
    disrupt_until(&w, "one node consolidated", |s| s.claims().len() == 1).await;
}

/// Several underused nodes whose pods fit on one of them go as one multi-node command (no
/// replacement), before any single-node move is considered.
#[actix_rt::test]
async fn several_underused_nodes_go_in_one_multi_node_command() {
    let all = vec![budget(BudgetNodes::Percent(100))];
    let w = disrupting_world_full(m5_large_on_demand(ResourceList::new()), all, None, false).await;
    nodes(&w, 3, 1500).await;
    shrink(&w, |_, _| {});
    w.pool.send(Disrupt).await.expect("mailbox");
    w.clock.advance(Duration::from_secs(15));
    let s = disrupt_until(&w, "a command", |s| !s.disruptions().is_empty()).await;
    let cmd = s.disruptions().values().next().cloned().expect("a command");
    assert_eq!((cmd.candidates.len(), cmd.replacements.len()), (2, 0), "{cmd:?}");
    // The decision each candidate was disrupted by, from its event (the pool's decisions move
    // on with the rounds after it: "a disruption command holds it").
    disrupt_until(&w, "two gone", |s| s.claims().len() == 1).await;
    let launching: Vec<String> = w
        .cluster
        .events()
        .into_iter()
        .filter(|e| e.reason == "DisruptionLaunching" && cmd.candidates.contains(&e.name))
        .map(|e| e.message)
        .collect();
    assert_eq!(launching.iter().filter(|m| m.contains("multi-node-consolidation")).count(), 2, "{launching:?}");
}

/// One node of `capacity` m5.xlarge whose pod shrank; then the pool is widened to both
/// capacity types and m5.large (or, `every_family`, every c, m and r type), requirements
/// not being part of drift's hash (no drift).
async fn widened(capacity: CapacityType, spot_to_spot: bool, every_family: bool) -> World {
    let pool = |types: &[&str], capacity: &[&str]| {
        let mut reqs = Requirements::new();
        reqs.add(labels::INSTANCE_TYPE, Requirement::is_in(types.iter().copied()));
        reqs.add(labels::CAPACITY_TYPE, Requirement::is_in(capacity.iter().copied()));
        NodePool::new("default", reqs)
    };
    let all = vec![budget(BudgetNodes::Percent(100))];
    let w = disrupting_world_full(pool(&["m5.xlarge"], &[capacity.as_str()]), all, None, spot_to_spot).await;
    nodes(&w, 1, 3000).await;
    shrink(&w, |_, _| {});
    let mut wide = pool(&["m5.large", "m5.xlarge"], &["spot", "on-demand"]);
    if every_family {
        wide.requirements.remove(labels::INSTANCE_TYPE);
        wide.requirements.add(labels::INSTANCE_CATEGORY, Requirement::is_in(["c", "m", "r"]));
    }
    w.pool.send(Reconfigure { pool: wide, types: types(), node_class: node_class() }).await.expect("mailbox");
    w
}

/// The replacement NodeClaim's spec once the command's effects made it.
async fn replacement_spec(w: &World, claim: &str) -> dovetail_core::nodepool::NodeClaimSpec {
    for _ in 0..100 {
        if let Some(nc) = w.cluster.snapshot().nodeclaims.get(claim) {
            return nc.spec.clone();
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("no NodeClaim {claim} within 1 s");
}

/// Karpenter's spot rules, on-demand: an on-demand node is replaced by spot when the pool
/// allows it (a spot shortage then never becomes a dearer on-demand launch).
#[actix_rt::test]
async fn an_on_demand_node_is_replaced_with_spot() {
    let w = widened(CapacityType::OnDemand, false, false).await;
    w.pool.send(Disrupt).await.expect("mailbox");
    w.clock.advance(Duration::from_secs(15));
    let s = disrupt_until(&w, "a command", |s| !s.disruptions().is_empty()).await;
    let cmd = s.disruptions().values().next().cloned().expect("a command");
    assert_eq!(cmd.replacements.len(), 1);
    let spec = replacement_spec(&w, &cmd.replacements[0]).await;
    let capacity = spec.requirements.get(labels::CAPACITY_TYPE);
    assert!(capacity.has("spot") && !capacity.has("on-demand"), "{capacity}");
}

/// Karpenter's spot rules, spot: a spot node is not replaced by spot unless spot-to-spot
/// consolidation is on, and then only when at least 15 spot types are cheaper.
#[actix_rt::test]
async fn a_spot_node_is_replaced_by_spot_only_with_spot_to_spot_and_15_cheaper_types() {
    let w = widened(CapacityType::Spot, false, false).await;
    let s = rounds(&w, 5).await;
    assert!(s.disruptions().is_empty(), "{:?}", s.disruptions());
    let decisions = said(&w).await;
    assert!(decisions.iter().any(|v| v.contains("spot-to-spot consolidation is off")), "{decisions:?}");
    let w = widened(CapacityType::Spot, true, false).await;
    let s = rounds(&w, 5).await;
    assert!(s.disruptions().is_empty(), "{:?}", s.disruptions());
    let decisions = said(&w).await;
    assert!(decisions.iter().any(|v| v.contains("spot-to-spot needs 15")), "{decisions:?}");
    assert!(
        s.claims().values().all(|c| matches!(c.state, ClaimState::Initialized { .. })),
        "the spot node stays: {:?}",
        s.claims()
    );
}

/// Spot-to-spot, when it may: with the setting on and at least 15 spot types cheaper than the
/// node, it is replaced by spot, the launch limited to the 15 cheapest.
#[actix_rt::test]
async fn a_spot_node_is_replaced_by_one_of_the_15_cheapest_spot_types_with_spot_to_spot() {
    let w = widened(CapacityType::Spot, true, true).await;
    w.pool.send(Disrupt).await.expect("mailbox");
    w.clock.advance(Duration::from_secs(15));
    let s = disrupt_until(&w, "a command", |s| !s.disruptions().is_empty()).await;
    let cmd = s.disruptions().values().next().cloned().expect("a command");
    assert_eq!(cmd.replacements.len(), 1);
    let spec = replacement_spec(&w, &cmd.replacements[0]).await;
    let capacity = spec.requirements.get(labels::CAPACITY_TYPE);
    assert!(capacity.has("spot") && !capacity.has("on-demand"), "{capacity}");
    let its = spec.requirements.get(labels::INSTANCE_TYPE);
    assert_eq!(its.values().len(), 15, "the 15 cheapest: {its}");
    assert!(!its.has("m5.xlarge"), "none of them the node's own type: {its}");
}

/// Budgets and limits hold whatever the order of events, with two NodePool actors of one
/// pool planning and proposing at once (a deposed leader still acting beside its successor,
/// which fencing otherwise prevents): seeded random steps of pods coming and going, time
/// passing, kubelets registering, kube-scheduler binding, and either actor provisioning,
/// reconciling or planning disruption. After every step the ledger holds no more nodes
/// disrupting (leased to a command or terminating) than the budget's two, and no more CPU
/// than the pool's limit of six m5.large.
#[actix_rt::test]
async fn budgets_and_limits_hold_under_random_event_orders_with_two_actors_proposing() {
    use dovetail_actors::config::Config;
    use dovetail_actors::kubelet::registrations;
    use dovetail_actors::pool::Reconcile;
    use dovetail_core::resources::ResourceName;
    use dovetail_core::workload::SplitMix64;

    let limit = 12_000;
    let mut peaks = Vec::new();
    for seed in 1..=5u64 {
        let pool = m5_large_on_demand(ResourceList::from_pairs([(ResourceName::Cpu, limit)]));
        let budgets = vec![budget(BudgetNodes::Count(2))];
        let w = disrupting_world_full(pool.clone(), budgets, None, false).await;
        let mut config = Config::default();
        config.disruption.enabled = true;
        config.disruption.every = Duration::from_secs(3600);
        let (second, _unplaced) = another_actor(&w, pool, config);
        let actors = [w.pool.clone(), second];
        let mut rng = SplitMix64::new(seed);
        let mut made = 0usize;
        let (mut granted, mut peak) = (0usize, 0usize);
        for step in 0..160 {
            let actor = &actors[rng.below(2)];
            match rng.below(12) {
                0 | 1 => {
                    let n = 1 + rng.below(3);
                    let new: Vec<Pod> = pods(made + n, 1500).into_iter().skip(made).collect();
                    made += n;
                    w.cluster.apply_pods(new.clone());
                    actor.send(provision(new)).await.expect("mailbox");
                }
                2 | 3 => {
                    let snap = w.cluster.snapshot();
                    let bound: Vec<PodKey> =
                        snap.pods.values().filter(|p| p.node_name.is_some()).map(|p| p.key.clone()).collect();
                    if !bound.is_empty() {
                        w.cluster.delete_pods(&[bound[rng.below(bound.len())].clone()]);
                    }
                }
                4 | 5 => w.clock.advance(Duration::from_secs(5 + rng.below(16) as u64)),
                6..=8 => {
                    actor.send(Disrupt).await.expect("mailbox");
                }
                9 | 10 => {
                    actor.send(Reconcile).await.expect("mailbox");
                }
                _ => {
                    let known = w.cluster.snapshot();
                    for reg in registrations(&w.cloud.list().await.expect("list")) {
                        if !known.nodes.values().any(|n| n.provider_id.as_deref() == Some(reg.provider_id.as_str())) {
                            w.cluster.register(&reg).expect("register");
                        }
                    }
                    w.cluster.schedule();
                }
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
            let s = state(w.ledger.as_ref()).await;
            let leased: std::collections::BTreeSet<&str> =
                s.disruptions().values().flat_map(|d| d.candidates.iter().map(String::as_str)).collect();
            let disrupting = s
                .claims_of("default")
                .filter(|c| {
                    leased.contains(c.id.as_str())
                        || matches!(c.state, ClaimState::Terminating { instance: Some(_), instance_gone: false, .. })
                })
                .count();
            assert!(
                disrupting <= 2,
                "seed {seed} step {step}: {disrupting} nodes disrupting, budget 2: {:?}",
                s.claims()
            );
            let cpu: i64 = s.claims_of("default").map(|c| c.resources.get(&ResourceName::Cpu)).sum();
            assert!(cpu <= limit, "seed {seed} step {step}: {cpu} CPU held, limit {limit}");
            granted = granted.max(s.disruptions().len());
            peak = peak.max(disrupting);
        }
        eprintln!("seed {seed}: {made} pods made, at most {granted} commands at once, {peak} nodes disrupting at once");
        peaks.push(peak);
    }
    // Not vacuous: disruption happened in most runs, and reached the budget in some.
    assert!(peaks.iter().filter(|p| **p > 0).count() >= 3, "disruption in too few runs: {peaks:?}");
    assert_eq!(peaks.iter().max(), Some(&2), "the budget was never reached: {peaks:?}");
}
