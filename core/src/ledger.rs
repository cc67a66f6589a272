//! The ledger's state machine: what the control plane decided, replicated as commands.
//!
//! NodePool limits and usage, global caps (cluster-wide resources and $/hour across every
//! NodePool: the spend cap that stops a runaway scale-up), the registry of every NodeClaim
//! the plane decided on with its lifecycle, and unavailable offerings (ICE marks with expiry).
//!
//! [`State::apply`] is pure: it reads no clock (commands carry the proposer's timestamp in
//! [`Entry::at`]), does no I/O and iterates ordered maps, so replaying a log gives the same
//! state on every node. The async `Ledger` seam and its implementations live in `dovetail-raft`.

use std::collections::BTreeMap;
use std::fmt;

use crate::catalog::CapacityType;
use crate::resources::{ResourceList, ResourceName};

/// Milliseconds on the proposer's clock (Unix time in production, the sim clock in tests).
pub type Millis = u64;

/// Prices in the ledger are integers: millionths of a dollar per hour, so sums are exact.
pub type MicroDollars = u64;

/// Converts $/hour to [`MicroDollars`] (rounded up, so a reservation never undercounts).
pub fn micro_dollars(per_hour: f64) -> MicroDollars {
    if per_hour.is_finite() && per_hour > 0.0 { (per_hour * 1e6).ceil() as MicroDollars } else { 0 }
}

/// An offering: an instance type in a zone with a capacity type.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Offering {
    pub instance_type: String,
    pub zone: String,
    pub capacity_type: CapacityType,
}

impl fmt::Display for Offering {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}:{}", self.capacity_type, self.instance_type, self.zone)
    }
}

/// Cluster-wide caps across every NodePool.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Caps {
    /// Per resource (`nodes`, `cpu`, `memory`, ...); an absent resource is uncapped.
    pub resources: ResourceList,
    /// The spend cap: the sum of every live claim's price.
    pub price_per_hour: Option<MicroDollars>,
}

/// A NodePool as the ledger knows it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Pool {
    /// `spec.limits`; an absent resource is unlimited.
    pub limits: ResourceList,
    /// What its live claims hold (each counts `nodes: 1`).
    pub usage: ResourceList,
    pub price_per_hour: MicroDollars,
}

/// Where a claim is in its life.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ClaimState {
    /// Granted against the limits; not yet handed to a zone.
    Reserved,
    /// Handed to its zone for launch.
    Launching,
    /// The cloud made the instance.
    Launched { instance: String },
    /// Its Node registered.
    Registered { instance: String },
    /// Its Node is initialized (ready, startup taints gone).
    Initialized { instance: String },
    /// Being drained and deleted; still holds its resources until gone.
    Terminating { instance: Option<String> },
}

impl ClaimState {
    fn rank(&self) -> u8 {
        match self {
            ClaimState::Reserved => 0,
            ClaimState::Launching => 1,
            ClaimState::Launched { .. } => 2,
            ClaimState::Registered { .. } => 3,
            ClaimState::Initialized { .. } => 4,
            ClaimState::Terminating { .. } => 5,
        }
    }

    /// The instance, once launched.
    pub fn instance(&self) -> Option<&str> {
        match self {
            ClaimState::Launched { instance }
            | ClaimState::Registered { instance }
            | ClaimState::Initialized { instance } => Some(instance),
            ClaimState::Terminating { instance } => instance.as_deref(),
            ClaimState::Reserved | ClaimState::Launching => None,
        }
    }

    fn name(&self) -> &'static str {
        match self {
            ClaimState::Reserved => "Reserved",
            ClaimState::Launching => "Launching",
            ClaimState::Launched { .. } => "Launched",
            ClaimState::Registered { .. } => "Registered",
            ClaimState::Initialized { .. } => "Initialized",
            ClaimState::Terminating { .. } => "Terminating",
        }
    }
}

/// A NodeClaim the plane decided on.
#[derive(Clone, Debug, PartialEq)]
pub struct Claim {
    pub id: String,
    pub pool: String,
    pub zone: String,
    /// What it counts against limits and caps (`nodes: 1` included): the reservation until
    /// launched, then the instance's.
    pub resources: ResourceList,
    pub price_per_hour: MicroDollars,
    pub state: ClaimState,
    /// The round (launch batch) that reserved it.
    pub batch: u64,
    pub reserved_at: Millis,
    pub changed_at: Millis,
}

/// One claim of a reservation round.
#[derive(Clone, Debug, PartialEq)]
pub struct ClaimRequest {
    pub id: String,
    pub zone: String,
    /// The most the claim can hold (its largest candidate type's capacity); `nodes` is added.
    pub resources: ResourceList,
    /// The most it can cost (its dearest candidate offering).
    pub price_per_hour: MicroDollars,
}

