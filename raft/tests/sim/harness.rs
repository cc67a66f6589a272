//! The simulation: replicas, faults, the leader's decision rounds and the fake cloud.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use dovetail_core::catalog::CapacityType;
use dovetail_core::clock::Clock;
use dovetail_core::ledger::{Caps, ClaimRequest, ClaimState, Command, Entry, LaunchBatch, Outcome, State, Step};
use dovetail_core::resources::{ResourceList, ResourceName};
use dovetail_core::workload::SplitMix64;
use dovetail_raft::network::{Faults, MemNet, Transport};
use dovetail_raft::replicated::{RaftLedger, RaftSettings};
use dovetail_raft::store::{LogStore, Machine};
use dovetail_raft::types::NodeId;
use dovetail_raft::{Ledger, read_with};

/// The simulation's clock: tokio's (paused) time since the start.
struct VirtualClock(tokio::time::Instant);

impl VirtualClock {
    #[allow(clippy::disallowed_methods, reason = "the simulation's clock is tokio's paused time")]
    fn start() -> VirtualClock {
        VirtualClock(tokio::time::Instant::now())
    }
}

impl Clock for VirtualClock {
    #[allow(clippy::disallowed_methods, reason = "the simulation's clock is tokio's paused time")]
    fn now(&self) -> Duration {
        tokio::time::Instant::now() - self.0
    }
}

/// One replica: its stores outlive its process (they are its disk).
pub struct Replica {
    pub ledger: Option<RaftLedger>,
    pub log: LogStore,
    pub machine: Machine,
}

/// The fake cloud: launches are idempotent by their batch and claim tags (a re-drive finds
/// what the first call made, as CreateFleet with the batch's token and tags does).
#[derive(Default)]
pub struct Cloud {
    /// A broken cloud that launches again for a tag it has seen (to show the check catches it).
    pub forgets_tags: bool,
    /// Instances by (batch, claim).
    pub by_tag: BTreeMap<(String, String), String>,
    /// Instances made for each claim, in any batch.
    pub per_claim: BTreeMap<String, BTreeSet<String>>,
    pub terminated: BTreeSet<String>,
    made: u64,
}

impl Cloud {
    fn launch(&mut self, batch: &str, claim: &str) -> String {
        if let Some(i) = self.by_tag.get(&(batch.to_string(), claim.to_string()))
            && !self.forgets_tags
        {
            return i.clone();
        }
        self.made += 1;
        let id = format!("i-{:06}", self.made);
        self.by_tag.insert((batch.to_string(), claim.to_string()), id.clone());
        self.per_claim.entry(claim.to_string()).or_default().insert(id.clone());
        id
    }
}

/// What the run saw.
#[derive(Default, Debug)]
pub struct Seen {
    pub steps: u64,
    pub committed: u64,
    pub fenced: u64,
    pub kills: u64,
    pub restarts: u64,
    /// Leaders killed after the cloud launched and before the instances were recorded.
    pub crashed_mid_launch: u64,
    /// Launches of a batch the ledger already had (a re-drive).
    pub redrives: u64,
    pub leaders: BTreeSet<(u64, NodeId)>,
}

pub const POOL_LIMIT_CPU: i64 = 16_000;
pub const POOL_LIMIT_NODES: i64 = 6;
pub const CAP_NODES: i64 = 9;

pub struct Sim {
    pub net: Arc<MemNet>,
    pub replicas: BTreeMap<NodeId, Replica>,
    pub cloud: Cloud,
    pub seen: Seen,
    rng: SplitMix64,
    clock: Arc<dyn Clock>,
    next: u64,
}

/// Node `id`'s settings: a fixed election timeout of its own (openraft draws it from an
/// unseeded generator otherwise; distinct values still break split votes), so a seed replays
/// the same run.
fn settings(id: NodeId) -> RaftSettings {
    let timeout = 300 + 70 * id;
    RaftSettings {
        election_timeout_min_ms: timeout,
        election_timeout_max_ms: timeout + 1,
        snapshot_every: 40,
        keep_after_snapshot: 10,
        propose_timeout_ms: 2_000,
        ..RaftSettings::default()
    }
}

