//! `simulate --control-nodes N [--kill-leader-every D] [--raft-loss P] [--raft-max-delay D]`:
//! the ledger replicated over N Raft nodes in this process (stores in memory, messages over
//! the in-memory network with the faults asked for), on the run's virtual time, with the
//! leader killed every D and brought back from its stores.
//!
//! The plane talks to the group through a [`Switch`]: the ledger of whichever node leads.
//! Its leadership watch is the group's, so the plane's effects stop the moment the leader
//! dies, and a proposal of the dead leader's term that reaches the next leader is fenced.
//! When a node leads in a new term, the driver restarts every actor of the plane in place:
//! each starts again from the ledger and the cluster. That is close to the fresh actors a new
//! `dovetail controller` leader starts on an arbiter of its own, not the same: a restarted
//! zone actor keeps the launches it had queued and proposes them again under the new term
//! (fenced like any other proposal), where a new leader re-drives them from the registry.
//! Each failover is reported: when the leader was killed, when the next one's `Lead`
//! committed, and when its first new claims committed, if pods were pending then.

mod launches;
mod switch;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use dovetail_core::clock::Clock;
use dovetail_core::ledger::Millis;
use dovetail_raft::Ledger;
use dovetail_raft::network::{Faults, MemNet, Transport};
use dovetail_raft::replicated::{RaftLedger, RaftSettings};
use dovetail_raft::store::{LogStore, Machine};
use dovetail_raft::types::NodeId;
use serde::Serialize;

pub use launches::Launches;
pub use switch::Switch;

/// How the control nodes run.
#[derive(Clone, Debug, PartialEq)]
pub struct ControlNodes {
    /// How many (3 or 5 survive the loss of one or two).
    pub count: usize,
    /// Kill the leader this often (ms of the run's clock), if at all.
    pub kill_every_ms: Option<u64>,
    /// A killed node starts again from its stores this long after (ms).
    pub restart_after_ms: u64,
    /// The in-memory network's seed.
    pub seed: u64,
    /// The chance that a Raft message (or its reply) is lost, from 0 to 0.5.
    pub loss: f64,
    /// Each Raft message waits a random time up to this (ms) before delivery, so messages
    /// reorder.
    pub max_delay_ms: u64,
}

impl ControlNodes {
    /// `count` nodes, the leader killed every `kill_every_ms`, a killed node back after 10 s.
    pub fn new(count: usize, kill_every_ms: Option<u64>) -> ControlNodes {
        ControlNodes { count, kill_every_ms, restart_after_ms: 10_000, seed: 1, loss: 0.0, max_delay_ms: 0 }
    }

    /// Whether this shape can run: at least one node; kills need a majority left (3 or more).
    pub fn check(&self) -> Result<(), String> {
        if self.count == 0 {
            return Err("--control-nodes: at least 1".into());
        }
        if self.count > 9 {
            return Err(format!("--control-nodes {}: at most 9", self.count));
        }
        if self.kill_every_ms.is_some() && self.count < 3 {
            return Err(format!(
                "--kill-leader-every needs --control-nodes 3 or more (with {}, a kill leaves no majority)",
                self.count
            ));
        }
        if !(0.0..=0.5).contains(&self.loss) {
            return Err(format!("--raft-loss {}: between 0 and 0.5", self.loss));
        }
        if self.max_delay_ms > 1_000 {
            return Err(format!("--raft-max-delay {} ms: at most 1s", self.max_delay_ms));
        }
        if self.kill_every_ms.is_some_and(|k| k <= self.restart_after_ms) {
            return Err(format!(
                "--kill-leader-every must be longer than the {} s a killed node takes to come back",
                self.restart_after_ms / 1000
            ));
        }
        Ok(())
    }
}

/// One failover, as the report shows it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Failover {
    /// The node killed and the term it led in.
    pub killed: NodeId,
    pub from_term: u64,
    /// When it was killed (ms into the run).
    pub killed_at_ms: u64,
    /// The node that led next, and in which term.
    pub leader: Option<NodeId>,
    pub to_term: Option<u64>,
    /// From the kill to the next leader's `Lead` committed.
    pub lead_after_ms: Option<u64>,
    /// From the kill to the next leader's first new claims committed (its first provisioning
    /// decision), when pods were pending as it took over. None when none were, or when the
    /// claims the dead leader made already covered them (nothing new to decide).
    pub decision_after_ms: Option<u64>,
    /// Pods pending when the next leader took over.
    pub pending_at_lead: usize,
    /// When the next leader took over (ms into the run).
    #[serde(skip)]
    led_at_ms: u64,
}

