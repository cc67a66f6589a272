//! The controller's HTTP endpoints: `/healthz` and `/readyz` on the health address, `/metrics`
//! (Prometheus text) on the metrics address.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use dovetail_actors::errors::Errors;
use dovetail_cluster::ClusterView;
use dovetail_cluster::kube::KubeCluster;
use http_body_util::Full;
use hyper::body::Bytes;
use hyper::{Request, Response, StatusCode};

use super::agent::AgentStats;

/// What `/metrics` reports: the plane's series (Karpenter's and dovetail's, counted across
/// terms), the cluster's caches, the ledger's leadership.
#[derive(Default)]
pub struct Metrics {
    /// Every term's plane counts here.
    pub plane: Arc<dovetail_actors::metrics::Metrics>,
    errors: Mutex<Option<Arc<Errors>>>,
    agent: Mutex<AgentStats>,
    leadership: Mutex<Option<tokio::sync::watch::Receiver<dovetail_raft::Leadership>>>,
    /// Whether this control node leads (Karpenter's cluster-state gauges are the leader's).
    pub leading: Arc<AtomicBool>,
    /// With a replicated ledger: the replica, for its lease counts.
    raft: Mutex<Option<Arc<dovetail_raft::replicated::RaftLedger>>>,
}

impl Metrics {
    pub fn set_errors(&self, errors: Arc<Errors>) {
        *self.errors.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = Some(errors);
    }

    /// The ledger's leadership watch (`dovetail_ledger_leader`, `dovetail_ledger_term`); each
    /// new leader it shows after the first is a failover (`dovetail_ledger_failovers_total`).
    pub fn set_leadership(&self, watch: tokio::sync::watch::Receiver<dovetail_raft::Leadership>) {
        *self.leadership.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = Some(watch.clone());
        let plane = self.plane.clone();
        let leading = self.leading.clone();
        let mut watch = watch;
        actix_rt::spawn(async move {
            let mut last: Option<String> = None;
            loop {
                leading.store(watch.borrow().leader, Ordering::SeqCst);
                let leader = watch.borrow_and_update().leader_id.clone();
                if let Some(id) = leader {
                    if last.as_ref().is_some_and(|l| *l != id) {
                        plane.failover();
                    }
                    last = Some(id);
                }
                if watch.changed().await.is_err() {
                    return;
                }
            }
        });
    }

    /// The replicated ledger's replica (`dovetail_ledger_lease_lapses_total`).
    pub fn set_raft(&self, raft: Arc<dovetail_raft::replicated::RaftLedger>) {
        *self.raft.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = Some(raft);
    }

    pub fn set_agent(&self, stats: AgentStats) {
        *self.agent.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = stats;
    }

    fn render(&self, cluster: &KubeCluster) -> String {
        let mut out = self.plane.encode();
        out.push_str("# HELP dovetail_cluster_synced Whether every watch listed once (1) or not (0).\n");
        out.push_str("# TYPE dovetail_cluster_synced gauge\n");
        out.push_str(&format!("dovetail_cluster_synced {}\n", u8::from(cluster.synced())));
        out.push_str("# HELP dovetail_cluster_objects Objects in the controller's caches, by kind.\n");
        out.push_str("# TYPE dovetail_cluster_objects gauge\n");
        for (kind, n) in cluster.counts() {
            out.push_str(&format!("dovetail_cluster_objects{{kind=\"{kind}\"}} {n}\n"));
        }
        out.push_str(
            "# HELP dovetail_cluster_invalid_objects Objects that could not be used (an event names the field).\n",
        );
        out.push_str("# TYPE dovetail_cluster_invalid_objects gauge\n");
        out.push_str(&format!("dovetail_cluster_invalid_objects {}\n", cluster.invalid().len()));
        out.push_str("# HELP dovetail_cluster_watch_errors_total Watch errors, each retried with backoff.\n");
        out.push_str("# TYPE dovetail_cluster_watch_errors_total counter\n");
        for (kind, n) in cluster.watch_errors() {
            out.push_str(&format!("dovetail_cluster_watch_errors_total{{kind=\"{kind}\"}} {n}\n"));
        }
        out.push_str(
            "# HELP dovetail_cluster_throttled_total Writes the API server throttled (each paused the writes for its Retry-After).\n",
        );
        out.push_str("# TYPE dovetail_cluster_throttled_total counter\n");
        out.push_str(&format!("dovetail_cluster_throttled_total {}\n", cluster.throttles()));
        out.push_str(
            "# HELP dovetail_cluster_requests_total Requests made to the API server outside the watches (the writes and the reads they need).\n",
        );
        out.push_str("# TYPE dovetail_cluster_requests_total counter\n");
        out.push_str(&format!("dovetail_cluster_requests_total {}\n", cluster.requests()));
        let (leader, term) = self
            .leadership
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .as_ref()
            .map(|w| {
                let l = w.borrow();
                (u8::from(l.leader), l.term)
            })
            .unwrap_or((0, 0));
        out.push_str("# HELP dovetail_ledger_leader Whether this control node leads and acts (1) or not (0).\n");
        out.push_str("# TYPE dovetail_ledger_leader gauge\n");
        out.push_str(&format!("dovetail_ledger_leader {leader}\n"));
        out.push_str("# HELP dovetail_ledger_term The ledger's current term as this control node sees it.\n");
        out.push_str("# TYPE dovetail_ledger_term gauge\n");
        out.push_str(&format!("dovetail_ledger_term {term}\n"));
        let lease =
            self.raft.lock().unwrap_or_else(std::sync::PoisonError::into_inner).as_ref().map(|r| r.lease_stats());
        if let Some(lease) = lease {
            out.push_str(
                "# HELP dovetail_ledger_lease_lapses_total Times this control node's lease ran out while it led (no quorum heard for the lease: its effects paused).\n",
            );
            out.push_str("# TYPE dovetail_ledger_lease_lapses_total counter\n");
            out.push_str(&format!("dovetail_ledger_lease_lapses_total {}\n", lease.lapses));
        }
        let errors: BTreeMap<String, u64> = self
            .errors
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .as_ref()
            .map(|e| e.counts())
            .unwrap_or_default();
        out.push_str("# HELP dovetail_errors_total Errors the control plane met, by action and kind.\n");
        out.push_str("# TYPE dovetail_errors_total counter\n");
        for (key, n) in errors {
            let (action, kind) = key.split_once('/').unwrap_or((key.as_str(), ""));
            out.push_str(&format!("dovetail_errors_total{{action=\"{action}\",kind=\"{kind}\"}} {n}\n"));
        }
        let agent = self.agent.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone();
        out.push_str(
            "# HELP dovetail_sim_agent_writes_total API writes of the sim node agent (the kubelets' share).\n",
        );
        out.push_str("# TYPE dovetail_sim_agent_writes_total counter\n");
        for (what, n) in agent.writes {
            out.push_str(&format!("dovetail_sim_agent_writes_total{{write=\"{what}\"}} {n}\n"));
        }
        out
    }
}

