//! A sim fleet rebuilt after a restart of the process that held it (`dovetail controller
//! --cloud sim`): the cluster's Nodes and NodeClaims remember the instances.

use std::collections::BTreeMap;
use std::sync::Arc;

use dovetail_core::catalog::CapacityType;
use dovetail_core::labels::Labels;

use super::{RequestShape, SimCloud, SimInstance};

/// An instance the sim made before a restart, as the cluster remembers it.
#[derive(Clone, Debug, PartialEq)]
pub struct Restored {
    pub id: String,
    pub claim: String,
    pub nodepool: String,
    pub instance_type: String,
    pub zone: String,
    pub capacity_type: CapacityType,
    /// The labels its launch request carried (the NodeClaim's).
    pub labels: Labels,
}

impl SimCloud {
    /// Rebuilds instances the sim made before a restart (from the Nodes and NodeClaims a
    /// cluster shows), running and tagged with their claim. An id that is there already, or
    /// a type the catalog does not know, is skipped; returns how many were restored.
    pub fn restore(&self, instances: &[Restored]) -> usize {
        let now = self.clock.now();
        let mut s = self.lock();
        let mut n = 0;
        for r in instances {
            let Some(&t) = self.index.get(&r.instance_type) else { continue };
            if s.instances.contains_key(&r.id) || s.by_claim.contains_key(&r.claim) {
                continue;
            }
            let price = self.types[t]
                .offerings
                .iter()
                .find(|o| o.zone == r.zone && o.capacity_type == r.capacity_type)
                .map_or(0.0, |o| o.price);
            let batch = format!("restored-{}", r.claim);
            let request = Arc::new(RequestShape {
                nodepool: r.nodepool.clone(),
                labels: r.labels.clone(),
                tags: BTreeMap::new(),
                node_class_hash: String::new(),
            });
            let image = s.image.clone();
            s.by_claim.insert(r.claim.clone(), r.id.clone());
            s.by_batch.entry(batch.clone()).or_default().push(r.id.clone());
            s.instances.insert(
                r.id.clone(),
                SimInstance {
                    id: r.id.clone(),
                    claim: Some(r.claim.clone()),
                    batch,
                    instance_type: t,
                    zone: r.zone.clone(),
                    capacity_type: r.capacity_type,
                    price,
                    launched_at: now,
                    ready_at: now,
                    request,
                    image,
                },
            );
            n += 1;
        }
        n
    }
}
