//! A provisioning round: the planner runs on the blocking pool, the round is reserved in one
//! ledger entry (ids the ledger refuses as live are renamed and proposed again), the granted
//! claims' NodeClaims are created by the executor in the term the reservation committed in,
//! and each created claim is handed to its zone's actor at once.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::sync::{Arc, Mutex};

use actix::prelude::*;
use dovetail_cloud::{LaunchBatch, LaunchRequest};
use dovetail_cluster::ClusterView;
use dovetail_core::clock::Clock;
use dovetail_core::effect::{Action, Effect};
use dovetail_core::ledger::{Command, Denial, Entry, Offering, Outcome, Step, Term};
use dovetail_core::plane::{Names, TypesByName, capacity_types, launch_order, types_by_name};
use dovetail_core::pod::{Pod, PodKey};
use dovetail_core::provisioning::{PlannedClaim, RoundInput, plan_round, rename};
use dovetail_core::scheduling::PoolInput;
use dovetail_raft::{Ledger, read_with};

use super::{NodePoolActor, Traced};
use crate::config::Config;
use crate::errors::Errors;
use crate::executor::{Done, Executor};
use crate::nominate;
use crate::trace::{self, Cause};
use crate::zone::Launch;

/// Pods for the pool to place on new capacity.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Provision {
    pub pods: Vec<Pod>,
    /// The trace of each pod's decision, parallel to `pods` (empty when untraced).
    pub causes: Vec<Cause>,
}

/// Launch these NodeClaims now: replacements the interruption actor reserved in the ledger
/// and created, each with its zone. They go to their zones' actors as a round's claims do, with
/// no reconcile and no batch window between the interruption and the launch; a launch a zone's
/// mailbox refuses is asked again by the reconcile.
#[derive(Message)]
#[rtype(result = "()")]
pub struct LaunchNow(pub Vec<(dovetail_core::cluster::NodeClaim, String)>);

impl Handler<LaunchNow> for NodePoolActor {
    type Result = ();

    fn handle(&mut self, msg: LaunchNow, ctx: &mut Context<Self>) {
        self.launch_now(ctx, msg.0);
    }
}

impl NodePoolActor {
    /// Sends `claims` to their zones' actors; one a zone's mailbox refuses is asked again by
    /// the next reconcile. A follower launches nothing (the leader re-drives from the ledger),
    /// nor does a pool that knows no instance types (the registration timeout ends the claim).
    fn launch_now(&mut self, ctx: &mut Context<Self>, claims: Vec<(dovetail_core::cluster::NodeClaim, String)>) {
        if !self.ledger.leadership().borrow().leader || self.types.is_empty() {
            return;
        }
        let types = self.types.clone();
        let by_name = types_by_name(&types);
        let mut launches = Launches::default();
        for (nc, zone) in claims {
            if self.still_asked(self.launching.get(&nc.name)) {
                continue;
            }
            let request = self.launch_request(&by_name, &nc, &zone, LaunchBatch::default());
            launches.add(zone, Vec::new(), request, ());
        }
        for (zone, Group { causes, asks }) in launches.groups() {
            if !self.send_launches(ctx, &zone, asks.into_iter().map(|(r, ())| r).collect(), causes, false) {
                self.dirty = true;
            }
        }
    }
}

/// What a round came to.
struct RoundDone {
    pods: Vec<Pod>,
    /// Claims reserved and created, to launch.
    created: Vec<PlannedClaim>,
    /// Pods (indices) not placed, with why.
    unplaced: Vec<(usize, String)>,
    granted: usize,
    renamed: u64,
}

/// What a round needs, off the actor.
struct RoundCtx {
    pool: PoolInput,
    zones: Vec<String>,
    view: Arc<dyn ClusterView>,
    ledger: Arc<dyn Ledger>,
    clock: Arc<dyn Clock>,
    executor: Executor,
    errors: Arc<Errors>,
    cfg: Arc<Config>,
    busy: Arc<Mutex<BTreeSet<String>>>,
    term: Term,
    seed: u64,
    /// Where the round's pods are held on their claims (see [`crate::nominate`]).
    nominations: nominate::Nominations,
}

impl Handler<Provision> for NodePoolActor {
    type Result = ();

