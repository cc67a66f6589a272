//! `dovetail loadtest`: a scenario on the wall clock, at scale, checked against the thresholds
//! it declares; the exit status is non-zero when one is missed.

use std::path::PathBuf;
use std::process::ExitCode;

use crate::simulate;

#[derive(clap::Args)]
pub struct LoadtestArgs {
    /// A scenario file (YAML; see docs/scenarios.md).
    #[arg(long, short = 's', conflicts_with = "builtin")]
    pub scenario: Option<PathBuf>,
    /// A shipped scenario: ci, small, default, 1k-nodes, 10k-nodes, spot-storm, churn, churn-rate,
    /// interruption-burst, interruption-paced, interruption-storm, soak (a simulated week on
    /// virtual time), soak-ci, ha-churn (100,000 pods churning on three control nodes).
    #[arg(long, default_value = "ci")]
    pub builtin: String,
    /// Directory for report.json and plot.svg.
    #[arg(long, default_value = "dovetail-loadtest")]
    pub out: PathBuf,
    /// The Router's batch window, instead of the scenario's.
    #[arg(long, value_enum)]
    pub window: Option<simulate::Window>,
    /// An SQS endpoint (moto's server, e.g. http://127.0.0.1:5000): the sim's interruption
    /// events are sent to a new queue there and consumed from it, over aws-sdk-sqs.
    #[arg(long)]
    pub sqs_endpoint: Option<String>,
    /// Serve the plane's Prometheus metrics at http://ADDR/metrics while the run lasts.
    #[arg(long, value_name = "ADDR")]
    pub metrics_addr: Option<std::net::SocketAddr>,
}

pub fn run(args: &LoadtestArgs) -> ExitCode {
    let scenario = match simulate::load(args.scenario.as_ref(), Some(&args.builtin)) {
        Ok(s) => simulate::with_window(s, args.window),
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    let opts = dovetail_loadtest::RunOptions {
        // On the wall clock, unless the scenario is one for virtual time (a soak of a week).
        realtime: !scenario.virtual_time,
        wall: Some(std::sync::Arc::new(dovetail_core::clock::SystemClock)),
        ..Default::default()
    };
    let report =
        match simulate::execute_with(&scenario, opts, args.sqs_endpoint.as_deref(), &args.out, args.metrics_addr) {
            Ok(r) => r,
            Err(code) => return code,
        };
    let misses = report.misses(&scenario.thresholds);
    if misses.is_empty() {
        println!("thresholds       all met");
        return ExitCode::SUCCESS;
    }
    for m in &misses {
        println!("threshold missed {m}");
    }
    ExitCode::FAILURE
}
