//! Topology bookkeeping for spread constraints, pod affinity and pod anti-affinity, as
//! Karpenter's `topology.go` / `topologygroup.go`: one [`TopologyGroup`] per distinct
//! (type, key, namespaces, selector, skew, node filter) counts matching pods per domain,
//! and turns a pod's constraints into extra requirements on the node it may land on.
//!
//! Where Karpenter picks "a random" domain (Go map order), dovetail picks the first in name
//! order, so every solve is deterministic.

mod group;
mod trail;

use std::cell::OnceCell;
use std::collections::BTreeSet;

use crate::labels::{self, Labels, SelectorOp, SelectorRequirement};
use crate::pod::{InclusionPolicy, Pod, PodAffinityTerm, WhenUnsatisfiable};
use crate::requirements::{Requirement, Requirements};
use crate::shared::{FastMap, FastSet};
use crate::taints::Taint;

use super::input::{PreferencePolicy, Snapshot};
use super::view::PodView;

use group::{DomainGroup, GroupKey, NodeFilter};
pub use group::{TopologyError, TopologyGroup, TopologyType};
use trail::Undo;

/// All topology groups of one solve.
pub struct Topology<'a> {
    snapshot: &'a Snapshot,
    policy: PreferencePolicy,
    groups: Vec<TopologyGroup>,
    index: FastMap<GroupKey, usize>,
    inverse: Vec<TopologyGroup>,
    inverse_index: FastMap<GroupKey, usize>,
    /// Groups each pending pod owns.
    owned: FastMap<usize, Vec<usize>>,
    domain_groups: FastMap<String, DomainGroup>,
    /// Node name -> index into the snapshot's nodes, for counting bound pods.
    nodes: FastMap<&'a str, usize>,
    /// Each snapshot node's taints and requirements (from its labels), made when first asked
    /// for ([`Topology::node_info`]): a solve whose pods count no domain needs none.
    node_infos: Vec<OnceCell<(Vec<Taint>, Requirements)>>,
    /// Running pods by their node (indices into the snapshot's bound pods, terminal ones
    /// left out).
    bound_by_node: FastMap<&'a str, Vec<usize>>,
    /// Nodes taken out ([`Topology::take_out`]): their domains and running pods count no
    /// more.
    removed: FastSet<&'a str>,
    /// While journaling ([`Topology::mark`]), how to undo every change since.
    trail: Option<Vec<Undo<'a>>>,
    /// The snapshot's nodes by hostname (indices): whether another node keeps a hostname
    /// known when one is taken out.
    hostnames: FastMap<&'a str, Vec<usize>>,
    /// The snapshot's nodes by their value of a label key, built per key when needed.
    labelled: FastMap<String, FastMap<String, Vec<usize>>>,
}

impl<'a> Topology<'a> {
    /// Builds the topology of a snapshot: inverse anti-affinities of running pods now,
    /// every other group as pods are updated.
    pub fn new(snapshot: &'a Snapshot, policy: PreferencePolicy) -> Self {
        let nodes = snapshot.nodes.iter().enumerate().map(|(i, n)| (n.name.as_str(), i)).collect();
        let node_infos = snapshot.nodes.iter().map(|_| OnceCell::new()).collect();
        let mut bound_by_node: FastMap<&str, Vec<usize>> = FastMap::default();
        for (i, p) in snapshot.bound_pods.iter().enumerate() {
            if let Some(n) = p.node_name.as_deref()
                && !p.terminal
            {
                bound_by_node.entry(n).or_default().push(i);
            }
        }
        let by_name: FastMap<&str, &crate::node::Node> = snapshot.nodes.iter().map(|n| (n.name.as_str(), n)).collect();
        let mut hostnames: FastMap<&str, Vec<usize>> = FastMap::default();
        for (i, n) in snapshot.nodes.iter().enumerate() {
            hostnames.entry(n.hostname()).or_default().push(i);
        }
        let mut t = Topology {
            snapshot,
            policy,
            groups: Vec::new(),
            index: FastMap::default(),
            inverse: Vec::new(),
            inverse_index: FastMap::default(),
            owned: FastMap::default(),
            domain_groups: FastMap::default(),
            nodes,
            node_infos,
            bound_by_node,
            removed: FastSet::default(),
            trail: None,
            hostnames,
            labelled: FastMap::default(),
        };
        for pod in &snapshot.bound_pods {
            if !pod.has_required_pod_anti_affinity() || pod.terminal {
                continue;
            }
            let Some(node) = pod.node_name.as_deref().and_then(|n| by_name.get(n)) else {
                continue;
            };
            let view = PodView::new(pod);
            t.update_inverse_anti_affinity(usize::MAX, pod, &view, Some(&node.labels));
        }
        t
    }

