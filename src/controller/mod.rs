//! `dovetail controller`: the control plane on a real cluster.
//!
//! It connects to the API server (`--kubeconfig`, else in-cluster, else `KUBECONFIG` or
//! `~/.kube/config`), starts the watches, serves `/healthz` (live) and `/readyz` (ready once
//! the caches synced) and `/metrics`, and once synced starts the plane with a pool per valid
//! NodePool whose EC2NodeClass exists, and keeps the pools as the NodePools change
//! ([`pools`]). The ledger takes over the NodeClaims the cluster shows; with `--cloud sim` the
//! sim cloud rebuilds its fleet from the Nodes and NodeClaims first, so a restart launches
//! nothing twice, and the node agent plays the kubelets.
//!
//! The ledger is in memory for one control node, or replicated over `--peers` ([`ha`]).
//! Either way only the leader acts: the plane runs for each term this node leads in and
//! stops when it no longer does.

pub mod agent;
mod aws;
mod ha;
pub(crate) mod http;
mod nodeclasses;
mod pools;
mod profiles;
pub mod settings;

use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use dovetail_actors::config::Config;
use dovetail_actors::plane::{Plane, PlaneConfig, Seams};
use dovetail_cloud::limits::ApiLimits;
use dovetail_cloud::sim::{Latency, SimCloud, SimConfig};
use dovetail_cluster::ClusterView;
use dovetail_cluster::kube::{KubeCluster, KubeSettings};
use dovetail_core::catalog::{Catalog, NodeClassSettings};
use dovetail_core::clock::{Clock, SystemClock};
use dovetail_raft::Ledger;

pub use settings::{CloudKind, ControllerArgs, Settings};

/// Runs the controller until SIGINT or SIGTERM.
pub fn run(args: &ControllerArgs, otel: &crate::telemetry::TelemetryArgs) -> ExitCode {
    let settings = match Settings::resolve(args) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    let telemetry = match logs(&settings, otel) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    let code = run_with(settings);
    // Spans still queued are exported before the process ends.
    if let Some(t) = telemetry {
        t.shutdown();
    }
    code
}

fn run_with(settings: Settings) -> ExitCode {
    let sys = match dovetail_actors::system() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("error: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match sys.block_on(serve(settings)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            // Not dropped: a runtime's drop waits for its blocking tasks, and the error may be
            // a plane that never stopped. The process ends now either way.
            std::mem::forget(sys);
            ExitCode::FAILURE
        }
    }
}

/// Logs to stderr as the settings say, and spans to the OTLP endpoint when one is set, as
/// this control node (`service.instance.id`: its Raft node id, or the host's name).
pub(crate) fn logs(
    s: &Settings,
    otel: &crate::telemetry::TelemetryArgs,
) -> Result<Option<crate::telemetry::Telemetry>, String> {
    let instance = match &s.ha {
        Some(ha) => Some(format!("{}-node-{}", s.cluster_name, ha.node_id)),
        None => std::env::var("HOSTNAME").ok(),
    };
    let logs = crate::logs::Logs { format: s.log_format, level: s.log_level.clone() };
    crate::telemetry::install(otel, Some(&logs), instance.as_deref())
}

async fn client(s: &Settings) -> Result<(kube::Client, aws::ClusterAccess), String> {
    let (config, in_cluster) = kube_config(s.kubeconfig.as_deref()).await?;
    let access = aws::ClusterAccess::of(&config, in_cluster);
    let client = dovetail_cluster::kube::client(config).map_err(|e| format!("building the API client: {e}"))?;
    Ok((client, access))
}

