//! What a loadtest plays around the plane, one step a tick: the scenario's workloads and
//! faults, EC2 (the sim cloud), the kubelets (the registrar) and kube-scheduler (the sim
//! cluster's binding).

use std::collections::BTreeMap;
use std::sync::Arc;

use dovetail_actors::kubelet::registrations;
use dovetail_cloud::OfferingKey;
use dovetail_cloud::limits::ApiLimits;
use dovetail_cloud::sim::SimCloud;
use dovetail_cluster::sim::{Deployment, Job, Registrar, SimCluster, Workloads};
use dovetail_core::catalog::InstanceType;
use dovetail_core::clock::{DEFAULT_EPOCH, to_millis};
use dovetail_core::pod::{Pod, PodKey};
use dovetail_core::resources::{ResourceList, ResourceName};

use crate::scenario::{FaultKind, Ice, Scenario, Workload};

fn pod(cpu_milli: i64, memory: i64) -> Pod {
    Pod { requests: ResourceList::cpu_mem(cpu_milli, memory), ..Pod::default() }
}

fn apply(workloads: &mut Workloads, w: &Workload) {
    match w {
        Workload::Deployment { namespace, name, replicas, cpu_milli, memory } => {
            workloads.apply_deployment(Deployment {
                namespace: namespace.clone(),
                name: name.clone(),
                replicas: *replicas,
                template: pod(*cpu_milli, *memory),
                pick: Default::default(),
            });
        }
        // Checked at parse time: the Deployment exists.
        Workload::Scale { namespace, name, replicas, pick } => {
            if let Err(e) = workloads.scale(namespace, name, *replicas, *pick) {
                tracing::warn!(deployment = %format!("{namespace}/{name}"), error = %e, "loadtest.scale: not scaled");
            }
        }
        Workload::Job { namespace, name, parallelism, completions, run_for, cpu_milli, memory } => {
            workloads.apply_job(Job {
                namespace: namespace.clone(),
                name: name.clone(),
                parallelism: *parallelism,
                completions: *completions,
                run_for_ms: *run_for,
                template: pod(*cpu_milli, *memory),
            });
        }
        // Bare pods are applied by the driver.
        Workload::Pod { .. } | Workload::DeletePod { .. } => {}
    }
}

/// What the run plays around the plane: the scenario's workloads and faults, EC2 (the sim
/// cloud), the kubelets (the registrar) and kube-scheduler (the sim cluster's binding).
pub(crate) struct World {
    pub(crate) sc: Arc<Scenario>,
    pub(crate) cluster: Arc<SimCluster>,
    pub(crate) cloud: Arc<SimCloud>,
    pub(crate) all_types: Arc<Vec<InstanceType>>,
    pub(crate) workloads: Workloads,
    pub(crate) registrar: Registrar,
    pub(crate) faults: Faults,
    /// The next of the scenario's workload events.
    pub(crate) next_event: usize,
}

impl World {
    /// One tick at `now` (scenario ms): the workload events due, the faults, the workload
    /// controllers, the kubelets and the scheduler. The cloud's instances after it.
    pub(crate) fn step(&mut self, now: u64) -> Vec<dovetail_cloud::Instance> {
        let (mut bare, mut gone) = (Vec::new(), Vec::new());
        while let Some((at, w)) = self.sc.workloads.get(self.next_event)
            && *at <= now
        {
            match w {
                Workload::Pod { name, cpu_milli, memory, gpus } => {
                    let mut p = pod(*cpu_milli, *memory);
                    if *gpus > 0 {
                        p.requests.set(ResourceName::NvidiaGpu, *gpus);
                    }
                    p.key = PodKey::new("default", name);
                    p.creation = i64::try_from(now).unwrap_or(i64::MAX);
                    bare.push(p);
                }
                Workload::DeletePod { name } => gone.push(PodKey::new("default", name)),
                w => apply(&mut self.workloads, w),
            }
            self.next_event += 1;
        }
        self.cluster.apply_pods(bare);
        self.cluster.delete_pods(&gone);
        self.faults.step(&self.sc, &self.cloud, &self.all_types, now);
        self.faults.note_launches(&self.cloud);
        self.workloads.step(&self.cluster, now);
        let instances = self.cloud.instances();
        self.registrar.step(&self.cluster, &registrations(&instances), now);
        self.cluster.schedule();
        instances
    }
}

