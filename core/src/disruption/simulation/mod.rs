//! The consolidation simulation, built once a round and reused for every move: where a set
//! of candidates' pods would go with the candidates' nodes taken out.
//!
//! Karpenter builds a fresh scheduler for every candidate it simulates (about 900 ms each on
//! a large cluster). Here the cluster's solve state (the NodePools' templates, every node
//! with what is left on it, the topology counts) is built once, [`Prepared`] then
//! [`Simulation`], with the pods already on their way placed first: the cluster's pending
//! pods, and the pods of nodes being disrupted (those nodes taken out, as Karpenter's
//! simulation leaves deleting nodes out and schedules their pods). Those pods keep the room
//! they would take, and a candidate they would go to is not consolidated (as a node the
//! provisioner nominated is not); the new nodes they would need take no moved pod. Each move
//! is then a trial on that state (`scheduling::trial`): its candidates taken out (no pod goes
//! there, their running pods leave the topology counts, their pools' limits get their
//! capacity back), their pods placed by Karpenter's per-pod loop, the outcome read, and every
//! change undone. A move costs what its own pods cost to place, not what the cluster costs to
//! build.
//!
//! The property tests hold a trial to what a state built from scratch decides: after other
//! trials, as on a state built for it; after moves kept for good ([`Simulation::keep`]), as
//! on a cluster where those moves were made; and a node taken out as a node the cluster
//! never had ([`Prepared::without`]).

use std::sync::Arc;

use crate::catalog::CapacityType;
use crate::cluster::Snapshot;
use crate::labels;
use crate::node::Node;
use crate::pod::{Pod, PodKey};
use crate::resources::ResourceName;
use crate::scheduling::room::{Ask, Rooms};
use crate::scheduling::scheduler::Scheduler;
use crate::scheduling::trial::TrialResults;
use crate::scheduling::{self, PoolInput, SolveOptions};
use crate::shared::{FastMap, FastSet};

use super::candidates::Candidate;

/// What a move takes out: a candidate's claim, its node, and the pods that must move.
#[derive(Clone, Copy, Debug)]
pub struct Mover<'a> {
    /// The candidate's claim id: how moves name it.
    pub claim: &'a str,
    /// Its node's name.
    pub node: &'a str,
    /// The pods that must move when it goes (its reschedulable pods).
    pub pods: &'a [&'a Arc<Pod>],
}

impl<'a> From<&'a Candidate<'a>> for Mover<'a> {
    fn from(c: &'a Candidate<'a>) -> Self {
        Mover { claim: &c.claim.id, node: &c.node.name, pods: &c.pods }
    }
}

/// The inputs of a round's simulation: the cluster as the solver sees it, and the pods it
/// places (the pods on their way first, then each candidate's pods, unbound).
pub struct Prepared {
    input: scheduling::Snapshot,
    pods: Vec<Pod>,
    /// How many of `pods` are on their way (pending, or on a node being disrupted).
    pending: usize,
    /// Nodes being disrupted (indices into `input.nodes`): out of the cluster from the start.
    disrupting: Vec<usize>,
    /// Per candidate (by claim id): its node's index in `input.nodes` and its pods' range in
    /// `pods`.
    candidates: FastMap<String, (Option<usize>, std::ops::Range<usize>)>,
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
    index: FastMap<usize, usize>,
    /// The move needed more new nodes than it was allowed, and was not placed to the end
    /// (its new claims were not finalized: `results.claims` is empty).
    pub capped: bool,
    /// A pod the move could not leave on an existing node (its solve index): the first that
    /// went to a new node, else the first the solve left unplaced.
    pub stuck: Option<usize>,
}

impl Outcome {
    /// The pod a solve index names.
    pub fn pod(&self, i: usize) -> Option<&Pod> {
        self.index.get(&i).and_then(|&k| self.pods.get(k))
    }
}

