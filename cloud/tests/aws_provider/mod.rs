//! AWS-specific behaviour against moto behind the proxy: bad input with typed errors, the
//! catalog, spot-to-on-demand fallback, merged launches, drift, leaked instances. And one test
//! that needs a real account (ignored).

use std::collections::BTreeMap;
use std::sync::Arc;

use dovetail_cloud::aws::{AwsConfig, AwsProvider, TAG_NODECLASS_HASH};
use dovetail_cloud::batch::{BatchWindow, Batched};
use dovetail_cloud::{CloudError, CloudProvider, DriftReason, LaunchRequest, NodeClass, OfferingKey, TAG_NODECLAIM};
use dovetail_core::catalog::CapacityType;
use dovetail_core::clock::SystemClock;

use crate::conformance::aws::{Aws, config, moto_catalog};
use crate::conformance::moto::{Proxy, moto, setup};
use crate::conformance::suite::{Harness, request};

#[tokio::test]
async fn a_node_class_selecting_no_subnets_is_not_ready() {
    let h = Aws::new("bad-subnets").await;
    let mut r = request(&h, "claim-no-subnet");
    r.node_class.name = "no-subnets".into();
    r.node_class.subnet_selector =
        vec![BTreeMap::from([("karpenter.sh/discovery".to_string(), "nowhere".to_string())])];
    match h.cloud.launch(std::slice::from_ref(&r)).await.remove(0) {
        Err(CloudError::NodeClassNotReady { node_class, reason }) => {
            assert_eq!(node_class, "no-subnets");
            assert!(reason.contains("subnetSelectorTerms"), "{reason}");
        }
        other => panic!("expected NodeClassNotReady, got {other:?}"),
    }
    assert!(matches!(h.cloud.instance_types(&r.node_class).await, Err(CloudError::NodeClassNotReady { .. })));
    assert_eq!(h.proxy.calls("CreateFleet"), 0, "nothing is launched for a node class that is not ready");
}

#[tokio::test]
async fn an_unknown_ami_alias_is_invalid() {
    let h = Aws::new("bad-alias").await;
    let mut r = request(&h, "claim-bad-alias");
    r.node_class.name = "bad-alias".into();
    r.node_class.ami_alias = Some("windows2022@latest".into());
    match h.cloud.launch(std::slice::from_ref(&r)).await.remove(0) {
        Err(CloudError::Invalid { what, reason }) => {
            assert!(what.contains("EC2NodeClass bad-alias") && what.contains("amiSelectorTerms"), "{what}");
            assert!(reason.contains("windows2022"), "{reason}");
        }
        other => panic!("expected Invalid, got {other:?}"),
    }
    for alias in ["ubuntu@latest", "al2023@yesterday"] {
        r.node_class.ami_alias = Some(alias.into());
        match h.cloud.launch(std::slice::from_ref(&r)).await.remove(0) {
            Err(CloudError::Invalid { what, .. }) => assert!(what.contains(alias), "{what}"),
            other => panic!("{alias}: expected Invalid, got {other:?}"),
        }
    }
    // A well-formed alias with no published AMI (this version was never seeded): not ready.
    r.node_class.ami_alias = Some("al2023@v20990101".into());
    match h.cloud.launch(std::slice::from_ref(&r)).await.remove(0) {
        Err(CloudError::NodeClassNotReady { reason, .. }) => assert!(reason.contains("al2023@v20990101"), "{reason}"),
        other => panic!("expected NodeClassNotReady, got {other:?}"),
    }
    assert_eq!(h.proxy.calls("CreateFleet"), 0);
}

#[tokio::test]
async fn the_alias_resolves_through_the_ssm_parameter() {
    let h = Aws::new("ssm-alias").await;
    let resolved = h.cloud.resolve(&h.node_class()).await.expect("resolve");
    assert_eq!(resolved.images.len(), 2, "{:?}", resolved.images);
    assert!(h.proxy.calls("GetParameter") >= 2, "both architectures are read from SSM");
    let inst = h.cloud.launch(std::slice::from_ref(&request(&h, "claim-ssm"))).await.remove(0).expect("launched");
    assert!(resolved.images.iter().any(|(id, arch)| *id == inst.image && arch == "amd64"), "{}", inst.image);
}

