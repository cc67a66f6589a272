//! Trace causes: one trace per pending-pod class decision, carried across mailboxes.
//!
//! The Router opens a root span (`router.route`) for each class of pods it decides in a batch.
//! Its OpenTelemetry context travels with the pods and claims as a [`Cause`] in the actor
//! messages, and every later step of that decision opens a child span in the same trace:
//!
//! ```text
//! router.route                      pod_class, pods
//! ├─ router.simulate                the Router's solve
//! └─ nodepool.provision             nodepool
//!    ├─ nodepool.simulate           the pool's solve
//!    ├─ ledger.reserve              the round's reservation
//!    ├─ router.route                pods the pool gave back, offered to the next pool
//!    └─ zone.launch                 zone, nodeclaim, instance_type, capacity_type
//!       └─ nodepool.register        the claim's node registered
//!          └─ cluster.bind          the class's pods on the claim bound to the node
//! ```
//!
//! A claim packed with pods of several classes is launched once, with a `zone.launch` span in
//! each of their traces. Spans are emitted through `tracing`; only the binary installs the
//! subscriber and exporter. With none installed, spans are disabled, causes are empty and
//! nothing is kept for them.

use opentelemetry::trace::{SpanId, TraceContextExt};
use tracing_opentelemetry::OpenTelemetrySpanExt;

/// The OpenTelemetry context a decision's later steps join (empty when untraced).
#[derive(Clone, Debug, Default)]
pub struct Cause(opentelemetry::Context);

impl Cause {
    /// The cause whose children are children of `span`.
    pub fn of(span: &tracing::Span) -> Self {
        if span.is_disabled() {
            return Cause::default();
        }
        Cause(span.context())
    }

    /// Whether a trace is being recorded for it.
    pub fn is_traced(&self) -> bool {
        self.0.span().span_context().is_valid()
    }

    /// The span id it stands for (invalid when untraced).
    pub fn span_id(&self) -> SpanId {
        self.0.span().span_context().span_id()
    }

    /// Makes `span` (just created, not yet entered) a child of this cause: the same trace.
    pub fn adopt(&self, span: &tracing::Span) {
        if self.is_traced()
            && !span.is_disabled()
            && let Err(e) = span.set_parent(self.0.clone())
        {
            // Only without the OpenTelemetry layer, when there is no trace to join.
            tracing::debug!(error = %e, "a span could not join its decision's trace");
        }
    }
}

impl PartialEq for Cause {
    fn eq(&self, other: &Self) -> bool {
        self.0.span().span_context() == other.0.span().span_context()
    }
}

/// The cause of the `i`th of a message's pods: `causes` is parallel to the pods, or empty
/// when the sender traced nothing.
pub fn cause_at(causes: &[Cause], i: usize) -> Cause {
    causes.get(i).cloned().unwrap_or_default()
}

/// The distinct traced causes among `causes`, in order of first appearance.
pub fn distinct<'a>(causes: impl IntoIterator<Item = &'a Cause>) -> Vec<Cause> {
    let mut out: Vec<Cause> = Vec::new();
    for c in causes {
        if c.is_traced() && !out.iter().any(|o| o.span_id() == c.span_id()) {
            out.push(c.clone());
        }
    }
    out
}

/// Whether spans are recorded at all (a subscriber that takes `INFO` spans is installed).
pub fn enabled() -> bool {
    tracing::span_enabled!(tracing::Level::INFO)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_a_subscriber_causes_are_empty_and_adopting_does_nothing() {
        let span = tracing::info_span!("router.route");
        let cause = Cause::of(&span);
        assert!(!cause.is_traced());
        assert_eq!(cause_at(&[], 3), Cause::default());
        assert!(distinct([&cause, &Cause::default()]).is_empty());
        cause.adopt(&tracing::info_span!("zone.launch"));
        assert!(!enabled());
    }

    #[test]
    fn an_adopted_span_joins_the_trace_of_its_cause() {
        use opentelemetry::trace::TracerProvider as _;
        use tracing_subscriber::layer::SubscriberExt;

        let provider = opentelemetry_sdk::trace::SdkTracerProvider::builder().build();
        let subscriber =
            tracing_subscriber::registry().with(tracing_opentelemetry::layer().with_tracer(provider.tracer("test")));
        tracing::subscriber::with_default(subscriber, || {
            assert!(enabled());
            let root = tracing::info_span!(parent: None, "router.route");
            let cause = Cause::of(&root);
            assert!(cause.is_traced());
            // Another root, as a span opened in another actor's handler would be.
            let child = tracing::info_span!(parent: None, "zone.launch");
            cause.adopt(&child);
            let (r, c) = (root.context(), child.context());
            let (r, c) = (r.span().span_context().clone(), c.span().span_context().clone());
            assert_eq!(c.trace_id(), r.trace_id());
            assert_ne!(c.span_id(), r.span_id());
            let other = Cause::of(&tracing::info_span!(parent: None, "router.route"));
            assert_ne!(other.0.span().span_context().trace_id(), r.trace_id(), "a new root is a new trace");
            assert_eq!(distinct([&cause, &other, &cause.clone()]).len(), 2);
        });
    }
}
