//! The ZoneActor: one per availability zone, the only caller of `CloudProvider::launch` and
//! `terminate` for its zone.
//!
//! Launches its pools send within a short window go out together: identical claims form one
//! launch batch (one CreateFleet), re-driven claims keep the batch the ledger recorded. The
//! batches are committed to the ledger first ([`Command::Launch`]): only the claims the ledger
//! started are launched, and only while this node still leads in the term it proposed in, so a
//! deleted claim or a deposed leader launches nothing. Every instance carries its batch's tag,
//! and the call's client token derives from the batch, so a re-drive after a crash finds what
//! the call made instead of launching again. Outcomes are committed (`Launched`, `Unlaunched`
//! on insufficient capacity, ICE marks in one entry) and then sent back to the pool that asked;
//! the reply is a hint (a full mailbox drops it): the pool reads what happened from the ledger.
//! Throttled launches wait for the retry-after; terminations are fenced the same way and
//! committed as `InstanceGone`.

mod call;
mod queue;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use dovetail_cloud::{CloudError, CloudProvider, Instance, LaunchBatch, LaunchRequest, same_shape};
use dovetail_core::clock::{Clock, to_millis};
use dovetail_core::ledger::{Millis, Term};
use dovetail_core::plane::Names;
use dovetail_raft::Ledger;
use tracing_opentelemetry::OpenTelemetrySpanExt;

use crate::config::ZoneSettings;
use crate::errors::Errors;
use crate::limiter::RegionLimiter;
use crate::trace::Cause;
use call::{Ending, Failure, LaunchCall, LaunchResult, launch, terminate};
use queue::Queue;

/// The most instances one TerminateInstances call ends (Karpenter's terminate batcher: 500).
const TERMINATE_MAX: usize = 500;

/// The tag with the leadership term a launch was decided in.
pub const TAG_TERM: &str = "dovetail.dev/term";

/// A ZoneActor's settings.
#[derive(Clone, Debug)]
pub struct ZoneConfig {
    pub zone: String,
    pub settings: ZoneSettings,
    pub mailbox: usize,
}

impl ZoneConfig {
    pub fn new(zone: &str) -> Self {
        ZoneConfig { zone: zone.to_string(), settings: ZoneSettings::default(), mailbox: 1024 }
    }
}

/// Launch these claims (reserved in the ledger) in the actor's zone. A request's batch is the
/// one the ledger recorded for a re-drive, or empty (`LaunchBatch::default()`) for a claim
/// not yet launching: the zone records a new batch for it.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Launch {
    pub requests: Vec<LaunchRequest>,
    /// The traced decisions these claims serve: each launch gets a `zone.launch` span in each
    /// of their traces (empty when untraced).
    pub causes: Vec<Cause>,
    pub reply: Recipient<LaunchOutcome>,
    /// Claims a call was made for before (its capacity ran out, or a restart cut it off): their
    /// launch timeout runs from that call, so they are queued ahead of the claims waiting for
    /// their first.
    pub again: bool,
}

/// What became of one claim's launch.
#[derive(Message, Clone, Debug, PartialEq)]
#[rtype(result = "()")]
pub struct LaunchOutcome {
    pub claim: String,
    pub result: Result<Instance, CloudError>,
    /// The launch's span in each traced decision, in the order of the `Launch`'s causes.
    pub causes: Vec<Cause>,
}

/// Terminate a claim's instance: the one named, or the one its batch made for it.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Terminate {
    pub claim: String,
    pub instance: Option<String>,
    pub batch: Option<LaunchBatch>,
    /// The term the termination was decided in: nothing is terminated once it is over.
    pub term: Term,
    pub reply: Recipient<Terminated>,
}

/// The instance of a claim is gone (or the cloud said why not).
#[derive(Message, Clone, Debug, PartialEq)]
#[rtype(result = "()")]
pub struct Terminated {
    pub claim: String,
    pub result: Result<(), CloudError>,
}

/// Counters, for tests and the loadtest report.
#[derive(Message)]
#[rtype(result = "ZoneStats")]
pub struct GetStats;

