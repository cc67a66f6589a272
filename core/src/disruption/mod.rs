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
//!
//! [`plan`] is the planner the NodePool actors call: pure, from the pool's claims as
//! committed, the ledger's leases and allowances, the cluster snapshot and `now`, it returns
//! the expired claims to terminate (forceful, not budgeted), at most one command to propose
//! (its method's reason, candidates and replacements) and a [`Decision`] for every node, with
//! the reason (what `explain` prints).
//!
//! Methods run in Karpenter's order and the first that finds something wins the round:
//! emptiness, drift, then consolidation (multi-node, single-node, then dovetail's repack of m
//! nodes onto n < m new ones, where a single replacement cannot get there). Expiration is not a method of the loop: an expired
//! claim is terminated whatever the budgets say.
pub mod budget;
pub mod candidates;
pub mod consolidation;
pub mod cron;
mod decision;
pub mod drift;
pub mod simulation;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use crate::catalog::InstanceType;
use crate::clock::to_millis;
use crate::cluster::Snapshot;
use crate::ledger::{Claim, ClaimState, DisruptionCommand, Millis, State};
use crate::nodepool::{ConsolidationPolicy, DisruptionReason, NodePool};
use crate::pod::Pod;
use crate::scheduling::{PoolInput, SolveOptions};

use candidates::{Blocker, Candidate, PdbIndex, Pieces};
pub use decision::{Decision, Method, Plan, Proposal, Verdict};
use drift::Drift;

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
/// A pool whose consolidation found nothing is not simulated again while the cluster's nodes
/// and their pods stay as they were, for at most this long (Karpenter's consolidation state,
/// force-refreshed every 5 minutes).
pub const CONSOLIDATION_RECHECK: Millis = 5 * 60_000;

/// What the planner remembers between rounds: when each node last saw its pods change (the
/// start of its `consolidateAfter` wait), and since when each drifted.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Memory {
    pod_events: BTreeMap<String, (u64, Millis)>,
    drifted_since: BTreeMap<String, Millis>,
    /// The commands being validated, and since when.
    pending: Vec<(Proposal, Millis)>,
    /// The cluster's shape (its nodes and their pods) when consolidation last found nothing,
    /// and when.
    quiet: Option<(u64, Millis)>,
    /// What consolidation last said of each candidate it kept.
    kept: BTreeMap<String, String>,
}

impl Memory {
    /// When the command under validation may be proposed (it started `validation` ms
    /// before), if one is: the caller plans again then rather than at its next period.
    pub fn validation_due(&self, validation: Millis) -> Option<Millis> {
        self.pending.iter().map(|(_, since)| since.saturating_add(validation)).min()
    }

    /// When the node's pods last changed, given their fingerprint now. A node seen for the
    /// first time counts from `seen` (what its NodeClaim says), else from now: what happened
    /// on it before is unknown, and waiting once more is the safe side.
    fn last_pod_event(&mut self, claim: &str, fingerprint: u64, now: Millis, seen: Option<Millis>) -> Millis {
        let e = self.pod_events.entry(claim.to_string()).or_insert((fingerprint, seen.unwrap_or(now)));
        if e.0 != fingerprint {
            *e = (fingerprint, now);
        }
        e.1
    }

    fn keep_only(&mut self, claims: &BTreeSet<&str>) {
        self.pod_events.retain(|c, _| claims.contains(c.as_str()));
        self.drifted_since.retain(|c, _| claims.contains(c.as_str()));
        self.kept.retain(|c, _| claims.contains(c.as_str()));
    }
}

/// The cluster's shape as consolidation sees it: every node (name, initialized, deleting) and
/// the pods bound to it. Consolidation's answer cannot change while this does not.
fn cluster_shape(snap: &Snapshot, pods_by_node: &BTreeMap<&str, Vec<&Arc<Pod>>>) -> u64 {
    let mut h = crate::shared::Fnv::default();
    let no_pods = Vec::new();
    for n in snap.nodes.values() {
        h.write(n.name.as_bytes());
        h.write_u64(u64::from(n.initialized) | u64::from(n.deleting) << 1 | u64::from(n.do_not_disrupt) << 2);
        h.write_u64(fingerprint(pods_by_node.get(n.name.as_str()).unwrap_or(&no_pods)));
    }
    h.finish()
}

