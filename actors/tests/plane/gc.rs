//! Garbage collection on the sim cloud, the sim cluster and the in-process ledger: a leaked
//! instance (its claim tag names no NodeClaim and no claim of the ledger) is terminated after
//! the grace and the Node it registered deleted; instances a NodeClaim or the ledger knows,
//! and younger ones, are kept; a registered claim whose instance is gone is ended; an orphaned
//! Node of a NodePool is deleted, a Node of no NodePool never; nothing happens on a view that
//! has not synced.

use std::sync::Arc;
use std::time::Duration;

use dovetail_actors::config::GcConfig;
use dovetail_actors::errors::Errors;
use dovetail_actors::gc::Gc;
use dovetail_cloud::sim::{SimCloud, SimConfig};
use dovetail_cloud::{CloudProvider, InstanceState, LaunchRequest};
use dovetail_cluster::ClusterWriter;
use dovetail_cluster::sim::SimCluster;
use dovetail_core::catalog::CapacityType;
use dovetail_core::clock::ManualClock;
use dovetail_core::cluster::{NodeClaim, NodeClaimStatus, TERMINATION_FINALIZER};
use dovetail_core::ledger::{ClaimRequest, ClaimState, Command, LaunchBatch, Step};
use dovetail_core::node::Node;
use dovetail_core::nodepool::NodeClaimSpec;
use dovetail_core::resources::ResourceList;
use dovetail_raft::InProcess;

use super::common::{node_class, propose, state, types};

const ZONE: &str = "us-east-1a";

fn request(claim: &str) -> LaunchRequest {
    LaunchRequest {
        claim: claim.into(),
        batch: LaunchBatch { id: format!("b-{claim}"), claims: vec![claim.to_string()].into() },
        nodepool: "default".into(),
        node_class: node_class(),
        zone: ZONE.into(),
        instance_types: vec!["m5.large".into()],
        capacity_types: vec![CapacityType::OnDemand],
        labels: Default::default(),
        tags: Default::default(),
    }
}

/// Launches an instance for `claim` on the sim cloud; its id.
async fn launch(cloud: &SimCloud, claim: &str) -> String {
    let out = cloud.launch(&[request(claim)]).await;
    out.into_iter().next().and_then(Result::ok).map(|i| i.id).expect("launched")
}

/// Records `claim` in the ledger as registered on `instance`.
async fn registered(ledger: &InProcess, claim: &str, instance: &str) {
    let cpu = ResourceList::cpu_mem(2_000, 8 << 30);
    let req = ClaimRequest { id: claim.into(), zone: ZONE.into(), resources: cpu.clone(), price_per_hour: 96_000 };
    propose(ledger, 1, Command::Reserve { pool: "default".into(), claims: vec![req] }).await;
    let batch = LaunchBatch { id: format!("b-{claim}"), claims: vec![claim.to_string()].into() };
    propose(ledger, 1, Command::Launch { zone: ZONE.into(), batches: vec![batch] }).await;
    let launched = Step::Launched {
        batch: format!("b-{claim}"),
        instance: instance.into(),
        resources: cpu.clone(),
        allocatable: cpu,
        price_per_hour: 96_000,
        instance_type: "m5.large".into(),
        capacity_type: CapacityType::OnDemand,
    };
    let steps = vec![(claim.to_string(), launched), (claim.to_string(), Step::Registered)];
    propose(ledger, 1, Command::Advance { steps }).await;
}

