//! The [`Ledger`] seam on openraft: one Raft entry per decision round, the state machine of
//! [`crate::store`], and the leadership watch that drives the plane.
//!
//! **Leadership.** The watch says `leader: true` for term T only once this node's
//! [`Command::Lead`] of term T has committed: from then on every proposal of an older term is
//! fenced by the state machine, so the actors it starts act on a ledger no deposed leader can
//! still change. When openraft reports another leader, a candidate or a follower, the watch
//! says `leader: false` at once; proposals made by a node that is no longer leader fail
//! (openraft refuses them) and their effects never run. A leader that has heard no quorum
//! for its lease (the shortest election timeout: before then no other node can have been
//! elected) says `leader: false` too, so a leader cut off in a minority stops acting before
//! a new one can start.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use dovetail_core::clock::Clock;
use dovetail_core::ledger::{Command, Entry, State};
use openraft::error::{ClientWriteError, RaftError};
use openraft::{BasicNode, Config, Raft, ServerState};
use tokio::sync::watch;

use crate::network::{Backoff, Network, Transport};
use crate::store::{LogStore, Machine};
use crate::types::{NodeId, TypeConfig};
use crate::wire::WireEntry;
use crate::{BoxFuture, Committed, Leadership, Ledger, LedgerError};

/// Timing of the Raft group. The defaults give a failover well inside a second on a LAN:
/// heartbeats every 50 ms, an election after 150 to 300 ms without one (openraft's followers
/// also refuse votes while they heard a leader recently, so a failover takes about two
/// election timeouts).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RaftSettings {
    /// How often the leader sends heartbeats.
    pub heartbeat_ms: u64,
    /// A follower that hears no heartbeat for a random time between these two starts an
    /// election; the shorter is also the leader's lease.
    pub election_timeout_min_ms: u64,
    pub election_timeout_max_ms: u64,
    /// A snapshot is built after this many entries since the last one (the log is then
    /// purged up to it, keeping `keep_after_snapshot`).
    pub snapshot_every: u64,
    pub keep_after_snapshot: u64,
    /// How long a proposal waits to commit (a leader without a quorum never commits).
    pub propose_timeout_ms: u64,
}

impl Default for RaftSettings {
    fn default() -> Self {
        RaftSettings {
            heartbeat_ms: 50,
            election_timeout_min_ms: 150,
            election_timeout_max_ms: 300,
            snapshot_every: 1000,
            keep_after_snapshot: 200,
            propose_timeout_ms: 5_000,
        }
    }
}

impl RaftSettings {
    /// Checks that the timing can work; the error names the setting. An election timeout
    /// must leave room for a few heartbeats to be lost (three, at least), or a busy leader is
    /// deposed by a follower that merely heard it late; the lease (nine tenths of the shortest
    /// timeout) must outlast a heartbeat, or a leader is never in its lease.
    pub fn validate(&self) -> Result<(), String> {
        if self.heartbeat_ms < 10 {
            return Err(format!("the raft heartbeat must be at least 10 ms, got {} ms", self.heartbeat_ms));
        }
        if self.election_timeout_min_ms < self.heartbeat_ms.saturating_mul(3) {
            return Err(format!(
                "the shortest raft election timeout ({} ms) must be at least three heartbeats ({} ms)",
                self.election_timeout_min_ms,
                self.heartbeat_ms.saturating_mul(3)
            ));
        }
        if self.election_timeout_max_ms <= self.election_timeout_min_ms {
            return Err(format!(
                "the longest raft election timeout ({} ms) must be longer than the shortest ({} ms)",
                self.election_timeout_max_ms, self.election_timeout_min_ms
            ));
        }
        if self.election_timeout_max_ms > 60_000 {
            return Err(format!(
                "the longest raft election timeout must be at most 60 s, got {} ms",
                self.election_timeout_max_ms
            ));
        }
        if self.propose_timeout_ms < self.election_timeout_max_ms {
            return Err(format!(
                "a proposal's timeout ({} ms) must outlast an election ({} ms)",
                self.propose_timeout_ms, self.election_timeout_max_ms
            ));
        }
        if self.snapshot_every == 0 {
            return Err("a snapshot every 0 entries: at least 1".into());
        }
        Ok(())
    }

