//! NodePools at run time: the controller keeps the plane's pools as the cluster's NodePools
//! and EC2NodeClasses are now. A pool added starts its actor (and the ledger takes over the
//! NodeClaims it already has), a pool changed (limits, weight, requirements, its NodeClass)
//! hands the new spec to its actor and its limits to the ledger, and a pool deleted, made
//! invalid or left without its NodeClass is no longer provisioned for: its actor keeps its
//! claims' lifecycle until the NodePool and its claims are gone. Each NodePool's status shows
//! what its nodes hold and whether it is `Ready`, with the reason when not; an invalid one also
//! gets a Warning event naming the field, once per change of the error.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use dovetail_actors::plane::Plane;
use dovetail_api::convert::{self, ConversionError};
use dovetail_api::crd;
use dovetail_cloud::aws::AwsProvider;
use dovetail_cloud::{CloudError, NodeClass};
use dovetail_cluster::kube::KubeCluster;
use dovetail_cluster::{ClusterView, ClusterWriter, Condition, Event, ObjectKind};
use dovetail_core::catalog::{Catalog, InstanceType, NodeClassSettings};
use dovetail_core::clock::Clock;
use dovetail_core::labels;
use dovetail_core::ledger::{Command, Outcome};
use dovetail_core::lifecycle::adopt::adoptions;
use dovetail_core::nodepool::NodePool;
use dovetail_core::requirements::Requirement;
use dovetail_core::resources::ResourceList;
use dovetail_raft::{Ledger, propose_now, read_with};

use super::nodeclasses::{self, Resolution};

/// Why a NodePool is not provisioned for, as its conditions say.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Unready {
    /// The NodePool itself fails validation (the error names the field).
    Invalid(ConversionError),
    /// Its EC2NodeClass does not exist.
    NodeClassNotFound(String),
    /// Its EC2NodeClass is invalid.
    NodeClassNotReady(ConversionError),
}

/// A pool as the plane runs it: what a change is told by.
#[derive(Clone, Debug, PartialEq)]
struct Running {
    pool: NodePool,
    /// The EC2NodeClass's name and generation.
    class: (String, Option<i64>),
    /// The catalog's generation its types were made from: a refreshed catalog (new prices,
    /// offerings) gives every pool new types.
    catalog: u64,
}

/// The controller's view of the pools: what runs, what is retired, what each status and event
/// last said.
pub struct Pools {
    catalog: Catalog,
    /// The generation of `catalog`, as the provider counts them (0 for a catalog that never
    /// changes, the embedded one of `--cloud sim`, and before the first sync took the
    /// provider's).
    catalog_generation: u64,
    /// With `--cloud aws`: each EC2NodeClass is resolved (subnets, security groups, AMIs)
    /// before its pools are provisioned for, as Karpenter's EC2NodeClass readiness.
    aws: Option<Arc<AwsProvider>>,
    zones: Vec<String>,
    running: BTreeMap<String, Running>,
    retired: BTreeSet<String>,
    /// The status last written per NodePool (a write that changes nothing is not made).
    written: BTreeMap<String, crd::NodePoolStatus>,
    /// The error last reported by event per NodePool.
    evented: BTreeMap<String, ConversionError>,
    /// EC2NodeClasses the cloud could not resolve (by name, with why), as of the last sync.
    unresolved: BTreeMap<String, ConversionError>,
    /// What the cloud last answered for each EC2NodeClass (its status shows it).
    resolutions: BTreeMap<String, Resolution>,
    /// When each EC2NodeClass was last resolved, and its hash then.
    resolved_at: BTreeMap<String, (String, u64)>,
    /// The status last written per EC2NodeClass.
    classes_written: BTreeMap<String, crd::EC2NodeClassStatus>,
    /// With `--cloud aws`: the zones each EC2NodeClass's subnets are in, as last resolved (its
    /// pools launch there only).
    class_zones: BTreeMap<String, BTreeSet<String>>,
}

