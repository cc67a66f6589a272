//! Karpenter's nominations: the nodes (and in-flight NodeClaims, by name) the Router left
//! pending pods to, each until its window ends. Disruption does not take a nominated node:
//! the pods planned onto it are on their way there (kube-scheduler binds them once it is
//! ready), and removing it would only send them back pending.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, PoisonError};

use dovetail_core::ledger::Millis;

/// The nominations, shared by the Router (which nominates) and the NodePool actors (which
/// read them when they plan disruption). Entries past their end are dropped on each write, so
/// it holds at most the nodes nominated within one window.
#[derive(Clone, Debug, Default)]
pub struct Nominations {
    inner: Arc<Mutex<HashMap<String, Millis>>>,
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
}