    fn config(&self) -> Result<Config, LedgerError> {
        self.validate().map_err(|reason| LedgerError::Unavailable { reason: format!("raft settings: {reason}") })?;
        let config = Config {
            cluster_name: "dovetail".into(),
            heartbeat_interval: self.heartbeat_ms,
            election_timeout_min: self.election_timeout_min_ms,
            election_timeout_max: self.election_timeout_max_ms,
            snapshot_policy: openraft::SnapshotPolicy::LogsSinceLast(self.snapshot_every),
            max_in_snapshot_log_to_keep: self.keep_after_snapshot,
            // A snapshot chunk (JSON) to a follower far behind takes longer than a heartbeat.
            install_snapshot_timeout: 3_000,
            ..Config::default()
        };
        config.validate().map_err(|e| LedgerError::Unavailable { reason: format!("raft settings: {e}") })
    }
}

/// How a leader's lease fared: a lapse is its lease running out while it still led its term
/// in Raft (no quorum heard for the lease: a stalled process, a network cut), which stops its
/// effects until a quorum answers again.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LeaseStats {
    /// Terms this node led (its `Lead` committed).
    pub terms_led: u64,
    /// Times its lease ran out within a term it led.
    pub lapses: u64,
    /// The longest of those, ms.
    pub longest_lapse_ms: u64,
}

/// A control node's replica of the ledger.
pub struct RaftLedger {
    id: NodeId,
    raft: Raft<TypeConfig>,
    machine: Machine,
    leadership: watch::Receiver<Leadership>,
    publish: Arc<Publish>,
    watcher: tokio::task::JoinHandle<()>,
    propose_timeout: Duration,
}

impl RaftLedger {
    /// Starts node `id` on its stores (what it wrote before a restart included), talking to
    /// its peers over `transport`.
    pub async fn start(
        id: NodeId,
        settings: &RaftSettings,
        log: LogStore,
        machine: Machine,
        transport: Arc<dyn Transport>,
        clock: Arc<dyn Clock>,
    ) -> Result<RaftLedger, LedgerError> {
        // A peer that could not be reached is tried again after a heartbeat, then within the
        // shortest election timeout (see `Backoff`).
        let backoff = Backoff::for_timing(
            Duration::from_millis(settings.heartbeat_ms),
            Duration::from_millis(settings.election_timeout_min_ms),
            Duration::from_millis(settings.election_timeout_max_ms),
        );
        // A node that starts calls no election until a leader has had the time to reach it:
        // the leader tries a peer that was down for long only every `backoff.long`, and a
        // control node restarted after such an absence would otherwise depose a healthy
        // leader with its first election timeout.
        let mut config = settings.config()?;
        config.enable_elect = false;
        let quiet = backoff.long + Duration::from_millis(settings.election_timeout_max_ms);
        let network = Network { id, transport, backoff };
        let raft = Raft::new(id, Arc::new(config), network, log, machine.clone())
            .await
            .map_err(|e| LedgerError::Unavailable { reason: format!("raft node {id} did not start: {e}") })?;
        let electing = raft.clone();
        tokio::spawn(async move {
            tokio::time::sleep(quiet).await;
            electing.runtime_config().elect(true);
        });
        let (tx, rx) = watch::channel(Leadership { term: 0, leader: false, leader_id: None });
        let propose_timeout = Duration::from_millis(settings.propose_timeout_ms);
        let timing = Timing {
            heartbeat: Duration::from_millis(settings.heartbeat_ms),
            lease_ms: settings.election_timeout_min_ms,
            lead_timeout: propose_timeout,
        };
        let tx = Arc::new(Publish { tx, stopped: AtomicBool::new(false), stats: Default::default() });
        let watcher = tokio::spawn(watch_leadership(id, raft.clone(), tx.clone(), clock, timing));
        Ok(RaftLedger { id, raft, machine, leadership: rx, publish: tx, watcher, propose_timeout })
    }

