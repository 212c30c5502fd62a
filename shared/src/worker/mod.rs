//! Executing runs: claim with a lease, step the agent, heartbeat, notice a
//! cancel, park for approval, finish. Every write is conditional on the
//! version read, and every worker write also requires that this worker
//! still holds the lease, so a late or duplicate worker can never overwrite
//! a state it does not own.

mod pool;
mod sweeper;

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::watch;

use crate::agents::{AgentRegistry, Step, StepInput};
use crate::domain::{
    ApprovalId, ClaimOutcome, ClaimRefused, Clock, ExecutionPolicy, IdGenerator, Run, TransitionError,
};
use crate::queue::RunMessage;
use crate::store::{RunStore, StoreError, change_run};

pub use pool::WorkerPool;
pub use sweeper::Sweeper;

/// What became of one message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Succeeded,
    Failed,
    AwaitingApproval,
    /// The worker was asked to stop and handed the run back to the queue.
    Released,
    /// Nothing to do: the run is gone, terminal, awaiting a decision or held
    /// by another worker's live lease. The message is acknowledged.
    Dropped,
    /// The run was canceled or taken over while this worker had it.
    LostLease,
}

#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    /// A dependency failed; the message should be delivered again later.
    #[error("transient failure")]
    Transient(#[from] StoreError),
}

pub struct Worker {
    runs: Arc<dyn RunStore>,
    agents: AgentRegistry,
    clock: Arc<dyn Clock>,
    policy: ExecutionPolicy,
    ids: IdGenerator,
    /// How often the lease is renewed (and progress saved) while the agent works.
    heartbeat_every: Duration,
    id: String,
}

impl Worker {
    pub fn new(runs: Arc<dyn RunStore>, agents: AgentRegistry, clock: Arc<dyn Clock>, policy: ExecutionPolicy) -> Self {
        let ids = IdGenerator::default();
        let id = format!("wrk_{}", ids.ulid_at(clock.now()));
        let heartbeat_every = policy.lease / 3;
        Worker { runs, agents, clock, policy, ids, heartbeat_every, id }
    }

    /// Handles one message to the end. `stop` asks the worker to hand the
    /// run back at its next step (shutdown).
    pub async fn process(&self, message: &RunMessage, stop: &watch::Receiver<bool>) -> Result<Outcome, WorkerError> {
        let Some(mut run) = self.claim(message).await? else {
            return Ok(Outcome::Dropped);
        };
        tracing::debug!(run_id = %run.id, worker = %self.id, attempt = run.attempts, "claimed");
        let result = self.execute(&mut run, stop).await;
        if result.is_err() {
            // A failing dependency is not the run's fault: hand it back, if
            // the store lets us, so the attempt is not used up. Otherwise
            // the lease expires as after a crash.
            let _ = self.write(&mut run, |run, now, worker| run.release(worker, None, now, &self.policy)).await;
        }
        result
    }

    /// Steps the agent until the run finishes, parks, is handed back or is
    /// lost to a cancel or takeover.
    async fn execute(&self, run: &mut Run, stop: &watch::Receiver<bool>) -> Result<Outcome, WorkerError> {
        let Some(agent) = self.agents.resolve(&run.agent).await? else {
            let error = format!("The agent `{}` is no longer configured.", run.agent);
            return self.finish(run, |run, now, worker| run.fail(worker, error.clone(), now)).await;
        };

        let mut checkpoint = run.checkpoint.clone();
        let mut usage = run.usage;
        let mut last_heartbeat = Instant::now();
        loop {
            let (input, approvals) = (run.input.clone(), run.approvals.clone());
            let stepping = agent.step(StepInput {
                run_id: run.id,
                input: &input,
                checkpoint: checkpoint.as_ref(),
                approvals: &approvals,
                usage: &mut usage,
            });
            // A step may wait long on a model or a tool: keep the lease
            // meanwhile, and give up the step on a cancel or a stop.
            let step = {
                tokio::pin!(stepping);
                let mut stop = stop.clone();
                let stopped = async move {
                    if stop.wait_for(|stop| *stop).await.is_err() {
                        std::future::pending::<()>().await;
                    }
                };
                tokio::pin!(stopped);
                loop {
                    tokio::select! {
                        step = &mut stepping => break Some(step),
                        () = &mut stopped => break None,
                        () = tokio::time::sleep(self.heartbeat_every) => {
                            let renewed = self
                                .write(run, |run, now, worker| run.heartbeat(worker, None, now, &self.policy))
                                .await?;
                            if !renewed {
                                return Ok(Outcome::LostLease);
                            }
                            last_heartbeat = Instant::now();
                        }
                    }
                }
            };
            run.usage = usage;
            let Some(step) = step else {
                return self.hand_back(run, checkpoint).await;
            };
            let mut save_now = false;
            match step {
                Step::Continue(next) => checkpoint = Some(next),
                Step::Checkpoint(next) => {
                    checkpoint = Some(next);
                    save_now = true;
                }
                Step::Succeeded(output) => {
                    return self.finish(run, |run, now, worker| run.succeed(worker, output.clone(), now)).await;
                }
                Step::Failed(error) => {
                    return self.finish(run, |run, now, worker| run.fail(worker, error.clone(), now)).await;
                }
                Step::AwaitApproval { actions, checkpoint } => {
                    let requests: Vec<(ApprovalId, String)> = actions
                        .into_iter()
                        .map(|action| (ApprovalId::from_ulid(self.ids.ulid_at(self.clock.now())), action))
                        .collect();
                    return self
                        .finish(run, |run, now, worker| {
                            run.park(worker, requests.clone(), checkpoint.clone(), now, &self.policy)
                        })
                        .await;
                }
            }
            if run.execution_time(self.clock.now()) >= self.policy.max_run_time {
                let error = crate::domain::time_limit_message(self.policy.max_run_time);
                return self.finish(run, |run, now, worker| run.fail(worker, error.clone(), now)).await;
            }
            if *stop.borrow() {
                return self.hand_back(run, checkpoint).await;
            }
            // Between steps: a cancel or takeover ends the work here.
            if save_now || last_heartbeat.elapsed() >= self.heartbeat_every {
                let saved = checkpoint.clone();
                let renewed =
                    self.write(run, |run, now, worker| run.heartbeat(worker, saved.clone(), now, &self.policy)).await?;
                if !renewed {
                    return Ok(Outcome::LostLease);
                }
                last_heartbeat = Instant::now();
            } else {
                match self.runs.get(&run.owner, run.id).await? {
                    Some(current) if current.held_by(&self.id) => *run = Run { usage, ..current },
                    _ => return Ok(Outcome::LostLease),
                }
            }
        }
    }

