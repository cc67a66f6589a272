//! The NodePoolActor: one per NodePool. It packs new claims for the pods the Router hands it
//! (one `core` solve over its pool), reserves the round in the ledger (limits and global caps
//! are checked there), creates the NodeClaims, hands each claim to its zone's actor and
//! follows the outcome: launched claims get their status; a claim whose offerings had no
//! capacity is sent to the cheapest zone still available (ICE marks respected), and one with
//! nowhere left to go is released and its pods go back to the Router, one way.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use actix::prelude::*;
use dovetail_cloud::{CloudError, LaunchRequest, NodeClass};
use dovetail_cluster::{ClusterView, ClusterWriter, Condition, NodeClaim, NodeClaimStatus};
use dovetail_core::catalog::InstanceType;
use dovetail_core::clock::Clock;
use dovetail_core::labels;
use dovetail_core::ledger::{ClaimRequest, ClaimState, Command, Entry, Offering, Outcome, Step};
use dovetail_core::node::Node;
use dovetail_core::nodepool::NodePool;
use dovetail_core::plane::{
    Liveness, allowed_zones, capacity_types, disrupted_taint, drain_step, plan_claim, relaunch_zone,
};
use dovetail_core::pod::Pod;
use dovetail_core::scheduling::{self, PoolInput, SolveOptions};
use dovetail_raft::Ledger;

use crate::millis;
use crate::trace::{self, Cause};

/// The finalizer every NodeClaim carries until its instance is gone.
const FINALIZER: &str = "karpenter.sh/termination";

/// The taint a node registers with (see `dovetail_cluster::sim::UNREGISTERED_TAINT`).
const UNREGISTERED_TAINT: &str = "karpenter.sh/unregistered";
use crate::zone::{Launch, LaunchOutcome, Terminate, Terminated, ZoneActor};

/// Pods for the pool to place on new capacity.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Provision {
    pub pods: Vec<Pod>,
    /// The trace of each pod's decision, parallel to `pods` (empty when untraced).
    pub causes: Vec<Cause>,
    /// The cluster's DaemonSets (their overhead lands on every new node they would run on).
    pub daemonsets: Vec<Pod>,
}

/// Pods a pool could not place, back to the Router for the next pool.
#[derive(Message, Clone, Debug)]
#[rtype(result = "()")]
pub struct Unplaced {
    pub pool: String,
    pub pods: Vec<Pod>,
    /// The trace each pod's next decision joins, parallel to `pods` (empty when untraced).
    pub causes: Vec<Cause>,
    pub reason: String,
}

/// Moves the pool's claims along their lifecycle from what the cluster shows: a launched
/// claim whose node appeared (matched by provider id) is registered (the unregistered taint
/// removed, the claim's labels and `karpenter.sh/registered` set); a registered one whose
/// startup taints are gone is initialized (`karpenter.sh/initialized`). Sent by the actor's
/// own timer, or by a caller that wants it now.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Reconcile;

/// Deletes a claim gracefully: cordon and taint its node, drain it tier by tier through the
/// eviction API (PDBs respected; refused evictions are retried on the next reconcile),
/// terminate the instance, then remove the node, the NodeClaim and the reservation.
#[derive(Message)]
#[rtype(result = "()")]
pub struct DeleteClaim {
    pub claim: String,
}

/// Counters.
#[derive(Message)]
#[rtype(result = "PoolStats")]
pub struct GetPoolStats;

#[derive(Clone, Debug, Default, PartialEq, Eq, MessageResponse)]
pub struct PoolStats {
    pub rounds: u64,
    pub claims_created: u64,
    pub launched: u64,
    /// Claims sent to another zone after insufficient capacity.
    pub relaunched: u64,
    /// Claims released with their pods sent back.
    pub released: u64,
    pub registered: u64,
    pub initialized: u64,
    /// Claims past a liveness timeout.
    pub expired: u64,
    /// Registered claims whose node went away (deleted when its instance was gone: a spot
    /// reclaim, a lost zone): terminated, and their pods provisioned for again.
    pub lost: u64,
    /// Claims found reserved or launching after a restart and launched again.
    pub resumed: u64,
    pub evicted: u64,
    /// Pods deleted past the terminationGracePeriod (PDBs and do-not-disrupt bypassed).
    pub force_deleted: u64,
    pub terminated: u64,
}