impl Sim {
    /// Three replicas, initialized, with pools `a` (limited) and `b` and the caps set.
    pub async fn start(seed: u64) -> Sim {
        let net = MemNet::new(seed);
        let mut sim = Sim {
            net,
            replicas: BTreeMap::new(),
            cloud: Cloud::default(),
            seen: Seen::default(),
            rng: SplitMix64::new(seed ^ 0xD0E7),
            clock: Arc::new(VirtualClock::start()),
            next: 0,
        };
        for id in 1..=3 {
            let replica = Replica {
                ledger: None,
                log: LogStore::in_memory().expect("a log in memory"),
                machine: Machine::in_memory(),
            };
            sim.replicas.insert(id, replica);
            sim.boot(id).await;
        }
        let members = (1..=3).map(|i| (i, format!("mem-{i}"))).collect();
        let init = sim.ledger(1).expect("running").initialize(members);
        tokio::time::timeout(BOUND, init).await.expect("initialized in time").expect("initialized");
        let (_, term) = sim.wait_leader().await;
        let limits =
            ResourceList::from_pairs([(ResourceName::Cpu, POOL_LIMIT_CPU), (ResourceName::Nodes, POOL_LIMIT_NODES)]);
        sim.propose(term, Command::SetPool { pool: "a".into(), limits }).await;
        sim.propose(term, Command::SetPool { pool: "b".into(), limits: ResourceList::new() }).await;
        let caps =
            Caps { resources: ResourceList::from_pairs([(ResourceName::Nodes, CAP_NODES)]), price_per_hour: None };
        sim.propose(term, Command::SetCaps(caps)).await;
        sim
    }

    async fn boot(&mut self, id: NodeId) {
        let clock = self.clock.clone();
        let transport: Arc<dyn Transport> = self.net.clone();
        let r = self.replicas.get_mut(&id).expect("a replica");
        let ledger = RaftLedger::start(id, &settings(id), r.log.clone(), r.machine.clone(), transport, clock)
            .await
            .expect("started");
        self.net.join(id, ledger.raft().clone());
        r.ledger = Some(ledger);
    }

    pub fn ledger(&self, id: NodeId) -> Option<&RaftLedger> {
        self.replicas.get(&id).and_then(|r| r.ledger.as_ref())
    }

    /// The node that says it leads, with its term.
    pub fn leader(&self) -> Option<(NodeId, u64)> {
        self.replicas.iter().find_map(|(id, r)| {
            let l = r.ledger.as_ref()?.leadership().borrow().clone();
            l.leader.then_some((*id, l.term))
        })
    }

