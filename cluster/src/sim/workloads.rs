//! What plays Kubernetes around the sim cluster's objects: the Deployment and Job controllers
//! (so workloads scale), pod garbage collection (pods of a deleted node go, and their owners
//! make new ones), and a kwok-like registrar that turns a launched instance into a node after
//! a delay. Each is stepped by its driver with the time, so it runs on a manual or virtual
//! clock as well as on the wall clock.

use std::collections::{BTreeMap, BTreeSet};

use dovetail_core::pod::{Pod, PodKey};

use super::{Registration, SimCluster};
use crate::{ClusterError, ClusterView};

/// A Deployment: keeps `replicas` pods from its template.
#[derive(Clone, Debug, PartialEq)]
pub struct Deployment {
    pub namespace: String,
    pub name: String,
    pub replicas: u32,
    /// The pod template (its key is ignored; pods are named `<name>-<n>`).
    pub template: Pod,
    /// Which pods a scale-down removes.
    pub pick: Pick,
}

/// Which pods a Deployment's scale-down removes (after the pending ones, always first).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Pick {
    /// The newest first, as the ReplicaSet controller ranks pods of different ages.
    #[default]
    Newest,
    /// In an order drawn from the pod names and the seed: pods of one age, as a scale-up
    /// makes them, are ranked by their UIDs since Kubernetes 1.22 (LogarithmicScaleDown),
    /// which is no order at all.
    Random(u64),
}

/// A Job: runs pods, `parallelism` at a time, each for `run_for_ms` once bound, until
/// `completions` have succeeded.
#[derive(Clone, Debug, PartialEq)]
pub struct Job {
    pub namespace: String,
    pub name: String,
    pub parallelism: u32,
    pub completions: u32,
    pub run_for_ms: u64,
    pub template: Pod,
}

/// `status` of a Job.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct JobStatus {
    pub active: u32,
    pub succeeded: u32,
}

/// What one controller step did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WorkloadStep {
    pub created: usize,
    pub deleted: usize,
    /// Job pods that ran to completion.
    pub completed: usize,
    /// Pods removed because their node is gone.
    pub collected: usize,
}

struct Owned<S> {
    spec: S,
    /// The pods it made that still exist.
    pods: BTreeSet<PodKey>,
    next: u64,
}

impl<S> Owned<S> {
    fn new(spec: S) -> Self {
        Owned { spec, pods: BTreeSet::new(), next: 0 }
    }
}

struct JobRun {
    owned: Owned<Job>,
    succeeded: u32,
    /// When each of its pods was first seen bound (the container started).
    started: BTreeMap<PodKey, u64>,
}

/// The workload controllers.
#[derive(Default)]
pub struct Workloads {
    deployments: BTreeMap<(String, String), Owned<Deployment>>,
    jobs: BTreeMap<(String, String), JobRun>,
}

fn new_pod(template: &Pod, namespace: &str, name: &str, n: &mut u64, now: u64) -> Pod {
    let mut pod = template.clone();
    pod.key = PodKey::new(namespace, &format!("{name}-{n:05}"));
    pod.node_name = None;
    pod.terminal = false;
    pod.creation = i64::try_from(now).unwrap_or(i64::MAX);
    *n += 1;
    pod
}

impl Workloads {
    pub fn new() -> Self {
        Workloads::default()
    }

    /// Creates or replaces a Deployment (a new template applies to new pods only).
    pub fn apply_deployment(&mut self, d: Deployment) {
        let key = (d.namespace.clone(), d.name.clone());
        match self.deployments.get_mut(&key) {
            Some(o) => o.spec = d,
            None => {
                self.deployments.insert(key, Owned::new(d));
            }
        }
    }

    /// Sets a Deployment's replicas, and which pods a scale-down removes.
    pub fn scale(&mut self, namespace: &str, name: &str, replicas: u32, pick: Pick) -> Result<(), ClusterError> {
        let d = self
            .deployments
            .get_mut(&(namespace.to_string(), name.to_string()))
            .ok_or_else(|| ClusterError::NotFound { kind: "deployment", name: format!("{namespace}/{name}") })?;
        d.spec.replicas = replicas;
        d.spec.pick = pick;
        Ok(())
    }

