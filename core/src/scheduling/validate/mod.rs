//! An independent check of a plan: every claim and placement of [`Results`] is rechecked
//! against the raw catalog (capacity minus the overhead model), the DaemonSets that would
//! land on each node, and every constraint the pods and NodePools state, with the nodes'
//! final labels. It shares no code with the solve beyond the model (requirements, label
//! selectors, taints), so a packer bug cannot hide behind the code that made it.
//!
//! What "final" means: a new claim becomes a node of its launch type in its launch zone
//! and capacity type, with every label its requirements pin to one value; topology rules
//! are checked on that end state (for `maxSkew`, skew only grows by placement, so a plan
//! whose every placement kept the skew also keeps it at the end).

use std::collections::HashMap;

use crate::catalog::InstanceType;
use crate::labels::{self, Labels};
use crate::pod::Pod;
use crate::requirements::{Operator, Requirement, Requirements};
use crate::resources::{ResourceList, ResourceName};
use crate::taints::{self, Effect, Taint};

mod topology;

use crate::scheduling::input::Snapshot;
use crate::scheduling::output::{NewClaim, Results};

use topology::{check_anti_affinity, check_spread_and_affinity};

/// A node of the plan's end state: an existing node, or a new claim as launched.
struct EndNode {
    name: String,
    labels: Labels,
    /// Taints pods must tolerate (NoSchedule, NoExecute).
    taints: Vec<Taint>,
}

/// How zones count for topology spread and pod affinity.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Semantics {
    /// Every pod counts in the zone it will run in (what kube-scheduler sees when it binds
    /// the pods in plan order). The dovetail packer is held to this.
    Strict,
    /// Karpenter's batch semantics: a pod counts in a zone only if its claim was pinned to
    /// that zone when the pod was placed (pods on claims whose zone was still open are not
    /// counted; `Placement::zone`). The parity packer is held to this.
    Karpenter,
}

/// Checks a plan; returns one line per violation (empty when the plan holds).
pub fn validate(snapshot: &Snapshot, pods: &[Pod], results: &Results, semantics: Semantics) -> Vec<String> {
    let mut out = Vec::new();
    check_accounting(pods, results, &mut out);

    // The end state: existing nodes, then one node per claim.
    let mut nodes: Vec<EndNode> = snapshot
        .nodes
        .iter()
        .map(|n| {
            let mut l: crate::labels::Labels = (*n.labels).clone();
            l.entry(labels::HOSTNAME.to_string()).or_insert_with(|| n.name.clone());
            EndNode { name: n.name.clone(), labels: l, taints: n.effective_taints() }
        })
        .collect();
    let mut node_of: HashMap<usize, usize> = HashMap::new();
    let node_by_name: HashMap<&str, usize> =
        snapshot.nodes.iter().enumerate().map(|(i, n)| (n.name.as_str(), i)).collect();
    for (ci, c) in results.claims.iter().enumerate() {
        let input = &snapshot.nodepools[c.pool];
        let its = &input.instance_types;
        let name = format!("claim {ci} (nodepool {:?})", input.pool.name);
        let Some(launch) = &c.launch else {
            out.push(format!("{name}: no launch"));
            continue;
        };
        check_claim(&name, snapshot, pods, c, &mut out);
        let labels = claim_labels(c, its, launch.instance_type, &launch.zone, launch.capacity_type.as_str(), ci);
        let taints = input.pool.taints.clone();
        node_of.extend(c.pods.iter().map(|&p| (p, nodes.len())));
        nodes.push(EndNode { name, labels, taints });
    }
    for e in &results.existing {
        node_of.extend(e.pods.iter().map(|&p| (p, e.node)));
        check_existing(snapshot, pods, e.node, &e.pods, &mut out);
    }

    // Every placed pod: its node requirements and taints.
    for (&p, &n) in &node_of {
        let pod = &pods[p];
        let node = &nodes[n];
        if !pod_fits_labels(pod, &node.labels) {
            out.push(format!("pod {}: node selector or required node affinity not met on {}", pod.key, node.name));
        }
        let hard: Vec<Taint> = node.taints.iter().filter(|t| t.effect != Effect::PreferNoSchedule).cloned().collect();
        if let Some(t) = taints::first_untolerated(&hard, &pod.tolerations) {
            out.push(format!("pod {}: does not tolerate taint {t} of {}", pod.key, node.name));
        }
    }

    // Topology, over bound and placed pods alike.
    let mut members: Vec<(&Pod, usize, Option<usize>)> = Vec::new(); // (pod, node, pending index)
    for bp in snapshot.bound_pods.iter().filter(|p| !p.terminal) {
        if let Some(&n) = bp.node_name.as_deref().and_then(|n| node_by_name.get(n)) {
            members.push((bp, n, None));
        }
    }
    let position: HashMap<usize, usize> = results.order.iter().enumerate().map(|(i, pl)| (pl.pod, i)).collect();
    let mut placed: Vec<usize> = node_of.keys().copied().collect();
    placed.sort_by_key(|p| position.get(p).copied().unwrap_or(usize::MAX));
    for &p in &placed {
        members.push((&pods[p], node_of[&p], Some(p)));
    }
    check_limits(snapshot, results, &mut out);
    let recorded: HashMap<usize, Option<&str>> = if semantics == Semantics::Karpenter {
        results.order.iter().map(|pl| (pl.pod, pl.zone.as_deref())).collect()
    } else {
        HashMap::new()
    };
    let domain_of = |mi: usize, key: &str| -> Option<String> {
        let (_, n, pending) = members[mi];
        match pending {
            Some(p) if semantics == Semantics::Karpenter && key == labels::ZONE => {
                recorded.get(&p).copied().flatten().map(str::to_string)
            }
            _ => domain(&nodes, n, key).map(str::to_string),
        }
    };
    check_spread_and_affinity(snapshot, &nodes, &members, &domain_of, &mut out);
    check_anti_affinity(snapshot, &nodes, &members, &mut out);
    out
}