    fn domain_group(&mut self, key: &str) -> &DomainGroup {
        if !self.domain_groups.contains_key(key) {
            let mut g = DomainGroup::default();
            for p in &self.snapshot.nodepools {
                // Only `key` matters: the pool's requirement on it (labels included)
                // intersected with each instance type's.
                let mut base = Requirements::new();
                if let Some(r) = p.pool.requirements.get_defined(key) {
                    base.add(key, r.clone());
                }
                if let Some(v) = p.pool.labels.get(key) {
                    base.add(key, Requirement::is_in([v.as_str()]));
                }
                let pool_req = base.get_defined(key);
                for it in p.instance_types.iter() {
                    let req = match (pool_req, it.requirements.get_defined(key)) {
                        (None, None) => continue,
                        (Some(b), None) => b.clone(),
                        (None, Some(t)) => t.clone(),
                        (Some(b), Some(t)) => t.intersection(b),
                    };
                    if !req.is_complement() {
                        for v in req.values() {
                            g.insert(v, &p.pool.taints);
                        }
                    }
                }
                if let Some(req) = pool_req
                    && !req.is_complement()
                {
                    for v in req.values() {
                        g.insert(v, &p.pool.taints);
                    }
                }
            }
            self.domain_groups.insert(key.to_string(), g);
        }
        &self.domain_groups[key]
    }

    fn namespaces_for(&self, pod: &Pod, term: &PodAffinityTerm) -> BTreeSet<String> {
        match (&term.namespace_selector, term.namespaces.is_empty()) {
            (None, true) => BTreeSet::from([pod.key.namespace.clone()]),
            (None, false) => term.namespaces.iter().cloned().collect(),
            (Some(sel), _) => {
                let mut out: BTreeSet<String> = self
                    .snapshot
                    .namespaces
                    .iter()
                    .filter(|(_, labels)| sel.matches(labels))
                    .map(|(n, _)| n.clone())
                    .collect();
                out.extend(term.namespaces.iter().cloned());
                out
            }
        }
    }

    /// Re-derives the groups `pod` owns from its current (possibly relaxed) constraints.
    /// Makes pod `idx` own the same groups as pod `like`, whose spec is the same in every
    /// field topology reads (namespace, labels, spread, affinities, node selection,
    /// tolerations): what `update` would do for it, without rebuilding the groups.
    pub fn update_like(&mut self, idx: usize, like: usize) {
        let owned = self.owned.get(&like).cloned().unwrap_or_default();
        for &g in &owned {
            self.own(false, g, idx, true);
        }
        self.set_owned(idx, Some(owned));
        for g in 0..self.inverse.len() {
            if self.inverse[g].owners.contains(&like) {
                self.own(true, g, idx, true);
            }
        }
    }

    /// Whether two pods have the same spec in every field topology reads.
    pub fn same_spec(a: &Pod, b: &Pod) -> bool {
        a.key.namespace == b.key.namespace
            && a.labels == b.labels
            && a.topology_spread == b.topology_spread
            && a.pod_affinity == b.pod_affinity
            && a.pod_anti_affinity == b.pod_anti_affinity
            && a.node_selector == b.node_selector
            && a.node_affinity == b.node_affinity
            && a.tolerations == b.tolerations
    }

