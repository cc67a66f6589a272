//! Launching by CreateFleet `instant`: idempotency lookup by the NodeClaim tag, one call per
//! group of identical requests (`TotalTargetCapacity` = the group's size), spot first with
//! `price-capacity-optimized`, then on-demand with `lowest-price`, fleet errors mapped to
//! [`CloudError`]s naming the offerings that failed.

use std::collections::{BTreeMap, HashMap};

use aws_sdk_ec2::types::{
    DefaultTargetCapacityType, Filter, FleetLaunchTemplateConfigRequest, FleetLaunchTemplateOverridesRequest,
    FleetLaunchTemplateSpecificationRequest, FleetOnDemandAllocationStrategy, FleetType, InstanceLifecycle,
    OnDemandOptionsRequest, ResourceType, SpotAllocationStrategy, SpotOptionsRequest, Tag, TagSpecification,
    TargetCapacitySpecificationRequest,
};
use dovetail_core::catalog::CapacityType;

use super::errors::{CAPACITY_CODES, from_code, from_sdk};
use super::{AwsProvider, Fnv, Resolved, TAG_NODECLASS, TAG_NODECLASS_HASH, Types};
use crate::types::{assign_untagged, group_identical, type_labels};
use crate::{
    CloudError, Instance, InstanceState, LaunchBatch, LaunchRequest, Lookup, OfferingKey, TAG_LAUNCH_BATCH,
    TAG_NODECLAIM, TAG_NODEPOOL,
};

/// See [`crate::CloudProvider::launch`].
pub(super) async fn launch(p: &AwsProvider, requests: &[LaunchRequest]) -> Vec<Result<Instance, CloudError>> {
    if requests.is_empty() {
        return Vec::new();
    }
    let types = match p.types().await {
        Ok(t) => t,
        Err(e) => return requests.iter().map(|_| Err(e.clone())).collect(),
    };
    // Emulators ignore client tokens, and a crash can leave a batch's instances without their
    // claim tags: look them up by claim and by batch first.
    let lookups: Vec<Lookup> =
        requests.iter().map(|r| Lookup { claim: r.claim.clone(), batch: Some(r.batch.clone()) }).collect();
    let found = find(p, &types, &lookups).await;
    let mut out: Vec<Option<Result<Instance, CloudError>>> = found
        .into_iter()
        .map(|r| match r {
            Ok(Some(inst)) => Some(Ok(inst)),
            Ok(None) => None,
            Err(e) => Some(Err(e)),
        })
        .collect();
    for g in group_identical(requests, |i| out[i].is_none()) {
        let group: Vec<&LaunchRequest> = g.iter().map(|&i| &requests[i]).collect();
        for (i, result) in g.iter().zip(launch_group(p, &types, &group).await) {
            out[*i] = Some(result);
        }
    }
    out.into_iter().map(|r| r.unwrap_or_else(|| Err(CloudError::Transient { message: "no result".into() }))).collect()
}

