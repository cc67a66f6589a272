//! The Router: collects pending pods into batches (core's window: 1 s idle / 10 s max, or
//! adaptive), then runs one global `core` solve over the cluster (existing nodes and in-flight
//! NodeClaims) and every NodePool: pods that fit existing or in-flight capacity are left to the
//! scheduler, the rest go to the pool the solve routed them to (the highest-weight one they
//! fit). A pool that cannot place pods sends them back (one way); the Router offers them to the
//! pools they have not tried yet.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use dovetail_cluster::{ClusterView, Snapshot};
use dovetail_core::clock::{Clock, to_millis};
use dovetail_core::ledger::Millis;
use dovetail_core::plane::{Batch, BatchWindow, Latencies, Offers};
use dovetail_core::pod::{Pod, PodKey};
use dovetail_core::scheduling::{self, PoolInput, SolveOptions};

use crate::errors::Errors;
use crate::nominate::Nominations;
use crate::pool::{NodePoolActor, Provision, Unplaced};
use crate::trace::{self, Cause};

/// Pods that became pending (from the cluster watch).
#[derive(Message)]
#[rtype(result = "()")]
pub struct PodsPending {
    pub pods: Vec<Pod>,
    /// The pods pending when the plane started (the feed's first send): a whole batch, known
    /// at once, so the batch closes now instead of waiting for more to arrive. A new leader
    /// decides for the pods its predecessor left without the batch window's delay.
    pub backlog: bool,
}

/// Counters.
#[derive(Message)]
#[rtype(result = "RouterStats")]
pub struct GetRouterStats;

#[derive(Clone, Debug, Default, PartialEq, Eq, MessageResponse)]
pub struct RouterStats {
    pub batches: u64,
    /// Pods left to existing or in-flight capacity.
    pub on_existing: u64,
    /// Pods sent to a pool (counting re-offers).
    pub routed: u64,
    /// Pods offered to another pool after one gave them back.
    pub rerouted: u64,
    /// Pods no pool could take this batch.
    pub unschedulable: u64,
    /// Queued pods that were bound or gone by the time their batch closed.
    pub stale: u64,
    /// Pods put back in the queue because their pool's mailbox was full.
    pub requeued: u64,
    /// Per pod, from its arrival at the Router to its decision (placed on existing or
    /// in-flight capacity, or sent to a pool), milliseconds of the plane's clock.
    pub latency: Latencies,
}

/// A NodePool to route to, added or changed at run time (replacing the one of its name).
#[derive(Message)]
#[rtype(result = "()")]
pub struct SetPool(pub RoutedPool);

/// A NodePool no longer routed to (deleted, invalid, or its NodeClass gone): its actor keeps
/// its claims' lifecycle, but no pods go to it.
#[derive(Message)]
#[rtype(result = "()")]
pub struct RemovePool(pub String);

/// A NodePool the Router routes to.
pub struct RoutedPool {
    pub input: PoolInput,
    pub actor: Addr<NodePoolActor>,
}

/// The actor.
pub struct Router {
    window: BatchWindow,
    cluster: Arc<dyn ClusterView>,
    clock: Arc<dyn Clock>,
    pools: Vec<RoutedPool>,
    queue: BTreeMap<PodKey, Pod>,
    batch: Batch,
    timer: Option<SpawnHandle>,
    /// Pods went back to the queue: the batch timer is armed again.
    rearm: bool,
    /// Pools each pod was offered to in this batch.
    offers: Offers,
    solve: SolveOptions,
    mailbox: usize,
    errors: Arc<Errors>,
    metrics: Arc<crate::metrics::Metrics>,
    /// When each pod not yet decided arrived.
    arrived: BTreeMap<PodKey, Millis>,
    stats: RouterStats,
    /// The nodes pods were left to, for disruption to leave alone, and for how long; and
    /// the pods planned onto capacity, held there while pending.
    nominations: Nominations,
    nomination: Millis,
    /// A batch is being solved against existing and in-flight capacity.
    routing: bool,
    /// A batch closed while one was being solved: it closes when that one is done.
    deferred: bool,
}

