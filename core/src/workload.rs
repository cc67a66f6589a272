//! Benchmark workloads, defined exactly (`../shared/design/goals.md`), generated from a seed.
//!
//! Pod `i` has kind `i % 5`: 0 generic, 1 zone topology spread, 2 hostname topology spread,
//! 3 zone pod affinity, 4 hostname pod anti-affinity. Kind-4 pods carry `app: nginx` and are
//! anti-affine to `app: nginx`; every other pod carries `my-label: v<k>` (k uniform in 0..7)
//! and its spread/affinity selector matches its own value. Spread: maxSkew 1,
//! DoNotSchedule. CPU uniform from {100m, 250m, 500m, 1, 1500m}, memory from {100Mi, 256Mi,
//! 512Mi, 1Gi, 2Gi, 4Gi}. Identical pods are grouped (as one Deployment each in YAML).
//!
//! The large mix (goals.md, "large pods") is resource-only: pod `i` is a 1-GPU pod (kind 6:
//! 8 vCPU, one `nvidia.com/gpu`, memory uniform from {16, 32, 64, 120} GiB) when `i % 4 == 3`,
//! else a large pod (kind 5: CPU uniform from {48, 64, 96} vCPU, memory from {200, 256, 384,
//! 512, 768, 960} GiB), so one to three fit a node.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::catalog::{Catalog, NodeClassSettings};
use crate::labels::{self, LabelSelector};
use crate::nodepool::NodePool;
use crate::pod::{Pod, PodAffinityTerm, TopologySpreadConstraint, WhenUnsatisfiable};
use crate::requirements::{Operator, Requirement, Requirements};
use crate::resources::{ResourceList, ResourceName};
use crate::scheduling::{PoolInput, Snapshot};

/// A small deterministic generator (SplitMix64): the same seed gives the same workload on
/// every platform.
#[derive(Clone, Debug)]
pub struct SplitMix64(u64);

impl SplitMix64 {
    /// A generator from a seed.
    pub fn new(seed: u64) -> Self {
        SplitMix64(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A uniform index below `n` (`n > 0`).
    pub fn below(&mut self, n: usize) -> usize {
        ((self.next_u64() as u128 * n as u128) >> 64) as usize
    }
}

/// Which pods the workload has.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mix {
    /// The five kinds of the benchmark.
    Diverse,
    /// Kind 0 only (resource-only pods).
    Generic,
    /// Large pods and 1-GPU pods (kinds 5 and 6).
    Large,
}

/// Which instance types the NodePool allows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Families {
    /// instance-category c, m, r; generation > 4; amd64.
    Cmr,
    /// Every category, generation >= 5, amd64, no burstable (t*) types, metal allowed.
    All,
}

/// The NodePool's capacity types.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Capacity {
    OnDemand,
    /// No capacity-type requirement: spot and on-demand.
    Any,
}

pub const CPU_MILLI: [i64; 5] = [100, 250, 500, 1000, 1500];
pub const MEMORY_MIB: [i64; 6] = [100, 256, 512, 1024, 2048, 4096];
pub const ZONES: [&str; 3] = ["us-east-1a", "us-east-1b", "us-east-1c"];
/// The large mix's large pods: vCPU and GiB.
pub const LARGE_CPU: [i64; 3] = [48, 64, 96];
pub const LARGE_MEMORY_GIB: [i64; 6] = [200, 256, 384, 512, 768, 960];
/// The large mix's 1-GPU pods: 8 vCPU and GiB.
pub const GPU_POD_MEMORY_GIB: [i64; 4] = [16, 32, 64, 120];

/// Identical pods of the workload.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodGroup {
    pub kind: u8,
    pub cpu_milli: i64,
    pub memory_mib: i64,
    /// `k` of `my-label: v<k>`; unused for kinds 4 and up.
    pub label: u8,
    /// Whole `nvidia.com/gpu` devices (kind 6).
    pub gpus: i64,
    pub count: usize,
}

