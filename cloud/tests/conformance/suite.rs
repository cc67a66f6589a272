//! The checks, generic over a harness that gives a provider, its queue and its fault knobs.

use std::collections::BTreeMap;
use std::time::Duration;

use dovetail_cloud::{
    CloudError, CloudProvider, InstanceState, InterruptionQueue, LaunchBatch, LaunchRequest, Lookup, NodeClass,
    OfferingKey, TAG_CLUSTER_PREFIX, TAG_LAUNCH_BATCH, TAG_NODECLAIM, TAG_NODEPOOL,
};
use dovetail_core::catalog::CapacityType;

/// What a provider under test offers the suite.
pub trait Harness {
    fn cloud(&self) -> &dyn CloudProvider;
    fn queue(&self) -> &dyn InterruptionQueue;
    /// The cluster name its instances are tagged for.
    fn cluster(&self) -> &str;
    /// A zone it launches in.
    fn zone(&self) -> &str;
    /// A few instance types it offers in that zone, cheapest first.
    fn types(&self) -> Vec<String>;
    /// A node class it can launch with.
    fn node_class(&self) -> NodeClass;
    /// Makes an offering insufficient for the next launches.
    fn exhaust(&self, offering: &OfferingKey) -> impl std::future::Future<Output = ()>;
    /// Makes the next mutating call throttle.
    fn throttle(&self) -> impl std::future::Future<Output = ()>;
    /// Makes the next launch call end after CreateFleet made the instances and before the
    /// caller heard (or tagged them per claim): a crash mid-launch.
    fn crash_after_fleet(&self) -> impl std::future::Future<Output = ()>;
    /// Puts a message in the queue.
    fn send(&self, body: &str) -> impl std::future::Future<Output = ()>;
    /// Lets `by` pass (on the queue's clock).
    fn wait(&self, by: Duration) -> impl std::future::Future<Output = ()>;
}

pub fn request(h: &impl Harness, claim: &str) -> LaunchRequest {
    LaunchRequest {
        claim: claim.to_string(),
        batch: dovetail_core::ledger::LaunchBatch {
            id: format!("batch-{claim}"),
            claims: vec![claim.to_string()].into(),
        },
        nodepool: "default".into(),
        node_class: h.node_class(),
        zone: h.zone().to_string(),
        instance_types: h.types(),
        capacity_types: vec![CapacityType::OnDemand],
        labels: BTreeMap::new(),
        tags: BTreeMap::from([("team".to_string(), "platform".to_string())]),
    }
}

async fn within<T>(what: &str, f: impl std::future::Future<Output = T>) -> T {
    match tokio::time::timeout(Duration::from_secs(60), f).await {
        Ok(v) => v,
        Err(_) => panic!("{what} did not finish within 60 s"),
    }
}

/// Launch, get, list and terminate one claim; the instance carries its tags.
pub async fn round_trip(h: &impl Harness) {
    let r = request(h, "claim-round-trip");
    let launched = within("launch", h.cloud().launch(std::slice::from_ref(&r))).await;
    let inst = launched.into_iter().next().expect("one result").expect("launched");
    assert_eq!(inst.zone, h.zone());
    assert!(h.types().contains(&inst.instance_type), "{} is not a candidate", inst.instance_type);
    assert_eq!(inst.capacity_type, CapacityType::OnDemand);
    assert_eq!(inst.claim.as_deref(), Some("claim-round-trip"));
    assert_eq!(inst.tags.get(TAG_NODECLAIM).map(String::as_str), Some("claim-round-trip"));
    assert_eq!(inst.tags.get(TAG_NODEPOOL).map(String::as_str), Some("default"));
    assert_eq!(inst.tags.get(&format!("{TAG_CLUSTER_PREFIX}{}", h.cluster())).map(String::as_str), Some("owned"));
    assert_eq!(inst.tags.get("team").map(String::as_str), Some("platform"));
    assert!(inst.price > 0.0);
    let got = within("get", h.cloud().get(&inst.id)).await.expect("get");
    assert_eq!(got.id, inst.id);
    assert!(matches!(got.state, InstanceState::Pending | InstanceState::Running));
    let listed = within("list", h.cloud().list()).await.expect("list");
    assert!(listed.iter().any(|i| i.id == inst.id), "list lacks {}", inst.id);
    let done = within("terminate", h.cloud().terminate(std::slice::from_ref(&inst.id))).await;
    assert_eq!(done, vec![Ok(())]);
}