/// A claim of a round, before the ledger grants it.
struct Planned {
    reserve: ClaimRequest,
    claim: NodeClaim,
    request: LaunchRequest,
    pods: Traced,
    zones: Vec<String>,
}

/// Pods with the trace of each (the pool round's span of their decision; empty untraced).
#[derive(Default)]
struct Traced {
    pods: Vec<Pod>,
    causes: Vec<Cause>,
}

impl Traced {
    fn push(&mut self, pod: Pod, cause: Cause) {
        if cause.is_traced() {
            self.causes.resize(self.pods.len(), Cause::default());
            self.causes.push(cause);
        } else if !self.causes.is_empty() {
            self.causes.push(cause);
        }
        self.pods.push(pod);
    }

    fn extend(&mut self, other: Traced) {
        for (i, pod) in other.pods.into_iter().enumerate() {
            self.push(pod, trace::cause_at(&other.causes, i));
        }
    }
}

/// What the actor keeps per claim it is launching.
struct Pending {
    pods: Traced,
    request: LaunchRequest,
    /// Zones the claim's requirements allow (a claim pinned by its pods' topology has one).
    zones: Vec<String>,
}

/// A launched claim whose decisions are traced, followed until its pods are bound: per
/// decision, its `zone.launch` span, then its `cluster.bind` span (opened at registration),
/// and the decision's pods on the claim.
struct Follow {
    since: dovetail_core::ledger::Millis,
    instance_type: String,
    capacity_type: String,
    decisions: Vec<(Cause, Option<tracing::Span>, Vec<dovetail_core::pod::PodKey>)>,
}

/// How long a failed termination (other than throttling) waits before it is asked again.
const TERMINATE_RETRY_MS: dovetail_core::ledger::Millis = 5_000;

/// How long a registered claim's traces wait for its pods to bind.
const FOLLOW_FOR: dovetail_core::ledger::Millis = 15 * 60 * 1000;

/// A claim being drained, as one reconcile sees it.
struct Drain<'a> {
    id: &'a str,
    instance: Option<&'a str>,
    zone: &'a str,
    node: Option<&'a Arc<Node>>,
    now: dovetail_core::ledger::Millis,
    /// Deletion time plus the NodeClaim's terminationGracePeriod.
    deadline: Option<dovetail_core::ledger::Millis>,
}

/// The actor.
pub struct NodePoolActor {
    pool: NodePool,
    types: Arc<Vec<InstanceType>>,
    node_class: NodeClass,
    view: Arc<dyn ClusterView>,
    cluster: Arc<dyn ClusterWriter>,
    ledger: Arc<dyn Ledger>,
    clock: Arc<dyn Clock>,
    zones: BTreeMap<String, Addr<ZoneActor>>,
    router: Recipient<Unplaced>,
    liveness: Liveness,
    /// Claims whose instance termination was asked, not yet answered.
    terminating: BTreeSet<String>,
    /// Claims whose termination failed, with when to ask again (a throttled call waits for the
    /// retry-after the cloud gave; other errors for `TERMINATE_RETRY_MS`).
    terminate_retry: BTreeMap<String, dovetail_core::ledger::Millis>,
    /// Claims of rounds whose reservation is under way (not yet created or launched).
    reserving: BTreeSet<String>,
    pending: BTreeMap<String, Pending>,
    following: BTreeMap<String, Follow>,
    round: u64,
    stats: PoolStats,
}

/// The seams and neighbours a NodePoolActor works with.
pub struct PoolWiring {
    pub view: Arc<dyn ClusterView>,
    pub cluster: Arc<dyn ClusterWriter>,
    pub ledger: Arc<dyn Ledger>,
    pub clock: Arc<dyn Clock>,
    pub zones: BTreeMap<String, Addr<ZoneActor>>,
    pub router: Recipient<Unplaced>,
}

impl NodePoolActor {
    /// The pool launches only in zones that have a ZoneActor (its node class's subnets): the
    /// pool's requirements are narrowed to them.
    pub fn new(mut pool: NodePool, types: Arc<Vec<InstanceType>>, node_class: NodeClass, w: PoolWiring) -> Self {
        pool.requirements
            .add(labels::ZONE, dovetail_core::requirements::Requirement::is_in(w.zones.keys().map(String::as_str)));
        NodePoolActor {
            pool,
            types,
            node_class,
            view: w.view,
            cluster: w.cluster,
            ledger: w.ledger,
            clock: w.clock,
            zones: w.zones,
            router: w.router,
            liveness: Liveness::default(),
            terminating: BTreeSet::new(),
            terminate_retry: BTreeMap::new(),
            reserving: BTreeSet::new(),
            pending: BTreeMap::new(),
            following: BTreeMap::new(),
            round: 0,
            stats: PoolStats::default(),
        }
    }

