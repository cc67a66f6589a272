//! One run's work, off the actor: the notices read against the ledger, proposed, the nodes
//! tainted, the replacements sized, reserved and created. See the module above for the steps.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use actix::Addr;
use dovetail_cluster::ClusterView;
use dovetail_core::clock::Clock;
use dovetail_core::cluster::{Event, NodeClaim, NodePatch, ObjectKind, Snapshot};
use dovetail_core::effect::{Action, Effect};
use dovetail_core::interruption::{self, Going, Kind, Promised};
use dovetail_core::labels;
use dovetail_core::ledger::{Command, Entry, Millis, Notice, Outcome, Replacement, State, Term};
use dovetail_core::plane::{Latencies, Names, disrupted_taint};
use dovetail_core::provisioning::{planned_claim, unique_claim_name};
use dovetail_core::scheduling::PoolInput;
use dovetail_raft::{Ledger, read_with};

use crate::config::Config;
use crate::errors::Errors;
use crate::executor::{Done, Executor};
use crate::pool::{LaunchNow, NodePoolActor};

/// What one run did.
#[derive(Debug, Default)]
pub(super) struct Acted {
    /// Instances recorded as interrupted (acting) for the first time.
    pub(super) acted: u64,
    /// Notices the ledger knew already, and those that only brought an instance's deadline
    /// earlier (recorded, not acted on again).
    pub(super) duplicates: u64,
    pub(super) earlier: u64,
    /// Instances recorded by an earlier run whose replacements were never sized (that run
    /// failed after its `Interrupt` committed): tainted and sized by this one.
    pub(super) resumed: u64,
    /// Nodes whose taint the cluster took.
    pub(super) tainted: u64,
    /// Notices for instances no claim knows, dropped.
    pub(super) unmatched: u64,
    pub(super) replacements: u64,
    pub(super) denied: u64,
    pub(super) on_existing: u64,
    pub(super) to_taint: Latencies,
    pub(super) to_replacement: Latencies,
    /// Where the run's time went, ms: (phase, time) in order.
    pub(super) phases: Vec<(&'static str, u64)>,
}

impl Acted {
    /// Ends a phase at `now` that started at `*since`.
    fn phase(&mut self, name: &'static str, since: &mut Millis, now: Millis) {
        debug_assert!(super::PHASES.contains(&name), "{name} is not a phase");
        self.phases.push((name, now.saturating_sub(*since)));
        *since = now;
    }
}

/// What a run works with, off the actor.
pub(super) struct Work {
    pub(super) ledger: Arc<dyn Ledger>,
    pub(super) view: Arc<dyn ClusterView>,
    pub(super) clock: Arc<dyn Clock>,
    pub(super) executor: Executor,
    pub(super) errors: Arc<Errors>,
    pub(super) cfg: Arc<Config>,
    pub(super) zones: Vec<String>,
    pub(super) pools: BTreeMap<String, (PoolInput, Addr<NodePoolActor>)>,
    pub(super) names: Names,
    /// The provisioner's holds: pods planned onto capacity and not bound yet.
    pub(super) nominations: crate::nominate::Nominations,
}

/// Why a run did not act (its messages stay in the queue, to be seen again).
#[derive(Debug, thiserror::Error)]
pub(super) enum NotActed {
    #[error("not the leader")]
    NotLeader,
    #[error("the cluster view has not synced")]
    NotSynced,
    #[error("ledger: {0}")]
    Ledger(String),
    #[error("the term is over (fenced at term {0})")]
    Fenced(Term),
    #[error("sizing the replacements panicked: {0}")]
    Sizing(String),
    #[error("the run took longer than the visibility timeout ({0} ms)")]
    TimedOut(u128),
}

impl NotActed {
    /// Whether another control node should see the messages at once (this one no longer
    /// acts); otherwise they come back after a pause.
    pub(super) fn hand_over(&self) -> bool {
        matches!(self, NotActed::NotLeader | NotActed::Fenced(_))
    }
}

/// A run's notices read against the ledger's records.
#[derive(Debug, Default, PartialEq)]
struct Classified {
    /// To propose: instances the ledger does not know, an acting notice for an instance
    /// recorded as an event only, and an earlier deadline for one it knows.
    propose: Vec<Notice>,
    /// Of those, the instances new to the ledger or now acting: each gets its event (and its
    /// taint and replacements when it acts).
    new: BTreeSet<String>,
    /// Instances recorded as acting whose replacements were never sized, with their claims.
    resume: Vec<(String, String)>,
    /// Notices for instances the ledger knows, with nothing new (deleted, nothing done).
    duplicates: u64,
    /// Instances no claim of the ledger and no NodeClaim of the cluster knows: their notices
    /// are dropped (the messages deleted and counted), never proposed. Karpenter's
    /// EventBridge rules forward the whole account's state changes; another cluster's or a
    /// plain EC2 user's instances are none of this ledger's business (an hour of records and
    /// a log entry each).
    unmatched: BTreeSet<String>,
}

/// The messages among `events` that name only instances in `unmatched` (each counted once,
/// however many of them one instance's notice merged).
fn unmatched_messages(events: &[(interruption::Event, Millis)], unmatched: &BTreeSet<String>) -> u64 {
    let only_unmatched =
        |e: &interruption::Event| !e.instances.is_empty() && e.instances.iter().all(|i| unmatched.contains(i));
    events.iter().filter(|(e, _)| e.kind != Kind::NoOp && only_unmatched(e)).count() as u64
}

/// Reads `notices` against `s`; `in_cluster` says whether a NodeClaim of the cluster names an
/// instance (one the ledger may not know yet: adopted at the next reconcile).
fn classify(s: &State, notices: Vec<Notice>, in_cluster: &dyn Fn(&str) -> bool) -> Classified {
    let mut c = Classified::default();
    for n in notices {
        if n.claim.is_none() && s.interruption(&n.instance).is_none() && !in_cluster(&n.instance) {
            c.unmatched.insert(n.instance);
            continue;
        }
        match s.interruption(&n.instance) {
            Some(r) if !n.acts || r.acts => {
                if r.acts
                    && !r.sized
                    && let Some(claim) = r.claim.as_deref().filter(|claim| s.claims().contains_key(*claim))
                {
                    c.resume.push((n.instance.clone(), claim.to_string()));
                }
                if n.deadline < r.deadline {
                    c.propose.push(n);
                } else if c.resume.last().is_none_or(|(i, _)| *i != n.instance) {
                    c.duplicates += 1;
                }
            }
            _ => {
                c.new.insert(n.instance.clone());
                c.propose.push(n);
            }
        }
    }
    c
}

/// What was interrupted before a sizing: the live claims of `pools` interrupted and not among
/// `now` (the claims being sized), and the replacements launched for them.
fn before(s: &State, pools: &[String], now: &BTreeSet<String>) -> (BTreeSet<String>, BTreeSet<String>) {
    let claims: BTreeSet<String> =
        pools.iter().flat_map(|p| s.interrupted_in(p)).map(|c| c.id.clone()).filter(|id| !now.contains(id)).collect();
    let replacements =
        claims.iter().filter_map(|id| s.interruption_of(id)).flat_map(|r| r.replacements.iter().cloned()).collect();
    (claims, replacements)
}

/// What the record stage leaves to the replace stage: the instances whose replacements are to
/// be sized, and their nodes.
#[derive(Debug)]
pub(super) struct ToReplace {
    pub(super) term: Term,
    pub(super) instances: Vec<String>,
    pub(super) going: Vec<Going>,
}

impl ToReplace {
    /// Several records' work as one sizing (an instance or node named twice, once).
    fn merged(jobs: Vec<ToReplace>) -> Option<ToReplace> {
        let mut jobs = jobs.into_iter();
        let mut all = jobs.next()?;
        let mut seen: BTreeSet<String> = all.instances.iter().cloned().collect();
        let mut nodes: BTreeSet<String> = all.going.iter().map(|g| g.node.clone()).collect();
        for j in jobs {
            all.term = all.term.max(j.term);
            all.instances.extend(j.instances.into_iter().filter(|i| seen.insert(i.clone())));
            all.going.extend(j.going.into_iter().filter(|g| nodes.insert(g.node.clone())));
        }
        Some(all)
    }
}

/// The nodes of claims: the one the claim's `status.nodeName` names when it carries the
/// claim's provider id (a name can come back: EC2 reuses private IPs), else the node with the
/// claim's provider id, from an index of every node built at the first miss (a stage looks up
/// a few thousand claims of a cluster of tens of thousands of nodes).
struct NodesOf<'a> {
    snap: &'a Snapshot,
    by_provider: Option<BTreeMap<&'a str, &'a str>>,
}

