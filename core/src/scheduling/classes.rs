//! Equivalence classes: pods whose scheduling inputs are identical collapse into one class
//! with a count, so the packer decides per class instead of per pod.

use std::collections::HashMap;

use crate::labels::{self, Labels};
use crate::pod::{HostPort, NodeAffinity, Pod, PodAffinity, TopologySpreadConstraint, WhenUnsatisfiable};
use crate::requirements::Requirements;
use crate::resources::ResourceList;
use crate::taints::Toleration;

/// Everything about a pod that scheduling reads (its name and creation order aside).
#[derive(PartialEq, Eq, Hash)]
struct Key<'p> {
    namespace: &'p str,
    labels: &'p Labels,
    requests: &'p ResourceList,
    node_selector: &'p Labels,
    node_affinity: &'p NodeAffinity,
    pod_affinity: &'p PodAffinity,
    pod_anti_affinity: &'p PodAffinity,
    tolerations: &'p [Toleration],
    topology_spread: &'p [TopologySpreadConstraint],
    host_ports: &'p [HostPort],
    volume_requirements: &'p [Requirements],
    uses_match_fields: bool,
}

impl<'p> Key<'p> {
    fn of(p: &'p Pod) -> Self {
        Key {
            namespace: &p.key.namespace,
            labels: &p.labels,
            requests: &p.requests,
            node_selector: &p.node_selector,
            node_affinity: &p.node_affinity,
            pod_affinity: &p.pod_affinity,
            pod_anti_affinity: &p.pod_anti_affinity,
            tolerations: &p.tolerations,
            topology_spread: &p.topology_spread,
            host_ports: &p.host_ports,
            volume_requirements: &p.volume_requirements,
            uses_match_fields: p.uses_match_fields,
        }
    }
}

/// The class of each pod in `which` (pods with the same key share an id).
pub fn ids(pods: &[Pod], which: &[usize]) -> HashMap<usize, usize> {
    let mut index: HashMap<Key<'_>, usize> = HashMap::new();
    let mut out = HashMap::with_capacity(which.len());
    for &i in which {
        let n = index.len();
        out.insert(i, *index.entry(Key::of(&pods[i])).or_insert(n));
    }
    out
}

/// A per-node cap shared by a group of classes: at most `cap` of the group's pods on one
/// node (required hostname anti-affinity to itself: 1; hostname spread: `maxSkew`).
#[derive(Clone, Debug, PartialEq)]
pub struct CapGroup {
    pub cap: usize,
    /// A stable description for debugging (`anti/<ns>/<selector>`).
    pub name: String,
}

/// Identical pods.
#[derive(Clone, Debug)]
pub struct Class {
    /// Pod indices, in queue order.
    pub pods: Vec<usize>,
    /// How many of `pods` are placed or given up on.
    pub next: usize,
    /// Requests plus `pods: 1`.
    pub requests: ResourceList,
    /// Cap groups the class belongs to.
    pub caps: Vec<usize>,
    /// Whether the class has a zone-keyed (non-hostname) spread constraint.
    pub zonal_spread: bool,
    /// Whether the class has zone-keyed (non-hostname) pod affinity or anti-affinity.
    pub zonal_affinity: bool,
}

impl Class {
    /// Pods not yet handled.
    pub fn remaining(&self) -> usize {
        self.pods.len() - self.next
    }
}

/// Groups `pods[which]` into classes, preserving the order of `which` inside each class.
pub fn build(pods: &[Pod], which: &[usize]) -> (Vec<Class>, Vec<CapGroup>) {
    let mut index: HashMap<Key<'_>, usize> = HashMap::new();
    let mut classes: Vec<Class> = Vec::new();
    for &i in which {
        let p = &pods[i];
        let c = *index.entry(Key::of(p)).or_insert_with(|| {
            classes.push(Class {
                pods: Vec::new(),
                next: 0,
                requests: p.requests_with_pod_slot(),
                caps: Vec::new(),
                zonal_spread: p.topology_spread.iter().any(|t| t.topology_key != labels::HOSTNAME),
                zonal_affinity: p
                    .pod_affinity
                    .required
                    .iter()
                    .chain(p.pod_anti_affinity.required.iter())
                    .any(|t| t.topology_key != labels::HOSTNAME),
            });
            classes.len() - 1
        });
        classes[c].pods.push(i);
    }
    // Cap groups: self-selecting hostname anti-affinity (1) and hostname spread (maxSkew).
    let mut caps: Vec<CapGroup> = Vec::new();
    for class in &mut classes {
        let p = &pods[class.pods[0]];
        let mut add = |name: String, cap: usize| {
            let g = match caps.iter().position(|c| c.name == name) {
                Some(g) => g,
                None => {
                    caps.push(CapGroup { cap, name });
                    caps.len() - 1
                }
            };
            if !class.caps.contains(&g) {
                class.caps.push(g);
            }
        };
        for t in &p.pod_anti_affinity.required {
            if t.topology_key == labels::HOSTNAME
                && t.namespaces.is_empty()
                && t.namespace_selector.is_none()
                && let Some(sel) = &t.selector
                && sel.matches(&p.labels)
            {
                add(format!("anti/{}/{:?}", p.key.namespace, sel), 1);
            }
        }
        for t in &p.topology_spread {
            if t.topology_key == labels::HOSTNAME
                && t.when_unsatisfiable == WhenUnsatisfiable::DoNotSchedule
                && let Some(sel) = &t.selector
                && sel.matches(&p.labels)
            {
                add(format!("spread/{}/{}/{:?}", p.key.namespace, t.max_skew, sel), t.max_skew.max(1) as usize);
            }
        }
    }
    (classes, caps)
}
