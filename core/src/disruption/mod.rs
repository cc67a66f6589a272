//! Disruption planning: which nodes go, why, and within which budgets.
//!
//! - [`budget`]: Karpenter's disruption budgets (count or percentage, UTC cron windows,
//!   reasons, the minimum over active budgets, disrupting nodes counted, an invalid schedule
//!   failing closed) and dovetail's rate budget; the ledger checks them when it grants a
//!   disruption command ([`crate::ledger::Command::Disrupt`]).
//! - [`cron`]: the budgets' schedules.
//! - [`candidates`]: which nodes may be disrupted at all (do-not-disrupt, PDBs, leases,
//!   initialization) and what moving their pods costs.
//! - [`drift`]: whether a node still matches its NodePool and NodeClass.
//! - [`consolidation`]: whether candidates can go with their pods moved elsewhere, and with
//!   what replacement.
//! - [`simulation`]: where moved pods go, on a solve state built once a round.
//! - `choice`: which consolidation commands a round proposes; `validation`: Karpenter's 15 s.
//!
//! [`plan`] is the planner the NodePool actors call: pure, from the pool's claims as
//! committed, the ledger's leases and allowances, the cluster snapshot and `now`, it returns
//! the expired claims to terminate (forceful, not budgeted), the commands to propose (each
//! with its method's reason, candidates and replacements: one, or with `max_commands` several
//! consolidation commands, each simulated with the ones before it done) and a [`Decision`]
//! for every node, with the reason (what `explain` prints).
//!
//! Methods run in Karpenter's order and the first that finds something wins the round:
//! emptiness, drift, then consolidation (multi-node, single-node, then dovetail's repack of m
//! nodes onto n < m new ones, where a single replacement cannot get there). Expiration is not
//! a method of the loop: an expired claim is terminated whatever the budgets say.
pub mod budget;
pub mod candidates;
mod choice;
pub mod consolidation;
pub mod cron;
mod decision;
pub mod drift;
mod memory;
mod progress;
pub mod simulation;
mod validation;

use std::collections::{BTreeMap, BTreeSet};

use crate::catalog::InstanceType;
use crate::clock::to_millis;
use crate::cluster::Snapshot;
use crate::ledger::{Claim, Millis};
use crate::nodepool::{ConsolidationPolicy, DisruptionReason, NodePool};
use crate::pod::Pod;
use crate::scheduling::{PoolInput, SolveOptions};

use candidates::{Blocker, Candidate, PdbIndex, Pieces};
use choice::{consolidate, unplaced};
pub use decision::{Decision, Method, Plan, Proposal, Verdict};
use drift::Drift;
pub use memory::Memory;
use memory::{cluster_shape, fingerprint};
pub use progress::{Progress, progress};
use validation::validate;

/// What the planner reads.
pub struct Input<'a> {
    pub pool: &'a NodePool,
    /// The instance types the pool can launch now.
    pub types: &'a [InstanceType],
    /// The pool's claims, as committed.
    pub claims: &'a [Claim],
    /// Claims leased to a disruption command, with the command.
    pub leases: &'a BTreeMap<String, String>,
    /// What the pool's budgets (and rate budget) leave per reason now.
    pub available: &'a BTreeMap<DisruptionReason, u32>,
    /// Claims the cloud provider reports drifted, with its reason.
    pub cloud_drift: &'a BTreeMap<String, String>,
    /// Nodes (and in-flight NodeClaims, by name) the provisioner planned pending pods onto,
    /// with when that nomination ends: not disrupted until then.
    pub nominated: &'a BTreeMap<String, Millis>,
    pub snapshot: &'a Snapshot,
    /// Every NodePool with its instance types: where moved pods may land on a new node.
    pub pools: &'a [PoolInput],
    pub opts: &'a SolveOptions,
    /// Karpenter's `SpotToSpotConsolidation` setting.
    pub spot_to_spot: bool,
    /// How long an emptiness or consolidation command must keep being what the planner
    /// decides before it is proposed (Karpenter: 15 s); drift and expiration do not wait.
    pub validation: Millis,
    /// How many consolidation commands a round may propose at most (each within the budget
    /// left by the ones before it); 1 is Karpenter's one command a round.
    pub max_commands: usize,
    /// With `false` nothing is decided.
    pub synced: bool,
    pub now: Millis,
}