impl Router {
    pub fn new(
        window: BatchWindow,
        cluster: Arc<dyn ClusterView>,
        clock: Arc<dyn Clock>,
        pools: Vec<RoutedPool>,
    ) -> Self {
        let nomination = crate::nominate::window(window.max, to_millis(crate::feed::FeedConfig::default().resend));
        Router {
            window,
            cluster,
            clock,
            pools,
            queue: BTreeMap::new(),
            batch: Batch::default(),
            timer: None,
            rearm: false,
            offers: Offers::default(),
            solve: SolveOptions::default(),
            mailbox: 1024,
            errors: Arc::new(Errors::new()),
            metrics: Arc::new(crate::metrics::Metrics::new()),
            arrived: BTreeMap::new(),
            stats: RouterStats::default(),
            nominations: Nominations::default(),
            nomination,
            routing: false,
            deferred: false,
        }
    }

    /// Where the nodes pods are left to are nominated (the plane shares it with its pools).
    pub fn nominating(mut self, nominations: Nominations) -> Self {
        self.nominations = nominations;
        self
    }

    /// The plane's settings (solve options, mailbox) and error counters.
    pub fn configured(mut self, cfg: &crate::config::Config, errors: Arc<Errors>) -> Self {
        self.solve = cfg.solve.clone();
        self.mailbox = cfg.mailboxes.router;
        self.nomination = crate::nominate::window_of(cfg);
        self.errors = errors;
        self
    }

    /// Where the solves' durations are counted.
    pub fn metered(mut self, metrics: Arc<crate::metrics::Metrics>) -> Self {
        self.metrics = metrics;
        self
    }

    /// A restart: the timer and a route under way went with the old context; the queued
    /// pods stay.
    pub(crate) fn restarting(&mut self) {
        self.timer = None;
        self.routing = false;
        self.deferred = false;
    }

    /// (Re)arms the timer for the batch's closing time.
    fn arm(&mut self, ctx: &mut Context<Self>) {
        if let Some(h) = self.timer.take() {
            ctx.cancel_future(h);
        }
        let Some(at) = self.batch.closes_at(&self.window) else { return };
        let wait = Duration::from_millis(at.saturating_sub(self.clock.now_millis()));
        self.timer = Some(ctx.run_later(wait, |act, ctx| {
            act.timer = None;
            if act.batch.is_due(&act.window, act.clock.now_millis()) {
                act.close(ctx);
            } else {
                act.arm(ctx);
            }
        }));
    }

    /// Solves `pods` over the pools each has not tried and sends every pool its share. The
    /// work proportional to the pods (reading them as the cluster has them, grouping, the
    /// solves) runs on the blocking pool, so the arbiter's timers (the zones' launch windows)
    /// fire on time during a large one. `causes` is parallel to `pods` (pods a pool gave back
    /// carry the trace of their decision), or empty.
    fn route(&mut self, ctx: &mut Context<Self>, pods: Vec<Pod>, causes: Vec<Cause>, with_existing: bool) {
        if pods.is_empty() {
            return;
        }
        // The snapshot before the holds: a claim it shows had its pods' holds recorded before
        // it was created, so they are read below (off the arbiter).
        let snap = self.cluster.snapshot();
        if with_existing {
            self.routing = true;
        }
        let input = RouteInput {
            snap,
            holds: with_existing.then(|| (self.nominations.clone(), self.clock.now_millis())),
            pods,
            causes,
            with_existing,
            offers: self.offers.clone(),
            pools: self.pools.iter().map(|p| p.input.clone()).collect(),
            opts: self.solve.clone(),
            batch: self.stats.batches,
        };
        // The pools as they are now: the solve's pool indices point into this list, whatever
        // changes while it runs.
        let targets: Vec<(String, Addr<NodePoolActor>)> =
            self.pools.iter().map(|p| (p.input.pool.name.clone(), p.actor.clone())).collect();
        let started = self.clock.now();
        let work = tokio::task::spawn_blocking(move || route_off_thread(input));
        ctx.spawn(work.into_actor(self).map(move |routed, act, ctx| {
            act.metrics.scheduling(act.clock.now().saturating_sub(started).as_secs_f64());
            match routed {
                Ok(r) => act.routed(r, &targets, with_existing),
                Err(e) => act.errors.warn("route", "panic", "router", &e),
            }
            act.rearm_if_requeued(ctx);
            if with_existing {
                act.routing = false;
                if std::mem::take(&mut act.deferred) {
                    act.close(ctx);
                }
            }
        }));
    }

