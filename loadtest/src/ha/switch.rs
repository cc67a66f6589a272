//! The ledger the plane of a simulation with several control nodes uses: whichever node
//! leads. Its leadership watch is the group's: the leading node's (the later term, if two say
//! so for a moment), or the latest term any running node is in, leading nothing; it never goes
//! back in term. It follows the nodes' own watches through a task each, so it trails them by
//! one scheduling turn: an effect checked against it in that turn acts on an intent the
//! leader had committed in its term, as a controller's effect within its lease does.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use dovetail_core::clock::Clock;
use dovetail_core::ledger::{Command, Entry, Outcome, State};
use dovetail_raft::replicated::RaftLedger;
use dovetail_raft::types::NodeId;
use dovetail_raft::{BoxFuture, Committed, Leadership, Ledger, LedgerError};
use tokio::sync::watch;

use super::lock;

/// The ledger of whichever node leads.
pub struct Switch {
    /// The nodes running now.
    pub(super) running: Mutex<BTreeMap<NodeId, Arc<RaftLedger>>>,
    /// The group's leadership, as the plane sees it.
    pub(super) leadership: watch::Sender<Leadership>,
    /// The clock decisions are timed on.
    clock: Arc<dyn Clock>,
    /// When each term's first provisioning decision committed (ms of the clock).
    pub(super) first_reserve: Mutex<BTreeMap<u64, u64>>,
    /// Proposals the leader fenced (made in a term that was over).
    pub(super) fenced: Mutex<u64>,
}

impl Switch {
    pub(super) fn new(clock: Arc<dyn Clock>) -> Arc<Switch> {
        let (leadership, _) = watch::channel(Leadership { term: 0, leader: false, leader_id: None });
        Arc::new(Switch {
            running: Mutex::new(BTreeMap::new()),
            leadership,
            clock,
            first_reserve: Mutex::new(BTreeMap::new()),
            fenced: Mutex::new(0),
        })
    }

    /// The node that leads with its `Lead` committed, if any.
    pub(super) fn leader(&self) -> Option<(NodeId, Arc<RaftLedger>)> {
        // Two nodes may both say so for a moment (the old one's lease not yet out): the later
        // term is the leader.
        lock(&self.running)
            .iter()
            .filter(|(_, l)| l.leadership().borrow().leader)
            .max_by_key(|(_, l)| l.leadership().borrow().term)
            .map(|(id, l)| (*id, l.clone()))
    }

    /// Publishes the group's leadership: the leading node's, else the latest term any running
    /// node is in, leading nothing. Never goes back in term.
    fn refresh(&self) {
        let views: Vec<Leadership> = lock(&self.running).values().map(|l| l.leadership().borrow().clone()).collect();
        self.leadership.send_if_modified(|cur| {
            let next = match views.iter().filter(|l| l.leader).max_by_key(|l| l.term) {
                Some(l) if l.term >= cur.term => l.clone(),
                _ => {
                    let term = views.iter().map(|l| l.term).max().unwrap_or(0).max(cur.term);
                    Leadership { term, leader: false, leader_id: None }
                }
            };
            if *cur == next {
                false
            } else {
                *cur = next;
                true
            }
        });
    }

    pub(super) fn add(self: &Arc<Switch>, id: NodeId, ledger: Arc<RaftLedger>) {
        let mut rx = ledger.leadership();
        lock(&self.running).insert(id, ledger);
        let switch = Arc::downgrade(self);
        tokio::spawn(async move {
            // Follows the node until it stops (its watch closes) or the run ends.
            while rx.changed().await.is_ok() {
                let Some(s) = switch.upgrade() else { return };
                s.refresh();
            }
        });
        self.refresh();
    }

    pub(super) fn remove(&self, id: NodeId) -> Option<Arc<RaftLedger>> {
        let gone = lock(&self.running).remove(&id);
        self.refresh();
        gone
    }

    fn now_ms(&self) -> u64 {
        self.clock.now_millis()
    }
}

impl Ledger for Switch {
    fn propose(&self, entry: Entry) -> BoxFuture<'_, Result<Committed, LedgerError>> {
        Box::pin(async move {
            let Some((_, ledger)) = self.leader() else {
                return Err(LedgerError::NotLeader { leader: None });
            };
            let (term, reserve) = (entry.term, matches!(entry.command, Command::Reserve { .. }));
            let committed = ledger.propose(entry).await?;
            match &committed.outcome {
                Outcome::Fenced { .. } => *lock(&self.fenced) += 1,
                Outcome::Reserved { .. } if reserve => {
                    let now = self.now_ms();
                    lock(&self.first_reserve).entry(term).or_insert(now);
                }
                _ => {}
            }
            Ok(committed)
        })
    }

    fn read<'a>(&'a self, f: Box<dyn FnOnce(&State) + Send + 'a>) -> BoxFuture<'a, Result<(), LedgerError>> {
        Box::pin(async move {
            // The leader's state; with none, the most advanced running node's (what a plane
            // decides on it is fenced or refused when proposed).
            let ledger = match self.leader() {
                Some((_, l)) => l,
                None => {
                    let running = lock(&self.running).values().cloned().collect::<Vec<_>>();
                    let best = running.into_iter().max_by_key(|l| l.machine().read(|a| a.last_applied));
                    best.ok_or_else(|| LedgerError::Unavailable { reason: "no control node is running".into() })?
                }
            };
            ledger.read(f).await
        })
    }

    fn leadership(&self) -> watch::Receiver<Leadership> {
        self.leadership.subscribe()
    }
}
