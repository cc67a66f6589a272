//! Interruption, driven. Consumers long-poll the interruption queues ([`consume`]) and hand
//! each receive's messages to the [`InterruptionActor`], through its bounded mailbox (a full
//! mailbox holds the consumers back). For a batch the actor:
//!
//! 1. parses every body (`core::interruption::parse`); a malformed body or an event dovetail
//!    does not act on is counted, logged once per kind, and deleted;
//! 2. resolves each instance to its claim in the ledger and proposes the batch's notices as
//!    one [`Command::Interrupt`] (the ledger deduplicates by instance: a redelivery changes
//!    nothing);
//! 3. once committed, taints each interrupted node `karpenter.sh/disrupted` and records an
//!    event on its NodeClaim, as Karpenter's;
//! 4. sizes the capacity the interrupted nodes' pods need (`core::interruption::size`: the
//!    provisioning solve on the cluster without those nodes) and proposes it as one
//!    [`Command::ReplaceInterrupted`]; once committed, creates the granted NodeClaims and
//!    asks their pools to reconcile at once (the launch does not wait for a batch window);
//! 5. deletes the batch's messages (one `DeleteMessageBatch` per ten). A batch whose
//!    proposal failed (ledger unavailable, term over) keeps its messages: they come back
//!    after the visibility timeout.
//!
//! The drain is the lifecycle's: it starts once the replacements are ready or the deadline
//! is `drain_lead` away (`core::interruption::drain_now`), and ends by EC2's deadline.

pub mod consume;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use actix::prelude::*;
use dovetail_cloud::{InterruptionQueue, QueueMessage};
use dovetail_cluster::ClusterView;
use dovetail_core::clock::Clock;
use dovetail_core::cluster::{Event, NodePatch, ObjectKind};
use dovetail_core::effect::{Action, Effect};
use dovetail_core::interruption::{self, Going, Kind};
use dovetail_core::ledger::{Command, Entry, Millis, Notice, Outcome, Replacement, Term};
use dovetail_core::plane::{Names, disrupted_taint};
use dovetail_core::provisioning::{planned_claim, unique_claim_name};
use dovetail_core::scheduling::PoolInput;
use dovetail_raft::{Ledger, read_with};

use crate::config::Config;
use crate::errors::Errors;
use crate::executor::Executor;
use crate::pool::{NodePoolActor, Reconcile};

/// One receive's messages, from queue `queue`.
pub struct Batch {
    pub queue: usize,
    pub messages: Vec<QueueMessage>,
    /// When they were received.
    pub received: Millis,
}

impl Message for Batch {
    type Result = Handled;
}

/// What became of a batch.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Handled {
    /// Messages deleted (acted on, duplicates, malformed, not acted on).
    pub deleted: usize,
    /// Messages left in the queue (to be seen again).
    pub kept: usize,
}

/// The NodePools, as the plane routes to them (their replacements are planned with them).
#[derive(Message)]
#[rtype(result = "()")]
pub struct SetPools(pub BTreeMap<String, (PoolInput, Addr<NodePoolActor>)>);

/// The actor's counts so far.
#[derive(Message)]
#[rtype(result = "InterruptionStats")]
pub struct GetInterruptionStats;

/// Counts since the actor started.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct InterruptionStats {
    /// Messages received, by kind (Karpenter's `message_type`; `malformed` for bodies that
    /// did not parse).
    pub received: BTreeMap<String, u64>,
    pub deleted: u64,
    /// Instances recorded as interrupted (acting), and notices the ledger found duplicates.
    pub acted: u64,
    pub duplicates: u64,
    /// Replacement NodeClaims created, and denied by limits.
    pub replacements: u64,
    pub replacements_denied: u64,
    /// Interrupted pods that fit on existing nodes (no new capacity for them).
    pub pods_on_existing: u64,
}

/// The actor.
pub struct InterruptionActor {
    queues: Vec<Arc<dyn InterruptionQueue>>,
    ledger: Arc<dyn Ledger>,
    view: Arc<dyn ClusterView>,
    clock: Arc<dyn Clock>,
    executor: Executor,
    errors: Arc<Errors>,
    cfg: Arc<Config>,
    zones: Vec<String>,
    pools: BTreeMap<String, (PoolInput, Addr<NodePoolActor>)>,
    names: Names,
    /// Kinds of malformed or ignored messages logged already (each is logged once).
    logged: BTreeSet<String>,
    stats: InterruptionStats,
}