/// The API server's configuration: `kubeconfig` if given; in a pod, its service account;
/// else kube's inference (KUBECONFIG, then ~/.kube/config). Whether it is the in-cluster one.
pub(crate) async fn kube_config(kubeconfig: Option<&std::path::Path>) -> Result<(kube::Config, bool), String> {
    let in_cluster = kubeconfig.is_none() && std::env::var_os("KUBERNETES_SERVICE_HOST").is_some();
    let config = match kubeconfig {
        Some(path) => {
            let kc = kube::config::Kubeconfig::read_from(path)
                .map_err(|e| format!("reading kubeconfig {}: {e}", path.display()))?;
            kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
                .await
                .map_err(|e| format!("kubeconfig {}: {e}", path.display()))?
        }
        // In a pod, its service account first (kube's `infer` would try a kubeconfig first).
        None if in_cluster => kube::Config::incluster()
            .map_err(|e| format!("in-cluster configuration (KUBERNETES_SERVICE_HOST is set): {e}"))?,
        None => kube::Config::infer().await.map_err(|e| format!("no cluster configuration found: {e}"))?,
    };
    Ok((config, in_cluster))
}

/// Waits for every watch to list once, saying every 10 s which are still out.
async fn wait_synced(cluster: &KubeCluster) {
    let mut changes = cluster.changes();
    while !cluster.synced() {
        match tokio::time::timeout(Duration::from_secs(10), changes.changed()).await {
            Ok(Ok(())) => {}
            Ok(Err(_)) => return,
            Err(_) => tracing::info!(unsynced = ?cluster.unsynced(), "waiting for the caches to sync"),
        }
    }
}

