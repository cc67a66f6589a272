//! The ZoneActor: one per availability zone, the only caller of `CloudProvider::launch` for
//! its zone. It collects the launches its pools send within a short window into one call (the
//! provider merges identical requests into one CreateFleet), records each step in the ledger
//! (Launching, Launched, ICE marks), retries throttled launches after the retry-after, and
//! sends every claim's outcome back to the pool that asked: on insufficient capacity the pool
//! picks another offering, the ICE'd ones now marked unavailable.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use dovetail_cloud::{CloudError, CloudProvider, Instance, LaunchRequest};
use dovetail_core::clock::Clock;
use dovetail_core::ledger::{Command, Entry, Offering, Step, micro_dollars};
use dovetail_raft::Ledger;

use crate::limiter::RegionLimiter;
use crate::millis;
use crate::trace::Cause;
use tracing_opentelemetry::OpenTelemetrySpanExt;

/// A ZoneActor's settings.
#[derive(Clone, Debug)]
pub struct ZoneConfig {
    pub zone: String,
    /// Launches arriving within this window after the first go out as one call.
    pub window: Duration,
    /// How long an offering that had no capacity stays unavailable (Karpenter: 3 min).
    pub ice_ttl: Duration,
    pub mailbox: usize,
}

impl ZoneConfig {
    pub fn new(zone: &str) -> Self {
        ZoneConfig {
            zone: zone.to_string(),
            window: Duration::from_millis(35),
            ice_ttl: Duration::from_secs(180),
            mailbox: 1024,
        }
    }
}

/// Launch these claims (already reserved in the ledger) in the actor's zone.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Launch {
    pub requests: Vec<LaunchRequest>,
    /// The traced decisions these claims serve: each launch gets a `zone.launch` span in each
    /// of their traces (empty when untraced).
    pub causes: Vec<Cause>,
    pub reply: Recipient<LaunchOutcome>,
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

/// Terminate a claim's instance.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Terminate {
    pub claim: String,
    pub instance: String,
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
    pub launched: u64,
    pub insufficient_capacity: u64,
    pub throttled: u64,
    /// Flushes that waited for the regional limiter.
    pub paced: u64,
    /// Claims handed over but not yet answered.
    pub in_flight: usize,
    /// Claims queued again by a restart.
    pub requeued: u64,
}

/// A claim handed over and not yet answered.
#[derive(Clone)]
struct InFlight {
    request: LaunchRequest,
    reply: Recipient<LaunchOutcome>,
    causes: Vec<Cause>,
}

/// The actor.
pub struct ZoneActor {
    cfg: ZoneConfig,
    cloud: Arc<dyn CloudProvider>,
    ledger: Arc<dyn Ledger>,
    clock: Arc<dyn Clock>,
    /// Claims waiting for the next call, in arrival order.
    pending: Vec<String>,
    flush_scheduled: bool,
    /// Every claim handed over and not yet answered (queued or in a call), with its reply.
    in_flight: BTreeMap<String, InFlight>,
    limiter: Option<Arc<RegionLimiter>>,
    stats: ZoneStats,
}

impl ZoneActor {
    pub fn new(cfg: ZoneConfig, cloud: Arc<dyn CloudProvider>, ledger: Arc<dyn Ledger>, clock: Arc<dyn Clock>) -> Self {
        ZoneActor {
            cfg,
            cloud,
            ledger,
            clock,
            pending: Vec::new(),
            flush_scheduled: false,
            in_flight: BTreeMap::new(),
            limiter: None,
            stats: ZoneStats::default(),
        }
    }

    /// A restart: the calls that were under way are gone with the old context, so every claim
    /// not yet answered is queued again. Launch is idempotent by claim, so an instance a lost
    /// call made is found, not doubled; the pools still get exactly one answer per claim.
    pub(crate) fn requeue(&mut self) {
        self.pending = self.in_flight.keys().cloned().collect();
        self.stats.requeued += self.pending.len() as u64;
        self.flush_scheduled = false;
    }

    /// Paces launches by the region's shared limiter: a launch call waits for its tokens, and
    /// takes at most as many instances as the instance bucket holds.
    pub fn with_limiter(mut self, limiter: Arc<RegionLimiter>) -> Self {
        self.limiter = Some(limiter);
        self
    }

    fn schedule_flush(&mut self, ctx: &mut Context<Self>, after: Duration) {
        if !self.flush_scheduled {
            self.flush_scheduled = true;
            ctx.run_later(after, |act, ctx| act.flush(ctx));
        }
    }