#[tokio::test]
async fn the_catalog_comes_from_describe_instance_types_and_offerings() {
    let c = moto_catalog().await;
    assert_eq!(c.region, "us-east-1");
    assert!(c.zones.len() >= 3, "{:?}", c.zones);
    assert!(c.instance_types.len() > 1000, "{} types", c.instance_types.len());
    let m5 = c.instance_types.iter().find(|t| t.name == "m5.large").expect("m5.large");
    assert_eq!((m5.vcpu, m5.memory_mib, m5.arch.as_str()), (2, 8192, "amd64"));
    assert!(m5.zones.iter().any(|z| z == "us-east-1a"), "{:?}", m5.zones);
    assert!(m5.on_demand_price.is_some_and(|p| p > 0.0));
    let h = Aws::new("catalog-types").await;
    let types = h.cloud.instance_types(&h.node_class()).await.expect("instance types");
    let m5 = types.iter().find(|t| t.name == "m5.large").expect("m5.large resolved");
    assert!(m5.offerings.iter().any(|o| o.zone == "us-east-1a" && o.capacity_type == CapacityType::OnDemand));
}

/// A leader that runs for weeks prices on today's market: spot prices are read again every
/// `price_refresh`, types and offerings every `catalog_refresh`, and a refresh that fails
/// keeps the catalog in use.
#[tokio::test]
async fn spot_prices_and_offerings_are_read_again_on_the_providers_cadence_and_a_failed_read_keeps_the_catalog() {
    use dovetail_cloud::aws::SpotPrices;
    use dovetail_core::clock::ManualClock;
    use std::time::Duration;
    let proxy = Proxy::start(moto().addr).await;
    let clock = Arc::new(ManualClock::new());
    let mut cfg = config("refresh", &format!("http://{}", proxy.addr));
    cfg.spot_prices = SpotPrices::History;
    cfg.price_refresh = Duration::from_secs(12 * 3600);
    cfg.catalog_refresh = Duration::from_secs(24 * 3600);
    let prices = |large: f64| vec![("m5.large".to_string(), "us-east-1a".to_string(), large)];
    proxy.faults().spot_prices = Some(prices(0.05));
    let cloud =
        AwsProvider::connect(cfg, clock.clone()).await.expect("connect").with_catalog(moto_catalog().await).await;
    let spot = |c: &dovetail_core::catalog::Catalog| {
        c.instance_types.iter().find(|t| t.name == "m5.large").and_then(|t| t.spot_price)
    };
    assert_eq!(cloud.catalog_generation(), 1);
    assert!(!cloud.refresh_if_due().await.expect("nothing due"), "nothing due yet");
    assert_eq!(proxy.total_calls(), 0, "nothing read");
    // 12 hours on: the spot prices, and nothing else.
    clock.advance(Duration::from_secs(12 * 3600));
    assert!(cloud.refresh_if_due().await.expect("prices read"));
    assert_eq!(cloud.catalog_generation(), 2);
    assert_eq!(spot(&cloud.catalog().await.expect("catalog")), Some(0.05));
    assert_eq!((proxy.calls("DescribeSpotPriceHistory"), proxy.calls("DescribeInstanceTypes")), (1, 0));
    // A day on: the whole catalog is due; EC2 throttles the first read, so the catalog in use
    // stays, prices and all.
    proxy.faults().spot_prices = Some(prices(0.07));
    clock.advance(Duration::from_secs(12 * 3600));
    proxy.faults().throttle_next = 1;
    match cloud.refresh_if_due().await {
        Err(dovetail_cloud::CloudError::Throttled { .. }) => {}
        other => panic!("expected the throttled read's error, got {other:?}"),
    }
    assert_eq!(cloud.catalog_generation(), 2);
    assert_eq!(spot(&cloud.catalog().await.expect("catalog")), Some(0.05), "the catalog in use stays");
    // Asked again: the types, their offerings by zone and the prices are read.
    assert!(cloud.refresh_if_due().await.expect("catalog read"));
    assert_eq!(cloud.catalog_generation(), 3);
    let c = cloud.catalog().await.expect("catalog");
    assert_eq!(spot(&c), Some(0.07));
    assert!(c.instance_types.len() > 1000 && c.zones.len() >= 3, "{} types", c.instance_types.len());
    assert!(proxy.calls("DescribeInstanceTypes") >= 1 && proxy.calls("DescribeInstanceTypeOfferings") >= 1);
    assert!(!cloud.refresh_if_due().await.expect("nothing due"), "and nothing is due right after");
}