/// Every pending pod is placed exactly once or has a reason.
fn check_accounting(pods: &[Pod], results: &Results, out: &mut Vec<String>) {
    let mut seen = vec![0u32; pods.len()];
    for p in
        results.claims.iter().flat_map(|c| c.pods.iter()).chain(results.existing.iter().flat_map(|e| e.pods.iter()))
    {
        if let Some(s) = seen.get_mut(*p) {
            *s += 1;
        }
    }
    for (p, _) in &results.errors {
        if let Some(s) = seen.get_mut(*p) {
            *s += 1;
        }
    }
    for (i, s) in seen.iter().enumerate() {
        if *s != 1 {
            out.push(format!("pod {}: placed or rejected {s} times, expected once", pods[i].key));
        }
    }
    for (p, reason) in &results.errors {
        if reason.trim().is_empty() {
            out.push(format!("pod {}: unschedulable without a reason", pods[*p].key));
        }
    }
}

/// The labels a claim's node has once launched as type `t` in `zone`.
fn claim_labels(c: &NewClaim, its: &[InstanceType], t: usize, zone: &str, ct: &str, index: usize) -> Labels {
    let mut l = Labels::new();
    for (k, r) in c.requirements.iter() {
        if r.operator() == Operator::In && r.values().len() == 1 {
            l.insert(k.to_string(), r.values()[0].clone());
        }
    }
    for (k, r) in its[t].requirements.iter() {
        if r.operator() == Operator::In && r.values().len() == 1 {
            l.insert(k.to_string(), r.values()[0].clone());
        }
    }
    l.insert(labels::INSTANCE_TYPE.to_string(), its[t].name.clone());
    l.insert(labels::ZONE.to_string(), zone.to_string());
    if let Some(o) = its[t].offerings.iter().find(|o| o.zone == zone) {
        l.insert(labels::ZONE_ID.to_string(), o.zone_id.clone());
    }
    l.insert(labels::CAPACITY_TYPE.to_string(), ct.to_string());
    l.insert(labels::HOSTNAME.to_string(), format!("validate-claim-{index}"));
    l
}

/// Whether a label value (or its absence) satisfies a requirement, as a node selector
/// does: an absent label only satisfies `NotIn` and `DoesNotExist`.
fn label_ok(r: &Requirement, value: Option<&str>) -> bool {
    match value {
        Some(v) => r.has(v),
        None => {
            matches!(r.operator(), Operator::NotIn | Operator::DoesNotExist) && r.gte().is_none() && r.lte().is_none()
        }
    }
}

