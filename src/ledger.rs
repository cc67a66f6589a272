//! `dovetail ledger status`: one control node's view of the replicated ledger (leader, term,
//! commit and applied index, claims by state, NodePool usage against limits, ICE marks).

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Subcommand, ValueEnum};

/// `dovetail ledger ...`.
#[derive(Args, Debug)]
pub struct LedgerArgs {
    #[command(subcommand)]
    command: LedgerCommand,
}

#[derive(Subcommand, Debug)]
enum LedgerCommand {
    /// Prints a control node's view: leader, term, commit and applied index, claims by state,
    /// NodePool usage and limits, spend and ICE marks in use.
    Status(StatusArgs),
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum Output {
    Text,
    Json,
}

#[derive(Args, Debug)]
struct StatusArgs {
    /// The node's Raft address (its --raft-addr, HOST:PORT).
    #[arg(long)]
    addr: String,
    /// The group's shared secret (the nodes' --raft-secret-file).
    #[arg(long, env = "DOVETAIL_RAFT_SECRET_FILE")]
    raft_secret_file: PathBuf,
    #[arg(long, value_enum, default_value = "text")]
    output: Output,
}

/// Runs a `ledger` subcommand.
pub fn run(args: &LedgerArgs) -> ExitCode {
    let LedgerCommand::Status(a) = &args.command;
    let secret = match std::fs::read_to_string(&a.raft_secret_file) {
        Ok(s) => s.trim().to_string(),
        Err(e) => {
            eprintln!("error: --raft-secret-file {}: {e}", a.raft_secret_file.display());
            return ExitCode::from(2);
        }
    };
    let rt = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(dovetail_raft::http::fetch_status(&a.addr, &secret, Duration::from_secs(10))) {
        Ok(status) => {
            match a.output {
                Output::Text => print!("{}", status.render()),
                Output::Json => match serde_json::to_string_pretty(&status) {
                    Ok(j) => println!("{j}"),
                    Err(e) => {
                        eprintln!("error: encoding the status: {e}");
                        return ExitCode::FAILURE;
                    }
                },
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
