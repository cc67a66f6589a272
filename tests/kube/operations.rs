//! Operating it: a provisioning decision of a controller on the Raft ledger and moto's EC2,
//! exported as one OpenTelemetry trace from the routing through the ledger's commit and
//! CreateFleet to the binding, and the JSON log lines that carry its trace id.

use std::collections::{BTreeMap, BTreeSet};

use super::*;

/// A trace's spans by id, and the names of a span's ancestors.
struct Spans<'a> {
    by_id: BTreeMap<&'a [u8], &'a otlp::Span>,
}

impl<'a> Spans<'a> {
    fn named(&self, name: &str) -> Vec<&'a otlp::Span> {
        self.by_id.values().copied().filter(|s| s.name == name).collect()
    }

    /// The names from `s` up to its root, `s` first.
    fn path(&self, s: &'a otlp::Span) -> Vec<&'a str> {
        let mut out = vec![s.name.as_str()];
        let mut at = s;
        // Bounded: a trace has fewer spans than this.
        for _ in 0..64 {
            match self.by_id.get(at.parent.as_slice()) {
                Some(p) => {
                    out.push(p.name.as_str());
                    at = p;
                }
                None => break,
            }
        }
        out
    }
}

/// Whether a trace shows the whole decision: `router.route` at the root, the ledger's commit
/// with its term and index, CreateFleet with EC2's request id under the zone's launch, and the
/// binding of the class's pods.
fn whole(t: &Spans<'_>) -> Result<(), String> {
    let roots: Vec<&otlp::Span> = t.by_id.values().copied().filter(|s| s.parent.is_empty()).collect();
    if roots.len() != 1 || roots[0].name != "router.route" {
        return Err(format!("roots {:?}", roots.iter().map(|s| &s.name).collect::<Vec<_>>()));
    }
    let committed = t.named("ledger.commit").into_iter().any(|c| {
        let a = &c.attributes;
        a.get("raft.term").is_some_and(|v| v.parse::<u64>().is_ok_and(|n| n > 0))
            && a.get("raft.index").is_some_and(|v| v.parse::<u64>().is_ok_and(|n| n > 0))
            && t.path(c).starts_with(&["ledger.commit", "ledger.propose"])
            && t.path(c).last() == Some(&"router.route")
    });
    let fleet = t.named("cloud.create_fleet").into_iter().any(|f| {
        f.attributes.get("request_id").is_some_and(|id| !id.is_empty())
            && t.path(f).starts_with(&["cloud.create_fleet", "zone.launch", "nodepool.provision", "router.route"])
    });
    let bound = t.named("cluster.bind").into_iter().any(|b| {
        b.attributes.get("pods.bound").is_some_and(|n| n != "0")
            && t.path(b).starts_with(&["cluster.bind", "nodepool.register", "zone.launch"])
    });
    let launch_committed = t.named("ledger.commit").iter().any(|c| t.path(c).contains(&"zone.launch"));
    match (committed, launch_committed, fleet, bound) {
        (true, true, true, true) => Ok(()),
        other => Err(format!("(commit, launch commit, create_fleet, bind) = {other:?}")),
    }
}