fn labels_satisfy(reqs: &Requirements, l: &Labels) -> bool {
    reqs.iter().all(|(k, r)| label_ok(r, l.get(labels::normalize_key(k)).or_else(|| l.get(k)).map(String::as_str)))
}

/// A pod's node selector and (any one of) its required node affinity terms hold.
fn pod_fits_labels(pod: &Pod, l: &Labels) -> bool {
    let selector_ok = pod
        .node_selector
        .iter()
        .all(|(k, v)| l.get(labels::normalize_key(k)).or_else(|| l.get(k.as_str())).is_some_and(|have| have == v));
    selector_ok
        && (pod.node_affinity.required.is_empty() || pod.node_affinity.required.iter().any(|t| labels_satisfy(t, l)))
}

/// The DaemonSets that would run on a node with these labels and taints, summed, with
/// their host ports.
fn daemon_load(snapshot: &Snapshot, l: &Labels, node_taints: &[Taint]) -> (ResourceList, Vec<crate::pod::HostPort>) {
    let mut load = ResourceList::new();
    let mut ports = Vec::new();
    for ds in &snapshot.daemonsets {
        let hard: Vec<Taint> = node_taints.iter().filter(|t| t.effect != Effect::PreferNoSchedule).cloned().collect();
        if taints::tolerates_all(&hard, &ds.tolerations) && pod_fits_labels(ds, l) {
            load.add(&ds.requests_with_pod_slot());
            ports.extend(ds.host_ports.iter().cloned());
        }
    }
    (load, ports)
}

fn check_claim(name: &str, snapshot: &Snapshot, pods: &[Pod], c: &NewClaim, out: &mut Vec<String>) {
    let input = &snapshot.nodepools[c.pool];
    let pool = &input.pool;
    let its = &input.instance_types;
    let Some(launch) = &c.launch else { return };
    if c.pods.is_empty() {
        out.push(format!("{name}: no pods"));
    }
    if c.instance_types.is_empty() || c.instance_types.len() > 600 {
        out.push(format!("{name}: {} candidate types (1 to 600 expected)", c.instance_types.len()));
    }
    if !c.instance_types.contains(&(launch.instance_type as u32)) {
        out.push(format!("{name}: launches {} which is not a candidate", its[launch.instance_type].name));
    }
    // The launch offering.
    let offering = its[launch.instance_type]
        .offerings
        .iter()
        .find(|o| o.zone == launch.zone && o.capacity_type == launch.capacity_type);
    match offering {
        None => out.push(format!(
            "{name}: {} has no {} offering in {}",
            its[launch.instance_type].name,
            launch.capacity_type.as_str(),
            launch.zone
        )),
        Some(o) => {
            if !o.available {
                out.push(format!("{name}: launches an unavailable offering"));
            }
            if (o.price - launch.price).abs() > 1e-9 {
                out.push(format!("{name}: launch price {} differs from the catalog's {}", launch.price, o.price));
            }
        }
    }
    let requests: ResourceList = c.pods.iter().fold(ResourceList::new(), |mut acc, &p| {
        acc.add(&pods[p].requests_with_pod_slot());
        acc
    });
    let ports: Vec<&crate::pod::HostPort> = c.pods.iter().flat_map(|&p| pods[p].host_ports.iter()).collect();
    for (i, a) in ports.iter().enumerate() {
        if ports[i + 1..].iter().any(|b| a.conflicts(b)) {
            out.push(format!("{name}: host port {} used twice", a.port));
        }
    }
    // Every candidate: meets the claim's and the pool's requirements, offers a compatible
    // available offering, and fits the pods with the DaemonSets that land on it.
    let ct_req = c.requirements.get(labels::CAPACITY_TYPE);
    let zone_req = c.requirements.get(labels::ZONE);
    let mut checked: Vec<usize> = c.instance_types.iter().map(|&t| t as usize).collect();
    if !checked.contains(&launch.instance_type) {
        checked.push(launch.instance_type);
    }
    for &t in &checked {
        let it = &its[t];
        let tname = &it.name;
        if !it.requirements.intersects_ok(&c.requirements) || !it.requirements.intersects_ok(&pool.requirements) {
            out.push(format!("{name}: candidate {tname} does not meet the claim's requirements"));
        }
        if !it.offerings.iter().any(|o| o.available && ct_req.has(o.capacity_type.as_str()) && zone_req.has(&o.zone)) {
            out.push(format!("{name}: candidate {tname} has no available offering the claim allows"));
        }
        let (load, ds_ports) = if snapshot.daemonsets.is_empty() {
            (ResourceList::new(), Vec::new())
        } else {
            let l = claim_labels(c, its, t, &launch.zone, launch.capacity_type.as_str(), 0);
            daemon_load(snapshot, &l, &pool.taints)
        };
        let allocatable = it.capacity.subtracted(&it.overhead);
        let need = requests.merged(&load);
        if !need.fits_in(&allocatable) {
            out.push(format!(
                "{name}: pods and DaemonSets need {} but candidate {tname} allocates {}",
                need, allocatable
            ));
        }
        if ports.iter().any(|p| ds_ports.iter().any(|q| p.conflicts(q))) {
            out.push(format!("{name}: a pod's host port collides with a DaemonSet's on {tname}"));
        }
    }
    // The launch zone and capacity type are ones the claim allows.
    if !zone_req.has(&launch.zone) || !ct_req.has(launch.capacity_type.as_str()) {
        out.push(format!("{name}: launch {} {} outside its requirements", launch.zone, launch.capacity_type.as_str()));
    }
    // minValues, unless relaxed.
    if !c.min_values_relaxed {
        for (k, r) in pool.requirements.iter() {
            if let Some(n) = r.min_values {
                let mut values: Vec<&str> = Vec::new();
                for t in c.instance_types.iter().map(|&t| t as usize) {
                    let v = if k == labels::INSTANCE_TYPE {
                        Some(its[t].name.as_str())
                    } else {
                        its[t].requirements.get(k).values().first().map(String::as_str)
                    };
                    if let Some(v) = v
                        && !values.contains(&v)
                    {
                        values.push(v);
                    }
                }
                if values.len() < n as usize {
                    out.push(format!(
                        "{name}: {k} has {} distinct values over candidates, minValues {n}",
                        values.len()
                    ));
                }
            }
        }
    }
}