    /// Creates a Job (a second apply of a running Job changes nothing but its spec).
    pub fn apply_job(&mut self, j: Job) {
        let key = (j.namespace.clone(), j.name.clone());
        match self.jobs.get_mut(&key) {
            Some(r) => r.owned.spec = j,
            None => {
                self.jobs.insert(key, JobRun { owned: Owned::new(j), succeeded: 0, started: BTreeMap::new() });
            }
        }
    }

    pub fn deployment(&self, namespace: &str, name: &str) -> Option<&Deployment> {
        self.deployments.get(&(namespace.to_string(), name.to_string())).map(|o| &o.spec)
    }

    pub fn job_status(&self, namespace: &str, name: &str) -> Option<JobStatus> {
        self.jobs.get(&(namespace.to_string(), name.to_string())).map(|r| JobStatus {
            active: u32::try_from(r.owned.pods.len()).unwrap_or(u32::MAX),
            succeeded: r.succeeded,
        })
    }

    /// One round of every controller at time `now` (milliseconds): pod GC first, then each
    /// Deployment to its replica count (scale-down removes pending pods first, then the newest,
    /// as the ReplicaSet controller ranks them), then each Job. All creates are one change and
    /// all deletes another.
    pub fn step(&mut self, cluster: &SimCluster, now: u64) -> WorkloadStep {
        let snap = cluster.snapshot();
        let mut step = WorkloadStep::default();
        let mut delete: Vec<PodKey> = snap
            .pods
            .values()
            .filter(|p| p.node_name.as_ref().is_some_and(|n| !snap.nodes.contains_key(n)))
            .map(|p| p.key.clone())
            .collect();
        step.collected = delete.len();
        let gone: BTreeSet<PodKey> = delete.iter().cloned().collect();
        let alive = |k: &PodKey| snap.pods.contains_key(k) && !gone.contains(k);
        let mut create: Vec<Pod> = Vec::new();
        for d in self.deployments.values_mut() {
            d.pods.retain(|k| alive(k));
            let want = d.spec.replicas as usize;
            if d.pods.len() < want {
                for _ in d.pods.len()..want {
                    let pod = new_pod(&d.spec.template, &d.spec.namespace, &d.spec.name, &mut d.next, now);
                    d.pods.insert(pod.key.clone());
                    create.push(pod);
                }
            } else if d.pods.len() > want {
                // Pending first, then the newest (a later name breaks a tie: it was made
                // later), or in the seeded order.
                let rank = |p: &Pod| match d.spec.pick {
                    Pick::Newest => std::cmp::Reverse(i128::from(p.creation)),
                    Pick::Random(seed) => {
                        let mut h = dovetail_core::shared::Fnv::default();
                        h.write_u64(seed);
                        h.write(p.key.namespace.as_bytes());
                        h.write(p.key.name.as_bytes());
                        std::cmp::Reverse(i128::from(h.finish()))
                    }
                };
                let mut ranked: Vec<(bool, std::cmp::Reverse<i128>, std::cmp::Reverse<&PodKey>)> = d
                    .pods
                    .iter()
                    .filter_map(|k| snap.pods.get(k))
                    .map(|p| (p.node_name.is_some(), rank(p), std::cmp::Reverse(&p.key)))
                    .collect();
                ranked.sort();
                let excess: Vec<PodKey> = ranked.iter().take(d.pods.len() - want).map(|r| r.2.0.clone()).collect();
                for k in &excess {
                    d.pods.remove(k);
                }
                step.deleted += excess.len();
                delete.extend(excess);
            }
        }
        for r in self.jobs.values_mut() {
            r.owned.pods.retain(|k| alive(k));
            r.started.retain(|k, _| r.owned.pods.contains(k));
            let mut done = Vec::new();
            for k in &r.owned.pods {
                if snap.pods.get(k).is_some_and(|p| p.node_name.is_some()) {
                    let since = *r.started.entry(k.clone()).or_insert(now);
                    if now.saturating_sub(since) >= r.owned.spec.run_for_ms {
                        done.push(k.clone());
                    }
                }
            }
            for k in &done {
                r.owned.pods.remove(k);
                r.started.remove(k);
            }
            r.succeeded = r.succeeded.saturating_add(u32::try_from(done.len()).unwrap_or(u32::MAX));
            step.completed += done.len();
            delete.extend(done);
            let spec = &r.owned.spec;
            let active = u32::try_from(r.owned.pods.len()).unwrap_or(u32::MAX);
            let room = spec.parallelism.saturating_sub(active);
            let left = spec.completions.saturating_sub(r.succeeded.saturating_add(active));
            for _ in 0..room.min(left) {
                let pod = new_pod(&spec.template, &spec.namespace, &spec.name, &mut r.owned.next, now);
                r.owned.pods.insert(pod.key.clone());
                create.push(pod);
            }
        }
        step.created = create.len();
        cluster.delete_pods(&delete);
        cluster.apply_pods(create);
        step
    }
}

