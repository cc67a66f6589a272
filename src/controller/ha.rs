//! The controller's ledger: in memory for one control node, or replicated with Raft over
//! `--peers` (its log and snapshots under `--data-dir`, its messages on `--raft-addr`, each
//! carrying the shared secret of `--raft-secret-file`).
//!
//! A group with no log anywhere is made once, by its lowest-numbered node; a node that has
//! a log (a restart) or whose group exists (it hears a leader) does nothing of the kind.

use std::sync::Arc;

use dovetail_core::clock::Clock;
use dovetail_raft::http::{HttpServer, HttpTransport};
use dovetail_raft::network::Transport;
use dovetail_raft::replicated::{RaftLedger, RaftSettings};
use dovetail_raft::store::{LogStore, Machine};
use dovetail_raft::{InProcess, Ledger};
use openraft::storage::RaftLogStorage;

use super::settings::{HaSettings, Settings};

/// A replicated ledger and the server its peers reach it on (serving while this is held).
pub struct Raft {
    pub ledger: Arc<RaftLedger>,
    _server: HttpServer,
}

/// The ledger the settings ask for.
pub async fn ledger(s: &Settings, clock: Arc<dyn Clock>) -> Result<(Arc<dyn Ledger>, Option<Raft>), String> {
    let Some(ha) = &s.ha else {
        return Ok((Arc::new(InProcess::new()), None));
    };
    let raft = replicated(ha, clock).await?;
    Ok((raft.ledger.clone() as Arc<dyn Ledger>, Some(raft)))
}

async fn replicated(ha: &HaSettings, clock: Arc<dyn Clock>) -> Result<Raft, String> {
    let secret = std::fs::read_to_string(&ha.secret_file)
        .map_err(|e| format!("--raft-secret-file {}: {e}", ha.secret_file.display()))?;
    let secret = secret.trim().to_string();
    let mut log = LogStore::open(&ha.data_dir).map_err(|e| format!("--data-dir: {e}"))?;
    let machine = Machine::open(&ha.data_dir).map_err(|e| format!("--data-dir: {e}"))?;
    let fresh = log
        .get_log_state()
        .await
        .map_err(|e| format!("--data-dir {}: reading the log: {e}", ha.data_dir.display()))?
        .last_log_id
        .is_none();
    let transport: Arc<dyn Transport> = HttpTransport::new(secret.clone())
        .map_err(|e| format!("--raft-secret-file {}: {e}", ha.secret_file.display()))?;
    let ledger = RaftLedger::start(ha.node_id, &RaftSettings::default(), log, machine, transport, clock)
        .await
        .map_err(|e| e.to_string())?;
    let listener =
        tokio::net::TcpListener::bind(&ha.raft_addr).await.map_err(|e| format!("--raft-addr {}: {e}", ha.raft_addr))?;
    let server = HttpServer::start(listener, ledger.raft().clone(), ledger.machine().clone(), secret)
        .map_err(|e| format!("--raft-addr: {e}"))?;
    tracing::info!(node = ha.node_id, addr = %server.addr, peers = ?ha.peers, fresh, "ledger.start: raft node serving");
    let lowest = ha.peers.keys().next().copied();
    if fresh && lowest == Some(ha.node_id) {
        match ledger.initialize(ha.peers.clone()).await {
            Ok(()) => tracing::info!(node = ha.node_id, "ledger.init: the group is made"),
            // Another node's log already holds the group (this one lost its disk, or raced).
            Err(e) => tracing::info!(node = ha.node_id, error = %e, "ledger.init: not made here"),
        }
    }
    Ok(Raft { ledger: Arc::new(ledger), _server: server })
}