/// Pods placed on an existing node fit next to what runs there, and their host ports too.
fn check_existing(snapshot: &Snapshot, pods: &[Pod], n: usize, placed: &[usize], out: &mut Vec<String>) {
    let node = &snapshot.nodes[n];
    let mut used = ResourceList::new();
    let mut ports: Vec<&crate::pod::HostPort> = Vec::new();
    for bp in snapshot.bound_pods.iter().filter(|p| !p.terminal && p.node_name.as_deref() == Some(node.name.as_str())) {
        used.add(&bp.requests_with_pod_slot());
        ports.extend(bp.host_ports.iter());
    }
    for &p in placed {
        used.add(&pods[p].requests_with_pod_slot());
        for hp in &pods[p].host_ports {
            if ports.iter().any(|q| hp.conflicts(q)) {
                out.push(format!("pod {}: host port {} already used on node {}", pods[p].key, hp.port, node.name));
            }
            ports.push(hp);
        }
    }
    if !used.fits_in(&node.allocatable) {
        out.push(format!("node {}: pods need {used} but it allocates {}", node.name, node.allocatable));
    }
}

/// The domain of a node for a topology key (its label value).
fn domain<'n>(nodes: &'n [EndNode], n: usize, key: &str) -> Option<&'n str> {
    nodes[n].labels.get(key).map(String::as_str)
}

