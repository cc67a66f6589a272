//! Raft's messages over HTTP between control-node processes, on each node's Raft address.
//!
//! `POST /raft/v1` with a JSON [`Rpc`] body answers a JSON [`RpcReply`]. Every request
//! carries the group's shared secret (`Authorization: Bearer SECRET`, at least
//! [`MIN_SECRET`] bytes); a request without it, or with another, is refused with 401 before
//! its body is read, logged with the peer's address and counted ([`HttpServer::refused`]),
//! and its connection is closed. With the group's TLS ([`crate::tls`]) every connection is
//! mutual TLS first: a peer without a certificate of the group's CA fails the handshake and
//! never gets to send a request, and the secret never travels in cleartext.
//!
//! **Connections.** The server accepts at once, whatever else it holds, and then counts each
//! connection against its peer's address ([`Gate`]): at most
//! [`MAX_UNAUTHENTICATED_PER_PEER`] not yet authenticated (no request with the secret, or no
//! TLS handshake done) and [`MAX_PER_PEER`] in all per address, [`MAX_UNAUTHENTICATED`] not
//! yet authenticated over all addresses (an address holding an authenticated connection may
//! still open more) and [`MAX_CONNECTIONS`] overall; a connection over a limit is closed at
//! once and counted ([`HttpServer::dropped`]). So a host that opens connections and sends
//! nothing holds a few of its own slots for the header (or handshake) timeout, and many such
//! hosts half the server at most, never the group's room. Bodies are bounded ([`MAX_BODY`]), so is
//! the time to send headers ([`HEADER_TIMEOUT`]) and to finish a handshake
//! ([`HANDSHAKE_TIMEOUT`]). The client keeps idle connections per peer and bounds each call
//! by openraft's timeout. Each message names its sender's node id ([`FROM_HEADER`]), for the
//! receiver's logs and for network tools (a test's partitioning proxy) that see one
//! connection per sender.

use std::collections::{HashMap, HashSet};
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
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
use crate::tls::{Tls, server_name};
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

/// Connections held at once, over every peer (a group has a few peers, each with a few
/// connections; the CLI's and probes' come and go).
pub const MAX_CONNECTIONS: usize = 256;

/// Connections one peer address may hold at once.
pub const MAX_PER_PEER: usize = 32;

/// Connections one peer address may hold that have not authenticated yet (no request with
/// the secret, or, with TLS, no finished handshake).
pub const MAX_UNAUTHENTICATED_PER_PEER: usize = 8;

/// Connections not authenticated yet, over every address, beyond which only an address that
/// holds an authenticated connection (a peer known good) may open another: many hosts that
/// connect and send nothing fill at most half the server, never its peers' room.
pub const MAX_UNAUTHENTICATED: usize = MAX_CONNECTIONS / 2;

/// How long a connection may take to send a request's headers.
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(5);

/// How long a TLS handshake may take.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(2);

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

/// How a node (or the CLI) speaks to the group: its shared secret, and its TLS when the
/// group uses TLS.
#[derive(Clone, Debug)]
pub struct RaftClient {
    secret: Arc<str>,
    tls: Option<Tls>,
}

impl RaftClient {
    /// A client presenting `secret` (at least [`MIN_SECRET`] bytes), over TLS when `tls` is
    /// given (else plain HTTP).
    pub fn new(secret: impl Into<String>, tls: Option<Tls>) -> Result<RaftClient, HttpError> {
        let secret = secret.into();
        check_secret(&secret)?;
        Ok(RaftClient { secret: Arc::from(secret), tls })
    }

    /// Whether it speaks TLS.
    pub fn tls(&self) -> bool {
        self.tls.is_some()
    }

    fn bearer(&self) -> String {
        format!("Bearer {}", self.secret)
    }
}

/// The HTTP transport's client side.
pub struct HttpTransport {
    client: RaftClient,
    /// Idle connections by peer address.
    idle: Mutex<HashMap<String, Vec<SendRequest<Full<Bytes>>>>>,
}

