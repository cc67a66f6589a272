//! [`super::Command::Interrupt`]: interruption notices recorded once per instance, spot
//! offerings marked unavailable; [`super::Command::ReplaceInterrupted`]: their pods'
//! replacements reserved.
//!
//! The record of an instance is what makes at-least-once delivery harmless: a redelivered
//! message, or the same event on two queues, finds it and changes nothing. Records are kept
//! for [`INTERRUPTION_MEMORY`] after they were made (longer than any queue redelivers an
//! unhandled message: Karpenter's queue keeps messages 300 s), then forgotten in time order.

use std::collections::{BTreeMap, BTreeSet};

use super::{
    Claim, ClaimRequest, ClaimState, Denial, Interruption, Millis, Notice, Outcome, Replacement, State, denial,
};
use crate::resources::{ResourceList, ResourceName};

/// How long an instance's interruption record is kept (1 h).
pub const INTERRUPTION_MEMORY: Millis = 3_600_000;

/// Indexes derived from the claims and the interruption records (rebuilt when a snapshot is
/// restored).
#[derive(Clone, Debug, Default, PartialEq)]
pub(super) struct Index {
    /// Instance -> the claim it is the instance of: how a message's instance finds its claim.
    pub(super) by_instance: BTreeMap<String, String>,
    /// (recorded at, instance): the records in the order they are forgotten.
    by_time: BTreeSet<(Millis, String)>,
    /// Per pool, the live claims interrupted (acting): their holdings go whatever is decided,
    /// so replacements are checked without them.
    interrupted: BTreeMap<String, BTreeSet<String>>,
}

impl Index {
    pub(super) fn build(records: &BTreeMap<String, Interruption>, claims: &BTreeMap<String, Claim>) -> Index {
        let mut index = Index::default();
        for c in claims.values() {
            if let Some(instance) = c.state.instance() {
                index.by_instance.insert(instance.to_string(), c.id.clone());
            }
        }
        for (instance, r) in records {
            index.by_time.insert((r.at, instance.clone()));
            if let Some(claim) = r.claim.as_deref().filter(|_| r.acts)
                && let Some(c) = claims.get(claim)
            {
                index.interrupted.entry(c.pool.clone()).or_default().insert(claim.to_string());
            }
        }
        index
    }

    /// A claim that is gone, or whose record is forgotten, no longer counts as interrupted.
    pub(super) fn forget_claim(&mut self, pool: &str, claim: &str) {
        if let Some(set) = self.interrupted.get_mut(pool) {
            set.remove(claim);
            if set.is_empty() {
                self.interrupted.remove(pool);
            }
        }
    }
}

impl State {
    /// The claim whose instance this is, as far as the ledger knows (launched and not gone).
    pub fn claim_of_instance(&self, instance: &str) -> Option<&Claim> {
        self.index.by_instance.get(instance).and_then(|id| self.claims.get(id))
    }

    /// The interruption recorded for an instance.
    pub fn interruption(&self, instance: &str) -> Option<&Interruption> {
        self.interruptions.get(instance)
    }

    /// The interruption of a claim's instance, if one was recorded.
    pub fn interruption_of(&self, claim: &str) -> Option<&Interruption> {
        let instance = self.claims.get(claim)?.state.instance()?;
        self.interruptions.get(instance).filter(|r| r.claim.as_deref() == Some(claim))
    }

