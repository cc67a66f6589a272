//! `dovetail plan`: Kubernetes YAML in, a provisioning plan out.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Instant;

use anyhow::Context;
use clap::{Args, ValueEnum};
use dovetail_api::Manifest;
use dovetail_core::catalog::{Catalog, InstanceType, NodeClassSettings};
use dovetail_core::pod::Pod;
use dovetail_core::scheduling::{self, PoolInput, Results, Snapshot, SolveOptions};
use serde::Serialize;

/// Output formats.
#[derive(Clone, Copy, Debug, ValueEnum, PartialEq, Eq)]
pub enum Output {
    Table,
    Json,
}

/// Placement policies.
#[derive(Clone, Copy, Debug, ValueEnum, PartialEq, Eq)]
pub enum PackerArg {
    /// Equivalence classes, LP-guided instance types, right-sizing (the default).
    Dovetail,
    /// Karpenter's per-pod greedy, for comparison.
    Karpenter,
}

/// Flags of `dovetail plan`.
#[derive(Args, Debug)]
pub struct PlanArgs {
    /// Kubernetes YAML to plan for (`-` for stdin).
    #[arg(short = 'f', long = "file")]
    pub file: String,
    /// Output format.
    #[arg(short = 'o', long, value_enum, default_value = "table")]
    pub output: Output,
    /// AWS region of the built-in catalog.
    #[arg(long, default_value = "us-east-1")]
    pub region: String,
    /// A catalog file (docs/catalog.md) to use instead of the built-in one.
    #[arg(long)]
    pub catalog: Option<String>,
    /// The placement policy.
    #[arg(long, value_enum, default_value = "dovetail")]
    pub packer: PackerArg,
    /// Recheck the plan independently (fit from the raw catalog and DaemonSets, every
    /// constraint on the end state); violations go to stderr and the exit code is 3.
    #[arg(long)]
    pub validate: bool,
}

/// A claim's candidate instance types: indices into its pool's types, written out as names
/// only when serialized (a claim may carry 600 of them; copying every name for thousands of
/// claims would dominate the plan's memory).
#[derive(Debug)]
pub struct TypeNames {
    types: Arc<Vec<InstanceType>>,
    indices: Vec<u32>,
}

impl TypeNames {
    /// The names, cheapest first.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.indices.iter().map(|&i| self.types[i as usize].name.as_str())
    }

    pub fn len(&self) -> usize {
        self.indices.len()
    }
}

impl Serialize for TypeNames {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(self.names())
    }
}

/// One planned NodeClaim, as `--output json` prints it.
#[derive(Serialize, Debug)]
pub struct ClaimOut {
    pub name: String,
    pub nodepool: String,
    pub instance_type: String,
    pub instance_types: TypeNames,
    pub zone: String,
    pub capacity_type: String,
    pub price_per_hour: f64,
    pub pods: Vec<String>,
    /// Pod requests plus the smallest DaemonSet overhead.
    pub requests: BTreeMap<String, String>,
    /// Labels the node will have that the plan already knows: every requirement with a
    /// single value, plus the launch's zone, capacity type and instance type.
    pub labels: BTreeMap<String, String>,
}

/// Pods placed on an existing node.
#[derive(Serialize, Debug)]
pub struct ExistingOut {
    pub node: String,
    pub pods: Vec<String>,
}

/// A pod that cannot be placed.
#[derive(Serialize, Debug)]
pub struct UnschedulableOut {
    pub pod: String,
    pub reason: String,
}

/// Totals.
#[derive(Serialize, Debug)]
pub struct Summary {
    pub pods: usize,
    pub scheduled: usize,
    pub new_nodes: usize,
    pub cost_per_hour: f64,
    pub lower_bound_per_hour: Option<f64>,
    /// For plans too small for the fluid bound to judge (it is below ten times the cheapest
    /// node used) with at most 50 pods on new nodes: the cost of the cheapest plan for them,
    /// by exact search (topology other than hostname anti-affinity and spread left out, so
    /// never above any plan's cost).
    pub optimum_per_hour: Option<f64>,
    /// `cost_per_hour` over `lower_bound_per_hour`, or over `optimum_per_hour` for small
    /// plans; null when neither applies.
    pub ratio: Option<f64>,
    pub solve_ms: f64,
    /// Time to compute the lower bound (and, for small plans, the cheapest plan).
    pub lb_ms: f64,
}

