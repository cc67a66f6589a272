//! What a ZoneActor does off its handlers: a launch call (the batches recorded first, the
//! cloud called only for what the ledger started and only while the term lasts, the outcomes
//! committed) and a batch of terminations (fenced the same way, committed as `InstanceGone`).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use dovetail_cloud::{CloudError, CloudProvider, Instance, LaunchBatch, LaunchRequest, Lookup, OfferingKey};
use dovetail_core::clock::{Clock, to_millis};
use dovetail_core::ledger::{Command, Entry, Offering, Outcome, Step, Term, micro_dollars};
use dovetail_core::plane::unmarked_candidates;
use dovetail_raft::{Ledger, read_with};

use crate::errors::Errors;

/// Why a claim of a launch call has no cloud result.
#[derive(Clone, Debug, PartialEq)]
pub(super) enum Failure {
    Throttled(Duration),
    /// The ledger did not start it (with why).
    Refused(String),
    /// The term was over before the call.
    Fenced,
    Cloud(CloudError),
}

/// What a launch call needs, off the actor.
pub(super) struct LaunchCall {
    pub(super) cloud: Arc<dyn CloudProvider>,
    pub(super) ledger: Arc<dyn Ledger>,
    pub(super) clock: Arc<dyn Clock>,
    pub(super) ice_ttl: Duration,
    pub(super) errors: Arc<Errors>,
    pub(super) zone: String,
    pub(super) term: Term,
    pub(super) batches: Vec<LaunchBatch>,
    pub(super) requests: Vec<LaunchRequest>,
}

/// One result per request of a launch call.
pub(super) type LaunchResult = Result<Result<Instance, CloudError>, Failure>;

/// Records the batches, launches what the ledger started (while the term lasts, without the
/// offerings the ledger marks unavailable), records the outcomes; one result per request.
pub(super) async fn launch(c: LaunchCall) -> Vec<LaunchResult> {
    let n = c.requests.len();
    let at = c.clock.now_millis();
    let record = Command::Launch { zone: c.zone.clone(), batches: c.batches.clone() };
    let recorded = c.ledger.propose(Entry { term: c.term, at, command: record }).await;
    let refused: BTreeMap<String, String> = match recorded.map(|r| r.outcome) {
        Ok(Outcome::Launching { refused, .. }) => refused.into_iter().collect(),
        Ok(Outcome::Fenced { .. }) => return vec![Err(Failure::Fenced); n],
        Ok(other) => {
            c.errors.warn("record_launch", "unexpected", &c.zone, &format!("{other:?}"));
            return vec![Err(Failure::Refused(format!("{other:?}"))); n];
        }
        Err(e) => {
            c.errors.warn("record_launch", "ledger", &c.zone, &e);
            return vec![Err(Failure::Cloud(CloudError::Transient { message: e.to_string() })); n];
        }
    };
    let mut out: Vec<LaunchResult> =
        c.requests.iter().map(|r| Err(Failure::Refused(refused.get(&r.claim).cloned().unwrap_or_default()))).collect();
    // The batches as the ledger recorded them (a new one holds only the claims it started):
    // what the cloud assigns a batch's untagged instances to.
    let ids: BTreeSet<String> = c.batches.iter().map(|b| b.id.clone()).collect();
    let zone = c.zone.clone();
    let read = read_with(&*c.ledger, move |s| {
        let records: BTreeMap<String, Arc<[String]>> =
            ids.iter().filter_map(|id| Some((id.clone(), s.batches().get(id)?.claims.clone()))).collect();
        let marked: BTreeSet<Offering> = s.unavailable(at).filter(|o| o.zone == zone).cloned().collect();
        (records, marked)
    })
    .await;
    let (records, marked) = match read {
        Ok(r) => r,
        Err(e) => {
            c.errors.warn("read_batches", "ledger", &c.zone, &e);
            return vec![Err(Failure::Cloud(CloudError::Transient { message: e.to_string() })); n];
        }
    };
    // Fenced right before the cloud is called: a leader deposed meanwhile launches nothing.
    if !c.ledger.leadership().borrow().is_current(c.term) {
        for (i, r) in c.requests.iter().enumerate() {
            if !refused.contains_key(&r.claim) {
                out[i] = Err(Failure::Fenced);
            }
        }
        return out;
    }
    let mut calls: Vec<(usize, LaunchRequest)> = Vec::new();
    for (i, r) in c.requests.iter().enumerate() {
        if refused.contains_key(&r.claim) {
            continue;
        }
        let mut r = r.clone();
        if let Some(members) = records.get(&r.batch.id) {
            r.batch.claims = members.clone();
        }
        match unmarked_candidates(&r.instance_types, &r.zone, &r.capacity_types, &marked) {
            Ok(kept) => {
                r.instance_types = kept;
                calls.push((i, r));
            }
            Err(tried) => {
                let offerings = tried
                    .into_iter()
                    .map(|o| OfferingKey {
                        instance_type: o.instance_type,
                        zone: o.zone,
                        capacity_type: o.capacity_type,
                    })
                    .collect();
                out[i] = Ok(Err(CloudError::InsufficientCapacity { offerings }));
            }
        }
    }
    let requests: Vec<LaunchRequest> = calls.iter().map(|(_, r)| r.clone()).collect();
    let results = if requests.is_empty() { Vec::new() } else { c.cloud.launch(&requests).await };
    for ((i, _), result) in calls.iter().zip(results) {
        out[*i] = match result {
            Err(CloudError::Throttled { retry_after, .. }) => Err(Failure::Throttled(retry_after)),
            r => Ok(r),
        };
    }
    commit_outcomes(&c, &out).await;
    out
}