    /// The live claims of `pool` interrupted by an acting notice (the index the ledger keeps
    /// for replacements: no scan of the pool's claims).
    pub fn interrupted_in<'a>(&'a self, pool: &str) -> impl Iterator<Item = &'a Claim> + 'a {
        self.index.interrupted.get(pool).into_iter().flatten().filter_map(|id| self.claims.get(id))
    }

    /// Every interruption recorded, by instance.
    pub fn interruptions(&self) -> &BTreeMap<String, Interruption> {
        &self.interruptions
    }

    pub(super) fn interrupt(&mut self, at: Millis, notices: &[Notice]) -> Outcome {
        self.forget_interruptions(at);
        let (mut recorded, mut duplicates) = (Vec::new(), Vec::new());
        for n in notices {
            if let Some((offering, until)) = &n.unavailable
                && *until > at
            {
                let e = self.unavailable.entry(offering.clone()).or_insert(*until);
                *e = (*e).max(*until);
            }
            let known = self.interruptions.get(&n.instance);
            let upgrade = known.is_some_and(|r| n.acts && !r.acts);
            if let Some(r) = known
                && !upgrade
            {
                if n.deadline < r.deadline {
                    if let Some(r) = self.interruptions.get_mut(&n.instance) {
                        r.deadline = n.deadline;
                    }
                    recorded.push(n.instance.clone());
                } else {
                    duplicates.push(n.instance.clone());
                }
                continue;
            }
            // Only a claim whose instance this is (as far as the ledger knows it) is acted on;
            // anything else is recorded so that its redeliveries are known.
            let claim = n.claim.as_deref().and_then(|c| self.claims.get(c)).filter(|c| {
                c.state.instance().is_none_or(|i| i == n.instance) && !matches!(c.state, ClaimState::Reserved)
            });
            let (claim_id, pool) = (claim.map(|c| c.id.clone()), claim.map(|c| c.pool.clone()));
            if n.acts
                && let (Some(id), Some(pool)) = (&claim_id, pool)
            {
                self.index.interrupted.entry(pool).or_default().insert(id.clone());
            }
            let deadline = known.map_or(n.deadline, |r| r.deadline.min(n.deadline));
            if let Some(old) = self.interruptions.get(&n.instance) {
                self.index.by_time.remove(&(old.at, n.instance.clone()));
            }
            self.index.by_time.insert((at, n.instance.clone()));
            let record = Interruption {
                kind: n.kind,
                claim: claim_id,
                acts: n.acts,
                at,
                deadline,
                sized: false,
                replacements: Vec::new(),
            };
            self.interruptions.insert(n.instance.clone(), record);
            recorded.push(n.instance.clone());
        }
        Outcome::Interrupted { recorded, duplicates }
    }

    pub(super) fn replace_interrupted(
        &mut self,
        at: Millis,
        instances: &[String],
        replacements: &[Replacement],
    ) -> Outcome {
        let live = |s: &State, i: &str| {
            s.interruptions
                .get(i)
                .is_some_and(|r| r.acts && !r.sized && r.claim.as_deref().is_some_and(|c| s.claims.contains_key(c)))
        };
        let sizing: BTreeSet<String> = instances.iter().filter(|i| live(self, i)).cloned().collect();
        let (mut granted, mut denied) = (Vec::new(), Vec::new());
        // Each pool's interrupted holdings, summed once for the entry (reserving replacements
        // interrupts nothing): a burst's entry has thousands of replacements.
        let mut freed: BTreeMap<String, (ResourceList, u64)> = BTreeMap::new();
        for r in replacements {
            if !r.serves.iter().any(|i| sizing.contains(i)) {
                denied.push((r.claim.id.clone(), Denial::Unneeded));
                continue;
            }
            if !freed.contains_key(&r.pool) {
                let mut held = (ResourceList::new(), 0u64);
                for c in self.interrupted_in(&r.pool) {
                    held.0.add(&c.resources);
                    held.1 = held.1.saturating_add(c.price_per_hour);
                }
                freed.insert(r.pool.clone(), held);
            }
            let pool_freed = freed.get(&r.pool).cloned().unwrap_or_default();
            match self.reserve_replacement(at, &r.pool, &r.claim, &pool_freed) {
                Ok(()) => {
                    granted.push(r.claim.id.clone());
                    for i in r.serves.iter().filter(|i| sizing.contains(*i)) {
                        if let Some(rec) = self.interruptions.get_mut(i) {
                            rec.replacements.push(r.claim.id.clone());
                        }
                    }
                }
                Err(d) => denied.push((r.claim.id.clone(), d)),
            }
        }
        for i in &sizing {
            if let Some(rec) = self.interruptions.get_mut(i) {
                rec.sized = true;
            }
        }
        Outcome::Reserved { granted, denied }
    }

    /// Reserves one replacement in `pool` against its limits and the caps, without the
    /// holdings of the pool's interrupted claims (`freed`: their resources and price).
    fn reserve_replacement(
        &mut self,
        at: Millis,
        pool: &str,
        req: &ClaimRequest,
        (freed, freed_price): &(ResourceList, u64),
    ) -> Result<(), Denial> {
        if self.claims.contains_key(&req.id) {
            return Err(Denial::DuplicateId);
        }
        let Some(p) = self.pools.get(pool) else { return Err(Denial::UnknownPool) };
        let usage = p.usage.subtracted(freed);
        let total = self.total.subtracted(freed);
        let price = self.total_price.saturating_sub(*freed_price);
        let mut resources = req.resources.clone();
        resources.set(ResourceName::Nodes, 1);
        if let Some(d) = denial((&p.limits, &usage), (&self.caps, &total, price), &resources, req.price_per_hour) {
            return Err(d);
        }
        self.insert_reserved(at, pool, req, resources);
        Ok(())
    }

    /// Forgets the records made [`INTERRUPTION_MEMORY`] or longer before `at`.
    fn forget_interruptions(&mut self, at: Millis) {
        while let Some((t, instance)) = self.index.by_time.first().cloned() {
            if t.saturating_add(INTERRUPTION_MEMORY) > at {
                break;
            }
            self.index.by_time.pop_first();
            if let Some(r) = self.interruptions.remove(&instance)
                && let Some(claim) = r.claim
                && let Some(pool) = self.claims.get(&claim).map(|c| c.pool.clone())
            {
                self.index.forget_claim(&pool, &claim);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{entry, initialized_pool, req};
    use super::*;
    use crate::catalog::CapacityType;
    use crate::interruption::Kind;
    use crate::ledger::{Command, Offering};

    fn notice(instance: &str, claim: Option<&str>, kind: Kind, deadline: Millis) -> Notice {
        Notice {
            instance: instance.into(),
            kind,
            claim: claim.map(str::to_string),
            deadline,
            acts: kind != Kind::RebalanceRecommendation,
            unavailable: None,
        }
    }

    fn interrupt(notices: Vec<Notice>) -> Command {
        Command::Interrupt { notices }
    }

    fn replace(instances: &[&str], replacements: &[(&str, &[&str])]) -> Command {
        Command::ReplaceInterrupted {
            instances: instances.iter().map(|i| i.to_string()).collect(),
            replacements: replacements
                .iter()
                .map(|(id, serves)| Replacement {
                    pool: "p".into(),
                    claim: req(id, 2, 0.1),
                    serves: serves.iter().map(|i| i.to_string()).collect(),
                })
                .collect(),
        }
    }

    fn at_limit() -> State {
        let mut s = State::default();
        initialized_pool(&mut s, "p", 4, ResourceList::from_pairs([(ResourceName::Cpu, 8_000)]));
        s
    }

    fn interrupted(o: &Outcome) -> (Vec<String>, Vec<String>) {
        match o {
            Outcome::Interrupted { recorded, duplicates } => (recorded.clone(), duplicates.clone()),
            other => panic!("not an interruption outcome: {other:?}"),
        }
    }

    fn reserved(o: &Outcome) -> (Vec<String>, Vec<(String, Denial)>) {
        match o {
            Outcome::Reserved { granted, denied } => (granted.clone(), denied.clone()),
            other => panic!("not a reservation outcome: {other:?}"),
        }
    }

    #[test]
    fn an_instance_is_recorded_once_and_a_redelivery_changes_nothing() {
        let mut s = at_limit();
        let first = notice("i-p-0", Some("p-0"), Kind::SpotInterrupted, 130_000);
        let out = s.apply(&entry(10_000, interrupt(vec![first.clone()])));
        assert_eq!(interrupted(&out), (vec!["i-p-0".to_string()], vec![]));
        let out = s.apply(&entry(10_100, replace(&["i-p-0"], &[("r-0", &["i-p-0"])])));
        assert_eq!(reserved(&out), (vec!["r-0".to_string()], vec![]), "granted though the pool is at its limit");
        let r = s.interruption_of("p-0").expect("recorded");
        assert!(r.sized && r.replacements == ["r-0".to_string()]);
        let before = s.clone().into_parts();
        let out = s.apply(&entry(11_000, interrupt(vec![first])));
        assert_eq!(interrupted(&out), (vec![], vec!["i-p-0".to_string()]));
        let out = s.apply(&entry(11_100, replace(&["i-p-0"], &[("r-0b", &["i-p-0"])])));
        assert_eq!(reserved(&out), (vec![], vec![("r-0b".to_string(), Denial::Unneeded)]), "sized already");
        let after = s.clone().into_parts();
        assert_eq!(after.claims, before.claims);
        assert_eq!(after.interruptions, before.interruptions);
    }

    #[test]
    fn a_warning_after_a_rebalance_recommendation_acts_and_an_earlier_deadline_is_kept() {
        let mut s = at_limit();
        s.apply(&entry(10_000, interrupt(vec![notice("i-p-1", Some("p-1"), Kind::RebalanceRecommendation, 900_000)])));
        assert!(s.interruption_of("p-1").is_some_and(|r| !r.acts));
        let out = s.apply(&entry(10_100, replace(&["i-p-1"], &[("r-1a", &["i-p-1"])])));
        assert_eq!(reserved(&out).1, vec![("r-1a".to_string(), Denial::Unneeded)], "a recommendation is not replaced");
        let out =
            s.apply(&entry(20_000, interrupt(vec![notice("i-p-1", Some("p-1"), Kind::SpotInterrupted, 140_000)])));
        assert_eq!(interrupted(&out).0, vec!["i-p-1".to_string()]);
        let r = s.interruption_of("p-1").expect("recorded");
        assert_eq!((r.kind, r.acts, r.deadline, r.sized), (Kind::SpotInterrupted, true, 140_000, false));
        let out =
            s.apply(&entry(30_000, interrupt(vec![notice("i-p-1", Some("p-1"), Kind::InstanceTerminated, 30_000)])));
        assert_eq!(interrupted(&out).0, vec!["i-p-1".to_string()]);
        let r = s.interruption_of("p-1").expect("recorded");
        assert_eq!((r.kind, r.deadline), (Kind::SpotInterrupted, 30_000), "only the deadline moved");
    }

    #[test]
    fn replacements_fit_the_limits_without_the_interrupted_claims_and_no_further() {
        let mut s = at_limit();
        let notices = vec![
            notice("i-p-0", Some("p-0"), Kind::SpotInterrupted, 130_000),
            notice("i-p-1", Some("p-1"), Kind::ScheduledChange, 130_000),
        ];
        s.apply(&entry(10_000, interrupt(notices)));
        let out =
            s.apply(&entry(10_100, replace(&["i-p-0", "i-p-1"], &[("r-0", &["i-p-0"]), ("r-1", &["i-p-0", "i-p-1"])])));
        assert_eq!(reserved(&out), (vec!["r-0".to_string(), "r-1".to_string()], vec![]));
        assert_eq!(s.interruption("i-p-0").map(|r| r.replacements.len()), Some(2));
        // Later, a third: its own holding comes off, the first two's still do, and a second
        // replacement for it finds the limit.
        s.apply(&entry(20_000, interrupt(vec![notice("i-p-2", Some("p-2"), Kind::InstanceStopped, 60_000)])));
        let out = s.apply(&entry(20_100, replace(&["i-p-2"], &[("r-2", &["i-p-2"]), ("r-2b", &["i-p-2"])])));
        assert_eq!(
            reserved(&out),
            (vec!["r-2".to_string()], vec![("r-2b".to_string(), Denial::PoolLimit { resource: ResourceName::Cpu })])
        );
        // Once an interrupted claim is gone, its holding is no longer set aside, and its
        // instance names no claim.
        assert_eq!(s.claim_of_instance("i-p-0").map(|c| c.id.as_str()), Some("p-0"));
        let steps = vec![
            ("p-0".to_string(), crate::ledger::Step::Terminating),
            ("p-0".to_string(), crate::ledger::Step::InstanceGone),
            ("p-0".to_string(), crate::ledger::Step::Gone),
        ];
        s.apply(&entry(30_000, Command::Advance { steps }));
        assert!(s.claim_of_instance("i-p-0").is_none());
        s.apply(&entry(30_100, interrupt(vec![notice("i-p-3", Some("p-3"), Kind::SpotInterrupted, 150_000)])));
        let out = s.apply(&entry(30_200, replace(&["i-p-3"], &[("r-3", &["i-p-3"]), ("r-3b", &["i-p-3"])])));
        assert_eq!(reserved(&out).0, vec!["r-3".to_string()]);
    }

    #[test]
    fn an_unknown_instance_is_recorded_without_replacements_and_a_spot_offering_is_marked() {
        let mut s = at_limit();
        let offering =
            Offering { instance_type: "m5.large".into(), zone: "us-east-1a".into(), capacity_type: CapacityType::Spot };
        let mut n = notice("i-stranger", None, Kind::SpotInterrupted, 130_000);
        n.unavailable = Some((offering.clone(), 190_000));
        let out = s.apply(&entry(10_000, interrupt(vec![n])));
        assert_eq!(interrupted(&out).0, vec!["i-stranger".to_string()]);
        assert_eq!(s.interruption("i-stranger").map(|r| r.claim.clone()), Some(None));
        assert!(s.is_unavailable(&offering, 100_000));
        let out = s.apply(&entry(10_100, replace(&["i-stranger"], &[("r-x", &["i-stranger"])])));
        assert_eq!(
            reserved(&out).1,
            vec![("r-x".to_string(), Denial::Unneeded)],
            "not the cluster's: nothing to replace"
        );
        // A claim named with another instance than its own is not this one's either.
        s.apply(&entry(11_000, interrupt(vec![notice("i-other", Some("p-3"), Kind::SpotInterrupted, 130_000)])));
        assert!(s.interruption_of("p-3").is_none());
    }

    #[test]
    fn records_are_forgotten_in_time_order_and_survive_a_snapshot() {
        let mut s = at_limit();
        s.apply(&entry(10_000, interrupt(vec![notice("i-a", None, Kind::InstanceStopped, 1)])));
        s.apply(&entry(20_000, interrupt(vec![notice("i-p-0", Some("p-0"), Kind::SpotInterrupted, 9)])));
        s.apply(&entry(20_000, replace(&["i-p-0"], &[("r-0", &["i-p-0"])])));
        let restored = State::from_parts(s.clone().into_parts());
        assert_eq!(restored, s, "the index is rebuilt as it was");
        s.apply(&entry(10_000 + INTERRUPTION_MEMORY, interrupt(vec![])));
        assert!(s.interruption("i-a").is_none() && s.interruption("i-p-0").is_some());
        s.apply(&entry(20_000 + INTERRUPTION_MEMORY, interrupt(vec![])));
        assert!(s.interruptions().is_empty());
        assert_eq!(State::from_parts(s.clone().into_parts()), s, "and forgotten from the index");
    }
}
