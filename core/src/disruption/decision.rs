//! The planner's vocabulary: the methods, each node's verdict and decision, the command it
//! proposes, and its answer (with the conditions a decision puts on its NodeClaim).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use crate::cluster::Condition;
use crate::ledger::Millis;
use crate::nodepool::DisruptionReason;
use crate::scheduling::NewClaim;

use super::candidates::Blocker;

/// The disruption methods.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Method {
    Expiration,
    Emptiness,
    Drift,
    MultiNodeConsolidation,
    SingleNodeConsolidation,
    /// dovetail's: m nodes onto n new ones, 1 < n < m, when no Karpenter method finds a move.
    Repack,
}

impl Method {
    /// The budget reason of a method (`None`: forceful, not budgeted).
    pub fn reason(&self) -> Option<DisruptionReason> {
        match self {
            Method::Expiration => None,
            Method::Emptiness => Some(DisruptionReason::Empty),
            Method::Drift => Some(DisruptionReason::Drifted),
            Method::MultiNodeConsolidation | Method::SingleNodeConsolidation | Method::Repack => {
                Some(DisruptionReason::Underutilized)
            }
        }
    }

    pub fn as_str(&self) -> &'static str {
        match self {
            Method::Expiration => "expiration",
            Method::Emptiness => "emptiness",
            Method::Drift => "drift",
            Method::MultiNodeConsolidation => "multi-node-consolidation",
            Method::SingleNodeConsolidation => "single-node-consolidation",
            Method::Repack => "repack",
        }
    }
}

/// What the planner says of one node.
#[derive(Clone, Debug, PartialEq)]
pub enum Verdict {
    /// It is not a candidate at all.
    Blocked(Blocker),
    /// Expired: terminated now, whatever the budgets say.
    Expired { expire_after: Millis },
    /// Chosen by a method for the proposed command.
    Disrupt { method: Method, detail: String },
    /// It would be disrupted, but the budgets leave no room now.
    BudgetExhausted { method: Method },
    /// Its pods changed `changed_ago` ms ago, within its `consolidateAfter` (`after` ms).
    Settling { changed_ago: Millis, after: Millis },
    /// Consolidation found nothing `since_ago` ms ago and the cluster is as it was then;
    /// `why` is what it said of the node then.
    Quiet { why: String, since_ago: Millis },
    /// It is a candidate and stays: why.
    Keep(String),
}

impl Verdict {
    /// The verdict without a running clock (what the NodeClaim's `Consolidatable` condition
    /// says: written again only when this changes).
    pub fn steady(&self) -> String {
        match self {
            Verdict::Settling { after, .. } => {
                format!("its pods changed within its consolidateAfter ({}s)", after / 1000)
            }
            // What the round that simulated said: the message does not change until a round
            // simulates again.
            Verdict::Quiet { why, .. } => format!("kept: {why}"),
            Verdict::Blocked(Blocker::Planned { .. }) => "not disruptable: pending pods were planned onto it".into(),
            Verdict::Disrupt { method, detail } => {
                let detail = detail.split(" (validating").next().unwrap_or(detail);
                format!("disrupting ({}): {detail}", method.as_str())
            }
            v => v.to_string(),
        }
    }

    /// The `Consolidatable` condition's reason when it is false.
    fn kind(&self) -> &'static str {
        match self {
            Verdict::Blocked(_) => "NotDisruptable",
            Verdict::Expired { .. } => "Expired",
            Verdict::Disrupt { .. } => "Disrupting",
            Verdict::BudgetExhausted { .. } => "BudgetExhausted",
            Verdict::Settling { .. } => "Settling",
            Verdict::Quiet { .. } | Verdict::Keep(_) => "Kept",
        }
    }
}

