//! The plane's settings, every window, interval, timeout, grace period, mailbox size and
//! concurrency in one place, with documented defaults and [`Config::validate`].

use std::time::Duration;

use dovetail_core::plane::BatchWindow;
use dovetail_core::scheduling::SolveOptions;

use crate::feed::FeedConfig;

/// A setting that cannot work, named.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("invalid plane setting {field}: {reason}")]
pub struct ConfigError {
    pub field: &'static str,
    pub reason: String,
}

/// Mailbox sizes. Messages driven from outside (pending pods, launches) are sent with
/// `try_send`; the policy at a full mailbox is each sender's (drop-and-resend for the feed,
/// back to the queue for the Router, hold-and-retry for launches).
#[derive(Clone, Debug, PartialEq)]
pub struct Mailboxes {
    pub router: usize,
    pub pool: usize,
    pub zone: usize,
    pub feed: usize,
}

impl Default for Mailboxes {
    fn default() -> Self {
        Mailboxes { router: 1024, pool: 1024, zone: 1024, feed: 16 }
    }
}

/// The effect executor's settings.
#[derive(Clone, Debug, PartialEq)]
pub struct ExecutorConfig {
    /// Effects in flight at once (API calls), across the plane.
    pub concurrency: usize,
    /// How often a patch is re-read and re-applied after a `Conflict` before giving up (the
    /// next reconcile asks again).
    pub conflict_retries: u32,
    /// A pod whose eviction was refused (a PodDisruptionBudget allows none, or the server
    /// throttled) is not asked again before this wait, doubled after each refusal up to
    /// `eviction_backoff_max` (Karpenter's eviction queue: 100 ms to 10 s).
    pub eviction_backoff_min: Duration,
    pub eviction_backoff_max: Duration,
}

impl Default for ExecutorConfig {
    fn default() -> Self {
        ExecutorConfig {
            concurrency: 64,
            conflict_retries: 5,
            eviction_backoff_min: Duration::from_millis(100),
            eviction_backoff_max: Duration::from_secs(10),
        }
    }
}

/// A ZoneActor's settings.
#[derive(Clone, Debug, PartialEq)]
pub struct ZoneSettings {
    /// Launches arriving within this window after the first go out as one call (Karpenter's
    /// fleet batcher: 35 ms).
    pub window: Duration,
    /// How long an offering that had no capacity stays unavailable (Karpenter: 3 min).
    pub ice_ttl: Duration,
    /// The longest a throttled call waits before it is tried again, whatever retry-after the
    /// cloud gave (the AWS SDKs cap their backoff at 20 s; a longer hint is probed).
    pub max_retry_wait: Duration,
    /// Terminations arriving within this window after the first go out as one
    /// TerminateInstances call (Karpenter's terminate batcher: 100 ms idle).
    pub terminate_window: Duration,
}

impl Default for ZoneSettings {
    fn default() -> Self {
        ZoneSettings {
            window: Duration::from_millis(35),
            ice_ttl: Duration::from_secs(180),
            max_retry_wait: Duration::from_secs(30),
            terminate_window: Duration::from_millis(100),
        }
    }
}

/// Disruption: emptiness, drift, consolidation and expiration.
#[derive(Clone, Debug)]
pub struct DisruptionConfig {
    /// Off: nothing is disrupted (expiration included).
    pub enabled: bool,
    /// How often each NodePoolActor plans disruption (Karpenter polls every 10 s).
    pub every: Duration,
    /// How long an emptiness or consolidation command must hold before it is proposed
    /// (Karpenter: 15 s).
    pub validation: Duration,
    /// Karpenter's `SpotToSpotConsolidation` feature gate.
    pub spot_to_spot: bool,
    /// A command whose replacements are not initialized by then is rolled back (Karpenter:
    /// at least 10 minutes).
    pub command_timeout: Duration,
    /// How often the cloud provider is asked which instances drifted from their node class
    /// (Karpenter re-checks each NodeClaim every 5 minutes).
    pub drift_every: Duration,
    /// Consolidation commands a round may propose at most, each simulated with the ones
    /// before it done and all within the budgets (Karpenter: one a round).
    pub max_commands: usize,
}

impl Default for DisruptionConfig {
    fn default() -> Self {
        DisruptionConfig {
            enabled: false,
            every: Duration::from_secs(10),
            validation: Duration::from_secs(15),
            spot_to_spot: false,
            command_timeout: Duration::from_secs(600),
            drift_every: Duration::from_secs(300),
            max_commands: 10,
        }
    }
}

