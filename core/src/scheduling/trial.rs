//! Trials on a built solve state: take nodes out, place some pods with Karpenter's per-pod
//! loop, read what happened, and undo it all. Disruption's simulation builds the cluster's
//! state once a round (templates, existing nodes, topology, the pending pods placed) and
//! tries every move on it this way, instead of building the state again per move.
//!
//! A trial changes the state only through the parity loop's placements and
//! [`Scheduler::take_out`]; [`Checkpoint`] keeps what those change (the planned claims, the
//! pools' remaining limits and the placement order wholesale, since they are small; the
//! existing nodes a placement touched, and the topology's journal), so that
//! [`Scheduler::rollback`] leaves the state exactly as [`Scheduler::checkpoint`] found it.
//! The dovetail packer and `improve` are not for trials: they change the state in ways this
//! does not journal.

use std::collections::HashMap;

use crate::resources::{ResourceList, ResourceName};

use super::nodes::PlannedNode;
use super::output::{ExistingPlacement, NewClaim, Target};
use super::scheduler::Scheduler;
use super::{SolveOptions, launch, right_size};

/// The state to roll back to: where the journals stood, and the small parts of the state
/// kept whole.
pub struct Checkpoint {
    /// The topology's journal length.
    topology: usize,
    /// The existing nodes' journal length.
    existing: usize,
    planned: Vec<PlannedNode>,
    remaining: Vec<Option<ResourceList>>,
    /// Lengths of the placement order and the warnings.
    order: usize,
    warnings: usize,
    next_hostname: usize,
    pin_cursor: usize,
}

/// What a trial's pods did.
#[derive(Clone, Debug, Default)]
pub struct TrialResults {
    /// New claims holding any of the trial's pods (those pods only), finalized and with
    /// their launch.
    pub claims: Vec<NewClaim>,
    /// The trial's pods placed on existing nodes (node index into the snapshot's nodes).
    pub existing: Vec<ExistingPlacement>,
    /// The trial's pods that could not be placed, with the reason, by pod index.
    pub errors: Vec<(usize, String)>,
}

impl Checkpoint {
    /// How long the placement order was at the checkpoint: what a trial placed since is the
    /// order from there.
    pub fn order_len(&self) -> usize {
        self.order
    }
}

impl<'a> Scheduler<'a> {
    /// Starts journaling (if it was not) and returns the state to roll back to.
    pub fn checkpoint(&mut self) -> Checkpoint {
        let existing = self.trail.get_or_insert_with(Vec::new).len();
        Checkpoint {
            topology: self.topology.mark(),
            existing,
            planned: self.planned.clone(),
            remaining: self.remaining.clone(),
            order: self.order.len(),
            warnings: self.warnings.len(),
            next_hostname: self.next_hostname,
            pin_cursor: self.pin_cursor,
        }
    }

    /// Leaves the state as `checkpoint` found it.
    pub fn rollback(&mut self, cp: Checkpoint) {
        self.topology.rollback(cp.topology);
        if let Some(trail) = &mut self.trail {
            while trail.len() > cp.existing {
                let Some(s) = trail.pop() else { break };
                let n = &mut self.existing[s.node];
                n.remaining = s.remaining;
                n.requirements = s.requirements;
                n.host_ports.truncate(s.host_ports);
                n.pods.truncate(s.pods);
                n.out = s.out;
                self.room.update(s.node, n);
            }
        }
        self.planned = cp.planned;
        self.remaining = cp.remaining;
        self.order.truncate(cp.order);
        self.warnings.truncate(cp.warnings);
        self.next_hostname = cp.next_hostname;
        self.pin_cursor = cp.pin_cursor;
    }

    /// Takes the snapshot's node `index` out of the cluster: no pod goes there and its running
    /// pods leave the topology's counts, as if the snapshot had never had it; with
    /// `give_back`, its pool's limits get its capacity back too (without, its holdings stay
    /// counted: a node that goes only later).
    pub fn take_out(&mut self, index: usize, give_back: bool) {
        let Some(n) = self.existing.iter().position(|e| e.index == index) else { return };
        if self.existing[n].out {
            return;
        }
        self.save_existing(n);
        self.existing[n].out = true;
        self.room.update(n, &self.existing[n]);
        let node = self.existing[n].node;
        self.topology.take_out(node);
        let Some(pool) = node.nodepool().filter(|_| give_back) else { return };
        for (t, template) in self.templates.iter().enumerate() {
            if template.pool.name != pool {
                continue;
            }
            if let Some(r) = &mut self.remaining[t] {
                let mut cap = node.capacity.clone();
                cap.set(ResourceName::Nodes, 1);
                for (name, v) in cap.iter() {
                    if r.contains(name) {
                        r.add_amount(name.clone(), v);
                    }
                }
            }
        }
    }

    /// Places `pods` (indices into the solve's pods) with Karpenter's per-pod loop, in its
    /// queue order; returns the reason of each pod left unplaced.
    pub fn place(&mut self, pods: &[usize]) -> HashMap<usize, String> {
        self.place_within(pods, None).0
    }

