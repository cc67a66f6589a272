//! One topology group (Karpenter's `TopologyGroup`): the pods a spread constraint, pod
//! affinity or pod anti-affinity term selects, counted per domain of its key, and the
//! domains a pod may use next under it. Also the domains NodePools and instance types
//! offer for a key, with the taints of the pools that offer them.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use crate::labels::{self, LabelSelector};
use crate::pod::{InclusionPolicy, Pod};
use crate::requirements::{Requirement, Requirements};
use crate::scheduling::view::PodView;
use crate::taints::{self, Taint, Toleration};

/// What a topology group enforces.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TopologyType {
    Spread,
    PodAffinity,
    PodAntiAffinity,
}

impl fmt::Display for TopologyType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            TopologyType::Spread => "topology spread",
            TopologyType::PodAffinity => "pod affinity",
            TopologyType::PodAntiAffinity => "pod anti-affinity",
        })
    }
}

/// Which nodes count for a spread constraint (`nodeAffinityPolicy`, `nodeTaintsPolicy`).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct NodeFilter {
    /// The pod's node selector combined with each required node affinity term (ORed).
    pub(super) requirements: Vec<Requirements>,
    pub(super) taint_policy: InclusionPolicy,
    pub(super) affinity_policy: InclusionPolicy,
    pub(super) tolerations: crate::shared::Shared<Vec<Toleration>>,
}

impl NodeFilter {
    pub(super) fn for_pod(view: &PodView, taint_policy: InclusionPolicy, affinity_policy: InclusionPolicy) -> Self {
        let selector = Requirements::from_labels(&view.node_selector);
        let requirements = if view.required_terms.is_empty() {
            vec![selector]
        } else {
            view.required_terms
                .iter()
                .map(|t| {
                    let mut r = selector.clone();
                    r.add_all(t);
                    r
                })
                .collect()
        };
        NodeFilter { requirements, taint_policy, affinity_policy, tolerations: view.tolerations.clone() }
    }

    /// Whether a node with these taints and requirements takes part in the topology. For a
    /// NodeClaim, well-known labels it leaves undefined count as compatible (Karpenter
    /// passes `AllowUndefinedWellKnownLabels` there, and not for existing nodes).
    pub fn matches(&self, taints: &[Taint], reqs: &Requirements, allow_undefined: bool) -> bool {
        let affinity_ok = self.affinity_policy == InclusionPolicy::Ignore
            || self.requirements.is_empty()
            || self.requirements.iter().any(|r| reqs.is_compatible(r, allow_undefined));
        let taints_ok =
            self.taint_policy == InclusionPolicy::Ignore || taints::tolerates_all(taints, &self.tolerations);
        affinity_ok && taints_ok
    }
}

/// The identity of a topology group (Karpenter's `TopologyGroup.Hash`; `minDomains` is not
/// part of it, as in Karpenter).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(super) struct GroupKey {
    pub(super) kind: TopologyType,
    pub(super) key: String,
    pub(super) namespaces: BTreeSet<String>,
    pub(super) max_skew: i32,
    pub(super) node_filter: Option<NodeFilter>,
    pub(super) selector: Option<LabelSelector>,
}

/// Pods matching a selector, counted per domain of one topology key.
#[derive(Clone, Debug)]
pub struct TopologyGroup {
    pub(super) id: GroupKey,
    pub(super) min_domains: Option<i32>,
    pub(super) owners: BTreeSet<usize>,
    /// How many running pods own it (an inverse anti-affinity: each running pod with the
    /// term; they share the owner `usize::MAX`). A group whose running owners were all taken
    /// out with their nodes, and that no pending pod owns, constrains nothing.
    pub(super) bound_owners: u32,
    pub(super) domains: BTreeMap<String, i32>,
    pub(super) empty_domains: BTreeSet<String>,
    /// The domains it was seeded with (NodePools' and instance types'): they stay known when
    /// the nodes in them are taken out.
    pub(super) seeded: BTreeSet<String>,
}

impl TopologyGroup {
    pub(super) fn new(id: GroupKey, min_domains: Option<i32>, seed: impl IntoIterator<Item = String>) -> Self {
        let mut g = TopologyGroup {
            id,
            min_domains,
            owners: BTreeSet::new(),
            bound_owners: 0,
            domains: BTreeMap::new(),
            empty_domains: BTreeSet::new(),
            seeded: BTreeSet::new(),
        };
        for d in seed {
            g.register(&d);
            g.seeded.insert(d);
        }
        g
    }

    /// Whether anything owns it: a pod to place, or a running pod not taken out.
    pub(super) fn active(&self) -> bool {
        self.bound_owners > 0 || self.owners.iter().any(|o| *o != usize::MAX)
    }