/// A fingerprint of the pods bound to a node (their keys): changes when one comes or goes.
fn fingerprint(pods: &[&Arc<Pod>]) -> u64 {
    let mut keys: Vec<&crate::pod::PodKey> = pods.iter().map(|p| &p.key).collect();
    keys.sort();
    let mut h = crate::shared::Fnv::default();
    for k in keys {
        h.write(k.namespace.as_bytes());
        h.write(&[0]);
        h.write(k.name.as_bytes());
        h.write(&[0]);
    }
    h.finish()
}

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
            && input.now.saturating_sub(claim.reserved_at) >= expire
        {
            out.expired.push(claim.id.clone());
            out.decisions.insert(claim.id.clone(), decide(Verdict::Expired { expire_after: expire }));
            continue;
        }
        let pieces = Pieces { claim, node, nodeclaim, pods: pods.clone() };
        let lease = input.leases.get(&claim.id).map(String::as_str);
        let drift = node.zip(nodeclaim).and_then(|(n, nc)| {
            let cloud = input.cloud_drift.get(&claim.id).map(String::as_str);
            drift::drifted(n, &nc.spec.annotations, input.pool, input.types, cloud)
        });
        // Drifted whatever else holds it (a command, a PDB): its NodeClaim says so.
        if let Some(d) = &drift {
            out.drifted.insert(claim.id.clone(), (d.reason().to_string(), d.to_string()));
        }
        let candidate = candidates::candidate(&pieces, lease, input.types, &pdbs, input.now, drift.is_some());
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
            if c.is_empty() && consolidate_after.is_some_and(|after| input.now >= last_event.saturating_add(after)) {
                out.consolidatable.insert(claim.id.clone());
                empty.push(c.clone());
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
    let shape = (!underused.is_empty()).then(|| cluster_shape(snap, &pods_by_node));
    let quiet =
        memory.quiet.filter(|(s, at)| Some(*s) == shape && input.now.saturating_sub(*at) < CONSOLIDATION_RECHECK);
    let consolidating = out.proposals.is_empty() && !underused.is_empty() && quiet.is_none();
    let drifting = out.proposals.is_empty() && drift_room && drifted.iter().any(|d| !d.1);
    let prepared = (consolidating || drifting).then(|| {
        let movers: Vec<simulation::Mover<'_>> =
            drifted.iter().filter(|d| !d.1).map(|d| (&d.2).into()).chain(underused.iter().map(Into::into)).collect();
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
            match sim.as_mut().map(|s| s.try_move(&[c.claim.id.as_str()])) {
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
        if let Some((_, since)) = quiet.filter(|_| out.proposals.is_empty()) {
            for c in &underused {
                let why = memory.kept.get(&c.claim.id).cloned().unwrap_or_else(|| unplaced(c));
                let verdict = Verdict::Quiet { why, since_ago: input.now.saturating_sub(since) };
                out.decisions.insert(c.claim.id.clone(), decide(c, verdict));
            }
        } else {
            let before = !out.proposals.is_empty();
            let verdicts = consolidate(input, sim.as_mut(), &mut underused, &mut out, room, pool_totals);
            for (c, verdict) in underused.iter().zip(verdicts) {
                if let Verdict::Keep(why) = &verdict {
                    memory.kept.insert(c.claim.id.clone(), why.clone());
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

/// What a disruption command under way needs now (Karpenter's `waitOrTerminate`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Progress {
    /// Some replacement is not initialized yet.
    Waiting,
    /// Every replacement is initialized (or there are none): these candidates (those not
    /// terminating yet) may be deleted.
    Terminate(Vec<String>),
    /// It cannot complete: it ends and its candidates are released (untainted).
    RollBack(String),
    /// Every candidate is terminating: nothing more to do (the ledger forgets the command once
    /// they are gone).
    Done,
}

/// Where a command stands, from the ledger's state at `now`; a command whose replacements are
/// not all initialized after `timeout` is rolled back.
pub fn progress(state: &State, command: &DisruptionCommand, now: Millis, timeout: Millis) -> Progress {
    let waiting: Vec<String> = command
        .candidates
        .iter()
        .filter(|c| state.claim(c).is_some_and(|c| !c.state.is_terminating()))
        .cloned()
        .collect();
    if waiting.is_empty() {
        return Progress::Done;
    }
    let mut pending = 0;
    for r in &command.replacements {
        match state.claim(r).map(|c| &c.state) {
            None => return Progress::RollBack(format!("replacement {r} is gone")),
            Some(ClaimState::Terminating { .. }) => return Progress::RollBack(format!("replacement {r} failed")),
            Some(ClaimState::Initialized { .. }) => {}
            Some(_) => pending += 1,
        }
    }
    if pending == 0 {
        return Progress::Terminate(waiting);
    }
    if now.saturating_sub(command.at) >= timeout {
        return Progress::RollBack(format!("{pending} replacements were not initialized within {}s", timeout / 1000));
    }
    Progress::Waiting
}

/// Karpenter's validation: an emptiness or consolidation command is proposed only once the
/// planner has decided the same for `validation` (emptiness may shrink to the nodes still
/// empty); until then it waits, and its nodes' verdicts say so. Drift goes at once. Each
/// command of a round is validated on its own.
fn validate(input: &Input<'_>, memory: &mut Memory, out: &mut Plan) {
    let proposals = std::mem::take(&mut out.proposals);
    let mut validated: Vec<Proposal> = Vec::new();
    let mut waiting: Vec<(Proposal, Millis)> = Vec::new();
    for proposal in proposals {
        if proposal.method == Method::Drift || input.validation == 0 {
            validated.push(proposal);
            continue;
        }
        // The command under validation this one continues: the same, or (emptiness) the
        // nodes still empty of the one before.
        let emptiness = proposal.method == Method::Emptiness;
        let prior = memory.pending.iter().find(|(p, _)| *p == proposal || (emptiness && p.method == Method::Emptiness));
        let (command, since) = match prior {
            Some((p, since)) if *p == proposal => (proposal, *since),
            Some((p, since)) => {
                let still: Vec<String> =
                    proposal.candidates.iter().filter(|c| p.candidates.contains(c)).cloned().collect();
                if still.is_empty() {
                    (proposal, input.now)
                } else {
                    (Proposal { candidates: still, ..proposal }, *since)
                }
            }
            None => (proposal, input.now),
        };
        if input.now.saturating_sub(since) >= input.validation {
            validated.push(command);
        } else {
            waiting.push((command, since));
        }
    }
    for (claim, d) in out.decisions.iter_mut() {
        let Verdict::Disrupt { detail, .. } = &mut d.verdict else { continue };
        if validated.iter().any(|p| p.candidates.contains(claim)) {
            continue;
        }
        match waiting.iter().find(|(p, _)| p.candidates.contains(claim)) {
            Some((_, since)) => {
                let acts_in = since.saturating_add(input.validation).saturating_sub(input.now);
                detail.push_str(&format!(" (validating: acts in {}s if it still holds)", acts_in.div_ceil(1000)));
            }
            None => d.verdict = Verdict::Keep("empty; waits for the command under validation".into()),
        }
    }
    memory.pending = waiting;
    out.proposals = validated;
}

/// The move of the longest prefix of `refs`, at least `shortest` long, that `attempt` finds
/// one for (a binary search: a longer prefix is tried only when a shorter one holds).
fn longest_prefix(
    refs: &[&Candidate<'_>],
    shortest: usize,
    mut attempt: impl FnMut(&[&Candidate<'_>]) -> Result<consolidation::Move, String>,
) -> Option<consolidation::Move> {
    let (mut lo, mut hi, mut best) = (shortest, refs.len(), None);
    while lo <= hi {
        let mid = (lo + hi) / 2;
        match attempt(&refs[..mid]) {
            Ok(m) => {
                best = Some(m);
                lo = mid + 1;
            }
            Err(_) => hi = mid - 1,
        }
    }
    best
}

/// What consolidation says of a candidate it found no move for.
fn unplaced(c: &Candidate<'_>) -> String {
    format!("it runs {} pods; no cheaper place for them was found", c.pods.len())
}

/// The consolidation methods over the settled candidates with pods: multi-node first (the
/// longest prefix, by savings per disruption, that goes with at most one new node), then
/// single-node, then (dovetail's, when neither found a move) a repack: the longest prefix of
/// at least 3 that goes onto fewer new nodes costing less together. Returns each candidate's
/// verdict, in `underused`'s order (sorted here).
fn consolidate(
    input: &Input<'_>,
    sim: Option<&mut simulation::Simulation<'_>>,
    underused: &mut [Candidate<'_>],
    out: &mut Plan,
    room: usize,
    (total_price, total_cost): (f64, f64),
) -> Vec<Verdict> {
    underused.sort_by(|a, b| b.savings_ratio().total_cmp(&a.savings_ratio()).then_with(|| a.claim.id.cmp(&b.claim.id)));
    let mut verdicts: Vec<Verdict> = underused.iter().map(|c| Verdict::Keep(unplaced(c))).collect();
    if !out.proposals.is_empty() {
        verdicts.iter_mut().for_each(|v| *v = Verdict::Keep("another command goes first this round".into()));
        return verdicts;
    }
    if room == 0 {
        let method = Method::SingleNodeConsolidation;
        verdicts.iter_mut().for_each(|v| *v = Verdict::BudgetExhausted { method });
        return verdicts;
    }
    let Some(sim) = sim else { return verdicts };
    let balanced = input.pool.disruption.consolidation_policy == ConsolidationPolicy::Balanced;
    // Karpenter's balanced score: the share of the pool's cost saved over the share of its
    // disruption cost spent.
    let worth = |m: &consolidation::Move, cands: &[&Candidate<'_>]| -> Result<(), String> {
        if !balanced || total_price <= 0.0 || total_cost <= 0.0 {
            return Ok(());
        }
        let spent: f64 = cands.iter().map(|c| c.disruption_cost).sum();
        let score = (m.savings() / total_price) / (spent / total_cost);
        if score >= 1.0 / BALANCED_K {
            Ok(())
        } else {
            Err(format!("the balanced policy scores it {score:.2}, under {:.2}", 1.0 / BALANCED_K))
        }
    };
    let attempt = |sim: &mut simulation::Simulation<'_>, cands: &[&Candidate<'_>], max_new: usize| {
        consolidation::consolidate(sim, input.pools, cands, input.spot_to_spot, max_new)
            .and_then(|m| worth(&m, cands).map(|()| m))
    };
    let max = underused.len().min(MULTI_NODE_MAX).min(room);
    let refs: Vec<&Candidate<'_>> = underused.iter().take(max).collect();
    let mut best =
        longest_prefix(&refs, 2, |cands| attempt(sim, cands, 1)).map(|m| (Method::MultiNodeConsolidation, m));
    // Every other candidate is simulated alone, so each gets its answer: the first (in
    // Karpenter's order) that can go is the single-node command when no multi-node one was
    // found; the others may follow as commands of their own (below).
    let mut could = vec![false; underused.len()];
    for (i, c) in underused.iter().enumerate() {
        if best.as_ref().is_some_and(|(_, m)| m.candidates.contains(&c.claim.id)) {
            continue;
        }
        verdicts[i] = match attempt(sim, &[c], 1) {
            Ok(m) if best.is_none() => {
                best = Some((Method::SingleNodeConsolidation, m));
                continue;
            }
            Ok(m) => {
                could[i] = true;
                Verdict::Keep(format!("{}; one consolidation at a time, it waits for a later round", describe(&m)))
            }
            Err(why) => Verdict::Keep(why),
        };
    }
    // dovetail's repack, where no single replacement gets there: the longest prefix of at
    // least 3 candidates whose pods go onto fewer new nodes that cost less together.
    if best.is_none() {
        best = longest_prefix(&refs, 3, |cands| attempt(sim, cands, cands.len() - 1)).map(|m| (Method::Repack, m));
    }
    let Some(first) = best else { return verdicts };
    // More commands at once (dovetail's, up to `max_commands`, within the budget): each
    // further single-node move is simulated again with the commands before it done, so
    // together they hold.
    let mut left = room.saturating_sub(first.1.candidates.len());
    let mut chosen = vec![first];
    if chosen[0].0 != Method::Repack && input.max_commands > 1 && left > 0 {
        let mut done = chosen[0].1.candidates.clone();
        for (i, c) in underused.iter().enumerate() {
            if chosen.len() >= input.max_commands || left == 0 {
                break;
            }
            if !could[i] {
                continue;
            }
            let ids: Vec<&str> = done.iter().map(String::as_str).collect();
            if let Err(why) = sim.keep(&ids) {
                verdicts[i] = Verdict::Keep(why);
                break;
            }
            done.clear();
            match attempt(sim, &[c], 1) {
                Ok(m) => {
                    done.clone_from(&m.candidates);
                    left -= 1;
                    chosen.push((Method::SingleNodeConsolidation, m));
                }
                Err(why) => verdicts[i] = Verdict::Keep(format!("{why}, with the commands before it done")),
            }
        }
    }
    for (method, m) in chosen {
        let detail = describe(&m);
        for (c, v) in underused.iter().zip(verdicts.iter_mut()) {
            if m.candidates.contains(&c.claim.id) {
                *v = Verdict::Disrupt { method, detail: detail.clone() };
            }
        }
        out.proposals.push(Proposal {
            method,
            reason: DisruptionReason::Underutilized,
            candidates: m.candidates,
            replacements: m.replacements.into_iter().map(|r| r.claim).collect(),
            detail,
        });
    }
    verdicts
}

/// A move in words.
fn describe(m: &consolidation::Move) -> String {
    match m.replacements.as_slice() {
        [] => format!("its pods fit on other nodes; saves ${:.4}/h", m.savings()),
        [r] => format!(
            "replaced by one cheaper node ({} types from ${:.4}/h); saves at least ${:.4}/h",
            r.claim.instance_types.len(),
            r.price,
            m.savings()
        ),
        rs => format!(
            "{} nodes repacked onto {} new ones costing at most ${:.4}/h together; saves at least ${:.4}/h",
            m.candidates.len(),
            rs.len(),
            rs.iter().map(|r| r.price).sum::<f64>(),
            m.savings()
        ),
    }
}

#[cfg(test)]
mod tests;
