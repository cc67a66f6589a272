//! The NodePoolActor: one per NodePool, a shell over two planners.
//!
//! - [`provision`]: the pods the Router hands the pool become a round
//!   (`core::provisioning::plan_round`, solved off the arbiter on the blocking pool), reserved
//!   in the ledger in one entry; the granted claims' NodeClaims are created by the executor
//!   and handed to their zones' actors; what the pool could not place goes back to the Router.
//! - [`reconcile`]: on a timer, `core::lifecycle::reconcile` (also off the arbiter) plans the
//!   claims' lifecycle from the ledger and the cluster; its steps are proposed in one entry,
//!   and once they committed in the current term its effects run: cluster effects on the
//!   executor, launches and terminations on the zone actors.
//! - [`follow`]: the traces of launched claims, until their pods bind.
//!
//! The actor keeps only what is under way (rounds, launches asked, retries); what was decided
//! is in the ledger, so a restart (or a new leader) resumes from there.

mod disrupt;
mod follow;
mod provision;
mod reconcile;

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::sync::{Arc, Mutex};

use actix::prelude::*;
use dovetail_cloud::{CloudError, CloudProvider, NodeClass};
use dovetail_cluster::{ClusterView, ClusterWriter};
use dovetail_core::catalog::InstanceType;
use dovetail_core::clock::{Clock, to_millis};
use dovetail_core::labels;
use dovetail_core::ledger::{Millis, Term};
use dovetail_core::lifecycle::Memory;
use dovetail_core::nodepool::NodePool;
use dovetail_core::plane::Names;
use dovetail_core::pod::{Pod, PodKey};
use dovetail_raft::Ledger;

pub use disrupt::{Disrupt, GetDecisions};
pub use provision::{LaunchNow, Provision};
pub use reconcile::Reconcile;

use crate::config::Config;
use crate::errors::Errors;
use crate::executor::Executor;
use crate::trace::Cause;
use crate::zone::{LaunchOutcome, Terminated, ZoneActor};

/// Pods a pool could not place, back to the Router for the next pool.
#[derive(Message, Clone, Debug)]
#[rtype(result = "()")]
pub struct Unplaced {
    pub pool: String,
    pub pods: Vec<Pod>,
    /// The trace each pod's next decision joins, parallel to `pods` (empty when untraced).
    pub causes: Vec<Cause>,
    pub reason: String,
}

/// Deletes a claim gracefully, as `kubectl delete nodeclaim` does: the NodeClaim is marked
/// for deletion and the lifecycle drains and terminates it through its finalizer.
#[derive(Message)]
#[rtype(result = "()")]
pub struct DeleteClaim {
    pub claim: String,
}

/// The NodePool changed at run time (limits, weight, requirements, its NodeClass or instance
/// types): rounds from now on use it; claims made before keep what they were made with.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Reconfigure {
    pub pool: NodePool,
    pub types: Arc<Vec<InstanceType>>,
    pub node_class: NodeClass,
}

/// The NodePool is no longer provisioned for (deleted, invalid, or its NodeClass gone): pods
/// sent to it go back to the Router; its claims' lifecycle goes on (a deleted NodePool's
/// NodeClaims are deleted by the garbage collector and drained here).
#[derive(Message)]
#[rtype(result = "()")]
pub struct Retire;

/// Counters.
#[derive(Message)]
#[rtype(result = "PoolStats")]
pub struct GetPoolStats;

