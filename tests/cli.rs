//! `dovetail plan` as a user runs it: flags, stdin, catalogs and errors.

#[allow(dead_code, reason = "the resource's instance id is checked by the controller's test")]
mod otlp;

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::process::{Command, Output, Stdio};

use serde::Deserialize;

fn dovetail(args: &[&str], stdin: Option<&str>) -> Output {
    dovetail_env(args, stdin, &[])
}

fn dovetail_env(args: &[&str], stdin: Option<&str>, env: &[(&str, &str)]) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_dovetail"))
        .args(args)
        .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT")
        .env_remove("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
        .env_remove("OTEL_EXPORTER_OTLP_PROTOCOL")
        .env_remove("OTEL_SERVICE_NAME")
        .envs(env.iter().copied())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn dovetail");
    if let Some(s) = stdin {
        child.stdin.take().expect("stdin").write_all(s.as_bytes()).expect("write stdin");
    }
    drop(child.stdin.take());
    child.wait_with_output().expect("wait for dovetail")
}

const POD: &str = r#"
apiVersion: v1
kind: Pod
metadata: {name: p, namespace: default}
spec:
  containers: [{name: c, image: x, resources: {requests: {cpu: 500m, memory: 1Gi}}}]
"#;

#[test]
fn plan_reads_stdin_and_prints_a_table() {
    let out = dovetail(&["plan", "-f", "-"], Some(POD));
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(table.contains("NODECLAIM") && table.contains("default-00001"), "{table}");
    assert!(table.contains("1 pending pods: 1 scheduled"), "{table}");
}

#[test]
fn plan_json_has_the_documented_shape() {
    let out = dovetail(&["plan", "-f", "-", "-o", "json"], Some(POD));
    assert!(out.status.success());
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    let c = &v["nodeclaims"][0];
    for k in ["name", "nodepool", "instance_type", "instance_types", "zone", "capacity_type", "price_per_hour", "pods"]
    {
        assert!(!c[k].is_null(), "nodeclaims[0].{k} missing: {c}");
    }
    for k in ["pods", "scheduled", "new_nodes", "cost_per_hour", "solve_ms"] {
        assert!(v["summary"][k].is_number(), "summary.{k} missing");
    }
    // One small pod: the bound is filled; below 10 node-equivalents R is taken against the
    // cheapest plan (exact search), which for one pod is its cheapest node: R 1.
    let (lb, cost) = (&v["summary"]["lower_bound_per_hour"], &v["summary"]["cost_per_hour"]);
    let cost = cost.as_f64().unwrap_or(0.0);
    assert!(lb.as_f64().is_some_and(|lb| lb > 0.0 && lb <= cost + 1e-9), "{}", v["summary"]);
    let best = v["summary"]["optimum_per_hour"].as_f64().unwrap_or(0.0);
    assert!(best > 0.0 && (best - cost).abs() < 1e-9, "{}", v["summary"]);
    assert!(v["summary"]["ratio"].as_f64().is_some_and(|r| (r - 1.0).abs() < 1e-9), "{}", v["summary"]);
    assert!(v["summary"]["lb_ms"].is_number(), "{}", v["summary"]);
    assert!(v["existing"].is_array() && v["unschedulable"].is_array());
}

/// `bench-input --mix large` writes the goals' large-pod workload (every family, 1-GPU pods
/// among the large ones), and `plan` places it all with a plan the validator accepts.
#[test]
fn bench_input_large_mix_plans_and_validates() {
    let out = dovetail(&["bench-input", "--pods", "80", "--mix", "large"], None);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let yaml = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(yaml.contains("instance-category, operator: NotIn, values: [t]"), "every family:\n{yaml}");
    assert!(yaml.contains("nvidia.com/gpu: \"1\"") && yaml.contains("cpu: 96000m"), "{yaml}");
    let out = dovetail(&["plan", "-f", "-", "-o", "json", "--validate"], Some(&yaml));
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(v["summary"]["scheduled"], 80, "{}", v["summary"]);
}

#[test]
fn another_region_needs_a_catalog() {
    let out = dovetail(&["plan", "-f", "-", "--region", "eu-west-1"], Some(POD));
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("no catalog is built in for region \"eu-west-1\"") && err.contains("--catalog"), "{err}");
}

