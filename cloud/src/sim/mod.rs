//! A deterministic, in-memory cloud on the same catalog as `dovetail-core`: launch latency,
//! finite capacity per offering, EC2's regional request buckets, and spot interruptions
//! emitted as EventBridge events into its queue. Everything random comes from the seed, and
//! time from the injected clock, so a run replays exactly.

mod queue;
mod restore;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use dovetail_core::catalog::{CapacityType, InstanceType};
use dovetail_core::labels::{self, Labels};
use dovetail_core::workload::SplitMix64;

pub use crate::limits::{ApiLimits, Bucket};
pub use queue::SimQueue;
pub use restore::Restored;

use crate::events::{self, EventKind, Origin};
use crate::types::{assign_untagged, group_identical, type_labels};
use crate::{
    BoxFuture, CloudError, CloudProvider, DriftReason, Instance, InstanceState, LaunchBatch, LaunchRequest, Lookup,
    NodeClass, OfferingKey, TAG_CLUSTER_PREFIX, TAG_LAUNCH_BATCH, TAG_NODECLAIM, TAG_NODEPOOL,
};
use dovetail_core::clock::Clock;

/// How long launched instances take to run: uniform between `min` and `max`.
#[derive(Clone, Debug, PartialEq)]
pub struct Latency {
    pub min: Duration,
    pub max: Duration,
}

/// The sim cloud's settings.
#[derive(Clone, Debug)]
pub struct SimConfig {
    /// Cluster name, for the ownership tag.
    pub cluster: String,
    pub region: String,
    pub account: String,
    pub seed: u64,
    /// From launch to running.
    pub boot: Latency,
    /// Instances each offering can still launch; offerings not listed are unlimited.
    pub capacity: BTreeMap<OfferingKey, u32>,
    /// EC2's request buckets (`ApiLimits::raised` for load tests that say so).
    pub limits: ApiLimits,
    /// Spot interruptions per running spot instance per hour (applied by `tick`).
    pub spot_interruptions_per_hour: f64,
    /// Visibility timeout of the interruption queue.
    pub visibility: Duration,
    /// The AMI instances get (drift compares it with the node class's).
    pub image: String,
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig {
            cluster: "sim".into(),
            region: "us-east-1".into(),
            account: "123456789012".into(),
            seed: 1,
            boot: Latency { min: Duration::from_secs(20), max: Duration::from_secs(40) },
            capacity: BTreeMap::new(),
            limits: ApiLimits::default(),
            spot_interruptions_per_hour: 0.0,
            visibility: Duration::from_secs(20),
            image: "ami-sim-al2023".into(),
        }
    }
}

/// What the sim keeps per instance: small, the rest (labels, capacity) comes from the
/// catalog when an instance is looked at.
struct SimInstance {
    id: String,
    /// The claim its tag names (`None` for an instance whose launch crashed before the
    /// per-claim tag: its batch tag finds it).
    claim: Option<String>,
    /// The launch batch that made it.
    batch: String,
    /// Index into the catalog.
    instance_type: usize,
    zone: String,
    capacity_type: CapacityType,
    price: f64,
    launched_at: Duration,
    ready_at: Duration,
    /// The request's pool, labels and tags (shared by a merged call's instances).
    request: Arc<RequestShape>,
    /// The AMI it booted (shared by every instance of one release).
    image: Arc<str>,
}

/// What a launch request says about the node besides its type.
struct RequestShape {
    nodepool: String,
    labels: Labels,
    tags: BTreeMap<String, String>,
    node_class_hash: String,
}

/// Counters of what the cloud was asked (merging and throttling are measured with them).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SimStats {
    /// CreateFleet calls made (after merging).
    pub fleet_calls: u64,
    pub terminate_calls: u64,
    pub describe_calls: u64,
    pub launched: u64,
    pub terminated: u64,
    pub throttled: u64,
    pub insufficient_capacity: u64,
    pub interruptions: u64,
    /// Instances a re-drive assigned to a claim from its batch's untagged ones.
    pub adopted: u64,
}

