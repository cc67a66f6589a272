//! The requirements algebra: node selector requirements over label keys, with `In`,
//! `NotIn`, `Exists`, `DoesNotExist`, `Gt`, `Lt`, `Gte` and `Lte`, their intersection and
//! compatibility, as Karpenter's `pkg/scheduling` defines them.
//!
//! A [`Requirement`] is a set of allowed values for one key: either a concrete set
//! (`In`, or empty for `DoesNotExist`) or the complement of a set (`NotIn`, or nothing
//! excluded for `Exists`), optionally narrowed by inclusive integer bounds (`Gt N` is held
//! as `>= N+1`). Intersection never widens a set and is commutative.

use std::collections::BTreeMap;
use std::fmt;

use crate::labels::{self, Labels};
use crate::shared::Shared;

/// A node selector operator.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Operator {
    In,
    NotIn,
    Exists,
    DoesNotExist,
    Gt,
    Lt,
    Gte,
    Lte,
}

impl Operator {
    /// Parses an operator name as written in Kubernetes YAML.
    pub fn parse(s: &str) -> Option<Operator> {
        Some(match s {
            "In" => Operator::In,
            "NotIn" => Operator::NotIn,
            "Exists" => Operator::Exists,
            "DoesNotExist" => Operator::DoesNotExist,
            "Gt" => Operator::Gt,
            "Lt" => Operator::Lt,
            "Gte" => Operator::Gte,
            "Lte" => Operator::Lte,
            _ => return None,
        })
    }

    /// The operator's YAML name.
    pub fn as_str(&self) -> &'static str {
        match self {
            Operator::In => "In",
            Operator::NotIn => "NotIn",
            Operator::Exists => "Exists",
            Operator::DoesNotExist => "DoesNotExist",
            Operator::Gt => "Gt",
            Operator::Lt => "Lt",
            Operator::Gte => "Gte",
            Operator::Lte => "Lte",
        }
    }
}

impl fmt::Display for Operator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why a requirement could not be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RequirementError {
    #[error("key {key} with operator {op} must have a single positive integer value")]
    NotAnInteger { key: String, op: Operator },
}

/// The allowed values of one label key.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Requirement {
    complement: bool,
    /// Sorted, deduplicated.
    values: Vec<String>,
    gte: Option<i64>,
    lte: Option<i64>,
    /// Karpenter's `minValues`: how many distinct values of this key the instance types of a
    /// NodeClaim must cover.
    pub min_values: Option<u32>,
}

/// The requirement every undefined key has: any value, or none.
static EXISTS: Requirement =
    Requirement { complement: true, values: Vec::new(), gte: None, lte: None, min_values: None };

impl Requirement {
    /// `Exists`: every value.
    pub fn exists() -> Self {
        EXISTS.clone()
    }

    /// `DoesNotExist`: no value.
    pub fn does_not_exist() -> Self {
        Requirement { complement: false, values: Vec::new(), gte: None, lte: None, min_values: None }
    }

    /// `In values`.
    pub fn is_in<S: Into<String>>(values: impl IntoIterator<Item = S>) -> Self {
        let mut values: Vec<String> = values.into_iter().map(Into::into).collect();
        values.sort();
        values.dedup();
        Requirement { complement: false, values, gte: None, lte: None, min_values: None }
    }

    /// `NotIn values`.
    pub fn not_in<S: Into<String>>(values: impl IntoIterator<Item = S>) -> Self {
        let mut r = Requirement::is_in(values);
        r.complement = true;
        r
    }

    /// A requirement from an operator and its values, as Karpenter's `NewRequirement`:
    /// `Gt N` becomes `>= N+1` and `Lt N` becomes `<= N-1`. Fails only for a bound operator
    /// without exactly one integer value. `key` is used for the error message.
    pub fn new(key: &str, op: Operator, values: &[String]) -> Result<Self, RequirementError> {
        let bound = || -> Result<i64, RequirementError> {
            match values {
                [v] => v.parse::<i64>().map_err(|_| RequirementError::NotAnInteger { key: key.to_string(), op }),
                _ => Err(RequirementError::NotAnInteger { key: key.to_string(), op }),
            }
        };
        Ok(match op {
            Operator::In => Requirement::is_in(values.iter().cloned()),
            Operator::NotIn => Requirement::not_in(values.iter().cloned()),
            Operator::Exists => Requirement::exists(),
            Operator::DoesNotExist => Requirement::does_not_exist(),
            Operator::Gt => {
                let v = bound()?;
                if v == i64::MAX {
                    return Ok(Requirement::does_not_exist());
                }
                Requirement { gte: Some(v + 1), ..Requirement::exists() }
            }
            Operator::Lt => {
                let v = bound()?;
                if v == i64::MIN {
                    return Ok(Requirement::does_not_exist());
                }
                Requirement { lte: Some(v - 1), ..Requirement::exists() }
            }
            Operator::Gte => Requirement { gte: Some(bound()?), ..Requirement::exists() },
            Operator::Lte => Requirement { lte: Some(bound()?), ..Requirement::exists() },
        })
    }

