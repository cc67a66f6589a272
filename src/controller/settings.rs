//! The controller's settings: flags, then `DOVETAIL_*` environment variables, then a config
//! file (YAML, the flags' names in camelCase), then the defaults. Names follow Karpenter's
//! chart values where the meaning is the same (`clusterName`, `interruptionQueue`).

use std::net::SocketAddr;
use std::path::PathBuf;

use serde::Deserialize;

/// The cloud the controller launches in.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CloudKind {
    /// EC2, through the AWS SDK (credentials and region as the SDK finds them).
    Aws,
    /// The sim cloud: every launched instance becomes a Node object in the real API, kept
    /// Ready by a node agent, with no cloud account (like Karpenter's kwok provider).
    Sim,
}

#[derive(clap::Args, Clone, Debug, Default)]
pub struct ControllerArgs {
    /// A kubeconfig file. Default: in-cluster config, then KUBECONFIG, then ~/.kube/config.
    #[arg(long, env = "DOVETAIL_KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,
    /// The cloud to launch in.
    #[arg(long, value_enum, env = "DOVETAIL_CLOUD")]
    pub cloud: Option<CloudKind>,
    /// The cluster's name (tags its instances; Karpenter's `settings.clusterName`).
    #[arg(long, env = "DOVETAIL_CLUSTER_NAME")]
    pub cluster_name: Option<String>,
    /// The AWS region (its catalog prices the sim cloud's offerings too).
    #[arg(long, env = "DOVETAIL_REGION")]
    pub region: Option<String>,
    /// Where /metrics is served.
    #[arg(long, env = "DOVETAIL_METRICS_ADDR")]
    pub metrics_addr: Option<SocketAddr>,
    /// How log lines are written: json (one object per line, with the trace id of the
    /// decision a line is part of) or text. Default json.
    #[arg(long, value_enum, env = "DOVETAIL_LOG_FORMAT")]
    pub log_format: Option<crate::logs::LogFormat>,
    /// The log level (debug, info, warn, error) or a filter such as `info,kube_client=error`;
    /// RUST_LOG, when set, wins. Default info.
    #[arg(long, env = "DOVETAIL_LOG_LEVEL")]
    pub log_level: Option<String>,
    /// Where /healthz (live) and /readyz (caches synced) are served.
    #[arg(long, env = "DOVETAIL_HEALTH_ADDR")]
    pub health_addr: Option<SocketAddr>,
    /// The zones to launch in (default: with --cloud sim the region's first three; with
    /// --cloud aws every zone EC2 describes, each NodePool narrowed to its subnets' zones).
    #[arg(long, value_delimiter = ',', env = "DOVETAIL_ZONES")]
    pub zones: Option<Vec<String>>,
    /// Requests per second to the API server (Karpenter's KUBE_CLIENT_QPS).
    #[arg(long, env = "DOVETAIL_KUBE_CLIENT_QPS")]
    pub kube_client_qps: Option<f64>,
    /// Requests at once above the rate (Karpenter's KUBE_CLIENT_BURST).
    #[arg(long, env = "DOVETAIL_KUBE_CLIENT_BURST")]
    pub kube_client_burst: Option<u32>,
    /// With --cloud sim: how long an instance takes to register as a Node, in milliseconds.
    #[arg(long, env = "DOVETAIL_SIM_REGISTRATION_DELAY_MS")]
    pub sim_registration_delay_ms: Option<u64>,
    /// With --cloud aws: the EC2/SSM endpoint (an emulator, a VPC endpoint; AWS_ENDPOINT_URL
    /// works too). Default: the region's.
    #[arg(long, env = "DOVETAIL_AWS_ENDPOINT")]
    pub aws_endpoint: Option<String>,
    /// With --cloud aws: the API server endpoint the nodes join (Karpenter's
    /// `settings.clusterEndpoint`). Default: the one the controller reaches.
    #[arg(long, env = "DOVETAIL_CLUSTER_ENDPOINT")]
    pub cluster_endpoint: Option<String>,
    /// With --cloud aws: the cluster's CA bundle, base64 (Karpenter's
    /// `settings.clusterCABundle`). Default: the CA of the controller's own connection.
    #[arg(long, env = "DOVETAIL_CLUSTER_CA_BUNDLE")]
    pub cluster_ca_bundle: Option<String>,
    /// With --cloud aws: where alias AMIs' SSM parameters are read (default
    /// /aws/service/eks/optimized-ami, AWS's public ones).
    #[arg(long, env = "DOVETAIL_AMI_PARAMETER_PREFIX")]
    pub ami_parameter_prefix: Option<String>,
    /// With --peers: this control node's id in the Raft group.
    #[arg(long, env = "DOVETAIL_NODE_ID")]
    pub node_id: Option<u64>,
    /// With --peers: where this node serves Raft (HOST:PORT; its entry in --peers is where
    /// the others reach it).
    #[arg(long, env = "DOVETAIL_RAFT_ADDR")]
    pub raft_addr: Option<String>,
    /// The Raft group: every control node as ID=HOST:PORT, this one included. Unset: one
    /// control node with its ledger in memory (the default).
    #[arg(long, value_delimiter = ',', env = "DOVETAIL_PEERS")]
    pub peers: Option<Vec<String>>,
    /// With --peers: where the ledger's log and snapshots are kept.
    #[arg(long, env = "DOVETAIL_DATA_DIR")]
    pub data_dir: Option<PathBuf>,
    /// With --peers: a file holding the group's shared secret (at least 16 bytes; every Raft
    /// message carries it).
    #[arg(long, env = "DOVETAIL_RAFT_SECRET_FILE")]
    pub raft_secret_file: Option<PathBuf>,
    /// With --peers: the group's CA certificate (PEM). With --raft-tls-cert and
    /// --raft-tls-key, Raft runs over mutual TLS: a peer without a certificate of this CA is
    /// refused at the handshake. Without them Raft messages (and the secret) are cleartext.
    #[arg(long, env = "DOVETAIL_RAFT_TLS_CA")]
    pub raft_tls_ca: Option<PathBuf>,
    /// With --raft-tls-ca: this node's certificate chain (PEM), naming the host its peers dial
    /// (its --peers entry) and usable for server and client authentication.
    #[arg(long, env = "DOVETAIL_RAFT_TLS_CERT")]
    pub raft_tls_cert: Option<PathBuf>,
    /// With --raft-tls-ca: this node's private key (PEM).
    #[arg(long, env = "DOVETAIL_RAFT_TLS_KEY")]
    pub raft_tls_key: Option<PathBuf>,
    /// With --peers: how often the leader sends heartbeats, in milliseconds (default 50).
    #[arg(long, env = "DOVETAIL_RAFT_HEARTBEAT_MS")]
    pub raft_heartbeat_ms: Option<u64>,
    /// With --peers: a follower that hears no heartbeat for a random time between the shortest
    /// and the longest election timeout starts an election, in milliseconds (default 150; at
    /// least three heartbeats). Nine tenths of it is the leader's lease: a leader that heard no
    /// quorum for that long makes no effect. Every node of a group should use the same.
    #[arg(long, env = "DOVETAIL_RAFT_ELECTION_TIMEOUT_MIN_MS")]
    pub raft_election_timeout_min_ms: Option<u64>,
    /// With --peers: the longest election timeout, in milliseconds (default 300).
    #[arg(long, env = "DOVETAIL_RAFT_ELECTION_TIMEOUT_MAX_MS")]
    pub raft_election_timeout_max_ms: Option<u64>,
    /// With --cloud aws: an SQS queue of EC2 interruption events (spot interruption warnings,
    /// rebalance recommendations, scheduled maintenance, instance state changes) to act on, by
    /// name (Karpenter's `settings.interruptionQueue`). Repeatable, or comma-separated: a
    /// cluster spread over several queues drains them all.
    #[arg(long = "interruption-queue", value_delimiter = ',', env = "DOVETAIL_INTERRUPTION_QUEUE")]
    pub interruption_queue: Option<Vec<String>>,
    /// How often instances tagged for the cluster are listed to terminate those no NodeClaim
    /// knows (older than 30 s), in seconds (default 120, Karpenter's).
    #[arg(long, env = "DOVETAIL_GC_INTERVAL")]
    pub gc_interval: Option<u64>,
    /// With --interruption-queue: long-pollers per queue to start with (default 2; more start
    /// while receives come back full, up to 16).
    #[arg(long, env = "DOVETAIL_INTERRUPTION_CONSUMERS")]
    pub interruption_consumers: Option<usize>,
    /// With --interruption-queue: how long a received message stays hidden, in seconds
    /// (default 60): it is deleted once acted on, or seen again after this.
    #[arg(long, env = "DOVETAIL_INTERRUPTION_VISIBILITY")]
    pub interruption_visibility: Option<u64>,
    /// With --interruption-queue: what a spot rebalance recommendation does: `event` (an
    /// event on its NodeClaim, Karpenter's behaviour; the default) or `replace` (the node is
    /// replaced and drained, as for a scheduled change, within the NodePool's limits).
    #[arg(long, env = "DOVETAIL_INTERRUPTION_REBALANCE")]
    pub interruption_rebalance: Option<String>,
    /// With --cloud aws: how often spot prices are read again (DescribeSpotPriceHistory), in
    /// seconds (default 43200: Karpenter's 12 h). Every NodePool's types take the new prices.
    #[arg(long, env = "DOVETAIL_PRICE_REFRESH")]
    pub price_refresh: Option<u64>,
    /// With --cloud aws: how often the instance types and their offerings by zone are read
    /// again, in seconds (default 43200: Karpenter's 12 h).
    #[arg(long, env = "DOVETAIL_CATALOG_REFRESH")]
    pub catalog_refresh: Option<u64>,
    /// A settings file (YAML); flags and DOVETAIL_* variables override it.
    #[arg(long, env = "DOVETAIL_CONFIG")]
    pub config: Option<PathBuf>,
}

