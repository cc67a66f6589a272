//! EventBridge events as they arrive on the interruption queue, parsed by
//! `(version, source, detail-type)` into the kinds Karpenter's AWS provider handles, with the
//! exact JSON field names it reads (Karpenter reference 4.2-4.3).
//!
//! The parser works on untyped JSON so that a body of any shape gives a value, never a panic:
//! an empty body or an unknown `(version, source, detail-type)` is a [`Kind::NoOp`] (deleted
//! and counted, as Karpenter's), a known kind missing a field it needs is a [`ParseError`] that
//! names the field.

use serde_json::{Map, Value};

use crate::ledger::Millis;

/// What a message is about, as Karpenter's `messages.Kind` names it (the
/// `karpenter_interruption_received_messages_total{message_type}` label).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Kind {
    /// `aws.ec2` / `EC2 Spot Instance Interruption Warning`: the instance goes in two minutes.
    SpotInterrupted,
    /// `aws.ec2` / `EC2 Instance Rebalance Recommendation`: the instance is at elevated risk.
    RebalanceRecommendation,
    /// `aws.health` / `AWS Health Event` for EC2 with category `scheduledChange`.
    ScheduledChange,
    /// `aws.ec2` / `EC2 Instance State-change Notification`, state `stopping` or `stopped`.
    InstanceStopped,
    /// `aws.ec2` / `EC2 Instance State-change Notification`, state `shutting-down` or `terminated`.
    InstanceTerminated,
    /// `aws.ec2` / `EC2 Capacity Reservation Instance Interruption Warning`.
    CapacityReservationInterrupted,
    /// Anything else: an unknown event, a Health event of another service or category, a state
    /// change to another state, an empty body.
    NoOp,
}

impl Kind {
    /// Karpenter's name for it.
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::SpotInterrupted => "spot_interrupted",
            Kind::RebalanceRecommendation => "rebalance_recommendation",
            Kind::ScheduledChange => "scheduled_change",
            Kind::InstanceStopped => "instance_stopped",
            Kind::InstanceTerminated => "instance_terminated",
            Kind::CapacityReservationInterrupted => "capacity_reservation_interrupted",
            Kind::NoOp => "no_op",
        }
    }

    /// Every kind, in order.
    pub const ALL: [Kind; 7] = [
        Kind::SpotInterrupted,
        Kind::RebalanceRecommendation,
        Kind::ScheduledChange,
        Kind::InstanceStopped,
        Kind::InstanceTerminated,
        Kind::CapacityReservationInterrupted,
        Kind::NoOp,
    ];
}

impl std::fmt::Display for Kind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A parsed event.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Event {
    pub kind: Kind,
    /// The EventBridge event id (`id`), empty when absent.
    pub id: String,
    /// When the event happened (`time`), in Unix milliseconds; `None` when absent or not
    /// RFC 3339 (the handler then counts from when it received the message).
    pub time: Option<Millis>,
    /// The instances it is about (one, or a Health event's affected entities); empty for
    /// [`Kind::NoOp`].
    pub instances: Vec<String>,
    /// What EC2 will do (`instance-action`: terminate, stop, hibernate), where the event says.
    pub action: Option<String>,
    /// Why a message is a [`Kind::NoOp`], or the Health event's type code: for the log.
    pub note: String,
}

/// Why a body is not an event of the kind its header says.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ParseError {
    #[error("the body is not JSON: {0}")]
    NotJson(String),
    #[error("the body is not a JSON object")]
    NotObject,
    #[error("field {field}: {reason}")]
    Field { field: &'static str, reason: &'static str },
}

impl ParseError {
    /// The kind of error, without the body's details (what "logged once per kind" keys on).
    pub fn kind(&self) -> String {
        match self {
            ParseError::NotJson(_) => "not_json".into(),
            ParseError::NotObject => "not_object".into(),
            ParseError::Field { field, reason } => format!("{field}: {reason}"),
        }
    }
}

const EC2: &str = "aws.ec2";
const HEALTH: &str = "aws.health";
const SPOT: &str = "EC2 Spot Instance Interruption Warning";
const REBALANCE: &str = "EC2 Instance Rebalance Recommendation";
const STATE: &str = "EC2 Instance State-change Notification";
const RESERVATION: &str = "EC2 Capacity Reservation Instance Interruption Warning";
const HEALTH_EVENT: &str = "AWS Health Event";

