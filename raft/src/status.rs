//! What `dovetail ledger status` shows: one control node's view of the group and the ledger.

use std::collections::BTreeMap;

use dovetail_core::ledger::State;
use dovetail_core::resources::ResourceList;
use openraft::{Raft, ServerState};
use serde::{Deserialize, Serialize};

use crate::store::Machine;
use crate::types::{NodeId, TypeConfig};

/// A control node's view of the group and of the ledger it applied.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LedgerStatus {
    /// The node answering.
    pub node: NodeId,
    /// Its Raft role: leader, follower, candidate or learner.
    pub role: String,
    /// The leader it knows of.
    pub leader: Option<NodeId>,
    /// The term it is in.
    pub term: u64,
    /// The last entry in its log, the last one known committed, the last one applied.
    pub last_log_index: Option<u64>,
    /// The last entry it knows committed.
    pub committed_index: Option<u64>,
    /// The last entry its state machine applied.
    pub applied_index: Option<u64>,
    /// Where its last snapshot ends.
    pub snapshot_index: Option<u64>,
    /// The group's voters.
    pub members: Vec<NodeId>,
    /// Nodes receiving the log without a vote (a joining node while it catches up).
    #[serde(default)]
    pub learners: Vec<NodeId>,
    /// What the ledger it applied holds.
    #[serde(flatten)]
    pub ledger: LedgerContents,
}

/// What a control node's applied ledger holds.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LedgerContents {
    /// Claims by state (Reserved, Launching, Launched, Registered, Initialized, Terminating).
    pub claims: BTreeMap<String, usize>,
    /// Launch batches with a claim still launching.
    pub launch_batches: usize,
    /// Each NodePool's limits and what its claims hold.
    pub pools: BTreeMap<String, PoolStatus>,
    /// What every claim holds, and the $/hour spend.
    pub total: BTreeMap<String, i64>,
    /// The spend of every live claim, $/hour.
    pub price_per_hour: f64,
    /// Offerings marked unavailable (insufficient capacity), with when each mark ends (ms
    /// since the epoch on the proposers' clocks).
    pub unavailable: Vec<(String, u64)>,
}

/// A NodePool as the ledger holds it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PoolStatus {
    /// Its `spec.limits` (an absent resource is unlimited).
    pub limits: BTreeMap<String, i64>,
    /// What its live claims hold.
    pub usage: BTreeMap<String, i64>,
}

fn amounts(r: &ResourceList) -> BTreeMap<String, i64> {
    r.iter().map(|(n, v)| (n.as_str().to_string(), v)).collect()
}

impl LedgerContents {
    fn of(s: &State) -> LedgerContents {
        let mut claims: BTreeMap<String, usize> = BTreeMap::new();
        for c in s.claims().values() {
            *claims.entry(c.state.name().to_string()).or_default() += 1;
        }
        LedgerContents {
            claims,
            launch_batches: s.batches().len(),
            pools: s
                .pools()
                .iter()
                .map(|(name, p)| (name.clone(), PoolStatus { limits: amounts(&p.limits), usage: amounts(&p.usage) }))
                .collect(),
            total: amounts(s.total()),
            price_per_hour: s.total_price() as f64 / 1e6,
            unavailable: s.unavailable_marks(s.now()).map(|(o, until)| (o.to_string(), until)).collect(),
        }
    }
}

impl LedgerStatus {
    /// The status of `raft`'s node, with the state its machine applied.
    pub async fn of(raft: &Raft<TypeConfig>, machine: &Machine) -> LedgerStatus {
        let m = raft.metrics().borrow().clone();
        let committed = raft.with_raft_state(|s| s.committed).await.ok().flatten();
        let role = match m.state {
            ServerState::Leader => "leader",
            ServerState::Follower => "follower",
            ServerState::Candidate => "candidate",
            ServerState::Learner => "learner",
            ServerState::Shutdown => "shutdown",
        };
        LedgerStatus {
            node: m.id,
            role: role.to_string(),
            leader: m.current_leader,
            term: m.current_term,
            last_log_index: m.last_log_index,
            committed_index: committed.map(|l| l.index),
            applied_index: m.last_applied.map(|l| l.index),
            snapshot_index: m.snapshot.map(|l| l.index),
            members: m.membership_config.membership().voter_ids().collect(),
            learners: m.membership_config.membership().learner_ids().collect(),
            ledger: machine.read(|a| LedgerContents::of(&a.state)),
        }
    }

    /// The status as text, for people.
    pub fn render(&self) -> String {
        let opt = |v: Option<u64>| v.map_or_else(|| "-".to_string(), |v| v.to_string());
        let mut out = String::new();
        out.push_str(&format!(
            "node {} ({}), term {}, leader {}\n",
            self.node,
            self.role,
            self.term,
            self.leader.map_or_else(|| "unknown".to_string(), |l| l.to_string())
        ));
        if self.learners.is_empty() {
            out.push_str(&format!("members {:?}\n", self.members));
        } else {
            out.push_str(&format!("members {:?}, learners {:?}\n", self.members, self.learners));
        }
        out.push_str(&format!(
            "log: last {}, committed {}, applied {}, snapshot {}\n",
            opt(self.last_log_index),
            opt(self.committed_index),
            opt(self.applied_index),
            opt(self.snapshot_index)
        ));
        let claims: Vec<String> = self.ledger.claims.iter().map(|(s, n)| format!("{s} {n}")).collect();
        let total: usize = self.ledger.claims.values().sum();
        out.push_str(&format!(
            "claims: {total} ({})\n",
            if claims.is_empty() { "none".into() } else { claims.join(", ") }
        ));
        out.push_str(&format!("launch batches in flight: {}\n", self.ledger.launch_batches));
        for (name, p) in &self.ledger.pools {
            let show = |m: &BTreeMap<String, i64>| {
                if m.is_empty() {
                    "-".to_string()
                } else {
                    m.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(" ")
                }
            };
            out.push_str(&format!("nodepool {name}: usage {} / limits {}\n", show(&p.usage), show(&p.limits)));
        }
        out.push_str(&format!("spend: ${:.4}/hour\n", self.ledger.price_per_hour));
        if self.ledger.unavailable.is_empty() {
            out.push_str("ICE marks: none\n");
        } else {
            for (o, until) in &self.ledger.unavailable {
                out.push_str(&format!("ICE mark: {o} until {until}\n"));
            }
        }
        out
    }
}
