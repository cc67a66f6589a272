//! The effect executor: runs the cluster effects planners asked for, as async tasks off the
//! actors' handlers, with bounded concurrency, fenced by the leader's term.
//!
//! **The fencing rule.** An effect runs only if the term its intent committed in is still
//! current on this node ([`dovetail_raft::Leadership::is_current`]), checked right before
//! each API call: a deposed leader's effects never reach the cluster, even those already
//! queued. Patches are applied to a fresh read and written with that read's resource
//! version as a precondition; a `Conflict` (someone wrote in between) is retried from a new
//! read, a bounded number of times. A patch that changes nothing writes nothing. At most one
//! effect of a key ([`Effect::key`]) is in flight: a planner that asks again while the first
//! is under way is told [`Done::InFlight`].
//!
//! Effects of one claim run in the order planned (a node is tainted before it is drained);
//! its evictions then go out together, and claims run side by side. Every failure is logged
//! with the object and the action and counted ([`crate::errors::Errors`]).
//!
//! **Evictions back off per pod**, as Karpenter's eviction queue: a pod whose eviction was
//! refused (its PodDisruptionBudget allows none, several budgets cover it, or the server
//! throttled) is not asked again
//! before a wait that doubles from `eviction_backoff_min` to `eviction_backoff_max`; asked
//! sooner it is told [`Done::BackingOff`]. A pod's first refusal is also a `FailedDraining`
//! Warning event on its node, as Karpenter records, at most one per node every 2 minutes; a
//! pod that several budgets cover gets a `FailedEviction` Warning of its own, naming why.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};

use dovetail_cluster::{ClusterError, ClusterWriter, Event, NodeClaimUpdate, NodeUpdate, ObjectKind};
use dovetail_core::clock::{Clock, to_millis};
use dovetail_core::cluster::{StatusPatch, TERMINATION_FINALIZER};
use dovetail_core::effect::{Action, Effect};
use dovetail_core::ledger::{Millis, Term};
use dovetail_core::pod::PodKey;
use dovetail_raft::Ledger;
use tokio::sync::Semaphore;

use crate::config::ExecutorConfig;
use crate::errors::Errors;
use crate::metrics::Metrics;

/// What became of one effect.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Done {
    /// The cluster changed.
    Applied,
    /// Nothing to change (already so, or the object is gone).
    Unchanged,
    /// An effect of the same key is under way.
    InFlight,
    /// The term it was decided in is over: not run.
    Fenced,
    /// An eviction refused before and still backing off: not asked yet.
    BackingOff,
    Failed(ClusterError),
}

/// The executor (cheap to clone: one per plane, shared by its actors).
#[derive(Clone)]
pub struct Executor {
    inner: Arc<Inner>,
}

struct Inner {
    writer: Arc<dyn ClusterWriter>,
    ledger: Arc<dyn Ledger>,
    permits: Arc<Semaphore>,
    in_flight: Mutex<HashSet<String>>,
    errors: Arc<Errors>,
    metrics: Arc<Metrics>,
    cfg: ExecutorConfig,
    clock: Arc<dyn Clock>,
    /// Refused evictions by pod: when the pod may be asked again, and the wait after that.
    backoff: Mutex<HashMap<PodKey, Backoff>>,
    /// When each node last got a `FailedDraining` event (one per node per
    /// [`DRAIN_EVENT_EVERY`], however many of its pods are refused).
    drain_events: Mutex<HashMap<String, Millis>>,
}

/// How often a node's drain being refused is said again.
const DRAIN_EVENT_EVERY: Millis = 120_000;

/// A refused pod's backoff.
#[derive(Clone, Copy, Debug)]
struct Backoff {
    not_before: Millis,
    wait: Millis,
}

/// Refused pods tracked at most (pods that went some other way leave entries behind: past
/// this, those whose backoff is long over are dropped).
const MAX_BACKOFF_ENTRIES: usize = 10_000;

