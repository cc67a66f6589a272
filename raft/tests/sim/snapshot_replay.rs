//! Invariant: a replica's last snapshot plus the log it kept after it replays to exactly its
//! state, and every replica ends with the same state, after runs that built snapshots and
//! purged the log under faults.

use dovetail_raft::store::Machine;
use openraft::storage::{RaftLogReader, RaftStateMachine};

use super::harness::{SEEDS, STEPS, Sim};

#[tokio::test(start_paused = true)]
async fn a_snapshot_plus_the_log_after_it_replays_to_the_same_state_on_every_replica() {
    let mut snapshots = 0;
    for seed in SEEDS {
        let mut sim = Sim::start(seed).await;
        sim.run(STEPS, |_, _| {}).await;
        let states = sim.states().await;
        let first = states.values().next().cloned().expect("a replica");
        for (id, live) in &states {
            assert_eq!(live, &first, "seed {seed}: replica {id} differs from the others");
        }
        for (id, r) in &mut sim.replicas {
            let mut replayed: Machine = r.machine.restarted().expect("its snapshot reads");
            let (from, _) = replayed.applied_state().await.expect("applied state");
            snapshots += usize::from(from.is_some());
            let start = from.map_or(0, |l| l.index + 1);
            let entries = r.log.try_get_log_entries(start..).await.expect("its log");
            replayed.apply(entries).await.expect("replayed");
            let state = replayed.read(|a| a.state.clone());
            assert_eq!(&state, &states[id], "seed {seed}: replica {id}'s snapshot + log != its state");
        }
        sim.stop().await;
    }
    assert!(snapshots >= SEEDS.len(), "snapshots were taken and the log purged behind them: {snapshots}");
}
