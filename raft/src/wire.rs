//! The ledger's entries, outcomes and snapshots as they are written to disk and sent between
//! control nodes: a versioned serde encoding, separate from `dovetail_core::ledger`'s types so
//! that those can change while what older versions wrote still decodes.
//!
//! Every record is tagged with its version (`{"v1": ...}`). A new version adds a variant and
//! a conversion from the old one; decoding never drops a version that a supported release
//! wrote (`tests/fixtures/ledger-v1-*.json` are entries and a snapshot written by version 1:
//! a test decodes them).

use std::collections::BTreeMap;
use std::sync::Arc;

use dovetail_core::catalog::CapacityType;
use dovetail_core::disruption::budget::Rate;
use dovetail_core::ledger::{
    BatchRecord, Caps, Claim, ClaimRequest, ClaimState, Command, Denial, DisruptionCommand, Entry, LaunchBatch, Millis,
    Offering, Outcome, Pool, State, StateParts, Step, Term,
};
use dovetail_core::nodepool::{Budget, BudgetNodes, DisruptionReason};
use dovetail_core::resources::{ResourceList, ResourceName};
use serde::{Deserialize, Serialize};

mod collect;
mod interruption;
pub use collect::CollectableV1;
pub use interruption::{InterruptionV1, NoticeV1, ReplacementV1};

/// Why a record did not decode into the ledger's types.
#[derive(Debug, thiserror::Error)]
pub enum WireError {
    #[error("unknown capacity type {0:?}")]
    CapacityType(String),
    #[error("unknown disruption reason {0:?}")]
    Reason(String),
    #[error("budget nodes {0:?} is neither a count nor a percentage")]
    BudgetNodes(String),
    #[error("unknown interruption kind {0:?}")]
    InterruptionKind(String),
}

/// A ledger entry, as stored in the log and replicated.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WireEntry {
    V1(EntryV1),
}

/// What applying an entry gave, as returned to the proposer.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WireOutcome {
    V1(OutcomeV1),
}

/// The whole state, as a snapshot stores it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WireState {
    V1(StateV1),
}

impl WireEntry {
    pub fn encode(entry: &Entry) -> WireEntry {
        WireEntry::V1(EntryV1::from(entry))
    }

    pub fn decode(&self) -> Result<Entry, WireError> {
        match self {
            WireEntry::V1(e) => e.to_core(),
        }
    }
}

impl WireOutcome {
    pub fn encode(outcome: &Outcome) -> WireOutcome {
        WireOutcome::V1(OutcomeV1::from(outcome))
    }

    pub fn decode(&self) -> Outcome {
        match self {
            WireOutcome::V1(o) => o.to_core(),
        }
    }
}

impl WireState {
    pub fn encode(state: State) -> WireState {
        WireState::V1(StateV1::from(state.into_parts()))
    }

    pub fn decode(&self) -> Result<State, WireError> {
        match self {
            WireState::V1(s) => s.to_core(),
        }
    }
}

/// Resource amounts by name (`cpu` in millicores, `memory` in bytes, ...).
pub type ResourcesV1 = BTreeMap<String, i64>;

fn resources(r: &ResourceList) -> ResourcesV1 {
    r.iter().map(|(n, v)| (n.as_str().to_string(), v)).collect()
}

fn resource_list(r: &ResourcesV1) -> ResourceList {
    ResourceList::from_pairs(r.iter().map(|(n, v)| (ResourceName::parse(n), *v)))
}

fn capacity_type(s: &str) -> Result<CapacityType, WireError> {
    CapacityType::parse(s).ok_or_else(|| WireError::CapacityType(s.to_string()))
}

fn reason(s: &str) -> Result<DisruptionReason, WireError> {
    DisruptionReason::parse(s).ok_or_else(|| WireError::Reason(s.to_string()))
}

fn request(r: &ClaimRequest) -> ClaimRequestV1 {
    ClaimRequestV1 {
        id: r.id.clone(),
        zone: r.zone.clone(),
        resources: resources(&r.resources),
        price_per_hour: r.price_per_hour,
    }
}

fn claim_request(r: &ClaimRequestV1) -> ClaimRequest {
    ClaimRequest {
        id: r.id.clone(),
        zone: r.zone.clone(),
        resources: resource_list(&r.resources),
        price_per_hour: r.price_per_hour,
    }
}

fn requests(claims: &[ClaimRequest]) -> Vec<ClaimRequestV1> {
    claims.iter().map(request).collect()
}

fn claim_requests(claims: &[ClaimRequestV1]) -> Vec<ClaimRequest> {
    claims.iter().map(claim_request).collect()
}

/// A disruption budget (`nodes` as the NodePool writes it: `"10%"` or `"3"`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct BudgetV1 {
    pub nodes: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schedule: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub reasons: Vec<String>,
}

impl From<&Budget> for BudgetV1 {
    fn from(b: &Budget) -> Self {
        BudgetV1 {
            nodes: match b.nodes {
                BudgetNodes::Percent(p) => format!("{p}%"),
                BudgetNodes::Count(n) => n.to_string(),
            },
            schedule: b.schedule.clone(),
            duration_ms: b.duration.map(dovetail_core::clock::to_millis),
            reasons: b.reasons.iter().map(|r| r.as_str().to_string()).collect(),
        }
    }
}

impl BudgetV1 {
    pub fn to_core(&self) -> Result<Budget, WireError> {
        let bad = || WireError::BudgetNodes(self.nodes.clone());
        let nodes = match self.nodes.strip_suffix('%') {
            Some(p) => BudgetNodes::Percent(p.parse().map_err(|_| bad())?),
            None => BudgetNodes::Count(self.nodes.parse().map_err(|_| bad())?),
        };
        Ok(Budget {
            nodes,
            schedule: self.schedule.clone(),
            duration: self.duration_ms.map(std::time::Duration::from_millis),
            reasons: self.reasons.iter().map(|r| reason(r)).collect::<Result<_, _>>()?,
        })
    }
}

