//! Property tests: the requirements algebra, quantity parsing, and the solve's invariants
//! (every pending pod is placed or has a reason; limits are never exceeded).

use std::sync::{Arc, OnceLock};

use dovetail_core::catalog::{Catalog, InstanceType, NodeClassSettings};
use dovetail_core::labels::{self, LabelSelector};
use dovetail_core::nodepool::NodePool;
use dovetail_core::pod::{Pod, PodAffinityTerm, TopologySpreadConstraint, WhenUnsatisfiable};
use dovetail_core::quantity::Quantity;
use dovetail_core::requirements::{Operator, Requirement, Requirements};
use dovetail_core::resources::{ResourceList, ResourceName};
use dovetail_core::scheduling::{self, PoolInput, Snapshot, SolveOptions};
use dovetail_core::taints::{Effect, Taint, Toleration};
use proptest::prelude::*;

const UNIVERSE: &[&str] = &["0", "1", "2", "3", "4", "5", "7", "9", "a", "b", "c"];

fn requirement() -> impl Strategy<Value = Requirement> {
    let values = proptest::sample::subsequence(UNIVERSE, 0..4);
    let ops = prop_oneof![
        Just(Operator::In),
        Just(Operator::NotIn),
        Just(Operator::Exists),
        Just(Operator::DoesNotExist),
        Just(Operator::Gt),
        Just(Operator::Lt),
        Just(Operator::Gte),
        Just(Operator::Lte),
    ];
    (ops, values, 0i64..8, proptest::option::of(1u32..4)).prop_map(|(op, values, bound, min)| {
        let values: Vec<String> = match op {
            Operator::Gt | Operator::Lt | Operator::Gte | Operator::Lte => vec![bound.to_string()],
            Operator::In if values.is_empty() => vec!["a".to_string()],
            Operator::Exists | Operator::DoesNotExist => vec![],
            _ => values.iter().map(|s| s.to_string()).collect(),
        };
        Requirement::new("k", op, &values).expect("generated values are valid").with_min_values(min)
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn intersection_is_commutative(a in requirement(), b in requirement()) {
        prop_assert_eq!(a.intersection(&b), b.intersection(&a));
    }

    #[test]
    fn intersection_never_widens_and_is_exact(a in requirement(), b in requirement()) {
        let i = a.intersection(&b);
        for v in UNIVERSE.iter().copied().chain(["10", "-1", "x"]) {
            prop_assert!(!i.has(v) || (a.has(v) && b.has(v)), "{v} widened: {a} ∩ {b} = {i}");
            prop_assert!(!(a.has(v) && b.has(v)) || i.has(v), "{v} lost: {a} ∩ {b} = {i}");
        }
    }

    #[test]
    fn intersection_is_associative_on_values(a in requirement(), b in requirement(), c in requirement()) {
        let l = a.intersection(&b).intersection(&c);
        let r = a.intersection(&b.intersection(&c));
        for v in UNIVERSE {
            prop_assert_eq!(l.has(v), r.has(v));
        }
    }

    #[test]
    fn has_intersection_agrees_for_concrete_sets(a in requirement(), b in requirement()) {
        if !a.is_complement() && !b.is_complement() {
            prop_assert_eq!(a.has_intersection(&b), !a.intersection(&b).is_empty());
        }
    }

    #[test]
    fn requirements_compatibility_is_symmetric_on_shared_keys(a in requirement(), b in requirement()) {
        let mut ra = Requirements::new();
        ra.add("k", a);
        let mut rb = Requirements::new();
        rb.add("k", b);
        prop_assert_eq!(ra.intersects(&rb).is_ok(), rb.intersects(&ra).is_ok());
    }
}

fn quantity_string() -> impl Strategy<Value = String> {
    let suffix = prop_oneof![
        Just(""),
        Just("n"),
        Just("u"),
        Just("m"),
        Just("k"),
        Just("M"),
        Just("G"),
        Just("T"),
        Just("Ki"),
        Just("Mi"),
        Just("Gi"),
        Just("Ti"),
        Just("e3"),
        Just("E-2"),
        Just("e0")
    ];
    (prop_oneof![Just(""), Just("+"), Just("-")], 0u64..1_000_000, proptest::option::of(0u32..1000), suffix).prop_map(
        |(sign, int, frac, suffix)| match frac {
            Some(f) => format!("{sign}{int}.{f}{suffix}"),
            None => format!("{sign}{int}{suffix}"),
        },
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(3000))]

    #[test]
    fn quantity_round_trips(s in quantity_string()) {
        let q: Quantity = s.parse().map_err(|e| TestCaseError::fail(format!("{s}: {e}")))?;
        let printed = q.to_string();
        let again: Quantity = printed.parse().map_err(|e| TestCaseError::fail(format!("{printed}: {e}")))?;
        prop_assert_eq!(q, again, "{} -> {} changed value", s, printed);
        prop_assert_eq!(again.to_string(), printed, "printing is not idempotent for {}", s);
    }

    #[test]
    fn quantity_from_milli_round_trips(m in -10_000_000i64..10_000_000) {
        let q = Quantity::from_milli(m);
        let again: Quantity = q.to_string().parse().expect("canonical form parses");
        prop_assert_eq!(again.milli_value(), m);
    }

    #[test]
    fn quantity_bytes_round_trip(b in 0i64..(1 << 50)) {
        let q = Quantity::from_units_binary(b);
        let again: Quantity = q.to_string().parse().expect("canonical form parses");
        prop_assert_eq!(again.value(), b);
    }
}

fn types() -> Arc<Vec<InstanceType>> {
    static TYPES: OnceLock<Arc<Vec<InstanceType>>> = OnceLock::new();
    TYPES
        .get_or_init(|| {
            let c = Catalog::embedded("us-east-1").expect("catalog");
            let keep = ["m5", "c5", "r5", "m6g", "c6g", "m5.metal", "g4dn"];
            Arc::new(
                c.instance_types(&NodeClassSettings::default(), None)
                    .into_iter()
                    .filter(|t| keep.iter().any(|k| t.name.starts_with(&format!("{k}.")) || t.name == *k))
                    .collect(),
            )
        })
        .clone()
}

#[derive(Clone, Debug)]
struct PodSpec {
    cpu: i64,
    mem_mib: i64,
    gpu: bool,
    arch: Option<&'static str>,
    zone: Option<&'static str>,
    app: u8,
    spread: Option<(&'static str, bool)>,
    anti: Option<&'static str>,
    tolerates: bool,
    custom: bool,
}

fn pod_spec() -> impl Strategy<Value = PodSpec> {
    (
        prop_oneof![Just(100i64), Just(500), Just(1000), Just(4000), Just(200_000)],
        prop_oneof![Just(128i64), Just(1024), Just(8192), Just(100_000)],
        proptest::bool::weighted(0.05),
        proptest::option::weighted(0.3, prop_oneof![Just("amd64"), Just("arm64")]),
        proptest::option::weighted(0.2, prop_oneof![Just("us-east-1a"), Just("us-east-1b"), Just("us-east-1e")]),
        0u8..3,
        proptest::option::weighted(0.3, (prop_oneof![Just(labels::ZONE), Just(labels::HOSTNAME)], any::<bool>())),
        proptest::option::weighted(0.2, prop_oneof![Just(labels::ZONE), Just(labels::HOSTNAME)]),
        any::<bool>(),
        proptest::bool::weighted(0.05),
    )
        .prop_map(|(cpu, mem_mib, gpu, arch, zone, app, spread, anti, tolerates, custom)| PodSpec {
            cpu,
            mem_mib,
            gpu,
            arch,
            zone,
            app,
            spread,
            anti,
            tolerates,
            custom,
        })
}

fn make_pod(i: usize, s: &PodSpec) -> Pod {
    let mut requests = ResourceList::cpu_mem(s.cpu, s.mem_mib << 20);
    if s.gpu {
        requests.set(ResourceName::NvidiaGpu, 1);
    }
    let mut p = Pod::new("default", &format!("p-{i}"), requests);
    let app = format!("app-{}", s.app);
    p.labels.insert("app".into(), app.clone());
    p.creation = i as i64;
    if let Some(a) = s.arch {
        p.node_selector.insert(labels::ARCH.into(), a.into());
    }
    if let Some(z) = s.zone {
        p.node_selector.insert(labels::ZONE.into(), z.into());
    }
    if s.custom {
        p.node_selector.insert("example.com/team".into(), "x".into());
    }
    let selector = Some(LabelSelector::from_labels([("app", app.as_str())]));
    if let Some((key, hard)) = s.spread {
        p.topology_spread.push(TopologySpreadConstraint {
            max_skew: 1,
            topology_key: key.into(),
            when_unsatisfiable: if hard { WhenUnsatisfiable::DoNotSchedule } else { WhenUnsatisfiable::ScheduleAnyway },
            selector: selector.clone(),
            min_domains: None,
            node_affinity_policy: None,
            node_taints_policy: None,
            match_label_keys: vec![],
        });
    }
    if let Some(key) = s.anti {
        p.pod_anti_affinity.required.push(PodAffinityTerm {
            selector,
            namespaces: vec![],
            namespace_selector: None,
            topology_key: key.into(),
        });
    }
    if s.tolerates {
        p.tolerations.push(Toleration::exists("dedicated", None));
    }
    p
}

#[derive(Clone, Debug)]
struct PoolSpec {
    weight: i32,
    arch: Option<&'static str>,
    tainted: bool,
    cpu_limit: Option<i64>,
    nodes_limit: Option<i64>,
}

fn pool_spec() -> impl Strategy<Value = PoolSpec> {
    (
        0i32..3,
        proptest::option::weighted(0.4, prop_oneof![Just("amd64"), Just("arm64")]),
        proptest::bool::weighted(0.3),
        proptest::option::weighted(0.4, 8i64..200),
        proptest::option::weighted(0.3, 1i64..6),
    )
        .prop_map(|(weight, arch, tainted, cpu_limit, nodes_limit)| PoolSpec {
            weight,
            arch,
            tainted,
            cpu_limit,
            nodes_limit,
        })
}

fn make_pool(i: usize, s: &PoolSpec) -> NodePool {
    let mut r = Requirements::new();
    if let Some(a) = s.arch {
        r.add(labels::ARCH, Requirement::is_in([a]));
    }
    let mut p = NodePool::new(&format!("pool-{i}"), r);
    p.weight = s.weight;
    if s.tainted {
        p.taints.push(Taint::new("dedicated", "x", Effect::NoSchedule));
    }
    if let Some(c) = s.cpu_limit {
        p.limits.set(ResourceName::Cpu, c * 1000);
    }
    if let Some(n) = s.nodes_limit {
        p.limits.set(ResourceName::Nodes, n);
    }
    p
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(150))]

    #[test]
    fn every_pending_pod_is_placed_or_has_a_reason(
        pods in proptest::collection::vec(pod_spec(), 1..40),
        pools in proptest::collection::vec(pool_spec(), 0..3),
    ) {
        let its = types();
        let snapshot = Snapshot {
            nodepools: pools.iter().enumerate().map(|(i, s)| PoolInput { pool: make_pool(i, s), instance_types: its.clone() }).collect(),
            ..Default::default()
        };
        let pods: Vec<Pod> = pods.iter().enumerate().map(|(i, s)| make_pod(i, s)).collect();
        let results = scheduling::solve(&snapshot, &pods, &SolveOptions::default());

        let mut seen = vec![0usize; pods.len()];
        for c in &results.claims {
            for &p in &c.pods { seen[p] += 1; }
            prop_assert!(c.launch.is_some(), "every claim has a launch");
            prop_assert!(!c.instance_types.is_empty());
        }
        for e in &results.existing {
            for &p in &e.pods { seen[p] += 1; }
        }
        for (p, reason) in &results.errors {
            seen[*p] += 1;
            prop_assert!(!reason.trim().is_empty(), "pod {p} has an empty reason");
        }
        for (i, n) in seen.iter().enumerate() {
            prop_assert_eq!(*n, 1, "pod {} appears {} times", i, n);
        }

        // A plan never exceeds a NodePool's limits: every claim may launch as its largest
        // candidate, and each counts as one node.
        for (pi, input) in snapshot.nodepools.iter().enumerate() {
            let claims: Vec<_> = results.claims.iter().filter(|c| c.pool == pi).collect();
            if input.pool.limits.contains(&ResourceName::Nodes) {
                prop_assert!(claims.len() as i64 <= input.pool.limits.get(&ResourceName::Nodes));
            }
            if input.pool.limits.contains(&ResourceName::Cpu) {
                let worst: i64 = claims
                    .iter()
                    .map(|c| c.instance_types.iter().map(|&t| its[t as usize].capacity.get(&ResourceName::Cpu)).max().unwrap_or(0))
                    .sum();
                prop_assert!(worst <= input.pool.limits.get(&ResourceName::Cpu), "cpu limit exceeded: {} > {}", worst, input.pool.limits.get(&ResourceName::Cpu));
            }
        }

        // Placed pods sit on claims whose launch type fits them all and meets their selectors.
        for c in &results.claims {
            let launch = c.launch.as_ref().expect("checked above");
            let it = &its[launch.instance_type];
            let mut total = ResourceList::new();
            for &p in &c.pods {
                total.add(&pods[p].requests_with_pod_slot());
                for (k, v) in &pods[p].node_selector {
                    let k = labels::normalize_key(k);
                    if k == labels::ZONE {
                        prop_assert_eq!(&launch.zone, v);
                    } else if it.requirements.has(k) {
                        prop_assert!(it.requirements.get(k).has(v), "{} does not meet {}={}", it.name, k, v);
                    }
                }
            }
            prop_assert!(total.fits_in(&it.allocatable), "{} cannot hold {:?}", it.name, total);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(120))]

    /// Both packers' plans pass the independent validator, and the lower bound (over the
    /// pods each plan puts on new claims) never exceeds the plan's cost.
    #[test]
    fn plans_validate_and_never_cost_less_than_the_lower_bound(
        pods in proptest::collection::vec(pod_spec(), 1..40),
        pools in proptest::collection::vec(pool_spec(), 1..3),
    ) {
        let its = types();
        let snapshot = Snapshot {
            nodepools: pools.iter().enumerate().map(|(i, s)| PoolInput { pool: make_pool(i, s), instance_types: its.clone() }).collect(),
            ..Default::default()
        };
        let pods: Vec<Pod> = pods.iter().enumerate().map(|(i, s)| make_pod(i, s)).collect();
        for (packer, semantics) in [
            (scheduling::Packer::Dovetail, scheduling::Semantics::Strict),
            (scheduling::Packer::Karpenter, scheduling::Semantics::Karpenter),
        ] {
            let opts = SolveOptions { packer, ..SolveOptions::default() };
            let results = scheduling::solve(&snapshot, &pods, &opts);
            let violations = scheduling::validate(&snapshot, &pods, &results, semantics);
            prop_assert!(violations.is_empty(), "{:?}: {:#?}", packer, violations);
            let on_new: Vec<usize> = results.claims.iter().flat_map(|c| c.pods.iter().copied()).collect();
            let lb = scheduling::lower_bound(&snapshot, &pods, &on_new);
            let cost = results.cost_per_hour();
            prop_assert!(lb.value <= cost * (1.0 + 1e-9) + 1e-9, "{:?}: bound {} above cost {}", packer, lb.value, cost);
        }
    }
}
