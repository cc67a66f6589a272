//! Claims on their way up: launch (and the re-drive of a recorded batch), the relaunch after
//! insufficient capacity, registration, initialization, and nodes lost.

use std::collections::BTreeSet;

use crate::plane::TypesByName;

use crate::cluster::{
    Condition, NodeClaim, NodePatch, ObjectKind, StatusPatch, TERMINATION_FINALIZER, UNREGISTERED_TAINT,
};
use crate::effect::Action;
use crate::labels;
use crate::ledger::{Claim, ClaimState, LaunchBatch, Offering, Step};
use crate::node::Node;
use crate::plane::{allowed_zones, capacity_types, relaunch_zone};
use crate::requirements::Operator;
use crate::resources::{ResourceList, ResourceName};

use super::{Claimed, Config, Input, Memory, Plan, is_extended, provider_id};

/// A claim that is not terminating: launch, registration, initialization, loss.
pub(super) fn live(
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
                // Reserved again after a call that found no capacity: called before.
                Some(zone) => plan.effect(id, Action::Launch { zone, batch: None, again: claim.tried_at.is_some() }),
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
            // Launching: its batch was recorded, so a call was made (or cut off by a restart).
            plan.effect(id, Action::Launch { zone: claim.zone.clone(), batch, again: true });
        }
        ClaimState::Launched { instance }
        | ClaimState::Registered { instance }
        | ClaimState::Initialized { instance } => {
            launched_status(plan, cx.types, claim, nc, instance);
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
pub(super) fn recorded(input: &Input<'_>, id: &str) -> Option<LaunchBatch> {
    input.batches.get(id).map(|r| LaunchBatch { id: id.to_string(), claims: r.claims.clone() })
}

/// The zone a reserved claim launches in: its own while none of its types is marked out of
/// capacity there, else the zone of the cheapest offering left unmarked among the zones it may use
/// (its own on a tie). Karpenter gets there by deleting the NodeClaim and scheduling its pods
/// again; staying in the zone while any type is left there would try the next 60 types of a
/// zone that is out of capacity for all of them, one CreateFleet call at a time.
fn launch_zone(input: &Input<'_>, claim: &Claim, nc: &NodeClaim) -> Option<String> {
    let candidates = nc.spec.requirements.get(labels::INSTANCE_TYPE);
    let types = candidates.values();
    // None of its types marked in its zone: it stays (the usual case, without a look at the
    // catalog; marks of other pools' types do not move it). A claim taken over from the cluster
    // before it launched has no zone yet: it gets the cheapest one it may use.
    if !claim.zone.is_empty()
        && !input.unavailable.iter().any(|o| o.zone == claim.zone && types.contains(&o.instance_type))
    {
        return Some(claim.zone.clone());
    }
    let cts = capacity_types(&nc.spec.requirements);
    let unavailable = |t: &str, o: &crate::catalog::Offering| {
        input.unavailable.contains(&Offering {
            instance_type: t.to_string(),
            zone: o.zone.clone(),
            capacity_type: o.capacity_type,
        })
    };
    let zones = allowed_zones(&nc.spec.requirements, input.zones);
    let prefer = (!claim.zone.is_empty()).then_some(claim.zone.as_str());
    relaunch_zone(input.types, types, &cts, &zones, prefer, unavailable).map(|c| c.zone)
}

/// What a launched claim's NodeClaim shows: the labels of what it launched as (its instance
/// type's labels, zone and capacity type, as Karpenter writes them at launch), then its
/// provider id, capacity and `Launched`; in that order, so that a provider id in the cluster
/// always comes with the labels that say what the instance is (a controller that restarts
/// rebuilds from them).
fn launched_status(plan: &mut Plan, types: &TypesByName<'_>, claim: &Claim, nc: &NodeClaim, instance: &str) {
    let pid = provider_id(&claim.zone, instance);
    // Launched: the labels went with it (they are written first). As Karpenter's launch
    // controller, which does nothing more once the condition is set: a label taken off the
    // NodeClaim since is not put back.
    if nc.status.provider_id.as_deref() == Some(pid.as_str()) && nc.status.is("Launched") {
        return;
    }
    let labels: Vec<(String, String)> = launch_labels(types, claim)
        .into_iter()
        .filter(|(k, v)| nc.spec.labels.get(*k).map(String::as_str) != Some(*v))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let mut capacity = claim.resources.clone();
    capacity.set(ResourceName::Nodes, 0);
    let patch = StatusPatch {
        provider_id: Some(pid),
        capacity: Some(ResourceList::from_pairs(capacity.iter().filter(|(_, v)| *v != 0).map(|(n, v)| (n.clone(), v)))),
        allocatable: Some(claim.allocatable.clone()),
        conditions: vec![Condition::met("Launched")],
        ..StatusPatch::default()
    };
    plan.effect(&claim.id, Action::Launched { labels, status: patch });
}

/// The labels a launched claim's NodeClaim gets: every label its instance type has one value
/// of, its zone and its capacity type (none when what it launched as is not known: a claim
/// taken over from a cluster that did not write them). Borrowed: every reconcile asks this of
/// every launched claim, and a claim whose NodeClaim has them all copies none.
fn launch_labels<'a>(types: &TypesByName<'a>, claim: &'a Claim) -> Vec<(&'a str, &'a str)> {
    let Some((instance_type, capacity_type)) = &claim.launched_as else { return Vec::new() };
    let own = |k: &str| k == labels::ZONE || k == labels::CAPACITY_TYPE || k == labels::INSTANCE_TYPE;
    let mut out: Vec<(&str, &str)> = types
        .get(instance_type.as_str())
        .map(|t| {
            t.requirements
                .iter()
                .filter(|(k, r)| r.operator() == Operator::In && r.values().len() == 1 && !own(k))
                .map(|(k, r)| (k, r.values()[0].as_str()))
                .collect()
        })
        .unwrap_or_default();
    out.push((labels::INSTANCE_TYPE, instance_type.as_str()));
    out.push((labels::ZONE, claim.zone.as_str()));
    out.push((labels::CAPACITY_TYPE, capacity_type.as_str()));
    out
}

