//! The AWS provider: EC2 through aws-sdk-ec2 (CreateFleet `instant`), interruption events
//! through aws-sdk-sqs. Configured as a user would (region, credential chain, endpoint
//! override), so moto and a real account differ only in configuration.

mod catalog;
mod errors;
mod fleet;
mod nodeclass;
mod profile;
mod queue;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use dovetail_core::clock::Clock;

use aws_config::BehaviorVersion;
use aws_config::retry::RetryConfig;
use aws_credential_types::Credentials;
use aws_sdk_ec2::Client;
use aws_sdk_ec2::types::{Filter, InstanceLifecycleType, InstanceStateName};
use aws_smithy_http_client::tls;
use dovetail_core::catalog::{CapacityType, Catalog, InstanceType, NodeClassSettings};

pub use catalog::SpotPrices;
pub use errors::{CAPACITY_CODES, THROTTLE_RETRY_AFTER};
pub use nodeclass::{AmiParameters, Names, Resolved, Unmet, alias_parameter};
pub use profile::{profile_name, profile_path, role_name};
pub use queue::SqsQueue;

use crate::types::type_labels;
use crate::{
    BoxFuture, CloudError, CloudProvider, DriftReason, Instance, InstanceState, LaunchRequest, Lookup, NodeClass,
    TAG_CLUSTER_PREFIX, TAG_NODECLAIM, TAG_NODEPOOL,
};
use errors::from_sdk;

/// The most values one filter of `AwsProvider::describe` may carry: EC2 takes at most 200
/// filter values a call, and `describe` adds six of its own (the cluster tag, five states).
pub(super) const DESCRIBE_IDS_MAX: usize = 200 - 6;

/// Tag with the node class name.
pub const TAG_NODECLASS: &str = "karpenter.k8s.aws/ec2nodeclass";
/// Tag with the hash of the node class spec an instance was launched with (drift).
pub const TAG_NODECLASS_HASH: &str = "dovetail.dev/ec2nodeclass-hash";

/// Static credentials (tests and emulators); `None` in [`AwsConfig`] uses the default chain
/// (environment, profile, web identity, IMDS).
#[derive(Clone, Debug)]
pub struct StaticCredentials {
    pub access_key_id: String,
    pub secret_access_key: String,
}

/// How the provider reaches AWS and what it launches for.
#[derive(Clone, Debug)]
pub struct AwsConfig {
    /// Cluster name: the `kubernetes.io/cluster/<name>` tag and the launch template prefix.
    pub cluster: String,
    /// Region; `None` reads it from the environment or profile (`AWS_REGION`).
    pub region: Option<String>,
    /// Endpoint override (an emulator, a VPC endpoint); `AWS_ENDPOINT_URL` works too.
    pub endpoint: Option<String>,
    pub credentials: Option<StaticCredentials>,
    pub spot_prices: SpotPrices,
    /// How often spot prices are read again (with `SpotPrices::History`; Karpenter: 12 h).
    pub price_refresh: Duration,
    /// How often the instance types, their zones and the zones themselves are read again
    /// (Karpenter: 12 h): a type EC2 starts offering in a zone, or stops, is seen then.
    pub catalog_refresh: Duration,
    /// How long a node class's subnets, security groups and AMIs are reused.
    pub resolve_ttl: Duration,
    /// The cluster's API server endpoint and CA (base64), for the nodes' user data.
    pub cluster_endpoint: String,
    pub cluster_ca: String,
    /// At most this many (cheapest) instance types per CreateFleet call (Karpenter: 60).
    pub max_fleet_types: usize,
    /// CreateTags calls in flight at once when a merged call tags its instances per claim.
    pub tag_concurrency: usize,
    /// The cluster's Kubernetes minor version, for alias AMIs (`1.33`).
    pub kubernetes_version: String,
    /// Where alias AMIs' SSM parameters live (`/aws/service/eks/optimized-ami`).
    pub ami_parameter_prefix: String,
}

impl Default for AwsConfig {
    fn default() -> Self {
        AwsConfig {
            cluster: "dovetail".into(),
            region: None,
            endpoint: None,
            credentials: None,
            spot_prices: SpotPrices::History,
            price_refresh: Duration::from_secs(12 * 3600),
            catalog_refresh: Duration::from_secs(12 * 3600),
            resolve_ttl: Duration::from_secs(300),
            cluster_endpoint: String::new(),
            cluster_ca: String::new(),
            max_fleet_types: 60,
            tag_concurrency: 8,
            kubernetes_version: "1.33".into(),
            ami_parameter_prefix: "/aws/service/eks/optimized-ami".into(),
        }
    }
}

