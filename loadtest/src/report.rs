//! The report of a run: what the cluster ended as, what it cost, how good the packing was
//! against the lower bound, how fast decisions were, and the series behind the plot.

/// Appends one formatted line to a `String` (writing to a string cannot fail).
macro_rules! say {
    ($t:expr, $($arg:tt)*) => {{
        $t.push_str(&format!($($arg)*));
        $t.push('\n');
    }};
}
use std::path::{Path, PathBuf};

use plotters::prelude::*;
use serde::Serialize;

use crate::run::Percentiles;

/// One point of the series.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Sample {
    pub at_ms: u64,
    pub nodes: usize,
    pub pending: usize,
    pub bound: usize,
    pub price_per_hour: f64,
    /// The whole process's resident memory then, MiB (where the system tells).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rss_mib: Option<f64>,
}

/// Nodes by `<nodepool> <capacity type>`: how many, their $/hour, what they have and what
/// their pods ask (CPU and memory), and their instance types.
pub type Fleet = std::collections::BTreeMap<String, FleetPart>;

/// One part of a [`Fleet`].
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct FleetPart {
    pub nodes: usize,
    pub price_per_hour: f64,
    pub cpu_allocatable_milli: i64,
    pub cpu_requested_milli: i64,
    pub memory_allocatable_bytes: i64,
    pub memory_requested_bytes: i64,
    /// Nodes by instance type.
    pub types: std::collections::BTreeMap<String, usize>,
}

/// How expirations kept to their schedule: every instance of a NodePool with `expireAfter`
/// should be gone by then (plus the time a drain takes).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct ExpiryReport {
    /// The shortest `expireAfter` of the run's NodePools, ms.
    pub expire_after_ms: u64,
    /// Nodes their NodePool expired.
    pub expirations: u64,
    /// The oldest any instance got, ms.
    pub oldest_age_ms: u64,
    /// How far past `expireAfter` the oldest got (0 when none outlived it), ms.
    pub max_overdue_ms: u64,
}

/// What changed under the plane while it ran.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Changes {
    /// NodePool edits applied (each a new spec handed to its pool and its limits to the
    /// ledger), and those retried later (no leader then).
    pub nodepool_edits: u64,
    pub nodepool_edits_retried: u64,
    /// AMIs released.
    pub ami_releases: u64,
}

/// The least-squares slope of `points` (hours, MiB), MiB a day; `None` with fewer than two.
pub fn slope_per_day(points: &[(f64, f64)]) -> Option<f64> {
    if points.len() < 2 {
        return None;
    }
    let n = points.len() as f64;
    let (mx, my) = (points.iter().map(|p| p.0).sum::<f64>() / n, points.iter().map(|p| p.1).sum::<f64>() / n);
    let sxx: f64 = points.iter().map(|p| (p.0 - mx).powi(2)).sum();
    if sxx <= 0.0 {
        return None;
    }
    let sxy: f64 = points.iter().map(|p| (p.0 - mx) * (p.1 - my)).sum();
    Some(sxy / sxx * 24.0)
}

