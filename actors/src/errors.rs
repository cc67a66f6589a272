//! Every error the plane meets is seen: logged with the object and the action, and counted
//! by kind, so that reports and, later, metrics show them. Nothing is dropped silently.

use std::collections::BTreeMap;
use std::sync::Mutex;

/// Error counters by `<action>/<kind>` (`patch_node/conflict`, `launch/insufficient_capacity`).
#[derive(Debug, Default)]
pub struct Errors {
    counts: Mutex<BTreeMap<String, u64>>,
}

impl Errors {
    pub fn new() -> Self {
        Errors::default()
    }

    /// Logs a warning naming the object and the action, and counts it.
    pub fn warn(&self, action: &str, kind: &str, object: &str, error: &dyn std::fmt::Display) {
        tracing::warn!(action, object, error = %error, "{action} of {object} failed");
        self.count(action, kind);
    }

    /// Counts an error that is expected now and then (a refused eviction, a conflict that a
    /// re-read resolves) and logs it at debug.
    pub fn note(&self, action: &str, kind: &str, object: &str, error: &dyn std::fmt::Display) {
        tracing::debug!(action, object, error = %error, "{action} of {object}: {error}");
        self.count(action, kind);
    }

    fn count(&self, action: &str, kind: &str) {
        let mut c = self.counts.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        *c.entry(format!("{action}/{kind}")).or_default() += 1;
    }

    /// The counts so far.
    pub fn counts(&self) -> BTreeMap<String, u64> {
        self.counts.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_are_counted_by_action_and_kind() {
        let e = Errors::new();
        e.warn("patch_node", "conflict", "node/ip-1", &"changed since it was read");
        e.note("evict", "disruption_budget", "pod/default/web-0", &"PDB");
        e.note("evict", "disruption_budget", "pod/default/web-1", &"PDB");
        let c = e.counts();
        assert_eq!(c.get("patch_node/conflict"), Some(&1));
        assert_eq!(c.get("evict/disruption_budget"), Some(&2));
    }
}