    pub fn update(&mut self, idx: usize, pod: &Pod, view: &PodView) {
        if let Some(old) = self.set_owned(idx, None) {
            for g in old {
                self.own(false, g, idx, false);
            }
        }
        let anti = match self.policy {
            PreferencePolicy::Ignore => !view.anti_affinity.required.is_empty(),
            PreferencePolicy::Respect => !view.anti_affinity.is_empty(),
        };
        if anti {
            self.update_inverse_anti_affinity(idx, pod, view, None);
        }
        let mut new_groups = self.spread_groups(pod, view);
        new_groups.extend(self.affinity_groups(pod, view));
        let mut owned = Vec::with_capacity(new_groups.len());
        for g in new_groups {
            let i = match self.index.get(&g.id) {
                Some(i) => *i,
                None => {
                    let mut g = g;
                    self.count_domains(&mut g);
                    self.push_group(false, g)
                }
            };
            self.own(false, i, idx, true);
            if !owned.contains(&i) {
                owned.push(i);
            }
        }
        self.set_owned(idx, Some(owned));
    }

    fn spread_groups(&mut self, pod: &Pod, view: &PodView) -> Vec<TopologyGroup> {
        let mut out = Vec::new();
        for tsc in &view.spread {
            if self.policy == PreferencePolicy::Ignore && tsc.when_unsatisfiable != WhenUnsatisfiable::DoNotSchedule {
                continue;
            }
            let mut selector = tsc.selector.clone();
            for key in &tsc.match_label_keys {
                if let (Some(sel), Some(v)) = (selector.as_mut(), pod.labels.get(key)) {
                    *sel = std::mem::take(sel).with_expression(SelectorRequirement {
                        key: key.clone(),
                        op: SelectorOp::In,
                        values: vec![v.clone()],
                    });
                }
            }
            let taint_policy = tsc.node_taints_policy.unwrap_or(InclusionPolicy::Ignore);
            let affinity_policy = tsc.node_affinity_policy.unwrap_or(InclusionPolicy::Honor);
            let filter = NodeFilter::for_pod(view, taint_policy, affinity_policy);
            let seed = self
                .domain_group(&tsc.topology_key)
                .domains_for(&view.tolerations, taint_policy == InclusionPolicy::Honor);
            out.push(TopologyGroup::new(
                GroupKey {
                    kind: TopologyType::Spread,
                    key: tsc.topology_key.clone(),
                    namespaces: BTreeSet::from([pod.key.namespace.clone()]),
                    max_skew: tsc.max_skew,
                    node_filter: Some(filter),
                    selector,
                },
                tsc.min_domains,
                seed,
            ));
        }
        out
    }

    fn affinity_groups(&mut self, pod: &Pod, view: &PodView) -> Vec<TopologyGroup> {
        let mut terms: Vec<(TopologyType, &PodAffinityTerm)> = Vec::new();
        let respect = self.policy == PreferencePolicy::Respect;
        for (kind, aff) in
            [(TopologyType::PodAffinity, &view.affinity), (TopologyType::PodAntiAffinity, &view.anti_affinity)]
        {
            terms.extend(aff.required.iter().map(|t| (kind, t)));
            if respect {
                terms.extend(aff.preferred.iter().map(|(_, t)| (kind, t)));
            }
        }
        let mut out = Vec::new();
        for (kind, term) in terms {
            let namespaces = self.namespaces_for(pod, term);
            // Affinity groups see only domains of pools whose taints the pod tolerates.
            let seed = self.domain_group(&term.topology_key).domains_for(&view.tolerations, true);
            out.push(TopologyGroup::new(
                GroupKey {
                    kind,
                    key: term.topology_key.clone(),
                    namespaces,
                    max_skew: i32::MAX,
                    node_filter: None,
                    selector: term.selector.clone(),
                },
                None,
                seed,
            ));
        }
        out
    }