impl AwsConfig {
    /// Checks the settings; the error names the one that cannot work.
    pub fn validate(&self) -> Result<(), CloudError> {
        let bad = |what: &str, reason: &str| Err(CloudError::Invalid { what: what.into(), reason: reason.into() });
        if self.cluster.is_empty() {
            return bad("cluster", "the cluster name tags every instance: it cannot be empty");
        }
        if !(1..=150).contains(&self.max_fleet_types) {
            return bad("max_fleet_types", "CreateFleet takes 1 to 150 overrides (Karpenter sends 60)");
        }
        if self.tag_concurrency == 0 {
            return bad("tag_concurrency", "must be positive");
        }
        if self.resolve_ttl.is_zero() || self.price_refresh.is_zero() || self.catalog_refresh.is_zero() {
            return bad("resolve_ttl/price_refresh/catalog_refresh", "must be positive");
        }
        Ok(())
    }
}

/// The SDK configuration every client of the provider shares: rustls (ring) over hyper, the
/// SDK's own retries off (callers retry on [`CloudError`]s).
pub async fn sdk_config(cfg: &AwsConfig) -> aws_config::SdkConfig {
    let http = aws_smithy_http_client::Builder::new()
        .tls_provider(tls::Provider::Rustls(tls::rustls_provider::CryptoMode::Ring))
        .build_https();
    let mut loader = aws_config::defaults(BehaviorVersion::latest())
        .http_client(http)
        .retry_config(RetryConfig::standard().with_max_attempts(1));
    if let Some(region) = &cfg.region {
        loader = loader.region(aws_config::Region::new(region.clone()));
    }
    if let Some(endpoint) = &cfg.endpoint {
        loader = loader.endpoint_url(endpoint);
    }
    if let Some(c) = &cfg.credentials {
        loader = loader.credentials_provider(Credentials::new(
            &c.access_key_id,
            &c.secret_access_key,
            None,
            None,
            "dovetail-static",
        ));
    }
    loader.load().await
}

/// The catalog as the provider uses it: the region's facts and every type resolved.
struct Types {
    catalog: Catalog,
    by_name: HashMap<String, InstanceType>,
    /// When its types and offerings were read, and its spot prices, on the provider's clock.
    loaded: Duration,
    priced: Duration,
    /// Counts the reads: 1 for the first, one more at each refresh.
    generation: u64,
}

impl Types {
    fn new(catalog: Catalog, loaded: Duration, priced: Duration, generation: u64) -> Self {
        let by_name = catalog
            .instance_types(&NodeClassSettings::default(), None)
            .into_iter()
            .map(|t| (t.name.clone(), t))
            .collect();
        Types { catalog, by_name, loaded, priced, generation }
    }
}

#[derive(Default)]
struct Caches {
    resolved: HashMap<(String, String), (Arc<Resolved>, Duration)>,
    /// Launch template names by content key.
    templates: HashMap<String, String>,
}

/// Counters of the EC2 calls made (merging is measured with them).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AwsStats {
    pub fleet_calls: u64,
    pub create_tags_calls: u64,
    /// CreateTags calls that failed (the instance's batch tag still finds it).
    pub tag_errors: u64,
    /// Instances a re-drive assigned to a claim from its batch's untagged ones.
    pub adopted: u64,
    pub describe_instances_calls: u64,
    pub terminate_calls: u64,
}

/// The EC2 provider.
pub struct AwsProvider {
    cfg: AwsConfig,
    ec2: Client,
    ssm: aws_sdk_ssm::Client,
    iam: aws_sdk_iam::Client,
    /// The SDK configuration its clients share (the interruption queues' too).
    sdk: aws_config::SdkConfig,
    amis: AmiParameters,
    region: String,
    types: tokio::sync::Mutex<Option<Arc<Types>>>,
    /// The catalog's generation, readable without the lock ([`AwsProvider::catalog_generation`]).
    generation: std::sync::atomic::AtomicU64,
    caches: Mutex<Caches>,
    stats: Mutex<AwsStats>,
    clock: Arc<dyn Clock>,
}

