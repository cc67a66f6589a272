//! Scenarios as data (YAML): the cluster's NodePools in Karpenter's own format, workloads
//! over time, faults, and the sim cloud's settings. `docs/scenarios.md` describes the format.

use std::time::Duration;

use dovetail_api::manifest::Manifest;
use dovetail_core::nodepool::parse_duration;
use dovetail_core::quantity::Quantity;
use serde::Deserialize;

/// The built-in scenario `dovetail simulate` runs with no flags.
pub const DEFAULT: &str = include_str!("../scenarios/default.yaml");

/// A small scenario (300 pods, two hours) for tests and CI.
pub const SMALL: &str = include_str!("../scenarios/small.yaml");

/// The scenarios shipped in the binary, by name.
pub const BUILTIN: [(&str, &str); 14] = [
    ("default", DEFAULT),
    ("small", SMALL),
    ("ci", include_str!("../scenarios/ci.yaml")),
    ("1k-nodes", include_str!("../scenarios/1k-nodes.yaml")),
    ("10k-nodes", include_str!("../scenarios/10k-nodes.yaml")),
    ("spot-storm", include_str!("../scenarios/spot-storm.yaml")),
    ("churn", include_str!("../scenarios/churn.yaml")),
    ("churn-rate", include_str!("../scenarios/churn-rate.yaml")),
    ("interruption-burst", include_str!("../scenarios/interruption-burst.yaml")),
    ("interruption-paced", include_str!("../scenarios/interruption-paced.yaml")),
    ("interruption-storm", include_str!("../scenarios/interruption-storm.yaml")),
    ("soak", include_str!("../scenarios/soak.yaml")),
    ("soak-ci", include_str!("../scenarios/soak-ci.yaml")),
    ("ha-churn", include_str!("../scenarios/ha-churn.yaml")),
];

/// A shipped scenario's text.
pub fn builtin_named(name: &str) -> Option<&'static str> {
    BUILTIN.iter().find(|(n, _)| *n == name).map(|(_, t)| *t)
}

/// Why a scenario cannot run: the field and what is wrong with it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("scenario {scenario}: {field}: {message}")]
pub struct ScenarioError {
    pub scenario: String,
    pub field: String,
    pub message: String,
}

/// A scenario as written.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScenarioFile {
    pub name: String,
    #[serde(default = "default_region")]
    pub region: String,
    pub zones: Vec<String>,
    /// How long the cluster lives (a duration such as `24h`).
    pub duration: String,
    /// The clock `dovetail loadtest` runs it on: `wall` (the default: latency in real time) or
    /// `virtual` (a week in minutes: for what takes days to show, a soak). `simulate` runs
    /// on virtual time unless told `--realtime`.
    #[serde(default)]
    pub clock: Option<String>,
    /// How often the driver steps Kubernetes (controllers, kubelets, scheduler); default 10s.
    #[serde(default)]
    pub tick: Option<String>,
    /// How often the report samples nodes, pending pods and $/h; default 5m.
    #[serde(default)]
    pub sample: Option<String>,
    /// From launch to a Ready node; default 30s.
    #[serde(default)]
    pub registration_delay: Option<String>,
    /// The Router's batch window: `default` (Karpenter's 1 s idle / 10 s max) or `adaptive`
    /// (also closes 50 ms after the last arrival while at most 10 pods wait).
    #[serde(default)]
    pub window: Option<String>,
    /// Multi-document Kubernetes YAML: NodePools (karpenter.sh/v1), EC2NodeClasses, DaemonSets.
    pub cluster: String,
    /// Whether the plane disrupts nodes (emptiness, drift, consolidation, expiration); default
    /// true, as Karpenter.
    #[serde(default)]
    pub disruption: Option<bool>,
    #[serde(default)]
    pub workloads: Vec<Event>,
    #[serde(default)]
    pub faults: Vec<FaultSpec>,
    /// The sim cloud's settings.
    #[serde(default)]
    pub cloud: CloudSpec,
    /// The ledger replicated over several control nodes in the process (Raft over an
    /// in-memory network), the leader killed on a schedule; one in-process ledger when absent.
    #[serde(default)]
    pub control: Option<ControlSpec>,
    /// NodePools changed while the run goes on, as `kubectl apply` of an edited NodePool.
    #[serde(default)]
    pub nodepool_edits: Option<EditsSpec>,
    /// New AMIs released (as an EKS-optimized alias moves on): every instance booted before
    /// one is drifted.
    #[serde(default)]
    pub ami_releases: Option<ReleasesSpec>,
    /// What a loadtest run must meet; `dovetail loadtest` exits non-zero when one is missed.
    #[serde(default)]
    pub thresholds: ThresholdSpec,
}

