//! Karpenter's validation (`validation.go`), per command: an emptiness or consolidation
//! command is proposed only once the planner has decided the same for `validation` (15 s);
//! emptiness may shrink to the nodes still empty. Drift goes at once.

use super::{Input, Memory, Method, Plan, Proposal, Verdict};
use crate::ledger::Millis;

/// Keeps the round's commands that have held for the validation delay, remembers the others
/// with when they started, and says so in their nodes' verdicts. A round's consolidation
/// commands are a chain (each simulated with the ones before it done): one waits while any
/// before it waits.
pub(super) fn validate(input: &Input<'_>, memory: &mut Memory, out: &mut Plan) {
    let proposals = std::mem::take(&mut out.proposals);
    let mut validated: Vec<Proposal> = Vec::new();
    let mut waiting: Vec<(Proposal, Millis)> = Vec::new();
    let mut chain_held = true;
    for proposal in proposals {
        if proposal.method == Method::Drift || input.validation == 0 {
            validated.push(proposal);
            continue;
        }
        // The command under validation this one continues: the same, or (emptiness) the
        // nodes still empty of the one before.
        let emptiness = proposal.method == Method::Emptiness;
        let prior = memory.pending.iter().find(|(p, _)| *p == proposal || (emptiness && p.method == Method::Emptiness));
        let (command, since) = match prior {
            Some((p, since)) if *p == proposal => (proposal, *since),
            Some((p, since)) => {
                let still: Vec<String> =
                    proposal.candidates.iter().filter(|c| p.candidates.contains(c)).cloned().collect();
                if still.is_empty() {
                    (proposal, input.now)
                } else {
                    (Proposal { candidates: still, ..proposal }, *since)
                }
            }
            None => (proposal, input.now),
        };
        let held = input.now.saturating_sub(since) >= input.validation;
        if held && (emptiness || chain_held) {
            validated.push(command);
        } else {
            chain_held &= emptiness;
            waiting.push((command, since));
        }
    }
    for (claim, d) in out.decisions.iter_mut() {
        let Verdict::Disrupt { detail, .. } = &mut d.verdict else { continue };
        if validated.iter().any(|p| p.candidates.contains(claim)) {
            continue;
        }
        match waiting.iter().find(|(p, _)| p.candidates.contains(claim)) {
            Some((_, since)) => {
                let acts_in = since.saturating_add(input.validation).saturating_sub(input.now);
                detail.push_str(&format!(" (validating: acts in {}s if it still holds)", acts_in.div_ceil(1000)));
            }
            None => d.verdict = Verdict::Keep("empty; waits for the command under validation".into()),
        }
    }
    memory.pending = waiting;
    out.proposals = validated;
}
