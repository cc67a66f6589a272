//! The ledger's state machine: what the control plane decided, replicated as commands.
//!
//! NodePool limits and usage, global caps (cluster-wide resources and $/hour across every
//! NodePool: the spend cap that stops a runaway scale-up), the registry of every NodeClaim
//! the plane decided on with its lifecycle and launch batch, and unavailable offerings (ICE
//! marks with expiry).
//!
//! [`State::apply`] is pure: it reads no clock (commands carry the proposer's timestamp in
//! [`Entry::at`], clamped so that time never goes back), does no I/O and iterates ordered
//! maps, so replaying a log gives the same state on every node.
//!
//! **Fencing.** Every entry carries the term its proposer decided under ([`Entry::term`]).
//! The state remembers the highest term applied; an entry of an older term changes nothing
//! and comes back [`Outcome::Fenced`]. A new leader's first entry is [`Command::Lead`], so
//! every decision a deposed leader made from what it read is refused from then on, and its
//! effects (which run only after their intent committed in the current term) never run.
//! The async `Ledger` seam and its implementations live in `dovetail-raft`.

mod interrupt;
mod types;

use std::collections::{BTreeMap, BTreeSet};

pub use interrupt::INTERRUPTION_MEMORY;
pub use types::*;

use crate::catalog::CapacityType;
use crate::disruption::budget;
use crate::nodepool::{Budget, BudgetNodes, DisruptionReason};
use crate::resources::{ResourceList, ResourceName};

/// The replicated state.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct State {
    pools: BTreeMap<String, Pool>,
    caps: Caps,
    /// Across every pool.
    total: ResourceList,
    total_price: MicroDollars,
    claims: BTreeMap<String, Claim>,
    batches: BTreeMap<String, BatchRecord>,
    unavailable: BTreeMap<Offering, Millis>,
    /// Disruption commands granted and not ended, by id.
    disruptions: BTreeMap<String, DisruptionCommand>,
    /// Interruptions recorded, by instance (see [`Command::Interrupt`]).
    interruptions: BTreeMap<String, Interruption>,
    /// Derived from `claims` and `interruptions` (not stored in snapshots).
    index: interrupt::Index,
    /// The highest term applied.
    term: Term,
    /// The latest proposer time applied (entries are clamped to it: time never goes back).
    now: Millis,
    /// Entries applied.
    applied: u64,
}

/// Every field of a [`State`], owned: what a snapshot stores and restores exactly
/// ([`State::into_parts`], [`State::from_parts`]).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct StateParts {
    pub pools: BTreeMap<String, Pool>,
    pub caps: Caps,
    pub total: ResourceList,
    pub total_price: MicroDollars,
    pub claims: BTreeMap<String, Claim>,
    pub batches: BTreeMap<String, BatchRecord>,
    /// Offerings marked unavailable, with the time each mark expires (expired ones included
    /// until an entry sweeps them).
    pub unavailable: BTreeMap<Offering, Millis>,
    pub disruptions: BTreeMap<String, DisruptionCommand>,
    pub interruptions: BTreeMap<String, Interruption>,
    pub term: Term,
    pub now: Millis,
    pub applied: u64,
}

/// The first resource of `limits` that `usage + extra` exceeds.
fn exceeded(usage: &ResourceList, extra: &ResourceList, limits: &ResourceList) -> Option<ResourceName> {
    limits.iter().find(|(n, limit)| usage.get(n).saturating_add(extra.get(n)) > *limit).map(|(n, _)| n.clone())
}

/// Why a holding of `resources` at `price` would not be granted: the pool's `(limits, usage)`
/// and the cluster's `(caps, total, total price)` as they stand.
fn denial(
    (limits, usage): (&ResourceList, &ResourceList),
    (caps, total, total_price): (&Caps, &ResourceList, MicroDollars),
    resources: &ResourceList,
    price: MicroDollars,
) -> Option<Denial> {
    if let Some(resource) = exceeded(usage, resources, limits) {
        Some(Denial::PoolLimit { resource })
    } else if let Some(resource) = exceeded(total, resources, &caps.resources) {
        Some(Denial::GlobalCap { resource })
    } else if caps.price_per_hour.is_some_and(|cap| total_price.saturating_add(price) > cap) {
        Some(Denial::SpendCap)
    } else {
        None
    }
}

impl State {
    /// The state as its parts (a snapshot's content).
    pub fn into_parts(self) -> StateParts {
        StateParts {
            pools: self.pools,
            caps: self.caps,
            total: self.total,
            total_price: self.total_price,
            claims: self.claims,
            batches: self.batches,
            unavailable: self.unavailable,
            disruptions: self.disruptions,
            interruptions: self.interruptions,
            term: self.term,
            now: self.now,
            applied: self.applied,
        }
    }

    /// The state with these parts, as [`State::into_parts`] gave them (a snapshot restored).
    pub fn from_parts(p: StateParts) -> State {
        let index = interrupt::Index::build(&p.interruptions, &p.claims);
        State {
            pools: p.pools,
            caps: p.caps,
            total: p.total,
            total_price: p.total_price,
            claims: p.claims,
            batches: p.batches,
            unavailable: p.unavailable,
            disruptions: p.disruptions,
            interruptions: p.interruptions,
            index,
            term: p.term,
            now: p.now,
            applied: p.applied,
        }
    }

    pub fn pools(&self) -> &BTreeMap<String, Pool> {
        &self.pools
    }

    pub fn pool(&self, name: &str) -> Option<&Pool> {
        self.pools.get(name)
    }

    pub fn caps(&self) -> &Caps {
        &self.caps
    }

    /// What every live claim holds.
    pub fn total(&self) -> &ResourceList {
        &self.total
    }

    pub fn total_price(&self) -> MicroDollars {
        self.total_price
    }

    pub fn claims(&self) -> &BTreeMap<String, Claim> {
        &self.claims
    }

    pub fn claim(&self, id: &str) -> Option<&Claim> {
        self.claims.get(id)
    }

    /// The claims of one pool.
    pub fn claims_of<'a>(&'a self, pool: &'a str) -> impl Iterator<Item = &'a Claim> {
        self.claims.values().filter(move |c| c.pool == pool)
    }

    /// The launch batches with a claim still launching (or deleted while launching).
    pub fn batches(&self) -> &BTreeMap<String, BatchRecord> {
        &self.batches
    }

    /// The batch a claim launches in, with every claim it was recorded with.
    pub fn launch_batch(&self, claim: &str) -> Option<LaunchBatch> {
        let id = self.claims.get(claim)?.state.batch()?;
        let record = self.batches.get(id)?;
        Some(LaunchBatch { id: id.to_string(), claims: record.claims.clone() })
    }

    /// The highest term applied: proposals of an older term are fenced.
    pub fn term(&self) -> Term {
        self.term
    }

    /// The latest proposer time applied.
    pub fn now(&self) -> Millis {
        self.now
    }

