//! The ledger seam: the async [`Ledger`] the actors propose to, over the pure state machine in
//! `dovetail_core::ledger`. [`InProcess`] is the single-node ledger (`simulate`, small
//! clusters, tests); the openraft ledger implements the same trait, so it drops in without
//! touching the actors.
//!
//! **Leadership and fencing.** [`Ledger::leadership`] is a watch of who leads and in which
//! term. Only the leader's actors act. Each proposal carries the term its proposer decided
//! in; the state machine refuses an older term ([`Outcome::Fenced`]), and an effect runs only
//! after its intent committed in the term that is still current ([`Leadership::is_current`]),
//! so a deposed leader's decisions never reach the cloud or the cluster.

pub mod http;
pub mod membership;
pub mod network;
pub mod replicated;
pub mod runtime;
pub mod status;
pub mod store;
pub mod tls;
pub mod types;
pub mod wire;

use std::future::Future;
use std::pin::Pin;
use std::sync::{Mutex, MutexGuard};

use dovetail_core::ledger::{Command, Entry, Millis, Outcome, State, Term};
use tokio::sync::watch;

/// Locks `m`, taking over a lock poisoned by a panic (the data is plain state, never left
/// half-updated across a panic point).
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A boxed future, so that the seam stays object safe (`Arc<dyn Ledger>`).
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// An entry the ledger committed and applied.
#[derive(Clone, Debug, PartialEq)]
pub struct Committed {
    /// Its position in the log, from 1.
    pub index: u64,
    pub outcome: Outcome,
}

/// Why a proposal was not committed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum LedgerError {
    /// This node is not the leader; propose there (its id, when known).
    #[error("not the leader (leader: {leader:?})")]
    NotLeader { leader: Option<String> },
    /// No quorum or the log could not be written; retry later.
    #[error("ledger unavailable: {reason}")]
    Unavailable { reason: String },
}

/// Who leads, as this control node sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Leadership {
    /// The current term (0 before any election).
    pub term: Term,
    /// Whether this node leads in `term`.
    pub leader: bool,
    /// The leader's id, when known.
    pub leader_id: Option<String>,
}

impl Leadership {
    /// Whether a decision made in `term` may still act: this node leads in that term.
    pub fn is_current(&self, term: Term) -> bool {
        self.leader && self.term == term
    }
}

/// The replicated ledger.
///
/// Contracts: `propose` returns once the entry is committed and applied, with the outcome
/// `apply` gave it; entries are applied in one order everywhere. An entry's term is its
/// proposer's (the term it read the state in); `apply` fences older terms. `read` runs `f` on
/// the committed state (on the leader: everything it committed so far). Proposals carry the
/// proposer's timestamp (`Entry::at`); the ledger adds none. `leadership` never goes back in
/// term.
pub trait Ledger: Send + Sync {
    fn propose(&self, entry: Entry) -> BoxFuture<'_, Result<Committed, LedgerError>>;

    /// Runs `f` on the committed state.
    fn read<'a>(&'a self, f: Box<dyn FnOnce(&State) + Send + 'a>) -> BoxFuture<'a, Result<(), LedgerError>>;

    /// The leadership watch.
    fn leadership(&self) -> watch::Receiver<Leadership>;
}

/// Reads a value out of the committed state.
pub async fn read_with<R: Send>(ledger: &dyn Ledger, f: impl FnOnce(&State) -> R + Send) -> Result<R, LedgerError> {
    let mut out = None;
    ledger.read(Box::new(|s| out = Some(f(s)))).await?;
    out.ok_or_else(|| LedgerError::Unavailable { reason: "the read did not run".into() })
}

/// Proposes `command` at `at` in the current leader's term: the convenience for callers that
/// act on no read (configuration, tests). Deciding actors carry the term they read in.
pub async fn propose_now(ledger: &dyn Ledger, at: Millis, command: Command) -> Result<Committed, LedgerError> {
    let term = ledger.leadership().borrow().term;
    ledger.propose(Entry { term, at, command }).await
}

