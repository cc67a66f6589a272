//! Interruption handling: what EC2 says it is about to do to an instance, and what the plane
//! does about it.
//!
//! - [`parse`]: queue message bodies (EventBridge events) into [`Event`]s, by
//!   `(version, source, detail-type)`, with Karpenter's field names.
//! - [`plan`]: the ledger notices of a batch of events, and when an interrupted claim drains.
//! - [`size`]: the capacity an interrupted node's pods need, launched on the warning.
//! - The ledger records each instance's interruption once ([`crate::ledger::Command::Interrupt`]),
//!   which deduplicates redeliveries, and reserves the replacements
//!   ([`crate::ledger::Command::ReplaceInterrupted`]).

pub mod parse;
pub mod plan;
pub mod size;

pub use parse::{Event, Kind, ParseError, parse};
pub use plan::{NO_DEADLINE, Rebalance, Settings, drain_now, interrupted_claims, notices};
pub use size::{Going, Promised, Sizing, size};

impl Kind {
    /// The kind named `s` ([`Kind::as_str`]).
    pub fn parse(s: &str) -> Option<Kind> {
        Kind::ALL.into_iter().find(|k| k.as_str() == s)
    }
}
