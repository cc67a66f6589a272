pub mod harness;

mod launch_once;
mod limits;
mod same_seed;
mod snapshot_replay;
