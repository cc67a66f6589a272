//! The control plane's small decisions, pure so that the actors stay thin shells: when a batch
//! window closes, which zone a claim launches in, when a claim has outlived its liveness
//! timeouts, and which pods a drain evicts next.

use std::collections::{BTreeMap, HashMap, HashSet};

use crate::ledger::{ClaimState, Millis};
use crate::pod::{Pod, PodKey};
use crate::taints::{Effect, Taint};

mod launch;
pub use launch::{
    ClaimPlan, TypesByName, ZoneChoice, allowed_zones, capacity_types, launch_order, pick_zone, plan_claim,
    relaunch_zone, types_by_name, unmarked_candidates,
};

/// When a batch of pending pods is handed to the solver (Karpenter: 1 s idle, 10 s max).
#[derive(Clone, Debug, PartialEq)]
pub struct BatchWindow {
    /// Closes once nothing arrived for this long.
    pub idle: Millis,
    /// Closes at the latest this long after it opened.
    pub max: Millis,
    /// Adaptive mode: with at most `short_queue` items waiting, closes after `short_idle`
    /// instead (a short queue does not wait for a burst that is not coming).
    pub adaptive: Option<Adaptive>,
}

/// The adaptive early close.
#[derive(Clone, Debug, PartialEq)]
pub struct Adaptive {
    pub short_queue: usize,
    pub short_idle: Millis,
}

impl Default for BatchWindow {
    fn default() -> Self {
        BatchWindow { idle: 1_000, max: 10_000, adaptive: None }
    }
}

/// An open batch.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Batch {
    opened_at: Option<Millis>,
    last_arrival: Millis,
    items: usize,
}

impl Batch {
    /// Something arrived at `now` (opening the batch if it was closed).
    pub fn arrive(&mut self, now: Millis) {
        if self.opened_at.is_none() {
            self.opened_at = Some(now);
        }
        self.last_arrival = now;
        self.items += 1;
    }

    pub fn is_open(&self) -> bool {
        self.opened_at.is_some()
    }

    pub fn items(&self) -> usize {
        self.items
    }

    /// When the batch closes if nothing else arrives; `None` when it is not open.
    pub fn closes_at(&self, w: &BatchWindow) -> Option<Millis> {
        let opened = self.opened_at?;
        let idle = match &w.adaptive {
            Some(a) if self.items <= a.short_queue => a.short_idle.min(w.idle),
            _ => w.idle,
        };
        Some(self.last_arrival.saturating_add(idle).min(opened.saturating_add(w.max)))
    }

    /// Whether the batch has closed at `now`.
    pub fn is_due(&self, w: &BatchWindow, now: Millis) -> bool {
        self.closes_at(w).is_some_and(|at| now >= at)
    }

    /// Closes the batch; returns how many items it held.
    pub fn close(&mut self) -> usize {
        std::mem::take(self).items
    }
}

/// The names the plane mints, from a seeded generator (SplitMix64): the caller seeds it (from
/// the clock and the control node), so this crate stays free of ambient randomness.
#[derive(Clone, Debug)]
pub struct Names {
    state: u64,
}

/// What Kubernetes' `generateName` draws from: lowercase letters and digits without vowels
/// (and without the look-alikes 0, 1, 3), so names never spell words.
const NAME_ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";

impl Names {
    pub fn new(seed: u64) -> Self {
        Names { state: seed }
    }

    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn suffix(&mut self, len: usize) -> String {
        (0..len)
            .map(|_| {
                let i = (self.next_u64() % NAME_ALPHABET.len() as u64) as usize;
                char::from(NAME_ALPHABET[i])
            })
            .collect()
    }

    /// A NodeClaim name as Karpenter makes them: `<nodepool>-<5 random characters>`.
    pub fn claim(&mut self, pool: &str) -> String {
        format!("{pool}-{}", self.suffix(5))
    }

    /// A launch batch id: `<zone>-<12 random characters>` (the cloud tags the batch's
    /// instances with it).
    pub fn batch(&mut self, zone: &str) -> String {
        format!("{zone}-{}", self.suffix(12))
    }
}

/// The Router's bookkeeping within one batch: which pools each pod was offered to, so that a
/// pod a pool gave back goes to the pools it has not tried.
#[derive(Clone, Debug, Default)]
pub struct Offers {
    tried: BTreeMap<PodKey, std::collections::BTreeSet<String>>,
}

impl Offers {
    /// A new batch: nothing offered yet.
    pub fn clear(&mut self) {
        self.tried.clear();
    }

    /// `pod` was offered to `pool`.
    pub fn offered(&mut self, pod: &PodKey, pool: &str) {
        self.tried.entry(pod.clone()).or_default().insert(pool.to_string());
    }

