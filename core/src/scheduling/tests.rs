//! Component tests of the solve through its public entry point.

use std::sync::{Arc, OnceLock};

use super::*;
use crate::catalog::{Catalog, InstanceType, NodeClassSettings};
use crate::labels;
use crate::node::Node;
use crate::nodepool::NodePool;
use crate::pod::Pod;
use crate::requirements::{Requirement, Requirements};
use crate::resources::{ResourceList, ResourceName};

fn m5() -> Arc<Vec<InstanceType>> {
    static TYPES: OnceLock<Arc<Vec<InstanceType>>> = OnceLock::new();
    TYPES
        .get_or_init(|| {
            let c = Catalog::embedded("us-east-1").expect("catalog");
            Arc::new(
                c.instance_types(&NodeClassSettings::default(), None)
                    .into_iter()
                    .filter(|t| t.name.starts_with("m5."))
                    .collect(),
            )
        })
        .clone()
}

fn snapshot(pools: Vec<NodePool>) -> Snapshot {
    Snapshot {
        nodepools: pools.into_iter().map(|pool| PoolInput { pool, instance_types: m5() }).collect(),
        ..Default::default()
    }
}

fn pod(name: &str, cpu: i64) -> Pod {
    Pod::new("default", name, ResourceList::cpu_mem(cpu, 512 << 20))
}

fn zones(values: &[&str]) -> Requirements {
    let mut r = Requirements::new();
    r.add(labels::ZONE, Requirement::is_in(values.iter().copied()));
    r
}

#[test]
fn volume_topology_alternatives_are_tried_in_order() {
    let snap = snapshot(vec![NodePool::new("default", zones(&["us-east-1a", "us-east-1b"]))]);
    let mut p = pod("db", 500);
    // The first alternative (a zone the pool cannot use) fails; the second is taken.
    p.volume_requirements = vec![zones(&["us-east-1f"]), zones(&["us-east-1b"])];
    let r = solve(&snap, &[p], &SolveOptions::default());
    assert!(r.errors.is_empty(), "{:?}", r.errors);
    assert_eq!(r.claims[0].launch.as_ref().map(|l| l.zone.as_str()), Some("us-east-1b"));
}

#[test]
fn volume_topology_with_no_usable_alternative_is_an_error() {
    let snap = snapshot(vec![NodePool::new("default", zones(&["us-east-1a"]))]);
    let mut p = pod("db", 500);
    p.volume_requirements = vec![zones(&["us-east-1f"])];
    let r = solve(&snap, &[p], &SolveOptions::default());
    assert_eq!(r.errors.len(), 1);
    assert!(r.errors[0].1.contains("incompatible volume requirements"), "{}", r.errors[0].1);
}

#[test]
fn in_flight_capacity_without_labels_is_used_through_its_requirements() {
    let mut snap = snapshot(vec![NodePool::new("default", Requirements::new())]);
    // A NodeClaim launched earlier: no zone label yet, but its requirements pin a zone.
    snap.nodes.push(Node {
        name: "default-abcde".into(),
        labels: [(labels::NODEPOOL.to_string(), "default".to_string())].into(),
        capacity: ResourceList::cpu_mem(4000, 16 << 30),
        allocatable: ResourceList::from_pairs([
            (ResourceName::Cpu, 3920),
            (ResourceName::Memory, 14 << 30),
            (ResourceName::Pods, 58),
        ]),
        initialized: false,
        requirements: Some(zones(&["us-east-1c"])),
        ..Default::default()
    });
    let mut fits = pod("fits", 1000);
    fits.node_selector.insert(labels::ZONE.into(), "us-east-1c".into());
    let mut elsewhere = pod("elsewhere", 1000);
    elsewhere.node_selector.insert(labels::ZONE.into(), "us-east-1a".into());
    let r = solve(&snap, &[fits, elsewhere], &SolveOptions::default());
    assert_eq!(r.existing.len(), 1);
    assert_eq!(r.existing[0].pods, vec![0]);
    assert_eq!(r.claims.len(), 1);
    assert_eq!(r.claims[0].pods, vec![1]);
}

#[test]
fn a_subset_of_pools_and_pods_can_be_solved() {
    let a = NodePool { weight: 10, ..NodePool::new("a", Requirements::new()) };
    let b = NodePool::new("b", Requirements::new());
    let full = snapshot(vec![a.clone(), b.clone()]);
    let only_b = snapshot(vec![b]);
    let pods = vec![pod("x", 500), pod("y", 500)];
    let r = solve(&full, &pods, &SolveOptions::default());
    assert_eq!(full.nodepools[r.claims[0].pool].pool.name, "a");
    let r = solve(&only_b, &pods[1..], &SolveOptions::default());
    assert_eq!(only_b.nodepools[r.claims[0].pool].pool.name, "b");
    assert_eq!(r.claims[0].pods, vec![0]);
}

