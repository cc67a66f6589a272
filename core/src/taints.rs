//! Taints and tolerations with every Kubernetes operator and effect.

use std::fmt;

/// A taint effect.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Effect {
    NoSchedule,
    PreferNoSchedule,
    NoExecute,
}

impl Effect {
    /// Parses an effect name.
    pub fn parse(s: &str) -> Option<Effect> {
        Some(match s {
            "NoSchedule" => Effect::NoSchedule,
            "PreferNoSchedule" => Effect::PreferNoSchedule,
            "NoExecute" => Effect::NoExecute,
            _ => return None,
        })
    }

    /// The effect's name.
    pub fn as_str(&self) -> &'static str {
        match self {
            Effect::NoSchedule => "NoSchedule",
            Effect::PreferNoSchedule => "PreferNoSchedule",
            Effect::NoExecute => "NoExecute",
        }
    }
}

/// A node taint.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Taint {
    pub key: String,
    pub value: String,
    pub effect: Effect,
}

impl Taint {
    /// A taint `key=value:effect`.
    pub fn new(key: &str, value: &str, effect: Effect) -> Self {
        Taint { key: key.to_string(), value: value.to_string(), effect }
    }

    /// The taint Kubernetes puts on cordoned nodes.
    pub fn unschedulable() -> Self {
        Taint::new("node.kubernetes.io/unschedulable", "", Effect::NoSchedule)
    }

    /// Karpenter's `karpenter.sh/disrupted:NoSchedule`.
    pub fn disrupted() -> Self {
        Taint::new("karpenter.sh/disrupted", "", Effect::NoSchedule)
    }
}

impl fmt::Display for Taint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.value.is_empty() {
            write!(f, "{}:{}", self.key, self.effect.as_str())
        } else {
            write!(f, "{}={}:{}", self.key, self.value, self.effect.as_str())
        }
    }
}

/// A toleration operator. `Gt` and `Lt` compare integer values (Kubernetes 1.35+).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum TolerationOp {
    Equal,
    Exists,
    Gt,
    Lt,
}

impl TolerationOp {
    /// Parses an operator name; the empty string means `Equal`.
    pub fn parse(s: &str) -> Option<TolerationOp> {
        Some(match s {
            "" | "Equal" => TolerationOp::Equal,
            "Exists" => TolerationOp::Exists,
            "Gt" => TolerationOp::Gt,
            "Lt" => TolerationOp::Lt,
            _ => return None,
        })
    }
}

/// A pod toleration. An empty `key` with `Exists` tolerates every taint; `effect: None`
/// matches every effect.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Toleration {
    pub key: String,
    pub op: TolerationOp,
    pub value: String,
    pub effect: Option<Effect>,
}

impl Toleration {
    /// Tolerates taints with `key` (any value) and the given effect (any when `None`).
    pub fn exists(key: &str, effect: Option<Effect>) -> Self {
        Toleration { key: key.to_string(), op: TolerationOp::Exists, value: String::new(), effect }
    }

    /// Tolerates `key=value` with the given effect (any when `None`).
    pub fn equal(key: &str, value: &str, effect: Option<Effect>) -> Self {
        Toleration { key: key.to_string(), op: TolerationOp::Equal, value: value.to_string(), effect }
    }

    /// Kubernetes' `ToleratesTaint`.
    pub fn tolerates(&self, taint: &Taint) -> bool {
        if self.effect.is_some_and(|e| e != taint.effect) {
            return false;
        }
        if !self.key.is_empty() && self.key != taint.key {
            return false;
        }
        match self.op {
            TolerationOp::Exists => true,
            TolerationOp::Equal => self.value == taint.value,
            TolerationOp::Gt | TolerationOp::Lt => {
                let (Ok(tv), Ok(v)) = (taint.value.parse::<i64>(), self.value.parse::<i64>()) else {
                    return false;
                };
                if self.op == TolerationOp::Gt { tv > v } else { tv < v }
            }
        }
    }
}

/// Whether `tolerations` tolerate every taint (of any effect, as Karpenter checks).
/// Returns the first taint that is not tolerated.
pub fn first_untolerated<'a>(taints: &'a [Taint], tolerations: &[Toleration]) -> Option<&'a Taint> {
    taints.iter().find(|t| !tolerations.iter().any(|tol| tol.tolerates(t)))
}

/// Whether `tolerations` tolerate every taint.
pub fn tolerates_all(taints: &[Taint], tolerations: &[Toleration]) -> bool {
    first_untolerated(taints, tolerations).is_none()
}

/// Taints a not-yet-initialized node carries while booting, which Karpenter ignores when
/// simulating pods onto it (matched by key and effect, as Karpenter's `MatchTaint`).
pub fn is_known_ephemeral(t: &Taint) -> bool {
    matches!(
        (t.key.as_str(), t.effect),
        ("node.kubernetes.io/not-ready", Effect::NoSchedule | Effect::NoExecute)
            | ("node.kubernetes.io/unreachable", Effect::NoSchedule)
            | ("karpenter.sh/unregistered", Effect::NoExecute)
            | ("node.cloudprovider.kubernetes.io/uninitialized", Effect::NoSchedule)
    ) || t.key.starts_with("readiness.k8s.io/")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn operators_and_effects() {
        let t = Taint::new("gpu", "true", Effect::NoSchedule);
        assert!(Toleration::equal("gpu", "true", None).tolerates(&t));
        assert!(!Toleration::equal("gpu", "false", None).tolerates(&t));
        assert!(Toleration::exists("gpu", Some(Effect::NoSchedule)).tolerates(&t));
        assert!(!Toleration::exists("gpu", Some(Effect::NoExecute)).tolerates(&t));
        assert!(Toleration::exists("", None).tolerates(&t), "empty key + Exists tolerates all");
        let sla = Taint::new("sla", "999", Effect::NoSchedule);
        let gt = Toleration { key: "sla".into(), op: TolerationOp::Gt, value: "950".into(), effect: None };
        assert!(gt.tolerates(&sla));
        let lt = Toleration { op: TolerationOp::Lt, ..gt.clone() };
        assert!(!lt.tolerates(&sla));
        let bad = Taint::new("sla", "high", Effect::NoSchedule);
        assert!(!gt.tolerates(&bad), "non-integer values never compare");
    }

    #[test]
    fn prefer_no_schedule_must_be_tolerated_too() {
        let taints = [Taint::new("soft", "", Effect::PreferNoSchedule)];
        assert!(!tolerates_all(&taints, &[]));
        assert!(tolerates_all(&taints, &[Toleration::exists("", Some(Effect::PreferNoSchedule))]));
    }
}