/// The report (`report.json`).
#[derive(Clone, Debug, Serialize)]
pub struct Report {
    pub scenario: String,
    /// Cluster time the run covered.
    pub virtual_ms: u64,
    pub wall_ms: u64,
    pub realtime: bool,
    /// The Router's batch window.
    pub window: String,
    /// Pods in the cluster at the end, bound and pending.
    pub pods: usize,
    pub pods_bound: usize,
    pub pods_pending: usize,
    pub nodes: usize,
    pub peak_nodes: usize,
    /// $/hour of the instances running at the end.
    pub price_per_hour: f64,
    /// $ spent over the run (sampled $/hour integrated).
    pub spend: f64,
    /// $/hour against the cost lower bound of the same pods, at the end and when the most
    /// pods were bound (1.0 is the bound itself).
    pub r_end: Option<f64>,
    pub r_peak: Option<f64>,
    /// R of a fresh plan of the pods at the end: what the cluster could cost at best.
    pub r_plan_end: Option<f64>,
    /// The fleet at the end and a fresh plan's, by NodePool and capacity type: where a gap
    /// between the two R comes from.
    pub fleet_end: Fleet,
    pub fleet_plan: Fleet,
    /// Nodes a disruption command terminated (emptiness, drift, consolidation).
    pub nodes_disrupted: u64,
    /// How fast they went.
    pub disruption_rate: Option<DisruptionRate>,
    pub peak_at_ms: u64,
    pub peak_pods: usize,
    /// Pod decisions (placed on existing or in-flight capacity, or sent to a NodePool) and
    /// their latency from arrival at the Router, on the run's clock (virtual unless realtime).
    pub decisions: u64,
    pub latency_ms: Percentiles,
    pub claims_created: u64,
    /// Claims moved to another zone after insufficient capacity.
    pub relaunched: u64,
    /// What the scenario's faults did.
    pub faults: FaultCounts,
    /// What the interruption pipeline did (a run with an interruption queue).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub interruptions: Option<InterruptionCounts>,
    /// The most pods pending at a sample once a sample had none (a gap a fault caused);
    /// `None` when no sample had none.
    pub pending_after_settle_max: Option<usize>,
    /// The longest any pod waited pending over the run (from its creation; looked at every
    /// tick), ms: a fleet that churns for a week always has a few pods on their way, and none
    /// should wait long.
    pub max_pending_age_ms: u64,
    /// The pod that waited longest, and when it was created (ms into the run).
    #[serde(default)]
    pub longest_pending: Option<(String, u64)>,
    /// Every error the plane met, by `<action>/<kind>` (expected ones included: refused
    /// evictions, throttled calls, conflicts a re-read resolved...).
    pub errors: std::collections::BTreeMap<String, u64>,
    /// Peak RSS of the whole process (plane, sim cloud, sim cluster, driver), MiB.
    pub peak_rss_mib: Option<f64>,
    /// How the process's RSS grew after its first day (least squares over the samples from
    /// 24 h on), MiB a day; `None` for a run of a day or less.
    pub rss_slope_mib_per_day: Option<f64>,
    /// Expirations against their schedule (a NodePool with `expireAfter`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub expiry: Option<ExpiryReport>,
    /// NodePool edits and AMI releases made while the run went on.
    pub changes: Changes,
    /// The control nodes and their failovers (`--control-nodes`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub control: Option<crate::ha::ControlReport>,
    pub samples: Vec<Sample>,
}

/// Nodes disrupted per minute: over the span from the first disruption to the last, and the
/// most in any minute (from the counts at every tick).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct DisruptionRate {
    pub first_ms: u64,
    pub last_ms: u64,
    pub per_minute: f64,
    pub max_per_minute: u64,
}

impl DisruptionRate {
    /// From `(time, nodes disrupted so far)` at each tick the count grew.
    pub fn of(counts: &[(u64, u64)]) -> Option<DisruptionRate> {
        let (&(first_ms, _), &(last_ms, total)) = (counts.first()?, counts.last()?);
        // Counted from zero: the first tick's disruptions are in the span.
        let before = 0;
        let minutes = ((last_ms - first_ms) as f64 / 60_000.0).max(1.0);
        let mut max = 0;
        for (i, &(at, n)) in counts.iter().enumerate() {
            let start = counts[..i].iter().rev().find(|(t, _)| at.saturating_sub(*t) >= 60_000).map_or(before, |c| c.1);
            max = max.max(n - start);
        }
        Some(DisruptionRate { first_ms, last_ms, per_minute: (total - before) as f64 / minutes, max_per_minute: max })
    }
}

/// What the faults did over a run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct FaultCounts {
    /// Spot interruption warnings EC2 sent.
    pub warned: u64,
    /// Spot instances EC2 reclaimed after their two-minute warning (still running then).
    pub interrupted: u64,
    /// Warned instances already gone when EC2 came for them: drained and terminated first.
    pub gone_before_reclaim: u64,
    /// Instances gone with a lost zone.
    pub zone_lost: u64,
    /// Claims whose node went away under them (deleted when its instance was gone), which
    /// dovetail then terminated and replaced.
    pub nodes_lost: u64,
    /// EC2 calls the sim cloud throttled.
    pub throttled: u64,
}

