//! Component tests of the control plane's actors on the sim cloud, the in-process ledger and a
//! manual clock.

/// What every module's world needs.
mod common {
    use std::sync::{Arc, OnceLock};
    use std::time::Duration;

    use actix::prelude::*;
    use tokio::sync::mpsc;

    use dovetail_actors::config::Config;
    use dovetail_actors::errors::Errors;
    use dovetail_actors::executor::Executor;
    use dovetail_cloud::{
        BoxFuture, CloudError, CloudProvider, DriftReason, Instance, LaunchRequest, Lookup, NodeClass,
    };
    use dovetail_cluster::ClusterWriter;
    use dovetail_core::catalog::{Catalog, InstanceType, NodeClassSettings};
    use dovetail_core::ledger::{Command, Entry, State};
    use dovetail_raft::{Committed, InProcess, Leadership, Ledger, LedgerError, read_with};

    /// The embedded catalog's types, resolved once.
    pub fn types() -> Arc<Vec<InstanceType>> {
        static T: OnceLock<Arc<Vec<InstanceType>>> = OnceLock::new();
        T.get_or_init(|| {
            let c = Catalog::embedded("us-east-1").expect("catalog");
            Arc::new(c.instance_types(&NodeClassSettings::default(), None))
        })
        .clone()
    }

    pub fn node_class() -> NodeClass {
        NodeClass { name: "default".into(), hash: "h".into(), ..Default::default() }
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

    /// A cloud with faults a test asks for: launch calls that take `delay` (the sim answers at
    /// once), so restarts and deletions land while calls are under way; and TerminateInstances
    /// failing whole, transiently, whenever the call holds `poison` (as moto answered a 500 for
    /// one batch again and again).
    pub struct FaultyCloud {
        pub inner: Arc<dyn CloudProvider>,
        pub delay: Duration,
        pub poison: Option<String>,
    }

    impl CloudProvider for FaultyCloud {
        fn launch<'a>(&'a self, requests: &'a [LaunchRequest]) -> BoxFuture<'a, Vec<Result<Instance, CloudError>>> {
            Box::pin(async move {
                tokio::time::sleep(self.delay).await;
                self.inner.launch(requests).await
            })
        }
        fn find<'a>(&'a self, lookups: &'a [Lookup]) -> BoxFuture<'a, Vec<Result<Option<Instance>, CloudError>>> {
            self.inner.find(lookups)
        }
        fn terminate<'a>(&'a self, ids: &'a [String]) -> BoxFuture<'a, Vec<Result<(), CloudError>>> {
            if self.poison.as_ref().is_some_and(|p| ids.contains(p)) {
                let failed = ids.iter().map(|_| Err(CloudError::Transient { message: "500".into() })).collect();
                return Box::pin(std::future::ready(failed));
            }
            self.inner.terminate(ids)
        }
        fn get<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<Instance, CloudError>> {
            self.inner.get(id)
        }
        fn list(&self) -> BoxFuture<'_, Result<Vec<Instance>, CloudError>> {
            self.inner.list()
        }
        fn instance_types<'a>(
            &'a self,
            node_class: &'a NodeClass,
        ) -> BoxFuture<'a, Result<Vec<InstanceType>, CloudError>> {
            self.inner.instance_types(node_class)
        }
        fn is_drifted<'a>(
            &'a self,
            instance: &'a Instance,
            node_class: &'a NodeClass,
        ) -> BoxFuture<'a, Result<Option<DriftReason>, CloudError>> {
            self.inner.is_drifted(instance, node_class)
        }
    }

    /// A ledger whose proposals take `delay` to commit (a slow quorum), so a new term can
    /// begin between a decision and its commit.
    pub struct SlowLedger {
        pub inner: Arc<InProcess>,
        pub delay: Duration,
    }

    impl Ledger for SlowLedger {
        fn propose(&self, entry: Entry) -> dovetail_raft::BoxFuture<'_, Result<Committed, LedgerError>> {
            Box::pin(async move {
                tokio::time::sleep(self.delay).await;
                self.inner.propose(entry).await
            })
        }
        fn read<'a>(
            &'a self,
            f: Box<dyn FnOnce(&State) + Send + 'a>,
        ) -> dovetail_raft::BoxFuture<'a, Result<(), LedgerError>> {
            self.inner.read(f)
        }
        fn leadership(&self) -> tokio::sync::watch::Receiver<Leadership> {
            self.inner.leadership()
        }
    }

    /// The ledger's committed state.
    pub async fn state(ledger: &dyn Ledger) -> State {
        read_with(ledger, State::clone).await.expect("read")
    }

    /// Proposes a command in the ledger's current term.
    pub async fn propose(ledger: &dyn Ledger, at: u64, command: Command) {
        let c = dovetail_raft::propose_now(ledger, at, command).await.expect("committed");
        assert!(!c.outcome.is_fenced(), "{c:?}");
    }

    /// The plane's executor and settings for a test.
    pub fn executor(cluster: Arc<dyn ClusterWriter>, ledger: Arc<dyn Ledger>) -> (Executor, Arc<Errors>) {
        let errors = Arc::new(Errors::new());
        (
            Executor::new(
                cluster,
                ledger,
                errors.clone(),
                Default::default(),
                Config::default().executor,
                Arc::new(dovetail_core::clock::SystemClock),
            ),
            errors,
        )
    }
}

mod zone {
    use crate::common::{FaultyCloud, Forward, forward, node_class, propose, state, types};
    use std::collections::BTreeMap;
    use std::sync::Arc;
    use std::time::Duration;

