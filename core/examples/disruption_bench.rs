//! How long the disruption planner takes to decide, with its reason, for every node of a
//! cluster (goals.md: 1,000 nodes <= 2 s, 5,000 nodes <= 10 s).
//!
//! `cargo run --release -p dovetail-core --example disruption_bench -- [NODES ...] [--seed S] [--churn P] [--repeat R]`
//!
//! Each cluster: NODES initialized on-demand nodes of the benchmark NodePool (c/m/r), of
//! eight common types over three zones, each filled to about 85% of its allocatable CPU
//! with the benchmark's pods (`workload`: every fifth pod spread over zones, every fifth
//! over hostnames, the rest plain; seven Deployments), then P% of the pods (default 30)
//! removed at random (but each node's first: no node is empty, so the round is
//! consolidation's). One round of `disruption::plan` for the pool is timed (the first
//! round of a planner that has seen nothing, median of R runs), with a budget of 10% of
//! the nodes; the line says how many nodes got a decision and which.

#![allow(clippy::disallowed_methods, reason = "a benchmark measures wall time")]

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use dovetail_core::catalog::{CapacityType, Catalog, InstanceType, NodeClassSettings};
use dovetail_core::cluster::{NodeClaim, Snapshot, TERMINATION_FINALIZER};
use dovetail_core::disruption::{self, Input, Memory, Verdict, drift};
use dovetail_core::labels::{self, LabelSelector};
use dovetail_core::ledger::{Claim, ClaimRequest, Command, Entry, LaunchBatch, State, Step};
use dovetail_core::node::Node;
use dovetail_core::nodepool::{DisruptionReason, NodeClaimSpec, NodePool};
use dovetail_core::pod::{Pod, TopologySpreadConstraint, WhenUnsatisfiable};
use dovetail_core::resources::{ResourceList, ResourceName};
use dovetail_core::scheduling::{PoolInput, SolveOptions};
use dovetail_core::workload::{self, Capacity, Families, SplitMix64};

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

const TYPES: [&str; 8] =
    ["m5.large", "m5.xlarge", "m5.2xlarge", "m5.4xlarge", "c5.xlarge", "c5.2xlarge", "r5.xlarge", "r5.2xlarge"];

struct Cluster {
    pool: NodePool,
    types: Vec<InstanceType>,
    ledger: State,
    snap: Snapshot,
    pods: usize,
}

fn pod(rng: &mut SplitMix64, node: &str, i: usize) -> Pod {
    let cpu = workload::CPU_MILLI[rng.below(workload::CPU_MILLI.len())];
    let mem = workload::MEMORY_MIB[rng.below(workload::MEMORY_MIB.len())];
    let app = format!("v{}", rng.below(7));
    let mut p = Pod::new("default", &format!("{app}-{i}"), ResourceList::cpu_mem(cpu, mem << 20));
    p.labels.insert("my-label".into(), app.clone());
    let key = match i % 5 {
        1 => Some(labels::ZONE),
        2 => Some(labels::HOSTNAME),
        _ => None,
    };
    if let Some(key) = key {
        p.topology_spread.push(TopologySpreadConstraint {
            max_skew: 1,
            topology_key: key.to_string(),
            // Bound pods need not satisfy it; moved ones are placed under it.
            when_unsatisfiable: WhenUnsatisfiable::ScheduleAnyway,
            selector: Some(LabelSelector::from_labels([("my-label", app.as_str())])),
            min_domains: None,
            node_affinity_policy: None,
            node_taints_policy: None,
            match_label_keys: Vec::new(),
        });
    }
    p.node_name = Some(node.to_string());
    p.started_at = Some(0);
    p
}

