//! Invariant: no claim is launched twice. The cloud makes at most one instance per claim
//! (a re-drive after a failover finds the first call's instance by its batch tag instead of
//! launching again), and once a replica records a claim's instance it never changes nor
//! belongs to another claim.

use std::collections::BTreeMap;

use super::harness::{SEEDS, STEPS, Sim};

/// Runs `sim` and returns every sign of a claim launched twice.
async fn violations(sim: &mut Sim) -> Vec<String> {
    let mut violations = Vec::new();
    // The instance each claim was first seen with on any replica.
    let mut instance_of: BTreeMap<String, String> = BTreeMap::new();
    sim.run(STEPS, |sim, states| {
        for (id, s) in states {
            let mut claim_of: BTreeMap<&str, &str> = BTreeMap::new();
            for c in s.claims().values() {
                let Some(i) = c.state.instance() else { continue };
                if let Some(other) = claim_of.insert(i, &c.id) {
                    violations.push(format!("node {id}: instance {i} on {other} and {}", c.id));
                }
                match instance_of.get(&c.id) {
                    Some(known) if known != i => {
                        violations.push(format!("step {} node {id}: {} was {known}, now {i}", sim.seen.steps, c.id))
                    }
                    Some(_) => {}
                    None => {
                        instance_of.insert(c.id.clone(), i.to_string());
                    }
                }
            }
        }
    })
    .await;
    for (claim, instances) in &sim.cloud.per_claim {
        if instances.len() > 1 {
            violations.push(format!("the cloud launched {claim} {} times: {instances:?}", instances.len()));
        }
    }
    violations
}

#[tokio::test(start_paused = true)]
async fn no_claim_is_launched_twice() {
    let (mut launched, mut tagged, mut redrives, mut crashed) = (0, 0, 0, 0);
    for seed in SEEDS {
        let mut sim = Sim::start(seed).await;
        let found = violations(&mut sim).await;
        assert!(found.is_empty(), "seed {seed}: {found:?}");
        launched += sim.cloud.per_claim.len();
        tagged += sim.cloud.by_tag.len();
        redrives += sim.seen.redrives;
        crashed += sim.seen.crashed_mid_launch;
        sim.stop().await;
    }
    assert!(launched > 20, "only {launched} claims launched: the check was nearly idle");
    assert_eq!(tagged, launched, "one tag per launched claim");
    // Leaders died between the cloud's answer and its record, and the batches were re-driven.
    assert!(crashed > 0 && redrives > 0, "crashed mid-launch {crashed}, re-drives {redrives}");
}

/// The check is not idle: a cloud that launches again for a tag it has seen (no batch-tag
/// lookup) is caught launching claims twice on re-drives.
#[tokio::test(start_paused = true)]
async fn a_cloud_without_the_batch_tag_lookup_is_caught_launching_twice() {
    let mut caught = 0;
    for seed in SEEDS {
        let mut sim = Sim::start(seed).await;
        sim.cloud.forgets_tags = true;
        caught += violations(&mut sim).await.iter().filter(|v| v.contains("the cloud launched")).count();
        sim.stop().await;
    }
    assert!(caught > 0, "no claim launched twice by a cloud that forgets its tags");
}
