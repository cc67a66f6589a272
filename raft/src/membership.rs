//! Membership changes of a running group: a node joins (it is added as a learner, catches up
//! on the log, then becomes a voter) or is removed (from the voters and the group). Both run on
//! the leader, one at a time, as openraft's joint-consensus changes: the group keeps a quorum of
//! both the old and the new voters until the change commits, so a failure half-way loses
//! nothing. A node that is not the leader answers with the leader it knows of
//! ([`MembershipError::NotLeader`]), so a caller can ask there.
//!
//! A node's id and address go together: a voter or learner is not moved to another address in
//! place (remove it, then join it at the new one), and a node that lost its disk comes back
//! the same way (docs/ha.md).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use openraft::error::{ChangeMembershipError, ClientWriteError, RaftError};
use openraft::{BasicNode, ChangeMembers, Raft, ServerState};
use serde::{Deserialize, Serialize};

use crate::BoxFuture;
use crate::types::{NodeId, TypeConfig};

/// Whether the node with this id, at this Raft address, answers now (the leader asks each
/// voter of the group a change would leave; over HTTP, its status endpoint).
pub type Probe = std::sync::Arc<dyn Fn(NodeId, String) -> BoxFuture<'static, bool> + Send + Sync>;

/// The longest catch-up a join may ask for.
pub const MAX_CATCH_UP: Duration = Duration::from_secs(3600);

/// A change of the group's members.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MembershipRequest {
    /// Adds node `id`, serving Raft at `addr`, as a voter (first as a learner until it has
    /// caught up, for at most `catch_up_ms`).
    Join { id: NodeId, addr: String, catch_up_ms: u64 },
    /// Removes node `id` from the group (voter or learner).
    Remove { id: NodeId },
}

/// The group after a change, as its leader sees it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Members {
    /// The node that made the change.
    pub leader: NodeId,
    /// Voters and their Raft addresses.
    pub voters: BTreeMap<NodeId, String>,
    /// Learners (nodes receiving the log without a vote) and their addresses.
    pub learners: BTreeMap<NodeId, String>,
    /// Whether the request changed anything (a repeated join or remove does not).
    pub changed: bool,
}

/// Why a membership change was not made.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[serde(rename_all = "snake_case")]
pub enum MembershipError {
    /// The node asked does not lead; ask the leader (its id and address, when known).
    #[error("node {node} is not the leader (leader: {})", leader.map_or_else(|| "unknown".to_string(), |l| format!("{l} at {}", addr.as_deref().unwrap_or("?"))))]
    NotLeader { node: NodeId, leader: Option<NodeId>, addr: Option<String> },
    /// The change is not allowed as asked (the message says what to do instead).
    #[error("{reason}")]
    Refused { reason: String },
    /// The change could not be made now (no quorum, another change running, the learner
    /// not catching up); retrying later may succeed.
    #[error("{reason}")]
    Unavailable { reason: String },
}

/// How long a change may take to commit once the learner caught up (a leader without a
/// quorum never commits).
pub const COMMIT_TIMEOUT: Duration = Duration::from_secs(30);

/// The group as node `raft` sees it (its effective membership), made by `leader`.
fn members(raft: &Raft<TypeConfig>, leader: NodeId, changed: bool) -> Members {
    let m = raft.metrics().borrow().clone();
    let membership = m.membership_config.membership();
    let voters: BTreeSet<NodeId> = membership.voter_ids().collect();
    let (mut v, mut l) = (BTreeMap::new(), BTreeMap::new());
    for (id, node) in membership.nodes() {
        if voters.contains(id) { &mut v } else { &mut l }.insert(*id, node.addr.clone());
    }
    Members { leader, voters: v, learners: l, changed }
}

/// This node's id and its view of the group if it leads; who leads instead otherwise.
fn leading(raft: &Raft<TypeConfig>) -> Result<(NodeId, Members), MembershipError> {
    let m = raft.metrics().borrow().clone();
    if m.state != ServerState::Leader || m.current_leader != Some(m.id) {
        let membership = m.membership_config.membership();
        return Err(MembershipError::NotLeader {
            node: m.id,
            leader: m.current_leader,
            addr: m.current_leader.and_then(|l| membership.get_node(&l).map(|n| n.addr.clone())),
        });
    }
    Ok((m.id, members(raft, m.id, false)))
}

fn write_error(me: NodeId, e: RaftError<NodeId, ClientWriteError<NodeId, BasicNode>>) -> MembershipError {
    match e {
        RaftError::APIError(ClientWriteError::ForwardToLeader(f)) => {
            MembershipError::NotLeader { node: me, leader: f.leader_id, addr: f.leader_node.map(|n| n.addr) }
        }
        RaftError::APIError(ClientWriteError::ChangeMembershipError(ChangeMembershipError::InProgress(p))) => {
            MembershipError::Unavailable { reason: format!("another membership change is still running ({p}); retry") }
        }
        RaftError::APIError(ClientWriteError::ChangeMembershipError(e)) => {
            MembershipError::Refused { reason: e.to_string() }
        }
        RaftError::Fatal(f) => MembershipError::Unavailable { reason: format!("the raft node stopped: {f}") },
    }
}

async fn bounded<T>(
    me: NodeId,
    what: String,
    limit: Duration,
    f: impl std::future::Future<Output = Result<T, RaftError<NodeId, ClientWriteError<NodeId, BasicNode>>>>,
) -> Result<T, MembershipError> {
    match tokio::time::timeout(limit, f).await {
        Ok(r) => r.map_err(|e| write_error(me, e)),
        Err(_) => Err(MembershipError::Unavailable { reason: format!("{what} did not finish within {limit:?}") }),
    }
}

