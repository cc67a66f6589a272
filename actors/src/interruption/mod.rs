//! Interruption, driven. Consumers long-poll the interruption queues ([`consume`]) and hand
//! each receive's messages to the [`InterruptionActor`], through its bounded mailbox (a full
//! mailbox holds the consumers back). The actor works in two stages, each one run at a time,
//! the two running side by side:
//!
//! - **record**, on every batch waiting (those that arrived during the one before):
//!   1. parses every body (`core::interruption::parse`); a malformed body or an event
//!      dovetail does not act on is counted, logged once per kind, and deleted;
//!   2. resolves each instance to its claim in the ledger and proposes the notices as one
//!      [`Command::Interrupt`] (the ledger deduplicates by instance: a redelivery changes
//!      nothing);
//!   3. once committed, taints each interrupted node `karpenter.sh/disrupted`, then records an
//!      event on its NodeClaim, as Karpenter's; a run with nothing to size deletes its
//!      messages, the rest wait for the replace stage;
//! - **replace**, on everything the record stages left since the last one (one sizing for
//!   all; while record stages are still running it waits for them, at most
//!   `interruption.replace_wait` from the receive):
//!   sizes the capacity the interrupted nodes' pods need (`core::interruption::size`: the
//!   provisioning solve on the cluster without those nodes nor what is promised already),
//!   proposes it as one [`Command::ReplaceInterrupted`], creates the granted NodeClaims and
//!   hands them to their pools, which send them to their zones at once
//!   ([`LaunchNow`](crate::pool::LaunchNow): no reconcile, no pool batch window); then deletes
//!   the messages.
//!
//! So a node is tainted as soon as its record commits, not after the sizings ahead of it, and
//! a burst costs few sizings. A stage that does not act (ledger unavailable, term over, cache
//! not synced, longer than the visibility timeout) hands its messages back: at once when this
//! node no longer leads (another node's consumers see them), else after `interruption.retry`.
//!
//! A message seen again finds its instance's record: a duplicate is deleted; an instance
//! recorded by a run whose replace stage failed is tainted and sized again (no second event);
//! an earlier deadline moves the record's.
//!
//! The drain is the lifecycle's: it starts once the replacements are ready or the deadline
//! is `drain_lead` away (`core::interruption::drain_now`), and ends by EC2's deadline.

pub mod consume;
mod work;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use dovetail_cloud::{InterruptionQueue, QueueMessage};
use dovetail_cluster::ClusterView;
use dovetail_core::clock::{Clock, to_millis};
use dovetail_core::interruption::{self, Kind};
use dovetail_core::ledger::Millis;
use dovetail_core::plane::{Latencies, Names};
use dovetail_core::scheduling::PoolInput;
use dovetail_raft::Ledger;
use tracing::Instrument;

use crate::config::Config;
use crate::errors::Errors;
use crate::executor::Executor;
use crate::pool::NodePoolActor;
use work::{Acted, NotActed, ToReplace, Work};

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
    /// Notices that only brought a recorded instance's deadline earlier.
    pub earlier: u64,
    /// Notices for instances no claim of the ledger or NodeClaim of the cluster knows
    /// (another cluster's, in an account-wide queue): dropped before the ledger.
    pub unmatched: u64,
    /// Instances a failed run recorded and did not size, tainted and sized by a later one.
    pub resumed: u64,
    /// Interrupted nodes whose taint the cluster took.
    pub tainted: u64,
    /// Messages handed back undeleted (a run that did not act), and runs that did not act.
    pub released: u64,
    pub failed_runs: u64,
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
    /// Where the runs' time went: per phase (`PHASES`, then `delete`), ms summed over the
    /// runs; and the longest run, ms.
    pub phase_ms: [u64; PHASES.len() + 1],
    pub longest_run_ms: u64,
}

/// A run's phases, in order (the messages' delete after them).
pub const PHASES: [&str; 7] = ["read", "record", "taint", "events", "size", "reserve", "create"];

