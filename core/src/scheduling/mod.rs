//! The provisioning simulation: which NodeClaims to create for pending pods.
//!
//! [`solve`] takes a [`Snapshot`] of the cluster (NodePools with their instance types,
//! existing nodes, running pods, DaemonSets, namespaces) and the pending pods to place, and
//! returns [`Results`]: new NodeClaims with their pods, candidate instance types (cheapest
//! first) and the launch they would get, pods placed on existing nodes, and a reason for
//! every pod that could not be placed. It can run on any subset of pods and NodePools
//! against any snapshot, which is how the per-NodePool actors call it.
//!
//! A solve is a pipeline; each stage is one module and takes the previous one's output:
//!
//! 1. [`classes`]: identical pods collapse into equivalence classes;
//! 2. [`template`]: each NodePool becomes a template (its instance types, DaemonSet
//!    overhead groups), ordered by weight ([`scheduler`] holds the solve's state: templates,
//!    existing nodes, limits, topology);
//! 3. [`filter`]: the instance types a NodeClaim can still launch as (used by every
//!    placement, through [`nodes`] and [`topology`]);
//! 4. packing: [`pack`] (the dovetail packer) or [`parity`] (Karpenter's per-pod loop,
//!    also the dovetail packer's fallback);
//! 5. [`improve`]: local moves that lower the plan's cost;
//! 6. [`right_size`]: each claim's final candidate types and requests;
//! 7. [`launch`]: the offering each claim would launch as.
//!
//! [`bound`] (the cost lower bound), [`optimum`] (the cheapest plan for small inputs, by
//! exact search) and [`validate`] (the independent plan checker) stand apart.
//! `docs/scheduling.md` describes the algorithm; where Karpenter is non-deterministic (Go map
//! order, unstable sorts) dovetail breaks ties by name.

mod bound;
mod classes;
mod exact;
mod filter;
// Crate-visible: disruption's consolidation runs the same moves on running nodes.
pub(crate) mod improve;
mod input;
mod launch;
mod nodes;
mod optimum;
mod output;
mod pack;
mod parity;
mod price;
mod right_size;
pub(crate) mod room;
pub(crate) mod scheduler;
mod template;
mod topology;
pub(crate) mod trial;
mod validate;
mod view;

use std::collections::{BTreeMap, HashMap};

use crate::pod::Pod;

pub use bound::{LowerBound, lower_bound};
pub use filter::unmet_min_values;
pub use input::{MinValuesPolicy, Packer, PoolInput, PreferencePolicy, Snapshot, SolveOptions};
pub use optimum::{OPTIMUM_MAX_PODS, optimum};
pub use output::{ExistingPlacement, Launch, NewClaim, Placement, Results, Target};
pub use topology::{TopologyError, TopologyType};
pub use validate::{Semantics, validate};

/// The equivalence class of each pod: pods whose scheduling inputs are identical (their names
/// and creation order aside) share an id; ids count from 0 in order of first appearance.
pub fn pod_classes(pods: &[Pod]) -> Vec<usize> {
    let all: Vec<usize> = (0..pods.len()).collect();
    let ids = classes::ids(pods, &all);
    all.iter().map(|i| ids.get(i).copied().unwrap_or(*i)).collect()
}

/// Inputs of at most this many pods also get the parity packer's plan when the dovetail
/// packer runs, and the better of the two is kept: the parity packer is cheap to run there,
/// and the dovetail packer is then never worse than Karpenter.
pub const PARITY_CHECK_PODS: usize = 100;

/// Places `pods` against `snapshot` with the packer `opts` names.
///
/// With the dovetail packer on an input of at most [`PARITY_CHECK_PODS`] pods, Karpenter's
/// plan for the same input is computed too and returned instead when it places more pods,
/// or as many for less, and holds under the strict semantics the dovetail packer keeps
/// (each pod counted in the zone it launches in). When Karpenter's own plan does not hold
/// there, its greedy is run once more with claims pinned to a zone as they take the pods
/// zone-keyed rules count, and that plan is the one compared.
pub fn solve(snapshot: &Snapshot, pods: &[Pod], opts: &SolveOptions) -> Results {
    let results = run(snapshot, pods, opts, false);
    if opts.packer != Packer::Dovetail || pods.len() > PARITY_CHECK_PODS || !opts.parity_fallback {
        return results;
    }
    let parity_opts = SolveOptions { packer: Packer::Karpenter, ..opts.clone() };
    let mut parity = run(snapshot, pods, &parity_opts, false);
    if !validate(snapshot, pods, &parity, Semantics::Strict).is_empty() {
        parity = run(snapshot, pods, &parity_opts, true);
        if !validate(snapshot, pods, &parity, Semantics::Strict).is_empty() {
            return results;
        }
    }
    let better = parity.scheduled() > results.scheduled()
        || (parity.scheduled() == results.scheduled() && parity.cost_per_hour() < results.cost_per_hour() - 1e-9);
    if better { parity } else { results }
}

/// One run of the pipeline. `pinned` makes the parity packer pin a claim to one zone when
/// it takes a pod that zone-keyed topology counts (the dovetail packer always does).
fn run(snapshot: &Snapshot, pods: &[Pod], opts: &SolveOptions, pinned: bool) -> Results {
    let mut state = scheduler::Scheduler::new(snapshot, pods, opts);
    let mut errors: HashMap<usize, String> = match opts.packer {
        Packer::Karpenter => {
            state.pin_counted = pinned;
            state.solve()
        }
        Packer::Dovetail => {
            let errors = state.solve_dovetail();
            improve::improve(&mut state);
            errors
        }
    };
    errors.extend(std::mem::take(&mut state.leftover_errors));
    let mut finalized = right_size::finalize_all(&state, opts, &mut errors);
    launch::choose_all(&state.templates, &mut finalized, opts);
    results(state, finalized, errors)
}

/// Gathers the outcome: claims in planning order, pods on existing nodes, errors by pod,
/// and the placement order with claim ids turned into indices into `claims`.
fn results(
    mut state: scheduler::Scheduler<'_>,
    finalized: Vec<right_size::Finalized>,
    errors: HashMap<usize, String>,
) -> Results {
    let claim_of: BTreeMap<usize, usize> = finalized.iter().enumerate().map(|(i, f)| (f.id, i)).collect();
    let claims: Vec<NewClaim> = finalized.into_iter().map(|f| f.claim).collect();
    let existing = state
        .existing
        .iter()
        .filter(|n| !n.pods.is_empty())
        .map(|n| ExistingPlacement { node: n.index, pods: n.pods.clone() })
        .collect();
    let mut errors: Vec<(usize, String)> = errors.into_iter().collect();
    errors.sort_by_key(|(i, _)| *i);
    let order = state
        .order
        .iter()
        .filter_map(|p| match p.target {
            Target::Existing(_) => Some(p.clone()),
            Target::Planned(id) => claim_of.get(&id).map(|&c| Placement { target: Target::Planned(c), ..p.clone() }),
        })
        .collect();
    Results { claims, existing, errors, warnings: std::mem::take(&mut state.warnings), order }
}

#[cfg(test)]
mod tests;