impl PodGroup {
    /// The Deployment name of the group.
    pub fn name(&self) -> String {
        if self.kind >= 4 {
            format!("k{}-c{}-m{}", self.kind, self.cpu_milli, self.memory_mib)
        } else {
            format!("k{}-c{}-m{}-v{}", self.kind, self.cpu_milli, self.memory_mib, self.label)
        }
    }
}

/// The groups of an `n`-pod workload.
pub fn groups(n: usize, seed: u64, mix: Mix) -> Vec<PodGroup> {
    let mut rng = SplitMix64::new(seed);
    let mut out: Vec<PodGroup> = Vec::new();
    for i in 0..n {
        let (kind, cpu_milli, memory_mib, label, gpus) = match mix {
            Mix::Large if i % 4 == 3 => (6, 8_000, GPU_POD_MEMORY_GIB[rng.below(GPU_POD_MEMORY_GIB.len())] << 10, 0, 1),
            Mix::Large => {
                let cpu = LARGE_CPU[rng.below(LARGE_CPU.len())] * 1000;
                (5, cpu, LARGE_MEMORY_GIB[rng.below(LARGE_MEMORY_GIB.len())] << 10, 0, 0)
            }
            _ => {
                let kind = if mix == Mix::Diverse { (i % 5) as u8 } else { 0 };
                let cpu_milli = CPU_MILLI[rng.below(CPU_MILLI.len())];
                let memory_mib = MEMORY_MIB[rng.below(MEMORY_MIB.len())];
                let label = if kind == 4 { 0 } else { rng.below(7) as u8 };
                (kind, cpu_milli, memory_mib, label, 0)
            }
        };
        match out
            .iter_mut()
            .find(|g| g.kind == kind && g.cpu_milli == cpu_milli && g.memory_mib == memory_mib && g.label == label)
        {
            Some(g) => g.count += 1,
            None => out.push(PodGroup { kind, cpu_milli, memory_mib, label, gpus, count: 1 }),
        }
    }
    out.sort_by_key(|g| (g.kind, g.cpu_milli, g.memory_mib, g.label));
    out
}

/// The pods of the workload, named `default/<group>-<i>` as `dovetail plan` names the
/// Deployments' pods.
pub fn pods(groups: &[PodGroup]) -> Vec<Pod> {
    let mut out = Vec::new();
    for (gi, g) in groups.iter().enumerate() {
        let template = template_pod(g);
        for i in 0..g.count {
            let mut p = template.clone();
            p.key.name = format!("{}-{i}", g.name());
            p.creation = (gi * 1_000_000 + i) as i64;
            out.push(p);
        }
    }
    out
}

fn template_pod(g: &PodGroup) -> Pod {
    let mut requests = ResourceList::cpu_mem(g.cpu_milli, g.memory_mib << 20);
    if g.gpus > 0 {
        requests.set(ResourceName::NvidiaGpu, g.gpus);
    }
    let mut p = Pod::new("default", &g.name(), requests);
    if g.kind >= 5 {
        p.labels.insert("bench".to_string(), g.name());
        return p;
    }
    let (key, value) = if g.kind == 4 { ("app", "nginx".to_string()) } else { ("my-label", format!("v{}", g.label)) };
    p.labels.insert(key.to_string(), value.clone());
    let selector = Some(LabelSelector::from_labels([(key, value.as_str())]));
    let spread = |topology_key: &str| TopologySpreadConstraint {
        max_skew: 1,
        topology_key: topology_key.to_string(),
        when_unsatisfiable: WhenUnsatisfiable::DoNotSchedule,
        selector: selector.clone(),
        min_domains: None,
        node_affinity_policy: None,
        node_taints_policy: None,
        match_label_keys: Vec::new(),
    };
    let term = |topology_key: &str| PodAffinityTerm {
        selector: selector.clone(),
        namespaces: Vec::new(),
        namespace_selector: None,
        topology_key: topology_key.to_string(),
    };
    match g.kind {
        1 => p.topology_spread.push(spread(labels::ZONE)),
        2 => p.topology_spread.push(spread(labels::HOSTNAME)),
        3 => p.pod_affinity.required.push(term(labels::ZONE)),
        4 => p.pod_anti_affinity.required.push(term(labels::HOSTNAME)),
        _ => {}
    }
    p
}

