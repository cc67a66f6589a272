//! openraft's type configuration for the ledger: entries are [`WireEntry`] (one per decision
//! round), responses [`WireOutcome`], nodes are numbered and addressed by their Raft address,
//! snapshots are bytes.

use std::io::Cursor;

use crate::wire::{WireEntry, WireOutcome};

/// A control node's id in the Raft group (`--node-id`).
pub type NodeId = u64;

openraft::declare_raft_types!(
    /// The ledger's Raft types.
    pub TypeConfig:
        D = WireEntry,
        R = WireOutcome,
        NodeId = NodeId,
        Node = openraft::BasicNode,
        Entry = openraft::Entry<TypeConfig>,
        SnapshotData = Cursor<Vec<u8>>,
        AsyncRuntime = openraft::TokioRuntime,
);

/// A snapshot's metadata.
pub type SnapshotMeta = openraft::SnapshotMeta<NodeId, openraft::BasicNode>;

/// A membership as the state machine stores it.
pub type StoredMembership = openraft::StoredMembership<NodeId, openraft::BasicNode>;
