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

mod types;

use std::collections::BTreeMap;

pub use types::*;

use crate::catalog::CapacityType;
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
    pub term: Term,
    pub now: Millis,
    pub applied: u64,
}

/// The first resource of `limits` that `usage + extra` exceeds.
fn exceeded(usage: &ResourceList, extra: &ResourceList, limits: &ResourceList) -> Option<ResourceName> {
    limits.iter().find(|(n, limit)| usage.get(n).saturating_add(extra.get(n)) > *limit).map(|(n, _)| n.clone())
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
            term: self.term,
            now: self.now,
            applied: self.applied,
        }
    }

    /// The state with these parts, as [`State::into_parts`] gave them (a snapshot restored).
    pub fn from_parts(p: StateParts) -> State {
        State {
            pools: p.pools,
            caps: p.caps,
            total: p.total,
            total_price: p.total_price,
            claims: p.claims,
            batches: p.batches,
            unavailable: p.unavailable,
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
                    self.claims.insert(c.id.clone(), claim);
                    granted.push(c.id.clone());
                }
                Outcome::Reserved { granted, denied }
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
            let denial = if let Some(resource) = exceeded(&p.usage, &resources, &p.limits) {
                Some(Denial::PoolLimit { resource })
            } else if let Some(resource) = exceeded(&self.total, &resources, &self.caps.resources) {
                Some(Denial::GlobalCap { resource })
            } else if self
                .caps
                .price_per_hour
                .is_some_and(|cap| self.total_price.saturating_add(req.price_per_hour) > cap)
            {
                Some(Denial::SpendCap)
            } else {
                None
            };
            if let Some(d) = denial {
                denied.push((req.id.clone(), d));
                continue;
            }
            self.hold(pool, &resources, req.price_per_hour);
            self.claims.insert(
                req.id.clone(),
                Claim {
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
                },
            );
            granted.push(req.id.clone());
        }
        Outcome::Reserved { granted, denied }
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
                self.release(&pool, &resources, price);
                self.claims.remove(id);
                return Ok(());
            }
        };
        if let Some(c) = self.claims.get_mut(id)
            && c.state != next
        {
            c.state = next;
            c.changed_at = at;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: i64 = 1 << 30;

    fn entry(at: Millis, command: Command) -> Entry {
        Entry { term: 1, at, command }
    }

    fn req(id: &str, cpu: i64, price: f64) -> ClaimRequest {
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
}