    fn give_back(&mut self, ctx: &mut Context<Self>, pods: Traced, reason: String) {
        if pods.pods.is_empty() {
            return;
        }
        let msg = Unplaced { pool: self.pool.name.clone(), pods: pods.pods, causes: pods.causes, reason };
        if let Err(SendError::Full(msg)) = self.router.try_send(msg) {
            let router = self.router.clone();
            ctx.spawn(actix::fut::wrap_future::<_, Self>(async move {
                let _ = router.send(msg).await;
            }));
        }
    }

    /// A restart: the work that was under way is gone with the old context. Terminations are
    /// asked again by the next reconcile; rounds being reserved are resolved from the ledger
    /// and the cluster (a reserved claim with no NodeClaim is released); the claims being
    /// launched are sent again when the actor starts (the zone answers each claim once).
    pub(crate) fn restarting(&mut self) {
        self.terminating.clear();
        self.terminate_retry.clear();
        self.reserving.clear();
    }

    /// Deletes a claim that will not launch, frees its reservation and gives its pods back.
    fn release(&mut self, ctx: &mut Context<Self>, claim: &str, pods: Traced, reason: String) {
        self.stats.released += 1;
        let (ledger, claim, at) = (self.ledger.clone(), claim.to_string(), millis(self.clock.now()));
        let _ = self.cluster.delete_nodeclaim(&claim);
        let _ = self.cluster.remove_nodeclaim_finalizer(&claim, FINALIZER);
        ctx.spawn(actix::fut::wrap_future::<_, Self>(async move {
            let _ = ledger.propose(Entry { at, command: Command::Advance { claim, step: Step::Gone } }).await;
        }));
        self.give_back(ctx, pods, reason);
    }

    fn send_launch(&self, ctx: &mut Context<Self>, request: LaunchRequest, causes: Vec<Cause>) -> bool {
        let Some(zone) = self.zones.get(&request.zone) else { return false };
        let msg = Launch { requests: vec![request], causes, reply: ctx.address().recipient() };
        let zone = zone.clone();
        ctx.spawn(actix::fut::wrap_future::<_, Self>(async move {
            let _ = zone.send(msg).await;
        }));
        true
    }
}

impl Actor for NodePoolActor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        ctx.set_mailbox_capacity(1024);
        // After a restart: the launches that were under way.
        let requests: Vec<(LaunchRequest, Vec<Cause>)> =
            self.pending.values().map(|p| (p.request.clone(), trace::distinct(&p.pods.causes))).collect();
        for (r, causes) in requests {
            self.send_launch(ctx, r, causes);
        }
        ctx.run_interval(std::time::Duration::from_secs(1), |_, ctx| {
            // Full mailbox: the next tick will do.
            let _ = ctx.address().try_send(Reconcile);
        });
    }
}

impl Handler<Provision> for NodePoolActor {
    type Result = ();

