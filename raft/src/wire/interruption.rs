//! Interruption notices and records on the wire (added after version 1's first release:
//! a snapshot without them decodes as having none).

use std::collections::BTreeMap;

use dovetail_core::interruption::Kind;
use dovetail_core::ledger::{Interruption, Millis, Notice, Replacement};
use serde::{Deserialize, Serialize};

use super::{ClaimRequestV1, OfferingV1, WireError, claim_request, request};

fn kind(s: &str) -> Result<Kind, WireError> {
    Kind::parse(s).ok_or_else(|| WireError::InterruptionKind(s.to_string()))
}

/// A notice of [`dovetail_core::ledger::Command::Interrupt`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct NoticeV1 {
    pub instance: String,
    pub kind: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub claim: Option<String>,
    pub deadline: Millis,
    pub acts: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unavailable: Option<(OfferingV1, Millis)>,
}

/// A replacement of [`dovetail_core::ledger::Command::ReplaceInterrupted`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ReplacementV1 {
    pub pool: String,
    pub claim: ClaimRequestV1,
    pub serves: Vec<String>,
}

impl From<&Replacement> for ReplacementV1 {
    fn from(r: &Replacement) -> Self {
        ReplacementV1 { pool: r.pool.clone(), claim: request(&r.claim), serves: r.serves.clone() }
    }
}

impl ReplacementV1 {
    pub fn to_core(&self) -> Replacement {
        Replacement { pool: self.pool.clone(), claim: claim_request(&self.claim), serves: self.serves.clone() }
    }
}

impl From<&Notice> for NoticeV1 {
    fn from(n: &Notice) -> Self {
        NoticeV1 {
            instance: n.instance.clone(),
            kind: n.kind.as_str().to_string(),
            claim: n.claim.clone(),
            deadline: n.deadline,
            acts: n.acts,
            unavailable: n.unavailable.as_ref().map(|(o, until)| (OfferingV1::from(o), *until)),
        }
    }
}

impl NoticeV1 {
    pub fn to_core(&self) -> Result<Notice, WireError> {
        Ok(Notice {
            instance: self.instance.clone(),
            kind: kind(&self.kind)?,
            claim: self.claim.clone(),
            deadline: self.deadline,
            acts: self.acts,
            unavailable: match &self.unavailable {
                Some((o, until)) => Some((o.to_core()?, *until)),
                None => None,
            },
        })
    }
}

/// An interruption record of the state.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct InterruptionV1 {
    pub kind: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub claim: Option<String>,
    pub acts: bool,
    pub at: Millis,
    pub deadline: Millis,
    pub sized: bool,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub replacements: Vec<String>,
}

pub(super) fn records(r: &BTreeMap<String, Interruption>) -> BTreeMap<String, InterruptionV1> {
    r.iter()
        .map(|(instance, r)| {
            let v = InterruptionV1 {
                kind: r.kind.as_str().to_string(),
                claim: r.claim.clone(),
                acts: r.acts,
                at: r.at,
                deadline: r.deadline,
                sized: r.sized,
                replacements: r.replacements.clone(),
            };
            (instance.clone(), v)
        })
        .collect()
}