#[test]
fn a_provisioning_decision_on_the_raft_ledger_is_one_trace_from_routing_through_commit_and_create_fleet_to_bind() {
    let Some((env, _serial, _)) = getting_started() else { return };
    let (_rt, endpoint, _ec2) = ha::own_role(&env);
    let receiver = otlp::Receiver::start(otlp::Wire::Grpc);
    let raft = format!("127.0.0.1:{}", free_port().expect("a free port"));
    let peers = format!("1={raft}");
    let data = env.dir.join("ops-raft");
    let secret = env.dir.join("ops-raft-secret");
    std::fs::write(&secret, "a-test-secret-of-the-group\n").expect("secret written");
    let agent = Controller::spawn_aws(&env, "ops-node-agent", "node-agent", &endpoint, &[]);
    let args = [
        "--node-id",
        "1",
        "--raft-addr",
        raft.as_str(),
        "--peers",
        peers.as_str(),
        "--data-dir",
        data.to_str().expect("utf-8"),
        "--raft-secret-file",
        secret.to_str().expect("utf-8"),
        "--ami-parameter-prefix",
        AMI_PARAMETERS,
        "--log-format",
        "json",
        "--otlp-endpoint",
        receiver.url.as_str(),
        "--otlp-protocol",
        "grpc",
    ];
    let ctl = Controller::start_aws(&env, "ops", &endpoint, &args);
    let ns = "ops";
    env.apply(&deployment(ns, "inflate", 3, "1"));
    env.wait_running("every pod Running on an EC2 node", ns, 3, None, &ctl, Duration::from_secs(120));

    // Spans are exported a second after they end; cluster.bind ends with the last bind.
    let mut found = String::new();
    env.wait("one whole decision trace in the receiver", Duration::from_secs(30), |_| {
        let spans = receiver.spans();
        let mut traces: BTreeMap<&[u8], Spans<'_>> = BTreeMap::new();
        for s in &spans {
            traces.entry(s.trace_id.as_slice()).or_insert(Spans { by_id: BTreeMap::new() }).by_id.insert(&s.span_id, s);
        }
        let mut why = Vec::new();
        for (id, t) in &traces {
            match whole(t) {
                Ok(()) => {
                    found = id.iter().map(|b| format!("{b:02x}")).collect();
                    return Ok(());
                }
                Err(e) => why.push(e),
            }
        }
        Err(format!("{} spans in {} traces: {why:?}", spans.len(), traces.len()))
    });
    let spans = receiver.spans();
    let instances: BTreeSet<&str> = spans.iter().map(|s| s.instance.as_str()).collect();
    assert_eq!(instances, BTreeSet::from(["dovetail-test-node-1"]), "service.instance.id per control node");
    // The decision's log line (JSON) carries its trace id.
    let log = ctl.log();
    let decision = log.lines().filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok()).find(|l| {
        l["message"].as_str().is_some_and(|m| m.contains("computed new nodeclaim(s)"))
            && l["trace_id"] == found.as_str()
    });
    let decision = decision.unwrap_or_else(|| panic!("a JSON log line of trace {found}\n{log}"));
    assert_eq!(decision["level"], "info");
    assert_eq!(decision["nodepool"], "default");
    assert!(decision["time"].as_str().is_some_and(|t| t.ends_with('Z')), "{decision}");
    drop(agent);
    clean_up(&env, ns, &ctl);
}

/// How an instance made outside dovetail is tagged.
#[derive(Clone, Copy, PartialEq)]
enum Tagged {
    /// The cluster's tag and a NodePool's: as dovetail tags what it launches.
    AsDovetails,
    /// The cluster's tag only: a managed node group's instance (the controller's host).
    ClusterOnly,
    Untagged,
}

/// An instance of `ami` in moto, tagged as `tagged` says; its id.
async fn run_instance(ec2: &aws_sdk_ec2::Client, ami: &str, tagged: Tagged) -> String {
    use aws_sdk_ec2::types::{ResourceType, Tag, TagSpecification};
    let mut tags = TagSpecification::builder().resource_type(ResourceType::Instance);
    tags = tags.tags(Tag::builder().key("Name").value("made-by-hand").build());
    if tagged != Tagged::Untagged {
        tags = tags.tags(Tag::builder().key("kubernetes.io/cluster/dovetail-test").value("owned").build());
    }
    if tagged == Tagged::AsDovetails {
        tags = tags.tags(Tag::builder().key("karpenter.sh/nodepool").value("default").build());
    }
    let run = ec2
        .run_instances()
        .image_id(ami)
        .instance_type(aws_sdk_ec2::types::InstanceType::M5Large)
        .min_count(1)
        .max_count(1)
        .tag_specifications(tags.build())
        .send()
        .await
        .expect("run an instance outside dovetail");
    run.instances()[0].instance_id().expect("its id").to_string()
}

async fn state_of(ec2: &aws_sdk_ec2::Client, id: &str) -> String {
    let out = ec2.describe_instances().instance_ids(id).send().await.expect("describe instances");
    out.reservations()
        .iter()
        .flat_map(|r| r.instances())
        .find_map(|i| i.state().and_then(|s| s.name()).map(|n| n.as_str().to_string()))
        .unwrap_or_else(|| "gone".to_string())
}