/// Commits a call's outcomes: the launched instances and the claims that found no capacity
/// in one entry, the offerings that had none marked in another.
async fn commit_outcomes(c: &LaunchCall, out: &[LaunchResult]) {
    let at = c.clock.now_millis();
    let mut steps = Vec::new();
    let mut offerings = Vec::new();
    for (r, result) in c.requests.iter().zip(out) {
        let batch = r.batch.id.clone();
        match result {
            Ok(Ok(inst)) => steps.push((
                r.claim.clone(),
                Step::Launched {
                    batch,
                    instance: inst.id.clone(),
                    resources: inst.capacity.clone(),
                    allocatable: inst.allocatable.clone(),
                    price_per_hour: micro_dollars(inst.price),
                    instance_type: inst.instance_type.clone(),
                    capacity_type: inst.capacity_type,
                },
            )),
            Ok(Err(CloudError::InsufficientCapacity { offerings: o })) => {
                steps.push((r.claim.clone(), Step::Unlaunched { batch }));
                offerings.extend(o.iter().map(|o| Offering {
                    instance_type: o.instance_type.clone(),
                    zone: o.zone.clone(),
                    capacity_type: o.capacity_type,
                }));
            }
            Ok(Err(e)) => c.errors.warn("launch", e.kind(), &format!("nodeclaim/{}", r.claim), e),
            Err(Failure::Throttled(after)) => c.errors.note(
                "launch",
                "throttled",
                &format!("nodeclaim/{}", r.claim),
                &format!("retry after {after:?}"),
            ),
            Err(_) => {}
        }
    }
    if !offerings.is_empty() {
        offerings.sort();
        offerings.dedup();
        let until = at.saturating_add(to_millis(c.ice_ttl));
        let mark = Command::MarkUnavailable { offerings, until };
        if let Err(e) = c.ledger.propose(Entry { term: c.term, at, command: mark }).await {
            c.errors.warn("mark_unavailable", "ledger", &c.zone, &e);
        }
    }
    if !steps.is_empty() {
        match c.ledger.propose(Entry { term: c.term, at, command: Command::Advance { steps } }).await {
            Ok(committed) => {
                if let Outcome::Advanced { rejected } = &committed.outcome {
                    for (claim, why) in rejected {
                        c.errors.warn("record_launched", "rejected", &format!("nodeclaim/{claim}"), why);
                    }
                }
            }
            Err(e) => c.errors.warn("record_launched", "ledger", &c.zone, &e),
        }
    }
}

/// One termination asked: the claim, its instance when known (else found by the claim's tag
/// and launch batch), and the term it was decided in.
pub(super) struct Ending {
    pub(super) claim: String,
    pub(super) instance: Option<String>,
    pub(super) batch: Option<LaunchBatch>,
    pub(super) term: Term,
}

