//! Raft's messages between control nodes: what is sent ([`Rpc`], [`RpcReply`], serde), the
//! [`Transport`] seam that carries them, openraft's network over it, and [`serve`], which
//! answers a message on the receiving node.
//!
//! Transports: [`MemNet`] connects ledgers in one process (tests, `simulate --control-nodes`)
//! with fault injection: partitions, message loss and random delays (so reordering), seeded
//! and deterministic under tokio's paused time. Between processes the messages go over HTTP
//! on the control nodes' own port.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use dovetail_core::workload::SplitMix64;
use openraft::error::{InstallSnapshotError, NetworkError, RPCError, RaftError, RemoteError, Timeout, Unreachable};
use openraft::network::{RPCOption, RPCTypes, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse, VoteRequest,
    VoteResponse,
};
use openraft::{BasicNode, Raft};
use serde::{Deserialize, Serialize};

use crate::types::{NodeId, TypeConfig};
use crate::{BoxFuture, lock};

/// A Raft message.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Rpc {
    Append(AppendEntriesRequest<TypeConfig>),
    Vote(VoteRequest<NodeId>),
    Snapshot(InstallSnapshotRequest<TypeConfig>),
}

impl Rpc {
    fn kind(&self) -> RPCTypes {
        match self {
            Rpc::Append(_) => RPCTypes::AppendEntries,
            Rpc::Vote(_) => RPCTypes::Vote,
            Rpc::Snapshot(_) => RPCTypes::InstallSnapshot,
        }
    }
}

/// The answer to an [`Rpc`], of the same kind.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RpcReply {
    Append(Result<AppendEntriesResponse<NodeId>, RaftError<NodeId>>),
    Vote(Result<VoteResponse<NodeId>, RaftError<NodeId>>),
    Snapshot(Result<InstallSnapshotResponse<NodeId>, RaftError<NodeId, InstallSnapshotError>>),
}

/// Answers `rpc` on the node that received it.
pub async fn serve(raft: &Raft<TypeConfig>, rpc: Rpc) -> RpcReply {
    match rpc {
        Rpc::Append(r) => RpcReply::Append(raft.append_entries(r).await),
        Rpc::Vote(r) => RpcReply::Vote(raft.vote(r).await),
        Rpc::Snapshot(r) => RpcReply::Snapshot(raft.install_snapshot(r).await),
    }
}

/// Why a message got no answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TransportError {
    /// The peer could not be reached (refused, reset, dropped, partitioned).
    #[error("node {to} unreachable: {reason}")]
    Unreachable { to: NodeId, reason: String },
    /// No answer within the timeout.
    #[error("node {to} did not answer within {timeout:?}")]
    Timeout { to: NodeId, timeout: Duration },
    /// The peer answered with something that is not a reply to the message (another
    /// version, a proxy's page, a refusal of our credentials).
    #[error("node {to} answered badly: {reason}")]
    Bad { to: NodeId, reason: String },
}

/// Carries messages to peers.
pub trait Transport: Send + Sync + 'static {
    /// Sends `rpc` from `from` to node `to` at `addr` and waits at most `timeout` for its reply.
    fn call(
        &self,
        from: NodeId,
        to: NodeId,
        addr: &str,
        rpc: Rpc,
        timeout: Duration,
    ) -> BoxFuture<'_, Result<RpcReply, TransportError>>;
}

/// openraft's network over a [`Transport`].
#[derive(Clone)]
pub struct Network {
    pub id: NodeId,
    pub transport: Arc<dyn Transport>,
    /// How replication to a peer that could not be reached waits before trying again.
    pub backoff: Backoff,
}