/// One node's decision and its reason.
#[derive(Clone, Debug, PartialEq)]
pub struct Decision {
    pub claim: String,
    pub node: Option<String>,
    pub verdict: Verdict,
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Verdict::Blocked(b) => write!(f, "not disruptable: {b}"),
            Verdict::Expired { expire_after } => {
                write!(f, "expired: older than its expireAfter ({}s); terminated without a budget", expire_after / 1000)
            }
            Verdict::Disrupt { method, detail } => write!(f, "disrupting ({}): {detail}", method.as_str()),
            Verdict::BudgetExhausted { method } => {
                write!(f, "would be disrupted ({}) but the nodepool's budgets allow no more now", method.as_str())
            }
            Verdict::Settling { changed_ago, after } => {
                write!(f, "kept: its pods changed {}s ago; consolidateAfter is {}s", changed_ago / 1000, after / 1000)
            }
            Verdict::Quiet { why, since_ago } => write!(
                f,
                "kept: {why} (no consolidation was found {}s ago and nothing changed since)",
                since_ago / 1000
            ),
            Verdict::Keep(why) => write!(f, "kept: {why}"),
        }
    }
}

/// A command for the ledger.
#[derive(Clone, Debug)]
pub struct Proposal {
    pub method: Method,
    pub reason: DisruptionReason,
    pub candidates: Vec<String>,
    /// New nodes to launch first: the solver's claims, with the index of their pool in
    /// [`Input::pools`].
    pub replacements: Vec<NewClaim>,
    /// Why, in words.
    pub detail: String,
}

impl PartialEq for Proposal {
    /// Two proposals are the same command when they name the same method and candidates and
    /// their replacements the same pools and instance types.
    fn eq(&self, other: &Self) -> bool {
        self.method == other.method
            && self.candidates == other.candidates
            && self.replacements.len() == other.replacements.len()
            && self
                .replacements
                .iter()
                .zip(&other.replacements)
                .all(|(a, b)| a.pool == b.pool && a.instance_types == b.instance_types)
    }
}

/// The planner's answer.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Plan {
    /// Expired claims: terminate now.
    pub expired: Vec<String>,
    /// Commands to propose, each on its own (their candidates do not overlap, and each was
    /// simulated with the ones before it done).
    pub proposals: Vec<Proposal>,
    /// Every claim's decision, by claim.
    pub decisions: BTreeMap<String, Decision>,
    /// Candidates whose pods have been still for their `consolidateAfter` (Karpenter's
    /// `Consolidatable`).
    pub consolidatable: BTreeSet<String>,
    /// Drifted candidates: the `Drifted` condition's reason, and the drift in words.
    pub drifted: BTreeMap<String, (String, String)>,
}

impl Plan {
    /// The round's first command, if any.
    pub fn first(&self) -> Option<&Proposal> {
        self.proposals.first()
    }

    /// What a claim's NodeClaim says of its decision, as Karpenter's conditions:
    /// `Consolidatable` (true once its pods have been still for `consolidateAfter`; the
    /// decision, without a running clock, as its message) and `Drifted` (true with the drift's
    /// reason). `None` for a claim the plan has no decision for. The messages change only when
    /// the decision does, so a caller writes them only when they differ from what is there.
    pub fn conditions(&self, claim: &str) -> Option<[Condition; 2]> {
        let d = self.decisions.get(claim)?;
        let settled = self.consolidatable.contains(claim);
        let consolidatable = Condition {
            kind: "Consolidatable".into(),
            status: settled,
            reason: if settled { "Consolidatable".into() } else { d.verdict.kind().into() },
            message: d.verdict.steady(),
        };
        let drifted = match self.drifted.get(claim) {
            Some((reason, said)) => {
                Condition { kind: "Drifted".into(), status: true, reason: reason.clone(), message: said.clone() }
            }
            None => Condition {
                kind: "Drifted".into(),
                status: false,
                reason: "NotDrifted".into(),
                message: "it matches its nodepool and node class".into(),
            },
        };
        Some([consolidatable, drifted])
    }
}