#[actix_rt::test]
async fn leaked_instances_and_their_nodes_go_after_the_grace_known_ones_stay_and_claims_of_gone_instances_end() {
    let clock = Arc::new(ManualClock::new());
    let cloud = Arc::new(SimCloud::new(SimConfig::default(), types(), clock.clone()));
    let cluster = Arc::new(SimCluster::new());
    let ledger = Arc::new(InProcess::new());
    propose(ledger.as_ref(), 0, Command::SetPool { pool: "default".into(), limits: ResourceList::new() }).await;

    let leaked = launch(&cloud, "deleted-while-launching").await;
    let known = launch(&cloud, "known").await;
    let held = launch(&cloud, "held").await;
    let lost = launch(&cloud, "lost").await;
    // A NodeClaim the cluster shows (a restart before the ledger adopted it).
    let nc = NodeClaim {
        name: "known".into(),
        spec: NodeClaimSpec { nodepool: "default".into(), ..Default::default() },
        finalizers: Vec::new(),
        deleting: false,
        status: NodeClaimStatus::default(),
        resource_version: 0,
        created: None,
    };
    cluster.create_nodeclaim(nc).await.expect("created");
    registered(&ledger, "held", &held).await;
    registered(&ledger, "lost", &lost).await;
    // The leaked instance's kubelet registered a Node, with dovetail's finalizer.
    let node = |name: &str, instance: &str, ready: bool| Node {
        name: name.into(),
        provider_id: Some(format!("aws:///{ZONE}/{instance}")),
        finalizers: vec![TERMINATION_FINALIZER.into()],
        ready,
        ..Node::default()
    };
    cluster.apply_node(node("leaked-node", &leaked, true));
    cluster.apply_node(node("held-node", &held, false));
    // The lost claim's instance is terminated behind dovetail's back; its node is NotReady.
    cloud.terminate(std::slice::from_ref(&lost)).await.into_iter().for_each(|r| r.expect("terminated"));
    cluster.apply_node(node("lost-node", &lost, false));
    // An orphaned Node of a NodePool: no NodeClaim, not Ready, its instance gone.
    let mut orphan = node("orphan-node", "i-long-gone", false);
    orphan.labels.insert(dovetail_core::labels::NODEPOOL.into(), "default".into());
    cluster.apply_node(orphan);
    // Not a NodePool's: never touched, Ready or not.
    cluster.apply_node(node("someone-elses", "i-not-ours", false));

    let errors = Arc::new(Errors::new());
    let gc = Gc {
        cloud: cloud.clone(),
        ledger: ledger.clone(),
        view: cluster.clone(),
        cluster: cluster.clone(),
        clock: clock.clone(),
        errors: errors.clone(),
        metrics: Default::default(),
        cfg: GcConfig { every: Duration::from_secs(120), grace: Duration::from_secs(30) },
    };

    // Within the grace no instance is proposed; the lost claim already ends, the orphaned Node
    // goes.
    let early = gc.pass().await;
    assert_eq!((early.proposed, early.terminated.len()), (0, 0), "{early:?}");
    assert_eq!(early.claims, ["lost"], "{early:?}");
    assert_eq!(early.nodes, ["orphan-node"], "an orphaned Node needs no grace: {early:?}");

    clock.advance(Duration::from_secs(31));
    let young = launch(&cloud, "launched-just-now").await;
    // A view still warming up: nothing.
    cluster.set_synced(false);
    assert_eq!(gc.pass().await, Default::default());
    cluster.set_synced(true);

    let out = gc.pass().await;
    assert_eq!(out.terminated, std::slice::from_ref(&leaked), "{out:?}");
    assert_eq!(out.nodes, ["leaked-node"], "{out:?}");
    let live: Vec<String> = cloud
        .instances()
        .into_iter()
        .filter(|i| matches!(i.state, InstanceState::Pending | InstanceState::Running))
        .map(|i| i.id)
        .collect();
    for kept in [&known, &held, &young] {
        assert!(live.contains(kept), "{kept} kept: {live:?}");
    }
    assert!(!live.contains(&leaked));
    use dovetail_cluster::ClusterView;
    let snap = cluster.snapshot();
    assert!(
        !snap.nodes.contains_key("leaked-node") && !snap.nodes.contains_key("orphan-node"),
        "{:?}",
        snap.nodes.keys()
    );
    assert!(
        snap.nodes.contains_key("held-node") && snap.nodes.contains_key("someone-elses"),
        "{:?}",
        snap.nodes.keys()
    );
    let s = state(ledger.as_ref()).await;
    assert!(matches!(s.claim("lost").map(|c| &c.state), Some(ClaimState::Terminating { .. })), "{:?}", s.claim("lost"));
    assert!(matches!(s.claim("held").map(|c| &c.state), Some(ClaimState::Registered { .. })), "{:?}", s.claim("held"));
    assert!(errors.counts().is_empty(), "{:?}", errors.counts());
    let text = gc.metrics.encode();
    let sum = |series: &str| dovetail_actors::metrics::sum_of(&text, series, &[]);
    assert_eq!(sum("dovetail_garbage_collected_instances_total"), 1.0, "{text}");
    assert_eq!(sum("dovetail_garbage_collected_nodes_total"), 2.0, "{text}");
    assert_eq!(sum("dovetail_garbage_collected_nodeclaims_total"), 1.0, "{text}");
}

