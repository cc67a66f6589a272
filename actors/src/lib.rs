//! The dovetail control plane as actix actors, thin shells over `dovetail-core`: each actor
//! owns its mailbox and state, calls the pure decisions in `core`, and talks to the cloud,
//! the cluster and the ledger through their seams. actix types stay inside this crate.
//!
//! - [`plane::Plane`]: the Supervisor; wires the others and restarts any that stops.
//! - [`feed::PendingFeed`]: tells the Router about pods that need a node.
//! - [`router::Router`]: batches pending pods and routes them to pools by one global solve.
//! - [`pool::NodePoolActor`]: one per NodePool; packs, reserves and drives claims' lifecycle.
//! - [`zone::ZoneActor`]: one per availability zone, the only caller of launch for its zone.
//!
//! - [`trace`]: one trace per pending-pod class decision, its context carried in the messages.
//!
//! Mailboxes are bounded; sends between actors use `try_send`, falling back to an awaited
//! `send` when a mailbox is full, so nothing is dropped and nothing grows without bound.

pub mod feed;
pub mod kubelet;
pub mod limiter;
pub mod plane;
pub mod pool;
pub mod router;
pub mod trace;
pub mod zone;

use std::time::Duration;

use actix::Message;

use dovetail_core::ledger::Millis;

/// The longest a throttled call waits before it is tried again, whatever retry-after the cloud
/// gave (the AWS SDKs cap their backoff at 20 s; a longer hint is probed rather than obeyed).
pub const MAX_RETRY_WAIT: Duration = Duration::from_secs(30);

/// Ledger timestamps from the plane's clock.
pub(crate) fn millis(d: Duration) -> Millis {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// Stops an actor. Under the plane's Supervisor it starts again from its seams (the ledger and
/// the cluster hold what it decided); chaos runs and the restart tests send it.
#[derive(Message, Clone, Copy, Debug)]
#[rtype(result = "()")]
pub struct Restart;