#[derive(Clone, Debug, Default, PartialEq, Eq, MessageResponse)]
pub struct ZoneStats {
    /// Calls to `CloudProvider::launch`.
    pub launch_calls: u64,
    /// Termination batches handed to the cloud (each up to `TERMINATE_MAX` instances).
    pub terminate_calls: u64,
    pub launched: u64,
    pub insufficient_capacity: u64,
    pub throttled: u64,
    /// Flushes that waited for the regional limiter.
    pub paced: u64,
    /// Claims handed over but not yet answered.
    pub in_flight: usize,
    /// Claims queued again by a restart.
    pub requeued: u64,
    /// Claims the ledger refused to launch (deleted, or launching elsewhere).
    pub refused: u64,
    /// Launches and terminations not made because the term they were decided in was over.
    pub fenced: u64,
    pub terminated: u64,
    /// How late the latest window flush ran after its time, and the most late, in
    /// milliseconds of the plane's clock (timers starved by a busy arbiter show here).
    pub flush_late_ms: u64,
    pub flush_late_max_ms: u64,
}

/// A claim handed over and not yet answered.
#[derive(Clone)]
struct InFlight {
    request: LaunchRequest,
    reply: Recipient<LaunchOutcome>,
    causes: Vec<Cause>,
    /// A call was made for it before (the pool said so, or this actor made one).
    called: bool,
}

/// The actor.
pub struct ZoneActor {
    cfg: ZoneConfig,
    cloud: Arc<dyn CloudProvider>,
    ledger: Arc<dyn Ledger>,
    clock: Arc<dyn Clock>,
    errors: Arc<Errors>,
    names: Names,
    /// Claims waiting for the next call: those called before first.
    pending: Queue,
    /// When the scheduled flush is due (plane clock), if one is scheduled.
    flush_due: Option<Millis>,
    /// Every claim handed over and not yet answered (queued or in a call), with its reply.
    in_flight: BTreeMap<String, InFlight>,
    /// Terminations of claims whose launch is in flight here: run once it is answered.
    deferred: Vec<Terminate>,
    /// Terminations waiting for the next TerminateInstances call, and whether it is scheduled.
    terminations: Vec<Terminate>,
    terminate_due: bool,
    /// The most terminations a call carries now (`TERMINATE_MAX`, less after throttling).
    terminate_max: usize,
    limiter: Option<Arc<RegionLimiter>>,
    stats: ZoneStats,
}

impl ZoneActor {
    pub fn new(cfg: ZoneConfig, cloud: Arc<dyn CloudProvider>, ledger: Arc<dyn Ledger>, clock: Arc<dyn Clock>) -> Self {
        // Batch ids need only be unique per zone and run: the clock and the zone seed them.
        let seed =
            clock.now_millis() ^ cfg.zone.bytes().fold(0u64, |h, b| h.wrapping_mul(31).wrapping_add(u64::from(b)));
        ZoneActor {
            cfg,
            cloud,
            ledger,
            clock,
            errors: Arc::new(Errors::new()),
            names: Names::new(seed),
            pending: Queue::default(),
            flush_due: None,
            in_flight: BTreeMap::new(),
            deferred: Vec::new(),
            terminations: Vec::new(),
            terminate_due: false,
            terminate_max: TERMINATE_MAX,
            limiter: None,
            stats: ZoneStats::default(),
        }
    }

    /// Counts errors in the plane's counters.
    pub fn with_errors(mut self, errors: Arc<Errors>) -> Self {
        self.errors = errors;
        self
    }

    /// A restart: the calls that were under way are gone with the old context, so every claim
    /// not yet answered is queued again. Their batches are the ones recorded (a cut-off call's
    /// instances are found by their batch tag, not made twice); the pools still get one answer
    /// per claim.
    pub(crate) fn requeue(&mut self) {
        let (called, first): (Vec<&InFlight>, Vec<&InFlight>) = self.in_flight.values().partition(|f| f.called);
        let claims = |fs: Vec<&InFlight>| fs.into_iter().map(|f| f.request.claim.clone()).collect();
        self.pending.clear();
        self.pending.push(claims(called), true);
        self.pending.push(claims(first), false);
        self.stats.requeued += self.pending.len() as u64;
        self.flush_due = None;
        self.terminate_due = false;
    }

