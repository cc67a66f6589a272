//! Taking nodes out of a topology and undoing changes: what lets disruption's simulation
//! build a cluster's topology once and try many moves on it (`Topology::mark`, `rollback`,
//! `take_out`), each from the same state, as if each had been built from scratch.
//!
//! Every change to the groups goes through the few methods here (a domain's count, a
//! group's owners, the groups a pod owns, a new group); while journaling they push how to
//! undo it, and `rollback` pops and applies those in reverse.

use crate::labels;
use crate::node::Node;
use crate::shared::FastMap;

use super::group::TopologyGroup;
use super::{PodView, Topology};

/// How to undo one change.
pub(super) enum Undo<'a> {
    /// A domain's count before (`None`: the domain was not known).
    Count { inverse: bool, group: usize, domain: String, before: Option<i32> },
    /// Whether `idx` owned the group before.
    Owner { inverse: bool, group: usize, idx: usize, owned: bool },
    /// The groups pod `idx` owned before.
    Owned { idx: usize, before: Option<Vec<usize>> },
    /// A group was added: the last one of its list.
    Group { inverse: bool },
    /// A running pod owning this inverse group was taken out.
    BoundOwner { group: usize },
    /// A node was taken out.
    Removed(&'a str),
}

impl<'a> Topology<'a> {
    pub(super) fn list(&self, inverse: bool) -> &Vec<TopologyGroup> {
        if inverse { &self.inverse } else { &self.groups }
    }

    fn list_mut(&mut self, inverse: bool) -> &mut Vec<TopologyGroup> {
        if inverse { &mut self.inverse } else { &mut self.groups }
    }

    fn journal(&mut self, undo: Undo<'a>) {
        if let Some(t) = &mut self.trail {
            t.push(undo);
        }
    }

    /// Adds `delta` pods to a domain of a group (0: makes the domain known).
    pub(super) fn count(&mut self, inverse: bool, group: usize, domain: &str, delta: i32) {
        let before = self.list(inverse)[group].count_of(domain);
        if delta == 0 && before.is_some() {
            return;
        }
        if self.trail.is_some() {
            self.journal(Undo::Count { inverse, group, domain: domain.to_string(), before });
        }
        self.list_mut(inverse)[group].set_count(domain, Some(before.unwrap_or(0) + delta));
    }

    /// Forgets a domain of a group.
    fn forget(&mut self, inverse: bool, group: usize, domain: &str) {
        let before = self.list(inverse)[group].count_of(domain);
        if before.is_none() {
            return;
        }
        if self.trail.is_some() {
            self.journal(Undo::Count { inverse, group, domain: domain.to_string(), before });
        }
        self.list_mut(inverse)[group].set_count(domain, None);
    }

    /// Makes `idx` an owner of a group, or not.
    pub(super) fn own(&mut self, inverse: bool, group: usize, idx: usize, own: bool) {
        let owners = &mut self.list_mut(inverse)[group].owners;
        let owned = owners.contains(&idx);
        if owned == own {
            return;
        }
        if own {
            owners.insert(idx);
        } else {
            owners.remove(&idx);
        }
        self.journal(Undo::Owner { inverse, group, idx, owned });
    }

    /// Sets the groups pod `idx` owns; returns what it owned before.
    pub(super) fn set_owned(&mut self, idx: usize, owned: Option<Vec<usize>>) -> Option<Vec<usize>> {
        let before = match owned {
            Some(v) => self.owned.insert(idx, v),
            None => self.owned.remove(&idx),
        };
        if self.trail.is_some() {
            self.journal(Undo::Owned { idx, before: before.clone() });
        }
        before
    }

    /// Adds a group; returns its index.
    pub(super) fn push_group(&mut self, inverse: bool, g: TopologyGroup) -> usize {
        let id = g.id.clone();
        let list = self.list_mut(inverse);
        list.push(g);
        let i = list.len() - 1;
        if inverse {
            self.inverse_index.insert(id, i);
        } else {
            self.index.insert(id, i);
        }
        self.journal(Undo::Group { inverse });
        i
    }

    /// Indexes the snapshot's nodes by their value of `key`, once.
    fn index_label(&mut self, key: &str) {
        if self.labelled.contains_key(key) {
            return;
        }
        let mut by_value: FastMap<String, Vec<usize>> = FastMap::default();
        for (i, n) in self.snapshot.nodes.iter().enumerate() {
            if let Some(v) = n.labels.get(key) {
                by_value.entry(v.clone()).or_default().push(i);
            }
        }
        self.labelled.insert(key.to_string(), by_value);
    }

    /// Starts journaling (if it was not) and returns the point to roll back to.
    pub fn mark(&mut self) -> usize {
        self.trail.get_or_insert_with(Vec::new).len()
    }

