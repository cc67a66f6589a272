//! The ledger's vocabulary: what is proposed ([`Command`] in an [`Entry`]), what applying it
//! gives ([`Outcome`]), and the records the state keeps (pools, caps, claims, launch batches,
//! offerings).

use std::fmt;
use std::sync::Arc;

use crate::catalog::CapacityType;
use crate::disruption::budget::Rate;
use crate::nodepool::{Budget, DisruptionReason};
use crate::resources::{ResourceList, ResourceName};

/// Milliseconds since the Unix epoch on the proposer's clock.
pub type Millis = u64;

/// A leadership term: raised by each election, never lowered.
pub type Term = u64;

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
    /// `spec.disruption.budgets`; `None` until set, which counts as Karpenter's default (one
    /// budget of 10%).
    pub budgets: Option<Vec<Budget>>,
    /// The rate budget (`dovetail.dev/disruption-rate`).
    pub rate: Option<Rate>,
    /// When each node that started disrupting (under a budgeted reason) did, within the
    /// rate's window: one entry per node.
    pub starts: Vec<Millis>,
}

/// A disruption command the ledger granted. Its candidates are leased to it (counted as
/// disrupting, refused to any other command) until they are gone or the command ends; its
/// replacements were reserved with it, in the same entry.
#[derive(Clone, Debug, PartialEq)]
pub struct DisruptionCommand {
    pub pool: String,
    pub reason: DisruptionReason,
    pub candidates: Vec<String>,
    pub replacements: Vec<String>,
    pub at: Millis,
}

/// What a pool's budgets leave for a reason now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Allowance {
    /// The pool's nodes (initialized claims, and terminating ones whose instance lives).
    pub nodes: u32,
    /// Of those, the ones disrupting already: leased to a command, terminating, or not ready.
    pub disrupting: u32,
    /// What the budgets allow disrupting at once ([`crate::disruption::budget::UNBOUNDED`]
    /// when none covers the reason).
    pub allowed: u32,
    /// What the rate budget leaves now, if there is one.
    pub rate_left: Option<u32>,
}

impl Allowance {
    /// How many more nodes may start disrupting now.
    pub fn available(&self) -> u32 {
        self.allowed.saturating_sub(self.disrupting).min(self.rate_left.unwrap_or(u32::MAX))
    }
}

impl fmt::Display for Allowance {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.allowed >= crate::disruption::budget::UNBOUNDED {
            write!(f, "no budget limits it ({} of {} nodes disrupting)", self.disrupting, self.nodes)?;
        } else {
            write!(f, "budgets allow {} of {} nodes, {} disrupting", self.allowed, self.nodes, self.disrupting)?;
        }
        if let Some(left) = self.rate_left {
            write!(f, "; the rate budget leaves {left}")?;
        }
        Ok(())
    }
}

/// Where a claim is in its life.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ClaimState {
    /// Granted against the limits; not being launched (new, or its last launch found no
    /// capacity).
    Reserved,
    /// Handed to its zone for launch in a launch batch (one CreateFleet's claims): a new
    /// leader finds what the batch made by its tag before launching anything for it.
    Launching { batch: String },
    /// The cloud made the instance.
    Launched { instance: String },
    /// Its Node registered.
    Registered { instance: String },
    /// Its Node is initialized (ready, startup taints gone, extended resources registered).
    Initialized { instance: String },
    /// Being drained and deleted; still holds its resources until gone. A claim deleted while
    /// it was launching keeps its batch (its instance may still appear) until the instance is
    /// known gone.
    Terminating { instance: Option<String>, batch: Option<String>, instance_gone: bool },
}

impl ClaimState {
    /// The instance, once launched.
    pub fn instance(&self) -> Option<&str> {
        match self {
            ClaimState::Launched { instance }
            | ClaimState::Registered { instance }
            | ClaimState::Initialized { instance } => Some(instance),
            ClaimState::Terminating { instance, .. } => instance.as_deref(),
            ClaimState::Reserved | ClaimState::Launching { .. } => None,
        }
    }

