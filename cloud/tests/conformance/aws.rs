//! The suite on the AWS provider, against moto's server behind the fault-injecting proxy.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use dovetail_cloud::aws::{AwsConfig, AwsProvider, SpotPrices, SqsQueue, StaticCredentials, sdk_config};
use dovetail_cloud::{CloudProvider, InterruptionQueue, NodeClass, OfferingKey};
use dovetail_core::catalog::Catalog;
use dovetail_core::clock::SystemClock;
use tokio::sync::OnceCell;

use super::ami_seed::seed_ami_parameters;
use super::moto::{Proxy, moto, setup};
use super::suite::{self, Harness};

pub const REGION: &str = "us-east-1";
/// moto reserves `/aws/...` parameter names, so the EKS AMI parameters are seeded here.
pub const AMI_PARAMETERS: &str = "/dovetail-test/eks/optimized-ami";

/// The configuration a user would write for an emulator at `endpoint`.
pub fn config(cluster: &str, endpoint: &str) -> AwsConfig {
    AwsConfig {
        cluster: cluster.into(),
        region: Some(REGION.into()),
        endpoint: Some(endpoint.into()),
        credentials: Some(StaticCredentials { access_key_id: "testing".into(), secret_access_key: "testing".into() }),
        spot_prices: SpotPrices::BuiltIn,
        cluster_endpoint: "https://127.0.0.1:6443".into(),
        cluster_ca: "Y2E=".into(),
        ami_parameter_prefix: AMI_PARAMETERS.into(),
        ..AwsConfig::default()
    }
}

/// moto's catalog, read once through the provider (DescribeInstanceTypes takes seconds there).
pub async fn moto_catalog() -> Catalog {
    static CATALOG: OnceCell<Catalog> = OnceCell::const_new();
    CATALOG
        .get_or_init(|| async {
            let p = AwsProvider::connect(config("catalog", &format!("http://{}", moto().addr)), Arc::new(SystemClock))
                .await
                .expect("connect");
            p.catalog().await.expect("catalog from moto")
        })
        .await
        .clone()
}

/// A provider for `cluster` behind its own proxy, with the default subnets and security group
/// tagged for discovery as a user's VPC would be (`kubernetes.io/cluster/<name>: shared`, a
/// key per cluster, so that tests sharing moto's default VPC do not see each other's).
pub struct Aws {
    pub proxy: Proxy,
    pub cloud: AwsProvider,
    pub queue: SqsQueue,
    pub cluster: String,
}

impl Aws {
    pub async fn new(cluster: &str) -> Aws {
        let proxy = Proxy::start(moto().addr).await;
        let cfg = config(cluster, &format!("http://{}", proxy.addr));
        let cloud = AwsProvider::connect(cfg.clone(), Arc::new(SystemClock))
            .await
            .expect("connect")
            .with_catalog(moto_catalog().await)
            .await;
        let ec2 = cloud.ec2();
        let subnets = setup("describing the subnets", || ec2.describe_subnets().send()).await;
        let groups = setup("describing the default security group", || {
            ec2.describe_security_groups()
                .filters(aws_sdk_ec2::types::Filter::builder().name("group-name").values("default").build())
                .send()
        })
        .await;
        let mut resources: Vec<String> =
            subnets.subnets().iter().filter_map(|s| s.subnet_id().map(str::to_string)).collect();
        resources.extend(groups.security_groups().iter().filter_map(|g| g.group_id().map(str::to_string)));
        setup("tagging the subnets and security group", || {
            ec2.create_tags()
                .set_resources(Some(resources.clone()))
                .tags(
                    aws_sdk_ec2::types::Tag::builder()
                        .key(format!("kubernetes.io/cluster/{cluster}"))
                        .value("shared")
                        .build(),
                )
                .send()
        })
        .await;
        let sdk = sdk_config(&cfg).await;
        seed_ami_parameters(ec2, &aws_sdk_ssm::Client::new(&sdk), "1.33", AMI_PARAMETERS).await;
        let sqs = aws_sdk_sqs::Client::new(&sdk);
        let q = setup("creating the queue", || {
            sqs.create_queue()
                .queue_name(format!("{cluster}-interruptions"))
                .attributes(aws_sdk_sqs::types::QueueAttributeName::VisibilityTimeout, "3")
                .send()
        })
        .await;
        let queue = SqsQueue::new(&sdk, q.queue_url().expect("queue url"));
        Aws { proxy, cloud, queue, cluster: cluster.to_string() }
    }