    /// Paces launches by the region's shared limiter: a launch call waits for its tokens, and
    /// takes at most as many instances as the instance bucket holds.
    pub fn with_limiter(mut self, limiter: Arc<RegionLimiter>) -> Self {
        self.limiter = Some(limiter);
        self
    }

    fn now(&self) -> Millis {
        self.clock.now_millis()
    }

    fn schedule_flush(&mut self, ctx: &mut Context<Self>, after: Duration) {
        if self.flush_due.is_none() {
            self.flush_due = Some(self.now().saturating_add(to_millis(after)));
            ctx.run_later(after, |act, ctx| act.flush(ctx));
        }
    }

    fn flush(&mut self, ctx: &mut Context<Self>) {
        if let Some(due) = self.flush_due.take() {
            let late = self.now().saturating_sub(due);
            self.stats.flush_late_ms = late;
            self.stats.flush_late_max_ms = self.stats.flush_late_max_ms.max(late);
        }
        if self.pending.is_empty() {
            return;
        }
        let take = match &self.limiter {
            Some(l) => match l.launch(self.pending.len()) {
                Ok(n) => n,
                Err(wait) => {
                    self.stats.paced += 1;
                    self.schedule_flush(ctx, wait);
                    return;
                }
            },
            None => self.pending.len(),
        };
        let mut batch: Vec<InFlight> =
            self.pending.take(take).into_iter().filter_map(|claim| self.in_flight.get(&claim).cloned()).collect();
        if batch.is_empty() {
            return;
        }
        if !self.pending.is_empty() {
            let window = self.cfg.settings.window;
            self.schedule_flush(ctx, window);
        }
        let leadership = self.ledger.leadership().borrow().clone();
        if !leadership.leader {
            // Not ours to launch: the leader re-drives them from the ledger.
            for f in &batch {
                self.in_flight.remove(&f.request.claim);
            }
            self.stats.fenced += batch.len() as u64;
            self.run_deferred(ctx);
            return;
        }
        let term = leadership.term;
        // Every cloud mutation carries the term it was decided in (and its claim and batch).
        for f in &mut batch {
            f.request.tags.insert(TAG_TERM.to_string(), term.to_string());
        }
        let batches = self.batches(&mut batch);
        for f in &batch {
            if let Some(b) = self.in_flight.get_mut(&f.request.claim) {
                b.request.batch = f.request.batch.clone();
                b.called = true;
            }
        }
        self.stats.launch_calls += 1;
        let spans = launch_spans(&self.cfg.zone, &batch);
        let (cloud, ledger, clock, ice_ttl, errors) = (
            self.cloud.clone(),
            self.ledger.clone(),
            self.clock.clone(),
            self.cfg.settings.ice_ttl,
            self.errors.clone(),
        );
        let zone = self.cfg.zone.clone();
        let requests: Vec<LaunchRequest> = batch.iter().map(|f| f.request.clone()).collect();
        // The call (its ledger entries, the cloud's request) runs in the first traced
        // decision's `zone.launch` span.
        let traced = spans.iter().flatten().find(|s| !s.is_disabled()).cloned().unwrap_or_else(tracing::Span::none);
        let work = tracing::Instrument::instrument(
            launch(LaunchCall { cloud, ledger, clock, ice_ttl, errors, zone, term, batches, requests }),
            traced,
        );
        ctx.spawn(work.into_actor(self).map(move |results, act, ctx| {
            let mut retry_after: Option<Duration> = None;
            // Throttled claims were called: they go back ahead of the queue, in their order.
            let mut throttled: Vec<String> = Vec::new();
            for ((InFlight { request, reply, .. }, result), spans) in batch.into_iter().zip(results).zip(spans) {
                // Stale: answered already (a call from before a restart).
                if !act.in_flight.contains_key(&request.claim) {
                    continue;
                }
                record(&spans, &result);
                match result {
                    Err(Failure::Throttled(after)) => {
                        act.stats.throttled += 1;
                        retry_after = Some(retry_after.map_or(after, |r| r.max(after)));
                        throttled.push(request.claim);
                    }
                    Err(Failure::Refused(reason)) => {
                        act.stats.refused += 1;
                        act.in_flight.remove(&request.claim);
                        let result =
                            Err(CloudError::Invalid { what: format!("launch of nodeclaim {}", request.claim), reason });
                        act.deliver(ctx, reply, LaunchOutcome { claim: request.claim, result, causes: Vec::new() });
                    }
                    Err(Failure::Fenced) => {
                        act.stats.fenced += 1;
                        act.in_flight.remove(&request.claim);
                    }
                    Err(Failure::Cloud(e)) | Ok(Err(e)) => {
                        if matches!(e, CloudError::InsufficientCapacity { .. }) {
                            act.stats.insufficient_capacity += 1;
                        }
                        act.in_flight.remove(&request.claim);
                        let causes = spans.iter().map(Cause::of).collect();
                        act.deliver(ctx, reply, LaunchOutcome { claim: request.claim, result: Err(e), causes });
                    }
                    Ok(Ok(inst)) => {
                        act.stats.launched += 1;
                        act.in_flight.remove(&request.claim);
                        let causes = spans.iter().map(Cause::of).collect();
                        act.deliver(ctx, reply, LaunchOutcome { claim: request.claim, result: Ok(inst), causes });
                    }
                }
            }
            act.pending.push(throttled, true);
            if let Some(after) = retry_after {
                let wait = after.min(act.cfg.settings.max_retry_wait);
                act.schedule_flush(ctx, wait);
            }
            act.run_deferred(ctx);
        }));
    }

