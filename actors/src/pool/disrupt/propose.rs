//! A disruption round's proposals: each command with the effects it runs once the ledger
//! applied it (taints, replacement NodeClaims, events), proposed in order in the round's term,
//! and what a committed command adds to the metrics.

use std::collections::{BTreeMap, BTreeSet};

use actix::prelude::*;
use dovetail_cluster::Snapshot;
use dovetail_core::cluster::{Event, NodePatch, ObjectKind};
use dovetail_core::disruption::{Decision, Proposal};
use dovetail_core::effect::{Action, Effect};
use dovetail_core::ledger::{Command, Entry, Millis, Outcome, Term};
use dovetail_core::plane::disrupted_taint;
use dovetail_core::provisioning::{planned_claim, unique_claim_name};
use dovetail_core::scheduling::PoolInput;
use tracing::Instrument;

use crate::pool::NodePoolActor;

impl NodePoolActor {
    /// A proposal as a ledger command, with its effects once granted: its candidates
    /// tainted, its replacements' NodeClaims created, an event on each candidate. `None`
    /// when a replacement has no zone (said as an error).
    pub(super) fn disruption_command(
        &mut self,
        proposal: Proposal,
        decisions: &BTreeMap<String, Decision>,
        snap: &Snapshot,
        not_ready: Vec<String>,
    ) -> Option<(Command, Vec<Effect>)> {
        let zones: Vec<String> = self.zones.keys().cloned().collect();
        let input = PoolInput { pool: self.pool.clone(), instance_types: self.types.clone() };
        let mut replacements = Vec::new();
        for c in &proposal.replacements {
            let pool = &self.pool.name;
            let id = unique_claim_name(&mut self.names, pool, |id| snap.nodeclaims.contains_key(id));
            match planned_claim(c, &input, &zones, id) {
                Some(p) => replacements.push(p),
                None => {
                    self.errors.note("disrupt", "no_zone", &format!("nodepool/{pool}"), &"a replacement has no zone");
                    return None;
                }
            }
        }
        let command = format!("{}-{:x}", self.pool.name, self.names.next_u64() & 0xff_ffff);
        let mut effects = Vec::new();
        let taint = disrupted_taint();
        for claim in &proposal.candidates {
            let node = snap.nodeclaims.get(claim).and_then(|c| c.status.node_name.clone());
            if let Some(node) = node {
                let patch = NodePatch { add_taints: vec![taint.clone()], ..NodePatch::default() };
                effects.push(Effect::new(claim, Action::PatchNode { node, patch }));
            }
            let why = decisions.get(claim).map(|d| d.verdict.to_string()).unwrap_or_else(|| proposal.detail.clone());
            let e = Event {
                kind: ObjectKind::NodeClaim,
                name: claim.clone(),
                warning: false,
                reason: "DisruptionLaunching".into(),
                message: format!("disruption command {command} ({}): {why}", proposal.reason),
            };
            effects.push(Effect::new(claim, Action::Event(e)));
        }
        for r in &replacements {
            effects.push(Effect::new(&r.reserve.id, Action::CreateNodeClaim(Box::new(r.nodeclaim.clone()))));
        }
        let cmd = Command::Disrupt {
            pool: self.pool.name.clone(),
            command: command.clone(),
            reason: proposal.reason,
            candidates: proposal.candidates.clone(),
            replacements: replacements.into_iter().map(|r| r.reserve).collect(),
            not_ready,
        };
        Some((cmd, effects))
    }

    /// Proposes `command` in `term`; runs `effects` only if it committed and applied.
    pub(super) fn propose_then_run(
        &mut self,
        ctx: &mut Context<Self>,
        term: Term,
        command: Command,
        effects: Vec<Effect>,
        now: Millis,
    ) {
        self.propose_chain(ctx, term, vec![(command, effects)], now);
    }

