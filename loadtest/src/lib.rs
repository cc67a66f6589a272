//! `dovetail simulate` and `dovetail loadtest`: scenarios as data, the driver that runs the
//! whole control plane against the sim cloud and sim cluster while playing Kubernetes and EC2
//! around it, and the report (text, JSON and a plot).

pub mod burst;
pub mod ha;
pub mod report;
pub mod run;
pub mod scenario;
pub mod trace;
mod world;

pub use report::{Report, Sample};
pub use run::{Progress, RunError, RunOptions, run};
pub use scenario::{Scenario, ScenarioError};
