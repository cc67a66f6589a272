//! Solve time on the goals' benchmark workloads (`docs/benchmarks.md`): the mix at 1k, 10k
//! and 50k pods, 10k resource-only pods and the large mix at 1k, with the dovetail packer. Each iteration runs a
//! whole `solve` (index building included) from the parsed input; nothing carries over
//! between iterations. The lower bound is timed separately, as the goals exclude it.
//!
//! `cargo bench -p dovetail-core --bench solve`

use std::time::Duration;

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use dovetail_core::scheduling::{self, SolveOptions};
use dovetail_core::workload::Bench;

/// The allocator the `dovetail` binary uses.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn solve(c: &mut Criterion) {
    let mut group = c.benchmark_group("solve");
    for (bench, samples) in [
        (Bench::Mix(1000), 60),
        (Bench::Mix(10_000), 20),
        (Bench::Mix(50_000), 10),
        (Bench::Generic(10_000), 30),
        (Bench::Large(1000), 30),
    ] {
        let input = bench.input();
        let opts = SolveOptions::default();
        group.sample_size(samples).measurement_time(Duration::from_secs(if samples == 10 { 30 } else { 10 }));
        group.bench_with_input(BenchmarkId::from_parameter(bench.name()), &input, |b, input| {
            b.iter(|| scheduling::solve(&input.snapshot, &input.pods, &opts))
        });
    }
    group.finish();
}

fn lower_bound(c: &mut Criterion) {
    let mut group = c.benchmark_group("lower_bound");
    for bench in [Bench::Mix(10_000), Bench::Openb] {
        let input = bench.input();
        let all: Vec<usize> = (0..input.pods.len()).collect();
        group.sample_size(20).measurement_time(Duration::from_secs(10));
        group.bench_with_input(BenchmarkId::from_parameter(bench.name()), &input, |b, input| {
            b.iter(|| scheduling::lower_bound(&input.snapshot, &input.pods, &all))
        });
    }
    group.finish();
}

criterion_group!(benches, solve, lower_bound);
criterion_main!(benches);