    /// The pods (indices into `pods`) grouped by the pools (indices into `pools`) they have
    /// not been offered to yet; an empty key means every pool was tried.
    pub fn groups<'a>(
        &self,
        pods: impl IntoIterator<Item = &'a PodKey>,
        pools: &[&str],
    ) -> BTreeMap<Vec<usize>, Vec<usize>> {
        let mut groups: BTreeMap<Vec<usize>, Vec<usize>> = BTreeMap::new();
        for (k, key) in pods.into_iter().enumerate() {
            let tried = self.tried.get(key);
            let open: Vec<usize> = (0..pools.len()).filter(|&i| tried.is_none_or(|t| !t.contains(pools[i]))).collect();
            groups.entry(open).or_default().push(k);
        }
        groups
    }
}

/// The pending-pod feed's bookkeeping: which pending pods to send the Router, and when.
///
/// A pod is sent when it first shows up pending, and again `every` while it stays pending
/// (the Router counted it onto existing or in-flight capacity, or no pool could take it). It
/// is also sent again `settle` after new nodes appeared, if it was sent before they did and
/// is still pending: the capacity it was counted against has registered and the scheduler
/// has had its turn, so other pods took it; waiting for `every` would leave it pending for
/// nothing. And it is sent again at once when capacity went away ([`Resend::capacity`]: a
/// NodeClaim or node deleted or marked for deletion), as Karpenter's provisioner is triggered
/// by a NodeClaim or node being deleted: the pods counted against it need a replacement now.
#[derive(Clone, Debug)]
pub struct Resend {
    pub every: Millis,
    pub settle: Millis,
    /// When each pending pod was last sent, and the last look that saw it pending.
    sent: HashMap<PodKey, Sent>,
    /// Looks so far: a pod whose `seen` is behind it is no longer pending.
    looks: u64,
    /// Nodes at the last look.
    nodes: usize,
    /// When nodes last grew, until a look after it has settled.
    grew: Option<Millis>,
    /// The capacity keys at the last look ([`crate::cluster::Snapshot::capacity_keys`]): live,
    /// and being deleted.
    capacity: HashSet<u64>,
    deleting: HashSet<u64>,
    /// When capacity last went away, until the next look.
    lost: Option<Millis>,
    last_sweep: Millis,
}

impl Resend {
    pub fn new(every: Millis, settle: Millis) -> Self {
        Resend {
            every,
            settle,
            sent: HashMap::new(),
            looks: 0,
            nodes: 0,
            grew: None,
            capacity: HashSet::new(),
            deleting: HashSet::new(),
            lost: None,
            last_sweep: 0,
        }
    }

    /// The capacity pods may have been counted against, at `now` (before [`Resend::look`]), as
    /// keys with whether each is being deleted. When a live key of the last call is missing or
    /// being deleted, or a key is being deleted that was not at the last call (a claim made and
    /// deleted between two looks), every pod sent before now is due at the next look.
    pub fn capacity(&mut self, now: Millis, keys: impl IntoIterator<Item = (u64, bool)>) {
        let (mut live, mut deleting) = (HashSet::new(), HashSet::new());
        for (k, d) in keys {
            if d {
                deleting.insert(k);
            } else {
                live.insert(k);
            }
        }
        let gone = self.capacity.iter().any(|k| !live.contains(k));
        let newly_deleting = deleting.iter().any(|k| !self.deleting.contains(k));
        if gone || newly_deleting {
            self.lost = Some(now);
        }
        self.capacity = live;
        self.deleting = deleting;
    }

    /// Forgets that `keys` were sent (their message was dropped at a full mailbox): they are
    /// due again at the next look.
    pub fn unsend<'p>(&mut self, keys: impl IntoIterator<Item = &'p PodKey>) {
        for k in keys {
            self.sent.remove(k);
        }
    }

    /// Whether a look is due at `now` without any change in the cluster: a periodic resend,
    /// or pods waiting since nodes grew.
    pub fn due_without_change(&self, now: Millis) -> bool {
        now.saturating_sub(self.last_sweep) >= self.every
            || self.grew.is_some_and(|g| now.saturating_sub(g) >= self.settle)
    }

    /// One look at the cluster: the pods pending now and its node count. Returns the indices
    /// (into `pending`) of the pods to send; forgets pods no longer pending.
    pub fn look<'p>(&mut self, now: Millis, pending: impl IntoIterator<Item = &'p PodKey>, nodes: usize) -> Vec<usize> {
        if nodes > self.nodes {
            self.grew = Some(now);
        }
        self.nodes = nodes;
        let settled = self.grew.filter(|g| now.saturating_sub(*g) >= self.settle);
        let lost = self.lost.take();
        let mut due = Vec::new();
        // Updated in place: a look at a large, mostly unchanged backlog copies no keys (only
        // pods new since the last look are added).
        self.looks += 1;
        let look = self.looks;
        for (i, key) in pending.into_iter().enumerate() {
            match self.sent.get_mut(key) {
                Some(s) => {
                    s.seen = look;
                    if now.saturating_sub(s.at) >= self.every
                        || settled.is_some_and(|g| s.at < g)
                        || lost.is_some_and(|l| s.at <= l)
                    {
                        due.push(i);
                        s.at = now;
                    }
                }
                None => {
                    due.push(i);
                    self.sent.insert(key.clone(), Sent { at: now, seen: look });
                }
            }
        }
        self.sent.retain(|_, s| s.seen == look);
        // A drained backlog gives its room back (a map of 300,000 keys kept for good).
        if self.sent.capacity() > 1024 && self.sent.len() < self.sent.capacity() / 4 {
            self.sent.shrink_to_fit();
        }
        if settled.is_some() {
            self.grew = None;
        }
        if now.saturating_sub(self.last_sweep) >= self.every {
            self.last_sweep = now;
        }
        due
    }
}