/// A lifecycle step of a claim.
#[derive(Clone, Debug, PartialEq)]
pub enum Step {
    Launching,
    /// The instance, with what it really holds and costs (at most what was reserved).
    Launched {
        instance: String,
        resources: ResourceList,
        price_per_hour: MicroDollars,
    },
    Registered,
    Initialized,
    Terminating,
    /// Gone: its resources are released and it leaves the registry.
    Gone,
}

/// What the ledger is asked to do.
#[derive(Clone, Debug, PartialEq)]
pub enum Command {
    /// Creates or updates a NodePool's limits (lowering them below usage removes nothing).
    SetPool {
        pool: String,
        limits: ResourceList,
    },
    /// Removes a NodePool; refused while it has claims.
    RemovePool {
        pool: String,
    },
    SetCaps(Caps),
    /// One reservation round of a pool: each claim is granted if it fits the pool's limits and
    /// the global caps, in order; a claim id already known is granted again without counting
    /// twice (a re-driven round is harmless).
    Reserve {
        pool: String,
        batch: u64,
        claims: Vec<ClaimRequest>,
    },
    Advance {
        claim: String,
        step: Step,
    },
    /// Marks an offering unavailable until `until` (insufficient capacity).
    MarkUnavailable {
        offering: Offering,
        until: Millis,
    },
}

/// A command with the proposer's timestamp.
#[derive(Clone, Debug, PartialEq)]
pub struct Entry {
    pub at: Millis,
    pub command: Command,
}

/// Why a claim of a round was not granted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Denial {
    UnknownPool,
    PoolLimit { resource: ResourceName },
    GlobalCap { resource: ResourceName },
    SpendCap,
}

impl fmt::Display for Denial {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Denial::UnknownPool => f.write_str("unknown nodepool"),
            Denial::PoolLimit { resource } => write!(f, "nodepool limit on {resource} reached"),
            Denial::GlobalCap { resource } => write!(f, "global cap on {resource} reached"),
            Denial::SpendCap => f.write_str("global $/hour cap reached"),
        }
    }
}

/// What applying an entry did.
#[derive(Clone, Debug, PartialEq)]
pub enum Outcome {
    Done,
    Reserved {
        granted: Vec<String>,
        denied: Vec<(String, Denial)>,
    },
    /// Nothing changed; the command was not valid in this state.
    Rejected {
        reason: String,
    },
}

/// The replicated state.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct State {
    pools: BTreeMap<String, Pool>,
    caps: Caps,
    /// Across every pool.
    total: ResourceList,
    total_price: MicroDollars,
    claims: BTreeMap<String, Claim>,
    unavailable: BTreeMap<Offering, Millis>,
    /// Entries applied.
    applied: u64,
}

/// The first resource of `limits` that `usage + extra` exceeds.
fn exceeded(usage: &ResourceList, extra: &ResourceList, limits: &ResourceList) -> Option<ResourceName> {
    limits.iter().find(|(n, limit)| usage.get(n).saturating_add(extra.get(n)) > *limit).map(|(n, _)| n.clone())
}

impl State {
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

    /// Entries applied so far.
    pub fn applied(&self) -> u64 {
        self.applied
    }

    /// Whether an offering is marked unavailable at `now`.
    pub fn is_unavailable(&self, offering: &Offering, now: Millis) -> bool {
        self.unavailable.get(offering).is_some_and(|until| now < *until)
    }

    /// The offerings marked unavailable at `now`.
    pub fn unavailable(&self, now: Millis) -> impl Iterator<Item = &Offering> {
        self.unavailable.iter().filter(move |(_, until)| now < **until).map(|(o, _)| o)
    }

    /// Applies one entry. Deterministic: the same entries in the same order give the same
    /// state and outcomes.
    pub fn apply(&mut self, entry: &Entry) -> Outcome {
        self.applied += 1;
        let at = entry.at;
        // Expired marks go when any entry at or after their expiry is applied.
        self.unavailable.retain(|_, until| at < *until);
        match &entry.command {
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
            Command::Reserve { pool, batch, claims } => self.reserve(at, pool, *batch, claims),
            Command::Advance { claim, step } => self.advance(at, claim, step),
            Command::MarkUnavailable { offering, until } => {
                if *until > at {
                    let e = self.unavailable.entry(offering.clone()).or_insert(*until);
                    *e = (*e).max(*until);
                }
                Outcome::Done
            }
        }
    }

    fn reserve(&mut self, at: Millis, pool: &str, batch: u64, claims: &[ClaimRequest]) -> Outcome {
        let mut granted = Vec::new();
        let mut denied = Vec::new();
        for req in claims {
            if self.claims.contains_key(&req.id) {
                granted.push(req.id.clone());
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
                    price_per_hour: req.price_per_hour,
                    state: ClaimState::Reserved,
                    batch,
                    reserved_at: at,
                    changed_at: at,
                },
            );
            granted.push(req.id.clone());
        }
        Outcome::Reserved { granted, denied }
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

