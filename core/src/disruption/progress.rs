//! Where a disruption command under way stands (Karpenter's `waitOrTerminate`).

use crate::ledger::{ClaimState, DisruptionCommand, Millis, State};

/// What a disruption command under way needs now (Karpenter's `waitOrTerminate`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Progress {
    /// Some replacement is not initialized yet.
    Waiting,
    /// Every replacement is initialized (or there are none): these candidates (those not
    /// terminating yet) may be deleted.
    Terminate(Vec<String>),
    /// It cannot complete: it ends and its candidates are released (untainted).
    RollBack(String),
    /// Every candidate is terminating: nothing more to do (the ledger forgets the command once
    /// they are gone).
    Done,
}

/// Where a command stands, from the ledger's state at `now`; a command whose replacements are
/// not all initialized after `timeout` is rolled back.
pub fn progress(state: &State, command: &DisruptionCommand, now: Millis, timeout: Millis) -> Progress {
    let waiting: Vec<String> = command
        .candidates
        .iter()
        .filter(|c| state.claim(c).is_some_and(|c| !c.state.is_terminating()))
        .cloned()
        .collect();
    if waiting.is_empty() {
        return Progress::Done;
    }
    let mut pending = 0;
    for r in &command.replacements {
        match state.claim(r).map(|c| &c.state) {
            None => return Progress::RollBack(format!("replacement {r} is gone")),
            Some(ClaimState::Terminating { .. }) => return Progress::RollBack(format!("replacement {r} failed")),
            Some(ClaimState::Initialized { .. }) => {}
            Some(_) => pending += 1,
        }
    }
    if pending == 0 {
        return Progress::Terminate(waiting);
    }
    if now.saturating_sub(command.at) >= timeout {
        return Progress::RollBack(format!("{pending} replacements were not initialized within {}s", timeout / 1000));
    }
    Progress::Waiting
}