#[test]
fn an_instance_of_a_nodepool_that_no_nodeclaim_knows_is_terminated_after_the_grace_and_one_of_no_nodepool_never() {
    let Some((env, _serial, _)) = getting_started() else { return };
    let (rt, endpoint, ec2) = ha::own_role(&env);
    let images = rt.block_on(moto::setup("describing an image", || {
        ec2.describe_images()
            .owners("amazon")
            .filters(aws_sdk_ec2::types::Filter::builder().name("name").values("al2023-ami-2023.*").build())
            .send()
    }));
    let ami = images.images().iter().find_map(|i| i.image_id()).expect("an image").to_string();
    let leaked = rt.block_on(run_instance(&ec2, &ami, Tagged::AsDovetails));
    let node_group = rt.block_on(run_instance(&ec2, &ami, Tagged::ClusterOnly));
    let foreign = rt.block_on(run_instance(&ec2, &ami, Tagged::Untagged));
    let started = Instant::now();
    let ctl =
        Controller::start_aws(&env, "gc", &endpoint, &["--ami-parameter-prefix", AMI_PARAMETERS, "--gc-interval", "2"]);
    // Terminated, and the termination logged with the instance.
    env.wait("the leaked instance terminated", Duration::from_secs(90), |_| {
        match rt.block_on(state_of(&ec2, &leaked)).as_str() {
            "shutting-down" | "terminated" | "gone" if ctl.log().contains(&leaked) => Ok(()),
            other => Err(format!("{leaked} is {other}\n{}", ctl.log())),
        }
    });
    // Not before its grace: 30 s from its launch.
    assert!(started.elapsed() >= Duration::from_secs(25), "terminated after {:?}", started.elapsed());
    let text = ctl.scrape();
    assert!(series_sum(&text, "dovetail_garbage_collected_instances_total", &[]) >= 1.0, "{text}");
    // Several passes later the others still run: one not tagged for the cluster, and one with
    // the cluster's tag alone (as a managed node group's instances are tagged).
    std::thread::sleep(Duration::from_secs(6));
    for (id, what) in [(&foreign, "not tagged for the cluster"), (&node_group, "of no NodePool")] {
        assert_eq!(rt.block_on(state_of(&ec2, id)), "running", "an instance {what} is never touched");
    }
    let mine = [foreign.clone(), node_group.clone()];
    rt.block_on(ec2.terminate_instances().set_instance_ids(Some(mine.to_vec())).send())
        .expect("the test's own instances cleaned up");
    // No NodeClaim was made: nothing of the cluster's to clean up.
    assert!(env.items(&["get", "nodeclaims"]).is_empty());
}

/// An EC2NodeClass's condition of `kind`, as `(status, reason, message)`.
fn class_condition(status: &serde_json::Value, kind: &str) -> Option<(String, String, String)> {
    let c = status["conditions"].as_array()?.iter().find(|c| c["type"] == kind)?.clone();
    let s = |k: &str| c[k].as_str().unwrap_or_default().to_string();
    Some((s("status"), s("reason"), s("message")))
}

/// The `id`s of a status list (`subnets`, `securityGroups`, `amis`), sorted.
fn ids(status: &serde_json::Value, list: &str) -> Vec<String> {
    let mut out: Vec<String> = status[list]
        .as_array()
        .map(|a| a.iter().filter_map(|x| x["id"].as_str().map(str::to_string)).collect())
        .unwrap_or_default();
    out.sort();
    out
}

/// An EC2NodeClass with the given selector terms (YAML flow lists) and the tests' role (and
/// `amiFamily: AL2023` when the AMI terms name no alias, as Karpenter's rules require).
fn node_class(name: &str, subnets: &str, groups: &str, amis: &str) -> String {
    let family = if amis.contains("alias") { "" } else { "  amiFamily: AL2023\n" };
    format!(
        "apiVersion: karpenter.k8s.aws/v1\nkind: EC2NodeClass\nmetadata:\n  name: {name}\nspec:\n  role: \"{}\"\n{family}  \
         amiSelectorTerms: {amis}\n  subnetSelectorTerms: {subnets}\n  securityGroupSelectorTerms: {groups}\n",
        ha::ROLE
    )
}