    /// Acts on a route's solves.
    fn routed(&mut self, r: Routed, targets: &[(String, Addr<NodePoolActor>)], with_existing: bool) {
        self.stats.stale += r.stale;
        if !r.nominated.is_empty() {
            let now = self.clock.now_millis();
            let until = now.saturating_add(self.nomination);
            self.nominations.nominate(r.nominated.iter().map(String::as_str), now, until);
            self.nominations.hold(r.left, now, until);
        }
        // At a batch close, arrivals of pods neither routed now nor queued again are dropped
        // (bound, deleted, or left unschedulable by an earlier batch: a resend restarts their
        // clock), so the map stays as large as the pending queue.
        if with_existing {
            let live = &r.live;
            self.arrived.retain(|k, _| live.contains(k) || self.queue.contains_key(k));
        }
        for (mut decisions, pods) in r.everywhere_tried {
            self.stats.unschedulable += pods.len() as u64;
            for (i, p) in pods.iter().enumerate() {
                self.arrived.remove(&p.key);
                decisions.unschedulable(i, "every NodePool was tried");
            }
            decisions.record();
        }
        for (job, pods, results) in r.solved {
            self.apply(job, pods, results, targets);
        }
    }

    /// Acts on one group's solve: pods placed on existing or in-flight capacity are left to
    /// the scheduler, the rest go to the pools the solve routed them to.
    fn apply(
        &mut self,
        job: Job,
        mut pods: Vec<Pod>,
        results: scheduling::Results,
        targets: &[(String, Addr<NodePoolActor>)],
    ) {
        let Job { open, mut decisions, simulating } = job;
        drop(simulating);
        let now = self.clock.now_millis();
        let decided = results
            .existing
            .iter()
            .flat_map(|e| e.pods.iter())
            .chain(results.claims.iter().flat_map(|c| c.pods.iter()));
        for &i in decided {
            if let Some(at) = self.arrived.remove(&pods[i].key) {
                self.stats.latency.record(now.saturating_sub(at));
            }
        }
        for &i in results.existing.iter().flat_map(|e| e.pods.iter()) {
            decisions.on_existing(i);
        }
        for (i, reason) in &results.errors {
            decisions.unschedulable(*i, reason);
        }
        let left: usize = results.existing.iter().map(|e| e.pods.len()).sum();
        if left > 0 {
            // A pod left to capacity that other pods then take waits for the feed's resend:
            // this line is how a slow round tells the two apart.
            let nodes = results.existing.len();
            tracing::info!(pods = left, nodes, "router.route: left pod(s) to existing or in-flight capacity");
        }
        self.stats.on_existing += left as u64;
        self.stats.unschedulable += results.errors.len() as u64;
        let mut per_pool: BTreeMap<usize, (Vec<Pod>, Vec<Cause>)> = BTreeMap::new();
        for c in &results.claims {
            let pool = open[c.pool];
            let (to, causes) = per_pool.entry(pool).or_default();
            for &i in &c.pods {
                // Each pod is on one claim: moved, not copied.
                to.push(std::mem::take(&mut pods[i]));
                if let Some(cause) = decisions.routed(i) {
                    causes.push(cause);
                }
            }
        }
        decisions.record();
        for (pool, (pods, causes)) in per_pool {
            let (name, actor) = &targets[pool];
            for p in &pods {
                self.offers.offered(&p.key, name);
            }
            self.stats.routed += pods.len() as u64;
            let msg = Provision { pods, causes };
            match actor.try_send(msg) {
                Ok(()) => {}
                // Backpressure: the pods wait in the queue for the next batch.
                Err(SendError::Full(msg)) => {
                    self.stats.requeued += msg.pods.len() as u64;
                    for p in msg.pods {
                        self.queue.insert(p.key.clone(), p);
                        self.batch.arrive(now);
                    }
                    self.rearm = true;
                }
                Err(SendError::Closed(msg)) => {
                    self.errors.warn("provision", "closed", name, &format!("{} pods", msg.pods.len()));
                }
            }
        }
    }

    fn close(&mut self, ctx: &mut Context<Self>) {
        if !self.cluster.synced() {
            // Nothing is decided on a view still listing: the batch waits another idle span.
            let idle = Duration::from_millis(self.window.idle.max(1));
            self.timer = Some(ctx.run_later(idle, |act, ctx| {
                act.timer = None;
                act.close(ctx);
            }));
            return;
        }
        if self.routing {
            // One batch is solved against the cluster's capacity at a time: this one waits for
            // the one under way, whose pods then hold what they were planned onto.
            self.deferred = true;
            return;
        }
        self.batch.close();
        self.stats.batches += 1;
        self.offers.clear();
        let pods: Vec<Pod> = std::mem::take(&mut self.queue).into_values().collect();
        self.route(ctx, pods, Vec::new(), true);
    }
}

