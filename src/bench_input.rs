//! `dovetail bench-input`: the benchmark workloads as plan YAML.

use std::collections::BTreeMap;
use std::process::ExitCode;

use anyhow::Context;
use clap::{Args, ValueEnum};
use dovetail_core::workload::{self, Capacity, Families, Mix, PodGroup};

/// Pod mixes.
#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum MixArg {
    /// The five kinds of the benchmark (generic, zone spread, hostname spread, zone affinity, anti-affinity).
    Diverse,
    /// Resource-only pods.
    Generic,
    /// Large pods (48-96 vCPU, 200-960 GiB) and 1-GPU pods (8 vCPU, 16-120 GiB); every
    /// family by default.
    Large,
}

/// Instance families the NodePool allows.
#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum FamiliesArg {
    /// c/m/r, generation > 4, amd64.
    Cmr,
    /// Every family, generation >= 5, amd64, not burstable, metal allowed.
    All,
}

/// Capacity types the NodePool allows.
#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum CapacityArg {
    OnDemand,
    Any,
}

/// Flags of `dovetail bench-input`.
#[derive(Args, Debug)]
pub struct BenchInputArgs {
    /// Number of pods.
    #[arg(long, default_value_t = 1000)]
    pub pods: usize,
    /// Random seed.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Which pods.
    #[arg(long, value_enum, default_value = "diverse")]
    pub mix: MixArg,
    /// Which instance families the NodePool allows (default c/m/r; `all` with --trace and
    /// the large mix).
    #[arg(long, value_enum)]
    pub families: Option<FamiliesArg>,
    /// Which capacity types the NodePool allows (default: any for the diverse mix,
    /// on-demand otherwise).
    #[arg(long, value_enum)]
    pub capacity: Option<CapacityArg>,
    /// A trace CSV (`pod_id,cpu_milli,memory_mib,gpu,gpu_milli,...`) to turn into pods
    /// instead of the generated workload; `gpu` becomes `nvidia.com/gpu`.
    #[arg(long)]
    pub trace: Option<String>,
}