#[test]
fn ec2nodeclass_selectors_by_tag_id_alias_and_name_resolve_into_its_status_and_one_whose_subnets_match_nothing_is_not_ready_and_its_nodepool_says_why()
 {
    let Some((env, _serial, _)) = getting_started() else { return };
    let (rt, endpoint, ec2) = ha::own_role(&env);
    let sdk = rt.block_on(moto_sdk(&endpoint));
    let ssm = aws_sdk_ssm::Client::new(&sdk);
    // What moto holds: the subnets and security group tagged for the cluster, one subnet and
    // the group by id, an image by name, and the alias's images (its SSM parameters).
    let tagged =
        aws_sdk_ec2::types::Filter::builder().name("tag:karpenter.sh/discovery").values("dovetail-test").build();
    let subnets = rt.block_on(ec2.describe_subnets().filters(tagged.clone()).send()).expect("subnets");
    let mut tagged_subnets: Vec<(String, String)> = subnets
        .subnets()
        .iter()
        .filter_map(|s| Some((s.subnet_id()?.to_string(), s.availability_zone()?.to_string())))
        .collect();
    tagged_subnets.sort();
    let groups = rt.block_on(ec2.describe_security_groups().filters(tagged).send()).expect("security groups");
    let mut tagged_groups: Vec<String> =
        groups.security_groups().iter().filter_map(|g| g.group_id().map(str::to_string)).collect();
    tagged_groups.sort();
    assert!(!tagged_subnets.is_empty() && !tagged_groups.is_empty(), "seeded: {tagged_subnets:?} {tagged_groups:?}");
    let (subnet, zone) = tagged_subnets[0].clone();
    let group = tagged_groups[0].clone();
    let images = rt.block_on(moto::setup("describing an image", || {
        ec2.describe_images()
            .owners("amazon")
            .filters(aws_sdk_ec2::types::Filter::builder().name("name").values("al2023-ami-2023.*").build())
            .send()
    }));
    let named = images.images().iter().find(|i| i.name().is_some() && i.image_id().is_some()).expect("a named image");
    let (image, image_name) =
        (named.image_id().unwrap_or_default().to_string(), named.name().unwrap_or_default().to_string());
    let params = rt
        .block_on(ssm.get_parameters_by_path().path(AMI_PARAMETERS).recursive(true).send())
        .expect("the alias's parameters");
    let mut alias_images: Vec<String> = params
        .parameters()
        .iter()
        .filter(|p| p.name().is_some_and(|n| n.contains("/recommended/image_id")))
        .filter_map(|p| p.value().map(str::to_string))
        .collect();
    alias_images.sort();
    alias_images.dedup();
    assert!(!alias_images.is_empty(), "the alias's parameters are seeded under {AMI_PARAMETERS}");

    env.apply(&node_class(
        "by-id",
        &format!("[{{id: {subnet}}}]"),
        &format!("[{{id: {group}}}]"),
        &format!("[{{name: \"{image_name}\"}}]"),
    ));
    env.apply(&node_class(
        "nowhere",
        "[{tags: {karpenter.sh/discovery: no-such-cluster}}]",
        "[{tags: {karpenter.sh/discovery: dovetail-test}}]",
        "[{alias: al2023@latest}]",
    ));
    let stranded =
        super::team_pool("stranded", "In", "2").replace("name: default\n  limits", "name: nowhere\n  limits");
    assert!(stranded.contains("name: nowhere"), "{stranded}");
    env.apply(&stranded);
    let ctl = Controller::start_aws(&env, "nodeclass", &endpoint, &["--ami-parameter-prefix", AMI_PARAMETERS]);
    let status = |e: &Env, name: &str| e.json(&["get", "ec2nodeclass", name])["status"].clone();

    // By tag, with the alias: every tagged subnet and group, the alias's images, the profile.
    // (Resolved against this test's moto: a status an earlier controller wrote may be there.)
    let subnet_ids: Vec<String> = tagged_subnets.iter().map(|(id, _)| id.clone()).collect();
    env.wait("the default EC2NodeClass resolved", Duration::from_secs(90), |e| {
        let s = status(e, "default");
        match class_condition(&s, "Ready") {
            Some((r, ..)) if r == "True" && ids(&s, "subnets") == subnet_ids => Ok(()),
            other => Err(format!("{other:?} {s}\n{}", ctl.log())),
        }
    });
    let s = status(&env, "default");
    assert_eq!(ids(&s, "subnets"), subnet_ids, "{s}");
    let zones: Vec<(String, String)> = s["subnets"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|x| {
                    (
                        x["id"].as_str().unwrap_or_default().to_string(),
                        x["zone"].as_str().unwrap_or_default().to_string(),
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    let mut zones = zones;
    zones.sort();
    assert_eq!(zones, tagged_subnets, "each subnet with its zone: {s}");
    assert_eq!(ids(&s, "securityGroups"), tagged_groups, "{s}");
    let mut alias_found = ids(&s, "amis");
    alias_found.dedup();
    assert_eq!(alias_found, alias_images, "the alias's images: {s}");
    let archs: Vec<&str> = s["amis"]
        .as_array()
        .map(|a| a.iter().filter_map(|x| x["requirements"][0]["values"][0].as_str()).collect())
        .unwrap_or_default();
    assert!(!archs.is_empty() && archs.iter().all(|a| ["amd64", "arm64"].contains(a)), "{s}");
    let profile = dovetail_cloud::aws::profile_name("dovetail-test", "us-east-1", "default");
    assert_eq!(s["instanceProfile"].as_str(), Some(profile.as_str()), "{s}");
    for kind in ["SubnetsReady", "SecurityGroupsReady", "AMIsReady", "InstanceProfileReady", "ValidationSucceeded"] {
        assert_eq!(class_condition(&s, kind).map(|c| c.0).as_deref(), Some("True"), "{kind}: {s}");
    }

    // By id, and the AMI by name: exactly those, with the group's name and the image's.
    env.wait("the by-id EC2NodeClass resolved", Duration::from_secs(60), |e| {
        let s = status(e, "by-id");
        match class_condition(&s, "Ready") {
            Some((r, ..)) if r == "True" && ids(&s, "subnets") == std::slice::from_ref(&subnet) => Ok(()),
            other => Err(format!("{other:?} {s}\n{}", ctl.log())),
        }
    });
    let s = status(&env, "by-id");
    assert_eq!(ids(&s, "subnets"), std::slice::from_ref(&subnet), "{s}");
    assert_eq!(s["subnets"][0]["zone"].as_str(), Some(zone.as_str()), "{s}");
    assert_eq!(ids(&s, "securityGroups"), std::slice::from_ref(&group), "{s}");
    assert_eq!(s["securityGroups"][0]["name"].as_str(), Some("default"), "{s}");
    assert!(ids(&s, "amis").contains(&image), "the image named {image_name}: {s}");
    let names: Vec<&str> =
        s["amis"].as_array().map(|a| a.iter().filter_map(|x| x["name"].as_str()).collect()).unwrap_or_default();
    assert!(!names.is_empty() && names.iter().all(|n| *n == image_name), "{s}");

    // Subnets matching nothing: not ready, saying which part and why; the parts that resolved
    // are shown; its NodePool is not ready and names the class and the field.
    env.wait("the nowhere EC2NodeClass not ready", Duration::from_secs(60), |e| {
        let s = status(e, "nowhere");
        match (class_condition(&s, "Ready"), class_condition(&s, "SubnetsReady")) {
            (Some((r, reason, message)), Some((sr, sreason, _)))
                if r == "False"
                    && reason == "SubnetsNotFound"
                    && message.contains("spec.subnetSelectorTerms")
                    && message.contains("no-such-cluster")
                    && sr == "False"
                    && sreason == "SubnetsNotFound" =>
            {
                Ok(())
            }
            other => Err(format!("{other:?} {s}\n{}", ctl.log())),
        }
    });
    let s = status(&env, "nowhere");
    assert!(s["subnets"].is_null(), "{s}");
    assert_eq!(ids(&s, "securityGroups"), tagged_groups, "{s}");
    assert_eq!(class_condition(&s, "SecurityGroupsReady").map(|c| c.0).as_deref(), Some("True"), "{s}");
    env.wait("the stranded NodePool says why", Duration::from_secs(60), |e| {
        match super::condition(e, "stranded", "Ready") {
            Some((r, reason, message))
                if r == "False"
                    && reason == "NodeClassNotReady"
                    && message.contains("nowhere")
                    && message.contains("spec.subnetSelectorTerms") =>
            {
                Ok(())
            }
            other => Err(format!("{other:?}\n{}", ctl.log())),
        }
    });
    env.kubectl(&["delete", "nodepools", "--all", "--wait=false"]);
    env.kubectl(&["delete", "ec2nodeclasses", "by-id", "nowhere", "--wait=false"]);
}