/// Finishes a change left half-way (a leader that died between the joint and the final
/// config: openraft's next leader keeps the joint one): commits the final config. Whether
/// there was one.
async fn finish_joint(raft: &Raft<TypeConfig>, me: NodeId) -> Result<bool, MembershipError> {
    let last = {
        let m = raft.metrics().borrow().clone();
        let joint = m.membership_config.membership().get_joint_config().clone();
        if joint.len() < 2 {
            return Ok(false);
        }
        joint.last().cloned().unwrap_or_default()
    };
    tracing::warn!(node = me, voters = ?last, "ledger.membership: finishing a change left half-way");
    let finish = raft.change_membership(ChangeMembers::ReplaceAllVoters(last), false);
    bounded(me, "finishing the change left half-way".into(), COMMIT_TIMEOUT, finish).await?;
    Ok(true)
}

/// Refuses a change after which fewer than a majority of the voters would answer: the joint
/// config needs a majority of the new voters too, so such a change would commit nothing more
/// (its own entry included) until the silent ones came back.
async fn check_quorum(me: NodeId, voters: &BTreeMap<NodeId, String>, probe: &Probe) -> Result<(), MembershipError> {
    let mut silent = Vec::new();
    for (id, addr) in voters {
        if *id != me && !probe(*id, addr.clone()).await {
            silent.push(*id);
        }
    }
    if (voters.len() - silent.len()) * 2 > voters.len() {
        return Ok(());
    }
    Err(MembershipError::Refused {
        reason: format!(
            "after the change the voters would be {:?}, and {silent:?} do not answer: without a majority of them \
             the group could commit nothing more. Bring them back first",
            voters.keys().collect::<Vec<_>>()
        ),
    })
}

/// Makes the change on this node, which must lead. A change left half-way is finished first;
/// one that would leave fewer than a majority of the voters answering (`probe`) is refused.
pub async fn change(
    raft: &Raft<TypeConfig>,
    request: &MembershipRequest,
    probe: &Probe,
) -> Result<Members, MembershipError> {
    let (me, _) = leading(raft)?;
    let finished = finish_joint(raft, me).await?;
    let (me, before) = leading(raft)?;
    let unchanged = |m: Members| Members { changed: finished, ..m };
    match request {
        MembershipRequest::Join { id, addr, catch_up_ms } => {
            let known = before.voters.get(id).or_else(|| before.learners.get(id));
            if let Some(at) = known.filter(|at| *at != addr) {
                return Err(MembershipError::Refused {
                    reason: format!(
                        "node {id} is a member at {at}, not {addr}: remove it first, then join it at the new address"
                    ),
                });
            }
            if before.voters.contains_key(id) {
                return Ok(unchanged(before));
            }
            let catch_up = Duration::from_millis(*catch_up_ms);
            if catch_up.is_zero() || catch_up > MAX_CATCH_UP {
                return Err(MembershipError::Refused {
                    reason: format!("a catch-up of {catch_up:?}: between 1 ms and {MAX_CATCH_UP:?}"),
                });
            }
            let target = if known.is_none() {
                tracing::info!(node = me, joining = id, addr, "ledger.membership: adding a learner");
                let add = raft.add_learner(*id, BasicNode::new(addr.clone()), false);
                let added = bounded(me, format!("adding node {id} as a learner"), COMMIT_TIMEOUT, add).await?;
                added.log_id.index
            } else {
                raft.metrics().borrow().last_log_index.unwrap_or_default()
            };
            // openraft's own wait for a learner counts one within thousands of entries as
            // caught up, even one that never answered: a voter must have the log up to here.
            let caught_up = raft
                .wait(Some(catch_up))
                .metrics(
                    |m| {
                        let matched = m.replication.as_ref().and_then(|r| r.get(id).cloned().flatten());
                        matched.is_some_and(|l| l.index >= target)
                    },
                    "the learner has the log",
                )
                .await;
            if let Err(e) = caught_up {
                return Err(MembershipError::Unavailable {
                    reason: format!(
                        "node {id} did not catch up on the log from {addr} within {catch_up:?} (is it running, \
                         with the group's secret?): it stays a learner; run join again once it runs, or remove it ({e})"
                    ),
                });
            }
            let mut voters = before.voters.clone();
            voters.insert(*id, addr.clone());
            check_quorum(me, &voters, probe).await?;
            tracing::info!(node = me, joining = id, "ledger.membership: making a voter");
            // (A bare set would replace every voter.)
            let add = ChangeMembers::AddVoterIds(BTreeSet::from([*id]));
            bounded(me, format!("committing node {id} as a voter"), COMMIT_TIMEOUT, raft.change_membership(add, false))
                .await?;
        }
        MembershipRequest::Remove { id } => {
            let changes = if before.voters.contains_key(id) {
                if before.voters.len() == 1 {
                    return Err(MembershipError::Refused { reason: format!("node {id} is the group's last voter") });
                }
                let mut voters = before.voters.clone();
                voters.remove(id);
                check_quorum(me, &voters, probe).await?;
                ChangeMembers::RemoveVoters(BTreeSet::from([*id]))
            } else if before.learners.contains_key(id) {
                ChangeMembers::RemoveNodes(BTreeSet::from([*id]))
            } else {
                return Ok(unchanged(before));
            };
            tracing::info!(node = me, removing = id, "ledger.membership: removing a node");
            bounded(
                me,
                format!("committing node {id}'s removal"),
                COMMIT_TIMEOUT,
                raft.change_membership(changes, false),
            )
            .await?;
        }
    }
    let after = members(raft, me, true);
    tracing::info!(
        node = me,
        voters = ?after.voters.keys().collect::<Vec<_>>(),
        learners = ?after.learners.keys().collect::<Vec<_>>(),
        "ledger.membership: changed"
    );
    Ok(after)
}
