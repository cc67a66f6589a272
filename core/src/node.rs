//! Existing capacity: nodes (and in-flight NodeClaims) the scheduler can place pods on.

use std::fmt;
use std::ops::{Deref, DerefMut};
use std::sync::{Arc, OnceLock};

use crate::labels::Labels;
use crate::requirements::{Requirement, Requirements};
use crate::resources::ResourceList;
use crate::taints::Taint;

/// A node that exists (or is being launched) when the scheduler runs.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Node {
    pub name: String,
    pub labels: NodeLabels,
    pub taints: Vec<Taint>,
    pub capacity: ResourceList,
    pub allocatable: ResourceList,
    /// Karpenter's `Initialized`: ready, startup taints gone. Initialized nodes are tried
    /// first, and ephemeral boot taints are ignored on the others.
    pub initialized: bool,
    /// Extra requirements for capacity that has no labels yet (an in-flight NodeClaim
    /// whose instance type is still open); intersected with the labels.
    pub requirements: Option<Requirements>,
    /// `spec.unschedulable` (cordoned).
    pub unschedulable: bool,
    /// `spec.providerID` (`aws:///<zone>/<instance id>`): how a NodeClaim finds its node.
    pub provider_id: Option<String>,
    /// The `Ready` condition is true.
    pub ready: bool,
    /// `metadata.finalizers`.
    pub finalizers: Vec<String>,
    /// The NodeClaim its `ownerReferences` name (set at registration, as Karpenter does).
    pub owner_claim: Option<String>,
    /// `metadata.deletionTimestamp` is set: the node goes once its finalizers are removed.
    pub deleting: bool,
    /// The `karpenter.sh/do-not-disrupt: "true"` annotation (the only annotation the plane
    /// reads, so the others are not kept).
    pub do_not_disrupt: bool,
    /// `metadata.resourceVersion`: the precondition of a write made from this read.
    pub resource_version: u64,
}

impl Node {
    /// Whether the node is being disrupted: deleting, or tainted `karpenter.sh/disrupted` (a
    /// command holds it). Its pods are on their way elsewhere.
    pub fn is_disrupting(&self) -> bool {
        let taint = crate::plane::disrupted_taint();
        self.deleting || self.taints.iter().any(|t| t.key == taint.key && t.effect == taint.effect)
    }

    /// Karpenter's `Initialized`: a node a NodePool manages (`managed`: its label, or a
    /// NodeClaim owning it) once labelled `karpenter.sh/initialized=true`, which the lifecycle
    /// does once it is Ready with its startup and unregistered taints gone (until then it is
    /// capacity in flight, its boot taints ignored); a node no NodePool manages once Ready.
    pub fn initialized_by(labels: &Labels, ready: bool, managed: bool) -> bool {
        let labelled = labels.get(crate::labels::INITIALIZED).map(String::as_str);
        if managed { labelled == Some("true") } else { ready && labelled.is_none_or(|v| v == "true") }
    }

    /// The NodePool that owns the node, from its `karpenter.sh/nodepool` label.
    pub fn nodepool(&self) -> Option<&str> {
        self.labels.get(crate::labels::NODEPOOL).map(String::as_str)
    }

    /// The hostname domain of the node for topology: its hostname label, else its name.
    pub fn hostname(&self) -> &str {
        self.labels.get(crate::labels::HOSTNAME).map(String::as_str).unwrap_or(&self.name)
    }

    /// The node's requirements: its labels (plus hostname), narrowed by `requirements`.
    pub fn node_requirements(&self) -> Requirements {
        let mut r = self.labels.requirements().clone();
        if let Some(extra) = &self.requirements {
            r.add_all(extra);
        }
        r.add(crate::labels::HOSTNAME, Requirement::is_in([self.hostname()]));
        r
    }

    /// The taints that apply when simulating pods onto the node.
    pub fn effective_taints(&self) -> Vec<Taint> {
        let mut t: Vec<Taint> =
            self.taints.iter().filter(|t| self.initialized || !crate::taints::is_known_ephemeral(t)).cloned().collect();
        if self.unschedulable && !t.contains(&Taint::unschedulable()) {
            t.push(Taint::unschedulable());
        }
        t
    }
}

