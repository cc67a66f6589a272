//! OpenTelemetry export and logs: the binary installs a `tracing` subscriber with an OTLP
//! exporter when an endpoint is configured (`--otlp-endpoint` or `OTEL_EXPORTER_OTLP_ENDPOINT`),
//! and flushes it before exit, and with the log lines of the commands that log. Without
//! either nothing is installed and spans cost nothing. JSON logs (the controller's default)
//! keep spans even without an exporter, so each line carries its decision's trace id: spans
//! are made (ids, attributes) and dropped when they end.
//!
//! Configuration follows the OpenTelemetry specification:
//! - the endpoint is a base URL: `http/protobuf` sends spans to `URL/v1/traces`, `grpc` to
//!   the URL itself; `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`, when set, is used as it is;
//! - `OTEL_EXPORTER_OTLP_PROTOCOL` (or `--otlp-protocol`) is `http/protobuf` (the default) or
//!   `grpc`;
//! - `OTEL_SERVICE_NAME` names the service (default `dovetail`), and
//!   `OTEL_RESOURCE_ATTRIBUTES` adds resource attributes.
//!
//! The exporter runs on its own small tokio runtime on the wall clock: `simulate` runs the
//! control plane on virtual (paused) time, which must not drive the exporter's timers.

use std::time::Duration;

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::{Protocol, SpanExporter, WithExportConfig};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::span_processor_with_async_runtime::BatchSpanProcessor;
use opentelemetry_sdk::trace::{BatchConfigBuilder, SdkTracerProvider};
use tracing_subscriber::Layer as _;
use tracing_subscriber::layer::SubscriberExt as _;

use crate::logs::{Json, LogFormat, Logs};

/// The OTLP flags (every command takes them).
#[derive(clap::Args, Clone, Debug, Default)]
pub struct TelemetryArgs {
    /// Export spans over OTLP to this base URL (e.g. http://127.0.0.1:4318 for http/protobuf,
    /// http://127.0.0.1:4317 for grpc). Nothing is exported when unset.
    #[arg(long, global = true, env = "OTEL_EXPORTER_OTLP_ENDPOINT", value_name = "URL")]
    pub otlp_endpoint: Option<String>,
    /// The OTLP protocol: http/protobuf or grpc.
    #[arg(long, global = true, env = "OTEL_EXPORTER_OTLP_PROTOCOL", default_value = "http/protobuf")]
    pub otlp_protocol: String,
}