    /// Stopping: the run goes back to the queue with its last checkpoint.
    async fn hand_back(&self, run: &mut Run, checkpoint: Option<serde_json::Value>) -> Result<Outcome, WorkerError> {
        self.finish(run, |run, now, worker| run.release(worker, checkpoint.clone(), now, &self.policy)).await
    }

    /// Takes the run for this worker, or `None` when there is nothing to do.
    async fn claim(&self, message: &RunMessage) -> Result<Option<Run>, WorkerError> {
        loop {
            let Some(mut run) = self.runs.get(&message.owner, message.run_id).await? else {
                tracing::warn!(run_id = %message.run_id, "message for a run that does not exist");
                return Ok(None);
            };
            let outcome = match run.claim(&self.id, self.clock.now(), &self.policy) {
                Ok(outcome) => outcome,
                Err(reason @ (ClaimRefused::Terminal | ClaimRefused::AwaitingApproval | ClaimRefused::LeaseHeld)) => {
                    tracing::debug!(run_id = %run.id, ?reason, "message dropped");
                    return Ok(None);
                }
            };
            match self.runs.update(&mut run).await {
                Ok(()) if outcome == ClaimOutcome::Claimed => return Ok(Some(run)),
                Ok(()) => {
                    tracing::warn!(run_id = %run.id, "run failed: attempts exhausted");
                    return Ok(None);
                }
                Err(StoreError::Conflict) => continue,
                Err(error) => return Err(error.into()),
            }
        }
    }

    /// Applies a worker transition and writes it, re-reading on a conflict.
    /// `Ok(false)` when the worker no longer holds the run.
    async fn write(
        &self,
        run: &mut Run,
        change: impl Fn(&mut Run, crate::domain::Timestamp, &str) -> Result<(), TransitionError>,
    ) -> Result<bool, WorkerError> {
        // Only the worker holding the run counts its tokens.
        let usage = run.usage;
        loop {
            let mut next = Run { usage, ..run.clone() };
            if change(&mut next, self.clock.now(), &self.id).is_err() {
                return Ok(false);
            }
            match self.runs.update(&mut next).await {
                Ok(()) => {
                    *run = next;
                    return Ok(true);
                }
                Err(StoreError::Conflict) => match self.runs.get(&run.owner, run.id).await? {
                    Some(current) => *run = current,
                    None => return Ok(false),
                },
                Err(error) => return Err(error.into()),
            }
        }
    }

    async fn finish(
        &self,
        run: &mut Run,
        change: impl Fn(&mut Run, crate::domain::Timestamp, &str) -> Result<(), TransitionError>,
    ) -> Result<Outcome, WorkerError> {
        if !self.write(run, change).await? {
            return Ok(Outcome::LostLease);
        }
        tracing::debug!(run_id = %run.id, status = run.status.as_str(), "run moved");
        Ok(match run.status {
            crate::domain::RunStatus::Succeeded => Outcome::Succeeded,
            crate::domain::RunStatus::Failed => Outcome::Failed,
            crate::domain::RunStatus::AwaitingApproval => Outcome::AwaitingApproval,
            _ => Outcome::Released,
        })
    }
}

/// A message that reached the dead-letter queue: fail its run unless the
/// run has moved on. `Ok(true)` when the run was failed here.
pub async fn abandon_dead_letter(
    runs: &dyn RunStore,
    clock: &dyn Clock,
    message: &RunMessage,
) -> Result<bool, StoreError> {
    change_run(runs, &message.owner, message.run_id, |run| run.abandon(clock.now())).await
}