    /// Undoes every change made since `mark` returned `at`.
    pub fn rollback(&mut self, at: usize) {
        let Some(mut trail) = self.trail.take() else { return };
        while trail.len() > at {
            let Some(undo) = trail.pop() else { break };
            match undo {
                Undo::Count { inverse, group, domain, before } => {
                    self.list_mut(inverse)[group].set_count(&domain, before);
                }
                Undo::Owner { inverse, group, idx, owned } => {
                    let owners = &mut self.list_mut(inverse)[group].owners;
                    if owned {
                        owners.insert(idx);
                    } else {
                        owners.remove(&idx);
                    }
                }
                Undo::Owned { idx, before } => {
                    match before {
                        Some(v) => self.owned.insert(idx, v),
                        None => self.owned.remove(&idx),
                    };
                }
                Undo::Group { inverse } => {
                    if let Some(g) = self.list_mut(inverse).pop() {
                        if inverse {
                            self.inverse_index.remove(&g.id);
                        } else {
                            self.index.remove(&g.id);
                        }
                    }
                }
                Undo::BoundOwner { group } => self.inverse[group].bound_owners += 1,
                Undo::Removed(name) => {
                    self.removed.remove(name);
                }
            }
        }
        self.trail = Some(trail);
    }

    /// Takes a node out, as if the snapshot never had it: its running pods leave every
    /// count (and the inverse anti-affinities they own), and its domains are forgotten where
    /// nothing else keeps them known (a seed, another node, a pod counted there). The
    /// caller takes the node out of its own lists (the scheduler's existing nodes).
    pub fn take_out(&mut self, node: &'a Node) {
        let name = node.name.as_str();
        if self.removed.contains(name) || !self.nodes.contains_key(name) {
            return;
        }
        let pods: Vec<usize> = self.bound_by_node.get(name).cloned().unwrap_or_default();
        let snapshot = self.snapshot;
        for g in 0..self.groups.len() {
            for &p in &pods {
                if let Some(d) = self.bound_domain(&self.groups[g], &snapshot.bound_pods[p]) {
                    self.count(false, g, &d, -1);
                }
            }
        }
        for &p in &pods {
            let pod = &snapshot.bound_pods[p];
            if !pod.has_required_pod_anti_affinity() {
                continue;
            }
            let view = PodView::new(pod);
            for term in &view.anti_affinity.required {
                let Some(&g) = self.inverse_index.get(&self.inverse_key(pod, term)) else { continue };
                if let Some(d) = node.labels.get(&term.topology_key) {
                    self.count(true, g, d, -1);
                }
                if self.inverse[g].bound_owners > 0 {
                    self.inverse[g].bound_owners -= 1;
                    self.journal(Undo::BoundOwner { group: g });
                }
            }
        }
        self.removed.insert(name);
        self.journal(Undo::Removed(name));
        // Its domains, where nothing else keeps them known: a seed, a pod counted there, or
        // another node of the cluster that makes it known as the node did (its label, when
        // it passes a group's node filter, for the groups that count nodes' domains; its
        // hostname for every group of the hostname key).
        let keys: Vec<String> = self.groups.iter().map(|g| g.key().to_string()).collect();
        for key in &keys {
            self.index_label(key);
        }
        let removed = &self.removed;
        let live =
            |i: &usize| snapshot.nodes.get(*i).is_some_and(|n| n.name != name && !removed.contains(n.name.as_str()));
        let host_elsewhere = self.hostnames.get(node.hostname()).is_some_and(|ns| ns.iter().any(live));
        let mut forget: Vec<(bool, usize, String)> = Vec::new();
        for inverse in [false, true] {
            for (i, g) in self.list(inverse).iter().enumerate() {
                let key = g.key();
                let own = node.labels.get(key).map(String::as_str);
                let host = (key == labels::HOSTNAME).then(|| node.hostname());
                for d in own.into_iter().chain(host) {
                    if g.count_of(d) != Some(0) || g.seeded.contains(d) {
                        continue;
                    }
                    let by_host = key == labels::HOSTNAME && host_elsewhere && d == node.hostname();
                    let by_label = !inverse
                        && self.labelled.get(key).and_then(|v| v.get(d)).is_some_and(|ns| {
                            ns.iter().filter(|i| live(i)).any(|&i| {
                                let n = &snapshot.nodes[i];
                                self.node_info(n.name.as_str()).is_some_and(|(taints, reqs)| {
                                    g.id.node_filter.as_ref().is_none_or(|f| f.matches(taints, reqs, false))
                                })
                            })
                        });
                    if !by_host && !by_label {
                        forget.push((inverse, i, d.to_string()));
                    }
                }
            }
        }
        for (inverse, g, d) in forget {
            self.forget(inverse, g, &d);
        }
    }
}