/// The single-node ledger: applies each proposal at once. It is a one-node cluster that
/// leads in term 1; [`InProcess::elect`] starts a new term, as a failover would (tests of
/// fencing).
///
/// It keeps the state, not the log: nothing stores a single node's log, so a restart starts
/// from an empty ledger and adopts the NodeClaims the cluster shows, and a log kept in memory
/// would only grow with every decision round until the process ran out of memory.
/// [`InProcess::recording`] keeps the log, for tests that play a restart from a stored log
/// ([`InProcess::from_log`]).
pub struct InProcess {
    inner: Mutex<Inner>,
    leadership: watch::Sender<Leadership>,
}

#[derive(Default)]
struct Inner {
    state: State,
    /// Entries applied so far: the index of the last one.
    index: u64,
    /// The whole log, when recording (tests only).
    log: Option<Vec<Entry>>,
}

impl Default for InProcess {
    fn default() -> Self {
        InProcess::new()
    }
}

/// The term a fresh in-process ledger leads in.
pub const FIRST_TERM: Term = 1;

impl InProcess {
    /// A ledger that keeps its state only.
    pub fn new() -> Self {
        InProcess::replayed(Vec::new(), false)
    }

    /// A ledger that also keeps its whole log, so that a test can play a restart from it
    /// ([`InProcess::from_log`]). Its memory grows with every entry: never for a long run.
    pub fn recording() -> Self {
        InProcess::replayed(Vec::new(), true)
    }

    /// A ledger rebuilt by replaying `log` (what a restarted node does with its stored log);
    /// it goes on recording.
    pub fn from_log(log: Vec<Entry>) -> Self {
        InProcess::replayed(log, true)
    }

    fn replayed(log: Vec<Entry>, recording: bool) -> Self {
        let mut state = State::default();
        for e in &log {
            state.apply(e);
        }
        let term = state.term().max(FIRST_TERM);
        let (leadership, _) = watch::channel(Leadership { term, leader: true, leader_id: Some("local".into()) });
        let index = log.len() as u64;
        InProcess { inner: Mutex::new(Inner { state, index, log: recording.then_some(log) }), leadership }
    }

    /// The log so far, when recording (else empty).
    pub fn log(&self) -> Vec<Entry> {
        self.lock().log.clone().unwrap_or_default()
    }

    /// Entries held in memory: none unless recording.
    pub fn retained(&self) -> usize {
        self.lock().log.as_ref().map_or(0, Vec::len)
    }

    /// The index of the last entry applied.
    pub fn last_index(&self) -> u64 {
        self.lock().index
    }

