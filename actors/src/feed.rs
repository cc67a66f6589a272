//! The pending-pod feed: watches the cluster (its change notifications, and a slow timer as a
//! fallback) and tells the Router about pods that need a node. A pod is sent when it first shows up pending and again every `resend` while it
//! stays pending (Karpenter re-solves pending pods each batch; by then the Router's solve
//! finds the in-flight NodeClaims made for them, so a resend costs a solve, not a claim).
//! DaemonSet pods and finished pods are never sent.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use dovetail_cloud::Clock;
use dovetail_cluster::ClusterView;
use dovetail_core::ledger::Millis;
use dovetail_core::pod::{Pod, PodKey};

use crate::millis;
use crate::router::{PodsPending, Router};

/// The feed's settings.
#[derive(Clone, Copy, Debug)]
pub struct FeedConfig {
    /// How often the cluster is looked at without a change notification (a fallback; every
    /// change is looked at when it is notified).
    pub tick: Duration,
    /// How long a pod that stays pending waits before it is sent again.
    pub resend: Duration,
}

impl Default for FeedConfig {
    fn default() -> Self {
        FeedConfig { tick: Duration::from_secs(5), resend: Duration::from_secs(30) }
    }
}

/// Look at the cluster now (tests and drivers that step time themselves).
#[derive(Message)]
#[rtype(result = "usize")]
pub struct Poll;

/// The actor.
pub struct PendingFeed {
    cfg: FeedConfig,
    view: Arc<dyn ClusterView>,
    clock: Arc<dyn Clock>,
    router: Addr<Router>,
    /// When each pending pod was last sent.
    sent: BTreeMap<PodKey, Millis>,
    seen_version: Option<u64>,
    last_sweep: Millis,
}

impl PendingFeed {
    pub fn new(cfg: FeedConfig, view: Arc<dyn ClusterView>, clock: Arc<dyn Clock>, router: Addr<Router>) -> Self {
        PendingFeed { cfg, view, clock, router, sent: BTreeMap::new(), seen_version: None, last_sweep: 0 }
    }

    /// Sends what is due; returns how many pods it sent.
    fn poll(&mut self, ctx: &mut Context<Self>) -> usize {
        let now = millis(self.clock.now());
        let resend = millis(self.cfg.resend);
        let snap = self.view.snapshot();
        // Nothing changed and no resend is due.
        if self.seen_version == Some(snap.resource_version) && now.saturating_sub(self.last_sweep) < resend {
            return 0;
        }
        self.seen_version = Some(snap.resource_version);
        let mut due: Vec<Pod> = Vec::new();
        let mut still: BTreeMap<PodKey, Millis> = BTreeMap::new();
        for p in snap.pending().filter(|p| !p.daemon) {
            match self.sent.get(&p.key) {
                Some(&at) if now.saturating_sub(at) < resend => {
                    still.insert(p.key.clone(), at);
                }
                _ => {
                    still.insert(p.key.clone(), now);
                    due.push(p.as_ref().clone());
                }
            }
        }
        if now.saturating_sub(self.last_sweep) >= resend {
            self.last_sweep = now;
        }
        // Pods no longer pending are forgotten.
        self.sent = still;
        let n = due.len();
        if n > 0 {
            let msg = PodsPending { pods: due };
            if let Err(SendError::Full(msg)) = self.router.try_send(msg) {
                let router = self.router.clone();
                ctx.spawn(actix::fut::wrap_future::<_, Self>(async move {
                    let _ = router.send(msg).await;
                }));
            }
        }
        n
    }
}

impl Actor for PendingFeed {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        ctx.set_mailbox_capacity(16);
        // Every change notification (a burst of changes wakes it once) is looked at.
        let mut changes = self.view.changes();
        let me = ctx.address();
        ctx.spawn(actix::fut::wrap_future::<_, Self>(async move {
            while changes.changed().await.is_ok() {
                if me.send(Poll).await.is_err() {
                    break;
                }
            }
        }));
        ctx.run_interval(self.cfg.tick.min(self.cfg.resend), |act, ctx| {
            act.poll(ctx);
        });
    }
}

impl Handler<Poll> for PendingFeed {
    type Result = usize;

    fn handle(&mut self, _: Poll, ctx: &mut Context<Self>) -> usize {
        self.poll(ctx)
    }
}

impl Handler<crate::Restart> for PendingFeed {
    type Result = ();

    fn handle(&mut self, _: crate::Restart, ctx: &mut Context<Self>) {
        ctx.stop();
    }
}

impl Supervised for PendingFeed {}
