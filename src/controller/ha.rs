//! The controller's ledger: in memory for one control node, or replicated with Raft over
//! `--peers` (its log and snapshots under `--data-dir`, its messages on `--raft-addr`, each
//! carrying the shared secret of `--raft-secret-file`).
//!
//! A group is made once, by its lowest-numbered node, when that node's log is empty and no
//! peer it can reach reports a group; a node that has a log (a restart) rejoins from it.
//! openraft checks only the local log before making a group, hence the question to the peers.
//! A node whose disk was lost must not come back with its id while the group runs (it would
//! have forgotten its votes): it is removed and joins again empty (`dovetail ledger remove`,
//! `dovetail ledger join`; docs/ha.md).

use std::sync::Arc;

use dovetail_core::clock::Clock;
use dovetail_raft::http::{HttpServer, HttpTransport, RaftClient, fetch_status};
use dovetail_raft::network::Transport;
use dovetail_raft::replicated::{RaftLedger, RaftSettings};
use dovetail_raft::store::{LogStore, Machine};
use dovetail_raft::{InProcess, Ledger};
use openraft::storage::RaftLogStorage;

use super::settings::{HaSettings, Settings};

/// A replicated ledger and the server its peers reach it on (serving while this is held),
/// both on a thread of Raft's own: no Kubernetes watch, snapshot or planner shares it, so
/// heartbeats and the lease keep their pace however busy the rest of the process is.
pub struct Raft {
    /// The replica.
    pub ledger: Arc<RaftLedger>,
    _server: HttpServer,
    /// Dropped last: the thread the two above run on.
    _runtime: dovetail_raft::runtime::RaftRuntime,
}

/// The ledger the settings ask for.
pub async fn ledger(s: &Settings, clock: Arc<dyn Clock>) -> Result<(Arc<dyn Ledger>, Option<Raft>), String> {
    let Some(ha) = &s.ha else {
        return Ok((Arc::new(InProcess::new()), None));
    };
    let runtime = dovetail_raft::runtime::RaftRuntime::start().map_err(|e| format!("the raft thread: {e}"))?;
    let (ha, raft_settings) = (ha.clone(), s.raft.clone());
    let (ledger, server) = runtime.run(replicated(ha, raft_settings, clock)).await??;
    let raft = Raft { ledger: Arc::new(ledger), _server: server, _runtime: runtime };
    Ok((raft.ledger.clone() as Arc<dyn Ledger>, Some(raft)))
}

/// Starts the replica and its server (on the raft thread: what they spawn runs there).
async fn replicated(
    ha: HaSettings,
    settings: RaftSettings,
    clock: Arc<dyn Clock>,
) -> Result<(RaftLedger, HttpServer), String> {
    let ha = &ha;
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
    let tls = match &ha.tls {
        Some(files) => Some(dovetail_raft::tls::Tls::load(files).map_err(|e| format!("--raft-tls-*: {e}"))?),
        None => {
            tracing::warn!(
                node = ha.node_id,
                "ledger.start: Raft messages and the group's secret travel in cleartext; set --raft-tls-ca, --raft-tls-cert and --raft-tls-key for mutual TLS"
            );
            None
        }
    };
    let client = RaftClient::new(secret.clone(), tls)
        .map_err(|e| format!("--raft-secret-file {}: {e}", ha.secret_file.display()))?;
    let transport: Arc<dyn Transport> = HttpTransport::with(client.clone());
    let ledger =
        RaftLedger::start(ha.node_id, &settings, log, machine, transport, clock).await.map_err(|e| e.to_string())?;
    let listener =
        tokio::net::TcpListener::bind(&ha.raft_addr).await.map_err(|e| format!("--raft-addr {}: {e}", ha.raft_addr))?;
    let server = HttpServer::serve(listener, ledger.raft().clone(), ledger.machine().clone(), client.clone())
        .map_err(|e| format!("--raft-addr {}: {e}", ha.raft_addr))?;
    tracing::info!(node = ha.node_id, addr = %server.addr, peers = ?ha.peers, fresh, tls = client.tls(), "ledger.start: raft node serving");
    let lowest = ha.peers.keys().next().copied();
    if fresh && lowest == Some(ha.node_id) {
        match existing_group(ha, &client).await {
            Some((peer, term)) => tracing::warn!(
                node = ha.node_id,
                peer,
                raft.term = term,
                "ledger.init: a peer already has the group; this node joins it instead of making one"
            ),
            None => match ledger.initialize(ha.peers.clone()).await {
                Ok(()) => tracing::info!(node = ha.node_id, "ledger.init: the group is made"),
                Err(e) => tracing::warn!(node = ha.node_id, error = %e, "ledger.init: the group was not made"),
            },
        }
    }
    Ok((ledger, server))
}

/// The first peer (other than this node) that answers with a group: its id and term.
/// Peers that do not answer (not started yet) count as having none.
async fn existing_group(ha: &HaSettings, client: &RaftClient) -> Option<(u64, u64)> {
    for (id, addr) in ha.peers.iter().filter(|(id, _)| **id != ha.node_id) {
        match fetch_status(addr, client, std::time::Duration::from_secs(2)).await {
            Ok(st) if !st.members.is_empty() => return Some((*id, st.term)),
            Ok(_) => {}
            Err(e) => tracing::debug!(node = ha.node_id, peer = id, error = %e, "ledger.init: peer not answering"),
        }
    }
    None
}