impl AwsProvider {
    /// A provider on the SDK configuration `cfg` describes; cache ages and launch times are
    /// read from `clock`.
    pub async fn connect(cfg: AwsConfig, clock: Arc<dyn Clock>) -> Result<Self, CloudError> {
        cfg.validate()?;
        let sdk = sdk_config(&cfg).await;
        let region = sdk.region().map(ToString::to_string).ok_or_else(|| CloudError::Invalid {
            what: "AWS region".into(),
            reason: "set it in the configuration, AWS_REGION or the profile".into(),
        })?;
        Ok(AwsProvider {
            ec2: Client::new(&sdk),
            ssm: aws_sdk_ssm::Client::new(&sdk),
            iam: aws_sdk_iam::Client::new(&sdk),
            amis: AmiParameters {
                kubernetes_version: cfg.kubernetes_version.clone(),
                prefix: cfg.ami_parameter_prefix.clone(),
            },
            region,
            sdk,
            cfg,
            types: tokio::sync::Mutex::new(None),
            generation: std::sync::atomic::AtomicU64::new(0),
            caches: Mutex::new(Caches::default()),
            stats: Mutex::new(AwsStats::default()),
            clock,
        })
    }

    /// The SQS queue named `name` (Karpenter's `interruptionQueue`), on the provider's
    /// configuration (region, endpoint, credentials).
    pub async fn interruption_queue(&self, name: &str) -> Result<queue::SqsQueue, CloudError> {
        queue::SqsQueue::named(&self.sdk, name).await
    }

    /// Uses `catalog` instead of reading it from EC2 (an offline catalog, or a test's shared
    /// one); it is read again from EC2 when a refresh is due ([`AwsProvider::refresh_if_due`]).
    pub async fn with_catalog(self, catalog: Catalog) -> Self {
        let now = self.clock.now();
        *self.types.lock().await = Some(Arc::new(Types::new(catalog, now, now, 1)));
        self.generation.store(1, std::sync::atomic::Ordering::Release);
        self
    }

    /// The region's catalog as the provider reads it (loading it if it has not yet).
    pub async fn catalog(&self) -> Result<Catalog, CloudError> {
        Ok(self.types().await?.catalog.clone())
    }

