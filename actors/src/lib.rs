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
//! - [`interruption::InterruptionActor`]: EC2's interruption events from the queues'
//!   consumers: nodes tainted at once, their pods' capacity launched on the warning.
//! - [`executor::Executor`]: runs the cluster effects planners ask for, fenced by the term.
//! - [`nominate::Nominations`]: the nodes the Router planned pending pods onto, which
//!   disruption leaves alone for Karpenter's nomination window.
//!
//! - [`trace`]: one trace per pending-pod class decision, its context carried in the messages.
//! - [`config::Config`]: every setting; [`errors::Errors`]: every error seen, counted;
//!   [`metrics::Metrics`]: Karpenter's Prometheus series and dovetail's own.
//!
//! Planners run on the blocking pool, not on the arbiter, so timers fire on time during a
//! large solve (a lifecycle reconcile of a small cluster plans inline: it costs less than the
//! hand-off). Mailboxes are bounded and every send uses `try_send` with a policy for a full
//! mailbox (drop-and-resend for the feed, back to the queue for the Router, hold-and-retry for
//! launches and terminations, drop for replies the ledger already holds): no future is spawned
//! per message and nothing grows without bound. The ledger and the cluster hold what was
//! decided and what is, so a dropped message is recovered by the next reconcile.

pub mod config;
pub mod errors;
pub mod executor;
pub mod feed;
pub mod gc;
pub mod interruption;
pub mod kubelet;
pub mod limiter;
pub mod metrics;
pub mod nominate;
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

/// Process-wide memory settings for a process that runs the plane, called first thing in
/// `main`: transparent huge pages off. mimalloc asks for huge pages on its arenas, so each
/// partly used 2 MiB region is resident whole: on the built-in `simulate` scenario that is
/// 116-123 MiB peak RSS instead of 81-87 MiB for the same heap (docs/benchmarks.md). On other
/// systems, or if the kernel refuses, nothing changes (the error is returned for the log).
pub fn memory_settings() -> std::io::Result<()> {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: PR_SET_THP_DISABLE takes integer arguments only and changes a flag of the
        // process's memory map; no memory of ours is read or written.
        let (on, unused): (libc::c_ulong, libc::c_ulong) = (1, 0);
        let rc = unsafe { libc::prctl(libc::PR_SET_THP_DISABLE, on, unused, unused, unused) };
        if rc != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

/// The actix system the plane runs on: one thread for the actors and a blocking pool as wide
/// as the machine for the planners. tokio's default blocking pool grows to 512 threads, each
/// with its own stack and allocator arena, while planners gain nothing past one thread a core.
pub fn system() -> std::io::Result<actix_rt::SystemRunner> {
    let planners = std::thread::available_parallelism().map_or(2, std::num::NonZeroUsize::get);
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().max_blocking_threads(planners).build()?;
    Ok(actix_rt::System::with_tokio_rt(move || runtime))
}