impl Pools {
    pub fn new(catalog: Catalog, zones: Vec<String>, aws: Option<Arc<AwsProvider>>) -> Self {
        Pools {
            catalog,
            // With a provider, 0: the first sync takes the provider's catalog as it is then, so
            // a catalog read again between this one and that sync is not missed.
            catalog_generation: 0,
            aws,
            unresolved: BTreeMap::new(),
            resolutions: BTreeMap::new(),
            resolved_at: BTreeMap::new(),
            classes_written: BTreeMap::new(),
            class_zones: BTreeMap::new(),
            zones,
            running: BTreeMap::new(),
            retired: BTreeSet::new(),
            written: BTreeMap::new(),
            evented: BTreeMap::new(),
        }
    }

    /// The pools that can run now, each with its instance types and node class, and why each
    /// other NodePool cannot.
    fn desired(
        &self,
        cluster: &KubeCluster,
    ) -> (BTreeMap<String, (Running, NodeClassSettings)>, BTreeMap<String, Unready>) {
        let snap = cluster.pools_and_claims();
        let classes = cluster.nodeclasses();
        let invalid = cluster.invalid();
        let mut ok = BTreeMap::new();
        let mut not = BTreeMap::new();
        for (key, e) in &invalid {
            if let Some(name) = key.strip_prefix("NodePool ") {
                not.insert(name.to_string(), Unready::Invalid(e.clone()));
            }
        }
        for pool in snap.nodepools.values() {
            let class = &pool.node_class.name;
            let Some(nc) = classes.get(class) else {
                let bad = invalid.get(&format!("EC2NodeClass {class}"));
                let why = bad.map_or_else(
                    || Unready::NodeClassNotFound(class.clone()),
                    |e| Unready::NodeClassNotReady(e.clone()),
                );
                not.insert(pool.name.clone(), why);
                continue;
            };
            if let Some(e) = self.unresolved.get(class) {
                not.insert(pool.name.clone(), Unready::NodeClassNotReady(e.clone()));
                continue;
            }
            if self.aws.is_some() {
                // With EC2, a pool provisions once its class resolved, in its subnets' zones.
                let object = format!("EC2NodeClass {class:?}");
                let why = match self.class_zones.get(class) {
                    None => Some("not resolved yet (subnets, security groups, AMIs)".to_string()),
                    Some(z) if !z.iter().any(|z| self.zones.contains(z)) => Some(format!(
                        "its subnets are in {z:?}, none of the zones dovetail launches in ({:?})",
                        self.zones
                    )),
                    Some(_) => None,
                };
                if let Some(message) = why {
                    let e = ConversionError { object, field: "spec.subnetSelectorTerms".into(), message };
                    not.insert(pool.name.clone(), Unready::NodeClassNotReady(e));
                    continue;
                }
            }
            match convert::node_class_settings(nc) {
                Ok(settings) => {
                    let mut zoned = pool.as_ref().clone();
                    if let Some(zones) = self.class_zones.get(class) {
                        zoned.requirements.add(labels::ZONE, Requirement::is_in(zones.iter().map(String::as_str)));
                    }
                    let running = Running {
                        pool: zoned,
                        class: (class.clone(), nc.metadata.generation),
                        catalog: self.catalog_generation,
                    };
                    ok.insert(pool.name.clone(), (running, settings));
                }
                Err(e) => {
                    not.insert(pool.name.clone(), Unready::NodeClassNotReady(e));
                }
            }
        }
        (ok, not)
    }