/// NodePool limits hold over the pool's existing nodes and new claims (at launch capacity).
fn check_limits(snapshot: &Snapshot, results: &Results, out: &mut Vec<String>) {
    for (pi, input) in snapshot.nodepools.iter().enumerate() {
        let limits = &input.pool.limits;
        if limits.is_empty() {
            continue;
        }
        let mut total = ResourceList::new();
        let mut count = 0i64;
        for node in snapshot.nodes.iter().filter(|n| n.nodepool() == Some(input.pool.name.as_str())) {
            total.add(&node.capacity);
            count += 1;
        }
        for c in results.claims.iter().filter(|c| c.pool == pi) {
            if let Some(l) = &c.launch {
                total.add(&input.instance_types[l.instance_type].capacity);
                count += 1;
            }
        }
        total.set(ResourceName::Nodes, count);
        for (r, limit) in limits.iter() {
            if total.get(r) > limit {
                out.push(format!("nodepool {:?}: {r} {} exceeds its limit {limit}", input.pool.name, total.get(r)));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::catalog::{Catalog, NodeClassSettings};
    use crate::labels::LabelSelector;
    use crate::nodepool::NodePool;
    use crate::pod::{PodAffinityTerm, TopologySpreadConstraint, WhenUnsatisfiable};
    use crate::scheduling::{PoolInput, SolveOptions, solve};

    fn snapshot(pool: NodePool) -> Snapshot {
        let c = Catalog::embedded("us-east-1").expect("catalog");
        let types: Vec<InstanceType> = c
            .instance_types(&NodeClassSettings::default(), None)
            .into_iter()
            .filter(|t| t.name.starts_with("m5.") || t.name.starts_with("m6g."))
            .collect();
        Snapshot { nodepools: vec![PoolInput { pool, instance_types: Arc::new(types) }], ..Default::default() }
    }

    fn pod(name: &str, cpu: i64, app: &str) -> Pod {
        let mut p = Pod::new("default", name, ResourceList::cpu_mem(cpu, 1 << 30));
        p.labels.insert("app".into(), app.into());
        p
    }

    fn term(app: &str, key: &str) -> PodAffinityTerm {
        PodAffinityTerm {
            selector: Some(LabelSelector::from_labels([("app", app)])),
            namespaces: vec![],
            namespace_selector: None,
            topology_key: key.into(),
        }
    }

    fn index_of(snap: &Snapshot, name: &str) -> usize {
        snap.nodepools[0].instance_types.iter().position(|t| t.name == name).expect("type")
    }

    fn has(v: &[String], what: &str) -> bool {
        v.iter().any(|l| l.contains(what))
    }

    #[test]
    fn a_sound_plan_passes_and_a_crowded_launch_fails() {
        let snap = snapshot(NodePool::new("default", Requirements::new()));
        let pods: Vec<Pod> = (0..6).map(|i| pod(&format!("p{i}"), 1000, "web")).collect();
        let mut r = solve(&snap, &pods, &SolveOptions::default());
        assert!(validate(&snap, &pods, &r, Semantics::Strict).is_empty());
        // Launch the six-core claim as a two-core type that is not among its candidates.
        let small = index_of(&snap, "m5.large");
        let c = &mut r.claims[0];
        c.instance_types.retain(|&t| t as usize != small);
        c.launch.as_mut().expect("launch").instance_type = small;
        let v = validate(&snap, &pods, &r, Semantics::Strict);
        assert!(has(&v, "not a candidate"), "{v:#?}");
        assert!(has(&v, "candidate m5.large allocates"), "{v:#?}");
    }

    #[test]
    fn candidates_too_small_for_the_pods_are_reported() {
        let snap = snapshot(NodePool::new("default", Requirements::new()));
        let pods: Vec<Pod> = (0..6).map(|i| pod(&format!("p{i}"), 1000, "web")).collect();
        let mut r = solve(&snap, &pods, &SolveOptions::default());
        let small = index_of(&snap, "m5.large");
        r.claims[0].instance_types.push(small as u32);
        let v = validate(&snap, &pods, &r, Semantics::Strict);
        assert!(has(&v, "candidate m5.large allocates"), "{v:#?}");
    }

    #[test]
    fn daemonsets_count_against_every_candidate() {
        let mut snap = snapshot(NodePool::new("default", Requirements::new()));
        let pods = vec![pod("a", 1000, "web")];
        let r = solve(&snap, &pods, &SolveOptions::default());
        assert!(validate(&snap, &pods, &r, Semantics::Strict).is_empty());
        // A DaemonSet the solve did not know about now takes more than any candidate has.
        let mut ds = Pod::new("kube-system", "hog", ResourceList::cpu_mem(1_000_000, 1 << 30));
        ds.daemon = true;
        snap.daemonsets.push(ds);
        let v = validate(&snap, &pods, &r, Semantics::Strict);
        assert!(has(&v, "pods and DaemonSets need"), "{v:#?}");
    }

    #[test]
    fn node_selectors_hold_on_the_launched_type() {
        let snap = snapshot(NodePool::new("default", Requirements::new()));
        let mut p = pod("arm", 500, "web");
        p.node_selector.insert(labels::ARCH.into(), "arm64".into());
        let pods = vec![p];
        let mut r = solve(&snap, &pods, &SolveOptions::default());
        assert!(validate(&snap, &pods, &r, Semantics::Strict).is_empty());
        let intel = index_of(&snap, "m5.xlarge");
        r.claims[0].instance_types.push(intel as u32);
        r.claims[0].launch.as_mut().expect("launch").instance_type = intel;
        let v = validate(&snap, &pods, &r, Semantics::Strict);
        assert!(has(&v, "node selector or required node affinity not met"), "{v:#?}");
        assert!(has(&v, "has no spot offering") || has(&v, "price"), "{v:#?}");
    }

    #[test]
    fn anti_affinity_pairs_on_one_node_are_reported() {
        let snap = snapshot(NodePool::new("default", Requirements::new()));
        let pods: Vec<Pod> = (0..2)
            .map(|i| {
                let mut p = pod(&format!("zk{i}"), 500, "zk");
                p.pod_anti_affinity.required.push(term("zk", labels::HOSTNAME));
                p
            })
            .collect();
        let mut r = solve(&snap, &pods, &SolveOptions::default());
        assert_eq!(r.claims.len(), 2);
        assert!(validate(&snap, &pods, &r, Semantics::Strict).is_empty());
        let moved = r.claims[1].pods.pop().expect("pod");
        r.claims[0].pods.push(moved);
        r.claims.truncate(1);
        let v = validate(&snap, &pods, &r, Semantics::Strict);
        assert!(has(&v, "required anti-affinity"), "{v:#?}");
    }

    #[test]
    fn zone_spread_is_replayed_against_the_launch_zones() {
        let snap = snapshot(NodePool::new("default", Requirements::new()));
        let pods: Vec<Pod> = (0..3)
            .map(|i| {
                let mut p = pod(&format!("s{i}"), 500, "s");
                p.pod_anti_affinity.required.push(term("s", labels::HOSTNAME));
                p.topology_spread.push(TopologySpreadConstraint {
                    max_skew: 1,
                    topology_key: labels::ZONE.into(),
                    when_unsatisfiable: WhenUnsatisfiable::DoNotSchedule,
                    selector: Some(LabelSelector::from_labels([("app", "s")])),
                    min_domains: None,
                    node_affinity_policy: None,
                    node_taints_policy: None,
                    match_label_keys: vec![],
                });
                p
            })
            .collect();
        let mut r = solve(&snap, &pods, &SolveOptions::default());
        assert_eq!(r.claims.len(), 3);
        assert!(validate(&snap, &pods, &r, Semantics::Strict).is_empty());
        let zone = r.claims[0].launch.as_ref().expect("launch").zone.clone();
        for c in &mut r.claims {
            c.launch.as_mut().expect("launch").zone = zone.clone();
        }
        let v = validate(&snap, &pods, &r, Semantics::Strict);
        assert!(has(&v, "beyond maxSkew"), "{v:#?}");
    }

    #[test]
    fn lost_pods_and_limits_are_reported() {
        let mut pool = NodePool::new("default", Requirements::new());
        pool.limits.set(ResourceName::Cpu, 8000);
        let snap = snapshot(pool);
        let pods: Vec<Pod> = (0..3).map(|i| pod(&format!("p{i}"), 1000, "web")).collect();
        let mut r = solve(&snap, &pods, &SolveOptions::default());
        assert!(validate(&snap, &pods, &r, Semantics::Strict).is_empty());
        let extra = r.claims[0].clone();
        r.claims.push(extra.clone());
        r.claims.push(extra);
        let v = validate(&snap, &pods, &r, Semantics::Strict);
        assert!(has(&v, "exceeds its limit"), "{v:#?}");
        assert!(has(&v, "placed or rejected 3 times"), "{v:#?}");
        r.claims.clear();
        let v = validate(&snap, &pods, &r, Semantics::Strict);
        assert!(has(&v, "placed or rejected 0 times"), "{v:#?}");
    }

    #[test]
    fn absent_labels_satisfy_only_negative_operators() {
        assert!(label_ok(&Requirement::not_in(["a"]), None));
        assert!(label_ok(&Requirement::does_not_exist(), None));
        assert!(!label_ok(&Requirement::exists(), None));
        assert!(!label_ok(&Requirement::is_in(["a"]), None));
        assert!(label_ok(&Requirement::is_in(["a"]), Some("a")));
        assert!(!label_ok(&Requirement::not_in(["a"]), Some("a")));
    }
}