    /// Sets `minValues`.
    pub fn with_min_values(mut self, min_values: Option<u32>) -> Self {
        self.min_values = min_values;
        self
    }

    /// The intersection of two requirements on the same key.
    pub fn intersection(&self, other: &Requirement) -> Requirement {
        let complement = self.complement && other.complement;
        let gte = max_opt(self.gte, other.gte);
        let lte = min_opt(self.lte, other.lte);
        let min_values = max_opt(self.min_values, other.min_values);
        if let (Some(g), Some(l)) = (gte, lte)
            && g > l
        {
            return Requirement::does_not_exist().with_min_values(min_values);
        }
        let mut values = match (self.complement, other.complement) {
            (true, true) => union(&self.values, &other.values),
            (true, false) => difference(&other.values, &self.values),
            (false, true) => difference(&self.values, &other.values),
            (false, false) => intersect(&self.values, &other.values),
        };
        values.retain(|v| within_bounds(v, gte, lte));
        let (gte, lte) = if complement { (gte, lte) } else { (None, None) };
        Requirement { complement, values, gte, lte, min_values }
    }

    /// Whether the two requirements share at least one value (Karpenter's `HasIntersection`).
    pub fn has_intersection(&self, other: &Requirement) -> bool {
        let gte = max_opt(self.gte, other.gte);
        let lte = min_opt(self.lte, other.lte);
        if let (Some(g), Some(l)) = (gte, lte)
            && g > l
        {
            return false;
        }
        match (self.complement, other.complement) {
            (true, true) => true,
            (true, false) => other.values.iter().any(|v| !contains(&self.values, v) && within_bounds(v, gte, lte)),
            (false, true) => self.values.iter().any(|v| !contains(&other.values, v) && within_bounds(v, gte, lte)),
            (false, false) => {
                let (small, large) = if self.values.len() <= other.values.len() {
                    (&self.values, &other.values)
                } else {
                    (&other.values, &self.values)
                };
                small.iter().any(|v| contains(large, v) && within_bounds(v, gte, lte))
            }
        }
    }

    /// Whether `value` is allowed.
    pub fn has(&self, value: &str) -> bool {
        if self.complement {
            !contains(&self.values, value) && within_bounds(value, self.gte, self.lte)
        } else {
            contains(&self.values, value) && within_bounds(value, self.gte, self.lte)
        }
    }

    /// The operator that describes the set: `In`, `NotIn`, `Exists` or `DoesNotExist`
    /// (bounded sets are `Exists`/`NotIn` with bounds, as in Karpenter).
    pub fn operator(&self) -> Operator {
        match (self.complement, self.values.is_empty()) {
            (true, true) => Operator::Exists,
            (true, false) => Operator::NotIn,
            (false, false) => Operator::In,
            (false, true) => Operator::DoesNotExist,
        }
    }

    /// The number of allowed values; complements count as (nearly) unbounded.
    pub fn len(&self) -> usize {
        if self.complement { usize::MAX - self.values.len() } else { self.values.len() }
    }

    /// Whether no value is allowed (`DoesNotExist`).
    pub fn is_empty(&self) -> bool {
        !self.complement && self.values.is_empty()
    }

    /// The listed values: the allowed ones for `In`, the excluded ones for `NotIn`.
    pub fn values(&self) -> &[String] {
        &self.values
    }

    /// Whether the set is a complement (`NotIn` or `Exists`).
    pub fn is_complement(&self) -> bool {
        self.complement
    }

    /// The inclusive lower bound.
    pub fn gte(&self) -> Option<i64> {
        self.gte
    }