/// The benchmark NodePool.
pub fn nodepool(families: Families, capacity: Capacity) -> NodePool {
    let mut r = Requirements::new();
    r.add(labels::ARCH, Requirement::is_in(["amd64"]));
    r.add(labels::ZONE, Requirement::is_in(ZONES));
    match families {
        Families::Cmr => {
            r.add(labels::INSTANCE_CATEGORY, Requirement::is_in(["c", "m", "r"]));
            r.add(labels::INSTANCE_GENERATION, int_req(Operator::Gt, 4));
        }
        Families::All => {
            r.add(labels::INSTANCE_GENERATION, int_req(Operator::Gte, 5));
            r.add(labels::INSTANCE_CATEGORY, Requirement::not_in(["t"]));
        }
    }
    if capacity == Capacity::OnDemand {
        r.add(labels::CAPACITY_TYPE, Requirement::is_in(["on-demand"]));
    }
    NodePool::new("bench", r)
}

fn int_req(op: Operator, v: i64) -> Requirement {
    Requirement::new("", op, &[v.to_string()]).expect("invariant: an integer bound")
}

/// The openb trace shipped for tests and benchmarks (`core/data/traces/README.md`).
pub const OPENB_DEFAULT: &str = include_str!("../data/traces/openb_default.csv");

/// Identical pods of a trace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TraceGroup {
    /// `trace-c<cpu>-m<memory>-g<gpus>`.
    pub name: String,
    pub cpu_milli: i64,
    pub memory_mib: i64,
    /// Whole `nvidia.com/gpu` devices.
    pub gpus: i64,
    pub count: usize,
}

/// Groups the rows of a trace CSV (`pod_id,cpu_milli,memory_mib,gpu,...`, columns found by
/// name) into identical pods. Errors name the line and column.
pub fn trace_groups(text: &str) -> Result<Vec<TraceGroup>, String> {
    let mut lines = text.lines();
    let header = lines.next().ok_or("empty trace")?;
    let cols: Vec<&str> = header.split(',').map(str::trim).collect();
    let col = |name: &str| cols.iter().position(|c| *c == name).ok_or(format!("no {name} column in the header"));
    let (ci, mi, gi) = (col("cpu_milli")?, col("memory_mib")?, col("gpu")?);
    let mut groups: BTreeMap<(i64, i64, i64), usize> = BTreeMap::new();
    for (n, line) in lines.enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let f: Vec<&str> = line.split(',').collect();
        let num = |i: usize| -> Result<i64, String> {
            f.get(i).and_then(|v| v.trim().parse().ok()).filter(|v: &i64| *v >= 0).ok_or(format!(
                "line {}: column {} is not a non-negative integer",
                n + 2,
                cols[i]
            ))
        };
        *groups.entry((num(ci)?, num(mi)?, num(gi)?)).or_insert(0) += 1;
    }
    Ok(groups
        .into_iter()
        .map(|((c, m, g), count)| TraceGroup {
            name: format!("trace-c{c}-m{m}-g{g}"),
            cpu_milli: c,
            memory_mib: m,
            gpus: g,
            count,
        })
        .collect())
}

/// The pods of a trace, named `default/<group>-<i>` as `dovetail plan` names them.
pub fn trace_pods(groups: &[TraceGroup]) -> Vec<Pod> {
    let mut out = Vec::new();
    for (gi, g) in groups.iter().enumerate() {
        let mut requests = ResourceList::cpu_mem(g.cpu_milli, g.memory_mib << 20);
        if g.gpus > 0 {
            requests.set(ResourceName::NvidiaGpu, g.gpus);
        }
        let mut template = Pod::new("default", &g.name, requests);
        template.labels.insert("bench".to_string(), g.name.clone());
        for i in 0..g.count {
            let mut p = template.clone();
            p.key.name = format!("{}-{i}", g.name);
            p.creation = (gi * 1_000_000 + i) as i64;
            out.push(p);
        }
    }
    out
}