    /// Brings the plane's pools to the cluster's: starts, changes and retires actors, sets the
    /// ledger's limits, takes over a new pool's NodeClaims, stops what is gone for good.
    pub async fn sync(&mut self, cluster: &KubeCluster, plane: &mut Plane, ledger: &dyn Ledger, clock: &dyn Clock) {
        // Resolving may write (the instance profile managed for a role): the leader's to do;
        // a follower keeps the last answer.
        let leadership = ledger.leadership().borrow().clone();
        let current = {
            let watch = ledger.leadership();
            move || watch.borrow().is_current(leadership.term)
        };
        if leadership.leader {
            self.resolve_classes(cluster, clock.now_millis(), &current).await;
        }
        self.take_fresh_catalog().await;
        let (desired, _) = self.desired(cluster);
        let now = clock.now_millis();
        for (name, (running, settings)) in &desired {
            if self.running.get(name) == Some(running) {
                continue;
            }
            let set = Command::SetPool { pool: name.clone(), limits: running.pool.limits.clone() };
            if let Err(e) = propose_now(ledger, now, set).await {
                plane.errors.warn("set_pool", "ledger", &format!("nodepool/{name}"), &e);
                continue;
            }
            // The budgets the ledger checks disruption commands against.
            let disruption = &running.pool.disruption;
            let budgets =
                Command::SetBudgets { pool: name.clone(), budgets: disruption.budgets.clone(), rate: disruption.rate };
            if let Err(e) = propose_now(ledger, now, budgets).await {
                plane.errors.warn("set_budgets", "ledger", &format!("nodepool/{name}"), &e);
                continue;
            }
            let types: Arc<Vec<InstanceType>> = Arc::new(self.catalog.instance_types(settings, Some(&self.zones)));
            let (class, generation) = &running.class;
            let hash = generation.map_or_else(|| class.clone(), |g| format!("{class}-{g}"));
            let node_class = cluster.nodeclasses().get(class).map_or_else(
                || NodeClass { name: class.clone(), hash, ..NodeClass::default() },
                |nc| super::aws::node_class(class, nc),
            );
            let started = !self.running.contains_key(name) && !self.retired.contains(name);
            if started && !adopt(cluster, ledger, name, now, &plane.errors).await {
                // Started at the next sync, once the ledger took its claims over.
                continue;
            }
            tracing::info!(nodepool = %name, types = types.len(), started, "NodePool {name} provisioned for");
            plane.set_pool(running.pool.clone(), types, node_class);
            self.retired.remove(name);
            self.running.insert(name.clone(), running.clone());
        }
        let gone: Vec<String> = self.running.keys().filter(|n| !desired.contains_key(*n)).cloned().collect();
        for name in gone {
            tracing::info!(nodepool = %name, "NodePool {name} no longer provisioned for");
            plane.retire_pool(&name);
            self.running.remove(&name);
            self.retired.insert(name);
        }
        self.keep_orphans(cluster, plane, ledger, now).await;
        self.stop_finished(cluster, plane, ledger, now).await;
    }

    /// Takes the provider's catalog when it was read again since this one (a refresh of
    /// prices or offerings): the next pass gives every pool types made from it. The provider
    /// holds it already, so this waits for no EC2 call.
    async fn take_fresh_catalog(&mut self) {
        let Some(aws) = &self.aws else { return };
        let generation = aws.catalog_generation();
        if generation == self.catalog_generation {
            return;
        }
        match aws.catalog().await {
            Ok(catalog) => {
                tracing::info!(
                    generation,
                    types = catalog.instance_types.len(),
                    "cloud.catalog: the NodePools take the catalog read again"
                );
                self.catalog = catalog;
                self.catalog_generation = generation;
            }
            Err(e) => tracing::warn!(error = %e, "cloud.catalog: the catalog read again could not be taken"),
        }
    }

