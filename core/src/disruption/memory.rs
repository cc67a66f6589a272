//! What the planner remembers between rounds, and the fingerprints it compares.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use super::Proposal;
use crate::cluster::Snapshot;
use crate::ledger::Millis;
use crate::pod::{Pod, PodKey};
use crate::shared::FastMap;

/// What the planner remembers between rounds: when each node last saw its pods change (the
/// start of its `consolidateAfter` wait), and since when each drifted.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Memory {
    pub(super) pod_events: BTreeMap<String, (u64, Millis)>,
    pub(super) drifted_since: BTreeMap<String, Millis>,
    /// The commands being validated, and since when.
    pub(super) pending: Vec<(Proposal, Millis)>,
    /// The cluster's shape (its nodes and their pods) and the pool's candidates when
    /// consolidation last found nothing, and when.
    pub(super) quiet: Option<(u64, Millis)>,
    /// What consolidation last said of each candidate it kept.
    pub(super) kept: BTreeMap<String, String>,
    /// What consolidation remembers of the candidates only a delete could move.
    pub(super) stuck: Stuck,
}

/// Per candidate whose pods only a delete could move (no one new node may replace it), the
/// pod its last trial found no other node for (the first that needed a new node, else the
/// first left unplaced). Next time that pod is asked first whether it fits on another node
/// now; if not, no move of the candidate holds, whatever its other pods do, and the trial is
/// skipped.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Stuck {
    pods: BTreeMap<String, PodKey>,
    skipped: u64,
}

impl Stuck {
    pub(super) fn get(&self, claim: &str) -> Option<&PodKey> {
        self.pods.get(claim)
    }

    pub(super) fn remember(&mut self, claim: &str, pod: PodKey) {
        self.pods.insert(claim.to_string(), pod);
    }

    pub(super) fn forget(&mut self, claim: &str) {
        self.pods.remove(claim);
    }

    /// A trial skipped: its remembered pod still fits on no other node, or the other nodes'
    /// room, counted, cannot hold the candidate's pods.
    pub(super) fn skipped_one(&mut self) {
        self.skipped += 1;
    }

    /// How many single-node trials were skipped so far.
    pub fn skipped(&self) -> u64 {
        self.skipped
    }
}

impl Memory {
    /// When the next command under validation may be proposed (it started `validation` ms
    /// before), after `now`, if one waits: the caller plans again then rather than at its
    /// next period. A command whose own validation ended and that waits only for one before
    /// it in its round's chain is due when that one is: it does not make the caller plan
    /// again at once (the churn scenario planned every 2 ms of its clock for the 15 s of such
    /// a wait, 7,500 rounds, 350 s of wall time).
    pub fn validation_due(&self, validation: Millis, now: Millis) -> Option<Millis> {
        self.pending.iter().map(|(_, since)| since.saturating_add(validation)).filter(|due| *due > now).min()
    }

    /// When the node's pods last changed, given their fingerprint now. A node seen for the
    /// first time counts from `seen` (what its NodeClaim says), else from now: what happened
    /// on it before is unknown, and waiting once more is the safe side.
    pub(super) fn last_pod_event(
        &mut self,
        claim: &str,
        fingerprint: u64,
        now: Millis,
        seen: Option<Millis>,
    ) -> Millis {
        let e = self.pod_events.entry(claim.to_string()).or_insert((fingerprint, seen.unwrap_or(now)));
        if e.0 != fingerprint {
            *e = (fingerprint, now);
        }
        e.1
    }

    pub(super) fn keep_only(&mut self, claims: &BTreeSet<&str>) {
        self.pod_events.retain(|c, _| claims.contains(c.as_str()));
        self.drifted_since.retain(|c, _| claims.contains(c.as_str()));
        self.kept.retain(|c, _| claims.contains(c.as_str()));
        self.stuck.pods.retain(|c, _| claims.contains(c.as_str()));
    }
}