/// Control nodes in a scenario.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ControlSpec {
    /// How many (3 or 5 survive the loss of one or two).
    pub nodes: usize,
    /// Kill the leader this often (a duration); a killed node comes back from its stores 10 s
    /// later.
    #[serde(default)]
    pub kill_leader_every: Option<String>,
}

/// NodePool edits: from `from`, every `every`, the next of `nodepools` (each a NodePool as
/// Karpenter's YAML, replacing the NodePool of its name), in turn, over and over.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EditsSpec {
    pub from: String,
    pub every: String,
    pub nodepools: Vec<String>,
}

/// AMI releases: from `from`, every `every`, until `until` (the run's end when absent).
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReleasesSpec {
    pub from: String,
    pub every: String,
    #[serde(default)]
    pub until: Option<String>,
}

/// The sim cloud in a scenario.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CloudSpec {
    /// EC2's request buckets multiplied by this (default 1: EC2's own limits, which pace a
    /// burst of more than 1,000 instances at 2 per second).
    #[serde(default)]
    pub api_limits_factor: Option<f64>,
}

/// Thresholds as written.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ThresholdSpec {
    #[serde(default)]
    pub max_decision_p99: Option<String>,
    #[serde(default)]
    pub max_decision_p50: Option<String>,
    /// R at the peak (cost over the lower bound).
    #[serde(default)]
    pub max_r: Option<f64>,
    /// Peak RSS of the whole process, MiB.
    #[serde(default)]
    pub max_rss_mib: Option<f64>,
    /// Pods still pending when the run ends.
    #[serde(default)]
    pub max_pending_at_end: Option<usize>,
    /// How long any pod may wait pending, from its creation to its binding (a duration).
    #[serde(default)]
    pub max_pending_age: Option<String>,
    /// How fast the process's memory may grow after its first day, MiB a day (the slope of
    /// its RSS samples from 24 h on).
    #[serde(default)]
    pub max_rss_slope_mib_per_day: Option<f64>,
    /// With control nodes: leases that ran out in a term still led (none but a kill's).
    #[serde(default)]
    pub max_lease_lapses: Option<u64>,
    /// With control nodes: terms begun by an election no kill caused.
    #[serde(default)]
    pub max_elections_without_kill: Option<usize>,
    /// Claims that had more than one instance over the run.
    #[serde(default)]
    pub max_claims_launched_twice: Option<usize>,
    /// How far R at the end may be above a fresh plan of the same pods.
    #[serde(default)]
    pub max_r_over_plan: Option<f64>,
    /// How long past its NodePool's `expireAfter` an instance may live (a duration).
    #[serde(default)]
    pub max_expiry_overdue: Option<String>,
    /// Nodes that must have expired (so the expiry check saw some).
    #[serde(default)]
    pub min_expirations: Option<u64>,
}

/// Thresholds checked.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Thresholds {
    pub max_decision_p99_ms: Option<u64>,
    pub max_decision_p50_ms: Option<u64>,
    pub max_r: Option<f64>,
    pub max_rss_mib: Option<f64>,
    pub max_pending_at_end: Option<usize>,
    pub max_pending_age_ms: Option<u64>,
    pub max_rss_slope_mib_per_day: Option<f64>,
    pub max_lease_lapses: Option<u64>,
    pub max_elections_without_kill: Option<usize>,
    pub max_claims_launched_twice: Option<usize>,
    pub max_r_over_plan: Option<f64>,
    pub max_expiry_overdue_ms: Option<u64>,
    pub min_expirations: Option<u64>,
}

fn default_region() -> String {
    "us-east-1".into()
}

