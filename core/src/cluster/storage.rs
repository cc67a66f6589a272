//! Storage as volume topology reads it: claims, volumes and classes.

use std::collections::BTreeMap;

use crate::pod::Pod;
use crate::requirements::Requirements;

/// A PersistentVolumeClaim as volume topology reads it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct VolumeClaim {
    /// `spec.volumeName`: the PersistentVolume it is bound to.
    pub volume_name: Option<String>,
    /// `spec.storageClassName` (empty: statically provisioned, no class).
    pub storage_class: Option<String>,
}

/// Why a pod's volumes cannot be placed (Karpenter does not provision for such a pod).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum VolumeError {
    #[error("PersistentVolumeClaim {claim} not found")]
    ClaimNotFound { claim: String },
    #[error("PersistentVolume {volume} of PersistentVolumeClaim {claim} not found")]
    VolumeNotFound { volume: String, claim: String },
    #[error("StorageClass {class} of PersistentVolumeClaim {claim} not found")]
    ClassNotFound { class: String, claim: String },
    #[error("the topologies of PersistentVolumeClaim {claim} and the pod's other volumes do not overlap")]
    Disjoint { claim: String },
}

/// The most topology alternatives a pod's volumes are expanded into.
pub const MAX_VOLUME_ALTERNATIVES: usize = 16;

/// Storage as volume topology reads it (Karpenter's `VolumeTopology`): a bound claim's
/// PersistentVolume must be reachable from the node (its node affinity), an unbound claim's
/// volume will be created where its StorageClass allows (`allowedTopologies`).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Storage {
    /// PersistentVolumeClaims by `namespace/name`.
    pub claims: BTreeMap<String, VolumeClaim>,
    /// PersistentVolumes by name: the terms of `spec.nodeAffinity.required` (one must hold).
    pub volumes: BTreeMap<String, Vec<Requirements>>,
    /// StorageClasses by name: the terms of `allowedTopologies` (one must hold).
    pub classes: BTreeMap<String, Vec<Requirements>>,
}

impl Storage {
    /// The topology alternatives of `pod`'s volumes: one term of each volume, intersected, for
    /// every choice that is satisfiable (at most [`MAX_VOLUME_ALTERNATIVES`], in term order).
    /// Every term is tried, the first first. Empty when no volume constrains the node. An
    /// error names what is missing (a claim, its volume or its class), as Karpenter does not
    /// provision for such a pod.
    pub fn requirements(&self, pod: &Pod) -> Result<Vec<Requirements>, VolumeError> {
        let mut alternatives = vec![Requirements::new()];
        for name in &pod.volume_claims {
            let id = format!("{}/{name}", pod.key.namespace);
            let claim = self.claims.get(&id).ok_or_else(|| VolumeError::ClaimNotFound { claim: id.clone() })?;
            let terms = match (&claim.volume_name, claim.storage_class.as_deref()) {
                (Some(volume), _) => self
                    .volumes
                    .get(volume)
                    .ok_or_else(|| VolumeError::VolumeNotFound { volume: volume.clone(), claim: id.clone() })?,
                (None, None | Some("")) => continue,
                (None, Some(class)) => self
                    .classes
                    .get(class)
                    .ok_or_else(|| VolumeError::ClassNotFound { class: class.to_string(), claim: id.clone() })?,
            };
            if terms.is_empty() {
                continue;
            }
            let mut next = Vec::new();
            for base in &alternatives {
                for term in terms {
                    if next.len() >= MAX_VOLUME_ALTERNATIVES {
                        break;
                    }
                    if base.intersects_ok(term) {
                        let mut r = base.clone();
                        r.add_all(term);
                        next.push(r);
                    }
                }
            }
            if next.is_empty() {
                return Err(VolumeError::Disjoint { claim: id });
            }
            alternatives = next;
        }
        Ok(if alternatives.iter().all(Requirements::is_empty) { Vec::new() } else { alternatives })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::ResourceList;

    fn zone_terms(zones: &[&str]) -> Vec<Requirements> {
        zones
            .iter()
            .map(|z| {
                let mut r = Requirements::new();
                r.add(crate::labels::ZONE, crate::requirements::Requirement::is_in([*z]));
                r
            })
            .collect()
    }

    #[test]
    fn volume_topology_intersects_each_volume_and_names_what_is_missing() {
        let mut storage = Storage::default();
        storage.claims.insert("db/data".into(), VolumeClaim { volume_name: Some("pv-1".into()), storage_class: None });
        storage.claims.insert("db/logs".into(), VolumeClaim { volume_name: None, storage_class: Some("gp3".into()) });
        storage
            .claims
            .insert("db/static".into(), VolumeClaim { volume_name: None, storage_class: Some(String::new()) });
        storage.volumes.insert("pv-1".into(), zone_terms(&["us-west-2a", "us-west-2b"]));
        storage.classes.insert("gp3".into(), zone_terms(&["us-west-2b", "us-west-2c"]));
        let mut pod = Pod::new("db", "db-0", ResourceList::new());
        assert_eq!(storage.requirements(&pod), Ok(Vec::new()), "no volumes, no constraint");

        pod.volume_claims = vec!["data".into()];
        let alts = storage.requirements(&pod).expect("resolves");
        assert_eq!(alts, zone_terms(&["us-west-2a", "us-west-2b"]), "either term of the volume, in order");

        pod.volume_claims = vec!["data".into(), "logs".into(), "static".into()];
        let alts = storage.requirements(&pod).expect("resolves");
        assert_eq!(alts, zone_terms(&["us-west-2b"]), "only the zone both volumes reach");

        storage.classes.insert("gp3".into(), zone_terms(&["us-west-2c"]));
        let e = storage.requirements(&pod).expect_err("disjoint");
        assert_eq!(e, VolumeError::Disjoint { claim: "db/logs".into() });
        assert!(e.to_string().contains("db/logs") && e.to_string().contains("do not overlap"), "{e}");

        pod.volume_claims = vec!["missing".into()];
        assert_eq!(storage.requirements(&pod), Err(VolumeError::ClaimNotFound { claim: "db/missing".into() }));
        assert_eq!(
            storage.requirements(&pod).map_err(|e| e.to_string()),
            Err("PersistentVolumeClaim db/missing not found".into())
        );
        storage
            .claims
            .insert("db/orphan".into(), VolumeClaim { volume_name: Some("pv-9".into()), storage_class: None });
        pod.volume_claims = vec!["orphan".into()];
        assert_eq!(
            storage.requirements(&pod),
            Err(VolumeError::VolumeNotFound { volume: "pv-9".into(), claim: "db/orphan".into() })
        );
        storage.claims.insert("db/classy".into(), VolumeClaim { volume_name: None, storage_class: Some("io2".into()) });
        pod.volume_claims = vec!["classy".into()];
        assert_eq!(
            storage.requirements(&pod),
            Err(VolumeError::ClassNotFound { class: "io2".into(), claim: "db/classy".into() })
        );
    }
}