async fn serve(s: Settings) -> Result<(), String> {
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let (client, access) = client(&s).await?;
    let kube_settings = KubeSettings { qps: s.kube_client_qps, burst: s.kube_client_burst };
    let cluster = Arc::new(KubeCluster::start(client, kube_settings, clock.clone()).await.map_err(|e| e.to_string())?);
    let v = cluster.versions();
    tracing::info!(server = %v.server, policy = %v.policy, eviction = %v.eviction, streaming_lists = v.streaming_lists, "connected");
    let ready = Arc::new(AtomicBool::new(false));
    let metrics = Arc::new(http::Metrics::default());
    metrics.plane.collect(dovetail_actors::metrics::state::ClusterState {
        view: cluster.clone(),
        leading: Some(metrics.leading.clone()),
    });
    http::serve_health(s.health_addr, ready.clone()).await?;
    http::serve_metrics(s.metrics_addr, metrics.clone(), cluster.clone()).await?;
    wait_synced(&cluster).await;
    ready.store(true, Ordering::SeqCst);
    tracing::info!("caches synced");
    // The ledger joins its group only now: a node that could win an election must be able to
    // act on synced caches.
    let (ledger, raft) = ha::ledger(&s, clock.clone()).await?;
    metrics.set_leadership(ledger.leadership());
    if let Some(r) = &raft {
        metrics.set_raft(r.ledger.clone());
    }

    let mut s = s;
    let (catalog, aws) = match s.cloud {
        CloudKind::Sim => {
            let catalog = Catalog::embedded(&s.region).map_err(|e| format!("catalog of {}: {e}", s.region))?;
            (catalog, None)
        }
        CloudKind::Aws => {
            let provider = Arc::new(aws::provider(&s, &access, &v.server, clock.clone()).await?);
            // The region's types and offerings as EC2 describes them (Karpenter reads them so).
            let catalog = provider.catalog().await.map_err(|e| format!("--cloud aws: the region's catalog: {e}"))?;
            tracing::info!(region = %s.region, types = catalog.instance_types.len(), "EC2 catalog read");
            if !s.zones_set && !catalog.zones.is_empty() {
                // Every zone EC2 describes gets a zone actor; each NodePool launches only in
                // the zones its EC2NodeClass's subnets cover.
                s.zones = catalog.zones.iter().map(|z| z.name.clone()).collect();
            }
            (catalog, Some(provider))
        }
    };
    // The interruption queues, found once (a name that is not a queue stops the start here,
    // named); every term's plane consumes them while it leads.
    let mut queues: Vec<(String, Arc<dyn dovetail_cloud::InterruptionQueue>)> = Vec::new();
    if let Some(provider) = &aws {
        let visibility = s.interruption_visibility;
        for name in &s.interruption_queues {
            let q = provider
                .interruption_queue(name)
                .await
                .map_err(|e| format!("--interruption-queue {name}: {e}"))?
                .with_visibility(visibility);
            tracing::info!(queue = %name, url = %q.url(), "interruption queue found");
            queues.push((name.clone(), Arc::new(q)));
        }
    }
    // Followers read ahead what the EC2NodeClasses resolve to, for the leader they may become.
    let warming = aws.clone().map(|aws| tokio::spawn(warm_classes(cluster.clone(), aws, ledger.leadership())));
    // Every control node keeps its catalog fresh (prices, types and offerings on the
    // provider's cadence), leader or not: a new leader's pools take the latest at once.
    let check = s.price_refresh.min(s.catalog_refresh).min(Duration::from_secs(60));
    let refreshing = aws.clone().map(|aws| tokio::spawn(refresh_catalog(aws, check)));
    let plane_metrics = metrics.plane.clone();
    let term_ctx = Acting { s, cluster, ledger: ledger.clone(), clock, catalog, aws, metrics, queues };
    // Only the leader acts: each term it leads in, the plane runs on an arbiter of its own,
    // stopped (every actor and task on it) and joined as soon as this node no longer leads in
    // that term, before anything else may start. Followers keep their caches synced and their
    // ledger replica warm. A plane that fails to start, or stops by itself, ends the process:
    // a node that leads without acting would hold the group's leadership for nothing.
    let shutdown = shutdown_signal();
    tokio::pin!(shutdown);
    let mut leadership = ledger.leadership();
    loop {
        let term = tokio::select! {
            t = leading(&mut leadership) => t,
            () = &mut shutdown => break,
        };
        let Some(term) = term else {
            return Err("the ledger stopped: nothing acts any more".into());
        };
        tracing::info!(raft.term = term, "ledger.acting: leading, starting the control plane");
        let arbiter =
            actix_rt::Arbiter::try_new().map_err(|e| format!("cannot start the control plane's arbiter: {e}"))?;
        let (failed_tx, failed_rx) = tokio::sync::oneshot::channel::<String>();
        let ctx = term_ctx.clone();
        let started = arbiter.spawn_fn(move || {
            actix_rt::spawn(async move {
                let e = match ctx.act(term).await {
                    Ok(()) => "the control plane stopped by itself".to_string(),
                    Err(e) => e,
                };
                if failed_tx.send(e).is_err() {
                    tracing::debug!(raft.term = term, "ledger.acting: the term ended first");
                }
            });
        });
        if !started {
            return Err("cannot start the control plane's arbiter".into());
        }
        enum End {
            Lost,
            Failed(String),
            Shutdown,
        }
        let end = tokio::select! {
            () = not_leading(&mut leadership, term) => End::Lost,
            failed = failed_rx => match failed {
                Ok(e) => End::Failed(e),
                // The task ended without a word: it was dropped with its arbiter.
                Err(_) => End::Failed("the control plane's task ended".into()),
            },
            () = &mut shutdown => End::Shutdown,
        };
        stop_and_join(arbiter, term).await?;
        // The actors of the term are dropped with its arbiter: their budget gauges go with them
        // (only a leader serves them).
        plane_metrics.budgets.clear();
        match end {
            End::Lost => {
                tracing::info!(raft.term = term, "ledger.acting: no longer leading, the control plane stopped")
            }
            End::Failed(e) => return Err(format!("the control plane of term {term}: {e}")),
            End::Shutdown => break,
        }
    }
    tracing::info!("stopping");
    for task in [warming, refreshing].into_iter().flatten() {
        task.abort();
    }
    Ok(())
}

