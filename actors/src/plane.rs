//! The Supervisor: wires a control plane (one ZoneActor per zone sharing the region's
//! limiter, one NodePoolActor per NodePool, the Router, the pending-pod feed) and restarts
//! any of them that stops.
//! A restarted actor starts from the seams: the ledger and the cluster hold what it decided,
//! and its first reconcile resumes claims that were reserved or launching.

use std::collections::BTreeMap;
use std::sync::Arc;

use actix::prelude::*;
use dovetail_cloud::limits::ApiLimits;
use dovetail_cloud::{CloudProvider, NodeClass};
use dovetail_cluster::{ClusterView, ClusterWriter};
use dovetail_core::catalog::InstanceType;
use dovetail_core::clock::Clock;
use dovetail_core::labels;
use dovetail_core::nodepool::NodePool;
use dovetail_core::requirements::Requirement;
use dovetail_core::scheduling::PoolInput;
use dovetail_raft::Ledger;

use crate::config::Config;
use crate::errors::Errors;
use crate::executor::Executor;
use crate::feed::PendingFeed;
use crate::limiter::RegionLimiter;
use crate::pool::{NodePoolActor, PoolWiring};
use crate::router::{RoutedPool, Router};
use crate::zone::{ZoneActor, ZoneConfig};

/// What a plane is made of.
pub struct PlaneConfig {
    pub zones: Vec<String>,
    /// NodePools with their instance types and node class.
    pub pools: Vec<(NodePool, Arc<Vec<InstanceType>>, NodeClass)>,
    /// The region's request buckets (EC2's by default).
    pub limits: ApiLimits,
    /// Every window, interval, timeout, mailbox size and concurrency.
    pub config: Config,
}

/// The seams a plane works through.
pub struct Seams {
    pub cloud: Arc<dyn CloudProvider>,
    pub view: Arc<dyn ClusterView>,
    pub cluster: Arc<dyn ClusterWriter>,
    pub ledger: Arc<dyn Ledger>,
    pub clock: Arc<dyn Clock>,
}

/// A running plane.
pub struct Plane {
    pub feed: Addr<PendingFeed>,
    pub router: Addr<Router>,
    pub pools: BTreeMap<String, Addr<NodePoolActor>>,
    pub zones: BTreeMap<String, Addr<ZoneActor>>,
    /// Every error the plane met, counted by action and kind.
    pub errors: Arc<Errors>,
    pub executor: Executor,
}

impl Supervised for ZoneActor {
    fn restarting(&mut self, _: &mut Context<Self>) {
        self.requeue();
    }
}

impl Supervised for NodePoolActor {
    fn restarting(&mut self, _: &mut Context<Self>) {
        NodePoolActor::restarting(self);
    }
}

impl Supervised for Router {
    fn restarting(&mut self, _: &mut Context<Self>) {
        Router::restarting(self);
    }
}

impl Plane {
    /// Starts every actor under a supervisor (inside an actix system). The settings are
    /// checked first.
    pub fn start(cfg: PlaneConfig, s: Seams) -> Result<Plane, crate::config::ConfigError> {
        cfg.config.validate()?;
        let config = Arc::new(cfg.config);
        let errors = Arc::new(Errors::new());
        let executor = Executor::new(s.cluster.clone(), s.ledger.clone(), errors.clone(), config.executor.clone());
        let limiter = Arc::new(RegionLimiter::new(cfg.limits, s.clock.clone()));
        let zones: BTreeMap<String, Addr<ZoneActor>> = cfg
            .zones
            .iter()
            .map(|z| {
                let (cloud, ledger, clock, limiter, errors) =
                    (s.cloud.clone(), s.ledger.clone(), s.clock.clone(), limiter.clone(), errors.clone());
                let zc = ZoneConfig { zone: z.clone(), settings: config.zone.clone(), mailbox: config.mailboxes.zone };
                let addr = Supervisor::start(move |_| {
                    ZoneActor::new(zc, cloud, ledger, clock).with_limiter(limiter).with_errors(errors)
                });
                (z.clone(), addr)
            })
            .collect();
        let zone_names: Vec<String> = cfg.zones.clone();
        // Room for every pool's address: the sends never wait.
        let (tx, rx) = std::sync::mpsc::sync_channel(cfg.pools.len());
        let (zs, view, cluster, ledger, clock) =
            (zones.clone(), s.view.clone(), s.cluster.clone(), s.ledger.clone(), s.clock.clone());
        let (pools_cfg, conf, errs, ex) = (cfg.pools, config.clone(), errors.clone(), executor.clone());
        let router = Supervisor::start(move |ctx: &mut Context<Router>| {
            let mut routed = Vec::new();
            for (pool, types, node_class) in &pools_cfg {
                let wiring = PoolWiring {
                    view: view.clone(),
                    cluster: cluster.clone(),
                    ledger: ledger.clone(),
                    clock: clock.clone(),
                    zones: zs.clone(),
                    router: ctx.address().recipient(),
                    executor: ex.clone(),
                    errors: errs.clone(),
                    config: conf.clone(),
                };
                let (p, t, nc) = (pool.clone(), types.clone(), node_class.clone());
                let actor = Supervisor::start(move |_| NodePoolActor::new(p, t, nc, wiring));
                if tx.send((pool.name.clone(), actor.clone())).is_err() {
                    errs.warn("start", "channel", &pool.name, &"the plane stopped while starting");
                }
                let mut input = pool.clone();
                input.requirements.add(labels::ZONE, Requirement::is_in(zone_names.iter().map(String::as_str)));
                routed.push(RoutedPool { input: PoolInput { pool: input, instance_types: types.clone() }, actor });
            }
            Router::new(conf.window.clone(), view.clone(), clock.clone(), routed).configured(&conf, errs.clone())
        });
        let pools = rx.try_iter().collect();
        let (feed_cfg, view, clock, r, errs, mailbox) =
            (config.feed, s.view.clone(), s.clock.clone(), router.clone(), errors.clone(), config.mailboxes.feed);
        let feed = Supervisor::start(move |_| PendingFeed::new(feed_cfg, view, clock, r).configured(mailbox, errs));
        Ok(Plane { feed, router, pools, zones, errors, executor })
    }
}

impl Plane {
    /// Stops every actor once; each restarts from its seams (chaos runs and tests).
    pub async fn restart_all(&self) {
        let mut sent = vec![self.feed.send(crate::Restart).await, self.router.send(crate::Restart).await];
        for p in self.pools.values() {
            sent.push(p.send(crate::Restart).await);
        }
        for z in self.zones.values() {
            sent.push(z.send(crate::Restart).await);
        }
        for e in sent.into_iter().filter_map(Result::err) {
            self.errors.warn("restart", "mailbox", "plane", &e);
        }
    }
}