struct State {
    instances: BTreeMap<String, SimInstance>,
    by_claim: HashMap<String, String>,
    /// Per launch batch, its instances' ids.
    by_batch: HashMap<String, Vec<String>>,
    /// Launch calls still to "crash" after CreateFleet made the instances and before they were
    /// tagged per claim (the fault the batch tag recovers from).
    crash_after_fleet: u32,
    capacity: HashMap<OfferingKey, u32>,
    limits: ApiLimits,
    rng: SplitMix64,
    next_event: u64,
    last_tick: Duration,
    /// Spot interruptions per instance-hour (the config's, until changed).
    spot_rate: f64,
    /// The AMI new instances boot (the config's, until a release: [`SimCloud::release_image`]);
    /// an instance on another is drifted.
    image: Arc<str>,
    stats: SimStats,
}

/// The sim cloud. Cheap at 10,000+ instances: one small struct per instance.
pub struct SimCloud {
    config: SimConfig,
    clock: Arc<dyn Clock>,
    types: Arc<Vec<InstanceType>>,
    index: HashMap<String, usize>,
    queue: Arc<SimQueue>,
    state: Mutex<State>,
}

impl SimCloud {
    /// A cloud offering `types` (the catalog's, resolved for the default node class).
    pub fn new(config: SimConfig, types: Arc<Vec<InstanceType>>, clock: Arc<dyn Clock>) -> Self {
        let index = types.iter().enumerate().map(|(i, t)| (t.name.clone(), i)).collect();
        let queue = Arc::new(SimQueue::new(clock.clone(), config.visibility));
        let state = State {
            instances: BTreeMap::new(),
            by_claim: HashMap::new(),
            by_batch: HashMap::new(),
            crash_after_fleet: 0,
            capacity: config.capacity.iter().map(|(k, v)| (k.clone(), *v)).collect(),
            limits: config.limits.clone(),
            rng: SplitMix64::new(config.seed),
            next_event: 0,
            last_tick: clock.now(),
            spot_rate: config.spot_interruptions_per_hour,
            image: Arc::from(config.image.as_str()),
            stats: SimStats::default(),
        };
        SimCloud { config, clock, types, index, queue, state: Mutex::new(state) }
    }

    /// Its interruption queue.
    pub fn queue(&self) -> Arc<SimQueue> {
        self.queue.clone()
    }

    /// What it was asked so far.
    pub fn stats(&self) -> SimStats {
        self.lock().stats.clone()
    }