/// A settings file's `interruptionQueue`: one name (Karpenter's form) or a list.
#[derive(Clone, Debug, Deserialize)]
#[serde(untagged)]
pub enum OneOrMany {
    One(String),
    Many(Vec<String>),
}

impl OneOrMany {
    fn into_vec(self) -> Vec<String> {
        match self {
            OneOrMany::One(s) => vec![s],
            OneOrMany::Many(v) => v,
        }
    }
}

/// The file form of the settings.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FileSettings {
    pub kubeconfig: Option<PathBuf>,
    pub cloud: Option<CloudKind>,
    pub cluster_name: Option<String>,
    pub region: Option<String>,
    pub metrics_addr: Option<SocketAddr>,
    pub log_format: Option<crate::logs::LogFormat>,
    pub log_level: Option<String>,
    pub health_addr: Option<SocketAddr>,
    pub zones: Option<Vec<String>>,
    pub kube_client_qps: Option<f64>,
    pub kube_client_burst: Option<u32>,
    pub sim_registration_delay_ms: Option<u64>,
    pub aws_endpoint: Option<String>,
    pub cluster_endpoint: Option<String>,
    pub cluster_ca_bundle: Option<String>,
    pub ami_parameter_prefix: Option<String>,
    pub node_id: Option<u64>,
    pub raft_addr: Option<String>,
    pub peers: Option<Vec<String>>,
    pub data_dir: Option<PathBuf>,
    pub raft_secret_file: Option<PathBuf>,
    pub raft_tls_ca: Option<PathBuf>,
    pub raft_tls_cert: Option<PathBuf>,
    pub raft_tls_key: Option<PathBuf>,
    pub raft_heartbeat_ms: Option<u64>,
    pub raft_election_timeout_min_ms: Option<u64>,
    pub raft_election_timeout_max_ms: Option<u64>,
    pub interruption_queue: Option<OneOrMany>,
    pub interruption_consumers: Option<usize>,
    pub interruption_visibility: Option<u64>,
    pub interruption_rebalance: Option<String>,
    pub gc_interval: Option<u64>,
    pub price_refresh: Option<u64>,
    pub catalog_refresh: Option<u64>,
}