    fn handle(&mut self, msg: Provision, ctx: &mut Context<Self>) {
        let leadership = self.ledger.leadership().borrow().clone();
        if !leadership.leader {
            // The leader's plane provisions; these pods stay pending for it.
            return;
        }
        if self.retired {
            self.give_back(Traced { pods: msg.pods, causes: msg.causes }, "the NodePool is not provisioned for".into());
            return;
        }
        if !self.view.synced() {
            // A view still listing would hide nodes and running pods: the pods go back and
            // come again once it is synced.
            self.give_back(Traced { pods: msg.pods, causes: msg.causes }, "the cluster view is not synced".into());
            return;
        }
        // Pods a round under way or a claim not yet launched holds already: a resend that
        // came before the claim's NodeClaim showed in the Router's view. Not provisioned twice.
        let msg = self.without_held(msg);
        if msg.pods.is_empty() {
            return;
        }
        self.round += 1;
        self.stats.rounds += 1;
        let keys: Vec<PodKey> = msg.pods.iter().map(|p| p.key.clone()).collect();
        self.in_round.extend(keys.iter().cloned());
        // The round's span in each traced decision, and each pod's.
        let rounds: Vec<(Cause, tracing::Span)> = trace::distinct(&msg.causes)
            .into_iter()
            .map(|cause| {
                let span = tracing::info_span!(
                    parent: None,
                    "nodepool.provision",
                    nodepool = %self.pool.name,
                    round = self.round,
                    round.pods = msg.pods.len(),
                    pods = msg.causes.iter().filter(|c| c.span_id() == cause.span_id()).count(),
                    claims = tracing::field::Empty,
                    claims.granted = tracing::field::Empty,
                );
                cause.adopt(&span);
                (cause, span)
            })
            .collect();
        let round_causes: Vec<Cause> = rounds.iter().map(|(_, s)| Cause::of(s)).collect();
        let pod_causes: Vec<Cause> = (0..msg.pods.len())
            .map(|i| {
                let cause = trace::cause_at(&msg.causes, i);
                rounds
                    .iter()
                    .position(|(c, _)| cause.is_traced() && c.span_id() == cause.span_id())
                    .map(|k| round_causes[k].clone())
                    .unwrap_or_default()
            })
            .collect();
        let simulating: Vec<tracing::Span> = rounds
            .iter()
            .map(|(_, r)| tracing::info_span!(parent: r, "nodepool.simulate", nodepool = %self.pool.name))
            .collect();
        let reserving: Vec<tracing::Span> = rounds
            .iter()
            .map(|(_, r)| {
                tracing::info_span!(parent: r, "ledger.reserve", nodepool = %self.pool.name, claims = tracing::field::Empty, claims.granted = tracing::field::Empty)
            })
            .collect();
        let rc = RoundCtx {
            pool: PoolInput { pool: self.pool.clone(), instance_types: self.types.clone() },
            zones: self.zones.keys().cloned().collect(),
            view: self.view.clone(),
            ledger: self.ledger.clone(),
            clock: self.clock.clone(),
            executor: self.executor.clone(),
            errors: self.errors.clone(),
            cfg: self.cfg.clone(),
            busy: self.busy.clone(),
            term: leadership.term,
            seed: self.names.next_u64(),
            nominations: self.nominations.clone(),
        };
        let traced = reserving.iter().find(|s| !s.is_disabled()).cloned().unwrap_or_else(tracing::Span::none);
        let work = round(rc, msg.pods, simulating, traced);
        ctx.spawn(work.into_actor(self).map(move |done, act, ctx| {
            for k in &keys {
                act.in_round.remove(k);
            }
            for (_, r) in &rounds {
                r.record("claims", done.created.len());
                r.record("claims.granted", done.granted);
            }
            for span in &reserving {
                span.record("claims", done.created.len());
                span.record("claims.granted", done.granted);
            }
            drop(reserving);
            act.stats.renamed += done.renamed;
            let mut pods_of_round = done.pods;
            let mut unplaced = Traced::default();
            for (i, _) in &done.unplaced {
                unplaced.push(std::mem::take(&mut pods_of_round[*i]), pod_causes[*i].clone());
            }
            let reason = done
                .unplaced
                .first()
                .map_or_else(|| "nodepool limits, global caps or no launchable type".to_string(), |(_, r)| r.clone());
            let types = act.types.clone();
            let by_name = types_by_name(&types);
            let mut launches = Launches::default();
            for c in done.created {
                act.stats.claims_created += 1;
                let mut pods = Traced::default();
                for &p in &c.pods {
                    pods.push(std::mem::take(&mut pods_of_round[p]), pod_causes[p].clone());
                }
                let causes = trace::distinct(&pods.causes);
                let id = c.reserve.id.clone();
                act.pods.insert(id.clone(), pods);
                let request = act.launch_request(&by_name, &c.nodeclaim, &c.reserve.zone, LaunchBatch::default());
                launches.add(c.reserve.zone.clone(), causes, request, ());
                if let Ok(mut busy) = act.busy.lock() {
                    busy.remove(&id);
                }
            }
            for (zone, Group { causes, asks }) in launches.groups() {
                act.send_launches(ctx, &zone, asks.into_iter().map(|(r, ())| r).collect(), causes, false);
            }
            act.give_back(unplaced, reason);
            // A launch the zone's mailbox refused is asked again by the reconcile.
            act.reconcile(ctx);
        }));
    }
}

