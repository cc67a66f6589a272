//! Karpenter's nominations: the nodes (and in-flight NodeClaims, by name) the Router left
//! pending pods to, each until its window ends. Disruption does not take a nominated node:
//! the pods planned onto it are on their way there (kube-scheduler binds them once it is
//! ready), and removing it would only send them back pending.
//!
//! Each pod planned onto capacity is also held there (by pod): the Router solves only the
//! pods of a batch, so a later batch would otherwise see an in-flight NodeClaim sized for
//! pods still pending as free, and plan other pods onto it too. While a pod is pending and
//! its hold runs, later solves count it on its node as if bound (Karpenter's provisioner gets
//! the same by solving every pending pod at each batch).

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, PoisonError};

use dovetail_core::ledger::Millis;
use dovetail_core::pod::PodKey;

/// The nominations, shared by the Router (which nominates) and the NodePool actors (which
/// read them when they plan disruption), and the holds: each pod planned onto capacity (by the
/// Router onto existing or in-flight capacity, by a NodePool actor onto the claims it creates),
/// which the Router's later solves count there while the pod is pending. Entries past their
/// end are dropped on each write, so it holds at most what was nominated or held within one
/// window.
#[derive(Clone, Debug, Default)]
pub struct Nominations {
    inner: Arc<Mutex<HashMap<String, Millis>>>,
    /// Each held pod: the node (or in-flight NodeClaim) it was planned onto, and until when.
    holds: Arc<Mutex<HashMap<PodKey, (String, Millis)>>>,
}

impl Nominations {
    /// Nominates `nodes` until `until`; a node nominated again keeps the later end.
    pub fn nominate<'a>(&self, nodes: impl IntoIterator<Item = &'a str>, now: Millis, until: Millis) {
        let mut m = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        m.retain(|_, end| *end > now);
        for n in nodes {
            let end = m.entry(n.to_string()).or_insert(until);
            *end = (*end).max(until);
        }
    }

    /// Holds each pod on its node (or in-flight NodeClaim) until `until`; a pod held again is
    /// held where it was planned last.
    pub fn hold(&self, pods: impl IntoIterator<Item = (PodKey, String)>, now: Millis, until: Millis) {
        let mut m = self.holds.lock().unwrap_or_else(PoisonError::into_inner);
        m.retain(|_, (_, end)| *end > now);
        for (pod, node) in pods {
            m.insert(pod, (node, until));
        }
    }

    /// The holds still running at `now`: each pod and its node.
    pub fn held(&self, now: Millis) -> Vec<(PodKey, String)> {
        let m = self.holds.lock().unwrap_or_else(PoisonError::into_inner);
        m.iter().filter(|(_, (_, end))| *end > now).map(|(p, (n, _))| (p.clone(), n.clone())).collect()
    }

    /// The nominations still running at `now`, by node name.
    pub fn active(&self, now: Millis) -> BTreeMap<String, Millis> {
        let m = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        m.iter().filter(|(_, end)| **end > now).map(|(n, end)| (n.clone(), *end)).collect()
    }
}

/// Karpenter's nomination window: twice the batch window's longest wait, at least 10 s (20 s
/// with the default 10 s batch). Karpenter's provisioner nominates again at every batch while
/// the pods are pending; the Router sees a pending pod again only at the feed's `resend` (30 s
/// by default), so the window also covers a resend and its batch (40 s by default).
pub fn window(batch_max: Millis, resend: Millis) -> Millis {
    batch_max.saturating_mul(2).max(10_000).max(resend.saturating_add(batch_max))
}

/// The nomination (and hold) window of the plane's settings: [`window`] of its batch window's
/// longest wait and its feed's resend.
pub fn window_of(cfg: &crate::config::Config) -> Millis {
    window(cfg.window.max, dovetail_core::clock::to_millis(cfg.feed.resend))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_nomination_runs_until_its_end_and_a_later_one_extends_it() {
        let n = Nominations::default();
        n.nominate(["a", "b"], 0, 20_000);
        n.nominate(["b"], 5_000, 25_000);
        let want: Vec<(String, Millis)> = vec![("a".into(), 20_000), ("b".into(), 25_000)];
        assert_eq!(n.active(19_999).into_iter().collect::<Vec<_>>(), want);
        assert_eq!(n.active(20_000).keys().collect::<Vec<_>>(), ["b"]);
        // Ended ones are dropped at the next write.
        n.nominate(["c"], 30_000, 50_000);
        assert_eq!(n.inner.lock().map(|m| m.len()).unwrap_or_default(), 1);
        assert_eq!(window(10_000, 0), 20_000, "Karpenter's");
        assert_eq!(window(1_000, 0), 10_000);
        assert_eq!(window(10_000, 30_000), 40_000, "a resend and its batch");
    }

    #[test]
    fn a_hold_runs_until_its_end_and_the_last_plan_wins() {
        let n = Nominations::default();
        let (a, b) = (PodKey::new("ns", "a"), PodKey::new("ns", "b"));
        n.hold([(a.clone(), "claim-1".to_string()), (b.clone(), "claim-1".to_string())], 0, 20_000);
        n.hold([(b.clone(), "node-2".to_string())], 5_000, 25_000);
        let mut held = n.held(10_000);
        held.sort();
        assert_eq!(held, vec![(a.clone(), "claim-1".to_string()), (b.clone(), "node-2".to_string())]);
        assert_eq!(n.held(20_000), vec![(b, "node-2".to_string())]);
        assert!(n.held(25_000).is_empty());
        n.hold([], 30_000, 50_000);
        assert_eq!(n.holds.lock().map(|m| m.len()).unwrap_or(usize::MAX), 0, "ended holds dropped at the next write");
    }
}