/// A replicated ledger's settings (`--peers` and the flags it needs).
#[derive(Clone, Debug, PartialEq)]
pub struct HaSettings {
    /// This node's id in the group.
    pub node_id: u64,
    /// Where this node listens for Raft messages.
    pub raft_addr: String,
    /// Every node of the group by id, with the address the others reach it at.
    pub peers: std::collections::BTreeMap<u64, String>,
    /// Where the log and snapshots are kept.
    pub data_dir: PathBuf,
    /// The file holding the group's shared secret.
    pub secret_file: PathBuf,
    /// The group's TLS material, when Raft runs over mutual TLS.
    pub tls: Option<dovetail_raft::tls::TlsFiles>,
}

/// The settings in force.
#[derive(Clone, Debug, PartialEq)]
pub struct Settings {
    pub kubeconfig: Option<PathBuf>,
    pub cloud: CloudKind,
    pub cluster_name: String,
    pub region: String,
    pub metrics_addr: SocketAddr,
    pub log_format: crate::logs::LogFormat,
    pub log_level: String,
    pub health_addr: SocketAddr,
    pub zones: Vec<String>,
    /// Whether `zones` was set (with `--cloud aws` unset zones are EC2's).
    pub zones_set: bool,
    pub kube_client_qps: f64,
    pub kube_client_burst: u32,
    pub sim_registration_delay_ms: u64,
    /// Whether `region` was set (with `--cloud aws` an unset one is the SDK's: `AWS_REGION`
    /// or the profile's).
    pub region_set: bool,
    pub aws_endpoint: Option<String>,
    pub cluster_endpoint: Option<String>,
    pub cluster_ca_bundle: Option<String>,
    pub ami_parameter_prefix: Option<String>,
    /// The replicated ledger; none for a single control node.
    pub ha: Option<HaSettings>,
    /// The Raft group's timing (with `ha`).
    pub raft: dovetail_raft::replicated::RaftSettings,
    /// The SQS queues of interruption events, by name (none: interruption handling is off).
    pub interruption_queues: Vec<String>,
    /// Long-pollers per queue to start with.
    pub interruption_consumers: usize,
    /// How long a received message stays hidden.
    pub interruption_visibility: std::time::Duration,
    pub gc_interval: std::time::Duration,
    pub rebalance: dovetail_core::interruption::Rebalance,
    /// With --cloud aws: how often spot prices, and the types and their offerings, are read
    /// again.
    pub price_refresh: std::time::Duration,
    pub catalog_refresh: std::time::Duration,
}