impl Executor {
    /// An executor writing through `writer`, fenced by `ledger`'s terms, counting into
    /// `errors` and `metrics`; eviction backoffs run on `clock`.
    pub fn new(
        writer: Arc<dyn ClusterWriter>,
        ledger: Arc<dyn Ledger>,
        errors: Arc<Errors>,
        metrics: Arc<Metrics>,
        cfg: ExecutorConfig,
        clock: Arc<dyn Clock>,
    ) -> Self {
        let permits = Arc::new(Semaphore::new(cfg.concurrency.max(1)));
        Executor {
            inner: Arc::new(Inner {
                writer,
                ledger,
                permits,
                in_flight: Mutex::new(HashSet::new()),
                errors,
                metrics,
                cfg,
                clock,
                backoff: Mutex::new(HashMap::new()),
                drain_events: Mutex::new(HashMap::new()),
            }),
        }
    }

    /// Where the plane's counts go.
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.inner.metrics
    }

    /// Runs cluster `effects` decided in `term` (cloud effects are the zone actors' and are
    /// refused here) and returns each one's result, in order.
    pub async fn run(&self, term: Term, effects: Vec<Effect>) -> Vec<(Effect, Done)> {
        // Per claim, in the order planned.
        let mut by_claim: BTreeMap<String, Vec<(usize, Effect)>> = BTreeMap::new();
        for (i, e) in effects.into_iter().enumerate() {
            by_claim.entry(e.claim.clone()).or_default().push((i, e));
        }
        let mut tasks = tokio::task::JoinSet::new();
        for (_, list) in by_claim {
            let me = self.clone();
            tasks.spawn(async move { me.run_claim(term, list).await });
        }
        let mut out: Vec<(usize, Effect, Done)> = Vec::new();
        while let Some(done) = tasks.join_next().await {
            match done {
                Ok(results) => out.extend(results),
                Err(e) => self.inner.errors.warn("execute", "task", "effects", &e),
            }
        }
        out.sort_by_key(|(i, _, _)| *i);
        out.into_iter().map(|(_, e, d)| (e, d)).collect()
    }

    /// Runs one effect now (in the caller's task).
    pub async fn run_one(&self, term: Term, effect: &Effect) -> Done {
        let key = effect.key();
        {
            let mut f = self.inner.in_flight.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            if !f.insert(key.clone()) {
                return Done::InFlight;
            }
        }
        // Released however the task ends, cancelled included (an actor that stops drops its
        // futures): a key left marked would refuse that effect forever.
        self.inner.metrics.effects(1, 0);
        let _guard = InFlightGuard { executor: &self.inner, key };
        let Action::Evict(pod) = &effect.action else {
            return self.fenced(term, effect).await;
        };
        if self.backing_off(pod) {
            return Done::BackingOff;
        }
        let done = self.fenced(term, effect).await;
        self.after_eviction(term, effect, pod, &done).await;
        done
    }

    /// Whether `pod` was refused and its wait is not over.
    fn backing_off(&self, pod: &PodKey) -> bool {
        let now = self.inner.clock.now_millis();
        let b = self.inner.backoff.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        b.get(pod).is_some_and(|b| now < b.not_before)
    }

    /// Starts or doubles a refused pod's wait (the first refusal is a `FailedDraining` event
    /// on its node), or forgets it once it went.
    async fn after_eviction(&self, term: Term, effect: &Effect, pod: &PodKey, done: &Done) {
        let refused = matches!(
            done,
            Done::Failed(
                ClusterError::DisruptionBudget { .. } | ClusterError::ManyPdbs { .. } | ClusterError::Throttled { .. }
            )
        );
        let first = {
            let mut b = self.inner.backoff.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            if !refused {
                b.remove(pod);
                return;
            }
            let now = self.inner.clock.now_millis();
            let (min, max) =
                (to_millis(self.inner.cfg.eviction_backoff_min), to_millis(self.inner.cfg.eviction_backoff_max));
            if b.len() >= MAX_BACKOFF_ENTRIES {
                b.retain(|_, e| e.not_before.saturating_add(max) > now);
            }
            let first = !b.contains_key(pod);
            let e = b.entry(pod.clone()).or_insert(Backoff { not_before: now, wait: min });
            e.not_before = now.saturating_add(e.wait);
            e.wait = e.wait.saturating_mul(2).min(max);
            first
        };
        match (first, done) {
            (true, Done::Failed(ClusterError::DisruptionBudget { pdb, .. })) => {
                self.failed_draining(term, effect, pod, pdb).await;
            }
            (true, Done::Failed(e @ ClusterError::ManyPdbs { .. })) => self.many_pdbs(term, pod, e).await,
            _ => {}
        }
    }

    /// A Warning on the pod itself when several PodDisruptionBudgets cover it: the eviction
    /// API refuses it until its owner mends the budgets, so the drain holds there. Said at its
    /// first refusal (and again once its backoff was forgotten), not at every retry.
    async fn many_pdbs(&self, term: Term, pod: &PodKey, e: &ClusterError) {
        let Ok(_permit) = self.inner.permits.clone().acquire_owned().await else { return };
        let event = Event {
            kind: ObjectKind::Pod,
            name: pod.to_string(),
            warning: true,
            reason: "FailedEviction".into(),
            message: format!(
                "Cannot evict: {e}. Make at most one PodDisruptionBudget select it; its node's \
                 drain waits until then"
            ),
        };
        if self.gate(term).await.is_err() {
            return;
        }
        if let Err(e) = self.inner.writer.record_event(event).await {
            self.inner.errors.warn("event", e.kind(), &format!("pod/{pod}"), &e);
        }
    }

    /// Karpenter's `FailedDraining` Warning on the node of the claim being drained, at most
    /// once per node per [`DRAIN_EVENT_EVERY`] (its calls within the executor's bound).
    async fn failed_draining(&self, term: Term, effect: &Effect, pod: &PodKey, pdb: &str) {
        let Ok(_permit) = self.inner.permits.clone().acquire_owned().await else { return };
        let node = match self.inner.writer.get_nodeclaim(&effect.claim).await {
            Ok(nc) => nc.status.node_name.clone(),
            Err(e) => {
                self.inner.errors.note("event", e.kind(), &format!("nodeclaim/{}", effect.claim), &e);
                return;
            }
        };
        let Some(node) = node else { return };
        {
            let now = self.inner.clock.now_millis();
            let mut said = self.inner.drain_events.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            said.retain(|_, at| now.saturating_sub(*at) < DRAIN_EVENT_EVERY);
            if said.contains_key(&node) {
                return;
            }
            said.insert(node.clone(), now);
        }
        let why = if pdb.is_empty() { String::new() } else { format!(" ({pdb})") };
        let event = Event {
            kind: ObjectKind::Node,
            name: node.clone(),
            warning: true,
            reason: "FailedDraining".into(),
            message: format!("Failed to drain node, evicting pod {pod} violates a PDB{why}"),
        };
        if self.gate(term).await.is_err() {
            return;
        }
        if let Err(e) = self.inner.writer.record_event(event).await {
            self.inner.errors.warn("event", e.kind(), &format!("node/{node}"), &e);
        }
    }

    async fn run_claim(&self, term: Term, list: Vec<(usize, Effect)>) -> Vec<(usize, Effect, Done)> {
        let (pods, rest): (Vec<_>, Vec<_>) =
            list.into_iter().partition(|(_, e)| matches!(e.action, Action::Evict(_) | Action::DeletePod { .. }));
        let mut out = Vec::with_capacity(pods.len() + rest.len());
        for (i, e) in rest {
            let done = self.run_one(term, &e).await;
            out.push((i, e, done));
        }
        // A drain step's evictions go out together (within the plane's bound).
        let mut evictions = tokio::task::JoinSet::new();
        for (i, e) in pods {
            let me = self.clone();
            evictions.spawn(async move {
                let done = me.run_one(term, &e).await;
                (i, e, done)
            });
        }
        while let Some(done) = evictions.join_next().await {
            match done {
                Ok(r) => out.push(r),
                Err(e) => self.inner.errors.warn("evict", "task", "pods", &e),
            }
        }
        out
    }

    /// Takes a permit, runs (the term checked before every API call), and sees the error.
    async fn fenced(&self, term: Term, effect: &Effect) -> Done {
        let Ok(_permit) = self.inner.permits.clone().acquire_owned().await else {
            return Done::Failed(ClusterError::Unavailable { reason: "the executor is closed".into() });
        };
        let _running = RunningGuard::new(&self.inner.metrics);
        match self.execute(term, effect).await {
            Ok(true) => Done::Applied,
            Ok(false) => Done::Unchanged,
            Err(Stop::Fenced(now)) => {
                let why = format!("decided in term {term}, now {now}");
                self.inner.errors.note(effect.kind(), "fenced", &effect.claim, &why);
                Done::Fenced
            }
            Err(Stop::Failed(e)) => {
                let object = object_of(effect);
                match &e {
                    // Expected now and then: a PDB holds the pod, a conflict outlived the retries.
                    ClusterError::DisruptionBudget { .. }
                    | ClusterError::ManyPdbs { .. }
                    | ClusterError::Conflict { .. } => self.inner.errors.note(effect.kind(), e.kind(), &object, &e),
                    _ => self.inner.errors.warn(effect.kind(), e.kind(), &object, &e),
                }
                Done::Failed(e)
            }
        }
    }

    /// Waits for the writer's pacing (its rate limit, a throttle pause), then refuses to go
    /// on once `term` is over: what runs right before each write, so that no write waits out
    /// a pause after its term was checked.
    async fn gate(&self, term: Term) -> Result<(), Stop> {
        self.inner.writer.ready().await;
        self.check(term)
    }

    /// Refuses to go on once `term` is over.
    fn check(&self, term: Term) -> Result<(), Stop> {
        let current = self.inner.ledger.leadership().borrow().clone();
        if current.is_current(term) { Ok(()) } else { Err(Stop::Fenced(current.term)) }
    }

    /// One effect; whether it changed the cluster. The term is checked right before each
    /// write, after the writer's pacing (a write never waits out a throttle pause after its
    /// check).
    async fn execute(&self, term: Term, effect: &Effect) -> Result<bool, Stop> {
        let w = &self.inner.writer;
        let claim = effect.claim.as_str();
        let gone_is_fine = |r: Result<u64, ClusterError>| match r {
            Ok(_) => Ok(true),
            Err(ClusterError::NotFound { .. }) => Ok(false),
            Err(e) => Err(Stop::Failed(e)),
        };
        self.gate(term).await?;
        match &effect.action {
            Action::CreateNodeClaim(nc) => match w.create_nodeclaim(nc.as_ref().clone()).await {
                Ok(_) => Ok(true),
                // Ours already (a repeated create) is fine; another object of the name is
                // not adopted, nor one on its way out: a claim of a name used before (names
                // are five random characters) whose earlier NodeClaim is still being deleted.
                Err(ClusterError::AlreadyExists { kind, name }) => match w.get_nodeclaim(&nc.name).await {
                    Ok(existing) if existing.spec == nc.spec && !existing.deleting => Ok(false),
                    Ok(_) => Err(Stop::Failed(ClusterError::AlreadyExists { kind, name })),
                    Err(e) => Err(Stop::Failed(e)),
                },
                Err(e) => Err(Stop::Failed(e)),
            },
            Action::PatchStatus(patch) => self.patch_status(term, claim, patch).await,
            Action::DeleteNodeClaim => gone_is_fine(w.delete_nodeclaim(claim).await),
            Action::RemoveFinalizer => {
                self.retrying(term, || async {
                    let Some(nc) = found(w.get_nodeclaim(claim).await)? else { return Ok(false) };
                    if !nc.finalizers.iter().any(|f| f == TERMINATION_FINALIZER) {
                        return Ok(false);
                    }
                    let finalizers = nc.finalizers.iter().filter(|f| *f != TERMINATION_FINALIZER).cloned().collect();
                    self.gate(term).await?;
                    let update = NodeClaimUpdate { finalizers, ..NodeClaimUpdate::of(&nc) };
                    let written = w.update_nodeclaim_metadata(claim, update, nc.resource_version).await;
                    if written.is_ok() {
                        let capacity = nc.spec.labels.get(dovetail_core::labels::CAPACITY_TYPE);
                        let capacity = capacity.map_or("", String::as_str);
                        self.inner.metrics.nodeclaim_terminated(&nc.spec.nodepool, capacity);
                    }
                    written.map(|_| true).map_err(Stop::Failed)
                })
                .await
            }
            Action::Launched { labels, status } => {
                let labelled = self
                    .retrying(term, || async {
                        let Some(nc) = found(w.get_nodeclaim(claim).await)? else { return Ok(false) };
                        if labels.iter().all(|(k, v)| nc.spec.labels.get(k) == Some(v)) {
                            return Ok(false);
                        }
                        let mut update = NodeClaimUpdate::of(&nc);
                        update.labels.extend(labels.iter().cloned());
                        self.gate(term).await?;
                        let written = w.update_nodeclaim_metadata(claim, update, nc.resource_version).await;
                        written.map(|_| true).map_err(Stop::Failed)
                    })
                    .await?;
                let patched = self.patch_status(term, claim, status).await?;
                Ok(labelled || patched)
            }
            Action::PatchNode { node, patch } => {
                self.retrying(term, || async {
                    let Some(n) = found(w.get_node(node).await)? else { return Ok(false) };
                    let Some(patched) = patch.apply(&n) else { return Ok(false) };
                    self.gate(term).await?;
                    let written = w.update_node(node, NodeUpdate::of(&patched), n.resource_version).await;
                    written.map(|_| true).map_err(Stop::Failed)
                })
                .await
            }
            Action::DeleteNode { node } => gone_is_fine(w.delete_node(node).await),
            Action::Evict(pod) => gone_is_fine(w.evict(pod).await),
            Action::DeletePod { pod, grace_seconds } => gone_is_fine(w.delete_pod(pod, *grace_seconds).await),
            Action::Event(e) => w.record_event(e.clone()).await.map(|()| true).map_err(Stop::Failed),
            Action::Launch { .. } | Action::Terminate { .. } => {
                Err(Stop::Failed(ClusterError::Unavailable { reason: format!("{} is a cloud effect", effect.kind()) }))
            }
        }
    }

    /// Patches a NodeClaim's status from a fresh read; whether it changed.
    async fn patch_status(&self, term: Term, claim: &str, patch: &StatusPatch) -> Result<bool, Stop> {
        let w = &self.inner.writer;
        self.retrying(term, || async {
            let Some(nc) = found(w.get_nodeclaim(claim).await)? else { return Ok(false) };
            let Some(status) = patch.apply(&nc.status) else { return Ok(false) };
            self.gate(term).await?;
            let written = w.update_nodeclaim_status(claim, status, nc.resource_version).await;
            written.map(|_| true).map_err(Stop::Failed)
        })
        .await
    }

    /// Runs a read-modify-write until it is not refused with `Conflict`, at most
    /// `conflict_retries` times more, while the term lasts.
    async fn retrying<F, Fut>(&self, term: Term, mut attempt: F) -> Result<bool, Stop>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<bool, Stop>>,
    {
        let mut left = self.inner.cfg.conflict_retries;
        loop {
            match attempt().await {
                Err(Stop::Failed(ClusterError::Conflict { .. })) if left > 0 => {
                    left -= 1;
                    self.check(term)?;
                }
                r => return r,
            }
        }
    }
}

