//! The dovetail control plane as actix actors, thin shells over `dovetail-core`: each actor
//! owns its mailbox and state, calls the pure decisions in `core`, and talks to the cloud,
//! the cluster and the ledger through their seams. actix types stay inside this crate.
//!
//! - [`plane::Plane`]: the Supervisor; wires the others and restarts any that stops.
//! - [`feed::PendingFeed`]: tells the Router about pods that need a node.
//! - [`router::Router`]: batches pending pods and routes them to pools by one global solve.
//! - [`pool::NodePoolActor`]: one per NodePool; a shell over the provisioning and lifecycle
//!   planners of `core`.
//! - [`zone::ZoneActor`]: one per availability zone, the only caller of launch and terminate
//!   for its zone.
//! - [`executor::Executor`]: runs the cluster effects planners ask for, fenced by the term.
//!
//! - [`trace`]: one trace per pending-pod class decision, its context carried in the messages.
//! - [`config::Config`]: every setting; [`errors::Errors`]: every error seen, counted.
//!
//! Planners run on the blocking pool, not on the arbiter, so timers fire on time during a
//! large solve. Mailboxes are bounded and every send uses `try_send` with a policy for a full
//! mailbox (drop-and-resend for the feed, back to the queue for the Router, hold-and-retry for
//! launches and terminations, drop for replies the ledger already holds): no future is spawned
//! per message and nothing grows without bound. The ledger and the cluster hold what was
//! decided and what is, so a dropped message is recovered by the next reconcile.

pub mod config;
pub mod errors;
pub mod executor;
pub mod feed;
pub mod kubelet;
pub mod limiter;
pub mod plane;
pub mod pool;
pub mod router;
pub mod trace;
pub mod zone;

use actix::Message;

/// Stops an actor. Under the plane's Supervisor it starts again from its seams (the ledger and
/// the cluster hold what it decided); chaos runs and the restart tests send it.
#[derive(Message, Clone, Copy, Debug)]
#[rtype(result = "()")]
pub struct Restart;
