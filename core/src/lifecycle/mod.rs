//! The NodeClaim lifecycle as a planner: from what the ledger decided and what the cluster
//! shows, the ledger steps to propose and the effects that make the cluster match.
//!
//! [`reconcile`] is pure: it takes the pool's claims (as committed), a cluster [`Snapshot`],
//! whether that view is synced, `now` and [`Config`], and returns a [`Plan`]. It covers
//! launch (and the re-drive of launches a restart or a new leader cut off, with the batch
//! the ledger recorded), the relaunch after insufficient capacity (another zone, ICE marks
//! respected), registration, initialization, Karpenter's liveness timeouts, nodes lost (only
//! on a synced view, and only once their absence outlived a grace), deletion by hand of a
//! NodeClaim or a Node (through the finalizer), and termination (taint, drain, terminate the
//! instance, remove the node and the finalizers).
//!
//! The plan is declarative: for a claim whose ledger state is ahead of the cluster (a step
//! committed but its effects lost) it asks for the effects again, and for one whose state is
//! behind what the cluster shows it proposes the step. So reconciling, applying the plan and
//! reconciling again proposes nothing new (a property test checks it).
//!
//! [`live`] plans claims on their way up (launch, registration, initialization, loss);
//! [`terminate`] plans claims on their way out, and orphaned objects.

pub mod adopt;
mod live;
mod terminate;
#[cfg(test)]
mod tests;

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};

use crate::catalog::InstanceType;
use crate::cluster::{Event, NodeClaim, ObjectKind, Snapshot, TERMINATION_FINALIZER};
use crate::effect::{Action, Effect};
use crate::ledger::{BatchRecord, Claim, ClaimState, Interruption, Millis, Offering, Step};

use crate::node::Node;
use crate::plane::Liveness;
use crate::resources::ResourceName;
use crate::shared::FastMap;
use live::live;
use terminate::{orphans, terminating};

/// The lifecycle's settings.
#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    /// Karpenter's launch (5 min) and registration (15 min) timeouts.
    pub liveness: Liveness,
    /// How long a registered claim's node (or a launched claim's NodeClaim) must be missing
    /// from a synced view before the claim is taken as lost. A relist, or NodeClaims synced
    /// before Nodes, shows objects missing for a moment; a deleted node stays missing.
    pub lost_grace: Millis,
    /// How long a reserved claim may have no NodeClaim before its round is taken as cut off
    /// (a restart between the reservation and the create) and the claim released.
    pub create_grace: Millis,
    /// When an interrupted claim starts draining, and how long it has.
    pub interruption: crate::interruption::Settings,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            liveness: Liveness::default(),
            lost_grace: 30_000,
            create_grace: 30_000,
            interruption: crate::interruption::Settings::default(),
        }
    }
}

impl Config {
    /// Checks the settings; the error names the field.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let bad = |field: &'static str, reason: &str| Err(ConfigError { field, reason: reason.to_string() });
        if self.liveness.launch == 0 || self.liveness.registration < self.liveness.launch {
            return bad("liveness", "launch must be positive and at most registration");
        }
        if self.lost_grace == 0 {
            return bad("lost_grace", "must be positive (a node missing from one snapshot is not lost)");
        }
        if self.create_grace == 0 {
            return bad("create_grace", "must be positive (a round creates its NodeClaims after it reserves them)");
        }
        let i = &self.interruption;
        if i.spot_notice == 0 || i.drain_lead > i.spot_notice {
            return bad("interruption.drain_lead", "must be at most interruption.spot_notice (EC2's two minutes)");
        }
        if i.replace_timeout == 0 {
            return bad("interruption.replace_timeout", "must be positive");
        }
        Ok(())
    }
}

/// A setting that cannot work, named.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigError {
    pub field: &'static str,
    pub reason: String,
}

impl std::fmt::Display for ConfigError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "invalid lifecycle setting {}: {}", self.field, self.reason)
    }
}

/// What the planner remembers between reconciles: since when objects have been missing.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Memory {
    missing_since: BTreeMap<String, Millis>,
}