/// The faults' state as the run goes: which are active, and what they did.
pub(crate) struct Faults {
    active: Vec<bool>,
    /// The scenario's own EC2 bucket factor, which a throttle scales down.
    base: f64,
    throttle: Option<f64>,
    spot_rate: f64,
    /// Spot instances warned, with when EC2 takes each back (two minutes after the warning).
    reclaims: Vec<(u64, String)>,
    pub(crate) warned: u64,
    /// Warnings whose reclaim came due.
    pub(crate) due: u64,
    pub(crate) interrupted: u64,
    pub(crate) zone_lost: u64,
    /// The burst's messages: each instance sent one, with when (scenario ms); and how many
    /// each burst fault sent.
    pub(crate) burst_sent: BTreeMap<String, u64>,
    burst_counts: Vec<u64>,
    /// Each burst fault's targets, fixed at its start: the instances of claims then, in order
    /// (a replacement launched during the burst is never one).
    burst_targets: Vec<Option<Vec<String>>>,
    /// From a burst's start, every claim's first launch seen (scenario ms), kept after its
    /// instance is gone.
    pub(crate) launched: BTreeMap<String, u64>,
}

/// EC2's request buckets multiplied by `factor` (EC2's own at 1).
pub(crate) fn limits_times(factor: f64) -> ApiLimits {
    if factor == 1.0 { ApiLimits::default() } else { ApiLimits::raised(factor) }
}

/// EC2's notice before it reclaims a spot instance.
const SPOT_WARNING_MS: u64 = 120_000;

impl Faults {
    pub(crate) fn new(n: usize, base: f64) -> Self {
        Faults {
            active: vec![false; n],
            base,
            throttle: None,
            spot_rate: 0.0,
            reclaims: Vec::new(),
            warned: 0,
            due: 0,
            interrupted: 0,
            zone_lost: 0,
            burst_sent: BTreeMap::new(),
            burst_counts: vec![0; n],
            burst_targets: vec![None; n],
            launched: BTreeMap::new(),
        }
    }

    /// Sends this tick's share of an interruption burst: `per_second` a second, each for one
    /// of the burst's targets (fixed at its start) still running and not sent one yet, in turn
    /// a spot warning, a scheduled change and a state change to `stopping`.
    fn burst(&mut self, i: usize, (messages, per_second): (u64, u64), cloud: &SimCloud, tick: u64, now: u64) {
        use dovetail_cloud::events::EventKind;
        let left = messages.saturating_sub(self.burst_counts[i]);
        let share = per_second.saturating_mul(tick).div_ceil(1000).max(1).min(left);
        if share == 0 {
            return;
        }
        let running = cloud.instances();
        let targets = self.burst_targets[i].get_or_insert_with(|| {
            running.iter().filter(|inst| inst.claim.is_some()).map(|inst| inst.id.clone()).collect()
        });
        let live: std::collections::BTreeSet<&str> = running.iter().map(|inst| inst.id.as_str()).collect();
        let kinds = [EventKind::SpotInterruption, EventKind::ScheduledChange, EventKind::StateChange("stopping")];
        let mut sent = 0u64;
        for id in targets.iter() {
            if sent >= share {
                break;
            }
            if !live.contains(id.as_str()) || self.burst_sent.contains_key(id) {
                continue;
            }
            let n = self.burst_sent.len();
            cloud.inject(kinds[n % kinds.len()], id);
            self.burst_sent.insert(id.clone(), now);
            sent += 1;
        }
        self.burst_counts[i] += sent;
    }