    /// The launch batch of a claim that is (or was, when deleted) being launched.
    pub fn batch(&self) -> Option<&str> {
        match self {
            ClaimState::Launching { batch } => Some(batch),
            ClaimState::Terminating { batch, .. } => batch.as_deref(),
            _ => None,
        }
    }

    pub fn is_terminating(&self) -> bool {
        matches!(self, ClaimState::Terminating { .. })
    }

    /// Its name, for messages.
    pub fn name(&self) -> &'static str {
        match self {
            ClaimState::Reserved => "Reserved",
            ClaimState::Launching { .. } => "Launching",
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
    /// The zone it launches (or launched) in; an ICE relaunch moves it.
    pub zone: String,
    /// What it counts against limits and caps (`nodes: 1` included): the reservation until
    /// launched, then the instance's capacity.
    pub resources: ResourceList,
    /// The instance's allocatable, once launched.
    pub allocatable: ResourceList,
    pub price_per_hour: MicroDollars,
    /// The instance type and capacity type it launched as, once launched (taken over from
    /// the NodeClaim's labels when adopted).
    pub launched_as: Option<(String, CapacityType)>,
    pub state: ClaimState,
    pub reserved_at: Millis,
    pub changed_at: Millis,
    /// When a launch call was first recorded for it (its first move from `Reserved` to
    /// `Launching`); `None` while it waits for its first call (the plane paces its calls by
    /// EC2's launch bucket). The launch timeout counts from here.
    pub tried_at: Option<Millis>,
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

/// The claims of one launch call, as the ledger records them before the call is made.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LaunchBatch {
    /// Its id: the cloud tags the batch's instances with it and derives the call's
    /// idempotency token from it.
    pub id: String,
    /// Shared: every request of the call carries its batch, so a copy costs a count, not the
    /// list (a batch holds up to a launch window's claims).
    pub claims: Arc<[String]>,
}

/// A batch the ledger knows, while any of its claims is launching.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BatchRecord {
    pub zone: String,
    /// Every claim it was recorded with, in order (what a re-drive assigns instances to).
    pub claims: Arc<[String]>,
    pub at: Millis,
}

/// A lifecycle step of a claim.
#[derive(Clone, Debug, PartialEq)]
pub enum Step {
    /// The instance, with what it really holds and costs (at most what was reserved). On a
    /// claim deleted while launching, the instance is recorded so that it is terminated.
    Launched {
        /// The launch batch whose call made it: an outcome of another batch than the one
        /// the claim launches in (a late answer) is rejected.
        batch: String,
        instance: String,
        resources: ResourceList,
        allocatable: ResourceList,
        price_per_hour: MicroDollars,
        /// What it launched as: its NodeClaim is labelled with the type's labels.
        instance_type: String,
        capacity_type: CapacityType,
    },
    /// The launch of `batch` found no capacity anywhere it tried: back to `Reserved`, for the
    /// pool to pick another offering.
    Unlaunched {
        batch: String,
    },
    Registered,
    Initialized,
    Terminating,
    /// The instance is terminated (or there never was one).
    InstanceGone,
    /// Gone: its resources are released and it leaves the registry. Only a claim that never
    /// launched (`Reserved`) or whose instance is known gone may go: nothing is leaked.
    Gone,
}