pub(super) fn to_records(r: &BTreeMap<String, InterruptionV1>) -> Result<BTreeMap<String, Interruption>, WireError> {
    r.iter()
        .map(|(instance, r)| {
            let v = Interruption {
                kind: kind(&r.kind)?,
                claim: r.claim.clone(),
                acts: r.acts,
                at: r.at,
                deadline: r.deadline,
                sized: r.sized,
                replacements: r.replacements.clone(),
            };
            Ok((instance.clone(), v))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::super::tests::{as_written_before_tried_at, entries, fixture, m5_large};
    use super::super::{WireEntry, WireOutcome, WireState};
    use super::*;
    use dovetail_core::catalog::CapacityType;
    use dovetail_core::ledger::{ClaimRequest, Command, Denial, Entry, Offering, Outcome, State};

    const INTERRUPTION_V1: &str = include_str!("../../tests/fixtures/ledger-v1-interruption.json");

    #[test]
    fn interruption_notices_and_records_decode_to_what_they_were() {
        let mut entries = entries();
        let notice = |instance: &str, claim: Option<&str>, kind| Notice {
            instance: instance.into(),
            kind,
            claim: claim.map(str::to_string),
            deadline: 122_000,
            acts: kind != Kind::RebalanceRecommendation,
            unavailable: (kind == Kind::SpotInterrupted).then(|| {
                let o = Offering {
                    instance_type: "m5.large".into(),
                    zone: "us-east-1a".into(),
                    capacity_type: CapacityType::Spot,
                };
                (o, 182_000)
            }),
        };
        let replacement = |id: &str| Replacement {
            pool: "default".into(),
            claim: ClaimRequest { id: id.into(), zone: "us-east-1b".into(), resources: m5_large(), price_per_hour: 9 },
            serves: vec!["i-0a".into()],
        };
        let e = |at, command| Entry { term: 2, at, command };
        entries.extend([
            e(
                2_000,
                Command::Interrupt {
                    notices: vec![
                        notice("i-0a", Some("a"), Kind::SpotInterrupted),
                        notice("i-0r4", Some("r4"), Kind::RebalanceRecommendation),
                        notice("i-elsewhere", None, Kind::InstanceTerminated),
                    ],
                },
            ),
            e(2_001, Command::Interrupt { notices: vec![notice("i-0a", Some("a"), Kind::SpotInterrupted)] }),
            e(
                2_002,
                Command::ReplaceInterrupted {
                    instances: vec!["i-0a".into(), "i-0r4".into()],
                    replacements: vec![replacement("int-1")],
                },
            ),
            e(
                2_003,
                Command::ReplaceInterrupted {
                    instances: vec!["i-0a".into()],
                    replacements: vec![replacement("int-2")],
                },
            ),
        ]);
        let mut state = State::default();
        let outcomes: Vec<Outcome> = entries.iter().map(|e| state.apply(e)).collect();
        let n = outcomes.len();
        assert!(matches!(&outcomes[n - 4], Outcome::Interrupted { recorded, .. } if recorded.len() == 3));
        assert!(
            matches!(&outcomes[n - 3], Outcome::Interrupted { duplicates, .. } if duplicates == &["i-0a".to_string()])
        );
        assert!(matches!(&outcomes[n - 2], Outcome::Reserved { granted, .. } if granted == &["int-1".to_string()]));
        assert!(
            matches!(&outcomes[n - 1], Outcome::Reserved { denied, .. } if denied == &[("int-2".to_string(), Denial::Unneeded)])
        );
        assert!(state.claim("int-1").is_some() && state.interruptions().len() == 3);

        let wire: (Vec<(WireEntry, WireOutcome)>, WireState) = (
            entries.iter().zip(&outcomes).map(|(e, o)| (WireEntry::encode(e), WireOutcome::encode(o))).collect(),
            WireState::encode(state.clone()),
        );
        let current = serde_json::to_string_pretty(&wire).expect("encoded");
        let (old, old_state): (Vec<(WireEntry, WireOutcome)>, WireState) =
            serde_json::from_str(&fixture("ledger-v1-interruption.json", INTERRUPTION_V1, &current))
                .expect("interruption entries decode");
        let decoded: Vec<Entry> = old.iter().map(|(e, _)| e.decode().expect("an entry")).collect();
        assert_eq!(decoded, entries);
        assert_eq!(old.iter().map(|(_, o)| o.decode()).collect::<Vec<_>>(), outcomes);
        assert_eq!(old_state.decode().expect("a state"), as_written_before_tried_at(&state));
        let bad = NoticeV1 { kind: "meteor".into(), ..NoticeV1::from(&notice("i-1", None, Kind::InstanceStopped)) };
        assert!(matches!(bad.to_core(), Err(WireError::InterruptionKind(k)) if k == "meteor"));
    }
}
