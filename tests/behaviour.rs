//! The behaviour suite: every `tests/behaviour/*.yaml` is a scenario whose first document
//! (`kind: Expect`) states, by hand, what Karpenter would do with the rest of the file and
//! which Karpenter behaviour that is. The test runs the real `dovetail plan` binary on the
//! scenario and checks the expectations against its JSON output and exit code.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use dovetail_core::catalog::{Catalog, InstanceType, NodeClassSettings};
use serde::Deserialize;
use serde_json::Value;

#[derive(Deserialize, Default, Debug)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct ClaimExpect {
    nodepool: Option<String>,
    instance_type: Option<String>,
    instance_type_in: Option<Vec<String>>,
    zone: Option<String>,
    zone_in: Option<Vec<String>>,
    zone_not_in: Option<Vec<String>>,
    capacity_type: Option<String>,
    labels: Option<BTreeMap<String, String>>,
    /// Every candidate type's label takes one of these values.
    candidates_have: Option<BTreeMap<String, Vec<String>>>,
    candidates_include: Option<Vec<String>>,
    candidates_exclude: Option<Vec<String>>,
    /// The launched type's label takes one of these values.
    launch_has: Option<BTreeMap<String, Vec<String>>>,
    launch_exotic: Option<bool>,
    pod_count: Option<usize>,
    min_cpu: Option<f64>,
}

#[derive(Deserialize, Debug)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct ZoneSkew {
    pod_prefix: String,
    max_skew: i64,
    zones: Vec<String>,
}

#[derive(Deserialize, Debug)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Expect {
    #[allow(dead_code)]
    api_version: String,
    #[allow(dead_code)]
    kind: String,
    cites: String,
    #[serde(default)]
    exit_code: i32,
    #[serde(default)]
    error_contains: Vec<String>,
    #[serde(default)]
    warning_contains: Vec<String>,
    scheduled: Option<usize>,
    unschedulable: Option<usize>,
    new_nodes: Option<usize>,
    #[serde(default)]
    unschedulable_reasons: BTreeMap<String, String>,
    #[serde(default)]
    on_existing: BTreeMap<String, String>,
    #[serde(default)]
    on_new: Vec<String>,
    #[serde(default)]
    claim: BTreeMap<String, ClaimExpect>,
    all_claims: Option<ClaimExpect>,
    #[serde(default)]
    same_node: Vec<Vec<String>>,
    #[serde(default)]
    distinct_nodes: Vec<Vec<String>>,
    #[serde(default)]
    nodepool_claims: BTreeMap<String, usize>,
    #[serde(default)]
    zone_skew: Vec<ZoneSkew>,
    /// Number of new NodeClaims per value of a label.
    #[serde(default)]
    label_counts: BTreeMap<String, BTreeMap<String, usize>>,
    /// The packers the scenario holds for (`karpenter`, `dovetail`); both when absent.
    packers: Option<Vec<String>>,
    max_cost: Option<f64>,
}

struct Ctx<'a> {
    name: String,
    out: &'a Value,
    types: &'a BTreeMap<String, InstanceType>,
    /// Zone label of existing nodes in the input.
    node_zones: BTreeMap<String, String>,
    failures: Vec<String>,
}