/// The actor.
pub struct InterruptionActor {
    queues: Vec<Arc<dyn InterruptionQueue>>,
    /// The queues' names, in the same order (for errors and logs).
    queue_names: Vec<String>,
    /// The provisioner's holds (a sizing leaves their room alone).
    nominations: crate::nominate::Nominations,
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
    /// A record stage is under way.
    running: bool,
    /// A replace stage is under way, and the record stages' work waiting for the next.
    replacing: bool,
    to_replace: Vec<Job>,
    /// A replace stage is asked for once the record stages' wait is over.
    replace_due: bool,
}

/// What the actor is made of.
pub struct InterruptionWiring {
    pub queues: Vec<Arc<dyn InterruptionQueue>>,
    pub queue_names: Vec<String>,
    pub nominations: crate::nominate::Nominations,
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
            queue_names: w.queue_names,
            nominations: w.nominations,
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
            replacing: false,
            to_replace: Vec::new(),
            replace_due: false,
        }
    }
}

impl Actor for InterruptionActor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        ctx.set_mailbox_capacity(self.cfg.interruption.mailbox);
        // After a restart, the batches that were waiting get their run now.
        self.run(ctx);
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
                    let metrics = self.executor.metrics();
                    metrics.interruption_received(e.kind.as_str());
                    if let Some(at) = m.sent {
                        metrics.interruption_queued(batch.received.saturating_sub(at) as f64 / 1000.0);
                    }
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
                    self.executor.metrics().interruption_received("malformed");
                    let key = format!("malformed/{}", err.kind());
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
    /// A restart: the stages under way went with the old context (their messages come back
    /// after the visibility timeout); the batches waiting stay, and `started` runs them.
    pub(crate) fn restarting(&mut self) {
        self.running = false;
        self.replacing = false;
        self.replace_due = false;
        self.to_replace.clear();
    }

    fn work(&mut self) -> Work {
        Work {
            ledger: self.ledger.clone(),
            view: self.view.clone(),
            clock: self.clock.clone(),
            executor: self.executor.clone(),
            errors: self.errors.clone(),
            cfg: self.cfg.clone(),
            zones: self.zones.clone(),
            pools: self.pools.clone(),
            names: Names::new(self.names.next_u64()),
            nominations: self.nominations.clone(),
        }
    }

    /// The record stage, on every batch waiting, unless one is under way (its end starts the
    /// next): the notices recorded, the nodes tainted, what is left to size handed to the
    /// replace stage. A run with nothing to size deletes its messages itself.
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
        let started = self.clock.now_millis();
        let received = batches.iter().map(|b| b.received).min().unwrap_or(started);
        let parsed = self.parse(&batches);
        let received_count = parsed.events.len();
        drop(batches);
        let queues = self.queues.clone();
        let names = self.queue_names.clone();
        let mut work = self.work();
        let (limit, retry) = (self.cfg.interruption.visibility, self.cfg.interruption.retry);
        let fut = async move {
            let Parsed { events, receipts, sent } = parsed;
            let outcome = match tokio::time::timeout(limit, work.record(events, &sent)).await {
                Ok(outcome) => outcome,
                Err(_) => Err(NotActed::TimedOut(limit.as_millis())),
            };
            let mut ends = Ends::default();
            let (acted, job) = match outcome {
                Ok((acted, Some(job))) => (acted, Some(Job { job, receipts, sent, received })),
                Ok((acted, None)) => {
                    ends.deleted = delete(&queues, &names, &receipts, &work.errors).await;
                    (acted, None)
                }
                Err(e) => {
                    ends.released = not_acted(&e, (&queues, &names), &receipts, retry, &work.errors).await;
                    ends.failed = true;
                    (Acted::default(), None)
                }
            };
            (acted, job, ends, work.clock.now_millis())
        };
        // Each stage is a trace of its own: its ledger entry (and commit) and its effects.
        let span = tracing::info_span!(parent: None, "cluster.interrupt", stage = "record", messages = received_count);
        ctx.spawn(fut.instrument(span).into_actor(self).map(move |(acted, job, ends, at), act, ctx| {
            act.count(&acted, &ends, at.saturating_sub(started), at);
            act.running = false;
            if let Some(job) = job {
                act.to_replace.push(job);
            }
            act.replace(ctx);
            act.run(ctx);
        }));
    }

    /// The replace stage, on everything the record stage left, unless one is under way: one
    /// sizing for all of it; then the messages deleted (or handed back when it failed).
    fn replace(&mut self, ctx: &mut Context<Self>) {
        if self.replacing || self.to_replace.is_empty() {
            return;
        }
        // While records are still coming in (a record stage under way or batches waiting for
        // one), the sizing waits for them: a burst costs one sizing of the whole cluster, not
        // one per record stage. No message waits for that longer than `replace_wait` from its
        // receive.
        let now = self.clock.now_millis();
        if self.running || !self.waiting.is_empty() {
            let oldest = self.to_replace.iter().map(|j| j.received).min().unwrap_or(now);
            let waited = now.saturating_sub(oldest);
            let i = &self.cfg.interruption;
            let wait = to_millis(i.replace_wait.min(i.visibility / 2));
            if waited < wait {
                if !self.replace_due {
                    self.replace_due = true;
                    let left = Duration::from_millis(wait - waited);
                    ctx.run_later(left, |act, ctx| {
                        act.replace_due = false;
                        act.replace(ctx);
                    });
                }
                return;
            }
        }
        self.replacing = true;
        let jobs = std::mem::take(&mut self.to_replace);
        let runs = jobs.len();
        let started = self.clock.now_millis();
        let queues = self.queues.clone();
        let names = self.queue_names.clone();
        let mut work = self.work();
        let (limit, retry) = (self.cfg.interruption.visibility, self.cfg.interruption.retry);
        let fut = async move {
            let mut receipts: BTreeMap<usize, Vec<String>> = BTreeMap::new();
            let mut sent: BTreeMap<String, Millis> = BTreeMap::new();
            let mut todo = Vec::with_capacity(jobs.len());
            for j in jobs {
                for (q, r) in j.receipts {
                    receipts.entry(q).or_default().extend(r);
                }
                for (instance, at) in j.sent {
                    let first = sent.entry(instance).or_insert(at);
                    *first = (*first).min(at);
                }
                todo.push(j.job);
            }
            let outcome = match tokio::time::timeout(limit, work.replace(todo, &sent)).await {
                Ok(outcome) => outcome,
                Err(_) => Err(NotActed::TimedOut(limit.as_millis())),
            };
            let mut ends = Ends::default();
            match &outcome {
                Ok(_) => ends.deleted = delete(&queues, &names, &receipts, &work.errors).await,
                Err(e) => {
                    ends.released = not_acted(e, (&queues, &names), &receipts, retry, &work.errors).await;
                    ends.failed = true;
                }
            }
            (outcome.unwrap_or_default(), ends, work.clock.now_millis())
        };
        let span = tracing::info_span!(parent: None, "cluster.interrupt", stage = "replace", runs = runs);
        ctx.spawn(fut.instrument(span).into_actor(self).map(move |(acted, ends, at), act, ctx| {
            act.count(&acted, &ends, at.saturating_sub(started), at);
            act.replacing = false;
            act.replace(ctx);
        }));
    }

    /// Adds a stage's counts.
    fn count(&mut self, acted: &Acted, ends: &Ends, run_ms: u64, at: Millis) {
        let s = &mut self.stats;
        s.deleted += ends.deleted as u64;
        self.executor.metrics().interruption_deleted(ends.deleted as u64);
        s.released += ends.released as u64;
        s.failed_runs += u64::from(ends.failed);
        if ends.deleted > 0 {
            s.last_deleted = at;
        }
        s.earlier += acted.earlier;
        s.resumed += acted.resumed;
        s.tainted += acted.tainted;
        s.acted += acted.acted;
        s.duplicates += acted.duplicates;
        s.unmatched += acted.unmatched;
        self.executor.metrics().interruption_unmatched(acted.unmatched);
        s.replacements += acted.replacements;
        s.replacements_denied += acted.denied;
        s.pods_on_existing += acted.on_existing;
        s.sent_to_taint.merge(&acted.to_taint);
        s.sent_to_replacement.merge(&acted.to_replacement);
        s.runs += 1;
        for (phase, ms) in &acted.phases {
            if let Some(i) = PHASES.iter().position(|p| p == phase) {
                s.phase_ms[i] += ms;
            }
        }
        let before_delete: u64 = acted.phases.iter().map(|(_, ms)| ms).sum();
        s.phase_ms[PHASES.len()] += run_ms.saturating_sub(before_delete);
        s.longest_run_ms = s.longest_run_ms.max(run_ms);
        if !acted.phases.is_empty() {
            let phases: Vec<String> = acted.phases.iter().map(|(p, ms)| format!("{p} {ms} ms")).collect();
            tracing::debug!(
                acted = acted.acted,
                resumed = acted.resumed,
                replacements = acted.replacements,
                deleted = ends.deleted,
                run_ms,
                phases = %phases.join(", "),
                "cluster.interruption: a stage"
            );
        }
    }
}