#[derive(Clone, Debug, Default, PartialEq, Eq, MessageResponse)]
pub struct PoolStats {
    pub rounds: u64,
    pub claims_created: u64,
    pub launched: u64,
    /// Claims launched again after insufficient capacity (in another zone, or later).
    pub relaunched: u64,
    /// Claims released with their pods sent back.
    pub released: u64,
    pub registered: u64,
    pub initialized: u64,
    /// Claims that started terminating.
    pub terminating: u64,
    /// Claims past a liveness timeout.
    pub expired: u64,
    /// Registered claims whose node went away (deleted when its instance was gone: a spot
    /// reclaim, a lost zone): terminated, and their pods provisioned for again.
    pub lost: u64,
    /// Launches of claims found reserved or launching with no launch under way here (after a
    /// restart, or for a new leader).
    pub resumed: u64,
    pub evicted: u64,
    /// Pods deleted past the terminationGracePeriod (PDBs and do-not-disrupt bypassed).
    pub force_deleted: u64,
    pub terminated: u64,
    /// Claim ids the ledger refused as live already, renamed.
    pub renamed: u64,
    /// Pods sent again while a claim of this pool was being made or launched for them (a
    /// resend before the NodeClaim shows in the Router's view): not provisioned twice.
    pub already_held: u64,
    /// Reconciles skipped because the view was not synced.
    pub unsynced: u64,
    /// Disruption commands proposed.
    pub commands_proposed: u64,
    /// Nodes terminated by a disruption command (their replacements up).
    pub disrupted: u64,
    /// Nodes terminated for outliving their `expireAfter`.
    pub expired_nodes: u64,
    /// Disruption commands ended without completing.
    pub rolled_back: u64,
}

/// Pods with the trace of each (the pool round's span of their decision; empty untraced).
#[derive(Default)]
pub(crate) struct Traced {
    pub(crate) pods: Vec<Pod>,
    pub(crate) causes: Vec<Cause>,
}

impl Traced {
    pub(crate) fn push(&mut self, pod: Pod, cause: Cause) {
        if cause.is_traced() {
            self.causes.resize(self.pods.len(), Cause::default());
            self.causes.push(cause);
        } else if !self.causes.is_empty() {
            self.causes.push(cause);
        }
        self.pods.push(pod);
    }
}

/// The seams and neighbours a NodePoolActor works with.
#[derive(Clone)]
pub struct PoolWiring {
    pub view: Arc<dyn ClusterView>,
    pub cluster: Arc<dyn ClusterWriter>,
    pub ledger: Arc<dyn Ledger>,
    pub clock: Arc<dyn Clock>,
    pub zones: BTreeMap<String, Addr<ZoneActor>>,
    pub router: Recipient<Unplaced>,
    pub executor: Executor,
    pub errors: Arc<Errors>,
    pub config: Arc<Config>,
    /// Read for drift (`CloudProvider::list`, `is_drifted`); the zone actors launch and
    /// terminate.
    pub cloud: Arc<dyn CloudProvider>,
    /// The Router's nominations (its nodes are not disrupted while nominated).
    pub nominations: crate::nominate::Nominations,
}

