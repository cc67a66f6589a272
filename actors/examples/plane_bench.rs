//! Wall-clock time from N pending pods to every NodeClaim created and launched, on the sim
//! cloud (request buckets raised 1,000-fold, instant launches) and the sim cluster:
//! `cargo run --release -p dovetail-actors --example plane_bench -- N [IDLE_MS]`.
//! The Router's batch window (IDLE_MS idle, default 1,000; 10 s max) is part of the time and
//! is reported apart. Further arguments: `ec2` keeps EC2's own request buckets (launches are
//! then paced by them); `adaptive` adds the adaptive early close (a queue of at most 10 pods
//! closes after 50 ms idle); `repeat=K` runs K times and prints the median.

#![allow(clippy::disallowed_methods, reason = "a benchmark measures wall time")]

use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::prelude::*;
use dovetail_actors::config::Config;
use dovetail_actors::errors::Errors;
use dovetail_actors::executor::Executor;
use dovetail_actors::pool::{GetPoolStats, NodePoolActor, PoolWiring};
use dovetail_actors::router::{PodsPending, RoutedPool, Router};
use dovetail_actors::zone::{ZoneActor, ZoneConfig};
use dovetail_cloud::sim::{ApiLimits, SimCloud, SimConfig};
use dovetail_cloud::{CloudProvider, NodeClass};
use dovetail_cluster::sim::SimCluster;
use dovetail_core::catalog::{Catalog, NodeClassSettings};
use dovetail_core::clock::{Clock, SystemClock};
use dovetail_core::labels;
use dovetail_core::ledger::{ClaimState, Command};
use dovetail_core::nodepool::NodePool;
use dovetail_core::plane::BatchWindow;
use dovetail_core::pod::{Pod, PodKey};
use dovetail_core::requirements::{Requirement, Requirements};
use dovetail_core::resources::ResourceList;
use dovetail_core::scheduling::PoolInput;
use dovetail_raft::{InProcess, propose_now, read_with};

const ZONES: [&str; 3] = ["us-east-1a", "us-east-1b", "us-east-1c"];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let n: usize = std::env::args().nth(1).map(|s| s.parse()).transpose()?.unwrap_or(1000);
    let idle: u64 = std::env::args().nth(2).map(|s| s.parse()).transpose()?.unwrap_or(1000);
    let flags: Vec<String> = std::env::args().skip(3).collect();
    // `ec2`: EC2's own request buckets instead of raised ones.
    let ec2 = flags.iter().any(|a| a == "ec2");
    let adaptive = flags.iter().any(|a| a == "adaptive");
    let repeat: usize =
        flags.iter().find_map(|a| a.strip_prefix("repeat=")).map(|k| k.parse()).transpose()?.unwrap_or(1).max(1);
    let mut times = Vec::new();
    for _ in 0..repeat {
        let sys = dovetail_actors::system()?;
        times.push(sys.block_on(run(n, idle, ec2, adaptive))?);
    }
    times.sort_by(f64::total_cmp);
    if repeat > 1 {
        println!(
            "{repeat} runs: median {:.0} ms, min {:.0} ms, max {:.0} ms (pending -> every claim created and launched)",
            times[repeat / 2],
            times[0],
            times[repeat - 1]
        );
    }
    Ok(())
}

