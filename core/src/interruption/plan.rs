//! What the plane does about parsed events: the [`Notice`]s a batch of messages records in
//! the ledger, and when an interrupted claim starts draining.
//!
//! Karpenter deletes an interrupted node's NodeClaim at once and provisions for its pods once
//! they are pending again. Here the node is tainted at once, its pods' capacity is launched
//! on the warning (sized by simulating them, in the plane), and the drain waits for that
//! capacity to be ready, but never past `deadline - drain_lead`, so it ends before EC2 takes
//! the instance.

use std::collections::BTreeMap;

use crate::catalog::CapacityType;
use crate::ledger::{Claim, ClaimState, Interruption, Millis, Notice, Offering, State};

use super::{Event, Kind};

/// What a rebalance recommendation does.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Rebalance {
    /// An event on the NodeClaim only (Karpenter's behaviour).
    #[default]
    Event,
    /// The node is replaced and drained as for a scheduled change.
    Replace,
}

impl Rebalance {
    pub fn parse(s: &str) -> Option<Rebalance> {
        match s {
            "event" | "Event" => Some(Rebalance::Event),
            "replace" | "Replace" => Some(Rebalance::Replace),
            _ => None,
        }
    }
}

/// The interruption settings the planner reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Settings {
    pub rebalance: Rebalance,
    /// EC2's notice before it takes a spot instance (or a capacity reservation's) back.
    pub spot_notice: Millis,
    /// How long a spot interruption marks its offering unavailable (Karpenter's 3 minutes).
    pub unavailable_for: Millis,
    /// How long before the deadline the drain starts whether or not the replacements are
    /// ready: pod grace periods are shortened to end by the deadline, so this is what the
    /// pods get to stop.
    pub drain_lead: Millis,
    /// How long a drain with no deadline (a scheduled change) waits for its replacements.
    pub replace_timeout: Millis,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            rebalance: Rebalance::Event,
            spot_notice: 120_000,
            unavailable_for: 180_000,
            drain_lead: 45_000,
            replace_timeout: 600_000,
        }
    }
}

/// A deadline that is not EC2's: the drain goes as any disruption's, bounded by the
/// NodeClaim's terminationGracePeriod.
pub const NO_DEADLINE: Millis = Millis::MAX;

/// The notices of a batch of events, each received at its `Millis`: one per instance (the
/// most urgent when a batch names an instance twice), resolved to the claim whose instance
/// it is (`claim_of`), in the order the instances first appear. [`Kind::NoOp`] events give
/// none.
pub fn notices<'c>(
    events: &[(Event, Millis)],
    claim_of: impl Fn(&str) -> Option<&'c Claim>,
    settings: &Settings,
) -> Vec<Notice> {
    let mut order: Vec<String> = Vec::new();
    let mut by_instance: BTreeMap<String, Notice> = BTreeMap::new();
    for (event, received) in events {
        if event.kind == Kind::NoOp {
            continue;
        }
        let at = event.time.unwrap_or(*received);
        for instance in &event.instances {
            let claim = claim_of(instance);
            let notice = notice(event.kind, instance, claim, at, settings);
            match by_instance.get_mut(instance) {
                Some(n) => {
                    if (notice.acts && !n.acts) || (notice.acts == n.acts && notice.deadline < n.deadline) {
                        // A spot warning's offering mark stays whatever comes with it.
                        let unavailable = n.unavailable.take();
                        *n = notice;
                        n.unavailable = n.unavailable.take().or(unavailable);
                    } else if n.unavailable.is_none() {
                        n.unavailable = notice.unavailable;
                    }
                }
                None => {
                    order.push(instance.clone());
                    by_instance.insert(instance.clone(), notice);
                }
            }
        }
    }
    order.into_iter().filter_map(|i| by_instance.remove(&i)).collect()
}

fn notice(kind: Kind, instance: &str, claim: Option<&Claim>, at: Millis, s: &Settings) -> Notice {
    let deadline = match kind {
        Kind::SpotInterrupted | Kind::CapacityReservationInterrupted => at.saturating_add(s.spot_notice),
        Kind::InstanceStopped | Kind::InstanceTerminated => at,
        Kind::ScheduledChange | Kind::RebalanceRecommendation | Kind::NoOp => NO_DEADLINE,
    };
    let acts = match kind {
        Kind::RebalanceRecommendation => s.rebalance == Rebalance::Replace,
        Kind::NoOp => false,
        _ => true,
    };
    // A spot warning says EC2 wants that capacity back: the offering is not offered to new
    // claims for a while (Karpenter marks it in its ICE cache).
    let unavailable = match (kind, claim.and_then(|c| c.launched_as.as_ref())) {
        (Kind::SpotInterrupted, Some((instance_type, CapacityType::Spot))) => claim.map(|c| {
            let o = Offering {
                instance_type: instance_type.clone(),
                zone: c.zone.clone(),
                capacity_type: CapacityType::Spot,
            };
            (o, at.saturating_add(s.unavailable_for))
        }),
        _ => None,
    };
    Notice { instance: instance.to_string(), kind, claim: claim.map(|c| c.id.clone()), deadline, acts, unavailable }
}

/// Whether an interrupted claim starts draining now: its replacements are ready (or none was
/// needed), the deadline is `drain_lead` away, or a drain with no deadline waited
/// `replace_timeout` for them. `ready` says whether every replacement granted for it is
/// initialized (or gone: a failed one is waited for no longer).
pub fn drain_now(record: &Interruption, ready: bool, now: Millis, s: &Settings) -> bool {
    if !record.acts {
        return false;
    }
    if record.deadline != NO_DEADLINE && now.saturating_add(s.drain_lead) >= record.deadline {
        return true;
    }
    if record.deadline == NO_DEADLINE && now >= record.at.saturating_add(s.replace_timeout) {
        return true;
    }
    record.sized && ready
}