impl Memory {
    /// Whether `key` has been missing for at least `grace` at `now` (starting the count on
    /// its first absence).
    pub(super) fn missing_for(&mut self, key: String, now: Millis, grace: Millis) -> bool {
        let since = *self.missing_since.entry(key).or_insert(now);
        now.saturating_sub(since) >= grace
    }

    /// Forgets every absence not seen in this reconcile.
    fn keep_only(&mut self, seen: &BTreeSet<String>) {
        self.missing_since.retain(|k, _| seen.contains(k));
    }
}

/// What the planner reads.
pub struct Input<'a> {
    pub pool: &'a str,
    /// The pool's claims, as committed.
    pub claims: &'a [Claim],
    /// The launch batches of launching claims (from the ledger).
    pub batches: &'a BTreeMap<String, BatchRecord>,
    pub snapshot: &'a Snapshot,
    /// Whether every watch has listed: with `false` nothing is planned.
    pub synced: bool,
    pub now: Millis,
    /// The pool's instance types (for a relaunch's zone choice).
    pub types: &'a [InstanceType],
    /// The zones the pool launches in.
    pub zones: &'a [String],
    /// Offerings the ledger marks unavailable now.
    pub unavailable: &'a BTreeSet<Offering>,
    /// Claims a provisioning round of this actor is still reserving or creating: left alone.
    pub busy: &'a BTreeSet<String>,
    /// The pool's interrupted claims (acting records, by claim), with whether every
    /// replacement granted for each is ready ([`crate::interruption::interrupted_claims`]).
    pub interrupted: &'a BTreeMap<String, (Interruption, bool)>,
}

/// The planner's answer.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Plan {
    /// Ledger steps, proposed as one entry.
    pub steps: Vec<(String, Step)>,
    /// Effects, run once the steps committed (those of a claim whose step was rejected are
    /// dropped).
    pub effects: Vec<Effect>,
}

impl Plan {
    fn step(&mut self, claim: &str, step: Step) {
        self.steps.push((claim.to_string(), step));
    }

    fn effect(&mut self, claim: &str, action: Action) {
        self.effects.push(Effect::new(claim, action));
    }

    fn event(&mut self, claim: &str, kind: ObjectKind, name: &str, warning: bool, reason: &str, message: String) {
        let event = Event { kind, name: name.to_string(), warning, reason: reason.to_string(), message };
        self.effect(claim, Action::Event(event));
    }

    pub fn is_empty(&self) -> bool {
        self.steps.is_empty() && self.effects.is_empty()
    }

    /// One patch per node and one status patch per claim (their changes merged, in order),
    /// and no effect twice; linear in the effects (indexes by node, claim and key).
    fn normalize(&mut self) {
        let mut out: Vec<Effect> = Vec::with_capacity(self.effects.len());
        let mut node_patch: FastMap<String, usize> = FastMap::default();
        let mut status_patch: FastMap<String, usize> = FastMap::default();
        let mut by_key: FastMap<String, Vec<usize>> = FastMap::default();
        for e in std::mem::take(&mut self.effects) {
            match &e.action {
                Action::PatchNode { node, patch } => {
                    if let Some(&i) = node_patch.get(node) {
                        if let Action::PatchNode { patch: into, .. } = &mut out[i].action {
                            into.add_taints.extend(patch.add_taints.iter().cloned());
                            into.remove_taints.extend(patch.remove_taints.iter().cloned());
                            into.labels.extend(patch.labels.iter().cloned());
                            into.add_finalizers.extend(patch.add_finalizers.iter().cloned());
                            into.remove_finalizers.extend(patch.remove_finalizers.iter().cloned());
                        }
                        continue;
                    }
                    node_patch.insert(node.clone(), out.len());
                }
                Action::PatchStatus(patch) | Action::Launched { status: patch, .. } => {
                    // One status write per claim: the patches merge (labels too, when launched).
                    if let Some(&i) = status_patch.get(&e.claim) {
                        if let Action::Launched { labels, .. } = &e.action {
                            let merged = match &mut out[i].action {
                                Action::Launched { labels: into, .. } => {
                                    into.extend(labels.iter().cloned());
                                    None
                                }
                                Action::PatchStatus(into) => {
                                    Some(Action::Launched { labels: labels.clone(), status: into.clone() })
                                }
                                _ => None,
                            };
                            if let Some(m) = merged {
                                out[i].action = m;
                            }
                        }
                        if let Action::PatchStatus(into) | Action::Launched { status: into, .. } = &mut out[i].action {
                            into.provider_id = patch.provider_id.clone().or(into.provider_id.take());
                            into.node_name = patch.node_name.clone().or(into.node_name.take());
                            into.capacity = patch.capacity.clone().or(into.capacity.take());
                            into.allocatable = patch.allocatable.clone().or(into.allocatable.take());
                            into.conditions.extend(patch.conditions.iter().cloned());
                        }
                        continue;
                    }
                    status_patch.insert(e.claim.clone(), out.len());
                }
                _ => {
                    let same = by_key.entry(e.key()).or_default();
                    if same.iter().any(|&i| out[i] == e) {
                        continue;
                    }
                    same.push(out.len());
                }
            }
            out.push(e);
        }
        self.effects = out;
    }
}