fn cluster(nodes: usize, seed: u64, churn: u32) -> Cluster {
    let mut pool = workload::nodepool(Families::Cmr, Capacity::OnDemand);
    pool.disruption.consolidate_after = Some(std::time::Duration::ZERO);
    let catalog = Catalog::embedded("us-east-1").expect("the embedded catalog");
    let types = catalog.instance_types(&NodeClassSettings::default(), None);
    let mut ledger = State::default();
    let now = 1_000_000;
    let apply = |ledger: &mut State, command| {
        ledger.apply(&Entry { term: 1, at: now, command });
    };
    apply(&mut ledger, Command::SetPool { pool: pool.name.clone(), limits: ResourceList::new() });
    let mut rng = SplitMix64::new(seed);
    let mut snap = Snapshot::default();
    let hash = drift::template_hash(&pool);
    let mut requests = Vec::new();
    let mut batches: BTreeMap<&str, Vec<String>> = BTreeMap::new();
    let mut steps = Vec::new();
    let mut pods = 0;
    for n in 0..nodes {
        let name = TYPES[rng.below(TYPES.len())];
        let t = types.iter().find(|t| t.name == name).expect("a benchmark type");
        let zone = workload::ZONES[n % 3];
        let id = format!("bench-{n:05}");
        let price = t
            .offerings
            .iter()
            .find(|o| o.zone == zone && o.capacity_type == CapacityType::OnDemand)
            .map(|o| o.price)
            .unwrap_or(1.0);
        requests.push(ClaimRequest {
            id: id.clone(),
            zone: zone.into(),
            resources: t.capacity.clone(),
            price_per_hour: (price * 1e6) as u64,
        });
        batches.entry(zone).or_default().push(id.clone());
        let launched = Step::Launched {
            batch: format!("b-{zone}"),
            instance: format!("i-{n:05}"),
            resources: t.capacity.clone(),
            allocatable: t.allocatable.clone(),
            price_per_hour: (price * 1e6) as u64,
            instance_type: t.name.clone(),
            capacity_type: CapacityType::OnDemand,
        };
        steps.extend([(id.clone(), launched), (id.clone(), Step::Registered), (id.clone(), Step::Initialized)]);
        let annotations = [
            (drift::HASH_ANNOTATION.to_string(), hash.clone()),
            (drift::HASH_VERSION_ANNOTATION.to_string(), drift::HASH_VERSION.to_string()),
        ]
        .into_iter()
        .collect();
        let nc = NodeClaim {
            name: id.clone(),
            spec: NodeClaimSpec { nodepool: pool.name.clone(), annotations, ..NodeClaimSpec::default() },
            finalizers: vec![TERMINATION_FINALIZER.into()],
            deleting: false,
            status: Default::default(),
            resource_version: 1,
            created: None,
        };
        snap.nodeclaims.insert(id.clone(), Arc::new(nc));
        let name = format!("node-{n:05}");
        let node = Node {
            name: name.clone(),
            labels: [
                (labels::NODEPOOL.to_string(), pool.name.clone()),
                (labels::INSTANCE_TYPE.to_string(), t.name.clone()),
                (labels::CAPACITY_TYPE.to_string(), "on-demand".to_string()),
                (labels::ZONE.to_string(), zone.to_string()),
                (labels::HOSTNAME.to_string(), name.clone()),
                (labels::INITIALIZED.to_string(), "true".to_string()),
            ]
            .into_iter()
            .collect(),
            capacity: t.capacity.clone(),
            allocatable: t.allocatable.clone(),
            initialized: true,
            ready: true,
            provider_id: Some(dovetail_core::lifecycle::provider_id(zone, &format!("i-{n:05}"))),
            ..Node::default()
        };
        snap.nodes.insert(name.clone(), Arc::new(node));
        // Filled to about 85% of its CPU (and never over its memory), then churned.
        let (cpu, mem) = (t.allocatable.get(&ResourceName::Cpu), t.allocatable.get(&ResourceName::Memory));
        let (mut used_cpu, mut used_mem) = (0, 0);
        for _ in 0..200 {
            let p = pod(&mut rng, &name, pods);
            pods += 1;
            let (c, m) = (p.requests.get(&ResourceName::Cpu), p.requests.get(&ResourceName::Memory));
            if used_cpu + c > cpu * 85 / 100 || used_mem + m > mem * 9 / 10 {
                break;
            }
            used_cpu += c;
            used_mem += m;
            // Each node keeps its first pod: no node is empty (emptiness would win the round
            // and consolidation, the expensive method, would not run).
            if used_cpu == c || (rng.next_u64() % 100) as u32 >= churn {
                snap.pods.insert(p.key.clone(), Arc::new(p));
            }
        }
    }
    apply(&mut ledger, Command::Reserve { pool: pool.name.clone(), claims: requests });
    for (zone, claims) in batches {
        let batch = LaunchBatch { id: format!("b-{zone}"), claims: claims.into() };
        apply(&mut ledger, Command::Launch { zone: zone.into(), batches: vec![batch] });
    }
    apply(&mut ledger, Command::Advance { steps });
    let pods = snap.pods.len();
    Cluster { pool, types, ledger, snap, pods }
}