    /// Gives every request its batch: re-drives keep the one recorded; new claims of the same
    /// shape share a new one. Returns the batches to record.
    fn batches(&mut self, batch: &mut [InFlight]) -> Vec<LaunchBatch> {
        let mut out: Vec<LaunchBatch> = Vec::new();
        // New claims, grouped by shape, each group a new batch: (its first request, the
        // requests in it).
        let mut groups: Vec<(usize, Vec<usize>)> = Vec::new();
        for i in 0..batch.len() {
            if !batch[i].request.batch.id.is_empty() {
                let b = &batch[i].request.batch;
                if !out.iter().any(|x| x.id == b.id) {
                    out.push(b.clone());
                }
                continue;
            }
            match groups.iter_mut().find(|(first, _)| same_shape_but_batch(&batch[*first].request, &batch[i].request)) {
                Some((_, members)) => members.push(i),
                None => groups.push((i, vec![i])),
            }
        }
        for (_, members) in groups {
            let claims: Arc<[String]> = members.iter().map(|&i| batch[i].request.claim.clone()).collect();
            let group = LaunchBatch { id: self.names.batch(&self.cfg.zone), claims };
            for &i in &members {
                batch[i].request.batch = group.clone();
            }
            out.push(group);
        }
        out
    }

    /// Sends without waiting and without an unbounded queue: `try_send`; a full mailbox drops
    /// the reply (counted), since the pool reads the outcome from the ledger.
    fn deliver(&mut self, _ctx: &mut Context<Self>, to: Recipient<LaunchOutcome>, msg: LaunchOutcome) {
        let claim = msg.claim.clone();
        if let Err(e) = to.try_send(msg) {
            let kind = if matches!(e, SendError::Full(_)) { "mailbox_full" } else { "closed" };
            self.errors.note("launch_reply", kind, &format!("nodeclaim/{claim}"), &"the pool reads it from the ledger");
        }
    }

    /// Runs terminations that waited for their claim's launch.
    fn run_deferred(&mut self, ctx: &mut Context<Self>) {
        let (ready, wait): (Vec<Terminate>, Vec<Terminate>) =
            std::mem::take(&mut self.deferred).into_iter().partition(|t| !self.in_flight.contains_key(&t.claim));
        self.deferred = wait;
        for t in ready {
            self.terminate(ctx, t);
        }
    }