    /// How many times the catalog was read (0 before the first): a caller that keeps types
    /// made from it compares this to know when to make them again.
    pub fn catalog_generation(&self) -> u64 {
        self.generation.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Reads the catalog again when its time is due: the types, their zones and offerings
    /// every `catalog_refresh`, the spot prices every `price_refresh` (with
    /// `SpotPrices::History`). The calls are made without holding the catalog, so launches
    /// go on with the one they have meanwhile; a refresh that fails keeps it (the error is
    /// returned, and the refresh asked again at the next call). Whether anything was read.
    pub async fn refresh_if_due(&self) -> Result<bool, CloudError> {
        let current = self.types().await?;
        let now = self.clock.now();
        let fresh = if now.saturating_sub(current.loaded) >= self.cfg.catalog_refresh {
            let catalog = catalog::load(&self.ec2, &self.region, self.cfg.spot_prices).await?;
            Types::new(catalog, now, now, current.generation + 1)
        } else if self.cfg.spot_prices == SpotPrices::History
            && now.saturating_sub(current.priced) >= self.cfg.price_refresh
        {
            let mut catalog = current.catalog.clone();
            let spot = catalog::spot_history(&self.ec2).await?;
            for info in &mut catalog.instance_types {
                info.spot_price = spot.get(&info.name).copied();
            }
            Types::new(catalog, current.loaded, now, current.generation + 1)
        } else {
            return Ok(false);
        };
        let generation = fresh.generation;
        let mut slot = self.types.lock().await;
        // Another refresh got there first: its answer stands.
        if slot.as_ref().is_some_and(|t| t.generation >= generation) {
            return Ok(false);
        }
        *slot = Some(Arc::new(fresh));
        self.generation.store(generation, std::sync::atomic::Ordering::Release);
        Ok(true)
    }

    /// The EC2 client (for callers that set up what the provider only reads).
    pub fn ec2(&self) -> &Client {
        &self.ec2
    }

    pub fn region(&self) -> &str {
        &self.region
    }

    /// EC2 calls made so far.
    pub fn stats(&self) -> AwsStats {
        lock(&self.stats).clone()
    }

    fn count(&self, f: impl FnOnce(&mut AwsStats)) {
        f(&mut lock(&self.stats));
    }

    /// The region's catalog, read once; [`AwsProvider::refresh_if_due`] reads it again on the
    /// provider's cadence (never a launch: it would wait for the reads).
    async fn types(&self) -> Result<Arc<Types>, CloudError> {
        let mut slot = self.types.lock().await;
        if let Some(t) = slot.as_ref() {
            return Ok(t.clone());
        }
        let catalog = catalog::load(&self.ec2, &self.region, self.cfg.spot_prices).await?;
        let now = self.clock.now();
        let fresh = Arc::new(Types::new(catalog, now, now, 1));
        *slot = Some(fresh.clone());
        self.generation.store(1, std::sync::atomic::Ordering::Release);
        Ok(fresh)
    }

    /// What a control node that does not lead does ahead of leading: reads the node class's
    /// subnets, security groups and images, and its instance profile when it exists with the
    /// role on it, and caches them as [`AwsProvider::resolve`] would (for `resolve_ttl`), so a
    /// new leader's first decisions wait for none of these calls. Only reads: a profile that is
    /// missing or has another role is left for the leader to make or mend, and nothing is
    /// cached for that class. Whether the class is cached now.
    pub async fn warm(&self, nc: &NodeClass) -> Result<bool, CloudError> {
        let key = (nc.name.clone(), nc.hash.clone());
        if let Some((_, at)) = lock(&self.caches).resolved.get(&key)
            && self.clock.now().saturating_sub(*at) < self.cfg.resolve_ttl / 2
        {
            return Ok(true);
        }
        let mut r = nodeclass::resolve(&self.ec2, &self.ssm, &self.amis, nc).await?;
        if let (None, Some(role)) = (&r.instance_profile, &nc.role) {
            let name = profile::profile_name(&self.cfg.cluster, &self.region, &nc.name);
            let wanted = profile::role_name(role);
            match profile::roles_of(&self.iam, &name).await? {
                Some(roles) if roles.iter().any(|r| r.eq_ignore_ascii_case(wanted)) => r.instance_profile = Some(name),
                _ => return Ok(false),
            }
        }
        lock(&self.caches).resolved.insert(key, (Arc::new(r), self.clock.now()));
        Ok(true)
    }

    /// The node class's subnets, security groups and images (cached for `resolve_ttl`); the
    /// first part not found is `NodeClassNotReady`.
    pub async fn resolve(&self, nc: &NodeClass) -> Result<Arc<Resolved>, CloudError> {
        let (r, unmet) = self.resolve_status(nc).await?;
        match unmet.first() {
            Some(u) => Err(u.error(&nc.name)),
            None => Ok(r),
        }
    }

    /// Each part of the node class resolved on its own, as its status shows them: what was
    /// found, and each part that found nothing (subnets, security groups, AMIs, the instance
    /// profile of `spec.role`, which is made when missing). A class whose every part resolved
    /// is cached for `resolve_ttl`, so the status is re-resolved on that period. An error is
    /// a call that failed or a spec that cannot work.
    pub async fn resolve_status(&self, nc: &NodeClass) -> Result<(Arc<Resolved>, Vec<nodeclass::Unmet>), CloudError> {
        let key = (nc.name.clone(), nc.hash.clone());
        if let Some((r, at)) = lock(&self.caches).resolved.get(&key)
            && self.clock.now().saturating_sub(*at) < self.cfg.resolve_ttl
        {
            return Ok((r.clone(), Vec::new()));
        }
        let (mut r, mut unmet) = nodeclass::resolve_parts(&self.ec2, &self.ssm, &self.amis, nc).await?;
        if let (None, Some(role)) = (&r.instance_profile, &nc.role) {
            match profile::ensure(&self.iam, (&self.cfg.cluster, &self.region), &nc.name, role).await {
                Ok(name) => r.instance_profile = Some(name),
                Err(CloudError::NodeClassNotReady { reason, .. }) => unmet.push(nodeclass::Unmet {
                    condition: "InstanceProfileReady",
                    reason: "NodeRoleNotFound",
                    message: reason,
                }),
                Err(e) => return Err(e),
            }
        }
        let r = Arc::new(r);
        if unmet.is_empty() {
            lock(&self.caches).resolved.insert(key, (r.clone(), self.clock.now()));
        }
        Ok((r, unmet))
    }

    /// Deletes the instance profiles managed for node classes not in `keep` (the classes that
    /// exist or that a NodeClaim still names); the names deleted.
    /// `current` is checked before each deletion (the caller's term).
    pub async fn collect_instance_profiles(
        &self,
        keep: &std::collections::BTreeSet<String>,
        current: &(dyn Fn() -> bool + Send + Sync),
    ) -> Result<Vec<String>, CloudError> {
        self.retain_classes(keep);
        profile::collect(&self.iam, (&self.cfg.cluster, &self.region), keep, current).await
    }

    /// Forgets what is cached of the node classes not in `keep` (it names their instance
    /// profile, which the leader's garbage collection deletes), so a class made again under
    /// the same name resolves afresh. The leader does it when it collects profiles; a
    /// follower reading ahead, every round.
    pub fn retain_classes(&self, keep: &std::collections::BTreeSet<String>) {
        lock(&self.caches).resolved.retain(|(class, _), _| keep.contains(class));
    }

    /// The launch template for an image and the node class's security groups.
    async fn template(&self, r: &LaunchRequest, resolved: &Resolved, image: &str) -> Result<String, CloudError> {
        let user_data =
            nodeclass::user_data(&self.cfg.cluster, &self.cfg.cluster_endpoint, &self.cfg.cluster_ca, &r.labels);
        let spec = nodeclass::TemplateSpec {
            image,
            security_groups: &resolved.security_groups,
            user_data: &user_data,
            instance_profile: resolved.instance_profile.as_deref(),
        };
        let key = format!("{:016x}", spec.hash());
        if let Some(name) = lock(&self.caches).templates.get(&key) {
            return Ok(name.clone());
        }
        let name = nodeclass::launch_template(&self.ec2, &self.cfg.cluster, &spec).await?;
        lock(&self.caches).templates.insert(key, name.clone());
        Ok(name)
    }

    fn cluster_tag(&self) -> String {
        format!("{TAG_CLUSTER_PREFIX}{}", self.cfg.cluster)
    }

    /// The cluster's instances matching `filters` (paginated; terminated ones left out).
    async fn describe(&self, mut filters: Vec<Filter>) -> Result<Vec<aws_sdk_ec2::types::Instance>, CloudError> {
        filters.push(Filter::builder().name("tag-key").values(self.cluster_tag()).build());
        filters.push(
            Filter::builder()
                .name("instance-state-name")
                .values("pending")
                .values("running")
                .values("shutting-down")
                .values("stopping")
                .values("stopped")
                .build(),
        );
        let mut out = Vec::new();
        let mut token: Option<String> = None;
        for _page in 0..10_000 {
            self.count(|s| s.describe_instances_calls += 1);
            let page = self
                .ec2
                .describe_instances()
                .set_filters(Some(filters.clone()))
                .set_next_token(token.clone())
                .send()
                .await
                .map_err(|e| from_sdk("DescribeInstances", e))?;
            for res in page.reservations() {
                out.extend(res.instances().iter().cloned());
            }
            token = page.next_token().filter(|t| !t.is_empty()).map(str::to_string);
            if token.is_none() {
                break;
            }
        }
        Ok(out)
    }

    /// The domain view of an EC2 instance.
    fn view(&self, types: &Types, i: &aws_sdk_ec2::types::Instance) -> Option<Instance> {
        let id = i.instance_id()?.to_string();
        let instance_type = i.instance_type()?.as_str().to_string();
        let zone = i.placement().and_then(|p| p.availability_zone()).unwrap_or_default().to_string();
        let capacity_type = match i.instance_lifecycle() {
            Some(InstanceLifecycleType::Spot) => CapacityType::Spot,
            _ => CapacityType::OnDemand,
        };
        let tags: BTreeMap<String, String> = i
            .tags()
            .iter()
            .filter_map(|t| Some((t.key()?.to_string(), t.value().unwrap_or_default().to_string())))
            .collect();
        let state = match i.state().and_then(|s| s.name()) {
            Some(InstanceStateName::Pending) => InstanceState::Pending,
            Some(InstanceStateName::Running) => InstanceState::Running,
            Some(InstanceStateName::Terminated) => InstanceState::Terminated,
            Some(InstanceStateName::Stopping | InstanceStateName::Stopped) => InstanceState::Stopped,
            _ => InstanceState::ShuttingDown,
        };
        let it = types.by_name.get(&instance_type);
        let price = it
            .and_then(|t| t.offerings.iter().find(|o| o.zone == zone && o.capacity_type == capacity_type))
            .map(|o| o.price)
            .unwrap_or(0.0);
        let mut labels = it.map(type_labels).unwrap_or_default();
        labels.insert(dovetail_core::labels::INSTANCE_TYPE.to_string(), instance_type.clone());
        labels.insert(dovetail_core::labels::ZONE.to_string(), zone.clone());
        labels.insert(dovetail_core::labels::CAPACITY_TYPE.to_string(), capacity_type.as_str().to_string());
        if let Some(pool) = tags.get(TAG_NODEPOOL) {
            labels.insert(dovetail_core::labels::NODEPOOL.to_string(), pool.clone());
        }
        let launched_at = i.launch_time().map(|t| Duration::from_secs(t.secs().max(0) as u64)).unwrap_or_default();
        Some(Instance {
            id,
            claim: tags.get(TAG_NODECLAIM).cloned(),
            capacity: it.map(|t| t.capacity.clone()).unwrap_or_default(),
            allocatable: it.map(|t| t.allocatable.clone()).unwrap_or_default(),
            instance_type,
            zone,
            capacity_type,
            price,
            labels,
            state,
            launched_at,
            image: i.image_id().unwrap_or_default().to_string(),
            node_class_hash: tags.get(TAG_NODECLASS_HASH).cloned().unwrap_or_default(),
            tags,
        })
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl CloudProvider for AwsProvider {
    fn name(&self) -> &'static str {
        "aws"
    }

    fn launch<'a>(&'a self, requests: &'a [LaunchRequest]) -> BoxFuture<'a, Vec<Result<Instance, CloudError>>> {
        Box::pin(fleet::launch(self, requests))
    }

    fn find<'a>(&'a self, lookups: &'a [Lookup]) -> BoxFuture<'a, Vec<Result<Option<Instance>, CloudError>>> {
        Box::pin(async move {
            match self.types().await {
                Ok(types) => fleet::find(self, &types, lookups).await,
                Err(e) => lookups.iter().map(|_| Err(e.clone())).collect(),
            }
        })
    }

    fn terminate<'a>(&'a self, ids: &'a [String]) -> BoxFuture<'a, Vec<Result<(), CloudError>>> {
        Box::pin(async move {
            let mut out: Vec<Result<(), CloudError>> =
                ids.iter().map(|id| Err(CloudError::NotFound { id: id.clone() })).collect();
            for chunk in (0..ids.len()).collect::<Vec<_>>().chunks(DESCRIBE_IDS_MAX) {
                let wanted: Vec<String> = chunk.iter().map(|&i| ids[i].clone()).collect();
                let live = match self
                    .describe(vec![Filter::builder().name("instance-id").set_values(Some(wanted)).build()])
                    .await
                {
                    Ok(l) => l,
                    Err(e) => {
                        for &i in chunk {
                            out[i] = Err(e.clone());
                        }
                        continue;
                    }
                };
                let mut running = Vec::new();
                for inst in &live {
                    let Some(id) = inst.instance_id() else { continue };
                    let Some(&i) = chunk.iter().find(|&&i| ids[i] == id) else { continue };
                    match inst.state().and_then(|s| s.name()) {
                        Some(InstanceStateName::ShuttingDown) => out[i] = Ok(()),
                        _ => running.push((i, id.to_string())),
                    }
                }
                if running.is_empty() {
                    continue;
                }
                self.count(|s| s.terminate_calls += 1);
                let result = self
                    .ec2
                    .terminate_instances()
                    .set_instance_ids(Some(running.iter().map(|(_, id)| id.clone()).collect()))
                    .send()
                    .await;
                match result {
                    Ok(_) => {
                        for (i, _) in &running {
                            out[*i] = Ok(());
                        }
                    }
                    Err(e) => {
                        let err = from_sdk("TerminateInstances", e);
                        if running.len() == 1 || matches!(err, CloudError::Throttled { .. }) {
                            for (i, _) in &running {
                                out[*i] = Err(err.clone());
                            }
                            continue;
                        }
                        // The call is all or nothing: one instance it refuses (termination
                        // protection, a policy's condition) must not hold the others back, so
                        // each is asked alone (as Karpenter's batcher does).
                        for (i, id) in &running {
                            self.count(|s| s.terminate_calls += 1);
                            out[*i] = match self.ec2.terminate_instances().instance_ids(id.clone()).send().await {
                                Ok(_) => Ok(()),
                                Err(e) => Err(from_sdk("TerminateInstances", e)),
                            };
                        }
                    }
                }
            }
            out
        })
    }

    fn get<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<Instance, CloudError>> {
        Box::pin(async move {
            let types = self.types().await?;
            let found = self.describe(vec![Filter::builder().name("instance-id").values(id).build()]).await?;
            found
                .iter()
                .filter_map(|i| self.view(&types, i))
                .find(|i| i.id == id)
                .ok_or_else(|| CloudError::NotFound { id: id.to_string() })
        })
    }

    fn list(&self) -> BoxFuture<'_, Result<Vec<Instance>, CloudError>> {
        Box::pin(async move {
            let types = self.types().await?;
            let found = self.describe(Vec::new()).await?;
            Ok(found.iter().filter_map(|i| self.view(&types, i)).collect())
        })
    }

    fn instance_types<'a>(&'a self, node_class: &'a NodeClass) -> BoxFuture<'a, Result<Vec<InstanceType>, CloudError>> {
        Box::pin(async move {
            let resolved = self.resolve(node_class).await?;
            let types = self.types().await?;
            let mut zones: Vec<String> = resolved.subnets.iter().map(|(_, z)| z.clone()).collect();
            zones.sort();
            zones.dedup();
            let archs: Vec<&str> = resolved.images.iter().map(|(_, a)| a.as_str()).collect();
            Ok(types
                .catalog
                .instance_types(&NodeClassSettings::default(), Some(&zones))
                .into_iter()
                .filter(|t| {
                    let arch = t.requirements.get(dovetail_core::labels::ARCH).any();
                    arch.is_none_or(|a| archs.contains(&a.as_str()))
                })
                .collect())
        })
    }

    fn is_drifted<'a>(
        &'a self,
        instance: &'a Instance,
        node_class: &'a NodeClass,
    ) -> BoxFuture<'a, Result<Option<DriftReason>, CloudError>> {
        Box::pin(async move {
            if !instance.node_class_hash.is_empty() && instance.node_class_hash != node_class.hash {
                return Ok(Some(DriftReason::NodeClass));
            }
            let resolved = self.resolve(node_class).await?;
            if !resolved.images.iter().any(|(id, _)| *id == instance.image) {
                return Ok(Some(DriftReason::Image));
            }
            if !resolved.subnets.iter().any(|(_, z)| *z == instance.zone) {
                return Ok(Some(DriftReason::Network));
            }
            Ok(None)
        })
    }
}