fn reply(status: StatusCode, body: String) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = status;
    r
}

/// The Prometheus text format's content type.
const TEXT_FORMAT: &str = "text/plain; version=0.0.4; charset=utf-8";

fn scrape(body: String) -> Response<Full<Bytes>> {
    let mut r = reply(StatusCode::OK, body);
    r.headers_mut().insert(hyper::header::CONTENT_TYPE, hyper::header::HeaderValue::from_static(TEXT_FORMAT));
    r
}

/// Serves `route` on `addr` until the process ends.
async fn serve<F>(addr: SocketAddr, what: &'static str, route: F) -> Result<(), String>
where
    F: Fn(&str) -> Response<Full<Bytes>> + Clone + 'static,
{
    let listener =
        tokio::net::TcpListener::bind(addr).await.map_err(|e| format!("cannot serve {what} on {addr}: {e}"))?;
    tracing::info!(%addr, "serving {what}");
    actix_rt::spawn(async move {
        loop {
            let stream = match listener.accept().await {
                Ok((s, _)) => s,
                Err(e) => {
                    tracing::warn!(error = %e, "{what}: accept failed");
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                    continue;
                }
            };
            let route = route.clone();
            let svc = hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
                let resp = route(req.uri().path());
                async move { Ok::<_, std::convert::Infallible>(resp) }
            });
            actix_rt::spawn(async move {
                let io = hyper_util::rt::TokioIo::new(stream);
                if let Err(e) = hyper::server::conn::http1::Builder::new().serve_connection(io, svc).await {
                    tracing::debug!(error = %e, "{what}: connection ended with an error");
                }
            });
        }
    });
    Ok(())
}

/// `/healthz`: live while the process serves; `/readyz`: once the caches synced.
pub async fn serve_health(addr: SocketAddr, ready: Arc<AtomicBool>) -> Result<(), String> {
    serve(addr, "health", move |path| match path {
        "/healthz" => reply(StatusCode::OK, "ok\n".into()),
        "/readyz" if ready.load(Ordering::SeqCst) => reply(StatusCode::OK, "ok\n".into()),
        "/readyz" => reply(StatusCode::SERVICE_UNAVAILABLE, "caches not synced\n".into()),
        _ => reply(StatusCode::NOT_FOUND, "not found\n".into()),
    })
    .await
}

/// `/metrics`.
pub async fn serve_metrics(addr: SocketAddr, metrics: Arc<Metrics>, cluster: Arc<KubeCluster>) -> Result<(), String> {
    serve(addr, "metrics", move |path| match path {
        "/metrics" => scrape(metrics.render(&cluster)),
        _ => reply(StatusCode::NOT_FOUND, "not found\n".into()),
    })
    .await
}

/// `/metrics` of a plane with no controller around it (`simulate`, `loadtest`).
pub async fn serve_plane_metrics(
    addr: SocketAddr,
    metrics: Arc<dovetail_actors::metrics::Metrics>,
) -> Result<(), String> {
    serve(addr, "metrics", move |path| match path {
        "/metrics" => scrape(metrics.encode()),
        _ => reply(StatusCode::NOT_FOUND, "not found\n".into()),
    })
    .await
}
