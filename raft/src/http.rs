//! Raft's messages over HTTP between control-node processes, on each node's Raft address.
//!
//! `POST /raft/v1` with a JSON [`Rpc`] body answers a JSON [`RpcReply`]. Every request
//! carries the group's shared secret (`Authorization: Bearer SECRET`, at least
//! [`MIN_SECRET`] bytes); a request without it, or with another, is refused with 401 before
//! its body is read, logged with the peer's address and counted ([`HttpServer::refused`]),
//! and its connection is closed. Bodies are bounded ([`MAX_BODY`]), so are connections
//! ([`MAX_CONNECTIONS`]) and the time to send headers ([`HEADER_TIMEOUT`]). The client keeps
//! idle connections per peer and bounds each call by openraft's timeout. Each message names
//! its sender's node id ([`FROM_HEADER`]), for the receiver's logs and for network tools
//! (a test's partitioning proxy) that see one connection per sender.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http_body_util::{BodyExt, Full, Limited};
use hyper::body::{Bytes, Incoming};
use hyper::client::conn::http1::SendRequest;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use openraft::Raft;

use crate::membership::{Members, MembershipError, MembershipRequest};
use crate::network::{Rpc, RpcReply, Transport, TransportError, serve};
use crate::status::LedgerStatus;
use crate::store::Machine;
use crate::types::{NodeId, TypeConfig};
use crate::{BoxFuture, lock};

/// The header naming the sending node's id.
pub const FROM_HEADER: &str = "x-raft-from";

/// The path Raft messages are posted to.
pub const PATH: &str = "/raft/v1";

/// Where a node's [`LedgerStatus`] is read (`GET`, with the secret).
pub const STATUS_PATH: &str = "/raft/v1/status";

/// Where a [`MembershipRequest`] is posted (with the secret); the answer is a JSON
/// `Result<Members, MembershipError>`.
pub const MEMBERSHIP_PATH: &str = "/raft/v1/membership";

/// The largest body accepted either way (a snapshot chunk is a few MB; an append batch of
/// decision rounds less).
pub const MAX_BODY: usize = 64 << 20;

/// The shortest shared secret accepted.
pub const MIN_SECRET: usize = 16;

/// Connections served at once (a group has a few peers; the rest wait in the backlog).
pub const MAX_CONNECTIONS: usize = 64;

/// How long a connection may take to send a request's headers.
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(5);

/// Why the HTTP transport cannot start.
#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    #[error("the raft shared secret must be at least {MIN_SECRET} bytes (it has {0})")]
    ShortSecret(usize),
    #[error("raft listener: {0}")]
    Io(#[from] std::io::Error),
}

fn check_secret(secret: &str) -> Result<(), HttpError> {
    if secret.len() < MIN_SECRET { Err(HttpError::ShortSecret(secret.len())) } else { Ok(()) }
}

/// Compares without stopping at the first difference (the secret's length is not hidden).
fn same_secret(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The HTTP transport's client side.
pub struct HttpTransport {
    secret: String,
    /// Idle connections by peer address.
    idle: Mutex<HashMap<String, Vec<SendRequest<Full<Bytes>>>>>,
}

impl HttpTransport {
    /// A client presenting `secret` (at least [`MIN_SECRET`] bytes).
    pub fn new(secret: impl Into<String>) -> Result<Arc<HttpTransport>, HttpError> {
        let secret = secret.into();
        check_secret(&secret)?;
        Ok(Arc::new(HttpTransport { secret, idle: Mutex::new(HashMap::new()) }))
    }

    async fn connection(&self, to: NodeId, addr: &str) -> Result<SendRequest<Full<Bytes>>, TransportError> {
        loop {
            let cached = lock(&self.idle).get_mut(addr).and_then(Vec::pop);
            match cached {
                // A kept connection is used only once it says it is ready for a request.
                Some(mut c) => {
                    if c.ready().await.is_ok() {
                        return Ok(c);
                    }
                }
                None => break,
            }
        }
        dial(addr).await.map_err(|reason| TransportError::Unreachable { to, reason })
    }

    async fn exchange(&self, from: NodeId, to: NodeId, addr: &str, rpc: &Rpc) -> Result<RpcReply, TransportError> {
        let bad = |reason: String| TransportError::Bad { to, reason };
        let body = serde_json::to_vec(rpc).map_err(|e| bad(format!("encoding the message: {e}")))?;
        let request = Request::post(PATH)
            .header(hyper::header::HOST, addr)
            .header(hyper::header::AUTHORIZATION, format!("Bearer {}", self.secret))
            .header(FROM_HEADER, from.to_string())
            .header(hyper::header::CONTENT_TYPE, "application/json")
            .body(Full::new(Bytes::from(body)))
            .map_err(|e| bad(e.to_string()))?;
        let mut conn = self.connection(to, addr).await?;
        let response =
            conn.send_request(request).await.map_err(|e| TransportError::Unreachable { to, reason: e.to_string() })?;
        let status = response.status();
        let bytes = Limited::new(response.into_body(), MAX_BODY)
            .collect()
            .await
            .map_err(|e| TransportError::Unreachable { to, reason: format!("reading the reply: {e}") })?
            .to_bytes();
        if status != StatusCode::OK {
            let text = String::from_utf8_lossy(&bytes[..bytes.len().min(200)]).to_string();
            return Err(bad(format!("HTTP {status}: {text}")));
        }
        let reply = serde_json::from_slice(&bytes).map_err(|e| bad(format!("not a reply: {e}")))?;
        // Only a connection that answered well is kept for the next call.
        lock(&self.idle).entry(addr.to_string()).or_default().push(conn);
        Ok(reply)
    }
}

impl Transport for HttpTransport {
    fn call(
        &self,
        from: NodeId,
        to: NodeId,
        addr: &str,
        rpc: Rpc,
        timeout: Duration,
    ) -> BoxFuture<'_, Result<RpcReply, TransportError>> {
        let addr = addr.to_string();
        Box::pin(async move {
            match tokio::time::timeout(timeout, self.exchange(from, to, &addr, &rpc)).await {
                Ok(r) => r,
                Err(_) => Err(TransportError::Timeout { to, timeout }),
            }
        })
    }
}

