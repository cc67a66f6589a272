//! Interruption events as EventBridge delivers them to the queue (Karpenter reference 4.2-4.3):
//! an envelope `{version, id, detail-type, source, account, time, region, resources, detail}`
//! with the exact `detail` field names the parser reads.

use serde_json::{Value, json};

/// The kinds of event the sim cloud emits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventKind {
    /// `aws.ec2` / `EC2 Spot Instance Interruption Warning`.
    SpotInterruption,
    /// `aws.ec2` / `EC2 Instance Rebalance Recommendation`.
    RebalanceRecommendation,
    /// `aws.ec2` / `EC2 Instance State-change Notification`, with the state.
    StateChange(&'static str),
    /// `aws.health` / `AWS Health Event`, an EC2 scheduled change.
    ScheduledChange,
    /// `aws.ec2` / `EC2 Capacity Reservation Instance Interruption Warning`.
    CapacityReservationInterruption,
}

/// Where and when an event happened.
#[derive(Clone, Debug)]
pub struct Origin<'a> {
    pub event_id: &'a str,
    pub account: &'a str,
    pub region: &'a str,
    /// Seconds since the Unix epoch.
    pub unix_seconds: u64,
}

/// The event's JSON body.
pub fn event(kind: EventKind, instance_id: &str, origin: &Origin<'_>) -> String {
    let arn = format!("arn:aws:ec2:{}:{}:instance/{instance_id}", origin.region, origin.account);
    let (source, detail_type, detail) = match kind {
        EventKind::SpotInterruption => (
            "aws.ec2",
            "EC2 Spot Instance Interruption Warning",
            json!({"instance-id": instance_id, "instance-action": "terminate"}),
        ),
        EventKind::CapacityReservationInterruption => (
            "aws.ec2",
            "EC2 Capacity Reservation Instance Interruption Warning",
            json!({"instance-id": instance_id, "instance-action": "terminate"}),
        ),
        EventKind::RebalanceRecommendation => {
            ("aws.ec2", "EC2 Instance Rebalance Recommendation", json!({"instance-id": instance_id}))
        }
        EventKind::StateChange(state) => {
            ("aws.ec2", "EC2 Instance State-change Notification", json!({"instance-id": instance_id, "state": state}))
        }
        EventKind::ScheduledChange => (
            "aws.health",
            "AWS Health Event",
            json!({
                "eventArn": format!("arn:aws:health:{}::event/EC2/AWS_EC2_INSTANCE_RETIREMENT_SCHEDULED/{}", origin.region, origin.event_id),
                "eventTypeCode": "AWS_EC2_INSTANCE_RETIREMENT_SCHEDULED",
                "service": "EC2",
                "eventTypeCategory": "scheduledChange",
                "startTime": rfc3339(origin.unix_seconds + 7 * 86_400),
                "endTime": rfc3339(origin.unix_seconds + 8 * 86_400),
                "eventDescription": [{"language": "en_US", "latestDescription": "The instance is scheduled for retirement."}],
                "affectedEntities": [{"entityValue": instance_id}],
            }),
        ),
    };
    let body: Value = json!({
        "version": "0",
        "id": origin.event_id,
        "detail-type": detail_type,
        "source": source,
        "account": origin.account,
        "time": rfc3339(origin.unix_seconds),
        "region": origin.region,
        "resources": [arn],
        "detail": detail,
    });
    body.to_string()
}

pub use dovetail_core::clock::rfc3339;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spot_warning_has_the_fields_karpenter_parses() {
        let o = Origin { event_id: "e-1", account: "123456789012", region: "us-east-1", unix_seconds: 0 };
        let v: Value = serde_json::from_str(&event(EventKind::SpotInterruption, "i-0abc", &o)).unwrap();
        assert_eq!(v["version"], "0");
        assert_eq!(v["source"], "aws.ec2");
        assert_eq!(v["detail-type"], "EC2 Spot Instance Interruption Warning");
        assert_eq!(v["detail"]["instance-id"], "i-0abc");
        assert_eq!(v["detail"]["instance-action"], "terminate");
        assert_eq!(v["resources"][0], "arn:aws:ec2:us-east-1:123456789012:instance/i-0abc");
        let h: Value = serde_json::from_str(&event(EventKind::ScheduledChange, "i-0abc", &o)).unwrap();
        assert_eq!(h["source"], "aws.health");
        assert_eq!(h["detail"]["service"], "EC2");
        assert_eq!(h["detail"]["eventTypeCategory"], "scheduledChange");
        assert_eq!(h["detail"]["affectedEntities"][0]["entityValue"], "i-0abc");
        let s: Value = serde_json::from_str(&event(EventKind::StateChange("stopping"), "i-1", &o)).unwrap();
        assert_eq!(s["detail"]["state"], "stopping");
    }
}