/// The interruption actor's counts over a run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct InterruptionCounts {
    pub received: u64,
    pub acted: u64,
    pub duplicates: u64,
    pub replacements: u64,
    pub replacements_denied: u64,
    pub pods_on_existing: u64,
    /// Per instance acted on, from its message's sending to its node tainted and to its
    /// replacements created (their pools asked to launch), ms.
    pub sent_to_taint: crate::run::Percentiles,
    pub sent_to_replacement: crate::run::Percentiles,
    /// Runs of the interruption actor (each acts on the batches that arrived during the one
    /// before).
    pub runs: u64,
    /// Where the runs' time went (dovetail_actors::interruption::PHASES, then the delete),
    /// ms summed over the runs; and the longest run, ms.
    pub phase_ms: [u64; 8],
    pub longest_run_ms: u64,
    /// The scenario's `interruption_burst`, when it has one.
    pub burst: Option<BurstCounts>,
}

/// An interruption burst, measured: what the benchmark reports.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct BurstCounts {
    /// Messages sent, each for a different instance.
    pub messages: u64,
    /// Instances handled: recorded as interrupted, their replacements sized, their nodes
    /// tainted (or drained and gone); and the rest, lost.
    pub handled: u64,
    pub lost: u64,
    /// Messages handled a second: `handled` over the time from the first sent to the last
    /// deleted. Only on the wall clock (virtual time measures no rate).
    pub handled_per_second: Option<f64>,
    /// Per instance with replacements, from its message's sending to the cloud's launch of
    /// its first replacement (the launch call made), ms.
    pub sent_to_launch: crate::run::Percentiles,
    /// Instances of the burst the ledger has recorded as interrupted (one record each).
    pub recorded: u64,
    /// Messages still in the queue at the end (visible or hidden).
    pub left_in_queue: u64,
}

