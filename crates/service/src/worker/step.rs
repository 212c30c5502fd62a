//! The agent's steps within one attempt: each step waited on while the
//! lease is kept, what it reports written with the state it leads to, and
//! between steps the checkpoint saved or the run read for a cancel.

use std::sync::Arc;
use std::time::Instant;

use tokio::sync::watch;

use super::{
    Attempt, CANCEL_CHECK_EVERY, EVENTS_FLUSH_AT, EVENTS_FLUSH_EVERY, EventLimit, MAX_APPROVALS_PER_RUN, Outcome,
    Refused, Worker, WorkerError,
};
use agent_runs_agents::{MustFinish, Step, StepInput};
use agent_runs_domain::{ApprovalId, ApprovalRequest, EventData, Policy, Run, Usage, time_limit_message};

/// How waiting on a step ended.
enum Waited {
    /// With a step: the one the agent took (`ended`), or a failure in its
    /// place (the time limit, the step given up).
    Step { step: Step, ended: bool },
    /// The process is stopping and the step had not reached out to a tool:
    /// given up, to be done again from the saved state.
    Stopped,
    /// A heartbeat found the lease gone (a cancel or a takeover).
    LostLease,
}

impl Worker {
    /// Steps the agent until the run finishes, parks, is handed back or is
    /// lost to a cancel or takeover.
    pub(super) async fn execute(
        &self,
        attempt: &mut Attempt,
        stop: &watch::Receiver<bool>,
    ) -> Result<Outcome, WorkerError> {
        let Some(agent) = self.agents.resolve(&attempt.run.agent).await? else {
            let error = format!("The agent `{}` is no longer configured.", attempt.run.agent);
            return self.finish(attempt, Vec::new(), |run, now, lease| run.fail(lease, error.clone(), now)).await;
        };
        let no_policy = Arc::new(Policy::default());
        let mut usage = attempt.run.usage;
        let mut step_events = Vec::new();
        let mut last_check = Instant::now();
        loop {
            // Read before each step that judges calls (the one that asks the
            // model), so a document put during a run applies from the
            // model's next turn.
            let policy = match &self.policies {
                Some(policies) if agent.judges_calls(attempt.checkpoint.as_ref()) => {
                    policies.in_force(&attempt.run.owner).await?
                }
                _ => no_policy.clone(),
            };
            let (input, approvals) = (attempt.run.input.clone(), attempt.run.approvals.clone());
            // Until the agent has a state of its own.
            let carried = attempt.checkpoint.is_none().then(|| attempt.run.carried_checkpoint().cloned()).flatten();
            let must_finish = MustFinish::default();
            let stepping = agent.step(StepInput {
                run_id: attempt.run.id,
                input: &input,
                checkpoint: attempt.checkpoint.as_ref(),
                carried: carried.as_ref(),
                approvals: &approvals,
                usage: &mut usage,
                budget: attempt.run.budget,
                events: &mut step_events,
                must_finish: &must_finish,
                policy: &policy,
            });
            let lease = (&mut attempt.run, attempt.lease.as_str(), &mut attempt.renewed_at);
            let waited = self.wait_for_step(stepping, &must_finish, stop, lease).await?;
            // Only a step that ended reports what it did; one given up is
            // done again from the saved state.
            let ended = matches!(waited, Waited::Step { ended: true, .. });
            let reported = if ended { std::mem::take(&mut step_events) } else { Vec::new() };
            step_events.clear();
            let step = match waited {
                Waited::Step { step, .. } => step,
                Waited::Stopped => {
                    attempt.run.usage = usage;
                    return self.hand_back(attempt).await;
                }
                Waited::LostLease => return Ok(Outcome::LostLease),
            };
            attempt.run.usage = usage;
            // What a step reported goes with the state it leads to: the
            // checkpoint of a step that goes on, or the step's own end (a
            // write that, should it fail, hands the run back with neither).
            let save_now = match step {
                Step::Continue(next) => {
                    attempt.events.extend(reported);
                    attempt.checkpoint = Some(next);
                    attempt.events.len() >= EVENTS_FLUSH_AT
                        || (!attempt.events.is_empty() && attempt.renewed_at.elapsed() >= EVENTS_FLUSH_EVERY)
                }
                Step::Checkpoint(next) => {
                    attempt.events.extend(reported);
                    attempt.checkpoint = Some(next);
                    true
                }
                Step::Succeeded { output, transcript } => {
                    return self
                        .finish(attempt, reported, |run, now, lease| {
                            run.succeed(lease, output.clone(), transcript.clone(), now)
                        })
                        .await;
                }
                Step::Failed(error) => {
                    return self.finish(attempt, reported, |run, now, lease| run.fail(lease, error.clone(), now)).await;
                }
                Step::AwaitApproval { requests, .. } if requests.is_empty() => {
                    let error = "The agent asked for approval of nothing.".to_owned();
                    return self.finish(attempt, reported, |run, now, lease| run.fail(lease, error.clone(), now)).await;
                }
                Step::AwaitApproval { requests, checkpoint }
                    if requests.iter().all(|request| request.decided.is_some()) =>
                {
                    if let Some(outcome) = self.record_rule_decisions(attempt, reported, requests, checkpoint).await? {
                        return Ok(outcome);
                    }
                    // Saved with the decisions.
                    false
                }
                Step::AwaitApproval { requests, checkpoint } => {
                    return self.park(attempt, reported, requests, checkpoint).await;
                }
            };
            // A claim not yet written goes with the first step's state
            // whatever the agent said of itself: it never spans two steps.
            let save_now = save_now || attempt.claim_unwritten();
            if attempt.run.execution_time(self.clock.now()) >= self.policy.max_run_time {
                let error = time_limit_message(self.policy.max_run_time);
                return self.finish(attempt, Vec::new(), |run, now, lease| run.fail(lease, error.clone(), now)).await;
            }
            if *stop.borrow() {
                return self.hand_back(attempt).await;
            }
            if let Some(outcome) = self.between_steps(attempt, usage, save_now, &mut last_check).await? {
                return Ok(outcome);
            }
        }
    }