    /// Live instances.
    pub fn len(&self) -> usize {
        self.lock().instances.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The next `calls` launch calls make their instances (tagged with their batch only) and
    /// then fail as if the caller crashed before tagging them per claim and before it got the
    /// result.
    pub fn crash_after_fleet(&self, calls: u32) {
        self.lock().crash_after_fleet = calls;
    }

    /// A new AMI is released (as an EKS-optimized alias moves on): instances launched from now
    /// boot `image`, and every instance on an older one is drifted.
    pub fn release_image(&self, image: &str) {
        self.lock().image = Arc::from(image);
    }

    /// The AMI new instances boot.
    pub fn image(&self) -> String {
        self.lock().image.to_string()
    }

    /// Sets how many more instances an offering can launch (0 makes it insufficient).
    pub fn set_capacity(&self, offering: OfferingKey, left: u32) {
        self.lock().capacity.insert(offering, left);
    }

    /// Makes an offering's capacity unlimited again (the end of an ICE window).
    pub fn clear_capacity(&self, offering: &OfferingKey) {
        self.lock().capacity.remove(offering);
    }

    /// Replaces the request buckets (full), as a load test that raises or lowers them does.
    pub fn set_limits(&self, limits: ApiLimits) {
        self.lock().limits = limits;
    }

    /// Sets the spot interruption rate (per instance-hour) from now on: a spot storm.
    pub fn set_spot_interruption_rate(&self, per_hour: f64) {
        let mut s = self.lock();
        s.last_tick = self.clock.now();
        s.spot_rate = per_hour.max(0.0);
    }

    /// EC2 takes instances back (a spot reclaim after its warning, a zone lost): they are gone
    /// at once, outside the account's API limits. Returns how many there were.
    pub fn reclaim(&self, ids: &[String]) -> usize {
        let mut s = self.lock();
        let mut n = 0;
        for id in ids {
            if let Some(inst) = s.instances.remove(id.as_str()) {
                forget(&mut s, &inst);
                n += 1;
            }
        }
        s.stats.terminated += n as u64;
        n
    }

    /// Every instance as EC2 itself sees it (for the sim's kubelets and reports): not an API
    /// call, so outside the account's limits, unlike `list`.
    pub fn instances(&self) -> Vec<Instance> {
        let now = self.clock.now();
        let s = self.lock();
        s.instances.values().map(|i| self.view(i, now)).collect()
    }

    /// The ids of its instances in `zone`.
    pub fn instances_in(&self, zone: &str) -> Vec<String> {
        self.lock().instances.values().filter(|i| i.zone == zone).map(|i| i.id.clone()).collect()
    }

    /// Emits an event for an instance now (an interruption warning, a scheduled change...).
    pub fn inject(&self, kind: EventKind, instance_id: &str) {
        let body = {
            let mut s = self.lock();
            self.event_body(&mut s, kind, instance_id)
        };
        self.queue.send(body);
    }

    /// Applies the spot interruption rate over the time since the last tick; returns the ids
    /// interrupted (each gets a warning in the queue, and is terminated two minutes later by
    /// whoever acts on it, as on EC2).
    pub fn tick(&self) -> Vec<String> {
        let now = self.clock.now();
        let mut s = self.lock();
        let hours = (now.saturating_sub(s.last_tick)).as_secs_f64() / 3600.0;
        s.last_tick = now;
        if s.spot_rate <= 0.0 || hours <= 0.0 {
            return Vec::new();
        }
        let p = 1.0 - (-s.spot_rate * hours).exp();
        let spot: Vec<String> =
            s.instances.values().filter(|i| i.capacity_type == CapacityType::Spot).map(|i| i.id.clone()).collect();
        let mut hit = Vec::new();
        for id in spot {
            let draw = (s.rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
            if draw < p {
                hit.push(id);
            }
        }
        let bodies: Vec<String> =
            hit.iter().map(|id| self.event_body(&mut s, EventKind::SpotInterruption, id)).collect();
        s.stats.interruptions += hit.len() as u64;
        drop(s);
        for b in bodies {
            self.queue.send(b);
        }
        hit
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn event_body(&self, s: &mut State, kind: EventKind, instance_id: &str) -> String {
        s.next_event += 1;
        let id = format!("sim-event-{:08}", s.next_event);
        let origin = Origin {
            event_id: &id,
            account: &self.config.account,
            region: &self.config.region,
            unix_seconds: self.clock.now().as_secs(),
        };
        events::event(kind, instance_id, &origin)
    }

    fn view(&self, i: &SimInstance, now: Duration) -> Instance {
        let it = &self.types[i.instance_type];
        let mut labels = type_labels(it);
        labels.extend(i.request.labels.iter().map(|(k, v)| (k.clone(), v.clone())));
        labels.insert(labels::INSTANCE_TYPE.to_string(), it.name.clone());
        labels.insert(labels::ZONE.to_string(), i.zone.clone());
        labels.insert(labels::CAPACITY_TYPE.to_string(), i.capacity_type.as_str().to_string());
        labels.insert(labels::NODEPOOL.to_string(), i.request.nodepool.clone());
        let mut tags = i.request.tags.clone();
        if let Some(claim) = &i.claim {
            tags.insert(TAG_NODECLAIM.to_string(), claim.clone());
        }
        tags.insert(TAG_LAUNCH_BATCH.to_string(), i.batch.clone());
        tags.insert(TAG_NODEPOOL.to_string(), i.request.nodepool.clone());
        tags.insert(format!("{TAG_CLUSTER_PREFIX}{}", self.config.cluster), "owned".to_string());
        Instance {
            id: i.id.clone(),
            claim: i.claim.clone(),
            instance_type: it.name.clone(),
            zone: i.zone.clone(),
            capacity_type: i.capacity_type,
            price: i.price,
            labels,
            capacity: it.capacity.clone(),
            allocatable: it.allocatable.clone(),
            state: if now >= i.ready_at { InstanceState::Running } else { InstanceState::Pending },
            launched_at: i.launched_at,
            tags,
            image: i.image.to_string(),
            node_class_hash: i.request.node_class_hash.clone(),
        }
    }

    /// Takes a token from a bucket or says when to retry.
    fn draw(
        s: &mut State,
        now: Duration,
        which: fn(&mut ApiLimits) -> &mut Bucket,
        n: f64,
        action: &str,
    ) -> Result<(), CloudError> {
        let bucket = which(&mut s.limits);
        match bucket.check(now, n) {
            Ok(()) => {
                bucket.take(now, n);
                Ok(())
            }
            Err(retry_after) => {
                s.stats.throttled += 1;
                Err(CloudError::Throttled { action: action.to_string(), retry_after })
            }
        }
    }

    /// The cheapest offering with capacity for a request, or every offering tried.
    fn pick(&self, s: &State, r: &LaunchRequest) -> Result<(usize, CapacityType, f64), Vec<OfferingKey>> {
        let mut tried = Vec::new();
        let order: Vec<CapacityType> = [CapacityType::Spot, CapacityType::OnDemand]
            .into_iter()
            .filter(|c| r.capacity_types.is_empty() || r.capacity_types.contains(c))
            .collect();
        for ct in order {
            // As the AWS provider: the 60 cheapest candidates offered in the zone, cheapest
            // first; the first with capacity launches.
            let mut offered: Vec<(usize, f64)> = r
                .instance_types
                .iter()
                .filter_map(|name| {
                    let &t = self.index.get(name)?;
                    let o = self.types[t]
                        .offerings
                        .iter()
                        .find(|o| o.zone == r.zone && o.capacity_type == ct && o.available)?;
                    Some((t, o.price))
                })
                .collect();
            offered.sort_by(|a, b| a.1.total_cmp(&b.1).then_with(|| self.types[a.0].name.cmp(&self.types[b.0].name)));
            offered.truncate(60);
            for (t, price) in offered {
                let key =
                    OfferingKey { instance_type: self.types[t].name.clone(), zone: r.zone.clone(), capacity_type: ct };
                if s.capacity.get(&key).is_some_and(|left| *left == 0) {
                    tried.push(key);
                    continue;
                }
                return Ok((t, ct, price));
            }
        }
        Err(tried)
    }

    fn make_instance(
        &self,
        s: &mut State,
        r: &LaunchRequest,
        shape: &Arc<RequestShape>,
        pick: (usize, CapacityType, f64),
        now: Duration,
    ) -> SimInstance {
        let (t, capacity_type, price) = pick;
        // A restored fleet holds ids this seed may draw again.
        let mut id = format!("i-{:017x}", s.rng.next_u64() >> 4);
        for _ in 0..64 {
            if !s.instances.contains_key(&id) {
                break;
            }
            id = format!("i-{:017x}", s.rng.next_u64() >> 4);
        }
        let span = self.config.boot.max.saturating_sub(self.config.boot.min).as_secs_f64();
        let draw = (s.rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
        SimInstance {
            id,
            claim: Some(r.claim.clone()),
            batch: r.batch.id.clone(),
            instance_type: t,
            zone: r.zone.clone(),
            capacity_type,
            price,
            launched_at: now,
            ready_at: now + self.config.boot.min + Duration::from_secs_f64(span * draw),
            request: shape.clone(),
            image: s.image.clone(),
        }
    }
}

/// Forgets an instance that is gone from the claim and batch indexes.
fn forget(s: &mut State, inst: &SimInstance) {
    if let Some(c) = &inst.claim {
        s.by_claim.remove(c);
    }
    if let Some(ids) = s.by_batch.get_mut(&inst.batch) {
        ids.retain(|i| *i != inst.id);
        if ids.is_empty() {
            s.by_batch.remove(&inst.batch);
        }
    }
}

impl SimCloud {
    /// The instance of a claim: by its tag, or one of its batch's untagged instances assigned
    /// to it (and tagged) as every re-drive assigns them.
    fn lookup(&self, s: &mut State, claim: &str, batch: Option<&LaunchBatch>) -> Option<String> {
        if let Some(id) = s.by_claim.get(claim) {
            return Some(id.clone());
        }
        let batch = batch?;
        let untagged: Vec<String> = s
            .by_batch
            .get(&batch.id)
            .into_iter()
            .flatten()
            .filter(|id| s.instances.get(id.as_str()).is_some_and(|i| i.claim.is_none()))
            .cloned()
            .collect();
        if untagged.is_empty() {
            return None;
        }
        let refs: Vec<&str> = untagged.iter().map(String::as_str).collect();
        // The batch's own instances say which of its claims have one (as the AWS provider
        // reads their tags).
        let tagged: Vec<String> = s
            .by_batch
            .get(&batch.id)
            .into_iter()
            .flatten()
            .filter_map(|id| s.instances.get(id.as_str())?.claim.clone())
            .collect();
        let assigned: Vec<(String, String)> = assign_untagged(batch, |c| tagged.iter().any(|t| t == c), &refs)
            .into_iter()
            .map(|(i, c)| (untagged[i].clone(), c.to_string()))
            .collect();
        for (id, c) in assigned {
            if let Some(inst) = s.instances.get_mut(&id) {
                inst.claim = Some(c.clone());
                s.by_claim.insert(c, id);
                s.stats.adopted += 1;
            }
        }
        s.by_claim.get(claim).cloned()
    }
}

impl CloudProvider for SimCloud {
    fn name(&self) -> &'static str {
        "sim"
    }

    fn launch<'a>(&'a self, requests: &'a [LaunchRequest]) -> BoxFuture<'a, Vec<Result<Instance, CloudError>>> {
        Box::pin(async move {
            let now = self.clock.now();
            let mut s = self.lock();
            let mut out: Vec<Option<Result<Instance, CloudError>>> = vec![None; requests.len()];
            // Idempotency: a claim that has an instance gets it back, and a batch's untagged
            // instances go to its claims first (one lookup call).
            if !requests.is_empty() {
                s.stats.describe_calls += 1;
            }
            for (i, r) in requests.iter().enumerate() {
                if let Some(id) = self.lookup(&mut s, &r.claim, Some(&r.batch))
                    && let Some(inst) = s.instances.get(&id)
                {
                    out[i] = Some(Ok(self.view(inst, now)));
                }
            }
            let crash = s.crash_after_fleet > 0;
            if crash {
                s.crash_after_fleet -= 1;
            }
            // Merge the rest into calls of identical shape.
            for g in group_identical(requests, |i| out[i].is_none()) {
                let throttled = SimCloud::draw(&mut s, now, |l| &mut l.mutating, 1.0, "CreateFleet").and_then(|()| {
                    SimCloud::draw(&mut s, now, |l| &mut l.launched_instances, g.len() as f64, "CreateFleet")
                });
                if let Err(e) = throttled {
                    for &i in &g {
                        out[i] = Some(Err(e.clone()));
                    }
                    continue;
                }
                s.stats.fleet_calls += 1;
                let first = &requests[g[0]];
                let shape = Arc::new(RequestShape {
                    nodepool: first.nodepool.clone(),
                    labels: first.labels.clone(),
                    tags: first.tags.clone(),
                    node_class_hash: first.node_class.hash.clone(),
                });
                for &i in &g {
                    let r = &requests[i];
                    if !self.config.region.is_empty() && !r.zone.starts_with(&self.config.region) {
                        out[i] = Some(Err(CloudError::Invalid {
                            what: format!("zone of nodeclaim {}", r.claim),
                            reason: format!("{} is not in region {}", r.zone, self.config.region),
                        }));
                        continue;
                    }
                    match self.pick(&s, r) {
                        Ok((t, ct, price)) => {
                            let key = OfferingKey {
                                instance_type: self.types[t].name.clone(),
                                zone: r.zone.clone(),
                                capacity_type: ct,
                            };
                            if let Some(left) = s.capacity.get_mut(&key) {
                                *left -= 1;
                            }
                            let mut inst = self.make_instance(&mut s, r, &shape, (t, ct, price), now);
                            s.by_batch.entry(inst.batch.clone()).or_default().push(inst.id.clone());
                            s.stats.launched += 1;
                            if crash {
                                // Made, tagged with its batch only; the caller never hears.
                                inst.claim = None;
                                s.instances.insert(inst.id.clone(), inst);
                                out[i] = Some(Err(CloudError::Transient {
                                    message: "the launch call was cut off after CreateFleet".into(),
                                }));
                                continue;
                            }
                            let view = self.view(&inst, now);
                            s.by_claim.insert(r.claim.clone(), inst.id.clone());
                            s.instances.insert(inst.id.clone(), inst);
                            out[i] = Some(Ok(view));
                        }
                        Err(offerings) => {
                            s.stats.insufficient_capacity += 1;
                            out[i] = Some(Err(CloudError::InsufficientCapacity { offerings }));
                        }
                    }
                }
            }
            out.into_iter().map(|r| r.unwrap_or(Err(CloudError::Transient { message: "no result".into() }))).collect()
        })
    }

    fn find<'a>(&'a self, lookups: &'a [Lookup]) -> BoxFuture<'a, Vec<Result<Option<Instance>, CloudError>>> {
        Box::pin(async move {
            let now = self.clock.now();
            let mut s = self.lock();
            if let Err(e) = SimCloud::draw(&mut s, now, |l| &mut l.non_mutating, 1.0, "DescribeInstances") {
                return lookups.iter().map(|_| Err(e.clone())).collect();
            }
            s.stats.describe_calls += 1;
            lookups
                .iter()
                .map(|l| {
                    let id = self.lookup(&mut s, &l.claim, l.batch.as_ref());
                    Ok(id.and_then(|id| s.instances.get(&id)).map(|i| self.view(i, now)))
                })
                .collect()
        })
    }

    fn terminate<'a>(&'a self, ids: &'a [String]) -> BoxFuture<'a, Vec<Result<(), CloudError>>> {
        Box::pin(async move {
            let now = self.clock.now();
            let mut s = self.lock();
            let known = ids.iter().filter(|id| s.instances.contains_key(id.as_str())).count();
            let throttled =
                SimCloud::draw(&mut s, now, |l| &mut l.mutating, 1.0, "TerminateInstances").and_then(|()| {
                    SimCloud::draw(&mut s, now, |l| &mut l.terminated_instances, known as f64, "TerminateInstances")
                });
            if let Err(e) = throttled {
                return ids.iter().map(|_| Err(e.clone())).collect();
            }
            s.stats.terminate_calls += 1;
            ids.iter()
                .map(|id| match s.instances.remove(id.as_str()) {
                    Some(inst) => {
                        forget(&mut s, &inst);
                        let key = OfferingKey {
                            instance_type: self.types[inst.instance_type].name.clone(),
                            zone: inst.zone.clone(),
                            capacity_type: inst.capacity_type,
                        };
                        if let Some(left) = s.capacity.get_mut(&key) {
                            *left += 1;
                        }
                        s.stats.terminated += 1;
                        Ok(())
                    }
                    None => Err(CloudError::NotFound { id: id.clone() }),
                })
                .collect()
        })
    }

    fn get<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<Instance, CloudError>> {
        Box::pin(async move {
            let now = self.clock.now();
            let mut s = self.lock();
            SimCloud::draw(&mut s, now, |l| &mut l.non_mutating, 1.0, "DescribeInstances")?;
            s.stats.describe_calls += 1;
            s.instances.get(id).map(|i| self.view(i, now)).ok_or_else(|| CloudError::NotFound { id: id.to_string() })
        })
    }

    fn list(&self) -> BoxFuture<'_, Result<Vec<Instance>, CloudError>> {
        Box::pin(async move {
            let now = self.clock.now();
            let mut s = self.lock();
            // Paginated at 1,000 per page, one token each.
            let pages = s.instances.len().div_ceil(1000).max(1) as f64;
            SimCloud::draw(&mut s, now, |l| &mut l.non_mutating, pages, "DescribeInstances")?;
            s.stats.describe_calls += pages as u64;
            Ok(s.instances.values().map(|i| self.view(i, now)).collect())
        })
    }

    fn instance_types<'a>(
        &'a self,
        _node_class: &'a NodeClass,
    ) -> BoxFuture<'a, Result<Vec<InstanceType>, CloudError>> {
        // One catalog for every node class (the sim has no per-class AMIs or settings).
        Box::pin(async move {
            let s = self.lock();
            let mut types: Vec<InstanceType> = self.types.as_ref().clone();
            for t in &mut types {
                for o in &mut t.offerings {
                    let key = OfferingKey {
                        instance_type: t.name.clone(),
                        zone: o.zone.clone(),
                        capacity_type: o.capacity_type,
                    };
                    if s.capacity.get(&key).is_some_and(|left| *left == 0) {
                        o.available = false;
                    }
                }
            }
            Ok(types)
        })
    }