#[tokio::test]
async fn spot_without_capacity_falls_back_to_on_demand() {
    let h = Aws::new("spot-fallback").await;
    let mut r = request(&h, "claim-fallback");
    r.capacity_types = vec![CapacityType::Spot, CapacityType::OnDemand];
    for t in &r.instance_types {
        h.exhaust(&OfferingKey { instance_type: t.clone(), zone: h.zone().into(), capacity_type: CapacityType::Spot })
            .await;
    }
    let inst = h.cloud.launch(std::slice::from_ref(&r)).await.remove(0).expect("launched on-demand");
    assert_eq!(inst.capacity_type, CapacityType::OnDemand);
    assert_eq!(h.proxy.calls("CreateFleet"), 2, "one spot call that failed, one on-demand call");
}

#[tokio::test]
async fn identical_concurrent_launches_are_one_create_fleet() {
    let h = Arc::new(Aws::new("merge").await);
    let batched = Arc::new(Batched::new(
        Arc::new(
            AwsProvider::connect(
                AwsConfig { ..crate::conformance::aws::config("merge", &format!("http://{}", h.proxy.addr)) },
                Arc::new(SystemClock),
            )
            .await
            .expect("connect")
            .with_catalog(moto_catalog().await)
            .await,
        ),
        BatchWindow::default(),
    ));
    // The zone actor records one launch batch for identical claims: they merge.
    let batch = dovetail_core::ledger::LaunchBatch {
        id: "merge-batch".into(),
        claims: (0..20).map(|i| format!("claim-merged-{i}")).collect(),
    };
    let mut tasks = Vec::new();
    for i in 0..20 {
        let b = batched.clone();
        let r = LaunchRequest { batch: batch.clone(), ..request(h.as_ref(), &format!("claim-merged-{i}")) };
        tasks.push(tokio::spawn(async move { b.launch(std::slice::from_ref(&r)).await.remove(0) }));
    }
    let mut ids = Vec::new();
    for t in tasks {
        ids.push(t.await.expect("task").expect("launched").id);
    }
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), 20, "each claim has its own instance");
    assert_eq!(h.proxy.calls("CreateFleet"), 1, "20 identical launches, one CreateFleet");
    assert_eq!(h.proxy.calls("CreateTags"), 20 + 1, "one claim tag each (and the harness's discovery tags)");
    let listed = h.cloud.list().await.expect("list");
    for i in 0..20 {
        let claim = format!("claim-merged-{i}");
        assert_eq!(
            listed.iter().filter(|x| x.tags.get(TAG_NODECLAIM) == Some(&claim)).count(),
            1,
            "{claim} is tagged on exactly one instance"
        );
    }
}

