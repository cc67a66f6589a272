//! `dovetail ledger ...`: one control node's view of the replicated ledger (`status`: leader,
//! term, commit and applied index, claims by state, NodePool usage against limits, ICE marks)
//! and changes of the group's members (`join`, `remove`), made on its leader.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Subcommand, ValueEnum};
use dovetail_raft::membership::{Members, MembershipRequest};

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
    /// Adds a control node to the group as a voter: it must be running (started with its
    /// --node-id, --raft-addr and --data-dir); it first receives the log as a learner, and
    /// becomes a voter once it has caught up.
    Join(JoinArgs),
    /// Removes a control node (voter or learner) from the group. Stop its process afterwards.
    Remove(RemoveArgs),
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum Output {
    Text,
    Json,
}

/// How to reach a member of the group.
#[derive(Args, Debug)]
struct Target {
    /// A member's Raft address (its --raft-addr, HOST:PORT). A change is made on the leader:
    /// a member that does not lead names it, and is asked there.
    #[arg(long)]
    addr: String,
    /// The group's shared secret (the nodes' --raft-secret-file).
    #[arg(long, env = "DOVETAIL_RAFT_SECRET_FILE")]
    raft_secret_file: PathBuf,
    /// With a group on mutual TLS: the group's CA certificate (PEM), as the nodes'.
    #[arg(long, env = "DOVETAIL_RAFT_TLS_CA", requires_all = ["raft_tls_cert", "raft_tls_key"])]
    raft_tls_ca: Option<PathBuf>,
    /// With --raft-tls-ca: a certificate of the group's CA for this command (PEM).
    #[arg(long, env = "DOVETAIL_RAFT_TLS_CERT", requires = "raft_tls_ca")]
    raft_tls_cert: Option<PathBuf>,
    /// With --raft-tls-ca: its private key (PEM).
    #[arg(long, env = "DOVETAIL_RAFT_TLS_KEY", requires = "raft_tls_ca")]
    raft_tls_key: Option<PathBuf>,
    #[arg(long, value_enum, default_value = "text")]
    output: Output,
}

#[derive(Args, Debug)]
struct StatusArgs {
    #[command(flatten)]
    target: Target,
}

#[derive(Args, Debug)]
struct JoinArgs {
    #[command(flatten)]
    target: Target,
    /// The joining node's id (its --node-id; not in use in the group).
    #[arg(long)]
    node_id: u64,
    /// Where the joining node serves Raft (its --raft-addr, HOST:PORT, as the other members
    /// reach it).
    #[arg(long, value_parser = host_port)]
    raft_addr: String,
    /// How long the joining node may take to catch up on the log, in seconds (1 to 3600).
    #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..=3600))]
    catch_up_secs: u64,
}

#[derive(Args, Debug)]
struct RemoveArgs {
    #[command(flatten)]
    target: Target,
    /// The id of the node to remove.
    #[arg(long)]
    node_id: u64,
}

/// A `HOST:PORT` address.
fn host_port(s: &str) -> Result<String, String> {
    match s.rsplit_once(':') {
        Some((host, port)) if !host.is_empty() && port.parse::<u16>().is_ok_and(|p| p > 0) => Ok(s.to_string()),
        _ => Err(format!("{s:?} is not HOST:PORT")),
    }
}

/// Runs a `ledger` subcommand.
pub fn run(args: &LedgerArgs) -> ExitCode {
    let target = match &args.command {
        LedgerCommand::Status(a) => &a.target,
        LedgerCommand::Join(a) => &a.target,
        LedgerCommand::Remove(a) => &a.target,
    };
    let secret = match std::fs::read_to_string(&target.raft_secret_file) {
        Ok(s) => s.trim().to_string(),
        Err(e) => {
            eprintln!("error: --raft-secret-file {}: {e}", target.raft_secret_file.display());
            return ExitCode::from(2);
        }
    };
    let tls = match (&target.raft_tls_ca, &target.raft_tls_cert, &target.raft_tls_key) {
        (Some(ca), Some(cert), Some(key)) => {
            let files = dovetail_raft::tls::TlsFiles { ca: ca.clone(), cert: cert.clone(), key: key.clone() };
            match dovetail_raft::tls::Tls::load(&files) {
                Ok(t) => Some(t),
                Err(e) => {
                    eprintln!("error: --raft-tls-*: {e}");
                    return ExitCode::from(2);
                }
            }
        }
        _ => None,
    };
    let client = match dovetail_raft::http::RaftClient::new(secret, tls) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("error: --raft-secret-file {}: {e}", target.raft_secret_file.display());
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
    let request = match &args.command {
        LedgerCommand::Status(_) => return rt.block_on(status(target, &client)),
        LedgerCommand::Join(a) => MembershipRequest::Join {
            id: a.node_id,
            addr: a.raft_addr.clone(),
            catch_up_ms: a.catch_up_secs.saturating_mul(1000),
        },
        LedgerCommand::Remove(a) => MembershipRequest::Remove { id: a.node_id },
    };
    // Each answer may take the catch-up and three commits (finishing a change left half-way,
    // adding the learner, making it a voter), plus asking the voters whether they answer.
    let wait = match &request {
        MembershipRequest::Join { catch_up_ms, .. } => Duration::from_millis(*catch_up_ms),
        MembershipRequest::Remove { .. } => Duration::ZERO,
    } + dovetail_raft::membership::COMMIT_TIMEOUT * 3
        + Duration::from_secs(30);
    match rt.block_on(dovetail_raft::http::change_membership(&target.addr, &client, &request, wait)) {
        Ok(members) => print_out(target.output, &members, || render(&request, &members)),
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn status(target: &Target, client: &dovetail_raft::http::RaftClient) -> ExitCode {
    match dovetail_raft::http::fetch_status(&target.addr, client, Duration::from_secs(10)).await {
        Ok(status) => print_out(target.output, &status, || status.render()),
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn print_out<T: serde::Serialize>(output: Output, value: &T, text: impl FnOnce() -> String) -> ExitCode {
    match output {
        Output::Text => print!("{}", text()),
        Output::Json => match serde_json::to_string_pretty(value) {
            Ok(j) => println!("{j}"),
            Err(e) => {
                eprintln!("error: encoding the answer: {e}");
                return ExitCode::FAILURE;
            }
        },
    }
    ExitCode::SUCCESS
}

fn render(request: &MembershipRequest, m: &Members) -> String {
    let what = match (request, m.changed) {
        (MembershipRequest::Join { id, .. }, true) => format!("node {id} joined the group as a voter"),
        (MembershipRequest::Join { id, .. }, false) => format!("node {id} was a voter already"),
        (MembershipRequest::Remove { id }, true) => format!("node {id} was removed from the group"),
        (MembershipRequest::Remove { id }, false) => format!("node {id} was not a member"),
    };
    let list = |nodes: &std::collections::BTreeMap<u64, String>| {
        if nodes.is_empty() {
            "none".to_string()
        } else {
            nodes.iter().map(|(id, a)| format!("{id}={a}")).collect::<Vec<_>>().join(", ")
        }
    };
    format!("{what} (by leader {})\nvoters: {}\nlearners: {}\n", m.leader, list(&m.voters), list(&m.learners))
}
