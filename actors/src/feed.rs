//! The pending-pod feed: watches the cluster (its change notifications, and a slow timer as a
//! fallback) and tells the Router about pods that need a node. What is due is decided by
//! `core::plane::Resend`: a pod is sent when it first shows up pending, again every `resend`
//! while it stays pending, and again `settle` after new nodes appeared if it is still pending
//! (Karpenter re-solves pending pods each batch; the Router's solve finds the in-flight
//! NodeClaims made for them, so a resend costs a solve, not a claim), and at once when a node
//! or NodeClaim is deleted or marked for deletion (the pods counted against it need a
//! replacement: Karpenter's provisioner is triggered by those deletions).
//! Only provisionable pods are sent (Karpenter's `IsProvisionable`: marked unschedulable by
//! the scheduler, not gated, not nominated, not a DaemonSet's, not finished or terminating).
//! A full Router mailbox drops the message and the pods are due again at the next look
//! (drop-and-resend): nothing queues outside a mailbox.
//! The feed looks once as soon as it starts; its first pods are the backlog of a plane that
//! just started (a restart, or a new leader taking over), which the Router decides at once.

use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use dovetail_cluster::ClusterView;
use dovetail_core::clock::{Clock, to_millis};
use dovetail_core::plane::Resend;
use dovetail_core::pod::Pod;

use crate::errors::Errors;
use crate::router::{PodsPending, Router};

/// The feed's settings.
#[derive(Clone, Copy, Debug)]
pub struct FeedConfig {
    /// How often the cluster is looked at without a change notification (a fallback; every
    /// change is looked at when it is notified).
    pub tick: Duration,
    /// How long a pod that stays pending waits before it is sent again.
    pub resend: Duration,
    /// After new nodes appear, how long before pods sent earlier and still pending are sent
    /// again (the capacity they were counted against went to other pods).
    pub settle: Duration,
    /// The least time between two looks a change notification causes: changes that arrive
    /// sooner are looked at together when it is over. Each look copies the cluster's view and
    /// walks its pending pods; the plane's own writes (one per claim and node as they come
    /// up) would otherwise make a look per write.
    pub coalesce: Duration,
}

impl Default for FeedConfig {
    fn default() -> Self {
        FeedConfig {
            tick: Duration::from_secs(5),
            resend: Duration::from_secs(30),
            settle: Duration::from_secs(5),
            coalesce: Duration::from_millis(100),
        }
    }
}

/// Look at the cluster now (tests and drivers that step time themselves).
#[derive(Message)]
#[rtype(result = "usize")]
pub struct Poll;

/// The actor.
pub struct PendingFeed {
    view: Arc<dyn ClusterView>,
    clock: Arc<dyn Clock>,
    router: Addr<Router>,
    tick: Duration,
    coalesce: Duration,
    resend: Resend,
    seen_version: Option<u64>,
    mailbox: usize,
    errors: Arc<Errors>,
    /// Messages the Router's full mailbox refused (their pods were sent again later).
    pub dropped: u64,
    /// Whether the feed looked at a synced cluster yet: the pods of its first look are the
    /// backlog (none at all on an idle cluster, and later arrivals are not).
    looked: bool,
}

impl PendingFeed {
    pub fn new(cfg: FeedConfig, view: Arc<dyn ClusterView>, clock: Arc<dyn Clock>, router: Addr<Router>) -> Self {
        PendingFeed {
            view,
            clock,
            router,
            tick: cfg.tick.min(cfg.resend),
            coalesce: cfg.coalesce,
            resend: Resend::new(to_millis(cfg.resend), to_millis(cfg.settle)),
            seen_version: None,
            mailbox: 16,
            errors: Arc::new(Errors::new()),
            dropped: 0,
            looked: false,
        }
    }

    /// Its mailbox size and the plane's error counters.
    pub fn configured(mut self, mailbox: usize, errors: Arc<Errors>) -> Self {
        self.mailbox = mailbox;
        self.errors = errors;
        self
    }

    /// Sends what is due; returns how many pods it sent.
    fn poll(&mut self) -> usize {
        let now = self.clock.now_millis();
        // A cache that has not listed everything shows pods pending that are not (or misses
        // their nodes): nothing is sent from it.
        if !self.view.synced() {
            return 0;
        }
        let snap = self.view.snapshot();
        // Nothing changed and nothing is due.
        if self.seen_version == Some(snap.resource_version) && !self.resend.due_without_change(now) {
            return 0;
        }
        self.seen_version = Some(snap.resource_version);
        let pending: Vec<&Arc<Pod>> = snap.provisionable().collect();
        self.resend.capacity(now, snap.capacity_keys());
        let due = self.resend.look(now, pending.iter().map(|p| &p.key), snap.nodes.len());
        let due: Vec<Pod> = due.into_iter().map(|i| pending[i].as_ref().clone()).collect();
        let n = due.len();
        let backlog = !self.looked;
        self.looked = true;
        if n > 0 {
            match self.router.try_send(PodsPending { pods: due, backlog }) {
                Ok(()) => {}
                Err(e) => {
                    let kind = if matches!(e, SendError::Full(_)) { "mailbox_full" } else { "closed" };
                    let msg = e.into_inner();
                    // Dropped: the pods are due again at the next look.
                    self.dropped += 1;
                    self.resend.unsend(msg.pods.iter().map(|p| &p.key));
                    // Not delivered: the next look sends the backlog again.
                    self.looked = !backlog;
                    self.errors.note("send_pending", kind, "router", &format!("{} pods", msg.pods.len()));
                    return 0;
                }
            }
        }
        n
    }
}

impl Actor for PendingFeed {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        ctx.set_mailbox_capacity(self.mailbox);
        // Every change notification is looked at, at most one look per `coalesce` (the
        // changes made meanwhile are seen at the end of it, by the next look).
        let mut changes = self.view.changes();
        let me = ctx.address();
        let coalesce = self.coalesce;
        ctx.spawn(actix::fut::wrap_future::<_, Self>(async move {
            while changes.changed().await.is_ok() {
                if me.send(Poll).await.is_err() {
                    break;
                }
                if !coalesce.is_zero() {
                    actix_rt::time::sleep(coalesce).await;
                }
            }
        }));
        ctx.run_interval(self.tick, |act, _| {
            act.poll();
        });
        // The pods pending already, now.
        ctx.notify(Poll);
    }
}

impl Handler<Poll> for PendingFeed {
    type Result = usize;

    fn handle(&mut self, _: Poll, _: &mut Context<Self>) -> usize {
        self.poll()
    }
}

impl Handler<crate::Restart> for PendingFeed {
    type Result = ();

    fn handle(&mut self, _: crate::Restart, ctx: &mut Context<Self>) {
        ctx.stop();
    }
}

impl Supervised for PendingFeed {
    /// A restarted feed (a new leader's plane starting from the seams) finds the pods already
    /// pending a backlog again, decided without the batch window.
    fn restarting(&mut self, _: &mut Context<Self>) {
        self.looked = false;
    }
}