    /// Waits for the step while keeping the lease: a step may wait long on
    /// a model or a tool. A cancel or takeover gives the step up; so does a
    /// stop, unless the step has reached out to a tool, whose call is let
    /// finish (the Lambda deadline margin exceeds a tool's longest timeout)
    /// so its outcome is recorded.
    async fn wait_for_step(
        &self,
        stepping: impl Future<Output = Step>,
        must_finish: &MustFinish,
        stop: &watch::Receiver<bool>,
        (run, lease, renewed_at): (&mut Run, &str, &mut Instant),
    ) -> Result<Waited, WorkerError> {
        tokio::pin!(stepping);
        let mut stop = stop.clone();
        let stopped = async move {
            if stop.wait_for(|stop| *stop).await.is_err() {
                std::future::pending::<()>().await;
            }
        };
        tokio::pin!(stopped);
        // A step that hangs (a provider that never answers) must not keep
        // the run past its time limit.
        let time_left = self.policy.max_run_time.saturating_sub(run.execution_time(self.clock.now()));
        let over_time = tokio::time::sleep(time_left);
        tokio::pin!(over_time);
        let (mut letting_finish, mut over_time_seen) = (false, false);
        // One timer across the loop: a stop or the time limit seen while a
        // tool call finishes must not push the heartbeat back.
        let heartbeat = tokio::time::sleep(self.heartbeat_every);
        tokio::pin!(heartbeat);
        loop {
            tokio::select! {
                step = &mut stepping => return Ok(Waited::Step { step, ended: true }),
                () = &mut stopped, if !letting_finish => {
                    if !must_finish.is_set() {
                        return Ok(Waited::Stopped);
                    }
                    letting_finish = true;
                }
                () = &mut over_time, if !over_time_seen => {
                    if !must_finish.is_set() {
                        let step = Step::Failed(time_limit_message(self.policy.max_run_time));
                        return Ok(Waited::Step { step, ended: false });
                    }
                    over_time_seen = true;
                }
                () = &mut heartbeat => {
                    heartbeat.as_mut().reset(tokio::time::Instant::now() + self.heartbeat_every);
                    // A failed heartbeat does not give the step up at once:
                    // the next one may succeed, and the write after the
                    // step says whether the lease held.
                    let sent = Instant::now();
                    match self
                        .write(run, lease, &[], EventLimit::Applies, |run, now, lease| {
                            run.heartbeat(lease, None, now, &self.policy)
                        })
                        .await
                    {
                        Ok(Ok(())) => *renewed_at = sent,
                        Ok(Err(_)) => return Ok(Waited::LostLease),
                        // The lease lapses before the next heartbeat, and
                        // another worker may then take the run over: give up
                        // a step that has not reached out to a tool rather
                        // than have it run twice.
                        Err(error)
                            if renewed_at.elapsed() + self.heartbeat_every >= self.policy.lease
                                && !must_finish.is_set() =>
                        {
                            return Err(error);
                        }
                        Err(WorkerError::Transient(error)) => {
                            tracing::warn!(run_id = %run.id, error = %agent_runs_ports::error_chain(&error), "heartbeat failed during a step");
                        }
                    }
                }
            }
        }
    }