/// The record stage's work left to the replace stage, with its messages.
struct Job {
    job: ToReplace,
    receipts: BTreeMap<usize, Vec<String>>,
    sent: BTreeMap<String, Millis>,
    /// The earliest receive of its messages.
    received: Millis,
}

/// How a stage's messages ended.
#[derive(Default)]
struct Ends {
    deleted: usize,
    released: usize,
    failed: bool,
}

/// Deletes messages by receipt, queue by queue; how many went.
async fn delete(
    queues: &[Arc<dyn InterruptionQueue>],
    names: &[String],
    receipts: &BTreeMap<usize, Vec<String>>,
    errors: &Errors,
) -> usize {
    let mut deleted = 0;
    for (q, receipts) in receipts {
        let Some(queue) = queues.get(*q) else { continue };
        match tokio::time::timeout(CALL_TIMEOUT, queue.delete(receipts)).await {
            Ok(Ok(())) => deleted += receipts.len(),
            Ok(Err(e)) => errors.warn(
                "delete_messages",
                "cloud",
                &queue_name(names, *q),
                &format!("{} messages: {e}", receipts.len()),
            ),
            Err(_) => errors.warn(
                "delete_messages",
                "timeout",
                &queue_name(names, *q),
                &format!("{} messages: no answer in {CALL_TIMEOUT:?}", receipts.len()),
            ),
        }
    }
    deleted
}