#[test]
fn a_catalog_file_replaces_the_built_in_one() {
    let catalog = r#"{"format":"dovetail-catalog/v1","region":"eu-west-1",
      "zones":[{"name":"eu-west-1a","id":"euw1-az1"},{"name":"eu-west-1b","id":"euw1-az2"}],
      "instance_types":[
        {"name":"m5.large","vcpu":2,"memory_mib":8192,"arch":"amd64","enis":3,"ipv4_per_eni":10,
         "usage_classes":["on-demand"],"zones":["eu-west-1b"],"on_demand_price":0.107},
        {"name":"m5.xlarge","vcpu":4,"memory_mib":16384,"arch":"amd64","enis":4,"ipv4_per_eni":15,
         "usage_classes":["on-demand"],"zones":["eu-west-1a","eu-west-1b"],"on_demand_price":0.214}]}"#;
    let path = std::env::temp_dir().join("dovetail-cli-eu-west-1.json");
    std::fs::write(&path, catalog).expect("write catalog");
    let out = dovetail(
        &["plan", "-f", "-", "-o", "json", "--region", "eu-west-1", "--catalog", path.to_str().expect("utf-8 path")],
        Some(POD),
    );
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(v["nodeclaims"][0]["instance_type"], "m5.large");
    assert_eq!(v["nodeclaims"][0]["zone"], "eu-west-1b");

    std::fs::write(&path, "{not json").expect("write catalog");
    let out = dovetail(&["plan", "-f", "-", "--catalog", path.to_str().expect("utf-8 path")], Some(POD));
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("parsing catalog JSON"));
}

#[test]
fn a_missing_file_is_an_error_not_a_panic() {
    let out = dovetail(&["plan", "-f", "/nonexistent/cluster.yaml"], None);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.starts_with("error: reading /nonexistent/cluster.yaml"), "{err}");
}

#[test]
fn the_shipped_example_plans_cleanly() {
    // Read when the test runs (a build cached from another checkout would point there).
    #[allow(clippy::disallowed_methods, reason = "the checkout the test runs in, from cargo at run time")]
    let root = std::env::var("CARGO_MANIFEST_DIR").unwrap_or_else(|_| env!("CARGO_MANIFEST_DIR").to_string());
    let example = format!("{root}/examples/web.yaml");
    let out = dovetail(&["plan", "-f", &example, "-o", "json"], None);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(out.stderr.is_empty(), "no warnings: {}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(v["summary"]["pods"], 17);
    assert_eq!(v["summary"]["scheduled"], 17);
}

#[test]
fn simulate_runs_a_scenario_file_and_writes_its_report() {
    #[allow(clippy::disallowed_methods, reason = "the checkout the test runs in, from cargo at run time")]
    let root = std::env::var("CARGO_MANIFEST_DIR").unwrap_or_else(|_| env!("CARGO_MANIFEST_DIR").to_string());
    let scenario = format!("{root}/loadtest/scenarios/small.yaml");
    let out_dir = std::env::temp_dir().join(format!("dovetail-cli-sim-{}", std::process::id()));
    let out_arg = out_dir.to_string_lossy().to_string();
    let out = dovetail(&["simulate", "--scenario", &scenario, "--out", &out_arg], None);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}\n{stdout}", String::from_utf8_lossy(&out.stderr));
    for field in ["pods placed", "nodes", "$/h", "R (cost / bound)", "decision latency p50", "report", "plot"] {
        assert!(stdout.contains(field), "the summary has {field}: {stdout}");
    }
    // Not a terminal: progress as plain lines on stderr.
    let progress = String::from_utf8_lossy(&out.stderr);
    assert!(progress.lines().count() > 100 && !progress.contains('\r'), "{progress}");
    assert!(out_dir.join("report.json").is_file() && out_dir.join("plot.svg").is_file());
    let _ = std::fs::remove_dir_all(&out_dir);
}