    /// Entries applied so far.
    pub fn applied(&self) -> u64 {
        self.applied
    }

    /// Whether an offering is marked unavailable at `now`.
    pub fn is_unavailable(&self, offering: &Offering, now: Millis) -> bool {
        self.unavailable.get(offering).is_some_and(|until| now < *until)
    }

    /// The offerings marked unavailable at `now`, with when each mark ends.
    pub fn unavailable_marks(&self, now: Millis) -> impl Iterator<Item = (&Offering, Millis)> {
        self.unavailable.iter().filter(move |(_, until)| now < **until).map(|(o, until)| (o, *until))
    }

    /// The offerings marked unavailable at `now`.
    pub fn unavailable(&self, now: Millis) -> impl Iterator<Item = &Offering> {
        self.unavailable_marks(now).map(|(o, _)| o)
    }

    /// The disruption commands under way, by id.
    pub fn disruptions(&self) -> &BTreeMap<String, DisruptionCommand> {
        &self.disruptions
    }

    /// The command a claim is leased to, if any.
    pub fn lease_of(&self, claim: &str) -> Option<(&str, &DisruptionCommand)> {
        self.disruptions.iter().find(|(_, d)| d.candidates.iter().any(|c| c == claim)).map(|(id, d)| (id.as_str(), d))
    }

    /// What a pool's budgets and rate budget leave for `reason` at `now`, counting the claims
    /// in `not_ready` as disrupting (`None`: an unknown pool). The same numbers decide a
    /// [`Command::Disrupt`].
    pub fn allowance(
        &self,
        pool: &str,
        reason: DisruptionReason,
        not_ready: &[String],
        now: Millis,
    ) -> Option<Allowance> {
        let p = self.pools.get(pool)?;
        let leased: BTreeSet<&str> = self
            .disruptions
            .values()
            .filter(|d| d.pool == pool)
            .flat_map(|d| d.candidates.iter().map(String::as_str))
            .collect();
        let not_ready: BTreeSet<&str> = not_ready.iter().map(String::as_str).collect();
        let (mut nodes, mut disrupting) = (0u32, 0u32);
        for c in self.claims_of(pool) {
            let terminating = match &c.state {
                ClaimState::Initialized { .. } => false,
                ClaimState::Terminating { instance: Some(_), instance_gone: false, .. } => true,
                _ => continue,
            };
            nodes += 1;
            if terminating || leased.contains(c.id.as_str()) || not_ready.contains(c.id.as_str()) {
                disrupting += 1;
            }
        }
        let default = [Budget { nodes: BudgetNodes::Percent(10), schedule: None, duration: None, reasons: vec![] }];
        let budgets = p.budgets.as_deref().unwrap_or(&default);
        let allowed = budget::allowed(budgets, reason, nodes, now);
        let rate_left = p.rate.map(|r| r.available(&p.starts, now));
        Some(Allowance { nodes, disrupting, allowed, rate_left })
    }

    /// Applies one entry. Deterministic: the same entries in the same order give the same
    /// state and outcomes.
    pub fn apply(&mut self, entry: &Entry) -> Outcome {
        self.applied += 1;
        if entry.term < self.term {
            return Outcome::Fenced { term: self.term };
        }
        self.term = entry.term;
        let at = entry.at.max(self.now);
        self.now = at;
        // Expired marks go when any entry at or after their expiry is applied.
        self.unavailable.retain(|_, until| at < *until);
        match &entry.command {
            Command::Lead => Outcome::Done,
            Command::SetPool { pool, limits } => {
                self.pools.entry(pool.clone()).or_default().limits = limits.clone();
                Outcome::Done
            }
            Command::RemovePool { pool } => {
                if let Some(c) = self.claims.values().find(|c| c.pool == *pool) {
                    return Outcome::Rejected { reason: format!("nodepool {pool} still has claim {}", c.id) };
                }
                self.pools.remove(pool);
                Outcome::Done
            }
            Command::SetCaps(caps) => {
                self.caps = caps.clone();
                Outcome::Done
            }
            Command::Reserve { pool, claims } => self.reserve(at, pool, claims),
            Command::Launch { zone, batches } => self.launch(at, zone, batches),
            Command::Advance { steps } => {
                let mut rejected = Vec::new();
                for (claim, step) in steps {
                    if let Err(reason) = self.advance(at, claim, step) {
                        rejected.push((claim.clone(), reason));
                    }
                }
                self.prune_batches();
                self.prune_disruptions();
                Outcome::Advanced { rejected }
            }
            Command::Adopt { claims } => {
                let mut granted = Vec::new();
                let mut denied = Vec::new();
                for c in claims {
                    if self.claims.contains_key(&c.id) {
                        denied.push((c.id.clone(), Denial::DuplicateId));
                        continue;
                    }
                    if !self.pools.contains_key(&c.pool) {
                        denied.push((c.id.clone(), Denial::UnknownPool));
                        continue;
                    }
                    let mut resources = c.resources.clone();
                    resources.set(ResourceName::Nodes, 1);
                    self.hold(&c.pool, &resources, c.price_per_hour);
                    let claim = Claim { resources, reserved_at: at, changed_at: at, ..c.clone() };
                    if let Some(instance) = claim.state.instance() {
                        self.index.by_instance.insert(instance.to_string(), c.id.clone());
                    }
                    self.claims.insert(c.id.clone(), claim);
                    granted.push(c.id.clone());
                }
                Outcome::Reserved { granted, denied }
            }
            Command::SetBudgets { pool, budgets, rate } => {
                let Some(p) = self.pools.get_mut(pool) else {
                    return Outcome::Rejected { reason: format!("unknown nodepool {pool}") };
                };
                p.budgets = Some(budgets.clone());
                p.rate = *rate;
                Outcome::Done
            }
            Command::Disrupt { pool, command, reason, candidates, replacements, not_ready } => {
                let refused = self.disrupt(at, pool, command, *reason, candidates, replacements, not_ready).err();
                Outcome::Disrupting { refused }
            }
            Command::EndDisruption { command } => {
                self.disruptions.remove(command);
                Outcome::Done
            }
            Command::Interrupt { notices } => self.interrupt(at, notices),
            Command::ReplaceInterrupted { instances, replacements } => {
                self.replace_interrupted(at, instances, replacements)
            }
            Command::Collect { instances } => {
                let rejected = instances
                    .iter()
                    .filter_map(|c| {
                        if let Some(claim) = self.index.by_instance.get(&c.id) {
                            return Some((c.id.clone(), format!("instance of claim {claim}")));
                        }
                        if let Some(claim) = c.claim.as_ref().filter(|claim| self.claims.contains_key(*claim)) {
                            return Some((c.id.clone(), format!("tagged for claim {claim}, still recorded")));
                        }
                        let live = c.batch.as_ref().filter(|b| self.batches.contains_key(*b))?;
                        Some((c.id.clone(), format!("of launch batch {live}, still recorded")))
                    })
                    .collect();
                Outcome::Advanced { rejected }
            }
            Command::MarkUnavailable { offerings, until } => {
                if *until > at {
                    for offering in offerings {
                        let e = self.unavailable.entry(offering.clone()).or_insert(*until);
                        *e = (*e).max(*until);
                    }
                }
                Outcome::Done
            }
        }
    }