/// The whole plan.
#[derive(Serialize, Debug)]
pub struct PlanOut {
    pub nodeclaims: Vec<ClaimOut>,
    pub existing: Vec<ExistingOut>,
    pub unschedulable: Vec<UnschedulableOut>,
    pub summary: Summary,
}

/// Runs the command; exit 2 on any input error.
pub fn run(args: &PlanArgs) -> ExitCode {
    match plan(args) {
        Ok((out, warnings, violations)) => {
            for w in warnings {
                eprintln!("warning: {w}");
            }
            match args.output {
                Output::Json => {
                    // Streamed: a 50,000-pod plan is tens of megabytes of JSON.
                    let mut w = std::io::BufWriter::new(std::io::stdout().lock());
                    let written = serde_json::to_writer_pretty(&mut w, &out)
                        .map_err(std::io::Error::from)
                        .and_then(|()| writeln!(w))
                        .and_then(|()| w.flush());
                    if let Err(e) = written {
                        eprintln!("error: writing JSON: {e}");
                        return ExitCode::from(1);
                    }
                }
                Output::Table => print!("{}", table(&out)),
            }
            if !violations.is_empty() {
                for v in &violations {
                    eprintln!("violation: {v}");
                }
                eprintln!("error: the plan breaks {} rule(s) (see the violations above)", violations.len());
                return ExitCode::from(3);
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(2)
        }
    }
}

pub fn read_input(file: &str) -> anyhow::Result<String> {
    let mut s = String::new();
    if file == "-" {
        std::io::stdin().read_to_string(&mut s).context("reading stdin")?;
    } else {
        s = std::fs::read_to_string(file).with_context(|| format!("reading {file}"))?;
    }
    Ok(s)
}

/// Loads the catalog: a file if given, else the built-in one for the region.
pub fn load_catalog(region: &str, catalog: Option<&str>) -> anyhow::Result<Catalog> {
    match catalog {
        Some(path) => {
            let text = std::fs::read_to_string(path).with_context(|| format!("reading catalog {path}"))?;
            let c = Catalog::from_json(&text).with_context(|| format!("catalog {path}"))?;
            if c.region != region && region != "us-east-1" {
                anyhow::bail!("catalog {path} is for region {}, not {region}", c.region);
            }
            Ok(c)
        }
        None => Ok(Catalog::embedded(region)?),
    }
}

/// Builds the snapshot and pending pods of a manifest.
pub fn snapshot(manifest: &Manifest, catalog: &Catalog, warnings: &mut Vec<String>) -> Snapshot {
    let pools = if manifest.nodepools.is_empty() {
        vec![dovetail_api::convert::default_nodepool()]
    } else {
        manifest.nodepools.clone()
    };
    let mut by_class: BTreeMap<String, Arc<Vec<InstanceType>>> = BTreeMap::new();
    let nodepools = pools
        .into_iter()
        .map(|pool| {
            let class = pool.node_class.name.clone();
            let types = by_class
                .entry(class.clone())
                .or_insert_with(|| {
                    let settings = manifest.nodeclasses.get(&class).cloned().unwrap_or_else(|| {
                        if !manifest.nodeclasses.is_empty() {
                            warnings.push(format!(
                                "NodePool {:?} references EC2NodeClass {class:?}, which is not in the input; assuming defaults",
                                pool.name
                            ));
                        }
                        NodeClassSettings::default()
                    });
                    Arc::new(catalog.instance_types(&settings, None))
                })
                .clone();
            PoolInput { pool, instance_types: types }
        })
        .collect();
    Snapshot {
        nodepools,
        nodes: manifest.nodes.clone(),
        bound_pods: manifest.bound.iter().cloned().map(Arc::new).collect(),
        daemonsets: manifest.daemonsets.clone(),
        namespaces: manifest.namespaces.clone(),
    }
}

fn plan(args: &PlanArgs) -> anyhow::Result<(PlanOut, Vec<String>, Vec<String>)> {
    let text = read_input(&args.file)?;
    let manifest = Manifest::parse(&text)?;
    let catalog = load_catalog(&args.region, args.catalog.as_deref())?;
    let mut warnings = manifest.warnings.clone();
    let snap = snapshot(&manifest, &catalog, &mut warnings);
    let start = Instant::now();
    let opts = SolveOptions {
        packer: match args.packer {
            PackerArg::Dovetail => scheduling::Packer::Dovetail,
            PackerArg::Karpenter => scheduling::Packer::Karpenter,
        },
        ..SolveOptions::default()
    };
    let results = scheduling::solve(&snap, &manifest.pending, &opts);
    let solve_ms = start.elapsed().as_secs_f64() * 1000.0;
    warnings.extend(results.warnings.iter().cloned());
    let on_new: Vec<usize> = results.claims.iter().flat_map(|c| c.pods.iter().copied()).collect();
    let semantics = match args.packer {
        PackerArg::Dovetail => scheduling::Semantics::Strict,
        PackerArg::Karpenter => scheduling::Semantics::Karpenter,
    };
    let violations =
        if args.validate { scheduling::validate(&snap, &manifest.pending, &results, semantics) } else { Vec::new() };
    let mut out = render(&snap, &manifest.pending, results, solve_ms);
    let start = Instant::now();
    let lb = scheduling::lower_bound(&snap, &manifest.pending, &on_new);
    out.summary.lower_bound_per_hour = Some(lb.value);
    let cheapest_used = out.nodeclaims.iter().map(|c| c.price_per_hour).fold(f64::INFINITY, f64::min);
    if lb.value > 0.0 && cheapest_used.is_finite() && lb.value >= 10.0 * cheapest_used {
        out.summary.ratio = Some(out.summary.cost_per_hour / lb.value);
    } else if let Some(best) = scheduling::optimum(&snap, &manifest.pending, &on_new).filter(|b| *b > 0.0) {
        out.summary.optimum_per_hour = Some(best);
        out.summary.ratio = Some(out.summary.cost_per_hour / best);
    }
    out.summary.lb_ms = start.elapsed().as_secs_f64() * 1000.0;
    Ok((out, warnings, violations))
}

/// Turns results into the output shape.
pub fn render(snap: &Snapshot, pods: &[Pod], mut results: Results, solve_ms: f64) -> PlanOut {
    let mut per_pool: BTreeMap<&str, usize> = BTreeMap::new();
    let mut unschedulable: Vec<UnschedulableOut> = results
        .errors
        .iter()
        .map(|(i, r)| UnschedulableOut { pod: pods[*i].key.to_string(), reason: r.clone() })
        .collect();
    let mut nodeclaims = Vec::new();
    for c in &mut results.claims {
        let input = &snap.nodepools[c.pool];
        let its = &input.instance_types;
        let Some(l) = &c.launch else {
            for &p in &c.pods {
                unschedulable.push(UnschedulableOut {
                    pod: pods[p].key.to_string(),
                    reason: "no instance type of its NodeClaim has an available offering at launch".into(),
                });
            }
            continue;
        };
        let n = per_pool.entry(input.pool.name.as_str()).or_insert(0);
        *n += 1;
        nodeclaims.push(ClaimOut {
            name: format!("{}-{:05}", input.pool.name, n),
            nodepool: input.pool.name.clone(),
            instance_type: its[l.instance_type].name.clone(),
            instance_types: TypeNames { types: its.clone(), indices: std::mem::take(&mut c.instance_types) },
            zone: l.zone.clone(),
            capacity_type: l.capacity_type.as_str().to_string(),
            price_per_hour: l.price,
            pods: c.pods.iter().map(|&p| pods[p].key.to_string()).collect(),
            requests: c.requests.iter().map(|(n, v)| (n.to_string(), n.quantity_of(v).to_string())).collect(),
            labels: claim_labels(c, &its[l.instance_type], l),
        });
    }
    let existing: Vec<ExistingOut> = results
        .existing
        .iter()
        .map(|e| ExistingOut {
            node: snap.nodes[e.node].name.clone(),
            pods: e.pods.iter().map(|&p| pods[p].key.to_string()).collect(),
        })
        .collect();
    let scheduled =
        nodeclaims.iter().map(|c| c.pods.len()).sum::<usize>() + existing.iter().map(|e| e.pods.len()).sum::<usize>();
    let cost = nodeclaims.iter().map(|c| c.price_per_hour).sum();
    PlanOut {
        summary: Summary {
            pods: pods.len(),
            scheduled,
            new_nodes: nodeclaims.len(),
            cost_per_hour: cost,
            lower_bound_per_hour: None,
            optimum_per_hour: None,
            ratio: None,
            solve_ms,
            lb_ms: 0.0,
        },
        nodeclaims,
        existing,
        unschedulable,
    }
}

fn claim_labels(c: &scheduling::NewClaim, it: &InstanceType, l: &scheduling::Launch) -> BTreeMap<String, String> {
    let mut labels: BTreeMap<String, String> = c
        .requirements
        .iter()
        .filter(|(k, r)| {
            !r.is_complement()
                && r.values().len() == 1
                && *k != dovetail_core::labels::INITIALIZED
                && *k != dovetail_core::labels::REGISTERED
        })
        .map(|(k, r)| (k.to_string(), r.values()[0].clone()))
        .collect();
    labels.insert(dovetail_core::labels::ZONE.into(), l.zone.clone());
    labels.insert(dovetail_core::labels::CAPACITY_TYPE.into(), l.capacity_type.as_str().into());
    labels.insert(dovetail_core::labels::INSTANCE_TYPE.into(), it.name.clone());
    labels
}

fn candidates(types: &TypeNames) -> String {
    let shown: Vec<&str> = types.names().take(3).collect();
    let mut s = shown.join(", ");
    if types.len() > 3 {
        s.push_str(&format!(" and {} other(s)", types.len() - 3));
    }
    s
}

/// The human-readable form.
pub fn table(out: &PlanOut) -> String {
    let mut s = String::new();
    if !out.nodeclaims.is_empty() {
        s.push_str(&format!(
            "{:<24} {:<16} {:<18} {:<12} {:<10} {:>9} {:>5}  {}\n",
            "NODECLAIM", "NODEPOOL", "INSTANCE-TYPE", "ZONE", "CAPACITY", "$/HOUR", "PODS", "CANDIDATES"
        ));
        for c in &out.nodeclaims {
            s.push_str(&format!(
                "{:<24} {:<16} {:<18} {:<12} {:<10} {:>9.4} {:>5}  {}\n",
                c.name,
                c.nodepool,
                c.instance_type,
                c.zone,
                c.capacity_type,
                c.price_per_hour,
                c.pods.len(),
                candidates(&c.instance_types)
            ));
        }
        s.push('\n');
    }
    if !out.existing.is_empty() {
        s.push_str(&format!("{:<32} {:>5}\n", "EXISTING-NODE", "PODS"));
        for e in &out.existing {
            s.push_str(&format!("{:<32} {:>5}\n", e.node, e.pods.len()));
        }
        s.push('\n');
    }
    if !out.unschedulable.is_empty() {
        s.push_str("UNSCHEDULABLE-POD  REASON\n");
        for u in &out.unschedulable {
            s.push_str(&format!("{}  {}\n", u.pod, u.reason));
        }
        s.push('\n');
    }
    let sm = &out.summary;
    if let Some(lb) = sm.lower_bound_per_hour {
        match (sm.optimum_per_hour, sm.ratio) {
            (Some(best), Some(r)) => s.push_str(&format!(
                "lower bound ${lb:.4}/hour, cheapest plan ${best:.4}/hour ({:.1} ms); cost/cheapest {r:.3}\n",
                sm.lb_ms
            )),
            (_, Some(r)) => s.push_str(&format!("lower bound ${lb:.4}/hour ({:.1} ms); cost/bound {r:.3}\n", sm.lb_ms)),
            _ => s.push_str(&format!(
                "lower bound ${lb:.4}/hour ({:.1} ms); cost/bound n/a (bound below 10 cheapest nodes)\n",
                sm.lb_ms
            )),
        }
    }
    s.push_str(&format!(
        "{} pending pods: {} scheduled ({} on {} new nodes, {} on existing nodes), {} unschedulable; ${:.4}/hour; solve {:.1} ms\n",
        sm.pods,
        sm.scheduled,
        out.nodeclaims.iter().map(|c| c.pods.len()).sum::<usize>(),
        sm.new_nodes,
        out.existing.iter().map(|e| e.pods.len()).sum::<usize>(),
        out.unschedulable.len(),
        sm.cost_per_hour,
        sm.solve_ms
    ));
    s
}