/// A benchmark input as the scheduler takes it: the snapshot (one NodePool with the
/// built-in us-east-1 catalog's types) and the pending pods.
pub struct BenchInput {
    pub snapshot: Snapshot,
    pub pods: Vec<Pod>,
}

/// The benchmark inputs of `docs/benchmarks.md`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Bench {
    /// The goals' benchmark mix of `n` pods (seed 1), c/m/r, any capacity type.
    Mix(usize),
    /// `n` resource-only pods (seed 1), c/m/r, on-demand.
    Generic(usize),
    /// `n` resource-only pods (seed 1), every family, on-demand.
    GenericAll(usize),
    /// The openb trace, every family, on-demand.
    Openb,
    /// The large mix of `n` pods (seed 1), every family, on-demand.
    Large(usize),
}

impl Bench {
    /// Every input the R table and the validator tests use.
    pub const ALL: [Bench; 7] = [
        Bench::Generic(1000),
        Bench::Generic(10_000),
        Bench::GenericAll(1000),
        Bench::GenericAll(10_000),
        Bench::Mix(1000),
        Bench::Mix(10_000),
        Bench::Openb,
    ];

    /// Inputs reported by the benchmarks beyond [`Bench::ALL`].
    pub const EXTRA: [Bench; 1] = [Bench::Large(1000)];

    /// A short name (`mix-10k`).
    pub fn name(&self) -> String {
        let k = |n: usize| if n.is_multiple_of(1000) { format!("{}k", n / 1000) } else { n.to_string() };
        match self {
            Bench::Mix(n) => format!("mix-{}", k(*n)),
            Bench::Generic(n) => format!("generic-{}", k(*n)),
            Bench::GenericAll(n) => format!("generic-all-{}", k(*n)),
            Bench::Openb => "openb".to_string(),
            Bench::Large(n) => format!("large-{}", k(*n)),
        }
    }

    /// Builds the input (the same as `dovetail bench-input` writes, parsed).
    pub fn input(&self) -> BenchInput {
        let (pool, pods) = match *self {
            Bench::Mix(n) => (nodepool(Families::Cmr, Capacity::Any), pods(&groups(n, 1, Mix::Diverse))),
            Bench::Generic(n) => (nodepool(Families::Cmr, Capacity::OnDemand), pods(&groups(n, 1, Mix::Generic))),
            Bench::GenericAll(n) => (nodepool(Families::All, Capacity::OnDemand), pods(&groups(n, 1, Mix::Generic))),
            Bench::Large(n) => (nodepool(Families::All, Capacity::OnDemand), pods(&groups(n, 1, Mix::Large))),
            Bench::Openb => (
                nodepool(Families::All, Capacity::OnDemand),
                trace_pods(&trace_groups(OPENB_DEFAULT).expect("invariant: the shipped trace parses")),
            ),
        };
        let catalog = Catalog::embedded("us-east-1").expect("invariant: the built-in catalog loads");
        let instance_types = Arc::new(catalog.instance_types(&NodeClassSettings::default(), None));
        BenchInput {
            snapshot: Snapshot { nodepools: vec![PoolInput { pool, instance_types }], ..Default::default() },
            pods,
        }
    }
}

/// The reference plan goals.md compares the large mix against: first-fit-decreasing with
/// right-sizing. Pods, largest first (GPUs, then CPU, then memory), go into the first open
/// node whose type still has room for them; a pod that fits no open node opens one of the
/// type that is cheapest per copy of that pod it could hold (`per_copy`) or simply the
/// cheapest type that fits it (not `per_copy`). Each node then launches as its cheapest type
/// that fits what it holds (a non-exotic one when any does, as the AWS provider launches).
/// Returns the $/hour and node count of the better of the two ways of opening nodes; pods
/// that fit no type are left out. Reads the benchmark's one NodePool, with no DaemonSets.
pub fn first_fit_decreasing(input: &BenchInput) -> (f64, usize) {
    let a = first_fit(input, true);
    let b = first_fit(input, false);
    if a.0 <= b.0 { a } else { b }
}