/// Registration (Karpenter's): the node gets the claim's labels and taints and
/// `karpenter.sh/registered`, loses `karpenter.sh/unregistered`, and carries the termination
/// finalizer; the NodeClaim names its node and is `Registered`.
///
/// The node is synced once, as Karpenter does: the patch that carries the claim's labels and
/// taints also writes `karpenter.sh/registered`, and a node that has it is not patched
/// again. A label or taint an admin takes off a registered node stays off (a `NoExecute`
/// taint put back would evict its pods).
fn register(plan: &mut Plan, claim: &Claim, state: &ClaimState, nc: &NodeClaim, node: &Node) {
    let registered = node.labels.get(labels::REGISTERED).map(String::as_str) == Some("true");
    if !registered {
        sync_node(plan, claim, nc, node);
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

/// The registration patch of a node that is not registered yet: the claim's labels and
/// taints, `karpenter.sh/registered`, the termination finalizer, the owner reference, and
/// `karpenter.sh/unregistered` off, all in one write.
fn sync_node(plan: &mut Plan, claim: &Claim, nc: &NodeClaim, node: &Node) {
    let mut labels: Vec<(String, String)> = nc
        .spec
        .labels
        .iter()
        .filter(|(k, v)| node.labels.get(*k) != Some(*v))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    labels.push((labels::REGISTERED.to_string(), "true".to_string()));
    let patch = NodePatch {
        add_taints: nc.spec.taints.clone(),
        remove_taints: node.taints.iter().filter(|t| t.key == UNREGISTERED_TAINT).cloned().collect(),
        labels,
        add_finalizers: vec![TERMINATION_FINALIZER.to_string()],
        owner_claim: Some(nc.name.clone()),
        ..NodePatch::default()
    };
    if patch.apply(node).is_some() {
        plan.effect(&claim.id, Action::PatchNode { node: node.name.clone(), patch });
    }
}

/// Initialization (Karpenter's): the node is Ready, its startup taints and the known
/// ephemeral taints (`karpenter.sh/unregistered`, `node.kubernetes.io/not-ready`, ...) are
/// gone, and the extended resources the claim asked for are registered; then the node is
/// labelled `karpenter.sh/initialized` and the NodeClaim is `Initialized`. A node labelled
/// while its not-ready taint is still on would count, initialized, with a taint no pod
/// tolerates: capacity the provisioner would buy again (a 20 x 1,000 run bought 57 nodes for
/// pods counted onto 48 such nodes).
fn initialize(plan: &mut Plan, claim: &Claim, state: &ClaimState, nc: &NodeClaim, node: &Node) {
    let tainted = node.taints.iter().any(|t| {
        crate::taints::is_known_ephemeral(t)
            || nc.spec.startup_taints.iter().any(|s| s.key == t.key && s.effect == t.effect)
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