/// Every call the provider and its queue make is allowed by `deploy/iam-policy.json`.
#[tokio::test]
async fn the_iam_policy_allows_every_call_the_provider_makes() {
    let h = Aws::new("iam").await;
    h.send("{}").await;
    h.proxy.faults().actions.clear();
    let cfg = AwsConfig {
        spot_prices: dovetail_cloud::aws::SpotPrices::History,
        ..crate::conformance::aws::config("iam", &format!("http://{}", h.proxy.addr))
    };
    let sdk = dovetail_cloud::aws::sdk_config(&cfg).await;
    let cloud = AwsProvider::connect(cfg, Arc::new(SystemClock)).await.expect("connect");
    let types = cloud.instance_types(&h.node_class()).await.expect("catalog with spot price history");
    assert!(types.iter().any(|t| t.offerings.iter().any(|o| o.capacity_type == CapacityType::Spot)));
    let mut r = request(&h, "claim-iam");
    r.node_class.instance_profile = Some("dovetail-nodes".into());
    let inst = cloud.launch(std::slice::from_ref(&r)).await.remove(0).expect("launched");
    cloud.get(&inst.id).await.expect("get");
    cloud.list().await.expect("list");
    cloud.is_drifted(&inst, &r.node_class).await.expect("drift");
    assert_eq!(cloud.terminate(std::slice::from_ref(&inst.id)).await, vec![Ok(())]);
    let queue = dovetail_cloud::aws::SqsQueue::named(&sdk, "iam-interruptions").await.expect("queue by name");
    let got = dovetail_cloud::InterruptionQueue::receive(&queue, 10, std::time::Duration::from_secs(1))
        .await
        .expect("receive");
    assert_eq!(got.len(), 1);
    dovetail_cloud::InterruptionQueue::change_visibility(&queue, &got[0].receipt, std::time::Duration::from_secs(5))
        .await
        .expect("visibility");
    dovetail_cloud::InterruptionQueue::delete(&queue, &[got[0].receipt.clone()]).await.expect("delete");

    let policy: serde_json::Value =
        serde_json::from_str(include_str!("../../../deploy/iam-policy.json")).expect("policy is JSON");
    let allowed: Vec<String> = policy["Statement"]
        .as_array()
        .expect("statements")
        .iter()
        .flat_map(|st| match &st["Action"] {
            serde_json::Value::String(a) => vec![a.clone()],
            serde_json::Value::Array(a) => a.iter().filter_map(|x| x.as_str().map(str::to_string)).collect(),
            _ => Vec::new(),
        })
        .collect();
    let seen = h.proxy.faults().actions.clone();
    assert!(seen.len() > 10, "{seen:?}");
    for action in &seen {
        // IAM authorises batch deletes as sqs:DeleteMessage.
        let needed = action.replace("sqs:DeleteMessageBatch", "sqs:DeleteMessage");
        assert!(allowed.contains(&needed), "{needed} is called but not in deploy/iam-policy.json");
    }
}

/// A termination batch within EC2's limits (the proxy keeps them): ids asked in
/// DescribeInstances filters of at most 200 values, and a TerminateInstances refused whole for
/// one protected instance asked again id by id, so the others go; each result at its id.
#[tokio::test]
async fn a_large_termination_batch_is_chunked_and_a_protected_instance_does_not_hold_the_others_back() {
    let h = Aws::new("terminate-batch").await;
    let mut launched = Vec::new();
    for claim in ["claim-tb-a", "claim-tb-b", "claim-tb-c"] {
        let r = request(&h, claim);
        launched.push(h.cloud.launch(std::slice::from_ref(&r)).await.remove(0).expect("launched").id);
    }
    let (a, b, c) = (launched[0].clone(), launched[1].clone(), launched[2].clone());
    h.proxy.faults().protected.insert(b.clone());
    let mut ids: Vec<String> = (0..300u32).map(|i| format!("i-{i:017x}")).collect();
    ids.insert(10, a.clone());
    ids.insert(250, b.clone());
    ids.push(c.clone());
    let before = h.proxy.calls("DescribeInstances");
    let results = h.cloud.terminate(&ids).await;
    assert_eq!(results.len(), ids.len());
    for (id, r) in ids.iter().zip(&results) {
        if *id == a || *id == c {
            assert_eq!(r, &Ok(()), "{id}");
        } else if *id == b {
            assert!(matches!(r, Err(e) if !matches!(e, CloudError::NotFound { .. })), "{id}: {r:?}");
        } else {
            assert!(matches!(r, Err(CloudError::NotFound { .. })), "{id}: {r:?}");
        }
    }
    assert!(h.proxy.calls("DescribeInstances") - before >= 2, "303 ids need two describes of at most 194");
    assert!(h.cloud.get(&b).await.is_ok(), "the protected one is still there");
}