/// One group's solve, while it runs: the pools open to it and its trace.
struct Job {
    open: Vec<usize>,
    decisions: Decisions,
    simulating: Vec<tracing::Span>,
}

/// What a route reads, moved off the arbiter.
struct RouteInput {
    snap: Arc<dovetail_cluster::Snapshot>,
    /// Where pods planned onto capacity earlier are held, and now (with existing capacity).
    holds: Option<(Nominations, Millis)>,
    pods: Vec<Pod>,
    causes: Vec<Cause>,
    with_existing: bool,
    offers: Offers,
    pools: Vec<PoolInput>,
    opts: SolveOptions,
    batch: u64,
}

/// What a route decided, back on the arbiter.
struct Routed {
    /// Pods bound or gone since they were queued.
    stale: u64,
    /// The pods still pending.
    live: std::collections::HashSet<PodKey>,
    /// Groups every pool was tried for.
    everywhere_tried: Vec<(Decisions, Vec<Pod>)>,
    solved: Vec<(Job, Vec<Pod>, scheduling::Results)>,
    /// The nodes (and in-flight NodeClaims) pods were left to.
    nominated: Vec<String>,
    /// Each pod left to capacity and its node.
    left: Vec<(PodKey, String)>,
}

/// The route's work proportional to its pods: the pods as the cluster has them now (one
/// view for every group: a batch that waited must not provision for pods the scheduler has
/// placed meanwhile), grouped by the pools still open to them, each group solved.
fn route_off_thread(r: RouteInput) -> Routed {
    let RouteInput { snap, holds, pods: queued, causes: queued_causes, with_existing, offers, pools, opts, batch } = r;
    let snap = &snap;
    // (the pod as the cluster has it, its index in `queued`)
    let live: Vec<(&Arc<Pod>, usize)> = queued
        .iter()
        .enumerate()
        .filter_map(|(i, p)| Some((snap.pods.get(&p.key).filter(|c| c.node_name.is_none() && !c.terminal)?, i)))
        .collect();
    let stale = (queued.len() - live.len()) as u64;
    // The pods are solved as the cluster has them: the queued copies go before the solves
    // make theirs (at 300,000 pods, two copies at once are about 250 MB more at the peak).
    drop(queued);
    let names: Vec<&str> = pools.iter().map(|p| p.pool.name.as_str()).collect();
    let groups = offers.groups(live.iter().map(|(p, _)| &p.key), &names);
    let nodes = if with_existing { snap.capacity_nodes() } else { Vec::new() };
    let mut out = Routed {
        stale,
        live: live.iter().map(|(p, _)| p.key.clone()).collect(),
        everywhere_tried: Vec::new(),
        solved: Vec::new(),
        nominated: Vec::new(),
        left: Vec::new(),
    };
    let held = holds.map(|(n, now)| n.held(now)).unwrap_or_default();
    let holding = snap.held_as_bound(&held, &out.live, &nodes);
    let moving = moving_as_bound(snap, &nodes, &holding, &opts);
    for (open, group) in groups {
        let pods: Vec<Pod> = group.iter().map(|&k| live[k].0.as_ref().clone()).collect();
        // Untraced senders send no causes; none are made up for them.
        let causes: Vec<Cause> = if queued_causes.is_empty() {
            Vec::new()
        } else {
            group.iter().map(|&k| trace::cause_at(&queued_causes, live[k].1)).collect()
        };
        let decisions = Decisions::open(&pods, &causes, batch);
        if open.is_empty() {
            out.everywhere_tried.push((decisions, pods));
            continue;
        }
        let inputs: Vec<PoolInput> = open.iter().map(|&i| pools[i].clone()).collect();
        let mut snapshot = snap.scheduling_input(nodes.clone(), inputs);
        snapshot.bound_pods.extend(holding.iter().cloned());
        if !moving.is_empty() {
            snapshot.bound_pods.retain(|p| !moving.contains_key(&p.key));
            snapshot.bound_pods.extend(moving.values().cloned());
        }
        let simulating = decisions.children(|d| tracing::info_span!(parent: d, "router.simulate", pods = pods.len()));
        let results = scheduling::solve(&snapshot, &pods, &opts);
        for e in results.existing.iter().filter(|e| !e.pods.is_empty()) {
            let Some(node) = snapshot.nodes.get(e.node) else { continue };
            out.nominated.push(node.name.clone());
            out.left.extend(e.pods.iter().filter_map(|&i| Some((pods.get(i)?.key.clone(), node.name.clone()))));
        }
        out.solved.push((Job { open, decisions, simulating }, pods, results));
    }
    out
}