pub(crate) use dovetail_core::shared::Fnv;

/// Standard base64 with padding (user data, a CA bundle).
pub fn base64(data: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(data.len().div_ceil(3) * 4);
    for chunk in data.chunks(3) {
        let b = [chunk[0], chunk.get(1).copied().unwrap_or(0), chunk.get(2).copied().unwrap_or(0)];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for (k, shift) in [18u32, 12, 6, 0].into_iter().enumerate() {
            if k <= chunk.len() {
                out.push(char::from(ALPHABET[((n >> shift) & 63) as usize]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_matches_rfc4648_vectors() {
        for (i, o) in
            [("", ""), ("f", "Zg=="), ("fo", "Zm8="), ("foo", "Zm9v"), ("foob", "Zm9vYg=="), ("foobar", "Zm9vYmFy")]
        {
            assert_eq!(base64(i.as_bytes()), o);
        }
    }

    #[test]
    fn settings_that_cannot_work_are_named() {
        assert_eq!(AwsConfig::default().validate(), Ok(()));
        let cfg = AwsConfig { max_fleet_types: 0, ..AwsConfig::default() };
        assert!(matches!(cfg.validate(), Err(CloudError::Invalid { ref what, .. }) if what == "max_fleet_types"));
        let cfg = AwsConfig { cluster: String::new(), ..AwsConfig::default() };
        assert!(matches!(cfg.validate(), Err(CloudError::Invalid { ref what, .. }) if what == "cluster"));
    }
}