/// Launches to send, one message per zone and set of traced decisions (a reconcile sends the
/// claims called before in a second): a round's (or a reconcile's) thousands of claims take a
/// mailbox slot or two per zone, not one each, and a claim's launch joins only the traces of
/// the decisions it serves. `T` rides along with each request.
pub(super) struct Launches<T>(BTreeMap<(String, SpanIds), Group<T>>);

/// The span ids of a set of traced decisions, as a key.
type SpanIds = Vec<[u8; 8]>;

/// One message's worth: the decisions it serves and its requests.
pub(super) struct Group<T> {
    pub causes: Vec<Cause>,
    pub asks: Vec<(LaunchRequest, T)>,
}

impl<T> Default for Launches<T> {
    fn default() -> Self {
        Launches(BTreeMap::new())
    }
}

impl<T> Launches<T> {
    /// Adds a request for `zone` serving the decisions `causes` (distinct).
    pub(super) fn add(&mut self, zone: String, causes: Vec<Cause>, request: LaunchRequest, with: T) {
        let key = (zone, causes.iter().map(|c| c.span_id().to_bytes()).collect());
        self.0.entry(key).or_insert_with(|| Group { causes, asks: Vec::new() }).asks.push((request, with));
    }

    /// Each message: its zone and its group.
    pub(super) fn groups(self) -> impl Iterator<Item = (String, Group<T>)> {
        self.0.into_iter().map(|((zone, _), group)| (zone, group))
    }
}

impl NodePoolActor {
    /// The message without the pods this pool holds already (in a round under way, or on a
    /// claim whose launch is under way), counted.
    fn without_held(&mut self, msg: Provision) -> Provision {
        if self.in_round.is_empty() && self.pods.is_empty() {
            return msg;
        }
        // A claim's pods are held while its launch is asked and not answered (bounded by
        // `ask_again_after`): a reply lost at a full mailbox must not keep them from a later
        // claim for the rest of the claim's life.
        let on_claims: HashSet<&PodKey> = self
            .pods
            .iter()
            .filter(|(claim, _)| self.launching.contains_key(*claim))
            .flat_map(|(_, t)| t.pods.iter().map(|p| &p.key))
            .collect();
        let held = |p: &Pod| self.in_round.contains(&p.key) || on_claims.contains(&p.key);
        if !msg.pods.iter().any(held) {
            return msg;
        }
        let Provision { pods, causes } = msg;
        let mut kept = Provision { pods: Vec::with_capacity(pods.len()), causes: Vec::new() };
        let mut dropped = 0u64;
        for (i, p) in pods.into_iter().enumerate() {
            if held(&p) {
                dropped += 1;
                continue;
            }
            if !causes.is_empty() {
                kept.causes.push(trace::cause_at(&causes, i));
            }
            kept.pods.push(p);
        }
        self.stats.already_held += dropped;
        kept
    }