    fn terminate(&mut self, ctx: &mut Context<Self>, msg: Terminate) {
        if self.in_flight.contains_key(&msg.claim) {
            // One waiting termination per claim: the latest ask replaces an earlier one.
            self.deferred.retain(|t| t.claim != msg.claim);
            self.deferred.push(msg);
            return;
        }
        self.terminations.retain(|t| t.claim != msg.claim);
        self.terminations.push(msg);
        if self.terminations.len() >= self.terminate_max {
            self.flush_terminations(ctx);
        } else {
            self.schedule_terminations(ctx);
        }
    }

    /// The waiting terminations go out `terminate_window` after the first of them.
    fn schedule_terminations(&mut self, ctx: &mut Context<Self>) {
        if !self.terminate_due && !self.terminations.is_empty() {
            self.terminate_due = true;
            ctx.run_later(self.cfg.settings.terminate_window, |act, ctx| {
                act.terminate_due = false;
                act.flush_terminations(ctx);
            });
        }
    }

    /// Every waiting termination, `terminate_max` a call; each claim's pool told how it went.
    fn flush_terminations(&mut self, ctx: &mut Context<Self>) {
        while !self.terminations.is_empty() {
            let n = self.terminations.len().min(self.terminate_max);
            let batch: Vec<Terminate> = self.terminations.drain(..n).collect();
            let endings: Vec<Ending> = batch
                .iter()
                .map(|t| Ending {
                    claim: t.claim.clone(),
                    instance: t.instance.clone(),
                    batch: t.batch.clone(),
                    term: t.term,
                })
                .collect();
            let (cloud, ledger, clock, errors) =
                (self.cloud.clone(), self.ledger.clone(), self.clock.clone(), self.errors.clone());
            self.stats.terminate_calls += 1;
            let work = async move { terminate(&*cloud, &*ledger, &*clock, &errors, &endings).await };
            ctx.spawn(work.into_actor(self).map(|results, act, _| {
                // EC2 throttles a call for more instances than its bucket holds whole: a
                // throttled batch halves the next ones, a batch that went doubles them again.
                // A batch that failed whole for another passing reason halves them too: one id
                // the cloud cannot handle must not hold back the others, asked with it again
                // and again (moto answered a batch of 14 a 500 for two minutes).
                let throttled = results.iter().any(|r| matches!(r, Err(Some(CloudError::Throttled { .. }))));
                let failed_whole =
                    results.len() > 1 && results.iter().all(|r| matches!(r, Err(Some(CloudError::Transient { .. }))));
                act.terminate_max = if throttled || failed_whole {
                    (act.terminate_max / 2).max(1)
                } else {
                    act.terminate_max.saturating_mul(2).min(TERMINATE_MAX)
                };
                for (Terminate { claim, reply, .. }, result) in batch.into_iter().zip(results) {
                    act.answer_termination(claim, &reply, result);
                }
            }));
        }
    }

    /// Tells a claim's pool how its termination went (a fenced one is not answered: the
    /// leader's pool asks again).
    fn answer_termination(
        &mut self,
        claim: String,
        reply: &Recipient<Terminated>,
        result: Result<(), Option<CloudError>>,
    ) {
        match &result {
            Ok(()) => self.stats.terminated += 1,
            Err(None) => self.stats.fenced += 1,
            Err(Some(_)) => {}
        }
        let (Ok(()) | Err(Some(_))) = &result else { return };
        let result = result.map_err(|e| e.unwrap_or(CloudError::Transient { message: "fenced".into() }));
        if let Err(e) = reply.try_send(Terminated { claim: claim.clone(), result }) {
            let kind = if matches!(e, SendError::Full(_)) { "mailbox_full" } else { "closed" };
            self.errors.note(
                "terminate_reply",
                kind,
                &format!("nodeclaim/{claim}"),
                &"the pool reads it from the ledger",
            );
        }
    }
}