    /// Proposes `chain` in order in `term`, each command's effects run once it applied, and
    /// stops at the first that did not: a round's commands were simulated each with the ones
    /// before it done.
    pub(super) fn propose_chain(
        &mut self,
        ctx: &mut Context<Self>,
        term: Term,
        chain: Vec<(Command, Vec<Effect>)>,
        now: Millis,
    ) {
        let (ledger, errors, pool, executor) =
            (self.ledger.clone(), self.errors.clone(), self.pool.name.clone(), self.executor.clone());
        // The candidates' capacity types, for the disruption metrics' labels.
        let snap = self.view.snapshot();
        let capacity: BTreeMap<String, String> = chain
            .iter()
            .filter_map(|(c, _)| match c {
                Command::Disrupt { candidates, .. } => Some(candidates),
                _ => None,
            })
            .flatten()
            .filter_map(|c| {
                let t = snap.nodeclaims.get(c)?.spec.labels.get(dovetail_core::labels::CAPACITY_TYPE)?;
                Some((c.clone(), t.clone()))
            })
            .collect();
        drop(snap);
        self.disruption_in_flight += 1;
        let work = async move {
            let mut any = false;
            for (command, effects) in chain {
                let counted = disruption_counts(&command, &capacity);
                // A disruption decision is a trace of its own: its ledger entry (and commit)
                // and its effects under it.
                let span = match &command {
                    Command::Disrupt { command: id, reason, candidates, replacements, .. } => tracing::info_span!(
                        parent: None,
                        "nodepool.disrupt",
                        nodepool = %pool,
                        command = %id,
                        reason = reason.as_str(),
                        candidates = candidates.len(),
                        replacements = replacements.len(),
                        applied = tracing::field::Empty,
                    ),
                    _ => tracing::Span::none(),
                };
                let applied = propose_one((&*ledger, &errors, &pool, &executor), term, now, command, effects)
                    .instrument(span.clone())
                    .await;
                span.record("applied", applied);
                if !applied {
                    break;
                }
                if let Some(c) = counted {
                    c.count(executor.metrics(), &pool);
                }
                any = true;
            }
            any
        };
        ctx.spawn(work.into_actor(self).map(|applied, act, _| {
            act.disruption_in_flight = act.disruption_in_flight.saturating_sub(1);
            if applied {
                act.dirty = true;
            }
        }));
    }
}

/// Proposes one command; runs its effects if it committed and applied. Returns whether it
/// applied.
async fn propose_one(
    (ledger, errors, pool, executor): (
        &dyn dovetail_raft::Ledger,
        &crate::errors::Errors,
        &str,
        &crate::executor::Executor,
    ),
    term: Term,
    now: Millis,
    command: Command,
    effects: Vec<Effect>,
) -> bool {
    let what = command_name(&command);
    let outcome = match ledger.propose(Entry { term, at: now, command }).await {
        Ok(c) => c.outcome,
        Err(e) => {
            errors.warn(what, "ledger", &format!("nodepool/{pool}"), &e);
            return false;
        }
    };
    let applied = match &outcome {
        Outcome::Disrupting { refused: Some(why) } => {
            errors.note(what, "refused", &format!("nodepool/{pool}"), why);
            false
        }
        Outcome::Advanced { rejected } => {
            for (claim, why) in rejected {
                errors.note(what, "rejected", &format!("nodeclaim/{claim}"), why);
            }
            true
        }
        Outcome::Fenced { .. } | Outcome::Rejected { .. } => false,
        _ => true,
    };
    // Effects of a claim whose step the ledger rejected are dropped.
    let rejected: BTreeSet<&str> = match &outcome {
        Outcome::Advanced { rejected } => rejected.iter().map(|(c, _)| c.as_str()).collect(),
        _ => BTreeSet::new(),
    };
    let effects: Vec<Effect> = effects.into_iter().filter(|e| !rejected.contains(e.claim.as_str())).collect();
    if applied && !effects.is_empty() {
        executor.run(term, effects).await;
    }
    applied
}

/// What a committed disruption command adds to the metrics.
struct DisruptionCounts {
    reason: String,
    consolidation_type: &'static str,
    candidates: Vec<String>,
    replacements: usize,
}

fn disruption_counts(c: &Command, capacity: &BTreeMap<String, String>) -> Option<DisruptionCounts> {
    let Command::Disrupt { reason, candidates, replacements, .. } = c else { return None };
    // Karpenter's: `empty`, `single` or `multi` (by the candidates of an underutilized
    // command: dovetail's repack of m nodes onto n counts as `multi`), none for drift.
    let consolidation_type = match (reason, candidates.len()) {
        (dovetail_core::nodepool::DisruptionReason::Empty, _) => "empty",
        (dovetail_core::nodepool::DisruptionReason::Underutilized, 1) => "single",
        (dovetail_core::nodepool::DisruptionReason::Underutilized, _) => "multi",
        _ => "",
    };
    Some(DisruptionCounts {
        reason: reason.as_str().to_lowercase(),
        consolidation_type,
        candidates: candidates.iter().map(|c| capacity.get(c).cloned().unwrap_or_default()).collect(),
        replacements: replacements.len(),
    })
}

impl DisruptionCounts {
    /// Karpenter's series for a committed command: its decision, each candidate disrupted,
    /// each replacement created (its NodeClaim was created by the command's effects).
    fn count(&self, m: &crate::metrics::Metrics, pool: &str) {
        let decision = if self.replacements == 0 { "delete" } else { "replace" };
        m.disruption_decision(decision, &self.reason, self.consolidation_type);
        for capacity in &self.candidates {
            m.nodeclaim_disrupted(&self.reason, pool, capacity);
        }
        for _ in 0..self.replacements {
            m.nodeclaim_created(pool, &self.reason);
        }
    }
}

fn command_name(c: &Command) -> &'static str {
    match c {
        Command::Disrupt { .. } => "disrupt",
        Command::EndDisruption { .. } => "end_disruption",
        _ => "disruption_steps",
    }
}
