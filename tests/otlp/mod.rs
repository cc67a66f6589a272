//! An OTLP trace receiver for tests, on the real wire protocols: gRPC (tonic, the
//! `opentelemetry.proto.collector.trace.v1.TraceService/Export` call) and http/protobuf
//! (hyper, `POST /v1/traces` with a protobuf `ExportTraceServiceRequest`). It listens on
//! 127.0.0.1 on a port of its own and keeps every span it receives.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{TraceService, TraceServiceServer};
use opentelemetry_proto::tonic::collector::trace::v1::{ExportTraceServiceRequest, ExportTraceServiceResponse};
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use prost::Message;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Wire {
    Grpc,
    HttpProtobuf,
}

impl Wire {
    /// The `OTEL_EXPORTER_OTLP_PROTOCOL` value.
    pub fn name(self) -> &'static str {
        match self {
            Wire::Grpc => "grpc",
            Wire::HttpProtobuf => "http/protobuf",
        }
    }
}

/// A span as received.
#[derive(Clone, Debug)]
pub struct Span {
    pub service: String,
    /// The resource's `service.instance.id` (empty when not set).
    pub instance: String,
    pub trace_id: Vec<u8>,
    pub span_id: Vec<u8>,
    /// Empty for a root.
    pub parent: Vec<u8>,
    pub name: String,
    pub attributes: BTreeMap<String, String>,
}

#[derive(Default)]
struct Received {
    spans: Vec<Span>,
    /// Request paths (http/protobuf) that were not `/v1/traces`.
    misrouted: Vec<String>,
    requests: usize,
}

fn text(v: &Option<Value>) -> String {
    match v {
        Some(Value::StringValue(s)) => s.clone(),
        Some(Value::IntValue(i)) => i.to_string(),
        Some(Value::BoolValue(b)) => b.to_string(),
        Some(Value::DoubleValue(d)) => d.to_string(),
        other => format!("{other:?}"),
    }
}

fn keep(into: &Mutex<Received>, req: ExportTraceServiceRequest) {
    let mut r = into.lock().expect("receiver lock");
    r.requests += 1;
    for rs in req.resource_spans {
        let resource = |key: &str| {
            rs.resource
                .iter()
                .flat_map(|res| res.attributes.iter())
                .find(|kv| kv.key == key)
                .map(|kv| text(&kv.value.as_ref().and_then(|v| v.value.clone())))
                .unwrap_or_default()
        };
        let (service, instance) = (resource("service.name"), resource("service.instance.id"));
        for ss in rs.scope_spans {
            for s in ss.spans {
                let attributes = s
                    .attributes
                    .iter()
                    .map(|kv| (kv.key.clone(), text(&kv.value.as_ref().and_then(|v| v.value.clone()))))
                    .collect();
                r.spans.push(Span {
                    service: service.clone(),
                    instance: instance.clone(),
                    trace_id: s.trace_id,
                    span_id: s.span_id,
                    parent: s.parent_span_id,
                    name: s.name,
                    attributes,
                });
            }
        }
    }
}

struct Collector(Arc<Mutex<Received>>);

#[tonic::async_trait]
impl TraceService for Collector {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        keep(&self.0, request.into_inner());
        Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
    }
}

async fn http_export(
    req: hyper::Request<hyper::body::Incoming>,
    into: Arc<Mutex<Received>>,
) -> Result<hyper::Response<Full<Bytes>>, hyper::Error> {
    let reply = |status: u16, body: Vec<u8>| {
        let mut resp = hyper::Response::new(Full::new(Bytes::from(body)));
        *resp.status_mut() = hyper::StatusCode::from_u16(status).expect("status");
        resp.headers_mut().insert("content-type", hyper::header::HeaderValue::from_static("application/x-protobuf"));
        resp
    };
    if req.method() != hyper::Method::POST || req.uri().path() != "/v1/traces" {
        into.lock().expect("receiver lock").misrouted.push(req.uri().path().to_string());
        return Ok(reply(404, Vec::new()));
    }
    let body = req.into_body().collect().await?.to_bytes();
    match ExportTraceServiceRequest::decode(body) {
        Ok(r) => {
            keep(&into, r);
            Ok(reply(200, ExportTraceServiceResponse::default().encode_to_vec()))
        }
        Err(_) => Ok(reply(400, Vec::new())),
    }
}

/// A running receiver; stopped when dropped.
pub struct Receiver {
    /// The base URL to give the exporter.
    pub url: String,
    received: Arc<Mutex<Received>>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Receiver {
    pub fn start(wire: Wire) -> Receiver {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1");
        listener.set_nonblocking(true).expect("nonblocking");
        let url = format!("http://{}", listener.local_addr().expect("addr"));
        let received = Arc::new(Mutex::new(Received::default()));
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let into = received.clone();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
            rt.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(listener).expect("listener");
                match wire {
                    Wire::Grpc => {
                        let incoming = tonic::transport::server::TcpIncoming::from(listener);
                        let _ = tonic::transport::Server::builder()
                            .add_service(TraceServiceServer::new(Collector(into)))
                            .serve_with_incoming_shutdown(incoming, async {
                                let _ = stopped.await;
                            })
                            .await;
                    }
                    Wire::HttpProtobuf => {
                        let mut stopped = stopped;
                        loop {
                            tokio::select! {
                                _ = &mut stopped => break,
                                accepted = listener.accept() => {
                                    let Ok((stream, _)) = accepted else { continue };
                                    let into = into.clone();
                                    tokio::spawn(async move {
                                        let service = hyper::service::service_fn(move |req| http_export(req, into.clone()));
                                        let io = hyper_util::rt::TokioIo::new(stream);
                                        let _ = hyper::server::conn::http1::Builder::new().serve_connection(io, service).await;
                                    });
                                }
                            }
                        }
                    }
                }
            });
        });
        Receiver { url, received, stop: Some(stop), thread: Some(thread) }
    }

    pub fn spans(&self) -> Vec<Span> {
        self.received.lock().expect("receiver lock").spans.clone()
    }

    pub fn requests(&self) -> usize {
        self.received.lock().expect("receiver lock").requests
    }

    pub fn misrouted(&self) -> Vec<String> {
        self.received.lock().expect("receiver lock").misrouted.clone()
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