    /// With `--cloud aws`, resolves every EC2NodeClass (the provider caches what it found for
    /// a while): one whose subnets, security groups or AMIs cannot be found, or that asks for
    /// what is not supported, keeps its pools from being provisioned for, and their status says
    /// why. A cloud that cannot be reached changes nothing (the last answer stands).
    async fn resolve_classes(&mut self, cluster: &KubeCluster, now: u64, current: &(dyn Fn() -> bool + Send + Sync)) {
        const RETRY_UNRESOLVED_MS: u64 = 30_000;
        let Some(aws) = self.aws.clone() else { return };
        let classes = cluster.nodeclasses();
        self.unresolved.retain(|name, _| classes.contains_key(name));
        self.resolutions.retain(|name, _| classes.contains_key(name));
        self.resolved_at.retain(|name, _| classes.contains_key(name));
        self.class_zones.retain(|name, _| classes.contains_key(name));
        for (name, nc) in classes.iter() {
            let class = super::aws::node_class(name, nc);
            // One that failed is asked again after a while or once it changed (one that
            // resolved is the provider's to cache).
            if let Some((hash, at)) = self.resolved_at.get(name)
                && self.unresolved.contains_key(name)
                && *hash == class.hash
                && now.saturating_sub(*at) < RETRY_UNRESOLVED_MS
            {
                continue;
            }
            // Resolving may write (the instance profile): only in the term read.
            if !current() {
                return;
            }
            self.resolved_at.insert(name.clone(), (class.hash.clone(), now));
            let object = format!("EC2NodeClass {name:?}");
            let resolved = tokio::time::timeout(std::time::Duration::from_secs(20), aws.resolve_status(&class)).await;
            let Ok(resolved) = resolved else {
                tracing::warn!(ec2nodeclass = %name, "EC2NodeClass {name}: resolving it took over 20 s; asked again later");
                continue;
            };
            let resolution = match resolved {
                Ok((r, unmet)) => Resolution::Parts(r, unmet),
                Err(CloudError::Invalid { what, reason }) => {
                    Resolution::Refused(ConversionError { object: object.clone(), field: what, message: reason })
                }
                Err(CloudError::NodeClassNotReady { reason, .. }) => Resolution::Refused(ConversionError {
                    object: object.clone(),
                    field: "spec".into(),
                    message: reason,
                }),
                Err(e) => {
                    tracing::warn!(ec2nodeclass = %name, error = %e, "EC2NodeClass {name} could not be resolved now");
                    continue;
                }
            };
            match resolution.unready(&object) {
                Some(e) => {
                    self.unresolved.insert(name.clone(), e);
                }
                None => {
                    self.unresolved.remove(name);
                    if let Resolution::Parts(r, _) = &resolution {
                        let zones: BTreeSet<String> = r.subnets.iter().map(|(_, zone)| zone.clone()).collect();
                        self.class_zones.insert(name.clone(), zones);
                    }
                }
            }
            self.resolutions.insert(name.clone(), resolution);
        }
    }

    /// NodeClaims whose NodePool does not run (missing, or invalid, or without its NodeClass
    /// since the controller started) still need their lifecycle: registration, and the drain
    /// and finalizer when they are deleted. Their pool gets a retired actor and the ledger
    /// takes the claims over; [`Pools::stop_finished`] ends it once they are gone.
    async fn keep_orphans(&mut self, cluster: &KubeCluster, plane: &mut Plane, ledger: &dyn Ledger, now: u64) {
        let snap = cluster.pools_and_claims();
        let orphans: BTreeSet<String> = snap
            .nodeclaims
            .values()
            .map(|nc| nc.spec.nodepool.clone())
            .filter(|p| !p.is_empty() && !self.running.contains_key(p) && !self.retired.contains(p))
            .collect();
        for name in orphans {
            let known = match read_with(ledger, {
                let name = name.clone();
                move |st| st.pools().contains_key(&name)
            })
            .await
            {
                Ok(k) => k,
                Err(e) => {
                    plane.errors.warn("keep_pool", "ledger", &format!("nodepool/{name}"), &e);
                    continue;
                }
            };
            if !known {
                // No limits: nothing is provisioned for it, it only holds what it has.
                let set = Command::SetPool { pool: name.clone(), limits: ResourceList::new() };
                if let Err(e) = propose_now(ledger, now, set).await {
                    plane.errors.warn("keep_pool", "ledger", &format!("nodepool/{name}"), &e);
                    continue;
                }
            }
            if !adopt(cluster, ledger, &name, now, &plane.errors).await {
                // Asked again at the next sync: a pool marked kept would not be.
                continue;
            }
            tracing::info!(nodepool = %name, "NodeClaims of NodePool {name}, which is not provisioned for: their lifecycle goes on");
            plane.keep_pool(&name);
            self.retired.insert(name);
        }
    }