#[test]
fn solves_are_deterministic() {
    let snap = snapshot(vec![NodePool::new("default", Requirements::new())]);
    let pods: Vec<Pod> = (0..50).map(|i| pod(&format!("p{i}"), 100 + (i % 7) * 150)).collect();
    let a = solve(&snap, &pods, &SolveOptions::default());
    let b = solve(&snap, &pods, &SolveOptions::default());
    let key = |r: &Results| {
        r.claims
            .iter()
            .map(|c| (c.pods.clone(), c.instance_types.clone(), c.launch.clone().map(|l| (l.zone, l.instance_type))))
            .collect::<Vec<_>>()
    };
    assert_eq!(key(&a), key(&b));
}

#[test]
fn claims_carry_price_ordered_candidates_and_capacity_types() {
    let snap = snapshot(vec![NodePool::new("default", Requirements::new())]);
    let r = solve(&snap, &[pod("p", 500)], &SolveOptions { max_instance_types: 5, ..Default::default() });
    let c = &r.claims[0];
    assert_eq!(c.instance_types.len(), 5);
    let its = &snap.nodepools[0].instance_types;
    let prices: Vec<f64> = c.instance_types.iter().map(|&t| its[t as usize].cheapest_price(&c.requirements)).collect();
    assert!(prices.windows(2).all(|w| w[0] <= w[1]), "{prices:?}");
    let ct = c.requirements.get(labels::CAPACITY_TYPE);
    assert!(ct.has("spot") && ct.has("on-demand"));
    assert!(c.full_requirements(its).get(labels::INSTANCE_TYPE).values().len() == 5);
    assert!(!c.requirements.has(labels::HOSTNAME), "the placeholder hostname is removed");
}

#[test]
fn ignore_preference_policy_drops_preferred_affinity() {
    let snap = snapshot(vec![NodePool::new("default", zones(&["us-east-1a", "us-east-1b"]))]);
    let mut p = pod("p", 500);
    p.node_affinity.preferred.push((50, zones(&["us-east-1b"])));
    let respect = solve(&snap, std::slice::from_ref(&p), &SolveOptions::default());
    assert_eq!(respect.claims[0].launch.as_ref().map(|l| l.zone.as_str()), Some("us-east-1b"));
    let ignore =
        solve(&snap, &[p], &SolveOptions { preference_policy: PreferencePolicy::Ignore, ..Default::default() });
    assert!(ignore.claims[0].requirements.get(labels::ZONE).has("us-east-1a"));
}

#[test]
fn best_effort_min_values_relaxes_and_marks_the_claim() {
    let mut reqs = Requirements::new();
    reqs.add(labels::INSTANCE_FAMILY, Requirement::is_in(["m5", "c5"]).with_min_values(Some(2)));
    let snap = snapshot(vec![NodePool::new("default", reqs)]);
    let strict = solve(&snap, &[pod("p", 500)], &SolveOptions::default());
    assert_eq!(strict.errors.len(), 1, "only m5 types exist in this catalog slice");
    let relaxed = solve(
        &snap,
        &[pod("p", 500)],
        &SolveOptions { min_values_policy: MinValuesPolicy::BestEffort, ..Default::default() },
    );
    assert!(relaxed.errors.is_empty());
    assert!(relaxed.claims[0].min_values_relaxed);
    assert_eq!(relaxed.claims[0].requirements.get(labels::INSTANCE_FAMILY).min_values, Some(1));
}

#[test]
fn pod_classes_group_identical_pods_whatever_their_names() {
    let mut labelled = pod("c", 500);
    labelled.labels.insert("app".into(), "web".into());
    let pods = vec![pod("a", 500), pod("b", 1000), labelled, pod("d", 500), pod("e", 1000)];
    assert_eq!(pod_classes(&pods), vec![0, 1, 2, 0, 1]);
    assert!(pod_classes(&[]).is_empty());
}

