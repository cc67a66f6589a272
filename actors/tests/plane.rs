//! Component tests of the control plane's actors on the sim cloud, the in-process ledger and a
//! manual clock.

/// What every module's world needs.
mod common {
    use std::sync::{Arc, OnceLock};

    use actix::prelude::*;
    use tokio::sync::mpsc;

    use dovetail_core::catalog::{Catalog, InstanceType, NodeClassSettings};
    use dovetail_core::ledger::State;
    use dovetail_raft::{InProcess, Ledger};

    /// The embedded catalog's types, resolved once.
    pub fn types() -> Arc<Vec<InstanceType>> {
        static T: OnceLock<Arc<Vec<InstanceType>>> = OnceLock::new();
        T.get_or_init(|| {
            let c = Catalog::embedded("us-east-1").expect("catalog");
            Arc::new(c.instance_types(&NodeClassSettings::default(), None))
        })
        .clone()
    }

    /// An actor that hands every message it gets to the test through a bounded channel.
    pub struct Forward<M>(mpsc::Sender<M>);

    impl<M: Send + Unpin + 'static> Actor for Forward<M> {
        type Context = Context<Self>;
    }

    impl<M: Message<Result = ()> + Send + Unpin + 'static> Handler<M> for Forward<M> {
        type Result = ();
        fn handle(&mut self, msg: M, _: &mut Context<Self>) {
            // The tests read every message; a full channel means one stopped reading.
            if self.0.try_send(msg).is_err() {
                panic!("the test's channel is full or closed");
            }
        }
    }

    /// A forwarding actor and the receiving end (at most 10,000 messages waiting).
    pub fn forward<M: Message<Result = ()> + Send + Unpin + 'static>() -> (Addr<Forward<M>>, mpsc::Receiver<M>) {
        let (tx, rx) = mpsc::channel(10_000);
        (Forward(tx).start(), rx)
    }

    /// A cloud whose launch calls take `delay` (the sim answers at once), so restarts land
    /// while calls are under way.
    pub struct SlowLaunch {
        pub inner: Arc<dyn dovetail_cloud::CloudProvider>,
        pub delay: std::time::Duration,
    }

    impl dovetail_cloud::CloudProvider for SlowLaunch {
        fn launch<'a>(
            &'a self,
            requests: &'a [dovetail_cloud::LaunchRequest],
        ) -> dovetail_cloud::BoxFuture<'a, Vec<Result<dovetail_cloud::Instance, dovetail_cloud::CloudError>>> {
            Box::pin(async move {
                tokio::time::sleep(self.delay).await;
                self.inner.launch(requests).await
            })
        }
        fn terminate<'a>(
            &'a self,
            ids: &'a [String],
        ) -> dovetail_cloud::BoxFuture<'a, Vec<Result<(), dovetail_cloud::CloudError>>> {
            self.inner.terminate(ids)
        }
        fn get<'a>(
            &'a self,
            id: &'a str,
        ) -> dovetail_cloud::BoxFuture<'a, Result<dovetail_cloud::Instance, dovetail_cloud::CloudError>> {
            self.inner.get(id)
        }
        fn list(
            &self,
        ) -> dovetail_cloud::BoxFuture<'_, Result<Vec<dovetail_cloud::Instance>, dovetail_cloud::CloudError>> {
            self.inner.list()
        }
        fn instance_types<'a>(
            &'a self,
            node_class: &'a dovetail_cloud::NodeClass,
        ) -> dovetail_cloud::BoxFuture<'a, Result<Vec<InstanceType>, dovetail_cloud::CloudError>> {
            self.inner.instance_types(node_class)
        }
        fn is_drifted<'a>(
            &'a self,
            instance: &'a dovetail_cloud::Instance,
            node_class: &'a dovetail_cloud::NodeClass,
        ) -> dovetail_cloud::BoxFuture<'a, Result<Option<dovetail_cloud::DriftReason>, dovetail_cloud::CloudError>>
        {
            self.inner.is_drifted(instance, node_class)
        }
    }

    /// The ledger's committed state.
    pub fn state(ledger: &InProcess) -> State {
        let mut out = None;
        ledger.read(&mut |s| out = Some(s.clone())).expect("read");
        out.unwrap_or_default()
    }
}

mod zone {
    use crate::common::{Forward, forward, state, types};
    use std::collections::BTreeMap;
    use std::sync::Arc;
    use std::time::Duration;

    use actix::prelude::*;
    use dovetail_actors::zone::{GetStats, Launch, LaunchOutcome, ZoneActor, ZoneConfig};
    use dovetail_cloud::sim::{ApiLimits, Bucket, SimCloud, SimConfig};
    use dovetail_cloud::{CloudError, LaunchRequest, NodeClass, OfferingKey};
    use dovetail_core::catalog::CapacityType;
    use dovetail_core::clock::ManualClock;
    use dovetail_core::ledger::{ClaimRequest, ClaimState, Command, Entry, Offering};
    use dovetail_core::resources::{ResourceList, ResourceName};
    use dovetail_raft::{InProcess, Ledger};
    use tokio::sync::mpsc;

    struct World {
        cloud: Arc<SimCloud>,
        ledger: Arc<InProcess>,
        clock: Arc<ManualClock>,
        zone: Addr<ZoneActor>,
        collector: Addr<Forward<LaunchOutcome>>,
        outcomes: mpsc::Receiver<LaunchOutcome>,
    }

    async fn world(claims: usize, limits: ApiLimits) -> World {
        let clock = Arc::new(ManualClock::new());
        let cloud = Arc::new(SimCloud::new(SimConfig { limits, ..SimConfig::default() }, types(), clock.clone()));
        let ledger = Arc::new(InProcess::new());
        ledger
            .propose(Entry { at: 0, command: Command::SetPool { pool: "default".into(), limits: ResourceList::new() } })
            .await
            .expect("pool");
        let reqs = (0..claims)
            .map(|i| ClaimRequest {
                id: format!("claim-{i}"),
                zone: "us-east-1a".into(),
                resources: ResourceList::cpu_mem(8_000, 32 << 30),
                price_per_hour: 400_000,
            })
            .collect();
        ledger
            .propose(Entry { at: 0, command: Command::Reserve { pool: "default".into(), batch: 1, claims: reqs } })
            .await
            .expect("reserve");
        let zone = ZoneActor::new(ZoneConfig::new("us-east-1a"), cloud.clone(), ledger.clone(), clock.clone()).start();
        let (collector, outcomes) = forward();
        World { cloud, ledger, clock, zone, collector, outcomes }
    }

    fn request(claim: &str, zone: &str) -> LaunchRequest {
        LaunchRequest {
            claim: claim.into(),
            nodepool: "default".into(),
            node_class: NodeClass { name: "default".into(), hash: "h".into(), ..Default::default() },
            zone: zone.into(),
            instance_types: vec!["m5.large".into(), "m5.xlarge".into(), "m5.2xlarge".into()],
            capacity_types: vec![CapacityType::OnDemand],
            labels: BTreeMap::new(),
            tags: BTreeMap::new(),
        }
    }

