//! Garbage collection's entry on the wire (added after version 1's first release).

use dovetail_core::ledger::Collectable;
use serde::{Deserialize, Serialize};

/// An instance of [`dovetail_core::ledger::Command::Collect`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CollectableV1 {
    pub id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub claim: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub batch: Option<String>,
}

impl From<&Collectable> for CollectableV1 {
    fn from(c: &Collectable) -> Self {
        CollectableV1 { id: c.id.clone(), claim: c.claim.clone(), batch: c.batch.clone() }
    }
}

impl CollectableV1 {
    pub fn to_core(&self) -> Collectable {
        Collectable { id: self.id.clone(), claim: self.claim.clone(), batch: self.batch.clone() }
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{as_written_before_tried_at, entries, fixture};
    use super::super::{WireEntry, WireOutcome, WireState};
    use super::*;
    use dovetail_core::ledger::{Command, Entry, Outcome, State};

    const COLLECT_V1: &str = include_str!("../../tests/fixtures/ledger-v1-collect.json");

    #[test]
    fn garbage_collection_entries_decode_to_what_they_were() {
        let mut entries = entries();
        let c = |id: &str, claim: Option<&str>, batch: Option<&str>| Collectable {
            id: id.into(),
            claim: claim.map(str::to_string),
            batch: batch.map(str::to_string),
        };
        entries.push(Entry {
            term: 2,
            at: 3_000,
            command: Command::Collect {
                instances: vec![c("i-by-hand", None, None), c("i-leaked", Some("gone"), Some("b-gone"))],
            },
        });
        let mut state = State::default();
        let outcomes: Vec<Outcome> = entries.iter().map(|e| state.apply(e)).collect();
        assert!(matches!(outcomes.last(), Some(Outcome::Advanced { rejected }) if rejected.is_empty()), "{outcomes:?}");

        let wire: (Vec<(WireEntry, WireOutcome)>, WireState) = (
            entries.iter().zip(&outcomes).map(|(e, o)| (WireEntry::encode(e), WireOutcome::encode(o))).collect(),
            WireState::encode(state.clone()),
        );
        let current = serde_json::to_string_pretty(&wire).expect("encoded");
        let (old, old_state): (Vec<(WireEntry, WireOutcome)>, WireState) =
            serde_json::from_str(&fixture("ledger-v1-collect.json", COLLECT_V1, &current)).expect("entries decode");
        let decoded: Vec<Entry> = old.iter().map(|(e, _)| e.decode().expect("an entry")).collect();
        assert_eq!(decoded, entries);
        assert_eq!(old.iter().map(|(_, o)| o.decode()).collect::<Vec<_>>(), outcomes);
        assert_eq!(old_state.decode().expect("a state"), as_written_before_tried_at(&state));
    }
}