/// See [`crate::CloudProvider::find`]: instances by their claim tag, then each batch's
/// instances that no claim tag names yet, assigned to its claims without one (and tagged).
pub(super) async fn find(
    p: &AwsProvider,
    types: &Types,
    lookups: &[Lookup],
) -> Vec<Result<Option<Instance>, CloudError>> {
    let mut out: Vec<Option<Result<Option<Instance>, CloudError>>> = vec![None; lookups.len()];
    let live = |i: &Instance| matches!(i.state, InstanceState::Pending | InstanceState::Running);
    let claims: Vec<String> = lookups.iter().map(|l| l.claim.clone()).collect();
    for chunk in claims.chunks(super::DESCRIBE_IDS_MAX) {
        let filter = Filter::builder().name(format!("tag:{TAG_NODECLAIM}")).set_values(Some(chunk.to_vec())).build();
        match p.describe(vec![filter]).await {
            Ok(found) => {
                for inst in found.iter().filter_map(|i| p.view(types, i)).filter(live) {
                    for (i, l) in lookups.iter().enumerate() {
                        if out[i].is_none() && inst.claim.as_deref() == Some(l.claim.as_str()) {
                            out[i] = Some(Ok(Some(inst.clone())));
                        }
                    }
                }
            }
            Err(e) => {
                for (i, l) in lookups.iter().enumerate() {
                    if chunk.contains(&l.claim) {
                        out[i] = Some(Err(e.clone()));
                    }
                }
            }
        }
    }
    // The batches of the claims still without an instance.
    let mut batches: Vec<&LaunchBatch> = Vec::new();
    for (i, l) in lookups.iter().enumerate() {
        if let (None, Some(b)) = (&out[i], &l.batch)
            && !batches.iter().any(|x| x.id == b.id)
        {
            batches.push(b);
        }
    }
    for batch in batches {
        let filter = Filter::builder().name(format!("tag:{TAG_LAUNCH_BATCH}")).values(&batch.id).build();
        let found = match p.describe(vec![filter]).await {
            Ok(found) => found,
            Err(e) => {
                for (i, l) in lookups.iter().enumerate() {
                    if out[i].is_none() && l.batch.as_ref().is_some_and(|b| b.id == batch.id) {
                        out[i] = Some(Err(e.clone()));
                    }
                }
                continue;
            }
        };
        let insts: Vec<Instance> = found.iter().filter_map(|i| p.view(types, i)).filter(live).collect();
        let tagged: Vec<&str> = insts.iter().filter_map(|i| i.claim.as_deref()).collect();
        let untagged: Vec<&Instance> = insts.iter().filter(|i| i.claim.is_none()).collect();
        let ids: Vec<&str> = untagged.iter().map(|i| i.id.as_str()).collect();
        for (k, claim) in assign_untagged(batch, |c| tagged.contains(&c), &ids) {
            let mut inst = untagged[k].clone();
            tag_claim(p, &inst.id, claim).await;
            inst.claim = Some(claim.to_string());
            inst.tags.insert(TAG_NODECLAIM.into(), claim.to_string());
            p.count(|s| s.adopted += 1);
            for (i, l) in lookups.iter().enumerate() {
                if out[i].is_none() && l.claim == claim {
                    out[i] = Some(Ok(Some(inst.clone())));
                }
            }
        }
    }
    out.into_iter().map(|r| r.unwrap_or(Ok(None))).collect()
}

/// Tags an instance with its claim. A failure is logged and counted, not fatal: the instance
/// is the claim's by the launch's answer, and its batch tag finds it again on a re-drive.
async fn tag_claim(p: &AwsProvider, instance: &str, claim: &str) {
    p.count(|s| s.create_tags_calls += 1);
    let call = p.ec2.create_tags().resources(instance).tags(Tag::builder().key(TAG_NODECLAIM).value(claim).build());
    if let Err(e) = call.send().await.map_err(|e| from_sdk("CreateTags", e)) {
        p.count(|s| s.tag_errors += 1);
        tracing::warn!(instance, nodeclaim = claim, error = %e, "tagging an instance with its nodeclaim failed; its launch batch tag still finds it");
    }
}

/// One candidate override: a type in the zone's subnet with its price and image.
struct Candidate {
    instance_type: String,
    price: f64,
    template: String,
}