/// A node's labels, shared between copies of the node (every scheduling round copies every
/// node) and copied on the first write, with the requirements they make (`key In [value]`
/// per label) worked out once per version of the labels: a cluster of 2,000 nodes otherwise
/// rebuilt 2,000 maps of some 25 keys for every solve and every consolidation round.
#[derive(Clone, Default)]
pub struct NodeLabels(Arc<LabelsAndRequirements>);

#[derive(Clone, Default)]
struct LabelsAndRequirements {
    labels: Labels,
    requirements: OnceLock<Requirements>,
}

impl NodeLabels {
    /// `key In [value]` for every label (Karpenter's `NewLabelRequirements`).
    pub fn requirements(&self) -> &Requirements {
        self.0.requirements.get_or_init(|| Requirements::from_labels(&self.0.labels))
    }
}

impl Deref for NodeLabels {
    type Target = Labels;
    fn deref(&self) -> &Labels {
        &self.0.labels
    }
}

impl DerefMut for NodeLabels {
    /// Copies the labels first if another copy of the node shares them, and forgets the
    /// requirements worked out from them.
    fn deref_mut(&mut self) -> &mut Labels {
        let inner = Arc::make_mut(&mut self.0);
        inner.requirements = OnceLock::new();
        &mut inner.labels
    }
}

impl From<Labels> for NodeLabels {
    fn from(labels: Labels) -> Self {
        NodeLabels(Arc::new(LabelsAndRequirements { labels, requirements: OnceLock::new() }))
    }
}

impl<const N: usize> From<[(String, String); N]> for NodeLabels {
    fn from(labels: [(String, String); N]) -> Self {
        Labels::from(labels).into()
    }
}

impl FromIterator<(String, String)> for NodeLabels {
    fn from_iter<T: IntoIterator<Item = (String, String)>>(iter: T) -> Self {
        Labels::from_iter(iter).into()
    }
}

impl PartialEq for NodeLabels {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0) || self.0.labels == other.0.labels
    }
}

impl fmt::Debug for NodeLabels {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.labels.fmt(f)
    }
}

impl<'a> IntoIterator for &'a NodeLabels {
    type Item = (&'a String, &'a String);
    type IntoIter = std::collections::btree_map::Iter<'a, String, String>;
    fn into_iter(self) -> Self::IntoIter {
        self.0.labels.iter()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::labels;

    /// The requirements a node's labels make are worked out once and shared by its copies;
    /// writing a label (to the node or a copy) makes that node's own copy and forgets them, so
    /// they are never stale, and the other copy keeps its own.
    #[test]
    fn a_nodes_label_requirements_follow_every_write_to_its_labels() {
        let mut node = Node {
            name: "n".into(),
            labels: NodeLabels::from([(labels::ZONE.to_string(), "us-east-1a".to_string())]),
            ..Node::default()
        };
        let zone = |n: &Node| n.node_requirements().get(labels::ZONE).values().to_vec();
        assert_eq!(zone(&node), ["us-east-1a"]);
        let copy = node.clone();
        assert!(std::ptr::eq(node.labels.requirements(), copy.labels.requirements()), "worked out once for both");
        node.labels.insert(labels::ZONE.to_string(), "us-east-1b".to_string());
        assert_eq!(zone(&node), ["us-east-1b"]);
        assert_eq!(zone(&copy), ["us-east-1a"], "the copy keeps its labels and what they make");
        node.labels = NodeLabels::from([("team".to_string(), "a".to_string())]);
        assert!(!node.node_requirements().has(labels::ZONE));
        assert_eq!(node.node_requirements().get("team").values(), ["a"]);
        // The hostname is added as before: from the label when there is one, else the name.
        assert_eq!(node.node_requirements().get(labels::HOSTNAME).values(), ["n"]);
        // Equal labels are equal nodes' labels however they were built; the cache is no part
        // of it, and they print as the plain map.
        let built = |v: &str| NodeLabels::from([("team".to_string(), v.to_string())]);
        let (a, b) = (built("a"), built("a"));
        assert!(a.requirements().has("team"), "worked out on one side only");
        assert_eq!(a, b);
        assert_ne!(a, built("b"));
        assert_eq!(format!("{a:?}"), format!("{:?}", Labels::from([("team".to_string(), "a".to_string())])));
    }
}
