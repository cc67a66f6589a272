//! Which instances each claim had over a run: the check that no claim is launched twice.

use std::collections::{BTreeMap, BTreeSet, HashSet};

use dovetail_core::ledger::Millis;

/// Every instance the cloud had for each claim, terminated ones included. A claim is its name
/// and the moment the ledger reserved it: names are five random characters, so a later claim
/// may take the name of one long gone (the ledger refuses only a live duplicate), and that is
/// a second claim, not a second launch.
#[derive(Debug, Default)]
pub struct Launches {
    /// By (claim, reserved at); `None` when the ledger did not hold the claim when it was seen.
    by_claim: BTreeMap<(String, Option<Millis>), BTreeSet<String>>,
    /// The instances noted already.
    seen: HashSet<String>,
}

impl Launches {
    /// Whether this instance was noted already.
    pub fn has(&self, instance: &str) -> bool {
        self.seen.contains(instance)
    }

    /// Notes `instance` as made for the claim `claim` reserved at `reserved_at` (`None`: the
    /// ledger did not hold a claim of the name when the instance was seen).
    pub fn note(&mut self, claim: &str, reserved_at: Option<Millis>, instance: &str) {
        if self.seen.insert(instance.to_string()) {
            self.by_claim.entry((claim.to_string(), reserved_at)).or_default().insert(instance.to_string());
        }
    }

    /// The claims with more than one instance, each with its instances.
    pub fn twice(&self) -> impl Iterator<Item = String> + '_ {
        self.by_claim.iter().filter(|((_, at), ids)| at.is_some() && ids.len() > 1).map(|((claim, at), ids)| {
            let ids: Vec<&str> = ids.iter().map(String::as_str).collect();
            format!("{claim} (reserved at {} ms): {}", at.unwrap_or_default(), ids.join(", "))
        })
    }

    /// How many names served more than one claim.
    pub fn names_reused(&self) -> usize {
        let mut lives: BTreeMap<&str, usize> = BTreeMap::new();
        for (claim, _) in self.by_claim.keys().filter(|(_, at)| at.is_some()) {
            *lives.entry(claim.as_str()).or_default() += 1;
        }
        lives.values().filter(|n| **n > 1).count()
    }

    /// The instances whose claim the ledger did not hold when they were seen: neither a
    /// claim's second launch nor a name's new claim can be told for those, so they are
    /// counted apart (on virtual time the ledger holds every launched claim when the world
    /// is looked at; on the wall clock a claim may be gone by then).
    pub fn unattributed(&self) -> usize {
        self.by_claim.iter().filter(|((_, at), _)| at.is_none()).map(|(_, ids)| ids.len()).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_name_taken_again_by_a_later_claim_is_not_a_claim_launched_twice() {
        let mut l = Launches::default();
        l.note("spot-bcdfg", Some(1_000), "i-1");
        l.note("spot-bcdfg", Some(1_000), "i-1");
        // Hours later, the name drawn again for a new claim, after the first one was gone.
        l.note("spot-bcdfg", Some(9_000_000), "i-2");
        assert_eq!(l.twice().count(), 0);
        assert_eq!(l.names_reused(), 1);
        assert!(l.has("i-1") && l.has("i-2") && !l.has("i-3"));
    }

    #[test]
    fn a_claim_with_a_second_instance_is_launched_twice_and_named() {
        let mut l = Launches::default();
        l.note("spot-bcdfg", Some(1_000), "i-1");
        l.note("spot-bcdfg", Some(1_000), "i-2");
        l.note("od-hjklm", Some(2_000), "i-3");
        assert_eq!(l.twice().collect::<Vec<_>>(), vec!["spot-bcdfg (reserved at 1000 ms): i-1, i-2".to_string()]);
        assert_eq!(l.names_reused(), 0);
        assert_eq!(l.unattributed(), 0);
    }

    #[test]
    fn an_instance_whose_claim_the_ledger_did_not_hold_is_counted_apart_not_as_a_second_launch() {
        let mut l = Launches::default();
        l.note("spot-bcdfg", Some(1_000), "i-1");
        l.note("spot-bcdfg", None, "i-2");
        l.note("spot-bcdfg", None, "i-3");
        assert_eq!(l.twice().count(), 0);
        assert_eq!(l.names_reused(), 0);
        assert_eq!(l.unattributed(), 2);
    }
}