    fn handle(&mut self, msg: Provision, ctx: &mut Context<Self>) {
        self.round += 1;
        self.stats.rounds += 1;
        let now = millis(self.clock.now());
        let batch = now.saturating_mul(1000).saturating_add(self.round % 1000);
        // The round's span in each traced decision, and each pod's.
        let rounds: Vec<(Cause, tracing::Span)> = trace::distinct(&msg.causes)
            .into_iter()
            .map(|cause| {
                let span = tracing::info_span!(
                    parent: None,
                    "nodepool.provision",
                    nodepool = %self.pool.name,
                    round = self.round,
                    round.pods = msg.pods.len(),
                    pods = msg.causes.iter().filter(|c| c.span_id() == cause.span_id()).count(),
                    claims = tracing::field::Empty,
                    claims.granted = tracing::field::Empty,
                );
                cause.adopt(&span);
                (cause, span)
            })
            .collect();
        let round_causes: Vec<Cause> = rounds.iter().map(|(_, s)| Cause::of(s)).collect();
        let pod_cause = |i: usize| -> Cause {
            let cause = trace::cause_at(&msg.causes, i);
            rounds
                .iter()
                .position(|(c, _)| cause.is_traced() && c.span_id() == cause.span_id())
                .map(|k| round_causes[k].clone())
                .unwrap_or_default()
        };
        let input = PoolInput { pool: self.pool.clone(), instance_types: self.types.clone() };
        let snapshot = scheduling::Snapshot {
            nodepools: vec![input.clone()],
            daemonsets: msg.daemonsets,
            ..scheduling::Snapshot::default()
        };
        let simulating: Vec<tracing::Span> = rounds
            .iter()
            .map(|(_, r)| tracing::info_span!(parent: r, "nodepool.simulate", nodepool = %self.pool.name))
            .collect();
        let results = scheduling::solve(&snapshot, &msg.pods, &SolveOptions::default());
        drop(simulating);
        let mut unplaced = Traced::default();
        for (i, _) in &results.errors {
            unplaced.push(msg.pods[*i].clone(), pod_cause(*i));
        }
        let mut planned: Vec<Planned> = Vec::new();
        let zones: Vec<String> = self.zones.keys().cloned().collect();
        for (i, c) in results.claims.iter().enumerate() {
            let spec = c.to_spec(&input);
            let mut pods = Traced::default();
            for &p in &c.pods {
                pods.push(msg.pods[p].clone(), pod_cause(p));
            }
            let Some(plan) = plan_claim(c, &spec, &self.types, &zones) else {
                unplaced.extend(pods);
                continue;
            };
            let id = format!("{}-{batch:x}-{i}", self.pool.name);
            let request = LaunchRequest {
                claim: id.clone(),
                nodepool: self.pool.name.clone(),
                node_class: self.node_class.clone(),
                zone: plan.zone.clone(),
                instance_types: plan.instance_types,
                capacity_types: plan.capacity_types,
                labels: spec.labels.clone(),
                tags: BTreeMap::new(),
            };
            let claim = NodeClaim {
                name: id.clone(),
                spec,
                finalizers: vec![FINALIZER.into()],
                deleting: false,
                status: NodeClaimStatus::default(),
            };
            planned.push(Planned {
                reserve: ClaimRequest {
                    id,
                    zone: plan.zone,
                    resources: plan.resources,
                    price_per_hour: plan.price_per_hour,
                },
                claim,
                request,
                pods,
                zones: plan.zones,
            });
        }
        self.reserving.extend(planned.iter().map(|p| p.reserve.id.clone()));
        let reserving: Vec<tracing::Span> = rounds
            .iter()
            .map(|(_, r)| {
                r.record("claims", planned.len());
                tracing::info_span!(parent: r, "ledger.reserve", nodepool = %self.pool.name, claims = planned.len(), claims.granted = tracing::field::Empty)
            })
            .collect();
        let (ledger, cluster, pool) = (self.ledger.clone(), self.cluster.clone(), self.pool.name.clone());
        let reserve = Command::Reserve { pool, batch, claims: planned.iter().map(|p| p.reserve.clone()).collect() };
        let work = async move {
            let outcome = ledger.propose(Entry { at: now, command: reserve }).await;
            (outcome, planned, unplaced, cluster)
        };
        ctx.spawn(work.into_actor(self).map(move |(outcome, planned, mut unplaced, cluster), act, ctx| {
            let granted: BTreeSet<String> = match outcome {
                Ok(c) => match c.outcome {
                    Outcome::Reserved { granted, .. } => granted.into_iter().collect(),
                    _ => BTreeSet::new(),
                },
                Err(_) => BTreeSet::new(),
            };
            for span in reserving.iter().chain(rounds.iter().map(|(_, r)| r)) {
                span.record("claims.granted", granted.len());
            }
            drop(reserving);
            for Planned { reserve: req, claim, request, pods, zones } in planned {
                act.reserving.remove(&req.id);
                if !granted.contains(&req.id) {
                    unplaced.extend(pods);
                    continue;
                }
                // A claim that exists already (a re-driven round) is launched, not created.
                match cluster.create_nodeclaim(claim) {
                    Ok(_) => act.stats.claims_created += 1,
                    Err(dovetail_cluster::ClusterError::AlreadyExists { .. }) => {}
                    Err(_) => {
                        unplaced.extend(pods);
                        continue;
                    }
                }
                let causes = trace::distinct(&pods.causes);
                act.pending.insert(req.id.clone(), Pending { pods, request: request.clone(), zones });
                if !act.send_launch(ctx, request, causes)
                    && let Some(p) = act.pending.remove(&req.id)
                {
                    act.release(ctx, &req.id, p.pods, format!("no zone actor for zone {}", req.zone));
                }
            }
            act.give_back(ctx, unplaced, "nodepool limits, global caps or no launchable type".into());
        }));
    }
}