/// The control nodes' part of the report.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct ControlReport {
    pub nodes: usize,
    pub kill_every_ms: Option<u64>,
    /// Terms a node led in (the first election included).
    pub terms_led: usize,
    /// Of those, terms begun without a kill (a leader deposed by an election it did not
    /// lose to a kill: a node back from its stores calling one).
    pub elections_without_kill: usize,
    pub failovers: Vec<Failover>,
    /// The time to a new leader over the failovers: median, 99th percentile and largest.
    pub lead_after_p50_ms: Option<u64>,
    pub lead_after_p99_ms: Option<u64>,
    pub max_lead_after_ms: Option<u64>,
    /// The largest time to a new leader's first new claims.
    pub max_decision_after_ms: Option<u64>,
    /// Proposals of a dead leader's term that the next leader fenced.
    pub fenced: u64,
    /// Raft messages sent, and lost to the network's faults (messages to a dead node are
    /// not counted lost: they fail at once, as a refused connection does).
    pub messages: u64,
    pub messages_lost: u64,
    /// Claims the cloud had more than one instance for over the run (looked at every tick,
    /// terminated instances included; must be zero). A claim is a name and the moment the
    /// ledger reserved it: a name is five random characters, and a later claim may take the
    /// name of one long gone, as `generateName` may in Kubernetes.
    pub claims_launched_twice: usize,
    /// Which, with their instances (at most ten).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub launched_twice: Vec<String>,
    /// Names that served more than one claim over the run (each time after the earlier claim
    /// was gone: the ledger refuses a live duplicate).
    pub names_reused: usize,
    /// Instances whose claim the ledger did not hold when they were first seen (neither a
    /// second launch nor a reused name can be told for those).
    pub instances_unattributed: usize,
    /// Leases that ran out in a term still led, over every node (killed ones included): a
    /// leader that heard no quorum for its lease (a stalled thread, lost messages). A kill is
    /// not one (the killed node stops at once).
    pub lease_lapses: u64,
    pub longest_lapse_ms: u64,
    /// Whether Raft ran on a thread of its own (on the wall clock; on virtual time it shares
    /// the run's, whose clock only moves when every task waits).
    pub own_thread: bool,
}