/// When a pending pod was last sent, and the last look that saw it.
#[derive(Clone, Copy, Debug)]
struct Sent {
    at: Millis,
    seen: u64,
}

/// Karpenter's liveness timeouts of a NodeClaim.
#[derive(Clone, Debug, PartialEq)]
pub struct Liveness {
    /// From its first launch call until the instance is launched (Karpenter: 5 min, from
    /// creation or its first failed call).
    pub launch: Millis,
    /// From creation until its node registers (Karpenter: 15 min).
    pub registration: Millis,
}

impl Default for Liveness {
    fn default() -> Self {
        Liveness { launch: 5 * 60_000, registration: 15 * 60_000 }
    }
}

/// Which liveness timeout a claim outlived.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Expired {
    /// Its launch calls went on failing for the launch timeout.
    Launch,
    /// Not launched by the registration timeout, no call ever made for it (it waited behind
    /// the plane's pacing of EC2's launch bucket, or its pool cannot launch).
    Queued,
    /// Its node did not register by the registration timeout.
    Registration,
}

impl Expired {
    /// What the event on the NodeClaim says.
    pub fn describe(self, l: &Liveness) -> String {
        let span = |ms: Millis| {
            if ms.is_multiple_of(60_000) { format!("{} min", ms / 60_000) } else { format!("{} s", ms / 1_000) }
        };
        match self {
            Expired::Launch => format!("its launch did not succeed within {} of its first call", span(l.launch)),
            Expired::Queued => format!(
                "no launch call was made for it within {} of its creation (queued for EC2's launch rate, \
                 or its NodePool cannot launch)",
                span(l.registration)
            ),
            Expired::Registration => {
                format!("its node did not register within {} of its creation", span(l.registration))
            }
        }
    }
}

impl Liveness {
    /// Whether a claim created at `created`, first called for at `tried` (none yet: `None`),
    /// in `state` has outlived a timeout at `now`: such a claim is deleted (Karpenter also marks
    /// its NodePool `NodeRegistrationHealthy=False`, which dovetail does not set yet: "Not done
    /// yet" in docs/control-plane.md). Karpenter calls EC2 for every claim at once and counts
    /// the launch timeout from creation, or from the first call that failed (throttled ones
    /// too); the plane paces its calls by EC2's launch bucket instead, so a claim still queued
    /// for its first call has not failed to launch: deleting it would only send its pods to a
    /// new claim at the back of the same queue. It is bounded by the registration timeout.
    pub fn check(&self, state: &ClaimState, created: Millis, tried: Option<Millis>, now: Millis) -> Option<Expired> {
        let age = now.saturating_sub(created);
        let unlaunched = matches!(state, ClaimState::Reserved | ClaimState::Launching { .. });
        match tried {
            Some(t) if unlaunched && now.saturating_sub(t) >= self.launch => return Some(Expired::Launch),
            None if unlaunched && age >= self.registration => return Some(Expired::Queued),
            _ => {}
        }
        match state {
            ClaimState::Reserved | ClaimState::Launching { .. } | ClaimState::Launched { .. }
                if age >= self.registration =>
            {
                Some(Expired::Registration)
            }
            _ => None,
        }
    }
}

/// The taint a node being disrupted carries; pods tolerating it are not evicted.
pub fn disrupted_taint() -> Taint {
    Taint::new("karpenter.sh/disrupted", "", Effect::NoSchedule)
}

/// Priority of `system-cluster-critical`; pods at or above it are critical.
pub const CRITICAL_PRIORITY: i32 = 2_000_000_000;

/// The drain tier of a pod (Karpenter): 0 non-critical non-DaemonSet, 1 non-critical
/// DaemonSet, 2 critical non-DaemonSet, 3 critical DaemonSet.
pub fn drain_tier(p: &Pod) -> usize {
    usize::from(p.priority >= CRITICAL_PRIORITY) * 2 + usize::from(p.daemon)
}

/// The annotation that keeps a pod (or node) from voluntary disruption and from eviction.
pub const DO_NOT_DISRUPT: &str = "karpenter.sh/do-not-disrupt";

/// Whether a pod's do-not-disrupt is active at `now`: `"true"`, or a duration that has not
/// run out since the pod started (`status.startTime`; a pod whose start is unknown is
/// protected). A value that is neither protects nothing, as in Karpenter.
pub fn do_not_disrupt(p: &Pod, now: Millis) -> bool {
    let Some(v) = p.annotations.get(DO_NOT_DISRUPT) else { return false };
    if v == "true" {
        return true;
    }
    match crate::nodepool::parse_duration(v) {
        Ok(Some(d)) => p.started_at.is_none_or(|start| now < start.saturating_add(crate::clock::to_millis(d))),
        _ => false,
    }
}

