//! What handing out a snapshot of the cluster costs (issue 43): a cache holds every pod,
//! and each reader (a planner, a pool's reconcile) takes a copy of it under the cache's
//! lock, the lock the watches need to apply events. Measured at 100,000 and 300,000 bound
//! pods (with 1% pending): the copy itself, and a watch event applied right after a copy (the
//! first write to a part the copy still shares).
//!
//! `cargo bench -p dovetail-core --bench snapshot`

use std::sync::Arc;
use std::time::Duration;

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use dovetail_core::cluster::Snapshot;
use dovetail_core::pod::{Pod, PodKey};
use dovetail_core::resources::ResourceList;

/// The allocator the `dovetail` binary uses.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// `n` pods over `n / 10` nodes, every hundredth pending.
fn cluster(n: usize) -> Snapshot {
    let mut snap = Snapshot::default();
    let requests = ResourceList::cpu_mem(250, 512 << 20);
    for i in 0..n {
        let mut p = Pod::new(&format!("ns-{}", i % 50), &format!("web-{i:07}"), requests.clone());
        if i % 100 != 0 {
            p.node_name = Some(format!("ip-10-0-{}-{}", i / 2550 % 250, i / 10 % 255));
        }
        snap.pods.insert(p.key.clone(), Arc::new(p));
    }
    snap
}

fn snapshot(c: &mut Criterion) {
    let mut group = c.benchmark_group("snapshot");
    for n in [100_000usize, 300_000] {
        let snap = cluster(n);
        group.sample_size(30).measurement_time(Duration::from_secs(10));
        group.bench_with_input(BenchmarkId::new("copy", n), &snap, |b, snap| b.iter(|| snap.clone()));
        let mut live = snap.clone();
        let mut i = 0usize;
        group.bench_function(BenchmarkId::new("copy_then_event", n), |b| {
            b.iter(|| {
                let copy = live.clone();
                // A watch event for one pod (its status changed) after the copy was handed out.
                i = (i + 7919) % n;
                let key = PodKey::new(&format!("ns-{}", i % 50), &format!("web-{i:07}"));
                live.pods.update(&key, |p| p.started_at = Some(i as u64));
                copy
            })
        });
    }
    group.finish();
}

criterion_group!(benches, snapshot);
criterion_main!(benches);
