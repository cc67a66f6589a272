//! Invariant: no replica ever holds more than a NodePool's limits or the global caps, through
//! kills, partitions, loss and reordering.

use dovetail_core::resources::ResourceName;

use super::harness::{CAP_NODES, POOL_LIMIT_CPU, POOL_LIMIT_NODES, SEEDS, STEPS, Sim};

#[tokio::test(start_paused = true)]
async fn nodepool_limits_and_global_caps_are_never_exceeded_on_any_replica() {
    let (mut at_limit, mut kills, mut leaders) = (0, 0, 0);
    for seed in SEEDS {
        let mut sim = Sim::start(seed).await;
        let mut violations = Vec::new();
        let mut most_nodes = 0;
        sim.run(STEPS, |sim, states| {
            for (id, s) in states {
                if let Some(a) = s.pool("a") {
                    let (cpu, nodes) = (a.usage.get(&ResourceName::Cpu), a.usage.get(&ResourceName::Nodes));
                    most_nodes = most_nodes.max(nodes);
                    if cpu > POOL_LIMIT_CPU || nodes > POOL_LIMIT_NODES {
                        violations
                            .push(format!("step {} node {id}: pool a holds cpu {cpu}, nodes {nodes}", sim.seen.steps));
                    }
                }
                let total = s.total().get(&ResourceName::Nodes);
                if total > CAP_NODES {
                    violations.push(format!("step {} node {id}: {total} nodes over the cap", sim.seen.steps));
                }
            }
        })
        .await;
        assert!(violations.is_empty(), "seed {seed}: {violations:?}");
        let (sent, lost) = sim.net.counts();
        eprintln!("seed {seed}: {:?}, messages {sent} ({lost} lost), pool a at most {most_nodes} nodes", sim.seen);
        at_limit += usize::from(most_nodes == POOL_LIMIT_NODES);
        kills += sim.seen.kills;
        leaders += sim.seen.leaders.len();
        sim.stop().await;
    }
    // The runs pushed against the limits and through failovers (the check was not idle).
    assert!(at_limit > 0, "no run reached pool a's node limit");
    assert!(kills > 0 && leaders > SEEDS.len(), "kills {kills}, leaders {leaders}");
}