    /// The launch of a claim, from its NodeClaim.
    pub(super) fn launch_request(
        &self,
        by_name: &TypesByName<'_>,
        nc: &dovetail_core::cluster::NodeClaim,
        zone: &str,
        batch: LaunchBatch,
    ) -> LaunchRequest {
        let reqs = &nc.spec.requirements;
        let cts = capacity_types(reqs);
        // Cheapest first: the provider sends the first 60 (Karpenter's) to CreateFleet.
        let names = reqs.get(dovetail_core::labels::INSTANCE_TYPE).values().to_vec();
        LaunchRequest {
            claim: nc.name.clone(),
            batch,
            nodepool: self.pool.name.clone(),
            node_class: self.node_class.clone(),
            zone: zone.to_string(),
            instance_types: launch_order(by_name, &names, zone, &cts),
            capacity_types: cts,
            labels: nc.spec.labels.clone(),
            tags: BTreeMap::new(),
        }
    }

    /// Hands launches of one zone to its actor in one message (a round's thousands of claims
    /// take a mailbox slot per zone, not one each): `try_send`; a full mailbox leaves them for
    /// the next reconcile (backpressure: the pool does not queue launches of its own).
    /// `again`: claims called before, which the zone queues ahead of those not yet called (a
    /// reconcile sends them first, so a zone with one slot left takes them).
    pub(super) fn send_launches(
        &mut self,
        ctx: &mut Context<Self>,
        zone: &str,
        requests: Vec<LaunchRequest>,
        causes: Vec<Cause>,
        again: bool,
    ) -> bool {
        let claims: Vec<String> = requests.iter().map(|r| r.claim.clone()).collect();
        let object = || match claims.as_slice() {
            [one] => format!("nodeclaim/{one}"),
            many => format!("{} nodeclaims", many.len()),
        };
        let Some(actor) = self.zones.get(zone) else {
            self.errors.warn("launch", "no_zone_actor", &object(), &zone);
            return false;
        };
        let msg = Launch { requests, causes, reply: ctx.address().recipient(), again };
        match actor.try_send(msg) {
            Ok(()) => {
                let now = self.now();
                for claim in claims {
                    self.launching.insert(claim, now);
                }
                true
            }
            Err(e) => {
                let kind = if matches!(e, SendError::Full(_)) { "mailbox_full" } else { "closed" };
                self.errors.note("launch", kind, &object(), &"asked again on the next reconcile");
                false
            }
        }
    }
}