/// The actor.
pub struct NodePoolActor {
    pool: NodePool,
    types: Arc<Vec<InstanceType>>,
    node_class: NodeClass,
    view: Arc<dyn ClusterView>,
    ledger: Arc<dyn Ledger>,
    clock: Arc<dyn Clock>,
    zones: BTreeMap<String, Addr<ZoneActor>>,
    router: Recipient<Unplaced>,
    executor: Executor,
    errors: Arc<Errors>,
    cfg: Arc<Config>,
    names: Names,
    /// The lifecycle planner's memory; taken while a reconcile plans off the arbiter.
    memory: Option<Memory>,
    /// Claims of rounds still reserving or creating them (the lifecycle leaves them alone).
    busy: Arc<Mutex<BTreeSet<String>>>,
    /// Claims handed to a zone actor, not yet answered, with when: after `ask_again_after`
    /// without an answer (a reply dropped at a full mailbox) a claim is asked again (the zone
    /// answers each claim once however often it is asked).
    launching: BTreeMap<String, Millis>,
    /// Claims whose last launch or termination failed, with when to ask again.
    retry_at: BTreeMap<String, Millis>,
    /// Claims whose last launch found no capacity (their next launch is a relaunch), with
    /// whether the relaunch was counted (a claim counts once, however many zones it tries).
    ice: BTreeMap<String, bool>,
    /// Claims whose termination was asked and not answered, with when (as `launching`).
    terminating: BTreeMap<String, Millis>,
    /// The pods (and traces) of claims this actor launched, until launched or released.
    pods: BTreeMap<String, Traced>,
    /// Pods of rounds under way (their claims being reserved and created).
    in_round: HashSet<PodKey>,
    /// The last plan's steps are being committed or its cluster effects run: the next
    /// reconcile waits for them (it
    /// would plan the same writes again from a view that does not show them yet, and the
    /// queued work would grow with every tick while the writes fall behind).
    effecting: bool,
    following: BTreeMap<String, follow::Follow>,
    /// Pods to give back that found the Router's mailbox full: sent again on the next tick.
    outbox: Vec<Unplaced>,
    round: u64,
    stats: PoolStats,
    /// Something happened since the last reconcile that its plan did not see (an answer, a
    /// round, a plan that asked for something): the next tick reconciles.
    dirty: bool,
    /// The cluster's resource version the last reconcile read, and when it started.
    seen_version: Option<u64>,
    last_reconcile: Millis,
    /// The term the last reconcile read: a new one (a failover) is not quiet.
    seen_term: Term,
    /// No longer provisioned for (see [`Retire`]).
    retired: bool,
    /// The disruption planner's memory; taken while a round plans.
    disruption_memory: Option<dovetail_core::disruption::Memory>,
    /// Every node's last disruption decision, by claim.
    decisions: BTreeMap<String, dovetail_core::disruption::Decision>,
    /// Proposals and writes of the last disruption round still under way: no round starts
    /// until they are done.
    disruption_in_flight: usize,
    cloud: Arc<dyn CloudProvider>,
    /// The pool's claims whose instance the cloud provider reports drifted, with its reason,
    /// as of the last check.
    cloud_drift: BTreeMap<String, String>,
    /// When drift was last asked of the cloud; whether a check is under way.
    drift_checked: Option<Millis>,
    drift_checking: bool,
    nominations: crate::nominate::Nominations,
}

impl NodePoolActor {
    /// The pool launches only in zones that have a ZoneActor (its node class's subnets): the
    /// pool's requirements are narrowed to them.
    pub fn new(pool: NodePool, types: Arc<Vec<InstanceType>>, node_class: NodeClass, w: PoolWiring) -> Self {
        let pool = Self::zoned(pool, &w.zones);
        // Claim names must differ between restarts and control nodes: the clock and the
        // pool seed them (the ledger refuses the rare live duplicate).
        let seed = w.clock.now().as_nanos() as u64
            ^ pool.name.bytes().fold(7u64, |h, b| h.wrapping_mul(131).wrapping_add(u64::from(b)));
        NodePoolActor {
            pool,
            types,
            node_class,
            view: w.view,
            ledger: w.ledger,
            clock: w.clock,
            zones: w.zones,
            router: w.router,
            executor: w.executor,
            errors: w.errors,
            cfg: w.config,
            names: Names::new(seed),
            memory: Some(Memory::default()),
            busy: Arc::new(Mutex::new(BTreeSet::new())),
            launching: BTreeMap::new(),
            retry_at: BTreeMap::new(),
            ice: BTreeMap::new(),
            terminating: BTreeMap::new(),
            pods: BTreeMap::new(),
            in_round: HashSet::new(),
            effecting: false,
            following: BTreeMap::new(),
            outbox: Vec::new(),
            round: 0,
            stats: PoolStats::default(),
            dirty: true,
            seen_version: None,
            last_reconcile: 0,
            seen_term: Term::default(),
            retired: false,
            disruption_memory: Some(dovetail_core::disruption::Memory::default()),
            decisions: BTreeMap::new(),
            disruption_in_flight: 0,
            cloud: w.cloud,
            cloud_drift: BTreeMap::new(),
            drift_checked: None,
            drift_checking: false,
            nominations: w.nominations,
        }
    }

    /// The actor starts retired (see [`Retire`]).
    pub fn retired(mut self) -> Self {
        self.retired = true;
        self
    }

    /// The pool narrowed to the zones that have a ZoneActor.
    fn zoned(mut pool: NodePool, zones: &BTreeMap<String, Addr<ZoneActor>>) -> NodePool {
        pool.requirements
            .add(labels::ZONE, dovetail_core::requirements::Requirement::is_in(zones.keys().map(String::as_str)));
        pool
    }