fn main() {
    let mut sizes: Vec<usize> = Vec::new();
    let (mut seed, mut churn, mut repeat) = (1u64, 30u32, 1usize);
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--seed" => seed = args.next().and_then(|v| v.parse().ok()).unwrap_or(1),
            "--churn" => churn = args.next().and_then(|v| v.parse().ok()).unwrap_or(30),
            "--repeat" => repeat = args.next().and_then(|v| v.parse().ok()).unwrap_or(1).max(1),
            n => sizes.push(n.parse().unwrap_or_else(|_| panic!("not a node count: {n}"))),
        }
    }
    if sizes.is_empty() {
        sizes = vec![1000, 5000];
    }
    for nodes in sizes {
        let c = cluster(nodes, seed, churn);
        let claims: Vec<Claim> = c.ledger.claims_of(&c.pool.name).cloned().collect();
        let room = (nodes as u32).div_ceil(10);
        let available: BTreeMap<DisruptionReason, u32> =
            [DisruptionReason::Empty, DisruptionReason::Drifted, DisruptionReason::Underutilized]
                .into_iter()
                .map(|r| (r, room))
                .collect();
        let pools = [PoolInput { pool: c.pool.clone(), instance_types: Arc::new(c.types.clone()) }];
        let (leases, drift, nominated) = (BTreeMap::new(), BTreeMap::new(), BTreeMap::new());
        let opts = SolveOptions::default();
        let input = Input {
            pool: &c.pool,
            types: &c.types,
            claims: &claims,
            leases: &leases,
            available: &available,
            cloud_drift: &drift,
            nominated: &nominated,
            snapshot: &c.snap,
            pools: &pools,
            opts: &opts,
            spot_to_spot: false,
            validation: 0,
            max_commands: 10,
            synced: true,
            now: 1_000_000,
        };
        let mut times = Vec::new();
        let mut plan = None;
        for _ in 0..repeat {
            let mut memory = Memory::default();
            let start = Instant::now();
            plan = Some(disruption::plan(&input, &mut memory));
            times.push(start.elapsed().as_secs_f64());
        }
        times.sort_by(f64::total_cmp);
        let plan = plan.expect("planned");
        let mut kinds: BTreeMap<String, usize> = BTreeMap::new();
        for d in plan.decisions.values() {
            let k = match &d.verdict {
                Verdict::Disrupt { method, .. } => format!("disrupt:{}", method.as_str()),
                Verdict::Keep(why) if why.contains("waits for a later round") => "keep:could-go-later".into(),
                Verdict::Keep(why) if why.contains("fit nowhere") => "keep:pods-fit-nowhere-else".into(),
                Verdict::Keep(why) if why.contains("no cheaper") => "keep:no-cheaper-node".into(),
                Verdict::Keep(_) => "keep:other".into(),
                v => format!("{v:?}").split([' ', '{', '(']).next().unwrap_or("?").to_lowercase(),
            };
            *kinds.entry(k).or_insert(0) += 1;
        }
        let proposals: Vec<String> = plan
            .proposals
            .iter()
            .map(|p| format!("{} of {} node(s), {} new", p.method.as_str(), p.candidates.len(), p.replacements.len()))
            .collect();
        println!(
            "{nodes} nodes, {} pods ({churn}% removed): plan {:.3} s (median of {repeat}; min {:.3}, max {:.3}); {} decisions for {} nodes; proposals: {}; {:?}",
            c.pods,
            times[times.len() / 2],
            times[0],
            times[times.len() - 1],
            plan.decisions.len(),
            c.snap.nodes.len(),
            if proposals.is_empty() { "none".to_string() } else { proposals.join(", ") },
            kinds
        );
    }
}
