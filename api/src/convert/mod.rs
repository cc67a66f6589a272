//! Conversion of Kubernetes-facing types into `dovetail-core` domain types, with errors
//! that name the object and the field.

mod nodeclaim;
mod nodeclass;
mod nodepool;
mod pod;
mod storage;

use std::collections::BTreeMap;

use dovetail_core::labels::{LabelSelector, SelectorOp, SelectorRequirement};
use dovetail_core::quantity::Quantity as CoreQuantity;
use dovetail_core::requirements::{Operator, Requirement, Requirements};
use dovetail_core::resources::{ResourceList, ResourceName};
use dovetail_core::taints::{Effect, Taint};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1 as meta;

pub use nodeclaim::{
    conditions_object, node_selector_requirements, nodeclaim, nodeclaim_from_object, nodeclaim_status_object,
    nodepool_status_object,
};
pub use nodeclass::{node_class_settings, validate_nodeclass};
pub use nodepool::{default_nodepool, nodepool};
pub use pod::{PodMeta, kept_annotation, node, owners, pod_from_spec, pod_object};
pub use storage::{class_topology, volume_claim, volume_topology};

/// A field of an object that could not be converted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{object}: {field}: {message}")]
pub struct ConversionError {
    /// `Kind namespace/name` or `Kind name`.
    pub object: String,
    /// The field path, e.g. `spec.template.spec.requirements[0].operator`.
    pub field: String,
    pub message: String,
}

/// Builds errors for one object.
#[derive(Clone, Debug)]
pub struct Ctx {
    pub object: String,
}

impl Ctx {
    /// A context naming an object.
    pub fn new(object: impl Into<String>) -> Self {
        Ctx { object: object.into() }
    }

    /// An error at `field`.
    pub fn err(&self, field: impl Into<String>, message: impl Into<String>) -> ConversionError {
        ConversionError { object: self.object.clone(), field: field.into(), message: message.into() }
    }
}

/// Parses a quantity string.
pub fn quantity(ctx: &Ctx, field: &str, q: &str) -> Result<CoreQuantity, ConversionError> {
    q.parse::<CoreQuantity>().map_err(|e| ctx.err(field, format!("invalid quantity {q:?}: {e}")))
}

/// Parses a resource map (`requests`, `limits`, `allocatable`, NodePool `limits`).
pub fn resource_list(
    ctx: &Ctx,
    field: &str,
    map: Option<&BTreeMap<String, Quantity>>,
) -> Result<ResourceList, ConversionError> {
    let mut out = ResourceList::new();
    for (name, q) in map.into_iter().flatten() {
        let parsed = quantity(ctx, &format!("{field}.{name}"), &q.0)?;
        let rn = ResourceName::parse(name);
        out.set(rn.clone(), rn.amount_of(&parsed));
    }
    Ok(out)
}

/// Converts `matchExpressions` into requirements, checking operators and values as the
/// API server and Karpenter do. `allow_bounds` admits `Gte`/`Lte` (Karpenter only).
pub fn requirements(
    ctx: &Ctx,
    field: &str,
    exprs: &[(String, String, Vec<String>, Option<i32>)],
    allow_bounds: bool,
) -> Result<Requirements, ConversionError> {
    let mut out = Requirements::new();
    for (i, (key, op, values, min_values)) in exprs.iter().enumerate() {
        let f = format!("{field}[{i}]");
        let operator = Operator::parse(op)
            .filter(|o| allow_bounds || !matches!(o, Operator::Gte | Operator::Lte))
            .ok_or_else(|| {
                ctx.err(
                    format!("{f}.operator"),
                    format!(
                        "unsupported operator {op:?}; expected one of In, NotIn, Exists, DoesNotExist, Gt, Lt{}",
                        if allow_bounds { ", Gte, Lte" } else { "" }
                    ),
                )
            })?;
        if key.is_empty() {
            return Err(ctx.err(format!("{f}.key"), "key must not be empty"));
        }
        match operator {
            Operator::In | Operator::NotIn if values.is_empty() => {
                return Err(ctx.err(format!("{f}.values"), format!("operator {op} needs at least one value")));
            }
            Operator::Exists | Operator::DoesNotExist if !values.is_empty() => {
                return Err(ctx.err(format!("{f}.values"), format!("operator {op} takes no values")));
            }
            _ => {}
        }
        let mut req =
            Requirement::new(key, operator, values).map_err(|e| ctx.err(format!("{f}.values"), e.to_string()))?;
        if allow_bounds
            && matches!(operator, Operator::Gt | Operator::Lt | Operator::Gte | Operator::Lte)
            && values.first().and_then(|v| v.parse::<i64>().ok()).is_some_and(|v| v < 0)
        {
            return Err(ctx.err(
                format!("{f}.values"),
                format!("key {key} with operator {op} must have a single positive integer value"),
            ));
        }
        if let Some(m) = min_values {
            if !(1..=50).contains(m) {
                return Err(ctx.err(format!("{f}.minValues"), format!("minValues must be between 1 and 50, got {m}")));
            }
            if operator == Operator::In && (*m as usize) > values.len() {
                return Err(ctx.err(
                    format!("{f}.minValues"),
                    format!(
                        "key {key} with operator In must have at least minValues ({m}) values, has {}",
                        values.len()
                    ),
                ));
            }
            req = req.with_min_values(Some(*m as u32));
        }
        out.add(key, req);
    }
    Ok(out)
}

/// Converts a label selector; `None` stays `None` (selects nothing).
pub fn label_selector(
    ctx: &Ctx,
    field: &str,
    s: Option<&meta::LabelSelector>,
) -> Result<Option<LabelSelector>, ConversionError> {
    let Some(s) = s else { return Ok(None) };
    let mut exprs = Vec::new();
    for (i, e) in s.match_expressions.iter().flatten().enumerate() {
        let op = match e.operator.as_str() {
            "In" => SelectorOp::In,
            "NotIn" => SelectorOp::NotIn,
            "Exists" => SelectorOp::Exists,
            "DoesNotExist" => SelectorOp::DoesNotExist,
            other => {
                return Err(ctx.err(
                    format!("{field}.matchExpressions[{i}].operator"),
                    format!("unsupported operator {other:?}; expected In, NotIn, Exists or DoesNotExist"),
                ));
            }
        };
        let values = e.values.clone().unwrap_or_default();
        if matches!(op, SelectorOp::In | SelectorOp::NotIn) && values.is_empty() {
            return Err(ctx.err(
                format!("{field}.matchExpressions[{i}].values"),
                format!("operator {} needs values", e.operator),
            ));
        }
        exprs.push(SelectorRequirement { key: e.key.clone(), op, values });
    }
    Ok(Some(LabelSelector::new(s.match_labels.clone().unwrap_or_default(), exprs)))
}

/// Converts a taint.
pub fn taint(ctx: &Ctx, field: &str, t: &k8s_openapi::api::core::v1::Taint) -> Result<Taint, ConversionError> {
    if t.key.is_empty() {
        return Err(ctx.err(format!("{field}.key"), "taint key must not be empty"));
    }
    let effect = Effect::parse(&t.effect).ok_or_else(|| {
        ctx.err(
            format!("{field}.effect"),
            format!("unknown effect {:?}; expected NoSchedule, PreferNoSchedule or NoExecute", t.effect),
        )
    })?;
    Ok(Taint { key: t.key.clone(), value: t.value.clone().unwrap_or_default(), effect })
}