    /// Makes a new group of `members` (id to Raft address). Only once, on one node, for a
    /// group that has never had members; a node that has a log refuses it.
    pub async fn initialize(&self, members: BTreeMap<NodeId, String>) -> Result<(), LedgerError> {
        let members: BTreeMap<NodeId, BasicNode> = members.into_iter().map(|(id, a)| (id, BasicNode::new(a))).collect();
        self.raft
            .initialize(members)
            .await
            .map_err(|e| LedgerError::Unavailable { reason: format!("initializing the group: {e}") })
    }

    /// This node's id in the group.
    pub fn id(&self) -> NodeId {
        self.id
    }

    /// The state machine (what the status endpoint reads).
    pub fn machine(&self) -> &Machine {
        &self.machine
    }

    /// The openraft node (its RPC handlers and metrics).
    pub fn raft(&self) -> &Raft<TypeConfig> {
        &self.raft
    }

    /// How its leases fared so far.
    pub fn lease_stats(&self) -> LeaseStats {
        *crate::lock(&self.publish.stats)
    }

    /// Stops the node (its stores stay as they are on disk). The watch says it leads nothing
    /// before anything stops.
    pub async fn shutdown(&self) {
        self.publish.stop();
        self.watcher.abort();
        if let Err(e) = self.raft.shutdown().await {
            tracing::warn!(node = self.id, error = %e, "ledger.shutdown: the raft core did not stop cleanly");
        }
    }
}

/// How often the watch looks without a change, the leader's lease, and how long a `Lead`
/// may take to commit.
#[derive(Clone, Copy)]
struct Timing {
    heartbeat: Duration,
    lease_ms: u64,
    lead_timeout: Duration,
}

impl Timing {
    /// When a lease taken from a quorum acknowledgement `since_ack` ms before `observed` runs
    /// out: the acknowledged heartbeat was sent before any follower received it, and no
    /// follower starts an election sooner than the shortest election timeout after receiving
    /// one, so no other leader can exist before then. A tenth is kept as margin (clock rates).
    fn lease_end(&self, observed: tokio::time::Instant, since_ack: Option<u64>) -> Option<tokio::time::Instant> {
        let lease = self.lease_ms.saturating_sub(self.lease_ms / 10);
        let left = lease.checked_sub(since_ack?)?;
        Some(observed + Duration::from_millis(left))
    }
}