    /// The inclusive upper bound.
    pub fn lte(&self) -> Option<i64> {
        self.lte
    }

    /// Some allowed value, chosen deterministically (the smallest listed for `In`; for a
    /// complement, the smallest integer within bounds that is not excluded).
    pub fn any(&self) -> Option<String> {
        if !self.complement {
            return self.values.first().cloned();
        }
        let start = self.gte.unwrap_or(0);
        let end = self.lte.unwrap_or(i64::MAX);
        let mut v = start;
        while v <= end {
            let s = v.to_string();
            if !contains(&self.values, &s) {
                return Some(s);
            }
            v += 1;
        }
        None
    }

    /// Inserts allowed values into a concrete (`In`) set.
    pub fn insert(&mut self, value: impl Into<String>) {
        let value = value.into();
        if let Err(i) = self.values.binary_search(&value) {
            self.values.insert(i, value);
        }
    }
}

impl fmt::Display for Requirement {
    /// Karpenter's `Requirement.String()` without the key: `In [a b c d e and 3 others]`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let op = self.operator();
        match op {
            Operator::Exists | Operator::DoesNotExist => write!(f, "{op}")?,
            _ => {
                write!(f, "{op} [")?;
                for (i, v) in self.values.iter().take(5).enumerate() {
                    if i > 0 {
                        f.write_str(" ")?;
                    }
                    f.write_str(v)?;
                }
                if self.values.len() > 5 {
                    write!(f, " and {} others", self.values.len() - 5)?;
                }
                f.write_str("]")?;
            }
        }
        if let Some(g) = self.gte {
            write!(f, " >={g}")?;
        }
        if let Some(l) = self.lte {
            write!(f, " <={l}")?;
        }
        if let Some(m) = self.min_values {
            write!(f, " minValues {m}")?;
        }
        Ok(())
    }
}

fn contains(sorted: &[String], v: &str) -> bool {
    sorted.binary_search_by(|x| x.as_str().cmp(v)).is_ok()
}

fn within_bounds(v: &str, gte: Option<i64>, lte: Option<i64>) -> bool {
    if gte.is_none() && lte.is_none() {
        return true;
    }
    let Ok(n) = v.parse::<i64>() else { return false };
    gte.is_none_or(|g| n >= g) && lte.is_none_or(|l| n <= l)
}

fn max_opt<T: Ord>(a: Option<T>, b: Option<T>) -> Option<T> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.max(b)),
        (a, None) => a,
        (None, b) => b,
    }
}

fn min_opt<T: Ord>(a: Option<T>, b: Option<T>) -> Option<T> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, None) => a,
        (None, b) => b,
    }
}

fn union(a: &[String], b: &[String]) -> Vec<String> {
    let mut out = Vec::with_capacity(a.len() + b.len());
    let (mut i, mut j) = (0, 0);
    while i < a.len() && j < b.len() {
        match a[i].cmp(&b[j]) {
            std::cmp::Ordering::Less => {
                out.push(a[i].clone());
                i += 1;
            }
            std::cmp::Ordering::Greater => {
                out.push(b[j].clone());
                j += 1;
            }
            std::cmp::Ordering::Equal => {
                out.push(a[i].clone());
                i += 1;
                j += 1;
            }
        }
    }
    out.extend(a[i..].iter().cloned());
    out.extend(b[j..].iter().cloned());
    out
}

fn intersect(a: &[String], b: &[String]) -> Vec<String> {
    let (small, large) = if a.len() <= b.len() { (a, b) } else { (b, a) };
    small.iter().filter(|v| contains(large, v)).cloned().collect()
}

fn difference(a: &[String], minus: &[String]) -> Vec<String> {
    a.iter().filter(|v| !contains(minus, v)).cloned().collect()
}

/// Why two sets of requirements cannot both hold.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IncompatibleError {
    /// A custom label the existing side does not define.
    #[error("label {key:?} does not have known values{hint}")]
    UnknownLabel { key: String, hint: String },
    /// Keys whose values do not overlap, as `key K, <incoming> not in <existing>`.
    #[error("{}", .0.join("; "))]
    NoOverlap(Vec<String>),
}

/// Requirements over many keys; a key that is absent allows every value.
///
/// The map is shared between copies and copied on the first write ([`Shared`]): a node's
/// requirements are copied into every trial that places a pod there and into every saved
/// state a trial rolls back to, and most of those copies are never written (a pod that
/// asks nothing of its node leaves them as they were).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Requirements {
    map: Shared<BTreeMap<String, Requirement>>,
}