#[tokio::test]
async fn drift_compares_the_node_class_hash_and_image() {
    let h = Aws::new("drift").await;
    let r = request(&h, "claim-drift");
    let inst = h.cloud.launch(std::slice::from_ref(&r)).await.remove(0).expect("launched");
    assert_eq!(inst.tags.get(TAG_NODECLASS_HASH).map(String::as_str), Some("h1"));
    assert_eq!(h.cloud.is_drifted(&inst, &h.node_class()).await.expect("drift"), None);
    let changed = NodeClass { hash: "h2".into(), ..h.node_class() };
    assert_eq!(h.cloud.is_drifted(&inst, &changed).await.expect("drift"), Some(DriftReason::NodeClass));
    let other_image = dovetail_cloud::Instance { image: "ami-0000000000000000".into(), ..inst };
    assert_eq!(h.cloud.is_drifted(&other_image, &h.node_class()).await.expect("drift"), Some(DriftReason::Image));
}

#[tokio::test]
async fn instances_no_claim_knows_are_listed_for_garbage_collection() {
    let h = Aws::new("leaks").await;
    // A few images, not moto's 1,300: the setup asks for what it needs.
    let image = setup("describing an image", || {
        h.cloud
            .ec2()
            .describe_images()
            .owners("amazon")
            .filters(aws_sdk_ec2::types::Filter::builder().name("name").values("al2023-ami-2023.*").build())
            .send()
    })
    .await;
    let ami = image.images().iter().find_map(|i| i.image_id()).expect("an image").to_string();
    let run = setup("running an instance no claim knows", || {
        h.cloud
            .ec2()
            .run_instances()
            .image_id(ami.clone())
            .instance_type(aws_sdk_ec2::types::InstanceType::M5Large)
            .min_count(1)
            .max_count(1)
            .tag_specifications(
                aws_sdk_ec2::types::TagSpecification::builder()
                    .resource_type(aws_sdk_ec2::types::ResourceType::Instance)
                    .tags(aws_sdk_ec2::types::Tag::builder().key("kubernetes.io/cluster/leaks").value("owned").build())
                    .build(),
            )
            .send()
    })
    .await;
    let leaked = run.instances()[0].instance_id().expect("id").to_string();
    let listed = h.cloud.list().await.expect("list");
    let found = listed.iter().find(|i| i.id == leaked).expect("the leaked instance is listed");
    assert_eq!(found.claim, None);
    assert_eq!(h.cloud.terminate(std::slice::from_ref(&leaked)).await, vec![Ok(())]);
}

