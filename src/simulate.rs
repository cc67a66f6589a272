//! `dovetail simulate`: the whole control plane against the sim cloud and sim cluster on a
//! scenario (the built-in one by default), on virtual time unless `--realtime`.

use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use dovetail_core::clock::SystemClock;
use dovetail_loadtest::ha::ControlNodes;
use dovetail_loadtest::{Progress, Report, RunOptions, Sample, Scenario};

#[derive(clap::Args)]
pub struct SimulateArgs {
    /// A scenario file (YAML; see docs/scenarios.md). The built-in scenario when absent.
    #[arg(long, short = 's')]
    pub scenario: Option<PathBuf>,
    /// Pace the run by the wall clock instead of virtual time.
    #[arg(long)]
    pub realtime: bool,
    /// Replays a trace CSV (the normalized schema of the shared traces) instead of a scenario:
    /// each row a pod arriving and departing at its times.
    #[arg(long, conflicts_with = "scenario", requires = "nodepools")]
    pub trace: Option<PathBuf>,
    /// With --trace: the NodePools (and EC2NodeClasses) to provision with, as Kubernetes YAML.
    #[arg(long)]
    pub nodepools: Option<PathBuf>,
    /// With --trace: every pod pending at once, none departing.
    #[arg(long, requires = "trace")]
    pub batch: bool,
    /// With --trace: the zones.
    #[arg(long, value_delimiter = ',', default_value = "us-east-1a,us-east-1b,us-east-1c")]
    pub zones: Vec<String>,
    /// The Router's batch window, instead of the scenario's.
    #[arg(long, value_enum)]
    pub window: Option<Window>,
    /// Directory for report.json and plot.svg.
    #[arg(long, default_value = "dovetail-simulate")]
    pub out: PathBuf,
    /// Serve the plane's Prometheus metrics at http://ADDR/metrics while the run lasts (the
    /// controller's series, on the simulated cluster).
    #[arg(long, value_name = "ADDR")]
    pub metrics_addr: Option<std::net::SocketAddr>,
    /// Replicates the ledger over this many control nodes in this process (Raft over an
    /// in-memory network, on the run's clock); the report shows each failover.
    #[arg(long, default_value_t = 1)]
    pub control_nodes: usize,
    /// With --control-nodes 3 or more: kills the leader this often (a duration such as
    /// `60s`); a killed node comes back from its stores 10 s later.
    #[arg(long)]
    pub kill_leader_every: Option<String>,
    /// With --control-nodes: the chance that a Raft message (or its reply) is lost, 0 to 0.5.
    #[arg(long, default_value_t = 0.0)]
    pub raft_loss: f64,
    /// With --control-nodes: each Raft message waits a random time up to this before
    /// delivery (a duration such as `20ms`), so messages reorder.
    #[arg(long)]
    pub raft_max_delay: Option<String>,
}

/// The Router's batch window.
#[derive(clap::ValueEnum, Clone, Copy, Debug)]
pub enum Window {
    /// Karpenter's: closes after 1 s without a new pod, or 10 s after it opened.
    Default,
    /// Also closes 50 ms after the last pod while at most 10 wait.
    Adaptive,
}

/// Sets the scenario's batch window from the flag, when given.
pub fn with_window(mut scenario: Scenario, window: Option<Window>) -> Scenario {
    use dovetail_core::plane::{Adaptive, BatchWindow};
    match window {
        None => {}
        Some(Window::Default) => scenario.window = BatchWindow::default(),
        Some(Window::Adaptive) => {
            scenario.window =
                BatchWindow { adaptive: Some(Adaptive { short_queue: 10, short_idle: 50 }), ..BatchWindow::default() }
        }
    }
    scenario
}

/// A live status line on a terminal, plain lines otherwise (stderr).
struct Status {
    tty: bool,
}