    fn now(&self) -> Millis {
        self.clock.now_millis()
    }

    /// Whether a launch or termination asked at `at` is still waiting for its answer: after
    /// `ask_again_after` it is taken as lost and asked again.
    fn still_asked(&self, at: Option<&Millis>) -> bool {
        let wait = to_millis(self.cfg.ask_again_after);
        at.is_some_and(|at| self.now().saturating_sub(*at) < wait)
    }

    /// Pods go back to the Router: `try_send`; a full mailbox keeps them for the next tick
    /// (bounded: past the pool's mailbox size the oldest are dropped, and the feed sends
    /// pods that stay pending again).
    fn give_back(&mut self, pods: Traced, reason: String) {
        if pods.pods.is_empty() {
            return;
        }
        let msg = Unplaced { pool: self.pool.name.clone(), pods: pods.pods, causes: pods.causes, reason };
        self.send_back(msg);
    }

    fn send_back(&mut self, msg: Unplaced) {
        match self.router.try_send(msg) {
            Ok(()) => {}
            Err(SendError::Full(msg)) => {
                if self.outbox.len() >= self.cfg.mailboxes.pool {
                    let dropped = self.outbox.remove(0);
                    self.errors.note(
                        "give_back",
                        "outbox_full",
                        &self.pool.name,
                        &format!("{} pods", dropped.pods.len()),
                    );
                }
                self.outbox.push(msg);
            }
            Err(SendError::Closed(msg)) => {
                self.errors.warn("give_back", "closed", &self.pool.name, &format!("{} pods", msg.pods.len()));
            }
        }
    }

    fn flush_outbox(&mut self) {
        for msg in std::mem::take(&mut self.outbox) {
            self.send_back(msg);
        }
    }

    /// A restart: the work that was under way is gone with the old context. Rounds being
    /// reserved are resolved from the ledger and the cluster; launches and terminations are
    /// asked again by the next reconcile (the zone and the cloud answer each claim once).
    pub(crate) fn restarting(&mut self) {
        // The rounds' futures went with the old context.
        self.in_round.clear();
        self.effecting = false;
        self.launching.clear();
        self.terminating.clear();
        self.retry_at.clear();
        if let Ok(mut busy) = self.busy.lock() {
            busy.clear();
        }
        if self.memory.is_none() {
            self.memory = Some(Memory::default());
        }
        if self.disruption_memory.is_none() {
            self.disruption_memory = Some(dovetail_core::disruption::Memory::default());
        }
        self.disruption_in_flight = 0;
        self.drift_checking = false;
        self.dirty = true;
    }

    /// Whether the next tick may skip its reconcile: nothing changed in the cluster since the
    /// last one, nothing was answered or planned, no retry or lost answer is due, and the last
    /// one is younger than `quiet_reconcile_every` (which bounds the delay a time-based
    /// deadline, such as a liveness timeout or a drain's deadline, may see).
    fn quiet(&self) -> bool {
        let now = self.now();
        // The version notified last (a snapshot would copy the view's maps to say it).
        let version = *self.view.changes().borrow();
        !self.dirty
            && self.seen_version == Some(version)
            && self.ledger.leadership().borrow().term == self.seen_term
            && now.saturating_sub(self.last_reconcile) < to_millis(self.cfg.quiet_reconcile_every)
            && self.retry_at.values().all(|at| *at > now)
            && self.launching.values().chain(self.terminating.values()).all(|at| self.still_asked(Some(at)))
    }

    /// Waits before asking again after a failure: the throttle's retry-after (capped), else
    /// the configured wait.
    fn retry_later(&mut self, claim: &str, error: &CloudError) {
        let wait = match error {
            CloudError::Throttled { retry_after, .. } => (*retry_after).min(self.cfg.zone.max_retry_wait),
            _ => self.cfg.retry_after_error,
        };
        self.retry_at.insert(claim.to_string(), self.now().saturating_add(to_millis(wait)));
    }
}