impl Handler<LaunchOutcome> for NodePoolActor {
    type Result = ();

    fn handle(&mut self, msg: LaunchOutcome, ctx: &mut Context<Self>) {
        match msg.result {
            Ok(inst) => {
                // Answered already (a launch sent again after a restart).
                let Some(p) = self.pending.remove(&msg.claim) else { return };
                self.stats.launched += 1;
                self.follow(&msg.claim, &inst, p.pods, msg.causes);
                let status = NodeClaimStatus {
                    provider_id: Some(crate::kubelet::provider_id(&inst)),
                    node_name: None,
                    capacity: inst.capacity.clone(),
                    allocatable: inst.allocatable.clone(),
                    conditions: vec![Condition {
                        kind: "Launched".into(),
                        status: true,
                        reason: "Launched".into(),
                        message: String::new(),
                    }],
                };
                let _ = self.cluster.update_nodeclaim_status(&msg.claim, status);
            }
            Err(err) => {
                let Some(mut p) = self.pending.remove(&msg.claim) else { return };
                if let CloudError::InsufficientCapacity { .. } = err {
                    // The cheapest zone still available for the claim's types.
                    let now = millis(self.clock.now());
                    let mut marked: BTreeSet<Offering> = BTreeSet::new();
                    let _ = self.ledger.read(&mut |s| marked = s.unavailable(now).cloned().collect());
                    let unavailable = |t: &str, o: &dovetail_core::catalog::Offering| {
                        marked.contains(&Offering {
                            instance_type: t.to_string(),
                            zone: o.zone.clone(),
                            capacity_type: o.capacity_type,
                        })
                    };
                    let r = &p.request;
                    if let Some(choice) =
                        relaunch_zone(&self.types, &r.instance_types, &r.capacity_types, &p.zones, unavailable)
                    {
                        p.request.zone = choice.zone;
                        let (request, causes) = (p.request.clone(), trace::distinct(&p.pods.causes));
                        self.pending.insert(msg.claim.clone(), p);
                        if self.send_launch(ctx, request, causes) {
                            self.stats.relaunched += 1;
                            return;
                        }
                        let Some(back) = self.pending.remove(&msg.claim) else { return };
                        p = back;
                    }
                }
                // Nowhere left: release the claim and give its pods back.
                self.release(ctx, &msg.claim, p.pods, err.to_string());
            }
        }
    }
}

fn condition(kind: &str) -> Condition {
    Condition { kind: kind.into(), status: true, reason: kind.into(), message: String::new() }
}

impl Handler<Reconcile> for NodePoolActor {
    type Result = ();