/// A plotted series: its name, colour and value.
type Series = (&'static str, RGBColor, fn(&Sample) -> f64);

fn hours(ms: u64) -> f64 {
    ms as f64 / 3.6e6
}

/// A time of the run as `h:mm:ss`.
fn hms(ms: u64) -> String {
    let s = ms / 1000;
    format!("{}:{:02}:{:02}", s / 3600, s / 60 % 60, s % 60)
}

fn opt_ms(v: Option<u64>) -> String {
    v.map_or_else(|| "-".into(), |v| format!("{v} ms"))
}

fn opt_r(v: Option<f64>) -> String {
    v.map_or_else(|| "-".into(), |v| format!("{v:.3}"))
}

/// Where the report went.
#[derive(Clone, Debug)]
pub struct Written {
    pub json: PathBuf,
    pub plot: PathBuf,
}

impl Report {
    /// The summary printed at the end.
    pub fn text(&self, written: Option<&Written>) -> String {
        let mut t = String::new();
        let clock = if self.realtime { "wall clock" } else { "virtual" };
        say!(
            t,
            "scenario {}: {:.1} h of cluster time ({clock}) in {:.1} s",
            self.scenario,
            hours(self.virtual_ms),
            self.wall_ms as f64 / 1e3
        );
        say!(t, "pods placed      {} of {} ({} pending)", self.pods_bound, self.pods, self.pods_pending);
        say!(t, "nodes            {} (peak {})", self.nodes, self.peak_nodes);
        say!(t, "cost             {:.2} $/h now, {:.2} $ over the run", self.price_per_hour, self.spend);
        say!(
            t,
            "R (cost / bound) {} at the peak ({} pods at {:.1} h), {} at the end (a fresh plan: {})",
            opt_r(self.r_peak),
            self.peak_pods,
            hours(self.peak_at_ms),
            opt_r(self.r_end),
            opt_r(self.r_plan_end)
        );
        for (label, fleet) in [("fleet at the end", &self.fleet_end), ("a fresh plan", &self.fleet_plan)] {
            let parts: Vec<String> = fleet
                .iter()
                .map(|(k, f)| {
                    format!(
                        "{k}: {} nodes, {:.2} $/h, CPU {:.0}% and memory {:.0}% asked ({})",
                        f.nodes,
                        f.price_per_hour,
                        100.0 * f.cpu_requested_milli as f64 / f.cpu_allocatable_milli.max(1) as f64,
                        100.0 * f.memory_requested_bytes as f64 / f.memory_allocatable_bytes.max(1) as f64,
                        f.types.iter().map(|(t, n)| format!("{n} {t}")).collect::<Vec<_>>().join(", ")
                    )
                })
                .collect();
            if !parts.is_empty() {
                say!(t, "{label:<17}{}", parts.join("; "));
            }
        }
        say!(t, "nodes disrupted  {}", self.nodes_disrupted);
        if let Some(r) = &self.disruption_rate {
            say!(
                t,
                "disruption rate  {:.2} nodes/min from {} to {} (at most {} in a minute)",
                r.per_minute,
                hms(r.first_ms),
                hms(r.last_ms),
                r.max_per_minute
            );
        }
        let l = &self.latency_ms;
        say!(
            t,
            "decision latency p50 {} / p90 {} / p99 {} / max {} over {} decisions ({clock}; window {})",
            opt_ms(l.p50),
            opt_ms(l.p90),
            opt_ms(l.p99),
            opt_ms(l.max),
            self.decisions,
            self.window
        );
        say!(t, "claims           {} created, {} moved after ICE", self.claims_created, self.relaunched);
        let f = &self.faults;
        if *f != FaultCounts::default() {
            say!(
                t,
                "faults           {} spot warnings, {} reclaimed running, {} gone before the reclaim, {} lost with a zone, {} nodes lost and replaced, {} calls throttled",
                f.warned,
                f.interrupted,
                f.gone_before_reclaim,
                f.zone_lost,
                f.nodes_lost,
                f.throttled
            );
        }
        if let Some(i) = &self.interruptions {
            say!(
                t,
                "interruptions    {} messages, {} nodes acted on, {} duplicates, {} replacements launched ({} denied), {} pods fit existing nodes",
                i.received,
                i.acted,
                i.duplicates,
                i.replacements,
                i.replacements_denied,
                i.pods_on_existing
            );
            let p = |v: &crate::run::Percentiles| {
                format!("p50 {} / p99 {} / max {}", opt_ms(v.p50), opt_ms(v.p99), opt_ms(v.max))
            };
            say!(
                t,
                "                 sent to taint {}, sent to replacement {}, {} runs",
                p(&i.sent_to_taint),
                p(&i.sent_to_replacement),
                i.runs
            );
            let phases = dovetail_actors::interruption::PHASES.iter().chain(["delete"].iter());
            let spent: Vec<String> = phases.zip(i.phase_ms.iter()).map(|(p, ms)| format!("{p} {ms}")).collect();
            say!(
                t,
                "                 run time by phase (ms, summed): {}; longest run {} ms",
                spent.join(", "),
                i.longest_run_ms
            );
            if let Some(b) = &i.burst {
                say!(
                    t,
                    "burst            {} messages, {} handled ({} lost), {}, sent to launch {}, {} recorded, {} left in the queue",
                    b.messages,
                    b.handled,
                    b.lost,
                    b.handled_per_second
                        .map_or_else(|| "no rate on virtual time".to_string(), |r| format!("{r:.0} handled/s")),
                    p(&b.sent_to_launch),
                    b.recorded,
                    b.left_in_queue
                );
            }
        }
        if let Some(n) = self.pending_after_settle_max {
            say!(t, "pending          at most {n} at a sample after the first with none pending");
        }
        match &self.longest_pending {
            Some((pod, created)) => say!(
                t,
                "longest pending  {} s (a pod's wait from its creation to its binding: {pod}, created at {:.2} h)",
                self.max_pending_age_ms / 1000,
                hours(*created)
            ),
            None => say!(t, "longest pending  0 s (no pod waited)"),
        }
        if let Some(rss) = self.peak_rss_mib {
            say!(t, "peak RSS         {rss:.0} MiB (whole process)");
        }
        if let Some(slope) = self.rss_slope_mib_per_day {
            let first = self.samples.iter().find(|s| s.at_ms >= 24 * 3_600_000).and_then(|s| s.rss_mib);
            let last = self.samples.last().and_then(|s| s.rss_mib);
            say!(
                t,
                "memory           {slope:+.1} MiB a day after the first day ({} MiB at 24 h, {} MiB at the end)",
                first.map_or_else(|| "-".into(), |v| format!("{v:.0}")),
                last.map_or_else(|| "-".into(), |v| format!("{v:.0}"))
            );
        }
        if let Some(e) = &self.expiry {
            say!(
                t,
                "expirations      {} nodes expired (expireAfter {:.1} h); the oldest instance lived {:.2} h, {} s past it",
                e.expirations,
                hours(e.expire_after_ms),
                hours(e.oldest_age_ms),
                e.max_overdue_ms / 1000
            );
        }
        let c = &self.changes;
        if *c != Changes::default() {
            say!(
                t,
                "changes          {} NodePool edits ({} retried for want of a leader), {} AMI releases",
                c.nodepool_edits,
                c.nodepool_edits_retried,
                c.ami_releases
            );
        }
        if let Some(c) = &self.control {
            let every = c.kill_every_ms.map_or_else(|| "never".to_string(), |ms| format!("every {} s", ms / 1000));
            say!(t, "control nodes    {} (leader killed {every}): {} failovers", c.nodes, c.failovers.len());
            say!(
                t,
                "                 new leader p50 {} / p99 {} / max {}; first new claims max {}",
                opt_ms(c.lead_after_p50_ms),
                opt_ms(c.lead_after_p99_ms),
                opt_ms(c.max_lead_after_ms),
                opt_ms(c.max_decision_after_ms)
            );
            say!(
                t,
                "                 {} terms led ({} without a kill), {} proposals of a dead leader's term fenced, {} claims launched twice ({} names reused by a later claim, {} instances of a claim the ledger no longer held), {} raft messages ({} lost to injected faults)",
                c.terms_led,
                c.elections_without_kill,
                c.fenced,
                c.claims_launched_twice,
                c.names_reused,
                c.instances_unattributed,
                c.messages,
                c.messages_lost
            );
            for l in &c.launched_twice {
                say!(t, "                 launched twice: {l}");
            }
            say!(
                t,
                "                 {} lease lapses outside a kill (longest {} ms)",
                c.lease_lapses,
                c.longest_lapse_ms
            );
            for f in c.failovers.iter().take(5) {
                let decided = match (f.pending_at_lead, f.decision_after_ms) {
                    (0, _) => "no pods pending".to_string(),
                    (n, Some(ms)) => format!("{n} pods pending, new claims after {ms} ms"),
                    (n, None) => format!("{n} pods pending, no new claims within the batch window"),
                };
                say!(
                    t,
                    "  at {:>8.1} s: node {} (term {}) killed; node {} leads term {} after {}; {decided}",
                    f.killed_at_ms as f64 / 1e3,
                    f.killed,
                    f.from_term,
                    f.leader.map_or_else(|| "-".to_string(), |l| l.to_string()),
                    f.to_term.map_or_else(|| "-".to_string(), |t| t.to_string()),
                    opt_ms(f.lead_after_ms),
                );
            }
            if c.failovers.len() > 5 {
                say!(t, "  ... {} more in report.json", c.failovers.len() - 5);
            }
        }
        if !self.errors.is_empty() {
            let list: Vec<String> = self.errors.iter().map(|(k, n)| format!("{k} {n}")).collect();
            say!(t, "errors seen      {}", list.join(", "));
        }
        if let Some(w) = written {
            say!(t, "report           {}", w.json.display());
            say!(t, "plot             {}", w.plot.display());
        }
        t
    }

    /// The thresholds this run missed, each as a sentence (empty: all met).
    pub fn misses(&self, t: &crate::scenario::Thresholds) -> Vec<String> {
        let mut out = Vec::new();
        let mut latency = |name: &str, got: Option<u64>, max: Option<u64>| {
            if let Some(max) = max {
                match got {
                    Some(v) if v <= max => {}
                    Some(v) => out.push(format!("decision latency {name} {v} ms > {max} ms")),
                    None => out.push(format!("decision latency {name}: no decisions were made")),
                }
            }
        };
        latency("p99", self.latency_ms.p99, t.max_decision_p99_ms);
        latency("p50", self.latency_ms.p50, t.max_decision_p50_ms);
        if let Some(max) = t.max_r {
            match self.r_peak {
                Some(r) if r <= max => {}
                Some(r) => out.push(format!("R at the peak {r:.3} > {max}")),
                None => out.push("R at the peak: no lower bound (no pods)".into()),
            }
        }
        if let Some(max) = t.max_rss_mib {
            match self.peak_rss_mib {
                Some(r) if r <= max => {}
                Some(r) => out.push(format!("peak RSS {r:.0} MiB > {max} MiB")),
                None => out.push("peak RSS: not measurable on this system".into()),
            }
        }
        if let Some(max) = t.max_pending_at_end
            && self.pods_pending > max
        {
            out.push(format!("{} pods pending at the end > {max}", self.pods_pending));
        }
        if let Some(max) = t.max_pending_age_ms
            && self.max_pending_age_ms > max
        {
            out.push(format!("a pod waited pending {} s > {} s", self.max_pending_age_ms / 1000, max / 1000));
        }
        if let Some(max) = t.max_rss_slope_mib_per_day {
            match self.rss_slope_mib_per_day {
                Some(v) if v <= max => {}
                Some(v) => out.push(format!("memory grew {v:.1} MiB a day after the first day > {max}")),
                None => out.push("memory slope: the run is not over a day long, or RSS is not measurable".into()),
            }
        }
        let control = self.control.as_ref();
        let need_control =
            |what: &str, out: &mut Vec<String>| out.push(format!("{what}: the run had no control nodes"));
        if let Some(max) = t.max_lease_lapses {
            match control {
                Some(c) if c.lease_lapses <= max => {}
                Some(c) => out.push(format!("{} lease lapses outside a kill > {max}", c.lease_lapses)),
                None => need_control("lease lapses", &mut out),
            }
        }
        if let Some(max) = t.max_elections_without_kill {
            match control {
                Some(c) if c.elections_without_kill <= max => {}
                Some(c) => out.push(format!("{} elections without a kill > {max}", c.elections_without_kill)),
                None => need_control("elections", &mut out),
            }
        }
        if let Some(max) = t.max_claims_launched_twice {
            match control {
                Some(c) if c.claims_launched_twice <= max => {}
                Some(c) => out.push(format!(
                    "{} claims launched twice > {max} ({})",
                    c.claims_launched_twice,
                    c.launched_twice.join("; ")
                )),
                None => need_control("claims launched twice", &mut out),
            }
        }
        if let Some(max) = t.max_r_over_plan {
            match (self.r_end, self.r_plan_end) {
                (Some(end), Some(plan)) if end - plan <= max => {}
                (Some(end), Some(plan)) => out
                    .push(format!("R at the end {end:.3} is {:.3} over a fresh plan's {plan:.3} > {max}", end - plan)),
                _ => out.push("R over a fresh plan: no lower bound at the end (no pods)".into()),
            }
        }
        if let Some(max) = t.max_expiry_overdue_ms {
            match &self.expiry {
                Some(e) if e.max_overdue_ms <= max => {}
                Some(e) => out.push(format!(
                    "an instance lived {} s past its expireAfter > {} s",
                    e.max_overdue_ms / 1000,
                    max / 1000
                )),
                None => out.push("expiry: no NodePool has expireAfter".into()),
            }
        }
        if let Some(min) = t.min_expirations {
            let got = self.expiry.map_or(0, |e| e.expirations);
            if got < min {
                out.push(format!("{got} nodes expired < {min}"));
            }
        }
        out
    }

    /// Writes `report.json` and `plot.svg` into `dir`.
    pub fn write(&self, dir: &Path) -> std::io::Result<Written> {
        std::fs::create_dir_all(dir)?;
        let json = dir.join("report.json");
        let text = serde_json::to_string_pretty(self).map_err(std::io::Error::other)?;
        std::fs::write(&json, text)?;
        let plot = dir.join("plot.svg");
        self.plot(&plot).map_err(|e| std::io::Error::other(format!("plot {}: {e}", plot.display())))?;
        Ok(Written { json, plot })
    }

    /// Nodes, pending pods and $/h over time, one panel each.
    pub fn plot(&self, path: &Path) -> Result<(), Box<dyn std::error::Error>> {
        let root = SVGBackend::new(path, (960, 720)).into_drawing_area();
        root.fill(&WHITE)?;
        let with_rss = self.samples.iter().any(|s| s.rss_mib.is_some());
        let mut series: Vec<Series> = vec![
            ("nodes", BLUE, |s| s.nodes as f64),
            ("pending pods", RED, |s| s.pending as f64),
            ("$/h", GREEN, |s| s.price_per_hour),
        ];
        if with_rss {
            series.push(("RSS MiB", MAGENTA, |s| s.rss_mib.unwrap_or(0.0)));
        }
        let panels = root.split_evenly((series.len(), 1));
        let end = hours(self.samples.last().map_or(self.virtual_ms, |s| s.at_ms)).max(1e-3);
        for (panel, (name, color, value)) in panels.iter().zip(series.iter()) {
            let top = self.samples.iter().map(value).fold(0.0f64, f64::max).max(1.0) * 1.1;
            let mut chart = ChartBuilder::on(panel)
                .caption(format!("{name} ({})", self.scenario), ("sans-serif", 16))
                .margin(8)
                .x_label_area_size(28)
                .y_label_area_size(56)
                .build_cartesian_2d(0.0..end, 0.0..top)?;
            chart.configure_mesh().x_desc("hours").draw()?;
            chart.draw_series(LineSeries::new(self.samples.iter().map(|s| (hours(s.at_ms), value(s))), color))?;
        }
        root.present()?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::DisruptionRate;

    #[test]
    fn a_memory_slope_is_its_least_squares_line_a_day() {
        assert_eq!(super::slope_per_day(&[(24.0, 100.0)]), None);
        let flat = super::slope_per_day(&[(24.0, 100.0), (48.0, 101.0), (72.0, 99.0), (96.0, 100.0)]).expect("slope");
        assert!(flat.abs() < 0.5, "{flat}");
        let growing: Vec<(f64, f64)> = (0..100).map(|h| (24.0 + f64::from(h), 100.0 + f64::from(h) / 2.0)).collect();
        let slope = super::slope_per_day(&growing).expect("slope");
        assert!((slope - 12.0).abs() < 1e-9, "half a MiB an hour is 12 a day: {slope}");
    }

    #[test]
    fn the_disruption_rate_spans_first_to_last_and_finds_the_busiest_minute() {
        assert_eq!(DisruptionRate::of(&[]), None);
        // 2 at 0 s, 5 at 30 s, 6 at 90 s, 10 at 300 s.
        let r = DisruptionRate::of(&[(0, 2), (30_000, 5), (90_000, 6), (300_000, 10)]).expect("a rate");
        assert_eq!((r.first_ms, r.last_ms), (0, 300_000));
        assert!((r.per_minute - 2.0).abs() < 1e-9, "10 nodes over 5 minutes: {r:?}");
        assert_eq!(r.max_per_minute, 5, "the first minute's five (0 to 30 s)");
        let one = DisruptionRate::of(&[(60_000, 3)]).expect("a rate");
        assert_eq!((one.per_minute, one.max_per_minute), (3.0, 3), "one burst counts as a minute");
    }
}