    pub async fn wait_leader(&self) -> (NodeId, u64) {
        for _ in 0..400 {
            if let Some(l) = self.leader() {
                return l;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("no leader within 20 s of virtual time: {:?}", self.seen);
    }

    /// Proposes on the leader in `term`; the outcome if it committed.
    async fn propose(&mut self, term: u64, command: Command) -> Option<Outcome> {
        let (id, _) = self.leader()?;
        let at = self.clock.now_millis();
        let r = self.ledger(id)?.propose(Entry { term, at, command }).await;
        match r {
            Ok(c) => {
                self.seen.committed += 1;
                if c.outcome.is_fenced() {
                    self.seen.fenced += 1;
                }
                Some(c.outcome)
            }
            Err(_) => None,
        }
    }

    /// Whether the leader of `term` still leads in it (effects run only then).
    fn current(&self, id: NodeId, term: u64) -> bool {
        self.ledger(id).is_some_and(|l| l.leadership().borrow().is_current(term))
    }

    fn chance(&mut self, percent: u64) -> bool {
        self.rng.below(100) < percent as usize
    }

    /// Random faults for this step.
    async fn faults(&mut self) {
        let running: Vec<NodeId> =
            self.replicas.iter().filter(|(_, r)| r.ledger.is_some()).map(|(id, _)| *id).collect();
        let down: Vec<NodeId> = self.replicas.iter().filter(|(_, r)| r.ledger.is_none()).map(|(id, _)| *id).collect();
        // Kill one node at a time (a quorum of the three stays), the leader as likely as any.
        if down.is_empty() && self.chance(4) {
            let id = running[self.rng.below(running.len())];
            self.kill(id).await;
        } else if !down.is_empty() && self.chance(15) {
            self.boot(down[0]).await;
            self.seen.restarts += 1;
        }
        let mut f = self.net.faults();
        if f.isolated.is_empty() && self.chance(3) {
            f.isolated = BTreeSet::from([1 + self.rng.below(3) as NodeId]);
        } else if !f.isolated.is_empty() && self.chance(20) {
            f.isolated.clear();
        }
        f.loss = self.rng.below(11) as f64 / 100.0;
        f.max_delay = Duration::from_millis(self.rng.below(21) as u64);
        self.net.set_faults(f);
    }

    /// Kills node `id` (its disk stays: a restart finds its log and its last snapshot,
    /// nothing applied since).
    async fn kill(&mut self, id: NodeId) {
        self.net.leave(id);
        if let Some(r) = self.replicas.get_mut(&id) {
            if let Some(l) = r.ledger.take() {
                tokio::time::timeout(BOUND, l.shutdown()).await.expect("stopped in time");
            }
            r.machine = r.machine.restarted().expect("a snapshot that reads");
        }
        self.seen.kills += 1;
    }

    /// One decision round of the leader, as the plane makes them.
    async fn round(&mut self) {
        let Some((id, term)) = self.leader() else { return };
        self.seen.leaders.insert((term, id));
        let Some(ledger) = self.ledger(id) else { return };
        let Ok(state) = read_with(ledger, State::clone).await else { return };
        let pick = self.rng.below(10);
        if pick < 3 {
            // Reserve a few claims in a pool.
            let pool = if self.chance(60) { "a" } else { "b" };
            let n = 1 + self.rng.below(3);
            let claims = (0..n)
                .map(|_| {
                    self.next += 1;
                    ClaimRequest {
                        id: format!("c{:05}", self.next),
                        zone: "z".into(),
                        resources: ResourceList::cpu_mem(2000 + 1000 * self.rng.below(3) as i64, 8 << 30),
                        price_per_hour: 100_000,
                    }
                })
                .collect();
            self.propose(term, Command::Reserve { pool: pool.into(), claims }).await;
        } else if pick < 6 {
            // Launch the reserved claims in one batch, or re-drive a batch a failover left.
            let redrive = state.batches().iter().next().map(|(b, r)| (b.clone(), r.claims.to_vec()));
            let (batch, claims) = match redrive {
                Some(b) if self.chance(50) => {
                    self.seen.redrives += 1;
                    b
                }
                _ => {
                    let reserved: Vec<String> = state
                        .claims()
                        .values()
                        .filter(|c| c.state == ClaimState::Reserved)
                        .map(|c| c.id.clone())
                        .take(4)
                        .collect();
                    if reserved.is_empty() {
                        return;
                    }
                    self.next += 1;
                    (format!("b{:05}", self.next), reserved)
                }
            };
            let lb = LaunchBatch { id: batch.clone(), claims: Arc::from(claims) };
            let Some(Outcome::Launching { started, .. }) =
                self.propose(term, Command::Launch { zone: "z".into(), batches: vec![lb] }).await
            else {
                return;
            };
            // The cloud is called only for claims the ledger started, in a term still current.
            if started.is_empty() || !self.current(id, term) {
                return;
            }
            let steps = started
                .iter()
                .map(|claim| {
                    let instance = self.cloud.launch(&batch, claim);
                    let step = Step::Launched {
                        batch: batch.clone(),
                        instance,
                        resources: ResourceList::cpu_mem(2000, 8 << 30),
                        allocatable: ResourceList::cpu_mem(1900, 7 << 30),
                        price_per_hour: 96_000,
                        instance_type: "m5.large".into(),
                        capacity_type: CapacityType::OnDemand,
                    };
                    (claim.clone(), step)
                })
                .collect();
            // Sometimes the leader dies between the cloud's answer and recording it: the next
            // leader finds the batch launching and re-drives it.
            let down = self.replicas.values().any(|r| r.ledger.is_none());
            if !down && self.chance(25) {
                self.kill(id).await;
                self.seen.crashed_mid_launch += 1;
                return;
            }
            self.propose(term, Command::Advance { steps }).await;
        } else if pick < 8 {
            // Terminate a launched claim: intent, the cloud call, then gone.
            let victim = state.claims().values().find(|c| matches!(c.state, ClaimState::Launched { .. }));
            let Some(victim) = victim.map(|c| (c.id.clone(), c.state.instance().map(str::to_string))) else { return };
            let (claim, instance) = victim;
            if self.propose(term, Command::Advance { steps: vec![(claim.clone(), Step::Terminating)] }).await.is_none()
                || !self.current(id, term)
            {
                return;
            }
            if let Some(i) = instance {
                self.cloud.terminated.insert(i);
            }
            let steps = vec![(claim.clone(), Step::InstanceGone), (claim, Step::Gone)];
            self.propose(term, Command::Advance { steps }).await;
        } else {
            // Registration of a launched claim's node.
            let launched = state.claims().values().find(|c| matches!(c.state, ClaimState::Launched { .. }));
            if let Some(c) = launched.map(|c| c.id.clone()) {
                self.propose(term, Command::Advance { steps: vec![(c, Step::Registered)] }).await;
            }
        }
    }

    /// Runs `steps` steps (faults, a round, some virtual time), calling `check` after each
    /// with every running replica's state; then heals, waits for the replicas to agree and
    /// calls `check` once more.
    pub async fn run(&mut self, steps: u64, mut check: impl FnMut(&Sim, &BTreeMap<NodeId, State>)) {
        for _ in 0..steps {
            self.seen.steps += 1;
            self.faults().await;
            self.round().await;
            let pause = 10 + self.rng.below(90) as u64;
            tokio::time::sleep(Duration::from_millis(pause)).await;
            let states = self.states().await;
            check(self, &states);
        }
        self.heal().await;
        let states = self.states().await;
        check(self, &states);
    }

    /// Every running replica's state.
    pub async fn states(&self) -> BTreeMap<NodeId, State> {
        let mut out = BTreeMap::new();
        for (id, r) in &self.replicas {
            if let Some(l) = &r.ledger
                && let Ok(s) = read_with(l, State::clone).await
            {
                out.insert(*id, s);
            }
        }
        out
    }

    /// No more faults: every node running and connected, a leader committing, and every
    /// replica applied to the same entry.
    pub async fn heal(&mut self) {
        self.net.set_faults(Faults::default());
        let down: Vec<NodeId> = self.replicas.iter().filter(|(_, r)| r.ledger.is_none()).map(|(id, _)| *id).collect();
        for id in down {
            self.boot(id).await;
        }
        let (_, term) = self.wait_leader().await;
        // An entry of the final term: every replica has it once they agree.
        self.propose(term, Command::SetPool { pool: "healed".into(), limits: ResourceList::new() }).await;
        for _ in 0..400 {
            let states = self.states().await;
            let applied: BTreeSet<u64> = states.values().map(State::applied).collect();
            if states.len() == 3 && applied.len() == 1 && states.values().all(|s| s.pool("healed").is_some()) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("the replicas did not converge after healing: {:?}", self.seen);
    }

    pub async fn stop(&mut self) {
        for r in self.replicas.values_mut() {
            if let Some(l) = r.ledger.take() {
                tokio::time::timeout(BOUND, l.shutdown()).await.expect("stopped in time");
            }
        }
    }
}

/// The most any single call of the harness may take (virtual time).
const BOUND: Duration = Duration::from_secs(30);

/// The seeds every invariant runs.
pub const SEEDS: [u64; 4] = [1, 7, 42, 1234];

/// Steps per seed.
pub const STEPS: u64 = 250;
