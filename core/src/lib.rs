//! dovetail-core: the pure, synchronous, deterministic decisions of the dovetail autoscaler.
//!
//! Everything here takes values (snapshots, specs, `now`) and returns values. It reads no
//! clock, does no I/O and holds no global state, so it can be tested by asserting what it
//! returns and replayed exactly.
//!
//! - [`quantity`], [`resources`]: Kubernetes quantities and resource lists.
//! - [`labels`], [`requirements`], [`taints`]: the label and requirement algebra.
//! - [`pod`], [`node`], [`nodepool`]: the objects the scheduler reasons about.
//! - [`catalog`]: EC2 instance types, offerings, prices and Karpenter's overhead model.
//! - [`scheduling`]: the provisioning simulation at Karpenter parity, and the cost lower bound.
//! - [`clock`]: the `Clock` seam every crate reads time through (Unix epoch time).
//! - [`cluster`]: the Kubernetes objects the plane reads (a [`cluster::Snapshot`]) and the
//!   patches it asks for.
//! - [`ledger`]: the replicated state machine: limits, global caps, the claim registry with
//!   launch batches, ICE marks, the term that fences deposed leaders.
//! - Planners, which return ledger commands and [`effect`]s: [`provisioning`] (a NodePool's
//!   round of new claims), [`lifecycle`] (a NodeClaim's life from launch to termination) and [`plane`] (batch windows, zone choice, claim names,
//!   liveness, drain order, the feed's resend bookkeeping).
//! - [`disruption`]: disruption budgets (and, as they land, the disruption methods).
//! - [`interruption`]: EC2's interruption events parsed, and what they ask of the plane.
//! - [`shared`]: values many objects hold one copy of (an interner for the caches).
//! - [`workload`]: the benchmark workloads, generated from a seed.

pub mod catalog;
pub mod clock;
pub mod cluster;
pub mod disruption;
pub mod effect;
pub mod interruption;
pub mod labels;
pub mod ledger;
pub mod lifecycle;
pub mod node;
pub mod nodepool;
pub mod plane;
pub mod pod;
pub mod provisioning;
pub mod quantity;
pub mod requirements;
pub mod resources;
pub mod scheduling;
pub mod shared;
pub mod taints;
pub mod workload;