/// What the ledger is asked to do.
#[derive(Clone, Debug, PartialEq)]
pub enum Command {
    /// The first entry of a term: raises the ledger's term to the entry's, so that anything
    /// proposed under an older term is refused.
    Lead,
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
    /// the global caps, in order. An id that is live already is refused
    /// ([`Denial::DuplicateId`]); the proposer mints another.
    Reserve {
        pool: String,
        claims: Vec<ClaimRequest>,
    },
    /// Records launch batches of a zone before the cloud is called: each claim that is
    /// `Reserved` (or `Launching` in the same batch: a re-drive) moves to `Launching` in its
    /// batch and to the zone. Only the claims the outcome lists as started may be launched.
    Launch {
        zone: String,
        batches: Vec<LaunchBatch>,
    },
    /// Lifecycle steps, one entry per round of them.
    Advance {
        steps: Vec<(String, Step)>,
    },
    /// Takes over claims the cluster shows and the ledger does not know (NodeClaims made
    /// before a restart of a ledger that kept no log): each is recorded as given and holds its
    /// resources, whatever the limits say (the capacity exists). An id the ledger knows, or
    /// of an unknown pool, is skipped.
    Adopt {
        claims: Vec<Claim>,
    },
    /// Marks offerings unavailable until `until` (insufficient capacity).
    MarkUnavailable {
        offerings: Vec<Offering>,
        until: Millis,
    },
    /// Sets a pool's disruption budgets and rate budget.
    SetBudgets {
        pool: String,
        budgets: Vec<Budget>,
        rate: Option<Rate>,
    },
    /// A disruption command: leases its candidates and reserves its replacements, all or
    /// nothing. Granted only if every candidate is an initialized claim of the pool that no
    /// other command holds, the pool's budgets for `reason` and its rate budget leave room for
    /// every candidate (claims the proposer saw not ready, `not_ready`, count as disrupting),
    /// and the replacements fit the limits and caps once the candidates' holdings are taken
    /// off (they stay held until the candidates are gone).
    Disrupt {
        pool: String,
        /// The command's id (unique while it lives).
        command: String,
        reason: DisruptionReason,
        candidates: Vec<String>,
        replacements: Vec<ClaimRequest>,
        not_ready: Vec<String>,
    },
    /// Ends a command that will not complete (its replacement failed, or it timed out): its
    /// candidates are released. Its replacements stay claims of their own.
    EndDisruption {
        command: String,
    },
    /// One batch of interruption notices (a queue batch's, never one entry per message). Each
    /// instance is recorded once: a notice for an instance recorded already is a duplicate
    /// and changes nothing (at-least-once delivery is harmless), unless it acts where the
    /// recorded one did not (a spot warning after a rebalance recommendation) or brings the
    /// deadline forward. A spot warning's offering is marked unavailable.
    Interrupt {
        notices: Vec<Notice>,
    },
    /// The capacity for interrupted instances' pods, sized for `instances` together: each
    /// replacement is reserved in its pool against the limits and caps with the pool's
    /// interrupted claims' holdings taken off (they go within minutes whatever is decided;
    /// budgets do not apply: the disruption is EC2's). Only instances recorded as acting,
    /// with a live claim and not sized before, are sized by this entry; a replacement that
    /// serves none of them is [`Denial::Unneeded`] (another proposer sized them first).
    ReplaceInterrupted {
        instances: Vec<String>,
        replacements: Vec<Replacement>,
    },
    /// Garbage collection: instances tagged for the cluster that no claim is known to hold,
    /// to be terminated. The outcome is [`Outcome::Advanced`]: an instance a claim holds, one
    /// whose claim tag names a claim still recorded (its lifecycle's to end), or of a batch
    /// still recorded (a launch that has not said yet which instance is whose) is rejected and
    /// must not be touched; the others may be terminated in this term.
    Collect {
        instances: Vec<Collectable>,
    },
}

/// An instance garbage collection proposes, with what its tags name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Collectable {
    pub id: String,
    /// The claim its tag names (a launch whose claim went before it said so).
    pub claim: Option<String>,
    /// The launch batch its tag names.
    pub batch: Option<String>,
}

impl Command {
    /// Its name, for metrics and spans (`reserve`, `launch`, `advance`, ...).
    pub fn name(&self) -> &'static str {
        match self {
            Command::Lead => "lead",
            Command::SetPool { .. } => "set_pool",
            Command::RemovePool { .. } => "remove_pool",
            Command::SetCaps(_) => "set_caps",
            Command::Reserve { .. } => "reserve",
            Command::Launch { .. } => "launch",
            Command::Advance { .. } => "advance",
            Command::Adopt { .. } => "adopt",
            Command::MarkUnavailable { .. } => "mark_unavailable",
            Command::SetBudgets { .. } => "set_budgets",
            Command::Disrupt { .. } => "disrupt",
            Command::EndDisruption { .. } => "end_disruption",
            Command::Interrupt { .. } => "interrupt",
            Command::ReplaceInterrupted { .. } => "replace_interrupted",
            Command::Collect { .. } => "collect",
        }
    }
}

