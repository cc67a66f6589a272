//! Topology bookkeeping for spread constraints, pod affinity and pod anti-affinity, as
//! Karpenter's `topology.go` / `topologygroup.go`: one [`TopologyGroup`] per distinct
//! (type, key, namespaces, selector, skew, node filter) counts matching pods per domain,
//! and turns a pod's constraints into extra requirements on the node it may land on.
//!
//! Where Karpenter picks "a random" domain (Go map order), dovetail picks the first in name
//! order, so every solve is deterministic.

mod group;

use std::collections::{BTreeSet, HashMap};

use crate::labels::{self, Labels, SelectorOp, SelectorRequirement};
use crate::pod::{InclusionPolicy, Pod, PodAffinityTerm, WhenUnsatisfiable};
use crate::requirements::{Requirement, Requirements};
use crate::taints::Taint;

use super::input::{PreferencePolicy, Snapshot};
use super::view::PodView;

use group::{DomainGroup, GroupKey, NodeFilter};
pub use group::{TopologyError, TopologyGroup, TopologyType};

/// All topology groups of one solve.
pub struct Topology<'a> {
    snapshot: &'a Snapshot,
    policy: PreferencePolicy,
    groups: Vec<TopologyGroup>,
    index: HashMap<GroupKey, usize>,
    inverse: Vec<TopologyGroup>,
    inverse_index: HashMap<GroupKey, usize>,
    /// Groups each pending pod owns.
    owned: HashMap<usize, Vec<usize>>,
    domain_groups: HashMap<String, DomainGroup>,
    /// Node name -> (taints, requirements) of existing nodes, for counting bound pods.
    nodes: HashMap<&'a str, (Vec<Taint>, Requirements)>,
}

impl<'a> Topology<'a> {
    /// Builds the topology of a snapshot: inverse anti-affinities of running pods now,
    /// every other group as pods are updated.
    pub fn new(snapshot: &'a Snapshot, policy: PreferencePolicy) -> Self {
        let nodes = snapshot
            .nodes
            .iter()
            .map(|n| (n.name.as_str(), (n.taints.clone(), Requirements::from_labels(&n.labels))))
            .collect();
        let mut t = Topology {
            snapshot,
            policy,
            groups: Vec::new(),
            index: HashMap::new(),
            inverse: Vec::new(),
            inverse_index: HashMap::new(),
            owned: HashMap::new(),
            domain_groups: HashMap::new(),
            nodes,
        };
        for pod in &snapshot.bound_pods {
            if !pod.has_required_pod_anti_affinity() || pod.terminal {
                continue;
            }
            let Some(node) = pod.node_name.as_deref().and_then(|n| snapshot.nodes.iter().find(|x| x.name == n)) else {
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
            self.groups[g].owners.insert(idx);
        }
        self.owned.insert(idx, owned);
        for g in &mut self.inverse {
            if g.owners.contains(&like) {
                g.owners.insert(idx);
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
        if let Some(old) = self.owned.remove(&idx) {
            for g in old {
                self.groups[g].owners.remove(&idx);
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
                    self.groups.push(g);
                    let i = self.groups.len() - 1;
                    self.index.insert(self.groups[i].id.clone(), i);
                    i
                }
            };
            self.groups[i].owners.insert(idx);
            if !owned.contains(&i) {
                owned.push(i);
            }
        }
        self.owned.insert(idx, owned);
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

    fn update_inverse_anti_affinity(&mut self, idx: usize, pod: &Pod, view: &PodView, node_labels: Option<&Labels>) {
        for term in &view.anti_affinity.required {
            let namespaces = self.namespaces_for(pod, term);
            let id = GroupKey {
                kind: TopologyType::PodAntiAffinity,
                key: term.topology_key.clone(),
                namespaces,
                max_skew: i32::MAX,
                node_filter: None,
                selector: term.selector.clone(),
            };
            let i = match self.inverse_index.get(&id) {
                Some(i) => *i,
                None => {
                    let seed = self.domain_group(&term.topology_key).domains_for(&view.tolerations, true);
                    self.inverse.push(TopologyGroup::new(id.clone(), None, seed));
                    self.inverse_index.insert(id, self.inverse.len() - 1);
                    self.inverse.len() - 1
                }
            };
            let g = &mut self.inverse[i];
            if let Some(d) = node_labels.and_then(|l| l.get(&g.id.key)) {
                g.record(d);
            }
            g.owners.insert(idx);
        }
    }

    /// Registers existing nodes' domains and counts the running pods the group selects.
    fn count_domains(&self, g: &mut TopologyGroup) {
        for n in &self.snapshot.nodes {
            let Some(d) = n.labels.get(&g.id.key) else { continue };
            let (taints, reqs) = &self.nodes[n.name.as_str()];
            if g.id.node_filter.as_ref().is_none_or(|f| f.matches(taints, reqs, false)) {
                g.register(d);
            }
        }
        for p in &self.snapshot.bound_pods {
            if p.terminal || !g.selects(p) {
                continue;
            }
            let Some(node_name) = p.node_name.as_deref() else { continue };
            let Some((taints, reqs)) = self.nodes.get(node_name) else { continue };
            let domain = match reqs.get_defined(&g.id.key) {
                Some(r) if !r.is_complement() && r.values().len() == 1 => r.values()[0].clone(),
                _ if g.id.key == labels::HOSTNAME => node_name.to_string(),
                _ => continue,
            };
            if g.id.node_filter.as_ref().is_none_or(|f| f.matches(taints, reqs, false)) {
                g.record(&domain);
            }
        }
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
            .chain(self.inverse.iter().filter(|g| g.counts(pod, taints, node_reqs, allow_undefined)));
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
        for g in &mut self.groups {
            if !g.counts(pod, taints, reqs, allow_undefined) {
                continue;
            }
            let domains = reqs.get(&g.id.key);
            if domains.is_complement() {
                continue;
            }
            if g.id.kind == TopologyType::PodAntiAffinity {
                for d in domains.values() {
                    g.record(d);
                }
            } else if domains.values().len() == 1 {
                g.record(&domains.values()[0]);
            }
        }
        for g in &mut self.inverse {
            if g.owners.contains(&idx) {
                let domains = reqs.get(&g.id.key);
                if !domains.is_complement() {
                    for d in domains.values() {
                        g.record(d);
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
        for g in self.groups.iter().chain(self.inverse.iter()) {
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
        self.owned.get(&idx).is_some_and(|g| !g.is_empty()) || self.inverse.iter().any(|g| g.selects(pod))
    }

    /// Whether some group (or some running pod's anti-affinity) selects this pod: moving it
    /// would change a count.
    pub fn selected(&self, pod: &Pod) -> bool {
        self.groups.iter().chain(self.inverse.iter()).any(|g| g.selects(pod))
    }

    /// Makes a domain (a new hostname) known to every group of that key.
    pub fn register(&mut self, key: &str, domain: &str) {
        for g in self.groups.iter_mut().chain(self.inverse.iter_mut()) {
            if g.id.key == key {
                g.register(domain);
            }
        }
    }
}
