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

/// An instance of `ami` in moto, with the cluster's tag or without; its id.
async fn run_instance(ec2: &aws_sdk_ec2::Client, ami: &str, cluster_tag: bool) -> String {
    use aws_sdk_ec2::types::{ResourceType, Tag, TagSpecification};
    let mut tags = TagSpecification::builder().resource_type(ResourceType::Instance);
    tags = tags.tags(Tag::builder().key("Name").value("made-by-hand").build());
    if cluster_tag {
        tags = tags.tags(Tag::builder().key("kubernetes.io/cluster/dovetail-test").value("owned").build());
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
fn an_instance_tagged_for_the_cluster_that_no_nodeclaim_knows_is_terminated_after_the_grace_and_an_untagged_one_never()
{
    let Some((env, _serial, _)) = getting_started() else { return };
    let (rt, endpoint, ec2) = ha::own_role(&env);
    let images = rt.block_on(ec2.describe_images().owners("amazon").send()).expect("images");
    let ami = images.images().iter().find_map(|i| i.image_id()).expect("an image").to_string();
    let leaked = rt.block_on(run_instance(&ec2, &ami, true));
    let foreign = rt.block_on(run_instance(&ec2, &ami, false));
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
    // Several passes later the one without the cluster's tag still runs.
    std::thread::sleep(Duration::from_secs(6));
    assert_eq!(
        rt.block_on(state_of(&ec2, &foreign)),
        "running",
        "an instance not tagged for the cluster is never touched"
    );
    rt.block_on(ec2.terminate_instances().instance_ids(&foreign).send()).expect("the test's own instance cleaned up");
    // No NodeClaim was made: nothing of the cluster's to clean up.
    assert!(env.items(&["get", "nodeclaims"]).is_empty());
}
