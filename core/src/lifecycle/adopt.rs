//! Claims a ledger takes over from the cluster: the NodeClaims of known pools that the ledger
//! does not know, as after a restart of a ledger that kept no log. Karpenter keeps no state
//! beside its NodeClaims; a ledger without a log rebuilds from them the same way.

use std::collections::BTreeSet;

use crate::catalog::CapacityType;
use crate::cluster::{NodeClaim, Snapshot};
use crate::labels;
use crate::ledger::{Claim, ClaimState, Millis};

/// `(zone, instance id)` of an `aws:///<zone>/<instance id>` provider id.
pub fn parse_provider_id(provider_id: &str) -> Option<(&str, &str)> {
    let rest = provider_id.strip_prefix("aws:///")?;
    let (zone, id) = rest.split_once('/')?;
    (!zone.is_empty() && !id.is_empty()).then_some((zone, id))
}

/// The state a NodeClaim shows: being deleted is `Terminating`; with an instance, as far as
/// its conditions went; without one `Reserved` (a launch of it returns the instance its tag
/// names, if the launch before the restart made one).
fn state_of(nc: &NodeClaim) -> ClaimState {
    let instance = nc.status.provider_id.as_deref().and_then(parse_provider_id).map(|(_, id)| id.to_string());
    match instance {
        _ if nc.deleting => ClaimState::Terminating { instance, batch: None, instance_gone: false },
        None => ClaimState::Reserved,
        Some(instance) if nc.status.is("Initialized") => ClaimState::Initialized { instance },
        Some(instance) if nc.status.is("Registered") => ClaimState::Registered { instance },
        Some(instance) => ClaimState::Launched { instance },
    }
}

/// What a launched NodeClaim launched as, from the labels written at launch.
fn launched_as(nc: &NodeClaim) -> Option<(String, CapacityType)> {
    nc.status.provider_id.as_ref()?;
    let instance_type = nc.spec.labels.get(labels::INSTANCE_TYPE)?;
    let capacity_type = CapacityType::parse(nc.spec.labels.get(labels::CAPACITY_TYPE)?)?;
    Some((instance_type.clone(), capacity_type))
}

/// The claims to adopt: every NodeClaim of a pool in `pools` that `known` lacks. A claim
/// holds its instance's capacity once launched, else its requests. Its price is not known
/// here (0): the spend cap counts it from its next launch.
pub fn adoptions(snapshot: &Snapshot, known: &BTreeSet<String>, pools: &BTreeSet<String>, now: Millis) -> Vec<Claim> {
    snapshot
        .nodeclaims
        .values()
        .filter(|nc| !known.contains(&nc.name) && pools.contains(&nc.spec.nodepool))
        .map(|nc| {
            let zone = nc
                .status
                .provider_id
                .as_deref()
                .and_then(parse_provider_id)
                .map(|(z, _)| z.to_string())
                .or_else(|| nc.spec.labels.get(labels::ZONE).cloned())
                .or_else(|| {
                    let r = nc.spec.requirements.get_defined(labels::ZONE)?;
                    match (r.operator(), r.values()) {
                        (crate::requirements::Operator::In, [zone]) => Some(zone.clone()),
                        _ => None,
                    }
                })
                .unwrap_or_default();
            let resources =
                if nc.status.capacity.is_empty() { nc.spec.requests.clone() } else { nc.status.capacity.clone() };
            Claim {
                id: nc.name.clone(),
                pool: nc.spec.nodepool.clone(),
                zone,
                resources,
                allocatable: nc.status.allocatable.clone(),
                price_per_hour: 0,
                launched_as: launched_as(nc),
                state: state_of(nc),
                reserved_at: now,
                changed_at: now,
                tried_at: None,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::cluster::{Condition, NodeClaimStatus};
    use crate::nodepool::NodeClaimSpec;

    fn claim(name: &str, provider: Option<&str>, conditions: &[&str], deleting: bool) -> NodeClaim {
        NodeClaim {
            name: name.into(),
            spec: NodeClaimSpec { nodepool: "default".into(), ..NodeClaimSpec::default() },
            finalizers: Vec::new(),
            deleting,
            status: NodeClaimStatus {
                provider_id: provider.map(String::from),
                conditions: conditions.iter().map(|c| Condition::met(c)).collect(),
                ..NodeClaimStatus::default()
            },
            resource_version: 1,
            created: None,
        }
    }

    #[test]
    fn claims_are_adopted_in_the_state_the_cluster_shows() {
        let mut snap = Snapshot::default();
        for nc in [
            claim("a", None, &[], false),
            claim("b", Some("aws:///us-east-1a/i-1"), &["Launched"], false),
            claim("c", Some("aws:///us-east-1b/i-2"), &["Launched", "Registered", "Initialized"], false),
            claim("d", Some("aws:///us-east-1c/i-3"), &["Launched"], true),
            claim("known", None, &[], false),
        ] {
            snap.nodeclaims.insert(nc.name.clone(), Arc::new(nc));
        }
        let mut other = claim("other-pool", None, &[], false);
        other.spec.nodepool = "gone".into();
        snap.nodeclaims.insert(other.name.clone(), Arc::new(other));
        let known = BTreeSet::from(["known".to_string()]);
        let pools = BTreeSet::from(["default".to_string()]);
        let got: Vec<(String, String, ClaimState)> =
            adoptions(&snap, &known, &pools, 5).into_iter().map(|c| (c.id, c.zone, c.state)).collect();
        assert_eq!(
            got,
            vec![
                ("a".into(), "".into(), ClaimState::Reserved),
                ("b".into(), "us-east-1a".into(), ClaimState::Launched { instance: "i-1".into() }),
                ("c".into(), "us-east-1b".into(), ClaimState::Initialized { instance: "i-2".into() }),
                (
                    "d".into(),
                    "us-east-1c".into(),
                    ClaimState::Terminating { instance: Some("i-3".into()), batch: None, instance_gone: false }
                ),
            ]
        );
    }

    #[test]
    fn what_a_claim_launched_as_is_taken_from_its_labels_once_it_has_an_instance() {
        let mut launched = claim("b", Some("aws:///us-east-1a/i-1"), &["Launched"], false);
        launched.spec.labels.insert(labels::INSTANCE_TYPE.into(), "m5.large".into());
        launched.spec.labels.insert(labels::CAPACITY_TYPE.into(), "spot".into());
        assert_eq!(launched_as(&launched), Some(("m5.large".to_string(), CapacityType::Spot)));
        let mut unlaunched = launched.clone();
        unlaunched.status.provider_id = None;
        assert_eq!(launched_as(&unlaunched), None);
        launched.spec.labels.insert(labels::CAPACITY_TYPE.into(), "sometimes".into());
        assert_eq!(launched_as(&launched), None, "a capacity type not known is not guessed");
    }

    #[test]
    fn provider_ids_parse_only_in_the_aws_form() {
        assert_eq!(parse_provider_id("aws:///us-east-1a/i-0abc"), Some(("us-east-1a", "i-0abc")));
        assert_eq!(parse_provider_id("kind://docker/x"), None);
        assert_eq!(parse_provider_id("aws:///us-east-1a/"), None);
    }
}
