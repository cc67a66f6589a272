//! The consolidation simulation, built once a round and reused for every move: where a set
//! of candidates' pods would go with the candidates' nodes taken out.
//!
//! Karpenter builds a fresh scheduler for every candidate it simulates (about 900 ms each on
//! a large cluster). Here the cluster's solve state (the NodePools' templates, every node
//! with what is left on it, the topology counts) is built once, [`Prepared`] then
//! [`Simulation`], with the cluster's pending pods placed first: they keep the room they
//! would take, and a candidate they would go to is not consolidated (as a node the
//! provisioner nominated is not). Each move is then a trial on that state
//! (`scheduling::trial`): its candidates taken out (no pod goes there, their running pods
//! leave the topology counts, their pools' limits get their capacity back), their pods
//! placed by Karpenter's per-pod loop, the outcome read, and every change undone. A move
//! costs what its own pods cost to place, not what the cluster costs to build.
//!
//! A trial decides as a state built from scratch for it would (`Simulation::fresh` builds
//! one; the property tests compare them), and a node taken out is as a node the snapshot
//! never had.

use std::collections::HashMap;
use std::sync::Arc;

use crate::cluster::Snapshot;
use crate::node::Node;
use crate::pod::Pod;
use crate::scheduling::scheduler::Scheduler;
use crate::scheduling::trial::TrialResults;
use crate::scheduling::{self, PoolInput, SolveOptions};

use super::candidates::Candidate;

/// What a move takes out: a candidate's claim, its node, and the pods that must move.
#[derive(Clone, Copy, Debug)]
pub struct Mover<'a> {
    pub claim: &'a str,
    pub node: &'a str,
    pub pods: &'a [&'a Arc<Pod>],
}

impl<'a> From<&'a Candidate<'a>> for Mover<'a> {
    fn from(c: &'a Candidate<'a>) -> Self {
        Mover { claim: &c.claim.id, node: &c.node.name, pods: &c.pods }
    }
}

/// The inputs of a round's simulation: the cluster as the solver sees it, and the pods it
/// places (the pending pods first, then each candidate's pods, unbound).
pub struct Prepared {
    input: scheduling::Snapshot,
    pods: Vec<Pod>,
    /// How many of `pods` are the cluster's pending pods.
    pending: usize,
    /// Per candidate (by claim id): its node's index in `input.nodes` and its pods' range in
    /// `pods`.
    candidates: HashMap<String, (Option<usize>, std::ops::Range<usize>)>,
    opts: SolveOptions,
}

/// What a move's simulation found.
#[derive(Debug)]
pub struct Outcome {
    pub results: TrialResults,
    /// The name of each node in `results.existing`, in order.
    pub existing_nodes: Vec<String>,
    /// The pods the move places, by the indices `results` uses.
    pub pods: Vec<Pod>,
    /// Indices into `pods` by the solve's pod index.
    index: HashMap<usize, usize>,
}

impl Outcome {
    /// The pod a solve index names.
    pub fn pod(&self, i: usize) -> Option<&Pod> {
        self.index.get(&i).and_then(|&k| self.pods.get(k))
    }
}

impl Prepared {
    /// The round's inputs: every node of the cluster (candidates included), the NodePools
    /// with their instance types, the pending pods, and the candidates' pods.
    pub fn new(snap: &Snapshot, pools: &[PoolInput], candidates: &[Mover<'_>], opts: &SolveOptions) -> Self {
        let nodes = snap.capacity_nodes();
        let input = snap.scheduling_input(nodes, pools.to_vec());
        let mut pods: Vec<Pod> = snap.provisionable().map(|p| p.as_ref().clone()).collect();
        let pending = pods.len();
        let at: HashMap<&str, usize> = input.nodes.iter().enumerate().map(|(i, n)| (n.name.as_str(), i)).collect();
        let mut ranges = HashMap::new();
        for c in candidates {
            let start = pods.len();
            pods.extend(c.pods.iter().map(|p| unbound(p)));
            ranges.insert(c.claim.to_string(), (at.get(c.node).copied(), start..pods.len()));
        }
        Prepared { input, pods, pending, candidates: ranges, opts: opts.clone() }
    }

    /// The simulation: the solve state built, the pending pods placed.
    pub fn simulation(&self) -> Simulation<'_> {
        let mut state = Scheduler::new(&self.input, &self.pods, &self.opts);
        let pending: Vec<usize> = (0..self.pending).collect();
        let _unplaced = state.place(&pending);
        // The nodes the pending pods went to: not consolidated while they are on their way.
        let mut taken = HashMap::new();
        for e in &state.existing {
            if let Some(&p) = e.pods.first() {
                taken.insert(e.index, p);
            }
        }
        Simulation { prepared: self, state, taken, kept: Default::default(), receiving: Default::default() }
    }
}

/// A pod as it would be once evicted: unbound.
fn unbound(p: &Pod) -> Pod {
    Pod { node_name: None, nominated_node: None, ..p.clone() }
}

/// A round's simulation state, on which moves are tried one after another.
pub struct Simulation<'p> {
    prepared: &'p Prepared,
    state: Scheduler<'p>,
    /// Nodes pending pods were placed on, with one such pod.
    taken: HashMap<usize, usize>,
    /// Candidates whose moves were kept ([`Simulation::keep`]).
    kept: std::collections::HashSet<String>,
    /// Nodes that kept moves placed pods on: not candidates of a later move (its trial moves
    /// a node's own pods only).
    receiving: std::collections::HashSet<usize>,
}