/// A new HTTP/1 connection to `addr`, its driver running on the current runtime.
async fn dial(addr: &str) -> Result<SendRequest<Full<Bytes>>, String> {
    let stream = tokio::net::TcpStream::connect(addr).await.map_err(|e| format!("{addr}: {e}"))?;
    if let Err(e) = stream.set_nodelay(true) {
        tracing::debug!(addr, error = %e, "ledger.rpc: nodelay not set");
    }
    let (send, conn) =
        hyper::client::conn::http1::handshake(TokioIo::new(stream)).await.map_err(|e| format!("{addr}: {e}"))?;
    let peer = addr.to_string();
    tokio::spawn(async move {
        if let Err(e) = conn.await {
            tracing::debug!(addr = %peer, error = %e, "ledger.rpc: connection closed");
        }
    });
    Ok(send)
}

/// Sends `request` to `addr` on a connection of its own: the body of its 200 answer.
async fn call_once(addr: &str, request: Request<Full<Bytes>>) -> Result<Bytes, String> {
    let mut send = dial(addr).await?;
    let response = send.send_request(request).await.map_err(|e| format!("{addr}: {e}"))?;
    let status = response.status();
    let bytes = Limited::new(response.into_body(), MAX_BODY)
        .collect()
        .await
        .map_err(|e| format!("{addr}: reading the reply: {e}"))?
        .to_bytes();
    if status != StatusCode::OK {
        return Err(format!("{addr}: HTTP {status}: {}", String::from_utf8_lossy(&bytes).trim()));
    }
    Ok(bytes)
}

/// Reads the [`LedgerStatus`] of the node at `addr` (`dovetail ledger status`).
pub async fn fetch_status(addr: &str, secret: &str, timeout: Duration) -> Result<LedgerStatus, String> {
    let get = async {
        let request = Request::get(STATUS_PATH)
            .header(hyper::header::HOST, addr)
            .header(hyper::header::AUTHORIZATION, format!("Bearer {secret}"))
            .body(Full::new(Bytes::new()))
            .map_err(|e| e.to_string())?;
        let bytes = call_once(addr, request).await?;
        serde_json::from_slice(&bytes).map_err(|e| format!("{addr}: not a ledger status: {e}"))
    };
    tokio::time::timeout(timeout, get).await.map_err(|_| format!("{addr}: no answer within {timeout:?}"))?
}

/// Asks the node at `addr` for a membership change, once (no redirect to the leader).
pub async fn request_membership(
    addr: &str,
    secret: &str,
    request: &MembershipRequest,
    timeout: Duration,
) -> Result<Result<Members, MembershipError>, String> {
    let post = async {
        let body = serde_json::to_vec(request).map_err(|e| format!("encoding the request: {e}"))?;
        let request = Request::post(MEMBERSHIP_PATH)
            .header(hyper::header::HOST, addr)
            .header(hyper::header::AUTHORIZATION, format!("Bearer {secret}"))
            .header(hyper::header::CONTENT_TYPE, "application/json")
            .body(Full::new(Bytes::from(body)))
            .map_err(|e| e.to_string())?;
        let bytes = call_once(addr, request).await?;
        serde_json::from_slice(&bytes).map_err(|e| format!("{addr}: not a membership answer: {e}"))
    };
    tokio::time::timeout(timeout, post).await.map_err(|_| format!("{addr}: no answer within {timeout:?}"))?
}

