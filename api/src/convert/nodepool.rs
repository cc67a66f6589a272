//! NodePool validation and conversion, with Karpenter's rules.

use dovetail_core::labels;
use dovetail_core::nodepool::{
    self, Budget, BudgetNodes, ConsolidationPolicy, Disruption, DisruptionReason, NodeClassRef, NodePool,
};
use dovetail_core::requirements::Operator;
use dovetail_core::resources::ResourceList;

use super::{ConversionError, Ctx, requirements, resource_list, taint};
use crate::crd;

fn duration(
    ctx: &Ctx,
    field: &str,
    v: Option<&String>,
    default: Option<std::time::Duration>,
) -> Result<Option<std::time::Duration>, ConversionError> {
    match v {
        None => Ok(default),
        Some(s) => nodepool::parse_duration(s).map_err(|e| ctx.err(field, e)),
    }
}

/// Validates and converts a NodePool.
pub fn nodepool(np: &crd::NodePool) -> Result<NodePool, ConversionError> {
    let name = np.metadata.name.clone().unwrap_or_default();
    let ctx = Ctx::new(format!("NodePool {name:?}"));
    if name.is_empty() {
        return Err(ctx.err("metadata.name", "a NodePool needs a name"));
    }
    let spec = &np.spec;
    if spec.replicas.is_some() {
        return Err(ctx.err("spec.replicas", "static NodePools (spec.replicas) are not supported yet"));
    }
    let weight = spec.weight.unwrap_or(0);
    if spec.weight.is_some() && !(1..=100).contains(&weight) {
        return Err(ctx.err("spec.weight", format!("weight must be in 1..100, got {weight}")));
    }
    let tspec = &spec.template.spec;
    let r = &tspec.node_class_ref;
    if r.name.is_empty() || r.kind.is_empty() || r.group.is_empty() {
        return Err(ctx.err("spec.template.spec.nodeClassRef", "group, kind and name are required"));
    }
    let field = "spec.template.spec.requirements";
    if tspec.requirements.len() > 100 {
        return Err(ctx.err(field, "at most 100 requirements"));
    }
    let exprs: Vec<_> = tspec
        .requirements
        .iter()
        .map(|r| (r.key.clone(), r.operator.clone(), r.values.clone().unwrap_or_default(), r.min_values))
        .collect();
    for (i, (key, op, values, _)) in exprs.iter().enumerate() {
        let key = labels::normalize_key(key);
        if let Some(reason) = labels::restricted_label_reason(key) {
            return Err(ctx.err(format!("{field}[{i}].key"), reason));
        }
        if let Some(e) = labels::qualified_name_error(key) {
            return Err(ctx.err(format!("{field}[{i}].key"), format!("key {key} is not a qualified name, {e}")));
        }
        for v in values {
            if let Some(e) = labels::label_value_error(v) {
                return Err(ctx.err(format!("{field}[{i}].values"), format!("invalid value {v} for key {key}, {e}")));
            }
        }
        if key == labels::CAPACITY_TYPE
            && op == "In"
            && !values.iter().any(|v| matches!(v.as_str(), "spot" | "on-demand" | "reserved"))
        {
            return Err(ctx.err(
                format!("{field}[{i}].values"),
                format!("no valid values found in {values:?} for {key}, expected one of: [on-demand spot reserved]"),
            ));
        }
    }
    let reqs = requirements(&ctx, field, &exprs, true)?;
    for (key, req) in reqs.iter() {
        if req.operator() == Operator::DoesNotExist && req.min_values.is_some() {
            return Err(ctx.err(field, format!("key {key}: minValues needs values to choose from")));
        }
    }

    let meta = spec.template.metadata.clone().unwrap_or_default();
    let template_labels = meta.labels.unwrap_or_default();
    for key in template_labels.keys() {
        if let Some(reason) = labels::restricted_label_reason(key) {
            return Err(ctx.err(format!("spec.template.metadata.labels.{key}"), reason));
        }
    }
    let mut taints = Vec::new();
    let mut startup_taints = Vec::new();
    let mut seen = std::collections::BTreeSet::new();
    for (list, fname) in [(&tspec.taints, "taints"), (&tspec.startup_taints, "startupTaints")] {
        for (i, t) in list.iter().flatten().enumerate() {
            let f = format!("spec.template.spec.{fname}[{i}]");
            let core_taint = taint(&ctx, &f, t)?;
            if !seen.insert((core_taint.key.clone(), core_taint.effect)) {
                return Err(ctx.err(
                    f,
                    format!("duplicate taint Key/Effect pair {}={}", core_taint.key, core_taint.effect.as_str()),
                ));
            }
            if fname == "taints" { taints.push(core_taint) } else { startup_taints.push(core_taint) }
        }
    }
    let limits: ResourceList = resource_list(&ctx, "spec.limits", spec.limits.as_ref())?;
    for (n, v) in limits.iter() {
        if v < 0 {
            return Err(ctx.err(format!("spec.limits.{n}"), "limits must not be negative"));
        }
    }
    let expire_after = duration(
        &ctx,
        "spec.template.spec.expireAfter",
        tspec.expire_after.as_ref(),
        Some(nodepool::DEFAULT_EXPIRE_AFTER),
    )?;
    let termination_grace_period = match &tspec.termination_grace_period {
        None => None,
        Some(s) => nodepool::parse_duration(s)
            .map_err(|e| ctx.err("spec.template.spec.terminationGracePeriod", e))?
            .ok_or_else(|| ctx.err("spec.template.spec.terminationGracePeriod", "Never is not allowed here"))
            .map(Some)?,
    };
    let mut disruption = disruption(&ctx, spec.disruption.as_ref())?;
    let rate = dovetail_core::disruption::budget::RATE_ANNOTATION;
    if let Some(v) = np.metadata.annotations.as_ref().and_then(|a| a.get(rate)) {
        let parsed = dovetail_core::disruption::budget::Rate::parse(v)
            .map_err(|e| ctx.err(format!("metadata.annotations[{rate}]"), e))?;
        disruption.rate = Some(parsed);
    }
    Ok(NodePool {
        name,
        weight,
        labels: template_labels,
        annotations: meta.annotations.unwrap_or_default(),
        requirements: reqs,
        taints,
        startup_taints,
        limits,
        node_class: NodeClassRef { group: r.group.clone(), kind: r.kind.clone(), name: r.name.clone() },
        expire_after,
        termination_grace_period,
        disruption,
    })
}