    async fn next(w: &mut World) -> LaunchOutcome {
        tokio::time::timeout(Duration::from_secs(10), w.outcomes.recv())
            .await
            .expect("an outcome within 10 s")
            .expect("collector alive")
    }

    #[actix_rt::test]
    async fn launches_within_the_window_go_as_one_call_and_the_ledger_follows() {
        let mut w = world(6, ApiLimits::default()).await;
        for part in [0..2, 2..4, 4..6] {
            let requests = part.map(|i| request(&format!("claim-{i}"), "us-east-1a")).collect();
            w.zone
                .send(Launch { causes: Vec::new(), requests, reply: w.collector.clone().recipient() })
                .await
                .expect("mailbox");
        }
        let mut launched = Vec::new();
        for _ in 0..6 {
            let o = next(&mut w).await;
            launched.push(o.result.expect("launched"));
        }
        assert_eq!(w.cloud.stats().fleet_calls, 1, "one call, one CreateFleet for identical requests");
        let stats = w.zone.send(GetStats).await.expect("stats");
        assert_eq!((stats.launch_calls, stats.launched, stats.in_flight), (1, 6, 0));
        let s = state(&w.ledger);
        for inst in &launched {
            let claim = s.claim(inst.claim.as_deref().expect("claim")).expect("in the ledger");
            assert_eq!(claim.state, ClaimState::Launched { instance: inst.id.clone() });
            assert_eq!(claim.resources.get(&ResourceName::Cpu), inst.capacity.get(&ResourceName::Cpu));
        }
        // m5.large (2 vCPU) replaced the 8-vCPU reservation in the usage.
        assert_eq!(s.total().get(&ResourceName::Cpu), 6 * 2_000);
    }

    #[actix_rt::test]
    async fn insufficient_capacity_marks_the_offerings_and_goes_back_to_the_pool() {
        let mut w = world(1, ApiLimits::default()).await;
        for t in ["m5.large", "m5.xlarge", "m5.2xlarge"] {
            w.cloud.set_capacity(
                OfferingKey {
                    instance_type: t.into(),
                    zone: "us-east-1a".into(),
                    capacity_type: CapacityType::OnDemand,
                },
                0,
            );
        }
        w.clock.advance(Duration::from_secs(100));
        let reply = w.collector.clone().recipient();
        w.zone
            .send(Launch { causes: Vec::new(), requests: vec![request("claim-0", "us-east-1a")], reply })
            .await
            .expect("mailbox");
        let o = next(&mut w).await;
        assert!(
            matches!(o.result, Err(CloudError::InsufficientCapacity { ref offerings }) if offerings.len() == 3),
            "{o:?}"
        );
        let s = state(&w.ledger);
        let m5 = Offering {
            instance_type: "m5.large".into(),
            zone: "us-east-1a".into(),
            capacity_type: CapacityType::OnDemand,
        };
        let epoch = dovetail_core::clock::to_millis(dovetail_core::clock::DEFAULT_EPOCH);
        assert!(s.is_unavailable(&m5, epoch + 100_000));
        assert!(!s.is_unavailable(&m5, epoch + 280_000), "for Karpenter's 3 minutes");
        assert_eq!(
            s.claim("claim-0").map(|c| c.state.clone()),
            Some(ClaimState::Launching),
            "the pool decides what next"
        );
    }

    #[actix_rt::test]
    async fn a_throttled_launch_is_retried_after_the_retry_after() {
        // One token, refilled at 10 per second of the sim clock.
        let limits = ApiLimits { mutating: Bucket::new(1.0, 10.0), ..ApiLimits::default() };
        let mut w = world(2, limits).await;
        let reply = w.collector.clone().recipient();
        w.zone
            .send(Launch { causes: Vec::new(), requests: vec![request("claim-0", "us-east-1a")], reply: reply.clone() })
            .await
            .expect("mailbox");
        assert!(next(&mut w).await.result.is_ok());
        // The bucket is empty now: the next launch is throttled until the sim clock moves.
        w.zone
            .send(Launch { causes: Vec::new(), requests: vec![request("claim-1", "us-east-1b")], reply: reply.clone() })
            .await
            .expect("mailbox");
        let wrong = next(&mut w).await;
        assert!(matches!(wrong.result, Err(CloudError::Invalid { .. })), "a claim for another zone is refused");
        w.zone
            .send(Launch { causes: Vec::new(), requests: vec![request("claim-1", "us-east-1a")], reply })
            .await
            .expect("mailbox");
        for _ in 0..100 {
            if w.zone.send(GetStats).await.expect("stats").throttled > 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        w.clock.advance(Duration::from_secs(1));
        let o = next(&mut w).await;
        assert!(o.result.is_ok(), "{o:?}");
        let stats = w.zone.send(GetStats).await.expect("stats");
        assert!(stats.throttled >= 1 && stats.launched == 2, "{stats:?}");
    }
}

mod pool {
    use crate::common::{forward, state, types};
    use std::collections::BTreeMap;
    use std::sync::Arc;
    use std::time::Duration;

    use actix::prelude::*;
    use dovetail_actors::kubelet::registrations;
    use dovetail_actors::pool::{GetPoolStats, NodePoolActor, PoolWiring, Provision, Reconcile, Unplaced};
    use dovetail_actors::zone::{ZoneActor, ZoneConfig};
    use dovetail_cloud::sim::{SimCloud, SimConfig};
    use dovetail_cloud::{CloudProvider, LaunchRequest, NodeClass, OfferingKey};
    use dovetail_cluster::sim::SimCluster;
    use dovetail_cluster::{ClusterView, ClusterWriter, NodeClaim};
    use dovetail_core::catalog::CapacityType;
    use dovetail_core::clock::{Clock, ManualClock};
    use dovetail_core::labels;
    use dovetail_core::ledger::{Caps, ClaimRequest, ClaimState, Command, Entry, State, micro_dollars};
    use dovetail_core::nodepool::NodeClaimSpec;
    use dovetail_core::nodepool::NodePool;
    use dovetail_core::pod::{Pod, PodKey};
    use dovetail_core::requirements::{Requirement, Requirements};
    use dovetail_core::resources::{ResourceList, ResourceName};
    use dovetail_raft::{InProcess, Ledger};
    use tokio::sync::mpsc;

    const ZONES: [&str; 3] = ["us-east-1a", "us-east-1b", "us-east-1c"];

    struct World {
        cloud: Arc<SimCloud>,
        cluster: Arc<SimCluster>,
        ledger: Arc<InProcess>,
        pool: Addr<NodePoolActor>,
        unplaced: mpsc::Receiver<Unplaced>,
    }

    async fn world(pool: NodePool, cloud: SimCloud, clock: Arc<ManualClock>) -> World {
        let ledger = Arc::new(InProcess::new());
        ledger
            .propose(Entry {
                at: 0,
                command: Command::SetPool { pool: pool.name.clone(), limits: pool.limits.clone() },
            })
            .await
            .expect("pool");
        start(pool, Arc::new(cloud), Arc::new(SimCluster::new()), ledger, clock)
    }

