//! Launches and terminates a fleet on the sim cloud and prints the wall time of each phase:
//! `cargo run --release -p dovetail-cloud --example sim_fleet -- 10000` (under
//! `/usr/bin/time -v` for the peak RSS). The request buckets are raised 1,000-fold (EC2's
//! would take about 75 minutes for 10,000 launches), so what is measured is the sim itself.

#![allow(clippy::disallowed_methods, reason = "a benchmark measures wall time")]

use std::sync::Arc;
use std::time::{Duration, Instant};

use dovetail_cloud::batch::{BatchWindow, Batched};
use dovetail_cloud::sim::{ApiLimits, SimCloud, SimConfig};
use dovetail_cloud::{CloudProvider, LaunchRequest, NodeClass};
use dovetail_core::catalog::{CapacityType, Catalog, NodeClassSettings};
use dovetail_core::clock::ManualClock;

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let n: usize = std::env::args().nth(1).map(|s| s.parse()).transpose()?.unwrap_or(10_000);
    let catalog = Catalog::embedded("us-east-1")?;
    let types = Arc::new(catalog.instance_types(&NodeClassSettings::default(), None));
    let clock = Arc::new(ManualClock::new());
    let config = SimConfig { limits: ApiLimits::raised(1000.0), ..SimConfig::default() };
    let cloud = SimCloud::new(config, types, clock.clone());

    let start = Instant::now();
    let mut ids = Vec::with_capacity(n);
    for batch in 0..n.div_ceil(100) {
        let reqs: Vec<LaunchRequest> =
            (batch * 100..((batch + 1) * 100).min(n)).map(|i| request(&format!("claim-{i}"), i)).collect();
        for r in cloud.launch(&reqs).await {
            ids.push(r?.id);
        }
        clock.advance(Duration::from_millis(100));
    }
    let launched = start.elapsed();
    let listed = cloud.list().await?.len();
    let start = Instant::now();
    for chunk in ids.chunks(500) {
        for r in cloud.terminate(chunk).await {
            r?;
        }
        clock.advance(Duration::from_millis(100));
    }
    let terminated = start.elapsed();
    let stats = cloud.stats();
    println!(
        "{n} instances: launch {launched:?} ({} fleet calls), list {listed}, terminate {terminated:?} ({} calls), left {}",
        stats.fleet_calls,
        stats.terminate_calls,
        cloud.len()
    );

    // Merging across calls: N concurrent single-claim launches through the batcher.
    for m in [1usize, 10, 100, 1000] {
        let sim = Arc::new(SimCloud::new(
            SimConfig { limits: ApiLimits::raised(1000.0), ..SimConfig::default() },
            Arc::new(catalog.instance_types(&NodeClassSettings::default(), None)),
            Arc::new(ManualClock::new()),
        ));
        let batched = Arc::new(Batched::new(sim.clone(), BatchWindow::default()));
        let start = Instant::now();
        let mut tasks = Vec::with_capacity(m);
        for i in 0..m {
            let b = batched.clone();
            let r = request(&format!("merged-{i}"), i);
            tasks.push(tokio::spawn(async move { b.launch(std::slice::from_ref(&r)).await }));
        }
        let mut ok = 0;
        for t in tasks {
            ok += t.await?.into_iter().filter(Result::is_ok).count();
        }
        println!(
            "merging: {m} concurrent launches over {} zones -> {} CreateFleet calls, {ok} launched, {:?}",
            m.min(3),
            sim.stats().fleet_calls,
            start.elapsed()
        );
    }
    Ok(())
}

/// Claim `claim` in zone `i % 3`, four candidate types, spot preferred.
fn request(claim: &str, i: usize) -> LaunchRequest {
    const ZONES: [&str; 3] = ["us-east-1a", "us-east-1b", "us-east-1c"];
    LaunchRequest {
        claim: claim.to_string(),
        batch: dovetail_core::ledger::LaunchBatch { id: "batch-1".into(), claims: vec![claim.to_string()].into() },
        nodepool: "default".into(),
        node_class: NodeClass { name: "default".into(), hash: "h".into(), ..Default::default() },
        zone: ZONES[i % 3].into(),
        instance_types: ["m5.large", "m5.xlarge", "c5.large", "r5.large"].iter().map(|s| s.to_string()).collect(),
        capacity_types: vec![CapacityType::Spot, CapacityType::OnDemand],
        labels: Default::default(),
        tags: Default::default(),
    }
}