/// The pauses between attempts to reach a peer that could not be reached. openraft sends a
/// peer nothing while it pauses, and its own fixed 500 ms outlasts the election timeout, so:
///
/// - one heartbeat at a time until the pauses add up to the longest election timeout: a lost
///   message or two costs a heartbeat, and a follower never goes silent long enough to call an
///   election;
/// - then at most the shortest election timeout, for `restart_window`: a peer that restarts
///   (a control node killed and started again) hears from the leader before its own first
///   election timeout, instead of calling an election that deposes a healthy leader;
/// - then `long`: a peer down longer is tried (and logged by openraft, four lines an attempt)
///   a few times a second, not 20.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Backoff {
    pub heartbeat: Duration,
    pub election_timeout_min: Duration,
    pub election_timeout_max: Duration,
    pub restart_window: Duration,
    pub long: Duration,
}

impl Backoff {
    /// The schedule for a group's timing (openraft's own pause once a peer stayed down for
    /// 10 s).
    pub fn for_timing(heartbeat: Duration, election_timeout_min: Duration, election_timeout_max: Duration) -> Self {
        Backoff {
            heartbeat,
            election_timeout_min,
            election_timeout_max,
            restart_window: Duration::from_secs(10),
            long: Duration::from_millis(500),
        }
    }

    /// The pauses of one episode of failures (openraft starts a new one once the peer answers).
    pub fn steps(self) -> impl Iterator<Item = Duration> + Send + 'static {
        let heartbeat = self.heartbeat.max(Duration::from_millis(1));
        let cap = self.election_timeout_min.max(heartbeat);
        let long = self.long.max(cap);
        let settle = self.election_timeout_max;
        let restarted = settle.saturating_add(self.restart_window);
        let mut waited = Duration::ZERO;
        let mut last = heartbeat;
        std::iter::from_fn(move || {
            let next = if waited < settle {
                heartbeat
            } else if waited < restarted {
                (last * 2).min(cap)
            } else {
                long
            };
            waited = waited.saturating_add(next);
            last = next;
            Some(next)
        })
    }
}

/// openraft's connection to one peer.
pub struct Peer {
    id: NodeId,
    to: NodeId,
    addr: String,
    transport: Arc<dyn Transport>,
    backoff: Backoff,
}

impl RaftNetworkFactory<TypeConfig> for Network {
    type Network = Peer;

    async fn new_client(&mut self, target: NodeId, node: &BasicNode) -> Peer {
        Peer {
            id: self.id,
            to: target,
            addr: node.addr.clone(),
            transport: self.transport.clone(),
            backoff: self.backoff,
        }
    }
}

type RpcResult<T, E = openraft::error::Infallible> = Result<T, RPCError<NodeId, BasicNode, RaftError<NodeId, E>>>;

impl Peer {
    async fn call(&self, rpc: Rpc, option: &RPCOption) -> Result<RpcReply, TransportError> {
        self.transport.call(self.id, self.to, &self.addr, rpc, option.hard_ttl()).await
    }

    fn failed<E: std::error::Error>(
        &self,
        kind: RPCTypes,
        e: TransportError,
    ) -> RPCError<NodeId, BasicNode, RaftError<NodeId, E>> {
        match e {
            TransportError::Timeout { timeout, .. } => {
                RPCError::Timeout(Timeout { action: kind, id: self.id, target: self.to, timeout })
            }
            e @ TransportError::Unreachable { .. } => RPCError::Unreachable(Unreachable::new(&e)),
            e @ TransportError::Bad { .. } => RPCError::Network(NetworkError::new(&e)),
        }
    }

    fn mismatched<E: std::error::Error>(&self, kind: RPCTypes) -> RPCError<NodeId, BasicNode, RaftError<NodeId, E>> {
        let e = TransportError::Bad { to: self.to, reason: format!("the reply to {kind:?} is of another kind") };
        RPCError::Network(NetworkError::new(&e))
    }
}