    /// Parks the run for the approvals the step asks for (or fails it past
    /// the most a run may ask for).
    async fn park(
        &self,
        attempt: &mut Attempt,
        reported: Vec<EventData>,
        requests: Vec<ApprovalRequest>,
        checkpoint: serde_json::Value,
    ) -> Result<Outcome, WorkerError> {
        if attempt.run.approvals.len() + requests.len() > MAX_APPROVALS_PER_RUN {
            let error = format!(
                "The agent asked for {} more approvals; a run may ask for at most {MAX_APPROVALS_PER_RUN} in all.",
                requests.len()
            );
            return self.finish(attempt, reported, |run, now, lease| run.fail(lease, error.clone(), now)).await;
        }
        let requests: Vec<(ApprovalId, ApprovalRequest)> = requests
            .into_iter()
            .map(|request| (ApprovalId::from_ulid(self.ids.ulid_at(self.clock.now())), request))
            .collect();
        // Not kept in `attempt.checkpoint` (nor its events in
        // `attempt.events`): should the park fail, the run is handed back
        // with the state before this step, whose approvals the parked
        // checkpoint would count on.
        self.finish(attempt, reported, |run, now, lease| {
            run.park(lease, requests.clone(), checkpoint.clone(), now, &self.policy)
        })
        .await
    }

    /// Every call the step asked about was decided by a rule: the decisions
    /// are written with the step's checkpoint and events (as a save of
    /// progress), and the agent goes on (`None`) with them in its
    /// approvals.
    async fn record_rule_decisions(
        &self,
        attempt: &mut Attempt,
        reported: Vec<EventData>,
        requests: Vec<ApprovalRequest>,
        checkpoint: serde_json::Value,
    ) -> Result<Option<Outcome>, WorkerError> {
        if attempt.run.approvals.len() + requests.len() > MAX_APPROVALS_PER_RUN {
            return self.park(attempt, reported, requests, checkpoint).await.map(Some);
        }
        let requests: Vec<(ApprovalId, ApprovalRequest)> = requests
            .into_iter()
            .map(|request| (ApprovalId::from_ulid(self.ids.ulid_at(self.clock.now())), request))
            .collect();
        // The step's events go only with its checkpoint: should the write
        // fail, the run is handed back as before the step, without them.
        let events = [attempt.events.as_slice(), &reported].concat();
        let sent = Instant::now();
        let written = self
            .write(&mut attempt.run, &attempt.lease, &events, EventLimit::Applies, |run, now, lease| {
                run.record_rule_decisions(lease, requests.clone(), checkpoint.clone(), now, &self.policy)
            })
            .await?;
        match written {
            Ok(()) => {
                attempt.events.clear();
                attempt.checkpoint = Some(checkpoint);
                attempt.renewed_at = sent;
                Ok(None)
            }
            Err(Refused::LeaseLost) => Ok(Some(Outcome::LostLease)),
            Err(Refused::EventLimit) => self.fail_for_event_limit(attempt).await.map(Some),
        }
    }

    /// Between steps: the checkpoint and events saved when due (renewing
    /// the lease), else the run read now and then; a cancel or takeover
    /// ends the work here (`Some`).
    async fn between_steps(
        &self,
        attempt: &mut Attempt,
        usage: Option<Usage>,
        save_now: bool,
        last_check: &mut Instant,
    ) -> Result<Option<Outcome>, WorkerError> {
        if save_now || attempt.renewed_at.elapsed() >= self.heartbeat_every {
            let saved = attempt.checkpoint.clone();
            let sent = Instant::now();
            match self
                .write(&mut attempt.run, &attempt.lease, &attempt.events, EventLimit::Applies, |run, now, lease| {
                    run.heartbeat(lease, saved.clone(), now, &self.policy)
                })
                .await?
            {
                Ok(()) => attempt.events.clear(),
                Err(Refused::LeaseLost) => return Ok(Some(Outcome::LostLease)),
                Err(Refused::EventLimit) => return self.fail_for_event_limit(attempt).await.map(Some),
            }
            attempt.renewed_at = sent;
            *last_check = Instant::now();
        } else if last_check.elapsed() >= CANCEL_CHECK_EVERY {
            match self.runs.get(&attempt.run.owner, attempt.run.id).await? {
                Some(current) if current.held_by(&attempt.lease) => attempt.run = Run { usage, ..current },
                _ => return Ok(Some(Outcome::LostLease)),
            }
            *last_check = Instant::now();
        }
        Ok(None)
    }
}