/// The kwok-like registrar: an instance becomes a Ready node (`SimCluster::register`) once it
/// has been seen launched for `delay_ms`. It also plays the cloud node lifecycle controller: a
/// node whose instance is gone (reclaimed, or lost with its zone) is deleted.
pub struct Registrar {
    pub delay_ms: u64,
    seen: BTreeMap<String, u64>,
    /// Nodes deleted because their instance was gone.
    pub deleted: u64,
}

impl Registrar {
    pub fn new(delay_ms: u64) -> Self {
        Registrar { delay_ms, seen: BTreeMap::new(), deleted: 0 }
    }

    /// Registers the `launched` instances (by provider id) whose delay has passed; forgets
    /// those no longer launched and deletes their nodes. Returns how many nodes it registered.
    pub fn step(&mut self, cluster: &SimCluster, launched: &[Registration], now: u64) -> usize {
        let live: BTreeSet<&str> = launched.iter().map(|r| r.provider_id.as_str()).collect();
        self.seen.retain(|p, _| live.contains(p.as_str()));
        // One snapshot serves both: the nodes deleted here are not among `launched`.
        let snap = cluster.snapshot();
        for n in snap.nodes.values().filter(|n| n.provider_id.as_deref().is_some_and(|p| !live.contains(p))) {
            // As the cloud node lifecycle controller deletes it: held by its finalizers.
            if !n.deleting && cluster.remove_node(&n.name).is_ok() {
                self.deleted += 1;
            }
        }
        let registered: BTreeSet<&str> = snap.nodes.values().filter_map(|n| n.provider_id.as_deref()).collect();
        let mut count = 0;
        for r in launched {
            if registered.contains(r.provider_id.as_str()) {
                continue;
            }
            let since = *self.seen.entry(r.provider_id.clone()).or_insert(now);
            if now.saturating_sub(since) >= self.delay_ms && cluster.register(r).is_ok() {
                count += 1;
            }
        }
        count
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dovetail_core::node::Node;
    use dovetail_core::resources::ResourceList;

    fn template() -> Pod {
        Pod::new("default", "web", ResourceList::cpu_mem(500, 1 << 30))
    }

    fn deployment(replicas: u32) -> Deployment {
        Deployment {
            namespace: "default".into(),
            name: "web".into(),
            replicas,
            template: template(),
            pick: Pick::Newest,
        }
    }

    fn owned(c: &SimCluster) -> Vec<std::sync::Arc<Pod>> {
        c.snapshot().pods.values().filter(|p| p.key.name.starts_with("web-")).cloned().collect()
    }

    #[test]
    fn a_deployment_keeps_its_replicas_and_scales_down_pending_then_newest() {
        let c = SimCluster::new();
        c.apply_node(Node { name: "n1".into(), ..Node::default() });
        let mut w = Workloads::new();
        w.apply_deployment(deployment(4));
        let s = w.step(&c, 0);
        assert_eq!((s.created, s.deleted), (4, 0));
        assert_eq!(w.step(&c, 1), WorkloadStep::default(), "steady");
        // Two are running; an evicted one is replaced.
        c.bind(&PodKey::new("default", "web-00000"), "n1").expect("bind");
        c.bind(&PodKey::new("default", "web-00003"), "n1").expect("bind");
        c.evict_now(&PodKey::new("default", "web-00001")).expect("evict");
        assert_eq!(w.step(&c, 2).created, 1);
        assert_eq!(owned(&c).len(), 4);
        // Down to 1: the pending ones go first, then the newer running one.
        w.scale("default", "web", 1, Pick::Newest).expect("scale");
        assert_eq!(w.step(&c, 3).deleted, 3);
        let left: Vec<String> = owned(&c).iter().map(|p| p.key.name.clone()).collect();
        assert_eq!(left, vec!["web-00000".to_string()]);
        assert!(w.scale("default", "nope", 1, Pick::Newest).is_err());
    }

    #[test]
    fn a_job_runs_its_pods_for_their_time_until_its_completions() {
        let c = SimCluster::new();
        c.apply_node(Node { name: "n1".into(), ..Node::default() });
        let mut w = Workloads::new();
        let job = Job {
            namespace: "batch".into(),
            name: "etl".into(),
            parallelism: 2,
            completions: 3,
            run_for_ms: 100,
            template: template(),
        };
        w.apply_job(job);
        assert_eq!(w.step(&c, 0).created, 2);
        assert_eq!(w.job_status("batch", "etl"), Some(JobStatus { active: 2, succeeded: 0 }));
        // Pending pods do not run.
        assert_eq!(w.step(&c, 500).completed, 0);
        for p in c.snapshot().pods.keys() {
            c.bind(p, "n1").expect("bind");
        }
        w.step(&c, 1000);
        assert_eq!(w.step(&c, 1099).completed, 0);
        let s = w.step(&c, 1100);
        assert_eq!((s.completed, s.created), (2, 1), "the third and last pod starts");
        assert_eq!(w.job_status("batch", "etl"), Some(JobStatus { active: 1, succeeded: 2 }));
        for p in c.snapshot().pending().map(|p| p.key.clone()).collect::<Vec<_>>() {
            c.bind(&p, "n1").expect("bind");
        }
        w.step(&c, 1200);
        assert_eq!(w.step(&c, 1300).completed, 1);
        assert_eq!(w.job_status("batch", "etl"), Some(JobStatus { active: 0, succeeded: 3 }));
        assert_eq!(w.step(&c, 2000), WorkloadStep::default(), "done");
        assert!(c.snapshot().pods.is_empty());
    }

    #[test]
    fn pods_of_a_deleted_node_are_collected_and_replaced() {
        let c = SimCluster::new();
        c.apply_node(Node { name: "n1".into(), ..Node::default() });
        let mut w = Workloads::new();
        w.apply_deployment(deployment(2));
        w.step(&c, 0);
        for p in c.snapshot().pods.keys() {
            c.bind(p, "n1").expect("bind");
        }
        c.remove_node("n1").expect("delete");
        let s = w.step(&c, 1);
        assert_eq!((s.collected, s.created), (2, 2));
        assert_eq!(c.snapshot().pending().count(), 2);
    }

    #[test]
    fn the_registrar_registers_after_the_delay_and_only_once() {
        let c = SimCluster::new();
        let spec = dovetail_core::nodepool::NodeClaimSpec { nodepool: "default".into(), ..Default::default() };
        let claim = crate::NodeClaim {
            name: "c1".into(),
            spec,
            finalizers: Vec::new(),
            deleting: false,
            status: Default::default(),
            resource_version: 0,
            created: None,
        };
        c.create_nodeclaim_now(claim).expect("claim");
        let r = Registration {
            claim: "c1".into(),
            node_name: "ip-1".into(),
            provider_id: "aws:///us-east-1a/i-1".into(),
            labels: Default::default(),
            capacity: ResourceList::cpu_mem(2000, 8 << 30),
            allocatable: ResourceList::cpu_mem(1900, 7 << 30),
        };
        let mut reg = Registrar::new(30_000);
        assert_eq!(reg.step(&c, std::slice::from_ref(&r), 1_000), 0);
        assert_eq!(reg.step(&c, std::slice::from_ref(&r), 30_999), 0);
        assert_eq!(reg.step(&c, std::slice::from_ref(&r), 31_000), 1);
        assert_eq!(reg.step(&c, std::slice::from_ref(&r), 32_000), 0);
        assert!(c.snapshot().nodes.contains_key("ip-1"));
    }
}