    fn handle(&mut self, _: Reconcile, ctx: &mut Context<Self>) {
        let snap = self.view.snapshot();
        let mut claims = Vec::new();
        let pool = self.pool.name.clone();
        let _ = self.ledger.read(&mut |s| {
            claims = s
                .claims()
                .values()
                .filter(|c| c.pool == pool)
                .map(|c| (c.id.clone(), c.state.clone(), c.reserved_at, c.changed_at, c.zone.clone()))
                .collect();
        });
        let now = millis(self.clock.now());
        let mut steps: Vec<(String, Step)> = Vec::new();
        // Nodes by provider id, once per reconcile.
        let by_provider: HashMap<&str, &Arc<Node>> =
            snap.nodes.values().filter_map(|n| Some((n.provider_id.as_deref()?, n))).collect();
        for (id, state, reserved_at, changed_at, zone) in claims {
            if let ClaimState::Terminating { instance } = &state {
                let nc = snap.nodeclaims.get(&id);
                let node = nc.and_then(|nc| nc.status.provider_id.as_deref()).and_then(|p| by_provider.get(p).copied());
                // Deleted at `changed_at`: the terminationGracePeriod runs from there.
                let deadline = nc
                    .and_then(|nc| nc.spec.termination_grace_period)
                    .map(|tgp| changed_at.saturating_add(millis(tgp)));
                let drain = Drain { id: &id, instance: instance.as_deref(), zone: &zone, node, now, deadline };
                self.drain_and_terminate(ctx, &snap, drain);
                continue;
            }
            if self.liveness.check(&state, reserved_at, now).is_some() && !self.pending.contains_key(&id) {
                self.stats.expired += 1;
                steps.push((id, Step::Terminating));
                continue;
            }
            // Reserved or launching in the ledger but not in flight here: this actor restarted
            // (or another leader reserved it). Launch it again: the zone actor and the cloud are
            // idempotent by claim, so an instance made before the restart is found, not doubled.
            if matches!(state, ClaimState::Reserved | ClaimState::Launching)
                && !self.pending.contains_key(&id)
                && !self.reserving.contains(&id)
            {
                if let Some(nc) = snap.nodeclaims.get(&id) {
                    let request = LaunchRequest {
                        claim: id.clone(),
                        nodepool: self.pool.name.clone(),
                        node_class: self.node_class.clone(),
                        zone: zone.clone(),
                        instance_types: nc.spec.requirements.get(labels::INSTANCE_TYPE).values().to_vec(),
                        capacity_types: capacity_types(&nc.spec.requirements),
                        labels: nc.spec.labels.clone(),
                        tags: BTreeMap::new(),
                    };
                    let all: Vec<String> = self.zones.keys().cloned().collect();
                    let zones = allowed_zones(&nc.spec.requirements, &all);
                    self.pending
                        .insert(id.clone(), Pending { pods: Traced::default(), request: request.clone(), zones });
                    self.stats.resumed += 1;
                    self.send_launch(ctx, request, Vec::new());
                } else if state == ClaimState::Reserved {
                    // Its round stopped before the NodeClaim was created (a restart): nothing
                    // was launched; the pods are still pending and come back from the Router.
                    steps.push((id, Step::Gone));
                }
                continue;
            }
            let Some(nc) = snap.nodeclaims.get(&id) else { continue };
            let Some(provider_id) = nc.status.provider_id.as_deref() else { continue };
            let Some(node) = by_provider.get(provider_id) else {
                // A registered claim's node is gone (deleted with its instance): the claim
                // goes too (Karpenter deletes the NodeClaim of a deleted Node); terminating a
                // gone instance finds it gone.
                if matches!(state, ClaimState::Registered { .. } | ClaimState::Initialized { .. }) {
                    self.stats.lost += 1;
                    steps.push((id, Step::Terminating));
                }
                continue;
            };
            match state {
                ClaimState::Launched { .. } => {
                    let taints: Vec<_> = node.taints.iter().filter(|t| t.key != UNREGISTERED_TAINT).cloned().collect();
                    let mut labels: Vec<(String, String)> =
                        nc.spec.labels.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
                    labels.push((labels::REGISTERED.to_string(), "true".to_string()));
                    let mut status = nc.status.clone();
                    status.node_name = Some(node.name.clone());
                    status.set_condition(condition("Registered"));
                    let ok = self.cluster.set_node_taints(&node.name, taints).is_ok()
                        && self.cluster.label_node(&node.name, &labels).is_ok()
                        && self.cluster.update_nodeclaim_status(&id, status).is_ok();
                    if ok {
                        self.stats.registered += 1;
                        self.traced_registration(&id, &node.name);
                        steps.push((id, Step::Registered));
                    }
                }
                ClaimState::Registered { .. } => {
                    let starting = node.taints.iter().any(|t| {
                        t.key == UNREGISTERED_TAINT
                            || nc.spec.startup_taints.iter().any(|s| s.key == t.key && s.effect == t.effect)
                    });
                    if starting {
                        continue;
                    }
                    let mut status = nc.status.clone();
                    status.set_condition(condition("Initialized"));
                    let ok = self
                        .cluster
                        .label_node(&node.name, &[(labels::INITIALIZED.to_string(), "true".to_string())])
                        .is_ok()
                        && self.cluster.update_nodeclaim_status(&id, status).is_ok();
                    if ok {
                        self.stats.initialized += 1;
                        steps.push((id, Step::Initialized));
                    }
                }
                _ => {}
            }
        }
        self.traced_binding(&snap);
        if steps.is_empty() {
            return;
        }
        let (ledger, at) = (self.ledger.clone(), millis(self.clock.now()));
        ctx.spawn(actix::fut::wrap_future::<_, Self>(async move {
            for (claim, step) in steps {
                let _ = ledger.propose(Entry { at, command: Command::Advance { claim, step } }).await;
            }
        }));
    }
}