/// Whether two requests may share a new batch (one CreateFleet): the same shape, whatever
/// their (still empty) batch.
fn same_shape_but_batch(a: &LaunchRequest, b: &LaunchRequest) -> bool {
    let b = LaunchRequest { batch: a.batch.clone(), ..b.clone() };
    same_shape(a, &b)
}

/// This call's span in each traced decision of each claim.
fn launch_spans(zone: &str, batch: &[InFlight]) -> Vec<Vec<tracing::Span>> {
    batch
        .iter()
        .map(|f| {
            f.causes
                .iter()
                .map(|cause| {
                    let span = tracing::info_span!(
                        parent: None,
                        "zone.launch",
                        zone = %zone,
                        nodepool = %f.request.nodepool,
                        nodeclaim = %f.request.claim,
                        batch = %f.request.batch.id,
                        instance_types = f.request.instance_types.len(),
                        instance_type = tracing::field::Empty,
                        capacity_type = tracing::field::Empty,
                        instance = tracing::field::Empty,
                        error = tracing::field::Empty,
                    );
                    cause.adopt(&span);
                    span
                })
                .collect()
        })
        .collect()
}

/// Writes a claim's outcome onto its spans.
fn record(spans: &[tracing::Span], result: &LaunchResult) {
    for span in spans {
        match result {
            Ok(Ok(inst)) => {
                span.record("instance_type", inst.instance_type.as_str());
                span.record("capacity_type", inst.capacity_type.to_string());
                span.record("instance", inst.id.as_str());
            }
            Ok(Err(e)) | Err(Failure::Cloud(e)) => {
                span.record("error", e.to_string());
                span.set_status(opentelemetry::trace::Status::error(e.to_string()));
            }
            Err(f) => {
                span.record("error", format!("{f:?}"));
            }
        }
    }
}

impl Actor for ZoneActor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        ctx.set_mailbox_capacity(self.cfg.mailbox);
        // After a restart, the claims requeued.
        if !self.pending.is_empty() {
            let window = self.cfg.settings.window;
            self.schedule_flush(ctx, window);
        }
        // And the terminations that were waiting.
        self.schedule_terminations(ctx);
    }
}

impl Handler<Launch> for ZoneActor {
    type Result = ();

    fn handle(&mut self, msg: Launch, ctx: &mut Context<Self>) {
        let mut queued = Vec::with_capacity(msg.requests.len());
        for r in msg.requests {
            if r.zone != self.cfg.zone {
                let result = Err(CloudError::Invalid {
                    what: format!("zone of nodeclaim {}", r.claim),
                    reason: format!("sent to the actor of zone {}", self.cfg.zone),
                });
                self.deliver(ctx, msg.reply.clone(), LaunchOutcome { claim: r.claim, result, causes: Vec::new() });
                continue;
            }
            // A claim already being launched is answered once, by that launch.
            if self.in_flight.contains_key(&r.claim) {
                continue;
            }
            queued.push(r.claim.clone());
            let flight =
                InFlight { request: r, reply: msg.reply.clone(), causes: msg.causes.clone(), called: msg.again };
            self.in_flight.insert(flight.request.claim.clone(), flight);
        }
        self.pending.push(queued, msg.again);
        let window = self.cfg.settings.window;
        self.schedule_flush(ctx, window);
    }
}

impl Handler<Terminate> for ZoneActor {
    type Result = ();

    fn handle(&mut self, msg: Terminate, ctx: &mut Context<Self>) {
        self.terminate(ctx, msg);
    }
}

impl Handler<crate::Restart> for ZoneActor {
    type Result = ();

    fn handle(&mut self, _: crate::Restart, ctx: &mut Context<Self>) {
        ctx.stop();
    }
}

impl Handler<GetStats> for ZoneActor {
    type Result = ZoneStats;

    fn handle(&mut self, _: GetStats, _: &mut Context<Self>) -> ZoneStats {
        ZoneStats { in_flight: self.in_flight.len(), ..self.stats.clone() }
    }
}