/// Launches a group of identical requests; one result per request, in order.
async fn launch_group(p: &AwsProvider, types: &Types, group: &[&LaunchRequest]) -> Vec<Result<Instance, CloudError>> {
    let first = group[0];
    let fail = |e: CloudError| group.iter().map(|_| Err(e.clone())).collect::<Vec<_>>();
    let resolved = match p.resolve(&first.node_class).await {
        Ok(r) => r,
        Err(e) => return fail(e),
    };
    let Some((subnet, _)) = resolved.subnets.iter().find(|(_, z)| *z == first.zone) else {
        return fail(CloudError::NodeClassNotReady {
            node_class: first.node_class.name.clone(),
            reason: format!("no selected subnet in zone {}", first.zone),
        });
    };
    let order: Vec<CapacityType> = [CapacityType::Spot, CapacityType::OnDemand]
        .into_iter()
        .filter(|c| first.capacity_types.is_empty() || first.capacity_types.contains(c))
        .collect();
    let mut results: Vec<Option<Result<Instance, CloudError>>> = vec![None; group.len()];
    let mut tried: Vec<OfferingKey> = Vec::new();
    let mut other: Option<CloudError> = None;
    for ct in order {
        // In the batch's claim order: paired with the instances by id, as every re-drive pairs
        // a batch's untagged instances (`assign_untagged`).
        let mut pending: Vec<usize> = (0..group.len()).filter(|&i| results[i].is_none()).collect();
        let position = |c: &str| first.batch.claims.iter().position(|x| x == c).unwrap_or(usize::MAX);
        pending.sort_by_key(|&i| (position(&group[i].claim), i));
        if pending.is_empty() {
            break;
        }
        let candidates = match candidates(p, types, first, &resolved, ct).await {
            Ok(c) => c,
            Err(e) => return fail(e),
        };
        if candidates.is_empty() {
            continue;
        }
        let claims: Vec<&str> = pending.iter().map(|&i| group[i].claim.as_str()).collect();
        match create_fleet(p, first, subnet, ct, &candidates, &claims).await {
            Err(e) => {
                for &i in &pending {
                    results[i] = Some(Err(e.clone()));
                }
                return results
                    .into_iter()
                    .map(|r| r.unwrap_or_else(|| Err(CloudError::Transient { message: "no result".into() })))
                    .collect();
            }
            Ok(fleet) => {
                tried.extend(fleet.failed);
                if other.is_none() {
                    other = fleet.other;
                }
                for (&i, launched) in pending.iter().zip(fleet.launched) {
                    let price = candidates.iter().find(|c| c.instance_type == launched.instance_type).map(|c| c.price);
                    results[i] = Some(Ok(instance(p, types, group[i], &resolved, launched, price.unwrap_or(0.0))));
                }
            }
        }
    }
    let leftover = match (tried.is_empty(), other) {
        (true, Some(e)) => e,
        (true, None) => CloudError::InsufficientCapacity {
            offerings: first
                .instance_types
                .iter()
                .flat_map(|t| {
                    [CapacityType::Spot, CapacityType::OnDemand]
                        .into_iter()
                        .filter(|c| first.capacity_types.is_empty() || first.capacity_types.contains(c))
                        .map(|ct| OfferingKey { instance_type: t.clone(), zone: first.zone.clone(), capacity_type: ct })
                })
                .collect(),
        },
        (false, _) => {
            tried.sort();
            tried.dedup();
            CloudError::InsufficientCapacity { offerings: tried }
        }
    };
    results.into_iter().map(|r| r.unwrap_or_else(|| Err(leftover.clone()))).collect()
}

/// The request's types offered in its zone at `ct`, cheapest first, at most `max_fleet_types`,
/// each with the launch template of its architecture's image.
async fn candidates(
    p: &AwsProvider,
    types: &Types,
    r: &LaunchRequest,
    resolved: &Resolved,
    ct: CapacityType,
) -> Result<Vec<Candidate>, CloudError> {
    let mut priced: Vec<(String, f64, String)> = Vec::new();
    for name in &r.instance_types {
        let Some(t) = types.by_name.get(name) else { continue };
        let Some(o) = t.offerings.iter().find(|o| o.zone == r.zone && o.capacity_type == ct && o.available) else {
            continue;
        };
        let arch = t.requirements.get(dovetail_core::labels::ARCH).any().unwrap_or_default();
        let Some((image, _)) = resolved.images.iter().find(|(_, a)| *a == arch) else { continue };
        priced.push((name.clone(), o.price, image.clone()));
    }
    priced.sort_by(|a, b| a.1.total_cmp(&b.1).then_with(|| a.0.cmp(&b.0)));
    priced.truncate(p.cfg.max_fleet_types);
    let mut templates: HashMap<String, String> = HashMap::new();
    let mut out = Vec::with_capacity(priced.len());
    for (instance_type, price, image) in priced {
        let template = match templates.get(&image) {
            Some(t) => t.clone(),
            None => {
                let t = p.template(r, resolved, &image).await?;
                templates.insert(image.clone(), t.clone());
                t
            }
        };
        out.push(Candidate { instance_type, price, template });
    }
    Ok(out)
}

/// What CreateFleet returned.
struct Fleet {
    launched: Vec<Launched>,
    /// Offerings that failed for capacity.
    failed: Vec<OfferingKey>,
    /// The first error that was not about capacity.
    other: Option<CloudError>,
}

struct Launched {
    id: String,
    instance_type: String,
    zone: String,
    capacity_type: CapacityType,
}

