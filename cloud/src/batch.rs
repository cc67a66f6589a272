//! Launch merging across calls: launches arriving within a short window go to the provider as
//! one call, where identical requests share one CreateFleet (Karpenter's fleet batcher: 35 ms
//! idle, 1 s at most, 1,000 requests).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::oneshot;

use crate::{BoxFuture, CloudError, CloudProvider, DriftReason, Instance, LaunchRequest, Lookup, NodeClass};

/// When a batch is sent.
#[derive(Clone, Debug, PartialEq)]
pub struct BatchWindow {
    /// Sent once no launch arrived for this long.
    pub idle: Duration,
    /// Sent at the latest this long after its first launch.
    pub max: Duration,
    /// Sent at once when it holds this many requests.
    pub max_requests: usize,
}

impl Default for BatchWindow {
    fn default() -> Self {
        BatchWindow { idle: Duration::from_millis(35), max: Duration::from_secs(1), max_requests: 1000 }
    }
}

type Reply = oneshot::Sender<Vec<Result<Instance, CloudError>>>;

#[derive(Default)]
struct Pending {
    requests: Vec<LaunchRequest>,
    /// (number of requests, where to send their results), in arrival order.
    callers: Vec<(usize, Reply)>,
    /// Bumped by every arrival; the flusher waits until it stops moving.
    arrivals: u64,
    /// A flusher task is waiting on this batch.
    open: bool,
}

/// A provider whose launches are merged across concurrent calls. Everything else passes through.
pub struct Batched {
    inner: Arc<dyn CloudProvider>,
    window: BatchWindow,
    pending: Arc<Mutex<Pending>>,
}

impl Batched {
    pub fn new(inner: Arc<dyn CloudProvider>, window: BatchWindow) -> Self {
        Batched { inner, window, pending: Arc::new(Mutex::new(Pending::default())) }
    }

    fn lock(p: &Mutex<Pending>) -> std::sync::MutexGuard<'_, Pending> {
        p.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Waits out the window, then sends the batch as one call and hands each caller its results.
    async fn flush(inner: Arc<dyn CloudProvider>, pending: Arc<Mutex<Pending>>, window: BatchWindow) {
        // Time is counted in idle spans waited, not read from a clock.
        let mut waited = std::time::Duration::ZERO;
        loop {
            let seen = Batched::lock(&pending).arrivals;
            tokio::time::sleep(window.idle).await;
            waited += window.idle;
            let p = Batched::lock(&pending);
            if p.arrivals == seen || p.requests.len() >= window.max_requests || waited >= window.max {
                break;
            }
        }
        let (requests, callers) = {
            let mut p = Batched::lock(&pending);
            p.open = false;
            (std::mem::take(&mut p.requests), std::mem::take(&mut p.callers))
        };
        let mut results = inner.launch(&requests).await.into_iter();
        for (n, reply) in callers {
            let mine: Vec<_> = results.by_ref().take(n).collect();
            // A caller that went away does not need its results; its claims' instances are
            // found by their tags when it (or a new leader) launches them again.
            if let Err(lost) = reply.send(mine) {
                tracing::debug!(results = lost.len(), "a launch caller went away before its results");
            }
        }
    }
}

impl CloudProvider for Batched {
    fn name(&self) -> &'static str {
        self.inner.name()
    }

    fn launch<'a>(&'a self, requests: &'a [LaunchRequest]) -> BoxFuture<'a, Vec<Result<Instance, CloudError>>> {
        Box::pin(async move {
            let (tx, rx) = oneshot::channel();
            let start_flusher = {
                let mut p = Batched::lock(&self.pending);
                p.requests.extend_from_slice(requests);
                p.callers.push((requests.len(), tx));
                p.arrivals += 1;
                !std::mem::replace(&mut p.open, true)
            };
            if start_flusher {
                tokio::spawn(Batched::flush(self.inner.clone(), self.pending.clone(), self.window.clone()));
            }
            match rx.await {
                Ok(r) if r.len() == requests.len() => r,
                _ => requests
                    .iter()
                    .map(|_| Err(CloudError::Transient { message: "launch batch ended without a result".into() }))
                    .collect(),
            }
        })
    }

    fn find<'a>(&'a self, lookups: &'a [Lookup]) -> BoxFuture<'a, Vec<Result<Option<Instance>, CloudError>>> {
        self.inner.find(lookups)
    }

    fn terminate<'a>(&'a self, ids: &'a [String]) -> BoxFuture<'a, Vec<Result<(), CloudError>>> {
        self.inner.terminate(ids)
    }

    fn get<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<Instance, CloudError>> {
        self.inner.get(id)
    }

    fn list(&self) -> BoxFuture<'_, Result<Vec<Instance>, CloudError>> {
        self.inner.list()
    }

    fn instance_types<'a>(
        &'a self,
        node_class: &'a NodeClass,
    ) -> BoxFuture<'a, Result<Vec<dovetail_core::catalog::InstanceType>, CloudError>> {
        self.inner.instance_types(node_class)
    }

    fn is_drifted<'a>(
        &'a self,
        instance: &'a Instance,
        node_class: &'a NodeClass,
    ) -> BoxFuture<'a, Result<Option<DriftReason>, CloudError>> {
        self.inner.is_drifted(instance, node_class)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::{SimCloud, SimConfig};
    use dovetail_core::catalog::{CapacityType, Catalog, NodeClassSettings};
    use dovetail_core::clock::ManualClock;
    use std::collections::BTreeMap;

    fn request(claim: &str, zone: &str) -> LaunchRequest {
        LaunchRequest {
            claim: claim.into(),
            batch: dovetail_core::ledger::LaunchBatch { id: "batch-1".into(), claims: vec![claim.to_string()].into() },
            nodepool: "default".into(),
            node_class: NodeClass { name: "default".into(), hash: "h".into(), ..Default::default() },
            zone: zone.into(),
            instance_types: vec!["m5.large".into(), "m5.xlarge".into()],
            capacity_types: vec![CapacityType::OnDemand],
            labels: BTreeMap::new(),
            tags: BTreeMap::new(),
        }
    }

    #[tokio::test]
    async fn concurrent_identical_launches_become_one_fleet_call() {
        let c = Catalog::embedded("us-east-1").expect("catalog");
        let sim = Arc::new(SimCloud::new(
            SimConfig::default(),
            Arc::new(c.instance_types(&NodeClassSettings::default(), None)),
            Arc::new(ManualClock::new()),
        ));
        let batched = Arc::new(Batched::new(sim.clone(), BatchWindow::default()));
        let mut tasks = Vec::new();
        for i in 0..50 {
            let b = batched.clone();
            let zone = if i < 40 { "us-east-1a" } else { "us-east-1b" };
            let r = request(&format!("claim-{i}"), zone);
            tasks.push(tokio::spawn(async move { b.launch(std::slice::from_ref(&r)).await }));
        }
        let mut ids = Vec::new();
        for t in tasks {
            let mut r = t.await.expect("task");
            assert_eq!(r.len(), 1);
            let inst = r.remove(0).expect("launched");
            ids.push(inst.id);
        }
        ids.sort();
        ids.dedup();
        assert_eq!(ids.len(), 50, "every claim has its own instance");
        assert_eq!(sim.stats().fleet_calls, 2, "one call per zone");
    }
}
