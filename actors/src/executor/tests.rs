//! The executor's unit tests.

use super::*;
use dovetail_cluster::sim::SimCluster;
use dovetail_cluster::{ClusterView, NodePatch};
use dovetail_core::clock::ManualClock;
use dovetail_core::node::Node;
use dovetail_core::taints::{Effect as TaintEffect, Taint};
use dovetail_raft::InProcess;

fn setup() -> (Arc<SimCluster>, Arc<InProcess>, Executor, Arc<Errors>) {
    let cluster = Arc::new(SimCluster::new());
    let ledger = Arc::new(InProcess::new());
    let errors = Arc::new(Errors::new());
    let ex = Executor::new(
        cluster.clone(),
        ledger.clone(),
        errors.clone(),
        Default::default(),
        ExecutorConfig::default(),
        Arc::new(ManualClock::new()),
    );
    (cluster, ledger, ex, errors)
}

fn taint_node(node: &str) -> Effect {
    let patch = NodePatch {
        add_taints: vec![Taint::new("karpenter.sh/disrupted", "", TaintEffect::NoSchedule)],
        ..NodePatch::default()
    };
    Effect::new("default-abcde", Action::PatchNode { node: node.into(), patch })
}

#[tokio::test]
async fn a_conflict_is_retried_from_a_fresh_read_and_what_others_wrote_stays() {
    let (cluster, _, ex, errors) = setup();
    let other = Taint::new("node.kubernetes.io/unreachable", "", TaintEffect::NoExecute);
    cluster.apply_node(Node { name: "n1".into(), taints: vec![other.clone()], ..Node::default() });
    cluster.inject_conflicts(2);
    let done = ex.run(dovetail_raft::FIRST_TERM, vec![taint_node("n1")]).await;
    assert_eq!(done[0].1, Done::Applied);
    let taints = cluster.snapshot().nodes["n1"].taints.clone();
    assert!(taints.contains(&other), "the other writer's taint stays");
    assert!(taints.iter().any(|t| t.key == "karpenter.sh/disrupted"));
    assert_eq!(cluster.writes().get("update_node"), Some(&3), "two conflicts, then the write");
    assert!(errors.counts().is_empty(), "resolved conflicts are not errors");
    // Applied again: nothing to write.
    let done = ex.run(dovetail_raft::FIRST_TERM, vec![taint_node("n1")]).await;
    assert_eq!(done[0].1, Done::Unchanged);
    assert_eq!(cluster.writes().get("update_node"), Some(&3));
}