/// The pods on their way off nodes being disrupted ([`Snapshot::pods_to_move`]), each as
/// bound where it will go among `nodes` (existing and in-flight capacity, after the pods
/// `holding` it), by key; those that fit nowhere are left out. Karpenter's provisioner
/// simulates them with the pending pods; here they go first: the capacity they are headed for
/// is a disruption's replacements, made for them, and a pending pod left to it would wait
/// while they take it (the soak's drift rounds, before). Nothing is launched for them here:
/// a disruption launched their replacements before taking their nodes, and a pod that fits
/// nowhere is provisioned for once it is pending, as any pod.
fn moving_as_bound(
    snap: &Snapshot,
    nodes: &[dovetail_core::node::Node],
    holding: &[Arc<Pod>],
    opts: &scheduling::SolveOptions,
) -> std::collections::HashMap<PodKey, Arc<Pod>> {
    let mut out = std::collections::HashMap::new();
    if nodes.is_empty() {
        return out;
    }
    let moving: Vec<Pod> = snap
        .pods_to_move()
        .into_iter()
        .map(|p| Pod { node_name: None, nominated_node: None, ..p.as_ref().clone() })
        .collect();
    if moving.is_empty() {
        return out;
    }
    // Existing and in-flight capacity only: no NodePool to launch from.
    let mut input = snap.scheduling_input(nodes.to_vec(), Vec::new());
    input.bound_pods.extend(holding.iter().cloned());
    let moved: std::collections::HashSet<&PodKey> = moving.iter().map(|p| &p.key).collect();
    // Counted where they go, not where they are (their nodes take no pods now).
    input.bound_pods.retain(|p| !moved.contains(&p.key));
    let placed = scheduling::solve(&input, &moving, opts);
    for e in &placed.existing {
        let Some(node) = input.nodes.get(e.node) else { continue };
        for &i in &e.pods {
            if let Some(p) = moving.get(i) {
                out.insert(p.key.clone(), Arc::new(Pod { node_name: Some(node.name.clone()), ..p.clone() }));
            }
        }
    }
    out
}

/// The class decisions of one solve, when traced: a root span `router.route` per class of
/// pods (per class and cause for pods a pool gave back: those join their decision's trace),
/// and what became of each class's pods. Empty when tracing is off.
#[derive(Default)]
struct Decisions {
    spans: Vec<tracing::Span>,
    causes: Vec<Cause>,
    /// Each pod's decision.
    of_pod: Vec<usize>,
    /// Per decision: pods on existing capacity, routed to a pool, unschedulable.
    counts: Vec<(u64, u64, u64)>,
    reasons: Vec<Option<String>>,
}

impl Decisions {
    fn open(pods: &[Pod], causes: &[Cause], batch: u64) -> Self {
        if !trace::enabled() {
            return Decisions::default();
        }
        let mut d = Decisions::default();
        let mut index: std::collections::HashMap<(usize, opentelemetry::trace::SpanId), usize> =
            std::collections::HashMap::new();
        for (i, class) in scheduling::pod_classes(pods).into_iter().enumerate() {
            let cause = trace::cause_at(causes, i);
            let k = *index.entry((class, cause.span_id())).or_insert_with(|| {
                let p = &pods[i].key;
                let span = tracing::info_span!(
                    parent: None,
                    "router.route",
                    pod_class = %format_args!("{}/{}", p.namespace, p.name),
                    pods = tracing::field::Empty,
                    batch,
                    rerouted = cause.is_traced(),
                    pods.on_existing = tracing::field::Empty,
                    pods.routed = tracing::field::Empty,
                    pods.unschedulable = tracing::field::Empty,
                    reason = tracing::field::Empty,
                );
                cause.adopt(&span);
                d.causes.push(Cause::of(&span));
                d.spans.push(span);
                d.spans.len() - 1
            });
            d.of_pod.push(k);
        }
        d.counts = vec![(0, 0, 0); d.spans.len()];
        d.reasons = vec![None; d.spans.len()];
        let mut sizes = vec![0u64; d.spans.len()];
        for &k in &d.of_pod {
            sizes[k] += 1;
        }
        for (span, n) in d.spans.iter().zip(sizes) {
            span.record("pods", n);
        }
        d
    }

