//! The traces of launched claims: per decision whose pods a claim holds, a
//! `nodepool.register` span when its node registers and a `cluster.bind` span under it until
//! the decision's pods are bound (or the claim waited `follow_for`).

use dovetail_cloud::Instance;
use dovetail_core::ledger::Millis;
use dovetail_core::pod::PodKey;

use super::{NodePoolActor, Traced};
use crate::trace::{self, Cause};

/// A launched claim whose decisions are traced, followed until its pods are bound.
pub(super) struct Follow {
    since: Millis,
    instance_type: String,
    capacity_type: String,
    /// Per decision: its `zone.launch` span, then its `cluster.bind` span (opened at
    /// registration), and the decision's pods on the claim.
    decisions: Vec<(Cause, Option<tracing::Span>, Vec<PodKey>)>,
}

impl NodePoolActor {
    /// Keeps a launched claim's traces, with each decision's pods on it, until they bind.
    pub(super) fn follow(&mut self, claim: &str, inst: &Instance, pods: Traced, launches: Vec<Cause>) {
        let rounds = trace::distinct(&pods.causes);
        if rounds.is_empty() {
            return;
        }
        let decisions = rounds
            .iter()
            .enumerate()
            .map(|(k, round)| {
                let keys = (0..pods.pods.len())
                    .filter(|&i| trace::cause_at(&pods.causes, i).span_id() == round.span_id())
                    .map(|i| pods.pods[i].key.clone())
                    .collect();
                // The zone's span of this decision's launch (the round's when the zone sent none).
                (launches.get(k).cloned().unwrap_or_else(|| round.clone()), None, keys)
            })
            .collect();
        let follow = Follow {
            since: self.now(),
            instance_type: inst.instance_type.clone(),
            capacity_type: inst.capacity_type.to_string(),
            decisions,
        };
        self.following.insert(claim.to_string(), follow);
    }

    /// The claim's node registered: a `nodepool.register` span in each decision's trace, and a
    /// `cluster.bind` span under it that stays open until the decision's pods are bound.
    pub(super) fn traced_registration(&mut self, claim: &str, node: &str) {
        let now = self.now();
        let Some(f) = self.following.get_mut(claim) else { return };
        f.since = now;
        for (cause, bind, pods) in &mut f.decisions {
            let register = tracing::info_span!(
                parent: None,
                "nodepool.register",
                nodepool = %self.pool.name,
                nodeclaim = claim,
                node,
                instance_type = %f.instance_type,
                capacity_type = %f.capacity_type,
            );
            cause.adopt(&register);
            *bind = Some(tracing::info_span!(
                parent: &register,
                "cluster.bind",
                nodepool = %self.pool.name,
                nodeclaim = claim,
                node,
                pods = pods.len(),
                pods.bound = tracing::field::Empty,
                pods.elsewhere = tracing::field::Empty,
            ));
        }
    }

    /// Closes the `cluster.bind` spans whose pods are all bound (or gone), and those of claims
    /// that waited past `follow_for` or are no longer live.
    pub(super) fn traced_binding(&mut self, snap: &dovetail_cluster::Snapshot) {
        if self.following.is_empty() {
            return;
        }
        let now = self.now();
        let follow_for = dovetail_core::clock::to_millis(self.cfg.follow_for);
        self.following.retain(|id, f| {
            let node = snap.nodeclaims.get(id).and_then(|nc| nc.status.node_name.clone());
            let expired = now.saturating_sub(f.since) > follow_for || !snap.nodeclaims.contains_key(id);
            f.decisions.retain(|(_, bind, pods)| {
                let Some(bind) = bind else { return !expired };
                let (mut here, mut elsewhere, mut waiting) = (0u64, 0u64, 0u64);
                for k in pods {
                    match snap.pods.get(k).map(|p| p.node_name.as_deref()) {
                        Some(Some(n)) if Some(n) == node.as_deref() => here += 1,
                        Some(Some(_)) | None => elsewhere += 1,
                        Some(None) => waiting += 1,
                    }
                }
                if waiting > 0 && !expired {
                    return true;
                }
                bind.record("pods.bound", here);
                bind.record("pods.elsewhere", elsewhere);
                false
            });
            !f.decisions.is_empty()
        });
    }
}