    /// The plane's actors over existing cloud, cluster and ledger (a fresh start or a restart).
    fn start(
        pool: NodePool,
        cloud: Arc<SimCloud>,
        cluster: Arc<SimCluster>,
        ledger: Arc<InProcess>,
        clock: Arc<ManualClock>,
    ) -> World {
        let zones = ZONES
            .iter()
            .map(|z| {
                let a = ZoneActor::new(ZoneConfig::new(z), cloud.clone(), ledger.clone(), clock.clone()).start();
                (z.to_string(), a)
            })
            .collect();
        let (router, unplaced) = forward::<Unplaced>();
        let wiring = PoolWiring {
            view: cluster.clone(),
            cluster: cluster.clone(),
            ledger: ledger.clone(),
            clock: clock.clone(),
            zones,
            router: router.recipient(),
        };
        let node_class = NodeClass { name: "default".into(), hash: "h".into(), ..Default::default() };
        let pool = NodePoolActor::new(pool, types(), node_class, wiring).start();
        World { cloud, cluster, ledger, pool, unplaced }
    }

    fn pods(n: usize, cpu_milli: i64) -> Vec<Pod> {
        (0..n)
            .map(|i| Pod {
                key: PodKey::new("default", &format!("web-{i}")),
                requests: ResourceList::cpu_mem(cpu_milli, 1 << 30),
                creation: i as i64,
                ..Pod::default()
            })
            .collect()
    }

    fn m5_large_on_demand(limits: ResourceList) -> NodePool {
        let mut reqs = Requirements::new();
        reqs.add(labels::INSTANCE_TYPE, Requirement::is_in(["m5.large"]));
        reqs.add(labels::CAPACITY_TYPE, Requirement::is_in(["on-demand"]));
        NodePool { limits, ..NodePool::new("default", reqs) }
    }

