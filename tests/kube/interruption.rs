//! Interruption handling against moto's SQS (real aws-sdk-sqs calls over HTTP): the plane on
//! the sim cloud and sim cluster (the test plays the kubelets and the scheduler), its
//! InterruptionActor fed by `SqsQueue` consumers. No API server is needed.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use dovetail_actors::config::{Config, InterruptionConfig};
use dovetail_actors::feed::FeedConfig;
use dovetail_actors::interruption::{GetInterruptionStats, InterruptionStats};
use dovetail_actors::kubelet::registrations;
use dovetail_actors::plane::{Plane, PlaneConfig, Seams};
use dovetail_actors::pool::Reconcile;
use dovetail_cloud::aws::{AwsConfig, SqsQueue, StaticCredentials, sdk_config};
use dovetail_cloud::events::{EventKind, Origin, event};
use dovetail_cloud::limits::ApiLimits;
use dovetail_cloud::sim::{SimCloud, SimConfig};
use dovetail_cloud::{Instance, InterruptionQueue, NodeClass};
use dovetail_cluster::ClusterView;
use dovetail_cluster::sim::{Deployment, Registrar, SimCluster, Workloads};
use dovetail_core::catalog::{Catalog, InstanceType, NodeClassSettings};
use dovetail_core::clock::{Clock, SystemClock};
use dovetail_core::labels;
use dovetail_core::ledger::{ClaimState, Command, Entry, State};
use dovetail_core::nodepool::NodePool;
use dovetail_core::plane::{BatchWindow, disrupted_taint};
use dovetail_core::pod::Pod;
use dovetail_core::requirements::{Requirement, Requirements};
use dovetail_core::resources::ResourceList;
use dovetail_raft::{BoxFuture, Committed, InProcess, Leadership, Ledger, LedgerError, read_with};

const ZONES: [&str; 2] = ["us-east-1a", "us-east-1b"];

/// Which of the interruption actor's proposals a [`Refusing`] ledger fails.
#[derive(Clone, Copy, Debug)]
enum Target {
    /// The interruption records (`Command::Interrupt`).
    Records,
    /// The replacements (`Command::ReplaceInterrupted`), after the records committed.
    Replacements,
}

/// How it fails them.
#[derive(Clone, Copy, Debug)]
enum Failure {
    /// At once, as a ledger without quorum would.
    Refuse,
    /// By never answering (for 60 s), as a handler stuck on a call would.
    Hang,
}

/// A ledger that fails the first `fail` proposals of `target`, then commits as the one it
/// wraps.
struct Refusing {
    inner: Arc<InProcess>,
    target: Target,
    failure: Failure,
    fail: AtomicUsize,
    refused: AtomicUsize,
}

impl Ledger for Refusing {
    fn propose(&self, entry: Entry) -> BoxFuture<'_, Result<Committed, LedgerError>> {
        Box::pin(async move {
            let aimed = match self.target {
                Target::Records => matches!(entry.command, Command::Interrupt { .. }),
                Target::Replacements => matches!(entry.command, Command::ReplaceInterrupted { .. }),
            };
            if aimed && self.fail.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1)).is_ok() {
                self.refused.fetch_add(1, Ordering::SeqCst);
                if let Failure::Hang = self.failure {
                    tokio::time::sleep(Duration::from_secs(60)).await;
                }
                return Err(LedgerError::Unavailable { reason: "the test's ledger has no quorum".into() });
            }
            self.inner.propose(entry).await
        })
    }
    fn read<'a>(&'a self, f: Box<dyn FnOnce(&State) + Send + 'a>) -> BoxFuture<'a, Result<(), LedgerError>> {
        self.inner.read(f)
    }
    fn leadership(&self) -> tokio::sync::watch::Receiver<Leadership> {
        self.inner.leadership()
    }
}

fn catalog_types() -> Arc<Vec<InstanceType>> {
    let c = Catalog::embedded("us-east-1").expect("catalog");
    Arc::new(c.instance_types(&NodeClassSettings::default(), None))
}