/// The provider id Karpenter's AWS provider writes for an instance.
pub fn provider_id(zone: &str, instance: &str) -> String {
    format!("aws:///{zone}/{instance}")
}

/// The resources Kubernetes always registers; others (GPUs, ...) must show up in a node's
/// allocatable before it is initialized.
pub(super) fn is_extended(r: &ResourceName) -> bool {
    !matches!(r, ResourceName::Cpu | ResourceName::Memory | ResourceName::Pods | ResourceName::EphemeralStorage)
        && *r != ResourceName::Nodes
}

/// Plans one reconcile of a pool's claims.
///
/// Each claim is planned until nothing more can be decided without the world moving: a
/// step is applied to a local copy of the claim (and its effects to local copies of its
/// NodeClaim and Node) and the claim planned again, so a claim whose node registered ready
/// is registered and initialized in one plan, and reconciling after the plan was applied
/// proposes nothing new.
pub fn reconcile(input: &Input<'_>, cfg: &Config, memory: &mut Memory) -> Plan {
    let mut plan = Plan::default();
    if !input.synced {
        return plan;
    }
    let snap = input.snapshot;
    let by_provider = snap.nodes_by_provider_id();
    // The pool's types by name, for the labels of what each claim launched as.
    let types = crate::plane::types_by_name(input.types);
    // Only a terminating claim reads its node's pods (to drain them): the index is built on
    // the first one.
    let mut pods_by_node = None;
    let mut seen_missing: BTreeSet<String> = BTreeSet::new();
    let mut known: BTreeSet<&str> = BTreeSet::new();
    for claim in input.claims {
        known.insert(claim.id.as_str());
        if input.busy.contains(&claim.id) {
            continue;
        }
        let nc = snap.nodeclaims.get(&claim.id).map(|c| Cow::Borrowed(c.as_ref()));
        let node = claim
            .state
            .instance()
            .and_then(|i| by_provider.get(provider_id(&claim.zone, i).as_str()).copied())
            .or_else(|| {
                nc.as_deref().and_then(|nc| nc.status.provider_id.as_deref()).and_then(|p| by_provider.get(p).copied())
            })
            .map(|n| Cow::Borrowed(n.as_ref()));
        if !claim.state.is_terminating() && held_by_unreadable(snap, claim, nc.is_none(), node.is_none()) {
            continue;
        }
        let mut cx = Claimed {
            claim,
            state: claim.state.clone(),
            changed_at: claim.changed_at,
            nc,
            node,
            now: input.now,
            types: &types,
        };
        // At most one pass per state a claim can move through.
        for _ in 0..8 {
            let mut round = Plan::default();
            let pods = match (&cx.state, cx.node()) {
                (ClaimState::Terminating { .. }, Some(n)) => {
                    pods_by_node.get_or_insert_with(|| snap.pods_by_node()).get(n.name.as_str())
                }
                _ => None,
            };
            plan_claim(&mut round, input, cfg, memory, &mut seen_missing, &cx, pods);
            let mut moved = false;
            let mut gone = false;
            for (_, step) in &round.steps {
                match advanced(&cx.state, step) {
                    Some(next) => {
                        moved |= next != cx.state;
                        cx.state = next;
                        cx.changed_at = input.now.max(cx.changed_at);
                    }
                    None => gone = true,
                }
            }
            for e in &round.effects {
                // A patch that changes what the planner reads (an unregistered taint removed)
                // may let the claim move on: plan it again.
                moved |= cx.apply(&e.action);
            }
            plan.steps.extend(round.steps);
            plan.effects.extend(round.effects);
            if !moved || gone {
                break;
            }
        }
    }
    orphans(&mut plan, input, &known, (cfg, memory, &mut seen_missing));
    memory.keep_only(&seen_missing);
    plan.normalize();
    plan
}