impl Requirements {
    /// No requirements.
    pub fn new() -> Self {
        Requirements::default()
    }

    /// `key In [value]` for every label (Karpenter's `NewLabelRequirements`).
    pub fn from_labels(labels: &Labels) -> Self {
        let mut r = Requirements::new();
        for (k, v) in labels {
            r.add(k, Requirement::is_in([v.as_str()]));
        }
        r
    }

    /// Adds (intersects) a requirement on `key`, normalising deprecated keys. A requirement
    /// that narrows nothing leaves the map as it was (shared, when it is).
    pub fn add(&mut self, key: &str, req: Requirement) {
        let key = labels::normalize_key(key);
        match self.map.get(key) {
            Some(existing) if *existing == req => {}
            Some(existing) => {
                let narrowed = req.intersection(existing);
                if narrowed != *existing {
                    self.map.insert(key.to_string(), narrowed);
                }
            }
            None => {
                self.map.insert(key.to_string(), req);
            }
        }
    }

    /// Adds every requirement of `other`. Added to nothing, `other` is shared as it is (its
    /// keys are normalised already).
    pub fn add_all(&mut self, other: &Requirements) {
        if other.map.is_empty() || Shared::same(&self.map, &other.map) {
            return;
        }
        if self.map.is_empty() {
            self.map = other.map.clone();
            return;
        }
        for (k, r) in other.map.iter() {
            self.add(k, r.clone());
        }
    }

    /// Replaces the requirement on `key`.
    pub fn set(&mut self, key: &str, req: Requirement) {
        self.map.insert(labels::normalize_key(key).to_string(), req);
    }

    /// Removes the requirement on `key`.
    pub fn remove(&mut self, key: &str) -> Option<Requirement> {
        self.map.remove(key)
    }

    /// The requirement on `key`, `Exists` when undefined.
    pub fn get(&self, key: &str) -> &Requirement {
        self.map.get(key).unwrap_or(&EXISTS)
    }

    /// The requirement on `key` if defined.
    pub fn get_defined(&self, key: &str) -> Option<&Requirement> {
        self.map.get(key)
    }

    /// A mutable requirement on `key`, inserting `Exists` when undefined.
    pub fn get_mut(&mut self, key: &str) -> &mut Requirement {
        self.map.entry(labels::normalize_key(key).to_string()).or_insert_with(Requirement::exists)
    }

    /// Whether `key` is defined.
    pub fn has(&self, key: &str) -> bool {
        self.map.contains_key(key)
    }