    /// Stops the retired pools whose NodePool is deleted and whose claims are all gone, from
    /// the ledger and from the cluster.
    async fn stop_finished(&mut self, cluster: &KubeCluster, plane: &mut Plane, ledger: &dyn Ledger, now: u64) {
        if self.retired.is_empty() {
            return;
        }
        let snap = cluster.pools_and_claims();
        let invalid = cluster.invalid();
        let with_claims: BTreeSet<String> =
            match read_with(ledger, |st| st.claims().values().map(|c| c.pool.clone()).collect::<BTreeSet<String>>())
                .await
            {
                Ok(p) => p,
                Err(e) => {
                    plane.errors.warn("stop_pool", "ledger", "nodepools", &e);
                    return;
                }
            };
        // Its NodeClaims gone from the cluster too: one the ledger let go of may still carry
        // its finalizer, which only its pool's actor takes off.
        let in_cluster: BTreeSet<&str> = snap.nodeclaims.values().map(|nc| nc.spec.nodepool.as_str()).collect();
        let finished: Vec<String> = self
            .retired
            .iter()
            .filter(|n| {
                !snap.nodepools.contains_key(*n)
                    && !invalid.contains_key(&format!("NodePool {n}"))
                    && !with_claims.contains(*n)
                    && !in_cluster.contains(n.as_str())
            })
            .cloned()
            .collect();
        for name in finished {
            match propose_now(ledger, now, Command::RemovePool { pool: name.clone() }).await {
                Ok(c) if matches!(c.outcome, Outcome::Done) => {
                    tracing::info!(nodepool = %name, "NodePool {name} and its claims gone: its actor stops");
                    plane.stop_pool(&name);
                    self.retired.remove(&name);
                    self.written.remove(&name);
                }
                Ok(c) => {
                    plane.errors.note("stop_pool", "rejected", &format!("nodepool/{name}"), &format!("{:?}", c.outcome))
                }
                Err(e) => plane.errors.warn("stop_pool", "ledger", &format!("nodepool/{name}"), &e),
            }
        }
    }

    /// Writes each NodePool's status where it changed, and an event per new error of an
    /// invalid one. Only the leader writes (a follower's plane is not the one deciding), and
    /// only in the term it read: the term is checked before every write, as the executor does.
    /// (These report what the cluster shows; they decide nothing the ledger would record.)
    pub async fn report(&mut self, cluster: &KubeCluster, plane: &Plane, ledger: &dyn Ledger, clock: &dyn Clock) {
        let term = {
            let l = ledger.leadership().borrow().clone();
            if !l.leader {
                return;
            }
            l.term
        };
        let current = || ledger.leadership().borrow().is_current(term);
        let (desired, not_ready) = self.desired(cluster);
        let snap = cluster.pools_and_claims();
        let mut held: BTreeMap<&str, (ResourceList, i64)> = BTreeMap::new();
        for nc in snap.nodeclaims.values().filter(|nc| !nc.status.capacity.is_empty()) {
            let (res, nodes) = held.entry(nc.spec.nodepool.as_str()).or_default();
            res.add(&nc.status.capacity);
            *nodes += 1;
        }
        let now = dovetail_cluster::kube::rfc3339(clock.now_millis());
        let names: BTreeSet<&String> = desired.keys().chain(not_ready.keys()).collect();
        for name in names {
            let conditions = conditions(not_ready.get(name));
            let (res, nodes) = held.get(name.as_str()).cloned().unwrap_or_default();
            // What was written, or after a restart what the NodePool carries: a condition
            // keeps its transition time while its status holds, and an unchanged status is
            // not written again.
            let before = self.written.get(name).cloned().or_else(|| cluster.nodepool_status(name));
            let previous = before.as_ref().and_then(|s| s.conditions.clone()).unwrap_or_default();
            let status = convert::nodepool_status_object(&res, nodes, &conditions, &previous, &now);
            if before.as_ref() == Some(&status) {
                self.written.insert(name.clone(), status);
                continue;
            }
            if !current() {
                return;
            }
            match cluster.patch_nodepool_status(name, &status).await {
                Ok(_) => {
                    self.written.insert(name.clone(), status);
                }
                Err(e) => plane.errors.warn("nodepool_status", e.kind(), &format!("nodepool/{name}"), &e),
            }
        }
        self.written.retain(|n, _| desired.contains_key(n) || not_ready.contains_key(n));
        for (name, why) in &not_ready {
            let Unready::Invalid(e) = why else { continue };
            if self.evented.get(name) == Some(e) {
                continue;
            }
            if !current() {
                return;
            }
            let event = Event {
                kind: ObjectKind::NodePool,
                name: name.clone(),
                warning: true,
                reason: "NodePoolValidationFailed".into(),
                message: format!("{}: {}", e.field, e.message),
            };
            match cluster.record_event(event).await {
                Ok(()) => {
                    self.evented.insert(name.clone(), e.clone());
                }
                Err(err) => plane.errors.warn("event", err.kind(), &format!("nodepool/{name}"), &err),
            }
        }
        self.evented.retain(|n, _| matches!(not_ready.get(n), Some(Unready::Invalid(_))));
        self.report_classes(cluster, plane, &current, &now).await;
    }

