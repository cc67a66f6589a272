//! The cloud and the ledger as the plane calls them: every call timed and counted
//! (`karpenter_cloudprovider_*`, `dovetail_ledger_*`), and a proposal made inside a traced
//! decision gets a `ledger.propose` span in that decision's trace.

use std::sync::Arc;
use std::time::Duration;

use dovetail_core::clock::Clock;

use dovetail_cloud::{BoxFuture, CloudError, CloudProvider, DriftReason, Instance, LaunchRequest, Lookup, NodeClass};
use dovetail_core::catalog::InstanceType;
use dovetail_core::ledger::{Entry, State};
use dovetail_raft::{Committed, Leadership, Ledger, LedgerError};
use tracing::Instrument;

use super::Metrics;

/// A cloud provider whose calls are timed and counted.
pub struct MeteredCloud {
    inner: Arc<dyn CloudProvider>,
    provider: &'static str,
    metrics: Arc<Metrics>,
    clock: Arc<dyn Clock>,
}

impl MeteredCloud {
    /// `provider` is Karpenter's `provider` label (`aws`, or `sim` for the simulated cloud).
    pub fn new(
        inner: Arc<dyn CloudProvider>,
        provider: &'static str,
        metrics: Arc<Metrics>,
        clock: Arc<dyn Clock>,
    ) -> Self {
        MeteredCloud { inner, provider, metrics, clock }
    }

    fn done<T>(&self, method: &str, start: Duration, result: &Result<T, CloudError>) {
        let error = result.as_ref().err().map(error_label);
        self.metrics.cloud_call(method, self.provider, self.clock.now().saturating_sub(start).as_secs_f64(), error);
    }

    /// A call made for several NodeClaims at once (a fleet, a batch of terminations): one
    /// observation per item, as Karpenter's calls are one per NodeClaim, each with the call's
    /// duration (every item waited for it) and its own error.
    fn done_each<T>(&self, method: &str, start: Duration, results: &[Result<T, CloudError>]) {
        let seconds = self.clock.now().saturating_sub(start).as_secs_f64();
        for r in results {
            self.metrics.cloud_call(method, self.provider, seconds, r.as_ref().err().map(error_label));
        }
    }
}

/// Karpenter's `error` label: its three well-known provider errors by their type names; the
/// others (Karpenter's empty default) by dovetail's kind (`throttled`, `invalid`, ...).
fn error_label(e: &CloudError) -> &'static str {
    match e {
        CloudError::InsufficientCapacity { .. } => "InsufficientCapacityError",
        CloudError::NotFound { .. } => "NodeClaimNotFoundError",
        CloudError::NodeClassNotReady { .. } => "NodeClassNotReadyError",
        other => other.kind(),
    }
}

impl CloudProvider for MeteredCloud {
    fn launch<'a>(&'a self, requests: &'a [LaunchRequest]) -> BoxFuture<'a, Vec<Result<Instance, CloudError>>> {
        Box::pin(async move {
            let start = self.clock.now();
            let out = self.inner.launch(requests).await;
            self.done_each("Create", start, &out);
            for (r, result) in requests.iter().zip(&out) {
                if let Err(e) = result {
                    let capacity = r.capacity_types.iter().map(ToString::to_string).collect::<Vec<_>>().join(",");
                    self.metrics.launch_failed(&r.zone, &capacity, e.kind());
                }
            }
            out
        })
    }

    fn find<'a>(&'a self, lookups: &'a [Lookup]) -> BoxFuture<'a, Vec<Result<Option<Instance>, CloudError>>> {
        Box::pin(async move {
            let start = self.clock.now();
            let out = self.inner.find(lookups).await;
            self.done_each("Get", start, &out);
            out
        })
    }

    fn terminate<'a>(&'a self, ids: &'a [String]) -> BoxFuture<'a, Vec<Result<(), CloudError>>> {
        Box::pin(async move {
            let start = self.clock.now();
            let out = self.inner.terminate(ids).await;
            // A terminate of an instance already gone is a success.
            let counted: Vec<Result<(), CloudError>> = out
                .iter()
                .map(|r| match r {
                    Err(CloudError::NotFound { .. }) | Ok(()) => Ok(()),
                    Err(e) => Err(e.clone()),
                })
                .collect();
            self.done_each("Delete", start, &counted);
            out
        })
    }

    fn get<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<Instance, CloudError>> {
        Box::pin(async move {
            let start = self.clock.now();
            let out = self.inner.get(id).await;
            self.done("Get", start, &out);
            out
        })
    }

    fn list(&self) -> BoxFuture<'_, Result<Vec<Instance>, CloudError>> {
        Box::pin(async move {
            let start = self.clock.now();
            let out = self.inner.list().await;
            self.done("List", start, &out);
            out
        })
    }

    fn instance_types<'a>(&'a self, node_class: &'a NodeClass) -> BoxFuture<'a, Result<Vec<InstanceType>, CloudError>> {
        Box::pin(async move {
            let start = self.clock.now();
            let out = self.inner.instance_types(node_class).await;
            self.done("GetInstanceTypes", start, &out);
            out
        })
    }

    fn is_drifted<'a>(
        &'a self,
        instance: &'a Instance,
        node_class: &'a NodeClass,
    ) -> BoxFuture<'a, Result<Option<DriftReason>, CloudError>> {
        Box::pin(async move {
            let start = self.clock.now();
            let out = self.inner.is_drifted(instance, node_class).await;
            self.done("IsDrifted", start, &out);
            out
        })
    }
}

/// A ledger whose proposals are timed and counted, and traced inside a traced decision.
pub struct MeteredLedger {
    inner: Arc<dyn Ledger>,
    metrics: Arc<Metrics>,
    clock: Arc<dyn Clock>,
}

impl MeteredLedger {
    pub fn new(inner: Arc<dyn Ledger>, metrics: Arc<Metrics>, clock: Arc<dyn Clock>) -> Self {
        MeteredLedger { inner, metrics, clock }
    }
}

impl Ledger for MeteredLedger {
    fn propose(&self, entry: Entry) -> BoxFuture<'_, Result<Committed, LedgerError>> {
        let command = entry.command.name();
        let term = entry.term;
        Box::pin(async move {
            // Only inside a decision's span (where the proposal is awaited): a proposal of no
            // decision starts no trace.
            let span = if tracing::Span::current().is_none() {
                tracing::Span::none()
            } else {
                tracing::info_span!("ledger.propose", command, raft.term = term, raft.index = tracing::field::Empty)
            };
            let start = self.clock.now();
            let out = self.inner.propose(entry).instrument(span.clone()).await;
            let seconds = self.clock.now().saturating_sub(start).as_secs_f64();
            match &out {
                Ok(c) => {
                    span.record("raft.index", c.index);
                    self.metrics.proposal(command, "committed", seconds, Some(c.index));
                }
                Err(LedgerError::NotLeader { .. }) => self.metrics.proposal(command, "not_leader", seconds, None),
                Err(LedgerError::Unavailable { .. }) => self.metrics.proposal(command, "unavailable", seconds, None),
            }
            out
        })
    }

    fn read<'a>(&'a self, f: Box<dyn FnOnce(&State) + Send + 'a>) -> BoxFuture<'a, Result<(), LedgerError>> {
        self.inner.read(f)
    }

    fn leadership(&self) -> tokio::sync::watch::Receiver<Leadership> {
        self.inner.leadership()
    }
}