/// A replacement for interrupted instances' pods.
#[derive(Clone, Debug, PartialEq)]
pub struct Replacement {
    pub pool: String,
    pub claim: ClaimRequest,
    /// The instances whose pods it takes.
    pub serves: Vec<String>,
}

/// An instance EC2 is taking back (or warns about), as the proposer resolved it.
#[derive(Clone, Debug, PartialEq)]
pub struct Notice {
    pub instance: String,
    pub kind: crate::interruption::Kind,
    /// The claim whose instance it is; `None` for an instance that is not the cluster's
    /// (recorded all the same, so that its redeliveries are known).
    pub claim: Option<String>,
    /// When EC2 takes the instance: the drain ends by then.
    pub deadline: Millis,
    /// Whether the claim is to be replaced and drained (false: recorded only, as a
    /// rebalance recommendation is by default).
    pub acts: bool,
    /// An offering to mark unavailable, until when (a spot interruption's).
    pub unavailable: Option<(Offering, Millis)>,
}

/// An interruption the ledger recorded, by instance.
#[derive(Clone, Debug, PartialEq)]
pub struct Interruption {
    pub kind: crate::interruption::Kind,
    pub claim: Option<String>,
    pub acts: bool,
    /// When it was recorded (the entry's time).
    pub at: Millis,
    pub deadline: Millis,
    /// Whether its replacements were sized ([`Command::ReplaceInterrupted`]; none may have
    /// been needed).
    pub sized: bool,
    /// The replacement claims granted for its pods.
    pub replacements: Vec<String>,
}

/// A command with the proposer's term and timestamp.
#[derive(Clone, Debug, PartialEq)]
pub struct Entry {
    /// The term the proposer read the state under and decided in.
    pub term: Term,
    pub at: Millis,
    pub command: Command,
}

/// Why a claim of a round was not granted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Denial {
    UnknownPool,
    PoolLimit {
        resource: ResourceName,
    },
    GlobalCap {
        resource: ResourceName,
    },
    SpendCap,
    /// A live claim has this id already.
    DuplicateId,
    /// An interruption replacement none of whose instances is left to size.
    Unneeded,
}

impl fmt::Display for Denial {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Denial::UnknownPool => f.write_str("unknown nodepool"),
            Denial::PoolLimit { resource } => write!(f, "nodepool limit on {resource} reached"),
            Denial::GlobalCap { resource } => write!(f, "global cap on {resource} reached"),
            Denial::SpendCap => f.write_str("global $/hour cap reached"),
            Denial::DuplicateId => f.write_str("a live claim has this id"),
            Denial::Unneeded => f.write_str("the instances it serves were sized already"),
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
    /// Of a [`Command::Launch`]: the claims that may be launched, and why the others may not.
    Launching {
        started: Vec<String>,
        refused: Vec<(String, String)>,
    },
    /// Of a [`Command::Advance`]: the steps that did not apply, with why.
    Advanced {
        rejected: Vec<(String, String)>,
    },
    /// Of a [`Command::Disrupt`]: `None` when granted, else why not (nothing changed).
    Disrupting {
        refused: Option<String>,
    },
    /// Of a [`Command::Interrupt`]: the instances recorded (or whose record changed), and
    /// the duplicates (nothing changed).
    Interrupted {
        recorded: Vec<String>,
        duplicates: Vec<String>,
    },
    /// Nothing changed; the command was not valid in this state.
    Rejected {
        reason: String,
    },
    /// Nothing changed: the entry's term is older than the ledger's (its proposer was
    /// deposed).
    Fenced {
        term: Term,
    },
}

impl Outcome {
    pub fn is_fenced(&self) -> bool {
        matches!(self, Outcome::Fenced { .. })
    }
}