impl Prepared {
    /// The round's inputs: every node of the cluster (candidates included), the NodePools
    /// with their instance types, the pods on their way, and the candidates' pods.
    pub fn new(snap: &Snapshot, pools: &[PoolInput], candidates: &[Mover<'_>], opts: &SolveOptions) -> Self {
        let nodes = snap.capacity_nodes();
        let input = snap.scheduling_input(nodes, pools.to_vec());
        let mut pods: Vec<Pod> = snap.provisionable().map(|p| p.as_ref().clone()).collect();
        let going: FastSet<&str> = snap.nodes.values().filter(|n| n.is_disrupting()).map(|n| n.name.as_str()).collect();
        pods.extend(snap.pods_to_move().into_iter().map(|p| unbound(p)));
        let pending = pods.len();
        let at: FastMap<&str, usize> = input.nodes.iter().enumerate().map(|(i, n)| (n.name.as_str(), i)).collect();
        let disrupting: Vec<usize> = going.iter().filter_map(|n| at.get(n).copied()).collect();
        let mut ranges = FastMap::default();
        for c in candidates {
            let start = pods.len();
            pods.extend(c.pods.iter().map(|p| unbound(p)));
            ranges.insert(c.claim.to_string(), (at.get(c.node).copied(), start..pods.len()));
        }
        Prepared { input, pods, pending, disrupting, candidates: ranges, opts: opts.clone() }
    }

    /// The simulation: the solve state built, the pods on their way placed.
    pub fn simulation(&self) -> Simulation<'_> {
        let mut state = Scheduler::new(&self.input, &self.pods, &self.opts);
        for &n in &self.disrupting {
            // Their holdings stay counted against their pools' limits until they are gone,
            // as the ledger counts them.
            state.take_out(n, false);
        }
        let pending: Vec<usize> = (0..self.pending).collect();
        let _unplaced = state.place(&pending);
        // The new nodes they need are theirs: a moved pod does not ride on one.
        state.seal(&pending);
        // The nodes they went to: not consolidated while they are on their way.
        let mut taken = FastMap::default();
        for e in &state.existing {
            if let Some(&p) = e.pods.first() {
                taken.insert(e.index, p);
            }
        }
        let floor = new_node_floor(&state);
        let new_rooms = state.new_node_rooms();
        Simulation {
            prepared: self,
            state,
            taken,
            kept: FastSet::default(),
            receiving: FastSet::default(),
            floor,
            rooms: None,
            new_rooms,
        }
    }

    /// The move simulated from scratch on the cluster without the candidates' nodes (and
    /// the pods on them): the pods on their way placed first, then the candidates' pods.
    /// What a trial of a candidate the pods on their way would go to cannot tell (drift goes
    /// on there; consolidation does not); and what a trial of any move must match when
    /// nothing is on its way.
    pub fn without(&self, candidates: &[&str]) -> Result<Outcome, String> {
        let mut removed: FastSet<&str> = FastSet::default();
        let mut moved: Vec<usize> = Vec::new();
        for c in dedup(candidates) {
            let Some((node, range)) = self.candidates.get(c) else {
                return Err(format!("candidate {c} was not prepared"));
            };
            if let Some(n) = node.and_then(|n| self.input.nodes.get(n)) {
                removed.insert(n.name.as_str());
            }
            moved.extend(range.clone());
        }
        let mut input = self.input.clone();
        input.nodes.retain(|n| !removed.contains(n.name.as_str()));
        input.bound_pods.retain(|p| p.node_name.as_deref().is_none_or(|n| !removed.contains(n)));
        let pods: Vec<Pod> =
            self.pods[..self.pending].iter().chain(moved.iter().filter_map(|&i| self.pods.get(i))).cloned().collect();
        let mut state = Scheduler::new(&input, &pods, &self.opts);
        let at: FastMap<&str, usize> = input.nodes.iter().enumerate().map(|(i, n)| (n.name.as_str(), i)).collect();
        for n in &self.disrupting {
            if let Some(&i) = self.input.nodes.get(*n).and_then(|n| at.get(n.name.as_str())) {
                state.take_out(i, false);
            }
        }
        let pending: Vec<usize> = (0..self.pending).collect();
        let _unplaced = state.place(&pending);
        state.seal(&pending);
        let ours: Vec<usize> = (self.pending..pods.len()).collect();
        let cp = state.checkpoint();
        let errors = state.place(&ours);
        let mut results = state.trial_results(&cp, &ours, &errors);
        uninitialized(&input.nodes, &mut results);
        Ok(outcome(results, &input.nodes, &pods, &ours))
    }
}

/// [`Simulation::new_node_floor`] over the state's templates.
fn new_node_floor(state: &Scheduler<'_>) -> (f64, bool) {
    let spot = CapacityType::Spot.as_str();
    let mut cheapest = f64::INFINITY;
    let mut spot_only = true;
    for t in &state.templates {
        let capacity = t.requirements.get(labels::CAPACITY_TYPE);
        let zone = t.requirements.get(labels::ZONE);
        spot_only &=
            capacity.has(spot) && CapacityType::ALL.iter().all(|c| c.as_str() == spot || !capacity.has(c.as_str()));
        for it in t.types.iter().filter_map(|&i| t.instance_types.get(i)) {
            for o in &it.offerings {
                if o.available && zone.has(&o.zone) && capacity.has(o.capacity_type.as_str()) {
                    cheapest = cheapest.min(o.price);
                }
            }
        }
    }
    (cheapest, spot_only)
}