    fn reserve(&mut self, at: Millis, pool: &str, claims: &[ClaimRequest]) -> Outcome {
        let mut granted = Vec::new();
        let mut denied = Vec::new();
        for req in claims {
            if self.claims.contains_key(&req.id) {
                denied.push((req.id.clone(), Denial::DuplicateId));
                continue;
            }
            let Some(p) = self.pools.get(pool) else {
                denied.push((req.id.clone(), Denial::UnknownPool));
                continue;
            };
            let mut resources = req.resources.clone();
            resources.set(ResourceName::Nodes, 1);
            let denial = denial(
                (&p.limits, &p.usage),
                (&self.caps, &self.total, self.total_price),
                &resources,
                req.price_per_hour,
            );
            if let Some(d) = denial {
                denied.push((req.id.clone(), d));
                continue;
            }
            self.insert_reserved(at, pool, req, resources);
            granted.push(req.id.clone());
        }
        Outcome::Reserved { granted, denied }
    }

    /// A disruption command: granted whole or refused whole (the error says why).
    #[allow(clippy::too_many_arguments)]
    fn disrupt(
        &mut self,
        at: Millis,
        pool: &str,
        command: &str,
        reason: DisruptionReason,
        candidates: &[String],
        replacements: &[ClaimRequest],
        not_ready: &[String],
    ) -> Result<(), String> {
        if candidates.is_empty() {
            return Err("a disruption command needs candidates".into());
        }
        if self.disruptions.contains_key(command) {
            return Err(format!("disruption command {command} is under way already"));
        }
        let Some(p) = self.pools.get(pool) else { return Err(format!("unknown nodepool {pool}")) };
        let mut seen = BTreeSet::new();
        let mut freed = ResourceList::new();
        let mut freed_price: MicroDollars = 0;
        for id in candidates {
            if !seen.insert(id.as_str()) {
                return Err(format!("nodeclaim {id} is named twice"));
            }
            let Some(c) = self.claims.get(id) else { return Err(format!("unknown nodeclaim {id}")) };
            if c.pool != pool {
                return Err(format!("nodeclaim {id} is of nodepool {}, not {pool}", c.pool));
            }
            if !matches!(c.state, ClaimState::Initialized { .. }) {
                return Err(format!("nodeclaim {id} is {}, not Initialized", c.state.name()));
            }
            if let Some((other, _)) = self.lease_of(id) {
                return Err(format!("nodeclaim {id} is disrupting already (command {other})"));
            }
            freed.add(&c.resources);
            freed_price = freed_price.saturating_add(c.price_per_hour);
        }
        let allowance = self.allowance(pool, reason, not_ready, at).unwrap_or(Allowance {
            nodes: 0,
            disrupting: 0,
            allowed: 0,
            rate_left: None,
        });
        let wanted = u32::try_from(candidates.len()).unwrap_or(u32::MAX);
        if wanted > allowance.available() {
            return Err(format!("{wanted} nodes for {reason}: {allowance}"));
        }
        // The replacements, against what the pool and the cluster hold without the candidates.
        let mut usage = p.usage.clone();
        usage.subtract(&freed);
        let mut total = self.total.clone();
        total.subtract(&freed);
        let mut price = self.total_price.saturating_sub(freed_price);
        let mut held = Vec::with_capacity(replacements.len());
        for req in replacements {
            if self.claims.contains_key(&req.id) || held.iter().any(|(r, _): &(&ClaimRequest, _)| r.id == req.id) {
                return Err(format!("replacement {}: {}", req.id, Denial::DuplicateId));
            }
            let mut resources = req.resources.clone();
            resources.set(ResourceName::Nodes, 1);
            let denial = denial((&p.limits, &usage), (&self.caps, &total, price), &resources, req.price_per_hour);
            if let Some(d) = denial {
                return Err(format!("replacement {}: {d}", req.id));
            }
            usage.add(&resources);
            total.add(&resources);
            price = price.saturating_add(req.price_per_hour);
            held.push((req, resources));
        }
        // Granted.
        let mut ids = Vec::with_capacity(held.len());
        for (req, resources) in held {
            self.insert_reserved(at, pool, req, resources);
            ids.push(req.id.clone());
        }
        if let Some(p) = self.pools.get_mut(pool) {
            match p.rate {
                Some(r) => {
                    p.starts.retain(|t| at.saturating_sub(*t) < r.per);
                    p.starts.extend(std::iter::repeat_n(at, candidates.len()));
                }
                None => p.starts.clear(),
            }
        }
        self.disruptions.insert(
            command.to_string(),
            DisruptionCommand {
                pool: pool.to_string(),
                reason,
                candidates: candidates.to_vec(),
                replacements: ids,
                at,
            },
        );
        Ok(())
    }

    /// Forgets commands none of whose candidates is left.
    fn prune_disruptions(&mut self) {
        let claims = &self.claims;
        self.disruptions.retain(|_, d| d.candidates.iter().any(|c| claims.contains_key(c)));
    }

    fn launch(&mut self, at: Millis, zone: &str, batches: &[LaunchBatch]) -> Outcome {
        let mut started = Vec::new();
        let mut refused = Vec::new();
        for batch in batches {
            let mut members = Vec::new();
            // A batch already recorded keeps its members: a re-drive launches those only.
            let recorded = self.batches.get(&batch.id).map(|r| r.claims.clone());
            for id in batch.claims.iter() {
                if recorded.as_ref().is_some_and(|r| !r.contains(id)) {
                    refused.push((id.clone(), format!("claim {id} is not in launch batch {}", batch.id)));
                    continue;
                }
                let Some(c) = self.claims.get_mut(id) else {
                    refused.push((id.clone(), "unknown claim".to_string()));
                    continue;
                };
                match &c.state {
                    ClaimState::Reserved => {
                        c.state = ClaimState::Launching { batch: batch.id.clone() };
                        c.zone = zone.to_string();
                        c.changed_at = at;
                        c.tried_at.get_or_insert(at);
                    }
                    ClaimState::Launching { batch: b } if *b == batch.id => {}
                    s => {
                        refused.push((id.clone(), format!("claim {id} is {}", s.name())));
                        continue;
                    }
                }
                members.push(id.clone());
                started.push(id.clone());
            }
            if !members.is_empty() {
                // A re-drive keeps the record it was made with (its instances are assigned by
                // it); a new record holds the claims started, never one refused.
                self.batches.entry(batch.id.clone()).or_insert_with(|| BatchRecord {
                    zone: zone.to_string(),
                    claims: members.into(),
                    at,
                });
            }
        }
        Outcome::Launching { started, refused }
    }