/// Whether a claim's NodeClaim or Node is missing from the view only because the cluster
/// adapter could not read it (a newer Karpenter's field; the adapter reports it). Such a
/// claim is left as it is: taking the object for deleted would terminate a live node.
fn held_by_unreadable(snap: &Snapshot, claim: &Claim, no_nc: bool, no_node: bool) -> bool {
    if no_nc && snap.unreadable_claim(&claim.id).is_some() {
        return true;
    }
    no_node && claim.state.instance().is_some_and(|i| snap.unreadable_owns(&provider_id(&claim.zone, i)).is_some())
}

/// What a step does to a claim's state (`None`: the claim is gone), as the ledger applies
/// it to the steps this planner proposes.
fn advanced(state: &ClaimState, step: &Step) -> Option<ClaimState> {
    let next = match (state, step) {
        (_, Step::Gone) => return None,
        (ClaimState::Launched { instance }, Step::Registered) => ClaimState::Registered { instance: instance.clone() },
        (ClaimState::Registered { instance }, Step::Initialized) => {
            ClaimState::Initialized { instance: instance.clone() }
        }
        (ClaimState::Terminating { .. }, Step::Terminating) => state.clone(),
        (s, Step::Terminating) => ClaimState::Terminating {
            instance: s.instance().map(str::to_string),
            batch: s.batch().map(str::to_string),
            instance_gone: false,
        },
        (ClaimState::Terminating { instance, batch, .. }, Step::InstanceGone) => {
            ClaimState::Terminating { instance: instance.clone(), batch: batch.clone(), instance_gone: true }
        }
        _ => state.clone(),
    };
    Some(next)
}

/// A claim with what the cluster shows of it (local copies, once this plan changed them).
pub(super) struct Claimed<'a> {
    claim: &'a Claim,
    /// Its state as this plan leaves it so far.
    state: ClaimState,
    changed_at: Millis,
    nc: Option<Cow<'a, NodeClaim>>,
    node: Option<Cow<'a, Node>>,
    now: Millis,
    /// The pool's instance types by name.
    types: &'a crate::plane::TypesByName<'a>,
}