fn disruption(ctx: &Ctx, d: Option<&crd::nodepool::Disruption>) -> Result<Disruption, ConversionError> {
    let mut out = Disruption::default();
    let Some(d) = d else { return Ok(out) };
    if let Some(p) = &d.consolidation_policy {
        out.consolidation_policy = match p.as_str() {
            "WhenEmpty" => ConsolidationPolicy::WhenEmpty,
            "WhenEmptyOrUnderutilized" => ConsolidationPolicy::WhenEmptyOrUnderutilized,
            "Balanced" => ConsolidationPolicy::Balanced,
            o => {
                return Err(ctx.err(
                    "spec.disruption.consolidationPolicy",
                    format!("unknown policy {o:?}; expected WhenEmpty, WhenEmptyOrUnderutilized or Balanced"),
                ));
            }
        };
    }
    out.consolidate_after = duration(
        ctx,
        "spec.disruption.consolidateAfter",
        d.consolidate_after.as_ref(),
        Some(std::time::Duration::ZERO),
    )?;
    if let Some(budgets) = &d.budgets {
        if budgets.len() > 50 {
            return Err(ctx.err("spec.disruption.budgets", "at most 50 budgets"));
        }
        out.budgets = Vec::new();
        for (i, b) in budgets.iter().enumerate() {
            let f = format!("spec.disruption.budgets[{i}]");
            let nodes_s = b.nodes.clone().unwrap_or_else(|| "10%".into());
            let nodes = if let Some(p) = nodes_s.strip_suffix('%') {
                match p.parse::<u8>() {
                    Ok(p) if p <= 100 => BudgetNodes::Percent(p),
                    _ => return Err(ctx.err(format!("{f}.nodes"), format!("{nodes_s:?} is not a percentage 0%..100%"))),
                }
            } else {
                BudgetNodes::Count(nodes_s.parse().map_err(|_| {
                    ctx.err(format!("{f}.nodes"), format!("{nodes_s:?} is neither a count nor a percentage"))
                })?)
            };
            if b.schedule.is_some() != b.duration.is_some() {
                return Err(ctx.err(f.clone(), "schedule and duration must be set together"));
            }
            let duration = match &b.duration {
                None => None,
                Some(s) => nodepool::parse_duration(s).map_err(|e| ctx.err(format!("{f}.duration"), e))?,
            };
            let mut reasons = Vec::new();
            for (j, r) in b.reasons.iter().flatten().enumerate() {
                reasons.push(match r.as_str() {
                    "Underutilized" => DisruptionReason::Underutilized,
                    "Empty" => DisruptionReason::Empty,
                    "Drifted" => DisruptionReason::Drifted,
                    o => {
                        return Err(ctx.err(
                            format!("{f}.reasons[{j}]"),
                            format!("unknown reason {o:?}; expected Underutilized, Empty or Drifted"),
                        ));
                    }
                });
            }
            out.budgets.push(Budget { nodes, schedule: b.schedule.clone(), duration, reasons });
        }
    }
    Ok(out)
}

/// Karpenter's getting-started NodePool, used when the input has none: amd64 Linux
/// on-demand c/m/r instances of generation 3 or later.
pub fn default_nodepool() -> NodePool {
    use dovetail_core::requirements::{Requirement, Requirements};
    let mut r = Requirements::new();
    r.add(labels::ARCH, Requirement::is_in(["amd64"]));
    r.add(labels::OS, Requirement::is_in(["linux"]));
    r.add(labels::CAPACITY_TYPE, Requirement::is_in(["on-demand"]));
    r.add(labels::INSTANCE_CATEGORY, Requirement::is_in(["c", "m", "r"]));
    r.add(
        labels::INSTANCE_GENERATION,
        Requirement::new(labels::INSTANCE_GENERATION, Operator::Gt, &["2".to_string()])
            .expect("invariant: 2 is an integer"),
    );
    NodePool::new("default", r)
}