impl NodePoolActor {
    /// Keeps a launched claim's traces, with each decision's pods on it, until they bind.
    fn follow(&mut self, claim: &str, inst: &dovetail_cloud::Instance, pods: Traced, launches: Vec<Cause>) {
        let rounds = trace::distinct(&pods.causes);
        if rounds.is_empty() {
            return;
        }
        let decisions = rounds
            .iter()
            .enumerate()
            .map(|(k, round)| {
                let keys = (0..pods.pods.len())
                    .filter(|&i| trace::cause_at(&pods.causes, i).span_id() == round.span_id())
                    .map(|i| pods.pods[i].key.clone())
                    .collect();
                // The zone's span of this decision's launch (the round's when the zone sent none).
                (launches.get(k).cloned().unwrap_or_else(|| round.clone()), None, keys)
            })
            .collect();
        let follow = Follow {
            since: millis(self.clock.now()),
            instance_type: inst.instance_type.clone(),
            capacity_type: inst.capacity_type.to_string(),
            decisions,
        };
        self.following.insert(claim.to_string(), follow);
    }

    /// The claim's node registered: a `nodepool.register` span in each decision's trace, and a
    /// `cluster.bind` span under it that stays open until the decision's pods are bound.
    fn traced_registration(&mut self, claim: &str, node: &str) {
        let now = millis(self.clock.now());
        let Some(f) = self.following.get_mut(claim) else { return };
        f.since = now;
        for (cause, bind, pods) in &mut f.decisions {
            let register = tracing::info_span!(
                parent: None,
                "nodepool.register",
                nodepool = %self.pool.name,
                nodeclaim = claim,
                node,
                instance_type = %f.instance_type,
                capacity_type = %f.capacity_type,
            );
            cause.adopt(&register);
            *bind = Some(tracing::info_span!(
                parent: &register,
                "cluster.bind",
                nodepool = %self.pool.name,
                nodeclaim = claim,
                node,
                pods = pods.len(),
                pods.bound = tracing::field::Empty,
                pods.elsewhere = tracing::field::Empty,
            ));
        }
    }

    /// Closes the `cluster.bind` spans whose pods are all bound (or gone), and those of claims
    /// that waited past `FOLLOW_FOR` or are no longer live.
    fn traced_binding(&mut self, snap: &dovetail_cluster::Snapshot) {
        if self.following.is_empty() {
            return;
        }
        let now = millis(self.clock.now());
        self.following.retain(|id, f| {
            let node = snap.nodeclaims.get(id).and_then(|nc| nc.status.node_name.clone());
            let expired = now.saturating_sub(f.since) > FOLLOW_FOR || !snap.nodeclaims.contains_key(id);
            f.decisions.retain(|(_, bind, pods)| {
                let Some(bind) = bind else { return !expired };
                let (mut here, mut elsewhere, mut waiting) = (0u64, 0u64, 0u64);
                for k in pods {
                    match snap.pods.get(k).map(|p| p.node_name.as_deref()) {
                        Some(Some(n)) if Some(n) == node.as_deref() => here += 1,
                        Some(Some(_)) | None => elsewhere += 1,
                        Some(None) => waiting += 1,
                    }
                }
                if waiting > 0 && !expired {
                    return true;
                }
                bind.record("pods.bound", here);
                bind.record("pods.elsewhere", elsewhere);
                false
            });
            !f.decisions.is_empty()
        });
    }