/// Parses one queue message body.
pub fn parse(body: &str) -> Result<Event, ParseError> {
    if body.trim().is_empty() {
        return Ok(no_op(String::new(), None, "empty body".into()));
    }
    let value: Value = serde_json::from_str(body).map_err(|e| ParseError::NotJson(e.to_string()))?;
    let Value::Object(envelope) = value else { return Err(ParseError::NotObject) };
    let version = header(&envelope, "version")?;
    let source = header(&envelope, "source")?;
    let detail_type = header(&envelope, "detail-type")?;
    let id = optional_str(&envelope, "id", "id")?.unwrap_or_default().to_string();
    let time = envelope.get("time").and_then(Value::as_str).and_then(parse_rfc3339);
    let key = (version, source, detail_type);
    let detail = || -> Result<&Map<String, Value>, ParseError> {
        match envelope.get("detail") {
            Some(Value::Object(d)) => Ok(d),
            Some(_) => Err(ParseError::Field { field: "detail", reason: "not an object" }),
            None => Err(ParseError::Field { field: "detail", reason: "missing" }),
        }
    };
    let event = |kind, instances, action, note| Event { kind, id: id.clone(), time, instances, action, note };
    match key {
        ("0", EC2, SPOT) | ("0", EC2, RESERVATION) => {
            let d = detail()?;
            let instance = instance_id(d)?;
            let action = optional_str(d, "instance-action", "detail.instance-action")?.map(str::to_string);
            let kind = if detail_type == SPOT { Kind::SpotInterrupted } else { Kind::CapacityReservationInterrupted };
            Ok(event(kind, vec![instance], action, String::new()))
        }
        ("0", EC2, REBALANCE) => {
            let instance = instance_id(detail()?)?;
            Ok(event(Kind::RebalanceRecommendation, vec![instance], None, String::new()))
        }
        ("0", EC2, STATE) => {
            let d = detail()?;
            let instance = instance_id(d)?;
            let state = required_str(d, "state", "detail.state")?.to_ascii_lowercase();
            let kind = match state.as_str() {
                "stopping" | "stopped" => Kind::InstanceStopped,
                "shutting-down" | "terminated" => Kind::InstanceTerminated,
                _ => return Ok(no_op(id.clone(), time, format!("state change to {state}"))),
            };
            Ok(event(kind, vec![instance], Some(state), String::new()))
        }
        ("0", HEALTH, HEALTH_EVENT) => {
            let d = detail()?;
            let service = optional_str(d, "service", "detail.service")?.unwrap_or_default();
            let category = optional_str(d, "eventTypeCategory", "detail.eventTypeCategory")?.unwrap_or_default();
            let code = optional_str(d, "eventTypeCode", "detail.eventTypeCode")?.unwrap_or_default().to_string();
            if service != "EC2" || category != "scheduledChange" {
                return Ok(no_op(
                    id.clone(),
                    time,
                    format!("health event of service {service:?}, category {category:?}"),
                ));
            }
            let instances = affected_entities(d)?;
            Ok(event(Kind::ScheduledChange, instances, None, code))
        }
        _ => Ok(no_op(id.clone(), time, format!("unknown event ({version}, {source}, {detail_type})"))),
    }
}

fn no_op(id: String, time: Option<Millis>, note: String) -> Event {
    Event { kind: Kind::NoOp, id, time, instances: Vec::new(), action: None, note }
}

/// An envelope header: a missing one makes the message a NoOp's key component `""`, as
/// Karpenter's decoder leaves absent strings empty; a non-string one is an error.
fn header<'a>(envelope: &'a Map<String, Value>, field: &'static str) -> Result<&'a str, ParseError> {
    Ok(optional_str(envelope, field, field)?.unwrap_or_default())
}

fn optional_str<'a>(
    object: &'a Map<String, Value>,
    key: &str,
    field: &'static str,
) -> Result<Option<&'a str>, ParseError> {
    match object.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.as_str())),
        Some(_) => Err(ParseError::Field { field, reason: "not a string" }),
    }
}

fn required_str<'a>(object: &'a Map<String, Value>, key: &str, field: &'static str) -> Result<&'a str, ParseError> {
    match optional_str(object, key, field)? {
        Some(s) if !s.trim().is_empty() => Ok(s),
        Some(_) => Err(ParseError::Field { field, reason: "empty" }),
        None => Err(ParseError::Field { field, reason: "missing" }),
    }
}