    /// Records a granted request as a `Reserved` claim holding `resources` (`nodes` included).
    fn insert_reserved(&mut self, at: Millis, pool: &str, req: &ClaimRequest, resources: ResourceList) {
        self.hold(pool, &resources, req.price_per_hour);
        let claim = Claim {
            id: req.id.clone(),
            pool: pool.to_string(),
            zone: req.zone.clone(),
            resources,
            allocatable: ResourceList::new(),
            price_per_hour: req.price_per_hour,
            launched_as: None,
            state: ClaimState::Reserved,
            reserved_at: at,
            changed_at: at,
            tried_at: None,
        };
        self.claims.insert(req.id.clone(), claim);
    }

    /// Adds a claim's holding to its pool and the totals.
    fn hold(&mut self, pool: &str, resources: &ResourceList, price: MicroDollars) {
        if let Some(p) = self.pools.get_mut(pool) {
            p.usage.add(resources);
            p.price_per_hour = p.price_per_hour.saturating_add(price);
        }
        self.total.add(resources);
        self.total_price = self.total_price.saturating_add(price);
    }

    /// Takes a claim's holding off its pool and the totals.
    fn release(&mut self, pool: &str, resources: &ResourceList, price: MicroDollars) {
        if let Some(p) = self.pools.get_mut(pool) {
            p.usage.subtract(resources);
            p.price_per_hour = p.price_per_hour.saturating_sub(price);
        }
        self.total.subtract(resources);
        self.total_price = self.total_price.saturating_sub(price);
    }

    /// Moves a claim's holding from its reservation to what its instance holds and costs.
    fn rehold(&mut self, id: &str, resources: &ResourceList, allocatable: &ResourceList, price: MicroDollars) {
        let Some(claim) = self.claims.get(id) else { return };
        let (pool, old, old_price) = (claim.pool.clone(), claim.resources.clone(), claim.price_per_hour);
        let mut new = resources.clone();
        new.set(ResourceName::Nodes, 1);
        self.release(&pool, &old, old_price);
        self.hold(&pool, &new, price);
        if let Some(c) = self.claims.get_mut(id) {
            c.resources = new;
            c.allocatable = allocatable.clone();
            c.price_per_hour = price;
        }
    }

    fn launched_as(&mut self, id: &str, instance_type: &str, capacity_type: CapacityType) {
        if let Some(c) = self.claims.get_mut(id) {
            c.launched_as = Some((instance_type.to_string(), capacity_type));
        }
    }

    /// Forgets batches none of whose claims is launching any more.
    fn prune_batches(&mut self) {
        if self.batches.is_empty() {
            return;
        }
        let mut live: std::collections::BTreeSet<&str> = std::collections::BTreeSet::new();
        for c in self.claims.values() {
            if let Some(b) = c.state.batch() {
                live.insert(b);
            }
        }
        let gone: Vec<String> = self.batches.keys().filter(|b| !live.contains(b.as_str())).cloned().collect();
        for b in gone {
            self.batches.remove(&b);
        }
    }

