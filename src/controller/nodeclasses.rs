//! The EC2NodeClass status, as Karpenter's EC2NodeClass controller writes it: what the selector
//! terms resolved to (`subnets`, `securityGroups`, `amis`, `instanceProfile`) and a condition
//! per part (`SubnetsReady`, `SecurityGroupsReady`, `AMIsReady`, `InstanceProfileReady`) beside
//! `ValidationSucceeded`, all of them making `Ready`. Built here from what the cloud answered;
//! the pools module writes it.

use std::sync::Arc;

use dovetail_api::convert::{self, ConversionError};
use dovetail_api::crd;
use dovetail_cloud::aws::{Resolved, Unmet};
use dovetail_cluster::Condition;
use dovetail_core::labels;

/// What the cloud last answered for an EC2NodeClass.
#[derive(Clone, Debug, PartialEq)]
pub enum Resolution {
    /// Each part resolved on its own: what was found, and the parts that found nothing.
    Parts(Arc<Resolved>, Vec<Unmet>),
    /// The spec asks for what cannot work (an unknown AMI alias): the error names the field.
    Refused(ConversionError),
}

impl Resolution {
    /// Why the class's pools cannot launch, naming the spec field of the first part that
    /// failed; `None` when every part resolved.
    pub fn unready(&self, object: &str) -> Option<ConversionError> {
        match self {
            Resolution::Refused(e) => Some(e.clone()),
            Resolution::Parts(_, unmet) => unmet.first().map(|u| ConversionError {
                object: object.to_string(),
                field: field_of(u.condition).to_string(),
                message: u.message.clone(),
            }),
        }
    }
}

/// The spec field a part's condition is about.
fn field_of(condition: &str) -> &'static str {
    match condition {
        "SubnetsReady" => "spec.subnetSelectorTerms",
        "SecurityGroupsReady" => "spec.securityGroupSelectorTerms",
        "AMIsReady" => "spec.amiSelectorTerms",
        "InstanceProfileReady" => "spec.role",
        _ => "spec",
    }
}

/// The part conditions, in Karpenter's order.
const PARTS: [&str; 4] = ["SubnetsReady", "SecurityGroupsReady", "AMIsReady", "InstanceProfileReady"];

fn unmet(kind: &str, reason: &str, message: String) -> Condition {
    Condition { kind: kind.into(), status: false, reason: reason.into(), message }
}

/// The status of an EC2NodeClass: `invalid` when it fails validation, else what `resolution`
/// found (none without a cloud to ask: then only `ValidationSucceeded` and `Ready`). Each
/// condition keeps the transition time `previous` gives it while its status holds; `Ready` is
/// false with the reason and message of the first condition that is.
pub fn status(
    resolution: Option<&Resolution>,
    invalid: Option<&ConversionError>,
    previous: &[crd::Condition],
    now: &str,
) -> crd::EC2NodeClassStatus {
    let mut conditions = Vec::new();
    let mut out = crd::EC2NodeClassStatus::default();
    match (invalid, resolution) {
        (Some(_), _) | (None, None) => {}
        (None, Some(Resolution::Refused(e))) => {
            conditions.push(unmet("AMIsReady", "NodeClassNotReady", format!("{}: {}", e.field, e.message)));
        }
        (None, Some(Resolution::Parts(r, missing))) => {
            for part in PARTS {
                match missing.iter().find(|u| u.condition == part) {
                    Some(u) => conditions.push(unmet(part, u.reason, format!("{}: {}", field_of(part), u.message))),
                    None => conditions.push(Condition::met(part)),
                }
            }
            fill(&mut out, r);
        }
    }
    conditions.push(match invalid {
        Some(e) => unmet("ValidationSucceeded", "ValidationFailed", format!("{}: {}", e.field, e.message)),
        None => Condition::met("ValidationSucceeded"),
    });
    let ready = match conditions.iter().find(|c| !c.status) {
        None => Condition::met("Ready"),
        Some(c) => unmet("Ready", &c.reason, format!("{}=False: {}", c.kind, c.message)),
    };
    conditions.insert(0, ready);
    out.conditions = Some(convert::conditions_object(&conditions, previous, now));
    out
}

/// The resolved parts, as the status lists them (ids sorted, as resolved).
fn fill(out: &mut crd::EC2NodeClassStatus, r: &Resolved) {
    fn some<T>(v: Vec<T>) -> Option<Vec<T>> {
        if v.is_empty() { None } else { Some(v) }
    }
    out.subnets = some(
        r.subnets
            .iter()
            .map(|(id, zone)| crd::SubnetStatus {
                id: id.clone(),
                zone: zone.clone(),
                zone_id: r.names.zone_ids.get(id).cloned(),
            })
            .collect(),
    );
    out.security_groups = some(
        r.security_groups
            .iter()
            .map(|id| crd::SecurityGroupStatus { id: id.clone(), name: r.names.groups.get(id).cloned() })
            .collect(),
    );
    out.amis = some(
        r.images
            .iter()
            .map(|(id, arch)| crd::AmiStatus {
                id: id.clone(),
                name: r.names.images.get(id).cloned(),
                requirements: vec![crd::NodeSelectorRequirementWithMinValues {
                    key: labels::ARCH.to_string(),
                    operator: "In".into(),
                    values: Some(vec![arch.clone()]),
                    min_values: None,
                }],
                deprecated: None,
            })
            .collect(),
    );
    out.instance_profile = r.instance_profile.clone();
}

