//! The suite on the sim cloud.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use dovetail_cloud::sim::{ApiLimits, Bucket, SimCloud, SimConfig, SimQueue};
use dovetail_cloud::{CloudProvider, InterruptionQueue, NodeClass, OfferingKey};
use dovetail_core::catalog::{Catalog, InstanceType, NodeClassSettings};
use dovetail_core::clock::ManualClock;

use super::suite::{self, Harness};

fn catalog() -> Arc<Vec<InstanceType>> {
    static TYPES: OnceLock<Arc<Vec<InstanceType>>> = OnceLock::new();
    TYPES
        .get_or_init(|| {
            let c = Catalog::embedded("us-east-1").expect("catalog");
            Arc::new(c.instance_types(&NodeClassSettings::default(), None))
        })
        .clone()
}

struct Sim {
    cloud: SimCloud,
    queue: Arc<SimQueue>,
    clock: Arc<ManualClock>,
}

impl Sim {
    fn new() -> Self {
        let clock = Arc::new(ManualClock::new());
        let cloud = SimCloud::new(
            SimConfig { cluster: "conformance".into(), ..SimConfig::default() },
            catalog(),
            clock.clone(),
        );
        let queue = cloud.queue();
        Sim { cloud, queue, clock }
    }
}

impl Harness for Sim {
    fn cloud(&self) -> &dyn CloudProvider {
        &self.cloud
    }
    fn queue(&self) -> &dyn InterruptionQueue {
        self.queue.as_ref()
    }
    fn cluster(&self) -> &str {
        "conformance"
    }
    fn zone(&self) -> &str {
        "us-east-1a"
    }
    fn types(&self) -> Vec<String> {
        vec!["m5.large".into(), "m5.xlarge".into(), "m5.2xlarge".into()]
    }
    fn node_class(&self) -> NodeClass {
        NodeClass { name: "default".into(), hash: "h1".into(), ..Default::default() }
    }
    async fn exhaust(&self, offering: &OfferingKey) {
        self.cloud.set_capacity(offering.clone(), 0);
    }
    async fn throttle(&self) {
        self.cloud.set_limits(ApiLimits { mutating: Bucket::new(1.0, 0.5), ..ApiLimits::default() });
        // Spend the one token.
        let _ = self.cloud.terminate(&["i-none".to_string()]).await;
    }
    async fn crash_after_fleet(&self) {
        self.cloud.crash_after_fleet(1);
    }
    async fn send(&self, body: &str) {
        self.queue.send(body.to_string());
    }
    async fn wait(&self, by: Duration) {
        self.clock.advance(by);
    }
}

#[tokio::test]
async fn round_trip() {
    suite::round_trip(&Sim::new()).await;
}

#[tokio::test]
async fn relaunch_is_idempotent() {
    suite::relaunch_is_idempotent(&Sim::new()).await;
}

#[tokio::test]
async fn not_found_after_terminate() {
    suite::not_found_after_terminate(&Sim::new()).await;
}

#[tokio::test]
async fn insufficient_capacity_names_offerings() {
    suite::insufficient_capacity_names_offerings(&Sim::new()).await;
}

#[tokio::test]
async fn throttling_has_a_retry_after() {
    suite::throttling_has_a_retry_after(&Sim::new()).await;
}

#[tokio::test]
async fn queue_receive_delete_visibility() {
    suite::queue_receive_delete_visibility(&Sim::new()).await;
}

#[tokio::test]
async fn a_crash_after_create_fleet_and_a_regrouped_redrive_leave_one_instance_per_claim() {
    suite::a_crash_after_create_fleet_and_a_regrouped_redrive_leave_one_instance_per_claim(&Sim::new()).await;
}

#[tokio::test]
async fn find_locates_a_cut_off_launch_by_its_batch() {
    suite::find_locates_a_cut_off_launch_by_its_batch(&Sim::new()).await;
}