    fn advance(&mut self, at: Millis, id: &str, step: &Step) -> Outcome {
        let Some(claim) = self.claims.get(id) else {
            return match step {
                // Gone twice is harmless.
                Step::Gone => Outcome::Done,
                _ => Outcome::Rejected { reason: format!("unknown claim {id}") },
            };
        };
        let reject = |to: &str| Outcome::Rejected {
            reason: format!("claim {id} cannot go from {} to {to}", claim.state.name()),
        };
        let next = match step {
            Step::Launching => match claim.state {
                ClaimState::Reserved => ClaimState::Launching,
                ClaimState::Launching => return Outcome::Done,
                _ => return reject("Launching"),
            },
            Step::Launched { instance, resources, price_per_hour } => match &claim.state {
                ClaimState::Reserved | ClaimState::Launching => {
                    let (pool, old, old_price) = (claim.pool.clone(), claim.resources.clone(), claim.price_per_hour);
                    let mut new = resources.clone();
                    new.set(ResourceName::Nodes, 1);
                    self.release(&pool, &old, old_price);
                    self.hold(&pool, &new, *price_per_hour);
                    if let Some(c) = self.claims.get_mut(id) {
                        c.resources = new;
                        c.price_per_hour = *price_per_hour;
                        c.state = ClaimState::Launched { instance: instance.clone() };
                        c.changed_at = at;
                    }
                    return Outcome::Done;
                }
                ClaimState::Launched { instance: known } if known == instance => return Outcome::Done,
                _ => return reject("Launched"),
            },
            Step::Registered => match &claim.state {
                ClaimState::Launched { instance } => ClaimState::Registered { instance: instance.clone() },
                ClaimState::Registered { .. } => return Outcome::Done,
                _ => return reject("Registered"),
            },
            Step::Initialized => match &claim.state {
                ClaimState::Registered { instance } => ClaimState::Initialized { instance: instance.clone() },
                ClaimState::Initialized { .. } => return Outcome::Done,
                _ => return reject("Initialized"),
            },
            Step::Terminating => match &claim.state {
                ClaimState::Terminating { .. } => return Outcome::Done,
                s => ClaimState::Terminating { instance: s.instance().map(str::to_string) },
            },
            Step::Gone => {
                let (pool, resources, price) = (claim.pool.clone(), claim.resources.clone(), claim.price_per_hour);
                self.release(&pool, &resources, price);
                self.claims.remove(id);
                return Outcome::Done;
            }
        };
        debug_assert!(next.rank() > claim.state.rank());
        if let Some(c) = self.claims.get_mut(id) {
            c.state = next;
            c.changed_at = at;
        }
        Outcome::Done
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: i64 = 1 << 30;

    fn entry(at: Millis, command: Command) -> Entry {
        Entry { at, command }
    }

    fn req(id: &str, cpu: i64, price: f64) -> ClaimRequest {
        ClaimRequest {
            id: id.into(),
            zone: "us-east-1a".into(),
            resources: ResourceList::cpu_mem(cpu * 1000, cpu * 4 * GIB),
            price_per_hour: micro_dollars(price),
        }
    }

    fn state_with_pool(limits: ResourceList) -> State {
        let mut s = State::default();
        s.apply(&entry(0, Command::SetPool { pool: "default".into(), limits }));
        s
    }

    #[test]
    fn a_round_is_granted_up_to_the_pool_limit() {
        let mut s = state_with_pool(ResourceList::from_pairs([(ResourceName::Cpu, 10_000)]));
        let out = s.apply(&entry(
            1,
            Command::Reserve {
                pool: "default".into(),
                batch: 1,
                claims: vec![req("a", 4, 0.2), req("b", 4, 0.2), req("c", 4, 0.2), req("d", 2, 0.1)],
            },
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
    fn a_re_driven_round_counts_once() {
        let mut s = state_with_pool(ResourceList::new());
        let round = Command::Reserve { pool: "default".into(), batch: 7, claims: vec![req("a", 2, 0.1)] };
        s.apply(&entry(1, round.clone()));
        let again = s.apply(&entry(2, round));
        assert_eq!(again, Outcome::Reserved { granted: vec!["a".into()], denied: vec![] });
        assert_eq!(s.total().get(&ResourceName::Nodes), 1);
    }

    #[test]
    fn the_spend_cap_stops_a_runaway_scale_up_across_pools() {
        let mut s = state_with_pool(ResourceList::new());
        s.apply(&entry(0, Command::SetPool { pool: "gpu".into(), limits: ResourceList::new() }));
        s.apply(&entry(
            0,
            Command::SetCaps(Caps { resources: ResourceList::new(), price_per_hour: Some(micro_dollars(1.0)) }),
        ));
        let out =
            s.apply(&entry(1, Command::Reserve { pool: "default".into(), batch: 1, claims: vec![req("a", 2, 0.6)] }));
        assert!(matches!(out, Outcome::Reserved { ref denied, .. } if denied.is_empty()));
        let out = s.apply(&entry(2, Command::Reserve { pool: "gpu".into(), batch: 2, claims: vec![req("g", 2, 0.6)] }));
        assert_eq!(out, Outcome::Reserved { granted: vec![], denied: vec![("g".into(), Denial::SpendCap)] });
        let out = s.apply(&entry(3, Command::Reserve { pool: "gpu".into(), batch: 3, claims: vec![req("h", 1, 0.3)] }));
        assert_eq!(out, Outcome::Reserved { granted: vec!["h".into()], denied: vec![] });
    }

    #[test]
    fn the_lifecycle_moves_forward_only_and_gone_releases() {
        let mut s = state_with_pool(ResourceList::new());
        s.apply(&entry(1, Command::Reserve { pool: "default".into(), batch: 1, claims: vec![req("a", 8, 0.4)] }));
        let adv = |s: &mut State, at, step| s.apply(&entry(at, Command::Advance { claim: "a".into(), step }));
        assert!(matches!(adv(&mut s, 2, Step::Registered), Outcome::Rejected { .. }), "no instance yet");
        assert_eq!(adv(&mut s, 2, Step::Launching), Outcome::Done);
        let launched = Step::Launched {
            instance: "i-1".into(),
            resources: ResourceList::cpu_mem(4000, 16 * GIB),
            price_per_hour: 200_000,
        };
        assert_eq!(adv(&mut s, 3, launched.clone()), Outcome::Done);
        assert_eq!(adv(&mut s, 3, launched), Outcome::Done, "idempotent");
        assert_eq!(s.total().get(&ResourceName::Cpu), 4000, "usage follows the instance");
        assert_eq!(s.total_price(), 200_000);
        assert_eq!(adv(&mut s, 4, Step::Registered), Outcome::Done);
        assert_eq!(adv(&mut s, 5, Step::Initialized), Outcome::Done);
        assert!(matches!(adv(&mut s, 6, Step::Launching), Outcome::Rejected { .. }));
        assert_eq!(adv(&mut s, 7, Step::Terminating), Outcome::Done);
        assert!(matches!(adv(&mut s, 8, Step::Initialized), Outcome::Rejected { .. }));
        assert_eq!(s.claim("a").and_then(|c| c.state.instance()), Some("i-1"));
        assert_eq!(adv(&mut s, 9, Step::Gone), Outcome::Done);
        assert_eq!(adv(&mut s, 10, Step::Gone), Outcome::Done, "gone twice is harmless");
        assert!(s.claims().is_empty());
        assert_eq!(s.total().get(&ResourceName::Cpu), 0);
        assert_eq!(s.total_price(), 0);
    }

    #[test]
    fn ice_marks_expire_by_the_entries_timestamps() {
        let mut s = State::default();
        let o =
            Offering { instance_type: "m5.large".into(), zone: "us-east-1a".into(), capacity_type: CapacityType::Spot };
        s.apply(&entry(1_000, Command::MarkUnavailable { offering: o.clone(), until: 4_000 }));
        assert!(s.is_unavailable(&o, 3_999));
        assert!(!s.is_unavailable(&o, 4_000));
        assert_eq!(s.unavailable(2_000).count(), 1);
        s.apply(&entry(5_000, Command::SetCaps(Caps::default())));
        assert_eq!(s.unavailable(0).count(), 0, "pruned once an entry at or after the expiry is applied");
    }

    #[test]
    fn a_pool_with_claims_is_not_removed() {
        let mut s = state_with_pool(ResourceList::new());
        s.apply(&entry(1, Command::Reserve { pool: "default".into(), batch: 1, claims: vec![req("a", 1, 0.1)] }));
        assert!(matches!(s.apply(&entry(2, Command::RemovePool { pool: "default".into() })), Outcome::Rejected { .. }));
        s.apply(&entry(3, Command::Advance { claim: "a".into(), step: Step::Gone }));
        assert_eq!(s.apply(&entry(4, Command::RemovePool { pool: "default".into() })), Outcome::Done);
        let out =
            s.apply(&entry(5, Command::Reserve { pool: "default".into(), batch: 2, claims: vec![req("b", 1, 0.1)] }));
        assert_eq!(out, Outcome::Reserved { granted: vec![], denied: vec![("b".into(), Denial::UnknownPool)] });
    }
}