/// Candidates the multi-node method considers at most (Karpenter: 100).
pub const MULTI_NODE_MAX: usize = 100;
/// Karpenter's `BalancedK`: a balanced move must score at least `1/k`.
pub const BALANCED_K: f64 = 2.0;
/// A pool whose consolidation found nothing is not simulated again while the cluster's nodes,
/// their pods and the pool's candidates stay as they were, for at most this long (Karpenter's
/// consolidation state, force-refreshed every 5 minutes).
pub const CONSOLIDATION_RECHECK: Millis = 5 * 60_000;

/// Plans one round of disruption for a pool.
pub fn plan(input: &Input<'_>, memory: &mut Memory) -> Plan {
    let mut out = Plan::default();
    if !input.synced {
        return out;
    }
    let snap = input.snapshot;
    let by_provider = snap.nodes_by_provider_id();
    let pods_by_node = snap.pods_by_node();
    let pdbs = PdbIndex::new(snap);
    // Nodes pending pods are nominated to: the scheduler made room there for them.
    let nominated: BTreeMap<&str, &Pod> =
        snap.pending().filter_map(|p| Some((p.nominated_node.as_deref()?, p.as_ref()))).collect();
    let no_pods = Vec::new();
    let mut seen: BTreeSet<&str> = BTreeSet::new();
    let mut empty: Vec<Candidate<'_>> = Vec::new();
    let mut underused: Vec<Candidate<'_>> = Vec::new();
    // The pool's cost and disruption cost over every candidate (the balanced policy's scale).
    let mut pool_totals = (0.0, 0.0);
    let mut drifted: Vec<(Millis, bool, Candidate<'_>, Drift)> = Vec::new();
    let consolidate_after = input.pool.disruption.consolidate_after.map(to_millis);
    let types = crate::plane::types_by_name(input.types);
    let drift_check = drift::DriftCheck::new(input.pool, &types);
    for claim in input.claims {
        seen.insert(claim.id.as_str());
        let nodeclaim = snap.nodeclaims.get(&claim.id).map(|c| c.as_ref());
        let node = claim
            .state
            .instance()
            .and_then(|i| by_provider.get(crate::lifecycle::provider_id(&claim.zone, i).as_str()))
            .map(|n| n.as_ref());
        let pods = node.and_then(|n| pods_by_node.get(n.name.as_str())).unwrap_or(&no_pods);
        let decide = |verdict| Decision { claim: claim.id.clone(), node: node.map(|n| n.name.clone()), verdict };
        // Expiration: forceful, before anything else.
        if let (Some(nc), Some(_)) = (nodeclaim, node)
            && let Some(expire) = nc.spec.expire_after.map(to_millis)
            && !nc.deleting
            && !claim.state.is_terminating()
            && input.now.saturating_sub(nc.born(claim.reserved_at)) >= expire
        {
            out.expired.push(claim.id.clone());
            out.decisions.insert(claim.id.clone(), decide(Verdict::Expired { expire_after: expire }));
            continue;
        }
        let pieces = Pieces { claim, node, nodeclaim, pods: pods.clone() };
        let lease = input.leases.get(&claim.id).map(String::as_str);
        let drift = node.zip(nodeclaim).and_then(|(n, nc)| {
            let cloud = input.cloud_drift.get(&claim.id).map(String::as_str);
            drift_check.drifted(n, &nc.spec.annotations, cloud)
        });
        // Drifted whatever else holds it (a command, a PDB): its NodeClaim says so.
        if let Some(d) = &drift {
            out.drifted.insert(claim.id.clone(), (d.reason().to_string(), d.to_string()));
        }
        let candidate = candidates::candidate(&pieces, lease, &types, &pdbs, input.now, drift.is_some());
        let candidate = candidate.and_then(|c| match nominated.get(c.node.name.as_str()) {
            Some(p) => Err(Blocker::Nominated { pod: p.key.clone() }),
            None => match [&c.node.name, &claim.id]
                .into_iter()
                .find_map(|n| input.nominated.get(n).filter(|until| **until > input.now))
            {
                Some(until) => Err(Blocker::Planned { until: *until }),
                None => Ok(c),
            },
        });
        let c = match candidate {
            Ok(c) => c,
            Err(b) => {
                out.decisions.insert(claim.id.clone(), decide(Verdict::Blocked(b)));
                continue;
            }
        };
        pool_totals.0 += c.price;
        pool_totals.1 += c.disruption_cost;
        // A node first seen whose NodeClaim says it is consolidatable (a leader before this one
        // saw its pods still for consolidateAfter) does not wait again: Karpenter keeps that
        // time on the NodeClaim too.
        let seen = consolidate_after
            .filter(|_| nodeclaim.is_some_and(|nc| nc.status.is("Consolidatable")))
            .map(|after| input.now.saturating_sub(after));
        let last_event = memory.last_pod_event(&claim.id, fingerprint(pods), input.now, seen);
        if let Some(d) = drift {
            let since = *memory.drifted_since.entry(claim.id.clone()).or_insert(input.now);
            // Empty and settled, it is emptiness's first (Karpenter's first method takes every
            // consolidatable empty node, drifted or not; drift gets what its budget leaves).
            // With pods, consolidation may take it too (Karpenter's consolidation does not
            // skip drifted nodes: drift's budget may be spent), as a graceful method: only
            // if no pod-level block holds it.
            let settled = consolidate_after.is_some_and(|after| input.now >= last_event.saturating_add(after));
            if settled {
                out.consolidatable.insert(claim.id.clone());
                if c.is_empty() {
                    empty.push(c.clone());
                } else if input.pool.disruption.consolidation_policy != ConsolidationPolicy::WhenEmpty
                    && let Ok(graceful) = candidates::candidate(&pieces, lease, &types, &pdbs, input.now, false)
                {
                    underused.push(graceful);
                }
            }
            drifted.push((since, c.is_empty(), c, d));
            continue;
        }
        memory.drifted_since.remove(&claim.id);
        let Some(after) = consolidate_after else {
            out.decisions.insert(claim.id.clone(), decide(Verdict::Keep("consolidateAfter is Never".into())));
            continue;
        };
        let settles_at = last_event.saturating_add(after);
        if input.now < settles_at {
            let verdict = Verdict::Settling { changed_ago: input.now.saturating_sub(last_event), after };
            out.decisions.insert(claim.id.clone(), decide(verdict));
            continue;
        }
        out.consolidatable.insert(claim.id.clone());
        if c.is_empty() {
            empty.push(c);
        } else if input.pool.disruption.consolidation_policy == ConsolidationPolicy::WhenEmpty {
            let why = "it runs pods and the consolidation policy is WhenEmpty".to_string();
            out.decisions.insert(claim.id.clone(), decide(Verdict::Keep(why)));
        } else {
            underused.push(c);
        }
    }
    memory.keep_only(&seen);
    // Emptiness: every empty candidate the budget leaves room for, the dearest first (the most
    // saved).
    let room = |r: DisruptionReason| input.available.get(&r).copied().unwrap_or(0) as usize;
    let decide =
        |c: &Candidate<'_>, verdict| Decision { claim: c.claim.id.clone(), node: Some(c.node.name.clone()), verdict };
    if !empty.is_empty() {
        empty.sort_by(|a, b| b.price.total_cmp(&a.price).then_with(|| a.claim.id.cmp(&b.claim.id)));
        let n = room(DisruptionReason::Empty).min(empty.len());
        for (i, c) in empty.iter().enumerate() {
            let verdict = if i < n {
                Verdict::Disrupt { method: Method::Emptiness, detail: "it runs no pods that must move".into() }
            } else {
                Verdict::BudgetExhausted { method: Method::Emptiness }
            };
            out.decisions.insert(c.claim.id.clone(), decide(c, verdict));
        }
        if n > 0 {
            out.proposals.push(Proposal {
                method: Method::Emptiness,
                reason: DisruptionReason::Empty,
                candidates: empty[..n].iter().map(|c| c.claim.id.clone()).collect(),
                replacements: vec![],
                detail: "empty nodes".into(),
            });
        }
    }
    // The simulation, built once for every move this round may try (drift's and
    // consolidation's), when any needs it.
    drifted.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)).then_with(|| a.2.claim.id.cmp(&b.2.claim.id)));
    let drift_room = room(DisruptionReason::Drifted) > 0;
    let shape = (!underused.is_empty())
        .then(|| cluster_shape(snap, &pods_by_node, underused.iter().map(|c| c.claim.id.as_str())));
    let quiet =
        memory.quiet.filter(|(s, at)| Some(*s) == shape && input.now.saturating_sub(*at) < CONSOLIDATION_RECHECK);
    let consolidating = out.proposals.is_empty()
        && !underused.is_empty()
        && quiet.is_none()
        && room(DisruptionReason::Underutilized) > 0;
    let drifting = out.proposals.is_empty() && drift_room && drifted.iter().any(|d| !d.1);
    let prepared = (consolidating || drifting).then(|| {
        let mut seen = BTreeSet::new();
        let movers: Vec<simulation::Mover<'_>> = drifted
            .iter()
            .filter(|d| !d.1)
            .map(|d| (&d.2).into())
            .chain(underused.iter().map(Into::into))
            .filter(|m: &simulation::Mover<'_>| seen.insert(m.claim))
            .collect();
        simulation::Prepared::new(snap, input.pools, &movers, input.opts)
    });
    let mut sim = prepared.as_ref().map(simulation::Prepared::simulation);
    // Drift: one node per command, empty ones first, then by how long they drifted. A node
    // with pods goes only once the simulation finds where they go (new nodes launched first).
    for (_, is_empty, c, d) in &drifted {
        if out.proposals.iter().any(|p| p.method == Method::Emptiness && p.candidates.contains(&c.claim.id)) {
            continue;
        }
        let verdict = if !out.proposals.is_empty() {
            Verdict::Keep(format!("drifted ({d}); another command goes first this round"))
        } else if !drift_room {
            Verdict::BudgetExhausted { method: Method::Drift }
        } else if *is_empty {
            out.proposals.push(Proposal {
                method: Method::Drift,
                reason: DisruptionReason::Drifted,
                candidates: vec![c.claim.id.clone()],
                replacements: vec![],
                detail: format!("drifted: {d}"),
            });
            Verdict::Disrupt { method: Method::Drift, detail: format!("drifted: {d}") }
        } else {
            // Drift goes on where pods on their way would go (Karpenter's drift skips only
            // nominated nodes): that move is simulated from scratch without the node.
            let id = c.claim.id.as_str();
            let tried = match (sim.as_mut(), prepared.as_ref()) {
                (Some(s), Some(p)) if s.blocked(id).is_some() => Some(p.without(&[id])),
                (Some(s), _) => Some(s.try_move(&[id])),
                _ => None,
            };
            match tried {
                None => Verdict::Keep(format!("drifted ({d}); not simulated this round")),
                Some(Err(why)) => Verdict::Keep(format!("drifted ({d}); {why}")),
                Some(Ok(o)) => match o.results.errors.first() {
                    Some((i, why)) => {
                        let pod = o.pod(*i).map(|p| p.key.to_string()).unwrap_or_default();
                        Verdict::Keep(format!("drifted ({d}); pod {pod} would fit nowhere: {why}"))
                    }
                    None => {
                        let n = o.results.claims.len();
                        let detail = format!("drifted: {d}; its pods move to {n} new and existing nodes");
                        out.proposals.push(Proposal {
                            method: Method::Drift,
                            reason: DisruptionReason::Drifted,
                            candidates: vec![c.claim.id.clone()],
                            replacements: o.results.claims,
                            detail: detail.clone(),
                        });
                        Verdict::Disrupt { method: Method::Drift, detail }
                    }
                },
            }
        };
        out.decisions.insert(c.claim.id.clone(), decide(c, verdict));
    }
    // Consolidation: several nodes onto fewer (the longest prefix that holds), else one; not
    // simulated again while nothing changed since it last found nothing.
    if let Some(shape) = shape {
        let room = room(DisruptionReason::Underutilized);
        // A drifted node keeps drift's verdict unless consolidation takes it.
        let drifted_ids: BTreeSet<String> = drifted.iter().map(|d| d.2.claim.id.clone()).collect();
        if let Some((_, since)) = quiet.filter(|_| out.proposals.is_empty()) {
            for c in underused.iter().filter(|c| !drifted_ids.contains(&c.claim.id)) {
                let why = memory.kept.get(&c.claim.id).cloned().unwrap_or_else(|| unplaced(c));
                let verdict = Verdict::Quiet { why, since_ago: input.now.saturating_sub(since) };
                out.decisions.insert(c.claim.id.clone(), decide(c, verdict));
            }
        } else {
            let before = !out.proposals.is_empty();
            let verdicts =
                consolidate(input, sim.as_mut(), &mut underused, &mut out, room, pool_totals, &mut memory.stuck);
            for (c, verdict) in underused.iter().zip(verdicts) {
                if let Verdict::Keep(why) = &verdict {
                    memory.kept.insert(c.claim.id.clone(), why.clone());
                }
                if drifted_ids.contains(&c.claim.id) && !matches!(verdict, Verdict::Disrupt { .. }) {
                    continue;
                }
                out.decisions.insert(c.claim.id.clone(), decide(c, verdict));
            }
            // Nothing found with room to act: quiet until the shape changes.
            memory.quiet = (!before && out.proposals.is_empty() && room > 0).then_some((shape, input.now));
        }
    }
    validate(input, memory, &mut out);
    out
}

#[cfg(test)]
mod tests;
