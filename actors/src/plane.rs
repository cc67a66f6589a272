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
use dovetail_core::plane::BatchWindow;
use dovetail_core::requirements::Requirement;
use dovetail_core::scheduling::PoolInput;
use dovetail_raft::Ledger;

use crate::feed::{FeedConfig, PendingFeed};
use crate::limiter::RegionLimiter;
use crate::pool::{NodePoolActor, PoolWiring};
use crate::router::{RoutedPool, Router};
use crate::zone::{ZoneActor, ZoneConfig};

/// What a plane is made of.
pub struct PlaneConfig {
    pub zones: Vec<String>,
    /// NodePools with their instance types and node class.
    pub pools: Vec<(NodePool, Arc<Vec<InstanceType>>, NodeClass)>,
    pub window: BatchWindow,
    /// The region's request buckets (EC2's by default).
    pub limits: ApiLimits,
    pub feed: FeedConfig,
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
    /// Starts every actor under a supervisor (inside an actix system).
    pub fn start(cfg: PlaneConfig, s: Seams) -> Plane {
        let limiter = Arc::new(RegionLimiter::new(cfg.limits, s.clock.clone()));
        let zones: BTreeMap<String, Addr<ZoneActor>> = cfg
            .zones
            .iter()
            .map(|z| {
                let (cloud, ledger, clock, limiter, z2) =
                    (s.cloud.clone(), s.ledger.clone(), s.clock.clone(), limiter.clone(), z.clone());
                let addr = Supervisor::start(move |_| {
                    ZoneActor::new(ZoneConfig::new(&z2), cloud, ledger, clock).with_limiter(limiter)
                });
                (z.clone(), addr)
            })
            .collect();
        let zone_names: Vec<String> = cfg.zones.clone();
        // Room for every pool's address: the sends never wait.
        let (tx, rx) = std::sync::mpsc::sync_channel(cfg.pools.len());
        let (zs, view, cluster, ledger, clock, window) =
            (zones.clone(), s.view.clone(), s.cluster.clone(), s.ledger.clone(), s.clock.clone(), cfg.window);
        let pools_cfg = cfg.pools;
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
                };
                let (p, t, nc) = (pool.clone(), types.clone(), node_class.clone());
                let actor = Supervisor::start(move |_| NodePoolActor::new(p, t, nc, wiring));
                let _ = tx.send((pool.name.clone(), actor.clone()));
                let mut input = pool.clone();
                input.requirements.add(labels::ZONE, Requirement::is_in(zone_names.iter().map(String::as_str)));
                routed.push(RoutedPool { input: PoolInput { pool: input, instance_types: types.clone() }, actor });
            }
            Router::new(window, view.clone(), clock.clone(), routed)
        });
        let pools = rx.try_iter().collect();
        let (feed_cfg, view, clock, r) = (cfg.feed, s.view.clone(), s.clock.clone(), router.clone());
        let feed = Supervisor::start(move |_| PendingFeed::new(feed_cfg, view, clock, r));
        Plane { feed, router, pools, zones }
    }
}

impl Plane {
    /// Stops every actor once; each restarts from its seams (chaos runs and tests).
    pub async fn restart_all(&self) {
        let _ = self.feed.send(crate::Restart).await;
        let _ = self.router.send(crate::Restart).await;
        for p in self.pools.values() {
            let _ = p.send(crate::Restart).await;
        }
        for z in self.zones.values() {
            let _ = z.send(crate::Restart).await;
        }
    }
}