impl Claimed<'_> {
    /// What an effect does to the local copies (cloud effects and evictions wait for the
    /// world); whether it changed them.
    fn apply(&mut self, action: &Action) -> bool {
        match action {
            Action::PatchStatus(p) => {
                if let Some(nc) = self.nc.as_mut()
                    && let Some(status) = p.apply(&nc.status)
                {
                    nc.to_mut().status = status;
                    return true;
                }
            }
            Action::Launched { labels, status } => {
                if let Some(nc) = self.nc.as_mut() {
                    let relabel = labels.iter().any(|(k, v)| nc.spec.labels.get(k) != Some(v));
                    let restatus = status.apply(&nc.status);
                    if relabel {
                        nc.to_mut().spec.labels.extend(labels.iter().cloned());
                    }
                    if let Some(s) = &restatus {
                        nc.to_mut().status = s.clone();
                    }
                    return relabel || restatus.is_some();
                }
            }
            Action::DeleteNodeClaim => {
                if let Some(nc) = self.nc.as_mut().filter(|nc| !nc.deleting) {
                    nc.to_mut().deleting = true;
                    return true;
                }
            }
            Action::RemoveFinalizer => {
                if let Some(nc) = self.nc.as_mut().filter(|nc| nc.finalizers.iter().any(|f| f == TERMINATION_FINALIZER))
                {
                    nc.to_mut().finalizers.retain(|f| f != TERMINATION_FINALIZER);
                    return true;
                }
            }
            Action::PatchNode { patch, .. } => {
                if let Some(node) = self.node.as_mut()
                    && let Some(patched) = patch.apply(node)
                {
                    *node.to_mut() = patched;
                    return true;
                }
            }
            Action::DeleteNode { .. } => {
                if let Some(node) = self.node.as_mut().filter(|n| !n.deleting) {
                    node.to_mut().deleting = true;
                    return true;
                }
            }
            _ => {}
        }
        false
    }

    pub(super) fn nc(&self) -> Option<&NodeClaim> {
        self.nc.as_deref()
    }

    pub(super) fn node(&self) -> Option<&Node> {
        self.node.as_deref()
    }
}

/// One pass over one claim.
fn plan_claim(
    plan: &mut Plan,
    input: &Input<'_>,
    cfg: &Config,
    memory: &mut Memory,
    seen: &mut BTreeSet<String>,
    cx: &Claimed<'_>,
    pods: Option<&Vec<&std::sync::Arc<crate::pod::Pod>>>,
) {
    let id = cx.claim.id.as_str();
    if let ClaimState::Terminating { instance, batch, instance_gone } = &cx.state {
        terminating(plan, input, cx, (instance.as_deref(), batch.as_deref(), *instance_gone), pods);
        return;
    }
    if let Some((reason, message)) = deleted(cx) {
        plan.step(id, Step::Terminating);
        plan.event(id, ObjectKind::NodeClaim, id, false, reason, message);
        return;
    }
    if let Some((record, ready)) = input.interrupted.get(id)
        && crate::interruption::drain_now(record, *ready, input.now, &cfg.interruption)
    {
        plan.step(id, Step::Terminating);
        let why = if *ready && record.sized { "its replacements are ready" } else { "its deadline is near" };
        let message = format!("nodeclaim {id} draining on {} ({why})", record.kind);
        plan.event(id, ObjectKind::NodeClaim, id, false, "InterruptionDraining", message);
        return;
    }
    // From the NodeClaim's creation, as Karpenter counts: a restart (or an adoption) that
    // reserved the claim again does not give an instance that never registered a fresh wait.
    let created = cx.nc.as_ref().map_or(cx.claim.reserved_at, |nc| nc.born(cx.claim.reserved_at));
    // A claim launching since before its ledger recorded first calls: from that call.
    let tried = cx.claim.tried_at.or(matches!(cx.state, ClaimState::Launching { .. }).then_some(cx.claim.changed_at));
    if let Some(expired) = cfg.liveness.check(&cx.state, created, tried, input.now) {
        plan.step(id, Step::Terminating);
        let message = format!("nodeclaim {id} timed out: {}", expired.describe(&cfg.liveness));
        plan.event(id, ObjectKind::NodeClaim, id, true, "LivenessTimeout", message);
        return;
    }
    live(plan, input, cfg, memory, seen, cx);
}

/// Why a claim not yet terminating must go: its NodeClaim was deleted (by hand, or by a
/// disruption), or its Node was (by hand, or by the cloud node lifecycle controller when the
/// instance went away). The event's reason and message.
fn deleted(cx: &Claimed<'_>) -> Option<(&'static str, String)> {
    if cx.nc().is_some_and(|nc| nc.deleting) {
        return Some(("Terminating", format!("nodeclaim {} was deleted", cx.claim.id)));
    }
    if let Some(n) = cx.node().filter(|n| n.deleting) {
        return Some(("NodeDeleted", format!("node {} of nodeclaim {} was deleted", n.name, cx.claim.id)));
    }
    None
}