/// Parses `--peers` entries (`ID=HOST:PORT`) into the group, naming the entry at fault.
fn parse_peers(entries: &[String]) -> Result<std::collections::BTreeMap<u64, String>, String> {
    let mut peers = std::collections::BTreeMap::new();
    for e in entries {
        let (id, addr) = e.split_once('=').ok_or_else(|| format!("--peers: {e:?} is not ID=HOST:PORT"))?;
        let id: u64 = id.trim().parse().map_err(|_| format!("--peers: {e:?}: the id must be a number"))?;
        let addr = addr.trim();
        let port = addr.rsplit_once(':').and_then(|(host, port)| (!host.is_empty()).then_some(port));
        if port.is_none_or(|p| p.parse::<u16>().is_err()) {
            return Err(format!("--peers: {e:?}: the address must be HOST:PORT"));
        }
        if peers.insert(id, addr.to_string()).is_some() {
            return Err(format!("--peers: node {id} is listed twice"));
        }
    }
    if peers.is_empty() {
        return Err("--peers: at least one node".into());
    }
    Ok(peers)
}

impl HaSettings {
    fn resolve(args: &ControllerArgs, file: &FileSettings) -> Result<Option<HaSettings>, String> {
        let Some(entries) = args.peers.clone().or_else(|| file.peers.clone()) else {
            let stray = [
                ("--node-id", args.node_id.is_some() || file.node_id.is_some()),
                ("--raft-addr", args.raft_addr.is_some() || file.raft_addr.is_some()),
                ("--data-dir", args.data_dir.is_some() || file.data_dir.is_some()),
                ("--raft-secret-file", args.raft_secret_file.is_some() || file.raft_secret_file.is_some()),
                ("--raft-tls-ca", args.raft_tls_ca.is_some() || file.raft_tls_ca.is_some()),
                ("--raft-tls-cert", args.raft_tls_cert.is_some() || file.raft_tls_cert.is_some()),
                ("--raft-tls-key", args.raft_tls_key.is_some() || file.raft_tls_key.is_some()),
                ("--raft-heartbeat-ms", args.raft_heartbeat_ms.or(file.raft_heartbeat_ms).is_some()),
                (
                    "--raft-election-timeout-min-ms",
                    args.raft_election_timeout_min_ms.or(file.raft_election_timeout_min_ms).is_some(),
                ),
                (
                    "--raft-election-timeout-max-ms",
                    args.raft_election_timeout_max_ms.or(file.raft_election_timeout_max_ms).is_some(),
                ),
            ];
            if let Some((flag, _)) = stray.iter().find(|(_, set)| *set) {
                return Err(format!("{flag} is for a replicated ledger: set --peers too"));
            }
            return Ok(None);
        };
        let peers = parse_peers(&entries)?;
        let node_id = args.node_id.or(file.node_id).ok_or("--peers needs --node-id")?;
        if !peers.contains_key(&node_id) {
            return Err(format!("--node-id {node_id} is not in --peers ({:?})", peers.keys().collect::<Vec<_>>()));
        }
        let raft_addr = args.raft_addr.clone().or_else(|| file.raft_addr.clone()).ok_or("--peers needs --raft-addr")?;
        let data_dir = args.data_dir.clone().or_else(|| file.data_dir.clone()).ok_or("--peers needs --data-dir")?;
        let secret_file = args
            .raft_secret_file
            .clone()
            .or_else(|| file.raft_secret_file.clone())
            .ok_or("--peers needs --raft-secret-file")?;
        let ca = args.raft_tls_ca.clone().or_else(|| file.raft_tls_ca.clone());
        let cert = args.raft_tls_cert.clone().or_else(|| file.raft_tls_cert.clone());
        let key = args.raft_tls_key.clone().or_else(|| file.raft_tls_key.clone());
        let tls = match (ca, cert, key) {
            (None, None, None) => None,
            (Some(ca), Some(cert), Some(key)) => Some(dovetail_raft::tls::TlsFiles { ca, cert, key }),
            (ca, cert, key) => {
                let missing: Vec<&str> = [
                    ("--raft-tls-ca", ca.is_none()),
                    ("--raft-tls-cert", cert.is_none()),
                    ("--raft-tls-key", key.is_none()),
                ]
                .into_iter()
                .filter_map(|(flag, missing)| missing.then_some(flag))
                .collect();
                return Err(format!(
                    "Raft over TLS needs --raft-tls-ca, --raft-tls-cert and --raft-tls-key: {} missing",
                    missing.join(" and ")
                ));
            }
        };
        Ok(Some(HaSettings { node_id, raft_addr, peers, data_dir, secret_file, tls }))
    }
}

