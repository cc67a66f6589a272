//! Which consolidation commands a round proposes: Karpenter's multi-node search (the
//! longest prefix, by savings per disruption, that goes with at most one new node), every
//! other candidate simulated alone (so each gets its answer; the first that can go is the
//! single-node command when the search found none), dovetail's repack when neither found a
//! move, and (dovetail's, up to `max_commands`) further single-node commands, each simulated
//! with the ones before it kept.

use super::candidates::Candidate;
use super::memory::Stuck;
use super::simulation::Simulation;
use super::{BALANCED_K, Input, MULTI_NODE_MAX, Method, Plan, Proposal, Verdict, consolidation};
use crate::nodepool::{ConsolidationPolicy, DisruptionReason};

/// The move of the longest prefix of `refs`, at least `shortest` long, that `attempt` finds
/// one for (a binary search: a longer prefix is tried only when a shorter one holds).
fn longest_prefix<T>(
    refs: &[T],
    shortest: usize,
    mut attempt: impl FnMut(&[T]) -> Result<consolidation::Move, String>,
) -> Option<consolidation::Move> {
    debug_assert!(shortest >= 1, "a prefix of at least one candidate");
    let (mut lo, mut hi, mut best) = (shortest, refs.len(), None);
    while lo <= hi {
        let mid = (lo + hi) / 2;
        match attempt(&refs[..mid]) {
            Ok(m) => {
                best = Some(m);
                lo = mid + 1;
            }
            Err(_) => hi = mid - 1,
        }
    }
    best
}

/// A repack's prefix: the whole of `refs` first, then (when it does not go) the longest
/// shorter prefix of at least `shortest` that does. A repack gets easier as its prefix grows
/// (m candidates may go onto up to m - 1 new nodes, so each candidate added brings a node's
/// worth of room back), unlike Karpenter's multi-node move (one new node whatever the
/// prefix): the binary search alone, failing at its middle, would never try the longer
/// prefixes that go (four memory-bound nodes that do not fit on three larger ones while five
/// fit on four).
fn repack_prefix<T>(
    refs: &[T],
    shortest: usize,
    mut attempt: impl FnMut(&[T]) -> Result<consolidation::Move, String>,
) -> Option<consolidation::Move> {
    if refs.len() < shortest {
        return None;
    }
    if let Ok(m) = attempt(refs) {
        return Some(m);
    }
    longest_prefix(&refs[..refs.len() - 1], shortest, attempt)
}

/// What consolidation says of a candidate it found no move for.
pub(super) fn unplaced(c: &Candidate<'_>) -> String {
    format!("it runs {} pods; no cheaper place for them was found", c.pods.len())
}