/// A stage that did not act: logged with its queues, its messages handed back (at once when
/// this node no longer leads, after `retry` otherwise); how many were.
async fn not_acted(
    e: &NotActed,
    (queues, names): (&[Arc<dyn InterruptionQueue>], &[String]),
    receipts: &BTreeMap<usize, Vec<String>>,
    retry: std::time::Duration,
    errors: &Errors,
) -> usize {
    let messages: usize = receipts.values().map(Vec::len).sum();
    errors.warn(
        "handle_interruptions",
        "not_acted",
        &receipts.keys().map(|q| queue_name(names, *q)).collect::<Vec<_>>().join(","),
        &format!("{messages} messages kept, to be seen again: {e}"),
    );
    let after = if e.hand_over() { std::time::Duration::ZERO } else { retry };
    release(queues, names, receipts, after, errors).await
}

/// How long one queue call (a delete, a visibility change) may take.
const CALL_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// A queue's name for errors and logs: its name when the plane was given one.
fn queue_name(names: &[String], q: usize) -> String {
    names.get(q).map_or_else(|| format!("interruption-queue/{q}"), |n| format!("interruption-queue/{n}"))
}

/// Hands a run's messages back: each becomes visible again `after` from now (at once when
/// another node should act on them). Returns how many were handed back; one that could not be
/// comes back after the visibility timeout anyway.
async fn release(
    queues: &[Arc<dyn InterruptionQueue>],
    names: &[String],
    receipts: &BTreeMap<usize, Vec<String>>,
    after: std::time::Duration,
    errors: &Errors,
) -> usize {
    let mut released = 0;
    for (q, receipts) in receipts {
        let Some(queue) = queues.get(*q) else { continue };
        for r in receipts {
            match tokio::time::timeout(CALL_TIMEOUT, queue.change_visibility(r, after)).await {
                Ok(Ok(())) => released += 1,
                Ok(Err(e)) => errors.note("release_message", "cloud", &queue_name(names, *q), &e),
                Err(_) => {
                    errors.note("release_message", "timeout", &queue_name(names, *q), &"no answer");
                    // The queue is not answering: the rest come back after their timeout.
                    return released;
                }
            }
        }
    }
    released
}