impl RaftNetwork<TypeConfig> for Peer {
    fn backoff(&self) -> openraft::network::Backoff {
        openraft::network::Backoff::new(self.backoff.steps())
    }

    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> RpcResult<AppendEntriesResponse<NodeId>> {
        match self.call(Rpc::Append(rpc), &option).await {
            Ok(RpcReply::Append(Ok(r))) => Ok(r),
            Ok(RpcReply::Append(Err(e))) => Err(RPCError::RemoteError(RemoteError::new(self.to, e))),
            Ok(_) => Err(self.mismatched(RPCTypes::AppendEntries)),
            Err(e) => Err(self.failed(RPCTypes::AppendEntries, e)),
        }
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> RpcResult<InstallSnapshotResponse<NodeId>, InstallSnapshotError> {
        match self.call(Rpc::Snapshot(rpc), &option).await {
            Ok(RpcReply::Snapshot(Ok(r))) => Ok(r),
            Ok(RpcReply::Snapshot(Err(e))) => Err(RPCError::RemoteError(RemoteError::new(self.to, e))),
            Ok(_) => Err(self.mismatched(RPCTypes::InstallSnapshot)),
            Err(e) => Err(self.failed(RPCTypes::InstallSnapshot, e)),
        }
    }

    async fn vote(&mut self, rpc: VoteRequest<NodeId>, option: RPCOption) -> RpcResult<VoteResponse<NodeId>> {
        match self.call(Rpc::Vote(rpc), &option).await {
            Ok(RpcReply::Vote(Ok(r))) => Ok(r),
            Ok(RpcReply::Vote(Err(e))) => Err(RPCError::RemoteError(RemoteError::new(self.to, e))),
            Ok(_) => Err(self.mismatched(RPCTypes::Vote)),
            Err(e) => Err(self.failed(RPCTypes::Vote, e)),
        }
    }
}

/// The in-memory network's faults.
#[derive(Clone, Debug, Default)]
pub struct Faults {
    /// Nodes cut off from every other node (each side's messages to the other are lost).
    pub isolated: BTreeSet<NodeId>,
    /// The chance that a message (or its reply) is lost.
    pub loss: f64,
    /// Each message waits a random time up to this before delivery (so messages reorder).
    pub max_delay: Duration,
}

/// Ledgers in one process, connected by memory.
pub struct MemNet {
    nodes: Mutex<BTreeMap<NodeId, Raft<TypeConfig>>>,
    faults: Mutex<(Faults, SplitMix64)>,
    /// Messages sent and lost, for reports.
    counts: Mutex<(u64, u64)>,
}

impl MemNet {
    /// A network with no faults whose random choices follow `seed`.
    pub fn new(seed: u64) -> Arc<MemNet> {
        Arc::new(MemNet {
            nodes: Mutex::new(BTreeMap::new()),
            faults: Mutex::new((Faults::default(), SplitMix64::new(seed))),
            counts: Mutex::new((0, 0)),
        })
    }

    /// Connects a node (it receives messages sent to its id).
    pub fn join(&self, id: NodeId, raft: Raft<TypeConfig>) {
        lock(&self.nodes).insert(id, raft);
    }

    /// Disconnects a node (a crash: messages to it are lost).
    pub fn leave(&self, id: NodeId) {
        lock(&self.nodes).remove(&id);
    }

    /// Replaces the faults.
    pub fn set_faults(&self, faults: Faults) {
        lock(&self.faults).0 = faults;
    }

    pub fn faults(&self) -> Faults {
        lock(&self.faults).0.clone()
    }

    /// Messages sent and lost so far.
    pub fn counts(&self) -> (u64, u64) {
        *lock(&self.counts)
    }