/// Terminates claims' instances in one TerminateInstances call (Karpenter's batcher sends up to
/// 500 ids a call: a storm's hundreds of drained nodes are a few calls, not hundreds), each
/// only while its term lasts; the instances gone (or gone already) are committed as
/// `InstanceGone`, one entry per term. Each claim's result, in order: `Err(None)` when fenced.
pub(super) async fn terminate(
    cloud: &dyn CloudProvider,
    ledger: &dyn Ledger,
    clock: &dyn Clock,
    errors: &Errors,
    endings: &[Ending],
) -> Vec<Result<(), Option<CloudError>>> {
    let current = |term: Term| ledger.leadership().borrow().is_current(term);
    let object = |claim: &str| format!("nodeclaim/{claim}");
    let no_result = || CloudError::Transient { message: "no result".into() };
    let mut out: Vec<Result<(), Option<CloudError>>> = endings.iter().map(|_| Err(None)).collect();
    let mut ids: Vec<Option<String>> = endings.iter().map(|e| e.instance.clone()).collect();
    let live: Vec<usize> = (0..endings.len()).filter(|&i| current(endings[i].term)).collect();
    // 1. The instances not known: found by their tags, in one lookup.
    let unknown: Vec<usize> = live.iter().copied().filter(|&i| endings[i].instance.is_none()).collect();
    let mut failed: BTreeSet<usize> = BTreeSet::new();
    if !unknown.is_empty() {
        let lookups: Vec<Lookup> = unknown
            .iter()
            .map(|&i| Lookup { claim: endings[i].claim.clone(), batch: endings[i].batch.clone() })
            .collect();
        let mut found = cloud.find(&lookups).await.into_iter();
        for &i in &unknown {
            match found.next().unwrap_or_else(|| Err(no_result())) {
                Ok(instance) => ids[i] = instance.map(|inst| inst.id),
                Err(e) => {
                    errors.warn("find_instance", e.kind(), &object(&endings[i].claim), &e);
                    out[i] = Err(Some(e));
                    failed.insert(i);
                }
            }
        }
    }
    // 2. One call for every instance whose term still lasts; a claim without one is done.
    let mut gone: Vec<usize> = Vec::new();
    let mut calls: Vec<(usize, String)> = Vec::new();
    for &i in live.iter().filter(|i| !failed.contains(*i) && current(endings[**i].term)) {
        match &ids[i] {
            Some(id) => calls.push((i, id.clone())),
            None => gone.push(i),
        }
    }
    if !calls.is_empty() {
        let asked: Vec<String> = calls.iter().map(|(_, id)| id.clone()).collect();
        let mut results = cloud.terminate(&asked).await.into_iter();
        for (i, _) in &calls {
            match results.next().unwrap_or_else(|| Err(no_result())) {
                // Gone already is done.
                Ok(()) | Err(CloudError::NotFound { .. }) => gone.push(*i),
                Err(e) => {
                    if matches!(e, CloudError::Throttled { .. }) {
                        errors.note("terminate", e.kind(), &object(&endings[*i].claim), &e);
                    } else {
                        errors.warn("terminate", e.kind(), &object(&endings[*i].claim), &e);
                    }
                    out[*i] = Err(Some(e));
                }
            }
        }
    }
    // 3. What went, committed: one entry per term.
    let mut by_term: BTreeMap<Term, Vec<usize>> = BTreeMap::new();
    for i in gone {
        by_term.entry(endings[i].term).or_default().push(i);
    }
    for (term, done) in by_term {
        let steps = done.iter().map(|&i| (endings[i].claim.clone(), Step::InstanceGone)).collect();
        match ledger.propose(Entry { term, at: clock.now_millis(), command: Command::Advance { steps } }).await {
            // Fenced: they stay `Err(None)`.
            Ok(c) if c.outcome.is_fenced() => {}
            Ok(_) => done.iter().for_each(|&i| out[i] = Ok(())),
            Err(e) => {
                let first = done.first().map_or("", |&i| endings[i].claim.as_str());
                let object = format!("nodeclaim/{first} (and {} more)", done.len().saturating_sub(1));
                errors.warn("record_terminated", "ledger", &object, &e);
                for &i in &done {
                    out[i] = Err(Some(CloudError::Transient { message: e.to_string() }));
                }
            }
        }
    }
    out
}
