//! Every benchmark input of `docs/benchmarks.md`, solved by both packers: each plan passes
//! the independent validator (the dovetail packer under strict zone semantics, the parity
//! packer under Karpenter's), places every pod, and costs at least the lower bound.

use dovetail_core::scheduling::{self, Packer, Semantics, SolveOptions};
use dovetail_core::workload::Bench;

fn check(bench: Bench, packer: Packer) {
    let input = bench.input();
    let opts = SolveOptions { packer, ..SolveOptions::default() };
    let results = scheduling::solve(&input.snapshot, &input.pods, &opts);
    let semantics = if packer == Packer::Dovetail { Semantics::Strict } else { Semantics::Karpenter };
    let violations = scheduling::validate(&input.snapshot, &input.pods, &results, semantics);
    assert!(
        violations.is_empty(),
        "{} ({packer:?}): {} violations, first: {:#?}",
        bench.name(),
        violations.len(),
        &violations[..violations.len().min(5)]
    );
    assert!(results.errors.is_empty(), "{} ({packer:?}): unplaced pods: {:?}", bench.name(), &results.errors[..1]);
    let on_new: Vec<usize> = results.claims.iter().flat_map(|c| c.pods.iter().copied()).collect();
    let lb = scheduling::lower_bound(&input.snapshot, &input.pods, &on_new);
    assert!(
        lb.value > 0.0 && lb.value <= results.cost_per_hour() * (1.0 + 1e-9),
        "{}: LB {} cost {}",
        bench.name(),
        lb.value,
        results.cost_per_hour()
    );
}

#[test]
fn dovetail_plans_of_every_benchmark_validate() {
    for bench in Bench::ALL.into_iter().chain([Bench::Mix(50_000)]) {
        check(bench, Packer::Dovetail);
    }
}

#[test]
fn parity_plans_of_the_smaller_benchmarks_validate() {
    // The parity packer is quadratic in claims; its 10k plans take minutes in a debug build.
    for bench in [Bench::Generic(1000), Bench::GenericAll(1000), Bench::Mix(1000), Bench::Openb] {
        check(bench, Packer::Karpenter);
    }
}