    /// The inverse anti-affinity group a pod's required anti-affinity term makes.
    fn inverse_key(&self, pod: &Pod, term: &PodAffinityTerm) -> GroupKey {
        GroupKey {
            kind: TopologyType::PodAntiAffinity,
            key: term.topology_key.clone(),
            namespaces: self.namespaces_for(pod, term),
            max_skew: i32::MAX,
            node_filter: None,
            selector: term.selector.clone(),
        }
    }

    fn update_inverse_anti_affinity(&mut self, idx: usize, pod: &Pod, view: &PodView, node_labels: Option<&Labels>) {
        for term in &view.anti_affinity.required {
            let id = self.inverse_key(pod, term);
            let i = match self.inverse_index.get(&id) {
                Some(i) => *i,
                None => {
                    let seed = self.domain_group(&term.topology_key).domains_for(&view.tolerations, true);
                    self.push_group(true, TopologyGroup::new(id, None, seed))
                }
            };
            if let Some(d) = node_labels.and_then(|l| l.get(&self.inverse[i].id.key)) {
                let d = d.clone();
                self.count(true, i, &d, 1);
            }
            if idx == usize::MAX {
                // Running pods share one owner id: their number says when none is left.
                self.inverse[i].bound_owners += 1;
            }
            self.own(true, i, idx, true);
        }
    }

    /// The taints and requirements of the snapshot's node `name` (the last of that name).
    fn node_info(&self, name: &str) -> Option<&(Vec<Taint>, Requirements)> {
        let i = *self.nodes.get(name)?;
        let n = self.snapshot.nodes.get(i)?;
        Some(self.node_infos.get(i)?.get_or_init(|| (n.taints.clone(), Requirements::from_labels(&n.labels))))
    }

    /// Registers existing nodes' domains and counts the running pods the group selects.
    fn count_domains(&self, g: &mut TopologyGroup) {
        for n in &self.snapshot.nodes {
            if self.removed.contains(n.name.as_str()) {
                continue;
            }
            let Some(d) = n.labels.get(&g.id.key) else { continue };
            let fits = |f: &NodeFilter| self.node_info(&n.name).is_some_and(|(t, r)| f.matches(t, r, false));
            if g.id.node_filter.as_ref().is_none_or(fits) {
                g.register(d);
            }
        }
        for p in &self.snapshot.bound_pods {
            if let Some(domain) = self.bound_domain(g, p) {
                g.record(&domain);
            }
        }
    }

    /// The domain a running pod counts in for a group, if it counts (its node's, when the
    /// node passes the group's filter and is not taken out).
    fn bound_domain(&self, g: &TopologyGroup, p: &Pod) -> Option<String> {
        if p.terminal || !g.selects(p) {
            return None;
        }
        let node_name = p.node_name.as_deref()?;
        if self.removed.contains(node_name) {
            return None;
        }
        let (taints, reqs) = self.node_info(node_name)?;
        let domain = match reqs.get_defined(&g.id.key) {
            Some(r) if !r.is_complement() && r.values().len() == 1 => r.values()[0].clone(),
            _ if g.id.key == labels::HOSTNAME => node_name.to_string(),
            _ => return None,
        };
        g.id.node_filter.as_ref().is_none_or(|f| f.matches(taints, reqs, false)).then_some(domain)
    }

    /// Tightens `node_reqs` with every topology that constrains `pod` there (its own groups
    /// and the inverse anti-affinities of pods it would join).
    pub fn add_requirements(
        &self,
        idx: usize,
        pod: &Pod,
        taints: &[Taint],
        pod_reqs: &Requirements,
        node_reqs: &Requirements,
        allow_undefined: bool,
    ) -> Result<Requirements, TopologyError> {
        let mut out = node_reqs.clone();
        let owned = self.owned.get(&idx).map(Vec::as_slice).unwrap_or(&[]);
        let matching = owned
            .iter()
            .map(|i| &self.groups[*i])
            .chain(self.inverse.iter().filter(|g| g.active() && g.counts(pod, taints, node_reqs, allow_undefined)));
        for g in matching {
            let key = g.key();
            let pod_domains = pod_reqs.get(key);
            let node_domains = node_reqs.get(key);
            let domains = g.next_domains(g.selects(pod), pod_domains, node_domains);
            if domains.is_empty() {
                return Err(TopologyError {
                    kind: g.id.kind,
                    key: key.to_string(),
                    counts: g.describe_counts(),
                    pod_domains: format!("{key} {pod_domains}"),
                    node_domains: format!("{key} {node_domains}"),
                });
            }
            out.add(key, domains);
        }
        Ok(out)
    }