/// The client token of a call, derived from its launch batch: the same batch's same claims at
/// the same capacity type with the same parameters give the same token (so EC2 answers a
/// repeated call with the first call's instances); a regrouped re-drive, or one whose
/// parameters changed (fewer candidates after ICE marks, another term's tag), gets another
/// (EC2 refuses a token reused with other parameters), and the batch's tag finds what the
/// first call made.
fn client_token(batch: &str, claims: &[&str], ct: CapacityType, params: &str) -> String {
    let mut sorted = claims.to_vec();
    sorted.sort_unstable();
    let mut h = Fnv::default();
    h.write(batch.as_bytes());
    h.write(&[0]);
    for c in &sorted {
        h.write(c.as_bytes());
        h.write(&[0]);
    }
    h.write(ct.as_str().as_bytes());
    h.write(&[0]);
    h.write(params.as_bytes());
    format!("dovetail-{:016x}-{}", h.finish(), sorted.len())
}

/// The tags every instance of a request gets (the claim's own is added per instance).
fn tags(p: &AwsProvider, r: &LaunchRequest) -> BTreeMap<String, String> {
    let mut tags = r.node_class.tags.clone();
    tags.extend(r.tags.iter().map(|(k, v)| (k.clone(), v.clone())));
    tags.insert(p.cluster_tag(), "owned".into());
    tags.insert(TAG_NODEPOOL.into(), r.nodepool.clone());
    tags.insert(TAG_NODECLASS.into(), r.node_class.name.clone());
    tags.insert(TAG_NODECLASS_HASH.into(), r.node_class.hash.clone());
    tags.insert(TAG_LAUNCH_BATCH.into(), r.batch.id.clone());
    tags
}

