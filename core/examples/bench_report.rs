//! R and solve time on every benchmark input of `docs/benchmarks.md`, one line per input
//! and packer: nodes, $/hour, the lower bound, R = cost / bound, pods placed, the median
//! solve time over `--repeat` runs (index building included, the bound excluded), and a
//! fingerprint of the plan (so two builds can be checked for identical plans).
//!
//! `cargo run --release -p dovetail-core --example bench_report -- [--repeat N] [--packer P] [NAME ...]`
//!
//! NAME filters inputs by name (`mix-1k`, `openb`, ...); P is `dovetail`, `karpenter` or
//! `both` (the default; the parity packer is skipped above 10,000 pods, where it takes
//! minutes). The large mix also gets a line for first-fit-decreasing with right-sizing
//! (`workload::first_fit_decreasing`), the plan goals.md compares it against.

#![allow(clippy::disallowed_methods, reason = "a benchmark measures wall time")]

use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::time::Instant;

use dovetail_core::scheduling::{self, Packer, Results, SolveOptions};
use dovetail_core::workload::{self, Bench};

/// The allocator the `dovetail` binary uses.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn fingerprint(r: &Results) -> u64 {
    let mut h = DefaultHasher::new();
    for c in &r.claims {
        c.pool.hash(&mut h);
        c.pods.hash(&mut h);
        if let Some(l) = &c.launch {
            l.instance_type.hash(&mut h);
            l.zone.hash(&mut h);
            l.price.to_bits().hash(&mut h);
        }
    }
    for e in &r.existing {
        e.node.hash(&mut h);
        e.pods.hash(&mut h);
    }
    r.errors.len().hash(&mut h);
    h.finish()
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut repeat = 1usize;
    let mut packers = vec![Packer::Dovetail, Packer::Karpenter];
    let mut names: Vec<String> = Vec::new();
    let mut i = 0;
    while i < args.len() {
        match args[i].as_str() {
            "--repeat" => {
                i += 1;
                repeat = args.get(i).and_then(|v| v.parse().ok()).unwrap_or(1).max(1);
            }
            "--packer" => {
                i += 1;
                packers = match args.get(i).map(String::as_str) {
                    Some("dovetail") => vec![Packer::Dovetail],
                    Some("karpenter") => vec![Packer::Karpenter],
                    _ => vec![Packer::Dovetail, Packer::Karpenter],
                };
            }
            other => names.push(other.to_string()),
        }
        i += 1;
    }
    let mut benches: Vec<Bench> = Bench::ALL.to_vec();
    benches.push(Bench::Mix(50_000));
    benches.extend(Bench::EXTRA);
    println!(
        "{:<16} {:<9} {:>7} {:>12} {:>12} {:>7} {:>7} {:>10}  fingerprint",
        "input", "packer", "nodes", "$/hour", "bound", "R", "placed", "solve ms"
    );
    for bench in benches {
        if !names.is_empty() && !names.iter().any(|n| *n == bench.name()) {
            continue;
        }
        let input = bench.input();
        if matches!(bench, Bench::Large(_)) {
            let all: Vec<usize> = (0..input.pods.len()).collect();
            let lb = scheduling::lower_bound(&input.snapshot, &input.pods, &all);
            let (cost, nodes) = workload::first_fit_decreasing(&input);
            println!(
                "{:<16} {:<9} {:>7} {:>12.3} {:>12.3} {:>7.3} {:>7} {:>10}",
                bench.name(),
                "ffd",
                nodes,
                cost,
                lb.value,
                cost / lb.value,
                "",
                ""
            );
        }
        for &packer in &packers {
            if packer == Packer::Karpenter && input.pods.len() > 10_000 {
                continue;
            }
            let opts = SolveOptions { packer, ..SolveOptions::default() };
            let mut times = Vec::new();
            let mut results = None;
            for _ in 0..repeat {
                let start = Instant::now();
                let r = scheduling::solve(&input.snapshot, &input.pods, &opts);
                times.push(start.elapsed().as_secs_f64() * 1000.0);
                results = Some(r);
            }
            let Some(r) = results else { continue };
            times.sort_by(f64::total_cmp);
            let on_new: Vec<usize> = r.claims.iter().flat_map(|c| c.pods.iter().copied()).collect();
            let lb = scheduling::lower_bound(&input.snapshot, &input.pods, &on_new);
            let cost = r.cost_per_hour();
            println!(
                "{:<16} {:<9} {:>7} {:>12.3} {:>12.3} {:>7.3} {:>7} {:>10.1}  {:016x}",
                bench.name(),
                format!("{packer:?}").to_lowercase(),
                r.claims.len(),
                cost,
                lb.value,
                if lb.value > 0.0 { cost / lb.value } else { f64::NAN },
                r.scheduled(),
                times[times.len() / 2],
                fingerprint(&r)
            );
        }
    }
}