#[actix_rt::test]
async fn garbage_collection_never_terminates_what_a_nodeclaim_it_cannot_read_owns() {
    use dovetail_core::cluster::{Unreadable, UnreadableKind};
    let clock = Arc::new(ManualClock::new());
    let cloud = Arc::new(SimCloud::new(SimConfig::default(), types(), clock.clone()));
    let cluster = Arc::new(SimCluster::new());
    let ledger = Arc::new(InProcess::new());
    propose(ledger.as_ref(), 0, Command::SetPool { pool: "default".into(), limits: ResourceList::new() }).await;
    // Two instances whose NodeClaims a newer Karpenter wrote with a field the adapter cannot
    // convert: one names its instance (launched), one is still known by its claim tag only.
    let named = launch(&cloud, "from-a-newer-karpenter").await;
    let tagged = launch(&cloud, "still-launching").await;
    let leaked = launch(&cloud, "deleted-while-launching").await;
    let unreadable = |name: &str, provider_id: Option<String>| Unreadable {
        kind: UnreadableKind::NodeClaim,
        name: name.into(),
        uid: format!("uid-{name}"),
        provider_id,
        labels: [(dovetail_core::labels::NODEPOOL.to_string(), "default".to_string())].into(),
        error: "NodeClaim: spec.requirements[0].operator: unknown operator \"Gte\"".into(),
    };
    cluster.make_unreadable(unreadable("from-a-newer-karpenter", Some(format!("aws:///{ZONE}/{named}"))));
    cluster.make_unreadable(unreadable("still-launching", None));
    // The named instance's Node, NotReady (its kubelet restarting) with the NodeClaim as owner.
    let mut node = Node {
        name: "newer-node".into(),
        provider_id: Some(format!("aws:///{ZONE}/{named}")),
        owner_claim: Some("from-a-newer-karpenter".into()),
        finalizers: vec![TERMINATION_FINALIZER.into()],
        ready: false,
        ..Node::default()
    };
    node.labels.insert(dovetail_core::labels::NODEPOOL.into(), "default".into());
    cluster.apply_node(node);
    let gc = Gc {
        cloud: cloud.clone(),
        ledger: ledger.clone(),
        view: cluster.clone(),
        cluster: cluster.clone(),
        clock: clock.clone(),
        errors: Arc::new(Errors::new()),
        metrics: Default::default(),
        cfg: GcConfig { every: Duration::from_secs(120), grace: Duration::from_secs(30) },
    };
    clock.advance(Duration::from_secs(60));
    let out = gc.pass().await;
    assert_eq!(out.terminated, std::slice::from_ref(&leaked), "only the truly leaked one: {out:?}");
    assert!(out.nodes.is_empty(), "the unreadable NodeClaim's Node is not an orphan: {out:?}");
    let live: Vec<String> = cloud
        .instances()
        .into_iter()
        .filter(|i| matches!(i.state, InstanceState::Pending | InstanceState::Running))
        .map(|i| i.id)
        .collect();
    assert!(live.contains(&named) && live.contains(&tagged), "{live:?}");
    use dovetail_cluster::ClusterView;
    assert!(cluster.snapshot().nodes.contains_key("newer-node"));
}
