//! Defects a long run on a real cluster would find, on the real API server: how the caches
//! list, and a drain that meets a pod the eviction API refuses for good.

use super::*;

/// The API server's own count of list requests it sent to etcd for `types` (its
/// `etcd_request_duration_seconds_count{operation="list"}`): what a quorum read costs.
fn etcd_lists(env: &Env, types: &[&str]) -> f64 {
    let text = env.kubectl(&["get", "--raw", "/metrics"]);
    text.lines()
        .filter(|l| l.starts_with("etcd_request_duration_seconds_count{") && l.contains(r#"operation="list""#))
        .filter(|l| types.iter().any(|t| l.contains(&format!(r#"type="{t}""#))))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// A controller's first lists of every kind come from the API server's watch cache: not one
/// reaches etcd (a quorum read of every pod at each relist is what a paginated list asked).
#[test]
fn the_controllers_lists_are_served_from_the_watch_cache_not_read_from_etcd() {
    let Some((env, _serial, _)) = getting_started() else { return };
    let ns = "lists";
    env.apply(&deployment(ns, "web", 3, "100m"));
    // The kinds only list requests of the caches reach etcd for (the server's own cache lists
    // each once at start; the scheduler's and controller-manager's informers list with
    // resourceVersion=0 too). Nothing in this window but the controller lists them.
    let types = [
        "*[]core.Pod",
        "*[]core.Node",
        "*[]core.Namespace",
        "*[]core.PersistentVolume",
        "*[]core.PersistentVolumeClaim",
        "*[]apps.DaemonSet",
        "*[]policy.PodDisruptionBudget",
        "*[]storage.StorageClass",
    ];
    // A namespace an earlier test deleted is emptied by the namespace controller with lists
    // that reach etcd: none may be in the window.
    env.wait("no namespace terminating", Duration::from_secs(90), |e| {
        let going: Vec<String> =
            e.items(&["get", "namespaces"]).iter().filter(|n| n["status"]["phase"] != "Active").map(name_of).collect();
        if going.is_empty() { Ok(()) } else { Err(format!("{going:?}")) }
    });
    let before = etcd_lists(&env, &types);
    // The server's own caches listed each kind from etcd at its start: the metric is there
    // (a window that reads 0 -> 0 for want of the metric would prove nothing).
    assert!(before > 0.0, "no etcd list counted yet: is the metric named as the test reads it?");
    let ctl = Controller::start(&env, "lists", &[]);
    env.wait("the controller's caches synced", Duration::from_secs(60), |_| {
        if ctl.log().contains("caches synced") { Ok(()) } else { Err(ctl.log()) }
    });
    let after = etcd_lists(&env, &types);
    let log = ctl.log();
    assert_eq!(after - before, 0.0, "lists reached etcd: {before} -> {after}\n{log}");
    assert!(log.contains("streaming_lists=false"), "a 1.20 server does not stream lists\n{log}");
    env.wait_running("the pods Running", ns, 3, None, &ctl, Duration::from_secs(60));
    clean_up(&env, ns, &ctl);
}

/// Two PodDisruptionBudgets select one pod: the eviction API refuses it (HTTP 500) until one
/// goes. The drain backs off on it as on a budget's refusal (not every second), the pod gets
/// one `FailedEviction` Warning saying why, and once a budget goes the node drains and goes.
#[test]
fn a_pod_two_pdbs_cover_is_reported_on_the_pod_backed_off_and_drained_once_one_goes() {
    let Some((env, _serial, _)) = getting_started() else { return };
    let ns = "overlap";
    env.apply(&deployment(ns, "web", 1, "1"));
    let pdb = |name: &str| {
        format!(
            "apiVersion: {}\nkind: PodDisruptionBudget\nmetadata:\n  name: {name}\n  namespace: {ns}\nspec:\n  \
             maxUnavailable: 1\n  selector:\n    matchLabels: {{app: web}}\n",
            policy_version(&env)
        )
    };
    env.apply(&pdb("web"));
    env.apply(&pdb("web-too"));
    let ctl = Controller::start(&env, "overlap", &[]);
    env.wait_running("the pod Running", ns, 1, None, &ctl, Duration::from_secs(60));
    let pod = env.items(&["get", "pods", "-n", ns]).first().cloned().expect("the pod");
    let (pod_name, node) = (name_of(&pod), pod["spec"]["nodeName"].as_str().expect("bound").to_string());
    let claim = env
        .items(&["get", "nodeclaims"])
        .iter()
        .find(|c| c["status"]["nodeName"] == node.as_str())
        .map(name_of)
        .expect("the node's NodeClaim");
    env.kubectl(&["delete", "nodeclaim", &claim, "--wait=false"]);
    let selector = format!("involvedObject.name={pod_name},reason=FailedEviction");
    env.wait("a FailedEviction Warning on the pod", Duration::from_secs(60), |e| {
        let events = e.items(&["get", "events", "-n", ns, "--field-selector", &selector]);
        if events.iter().any(|e| e["type"] == "Warning") { Ok(()) } else { Err(ctl.log()) }
    });
    let first = ctl.metric("dovetail_errors_total", r#"kind="many_pdbs""#);
    assert!(first >= 1.0, "the refusal is counted\n{}", ctl.log());
    // 20 s of a drain that reconciles every second: the backoff (100 ms doubling to 10 s)
    // asks a handful of times, not twenty.
    std::thread::sleep(Duration::from_secs(20));
    let asked = ctl.metric("dovetail_errors_total", r#"kind="many_pdbs""#) - first;
    assert!(asked <= 10.0, "{asked} evictions refused in 20 s\n{}", ctl.log());
    let events = env.items(&["get", "events", "-n", ns, "--field-selector", &selector]);
    let said: u64 = events.iter().filter_map(|e| e["count"].as_u64()).sum();
    assert!(said <= 1, "said once: {events:?}");
    let message = events.first().map(|e| e["message"].as_str().unwrap_or_default().to_string()).unwrap_or_default();
    assert!(message.contains("more than one PodDisruptionBudget"), "{message}");
    assert!(env.items(&["get", "pods", "-n", ns]).iter().any(|p| name_of(p) == pod_name), "the pod stays");
    // One budget goes: the eviction goes through, and the node and its NodeClaim go.
    env.kubectl(&["delete", "pdb", "web-too", "-n", ns]);
    env.wait("the NodeClaim and its node gone", Duration::from_secs(90), |e| {
        let claim_left = e.items(&["get", "nodeclaims"]).iter().any(|c| name_of(c) == claim);
        let node_left = e.items(&["get", "nodes"]).iter().any(|n| name_of(n) == node);
        if !claim_left && !node_left {
            Ok(())
        } else {
            Err(format!("claim {claim_left}, node {node_left}\n{}", ctl.log()))
        }
    });
    env.wait_running("the pod Running elsewhere", ns, 1, Some(&node), &ctl, Duration::from_secs(60));
    clean_up(&env, ns, &ctl);
}

/// A NodePool of two spot types, so the price order picks between them.
const PRICED_POOL: &str = r#"apiVersion: karpenter.sh/v1
kind: NodePool
metadata:
  name: priced
spec:
  weight: 100
  template:
    spec:
      requirements:
        - {key: karpenter.sh/capacity-type, operator: In, values: ["spot"]}
        - {key: node.kubernetes.io/instance-type, operator: In, values: ["m5.large", "m5.xlarge"]}
      nodeClassRef: {group: karpenter.k8s.aws, kind: EC2NodeClass, name: default}
"#;

/// `replicas` pods of 1.5 CPU (one fits either type), none two to a node.
fn apart(ns: &str, replicas: u32) -> String {
    format!(
        r#"apiVersion: v1
kind: Namespace
metadata:
  name: {ns}
---
apiVersion: apps/v1
kind: Deployment
metadata:
  name: apart
  namespace: {ns}
spec:
  replicas: {replicas}
  selector:
    matchLabels: {{app: apart}}
  template:
    metadata:
      labels: {{app: apart}}
    spec:
      affinity:
        podAntiAffinity:
          requiredDuringSchedulingIgnoredDuringExecution:
            - labelSelector: {{matchLabels: {{app: apart}}}}
              topologyKey: kubernetes.io/hostname
      containers:
        - name: pause
          image: registry.k8s.io/pause:3.9
          resources: {{requests: {{cpu: "1500m"}}}}
"#
    )
}

/// A leader that runs for weeks decides on today's prices: the spot prices are read again on
/// the provider's cadence (`--price-refresh`, 12 h by default; 3 s here) and every NodePool
/// takes them, so the next NodeClaim is the type cheapest now, not at the start.
#[test]
fn with_cloud_aws_spot_prices_are_read_again_and_the_next_nodeclaim_takes_the_new_cheapest_type() {
    let Some((env, _serial, _)) = getting_started() else { return };
    let (rt, _, _, iam) = seeded_moto(&env);
    let role = "KarpenterNodeRole-dovetail-test";
    let trust = r#"{"Version":"2012-10-17","Statement":[{"Effect":"Allow","Principal":{"Service":"ec2.amazonaws.com"},"Action":"sts:AssumeRole"}]}"#;
    // Made by an earlier test of this process, or now.
    if let Err(e) = rt.block_on(iam.create_role().role_name(role).assume_role_policy_document(trust).send()) {
        assert!(format!("{e:?}").contains("EntityAlreadyExists"), "create role: {e:?}");
    }
    // The test's spot market, through a proxy in front of moto (whose price is flat).
    let proxy = rt.block_on(moto::Proxy::start(moto::moto().addr));
    let market = |large: f64, xlarge: f64| {
        let mut prices = Vec::new();
        for zone in SUBNET_ZONES {
            prices.push(("m5.large".to_string(), zone.to_string(), large));
            prices.push(("m5.xlarge".to_string(), zone.to_string(), xlarge));
        }
        Some(prices)
    };
    proxy.faults().spot_prices = market(0.50, 0.10);
    let endpoint = format!("http://{}", proxy.addr);
    let ctl = Controller::start_aws(
        &env,
        "prices",
        &endpoint,
        &["--ami-parameter-prefix", AMI_PARAMETERS, "--price-refresh", "3"],
    );
    env.apply(PRICED_POOL);
    let ns = "prices";
    env.apply(&apart(ns, 1));
    let types = |e: &Env| -> Vec<String> {
        e.items(&["get", "nodeclaims", "-l", "karpenter.sh/nodepool=priced"])
            .iter()
            .filter_map(|c| c["metadata"]["labels"]["node.kubernetes.io/instance-type"].as_str().map(String::from))
            .collect()
    };
    env.wait("the first NodeClaim launched", Duration::from_secs(90), |e| match types(e).as_slice() {
        [_] => Ok(()),
        other => Err(format!("{other:?}\n{}", ctl.log())),
    });
    assert_eq!(types(&env), ["m5.xlarge"], "the cheaper spot type at the start\n{}", ctl.log());
    // The market turns: m5.large is the cheap one now.
    proxy.faults().spot_prices = market(0.05, 0.50);
    // A read of the prices that began after the turn, then a catalog the pools took after it
    // (one taken meanwhile may hold a read from before).
    let asked = proxy.calls("DescribeSpotPriceHistory");
    env.wait("the prices read after the turn", Duration::from_secs(60), |_| {
        let now = proxy.calls("DescribeSpotPriceHistory");
        if now > asked { Ok(()) } else { Err(format!("{now} reads\n{}", ctl.log())) }
    });
    let taken = ctl.log().matches("the NodePools take the catalog read again").count();
    env.wait("the pools took the new prices", Duration::from_secs(60), |_| {
        let now = ctl.log().matches("the NodePools take the catalog read again").count();
        if now > taken { Ok(()) } else { Err(ctl.log()) }
    });
    env.kubectl(&["scale", "deployment", "apart", "-n", ns, "--replicas", "2"]);
    env.wait("the second NodeClaim launched", Duration::from_secs(90), |e| match types(e).len() {
        2 => Ok(()),
        n => Err(format!("{n} launched\n{}", ctl.log())),
    });
    let mut got = types(&env);
    got.sort();
    assert_eq!(got, ["m5.large", "m5.xlarge"], "the next NodeClaim takes today's cheapest\n{}", ctl.log());
    assert!(proxy.calls("DescribeSpotPriceHistory") >= 2, "the prices were read again");
    clean_up(&env, ns, &ctl);
}