/// A read: the object, `None` when it is gone (nothing to patch), or why it failed.
fn found<T>(r: Result<T, ClusterError>) -> Result<Option<T>, Stop> {
    match r {
        Ok(o) => Ok(Some(o)),
        Err(ClusterError::NotFound { .. }) => Ok(None),
        Err(e) => Err(Stop::Failed(e)),
    }
}

/// Why an effect stopped.
enum Stop {
    /// Its term is over (the current one given).
    Fenced(Term),
    Failed(ClusterError),
}

/// Marks an effect's key in flight while it lives.
struct InFlightGuard<'a> {
    executor: &'a Inner,
    key: String,
}

impl Drop for InFlightGuard<'_> {
    fn drop(&mut self) {
        self.executor.in_flight.lock().unwrap_or_else(std::sync::PoisonError::into_inner).remove(&self.key);
        self.executor.metrics.effects(-1, 0);
    }
}

/// Counts an effect holding a permit (`dovetail_executor_effects_running`) until dropped.
struct RunningGuard<'a>(&'a Metrics);

impl<'a> RunningGuard<'a> {
    fn new(metrics: &'a Metrics) -> Self {
        metrics.effects(0, 1);
        RunningGuard(metrics)
    }
}

impl Drop for RunningGuard<'_> {
    fn drop(&mut self) {
        self.0.effects(0, -1);
    }
}

/// The object an effect writes, for logs.
fn object_of(e: &Effect) -> String {
    match &e.action {
        Action::PatchNode { node, .. } | Action::DeleteNode { node } => format!("node/{node}"),
        Action::Evict(p) | Action::DeletePod { pod: p, .. } => format!("pod/{p}"),
        Action::Event(ev) => format!("event/{}", ev.name),
        _ => format!("nodeclaim/{}", e.claim),
    }
}

#[cfg(test)]
mod tests;