async fn create_fleet(
    p: &AwsProvider,
    r: &LaunchRequest,
    subnet: &str,
    ct: CapacityType,
    candidates: &[Candidate],
    claims: &[&str],
) -> Result<Fleet, CloudError> {
    let mut configs: Vec<FleetLaunchTemplateConfigRequest> = Vec::new();
    let mut by_template: Vec<(&str, Vec<&Candidate>)> = Vec::new();
    for c in candidates {
        match by_template.iter_mut().find(|(t, _)| *t == c.template) {
            Some((_, v)) => v.push(c),
            None => by_template.push((&c.template, vec![c])),
        }
    }
    for (template, cs) in by_template {
        let mut cfg = FleetLaunchTemplateConfigRequest::builder().launch_template_specification(
            FleetLaunchTemplateSpecificationRequest::builder()
                .launch_template_name(template)
                .version("$Latest")
                .build(),
        );
        for c in cs {
            cfg = cfg.overrides(
                FleetLaunchTemplateOverridesRequest::builder()
                    .instance_type(c.instance_type.as_str().into())
                    .subnet_id(subnet)
                    .availability_zone(&r.zone)
                    .build(),
            );
        }
        configs.push(cfg.build());
    }
    let mut tags = tags(p, r);
    if claims.len() == 1 {
        tags.insert(TAG_NODECLAIM.into(), claims[0].to_string());
    }
    // Everything else the call sends, for its client token.
    let mut params = format!("{subnet}|{}|", r.zone);
    for c in candidates {
        params.push_str(&format!("{}@{},", c.instance_type, c.template));
    }
    for (k, v) in &tags {
        params.push_str(&format!("|{k}={v}"));
    }
    let tag_list: Vec<Tag> = tags.iter().map(|(k, v)| Tag::builder().key(k).value(v).build()).collect();
    let target = TargetCapacitySpecificationRequest::builder()
        .total_target_capacity(claims.len() as i32)
        .default_target_capacity_type(match ct {
            CapacityType::Spot => DefaultTargetCapacityType::Spot,
            _ => DefaultTargetCapacityType::OnDemand,
        })
        .build();
    let mut call = p
        .ec2
        .create_fleet()
        .r#type(FleetType::Instant)
        .client_token(client_token(&r.batch.id, claims, ct, &params))
        .set_launch_template_configs(Some(configs))
        .target_capacity_specification(target)
        .tag_specifications(
            TagSpecification::builder().resource_type(ResourceType::Instance).set_tags(Some(tag_list.clone())).build(),
        )
        .tag_specifications(
            TagSpecification::builder().resource_type(ResourceType::Volume).set_tags(Some(tag_list)).build(),
        );
    call = match ct {
        CapacityType::Spot => call.spot_options(
            SpotOptionsRequest::builder().allocation_strategy(SpotAllocationStrategy::PriceCapacityOptimized).build(),
        ),
        _ => call.on_demand_options(
            OnDemandOptionsRequest::builder().allocation_strategy(FleetOnDemandAllocationStrategy::LowestPrice).build(),
        ),
    };
    p.count(|s| s.fleet_calls += 1);
    // Inside a traced decision (the zone's launch), the call is a span of its trace with
    // EC2's request id.
    let span = if tracing::Span::current().is_none() {
        tracing::Span::none()
    } else {
        tracing::info_span!(
            "cloud.create_fleet",
            zone = %r.zone,
            capacity_type = %ct,
            claims = claims.len(),
            request_id = tracing::field::Empty,
            instances = tracing::field::Empty,
            error = tracing::field::Empty,
        )
    };
    let sent = tracing::Instrument::instrument(call.send(), span.clone()).await;
    {
        use aws_sdk_ec2::operation::RequestId as _;
        match &sent {
            Ok(resp) => {
                span.record("request_id", resp.request_id().unwrap_or_default());
                span.record("instances", resp.instances().iter().map(|i| i.instance_ids().len()).sum::<usize>());
            }
            Err(e) => {
                span.record("request_id", e.request_id().unwrap_or_default());
                span.record("error", e.to_string());
            }
        }
    }
    let resp = sent.map_err(|e| from_sdk("CreateFleet", e))?;

    let mut failed = Vec::new();
    let mut other = None;
    for e in resp.errors() {
        let code = e.error_code().unwrap_or_default();
        let o = e.launch_template_and_overrides().and_then(|l| l.overrides());
        let lifecycle = match e.lifecycle() {
            Some(InstanceLifecycle::Spot) => CapacityType::Spot,
            Some(InstanceLifecycle::OnDemand) => CapacityType::OnDemand,
            _ => ct,
        };
        if CAPACITY_CODES.contains(&code) {
            match o.and_then(|o| o.instance_type()) {
                Some(t) => failed.push(OfferingKey {
                    instance_type: t.as_str().to_string(),
                    zone: o.and_then(|o| o.availability_zone()).unwrap_or(&r.zone).to_string(),
                    capacity_type: lifecycle,
                }),
                // No override named: every candidate failed.
                None => failed.extend(candidates.iter().map(|c| OfferingKey {
                    instance_type: c.instance_type.clone(),
                    zone: r.zone.clone(),
                    capacity_type: lifecycle,
                })),
            }
        } else if other.is_none() {
            other = Some(from_code("CreateFleet", Some(code), e.error_message().unwrap_or_default()));
        }
    }
    let mut launched = Vec::new();
    for i in resp.instances() {
        let o = i.launch_template_and_overrides().and_then(|l| l.overrides());
        let instance_type = i
            .instance_type()
            .map(|t| t.as_str().to_string())
            .or_else(|| o.and_then(|o| o.instance_type()).map(|t| t.as_str().to_string()))
            .unwrap_or_else(|| candidates[0].instance_type.clone());
        let zone = o.and_then(|o| o.availability_zone()).unwrap_or(&r.zone).to_string();
        let capacity_type = match i.lifecycle() {
            Some(InstanceLifecycle::Spot) => CapacityType::Spot,
            Some(InstanceLifecycle::OnDemand) => CapacityType::OnDemand,
            _ => ct,
        };
        for id in i.instance_ids() {
            launched.push(Launched {
                id: id.clone(),
                instance_type: instance_type.clone(),
                zone: zone.clone(),
                capacity_type,
            });
        }
    }
    // Instances by id, claims in the batch's order: the same pairing a re-drive makes of a
    // batch's untagged instances.
    launched.sort_by(|a, b| a.id.cmp(&b.id));
    launched.truncate(claims.len());
    if launched.is_empty() && failed.is_empty() && other.is_none() {
        // EC2 launched nothing and said nothing: every candidate is out of capacity.
        failed.extend(candidates.iter().map(|c| OfferingKey {
            instance_type: c.instance_type.clone(),
            zone: r.zone.clone(),
            capacity_type: ct,
        }));
    }
    // A merged call tags each instance with its claim afterwards (one value per instance cannot
    // ride in the fleet's tag specification), at most 8 calls in flight. Every instance carries
    // the batch tag already, so one whose claim tag is never written (a crash, a failed call)
    // is found by the next launch or lookup of its batch and assigned then.
    if claims.len() > 1 {
        let mut tagging = tokio::task::JoinSet::new();
        for (l, claim) in launched.iter().zip(claims) {
            if tagging.len() >= p.cfg.tag_concurrency.max(1)
                && let Some(Err(e)) = tagging.join_next().await
            {
                tracing::warn!(error = %e, "a tagging task failed");
            }
            p.count(|s| s.create_tags_calls += 1);
            let call =
                p.ec2.create_tags().resources(&l.id).tags(Tag::builder().key(TAG_NODECLAIM).value(*claim).build());
            let (instance, claim) = (l.id.clone(), claim.to_string());
            tagging.spawn(async move { (instance, claim, call.send().await.map_err(|e| from_sdk("CreateTags", e))) });
        }
        while let Some(done) = tagging.join_next().await {
            match done {
                Ok((_, _, Ok(_))) => {}
                Ok((instance, claim, Err(e))) => {
                    p.count(|s| s.tag_errors += 1);
                    tracing::warn!(instance, nodeclaim = claim, error = %e, "tagging an instance with its nodeclaim failed; its launch batch tag still finds it");
                }
                Err(e) => tracing::warn!(error = %e, "a tagging task failed"),
            }
        }
    }
    Ok(Fleet { launched, failed, other })
}