/// A workload change at a time; with `every`, again every `every` until `until` (the run's
/// end when absent).
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Event {
    pub at: String,
    #[serde(default)]
    pub every: Option<String>,
    #[serde(default)]
    pub until: Option<String>,
    #[serde(flatten)]
    pub action: Action,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Action {
    /// Creates (or replaces) a Deployment.
    Deployment(DeploymentSpec),
    /// Sets a Deployment's replicas.
    Scale(ScaleSpec),
    /// Starts a Job.
    Job(JobSpec),
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeploymentSpec {
    pub name: String,
    #[serde(default = "default_namespace")]
    pub namespace: String,
    pub replicas: u32,
    pub cpu: String,
    pub memory: String,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScaleSpec {
    pub name: String,
    #[serde(default = "default_namespace")]
    pub namespace: String,
    pub replicas: u32,
    /// Which pods a scale-down removes: `newest` (the default) or `random` (pods of one age,
    /// as Kubernetes ranks them since 1.22).
    #[serde(default)]
    pub pick: PickSpec,
    /// The seed of a random pick (default 1).
    #[serde(default = "default_seed")]
    pub seed: u64,
    /// For a repeated scale (`every`): the replicas of each repetition after the first, in
    /// turn (the first has `replicas`), over and over.
    #[serde(default)]
    pub cycle: Vec<u32>,
}

#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum PickSpec {
    #[default]
    Newest,
    Random,
}

fn default_seed() -> u64 {
    1
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JobSpec {
    pub name: String,
    #[serde(default = "default_namespace")]
    pub namespace: String,
    pub parallelism: u32,
    pub completions: u32,
    /// How long each pod runs once bound.
    pub run_for: String,
    pub cpu: String,
    pub memory: String,
}

fn default_namespace() -> String {
    "default".into()
}

/// A fault over a window of time: exactly one of its kinds.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FaultSpec {
    pub at: String,
    pub until: String,
    /// Insufficient capacity for offerings in a zone.
    #[serde(default)]
    pub ice: Option<IceSpec>,
    /// EC2's request buckets scaled down: launches and terminations get throttled.
    #[serde(default)]
    pub throttle: Option<ThrottleSpec>,
    /// A zone lost: its instances are gone at `at`, and it has no capacity until `until`.
    #[serde(default)]
    pub zone_lost: Option<ZoneSpec>,
    /// Spot instances interrupted at a rate: each gets EC2's two-minute warning (in the
    /// interruption queue) and is reclaimed when it runs out.
    #[serde(default)]
    pub spot_interruptions: Option<RateSpec>,
    /// A burst of interruption messages (the benchmark): from `at`, `per_second`
    /// messages a second, each for a different live instance, in turn a spot interruption
    /// warning, an AWS Health scheduled change and a state change to `stopping`, until
    /// `messages` were sent or `until`.
    #[serde(default)]
    pub interruption_burst: Option<BurstSpec>,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BurstSpec {
    pub messages: u64,
    pub per_second: u64,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ThrottleSpec {
    /// The buckets' size and refill rate multiplied by this (0 < factor < 1 throttles).
    pub factor: f64,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ZoneSpec {
    pub zone: String,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RateSpec {
    /// Interruptions per spot instance-hour (0.5: about 40% of spot instances in an hour).
    pub per_hour: f64,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IceSpec {
    pub zone: String,
    /// `spot` or `on-demand`; both when absent.
    #[serde(default)]
    pub capacity_type: Option<String>,
    /// Instance types; every type when absent.
    #[serde(default)]
    pub instance_types: Vec<String>,
}

/// A scenario checked and converted, times in milliseconds.
#[derive(Clone, Debug)]
pub struct Scenario {
    pub name: String,
    pub region: String,
    pub zones: Vec<String>,
    pub duration: u64,
    /// `clock: virtual`: a loadtest of it runs on virtual time.
    pub virtual_time: bool,
    pub tick: u64,
    pub sample: u64,
    pub registration_delay: u64,
    pub window: dovetail_core::plane::BatchWindow,
    pub disruption: bool,
    pub cluster: Manifest,
    /// In time order.
    pub workloads: Vec<(u64, Workload)>,
    pub faults: Vec<Fault>,
    pub api_limits_factor: f64,
    pub thresholds: Thresholds,
    /// The control nodes, when the ledger is replicated.
    pub control: Option<crate::ha::ControlNodes>,
    /// NodePools edited at run time: from `from`, every `every`, the next of `nodepools`.
    pub edits: Option<Edits>,
    /// AMI releases: (from, every, until), ms.
    pub releases: Option<(u64, u64, u64)>,
}

/// NodePool edits, times in ms.
#[derive(Clone, Debug)]
pub struct Edits {
    pub from: u64,
    pub every: u64,
    pub nodepools: Vec<dovetail_core::nodepool::NodePool>,
}

/// A workload change with its quantities parsed.
#[derive(Clone, Debug, PartialEq)]
pub enum Workload {
    Deployment {
        namespace: String,
        name: String,
        replicas: u32,
        cpu_milli: i64,
        memory: i64,
    },
    Scale {
        namespace: String,
        name: String,
        replicas: u32,
        pick: dovetail_cluster::sim::Pick,
    },
    Job {
        namespace: String,
        name: String,
        parallelism: u32,
        completions: u32,
        run_for: u64,
        cpu_milli: i64,
        memory: i64,
    },
    /// A bare pod (trace replay), in namespace `default`.
    Pod {
        name: String,
        cpu_milli: i64,
        memory: i64,
        gpus: i64,
    },
    /// Deletes a bare pod (its departure).
    DeletePod {
        name: String,
    },
}

/// A fault over `[from, until)`, milliseconds of the scenario.
#[derive(Clone, Debug, PartialEq)]
pub struct Fault {
    pub from: u64,
    pub until: u64,
    pub kind: FaultKind,
}

#[derive(Clone, Debug, PartialEq)]
pub enum FaultKind {
    Ice(Ice),
    /// EC2's buckets multiplied by this.
    Throttle {
        factor: f64,
    },
    ZoneLost {
        zone: String,
    },
    SpotInterruptions {
        per_hour: f64,
    },
    InterruptionBurst {
        messages: u64,
        per_second: u64,
    },
}

/// Offerings with no capacity.
#[derive(Clone, Debug, PartialEq)]
pub struct Ice {
    pub zone: String,
    pub capacity_types: Vec<dovetail_core::catalog::CapacityType>,
    pub instance_types: Vec<String>,
}

impl Scenario {
    /// Parses and checks a scenario; errors name the field.
    pub fn parse(text: &str) -> Result<Scenario, ScenarioError> {
        let de = serde_yaml::Deserializer::from_str(text);
        let file: ScenarioFile = serde_path_to_error::deserialize(de).map_err(|e| ScenarioError {
            scenario: "?".into(),
            field: e.path().to_string(),
            message: e.inner().to_string(),
        })?;
        Scenario::from_file(file)
    }

    pub fn builtin() -> Result<Scenario, ScenarioError> {
        Scenario::parse(DEFAULT)
    }

    fn from_file(f: ScenarioFile) -> Result<Scenario, ScenarioError> {
        let name = f.name.clone();
        let err = |field: &str, message: String| ScenarioError { scenario: name.clone(), field: field.into(), message };
        let ms = |field: &str, v: &str| -> Result<u64, ScenarioError> {
            match parse_duration(v) {
                Ok(Some(d)) => Ok(u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
                Ok(None) => Err(err(field, "Never is not a time here".into())),
                Err(e) => Err(err(field, e)),
            }
        };
        let opt = |field: &str, v: &Option<String>, default: Duration| -> Result<u64, ScenarioError> {
            match v {
                Some(v) => ms(field, v),
                None => Ok(u64::try_from(default.as_millis()).unwrap_or(u64::MAX)),
            }
        };
        let cpu = |field: &str, v: &str| -> Result<i64, ScenarioError> {
            v.parse::<Quantity>().map(|q| q.milli_value()).map_err(|e| err(field, e.to_string()))
        };
        let mem = |field: &str, v: &str| -> Result<i64, ScenarioError> {
            v.parse::<Quantity>().map(|q| q.value()).map_err(|e| err(field, e.to_string()))
        };
        if f.zones.is_empty() {
            return Err(err("zones", "at least one zone".into()));
        }
        let duration = ms("duration", &f.duration)?;
        let tick = opt("tick", &f.tick, Duration::from_secs(10))?.max(1);
        let cluster = Manifest::parse(&f.cluster).map_err(|e| err("cluster", e.to_string()))?;
        if cluster.nodepools.is_empty() {
            return Err(err("cluster", "no NodePool".into()));
        }
        let mut workloads = Vec::new();
        for (i, e) in f.workloads.iter().enumerate() {
            let at = ms(&format!("workloads[{i}].at"), &e.at)?;
            let every = e.every.as_deref().map(|v| ms(&format!("workloads[{i}].every"), v)).transpose()?;
            let until = e.until.as_deref().map(|v| ms(&format!("workloads[{i}].until"), v)).transpose()?;
            if every == Some(0) {
                return Err(err(&format!("workloads[{i}].every"), "must be longer than 0s".into()));
            }
            if every.is_none() && until.is_some() {
                return Err(err(&format!("workloads[{i}].until"), "repeats nothing without every".into()));
            }
            let w = match &e.action {
                Action::Deployment(d) => Workload::Deployment {
                    namespace: d.namespace.clone(),
                    name: d.name.clone(),
                    replicas: d.replicas,
                    cpu_milli: cpu(&format!("workloads[{i}].deployment.cpu"), &d.cpu)?,
                    memory: mem(&format!("workloads[{i}].deployment.memory"), &d.memory)?,
                },
                Action::Scale(s) => {
                    let declared = f.workloads[..i]
                        .iter()
                        .any(|p| matches!(&p.action, Action::Deployment(d) if d.name == s.name && d.namespace == s.namespace));
                    if !declared {
                        return Err(err(
                            &format!("workloads[{i}].scale.name"),
                            format!("no Deployment {}/{} before it", s.namespace, s.name),
                        ));
                    }
                    let pick = match s.pick {
                        PickSpec::Newest => dovetail_cluster::sim::Pick::Newest,
                        PickSpec::Random => dovetail_cluster::sim::Pick::Random(s.seed),
                    };
                    if !s.cycle.is_empty() && every.is_none() {
                        return Err(err(&format!("workloads[{i}].scale.cycle"), "cycles nothing without every".into()));
                    }
                    Workload::Scale { namespace: s.namespace.clone(), name: s.name.clone(), replicas: s.replicas, pick }
                }
                Action::Job(j) => Workload::Job {
                    namespace: j.namespace.clone(),
                    name: j.name.clone(),
                    parallelism: j.parallelism,
                    completions: j.completions,
                    run_for: ms(&format!("workloads[{i}].job.run_for"), &j.run_for)?,
                    cpu_milli: cpu(&format!("workloads[{i}].job.cpu"), &j.cpu)?,
                    memory: mem(&format!("workloads[{i}].job.memory"), &j.memory)?,
                },
            };
            match every {
                None => workloads.push((at, w)),
                Some(every) => {
                    // Repeated: at, at + every, ... until `until` or the run's end; a scale
                    // with a cycle takes its replicas in turn.
                    let end = until.unwrap_or(duration).min(duration);
                    let cycle = match &e.action {
                        Action::Scale(s) => s.cycle.clone(),
                        _ => Vec::new(),
                    };
                    const MOST: u64 = 100_000;
                    let times = if at > end { 0 } else { (end - at) / every + 1 };
                    if times > MOST {
                        return Err(err(
                            &format!("workloads[{i}].every"),
                            format!("repeats {times} times within the run; at most {MOST}"),
                        ));
                    }
                    let mut t = at;
                    for k in 0..times as usize {
                        let mut w = w.clone();
                        if let (Workload::Scale { replicas, .. }, true) = (&mut w, k > 0 && !cycle.is_empty()) {
                            *replicas = cycle[(k - 1) % cycle.len()];
                        }
                        workloads.push((t, w));
                        t = t.saturating_add(every);
                    }
                }
            }
        }
        workloads.sort_by_key(|(at, _)| *at);
        let mut faults = Vec::new();
        for (i, fault) in f.faults.iter().enumerate() {
            let from = ms(&format!("faults[{i}].at"), &fault.at)?;
            let until = ms(&format!("faults[{i}].until"), &fault.until)?;
            if until <= from {
                return Err(err(&format!("faults[{i}].until"), "must be after at".into()));
            }
            let field = |k: &str| format!("faults[{i}].{k}");
            let zone = |k: &str, z: &str| {
                if f.zones.iter().any(|x| x == z) {
                    Ok(z.to_string())
                } else {
                    Err(err(&field(k), format!("{z} is not one of zones")))
                }
            };
            let burst = fault.interruption_burst.as_ref();
            let kinds = [
                fault.ice.is_some(),
                fault.throttle.is_some(),
                fault.zone_lost.is_some(),
                fault.spot_interruptions.is_some(),
                burst.is_some(),
            ];
            let kind = match (&fault.ice, &fault.throttle, &fault.zone_lost, &fault.spot_interruptions) {
                _ if kinds.iter().filter(|k| **k).count() != 1 => {
                    return Err(err(
                        &format!("faults[{i}]"),
                        "exactly one of ice, throttle, zone_lost, spot_interruptions, interruption_burst".into(),
                    ));
                }
                (None, None, None, None) => {
                    let Some(b) = burst else {
                        return Err(err(&format!("faults[{i}]"), "no kind".into()));
                    };
                    if b.messages == 0 || b.per_second == 0 {
                        return Err(err(
                            &field("interruption_burst"),
                            format!("messages {} and per_second {}: both at least 1", b.messages, b.per_second),
                        ));
                    }
                    FaultKind::InterruptionBurst { messages: b.messages, per_second: b.per_second }
                }
                (Some(ice), None, None, None) => {
                    use dovetail_core::catalog::CapacityType;
                    let capacity_types = match ice.capacity_type.as_deref() {
                        None => vec![CapacityType::Spot, CapacityType::OnDemand],
                        Some("spot") => vec![CapacityType::Spot],
                        Some("on-demand") => vec![CapacityType::OnDemand],
                        Some(other) => {
                            return Err(err(&field("ice.capacity_type"), format!("{other:?}: spot or on-demand")));
                        }
                    };
                    FaultKind::Ice(Ice {
                        zone: zone("ice.zone", &ice.zone)?,
                        capacity_types,
                        instance_types: ice.instance_types.clone(),
                    })
                }
                (None, Some(t), None, None) => {
                    if !(t.factor.is_finite() && t.factor > 0.0) {
                        return Err(err(&field("throttle.factor"), format!("{}: a positive number", t.factor)));
                    }
                    FaultKind::Throttle { factor: t.factor }
                }
                (None, None, Some(z), None) => FaultKind::ZoneLost { zone: zone("zone_lost.zone", &z.zone)? },
                (None, None, None, Some(r)) => {
                    if !(r.per_hour.is_finite() && r.per_hour >= 0.0) {
                        return Err(err(
                            &field("spot_interruptions.per_hour"),
                            format!("{}: zero or more", r.per_hour),
                        ));
                    }
                    FaultKind::SpotInterruptions { per_hour: r.per_hour }
                }
                _ => {
                    return Err(err(
                        &format!("faults[{i}]"),
                        "exactly one of ice, throttle, zone_lost, spot_interruptions, interruption_burst".into(),
                    ));
                }
            };
            faults.push(Fault { from, until, kind });
        }
        let window = match f.window.as_deref() {
            None | Some("default") => dovetail_core::plane::BatchWindow::default(),
            Some("adaptive") => dovetail_core::plane::BatchWindow {
                adaptive: Some(dovetail_core::plane::Adaptive { short_queue: 10, short_idle: 50 }),
                ..dovetail_core::plane::BatchWindow::default()
            },
            Some(other) => return Err(err("window", format!("{other:?}: default or adaptive"))),
        };
        let api_limits_factor = f.cloud.api_limits_factor.unwrap_or(1.0);
        if !(api_limits_factor.is_finite() && api_limits_factor > 0.0) {
            return Err(err("cloud.api_limits_factor", format!("{api_limits_factor}: a positive number")));
        }
        let t = &f.thresholds;
        let thresholds = Thresholds {
            max_decision_p99_ms: t
                .max_decision_p99
                .as_deref()
                .map(|v| ms("thresholds.max_decision_p99", v))
                .transpose()?,
            max_decision_p50_ms: t
                .max_decision_p50
                .as_deref()
                .map(|v| ms("thresholds.max_decision_p50", v))
                .transpose()?,
            max_r: t.max_r,
            max_rss_mib: t.max_rss_mib,
            max_pending_at_end: t.max_pending_at_end,
            max_pending_age_ms: t
                .max_pending_age
                .as_deref()
                .map(|v| ms("thresholds.max_pending_age", v))
                .transpose()?,
            max_rss_slope_mib_per_day: t.max_rss_slope_mib_per_day,
            max_lease_lapses: t.max_lease_lapses,
            max_elections_without_kill: t.max_elections_without_kill,
            max_claims_launched_twice: t.max_claims_launched_twice,
            max_r_over_plan: t.max_r_over_plan,
            max_expiry_overdue_ms: t
                .max_expiry_overdue
                .as_deref()
                .map(|v| ms("thresholds.max_expiry_overdue", v))
                .transpose()?,
            min_expirations: t.min_expirations,
        };
        let control = match &f.control {
            None => None,
            Some(c) => {
                let kill = c.kill_leader_every.as_deref().map(|v| ms("control.kill_leader_every", v)).transpose()?;
                let shape = crate::ha::ControlNodes::new(c.nodes, kill);
                shape.check().map_err(|e| err("control", e))?;
                Some(shape)
            }
        };
        let edits = match &f.nodepool_edits {
            None => None,
            Some(e) => {
                let every = ms("nodepool_edits.every", &e.every)?;
                if every == 0 {
                    return Err(err("nodepool_edits.every", "must be longer than 0s".into()));
                }
                let mut nodepools = Vec::new();
                for (i, text) in e.nodepools.iter().enumerate() {
                    let field = format!("nodepool_edits.nodepools[{i}]");
                    let m = Manifest::parse(text).map_err(|e| err(&field, e.to_string()))?;
                    let [pool] = m.nodepools.as_slice() else {
                        return Err(err(&field, format!("one NodePool, found {}", m.nodepools.len())));
                    };
                    if !cluster.nodepools.iter().any(|p| p.name == pool.name) {
                        return Err(err(
                            &format!("{field}.metadata.name"),
                            format!("no NodePool {} in cluster", pool.name),
                        ));
                    }
                    nodepools.push(pool.clone());
                }
                if nodepools.is_empty() {
                    return Err(err("nodepool_edits.nodepools", "at least one NodePool".into()));
                }
                Some(Edits { from: ms("nodepool_edits.from", &e.from)?, every, nodepools })
            }
        };
        let releases = match &f.ami_releases {
            None => None,
            Some(r) => {
                let every = ms("ami_releases.every", &r.every)?;
                if every == 0 {
                    return Err(err("ami_releases.every", "must be longer than 0s".into()));
                }
                let until = r.until.as_deref().map(|v| ms("ami_releases.until", v)).transpose()?.unwrap_or(duration);
                Some((ms("ami_releases.from", &r.from)?, every, until))
            }
        };
        let virtual_time = match f.clock.as_deref() {
            None | Some("wall") => false,
            Some("virtual") => true,
            Some(other) => return Err(err("clock", format!("{other:?}: wall or virtual"))),
        };
        Ok(Scenario {
            virtual_time,
            control,
            edits,
            releases,
            api_limits_factor,
            thresholds,
            name: f.name,
            region: f.region,
            zones: f.zones,
            duration,
            tick,
            sample: opt("sample", &f.sample, Duration::from_secs(300))?.max(tick),
            registration_delay: opt("registration_delay", &f.registration_delay, Duration::from_secs(30))?,
            window,
            disruption: f.disruption.unwrap_or(true),
            cluster,
            workloads,
            faults,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_builtin_scenario_parses() {
        let s = Scenario::builtin().expect("builtin");
        assert_eq!(s.zones.len(), 3);
        assert!(s.cluster.nodepools.len() >= 2);
        assert!(s.cluster.nodepools.iter().any(|p| p.weight > 0), "one weighted pool");
        assert!(!s.faults.is_empty(), "an ICE episode");
        assert!(s.workloads.iter().any(|(_, w)| matches!(w, Workload::Scale { .. })), "a scale-down");
    }

    #[test]
    fn every_shipped_scenario_parses() {
        for (name, text) in BUILTIN {
            let s = Scenario::parse(text).unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!(s.name, name);
        }
        let big = Scenario::parse(builtin_named("10k-nodes").expect("10k")).expect("10k");
        assert_eq!(big.api_limits_factor, 1000.0);
        assert_eq!(big.thresholds.max_decision_p99_ms, Some(5_000));
    }

    #[test]
    fn errors_name_the_field() {
        let bad = DEFAULT.replace("duration: 24h", "duration: 24x");
        let e = Scenario::parse(&bad).expect_err("bad duration");
        assert_eq!(e.field, "duration", "{e}");
        let bad = DEFAULT.replace("cpu: 500m", "cpu: lots");
        let e = Scenario::parse(&bad).expect_err("bad cpu");
        assert!(e.field.starts_with("workloads[") && e.field.ends_with(".deployment.cpu"), "{e}");
        let e = Scenario::parse("name: x\nzones: [a]\nduration: 1h\ncluster: ''\nbogus: 1\n").expect_err("unknown");
        assert!(e.message.contains("bogus"), "{e}");
        // A repetition too fine for the run is refused, not cut short.
        let soak = BUILTIN.iter().find(|(n, _)| *n == "soak-ci").expect("soak-ci").1;
        let line = "{at: 1h, every: 1h, until: 8h, scale: {name: web";
        assert!(soak.contains(line));
        let e = Scenario::parse(&soak.replace(line, "{at: 1h, every: 100ms, until: 8h, scale: {name: web"))
            .expect_err("too many repetitions");
        assert!(e.field.ends_with(".every") && e.message.contains("at most 100000"), "{e}");
    }

    #[test]
    fn faults_of_every_kind_parse_and_a_fault_has_exactly_one_kind() {
        let faults = "faults:\n  - {at: 0s, until: 20m, ice: {zone: us-east-1a, capacity_type: on-demand}}\n  - {at: 1h, until: 1h10m, throttle: {factor: 0.01}}\n  - {at: 2h, until: 3h, zone_lost: {zone: us-east-1c}}\n  - {at: 4h, until: 5h, spot_interruptions: {per_hour: 2}}\n  - {at: 5h, until: 6h, interruption_burst: {messages: 300, per_second: 100}}\n";
        let text = format!(
            "name: f\nzones: [us-east-1a, us-east-1c]\nduration: 6h\ncluster: |\n{}\n{faults}",
            indent(SMALL_POOL)
        );
        let s = Scenario::parse(&text).expect("faults");
        let kinds: Vec<&FaultKind> = s.faults.iter().map(|f| &f.kind).collect();
        assert!(matches!(kinds[0], FaultKind::Ice(i) if i.zone == "us-east-1a"));
        assert_eq!(kinds[1], &FaultKind::Throttle { factor: 0.01 });
        assert_eq!(kinds[2], &FaultKind::ZoneLost { zone: "us-east-1c".into() });
        assert_eq!(kinds[3], &FaultKind::SpotInterruptions { per_hour: 2.0 });
        assert_eq!(kinds[4], &FaultKind::InterruptionBurst { messages: 300, per_second: 100 });
        assert_eq!((s.faults[2].from, s.faults[2].until), (7_200_000, 10_800_000));
        let e = Scenario::parse(&text.replace("per_second: 100", "per_second: 0")).expect_err("a rate of 0");
        assert_eq!(e.field, "faults[4].interruption_burst", "{e}");
        let two = text.replace("throttle: {factor: 0.01}", "throttle: {factor: 0.01}, zone_lost: {zone: us-east-1a}");
        let e = Scenario::parse(&two).expect_err("two kinds");
        assert_eq!(e.field, "faults[1]", "{e}");
        let e = Scenario::parse(&text.replace("zone: us-east-1c}", "zone: us-west-2a}")).expect_err("zone");
        assert_eq!(e.field, "faults[2].zone_lost.zone", "{e}");
    }

    const SMALL_POOL: &str = "apiVersion: karpenter.sh/v1\nkind: NodePool\nmetadata: {name: default}\nspec:\n  template:\n    spec:\n      nodeClassRef: {group: karpenter.k8s.aws, kind: EC2NodeClass, name: default}\n";

    fn indent(s: &str) -> String {
        s.lines().map(|l| format!("  {l}")).collect::<Vec<_>>().join("\n")
    }
}