    /// Writes each EC2NodeClass's status where it changed, as Karpenter shows it (`kubectl get
    /// ec2nodeclasses` reads `Ready`): `ValidationSucceeded` (False naming the field of a rule
    /// it breaks), with `--cloud aws` what its selector terms resolved to and a condition per
    /// part (subnets, security groups, AMIs, instance profile), and `Ready` (False with why).
    async fn report_classes(&mut self, cluster: &KubeCluster, plane: &Plane, current: &dyn Fn() -> bool, now: &str) {
        let classes = cluster.nodeclasses();
        let invalid = cluster.invalid();
        let mut names: BTreeSet<String> = classes.keys().cloned().collect();
        names.extend(invalid.keys().filter_map(|k| k.strip_prefix("EC2NodeClass ")).map(str::to_string));
        for name in &names {
            let bad = invalid.get(&format!("EC2NodeClass {name}"));
            // What was written, or after a restart what the class shows (an invalid one too).
            let before = self.classes_written.get(name).cloned().or_else(|| cluster.nodeclass_status(name));
            let previous = before.as_ref().and_then(|s| s.conditions.clone()).unwrap_or_default();
            let status = nodeclasses::status(self.resolutions.get(name), bad, &previous, now);
            if before.as_ref() == Some(&status) {
                self.classes_written.insert(name.clone(), status);
                continue;
            }
            if !current() {
                return;
            }
            match cluster.patch_nodeclass_status(name, &status).await {
                Ok(_) => {
                    self.classes_written.insert(name.clone(), status);
                }
                Err(e) => plane.errors.warn("nodeclass_status", e.kind(), &format!("ec2nodeclass/{name}"), &e),
            }
        }
        self.classes_written.retain(|n, _| names.contains(n));
    }
}