impl Progress for Status {
    fn sample(&mut self, sc: &Scenario, s: &Sample) {
        let line = format!(
            "[{:>5.1} h / {:.1} h] nodes {:>5}  pending {:>6}  bound {:>6}  {:>8.2} $/h",
            s.at_ms as f64 / 3.6e6,
            sc.duration as f64 / 3.6e6,
            s.nodes,
            s.pending,
            s.bound,
            s.price_per_hour
        );
        let mut err = std::io::stderr().lock();
        // Progress only: a stderr that cannot be written to (closed) loses the line, and the
        // report at the end says it all.
        let written = if self.tty { write!(err, "\r{line}") } else { writeln!(err, "{line}") };
        if let Err(e) = written.and_then(|()| err.flush()) {
            tracing::debug!(error = %e, "progress line not written to stderr");
        }
    }
}

/// Reads a scenario file, or the named built-in one, or the default.
pub fn load(file: Option<&PathBuf>, builtin: Option<&str>) -> Result<Scenario, String> {
    match (file, builtin) {
        (Some(path), _) => {
            let text = std::fs::read_to_string(path).map_err(|e| format!("reading {}: {e}", path.display()))?;
            Scenario::parse(&text).map_err(|e| e.to_string())
        }
        (None, Some(name)) => {
            let text = dovetail_loadtest::scenario::builtin_named(name).ok_or_else(|| {
                let names: Vec<&str> = dovetail_loadtest::scenario::BUILTIN.iter().map(|(n, _)| *n).collect();
                format!("no built-in scenario {name:?} (there are: {})", names.join(", "))
            })?;
            Scenario::parse(text).map_err(|e| e.to_string())
        }
        (None, None) => Scenario::builtin().map_err(|e| e.to_string()),
    }
}

/// Runs a scenario with progress on stderr, writes the report into `out` and prints it.
pub fn execute(
    scenario: &Scenario,
    realtime: bool,
    control: Option<ControlNodes>,
    out: &std::path::Path,
    metrics_addr: Option<std::net::SocketAddr>,
) -> Result<Report, ExitCode> {
    let opts = RunOptions { realtime, wall: Some(Arc::new(SystemClock)), control, ..RunOptions::default() };
    execute_with(scenario, opts, None, out, metrics_addr)
}

/// [`execute`] with every option; with `sqs_endpoint` (moto's), the interruption events go
/// through a new SQS queue there; with `metrics_addr`, the plane's metrics are served there
/// while the run lasts.
pub fn execute_with(
    scenario: &Scenario,
    mut opts: RunOptions,
    sqs_endpoint: Option<&str>,
    out: &std::path::Path,
    metrics_addr: Option<std::net::SocketAddr>,
) -> Result<Report, ExitCode> {
    let mut status = Status { tty: std::io::stderr().is_terminal() };
    let sys = dovetail_actors::system().map_err(|e| {
        eprintln!("error: cannot start the runtime: {e}");
        ExitCode::FAILURE
    })?;
    let report = sys.block_on(async {
        if let Some(endpoint) = sqs_endpoint {
            let queue = sqs_queue(endpoint).await.map_err(|e| {
                eprintln!("error: --sqs-endpoint {endpoint}: {e}");
                ExitCode::FAILURE
            })?;
            eprintln!("interruption events through {}", queue.url());
            opts.sqs = Some(Arc::new(queue));
        }
        if let Some(addr) = metrics_addr {
            let metrics = Arc::new(dovetail_actors::metrics::Metrics::new());
            crate::controller::http::serve_plane_metrics(addr, metrics.clone()).await.map_err(|e| {
                eprintln!("error: --metrics-addr: {e}");
                ExitCode::from(2)
            })?;
            eprintln!("metrics on http://{addr}/metrics");
            opts.metrics = Some(metrics);
        }
        Ok::<_, ExitCode>(dovetail_loadtest::run(scenario, &opts, &mut status).await)
    })?;
    if status.tty {
        eprintln!();
    }
    let report = report.map_err(|e| {
        eprintln!("error: {e}");
        ExitCode::FAILURE
    })?;
    let written = report.write(out).map_err(|e| eprintln!("error: writing the report to {}: {e}", out.display())).ok();
    print!("{}", report.text(written.as_ref()));
    if written.is_none() {
        return Err(ExitCode::FAILURE);
    }
    Ok(report)
}