impl Actor for NodePoolActor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        ctx.set_mailbox_capacity(self.cfg.mailboxes.pool);
        if self.cfg.disruption.enabled {
            ctx.run_interval(self.cfg.disruption.every, |act, ctx| act.disrupt(ctx));
        }
        ctx.run_interval(self.cfg.reconcile_every, |act, ctx| {
            act.flush_outbox();
            // A quiet pool (nothing changed in the cluster, nothing answered, nothing planned
            // last time) reconciles every `quiet_reconcile_every` only: its plan would be the
            // same but for time-based deadlines, which that interval bounds.
            if !act.quiet() {
                act.reconcile(ctx);
            }
        });
    }

    fn stopped(&mut self, _: &mut Context<Self>) {
        self.executor.metrics().budgets.forget(&self.pool.name);
    }
}

impl Handler<LaunchOutcome> for NodePoolActor {
    type Result = ();

    fn handle(&mut self, msg: LaunchOutcome, ctx: &mut Context<Self>) {
        self.launching.remove(&msg.claim);
        match &msg.result {
            Ok(inst) => {
                self.stats.launched += 1;
                self.ice.remove(&msg.claim);
                self.retry_at.remove(&msg.claim);
                if let Some(pods) = self.pods.remove(&msg.claim) {
                    self.follow(&msg.claim, inst, pods, msg.causes);
                }
            }
            Err(e) => {
                if matches!(e, CloudError::InsufficientCapacity { .. }) {
                    // The ledger has it Reserved again: the next reconcile picks another zone.
                    self.ice.entry(msg.claim.clone()).or_insert(false);
                } else {
                    self.retry_later(&msg.claim, e);
                }
            }
        }
        // What the ledger now holds is acted on at once.
        self.reconcile(ctx);
    }
}

impl Handler<Terminated> for NodePoolActor {
    type Result = ();

    fn handle(&mut self, msg: Terminated, ctx: &mut Context<Self>) {
        self.terminating.remove(&msg.claim);
        match &msg.result {
            Ok(()) => {
                self.stats.terminated += 1;
                self.retry_at.remove(&msg.claim);
                self.reconcile(ctx);
            }
            Err(e) => self.retry_later(&msg.claim, e),
        }
    }
}

impl Handler<DeleteClaim> for NodePoolActor {
    type Result = ();

    fn handle(&mut self, msg: DeleteClaim, ctx: &mut Context<Self>) {
        let effect = dovetail_core::effect::Effect::new(&msg.claim, dovetail_core::effect::Action::DeleteNodeClaim);
        let (executor, term) = (self.executor.clone(), self.ledger.leadership().borrow().term);
        ctx.spawn(
            async move { executor.run(term, vec![effect]).await }
                .into_actor(self)
                .map(|_, act, ctx| act.reconcile(ctx)),
        );
    }
}

impl Handler<Reconfigure> for NodePoolActor {
    type Result = ();

    fn handle(&mut self, msg: Reconfigure, ctx: &mut Context<Self>) {
        self.pool = Self::zoned(msg.pool, &self.zones);
        self.types = msg.types;
        // A changed node class is when instances drift: the next round asks the cloud again.
        if msg.node_class != self.node_class {
            self.drift_checked = None;
        }
        self.node_class = msg.node_class;
        self.retired = false;
        self.dirty = true;
        self.reconcile(ctx);
    }
}

impl Handler<Retire> for NodePoolActor {
    type Result = ();

    fn handle(&mut self, _: Retire, _: &mut Context<Self>) {
        self.retired = true;
        self.executor.metrics().budgets.forget(&self.pool.name);
    }
}

impl Handler<crate::Restart> for NodePoolActor {
    type Result = ();

    fn handle(&mut self, _: crate::Restart, ctx: &mut Context<Self>) {
        ctx.stop();
    }
}

impl Handler<GetPoolStats> for NodePoolActor {
    type Result = PoolStats;

    fn handle(&mut self, _: GetPoolStats, _: &mut Context<Self>) -> PoolStats {
        self.stats.clone()
    }
}