    fn advance(&mut self, at: Millis, id: &str, step: &Step) -> Result<(), String> {
        let Some(claim) = self.claims.get(id) else {
            return match step {
                // Gone twice is harmless.
                Step::Gone => Ok(()),
                _ => Err(format!("unknown claim {id}")),
            };
        };
        let reject = |to: &str| Err(format!("claim {id} cannot go from {} to {to}", claim.state.name()));
        let next = match step {
            Step::Launched {
                batch: from,
                instance,
                resources,
                allocatable,
                price_per_hour,
                instance_type,
                capacity_type,
            } => match &claim.state {
                ClaimState::Launching { batch } if batch == from => {
                    self.rehold(id, resources, allocatable, *price_per_hour);
                    self.launched_as(id, instance_type, *capacity_type);
                    ClaimState::Launched { instance: instance.clone() }
                }
                ClaimState::Launched { instance: known } if known == instance => return Ok(()),
                // Deleted while launching: the instance is recorded so that it is terminated.
                ClaimState::Terminating { instance: None, batch: Some(batch), .. } if batch == from => {
                    let batch = Some(batch.clone());
                    self.rehold(id, resources, allocatable, *price_per_hour);
                    self.launched_as(id, instance_type, *capacity_type);
                    ClaimState::Terminating { instance: Some(instance.clone()), batch, instance_gone: false }
                }
                ClaimState::Terminating { instance: Some(known), .. } if known == instance => return Ok(()),
                _ => return Err(format!("claim {id} ({}) is not launching in batch {from}", claim.state.name())),
            },
            Step::Unlaunched { batch: from } => match &claim.state {
                ClaimState::Launching { batch } if batch == from => ClaimState::Reserved,
                _ => return Err(format!("claim {id} ({}) is not launching in batch {from}", claim.state.name())),
            },
            Step::Registered => match &claim.state {
                ClaimState::Launched { instance } => ClaimState::Registered { instance: instance.clone() },
                ClaimState::Registered { .. } => return Ok(()),
                _ => return reject("Registered"),
            },
            Step::Initialized => match &claim.state {
                ClaimState::Registered { instance } => ClaimState::Initialized { instance: instance.clone() },
                ClaimState::Initialized { .. } => return Ok(()),
                _ => return reject("Initialized"),
            },
            Step::Terminating => match &claim.state {
                ClaimState::Terminating { .. } => return Ok(()),
                s => ClaimState::Terminating {
                    instance: s.instance().map(str::to_string),
                    batch: s.batch().map(str::to_string),
                    instance_gone: false,
                },
            },
            Step::InstanceGone => match &claim.state {
                ClaimState::Terminating { instance, batch, .. } => {
                    ClaimState::Terminating { instance: instance.clone(), batch: batch.clone(), instance_gone: true }
                }
                _ => return reject("InstanceGone"),
            },
            Step::Gone => {
                if !matches!(claim.state, ClaimState::Reserved | ClaimState::Terminating { instance_gone: true, .. }) {
                    return reject("Gone");
                }
                let (pool, resources, price) = (claim.pool.clone(), claim.resources.clone(), claim.price_per_hour);
                if let Some(instance) = claim.state.instance() {
                    self.index.by_instance.remove(instance);
                }
                self.release(&pool, &resources, price);
                self.claims.remove(id);
                self.index.forget_claim(&pool, id);
                return Ok(());
            }
        };
        if let Some(c) = self.claims.get_mut(id)
            && c.state != next
        {
            if let Some(instance) = next.instance() {
                self.index.by_instance.insert(instance.to_string(), id.to_string());
            }
            c.state = next;
            c.changed_at = at;
        }
        Ok(())
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    const GIB: i64 = 1 << 30;

    pub(super) fn entry(at: Millis, command: Command) -> Entry {
        Entry { term: 1, at, command }
    }

    pub(super) fn req(id: &str, cpu: i64, price: f64) -> ClaimRequest {
        ClaimRequest {
            id: id.into(),
            zone: "us-east-1a".into(),
            resources: ResourceList::cpu_mem(cpu * 1000, cpu * 4 * GIB),
            price_per_hour: micro_dollars(price),
        }
    }

    fn reserve(pool: &str, claims: Vec<ClaimRequest>) -> Command {
        Command::Reserve { pool: pool.into(), claims }
    }

    fn step(claim: &str, step: Step) -> Command {
        Command::Advance { steps: vec![(claim.into(), step)] }
    }

    fn state_with_pool(limits: ResourceList) -> State {
        let mut s = State::default();
        s.apply(&entry(0, Command::SetPool { pool: "default".into(), limits }));
        s
    }

    fn launched(instance: &str, cpu: i64, price: MicroDollars) -> Step {
        Step::Launched {
            batch: "b1".into(),
            instance: instance.into(),
            resources: ResourceList::cpu_mem(cpu * 1000, cpu * 4 * GIB),
            allocatable: ResourceList::cpu_mem(cpu * 1000 - 80, cpu * 4 * GIB - GIB),
            price_per_hour: price,
            instance_type: "m5.large".into(),
            capacity_type: CapacityType::OnDemand,
        }
    }

    #[test]
    fn a_round_is_granted_up_to_the_pool_limit() {
        let mut s = state_with_pool(ResourceList::from_pairs([(ResourceName::Cpu, 10_000)]));
        let out = s.apply(&entry(
            1,
            reserve("default", vec![req("a", 4, 0.2), req("b", 4, 0.2), req("c", 4, 0.2), req("d", 2, 0.1)]),
        ));
        assert_eq!(
            out,
            Outcome::Reserved {
                granted: vec!["a".into(), "b".into(), "d".into()],
                denied: vec![("c".into(), Denial::PoolLimit { resource: ResourceName::Cpu })],
            }
        );
        let p = s.pool("default").expect("pool");
        assert_eq!(p.usage.get(&ResourceName::Cpu), 10_000);
        assert_eq!(p.usage.get(&ResourceName::Nodes), 3);
        assert_eq!(s.total_price(), 500_000);
    }

    #[test]
    fn a_live_id_is_refused_not_granted_again() {
        let mut s = state_with_pool(ResourceList::new());
        s.apply(&entry(1, reserve("default", vec![req("default-abcde", 2, 0.1)])));
        let again =
            s.apply(&entry(2, reserve("default", vec![req("default-abcde", 2, 0.1), req("default-fghij", 2, 0.1)])));
        assert_eq!(
            again,
            Outcome::Reserved {
                granted: vec!["default-fghij".into()],
                denied: vec![("default-abcde".into(), Denial::DuplicateId)],
            }
        );
        assert_eq!(s.total().get(&ResourceName::Nodes), 2, "counted once");
        // Once gone, the id may be used again.
        s.apply(&entry(3, step("default-abcde", Step::Gone)));
        let out = s.apply(&entry(4, reserve("default", vec![req("default-abcde", 2, 0.1)])));
        assert!(matches!(out, Outcome::Reserved { ref denied, .. } if denied.is_empty()));
    }

    #[test]
    fn the_spend_cap_stops_a_runaway_scale_up_across_pools() {
        let mut s = state_with_pool(ResourceList::new());
        s.apply(&entry(0, Command::SetPool { pool: "gpu".into(), limits: ResourceList::new() }));
        s.apply(&entry(
            0,
            Command::SetCaps(Caps { resources: ResourceList::new(), price_per_hour: Some(micro_dollars(1.0)) }),
        ));
        let out = s.apply(&entry(1, reserve("default", vec![req("a", 2, 0.6)])));
        assert!(matches!(out, Outcome::Reserved { ref denied, .. } if denied.is_empty()));
        let out = s.apply(&entry(2, reserve("gpu", vec![req("g", 2, 0.6)])));
        assert_eq!(out, Outcome::Reserved { granted: vec![], denied: vec![("g".into(), Denial::SpendCap)] });
        let out = s.apply(&entry(3, reserve("gpu", vec![req("h", 1, 0.3)])));
        assert_eq!(out, Outcome::Reserved { granted: vec!["h".into()], denied: vec![] });
    }

    #[test]
    fn the_lifecycle_moves_forward_only_and_gone_releases() {
        let mut s = state_with_pool(ResourceList::new());
        s.apply(&entry(1, reserve("default", vec![req("a", 8, 0.4)])));
        let adv = |s: &mut State, at, st| s.apply(&entry(at, step("a", st)));
        assert!(matches!(adv(&mut s, 2, Step::Registered), Outcome::Advanced { ref rejected } if rejected.len() == 1));
        let batch = LaunchBatch { id: "b1".into(), claims: vec!["a".into()].into() };
        let out = s.apply(&entry(2, Command::Launch { zone: "us-east-1b".into(), batches: vec![batch.clone()] }));
        assert_eq!(out, Outcome::Launching { started: vec!["a".into()], refused: vec![] });
        assert_eq!(s.claim("a").map(|c| c.zone.as_str()), Some("us-east-1b"), "the launch moves the zone");
        assert_eq!(s.launch_batch("a"), Some(batch));
        assert_eq!(adv(&mut s, 3, launched("i-1", 4, 200_000)), Outcome::Advanced { rejected: vec![] });
        assert_eq!(adv(&mut s, 3, launched("i-1", 4, 200_000)), Outcome::Advanced { rejected: vec![] }, "idempotent");
        assert!(s.batches().is_empty(), "the batch is forgotten once nothing launches in it");
        assert_eq!(s.total().get(&ResourceName::Cpu), 4000, "usage follows the instance");
        assert_eq!(s.total_price(), 200_000);
        adv(&mut s, 4, Step::Registered);
        adv(&mut s, 5, Step::Initialized);
        let unlaunched = Step::Unlaunched { batch: "b1".into() };
        assert!(matches!(adv(&mut s, 6, unlaunched), Outcome::Advanced { ref rejected } if rejected.len() == 1));
        let gone = adv(&mut s, 6, Step::Gone);
        assert!(matches!(gone, Outcome::Advanced { ref rejected } if rejected.len() == 1), "its instance is live");
        adv(&mut s, 7, Step::Terminating);
        assert_eq!(
            s.claim("a").map(|c| c.state.clone()),
            Some(ClaimState::Terminating { instance: Some("i-1".into()), batch: None, instance_gone: false })
        );
        adv(&mut s, 8, Step::InstanceGone);
        adv(&mut s, 9, Step::Gone);
        assert_eq!(adv(&mut s, 10, Step::Gone), Outcome::Advanced { rejected: vec![] }, "gone twice is harmless");
        assert!(s.claims().is_empty());
        assert_eq!(s.total().get(&ResourceName::Cpu), 0);
        assert_eq!(s.total_price(), 0);
    }

    #[test]
    fn a_claim_deleted_while_launching_records_its_instance_to_terminate_it() {
        let mut s = state_with_pool(ResourceList::new());
        s.apply(&entry(1, reserve("default", vec![req("a", 2, 0.1)])));
        let batch = LaunchBatch { id: "b1".into(), claims: vec!["a".into()].into() };
        s.apply(&entry(2, Command::Launch { zone: "us-east-1a".into(), batches: vec![batch] }));
        s.apply(&entry(3, step("a", Step::Terminating)));
        assert_eq!(s.claim("a").and_then(|c| c.state.batch()), Some("b1"), "the batch is kept");
        assert!(s.batches().contains_key("b1"));
        s.apply(&entry(4, step("a", launched("i-9", 2, 96_000))));
        assert_eq!(s.claim("a").and_then(|c| c.state.instance()), Some("i-9"));
        // A launch of a terminating claim is refused.
        let again = LaunchBatch { id: "b1".into(), claims: vec!["a".into()].into() };
        let out = s.apply(&entry(5, Command::Launch { zone: "us-east-1a".into(), batches: vec![again] }));
        assert!(matches!(out, Outcome::Launching { ref started, .. } if started.is_empty()));
    }

    #[test]
    fn no_capacity_sends_the_claim_back_to_reserved_for_another_offering() {
        let mut s = state_with_pool(ResourceList::new());
        s.apply(&entry(1, reserve("default", vec![req("a", 2, 0.1)])));
        let b1 = LaunchBatch { id: "b1".into(), claims: vec!["a".into()].into() };
        s.apply(&entry(2, Command::Launch { zone: "us-east-1a".into(), batches: vec![b1] }));
        let late = s.apply(&entry(3, step("a", Step::Unlaunched { batch: "b0".into() })));
        assert!(matches!(late, Outcome::Advanced { ref rejected } if rejected.len() == 1), "another batch's answer");
        s.apply(&entry(3, step("a", Step::Unlaunched { batch: "b1".into() })));
        assert_eq!(s.claim("a").map(|c| c.state.clone()), Some(ClaimState::Reserved));
        assert!(s.batches().is_empty());
        let b2 = LaunchBatch { id: "b2".into(), claims: vec!["a".into()].into() };
        let out = s.apply(&entry(4, Command::Launch { zone: "us-east-1c".into(), batches: vec![b2] }));
        assert_eq!(out, Outcome::Launching { started: vec!["a".into()], refused: vec![] });
        assert_eq!(s.claim("a").map(|c| c.zone.as_str()), Some("us-east-1c"));
    }

    #[test]
    fn a_stale_term_is_fenced_and_changes_nothing() {
        let mut s = state_with_pool(ResourceList::new());
        let lead = Entry { term: 2, at: 5, command: Command::Lead };
        assert_eq!(s.apply(&lead), Outcome::Done);
        assert_eq!(s.term(), 2);
        let before = s.claims().clone();
        let stale = Entry { term: 1, at: 6, command: reserve("default", vec![req("a", 2, 0.1)]) };
        assert_eq!(s.apply(&stale), Outcome::Fenced { term: 2 });
        assert_eq!(s.claims(), &before);
        let current = Entry { term: 2, at: 6, command: reserve("default", vec![req("a", 2, 0.1)]) };
        assert!(matches!(s.apply(&current), Outcome::Reserved { ref granted, .. } if granted.len() == 1));
    }

    #[test]
    fn time_never_goes_back() {
        let mut s = state_with_pool(ResourceList::new());
        s.apply(&entry(1_000, reserve("default", vec![req("a", 2, 0.1)])));
        // A proposer whose clock is behind: its entry is applied at the ledger's time.
        s.apply(&entry(400, step("a", Step::Terminating)));
        assert_eq!(s.now(), 1_000);
        assert_eq!(s.claim("a").map(|c| c.changed_at), Some(1_000));
    }

    #[test]
    fn ice_marks_expire_by_the_entries_timestamps() {
        let mut s = State::default();
        let o =
            Offering { instance_type: "m5.large".into(), zone: "us-east-1a".into(), capacity_type: CapacityType::Spot };
        s.apply(&entry(1_000, Command::MarkUnavailable { offerings: vec![o.clone()], until: 4_000 }));
        assert!(s.is_unavailable(&o, 3_999));
        assert!(!s.is_unavailable(&o, 4_000));
        assert_eq!(s.unavailable(2_000).count(), 1);
        s.apply(&entry(5_000, Command::SetCaps(Caps::default())));
        assert_eq!(s.unavailable(0).count(), 0, "pruned once an entry at or after the expiry is applied");
    }

    #[test]
    fn a_pool_with_claims_is_not_removed() {
        let mut s = state_with_pool(ResourceList::new());
        s.apply(&entry(1, reserve("default", vec![req("a", 1, 0.1)])));
        assert!(matches!(s.apply(&entry(2, Command::RemovePool { pool: "default".into() })), Outcome::Rejected { .. }));
        s.apply(&entry(3, step("a", Step::Gone)));
        assert_eq!(s.apply(&entry(4, Command::RemovePool { pool: "default".into() })), Outcome::Done);
        let out = s.apply(&entry(5, reserve("default", vec![req("b", 1, 0.1)])));
        assert_eq!(out, Outcome::Reserved { granted: vec![], denied: vec![("b".into(), Denial::UnknownPool)] });
    }

    #[test]
    fn garbage_collection_keeps_instances_a_claim_holds_or_a_recorded_batch_may_be_making() {
        let mut s = State::default();
        initialized_pool(&mut s, "default", 1, ResourceList::new());
        // A claim reserved and launching: its batch is recorded, its instance not yet named.
        s.apply(&entry(2, reserve("default", vec![req("fresh", 2, 0.1)])));
        let batch = LaunchBatch { id: "b-fresh".into(), claims: vec!["fresh".to_string()].into() };
        s.apply(&entry(2, Command::Launch { zone: "us-east-1a".into(), batches: vec![batch] }));
        let out = s.apply(&entry(
            3,
            Command::Collect {
                instances: vec![
                    collectable("i-default-0", None, None),
                    collectable("i-in-flight", None, Some("b-fresh")),
                    collectable("i-leaked", None, Some("b-long-gone")),
                    collectable("i-by-hand", None, None),
                    collectable("i-second", Some("default-0"), None),
                    collectable("i-of-a-gone-claim", Some("gone"), Some("b-gone")),
                ],
            },
        ));
        let Outcome::Advanced { rejected } = out else { panic!("{out:?}") };
        let kept: Vec<&str> = rejected.iter().map(|(id, _)| id.as_str()).collect();
        assert_eq!(kept, ["i-default-0", "i-in-flight", "i-second"], "{rejected:?}");
        assert!(rejected[0].1.contains("default-0"), "the claim is named: {rejected:?}");
        assert!(rejected[2].1.contains("default-0"), "the tagged claim is named: {rejected:?}");
    }

    fn collectable(id: &str, claim: Option<&str>, batch: Option<&str>) -> Collectable {
        Collectable { id: id.into(), claim: claim.map(str::to_string), batch: batch.map(str::to_string) }
    }

    /// A pool `name` with `n` initialized claims `name-0`.. of 2 cpu at $0.1/h.
    pub(super) fn initialized_pool(s: &mut State, name: &str, n: usize, limits: ResourceList) {
        s.apply(&entry(0, Command::SetPool { pool: name.into(), limits }));
        let ids: Vec<String> = (0..n).map(|i| format!("{name}-{i}")).collect();
        s.apply(&entry(1, reserve(name, ids.iter().map(|id| req(id, 2, 0.1)).collect())));
        let batch = LaunchBatch { id: format!("b-{name}"), claims: ids.clone().into() };
        s.apply(&entry(1, Command::Launch { zone: "us-east-1a".into(), batches: vec![batch] }));
        for id in &ids {
            let mut launched = launched(&format!("i-{id}"), 2, 100_000);
            if let Step::Launched { batch, .. } = &mut launched {
                *batch = format!("b-{name}");
            }
            let steps = vec![(id.clone(), launched), (id.clone(), Step::Registered), (id.clone(), Step::Initialized)];
            s.apply(&entry(1, Command::Advance { steps }));
        }
    }

    fn disrupt(pool: &str, command: &str, reason: DisruptionReason, candidates: &[&str]) -> Command {
        Command::Disrupt {
            pool: pool.into(),
            command: command.into(),
            reason,
            candidates: candidates.iter().map(|c| c.to_string()).collect(),
            replacements: vec![],
            not_ready: vec![],
        }
    }

    fn granted(o: &Outcome) -> bool {
        matches!(o, Outcome::Disrupting { refused: None })
    }

    #[test]
    fn a_disruption_is_granted_within_the_budget_and_its_candidates_count_until_gone() {
        let mut s = State::default();
        initialized_pool(&mut s, "p", 10, ResourceList::new());
        let empty = DisruptionReason::Empty;
        let a = s.allowance("p", empty, &[], 10).expect("pool");
        assert_eq!((a.nodes, a.disrupting, a.allowed, a.available()), (10, 0, 1, 1), "the default budget is 10%");
        let two = s.apply(&entry(10, disrupt("p", "c1", empty, &["p-0", "p-1"])));
        assert!(matches!(&two, Outcome::Disrupting { refused: Some(r) } if r.contains("budgets allow 1")), "{two:?}");
        assert!(s.disruptions().is_empty(), "refused whole");
        assert!(granted(&s.apply(&entry(11, disrupt("p", "c1", empty, &["p-0"])))));
        assert_eq!(s.lease_of("p-0").map(|(c, _)| c), Some("c1"));
        let next = s.apply(&entry(12, disrupt("p", "c2", empty, &["p-1"])));
        assert!(!granted(&next), "the one disrupting node uses the budget");
        // It terminates: still disrupting until its instance is gone.
        s.apply(&entry(13, step("p-0", Step::Terminating)));
        assert!(!granted(&s.apply(&entry(14, disrupt("p", "c2", empty, &["p-1"])))));
        s.apply(&entry(15, step("p-0", Step::InstanceGone)));
        s.apply(&entry(16, step("p-0", Step::Gone)));
        assert!(s.disruptions().is_empty(), "the command goes with its last candidate");
        assert!(granted(&s.apply(&entry(17, disrupt("p", "c2", empty, &["p-1"])))));
    }

    #[test]
    fn a_lease_is_exclusive_and_only_an_initialized_claim_of_the_pool_is_leased() {
        let mut s = State::default();
        initialized_pool(&mut s, "p", 4, ResourceList::new());
        initialized_pool(&mut s, "q", 4, ResourceList::new());
        s.apply(&entry(2, reserve("p", vec![req("p-new", 2, 0.1)])));
        s.apply(&entry(
            3,
            Command::SetBudgets {
                pool: "p".into(),
                budgets: vec![Budget { nodes: BudgetNodes::Count(3), schedule: None, duration: None, reasons: vec![] }],
                rate: None,
            },
        ));
        let drifted = DisruptionReason::Drifted;
        for (cmd, says) in [
            (disrupt("p", "x", drifted, &["q-0"]), "of nodepool q"),
            (disrupt("p", "x", drifted, &["p-new"]), "Reserved, not Initialized"),
            (disrupt("p", "x", drifted, &["p-9"]), "unknown nodeclaim"),
            (disrupt("p", "x", drifted, &["p-0", "p-0"]), "twice"),
            (disrupt("p", "x", drifted, &[]), "needs candidates"),
            (disrupt("nope", "x", drifted, &["p-0"]), "unknown nodepool"),
        ] {
            let out = s.apply(&entry(4, cmd));
            assert!(matches!(&out, Outcome::Disrupting { refused: Some(r) } if r.contains(says)), "{says}: {out:?}");
        }
        assert!(granted(&s.apply(&entry(5, disrupt("p", "a", drifted, &["p-0"])))));
        let again = s.apply(&entry(6, disrupt("p", "b", drifted, &["p-1", "p-0"])));
        assert!(matches!(&again, Outcome::Disrupting { refused: Some(r) } if r.contains("command a")), "{again:?}");
        assert!(!granted(&s.apply(&entry(6, disrupt("p", "a", drifted, &["p-1"])))), "a live command id");
        // Ending it releases its candidate.
        s.apply(&entry(7, Command::EndDisruption { command: "a".into() }));
        assert!(s.lease_of("p-0").is_none());
        assert!(granted(&s.apply(&entry(8, disrupt("p", "b", drifted, &["p-1", "p-0"])))));
    }

    #[test]
    fn nodes_seen_not_ready_count_as_disrupting() {
        let mut s = State::default();
        initialized_pool(&mut s, "p", 20, ResourceList::new());
        let not_ready = vec!["p-5".to_string(), "p-6".to_string()];
        let a = s.allowance("p", DisruptionReason::Underutilized, &not_ready, 10).expect("pool");
        assert_eq!((a.allowed, a.disrupting, a.available()), (2, 2, 0));
        let cmd = Command::Disrupt {
            pool: "p".into(),
            command: "c".into(),
            reason: DisruptionReason::Underutilized,
            candidates: vec!["p-0".into()],
            replacements: vec![],
            not_ready,
        };
        assert!(!granted(&s.apply(&entry(10, cmd))));
    }

    #[test]
    fn replacements_are_reserved_with_the_command_against_limits_without_the_candidates() {
        let mut s = State::default();
        // 4 claims of 2 cpu: the pool is at its 8-cpu limit.
        initialized_pool(&mut s, "p", 4, ResourceList::from_pairs([(ResourceName::Cpu, 8_000)]));
        let unbounded =
            vec![Budget { nodes: BudgetNodes::Percent(100), schedule: None, duration: None, reasons: vec![] }];
        s.apply(&entry(2, Command::SetBudgets { pool: "p".into(), budgets: unbounded, rate: None }));
        let replace = |candidates: &[&str], cpu: i64| Command::Disrupt {
            pool: "p".into(),
            command: format!("r{}", candidates.len()),
            reason: DisruptionReason::Underutilized,
            candidates: candidates.iter().map(|c| c.to_string()).collect(),
            replacements: vec![req("p-repl", cpu, 0.1)],
            not_ready: vec![],
        };
        let big = s.apply(&entry(3, replace(&["p-0"], 3)));
        assert!(matches!(&big, Outcome::Disrupting { refused: Some(r) } if r.contains("limit on cpu")), "{big:?}");
        assert!(s.claim("p-repl").is_none());
        assert!(granted(&s.apply(&entry(4, replace(&["p-0", "p-1"], 4)))), "two of 2 cpu make room for 4");
        assert_eq!(s.claim("p-repl").map(|c| c.state.clone()), Some(ClaimState::Reserved));
        assert_eq!(s.disruptions().get("r2").map(|d| d.replacements.clone()), Some(vec!["p-repl".to_string()]));
        assert_eq!(s.pool("p").map(|p| p.usage.get(&ResourceName::Cpu)), Some(12_000), "held until they go");
    }

    #[test]
    fn the_rate_budget_caps_nodes_started_per_window() {
        let mut s = State::default();
        initialized_pool(&mut s, "p", 10, ResourceList::new());
        let all = vec![Budget { nodes: BudgetNodes::Percent(100), schedule: None, duration: None, reasons: vec![] }];
        let rate = Some(budget::Rate::parse("2/10m").expect("rate"));
        s.apply(&entry(0, Command::SetBudgets { pool: "p".into(), budgets: all, rate }));
        let empty = DisruptionReason::Empty;
        assert!(!granted(&s.apply(&entry(1_000, disrupt("p", "a", empty, &["p-0", "p-1", "p-2"])))));
        assert!(granted(&s.apply(&entry(1_000, disrupt("p", "a", empty, &["p-0", "p-1"])))));
        // Ended at once: the starts still count in the window.
        s.apply(&entry(2_000, Command::EndDisruption { command: "a".into() }));
        assert!(!granted(&s.apply(&entry(600_000, disrupt("p", "b", empty, &["p-2"])))));
        assert!(granted(&s.apply(&entry(601_000, disrupt("p", "b", empty, &["p-2", "p-3"])))));
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(64))]
        /// Several NodePool actors propose disruptions in any order, with lifecycle steps
        /// and time in between: after every grant, no pool has more nodes disrupting than
        /// its budgets allowed for the command's reason, no more started in the rate window
        /// than the rate, and the grant leaves no pool holding more than its limits once the
        /// leased candidates' holdings are set aside.
        #[test]
        fn budgets_rates_and_limits_hold_under_any_order_of_proposals(
            ops in proptest::collection::vec((0_u8..3, 0_u8..6, 0_usize..12, 1_usize..4, 0_u64..120_000), 1..80)
        ) {
            let mut s = State::default();
            let pools = ["a", "b", "c"];
            let reasons = [DisruptionReason::Empty, DisruptionReason::Drifted, DisruptionReason::Underutilized];
            let budgets = [
                vec![],
                vec![
                    Budget { nodes: BudgetNodes::Percent(20), schedule: None, duration: None, reasons: vec![] },
                    Budget { nodes: BudgetNodes::Count(1), schedule: None, duration: None, reasons: vec![DisruptionReason::Drifted] },
                ],
                vec![Budget {
                    nodes: BudgetNodes::Count(0),
                    schedule: Some("*/2 * * * *".into()),
                    duration: Some(std::time::Duration::from_secs(60)),
                    reasons: vec![],
                }, Budget { nodes: BudgetNodes::Count(3), schedule: None, duration: None, reasons: vec![] }],
            ];
            for (i, p) in pools.iter().enumerate() {
                initialized_pool(&mut s, p, 12, ResourceList::from_pairs([(ResourceName::Cpu, 26_000)]));
                let rate = (i == 2).then_some(budget::Rate { nodes: 4, per: 300_000 });
                s.apply(&entry(1, Command::SetBudgets { pool: (*p).into(), budgets: budgets[i].clone(), rate }));
            }
            let mut at: Millis = 10;
            for (n, (pool, op, first, count, dt)) in ops.into_iter().enumerate() {
                at += dt;
                let pool = pools[pool as usize];
                let ids: Vec<String> = (first..(first + count).min(12)).map(|i| format!("{pool}-{i}")).collect();
                match op {
                    0..=2 => {
                        let reason = reasons[op as usize];
                        let cmd = Command::Disrupt {
                            pool: pool.into(),
                            command: format!("cmd-{n}"),
                            reason,
                            candidates: ids.clone(),
                            replacements: vec![req(&format!("{pool}-r{n}"), 2, 0.1)],
                            not_ready: vec![],
                        };
                        let before = s.allowance(pool, reason, &[], at).expect("pool");
                        if granted(&s.apply(&entry(at, cmd))) {
                            let after = s.allowance(pool, reason, &[], at).expect("pool");
                            proptest::prop_assert!(after.disrupting <= before.allowed, "{before:?} -> {after:?}");
                            if let Some(left) = after.rate_left {
                                proptest::prop_assert!(left <= 4);
                                proptest::prop_assert_eq!(left + ids.len() as u32, before.rate_left.expect("rate"));
                            }
                            let held = s.pool(pool).expect("pool");
                            let mut usage = held.usage.clone();
                            for d in s.disruptions().values().filter(|d| d.pool == pool) {
                                for c in d.candidates.iter().filter_map(|c| s.claim(c)) {
                                    usage.subtract(&c.resources);
                                }
                            }
                            proptest::prop_assert!(usage.get(&ResourceName::Cpu) <= 26_000, "{pool}: {usage:?}");
                        }
                    }
                    3 => {
                        let steps = ids.iter().flat_map(|id| [(id.clone(), Step::Terminating), (id.clone(), Step::InstanceGone)]).collect();
                        s.apply(&entry(at, Command::Advance { steps }));
                    }
                    4 => {
                        let steps = ids.iter().map(|id| (id.clone(), Step::Gone)).collect();
                        s.apply(&entry(at, Command::Advance { steps }));
                    }
                    _ => {
                        let command = s.disruptions().keys().nth(first % 3).cloned().unwrap_or_default();
                        s.apply(&entry(at, Command::EndDisruption { command }));
                    }
                }
            }
        }
    }
}