/// The domain view of a just-launched instance (no describe needed).
fn instance(
    p: &AwsProvider,
    types: &Types,
    r: &LaunchRequest,
    resolved: &Resolved,
    l: Launched,
    price: f64,
) -> Instance {
    let it = types.by_name.get(&l.instance_type);
    let arch = it.and_then(|t| t.requirements.get(dovetail_core::labels::ARCH).any()).unwrap_or_default();
    let mut labels = it.map(type_labels).unwrap_or_default();
    labels.extend(r.labels.iter().map(|(k, v)| (k.clone(), v.clone())));
    labels.insert(dovetail_core::labels::INSTANCE_TYPE.into(), l.instance_type.clone());
    labels.insert(dovetail_core::labels::ZONE.into(), l.zone.clone());
    labels.insert(dovetail_core::labels::CAPACITY_TYPE.into(), l.capacity_type.as_str().into());
    labels.insert(dovetail_core::labels::NODEPOOL.into(), r.nodepool.clone());
    let mut tags = tags(p, r);
    tags.insert(TAG_NODECLAIM.into(), r.claim.clone());
    let launched_at = p.clock.now();
    Instance {
        id: l.id,
        claim: Some(r.claim.clone()),
        capacity: it.map(|t| t.capacity.clone()).unwrap_or_default(),
        allocatable: it.map(|t| t.allocatable.clone()).unwrap_or_default(),
        instance_type: l.instance_type,
        zone: l.zone,
        capacity_type: l.capacity_type,
        price,
        labels,
        state: InstanceState::Pending,
        launched_at,
        tags,
        image: resolved.images.iter().find(|(_, a)| *a == arch).map(|(i, _)| i.clone()).unwrap_or_default(),
        node_class_hash: r.node_class.hash.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_batch_and_claims_give_the_same_token_in_any_order() {
        let a = client_token("b1", &["b", "a"], CapacityType::Spot, "p");
        assert_eq!(a, client_token("b1", &["a", "b"], CapacityType::Spot, "p"));
        assert_ne!(a, client_token("b1", &["a", "b"], CapacityType::OnDemand, "p"));
        assert_ne!(a, client_token("b1", &["a", "c"], CapacityType::Spot, "p"));
        assert_ne!(a, client_token("b2", &["a", "b"], CapacityType::Spot, "p"), "another batch");
        assert_ne!(a, client_token("b1", &["a", "b"], CapacityType::Spot, "q"), "other parameters");
        assert!(a.len() <= 64);
    }
}