/// A NodePool's conditions: `ValidationSucceeded`, `NodeClassReady` and `Ready` (both), each
/// false with Karpenter's reason and a message naming what is wrong.
fn conditions(why: Option<&Unready>) -> Vec<Condition> {
    let met = |kind: &str| Condition::met(kind);
    let unmet = |kind: &str, reason: &str, message: String| Condition {
        kind: kind.into(),
        status: false,
        reason: reason.into(),
        message,
    };
    let (validation, class) = match why {
        None => (met("ValidationSucceeded"), met("NodeClassReady")),
        Some(Unready::Invalid(e)) => (
            unmet("ValidationSucceeded", "NodePoolValidationFailed", format!("{}: {}", e.field, e.message)),
            met("NodeClassReady"),
        ),
        Some(Unready::NodeClassNotFound(c)) => (
            met("ValidationSucceeded"),
            unmet("NodeClassReady", "NodeClassNotFound", format!("EC2NodeClass {c} not found on the cluster")),
        ),
        Some(Unready::NodeClassNotReady(e)) => (
            met("ValidationSucceeded"),
            unmet("NodeClassReady", "NodeClassNotReady", format!("{}: {}: {}", e.object, e.field, e.message)),
        ),
    };
    let ready = match [&validation, &class].into_iter().find(|c| !c.status) {
        None => met("Ready"),
        Some(c) => unmet("Ready", &c.reason, c.message.clone()),
    };
    vec![class, ready, validation]
}

/// The ledger takes over the NodeClaims a pool starting now already has (a restart, or a
/// NodePool that was invalid and is valid again); whether the ledger answered (claims it
/// refused are logged: they are another's or already known).
async fn adopt(
    cluster: &KubeCluster,
    ledger: &dyn Ledger,
    pool: &str,
    now: u64,
    errors: &dovetail_actors::errors::Errors,
) -> bool {
    let known: BTreeSet<String> = match read_with(ledger, |st| st.claims().keys().cloned().collect()).await {
        Ok(k) => k,
        Err(e) => {
            errors.warn("adopt", "ledger", &format!("nodepool/{pool}"), &e);
            return false;
        }
    };
    let claims = adoptions(&cluster.snapshot(), &known, &BTreeSet::from([pool.to_string()]), now);
    if claims.is_empty() {
        return true;
    }
    tracing::info!(nodepool = %pool, claims = claims.len(), "taking over the NodeClaims the cluster shows");
    match propose_now(ledger, now, Command::Adopt { claims }).await {
        Ok(c) => match c.outcome {
            Outcome::Reserved { granted, denied } => {
                for (claim, why) in &denied {
                    tracing::warn!(nodeclaim = %claim, denial = ?why, "NodeClaim {claim} not taken over: {why:?}");
                }
                tracing::info!(nodepool = %pool, taken = granted.len(), refused = denied.len(), "NodeClaims taken over");
                true
            }
            other => {
                errors.warn("adopt", "rejected", &format!("nodepool/{pool}"), &format!("{other:?}"));
                false
            }
        },
        Err(e) => {
            errors.warn("adopt", "ledger", &format!("nodepool/{pool}"), &e);
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn error(field: &str) -> ConversionError {
        ConversionError { object: "NodePool \"bad\"".into(), field: field.into(), message: "is wrong".into() }
    }

    #[test]
    fn a_ready_nodepool_is_ready_on_every_count() {
        let c = conditions(None);
        assert!(c.iter().all(|c| c.status), "{c:?}");
        let kinds: Vec<&str> = c.iter().map(|c| c.kind.as_str()).collect();
        assert_eq!(kinds, ["NodeClassReady", "Ready", "ValidationSucceeded"]);
    }

    #[test]
    fn ready_carries_the_reason_and_the_field_of_what_is_wrong() {
        let c = conditions(Some(&Unready::Invalid(error("spec.template.spec.requirements[0].operator"))));
        let ready = c.iter().find(|c| c.kind == "Ready").expect("Ready");
        assert!(!ready.status);
        assert_eq!(ready.reason, "NodePoolValidationFailed");
        assert!(ready.message.contains("spec.template.spec.requirements[0].operator"), "{}", ready.message);
        let c = conditions(Some(&Unready::NodeClassNotFound("default".into())));
        let ready = c.iter().find(|c| c.kind == "Ready").expect("Ready");
        assert_eq!((ready.status, ready.reason.as_str()), (false, "NodeClassNotFound"));
        assert!(c.iter().any(|c| c.kind == "ValidationSucceeded" && c.status), "the pool itself is valid");
    }
}
