//! The plane at scale: `PODS` pending pods (default 100,000) sized so that `PER_NODE` (default
//! 10) fill an m5.xlarge become about `PODS / PER_NODE` nodes through the whole plane (feed, Router,
//! NodePoolActor, ZoneActors, ledger) on the sim cloud (request buckets raised 1,000-fold,
//! instant launches, zero registration delay) and the sim cluster (Deployments, registrar,
//! scheduler). Reports wall time and memory:
//! `cargo run --release -p dovetail-actors --example plane_scale -- [PODS] [PER_NODE]`.
//!
//! Memory is the live heap (a counting allocator over mimalloc, the binary's allocator) and the
//! peak RSS of the process. The process also holds what stands in for the API server and
//! EC2 (the sim cluster's objects and the sim cloud's instances); the sim cluster's objects
//! are what the real plane's reflectors would cache, so they count as the plane's.

#![allow(clippy::disallowed_methods, reason = "a benchmark measures wall time")]

use std::alloc::{GlobalAlloc, Layout};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use dovetail_actors::config::Config;
use dovetail_actors::kubelet::registrations;
use dovetail_actors::plane::{Plane, PlaneConfig, Seams};
use dovetail_cloud::sim::{ApiLimits, SimCloud, SimConfig};
use dovetail_cloud::{CloudProvider, NodeClass};
use dovetail_cluster::ClusterView;
use dovetail_cluster::sim::{Deployment, Registrar, SimCluster, Workloads};
use dovetail_core::catalog::{Catalog, NodeClassSettings};
use dovetail_core::clock::{Clock, SystemClock};
use dovetail_core::labels;
use dovetail_core::ledger::{ClaimState, Command};
use dovetail_core::nodepool::NodePool;
use dovetail_core::pod::Pod;
use dovetail_core::requirements::{Requirement, Requirements};
use dovetail_core::resources::ResourceList;
use dovetail_raft::{InProcess, propose_now, read_with};

struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);
/// The peak seen while the plane's actors run (not the driver playing Kubernetes and EC2).
static PEAK_PLANE: AtomicUsize = AtomicUsize::new(0);
static IN_DRIVER: AtomicBool = AtomicBool::new(true);

// SAFETY: forwards every call to mimalloc unchanged; only counts sizes.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's layout contract is passed on.
        let p = unsafe { mimalloc::MiMalloc.alloc(layout) };
        if !p.is_null() {
            let live = LIVE.fetch_add(layout.size(), Ordering::Relaxed) + layout.size();
            PEAK.fetch_max(live, Ordering::Relaxed);
            if !IN_DRIVER.load(Ordering::Relaxed) {
                PEAK_PLANE.fetch_max(live, Ordering::Relaxed);
            }
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from `alloc` with this layout.
        unsafe { mimalloc::MiMalloc.dealloc(ptr, layout) };
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

const ZONES: [&str; 3] = ["us-east-1a", "us-east-1b", "us-east-1c"];

fn mb(bytes: usize) -> f64 {
    bytes as f64 / (1 << 20) as f64
}

/// VmHWM and VmRSS from /proc (Linux), in MB.
fn rss() -> (f64, f64) {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|kb| kb.parse::<f64>().ok())
            .map_or(0.0, |kb| kb / 1024.0)
    };
    (field("VmHWM:"), field("VmRSS:"))
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let pods: usize = std::env::args().nth(1).map(|s| s.parse()).transpose()?.unwrap_or(100_000);
    let per_node: i64 = std::env::args().nth(2).map(|s| s.parse()).transpose()?.unwrap_or(10).max(1);
    // As the dovetail binary runs the plane.
    dovetail_actors::memory_settings()?;
    let sys = dovetail_actors::system()?;
    sys.block_on(run(pods, per_node))
}