/// The group's timing: a failover well inside a second, as in production.
fn settings() -> RaftSettings {
    RaftSettings::default()
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A node's stores: its disk, which outlives its process.
struct Stores {
    log: LogStore,
    machine: Machine,
}

/// The control nodes of a run.
pub struct Group {
    shape: ControlNodes,
    net: Arc<MemNet>,
    stores: BTreeMap<NodeId, Stores>,
    /// Killed nodes and when each starts again (ms into the run).
    down: BTreeMap<NodeId, u64>,
    switch: Arc<Switch>,
    clock: Arc<dyn Clock>,
    /// The run's start on the clock (ms), for times into the run.
    start_ms: u64,
    next_kill_ms: Option<u64>,
    failovers: Vec<Failover>,
    /// The last term a node led in, and how many terms were led.
    last_led: u64,
    terms_led: usize,
    /// When the last term's leader took over (ms into the run).
    led_at_ms: u64,
    /// Every instance the cloud had for each claim over the run, terminated ones included.
    launches: Launches,
    /// The lease counts of nodes killed since (their replicas are gone).
    retired: dovetail_raft::replicated::LeaseStats,
    /// Whether each node's Raft runs on a thread of its own (the wall clock).
    own_thread: bool,
    /// Those threads, by node (a restarted node runs on its own again).
    runtimes: BTreeMap<NodeId, Arc<dovetail_raft::runtime::RaftRuntime>>,
}

/// What [`Group::on_leadership`] saw.
pub enum Turn {
    /// The same term, or nobody leads yet.
    Same,
    /// A node leads in a new term: the plane must start again from the seams.
    NewTerm(u64),
}

impl Group {
    /// Starts the nodes, makes the group and waits (at most 30 s of the clock) for its first
    /// leader. With `own_thread` (a run on the wall clock) each node's Raft runs on a thread of
    /// its own, as each controller's does, so that a busy plane or world (or another node's
    /// snapshot) does not delay its heartbeats; on virtual time they share the run's thread
    /// (its clock moves only when every task waits).
    pub async fn start(
        shape: ControlNodes,
        clock: Arc<dyn Clock>,
        start_ms: u64,
        own_thread: bool,
    ) -> Result<Group, String> {
        shape.check()?;
        let net = MemNet::new(shape.seed);
        let switch = Switch::new(clock.clone());
        let mut group = Group {
            next_kill_ms: shape.kill_every_ms,
            shape,
            net,
            stores: BTreeMap::new(),
            down: BTreeMap::new(),
            switch,
            clock,
            start_ms,
            failovers: Vec::new(),
            last_led: 0,
            terms_led: 0,
            led_at_ms: 0,
            launches: Launches::default(),
            retired: Default::default(),
            own_thread,
            runtimes: BTreeMap::new(),
        };
        group.net.set_faults(Faults {
            loss: group.shape.loss,
            max_delay: Duration::from_millis(group.shape.max_delay_ms),
            ..Faults::default()
        });
        let ids: Vec<NodeId> = (1..=group.shape.count as NodeId).collect();
        for id in &ids {
            let log = LogStore::in_memory().map_err(|e| format!("control node {id}: its log: {e}"))?;
            group.stores.insert(*id, Stores { log, machine: Machine::in_memory() });
            group.boot(*id).await?;
        }
        let members = ids.iter().map(|id| (*id, format!("memory-{id}"))).collect();
        let first = lock(&group.switch.running).get(&1).cloned().ok_or("control node 1 did not start")?;
        first.initialize(members).await.map_err(|e| format!("making the group: {e}"))?;
        let mut watch = group.switch.leadership();
        let elected = tokio::time::timeout(Duration::from_secs(30), watch.wait_for(|l| l.leader)).await;
        match elected {
            Ok(Ok(_)) => Ok(group),
            Ok(Err(_)) | Err(_) => Err("the control nodes elected no leader within 30 s".into()),
        }
    }

    /// The ledger the plane uses.
    pub fn ledger(&self) -> Arc<Switch> {
        self.switch.clone()
    }

    async fn boot(&mut self, id: NodeId) -> Result<(), String> {
        let stores = self.stores.get(&id).ok_or_else(|| format!("control node {id} has no stores"))?;
        let transport: Arc<dyn Transport> = self.net.clone();
        let (log, machine, clock) = (stores.log.clone(), stores.machine.clone(), self.clock.clone());
        let start = async move { RaftLedger::start(id, &settings(), log, machine, transport, clock).await };
        let runtime = match (self.own_thread, self.runtimes.get(&id)) {
            (false, _) => None,
            (true, Some(rt)) => Some(rt.clone()),
            (true, None) => {
                let rt = dovetail_raft::runtime::RaftRuntime::start()
                    .map_err(|e| format!("control node {id}: its raft thread: {e}"))?;
                let rt = Arc::new(rt);
                self.runtimes.insert(id, rt.clone());
                Some(rt)
            }
        };
        let ledger = match runtime {
            Some(rt) => rt.run(start).await?,
            None => start.await,
        }
        .map_err(|e| format!("control node {id}: {e}"))?;
        self.net.join(id, ledger.raft().clone());
        self.switch.add(id, Arc::new(ledger));
        Ok(())
    }

    fn ms(&self) -> u64 {
        self.clock.now_millis().saturating_sub(self.start_ms)
    }

    /// Kills the leader when it is time, and starts killed nodes again when theirs is.
    pub async fn step(&mut self) -> Result<(), String> {
        let now = self.ms();
        let due: Vec<NodeId> = self.down.iter().filter(|(_, at)| **at <= now).map(|(id, _)| *id).collect();
        for id in due {
            self.down.remove(&id);
            if let Some(s) = self.stores.get_mut(&id) {
                // What a restart finds: the log, and the machine's last snapshot.
                s.machine = s.machine.restarted().map_err(|e| format!("control node {id} restarting: {e}"))?;
            }
            self.boot(id).await?;
            tracing::info!(node = id, "ledger.sim: control node back from its stores");
        }
        let Some(at) = self.next_kill_ms.filter(|at| *at <= now) else { return Ok(()) };
        self.next_kill_ms = self.shape.kill_every_ms.map(|every| at.saturating_add(every));
        let Some((id, leader)) = self.switch.leader() else {
            tracing::info!("ledger.sim: no leader to kill this time");
            return Ok(());
        };
        let term = leader.leadership().borrow().term;
        self.net.leave(id);
        if let Some(ledger) = self.switch.remove(id) {
            ledger.shutdown().await;
            // Its lease counts go with it otherwise.
            let stats = ledger.lease_stats();
            self.retired.lapses += stats.lapses;
            self.retired.longest_lapse_ms = self.retired.longest_lapse_ms.max(stats.longest_lapse_ms);
        }
        self.down.insert(id, now.saturating_add(self.shape.restart_after_ms));
        tracing::info!(node = id, raft.term = term, "ledger.sim: leader killed");
        self.failovers.push(Failover { killed: id, from_term: term, killed_at_ms: now, ..Failover::default() });
        Ok(())
    }

    /// Notes the instances the cloud has now, by claim (a claim launched twice shows as two).
    /// A new instance's claim is looked up in the leader's state (else the most advanced
    /// node's), which holds it from before its launch call.
    pub fn observe<'a>(&mut self, instances: impl IntoIterator<Item = (&'a str, &'a str)>) {
        // Every tick sees mostly the same instances: nothing is allocated for those.
        let new: Vec<(&str, &str)> = instances.into_iter().filter(|(_, id)| !self.launches.has(id)).collect();
        if new.is_empty() {
            return;
        }
        let reserved: Vec<Option<Millis>> =
            self.read_state(|state| new.iter().map(|(claim, _)| state.claim(claim).map(|c| c.reserved_at)).collect());
        for ((claim, id), at) in new.iter().zip(reserved) {
            self.launches.note(claim, at, id);
        }
    }

    /// Runs `f` on the state of the leader, or else of the node that applied the most.
    fn read_state<R>(&self, f: impl FnOnce(&dovetail_core::ledger::State) -> R) -> R {
        if let Some((_, leader)) = self.switch.leader() {
            return leader.machine().read(|a| f(&a.state));
        }
        let newest = self.stores.values().max_by_key(|s| s.machine.read(|a| a.last_applied.map(|l| l.index)));
        match newest {
            Some(s) => s.machine.read(|a| f(&a.state)),
            None => f(&dovetail_core::ledger::State::default()),
        }
    }

    /// Looks at the group's leadership: a new term led calls for a fresh plane. `pending` is
    /// how many pods wait, for the report.
    pub fn on_leadership(&mut self, pending: usize) -> Turn {
        let l = self.switch.leadership.borrow().clone();
        if !l.leader || l.term <= self.last_led {
            return Turn::Same;
        }
        self.last_led = l.term;
        self.terms_led += 1;
        let now = self.ms();
        self.led_at_ms = now;
        let leader = l.leader_id.as_deref().and_then(|s| s.parse().ok());
        if let Some(f) = self.failovers.last_mut().filter(|f| f.to_term.is_none()) {
            f.to_term = Some(l.term);
            f.leader = leader;
            f.lead_after_ms = Some(now.saturating_sub(f.killed_at_ms));
            f.pending_at_lead = pending;
            f.led_at_ms = now;
        }
        Turn::NewTerm(l.term)
    }

    /// The report's part. A new leader's first new claims count as its decision when they
    /// commit within `window_ms` (the batch window's longest) of its taking over: later ones
    /// answer pods that came later.
    pub fn report(&self, window_ms: u64) -> ControlReport {
        let first = lock(&self.switch.first_reserve).clone();
        let failovers: Vec<Failover> = self
            .failovers
            .iter()
            .map(|f| {
                let mut f = f.clone();
                if f.pending_at_lead > 0 {
                    f.decision_after_ms = f
                        .to_term
                        .and_then(|t| first.get(&t))
                        .map(|at| at.saturating_sub(self.start_ms))
                        .filter(|at| *at <= f.led_at_ms.saturating_add(window_ms))
                        .map(|at| at.saturating_sub(f.killed_at_ms));
                }
                f
            })
            .collect();
        let (messages, messages_lost) = self.net.counts();
        let mut leads: Vec<u64> = failovers.iter().filter_map(|f| f.lead_after_ms).collect();
        leads.sort_unstable();
        let at = |q: f64| {
            let i = ((leads.len() as f64 * q).ceil() as usize).clamp(1, leads.len().max(1)) - 1;
            leads.get(i).copied()
        };
        let after_kill = failovers.iter().filter(|f| f.to_term.is_some()).count();
        let (mut lease_lapses, mut longest_lapse_ms) = (self.retired.lapses, self.retired.longest_lapse_ms);
        for l in lock(&self.switch.running).values() {
            let stats = l.lease_stats();
            lease_lapses += stats.lapses;
            longest_lapse_ms = longest_lapse_ms.max(stats.longest_lapse_ms);
        }
        ControlReport {
            lease_lapses,
            longest_lapse_ms,
            own_thread: self.own_thread,
            nodes: self.shape.count,
            kill_every_ms: self.shape.kill_every_ms,
            terms_led: self.terms_led,
            elections_without_kill: self.terms_led.saturating_sub(1).saturating_sub(after_kill),
            lead_after_p50_ms: at(0.5),
            lead_after_p99_ms: at(0.99),
            max_lead_after_ms: failovers.iter().filter_map(|f| f.lead_after_ms).max(),
            max_decision_after_ms: failovers.iter().filter_map(|f| f.decision_after_ms).max(),
            failovers,
            fenced: *lock(&self.switch.fenced),
            messages,
            messages_lost,
            claims_launched_twice: self.launches.twice().count(),
            launched_twice: self.launches.twice().take(10).collect(),
            names_reused: self.launches.names_reused(),
            instances_unattributed: self.launches.unattributed(),
        }
    }

    /// Stops every node.
    pub async fn stop(&self) {
        let running: Vec<Arc<RaftLedger>> = lock(&self.switch.running).values().cloned().collect();
        for l in running {
            l.shutdown().await;
        }
    }
}