fn instance_id(detail: &Map<String, Value>) -> Result<String, ParseError> {
    let id = required_str(detail, "instance-id", "detail.instance-id")?;
    valid_instance(id, "detail.instance-id")
}

fn valid_instance(id: &str, field: &'static str) -> Result<String, ParseError> {
    if id.len() > 64 || id.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(ParseError::Field { field, reason: "not an instance id" });
    }
    Ok(id.to_string())
}

fn affected_entities(detail: &Map<String, Value>) -> Result<Vec<String>, ParseError> {
    const FIELD: &str = "detail.affectedEntities";
    let entities = match detail.get("affectedEntities") {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::Array(a)) => a,
        Some(_) => return Err(ParseError::Field { field: FIELD, reason: "not an array" }),
    };
    let mut out = Vec::with_capacity(entities.len());
    for e in entities {
        let Value::Object(e) = e else {
            return Err(ParseError::Field { field: FIELD, reason: "an entity is not an object" });
        };
        // Entities other than instances (an account, a volume) are not ours to act on.
        match optional_str(e, "entityValue", "detail.affectedEntities[].entityValue")? {
            Some(v) if v.starts_with("i-") => out.push(valid_instance(v, "detail.affectedEntities[].entityValue")?),
            _ => {}
        }
    }
    out.sort();
    out.dedup();
    Ok(out)
}