    /// One step of a claim's termination: cordon and taint its node, evict the next tier
    /// (do-not-disrupt pods are waited for; past the grace deadline pods are deleted), and
    /// once the node is empty (or absent) terminate the instance.
    fn drain_and_terminate(&mut self, ctx: &mut Context<Self>, snap: &dovetail_cluster::Snapshot, d: Drain<'_>) {
        if let Some(node) = d.node {
            if !node.unschedulable {
                let _ = self.cluster.cordon(&node.name, true);
            }
            let taint = disrupted_taint();
            if !node.taints.contains(&taint) {
                let mut taints = node.taints.clone();
                taints.push(taint);
                let _ = self.cluster.set_node_taints(&node.name, taints);
            }
            let step = drain_step(snap.pods_on(&node.name).map(|p| p.as_ref()), d.now, d.deadline);
            if !step.is_done() {
                for p in step.delete {
                    if self.cluster.delete_pod(&p.key).is_ok() {
                        self.stats.force_deleted += 1;
                    }
                }
                for p in step.evict {
                    if self.cluster.evict(&p.key).is_ok() {
                        self.stats.evicted += 1;
                    }
                }
                return;
            }
        }
        match d.instance {
            Some(instance)
                if !self.terminating.contains(d.id) && self.terminate_retry.get(d.id).is_none_or(|at| d.now >= *at) =>
            {
                let Some(zone_actor) = self.zones.get(d.zone) else { return };
                self.terminating.insert(d.id.to_string());
                let msg = Terminate {
                    claim: d.id.to_string(),
                    instance: instance.to_string(),
                    reply: ctx.address().recipient(),
                };
                let zone_actor = zone_actor.clone();
                ctx.spawn(actix::fut::wrap_future::<_, Self>(async move {
                    let _ = zone_actor.send(msg).await;
                }));
            }
            Some(_) => {}
            // Never launched: nothing to terminate.
            None => self.finish(ctx, d.id, d.node.map(|n| n.name.clone())),
        }
    }

    /// The instance is gone: remove the node, the NodeClaim and the reservation.
    fn finish(&mut self, ctx: &mut Context<Self>, id: &str, node: Option<String>) {
        if let Some(node) = node {
            let _ = self.cluster.delete_node(&node);
        }
        let _ = self.cluster.delete_nodeclaim(id);
        let _ = self.cluster.remove_nodeclaim_finalizer(id, FINALIZER);
        let (ledger, claim, at) = (self.ledger.clone(), id.to_string(), millis(self.clock.now()));
        ctx.spawn(actix::fut::wrap_future::<_, Self>(async move {
            let _ = ledger.propose(Entry { at, command: Command::Advance { claim, step: Step::Gone } }).await;
        }));
    }
}

impl Handler<DeleteClaim> for NodePoolActor {
    type Result = ();

    fn handle(&mut self, msg: DeleteClaim, ctx: &mut Context<Self>) {
        let (ledger, at) = (self.ledger.clone(), millis(self.clock.now()));
        let work = async move {
            let _ = ledger
                .propose(Entry { at, command: Command::Advance { claim: msg.claim, step: Step::Terminating } })
                .await;
        };
        ctx.spawn(work.into_actor(self).map(|(), _, ctx| {
            let _ = ctx.address().try_send(Reconcile);
        }));
    }
}

impl Handler<Terminated> for NodePoolActor {
    type Result = ();

    fn handle(&mut self, msg: Terminated, ctx: &mut Context<Self>) {
        self.terminating.remove(&msg.claim);
        if let Err(e) = &msg.result {
            // Asked again by a reconcile once the wait is over.
            let wait = match e {
                CloudError::Throttled { retry_after, .. } => millis((*retry_after).min(crate::MAX_RETRY_WAIT)),
                _ => TERMINATE_RETRY_MS,
            };
            self.terminate_retry.insert(msg.claim, millis(self.clock.now()).saturating_add(wait));
            return;
        }
        self.terminate_retry.remove(&msg.claim);
        self.stats.terminated += 1;
        let snap = self.view.snapshot();
        let provider_id = snap.nodeclaims.get(&msg.claim).and_then(|nc| nc.status.provider_id.clone());
        let node = provider_id
            .as_deref()
            .and_then(|p| snap.nodes.values().find(|n| n.provider_id.as_deref() == Some(p)))
            .map(|n| n.name.clone());
        self.finish(ctx, &msg.claim, node);
    }
}

impl Handler<crate::Restart> for NodePoolActor {
    type Result = ();

    fn handle(&mut self, _: crate::Restart, ctx: &mut Context<Self>) {
        ctx.stop();
    }
}

impl Handler<GetPoolStats> for NodePoolActor {
    type Result = PoolStats;

    fn handle(&mut self, _: GetPoolStats, _: &mut Context<Self>) -> PoolStats {
        self.stats.clone()
    }
}