/// A pod as it would be once evicted: unbound.
fn unbound(p: &Pod) -> Pod {
    Pod { node_name: None, nominated_node: None, ..p.clone() }
}

/// The claim ids, each once, in order.
fn dedup<'a>(candidates: &[&'a str]) -> Vec<&'a str> {
    let mut seen = FastSet::default();
    candidates.iter().copied().filter(|c| seen.insert(*c)).collect()
}

/// A round's simulation state, on which moves are tried one after another.
pub struct Simulation<'p> {
    prepared: &'p Prepared,
    state: Scheduler<'p>,
    /// Nodes the pods on their way were placed on, with one such pod.
    taken: FastMap<usize, usize>,
    /// Candidates whose moves were kept ([`Simulation::keep`]).
    kept: FastSet<String>,
    /// Nodes that kept moves placed pods on: not candidates of a later move (its trial moves
    /// a node's own pods only).
    receiving: FastSet<usize>,
    /// [`Simulation::new_node_floor`], read once: the pools do not change within a round.
    floor: (f64, bool),
    /// The existing nodes' room, counted on the first [`Simulation::room_rules_out`] and
    /// again after a kept move (a trial leaves the state as it found it).
    rooms: Option<Rooms>,
    /// `Scheduler::new_node_rooms`, worked out once: the pools do not change within a round.
    new_rooms: Vec<(f64, [i64; 3])>,
}

/// Where a kept move's pods went: each pod's key, and the existing node it went to (`None`:
/// a new node).
pub type Placed = Vec<(crate::pod::PodKey, Option<String>)>;