    use actix::prelude::*;
    use dovetail_actors::zone::{GetStats, Launch, LaunchOutcome, ZoneActor, ZoneConfig};
    use dovetail_cloud::sim::{ApiLimits, Bucket, SimCloud, SimConfig};
    use dovetail_cloud::{CloudError, CloudProvider, LaunchBatch, LaunchRequest, OfferingKey};
    use dovetail_core::catalog::CapacityType;
    use dovetail_core::clock::{Clock, ManualClock};
    use dovetail_core::ledger::{ClaimRequest, ClaimState, Command, Offering, Step};
    use dovetail_core::resources::{ResourceList, ResourceName};
    use dovetail_raft::InProcess;
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
        let now = clock.now_millis();
        propose(ledger.as_ref(), now, Command::SetPool { pool: "default".into(), limits: ResourceList::new() }).await;
        let reqs = (0..claims)
            .map(|i| ClaimRequest {
                id: format!("claim-{i}"),
                zone: "us-east-1a".into(),
                resources: ResourceList::cpu_mem(8_000, 32 << 30),
                price_per_hour: 400_000,
            })
            .collect();
        propose(ledger.as_ref(), now, Command::Reserve { pool: "default".into(), claims: reqs }).await;
        let zone = ZoneActor::new(ZoneConfig::new("us-east-1a"), cloud.clone(), ledger.clone(), clock.clone()).start();
        let (collector, outcomes) = forward();
        World { cloud, ledger, clock, zone, collector, outcomes }
    }

    fn request(claim: &str, zone: &str) -> LaunchRequest {
        LaunchRequest {
            claim: claim.into(),
            batch: LaunchBatch::default(),
            nodepool: "default".into(),
            node_class: node_class(),
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

    async fn send(w: &World, requests: Vec<LaunchRequest>) {
        let reply = w.collector.clone().recipient();
        w.zone.send(Launch { causes: Vec::new(), requests, reply, again: false }).await.expect("mailbox");
    }

    #[actix_rt::test]
    async fn launches_within_the_window_go_as_one_batch_and_the_ledger_follows() {
        let mut w = world(6, ApiLimits::default()).await;
        for part in [0..2, 2..4, 4..6] {
            send(&w, part.map(|i| request(&format!("claim-{i}"), "us-east-1a")).collect()).await;
        }
        let mut launched = Vec::new();
        for _ in 0..6 {
            let o = next(&mut w).await;
            launched.push(o.result.expect("launched"));
        }
        assert_eq!(w.cloud.stats().fleet_calls, 1, "one call, one CreateFleet for identical requests");
        let stats = w.zone.send(GetStats).await.expect("stats");
        assert_eq!((stats.launch_calls, stats.launched, stats.in_flight), (1, 6, 0));
        let s = state(w.ledger.as_ref()).await;
        let batches: std::collections::BTreeSet<&String> =
            launched.iter().filter_map(|i| i.tags.get(dovetail_cloud::TAG_LAUNCH_BATCH)).collect();
        assert_eq!(batches.len(), 1, "one launch batch, tagged on every instance");
        assert!(batches.iter().all(|b| b.starts_with("us-east-1a-")));
        for inst in &launched {
            let claim = s.claim(inst.claim.as_deref().expect("claim")).expect("in the ledger");
            assert_eq!(claim.state, ClaimState::Launched { instance: inst.id.clone() });
            assert_eq!(claim.resources.get(&ResourceName::Cpu), inst.capacity.get(&ResourceName::Cpu));
            assert_eq!(claim.allocatable, inst.allocatable);
        }
        // m5.large (2 vCPU) replaced the 8-vCPU reservation in the usage.
        assert_eq!(s.total().get(&ResourceName::Cpu), 6 * 2_000);
        assert!(s.batches().is_empty(), "nothing is launching any more");
    }

    #[actix_rt::test]
    async fn insufficient_capacity_marks_the_offerings_and_sends_the_claim_back_to_reserved() {
        let mut w = world(1, ApiLimits::default()).await;
        for t in ["m5.large", "m5.xlarge", "m5.2xlarge"] {
            let key = OfferingKey {
                instance_type: t.into(),
                zone: "us-east-1a".into(),
                capacity_type: CapacityType::OnDemand,
            };
            w.cloud.set_capacity(key, 0);
        }
        w.clock.advance(Duration::from_secs(100));
        send(&w, vec![request("claim-0", "us-east-1a")]).await;
        let o = next(&mut w).await;
        assert!(
            matches!(o.result, Err(CloudError::InsufficientCapacity { ref offerings }) if offerings.len() == 3),
            "{o:?}"
        );
        let s = state(w.ledger.as_ref()).await;
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
            Some(ClaimState::Reserved),
            "the pool decides what next"
        );
    }

    #[actix_rt::test]
    async fn a_throttled_launch_is_retried_after_the_retry_after() {
        // One token, refilled at 10 per second of the sim clock.
        let limits = ApiLimits { mutating: Bucket::new(1.0, 10.0), ..ApiLimits::default() };
        let mut w = world(2, limits).await;
        send(&w, vec![request("claim-0", "us-east-1a")]).await;
        assert!(next(&mut w).await.result.is_ok());
        // The bucket is empty now: the next launch is throttled until the sim clock moves.
        send(&w, vec![request("claim-1", "us-east-1b")]).await;
        let wrong = next(&mut w).await;
        assert!(matches!(wrong.result, Err(CloudError::Invalid { .. })), "a claim for another zone is refused");
        send(&w, vec![request("claim-1", "us-east-1a")]).await;
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
        let s = state(w.ledger.as_ref()).await;
        assert!(matches!(s.claim("claim-1").map(|c| &c.state), Some(ClaimState::Launched { .. })));
    }

    /// The ledger decides what may launch: a claim deleted meanwhile launches nothing.
    #[actix_rt::test]
    async fn a_claim_the_ledger_refuses_is_not_launched() {
        let mut w = world(1, ApiLimits::default()).await;
        let now = w.clock.now_millis();
        let steps = vec![("claim-0".to_string(), Step::Terminating)];
        propose(w.ledger.as_ref(), now, Command::Advance { steps }).await;
        send(&w, vec![request("claim-0", "us-east-1a")]).await;
        let o = next(&mut w).await;
        assert!(matches!(o.result, Err(CloudError::Invalid { .. })), "{o:?}");
        assert_eq!(w.cloud.stats().fleet_calls, 0, "nothing launched");
        assert_eq!(w.zone.send(GetStats).await.expect("stats").refused, 1);
    }

    /// A zone whose node no longer leads launches nothing: the new leader re-drives.
    #[actix_rt::test]
    async fn a_launch_decided_in_an_old_term_never_reaches_the_cloud() {
        let w = world(1, ApiLimits::default()).await;
        // A new term begins between the pool's decision and the zone's call: the zone's
        // Launch entry is proposed in the term it reads now, but the cloud is called only
        // while that term is current; here the term moves on before the flush.
        w.ledger.elect(w.clock.now_millis());
        let cloud_before = w.cloud.stats().fleet_calls;
        let inner = w.ledger.clone();
        let slow = Arc::new(crate::common::SlowLedger { inner: inner.clone(), delay: Duration::from_millis(200) });
        let zone = ZoneActor::new(ZoneConfig::new("us-east-1a"), w.cloud.clone(), slow, w.clock.clone()).start();
        let reply = w.collector.clone().recipient();
        zone.send(Launch { causes: Vec::new(), requests: vec![request("claim-0", "us-east-1a")], reply, again: false })
            .await
            .expect("mailbox");
        // The zone's Launch entry is on its way (200 ms); a third term begins meanwhile.
        tokio::time::sleep(Duration::from_millis(80)).await;
        inner.elect(w.clock.now_millis());
        for _ in 0..100 {
            if zone.send(GetStats).await.expect("stats").fenced > 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(zone.send(GetStats).await.expect("stats").fenced, 1);
        assert_eq!(w.cloud.stats().fleet_calls, cloud_before, "no CreateFleet");
        assert!(w.cloud.list().await.expect("list").is_empty());
        let s = state(w.ledger.as_ref()).await;
        assert_eq!(
            s.claim("claim-0").map(|c| c.state.clone()),
            Some(ClaimState::Reserved),
            "the stale entry changed nothing"
        );
    }

    /// One instance the cloud keeps failing a call for does not hold back the others asked
    /// with it: a batch that fails whole is halved until the others go (each claim asked
    /// again, as its pool does).
    #[actix_rt::test]
    async fn a_termination_batch_failing_whole_is_split_so_one_bad_instance_holds_back_no_other() {
        use dovetail_actors::zone::{Terminate, Terminated};
        let w = world(0, ApiLimits::default()).await;
        let cloud =
            Arc::new(FaultyCloud { inner: w.cloud.clone(), delay: Duration::ZERO, poison: Some("i-poison".into()) });
        let zone =
            ZoneActor::new(ZoneConfig::new("us-east-1a"), cloud.clone(), w.ledger.clone(), w.clock.clone()).start();
        let (collector, mut replies) = forward::<Terminated>();
        let term = {
            use dovetail_raft::Ledger;
            w.ledger.leadership().borrow().term
        };
        let mut left: Vec<(String, String)> = (0..13).map(|i| (format!("claim-{i}"), format!("i-{i}"))).collect();
        left.push(("claim-bad".into(), "i-poison".into()));
        let mut done: Vec<String> = Vec::new();
        // Bounded: each round asks again for every claim not yet done.
        for _round in 0..12usize {
            for (claim, instance) in &left {
                let msg = Terminate {
                    claim: claim.clone(),
                    instance: Some(instance.clone()),
                    batch: None,
                    term,
                    reply: collector.clone().recipient(),
                };
                zone.send(msg).await.expect("mailbox");
            }
            for _ in 0..left.len() {
                let r = tokio::time::timeout(Duration::from_secs(10), replies.recv())
                    .await
                    .expect("an answer within 10 s")
                    .expect("collector alive");
                if r.result.is_ok() {
                    done.push(r.claim);
                }
            }
            left.retain(|(c, _)| !done.contains(c));
            if left.len() == 1 {
                break;
            }
        }
        assert_eq!(left, [("claim-bad".to_string(), "i-poison".to_string())], "done: {done:?}");
        assert_eq!(done.len(), 13, "every other instance went");
    }
}

mod pool {
    use crate::common::{FaultyCloud, SlowLedger, executor, forward, node_class, propose, state, types};
    use std::sync::Arc;
    use std::time::Duration;

    use actix::prelude::*;
    use dovetail_actors::config::Config;
    use dovetail_actors::errors::Errors;
    use dovetail_actors::kubelet::registrations;
    use dovetail_actors::pool::{
        DeleteClaim, Disrupt, GetDecisions, GetPoolStats, NodePoolActor, PoolWiring, Provision, Reconcile, Reconfigure,
        Unplaced,
    };
    use dovetail_actors::zone::{ZoneActor, ZoneConfig};
    use dovetail_cloud::sim::{SimCloud, SimConfig};
    use dovetail_cloud::{CloudProvider, LaunchBatch, LaunchRequest, NodeClass, OfferingKey};
    use dovetail_cluster::sim::SimCluster;
    use dovetail_cluster::{ClusterView, ClusterWriter, NodeClaim};
    use dovetail_core::catalog::CapacityType;
    use dovetail_core::clock::{Clock, ManualClock};
    use dovetail_core::cluster::{TERMINATION_FINALIZER, UNREGISTERED_TAINT};
    use dovetail_core::labels;
    use dovetail_core::ledger::{Caps, ClaimRequest, ClaimState, Command, State, micro_dollars};
    use dovetail_core::nodepool::{Budget, BudgetNodes, DisruptionReason, NodeClaimSpec, NodePool};
    use dovetail_core::pod::{Pod, PodKey};
    use dovetail_core::requirements::{Requirement, Requirements};
    use dovetail_core::resources::{ResourceList, ResourceName};
    use dovetail_raft::{InProcess, Ledger};
    use tokio::sync::mpsc;

    const ZONES: [&str; 3] = ["us-east-1a", "us-east-1b", "us-east-1c"];

    pub(crate) struct World {
        pub(crate) cloud: Arc<SimCloud>,
        pub(crate) cluster: Arc<SimCluster>,
        pub(crate) ledger: Arc<InProcess>,
        pub(crate) clock: Arc<ManualClock>,
        pub(crate) pool: Addr<NodePoolActor>,
        /// What the pool's actors count (the served metrics).
        pub(crate) metrics: Arc<dovetail_actors::metrics::Metrics>,
        errors: Arc<Errors>,
        unplaced: mpsc::Receiver<Unplaced>,
    }

    async fn world(pool: NodePool, cloud: SimCloud, clock: Arc<ManualClock>) -> World {
        // Recording: a restart test replays its log, as a node with a stored log would.
        let ledger = Arc::new(InProcess::recording());
        let set = Command::SetPool { pool: pool.name.clone(), limits: pool.limits.clone() };
        propose(ledger.as_ref(), clock.now_millis(), set).await;
        start(pool, Arc::new(cloud), Arc::new(SimCluster::new()), ledger, clock)
    }

    /// The pool's actors over existing cloud, cluster and ledger (a fresh start or a restart).
    fn start(
        pool: NodePool,
        cloud: Arc<SimCloud>,
        cluster: Arc<SimCluster>,
        ledger: Arc<InProcess>,
        clock: Arc<ManualClock>,
    ) -> World {
        let l: Arc<dyn Ledger> = ledger.clone();
        let c: Arc<dyn CloudProvider> = cloud.clone();
        start_over(pool, c, l, cluster, clock, Config::default(), (cloud, ledger))
    }

    /// The same over any cloud and ledger (slow ones), with `config`.
    fn start_over(
        pool: NodePool,
        cloud: Arc<dyn CloudProvider>,
        ledger: Arc<dyn Ledger>,
        cluster: Arc<SimCluster>,
        clock: Arc<ManualClock>,
        config: Config,
        (sim, inner): (Arc<SimCloud>, Arc<InProcess>),
    ) -> World {
        let zones = ZONES
            .iter()
            .map(|z| {
                let a = ZoneActor::new(ZoneConfig::new(z), cloud.clone(), ledger.clone(), clock.clone()).start();
                (z.to_string(), a)
            })
            .collect();
        let (router, unplaced) = forward::<Unplaced>();
        let (executor, errors) = executor(cluster.clone(), ledger.clone());
        let metrics = executor.metrics().clone();
        let wiring = PoolWiring {
            view: cluster.clone(),
            cluster: cluster.clone(),
            ledger,
            clock: clock.clone(),
            zones,
            router: router.recipient(),
            executor,
            errors: errors.clone(),
            config: Arc::new(config),
            cloud,
            nominations: Default::default(),
        };
        let pool = NodePoolActor::new(pool, types(), node_class(), wiring).start();
        World { cloud: sim, cluster, ledger: inner, clock, pool, metrics, errors, unplaced }
    }

    /// A second NodePool actor for `pool` over the world's cloud, cluster and ledger (with
    /// zone actors of its own): two actors of one pool acting at once, as a deposed leader's
    /// and its successor's would.
    /// Also returns what it hands back to the Router (kept open for the test's length).
    pub(crate) fn another_actor(
        w: &World,
        pool: NodePool,
        config: Config,
    ) -> (Addr<NodePoolActor>, mpsc::Receiver<Unplaced>) {
        let (cloud, ledger): (Arc<dyn CloudProvider>, Arc<dyn Ledger>) = (w.cloud.clone(), w.ledger.clone());
        let zones = ZONES
            .iter()
            .map(|z| {
                let a = ZoneActor::new(ZoneConfig::new(z), cloud.clone(), ledger.clone(), w.clock.clone()).start();
                (z.to_string(), a)
            })
            .collect();
        let (router, unplaced) = forward::<Unplaced>();
        let (executor, errors) = executor(w.cluster.clone(), ledger.clone());
        let wiring = PoolWiring {
            view: w.cluster.clone(),
            cluster: w.cluster.clone(),
            ledger,
            clock: w.clock.clone(),
            zones,
            router: router.recipient(),
            executor,
            errors,
            config: Arc::new(config),
            cloud,
            nominations: Default::default(),
        };
        (NodePoolActor::new(pool, types(), node_class(), wiring).start(), unplaced)
    }

    pub(crate) fn pods(n: usize, cpu_milli: i64) -> Vec<Pod> {
        (0..n)
            .map(|i| Pod {
                key: PodKey::new("default", &format!("web-{i}")),
                requests: ResourceList::cpu_mem(cpu_milli, 1 << 30),
                creation: i as i64,
                unschedulable: true,
                ..Pod::default()
            })
            .collect()
    }

    pub(crate) fn m5_large_on_demand(limits: ResourceList) -> NodePool {
        let mut reqs = Requirements::new();
        reqs.add(labels::INSTANCE_TYPE, Requirement::is_in(["m5.large"]));
        reqs.add(labels::CAPACITY_TYPE, Requirement::is_in(["on-demand"]));
        NodePool { limits, ..NodePool::new("default", reqs) }
    }

    pub(crate) fn provision(pods: Vec<Pod>) -> Provision {
        Provision { causes: Vec::new(), pods }
    }

    /// Waits (bounded) until every ledger claim is launched and `n` exist.
    pub(crate) async fn launched(w: &World, n: usize) -> State {
        for _ in 0..400 {
            let s = state(w.ledger.as_ref()).await;
            if s.claims().len() == n && s.claims().values().all(|c| matches!(c.state, ClaimState::Launched { .. })) {
                return s;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        panic!("claims not launched within 10 s: {:?}", state(w.ledger.as_ref()).await.claims());
    }

    /// Reconciles (bounded) until `done` holds of the ledger.
    async fn until(w: &World, what: &str, done: impl Fn(&State) -> bool) -> State {
        for _ in 0..1500 {
            w.pool.send(Reconcile).await.expect("mailbox");
            let s = state(w.ledger.as_ref()).await;
            if done(&s) {
                return s;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("{what}: not within 15 s: {:?}", state(w.ledger.as_ref()).await.claims());
    }

    /// Registers every instance's node (the kubelets) and reconciles until all are initialized.
    pub(crate) async fn register_all(w: &World) {
        for reg in registrations(&w.cloud.list().await.expect("list")) {
            w.cluster.register(&reg).expect("register");
        }
        until(w, "initialized", |s| s.claims().values().all(|c| matches!(c.state, ClaimState::Initialized { .. })))
            .await;
    }

    async fn until_gone(w: &World) {
        until(w, "gone", |s| s.claims().is_empty()).await;
    }

    #[actix_rt::test]
    async fn pods_become_reserved_created_and_launched_claims() {
        let clock = Arc::new(ManualClock::new());
        let cloud = SimCloud::new(SimConfig::default(), types(), clock.clone());
        let w = world(m5_large_on_demand(ResourceList::new()), cloud, clock).await;
        // 12 pods of 1.5 cpu: one per m5.large.
        w.pool.send(provision(pods(12, 1500))).await.expect("mailbox");
        launched(&w, 12).await;
        let s = until(&w, "statuses", |_| w.cluster.snapshot().nodeclaims.values().all(|nc| nc.status.is("Launched")))
            .await;
        let snap = w.cluster.snapshot();
        assert_eq!(snap.nodeclaims.len(), 12, "claims = NodeClaims");
        assert_eq!(w.cloud.list().await.expect("list").len(), 12, "claims = instances");
        for c in s.claims().values() {
            assert!(c.id.starts_with("default-") && c.id.len() == "default-".len() + 5, "Karpenter's names: {}", c.id);
            let nc = &snap.nodeclaims[&c.id];
            assert!(nc.status.provider_id.as_deref().is_some_and(|p| p.ends_with(c.state.instance().unwrap_or("?"))));
            assert!(nc.finalizers.contains(&TERMINATION_FINALIZER.to_string()));
        }
        assert_eq!(s.total().get(&ResourceName::Nodes), 12);
        let stats = w.pool.send(GetPoolStats).await.expect("stats");
        assert_eq!((stats.claims_created, stats.launched, stats.released), (12, 12, 0));
    }

    #[actix_rt::test]
    async fn pods_sent_again_while_their_claims_are_made_get_no_second_claim() {
        let clock = Arc::new(ManualClock::new());
        let cloud = SimCloud::new(SimConfig::default(), types(), clock.clone());
        let w = world(m5_large_on_demand(ResourceList::new()), cloud, clock).await;
        let pending = pods(3, 1500);
        w.cluster.apply_pods(pending.clone());
        w.pool.send(provision(pending.clone())).await.expect("mailbox");
        // The feed's resend, before the NodeClaims show in the Router's view.
        w.pool.send(provision(pending)).await.expect("mailbox");
        launched(&w, 3).await;
        let stats = w.pool.send(GetPoolStats).await.expect("stats");
        assert_eq!((stats.claims_created, stats.already_held), (3, 3));
        assert_eq!(w.cloud.list().await.expect("list").len(), 3, "one instance per claim");
    }

    #[actix_rt::test]
    async fn launched_claims_register_initialize_and_take_their_pods() {
        let clock = Arc::new(ManualClock::new());
        let cloud = SimCloud::new(SimConfig::default(), types(), clock.clone());
        let w = world(m5_large_on_demand(ResourceList::new()), cloud, clock).await;
        let pending = pods(4, 1500);
        w.cluster.apply_pods(pending.clone());
        w.pool.send(provision(pending)).await.expect("mailbox");
        launched(&w, 4).await;
        assert_eq!(w.cluster.schedule(), 0, "no nodes yet");
        register_all(&w).await;
        let snap = w.cluster.snapshot();
        for n in snap.nodes.values() {
            assert!(n.taints.is_empty(), "{:?}", n.taints);
            assert_eq!(n.labels.get(labels::INITIALIZED).map(String::as_str), Some("true"));
            assert_eq!(n.labels.get(labels::NODEPOOL).map(String::as_str), Some("default"));
            assert_eq!(n.finalizers, vec![TERMINATION_FINALIZER.to_string()]);
        }
        for nc in snap.nodeclaims.values() {
            assert!(nc.status.node_name.is_some() && nc.status.is("Initialized") && nc.status.is("Registered"));
        }
        assert_eq!(w.cluster.schedule(), 4, "every pod binds");
        assert_eq!(w.cluster.snapshot().pending().count(), 0);
    }

    #[actix_rt::test]
    async fn a_claim_that_never_registers_is_terminated_after_15_minutes() {
        let clock = Arc::new(ManualClock::new());
        let cloud = SimCloud::new(SimConfig::default(), types(), clock.clone());
        let w = world(m5_large_on_demand(ResourceList::new()), cloud, clock.clone()).await;
        w.pool.send(provision(pods(1, 1500))).await.expect("mailbox");
        launched(&w, 1).await;
        clock.advance(Duration::from_secs(14 * 60));
        w.pool.send(Reconcile).await.expect("mailbox");
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(state(w.ledger.as_ref()).await.claims().len(), 1, "within the registration timeout");
        clock.advance(Duration::from_secs(60));
        until_gone(&w).await;
        assert!(w.cloud.list().await.expect("list").is_empty(), "the instance is terminated");
        assert!(w.cluster.snapshot().nodeclaims.is_empty());
        let stats = w.pool.send(GetPoolStats).await.expect("stats");
        assert_eq!((stats.expired, stats.terminated), (1, 1));
        assert!(w.cluster.events().iter().any(|e| e.reason == "LivenessTimeout"), "{:?}", w.cluster.events());
    }

    #[actix_rt::test]
    async fn a_deleted_claim_is_drained_tier_by_tier_then_terminated() {
        let clock = Arc::new(ManualClock::new());
        let cloud = SimCloud::new(SimConfig::default(), types(), clock.clone());
        let w = world(m5_large_on_demand(ResourceList::new()), cloud, clock).await;
        let pending = pods(2, 500);
        w.cluster.apply_pods(pending.clone());
        w.pool.send(provision(pending)).await.expect("mailbox");
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
        let claim = state(w.ledger.as_ref()).await.claims().keys().next().cloned().expect("a claim");
        w.pool.send(DeleteClaim { claim }).await.expect("mailbox");
        // The first drain step takes the workload pods only.
        let mut saw_daemon_alone = false;
        for _ in 0..200 {
            let snap = w.cluster.snapshot();
            if let Some(n) = snap.nodes.get(&node) {
                assert!(!n.unschedulable, "tainted karpenter.sh/disrupted, not cordoned");
            }
            let on: Vec<String> = snap.pods_on(&node).map(|p| p.key.name.clone()).collect();
            if on == vec!["agent".to_string()] {
                saw_daemon_alone = true;
                assert!(snap.nodes[&node].taints.iter().any(|t| t.key == "karpenter.sh/disrupted"));
            }
            assert!(
                !on.iter().any(|n| n.starts_with("web")) || on.contains(&"agent".to_string()),
                "daemon before workload"
            );
            if state(w.ledger.as_ref()).await.claims().is_empty() {
                break;
            }
            w.pool.send(Reconcile).await.expect("mailbox");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(saw_daemon_alone, "workload pods go before the DaemonSet pod");
        until_gone(&w).await;
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
        w.cluster.apply_pods(pending.clone());
        w.pool.send(provision(pending.clone())).await.expect("mailbox");
        launched(&w, 1).await;
        register_all(&w).await;
        assert_eq!(w.cluster.schedule(), 2);
        let claim = state(w.ledger.as_ref()).await.claims().keys().next().cloned().expect("a claim");
        w.pool.send(DeleteClaim { claim }).await.expect("mailbox");
        let on_node = |w: &World| w.cluster.snapshot().pods.values().filter(|p| p.node_name.is_some()).count();
        for _ in 0..20 {
            w.pool.send(Reconcile).await.expect("mailbox");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        // The other pod was evicted; the pinned one waits, and so does the instance.
        assert_eq!(on_node(&w), 1);
        assert!(w.cluster.snapshot().pods.contains_key(&pending[0].key));
        assert_eq!(state(w.ledger.as_ref()).await.claims().len(), 1, "the drain is stalled");
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

    /// A restart after a crash mid-launch: the ledger recorded the batch, the cloud made the
    /// instances (untagged per claim: the call was cut off), nothing else was heard. The new
    /// actors re-drive the batch and adopt the instances; none is made twice.
    #[actix_rt::test]
    async fn a_restarted_plane_resumes_from_the_ledger_without_duplicates() {
        let clock = Arc::new(ManualClock::new());
        let first = world(
            m5_large_on_demand(ResourceList::new()),
            SimCloud::new(SimConfig::default(), types(), clock.clone()),
            clock.clone(),
        )
        .await;
        let ids = ["default-xxxxx", "default-yyyyy"];
        let reqs = ids
            .map(|id| ClaimRequest {
                id: id.into(),
                zone: "us-east-1b".into(),
                resources: ResourceList::cpu_mem(2000, 8 << 30),
                price_per_hour: 96_000,
            })
            .to_vec();
        let now = clock.now_millis();
        propose(first.ledger.as_ref(), now, Command::Reserve { pool: "default".into(), claims: reqs }).await;
        let batch = LaunchBatch { id: "us-east-1b-crashedbatch".into(), claims: ids.map(String::from).into() };
        propose(
            first.ledger.as_ref(),
            now,
            Command::Launch { zone: "us-east-1b".into(), batches: vec![batch.clone()] },
        )
        .await;
        let mut reqs = Requirements::new();
        reqs.add(labels::INSTANCE_TYPE, Requirement::is_in(["m5.large"]));
        reqs.add(labels::CAPACITY_TYPE, Requirement::is_in(["on-demand"]));
        for id in ids {
            let spec =
                NodeClaimSpec { nodepool: "default".into(), requirements: reqs.clone(), ..NodeClaimSpec::default() };
            let nc = NodeClaim {
                name: id.into(),
                spec,
                finalizers: vec![TERMINATION_FINALIZER.into()],
                deleting: false,
                status: Default::default(),
                resource_version: 0,
                created: None,
            };
            first.cluster.create_nodeclaim(nc).await.expect("created");
        }
        let requests: Vec<LaunchRequest> = ids
            .iter()
            .map(|id| LaunchRequest {
                claim: id.to_string(),
                batch: batch.clone(),
                nodepool: "default".into(),
                node_class: node_class(),
                zone: "us-east-1b".into(),
                instance_types: vec!["m5.large".into()],
                capacity_types: vec![CapacityType::OnDemand],
                labels: Default::default(),
                tags: Default::default(),
            })
            .collect();
        first.cloud.crash_after_fleet(1);
        let cut = first.cloud.launch(&requests).await;
        assert!(cut.iter().all(|r| r.is_err()), "the call was cut off");
        assert_eq!(first.cloud.len(), 2, "but the instances were made");
        // Restart: new actors over the replayed ledger, the same cluster and cloud.
        let ledger = Arc::new(InProcess::from_log(first.ledger.log()));
        let w =
            start(m5_large_on_demand(ResourceList::new()), first.cloud.clone(), first.cluster.clone(), ledger, clock);
        w.pool.send(Reconcile).await.expect("mailbox");
        let s = launched(&w, 2).await;
        let instances = w.cloud.list().await.expect("list");
        assert_eq!(instances.len(), 2, "one instance per claim: {instances:?}");
        for id in ids {
            let inst = s.claim(id).and_then(|c| c.state.instance()).expect("launched");
            assert!(instances.iter().any(|i| i.id == inst && i.claim.as_deref() == Some(id)));
        }
        assert_eq!(w.cloud.stats().adopted, 2);
        let stats = w.pool.send(GetPoolStats).await.expect("stats");
        assert_eq!(stats.resumed, 2);
        assert_eq!(w.cluster.snapshot().nodeclaims.len(), 2, "no new NodeClaims");
    }

    /// Claim ids come from a generator seeded by the clock: a restart at the same instant
    /// draws the same names. Names live in the view are skipped at the draw; names live only
    /// in the ledger (here the restarted plane writes to a view that does not hold the first
    /// NodeClaims) are refused by it and renamed; every claim is granted, none twice.
    #[actix_rt::test]
    async fn a_restart_mints_no_colliding_ids() {
        let clock = Arc::new(ManualClock::new());
        let cloud = Arc::new(SimCloud::new(SimConfig::default(), types(), clock.clone()));
        let cluster = Arc::new(SimCluster::new());
        let ledger = Arc::new(InProcess::new());
        propose(
            ledger.as_ref(),
            clock.now_millis(),
            Command::SetPool { pool: "default".into(), limits: ResourceList::new() },
        )
        .await;
        let pool = m5_large_on_demand(ResourceList::new());
        let first = start(pool.clone(), cloud.clone(), cluster.clone(), ledger.clone(), clock.clone());
        first.pool.send(provision(pods(3, 1500))).await.expect("mailbox");
        launched(&first, 3).await;
        // A restart at the same instant of the (manual) clock: the same seed.
        let elsewhere = Arc::new(SimCluster::new());
        let again = start(pool, cloud.clone(), elsewhere.clone(), ledger.clone(), clock.clone());
        let more: Vec<Pod> = pods(6, 1500).into_iter().skip(3).collect();
        again.pool.send(provision(more)).await.expect("mailbox");
        let s = launched(&again, 6).await;
        assert_eq!(s.claims().len(), 6, "six distinct claims");
        assert_eq!(elsewhere.snapshot().nodeclaims.len(), 3);
        let first_names: std::collections::BTreeSet<String> = cluster.snapshot().nodeclaims.keys().cloned().collect();
        assert!(elsewhere.snapshot().nodeclaims.keys().all(|n| !first_names.contains(n)));
        assert_eq!(cloud.len(), 6);
        let stats = again.pool.send(GetPoolStats).await.expect("stats");
        assert!(stats.renamed >= 3, "the same names came up and were renamed: {stats:?}");
    }

    #[actix_rt::test]
    async fn pods_beyond_the_pool_limit_go_back_to_the_router() {
        let clock = Arc::new(ManualClock::new());
        let cloud = SimCloud::new(SimConfig::default(), types(), clock.clone());
        let limits = ResourceList::from_pairs([(ResourceName::Nodes, 3)]);
        let mut w = world(m5_large_on_demand(limits), cloud, clock).await;
        w.pool.send(provision(pods(5, 1500))).await.expect("mailbox");
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
        let mut w = world(m5_large_on_demand(ResourceList::new()), cloud, clock.clone()).await;
        // m5.large on demand is $0.096/h: the cap allows three.
        let cap = 3 * micro_dollars(0.096);
        let caps = Caps { resources: ResourceList::new(), price_per_hour: Some(cap) };
        propose(w.ledger.as_ref(), clock.now_millis(), Command::SetCaps(caps)).await;
        w.pool.send(provision(pods(5, 1500))).await.expect("mailbox");
        let back =
            tokio::time::timeout(Duration::from_secs(10), w.unplaced.recv()).await.expect("in time").expect("router");
        assert_eq!(back.pods.len(), 2, "{back:?}");
        let s = launched(&w, 3).await;
        assert!(s.total_price() <= cap, "spend {} over the cap {cap}", s.total_price());
        assert_eq!(s.claims().len(), 3);
        // A second round finds no room either.
        w.pool.send(provision(pods(1, 1500))).await.expect("mailbox");
        let back =
            tokio::time::timeout(Duration::from_secs(10), w.unplaced.recv()).await.expect("in time").expect("router");
        assert_eq!(back.pods.len(), 1);
        assert!(state(w.ledger.as_ref()).await.total_price() <= cap);
        assert_eq!(w.cluster.snapshot().nodeclaims.len(), 3, "no NodeClaim past the cap");
    }

    #[actix_rt::test]
    async fn insufficient_capacity_moves_the_claim_and_the_ledger_to_a_zone_with_capacity() {
        let clock = Arc::new(ManualClock::new());
        let capacity = ["us-east-1a", "us-east-1b"]
            .iter()
            .map(|z| {
                let key = OfferingKey {
                    instance_type: "m5.large".into(),
                    zone: z.to_string(),
                    capacity_type: CapacityType::OnDemand,
                };
                (key, 0)
            })
            .collect();
        let cloud = SimCloud::new(SimConfig { capacity, ..SimConfig::default() }, types(), clock.clone());
        let w = world(m5_large_on_demand(ResourceList::new()), cloud, clock).await;
        w.pool.send(provision(pods(1, 1500))).await.expect("mailbox");
        let s = launched(&w, 1).await;
        let instances = w.cloud.list().await.expect("list");
        assert_eq!(instances.len(), 1);
        assert_eq!(instances[0].zone, "us-east-1c");
        let claim = s.claims().values().next().expect("one");
        assert_eq!(claim.zone, "us-east-1c", "the ledger follows the relaunch's zone");
        let stats = w.pool.send(GetPoolStats).await.expect("stats");
        assert!(stats.relaunched >= 1, "{stats:?}");
        assert_eq!(s.claims().len(), 1, "one claim, no duplicate");
    }

    /// `kubectl delete nodeclaim`: the API server marks it; the lifecycle drains, terminates
    /// the instance, removes the node and then the finalizer, and the object goes.
    #[actix_rt::test]
    async fn kubectl_style_deletion_of_a_nodeclaim_completes_through_its_finalizer() {
        let clock = Arc::new(ManualClock::new());
        let cloud = SimCloud::new(SimConfig::default(), types(), clock.clone());
        let w = world(m5_large_on_demand(ResourceList::new()), cloud, clock).await;
        let pending = pods(1, 500);
        w.cluster.apply_pods(pending.clone());
        w.pool.send(provision(pending)).await.expect("mailbox");
        launched(&w, 1).await;
        register_all(&w).await;
        assert_eq!(w.cluster.schedule(), 1);
        let claim = w.cluster.snapshot().nodeclaims.keys().next().cloned().expect("a claim");
        w.cluster.remove_nodeclaim(&claim).expect("deleted by hand");
        assert!(w.cluster.snapshot().nodeclaims[&claim].deleting, "held by its finalizer");
        until_gone(&w).await;
        for _ in 0..50 {
            if w.cluster.snapshot().nodeclaims.is_empty() {
                break;
            }
            w.pool.send(Reconcile).await.expect("mailbox");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let snap = w.cluster.snapshot();
        assert!(snap.nodeclaims.is_empty(), "the deletion completed");
        assert!(snap.nodes.is_empty());
        assert!(w.cloud.list().await.expect("list").is_empty());
    }

    /// `kubectl delete node`: its finalizer holds it while it is drained; only then does the
    /// instance go, and the node with it.
    #[actix_rt::test]
    async fn a_node_deleted_by_hand_is_drained_before_its_instance_goes() {
        let clock = Arc::new(ManualClock::new());
        let cloud = SimCloud::new(SimConfig::default(), types(), clock.clone());
        let w = world(m5_large_on_demand(ResourceList::new()), cloud, clock).await;
        let pending = pods(2, 500);
        w.cluster.apply_pods(pending.clone());
        w.pool.send(provision(pending)).await.expect("mailbox");
        launched(&w, 1).await;
        register_all(&w).await;
        assert_eq!(w.cluster.schedule(), 2);
        let node = w.cluster.snapshot().nodes.keys().next().cloned().expect("a node");
        w.cluster.remove_node(&node).expect("deleted by hand");
        let mut drained_first = false;
        for _ in 0..300 {
            w.pool.send(Reconcile).await.expect("mailbox");
            let snap = w.cluster.snapshot();
            let live = w.cloud.len();
            if live == 0 {
                assert_eq!(snap.pods_on(&node).count(), 0, "the instance went before its pods were drained");
                drained_first = true;
            }
            if state(w.ledger.as_ref()).await.claims().is_empty() && snap.nodes.is_empty() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(drained_first);
        assert!(w.cluster.snapshot().nodes.is_empty(), "the node went with its finalizer");
        assert!(state(w.ledger.as_ref()).await.claims().is_empty());
    }

    /// Deleted while its launch is in flight: the launch's instance is found (by its batch
    /// and claim) and terminated; nothing leaks.
    #[actix_rt::test]
    async fn a_claim_deleted_mid_launch_leaves_no_instance() {
        let clock = Arc::new(ManualClock::new());
        let sim = Arc::new(SimCloud::new(SimConfig::default(), types(), clock.clone()));
        let ledger = Arc::new(InProcess::new());
        propose(
            ledger.as_ref(),
            clock.now_millis(),
            Command::SetPool { pool: "default".into(), limits: ResourceList::new() },
        )
        .await;
        let slow: Arc<dyn CloudProvider> =
            Arc::new(FaultyCloud { inner: sim.clone(), delay: Duration::from_millis(300), poison: None });
        let cluster = Arc::new(SimCluster::new());
        let w = start_over(
            m5_large_on_demand(ResourceList::new()),
            slow,
            ledger.clone(),
            cluster.clone(),
            clock,
            Config::default(),
            (sim.clone(), ledger.clone()),
        );
        w.pool.send(provision(pods(1, 1500))).await.expect("mailbox");
        // Wait for the launch to be under way (the claim is launching in the ledger).
        for _ in 0..100 {
            let s = state(ledger.as_ref()).await;
            if s.claims().values().any(|c| matches!(c.state, ClaimState::Launching { .. })) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let claim = cluster.snapshot().nodeclaims.keys().next().cloned().expect("created");
        cluster.remove_nodeclaim(&claim).expect("deleted by hand");
        w.pool.send(Reconcile).await.expect("mailbox");
        until_gone(&w).await;
        // The launch finished after the deletion; its instance was still terminated.
        tokio::time::sleep(Duration::from_millis(400)).await;
        assert!(sim.list().await.expect("list").is_empty(), "no instance left: {:?}", sim.instances());
        assert_eq!(sim.stats().launched, 1, "the launch did happen");
        for _ in 0..50 {
            if cluster.snapshot().nodeclaims.is_empty() {
                break;
            }
            w.pool.send(Reconcile).await.expect("mailbox");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(cluster.snapshot().nodeclaims.is_empty());
    }

    /// A cache that has not synced (a relist, NodeClaims before Nodes) shows nodes missing:
    /// nothing is terminated from it; nor from one snapshot missing a node for a moment.
    #[actix_rt::test]
    async fn a_view_that_is_not_synced_or_a_node_missing_once_terminates_nothing() {
        let clock = Arc::new(ManualClock::new());
        let cloud = SimCloud::new(SimConfig::default(), types(), clock.clone());
        let w = world(m5_large_on_demand(ResourceList::new()), cloud, clock.clone()).await;
        w.pool.send(provision(pods(2, 1500))).await.expect("mailbox");
        launched(&w, 2).await;
        register_all(&w).await;
        let snap = w.cluster.snapshot();
        let nodes: Vec<_> = snap.nodes.values().map(|n| n.as_ref().clone()).collect();
        // The view lost every node and says it is not synced.
        w.cluster.set_synced(false);
        for n in &nodes {
            let mut update = dovetail_cluster::NodeUpdate::of(n);
            update.finalizers.clear();
            let fresh = w.cluster.get_node(&n.name).await.expect("node");
            w.cluster.update_node(&n.name, update, fresh.resource_version).await.expect("finalizer");
            w.cluster.delete_node(&n.name).await.expect("gone from the view");
        }
        clock.advance(Duration::from_secs(3600));
        for _ in 0..20 {
            w.pool.send(Reconcile).await.expect("mailbox");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let s = state(w.ledger.as_ref()).await;
        assert!(s.claims().values().all(|c| matches!(c.state, ClaimState::Initialized { .. })), "{:?}", s.claims());
        assert_eq!(w.cloud.len(), 2);
        assert!(w.pool.send(GetPoolStats).await.expect("stats").unsynced > 0);
        // Synced again with the nodes back (the relist finished): nothing happened.
        for n in nodes {
            w.cluster.apply_node(n);
        }
        w.cluster.set_synced(true);
        // One snapshot without a node, for less than the grace: nothing either.
        let one = w.cluster.snapshot().nodes.values().next().map(|n| n.as_ref().clone()).expect("node");
        let held = w.cluster.get_node(&one.name).await.expect("node");
        let mut update = dovetail_cluster::NodeUpdate::of(&held);
        update.finalizers.clear();
        w.cluster.update_node(&one.name, update, held.resource_version).await.expect("finalizer");
        w.cluster.delete_node(&one.name).await.expect("gone from the view");
        for _ in 0..10 {
            w.pool.send(Reconcile).await.expect("mailbox");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        w.cluster.apply_node(one);
        clock.advance(Duration::from_secs(60));
        for _ in 0..10 {
            w.pool.send(Reconcile).await.expect("mailbox");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let s = state(w.ledger.as_ref()).await;
        assert_eq!(s.claims().len(), 2);
        assert!(s.claims().values().all(|c| matches!(c.state, ClaimState::Initialized { .. })));
        assert_eq!(w.cloud.len(), 2, "nothing terminated");
        assert!(w.errors.counts().keys().all(|k| !k.starts_with("terminate")), "{:?}", w.errors.counts());
    }

    /// A decision whose term is over by the time it is proposed is refused, and none of its
    /// effects reach the cluster; the next reconcile, in the new term, does the work.
    #[actix_rt::test]
    async fn a_stale_term_proposal_is_refused_and_its_effects_never_run() {
        let clock = Arc::new(ManualClock::new());
        let sim = Arc::new(SimCloud::new(SimConfig::default(), types(), clock.clone()));
        let inner = Arc::new(InProcess::new());
        propose(
            inner.as_ref(),
            clock.now_millis(),
            Command::SetPool { pool: "default".into(), limits: ResourceList::new() },
        )
        .await;
        let slow: Arc<dyn Ledger> = Arc::new(SlowLedger { inner: inner.clone(), delay: Duration::from_millis(300) });
        let cluster = Arc::new(SimCluster::new());
        // Reconciles only when asked.
        let config = Config { reconcile_every: Duration::from_secs(3600), ..Config::default() };
        let w = start_over(
            m5_large_on_demand(ResourceList::new()),
            sim.clone(),
            slow,
            cluster.clone(),
            clock,
            config,
            (sim.clone(), inner.clone()),
        );
        w.pool.send(provision(pods(1, 1500))).await.expect("mailbox");
        for _ in 0..200 {
            let s = state(inner.as_ref()).await;
            if s.claims().values().all(|c| matches!(c.state, ClaimState::Launched { .. })) && !s.claims().is_empty() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        for reg in registrations(&sim.list().await.expect("list")) {
            cluster.register(&reg).expect("register");
        }
        let writes = cluster.writes();
        // The reconcile reads term 1 and plans the registration; its entry takes 300 ms; a
        // new term begins meanwhile.
        w.pool.send(Reconcile).await.expect("mailbox");
        tokio::time::sleep(Duration::from_millis(100)).await;
        inner.elect(w.clock.now_millis());
        tokio::time::sleep(Duration::from_millis(500)).await;
        let s = state(inner.as_ref()).await;
        assert!(
            s.claims().values().all(|c| matches!(c.state, ClaimState::Launched { .. })),
            "refused: {:?}",
            s.claims()
        );
        let node = cluster.snapshot().nodes.values().next().cloned().expect("node");
        assert!(node.taints.iter().any(|t| t.key == UNREGISTERED_TAINT), "no effect ran");
        assert_eq!(cluster.writes().get("update_node"), writes.get("update_node"), "no node write at all");
        // The next reconcile decides in the new term.
        for _ in 0..50 {
            w.pool.send(Reconcile).await.expect("mailbox");
            let s = state(inner.as_ref()).await;
            if s.claims().values().all(|c| matches!(c.state, ClaimState::Initialized { .. })) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let s = state(inner.as_ref()).await;
        assert!(s.claims().values().all(|c| matches!(c.state, ClaimState::Initialized { .. })), "{:?}", s.claims());
    }

    /// Plans disruption (bounded) until a node's decision says it is validating.
    pub(crate) async fn until_validating(w: &World) {
        for _ in 0..1500 {
            w.pool.send(Disrupt).await.expect("mailbox");
            tokio::time::sleep(Duration::from_millis(10)).await;
            let decisions = w.pool.send(GetDecisions).await.expect("decisions");
            if decisions.values().any(|d| d.verdict.to_string().contains("validating")) {
                return;
            }
        }
        panic!("no node validating within 15 s: {:?}", w.pool.send(GetDecisions).await.expect("decisions"));
    }

    /// Plans disruption and reconciles (bounded) until `done` holds of the ledger. Each round
    /// plans off the actors' thread, so on a loaded machine (the suite runs the Kubernetes
    /// passes beside) a command can take seconds of wall time: 1,500 steps of 10 ms at least.
    pub(crate) async fn disrupt_until(w: &World, what: &str, done: impl Fn(&State) -> bool) -> State {
        for _ in 0..1500 {
            w.pool.send(Disrupt).await.expect("mailbox");
            w.pool.send(Reconcile).await.expect("mailbox");
            let s = state(w.ledger.as_ref()).await;
            if done(&s) {
                return s;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("{what}: not within 15 s: {:?}", state(w.ledger.as_ref()).await.disruptions());
    }

    /// A pool of on-demand m5.large with disruption on (planned when the test says) and the
    /// given budgets.
    async fn disrupting_world(budgets: Vec<Budget>) -> World {
        disrupting_world_with(m5_large_on_demand(ResourceList::new()), budgets).await
    }

    async fn disrupting_world_with(pool: NodePool, budgets: Vec<Budget>) -> World {
        disrupting_world_full(pool, budgets, None, false).await
    }

    /// The same with a rate budget and Karpenter's `SpotToSpotConsolidation` setting.
    pub(crate) async fn disrupting_world_full(
        pool: NodePool,
        budgets: Vec<Budget>,
        rate: Option<dovetail_core::disruption::budget::Rate>,
        spot_to_spot: bool,
    ) -> World {
        disrupting_world_over(pool, budgets, rate, spot_to_spot, |l| l).await
    }

    /// The same, with the pool's actors on `over(the ledger)` (a ledger whose leadership the
    /// test moves).
    pub(crate) async fn disrupting_world_over(
        pool: NodePool,
        budgets: Vec<Budget>,
        rate: Option<dovetail_core::disruption::budget::Rate>,
        spot_to_spot: bool,
        over: impl FnOnce(Arc<dyn Ledger>) -> Arc<dyn Ledger>,
    ) -> World {
        let clock = Arc::new(ManualClock::new());
        let cloud = Arc::new(SimCloud::new(SimConfig::default(), types(), clock.clone()));
        let ledger = Arc::new(InProcess::new());
        propose(
            ledger.as_ref(),
            clock.now_millis(),
            Command::SetPool { pool: pool.name.clone(), limits: pool.limits.clone() },
        )
        .await;
        propose(ledger.as_ref(), clock.now_millis(), Command::SetBudgets { pool: pool.name.clone(), budgets, rate })
            .await;
        let mut config = Config::default();
        config.disruption.enabled = true;
        config.disruption.spot_to_spot = spot_to_spot;
        config.disruption.every = Duration::from_secs(3600);
        let (c, l): (Arc<dyn CloudProvider>, Arc<dyn Ledger>) = (cloud.clone(), ledger.clone());
        start_over(pool, c, over(l), Arc::new(SimCluster::new()), clock, config, (cloud, ledger))
    }

    /// Empty nodes go once the command held for the validation delay, at most as many at once
    /// as the budget allows, and every node's decision says why.
    #[actix_rt::test]
    async fn empty_nodes_are_disrupted_after_validation_within_the_budget() {
        let w = disrupting_world(vec![Budget {
            nodes: BudgetNodes::Count(2),
            schedule: None,
            duration: None,
            reasons: vec![],
        }])
        .await;
        let pending = pods(4, 1500);
        w.cluster.apply_pods(pending.clone());
        w.pool.send(provision(pending)).await.expect("mailbox");
        launched(&w, 4).await;
        register_all(&w).await;
        assert_eq!(w.cluster.schedule(), 4);
        let gone: Vec<PodKey> = (0..3).map(|i| PodKey::new("default", &format!("web-{i}"))).collect();
        w.cluster.delete_pods(&gone);
        w.pool.send(Disrupt).await.expect("mailbox");
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(state(w.ledger.as_ref()).await.disruptions().is_empty(), "validating for 15 s");
        let decisions = w.pool.send(GetDecisions).await.expect("decisions");
        assert_eq!(decisions.len(), 4, "every node has a decision");
        assert!(decisions.values().any(|d| d.verdict.to_string().contains("validating")), "{decisions:?}");
        w.clock.advance(Duration::from_secs(15));
        let s = disrupt_until(&w, "a command", |s| !s.disruptions().is_empty()).await;
        let cmd = s.disruptions().values().next().cloned().expect("a command");
        assert_eq!(cmd.candidates.len(), 2, "the budget allows two at once");
        // No replacement: the candidates are terminated, drained and gone.
        disrupt_until(&w, "two gone", |s| s.claims().len() == 2).await;
        // The third empty node, once the first two no longer count as disrupting: its
        // validation begins before the clock moves on (a fixed pause was too short on a loaded
        // machine, and the validation then began after the clock had moved).
        w.clock.advance(Duration::from_secs(1));
        until_validating(&w).await;
        w.clock.advance(Duration::from_secs(15));
        disrupt_until(&w, "three gone", |s| s.claims().len() == 1).await;
        let snap = w.cluster.snapshot();
        let last = snap.nodes.keys().next().cloned().expect("a node");
        assert_eq!(snap.pods_on(&last).count(), 1, "the node with a pod stays");
        assert!(w.cloud.list().await.expect("list").len() == 1);
        let stats = w.pool.send(GetPoolStats).await.expect("stats");
        assert_eq!(stats.disrupted, 3);
        let events = w.cluster.events();
        assert!(events.iter().any(|e| e.reason == "DisruptionLaunching" && e.message.contains("Empty")), "{events:?}");
        assert!(events.iter().filter(|e| e.reason == "DisruptionTerminating").count() == 3, "{events:?}");
    }

    /// Underused nodes are consolidated: two m5.xlarge whose pods shrank are replaced by one
    /// m5.large, launched and initialized before either is drained.
    #[actix_rt::test]
    async fn underused_nodes_are_replaced_by_one_and_drained_only_after_it_is_initialized() {
        let (w, before) = replacing_world().await;
        assert_eq!(before.len(), 2, "two onto one");
        // Until the replacement is initialized, no candidate terminates.
        for _ in 0..20 {
            w.pool.send(Disrupt).await.expect("mailbox");
            w.pool.send(Reconcile).await.expect("mailbox");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let s = state(w.ledger.as_ref()).await;
        assert!(before.iter().all(|c| s.claim(c).is_some_and(|c| !c.state.is_terminating())), "{:?}", s.claims());
        let snap = w.cluster.snapshot();
        for c in &before {
            let node = snap.nodeclaims[c].status.node_name.clone().expect("node");
            assert!(snap.nodes[&node].taints.iter().any(|t| t.key == "karpenter.sh/disrupted"), "tainted first");
        }
        // The replacement's node registers; then the candidates go and their pods move.
        for _ in 0..50 {
            w.pool.send(Reconcile).await.expect("mailbox");
            if state(w.ledger.as_ref()).await.claims().values().any(|c| matches!(c.state, ClaimState::Launched { .. }))
            {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        for reg in registrations(&w.cloud.list().await.expect("list")) {
            if !w.cluster.snapshot().nodes.values().any(|n| n.provider_id == Some(reg.provider_id.clone())) {
                w.cluster.register(&reg).expect("register");
            }
        }
        let s = disrupt_until(&w, "the candidates gone", |s| s.claims().len() == 1).await;
        let survivor = s.claims().values().next().cloned().expect("the replacement");
        assert!(!before.contains(&survivor.id));
        assert_eq!(
            w.cluster.snapshot().pods.len(),
            0,
            "evicted once the replacement was up (no controller recreates them here)"
        );
        assert_eq!(w.cloud.list().await.expect("list").len(), 1);
    }

    /// Two m5.xlarge whose pods shrank, in a pool that may also launch m5.large: a command
    /// with one replacement is granted. Returns the world and the command's candidates.
    async fn replacing_world() -> (World, Vec<String>) {
        let mut reqs = Requirements::new();
        reqs.add(labels::INSTANCE_TYPE, Requirement::is_in(["m5.large", "m5.xlarge"]));
        reqs.add(labels::CAPACITY_TYPE, Requirement::is_in(["on-demand"]));
        let all = vec![Budget { nodes: BudgetNodes::Percent(100), schedule: None, duration: None, reasons: vec![] }];
        let w = disrupting_world_with(NodePool::new("default", reqs), all).await;
        let pending = pods(2, 3000);
        w.cluster.apply_pods(pending.clone());
        w.pool.send(provision(pending)).await.expect("mailbox");
        launched(&w, 2).await;
        register_all(&w).await;
        assert_eq!(w.cluster.schedule(), 2);
        let snap = w.cluster.snapshot();
        for p in snap.pods.values() {
            let node = p.node_name.clone().expect("bound");
            w.cluster.delete_pods(std::slice::from_ref(&p.key));
            w.cluster.apply_pod(Pod {
                key: p.key.clone(),
                requests: ResourceList::cpu_mem(300, 1 << 28),
                node_name: Some(node),
                ..Pod::default()
            });
        }
        w.pool.send(Disrupt).await.expect("mailbox");
        tokio::time::sleep(Duration::from_millis(50)).await;
        w.clock.advance(Duration::from_secs(15));
        let s = disrupt_until(&w, "a command", |s| !s.disruptions().is_empty()).await;
        let cmd = s.disruptions().values().next().cloned().expect("a command");
        assert_eq!(cmd.replacements.len(), 1);
        (w, cmd.candidates)
    }

    /// A command whose replacement fails (its NodeClaim deleted before it registered) is
    /// rolled back: the command ends and its candidates lose the taint and stay.
    #[actix_rt::test]
    async fn a_command_whose_replacement_fails_is_rolled_back_and_its_nodes_untainted() {
        let (w, candidates) = replacing_world().await;
        let s = state(w.ledger.as_ref()).await;
        let replacement =
            s.disruptions().values().next().and_then(|c| c.replacements.first().cloned()).expect("a replacement");
        // Its NodeClaim exists once the grant's effects ran.
        for _ in 0..100 {
            if w.cluster.snapshot().nodeclaims.contains_key(&replacement) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        w.cluster.remove_nodeclaim(&replacement).expect("deleted by hand");
        disrupt_until(&w, "rolled back", |s| s.disruptions().is_empty()).await;
        for _ in 0..50 {
            w.pool.send(Disrupt).await.expect("mailbox");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let s = state(w.ledger.as_ref()).await;
        let snap = w.cluster.snapshot();
        for c in &candidates {
            assert!(s.claim(c).is_some_and(|c| matches!(c.state, ClaimState::Initialized { .. })), "{c} stays");
            let node = snap.nodeclaims[c].status.node_name.clone().expect("node");
            assert!(!snap.nodes[&node].taints.iter().any(|t| t.key == "karpenter.sh/disrupted"), "{node} untainted");
        }
        let stats = w.pool.send(GetPoolStats).await.expect("stats");
        assert!(stats.rolled_back >= 1, "{stats:?}");
        assert!(w.cluster.events().iter().any(|e| e.reason == "DisruptionFailed"), "{:?}", w.cluster.events());
    }

    /// Expiration is forceful: a node past its expireAfter goes even with a budget of zero.
    #[actix_rt::test]
    async fn an_expired_node_goes_whatever_the_budget() {
        let mut pool = m5_large_on_demand(ResourceList::new());
        pool.expire_after = Some(Duration::from_secs(3600));
        let none = vec![Budget { nodes: BudgetNodes::Count(0), schedule: None, duration: None, reasons: vec![] }];
        let w = disrupting_world_with(pool, none).await;
        let pending = pods(1, 1500);
        w.cluster.apply_pods(pending.clone());
        w.pool.send(provision(pending)).await.expect("mailbox");
        launched(&w, 1).await;
        register_all(&w).await;
        w.clock.advance(Duration::from_secs(3599));
        for _ in 0..10 {
            w.pool.send(Disrupt).await.expect("mailbox");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(state(w.ledger.as_ref()).await.claims().len(), 1, "not expired yet");
        w.clock.advance(Duration::from_secs(1));
        disrupt_until(&w, "expired and gone", |s| s.claims().is_empty()).await;
        let stats = w.pool.send(GetPoolStats).await.expect("stats");
        assert_eq!(stats.expired_nodes, 1);
        assert!(w.cluster.events().iter().any(|e| e.reason == "Expired"), "{:?}", w.cluster.events());
    }

    /// NodeClass drift is the cloud provider's to say: once the pool's node class changes
    /// (its hash), the cloud reports the node's instance drifted, and the node is replaced
    /// (one new node launched for its pod) with the cloud's reason in its decision.
    #[actix_rt::test]
    async fn a_node_the_cloud_reports_drifted_from_its_node_class_is_replaced() {
        let all = vec![Budget { nodes: BudgetNodes::Percent(100), schedule: None, duration: None, reasons: vec![] }];
        let w = disrupting_world(all).await;
        let pending = pods(1, 1500);
        w.cluster.apply_pods(pending.clone());
        w.pool.send(provision(pending)).await.expect("mailbox");
        launched(&w, 1).await;
        register_all(&w).await;
        assert_eq!(w.cluster.schedule(), 1);
        for _ in 0..10 {
            w.pool.send(Disrupt).await.expect("mailbox");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(state(w.ledger.as_ref()).await.disruptions().is_empty(), "in line with its node class");
        let changed = NodeClass { hash: "h2".into(), ..node_class() };
        let pool = m5_large_on_demand(ResourceList::new());
        w.pool.send(Reconfigure { pool, types: types(), node_class: changed }).await.expect("mailbox");
        let s = disrupt_until(&w, "a drift command", |s| !s.disruptions().is_empty()).await;
        let cmd = s.disruptions().values().next().cloned().expect("a command");
        assert_eq!(cmd.reason, DisruptionReason::Drifted);
        assert_eq!(cmd.replacements.len(), 1, "its pod gets a new node first");
        // Its NodeClaim says why, as Karpenter's `Drifted` condition.
        let candidate = cmd.candidates[0].clone();
        let mut said = None;
        for _ in 0..100 {
            w.pool.send(Disrupt).await.expect("mailbox");
            let snap = w.cluster.snapshot();
            said = snap.nodeclaims.get(&candidate).and_then(|nc| nc.status.condition("Drifted").cloned());
            if said.as_ref().is_some_and(|c| c.status) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let said = said.expect("a Drifted condition");
        assert_eq!((said.status, said.reason.as_str()), (true, "NodeClassDrift"), "{said:?}");
        assert_eq!(said.message, "the node class drifted (NodeClassDrift)");
    }
}

#[path = "plane/disruption.rs"]
mod disruption;

mod router {
    use crate::common::{executor, node_class, propose, state, types};
    use std::sync::Arc;
    use std::time::Duration;

    use actix::prelude::*;
    use dovetail_actors::config::Config;
    use dovetail_actors::errors::Errors;
    use dovetail_actors::pool::{NodePoolActor, PoolWiring};
    use dovetail_actors::router::{GetRouterStats, PodsPending, RoutedPool, Router, RouterStats};
    use dovetail_actors::zone::{ZoneActor, ZoneConfig};
    use dovetail_cloud::CloudProvider;
    use dovetail_cloud::sim::{SimCloud, SimConfig};
    use dovetail_cluster::sim::SimCluster;
    use dovetail_core::clock::{Clock, SystemClock};
    use dovetail_core::labels;
    use dovetail_core::ledger::{Command, State};
    use dovetail_core::nodepool::NodePool;
    use dovetail_core::plane::BatchWindow;
    use dovetail_core::pod::{Pod, PodKey};
    use dovetail_core::requirements::{Requirement, Requirements};
    use dovetail_core::resources::{ResourceList, ResourceName};
    use dovetail_core::scheduling::PoolInput;
    use dovetail_raft::InProcess;

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
        let cloud: Arc<dyn CloudProvider> = cloud.clone();
        let (ex, errors) = executor(cl.clone(), le.clone());
        let config = Arc::new(Config { window: window.clone(), ..Config::default() });
        let (pools, zones): (Vec<NodePool>, Vec<String>) =
            (pools.to_vec(), zones.iter().map(|z| z.to_string()).collect());
        let nominations = dovetail_actors::nominate::Nominations::default();
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
                        executor: ex.clone(),
                        errors: errors.clone(),
                        config: config.clone(),
                        cloud: cloud.clone(),
                        nominations: nominations.clone(),
                    };
                    let actor = NodePoolActor::new(p.clone(), types(), node_class(), wiring).start();
                    let mut input_pool = p.clone();
                    input_pool.requirements.add(labels::ZONE, Requirement::is_in(zones.iter().map(String::as_str)));
                    RoutedPool { input: PoolInput { pool: input_pool, instance_types: types() }, actor }
                })
                .collect();
            Router::new(window, cl.clone(), ck.clone(), routed)
                .configured(&config, Arc::new(Errors::new()))
                .nominating(nominations)
        })
    }

    /// `n` pending pods of 1.5 vCPU (one per m5.large), in the cluster.
    fn web_pods(cluster: &SimCluster, n: usize) -> Vec<Pod> {
        named_pods(cluster, "web", n)
    }

    /// `n` pending pods `<prefix>-<i>` of 1.5 vCPU, in the cluster.
    fn named_pods(cluster: &SimCluster, prefix: &str, n: usize) -> Vec<Pod> {
        let pods: Vec<Pod> = (0..n)
            .map(|i| Pod {
                key: PodKey::new("default", &format!("{prefix}-{i}")),
                requests: ResourceList::cpu_mem(1500, 1 << 30),
                unschedulable: true,
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
            propose(ledger.as_ref(), clock.now_millis(), Command::SetPool { pool: p.name.clone(), limits }).await;
        }
        let window = BatchWindow { idle: 50, max: 500, adaptive: None };
        let router = start_router(&cluster, &ledger, &cloud, &clock, &pools, &["us-east-1a", "us-east-1b"], window);
        let pods = web_pods(&cluster, 3);
        router.send(PodsPending { pods, backlog: false }).await.expect("mailbox");
        let mut s = State::default();
        for _ in 0..400 {
            s = state(ledger.as_ref()).await;
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
        propose(
            ledger.as_ref(),
            clock.now_millis(),
            Command::SetPool { pool: "default".into(), limits: ResourceList::new() },
        )
        .await;
        let router =
            start_router(&cluster, &ledger, &cloud, &clock, &[pool("default", 0, None)], &["us-east-1a"], window);
        cluster.apply_node(dovetail_core::node::Node { name: "n1".into(), ..Default::default() });
        let pods = web_pods(&cluster, 3);
        router.send(PodsPending { pods: pods.clone(), backlog: false }).await.expect("mailbox");
        // Before the window closes: two are bound, one is deleted.
        cluster.bind(&pods[0].key, "n1").expect("bind");
        cluster.bind(&pods[1].key, "n1").expect("bind");
        cluster.delete_pods(&[pods[2].key.clone()]);
        // The batch counts when it closes, its pods when its route returns from its thread:
        // under load that is later.
        let mut stats = router.send(GetRouterStats).await.expect("stats");
        for _ in 0..500 {
            if stats.batches == 1 && stats.stale + stats.routed + stats.unschedulable >= 3 {
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
    /// Waits (at most 10 s) until the router has decided `decided` pods in all (left to
    /// capacity, routed, or unschedulable) and the cluster has `claims` NodeClaims.
    async fn settled(router: &Addr<Router>, cluster: &SimCluster, decided: u64, claims: usize) -> RouterStats {
        let mut stats = router.send(GetRouterStats).await.expect("stats");
        for _ in 0..400 {
            let made = dovetail_cluster::ClusterView::snapshot(cluster).nodeclaims.len();
            if stats.on_existing + stats.routed + stats.unschedulable >= decided && made >= claims {
                break;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
            stats = router.send(GetRouterStats).await.expect("stats");
        }
        stats
    }

    /// A Router over one pool, m5.large only, in one zone.
    async fn one_pool() -> (Arc<SimCluster>, Addr<Router>) {
        let clock: Arc<dyn Clock> = Arc::new(SystemClock::new());
        let cluster = Arc::new(SimCluster::new());
        let window = BatchWindow { idle: 50, max: 500, adaptive: None };
        let cloud = Arc::new(SimCloud::new(SimConfig::default(), types(), clock.clone()));
        let ledger = Arc::new(InProcess::new());
        let limits = ResourceList::new();
        propose(ledger.as_ref(), clock.now_millis(), Command::SetPool { pool: "default".into(), limits }).await;
        let router =
            start_router(&cluster, &ledger, &cloud, &clock, &[pool("default", 0, None)], &["us-east-1a"], window);
        (cluster, router)
    }

    /// Pods planned onto an in-flight NodeClaim (sized for them) hold it while they are
    /// pending: a later batch of other pods does not see it as free and gets its own claims
    /// (counted twice, those pods would wait for the feed's resend for theirs).
    #[actix_rt::test]
    async fn pods_pending_on_an_in_flight_claim_hold_it_against_a_later_batch() {
        let (cluster, router) = one_pool().await;
        let first = named_pods(&cluster, "first", 2);
        router.send(PodsPending { pods: first.clone(), backlog: false }).await.expect("mailbox");
        let stats = settled(&router, &cluster, 2, 2).await;
        assert_eq!((stats.routed, stats.on_existing), (2, 0), "{stats:?}");
        // The first pods are still pending (nothing binds them): their claims are theirs.
        let second = named_pods(&cluster, "second", 2);
        router.send(PodsPending { pods: second, backlog: false }).await.expect("mailbox");
        let stats = settled(&router, &cluster, 4, 4).await;
        assert_eq!((stats.batches, stats.routed, stats.on_existing), (2, 4, 0), "{stats:?}");
        let claims = dovetail_cluster::ClusterView::snapshot(cluster.as_ref()).nodeclaims.len();
        assert_eq!(claims, 4, "one m5.large per pod");
        // The first pods sent again (a resend): they do not hold against themselves, and are
        // left on the claims there are, not provisioned for again.
        router.send(PodsPending { pods: first, backlog: false }).await.expect("mailbox");
        let stats = settled(&router, &cluster, 6, 4).await;
        assert_eq!((stats.batches, stats.routed, stats.on_existing), (3, 4, 2), "{stats:?}");
        assert_eq!(dovetail_cluster::ClusterView::snapshot(cluster.as_ref()).nodeclaims.len(), 4);
    }

    /// The same for a running node: a pod left to a node's last room holds it.
    #[actix_rt::test]
    async fn a_pod_left_to_a_nodes_room_holds_it_against_a_later_batch() {
        let (cluster, router) = one_pool().await;
        let room = ResourceList::from_pairs([
            (ResourceName::Cpu, 2_000),
            (ResourceName::Memory, 8 << 30),
            (ResourceName::Pods, 110),
        ]);
        cluster.apply_node(dovetail_core::node::Node {
            name: "n1".into(),
            capacity: room.clone(),
            allocatable: room,
            initialized: true,
            ready: true,
            ..Default::default()
        });
        let first = named_pods(&cluster, "first", 1);
        router.send(PodsPending { pods: first, backlog: false }).await.expect("mailbox");
        let stats = settled(&router, &cluster, 1, 0).await;
        assert_eq!((stats.routed, stats.on_existing), (0, 1), "{stats:?}");
        let second = named_pods(&cluster, "second", 1);
        router.send(PodsPending { pods: second, backlog: false }).await.expect("mailbox");
        let stats = settled(&router, &cluster, 2, 1).await;
        assert_eq!((stats.routed, stats.on_existing), (1, 1), "the node's room is the first pod's: {stats:?}");
    }

    /// A node being disrupted (tainted, its replacement up beside it, sized for its pods):
    /// the replacement's room is its pods'. A pending pod that would fit there gets capacity
    /// of its own instead of being left to room the moving pods then take (in the soak's
    /// drift rounds such pods waited 16 minutes, left to one replacement after another).
    #[actix_rt::test]
    async fn a_pending_pod_is_not_left_to_the_room_of_pods_on_their_way_off_a_disrupted_node() {
        let (cluster, router) = one_pool().await;
        let room = ResourceList::from_pairs([
            (ResourceName::Cpu, 2_000),
            (ResourceName::Memory, 8 << 30),
            (ResourceName::Pods, 110),
        ]);
        let node = |name: &str, taints: Vec<dovetail_core::taints::Taint>| dovetail_core::node::Node {
            name: name.into(),
            capacity: room.clone(),
            allocatable: room.clone(),
            initialized: true,
            ready: true,
            taints,
            ..Default::default()
        };
        cluster.apply_node(node("old", vec![dovetail_core::plane::disrupted_taint()]));
        cluster.apply_node(node("replacement", Vec::new()));
        let on_old = Pod {
            key: PodKey::new("default", "moving-0"),
            requests: ResourceList::cpu_mem(1500, 1 << 30),
            node_name: Some("old".into()),
            ..Pod::default()
        };
        cluster.apply_pods(vec![on_old]);
        let pending = named_pods(&cluster, "pending", 1);
        router.send(PodsPending { pods: pending, backlog: false }).await.expect("mailbox");
        let stats = settled(&router, &cluster, 1, 1).await;
        assert_eq!(
            (stats.routed, stats.on_existing),
            (1, 0),
            "the replacement's room is the moving pod's; the pending pod gets its own: {stats:?}"
        );
        // Once the node is gone for good and its pod with it, the room is free again.
        cluster.delete_pods(&[PodKey::new("default", "moving-0")]);
        let again = named_pods(&cluster, "later", 1);
        router.send(PodsPending { pods: again, backlog: false }).await.expect("mailbox");
        let stats = settled(&router, &cluster, 2, 1).await;
        assert_eq!((stats.routed, stats.on_existing), (1, 1), "{stats:?}");
    }
}

/// The whole plane (Router, two NodePools, three zones) on the sim cloud and sim cluster,
/// with the test playing the kubelets (registration) and kube-scheduler (binding).
mod integration {
    use crate::common::{FaultyCloud, node_class, propose, state, types};
    use std::collections::BTreeMap;
    use std::sync::Arc;
    use std::time::Duration;

    use actix::prelude::*;
    use dovetail_actors::config::Config;
    use dovetail_actors::feed::FeedConfig;
    use dovetail_actors::kubelet::registrations;
    use dovetail_actors::plane::{Plane, PlaneConfig, Seams};
    use dovetail_actors::pool::{GetPoolStats, Reconcile};
    use dovetail_actors::zone::{GetStats, ZoneActor};
    use dovetail_cloud::limits::ApiLimits;
    use dovetail_cloud::sim::{SimCloud, SimConfig};
    use dovetail_cloud::{CloudProvider, OfferingKey};
    use dovetail_cluster::ClusterView;
    use dovetail_cluster::sim::{Deployment, Registrar, SimCluster, Workloads};
    use dovetail_core::catalog::CapacityType;
    use dovetail_core::clock::{Clock, SystemClock};
    use dovetail_core::labels::{self, LabelSelector};
    use dovetail_core::ledger::{ClaimState, Command};
    use dovetail_core::node::Node;
    use dovetail_core::nodepool::NodePool;
    use dovetail_core::plane::BatchWindow;
    use dovetail_core::pod::{Pod, PodAffinity, PodAffinityTerm, TopologySpreadConstraint, WhenUnsatisfiable};
    use dovetail_core::requirements::{Requirement, Requirements};
    use dovetail_core::resources::{ResourceList, ResourceName};
    use dovetail_core::scheduling::{self, ExistingPlacement, PoolInput, Results, Semantics};
    use dovetail_raft::InProcess;

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

    fn config(window_ms: u64) -> Config {
        Config {
            window: BatchWindow { idle: window_ms, max: 10 * window_ms, adaptive: None },
            feed: FeedConfig {
                tick: Duration::from_millis(50),
                resend: Duration::from_secs(2),
                settle: Duration::from_millis(500),
                coalesce: Duration::from_millis(20),
            },
            ..Config::default()
        }
    }

    /// The plane over the three zones with `pools` (each with every type and the test class)
    /// on the sim seams.
    fn start_plane(
        pools: &[NodePool],
        config: Config,
        cloud: Arc<dyn CloudProvider>,
        cluster: &Arc<SimCluster>,
        ledger: &Arc<InProcess>,
        clock: &Arc<dyn Clock>,
    ) -> Plane {
        Plane::start(
            PlaneConfig {
                zones: ZONES.iter().map(|z| z.to_string()).collect(),
                pools: pools.iter().map(|p| (p.clone(), types(), node_class())).collect(),
                limits: ApiLimits::default(),
                config,
            },
            Seams {
                cloud,
                view: cluster.clone(),
                cluster: cluster.clone(),
                ledger: ledger.clone(),
                clock: clock.clone(),
                metrics: Default::default(),
            },
        )
        .expect("valid settings")
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
            propose(
                ledger.as_ref(),
                clock.now_millis(),
                Command::SetPool { pool: p.name.clone(), limits: p.limits.clone() },
            )
            .await;
        }
        // Under restarts, launch calls take a while so some are cut off mid-call.
        let seam_cloud: Arc<dyn CloudProvider> = match restarts_wanted {
            1.. => Arc::new(FaultyCloud { inner: cloud.clone(), delay: Duration::from_millis(120), poison: None }),
            0 => cloud.clone(),
        };
        let plane = start_plane(&pools, config(100), seam_cloud, &cluster, &ledger, &clock);
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
                pick: Default::default(),
            });
        }
        let mut registrar = Registrar::new(0);
        let (mut done, mut restarts) = (false, 0);
        for _ in 0..1200usize {
            let now = clock.now_millis();
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
            let s = state(ledger.as_ref()).await;
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
        let s = state(ledger.as_ref()).await;
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
            "claims {}, ice {ice}, restarts {restarts}, requeued {requeued}, pools {weighted:?} {default:?}, errors {:?}",
            s.claims().len(),
            plane.errors.counts()
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

    /// `kubectl delete nodeclaim` of a claim whose node never registered: the pods it was made
    /// for get a replacement claim at once, not at the feed's periodic resend (60 s here), as
    /// Karpenter's provisioner is triggered by a NodeClaim's deletion. Only one claim replaces it.
    #[actix_rt::test]
    async fn pods_of_a_claim_deleted_before_it_registered_get_a_replacement_at_once() {
        let clock: Arc<dyn Clock> = Arc::new(SystemClock::new());
        let cloud = Arc::new(SimCloud::new(SimConfig::default(), types(), clock.clone()));
        let cluster = Arc::new(SimCluster::new());
        let ledger = Arc::new(InProcess::new());
        let pools = [pool("default", 0, &C5, None)];
        propose(
            ledger.as_ref(),
            clock.now_millis(),
            Command::SetPool { pool: "default".into(), limits: ResourceList::new() },
        )
        .await;
        let mut cfg = config(100);
        cfg.feed.resend = Duration::from_secs(60);
        let plane = start_plane(&pools, cfg, cloud.clone(), &cluster, &ledger, &clock);
        let mut workloads = Workloads::new();
        workloads.apply_deployment(Deployment {
            namespace: "default".into(),
            name: "app".into(),
            replicas: 2,
            template: Pod { requests: ResourceList::cpu_mem(500, 1 << 30), ..Pod::default() },
            pick: Default::default(),
        });
        // No kubelet: the claim's node never registers.
        let mut first = None;
        for _ in 0..400usize {
            workloads.step(&cluster, clock.now_millis());
            cluster.schedule();
            if let Some(c) = cluster.snapshot().nodeclaims.keys().next() {
                first = Some(c.clone());
                break;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        let first = first.expect("a claim for the pods within 10 s");
        cluster.remove_nodeclaim(&first).expect("deleted by hand");
        let mut replacement = None;
        for _ in 0..400usize {
            workloads.step(&cluster, clock.now_millis());
            cluster.schedule();
            for p in plane.pools.values() {
                p.send(Reconcile).await.expect("pool");
            }
            let snap = cluster.snapshot();
            if let Some(c) = snap.nodeclaims.values().find(|c| c.name != first && !c.deleting) {
                replacement = Some(c.name.clone());
                break;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        let replacement =
            replacement.expect("a replacement NodeClaim within 10 s of the deletion (the resend is 60 s)");
        // One claim replaces it, for both pods: nothing else is made meanwhile.
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let snap = cluster.snapshot();
        let live: Vec<&String> = snap.nodeclaims.values().filter(|c| !c.deleting).map(|c| &c.name).collect();
        assert_eq!(live, vec![&replacement], "one replacement claim");
        assert_eq!(snap.pending().count(), 2, "both pods wait for it");
    }

    /// Pods pending before the plane starts (a new leader taking over, a restart) are one
    /// batch known at once: their claims are decided without waiting out the batch window
    /// (5 s idle here). Pods arriving later wait for it as before.
    #[actix_rt::test]
    async fn pods_pending_when_the_plane_starts_are_decided_without_the_batch_window() {
        let clock: Arc<dyn Clock> = Arc::new(SystemClock::new());
        let cloud = Arc::new(SimCloud::new(SimConfig::default(), types(), clock.clone()));
        let cluster = Arc::new(SimCluster::new());
        let ledger = Arc::new(InProcess::new());
        let pools = [pool("default", 0, &C5, None)];
        propose(
            ledger.as_ref(),
            clock.now_millis(),
            Command::SetPool { pool: "default".into(), limits: ResourceList::new() },
        )
        .await;
        let mut workloads = Workloads::new();
        workloads.apply_deployment(Deployment {
            namespace: "default".into(),
            name: "left".into(),
            replicas: 3,
            template: Pod { requests: ResourceList::cpu_mem(500, 1 << 30), ..Pod::default() },
            pick: Default::default(),
        });
        workloads.step(&cluster, clock.now_millis());
        cluster.schedule();
        assert_eq!(cluster.snapshot().pending().count(), 3, "pending before the plane starts");
        let started = clock.now_millis();
        let _plane = start_plane(&pools, config(5_000), cloud.clone(), &cluster, &ledger, &clock);
        let mut decided = None;
        for _ in 0..200usize {
            if !cluster.snapshot().nodeclaims.is_empty() {
                decided = Some(Duration::from_millis(clock.now_millis().saturating_sub(started)));
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let decided = decided.expect("a NodeClaim for the pods pending at the start within 2 s (the window is 5 s)");
        eprintln!("decided {decided:?} after the start");
        // A pod arriving now waits for the window: no claim for it within a second.
        let claims = cluster.snapshot().nodeclaims.len();
        workloads.apply_deployment(Deployment {
            namespace: "default".into(),
            name: "new".into(),
            replicas: 1,
            template: Pod { requests: ResourceList::cpu_mem(7_000, 1 << 30), ..Pod::default() },
            pick: Default::default(),
        });
        workloads.step(&cluster, clock.now_millis());
        cluster.schedule();
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(cluster.snapshot().nodeclaims.len(), claims, "a later pod waits for the batch window");
        // ...and gets its claim once the window is over.
        let mut later = false;
        for _ in 0..600usize {
            if cluster.snapshot().nodeclaims.len() > claims {
                later = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(later, "a claim for the later pod after the 5 s window");
    }

    fn selector(app: &str) -> Option<LabelSelector> {
        Some(LabelSelector::new(BTreeMap::from([("app".to_string(), app.to_string())]), Vec::new()))
    }

    /// The plane on a cluster that already runs pods: new web replicas spread by zone (max
    /// skew 1) over the running ones, and cache pods anti-affine by zone to a running db pod.
    /// The claims go where the running pods leave room, and the end state, read back as a
    /// plan with every pod on the node it ended on, passes `plan --validate`'s checks.
    #[actix_rt::test]
    async fn the_planes_claims_respect_topology_over_running_pods() {
        let clock: Arc<dyn Clock> = Arc::new(SystemClock::new());
        let cloud = Arc::new(SimCloud::new(SimConfig::default(), types(), clock.clone()));
        let cluster = Arc::new(SimCluster::new());
        let ledger = Arc::new(InProcess::new());
        let pools = [pool("default", 0, &["m5.large", "m5.xlarge"], None)];
        propose(
            ledger.as_ref(),
            clock.now_millis(),
            Command::SetPool { pool: "default".into(), limits: ResourceList::new() },
        )
        .await;
        // A full node in zone a running three web pods and the db.
        let name = "existing-a".to_string();
        cluster.apply_node(Node {
            name: name.clone(),
            labels: dovetail_core::node::NodeLabels::from([
                (labels::ZONE.to_string(), ZONES[0].to_string()),
                (labels::HOSTNAME.to_string(), name.clone()),
                (labels::INSTANCE_TYPE.to_string(), "m5.xlarge".to_string()),
            ]),
            allocatable: ResourceList::from_pairs([
                (ResourceName::Cpu, 3920),
                (ResourceName::Memory, 14 << 30),
                (ResourceName::Pods, 58),
            ]),
            initialized: true,
            ready: true,
            ..Node::default()
        });
        let running = |n: &str, app: &str, cpu: i64| {
            let mut p = Pod::new("default", n, ResourceList::cpu_mem(cpu, 256 << 20));
            p.labels.insert("app".into(), app.into());
            p.node_name = Some(name.clone());
            p
        };
        let mut bound = vec![running("db-0", "db", 500), running("filler", "filler", 1900)];
        bound.extend((0..3).map(|i| running(&format!("web-old-{i}"), "web", 500)));
        cluster.apply_pods(bound);
        let spread = TopologySpreadConstraint {
            max_skew: 1,
            topology_key: labels::ZONE.into(),
            when_unsatisfiable: WhenUnsatisfiable::DoNotSchedule,
            selector: selector("web"),
            min_domains: None,
            node_affinity_policy: None,
            node_taints_policy: None,
            match_label_keys: Vec::new(),
        };
        let mut web = Pod::new("default", "web", ResourceList::cpu_mem(500, 256 << 20));
        web.labels.insert("app".into(), "web".into());
        web.topology_spread = vec![spread].into();
        let mut cache = Pod::new("default", "cache", ResourceList::cpu_mem(500, 256 << 20));
        cache.labels.insert("app".into(), "cache".into());
        cache.pod_anti_affinity = PodAffinity {
            required: vec![PodAffinityTerm {
                selector: selector("db"),
                namespaces: Vec::new(),
                namespace_selector: None,
                topology_key: labels::ZONE.into(),
            }],
            preferred: Vec::new(),
        }
        .into();
        let mut workloads = Workloads::new();
        workloads.apply_deployment(Deployment {
            namespace: "default".into(),
            name: "web".into(),
            replicas: 6,
            template: web,
            pick: Default::default(),
        });
        workloads.apply_deployment(Deployment {
            namespace: "default".into(),
            name: "cache".into(),
            replicas: 2,
            template: cache,
            pick: Default::default(),
        });
        let plane = start_plane(&pools, config(100), cloud.clone(), &cluster, &ledger, &clock);
        let mut registrar = Registrar::new(0);
        let mut done = false;
        for _ in 0..600usize {
            let now = clock.now_millis();
            workloads.step(&cluster, now);
            registrar.step(&cluster, &registrations(&cloud.list().await.expect("list")), now);
            for p in plane.pools.values() {
                p.send(Reconcile).await.expect("pool");
            }
            cluster.schedule();
            let s = state(ledger.as_ref()).await;
            if cluster.snapshot().pending().count() == 0
                && !s.claims().is_empty()
                && s.claims().values().all(|c| matches!(c.state, ClaimState::Initialized { .. }))
            {
                done = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        let snap = cluster.snapshot();
        assert!(done, "pending: {:?}", snap.pending().map(|p| p.key.to_string()).collect::<Vec<_>>());
        // No new node in zone a: both kinds of pods had to go elsewhere.
        for c in state(ledger.as_ref()).await.claims().values() {
            assert_ne!(c.zone, ZONES[0], "claim {} in the zone the running pods fill", c.id);
        }
        for n in snap.nodes.values().filter(|n| n.name != name) {
            assert!(snap.pods_on(&n.name).next().is_some(), "node {} holds no pod", n.name);
        }
        // The end state as a plan: the pods that ran before stay bound; every new pod is
        // placed on the node it ended on, zone by zone in turn (an order kube-scheduler could
        // have bound them in: the validator checks each placement against those before it).
        let nodes: Vec<Node> = snap.nodes.values().map(|n| Node { initialized: true, ..n.as_ref().clone() }).collect();
        let index: BTreeMap<&str, usize> = nodes.iter().enumerate().map(|(i, n)| (n.name.as_str(), i)).collect();
        let (before, new): (Vec<&Arc<Pod>>, Vec<&Arc<Pod>>) =
            snap.pods.values().partition(|p| p.node_name.as_deref() == Some(name.as_str()));
        let pods: Vec<Pod> = new.iter().map(|p| Pod { node_name: None, ..Pod::clone(p) }).collect();
        let node_of = |p: &Pod| p.node_name.as_deref().and_then(|n| index.get(n)).copied().expect("bound to a node");
        let zone_of = |n: usize| nodes[n].labels.get(labels::ZONE).cloned();
        // The spread web pods zone by zone in turn, then the rest.
        let is_web = |p: &Pod| p.labels.get("app").map(String::as_str) == Some("web");
        let mut by_zone: BTreeMap<(bool, Option<String>), Vec<usize>> = BTreeMap::new();
        for (i, p) in new.iter().enumerate() {
            let key = if is_web(p) { (false, zone_of(node_of(p))) } else { (true, None) };
            by_zone.entry(key).or_default().push(i);
        }
        let mut order = Vec::new();
        let (rest, web): (Vec<_>, Vec<_>) = by_zone.into_iter().partition(|((other, _), _)| *other);
        let mut queues: Vec<std::collections::VecDeque<usize>> = web.into_iter().map(|(_, v)| v.into()).collect();
        queues.extend(rest.into_iter().map(|(_, v)| std::collections::VecDeque::from(v)));
        while queues.iter().any(|q| !q.is_empty()) {
            for q in &mut queues {
                if let Some(i) = q.pop_front() {
                    let n = node_of(new[i]);
                    order.push(scheduling::Placement {
                        pod: i,
                        target: scheduling::Target::Existing(n),
                        zone: zone_of(n),
                    });
                }
            }
        }
        let mut by_node: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
        for (i, p) in new.iter().enumerate() {
            by_node.entry(node_of(p)).or_default().push(i);
        }
        let results = Results {
            existing: by_node.into_iter().map(|(node, pods)| ExistingPlacement { node, pods }).collect(),
            order,
            ..Results::default()
        };
        let input = scheduling::Snapshot {
            nodepools: pools.iter().map(|p| PoolInput { pool: p.clone(), instance_types: types() }).collect(),
            nodes,
            bound_pods: before.iter().map(|p| Arc::clone(p)).collect(),
            ..scheduling::Snapshot::default()
        };
        let violations = scheduling::validate(&input, &pods, &results, Semantics::Strict);
        assert!(violations.is_empty(), "{violations:#?}");
        let web_zones: BTreeMap<String, usize> = snap
            .pods
            .values()
            .filter(|p| p.labels.get("app").map(String::as_str) == Some("web"))
            .filter_map(|p| snap.nodes.get(p.node_name.as_deref()?)?.labels.get(labels::ZONE).cloned())
            .fold(BTreeMap::new(), |mut m, z| {
                *m.entry(z).or_default() += 1;
                m
            });
        assert_eq!(web_zones.values().sum::<usize>(), 9, "{web_zones:?}");
        assert!(web_zones.values().all(|&n| n == 3), "spread over the running pods: {web_zones:?}");
    }
}

mod limiter {
    use crate::common::{forward, node_class, propose, state, types};
    use std::collections::BTreeMap;
    use std::sync::Arc;
    use std::time::Duration;

    use actix::prelude::*;
    use dovetail_actors::limiter::RegionLimiter;
    use dovetail_actors::zone::{GetStats, Launch, LaunchOutcome, ZoneActor, ZoneConfig};
    use dovetail_cloud::limits::{ApiLimits, Bucket};
    use dovetail_cloud::sim::{SimCloud, SimConfig};
    use dovetail_cloud::{LaunchBatch, LaunchRequest};
    use dovetail_core::catalog::CapacityType;
    use dovetail_core::clock::{Clock, ManualClock};
    use dovetail_core::ledger::{ClaimRequest, ClaimState, Command};
    use dovetail_core::resources::ResourceList;
    use dovetail_raft::InProcess;

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
        let now = clock.now_millis();
        propose(ledger.as_ref(), now, Command::SetPool { pool: "default".into(), limits: ResourceList::new() }).await;
        let claims = (0..6)
            .map(|i| ClaimRequest {
                id: format!("c{i}"),
                zone: if i % 2 == 0 { "us-east-1a" } else { "us-east-1b" }.into(),
                resources: ResourceList::cpu_mem(2000, 8 << 30),
                price_per_hour: 96_000,
            })
            .collect();
        propose(ledger.as_ref(), now, Command::Reserve { pool: "default".into(), claims }).await;
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
                batch: LaunchBatch::default(),
                nodepool: "default".into(),
                node_class: node_class(),
                zone: zone.into(),
                instance_types: vec!["m5.large".into()],
                capacity_types: vec![CapacityType::OnDemand],
                labels: BTreeMap::new(),
                tags: BTreeMap::new(),
            };
            zones[i % 2]
                .send(Launch { causes: Vec::new(), requests: vec![r], reply: sink.clone().recipient(), again: false })
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
        let s = state(ledger.as_ref()).await;
        assert!(s.claims().values().all(|c| matches!(c.state, ClaimState::Launched { .. })));
    }

    /// A zone whose launches the region's bucket paces to one instance at once, then one per
    /// 100 ms of the plane's clock, with `names` reserved in the ledger.
    struct Paced {
        clock: Arc<ManualClock>,
        cloud: Arc<SimCloud>,
        ledger: Arc<InProcess>,
        limiter: Arc<RegionLimiter>,
        sink: Addr<crate::common::Forward<LaunchOutcome>>,
        rx: tokio::sync::mpsc::Receiver<LaunchOutcome>,
        order: Vec<String>,
    }

    impl Paced {
        async fn new(names: &[&str]) -> Self {
            let clock = Arc::new(ManualClock::new());
            let limits = ApiLimits { launched_instances: Bucket::new(1.0, 10.0), ..ApiLimits::default() };
            let cloud = Arc::new(SimCloud::new(SimConfig::default(), types(), clock.clone()));
            let ledger = Arc::new(InProcess::new());
            let now = clock.now_millis();
            let pool = Command::SetPool { pool: "default".into(), limits: ResourceList::new() };
            propose(ledger.as_ref(), now, pool).await;
            let claims = names
                .iter()
                .map(|id| ClaimRequest {
                    id: (*id).into(),
                    zone: "us-east-1a".into(),
                    resources: ResourceList::cpu_mem(2000, 8 << 30),
                    price_per_hour: 96_000,
                })
                .collect();
            propose(ledger.as_ref(), now, Command::Reserve { pool: "default".into(), claims }).await;
            let limiter = Arc::new(RegionLimiter::new(limits, clock.clone()));
            let (sink, rx) = forward::<LaunchOutcome>();
            Paced { clock, cloud, ledger, limiter, sink, rx, order: Vec::new() }
        }

        fn zone(&self) -> ZoneActor {
            ZoneActor::new(ZoneConfig::new("us-east-1a"), self.cloud.clone(), self.ledger.clone(), self.clock.clone())
                .with_limiter(self.limiter.clone())
        }

        fn launch(&self, claims: &[&str], again: bool) -> Launch {
            let requests = claims
                .iter()
                .map(|c| LaunchRequest {
                    claim: (*c).into(),
                    batch: LaunchBatch::default(),
                    nodepool: "default".into(),
                    node_class: node_class(),
                    zone: "us-east-1a".into(),
                    instance_types: vec!["m5.large".into()],
                    capacity_types: vec![CapacityType::OnDemand],
                    labels: BTreeMap::new(),
                    tags: BTreeMap::new(),
                })
                .collect();
            Launch { causes: Vec::new(), requests, reply: self.sink.clone().recipient(), again }
        }

        /// The launched claims, in order, until there are `n`; the plane's clock moves only
        /// when `refill` (100 ms every 5 steps of 10 ms). Bounded: 400 steps.
        async fn until(&mut self, n: usize, refill: bool) -> &[String] {
            for step in 0..400 {
                while let Ok(o) = self.rx.try_recv() {
                    assert!(o.result.is_ok(), "{o:?}");
                    self.order.push(o.claim);
                }
                if self.order.len() >= n {
                    break;
                }
                if refill && step % 5 == 0 {
                    self.clock.advance(Duration::from_millis(100));
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            &self.order
        }
    }

    /// A claim called before (its capacity ran out, or a restart cut its call off) has its
    /// launch timeout running from that call: it goes ahead of the claims still waiting for
    /// their first call, instead of behind them (in a burst, 10 minutes of EC2's launch rate).
    #[actix_rt::test]
    async fn a_claim_called_before_is_launched_ahead_of_the_claims_waiting_for_their_first_call() {
        let mut p = Paced::new(&["c0", "c1", "c2", "c3", "again"]).await;
        let zone = p.zone().start();
        zone.send(p.launch(&["c0", "c1", "c2", "c3"], false)).await.expect("mailbox");
        // The clock held: only the bucket's one instance goes.
        assert_eq!(p.until(1, false).await, ["c0"], "the bucket's one instance");
        // c1 to c3 wait for the bucket; a claim called before arrives.
        zone.send(p.launch(&["again"], true)).await.expect("mailbox");
        assert_eq!(p.until(5, true).await, ["c0", "again", "c1", "c2", "c3"], "called before, so ahead of the queue");
    }

    /// A restart queues again every claim not yet answered: those called before (here one back
    /// from a call that found no capacity, which has no batch recorded) still ahead of those
    /// waiting for their first call, not in the order of their names.
    #[actix_rt::test]
    async fn a_restart_keeps_the_claims_called_before_ahead_of_the_queue() {
        let mut p = Paced::new(&["c0", "c1", "c2", "z-again"]).await;
        let actor = p.zone();
        let zone = Supervisor::start(move |_| actor);
        zone.send(p.launch(&["c0", "c1", "c2"], false)).await.expect("mailbox");
        assert_eq!(p.until(1, false).await, ["c0"], "the bucket's one instance");
        zone.send(p.launch(&["z-again"], true)).await.expect("mailbox");
        zone.send(dovetail_actors::Restart).await.expect("mailbox");
        assert_eq!(zone.send(GetStats).await.expect("stats").requeued, 3, "c1, c2 and z-again queued again");
        assert_eq!(
            p.until(4, true).await,
            ["c0", "z-again", "c1", "c2"],
            "called before, so still ahead after the restart"
        );
    }
}

/// Timers on the arbiter fire on time while a large solve runs: solves run on the blocking
/// pool, not on the thread the actors' timers share.
mod timers {
    use crate::common::{executor, node_class, propose, types};
    use std::collections::BTreeMap;
    use std::sync::Arc;
    use std::time::Duration;

    use actix::prelude::*;
    use dovetail_actors::config::Config;
    use dovetail_actors::errors::Errors;
    use dovetail_actors::pool::{NodePoolActor, PoolWiring};
    use dovetail_actors::router::{GetRouterStats, PodsPending, RoutedPool, Router};
    use dovetail_actors::zone::{GetStats, Launch, LaunchOutcome, ZoneActor, ZoneConfig};
    use dovetail_cloud::sim::{ApiLimits, SimCloud, SimConfig};
    use dovetail_cloud::{LaunchBatch, LaunchRequest};
    use dovetail_cluster::sim::SimCluster;
    use dovetail_core::catalog::CapacityType;
    use dovetail_core::clock::{Clock, SystemClock};
    use dovetail_core::labels;
    use dovetail_core::ledger::{ClaimRequest, Command};
    use dovetail_core::nodepool::NodePool;
    use dovetail_core::plane::BatchWindow;
    use dovetail_core::pod::{Pod, PodKey};
    use dovetail_core::requirements::{Requirement, Requirements};
    use dovetail_core::resources::ResourceList;
    use dovetail_core::scheduling::PoolInput;
    use dovetail_raft::InProcess;

    const PODS: usize = 100_000;

    #[actix_rt::test]
    async fn the_zone_launch_window_fires_while_a_100_000_pod_solve_runs() {
        let clock: Arc<dyn Clock> = Arc::new(SystemClock::new());
        let cloud = Arc::new(SimCloud::new(
            SimConfig { limits: ApiLimits::raised(1000.0), ..SimConfig::default() },
            types(),
            clock.clone(),
        ));
        let cluster = Arc::new(SimCluster::new());
        let ledger = Arc::new(InProcess::new());
        let now = clock.now_millis();
        propose(ledger.as_ref(), now, Command::SetPool { pool: "default".into(), limits: ResourceList::new() }).await;
        // The probe: claims a zone actor launches one at a time, each after its 35 ms window.
        let probes: Vec<ClaimRequest> = (0..200)
            .map(|i| ClaimRequest {
                id: format!("probe-{i}"),
                zone: "us-east-1a".into(),
                resources: ResourceList::cpu_mem(2000, 8 << 30),
                price_per_hour: 96_000,
            })
            .collect();
        propose(ledger.as_ref(), now, Command::Reserve { pool: "default".into(), claims: probes }).await;
        let zone = ZoneActor::new(ZoneConfig::new("us-east-1a"), cloud.clone(), ledger.clone(), clock.clone()).start();
        let (sink, _outcomes) = crate::common::forward::<LaunchOutcome>();
        // A Router over one pool of the c/m/r families.
        let mut reqs = Requirements::new();
        reqs.add(labels::CAPACITY_TYPE, Requirement::is_in(["on-demand"]));
        reqs.add(labels::INSTANCE_CATEGORY, Requirement::is_in(["c", "m", "r"]));
        reqs.add(labels::ZONE, Requirement::is_in(["us-east-1a"]));
        let pool = NodePool::new("default", reqs);
        let config =
            Arc::new(Config { window: BatchWindow { idle: 20, max: 200, adaptive: None }, ..Config::default() });
        let (ex, errors) = executor(cluster.clone(), ledger.clone());
        let (cl, le, ck, z) = (cluster.clone(), ledger.clone(), clock.clone(), zone.clone());
        let cloud: Arc<dyn dovetail_cloud::CloudProvider> = cloud.clone();
        let conf = config.clone();
        let router = Router::create(move |ctx| {
            let wiring = PoolWiring {
                view: cl.clone(),
                cluster: cl.clone(),
                ledger: le.clone(),
                clock: ck.clone(),
                zones: BTreeMap::from([("us-east-1a".to_string(), z)]),
                router: ctx.address().recipient(),
                executor: ex,
                errors,
                config: conf.clone(),
                cloud,
                nominations: Default::default(),
            };
            let actor = NodePoolActor::new(pool.clone(), types(), node_class(), wiring).start();
            let routed = vec![RoutedPool { input: PoolInput { pool, instance_types: types() }, actor }];
            Router::new(conf.window.clone(), cl.clone(), ck.clone(), routed).configured(&conf, Arc::new(Errors::new()))
        });
        let pods: Vec<Pod> = (0..PODS)
            .map(|i| Pod {
                key: PodKey::new("default", &format!("p-{i}")),
                requests: ResourceList::cpu_mem([250, 500, 1000][i % 3], [256 << 20, 512 << 20, 1 << 30][i % 3]),
                creation: i as i64,
                unschedulable: true,
                ..Pod::default()
            })
            .collect();
        cluster.apply_pods(pods.clone());
        router.send(PodsPending { pods, backlog: false }).await.expect("mailbox");
        // The batch closes after 20 ms idle and its solve starts.
        for _ in 0..100 {
            if router.send(GetRouterStats).await.expect("stats").batches == 1 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let (mut during, mut next, mut latest_ms) = (0usize, 0usize, Vec::new());
        let solving = |s: &dovetail_actors::router::RouterStats| s.batches == 1 && s.routed == 0 && s.on_existing == 0;
        // Bounded: 600 probes of 100 ms at most, a minute.
        for _ in 0..600 {
            if !solving(&router.send(GetRouterStats).await.expect("stats")) {
                break;
            }
            let request = LaunchRequest {
                claim: format!("probe-{next}"),
                batch: LaunchBatch::default(),
                nodepool: "default".into(),
                node_class: node_class(),
                zone: "us-east-1a".into(),
                instance_types: vec!["m5.large".into()],
                capacity_types: vec![CapacityType::OnDemand],
                labels: BTreeMap::new(),
                tags: BTreeMap::new(),
            };
            next = (next + 1) % 200;
            let sent = clock.now_millis();
            zone.send(Launch {
                causes: Vec::new(),
                requests: vec![request],
                reply: sink.clone().recipient(),
                again: false,
            })
            .await
            .expect("mailbox");
            during += 1;
            // The probe's window (35 ms) fires while the solve runs; waited for up to a second
            // (a machine busy with other work delays a timer by tens of milliseconds, a thread
            // held by the solve for as long as the solve).
            let mut z = zone.send(GetStats).await.expect("stats");
            for _ in 0..100 {
                if z.launch_calls as usize >= during {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
                z = zone.send(GetStats).await.expect("stats");
            }
            if solving(&router.send(GetRouterStats).await.expect("stats")) {
                assert_eq!(
                    z.launch_calls as usize, during,
                    "a 35 ms window had not fired within a second of the solve"
                );
                latest_ms.push(z.flush_late_ms);
            }
            let spent = clock.now_millis().saturating_sub(sent);
            tokio::time::sleep(Duration::from_millis(100u64.saturating_sub(spent))).await;
        }
        let solve_ms = latest_ms.len() as u64 * 100;
        assert!(latest_ms.len() >= 3, "the solve ran long enough to probe: {} windows during it", latest_ms.len());
        let worst = latest_ms.iter().copied().max().unwrap_or_default();
        // On the solve's thread a window would wait out the rest of the solve (here at least
        // `solve_ms`); 250 ms is that apart from a loaded machine's delays (tens of ms: 63 ms
        // once with a week's soak and both Kubernetes passes beside it). How late it fires
        // with nothing beside it is a figure (printed), not the test's.
        assert!(
            worst <= 250 && worst < solve_ms,
            "a launch window fired {worst} ms late during the solve: {latest_ms:?}"
        );
        eprintln!("{} launch windows during the 100,000-pod solve, at most {worst} ms late", latest_ms.len());
        System::current().stop();
    }
}

#[path = "plane/gc.rs"]
mod gc;
