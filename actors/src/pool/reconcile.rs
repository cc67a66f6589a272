//! The lifecycle, reconciled: `core::lifecycle::reconcile` plans on the blocking pool from the
//! pool's claims (read from the ledger) and a snapshot of the cluster; the plan's steps are
//! proposed in one entry in the term the ledger was read in; once they committed (and only
//! then), the plan's effects run: cluster effects on the executor, launches and
//! terminations on the zone actors. Effects of a claim whose step the ledger rejected are
//! dropped; a fenced entry drops them all.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use actix::prelude::*;
use dovetail_cluster::Snapshot;
use dovetail_core::clock::to_millis;
use dovetail_core::effect::{Action, Effect};
use dovetail_core::ledger::{BatchRecord, Claim, Command, Entry, Offering, Outcome, Step, Term};
use dovetail_core::lifecycle::{Input, Memory, Plan, reconcile};
use dovetail_raft::read_with;

use super::NodePoolActor;
use super::provision::{Group, Launches};
use crate::executor::Done;
use crate::trace;
use crate::zone::Terminate;

/// Reconcile now (the actor's timer does it every `reconcile_every`; drivers and tests may
/// ask sooner).
#[derive(Message)]
#[rtype(result = "()")]
pub struct Reconcile;

impl Handler<Reconcile> for NodePoolActor {
    type Result = ();

    fn handle(&mut self, _: Reconcile, ctx: &mut Context<Self>) {
        self.reconcile(ctx);
    }
}

/// What a reconcile read and planned.
struct Planned {
    plan: Plan,
    memory: Memory,
    snapshot: Arc<Snapshot>,
    synced: bool,
    /// The pool's claims in the ledger.
    live: BTreeSet<String>,
}

impl NodePoolActor {
    /// Every claim the actor tracks something of.
    fn tracked(&self) -> BTreeSet<String> {
        let mut t: BTreeSet<String> = self.launching.keys().cloned().collect();
        t.extend(self.terminating.keys().cloned());
        t.extend(self.retry_at.keys().cloned());
        t.extend(self.ice.keys().cloned());
        t.extend(self.pods.keys().cloned());
        t.extend(self.following.keys().cloned());
        t
    }

