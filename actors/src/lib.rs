//! The dovetail control plane as actix actors, thin shells over `dovetail-core`: each actor
//! owns its mailbox and state, calls the pure decisions in `core`, and talks to the cloud,
//! the cluster and the ledger through their seams. actix types stay inside this crate.
//!
//! - [`zone::ZoneActor`]: one per availability zone, the only caller of launch for its zone.
//!
//! Mailboxes are bounded; sends between actors use `try_send`, falling back to an awaited
//! `send` when a mailbox is full, so nothing is dropped and nothing grows without bound.

pub mod limiter;
pub mod plane;
pub mod pool;
pub mod router;
pub mod zone;

use std::time::Duration;

use dovetail_core::ledger::Millis;

/// Ledger timestamps from the plane's clock.
pub(crate) fn millis(d: Duration) -> Millis {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}