/// What a drain does now (Karpenter's terminator).
#[derive(Debug, Default, PartialEq)]
pub struct DrainStep<'a> {
    /// Evict through the eviction API (PDBs respected): the lowest tier that still has pods.
    pub evict: Vec<&'a Pod>,
    /// Delete now, bypassing PDBs and do-not-disrupt: the node's terminationGracePeriod is
    /// running out for them.
    pub delete: Vec<&'a Pod>,
    /// do-not-disrupt pods of that tier, and pods terminating already: not evicted, but
    /// waited for (the drain stalls until they go).
    pub waiting: Vec<&'a Pod>,
}

impl DrainStep<'_> {
    /// Nothing left to drain: the instance can go.
    pub fn is_done(&self) -> bool {
        self.evict.is_empty() && self.delete.is_empty() && self.waiting.is_empty()
    }
}

/// Kubernetes' default `terminationGracePeriodSeconds`.
pub const DEFAULT_POD_GRACE_SECONDS: i64 = 30;

/// The next step of draining `pods` at `now`. With a `deadline` (deletion time plus the
/// NodeClaim's terminationGracePeriod), each pod is deleted from `deadline - its grace period`
/// (at least 1 s) on. Pods that tolerate the disrupted taint, have finished, or are mirror
/// pods (the kubelet writes a static pod's object again as soon as it is deleted, so a drain
/// that waited for one would never end) are never evicted and do not hold a tier.
pub fn drain_step<'a>(pods: impl IntoIterator<Item = &'a Pod>, now: Millis, deadline: Option<Millis>) -> DrainStep<'a> {
    let taint = disrupted_taint();
    let mut step = DrainStep::default();
    let mut tiers: [Vec<&Pod>; 4] = Default::default();
    for p in pods {
        if p.terminal || p.is_mirror() || p.tolerations.iter().any(|t| t.tolerates(&taint)) {
            continue;
        }
        if let Some(deadline) = deadline {
            let grace = p.termination_grace_seconds.unwrap_or(DEFAULT_POD_GRACE_SECONDS).max(1);
            let grace_ms = u64::try_from(grace).unwrap_or(u64::MAX).saturating_mul(1000);
            if now >= deadline.saturating_sub(grace_ms) {
                step.delete.push(p);
                continue;
            }
        }
        tiers[drain_tier(p)].push(p);
    }
    if let Some(tier) = tiers.into_iter().find(|t| !t.is_empty()) {
        // A terminating pod is on its way out: evicting it again would only repeat the call.
        let (waiting, evict): (Vec<&Pod>, Vec<&Pod>) =
            tier.into_iter().partition(|p| p.deleting || do_not_disrupt(p, now));
        step.evict = evict;
        step.waiting = waiting;
    }
    step
}

/// The grace period to delete a pod with when the node goes at `deadline`: the time left
/// (whole seconds, at least 1), when that is shorter than the pod's own grace period, so the
/// pod is told to stop before EC2 takes its instance; `None` (the pod's own) otherwise. An
/// interruption's two-minute warning shortens a 5-minute grace period to what is left.
pub fn shortened_grace(p: &Pod, now: Millis, deadline: Option<Millis>) -> Option<i64> {
    let left = deadline?.saturating_sub(now) / 1000;
    let own = p.termination_grace_seconds.unwrap_or(DEFAULT_POD_GRACE_SECONDS);
    let left = i64::try_from(left).unwrap_or(i64::MAX).max(1);
    (left < own).then_some(left)
}

/// A latency histogram in milliseconds with bounded memory: log-spaced buckets, each about 5%
/// wide (exact below 20 ms), up to about 28 hours. Percentiles are the upper edge of their
/// bucket, so they overstate by at most one bucket.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Latencies {
    counts: Vec<u64>,
    total: u64,
    max: Millis,
}

const LATENCY_BUCKETS: usize = 320;

impl Default for Latencies {
    fn default() -> Self {
        Latencies { counts: vec![0; LATENCY_BUCKETS], total: 0, max: 0 }
    }
}

impl Latencies {
    fn bucket(ms: Millis) -> usize {
        if ms < 20 {
            return ms as usize;
        }
        let b = 20.0 + ((ms as f64) / 20.0).ln() / 1.05f64.ln();
        (b as usize).min(LATENCY_BUCKETS - 1)
    }

    fn upper(bucket: usize) -> Millis {
        if bucket < 20 {
            return bucket as Millis;
        }
        (20.0 * 1.05f64.powi(bucket as i32 - 19)).ceil() as Millis
    }

    pub fn record(&mut self, ms: Millis) {
        self.counts[Self::bucket(ms)] += 1;
        self.total += 1;
        self.max = self.max.max(ms);
    }

