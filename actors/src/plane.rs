//! The Supervisor: wires a control plane (one ZoneActor per zone sharing the region's
//! limiter, one NodePoolActor per NodePool, the Router, the pending-pod feed) and restarts
//! any of them that stops.
//! A restarted actor starts from the seams: the ledger and the cluster hold what it decided,
//! and its first reconcile resumes claims that were reserved or launching.

use std::collections::BTreeMap;
use std::sync::Arc;

use actix::prelude::*;
use dovetail_cloud::limits::ApiLimits;
use dovetail_cloud::{CloudProvider, InterruptionQueue, NodeClass};
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
use crate::interruption::{InterruptionActor, InterruptionWiring, SetPools};
use crate::limiter::RegionLimiter;
use crate::metrics::Metrics;
use crate::metrics::metered::{MeteredCloud, MeteredLedger};
use crate::pool::{NodePoolActor, PoolWiring, Reconfigure, Retire};
use crate::router::{RemovePool, RoutedPool, Router, SetPool};
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
    /// Where the plane counts what it does (served by the binary on `--metrics-addr`).
    pub metrics: Arc<Metrics>,
}

/// A running plane.
pub struct Plane {
    /// Set once started (the pools are routed to first).
    feed: Option<Addr<PendingFeed>>,
    pub router: Addr<Router>,
    pub pools: BTreeMap<String, Addr<NodePoolActor>>,
    pub zones: BTreeMap<String, Addr<ZoneActor>>,
    /// Every error the plane met, counted by action and kind.
    pub errors: Arc<Errors>,
    pub executor: Executor,
    /// What a pool actor started at run time is wired to.
    wiring: PoolWiring,
    /// The pools as routed (the interruption actor sizes replacements with them).
    routed: BTreeMap<String, (PoolInput, Addr<NodePoolActor>)>,
    /// The same, for pricing the fleet (`dovetail_fleet_cost_ratio`).
    priced: crate::metrics::cost::Pools,
    /// The interruption actor, once queues are given ([`Plane::consume_interruptions`]).
    pub interruption: Option<Addr<InterruptionActor>>,
    /// Stops the queue consumers when sent `true` or dropped with the plane.
    stop_consumers: Option<tokio::sync::watch::Sender<bool>>,
    /// Counts the nodes joining and leaving, and collects leaked instances; stopped with
    /// the plane.
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Drop for Plane {
    fn drop(&mut self) {
        for t in self.tasks.drain(..) {
            t.abort();
        }
        // The fleet's R is the acting plane's: a node that stopped acting does not report it.
        self.executor.metrics().set_cost_ratio(0.0);
    }
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

impl Supervised for InterruptionActor {
    fn restarting(&mut self, _: &mut Context<Self>) {
        InterruptionActor::restarting(self);
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
        let mut plane = Plane::start_without_feed(cfg, s)?;
        plane.start_feed();
        Ok(plane)
    }

    /// Starts every actor but the pending-pod feed: for a caller that sets its pools after
    /// the start ([`Plane::set_pool`]) and only then lets pods come, with
    /// [`Plane::start_feed`] (the feed's first pods are decided at once, over every pool).
    pub fn start_without_feed(cfg: PlaneConfig, s: Seams) -> Result<Plane, crate::config::ConfigError> {
        cfg.config.validate()?;
        let config = Arc::new(cfg.config);
        let errors = Arc::new(Errors::new());
        // Every cloud call and proposal of the plane is timed and counted.
        let metrics = s.metrics.clone();
        let cloud_name = s.cloud.name();
        let s = Seams {
            cloud: Arc::new(MeteredCloud::new(s.cloud, cloud_name, metrics.clone(), s.clock.clone())),
            ledger: Arc::new(MeteredLedger::new(s.ledger, metrics.clone(), s.clock.clone())),
            ..s
        };
        let executor = Executor::new(
            s.cluster.clone(),
            s.ledger.clone(),
            errors.clone(),
            metrics.clone(),
            config.executor.clone(),
            s.clock.clone(),
        );
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
        let nominations = crate::nominate::Nominations::default();
        let router = {
            let (view, clock, conf, errs) = (s.view.clone(), s.clock.clone(), config.clone(), errors.clone());
            let (noms, metrics) = (nominations.clone(), metrics.clone());
            Supervisor::start(move |_| {
                Router::new(conf.window.clone(), view, clock, Vec::new())
                    .configured(&conf, errs)
                    .nominating(noms.clone())
                    .metered(metrics.clone())
            })
        };
        let wiring = PoolWiring {
            view: s.view.clone(),
            cluster: s.cluster.clone(),
            ledger: s.ledger.clone(),
            clock: s.clock.clone(),
            zones: zones.clone(),
            router: router.clone().recipient(),
            executor: executor.clone(),
            errors: errors.clone(),
            config: config.clone(),
            cloud: s.cloud.clone(),
            nominations,
        };
        let priced = crate::metrics::cost::Pools::default();
        let mut plane = Plane {
            feed: None,
            router: router.clone(),
            pools: BTreeMap::new(),
            zones,
            errors: errors.clone(),
            executor,
            wiring,
            routed: BTreeMap::new(),
            priced: priced.clone(),
            interruption: None,
            stop_consumers: None,
            tasks: vec![
                actix_rt::spawn(crate::metrics::state::follow_nodes(
                    s.view.clone(),
                    metrics.clone(),
                    std::time::Duration::from_secs(1),
                )),
                actix_rt::spawn(
                    crate::gc::Gc {
                        cloud: s.cloud.clone(),
                        ledger: s.ledger.clone(),
                        view: s.view.clone(),
                        cluster: s.cluster.clone(),
                        clock: s.clock.clone(),
                        errors: errors.clone(),
                        metrics: metrics.clone(),
                        cfg: config.gc.clone(),
                    }
                    .run(),
                ),
            ],
        };
        if let Some(every) = config.cost_every {
            let (view, ledger) = (s.view.clone(), s.ledger.clone());
            let task = crate::metrics::cost::follow_cost(view, ledger, priced, metrics, every);
            plane.tasks.push(actix_rt::spawn(task));
        }
        // The pools are routed to before the feed sends the first pods.
        for (pool, types, node_class) in cfg.pools {
            plane.set_pool(pool, types, node_class);
        }
        Ok(plane)
    }

    /// Starts the pending-pod feed (once; a second call does nothing).
    pub fn start_feed(&mut self) {
        if self.feed.is_some() {
            return;
        }
        let w = &self.wiring;
        let (feed_cfg, view, clock, errs, mailbox, router) = (
            w.config.feed,
            w.view.clone(),
            w.clock.clone(),
            w.errors.clone(),
            w.config.mailboxes.feed,
            self.router.clone(),
        );
        let feed =
            Supervisor::start(move |_| PendingFeed::new(feed_cfg, view, clock, router).configured(mailbox, errs));
        self.feed = Some(feed);
    }

    /// Starts the actor of a NodePool added at run time, or hands a changed one to its actor;
    /// either way the Router routes to it as it is now. (The ledger's limits are the caller's:
    /// `Command::SetPool`.)
    pub fn set_pool(&mut self, pool: NodePool, types: Arc<Vec<InstanceType>>, node_class: NodeClass) {
        let w = &self.wiring;
        let actor = match self.pools.get(&pool.name) {
            Some(actor) => {
                let msg = Reconfigure { pool: pool.clone(), types: types.clone(), node_class };
                if let Err(e) = actor.try_send(msg) {
                    w.errors.warn("reconfigure", "mailbox", &format!("nodepool/{}", pool.name), &e);
                }
                actor.clone()
            }
            None => {
                let wiring = w.clone();
                let (p, t, nc) = (pool.clone(), types.clone(), node_class);
                let actor = Supervisor::start(move |_| NodePoolActor::new(p, t, nc, wiring));
                self.pools.insert(pool.name.clone(), actor.clone());
                actor
            }
        };
        let mut input = pool;
        input.requirements.add(labels::ZONE, Requirement::is_in(w.zones.keys().map(String::as_str)));
        let input = PoolInput { pool: input, instance_types: types };
        self.routed.insert(input.pool.name.clone(), (input.clone(), actor.clone()));
        self.priced
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(input.pool.name.clone(), input.clone());
        self.router.do_send(SetPool(RoutedPool { input, actor }));
        self.tell_interruption();
    }

    /// Starts handling interruption events from `queues`: the [`InterruptionActor`] and the
    /// queues' consumers (only the leader receives). Once; a second call does nothing.
    pub fn consume_interruptions(&mut self, named: Vec<(String, Arc<dyn InterruptionQueue>)>) {
        if self.interruption.is_some() || named.is_empty() {
            return;
        }
        let w = &self.wiring;
        let (names, queues): (Vec<String>, Vec<Arc<dyn InterruptionQueue>>) = named.into_iter().unzip();
        let wiring = InterruptionWiring {
            queues: queues.clone(),
            queue_names: names.clone(),
            nominations: w.nominations.clone(),
            ledger: w.ledger.clone(),
            view: w.view.clone(),
            clock: w.clock.clone(),
            executor: w.executor.clone(),
            errors: w.errors.clone(),
            cfg: w.config.clone(),
            zones: w.zones.keys().cloned().collect(),
        };
        let actor = Supervisor::start(move |_| InterruptionActor::new(wiring));
        let (tx, rx) = tokio::sync::watch::channel(false);
        let parts = (w.clock.clone(), w.errors.clone(), w.config.interruption.clone());
        crate::interruption::consume::start(&queues, &names, actor.clone(), w.ledger.leadership(), parts, rx);
        self.interruption = Some(actor);
        self.stop_consumers = Some(tx);
        self.tell_interruption();
    }

    /// Stops the queue consumers (messages received and not yet acted on come back after
    /// the visibility timeout).
    pub fn stop_consumers(&mut self) {
        if let Some(tx) = self.stop_consumers.take()
            && tx.send(true).is_err()
        {
            tracing::debug!("interruption consumers had stopped already");
        }
    }

    fn tell_interruption(&self) {
        if let Some(actor) = &self.interruption
            && let Err(e) = actor.try_send(SetPools(self.routed.clone()))
        {
            self.errors.warn("set_pools", "mailbox", "interruption", &e);
        }
    }

    /// Stops provisioning for a NodePool (deleted, invalid, or its NodeClass gone); its actor
    /// keeps its claims' lifecycle until [`Plane::stop_pool`].
    pub fn retire_pool(&mut self, name: &str) {
        self.router.do_send(RemovePool(name.to_string()));
        self.priced.lock().unwrap_or_else(std::sync::PoisonError::into_inner).remove(name);
        if self.routed.remove(name).is_some() {
            self.tell_interruption();
        }
        if let Some(actor) = self.pools.get(name) {
            actor.do_send(Retire);
        }
    }

    /// Starts the actor of a pool that is not provisioned for but still has claims (its
    /// NodePool missing or invalid when the controller started): it keeps their lifecycle
    /// (registration, deletion, drain) until [`Plane::stop_pool`]. The Router does not route
    /// to it. A pool that already has an actor is only retired.
    pub fn keep_pool(&mut self, name: &str) {
        if !self.pools.contains_key(name) {
            let wiring = self.wiring.clone();
            let pool = NodePool::new(name, dovetail_core::requirements::Requirements::new());
            let actor = Supervisor::start(move |_| {
                NodePoolActor::new(pool, Arc::new(Vec::new()), NodeClass::default(), wiring).retired()
            });
            self.pools.insert(name.to_string(), actor);
        }
        self.retire_pool(name);
    }

    /// Stops a retired pool's actor for good (its NodePool gone and its claims with it): with
    /// its last address dropped, the supervisor does not restart it.
    pub fn stop_pool(&mut self, name: &str) {
        if let Some(actor) = self.pools.remove(name) {
            actor.do_send(crate::Restart);
        }
    }
}

impl Plane {
    /// Stops every actor once; each restarts from its seams (chaos runs and tests).
    pub async fn restart_all(&self) {
        let mut sent = vec![self.router.send(crate::Restart).await];
        if let Some(feed) = &self.feed {
            sent.push(feed.send(crate::Restart).await);
        }
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