/// How many nodes [`change_membership`] asks before it gives up looking for the leader.
pub const MEMBERSHIP_HOPS: usize = 8;

/// Asks for a membership change at `addr`, and then at the leader each node names, for at
/// most [`MEMBERSHIP_HOPS`] answers (pausing half a second when a node knows no leader: an
/// election is running). Each answer waits at most `timeout`.
pub async fn change_membership(
    addr: &str,
    secret: &str,
    request: &MembershipRequest,
    timeout: Duration,
) -> Result<Members, String> {
    let mut at = addr.to_string();
    let mut last = String::new();
    for _ in 0..MEMBERSHIP_HOPS {
        match request_membership(&at, secret, request, timeout).await? {
            Ok(members) => return Ok(members),
            Err(MembershipError::NotLeader { addr: Some(leader), .. }) if leader != at => {
                tracing::debug!(asked = %at, leader = %leader, "ledger.membership: asking the leader");
                at = leader;
            }
            Err(e @ MembershipError::NotLeader { .. }) => {
                last = e.to_string();
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            Err(e) => return Err(e.to_string()),
        }
    }
    Err(format!("no leader found after asking {MEMBERSHIP_HOPS} times (last: {last})"))
}

/// The HTTP transport's server side: answers Raft messages for one node.
pub struct HttpServer {
    /// The address it listens on.
    pub addr: SocketAddr,
    refused: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

impl HttpServer {
    /// Serves `raft` on `listener`, refusing requests without `secret` (at least
    /// [`MIN_SECRET`] bytes).
    pub fn start(
        listener: tokio::net::TcpListener,
        raft: Raft<TypeConfig>,
        machine: Machine,
        secret: impl Into<String>,
    ) -> Result<HttpServer, HttpError> {
        let addr = listener.local_addr()?;
        let secret = secret.into();
        check_secret(&secret)?;
        let secret: Arc<str> = Arc::from(secret);
        let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
        let refused = Arc::new(AtomicU64::new(0));
        let counter = refused.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok(slot) = slots.clone().acquire_owned().await else { return };
                let (stream, peer) = match listener.accept().await {
                    Ok(c) => c,
                    Err(e) => {
                        tracing::warn!(error = %e, "ledger.rpc: accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                let (raft, machine, secret, refused) = (raft.clone(), machine.clone(), secret.clone(), counter.clone());
                tokio::spawn(async move {
                    let _slot = slot;
                    let svc = hyper::service::service_fn(move |req| {
                        let (raft, machine, secret, refused) =
                            (raft.clone(), machine.clone(), secret.clone(), refused.clone());
                        async move {
                            Ok::<_, std::convert::Infallible>(
                                answer(&raft, &machine, &secret, &refused, peer, req).await,
                            )
                        }
                    });
                    let conn = hyper::server::conn::http1::Builder::new()
                        .timer(hyper_util::rt::TokioTimer::new())
                        .header_read_timeout(HEADER_TIMEOUT)
                        .serve_connection(TokioIo::new(stream), svc);
                    if let Err(e) = conn.await {
                        tracing::debug!(%peer, error = %e, "ledger.rpc: connection ended");
                    }
                });
            }
        });
        Ok(HttpServer { addr, refused, task })
    }

    /// Requests refused for a missing or wrong secret.
    pub fn refused(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }

    /// Stops accepting connections (those open finish their requests).
    pub fn stop(&self) {
        self.task.abort();
    }
}

impl Drop for HttpServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn reply(status: StatusCode, body: impl Into<Bytes>) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(body.into()));
    *r.status_mut() = status;
    r
}