    pub fn discovery(&self) -> BTreeMap<String, String> {
        BTreeMap::from([(format!("kubernetes.io/cluster/{}", self.cluster), "shared".to_string())])
    }
}

impl Harness for Aws {
    fn cloud(&self) -> &dyn CloudProvider {
        &self.cloud
    }
    fn queue(&self) -> &dyn InterruptionQueue {
        &self.queue
    }
    fn cluster(&self) -> &str {
        &self.cluster
    }
    fn zone(&self) -> &str {
        "us-east-1a"
    }
    fn types(&self) -> Vec<String> {
        vec!["m5.large".into(), "m5.xlarge".into(), "m5.2xlarge".into()]
    }
    fn node_class(&self) -> NodeClass {
        NodeClass {
            name: "default".into(),
            subnet_selector: vec![self.discovery()],
            security_group_selector: vec![self.discovery()],
            ami_alias: Some("al2023@latest".into()),
            hash: "h1".into(),
            ..Default::default()
        }
    }
    async fn exhaust(&self, offering: &OfferingKey) {
        self.proxy.faults().exhausted.insert((
            offering.instance_type.clone(),
            offering.zone.clone(),
            offering.capacity_type.as_str().to_string(),
        ));
    }
    async fn throttle(&self) {
        self.proxy.faults().throttle_next = 1;
    }
    async fn crash_after_fleet(&self) {
        self.proxy.faults().lose_fleet_response += 1;
    }
    async fn send(&self, body: &str) {
        let sdk = sdk_config(&config(&self.cluster, &format!("http://{}", self.proxy.addr))).await;
        aws_sdk_sqs::Client::new(&sdk)
            .send_message()
            .queue_url(self.queue.url())
            .message_body(body)
            .send()
            .await
            .expect("send message");
    }
    async fn wait(&self, by: Duration) {
        // The queue's visibility timeout is 3 s: waiting 4 s shows what would come back.
        tokio::time::sleep(by.min(Duration::from_secs(4))).await;
    }
}

#[tokio::test]
async fn round_trip() {
    suite::round_trip(&Aws::new("conf-round-trip").await).await;
}

#[tokio::test]
async fn relaunch_is_idempotent() {
    suite::relaunch_is_idempotent(&Aws::new("conf-idempotent").await).await;
}

#[tokio::test]
async fn not_found_after_terminate() {
    suite::not_found_after_terminate(&Aws::new("conf-not-found").await).await;
}

#[tokio::test]
async fn insufficient_capacity_names_offerings() {
    suite::insufficient_capacity_names_offerings(&Aws::new("conf-ice").await).await;
}

#[tokio::test]
async fn throttling_has_a_retry_after() {
    suite::throttling_has_a_retry_after(&Aws::new("conf-throttle").await).await;
}

#[tokio::test]
async fn queue_receive_delete_visibility() {
    suite::queue_receive_delete_visibility(&Aws::new("conf-queue").await).await;
}

#[tokio::test]
async fn a_crash_after_create_fleet_and_a_regrouped_redrive_leave_one_instance_per_claim() {
    let h = Aws::new("conf-crash").await;
    suite::a_crash_after_create_fleet_and_a_regrouped_redrive_leave_one_instance_per_claim(&h).await;
    assert_eq!(h.proxy.calls("CreateFleet"), 1, "the re-drives launched nothing");
}

#[tokio::test]
async fn find_locates_a_cut_off_launch_by_its_batch() {
    suite::find_locates_a_cut_off_launch_by_its_batch(&Aws::new("conf-find").await).await;
}
