//! The ledger seam: the async [`Ledger`] the actors propose to, over the pure state machine in
//! `dovetail_core::ledger`. [`InProcess`] is the single-node ledger (`simulate`, small
//! clusters, tests); the openraft ledger implements the same trait, so it drops in without
//! touching the actors.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Mutex, MutexGuard};

use dovetail_core::ledger::{Entry, Outcome, State};

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

/// The replicated ledger.
///
/// Contracts: `propose` returns once the entry is committed and applied, with the outcome
/// `apply` gave it; entries are applied in one order everywhere. `read` runs `f` on the
/// committed state (on the leader: everything it committed so far). Proposals carry the
/// proposer's timestamp (`Entry::at`); the ledger adds none.
pub trait Ledger: Send + Sync {
    fn propose(&self, entry: Entry) -> BoxFuture<'_, Result<Committed, LedgerError>>;

    /// Reads the committed state.
    fn read(&self, f: &mut (dyn FnMut(&State) + Send)) -> Result<(), LedgerError>;
}

/// The single-node ledger: applies each proposal at once and keeps the log, so a restart can
/// replay it ([`InProcess::from_log`]).
#[derive(Default)]
pub struct InProcess {
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    state: State,
    log: Vec<Entry>,
}

impl InProcess {
    pub fn new() -> Self {
        InProcess::default()
    }

    /// A ledger rebuilt by replaying `log` (what a restarted node does with its stored log).
    pub fn from_log(log: Vec<Entry>) -> Self {
        let mut state = State::default();
        for e in &log {
            state.apply(e);
        }
        InProcess { inner: Mutex::new(Inner { state, log }) }
    }

    /// The log so far.
    pub fn log(&self) -> Vec<Entry> {
        self.lock().log.clone()
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl Ledger for InProcess {
    fn propose(&self, entry: Entry) -> BoxFuture<'_, Result<Committed, LedgerError>> {
        Box::pin(async move {
            let mut inner = self.lock();
            let outcome = inner.state.apply(&entry);
            inner.log.push(entry);
            Ok(Committed { index: inner.log.len() as u64, outcome })
        })
    }

    fn read(&self, f: &mut (dyn FnMut(&State) + Send)) -> Result<(), LedgerError> {
        f(&self.lock().state);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dovetail_core::ledger::{ClaimRequest, Command};
    use dovetail_core::resources::{ResourceList, ResourceName};

    fn reserve(id: &str) -> Entry {
        Entry {
            at: 10,
            command: Command::Reserve {
                pool: "default".into(),
                batch: 1,
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
        let ledger = InProcess::new();
        let set = Entry {
            at: 0,
            command: Command::SetPool {
                pool: "default".into(),
                limits: ResourceList::from_pairs([(ResourceName::Nodes, 1)]),
            },
        };
        assert_eq!(ledger.propose(set).await.map(|c| c.index), Ok(1));
        let first = ledger.propose(reserve("a")).await.expect("committed");
        assert_eq!(first.outcome, Outcome::Reserved { granted: vec!["a".into()], denied: vec![] });
        let second = ledger.propose(reserve("b")).await.expect("committed");
        assert!(matches!(second.outcome, Outcome::Reserved { ref granted, .. } if granted.is_empty()));
        let mut before = None;
        ledger.read(&mut |s| before = Some(s.clone())).expect("read");
        let restarted = InProcess::from_log(ledger.log());
        let mut after = None;
        restarted.read(&mut |s| after = Some(s.clone())).expect("read");
        assert_eq!(before, after);
        assert!(after.is_some_and(|s| s.claim("a").is_some() && s.claim("b").is_none()));
    }
}