/// moto's SQS: a fresh queue named `name` and a consumer of it whose receives hide messages
/// for `visibility`; and the SDK client, for sending and reading the queue's depth.
async fn queue(name: &str, visibility: Duration) -> (SqsQueue, aws_sdk_sqs::Client, String) {
    let cfg = AwsConfig {
        region: Some("us-east-1".into()),
        endpoint: Some(format!("http://{}", crate::moto::moto().addr)),
        credentials: Some(StaticCredentials { access_key_id: "testing".into(), secret_access_key: "testing".into() }),
        ..AwsConfig::default()
    };
    let sdk = sdk_config(&cfg).await;
    let sqs = aws_sdk_sqs::Client::new(&sdk);
    let created = sqs.create_queue().queue_name(name).send().await.expect("create queue");
    let url = created.queue_url().expect("queue url").to_string();
    let found = SqsQueue::named(&sdk, name).await.expect("GetQueueUrl");
    assert_eq!(found.url(), url, "the name resolves to the queue");
    (found.with_visibility(visibility), sqs, url)
}

/// Messages in the queue, visible or hidden by a receive.
async fn depth(sqs: &aws_sdk_sqs::Client, url: &str) -> u64 {
    use aws_sdk_sqs::types::QueueAttributeName as A;
    let out = sqs
        .get_queue_attributes()
        .queue_url(url)
        .attribute_names(A::ApproximateNumberOfMessages)
        .attribute_names(A::ApproximateNumberOfMessagesNotVisible)
        .send()
        .await
        .expect("queue attributes");
    let attrs = out.attributes().cloned().unwrap_or_default();
    [A::ApproximateNumberOfMessages, A::ApproximateNumberOfMessagesNotVisible]
        .iter()
        .map(|k| attrs.get(k).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0))
        .sum()
}

async fn send(sqs: &aws_sdk_sqs::Client, url: &str, body: String) {
    sqs.send_message().queue_url(url).message_body(body).send().await.expect("send message");
}

/// The body of a `kind` event for `instance`, dated now.
fn body(kind: EventKind, instance: &str, id: &str) -> String {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    event(kind, instance, &Origin { event_id: id, account: "123456789012", region: "us-east-1", unix_seconds: now })
}

/// The plane, the sim cluster playing kubelets and scheduler, and the sim cloud.
struct World {
    plane: Plane,
    cluster: Arc<SimCluster>,
    cloud: Arc<SimCloud>,
    inner: Arc<InProcess>,
    workloads: Workloads,
    registrar: Registrar,
    clock: Arc<dyn Clock>,
    /// Each step asks every pool to reconcile (as its own timer would, sooner).
    nudge: bool,
}

