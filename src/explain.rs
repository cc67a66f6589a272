//! `dovetail explain node NAME`: what the running controller decided for the node and why,
//! as it wrote it on the node's NodeClaim (its `Consolidatable` and `Drifted` conditions, and
//! the NodeClaim's events), read from the cluster.
//!
//! `dovetail explain node NAME --disruption FILE`: the disruption planner's decision for one
//! node of a `plan` input, and why (an offline what-if). The input's NodePools, Nodes and
//! bound Pods are taken as a running cluster: each node of a NodePool as an initialized
//! NodeClaim, its pods settled for longer than `consolidateAfter`, no command under way.
//! What a plan input cannot say is left out and named in a note: how old a node is
//! (expiration), the template hash a NodeClaim was made with (NodePool drift), PDBs.

use std::collections::BTreeMap;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::{Context, bail};
use clap::{Args, Subcommand};
use dovetail_api::Manifest;
use dovetail_core::catalog::CapacityType;
use dovetail_core::cluster::{NodeClaim, NodeClaimStatus, Snapshot, TERMINATION_FINALIZER};
use dovetail_core::disruption::{self, Decision, Input, Memory, Plan, drift};
use dovetail_core::labels;
use dovetail_core::ledger::{Claim, ClaimState, Command, Entry, Millis, State, micro_dollars};
use dovetail_core::lifecycle::provider_id;
use dovetail_core::nodepool::{DisruptionReason, NodeClaimSpec};
use dovetail_core::resources::ResourceName;
use dovetail_core::scheduling::SolveOptions;

use crate::plan::{load_catalog, read_input, snapshot};

/// Flags of `dovetail explain`.
#[derive(Args, Debug)]
pub struct ExplainArgs {
    #[command(subcommand)]
    pub what: ExplainWhat,
}

/// What to explain.
#[derive(Subcommand, Debug)]
pub enum ExplainWhat {
    /// A node's disruption decision and its reason.
    Node(NodeArgs),
}

/// Flags of `dovetail explain node`.
#[derive(Args, Debug)]
pub struct NodeArgs {
    /// The node's name.
    pub name: String,
    /// A `plan` input (Kubernetes YAML with NodePools, Nodes and their Pods; `-` for stdin):
    /// decide offline, as if it were the cluster. Without it, the running controller's
    /// decision is read from the cluster.
    #[arg(long, value_name = "FILE")]
    pub disruption: Option<String>,
    /// The cluster to read (default: in a pod its service account, else KUBECONFIG, else
    /// ~/.kube/config); not read with `--disruption`.
    #[arg(long, env = "DOVETAIL_KUBECONFIG")]
    pub kubeconfig: Option<std::path::PathBuf>,
    /// AWS region of the built-in catalog.
    #[arg(long, default_value = "us-east-1")]
    pub region: String,
    /// A catalog file to use instead of the built-in one.
    #[arg(long)]
    pub catalog: Option<String>,
}

