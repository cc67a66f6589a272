//! Disruption, driven. Every `disruption.every` the actor reads the pool's claims, the
//! ledger's leases, allowances and commands under way, and `core::disruption::plan` decides
//! (off the arbiter); the shell proposes what it decided and runs the effects only once the
//! ledger committed them in the current term:
//!
//! - **expired** claims: `Step::Terminating` (the lifecycle drains and terminates them; not
//!   budgeted);
//! - **a new command**: `Command::Disrupt`, which the ledger grants only within the pool's
//!   budgets and rate; once granted, the candidates are tainted `karpenter.sh/disrupted` and
//!   the replacements' NodeClaims created (the lifecycle launches them);
//! - **commands under way** (`core::disruption::progress`): the candidates are terminated
//!   once every replacement is initialized; a command whose replacement failed or timed out
//!   is ended and its candidates untainted;
//! - **stale taints**: a node of the pool tainted `karpenter.sh/disrupted` that no command
//!   holds and that is not terminating loses the taint;
//! - **conditions**: each node's decision on its NodeClaim, as Karpenter's `Consolidatable`
//!   (with the decision and its reason as the message) and `Drifted`, written when it changed.
//!
//! Every `disruption.drift_every` (and at a leader's first round) the cloud provider is asked
//! which of the pool's instances drifted from its node class (`CloudProvider::is_drifted`, over
//! one `list` of the cluster's instances): the planner's NodeClass drift.
//!
//! Every node's decision, with its reason, is kept for `explain` ([`GetDecisions`]).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use dovetail_cluster::Snapshot;
use dovetail_core::clock::to_millis;
use dovetail_core::cluster::{Event, NodePatch, ObjectKind, StatusPatch};
use dovetail_core::disruption::candidates::Blocker;
use dovetail_core::disruption::{self, Decision, Input, Memory, Plan, Progress, Verdict};
use dovetail_core::effect::{Action, Effect};
use dovetail_core::ledger::{Allowance, Claim, Command, Millis, Offering, Step, Term};
use dovetail_core::lifecycle::provider_id;
use dovetail_core::nodepool::DisruptionReason;
use dovetail_core::plane::disrupted_taint;
use dovetail_core::provisioning::available_types;
use dovetail_core::scheduling::PoolInput;
use dovetail_raft::read_with;

use super::NodePoolActor;

mod propose;

/// Plan disruption now (the actor's timer does it every `disruption.every`).
#[derive(Message)]
#[rtype(result = "()")]
pub struct Disrupt;

/// Every node's last disruption decision, by claim.
#[derive(Message)]
#[rtype(result = "BTreeMap<String, Decision>")]
pub struct GetDecisions;

/// What a disruption round read and planned.
pub(super) struct Planned {
    plan: Plan,
    memory: Memory,
    snapshot: Arc<Snapshot>,
    /// Commands of this pool under way, with where each stands.
    commands: Vec<(String, Vec<String>, Progress)>,
    /// Claims leased to a command.
    leased: BTreeSet<String>,
    /// Claims terminating.
    terminating: BTreeSet<String>,
    /// Claims whose node is not ready: the ledger counts them as disrupting.
    not_ready: Vec<String>,
    /// What the pool's budgets leave, by reason, as the ledger counted it.
    allowances: BTreeMap<DisruptionReason, Allowance>,
    now: Millis,
}

/// A round's decisions, with what the shell acts on besides.
struct Round {
    plan: Plan,
    commands: Vec<(String, Vec<String>, Progress)>,
    leased: BTreeSet<String>,
    terminating: BTreeSet<String>,
    not_ready: Vec<String>,
    now: Millis,
}

impl Handler<Disrupt> for NodePoolActor {
    type Result = ();

    fn handle(&mut self, _: Disrupt, ctx: &mut Context<Self>) {
        self.disrupt(ctx);
    }
}

impl Handler<GetDecisions> for NodePoolActor {
    type Result = MessageResult<GetDecisions>;

    fn handle(&mut self, _: GetDecisions, _: &mut Context<Self>) -> Self::Result {
        MessageResult(self.decisions.clone())
    }
}

