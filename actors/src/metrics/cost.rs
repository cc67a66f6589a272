//! R of the live fleet (`dovetail_fleet_cost_ratio`): what the launched claims cost per hour
//! over the lower bound of what the pods running on them need from the pools (goals.md's measure of
//! packing, here read from the running cluster). The bound is a solve over every pod, so it is
//! computed on a period off the actors' thread, not at each scrape.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use dovetail_cluster::ClusterView;
use dovetail_core::labels;
use dovetail_core::ledger::ClaimState;
use dovetail_core::pod::Pod;
use dovetail_core::scheduling::{self, PoolInput};
use dovetail_raft::{Ledger, read_with};

use super::Metrics;

/// The pools as the plane routes to them, shared with the task that prices the fleet.
pub type Pools = Arc<Mutex<BTreeMap<String, PoolInput>>>;

/// R: `price_per_hour` over the bound of `pods` on `pools`; `None` without pods or a bound.
pub fn ratio(pools: Vec<PoolInput>, daemonsets: Vec<Pod>, pods: &[Pod], price_per_hour: f64) -> Option<f64> {
    if pods.is_empty() || pools.is_empty() {
        return None;
    }
    let input = scheduling::Snapshot { nodepools: pools, daemonsets, ..scheduling::Snapshot::default() };
    let all: Vec<usize> = (0..pods.len()).collect();
    let lb = scheduling::lower_bound(&input, pods, &all);
    (lb.value > 0.0).then(|| price_per_hour / lb.value)
}

/// Every `every`, once the view has synced: the launched claims' price and the bound of the
/// pods bound to the NodePools' nodes, into `dovetail_fleet_cost_ratio`.
pub async fn follow_cost(
    view: Arc<dyn ClusterView>,
    ledger: Arc<dyn Ledger>,
    pools: Pools,
    metrics: Arc<Metrics>,
    every: Duration,
) {
    loop {
        tokio::time::sleep(every).await;
        if !view.synced() {
            continue;
        }
        let price = read_with(ledger.as_ref(), |st| {
            st.claims()
                .values()
                .filter(|c| {
                    matches!(
                        c.state,
                        ClaimState::Launched { .. } | ClaimState::Registered { .. } | ClaimState::Initialized { .. }
                    )
                })
                .map(|c| c.price_per_hour as f64 / 1e6)
                .sum::<f64>()
        })
        .await;
        let Ok(price) = price else { continue };
        let snap = view.snapshot();
        let pools: Vec<PoolInput> =
            pools.lock().unwrap_or_else(std::sync::PoisonError::into_inner).values().cloned().collect();
        let daemonsets: Vec<Pod> = snap.daemonsets.values().map(|p| p.as_ref().clone()).collect();
        // The pods the fleet runs: bound to nodes of dovetail's NodePools.
        let managed = |node: &str| snap.nodes.get(node).is_some_and(|n| n.labels.contains_key(labels::NODEPOOL));
        let pods: Vec<Pod> = snap
            .pods
            .values()
            .filter(|p| !p.terminal && p.node_name.as_deref().is_some_and(managed))
            .map(|p| p.as_ref().clone())
            .collect();
        drop(snap);
        let r = tokio::task::spawn_blocking(move || ratio(pools, daemonsets, &pods, price)).await;
        match r {
            Ok(Some(r)) => metrics.set_cost_ratio(r),
            // No pods on the fleet: no ratio (0, as before the first reading).
            Ok(None) => metrics.set_cost_ratio(0.0),
            Err(e) => tracing::warn!(error = %e, "metrics: pricing the fleet failed"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dovetail_core::catalog::{Catalog, NodeClassSettings};
    use dovetail_core::nodepool::NodePool;
    use dovetail_core::requirements::Requirements;
    use dovetail_core::resources::ResourceList;

    #[test]
    fn r_is_the_price_over_the_bound_and_twice_the_bound_is_two() {
        let Ok(catalog) = Catalog::embedded("us-east-1") else { panic!("the embedded catalog") };
        let types = Arc::new(catalog.instance_types(&NodeClassSettings::default(), None));
        let pools = vec![PoolInput { pool: NodePool::new("default", Requirements::new()), instance_types: types }];
        let pods: Vec<Pod> = (0..20)
            .map(|i| Pod {
                key: dovetail_core::pod::PodKey::new("default", &format!("p{i}")),
                requests: ResourceList::cpu_mem(1_000, 1 << 30),
                ..Pod::default()
            })
            .collect();
        assert_eq!(ratio(pools.clone(), Vec::new(), &[], 1.0), None, "no pods, no R");
        let bound = {
            let input = scheduling::Snapshot { nodepools: pools.clone(), ..scheduling::Snapshot::default() };
            scheduling::lower_bound(&input, &pods, &(0..pods.len()).collect::<Vec<_>>()).value
        };
        assert!(bound > 0.0);
        let r = ratio(pools, Vec::new(), &pods, 2.0 * bound).unwrap_or_default();
        assert!((r - 2.0).abs() < 1e-9, "{r}");
    }
}