impl World {
    /// `pods` pods of 1 vCPU from one Deployment, on a spot pool of `types` over two zones,
    /// every pod bound and every claim initialized before it returns; `ledger` wraps `inner`;
    /// received messages hidden for `visibility`, handed back after `retry` when a run fails;
    /// the pools reconciling on their own every `reconcile_every` (the default when `None`).
    async fn new(
        pods: u32,
        types: &[&str],
        (inner, ledger): (Arc<InProcess>, Arc<dyn Ledger>),
        (visibility, retry): (Duration, Duration),
        reconcile_every: Option<Duration>,
    ) -> World {
        let clock: Arc<dyn Clock> = Arc::new(SystemClock::new());
        let cloud = Arc::new(SimCloud::new(SimConfig::default(), catalog_types(), clock.clone()));
        let cluster = Arc::new(SimCluster::new());
        let mut reqs = Requirements::new();
        reqs.add(labels::INSTANCE_TYPE, Requirement::is_in(types.iter().copied()));
        reqs.add(labels::CAPACITY_TYPE, Requirement::is_in(["spot"]));
        reqs.add(labels::ZONE, Requirement::is_in(ZONES));
        let pool = NodePool::new("default", reqs);
        let c = dovetail_raft::propose_now(
            ledger.as_ref(),
            clock.now_millis(),
            Command::SetPool { pool: "default".into(), limits: ResourceList::new() },
        )
        .await
        .expect("committed");
        assert!(!c.outcome.is_fenced());
        let mut config = Config {
            window: BatchWindow { idle: 100, max: 1_000, adaptive: None },
            feed: FeedConfig {
                tick: Duration::from_millis(50),
                resend: Duration::from_secs(2),
                settle: Duration::from_millis(500),
                coalesce: Duration::from_millis(20),
            },
            interruption: InterruptionConfig {
                consumers: 1,
                max_consumers: 2,
                wait: Duration::from_secs(1),
                idle_pause: Duration::from_millis(100),
                visibility,
                retry,
                ..InterruptionConfig::default()
            },
            ..Config::default()
        };
        if let Some(every) = reconcile_every {
            config.reconcile_every = every;
            config.quiet_reconcile_every = every;
        }
        let node_class = NodeClass { name: "default".into(), hash: "h".into(), ..Default::default() };
        let plane = Plane::start(
            PlaneConfig {
                zones: ZONES.iter().map(|z| z.to_string()).collect(),
                pools: vec![(pool, catalog_types(), node_class)],
                limits: ApiLimits::default(),
                config,
            },
            Seams {
                cloud: cloud.clone(),
                view: cluster.clone(),
                cluster: cluster.clone(),
                ledger,
                clock: clock.clone(),
                metrics: Default::default(),
            },
        )
        .expect("valid settings");
        let mut workloads = Workloads::new();
        workloads.apply_deployment(Deployment {
            namespace: "default".into(),
            name: "app".into(),
            replicas: pods,
            template: Pod { requests: ResourceList::cpu_mem(1_000, 1 << 30), ..Pod::default() },
            pick: Default::default(),
        });
        let mut w = World { plane, cluster, cloud, inner, workloads, registrar: Registrar::new(0), clock, nudge: true };
        w.until("every pod bound on initialized nodes", |w, s| {
            let snap = w.cluster.snapshot();
            snap.pods.len() == pods as usize
                && snap.pending().count() == 0
                && !s.claims().is_empty()
                && s.claims().values().all(|c| matches!(c.state, ClaimState::Initialized { .. }))
        })
        .await;
        w
    }

    /// One step of the world: the Deployment's pods, the kubelets, the pools, the scheduler.
    async fn step(&mut self) {
        let now = self.clock.now_millis();
        self.workloads.step(&self.cluster, now);
        let launched = registrations(&self.cloud.instances());
        self.registrar.step(&self.cluster, &launched, now);
        for p in self.plane.pools.values().filter(|_| self.nudge) {
            p.send(Reconcile).await.expect("pool");
        }
        self.cluster.schedule();
    }