/// Unix milliseconds of an RFC 3339 time (`2026-01-01T00:00:00Z`, fractional seconds and
/// `±HH:MM` offsets accepted); `None` for anything else.
pub fn parse_rfc3339(s: &str) -> Option<Millis> {
    let b = s.as_bytes();
    if b.len() < 20
        || b[4] != b'-'
        || b[7] != b'-'
        || !(b[10] == b'T' || b[10] == b't')
        || b[13] != b':'
        || b[16] != b':'
    {
        return None;
    }
    let num = |from: usize, to: usize| -> Option<i64> {
        let part = s.get(from..to)?;
        if part.bytes().all(|c| c.is_ascii_digit()) { part.parse().ok() } else { None }
    };
    let (y, mo, d, h, mi, sec) = (num(0, 4)?, num(5, 7)?, num(8, 10)?, num(11, 13)?, num(14, 16)?, num(17, 19)?);
    if !(1..=12).contains(&mo) || !(1..=31).contains(&d) || h > 23 || mi > 59 || sec > 60 {
        return None;
    }
    let mut rest = s.get(19..)?;
    let mut millis = 0i64;
    if let Some(frac) = rest.strip_prefix('.') {
        let digits = frac.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 {
            return None;
        }
        let kept = &frac[..digits.min(3)];
        millis = kept.parse::<i64>().ok()? * 10i64.pow(3 - kept.len() as u32);
        rest = &frac[digits..];
    }
    let offset_secs = match rest {
        "Z" | "z" => 0,
        _ => {
            let rb = rest.as_bytes();
            if rb.len() != 6 || rb[3] != b':' || !(rb[0] == b'+' || rb[0] == b'-') {
                return None;
            }
            let oh: i64 = rest.get(1..3)?.parse().ok()?;
            let om: i64 = rest.get(4..6)?.parse().ok()?;
            if oh > 23 || om > 59 {
                return None;
            }
            let sign = if rb[0] == b'+' { 1 } else { -1 };
            sign * (oh * 3600 + om * 60)
        }
    };
    // Days from the civil date (Howard Hinnant's algorithm), the inverse of `clock::rfc3339`.
    let yy = if mo <= 2 { y - 1 } else { y };
    let era = yy.div_euclid(400);
    let yoe = yy - era * 400;
    let mp = (mo + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    let secs = days * 86_400 + h * 3600 + mi * 60 + sec - offset_secs;
    u64::try_from(secs.checked_mul(1000)?.checked_add(millis)?).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::rfc3339;
    use proptest::prelude::*;
    use serde_json::json;

    fn envelope(source: &str, detail_type: &str, detail: Value) -> String {
        json!({
            "version": "0", "id": "7bf73129-1428-4cd3-a780-95db273d1602", "detail-type": detail_type,
            "source": source, "account": "123456789012", "time": "2026-01-01T00:00:10Z",
            "region": "us-east-1", "resources": ["arn:aws:ec2:us-east-1:123456789012:instance/i-0abc"],
            "detail": detail,
        })
        .to_string()
    }

    const T: Millis = 1_767_225_610_000;

    #[test]
    fn a_spot_warning_names_its_instance_and_action() {
        let e = parse(&envelope(EC2, SPOT, json!({"instance-id": "i-0abc", "instance-action": "terminate"}))).unwrap();
        assert_eq!(e.kind, Kind::SpotInterrupted);
        assert_eq!(e.instances, vec!["i-0abc".to_string()]);
        assert_eq!(e.action.as_deref(), Some("terminate"));
        assert_eq!(e.time, Some(T));
        assert_eq!(e.id, "7bf73129-1428-4cd3-a780-95db273d1602");
    }

    #[test]
    fn every_kind_karpenter_handles_is_recognised() {
        let cases = [
            (envelope(EC2, REBALANCE, json!({"instance-id": "i-1"})), Kind::RebalanceRecommendation),
            (envelope(EC2, STATE, json!({"instance-id": "i-1", "state": "stopping"})), Kind::InstanceStopped),
            (envelope(EC2, STATE, json!({"instance-id": "i-1", "state": "Stopped"})), Kind::InstanceStopped),
            (envelope(EC2, STATE, json!({"instance-id": "i-1", "state": "shutting-down"})), Kind::InstanceTerminated),
            (envelope(EC2, STATE, json!({"instance-id": "i-1", "state": "TERMINATED"})), Kind::InstanceTerminated),
            (
                envelope(EC2, RESERVATION, json!({"instance-id": "i-1", "instance-action": "terminate"})),
                Kind::CapacityReservationInterrupted,
            ),
            (
                envelope(
                    HEALTH,
                    HEALTH_EVENT,
                    json!({"service": "EC2", "eventTypeCategory": "scheduledChange",
                           "eventTypeCode": "AWS_EC2_INSTANCE_RETIREMENT_SCHEDULED",
                           "affectedEntities": [{"entityValue": "i-1"}]}),
                ),
                Kind::ScheduledChange,
            ),
        ];
        for (body, kind) in cases {
            let e = parse(&body).unwrap();
            assert_eq!(e.kind, kind, "{body}");
            assert_eq!(e.instances, vec!["i-1".to_string()], "{body}");
        }
    }

    #[test]
    fn what_karpenter_ignores_is_a_no_op() {
        let cases = [
            String::new(),
            "  ".to_string(),
            envelope(EC2, STATE, json!({"instance-id": "i-1", "state": "running"})),
            envelope(EC2, STATE, json!({"instance-id": "i-1", "state": "pending"})),
            envelope(HEALTH, HEALTH_EVENT, json!({"service": "EBS", "eventTypeCategory": "scheduledChange"})),
            envelope(HEALTH, HEALTH_EVENT, json!({"service": "EC2", "eventTypeCategory": "issue"})),
            envelope("aws.s3", "Object Created", json!({})),
            json!({"version": "1", "source": EC2, "detail-type": SPOT, "detail": {"instance-id": "i-1"}}).to_string(),
            json!({"hello": "world"}).to_string(),
        ];
        for body in cases {
            assert_eq!(parse(&body).unwrap().kind, Kind::NoOp, "{body}");
        }
    }

    #[test]
    fn a_known_kind_missing_what_it_needs_names_the_field() {
        let missing = parse(&envelope(EC2, SPOT, json!({"instance-action": "terminate"}))).unwrap_err();
        assert_eq!(missing, ParseError::Field { field: "detail.instance-id", reason: "missing" });
        let wrong = parse(&envelope(EC2, SPOT, json!({"instance-id": 7}))).unwrap_err();
        assert_eq!(wrong, ParseError::Field { field: "detail.instance-id", reason: "not a string" });
        let no_state = parse(&envelope(EC2, STATE, json!({"instance-id": "i-1"}))).unwrap_err();
        assert_eq!(no_state, ParseError::Field { field: "detail.state", reason: "missing" });
        let detail = parse(&json!({"version": "0", "source": EC2, "detail-type": REBALANCE}).to_string()).unwrap_err();
        assert_eq!(detail, ParseError::Field { field: "detail", reason: "missing" });
        let header = parse(&json!({"version": 0, "source": EC2}).to_string()).unwrap_err();
        assert_eq!(header, ParseError::Field { field: "version", reason: "not a string" });
        assert!(matches!(parse("{\"version\": \"0\", "), Err(ParseError::NotJson(_))));
        assert_eq!(parse("[1, 2]"), Err(ParseError::NotObject));
    }

    #[test]
    fn a_health_event_acts_on_its_instances_only() {
        let body = envelope(
            HEALTH,
            HEALTH_EVENT,
            json!({"service": "EC2", "eventTypeCategory": "scheduledChange",
                   "affectedEntities": [{"entityValue": "i-2"}, {"entityValue": "123456789012"}, {"entityValue": "i-1"},
                                        {"entityValue": "i-2"}, {"other": 1}]}),
        );
        assert_eq!(parse(&body).unwrap().instances, vec!["i-1".to_string(), "i-2".to_string()]);
    }

    #[test]
    fn a_missing_or_odd_time_is_none_not_an_error() {
        let body = json!({"version": "0", "source": EC2, "detail-type": REBALANCE, "time": "yesterday",
                          "detail": {"instance-id": "i-1"}});
        assert_eq!(parse(&body.to_string()).unwrap().time, None);
    }

    #[test]
    fn rfc3339_times_parse_as_they_print() {
        for secs in [0u64, 951_782_400, 1_767_225_600, 4_102_444_800 + 86_399] {
            assert_eq!(parse_rfc3339(&rfc3339(secs)), Some(secs * 1000), "{}", rfc3339(secs));
        }
        assert_eq!(parse_rfc3339("2026-01-01T00:00:00.25Z"), Some(1_767_225_600_250));
        assert_eq!(parse_rfc3339("2026-01-01T02:00:00+02:00"), Some(1_767_225_600_000));
        assert_eq!(parse_rfc3339("2025-12-31T23:00:00.123456-01:00"), Some(1_767_225_600_123));
        for bad in
            ["", "2026-01-01", "2026-13-01T00:00:00Z", "2026-01-01T00:00:00", "2026-01-01T00:00:00+0200", "１２３"]
        {
            assert_eq!(parse_rfc3339(bad), None, "{bad}");
        }
    }

    fn json_value() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(|n| json!(n)),
            "[ -~]{0,12}".prop_map(Value::String),
            prop_oneof![
                Just("0"),
                Just(EC2),
                Just(HEALTH),
                Just(SPOT),
                Just(STATE),
                Just(HEALTH_EVENT),
                Just("EC2"),
                Just("scheduledChange"),
                Just("stopping"),
                Just("i-0abc"),
                Just("2026-01-01T00:00:00Z"),
            ]
            .prop_map(|s| Value::String(s.to_string())),
        ];
        leaf.prop_recursive(4, 48, 8, |inner| {
            let key = prop_oneof![
                Just("version"),
                Just("source"),
                Just("detail-type"),
                Just("detail"),
                Just("time"),
                Just("id"),
                Just("instance-id"),
                Just("instance-action"),
                Just("state"),
                Just("service"),
                Just("eventTypeCategory"),
                Just("affectedEntities"),
                Just("entityValue"),
                Just("x"),
            ];
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
                prop::collection::vec((key, inner), 0..8)
                    .prop_map(|kv| Value::Object(kv.into_iter().map(|(k, v)| (k.to_string(), v)).collect())),
            ]
        })
    }

    proptest! {
        /// Arbitrary JSON, arbitrary bytes and truncated real bodies give a value or an error,
        /// never a panic; whatever parses as an acting kind names at least one instance.
        #[test]
        fn no_body_makes_the_parser_panic(v in json_value(), raw in "\\PC{0,64}", cut in 0usize..400) {
            let acting_kinds_name_an_instance =
                |e: &Event| e.kind == Kind::NoOp || e.kind == Kind::ScheduledChange || !e.instances.is_empty();
            if let Ok(e) = parse(&v.to_string()) {
                prop_assert!(acting_kinds_name_an_instance(&e), "{e:?}");
            }
            if let Ok(e) = parse(&raw) {
                prop_assert!(acting_kinds_name_an_instance(&e), "{e:?}");
            }
            let real = envelope(EC2, SPOT, json!({"instance-id": "i-0abc", "instance-action": "terminate"}));
            let truncated: String = real.chars().take(cut).collect();
            let r = parse(&truncated);
            if cut < real.len() && !truncated.trim().is_empty() {
                prop_assert!(r.is_err(), "a truncated body is not JSON: {truncated}");
            }
        }
    }
}