#[tokio::test]
async fn a_refused_eviction_backs_off_per_pod_doubling_and_its_node_gets_one_failed_draining_event() {
    use dovetail_core::clock::ManualClock;
    use dovetail_core::cluster::{IntOrPercent, Pdb};
    use dovetail_core::labels::LabelSelector;
    use dovetail_core::pod::Pod;
    use std::time::Duration;

    let (cluster, ledger, _, errors) = setup();
    let clock = Arc::new(ManualClock::new());
    let ex = Executor::new(
        cluster.clone(),
        ledger,
        errors.clone(),
        Default::default(),
        ExecutorConfig::default(),
        clock.clone(),
    );
    cluster.apply_node(Node { name: "n1".into(), ..Node::default() });
    let claim = dovetail_cluster::NodeClaim {
        name: "default-abcde".into(),
        spec: dovetail_core::nodepool::NodeClaimSpec::default(),
        finalizers: Vec::new(),
        deleting: false,
        status: dovetail_cluster::NodeClaimStatus { node_name: Some("n1".into()), ..Default::default() },
        resource_version: 0,
        created: None,
    };
    cluster.create_nodeclaim(claim).await.expect("claim");
    let web = |i: usize| PodKey::new("default", &format!("web-{i}"));
    let app = BTreeMap::from([("app".to_string(), "web".to_string())]);
    for i in 0..2 {
        cluster.apply_pod(Pod { key: web(i), labels: app.clone().into(), ..Pod::default() });
        cluster.bind(&web(i), "n1").expect("bind");
    }
    cluster.apply_pdb(Pdb {
        key: PodKey::new("default", "web"),
        selector: LabelSelector::new(app.clone(), Vec::new()),
        min_available: Some(IntOrPercent::Int(2)),
        max_unavailable: None,
        disruptions_allowed: 0,
    });
    let evict = |i: usize| vec![Effect::new("default-abcde", Action::Evict(web(i)))];
    let calls = || cluster.writes().get("evict").copied().unwrap_or(0);
    let term = dovetail_raft::FIRST_TERM;
    let run = |i| {
        let ex = ex.clone();
        async move { ex.run(term, evict(i)).await.remove(0).1 }
    };
    assert!(matches!(run(0).await, Done::Failed(ClusterError::DisruptionBudget { .. })));
    assert_eq!(errors.counts().get("evict/disruption_budget"), Some(&1), "refusals are counted");
    // Asked again at once: not sent.
    assert_eq!(run(0).await, Done::BackingOff);
    assert_eq!(calls(), 1);
    // The other pod has its own backoff.
    assert!(matches!(run(1).await, Done::Failed(_)));
    assert_eq!(calls(), 2);
    // 100 ms, then 200 ms, 400 ms, ... each refusal doubles the wait.
    let mut waited = Vec::new();
    for _ in 0..8 {
        let before = calls();
        let mut ms = 0;
        while calls() == before && ms < 20_000 {
            clock.advance(Duration::from_millis(10));
            ms += 10;
            let done = run(0).await;
            assert!(matches!(done, Done::BackingOff | Done::Failed(ClusterError::DisruptionBudget { .. })), "{done:?}");
        }
        waited.push(ms);
    }
    assert_eq!(waited, [100, 200, 400, 800, 1600, 3200, 6400, 10_000], "capped at 10 s");
    let events: Vec<_> = cluster.events().into_iter().filter(|e| e.reason == "FailedDraining").collect();
    assert_eq!(events.len(), 1, "one per node, not per refused pod or refusal: {events:?}");
    assert!(events.iter().all(|e| e.kind == ObjectKind::Node && e.name == "n1" && e.warning), "{events:?}");
    assert!(events[0].message.contains("default/web-0"), "{}", events[0].message);
    // The budget allows one: the next try after the wait goes through, and the pod's
    // backoff is forgotten.
    cluster.apply_pod(Pod { key: web(2), labels: app.clone().into(), ..Pod::default() });
    cluster.bind(&web(2), "n1").expect("bind");
    clock.advance(Duration::from_secs(10));
    assert_eq!(run(0).await, Done::Applied);
    assert!(!ex.backing_off(&web(0)));
}

#[tokio::test]
async fn effects_of_a_stale_term_never_run() {
    let (cluster, ledger, ex, errors) = setup();
    cluster.apply_node(Node { name: "n1".into(), ..Node::default() });
    ledger.elect(0);
    let done = ex.run(dovetail_raft::FIRST_TERM, vec![taint_node("n1")]).await;
    assert_eq!(done[0].1, Done::Fenced);
    assert!(cluster.snapshot().nodes["n1"].taints.is_empty());
    assert!(cluster.writes().is_empty(), "no API call at all");
    assert_eq!(errors.counts().get("patch_node/fenced"), Some(&1));
}

/// A writer with faults a test asks for: its first node read never answers (`hang`: a call
/// cut off by a stopping actor), and it paces its calls (`pacing`: a throttle pause) until the
/// test opens the gate, in `ready` and in each node write, as the kube writer's rate limit
/// does.
struct Faulty {
    inner: Arc<SimCluster>,
    hang: bool,
    hung: std::sync::atomic::AtomicBool,
    pacing: Option<tokio::sync::watch::Receiver<bool>>,
}

impl Faulty {
    fn of(inner: Arc<SimCluster>) -> Faulty {
        Faulty { inner, hang: false, hung: std::sync::atomic::AtomicBool::new(false), pacing: None }
    }