impl NodePoolActor {
    /// Starts a disruption round unless one is under way.
    pub(super) fn disrupt(&mut self, ctx: &mut Context<Self>) {
        if !self.cfg.disruption.enabled {
            return;
        }
        let leadership = self.ledger.leadership().borrow().clone();
        if !leadership.leader {
            // Only the leader serves the pool's budget gauges (as the cluster's state).
            self.executor.metrics().budgets.forget(&self.pool.name);
            return;
        }
        // The last round's proposals are still being committed: the next round plans from
        // what they made (a command proposed twice, a taint removed under a new lease).
        if self.types.is_empty() || self.disruption_in_flight > 0 {
            return;
        }
        let due = self
            .drift_checked
            .is_none_or(|at| self.clock.now_millis().saturating_sub(at) >= to_millis(self.cfg.disruption.drift_every));
        if due {
            self.check_drift(ctx);
        }
        let Some(memory) = self.disruption_memory.take() else { return };
        let term = leadership.term;
        let (ledger, view, clock, errors, cfg) =
            (self.ledger.clone(), self.view.clone(), self.clock.clone(), self.errors.clone(), self.cfg.clone());
        let pool = self.pool.clone();
        let types = self.types.clone();
        let retired = self.retired;
        let cloud_drift = self.cloud_drift.clone();
        let nominated = self.nominations.active(self.clock.now_millis());
        let work = async move {
            let now = clock.now_millis();
            let snapshot = view.snapshot();
            let synced = view.synced();
            let timeout = to_millis(cfg.disruption.command_timeout);
            let name = pool.name.clone();
            let snap = snapshot.clone();
            let read = read_with(&*ledger, move |s| {
                let claims: Vec<Claim> = s.claims_of(&name).cloned().collect();
                let by_provider = snap.nodes_by_provider_id();
                let not_ready: Vec<String> = claims
                    .iter()
                    .filter(|c| {
                        c.state
                            .instance()
                            .and_then(|i| by_provider.get(provider_id(&c.zone, i).as_str()))
                            .is_some_and(|n| !n.ready)
                    })
                    .map(|c| c.id.clone())
                    .collect();
                let allowances: BTreeMap<DisruptionReason, Allowance> = DisruptionReason::ALL
                    .into_iter()
                    .filter_map(|r| Some((r, s.allowance(&name, r, &not_ready, now)?)))
                    .collect();
                let mut leases = BTreeMap::new();
                let mut commands = Vec::new();
                for (id, cmd) in s.disruptions().iter().filter(|(_, d)| d.pool == name) {
                    for c in &cmd.candidates {
                        leases.insert(c.clone(), id.clone());
                    }
                    commands.push((id.clone(), cmd.candidates.clone(), disruption::progress(s, cmd, now, timeout)));
                }
                // An interrupted claim is EC2's to take: no method disrupts it, and its taint
                // is not stale.
                for (claim, (record, _)) in dovetail_core::interruption::interrupted_claims(s, &name) {
                    leases.entry(claim).or_insert_with(|| format!("interruption/{}", record.kind));
                }
                let unavailable: BTreeSet<Offering> = s.unavailable(now).cloned().collect();
                (claims, allowances, leases, commands, (unavailable, not_ready))
            })
            .await;
            let (claims, allowances, leases, commands, (unavailable, not_ready)) = match read {
                Ok(r) => r,
                Err(e) => {
                    errors.warn("read_disruption", "ledger", &pool.name, &e);
                    return Err(memory);
                }
            };
            // A reason the ledger does not know the pool for allows nothing.
            let available: BTreeMap<DisruptionReason, u32> = DisruptionReason::ALL
                .into_iter()
                .map(|r| (r, allowances.get(&r).map_or(0, Allowance::available)))
                .collect();
            let terminating: BTreeSet<String> =
                claims.iter().filter(|c| c.state.is_terminating()).map(|c| c.id.clone()).collect();
            let leased: BTreeSet<String> = leases.keys().cloned().collect();
            let label = name_for(&pool.name);
            let work = move || {
                let mut memory = memory;
                let pools = [PoolInput { pool: pool.clone(), instance_types: available_types(&types, &unavailable) }];
                // A retired pool (its NodePool gone or invalid) starts no command; its
                // commands under way still finish.
                let none = BTreeMap::new();
                let input = Input {
                    pool: &pool,
                    types: &types,
                    claims: &claims,
                    leases: &leases,
                    available: if retired { &none } else { &available },
                    cloud_drift: &cloud_drift,
                    nominated: &nominated,
                    snapshot: &snapshot,
                    pools: &pools,
                    opts: &cfg.solve,
                    spot_to_spot: cfg.disruption.spot_to_spot,
                    validation: to_millis(cfg.disruption.validation),
                    max_commands: cfg.disruption.max_commands,
                    synced,
                    now,
                };
                let plan = disruption::plan(&input, &mut memory);
                Planned { plan, memory, snapshot, commands, leased, terminating, not_ready, allowances, now }
            };
            tokio::task::spawn_blocking(work).await.map_err(|e| {
                errors.warn("plan_disruption", "panic", &label, &e);
                Memory::default()
            })
        };
        ctx.spawn(work.into_actor(self).map(move |planned, act, ctx| match planned {
            Err(memory) => act.disruption_memory = Some(memory),
            Ok(Planned { plan, memory, snapshot, commands, leased, terminating, not_ready, allowances, now }) => {
                act.report_budgets(term, &allowances);
                // A command under validation is proposed when its validation ends, not at the
                // next period (Karpenter waits exactly its 15 s too).
                if let Some(due) = memory.validation_due(to_millis(act.cfg.disruption.validation), now) {
                    let wait = Duration::from_millis(due.saturating_sub(now).max(1));
                    if wait < act.cfg.disruption.every {
                        ctx.run_later(wait, |act, ctx| act.disrupt(ctx));
                    }
                }
                act.disruption_memory = Some(memory);
                act.decisions = plan.decisions.clone();
                let round = Round { plan, commands, leased, terminating, not_ready, now };
                act.act_on_disruption(ctx, term, round, &snapshot);
            }
        }));
    }

