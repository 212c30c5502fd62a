//! A batch: up to 100 decisions across the owner's runs, all or none.
//! Every decision is checked as a single one is before anything is
//! written, in the batch's order (the first that fails is the answer), and
//! the runs are written together (see [`agent_runs_ports::store::RunStore::update_batch`]). A run
//! whose last pending approval was decided is queued again.

use agent_runs_domain::{ApprovalId, DecideOutcome, DecisionRequest, Resolver, Run, RunId};
use agent_runs_ports::store::{CHANGE_ATTEMPTS, ChangeError, StoreError, conflict_backoff};

use super::answer::check_answer_aside;
use super::{DecideRefused, RunCommands};
use crate::auth::Principal;

/// One decision of a batch, with its place in the request.
#[derive(Debug, Clone)]
pub struct BatchDecision {
    pub index: usize,
    pub run_id: RunId,
    pub approval_id: ApprovalId,
    pub request: DecisionRequest,
}

/// Why a batch was not recorded, or not whole.
#[derive(Debug)]
pub struct BatchRefused {
    /// The decision that failed; `None` when the store did.
    pub index: Option<usize>,
    pub error: ChangeError<DecideRefused>,
    /// Whether the decisions of some runs were recorded all the same: only
    /// where a store cannot write the batch in one transaction, and a
    /// change of another writer came between two of them.
    pub partly_recorded: bool,
}

/// A decision that failed: its place in the batch (`None`: the store's).
type Failed = (Option<usize>, ChangeError<DecideRefused>);

/// What a batch has recorded so far.
#[derive(Default)]
struct BatchProgress {
    /// The runs as stored: written by the batch, or found decided already.
    recorded: Vec<Run>,
    /// Runs to send to the queue (their last pending approval was decided),
    /// each with whether its send is spaced (see [`RunCommands::send_decided`]).
    to_send: Vec<(RunId, bool)>,
    /// Whether the batch wrote anything.
    wrote: bool,
}

impl RunCommands {
    /// Records `decisions` (in request order) by `by`. Returns the runs as
    /// stored.
    pub async fn decide_batch(&self, by: &Principal, decisions: Vec<BatchDecision>) -> Result<Vec<Run>, BatchRefused> {
        let refused = |(index, error): Failed| BatchRefused { index, error, partly_recorded: false };
        let runs = self.read_and_check(by, decisions).await.map_err(refused)?;
        let mut progress = BatchProgress::default();
        let result = self.record_batch(runs, &mut progress).await;
        // Whatever was written is sent, however the batch ended; runs
        // decided before, as a repeated single decision sends them.
        for (run_id, spaced) in &progress.to_send {
            if let Some(run) = progress.recorded.iter().find(|run| run.id == *run_id) {
                self.send_decided(run, *spaced).await;
            }
        }
        match result {
            Ok(()) => Ok(progress.recorded),
            Err((index, error)) => Err(BatchRefused { index, error, partly_recorded: progress.wrote }),
        }
    }

    /// Each run read once, with its decisions in request order, each
    /// checked as a single decision is.
    async fn read_and_check(
        &self,
        by: &Principal,
        decisions: Vec<BatchDecision>,
    ) -> Result<Vec<(Run, Vec<BatchDecision>)>, Failed> {
        let mut runs: Vec<(Run, Vec<BatchDecision>)> = Vec::new();
        for decision in decisions {
            let at = Some(decision.index);
            let position = match runs.iter().position(|(run, _)| run.id == decision.run_id) {
                Some(position) => position,
                None => {
                    // A store that failed is no element's fault: repeating the batch is safe.
                    let run = self.run_to_decide(by, decision.run_id).await.map_err(|error| match error {
                        ChangeError::Store(_) => (None, error),
                        refused => (at, refused),
                    })?;
                    runs.push((run, Vec::new()));
                    runs.len() - 1
                }
            };
            let (run, of_run) = &mut runs[position];
            self.check_decision(by, run, decision.approval_id, &decision.request).await.map_err(|error| (at, error))?;
            of_run.push(decision);
        }
        Ok(runs)
    }