/// Runs the command; exit 2 on an input error or an unknown node.
pub fn run(args: &ExplainArgs, now: Millis) -> ExitCode {
    let ExplainWhat::Node(node) = &args.what;
    let explained = match &node.disruption {
        Some(file) => explain_node(node, file, now),
        None => explain_live(node),
    };
    match explained {
        Ok(text) => {
            print!("{text}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(2)
        }
    }
}

/// The explanation of one node, as printed.
pub fn explain_node(args: &NodeArgs, file: &str, now: Millis) -> anyhow::Result<String> {
    let text = read_input(file)?;
    let manifest = Manifest::parse(&text)?;
    let catalog = load_catalog(&args.region, args.catalog.as_deref())?;
    let mut warnings = manifest.warnings.clone();
    let sched = snapshot(&manifest, &catalog, &mut warnings);
    let Some(target) = manifest.nodes.iter().find(|n| n.name == args.name) else {
        bail!("node {:?} is not in {file}", args.name);
    };
    let Some(pool_name) = target.nodepool() else {
        bail!("node {:?} has no {} label: no NodePool of this input owns it", args.name, labels::NODEPOOL);
    };
    let Some(pool) = sched.nodepools.iter().find(|p| p.pool.name == pool_name) else {
        bail!("node {:?} is of NodePool {pool_name:?}, which is not in the input", args.name);
    };
    // The cluster: every node of the pool as an initialized NodeClaim of the ledger.
    let mut cluster = Snapshot::default();
    let mut ledger = State::default();
    let entry = |command| Entry { term: 1, at: now, command };
    ledger.apply(&entry(Command::SetPool { pool: pool_name.to_string(), limits: pool.pool.limits.clone() }));
    let d = &pool.pool.disruption;
    ledger.apply(&entry(Command::SetBudgets { pool: pool_name.to_string(), budgets: d.budgets.clone(), rate: d.rate }));
    let mut claims = Vec::new();
    let mut claim_of: BTreeMap<String, String> = BTreeMap::new();
    for n in manifest.nodes.iter().filter(|n| n.nodepool() == Some(pool_name)) {
        let zone = n.labels.get(labels::ZONE).cloned().unwrap_or_else(|| "unknown".into());
        let instance = n
            .provider_id
            .as_deref()
            .and_then(|p| p.rsplit('/').next())
            .filter(|i| !i.is_empty())
            .map_or_else(|| format!("i-{}", n.name), str::to_string);
        let id = n.owner_claim.clone().unwrap_or_else(|| n.name.clone());
        let capacity_type =
            n.labels.get(labels::CAPACITY_TYPE).and_then(|c| CapacityType::parse(c)).unwrap_or(CapacityType::OnDemand);
        let instance_type = n.labels.get(labels::INSTANCE_TYPE).cloned().unwrap_or_default();
        let price = pool
            .instance_types
            .iter()
            .find(|t| t.name == instance_type)
            .and_then(|t| t.offerings.iter().find(|o| o.zone == zone && o.capacity_type == capacity_type))
            .map_or(0.0, |o| o.price);
        let mut resources = n.capacity.clone();
        resources.set(ResourceName::Nodes, 1);
        claims.push(Claim {
            id: id.clone(),
            pool: pool_name.to_string(),
            zone: zone.clone(),
            resources,
            allocatable: n.allocatable.clone(),
            price_per_hour: micro_dollars(price),
            launched_as: Some((instance_type, capacity_type)),
            state: ClaimState::Initialized { instance: instance.clone() },
            reserved_at: now,
            changed_at: now,
            tried_at: None,
        });
        let mut annotations = pool.pool.annotations.clone();
        annotations.insert(drift::HASH_ANNOTATION.into(), drift::template_hash(&pool.pool));
        annotations.insert(drift::HASH_VERSION_ANNOTATION.into(), drift::HASH_VERSION.into());
        let nc = NodeClaim {
            name: id.clone(),
            spec: NodeClaimSpec {
                nodepool: pool_name.to_string(),
                annotations,
                expire_after: None,
                termination_grace_period: pool.pool.termination_grace_period,
                ..NodeClaimSpec::default()
            },
            finalizers: vec![TERMINATION_FINALIZER.to_string()],
            deleting: false,
            status: NodeClaimStatus {
                provider_id: Some(provider_id(&zone, &instance)),
                node_name: Some(n.name.clone()),
                ..NodeClaimStatus::default()
            },
            resource_version: 0,
            created: None,
        };
        cluster.nodeclaims.insert(id.clone(), Arc::new(nc));
        claim_of.insert(n.name.clone(), id);
        let mut node = n.clone();
        node.provider_id = Some(provider_id(&zone, &instance));
        cluster.nodes.insert(node.name.clone(), Arc::new(node));
    }
    // Nodes of other pools take pods too.
    for n in manifest.nodes.iter().filter(|n| n.nodepool() != Some(pool_name)) {
        cluster.nodes.insert(n.name.clone(), Arc::new(n.clone()));
    }
    for p in &manifest.bound {
        cluster.pods.insert(p.key.clone(), Arc::new(p.clone()));
    }
    for p in &manifest.daemonsets {
        cluster.daemonsets.insert(p.key.clone(), Arc::new(p.clone()));
    }
    cluster.namespaces = manifest.namespaces.clone();
    ledger.apply(&entry(Command::Adopt { claims: claims.clone() }));
    let claims: Vec<Claim> = ledger.claims_of(pool_name).cloned().collect();
    let reasons = [DisruptionReason::Empty, DisruptionReason::Drifted, DisruptionReason::Underutilized];
    let available: BTreeMap<DisruptionReason, u32> = reasons
        .into_iter()
        .map(|r| (r, ledger.allowance(pool_name, r, &[], now).map_or(0, |a| a.available())))
        .collect();
    let (leases, cloud_drift, nominated) = (BTreeMap::new(), BTreeMap::new(), BTreeMap::new());
    let opts = SolveOptions::default();
    let decide = |at: Millis, memory: &mut Memory| -> Plan {
        let input = Input {
            pool: &pool.pool,
            types: &pool.instance_types,
            claims: &claims,
            leases: &leases,
            available: &available,
            cloud_drift: &cloud_drift,
            nominated: &nominated,
            snapshot: &cluster,
            pools: &sched.nodepools,
            opts: &opts,
            spot_to_spot: false,
            validation: 0,
            max_commands: dovetail_actors::config::DisruptionConfig::default().max_commands,
            synced: true,
            now: at,
        };
        disruption::plan(&input, memory)
    };
    // The pods are taken as settled: the planner sees them once `consolidateAfter` ago.
    let mut memory = Memory::default();
    let after = d.consolidate_after.map_or(0, dovetail_core::clock::to_millis);
    decide(now.saturating_sub(after), &mut memory);
    let plan = decide(now, &mut memory);
    let claim = claim_of.get(&args.name).context("the node's claim")?;
    let Some(Decision { verdict, .. }) = plan.decisions.get(claim) else {
        bail!("no decision for node {:?}", args.name);
    };
    let mut out = format!("node {} (nodepool {pool_name}): {verdict}\n", args.name);
    if let Some(p) = plan.proposals.iter().find(|p| p.candidates.contains(claim)) {
        let others: Vec<&str> =
            claim_of.iter().filter(|(_, c)| p.candidates.contains(c)).map(|(n, _)| n.as_str()).collect();
        out.push_str(&format!(
            "  command: {} ({}), nodes {}, {} new node(s)\n",
            p.method.as_str(),
            p.reason,
            others.join(", "),
            p.replacements.len()
        ));
    }
    out.push_str(
        "  note: a plan input has no node ages, NodeClaim template hashes or PodDisruptionBudgets: expiration and \
         NodePool drift are not judged, and no PDB blocks\n",
    );
    for w in warnings {
        out.push_str(&format!("  warning: {w}\n"));
    }
    Ok(out)
}

/// The running controller's decision for a node, as its NodeClaim carries it.
fn explain_live(args: &NodeArgs) -> anyhow::Result<String> {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().context("starting a runtime")?;
    rt.block_on(async {
        let (config, _) =
            crate::controller::kube_config(args.kubeconfig.as_deref()).await.map_err(anyhow::Error::msg)?;
        let client = dovetail_cluster::kube::client(config).context("building the API client")?;
        read_live(&client, &args.name).await
    })
}

async fn read_live(client: &kube::Client, name: &str) -> anyhow::Result<String> {
    use k8s_openapi::api::core::v1 as k8s;
    use kube::api::{Api, ListParams};
    let nodes: Api<k8s::Node> = Api::all(client.clone());
    let node = nodes.get_opt(name).await.with_context(|| format!("reading node {name}"))?;
    let Some(node) = node else { bail!("node {name} not found") };
    let provider = node.spec.as_ref().and_then(|s| s.provider_id.clone());
    let owner = node.metadata.owner_references.iter().flatten().find(|o| o.kind == "NodeClaim").map(|o| o.name.clone());
    let claims: Api<dovetail_api::crd::NodeClaim> = Api::all(client.clone());
    let claim = match owner {
        Some(owner) => claims.get_opt(&owner).await.with_context(|| format!("reading nodeclaim {owner}"))?,
        None => claims.list(&ListParams::default()).await.context("listing nodeclaims")?.items.into_iter().find(|c| {
            let status = c.status.as_ref();
            status.and_then(|s| s.provider_id.as_ref()).is_some_and(|p| Some(p) == provider.as_ref())
                || status.and_then(|s| s.node_name.as_deref()) == Some(name)
        }),
    };
    let Some(claim) = claim else { bail!("node {name} has no NodeClaim: no NodePool manages it") };
    let claim_name = claim.metadata.name.clone().unwrap_or_default();
    let pool = node.metadata.labels.as_ref().and_then(|l| l.get(labels::NODEPOOL)).cloned().unwrap_or_default();
    let mut out = format!("node {name} (nodeclaim {claim_name}, nodepool {pool})\n");
    let conditions = claim.status.as_ref().and_then(|s| s.conditions.clone()).unwrap_or_default();
    let mut decided = false;
    for kind in ["Consolidatable", "Drifted"] {
        let Some(c) = conditions.iter().find(|c| c.type_ == kind) else { continue };
        decided = true;
        out.push_str(&format!(
            "{}: {} ({}) since {}\n  {}\n",
            kind.to_lowercase(),
            c.status,
            c.reason.as_deref().unwrap_or_default(),
            c.last_transition_time.as_deref().unwrap_or("?"),
            c.message.as_deref().unwrap_or_default()
        ));
    }
    if !decided {
        out.push_str("no decision yet: the controller has not planned disruption for its nodepool\n");
    }
    // What was done about it, latest last (the events of a NodeClaim are in `default`, as for
    // any object without a namespace). Without them the decision still stands.
    let events: Api<k8s::Event> = Api::namespaced(client.clone(), "default");
    let selector = format!("involvedObject.kind=NodeClaim,involvedObject.name={claim_name}");
    let mut listed = match events.list(&ListParams::default().fields(&selector)).await {
        Ok(l) => l.items,
        Err(e) => {
            out.push_str(&format!("(its events could not be read: {e})\n"));
            Vec::new()
        }
    };
    listed.sort_by_key(event_time);
    for e in listed.iter().rev().take(5).rev() {
        out.push_str(&format!(
            "event {} {}: {}\n",
            event_time(e),
            e.reason.as_deref().unwrap_or_default(),
            e.message.as_deref().unwrap_or_default()
        ));
    }
    Ok(out)
}

/// When an event last happened (RFC 3339), whichever of its times it has.
fn event_time(e: &k8s_openapi::api::core::v1::Event) -> String {
    let t = e.last_timestamp.as_ref().map(|t| t.0).or(e.event_time.as_ref().map(|t| t.0));
    t.map(|t| t.to_string()).unwrap_or_default()
}