/// Plans, reserves and creates one round.
async fn round(rc: RoundCtx, pods: Vec<Pod>, simulating: Vec<tracing::Span>, reserving: tracing::Span) -> RoundDone {
    let now = rc.clock.now_millis();
    let pool_name = rc.pool.pool.name.clone();
    let unavailable: BTreeSet<Offering> =
        match read_with(&*rc.ledger, move |s| s.unavailable(now).cloned().collect()).await {
            Ok(u) => u,
            Err(e) => {
                rc.errors.warn("read_ice_marks", "ledger", &pool_name, &e);
                BTreeSet::new()
            }
        };
    let snapshot = rc.view.snapshot();
    let (pool, zones, solve) = (rc.pool.clone(), rc.zones.clone(), rc.cfg.solve.clone());
    let seed = rc.seed;
    let planned = tokio::task::spawn_blocking(move || {
        let mut names = Names::new(seed);
        let input = RoundInput {
            pool: &pool,
            cluster: &snapshot,
            pods: &pods,
            zones: &zones,
            unavailable: &unavailable,
            opts: &solve,
        };
        let round = plan_round(&input, &mut names);
        (round, pods, names)
    })
    .await;
    drop(simulating);
    let (plan, pods, mut names) = match planned {
        Ok(p) => p,
        Err(e) => {
            rc.errors.warn("plan_round", "panic", &pool_name, &e);
            return RoundDone { pods: Vec::new(), created: Vec::new(), unplaced: Vec::new(), granted: 0, renamed: 0 };
        }
    };
    let mut unplaced = plan.unplaced;
    let mut claims = plan.claims;
    let mut granted: Vec<PlannedClaim> = Vec::new();
    let mut renamed = 0u64;
    for attempt in 0..rc.cfg.rename_attempts {
        if claims.is_empty() {
            break;
        }
        let reserve =
            Command::Reserve { pool: pool_name.clone(), claims: claims.iter().map(|c| c.reserve.clone()).collect() };
        let proposed = rc.ledger.propose(Entry { term: rc.term, at: now, command: reserve });
        let outcome = match tracing::Instrument::instrument(proposed, reserving.clone()).await {
            Ok(c) => c.outcome,
            Err(e) => {
                rc.errors.warn("reserve", "ledger", &pool_name, &e);
                break;
            }
        };
        let Outcome::Reserved { granted: g, denied } = outcome else {
            rc.errors.note("reserve", "fenced", &pool_name, &format!("{outcome:?}"));
            break;
        };
        // A granted id is one claim's: a second claim of the id (names are drawn unique in a
        // round, but a grant must not be counted twice) is renamed like a refused one.
        let mut g: BTreeSet<String> = g.into_iter().collect();
        let duplicate: BTreeSet<String> =
            denied.iter().filter(|(_, d)| *d == Denial::DuplicateId).map(|(id, _)| id.clone()).collect();
        let mut next = Vec::new();
        for c in claims {
            if g.remove(&c.reserve.id) {
                granted.push(c);
            } else if duplicate.contains(&c.reserve.id) && attempt + 1 < rc.cfg.rename_attempts {
                next.push(c);
            } else {
                let why = denied
                    .iter()
                    .find(|(id, _)| *id == c.reserve.id)
                    .map_or_else(|| "not granted".to_string(), |(_, d)| d.to_string());
                unplaced.extend(c.pods.iter().map(|&p| (p, why.clone())));
            }
        }
        renamed += next.len() as u64;
        let cluster = rc.view.snapshot();
        rename(&mut next, &duplicate, &mut names, |id| cluster.nodeclaims.contains_key(id));
        claims = next;
    }
    for c in claims {
        unplaced.extend(c.pods.iter().map(|&p| (p, "the ledger did not reserve it".to_string())));
    }
    let count = granted.len();
    if count > 0 {
        // Karpenter's line for a provisioning decision, once the ledger committed it (in the
        // decision's trace).
        tracing::info!(
            parent: &reserving,
            nodepool = %pool_name,
            raft.term = rc.term,
            nodeclaims = count,
            pods = granted.iter().map(|c| c.pods.len()).sum::<usize>(),
            "nodepool.provision: computed new nodeclaim(s) to fit pod(s)"
        );
    }
    if let Ok(mut busy) = rc.busy.lock() {
        busy.extend(granted.iter().map(|c| c.reserve.id.clone()));
    }
    // Each claim's pods are held on it before it can show in the cluster's view: a Router
    // batch of other pods must not see it as free capacity while they are pending.
    // The window runs from now, not from the round's start (planning and the reservation
    // took a while).
    let held_at = rc.clock.now_millis();
    let until = held_at.saturating_add(nominate::window_of(&rc.cfg));
    rc.nominations.hold(
        granted
            .iter()
            .flat_map(|c| c.pods.iter().filter_map(|&i| Some((pods.get(i)?.key.clone(), c.nodeclaim.name.clone())))),
        held_at,
        until,
    );
    // The NodeClaims, created in the term the reservation committed in.
    let effects: Vec<Effect> = granted
        .iter()
        .map(|c| Effect::new(&c.reserve.id, Action::CreateNodeClaim(Box::new(c.nodeclaim.clone()))))
        .collect();
    let results = rc.executor.run(rc.term, effects).await;
    let mut created = Vec::with_capacity(granted.len());
    let mut gone = Vec::new();
    for (c, (_, done)) in granted.into_iter().zip(results) {
        match done {
            Done::Applied => {
                rc.executor.metrics().nodeclaim_created(&pool_name, "provisioned");
                created.push(c);
            }
            Done::Unchanged | Done::InFlight => created.push(c),
            _ => {
                // Not created: released, its pods back to the Router.
                unplaced.extend(c.pods.iter().map(|&p| (p, "its NodeClaim could not be created".to_string())));
                gone.push((c.reserve.id.clone(), Step::Gone));
            }
        }
    }
    if let Ok(mut busy) = rc.busy.lock() {
        for (id, _) in &gone {
            busy.remove(id);
        }
    }
    if !gone.is_empty() {
        let release = Command::Advance { steps: gone };
        if let Err(e) = rc.ledger.propose(Entry { term: rc.term, at: rc.clock.now_millis(), command: release }).await {
            rc.errors.warn("release", "ledger", &pool_name, &e);
        }
    }
    RoundDone { pods, created, unplaced, granted: count, renamed }
}
