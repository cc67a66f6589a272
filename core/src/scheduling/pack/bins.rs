//! The claims a round of phase 1 opens (`Bin`), what each plans to hold, and the round's
//! state (`Round`): its columns, the LP's quotas, and the zones its claims may be pinned to.

use crate::scheduling::nodes::PlannedNode;
use crate::scheduling::scheduler::pinned_zone;

use super::Ctx;
use super::columns::TypeColumn;

/// A claim opened in a round.
pub(super) struct Bin {
    /// Its column among the round's columns.
    pub(super) col: usize,
    /// Index into the round's zones, when its type is offered in some zone.
    pub(super) zone: Option<usize>,
    pub(super) node: PlannedNode,
    pub(super) left: Vec<f64>,
    /// Planned pods per class of the round (member, count), sparse.
    pub(super) share: Vec<(usize, usize)>,
}

pub(super) fn add_share(share: &mut Vec<(usize, usize)>, m: usize) {
    match share.iter_mut().rev().find(|(x, _)| *x == m) {
        Some((_, n)) => *n += 1,
        None => share.push((m, 1)),
    }
}

pub(super) fn share_of(share: &[(usize, usize)], m: usize) -> usize {
    share.iter().find(|(x, _)| *x == m).map_or(0, |(_, n)| *n)
}

pub(super) fn take_share(share: &mut [(usize, usize)], m: usize) {
    if let Some((_, n)) = share.iter_mut().find(|(x, _)| *x == m) {
        *n = n.saturating_sub(1);
    }
}

pub(super) fn clear_share(share: &mut [(usize, usize)], m: usize) {
    if let Some((_, n)) = share.iter_mut().find(|(x, _)| *x == m) {
        *n = 0;
    }
}

/// Narrows a claim to one zone, unless it is already pinned. False when the claim cannot be
/// in that zone.
pub(super) fn pin_zone(node: &mut PlannedNode, zone: &str) -> bool {
    if pinned_zone(&node.requirements).is_some() {
        return true;
    }
    let mut pinned = node.requirements.clone();
    pinned.add(crate::labels::ZONE, crate::requirements::Requirement::is_in([zone]));
    if pinned.get(crate::labels::ZONE).is_empty() {
        return false;
    }
    node.requirements = pinned;
    true
}

/// The state of one round.
pub(super) struct Round<'c> {
    /// The columns the LP ran on.
    pub(super) columns: Vec<&'c TypeColumn>,
    /// `compat` restricted to `columns`.
    pub(super) compat: Vec<Vec<bool>>,
    /// Pods of each member class still planned on each column.
    pub(super) quota: Vec<Vec<usize>>,
    /// Whether this round opens claims for everything (else only the LP's whole claims).
    pub(super) last: bool,
    /// Every zone a claim of the round could be pinned to, in name order.
    pub(super) zone_names: Vec<String>,
    /// The zones each column's type is offered in (indices into `zone_names`).
    pub(super) column_zones: Vec<Vec<usize>>,
    /// `zone_names.len()`, at least 1: pseudo-zone 0 stands for "no zone".
    pub(super) zone_slots: usize,
    /// Whether every claim is pinned to its zone from the start.
    pub(super) pin_all: bool,
    pub(super) bins: Vec<Bin>,
    /// The claims of each zone.
    pub(super) zone_bins: Vec<Vec<usize>>,
}

impl Round<'_> {
    /// Whether a pod of member `m` fits what is left on `bin` (by resources).
    pub(super) fn fits(&self, ctx: &Ctx<'_>, m: usize, bin: &Bin) -> bool {
        self.compat[m][bin.col] && ctx.packing.demand[m].iter().zip(&bin.left).all(|(need, have)| *need <= *have + 1e-9)
    }
}