/// What consolidation's answer depends on: every node (name, initialized, deleting, marked
/// do-not-disrupt) with the pods bound to it, and which of the pool's nodes are candidates.
/// Nodes and pods can stay as they were while the candidates change: a node's pods were still
/// for `consolidateAfter`, or a PDB allows a disruption again once an evicted pod's successor
/// is ready. Each such node is a move not tried yet (Karpenter's consolidation state changes
/// with the NodeClaim's `Consolidatable` condition and with the pod's readiness).
pub(super) fn cluster_shape<'a>(
    snap: &Snapshot,
    pods_by_node: &FastMap<&str, Vec<&Arc<Pod>>>,
    candidates: impl Iterator<Item = &'a str>,
) -> u64 {
    let mut h = crate::shared::Fnv::default();
    let mut candidates: Vec<&str> = candidates.collect();
    candidates.sort_unstable();
    for c in candidates {
        h.write(c.as_bytes());
        h.write(&[0]);
    }
    let no_pods = Vec::new();
    for n in snap.nodes.values() {
        h.write(n.name.as_bytes());
        h.write_u64(u64::from(n.initialized) | u64::from(n.deleting) << 1 | u64::from(n.do_not_disrupt) << 2);
        h.write_u64(fingerprint(pods_by_node.get(n.name.as_str()).unwrap_or(&no_pods)));
    }
    h.finish()
}

/// A fingerprint of the pods bound to a node (their keys): changes when one comes or goes.
/// Each key is hashed on its own, mixed, and the results summed, so the order the pods come
/// in does not matter and nothing is sorted (every consolidation round fingerprints every node
/// of the cluster). The mix matters: FNV's last step is linear in the last byte, so without it
/// the sums of `{web-0, web-3}` and `{web-1, web-2}` (a StatefulSet's pods) are equal.
pub(super) fn fingerprint(pods: &[&Arc<Pod>]) -> u64 {
    pods.iter().fold(0u64, |sum, p| {
        let mut h = crate::shared::Fnv::default();
        h.write(p.key.namespace.as_bytes());
        h.write(&[0]);
        h.write(p.key.name.as_bytes());
        sum.wrapping_add(mix(h.finish()))
    })
}

/// A bijective 64-bit finalizer (MurmurHash3's `fmix64`): every input bit reaches every
/// output bit.
fn mix(mut x: u64) -> u64 {
    x ^= x >> 33;
    x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
    x ^= x >> 33;
    x = x.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    x ^ (x >> 33)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pod::Pod;

    fn pods(names: &[&str]) -> Vec<Arc<Pod>> {
        names.iter().map(|n| Arc::new(Pod::new("default", n, crate::resources::ResourceList::new()))).collect()
    }

    fn of(pods: &[Arc<Pod>]) -> u64 {
        fingerprint(&pods.iter().collect::<Vec<_>>())
    }

    /// Two pods of a StatefulSet swapped for two others: the node's pods changed, and its
    /// `consolidateAfter` wait starts again (fails with a plain sum of FNV hashes).
    #[test]
    fn a_nodes_fingerprint_changes_when_a_statefulsets_pods_are_swapped_for_others() {
        let mut seen = std::collections::BTreeMap::new();
        let names: Vec<String> = (0..40).map(|i| format!("web-{i}")).collect();
        for a in 0..names.len() {
            for b in a + 1..names.len() {
                let f = of(&pods(&[&names[a], &names[b]]));
                if let Some(before) = seen.insert(f, (a, b)) {
                    panic!("{{web-{}, web-{}}} and {{web-{a}, web-{b}}} have the same fingerprint", before.0, before.1);
                }
            }
        }
    }

    #[test]
    fn a_nodes_fingerprint_does_not_depend_on_the_order_of_its_pods() {
        assert_eq!(of(&pods(&["a", "b", "c"])), of(&pods(&["c", "a", "b"])));
        assert_ne!(of(&pods(&["a", "b"])), of(&pods(&["a", "b", "c"])));
        assert_ne!(of(&pods(&[])), of(&pods(&["a"])));
    }
}
