//! The sweeper heals what a lost message or a dead worker leaves behind: it
//! re-enqueues runs left `queued`, hands runs whose lease expired to a new
//! worker, and fails runs that used up their attempts. One run it cannot
//! handle is skipped and logged, never a reason to stop the pass.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use agent_runs_domain::{Clock, ExecutionPolicy, RunStatus, SweepAction, Timestamp};
use agent_runs_ports::error_chain;
use agent_runs_ports::queue::{RunMessage, RunQueue};
use agent_runs_ports::store::{DueRun, RunKey, Store, StoreError, change_run_if};
use tracing::Instrument;

const PAGE: u32 = 100;
/// The share of a pass's time its due runs may take when it has a
/// deadline: the rest is the recount's, so neither's backlog starves the other.
const DUE_RUNS_SHARE: f64 = 0.75;
/// Passes in a row that may fail on one run before the run is failed.
pub const MAX_SWEEP_FAILURES: u32 = 5;

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct SweepReport {
    pub enqueued: usize,
    pub failed: usize,
    /// Runs with an approval about to expire, warned about.
    pub warned: usize,
    /// Runs with approvals approved at the end of their veto window that
    /// still wait for others (those left with none are `enqueued`).
    pub auto_approved: usize,
    /// Runs this pass could not handle; tried again next pass.
    pub skipped: usize,
    /// Places on owners' active-run counts given back (see
    /// [`agent_runs_ports::store::Upkeep::settle_counts`]).
    pub given_back: usize,
    /// The pass stopped at its deadline; the next one goes on (the runs
    /// handled so far are no longer due).
    pub unfinished: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum SweepError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Queue(#[from] agent_runs_ports::queue::QueueError),
}

pub struct Sweeper {
    runs: Arc<dyn Store>,
    queue: Arc<dyn RunQueue>,
    clock: Arc<dyn Clock>,
    policy: ExecutionPolicy,
    /// Runs that failed in the last passes, and how many passes in a row.
    failing: Mutex<HashMap<RunKey, u32>>,
}

impl Sweeper {
    pub fn new(runs: Arc<dyn Store>, queue: Arc<dyn RunQueue>, clock: Arc<dyn Clock>, policy: ExecutionPolicy) -> Self {
        Sweeper { runs, queue, clock, policy, failing: Mutex::default() }
    }

    fn message(due: &DueRun) -> RunMessage {
        RunMessage { run_id: due.key.run_id, owner: due.key.owner.clone() }
    }

    /// One pass over every run whose due time has come.
    pub async fn sweep(&self) -> Result<SweepReport, SweepError> {
        self.sweep_until(None).await
    }

    /// One pass, page by page, stopping at `deadline` (a Lambda
    /// invocation's); a backlog larger than one pass can handle is worked
    /// off over several. Fails only when the due runs cannot be read.
    pub async fn sweep_until(&self, deadline: Option<Instant>) -> Result<SweepReport, SweepError> {
        let mut report = SweepReport::default();
        let until = self.clock.now();
        let started = Instant::now();
        let due_deadline =
            deadline.map(|deadline| started + deadline.saturating_duration_since(started).mul_f64(DUE_RUNS_SHARE));
        let mut after: Option<DueRun> = None;
        let mut skipped = HashSet::new();
        'due: loop {
            let page = self.runs.due(until, after.as_ref(), PAGE).await?;
            let last_page = page.len() < PAGE as usize;
            for due in page {
                if due_deadline.is_some_and(|deadline| Instant::now() >= deadline) {
                    report.unfinished = true;
                    break 'due;
                }
                let span = tracing::info_span!("sweep", run_id = %due.key.run_id, owner = %due.key.owner);
                match self.sweep_one(&due).instrument(span).await {
                    Ok(action) => {
                        agent_runs_ports::lock(&self.failing).remove(&due.key);
                        match action {
                            SweepAction::Enqueue => report.enqueued += 1,
                            SweepAction::Failed => report.failed += 1,
                            SweepAction::Warned => report.warned += 1,
                            SweepAction::AutoApproved => report.auto_approved += 1,
                            SweepAction::Nothing => {}
                        }
                    }
                    Err(error) => {
                        report.skipped += 1;
                        skipped.insert(due.key.clone());
                        if self.note_failure(&due, &error).await {
                            report.failed += 1;
                        }
                    }
                }
                after = Some(due);
            }
            if last_page {
                // A whole pass: forget runs that are no longer due.
                agent_runs_ports::lock(&self.failing).retain(|key, _| skipped.contains(key));
                break;
            }
        }
        match self.runs.settle_counts(until, deadline).await {
            Ok(settled) => {
                report.given_back = settled.given_back;
                report.unfinished |= settled.unfinished;
            }
            // Places left taken only make the limit stricter until a later pass.
            Err(error) => {
                tracing::warn!(error = %error_chain(&error), "sweeper could not settle the active-run counts")
            }
        }
        Ok(report)
    }

    async fn sweep_one(&self, due: &DueRun) -> Result<SweepAction, SweepError> {
        let mut action = SweepAction::Nothing;
        let written = change_run_if(self.runs.as_ref(), &due.key.owner, due.key.run_id, |run| {
            action = run.sweep(self.clock.now(), &self.policy);
            action != SweepAction::Nothing
        })
        .await?;
        if !written {
            return Ok(SweepAction::Nothing);
        }
        if action == SweepAction::Enqueue {
            self.queue.enqueue(&Self::message(due)).await?;
        }
        Ok(action)
    }

    /// Logs a run the pass could not handle. One whose own data breaks the
    /// pass ([`StoreError::Defect`], not an outage) in [`MAX_SWEEP_FAILURES`]
    /// passes in a row is failed. `true` when failed.
    async fn note_failure(&self, due: &DueRun, error: &SweepError) -> bool {
        if !matches!(error, SweepError::Store(StoreError::Defect(_))) {
            tracing::warn!(run_id = %due.key.run_id, error = %error_chain(error), "sweeper skipped a run; a dependency failed");
            return false;
        }
        let passes = {
            let mut failing = agent_runs_ports::lock(&self.failing);
            let passes = failing.entry(due.key.clone()).or_default();
            *passes += 1;
            *passes
        };
        if passes < MAX_SWEEP_FAILURES {
            tracing::warn!(run_id = %due.key.run_id, passes, error = %error_chain(error), "sweeper skipped a run");
            return false;
        }
        // Past that, try (and log) again only at passes 5, 8, 16, 32 ...:
        // a record nobody can read is not worth a line every second.
        if passes > MAX_SWEEP_FAILURES && !passes.is_power_of_two() {
            return false;
        }
        let now = self.clock.now();
        // A record that cannot even be read cannot be failed either: it is
        // logged (at the passes above) for an operator, and holds its owner's place
        // (ending it unread could count it twice should a later version read
        // it). It never blocks the runs after it.
        match change_run_if(self.runs.as_ref(), &due.key.owner, due.key.run_id, |run| run.fail_unsweepable(now)).await {
            Ok(failed) => {
                agent_runs_ports::lock(&self.failing).remove(&due.key);
                tracing::error!(run_id = %due.key.run_id, passes, "sweeper failed a run it could not handle");
                failed
            }
            Err(error) => {
                tracing::error!(run_id = %due.key.run_id, passes, error = %error_chain(&error), "sweeper cannot handle or fail a run");
                false
            }
        }
    }

    /// After a restart of a process whose queue lived in memory: enqueue
    /// every stored `queued` run at once, whatever its due time.
    pub async fn enqueue_all_queued(&self) -> Result<usize, SweepError> {
        let mut enqueued = 0;
        let mut after: Option<DueRun> = None;
        loop {
            let page = self.runs.due(Timestamp::MAX, after.as_ref(), PAGE).await?;
            let last_page = page.len() < PAGE as usize;
            for due in page {
                let queued = match self.runs.get(&due.key.owner, due.key.run_id).await {
                    Ok(run) => run.is_some_and(|run| run.status == RunStatus::Queued),
                    // The sweeper deals with a run that cannot be read.
                    Err(StoreError::Defect(error)) => {
                        tracing::error!(run_id = %due.key.run_id, error, "a stored run cannot be read; not enqueued");
                        false
                    }
                    Err(error) => return Err(error.into()),
                };
                if queued {
                    self.queue.enqueue(&Self::message(&due)).await?;
                    enqueued += 1;
                }
                after = Some(due);
            }
            if last_page {
                return Ok(enqueued);
            }
        }
    }
}
