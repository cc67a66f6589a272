//! Interruption, driven. Consumers long-poll the interruption queues ([`consume`]) and hand
//! each receive's messages to the [`InterruptionActor`], through its bounded mailbox (a full
//! mailbox holds the consumers back). Batches that arrive while a run is under way wait, and
//! the next run takes them all at once. For the batches of a run the actor:
//!
//! 1. parses every body (`core::interruption::parse`); a malformed body or an event dovetail
//!    does not act on is counted, logged once per kind, and deleted;
//! 2. resolves each instance to its claim in the ledger and proposes the run's notices as
//!    one [`Command::Interrupt`] (the ledger deduplicates by instance: a redelivery changes
//!    nothing);
//! 3. once committed, taints each interrupted node `karpenter.sh/disrupted` and records an
//!    event on its NodeClaim, as Karpenter's;
//! 4. sizes the capacity the interrupted nodes' pods need (`core::interruption::size`: the
//!    provisioning solve on the cluster without those nodes) and proposes it as one
//!    [`Command::ReplaceInterrupted`]; once committed, creates the granted NodeClaims and
//!    asks their pools to reconcile at once (the launch does not wait for a batch window);
//! 5. deletes the run's messages (one `DeleteMessageBatch` per ten). A run whose proposal
//!    failed (ledger unavailable, term over) keeps its messages: they come back after the
//!    visibility timeout.
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
use dovetail_core::plane::{Latencies, Names, disrupted_taint};
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