/// Launching a claim again returns the same instance.
pub async fn relaunch_is_idempotent(h: &impl Harness) {
    let r = request(h, "claim-twice");
    let first = within("launch", h.cloud().launch(std::slice::from_ref(&r))).await.remove(0).expect("launched");
    let again = within("relaunch", h.cloud().launch(std::slice::from_ref(&r))).await.remove(0).expect("relaunched");
    assert_eq!(first.id, again.id);
    let listed = within("list", h.cloud().list()).await.expect("list");
    assert_eq!(listed.iter().filter(|i| i.claim.as_deref() == Some("claim-twice")).count(), 1);
    let _ = within("terminate", h.cloud().terminate(&[first.id])).await;
}

/// After terminate, get and terminate say NotFound.
pub async fn not_found_after_terminate(h: &impl Harness) {
    let r = request(h, "claim-gone");
    let inst = within("launch", h.cloud().launch(std::slice::from_ref(&r))).await.remove(0).expect("launched");
    assert_eq!(within("terminate", h.cloud().terminate(std::slice::from_ref(&inst.id))).await, vec![Ok(())]);
    match within("get", h.cloud().get(&inst.id)).await {
        Err(CloudError::NotFound { id }) => assert_eq!(id, inst.id),
        other => panic!("expected NotFound, got {other:?}"),
    }
    match within("terminate again", h.cloud().terminate(std::slice::from_ref(&inst.id))).await.remove(0) {
        Err(CloudError::NotFound { .. }) => {}
        other => panic!("expected NotFound, got {other:?}"),
    }
}

/// With every offering of the claim exhausted, launch fails naming them.
pub async fn insufficient_capacity_names_offerings(h: &impl Harness) {
    let mut r = request(h, "claim-ice");
    r.instance_types.truncate(2);
    for t in &r.instance_types {
        h.exhaust(&OfferingKey {
            instance_type: t.clone(),
            zone: h.zone().to_string(),
            capacity_type: CapacityType::OnDemand,
        })
        .await;
    }
    match within("launch", h.cloud().launch(std::slice::from_ref(&r))).await.remove(0) {
        Err(CloudError::InsufficientCapacity { offerings }) => {
            for t in &r.instance_types {
                assert!(
                    offerings.iter().any(|o| &o.instance_type == t && o.zone == h.zone()),
                    "{t} missing from {offerings:?}"
                );
            }
        }
        other => panic!("expected InsufficientCapacity, got {other:?}"),
    }
}

/// A throttled call says when to retry.
pub async fn throttling_has_a_retry_after(h: &impl Harness) {
    h.throttle().await;
    let r = request(h, "claim-throttled");
    match within("launch", h.cloud().launch(std::slice::from_ref(&r))).await.remove(0) {
        Err(CloudError::Throttled { retry_after, .. }) => assert!(retry_after > Duration::ZERO),
        other => panic!("expected Throttled, got {other:?}"),
    }
}

/// Receive, hide, see again after the timeout, delete.
pub async fn queue_receive_delete_visibility(h: &impl Harness) {
    h.send("{\"version\":\"0\",\"id\":\"a\"}").await;
    h.send("{\"version\":\"0\",\"id\":\"b\"}").await;
    let got = within("receive", h.queue().receive(10, Duration::from_secs(1))).await.expect("receive");
    assert_eq!(got.len(), 2, "{got:?}");
    let hidden = within("receive", h.queue().receive(10, Duration::ZERO)).await.expect("receive");
    assert!(hidden.is_empty(), "received messages are hidden: {hidden:?}");
    // One comes back at once, the other is deleted.
    within("visibility", h.queue().change_visibility(&got[0].receipt, Duration::ZERO)).await.expect("visibility");
    within("delete", h.queue().delete(std::slice::from_ref(&got[1].receipt))).await.expect("delete");
    within("delete again", h.queue().delete(std::slice::from_ref(&got[1].receipt))).await.expect("idempotent delete");
    let back = within("receive", h.queue().receive(10, Duration::from_secs(1))).await.expect("receive");
    assert_eq!(back.len(), 1);
    assert_eq!(back[0].id, got[0].id);
    assert_eq!(back[0].body, got[0].body);
    within("delete", h.queue().delete(std::slice::from_ref(&back[0].receipt))).await.expect("delete");
    h.wait(Duration::from_secs(60)).await;
    let empty = within("receive", h.queue().receive(10, Duration::ZERO)).await.expect("receive");
    assert!(empty.is_empty(), "{empty:?}");
}