/// What the actor is made of.
pub struct InterruptionWiring {
    pub queues: Vec<Arc<dyn InterruptionQueue>>,
    pub ledger: Arc<dyn Ledger>,
    pub view: Arc<dyn ClusterView>,
    pub clock: Arc<dyn Clock>,
    pub executor: Executor,
    pub errors: Arc<Errors>,
    pub cfg: Arc<Config>,
    pub zones: Vec<String>,
}

impl InterruptionActor {
    pub fn new(w: InterruptionWiring) -> Self {
        let seed = w.clock.now().as_nanos() as u64 ^ 0x696e_7465_7272_7570;
        InterruptionActor {
            queues: w.queues,
            ledger: w.ledger,
            view: w.view,
            clock: w.clock,
            executor: w.executor,
            errors: w.errors,
            cfg: w.cfg,
            zones: w.zones,
            pools: BTreeMap::new(),
            names: Names::new(seed),
            logged: BTreeSet::new(),
            stats: InterruptionStats::default(),
        }
    }
}

impl Actor for InterruptionActor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        ctx.set_mailbox_capacity(self.cfg.interruption.mailbox);
    }
}

impl Handler<SetPools> for InterruptionActor {
    type Result = ();

    fn handle(&mut self, msg: SetPools, _: &mut Context<Self>) {
        self.pools = msg.0;
    }
}

impl Handler<GetInterruptionStats> for InterruptionActor {
    type Result = MessageResult<GetInterruptionStats>;

    fn handle(&mut self, _: GetInterruptionStats, _: &mut Context<Self>) -> Self::Result {
        MessageResult(self.stats.clone())
    }
}

/// A parsed batch: the events with when they were received, and the receipts to delete
/// once they are acted on (every message's, the malformed included).
struct Parsed {
    events: Vec<(interruption::Event, Millis)>,
    receipts: Vec<String>,
}

impl InterruptionActor {
    /// Parses a batch, counting every message by kind and logging each kind of malformed or
    /// ignored message once.
    fn parse(&mut self, batch: &Batch) -> Parsed {
        let mut events = Vec::with_capacity(batch.messages.len());
        let mut receipts = Vec::with_capacity(batch.messages.len());
        for m in &batch.messages {
            receipts.push(m.receipt.clone());
            match interruption::parse(&m.body) {
                Ok(e) => {
                    *self.stats.received.entry(e.kind.as_str().to_string()).or_default() += 1;
                    if e.kind == Kind::NoOp && self.logged.insert(format!("no_op/{}", e.note)) {
                        tracing::info!(message_id = %m.id, note = %e.note, "interruption queue: a message dovetail does not act on (deleted; logged once per kind)");
                    }
                    events.push((e, batch.received));
                }
                Err(err) => {
                    *self.stats.received.entry("malformed".to_string()).or_default() += 1;
                    let key = format!("malformed/{err}");
                    if self.logged.insert(key) {
                        self.errors.warn("parse_interruption", "malformed", &format!("message/{}", m.id), &err);
                    } else {
                        self.errors.note("parse_interruption", "malformed", &format!("message/{}", m.id), &err);
                    }
                }
            }
        }
        Parsed { events, receipts }
    }
}

impl Handler<Batch> for InterruptionActor {
    type Result = ResponseActFuture<Self, Handled>;

    fn handle(&mut self, batch: Batch, _: &mut Context<Self>) -> Self::Result {
        let parsed = self.parse(&batch);
        let queue = self.queues.get(batch.queue).cloned();
        let work = Work {
            ledger: self.ledger.clone(),
            view: self.view.clone(),
            clock: self.clock.clone(),
            executor: self.executor.clone(),
            errors: self.errors.clone(),
            cfg: self.cfg.clone(),
            zones: self.zones.clone(),
            pools: self.pools.clone(),
            names: Names::new(self.names.next_u64()),
        };
        let n = batch.messages.len();
        let fut = async move {
            let mut work = work;
            let outcome = work.act(parsed.events).await;
            let deleted = match (&outcome, queue) {
                (Ok(_), Some(q)) => match q.delete(&parsed.receipts).await {
                    Ok(()) => n,
                    Err(e) => {
                        work.errors.warn("delete_messages", "cloud", "interruption-queue", &e);
                        0
                    }
                },
                (Ok(_), None) => 0,
                (Err(e), _) => {
                    work.errors.warn("handle_interruptions", "ledger", "interruption-queue", e);
                    0
                }
            };
            (outcome.unwrap_or_default(), Handled { deleted, kept: n - deleted })
        };
        Box::pin(fut.into_actor(self).map(|(acted, handled), act, _| {
            act.stats.deleted += handled.deleted as u64;
            act.stats.acted += acted.acted;
            act.stats.duplicates += acted.duplicates;
            act.stats.replacements += acted.replacements;
            act.stats.replacements_denied += acted.denied;
            act.stats.pods_on_existing += acted.on_existing;
            handled
        }))
    }
}