    /// The topology key.
    pub fn key(&self) -> &str {
        &self.id.key
    }

    /// Whether the group selects `pod` (namespace and label selector).
    pub fn selects(&self, pod: &Pod) -> bool {
        self.id.namespaces.contains(&pod.key.namespace)
            && self.id.selector.as_ref().is_some_and(|s| s.matches(&pod.labels))
    }

    /// Whether `pod`, placed on a node with these taints and requirements, counts.
    pub(super) fn counts(&self, pod: &Pod, taints: &[Taint], reqs: &Requirements, allow_undefined: bool) -> bool {
        self.selects(pod) && self.id.node_filter.as_ref().is_none_or(|f| f.matches(taints, reqs, allow_undefined))
    }

    /// Makes a domain known (with no pods); returns whether it was not known before.
    pub(super) fn register(&mut self, domain: &str) -> bool {
        if self.domains.contains_key(domain) {
            return false;
        }
        self.domains.insert(domain.to_string(), 0);
        self.empty_domains.insert(domain.to_string());
        true
    }

    /// Counts one more pod in a domain; returns the count before (`None`: not known).
    pub(super) fn record(&mut self, domain: &str) -> Option<i32> {
        let before = self.domains.get(domain).copied();
        self.set_count(domain, Some(before.unwrap_or(0) + 1));
        before
    }

    /// A domain's count (`None`: not known).
    pub(super) fn count_of(&self, domain: &str) -> Option<i32> {
        self.domains.get(domain).copied()
    }

    /// Sets a domain's count, or forgets the domain (`None`), keeping `empty_domains` the
    /// domains counted at zero: how a change is undone.
    pub(super) fn set_count(&mut self, domain: &str, count: Option<i32>) {
        match count {
            None => {
                self.domains.remove(domain);
                self.empty_domains.remove(domain);
            }
            Some(c) => {
                if let Some(v) = self.domains.get_mut(domain) {
                    *v = c;
                } else {
                    self.domains.insert(domain.to_string(), c);
                }
                if c == 0 {
                    if !self.empty_domains.contains(domain) {
                        self.empty_domains.insert(domain.to_string());
                    }
                } else {
                    self.empty_domains.remove(domain);
                }
            }
        }
    }

    fn count(&self, domain: &str) -> i64 {
        self.domains.get(domain).copied().unwrap_or(0) as i64
    }

    /// The domains a pod may use under this group (Karpenter's `TopologyGroup.Get`).
    pub(super) fn next_domains(
        &self,
        self_selecting: bool,
        pod_domains: &Requirement,
        node_domains: &Requirement,
    ) -> Requirement {
        match self.id.kind {
            TopologyType::Spread => self.next_domain_spread(self_selecting, pod_domains, node_domains),
            TopologyType::PodAffinity => self.next_domain_affinity(self_selecting, pod_domains, node_domains),
            TopologyType::PodAntiAffinity => self.next_domain_anti_affinity(pod_domains, node_domains),
        }
    }