fn first_fit(input: &BenchInput, per_copy: bool) -> (f64, usize) {
    let Some(pool) = input.snapshot.nodepools.first() else { return (0.0, 0) };
    let reqs = &pool.pool.requirements;
    let types: Vec<(f64, &crate::catalog::InstanceType)> = pool
        .instance_types
        .iter()
        .filter(|it| it.requirements.intersects_ok(reqs))
        .map(|it| (it.cheapest_price(reqs), it))
        .filter(|(p, _)| *p < f64::MAX)
        .collect();
    let mut pods: Vec<ResourceList> = input.pods.iter().map(Pod::requests_with_pod_slot).collect();
    let key =
        |r: &ResourceList| (r.get(&ResourceName::NvidiaGpu), r.get(&ResourceName::Cpu), r.get(&ResourceName::Memory));
    pods.sort_by_key(|r| std::cmp::Reverse(key(r)));
    // Open nodes: (type, what they hold).
    let mut nodes: Vec<(usize, ResourceList)> = Vec::new();
    for pod in pods {
        if let Some((_, held)) = nodes.iter_mut().find(|(t, held)| held.merged(&pod).fits_in(&types[*t].1.allocatable))
        {
            held.add(&pod);
            continue;
        }
        let copies = |t: usize| {
            let alloc = &types[t].1.allocatable;
            pod.iter().filter(|(_, v)| *v > 0).map(|(n, v)| alloc.get(n) / v).min().unwrap_or(0)
        };
        let open = (0..types.len()).filter(|&t| copies(t) >= 1).min_by(|&a, &b| {
            let cost = |t: usize| if per_copy { types[t].0 / copies(t) as f64 } else { types[t].0 };
            cost(a).total_cmp(&cost(b)).then(a.cmp(&b))
        });
        if let Some(t) = open {
            nodes.push((t, pod));
        }
    }
    let cost = nodes
        .iter()
        .map(|(_, n)| {
            let fitting = || types.iter().filter(|(_, it)| n.fits_in(&it.allocatable));
            let plain = fitting().filter(|(_, it)| !it.exotic).map(|(p, _)| *p).fold(f64::INFINITY, f64::min);
            if plain.is_finite() { plain } else { fitting().map(|(p, _)| *p).fold(f64::INFINITY, f64::min) }
        })
        .sum();
    (cost, nodes.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generation_is_deterministic_and_complete() {
        let a = groups(1000, 7, Mix::Diverse);
        assert_eq!(a, groups(1000, 7, Mix::Diverse));
        assert_ne!(a, groups(1000, 8, Mix::Diverse));
        assert_eq!(a.iter().map(|g| g.count).sum::<usize>(), 1000);
        for kind in 0..5u8 {
            assert_eq!(a.iter().filter(|g| g.kind == kind).map(|g| g.count).sum::<usize>(), 200);
        }
        let p = pods(&a);
        assert_eq!(p.len(), 1000);
        let nginx = p.iter().filter(|p| p.labels.get("app").is_some_and(|v| v == "nginx")).count();
        assert_eq!(nginx, 200);
        assert!(groups(500, 1, Mix::Generic).iter().all(|g| g.kind == 0));
        let large = groups(1000, 1, Mix::Large);
        assert_eq!(large.iter().filter(|g| g.kind == 6).map(|g| g.count).sum::<usize>(), 250);
        assert!(large.iter().all(|g| (g.kind == 6) == (g.gpus == 1)));
        assert!(large.iter().filter(|g| g.kind == 5).all(|g| (48_000..=96_000).contains(&g.cpu_milli)));
    }

    #[test]
    fn traces_parse_and_errors_name_the_line() {
        let g = trace_groups(OPENB_DEFAULT).unwrap();
        assert_eq!(g.iter().map(|g| g.count).sum::<usize>(), 8152);
        assert!(g.iter().any(|g| g.gpus == 8));
        let err = trace_groups("pod_id,cpu_milli,memory_mib,gpu\np,1,x,0\n").unwrap_err();
        assert!(err.contains("line 2") && err.contains("memory_mib"), "{err}");
        assert!(trace_groups("pod_id,cpu\n").unwrap_err().contains("cpu_milli"));
    }
}