    /// A new term begins with this node leading (a failover to a new leader, as far as the
    /// proposers of the old term can tell): its first entry fences the old term.
    pub fn elect(&self, at: Millis) -> Term {
        let term = self.leadership.borrow().term + 1;
        {
            let mut inner = self.lock();
            let entry = Entry { term, at, command: Command::Lead };
            inner.state.apply(&entry);
            inner.record(entry);
        }
        self.leadership.send_replace(Leadership { term, leader: true, leader_id: Some("local".into()) });
        term
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl Inner {
    /// Counts an applied entry (and keeps it, when recording).
    fn record(&mut self, entry: Entry) {
        self.index += 1;
        if let Some(log) = &mut self.log {
            log.push(entry);
        }
    }
}

impl Ledger for InProcess {
    fn propose(&self, entry: Entry) -> BoxFuture<'_, Result<Committed, LedgerError>> {
        Box::pin(async move {
            let mut inner = self.lock();
            let outcome = inner.state.apply(&entry);
            inner.record(entry);
            Ok(Committed { index: inner.index, outcome })
        })
    }

    fn read<'a>(&'a self, f: Box<dyn FnOnce(&State) + Send + 'a>) -> BoxFuture<'a, Result<(), LedgerError>> {
        Box::pin(async move {
            f(&self.lock().state);
            Ok(())
        })
    }

    fn leadership(&self) -> watch::Receiver<Leadership> {
        self.leadership.subscribe()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dovetail_core::ledger::{ClaimRequest, Command};
    use dovetail_core::resources::{ResourceList, ResourceName};

    fn reserve(term: Term, id: &str) -> Entry {
        Entry {
            term,
            at: 10,
            command: Command::Reserve {
                pool: "default".into(),
                claims: vec![ClaimRequest {
                    id: id.into(),
                    zone: "z".into(),
                    resources: ResourceList::cpu_mem(2000, 1 << 33),
                    price_per_hour: 100_000,
                }],
            },
        }
    }

    #[tokio::test]
    async fn proposals_commit_in_order_and_a_restart_replays_the_log() {
        let ledger = InProcess::recording();
        let limits = ResourceList::from_pairs([(ResourceName::Nodes, 1)]);
        let set = Command::SetPool { pool: "default".into(), limits };
        assert_eq!(propose_now(&ledger, 0, set).await.map(|c| c.index), Ok(1));
        let first = ledger.propose(reserve(FIRST_TERM, "a")).await.expect("committed");
        assert_eq!(first.outcome, Outcome::Reserved { granted: vec!["a".into()], denied: vec![] });
        let second = ledger.propose(reserve(FIRST_TERM, "b")).await.expect("committed");
        assert!(matches!(second.outcome, Outcome::Reserved { ref granted, .. } if granted.is_empty()));
        let before = read_with(&ledger, State::clone).await.expect("read");
        let restarted = InProcess::from_log(ledger.log());
        let after = read_with(&restarted, State::clone).await.expect("read");
        assert_eq!(before, after);
        assert!(after.claim("a").is_some() && after.claim("b").is_none());
    }

    #[tokio::test]
    async fn a_new_term_fences_the_old_one() {
        let ledger = InProcess::recording();
        propose_now(&ledger, 0, Command::SetPool { pool: "default".into(), limits: ResourceList::new() })
            .await
            .expect("pool");
        let watch = ledger.leadership();
        assert!(watch.borrow().is_current(FIRST_TERM));
        let term = ledger.elect(5);
        assert_eq!(term, FIRST_TERM + 1);
        assert!(!watch.borrow().is_current(FIRST_TERM), "the watch moved on");
        let stale = ledger.propose(reserve(FIRST_TERM, "a")).await.expect("committed");
        assert_eq!(stale.outcome, Outcome::Fenced { term });
        let state = read_with(&ledger, State::clone).await.expect("read");
        assert!(state.claims().is_empty(), "a fenced proposal changes nothing");
        let restarted = InProcess::from_log(ledger.log());
        assert_eq!(restarted.leadership().borrow().term, term, "a replay keeps the term");
    }

    #[tokio::test]
    async fn the_single_node_ledger_keeps_its_state_not_every_entry_it_ever_applied() {
        let ledger = InProcess::new();
        propose_now(&ledger, 0, Command::SetPool { pool: "default".into(), limits: ResourceList::new() })
            .await
            .expect("pool");
        // Weeks of decision rounds: each claim reserved, then gone.
        for i in 0..20_000u64 {
            let id = format!("c{i}");
            let reserved = ledger.propose(reserve(FIRST_TERM, &id)).await.expect("committed");
            assert!(matches!(reserved.outcome, Outcome::Reserved { ref granted, .. } if granted.len() == 1));
            let gone = Command::Advance { steps: vec![(id, dovetail_core::ledger::Step::Gone)] };
            propose_now(&ledger, i, gone).await.expect("committed");
        }
        assert_eq!(ledger.last_index(), 40_001, "every entry counted");
        assert_eq!(ledger.retained(), 0, "and none kept: nothing could read them back");
        let state = read_with(&ledger, State::clone).await.expect("read");
        assert!(state.claims().is_empty());
    }
}