/// What one batch did.
#[derive(Debug, Default)]
struct Acted {
    acted: u64,
    duplicates: u64,
    replacements: u64,
    denied: u64,
    on_existing: u64,
}

/// What handling a batch works with, off the actor.
struct Work {
    ledger: Arc<dyn Ledger>,
    view: Arc<dyn ClusterView>,
    clock: Arc<dyn Clock>,
    executor: Executor,
    errors: Arc<Errors>,
    cfg: Arc<Config>,
    zones: Vec<String>,
    pools: BTreeMap<String, (PoolInput, Addr<NodePoolActor>)>,
    names: Names,
}

/// Why a batch was not acted on (its messages stay in the queue).
#[derive(Debug, thiserror::Error)]
enum NotActed {
    #[error("not the leader")]
    NotLeader,
    #[error("the cluster view has not synced")]
    NotSynced,
    #[error("ledger: {0}")]
    Ledger(String),
    #[error("the term is over (fenced at term {0})")]
    Fenced(Term),
    #[error("sizing the replacements panicked: {0}")]
    Sizing(String),
}

impl Work {
    async fn act(&mut self, events: Vec<(interruption::Event, Millis)>) -> Result<Acted, NotActed> {
        let mut acted = Acted::default();
        if events.iter().all(|(e, _)| e.kind == Kind::NoOp) {
            return Ok(acted);
        }
        let leadership = self.ledger.leadership().borrow().clone();
        if !leadership.leader {
            return Err(NotActed::NotLeader);
        }
        if !self.view.synced() {
            return Err(NotActed::NotSynced);
        }
        let term = leadership.term;
        let settings = self.cfg.lifecycle.interruption;
        let now = self.clock.now_millis();
        // 1. The notices, resolved against the ledger's claims.
        let notices = read_with(&*self.ledger, move |s| {
            let mut notices = interruption::notices(&events, |i| s.claim_of_instance(i), &settings);
            // What the ledger recorded already is not proposed again (it would be refused).
            notices
                .retain(|n| s.interruption(&n.instance).is_none_or(|r| (n.acts && !r.acts) || n.deadline < r.deadline));
            notices
        })
        .await
        .map_err(|e| NotActed::Ledger(e.to_string()))?;
        if notices.is_empty() {
            return Ok(acted);
        }
        let outcome = self.propose(term, now, Command::Interrupt { notices: notices.clone() }).await?;
        let Outcome::Interrupted { recorded, duplicates } = outcome else {
            return Err(NotActed::Ledger(format!("unexpected outcome {outcome:?}")));
        };
        acted.duplicates = duplicates.len() as u64;
        let recorded: BTreeSet<String> = recorded.into_iter().collect();
        let fresh: Vec<&Notice> = notices.iter().filter(|n| recorded.contains(&n.instance)).collect();
        // 2. Taints and events, at once.
        let snap = self.view.snapshot();
        let by_provider = snap.nodes_by_provider_id();
        let mut effects = Vec::new();
        let mut going = Vec::new();
        for n in &fresh {
            let Some(claim) = n.claim.as_deref() else { continue };
            let node = snap
                .nodeclaims
                .get(claim)
                .and_then(|nc| nc.status.provider_id.clone())
                .and_then(|p| by_provider.get(p.as_str()).map(|n| n.name.clone()));
            let (reason, warning) = event_reason(n.kind);
            let message = format!("instance {} of nodeclaim {claim}: {}", n.instance, n.kind);
            let e =
                Event { kind: ObjectKind::NodeClaim, name: claim.to_string(), warning, reason: reason.into(), message };
            effects.push(Effect::new(claim, Action::Event(e)));
            if !n.acts {
                continue;
            }
            acted.acted += 1;
            if let Some(node) = node {
                let patch = NodePatch { add_taints: vec![disrupted_taint()], ..NodePatch::default() };
                effects.push(Effect::new(claim, Action::PatchNode { node: node.clone(), patch }));
                going.push(Going { instance: n.instance.clone(), node });
            }
        }
        if !effects.is_empty() {
            self.executor.run(term, effects).await;
        }
        if going.is_empty() {
            return Ok(acted);
        }
        // 3. The capacity their pods need, sized off the actor thread.
        let pools: Vec<PoolInput> = self.pools.values().map(|(p, _)| p.clone()).collect();
        let opts = self.cfg.solve.clone();
        let instances: Vec<String> = going.iter().map(|g| g.instance.clone()).collect();
        let sized_on = snap.clone();
        let sizing = tokio::task::spawn_blocking(move || interruption::size(&sized_on, &pools, &going, &opts))
            .await
            .map_err(|e| NotActed::Sizing(e.to_string()))?;
        acted.on_existing = sizing.on_existing as u64;
        for (pod, why) in &sizing.unplaced {
            self.errors.note("size_replacements", "unplaced", &format!("pod/{pod}"), why);
        }
        let mut replacements = Vec::new();
        let mut creates = Vec::new();
        let pool_list: Vec<&(PoolInput, Addr<NodePoolActor>)> = self.pools.values().collect();
        for (claim, serves) in &sizing.claims {
            let Some((input, _)) = pool_list.get(claim.pool) else { continue };
            let pool = input.pool.name.clone();
            let id = unique_claim_name(&mut self.names, &pool, |id| snap.nodeclaims.contains_key(id));
            let Some(planned) = planned_claim(claim, input, &self.zones, id) else {
                self.errors.note(
                    "size_replacements",
                    "no_zone",
                    &format!("nodepool/{pool}"),
                    &"a replacement has no zone",
                );
                continue;
            };
            creates.push((pool.clone(), planned.nodeclaim));
            replacements.push(Replacement { pool, claim: planned.reserve, serves: serves.clone() });
        }
        let outcome = self
            .propose(term, self.clock.now_millis(), Command::ReplaceInterrupted { instances, replacements })
            .await?;
        let Outcome::Reserved { granted, denied } = outcome else {
            return Err(NotActed::Ledger(format!("unexpected outcome {outcome:?}")));
        };
        acted.denied = denied.len() as u64;
        for (claim, why) in &denied {
            self.errors.note("reserve_replacement", "denied", &format!("nodeclaim/{claim}"), why);
        }
        let granted: BTreeSet<String> = granted.into_iter().collect();
        let mut effects = Vec::new();
        let mut nudge: BTreeSet<String> = BTreeSet::new();
        for (pool, nc) in creates.into_iter().filter(|(_, nc)| granted.contains(&nc.name)) {
            nudge.insert(pool);
            effects.push(Effect::new(&nc.name.clone(), Action::CreateNodeClaim(Box::new(nc))));
        }
        acted.replacements = effects.len() as u64;
        if !effects.is_empty() {
            self.executor.run(term, effects).await;
        }
        for pool in nudge {
            if let Some((_, actor)) = self.pools.get(&pool)
                && let Err(e) = actor.try_send(Reconcile)
            {
                self.errors.note("reconcile", "mailbox", &format!("nodepool/{pool}"), &e);
            }
        }
        Ok(acted)
    }

    async fn propose(&self, term: Term, at: Millis, command: Command) -> Result<Outcome, NotActed> {
        let committed =
            self.ledger.propose(Entry { term, at, command }).await.map_err(|e| NotActed::Ledger(e.to_string()))?;
        match committed.outcome {
            Outcome::Fenced { term } => Err(NotActed::Fenced(term)),
            Outcome::Rejected { reason } => Err(NotActed::Ledger(reason)),
            o => Ok(o),
        }
    }
}

/// Karpenter's event for a message kind, and whether it is a warning.
fn event_reason(kind: Kind) -> (&'static str, bool) {
    match kind {
        Kind::SpotInterrupted => ("SpotInterrupted", true),
        Kind::RebalanceRecommendation => ("SpotRebalanceRecommendation", false),
        Kind::ScheduledChange => ("InstanceUnhealthy", true),
        Kind::InstanceStopped => ("InstanceStopping", true),
        Kind::InstanceTerminated => ("InstanceTerminating", true),
        Kind::CapacityReservationInterrupted => ("CapacityReservationInstanceInterrupted", true),
        Kind::NoOp => ("Unknown", false),
    }
}
