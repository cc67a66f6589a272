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
//! - [`ledger`]: the replicated state machine: limits, global caps, the claim registry, ICE marks.
//! - [`plane`]: the control plane's small decisions: batch windows, zone choice, liveness, drain order.
//! - [`workload`]: the benchmark workloads, generated from a seed.

pub mod catalog;
pub mod clock;
pub mod labels;
pub mod ledger;
pub mod node;
pub mod nodepool;
pub mod plane;
pub mod pod;
pub mod quantity;
pub mod requirements;
pub mod resources;
pub mod scheduling;
pub mod taints;
pub mod workload;
