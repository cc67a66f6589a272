//! The controller's logs: one JSON object per line by default (Karpenter's keys: `level`,
//! `time`, `logger`, `message`, then the event's fields), or text with `--log-format text`.
//! A line logged inside a traced decision carries its `trace_id` and `span_id`, so a log
//! search finds the decision's trace and the trace its log lines.

use std::fmt;
use std::time::{SystemTime, UNIX_EPOCH};

use opentelemetry::trace::TraceContextExt as _;
use serde_json::{Map, Value};
use tracing::field::{Field, Visit};
use tracing::{Event, Subscriber};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::registry::LookupSpan;

/// How log lines are written.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    #[default]
    Json,
    Text,
}

/// The log settings of a command that logs (`controller`, `node-agent`).
#[derive(Clone, Debug)]
pub struct Logs {
    pub format: LogFormat,
    /// A level (`debug`, `info`, `warn`, `error`) or a full filter (`info,kube_client=error`);
    /// `RUST_LOG`, when set, is used instead.
    pub level: String,
}

/// One JSON object per event.
pub struct Json;

struct Fields<'a>(&'a mut Map<String, Value>);

impl Visit for Fields<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.0.insert(key(field), Value::String(format!("{value:?}")));
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(key(field), Value::String(value.to_string()));
    }
    fn record_i64(&mut self, field: &Field, value: i64) {
        self.0.insert(key(field), Value::from(value));
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        self.0.insert(key(field), Value::from(value));
    }
    fn record_f64(&mut self, field: &Field, value: f64) {
        self.0.insert(key(field), Value::from(value));
    }
    fn record_bool(&mut self, field: &Field, value: bool) {
        self.0.insert(key(field), Value::from(value));
    }
}

fn key(field: &Field) -> String {
    match field.name() {
        "message" => "message".into(),
        n => n.to_string(),
    }
}

/// RFC 3339 UTC with milliseconds, from the wall clock (core's date, the millis added).
fn now_rfc3339() -> String {
    let d = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
    let seconds = dovetail_core::clock::rfc3339(d.as_secs());
    format!("{}.{:03}Z", seconds.trim_end_matches('Z'), d.subsec_millis())
}

impl<S, N> FormatEvent<S, N> for Json
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(&self, ctx: &FmtContext<'_, S, N>, mut writer: Writer<'_>, event: &Event<'_>) -> fmt::Result {
        let meta = event.metadata();
        let mut line = Map::new();
        line.insert("level".into(), Value::String(meta.level().as_str().to_lowercase()));
        line.insert("time".into(), Value::String(now_rfc3339()));
        line.insert("logger".into(), Value::String(meta.target().to_string()));
        let mut fields = Map::new();
        event.record(&mut Fields(&mut fields));
        line.insert("message".into(), fields.remove("message").unwrap_or(Value::String(String::new())));
        // The decision this line is part of: its span's trace (the event's parent, or the
        // span it was logged in).
        if let Some(span) = ctx.event_scope().and_then(|mut scope| scope.next()) {
            let id = span.id();
            let cx = tracing::dispatcher::get_default(|d| tracing_opentelemetry::get_otel_context(&id, d));
            if let Some(cx) = cx {
                let sc = cx.span().span_context().clone();
                if sc.is_valid() {
                    line.insert("trace_id".into(), Value::String(sc.trace_id().to_string()));
                    line.insert("span_id".into(), Value::String(sc.span_id().to_string()));
                }
            }
            line.insert("span".into(), Value::String(span.name().to_string()));
        }
        line.extend(fields);
        let text = serde_json::to_string(&Value::Object(line)).map_err(|_| fmt::Error)?;
        writeln!(writer, "{text}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    use opentelemetry::trace::TracerProvider as _;
    use tracing_subscriber::layer::SubscriberExt as _;

    /// Where the test's log lines go.
    #[derive(Clone, Default)]
    struct Buffer(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Buffer {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner).extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Buffer {
        type Writer = Buffer;
        fn make_writer(&'a self) -> Buffer {
            self.clone()
        }
    }

    #[test]
    fn a_line_is_one_json_object_with_karpenters_keys_and_its_decisions_trace_id() {
        let buffer = Buffer::default();
        // As `telemetry::install` makes it with JSON logs and no exporter: spans get ids. The
        // global default, as in the binary: a formatter reads the span's trace through the
        // dispatcher, and a scoped one reads as none while it dispatches.
        let provider = opentelemetry_sdk::trace::SdkTracerProvider::builder().build();
        let subscriber = tracing_subscriber::registry()
            .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("dovetail")))
            .with(tracing_subscriber::fmt::layer().with_writer(buffer.clone()).event_format(Json));
        assert!(tracing::subscriber::set_global_default(subscriber).is_ok(), "the only test that installs one");
        tracing::info!(nodepool = "default", "outside any decision (logs test)");
        {
            let span = tracing::info_span!("router.route", pods = 3);
            let _in = span.enter();
            tracing::warn!(nodepool = "default", claims = 2, ok = true, "computed new nodeclaim(s) (logs test)");
        }
        let text = String::from_utf8(buffer.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone())
            .unwrap_or_default();
        // Other tests of this binary may log meanwhile: this test's lines by their messages.
        let lines: Vec<Value> = text.lines().map(|l| serde_json::from_str(l).unwrap_or(Value::Null)).collect();
        assert!(lines.iter().all(Value::is_object), "every line is one JSON object: {text}");
        let find = |m: &str| lines.iter().find(|l| l["message"] == m).cloned().unwrap_or(Value::Null);
        let (plain, decision) =
            (find("outside any decision (logs test)"), find("computed new nodeclaim(s) (logs test)"));
        assert!(plain.is_object() && decision.is_object(), "{text}");
        assert!(plain.get("trace_id").is_none() && plain.get("span").is_none(), "{plain}");
        assert_eq!(decision["level"], "warn");
        assert_eq!(decision["logger"], "dovetail::logs::tests");
        let fields = (&decision["nodepool"], &decision["claims"], &decision["ok"]);
        assert_eq!(fields, (&Value::from("default"), &Value::from(2), &Value::from(true)), "{decision}");
        assert_eq!(decision["span"], "router.route");
        let hex =
            |v: &Value, n: usize| v.as_str().is_some_and(|s| s.len() == n && s.bytes().all(|b| b.is_ascii_hexdigit()));
        assert!(hex(&decision["trace_id"], 32) && hex(&decision["span_id"], 16), "{decision}");
        assert!(decision["time"].as_str().is_some_and(|t| t.ends_with('Z')), "{decision}");
    }

    #[test]
    fn time_is_rfc3339_utc() {
        let t = now_rfc3339();
        assert_eq!(t.len(), "2026-11-27T17:32:33.123Z".len(), "{t}");
        assert!(t.ends_with('Z') && t.as_bytes()[10] == b'T', "{t}");
        assert!(t.as_str() >= "2025-01-01", "{t}");
    }
}