    /// A child span of every decision.
    fn children(&self, f: impl Fn(&tracing::Span) -> tracing::Span) -> Vec<tracing::Span> {
        self.spans.iter().map(f).collect()
    }

    fn count(&mut self, pod: usize, f: impl Fn(&mut (u64, u64, u64))) -> Option<usize> {
        let k = *self.of_pod.get(pod)?;
        f(&mut self.counts[k]);
        Some(k)
    }

    fn on_existing(&mut self, pod: usize) {
        self.count(pod, |c| c.0 += 1);
    }

    /// The pod goes to a pool: the cause its pool's work joins.
    fn routed(&mut self, pod: usize) -> Option<Cause> {
        self.count(pod, |c| c.1 += 1).map(|k| self.causes[k].clone())
    }

    fn unschedulable(&mut self, pod: usize, reason: &str) {
        if let Some(k) = self.count(pod, |c| c.2 += 1) {
            self.reasons[k].get_or_insert_with(|| reason.to_string());
        }
    }

    /// Writes the counts onto the spans.
    fn record(&self) {
        for (k, span) in self.spans.iter().enumerate() {
            let (existing, routed, unschedulable) = self.counts[k];
            span.record("pods.on_existing", existing);
            span.record("pods.routed", routed);
            span.record("pods.unschedulable", unschedulable);
            if let Some(reason) = self.reasons[k].as_deref() {
                span.record("reason", reason);
            }
        }
    }
}

impl Router {
    /// Pods a full pool mailbox sent back to the queue wait for the next batch close.
    fn rearm_if_requeued(&mut self, ctx: &mut Context<Self>) {
        if std::mem::take(&mut self.rearm) {
            self.arm(ctx);
        }
    }
}

impl Actor for Router {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        ctx.set_mailbox_capacity(self.mailbox);
        // After a restart: the batch that was open.
        if !self.queue.is_empty() {
            self.arm(ctx);
        }
    }
}

impl Handler<PodsPending> for Router {
    type Result = ();

    fn handle(&mut self, msg: PodsPending, ctx: &mut Context<Self>) {
        let now = self.clock.now_millis();
        for p in msg.pods {
            self.arrived.entry(p.key.clone()).or_insert(now);
            if self.queue.insert(p.key.clone(), p).is_none() {
                self.batch.arrive(now);
            }
        }
        if msg.backlog && self.batch.is_open() {
            if let Some(h) = self.timer.take() {
                ctx.cancel_future(h);
            }
            self.close(ctx);
            return;
        }
        self.arm(ctx);
    }
}

impl Handler<Unplaced> for Router {
    type Result = ();

    fn handle(&mut self, msg: Unplaced, ctx: &mut Context<Self>) {
        self.stats.rerouted += msg.pods.len() as u64;
        // Existing capacity was offered already; the next pools are.
        self.route(ctx, msg.pods, msg.causes, false);
    }
}

impl Handler<SetPool> for Router {
    type Result = ();

    fn handle(&mut self, SetPool(pool): SetPool, _: &mut Context<Self>) {
        let name = pool.input.pool.name.clone();
        match self.pools.iter_mut().find(|p| p.input.pool.name == name) {
            Some(p) => *p = pool,
            None => self.pools.push(pool),
        }
    }
}

impl Handler<RemovePool> for Router {
    type Result = ();

    fn handle(&mut self, RemovePool(name): RemovePool, _: &mut Context<Self>) {
        self.pools.retain(|p| p.input.pool.name != name);
    }
}

impl Handler<crate::Restart> for Router {
    type Result = ();

    fn handle(&mut self, _: crate::Restart, ctx: &mut Context<Self>) {
        ctx.stop();
    }
}

impl Handler<GetRouterStats> for Router {
    type Result = RouterStats;

    fn handle(&mut self, _: GetRouterStats, _: &mut Context<Self>) -> RouterStats {
        self.stats.clone()
    }
}