/// The acting interruptions of a pool's live claims, by claim, each with whether every
/// replacement granted for it is ready (initialized, or gone: a failed one is waited for no
/// longer): what the lifecycle drains by.
pub fn interrupted_claims(state: &State, pool: &str) -> BTreeMap<String, (Interruption, bool)> {
    let mut out = BTreeMap::new();
    for c in state.interrupted_in(pool) {
        let Some(r) = state.interruption_of(&c.id).filter(|r| r.acts) else { continue };
        let ready = r
            .replacements
            .iter()
            .all(|id| state.claim(id).is_none_or(|c| matches!(c.state, ClaimState::Initialized { .. })));
        out.insert(c.id.clone(), (r.clone(), ready));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::ResourceList;

    fn claim(id: &str, instance: &str, ct: CapacityType) -> Claim {
        Claim {
            id: id.into(),
            pool: "p".into(),
            zone: "us-east-1a".into(),
            resources: ResourceList::new(),
            allocatable: ResourceList::new(),
            price_per_hour: 0,
            launched_as: Some(("m5.large".into(), ct)),
            state: ClaimState::Initialized { instance: instance.into() },
            reserved_at: 0,
            changed_at: 0,
            tried_at: None,
        }
    }

    fn event(kind: Kind, instances: &[&str], time: Option<Millis>) -> Event {
        Event {
            kind,
            id: "e".into(),
            time,
            instances: instances.iter().map(|i| i.to_string()).collect(),
            action: None,
            note: String::new(),
        }
    }

    #[test]
    fn a_spot_warning_gives_ec2s_deadline_and_marks_its_offering() {
        let claims = [claim("a", "i-a", CapacityType::Spot), claim("b", "i-b", CapacityType::OnDemand)];
        let claim_of = |i: &str| claims.iter().find(|c| c.state.instance() == Some(i));
        let s = Settings::default();
        let events = [
            (event(Kind::SpotInterrupted, &["i-a"], Some(1_000)), 5_000),
            (event(Kind::InstanceStopped, &["i-b"], None), 7_000),
            (event(Kind::ScheduledChange, &["i-x"], Some(2_000)), 7_000),
            (event(Kind::NoOp, &[], None), 7_000),
        ];
        let n = notices(&events, claim_of, &s);
        assert_eq!(n.len(), 3);
        assert_eq!((n[0].deadline, n[0].claim.as_deref(), n[0].acts), (121_000, Some("a"), true));
        let (o, until) = n[0].unavailable.clone().expect("spot offering marked");
        assert_eq!((o.instance_type.as_str(), o.capacity_type, until), ("m5.large", CapacityType::Spot, 181_000));
        assert_eq!((n[1].deadline, n[1].unavailable.is_none()), (7_000, true), "no time: counted from receipt");
        assert_eq!((n[2].deadline, n[2].claim.as_deref()), (NO_DEADLINE, None));
    }

    #[test]
    fn a_batch_naming_an_instance_twice_keeps_the_most_urgent() {
        let claims = [claim("a", "i-a", CapacityType::Spot)];
        let claim_of = |i: &str| claims.iter().find(|c| c.state.instance() == Some(i));
        let s = Settings::default();
        let events = [
            (event(Kind::RebalanceRecommendation, &["i-a"], Some(0)), 0),
            (event(Kind::SpotInterrupted, &["i-a"], Some(1_000)), 1_000),
            (event(Kind::InstanceTerminated, &["i-a"], Some(50_000)), 50_000),
            (event(Kind::SpotInterrupted, &["i-a"], Some(1_000)), 60_000),
        ];
        let n = notices(&events, claim_of, &s);
        assert_eq!(n.len(), 1);
        assert_eq!((n[0].kind, n[0].deadline), (Kind::InstanceTerminated, 50_000));
        assert!(n[0].unavailable.is_some(), "the spot warning's offering mark kept through the merge");
        let only = notices(&events[..1], claim_of, &s);
        assert!(!only[0].acts, "a rebalance recommendation is an event by default");
        let replace = Settings { rebalance: Rebalance::Replace, ..s };
        assert!(notices(&events[..1], claim_of, &replace)[0].acts);
    }

    #[test]
    fn the_drain_waits_for_replacements_but_not_past_the_lead() {
        let s = Settings::default();
        let spot = Interruption {
            kind: Kind::SpotInterrupted,
            claim: Some("a".into()),
            acts: true,
            at: 0,
            deadline: 120_000,
            sized: true,
            replacements: vec!["r".into()],
        };
        assert!(!drain_now(&spot, false, 10_000, &s), "replacements not ready, deadline far");
        assert!(drain_now(&spot, true, 10_000, &s), "ready");
        assert!(drain_now(&spot, false, 75_000, &s), "the lead reached");
        let not_sized = Interruption { sized: false, ..spot.clone() };
        assert!(!drain_now(&not_sized, true, 10_000, &s), "not sized yet: nothing is known ready");
        let scheduled = Interruption { deadline: NO_DEADLINE, kind: Kind::ScheduledChange, ..spot.clone() };
        assert!(!drain_now(&scheduled, false, 599_999, &s) && drain_now(&scheduled, false, 600_000, &s));
        let event_only = Interruption { acts: false, ..spot };
        assert!(!drain_now(&event_only, true, 200_000, &s));
    }
}