    async fn record_batch(
        &self,
        runs: Vec<(Run, Vec<BatchDecision>)>,
        progress: &mut BatchProgress,
    ) -> Result<(), Failed> {
        let first_versions: Vec<(RunId, u64)> = runs.iter().map(|(run, _)| (run.id, run.version)).collect();
        let mut pending = runs;
        let mut may_have_landed = false;
        for attempt in 0..CHANGE_ATTEMPTS {
            if attempt > 0 {
                for (run, decisions) in &mut pending {
                    let first = decisions.first().map(|decision| decision.index);
                    let fresh = self.runs.get(&run.owner, run.id).await.map_err(|error| (first, error.into()))?;
                    *run = fresh.ok_or((first, ChangeError::Gone))?;
                }
            }
            let now = self.clock.now();
            let mut changed = Vec::new();
            let mut done = Vec::new();
            for (position, (run, decisions)) in pending.iter().enumerate() {
                let mut next = run.clone();
                let mut outcome = DecideOutcome::Unchanged;
                for decision in decisions {
                    let refused = |why| (Some(decision.index), ChangeError::Refused(why));
                    if next.approval_past_expiry(decision.approval_id, now) {
                        return Err(refused(DecideRefused::Expired));
                    }
                    if let Some(auto) = next.auto_approve_if_due(decision.approval_id, now, &self.policy) {
                        outcome = outcome.max(auto);
                    }
                    // In the batch's order: the first decision that fails is the answer.
                    check_answer_aside(&next, now, decision.approval_id, &decision.request)
                        .await
                        .map_err(|error| (Some(decision.index), error))?;
                    let decided = next
                        .decide(decision.approval_id, decision.request.clone(), now, &self.policy)
                        .map_err(|error| refused(DecideRefused::Transition(error)))?;
                    outcome = outcome.max(decided);
                }
                if outcome == DecideOutcome::Unchanged {
                    // A write whose answer was lost reads back as a repeat:
                    // the run moved on since the first read and every
                    // decision stands as this batch's key made it. Its send
                    // is owed; a run decided by an earlier request is sent
                    // again, spaced, as a single decision is.
                    let mut own_write = false;
                    if may_have_landed {
                        let read_first = first_versions.iter().find(|(id, _)| *id == next.id).map(|(_, v)| *v);
                        let ours = decisions.iter().all(|decision| {
                            next.approvals.iter().any(|approval| {
                                approval.id == decision.approval_id
                                    && approval.resolved_by.as_ref().and_then(Resolver::key)
                                        == decision.request.decided_by
                            })
                        });
                        progress.wrote |= ours && read_first.is_some_and(|version| next.version > version);
                        own_write = ours;
                    }
                    if next.is_requeued_after_decisions() {
                        progress.to_send.push((next.id, !own_write));
                    }
                    done.push(position);
                    progress.recorded.push(next);
                } else {
                    changed.push((position, next, outcome));
                }
            }
            let mut writes: Vec<Run> = changed.iter().map(|(_, run, _)| run.clone()).collect();
            let result = self.runs.update_batch(&mut writes).await;
            let written = result.as_ref().map_or_else(|failed| failed.written, |()| writes.len());
            for ((position, _, outcome), run) in changed.iter().zip(writes).take(written) {
                if *outcome == DecideOutcome::Requeued {
                    progress.to_send.push((run.id, false));
                }
                progress.wrote = true;
                done.push(*position);
                progress.recorded.push(run);
            }
            pending =
                pending.into_iter().enumerate().filter(|(at, _)| !done.contains(at)).map(|(_, left)| left).collect();
            match result {
                Ok(()) => return Ok(()),
                Err(failed) if matches!(failed.error, StoreError::Conflict) => {
                    may_have_landed = true;
                    conflict_backoff(attempt).await;
                }
                Err(failed) => return Err((None, failed.error.into())),
            }
        }
        let error = StoreError::Unavailable("the runs kept changing under concurrent writes".into());
        Err((None, error.into()))
    }
}