impl Simulation<'_> {
    /// Why a candidate cannot be moved this round, if it cannot: pods on their way go to
    /// it, a kept move put pods on it, or it went with a kept move.
    pub fn blocked(&self, candidate: &str) -> Option<String> {
        let p = self.prepared;
        if self.kept.contains(candidate) {
            return Some(format!("candidate {candidate} goes with a command of this round already"));
        }
        let (node, _) = p.candidates.get(candidate)?;
        let n = (*node)?;
        if let Some(&pod) = self.taken.get(&n) {
            return Some(format!("pending pod {} would go to it", p.pods[pod].key));
        }
        self.receiving.contains(&n).then(|| "pods of a command of this round go to it".to_string())
    }

    /// Where the pods of `candidates` (claim ids) would go with their nodes taken out. `Err`:
    /// a candidate that is [`Simulation::blocked`], or one the round did not prepare.
    pub fn try_move(&mut self, candidates: &[&str]) -> Result<Outcome, String> {
        self.try_move_within(candidates, None)
    }

    /// [`Simulation::try_move`] for a move that may launch at most `max_new` new nodes: the
    /// trial stops as soon as its pods need more (`Outcome::capped`), instead of placing the
    /// rest for nothing.
    pub fn try_move_within(&mut self, candidates: &[&str], max_new: Option<usize>) -> Result<Outcome, String> {
        let (nodes, pods) = self.resolve(candidates)?;
        let cp = self.state.checkpoint();
        for &n in &nodes {
            self.state.take_out(n, true);
        }
        let (errors, capped) = self.state.place_within(&pods, max_new);
        let stuck = self.state.order[cp.order_len()..]
            .iter()
            .find(|p| matches!(p.target, scheduling::Target::Planned(_)))
            .map(|p| p.pod)
            .or_else(|| errors.keys().min().copied());
        let mut results = if capped {
            self.state.trial_placements(&cp, &pods, &errors)
        } else {
            self.state.trial_results(&cp, &pods, &errors)
        };
        self.state.rollback(cp);
        let p = self.prepared;
        uninitialized(&p.input.nodes, &mut results);
        let mut o = outcome(results, &p.input.nodes, &p.pods, &pods);
        o.capped = capped;
        o.stuck = stuck;
        Ok(o)
    }

    /// Whether the candidate's pod `key` fits on some other existing node with the
    /// candidate's node taken out, the other pods of its move not placed yet. `Some(false)`
    /// means no move of the candidate leaves that pod on an existing node, however the rest
    /// goes; `None`: not known (the candidate is blocked or not prepared, the pod not one of
    /// its pods, or one whose fit other pods can change: topology, preferences, node
    /// requirements; see `Scheduler::fits_existing_without`).
    pub fn fits_elsewhere(&mut self, candidate: &str, key: &PodKey) -> Option<bool> {
        let (nodes, pods) = self.resolve(&[candidate]).ok()?;
        let idx = pods.into_iter().find(|&i| self.prepared.pods.get(i).is_some_and(|p| &p.key == key))?;
        self.state.fits_existing_without(&nodes, idx)
    }

    /// Why the pods of `candidates` cannot all go onto the other existing nodes (with one new
    /// node costing less than `new_below` $/hour, when given), if the room counted rules it
    /// out (`scheduling::room::Rooms`): then no trial of the move places them so, whatever its
    /// order. The new
    /// node's room is the most any type any pool may launch for less has (by its cheapest
    /// available offering), so a replacement the trial would price under `new_below` is
    /// counted. `None`: not ruled out (or a candidate is blocked or not prepared).
    pub fn room_rules_out(&mut self, candidates: &[&str], new_below: Option<f64>) -> Option<String> {
        let (nodes, pods) = self.resolve(candidates).ok()?;
        let asks: Vec<Ask> = pods
            .iter()
            .filter_map(|&i| self.prepared.pods.get(i))
            .map(|p| (p.requests.get(&ResourceName::Cpu), p.requests.get(&ResourceName::Memory)))
            .collect();
        let new = match new_below {
            None => None,
            Some(below) => {
                let cheaper = self.new_rooms.partition_point(|(price, _)| *price < below);
                // Nothing launches for less: no new node may take any pod.
                Some(cheaper.checked_sub(1).and_then(|i| self.new_rooms.get(i)).map_or([0; 3], |(_, room)| *room))
            }
        };
        let state = &self.state;
        self.rooms.get_or_insert_with(|| state.rooms()).rule_out(&asks, &nodes, new)
    }

    /// What any one new node this round may launch costs at least ($/hour: the cheapest
    /// available offering, in a zone and capacity type its pool allows, of any pool's types;
    /// infinite when there is none), and whether every pool launches spot only. A new
    /// claim's requirements are within its pool's, so neither can be beaten.
    pub fn new_node_floor(&self) -> (f64, bool) {
        self.floor
    }

    /// Makes a move for good: the candidates stay out and their pods where they went, a new
    /// node the move needs takes no other move's pods, and the candidates' holdings stay
    /// counted against their pools' limits (the ledger frees them only once they are gone).
    /// The moves tried after it are tried with it done. Returns where its pods went; `Err`
    /// when it does not hold (a pod left unplaced: the caller tried it first).
    pub fn keep(&mut self, candidates: &[&str]) -> Result<Placed, String> {
        let (nodes, pods) = self.resolve(candidates)?;
        // The room counted so far is not the room after this.
        self.rooms = None;
        for &n in &nodes {
            self.state.take_out(n, false);
        }
        let mark = self.state.order.len();
        let unplaced = self.state.place(&pods);
        if let Some((i, why)) = unplaced.iter().next() {
            let pod = self.prepared.pods.get(*i).map(|p| p.key.to_string()).unwrap_or_default();
            return Err(format!("kept move of {candidates:?} left pod {pod} unplaced: {why}"));
        }
        let mut placed = Placed::new();
        for p in &self.state.order[mark..] {
            let key = self.prepared.pods[p.pod].key.clone();
            match p.target {
                scheduling::Target::Existing(n) => {
                    self.receiving.insert(n);
                    placed.push((key, self.prepared.input.nodes.get(n).map(|n| n.name.clone())));
                }
                scheduling::Target::Planned(_) => placed.push((key, None)),
            }
        }
        self.state.seal(&pods);
        self.kept.extend(candidates.iter().map(|c| c.to_string()));
        Ok(placed)
    }

    /// The candidates' nodes (indices into the solve's nodes) and pods (indices into its
    /// pods), each candidate once; `Err` for a candidate that is blocked or not prepared.
    fn resolve(&self, candidates: &[&str]) -> Result<(Vec<usize>, Vec<usize>), String> {
        let p = self.prepared;
        let mut nodes = Vec::with_capacity(candidates.len());
        let mut pods: Vec<usize> = Vec::new();
        for c in dedup(candidates) {
            if let Some(why) = self.blocked(c) {
                return Err(why);
            }
            let Some((node, range)) = p.candidates.get(c) else {
                return Err(format!("candidate {c} was not prepared"));
            };
            nodes.extend(*node);
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
    let pods = pods.iter().filter_map(|&i| all.get(i).cloned()).collect();
    Outcome { results, existing_nodes, pods, index, capped: false, stuck: None }
}

/// The same move simulated on a state built from scratch for it (no trial before it, no
/// journal): what a trial must decide the same as.
#[cfg(test)]
pub fn fresh(prepared: &Prepared, candidates: &[&str]) -> Result<Outcome, String> {
    prepared.simulation().try_move(candidates)
}

#[cfg(test)]
mod tests;
