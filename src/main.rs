//! The `dovetail` binary: the only composition root. It parses flags, reads files and the
//! clock, and wires the library crates together.

// The composition root is where the wall clock and the environment are read (clippy.toml bans
// both everywhere else).
#![allow(clippy::disallowed_methods)]

mod bench_input;
mod configdoc;
mod controller;
mod crdgen;
mod explain;
mod ledger;
mod loadtest;
mod logs;
mod plan;
mod simulate;
mod telemetry;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// The scheduler allocates many small requirement sets; mimalloc handles that pattern far
/// better than the system allocator (see docs/benchmarks.md).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// dovetail: a Kubernetes node autoscaler that speaks Karpenter's API.
#[derive(Parser)]
#[command(name = "dovetail", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    #[command(flatten)]
    telemetry: telemetry::TelemetryArgs,
}

#[derive(Subcommand)]
enum Command {
    /// Plans capacity for the pods in Kubernetes YAML (offline what-if).
    Plan(plan::PlanArgs),
    /// Writes a benchmark workload (or a trace) as plan YAML.
    BenchInput(bench_input::BenchInputArgs),
    /// Runs the whole control plane against the sim cloud and cluster on a scenario.
    Simulate(simulate::SimulateArgs),
    /// Runs a scenario on the wall clock and checks its thresholds (non-zero exit on a miss).
    Loadtest(loadtest::LoadtestArgs),
    /// Runs the control plane against a Kubernetes cluster.
    Controller(Box<controller::ControllerArgs>),
    /// Writes the CRDs (NodePool, NodeClaim, EC2NodeClass) as YAML.
    Crdgen(crdgen::CrdgenArgs),
    /// Says why a node is (or is not) being disrupted (`explain node NAME --disruption FILE`:
    /// offline, on a `plan` input).
    Explain(explain::ExplainArgs),
    /// Reads the replicated ledger of a control node (`ledger status`) and changes the
    /// group's members (`ledger join`, `ledger remove`).
    Ledger(ledger::LedgerArgs),
    /// Test tool: plays the kubelets of `--cloud aws` instances that are not real machines
    /// (moto), registering a Ready Node for each, like kwok. Takes the controller's flags.
    #[command(hide = true)]
    NodeAgent(Box<controller::ControllerArgs>),
    /// Prints docs/configuration.md: every flag, environment variable, settings-file key,
    /// label and annotation, from the CLI's definitions.
    #[command(hide = true)]
    ConfigDoc,
}

fn main() -> ExitCode {
    if let Err(e) = dovetail_actors::memory_settings() {
        eprintln!("warning: transparent huge pages stay on (prctl: {e}); peak RSS may be higher");
    }
    let Cli { command, telemetry: otel } = Cli::parse();
    // The commands that log install their subscriber once their settings are read.
    let command = match command {
        Command::Controller(args) => return controller::run(&args, &otel),
        Command::NodeAgent(args) => return controller::agent::run(&args, &otel),
        other => other,
    };
    // The others log only when asked (`RUST_LOG`), as text to stderr: their output is the
    // report.
    let asked = std::env::var("RUST_LOG").is_ok_and(|v| !v.is_empty());
    let logs = asked.then(|| logs::Logs { format: logs::LogFormat::Text, level: "warn".into() });
    let telemetry = match telemetry::install(&otel, logs.as_ref(), None) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    let code = match command {
        Command::Plan(args) => plan::run(&args),
        Command::BenchInput(args) => bench_input::run(&args),
        Command::Simulate(args) => simulate::run(&args),
        Command::Loadtest(args) => loadtest::run(&args),
        Command::Crdgen(args) => crdgen::run(&args),
        Command::Explain(args) => {
            use dovetail_core::clock::Clock;
            explain::run(&args, dovetail_core::clock::SystemClock.now_millis())
        }
        Command::Ledger(args) => ledger::run(&args),
        Command::ConfigDoc => {
            print!("{}", configdoc::render());
            ExitCode::SUCCESS
        }
        // Returned above, each with its own subscriber.
        Command::Controller(_) | Command::NodeAgent(_) => ExitCode::SUCCESS,
    };
    // Spans still queued are exported before the process ends.
    if let Some(t) = telemetry {
        t.shutdown();
    }
    code
}