    fn single_host<'r>(&self, node_domains: &'r Requirement) -> Option<&'r str> {
        (self.id.key == labels::HOSTNAME && !node_domains.is_complement() && node_domains.values().len() == 1)
            .then(|| node_domains.values()[0].as_str())
    }

    fn next_domain_spread<'g>(
        &'g self,
        self_selecting: bool,
        pod_domains: &Requirement,
        node_domains: &'g Requirement,
    ) -> Requirement {
        let sel = self_selecting as i64;
        let max_skew = self.id.max_skew as i64;
        if let Some(host) = self.single_host(node_domains) {
            // A new hostname domain can always be created, so the global minimum is zero.
            return if self.count(host) + sel <= max_skew {
                Requirement::is_in([host])
            } else {
                Requirement::does_not_exist()
            };
        }
        let min = self.domain_min_count(pod_domains);
        let mut best: Option<(&str, i64)> = None;
        let mut consider = |d: &'g str, c: i64| {
            let c = c + sel;
            if c - min <= max_skew && best.is_none_or(|(_, bc)| c < bc) {
                best = Some((d, c));
            }
        };
        if !node_domains.is_complement() {
            for d in node_domains.values() {
                if let Some(c) = self.domains.get(d) {
                    consider(d, *c as i64);
                }
            }
        } else {
            for (d, c) in &self.domains {
                if node_domains.has(d) {
                    consider(d, *c as i64);
                }
            }
        }
        match best {
            Some((d, _)) => Requirement::is_in([d]),
            None => Requirement::does_not_exist(),
        }
    }

    fn domain_min_count(&self, pod_domains: &Requirement) -> i64 {
        if self.id.key == labels::HOSTNAME {
            return 0;
        }
        let mut min = i32::MAX as i64;
        let mut supported = 0;
        for (d, c) in &self.domains {
            if pod_domains.has(d) {
                supported += 1;
                min = min.min(*c as i64);
            }
        }
        if self.min_domains.is_some_and(|m| supported < m) {
            min = 0;
        }
        min
    }

    fn any_compatible_pod_domain(&self, pod_domains: &Requirement) -> bool {
        self.domains.iter().any(|(d, c)| pod_domains.has(d) && *c > 0)
    }

    fn next_domain_affinity(
        &self,
        self_selecting: bool,
        pod_domains: &Requirement,
        node_domains: &Requirement,
    ) -> Requirement {
        let mut options = Requirement::does_not_exist();
        let bootstrap = self_selecting
            && (self.domains.len() == self.empty_domains.len() || !self.any_compatible_pod_domain(pod_domains));
        if let Some(host) = self.single_host(node_domains) {
            if pod_domains.has(host) && (self.count(host) > 0 || bootstrap) {
                options.insert(host);
            }
            return options;
        }
        if !node_domains.is_complement() {
            for d in node_domains.values() {
                if pod_domains.has(d) && self.count(d) > 0 {
                    options.insert(d.clone());
                }
            }
        } else {
            for (d, c) in &self.domains {
                if pod_domains.has(d) && *c > 0 && node_domains.has(d) {
                    options.insert(d.clone());
                }
            }
        }
        if !options.is_empty() {
            return options;
        }
        if bootstrap {
            // Prefer a domain the node can already be in, then any the pod allows.
            let both = pod_domains.intersection(node_domains);
            if let Some(d) = self.domains.keys().find(|d| both.has(d)) {
                options.insert(d.clone());
            }
            if let Some(d) = self.domains.keys().find(|d| pod_domains.has(d)) {
                options.insert(d.clone());
            }
        }
        options
    }

    fn next_domain_anti_affinity(&self, pod_domains: &Requirement, node_domains: &Requirement) -> Requirement {
        let mut options = Requirement::does_not_exist();
        if let Some(host) = self.single_host(node_domains) {
            if self.count(host) == 0 {
                options.insert(host);
            }
            return options;
        }
        if !node_domains.is_complement() && node_domains.values().len() < self.empty_domains.len() {
            for d in node_domains.values() {
                if self.empty_domains.contains(d) && pod_domains.has(d) {
                    options.insert(d.clone());
                }
            }
        } else {
            for d in &self.empty_domains {
                if node_domains.has(d) && pod_domains.has(d) {
                    options.insert(d.clone());
                }
            }
        }
        options
    }

    pub(super) fn describe_counts(&self) -> String {
        let mut s = String::from("{");
        for (i, (d, c)) in self.domains.iter().take(25).enumerate() {
            if i > 0 {
                s.push_str(", ");
            }
            s.push_str(&format!("{d}: {c}"));
        }
        if self.domains.len() > 25 {
            s.push_str(&format!(" and {} others", self.domains.len() - 25));
        }
        s.push('}');
        s
    }
}

/// A pod's topology constraint that no domain can satisfy.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "unsatisfiable topology constraint for {kind}, key={key} (counts = {counts}, podDomains = {pod_domains}, nodeDomains = {node_domains})"
)]
pub struct TopologyError {
    pub kind: TopologyType,
    pub key: String,
    pub counts: String,
    pub pod_domains: String,
    pub node_domains: String,
}

/// The domains of one key known from NodePools and instance types, with the taints of the
/// pools offering each domain.
#[derive(Clone, Debug, Default)]
pub(super) struct DomainGroup {
    pub(super) domains: BTreeMap<String, Vec<Vec<Taint>>>,
}

impl DomainGroup {
    pub(super) fn insert(&mut self, domain: &str, taints: &[Taint]) {
        match self.domains.get_mut(domain) {
            None => {
                self.domains.insert(domain.to_string(), vec![taints.to_vec()]);
            }
            Some(sets) => {
                if taints.is_empty() {
                    *sets = vec![Vec::new()];
                } else if !sets[0].is_empty() {
                    sets.push(taints.to_vec());
                }
            }
        }
    }

    /// The domains a pod can reach: all, or (honouring taints) those of a pool whose taints
    /// the pod tolerates.
    pub(super) fn domains_for(&self, tolerations: &[Toleration], honor_taints: bool) -> Vec<String> {
        self.domains
            .iter()
            .filter(|(_, sets)| !honor_taints || sets.iter().any(|t| taints::tolerates_all(t, tolerations)))
            .map(|(d, _)| d.clone())
            .collect()
    }
}