/// The layout the module docs describe: every file of the scheduling module stays under
/// 500 lines of code before its tests, and its stages (the modules beside `mod.rs`) depend
/// on each other without a cycle, so the pipeline reads in one direction. Read from the
/// source tree when the test runs.
#[test]
fn scheduling_modules_are_small_and_acyclic() {
    use std::collections::{BTreeMap, BTreeSet};
    #[allow(clippy::disallowed_methods, reason = "the checkout the test runs in, from cargo at run time")]
    let root = std::path::PathBuf::from(
        std::env::var("CARGO_MANIFEST_DIR").unwrap_or_else(|_| env!("CARGO_MANIFEST_DIR").to_string()),
    )
    .join("src/scheduling");
    // Every .rs file under the module, with the stage (top-level module) it belongs to.
    let mut files: Vec<(String, std::path::PathBuf)> = Vec::new();
    for entry in std::fs::read_dir(&root).expect("scheduling dir") {
        let path = entry.expect("entry").path();
        let name = path.file_stem().and_then(|s| s.to_str()).unwrap_or_default().to_string();
        if path.is_dir() {
            for inner in std::fs::read_dir(&path).expect("stage dir") {
                files.push((name.clone(), inner.expect("entry").path()));
            }
        } else if name != "mod" && name != "tests" {
            files.push((name, path));
        }
    }
    let stages: BTreeSet<String> = files.iter().map(|(s, _)| s.clone()).collect();
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (stage, path) in &files {
        let text = std::fs::read_to_string(path).expect("source");
        let code = text.split("#[cfg(test)]").next().unwrap_or_default();
        let lines = code.lines().count();
        assert!(lines <= 500, "{}: {lines} lines of code (at most 500)", path.display());
        // The path that names the scheduling module from this file: `super::` from a stage
        // file or a stage's `mod.rs`, `super::super::` from a file inside a stage.
        let nested = path.parent() != Some(root.as_path()) && path.file_stem().is_some_and(|s| s != "mod");
        let relative = if nested { "super::super::" } else { "super::" };
        for prefix in [relative, "crate::scheduling::"] {
            for named in names_after(code, prefix) {
                if named != *stage && stages.contains(&named) {
                    edges.entry(stage.clone()).or_default().insert(named);
                }
            }
        }
    }
    /// The first segment of every path `code` writes after `prefix`, with each element of a
    /// `{a, b::c, d}` group (`super::super::x` is not read as `super::x`).
    fn names_after(code: &str, prefix: &str) -> Vec<String> {
        let mut out = Vec::new();
        let mut rest = code;
        while let Some(at) = rest.find(prefix) {
            let before = &rest[..at];
            rest = &rest[at + prefix.len()..];
            if before.ends_with("super::") || before.ends_with(|c: char| c.is_alphanumeric() || c == '_') {
                continue;
            }
            if let Some(group) = rest.strip_prefix('{') {
                // Elements at depth 0 of the group.
                let (mut depth, mut start) = (0usize, 0usize);
                for (i, ch) in group.char_indices() {
                    match ch {
                        '{' => depth += 1,
                        '}' if depth == 0 => {
                            out.extend(first_segment(&group[start..i]));
                            break;
                        }
                        '}' => depth -= 1,
                        ',' if depth == 0 => {
                            out.extend(first_segment(&group[start..i]));
                            start = i + 1;
                        }
                        _ => {}
                    }
                }
            } else {
                out.extend(first_segment(rest));
            }
        }
        out
    }
    fn first_segment(s: &str) -> Option<String> {
        let s = s.trim_start();
        let end = s.find(|c: char| !(c.is_alphanumeric() || c == '_')).unwrap_or(s.len());
        (end > 0).then(|| s[..end].to_string())
    }
    // Depth-first search for a cycle.
    fn visit(
        n: &str,
        edges: &BTreeMap<String, BTreeSet<String>>,
        state: &mut BTreeMap<String, u8>,
        path: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        match state.get(n) {
            Some(2) => return None,
            Some(1) => {
                let start = path.iter().position(|p| p == n).unwrap_or(0);
                let mut cycle = path[start..].to_vec();
                cycle.push(n.to_string());
                return Some(cycle);
            }
            _ => {}
        }
        state.insert(n.to_string(), 1);
        path.push(n.to_string());
        for m in edges.get(n).into_iter().flatten() {
            if let Some(c) = visit(m, edges, state, path) {
                return Some(c);
            }
        }
        path.pop();
        state.insert(n.to_string(), 2);
        None
    }
    let mut state = BTreeMap::new();
    for s in &stages {
        let cycle = visit(s, &edges, &mut state, &mut Vec::new());
        assert!(cycle.is_none(), "module cycle: {}", cycle.unwrap_or_default().join(" -> "));
    }
    assert!(edges.get("pack").is_some_and(|e| e.contains("scheduler")), "the scan sees pack's imports: {edges:?}");
    assert!(edges.get("improve").is_some_and(|e| e.contains("price")), "and nested files' imports: {edges:?}");
}