impl HttpTransport {
    /// A client presenting `secret` (at least [`MIN_SECRET`] bytes), over plain HTTP.
    pub fn new(secret: impl Into<String>) -> Result<Arc<HttpTransport>, HttpError> {
        Ok(HttpTransport::with(RaftClient::new(secret, None)?))
    }

    /// A transport speaking as `client` (its secret, and its TLS if any).
    pub fn with(client: RaftClient) -> Arc<HttpTransport> {
        Arc::new(HttpTransport { client, idle: Mutex::new(HashMap::new()) })
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
        dial(addr, self.client.tls.as_ref()).await.map_err(|reason| TransportError::Unreachable { to, reason })
    }

    async fn exchange(&self, from: NodeId, to: NodeId, addr: &str, rpc: &Rpc) -> Result<RpcReply, TransportError> {
        let bad = |reason: String| TransportError::Bad { to, reason };
        let body = serde_json::to_vec(rpc).map_err(|e| bad(format!("encoding the message: {e}")))?;
        let request = Request::post(PATH)
            .header(hyper::header::HOST, addr)
            .header(hyper::header::AUTHORIZATION, self.client.bearer())
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

/// A new HTTP/1 connection to `addr` (over TLS with `tls`, checking that the peer's
/// certificate names the host dialled), its driver running on the current runtime.
async fn dial(addr: &str, tls: Option<&Tls>) -> Result<SendRequest<Full<Bytes>>, String> {
    let stream = tokio::net::TcpStream::connect(addr).await.map_err(|e| format!("{addr}: {e}"))?;
    if let Err(e) = stream.set_nodelay(true) {
        tracing::debug!(addr, error = %e, "ledger.rpc: nodelay not set");
    }
    let peer = addr.to_string();
    let Some(tls) = tls else {
        let (send, conn) =
            hyper::client::conn::http1::handshake(TokioIo::new(stream)).await.map_err(|e| format!("{addr}: {e}"))?;
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!(addr = %peer, error = %e, "ledger.rpc: connection closed");
            }
        });
        return Ok(send);
    };
    let name = server_name(addr)?;
    let stream = tokio::time::timeout(HANDSHAKE_TIMEOUT, tls.connector.connect(name, stream))
        .await
        .map_err(|_| format!("{addr}: no TLS handshake within {HANDSHAKE_TIMEOUT:?}"))?
        .map_err(|e| format!("{addr}: TLS: {e}"))?;
    let (send, conn) =
        hyper::client::conn::http1::handshake(TokioIo::new(stream)).await.map_err(|e| format!("{addr}: {e}"))?;
    tokio::spawn(async move {
        if let Err(e) = conn.await {
            tracing::debug!(addr = %peer, error = %e, "ledger.rpc: connection closed");
        }
    });
    Ok(send)
}