/// Launches and terminates one instance in a real account: `AWS_REGION`, credentials from the
/// default chain, `DOVETAIL_SUBNET_TAG`/`DOVETAIL_SG_TAG` as `key=value` selectors.
#[tokio::test]
#[ignore = "needs AWS"]
#[allow(clippy::disallowed_methods, reason = "a test against a real account reads its selectors from the environment")]
async fn real_account_round_trip() {
    let tag = |var: &str| {
        let v = std::env::var(var).unwrap_or_else(|_| panic!("set {var}=key=value"));
        let (k, v) = v.split_once('=').unwrap_or_else(|| panic!("{var} must be key=value"));
        BTreeMap::from([(k.to_string(), v.to_string())])
    };
    let cloud = AwsProvider::connect(
        AwsConfig { cluster: "dovetail-real-test".into(), ..AwsConfig::default() },
        Arc::new(SystemClock),
    )
    .await
    .expect("connect");
    let nc = NodeClass {
        name: "default".into(),
        subnet_selector: vec![tag("DOVETAIL_SUBNET_TAG")],
        security_group_selector: vec![tag("DOVETAIL_SG_TAG")],
        ami_alias: Some("al2023@latest".into()),
        hash: "real".into(),
        ..Default::default()
    };
    let resolved = cloud.resolve(&nc).await.expect("resolve");
    let r = dovetail_cloud::LaunchRequest {
        claim: "dovetail-real-test".into(),
        batch: dovetail_core::ledger::LaunchBatch {
            id: "batch-1".into(),
            claims: vec!["dovetail-real-test".to_string()].into(),
        },
        nodepool: "default".into(),
        node_class: nc,
        zone: resolved.subnets[0].1.clone(),
        instance_types: vec!["t3.micro".into(), "t3a.micro".into()],
        capacity_types: vec![CapacityType::OnDemand],
        labels: BTreeMap::new(),
        tags: BTreeMap::new(),
    };
    let inst = cloud.launch(std::slice::from_ref(&r)).await.remove(0).expect("launch");
    assert_eq!(cloud.terminate(std::slice::from_ref(&inst.id)).await, vec![Ok(())]);
}

/// A control node that does not lead reads a node class ahead (`warm`): the leader's
/// `resolve` then makes no EC2 or SSM call. With a role whose instance profile is not made yet,
/// `warm` writes nothing (no profile created) and caches nothing: the leader makes it.
#[tokio::test]
async fn a_node_class_read_ahead_resolves_without_calls_and_a_missing_profile_is_left_to_the_leader() {
    let h = Aws::new("warm").await;
    let nc = h.node_class();
    assert!(h.cloud.warm(&nc).await.expect("read ahead"), "cached");
    let reads = ["DescribeSubnets", "DescribeSecurityGroups", "DescribeImages", "GetParameter"];
    let before: Vec<usize> = reads.iter().map(|a| h.proxy.calls(a)).collect();
    assert!(before[0] > 0 && before[1] > 0, "warm read the subnets and security groups: {before:?}");
    let resolved = h.cloud.resolve(&nc).await.expect("resolve");
    assert!(!resolved.subnets.is_empty() && !resolved.images.is_empty());
    let after: Vec<usize> = reads.iter().map(|a| h.proxy.calls(a)).collect();
    assert_eq!(before, after, "resolve used what warm read");
    let with_role = NodeClass { role: Some("KarpenterNodeRole-warm".into()), hash: "h2".into(), ..h.node_class() };
    assert!(!h.cloud.warm(&with_role).await.expect("read ahead"), "not cached: the profile is missing");
    assert_eq!(h.proxy.calls("CreateInstanceProfile"), 0, "a follower makes no profile");
    let subnets = h.proxy.calls("DescribeSubnets");
    assert!(!h.cloud.warm(&with_role).await.expect("read ahead"));
    assert!(h.proxy.calls("DescribeSubnets") > subnets, "nothing was cached for a class whose profile is missing");

    // The leader makes the profile (its role exists); another control node's read-ahead then
    // caches the class with it, and that node's resolve, once it leads, makes no call at all.
    let sdk = dovetail_cloud::aws::sdk_config(&config("warm", &format!("http://{}", h.proxy.addr))).await;
    let trust = r#"{"Version":"2012-10-17","Statement":[{"Effect":"Allow","Principal":{"Service":"ec2.amazonaws.com"},"Action":"sts:AssumeRole"}]}"#;
    let role = aws_sdk_iam::Client::new(&sdk)
        .create_role()
        .role_name("KarpenterNodeRole-warm")
        .assume_role_policy_document(trust)
        .send()
        .await;
    if let Err(e) = role {
        assert!(format!("{e:?}").contains("EntityAlreadyExists"), "create role: {e:?}");
    }
    let made = h.cloud.resolve(&with_role).await.expect("the leader resolves, making the profile");
    assert!(made.instance_profile.is_some());
    assert_eq!(h.proxy.calls("CreateInstanceProfile"), 1);
    let proxy = Proxy::start(moto().addr).await;
    let follower = AwsProvider::connect(config("warm", &format!("http://{}", proxy.addr)), Arc::new(SystemClock))
        .await
        .expect("connect");
    assert!(follower.warm(&with_role).await.expect("read ahead"), "cached: the profile exists with its role");
    let before = proxy.total_calls();
    let resolved = follower.resolve(&with_role).await.expect("resolve");
    assert_eq!(resolved.instance_profile, made.instance_profile);
    assert_eq!(proxy.total_calls(), before, "a new leader's resolve waits for no EC2, SSM or IAM call");
    assert_eq!(proxy.calls("CreateInstanceProfile"), 0, "the follower made nothing");
}

