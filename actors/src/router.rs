//! The Router: collects pending pods into batches (core's window: 1 s idle / 10 s max, or
//! adaptive), then runs one global `core` solve over the cluster (existing nodes and in-flight
//! NodeClaims) and every NodePool: pods that fit existing or in-flight capacity are left to the
//! scheduler, the rest go to the pool the solve routed them to (the highest-weight one they
//! fit). A pool that cannot place pods sends them back (one way); the Router offers them to the
//! pools they have not tried yet.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use dovetail_cluster::ClusterView;
use dovetail_core::clock::Clock;
use dovetail_core::ledger::Millis;
use dovetail_core::plane::{Batch, BatchWindow, Latencies};
use dovetail_core::pod::{Pod, PodKey};
use dovetail_core::scheduling::{self, PoolInput, SolveOptions};

use crate::millis;
use crate::pool::{NodePoolActor, Provision, Unplaced};
use crate::trace::{self, Cause};

/// Pods that became pending (from the cluster watch).
#[derive(Message)]
#[rtype(result = "()")]
pub struct PodsPending {
    pub pods: Vec<Pod>,
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
    /// Per pod, from its arrival at the Router to its decision (placed on existing or
    /// in-flight capacity, or sent to a pool), milliseconds of the plane's clock.
    pub latency: Latencies,
}

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
    /// Pools each pod was offered to in this batch.
    tried: BTreeMap<PodKey, BTreeSet<String>>,
    /// When each pod not yet decided arrived.
    arrived: BTreeMap<PodKey, Millis>,
    stats: RouterStats,
}

impl Router {
    pub fn new(
        window: BatchWindow,
        cluster: Arc<dyn ClusterView>,
        clock: Arc<dyn Clock>,
        pools: Vec<RoutedPool>,
    ) -> Self {
        Router {
            window,
            cluster,
            clock,
            pools,
            queue: BTreeMap::new(),
            batch: Batch::default(),
            timer: None,
            tried: BTreeMap::new(),
            arrived: BTreeMap::new(),
            stats: RouterStats::default(),
        }
    }

    /// A restart: the timer went with the old context; the queued pods stay.
    pub(crate) fn restarting(&mut self) {
        self.timer = None;
    }

    /// (Re)arms the timer for the batch's closing time.
    fn arm(&mut self, ctx: &mut Context<Self>) {
        if let Some(h) = self.timer.take() {
            ctx.cancel_future(h);
        }
        let Some(at) = self.batch.closes_at(&self.window) else { return };
        let wait = Duration::from_millis(at.saturating_sub(millis(self.clock.now())));
        self.timer = Some(ctx.run_later(wait, |act, ctx| {
            act.timer = None;
            if act.batch.is_due(&act.window, millis(act.clock.now())) {
                act.close(ctx);
            } else {
                act.arm(ctx);
            }
        }));
    }

