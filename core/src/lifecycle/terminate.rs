//! Claims on their way out (taint, drain, terminate, remove the node and the finalizers),
//! and the pool's objects the ledger no longer knows.

use std::collections::BTreeSet;

use crate::cluster::{NodePatch, TERMINATION_FINALIZER};
use crate::effect::Action;
use crate::ledger::Step;
use crate::plane::{disrupted_taint, drain_step, shortened_grace};

use super::live::recorded;
use super::{Claimed, Config, Input, Memory, Plan, provider_id};

/// A terminating claim: its NodeClaim marked for deletion, its node tainted and drained, its
/// instance terminated, then the node and the finalizers removed and the claim gone.
pub(super) fn terminating(
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
            // The terminationGracePeriod runs from when the claim started terminating; an
            // interruption's deadline (EC2 takes the instance then) comes first if sooner.
            let grace = cx
                .nc()
                .and_then(|nc| nc.spec.termination_grace_period)
                .map(|tgp| cx.changed_at.saturating_add(crate::clock::to_millis(tgp)));
            let interruption =
                input.interrupted.get(id).map(|(r, _)| r.deadline).filter(|d| *d != crate::interruption::NO_DEADLINE);
            let deadline = match (grace, interruption) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
            let pods = pods.map(|v| v.iter().map(|p| p.as_ref()).collect::<Vec<_>>()).unwrap_or_default();
            let step = drain_step(pods, cx.now, deadline);
            if !step.is_done() {
                for p in step.delete {
                    let grace_seconds = shortened_grace(p, cx.now, deadline);
                    plan.effect(id, Action::DeletePod { pod: p.key.clone(), grace_seconds });
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
///
/// A NodeClaim the ledger does not know that is not being deleted and never launched (no
/// provider id: a round released its claim before the create landed) is deleted once its
/// orphanhood outlived `create_grace`. One with an instance is left alone: it may be another
/// controller's (a migration), and instance garbage collection is the cloud side's.
pub(super) fn orphans(
    plan: &mut Plan,
    input: &Input<'_>,
    known: &BTreeSet<&str>,
    (cfg, memory, seen): (&Config, &mut Memory, &mut BTreeSet<String>),
) {
    let snap = input.snapshot;
    // The provider ids of every known claim's instance: those nodes are the claims' to drain.
    // Only a deleting node of the pool asks, so the set is built on the first such node.
    let claimed = || -> BTreeSet<String> {
        let mut out: BTreeSet<String> =
            input.claims.iter().filter_map(|c| Some(provider_id(&c.zone, c.state.instance()?))).collect();
        let known_providers = snap
            .nodeclaims
            .values()
            .filter(|nc| nc.spec.nodepool == input.pool && known.contains(nc.name.as_str()))
            .filter_map(|nc| nc.status.provider_id.clone());
        out.extend(known_providers);
        out
    };
    let mut claimed_providers: Option<BTreeSet<String>> = None;
    for nc in snap.nodeclaims.values() {
        if nc.spec.nodepool != input.pool || known.contains(nc.name.as_str()) {
            continue;
        }
        if input.busy.contains(&nc.name) {
            continue;
        }
        if nc.deleting && nc.finalizers.iter().any(|f| f == TERMINATION_FINALIZER) {
            plan.effect(&nc.name, Action::RemoveFinalizer);
        } else if !nc.deleting && nc.status.provider_id.is_none() {
            let key = format!("orphan/{}", nc.name);
            seen.insert(key.clone());
            if memory.missing_for(key, input.now, cfg.create_grace) {
                plan.effect(&nc.name, Action::DeleteNodeClaim);
            }
        }
    }
    for node in snap.nodes.values() {
        if node.nodepool() != Some(input.pool) || !node.deleting {
            continue;
        }
        let claimed_providers = claimed_providers.get_or_insert_with(claimed);
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