async fn answer(
    raft: &Raft<TypeConfig>,
    machine: &Machine,
    secret: &str,
    refused: &AtomicU64,
    peer: SocketAddr,
    req: Request<Incoming>,
) -> Response<Full<Bytes>> {
    let status = req.uri().path() == STATUS_PATH && req.method() == hyper::Method::GET;
    let membership = req.uri().path() == MEMBERSHIP_PATH && req.method() == hyper::Method::POST;
    if !status && !membership && (req.uri().path() != PATH || req.method() != hyper::Method::POST) {
        return reply(StatusCode::NOT_FOUND, "not a raft endpoint\n");
    }
    let presented = req
        .headers()
        .get(hyper::header::AUTHORIZATION)
        .and_then(|v| v.as_bytes().strip_prefix(b"Bearer "))
        .unwrap_or_default();
    if !same_secret(presented, secret.as_bytes()) {
        refused.fetch_add(1, Ordering::Relaxed);
        let from = req.headers().get(FROM_HEADER).and_then(|v| v.to_str().ok()).unwrap_or("?").to_string();
        tracing::warn!(%peer, from, "ledger.rpc: refused a peer without the group's secret");
        let mut r = reply(StatusCode::UNAUTHORIZED, "the group's secret is required\n");
        r.headers_mut().insert(hyper::header::CONNECTION, hyper::header::HeaderValue::from_static("close"));
        return r;
    }
    if status {
        return match serde_json::to_vec(&LedgerStatus::of(raft, machine).await) {
            Ok(b) => reply(StatusCode::OK, b),
            Err(e) => reply(StatusCode::INTERNAL_SERVER_ERROR, format!("encoding the status: {e}\n")),
        };
    }
    let body = match Limited::new(req.into_body(), MAX_BODY).collect().await {
        Ok(b) => b.to_bytes(),
        Err(e) => return reply(StatusCode::PAYLOAD_TOO_LARGE, format!("{e}\n")),
    };
    if membership {
        let request: MembershipRequest = match serde_json::from_slice(&body) {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(%peer, error = %e, "ledger.membership: a malformed request");
                return reply(StatusCode::BAD_REQUEST, format!("not a membership request: {e}\n"));
            }
        };
        tracing::info!(%peer, ?request, "ledger.membership: asked");
        // A voter answers when its status endpoint does, with the group's secret.
        let key = secret.to_string();
        let probe: crate::membership::Probe = Arc::new(move |id, addr| {
            let key = key.clone();
            Box::pin(async move {
                match fetch_status(&addr, &key, Duration::from_secs(2)).await {
                    Ok(_) => true,
                    Err(e) => {
                        tracing::info!(node = id, %addr, error = %e, "ledger.membership: a voter does not answer");
                        false
                    }
                }
            })
        });
        let answer = crate::membership::change(raft, &request, &probe).await;
        if let Err(e) = &answer {
            tracing::warn!(%peer, ?request, error = %e, "ledger.membership: not changed");
        }
        return match serde_json::to_vec(&answer) {
            Ok(b) => reply(StatusCode::OK, b),
            Err(e) => reply(StatusCode::INTERNAL_SERVER_ERROR, format!("encoding the answer: {e}\n")),
        };
    }
    let rpc: Rpc = match serde_json::from_slice(&body) {
        Ok(r) => r,
        Err(e) => {
            tracing::warn!(%peer, error = %e, "ledger.rpc: a malformed message");
            return reply(StatusCode::BAD_REQUEST, format!("not a raft message: {e}\n"));
        }
    };
    let answer = serve(raft, rpc).await;
    match serde_json::to_vec(&answer) {
        Ok(b) => {
            let mut r = reply(StatusCode::OK, b);
            r.headers_mut()
                .insert(hyper::header::CONTENT_TYPE, hyper::header::HeaderValue::from_static("application/json"));
            r
        }
        Err(e) => reply(StatusCode::INTERNAL_SERVER_ERROR, format!("encoding the reply: {e}\n")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::replicated::{RaftLedger, RaftSettings};
    use crate::store::{LogStore, Machine};
    use crate::{Ledger, read_with};
    use dovetail_core::clock::SystemClock;
    use dovetail_core::ledger::{Command, Entry, Outcome};
    use dovetail_core::resources::ResourceList;
    use openraft::Vote;
    use openraft::raft::VoteRequest;
    use std::collections::BTreeMap;

    const SECRET: &str = "s3cret-of-the-group";

    /// Three replicas in one process, over HTTP on 127.0.0.1: they elect and commit; a peer
    /// without the secret, or with another, is refused (and its vote for a later term does
    /// not reach Raft: the leader stays), and so is a malformed message; a short secret is
    /// not accepted at all.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn replicas_over_http_commit_and_refuse_a_peer_without_the_secret() {
        let transport = HttpTransport::new(SECRET).expect("a long secret");
        let mut nodes = BTreeMap::new();
        let mut servers = BTreeMap::new();
        let mut dirs = Vec::new();
        let mut listeners = BTreeMap::new();
        for id in 1..=3u64 {
            let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bound");
            listeners.insert(id, l);
        }
        let members: BTreeMap<NodeId, String> =
            listeners.iter().map(|(id, l)| (*id, l.local_addr().expect("addr").to_string())).collect();
        for (id, listener) in listeners {
            let dir = tempfile::tempdir().expect("dir");
            let t: Arc<dyn Transport> = transport.clone();
            let ledger = RaftLedger::start(
                id,
                &RaftSettings::default(),
                LogStore::open(dir.path()).expect("log"),
                Machine::open(dir.path()).expect("machine"),
                t,
                Arc::new(SystemClock::new()),
            )
            .await
            .expect("started");
            let server = HttpServer::start(listener, ledger.raft().clone(), ledger.machine().clone(), SECRET);
            servers.insert(id, server.expect("serving"));
            nodes.insert(id, ledger);
            dirs.push(dir);
        }
        nodes[&1].initialize(members.clone()).await.expect("initialized");
        let mut leading = None;
        for _ in 0..200 {
            leading = nodes
                .iter()
                .find(|(_, n)| n.leadership().borrow().leader)
                .map(|(id, n)| (*id, n.leadership().borrow().term));
            if leading.is_some() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let (leader, term) = leading.expect("a leader over HTTP within 10 s");
        let entry =
            Entry { term, at: 1, command: Command::SetPool { pool: "default".into(), limits: ResourceList::new() } };
        assert_eq!(nodes[&leader].propose(entry).await.expect("committed").outcome, Outcome::Done);
        for n in nodes.values() {
            let mut seen = false;
            for _ in 0..100 {
                if read_with(n, |s| s.pool("default").is_some()).await.expect("read") {
                    seen = true;
                    break;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            assert!(seen, "replicated to node {}", n.id());
        }
        // Every node's status: the same leader, term and pool; the secret is required.
        for (id, addr) in &members {
            let st = fetch_status(addr, SECRET, Duration::from_secs(2)).await.expect("a status");
            assert_eq!(st.node, *id);
            assert_eq!(st.leader, Some(leader));
            assert_eq!(st.members, vec![1, 2, 3]);
            assert_eq!(st.role, if *id == leader { "leader" } else { "follower" });
            assert!(st.term >= term && st.last_log_index >= st.applied_index);
        }
        let st = fetch_status(&members[&leader], SECRET, Duration::from_secs(2)).await.expect("a status");
        assert!(st.ledger.pools.contains_key("default") && st.committed_index.is_some(), "{st:?}");
        assert!(st.render().contains(&format!("node {leader} (leader)")), "{}", st.render());
        let refused = fetch_status(&members[&leader], "not-the-secret-at-all", Duration::from_secs(2)).await;
        assert!(refused.is_err_and(|e| e.contains("401")));
        // An unknown peer: a vote request with the wrong secret, then none at all.
        let target = &members[&leader];
        let vote = || Rpc::Vote(VoteRequest::new(Vote::new(term + 5, 9), None));
        for secret in ["wrong-secret-of-20-b", "s3cret-but-not-the-group's"] {
            let stranger = HttpTransport::new(secret).expect("a long secret");
            match stranger.call(9, leader, target, vote(), Duration::from_secs(2)).await {
                Err(TransportError::Bad { reason, .. }) => assert!(reason.contains("401"), "{reason}"),
                other => panic!("{other:?}"),
            }
        }
        // No secret at all.
        let stream = tokio::net::TcpStream::connect(target).await.expect("connected");
        let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await.expect("handshake");
        tokio::spawn(conn);
        let body = serde_json::to_vec(&vote()).expect("encoded");
        let req = Request::post(PATH)
            .header(hyper::header::HOST, target.as_str())
            .body(Full::new(Bytes::from(body)))
            .expect("request");
        assert_eq!(send.send_request(req).await.expect("answered").status(), StatusCode::UNAUTHORIZED);
        assert_eq!(servers[&leader].refused(), 4);
        assert!(matches!(HttpTransport::new("short"), Err(HttpError::ShortSecret(5))));
        assert!(nodes[&leader].leadership().borrow().leader, "the refused vote did not depose the leader");
        // A malformed message from a peer that has the secret.
        let stream = tokio::net::TcpStream::connect(target).await.expect("connected");
        let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await.expect("handshake");
        tokio::spawn(conn);
        let req = Request::post(PATH)
            .header(hyper::header::HOST, target.as_str())
            .header(hyper::header::AUTHORIZATION, format!("Bearer {SECRET}"))
            .body(Full::new(Bytes::from_static(br#"{"vote": 1}"#)))
            .expect("request");
        assert_eq!(send.send_request(req).await.expect("answered").status(), StatusCode::BAD_REQUEST);
        for n in nodes.values() {
            n.shutdown().await;
        }
    }
}