    /// Notes the launches seen since the first burst started.
    fn note_launches(&mut self, cloud: &SimCloud) {
        if self.burst_targets.iter().all(Option::is_none) {
            return;
        }
        let epoch = to_millis(DEFAULT_EPOCH);
        for inst in cloud.instances() {
            let (Some(claim), Ok(at)) = (inst.claim, u64::try_from(inst.launched_at.as_millis())) else { continue };
            self.launched.entry(claim).or_insert(at.saturating_sub(epoch));
        }
    }

    /// Starts and ends the faults at `now`, and plays EC2's side of the active ones.
    fn step(&mut self, sc: &Scenario, cloud: &SimCloud, types: &[InstanceType], now: u64) {
        let (mut throttle, mut spot_rate) = (None::<f64>, 0.0);
        for (i, f) in sc.faults.iter().enumerate() {
            let on = f.from <= now && now < f.until;
            match &f.kind {
                FaultKind::Throttle { factor } if on => throttle = Some(throttle.map_or(*factor, |t| t.min(*factor))),
                FaultKind::SpotInterruptions { per_hour } if on => spot_rate += per_hour,
                FaultKind::InterruptionBurst { messages, per_second } if on => {
                    self.burst(i, (*messages, *per_second), cloud, sc.tick, now);
                }
                _ => {}
            }
            if on == self.active[i] {
                continue;
            }
            self.active[i] = on;
            match &f.kind {
                FaultKind::Ice(ice) => set_ice(cloud, types, ice, on),
                FaultKind::ZoneLost { zone } => {
                    use dovetail_core::catalog::CapacityType;
                    let all = Ice {
                        zone: zone.clone(),
                        capacity_types: vec![CapacityType::Spot, CapacityType::OnDemand],
                        instance_types: Vec::new(),
                    };
                    set_ice(cloud, types, &all, on);
                    if on {
                        self.zone_lost += cloud.reclaim(&cloud.instances_in(zone)) as u64;
                    }
                }
                FaultKind::Throttle { .. }
                | FaultKind::SpotInterruptions { .. }
                | FaultKind::InterruptionBurst { .. } => {}
            }
        }
        if throttle != self.throttle {
            self.throttle = throttle;
            let factor = self.base * throttle.unwrap_or(1.0);
            cloud.set_limits(limits_times(factor));
        }
        if spot_rate != self.spot_rate {
            self.spot_rate = spot_rate;
            cloud.set_spot_interruption_rate(spot_rate);
        }
        let due = now.saturating_add(SPOT_WARNING_MS);
        let warned = cloud.tick();
        self.warned += warned.len() as u64;
        self.reclaims.extend(warned.into_iter().map(|id| (due, id)));
        let (now_due, later): (Vec<_>, Vec<_>) =
            std::mem::take(&mut self.reclaims).into_iter().partition(|(at, _)| *at <= now);
        self.reclaims = later;
        let ids: Vec<String> = now_due.into_iter().map(|(_, id)| id).collect();
        self.due += ids.len() as u64;
        self.interrupted += cloud.reclaim(&ids) as u64;
    }
}

/// Starts or ends an ICE window: every matching offering in the zone has no capacity.
fn set_ice(cloud: &SimCloud, types: &[InstanceType], ice: &Ice, on: bool) {
    for t in types {
        if !ice.instance_types.is_empty() && !ice.instance_types.contains(&t.name) {
            continue;
        }
        for o in &t.offerings {
            if o.zone != ice.zone || !ice.capacity_types.contains(&o.capacity_type) {
                continue;
            }
            let key =
                OfferingKey { instance_type: t.name.clone(), zone: o.zone.clone(), capacity_type: o.capacity_type };
            if on {
                cloud.set_capacity(key, 0);
            } else {
                cloud.clear_capacity(&key);
            }
        }
    }
}