impl Ctx<'_> {
    fn fail(&mut self, msg: String) {
        self.failures.push(format!("{}: {msg}", self.name));
    }

    fn claims(&self) -> Vec<&Value> {
        self.out["nodeclaims"].as_array().map(|a| a.iter().collect()).unwrap_or_default()
    }

    /// The claim or existing node hosting a pod: ("claim", name) or ("node", name).
    fn host(&self, pod: &str) -> Option<(String, String)> {
        for c in self.claims() {
            if c["pods"].as_array().is_some_and(|p| p.iter().any(|x| x == pod)) {
                return Some(("claim".into(), c["name"].as_str().unwrap_or("").into()));
            }
        }
        for e in self.out["existing"].as_array().into_iter().flatten() {
            if e["pods"].as_array().is_some_and(|p| p.iter().any(|x| x == pod)) {
                return Some(("node".into(), e["node"].as_str().unwrap_or("").into()));
            }
        }
        None
    }

    fn claim_of(&self, pod: &str) -> Option<&Value> {
        self.claims().into_iter().find(|c| c["pods"].as_array().is_some_and(|p| p.iter().any(|x| x == pod)))
    }

    fn zone_of(&self, pod: &str) -> Option<String> {
        match self.host(pod)? {
            (k, name) if k == "claim" => {
                self.claim_of(pod).and_then(|c| c["zone"].as_str().map(String::from)).or(Some(name))
            }
            (_, node) => self.node_zones.get(&node).cloned(),
        }
    }

    fn label_of(&self, t: &str, key: &str) -> Option<String> {
        let it = self.types.get(t)?;
        let r = it.requirements.get(key);
        if it.requirements.has(key) && !r.is_complement() && r.values().len() == 1 {
            Some(r.values()[0].clone())
        } else {
            None
        }
    }

    fn check_claim(&mut self, what: &str, c: &Value, e: &ClaimExpect) {
        let s = |k: &str| c[k].as_str().unwrap_or("").to_string();
        let (it, zone, ct, pool) = (s("instance_type"), s("zone"), s("capacity_type"), s("nodepool"));
        if let Some(x) = &e.nodepool
            && *x != pool
        {
            self.fail(format!("{what}: nodepool {pool}, expected {x}"));
        }
        if let Some(x) = &e.instance_type
            && *x != it
        {
            self.fail(format!("{what}: instance type {it}, expected {x}"));
        }
        if let Some(x) = &e.instance_type_in
            && !x.contains(&it)
        {
            self.fail(format!("{what}: instance type {it}, expected one of {x:?}"));
        }
        if let Some(x) = &e.zone
            && *x != zone
        {
            self.fail(format!("{what}: zone {zone}, expected {x}"));
        }
        if let Some(x) = &e.zone_in
            && !x.contains(&zone)
        {
            self.fail(format!("{what}: zone {zone}, expected one of {x:?}"));
        }
        if let Some(x) = &e.zone_not_in
            && x.contains(&zone)
        {
            self.fail(format!("{what}: zone {zone}, expected none of {x:?}"));
        }
        if let Some(x) = &e.capacity_type
            && *x != ct
        {
            self.fail(format!("{what}: capacity type {ct}, expected {x}"));
        }
        for (k, v) in e.labels.iter().flatten() {
            let got = c["labels"][k].as_str().unwrap_or("<none>").to_string();
            if got != *v {
                self.fail(format!("{what}: label {k}={got}, expected {v}"));
            }
        }
        let candidates: Vec<String> =
            c["instance_types"].as_array().into_iter().flatten().filter_map(|v| v.as_str().map(String::from)).collect();
        for (k, allowed) in e.candidates_have.iter().flatten() {
            for t in &candidates {
                let v = self.label_of(t, k).unwrap_or_else(|| "<none>".into());
                if !allowed.contains(&v) {
                    self.fail(format!("{what}: candidate {t} has {k}={v}, expected one of {allowed:?}"));
                    break;
                }
            }
        }
        for t in e.candidates_include.iter().flatten() {
            if !candidates.contains(t) {
                self.fail(format!("{what}: candidates do not include {t}"));
            }
        }
        for t in e.candidates_exclude.iter().flatten() {
            if candidates.contains(t) {
                self.fail(format!("{what}: candidates include {t}"));
            }
        }
        for (k, allowed) in e.launch_has.iter().flatten() {
            let v = self.label_of(&it, k).unwrap_or_else(|| "<none>".into());
            if !allowed.contains(&v) {
                self.fail(format!("{what}: launch type {it} has {k}={v}, expected one of {allowed:?}"));
            }
        }
        if let Some(x) = e.launch_exotic {
            let exotic = self.types.get(&it).is_some_and(|t| t.exotic);
            if exotic != x {
                self.fail(format!("{what}: launch type {it} exotic={exotic}, expected {x}"));
            }
        }
        if let Some(n) = e.pod_count {
            let got = c["pods"].as_array().map(Vec::len).unwrap_or(0);
            if got != n {
                self.fail(format!("{what}: {got} pods, expected {n}"));
            }
        }
        if let Some(min) = e.min_cpu {
            let vcpu = self
                .types
                .get(&it)
                .map(|t| t.capacity.get(&dovetail_core::resources::ResourceName::Cpu) as f64 / 1000.0);
            if vcpu.is_none_or(|v| v < min) {
                self.fail(format!("{what}: launch type {it} has {vcpu:?} vCPU, expected at least {min}"));
            }
        }
    }
}

fn split(text: &str) -> (String, String) {
    let mut docs: Vec<&str> = text.split("\n---\n").collect();
    let first = docs.remove(0).to_string();
    (first, docs.join("\n---\n"))
}