    fn is_drifted<'a>(
        &'a self,
        instance: &'a Instance,
        node_class: &'a NodeClass,
    ) -> BoxFuture<'a, Result<Option<DriftReason>, CloudError>> {
        Box::pin(async move {
            // An instance with no recorded hash (restored from a trace) is not judged by it,
            // as the AWS provider does for an instance without the tag.
            if !instance.node_class_hash.is_empty() && instance.node_class_hash != node_class.hash {
                return Ok(Some(DriftReason::NodeClass));
            }
            let current = self.lock().image.clone();
            if instance.image != *current {
                return Ok(Some(DriftReason::Image));
            }
            Ok(None)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dovetail_core::catalog::{Catalog, NodeClassSettings};
    use dovetail_core::clock::ManualClock;

    fn cloud(config: SimConfig) -> (SimCloud, Arc<ManualClock>) {
        let c = Catalog::embedded("us-east-1").expect("catalog");
        let types: Vec<InstanceType> = c
            .instance_types(&NodeClassSettings::default(), None)
            .into_iter()
            .filter(|t| t.name.starts_with("m5."))
            .collect();
        let clock = Arc::new(ManualClock::new());
        (SimCloud::new(config, Arc::new(types), clock.clone()), clock)
    }

    fn request(claim: &str, cts: Vec<CapacityType>) -> LaunchRequest {
        LaunchRequest {
            claim: claim.into(),
            batch: dovetail_core::ledger::LaunchBatch { id: "batch-1".into(), claims: vec![claim.to_string()].into() },
            nodepool: "default".into(),
            node_class: NodeClass { name: "default".into(), hash: "h".into(), ..Default::default() },
            zone: "us-east-1b".into(),
            instance_types: vec!["m5.large".into(), "m5.xlarge".into()],
            capacity_types: cts,
            labels: Labels::new(),
            tags: BTreeMap::new(),
        }
    }

    fn block<T>(f: impl std::future::Future<Output = T>) -> T {
        tokio::runtime::Builder::new_current_thread().build().expect("runtime").block_on(f)
    }

    #[test]
    fn identical_launches_share_one_fleet_call() {
        let (c, _) = cloud(SimConfig::default());
        let reqs: Vec<LaunchRequest> =
            (0..25).map(|i| request(&format!("c{i}"), vec![CapacityType::OnDemand])).collect();
        let out = block(c.launch(&reqs));
        assert!(out.iter().all(Result::is_ok));
        assert_eq!(c.stats().fleet_calls, 1);
        let mut other = request("odd", vec![CapacityType::OnDemand]);
        other.zone = "us-east-1c".into();
        let out = block(c.launch(&[request("c100", vec![CapacityType::OnDemand]), other]));
        assert!(out.iter().all(Result::is_ok));
        assert_eq!(c.stats().fleet_calls, 3, "a different zone is another call");
    }

    #[test]
    fn spot_is_preferred_and_capacity_comes_back_on_terminate() {
        let key = OfferingKey {
            instance_type: "m5.large".into(),
            zone: "us-east-1b".into(),
            capacity_type: CapacityType::Spot,
        };
        let mut config = SimConfig::default();
        config.capacity.insert(key.clone(), 1);
        let (c, _) = cloud(config);
        let both = vec![CapacityType::Spot, CapacityType::OnDemand];
        let a = block(c.launch(&[request("a", both.clone())])).remove(0).expect("a");
        assert_eq!((a.capacity_type, a.instance_type.as_str()), (CapacityType::Spot, "m5.large"));
        // The last spot m5.large is gone: the next claim gets the next cheapest offering.
        let b = block(c.launch(&[request("b", both.clone())])).remove(0).expect("b");
        assert_ne!((b.capacity_type, b.instance_type.as_str()), (CapacityType::Spot, "m5.large"));
        assert_eq!(block(c.terminate(std::slice::from_ref(&a.id))), vec![Ok(())]);
        let d = block(c.launch(&[request("d", both)])).remove(0).expect("d");
        assert_eq!((d.capacity_type, d.instance_type.as_str()), (CapacityType::Spot, "m5.large"));
    }

    #[test]
    fn instances_run_after_their_boot_time_and_drift_is_reported() {
        let (c, clock) = cloud(SimConfig::default());
        let a = block(c.launch(&[request("a", vec![])])).remove(0).expect("a");
        assert_eq!(a.state, InstanceState::Pending);
        clock.advance(Duration::from_secs(41));
        assert_eq!(block(c.get(&a.id)).expect("get").state, InstanceState::Running);
        let same = NodeClass { name: "default".into(), hash: "h".into(), ..Default::default() };
        assert_eq!(block(c.is_drifted(&a, &same)), Ok(None));
        let changed = NodeClass { hash: "h2".into(), ..same };
        assert_eq!(block(c.is_drifted(&a, &changed)), Ok(Some(DriftReason::NodeClass)));
    }

    #[test]
    fn an_image_release_drifts_the_instances_that_booted_an_older_one() {
        let (c, _) = cloud(SimConfig::default());
        let class = NodeClass { name: "default".into(), hash: "h".into(), ..Default::default() };
        let old = block(c.launch(&[request("old", vec![])])).remove(0).expect("old");
        assert_eq!(block(c.is_drifted(&old, &class)), Ok(None));
        c.release_image("ami-sim-2");
        let old = block(c.get(&old.id)).expect("get");
        assert_eq!(old.image, "ami-sim-al2023", "it keeps the image it booted");
        assert_eq!(block(c.is_drifted(&old, &class)), Ok(Some(DriftReason::Image)));
        let new = block(c.launch(&[request("new", vec![])])).remove(0).expect("new");
        assert_eq!((new.image.as_str(), block(c.is_drifted(&new, &class))), ("ami-sim-2", Ok(None)));
    }

    #[test]
    fn interruptions_are_seeded_and_land_in_the_queue() {
        let run = |seed: u64| {
            let config = SimConfig { seed, spot_interruptions_per_hour: 0.5, ..SimConfig::default() };
            let (c, clock) = cloud(config);
            let reqs: Vec<LaunchRequest> =
                (0..200).map(|i| request(&format!("c{i}"), vec![CapacityType::Spot])).collect();
            let mut limits = ApiLimits::raised(10.0);
            limits.mutating = Bucket::new(1000.0, 100.0);
            c.set_limits(limits);
            assert!(block(c.launch(&reqs)).iter().all(Result::is_ok));
            clock.advance(Duration::from_secs(3600));
            let hit = c.tick();
            (hit, c.queue().len())
        };
        let (a, queued) = run(7);
        assert_eq!(a, run(7).0, "same seed, same interruptions");
        assert!(!a.is_empty() && a.len() < 200, "about 40% of 200 expected, got {}", a.len());
        assert_eq!(queued, a.len());
    }

    #[test]
    fn a_storm_raises_the_rate_and_reclaimed_instances_are_gone_without_an_api_call() {
        let (c, clock) = cloud(SimConfig::default());
        let reqs: Vec<LaunchRequest> = (0..20).map(|i| request(&format!("c{i}"), vec![CapacityType::Spot])).collect();
        let mut limits = ApiLimits::raised(10.0);
        limits.mutating = Bucket::new(1000.0, 100.0);
        c.set_limits(limits);
        assert!(block(c.launch(&reqs)).iter().all(Result::is_ok));
        clock.advance(Duration::from_secs(3600));
        assert!(c.tick().is_empty(), "no storm, no interruptions");
        c.set_spot_interruption_rate(50.0);
        clock.advance(Duration::from_secs(600));
        let hit = c.tick();
        assert_eq!(hit.len(), 20, "at 50 per hour for 10 minutes every instance is hit");
        let calls = c.stats().terminate_calls;
        assert_eq!(c.reclaim(&hit[..5]), 5);
        assert_eq!((c.len(), c.stats().terminate_calls), (15, calls));
        let zone = &block(c.get(&hit[5])).expect("still there").zone;
        assert_eq!(c.instances_in(zone).len(), 15);
        assert_eq!(c.reclaim(&hit[..5]), 0, "gone already");
    }

    #[test]
    fn a_zone_outside_the_region_is_invalid() {
        let (c, _) = cloud(SimConfig::default());
        let mut r = request("a", vec![]);
        r.zone = "eu-west-1a".into();
        match block(c.launch(&[r])).remove(0) {
            Err(CloudError::Invalid { what, .. }) => assert!(what.contains("nodeclaim a")),
            other => panic!("expected Invalid, got {other:?}"),
        }
    }
}