impl<'a> NodesOf<'a> {
    fn new(snap: &'a Snapshot) -> Self {
        NodesOf { snap, by_provider: None }
    }

    fn node(&mut self, claim: &str) -> Option<String> {
        let snap = self.snap;
        let status = &snap.nodeclaims.get(claim)?.status;
        let provider = status.provider_id.as_deref()?;
        if let Some(n) = status.node_name.as_deref().and_then(|n| snap.nodes.get(n))
            && n.provider_id.as_deref() == Some(provider)
        {
            return Some(n.name.clone());
        }
        let index = self.by_provider.get_or_insert_with(|| {
            snap.nodes.values().filter_map(|n| Some((n.provider_id.as_deref()?, n.name.as_str()))).collect()
        });
        index.get(provider).map(|n| (*n).to_string())
    }
}

impl Work {
    /// The record stage: the notices recorded in the ledger, the nodes tainted, the events
    /// made; what is left to size, if anything.
    pub(super) async fn record(
        &mut self,
        events: Vec<(interruption::Event, Millis)>,
        sent: &BTreeMap<String, Millis>,
    ) -> Result<(Acted, Option<ToReplace>), NotActed> {
        let mut acted = Acted::default();
        if events.iter().all(|(e, _)| e.kind == Kind::NoOp) {
            return Ok((acted, None));
        }
        let leadership = self.ledger.leadership().borrow().clone();
        if !leadership.leader {
            return Err(NotActed::NotLeader);
        }
        if !self.view.synced() {
            return Err(NotActed::NotSynced);
        }
        let term = leadership.term;
        let settings = self.cfg.lifecycle.interruption;
        let now = self.clock.now_millis();
        let mut since = now;
        // The instances the cluster's NodeClaims name (readable or not), for notices the
        // ledger does not know.
        let snap = self.view.snapshot();
        let in_cluster = move |instance: &str| {
            let ends_with = |p: &str| p.rsplit('/').next() == Some(instance);
            snap.nodeclaims.values().any(|nc| nc.status.provider_id.as_deref().is_some_and(ends_with))
                || snap.unreadable.values().any(|u| u.provider_id.as_deref().is_some_and(ends_with))
        };
        // 1. The notices, read against the ledger's records; those of instances nobody here
        // knows are dropped before anything is proposed.
        let plan = read_with(&*self.ledger, move |s| {
            let notices = interruption::notices(&events, |i| s.claim_of_instance(i), &settings);
            let plan = classify(s, notices, &in_cluster);
            let unmatched = unmatched_messages(&events, &plan.unmatched);
            (plan, unmatched)
        })
        .await
        .map_err(|e| NotActed::Ledger(e.to_string()))?;
        let (plan, unmatched) = plan;
        acted.duplicates = plan.duplicates;
        acted.unmatched = unmatched;
        if plan.propose.is_empty() && plan.resume.is_empty() {
            return Ok((acted, None));
        }
        acted.phase("read", &mut since, self.clock.now_millis());
        let mut recorded: BTreeSet<String> = BTreeSet::new();
        if !plan.propose.is_empty() {
            let outcome = self.propose(term, now, Command::Interrupt { notices: plan.propose.clone() }).await?;
            let Outcome::Interrupted { recorded: r, duplicates } = outcome else {
                return Err(NotActed::Ledger(format!("unexpected outcome {outcome:?}")));
            };
            acted.duplicates += duplicates.len() as u64;
            recorded = r.into_iter().collect();
        }
        acted.phase("record", &mut since, self.clock.now_millis());
        let fresh: Vec<&Notice> = plan.propose.iter().filter(|n| recorded.contains(&n.instance)).collect();
        acted.earlier = fresh.iter().filter(|n| !plan.new.contains(&n.instance)).count() as u64;
        // 2. Taints and events, at once: an event for each new record, a taint for each
        // acting one (those resumed included: the taint may not have been applied).
        let snap = self.view.snapshot();
        let mut nodes = NodesOf::new(&snap);
        let mut events = Vec::new();
        let mut going: Vec<Going> = Vec::new();
        let mut claim_of: BTreeMap<String, String> = BTreeMap::new();
        let mut to_size: Vec<String> = Vec::new();
        for n in fresh.iter().filter(|n| plan.new.contains(&n.instance)) {
            let Some(claim) = n.claim.as_deref() else { continue };
            let (reason, warning) = event_reason(n.kind);
            let message = format!("instance {} of nodeclaim {claim}: {}", n.instance, n.kind);
            let e =
                Event { kind: ObjectKind::NodeClaim, name: claim.to_string(), warning, reason: reason.into(), message };
            events.push(Effect::new(claim, Action::Event(e)));
            if n.acts {
                acted.acted += 1;
                // Karpenter counts an interrupted NodeClaim as disrupted, the message's kind its
                // reason.
                if let Some(nc) = snap.nodeclaims.get(claim) {
                    let capacity_type =
                        nc.spec.labels.get(labels::CAPACITY_TYPE).map(String::as_str).unwrap_or_default();
                    self.executor.metrics().nodeclaim_disrupted(n.kind.as_str(), &nc.spec.nodepool, capacity_type);
                }
                to_size.push(n.instance.clone());
                if let Some(node) = nodes.node(claim) {
                    claim_of.insert(node.clone(), claim.to_string());
                    going.push(Going { instance: n.instance.clone(), node });
                }
            }
        }
        for (instance, claim) in &plan.resume {
            acted.resumed += 1;
            to_size.push(instance.clone());
            if let Some(node) = nodes.node(claim) {
                claim_of.insert(node.clone(), claim.clone());
                going.push(Going { instance: instance.clone(), node });
            }
        }
        // The taints first (what keeps new pods off), the events after them.
        let taint = NodePatch { add_taints: vec![disrupted_taint()], ..NodePatch::default() };
        let taints: Vec<Effect> = claim_of
            .iter()
            .map(|(node, claim)| Effect::new(claim, Action::PatchNode { node: node.clone(), patch: taint.clone() }))
            .collect();
        let done = if taints.is_empty() { Vec::new() } else { self.executor.run(term, taints).await };
        let tainted = self.clock.now_millis();
        acted.phase("taint", &mut since, tainted);
        if !events.is_empty() {
            self.executor.run(term, events).await;
        }
        acted.phase("events", &mut since, self.clock.now_millis());
        let instance_of: BTreeMap<&str, &str> = going.iter().map(|g| (g.node.as_str(), g.instance.as_str())).collect();
        for (e, d) in &done {
            let Action::PatchNode { node, .. } = &e.action else { continue };
            if !matches!(d, Done::Applied | Done::Unchanged) {
                continue;
            }
            acted.tainted += 1;
            if let Some(at) = instance_of.get(node.as_str()).and_then(|i| sent.get(*i)) {
                acted.to_taint.record(tainted.saturating_sub(*at));
            }
        }
        // Every acting claim's record is marked sized, those without a node too (a claim not
        // registered yet runs no pods: it needs no replacement and drains at once).
        let job = (!to_size.is_empty()).then_some(ToReplace { term, instances: to_size, going });
        Ok((acted, job))
    }