impl Simulation<'_> {
    /// Where the pods of `candidates` (claim ids) would go with their nodes taken out. `Err`:
    /// a candidate the pending pods would go to (that pod's key), or one the round did not
    /// prepare.
    pub fn try_move(&mut self, candidates: &[&str]) -> Result<Outcome, String> {
        let (nodes, pods) = self.resolve(candidates)?;
        let cp = self.state.checkpoint();
        for &n in &nodes {
            self.state.take_out(n);
        }
        let errors = self.state.place(&pods);
        let mut results = self.state.trial_results(&cp, &pods, &errors);
        self.state.rollback(cp);
        let p = self.prepared;
        uninitialized(&p.input.nodes, &mut results);
        Ok(outcome(results, &p.input.nodes, &p.pods, &pods))
    }

    /// Makes a move for good: the candidates stay out and their pods where they went, and a
    /// new node the move needs takes no other move's pods. The moves tried after it are tried
    /// with it done.
    pub fn keep(&mut self, candidates: &[&str]) -> Result<(), String> {
        let (nodes, pods) = self.resolve(candidates)?;
        for &n in &nodes {
            self.state.take_out(n);
        }
        let mark = self.state.order.len();
        let _unplaced = self.state.place(&pods);
        for p in &self.state.order[mark..] {
            if let scheduling::Target::Existing(n) = p.target {
                self.receiving.insert(n);
            }
        }
        self.state.seal(&pods);
        self.kept.extend(candidates.iter().map(|c| c.to_string()));
        Ok(())
    }

    /// The candidates' nodes (indices into the solve's nodes) and pods (indices into its
    /// pods); `Err` for a candidate pending pods would go to, one not prepared, or one a kept
    /// move took already.
    fn resolve(&self, candidates: &[&str]) -> Result<(Vec<usize>, Vec<usize>), String> {
        let p = self.prepared;
        let mut nodes = Vec::with_capacity(candidates.len());
        let mut pods: Vec<usize> = Vec::new();
        for c in candidates {
            if self.kept.contains(*c) {
                return Err(format!("candidate {c} goes with a command of this round already"));
            }
            let Some((node, range)) = p.candidates.get(*c) else {
                return Err(format!("candidate {c} was not prepared"));
            };
            if let Some(n) = node {
                if let Some(&pod) = self.taken.get(n) {
                    return Err(format!("pending pod {} would go to it", p.pods[pod].key));
                }
                if self.receiving.contains(n) {
                    return Err("pods of a command of this round go to it".into());
                }
                nodes.push(*n);
            }
            pods.extend(range.clone());
        }
        Ok((nodes, pods))
    }
}

/// A moved pod placed on a node not yet initialized is an error (Karpenter's
/// `UninitializedNodeError`): a plan that needs capacity still booting is no plan.
fn uninitialized(nodes: &[Node], results: &mut TrialResults) {
    for e in &results.existing {
        let Some(node) = nodes.get(e.node).filter(|n| !n.initialized) else { continue };
        for &i in &e.pods {
            results.errors.push((i, format!("it would go to node {}, which is not initialized yet", node.name)));
        }
    }
    results.errors.sort_by_key(|(i, _)| *i);
}

fn outcome(results: TrialResults, nodes: &[Node], all: &[Pod], pods: &[usize]) -> Outcome {
    let index = pods.iter().enumerate().map(|(k, &i)| (i, k)).collect();
    let existing_nodes =
        results.existing.iter().map(|e| nodes.get(e.node).map(|n| n.name.clone()).unwrap_or_default()).collect();
    Outcome { results, existing_nodes, pods: pods.iter().filter_map(|&i| all.get(i).cloned()).collect(), index }
}

/// The same move simulated on a state built from scratch for it (no trial before it, no
/// journal): what a trial must decide the same as.
#[cfg(test)]
pub fn fresh(prepared: &Prepared, candidates: &[&str]) -> Result<Outcome, String> {
    prepared.simulation().try_move(candidates)
}

/// The move simulated on a cluster that never had the candidates' nodes or pods: their
/// pods are the only pods placed (for clusters with no pending pods).
#[cfg(test)]
pub fn absent(snap: &Snapshot, pools: &[PoolInput], candidates: &[Mover<'_>], opts: &SolveOptions) -> Outcome {
    let removed: std::collections::BTreeSet<&str> = candidates.iter().map(|c| c.node).collect();
    let nodes: Vec<Node> = snap.capacity_nodes().into_iter().filter(|n| !removed.contains(n.name.as_str())).collect();
    let mut input = snap.scheduling_input(nodes, pools.to_vec());
    input.bound_pods.retain(|p| p.node_name.as_deref().is_none_or(|n| !removed.contains(n)));
    let pods: Vec<Pod> = candidates.iter().flat_map(|c| c.pods.iter()).map(|p| unbound(p)).collect();
    let mut state = Scheduler::new(&input, &pods, opts);
    let all: Vec<usize> = (0..pods.len()).collect();
    let cp = state.checkpoint();
    let errors = state.place(&all);
    let mut results = state.trial_results(&cp, &all, &errors);
    uninitialized(&input.nodes, &mut results);
    outcome(results, &input.nodes, &pods, &all)
}

#[cfg(test)]
mod tests;
