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

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};

use crate::catalog::InstanceType;
use crate::cluster::{
    Condition, Event, NodeClaim, NodePatch, ObjectKind, Snapshot, StatusPatch, TERMINATION_FINALIZER,
    UNREGISTERED_TAINT,
};
use crate::effect::{Action, Effect};
use crate::labels;
use crate::ledger::{BatchRecord, Claim, ClaimState, LaunchBatch, Millis, Offering, Step};
use crate::node::Node;
use crate::plane::{Liveness, allowed_zones, capacity_types, disrupted_taint, drain_step, relaunch_zone};
use crate::resources::{ResourceList, ResourceName};

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
}

impl Default for Config {
    fn default() -> Self {
        Config { liveness: Liveness::default(), lost_grace: 30_000, create_grace: 30_000 }
    }
}

impl Config {
    /// Checks the settings; the error names the field.
    pub fn validate(&self) -> Result<(), String> {
        if self.liveness.launch == 0 || self.liveness.registration < self.liveness.launch {
            return Err("liveness: launch must be positive and at most registration".into());
        }
        if self.lost_grace == 0 {
            return Err("lost_grace must be positive (a node missing from one snapshot is not lost)".into());
        }
        Ok(())
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
    fn missing_for(&mut self, key: String, now: Millis, grace: Millis) -> bool {
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
    /// and no effect twice.
    fn normalize(&mut self) {
        let mut out: Vec<Effect> = Vec::with_capacity(self.effects.len());
        for e in std::mem::take(&mut self.effects) {
            let merged = out.iter_mut().any(|o| match (&mut o.action, &e.action) {
                (Action::PatchNode { node: a, patch: pa }, Action::PatchNode { node: b, patch: pb }) if a == b => {
                    pa.add_taints.extend(pb.add_taints.iter().cloned());
                    pa.remove_taints.extend(pb.remove_taints.iter().cloned());
                    pa.labels.extend(pb.labels.iter().cloned());
                    pa.add_finalizers.extend(pb.add_finalizers.iter().cloned());
                    pa.remove_finalizers.extend(pb.remove_finalizers.iter().cloned());
                    true
                }
                (Action::PatchStatus(pa), Action::PatchStatus(pb)) if o.claim == e.claim => {
                    pa.provider_id = pb.provider_id.clone().or(pa.provider_id.take());
                    pa.node_name = pb.node_name.clone().or(pa.node_name.take());
                    pa.capacity = pb.capacity.clone().or(pa.capacity.take());
                    pa.allocatable = pb.allocatable.clone().or(pa.allocatable.take());
                    pa.conditions.extend(pb.conditions.iter().cloned());
                    true
                }
                _ => *o == e,
            });
            if !merged {
                out.push(e);
            }
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
fn is_extended(r: &ResourceName) -> bool {
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
    let pods_by_node = snap.pods_by_node();
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
        let pods = node.as_deref().and_then(|n| pods_by_node.get(n.name.as_str()));
        let mut cx =
            Claimed { claim, state: claim.state.clone(), changed_at: claim.changed_at, nc, node, now: input.now };
        // At most one pass per state a claim can move through.
        for _ in 0..8 {
            let mut round = Plan::default();
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
    orphans(&mut plan, input, &known);
    memory.keep_only(&seen_missing);
    plan.normalize();
    plan
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
struct Claimed<'a> {
    claim: &'a Claim,
    /// Its state as this plan leaves it so far.
    state: ClaimState,
    changed_at: Millis,
    nc: Option<Cow<'a, NodeClaim>>,
    node: Option<Cow<'a, Node>>,
    now: Millis,
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

    fn nc(&self) -> Option<&NodeClaim> {
        self.nc.as_deref()
    }

    fn node(&self) -> Option<&Node> {
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
    if let Some(expired) = cfg.liveness.check(&cx.state, cx.claim.reserved_at, input.now) {
        plan.step(id, Step::Terminating);
        let message = format!("nodeclaim {id} outlived its {expired:?} timeout");
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

/// A claim that is not terminating: launch, registration, initialization, loss.
fn live(
    plan: &mut Plan,
    input: &Input<'_>,
    cfg: &Config,
    memory: &mut Memory,
    seen: &mut BTreeSet<String>,
    cx: &Claimed<'_>,
) {
    let claim = cx.claim;
    let id = claim.id.as_str();
    let Some(nc) = cx.nc() else {
        match cx.state {
            // The round that reserved it stopped before creating it (a restart): nothing was
            // launched; its pods are still pending and come back.
            ClaimState::Reserved if cx.now.saturating_sub(claim.reserved_at) >= cfg.create_grace => {
                plan.step(id, Step::Gone);
            }
            ClaimState::Reserved | ClaimState::Launching { .. } => {}
            // Launched or later with its NodeClaim gone (deleted past its finalizer): lost,
            // once the absence held.
            _ => {
                let key = format!("nodeclaim/{id}");
                seen.insert(key.clone());
                if memory.missing_for(key, cx.now, cfg.lost_grace) {
                    plan.step(id, Step::Terminating);
                }
            }
        }
        return;
    };
    match &cx.state {
        ClaimState::Reserved => {
            let zone = launch_zone(input, claim, nc);
            match zone {
                Some(zone) => plan.effect(id, Action::Launch { zone, batch: None }),
                None => {
                    // Nowhere left with capacity: the claim goes; its pods come back pending.
                    plan.step(id, Step::Terminating);
                    let message = format!("no offering of nodeclaim {id} has capacity in any zone it may use");
                    plan.event(id, ObjectKind::NodeClaim, id, true, "InsufficientCapacityError", message);
                }
            }
        }
        ClaimState::Launching { batch } => {
            let batch = recorded(input, batch);
            plan.effect(id, Action::Launch { zone: claim.zone.clone(), batch });
        }
        ClaimState::Launched { instance }
        | ClaimState::Registered { instance }
        | ClaimState::Initialized { instance } => {
            launched_status(plan, claim, nc, instance);
            let Some(node) = cx.node() else {
                if !matches!(cx.state, ClaimState::Launched { .. }) {
                    let key = format!("node/{id}");
                    seen.insert(key.clone());
                    if memory.missing_for(key, cx.now, cfg.lost_grace) {
                        plan.step(id, Step::Terminating);
                        let message = format!("the node of nodeclaim {id} is gone");
                        plan.event(id, ObjectKind::NodeClaim, id, true, "NodeLost", message);
                    }
                }
                return;
            };
            register(plan, claim, &cx.state, nc, node);
            if !matches!(cx.state, ClaimState::Launched { .. }) {
                initialize(plan, claim, &cx.state, nc, node);
            }
        }
        ClaimState::Terminating { .. } => {}
    }
}

/// A launch batch as the ledger recorded it.
fn recorded(input: &Input<'_>, id: &str) -> Option<LaunchBatch> {
    input.batches.get(id).map(|r| LaunchBatch { id: id.to_string(), claims: r.claims.clone() })
}

/// The zone a reserved claim launches in: its own while an offering there has capacity,
/// else the cheapest zone it may use that has one (ICE marks respected).
fn launch_zone(input: &Input<'_>, claim: &Claim, nc: &NodeClaim) -> Option<String> {
    // Nothing marked in its zone: it stays (the usual case, without a look at the catalog).
    if !input.unavailable.iter().any(|o| o.zone == claim.zone) {
        return Some(claim.zone.clone());
    }
    let types = nc.spec.requirements.get(labels::INSTANCE_TYPE).values().to_vec();
    let cts = capacity_types(&nc.spec.requirements);
    let unavailable = |t: &str, o: &crate::catalog::Offering| {
        input.unavailable.contains(&Offering {
            instance_type: t.to_string(),
            zone: o.zone.clone(),
            capacity_type: o.capacity_type,
        })
    };
    let own = std::slice::from_ref(&claim.zone);
    if relaunch_zone(input.types, &types, &cts, own, unavailable).is_some() {
        return Some(claim.zone.clone());
    }
    let zones = allowed_zones(&nc.spec.requirements, input.zones);
    relaunch_zone(input.types, &types, &cts, &zones, unavailable).map(|c| c.zone)
}

/// The status a launched claim's NodeClaim shows: its provider id, capacity and `Launched`.
fn launched_status(plan: &mut Plan, claim: &Claim, nc: &NodeClaim, instance: &str) {
    let pid = provider_id(&claim.zone, instance);
    if nc.status.provider_id.as_deref() == Some(pid.as_str()) && nc.status.is("Launched") {
        return;
    }
    let mut capacity = claim.resources.clone();
    capacity.set(ResourceName::Nodes, 0);
    let patch = StatusPatch {
        provider_id: Some(pid),
        capacity: Some(ResourceList::from_pairs(capacity.iter().filter(|(_, v)| *v != 0).map(|(n, v)| (n.clone(), v)))),
        allocatable: Some(claim.allocatable.clone()),
        conditions: vec![Condition::met("Launched")],
        ..StatusPatch::default()
    };
    plan.effect(&claim.id, Action::PatchStatus(patch));
}

/// Registration (Karpenter's): the node gets the claim's labels and taints and
/// `karpenter.sh/registered`, loses `karpenter.sh/unregistered`, and carries the termination
/// finalizer; the NodeClaim names its node and is `Registered`.
fn register(plan: &mut Plan, claim: &Claim, state: &ClaimState, nc: &NodeClaim, node: &Node) {
    let mut labels: Vec<(String, String)> = nc
        .spec
        .labels
        .iter()
        .filter(|(k, v)| node.labels.get(*k) != Some(*v))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    if node.labels.get(labels::REGISTERED).map(String::as_str) != Some("true") {
        labels.push((labels::REGISTERED.to_string(), "true".to_string()));
    }
    let patch = NodePatch {
        add_taints: nc.spec.taints.clone(),
        remove_taints: node.taints.iter().filter(|t| t.key == UNREGISTERED_TAINT).cloned().collect(),
        labels,
        add_finalizers: vec![TERMINATION_FINALIZER.to_string()],
        ..NodePatch::default()
    };
    if patch.apply(node).is_some() {
        plan.effect(&claim.id, Action::PatchNode { node: node.name.clone(), patch });
    }
    let status = StatusPatch {
        node_name: Some(node.name.clone()),
        conditions: vec![Condition::met("Registered")],
        ..StatusPatch::default()
    };
    if status.apply(&nc.status).is_some() {
        plan.effect(&claim.id, Action::PatchStatus(status));
    }
    if matches!(state, ClaimState::Launched { .. }) {
        plan.step(&claim.id, Step::Registered);
    }
}

/// Initialization (Karpenter's): the node is Ready, its startup taints and the unregistered
/// taint are gone, and the extended resources the claim asked for are registered; then the
/// node is labelled `karpenter.sh/initialized` and the NodeClaim is `Initialized`.
fn initialize(plan: &mut Plan, claim: &Claim, state: &ClaimState, nc: &NodeClaim, node: &Node) {
    let tainted = node.taints.iter().any(|t| {
        t.key == UNREGISTERED_TAINT || nc.spec.startup_taints.iter().any(|s| s.key == t.key && s.effect == t.effect)
    });
    let resources_registered =
        nc.spec.requests.iter().filter(|(r, v)| is_extended(r) && *v > 0).all(|(r, _)| node.allocatable.get(r) > 0);
    let initialized = matches!(state, ClaimState::Initialized { .. });
    if !initialized && (!node.ready || tainted || !resources_registered) {
        return;
    }
    if node.labels.get(labels::INITIALIZED).map(String::as_str) != Some("true") {
        let patch =
            NodePatch { labels: vec![(labels::INITIALIZED.to_string(), "true".to_string())], ..NodePatch::default() };
        plan.effect(&claim.id, Action::PatchNode { node: node.name.clone(), patch });
    }
    if !nc.status.is("Initialized") {
        let status = StatusPatch { conditions: vec![Condition::met("Initialized")], ..StatusPatch::default() };
        plan.effect(&claim.id, Action::PatchStatus(status));
    }
    if !initialized {
        plan.step(&claim.id, Step::Initialized);
    }
}

/// A terminating claim: its NodeClaim marked for deletion, its node tainted and drained, its
/// instance terminated, then the node and the finalizers removed and the claim gone.
fn terminating(
    plan: &mut Plan,
    input: &Input<'_>,
    cx: &Claimed<'_>,
    (instance, batch, gone): (Option<&str>, Option<&str>, bool),
    pods: Option<&Vec<&std::sync::Arc<crate::pod::Pod>>>,
) {
    let claim = cx.claim;
    let id = claim.id.as_str();
    if let Some(nc) = cx.nc()
        && !nc.deleting
    {
        plan.effect(id, Action::DeleteNodeClaim);
    }
    if !gone {
        if let Some(node) = cx.node() {
            let taint = disrupted_taint();
            if !node.taints.iter().any(|t| t.key == taint.key && t.effect == taint.effect) {
                let patch = NodePatch { add_taints: vec![taint], ..NodePatch::default() };
                plan.effect(id, Action::PatchNode { node: node.name.clone(), patch });
            }
            // The terminationGracePeriod runs from when the claim started terminating.
            let deadline = cx
                .nc()
                .and_then(|nc| nc.spec.termination_grace_period)
                .map(|tgp| cx.changed_at.saturating_add(crate::clock::to_millis(tgp)));
            let pods = pods.map(|v| v.iter().map(|p| p.as_ref()).collect::<Vec<_>>()).unwrap_or_default();
            let step = drain_step(pods, cx.now, deadline);
            if !step.is_done() {
                for p in step.delete {
                    plan.effect(id, Action::DeletePod(p.key.clone()));
                }
                for p in step.evict {
                    plan.effect(id, Action::Evict(p.key.clone()));
                }
                return;
            }
        }
        match (instance, batch) {
            (None, None) => plan.step(id, Step::InstanceGone),
            _ => {
                let batch = batch.and_then(|b| recorded(input, b));
                let instance = instance.map(str::to_string);
                plan.effect(id, Action::Terminate { zone: claim.zone.clone(), instance, batch });
            }
        }
        return;
    }
    // The instance is gone: the node and the finalizers go, then the claim.
    if let Some(node) = cx.node() {
        if node.finalizers.iter().any(|f| f == TERMINATION_FINALIZER) {
            let patch =
                NodePatch { remove_finalizers: vec![TERMINATION_FINALIZER.to_string()], ..NodePatch::default() };
            plan.effect(id, Action::PatchNode { node: node.name.clone(), patch });
        }
        if !node.deleting {
            plan.effect(id, Action::DeleteNode { node: node.name.clone() });
        }
    }
    if cx.nc().is_some_and(|nc| nc.finalizers.iter().any(|f| f == TERMINATION_FINALIZER)) {
        plan.effect(id, Action::RemoveFinalizer);
    }
    plan.step(id, Step::Gone);
}

/// Objects of the pool the ledger does not know (their claim is gone): a NodeClaim being
/// deleted loses its finalizer, a Node being deleted loses its finalizer.
fn orphans(plan: &mut Plan, input: &Input<'_>, known: &BTreeSet<&str>) {
    let snap = input.snapshot;
    // The provider ids of every known claim's instance: those nodes are the claims' to drain.
    let mut claimed_providers: BTreeSet<String> =
        input.claims.iter().filter_map(|c| Some(provider_id(&c.zone, c.state.instance()?))).collect();
    for nc in snap.nodeclaims.values() {
        if nc.spec.nodepool != input.pool {
            continue;
        }
        if known.contains(nc.name.as_str()) {
            if let Some(p) = nc.status.provider_id.as_deref() {
                claimed_providers.insert(p.to_string());
            }
            continue;
        }
        if input.busy.contains(&nc.name) {
            continue;
        }
        if nc.deleting && nc.finalizers.iter().any(|f| f == TERMINATION_FINALIZER) {
            plan.effect(&nc.name, Action::RemoveFinalizer);
        }
    }
    for node in snap.nodes.values() {
        if node.nodepool() != Some(input.pool) || !node.deleting {
            continue;
        }
        if node.provider_id.as_ref().is_some_and(|p| claimed_providers.contains(p)) {
            continue;
        }
        if node.finalizers.iter().any(|f| f == TERMINATION_FINALIZER) {
            let patch =
                NodePatch { remove_finalizers: vec![TERMINATION_FINALIZER.to_string()], ..NodePatch::default() };
            plan.effect(&node.name, Action::PatchNode { node: node.name.clone(), patch });
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, OnceLock};

    use proptest::prelude::*;

    use super::*;
    use crate::catalog::{Catalog, NodeClassSettings};
    use crate::ledger::{ClaimRequest, Command, Entry, State};
    use crate::nodepool::NodeClaimSpec;
    use crate::pod::{Pod, PodKey};
    use crate::requirements::{Requirement, Requirements};
    use crate::taints::{Effect as TaintEffect, Taint};

    const POOL: &str = "default";
    const ZONE: &str = "us-east-1a";

    fn m5() -> &'static [InstanceType] {
        static TYPES: OnceLock<Vec<InstanceType>> = OnceLock::new();
        TYPES.get_or_init(|| {
            let c = Catalog::embedded("us-east-1").expect("catalog");
            c.instance_types(&NodeClassSettings::default(), None)
                .into_iter()
                .filter(|t| t.name == "m5.large" || t.name == "m5.xlarge")
                .collect()
        })
    }

    /// The pool's claims in the ledger, the cluster as a snapshot, and the planner's memory:
    /// plans are applied here as the executor and the zone actors would (cloud effects only
    /// when a test says so).
    struct World {
        ledger: State,
        snap: Snapshot,
        memory: Memory,
        now: Millis,
        synced: bool,
        busy: BTreeSet<String>,
        unavailable: BTreeSet<Offering>,
    }

    impl World {
        fn new() -> Self {
            let mut ledger = State::default();
            ledger.apply(&entry(0, Command::SetPool { pool: POOL.into(), limits: ResourceList::new() }));
            World {
                ledger,
                snap: Snapshot::default(),
                memory: Memory::default(),
                now: 1_000_000,
                synced: true,
                busy: BTreeSet::new(),
                unavailable: BTreeSet::new(),
            }
        }

        fn propose(&mut self, command: Command) {
            let e = entry(self.now, command);
            self.ledger.apply(&e);
        }

        /// A claim reserved and created, then moved along by `steps`.
        fn claim(&mut self, id: &str, steps: Vec<Step>) {
            let req = ClaimRequest {
                id: id.into(),
                zone: ZONE.into(),
                resources: ResourceList::cpu_mem(2000, 8 << 30),
                price_per_hour: 96_000,
            };
            self.propose(Command::Reserve { pool: POOL.into(), claims: vec![req] });
            let mut reqs = Requirements::new();
            reqs.add(labels::INSTANCE_TYPE, Requirement::is_in(["m5.large", "m5.xlarge"]));
            reqs.add(labels::CAPACITY_TYPE, Requirement::is_in(["on-demand"]));
            let nc = NodeClaim {
                name: id.into(),
                spec: NodeClaimSpec {
                    nodepool: POOL.into(),
                    requirements: reqs,
                    labels: [("team".to_string(), "web".to_string())].into(),
                    startup_taints: vec![Taint::new("example.com/booting", "", TaintEffect::NoSchedule)],
                    ..NodeClaimSpec::default()
                },
                finalizers: vec![TERMINATION_FINALIZER.into()],
                deleting: false,
                status: Default::default(),
                resource_version: 1,
            };
            self.snap.nodeclaims.insert(id.into(), Arc::new(nc));
            for s in steps {
                self.step(id, s);
            }
        }

        fn step(&mut self, id: &str, step: Step) {
            if let Step::Launched { .. } = step {
                let batch = crate::ledger::LaunchBatch { id: format!("b-{id}"), claims: vec![id.into()] };
                self.propose(Command::Launch { zone: ZONE.into(), batches: vec![batch] });
            }
            self.propose(Command::Advance { steps: vec![(id.into(), step)] });
        }

        /// The node a launched claim's instance registers as (ready, with the unregistered
        /// taint and the claim's startup taint, and a taint of the node lifecycle controller).
        fn node(&mut self, instance: &str) -> String {
            let name = format!("ip-{instance}");
            let node = Node {
                name: name.clone(),
                labels: [(labels::NODEPOOL.to_string(), POOL.to_string())].into(),
                taints: vec![
                    Taint::new(UNREGISTERED_TAINT, "", TaintEffect::NoExecute),
                    Taint::new("example.com/booting", "", TaintEffect::NoSchedule),
                    Taint::new("node.kubernetes.io/network-unavailable", "", TaintEffect::NoSchedule),
                ],
                allocatable: ResourceList::cpu_mem(1930, 7 << 30),
                provider_id: Some(provider_id(ZONE, instance)),
                ready: true,
                ..Node::default()
            };
            self.snap.nodes.insert(name.clone(), Arc::new(node));
            name
        }

        fn pod_on(&mut self, name: &str, node: &str) -> PodKey {
            let mut p = Pod::new("default", name, ResourceList::cpu_mem(100, 1 << 20));
            p.node_name = Some(node.into());
            let key = p.key.clone();
            self.snap.pods.insert(key.clone(), Arc::new(p));
            key
        }

        fn plan(&mut self) -> Plan {
            let claims: Vec<Claim> = self.ledger.claims_of(POOL).cloned().collect();
            let zones = vec!["us-east-1a".to_string(), "us-east-1b".to_string()];
            let input = Input {
                pool: POOL,
                claims: &claims,
                batches: self.ledger.batches(),
                snapshot: &self.snap,
                synced: self.synced,
                now: self.now,
                types: m5(),
                zones: &zones,
                unavailable: &self.unavailable,
                busy: &self.busy,
            };
            reconcile(&input, &Config::default(), &mut self.memory)
        }

        /// Commits the plan's steps and runs its cluster effects (cloud effects are the
        /// zone actors': not run here).
        fn apply(&mut self, plan: &Plan) {
            if !plan.steps.is_empty() {
                self.propose(Command::Advance { steps: plan.steps.clone() });
            }
            for e in &plan.effects {
                apply_effect(&mut self.snap, e);
            }
        }

        fn state(&self, id: &str) -> Option<ClaimState> {
            self.ledger.claim(id).map(|c| c.state.clone())
        }
    }

    fn entry(at: Millis, command: Command) -> Entry {
        Entry { term: 1, at, command }
    }

    /// What the API server does with a cluster effect.
    fn apply_effect(snap: &mut Snapshot, e: &Effect) {
        let claim = e.claim.clone();
        match &e.action {
            Action::PatchStatus(p) => {
                if let Some(nc) = snap.nodeclaims.get_mut(&claim)
                    && let Some(s) = p.apply(&nc.status)
                {
                    Arc::make_mut(nc).status = s;
                }
            }
            Action::DeleteNodeClaim => {
                if let Some(nc) = snap.nodeclaims.get_mut(&claim) {
                    if nc.finalizers.is_empty() {
                        snap.nodeclaims.remove(&claim);
                    } else {
                        Arc::make_mut(nc).deleting = true;
                    }
                }
            }
            Action::RemoveFinalizer => {
                if let Some(nc) = snap.nodeclaims.get_mut(&claim) {
                    let nc = Arc::make_mut(nc);
                    nc.finalizers.retain(|f| f != TERMINATION_FINALIZER);
                    if nc.deleting && nc.finalizers.is_empty() {
                        snap.nodeclaims.remove(&claim);
                    }
                }
            }
            Action::PatchNode { node, patch } => {
                if let Some(n) = snap.nodes.get_mut(node)
                    && let Some(patched) = patch.apply(n)
                {
                    let gone = patched.deleting && patched.finalizers.is_empty();
                    *Arc::make_mut(n) = patched;
                    if gone {
                        snap.nodes.remove(node);
                    }
                }
            }
            Action::DeleteNode { node } => {
                if let Some(n) = snap.nodes.get_mut(node) {
                    if n.finalizers.is_empty() {
                        snap.nodes.remove(node);
                    } else {
                        Arc::make_mut(n).deleting = true;
                    }
                }
            }
            Action::Evict(p) | Action::DeletePod(p) => {
                snap.pods.remove(p);
            }
            Action::CreateNodeClaim(_) | Action::Launch { .. } | Action::Terminate { .. } | Action::Event(_) => {}
        }
    }

    fn launched(instance: &str) -> Step {
        Step::Launched {
            instance: instance.into(),
            resources: ResourceList::cpu_mem(2000, 8 << 30),
            allocatable: ResourceList::cpu_mem(1930, 7 << 30),
            price_per_hour: 96_000,
        }
    }

    fn has(plan: &Plan, f: impl Fn(&Action) -> bool) -> bool {
        plan.effects.iter().any(|e| f(&e.action))
    }

    #[test]
    fn a_view_that_is_not_synced_terminates_nothing() {
        let mut w = World::new();
        w.claim("default-abcde", vec![launched("i-1"), Step::Registered]);
        // The node is missing: on an unsynced view that means nothing.
        w.synced = false;
        w.now += 3_600_000;
        assert!(w.plan().is_empty());
    }

    #[test]
    fn a_node_missing_from_one_snapshot_terminates_nothing() {
        let mut w = World::new();
        w.claim("default-abcde", vec![launched("i-1"), Step::Registered]);
        // A relist shows the node missing once; it is back on the next snapshot.
        let plan = w.plan();
        assert!(plan.steps.is_empty(), "{:?}", plan.steps);
        let node = w.node("i-1");
        w.now += 10_000;
        let plan = w.plan();
        w.apply(&plan);
        assert!(w.plan().steps.is_empty());
        // Missing for good: lost only once the absence outlived the grace.
        w.snap.nodes.remove(&node);
        w.now += 10_000;
        assert!(w.plan().steps.is_empty());
        w.now += 25_000;
        assert!(w.plan().steps.is_empty(), "the grace counts from the first absence");
        w.now += 10_000;
        let plan = w.plan();
        assert!(plan.steps.contains(&("default-abcde".into(), Step::Terminating)), "{:?}", plan.steps);
    }

    #[test]
    fn registration_patches_single_items_and_initialization_follows_in_one_plan() {
        let mut w = World::new();
        w.claim("default-abcde", vec![launched("i-1")]);
        let node = w.node("i-1");
        let plan = w.plan();
        assert_eq!(plan.steps, vec![("default-abcde".to_string(), Step::Registered)], "the startup taint holds init");
        w.apply(&plan);
        let n = &w.snap.nodes[&node];
        assert!(!n.taints.iter().any(|t| t.key == UNREGISTERED_TAINT));
        assert!(n.taints.iter().any(|t| t.key == "node.kubernetes.io/network-unavailable"), "others' taints stay");
        assert_eq!(n.labels.get("team").map(String::as_str), Some("web"));
        assert_eq!(n.finalizers, vec![TERMINATION_FINALIZER.to_string()]);
        let nc = &w.snap.nodeclaims["default-abcde"];
        assert!(nc.status.is("Launched") && nc.status.is("Registered"));
        assert_eq!(nc.status.node_name.as_deref(), Some(node.as_str()));
        // The startup taint goes: initialized.
        Arc::make_mut(w.snap.nodes.get_mut(&node).expect("node")).taints.retain(|t| t.key != "example.com/booting");
        let plan = w.plan();
        assert_eq!(plan.steps, vec![("default-abcde".to_string(), Step::Initialized)]);
        w.apply(&plan);
        assert_eq!(w.snap.nodes[&node].labels.get(labels::INITIALIZED).map(String::as_str), Some("true"));
        assert!(w.plan().is_empty());
    }

    #[test]
    fn initialization_waits_for_ready_and_the_extended_resources_asked_for() {
        let mut w = World::new();
        w.claim("default-gpu", vec![launched("i-1")]);
        let nc = w.snap.nodeclaims.get_mut("default-gpu").expect("claim");
        let nc = Arc::make_mut(nc);
        nc.spec.startup_taints.clear();
        nc.spec.requests.set(ResourceName::NvidiaGpu, 1);
        let node = w.node("i-1");
        {
            let n = Arc::make_mut(w.snap.nodes.get_mut(&node).expect("node"));
            n.taints.retain(|t| t.key == UNREGISTERED_TAINT);
            n.ready = false;
        }
        let plan = w.plan();
        w.apply(&plan);
        assert!(matches!(w.state("default-gpu"), Some(ClaimState::Registered { .. })));
        Arc::make_mut(w.snap.nodes.get_mut(&node).expect("node")).ready = true;
        assert!(w.plan().steps.is_empty(), "the GPU is not registered yet");
        Arc::make_mut(w.snap.nodes.get_mut(&node).expect("node")).allocatable.set(ResourceName::NvidiaGpu, 1);
        assert_eq!(w.plan().steps, vec![("default-gpu".to_string(), Step::Initialized)]);
    }

    #[test]
    fn a_nodeclaim_deleted_by_hand_completes_through_its_finalizer() {
        let mut w = World::new();
        w.claim("default-abcde", vec![launched("i-1")]);
        let node = w.node("i-1");
        let plan = w.plan();
        w.apply(&plan);
        let pod = w.pod_on("web-0", &node);
        // kubectl delete nodeclaim: the API server marks it; the finalizer holds it.
        Arc::make_mut(w.snap.nodeclaims.get_mut("default-abcde").expect("claim")).deleting = true;
        let plan = w.plan();
        assert!(plan.steps.contains(&("default-abcde".into(), Step::Terminating)));
        assert!(has(&plan, |a| matches!(a, Action::Evict(p) if *p == pod)), "drained first");
        assert!(!has(&plan, |a| matches!(a, Action::Terminate { .. })), "the instance waits for the drain");
        w.apply(&plan);
        assert!(w.snap.nodes[&node].taints.iter().any(|t| t.key == "karpenter.sh/disrupted"));
        assert!(!w.snap.nodes[&node].unschedulable, "tainted, not cordoned");
        let plan = w.plan();
        let terminate = plan.effects.iter().find(|e| matches!(e.action, Action::Terminate { .. })).cloned();
        assert!(
            matches!(terminate.map(|e| e.action), Some(Action::Terminate { instance: Some(ref i), .. }) if i == "i-1")
        );
        // The zone actor terminated it.
        w.propose(Command::Advance { steps: vec![("default-abcde".into(), Step::InstanceGone)] });
        let plan = w.plan();
        w.apply(&plan);
        assert_eq!(w.state("default-abcde"), None, "the claim is gone from the ledger");
        assert!(w.snap.nodeclaims.is_empty(), "and its NodeClaim from the cluster");
        assert!(w.snap.nodes.is_empty(), "and its node");
        assert!(w.plan().is_empty());
    }

    #[test]
    fn a_node_deleted_by_hand_is_drained_before_its_instance_goes() {
        let mut w = World::new();
        w.claim("default-abcde", vec![launched("i-1")]);
        let node = w.node("i-1");
        let plan = w.plan();
        w.apply(&plan);
        let pod = w.pod_on("web-0", &node);
        // kubectl delete node: the finalizer holds it.
        Arc::make_mut(w.snap.nodes.get_mut(&node).expect("node")).deleting = true;
        let plan = w.plan();
        assert!(plan.steps.contains(&("default-abcde".into(), Step::Terminating)));
        assert!(has(&plan, |a| matches!(a, Action::Evict(p) if *p == pod)));
        assert!(!has(&plan, |a| matches!(a, Action::Terminate { .. } | Action::DeleteNode { .. })));
        w.apply(&plan);
        assert!(w.snap.nodes.contains_key(&node), "still there: its finalizer waits for the instance");
        assert!(has(&w.plan(), |a| matches!(a, Action::Terminate { .. })), "drained: now the instance");
    }

    #[test]
    fn a_claim_deleted_mid_launch_terminates_what_its_batch_made() {
        let mut w = World::new();
        w.claim("default-abcde", vec![]);
        let batch = crate::ledger::LaunchBatch { id: "b1".into(), claims: vec!["default-abcde".into()] };
        w.propose(Command::Launch { zone: ZONE.into(), batches: vec![batch.clone()] });
        Arc::make_mut(w.snap.nodeclaims.get_mut("default-abcde").expect("claim")).deleting = true;
        let plan = w.plan();
        assert!(plan.steps.contains(&("default-abcde".into(), Step::Terminating)));
        assert!(
            has(&plan, |a| matches!(a, Action::Terminate { instance: None, batch: Some(b), .. } if *b == batch)),
            "{:?}",
            plan.effects
        );
        assert!(!plan.steps.contains(&("default-abcde".into(), Step::Gone)), "not gone until the batch is looked up");
    }

    #[test]
    fn a_reserved_claim_whose_zone_has_no_capacity_launches_in_another() {
        let mut w = World::new();
        w.claim("default-abcde", vec![]);
        let launch_zone = |p: &Plan| {
            p.effects.iter().find_map(|e| match &e.action {
                Action::Launch { zone, .. } => Some(zone.clone()),
                _ => None,
            })
        };
        assert_eq!(launch_zone(&w.plan()).as_deref(), Some(ZONE));
        for t in ["m5.large", "m5.xlarge"] {
            w.unavailable.insert(Offering {
                instance_type: t.into(),
                zone: ZONE.into(),
                capacity_type: crate::catalog::CapacityType::OnDemand,
            });
        }
        assert_eq!(launch_zone(&w.plan()).as_deref(), Some("us-east-1b"), "ICE marks respected");
        w.unavailable.extend(["m5.large", "m5.xlarge"].map(|t| Offering {
            instance_type: t.into(),
            zone: "us-east-1b".into(),
            capacity_type: crate::catalog::CapacityType::OnDemand,
        }));
        let plan = w.plan();
        assert_eq!(launch_zone(&plan), None);
        assert!(plan.steps.contains(&("default-abcde".into(), Step::Gone)), "released: {:?}", plan.steps);
    }

    #[test]
    fn a_claim_busy_in_its_round_and_a_round_cut_off_before_the_create() {
        let mut w = World::new();
        w.claim("default-abcde", vec![]);
        w.snap.nodeclaims.clear();
        w.busy.insert("default-abcde".into());
        w.now += 60_000;
        assert!(w.plan().is_empty(), "its round is still creating it");
        w.busy.clear();
        assert_eq!(w.plan().steps, vec![("default-abcde".to_string(), Step::Gone)], "cut off by a restart");
    }

    #[test]
    fn a_launch_that_outlives_its_timeout_is_terminated() {
        let mut w = World::new();
        w.claim("default-abcde", vec![]);
        w.now += 5 * 60_000;
        let plan = w.plan();
        assert!(plan.steps.contains(&("default-abcde".into(), Step::Terminating)));
    }

    #[test]
    fn orphaned_objects_lose_their_finalizers() {
        let mut w = World::new();
        w.claim("default-abcde", vec![launched("i-1")]);
        let node = w.node("i-1");
        let plan = w.plan();
        w.apply(&plan);
        // The claim went from the ledger; its objects were left being deleted.
        w.propose(Command::Advance { steps: vec![("default-abcde".into(), Step::Gone)] });
        Arc::make_mut(w.snap.nodeclaims.get_mut("default-abcde").expect("claim")).deleting = true;
        Arc::make_mut(w.snap.nodes.get_mut(&node).expect("node")).deleting = true;
        let plan = w.plan();
        assert!(has(&plan, |a| matches!(a, Action::RemoveFinalizer)));
        assert!(has(&plan, |a| matches!(a, Action::PatchNode { patch, .. } if !patch.remove_finalizers.is_empty())));
    }

    /// A claim in some state with a cluster showing something of it.
    #[derive(Clone, Debug)]
    struct Case {
        steps: Vec<Step>,
        nodeclaim: bool,
        nc_deleting: bool,
        node: bool,
        node_ready: bool,
        node_deleting: bool,
        startup_taint: bool,
        pods: usize,
        advance_ms: u64,
    }

    fn case() -> impl Strategy<Value = Case> {
        let steps = prop_oneof![
            Just(vec![]),
            Just(vec![launched("i-1")]),
            Just(vec![launched("i-1"), Step::Registered]),
            Just(vec![launched("i-1"), Step::Registered, Step::Initialized]),
            Just(vec![launched("i-1"), Step::Terminating]),
            Just(vec![Step::Terminating]),
            Just(vec![launched("i-1"), Step::Terminating, Step::InstanceGone]),
        ];
        (
            steps,
            any::<bool>(),
            any::<bool>(),
            any::<bool>(),
            any::<bool>(),
            any::<bool>(),
            any::<bool>(),
            0usize..3,
            0u64..1_200_000,
        )
            .prop_map(
                |(steps, nodeclaim, nc_deleting, node, node_ready, node_deleting, startup_taint, pods, advance_ms)| {
                    Case {
                        steps,
                        nodeclaim,
                        nc_deleting,
                        node,
                        node_ready,
                        node_deleting,
                        startup_taint,
                        pods,
                        advance_ms,
                    }
                },
            )
    }

    fn world_of(cases: &[Case]) -> World {
        let mut w = World::new();
        for (i, c) in cases.iter().enumerate() {
            let id = format!("default-{i:05}");
            let instance = format!("i-{i}");
            let steps = c
                .steps
                .iter()
                .map(|s| match s {
                    Step::Launched { .. } => launched(&instance),
                    s => s.clone(),
                })
                .collect();
            w.claim(&id, steps);
            if !c.nodeclaim {
                w.snap.nodeclaims.remove(&id);
            } else if c.nc_deleting {
                Arc::make_mut(w.snap.nodeclaims.get_mut(&id).expect("claim")).deleting = true;
            }
            if c.node {
                let node = w.node(&instance);
                let n = Arc::make_mut(w.snap.nodes.get_mut(&node).expect("node"));
                n.ready = c.node_ready;
                n.deleting = c.node_deleting;
                if c.node_deleting {
                    n.finalizers.push(TERMINATION_FINALIZER.into());
                }
                if !c.startup_taint {
                    n.taints.retain(|t| t.key != "example.com/booting");
                }
                for p in 0..c.pods {
                    w.pod_on(&format!("p-{i}-{p}"), &node);
                }
            }
        }
        w.now += cases.iter().map(|c| c.advance_ms).max().unwrap_or(0);
        w
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(400))]

        /// Reconciling, applying the plan (its steps committed, its cluster effects done) and
        /// reconciling again proposes nothing new, and asks for no cluster change that is not
        /// already made (the cloud's and the evictions' effects wait for the world).
        #[test]
        fn reconcile_is_idempotent(cases in prop::collection::vec(case(), 1..6)) {
            let mut w = world_of(&cases);
            let first = w.plan();
            w.apply(&first);
            let again = w.plan();
            prop_assert!(again.steps.is_empty(), "new steps after applying {:?}: {:?}", first.steps, again.steps);
            for e in &again.effects {
                let mut snap = w.snap.clone();
                let before = format!("{:?}", (&snap.nodes, &snap.nodeclaims));
                if matches!(e.action, Action::Evict(_) | Action::DeletePod(_)) {
                    continue;
                }
                apply_effect(&mut snap, e);
                prop_assert_eq!(before, format!("{:?}", (&snap.nodes, &snap.nodeclaims)), "{:?} changes the cluster again", e);
            }
        }

        /// Whatever the view, an unsynced one plans nothing.
        #[test]
        fn an_unsynced_view_plans_nothing(cases in prop::collection::vec(case(), 1..6)) {
            let mut w = world_of(&cases);
            w.synced = false;
            prop_assert!(w.plan().is_empty());
        }
    }
}