/// Runs the command.
pub fn run(args: &BenchInputArgs) -> ExitCode {
    match render(args) {
        Ok(s) => {
            print!("{s}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(2)
        }
    }
}

fn render(args: &BenchInputArgs) -> anyhow::Result<String> {
    let default_families =
        if args.trace.is_some() || matches!(args.mix, MixArg::Large) { FamiliesArg::All } else { FamiliesArg::Cmr };
    let families = match args.families.unwrap_or(default_families) {
        FamiliesArg::Cmr => Families::Cmr,
        FamiliesArg::All => Families::All,
    };
    let default_capacity = if args.trace.is_none() && matches!(args.mix, MixArg::Diverse) {
        CapacityArg::Any
    } else {
        CapacityArg::OnDemand
    };
    let capacity = match args.capacity.unwrap_or(default_capacity) {
        CapacityArg::OnDemand => Capacity::OnDemand,
        CapacityArg::Any => Capacity::Any,
    };
    let mut out = nodepool_yaml(families, capacity);
    match &args.trace {
        Some(path) => {
            let text = std::fs::read_to_string(path).with_context(|| format!("reading {path}"))?;
            let groups = workload::trace_groups(&text).map_err(|e| anyhow::anyhow!("trace {path}: {e}"))?;
            for g in groups {
                out.push_str(&deployment(&g.name, g.count, &BTreeMap::new(), g.cpu_milli, g.memory_mib, g.gpus, ""));
            }
        }
        None => {
            let mix = match args.mix {
                MixArg::Diverse => Mix::Diverse,
                MixArg::Generic => Mix::Generic,
                MixArg::Large => Mix::Large,
            };
            for g in workload::groups(args.pods, args.seed, mix) {
                out.push_str(&group_yaml(&g));
            }
        }
    }
    Ok(out)
}

fn nodepool_yaml(families: Families, capacity: Capacity) -> String {
    let mut reqs = String::from(
        "        - {key: kubernetes.io/arch, operator: In, values: [amd64]}\n        - {key: topology.kubernetes.io/zone, operator: In, values: [us-east-1a, us-east-1b, us-east-1c]}\n",
    );
    match families {
        Families::Cmr => reqs.push_str(
            "        - {key: karpenter.k8s.aws/instance-category, operator: In, values: [c, m, r]}\n        - {key: karpenter.k8s.aws/instance-generation, operator: Gt, values: [\"4\"]}\n",
        ),
        Families::All => reqs.push_str(
            "        - {key: karpenter.k8s.aws/instance-category, operator: NotIn, values: [t]}\n        - {key: karpenter.k8s.aws/instance-generation, operator: Gte, values: [\"5\"]}\n",
        ),
    }
    if capacity == Capacity::OnDemand {
        reqs.push_str("        - {key: karpenter.sh/capacity-type, operator: In, values: [on-demand]}\n");
    }
    format!(
        "apiVersion: karpenter.sh/v1\nkind: NodePool\nmetadata: {{name: bench}}\nspec:\n  template:\n    spec:\n      nodeClassRef: {{group: karpenter.k8s.aws, kind: EC2NodeClass, name: default}}\n      requirements:\n{reqs}"
    )
}

fn deployment(
    name: &str,
    replicas: usize,
    labels: &BTreeMap<&str, String>,
    cpu_milli: i64,
    memory_mib: i64,
    gpu: i64,
    extra: &str,
) -> String {
    let mut labels_s = String::new();
    for (i, (k, v)) in labels.iter().enumerate() {
        if i > 0 {
            labels_s.push_str(", ");
        }
        labels_s.push_str(&format!("{k}: {v}"));
    }
    let selector = if labels.is_empty() { format!("bench: {name}") } else { labels_s.clone() };
    let template_labels = if labels.is_empty() { selector.clone() } else { labels_s };
    let gpu_s = if gpu > 0 { format!(", limits: {{nvidia.com/gpu: \"{gpu}\"}}") } else { String::new() };
    format!(
        "---\napiVersion: apps/v1\nkind: Deployment\nmetadata: {{name: {name}}}\nspec:\n  replicas: {replicas}\n  selector: {{matchLabels: {{{selector}}}}}\n  template:\n    metadata: {{labels: {{{template_labels}}}}}\n    spec:\n{extra}      containers: [{{name: c, image: x, resources: {{requests: {{cpu: {cpu_milli}m, memory: {memory_mib}Mi}}{gpu_s}}}}}]\n"
    )
}

fn group_yaml(g: &PodGroup) -> String {
    if g.kind >= 5 {
        return deployment(&g.name(), g.count, &BTreeMap::new(), g.cpu_milli, g.memory_mib, g.gpus, "");
    }
    let (key, value) = if g.kind == 4 { ("app", "nginx".to_string()) } else { ("my-label", format!("v{}", g.label)) };
    let labels = BTreeMap::from([(key, value.clone())]);
    let sel = format!("{{matchLabels: {{{key}: {value}}}}}");
    let extra = match g.kind {
        1 => format!(
            "      topologySpreadConstraints: [{{maxSkew: 1, topologyKey: topology.kubernetes.io/zone, whenUnsatisfiable: DoNotSchedule, labelSelector: {sel}}}]\n"
        ),
        2 => format!(
            "      topologySpreadConstraints: [{{maxSkew: 1, topologyKey: kubernetes.io/hostname, whenUnsatisfiable: DoNotSchedule, labelSelector: {sel}}}]\n"
        ),
        3 => format!(
            "      affinity: {{podAffinity: {{requiredDuringSchedulingIgnoredDuringExecution: [{{topologyKey: topology.kubernetes.io/zone, labelSelector: {sel}}}]}}}}\n"
        ),
        4 => format!(
            "      affinity: {{podAntiAffinity: {{requiredDuringSchedulingIgnoredDuringExecution: [{{topologyKey: kubernetes.io/hostname, labelSelector: {sel}}}]}}}}\n"
        ),
        _ => String::new(),
    };
    deployment(&g.name(), g.count, &labels, g.cpu_milli, g.memory_mib, 0, &extra)
}