    /// The replace stage, for every record stage's work waiting (one sizing): the capacity
    /// their pods need sized off the actor thread, on the cluster without them and without
    /// what is promised already, reserved in the ledger, the granted NodeClaims created.
    pub(super) async fn replace(
        &mut self,
        jobs: Vec<ToReplace>,
        sent: &BTreeMap<String, Millis>,
    ) -> Result<Acted, NotActed> {
        let mut acted = Acted::default();
        let Some(ToReplace { term, instances: mut to_size, mut going }) = ToReplace::merged(jobs) else {
            return Ok(acted);
        };
        let leadership = self.ledger.leadership().borrow().clone();
        if !leadership.is_current(term) {
            return Err(NotActed::NotLeader);
        }
        let mut since = self.clock.now_millis();
        let pool_names: Vec<String> = self.pools.keys().cloned().collect();
        // Only the instances still waiting for their sizing: one resumed by a redelivery while
        // its first sizing ran (or sized by another term's leader) is sized already.
        let asked = to_size.clone();
        let (live, before_claims, replacements_before) = read_with(&*self.ledger, move |s| {
            let mut live: BTreeSet<String> = BTreeSet::new();
            let mut claims: BTreeSet<String> = BTreeSet::new();
            for i in &asked {
                let Some(r) = s.interruption(i) else { continue };
                if let Some(c) = r.claim.as_deref().filter(|c| r.acts && !r.sized && s.claims().contains_key(*c)) {
                    live.insert(i.clone());
                    claims.insert(c.to_string());
                }
            }
            let (b, r) = before(s, &pool_names, &claims);
            (live, b, r)
        })
        .await
        .map_err(|e| NotActed::Ledger(e.to_string()))?;
        to_size.retain(|i| live.contains(i));
        going.retain(|g| live.contains(&g.instance));
        if to_size.is_empty() {
            return Ok(acted);
        }
        let snap = self.view.snapshot();
        let mut nodes = NodesOf::new(&snap);
        let gone_before: BTreeSet<String> = before_claims.iter().filter_map(|claim| nodes.node(claim)).collect();
        acted.phase("read", &mut since, self.clock.now_millis());
        let held = self.nominations.held(self.clock.now_millis());
        let pools: Vec<PoolInput> = self.pools.values().map(|(p, _)| p.clone()).collect();
        let opts = self.cfg.solve.clone();
        let sized_on = snap.clone();
        let sizing = tokio::task::spawn_blocking(move || {
            let promised = Promised { gone_before, replacements: replacements_before, held: &held };
            interruption::size(&sized_on, &pools, &going, &promised, &opts)
        })
        .await
        .map_err(|e| NotActed::Sizing(e.to_string()))?;
        acted.phase("size", &mut since, self.clock.now_millis());
        acted.on_existing = sizing.on_existing as u64;
        for (pod, why) in &sizing.unplaced {
            self.errors.note("size_replacements", "unplaced", &format!("pod/{pod}"), why);
        }
        let mut replacements = Vec::new();
        let mut creates = Vec::new();
        let pool_list: Vec<&(PoolInput, Addr<NodePoolActor>)> = self.pools.values().collect();
        for (claim, serves) in &sizing.claims {
            let Some((input, _)) = pool_list.get(claim.pool) else { continue };
            let pool = input.pool.name.clone();
            let id = unique_claim_name(&mut self.names, &pool, |id| snap.nodeclaims.contains_key(id));
            let Some(planned) = planned_claim(claim, input, &self.zones, id) else {
                self.errors.note(
                    "size_replacements",
                    "no_zone",
                    &format!("nodepool/{pool}"),
                    &"a replacement has no zone",
                );
                continue;
            };
            creates.push((pool.clone(), planned.nodeclaim, planned.reserve.zone.clone()));
            replacements.push(Replacement { pool, claim: planned.reserve, serves: serves.clone() });
        }
        let serves_of: BTreeMap<String, Vec<String>> =
            replacements.iter().map(|r| (r.claim.id.clone(), r.serves.clone())).collect();
        let command = Command::ReplaceInterrupted { instances: to_size, replacements };
        let outcome = self.propose(term, self.clock.now_millis(), command).await?;
        acted.phase("reserve", &mut since, self.clock.now_millis());
        let Outcome::Reserved { granted, denied } = outcome else {
            return Err(NotActed::Ledger(format!("unexpected outcome {outcome:?}")));
        };
        acted.denied = denied.len() as u64;
        for (claim, why) in &denied {
            self.errors.note("reserve_replacement", "denied", &format!("nodeclaim/{claim}"), why);
        }
        // 4. The granted replacements created, and handed to their pools to launch at once.
        let granted: BTreeSet<String> = granted.into_iter().collect();
        let mut effects = Vec::new();
        let mut pool_of: BTreeMap<String, (String, String)> = BTreeMap::new();
        for (pool, nc, zone) in creates.into_iter().filter(|(_, nc, _)| granted.contains(&nc.name)) {
            pool_of.insert(nc.name.clone(), (pool, zone));
            effects.push(Effect::new(&nc.name.clone(), Action::CreateNodeClaim(Box::new(nc))));
        }
        let done = if effects.is_empty() { Vec::new() } else { self.executor.run(term, effects).await };
        let mut launch: BTreeMap<String, Vec<(NodeClaim, String)>> = BTreeMap::new();
        let mut created: BTreeSet<String> = BTreeSet::new();
        for (e, d) in done {
            let (Action::CreateNodeClaim(nc), applied @ (Done::Applied | Done::Unchanged)) = (e.action, d) else {
                continue;
            };
            let Some((pool, zone)) = pool_of.get(&nc.name) else { continue };
            if applied == Done::Applied {
                self.executor.metrics().nodeclaim_created(pool, "interrupted");
            }
            created.insert(nc.name.clone());
            launch.entry(pool.clone()).or_default().push((*nc, zone.clone()));
        }
        acted.replacements = created.len() as u64;
        for (pool, claims) in launch {
            if let Some((_, actor)) = self.pools.get(&pool)
                && let Err(e) = actor.try_send(LaunchNow(claims))
            {
                // The pool's reconcile launches them on its next tick.
                let kind = if matches!(e, actix::dev::SendError::Full(_)) { "mailbox_full" } else { "closed" };
                self.errors.note("launch_replacements", kind, &format!("nodepool/{pool}"), &e);
            }
        }
        let replaced = self.clock.now_millis();
        acted.phase("create", &mut since, replaced);
        let served: BTreeSet<&String> =
            created.iter().filter_map(|id| serves_of.get(id)).flat_map(|serves| serves.iter()).collect();
        for i in served {
            if let Some(at) = sent.get(i) {
                acted.to_replacement.record(replaced.saturating_sub(*at));
            }
        }
        Ok(acted)
    }