async fn run(n: usize, idle: u64, ec2: bool, adaptive: bool) -> Result<f64, Box<dyn std::error::Error>> {
    let catalog = Catalog::embedded("us-east-1")?;
    let types = Arc::new(catalog.instance_types(&NodeClassSettings::default(), None));
    let clock: Arc<dyn Clock> = Arc::new(SystemClock::new());
    let limits = if ec2 { ApiLimits::default() } else { ApiLimits::raised(1000.0) };
    let config = SimConfig { limits, ..SimConfig::default() };
    let cloud = Arc::new(SimCloud::new(config, types.clone(), clock.clone()));
    let cluster = Arc::new(SimCluster::new());
    let ledger = Arc::new(InProcess::new());
    let mut reqs = Requirements::new();
    reqs.add(labels::CAPACITY_TYPE, Requirement::is_in(["on-demand"]));
    reqs.add(labels::INSTANCE_CATEGORY, Requirement::is_in(["c", "m", "r"]));
    reqs.add(labels::ZONE, Requirement::is_in(ZONES));
    let pool = NodePool::new("default", reqs);
    propose_now(
        ledger.as_ref(),
        clock.now_millis(),
        Command::SetPool { pool: "default".into(), limits: ResourceList::new() },
    )
    .await?;
    let config = Arc::new(Config::default());
    let errors = Arc::new(Errors::new());
    let executor = Executor::new(
        cluster.clone(),
        ledger.clone(),
        errors.clone(),
        Default::default(),
        config.executor.clone(),
        clock.clone(),
    );
    let zones: Vec<(String, Addr<ZoneActor>)> = ZONES
        .iter()
        .map(|z| {
            (z.to_string(), ZoneActor::new(ZoneConfig::new(z), cloud.clone(), ledger.clone(), clock.clone()).start())
        })
        .collect();
    let (tx, rx) = std::sync::mpsc::sync_channel(1);
    let (cl, le, ck, ty, p) = (cluster.clone(), ledger.clone(), clock.clone(), types.clone(), pool.clone());
    let cloud: Arc<dyn CloudProvider> = cloud.clone();
    let router = Router::create(move |ctx| {
        let wiring = PoolWiring {
            view: cl.clone(),
            cluster: cl.clone(),
            ledger: le.clone(),
            clock: ck.clone(),
            zones: zones.into_iter().collect(),
            router: ctx.address().recipient(),
            executor,
            errors,
            config,
            cloud,
            nominations: Default::default(),
        };
        let nc = NodeClass { name: "default".into(), hash: "h".into(), ..Default::default() };
        let actor = NodePoolActor::new(p.clone(), ty.clone(), nc, wiring).start();
        if tx.send(actor.clone()).is_err() {
            eprintln!("the benchmark stopped while starting");
        }
        let adaptive = adaptive.then_some(dovetail_core::plane::Adaptive { short_queue: 10, short_idle: 50 });
        let window = BatchWindow { idle, max: 10_000, adaptive };
        Router::new(
            window,
            cl.clone(),
            ck.clone(),
            vec![RoutedPool { input: PoolInput { pool: p, instance_types: ty }, actor }],
        )
    });
    let pool_actor = rx.recv_timeout(Duration::from_secs(5))?;
    let sizes = [(250, 512 << 20), (500, 1 << 30), (1000, 2 << 30), (2000, 4 << 30)];
    let pods: Vec<Pod> = (0..n)
        .map(|i| {
            let (cpu, mem) = sizes[i % sizes.len()];
            Pod {
                key: PodKey::new("default", &format!("app-{i}")),
                requests: ResourceList::cpu_mem(cpu, mem),
                creation: i as i64,
                ..Pod::default()
            }
        })
        .collect();
    cluster.apply_pods(pods.clone());
    let start = Instant::now();
    router.send(PodsPending { pods, backlog: false }).await?;
    let mut first_claim: Option<Duration> = None;
    let mut done: Option<Duration> = None;
    for _ in 0..60_000 {
        let (claims, launched) = read_with(ledger.as_ref(), |s| {
            (s.claims().len(), s.claims().values().filter(|c| matches!(c.state, ClaimState::Launched { .. })).count())
        })
        .await?;
        if claims > 0 && first_claim.is_none() {
            first_claim = Some(start.elapsed());
        }
        let stats = pool_actor.send(GetPoolStats).await?;
        if claims > 0 && launched == claims && stats.claims_created as usize == claims && stats.rounds > 0 {
            done = Some(start.elapsed());
            break;
        }
        actix_rt::time::sleep(Duration::from_millis(2)).await;
    }
    let (first, done) = (first_claim.unwrap_or_default(), done.ok_or("not done within 120 s")?);
    let claims = read_with(ledger.as_ref(), |s| s.claims().len()).await?;
    println!(
        "{n} pods -> {claims} NodeClaims created and launched: {:.0} ms after the pods were pending; first reservation at {:.0} ms (window idle {idle} ms); {:.0} ms after the window closed",
        done.as_secs_f64() * 1e3,
        first.as_secs_f64() * 1e3,
        (done.as_secs_f64() * 1e3 - idle as f64).max(0.0),
    );
    System::current().stop();
    Ok(done.as_secs_f64() * 1e3)
}