impl Settings {
    /// Flags and environment (`args`) over the file over the defaults.
    pub fn resolve(args: &ControllerArgs) -> Result<Settings, String> {
        let file = match &args.config {
            None => FileSettings::default(),
            Some(path) => {
                let text = std::fs::read_to_string(path).map_err(|e| format!("reading {}: {e}", path.display()))?;
                serde_yaml::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?
            }
        };
        let ha = HaSettings::resolve(args, &file)?;
        let raft = {
            let d = dovetail_raft::replicated::RaftSettings::default();
            let election_timeout_max_ms = args
                .raft_election_timeout_max_ms
                .or(file.raft_election_timeout_max_ms)
                .unwrap_or(d.election_timeout_max_ms);
            let r = dovetail_raft::replicated::RaftSettings {
                heartbeat_ms: args.raft_heartbeat_ms.or(file.raft_heartbeat_ms).unwrap_or(d.heartbeat_ms),
                election_timeout_min_ms: args
                    .raft_election_timeout_min_ms
                    .or(file.raft_election_timeout_min_ms)
                    .unwrap_or(d.election_timeout_min_ms),
                election_timeout_max_ms,
                // A proposal outlasts two elections (a slower timing is not refused for the
                // default of a setting it cannot set).
                propose_timeout_ms: d.propose_timeout_ms.max(election_timeout_max_ms.saturating_mul(2)),
                ..d
            };
            r.validate().map_err(|e| format!("--raft-heartbeat-ms / --raft-election-timeout-*: {e}"))?;
            r
        };
        let cloud = args.cloud.or(file.cloud).ok_or("--cloud is required (aws or sim)")?;
        let cluster_name = args.cluster_name.clone().or(file.cluster_name).ok_or("--cluster-name is required")?;
        if cluster_name.is_empty() {
            return Err("--cluster-name must not be empty".into());
        }
        let region_set = args.region.is_some() || file.region.is_some();
        let region = args.region.clone().or(file.region).unwrap_or_else(|| "us-east-1".into());
        let zones_set = args.zones.is_some() || file.zones.is_some();
        let zones = args
            .zones
            .clone()
            .or(file.zones)
            .unwrap_or_else(|| ["a", "b", "c"].iter().map(|z| format!("{region}{z}")).collect());
        if zones.is_empty() || zones.iter().any(String::is_empty) {
            return Err("--zones: at least one zone, none empty".into());
        }
        let qps = args.kube_client_qps.or(file.kube_client_qps).unwrap_or(200.0);
        if !(qps.is_finite() && qps > 0.0) {
            return Err(format!("--kube-client-qps must be positive, got {qps}"));
        }
        let burst = args.kube_client_burst.or(file.kube_client_burst).unwrap_or(300);
        if burst == 0 {
            return Err("--kube-client-burst must be at least 1".into());
        }
        let interruption_queues: Vec<String> = match args.interruption_queue.clone() {
            Some(q) => q,
            None => file.interruption_queue.map(OneOrMany::into_vec).unwrap_or_default(),
        };
        let interruption_queues = interruption_queues.into_iter().map(|q| q.trim().to_string()).collect::<Vec<_>>();
        if interruption_queues.iter().any(String::is_empty) {
            return Err("--interruption-queue: a queue name must not be empty".into());
        }
        if !interruption_queues.is_empty() && cloud != CloudKind::Aws {
            return Err("--interruption-queue reads EC2's interruption events from SQS: it needs --cloud aws".into());
        }
        let mut seen = std::collections::BTreeSet::new();
        if let Some(q) = interruption_queues.iter().find(|q| !seen.insert(q.as_str())) {
            return Err(format!("--interruption-queue: {q} is listed twice"));
        }
        let tuned = args.interruption_consumers.or(file.interruption_consumers).is_some()
            || args.interruption_visibility.or(file.interruption_visibility).is_some()
            || args.interruption_rebalance.is_some()
            || file.interruption_rebalance.is_some();
        if tuned && interruption_queues.is_empty() {
            return Err("--interruption-consumers, --interruption-visibility and --interruption-rebalance tune \
                 --interruption-queue: set a queue"
                .into());
        }
        let defaults = dovetail_actors::config::InterruptionConfig::default();
        let interruption_consumers =
            args.interruption_consumers.or(file.interruption_consumers).unwrap_or(defaults.consumers);
        if interruption_consumers == 0 || interruption_consumers > defaults.max_consumers {
            return Err(format!(
                "--interruption-consumers must be 1 to {}, got {interruption_consumers}",
                defaults.max_consumers
            ));
        }
        let visibility = args.interruption_visibility.or(file.interruption_visibility);
        let interruption_visibility = visibility.map_or(defaults.visibility, std::time::Duration::from_secs);
        // SQS takes 0 s to 12 h; under the retry pause a failed run's messages would come back
        // before they were handed back.
        if let Some(v) = visibility
            && !(defaults.retry.as_secs()..=43_200).contains(&v)
        {
            return Err(format!(
                "--interruption-visibility must be {} to 43200 seconds, got {v}",
                defaults.retry.as_secs()
            ));
        }
        let rebalance = match args.interruption_rebalance.clone().or(file.interruption_rebalance) {
            None => dovetail_core::interruption::Rebalance::default(),
            Some(r) => dovetail_core::interruption::Rebalance::parse(&r)
                .ok_or_else(|| format!("--interruption-rebalance must be event or replace, got {r:?}"))?,
        };
        let addr = |s: &str| s.parse::<SocketAddr>().map_err(|e| e.to_string());
        let refresh = |flag: &str, v: Option<u64>| match v.unwrap_or(43_200) {
            0 => Err(format!("{flag} must be at least 1 second")),
            n => Ok(std::time::Duration::from_secs(n)),
        };
        let price_refresh = refresh("--price-refresh", args.price_refresh.or(file.price_refresh))?;
        let catalog_refresh = refresh("--catalog-refresh", args.catalog_refresh.or(file.catalog_refresh))?;
        Ok(Settings {
            kubeconfig: args.kubeconfig.clone().or(file.kubeconfig),
            cloud,
            cluster_name,
            region,
            metrics_addr: args.metrics_addr.or(file.metrics_addr).map_or_else(|| addr("0.0.0.0:8080"), Ok)?,
            log_format: args.log_format.or(file.log_format).unwrap_or_default(),
            gc_interval: match args.gc_interval.or(file.gc_interval).unwrap_or(120) {
                0 => return Err("--gc-interval must be at least 1 second".into()),
                n => std::time::Duration::from_secs(n),
            },
            log_level: args.log_level.clone().or(file.log_level).unwrap_or_else(|| "info".to_string()),
            health_addr: args.health_addr.or(file.health_addr).map_or_else(|| addr("0.0.0.0:8081"), Ok)?,
            zones,
            zones_set,
            kube_client_qps: qps,
            kube_client_burst: burst,
            sim_registration_delay_ms: args.sim_registration_delay_ms.or(file.sim_registration_delay_ms).unwrap_or(0),
            region_set,
            aws_endpoint: args.aws_endpoint.clone().or(file.aws_endpoint),
            cluster_endpoint: args.cluster_endpoint.clone().or(file.cluster_endpoint),
            cluster_ca_bundle: args.cluster_ca_bundle.clone().or(file.cluster_ca_bundle),
            ami_parameter_prefix: args.ami_parameter_prefix.clone().or(file.ami_parameter_prefix),
            ha,
            raft,
            interruption_queues,
            interruption_consumers,
            interruption_visibility,
            rebalance,
            price_refresh,
            catalog_refresh,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_override_the_file_and_the_file_the_defaults() {
        let dir = std::env::temp_dir().join(format!("dovetail-settings-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let path = dir.join("settings.yaml");
        std::fs::write(&path, "cloud: sim\nclusterName: from-file\nregion: eu-west-1\nkubeClientQps: 50\n")
            .expect("write");
        let args = ControllerArgs {
            cluster_name: Some("from-flag".into()),
            config: Some(path.clone()),
            ..ControllerArgs::default()
        };
        let s = Settings::resolve(&args).expect("valid");
        assert_eq!(s.cloud, CloudKind::Sim);
        assert_eq!(s.cluster_name, "from-flag");
        assert_eq!(s.region, "eu-west-1");
        assert_eq!(s.zones, vec!["eu-west-1a", "eu-west-1b", "eu-west-1c"]);
        assert_eq!(s.kube_client_qps, 50.0);
        assert_eq!(s.kube_client_burst, 300);
        std::fs::write(&path, "cloud: sim\nclusterName: x\nqps: 5\n").expect("write");
        let err = Settings::resolve(&ControllerArgs { config: Some(path), ..ControllerArgs::default() })
            .expect_err("unknown key");
        assert!(err.contains("qps"), "{err}");
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn a_replicated_ledger_needs_its_flags_and_names_what_is_wrong() {
        let base =
            ControllerArgs { cloud: Some(CloudKind::Sim), cluster_name: Some("c".into()), ..ControllerArgs::default() };
        assert_eq!(Settings::resolve(&base).expect("single node").ha, None);
        let peers = Some(vec!["1=127.0.0.1:7001".to_string(), "2=10.0.0.2:7001".into(), "3=ctl-3.ctl:7001".into()]);
        let full = ControllerArgs {
            node_id: Some(2),
            raft_addr: Some("0.0.0.0:7001".into()),
            peers: peers.clone(),
            data_dir: Some("/var/lib/dovetail".into()),
            raft_secret_file: Some("/etc/dovetail/secret".into()),
            ..base.clone()
        };
        let ha = Settings::resolve(&full).expect("valid").ha.expect("replicated");
        assert_eq!(ha.node_id, 2);
        assert_eq!(ha.peers.len(), 3);
        assert_eq!(ha.peers[&3], "ctl-3.ctl:7001");
        let err = |args: ControllerArgs| Settings::resolve(&args).expect_err("invalid");
        assert!(err(ControllerArgs { node_id: None, ..full.clone() }).contains("--node-id"));
        assert!(err(ControllerArgs { node_id: Some(4), ..full.clone() }).contains("not in --peers"));
        assert!(err(ControllerArgs { data_dir: None, ..full.clone() }).contains("--data-dir"));
        assert!(err(ControllerArgs { raft_secret_file: None, ..full.clone() }).contains("--raft-secret-file"));
        let bad = |p: &str| err(ControllerArgs { peers: Some(vec![p.to_string()]), node_id: Some(1), ..full.clone() });
        assert!(bad("1").contains("ID=HOST:PORT"));
        assert!(bad("x=127.0.0.1:1").contains("number"));
        assert!(bad("1=127.0.0.1").contains("HOST:PORT"));
        let twice =
            ControllerArgs { peers: Some(vec!["1=a:1".into(), "1=b:2".into()]), node_id: Some(1), ..full.clone() };
        assert!(err(twice).contains("listed twice"));
        assert!(err(ControllerArgs { data_dir: Some("/d".into()), ..base }).contains("set --peers too"));
    }

    /// Every overlay's settings file is valid as shipped (the `ha` one with the node id its
    /// pod gets from the downward API).
    #[test]
    fn the_shipped_settings_files_resolve() {
        let dir = std::env::temp_dir().join(format!("dovetail-overlays-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        for (name, text) in [
            ("base", include_str!("../../deploy/base/settings.yaml")),
            ("sim", include_str!("../../deploy/overlays/sim/settings.yaml")),
            ("aws", include_str!("../../deploy/overlays/aws/settings.yaml")),
            ("ha", include_str!("../../deploy/overlays/ha/settings.yaml")),
        ] {
            let path = dir.join(format!("{name}.yaml"));
            std::fs::write(&path, text).expect("write");
            let node_id = (name == "ha").then_some(2);
            let args = ControllerArgs { config: Some(path), node_id, ..ControllerArgs::default() };
            let s = Settings::resolve(&args).unwrap_or_else(|e| panic!("{name}: {e}"));
            if name == "ha" {
                let ha = s.ha.expect("replicated");
                assert_eq!(ha.peers.keys().copied().collect::<Vec<_>>(), vec![0, 1, 2]);
                assert_eq!(ha.peers[&2], "dovetail-2.dovetail-raft.dovetail.svc:7000");
                assert_eq!(ha.raft_addr, "0.0.0.0:7000");
            } else {
                assert_eq!(s.ha, None, "{name}");
            }
        }
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn interruption_queues_come_from_flags_or_the_file_and_need_aws() {
        let dir = std::env::temp_dir().join(format!("dovetail-queues-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let path = dir.join("settings.yaml");
        let aws =
            ControllerArgs { cloud: Some(CloudKind::Aws), cluster_name: Some("c".into()), ..ControllerArgs::default() };
        assert!(Settings::resolve(&aws).expect("valid").interruption_queues.is_empty(), "off by default");
        // Karpenter's form: one name.
        std::fs::write(&path, "interruptionQueue: c-interruptions\n").expect("write");
        let from_file = ControllerArgs { config: Some(path.clone()), ..aws.clone() };
        assert_eq!(Settings::resolve(&from_file).expect("valid").interruption_queues, vec!["c-interruptions"]);
        std::fs::write(&path, "interruptionQueue: [q-1, q-2]\n").expect("write");
        assert_eq!(Settings::resolve(&from_file).expect("valid").interruption_queues, vec!["q-1", "q-2"]);
        // Flags over the file.
        let flags = ControllerArgs { interruption_queue: Some(vec!["q-3".into()]), ..from_file.clone() };
        assert_eq!(Settings::resolve(&flags).expect("valid").interruption_queues, vec!["q-3"]);
        let err = |args: ControllerArgs| Settings::resolve(&args).expect_err("invalid");
        let sim = ControllerArgs { cloud: Some(CloudKind::Sim), ..flags.clone() };
        assert!(err(sim).contains("--cloud aws"));
        let empty = ControllerArgs { interruption_queue: Some(vec!["q".into(), " ".into()]), ..aws.clone() };
        assert!(err(empty).contains("must not be empty"));
        let twice = ControllerArgs { interruption_queue: Some(vec!["q".into(), "q".into()]), ..aws.clone() };
        assert!(err(twice).contains("listed twice"));
        // The consumers, the visibility timeout and the rebalance action: defaults, the file,
        // flags over the file, and what cannot work named.
        let d = Settings::resolve(&aws).expect("valid");
        let defaults = dovetail_actors::config::InterruptionConfig::default();
        assert_eq!((d.interruption_consumers, d.interruption_visibility), (defaults.consumers, defaults.visibility));
        assert_eq!(d.rebalance, dovetail_core::interruption::Rebalance::Event, "Karpenter's behaviour by default");
        std::fs::write(
            &path,
            "interruptionQueue: q\ninterruptionConsumers: 4\ninterruptionVisibility: 90\ninterruptionRebalance: replace\n",
        )
        .expect("write");
        let f = Settings::resolve(&from_file).expect("valid");
        assert_eq!((f.interruption_consumers, f.interruption_visibility.as_secs()), (4, 90));
        assert_eq!(f.rebalance, dovetail_core::interruption::Rebalance::Replace);
        let flags = ControllerArgs { interruption_consumers: Some(3), interruption_visibility: Some(30), ..from_file };
        let f = Settings::resolve(&flags).expect("valid");
        assert_eq!((f.interruption_consumers, f.interruption_visibility.as_secs()), (3, 30));
        let no_queue = ControllerArgs { interruption_rebalance: Some("replace".into()), ..aws.clone() };
        assert!(err(no_queue).contains("set a queue"));
        let aws = ControllerArgs { interruption_queue: Some(vec!["q".into()]), ..aws };
        let none = ControllerArgs { interruption_consumers: Some(0), ..aws.clone() };
        assert!(err(none).contains("--interruption-consumers"));
        let short = ControllerArgs { interruption_visibility: Some(1), ..aws.clone() };
        assert!(err(short).contains("--interruption-visibility"));
        let odd = ControllerArgs { interruption_rebalance: Some("ignore".into()), ..aws };
        assert!(err(odd).contains("event or replace"));
        std::fs::remove_dir_all(&dir).ok();
    }

    /// Raft's timing is a setting, checked: an election timeout shorter than three heartbeats,
    /// or a longest one not longer than the shortest, is refused naming the flags; half the TLS
    /// files is refused naming the missing ones; every one of these needs --peers.
    #[test]
    fn raft_timing_and_tls_are_settings_checked_and_named() {
        let ha = ControllerArgs {
            cloud: Some(CloudKind::Sim),
            cluster_name: Some("c".into()),
            node_id: Some(1),
            raft_addr: Some("127.0.0.1:7101".into()),
            peers: Some(vec!["1=127.0.0.1:7101".into()]),
            data_dir: Some("/tmp/ledger".into()),
            raft_secret_file: Some("/tmp/secret".into()),
            ..ControllerArgs::default()
        };
        let s = Settings::resolve(&ha).expect("valid");
        assert_eq!(s.raft, dovetail_raft::replicated::RaftSettings::default());
        let slow = ControllerArgs {
            raft_heartbeat_ms: Some(100),
            raft_election_timeout_min_ms: Some(1_000),
            raft_election_timeout_max_ms: Some(2_000),
            ..ha.clone()
        };
        let s = Settings::resolve(&slow).expect("valid");
        assert_eq!(
            (s.raft.heartbeat_ms, s.raft.election_timeout_min_ms, s.raft.election_timeout_max_ms),
            (100, 1_000, 2_000)
        );
        // Elections slower than the proposal's default timeout: the proposals wait longer.
        let slower = ControllerArgs {
            raft_heartbeat_ms: Some(1_000),
            raft_election_timeout_min_ms: Some(4_000),
            raft_election_timeout_max_ms: Some(8_000),
            ..ha.clone()
        };
        assert_eq!(Settings::resolve(&slower).expect("valid").raft.propose_timeout_ms, 16_000);
        let err = |args: ControllerArgs| Settings::resolve(&args).expect_err("invalid");
        let tight = ControllerArgs { raft_heartbeat_ms: Some(100), ..ha.clone() };
        let e = err(tight);
        assert!(e.contains("--raft-heartbeat-ms") && e.contains("three heartbeats"), "{e}");
        let inverted = ControllerArgs { raft_election_timeout_max_ms: Some(150), ..ha.clone() };
        assert!(err(inverted).contains("longer than the shortest"));
        let half = ControllerArgs { raft_tls_ca: Some("/tmp/ca.pem".into()), ..ha.clone() };
        let e = err(half);
        assert!(e.contains("--raft-tls-cert and --raft-tls-key missing"), "{e}");
        let whole = ControllerArgs {
            raft_tls_ca: Some("/tmp/ca.pem".into()),
            raft_tls_cert: Some("/tmp/node.pem".into()),
            raft_tls_key: Some("/tmp/node.key".into()),
            ..ha.clone()
        };
        let tls = Settings::resolve(&whole).expect("valid").ha.and_then(|h| h.tls).expect("tls files");
        assert_eq!(tls.key, std::path::PathBuf::from("/tmp/node.key"));
        let alone = ControllerArgs {
            peers: None,
            node_id: None,
            raft_addr: None,
            data_dir: None,
            raft_secret_file: None,
            ..slow
        };
        assert!(err(alone).contains("set --peers too"));
    }

    #[test]
    fn a_missing_cloud_or_cluster_name_is_named() {
        let err = Settings::resolve(&ControllerArgs::default()).expect_err("no cloud");
        assert!(err.contains("--cloud"), "{err}");
        let args = ControllerArgs { cloud: Some(CloudKind::Sim), ..ControllerArgs::default() };
        assert!(Settings::resolve(&args).expect_err("no name").contains("--cluster-name"));
    }
}