/// The interruption queue consumers (the drain timing is `lifecycle.interruption`).
#[derive(Clone, Debug, PartialEq)]
pub struct InterruptionConfig {
    /// Long-pollers per queue to start with.
    pub consumers: usize,
    /// Long-pollers per queue at most: one more starts while receives come back full (ten
    /// messages), and an extra one stops after an empty receive.
    pub max_consumers: usize,
    /// How long a receive waits for messages (SQS long polling: at most 20 s).
    pub wait: Duration,
    /// How long a consumer pauses after an empty receive (a queue without long polling, like
    /// the sim's, answers at once).
    pub idle_pause: Duration,
    /// How long a received message stays hidden from other consumers: it is deleted once its
    /// action committed, or seen again after this (at-least-once).
    pub visibility: Duration,
    /// When a run did not act (ledger unavailable, cache not synced, too slow), how soon its
    /// messages come back to be tried again (a node that no longer leads hands them back at
    /// once). At most `visibility`.
    pub retry: Duration,
    /// Batches the handler holds at once; consumers wait beyond it (backpressure).
    pub mailbox: usize,
    /// How long the replace stage waits for record stages still running before it sizes
    /// (every sizing pays for the whole cluster, so a burst is sized once), counted from the
    /// earliest receive of the messages it holds; at most half of `visibility`.
    pub replace_wait: Duration,
}

impl Default for InterruptionConfig {
    fn default() -> Self {
        InterruptionConfig {
            consumers: 2,
            max_consumers: 16,
            wait: Duration::from_secs(20),
            idle_pause: Duration::from_millis(200),
            visibility: Duration::from_secs(60),
            retry: Duration::from_secs(5),
            mailbox: 64,
            replace_wait: Duration::from_secs(1),
        }
    }
}

/// Everything the plane's actors are configured with.
#[derive(Clone, Debug)]
pub struct Config {
    /// The Router's batch window (Karpenter: 1 s idle, 10 s max).
    pub window: BatchWindow,
    /// How often each NodePoolActor reconciles its claims.
    pub reconcile_every: Duration,
    /// How often a quiet NodePoolActor (nothing changed since its last reconcile) reconciles
    /// anyway: the delay a time-based deadline (a liveness timeout, a lost node's grace, a
    /// drain's deadline) may see.
    pub quiet_reconcile_every: Duration,
    /// A reconcile whose cluster holds at most this many pods and nodes plans on the actor's
    /// thread: it costs less than a hand-off to the blocking pool (tens of microseconds), and
    /// at this size under a millisecond, so timers still fire on time. Larger ones plan on the
    /// blocking pool.
    pub inline_plan_objects: usize,
    /// ... and at most this many claims (a claim out of capacity prices every zone's offerings
    /// of its types).
    pub inline_plan_claims: usize,
    pub feed: FeedConfig,
    pub zone: ZoneSettings,
    pub mailboxes: Mailboxes,
    pub executor: ExecutorConfig,
    pub lifecycle: dovetail_core::lifecycle::Config,
    /// How long a failed launch or termination (other than throttling) waits before it is
    /// asked again.
    pub retry_after_error: Duration,
    /// How long a launch or termination handed to a zone actor may go unanswered before it is
    /// asked again (a reply dropped at a full mailbox; the zone answers each claim once).
    pub ask_again_after: Duration,
    /// How long a launched claim's traces wait for its pods to bind.
    pub follow_for: Duration,
    /// How often a round renames and re-proposes claims whose ids the ledger refused.
    pub rename_attempts: u32,
    pub solve: SolveOptions,
    pub disruption: DisruptionConfig,
    pub interruption: InterruptionConfig,
    pub gc: GcConfig,
    /// How often R of the live fleet (`dovetail_fleet_cost_ratio`) is computed: a bound over
    /// every pod, so not at each scrape. `None`: never (a run that serves no metrics).
    pub cost_every: Option<Duration>,
}

/// Instance garbage collection (Karpenter's `instance.garbagecollection`).
#[derive(Clone, Debug, PartialEq)]
pub struct GcConfig {
    /// How often the cloud's instances tagged for the cluster are listed (Karpenter: 2 min).
    pub every: Duration,
    /// How old an instance no claim knows must be before it is terminated (Karpenter: 30 s):
    /// a launch says which instance is whose within it.
    pub grace: Duration,
}

impl Default for GcConfig {
    fn default() -> Self {
        GcConfig { every: Duration::from_secs(120), grace: Duration::from_secs(30) }
    }
}