    /// Iterates over `(key, requirement)` in key order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &Requirement)> {
        self.map.iter().map(|(k, r)| (k.as_str(), r))
    }

    /// The number of keys.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Whether no key is defined.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// Whether any requirement carries `minValues`.
    pub fn has_min_values(&self) -> bool {
        self.map.values().any(|r| r.min_values.is_some())
    }

    /// Karpenter's `Compatible`: whether `incoming` can be met alongside `self`.
    ///
    /// A custom key that `incoming` requires but `self` does not define is refused (unless
    /// `incoming` only excludes values); well-known keys may stay undefined on `self` when
    /// `allow_undefined_well_known` is set. Keys both define must share a value.
    pub fn compatible(
        &self,
        incoming: &Requirements,
        allow_undefined_well_known: bool,
    ) -> Result<(), IncompatibleError> {
        for (key, req) in incoming.map.iter() {
            if allow_undefined_well_known && labels::is_well_known(key) {
                continue;
            }
            let op = req.operator();
            if self.has(key) || op == Operator::NotIn || op == Operator::DoesNotExist {
                continue;
            }
            return Err(IncompatibleError::UnknownLabel {
                key: key.clone(),
                hint: self.label_hint(key, allow_undefined_well_known),
            });
        }
        self.intersects(incoming)
    }

    /// Whether [`Requirements::compatible`] holds.
    pub fn is_compatible(&self, incoming: &Requirements, allow_undefined_well_known: bool) -> bool {
        self.compatible(incoming, allow_undefined_well_known).is_ok()
    }

    fn label_hint(&self, key: &str, allow_undefined_well_known: bool) -> String {
        let suffix = key.split_once('/').map(|(_, s)| s).unwrap_or(key);
        let candidates = allow_undefined_well_known
            .then_some(labels::WELL_KNOWN)
            .into_iter()
            .flatten()
            .copied()
            .chain(self.map.keys().map(String::as_str));
        for known in candidates {
            if known.contains(key) || known.ends_with(suffix) {
                return format!(" (typo of {known:?}?)");
            }
        }
        String::new()
    }

    /// Karpenter's `Intersects`: every key both sides define must share a value, except
    /// that two exclusions (`NotIn`/`DoesNotExist`) never conflict.
    pub fn intersects(&self, incoming: &Requirements) -> Result<(), IncompatibleError> {
        let mut errs = Vec::new();
        let (small, large, self_is_small) = if self.map.len() <= incoming.map.len() {
            (&*self.map, &*incoming.map, true)
        } else {
            (&*incoming.map, &*self.map, false)
        };
        for (key, a) in small {
            let Some(b) = large.get(key) else { continue };
            let (existing, inc) = if self_is_small { (a, b) } else { (b, a) };
            if existing.has_intersection(inc) {
                continue;
            }
            let excl = |op: Operator| op == Operator::NotIn || op == Operator::DoesNotExist;
            if excl(inc.operator()) && excl(existing.operator()) {
                continue;
            }
            errs.push(format!("key {key}, {key} {inc} not in {key} {existing}"));
        }
        if errs.is_empty() { Ok(()) } else { Err(IncompatibleError::NoOverlap(errs)) }
    }

    /// The keys of `self` whose requirement is not exactly `base`'s: when something is
    /// known to intersect `base`, only these can keep it from intersecting `self`
    /// (`self` narrows `base` or adds keys to it).
    pub fn keys_beyond<'s>(&'s self, base: &Requirements) -> Vec<(&'s str, &'s Requirement)> {
        self.map.iter().filter(|(k, r)| base.map.get(k.as_str()) != Some(*r)).map(|(k, r)| (k.as_str(), r)).collect()
    }

    /// [`Requirements::intersects_ok`] on some keys of the incoming requirements only (see
    /// [`Requirements::keys_beyond`]).
    pub fn intersects_ok_on(&self, incoming: &[(&str, &Requirement)]) -> bool {
        incoming.iter().all(|(key, b)| {
            let Some(a) = self.map.get(*key) else { return true };
            if a.has_intersection(b) {
                return true;
            }
            let excl = |op: Operator| op == Operator::NotIn || op == Operator::DoesNotExist;
            excl(a.operator()) && excl(b.operator())
        })
    }

    /// Whether [`Requirements::intersects`] holds, without building messages.
    pub fn intersects_ok(&self, incoming: &Requirements) -> bool {
        let (small, large) = if self.map.len() <= incoming.map.len() {
            (&*self.map, &*incoming.map)
        } else {
            (&*incoming.map, &*self.map)
        };
        small.iter().all(|(key, a)| {
            let Some(b) = large.get(key) else { return true };
            if a.has_intersection(b) {
                return true;
            }
            let excl = |op: Operator| op == Operator::NotIn || op == Operator::DoesNotExist;
            excl(a.operator()) && excl(b.operator())
        })
    }
}

impl fmt::Display for Requirements {
    /// Karpenter's `Requirements.String()`: sorted, hostname left out.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut first = true;
        for (k, r) in self.map.iter() {
            if k == labels::HOSTNAME {
                continue;
            }
            if !first {
                f.write_str(", ")?;
            }
            first = false;
            write!(f, "{k} {r}")?;
        }
        Ok(())
    }
}

