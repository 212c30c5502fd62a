//! The sweeper heals what a lost message or a dead worker leaves behind: it
//! re-enqueues runs left `queued`, hands runs whose lease expired to a new
//! worker, and fails runs that used up their attempts.

use std::sync::Arc;

use crate::domain::{Clock, ExecutionPolicy, RunStatus, SweepAction, Timestamp};
use crate::queue::{RunMessage, RunQueue};
use crate::store::{DueRun, RunStore, StoreError, change_run};

const PAGE: u32 = 100;

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct SweepReport {
    pub enqueued: usize,
    pub failed: usize,
}

#[derive(Debug, thiserror::Error)]
pub enum SweepError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Queue(#[from] crate::queue::QueueError),
}

pub struct Sweeper {
    runs: Arc<dyn RunStore>,
    queue: Arc<dyn RunQueue>,
    clock: Arc<dyn Clock>,
    policy: ExecutionPolicy,
}

impl Sweeper {
    pub fn new(
        runs: Arc<dyn RunStore>,
        queue: Arc<dyn RunQueue>,
        clock: Arc<dyn Clock>,
        policy: ExecutionPolicy,
    ) -> Self {
        Sweeper { runs, queue, clock, policy }
    }

    /// Every run due by `until`, in due order, read page by page.
    async fn all_due(&self, until: Timestamp) -> Result<Vec<DueRun>, SweepError> {
        let mut all: Vec<DueRun> = Vec::new();
        loop {
            let page = self.runs.due(until, all.last(), PAGE).await?;
            let done = page.len() < PAGE as usize;
            all.extend(page);
            if done {
                return Ok(all);
            }
        }
    }

    fn message(due: &DueRun) -> RunMessage {
        RunMessage { run_id: due.key.run_id, owner: due.key.owner.clone() }
    }

    /// One pass over every run whose due time has come.
    pub async fn sweep(&self) -> Result<SweepReport, SweepError> {
        let mut report = SweepReport::default();
        for due in self.all_due(self.clock.now()).await? {
            match self.sweep_one(&due).await? {
                SweepAction::Enqueue => {
                    self.queue.enqueue(&Self::message(&due)).await?;
                    report.enqueued += 1;
                }
                SweepAction::Failed => report.failed += 1,
                SweepAction::Nothing => {}
            }
        }
        Ok(report)
    }

    async fn sweep_one(&self, due: &DueRun) -> Result<SweepAction, SweepError> {
        let mut action = SweepAction::Nothing;
        let written = change_run(self.runs.as_ref(), &due.key.owner, due.key.run_id, |run| {
            action = run.sweep(self.clock.now(), &self.policy);
            action != SweepAction::Nothing
        })
        .await?;
        Ok(if written { action } else { SweepAction::Nothing })
    }

    /// After a restart of a process whose queue lived in memory: enqueue
    /// every stored `queued` run at once, whatever its due time.
    pub async fn enqueue_all_queued(&self) -> Result<usize, SweepError> {
        let mut enqueued = 0;
        for due in self.all_due(Timestamp::MAX).await? {
            let queued =
                self.runs.get(&due.key.owner, due.key.run_id).await?.is_some_and(|run| run.status == RunStatus::Queued);
            if queued {
                self.queue.enqueue(&Self::message(&due)).await?;
                enqueued += 1;
            }
        }
        Ok(enqueued)
    }
}
