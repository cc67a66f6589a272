//! Invariant of the harness itself: a seed replays the same run (the same faults, leaders,
//! commits and end state), so a failing seed can be replayed and debugged.

use super::harness::{STEPS, Sim};

#[tokio::test(start_paused = true)]
async fn a_seed_replays_the_same_run() {
    let mut runs = Vec::new();
    for _ in 0..2 {
        let mut sim = Sim::start(42).await;
        sim.run(STEPS, |_, _| {}).await;
        let states = sim.states().await;
        runs.push((format!("{:?}", sim.seen), sim.net.counts(), states));
        sim.stop().await;
    }
    assert_eq!(runs[0].0, runs[1].0);
    assert_eq!(runs[0].1, runs[1].1);
    assert_eq!(runs[0].2, runs[1].2);
}