impl FromIterator<(String, Requirement)> for Requirements {
    fn from_iter<T: IntoIterator<Item = (String, Requirement)>>(iter: T) -> Self {
        let mut r = Requirements::new();
        for (k, v) in iter {
            r.add(&k, v);
        }
        r
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(op: Operator, vals: &[&str]) -> Requirement {
        let v: Vec<String> = vals.iter().map(|s| s.to_string()).collect();
        Requirement::new("k", op, &v).unwrap()
    }

    #[test]
    fn bounds_canonicalise() {
        let gt = req(Operator::Gt, &["4"]);
        assert!(!gt.has("4") && gt.has("5") && !gt.has("x"));
        let lt = req(Operator::Lt, &["4"]);
        assert!(lt.has("3") && !lt.has("4"));
        assert!(req(Operator::Gte, &["4"]).has("4"));
        assert!(req(Operator::Lte, &["4"]).has("4"));
        assert!(Requirement::new("k", Operator::Gt, &["x".into()]).is_err());
        assert!(Requirement::new("k", Operator::Gt, &[]).is_err());
    }

    #[test]
    fn intersections() {
        let a = req(Operator::In, &["a", "b", "c"]);
        let b = req(Operator::NotIn, &["b"]);
        let i = a.intersection(&b);
        assert_eq!(i.operator(), Operator::In);
        assert_eq!(i.values(), &["a".to_string(), "c".to_string()]);
        let g = req(Operator::In, &["3", "5", "7"]).intersection(&req(Operator::Gt, &["4"]));
        assert_eq!(g.values(), &["5".to_string(), "7".to_string()]);
        let empty = req(Operator::Gt, &["5"]).intersection(&req(Operator::Lt, &["3"]));
        assert_eq!(empty.operator(), Operator::DoesNotExist);
        let both = req(Operator::Gt, &["2"]).intersection(&req(Operator::Lt, &["9"]));
        assert!(both.has("5") && !both.has("9") && !both.has("2"));
    }

    #[test]
    fn compatibility_messages() {
        let mut node = Requirements::new();
        node.add(labels::ARCH, req(Operator::In, &["amd64"]));
        let mut pod = Requirements::new();
        pod.add(labels::ARCH, req(Operator::In, &["arm64"]));
        let err = node.compatible(&pod, true).unwrap_err();
        assert_eq!(
            err.to_string(),
            "key kubernetes.io/arch, kubernetes.io/arch In [arm64] not in kubernetes.io/arch In [amd64]"
        );
        let mut custom = Requirements::new();
        custom.add("team", req(Operator::In, &["a"]));
        assert_eq!(
            node.compatible(&custom, true).unwrap_err().to_string(),
            "label \"team\" does not have known values"
        );
        let mut excl = Requirements::new();
        excl.add("team", req(Operator::NotIn, &["a"]));
        assert!(node.compatible(&excl, true).is_ok(), "exclusions of undefined keys are fine");
        let mut typo = Requirements::new();
        typo.add("topology.kubernetes.io/zon", req(Operator::In, &["a"]));
        assert!(node.compatible(&typo, true).unwrap_err().to_string().contains("typo of"));
    }

    /// Copies share one map until one of them is written; a write that narrows nothing
    /// leaves it shared, and requirements added to none are shared as they are.
    #[test]
    fn copies_share_their_map_until_a_write_narrows_one() {
        let mut a = Requirements::new();
        a.add(labels::ARCH, req(Operator::In, &["amd64", "arm64"]));
        let mut b = a.clone();
        assert!(Shared::same(&a.map, &b.map));
        b.add(labels::ARCH, req(Operator::In, &["amd64", "arm64"]));
        assert!(Shared::same(&a.map, &b.map), "nothing narrowed");
        b.add(labels::ARCH, req(Operator::In, &["arm64"]));
        assert!(!Shared::same(&a.map, &b.map));
        assert_eq!(a.get(labels::ARCH).values(), ["amd64", "arm64"], "the other copy is as it was");
        assert_eq!(b.get(labels::ARCH).values(), ["arm64"]);
        let mut empty = Requirements::new();
        empty.add_all(&a);
        assert!(Shared::same(&empty.map, &a.map));
        let mut c = a.clone();
        c.add_all(&Requirements::new());
        c.add_all(&a);
        assert!(Shared::same(&c.map, &a.map));
        *c.get_mut("beta.kubernetes.io/arch") = req(Operator::In, &["amd64"]);
        assert_eq!(c.get(labels::ARCH).values(), ["amd64"], "a deprecated key is normalised when written");
        assert_eq!(a.get(labels::ARCH).values(), ["amd64", "arm64"]);
    }

    #[test]
    fn deprecated_keys_are_normalised() {
        let mut r = Requirements::new();
        r.add("beta.kubernetes.io/arch", req(Operator::In, &["amd64"]));
        assert!(r.has(labels::ARCH));
    }

    #[test]
    fn display_truncates_like_karpenter() {
        let r = req(Operator::In, &["a", "b", "c", "d", "e", "f", "g"]);
        assert_eq!(r.to_string(), "In [a b c d e and 2 others]");
    }
}