/// The consolidation methods over the settled candidates with pods: multi-node first (the
/// longest prefix, by savings per disruption, that goes with at most one new node), then
/// single-node, then (dovetail's, when neither found a move) a repack: the longest prefix of
/// at least 3 of the emptiest that goes onto fewer new nodes costing less together. Returns
/// each candidate's verdict, in `underused`'s order (sorted here).
pub(super) fn consolidate(
    input: &Input<'_>,
    sim: Option<&mut Simulation<'_>>,
    underused: &mut [Candidate<'_>],
    out: &mut Plan,
    room: usize,
    (total_price, total_cost): (f64, f64),
    stuck: &mut Stuck,
) -> Vec<Verdict> {
    underused.sort_by(|a, b| b.savings_ratio().total_cmp(&a.savings_ratio()).then_with(|| a.claim.id.cmp(&b.claim.id)));
    let mut verdicts: Vec<Verdict> = underused.iter().map(|c| Verdict::Keep(unplaced(c))).collect();
    if !out.proposals.is_empty() {
        verdicts.iter_mut().for_each(|v| *v = Verdict::Keep("another command goes first this round".into()));
        return verdicts;
    }
    if room == 0 {
        let method = Method::SingleNodeConsolidation;
        verdicts.iter_mut().for_each(|v| *v = Verdict::BudgetExhausted { method });
        return verdicts;
    }
    let Some(sim) = sim else { return verdicts };
    let balanced = input.pool.disruption.consolidation_policy == ConsolidationPolicy::Balanced;
    // Karpenter's balanced score: the share of the pool's cost saved over the share of its
    // disruption cost spent.
    let worth = |m: &consolidation::Move, cands: &[&Candidate<'_>]| -> Result<(), String> {
        if !balanced || total_price <= 0.0 || total_cost <= 0.0 {
            return Ok(());
        }
        let spent: f64 = cands.iter().map(|c| c.disruption_cost).sum();
        let score = (m.savings() / total_price) / (spent / total_cost);
        if score >= 1.0 / BALANCED_K {
            Ok(())
        } else {
            Err(format!("the balanced policy scores it {score:.2}, under {:.2}", 1.0 / BALANCED_K))
        }
    };
    let attempt = |sim: &mut Simulation<'_>, cands: &[&Candidate<'_>], max_new: usize| {
        consolidation::consolidate(sim, input.pools, cands, input.spot_to_spot, max_new, None)
            .and_then(|m| worth(&m, cands).map(|()| m))
    };
    // A single candidate's own trial, remembering the pod that kept it (see
    // `consolidation::consolidate`).
    let alone = |sim: &mut Simulation<'_>, c: &Candidate<'_>, stuck: &mut Stuck| {
        consolidation::consolidate(sim, input.pools, &[c], input.spot_to_spot, 1, Some(stuck))
            .and_then(|m| worth(&m, &[c]).map(|()| m))
    };
    // Candidates the simulation cannot move this round (pods on their way go to them) are
    // left out before the search, as Karpenter leaves nominated nodes out.
    let blocked: Vec<Option<String>> = underused.iter().map(|c| sim.blocked(&c.claim.id)).collect();
    for (v, why) in verdicts.iter_mut().zip(&blocked) {
        if let Some(why) = why {
            *v = Verdict::Keep(why.clone());
        }
    }
    let movable: Vec<&Candidate<'_>> =
        underused.iter().zip(&blocked).filter(|(_, b)| b.is_none()).map(|(c, _)| c).collect();
    let max = movable.len().min(MULTI_NODE_MAX).min(room);
    let refs: Vec<&Candidate<'_>> = movable.iter().take(max).copied().collect();
    let mut best =
        longest_prefix(&refs, 2, |cands| attempt(sim, cands, 1)).map(|m| (Method::MultiNodeConsolidation, m));
    // Every other candidate is simulated alone, so each gets its answer: the first (in
    // Karpenter's order) that can go is the single-node command when no multi-node one was
    // found; the others may follow as commands of their own (below).
    let mut could = vec![false; underused.len()];
    for (i, c) in underused.iter().enumerate() {
        if blocked[i].is_some() || best.as_ref().is_some_and(|(_, m)| m.candidates.contains(&c.claim.id)) {
            continue;
        }
        verdicts[i] = match alone(sim, c, stuck) {
            Ok(m) if best.is_none() => {
                best = Some((Method::SingleNodeConsolidation, m));
                continue;
            }
            Ok(m) => {
                could[i] = true;
                Verdict::Keep(format!("{}; it waits for a later round", describe(&m)))
            }
            Err(why) => Verdict::Keep(why),
        };
    }
    // dovetail's repack, where no single replacement gets there: the longest prefix of at
    // least 3 candidates whose pods go onto fewer new nodes that cost less together (the
    // whole budget's room tried first). Its candidates are the emptiest (by their pods'
    // larger share of the node's CPU or memory), not the first by savings: with room for a
    // few nodes, the nodes a repack can fold are the ones whose pods need the fewest new
    // nodes; the fullest, first by savings when they run one large pod, never fold.
    if best.is_none() {
        let mut by_fill: Vec<(f64, &Candidate<'_>)> = movable.iter().map(|c| (c.fill(), *c)).collect();
        by_fill.sort_by(|a, b| a.0.total_cmp(&b.0));
        let emptiest: Vec<&Candidate<'_>> = by_fill.into_iter().take(max).map(|(_, c)| c).collect();
        best = repack_prefix(&emptiest, 3, |cands| attempt(sim, cands, cands.len() - 1)).map(|m| (Method::Repack, m));
    }
    let Some(first) = best else { return verdicts };
    // More commands at once (dovetail's, up to `max_commands`, within the budget): each
    // further single-node move is simulated again with the commands before it done, so
    // together they hold.
    let mut left = room.saturating_sub(first.1.candidates.len());
    let mut chosen = vec![first];
    if chosen[0].0 != Method::Repack && input.max_commands > 1 && left > 0 {
        let mut done = chosen[0].1.candidates.clone();
        for (i, c) in underused.iter().enumerate() {
            if chosen.len() >= input.max_commands || left == 0 {
                break;
            }
            if !could[i] {
                continue;
            }
            let ids: Vec<&str> = done.iter().map(String::as_str).collect();
            // A kept move that no longer holds would make every later one wrong: stop there
            // (the move was just tried, so this is not expected).
            if sim.keep(&ids).is_err() {
                break;
            }
            done.clear();
            match attempt(sim, &[c], 1) {
                Ok(m) => {
                    done.clone_from(&m.candidates);
                    left -= 1;
                    chosen.push((Method::SingleNodeConsolidation, m));
                }
                Err(why) => verdicts[i] = Verdict::Keep(format!("{why}, with the commands before it done")),
            }
        }
    }
    for (method, m) in chosen {
        let detail = describe(&m);
        for (c, v) in underused.iter().zip(verdicts.iter_mut()) {
            if m.candidates.contains(&c.claim.id) {
                *v = Verdict::Disrupt { method, detail: detail.clone() };
            }
        }
        out.proposals.push(Proposal {
            method,
            reason: DisruptionReason::Underutilized,
            candidates: m.candidates,
            replacements: m.replacements.into_iter().map(|r| r.claim).collect(),
            detail,
        });
    }
    verdicts
}

/// A move in words.
pub(super) fn describe(m: &consolidation::Move) -> String {
    match m.replacements.as_slice() {
        [] => format!("its pods fit on other nodes; saves ${:.4}/h", m.savings()),
        [r] => format!(
            "replaced by one cheaper node ({} types from ${:.4}/h); saves at least ${:.4}/h",
            r.claim.instance_types.len(),
            r.price,
            m.savings()
        ),
        rs => format!(
            "{} nodes repacked onto {} new ones costing at most ${:.4}/h together; saves at least ${:.4}/h",
            m.candidates.len(),
            rs.len(),
            rs.iter().map(|r| r.price).sum::<f64>(),
            m.savings()
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn moved(prefix: &[&str]) -> consolidation::Move {
        consolidation::Move {
            candidates: prefix.iter().map(|s| (*s).to_string()).collect(),
            replacements: Vec::new(),
            cost: 0.0,
        }
    }

    /// A repack gets easier as its prefix grows: five memory-bound nodes that go onto four
    /// larger ones while four do not go onto three. The whole room is tried first, so the
    /// five go; the binary search alone (Karpenter's multi-node search) fails at four, then
    /// three, and never tries five.
    #[test]
    fn a_repack_tries_the_whole_budget_room_first_as_a_longer_prefix_goes_where_a_shorter_does_not() {
        let refs = ["a", "b", "c", "d", "e"];
        let from_five = |p: &[&str]| if p.len() >= 5 { Ok(moved(p)) } else { Err(format!("{} do not fit", p.len())) };
        assert!(longest_prefix(&refs, 3, from_five).is_none(), "the binary search misses it");
        let m = repack_prefix(&refs, 3, from_five).expect("the five go");
        assert_eq!(m.candidates, refs);

        // A candidate at the end whose pods go nowhere: the longest prefix without it.
        let without_e = |p: &[&str]| if p.contains(&"e") { Err("e's pods fit nowhere".into()) } else { Ok(moved(p)) };
        assert_eq!(repack_prefix(&refs, 3, without_e).expect("four go").candidates, ["a", "b", "c", "d"]);

        // Fewer candidates than a repack needs: nothing tried.
        let mut tried = 0;
        assert!(
            repack_prefix(&refs[..2], 3, |p: &[&str]| {
                tried += 1;
                Ok(moved(p))
            })
            .is_none()
        );
        assert_eq!(tried, 0);
    }
}