    /// Drops what is tracked of claims the ledger no longer knows.
    fn forget<'a>(&mut self, gone: impl Iterator<Item = &'a String>) {
        for claim in gone {
            self.launching.remove(claim);
            self.terminating.remove(claim);
            self.retry_at.remove(claim);
            self.ice.remove(claim);
            self.pods.remove(claim);
            self.following.remove(claim);
        }
    }

    /// Starts a reconcile unless one is under way (its plan reads the latest state anyway).
    pub(super) fn reconcile(&mut self, ctx: &mut Context<Self>) {
        let leadership = self.ledger.leadership().borrow().clone();
        if !leadership.leader {
            return;
        }
        if self.effecting {
            // The last plan's writes are under way: planned again once they are done.
            self.dirty = true;
            return;
        }
        let Some(memory) = self.memory.take() else {
            // One is under way: the next tick reconciles again.
            self.dirty = true;
            return;
        };
        self.dirty = false;
        self.last_reconcile = self.now();
        self.seen_term = leadership.term;
        let term = leadership.term;
        // What the actor tracks now: whatever of it the ledger no longer knows is dropped
        // once the read is in (entries made while the read runs are kept).
        let tracked = self.tracked();
        let (ledger, view, clock, errors) =
            (self.ledger.clone(), self.view.clone(), self.clock.clone(), self.errors.clone());
        let (pool, types, zones, cfg, busy) = (
            self.pool.name.clone(),
            self.types.clone(),
            self.zones.keys().cloned().collect::<Vec<_>>(),
            self.cfg.clone(),
            self.busy.clone(),
        );
        let name_for_errors = pool.clone();
        let work = async move {
            let now = clock.now_millis();
            let name = pool.clone();
            let read = read_with(&*ledger, move |s| {
                let claims: Vec<Claim> = s.claims_of(&name).cloned().collect();
                let ids: BTreeSet<&str> = claims.iter().filter_map(|c| c.state.batch()).collect();
                let batches: BTreeMap<String, BatchRecord> = s
                    .batches()
                    .iter()
                    .filter(|(id, _)| ids.contains(id.as_str()))
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect();
                let unavailable: BTreeSet<Offering> = s.unavailable(now).cloned().collect();
                let interrupted = dovetail_core::interruption::interrupted_claims(s, &name);
                (claims, batches, (unavailable, interrupted))
            })
            .await;
            let (claims, batches, (unavailable, interrupted)) = match read {
                Ok(r) => r,
                Err(e) => {
                    errors.warn("read_claims", "ledger", &pool, &e);
                    return Err(memory);
                }
            };
            let live: BTreeSet<String> = claims.iter().map(|c| c.id.clone()).collect();
            let snapshot = view.snapshot();
            let synced = view.synced();
            let busy: BTreeSet<String> = busy.lock().map(|b| b.clone()).unwrap_or_default();
            let inline = snapshot.pods.len() + snapshot.nodes.len() <= cfg.inline_plan_objects
                && claims.len() <= cfg.inline_plan_claims;
            let work = move || {
                let mut memory = memory;
                let input = Input {
                    pool: &pool,
                    claims: &claims,
                    batches: &batches,
                    snapshot: &snapshot,
                    synced,
                    now,
                    types: &types,
                    zones: &zones,
                    unavailable: &unavailable,
                    busy: &busy,
                    interrupted: &interrupted,
                };
                let plan = reconcile(&input, &cfg.lifecycle, &mut memory);
                Planned { plan, memory, snapshot, synced, live }
            };
            // A panic in the planner is an error of this reconcile, inline as on the pool: the
            // actor stays up and the next tick plans again.
            let planned = if inline {
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(work)).map_err(|p| panic_message(p.as_ref()))
            } else {
                tokio::task::spawn_blocking(work).await.map_err(|e| e.to_string())
            };
            planned.map_err(|e| {
                errors.warn("plan_lifecycle", "panic", &name_for_errors, &e);
                Memory::default()
            })
        };
        ctx.spawn(work.into_actor(self).map(move |planned, act, ctx| match planned {
            Err(memory) => {
                act.memory = Some(memory);
                act.dirty = true;
            }
            Ok(Planned { plan, memory, snapshot, synced, live }) => {
                act.memory = Some(memory);
                act.seen_version = Some(snapshot.resource_version);
                act.drop_stale_asks();
                // A plan that asked for something is followed up at the next tick.
                if !plan.is_empty() || !synced {
                    act.dirty = true;
                }
                act.forget(tracked.difference(&live));
                if !synced {
                    act.stats.unsynced += 1;
                }
                act.traced_binding(&snapshot);
                // Until its steps are committed and its effects done, no other plan is made
                // (cleared on every way out of `commit` and `run_effects`).
                act.effecting = true;
                act.commit(ctx, term, plan, snapshot);
            }
        }));
    }

    /// Forgets retry waits that are over and asks that went unanswered past `ask_again_after`
    /// (a reply dropped at a full mailbox, a zone fenced by a new term): the plan just made
    /// asks again for what it still needs, and the entries no longer keep the pool from
    /// being quiet.
    fn drop_stale_asks(&mut self) {
        let now = self.now();
        let wait = to_millis(self.cfg.ask_again_after);
        self.retry_at.retain(|_, at| now < *at);
        self.launching.retain(|_, at| now.saturating_sub(*at) < wait);
        self.terminating.retain(|_, at| now.saturating_sub(*at) < wait);
    }

    /// Proposes the plan's steps, then runs the effects the ledger allowed.
    fn commit(&mut self, ctx: &mut Context<Self>, term: Term, plan: Plan, snapshot: Arc<Snapshot>) {
        let Plan { steps, effects } = plan;
        if steps.is_empty() {
            self.run_effects(ctx, term, effects, &snapshot);
            return;
        }
        let (ledger, clock, errors, pool) =
            (self.ledger.clone(), self.clock.clone(), self.errors.clone(), self.pool.name.clone());
        let proposed = steps.clone();
        let work = async move {
            let entry = Entry { term, at: clock.now_millis(), command: Command::Advance { steps: proposed } };
            match ledger.propose(entry).await {
                Ok(c) => Some(c.outcome),
                Err(e) => {
                    errors.warn("advance", "ledger", &pool, &e);
                    None
                }
            }
        };
        ctx.spawn(work.into_actor(self).map(move |outcome, act, ctx| {
            let rejected: BTreeSet<String> = match outcome {
                Some(Outcome::Advanced { rejected }) => {
                    for (claim, why) in &rejected {
                        act.errors.note("advance", "rejected", &format!("nodeclaim/{claim}"), why);
                    }
                    rejected.into_iter().map(|(c, _)| c).collect()
                }
                // Fenced, or not committed: nothing of the plan may act.
                _ => {
                    act.effecting = false;
                    return;
                }
            };
            act.committed(&steps, &rejected, &effects, &snapshot);
            let allowed: Vec<Effect> = effects.into_iter().filter(|e| !rejected.contains(&e.claim)).collect();
            act.run_effects(ctx, term, allowed, &snapshot);
        }));
    }

    /// Counts and traces what committed.
    fn committed(
        &mut self,
        steps: &[(String, Step)],
        rejected: &BTreeSet<String>,
        effects: &[Effect],
        snap: &Snapshot,
    ) {
        let reason = |claim: &str| {
            effects.iter().find_map(|e| match &e.action {
                Action::Event(ev) if e.claim == claim => Some(ev.reason.clone()),
                _ => None,
            })
        };
        for (claim, step) in steps.iter().filter(|(c, _)| !rejected.contains(c)) {
            match step {
                Step::Registered => {
                    self.stats.registered += 1;
                    let node = effects.iter().find_map(|e| match &e.action {
                        Action::PatchStatus(p) | Action::Launched { status: p, .. } if e.claim == *claim => {
                            p.node_name.clone()
                        }
                        _ => None,
                    });
                    let node = node.or_else(|| snap.nodeclaims.get(claim).and_then(|nc| nc.status.node_name.clone()));
                    self.traced_registration(claim, node.as_deref().unwrap_or_default());
                }
                Step::Initialized => self.stats.initialized += 1,
                Step::Terminating => {
                    self.stats.terminating += 1;
                    let why = reason(claim);
                    tracing::info!(
                        nodepool = %self.pool.name,
                        nodeclaim = %claim,
                        reason = why.as_deref().unwrap_or("deleted"),
                        "nodepool.lifecycle: nodeclaim terminating"
                    );
                    match why.as_deref() {
                        Some("LivenessTimeout") => self.stats.expired += 1,
                        Some("NodeLost" | "NodeDeleted") => self.stats.lost += 1,
                        _ => {}
                    }
                }
                Step::Gone => {
                    // Every claim's end is logged: a reservation released unlaunched (a round
                    // cut off by a failover, after `create_grace`) shows here as well.
                    tracing::info!(
                        nodepool = %self.pool.name,
                        nodeclaim = %claim,
                        reason = reason(claim).as_deref().unwrap_or("done"),
                        "nodepool.lifecycle: nodeclaim gone"
                    );
                    self.launching.remove(claim);
                    self.terminating.remove(claim);
                    self.ice.remove(claim);
                    self.retry_at.remove(claim);
                    self.following.remove(claim);
                    // Its pods were never placed: they go back to the Router.
                    if let Some(pods) = self.pods.remove(claim) {
                        self.stats.released += 1;
                        let why = reason(claim).unwrap_or_else(|| "its claim went before launching".into());
                        tracing::info!(
                            nodepool = %self.pool.name,
                            nodeclaim = %claim,
                            pods = pods.pods.len(),
                            reason = %why,
                            "nodepool.lifecycle: nodeclaim released, its pods go back to the router"
                        );
                        self.give_back(pods, why);
                    }
                }
                _ => {}
            }
        }
    }

    /// Runs effects: cloud ones through the zone actors (each claim's once at a time, after
    /// its retry wait), cluster ones on the executor.
    fn run_effects(&mut self, ctx: &mut Context<Self>, term: Term, effects: Vec<Effect>, snap: &Snapshot) {
        let now = self.now();
        let mut cluster = Vec::new();
        // Launches asked again (each with whether its pods are this plane's own and whether a
        // call was made for it before), grouped.
        let mut launches = Launches::default();
        // Built at the first launch (most reconciles launch nothing).
        let types = self.types.clone();
        let mut by_name = None;
        for e in effects {
            let waiting = self.retry_at.get(&e.claim).is_some_and(|at| now < *at);
            match e.action {
                Action::Launch { zone, batch, again } => {
                    if waiting || self.still_asked(self.launching.get(&e.claim)) {
                        continue;
                    }
                    if self.types.is_empty() {
                        // A pool kept only for its claims' lifecycle (its NodePool missing or
                        // invalid since the start) knows no instance types or node class: it
                        // launches nothing; the registration timeout (no call made) ends it.
                        self.errors.note(
                            "launch",
                            "no_instance_types",
                            &format!("nodeclaim/{}", e.claim),
                            &"its NodePool is not provisioned for",
                        );
                        continue;
                    }
                    let Some(nc) = snap.nodeclaims.get(&e.claim) else { continue };
                    let by_name = by_name.get_or_insert_with(|| dovetail_core::plane::types_by_name(&types));
                    let request = self.launch_request(by_name, nc, &zone, batch.unwrap_or_default());
                    let causes = self.pods.get(&e.claim).map(|p| trace::distinct(&p.causes)).unwrap_or_default();
                    let fresh = self.pods.contains_key(&e.claim);
                    launches.add(zone, causes, request, (fresh, again));
                }
                Action::Terminate { zone, instance, batch } => {
                    if waiting || self.still_asked(self.terminating.get(&e.claim)) {
                        continue;
                    }
                    let Some(actor) = self.zones.get(&zone) else {
                        self.errors.warn("terminate", "no_zone_actor", &format!("nodeclaim/{}", e.claim), &zone);
                        continue;
                    };
                    let msg =
                        Terminate { claim: e.claim.clone(), instance, batch, term, reply: ctx.address().recipient() };
                    match actor.try_send(msg) {
                        Ok(()) => {
                            self.terminating.insert(e.claim, now);
                        }
                        Err(err) => {
                            let kind = if matches!(err, SendError::Full(_)) { "mailbox_full" } else { "closed" };
                            self.errors.note(
                                "terminate",
                                kind,
                                &format!("nodeclaim/{}", e.claim),
                                &"asked again on the next reconcile",
                            );
                        }
                    }
                }
                action => cluster.push(Effect { claim: e.claim, action }),
            }
        }
        for (zone, Group { causes, asks }) in launches.groups() {
            // Claims called before go ahead of the zone's queue, in a message of their own.
            let (called, first): (Vec<_>, Vec<_>) = asks.into_iter().partition(|(_, (_, again))| *again);
            for (asks, again) in [(called, true), (first, false)] {
                if asks.is_empty() {
                    continue;
                }
                let kinds: Vec<(String, bool)> = asks.iter().map(|(r, (fresh, _))| (r.claim.clone(), *fresh)).collect();
                let requests = asks.into_iter().map(|(r, _)| r).collect();
                if !self.send_launches(ctx, &zone, requests, causes.clone(), again) {
                    continue;
                }
                for (claim, fresh) in kinds {
                    if let Some(counted) = self.ice.get_mut(&claim) {
                        if !*counted {
                            *counted = true;
                            self.stats.relaunched += 1;
                        }
                    } else if !fresh {
                        self.stats.resumed += 1;
                    }
                }
            }
        }
        if cluster.is_empty() {
            self.effecting = false;
            return;
        }
        let executor = self.executor.clone();
        ctx.spawn(async move { executor.run(term, cluster).await }.into_actor(self).map(|results, act, _| {
            act.effecting = false;
            act.dirty = true;
            for (e, done) in results {
                if done != Done::Applied {
                    continue;
                }
                match e.action {
                    Action::Evict(_) => act.stats.evicted += 1,
                    Action::DeletePod { .. } => act.stats.force_deleted += 1,
                    _ => {}
                }
            }
        }));
    }
}

/// What a caught panic said.
fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|m| (*m).to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".to_string())
}
