//! The consumers: long-pollers on the interruption queues, each handing what it receives to
//! the [`InterruptionActor`] and waiting for it (so a busy actor slows the receives, and
//! nothing piles up in memory). A queue starts with `interruption.consumers` pollers; while
//! receives come back full another starts, up to `interruption.max_consumers`, and an extra
//! one stops after an empty receive. Only the leader receives: a follower's pollers wait for
//! leadership (a message received and not acted on would stay hidden for the visibility
//! timeout).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use actix::Addr;
use dovetail_cloud::InterruptionQueue;
use dovetail_core::clock::Clock;
use dovetail_raft::Leadership;
use tokio::sync::watch;

use super::{Batch, InterruptionActor};
use crate::config::InterruptionConfig;
use crate::errors::Errors;

/// The most messages one receive returns (SQS's limit).
const RECEIVE_MAX: usize = 10;

/// What every poller of a queue shares.
struct Shared {
    queue: Arc<dyn InterruptionQueue>,
    index: usize,
    /// For errors and logs.
    name: String,
    actor: Addr<InterruptionActor>,
    leadership: watch::Receiver<Leadership>,
    clock: Arc<dyn Clock>,
    errors: Arc<Errors>,
    cfg: InterruptionConfig,
    /// Pollers running on this queue.
    running: AtomicUsize,
    /// Set when the plane stops: every poller returns.
    stop: watch::Receiver<bool>,
}

/// Starts the pollers of every queue (on the current actix arbiter). They run until `stop`
/// turns true.
pub fn start(
    queues: &[Arc<dyn InterruptionQueue>],
    names: &[String],
    actor: Addr<InterruptionActor>,
    leadership: watch::Receiver<Leadership>,
    (clock, errors, cfg): (Arc<dyn Clock>, Arc<Errors>, InterruptionConfig),
    stop: watch::Receiver<bool>,
) {
    for (index, queue) in queues.iter().enumerate() {
        let shared = Arc::new(Shared {
            queue: queue.clone(),
            index,
            name: super::queue_name(names, index),
            actor: actor.clone(),
            leadership: leadership.clone(),
            clock: clock.clone(),
            errors: errors.clone(),
            cfg: cfg.clone(),
            running: AtomicUsize::new(0),
            stop: stop.clone(),
        });
        for _ in 0..cfg.consumers {
            spawn(shared.clone(), false);
        }
    }
}

fn spawn(shared: Arc<Shared>, extra: bool) {
    shared.running.fetch_add(1, Ordering::SeqCst);
    actix::spawn(async move {
        poll(&shared, extra).await;
        shared.running.fetch_sub(1, Ordering::SeqCst);
    });
}

/// One poller's loop.
async fn poll(shared: &Arc<Shared>, extra: bool) {
    let name = &shared.name;
    let mut leadership = shared.leadership.clone();
    let mut stop = shared.stop.clone();
    let mut failures: u32 = 0;
    loop {
        if *stop.borrow() {
            return;
        }
        if !leadership.borrow().leader {
            if extra {
                return;
            }
            tokio::select! {
                changed = leadership.changed() => if changed.is_err() { return },
                changed = stop.changed() => if changed.is_err() || *stop.borrow() { return },
            }
            continue;
        }
        // A stop (or the plane gone) ends the receive; a message it had received stays
        // hidden for the visibility timeout, then comes back.
        let received = tokio::select! {
            r = shared.queue.receive(RECEIVE_MAX, shared.cfg.wait) => r,
            _ = stop.changed() => return,
        };
        match received {
            Ok(messages) if messages.is_empty() => {
                failures = 0;
                if extra {
                    return;
                }
                tokio::time::sleep(shared.cfg.idle_pause).await;
            }
            Ok(messages) => {
                failures = 0;
                let full = messages.len() >= RECEIVE_MAX;
                if full && shared.running.load(Ordering::SeqCst) < shared.cfg.max_consumers {
                    spawn(shared.clone(), true);
                }
                let batch = Batch { queue: shared.index, messages, received: shared.clock.now_millis() };
                if let Err(e) = shared.actor.send(batch).await {
                    shared.errors.warn("handle_interruptions", "mailbox", name, &e);
                    return;
                }
            }
            Err(e) => {
                // Backs off 1, 2, 4 ... 30 s while the queue keeps failing.
                failures = failures.saturating_add(1);
                shared.errors.warn("receive_messages", "cloud", name, &e);
                let wait =
                    std::time::Duration::from_secs(1u64 << failures.min(5)).min(std::time::Duration::from_secs(30));
                tokio::time::sleep(wait).await;
            }
        }
    }
}