    pub fn merge(&mut self, other: &Latencies) {
        for (a, b) in self.counts.iter_mut().zip(&other.counts) {
            *a += b;
        }
        self.total += other.total;
        self.max = self.max.max(other.max);
    }

    pub fn count(&self) -> u64 {
        self.total
    }

    pub fn max(&self) -> Millis {
        self.max
    }

    /// The `q` quantile (0..=1), `None` when empty.
    pub fn quantile(&self, q: f64) -> Option<Millis> {
        if self.total == 0 {
            return None;
        }
        let rank = ((q.clamp(0.0, 1.0) * self.total as f64).ceil() as u64).max(1);
        let mut seen = 0;
        for (b, c) in self.counts.iter().enumerate() {
            seen += c;
            if seen >= rank {
                return Some(Self::upper(b).min(self.max));
            }
        }
        Some(self.max)
    }
}

#[cfg(test)]
mod names_tests {
    use super::*;
    use crate::catalog::CapacityType;

    #[test]
    fn names_are_karpenters_shape_and_repeat_for_a_seed() {
        let mut a = Names::new(7);
        let name = a.claim("general-purpose");
        let suffix = name.strip_prefix("general-purpose-").expect("prefix");
        assert_eq!(suffix.len(), 5);
        assert!(suffix.bytes().all(|b| NAME_ALPHABET.contains(&b)), "{name}");
        assert_eq!(Names::new(7).claim("general-purpose"), name, "a seed gives the same names");
        let many: std::collections::BTreeSet<String> = (0..1000).map(|_| a.claim("p")).collect();
        assert!(many.len() > 990, "collisions are rare, not impossible: the ledger refuses them");
        assert!(a.batch("us-east-1a").starts_with("us-east-1a-"));
    }

    #[test]
    fn marked_offerings_are_not_tried_again() {
        use crate::ledger::Offering;
        let mark = |t: &str, ct| Offering { instance_type: t.into(), zone: "z".into(), capacity_type: ct };
        let names = vec!["a".to_string(), "b".to_string()];
        let mut marked = std::collections::BTreeSet::from([mark("a", CapacityType::Spot)]);
        let both = [CapacityType::Spot, CapacityType::OnDemand];
        assert_eq!(unmarked_candidates(&names, "z", &both, &marked), Ok(names.clone()), "a's on-demand is still there");
        assert_eq!(unmarked_candidates(&names, "z", &[CapacityType::Spot], &marked), Ok(vec!["b".to_string()]));
        marked.insert(mark("b", CapacityType::Spot));
        let none = unmarked_candidates(&names, "z", &[CapacityType::Spot], &marked);
        assert_eq!(none, Err(vec![mark("a", CapacityType::Spot), mark("b", CapacityType::Spot)]));
    }