    /// Karpenter's budget gauges, from the count the ledger grants leases by: set while this
    /// actor leads in the round's term and its pool is live (Karpenter lists only live pools),
    /// removed otherwise.
    fn report_budgets(&self, term: Term, allowances: &BTreeMap<DisruptionReason, Allowance>) {
        let budgets = &self.executor.metrics().budgets;
        if self.retired || !self.ledger.leadership().borrow().is_current(term) {
            budgets.forget(&self.pool.name);
        } else {
            budgets.update(&self.pool.name, allowances);
        }
    }

    /// Asks the cloud provider which of the pool's launched instances drifted from the
    /// pool's node class; the answer replaces the last (an instance gone or back in line is
    /// forgotten). A failed check keeps the last answer and is retried at the next round.
    fn check_drift(&mut self, ctx: &mut Context<Self>) {
        if self.drift_checking || self.retired {
            return;
        }
        self.drift_checking = true;
        let (ledger, cloud, node_class) = (self.ledger.clone(), self.cloud.clone(), self.node_class.clone());
        let asked = node_class.clone();
        let name = self.pool.name.clone();
        let work = async move {
            let claims: Vec<(String, String)> = read_with(&*ledger, move |s| {
                s.claims_of(&name)
                    .filter(|c| !c.state.is_terminating())
                    .filter_map(|c| Some((c.id.clone(), c.state.instance()?.to_string())))
                    .collect()
            })
            .await
            .map_err(|e| ("ledger", e.to_string()))?;
            let mut drifted = BTreeMap::new();
            if claims.is_empty() {
                return Ok((drifted, None));
            }
            let live = cloud.list().await.map_err(|e| ("cloud", e.to_string()))?;
            let by_id: BTreeMap<&str, &dovetail_cloud::Instance> = live.iter().map(|i| (i.id.as_str(), i)).collect();
            // An instance the provider cannot judge now is left out of this answer (said once,
            // with how many), not the whole check.
            let mut failed: Option<(usize, String)> = None;
            for (claim, id) in claims {
                let Some(instance) = by_id.get(id.as_str()) else { continue };
                match cloud.is_drifted(instance, &node_class).await {
                    Ok(Some(reason)) => {
                        drifted.insert(claim, reason.as_str().to_string());
                    }
                    Ok(None) => {}
                    Err(e) => failed.get_or_insert((0, format!("instance {id}: {e}"))).0 += 1,
                }
            }
            Ok::<_, (&'static str, String)>((drifted, failed))
        };
        ctx.spawn(work.into_actor(self).map(move |checked, act, _| {
            act.drift_checking = false;
            // The node class changed while it was asked: the answer is about the old one.
            if act.node_class != asked {
                return;
            }
            // Asked again after `drift_every` either way: a failure is not retried every round.
            act.drift_checked = Some(act.clock.now_millis());
            let pool = name_for(&act.pool.name);
            match checked {
                Ok((drifted, failed)) => {
                    act.cloud_drift = drifted;
                    if let Some((n, first)) = failed {
                        let said = format!("{n} instance(s) not judged; {first}");
                        act.errors.warn("check_drift", "cloud", &pool, &said);
                    }
                }
                Err((kind, e)) => act.errors.warn("check_drift", kind, &pool, &e),
            }
        }));
    }

    /// Proposes what a round decided and runs the effects the ledger allowed.
    fn act_on_disruption(&mut self, ctx: &mut Context<Self>, term: Term, round: Round, snap: &Snapshot) {
        let Round { plan, commands, leased, terminating, not_ready, now } = round;
        // Indexed once: the stale-taint pass looks up every node of the pool.
        let by_provider = snap.nodes_by_provider_id();
        let node_of = |claim: &str| -> Option<String> {
            let p = snap.nodeclaims.get(claim)?.status.provider_id.as_deref()?;
            by_provider.get(p).map(|n| n.name.clone())
        };
        let event = |claim: &str, warning: bool, reason: &str, message: String| {
            let e =
                Event { kind: ObjectKind::NodeClaim, name: claim.to_string(), warning, reason: reason.into(), message };
            Effect::new(claim, Action::Event(e))
        };
        // Terminations: expired claims, and candidates whose replacements are up.
        let mut steps: Vec<(String, Step)> = Vec::new();
        let mut effects: Vec<Effect> = Vec::new();
        for claim in &plan.expired {
            steps.push((claim.clone(), Step::Terminating));
            let why = plan.decisions.get(claim).map(|d| d.verdict.to_string()).unwrap_or_default();
            effects.push(event(claim, false, "Expired", format!("nodeclaim {claim} {why}")));
            self.stats.expired_nodes += 1;
        }
        let mut rollbacks = Vec::new();
        for (id, candidates, progress) in commands {
            match progress {
                Progress::Terminate(list) => {
                    for claim in list {
                        effects.push(event(
                            &claim,
                            false,
                            "DisruptionTerminating",
                            format!("disruption command {id}: its replacements are initialized"),
                        ));
                        steps.push((claim, Step::Terminating));
                        self.stats.disrupted += 1;
                    }
                }
                Progress::RollBack(why) => rollbacks.push((id, candidates, why)),
                Progress::Waiting | Progress::Done => {}
            }
        }
        if !steps.is_empty() {
            self.propose_then_run(ctx, term, Command::Advance { steps }, effects, now);
        }
        for (id, candidates, why) in rollbacks {
            let mut effects = Vec::new();
            for claim in &candidates {
                if let Some(node) = node_of(claim) {
                    let patch = NodePatch { remove_taints: vec![disrupted_taint()], ..NodePatch::default() };
                    effects.push(Effect::new(claim, Action::PatchNode { node, patch }));
                }
                effects.push(event(claim, true, "DisruptionFailed", format!("disruption command {id} ended: {why}")));
            }
            self.stats.rolled_back += 1;
            self.propose_then_run(ctx, term, Command::EndDisruption { command: id }, effects, now);
        }
        // Stale taints: nodes of the pool no command holds and that are not terminating.
        let mut stale = Vec::new();
        let taint = disrupted_taint();
        let proposed: BTreeSet<&String> = plan.proposals.iter().flat_map(|p| p.candidates.iter()).collect();
        let held = |c: &String| leased.contains(c) || terminating.contains(c) || proposed.contains(c);
        for (claim, _) in plan.decisions.iter().filter(|(c, _)| !held(c)) {
            let Some(node) = node_of(claim).and_then(|n| snap.nodes.get(&n).cloned()) else { continue };
            if node.deleting || !node.taints.iter().any(|t| t.key == taint.key && t.effect == taint.effect) {
                continue;
            }
            let patch = NodePatch { remove_taints: vec![taint.clone()], ..NodePatch::default() };
            stale.push(Effect::new(claim, Action::PatchNode { node: node.name.clone(), patch }));
        }
        // Each decision on its NodeClaim (`Consolidatable`, `Drifted`), written only when it
        // changed: the messages carry no running clock.
        // Karpenter says them of initialized claims only; `Drifted` once the cloud was asked.
        let booting = |c: &String| {
            plan.decisions.get(c).is_some_and(|d| matches!(d.verdict, Verdict::Blocked(Blocker::NotInitialized { .. })))
        };
        for claim in plan.decisions.keys().filter(|c| !terminating.contains(*c) && !booting(c)) {
            let Some(nc) = snap.nodeclaims.get(claim).filter(|nc| !nc.deleting) else { continue };
            let Some([consolidatable, drifted]) = plan.conditions(claim) else { continue };
            let mut conditions = vec![consolidatable];
            if self.drift_checked.is_some() {
                conditions.push(drifted);
            }
            let patch = StatusPatch { conditions, ..StatusPatch::default() };
            if patch.apply(&nc.status).is_some() {
                stale.push(Effect::new(claim, Action::PatchStatus(patch)));
            }
        }
        if !stale.is_empty() {
            let executor = self.executor.clone();
            self.disruption_in_flight += 1;
            ctx.spawn(async move { executor.run(term, stale).await }.into_actor(self).map(|_, act, _| {
                act.disruption_in_flight = act.disruption_in_flight.saturating_sub(1);
            }));
        }
        // The round's commands in order, each granted by the ledger within what the budgets
        // leave after the ones before it, stopping at the first refused (each was simulated
        // with the ones before it done).
        let mut chain = Vec::new();
        for proposal in plan.proposals {
            match self.disruption_command(proposal, &plan.decisions, snap, not_ready.clone()) {
                Some(c) => chain.push(c),
                None => break,
            }
        }
        if !chain.is_empty() {
            self.stats.commands_proposed += chain.len() as u64;
            self.propose_chain(ctx, term, chain, now);
        }
    }
}

fn name_for(pool: &str) -> String {
    format!("nodepool/{pool}")
}