    async fn paced(&self) {
        if let Some(gate) = &self.pacing {
            let mut gate = gate.clone();
            if gate.wait_for(|open| *open).await.is_err() {
                panic!("the test dropped the gate");
            }
        }
    }
}

impl ClusterWriter for Faulty {
    fn ready(&self) -> dovetail_cluster::BoxFuture<'_, ()> {
        Box::pin(self.paced())
    }
    fn create_nodeclaim(
        &self,
        c: dovetail_cluster::NodeClaim,
    ) -> dovetail_cluster::BoxFuture<'_, Result<u64, ClusterError>> {
        self.inner.create_nodeclaim(c)
    }
    fn get_nodeclaim<'a>(
        &'a self,
        n: &'a str,
    ) -> dovetail_cluster::BoxFuture<'a, Result<Arc<dovetail_cluster::NodeClaim>, ClusterError>> {
        self.inner.get_nodeclaim(n)
    }
    fn update_nodeclaim_status<'a>(
        &'a self,
        n: &'a str,
        s: dovetail_cluster::NodeClaimStatus,
        rv: u64,
    ) -> dovetail_cluster::BoxFuture<'a, Result<u64, ClusterError>> {
        self.inner.update_nodeclaim_status(n, s, rv)
    }
    fn update_nodeclaim_metadata<'a>(
        &'a self,
        n: &'a str,
        u: dovetail_cluster::NodeClaimUpdate,
        rv: u64,
    ) -> dovetail_cluster::BoxFuture<'a, Result<u64, ClusterError>> {
        self.inner.update_nodeclaim_metadata(n, u, rv)
    }
    fn delete_nodeclaim<'a>(&'a self, n: &'a str) -> dovetail_cluster::BoxFuture<'a, Result<u64, ClusterError>> {
        self.inner.delete_nodeclaim(n)
    }
    fn get_node<'a>(&'a self, n: &'a str) -> dovetail_cluster::BoxFuture<'a, Result<Arc<Node>, ClusterError>> {
        if self.hang && !self.hung.swap(true, std::sync::atomic::Ordering::SeqCst) {
            return Box::pin(std::future::pending());
        }
        self.inner.get_node(n)
    }
    fn update_node<'a>(
        &'a self,
        n: &'a str,
        u: NodeUpdate,
        rv: u64,
    ) -> dovetail_cluster::BoxFuture<'a, Result<u64, ClusterError>> {
        Box::pin(async move {
            self.paced().await;
            self.inner.update_node(n, u, rv).await
        })
    }
    fn delete_node<'a>(&'a self, n: &'a str) -> dovetail_cluster::BoxFuture<'a, Result<u64, ClusterError>> {
        self.inner.delete_node(n)
    }
    fn evict<'a>(
        &'a self,
        p: &'a dovetail_core::pod::PodKey,
    ) -> dovetail_cluster::BoxFuture<'a, Result<u64, ClusterError>> {
        self.inner.evict(p)
    }
    fn delete_pod<'a>(
        &'a self,
        p: &'a dovetail_core::pod::PodKey,
        grace_seconds: Option<i64>,
    ) -> dovetail_cluster::BoxFuture<'a, Result<u64, ClusterError>> {
        self.inner.delete_pod(p, grace_seconds)
    }
    fn record_event(&self, e: dovetail_cluster::Event) -> dovetail_cluster::BoxFuture<'_, Result<(), ClusterError>> {
        self.inner.record_event(e)
    }
}

#[tokio::test]
async fn a_cancelled_effect_does_not_leave_its_key_in_flight() {
    let cluster = Arc::new(SimCluster::new());
    cluster.apply_node(Node { name: "n1".into(), ..Node::default() });
    let writer = Arc::new(Faulty { hang: true, ..Faulty::of(cluster.clone()) });
    let ledger = Arc::new(InProcess::new());
    let ex = Executor::new(
        writer,
        ledger,
        Arc::new(Errors::new()),
        Default::default(),
        ExecutorConfig::default(),
        Arc::new(ManualClock::new()),
    );
    let effect = taint_node("n1");
    // Cut off mid-call (an actor that stops drops its futures).
    let cut =
        tokio::time::timeout(std::time::Duration::from_millis(50), ex.run_one(dovetail_raft::FIRST_TERM, &effect))
            .await;
    assert!(cut.is_err(), "the first read hangs");
    let done = ex.run_one(dovetail_raft::FIRST_TERM, &effect).await;
    assert_eq!(done, Done::Applied, "the key was released when the first run was dropped");
    assert!(cluster.snapshot().nodes["n1"].taints.iter().any(|t| t.key == "karpenter.sh/disrupted"));
}