/// Reads the EC2 catalog again when the provider's refresh is due (checked every `check`: a
/// minute, or the shorter refresh): spot prices every `--price-refresh`, types and offerings
/// every `--catalog-refresh`. The pools take a new one at their next sync
/// ([`pools::Pools::sync`]). A refresh that fails keeps the catalog in use and is tried again
/// at the next check.
async fn refresh_catalog(aws: Arc<dovetail_cloud::aws::AwsProvider>, check: Duration) {
    // After a failure the next try waits twice as long, up to 10 minutes: an EC2 that throttles
    // or fails is not asked for the whole catalog every minute.
    const MOST: Duration = Duration::from_secs(600);
    let check = check.max(Duration::from_secs(1));
    let mut wait = check;
    loop {
        tokio::time::sleep(wait).await;
        let failed = match tokio::time::timeout(Duration::from_secs(120), aws.refresh_if_due()).await {
            Ok(Ok(true)) => {
                tracing::info!(
                    generation = aws.catalog_generation(),
                    "cloud.catalog: the EC2 catalog was read again; the NodePools take it at their next sync"
                );
                false
            }
            Ok(Ok(false)) => false,
            Ok(Err(e)) => {
                tracing::warn!(error = %e, retry_in_s = (wait * 2).min(MOST).max(check).as_secs(), "cloud.catalog: reading the EC2 catalog again failed; the one in use stays");
                true
            }
            Err(_) => {
                tracing::warn!(
                    retry_in_s = (wait * 2).min(MOST).max(check).as_secs(),
                    "cloud.catalog: reading the EC2 catalog again took over 120 s; the one in use stays"
                );
                true
            }
        };
        wait = if failed { (wait * 2).min(MOST).max(check) } else { check };
    }
}

/// While this node does not lead: reads what every EC2NodeClass resolves to (subnets,
/// security groups, images, its instance profile when made) into the provider's cache, every
/// 2 s until a round cached them all (a class whose profile the leader has not made yet is not
/// cached), then every minute, so that a new leader's first
/// decisions wait for no EC2, SSM or IAM call. Reads only, on a synced view.
async fn warm_classes(
    cluster: Arc<KubeCluster>,
    aws: Arc<dovetail_cloud::aws::AwsProvider>,
    leadership: tokio::sync::watch::Receiver<dovetail_raft::Leadership>,
) {
    const FIRST: Duration = Duration::from_secs(2);
    const EVERY: Duration = Duration::from_secs(60);
    let mut warmed = false;
    loop {
        if !leadership.borrow().leader && cluster.synced() {
            let mut all = true;
            let classes = cluster.nodeclasses();
            aws.retain_classes(&classes.keys().cloned().collect());
            for (name, nc) in &classes {
                let class = aws::node_class(name, nc);
                match tokio::time::timeout(Duration::from_secs(20), aws.warm(&class)).await {
                    Ok(Ok(true)) => {}
                    // Its instance profile is not made yet (the leader makes it): asked again soon.
                    Ok(Ok(false)) => all = false,
                    Ok(Err(e)) => {
                        all = false;
                        tracing::info!(ec2nodeclass = %name, error = %e, "cloud.warm: EC2NodeClass {name} not read ahead");
                    }
                    Err(_) => {
                        all = false;
                        tracing::info!(ec2nodeclass = %name, "cloud.warm: reading EC2NodeClass {name} ahead took over 20 s");
                    }
                }
            }
            warmed = all;
        }
        tokio::time::sleep(if warmed { EVERY } else { FIRST }).await;
    }
}

/// How long a term's plane may take to stop before the process gives up on it.
const JOIN_LIMIT: Duration = Duration::from_secs(60);

