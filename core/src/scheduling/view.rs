//! The scheduler's working copy of a pod's constraints, which preference relaxation
//! narrows one step at a time (Karpenter relaxes a deep copy of the pod), and the data
//! derived from it.

use crate::labels::Labels;
use crate::pod::{self, Pod, PodAffinity, TopologySpreadConstraint, WhenUnsatisfiable};
use crate::requirements::Requirements;
use crate::resources::ResourceList;
use crate::shared::Shared;
use crate::taints::{Effect, Toleration, TolerationOp};

use super::input::PreferencePolicy;

/// The relaxable constraints of one pod.
#[derive(Clone, Debug)]
pub struct PodView {
    pub node_selector: Shared<Labels>,
    pub required_terms: Vec<Requirements>,
    pub preferred_terms: Vec<(i32, Requirements)>,
    pub affinity: Shared<PodAffinity>,
    pub anti_affinity: Shared<PodAffinity>,
    pub tolerations: Shared<Vec<Toleration>>,
    pub spread: Shared<Vec<TopologySpreadConstraint>>,
}

impl PodView {
    /// The pod's constraints as written.
    pub fn new(pod: &Pod) -> Self {
        PodView {
            node_selector: pod.node_selector.clone(),
            required_terms: pod.node_affinity.required.clone(),
            preferred_terms: pod.node_affinity.preferred.clone(),
            affinity: pod.pod_affinity.clone(),
            anti_affinity: pod.pod_anti_affinity.clone(),
            tolerations: pod.tolerations.clone(),
            spread: pod.topology_spread.clone(),
        }
    }

    /// Requirements on the node: selector, first required term and, unless preferences
    /// are ignored, the heaviest preferred term.
    pub fn requirements(&self, with_preferred: bool) -> Requirements {
        let affinity =
            pod::NodeAffinity { required: self.required_terms.clone(), preferred: self.preferred_terms.clone() };
        pod::pod_requirements(&self.node_selector, &affinity, with_preferred)
    }

    /// Removes one preference, in Karpenter's order, returning what was relaxed; `None`
    /// when nothing is left to relax.
    pub fn relax(&mut self, tolerate_prefer_no_schedule: bool) -> Option<&'static str> {
        if self.required_terms.len() > 1 {
            self.required_terms.remove(0);
            return Some("spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution[0]");
        }
        if remove_heaviest(&mut self.affinity.preferred) {
            return Some("spec.affinity.podAffinity.preferredDuringSchedulingIgnoredDuringExecution[0]");
        }
        if remove_heaviest(&mut self.anti_affinity.preferred) {
            return Some("spec.affinity.podAntiAffinity.preferredDuringSchedulingIgnoredDuringExecution[0]");
        }
        if remove_heaviest(&mut self.preferred_terms) {
            return Some("spec.affinity.nodeAffinity.preferredDuringSchedulingIgnoredDuringExecution[0]");
        }
        if let Some(i) = self.spread.iter().position(|t| t.when_unsatisfiable == WhenUnsatisfiable::ScheduleAnyway) {
            self.spread.swap_remove(i);
            return Some("spec.topologySpreadConstraints (ScheduleAnyway)");
        }
        if tolerate_prefer_no_schedule {
            let t = Toleration {
                key: String::new(),
                op: TolerationOp::Exists,
                value: String::new(),
                effect: Some(Effect::PreferNoSchedule),
            };
            if !self.tolerations.contains(&t) {
                self.tolerations.push(t);
                return Some("toleration for PreferNoSchedule taints");
            }
        }
        None
    }
}

/// Removes the heaviest term (stable order among equal weights); false if there is none.
fn remove_heaviest<T>(terms: &mut Vec<(i32, T)>) -> bool {
    if terms.is_empty() {
        return false;
    }
    terms.sort_by_key(|t| std::cmp::Reverse(t.0));
    terms.remove(0);
    true
}

/// What the scheduler derives from a view (Karpenter's `PodData`).
#[derive(Clone, Debug)]
pub struct PodData {
    /// Requests plus `pods: 1`.
    pub requests: ResourceList,
    /// With the heaviest preferred node affinity term, unless preferences are ignored.
    pub requirements: Requirements,
    /// Without preferences: used for topology domains.
    pub strict_requirements: Requirements,
}

impl PodData {
    /// Derives the data of a view.
    pub fn new(pod: &Pod, view: &PodView, policy: PreferencePolicy) -> Self {
        let strict = view.requirements(false);
        let requirements = match policy {
            PreferencePolicy::Respect if !view.preferred_terms.is_empty() => view.requirements(true),
            _ => strict.clone(),
        };
        PodData { requests: pod.requests_with_pod_slot(), requirements, strict_requirements: strict }
    }
}