/// The term is checked after the writer's pacing, right before the write: a leader deposed
/// while its write waited out a throttle pause writes nothing. (Checked before the wait, the
/// write went out after the term had ended.)
#[tokio::test]
async fn a_write_that_waited_out_a_throttle_pause_is_fenced_if_the_term_ended_meanwhile() {
    let cluster = Arc::new(SimCluster::new());
    cluster.apply_node(Node { name: "n1".into(), ..Node::default() });
    let (open, gate) = tokio::sync::watch::channel(false);
    let writer = Arc::new(Faulty { pacing: Some(gate), ..Faulty::of(cluster.clone()) });
    let ledger = Arc::new(InProcess::new());
    let errors = Arc::new(Errors::new());
    let ex = Executor::new(
        writer,
        ledger.clone(),
        errors.clone(),
        Default::default(),
        ExecutorConfig::default(),
        Arc::new(ManualClock::new()),
    );
    let run = {
        let ex = ex.clone();
        tokio::spawn(async move { ex.run(dovetail_raft::FIRST_TERM, vec![taint_node("n1")]).await })
    };
    // The effect waits for the writer's pacing; meanwhile another node leads.
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    assert!(!run.is_finished(), "the write waits for the pause");
    ledger.elect(0);
    open.send_replace(true);
    let done = tokio::time::timeout(std::time::Duration::from_secs(10), run).await.expect("ends").expect("joined");
    assert_eq!(done[0].1, Done::Fenced);
    assert!(cluster.snapshot().nodes["n1"].taints.is_empty(), "nothing written after the term ended");
    assert_eq!(cluster.writes().get("update_node"), None, "no write call at all");
    assert_eq!(errors.counts().get("patch_node/fenced"), Some(&1));
}

#[tokio::test]
async fn a_conflict_that_outlives_the_retries_fails_and_is_counted() {
    let (cluster, _, ex, errors) = setup();
    cluster.apply_node(Node { name: "n1".into(), ..Node::default() });
    cluster.inject_conflicts(100);
    let done = ex.run(dovetail_raft::FIRST_TERM, vec![taint_node("n1")]).await;
    assert!(matches!(done[0].1, Done::Failed(ClusterError::Conflict { .. })));
    assert_eq!(errors.counts().get("patch_node/conflict"), Some(&1));
}