async fn run(pods: usize, per_node: i64) -> Result<(), Box<dyn std::error::Error>> {
    let catalog = Catalog::embedded("us-east-1")?;
    let types = Arc::new(catalog.instance_types(&NodeClassSettings::default(), None));
    let clock: Arc<dyn Clock> = Arc::new(SystemClock::new());
    let config = SimConfig { limits: ApiLimits::raised(1000.0), ..SimConfig::default() };
    let cloud = Arc::new(SimCloud::new(config, types.clone(), clock.clone()));
    let cluster = Arc::new(SimCluster::new());
    let ledger = Arc::new(InProcess::new());
    let mut reqs = Requirements::new();
    reqs.add(labels::CAPACITY_TYPE, Requirement::is_in(["on-demand"]));
    reqs.add(labels::INSTANCE_TYPE, Requirement::is_in(["m5.xlarge"]));
    reqs.add(labels::ZONE, Requirement::is_in(ZONES));
    let pool = NodePool::new("default", reqs);
    propose_now(
        ledger.as_ref(),
        clock.now_millis(),
        Command::SetPool { pool: "default".into(), limits: ResourceList::new() },
    )
    .await?;
    let mut workloads = Workloads::new();
    let apps = 10usize;
    for a in 0..apps {
        workloads.apply_deployment(Deployment {
            namespace: "default".into(),
            name: format!("app{a}"),
            replicas: u32::try_from(pods / apps + usize::from(a < pods % apps))?,
            // An m5.xlarge has 3,920m and about 14 GiB allocatable.
            template: Pod {
                requests: ResourceList::cpu_mem(3_800 / per_node, (12_288 << 20) / per_node),
                ..Pod::default()
            },
            pick: Default::default(),
        });
    }
    workloads.step(&cluster, 0);
    let world = LIVE.load(Ordering::Relaxed);
    let nc = NodeClass { name: "default".into(), hash: "h".into(), ..Default::default() };
    let start = Instant::now();
    let plane = Plane::start(
        PlaneConfig {
            zones: ZONES.iter().map(|z| z.to_string()).collect(),
            pools: vec![(pool, types.clone(), nc)],
            limits: ApiLimits::raised(1000.0),
            config: Config::default(),
        },
        Seams {
            cloud: cloud.clone(),
            view: cluster.clone(),
            cluster: cluster.clone(),
            ledger: ledger.clone(),
            clock: clock.clone(),
            metrics: Default::default(),
        },
    )?;
    let mut registrar = Registrar::new(0);
    let (mut all_claimed, mut done) = (None, None);
    // Bounded: 20 minutes.
    for _ in 0..2_400 {
        IN_DRIVER.store(false, Ordering::Relaxed);
        actix_rt::time::sleep(Duration::from_millis(500)).await;
        IN_DRIVER.store(true, Ordering::Relaxed);
        let now = u64::try_from(clock.now().as_millis())?;
        workloads.step(&cluster, now);
        let instances = cloud.list().await?;
        let launched = registrations(&instances);
        registrar.step(&cluster, &launched, now);
        cluster.schedule();
        let snap = cluster.snapshot();
        let pending = snap.pending().count();
        let (claims, initialized) = read_with(ledger.as_ref(), |s| {
            (
                s.claims().len(),
                s.claims().values().filter(|c| matches!(c.state, ClaimState::Initialized { .. })).count(),
            )
        })
        .await?;
        if all_claimed.is_none() && claims > 0 && claims == snap.nodeclaims.len() && snap.nodes.len() == claims {
            all_claimed = Some(start.elapsed());
        }
        eprintln!(
            "{:>6.1} s: {pending} pending, {claims} claims ({} objects, {} instances), {} nodes, {initialized} initialized, heap {:.0} MB (peak {:.0})",
            start.elapsed().as_secs_f64(),
            snap.nodeclaims.len(),
            instances.len(),
            snap.nodes.len(),
            mb(LIVE.load(Ordering::Relaxed)),
            mb(PEAK.load(Ordering::Relaxed))
        );
        if pending == 0 && claims > 0 && initialized == claims {
            done = Some(start.elapsed());
            break;
        }
    }
    let done = done.ok_or("not converged within 20 minutes")?;
    let snap = cluster.snapshot();
    let (hwm, now_rss) = rss();
    println!(
        "{pods} pods -> {} nodes, {} bound, in {:.1} s (nodes up at {:.1} s)",
        snap.nodes.len(),
        snap.pods.values().filter(|p| p.node_name.is_some()).count(),
        done.as_secs_f64(),
        all_claimed.unwrap_or_default().as_secs_f64()
    );
    println!(
        "heap: {:.0} MB with the pods pending and no plane; {:.0} MB peak while the plane ran ({:.0} MB with the driver's kube-scheduler pass); {:.0} MB at the end. RSS: {hwm:.0} MB peak, {now_rss:.0} MB at the end",
        mb(world),
        mb(PEAK_PLANE.load(Ordering::Relaxed)),
        mb(PEAK.load(Ordering::Relaxed)),
        mb(LIVE.load(Ordering::Relaxed)),
    );
    let router = plane.router.send(dovetail_actors::router::GetRouterStats).await?;
    println!(
        "router: {} batches, {} routed, {} rerouted, {} on existing or in-flight capacity, {} unschedulable, {} stale, {} requeued",
        router.batches,
        router.routed,
        router.rerouted,
        router.on_existing,
        router.unschedulable,
        router.stale,
        router.requeued
    );
    for (name, pool) in &plane.pools {
        let s = pool.send(dovetail_actors::pool::GetPoolStats).await?;
        println!(
            "pool {name}: {} rounds, {} claims, {} launched, {} relaunched, {} released, {} renamed, {} pods held already",
            s.rounds, s.claims_created, s.launched, s.relaunched, s.released, s.renamed, s.already_held
        );
    }
    let errors = plane.errors.counts();
    if !errors.is_empty() {
        println!("errors and notes: {errors:?}");
    }
    let instances = cloud.list().await?.len();
    println!("instances {instances}, actors {} pools / {} zones", plane.pools.len(), plane.zones.len());
    actix::System::current().stop();
    Ok(())
}