/// Stops a term's arbiter and waits for its thread to end: no later term's plane starts in
/// this process while any actor of this one may still run. A plane still running after
/// [`JOIN_LIMIT`] (a planner stuck in a solve) ends the process with an error, rather than run
/// two terms' planes side by side; Kubernetes starts it again, a follower of the term after.
async fn stop_and_join(arbiter: actix_rt::Arbiter, term: u64) -> Result<(), String> {
    arbiter.stop();
    // Joined on a thread of its own, not the runtime's blocking pool: a plane that never stops
    // must not keep the runtime from shutting down when the process ends over it.
    let (tx, joined) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name(format!("join-term-{term}"))
        .spawn(move || {
            if tx.send(arbiter.join()).is_err() {
                tracing::debug!(raft.term = term, "ledger.acting: the plane stopped after the process gave up on it");
            }
        })
        .map_err(|e| format!("cannot wait for the control plane of term {term}: {e}"))?;
    join_within(joined, term, JOIN_LIMIT, Duration::from_secs(10)).await
}

/// Waits for a term's plane thread (`joined`) to end, saying every `every` that it has not;
/// an error once `limit` passed.
async fn join_within<T>(
    joined: tokio::sync::oneshot::Receiver<std::thread::Result<T>>,
    term: u64,
    limit: Duration,
    every: Duration,
) -> Result<(), String> {
    let mut joined = joined;
    let mut waited = Duration::ZERO;
    loop {
        match tokio::time::timeout(every, &mut joined).await {
            Ok(Ok(Ok(_))) => return Ok(()),
            Ok(Ok(Err(_))) => {
                tracing::error!(raft.term = term, "ledger.acting: the control plane's thread panicked");
                return Ok(());
            }
            Ok(Err(e)) => {
                return Err(format!("waiting for the control plane of term {term} to stop failed: {e}"));
            }
            Err(_) => {
                waited += every;
                if waited >= limit {
                    return Err(format!(
                        "the control plane of term {term} did not stop within {limit:?}: no later term's plane \
                         may start beside it, so the process ends"
                    ));
                }
                tracing::warn!(
                    raft.term = term,
                    waited_s = waited.as_secs(),
                    "ledger.acting: the control plane has not stopped yet; no later term's plane starts until it does"
                );
            }
        }
    }
}

/// Waits until this node leads; the term it leads in (none if the ledger stopped).
async fn leading(leadership: &mut tokio::sync::watch::Receiver<dovetail_raft::Leadership>) -> Option<u64> {
    loop {
        let l = leadership.borrow_and_update().clone();
        if l.leader {
            return Some(l.term);
        }
        leadership.changed().await.ok()?;
    }
}

/// Waits until this node no longer leads in `term` (or the ledger stopped).
/// A lease lapse within the term does not stop the plane at once: every effect checks that
/// its term is current before it is made, so effects pause while the lease is out, and resume
/// if the lease comes back in the same term (a short stall), with no restart. The plane stops
/// when the term is over (a later term is seen) or the lease stays out this long.
const LEASE_OUT_LIMIT: Duration = Duration::from_secs(5);

/// Waits until this node's term `term` is over: a later term, the ledger stopped, or not
/// leading in it for [`LEASE_OUT_LIMIT`].
async fn not_leading(leadership: &mut tokio::sync::watch::Receiver<dovetail_raft::Leadership>, term: u64) {
    loop {
        let l = leadership.borrow_and_update().clone();
        if l.term != term {
            return;
        }
        let changed = if l.is_current(term) {
            leadership.changed().await
        } else {
            match tokio::time::timeout(LEASE_OUT_LIMIT, leadership.changed()).await {
                Ok(r) => r,
                // Out of its lease all this while: the term is over for this node.
                Err(_) => return,
            }
        };
        if changed.is_err() {
            return;
        }
    }
}

/// What a term's control plane is built from.
#[derive(Clone)]
struct Acting {
    s: Settings,
    cluster: Arc<KubeCluster>,
    ledger: Arc<dyn Ledger>,
    clock: Arc<dyn Clock>,
    catalog: Catalog,
    aws: Option<Arc<dovetail_cloud::aws::AwsProvider>>,
    metrics: Arc<http::Metrics>,
    /// The interruption queues (`--interruption-queue`).
    queues: Vec<(String, Arc<dyn dovetail_cloud::InterruptionQueue>)>,
}