    /// [`Scheduler::place`], stopping once more than `cap` new claims are planned (when
    /// planned claims start empty, as in a trial): the pods not tried then are unplaced with
    /// that reason, and the second value says whether it stopped so.
    pub fn place_within(&mut self, pods: &[usize], cap: Option<usize>) -> (HashMap<usize, String>, bool) {
        let (mut errors, queue) = self.validate_subset(pods);
        self.claim_cap = cap;
        errors.extend(self.run_queue(queue));
        self.claim_cap = None;
        let capped = cap.is_some_and(|cap| self.planned.len() > cap);
        if capped {
            let placed: std::collections::HashSet<usize> = self.order.iter().map(|p| p.pod).collect();
            for &p in pods {
                if !placed.contains(&p) {
                    errors
                        .entry(p)
                        .or_insert_with(|| format!("it would need more than {} new nodes", cap.unwrap_or(0)));
                }
            }
        }
        (errors, capped)
    }

    /// Seals the planned claims holding any of `pods` (a move kept for good): they take no
    /// more pods, and keep what they hold of their pools' limits.
    pub fn seal(&mut self, pods: &[usize]) {
        let ours: std::collections::HashSet<usize> = pods.iter().copied().collect();
        self.planned.retain(|c| !c.pods.iter().any(|p| ours.contains(p)));
    }

    /// Whether pod `idx` fits on some existing node with the snapshot's nodes `out` taken out.
    /// The state is left as it was. `Some(false)` holds however the state fills up from here,
    /// so it is given only for a pod whose fit on a node can only get worse as other pods land
    /// there: [`super::parity::plain`] (no topology of its own, nothing to relax) and with no
    /// node requirements (selector, affinity, volume topology); `None` otherwise. A pod that
    /// requires a label a node lacks is refused there until another pod placed on it narrows
    /// the node's requirements to define that label, so for such a pod no answer holds.
    pub fn fits_existing_without(&mut self, out: &[usize], idx: usize) -> Option<bool> {
        let pod = self.pods.get(idx)?;
        if !super::parity::plain(pod, self.tolerate_prefer_no_schedule) || !pod.volume_requirements.is_empty() {
            return None;
        }
        let view = super::view::PodView::new(pod);
        let data = super::view::PodData::new(pod, &view, self.opts.preference_policy);
        if !data.requirements.is_empty() {
            return None;
        }
        let cp = self.checkpoint();
        for &n in out {
            self.take_out(n, true);
        }
        let fits = self.first_existing(0, idx, &view, &data).is_some();
        self.rollback(cp);
        Some(fits)
    }

    /// The existing nodes' room as it stands, for counting what they could take
    /// ([`super::room::Rooms`]).
    pub fn rooms(&self) -> super::room::Rooms {
        super::room::Rooms::new(&self.existing)
    }

    /// Per price any pool's types launch for, ascending, the most room one new node at that
    /// price or less may have ([`super::room::new_node_rooms`]).
    pub fn new_node_rooms(&self) -> Vec<(f64, [i64; 3])> {
        super::room::new_node_rooms(&self.templates)
    }

    /// What `pods` did since `cp` on existing nodes, and their errors: a trial's results
    /// without its new claims (a trial that stopped at its cap needs no more).
    pub fn trial_placements(&self, cp: &Checkpoint, pods: &[usize], errors: &HashMap<usize, String>) -> TrialResults {
        let ours: std::collections::HashSet<usize> = pods.iter().copied().collect();
        TrialResults {
            claims: Vec::new(),
            existing: self.existing_since(cp, &ours),
            errors: sorted_errors(errors, &ours),
        }
    }

    /// The existing nodes `ours` went to since `cp`, with their pods.
    fn existing_since(&self, cp: &Checkpoint, ours: &std::collections::HashSet<usize>) -> Vec<ExistingPlacement> {
        let mut existing: Vec<ExistingPlacement> = Vec::new();
        for p in &self.order[cp.order..] {
            if let Target::Existing(node) = p.target
                && ours.contains(&p.pod)
            {
                match existing.iter_mut().find(|e| e.node == node) {
                    Some(e) => e.pods.push(p.pod),
                    None => existing.push(ExistingPlacement { node, pods: vec![p.pod] }),
                }
            }
        }
        existing
    }

    /// What `pods` did since `cp`: the new claims holding any of them (finalized, launched,
    /// with only those pods), their placements on existing nodes, and their errors.
    pub fn trial_results(&self, cp: &Checkpoint, pods: &[usize], errors: &HashMap<usize, String>) -> TrialResults {
        let ours: std::collections::HashSet<usize> = pods.iter().copied().collect();
        let mut errs: HashMap<usize, String> =
            errors.iter().filter(|(i, _)| ours.contains(i)).map(|(i, e)| (*i, e.clone())).collect();
        let existing = self.existing_since(cp, &ours);
        let opts: &SolveOptions = self.opts;
        // Only the claims holding the trial's pods are finalized (the pods on their way hold
        // sealed claims of their own, not in `planned`).
        let mut finalized: Vec<right_size::Finalized> = right_size::finalize_all(self, opts, &mut errs)
            .into_iter()
            .filter(|f| f.claim.pods.iter().any(|p| ours.contains(p)))
            .collect();
        for f in &mut finalized {
            f.claim.pods.retain(|p| ours.contains(p));
        }
        launch::choose_all(&self.templates, &mut finalized, opts);
        let errors = sorted_errors(&errs, &ours);
        TrialResults { claims: finalized.into_iter().map(|f| f.claim).collect(), existing, errors }
    }
}

/// The errors of `ours`, by pod index.
fn sorted_errors(errors: &HashMap<usize, String>, ours: &std::collections::HashSet<usize>) -> Vec<(usize, String)> {
    let mut out: Vec<(usize, String)> =
        errors.iter().filter(|(i, _)| ours.contains(i)).map(|(i, e)| (*i, e.clone())).collect();
    out.sort_by_key(|(i, _)| *i);
    out
}
