//! Deterministic simulations of the replicated ledger: three replicas in one process on
//! tokio's paused clock, over the in-memory network, with seeded random kills and restarts,
//! partitions, message loss and delays (so reordering), while the leader makes decision
//! rounds as the plane does (reserve, launch batches, record instances, terminate) and
//! acts on a fake cloud only after its intent committed in its term. Each invariant is one
//! file under `sim/`; the harness is `sim/harness.rs`.

mod sim;