#[test]
fn simulate_names_the_bad_field_of_a_scenario() {
    let dir = std::env::temp_dir().join(format!("dovetail-cli-badsim-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let path = dir.join("bad.yaml");
    std::fs::write(&path, "name: bad\nzones: [us-east-1a]\nduration: soon\ncluster: ''\n").expect("write");
    let out = dovetail(&["simulate", "--scenario", &path.to_string_lossy()], None);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("scenario bad: duration:"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn loadtest_runs_the_ci_scenario_on_the_wall_clock_and_checks_its_thresholds() {
    let out_dir = std::env::temp_dir().join(format!("dovetail-cli-loadtest-{}", std::process::id()));
    let out_arg = out_dir.to_string_lossy().to_string();
    // Its metrics served while it runs: Karpenter's series and R, and promtool's lint passes.
    let addr = format!("127.0.0.1:{}", operations::free_port());
    let child = Command::new(env!("CARGO_BIN_EXE_dovetail"))
        .args(["loadtest", "--builtin", "ci", "--out", &out_arg, "--metrics-addr", &addr])
        .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn dovetail");
    let mut scraped = None;
    for _ in 0..150usize {
        std::thread::sleep(std::time::Duration::from_millis(200));
        let Some(text) = get_metrics(&addr) else { continue };
        let created = dovetail_actors::metrics::sum_of(&text, "karpenter_nodeclaims_created_total", &[]);
        let r = dovetail_actors::metrics::sum_of(&text, "dovetail_fleet_cost_ratio", &[]);
        if created > 0.0 && r > 0.0 {
            scraped = Some(text);
            break;
        }
    }
    let out = child.wait_with_output().expect("wait for dovetail");
    let text = scraped.unwrap_or_else(|| panic!("no NodeClaim or R scraped\n{}", String::from_utf8_lossy(&out.stderr)));
    promtool_check(&text);
    let r = dovetail_actors::metrics::sum_of(&text, "dovetail_fleet_cost_ratio", &[]);
    assert!(r >= 1.0 - 1e-9, "R of the live fleet is at least its bound: {r}\n{text}");
    assert!(dovetail_actors::metrics::sum_of(&text, "karpenter_pods_state", &[]) > 0.0, "{text}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}\n{stdout}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains("(wall clock)") && stdout.contains("thresholds       all met"), "{stdout}");
    assert!(stdout.contains("pods placed      300 of 300"), "{stdout}");
    let _ = std::fs::remove_dir_all(&out_dir);
    // A scenario whose thresholds cannot be met fails, naming each.
    #[allow(clippy::disallowed_methods, reason = "the checkout the test runs in, from cargo at run time")]
    let root = std::env::var("CARGO_MANIFEST_DIR").unwrap_or_else(|_| env!("CARGO_MANIFEST_DIR").to_string());
    let text = std::fs::read_to_string(format!("{root}/loadtest/scenarios/ci.yaml")).expect("ci scenario");
    let strict = text.replace("max_decision_p99: 3s", "max_decision_p99: 1ms").replace("duration: 20s", "duration: 5s");
    let dir = std::env::temp_dir().join(format!("dovetail-cli-strict-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let path = dir.join("strict.yaml");
    std::fs::write(&path, strict).expect("write");
    let out = dovetail(&["loadtest", "--scenario", &path.to_string_lossy(), "--out", &dir.to_string_lossy()], None);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    assert!(stdout.contains("threshold missed decision latency p99"), "{stdout}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn simulate_replays_a_trace_with_arrivals_and_departures_or_as_one_batch() {
    #[allow(clippy::disallowed_methods, reason = "the checkout the test runs in, from cargo at run time")]
    let root = std::env::var("CARGO_MANIFEST_DIR").unwrap_or_else(|_| env!("CARGO_MANIFEST_DIR").to_string());
    let full = std::fs::read_to_string(format!("{root}/core/data/traces/openb_default.csv")).expect("trace");
    let dir = std::env::temp_dir().join(format!("dovetail-cli-trace-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    // The first 150 pods of the openb trace with their times compressed (openb spans months;
    // virtual time still costs the plane's timers), and an open on-demand NodePool.
    let mut lines: Vec<String> = full.lines().take(1).map(str::to_string).collect();
    for (i, row) in full.lines().skip(1).take(150).enumerate() {
        let f: Vec<&str> = row.split(',').collect();
        let departure = if i % 3 == 0 { String::new() } else { (i * 10 + 600).to_string() };
        lines.push(format!("{},{},{}", f[..6].join(","), i * 10, departure));
    }
    let trace = dir.join("openb-150.csv");
    std::fs::write(&trace, lines.join("\n")).expect("write trace");
    let pools = dir.join("pools.yaml");
    std::fs::write(
        &pools,
        "apiVersion: karpenter.sh/v1\nkind: NodePool\nmetadata: {name: default}\nspec:\n  template:\n    spec:\n      nodeClassRef: {group: karpenter.k8s.aws, kind: EC2NodeClass, name: default}\n      requirements:\n        - {key: karpenter.sh/capacity-type, operator: In, values: [on-demand]}\n",
    )
    .expect("write pools");
    let (t, p, o) = (trace.to_string_lossy(), pools.to_string_lossy(), dir.join("out").to_string_lossy().to_string());
    let out = dovetail(&["simulate", "--trace", &t, "--nodepools", &p, "--batch", "--out", &o], None);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}\n{stdout}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains("scenario openb-150") && stdout.contains("pods placed      150 of 150"), "{stdout}");
    // In arrival order, departed pods are gone by the end.
    let out = dovetail(&["simulate", "--trace", &t, "--nodepools", &p, "--out", &o], None);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}\n{stdout}", String::from_utf8_lossy(&out.stderr));
    let placed = stdout.lines().find(|l| l.starts_with("pods placed")).expect("pods placed line");
    assert!(placed.contains("50 of 50 (0 pending)"), "the 50 pods with no departure stay: {placed}");
    // --trace needs --nodepools.
    let out = dovetail(&["simulate", "--trace", &t], None);
    assert_eq!(out.status.code(), Some(2));
    let _ = std::fs::remove_dir_all(&dir);
}

/// The spans of one trace, by id.
struct Trace<'a> {
    spans: Vec<&'a otlp::Span>,
}

impl<'a> Trace<'a> {
    fn children(&self, of: &otlp::Span, name: &str) -> Vec<&'a otlp::Span> {
        self.spans.iter().copied().filter(|s| s.parent == of.span_id && s.name == name).collect()
    }
}

/// Whether `root`'s trace has the whole chain of a decision that launched capacity:
/// nodepool.provision -> zone.launch (a type chosen) -> nodepool.register -> cluster.bind.
fn launched_and_bound(t: &Trace<'_>, root: &otlp::Span) -> bool {
    t.children(root, "nodepool.provision").into_iter().any(|round| {
        let a = &round.attributes;
        assert!(!a["nodepool"].is_empty(), "{round:?}");
        assert_eq!(t.children(round, "nodepool.simulate").len(), 1, "{round:?}");
        assert_eq!(t.children(round, "ledger.reserve").len(), 1, "{round:?}");
        t.children(round, "zone.launch").into_iter().any(|launch| {
            let a = &launch.attributes;
            let chosen = a.get("instance_type").is_some_and(|v| !v.is_empty());
            assert!(a["zone"].starts_with("us-east-1") && !a["nodeclaim"].is_empty(), "{launch:?}");
            chosen
                && a.get("capacity_type").is_some_and(|c| c == "on-demand")
                && t.children(launch, "nodepool.register").into_iter().any(|reg| {
                    assert_eq!(reg.attributes["nodeclaim"], a["nodeclaim"], "{reg:?}");
                    t.children(reg, "cluster.bind").into_iter().any(|bind| {
                        bind.attributes["nodeclaim"] == a["nodeclaim"]
                            && bind.attributes.get("pods.bound").is_some_and(|n| n != "0")
                    })
                })
        })
    })
}

#[test]
fn simulate_exports_one_connected_trace_per_decision_over_grpc_and_http_protobuf() {
    #[allow(clippy::disallowed_methods, reason = "the checkout the test runs in, from cargo at run time")]
    let root = std::env::var("CARGO_MANIFEST_DIR").unwrap_or_else(|_| env!("CARGO_MANIFEST_DIR").to_string());
    let scenario = format!("{root}/loadtest/scenarios/small.yaml");
    for wire in [otlp::Wire::Grpc, otlp::Wire::HttpProtobuf] {
        let receiver = otlp::Receiver::start(wire);
        let out_dir =
            std::env::temp_dir().join(format!("dovetail-cli-otlp-{}-{}", std::process::id(), wire.name().len()));
        let out_arg = out_dir.to_string_lossy().to_string();
        let mut args = vec!["simulate", "--scenario", &scenario, "--out", &out_arg];
        // Both ways in: the flag with the protocol from the environment, and the reverse.
        let out = match wire {
            otlp::Wire::Grpc => {
                args.extend(["--otlp-endpoint", &receiver.url]);
                let env = [("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"), ("OTEL_SERVICE_NAME", "dovetail-under-test")];
                dovetail_env(&args, None, &env)
            }
            otlp::Wire::HttpProtobuf => {
                args.extend(["--otlp-protocol", "http/protobuf"]);
                dovetail_env(&args, None, &[("OTEL_EXPORTER_OTLP_ENDPOINT", &receiver.url)])
            }
        };
        assert!(out.status.success(), "{:?}: {}", wire, String::from_utf8_lossy(&out.stderr));
        let _ = std::fs::remove_dir_all(&out_dir);
        // Flushed before exit: everything is here once the process has ended.
        let spans = receiver.spans();
        assert!(receiver.requests() > 0 && receiver.misrouted().is_empty(), "{:?}: {:?}", wire, receiver.misrouted());
        let service = if wire == otlp::Wire::Grpc { "dovetail-under-test" } else { "dovetail" };
        assert!(spans.iter().all(|s| s.service == service), "{wire:?}: service.name");
        for s in &spans {
            let prefix = s.name.split('.').next().unwrap_or_default();
            assert!(["router", "nodepool", "ledger", "zone", "cluster"].contains(&prefix), "{s:?}");
            assert_eq!((s.trace_id.len(), s.span_id.len()), (16, 8), "{s:?}");
        }
        let ids: BTreeSet<&[u8]> = spans.iter().map(|s| s.span_id.as_slice()).collect();
        assert_eq!(ids.len(), spans.len(), "{wire:?}: span ids are unique");
        let mut traces: BTreeMap<&[u8], Trace<'_>> = BTreeMap::new();
        for s in &spans {
            traces.entry(&s.trace_id).or_insert(Trace { spans: Vec::new() }).spans.push(s);
        }
        // One trace per class decision: a single router.route root, every other span's parent
        // in the same trace.
        let mut full = BTreeSet::new();
        let mut disruptions = 0;
        for t in traces.values() {
            let roots: Vec<&otlp::Span> = t.spans.iter().copied().filter(|s| s.parent.is_empty()).collect();
            assert_eq!(roots.len(), 1, "{wire:?}: one root per trace: {roots:?}");
            let root = roots[0];
            let here: BTreeSet<&[u8]> = t.spans.iter().map(|s| s.span_id.as_slice()).collect();
            for s in &t.spans {
                assert!(s.parent.is_empty() || here.contains(s.parent.as_slice()), "{wire:?}: dangling parent: {s:?}");
            }
            // A disruption decision (the scenario's scale-down is consolidated): its ledger
            // entry under it.
            if root.name == "nodepool.disrupt" {
                let a = &root.attributes;
                assert!(!a["nodepool"].is_empty() && !a["reason"].is_empty(), "{root:?}");
                assert!(a["candidates"].parse::<u64>().is_ok_and(|n| n > 0), "{root:?}");
                let proposed = t.children(root, "ledger.propose");
                assert!(proposed.iter().any(|p| p.attributes["command"] == "disrupt"), "{wire:?}: {:?}", t.spans);
                disruptions += 1;
                continue;
            }
            assert_eq!(root.name, "router.route", "{root:?}");
            assert!(root.attributes["pods"].parse::<u64>().is_ok_and(|n| n > 0), "{root:?}");
            assert_eq!(t.children(root, "router.simulate").len(), 1, "{root:?}");
            if launched_and_bound(t, root) {
                // The scenario's workloads: Deployments web and api, Job etl.
                let class = &root.attributes["pod_class"];
                full.extend(["web", "api", "etl"].into_iter().filter(|w| class.starts_with(&format!("default/{w}"))));
            }
        }
        assert!(disruptions >= 1, "{wire:?}: the scale-down's consolidation traced");
        assert!(traces.len() >= 3, "{wire:?}: {} traces", traces.len());
        assert_eq!(full.len(), 3, "{wire:?}: routing to binding traced for each workload: {full:?}");
    }
}

#[test]
fn otlp_settings_are_checked_only_when_an_endpoint_is_set() {
    // Settings meant for another tool do not stop a command that exports nothing.
    let out = dovetail_env(&["plan", "-f", "-"], Some(POD), &[("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json")]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let env = [("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json"), ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318")];
    let out = dovetail_env(&["plan", "-f", "-"], Some(POD), &env);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("OTEL_EXPORTER_OTLP_PROTOCOL") && err.contains("http/json"), "{err}");
    let out = dovetail_env(&["plan", "-f", "-", "--otlp-endpoint", "127.0.0.1:4317"], Some(POD), &[]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--otlp-endpoint"));
}

/// The `ha` overlay renders with kubectl's built-in kustomize: a 3-replica StatefulSet (no
/// Deployment beside it) with each pod's node id from its ordinal, a volume per pod for the
/// ledger, the Raft port, no two pods on one node, a PDB letting one go at a time, and a
/// headless Service that also publishes pods not ready yet.
#[test]
fn the_ha_overlay_renders_a_statefulset_of_three_behind_a_headless_service() {
    #[allow(clippy::disallowed_methods, reason = "the checkout the test runs in, from cargo at run time")]
    let dir = std::path::PathBuf::from(
        std::env::var("CARGO_MANIFEST_DIR").unwrap_or_else(|_| env!("CARGO_MANIFEST_DIR").to_string()),
    )
    .join("deploy/overlays/ha");
    let out = std::process::Command::new("kubectl").arg("kustomize").arg(&dir).output().expect("kubectl runs");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let docs: Vec<serde_yaml::Value> = serde_yaml::Deserializer::from_slice(&out.stdout)
        .map(|d| serde_yaml::Value::deserialize(d).expect("a YAML document"))
        .collect();
    let of_kind = |k: &str| docs.iter().filter(|d| d["kind"] == k).collect::<Vec<_>>();
    assert!(of_kind("Deployment").is_empty(), "the StatefulSet replaces the Deployment");
    let sts = of_kind("StatefulSet");
    assert_eq!(sts.len(), 1);
    let spec = &sts[0]["spec"];
    assert_eq!(spec["replicas"], 3);
    assert_eq!(spec["serviceName"], "dovetail-raft");
    assert_eq!(spec["volumeClaimTemplates"][0]["metadata"]["name"], "data");
    let container = &spec["template"]["spec"]["containers"][0];
    let env = &container["env"][0];
    assert_eq!(env["name"], "DOVETAIL_NODE_ID");
    assert_eq!(env["valueFrom"]["fieldRef"]["fieldPath"], "metadata.labels['apps.kubernetes.io/pod-index']");
    assert!(container["ports"].as_sequence().expect("ports").iter().any(|p| p["containerPort"] == 7000));
    let settings = spec["template"]["spec"]["volumes"]
        .as_sequence()
        .expect("volumes")
        .iter()
        .find_map(|v| v["configMap"]["name"].as_str())
        .expect("the settings ConfigMap");
    let cm = of_kind("ConfigMap").into_iter().find(|c| c["metadata"]["name"] == settings).expect("generated");
    let text = cm["data"]["settings.yaml"].as_str().expect("settings.yaml");
    assert!(text.contains("peers:") && text.contains("raftSecretFile:"), "{text}");
    let anti =
        &spec["template"]["spec"]["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][0];
    assert_eq!(anti["topologyKey"], "kubernetes.io/hostname", "never two control nodes on one node");
    let pdb = of_kind("PodDisruptionBudget");
    assert_eq!(pdb.len(), 1);
    assert_eq!(pdb[0]["spec"]["maxUnavailable"], 1);
    let svc = of_kind("Service").into_iter().find(|s| s["metadata"]["name"] == "dovetail-raft").expect("the service");
    assert_eq!(svc["spec"]["clusterIP"], "None");
    assert_eq!(svc["spec"]["publishNotReadyAddresses"], true);
    // Only the control nodes reach the Raft port; metrics and probes stay open.
    let policy = of_kind("NetworkPolicy");
    assert_eq!(policy.len(), 1, "a NetworkPolicy guards the Raft port");
    let p = &policy[0]["spec"];
    assert_eq!(p["podSelector"]["matchLabels"]["app.kubernetes.io/name"], "dovetail");
    let rules = p["ingress"].as_sequence().expect("ingress rules");
    let raft = rules
        .iter()
        .find(|r| r["ports"].as_sequence().is_some_and(|ps| ps.iter().any(|port| port["port"] == "raft")))
        .expect("a rule for the raft port");
    assert_eq!(raft["from"][0]["podSelector"]["matchLabels"]["app.kubernetes.io/name"], "dovetail", "{raft:?}");
    assert!(
        rules.iter().all(|r| r["from"].is_null() || r == raft),
        "only the raft rule names who may connect: {rules:?}"
    );
}

/// Three control nodes' ledgers over HTTP on 127.0.0.1 (in this process, stores in memory)
/// and a fourth node running outside the group: `dovetail ledger join`, asked at a follower,
/// finds the leader and makes node 4 a voter; `ledger status` at node 4 lists it; `ledger
/// remove` of the leader, asked at node 4, leaves three voters that elect another leader; a
/// wrong secret and a node id moved to another address are refused with a clear error.
#[test]
fn ledger_join_and_remove_change_a_running_group_from_any_member() {
    use dovetail_raft::Ledger;
    use dovetail_raft::http::{HttpServer, HttpTransport};
    use dovetail_raft::network::Transport;
    use dovetail_raft::replicated::{RaftLedger, RaftSettings};
    use dovetail_raft::store::{LogStore, Machine};
    use std::sync::Arc;
    use std::time::Duration;

    const SECRET: &str = "cli-test-secret-of-the-group";
    let dir = std::env::temp_dir().join(format!("dovetail-cli-ledger-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let secret_file = dir.join("secret");
    std::fs::write(&secret_file, format!("{SECRET}\n")).expect("secret");
    let wrong_file = dir.join("wrong");
    std::fs::write(&wrong_file, "not-the-secret-of-the-group").expect("secret");
    let secret_path = secret_file.to_str().expect("utf-8 path").to_string();
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    let (nodes, servers, addrs) = rt.block_on(async {
        let transport = HttpTransport::new(SECRET).expect("a long secret");
        let (mut nodes, mut servers, mut addrs) = (BTreeMap::new(), Vec::new(), BTreeMap::new());
        for id in 1..=4u64 {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bound");
            addrs.insert(id, listener.local_addr().expect("addr").to_string());
            let t: Arc<dyn Transport> = transport.clone();
            let log = LogStore::in_memory().expect("a log");
            let clock = Arc::new(dovetail_core::clock::SystemClock::new());
            let ledger = RaftLedger::start(id, &RaftSettings::default(), log, Machine::in_memory(), t, clock)
                .await
                .expect("started");
            let server = HttpServer::start(listener, ledger.raft().clone(), ledger.machine().clone(), SECRET);
            servers.push(server.expect("serving"));
            nodes.insert(id, ledger);
        }
        let members: BTreeMap<u64, String> =
            addrs.iter().filter(|(id, _)| **id <= 3).map(|(i, a)| (*i, a.clone())).collect();
        nodes[&1].initialize(members).await.expect("initialized");
        (nodes, servers, addrs)
    });
    let leader = |except: Option<u64>| -> u64 {
        for _ in 0..200 {
            let found =
                nodes.iter().find(|(id, n)| Some(**id) != except && n.leadership().borrow().leader).map(|(id, _)| *id);
            if let Some(id) = found {
                return id;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("no leader within 10 s");
    };
    let first = leader(None);
    let follower = (1..=3).find(|id| *id != first).expect("a follower");
    let out = dovetail(
        &[
            "ledger",
            "join",
            "--addr",
            &addrs[&follower],
            "--node-id",
            "4",
            "--raft-addr",
            &addrs[&4],
            "--raft-secret-file",
            &secret_path,
        ],
        None,
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}{}", String::from_utf8_lossy(&out.stderr));
    assert!(text.contains("node 4 joined the group as a voter"), "{text}");
    let voters = (1..=4).map(|i| format!("{i}={}", addrs[&i])).collect::<Vec<_>>().join(", ");
    assert!(text.contains(&format!("voters: {voters}")), "{text}");
    let out = dovetail(
        &["ledger", "status", "--addr", &addrs[&4], "--raft-secret-file", &secret_path, "--output", "json"],
        None,
    );
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let st: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(st["members"], serde_json::json!([1, 2, 3, 4]), "{st}");
    assert_eq!(st["learners"], serde_json::json!([]), "{st}");
    // The same id at another address: refused, nothing changed.
    let out = dovetail(
        &[
            "ledger",
            "join",
            "--addr",
            &addrs[&4],
            "--node-id",
            "4",
            "--raft-addr",
            "127.0.0.1:9",
            "--raft-secret-file",
            &secret_path,
        ],
        None,
    );
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("remove it first"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The wrong secret.
    let wrong = wrong_file.to_str().expect("utf-8 path");
    let out =
        dovetail(&["ledger", "remove", "--addr", &addrs[&4], "--node-id", "4", "--raft-secret-file", wrong], None);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("401"), "{}", String::from_utf8_lossy(&out.stderr));
    // The leader removed, asked at node 4.
    let out = dovetail(
        &[
            "ledger",
            "remove",
            "--addr",
            &addrs[&4],
            "--node-id",
            &first.to_string(),
            "--raft-secret-file",
            &secret_path,
            "--output",
            "json",
        ],
        None,
    );
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let m: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    let left: Vec<u64> = (1..=4).filter(|i| *i != first).collect();
    let ids: Vec<u64> = m["voters"].as_object().expect("voters").keys().map(|k| k.parse().expect("an id")).collect();
    assert_eq!(ids, left, "{m}");
    assert_eq!(m["changed"], serde_json::json!(true));
    // Another node leads (`leader` fails the test if none does within 10 s).
    leader(Some(first));
    rt.block_on(async {
        for n in nodes.values() {
            n.shutdown().await;
        }
    });
    drop(servers);
    if let Err(e) = std::fs::remove_dir_all(&dir) {
        eprintln!("leaving {}: {e}", dir.display());
    }
}

/// Three m5.large of one NodePool: `a` runs a small pod, `b` is empty, `c` runs a large pod.
const DISRUPTION_INPUT: &str = r#"
apiVersion: karpenter.sh/v1
kind: NodePool
metadata: {name: default}
spec:
  template:
    spec:
      nodeClassRef: {group: karpenter.k8s.aws, kind: EC2NodeClass, name: default}
      requirements:
      - {key: karpenter.sh/capacity-type, operator: In, values: [on-demand]}
  disruption:
    budgets: [{nodes: "100%"}]
---
apiVersion: v1
kind: Node
metadata:
  name: a
  labels: {karpenter.sh/nodepool: default, node.kubernetes.io/instance-type: m5.large, karpenter.sh/capacity-type: on-demand, topology.kubernetes.io/zone: us-east-1a}
status: {capacity: {cpu: "2", memory: 8Gi, pods: "29"}, allocatable: {cpu: 1930m, memory: 7Gi, pods: "29"}}
---
apiVersion: v1
kind: Node
metadata:
  name: b
  labels: {karpenter.sh/nodepool: default, node.kubernetes.io/instance-type: m5.large, karpenter.sh/capacity-type: on-demand, topology.kubernetes.io/zone: us-east-1a}
status: {capacity: {cpu: "2", memory: 8Gi, pods: "29"}, allocatable: {cpu: 1930m, memory: 7Gi, pods: "29"}}
---
apiVersion: v1
kind: Node
metadata:
  name: c
  labels: {karpenter.sh/nodepool: default, node.kubernetes.io/instance-type: m5.large, karpenter.sh/capacity-type: on-demand, topology.kubernetes.io/zone: us-east-1a}
status: {capacity: {cpu: "2", memory: 8Gi, pods: "29"}, allocatable: {cpu: 1930m, memory: 7Gi, pods: "29"}}
---
apiVersion: v1
kind: Pod
metadata: {name: small, namespace: default}
spec:
  nodeName: a
  containers: [{name: c, image: x, resources: {requests: {cpu: 200m, memory: 256Mi}}}]
---
apiVersion: v1
kind: Pod
metadata: {name: large, namespace: default}
spec:
  nodeName: c
  containers: [{name: c, image: x, resources: {requests: {cpu: 1500m, memory: 1Gi}}}]
"#;

#[test]
fn explain_says_why_a_node_of_a_plan_input_would_or_would_not_be_disrupted() {
    let out = dovetail(&["explain", "node", "b", "--disruption", "-"], Some(DISRUPTION_INPUT));
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("node b (nodepool default): disrupting (emptiness)"), "{text}");
    assert!(text.contains("command: emptiness (Empty), nodes b, 0 new node(s)"), "{text}");
    let out = dovetail(&["explain", "node", "a", "--disruption", "-"], Some(DISRUPTION_INPUT));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("node a (nodepool default): kept: another command goes first this round"), "{text}");
    let out = dovetail(&["explain", "node", "zz", "--disruption", "-"], Some(DISRUPTION_INPUT));
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains(r#"node "zz" is not in -"#));
}

#[path = "cli/operations.rs"]
mod operations;
use operations::{get_metrics, promtool_check};