fn run_scenario(path: &Path, types: &BTreeMap<String, InstanceType>) -> Vec<String> {
    let name = path.file_name().map(|n| n.to_string_lossy().to_string()).unwrap_or_default();
    let text = std::fs::read_to_string(path).expect("scenario readable");
    let (expect_doc, input) = split(&text);
    let expect: Expect = match serde_yaml::from_str(&expect_doc) {
        Ok(e) => e,
        Err(e) => return vec![format!("{name}: bad Expect document: {e}")],
    };
    if expect.cites.trim().is_empty() {
        return vec![format!("{name}: Expect.cites must name the Karpenter behaviour")];
    }
    let dir = std::env::temp_dir().join(format!("dovetail-behaviour-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let input_path = dir.join(&name);
    std::fs::write(&input_path, &input).expect("write input");
    let packers = expect.packers.clone().unwrap_or_else(|| vec!["karpenter".into(), "dovetail".into()]);
    let mut failures = Vec::new();
    for packer in packers {
        if !["karpenter", "dovetail"].contains(&packer.as_str()) {
            failures.push(format!("{name}: unknown packer {packer:?}"));
            continue;
        }
        failures.extend(check_run(&format!("{name} [{packer}]"), &packer, &input_path, &input, &expect, types));
    }
    failures
}

fn check_run(
    name: &str,
    packer: &str,
    input_path: &Path,
    input: &str,
    expect: &Expect,
    types: &BTreeMap<String, InstanceType>,
) -> Vec<String> {
    let name = name.to_string();
    let out = Command::new(env!("CARGO_BIN_EXE_dovetail"))
        .args(["plan", "-o", "json", "--validate", "--packer", packer, "-f"])
        .arg(input_path)
        .output()
        .expect("run dovetail");
    let code = out.status.code().unwrap_or(-1);
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    let mut failures = Vec::new();
    if code != expect.exit_code {
        failures.push(format!("{name}: exit code {code}, expected {} (stderr: {stderr})", expect.exit_code));
        return failures;
    }
    for s in expect.error_contains.iter().chain(&expect.warning_contains) {
        if !stderr.contains(s.as_str()) {
            failures.push(format!("{name}: stderr does not contain {s:?}: {stderr}"));
        }
    }
    if code != 0 {
        if !stderr.starts_with("error: ") || stderr.contains("panicked") {
            failures.push(format!("{name}: expected a clean error message, got {stderr:?}"));
        }
        return failures;
    }
    let json: Value = match serde_json::from_slice(&out.stdout) {
        Ok(v) => v,
        Err(e) => return vec![format!("{name}: output is not JSON: {e}")],
    };
    let mut node_zones = BTreeMap::new();
    for doc in input.split("\n---\n") {
        if let Ok(v) = serde_yaml::from_str::<serde_yaml::Value>(doc)
            && v.get("kind").and_then(|k| k.as_str()) == Some("Node")
        {
            let name = v["metadata"]["name"].as_str().unwrap_or("").to_string();
            if let Some(z) = v["metadata"]["labels"]["topology.kubernetes.io/zone"].as_str() {
                node_zones.insert(name, z.to_string());
            }
        }
    }
    let mut cx = Ctx { name: name.clone(), out: &json, types, node_zones, failures };
    let summary = &json["summary"];
    let count = |k: &str| summary[k].as_u64().unwrap_or(u64::MAX) as usize;
    if let Some(n) = expect.scheduled
        && count("scheduled") != n
    {
        cx.fail(format!("scheduled {}, expected {n}", count("scheduled")));
    }
    let unsched = json["unschedulable"].as_array().map(Vec::len).unwrap_or(0);
    if let Some(n) = expect.unschedulable
        && unsched != n
    {
        cx.fail(format!("unschedulable {unsched}, expected {n}: {}", json["unschedulable"]));
    }
    if let Some(n) = expect.new_nodes
        && count("new_nodes") != n
    {
        cx.fail(format!("new nodes {}, expected {n}", count("new_nodes")));
    }
    for (pod, substring) in &expect.unschedulable_reasons {
        let reason = json["unschedulable"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|u| u["pod"] == pod.as_str())
            .and_then(|u| u["reason"].as_str().map(String::from));
        match reason {
            None => cx.fail(format!("{pod} is not unschedulable")),
            Some(r) if !r.contains(substring.as_str()) => cx.fail(format!("{pod}: reason {r:?} lacks {substring:?}")),
            _ => {}
        }
    }
    for (pod, node) in &expect.on_existing {
        if cx.host(pod) != Some(("node".into(), node.clone())) {
            let h = cx.host(pod);
            cx.fail(format!("{pod} is on {h:?}, expected existing node {node}"));
        }
    }
    for pod in &expect.on_new {
        if cx.host(pod).is_none_or(|(k, _)| k != "claim") {
            let h = cx.host(pod);
            cx.fail(format!("{pod} is on {h:?}, expected a new NodeClaim"));
        }
    }
    for (pod, e) in &expect.claim {
        match cx.claim_of(pod).cloned() {
            None => cx.fail(format!("{pod} is not on a new NodeClaim")),
            Some(c) => cx.check_claim(&format!("claim of {pod}"), &c, e),
        }
    }
    if let Some(e) = &expect.all_claims {
        for c in cx.claims().into_iter().cloned().collect::<Vec<_>>() {
            cx.check_claim(&format!("claim {}", c["name"]), &c, e);
        }
    }
    for group in &expect.same_node {
        let hosts: BTreeSet<_> = group.iter().map(|p| cx.host(p)).collect();
        if hosts.len() != 1 || hosts.contains(&None) {
            cx.fail(format!("{group:?} should share one node, are on {hosts:?}"));
        }
    }
    for group in &expect.distinct_nodes {
        let hosts: Vec<_> = group.iter().map(|p| cx.host(p)).collect();
        let set: BTreeSet<_> = hosts.iter().collect();
        if set.len() != group.len() || set.contains(&None) {
            cx.fail(format!("{group:?} should be on distinct nodes, are on {hosts:?}"));
        }
    }
    for (pool, n) in &expect.nodepool_claims {
        let got = cx.claims().iter().filter(|c| c["nodepool"] == pool.as_str()).count();
        if got != *n {
            cx.fail(format!("{got} claims from nodepool {pool}, expected {n}"));
        }
    }
    for zs in &expect.zone_skew {
        let pods: Vec<String> = cx
            .claims()
            .iter()
            .flat_map(|c| c["pods"].as_array().into_iter().flatten())
            .chain(
                json["existing"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .flat_map(|e| e["pods"].as_array().into_iter().flatten()),
            )
            .filter_map(|p| p.as_str().map(String::from))
            .filter(|p| p.starts_with(&zs.pod_prefix))
            .collect();
        let mut counts: BTreeMap<String, i64> = zs.zones.iter().map(|z| (z.clone(), 0)).collect();
        for p in &pods {
            match cx.zone_of(p) {
                Some(z) if counts.contains_key(&z) => *counts.get_mut(&z).expect("present") += 1,
                z => cx.fail(format!("{p} is in zone {z:?}, outside {:?}", zs.zones)),
            }
        }
        let (min, max) = (counts.values().min().copied().unwrap_or(0), counts.values().max().copied().unwrap_or(0));
        if max - min > zs.max_skew {
            cx.fail(format!("zone counts of {}* {counts:?} exceed skew {}", zs.pod_prefix, zs.max_skew));
        }
    }
    for (key, want) in &expect.label_counts {
        let mut got: BTreeMap<String, usize> = BTreeMap::new();
        for c in cx.claims() {
            if let Some(v) = c["labels"][key.as_str()].as_str() {
                *got.entry(v.to_string()).or_insert(0) += 1;
            }
        }
        if got != *want {
            cx.fail(format!("claims per {key}: {got:?}, expected {want:?}"));
        }
    }
    if let Some(max) = expect.max_cost {
        let cost = summary["cost_per_hour"].as_f64().unwrap_or(f64::MAX);
        if cost > max + 1e-9 {
            cx.fail(format!("cost {cost}/h exceeds {max}/h"));
        }
    }
    cx.failures
}

fn scenarios() -> Vec<PathBuf> {
    // Read when the test runs, not when it was built: a build cached from another checkout
    // would otherwise point there.
    #[allow(clippy::disallowed_methods, reason = "the checkout the test runs in, from cargo at run time")]
    let root =
        PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").unwrap_or_else(|_| env!("CARGO_MANIFEST_DIR").to_string()));
    let dir = root.join("tests/behaviour");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("tests/behaviour exists")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .collect();
    files.sort();
    files
}

#[test]
fn behaviour_suite() {
    let catalog = Catalog::embedded("us-east-1").expect("catalog");
    let types: BTreeMap<String, InstanceType> =
        catalog.instance_types(&NodeClassSettings::default(), None).into_iter().map(|t| (t.name.clone(), t)).collect();
    let files = scenarios();
    assert!(files.len() >= 40, "the suite needs at least 40 scenarios, has {}", files.len());
    let negative = files
        .iter()
        .filter(|f| {
            let t = std::fs::read_to_string(f).unwrap_or_default();
            let (e, _) = split(&t);
            e.contains("exitCode: 2") || e.contains("unschedulableReasons:")
        })
        .count();
    assert!(negative >= 10, "the suite needs at least 10 negative scenarios, has {negative}");
    let results: Vec<Vec<String>> = std::thread::scope(|s| {
        let chunks: Vec<&[PathBuf]> = files.chunks(files.len().div_ceil(4)).collect();
        let handles: Vec<_> = chunks
            .into_iter()
            .map(|chunk| s.spawn(|| chunk.iter().flat_map(|f| run_scenario(f, &types)).collect::<Vec<_>>()))
            .collect();
        handles.into_iter().map(|h| h.join().expect("scenario thread")).collect()
    });
    let failures: Vec<String> = results.into_iter().flatten().collect();
    assert!(failures.is_empty(), "{} failure(s):\n{}", failures.len(), failures.join("\n"));
}