/// The rate budget: `nodes` per `per_ms`.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct RateV1 {
    pub nodes: u32,
    pub per_ms: u64,
}

/// A disruption command under way.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DisruptionV1 {
    pub pool: String,
    pub reason: String,
    pub candidates: Vec<String>,
    pub replacements: Vec<String>,
    pub at: Millis,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct EntryV1 {
    pub term: Term,
    pub at: Millis,
    pub command: CommandV1,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CommandV1 {
    Lead,
    SetPool {
        pool: String,
        limits: ResourcesV1,
    },
    RemovePool {
        pool: String,
    },
    SetCaps {
        resources: ResourcesV1,
        price_per_hour: Option<u64>,
    },
    Reserve {
        pool: String,
        claims: Vec<ClaimRequestV1>,
    },
    Launch {
        zone: String,
        batches: Vec<LaunchBatchV1>,
    },
    Advance {
        steps: Vec<(String, StepV1)>,
    },
    Adopt {
        claims: Vec<ClaimV1>,
    },
    MarkUnavailable {
        offerings: Vec<OfferingV1>,
        until: Millis,
    },
    SetBudgets {
        pool: String,
        budgets: Vec<BudgetV1>,
        rate: Option<RateV1>,
    },
    Disrupt {
        pool: String,
        command: String,
        reason: String,
        candidates: Vec<String>,
        replacements: Vec<ClaimRequestV1>,
        not_ready: Vec<String>,
    },
    EndDisruption {
        command: String,
    },
    Interrupt {
        notices: Vec<NoticeV1>,
    },
    ReplaceInterrupted {
        instances: Vec<String>,
        replacements: Vec<ReplacementV1>,
    },
    Collect {
        instances: Vec<CollectableV1>,
    },
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ClaimRequestV1 {
    pub id: String,
    pub zone: String,
    pub resources: ResourcesV1,
    pub price_per_hour: u64,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LaunchBatchV1 {
    pub id: String,
    pub claims: Vec<String>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StepV1 {
    Launched {
        batch: String,
        instance: String,
        resources: ResourcesV1,
        allocatable: ResourcesV1,
        price_per_hour: u64,
        instance_type: String,
        capacity_type: String,
    },
    Unlaunched {
        batch: String,
    },
    Registered,
    Initialized,
    Terminating,
    InstanceGone,
    Gone,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct OfferingV1 {
    pub instance_type: String,
    pub zone: String,
    pub capacity_type: String,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ClaimStateV1 {
    Reserved,
    Launching { batch: String },
    Launched { instance: String },
    Registered { instance: String },
    Initialized { instance: String },
    Terminating { instance: Option<String>, batch: Option<String>, instance_gone: bool },
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ClaimV1 {
    pub id: String,
    pub pool: String,
    pub zone: String,
    pub resources: ResourcesV1,
    pub allocatable: ResourcesV1,
    pub price_per_hour: u64,
    /// The instance type and capacity type it launched as.
    pub launched_as: Option<(String, String)>,
    pub state: ClaimStateV1,
    pub reserved_at: Millis,
    pub changed_at: Millis,
    /// Its first launch call (added within version 1: records without it decode as `None`,
    /// and versions without it skip it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tried_at: Option<Millis>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DenialV1 {
    UnknownPool,
    PoolLimit { resource: String },
    GlobalCap { resource: String },
    SpendCap,
    DuplicateId,
    Unneeded,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OutcomeV1 {
    Done,
    Reserved { granted: Vec<String>, denied: Vec<(String, DenialV1)> },
    Launching { started: Vec<String>, refused: Vec<(String, String)> },
    Advanced { rejected: Vec<(String, String)> },
    Rejected { reason: String },
    Fenced { term: Term },
    Disrupting { refused: Option<String> },
    Interrupted { recorded: Vec<String>, duplicates: Vec<String> },
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PoolV1 {
    pub limits: ResourcesV1,
    pub usage: ResourcesV1,
    pub price_per_hour: u64,
    /// Absent in what versions before disruption wrote.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budgets: Option<Vec<BudgetV1>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate: Option<RateV1>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub starts: Vec<Millis>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct BatchRecordV1 {
    pub zone: String,
    pub claims: Vec<String>,
    pub at: Millis,
}

/// Every field of the state: a snapshot restores it exactly (replaying the log from it gives
/// what replaying the whole log gives).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StateV1 {
    pub pools: BTreeMap<String, PoolV1>,
    pub caps_resources: ResourcesV1,
    pub caps_price_per_hour: Option<u64>,
    pub total: ResourcesV1,
    pub total_price: u64,
    pub claims: Vec<ClaimV1>,
    pub batches: BTreeMap<String, BatchRecordV1>,
    /// Offerings marked unavailable, with the time each mark expires.
    pub unavailable: Vec<(OfferingV1, Millis)>,
    /// Disruption commands under way (absent in what versions before disruption wrote).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub disruptions: BTreeMap<String, DisruptionV1>,
    /// Interruptions recorded, by instance (absent in what versions before interruption
    /// handling wrote).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub interruptions: BTreeMap<String, InterruptionV1>,
    pub term: Term,
    pub now: Millis,
    pub applied: u64,
}

impl From<&Entry> for EntryV1 {
    fn from(e: &Entry) -> Self {
        EntryV1 { term: e.term, at: e.at, command: CommandV1::from(&e.command) }
    }
}

impl EntryV1 {
    pub fn to_core(&self) -> Result<Entry, WireError> {
        Ok(Entry { term: self.term, at: self.at, command: self.command.to_core()? })
    }
}

impl From<&Command> for CommandV1 {
    fn from(c: &Command) -> Self {
        match c {
            Command::Lead => CommandV1::Lead,
            Command::SetPool { pool, limits } => CommandV1::SetPool { pool: pool.clone(), limits: resources(limits) },
            Command::RemovePool { pool } => CommandV1::RemovePool { pool: pool.clone() },
            Command::SetCaps(caps) => {
                CommandV1::SetCaps { resources: resources(&caps.resources), price_per_hour: caps.price_per_hour }
            }
            Command::Reserve { pool, claims } => CommandV1::Reserve { pool: pool.clone(), claims: requests(claims) },
            Command::Launch { zone, batches } => CommandV1::Launch {
                zone: zone.clone(),
                batches: batches
                    .iter()
                    .map(|b| LaunchBatchV1 { id: b.id.clone(), claims: b.claims.to_vec() })
                    .collect(),
            },
            Command::Advance { steps } => {
                CommandV1::Advance { steps: steps.iter().map(|(id, s)| (id.clone(), StepV1::from(s))).collect() }
            }
            Command::Adopt { claims } => CommandV1::Adopt { claims: claims.iter().map(ClaimV1::from).collect() },
            Command::MarkUnavailable { offerings, until } => CommandV1::MarkUnavailable {
                offerings: offerings.iter().map(OfferingV1::from).collect(),
                until: *until,
            },
            Command::SetBudgets { pool, budgets, rate } => CommandV1::SetBudgets {
                pool: pool.clone(),
                budgets: budgets.iter().map(BudgetV1::from).collect(),
                rate: rate.map(|r| RateV1 { nodes: r.nodes, per_ms: r.per }),
            },
            Command::Disrupt { pool, command, reason, candidates, replacements, not_ready } => CommandV1::Disrupt {
                pool: pool.clone(),
                command: command.clone(),
                reason: reason.as_str().to_string(),
                candidates: candidates.clone(),
                replacements: requests(replacements),
                not_ready: not_ready.clone(),
            },
            Command::EndDisruption { command } => CommandV1::EndDisruption { command: command.clone() },
            Command::Interrupt { notices } => {
                CommandV1::Interrupt { notices: notices.iter().map(NoticeV1::from).collect() }
            }
            Command::ReplaceInterrupted { instances, replacements } => CommandV1::ReplaceInterrupted {
                instances: instances.clone(),
                replacements: replacements.iter().map(ReplacementV1::from).collect(),
            },
            Command::Collect { instances } => {
                CommandV1::Collect { instances: instances.iter().map(CollectableV1::from).collect() }
            }
        }
    }
}

impl CommandV1 {
    pub fn to_core(&self) -> Result<Command, WireError> {
        Ok(match self {
            CommandV1::Lead => Command::Lead,
            CommandV1::SetPool { pool, limits } => {
                Command::SetPool { pool: pool.clone(), limits: resource_list(limits) }
            }
            CommandV1::RemovePool { pool } => Command::RemovePool { pool: pool.clone() },
            CommandV1::SetCaps { resources, price_per_hour } => {
                Command::SetCaps(Caps { resources: resource_list(resources), price_per_hour: *price_per_hour })
            }
            CommandV1::Reserve { pool, claims } => {
                Command::Reserve { pool: pool.clone(), claims: claim_requests(claims) }
            }
            CommandV1::Launch { zone, batches } => Command::Launch {
                zone: zone.clone(),
                batches: batches
                    .iter()
                    .map(|b| LaunchBatch { id: b.id.clone(), claims: Arc::from(b.claims.as_slice()) })
                    .collect(),
            },
            CommandV1::Advance { steps } => Command::Advance {
                steps: steps.iter().map(|(id, s)| Ok((id.clone(), s.to_core()?))).collect::<Result<_, WireError>>()?,
            },
            CommandV1::Adopt { claims } => {
                Command::Adopt { claims: claims.iter().map(ClaimV1::to_core).collect::<Result<_, _>>()? }
            }
            CommandV1::MarkUnavailable { offerings, until } => Command::MarkUnavailable {
                offerings: offerings.iter().map(OfferingV1::to_core).collect::<Result<_, _>>()?,
                until: *until,
            },
            CommandV1::SetBudgets { pool, budgets, rate } => Command::SetBudgets {
                pool: pool.clone(),
                budgets: budgets.iter().map(BudgetV1::to_core).collect::<Result<_, _>>()?,
                rate: rate.map(|r| Rate { nodes: r.nodes, per: r.per_ms }),
            },
            CommandV1::Disrupt { pool, command, reason: r, candidates, replacements, not_ready } => Command::Disrupt {
                pool: pool.clone(),
                command: command.clone(),
                reason: reason(r)?,
                candidates: candidates.clone(),
                replacements: claim_requests(replacements),
                not_ready: not_ready.clone(),
            },
            CommandV1::EndDisruption { command } => Command::EndDisruption { command: command.clone() },
            CommandV1::Interrupt { notices } => {
                Command::Interrupt { notices: notices.iter().map(NoticeV1::to_core).collect::<Result<_, _>>()? }
            }
            CommandV1::ReplaceInterrupted { instances, replacements } => Command::ReplaceInterrupted {
                instances: instances.clone(),
                replacements: replacements.iter().map(ReplacementV1::to_core).collect(),
            },
            CommandV1::Collect { instances } => {
                Command::Collect { instances: instances.iter().map(CollectableV1::to_core).collect() }
            }
        })
    }
}

impl From<&Step> for StepV1 {
    fn from(s: &Step) -> Self {
        match s {
            Step::Launched {
                batch,
                instance,
                resources: r,
                allocatable,
                price_per_hour,
                instance_type,
                capacity_type,
            } => StepV1::Launched {
                batch: batch.clone(),
                instance: instance.clone(),
                resources: resources(r),
                allocatable: resources(allocatable),
                price_per_hour: *price_per_hour,
                instance_type: instance_type.clone(),
                capacity_type: capacity_type.as_str().to_string(),
            },
            Step::Unlaunched { batch } => StepV1::Unlaunched { batch: batch.clone() },
            Step::Registered => StepV1::Registered,
            Step::Initialized => StepV1::Initialized,
            Step::Terminating => StepV1::Terminating,
            Step::InstanceGone => StepV1::InstanceGone,
            Step::Gone => StepV1::Gone,
        }
    }
}

impl StepV1 {
    pub fn to_core(&self) -> Result<Step, WireError> {
        Ok(match self {
            StepV1::Launched {
                batch,
                instance,
                resources: r,
                allocatable,
                price_per_hour,
                instance_type,
                capacity_type: ct,
            } => Step::Launched {
                batch: batch.clone(),
                instance: instance.clone(),
                resources: resource_list(r),
                allocatable: resource_list(allocatable),
                price_per_hour: *price_per_hour,
                instance_type: instance_type.clone(),
                capacity_type: capacity_type(ct)?,
            },
            StepV1::Unlaunched { batch } => Step::Unlaunched { batch: batch.clone() },
            StepV1::Registered => Step::Registered,
            StepV1::Initialized => Step::Initialized,
            StepV1::Terminating => Step::Terminating,
            StepV1::InstanceGone => Step::InstanceGone,
            StepV1::Gone => Step::Gone,
        })
    }
}

impl From<&Offering> for OfferingV1 {
    fn from(o: &Offering) -> Self {
        OfferingV1 {
            instance_type: o.instance_type.clone(),
            zone: o.zone.clone(),
            capacity_type: o.capacity_type.as_str().to_string(),
        }
    }
}

impl OfferingV1 {
    pub fn to_core(&self) -> Result<Offering, WireError> {
        Ok(Offering {
            instance_type: self.instance_type.clone(),
            zone: self.zone.clone(),
            capacity_type: capacity_type(&self.capacity_type)?,
        })
    }
}

impl From<&ClaimState> for ClaimStateV1 {
    fn from(s: &ClaimState) -> Self {
        match s {
            ClaimState::Reserved => ClaimStateV1::Reserved,
            ClaimState::Launching { batch } => ClaimStateV1::Launching { batch: batch.clone() },
            ClaimState::Launched { instance } => ClaimStateV1::Launched { instance: instance.clone() },
            ClaimState::Registered { instance } => ClaimStateV1::Registered { instance: instance.clone() },
            ClaimState::Initialized { instance } => ClaimStateV1::Initialized { instance: instance.clone() },
            ClaimState::Terminating { instance, batch, instance_gone } => ClaimStateV1::Terminating {
                instance: instance.clone(),
                batch: batch.clone(),
                instance_gone: *instance_gone,
            },
        }
    }
}

impl ClaimStateV1 {
    pub fn to_core(&self) -> ClaimState {
        match self {
            ClaimStateV1::Reserved => ClaimState::Reserved,
            ClaimStateV1::Launching { batch } => ClaimState::Launching { batch: batch.clone() },
            ClaimStateV1::Launched { instance } => ClaimState::Launched { instance: instance.clone() },
            ClaimStateV1::Registered { instance } => ClaimState::Registered { instance: instance.clone() },
            ClaimStateV1::Initialized { instance } => ClaimState::Initialized { instance: instance.clone() },
            ClaimStateV1::Terminating { instance, batch, instance_gone } => ClaimState::Terminating {
                instance: instance.clone(),
                batch: batch.clone(),
                instance_gone: *instance_gone,
            },
        }
    }
}

impl From<&Claim> for ClaimV1 {
    fn from(c: &Claim) -> Self {
        ClaimV1 {
            id: c.id.clone(),
            pool: c.pool.clone(),
            zone: c.zone.clone(),
            resources: resources(&c.resources),
            allocatable: resources(&c.allocatable),
            price_per_hour: c.price_per_hour,
            launched_as: c.launched_as.as_ref().map(|(t, ct)| (t.clone(), ct.as_str().to_string())),
            state: ClaimStateV1::from(&c.state),
            reserved_at: c.reserved_at,
            changed_at: c.changed_at,
            tried_at: c.tried_at,
        }
    }
}

impl ClaimV1 {
    pub fn to_core(&self) -> Result<Claim, WireError> {
        Ok(Claim {
            id: self.id.clone(),
            pool: self.pool.clone(),
            zone: self.zone.clone(),
            resources: resource_list(&self.resources),
            allocatable: resource_list(&self.allocatable),
            price_per_hour: self.price_per_hour,
            launched_as: match &self.launched_as {
                Some((t, ct)) => Some((t.clone(), capacity_type(ct)?)),
                None => None,
            },
            state: self.state.to_core(),
            reserved_at: self.reserved_at,
            changed_at: self.changed_at,
            tried_at: self.tried_at,
        })
    }
}

impl From<&Denial> for DenialV1 {
    fn from(d: &Denial) -> Self {
        match d {
            Denial::UnknownPool => DenialV1::UnknownPool,
            Denial::PoolLimit { resource } => DenialV1::PoolLimit { resource: resource.as_str().to_string() },
            Denial::GlobalCap { resource } => DenialV1::GlobalCap { resource: resource.as_str().to_string() },
            Denial::SpendCap => DenialV1::SpendCap,
            Denial::DuplicateId => DenialV1::DuplicateId,
            Denial::Unneeded => DenialV1::Unneeded,
        }
    }
}

impl DenialV1 {
    pub fn to_core(&self) -> Denial {
        match self {
            DenialV1::UnknownPool => Denial::UnknownPool,
            DenialV1::PoolLimit { resource } => Denial::PoolLimit { resource: ResourceName::parse(resource) },
            DenialV1::GlobalCap { resource } => Denial::GlobalCap { resource: ResourceName::parse(resource) },
            DenialV1::SpendCap => Denial::SpendCap,
            DenialV1::DuplicateId => Denial::DuplicateId,
            DenialV1::Unneeded => Denial::Unneeded,
        }
    }
}

impl From<&Outcome> for OutcomeV1 {
    fn from(o: &Outcome) -> Self {
        match o {
            Outcome::Done => OutcomeV1::Done,
            Outcome::Reserved { granted, denied } => OutcomeV1::Reserved {
                granted: granted.clone(),
                denied: denied.iter().map(|(id, d)| (id.clone(), DenialV1::from(d))).collect(),
            },
            Outcome::Launching { started, refused } => {
                OutcomeV1::Launching { started: started.clone(), refused: refused.clone() }
            }
            Outcome::Advanced { rejected } => OutcomeV1::Advanced { rejected: rejected.clone() },
            Outcome::Rejected { reason } => OutcomeV1::Rejected { reason: reason.clone() },
            Outcome::Fenced { term } => OutcomeV1::Fenced { term: *term },
            Outcome::Disrupting { refused } => OutcomeV1::Disrupting { refused: refused.clone() },
            Outcome::Interrupted { recorded, duplicates } => {
                OutcomeV1::Interrupted { recorded: recorded.clone(), duplicates: duplicates.clone() }
            }
        }
    }
}

impl OutcomeV1 {
    pub fn to_core(&self) -> Outcome {
        match self {
            OutcomeV1::Done => Outcome::Done,
            OutcomeV1::Reserved { granted, denied } => Outcome::Reserved {
                granted: granted.clone(),
                denied: denied.iter().map(|(id, d)| (id.clone(), d.to_core())).collect(),
            },
            OutcomeV1::Launching { started, refused } => {
                Outcome::Launching { started: started.clone(), refused: refused.clone() }
            }
            OutcomeV1::Advanced { rejected } => Outcome::Advanced { rejected: rejected.clone() },
            OutcomeV1::Rejected { reason } => Outcome::Rejected { reason: reason.clone() },
            OutcomeV1::Fenced { term } => Outcome::Fenced { term: *term },
            OutcomeV1::Disrupting { refused } => Outcome::Disrupting { refused: refused.clone() },
            OutcomeV1::Interrupted { recorded, duplicates } => {
                Outcome::Interrupted { recorded: recorded.clone(), duplicates: duplicates.clone() }
            }
        }
    }
}

impl From<StateParts> for StateV1 {
    fn from(p: StateParts) -> Self {
        StateV1 {
            pools: p
                .pools
                .iter()
                .map(|(name, pool)| {
                    let v = PoolV1 {
                        limits: resources(&pool.limits),
                        usage: resources(&pool.usage),
                        price_per_hour: pool.price_per_hour,
                        budgets: pool.budgets.as_ref().map(|b| b.iter().map(BudgetV1::from).collect()),
                        rate: pool.rate.map(|r| RateV1 { nodes: r.nodes, per_ms: r.per }),
                        starts: pool.starts.clone(),
                    };
                    (name.clone(), v)
                })
                .collect(),
            caps_resources: resources(&p.caps.resources),
            caps_price_per_hour: p.caps.price_per_hour,
            total: resources(&p.total),
            total_price: p.total_price,
            claims: p.claims.values().map(ClaimV1::from).collect(),
            batches: p
                .batches
                .iter()
                .map(|(id, b)| {
                    (id.clone(), BatchRecordV1 { zone: b.zone.clone(), claims: b.claims.to_vec(), at: b.at })
                })
                .collect(),
            unavailable: p.unavailable.iter().map(|(o, until)| (OfferingV1::from(o), *until)).collect(),
            disruptions: p
                .disruptions
                .iter()
                .map(|(id, d)| {
                    let v = DisruptionV1 {
                        pool: d.pool.clone(),
                        reason: d.reason.as_str().to_string(),
                        candidates: d.candidates.clone(),
                        replacements: d.replacements.clone(),
                        at: d.at,
                    };
                    (id.clone(), v)
                })
                .collect(),
            interruptions: interruption::records(&p.interruptions),
            term: p.term,
            now: p.now,
            applied: p.applied,
        }
    }
}

impl StateV1 {
    pub fn to_core(&self) -> Result<State, WireError> {
        let pools = self
            .pools
            .iter()
            .map(|(name, p)| {
                let budgets = match &p.budgets {
                    Some(b) => Some(b.iter().map(BudgetV1::to_core).collect::<Result<Vec<_>, _>>()?),
                    None => None,
                };
                let pool = Pool {
                    limits: resource_list(&p.limits),
                    usage: resource_list(&p.usage),
                    price_per_hour: p.price_per_hour,
                    budgets,
                    rate: p.rate.map(|r| Rate { nodes: r.nodes, per: r.per_ms }),
                    starts: p.starts.clone(),
                };
                Ok((name.clone(), pool))
            })
            .collect::<Result<BTreeMap<String, Pool>, WireError>>()?;
        let disruptions = self
            .disruptions
            .iter()
            .map(|(id, d)| {
                let v = DisruptionCommand {
                    pool: d.pool.clone(),
                    reason: reason(&d.reason)?,
                    candidates: d.candidates.clone(),
                    replacements: d.replacements.clone(),
                    at: d.at,
                };
                Ok((id.clone(), v))
            })
            .collect::<Result<BTreeMap<String, DisruptionCommand>, WireError>>()?;
        let claims = self
            .claims
            .iter()
            .map(|c| Ok((c.id.clone(), c.to_core()?)))
            .collect::<Result<BTreeMap<String, Claim>, WireError>>()?;
        let batches = self
            .batches
            .iter()
            .map(|(id, b)| {
                (id.clone(), BatchRecord { zone: b.zone.clone(), claims: Arc::from(b.claims.as_slice()), at: b.at })
            })
            .collect();
        let unavailable = self
            .unavailable
            .iter()
            .map(|(o, until)| Ok((o.to_core()?, *until)))
            .collect::<Result<BTreeMap<Offering, Millis>, WireError>>()?;
        Ok(State::from_parts(StateParts {
            pools,
            caps: Caps { resources: resource_list(&self.caps_resources), price_per_hour: self.caps_price_per_hour },
            total: resource_list(&self.total),
            total_price: self.total_price,
            claims,
            batches,
            unavailable,
            disruptions,
            interruptions: interruption::to_records(&self.interruptions)?,
            term: self.term,
            now: self.now,
            applied: self.applied,
        }))
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use dovetail_core::ledger::ClaimState;

    const ENTRIES_V1: &str = include_str!("../tests/fixtures/ledger-v1-entries.json");
    const STATE_V1: &str = include_str!("../tests/fixtures/ledger-v1-state.json");
    const DISRUPTION_V1: &str = include_str!("../tests/fixtures/ledger-v1-disruption.json");

    fn offering(t: &str, zone: &str, ct: CapacityType) -> Offering {
        Offering { instance_type: t.into(), zone: zone.into(), capacity_type: ct }
    }

    pub(super) fn m5_large() -> ResourceList {
        ResourceList::from_pairs([
            (ResourceName::Cpu, 2000),
            (ResourceName::Memory, 8 << 30),
            (ResourceName::Pods, 29),
            (ResourceName::Other("example.com/dongle".into()), 0),
        ])
    }

    /// A log that uses every command, step, claim state, denial and outcome of version 1.
    pub(super) fn entries() -> Vec<Entry> {
        let e = |term, at, command| Entry { term, at, command };
        let launched = |batch: &str, instance: &str, ct| Step::Launched {
            batch: batch.into(),
            instance: instance.into(),
            resources: m5_large(),
            allocatable: ResourceList::cpu_mem(1930, 7 << 30),
            price_per_hour: 96_000,
            instance_type: "m5.large".into(),
            capacity_type: ct,
        };
        let request = |id: &str, zone: &str| ClaimRequest {
            id: id.into(),
            zone: zone.into(),
            resources: m5_large(),
            price_per_hour: 96_000,
        };
        vec![
            e(1, 1_000, Command::Lead),
            e(1, 1_001, Command::SetPool { pool: "default".into(), limits: ResourceList::cpu_mem(6000, 64 << 30) }),
            e(1, 1_002, Command::SetPool { pool: "gpu".into(), limits: ResourceList::new() }),
            e(
                1,
                1_003,
                Command::SetCaps(Caps {
                    resources: ResourceList::from_pairs([(ResourceName::Nodes, 100)]),
                    price_per_hour: Some(50_000_000),
                }),
            ),
            e(
                1,
                1_004,
                Command::Reserve {
                    pool: "default".into(),
                    claims: vec![request("a", "us-east-1a"), request("b", "us-east-1b")],
                },
            ),
            e(
                1,
                1_005,
                Command::Reserve {
                    pool: "default".into(),
                    claims: vec![request("a", "us-east-1a"), request("c", "us-east-1c"), request("d", "us-east-1c")],
                },
            ),
            e(1, 1_006, Command::Reserve { pool: "nope".into(), claims: vec![request("e", "us-east-1a")] }),
            e(
                1,
                1_007,
                Command::Launch {
                    zone: "us-east-1a".into(),
                    batches: vec![LaunchBatch {
                        id: "batch-1".into(),
                        claims: Arc::from(vec!["a".to_string(), "x".to_string()]),
                    }],
                },
            ),
            e(
                1,
                1_008,
                Command::Launch {
                    zone: "us-east-1b".into(),
                    batches: vec![LaunchBatch { id: "batch-2".into(), claims: Arc::from(vec!["b".to_string()]) }],
                },
            ),
            e(
                1,
                1_009,
                Command::Advance {
                    steps: vec![
                        ("a".into(), launched("batch-1", "i-0a", CapacityType::OnDemand)),
                        ("b".into(), Step::Unlaunched { batch: "batch-2".into() }),
                    ],
                },
            ),
            e(
                1,
                1_010,
                Command::Advance {
                    steps: vec![
                        ("a".into(), Step::Registered),
                        ("a".into(), Step::Initialized),
                        ("zz".into(), Step::Registered),
                    ],
                },
            ),
            e(
                1,
                1_011,
                Command::MarkUnavailable {
                    offerings: vec![
                        offering("m5.large", "us-east-1b", CapacityType::Spot),
                        offering("m5.xlarge", "us-east-1b", CapacityType::Reserved),
                    ],
                    until: 60_000,
                },
            ),
            e(
                2,
                1_012,
                Command::Adopt {
                    claims: vec![Claim {
                        id: "adopted".into(),
                        pool: "gpu".into(),
                        zone: "us-east-1c".into(),
                        resources: m5_large(),
                        allocatable: ResourceList::cpu_mem(1930, 7 << 30),
                        price_per_hour: 35_000,
                        launched_as: Some(("m5.large".into(), CapacityType::Spot)),
                        state: ClaimState::Registered { instance: "i-0c".into() },
                        reserved_at: 0,
                        changed_at: 0,
                        tried_at: None,
                    }],
                },
            ),
            e(1, 1_013, Command::SetPool { pool: "late".into(), limits: ResourceList::new() }),
            e(
                2,
                1_014,
                Command::Advance {
                    steps: vec![
                        ("b".into(), Step::Terminating),
                        ("b".into(), Step::Gone),
                        ("adopted".into(), Step::Terminating),
                    ],
                },
            ),
            e(2, 900, Command::Advance { steps: vec![("adopted".into(), Step::InstanceGone)] }),
            e(2, 1_016, Command::RemovePool { pool: "gpu".into() }),
            e(
                2,
                1_017,
                Command::Launch {
                    zone: "us-east-1c".into(),
                    batches: vec![LaunchBatch { id: "batch-3".into(), claims: Arc::from(vec!["c".to_string()]) }],
                },
            ),
            e(2, 1_018, Command::Advance { steps: vec![("c".into(), Step::Terminating)] }),
            e(
                2,
                1_019,
                Command::Reserve {
                    pool: "gpu".into(),
                    claims: ["r1", "r2", "r3", "r4"].iter().map(|id| request(id, "us-east-1a")).collect(),
                },
            ),
            e(
                2,
                1_020,
                Command::Launch {
                    zone: "us-east-1a".into(),
                    batches: vec![LaunchBatch {
                        id: "batch-4".into(),
                        claims: Arc::from(vec!["r2".to_string(), "r3".to_string(), "r4".to_string()]),
                    }],
                },
            ),
            e(
                2,
                1_021,
                Command::Advance {
                    steps: vec![
                        ("r3".into(), launched("batch-4", "i-0r3", CapacityType::Spot)),
                        ("r4".into(), launched("batch-4", "i-0r4", CapacityType::OnDemand)),
                        ("r4".into(), Step::Registered),
                    ],
                },
            ),
        ]
    }

    /// Writes the fixtures when `DOVETAIL_WRITE_LEDGER_FIXTURES` is set (once, when a version
    /// is introduced); otherwise reads them.
    #[allow(clippy::disallowed_methods, reason = "a test's switch to write its fixtures, read nowhere else")]
    pub(super) fn fixture(name: &str, text: &str, current: &str) -> String {
        if std::env::var_os("DOVETAIL_WRITE_LEDGER_FIXTURES").is_some() {
            #[allow(clippy::disallowed_methods, reason = "the checkout the test runs in, from cargo at run time")]
            let path = std::path::PathBuf::from(
                std::env::var("CARGO_MANIFEST_DIR").unwrap_or_else(|_| env!("CARGO_MANIFEST_DIR").to_string()),
            )
            .join("tests/fixtures")
            .join(name);
            std::fs::write(&path, current).expect("fixture written");
            return current.to_string();
        }
        text.to_string()
    }

    /// `state` as the versions that wrote the fixtures held it: those did not record a claim's
    /// first launch call (`tried_at`), and what they wrote decodes without one. (Fixtures
    /// written again with `DOVETAIL_WRITE_LEDGER_FIXTURES` would hold it: they are not.)
    pub(super) fn as_written_before_tried_at(state: &State) -> State {
        let WireState::V1(mut s) = WireState::encode(state.clone());
        for c in &mut s.claims {
            c.tried_at = None;
        }
        WireState::V1(s).decode().expect("a state")
    }

    #[test]
    fn entries_and_a_state_written_by_version_1_decode_to_what_they_were() {
        let entries = entries();
        let mut state = State::default();
        let outcomes: Vec<Outcome> = entries.iter().map(|e| state.apply(e)).collect();
        // The log exercises every outcome, and the state every claim state it can hold.
        let kinds: std::collections::BTreeSet<&str> = outcomes
            .iter()
            .map(|o| match o {
                Outcome::Done => "done",
                Outcome::Reserved { denied, .. } if !denied.is_empty() => "denied",
                Outcome::Reserved { .. } => "reserved",
                Outcome::Launching { refused, .. } if !refused.is_empty() => "refused",
                Outcome::Launching { .. } => "launching",
                Outcome::Advanced { rejected } if !rejected.is_empty() => "rejected-step",
                Outcome::Advanced { .. } => "advanced",
                Outcome::Rejected { .. } => "rejected",
                Outcome::Fenced { .. } => "fenced",
                Outcome::Disrupting { .. } => "disrupting",
                Outcome::Interrupted { .. } => "interrupted",
            })
            .collect();
        assert_eq!(kinds.len(), 9, "{kinds:?}");
        let states: std::collections::BTreeSet<&str> = state.claims().values().map(|c| c.state.name()).collect();
        assert_eq!(states.len(), 6, "{states:?}");
        assert!(state.unavailable(state.now()).count() == 2 && !state.batches().is_empty());

        let wire: Vec<(WireEntry, WireOutcome)> =
            entries.iter().zip(&outcomes).map(|(e, o)| (WireEntry::encode(e), WireOutcome::encode(o))).collect();
        let current = serde_json::to_string_pretty(&wire).expect("encoded");
        let old: Vec<(WireEntry, WireOutcome)> =
            serde_json::from_str(&fixture("ledger-v1-entries.json", ENTRIES_V1, &current))
                .expect("version 1 entries decode");
        let decoded: Vec<Entry> = old.iter().map(|(e, _)| e.decode().expect("a version 1 entry")).collect();
        assert_eq!(decoded, entries);
        let old_outcomes: Vec<Outcome> = old.iter().map(|(_, o)| o.decode()).collect();
        assert_eq!(old_outcomes, outcomes);

        let current = serde_json::to_string_pretty(&WireState::encode(state.clone())).expect("encoded");
        let old: WireState = serde_json::from_str(&fixture("ledger-v1-state.json", STATE_V1, &current))
            .expect("version 1 state decodes");
        assert_eq!(old.decode().expect("a version 1 state"), as_written_before_tried_at(&state));
        // What this version writes keeps each claim's first launch call.
        assert!(state.claims().values().any(|c| c.tried_at.is_some()));
        let again: WireState = serde_json::from_str(&current).expect("decodes");
        assert_eq!(again.decode().expect("a state"), state);
    }

    #[test]
    fn a_record_names_its_version_and_an_unknown_capacity_type_is_an_error_not_a_guess() {
        let e = WireEntry::encode(&Entry { term: 3, at: 7, command: Command::Lead });
        let json = serde_json::to_value(&e).expect("encoded");
        assert_eq!(json, serde_json::json!({"v1": {"term": 3, "at": 7, "command": "lead"}}));
        let bad = serde_json::json!({"v1": {"term": 3, "at": 7, "command": {"mark_unavailable": {
            "offerings": [{"instance_type": "m5.large", "zone": "z", "capacity_type": "borrowed"}], "until": 9}}}});
        let bad: WireEntry = serde_json::from_value(bad).expect("well-formed");
        assert!(matches!(bad.decode(), Err(WireError::CapacityType(t)) if t == "borrowed"));
        let unknown = serde_json::json!({"v9": {}});
        assert!(serde_json::from_value::<WireEntry>(unknown).is_err(), "a version this build does not know");
    }

    #[test]
    fn disruption_commands_budgets_and_leases_decode_to_what_they_were() {
        let mut entries = entries();
        let budgets = vec![
            Budget {
                nodes: BudgetNodes::Percent(50),
                schedule: None,
                duration: None,
                reasons: vec![DisruptionReason::Underutilized, DisruptionReason::Empty],
            },
            Budget {
                nodes: BudgetNodes::Count(0),
                schedule: Some("0 9 * * 1-5".into()),
                duration: Some(std::time::Duration::from_secs(8 * 3600)),
                reasons: vec![DisruptionReason::Drifted],
            },
        ];
        let disrupt = |command: &str, reason, replacements: Vec<ClaimRequest>| Command::Disrupt {
            pool: "default".into(),
            command: command.into(),
            reason,
            candidates: vec!["a".into()],
            replacements,
            not_ready: vec!["c".into()],
        };
        let replacement = ClaimRequest {
            id: "repl-1".into(),
            zone: "us-east-1a".into(),
            resources: m5_large(),
            price_per_hour: 50_000,
        };
        entries.extend([
            Entry {
                term: 2,
                at: 2_000,
                command: Command::SetBudgets {
                    pool: "default".into(),
                    budgets,
                    rate: Some(Rate { nodes: 5, per: 600_000 }),
                },
            },
            Entry { term: 2, at: 2_001, command: disrupt("cmd-1", DisruptionReason::Underutilized, vec![replacement]) },
            Entry { term: 2, at: 2_002, command: disrupt("cmd-2", DisruptionReason::Drifted, vec![]) },
            Entry { term: 2, at: 2_003, command: Command::EndDisruption { command: "cmd-1".into() } },
            Entry { term: 2, at: 2_004, command: disrupt("cmd-3", DisruptionReason::Empty, vec![]) },
        ]);
        let mut state = State::default();
        let outcomes: Vec<Outcome> = entries.iter().map(|e| state.apply(e)).collect();
        let n = outcomes.len();
        assert_eq!(outcomes[n - 4], Outcome::Disrupting { refused: None });
        assert!(matches!(&outcomes[n - 3], Outcome::Disrupting { refused: Some(r) } if r.contains("cmd-1")));
        assert_eq!(outcomes[n - 1], Outcome::Disrupting { refused: None });
        assert!(state.claim("repl-1").is_some() && state.disruptions().contains_key("cmd-3"));
        assert_eq!(state.pool("default").map(|p| p.starts.len()), Some(2));

        let wire: (Vec<(WireEntry, WireOutcome)>, WireState) = (
            entries.iter().zip(&outcomes).map(|(e, o)| (WireEntry::encode(e), WireOutcome::encode(o))).collect(),
            WireState::encode(state.clone()),
        );
        let current = serde_json::to_string_pretty(&wire).expect("encoded");
        let (old, old_state): (Vec<(WireEntry, WireOutcome)>, WireState) =
            serde_json::from_str(&fixture("ledger-v1-disruption.json", DISRUPTION_V1, &current))
                .expect("disruption entries decode");
        let decoded: Vec<Entry> = old.iter().map(|(e, _)| e.decode().expect("an entry")).collect();
        assert_eq!(decoded, entries);
        assert_eq!(old.iter().map(|(_, o)| o.decode()).collect::<Vec<_>>(), outcomes);
        assert_eq!(old_state.decode().expect("a state"), as_written_before_tried_at(&state));
        let bad = serde_json::json!({"v1": {"term": 3, "at": 7, "command": {"end_disruption": {"command": "x"}}}});
        assert!(serde_json::from_value::<WireEntry>(bad).is_ok());
        let bad = BudgetV1 { nodes: "ten".into(), schedule: None, duration_ms: None, reasons: vec![] };
        assert!(matches!(bad.to_core(), Err(WireError::BudgetNodes(n)) if n == "ten"));
        let bad = BudgetV1 { nodes: "1".into(), schedule: None, duration_ms: None, reasons: vec!["Bored".into()] };
        assert!(matches!(bad.to_core(), Err(WireError::Reason(r)) if r == "Bored"));
    }
}