/// Answered once the actor has taken the batch: at once while it holds fewer than
/// `interruption.mailbox` batches not yet acted on, else when a run takes them (so a busy
/// actor holds the consumers back). The batch is deleted from its queue after its action
/// committed, or kept there to be seen again.
impl Message for Batch {
    type Result = ();
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
    /// Per instance acted on, from its message's sending (SQS's `SentTimestamp`) to its node
    /// tainted, and to its replacements created with their pools asked to launch them, ms
    /// on the plane's clock (messages the queue gives no sending time are not counted).
    pub sent_to_taint: Latencies,
    pub sent_to_replacement: Latencies,
    /// When messages were last deleted (ms on the plane's clock).
    pub last_deleted: Millis,
    /// Runs (each acts on every batch that arrived while the one before it ran).
    pub runs: u64,
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
    /// Batches taken and not yet acted on: the next run acts on all of them at once (one
    /// ledger entry, one sizing), so a burst costs a run per arrival of work, not per receive.
    waiting: Vec<Batch>,
    /// Senders held back while `waiting` is full, released when a run takes it.
    held: Vec<tokio::sync::oneshot::Sender<()>>,
    /// A run is under way.
    running: bool,
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
            waiting: Vec::new(),
            held: Vec::new(),
            running: false,
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

/// Parsed batches: the events with when they were received, and the receipts to delete once
/// they are acted on (every message's, the malformed included), by queue.
struct Parsed {
    events: Vec<(interruption::Event, Millis)>,
    receipts: BTreeMap<usize, Vec<String>>,
    /// The earliest sending of a message naming each instance.
    sent: BTreeMap<String, Millis>,
}

impl InterruptionActor {
    /// Parses batches, counting every message by kind and logging each kind of malformed or
    /// ignored message once.
    fn parse(&mut self, batches: &[Batch]) -> Parsed {
        let mut events = Vec::new();
        let mut receipts: BTreeMap<usize, Vec<String>> = BTreeMap::new();
        let mut sent: BTreeMap<String, Millis> = BTreeMap::new();
        for (batch, m) in batches.iter().flat_map(|b| b.messages.iter().map(move |m| (b, m))) {
            receipts.entry(batch.queue).or_default().push(m.receipt.clone());
            match interruption::parse(&m.body) {
                Ok(e) => {
                    *self.stats.received.entry(e.kind.as_str().to_string()).or_default() += 1;
                    if e.kind == Kind::NoOp && self.logged.insert(format!("no_op/{}", e.note)) {
                        tracing::info!(message_id = %m.id, note = %e.note, "interruption queue: a message dovetail does not act on (deleted; logged once per kind)");
                    }
                    if let Some(at) = m.sent {
                        for i in &e.instances {
                            let first = sent.entry(i.clone()).or_insert(at);
                            *first = (*first).min(at);
                        }
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
        Parsed { events, receipts, sent }
    }
}

impl Handler<Batch> for InterruptionActor {
    type Result = ResponseFuture<()>;

    fn handle(&mut self, batch: Batch, ctx: &mut Context<Self>) -> Self::Result {
        self.waiting.push(batch);
        let full = self.waiting.len() > self.cfg.interruption.mailbox;
        let wait = full.then(|| {
            let (tx, rx) = tokio::sync::oneshot::channel();
            self.held.push(tx);
            rx
        });
        self.run(ctx);
        Box::pin(async move {
            if let Some(rx) = wait
                && rx.await.is_err()
            {
                tracing::debug!("interruption actor stopped with a batch waiting");
            }
        })
    }
}

impl InterruptionActor {
    /// A restart: a run under way went with the old context (its messages come back after
    /// the visibility timeout); the batches waiting stay, and the next batch starts a run.
    pub(crate) fn restarting(&mut self) {
        self.running = false;
    }

    /// Acts on every batch waiting, unless a run is under way (its end starts the next).
    fn run(&mut self, ctx: &mut Context<Self>) {
        if self.running || self.waiting.is_empty() {
            return;
        }
        self.running = true;
        let batches = std::mem::take(&mut self.waiting);
        for tx in self.held.drain(..) {
            // A sender that gave up waiting (its consumer stopped) needs no answer.
            if tx.send(()).is_err() {
                tracing::debug!("an interruption consumer stopped while held back");
            }
        }
        let parsed = self.parse(&batches);
        let messages: usize = batches.iter().map(|b| b.messages.len()).sum();
        drop(batches);
        let queues = self.queues.clone();
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
        let fut = async move {
            let mut work = work;
            let outcome = work.act(parsed.events, &parsed.sent).await;
            let mut deleted = 0usize;
            match &outcome {
                Ok(_) => {
                    for (q, receipts) in &parsed.receipts {
                        let Some(queue) = queues.get(*q) else { continue };
                        match queue.delete(receipts).await {
                            Ok(()) => deleted += receipts.len(),
                            Err(e) => work.errors.warn(
                                "delete_messages",
                                "cloud",
                                &format!("interruption-queue/{q}"),
                                &format!("{} messages: {e}", receipts.len()),
                            ),
                        }
                    }
                }
                Err(e) => work.errors.warn(
                    "handle_interruptions",
                    "ledger",
                    "interruption-queue",
                    &format!("{messages} messages kept, to be seen again: {e}"),
                ),
            }
            (outcome.unwrap_or_default(), deleted, work.clock.now_millis())
        };
        ctx.spawn(fut.into_actor(self).map(|(acted, deleted, at), act, ctx| {
            act.stats.deleted += deleted as u64;
            if deleted > 0 {
                act.stats.last_deleted = at;
            }
            act.stats.acted += acted.acted;
            act.stats.duplicates += acted.duplicates;
            act.stats.replacements += acted.replacements;
            act.stats.replacements_denied += acted.denied;
            act.stats.pods_on_existing += acted.on_existing;
            act.stats.sent_to_taint.merge(&acted.to_taint);
            act.stats.sent_to_replacement.merge(&acted.to_replacement);
            act.stats.runs += 1;
            act.running = false;
            act.run(ctx);
        }));
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
    to_taint: Latencies,
    to_replacement: Latencies,
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
    async fn act(
        &mut self,
        events: Vec<(interruption::Event, Millis)>,
        sent: &BTreeMap<String, Millis>,
    ) -> Result<Acted, NotActed> {
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
        let tainted = self.clock.now_millis();
        for g in &going {
            if let Some(at) = sent.get(&g.instance) {
                acted.to_taint.record(tainted.saturating_sub(*at));
            }
        }
        // Every acting claim's record is marked sized, those without a node too (a claim not
        // registered yet runs no pods: it needs no replacement and drains at once).
        let instances: Vec<String> =
            fresh.iter().filter(|n| n.acts && n.claim.is_some()).map(|n| n.instance.clone()).collect();
        if instances.is_empty() {
            return Ok(acted);
        }
        // 3. The capacity their pods need, sized off the actor thread.
        let pools: Vec<PoolInput> = self.pools.values().map(|(p, _)| p.clone()).collect();
        let opts = self.cfg.solve.clone();
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
        let serves_of: BTreeMap<String, Vec<String>> =
            replacements.iter().map(|r| (r.claim.id.clone(), r.serves.clone())).collect();
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
        let replaced = self.clock.now_millis();
        let served: BTreeSet<&String> =
            granted.iter().filter_map(|id| serves_of.get(id)).flat_map(|serves| serves.iter()).collect();
        for i in served {
            if let Some(at) = sent.get(i) {
                acted.to_replacement.record(replaced.saturating_sub(*at));
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