    async fn propose(&self, term: Term, at: Millis, command: Command) -> Result<Outcome, NotActed> {
        let committed =
            self.ledger.propose(Entry { term, at, command }).await.map_err(|e| NotActed::Ledger(e.to_string()))?;
        match committed.outcome {
            Outcome::Fenced { term } => Err(NotActed::Fenced(term)),
            Outcome::Rejected { reason } => Err(NotActed::Ledger(reason)),
            o => Ok(o),
        }
    }
}

/// Karpenter's event for a message kind, and whether it is a warning.
fn event_reason(kind: Kind) -> (&'static str, bool) {
    match kind {
        Kind::SpotInterrupted => ("SpotInterrupted", true),
        Kind::RebalanceRecommendation => ("SpotRebalanceRecommendation", false),
        Kind::ScheduledChange => ("InstanceUnhealthy", true),
        Kind::InstanceStopped => ("InstanceStopping", true),
        Kind::InstanceTerminated => ("InstanceTerminating", true),
        Kind::CapacityReservationInterrupted => ("CapacityReservationInstanceInterrupted", true),
        Kind::NoOp => ("Unknown", false),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use dovetail_core::cluster::{NodeClaim, NodeClaimStatus, Snapshot};
    use dovetail_core::node::Node;

    use super::NodesOf;

    /// Notices for an instance no claim and no NodeClaim knows (another cluster's, in the
    /// account-wide queue) are dropped before anything is proposed, and counted per message
    /// however a batch merged them; one the cluster's NodeClaims name is proposed.
    #[test]
    fn a_notice_for_an_instance_no_claim_knows_is_dropped_and_counted_per_message() {
        use dovetail_core::interruption::{self, Event, Kind, Settings};
        use dovetail_core::ledger::State;
        let event = |kind: Kind, instance: &str| {
            let e = Event {
                kind,
                id: format!("e-{instance}-{kind}"),
                time: Some(1_000),
                instances: vec![instance.to_string()],
                action: None,
                note: String::new(),
            };
            (e, 1_000)
        };
        let events = vec![
            event(Kind::SpotInterrupted, "i-foreign"),
            event(Kind::InstanceStopped, "i-foreign"),
            event(Kind::SpotInterrupted, "i-ours"),
        ];
        let s = State::default();
        let notices = interruption::notices(&events, |i| s.claim_of_instance(i), &Settings::default());
        let plan = super::classify(&s, notices, &|i: &str| i == "i-ours");
        assert_eq!(plan.unmatched, ["i-foreign".to_string()].into());
        assert_eq!(super::unmatched_messages(&events, &plan.unmatched), 2, "two messages, one notice");
        let proposed: Vec<&str> = plan.propose.iter().map(|n| n.instance.as_str()).collect();
        assert_eq!(proposed, vec!["i-ours"], "the cluster's own instance is proposed, the other not");
    }

    fn snapshot(nodes: &[(&str, &str)], claims: &[(&str, Option<&str>, Option<&str>)]) -> Snapshot {
        let mut snap = Snapshot::default();
        for (name, provider) in nodes {
            let n = Node { name: (*name).into(), provider_id: Some((*provider).into()), ..Node::default() };
            snap.nodes.insert((*name).into(), Arc::new(n));
        }
        for (name, provider, node) in claims {
            let c = NodeClaim {
                name: (*name).into(),
                spec: Default::default(),
                finalizers: Vec::new(),
                deleting: false,
                status: NodeClaimStatus {
                    provider_id: provider.map(Into::into),
                    node_name: node.map(Into::into),
                    ..NodeClaimStatus::default()
                },
                resource_version: 1,
                created: None,
            };
            snap.nodeclaims.insert((*name).into(), Arc::new(c));
        }
        snap
    }

    /// The node a claim names when it carries the claim's instance; else the node with the
    /// instance (a name EC2 gave again, a claim not naming its node yet); none without one.
    #[test]
    fn a_claims_node_is_the_one_with_its_instance() {
        let snap = snapshot(
            &[("ip-1", "aws:///a/i-1"), ("ip-2", "aws:///a/i-2"), ("ip-3", "aws:///a/i-3")],
            &[
                ("named", Some("aws:///a/i-1"), Some("ip-1")),
                ("reused", Some("aws:///a/i-3"), Some("ip-2")),
                ("unnamed", Some("aws:///a/i-2"), None),
                ("booting", None, None),
                ("gone", Some("aws:///a/i-9"), Some("ip-9")),
            ],
        );
        let mut nodes = NodesOf::new(&snap);
        assert_eq!(nodes.node("named").as_deref(), Some("ip-1"));
        assert!(nodes.by_provider.is_none(), "a claim naming its node needs no index");
        assert_eq!(nodes.node("reused").as_deref(), Some("ip-3"), "the name is another instance's");
        assert_eq!(nodes.node("unnamed").as_deref(), Some("ip-2"));
        assert_eq!(nodes.node("booting"), None);
        assert_eq!(nodes.node("gone"), None);
        assert_eq!(nodes.node("no-such-claim"), None);
    }
}
