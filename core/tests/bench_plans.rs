//! Every benchmark input of `docs/benchmarks.md`, solved by both packers: each plan passes
//! the independent validator (the dovetail packer under strict zone semantics, the parity
//! packer under Karpenter's), places every pod, and costs at least the lower bound; on the
//! large mix the dovetail plan also beats first-fit-decreasing.

use dovetail_core::scheduling::{self, Packer, Semantics, SolveOptions};
use dovetail_core::workload::{self, Bench};

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
    for bench in Bench::ALL.into_iter().chain([Bench::Mix(50_000)]).chain(Bench::EXTRA) {
        check(bench, Packer::Dovetail);
    }
}

/// goals.md, large pods: on the large mix the dovetail plan is no dearer than
/// first-fit-decreasing with right-sizing, and within 1.20 of the lower bound.
#[test]
fn large_pods_beat_first_fit_decreasing() {
    let input = Bench::Large(1000).input();
    let results = scheduling::solve(&input.snapshot, &input.pods, &SolveOptions::default());
    assert!(results.errors.is_empty(), "unplaced: {:?}", &results.errors[..results.errors.len().min(3)]);
    let (ffd, _) = workload::first_fit_decreasing(&input);
    let cost = results.cost_per_hour();
    assert!(cost <= ffd + 1e-9, "dovetail {cost} $/h, first-fit-decreasing {ffd} $/h");
    let all: Vec<usize> = (0..input.pods.len()).collect();
    let lb = scheduling::lower_bound(&input.snapshot, &input.pods, &all);
    assert!(cost / lb.value <= 1.20, "R {} above 1.20 ({cost} $/h, bound {})", cost / lb.value, lb.value);
}

#[test]
fn parity_plans_of_the_smaller_benchmarks_validate() {
    // The parity packer is quadratic in claims; its 10k plans take minutes in a debug build.
    for bench in [Bench::Generic(1000), Bench::GenericAll(1000), Bench::Mix(1000), Bench::Openb] {
        check(bench, Packer::Karpenter);
    }
}