/// A merged launch cut off between CreateFleet and the per-claim tags, then re-driven claim
/// by claim (grouped otherwise than the first call), leaves exactly one instance per claim:
/// the batch's untagged instances are found by its tag and assigned before anything is
/// launched. A lookup of a claim deleted mid-launch finds its instance the same way.
pub async fn a_crash_after_create_fleet_and_a_regrouped_redrive_leave_one_instance_per_claim(h: &impl Harness) {
    let prefix = format!("crash-{}", h.cluster());
    let claims: Vec<String> = (0..3).map(|i| format!("{prefix}-{i}")).collect();
    let batch = LaunchBatch { id: format!("{prefix}-batch"), claims: claims.clone().into() };
    let requests: Vec<LaunchRequest> =
        claims.iter().map(|c| LaunchRequest { batch: batch.clone(), ..request(h, c) }).collect();
    h.crash_after_fleet().await;
    let first = within("the cut-off launch", h.cloud().launch(&requests)).await;
    assert!(first.iter().all(|r| r.is_err()), "the caller never heard: {first:?}");
    // Regrouped: the last claim alone, then the first two together.
    let mut got: Vec<(String, String)> = Vec::new();
    for group in [&requests[2..3], &requests[0..2]] {
        let results = within("the re-drive", h.cloud().launch(group)).await;
        for (r, result) in group.iter().zip(results) {
            let inst = result.unwrap_or_else(|e| panic!("re-drive of {}: {e}", r.claim));
            assert_eq!(inst.claim.as_deref(), Some(r.claim.as_str()));
            assert_eq!(inst.tags.get(TAG_LAUNCH_BATCH), Some(&batch.id));
            got.push((r.claim.clone(), inst.id));
        }
    }
    let mut ids: Vec<&str> = got.iter().map(|(_, i)| i.as_str()).collect();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), 3, "one instance per claim: {got:?}");
    // Nothing more was made for the batch, and a repeat changes nothing.
    let listed = within("list", h.cloud().list()).await.expect("list");
    let of_batch: Vec<_> = listed.iter().filter(|i| i.tags.get(TAG_LAUNCH_BATCH) == Some(&batch.id)).collect();
    assert_eq!(of_batch.len(), 3, "{of_batch:?}");
    let again = within("a repeat", h.cloud().launch(&requests)).await;
    for (r, result) in requests.iter().zip(again) {
        let inst = result.expect("found");
        assert!(got.iter().any(|(c, i)| c == &r.claim && *i == inst.id), "{} changed instance", r.claim);
    }
    let lookups: Vec<Lookup> = claims.iter().map(|c| Lookup { claim: c.clone(), batch: Some(batch.clone()) }).collect();
    let found = within("find", h.cloud().find(&lookups)).await;
    for (c, f) in claims.iter().zip(found) {
        let inst = f.expect("find").expect("an instance");
        assert!(got.iter().any(|(gc, i)| gc == c && *i == inst.id));
        assert_eq!(inst.tags.get(TAG_NODECLAIM), Some(c));
    }
    let ids: Vec<String> = got.iter().map(|(_, i)| i.clone()).collect();
    let done = within("terminate", h.cloud().terminate(&ids)).await;
    assert!(done.iter().all(|r| r.is_ok()), "{done:?}");
}

/// A claim whose launch was cut off before its instance was tagged per claim is found by
/// `find` through its batch (what terminating a claim deleted mid-launch relies on), and a
/// claim with no instance anywhere is `None`.
pub async fn find_locates_a_cut_off_launch_by_its_batch(h: &impl Harness) {
    let claim = format!("find-{}", h.cluster());
    let batch = LaunchBatch { id: format!("{claim}-batch"), claims: vec![claim.clone()].into() };
    // Two claims merged, so the fleet call carries no per-claim tag.
    let other = format!("{claim}-other");
    let both = LaunchBatch { id: batch.id.clone(), claims: vec![claim.clone(), other.clone()].into() };
    let requests = vec![
        LaunchRequest { batch: both.clone(), ..request(h, &claim) },
        LaunchRequest { batch: both.clone(), ..request(h, &other) },
    ];
    h.crash_after_fleet().await;
    let first = within("the cut-off launch", h.cloud().launch(&requests)).await;
    assert!(first.iter().all(|r| r.is_err()));
    let found = within("find", h.cloud().find(&[Lookup { claim: claim.clone(), batch: Some(both.clone()) }])).await;
    let inst = found.into_iter().next().expect("one").expect("find").expect("found by its batch");
    assert_eq!(inst.claim.as_deref(), Some(claim.as_str()));
    let none = within(
        "find nothing",
        h.cloud().find(&[Lookup {
            claim: format!("{claim}-never"),
            batch: Some(LaunchBatch { id: "never".into(), claims: vec![].into() }),
        }]),
    )
    .await;
    assert_eq!(none, vec![Ok(None)]);
    let listed = within("list", h.cloud().list()).await.expect("list");
    let ids: Vec<String> =
        listed.iter().filter(|i| i.tags.get(TAG_LAUNCH_BATCH) == Some(&batch.id)).map(|i| i.id.clone()).collect();
    assert_eq!(ids.len(), 2);
    let done = within("terminate", h.cloud().terminate(&ids)).await;
    assert!(done.iter().all(|r| r.is_ok()));
}