/// Follows openraft's metrics and publishes [`Leadership`]: leading in a term once its
/// `Lead` committed and while its lease holds (computed from when the metrics were observed,
/// so a stalled Raft core, which stops reporting, loses it), following otherwise. Never goes
/// back in term.
#[allow(
    clippy::disallowed_methods,
    reason = "the lease is measured on openraft's own clock (tokio's Instant), which millis_since_quorum_ack comes from"
)]
async fn watch_leadership(id: NodeId, raft: Raft<TypeConfig>, tx: Arc<Publish>, clock: Arc<dyn Clock>, timing: Timing) {
    let mut metrics = raft.metrics();
    let mut led: Option<u64> = None;
    let mut lease_end: Option<tokio::time::Instant> = None;
    // When the lease ran out, in a term still led (a lapse under way).
    let mut lapsed: Option<tokio::time::Instant> = None;
    loop {
        let observed = tokio::time::Instant::now();
        let (term, state, leader, since_ack) = {
            let m = metrics.borrow_and_update();
            (m.current_term, m.state, m.current_leader, m.millis_since_quorum_ack)
        };
        let mut wait = timing.heartbeat;
        if term >= tx.term() {
            if state == ServerState::Leader && leader == Some(id) {
                if led == Some(term) {
                    lease_end = timing.lease_end(observed, since_ack);
                } else {
                    // Not acting in this term until its Lead commits.
                    tx.set(term, false, Some(id.to_string()));
                    lease_end = None;
                    let entry = Entry { term, at: clock.now_millis(), command: Command::Lead };
                    let write = raft.client_write(WireEntry::encode(&entry));
                    match tokio::time::timeout(timing.lead_timeout, write).await {
                        Ok(Ok(r)) if !r.data.decode().is_fenced() => {
                            led = Some(term);
                            lapsed = None;
                            crate::lock(&tx.stats).terms_led += 1;
                            tracing::info!(
                                node = id,
                                raft.term = term,
                                raft.index = r.log_id.index,
                                "ledger.lead: leading"
                            );
                            // Look at the metrics again at once: the lease comes from them.
                            continue;
                        }
                        Ok(Ok(_)) => tracing::warn!(node = id, raft.term = term, "ledger.lead: fenced by a later term"),
                        Ok(Err(e)) => {
                            tracing::info!(node = id, raft.term = term, error = %e, "ledger.lead: not committed")
                        }
                        Err(_) => tracing::info!(node = id, raft.term = term, "ledger.lead: not committed in time"),
                    }
                    // Tried and failed: try again after a change or a pause, never in a spin.
                    wait = timing.heartbeat * 5;
                }
            } else {
                led = None;
                lease_end = None;
                tx.set(term, false, leader.map(|n| n.to_string()));
            }
        }
        if led == Some(term) {
            let now = tokio::time::Instant::now();
            let held = lease_end.is_some_and(|end| now < end);
            if tx.set(term, held, Some(id.to_string())) {
                tracing::info!(node = id, raft.term = term, held, "ledger.lease");
                match (held, lapsed) {
                    (false, None) => {
                        lapsed = Some(now);
                        crate::lock(&tx.stats).lapses += 1;
                    }
                    (true, Some(since)) => {
                        lapsed = None;
                        let ms = u64::try_from(now.duration_since(since).as_millis()).unwrap_or(u64::MAX);
                        let mut stats = crate::lock(&tx.stats);
                        stats.longest_lapse_ms = stats.longest_lapse_ms.max(ms);
                    }
                    _ => {}
                }
            }
        } else {
            lapsed = None;
        }
        // Wake at the next change, or when the lease runs out, or after a while.
        let until = match lease_end {
            Some(end) if end > tokio::time::Instant::now() => end,
            _ => tokio::time::Instant::now() + wait,
        };
        tokio::select! {
            // In order, so a run on paused time replays the same way.
            biased;
            changed = metrics.changed() => {
                if changed.is_err() {
                    // The node stopped: it leads nothing.
                    tx.stop();
                    return;
                }
            }
            () = tokio::time::sleep_until(until) => {}
        }
    }
}

/// The leadership watch's sending side. Once stopped it publishes nothing more: the watcher
/// task may still be in its last poll on another thread when `shutdown` aborts it, and must not
/// say "leader" again after the shutdown said "nothing". The flag is read and set under the
/// watch's lock, so no write can slip between them.
struct Publish {
    tx: watch::Sender<Leadership>,
    stopped: AtomicBool,
    /// How the leases went (the watcher counts, [`RaftLedger::lease_stats`] reads).
    stats: std::sync::Mutex<LeaseStats>,
}

impl Publish {
    /// Publishes (term, leader, leader_id), unless stopped; whether the watch changed.
    fn set(&self, term: u64, leader: bool, leader_id: Option<String>) -> bool {
        self.tx.send_if_modified(|l| !self.stopped.load(Ordering::SeqCst) && set(l, term, leader, leader_id))
    }

    /// Publishes "leads nothing" and stops publishing.
    fn stop(&self) {
        self.tx.send_if_modified(|l| {
            self.stopped.store(true, Ordering::SeqCst);
            set(l, l.term, false, None)
        });
    }

    fn term(&self) -> u64 {
        self.tx.borrow().term
    }
}

fn set(l: &mut Leadership, term: u64, leader: bool, leader_id: Option<String>) -> bool {
    let next = Leadership { term: term.max(l.term), leader, leader_id };
    if *l == next {
        false
    } else {
        *l = next;
        true
    }
}