#[tokio::test]
async fn a_pod_covered_by_two_pdbs_is_backed_off_and_reported_on_the_pod_not_evicted_every_second() {
    use dovetail_core::cluster::{IntOrPercent, Pdb};
    use dovetail_core::labels::LabelSelector;
    use dovetail_core::pod::Pod;
    use std::collections::BTreeMap;
    use std::time::Duration;

    let (cluster, ledger, _, errors) = setup();
    let clock = Arc::new(ManualClock::new());
    let ex = Executor::new(
        cluster.clone(),
        ledger,
        errors.clone(),
        Default::default(),
        ExecutorConfig::default(),
        clock.clone(),
    );
    cluster.apply_node(Node { name: "n1".into(), ..Node::default() });
    let web = PodKey::new("default", "web-0");
    let app = BTreeMap::from([("app".to_string(), "web".to_string())]);
    cluster.apply_pod(Pod { key: web.clone(), labels: app.clone().into(), ..Pod::default() });
    cluster.bind(&web, "n1").expect("bind");
    // Two budgets select the pod, each allowing a disruption: the eviction API refuses it
    // anyway (HTTP 500 on a real server).
    for name in ["web", "web-too"] {
        cluster.apply_pdb(Pdb {
            key: PodKey::new("default", name),
            selector: LabelSelector::new(app.clone(), Vec::new()),
            min_available: None,
            max_unavailable: Some(IntOrPercent::Int(1)),
            disruptions_allowed: 1,
        });
    }
    let calls = || cluster.writes().get("evict").copied().unwrap_or(0);
    let run = || {
        let ex = ex.clone();
        let web = web.clone();
        async move {
            ex.run(dovetail_raft::FIRST_TERM, vec![Effect::new("default-abcde", Action::Evict(web))]).await.remove(0).1
        }
    };
    assert!(matches!(run().await, Done::Failed(ClusterError::ManyPdbs { .. })));
    // A reconcile a second later asks again: the pod is backing off, nothing is sent.
    clock.advance(Duration::from_millis(50));
    assert_eq!(run().await, Done::BackingOff);
    assert_eq!(calls(), 1, "asked once, not at every reconcile");
    // Over a minute of reconciles every second, the waits double up to the cap: a handful of
    // calls, not sixty.
    for _ in 0..60 {
        clock.advance(Duration::from_secs(1));
        let done = run().await;
        assert!(matches!(done, Done::BackingOff | Done::Failed(ClusterError::ManyPdbs { .. })), "{done:?}");
    }
    assert!(calls() <= 15, "{} evictions in a minute", calls());
    assert!(ex.backing_off(&web), "still refused, still backing off");
    // The misconfiguration is said once, on the pod itself, naming what to mend.
    let events: Vec<_> = cluster.events().into_iter().filter(|e| e.reason == "FailedEviction").collect();
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!((events[0].kind, events[0].name.as_str(), events[0].warning), (ObjectKind::Pod, "default/web-0", true));
    assert!(events[0].message.contains("more than one PodDisruptionBudget"), "{}", events[0].message);
    assert_eq!(errors.counts().get("evict/many_pdbs").copied(), Some(calls()), "each refusal is counted");
    assert!(cluster.snapshot().pods.get(&web).is_some(), "the pod stays where it is");
}

#[tokio::test]
async fn a_create_that_meets_a_deleting_nodeclaim_of_its_name_fails_instead_of_taking_it_as_its_own() {
    use dovetail_core::cluster::{NodeClaim, NodeClaimStatus};
    use dovetail_core::nodepool::NodeClaimSpec;
    let (cluster, _, ex, _) = setup();
    // An earlier claim of the same name and the same shape, on its way out (its finalizer
    // holds it): the ledger forgot it as it removed the finalizer.
    let nc = NodeClaim {
        name: "default-abcde".into(),
        spec: NodeClaimSpec { nodepool: "default".into(), ..NodeClaimSpec::default() },
        finalizers: vec![TERMINATION_FINALIZER.to_string()],
        deleting: false,
        status: NodeClaimStatus::default(),
        resource_version: 0,
        created: None,
    };
    let create = || Effect::new("default-abcde", Action::CreateNodeClaim(Box::new(nc.clone())));
    let done = ex.run(dovetail_raft::FIRST_TERM, vec![create()]).await;
    assert_eq!(done[0].1, Done::Applied);
    // A repeated create of the live object is ours already.
    let done = ex.run(dovetail_raft::FIRST_TERM, vec![create()]).await;
    assert_eq!(done[0].1, Done::Unchanged);
    let deleted = ex.run(dovetail_raft::FIRST_TERM, vec![Effect::new("default-abcde", Action::DeleteNodeClaim)]).await;
    assert_eq!(deleted[0].1, Done::Applied);
    assert!(cluster.snapshot().nodeclaims["default-abcde"].deleting);
    // The new claim's create must not take the old object for its own.
    let done = ex.run(dovetail_raft::FIRST_TERM, vec![create()]).await;
    assert!(matches!(done[0].1, Done::Failed(ClusterError::AlreadyExists { .. })), "{:?}", done[0].1);
}
