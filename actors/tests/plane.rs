//! Component tests of the control plane's actors on the sim cloud, the in-process ledger and a
//! manual clock.

mod zone {
    use std::collections::BTreeMap;
    use std::sync::{Arc, OnceLock};
    use std::time::Duration;

    use actix::prelude::*;
    use dovetail_actors::zone::{GetStats, Launch, LaunchOutcome, ZoneActor, ZoneConfig};
    use dovetail_cloud::sim::{ApiLimits, Bucket, SimCloud, SimConfig};
    use dovetail_cloud::{CloudError, LaunchRequest, ManualClock, NodeClass, OfferingKey};
    use dovetail_core::catalog::{CapacityType, Catalog, InstanceType, NodeClassSettings};
    use dovetail_core::ledger::{ClaimRequest, ClaimState, Command, Entry, Offering, State};
    use dovetail_core::resources::{ResourceList, ResourceName};
    use dovetail_raft::{InProcess, Ledger};
    use tokio::sync::mpsc;

    fn types() -> Arc<Vec<InstanceType>> {
        static T: OnceLock<Arc<Vec<InstanceType>>> = OnceLock::new();
        T.get_or_init(|| {
            let c = Catalog::embedded("us-east-1").expect("catalog");
            Arc::new(c.instance_types(&NodeClassSettings::default(), None))
        })
        .clone()
    }

    /// Forwards outcomes to the test.
    struct Collector(mpsc::UnboundedSender<LaunchOutcome>);
    impl Actor for Collector {
        type Context = Context<Self>;
    }
    impl Handler<LaunchOutcome> for Collector {
        type Result = ();
        fn handle(&mut self, msg: LaunchOutcome, _: &mut Context<Self>) {
            let _ = self.0.send(msg);
        }
    }

    struct World {
        cloud: Arc<SimCloud>,
        ledger: Arc<InProcess>,
        clock: Arc<ManualClock>,
        zone: Addr<ZoneActor>,
        collector: Addr<Collector>,
        outcomes: mpsc::UnboundedReceiver<LaunchOutcome>,
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
        let (tx, outcomes) = mpsc::unbounded_channel();
        let collector = Collector(tx).start();
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

    fn state(ledger: &InProcess) -> State {
        let mut out = None;
        ledger.read(&mut |s| out = Some(s.clone())).expect("read");
        out.unwrap_or_default()
    }

    #[actix_rt::test]
    async fn launches_within_the_window_go_as_one_call_and_the_ledger_follows() {
        let mut w = world(6, ApiLimits::default()).await;
        for part in [0..2, 2..4, 4..6] {
            let requests = part.map(|i| request(&format!("claim-{i}"), "us-east-1a")).collect();
            w.zone.send(Launch { requests, reply: w.collector.clone().recipient() }).await.expect("mailbox");
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
        w.zone.send(Launch { requests: vec![request("claim-0", "us-east-1a")], reply }).await.expect("mailbox");
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
        assert!(s.is_unavailable(&m5, 100_000));
        assert!(!s.is_unavailable(&m5, 280_000), "for Karpenter's 3 minutes");
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
            .send(Launch { requests: vec![request("claim-0", "us-east-1a")], reply: reply.clone() })
            .await
            .expect("mailbox");
        assert!(next(&mut w).await.result.is_ok());
        // The bucket is empty now: the next launch is throttled until the sim clock moves.
        w.zone
            .send(Launch { requests: vec![request("claim-1", "us-east-1b")], reply: reply.clone() })
            .await
            .expect("mailbox");
        let wrong = next(&mut w).await;
        assert!(matches!(wrong.result, Err(CloudError::Invalid { .. })), "a claim for another zone is refused");
        w.zone.send(Launch { requests: vec![request("claim-1", "us-east-1a")], reply }).await.expect("mailbox");
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