impl Ledger for RaftLedger {
    /// A proposal that times out may still commit later: callers re-propose with the same ids
    /// (claims and batches are idempotent in the state machine), as after any `Unavailable`.
    fn propose(&self, entry: Entry) -> BoxFuture<'_, Result<Committed, LedgerError>> {
        Box::pin(async move {
            // A term ahead of the group's would fence every leader up to it.
            let current = self.raft.metrics().borrow().current_term;
            if entry.term > current {
                return Err(LedgerError::Unavailable {
                    reason: format!("a proposal of term {} is ahead of the group's term {current}", entry.term),
                });
            }
            // Inside a traced decision: the entry's replication to a quorum, its commit and
            // its application, as a span of the decision's trace.
            let span = if tracing::Span::current().is_none() {
                tracing::Span::none()
            } else {
                tracing::info_span!("ledger.commit", raft.term = current, raft.index = tracing::field::Empty)
            };
            let write =
                tracing::Instrument::instrument(self.raft.client_write(WireEntry::encode(&entry)), span.clone());
            match tokio::time::timeout(self.propose_timeout, write).await {
                Ok(Ok(r)) => {
                    span.record("raft.index", r.log_id.index);
                    Ok(Committed { index: r.log_id.index, outcome: r.data.decode() })
                }
                Ok(Err(RaftError::APIError(ClientWriteError::ForwardToLeader(f)))) => {
                    Err(LedgerError::NotLeader { leader: f.leader_id.map(|n| n.to_string()) })
                }
                Ok(Err(e)) => Err(LedgerError::Unavailable { reason: e.to_string() }),
                Err(_) => Err(LedgerError::Unavailable {
                    reason: format!("not committed within {:?} (no quorum?)", self.propose_timeout),
                }),
            }
        })
    }

    fn read<'a>(&'a self, f: Box<dyn FnOnce(&State) + Send + 'a>) -> BoxFuture<'a, Result<(), LedgerError>> {
        Box::pin(async move {
            self.machine.read(|a| f(&a.state));
            Ok(())
        })
    }

    fn leadership(&self) -> watch::Receiver<Leadership> {
        self.leadership.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::network::{Faults, MemNet};
    use crate::read_with;
    use dovetail_core::clock::SystemClock;
    use dovetail_core::ledger::Outcome;
    use dovetail_core::resources::ResourceList;
    use std::collections::BTreeSet;
    use std::time::Duration;

    struct Node {
        ledger: RaftLedger,
        dir: tempfile::TempDir,
    }

    async fn node(id: NodeId, net: &Arc<MemNet>, dir: tempfile::TempDir) -> Node {
        let log = LogStore::open(dir.path()).expect("log");
        let machine = Machine::open(dir.path()).expect("machine");
        let transport: Arc<dyn Transport> = net.clone();
        let ledger =
            RaftLedger::start(id, &RaftSettings::default(), log, machine, transport, Arc::new(SystemClock::new()))
                .await
                .expect("started");
        net.join(id, ledger.raft().clone());
        Node { ledger, dir }
    }

    /// Waits (at most 10 s) until one of `nodes` other than `except` leads with its Lead
    /// committed.
    async fn leader_but(nodes: &BTreeMap<NodeId, Node>, except: Option<NodeId>) -> (NodeId, u64) {
        for _ in 0..200 {
            for (id, n) in nodes.iter().filter(|(id, _)| Some(**id) != except) {
                let l = n.ledger.leadership().borrow().clone();
                if l.leader {
                    return (*id, l.term);
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("no leader within 10 s");
    }

    async fn leader(nodes: &BTreeMap<NodeId, Node>) -> (NodeId, u64) {
        leader_but(nodes, None).await
    }

    fn set_pool(term: u64, at: u64, pool: &str) -> Entry {
        Entry {
            term,
            at,
            command: Command::SetPool { pool: pool.into(), limits: ResourceList::cpu_mem(1000, 1 << 30) },
        }
    }

    /// Three replicas: the leader's proposals commit on all; it dies; another leads in a
    /// higher term within seconds with everything committed before, a proposal of the old
    /// term is fenced, a follower refuses proposals naming the leader, and the dead node comes
    /// back from its disk and catches up.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn three_replicas_commit_fail_over_fence_the_old_term_and_a_restarted_node_catches_up() {
        let net = MemNet::new(7);
        let mut nodes = BTreeMap::new();
        for id in 1..=3u64 {
            nodes.insert(id, node(id, &net, tempfile::tempdir().expect("dir")).await);
        }
        let members: BTreeMap<NodeId, String> = (1..=3).map(|i| (i, format!("mem-{i}"))).collect();
        nodes[&1].ledger.initialize(members).await.expect("initialized");
        let (first, term) = leader(&nodes).await;
        for i in 0..10 {
            let c = nodes[&first].ledger.propose(set_pool(term, 1_000 + i, &format!("p{i}"))).await.expect("committed");
            assert_eq!(c.outcome, Outcome::Done);
        }
        // A follower refuses and names the leader.
        let follower = nodes.keys().copied().find(|id| *id != first).expect("a follower");
        match nodes[&follower].ledger.propose(set_pool(term, 2_000, "x")).await {
            Err(LedgerError::NotLeader { leader }) => assert_eq!(leader, Some(first.to_string())),
            other => panic!("{other:?}"),
        }
        // The leader dies; its watch says it leads nothing once it is shut down.
        net.leave(first);
        let dead = nodes.remove(&first).expect("the leader");
        let watch = dead.ledger.leadership();
        dead.ledger.shutdown().await;
        assert!(!watch.borrow().leader && !watch.borrow().is_current(term));
        let (second, new_term) = leader(&nodes).await;
        assert_ne!(second, first);
        assert!(new_term > term);
        let pools = read_with(&nodes[&second].ledger, |s| s.pools().len()).await.expect("read");
        assert_eq!(pools, 10, "nothing committed was lost");
        // A decision made under the old term is fenced.
        let stale = nodes[&second].ledger.propose(set_pool(term, 3_000, "stale")).await.expect("committed");
        assert_eq!(stale.outcome, Outcome::Fenced { term: new_term });
        let c = nodes[&second].ledger.propose(set_pool(new_term, 3_001, "fresh")).await.expect("committed");
        assert_eq!(c.outcome, Outcome::Done);
        // A proposal of a term ahead of the group's is refused (it would fence later leaders).
        let ahead = nodes[&second].ledger.propose(set_pool(new_term + 10, 3_002, "ahead")).await;
        assert!(matches!(ahead, Err(LedgerError::Unavailable { ref reason }) if reason.contains("ahead")), "{ahead:?}");
        // The old leader restarts from its disk and catches up.
        let back = node(first, &net, dead.dir).await;
        nodes.insert(first, back);
        let mut caught_up = false;
        for _ in 0..200 {
            let s = read_with(&nodes[&first].ledger, |s| (s.pools().len(), s.term())).await.expect("read");
            if s == (11, new_term) {
                caught_up = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(caught_up, "the restarted node has every entry");
        assert!(
            !nodes[&first].ledger.leadership().borrow().leader
                || nodes[&first].ledger.leadership().borrow().term > new_term
        );
        let (sent, lost) = net.counts();
        assert!(sent > 0 && lost == 0, "{sent} {lost}");
        for n in nodes.values() {
            n.ledger.shutdown().await;
        }
    }

    /// Membership: a follower asked to change it names the leader; a fourth node joins as a
    /// voter with every entry; asking again changes nothing, and the same id at another
    /// address is refused; a node that is not running does not catch up in time and is left a
    /// learner, which is then removed; with a voter down, removing a healthy one is refused
    /// (the rest could commit nothing); the leader removes itself and another leads, and
    /// commits with the joined node in its quorum (one of the original nodes down).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_node_joins_with_every_entry_and_a_leader_that_removes_itself_hands_over() {
        use crate::membership::{MembershipError, MembershipRequest, Probe, change};
        let net = MemNet::new(13);
        let mut nodes = BTreeMap::new();
        for id in 1..=3u64 {
            nodes.insert(id, node(id, &net, tempfile::tempdir().expect("dir")).await);
        }
        // Which nodes answer a probe.
        let up: Arc<std::sync::Mutex<BTreeSet<NodeId>>> = Arc::new(std::sync::Mutex::new(BTreeSet::from([1, 2, 3])));
        let probe: Probe = {
            let up = up.clone();
            Arc::new(move |id, _| {
                let answers = crate::lock(&up).contains(&id);
                Box::pin(async move { answers })
            })
        };
        let members: BTreeMap<NodeId, String> = (1..=3).map(|i| (i, format!("mem-{i}"))).collect();
        nodes[&1].ledger.initialize(members).await.expect("initialized");
        let (first, term) = leader(&nodes).await;
        for i in 0..10 {
            nodes[&first].ledger.propose(set_pool(term, 1_000 + i, &format!("p{i}"))).await.expect("committed");
        }
        let join = |id: NodeId, catch_up_ms| MembershipRequest::Join { id, addr: format!("mem-{id}"), catch_up_ms };
        let follower = nodes.keys().copied().find(|id| *id != first).expect("a follower");
        match change(nodes[&follower].ledger.raft(), &join(4, 10_000), &probe).await {
            Err(MembershipError::NotLeader { node, leader, addr }) => {
                assert_eq!((node, leader, addr), (follower, Some(first), Some(format!("mem-{first}"))));
            }
            other => panic!("{other:?}"),
        }
        nodes.insert(4, node(4, &net, tempfile::tempdir().expect("dir")).await);
        crate::lock(&up).insert(4);
        let joined = change(nodes[&first].ledger.raft(), &join(4, 10_000), &probe).await.expect("joined");
        assert!(joined.changed);
        assert_eq!(joined.voters.keys().copied().collect::<Vec<_>>(), vec![1, 2, 3, 4]);
        assert!(joined.learners.is_empty());
        let mut has_all = false;
        for _ in 0..100 {
            if read_with(&nodes[&4].ledger, |s| s.pools().len()).await.expect("read") == 10 {
                has_all = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(has_all, "the joined node applied every entry");
        let again = change(nodes[&first].ledger.raft(), &join(4, 10_000), &probe).await.expect("a voter already");
        assert!(!again.changed && again.voters == joined.voters);
        let moved = MembershipRequest::Join { id: 4, addr: "elsewhere".into(), catch_up_ms: 1_000 };
        let refused = change(nodes[&first].ledger.raft(), &moved, &probe).await;
        assert!(matches!(&refused, Err(MembershipError::Refused { reason }) if reason.contains("remove it first")));
        // Node 5 is not running: it cannot catch up, and stays a learner until removed.
        let absent = change(nodes[&first].ledger.raft(), &join(5, 500), &probe).await;
        assert!(
            matches!(&absent, Err(MembershipError::Unavailable { reason }) if reason.contains("node 5")),
            "{absent:?}"
        );
        let st = crate::status::LedgerStatus::of(nodes[&first].ledger.raft(), nodes[&first].ledger.machine()).await;
        assert_eq!((st.members, st.learners), (vec![1, 2, 3, 4], vec![5]));
        let gone =
            change(nodes[&first].ledger.raft(), &MembershipRequest::Remove { id: 5 }, &probe).await.expect("removed");
        assert!(gone.changed && gone.learners.is_empty() && gone.voters.len() == 4);
        // Two of the four voters silent: removing a third one that answers would leave
        // {first, silent, silent}, with no majority answering. Refused, nothing changed.
        let others: Vec<NodeId> = (1..=4).filter(|id| *id != first).collect();
        crate::lock(&up).retain(|id| *id != others[0] && *id != others[1]);
        let remove = MembershipRequest::Remove { id: others[2] };
        let refused = change(nodes[&first].ledger.raft(), &remove, &probe).await;
        assert!(
            matches!(&refused, Err(MembershipError::Refused { reason }) if reason.contains("do not answer")),
            "{refused:?}"
        );
        let st = crate::status::LedgerStatus::of(nodes[&first].ledger.raft(), nodes[&first].ledger.machine()).await;
        assert_eq!(st.members, vec![1, 2, 3, 4], "nothing changed");
        crate::lock(&up).extend([others[0], others[1]]);
        // The leader removes itself: it stops leading once that commits; another leads.
        let watch = nodes[&first].ledger.leadership();
        let remove = MembershipRequest::Remove { id: first };
        let out = change(nodes[&first].ledger.raft(), &remove, &probe).await.expect("removed");
        assert!(!out.voters.contains_key(&first) && out.voters.len() == 3, "{out:?}");
        let (second, new_term) = leader_but(&nodes, Some(first)).await;
        assert!(new_term > term);
        assert!(!watch.borrow().leader, "the removed leader no longer acts");
        // One of the original nodes goes: the new leader commits with node 4's vote.
        let down = (1..=3).find(|id| *id != first && *id != second).expect("an original node");
        net.leave(down);
        nodes[&down].ledger.shutdown().await;
        let at = |n: &Node| n.ledger.leadership().borrow().term;
        let term_now = at(&nodes[&second]);
        let c = nodes[&second].ledger.propose(set_pool(term_now, 5_000, "after")).await.expect("committed");
        assert_eq!(c.outcome, Outcome::Done);
        let applied = read_with(&nodes[&4].ledger, |s| s.pool("after").is_some()).await.expect("read");
        let mut on_4 = applied;
        for _ in 0..100 {
            if on_4 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
            on_4 = read_with(&nodes[&4].ledger, |s| s.pool("after").is_some()).await.expect("read");
        }
        assert!(on_4, "node 4 has the entry its vote committed");
        let again = change(nodes[&second].ledger.raft(), &MembershipRequest::Remove { id: first }, &probe).await;
        assert!(again.is_ok_and(|m| !m.changed), "removing a node twice changes nothing");
        for (id, n) in &nodes {
            if *id != down {
                n.ledger.shutdown().await;
            }
        }
    }

    /// The leader cut off in a minority: within its lease it stops saying it leads, its
    /// proposals do not commit, the majority elects another leader that commits; healed, the
    /// old leader follows the new term and has the majority's entries, none of its own.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_leader_partitioned_into_a_minority_stops_leading_and_commits_nothing() {
        let net = MemNet::new(11);
        let mut nodes = BTreeMap::new();
        for id in 1..=3u64 {
            nodes.insert(id, node(id, &net, tempfile::tempdir().expect("dir")).await);
        }
        let members: BTreeMap<NodeId, String> = (1..=3).map(|i| (i, format!("mem-{i}"))).collect();
        nodes[&1].ledger.initialize(members).await.expect("initialized");
        let (old, term) = leader(&nodes).await;
        nodes[&old].ledger.propose(set_pool(term, 1_000, "before")).await.expect("committed");
        net.set_faults(Faults { isolated: BTreeSet::from([old]), ..Faults::default() });
        let mut demoted = false;
        for _ in 0..40 {
            if !nodes[&old].ledger.leadership().borrow().leader {
                demoted = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        assert!(demoted, "the cut-off leader stopped leading within a second");
        let cut_off = nodes[&old].ledger.propose(set_pool(term, 1_001, "minority")).await;
        assert!(matches!(cut_off, Err(LedgerError::Unavailable { .. })), "{cut_off:?}");
        let (new, new_term) = leader_but(&nodes, Some(old)).await;
        assert!(new_term > term);
        nodes[&new].ledger.propose(set_pool(new_term, 1_002, "majority")).await.expect("committed");
        net.set_faults(Faults::default());
        let mut healed = None;
        for _ in 0..200 {
            let (pools, t) =
                read_with(&nodes[&old].ledger, |s| (s.pools().keys().cloned().collect::<Vec<_>>(), s.term()))
                    .await
                    .expect("read");
            if t >= new_term && pools.contains(&"majority".to_string()) {
                healed = Some(pools);
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let pools = healed.expect("the old leader caught up");
        assert!(!pools.contains(&"minority".to_string()), "the minority's proposal never committed: {pools:?}");
        assert!(net.counts().1 > 0, "messages were lost to the partition");
        for n in nodes.values() {
            n.ledger.shutdown().await;
        }
    }
}