    /// Steps until `done` holds (at most 60 s), failing with `what`.
    async fn until(&mut self, what: &str, mut done: impl FnMut(&World, &State) -> bool) {
        for _ in 0..2_400usize {
            self.step().await;
            let s = read_with(self.inner.as_ref(), State::clone).await.expect("read");
            if done(self, &s) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        let stats = self.stats().await;
        panic!("{what}: not within 60 s; interruption {stats:?}, errors {:?}", self.plane.errors.counts());
    }

    async fn stats(&self) -> InterruptionStats {
        match &self.plane.interruption {
            Some(a) => a.send(GetInterruptionStats).await.expect("interruption actor"),
            None => InterruptionStats::default(),
        }
    }

    /// The launched instances, by claim.
    async fn instances(&self) -> BTreeMap<String, Instance> {
        let all = self.cloud.instances();
        all.into_iter().filter_map(|i| Some((i.claim.clone()?, i))).collect()
    }
}

/// Whether the node of `instance` is gone (drained and deleted once its replacement was up).
fn node_gone(cluster: &SimCluster, instance: &Instance) -> bool {
    let provider = dovetail_actors::kubelet::provider_id(instance);
    !cluster.snapshot().nodes.values().any(|n| n.provider_id.as_deref() == Some(provider.as_str()))
}

/// Whether the node of `instance` is tainted `karpenter.sh/disrupted:NoSchedule`.
fn tainted(cluster: &SimCluster, instance: &Instance) -> bool {
    let taint = disrupted_taint();
    let provider = dovetail_actors::kubelet::provider_id(instance);
    cluster.snapshot().nodes.values().any(|n| {
        n.provider_id.as_deref() == Some(provider.as_str())
            && n.taints.iter().any(|t| t.key == taint.key && t.effect == taint.effect)
    })
}

/// Every kind Karpenter handles, a malformed body, an event nothing acts on and duplicates,
/// through moto's SQS (received messages hidden for 30 s, so none is seen twice by the
/// timeout): the five interrupted nodes are tainted and replaced (their pods bound elsewhere,
/// their claims gone), the rebalance recommendation is an event only, and every message is
/// deleted, none before the ledger recorded what it acted on.
#[test]
fn every_interruption_kind_from_moto_sqs_is_acted_on_once_and_deleted_after_commit() {
    let system = actix_rt::System::new();
    system.block_on(async {
        let name = format!("dovetail-interruptions-{}", std::process::id());
        let (consumer, sqs, url) = queue(&name, Duration::from_secs(30)).await;
        let inner = Arc::new(InProcess::new());
        let timing = (Duration::from_secs(30), Duration::from_secs(1));
        // One pod a node: eight nodes.
        let mut w = World::new(8, &["m5.large"], (inner.clone(), inner.clone()), timing, None).await;
        let instances = w.instances().await;
        assert!(instances.len() >= 6, "at least six nodes: {}", instances.len());
        let picked: Vec<&Instance> = instances.values().take(6).collect();
        let (spot, scheduled, stopped, terminated, reserved, rebalanced) =
            (picked[0], picked[1], picked[2], picked[3], picked[4], picked[5]);
        let messages = [
            body(EventKind::SpotInterruption, &spot.id, "e-spot"),
            body(EventKind::ScheduledChange, &scheduled.id, "e-scheduled"),
            body(EventKind::StateChange("stopping"), &stopped.id, "e-stopping"),
            body(EventKind::StateChange("shutting-down"), &terminated.id, "e-shutting-down"),
            body(EventKind::CapacityReservationInterruption, &reserved.id, "e-reservation"),
            body(EventKind::RebalanceRecommendation, &rebalanced.id, "e-rebalance"),
            // Duplicates: the same warning again, and the stopped and terminated ones' later states.
            body(EventKind::SpotInterruption, &spot.id, "e-spot"),
            body(EventKind::StateChange("stopped"), &stopped.id, "e-stopped"),
            body(EventKind::StateChange("terminated"), &terminated.id, "e-terminated"),
            // Nothing to act on, and a body that is not an event at all.
            body(EventKind::StateChange("running"), &rebalanced.id, "e-running"),
            // Another cluster's instance, in the account-wide queue: no claim here knows it.
            body(EventKind::SpotInterruption, "i-0another0cluster", "e-other-spot"),
            body(EventKind::StateChange("stopping"), "i-0another0cluster", "e-other-stopping"),
            "{\"version\": \"0\", \"source\": \"aws.ec2\", \"detail-type\": \"EC2 Spot Instance Interruption Warning\""
                .into(),
        ];
        let sent = messages.len() as u64;
        for m in messages {
            send(&sqs, &url, m).await;
        }
        assert_eq!(depth(&sqs, &url).await, sent);
        let queue: Arc<dyn InterruptionQueue> = Arc::new(consumer);
        w.plane.consume_interruptions(vec![("moto".to_string(), queue)]);
        let interrupted = [spot.clone(), scheduled.clone(), stopped.clone(), terminated.clone(), reserved.clone()];
        // Every message deleted; at each look, the messages gone are at most those whose
        // instances the ledger recorded (each instance's messages go only after its record).
        let messages_of = |i: &Instance| -> u64 {
            if i.id == spot.id || i.id == stopped.id || i.id == terminated.id { 2 } else { 1 }
        };
        let mut looks = 0;
        for _ in 0..400usize {
            let left = depth(&sqs, &url).await;
            let s = read_with(inner.as_ref(), State::clone).await.expect("read");
            let recorded: u64 = interrupted.iter().filter(|i| s.interruption(&i.id).is_some()).map(messages_of).sum();
            // The rebalance, no-op and malformed messages need no record, nor do the other
            // cluster's two; the interrupted instances' messages go only once recorded.
            let deletable = recorded + 5;
            // The counts are approximate (SQS says so): one may say more are left than were
            // sent while messages change hands; none is then counted as gone.
            let gone = sent.saturating_sub(left);
            assert!(gone <= deletable, "{gone} messages gone, {recorded} recorded");
            looks += 1;
            if left == 0 {
                break;
            }
            w.step().await;
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(looks > 1, "the queue was looked at while the messages were handled");
        assert_eq!(depth(&sqs, &url).await, 0, "every message deleted: {:?}", w.stats().await);
        // Each tainted, then (its replacement up at once in the sim) possibly drained and gone
        // already when looked at.
        w.until("the five interrupted nodes recorded and tainted", |w, s| {
            interrupted
                .iter()
                .all(|i| s.interruption(&i.id).is_some() && (tainted(&w.cluster, i) || node_gone(&w.cluster, i)))
        })
        .await;
        // Karpenter's events, on each instance's NodeClaim (the rebalance recommendation too),
        // each once.
        let events = w.cluster.events();
        for (i, reason) in [
            (spot, "SpotInterrupted"),
            (scheduled, "InstanceUnhealthy"),
            (stopped, "InstanceStopping"),
            (terminated, "InstanceTerminating"),
            (reserved, "CapacityReservationInstanceInterrupted"),
            (rebalanced, "SpotRebalanceRecommendation"),
        ] {
            let claim = i.claim.clone().unwrap_or_default();
            let n = events.iter().filter(|e| e.name == claim && e.reason == reason).count();
            assert_eq!(
                n,
                1,
                "{reason} on {claim}: {:?}",
                events.iter().filter(|e| e.name == claim).collect::<Vec<_>>()
            );
        }
        // The queue empties when moto has the deletes; the stages count them when their
        // answers reach the actor, which under load can be later.
        for _ in 0..600usize {
            if w.stats().await.deleted >= sent {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let stats = w.stats().await;
        let kinds: BTreeMap<&str, u64> = [
            ("spot_interrupted", 3),
            ("scheduled_change", 1),
            ("instance_stopped", 3),
            ("instance_terminated", 2),
            ("capacity_reservation_interrupted", 1),
            ("rebalance_recommendation", 1),
            ("no_op", 1),
            ("malformed", 1),
        ]
        .into_iter()
        .collect();
        for (kind, n) in &kinds {
            assert_eq!(stats.received.get(*kind).copied().unwrap_or(0), *n, "{kind}: {stats:?}");
        }
        assert_eq!(stats.deleted, sent, "{stats:?}");
        // Two messages each for the spot, stopped and terminated instances: each acted on once.
        assert_eq!(stats.acted, 5, "five instances acted on once each: {stats:?}");
        assert_eq!(stats.tainted, 5, "{stats:?}");
        // One pod a node, none fits elsewhere: a replacement each for the three with time
        // left (spot, scheduled change, reservation). A stopping or shutting-down instance's
        // deadline is now: its node may drain as soon as its record commits, before the
        // sizing stage of the same run reads its pods (on a loaded machine it does), and its
        // pod is then provisioned for as any pending pod. Every pod bound again is checked
        // below.
        let replaced = stats.replacements;
        assert!((3..=5).contains(&replaced), "a replacement for each with time left, at most one each: {stats:?}");
        assert_eq!((stats.released, stats.failed_runs, stats.resumed), (0, 0, 0), "{stats:?}");
        // The other cluster's notices: deleted and counted, never proposed (no record kept an
        // hour, no offering marked unavailable).
        assert_eq!(stats.unmatched, 2, "{stats:?}");
        let s = read_with(inner.as_ref(), State::clone).await.expect("read");
        assert!(s.interruption("i-0another0cluster").is_none(), "not recorded in the ledger");
        // A redelivery after the action committed (at-least-once): deleted, nothing done again.
        let duplicates = stats.duplicates;
        send(&sqs, &url, body(EventKind::SpotInterruption, &spot.id, "e-spot")).await;
        for _ in 0..240usize {
            if w.stats().await.deleted == sent + 1 {
                break;
            }
            w.step().await;
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let stats = w.stats().await;
        assert_eq!((stats.deleted, stats.acted, stats.replacements), (sent + 1, 5, replaced), "{stats:?}");
        assert_eq!(stats.duplicates, duplicates + 1, "the redelivery, a duplicate: {stats:?}");
        assert_eq!(depth(&sqs, &url).await, 0);
        // The rebalance recommendation is an event: its node stays as it was.
        assert!(!tainted(&w.cluster, rebalanced), "rebalance is an event only (Karpenter's default)");
        // The interrupted claims drain once their replacements are up, and go; every pod is
        // bound again, on nodes that were not interrupted.
        let gone: Vec<String> = interrupted.iter().filter_map(|i| i.claim.clone()).collect();
        w.until("the interrupted claims gone and every pod bound again", |w, s| {
            let snap = w.cluster.snapshot();
            gone.iter().all(|c| s.claim(c).is_none() && !snap.nodeclaims.contains_key(c))
                && snap.pending().count() == 0
                && snap.pods.len() == 8
        })
        .await;
        let kept = w.instances().await;
        assert!(interrupted.iter().all(|i| !kept.values().any(|k| k.id == i.id)), "their instances terminated");
        assert!(kept.values().any(|k| k.id == rebalanced.id), "the rebalanced one kept");
    });
}

/// A spot warning's replacement is launched once it is created: handed to its pool and on to
/// its zone's actor, with no reconcile of the pool in between (the pool's own every two
/// minutes here, and none asked by the test once the cluster is up).
#[test]
fn a_replacement_is_launched_without_waiting_for_its_pools_reconcile() {
    let system = actix_rt::System::new();
    system.block_on(async {
        let name = format!("dovetail-interruptions-now-{}", std::process::id());
        let (consumer, sqs, url) = queue(&name, Duration::from_secs(30)).await;
        let inner = Arc::new(InProcess::new());
        let timing = (Duration::from_secs(30), Duration::from_secs(1));
        let every = Some(Duration::from_secs(120));
        let mut w = World::new(2, &["m5.large"], (inner.clone(), inner.clone()), timing, every).await;
        let before = w.instances().await;
        let spot = before.values().next().expect("a node").clone();
        w.nudge = false;
        send(&sqs, &url, body(EventKind::SpotInterruption, &spot.id, "e-now")).await;
        let queue: Arc<dyn InterruptionQueue> = Arc::new(consumer);
        w.plane.consume_interruptions(vec![("moto".to_string(), queue)]);
        let launched = |now: &BTreeMap<String, Instance>| now.keys().filter(|c| !before.contains_key(*c)).count();
        for _ in 0..200usize {
            if launched(&w.instances().await) > 0 {
                break;
            }
            w.step().await;
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert_eq!(launched(&w.instances().await), 1, "its replacement launched within 10 s: {:?}", w.stats().await);
        // The stage counts its replacements when it ends, after its message's delete: moto's
        // SQS, shared with the other tests, can take seconds to answer under their load.
        for _ in 0..600usize {
            if w.stats().await.runs >= 2 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let stats = w.stats().await;
        assert_eq!((stats.replacements, stats.deleted), (1, 1), "{stats:?}");
    });
}

/// A spot warning whose handling fails: the ledger refuses (`Refuse`) or never answers
/// (`Hang`) the records (`Records`) or the replacements (`Replacements`). Returns the world,
/// the instance, the ledger, and how long after the first receive the instance was sized.
async fn failing_once(
    target: Target,
    failure: Failure,
    (visibility, retry): (Duration, Duration),
) -> (World, Instance, Arc<Refusing>, Duration, aws_sdk_sqs::Client, String) {
    let name = format!("dovetail-redelivery-{target:?}-{failure:?}-{}", std::process::id()).to_lowercase();
    let (consumer, sqs, url) = queue(&name, visibility).await;
    let inner = Arc::new(InProcess::new());
    let refusing = Arc::new(Refusing {
        inner: inner.clone(),
        target,
        failure,
        fail: AtomicUsize::new(1),
        refused: AtomicUsize::new(0),
    });
    let ledger: Arc<dyn Ledger> = refusing.clone();
    let mut w = World::new(4, &["m5.large"], (inner.clone(), ledger), (visibility, retry), None).await;
    let instances = w.instances().await;
    let spot = instances.values().next().expect("a node").clone();
    send(&sqs, &url, body(EventKind::SpotInterruption, &spot.id, "e-redelivered")).await;
    let queue: Arc<dyn InterruptionQueue> = Arc::new(consumer);
    let started = std::time::Instant::now();
    w.plane.consume_interruptions(vec![("moto".to_string(), queue)]);
    w.until("the warning failed once, then acted on", |w, s| {
        refusing.refused.load(Ordering::SeqCst) == 1
            && s.interruption(&spot.id).is_some_and(|r| r.sized)
            && (tainted(&w.cluster, &spot) || node_gone(&w.cluster, &spot))
    })
    .await;
    let took = started.elapsed();
    for _ in 0..200usize {
        if depth(&sqs, &url).await == 0 {
            break;
        }
        w.step().await;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(depth(&sqs, &url).await, 0, "deleted once acted on");
    // moto has the delete before the stage that sent it has counted it: under load the queue
    // can be empty while the stage's answer is still on its way to the actor.
    for _ in 0..600usize {
        if w.stats().await.deleted > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    (w, spot, refusing, took, sqs, url)
}

/// A refused ledger entry: the run hands its message back (visible again after `retry`, 1 s,
/// not the 30 s visibility timeout); seen again, it is acted on once and deleted.
#[test]
fn a_message_whose_records_are_refused_is_handed_back_and_acted_on_once() {
    let system = actix_rt::System::new();
    system.block_on(async {
        let timing = (Duration::from_secs(30), Duration::from_secs(1));
        let (w, _, _, took, _, _) = failing_once(Target::Records, Failure::Refuse, timing).await;
        assert!(
            took >= Duration::from_secs(1) && took < Duration::from_secs(20),
            "seen again after the retry: {took:?}"
        );
        let stats = w.stats().await;
        assert_eq!(stats.received.get("spot_interrupted").copied(), Some(2), "received twice: {stats:?}");
        assert_eq!((stats.acted, stats.deleted, stats.released, stats.failed_runs), (1, 1, 1, 1), "{stats:?}");
        assert!(w.plane.errors.counts().keys().any(|k| k.contains("interrupt")), "{:?}", w.plane.errors.counts());
    });
}

/// The records committed, the replacements refused: the message handed back and seen again
/// finds an instance recorded and not sized. It is tainted and sized then (resumed), with no
/// second event, and deleted.
#[test]
fn a_message_whose_replacements_are_refused_is_resumed_when_seen_again() {
    let system = actix_rt::System::new();
    system.block_on(async {
        let timing = (Duration::from_secs(30), Duration::from_secs(1));
        let (w, spot, _, took, _, _) = failing_once(Target::Replacements, Failure::Refuse, timing).await;
        assert!(took < Duration::from_secs(20), "seen again after the retry: {took:?}");
        let stats = w.stats().await;
        assert_eq!(stats.received.get("spot_interrupted").copied(), Some(2), "{stats:?}");
        // Recorded and tainted by the record stage (counted there), its replace stage refused,
        // then resumed: tainted again (idempotent) and sized.
        assert_eq!((stats.acted, stats.resumed, stats.duplicates, stats.deleted), (1, 1, 0, 1), "{stats:?}");
        assert_eq!((stats.tainted, stats.released, stats.failed_runs), (2, 1, 1), "{stats:?}");
        assert_eq!(stats.replacements, 1, "sized once, by the resumed run: {stats:?}");
        let claim = spot.claim.clone().unwrap_or_default();
        let events = w.cluster.events();
        let n = events.iter().filter(|e| e.name == claim && e.reason == "SpotInterrupted").count();
        assert_eq!(n, 1, "one event: {events:?}");
    });
}

/// A handler stuck on a call: the message comes back when its visibility timeout (3 s) runs
/// out, waits for the stuck run, which gives up at that timeout; then it is acted on once.
#[test]
fn a_message_whose_handler_hangs_is_seen_again_after_the_visibility_timeout_and_acted_on_once() {
    let system = actix_rt::System::new();
    system.block_on(async {
        let timing = (Duration::from_secs(3), Duration::from_secs(1));
        let (w, _, _, took, _, _) = failing_once(Target::Records, Failure::Hang, timing).await;
        assert!(took >= Duration::from_secs(3), "not before the visibility timeout: {took:?}");
        let stats = w.stats().await;
        assert!(stats.received.get("spot_interrupted").copied().unwrap_or(0) >= 2, "{stats:?}");
        assert_eq!((stats.acted, stats.failed_runs), (1, 1), "{stats:?}");
        assert!(stats.deleted >= 1, "{stats:?}");
    });
}