/// A new queue on the SQS at `endpoint` (moto's: any credentials), its receives hiding
/// messages for 60 s.
async fn sqs_queue(endpoint: &str) -> Result<dovetail_cloud::aws::SqsQueue, String> {
    use dovetail_cloud::aws::{AwsConfig, SqsQueue, StaticCredentials, sdk_config};
    let cfg = AwsConfig {
        region: Some("us-east-1".into()),
        endpoint: Some(endpoint.to_string()),
        credentials: Some(StaticCredentials { access_key_id: "testing".into(), secret_access_key: "testing".into() }),
        ..AwsConfig::default()
    };
    let sdk = sdk_config(&cfg).await;
    let name = format!("dovetail-loadtest-{}", std::process::id());
    let queue = SqsQueue::create(&sdk, &name).await.map_err(|e| e.to_string())?;
    Ok(queue.with_visibility(std::time::Duration::from_secs(60)))
}

/// The scenario of a trace replay.
fn from_trace(args: &SimulateArgs, trace: &PathBuf) -> Result<Scenario, String> {
    let text = std::fs::read_to_string(trace).map_err(|e| format!("reading {}: {e}", trace.display()))?;
    let pods = dovetail_loadtest::trace::parse(&text).map_err(|e| format!("trace {}: {e}", trace.display()))?;
    let pools_path = args.nodepools.as_ref().ok_or("--trace needs --nodepools")?;
    let pools = std::fs::read_to_string(pools_path).map_err(|e| format!("reading {}: {e}", pools_path.display()))?;
    let name = trace.file_stem().map_or_else(|| "trace".into(), |s| s.to_string_lossy().to_string());
    dovetail_loadtest::trace::scenario(&name, &pods, &pools, args.zones.clone(), args.batch).map_err(|e| e.to_string())
}

/// The control nodes the flags ask for (none: the single in-process ledger).
fn control_nodes(args: &SimulateArgs) -> Result<Option<ControlNodes>, String> {
    let kill_every_ms = match &args.kill_leader_every {
        None => None,
        Some(d) => {
            let every = dovetail_core::nodepool::parse_duration(d)
                .map_err(|e| format!("--kill-leader-every {d:?}: {e}"))?
                .ok_or_else(|| format!("--kill-leader-every {d:?}: a duration such as 60s"))?;
            Some(u64::try_from(every.as_millis()).unwrap_or(u64::MAX))
        }
    };
    let max_delay_ms = match &args.raft_max_delay {
        None => 0,
        Some(d) => {
            let delay = dovetail_core::nodepool::parse_duration(d)
                .map_err(|e| format!("--raft-max-delay {d:?}: {e}"))?
                .ok_or_else(|| format!("--raft-max-delay {d:?}: a duration such as 20ms"))?;
            u64::try_from(delay.as_millis()).unwrap_or(u64::MAX)
        }
    };
    let faults = args.raft_loss != 0.0 || max_delay_ms > 0;
    if args.control_nodes == 1 && kill_every_ms.is_none() {
        if faults {
            return Err("--raft-loss and --raft-max-delay need --control-nodes 3 or more".into());
        }
        return Ok(None);
    }
    let shape =
        ControlNodes { loss: args.raft_loss, max_delay_ms, ..ControlNodes::new(args.control_nodes, kill_every_ms) };
    shape.check()?;
    Ok(Some(shape))
}

pub fn run(args: &SimulateArgs) -> ExitCode {
    let loaded = match &args.trace {
        Some(trace) => from_trace(args, trace),
        None => load(args.scenario.as_ref(), None),
    };
    let scenario = match loaded {
        Ok(s) => with_window(s, args.window),
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    let control = match control_nodes(args) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    match execute(&scenario, args.realtime, control, &args.out, args.metrics_addr) {
        Ok(_) => ExitCode::SUCCESS,
        Err(code) => code,
    }
}