    /// Waits (bounded) until every ledger claim is launched and `n` exist.
    async fn launched(w: &World, n: usize) -> State {
        for _ in 0..400 {
            let s = state(&w.ledger);
            if s.claims().len() == n && s.claims().values().all(|c| matches!(c.state, ClaimState::Launched { .. })) {
                return s;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        panic!("claims not launched within 10 s: {:?}", state(&w.ledger).claims());
    }

    #[actix_rt::test]
    async fn pods_become_reserved_created_and_launched_claims() {
        let clock = Arc::new(ManualClock::new());
        let cloud = SimCloud::new(SimConfig::default(), types(), clock.clone());
        let w = world(m5_large_on_demand(ResourceList::new()), cloud, clock).await;
        // 12 pods of 1.5 cpu: one per m5.large.
        w.pool
            .send(Provision { causes: Vec::new(), pods: pods(12, 1500), daemonsets: Vec::new() })
            .await
            .expect("mailbox");
        let s = launched(&w, 12).await;
        let snap = w.cluster.snapshot();
        assert_eq!(snap.nodeclaims.len(), 12, "claims = NodeClaims");
        assert_eq!(w.cloud.list().await.expect("list").len(), 12, "claims = instances");
        for c in s.claims().values() {
            let nc = &snap.nodeclaims[&c.id];
            assert!(nc.status.provider_id.as_deref().is_some_and(|p| p.ends_with(c.state.instance().unwrap_or("?"))));
        }
        assert_eq!(s.total().get(&ResourceName::Nodes), 12);
        let stats = w.pool.send(GetPoolStats).await.expect("stats");
        assert_eq!((stats.claims_created, stats.launched, stats.released), (12, 12, 0));
    }

    #[actix_rt::test]
    async fn launched_claims_register_initialize_and_take_their_pods() {
        let clock = Arc::new(ManualClock::new());
        let cloud = SimCloud::new(SimConfig::default(), types(), clock.clone());
        let w = world(m5_large_on_demand(ResourceList::new()), cloud, clock).await;
        let pending = pods(4, 1500);
        for p in &pending {
            w.cluster.apply_pod(p.clone());
        }
        w.pool.send(Provision { causes: Vec::new(), pods: pending, daemonsets: Vec::new() }).await.expect("mailbox");
        launched(&w, 4).await;
        assert_eq!(w.cluster.schedule(), 0, "no nodes yet");
        register_all(&w).await;
        let snap = w.cluster.snapshot();
        for n in snap.nodes.values() {
            assert!(n.taints.is_empty(), "{:?}", n.taints);
            assert_eq!(n.labels.get(labels::INITIALIZED).map(String::as_str), Some("true"));
            assert_eq!(n.labels.get(labels::NODEPOOL).map(String::as_str), Some("default"));
        }
        for nc in snap.nodeclaims.values() {
            assert!(nc.status.node_name.is_some() && nc.status.condition("Initialized").is_some());
        }
        assert_eq!(w.cluster.schedule(), 4, "every pod binds");
        assert_eq!(w.cluster.snapshot().pending().count(), 0);
    }

    /// Registers every instance's node (the kubelets) and reconciles until all are initialized.
    async fn register_all(w: &World) {
        for reg in registrations(&w.cloud.list().await.expect("list")) {
            w.cluster.register(&reg).expect("register");
        }
        for _ in 0..200 {
            w.pool.send(Reconcile).await.expect("mailbox");
            if state(&w.ledger).claims().values().all(|c| matches!(c.state, ClaimState::Initialized { .. })) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("not initialized: {:?}", state(&w.ledger).claims());
    }

    /// Reconciles until the ledger has no claims (bounded).
    async fn until_gone(w: &World) {
        for _ in 0..200 {
            w.pool.send(Reconcile).await.expect("mailbox");
            if state(&w.ledger).claims().is_empty() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("claims left: {:?}", state(&w.ledger).claims());
    }

    #[actix_rt::test]
    async fn a_claim_that_never_registers_is_terminated_after_15_minutes() {
        let clock = Arc::new(ManualClock::new());
        let cloud = SimCloud::new(SimConfig::default(), types(), clock.clone());
        let w = world(m5_large_on_demand(ResourceList::new()), cloud, clock.clone()).await;
        w.pool
            .send(Provision { causes: Vec::new(), pods: pods(1, 1500), daemonsets: Vec::new() })
            .await
            .expect("mailbox");
        launched(&w, 1).await;
        clock.advance(Duration::from_secs(14 * 60));
        w.pool.send(Reconcile).await.expect("mailbox");
        assert_eq!(state(&w.ledger).claims().len(), 1, "within the registration timeout");
        clock.advance(Duration::from_secs(60));
        until_gone(&w).await;
        assert!(w.cloud.list().await.expect("list").is_empty(), "the instance is terminated");
        assert!(w.cluster.snapshot().nodeclaims.is_empty());
        let stats = w.pool.send(GetPoolStats).await.expect("stats");
        assert_eq!((stats.expired, stats.terminated), (1, 1));
    }

    #[actix_rt::test]
    async fn a_deleted_claim_is_drained_tier_by_tier_then_terminated() {
        let clock = Arc::new(ManualClock::new());
        let cloud = SimCloud::new(SimConfig::default(), types(), clock.clone());
        let w = world(m5_large_on_demand(ResourceList::new()), cloud, clock).await;
        let pending = pods(2, 500);
        for p in &pending {
            w.cluster.apply_pod(p.clone());
        }
        w.pool.send(Provision { causes: Vec::new(), pods: pending, daemonsets: Vec::new() }).await.expect("mailbox");
        launched(&w, 1).await;
        register_all(&w).await;
        assert_eq!(w.cluster.schedule(), 2);
        let node = w.cluster.snapshot().nodes.keys().next().cloned().expect("a node");
        w.cluster.apply_pod(Pod {
            key: PodKey::new("kube-system", "agent"),
            daemon: true,
            node_name: Some(node.clone()),
            requests: ResourceList::cpu_mem(100, 1 << 20),
            ..Pod::default()
        });
        let claim = state(&w.ledger).claims().keys().next().cloned().expect("a claim");
        w.pool.send(dovetail_actors::pool::DeleteClaim { claim }).await.expect("mailbox");
        // The first drain step takes the workload pods only.
        let mut saw_daemon_alone = false;
        for _ in 0..200 {
            let snap = w.cluster.snapshot();
            let on: Vec<String> = snap.pods_on(&node).map(|p| p.key.name.clone()).collect();
            if on == vec!["agent".to_string()] {
                saw_daemon_alone = true;
            }
            assert!(
                !on.iter().any(|n| n.starts_with("web")) || on.contains(&"agent".to_string()),
                "daemon before workload"
            );
            if state(&w.ledger).claims().is_empty() {
                break;
            }
            w.pool.send(Reconcile).await.expect("mailbox");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(saw_daemon_alone, "workload pods go before the DaemonSet pod");
        assert!(state(&w.ledger).claims().is_empty());
        let snap = w.cluster.snapshot();
        assert!(snap.nodes.is_empty() && snap.nodeclaims.is_empty());
        assert!(w.cloud.list().await.expect("list").is_empty());
    }

    /// A do-not-disrupt pod stalls the drain (it is not evicted) until the NodeClaim's
    /// terminationGracePeriod runs out: it is deleted its own grace period (30 s) before the
    /// deadline, and the instance goes.
    #[actix_rt::test]
    async fn do_not_disrupt_holds_the_drain_until_the_termination_grace_period() {
        let clock = Arc::new(ManualClock::new());
        let cloud = SimCloud::new(SimConfig::default(), types(), clock.clone());
        let pool = NodePool {
            termination_grace_period: Some(Duration::from_secs(600)),
            ..m5_large_on_demand(ResourceList::new())
        };
        let w = world(pool, cloud, clock.clone()).await;
        let mut pending = pods(2, 500);
        pending[0].annotations.insert("karpenter.sh/do-not-disrupt".into(), "true".into());
        for p in &pending {
            w.cluster.apply_pod(p.clone());
        }
        w.pool
            .send(Provision { causes: Vec::new(), pods: pending.clone(), daemonsets: Vec::new() })
            .await
            .expect("mailbox");
        launched(&w, 1).await;
        register_all(&w).await;
        assert_eq!(w.cluster.schedule(), 2);
        let claim = state(&w.ledger).claims().keys().next().cloned().expect("a claim");
        w.pool.send(dovetail_actors::pool::DeleteClaim { claim }).await.expect("mailbox");
        let on_node = |w: &World| w.cluster.snapshot().pods.values().filter(|p| p.node_name.is_some()).count();
        for _ in 0..20 {
            w.pool.send(Reconcile).await.expect("mailbox");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        // The other pod was evicted; the pinned one waits, and so does the instance.
        assert_eq!(on_node(&w), 1);
        assert!(w.cluster.snapshot().pods.contains_key(&pending[0].key));
        assert_eq!(state(&w.ledger).claims().len(), 1, "the drain is stalled");
        clock.advance(Duration::from_secs(569));
        for _ in 0..5 {
            w.pool.send(Reconcile).await.expect("mailbox");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert_eq!(on_node(&w), 1, "not before deadline - 30 s");
        clock.advance(Duration::from_secs(1));
        until_gone(&w).await;
        assert!(!w.cluster.snapshot().pods.contains_key(&pending[0].key), "deleted at the deadline");
        let stats = w.pool.send(GetPoolStats).await.expect("stats");
        assert_eq!((stats.evicted, stats.force_deleted), (1, 1), "{stats:?}");
        assert!(w.cloud.list().await.expect("list").is_empty());
    }

    #[actix_rt::test]
    async fn a_restarted_plane_resumes_from_the_cluster_and_the_ledger_without_duplicates() {
        let clock = Arc::new(ManualClock::new());
        let first = world(
            m5_large_on_demand(ResourceList::new()),
            SimCloud::new(SimConfig::default(), types(), clock.clone()),
            clock.clone(),
        )
        .await;
        // Before the crash: two claims reserved and created; one was even launched in the cloud,
        // but neither launch reached the ledger.
        let reqs = ["default-x", "default-y"]
            .map(|id| ClaimRequest {
                id: id.into(),
                zone: "us-east-1b".into(),
                resources: ResourceList::cpu_mem(2000, 8 << 30),
                price_per_hour: 96_000,
            })
            .to_vec();
        let reserve = Command::Reserve { pool: "default".into(), batch: 9, claims: reqs };
        first.ledger.propose(Entry { at: clock.now_millis(), command: reserve }).await.expect("reserve");
        let mut reqs = Requirements::new();
        reqs.add(labels::INSTANCE_TYPE, Requirement::is_in(["m5.large"]));
        reqs.add(labels::CAPACITY_TYPE, Requirement::is_in(["on-demand"]));
        for id in ["default-x", "default-y"] {
            let spec = NodeClaimSpec {
                nodepool: "default".into(),
                labels: BTreeMap::from([(labels::NODEPOOL.to_string(), "default".to_string())]),
                annotations: BTreeMap::new(),
                taints: Vec::new(),
                startup_taints: Vec::new(),
                requirements: reqs.clone(),
                requests: ResourceList::new(),
                node_class: Default::default(),
                expire_after: None,
                termination_grace_period: None,
            };
            let nc = NodeClaim {
                name: id.into(),
                spec,
                finalizers: vec!["karpenter.sh/termination".into()],
                deleting: false,
                status: Default::default(),
            };
            first.cluster.create_nodeclaim(nc).expect("created");
        }
        let early = LaunchRequest {
            claim: "default-y".into(),
            nodepool: "default".into(),
            node_class: NodeClass { name: "default".into(), hash: "h".into(), ..Default::default() },
            zone: "us-east-1b".into(),
            instance_types: vec!["m5.large".into()],
            capacity_types: vec![CapacityType::OnDemand],
            labels: BTreeMap::new(),
            tags: BTreeMap::new(),
        };
        let before =
            first.cloud.launch(std::slice::from_ref(&early)).await.remove(0).expect("launched before the crash");
        first.pool.send(GetPoolStats).await.expect("alive");
        // Restart: new actors over the replayed ledger, the same cluster and cloud.
        let ledger = Arc::new(InProcess::from_log(first.ledger.log()));
        let w =
            start(m5_large_on_demand(ResourceList::new()), first.cloud.clone(), first.cluster.clone(), ledger, clock);
        w.pool.send(Reconcile).await.expect("mailbox");
        let s = launched(&w, 2).await;
        let instances = w.cloud.list().await.expect("list");
        assert_eq!(instances.len(), 2, "one instance per claim: {instances:?}");
        assert_eq!(
            s.claim("default-y").and_then(|c| c.state.instance()),
            Some(before.id.as_str()),
            "the early instance is adopted"
        );
        let stats = w.pool.send(GetPoolStats).await.expect("stats");
        assert_eq!(stats.resumed, 2);
        assert_eq!(w.cluster.snapshot().nodeclaims.len(), 2, "no new NodeClaims");
    }

    #[actix_rt::test]
    async fn pods_beyond_the_pool_limit_go_back_to_the_router() {
        let clock = Arc::new(ManualClock::new());
        let cloud = SimCloud::new(SimConfig::default(), types(), clock.clone());
        let limits = ResourceList::from_pairs([(ResourceName::Nodes, 3)]);
        let mut w = world(m5_large_on_demand(limits), cloud, clock).await;
        w.pool
            .send(Provision { causes: Vec::new(), pods: pods(5, 1500), daemonsets: Vec::new() })
            .await
            .expect("mailbox");
        let back =
            tokio::time::timeout(Duration::from_secs(10), w.unplaced.recv()).await.expect("in time").expect("router");
        assert_eq!(back.pods.len(), 2, "{back:?}");
        let s = launched(&w, 3).await;
        assert_eq!(s.pool("default").map(|p| p.usage.get(&ResourceName::Nodes)), Some(3));
    }

    /// The global $/hour cap (across pools) stops a round where the pool's own limits would
    /// not: claims beyond it are not granted and their pods go back.
    #[actix_rt::test]
    async fn pods_beyond_the_global_spend_cap_go_back_and_the_cap_holds() {
        let clock = Arc::new(ManualClock::new());
        let cloud = SimCloud::new(SimConfig::default(), types(), clock.clone());
        let mut w = world(m5_large_on_demand(ResourceList::new()), cloud, clock).await;
        // m5.large on demand is $0.096/h: the cap allows three.
        let cap = 3 * micro_dollars(0.096);
        let caps = Caps { resources: ResourceList::new(), price_per_hour: Some(cap) };
        w.ledger.propose(Entry { at: 0, command: Command::SetCaps(caps) }).await.expect("caps");
        w.pool
            .send(Provision { causes: Vec::new(), pods: pods(5, 1500), daemonsets: Vec::new() })
            .await
            .expect("mailbox");
        let back =
            tokio::time::timeout(Duration::from_secs(10), w.unplaced.recv()).await.expect("in time").expect("router");
        assert_eq!(back.pods.len(), 2, "{back:?}");
        let s = launched(&w, 3).await;
        assert!(s.total_price() <= cap, "spend {} over the cap {cap}", s.total_price());
        assert_eq!(s.claims().len(), 3);
        // A second round finds no room either.
        w.pool
            .send(Provision { causes: Vec::new(), pods: pods(1, 1500), daemonsets: Vec::new() })
            .await
            .expect("mailbox");
        let back =
            tokio::time::timeout(Duration::from_secs(10), w.unplaced.recv()).await.expect("in time").expect("router");
        assert_eq!(back.pods.len(), 1);
        assert!(state(&w.ledger).total_price() <= cap);
        assert_eq!(w.cluster.snapshot().nodeclaims.len(), 3, "no NodeClaim past the cap");
    }

    #[actix_rt::test]
    async fn insufficient_capacity_moves_the_claim_to_a_zone_with_capacity() {
        let clock = Arc::new(ManualClock::new());
        let capacity: BTreeMap<OfferingKey, u32> = ["us-east-1a", "us-east-1b"]
            .iter()
            .map(|z| {
                (
                    OfferingKey {
                        instance_type: "m5.large".into(),
                        zone: z.to_string(),
                        capacity_type: CapacityType::OnDemand,
                    },
                    0,
                )
            })
            .collect();
        let cloud = SimCloud::new(SimConfig { capacity, ..SimConfig::default() }, types(), clock.clone());
        let w = world(m5_large_on_demand(ResourceList::new()), cloud, clock).await;
        w.pool
            .send(Provision { causes: Vec::new(), pods: pods(1, 1500), daemonsets: Vec::new() })
            .await
            .expect("mailbox");
        let s = launched(&w, 1).await;
        let instances = w.cloud.list().await.expect("list");
        assert_eq!(instances.len(), 1);
        assert_eq!(instances[0].zone, "us-east-1c");
        let stats = w.pool.send(GetPoolStats).await.expect("stats");
        assert!(stats.relaunched >= 1, "{stats:?}");
        assert_eq!(s.claims().len(), 1, "one claim, no duplicate");
    }
}

mod router {
    use crate::common::{state, types};
    use std::sync::Arc;
    use std::time::Duration;

    use actix::prelude::*;
    use dovetail_actors::pool::{NodePoolActor, PoolWiring};
    use dovetail_actors::router::{GetRouterStats, PodsPending, RoutedPool, Router};
    use dovetail_actors::zone::{ZoneActor, ZoneConfig};
    use dovetail_cloud::NodeClass;
    use dovetail_cloud::sim::{SimCloud, SimConfig};
    use dovetail_cluster::sim::SimCluster;
    use dovetail_core::clock::{Clock, SystemClock};
    use dovetail_core::labels;
    use dovetail_core::ledger::{Command, Entry, State};
    use dovetail_core::nodepool::NodePool;
    use dovetail_core::plane::BatchWindow;
    use dovetail_core::pod::{Pod, PodKey};
    use dovetail_core::requirements::{Requirement, Requirements};
    use dovetail_core::resources::{ResourceList, ResourceName};
    use dovetail_core::scheduling::PoolInput;
    use dovetail_raft::{InProcess, Ledger};

    fn pool(name: &str, weight: i32, nodes: Option<i64>) -> NodePool {
        let mut reqs = Requirements::new();
        reqs.add(labels::INSTANCE_TYPE, Requirement::is_in(["m5.large"]));
        reqs.add(labels::CAPACITY_TYPE, Requirement::is_in(["on-demand"]));
        let limits = nodes.map(|n| ResourceList::from_pairs([(ResourceName::Nodes, n)])).unwrap_or_default();
        NodePool { weight, limits, ..NodePool::new(name, reqs) }
    }

    /// A Router over `pools`, each a NodePoolActor over zone actors for `zones`.
    fn start_router(
        cluster: &Arc<SimCluster>,
        ledger: &Arc<InProcess>,
        cloud: &Arc<SimCloud>,
        clock: &Arc<dyn Clock>,
        pools: &[NodePool],
        zones: &[&str],
        window: BatchWindow,
    ) -> Addr<Router> {
        let zone_actors: Vec<(String, Addr<ZoneActor>)> = zones
            .iter()
            .map(|z| {
                let actor = ZoneActor::new(ZoneConfig::new(z), cloud.clone(), ledger.clone(), clock.clone()).start();
                (z.to_string(), actor)
            })
            .collect();
        let (cl, le, ck) = (cluster.clone(), ledger.clone(), clock.clone());
        let (pools, zones): (Vec<NodePool>, Vec<String>) =
            (pools.to_vec(), zones.iter().map(|z| z.to_string()).collect());
        Router::create(move |ctx| {
            let routed = pools
                .iter()
                .map(|p| {
                    let wiring = PoolWiring {
                        view: cl.clone(),
                        cluster: cl.clone(),
                        ledger: le.clone(),
                        clock: ck.clone(),
                        zones: zone_actors.iter().cloned().collect(),
                        router: ctx.address().recipient(),
                    };
                    let nc = NodeClass { name: "default".into(), hash: "h".into(), ..Default::default() };
                    let actor = NodePoolActor::new(p.clone(), types(), nc, wiring).start();
                    let mut input_pool = p.clone();
                    input_pool.requirements.add(labels::ZONE, Requirement::is_in(zones.iter().map(String::as_str)));
                    RoutedPool { input: PoolInput { pool: input_pool, instance_types: types() }, actor }
                })
                .collect();
            Router::new(window, cl.clone(), ck.clone(), routed)
        })
    }

    /// `n` pending pods of 1.5 vCPU (one per m5.large), in the cluster.
    fn web_pods(cluster: &SimCluster, n: usize) -> Vec<Pod> {
        let pods: Vec<Pod> = (0..n)
            .map(|i| Pod {
                key: PodKey::new("default", &format!("web-{i}")),
                requests: ResourceList::cpu_mem(1500, 1 << 30),
                ..Pod::default()
            })
            .collect();
        cluster.apply_pods(pods.clone());
        pods
    }

    #[test]
    fn the_solver_itself_routes_by_weight_within_known_limits() {
        let limited = pool("weighted", 10, Some(1));
        let input = |p: NodePool| PoolInput { pool: p, instance_types: types() };
        let snapshot = dovetail_core::scheduling::Snapshot {
            nodepools: vec![input(limited), input(pool("default", 0, None))],
            ..Default::default()
        };
        let pods: Vec<Pod> = (0..3)
            .map(|i| Pod {
                key: PodKey::new("d", &format!("p{i}")),
                requests: ResourceList::cpu_mem(1500, 1 << 30),
                ..Pod::default()
            })
            .collect();
        let r = dovetail_core::scheduling::solve(&snapshot, &pods, &Default::default());
        let per_pool: Vec<usize> = (0..2).map(|i| r.claims.iter().filter(|c| c.pool == i).count()).collect();
        assert_eq!(per_pool, vec![1, 2]);
    }

    #[actix_rt::test]
    async fn pods_go_to_the_weighted_pool_and_over_its_limit_to_the_next() {
        let clock: Arc<dyn Clock> = Arc::new(SystemClock::new());
        let cloud = Arc::new(SimCloud::new(SimConfig::default(), types(), clock.clone()));
        let cluster = Arc::new(SimCluster::new());
        let ledger = Arc::new(InProcess::new());
        // The weighted pool's limit is only in the ledger (as when usage the solver cannot see,
        // e.g. another control node's claims, already fills it): the pool finds out at
        // reservation and gives the pods back.
        let pools = [pool("weighted", 10, None), pool("default", 0, None)];
        for (p, nodes) in pools.iter().zip([Some(1), None]) {
            let limits = nodes.map(|n| ResourceList::from_pairs([(ResourceName::Nodes, n)])).unwrap_or_default();
            ledger
                .propose(Entry { at: 0, command: Command::SetPool { pool: p.name.clone(), limits } })
                .await
                .expect("pool");
        }
        let window = BatchWindow { idle: 50, max: 500, adaptive: None };
        let router = start_router(&cluster, &ledger, &cloud, &clock, &pools, &["us-east-1a", "us-east-1b"], window);
        let pods = web_pods(&cluster, 3);
        router.send(PodsPending { pods }).await.expect("mailbox");
        let mut s = State::default();
        for _ in 0..400 {
            s = state(&ledger);
            if s.claims().len() == 3 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        let count = |p: &str| s.claims().values().filter(|c| c.pool == p).count();
        assert_eq!((count("weighted"), count("default")), (1, 2), "{:?}", s.claims().keys().collect::<Vec<_>>());
        let stats = router.send(GetRouterStats).await.expect("stats");
        assert_eq!(stats.batches, 1);
        assert_eq!(stats.rerouted, 2, "{stats:?}");
    }

    /// A batch routes the pods as the cluster has them when it closes: pods bound meanwhile
    /// (or gone) get no claim.
    #[actix_rt::test]
    async fn pods_bound_while_their_batch_waited_are_not_provisioned_for() {
        let clock: Arc<dyn Clock> = Arc::new(SystemClock::new());
        let cluster = Arc::new(SimCluster::new());
        let window = BatchWindow { idle: 100, max: 1_000, adaptive: None };
        let cloud = Arc::new(SimCloud::new(SimConfig::default(), types(), clock.clone()));
        let ledger = Arc::new(InProcess::new());
        let set = Command::SetPool { pool: "default".into(), limits: ResourceList::new() };
        ledger.propose(Entry { at: 0, command: set }).await.expect("pool");
        let router =
            start_router(&cluster, &ledger, &cloud, &clock, &[pool("default", 0, None)], &["us-east-1a"], window);
        cluster.apply_node(dovetail_core::node::Node { name: "n1".into(), ..Default::default() });
        let pods = web_pods(&cluster, 3);
        router.send(PodsPending { pods: pods.clone() }).await.expect("mailbox");
        // Before the window closes: two are bound, one is deleted.
        cluster.bind(&pods[0].key, "n1").expect("bind");
        cluster.bind(&pods[1].key, "n1").expect("bind");
        cluster.delete_pods(&[pods[2].key.clone()]);
        let mut stats = router.send(GetRouterStats).await.expect("stats");
        for _ in 0..200 {
            if stats.batches == 1 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
            stats = router.send(GetRouterStats).await.expect("stats");
        }
        assert_eq!((stats.batches, stats.stale, stats.routed), (1, 3, 0), "{stats:?}");
        assert!(
            dovetail_cluster::ClusterView::snapshot(cluster.as_ref()).nodeclaims.is_empty(),
            "no claim for placed pods"
        );
    }
}

/// The whole plane (Router, two NodePools, three zones) on the sim cloud and sim cluster,
/// with the test playing the kubelets (registration) and kube-scheduler (binding).
mod integration {
    use crate::common::{SlowLaunch, state, types};
    use std::collections::BTreeMap;
    use std::sync::Arc;
    use std::time::Duration;

    use actix::prelude::*;
    use dovetail_actors::feed::FeedConfig;
    use dovetail_actors::kubelet::registrations;
    use dovetail_actors::plane::{Plane, PlaneConfig, Seams};
    use dovetail_actors::pool::{GetPoolStats, Reconcile};
    use dovetail_actors::zone::{GetStats, ZoneActor};
    use dovetail_cloud::limits::ApiLimits;
    use dovetail_cloud::sim::{SimCloud, SimConfig};
    use dovetail_cloud::{CloudProvider, NodeClass, OfferingKey};
    use dovetail_cluster::ClusterView;
    use dovetail_cluster::sim::{Deployment, Registrar, SimCluster, Workloads};
    use dovetail_core::catalog::CapacityType;
    use dovetail_core::clock::{Clock, SystemClock};
    use dovetail_core::labels;
    use dovetail_core::ledger::{ClaimState, Command, Entry};
    use dovetail_core::nodepool::NodePool;
    use dovetail_core::plane::BatchWindow;
    use dovetail_core::pod::Pod;
    use dovetail_core::requirements::{Requirement, Requirements};
    use dovetail_core::resources::{ResourceList, ResourceName};
    use dovetail_raft::{InProcess, Ledger};

    const ZONES: [&str; 3] = ["us-east-1a", "us-east-1b", "us-east-1c"];
    const C5: [&str; 4] = ["c5.large", "c5.xlarge", "c5.2xlarge", "c5.4xlarge"];

    fn pool(name: &str, weight: i32, types: &[&str], cpu_limit: Option<i64>) -> NodePool {
        let mut reqs = Requirements::new();
        reqs.add(labels::INSTANCE_TYPE, Requirement::is_in(types.iter().copied()));
        reqs.add(labels::CAPACITY_TYPE, Requirement::is_in(["on-demand"]));
        reqs.add(labels::ZONE, Requirement::is_in(ZONES));
        let limits = cpu_limit.map(|c| ResourceList::from_pairs([(ResourceName::Cpu, c)])).unwrap_or_default();
        NodePool { weight, limits, ..NodePool::new(name, reqs) }
    }

    struct Outcome {
        claims: usize,
        ice: u64,
        restarts: usize,
        requeued: u64,
    }

    /// The whole plane on `pods` pods from three Deployments over 3 zones and 2 pools (one
    /// weighted and capped), zone a out of c5 capacity. With `restarts`, launch calls take
    /// 120 ms and every actor is stopped (and restarted by its supervisor) that many times,
    /// each while launches are under way. Checks the end state.
    async fn scenario(pods: usize, restarts_wanted: usize) -> Outcome {
        let clock: Arc<dyn Clock> = Arc::new(SystemClock::new());
        // The ICE: zone a has no on-demand capacity for the default pool's types.
        let capacity: BTreeMap<OfferingKey, u32> = C5
            .iter()
            .map(|t| {
                let key = OfferingKey {
                    instance_type: t.to_string(),
                    zone: ZONES[0].into(),
                    capacity_type: CapacityType::OnDemand,
                };
                (key, 0)
            })
            .collect();
        let cloud = Arc::new(SimCloud::new(SimConfig { capacity, ..SimConfig::default() }, types(), clock.clone()));
        let cluster = Arc::new(SimCluster::new());
        let ledger = Arc::new(InProcess::new());
        let pools = [
            pool("weighted", 10, &["m5.large", "m5.xlarge", "m5.2xlarge"], Some(32_000)),
            pool("default", 0, &C5, None),
        ];
        for p in &pools {
            let set = Command::SetPool { pool: p.name.clone(), limits: p.limits.clone() };
            ledger.propose(Entry { at: 0, command: set }).await.expect("pool");
        }
        let nc = NodeClass { name: "default".into(), hash: "h".into(), ..Default::default() };
        let plane = Plane::start(
            PlaneConfig {
                zones: ZONES.iter().map(|z| z.to_string()).collect(),
                pools: pools.iter().map(|p| (p.clone(), types(), nc.clone())).collect(),
                window: BatchWindow { idle: 100, max: 1_000, adaptive: None },
                limits: ApiLimits::default(),
                feed: FeedConfig {
                    tick: Duration::from_millis(50),
                    resend: Duration::from_secs(2),
                    settle: Duration::from_millis(500),
                },
            },
            Seams {
                // Under restarts, launch calls take a while so some are cut off mid-call.
                cloud: match restarts_wanted {
                    1.. => Arc::new(SlowLaunch { inner: cloud.clone(), delay: Duration::from_millis(120) }),
                    0 => cloud.clone(),
                },
                view: cluster.clone(),
                cluster: cluster.clone(),
                ledger: ledger.clone(),
                clock: clock.clone(),
            },
        );
        let pool_addrs = vec![plane.pools["weighted"].clone(), plane.pools["default"].clone()];
        let zones: Vec<(String, Addr<ZoneActor>)> = plane.zones.clone().into_iter().collect();
        // Three Deployments of different sizes.
        let mut workloads = Workloads::new();
        let sizes = [(250, 512 << 20), (500, 1 << 30), (1000, 2 << 30)];
        for (i, (cpu, mem)) in sizes.iter().enumerate() {
            let n = pods / 3 + usize::from(i < pods % 3);
            workloads.apply_deployment(Deployment {
                namespace: "default".into(),
                name: format!("app{i}"),
                replicas: u32::try_from(n).expect("replicas"),
                template: Pod { requests: ResourceList::cpu_mem(*cpu, *mem), ..Pod::default() },
            });
        }
        let mut registrar = Registrar::new(0);
        let (mut done, mut restarts) = (false, 0);
        for _ in 0..1200usize {
            let now = u64::try_from(clock.now().as_millis()).expect("ms");
            workloads.step(&cluster, now);
            if restarts < restarts_wanted {
                let mut in_flight = 0;
                for z in plane.zones.values() {
                    in_flight += z.send(GetStats).await.expect("stats").in_flight;
                }
                if in_flight > 0 {
                    plane.restart_all().await;
                    restarts += 1;
                }
            }
            // The kubelets.
            let launched = registrations(&cloud.list().await.expect("list"));
            registrar.step(&cluster, &launched, now);
            for p in &pool_addrs {
                p.send(Reconcile).await.expect("pool");
            }
            cluster.schedule();
            let s = state(&ledger);
            if cluster.snapshot().pending().count() == 0
                && s.claims().values().all(|c| matches!(c.state, ClaimState::Initialized { .. }))
                && restarts == restarts_wanted
            {
                done = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        let snap = cluster.snapshot();
        let s = state(&ledger);
        assert!(done, "pending {} / claims {:?}", snap.pending().count(), s.claims().len());
        // Every pod bound.
        assert_eq!(snap.pods.len(), pods);
        assert_eq!(snap.pods.values().filter(|p| p.node_name.is_some()).count(), pods);
        // Limits held.
        let weighted_cpu = s.pool("weighted").map(|p| p.usage.get(&ResourceName::Cpu)).unwrap_or(0);
        assert!(weighted_cpu <= 32_000, "weighted pool cpu {weighted_cpu}");
        assert!(weighted_cpu > 0, "the weighted pool was used first");
        // Claims = nodes = NodeClaims = instances; no leaks.
        let instances = cloud.list().await.expect("list");
        assert_eq!(s.claims().len(), snap.nodes.len());
        assert_eq!(s.claims().len(), snap.nodeclaims.len());
        assert_eq!(s.claims().len(), instances.len(), "no leaked instances");
        for i in &instances {
            let claim = i.claim.as_deref().expect("tagged");
            assert_eq!(s.claim(claim).and_then(|c| c.state.instance()), Some(i.id.as_str()));
            assert!(!(i.zone == ZONES[0] && i.instance_type.starts_with("c5")), "no c5 in the ICE'd zone");
        }
        // Every node is used: no claim was made twice for the same pods.
        for n in snap.nodes.keys() {
            assert!(snap.pods_on(n).next().is_some(), "node {n} has no pods: a duplicate claim");
        }
        let (mut ice, mut requeued) = (0, 0);
        for (_, z) in &zones {
            let stats = z.send(GetStats).await.expect("stats");
            ice += stats.insufficient_capacity;
            requeued += stats.requeued;
        }
        let default = pool_addrs[1].send(GetPoolStats).await.expect("stats");
        let weighted = pool_addrs[0].send(GetPoolStats).await.expect("stats");
        eprintln!(
            "claims {}, ice {ice}, restarts {restarts}, requeued {requeued}, pools {weighted:?} {default:?}",
            s.claims().len()
        );
        Outcome { claims: s.claims().len(), ice, restarts, requeued }
    }

    #[actix_rt::test]
    async fn two_thousand_pods_over_three_zones_and_two_pools_with_one_ice() {
        let out = scenario(2000, 0).await;
        // The ICE happened and was routed around.
        assert!(out.ice >= 1, "an insufficient-capacity error was seen");
        assert!(out.claims > 0);
    }

    /// The supervised restart: every actor is stopped three times while launches are under
    /// way, and the end state is the same as without (no duplicate claims, nothing leaked).
    #[actix_rt::test]
    async fn every_actor_restarted_mid_flight_converges_without_duplicates() {
        let out = scenario(600, 3).await;
        assert_eq!(out.restarts, 3);
        assert!(out.requeued > 0, "a restart cut launches off mid-call");
    }
}

mod limiter {
    use crate::common::{forward, state, types};
    use std::collections::BTreeMap;
    use std::sync::Arc;
    use std::time::Duration;

    use actix::prelude::*;
    use dovetail_actors::limiter::RegionLimiter;
    use dovetail_actors::zone::{GetStats, Launch, LaunchOutcome, ZoneActor, ZoneConfig};
    use dovetail_cloud::limits::{ApiLimits, Bucket};
    use dovetail_cloud::sim::{SimCloud, SimConfig};
    use dovetail_cloud::{LaunchRequest, NodeClass};
    use dovetail_core::catalog::CapacityType;
    use dovetail_core::clock::ManualClock;
    use dovetail_core::ledger::{ClaimRequest, ClaimState, Command, Entry};
    use dovetail_core::resources::ResourceList;
    use dovetail_raft::{InProcess, Ledger};

    /// Two zones share one limiter holding 3 instance launches: 6 claims go out 3 now and the
    /// rest as the plane's clock refills the bucket, with no throttled call at the cloud.
    #[actix_rt::test]
    async fn zones_share_the_regional_limiter_and_the_cloud_never_throttles() {
        let clock = Arc::new(ManualClock::new());
        // The cloud has the same small bucket: unpaced, the second zone's call would throttle.
        let limits = ApiLimits { launched_instances: Bucket::new(3.0, 1.0), ..ApiLimits::default() };
        let cloud = Arc::new(SimCloud::new(
            SimConfig { limits: limits.clone(), ..SimConfig::default() },
            types(),
            clock.clone(),
        ));
        let ledger = Arc::new(InProcess::new());
        ledger
            .propose(Entry { at: 0, command: Command::SetPool { pool: "default".into(), limits: ResourceList::new() } })
            .await
            .expect("pool");
        let claims = (0..6)
            .map(|i| ClaimRequest {
                id: format!("c{i}"),
                zone: if i % 2 == 0 { "us-east-1a" } else { "us-east-1b" }.into(),
                resources: ResourceList::cpu_mem(2000, 8 << 30),
                price_per_hour: 96_000,
            })
            .collect();
        ledger
            .propose(Entry { at: 0, command: Command::Reserve { pool: "default".into(), batch: 1, claims } })
            .await
            .expect("reserve");
        let limiter = Arc::new(RegionLimiter::new(limits, clock.clone()));
        let zones: Vec<Addr<ZoneActor>> = ["us-east-1a", "us-east-1b"]
            .iter()
            .map(|z| {
                ZoneActor::new(ZoneConfig::new(z), cloud.clone(), ledger.clone(), clock.clone())
                    .with_limiter(limiter.clone())
                    .start()
            })
            .collect();
        let (sink, mut rx) = forward::<LaunchOutcome>();
        for i in 0..6 {
            let zone = if i % 2 == 0 { "us-east-1a" } else { "us-east-1b" };
            let r = LaunchRequest {
                claim: format!("c{i}"),
                nodepool: "default".into(),
                node_class: NodeClass { name: "default".into(), hash: "h".into(), ..Default::default() },
                zone: zone.into(),
                instance_types: vec!["m5.large".into()],
                capacity_types: vec![CapacityType::OnDemand],
                labels: BTreeMap::new(),
                tags: BTreeMap::new(),
            };
            zones[i % 2]
                .send(Launch { causes: Vec::new(), requests: vec![r], reply: sink.clone().recipient() })
                .await
                .expect("mailbox");
        }
        let mut got = 0;
        for step in 0..400 {
            while let Ok(o) = rx.try_recv() {
                assert!(o.result.is_ok(), "{o:?}");
                got += 1;
            }
            if got == 6 {
                break;
            }
            if step == 20 {
                assert_eq!(got, 3, "the burst: 3 instances");
            }
            if step > 20 && step % 10 == 0 {
                clock.advance(Duration::from_secs(1));
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(got, 6);
        assert_eq!(cloud.stats().throttled, 0, "paced before the cloud could throttle");
        let mut paced = 0;
        for z in &zones {
            paced += z.send(GetStats).await.expect("stats").paced;
        }
        assert!(paced > 0);
        let s = state(&ledger);
        assert!(s.claims().values().all(|c| matches!(c.state, ClaimState::Launched { .. })));
    }
}