/// What `install` set up; `shutdown` flushes it.
pub struct Telemetry {
    export: Option<(SdkTracerProvider, tokio::runtime::Runtime)>,
    /// Without an exporter, JSON logs still get trace ids: spans are made by a provider that
    /// exports nothing, kept here for the process's life.
    _ids_only: Option<SdkTracerProvider>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Wire {
    Grpc,
    HttpProtobuf,
}

/// Where spans go: the URL the exporter is given, and how it was configured.
fn endpoint(args: &TelemetryArgs, wire: Wire) -> Result<Option<(String, &'static str)>, String> {
    let signal = std::env::var("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT").ok().filter(|s| !s.is_empty());
    let (url, source, verbatim) = match (signal, args.otlp_endpoint.as_deref().filter(|s| !s.is_empty())) {
        (_, Some(base)) => (base.to_string(), "--otlp-endpoint (OTEL_EXPORTER_OTLP_ENDPOINT)", false),
        (Some(url), None) => (url, "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", true),
        (None, None) => return Ok(None),
    };
    if !url.starts_with("http://") {
        return Err(format!(
            "{source}: {url:?} is not an http:// URL (this build exports over plain HTTP/2 or HTTP/1.1, \
             to a collector or agent nearby)"
        ));
    }
    let url = match (wire, verbatim) {
        (Wire::HttpProtobuf, false) => format!("{}/v1/traces", url.trim_end_matches('/')),
        _ => url,
    };
    Ok(Some((url, source)))
}

fn wire(args: &TelemetryArgs) -> Result<Wire, String> {
    match args.otlp_protocol.as_str() {
        "grpc" => Ok(Wire::Grpc),
        "http/protobuf" => Ok(Wire::HttpProtobuf),
        other => Err(format!(
            "--otlp-protocol (OTEL_EXPORTER_OTLP_PROTOCOL): {other:?} is not supported (use grpc or http/protobuf)"
        )),
    }
}

/// Installs the global subscriber: the OTLP exporter when an endpoint is configured, and the
/// log lines of `logs` (commands that log: `controller`, `node-agent`). `instance` is the OTLP
/// resource's `service.instance.id` (each control node its own).
pub fn install(args: &TelemetryArgs, logs: Option<&Logs>, instance: Option<&str>) -> Result<Option<Telemetry>, String> {
    let export = exporter(args, instance)?;
    if export.is_none() && logs.is_none() {
        return Ok(None);
    }
    // A decision's JSON log lines carry its trace id whether or not spans are exported.
    let json = logs.is_some_and(|l| l.format == LogFormat::Json);
    let ids_only = (export.is_none() && json).then(|| SdkTracerProvider::builder().build());
    let provider = export.as_ref().map(|(p, _)| p).or(ids_only.as_ref());
    let otel = provider.map(|provider| {
        // Only dovetail's own spans: the exporter's HTTP and gRPC stacks must not trace themselves.
        let only_dovetail = tracing_subscriber::filter::Targets::new().with_target("dovetail", tracing::Level::INFO);
        tracing_opentelemetry::layer().with_tracer(provider.tracer("dovetail")).with_filter(only_dovetail)
    });
    let lines = match logs {
        Some(l) => {
            let filter = log_filter(l)?;
            let fmt = tracing_subscriber::fmt::layer().with_writer(std::io::stderr);
            Some(match l.format {
                LogFormat::Json => fmt.event_format(Json).with_filter(filter).boxed(),
                LogFormat::Text => fmt.with_filter(filter).boxed(),
            })
        }
        None => None,
    };
    tracing::subscriber::set_global_default(tracing_subscriber::registry().with(otel).with(lines))
        .map_err(|e| format!("installing the tracing subscriber: {e}"))?;
    Ok(Some(Telemetry { export, _ids_only: ids_only }))
}

/// The log filter: `RUST_LOG` when set, else `--log-level`; one that does not parse is an
/// error naming where it came from, not a silent `info`.
fn log_filter(l: &Logs) -> Result<tracing_subscriber::EnvFilter, String> {
    match std::env::var("RUST_LOG") {
        Ok(v) if !v.is_empty() => tracing_subscriber::EnvFilter::try_new(&v)
            .map_err(|e| format!("RUST_LOG: {v:?} is not a log level or filter: {e}")),
        _ => tracing_subscriber::EnvFilter::try_new(&l.level).map_err(|e| {
            format!(
                "--log-level (logLevel, DOVETAIL_LOG_LEVEL): {:?} is not a log level (debug, info, warn, error) or filter: {e}",
                l.level
            )
        }),
    }
}

/// The OTLP exporter and its runtime, when an endpoint is configured.
fn exporter(
    args: &TelemetryArgs,
    instance: Option<&str>,
) -> Result<Option<(SdkTracerProvider, tokio::runtime::Runtime)>, String> {
    let configured = args.otlp_endpoint.as_deref().is_some_and(|s| !s.is_empty())
        || std::env::var("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT").is_ok_and(|s| !s.is_empty());
    // Without an endpoint the other settings are not read (they may be meant for another tool).
    if !configured {
        return Ok(None);
    }
    let wire = wire(args)?;
    let Some((url, source)) = endpoint(args, wire)? else { return Ok(None) };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("otlp-export")
        .enable_all()
        .build()
        .map_err(|e| format!("starting the OTLP exporter's runtime: {e}"))?;
    // The exporter's client and the batch processor's task live on that runtime.
    let _entered = runtime.enter();
    let exporter = match wire {
        Wire::Grpc => SpanExporter::builder().with_tonic().with_endpoint(url.clone()).build(),
        Wire::HttpProtobuf => {
            SpanExporter::builder().with_http().with_protocol(Protocol::HttpBinary).with_endpoint(url.clone()).build()
        }
    }
    .map_err(|e| format!("{source}: building the OTLP exporter for {url}: {e}"))?;
    let batches = BatchConfigBuilder::default()
        .with_max_queue_size(65_536)
        .with_max_export_batch_size(1024)
        .with_scheduled_delay(Duration::from_secs(1))
        .build();
    let processor =
        BatchSpanProcessor::builder(exporter, opentelemetry_sdk::runtime::Tokio).with_batch_config(batches).build();
    // OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES are read by the resource's detectors.
    let mut resource = Resource::builder();
    if std::env::var("OTEL_SERVICE_NAME").is_err() {
        resource = resource.with_service_name("dovetail");
    }
    if let Some(id) = instance {
        resource = resource.with_attribute(opentelemetry::KeyValue::new("service.instance.id", id.to_string()));
    }
    let provider = SdkTracerProvider::builder().with_span_processor(processor).with_resource(resource.build()).build();
    drop(_entered);
    Ok(Some((provider, runtime)))
}

impl Telemetry {
    /// Exports every span still queued, then stops the exporter.
    pub fn shutdown(self) {
        let Some((provider, runtime)) = self.export else { return };
        if let Err(e) = provider.shutdown() {
            eprintln!("warning: flushing spans to the OTLP endpoint: {e}");
        }
        runtime.shutdown_timeout(Duration::from_secs(2));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(endpoint: Option<&str>, protocol: &str) -> TelemetryArgs {
        TelemetryArgs { otlp_endpoint: endpoint.map(str::to_string), otlp_protocol: protocol.to_string() }
    }

    #[test]
    fn a_base_url_gets_the_signal_path_for_http_only() {
        let http = endpoint(&args(Some("http://127.0.0.1:4318/"), "http/protobuf"), Wire::HttpProtobuf);
        assert_eq!(http.expect("valid").map(|e| e.0).as_deref(), Some("http://127.0.0.1:4318/v1/traces"));
        let grpc = endpoint(&args(Some("http://127.0.0.1:4317"), "grpc"), Wire::Grpc);
        assert_eq!(grpc.expect("valid").map(|e| e.0).as_deref(), Some("http://127.0.0.1:4317"));
    }

    #[test]
    fn bad_settings_name_the_flag_and_the_variable() {
        let e = wire(&args(None, "http/json")).expect_err("unsupported");
        assert!(e.contains("--otlp-protocol (OTEL_EXPORTER_OTLP_PROTOCOL)") && e.contains("http/json"), "{e}");
        let e = endpoint(&args(Some("localhost:4317"), "grpc"), Wire::Grpc).expect_err("no scheme");
        assert!(e.contains("--otlp-endpoint") && e.contains("localhost:4317"), "{e}");
    }
}