    /// Whether a message between `a` and `b` is lost now, and how long it takes otherwise.
    fn fate(&self, a: NodeId, b: NodeId) -> Option<Duration> {
        let mut f = lock(&self.faults);
        let (faults, rng) = &mut *f;
        let cut = faults.isolated.contains(&a) != faults.isolated.contains(&b);
        // Loss with probability `loss` (53 random bits as a fraction).
        let lost = cut || (faults.loss > 0.0 && (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64 <= faults.loss);
        let max = usize::try_from(faults.max_delay.as_micros()).unwrap_or(usize::MAX);
        let delay = Duration::from_micros(rng.below(max.saturating_add(1)) as u64);
        let mut c = lock(&self.counts);
        c.0 += 1;
        if lost {
            c.1 += 1;
            None
        } else {
            Some(delay)
        }
    }
}

impl Transport for MemNet {
    fn call(
        &self,
        from: NodeId,
        to: NodeId,
        _addr: &str,
        rpc: Rpc,
        timeout: Duration,
    ) -> BoxFuture<'_, Result<RpcReply, TransportError>> {
        Box::pin(async move {
            let lost = || TransportError::Unreachable { to, reason: "lost".into() };
            let exchange = async {
                // The message, then its reply, each may be lost or delayed.
                let there = self.fate(from, to).ok_or_else(lost)?;
                tokio::time::sleep(there).await;
                let raft = lock(&self.nodes).get(&to).cloned();
                let Some(raft) = raft else {
                    return Err(TransportError::Unreachable { to, reason: "not running".into() });
                };
                let kind = rpc.kind();
                let reply = serve(&raft, rpc).await;
                let back = self.fate(to, from).ok_or_else(lost)?;
                tokio::time::sleep(back).await;
                tracing::trace!(from, to, ?kind, "ledger.memnet: delivered");
                Ok(reply)
            };
            match tokio::time::timeout(timeout, exchange).await {
                Ok(r) => r,
                Err(_) => Err(TransportError::Timeout { to, timeout }),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_peer_is_retried_every_heartbeat_then_within_an_election_timeout_then_less_often() {
        let ms = Duration::from_millis;
        let b = Backoff::for_timing(ms(50), ms(150), ms(300));
        let steps: Vec<u64> = b.steps().take(8).map(|d| d.as_millis() as u64).collect();
        // 6 heartbeats reach the longest election timeout; then never more than the shortest.
        assert_eq!(steps, [50, 50, 50, 50, 50, 50, 100, 150]);
        let mut waited = Duration::ZERO;
        for step in b.steps().take(2_000) {
            if waited < ms(300) + b.restart_window {
                assert!(step <= ms(150), "{step:?} after {waited:?}: a restarting peer would call an election");
            } else {
                assert_eq!(step, ms(500), "after {waited:?}");
            }
            waited += step;
        }
        assert!(waited > ms(300) + b.restart_window, "the schedule reaches its long pause");
    }

    fn fates(seed: u64, faults: &Faults) -> Vec<Option<Duration>> {
        let net = MemNet::new(seed);
        net.set_faults(faults.clone());
        (0..300u64).map(|i| net.fate(1 + i % 3, 1 + (i + 1) % 3)).collect()
    }

    #[test]
    fn the_same_seed_loses_and_delays_the_same_messages_and_a_partition_cuts_only_across_it() {
        let faults = Faults { loss: 0.3, max_delay: Duration::from_millis(10), ..Faults::default() };
        let a = fates(5, &faults);
        assert_eq!(a, fates(5, &faults), "deterministic for a seed");
        assert_ne!(a, fates(6, &faults));
        let lost = a.iter().filter(|f| f.is_none()).count();
        assert!((60..120).contains(&lost), "about 30% of 300 lost: {lost}");
        assert!(a.iter().flatten().all(|d| *d <= Duration::from_millis(10)));
        assert!(a.iter().flatten().any(|d| *d >= Duration::from_millis(5)), "delays spread over the range");
        let net = MemNet::new(1);
        net.set_faults(Faults { isolated: BTreeSet::from([3]), ..Faults::default() });
        assert!(net.fate(1, 2).is_some() && net.fate(2, 1).is_some(), "within the majority");
        assert!(net.fate(1, 3).is_none() && net.fate(3, 2).is_none(), "across the partition");
        assert_eq!(net.counts(), (4, 2));
    }
}