    /// Records that `pod` was placed on a node with these taints and requirements.
    pub fn record(&mut self, idx: usize, pod: &Pod, taints: &[Taint], reqs: &Requirements, allow_undefined: bool) {
        for i in 0..self.groups.len() {
            let g = &self.groups[i];
            if !g.counts(pod, taints, reqs, allow_undefined) {
                continue;
            }
            let domains = reqs.get(&g.id.key);
            if domains.is_complement() {
                continue;
            }
            if g.id.kind == TopologyType::PodAntiAffinity {
                for d in domains.values() {
                    self.count(false, i, d, 1);
                }
            } else if domains.values().len() == 1 {
                self.count(false, i, &domains.values()[0], 1);
            }
        }
        for i in 0..self.inverse.len() {
            let g = &self.inverse[i];
            if g.owners.contains(&idx) {
                let domains = reqs.get(&g.id.key);
                if !domains.is_complement() {
                    for d in domains.values() {
                        self.count(true, i, d, 1);
                    }
                }
            }
        }
    }

    /// The node label keys that decide whether a node takes part in some group (the keys of
    /// spread constraints' node filters under `nodeAffinityPolicy: Honor`), beyond the zone
    /// and the hostname. A claim that leaves one of them open is counted as compatible, so
    /// the packer pins them on its claims to keep every count exact.
    pub fn filter_keys(&self) -> BTreeSet<&str> {
        let mut keys = BTreeSet::new();
        for g in self.groups.iter().chain(self.inverse.iter().filter(|g| g.active())) {
            let Some(f) = &g.id.node_filter else { continue };
            if f.affinity_policy == InclusionPolicy::Ignore {
                continue;
            }
            for r in &f.requirements {
                for (k, _) in r.iter() {
                    if k != labels::ZONE && k != labels::HOSTNAME {
                        keys.insert(k);
                    }
                }
            }
        }
        keys
    }

    /// Whether some group keyed on anything but the hostname would count this pod: then the
    /// pod's node must be pinned to one domain when it is placed, or the count is lost
    /// (Karpenter skips pods on claims whose zone is still open).
    pub fn counted_beyond_hostname(&self, pod: &Pod) -> bool {
        self.groups
            .iter()
            .any(|g| g.id.key != labels::HOSTNAME && g.id.kind != TopologyType::PodAntiAffinity && g.selects(pod))
    }

    /// Whether any topology constrains where this pod may go: groups it owns (its spread,
    /// affinity and anti-affinity) or inverse anti-affinities of other pods that select it.
    pub fn constrains(&self, idx: usize, pod: &Pod) -> bool {
        self.owned.get(&idx).is_some_and(|g| !g.is_empty()) || self.inverse.iter().any(|g| g.active() && g.selects(pod))
    }

    /// Whether some group (or some running pod's anti-affinity) selects this pod: moving it
    /// would change a count.
    pub fn selected(&self, pod: &Pod) -> bool {
        self.groups.iter().chain(self.inverse.iter().filter(|g| g.active())).any(|g| g.selects(pod))
    }

    /// Makes a domain (a new hostname) known to every group of that key.
    pub fn register(&mut self, key: &str, domain: &str) {
        for inverse in [false, true] {
            for i in 0..self.list(inverse).len() {
                if self.list(inverse)[i].id.key == key {
                    self.count(inverse, i, domain, 0);
                }
            }
        }
    }
}