/// Sends `request` to `addr` on a connection of its own: the body of its 200 answer.
async fn call_once(addr: &str, tls: Option<&Tls>, request: Request<Full<Bytes>>) -> Result<Bytes, String> {
    let mut send = dial(addr, tls).await?;
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
pub async fn fetch_status(addr: &str, client: &RaftClient, timeout: Duration) -> Result<LedgerStatus, String> {
    let get = async {
        let request = Request::get(STATUS_PATH)
            .header(hyper::header::HOST, addr)
            .header(hyper::header::AUTHORIZATION, client.bearer())
            .body(Full::new(Bytes::new()))
            .map_err(|e| e.to_string())?;
        let bytes = call_once(addr, client.tls.as_ref(), request).await?;
        serde_json::from_slice(&bytes).map_err(|e| format!("{addr}: not a ledger status: {e}"))
    };
    tokio::time::timeout(timeout, get).await.map_err(|_| format!("{addr}: no answer within {timeout:?}"))?
}

/// Asks the node at `addr` for a membership change, once (no redirect to the leader).
pub async fn request_membership(
    addr: &str,
    client: &RaftClient,
    request: &MembershipRequest,
    timeout: Duration,
) -> Result<Result<Members, MembershipError>, String> {
    let post = async {
        let body = serde_json::to_vec(request).map_err(|e| format!("encoding the request: {e}"))?;
        let request = Request::post(MEMBERSHIP_PATH)
            .header(hyper::header::HOST, addr)
            .header(hyper::header::AUTHORIZATION, client.bearer())
            .header(hyper::header::CONTENT_TYPE, "application/json")
            .body(Full::new(Bytes::from(body)))
            .map_err(|e| e.to_string())?;
        let bytes = call_once(addr, client.tls.as_ref(), request).await?;
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
    client: &RaftClient,
    request: &MembershipRequest,
    timeout: Duration,
) -> Result<Members, String> {
    let mut at = addr.to_string();
    let mut last = String::new();
    for _ in 0..MEMBERSHIP_HOPS {
        match request_membership(&at, client, request, timeout).await? {
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

/// What the server holds per peer address: connections not authenticated yet, and in all.
#[derive(Debug, Default)]
struct Held {
    unauthenticated: usize,
    all: usize,
}

/// The server's connection bookkeeping: every connection is counted against its peer's
/// address from its accept to its close, and is over a limit closed at once.
#[derive(Debug, Default)]
struct Gate {
    peers: Mutex<HashMap<IpAddr, Held>>,
    /// The addresses the group's members resolve to (from the committed membership, read
    /// again every few seconds): a member dialling afresh (a new leader, a node back from a
    /// restart) is never turned away for the unauthenticated connections of strangers.
    members: Mutex<HashSet<IpAddr>>,
    /// Connections closed at accept for being over a limit.
    dropped: AtomicU64,
}

/// Aborts a task when dropped (with the task that holds it).
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// How often the members' addresses are resolved again (a restarted pod's new address is in
/// DNS within seconds).
const MEMBERS_EVERY: Duration = Duration::from_secs(5);

/// Keeps `gate.members` to the addresses the committed membership's nodes resolve to.
async fn follow_members(raft: Raft<TypeConfig>, gate: Arc<Gate>) {
    loop {
        let addrs: Vec<String> = {
            let m = raft.metrics();
            let m = m.borrow();
            m.membership_config.membership().nodes().map(|(_, n)| n.addr.clone()).collect()
        };
        let mut ips = HashSet::new();
        for addr in &addrs {
            match tokio::net::lookup_host(addr.as_str()).await {
                Ok(found) => ips.extend(found.map(|a| a.ip().to_canonical())),
                Err(e) => tracing::debug!(%addr, error = %e, "ledger.rpc: a member's address did not resolve"),
            }
        }
        *lock(&gate.members) = ips;
        tokio::time::sleep(MEMBERS_EVERY).await;
    }
}

/// One admitted connection's place in the [`Gate`], given back when dropped.
struct Ticket {
    gate: Arc<Gate>,
    peer: IpAddr,
    authenticated: AtomicBool,
}

impl Gate {
    /// Admits a connection from `peer`, if its address and the server have room.
    fn admit(self: &Arc<Self>, peer: IpAddr) -> Option<Arc<Ticket>> {
        let mut peers = lock(&self.peers);
        let total: usize = peers.values().map(|h| h.all).sum();
        let unauthenticated: usize = peers.values().map(|h| h.unauthenticated).sum();
        let member = lock(&self.members).contains(&peer);
        let held = peers.entry(peer).or_default();
        let known = member || held.all > held.unauthenticated;
        if total >= MAX_CONNECTIONS
            || held.all >= MAX_PER_PEER
            || held.unauthenticated >= MAX_UNAUTHENTICATED_PER_PEER
            || (unauthenticated >= MAX_UNAUTHENTICATED && !known)
        {
            if held.all == 0 {
                peers.remove(&peer);
            }
            self.dropped.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        held.all += 1;
        held.unauthenticated += 1;
        Some(Arc::new(Ticket { gate: self.clone(), peer, authenticated: AtomicBool::new(false) }))
    }
}

impl Ticket {
    /// The connection proved it belongs to the group (a request with the secret, or a TLS
    /// handshake with the group's certificate): it no longer counts as unauthenticated.
    fn authenticate(&self) {
        if !self.authenticated.swap(true, Ordering::AcqRel)
            && let Some(held) = lock(&self.gate.peers).get_mut(&self.peer)
        {
            held.unauthenticated = held.unauthenticated.saturating_sub(1);
        }
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        let mut peers = lock(&self.gate.peers);
        if let Some(held) = peers.get_mut(&self.peer) {
            held.all = held.all.saturating_sub(1);
            if !self.authenticated.load(Ordering::Acquire) {
                held.unauthenticated = held.unauthenticated.saturating_sub(1);
            }
            if held.all == 0 {
                peers.remove(&self.peer);
            }
        }
    }
}

/// What every connection's requests are answered with.
#[derive(Clone)]
struct Served {
    raft: Raft<TypeConfig>,
    machine: Machine,
    client: RaftClient,
    refused: Arc<AtomicU64>,
}

/// The HTTP transport's server side: answers Raft messages for one node.
pub struct HttpServer {
    /// The address it listens on.
    pub addr: SocketAddr,
    refused: Arc<AtomicU64>,
    gate: Arc<Gate>,
    task: tokio::task::JoinHandle<()>,
}

impl HttpServer {
    /// Serves `raft` on `listener` over plain HTTP, refusing requests without `secret` (at
    /// least [`MIN_SECRET`] bytes).
    pub fn start(
        listener: tokio::net::TcpListener,
        raft: Raft<TypeConfig>,
        machine: Machine,
        secret: impl Into<String>,
    ) -> Result<HttpServer, HttpError> {
        HttpServer::serve(listener, raft, machine, RaftClient::new(secret, None)?)
    }

    /// Serves `raft` on `listener` as `client` speaks: its secret required of every request,
    /// and with its TLS, mutual TLS on every connection (its membership changes ask the
    /// voters as `client` too).
    pub fn serve(
        listener: tokio::net::TcpListener,
        raft: Raft<TypeConfig>,
        machine: Machine,
        client: RaftClient,
    ) -> Result<HttpServer, HttpError> {
        let addr = listener.local_addr()?;
        let refused = Arc::new(AtomicU64::new(0));
        let gate = Arc::new(Gate::default());
        let served = Served { raft, machine, client, refused: refused.clone() };
        let admissions = gate.clone();
        let members = tokio::spawn(follow_members(served.raft.clone(), gate.clone()));
        let task = tokio::spawn(async move {
            // The members' addresses are followed as long as connections are accepted.
            let _members = AbortOnDrop(members);
            loop {
                let (stream, peer) = match listener.accept().await {
                    Ok(c) => c,
                    Err(e) => {
                        tracing::warn!(error = %e, "ledger.rpc: accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                let Some(ticket) = admissions.admit(peer.ip().to_canonical()) else {
                    tracing::debug!(%peer, "ledger.rpc: a connection over its address's limit, closed");
                    drop(stream);
                    continue;
                };
                tokio::spawn(connection(stream, peer, ticket, served.clone()));
            }
        });
        Ok(HttpServer { addr, refused, gate, task })
    }

    /// Requests refused for a missing or wrong secret.
    pub fn refused(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }

    /// Connections closed at accept for being over a limit (their address's, or the
    /// server's).
    pub fn dropped(&self) -> u64 {
        self.gate.dropped.load(Ordering::Relaxed)
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

/// Serves one accepted connection: its TLS handshake first when the group has TLS (a peer
/// without the group's certificate goes no further), then its requests.
async fn connection(stream: tokio::net::TcpStream, peer: SocketAddr, ticket: Arc<Ticket>, served: Served) {
    let Some(tls) = served.client.tls.clone() else {
        serve_http(TokioIo::new(stream), peer, ticket, served).await;
        return;
    };
    match tokio::time::timeout(HANDSHAKE_TIMEOUT, tls.acceptor.accept(stream)).await {
        Ok(Ok(stream)) => {
            // A certificate of the group's CA: it belongs to the group.
            ticket.authenticate();
            serve_http(TokioIo::new(stream), peer, ticket, served).await;
        }
        Ok(Err(e)) => {
            served.refused.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(%peer, error = %e, "ledger.rpc: refused a peer without the group's certificate");
        }
        Err(_) => {
            served.refused.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(%peer, "ledger.rpc: no TLS handshake within {HANDSHAKE_TIMEOUT:?}; closed");
        }
    }
}

async fn serve_http<I>(io: TokioIo<I>, peer: SocketAddr, ticket: Arc<Ticket>, served: Served)
where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let svc_ticket = ticket.clone();
    let svc = hyper::service::service_fn(move |req| {
        let (served, ticket) = (served.clone(), svc_ticket.clone());
        async move { Ok::<_, std::convert::Infallible>(answer(&served, &ticket, peer, req).await) }
    });
    let conn = hyper::server::conn::http1::Builder::new()
        .timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(HEADER_TIMEOUT)
        .serve_connection(io, svc);
    if let Err(e) = conn.await {
        tracing::debug!(%peer, error = %e, "ledger.rpc: connection ended");
    }
    drop(ticket);
}

fn reply(status: StatusCode, body: impl Into<Bytes>) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(body.into()));
    *r.status_mut() = status;
    r
}

async fn answer(served: &Served, ticket: &Ticket, peer: SocketAddr, req: Request<Incoming>) -> Response<Full<Bytes>> {
    let (raft, machine, refused) = (&served.raft, &served.machine, &served.refused);
    let secret = served.client.secret.as_ref();
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
    ticket.authenticate();
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
        let client = served.client.clone();
        let probe: crate::membership::Probe = Arc::new(move |id, addr| {
            let client = client.clone();
            Box::pin(async move {
                match fetch_status(&addr, &client, Duration::from_secs(2)).await {
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

    fn client(secret: &str) -> RaftClient {
        RaftClient::new(secret, None).expect("a long secret")
    }

    /// A group of `n` replicas on 127.0.0.1, each served as `clients[i]` speaks (TLS or not),
    /// initialized: the replicas, their servers, their addresses and the leader with its term.
    async fn group(
        clients: Vec<RaftClient>,
    ) -> (
        BTreeMap<NodeId, RaftLedger>,
        BTreeMap<NodeId, HttpServer>,
        BTreeMap<NodeId, String>,
        (NodeId, u64),
        Vec<tempfile::TempDir>,
    ) {
        let mut listeners = BTreeMap::new();
        for id in 1..=clients.len() as u64 {
            let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bound");
            listeners.insert(id, l);
        }
        let members: BTreeMap<NodeId, String> =
            listeners.iter().map(|(id, l)| (*id, l.local_addr().expect("addr").to_string())).collect();
        let (mut nodes, mut servers, mut dirs) = (BTreeMap::new(), BTreeMap::new(), Vec::new());
        for ((id, listener), client) in listeners.into_iter().zip(clients) {
            let dir = tempfile::tempdir().expect("dir");
            let t: Arc<dyn Transport> = HttpTransport::with(client.clone());
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
            let server = HttpServer::serve(listener, ledger.raft().clone(), ledger.machine().clone(), client);
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
        (nodes, servers, members, leading.expect("a leader over HTTP within 10 s"), dirs)
    }

    /// Many hosts that connect and send nothing fill at most the unauthenticated half of the
    /// server: a new address is then turned away, while a peer that holds an authenticated
    /// connection still opens more.
    #[test]
    fn many_silent_hosts_fill_half_the_server_at_most() {
        let gate = Arc::new(Gate::default());
        let peer = IpAddr::from([127, 0, 0, 1]);
        let good = gate.admit(peer).expect("the peer's first connection");
        good.authenticate();
        let mut silent = Vec::new();
        for host in 0..(MAX_UNAUTHENTICATED / MAX_UNAUTHENTICATED_PER_PEER) {
            for _ in 0..MAX_UNAUTHENTICATED_PER_PEER {
                let ip = IpAddr::from([127, 1, 0, u8::try_from(host).expect("few hosts")]);
                silent.push(gate.admit(ip).expect("room for silent connections"));
            }
        }
        assert_eq!(silent.len(), MAX_UNAUTHENTICATED);
        assert!(gate.admit(IpAddr::from([127, 2, 0, 1])).is_none(), "a new address over the half is turned away");
        assert_eq!(gate.dropped.load(Ordering::Relaxed), 1);
        let more = gate.admit(peer).expect("a known peer opens another connection");
        more.authenticate();
        // One silent connection closes: a new address has room again.
        silent.pop();
        assert!(gate.admit(IpAddr::from([127, 2, 0, 1])).is_some());
    }

    /// A member of the group with no connection open (a new leader dialling its followers, a
    /// node back from a restart) is admitted however many strangers hold unauthenticated
    /// connections.
    #[test]
    fn a_member_with_no_connection_open_is_admitted_while_strangers_fill_the_unauthenticated_half() {
        let gate = Arc::new(Gate::default());
        let member = IpAddr::from([127, 0, 0, 9]);
        lock(&gate.members).insert(member);
        let mut silent = Vec::new();
        for host in 0..(MAX_UNAUTHENTICATED / MAX_UNAUTHENTICATED_PER_PEER) {
            for _ in 0..MAX_UNAUTHENTICATED_PER_PEER {
                let ip = IpAddr::from([127, 1, 0, u8::try_from(host).expect("few hosts")]);
                silent.push(gate.admit(ip).expect("room for silent connections"));
            }
        }
        assert!(gate.admit(IpAddr::from([127, 2, 0, 1])).is_none(), "a stranger is turned away");
        assert!(gate.admit(member).is_some(), "the member is not");
    }

    /// A host that opens connections and sends nothing (or never finishes a request) holds a
    /// few slots of its own address, never the group's: a peer dialling afresh is answered at
    /// once. (Before, the first 64 such connections held every slot for the header timeout.)
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_host_that_opens_connections_and_sends_nothing_does_not_starve_the_raft_port() {
        let (nodes, servers, members, (leader, _), _dirs) = group(vec![client(SECRET)]).await;
        let target: SocketAddr = members[&leader].parse().expect("addr");
        // Another host on the loopback network: 127.0.0.2.
        let mut idle = Vec::new();
        for _ in 0..100 {
            let socket = tokio::net::TcpSocket::new_v4().expect("socket");
            socket.bind("127.0.0.2:0".parse().expect("addr")).expect("bind 127.0.0.2");
            idle.push(socket.connect(target).await.expect("connected"));
        }
        // The held connections are accepted (or closed at once): give the server a moment.
        let mut dropped = 0;
        for _ in 0..100 {
            dropped = servers[&leader].dropped();
            if dropped >= (100 - MAX_UNAUTHENTICATED_PER_PEER) as u64 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(dropped, (100 - MAX_UNAUTHENTICATED_PER_PEER) as u64, "all but its own few closed");
        // A peer of the group dials afresh, several times over: answered each time.
        for _ in 0..(MAX_UNAUTHENTICATED_PER_PEER * 2) {
            let st = fetch_status(&members[&leader], &client(SECRET), Duration::from_secs(1))
                .await
                .expect("answered while another host holds idle connections");
            assert_eq!(st.node, leader);
        }
        // The members' addresses (here all 127.0.0.1) are known to the server's gate.
        let mut known = false;
        for _ in 0..100 {
            known = lock(&servers[&leader].gate.members).contains(&IpAddr::from([127, 0, 0, 1]));
            if known {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(known, "the group's members resolved into the gate");
        drop(idle);
        for n in nodes.values() {
            n.shutdown().await;
        }
    }

    /// Writes a CA and certificates for 127.0.0.1 (what `openssl` makes for an operator, or
    /// cert-manager): `names` certificates of one CA, and one of another CA.
    fn certificates(dir: &std::path::Path, names: &[&str]) -> (Vec<crate::tls::TlsFiles>, crate::tls::TlsFiles) {
        let openssl = |args: &[&str]| {
            let out = std::process::Command::new("openssl").args(args).current_dir(dir).output().expect("openssl runs");
            assert!(out.status.success(), "openssl {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr));
        };
        std::fs::write(
            dir.join("leaf.cnf"),
            "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\n\
             extendedKeyUsage=serverAuth,clientAuth\nsubjectAltName=IP:127.0.0.1,DNS:localhost\n",
        )
        .expect("write");
        let ca = |name: &str| {
            openssl(&[
                "req",
                "-x509",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:P-256",
                "-nodes",
                "-days",
                "36500",
                "-subj",
                &format!("/CN={name}"),
                "-keyout",
                &format!("{name}.key"),
                "-out",
                &format!("{name}.pem"),
                "-addext",
                "basicConstraints=critical,CA:TRUE",
                "-addext",
                "keyUsage=critical,keyCertSign,cRLSign",
            ]);
        };
        let leaf = |name: &str, ca: &str| {
            openssl(&[
                "req",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:P-256",
                "-nodes",
                "-subj",
                &format!("/CN={name}"),
                "-keyout",
                &format!("{name}.key"),
                "-out",
                &format!("{name}.csr"),
            ]);
            openssl(&[
                "x509",
                "-req",
                "-in",
                &format!("{name}.csr"),
                "-CA",
                &format!("{ca}.pem"),
                "-CAkey",
                &format!("{ca}.key"),
                "-CAcreateserial",
                "-days",
                "36500",
                "-extfile",
                "leaf.cnf",
                "-out",
                &format!("{name}.pem"),
            ]);
            crate::tls::TlsFiles {
                ca: dir.join(format!("{ca}.pem")),
                cert: dir.join(format!("{name}.pem")),
                key: dir.join(format!("{name}.key")),
            }
        };
        ca("group-ca");
        ca("other-ca");
        let files = names.iter().map(|n| leaf(n, "group-ca")).collect();
        let mut stranger = leaf("stranger", "other-ca");
        // The stranger trusts the group's CA (it can check the server): only its own
        // certificate is not the group's.
        stranger.ca = dir.join("group-ca.pem");
        (files, stranger)
    }

    /// Over mutual TLS the group elects and commits; a peer with a certificate of another CA,
    /// one with none, and plain HTTP are refused at the handshake, before any request (the
    /// secret is never sent in cleartext), and the leader stays.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn over_tls_a_peer_without_the_groups_certificate_is_refused_and_the_group_commits() {
        let certs = tempfile::tempdir().expect("dir");
        let (files, stranger) = certificates(certs.path(), &["node-1", "node-2", "node-3"]);
        let tls = |f: &crate::tls::TlsFiles| crate::tls::Tls::load(f).expect("the group's TLS");
        let clients: Vec<RaftClient> =
            files.iter().map(|f| RaftClient::new(SECRET, Some(tls(f))).expect("client")).collect();
        let member = clients[0].clone();
        let (nodes, servers, members, (leader, term), _dirs) = group(clients).await;
        let entry =
            Entry { term, at: 1, command: Command::SetPool { pool: "default".into(), limits: ResourceList::new() } };
        assert_eq!(nodes[&leader].propose(entry).await.expect("committed over TLS").outcome, Outcome::Done);
        let st = fetch_status(&members[&leader], &member, Duration::from_secs(2)).await.expect("a member's status");
        assert_eq!(st.leader, Some(leader));
        let before = servers[&leader].refused();
        // A certificate of another CA, with the right secret.
        let other = RaftClient::new(SECRET, Some(tls(&stranger))).expect("client");
        let refused = fetch_status(&members[&leader], &other, Duration::from_secs(2)).await;
        assert!(refused.is_err(), "a certificate of another CA: {refused:?}");
        // Plain HTTP, with the right secret: no TLS handshake, refused.
        let refused = fetch_status(&members[&leader], &client(SECRET), Duration::from_secs(2)).await;
        assert!(refused.is_err(), "plain HTTP: {refused:?}");
        // TLS without a client certificate (a client that only checks the server).
        let roots = {
            let mut r = rustls::RootCertStore::empty();
            let ca = std::fs::read(&files[0].ca).expect("ca");
            for c in <rustls::pki_types::CertificateDer as rustls::pki_types::pem::PemObject>::pem_slice_iter(&ca) {
                r.add(c.expect("pem")).expect("ca");
            }
            Arc::new(r)
        };
        let anonymous = rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_protocol_versions(&[&rustls::version::TLS13])
            .expect("tls 1.3")
            .with_root_certificates(roots)
            .with_no_client_auth();
        let connector = tokio_rustls::TlsConnector::from(Arc::new(anonymous));
        let stream = tokio::net::TcpStream::connect(&members[&leader]).await.expect("connected");
        let name = crate::tls::server_name(&members[&leader]).expect("name");
        // TLS 1.3 may finish the client's side before the server refuses: the first request
        // fails then.
        if let Ok(stream) = connector.connect(name, stream).await {
            let (mut send, conn) =
                hyper::client::conn::http1::handshake(TokioIo::new(stream)).await.expect("handshake");
            tokio::spawn(conn);
            let req = Request::get(STATUS_PATH)
                .header(hyper::header::HOST, members[&leader].as_str())
                .header(hyper::header::AUTHORIZATION, format!("Bearer {SECRET}"))
                .body(Full::new(Bytes::new()))
                .expect("request");
            assert!(send.send_request(req).await.is_err(), "no answer without a client certificate");
        }
        let mut refusals = 0;
        for _ in 0..100 {
            refusals = servers[&leader].refused() - before;
            if refusals >= 3 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // Three strangers, each refused at the handshake (a client that dials again after a
        // refusal is refused again: more, never fewer).
        assert!(refusals >= 3, "each refused at the handshake, and counted: {refusals}");
        assert!(nodes[&leader].leadership().borrow().leader, "the leader stays");
        for n in nodes.values() {
            n.shutdown().await;
        }
    }

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
            let st = fetch_status(addr, &client(SECRET), Duration::from_secs(2)).await.expect("a status");
            assert_eq!(st.node, *id);
            assert_eq!(st.leader, Some(leader));
            assert_eq!(st.members, vec![1, 2, 3]);
            assert_eq!(st.role, if *id == leader { "leader" } else { "follower" });
            assert!(st.term >= term && st.last_log_index >= st.applied_index);
        }
        let st = fetch_status(&members[&leader], &client(SECRET), Duration::from_secs(2)).await.expect("a status");
        assert!(st.ledger.pools.contains_key("default") && st.committed_index.is_some(), "{st:?}");
        assert!(st.render().contains(&format!("node {leader} (leader)")), "{}", st.render());
        let refused = fetch_status(&members[&leader], &client("not-the-secret-at-all"), Duration::from_secs(2)).await;
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
