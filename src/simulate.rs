//! `dovetail simulate`: the whole control plane against the sim cloud and sim cluster on a
//! scenario (the built-in one by default), on virtual time unless `--realtime`.

use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use dovetail_loadtest::{Progress, RunOptions, Sample, Scenario};

#[derive(clap::Args)]
pub struct SimulateArgs {
    /// A scenario file (YAML; see docs/scenarios.md). The built-in scenario when absent.
    #[arg(long, short = 's')]
    pub scenario: Option<PathBuf>,
    /// Pace the run by the wall clock instead of virtual time.
    #[arg(long)]
    pub realtime: bool,
    /// Directory for report.json and plot.svg.
    #[arg(long, default_value = "dovetail-simulate")]
    pub out: PathBuf,
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
        let _ = if self.tty { write!(err, "\r{line}") } else { writeln!(err, "{line}") };
        let _ = err.flush();
    }
}

pub fn run(args: &SimulateArgs) -> ExitCode {
    let scenario = match &args.scenario {
        None => Scenario::builtin(),
        Some(path) => match std::fs::read_to_string(path) {
            Ok(text) => Scenario::parse(&text),
            Err(e) => {
                eprintln!("error: reading {}: {e}", path.display());
                return ExitCode::from(2);
            }
        },
    };
    let scenario = match scenario {
        Ok(s) => s,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    let opts = RunOptions { realtime: args.realtime };
    let mut status = Status { tty: std::io::stderr().is_terminal() };
    let sys = actix_rt::System::new();
    let report = sys.block_on(async { dovetail_loadtest::run(&scenario, &opts, &mut status).await });
    if status.tty {
        eprintln!();
    }
    let report = match report {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    let written = match report.write(&args.out) {
        Ok(w) => Some(w),
        Err(e) => {
            eprintln!("error: writing the report to {}: {e}", args.out.display());
            None
        }
    };
    print!("{}", report.text(written.as_ref()));
    if written.is_some() { ExitCode::SUCCESS } else { ExitCode::FAILURE }
}