    #[test]
    fn offers_group_pods_by_the_pools_they_have_not_tried() {
        let mut o = Offers::default();
        let (a, b) = (PodKey::new("d", "a"), PodKey::new("d", "b"));
        o.offered(&a, "gpu");
        let groups = o.groups([&a, &b], &["gpu", "default"]);
        assert_eq!(groups.get(&vec![1]), Some(&vec![0]));
        assert_eq!(groups.get(&vec![0, 1]), Some(&vec![1]));
        o.offered(&a, "default");
        assert_eq!(o.groups([&a], &["gpu", "default"]).get(&vec![]), Some(&vec![0]), "every pool tried");
        o.clear();
        assert_eq!(o.groups([&a], &["gpu", "default"]).get(&vec![0, 1]), Some(&vec![0]));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalog::{CapacityType, Offering};
    use crate::labels;
    use crate::requirements::Requirements;

    #[test]
    fn pending_pods_are_sent_at_once_again_every_period_and_again_once_new_nodes_settled() {
        let (a, b) = (PodKey::new("default", "a"), PodKey::new("default", "b"));
        let mut r = Resend::new(30_000, 5_000);
        assert_eq!(r.look(0, [&a], 0), vec![0], "new: at once");
        assert!(r.look(1_000, [&a], 0).is_empty());
        assert_eq!(r.look(2_000, [&a, &b], 0), vec![1]);
        // Nodes register at 10 s; a and b are still pending once that settled.
        assert!(r.look(10_000, [&a, &b], 3).is_empty(), "the scheduler gets its turn first");
        assert!(!r.due_without_change(14_000) && r.due_without_change(15_000));
        assert_eq!(r.look(15_000, [&a, &b], 3), vec![0, 1]);
        assert!(!r.due_without_change(16_000), "settled once");
        // A pod sent after the nodes grew waits for the period.
        assert!(r.look(20_000, [&a, &b], 3).is_empty());
        assert!(r.look(44_000, [&a], 3).is_empty(), "b is forgotten");
        assert_eq!(r.look(45_000, [&a, &b], 3), vec![0, 1], "a after 30 s; b is new again");
        // Nodes going away are not new capacity.
        assert!(r.look(46_000, [&a], 1).is_empty() && !r.due_without_change(52_000));
    }

    #[test]
    fn pending_pods_are_sent_again_at_once_when_capacity_went_away() {
        let (a, b) = (PodKey::new("default", "a"), PodKey::new("default", "b"));
        let live = |keys: &[u64]| keys.iter().map(|k| (*k, false)).collect::<Vec<_>>();
        let mut r = Resend::new(30_000, 5_000);
        r.capacity(0, live(&[1, 2]));
        assert_eq!(r.look(0, [&a], 2), vec![0]);
        // New capacity (a claim made for a) is not a loss.
        r.capacity(1_000, live(&[1, 2, 3]));
        assert!(r.look(1_000, [&a], 2).is_empty());
        // Claim 3 deleted: a, sent before, is due now; b, new, once.
        r.capacity(2_000, live(&[1, 2]));
        assert_eq!(r.look(2_000, [&a, &b], 2), vec![0, 1]);
        // Once: the next look waits for the period again.
        r.capacity(3_000, live(&[1, 2]));
        assert!(r.look(3_000, [&a, &b], 2).is_empty());
        // A key replaced by another in one look is a loss too.
        r.capacity(4_000, live(&[1, 4]));
        assert_eq!(r.look(4_000, [&a, &b], 2), vec![0, 1]);
        // A claim made and marked for deletion between two looks (never seen live) is a loss
        // when first seen deleting, and only then.
        r.capacity(5_000, [(1, false), (4, false), (5, true)]);
        assert_eq!(r.look(5_000, [&a, &b], 2), vec![0, 1]);
        r.capacity(6_000, [(1, false), (4, false), (5, true)]);
        assert!(r.look(6_000, [&a, &b], 2).is_empty());
    }
    use crate::taints::Toleration;

    #[test]
    fn a_batch_closes_on_idle_or_max_and_adaptively_when_short() {
        let w = BatchWindow::default();
        let mut b = Batch::default();
        assert_eq!(b.closes_at(&w), None);
        b.arrive(0);
        assert_eq!(b.closes_at(&w), Some(1_000));
        for t in (500..20_000).step_by(500) {
            b.arrive(t);
            if b.is_due(&w, t) {
                assert_eq!(t, 10_000, "a steady stream closes at the max");
                break;
            }
        }
        assert_eq!(b.close(), 21, "the first and 20 more");
        assert!(!b.is_open());
        let a = BatchWindow { adaptive: Some(Adaptive { short_queue: 3, short_idle: 100 }), ..BatchWindow::default() };
        b.arrive(0);
        assert_eq!(b.closes_at(&a), Some(100), "a short queue closes early");
        for t in 1..5 {
            b.arrive(t);
        }
        assert_eq!(b.closes_at(&a), Some(1_004), "a longer one waits the full idle time");
    }

    fn offering(zone: &str, ct: CapacityType, price: f64) -> Offering {
        Offering { zone: zone.into(), zone_id: String::new(), zone_index: 0, capacity_type: ct, price, available: true }
    }

    #[test]
    fn the_zone_is_the_cheapest_available_and_ties_spread() {
        let offs = [
            ("m5.large", offering("a", CapacityType::OnDemand, 0.096)),
            ("m5.large", offering("b", CapacityType::OnDemand, 0.096)),
            ("m5.large", offering("c", CapacityType::OnDemand, 0.120)),
            ("m5.large", offering("a", CapacityType::Spot, 0.040)),
            ("m5.large", offering("b", CapacityType::Spot, 0.035)),
        ];
        let it = || offs.iter().map(|(t, o)| (*t, o));
        let none = |_: &str, _: &Offering| false;
        let spread = BTreeMap::new();
        let spot = pick_zone(it(), &[], none, &spread).expect("spot");
        assert_eq!((spot.zone.as_str(), spot.capacity_type), ("b", CapacityType::Spot));
        // Spot ICE'd everywhere: on-demand; a and b tie, a has more claims, so b.
        let no_spot = |_: &str, o: &Offering| o.capacity_type == CapacityType::Spot;
        let spread = BTreeMap::from([("a".to_string(), 3usize)]);
        let od = pick_zone(it(), &[], no_spot, &spread).expect("on-demand");
        assert_eq!((od.zone.as_str(), od.capacity_type), ("b", CapacityType::OnDemand));
        let od_only = pick_zone(it(), &[CapacityType::OnDemand], none, &BTreeMap::new()).expect("od");
        assert_eq!(od_only.zone, "a", "ties go by name when spread is equal");
        assert_eq!(pick_zone(it(), &[], |_, _| true, &BTreeMap::new()), None);
    }

    #[test]
    fn a_relaunch_stays_in_the_claims_zones_and_skips_marked_offerings() {
        let c = crate::catalog::Catalog::embedded("us-east-1").expect("catalog");
        let types = c.instance_types(&crate::catalog::NodeClassSettings::default(), None);
        let names = vec!["m5.large".to_string()];
        let od = [CapacityType::OnDemand];
        let zones = vec!["us-east-1a".to_string(), "us-east-1b".to_string()];
        let a_marked = |_: &str, o: &Offering| o.zone == "us-east-1a";
        let z = relaunch_zone(&types, &names, &od, &zones, None, a_marked).expect("b");
        assert_eq!((z.zone.as_str(), z.capacity_type), ("us-east-1b", CapacityType::OnDemand));
        assert_eq!(relaunch_zone(&types, &names, &od, &zones[..1], None, a_marked), None, "pinned to a");
        // Nothing marked: on-demand costs the same in both; the preferred zone wins the tie.
        let none = |_: &str, _: &Offering| false;
        let z = relaunch_zone(&types, &names, &od, &zones, Some("us-east-1b"), none).expect("tie");
        assert_eq!(z.zone, "us-east-1b");
        let z = relaunch_zone(&types, &names, &od, &zones, None, none).expect("tie");
        assert_eq!(z.zone, "us-east-1a", "without a preference, by name");
        let mut reqs = Requirements::new();
        reqs.add(labels::ZONE, crate::requirements::Requirement::is_in(["us-east-1b"]));
        reqs.add(labels::CAPACITY_TYPE, crate::requirements::Requirement::is_in(["spot", "on-demand"]));
        assert_eq!(allowed_zones(&reqs, &zones), vec!["us-east-1b".to_string()]);
        assert_eq!(capacity_types(&reqs), vec![CapacityType::Spot, CapacityType::OnDemand]);
    }

    #[test]
    fn liveness_uses_karpenters_timeouts() {
        let l = Liveness::default();
        let launching = ClaimState::Launching { batch: "b".into() };
        assert_eq!(l.check(&launching, 0, Some(0), 299_999), None);
        assert_eq!(l.check(&launching, 0, Some(0), 300_000), Some(Expired::Launch));
        let launched = ClaimState::Launched { instance: "i-1".into() };
        assert_eq!(l.check(&launched, 0, Some(0), 899_999), None);
        assert_eq!(l.check(&launched, 0, Some(0), 900_000), Some(Expired::Registration));
        assert_eq!(l.check(&ClaimState::Registered { instance: "i-1".into() }, 0, Some(0), 10_000_000), None);
    }

    /// 2,200 claims at once launch at EC2's 2 a second after a burst of 1,000: the last wait
    /// 10 minutes for their first call. Deleted at 5 minutes (Karpenter's launch timeout from
    /// creation), their pods went to new claims at the back of the same queue, and the queue
    /// still launched the deleted ones' turns first: the soak's opening burst took 16-17
    /// minutes to place instead of 10.
    #[test]
    fn a_claim_waiting_for_its_first_launch_call_is_not_timed_out_until_the_registration_timeout() {
        let l = Liveness::default();
        assert_eq!(l.check(&ClaimState::Reserved, 0, None, 600_000), None);
        assert_eq!(l.check(&ClaimState::Reserved, 0, None, 899_999), None);
        assert_eq!(l.check(&ClaimState::Reserved, 0, None, 900_000), Some(Expired::Queued));
        // First called at 11 minutes: its launch timeout runs from there, within the
        // registration timeout from its creation.
        let launching = ClaimState::Launching { batch: "b".into() };
        assert_eq!(l.check(&launching, 0, Some(660_000), 899_999), None);
        assert_eq!(l.check(&launching, 0, Some(660_000), 900_000), Some(Expired::Registration));
        // A failed first call at 1 minute: timed out 5 minutes later, as Karpenter does.
        assert_eq!(l.check(&ClaimState::Reserved, 0, Some(60_000), 359_999), None);
        assert_eq!(l.check(&ClaimState::Reserved, 0, Some(60_000), 360_000), Some(Expired::Launch));
    }

    #[test]
    fn drains_go_tier_by_tier() {
        let pod = |name: &str, priority: i32, daemon: bool| Pod {
            key: PodKey::new("default", name),
            priority,
            daemon,
            ..Pod::default()
        };
        let mut pods = vec![
            pod("critical-ds", CRITICAL_PRIORITY, true),
            pod("critical", CRITICAL_PRIORITY + 1000, false),
            pod("ds", 0, true),
            pod("web", 0, false),
            Pod {
                tolerations: vec![Toleration::exists("karpenter.sh/disrupted", None)].into(),
                ..pod("tolerant", 0, false)
            },
        ];
        let names = |v: Vec<&Pod>| v.into_iter().map(|p| p.key.name.clone()).collect::<Vec<_>>();
        let next = |pods: &[Pod]| names(drain_step(pods, 0, None).evict);
        assert_eq!(next(&pods), vec!["web"]);
        pods.retain(|p| p.key.name != "web");
        assert_eq!(next(&pods), vec!["ds"]);
        pods.retain(|p| p.key.name != "ds");
        assert_eq!(next(&pods), vec!["critical"]);
        pods.retain(|p| p.key.name != "critical");
        assert_eq!(next(&pods), vec!["critical-ds"]);
        pods.retain(|p| p.key.name != "critical-ds");
        assert!(drain_step(&pods, 0, None).is_done(), "the tolerating pod is never evicted");
    }

    #[test]
    fn latency_quantiles_are_within_a_bucket() {
        let mut l = Latencies::default();
        assert_eq!(l.quantile(0.5), None);
        for ms in 1..=1000 {
            l.record(ms);
        }
        let p50 = l.quantile(0.5).expect("p50");
        let p99 = l.quantile(0.99).expect("p99");
        assert!((500..=526).contains(&p50), "{p50}");
        assert!((990..=1000).contains(&p99), "{p99}");
        assert_eq!(l.quantile(1.0), Some(1000));
        l.record(100_000_000_000);
        assert_eq!(l.count(), 1001);
        assert_eq!(l.max(), 100_000_000_000);
    }

    #[test]
    fn do_not_disrupt_pods_stall_their_tier_until_the_grace_period_runs_out() {
        let annotated = |name: &str, v: &str| {
            let mut p = Pod { key: PodKey::new("default", name), ..Pod::default() };
            p.annotations.insert(DO_NOT_DISRUPT.to_string(), v.to_string());
            p
        };
        let pods = vec![
            annotated("pinned", "true"),
            annotated("for-a-while", "30m"),
            annotated("not-really", "false"),
            Pod { termination_grace_seconds: Some(120), ..annotated("slow", "true") },
            Pod { key: PodKey::new("kube-system", "ds"), daemon: true, ..Pod::default() },
        ];
        let names = |v: &[&Pod]| v.iter().map(|p| p.key.name.clone()).collect::<Vec<_>>();
        // No grace period: evict what may go, wait for the rest; the DaemonSet tier waits.
        let s = drain_step(&pods, 0, None);
        assert_eq!(names(&s.evict), vec!["not-really"]);
        assert_eq!(names(&s.waiting), vec!["pinned", "for-a-while", "slow"]);
        assert!(s.delete.is_empty());
        // Deadline at 600 s: the 30 s pods are deleted from 570 s, the 120 s one from 480 s.
        assert!(drain_step(&pods, 479_999, Some(600_000)).delete.is_empty());
        let s = drain_step(&pods, 480_000, Some(600_000));
        assert_eq!(names(&s.delete), vec!["slow"]);
        let s = drain_step(&pods, 570_000, Some(600_000));
        assert_eq!(names(&s.delete), vec!["pinned", "for-a-while", "not-really", "slow", "ds"]);
        assert!(s.evict.is_empty() && s.waiting.is_empty());
    }

    #[test]
    fn a_mirror_pod_never_holds_a_drain_and_is_never_evicted() {
        let mut annotated = Pod { key: PodKey::new("kube-system", "kube-proxy-ip-1"), ..Pod::default() };
        annotated.annotations.insert(crate::pod::MIRROR_ANNOTATION.to_string(), "abc123".to_string());
        let owned = Pod { key: PodKey::new("kube-system", "nginx-proxy-ip-1"), owned_by_node: true, ..Pod::default() };
        let pods = vec![annotated.clone(), owned.clone()];
        let s = drain_step(&pods, 0, None);
        assert!(s.is_done(), "a node running only static pods is drained: {s:?}");
        // Not even a terminationGracePeriod deletes them: the kubelet would write them again.
        assert!(drain_step(&pods, 10_000, Some(0)).is_done());
        let web = Pod { key: PodKey::new("default", "web"), ..Pod::default() };
        let pods = vec![annotated, owned, web];
        let s = drain_step(&pods, 0, None);
        assert_eq!(s.evict.iter().map(|p| p.key.name.as_str()).collect::<Vec<_>>(), vec!["web"]);
        assert!(s.waiting.is_empty());
    }

    #[test]
    fn terminating_pods_are_not_evicted_again() {
        let going = Pod { key: PodKey::new("default", "going"), deleting: true, ..Pod::default() };
        let staying = Pod { key: PodKey::new("default", "staying"), ..Pod::default() };
        let pods = vec![going, staying];
        let s = drain_step(&pods, 0, None);
        assert_eq!(s.evict.iter().map(|p| p.key.name.as_str()).collect::<Vec<_>>(), vec!["staying"]);
        assert_eq!(s.waiting.len(), 1, "the terminating pod holds the drain until it goes");
        assert!(!s.is_done());
    }

    #[test]
    fn do_not_disrupt_durations_run_out() {
        let mut p = Pod { key: PodKey::new("default", "p"), started_at: Some(1_000_000), ..Pod::default() };
        p.annotations.insert(DO_NOT_DISRUPT.to_string(), "30m".to_string());
        assert!(do_not_disrupt(&p, 1_000_000 + 29 * 60_000));
        assert!(!do_not_disrupt(&p, 1_000_000 + 30 * 60_000), "protected for 30 minutes from its start");
        p.started_at = None;
        assert!(do_not_disrupt(&p, u64::MAX), "an unknown start protects");
        p.annotations.insert(DO_NOT_DISRUPT.to_string(), "99999999999999999999h".to_string());
        assert!(!do_not_disrupt(&p, 0), "an unparseable value protects nothing, and does not panic");
    }
}