    fn flush(&mut self, ctx: &mut Context<Self>) {
        self.flush_scheduled = false;
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
        let batch: Vec<InFlight> = self
            .pending
            .drain(..take.min(self.pending.len()))
            .filter_map(|claim| self.in_flight.get(&claim).cloned())
            .collect();
        if batch.is_empty() {
            return;
        }
        if !self.pending.is_empty() {
            let window = self.cfg.window;
            self.schedule_flush(ctx, window);
        }
        self.stats.launch_calls += 1;
        let (cloud, ledger, clock, ice_ttl) =
            (self.cloud.clone(), self.ledger.clone(), self.clock.clone(), self.cfg.ice_ttl);
        let requests: Vec<LaunchRequest> = batch.iter().map(|f| f.request.clone()).collect();
        // This call's span in each traced decision of each claim.
        let spans: Vec<Vec<tracing::Span>> = batch
            .iter()
            .map(|f| {
                f.causes
                    .iter()
                    .map(|cause| {
                        let span = tracing::info_span!(
                            parent: None,
                            "zone.launch",
                            zone = %self.cfg.zone,
                            nodepool = %f.request.nodepool,
                            nodeclaim = %f.request.claim,
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
            .collect();
        let work = async move {
            let at = millis(clock.now());
            for r in &requests {
                let launching = Command::Advance { claim: r.claim.clone(), step: Step::Launching };
                // A ledger that cannot commit leaves the claim Reserved; liveness cleans up.
                let _ = ledger.propose(Entry { at, command: launching }).await;
            }
            let results = cloud.launch(&requests).await;
            let at = millis(clock.now());
            for (r, result) in requests.iter().zip(&results) {
                match result {
                    Ok(inst) => {
                        let step = Step::Launched {
                            instance: inst.id.clone(),
                            resources: inst.capacity.clone(),
                            price_per_hour: micro_dollars(inst.price),
                        };
                        let _ = ledger
                            .propose(Entry { at, command: Command::Advance { claim: r.claim.clone(), step } })
                            .await;
                    }
                    Err(CloudError::InsufficientCapacity { offerings }) => {
                        for o in offerings {
                            let offering = Offering {
                                instance_type: o.instance_type.clone(),
                                zone: o.zone.clone(),
                                capacity_type: o.capacity_type,
                            };
                            let until = at.saturating_add(millis(ice_ttl));
                            let _ = ledger
                                .propose(Entry { at, command: Command::MarkUnavailable { offering, until } })
                                .await;
                        }
                    }
                    Err(_) => {}
                }
            }
            results
        };
        ctx.spawn(work.into_actor(self).map(move |results, act, ctx| {
            let mut retry_after: Option<Duration> = None;
            for ((InFlight { request, reply, .. }, result), spans) in batch.into_iter().zip(results).zip(spans) {
                // Stale: answered already (a call from before a restart).
                if !act.in_flight.contains_key(&request.claim) {
                    continue;
                }
                for span in &spans {
                    match &result {
                        Ok(inst) => {
                            span.record("instance_type", inst.instance_type.as_str());
                            span.record("capacity_type", inst.capacity_type.to_string());
                            span.record("instance", inst.id.as_str());
                        }
                        Err(e) => {
                            span.record("error", e.to_string());
                            span.set_status(opentelemetry::trace::Status::error(e.to_string()));
                        }
                    }
                }
                match result {
                    Err(CloudError::Throttled { retry_after: after, .. }) => {
                        act.stats.throttled += 1;
                        retry_after = Some(retry_after.map_or(after, |r| r.max(after)));
                        act.pending.push(request.claim);
                    }
                    result => {
                        match &result {
                            Ok(_) => act.stats.launched += 1,
                            Err(CloudError::InsufficientCapacity { .. }) => act.stats.insufficient_capacity += 1,
                            Err(_) => {}
                        }
                        act.in_flight.remove(&request.claim);
                        let causes = spans.iter().map(Cause::of).collect();
                        deliver(ctx, reply, LaunchOutcome { claim: request.claim, result, causes });
                    }
                }
            }
            if let Some(after) = retry_after {
                act.schedule_flush(ctx, after.min(crate::MAX_RETRY_WAIT));
            }
        }));
    }
}

/// Sends without dropping and without an unbounded queue: `try_send`, else an awaited `send`.
fn deliver(ctx: &mut Context<ZoneActor>, to: Recipient<LaunchOutcome>, msg: LaunchOutcome) {
    if let Err(SendError::Full(msg)) = to.try_send(msg) {
        ctx.spawn(actix::fut::wrap_future::<_, ZoneActor>(async move {
            let _ = to.send(msg).await;
        }));
    }
}

impl Actor for ZoneActor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        ctx.set_mailbox_capacity(self.cfg.mailbox);
        // After a restart, the claims requeued.
        if !self.pending.is_empty() {
            let window = self.cfg.window;
            self.schedule_flush(ctx, window);
        }
    }
}

impl Handler<Launch> for ZoneActor {
    type Result = ();

    fn handle(&mut self, msg: Launch, ctx: &mut Context<Self>) {
        for r in msg.requests {
            if r.zone != self.cfg.zone {
                let result = Err(CloudError::Invalid {
                    what: format!("zone of nodeclaim {}", r.claim),
                    reason: format!("sent to the actor of zone {}", self.cfg.zone),
                });
                deliver(ctx, msg.reply.clone(), LaunchOutcome { claim: r.claim, result, causes: Vec::new() });
                continue;
            }
            // A claim already being launched is answered once, by that launch.
            if self.in_flight.contains_key(&r.claim) {
                continue;
            }
            self.pending.push(r.claim.clone());
            let flight = InFlight { request: r, reply: msg.reply.clone(), causes: msg.causes.clone() };
            self.in_flight.insert(flight.request.claim.clone(), flight);
        }
        let window = self.cfg.window;
        self.schedule_flush(ctx, window);
    }
}

impl Handler<Terminate> for ZoneActor {
    type Result = ();

    fn handle(&mut self, msg: Terminate, ctx: &mut Context<Self>) {
        let cloud = self.cloud.clone();
        let work = async move {
            let result = cloud.terminate(std::slice::from_ref(&msg.instance)).await.into_iter().next();
            // Gone already is done.
            let result = match result {
                Some(Ok(())) | Some(Err(CloudError::NotFound { .. })) => Ok(()),
                Some(Err(e)) => Err(e),
                None => Err(CloudError::Transient { message: "no result".into() }),
            };
            (msg.claim, msg.reply, result)
        };
        ctx.spawn(work.into_actor(self).map(|(claim, reply, result), _, _| {
            if let Err(SendError::Full(m)) = reply.try_send(Terminated { claim, result }) {
                actix::spawn(async move {
                    let _ = reply.send(m).await;
                });
            }
        }));
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