impl Default for Config {
    fn default() -> Self {
        Config {
            window: BatchWindow::default(),
            reconcile_every: Duration::from_secs(1),
            quiet_reconcile_every: Duration::from_secs(10),
            inline_plan_objects: 5_000,
            inline_plan_claims: 100,
            feed: FeedConfig::default(),
            zone: ZoneSettings::default(),
            mailboxes: Mailboxes::default(),
            executor: ExecutorConfig::default(),
            lifecycle: dovetail_core::lifecycle::Config::default(),
            retry_after_error: Duration::from_secs(5),
            ask_again_after: Duration::from_secs(60),
            follow_for: Duration::from_secs(15 * 60),
            rename_attempts: 3,
            solve: SolveOptions::default(),
            disruption: DisruptionConfig::default(),
            interruption: InterruptionConfig::default(),
            gc: GcConfig::default(),
            cost_every: Some(Duration::from_secs(60)),
        }
    }
}

impl Config {
    /// Checks every setting; the error names the first that cannot work.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let bad = |field: &'static str, reason: &str| Err(ConfigError { field, reason: reason.to_string() });
        if self.window.idle == 0 || self.window.max < self.window.idle {
            return bad("window", "idle must be positive and at most max");
        }
        if self.reconcile_every.is_zero() || self.quiet_reconcile_every < self.reconcile_every {
            return bad("reconcile_every", "must be positive, and quiet_reconcile_every at least as long");
        }
        if self.feed.tick.is_zero() || self.feed.resend.is_zero() {
            return bad("feed", "tick and resend must be positive");
        }
        if self.zone.window.is_zero() {
            return bad("zone.window", "must be positive");
        }
        if self.zone.terminate_window.is_zero() {
            return bad("zone.terminate_window", "must be positive");
        }
        let m = &self.mailboxes;
        if m.router == 0 || m.pool == 0 || m.zone == 0 || m.feed == 0 {
            return bad("mailboxes", "every mailbox needs room for one message");
        }
        if self.executor.concurrency == 0 {
            return bad("executor.concurrency", "must be positive");
        }
        if self.executor.eviction_backoff_min.is_zero()
            || self.executor.eviction_backoff_max < self.executor.eviction_backoff_min
        {
            return bad("executor.eviction_backoff_min", "must be positive, and eviction_backoff_max at least as long");
        }
        if self.ask_again_after <= self.zone.max_retry_wait {
            return bad(
                "ask_again_after",
                "must be longer than zone.max_retry_wait (a throttled launch waits that long)",
            );
        }
        if self.zone.max_retry_wait.is_zero() || self.retry_after_error.is_zero() {
            return bad("retries", "waits must be positive");
        }
        if self.rename_attempts == 0 {
            return bad("rename_attempts", "must be positive");
        }
        if self.disruption.every.is_zero() || self.disruption.command_timeout.is_zero() {
            return bad("disruption", "every and command_timeout must be positive");
        }
        if self.disruption.max_commands == 0 {
            return bad("disruption.max_commands", "must be at least 1 (1 is Karpenter's one command a round)");
        }
        if self.gc.every.is_zero() {
            return bad("gc.every", "must be positive");
        }
        let i = &self.interruption;
        if i.consumers == 0 || i.max_consumers < i.consumers {
            return bad("interruption.consumers", "must be positive, and max_consumers at least as many");
        }
        if i.wait > Duration::from_secs(20) {
            return bad("interruption.wait", "SQS long polling waits 20 s at most");
        }
        if i.idle_pause.is_zero() || i.mailbox == 0 {
            return bad("interruption", "idle_pause and mailbox must be positive");
        }
        if i.visibility < Duration::from_secs(1) {
            return bad("interruption.visibility", "must be at least 1 s (SQS counts it in seconds)");
        }
        if i.retry > i.visibility {
            return bad("interruption.retry", "must be at most the visibility timeout");
        }
        self.lifecycle.validate().map_err(|e| ConfigError { field: "lifecycle", reason: e.to_string() })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_each_bad_setting_is_named() {
        assert_eq!(Config::default().validate(), Ok(()));
        let mut c = Config::default();
        c.mailboxes.pool = 0;
        assert_eq!(c.validate().map_err(|e| e.field), Err("mailboxes"));
        let mut c = Config::default();
        c.lifecycle.lost_grace = 0;
        assert_eq!(c.validate().map_err(|e| e.field), Err("lifecycle"));
        let mut c = Config::default();
        c.window.idle = 0;
        assert_eq!(c.validate().map_err(|e| e.field), Err("window"));
        let mut c = Config::default();
        c.disruption.max_commands = 0;
        assert_eq!(c.validate().map_err(|e| e.field), Err("disruption.max_commands"));
        let mut c = Config::default();
        c.interruption.max_consumers = 1;
        assert_eq!(c.validate().map_err(|e| e.field), Err("interruption.consumers"));
    }
}