/// Garbage collection of managed instance profiles: those of node classes not kept are
/// deleted (their role taken off first), the kept one and another cluster's stay, and a leader
/// whose term ended deletes none.
#[tokio::test]
async fn the_profiles_of_gone_node_classes_are_deleted_and_none_once_the_term_ended() {
    let h = Aws::new("collect").await;
    let sdk = dovetail_cloud::aws::sdk_config(&config("collect", &format!("http://{}", h.proxy.addr))).await;
    let trust = r#"{"Version":"2012-10-17","Statement":[{"Effect":"Allow","Principal":{"Service":"ec2.amazonaws.com"},"Action":"sts:AssumeRole"}]}"#;
    let role = "KarpenterNodeRole-collect";
    let made =
        aws_sdk_iam::Client::new(&sdk).create_role().role_name(role).assume_role_policy_document(trust).send().await;
    if let Err(e) = made {
        assert!(format!("{e:?}").contains("EntityAlreadyExists"), "create role: {e:?}");
    }
    let class = |name: &str| NodeClass {
        name: name.into(),
        role: Some(role.into()),
        hash: format!("h-{name}"),
        ..h.node_class()
    };
    for name in ["kept", "gone", "also-gone"] {
        let r = h.cloud.resolve(&class(name)).await.expect("resolve, making the profile");
        assert!(r.instance_profile.is_some(), "{name}: {r:?}");
    }
    // Another cluster's managed profile (another path): never this cluster's to delete.
    let iam = aws_sdk_iam::Client::new(&sdk);
    let other_path = dovetail_cloud::aws::profile_path("collect-other", "us-east-1");
    let other = iam.create_instance_profile().instance_profile_name("collect-other_1").path(&other_path).send().await;
    if let Err(e) = other {
        assert!(format!("{e:?}").contains("EntityAlreadyExists"), "create profile: {e:?}");
    }
    let keep: std::collections::BTreeSet<String> = ["kept".to_string()].into();
    let ended = h.cloud.collect_instance_profiles(&keep, &|| false).await;
    assert!(ended.is_err(), "a deposed leader stops: {ended:?}");
    assert_eq!(h.proxy.calls("DeleteInstanceProfile"), 0, "and deletes nothing");
    let mut deleted = h.cloud.collect_instance_profiles(&keep, &|| true).await.expect("collected");
    deleted.sort();
    let name = |class: &str| dovetail_cloud::aws::profile_name("collect", "us-east-1", class);
    let mut gone = vec![name("also-gone"), name("gone")];
    gone.sort();
    assert_eq!(deleted, gone);
    assert_eq!(h.proxy.calls("RemoveRoleFromInstanceProfile"), 2, "each role taken off first");
    let again = h.cloud.collect_instance_profiles(&keep, &|| true).await.expect("collected");
    assert!(again.is_empty(), "the kept class's profile stays: {again:?}");
    let still = iam.get_instance_profile().instance_profile_name("collect-other_1").send().await;
    assert!(still.is_ok(), "another cluster's profile stays: {still:?}");
}