impl Acting {
    /// Runs the plane, the NodePool follower and (with `--cloud sim`) the node agent on the
    /// current arbiter, from the cluster as it is now (a new leader takes over what the last
    /// one left: the sim cloud's fleet from the Nodes and NodeClaims, the claims by adoption).
    /// Runs until its arbiter stops; returns only on a failure.
    async fn act(self, term: u64) -> Result<(), String> {
        let Acting { s, cluster, ledger, clock, catalog, aws, metrics, queues } = self;
        let now = clock.now_millis();
        let snap = cluster.snapshot();
        let (cloud, sim) = match &aws {
            None => {
                let all_types = Arc::new(catalog.instance_types(&NodeClassSettings::default(), Some(&s.zones)));
                let config = SimConfig {
                    cluster: s.cluster_name.clone(),
                    region: s.region.clone(),
                    seed: now,
                    boot: Latency { min: Duration::ZERO, max: Duration::ZERO },
                    ..SimConfig::default()
                };
                let sim = Arc::new(SimCloud::new(config, all_types, clock.clone()));
                // What the cluster shows first (its Nodes' labels), then what only the ledger
                // knows (a restore skips what it holds already).
                let mut remembered = agent::remembered(&snap);
                let from_cluster = remembered.len();
                match dovetail_raft::read_with(ledger.as_ref(), |st| agent::launched(st.claims().values(), &snap)).await
                {
                    Ok(launched) => remembered.extend(launched),
                    Err(e) => {
                        tracing::warn!(error = %e, "sim cloud: the ledger's launched claims not read; the cluster's only")
                    }
                }
                let restored = sim.restore(&remembered);
                if restored > 0 {
                    tracing::info!(
                        instances = restored,
                        from_cluster,
                        from_ledger = remembered.len() - from_cluster,
                        "sim cloud fleet rebuilt from the cluster's Nodes and the ledger's launched claims"
                    );
                }
                (sim.clone() as Arc<dyn dovetail_cloud::CloudProvider>, Some(sim))
            }
            Some(provider) => (provider.clone() as Arc<dyn dovetail_cloud::CloudProvider>, None),
        };
        let mut plane = Plane::start_without_feed(
            PlaneConfig {
                zones: s.zones.clone(),
                pools: Vec::new(),
                limits: ApiLimits::default(),
                // Disruption is on, as Karpenter's: each NodePool's budgets and
                // consolidateAfter say how much (a budget of 0 nodes, or `Never`, turns it off).
                config: {
                    let mut c = Config {
                        disruption: dovetail_actors::config::DisruptionConfig { enabled: true, ..Default::default() },
                        ..Config::default()
                    };
                    c.interruption.consumers = s.interruption_consumers;
                    c.gc.every = s.gc_interval;
                    c.interruption.visibility = s.interruption_visibility;
                    c.lifecycle.interruption.rebalance = s.rebalance;
                    c
                },
            },
            Seams {
                cloud,
                view: cluster.clone(),
                cluster: cluster.clone(),
                ledger: ledger.clone(),
                clock: clock.clone(),
                metrics: metrics.plane.clone(),
            },
        )
        .map_err(|e| e.to_string())?;
        metrics.set_errors(plane.errors.clone());
        // The instance profiles of gone classes, collected on a task of its own: never in
        // the way of the pools' sync (a new leader's first decisions wait for it).
        if let Some(aws) = &aws {
            actix_rt::spawn(profiles::follow(aws.clone(), cluster.clone(), ledger.clone(), clock.clone(), term));
        }
        let mut pools = pools::Pools::new(catalog, s.zones.clone(), aws);
        pools.sync(&cluster, &mut plane, ledger.as_ref(), clock.as_ref()).await;
        // Pods come once every NodePool is routed to: those pending now are decided at once.
        plane.start_feed();
        // Interruption events once the pools are known (a replacement is sized over them).
        plane.consume_interruptions(queues);
        tracing::info!(
            raft.term = term,
            pools = plane.pools.len(),
            zones = plane.zones.len(),
            "ledger.acting: control plane started"
        );
        if let Some(sim) = sim {
            let config =
                agent::AgentConfig { registration_delay_ms: s.sim_registration_delay_ms, renew_every_ms: 10_000 };
            let mut agent = agent::Agent::new(cluster.clone(), sim, clock.clone(), config);
            actix_rt::spawn(async move {
                loop {
                    agent.step().await;
                    metrics.set_agent(agent.stats.clone());
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            });
        }
        // Follows the NodePools for the whole term; it returns only when the cluster view
        // closes, which ends the term's acting.
        follow_pools(pools, plane, cluster, ledger, clock).await;
        Err("the cluster view closed: NodePools are no longer followed".into())
    }
}

/// Keeps the plane's pools and the NodePools' statuses as the cluster is: after each change
/// (at most every `SETTLE`, so a burst of pod events is one pass) and every 5 s (the counts of
/// what the pools hold, as Karpenter's counter requeues).
async fn follow_pools(
    mut pools: pools::Pools,
    mut plane: Plane,
    cluster: Arc<KubeCluster>,
    ledger: Arc<dyn Ledger>,
    clock: Arc<dyn Clock>,
) {
    const SETTLE: Duration = Duration::from_millis(500);
    let mut changes = cluster.changes();
    loop {
        pools.report(&cluster, &plane, ledger.as_ref(), clock.as_ref()).await;
        let changed = tokio::time::timeout(Duration::from_secs(5), changes.changed()).await;
        if let Ok(Err(_)) = changed {
            // The view closed: the caller ends the term and says why.
            return;
        }
        tokio::time::sleep(SETTLE).await;
        changes.borrow_and_update();
        pools.sync(&cluster, &mut plane, ledger.as_ref(), clock.as_ref()).await;
    }
}

async fn shutdown_signal() {
    let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(t) => t,
        Err(e) => {
            tracing::warn!(error = %e, "cannot listen for SIGTERM; stopping on SIGINT only");
            if let Err(e) = tokio::signal::ctrl_c().await {
                tracing::error!(error = %e, "cannot listen for SIGINT either");
            }
            return;
        }
    };
    tokio::select! {
        _ = term.recv() => {}
        r = tokio::signal::ctrl_c() => if let Err(e) = r { tracing::error!(error = %e, "SIGINT listener failed") },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A term's plane thread that stops is joined; one that does not stop within the limit
    /// is an error (the process ends), never left running beside the next term's plane.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    #[allow(clippy::disallowed_methods, reason = "the test measures its own wait by the wall clock")]
    async fn no_later_terms_plane_starts_while_the_last_ones_thread_still_runs() {
        let every = Duration::from_millis(20);
        // A plane's thread, joined as stop_and_join joins it.
        fn on_thread(plane: impl FnOnce() + Send + 'static) -> tokio::sync::oneshot::Receiver<std::thread::Result<()>> {
            let (tx, rx) = tokio::sync::oneshot::channel();
            let thread = std::thread::spawn(plane);
            std::thread::spawn(move || tx.send(thread.join()).is_ok());
            rx
        }
        let quick = on_thread(|| std::thread::sleep(Duration::from_millis(50)));
        assert_eq!(join_within(quick, 7, Duration::from_secs(5), every).await, Ok(()));
        let (release, stuck) = std::sync::mpsc::channel::<()>();
        let hung = on_thread(move || {
            // A planner stuck in a solve: ends only when the test lets it.
            match stuck.recv_timeout(Duration::from_secs(30)) {
                Ok(()) | Err(_) => {}
            }
        });
        let started = std::time::Instant::now();
        let out = join_within(hung, 8, Duration::from_millis(200), every).await;
        let err = out.expect_err("a plane that does not stop ends the process");
        assert!(err.contains("term 8") && err.contains("did not stop"), "{err}");
        assert!(started.elapsed() >= Duration::from_millis(200), "it waited the limit out first");
        release.send(()).expect("released");
    }
}