    /// Solves `pods` over the pools each has not tried and sends every pool its share.
    /// `causes` is parallel to `pods` (pods a pool gave back carry the trace of their
    /// decision), or empty.
    fn route(&mut self, pods: Vec<Pod>, causes: Vec<Cause>, with_existing: bool) {
        if pods.is_empty() {
            return;
        }
        // One view of the cluster for every group. Pods bound or gone since they were queued
        // are dropped, and the rest are taken as the cluster has them now: a batch that waited
        // must not provision for pods the scheduler has placed meanwhile.
        let snap = self.cluster.snapshot();
        let before = pods.len();
        // (the pod as the cluster has it, its index in `pods`)
        let live: Vec<(&Arc<Pod>, usize)> = pods
            .iter()
            .enumerate()
            .filter_map(|(i, p)| Some((snap.pods.get(&p.key).filter(|c| c.node_name.is_none() && !c.terminal)?, i)))
            .collect();
        self.stats.stale += (before - live.len()) as u64;
        // At a batch close, arrivals of pods neither routed now nor queued again are dropped
        // (bound, deleted, or left unschedulable by an earlier batch: a resend restarts their
        // clock), so the map stays as large as the pending queue.
        if with_existing {
            let keys: BTreeSet<&PodKey> = live.iter().map(|(p, _)| &p.key).collect();
            self.arrived.retain(|k, _| keys.contains(k) || self.queue.contains_key(k));
        }
        // Pods are grouped by the pools still open to them; each group is one solve.
        let mut groups: BTreeMap<Vec<usize>, Vec<usize>> = BTreeMap::new();
        for (k, (p, _)) in live.iter().enumerate() {
            let tried = self.tried.get(&p.key);
            let open: Vec<usize> = (0..self.pools.len())
                .filter(|&i| tried.is_none_or(|t| !t.contains(&self.pools[i].input.pool.name)))
                .collect();
            groups.entry(open).or_default().push(k);
        }
        let nodes = if with_existing { snap.capacity_nodes() } else { Vec::new() };
        for (open, group) in groups {
            let pods: Vec<Pod> = group.iter().map(|&k| live[k].0.as_ref().clone()).collect();
            // Untraced senders send no causes; none are made up for them.
            let causes: Vec<Cause> = if causes.is_empty() {
                Vec::new()
            } else {
                group.iter().map(|&k| trace::cause_at(&causes, live[k].1)).collect()
            };
            let mut decisions = Decisions::open(&pods, &causes, self.stats.batches);
            if open.is_empty() {
                self.stats.unschedulable += pods.len() as u64;
                for (i, p) in pods.iter().enumerate() {
                    self.arrived.remove(&p.key);
                    decisions.unschedulable(i, "every NodePool was tried");
                }
                decisions.record();
                continue;
            }
            let inputs: Vec<PoolInput> = open.iter().map(|&i| self.pools[i].input.clone()).collect();
            let snapshot = snap.scheduling_input(nodes.clone(), inputs);
            let simulating =
                decisions.children(|d| tracing::info_span!(parent: d, "router.simulate", pods = pods.len()));
            let results = scheduling::solve(&snapshot, &pods, &SolveOptions::default());
            drop(simulating);
            let now = millis(self.clock.now());
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
            self.stats.on_existing += results.existing.iter().map(|e| e.pods.len() as u64).sum::<u64>();
            self.stats.unschedulable += results.errors.len() as u64;
            let mut per_pool: BTreeMap<usize, (Vec<Pod>, Vec<Cause>)> = BTreeMap::new();
            for c in &results.claims {
                let pool = open[c.pool];
                let (to, causes) = per_pool.entry(pool).or_default();
                for &i in &c.pods {
                    to.push(pods[i].clone());
                    if let Some(cause) = decisions.routed(i) {
                        causes.push(cause);
                    }
                }
            }
            decisions.record();
            for (pool, (pods, causes)) in per_pool {
                let name = self.pools[pool].input.pool.name.clone();
                for p in &pods {
                    self.tried.entry(p.key.clone()).or_default().insert(name.clone());
                }
                self.stats.routed += pods.len() as u64;
                let msg = Provision { pods, causes, daemonsets: snapshot.daemonsets.clone() };
                if let Err(SendError::Full(msg)) | Err(SendError::Closed(msg)) = self.pools[pool].actor.try_send(msg) {
                    let actor = self.pools[pool].actor.clone();
                    actix::spawn(async move {
                        let _ = actor.send(msg).await;
                    });
                }
            }
        }
    }

    fn close(&mut self, ctx: &mut Context<Self>) {
        let _ = ctx;
        self.batch.close();
        self.stats.batches += 1;
        self.tried.clear();
        let pods: Vec<Pod> = std::mem::take(&mut self.queue).into_values().collect();
        self.route(pods, Vec::new(), true);
    }
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

impl Actor for Router {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        ctx.set_mailbox_capacity(1024);
        // After a restart: the batch that was open.
        if !self.queue.is_empty() {
            self.arm(ctx);
        }
    }
}

impl Handler<PodsPending> for Router {
    type Result = ();

    fn handle(&mut self, msg: PodsPending, ctx: &mut Context<Self>) {
        let now = millis(self.clock.now());
        for p in msg.pods {
            self.arrived.entry(p.key.clone()).or_insert(now);
            if self.queue.insert(p.key.clone(), p).is_none() {
                self.batch.arrive(now);
            }
        }
        self.arm(ctx);
    }
}

impl Handler<Unplaced> for Router {
    type Result = ();

    fn handle(&mut self, msg: Unplaced, _: &mut Context<Self>) {
        self.stats.rerouted += msg.pods.len() as u64;
        // Existing capacity was offered already; the next pools are.
        self.route(msg.pods, msg.causes, false);
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