#[cfg(test)]
mod tests {
    use super::*;

    fn resolved() -> Resolved {
        let mut r = Resolved {
            subnets: vec![("subnet-1".into(), "us-east-1b".into())],
            security_groups: vec!["sg-1".into()],
            images: vec![("ami-1".into(), "amd64".into()), ("ami-2".into(), "arm64".into())],
            instance_profile: Some("profile".into()),
            ..Resolved::default()
        };
        r.names.zone_ids.insert("subnet-1".into(), "use1-az2".into());
        r.names.groups.insert("sg-1".into(), "default".into());
        r.names.images.insert("ami-1".into(), "al2023-x86".into());
        r
    }

    fn condition<'a>(s: &'a crd::EC2NodeClassStatus, kind: &str) -> &'a crd::Condition {
        let found = s.conditions.as_ref().and_then(|cs| cs.iter().find(|c| c.type_ == kind));
        found.unwrap_or_else(|| panic!("{kind} in {s:?}"))
    }

    #[test]
    fn a_resolved_class_lists_its_parts_and_every_condition_is_true() {
        let s = status(Some(&Resolution::Parts(Arc::new(resolved()), Vec::new())), None, &[], "t0");
        let subnets = s.subnets.clone().unwrap_or_default();
        assert_eq!(subnets.len(), 1);
        assert_eq!((subnets[0].zone.as_str(), subnets[0].zone_id.as_deref()), ("us-east-1b", Some("use1-az2")));
        let groups = s.security_groups.clone().unwrap_or_default();
        assert_eq!(groups[0].name.as_deref(), Some("default"));
        let amis = s.amis.clone().unwrap_or_default();
        assert_eq!(amis.len(), 2);
        assert_eq!(amis[1].requirements[0].values, Some(vec!["arm64".to_string()]));
        assert_eq!((amis[0].name.as_deref(), amis[1].name.as_deref()), (Some("al2023-x86"), None));
        assert_eq!(s.instance_profile.as_deref(), Some("profile"));
        for kind in ["Ready", "SubnetsReady", "SecurityGroupsReady", "AMIsReady", "InstanceProfileReady"] {
            assert_eq!(condition(&s, kind).status, "True", "{kind}");
        }
    }

    #[test]
    fn subnets_that_match_nothing_make_subnets_ready_false_and_ready_says_why() {
        let mut r = resolved();
        r.subnets.clear();
        let why = Unmet { condition: "SubnetsReady", reason: "SubnetsNotFound", message: "no subnet matches".into() };
        let res = Resolution::Parts(Arc::new(r), vec![why]);
        let s = status(Some(&res), None, &[], "t0");
        assert_eq!(s.subnets, None);
        assert!(s.security_groups.is_some() && s.amis.is_some(), "the parts found are still shown");
        let subnets = condition(&s, "SubnetsReady");
        assert_eq!((subnets.status.as_str(), subnets.reason.as_deref()), ("False", Some("SubnetsNotFound")));
        let ready = condition(&s, "Ready");
        assert_eq!((ready.status.as_str(), ready.reason.as_deref()), ("False", Some("SubnetsNotFound")));
        let message = ready.message.clone().unwrap_or_default();
        assert!(message.contains("SubnetsReady=False") && message.contains("spec.subnetSelectorTerms"), "{message}");
        assert_eq!(condition(&s, "AMIsReady").status, "True");
        let e = res.unready("EC2NodeClass \"x\"").expect("unready");
        assert_eq!(e.field, "spec.subnetSelectorTerms");
    }

    #[test]
    fn an_invalid_class_is_not_ready_for_its_validation_and_a_condition_keeps_its_time_while_it_holds() {
        let bad =
            ConversionError { object: "EC2NodeClass \"x\"".into(), field: "spec.role".into(), message: "m".into() };
        let first = status(None, Some(&bad), &[], "t0");
        assert_eq!(condition(&first, "ValidationSucceeded").status, "False");
        assert_eq!(condition(&first, "Ready").reason.as_deref(), Some("ValidationFailed"));
        let previous = first.conditions.clone().unwrap_or_default();
        let again = status(None, Some(&bad), &previous, "t1");
        assert_eq!(condition(&again, "Ready").last_transition_time.as_deref(), Some("t0"));
        let fixed = status(None, None, &previous, "t2");
        assert_eq!(condition(&fixed, "Ready").last_transition_time.as_deref(), Some("t2"));
        assert_eq!(condition(&fixed, "Ready").status, "True");
    }
}
